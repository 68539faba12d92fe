"""The replication link protocol, sans-IO: bytes and time in, events and bytes out.

AMPS does not publish its replication wire format; this one is ours. It reuses the
client protocol's framing (4-byte big-endian length, flat JSON header, payload).

Handshake (the upstream, the instance that sends, opens the TCP connection)::

    upstream   -> repl_hello    payload: {"name","group","destination","sync",
                                          "compression","topics":[...],
                                          "user_id","pw"}   (credentials: optional)
    downstream -> repl_welcome  payload: {"name","group","cursor_txid","cursor_bm"}
            or -> repl_refuse   payload: {"reason","detail"}   (either side, then close)

Streaming::

    upstream   -> repl_data  {"upto": T, "upto_bm": B, "n": k, "z": 0|1}
                 payload: k x u32 record lengths, then the k stored records
                 (CRC included),
                 zstd stream-compressed when "z" is 1 (the receiver detects it)
    downstream -> repl_ack   {"upto": T}   every record <= T routed to it is durable
    either     -> repl_hb    heartbeat; a link silent for ``silence_limit`` closes

``repl_hb`` and ``repl_refuse`` carry ``"r": "u"`` or ``"d"``: whether the upstream or
the downstream end sent them. Back replication (:mod:`.mux`) needs it: one connection
then carries two links, one each way. A hello with ``"back": true`` offers that: the
accepting instance may send its own stream over the same connection (it starts with
its own ``repl_hello``).

``user_id`` and ``pw`` are present when the upstream's Destination has an
``Authenticator``; the downstream checks them with its Authentication module and then
asks its Entitlement module for ``replication_logon``. The password travels in the
clear inside the hello, so the link is only as private as its transport: use
``amps-replication-secure`` (TLS) wherever the network is not trusted.

``upto`` covers records the upstream read but did not route to this destination, so
acknowledged positions advance even when nothing matches. Each class below is a
state machine that never touches a socket or a clock: callers pass ``now``.
"""

from __future__ import annotations

import itertools
import struct
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Final

import orjson
import zstandard

from amps_py.protocol import Frame, FrameDecoder, ProtocolError, encode_frame

PROTOCOL_VERSION: Final = 2
#: replication frames carry batches of records: allow larger frames than clients
MAX_REPLICATION_FRAME: Final = 256 * 1024 * 1024


class LinkError(Exception):
    """The link cannot continue; ``reason`` is short and stable, the text says why."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail


class LinkState(Enum):
    HANDSHAKE = "handshake"
    STREAMING = "streaming"
    CLOSED = "closed"


# ----------------------------------------------------------------------------- events
@dataclass(frozen=True)
class Hello:
    """The upstream introduces itself (received by the downstream)."""

    version: int
    name: str
    group: str
    destination: str
    sync: str
    compression: str
    topics: tuple[dict[str, Any], ...]
    #: the Group the upstream's Destination requires of this instance ("" = any)
    expected_group: str = ""
    #: the user the upstream logs on as ("" = no credentials sent)
    user_id: str = ""
    #: its password; never shown by repr()
    pw: str = field(default="", repr=False)
    #: the upstream accepts this instance's stream back over the same connection
    back: bool = False


@dataclass(frozen=True)
class Welcome:
    """The downstream accepts (received by the upstream); the cursor says how far it
    holds this upstream's stream."""

    name: str
    group: str
    cursor_txid: int
    cursor_bm: str


@dataclass(frozen=True)
class Refused:
    """The peer refused the link; it will close the connection."""

    reason: str
    detail: str


@dataclass(frozen=True)
class Data:
    """A batch of stored records (bytes as the upstream stored them)."""

    records: list[bytes]
    upto: int
    upto_bm: str


@dataclass(frozen=True)
class Ack:
    upto: int


Event = Hello | Welcome | Refused | Data | Ack


@dataclass
class _Liveness:
    heartbeat_interval: float
    silence_limit: float
    last_received: float = 0.0
    last_sent: float = 0.0


def join_records(records: list[bytes]) -> bytes:
    """A data frame payload: the k record lengths (u32 each), then the k records."""
    n = len(records)
    return struct.pack(f">{n}I", *map(len, records)) + b"".join(records)


def split_records(payload: bytes, n: int) -> list[bytes]:
    """The ``n`` records of a data frame payload (see :func:`join_records`).

    Raises:
        LinkError: the lengths do not add up (a truncated or garbled frame).
    """
    head = 4 * n
    if n < 0 or head > len(payload):
        raise LinkError("bad data", f"a frame of {len(payload)} bytes cannot hold {n} records")
    sizes = struct.unpack_from(f">{n}I", payload)
    ends = list(itertools.accumulate(sizes, initial=head))
    if ends[-1] != len(payload):
        raise LinkError(
            "bad data",
            f"record lengths add up to {ends[-1] - head} bytes but the frame carries "
            f"{len(payload) - head}",
        )
    return [payload[a:b] for a, b in itertools.pairwise(ends)]


class _Link:
    """What both ends share: framing, heartbeats, silence detection, refusals."""

    #: which end sends this link's heartbeats and refusals ("u" or "d")
    ROLE: str = ""

    def __init__(self, now: float, heartbeat_interval: float) -> None:
        self.state = LinkState.HANDSHAKE
        self._decoder = FrameDecoder(MAX_REPLICATION_FRAME)
        self._live = _Liveness(heartbeat_interval, 5 * heartbeat_interval, now, now)
        self._decompressor: Any = None

    # -- time
    def next_deadline(self) -> float:
        """When :meth:`handle_timer` must next be called."""
        live = self._live
        return min(
            live.last_sent + live.heartbeat_interval, live.last_received + live.silence_limit
        )

    def handle_timer(self, now: float) -> bytes:
        """Bytes to send now (a heartbeat, or nothing).

        Raises:
            LinkError: the peer has been silent longer than the silence limit.
        """
        live = self._live
        if now - live.last_received > live.silence_limit:
            self.state = LinkState.CLOSED
            raise LinkError(
                "peer silent",
                f"nothing received for {now - live.last_received:.1f} s "
                f"(heartbeat {live.heartbeat_interval:g} s)",
            )
        if now - live.last_sent >= live.heartbeat_interval:
            return self._sent(encode_frame({"c": "repl_hb", "r": self.ROLE}), now)
        return b""

    def _sent(self, data: bytes, now: float) -> bytes:
        self._live.last_sent = now
        return data

    # -- input
    def receive_data(self, data: bytes | bytearray, now: float) -> list[Event]:
        """Feed bytes from the peer; return the events they complete.

        Raises:
            LinkError: malformed frames, a frame not allowed in this state, or a
                protocol violation. The caller must close the connection.
        """
        try:
            self._decoder.receive_data(data)
            frames = list(self._decoder.frames())
        except ProtocolError as exc:
            self.state = LinkState.CLOSED
            raise not_a_peer(exc) from None
        return self.receive_frames(frames, now)

    def receive_frames(self, frames: list[Frame], now: float) -> list[Event]:
        """Feed frames already split off the connection (:mod:`.mux` does that when
        one connection carries two links); same contract as :meth:`receive_data`."""
        self._live.last_received = now
        events: list[Event] = []
        for frame in frames:
            event = self._frame(frame)
            if event is not None:
                events.append(event)
        return events

    def _frame(self, frame: Frame) -> Event | None:
        command = frame.command
        if command == "repl_hb":
            return None
        if command == "repl_refuse":
            self.state = LinkState.CLOSED
            body = _json(frame.payload, "repl_refuse")
            return Refused(str(body.get("reason", "refused")), str(body.get("detail", "")))
        return self._command(frame)

    def _command(self, frame: Frame) -> Event | None:
        raise NotImplementedError

    def refuse(self, reason: str, detail: str, now: float) -> bytes:
        """The frame that tells the peer why the link is refused (then close)."""
        self.state = LinkState.CLOSED
        return self._sent(
            encode_frame(
                {"c": "repl_refuse", "r": self.ROLE},
                orjson.dumps({"reason": reason, "detail": detail}),
            ),
            now,
        )

    def _unexpected(self, command: str) -> LinkError:
        self.state = LinkState.CLOSED
        return LinkError(
            "protocol violation", f"unexpected {command!r} in state {self.state.value}"
        )


def not_a_peer(exc: ProtocolError) -> LinkError:
    """The error for bytes that are not replication frames."""
    return LinkError(
        "not a replication peer",
        f"{exc}; is an AMPS client or another program connected to the replication port?",
    )


def _json(payload: bytes, what: str) -> dict[str, Any]:
    try:
        body = orjson.loads(payload)
    except orjson.JSONDecodeError:
        raise LinkError("protocol violation", f"{what} payload is not JSON") from None
    if not isinstance(body, dict):
        raise LinkError("protocol violation", f"{what} payload is not a JSON object")
    return body


class UpstreamLink(_Link):
    """The sending end. Create, send :meth:`hello`, then feed :meth:`receive_data`."""

    ROLE = "u"

    def __init__(self, now: float, heartbeat_interval: float, compression: str = "none") -> None:
        super().__init__(now, heartbeat_interval)
        self.compression = compression
        self._compressor: Any = None
        self._last_upto = 0
        self.bytes_out = 0
        self.raw_bytes_out = 0

    def hello(
        self,
        *,
        name: str,
        group: str,
        destination: str,
        sync: str,
        topics: list[dict[str, Any]],
        now: float,
        expected_group: str = "",
        credentials: tuple[str, str] | None = None,
        back: bool = False,
    ) -> bytes:
        """The hello frame; ``credentials`` (user, password) are sent as ``user_id`` and
        ``pw`` (in the clear unless the transport is TLS); ``back`` offers to receive
        the peer's stream over this connection."""
        body: dict[str, Any] = {
            "version": PROTOCOL_VERSION,
            "name": name,
            "group": group,
            "destination": destination,
            "sync": sync,
            "compression": self.compression,
            "topics": topics,
            "expected_group": expected_group,
        }
        if back:
            body["back"] = True
        if credentials is not None:
            body["user_id"], body["pw"] = credentials
        return self._sent(
            encode_frame({"c": "repl_hello", "v": PROTOCOL_VERSION}, orjson.dumps(body)), now
        )

    def _command(self, frame: Frame) -> Event | None:
        command = frame.command
        if command == "repl_welcome":
            if self.state is not LinkState.HANDSHAKE:
                raise self._unexpected(command)
            body = _json(frame.payload, "repl_welcome")
            self.state = LinkState.STREAMING
            if self.compression == "zstd":
                self._compressor = zstandard.ZstdCompressor(level=3).compressobj()
            try:
                return Welcome(
                    name=str(body["name"]),
                    group=str(body.get("group", body["name"])),
                    cursor_txid=int(body.get("cursor_txid", 0)),
                    cursor_bm=str(body.get("cursor_bm", "")),
                )
            except (KeyError, TypeError, ValueError):
                raise LinkError("protocol violation", "repl_welcome lacks name or cursor") from None
        if command == "repl_ack":
            if self.state is not LinkState.STREAMING:
                raise self._unexpected(command)
            upto = frame.header.get("upto")
            if not isinstance(upto, int) or upto < 0:
                raise LinkError("protocol violation", f"repl_ack with bad upto {upto!r}")
            return Ack(upto)
        raise self._unexpected(command)

    def data(
        self, records: list[bytes], upto: int, upto_bm: str, now: float, start: int = -1
    ) -> bytes:
        """One data frame carrying ``records`` read after txid ``start`` (default: the
        previous frame's ``upto``) up to the position ``upto``. The receiver checks that
        ``start`` is not past what it already has, so lost frames can never go unseen."""
        if self.state is not LinkState.STREAMING:
            raise RuntimeError("data() before the handshake completed")
        if start < 0:
            start = self._last_upto
        self._last_upto = upto
        payload = join_records(records)
        self.raw_bytes_out += len(payload)
        header: dict[str, Any] = {
            "c": "repl_data",
            "from": start,
            "upto": upto,
            "upto_bm": upto_bm,
            "n": len(records),
        }
        if self._compressor is not None and payload:
            payload = self._compressor.compress(payload) + self._compressor.flush(
                zstandard.COMPRESSOBJ_FLUSH_BLOCK
            )
            header["z"] = 1
        frame = encode_frame(header, payload)
        self.bytes_out += len(frame)
        return self._sent(frame, now)


class DownstreamLink(_Link):
    """The receiving end. Feed bytes; answer the Hello with :meth:`welcome` or
    :meth:`refuse`; acknowledge durable positions with :meth:`ack`."""

    ROLE = "d"

    def __init__(self, now: float, heartbeat_interval: float) -> None:
        super().__init__(now, heartbeat_interval)
        self.hello_info: Hello | None = None
        #: how far this end holds the upstream's stream (checked against each frame)
        self.position = 0

    def _command(self, frame: Frame) -> Event | None:
        command = frame.command
        if command == "repl_hello":
            if self.hello_info is not None:
                raise self._unexpected(command)
            body = _json(frame.payload, "repl_hello")
            try:
                hello = Hello(
                    version=int(body.get("version", frame.header.get("v", 0))),
                    name=str(body["name"]),
                    group=str(body.get("group") or body["name"]),
                    destination=str(body.get("destination", "")),
                    sync=str(body.get("sync", "async")),
                    compression=str(body.get("compression", "none")),
                    topics=tuple(t for t in body.get("topics", []) if isinstance(t, dict)),
                    expected_group=str(body.get("expected_group") or ""),
                    user_id=str(body.get("user_id") or ""),
                    pw=str(body.get("pw") or ""),
                    back=body.get("back") is True,
                )
            except (KeyError, TypeError, ValueError):
                raise LinkError(
                    "protocol violation", "repl_hello lacks the instance name"
                ) from None
            self.hello_info = hello
            return hello
        if command == "repl_data":
            if self.state is not LinkState.STREAMING:
                raise self._unexpected(command)
            header = frame.header
            upto = header.get("upto")
            if not isinstance(upto, int) or upto < 0:
                raise LinkError("protocol violation", f"repl_data with bad upto {upto!r}")
            start = header.get("from", 0)
            if not isinstance(start, int) or start > self.position:
                self.state = LinkState.CLOSED
                raise LinkError(
                    "bad data",
                    f"a data frame starts after txid {start} but this end holds the stream "
                    f"only up to {self.position}: frames were lost in transit; reconnecting "
                    "resynchronises",
                )
            self.position = max(self.position, upto)
            payload = frame.payload
            if header.get("z"):
                if self._decompressor is None:
                    self._decompressor = zstandard.ZstdDecompressor().decompressobj()
                try:
                    payload = self._decompressor.decompress(payload)
                except zstandard.ZstdError as exc:
                    raise LinkError(
                        "bad data", f"compressed data does not decode ({exc})"
                    ) from None
            n = header.get("n")
            if not isinstance(n, int):
                raise LinkError("protocol violation", f"repl_data with bad record count {n!r}")
            records = split_records(payload, n)
            return Data(records, upto, str(header.get("upto_bm", "")))
        raise self._unexpected(command)

    def welcome(self, *, name: str, group: str, cursor: tuple[int, str], now: float) -> bytes:
        if self.hello_info is None:
            raise RuntimeError("welcome() before a hello was received")
        self.state = LinkState.STREAMING
        self.position = cursor[0]
        body = {"name": name, "group": group, "cursor_txid": cursor[0], "cursor_bm": cursor[1]}
        return self._sent(encode_frame({"c": "repl_welcome"}, orjson.dumps(body)), now)

    def ack(self, upto: int, now: float) -> bytes:
        return self._sent(encode_frame({"c": "repl_ack", "upto": upto}), now)
