"""The client end of the AMPS wire protocol, sans-IO: bytes and time in, events and
bytes out (the style of :mod:`amps_py.replication.link`).

:class:`ClientConnection` owns the rules of one client connection; the trio client
(:class:`amps_py.client.Client`) owns the socket, the tasks and the waiting:

* commands: :meth:`~ClientConnection.command` gives each command a fresh ``cid`` and
  remembers which acks end its wait (a number of acks, or the ack types that must all
  have come; a failure ack ends it at once); :class:`CommandDone` reports the end,
  exactly once per ``cid``. :meth:`~ClientConnection.track` marks a ``cid`` whose
  single answer is reported as :class:`TrackedAck` (queue acknowledgements);
* logon: :meth:`~ClientConnection.logon` builds the logon command (``client_name``,
  ``v``, the credentials ``user_id``/``pw`` given in the fields); its success ack
  (:class:`LoggedOn`) sets the publish sequence to at least the ack's ``s``, the last
  seq the server holds of this client name;
* publishing: :meth:`~ClientConnection.publish` numbers publishes (``s``);
  conflated ``persisted`` acks (``s``, no ``cid`` nor ``sub_id``) move
  :attr:`~ClientConnection.persisted_seq` forward only (:class:`Persisted`); a
  persisted failure ack records the publish in
  :attr:`~ClientConnection.failed_publishes` (:class:`PublishFailed`);
* routing: deliveries (``publish``/``oof``: ``sub_id``, or ``sids`` for several) go
  out as :class:`Delivery`; query frames (``sow``, ``group_begin``, ``group_end``) as
  :class:`QueryFrame`; an ack naming a subscription registered with
  :meth:`~ClientConnection.add_route` (by ``sub_id``, or by ``query_id`` alone) as
  :class:`SubscriptionAck`; a failure ack naming nothing (no ``cid``, ``sub_id`` nor
  ``s``) is about the connection itself (:class:`ServerNotice`, e.g. ``slow client``);
* heartbeats: each server heartbeat is answered with a beat
  (:class:`HeartbeatReceived` carries the bytes to send). With
  :meth:`~ClientConnection.watch_silence` a server from which nothing arrived for
  the given limit is declared silent by :meth:`~ClientConnection.tick`
  (:class:`ServerSilent`, once); any bytes received re-arm the limit.

Frames the decoder rejects raise :class:`~amps_py.protocol.ProtocolError` (or
:class:`~amps_py.protocol.FrameTooLarge`) from :meth:`~ClientConnection.receive_data`;
the connection must then be closed. The end of the byte stream
(``receive_data(b"", now)``) yields :class:`ServerClosed`, with the server's last
notice when there was one.
"""

from __future__ import annotations

import itertools
from collections.abc import Collection, Iterator
from dataclasses import dataclass, field
from typing import Any, Final, TypeAlias

from .codec import Frame, FrameDecoder, encode_frame
from .messages import NOT_JOURNALED

#: the largest frame a client accepts (a SOW query batch may be large)
CLIENT_MAX_FRAME: Final = 256 * 1024 * 1024
#: the ``v`` (version) field of a logon
CLIENT_VERSION: Final = "amps-py-client"
#: the beat a client answers each server heartbeat with
BEAT: Final = encode_frame({"c": "heartbeat", "o": "beat"})

#: how many acks end a command's wait, or which ack types must all have come
Want: TypeAlias = "int | frozenset[str]"


# ----------------------------------------------------------------------------- events
@dataclass(frozen=True)
class CommandDone:
    """The wait for command ``cid`` ended: every ack it waited for came, or a failure
    ack did (:attr:`failure`), or the connection closed (``complete`` false)."""

    cid: str
    acks: list[dict[str, Any]]
    complete: bool

    @property
    def failure(self) -> dict[str, Any] | None:
        """The first failure ack among :attr:`acks`, or None."""
        return next((ack for ack in self.acks if ack.get("status") == "failure"), None)


@dataclass(frozen=True)
class LoggedOn:
    """The logon succeeded; ``ack`` is the server's logon ack."""

    ack: dict[str, Any]


@dataclass(frozen=True)
class TrackedAck:
    """The answer to a command marked with :meth:`ClientConnection.track`."""

    cid: str
    ack: dict[str, Any]


@dataclass(frozen=True)
class SubscriptionAck:
    """An ack about the routed subscription ``sub_id``."""

    sub_id: str
    ack: dict[str, Any]


@dataclass(frozen=True)
class Persisted:
    """The server holds every publish up to ``seq`` (``not_journaled``: the publish
    ``seq`` went to a topic the server does not journal)."""

    seq: int
    not_journaled: bool


@dataclass(frozen=True)
class PublishFailed:
    """The server did not store the publish ``seq``; ``ack`` says why."""

    seq: int
    ack: dict[str, Any]


@dataclass(frozen=True)
class ServerNotice:
    """A failure ack about the connection itself (e.g. ``slow client``)."""

    ack: dict[str, Any]


@dataclass(frozen=True)
class Delivery:
    """A ``publish`` or ``oof`` message for the subscriptions ``sub_ids``."""

    frame: Frame
    sub_ids: list[str]


@dataclass(frozen=True)
class QueryFrame:
    """A ``sow`` batch, ``group_begin`` or ``group_end`` of a query."""

    frame: Frame


@dataclass(frozen=True)
class HeartbeatReceived:
    """The server sent a heartbeat; ``reply`` is the beat to send back."""

    reply: bytes


@dataclass(frozen=True)
class ServerSilent:
    """Nothing arrived for ``silent_for`` seconds, past the limit (``limit``)."""

    silent_for: float
    limit: float


@dataclass(frozen=True)
class ServerClosed:
    """The server closed the connection; ``notice`` is its last :class:`ServerNotice`
    ack, if any."""

    notice: dict[str, Any] | None

    @property
    def message(self) -> str:
        notice = self.notice
        why = f": {notice.get('reason')} ({notice.get('detail')})" if notice else ""
        return f"server closed the connection{why}"


Event: TypeAlias = (
    "CommandDone | LoggedOn | TrackedAck | SubscriptionAck | Persisted | PublishFailed"
    " | ServerNotice | Delivery | QueryFrame | HeartbeatReceived | ServerSilent | ServerClosed"
)


def acks_complete(acks: list[dict[str, Any]], want: Want) -> bool:
    """Whether ``acks`` end a wait for ``want`` (a count, or ack types that must all
    have come)."""
    if isinstance(want, int):
        return len(acks) >= want
    return want <= {str(ack.get("a")) for ack in acks}


@dataclass
class _Waiter:
    want: Want
    acks: list[dict[str, Any]] = field(default_factory=list)
    logon: bool = False


class ClientConnection:
    """The protocol state of one client connection (see the module docstring).

    ``now`` is the time the connection opened, in the caller's clock (any monotonic
    clock; every later ``now`` must come from the same one).
    """

    def __init__(
        self, name: str, *, now: float = 0.0, max_frame_size: int = CLIENT_MAX_FRAME
    ) -> None:
        self.name = name
        self._decoder = FrameDecoder(max_frame_size=max_frame_size)
        self._ids = itertools.count(1)
        self._waiting: dict[str, _Waiter] = {}
        self._tracked: set[str] = set()
        self._routes: set[str] = set()
        #: the highest publish seq given out (or the server's logon ``s``)
        self.seq = 0
        #: every publish up to this seq is persisted (never goes backwards)
        self.persisted_seq = 0
        #: publishes the server reported as not stored: seq -> the failure ack
        self.failed_publishes: dict[int, dict[str, Any]] = {}
        #: the newest seq whose persisted ack said ``reason: not journaled``
        self.not_journaled_seq = 0
        self.logon_ack: dict[str, Any] = {}
        self.server_notice: dict[str, Any] | None = None
        #: heartbeats received from the server
        self.heartbeats = 0
        #: ``now`` when bytes last arrived (or the connection opened)
        self.received_at = now
        self._silence_limit: float | None = None
        self._silent_reported = False
        self.closed = False

    # ------------------------------------------------------------------ commands
    def next_id(self) -> int:
        """A number not given out before on this connection (cids, sub and query ids)."""
        return next(self._ids)

    def next_cid(self) -> str:
        return str(self.next_id())

    @property
    def waiting(self) -> Collection[str]:
        """The cids of commands whose wait has not ended."""
        return self._waiting.keys()

    def command(
        self, header: dict[str, Any], payload: bytes = b"", *, want: int | Collection[str] = 1
    ) -> tuple[str, bytes]:
        """Register a command (``header["cid"]`` is set unless given) waiting for
        ``want`` acks; returns its cid and the bytes to send."""
        cid = str(header.setdefault("cid", self.next_cid()))
        wanted: Want = want if isinstance(want, int) else frozenset(want)
        self._waiting[cid] = _Waiter(wanted, logon=header.get("c") == "logon")
        return cid, encode_frame(header, payload)

    def abandon(self, cid: str) -> None:
        """Stop waiting for ``cid`` (timed out, or given up): later acks are dropped."""
        self._waiting.pop(cid, None)

    def track(self, cid: str) -> None:
        """Report the one answer to ``cid`` as :class:`TrackedAck`."""
        self._tracked.add(cid)

    def untrack(self, cid: str) -> None:
        self._tracked.discard(cid)

    def add_route(self, sub_id: str) -> None:
        """Acks naming ``sub_id`` go out as :class:`SubscriptionAck`."""
        self._routes.add(sub_id)

    def drop_route(self, sub_id: str) -> None:
        self._routes.discard(sub_id)

    def logon(self, fields: dict[str, Any]) -> tuple[str, bytes]:
        """The logon command as :attr:`name` with further ``fields`` (``mt``,
        ``user_id``, ``pw``, ...); its success ack yields :class:`LoggedOn`."""
        header = {"c": "logon", "client_name": self.name, "a": "processed", "v": CLIENT_VERSION}
        header.update(fields)
        return self.command(header)

    def publish(
        self,
        command: str,
        topic: str,
        payload: bytes,
        *,
        seq: int | None = None,
        ack: bool = True,
        sow_key: str | None = None,
    ) -> tuple[int, bytes]:
        """A ``publish`` (or ``delta_publish``) numbered ``seq`` (default: the next
        one); returns the seq and the bytes to send. A seq given again forgets its
        earlier failure (its new fate counts)."""
        if seq is None:
            self.seq += 1
            seq = self.seq
        else:
            self.seq = max(self.seq, seq)
        self.failed_publishes.pop(seq, None)
        header: dict[str, Any] = {"c": command, "t": topic, "s": seq}
        if ack:
            header["a"] = "persisted"
        if sow_key is not None:
            header["k"] = sow_key
        return seq, encode_frame(header, payload)

    # ------------------------------------------------------------------ time
    def watch_silence(self, limit: float) -> None:
        """Declare the server silent once nothing arrived for ``limit`` seconds."""
        self._silence_limit = limit
        self._silent_reported = False

    @property
    def silence_deadline(self) -> float | None:
        """When the server counts as silent if nothing arrives before (None: not
        watched)."""
        if self._silence_limit is None:
            return None
        return self.received_at + self._silence_limit

    def tick(self, now: float) -> list[Event]:
        """Events due at ``now``: :class:`ServerSilent` (once) when the silence limit
        has passed."""
        deadline = self.silence_deadline
        if deadline is None or self._silent_reported or now < deadline:
            return []
        self._silent_reported = True
        assert self._silence_limit is not None
        return [ServerSilent(now - self.received_at, self._silence_limit)]

    # ------------------------------------------------------------------ receiving
    def receive_data(self, data: bytes | bytearray, now: float) -> list[Event]:
        """Take bytes received at ``now`` (``b""``: the server closed the stream).

        Raises:
            ProtocolError: a malformed frame (the connection must be closed).
        """
        self.received_at = now
        self._silent_reported = False
        if not data:
            return [ServerClosed(self.server_notice)]
        self._decoder.receive_data(data)
        events: list[Event] = []
        for frame in self._decoder.frames():
            events.extend(self._frame_events(frame))
        return events

    def close(self) -> list[Event]:
        """The connection is gone: end every wait (:class:`CommandDone`, incomplete
        unless its acks had all come)."""
        self.closed = True
        waiting, self._waiting = self._waiting, {}
        return [
            CommandDone(cid, w.acks, acks_complete(w.acks, w.want)) for cid, w in waiting.items()
        ]

    def _frame_events(self, frame: Frame) -> Iterator[Event]:
        header = frame.header
        command = header["c"]
        if command == "publish" or command == "oof":
            sids = header.get("sids")
            yield Delivery(frame, sids.split(",") if sids else [header.get("sub_id", "")])
        elif command in ("sow", "group_begin", "group_end"):
            yield QueryFrame(frame)
        elif command == "ack":
            yield from self._ack_events(header)
        elif command == "heartbeat":
            self.heartbeats += 1
            if not self.closed:
                yield HeartbeatReceived(BEAT)

    def _ack_events(self, header: dict[str, Any]) -> Iterator[Event]:
        cid = header.get("cid")
        sub_id = header.get("sub_id")
        if sub_id is None and header.get("query_id") in self._routes:
            sub_id = header["query_id"]  # a sow_and_subscribe ack naming the query only
        if sub_id is not None and sub_id in self._routes:
            yield SubscriptionAck(sub_id, header)
        if cid is not None:
            yield from self._command_ack(str(cid), header)
        elif sub_id is None and "s" not in header and header.get("status") == "failure":
            self.server_notice = header
            yield ServerNotice(header)
        elif header.get("a") == "persisted" and "s" in header and sub_id is None:
            yield from self._persisted_ack(int(header["s"]), header)

    def _command_ack(self, cid: str, header: dict[str, Any]) -> Iterator[Event]:
        if cid in self._tracked:
            self._tracked.discard(cid)
            yield TrackedAck(cid, header)
            return
        waiter = self._waiting.get(cid)
        if waiter is None:
            return  # given up on, or not ours
        waiter.acks.append(header)
        failed = header.get("status") == "failure"
        if not failed and not acks_complete(waiter.acks, waiter.want):
            return
        del self._waiting[cid]
        if waiter.logon and not failed:
            self.logon_ack = header
            self.seq = max(self.seq, int(header.get("s", 0) or 0))
            self.persisted_seq = max(self.persisted_seq, self.seq)
            yield LoggedOn(header)
        yield CommandDone(cid, waiter.acks, True)

    def _persisted_ack(self, seq: int, header: dict[str, Any]) -> Iterator[Event]:
        if header.get("status") != "success":
            self.failed_publishes[seq] = header
            yield PublishFailed(seq, header)
        elif seq > self.persisted_seq:
            self.persisted_seq = seq
            not_journaled = header.get("reason") == NOT_JOURNALED
            if not_journaled:
                self.not_journaled_seq = seq
            yield Persisted(seq, not_journaled)
