"""A client's logon, as the session runs it: check, claim, answer.

:func:`log_on` runs the connection's first logon (the protocol state,
:class:`~amps_py.protocol.server.connection.ServerConnection`, hands it over as
:class:`~amps_py.protocol.server.connection.LogonRequested` and waits for the answer):
it reads the request and the message type (:mod:`amps_py.protocol.server.logon`),
checks the credentials through the instance's :class:`amps_py.auth_gate.AuthGate`
(off the event loop, backed off after failures, logged) within the transport's
LogonTimeout, checks who owns the client name and claims it, then takes the name and
answers. Awaited by the read loop before the next frame is looked at, so commands stay
in order.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, Protocol

import trio

from amps_py import events
from amps_py.actions import client_variables
from amps_py.auth_backoff import shown_user
from amps_py.protocol import Frame
from amps_py.protocol.server.commands import Disconnect
from amps_py.protocol.server.logon import (
    LogonRefused,
    LogonRequest,
    check_authenticated,
    check_claimed,
    check_owner,
    choose_message_type,
    logon_ack_fields,
    read_logon,
)
from txlog import publisher_hash

from .flow import deadline_passed
from .limits import ReadDeadline

if TYPE_CHECKING:
    from amps_py.auth import Authenticator, AuthResult
    from amps_py.auth_gate import GateVerdict
    from amps_py.protocol.server.connection import ServerConnection

    from .durability import PublisherLedger
    from .entitlements import TopicEntitlements
    from .host import HostedSession, SessionHost

    class LogonSession(HostedSession, Protocol):
        """What the logon reads and sets of its session."""

        client_name: str
        user_id: str
        client_version: str
        pub_hash: int
        message_type: str
        ledger: PublisherLedger | None

        @property
        def instance(self) -> SessionHost: ...
        @property
        def conn(self) -> ServerConnection: ...
        @property
        def authenticator(self) -> Authenticator: ...
        @property
        def entitlements(self) -> TopicEntitlements: ...

        def send_all(self, frames: list[bytes]) -> None: ...


__all__ = ["log_on"]

#: the session's logger: these lines are a connection's, as before they moved here
log = logging.getLogger("amps_py.server.session")


async def log_on(session: LogonSession, frame: Frame, acks: frozenset[str]) -> None:
    """The connection's logon: check the credentials (through the instance's
    :class:`amps_py.auth_gate.AuthGate`: off the event loop, backed off after
    failures, logged), claim the client name, answer.

    Raises:
        Disconnect: the logon was refused (a failure ack is queued), or its check
            did not end by the transport's LogonTimeout.
    """
    header = frame.header
    instance = session.instance
    authenticator = session.authenticator
    try:
        request = read_logon(header, journaled=instance.journal is not None)
        message_type = choose_message_type(
            header,
            session.transport,
            instance.transport_config(session.transport).message_type,
            instance.message_types,
        )
        # the password is used for this check only: never stored, logged or echoed
        verdict: GateVerdict | None = None
        with trio.move_on_at(session.conn.logon_at):
            verdict = await instance.auth_gate.check(
                authenticator,
                request.user,
                request.password,
                session.peer,
                f"client {shown_user(request.name)} on transport {session.transport}",
                events.CLIENT_AUTH_FAILED,
            )
        if verdict is None:
            # the check (waiting for a free check thread) outlasted LogonTimeout
            late = ReadDeadline(session.conn.logon_at, "logon")
            raise Disconnect(deadline_passed(session, late, instance.limits))
        check_authenticated(request, verdict.ok, verdict.refusal)
        check_owner(request, instance.name_owner_refusal(request.name, request.user), session.peer)
        check_claimed(
            request, instance.claim_client_name(session, request.name, request.user), session.peer
        )
    except LogonRefused as exc:
        if exc.message:
            log.warning(exc.message, *exc.log_args, extra=events.extra(exc.event))
        session.send_all(session.conn.logon_refused(header, exc))
        raise Disconnect(exc.disconnect) from None
    assert verdict.result is not None  # accepted: the authenticator answered
    session.message_type = message_type
    _logged_on(session, header, acks, request, verdict.result)


def _logged_on(
    session: LogonSession,
    header: dict[str, Any],
    acks: frozenset[str],
    request: LogonRequest,
    verdict: AuthResult,
) -> None:
    """The logon was accepted: take the name, answer with the success ack."""
    instance = session.instance
    name = session.client_name = request.name
    session.user_id = session.entitlements.user_id = request.user
    session.client_version = request.version
    session.pub_hash = publisher_hash(name) if name else 0
    last = 0
    if name and instance.journal is not None:
        # the highest seq held here from any source, durable or not (a publisher
        # that failed over must never reuse a seq that names another message)
        last = instance.held_seq(session.pub_hash)
        session.ledger = instance.ledger(session.pub_hash)
    # logon option ack_conflation: accepted, nothing to do (acks conflate per commit)
    log.info(
        "client %r logged on from %s (user %r, last seq held %d, version %s)",
        name,
        session.peer,
        request.user,
        last,
        session.client_version or "not given",
        extra=events.extra(events.CLIENT_LOGON),
    )
    fields = logon_ack_fields(request, verdict, session.pub_hash, last)
    replies = session.conn.logon_accepted(header, acks, fields)
    instance.fire_action("logon-client", client_variables(session, connected=False))
    session.send_all(replies)
