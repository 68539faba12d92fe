"""Reading a client command's header: the checks and the refusals, without I/O.

A client connection (:mod:`.connection`, driven by :mod:`amps_py.server.session`)
and the server's command handlers hand each frame's header to these functions; they
return what the command asks for or raise :class:`CommandFailed` with the reason that
goes into the failure ack (and a detail that says how to fix the command).
:class:`Disconnect` ends the connection instead.

Pure logic: no trio, no sockets.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from amps_py import reasons
from amps_py.protocol.header import ACK_TYPES, split_outside_brackets

__all__ = [
    "ACK_ORDER",
    "MAX_FIELD_BYTES",
    "MAX_SEQ",
    "CommandFailed",
    "Disconnect",
    "ack_types",
    "bookmark_not_found",
    "check_field_size",
    "failure_acks",
    "heartbeat_start",
    "options",
    "unsubscribe_ids",
]

#: the largest publisher seq (the journal stores it as an unsigned 64-bit integer)
MAX_SEQ: Final = (1 << 64) - 1
#: the longest topic, client name or correlation id the journal stores (UTF-8 bytes)
MAX_FIELD_BYTES: Final = 65535
#: the order acks of one command are sent in
ACK_ORDER: Final = ("received", "parsed", "processed", "persisted", "completed", "stats")
#: the heartbeat interval of ``heartbeat`` with option ``start`` and no seconds
DEFAULT_HEARTBEAT_INTERVAL: Final = 30.0


class Disconnect(Exception):
    """Raised by a handler to end the session after the queued output is flushed."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class CommandFailed(Exception):
    """A command the server refuses; ``reason`` goes into the failure ack."""

    def __init__(self, reason: str, detail: str = "") -> None:
        super().__init__(detail or reason)
        self.reason = reason
        self.detail = detail or reason


def check_field_size(value: str, what: str, reason: str) -> None:
    """Refuse a string the journal could not store (longer than 65,535 UTF-8 bytes),
    naming the field and the limit; cheap for the usual short strings.

    Raises:
        CommandFailed: with ``reason``, when ``value`` is too long.
    """
    if len(value) > MAX_FIELD_BYTES // 4 and len(value.encode()) > MAX_FIELD_BYTES:
        raise CommandFailed(
            reason,
            f"the {what} is {len(value.encode())} bytes; the limit is {MAX_FIELD_BYTES} "
            "bytes (UTF-8): shorten it",
        )


_ACK_TYPES_CACHE: dict[str, frozenset[str]] = {}
_NO_ACKS: frozenset[str] = frozenset()


def ack_types(header: Mapping[str, Any]) -> frozenset[str]:
    """The ack types a command asks for (header field ``a``, comma-separated).

    Raises:
        CommandFailed: ``invalid options``, naming the unknown types.
    """
    raw = header.get("a")
    if not raw:
        return _NO_ACKS
    cached = _ACK_TYPES_CACHE.get(raw)
    if cached is not None:
        return cached
    types = frozenset(part.strip() for part in str(raw).split(",") if part.strip())
    unknown = types - ACK_TYPES
    if unknown:
        raise CommandFailed(
            reasons.INVALID_OPTIONS,
            f"unknown ack type(s) {', '.join(sorted(unknown))}; use "
            "received, processed, persisted, completed or stats",
        )
    if len(_ACK_TYPES_CACHE) < 1024:
        _ACK_TYPES_CACHE[str(raw)] = types
    return types


def options(header: Mapping[str, Any]) -> dict[str, str]:
    """A command's options (header field ``o``): ``a,b=1`` is ``{"a": "", "b": "1"}``.

    A comma inside brackets belongs to the value (AMPS lists:
    ``conflation_key=[/a,/b]`` is ``{"conflation_key": "[/a,/b]"}``); spaces around
    names and values are dropped (``conflation_key = [/a]``)."""
    raw = header.get("o")
    out: dict[str, str] = {}
    if not raw:
        return out
    for part in split_outside_brackets(str(raw)):
        part = part.strip()
        if part:
            key, _, value = part.partition("=")
            out[key.strip()] = value.strip()
    return out


def failure_acks(header: Mapping[str, Any], exc: CommandFailed) -> list[tuple[str, dict[str, Any]]]:
    """The failure acks that answer a refused command: one in every ack type it asked
    for, in :data:`ACK_ORDER` (so a client never waits for an ack that cannot come), or
    ``processed`` when it asked for none (or for unknown ones). Each is (ack type,
    ack header fields: ``reason``, ``detail`` when it says more, the command's ``s``)."""
    try:
        types = ack_types(header)
    except CommandFailed:
        types = frozenset({"processed"})
    wanted = [t for t in ACK_ORDER if t in types] or ["processed"]
    fields: dict[str, Any] = {"reason": exc.reason}
    if exc.detail != exc.reason:
        fields["detail"] = exc.detail
    if "s" in header:
        fields["s"] = header["s"]
    return [(ack_type, fields) for ack_type in wanted]


def heartbeat_start(header: Mapping[str, Any]) -> float | None:
    """The interval (seconds) a ``heartbeat`` command with option ``start,<seconds>``
    asks for (``start`` alone: 30 s); None when it does not start heartbeats.

    Raises:
        CommandFailed: ``invalid options`` for seconds that are not a positive number.
    """
    opts = str(header.get("o", "")).split(",")
    if not opts or opts[0].strip() != "start":
        return None
    try:
        interval = float(opts[1]) if len(opts) > 1 else DEFAULT_HEARTBEAT_INTERVAL
    except ValueError:
        raise CommandFailed(
            reasons.INVALID_OPTIONS, "heartbeat start needs 'start,<seconds>'"
        ) from None
    if interval <= 0:
        raise CommandFailed(reasons.INVALID_OPTIONS, "heartbeat interval must be positive")
    return interval


def unsubscribe_ids(header: Mapping[str, Any]) -> tuple[str, list[str] | None]:
    """What an ``unsubscribe`` names: (the ``sub_id`` text as sent, to echo in its ack;
    the ids, or None for ``all``).

    Raises:
        CommandFailed: ``invalid options`` when it names none.
    """
    ids = str(header.get("sub_id") or header.get("query_id") or "")
    if not ids:
        raise CommandFailed(reasons.INVALID_OPTIONS, "unsubscribe needs sub_id (or 'all')")
    if ids.strip() == "all":
        return ids, None
    return ids, [i.strip() for i in ids.split(",")]


def bookmark_not_found(header: Mapping[str, Any]) -> str:
    """A bookmark subscription's ``bookmark_not_found`` option: ``now`` (the default),
    ``epoch`` or ``fail``.

    Raises:
        CommandFailed: ``invalid options`` for any other value.
    """
    choice = options(header).get("bookmark_not_found", "now")
    if choice not in ("now", "epoch", "fail"):
        raise CommandFailed(
            reasons.INVALID_OPTIONS, "bookmark_not_found must be epoch, now or fail"
        )
    return choice
