"""One client connection's protocol, sans-IO: bytes, time and decisions in; events
and bytes out.

:class:`ServerConnection` is the server side of the AMPS wire protocol for one
connection, in the style of :mod:`amps_py.replication.link`: it never touches a
socket, a clock or trio. Its driver (:mod:`amps_py.server.session`) reads the socket
and hands the bytes to :meth:`ServerConnection.receive_data` with ``now``; the
connection

* sniffs transport compression from the first two bytes (:mod:`..compression`) and
  inflates a compressed stream a bounded piece at a time;
* decodes frames (:class:`~amps_py.protocol.FrameDecoder`: an oversized length prefix
  or a malformed header raises :class:`~amps_py.protocol.ProtocolError`, a broken
  compressed stream :class:`~amps_py.protocol.compression.CompressionError`; the
  connection is then to be closed);
* keeps the logon state: before a logon only a logon is taken (anything else known is
  refused with ``logon required`` and closes the connection); the first logon is handed
  to the driver (:class:`LogonRequested`), which checks the credentials and answers
  with :meth:`~ServerConnection.logon_accepted` or
  :meth:`~ServerConnection.logon_refused`; a second logon is refused;
* validates the command name (``unknown command``), and yields every command to run as
  its :class:`~amps_py.protocol.Frame`.

Events come out lazily, one per frame: the driver may await (a logon's password check)
between two of them, so commands are handled strictly in order. Acks are built by
:mod:`.acks` (the connection's :attr:`~ServerConnection.publish_acks`), heartbeat
timing by :mod:`.heartbeat` (:attr:`~ServerConnection.heartbeat`); the ``start_timer``
/ ``stop_timer`` pair is answered here.
"""

from __future__ import annotations

from collections.abc import Collection, Iterator, Mapping
from dataclasses import dataclass
from enum import Enum
from typing import Any, TypeAlias

from amps_py import reasons

from ..codec import Frame, FrameDecoder
from ..compression import Deflater, Inflater, sniff
from .acks import PublishAcks, ack, failure_frames
from .commands import CommandFailed, ack_types, heartbeat_start
from .heartbeat import HeartbeatClock

__all__ = [
    "CloseConnection",
    "CommandRefused",
    "CompressionStarted",
    "ConnectionEvent",
    "LogonRequested",
    "LogonState",
    "ServerConnection",
]


@dataclass(frozen=True, slots=True)
class LogonRequested:
    """The connection's first logon: the driver decides it (credentials, client name)
    before the next event is asked for. ``acks``: its ack types (already valid)."""

    frame: Frame
    acks: frozenset[str]


@dataclass(frozen=True, slots=True)
class CommandRefused:
    """A command refused by the protocol (unknown, or a second logon); the connection
    stays open. ``output``: the failure acks to send."""

    command: str
    header: dict[str, Any]
    failure: CommandFailed
    output: list[bytes]


@dataclass(frozen=True, slots=True)
class CloseConnection:
    """Close the connection with ``reason`` after sending ``output``."""

    reason: str
    output: list[bytes]


@dataclass(frozen=True, slots=True)
class CompressionStarted:
    """The client's stream is zlib-compressed: so is the server's from now on."""


#: what :meth:`ServerConnection.receive_data` yields: a command to run (its frame), or
#: one of the events above
ConnectionEvent: TypeAlias = (
    Frame | LogonRequested | CommandRefused | CloseConnection | CompressionStarted
)


class LogonState(Enum):
    """Where a connection is in its logon."""

    AWAITING = "awaiting logon"
    CHECKING = "logon being checked"
    LOGGED_ON = "logged on"
    CLOSED = "closed"


class ServerConnection:
    """The protocol state of one client connection.

    Args:
        commands: the commands the driver runs (``logon`` among them); any other is
            refused with ``unknown command``.
        max_frame_size: the transport's largest frame.
        now: when the connection was accepted (the driver's clock).
        logon_timeout: seconds it has to log on (its transport's LogonTimeout).
        always_persisted: the transport's AlwaysSendPersistedAcks.
    """

    def __init__(
        self,
        commands: Collection[str],
        *,
        max_frame_size: int,
        now: float,
        logon_timeout: float,
        always_persisted: bool = False,
    ) -> None:
        self._commands = frozenset(commands)
        self.decoder = FrameDecoder(max_frame_size)
        self.state = LogonState.AWAITING
        #: when the connection must have logged on
        self.logon_at = now + logon_timeout
        self.heartbeat = HeartbeatClock(now)
        self.publish_acks = PublishAcks(always_persisted)
        self._sniffing = True
        self._sniff_buf = bytearray()
        self._inflater: Inflater | None = None
        self._deflater: Deflater | None = None
        self._timer_started: float | None = None

    # ------------------------------------------------------------------ state
    @property
    def logged_on(self) -> bool:
        return self.state is LogonState.LOGGED_ON

    @property
    def logon_deadline(self) -> float | None:
        """When the connection must have logged on; None once it has."""
        return None if self.state is LogonState.LOGGED_ON else self.logon_at

    @property
    def last_receive(self) -> float:
        """When the client last sent a byte."""
        return self.heartbeat.last_receive

    # ------------------------------------------------------------------ bytes in
    def receive_data(self, data: bytes | bytearray, now: float) -> Iterator[ConnectionEvent]:
        """The events the bytes ``data`` (received at ``now``) complete, lazily, in
        order. Nothing is yielded once the connection is closed.

        Raises:
            ProtocolError: a frame the codec refuses (the connection must close).
            CompressionError: the compressed stream is damaged (likewise).
        """
        self.heartbeat.last_receive = now
        if self._sniffing:
            data = self._sniff(data)
            if not data:
                return  # one byte so far: not enough to tell
            if self._inflater is not None:
                yield CompressionStarted()
        decoder = self.decoder
        if self._inflater is None:
            decoder.receive_data(data, now)
            yield from self._events()
        else:
            for piece in self._inflater.feed(data):
                decoder.receive_data(piece, now)
                yield from self._events()

    def _sniff(self, data: bytes | bytearray) -> bytes | bytearray:
        """Look at the connection's first bytes: a zlib stream (a client that connected
        with ``compression=zlib``) turns on transport compression both ways. Returns
        the bytes to decode ("" while fewer than two bytes are known)."""
        self._sniff_buf += data
        verdict = sniff(self._sniff_buf)
        if verdict is None:
            return b""
        data, self._sniff_buf = self._sniff_buf, bytearray()
        self._sniffing = False
        if verdict:
            self._inflater = Inflater()
            self._deflater = Deflater()
        return data

    def _events(self) -> Iterator[ConnectionEvent]:
        commands = self._commands
        for frame in self.decoder.frames():
            state = self.state
            if state is LogonState.CLOSED:
                return
            command = frame.header["c"]
            if state is LogonState.LOGGED_ON and command in commands and command != "logon":
                yield frame  # the steady state
                continue
            event = self._judge(frame, command)
            yield event
            if type(event) is CloseConnection:
                return

    def _judge(self, frame: Frame, command: str) -> ConnectionEvent:
        """What a frame that is not a plain command of a logged-on connection is."""
        header = frame.header
        if command not in self._commands:
            return self._refused(
                command,
                header,
                CommandFailed(
                    reasons.UNKNOWN_COMMAND,
                    f"unknown command {command!r}; see the AMPS command reference",
                ),
            )
        if self.state is LogonState.LOGGED_ON:  # a second logon
            return self._refused(
                command,
                header,
                CommandFailed(reasons.INVALID_LOGON, "this connection is already logged on"),
            )
        if command != "logon":
            self.state = LogonState.CLOSED
            refusal = CommandFailed(
                reasons.LOGON_REQUIRED,
                "the first command on a connection must be logon (with client_name)",
            )
            return CloseConnection(reasons.LOGON_REQUIRED, failure_frames(header, refusal))
        try:
            acks = ack_types(header)
        except CommandFailed as exc:
            return self._refused(command, header, exc)
        self.state = LogonState.CHECKING
        return LogonRequested(frame, acks)

    @staticmethod
    def _refused(command: str, header: dict[str, Any], exc: CommandFailed) -> CommandRefused:
        return CommandRefused(command, header, exc, failure_frames(header, exc))

    # ------------------------------------------------------------------ the logon
    def logon_accepted(
        self, header: Mapping[str, Any], acks: frozenset[str], fields: Mapping[str, Any]
    ) -> list[bytes]:
        """The driver accepted the logon: the connection is logged on. Returns the
        success ack (``processed``, with ``fields``) when asked for, or when no ack
        type was named."""
        self.state = LogonState.LOGGED_ON
        if "processed" in acks or not acks:
            return [ack(header, "processed", **fields)]
        return []

    def logon_refused(self, header: Mapping[str, Any], exc: CommandFailed) -> list[bytes]:
        """The driver refused the logon: the connection closes after the returned
        failure acks."""
        self.state = LogonState.CLOSED
        return failure_frames(header, exc)

    def close(self) -> None:
        """The connection is being closed: no more events."""
        self.state = LogonState.CLOSED

    # ------------------------------------------------------------------ commands answered here
    def start_heartbeat(self, header: Mapping[str, Any], now: float) -> list[bytes]:
        """A ``heartbeat`` command: its acks. Once :attr:`HeartbeatClock.interval` is
        set (the first ``start``, also when the ack types then turn out unknown), the
        driver runs its beat timer (due at :attr:`HeartbeatClock.due`).

        Raises:
            CommandFailed: bad ``start`` seconds, or unknown ack types.
        """
        interval = heartbeat_start(header)
        if interval is not None:
            self.heartbeat.start(interval, now)
        return [ack(header, "processed")] if "processed" in ack_types(header) else []

    def start_timer(self, header: Mapping[str, Any], now: float) -> list[bytes]:
        """``start_timer``: start (or restart) the connection's timer; answered in the
        ack types asked for (``processed`` when none)."""
        self._timer_started = now
        return [ack(header, kind) for kind in ack_types(header) or frozenset({"processed"})]

    def stop_timer(self, header: Mapping[str, Any], now: float) -> list[bytes]:
        """``stop_timer``: stop the timer and answer with the time since ``start_timer``
        in the ack's ``reason`` (``elapsed <seconds> s``), in the ack types asked for
        (``completed`` when none).

        Raises:
            CommandFailed: no ``start_timer`` came first on this connection.
        """
        started = self._timer_started
        if started is None:
            raise CommandFailed(
                reasons.INVALID_OPTIONS,
                "stop_timer needs a start_timer first on this connection",
            )
        self._timer_started = None
        reason = f"elapsed {now - started:.6f} s"
        return [
            ack(header, kind, reason=reason)
            for kind in ack_types(header) or frozenset({"completed"})
        ]

    # ------------------------------------------------------------------ bytes out
    def encode(self, data: bytes) -> bytes:
        """Bytes to write for ``data``: compressed when the client's stream is."""
        deflater = self._deflater
        return data if deflater is None else deflater.compress(data)

    def release(self) -> None:
        """The connection ended: drop the compression state and held-back answers."""
        self._inflater = None
        self._deflater = None
        self._sniff_buf = bytearray()
        self.publish_acks.forget()
