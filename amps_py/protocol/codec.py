"""Sans-IO codec for the ``amps`` wire protocol.

A frame on the socket is a 4-byte big-endian length (counting the bytes after it),
then a flat JSON header object, then the payload running to the end of the frame.

:class:`FrameDecoder` turns received bytes into :class:`Frame` objects; ``encode_*``
turn headers and payloads into bytes to send. Nothing here touches a socket, a clock
or trio. Contract: any input either yields frames or raises :class:`ProtocolError`;
after an error the decoder stays broken (the connection must be closed).
"""

from __future__ import annotations

import re
import struct
from collections.abc import Iterator, Mapping
from typing import Any, Final, NamedTuple

import orjson

from .errors import FrameTooLarge, ProtocolError
from .header import COMMAND_ALIASES, INTEGER_FIELDS, LONG_TO_SHORT

#: Default largest frame accepted (header + payload). AMPS has no documented default;
#: 16 MiB keeps one hostile client from making the server allocate unbounded memory
#: while leaving room for large documents.
DEFAULT_MAX_FRAME_SIZE: Final = 16 * 1024 * 1024

_LEN = struct.Struct(">I")
_HEADER_VALUE_TYPES = (str, int, float, bool)
_FAST_VALUE_TYPES = frozenset({str, int})
_LONG_KEYS = frozenset(LONG_TO_SHORT)
#: decimal text accepted for an integer header field ("42", "-1"); ASCII digits only.
_INT_TEXT = re.compile(r"-?[0-9]+")
#: largest float magnitude below which every integral float is an exact integer.
_MAX_EXACT_FLOAT: Final = float(2**53)


class Frame:
    """One decoded frame: a normalised header dict (short keys) and the payload bytes.

    ``header["c"]`` is always a non-empty string holding the canonical command name
    (``p`` becomes ``publish``); integer fields (``s``, ``bs``, ...) are ints.
    """

    __slots__ = ("header", "payload")

    def __init__(self, header: dict[str, Any], payload: bytes) -> None:
        self.header = header
        self.payload = payload

    @property
    def command(self) -> str:
        return self.header["c"]  # type: ignore[no-any-return]

    def __repr__(self) -> str:
        return f"Frame({self.header!r}, {self.payload[:64]!r})"

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, Frame)
            and self.header == other.header
            and self.payload == other.payload
        )

    __hash__ = None  # type: ignore[assignment]


def normalise_header(raw: object) -> dict[str, Any]:
    """Validate a decoded JSON header and return it with short keys and typed values.

    Raises:
        ProtocolError: the header is not a flat object, lacks a command, or has a
            field of the wrong type.
    """
    if type(raw) is dict and _LONG_KEYS.isdisjoint(raw):
        # Fast path: short keys only, plain string/int values (what clients send on the
        # hot path). Validates the same rules as the general loop below, without copying.
        for value in raw.values():
            if type(value) not in _FAST_VALUE_TYPES:
                break
        else:
            for int_key in INTEGER_FIELDS.intersection(raw):
                if type(raw[int_key]) is not int:
                    raw[int_key] = _coerce_int(int_key, raw[int_key])
            command = raw.get("c")
            if type(command) is str and command:
                if command in COMMAND_ALIASES:
                    raw["c"] = COMMAND_ALIASES[command]
                return raw
    if not isinstance(raw, dict):
        raise ProtocolError('frame header must be a JSON object such as {"c":"publish"}')
    header: dict[str, Any] = {}
    for raw_key, value in raw.items():
        key: str = LONG_TO_SHORT.get(raw_key) or str(raw_key)
        if not isinstance(value, _HEADER_VALUE_TYPES):
            raise ProtocolError(
                f"header field {key!r} must be a string or a number, not "
                f"{type(value).__name__}; AMPS headers are flat JSON objects",
                reason="invalid header",
            )
        if key in INTEGER_FIELDS:
            value = _coerce_int(key, value)
        header[key] = value
    command = header.get("c")
    if not isinstance(command, str) or not command:
        raise ProtocolError(
            'frame header has no command; every frame needs "c" (or "cmd"), e.g. "publish"',
            reason="invalid header",
        )
    header["c"] = COMMAND_ALIASES.get(command, command)
    return header


def _coerce_int(key: str, value: str | int | float | bool) -> int:
    """Return an integer header field as an int: a JSON integer, an integral float
    that is exactly representable, or a decimal string of ASCII digits.

    ``true``/``false``, ``1.5``, ``"1_000"`` and ``" 7"`` are refused rather than
    silently changed into some other number.
    """
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if isinstance(value, float) and value.is_integer() and abs(value) <= _MAX_EXACT_FLOAT:
        return int(value)
    if isinstance(value, str) and _INT_TEXT.fullmatch(value):
        try:
            return int(value)
        except ValueError:  # more digits than int() will convert
            pass
    raise ProtocolError(
        f"header field {key!r} must be an integer, got {value!r}", reason="invalid header"
    )


def _split_flat(
    buf: bytes | bytearray, start: int, stop: int
) -> tuple[dict[str, Any], bytes] | None:
    """The fast path of :func:`split_header` for the frame body ``buf[start:stop]``
    (every well-formed flat header): the first "}" closes the header, since if a prefix
    ending at a "}" parses at all, that "}" ends the top-level object. ``None`` when it
    does not apply; the payload is the only copy made of the body."""
    end = buf.find(b"}", start, stop) + 1
    if not end or stop <= start or buf[start] != 0x7B:  # "{"
        return None
    try:
        raw = orjson.loads(buf[start:end])
    except orjson.JSONDecodeError:
        return None
    return normalise_header(raw), bytes(buf[end:stop])


def split_header(frame: bytes) -> tuple[dict[str, Any], bytes]:
    """Split one frame body (no length prefix) into (normalised header, payload).

    The header is the JSON object at the start of the frame; a ``}`` inside a header
    string does not end it. Runs in time linear in the frame size whatever the input.
    """
    split = _split_flat(frame, 0, len(frame))
    return split if split is not None else _split_slow(frame)


def _split_slow(frame: bytes) -> tuple[dict[str, Any], bytes]:
    """:func:`split_header` where :func:`_split_flat` does not apply."""
    if not frame or frame[0] != 0x7B:  # "{"
        raise ProtocolError(
            "frame does not start with a JSON header object; expected '{' after the 4-byte length",
            reason="invalid header",
        )
    # Slow path: the first "}" sat inside a string (or the header is malformed). Find
    # the end of the top-level object with one linear scan, then parse exactly once;
    # retrying orjson at every later "}" would be quadratic in the frame size.
    end = _header_end(frame)
    if end < 0:
        raise ProtocolError(
            "frame header is not a complete JSON object (unterminated string or missing '}')",
            reason="invalid header",
        )
    try:
        raw = orjson.loads(frame[:end])
    except orjson.JSONDecodeError as exc:
        raise ProtocolError(
            f"frame header is not a complete JSON object ({exc})", reason="invalid header"
        ) from None
    return normalise_header(raw), frame[end:]


#: a JSON structural byte: string start or bracket.
_STRUCTURAL = re.compile(rb'["{}\[\]]')
#: the rest of a JSON string after its opening quote (possessive: no backtracking).
_STRING_REST = re.compile(rb'(?:[^"\\]++|\\.)*+"', re.DOTALL)


def _header_end(frame: bytes) -> int:
    """Index just past the top-level JSON value that opens ``frame``, or -1 if none.

    Tracks only strings and bracket depth; whether the text is valid JSON is left to
    orjson. Each byte is looked at a bounded number of times.
    """
    depth = 0
    pos = 0
    while (match := _STRUCTURAL.search(frame, pos)) is not None:
        pos = match.end()
        char = frame[pos - 1]
        if char == 0x22:  # '"'
            rest = _STRING_REST.match(frame, pos)
            if rest is None:
                return -1
            pos = rest.end()
        elif char in (0x7B, 0x5B):  # "{" "["
            depth += 1
        else:
            depth -= 1
            if depth <= 0:
                return pos
    return -1


class PartialFrame(NamedTuple):
    """The frame a decoder holds in part (see :meth:`FrameDecoder.partial_frame`)."""

    #: bytes of the frame buffered so far, its 4-byte length prefix included
    received: int
    #: the whole frame's size with its prefix, or None while the prefix is incomplete
    expected: int | None
    #: the ``now`` given to the ``receive_data`` call that brought the frame's first byte
    since: float


class FrameDecoder:
    """Incremental frame decoder: ``receive_data`` bytes, then iterate ``frames()``.

    Args:
        max_frame_size: largest accepted frame body; a larger length prefix raises
            :class:`FrameTooLarge` before any of the body is buffered.
    """

    def __init__(self, max_frame_size: int = DEFAULT_MAX_FRAME_SIZE) -> None:
        if max_frame_size < 2:
            raise ValueError("max_frame_size must be at least 2 bytes")
        self.max_frame_size = max_frame_size
        self._buffer = bytearray()
        self._error: ProtocolError | None = None
        # when the first byte of the frame now buffered in part arrived, and the time
        # of the latest receive_data (a frame that starts in it began then)
        self._partial_since = 0.0
        self._last_receive = 0.0

    @property
    def buffered(self) -> int:
        """Bytes received but not yet returned as frames."""
        return len(self._buffer)

    def receive_data(self, data: bytes | bytearray | memoryview, now: float = 0.0) -> None:
        """Add bytes read from the peer (``trio``'s ``receive_some`` may give a bytearray).

        ``now`` is the caller's clock when the bytes arrived; it only feeds
        :meth:`partial_frame` (which frame started when), so a caller that does not
        ask may leave it out.
        """
        if self._error is not None:
            raise self._error
        if not self._buffer:
            self._partial_since = now
        self._last_receive = now
        self._buffer += data

    def partial_frame(self) -> PartialFrame | None:
        """The frame received in part, or None when no byte of a next frame is buffered.

        Meant to be asked after ``frames()`` has been drained (the buffer then holds
        only the start of the next frame); ``since`` is exact when ``frames()`` is
        drained after every ``receive_data``. A broken decoder holds nothing.
        """
        buf = self._buffer
        if not buf or self._error is not None:
            return None
        expected = _LEN.unpack_from(buf)[0] + 4 if len(buf) >= 4 else None
        return PartialFrame(len(buf), expected, self._partial_since)

    def discard(self, reason: str) -> None:
        """Free every buffered byte now and break the decoder: from then on
        ``receive_data`` and ``frames()`` raise :class:`ProtocolError` with ``reason``
        (for a connection being closed whose buffer must not wait for its task)."""
        self._buffer = bytearray()
        if self._error is None:
            self._error = ProtocolError(reason, reason="connection closed")

    def frames(self) -> Iterator[Frame]:
        """Yield every complete frame buffered so far; leave partial data buffered."""
        if self._error is not None:
            raise self._error
        buf = self._buffer
        pos = 0
        end = len(buf)
        limit = self.max_frame_size
        try:
            while end - pos >= 4:
                (size,) = _LEN.unpack_from(buf, pos)
                if size > limit:
                    raise FrameTooLarge(size, limit)
                if size < 2:
                    raise ProtocolError(
                        f"frame length {size} is too small to hold a header; the length "
                        "prefix counts the header and payload bytes that follow it"
                    )
                if end - pos - 4 < size:
                    break
                start = pos + 4
                pos = stop = start + size
                # the common case straight from the buffer, without a copy of the frame
                split = _split_flat(buf, start, stop)
                if split is None:
                    split = _split_slow(bytes(buf[start:stop]))
                yield Frame(*split)
        except ProtocolError as exc:
            self._error = exc
            self._buffer = bytearray()
            raise
        finally:
            if pos and self._error is None:
                del buf[:pos]
                # under the drain-after-each-receive contract, what is left started
                # in the latest chunk
                self._partial_since = self._last_receive

    def next_frame(self) -> Frame | None:
        """Return the next complete frame, or None when more bytes are needed."""
        for frame in self.frames():
            return frame
        return None


def encode_frame(header: Mapping[str, Any], payload: bytes = b"") -> bytes:
    """Encode one frame: length prefix, compact JSON header, payload."""
    head = orjson.dumps(header)
    return _LEN.pack(len(head) + len(payload)) + head + payload


def encode_raw(head: bytes, payload: bytes = b"") -> bytes:
    """Encode a frame whose header JSON is already serialised (hot delivery path)."""
    return _LEN.pack(len(head) + len(payload)) + head + payload
