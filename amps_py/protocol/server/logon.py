"""A client's logon: what it asks for, whether it may, and what its ack says.

The session (:mod:`amps_py.server.session`) reads the frame, asks the instance's
authenticator and claims the client name; these functions decide around those
answers, with no I/O:

* :func:`read_logon`: the client name, user and version the logon carries, or a
  refusal (a name the journal cannot store; no name on an instance with a
  transaction log, where names identify publishers);
* :func:`check_authenticated`, :func:`check_owner` and :func:`check_claimed`: a
  refusal for wrong credentials (logged by the auth gate), a client name that
  belongs to another user (:mod:`amps_py.server.name_owners`) or a name in use (with
  its log line);
* :func:`logon_ack_fields`: the success ack: the client name, the authenticator's
  reason, and the last seq this instance holds for the name as ``s`` and ``bm``.

A refused logon ends the connection: :class:`LogonRefused` carries the failure ack's
reason and detail, the close reason, and the log line (if any).

Pure logic: no trio, no sockets.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final

from amps_py import events, reasons

from .commands import CommandFailed, check_field_size

if TYPE_CHECKING:
    from amps_py.auth import AuthResult

__all__ = [
    "SERVER_VERSION",
    "LogonRefused",
    "LogonRequest",
    "check_authenticated",
    "check_claimed",
    "check_owner",
    "choose_message_type",
    "logon_ack_fields",
    "read_logon",
]

#: the server version in logon acks: AMPS clients read the leading numbers as the server
#: version and enable features by it (timestamp bookmarks need 5.3); amps-py's own
#: version follows
SERVER_VERSION: Final = "5.3.4.0.amps-py-0.1.0"
#: the longest client version string kept (for logs and the admin API)
MAX_VERSION_CHARS: Final = 200


class LogonRefused(CommandFailed):
    """A logon the server refuses; the connection closes with reason ``disconnect``.

    ``reason`` and ``detail`` go into the failure ack; ``message`` (a %-format, with
    ``log_args``) is the warning logged with ``event``, "" when none is logged.
    """

    def __init__(
        self,
        reason: str,
        detail: str,
        *,
        disconnect: str,
        event: str = "",
        message: str = "",
        log_args: tuple[Any, ...] = (),
    ) -> None:
        super().__init__(reason, detail)
        self.disconnect = disconnect
        self.event = event
        self.message = message
        self.log_args = log_args


@dataclass(frozen=True)
class LogonRequest:
    """What a logon command asks for. The password is used for the authenticator's
    check only: never stored, logged or echoed (it is left out of ``repr``)."""

    name: str
    user: str
    password: str = field(repr=False)
    version: str


def read_logon(header: Mapping[str, Any], *, journaled: bool) -> LogonRequest:
    """The logon ``header`` asks for: ``client_name`` (stripped), ``user_id`` (the
    client name when absent), ``pw``, and ``version`` (or its short form ``v``).

    Args:
        journaled: the instance has a transaction log, so a client name is required.

    Raises:
        LogonRefused: a client name longer than the journal stores, or none where one
            is required.
    """
    name = str(header.get("client_name", "")).strip()
    try:
        check_field_size(name, "client name", reasons.INVALID_CLIENT_NAME)
    except CommandFailed as exc:
        raise LogonRefused(exc.reason, exc.detail, disconnect=exc.reason) from None
    if not name and journaled:
        raise LogonRefused(
            reasons.AUTH_FAILURE,
            "logon needs a client_name: this instance has a transaction log, "
            "and client names identify publishers in it",
            disconnect=reasons.AUTH,
        )
    return LogonRequest(
        name=name,
        user=str(header.get("user_id", "")) or name,
        password=str(header.get("pw", "")),
        version=str(header.get("version") or header.get("v") or "")[:MAX_VERSION_CHARS],
    )


def choose_message_type(
    header: Mapping[str, Any], transport: str, only: str | None, known: Collection[str]
) -> str:
    """The message type of a connection: the transport's ``MessageType`` when it has
    one, else the logon's ``mt``, else ``json`` (AMPS clients send ``mt`` from their
    URI's ``/amps/<type>``; a client that sends none is taken to speak JSON).

    Args:
        transport: the transport's name (for the refusal text).
        only: the transport's MessageType, or None when it accepts every type.
        known: the names of the message types the instance loads.

    Raises:
        LogonRefused: ``mt`` names a type the instance does not load, or another type
            than the transport's.
    """
    asked = str(header.get("mt") or "").strip()
    if only is not None:
        if asked and asked != only:
            raise LogonRefused(
                reasons.INVALID_MESSAGE_TYPE,
                f"transport {transport!r} accepts {only} messages only, and this logon "
                f"asks for {asked!r}: connect with a URI ending /amps/{only}, or to a "
                "transport without a MessageType",
                disconnect=reasons.INVALID_MESSAGE_TYPE,
            )
        return only
    if not asked:
        return "json"
    if asked not in known:
        raise LogonRefused(
            reasons.INVALID_MESSAGE_TYPE,
            f"message type {asked!r} is not loaded by this instance (it loads "
            f"{', '.join(sorted(known))}): fix the type in the connection URI, or "
            "declare it under <MessageTypes> in the configuration",
            disconnect=reasons.INVALID_MESSAGE_TYPE,
        )
    return asked


def check_authenticated(request: LogonRequest, ok: bool, refusal: str) -> None:
    """Refuse the logon unless its credentials were accepted (``ok``).

    ``refusal`` is the gate's answer (:class:`amps_py.auth_gate.GateVerdict`): wrong
    credentials (the client is not told which of user or password was wrong), or a
    back-off saying when to retry. The gate has logged the failure already.

    Raises:
        LogonRefused: ``auth failure``.
    """
    if ok:
        return
    raise LogonRefused(
        reasons.AUTH_FAILURE,
        refusal or "unknown user or wrong password",
        disconnect=reasons.AUTH,
    )


def check_owner(request: LogonRequest, refusal: str, peer: str) -> None:
    """Refuse the logon when its client name belongs to another user (``refusal``,
    the instance's words naming the owner and the hand-over; "" when it may).

    Raises:
        LogonRefused: ``not entitled``.
    """
    if not refusal:
        return
    raise LogonRefused(
        reasons.NOT_ENTITLED,
        refusal,
        disconnect=reasons.NOT_ENTITLED,
        event=events.CLIENT_LOGON_FAILED,
        message="logon of client %r as user %r from %s refused: %s",
        log_args=(request.name, request.user, peer, refusal),
    )


def check_claimed(request: LogonRequest, refusal: str, peer: str) -> None:
    """Refuse the logon when claiming its client name was refused (``refusal``, the
    instance's words; "" when the name was granted).

    Raises:
        LogonRefused: ``name in use``.
    """
    if not refusal:
        return
    raise LogonRefused(
        reasons.NAME_IN_USE,
        refusal,
        disconnect=reasons.NAME_IN_USE,
        event=events.CLIENT_LOGON_FAILED,
        message="logon of client %r from %s refused: %s",
        log_args=(request.name, peer, refusal),
    )


def logon_ack_fields(
    request: LogonRequest, verdict: AuthResult, pub_hash: int, last: int
) -> dict[str, Any]:
    """The header fields of the success ack (``processed``): the client name, the
    authenticator's reason when it gave one, the last seq held for the name (``s``)
    and its bookmark (``bm``, so a publisher resumes after it), and
    :data:`SERVER_VERSION`."""
    fields: dict[str, Any] = {"client_name": request.name}
    if verdict.reason:
        fields["reason"] = verdict.reason
    fields["s"] = last
    fields["bm"] = f"{pub_hash}|{last}|"
    fields["version"] = SERVER_VERSION
    return fields
