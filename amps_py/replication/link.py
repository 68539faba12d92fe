"""The replication link protocol, sans-IO: bytes and time in, events and bytes out.

AMPS does not publish its replication wire format; this one is ours. It reuses the
client protocol's framing (4-byte big-endian length, flat JSON header, payload).

Handshake (the upstream, the instance that sends, opens the TCP connection)::

    upstream   -> repl_hello    payload: {"name","group","destination","sync",
                                          "compression","topics":[...],
                                          "user_id","pw",   (credentials: optional)
                                          "holdings": {origin: high}}   (optional)
    downstream -> repl_welcome  payload: {"name","group","cursor_txid","cursor_bm",
                                          "holdings": {origin: {"upto","digest",
                                                       "cuts": [[bucket, digest]]}}}
            or -> repl_refuse   payload: {"reason","detail"}   (either side, then close)

``holdings`` is the resync exchange (:mod:`.exchange`): offered by the upstream,
answered by a downstream that keeps holdings; either side may be an older version
without it (the field is then absent, and the resync is what it was).

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

Nothing a peer sends is trusted to have the right shape. Every field of a hello or
welcome is type-checked (:func:`parse_hello`, :func:`parse_welcome`, in :mod:`.hello`
with the rest of the handshake codec, and re-exported here): a wrong one
raises :class:`RemoteProtocolError` with reason ``malformed hello`` / ``malformed
welcome`` and a detail naming the field and what was expected. Until the handshake completes a frame
may be at most :data:`MAX_HANDSHAKE_FRAME` bytes (a hello, a welcome, a refusal),
afterwards :data:`MAX_REPLICATION_FRAME`; a zstd data frame is inflated with the same
hard limit on its output (reason ``data too large``), so a small compressed frame
cannot make this end allocate more than a plain frame could.
"""

from __future__ import annotations

import itertools
import struct
from dataclasses import dataclass
from enum import Enum
from typing import Any, Final

import orjson
import zstandard

from amps_py import reasons
from amps_py.protocol import Frame, FrameDecoder, FrameTooLarge, ProtocolError, encode_frame

# the handshake codec and the errors live in their own modules; re-exported here so that
# every name stays importable from this one
from .hello import _MAX_LABEL, _U64_MAX
from .hello import MAX_NAME_LENGTH as MAX_NAME_LENGTH
from .hello import PROTOCOL_VERSION as PROTOCOL_VERSION
from .hello import HeldOrigin as HeldOrigin
from .hello import Hello as Hello
from .hello import Welcome as Welcome
from .hello import decode_payload as decode_payload
from .hello import hello_body as hello_body
from .hello import parse_hello as parse_hello
from .hello import parse_welcome as parse_welcome
from .hello import welcome_body as welcome_body
from .link_errors import LinkError as LinkError
from .link_errors import LocalProtocolError as LocalProtocolError
from .link_errors import RemoteProtocolError as RemoteProtocolError

#: replication frames carry batches of records: allow larger frames than clients
MAX_REPLICATION_FRAME: Final = 256 * 1024 * 1024
#: the largest frame accepted before the handshake completes (hello, welcome, refusal,
#: heartbeat). A hello is about 120 bytes plus ~90 bytes per replicated Topic entry
#: (more with a Filter): 250 Topic entries with 150-byte Filters fit in 64 KiB.
#: Anything larger before the hello is not a peer: it is refused as soon as its length
#: prefix arrives, before any of it is buffered.
MAX_HANDSHAKE_FRAME: Final = 64 * 1024
#: the longest refusal detail sent to the peer (the refusing side logs all of it)
MAX_REFUSAL_DETAIL: Final = 8 * 1024
#: the largest zstd window a compressed stream may ask for; the upstream compresses at
#: level 3 (a 2 MiB window), so a stream asking for more is not ours
MAX_ZSTD_WINDOW: Final = 8 * 1024 * 1024


class LinkState(Enum):
    HANDSHAKE = "handshake"
    STREAMING = "streaming"
    CLOSED = "closed"


# ----------------------------------------------------------------------------- events
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
        RemoteProtocolError: the lengths do not add up (a truncated or garbled frame).
    """
    head = 4 * n
    if n < 0 or head > len(payload):
        raise RemoteProtocolError(
            reasons.BAD_DATA, f"a frame of {len(payload)} bytes cannot hold {n} records"
        )
    sizes = struct.unpack_from(f">{n}I", payload)
    ends = list(itertools.accumulate(sizes, initial=head))
    if ends[-1] != len(payload):
        raise RemoteProtocolError(
            reasons.BAD_DATA,
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
        self._decoder = FrameDecoder(MAX_HANDSHAKE_FRAME)
        self._live = _Liveness(heartbeat_interval, 5 * heartbeat_interval, now, now)

    @property
    def max_frame_size(self) -> int:
        """The largest frame accepted now: :data:`MAX_HANDSHAKE_FRAME` until the
        handshake completes, then :data:`MAX_REPLICATION_FRAME`."""
        return self._decoder.max_frame_size

    def _handshake_done(self) -> None:
        self.state = LinkState.STREAMING
        self._decoder.max_frame_size = MAX_REPLICATION_FRAME

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
            RemoteProtocolError: the peer has been silent longer than the silence limit.
        """
        live = self._live
        # the same sums as next_deadline(), so a wake-up at that deadline acts (a
        # difference could round below it and the timer loop would spin)
        if now >= live.last_received + live.silence_limit:
            self.state = LinkState.CLOSED
            raise RemoteProtocolError(
                reasons.PEER_SILENT,
                f"nothing received for {now - live.last_received:.1f} s "
                f"(heartbeat {live.heartbeat_interval:g} s)",
            )
        if now >= live.last_sent + live.heartbeat_interval:
            return self._sent(encode_frame({"c": "repl_hb", "r": self.ROLE}), now)
        return b""

    def _sent(self, data: bytes, now: float) -> bytes:
        self._live.last_sent = now
        return data

    # -- input
    def receive_data(self, data: bytes | bytearray, now: float) -> list[Event]:
        """Feed bytes from the peer; return the events they complete.

        Raises:
            RemoteProtocolError: malformed frames, a frame not allowed in this state,
                or a protocol violation. The caller must close the connection.
        """
        try:
            self._decoder.receive_data(data)
            frames = list(self._decoder.frames())
        except FrameTooLarge as exc:
            self.state = LinkState.CLOSED
            handshaking = self.max_frame_size < MAX_REPLICATION_FRAME
            raise frame_too_large(exc, handshaking=handshaking) from None
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
            body = decode_payload(frame.payload, "repl_refuse")
            reason, detail = body.get("reason"), body.get("detail")
            return Refused(
                reason[:_MAX_LABEL] if isinstance(reason, str) and reason else reasons.REFUSED,
                detail[:MAX_REFUSAL_DETAIL] if isinstance(detail, str) else "",
            )
        return self._command(frame)

    def _command(self, frame: Frame) -> Event | None:
        raise NotImplementedError

    def refuse(self, reason: str, detail: str, now: float) -> bytes:
        """The frame that tells the peer why the link is refused (then close). A
        detail longer than :data:`MAX_REFUSAL_DETAIL` is cut (log it in full here)."""
        self.state = LinkState.CLOSED
        if len(detail) > MAX_REFUSAL_DETAIL:
            cut = len(detail) - MAX_REFUSAL_DETAIL + 80
            detail = f"{detail[:-cut]} ... ({cut} more characters in this instance's log)"
        return self._sent(
            encode_frame(
                {"c": "repl_refuse", "r": self.ROLE},
                orjson.dumps({"reason": reason, "detail": detail}),
            ),
            now,
        )

    def _unexpected(self, command: str) -> RemoteProtocolError:
        """The error for a frame the peer may not send in the link's state (named as
        it was when the frame arrived); the link is closed from then on."""
        was = self.state
        self.state = LinkState.CLOSED
        return RemoteProtocolError(
            reasons.PROTOCOL_VIOLATION, f"unexpected {command!r} in state {was.value}"
        )


def not_a_peer(exc: ProtocolError) -> RemoteProtocolError:
    """The error for bytes that are not replication frames."""
    return RemoteProtocolError(
        reasons.NOT_A_REPLICATION_PEER,
        f"{exc}; is an AMPS client or another program connected to the replication port?",
    )


def frame_too_large(exc: FrameTooLarge, *, handshaking: bool) -> RemoteProtocolError:
    """The error for a frame whose length prefix is over the limit (refused before
    any of its body is buffered)."""
    if handshaking:
        return RemoteProtocolError(
            reasons.NOT_A_REPLICATION_PEER,
            f"a frame of {exc.size} bytes arrived before the replication handshake "
            f"completed, but at most {exc.limit} bytes (the handshake frame limit) are "
            "accepted until then, and a hello describes the replicated topics in far "
            "less; is an AMPS client or another program connected to the replication port?",
        )
    return RemoteProtocolError(
        reasons.FRAME_TOO_LARGE,
        f"a frame of {exc.size} bytes exceeds the replication frame limit of {exc.limit} "
        "bytes; the peer is not an amps-py instance of this version, or is misbehaving",
    )


class _Inflater:
    """One link's zstd stream, inflated frame by frame with a hard limit on the output
    of each frame: a frame that would inflate past ``limit`` bytes raises
    :class:`RemoteProtocolError` (reason ``data too large``) having produced at most ``limit``
    bytes plus one step's worth (~2 MiB), however small it was compressed."""

    #: the most output one compressed byte may stand for: a 4-byte RLE block is a
    #: whole 128 KiB block
    _MAX_RATIO: Final = 128 * 1024 // 4

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._stream = zstandard.ZstdDecompressor(max_window_size=MAX_ZSTD_WINDOW).decompressobj()

    def inflate(self, data: bytes) -> bytes:
        """Raises:
        RemoteProtocolError: ``data too large`` past the limit, ``bad data`` if it does
            not decode."""
        view = memoryview(data)
        parts: list[bytes] = []
        total = 0
        pos = 0
        try:
            while pos < len(view):
                # never feed more than could inflate to the room left (at least 64 bytes)
                step = max(64, (self.limit - total) // self._MAX_RATIO)
                part = self._stream.decompress(view[pos : pos + step])
                pos += step
                total += len(part)
                if total > self.limit:
                    raise RemoteProtocolError(
                        reasons.DATA_TOO_LARGE,
                        f"a compressed data frame of {len(data)} bytes inflates past "
                        f"{self.limit} bytes, the replication frame limit (stopped there): "
                        "a decompression bomb, or a corrupted stream",
                    )
                parts.append(part)
        except zstandard.ZstdError as exc:
            raise RemoteProtocolError(
                reasons.BAD_DATA, f"compressed data does not decode ({exc})"
            ) from None
        return b"".join(parts)


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
        holdings: dict[str, int] | None = None,
    ) -> bytes:
        """The hello frame; ``credentials`` (user, password) are sent as ``user_id`` and
        ``pw`` (in the clear unless the transport is TLS); ``back`` offers to receive
        the peer's stream over this connection; ``holdings`` offers the resync exchange
        (left out when the hello would be too large with it).

        Raises:
            LocalProtocolError: reason ``hello too large``: the destination's Topic
                entries make a hello larger than a peer accepts before the handshake.
        """
        body = hello_body(
            name=name,
            group=group,
            destination=destination,
            sync=sync,
            compression=self.compression,
            topics=topics,
            expected_group=expected_group,
            credentials=credentials,
            back=back,
            holdings=holdings,
        )
        frame = encode_frame({"c": "repl_hello", "v": PROTOCOL_VERSION}, orjson.dumps(body))
        if len(frame) - 4 > MAX_HANDSHAKE_FRAME and holdings is not None:
            # the exchange is an optimisation: never let it make a hello too large
            del body["holdings"]
            frame = encode_frame({"c": "repl_hello", "v": PROTOCOL_VERSION}, orjson.dumps(body))
        if len(frame) - 4 > MAX_HANDSHAKE_FRAME:
            self.state = LinkState.CLOSED
            raise LocalProtocolError(
                reasons.HELLO_TOO_LARGE,
                f"destination {destination} describes {len(topics)} Topic entries (and the "
                "SOW topics they cover) in a hello "
                f"of {len(frame) - 4} bytes, but a peer accepts at most {MAX_HANDSHAKE_FRAME} "
                "bytes before the handshake; use fewer, broader Topic entries (a regex Name "
                "covers many topics) or shorter Filters",
            )
        return self._sent(frame, now)

    def _command(self, frame: Frame) -> Event | None:
        command = frame.command
        if command == "repl_welcome":
            if self.state is not LinkState.HANDSHAKE:
                raise self._unexpected(command)
            try:
                welcome = parse_welcome(decode_payload(frame.payload, "repl_welcome"))
            except LinkError:
                self.state = LinkState.CLOSED
                raise
            self._handshake_done()
            if self.compression == "zstd":
                self._compressor = zstandard.ZstdCompressor(level=3).compressobj()
            return welcome
        if command == "repl_ack":
            if self.state is not LinkState.STREAMING:
                raise self._unexpected(command)
            upto = frame.header.get("upto")
            if not isinstance(upto, int) or upto < 0:
                raise RemoteProtocolError(
                    reasons.PROTOCOL_VIOLATION, f"repl_ack with bad upto {upto!r}"
                )
            return Ack(upto)
        raise self._unexpected(command)

    def data(
        self, records: list[bytes], upto: int, upto_bm: str, now: float, start: int = -1
    ) -> bytes:
        """One data frame carrying ``records`` read after txid ``start`` (default: the
        previous frame's ``upto``) up to the position ``upto``. The receiver checks that
        ``start`` is not past what it already has, so lost frames can never go unseen.

        Raises:
            LocalProtocolError: the handshake has not completed (no welcome yet).
        """
        if self.state is not LinkState.STREAMING:
            raise LocalProtocolError(
                reasons.LINK_MISUSE,
                f"data() called in state {self.state.value}: send data only once the "
                "peer's welcome has been received",
            )
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
        self._inflater: _Inflater | None = None

    def _command(self, frame: Frame) -> Event | None:
        command = frame.command
        if command == "repl_hello":
            if self.hello_info is not None:
                raise self._unexpected(command)
            try:
                hello = parse_hello(decode_payload(frame.payload, "repl_hello"))
            except LinkError:
                self.state = LinkState.CLOSED
                raise
            self.hello_info = hello
            return hello
        if command == "repl_data":
            if self.state is not LinkState.STREAMING:
                raise self._unexpected(command)
            header = frame.header
            upto = header.get("upto")
            if type(upto) is not int or not 0 <= upto <= _U64_MAX:
                raise RemoteProtocolError(
                    reasons.PROTOCOL_VIOLATION, f"repl_data with bad upto {upto!r}"
                )
            upto_bm = header.get("upto_bm", "")
            if not isinstance(upto_bm, str) or len(upto_bm) > _MAX_LABEL:
                raise RemoteProtocolError(
                    reasons.PROTOCOL_VIOLATION, "repl_data with a bad upto_bm"
                )
            start = header.get("from", 0)
            if type(start) is not int or start < 0:
                raise RemoteProtocolError(
                    reasons.PROTOCOL_VIOLATION, f"repl_data with bad from {start!r}"
                )
            if start > self.position:
                self.state = LinkState.CLOSED
                raise RemoteProtocolError(
                    reasons.BAD_DATA,
                    f"a data frame starts after txid {start} but this end holds the stream "
                    f"only up to {self.position}: frames were lost in transit; reconnecting "
                    "resynchronises",
                )
            self.position = max(self.position, upto)
            n = header.get("n")
            if type(n) is not int or n < 0:
                raise RemoteProtocolError(
                    reasons.PROTOCOL_VIOLATION, f"repl_data with bad record count {n!r}"
                )
            payload = frame.payload
            if header.get("z"):
                if self._inflater is None:
                    self._inflater = _Inflater(MAX_REPLICATION_FRAME)
                payload = self._inflater.inflate(payload)
            records = split_records(payload, n)
            return Data(records, upto, upto_bm)
        raise self._unexpected(command)

    def welcome(
        self,
        *,
        name: str,
        group: str,
        cursor: tuple[int, str],
        now: float,
        holdings: dict[str, HeldOrigin] | None = None,
    ) -> bytes:
        """The welcome frame accepting the received hello; ``cursor`` (txid, bookmark)
        says how far this end holds the upstream's stream; ``holdings`` answers the
        hello's resync exchange (left out when the welcome would be too large with it,
        which the cuts :mod:`.exchange` reports never make it).

        Raises:
            LocalProtocolError: no hello was received yet.
        """
        if self.hello_info is None:
            raise LocalProtocolError(
                reasons.LINK_MISUSE,
                "welcome() called before a hello was received: answer a Hello event only",
            )
        self._handshake_done()
        self.position = cursor[0]
        body = welcome_body(name=name, group=group, cursor=cursor, holdings=holdings)
        frame = encode_frame({"c": "repl_welcome"}, orjson.dumps(body))
        if len(frame) - 4 > MAX_HANDSHAKE_FRAME and holdings is not None:
            body = welcome_body(name=name, group=group, cursor=cursor)
            frame = encode_frame({"c": "repl_welcome"}, orjson.dumps(body))
        return self._sent(frame, now)

    def ack(self, upto: int, now: float) -> bytes:
        return self._sent(encode_frame({"c": "repl_ack", "upto": upto}), now)
