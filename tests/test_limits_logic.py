"""Pure parts of the client limits: the decoder's partial-frame report and the decisions
in amps_py.server.limits (no sockets, time passed in)."""

from __future__ import annotations

import pytest

from amps_py.protocol import FrameDecoder, PartialFrame, ProtocolError, encode_frame
from amps_py.server.limits import BytePool, InstanceLimits, ReadDeadline, biggest, read_deadline

FRAME = encode_frame({"c": "p", "t": "t", "s": 1}, b"x" * 100)
NEXT = encode_frame({"c": "p", "t": "t", "s": 2}, b"y" * 50)


def drain(decoder: FrameDecoder) -> int:
    return len(list(decoder.frames()))


def test_no_partial_frame_when_nothing_is_buffered() -> None:
    decoder = FrameDecoder()
    assert decoder.partial_frame() is None
    decoder.receive_data(FRAME, now=1.0)
    assert drain(decoder) == 1
    assert decoder.partial_frame() is None


def test_partial_frame_counts_from_its_first_byte() -> None:
    decoder = FrameDecoder()
    decoder.receive_data(FRAME[:2], now=5.0)
    assert drain(decoder) == 0
    # the length prefix is not complete yet: the size is unknown
    assert decoder.partial_frame() == PartialFrame(2, None, 5.0)
    decoder.receive_data(FRAME[2:60], now=7.0)
    assert drain(decoder) == 0
    # more bytes do not restart the clock
    assert decoder.partial_frame() == PartialFrame(60, len(FRAME), 5.0)


def test_next_frame_starting_in_the_same_chunk_starts_its_own_clock() -> None:
    decoder = FrameDecoder()
    decoder.receive_data(FRAME[:30], now=1.0)
    assert drain(decoder) == 0
    decoder.receive_data(FRAME[30:] + NEXT[:10], now=9.0)
    assert drain(decoder) == 1
    assert decoder.partial_frame() == PartialFrame(10, len(NEXT), 9.0)
    decoder.receive_data(NEXT[10:], now=12.0)
    assert drain(decoder) == 1
    assert decoder.partial_frame() is None
    decoder.receive_data(FRAME[:1], now=20.0)
    assert decoder.partial_frame() == PartialFrame(1, None, 20.0)


def test_byte_by_byte_keeps_the_first_time() -> None:
    decoder = FrameDecoder()
    for i, byte in enumerate(FRAME[:-1]):
        decoder.receive_data(bytes([byte]), now=float(i))
        assert drain(decoder) == 0
    assert decoder.partial_frame() == PartialFrame(len(FRAME) - 1, len(FRAME), 0.0)


def test_discard_frees_the_buffer_and_breaks_the_decoder() -> None:
    decoder = FrameDecoder()
    decoder.receive_data(FRAME[:50], now=1.0)
    assert drain(decoder) == 0
    decoder.discard("closed over a limit")
    assert decoder.buffered == 0
    assert decoder.partial_frame() is None
    with pytest.raises(ProtocolError, match="closed over a limit"):
        decoder.receive_data(FRAME)
    with pytest.raises(ProtocolError):
        drain(decoder)


def test_read_deadline_is_the_earliest_that_applies() -> None:
    assert read_deadline(logon_deadline=None, partial=None, frame_timeout=60) is None
    assert read_deadline(logon_deadline=30.0, partial=None, frame_timeout=60) == ReadDeadline(
        30.0, "logon"
    )
    partial = PartialFrame(10, 100, since=5.0)
    assert read_deadline(logon_deadline=None, partial=partial, frame_timeout=1) == ReadDeadline(
        6.0, "frame"
    )
    # a frame started before the logon deadline but due after it: the logon one comes first
    assert read_deadline(logon_deadline=30.0, partial=partial, frame_timeout=60) == ReadDeadline(
        30.0, "logon"
    )
    assert read_deadline(logon_deadline=30.0, partial=partial, frame_timeout=1) == ReadDeadline(
        6.0, "frame"
    )


def test_biggest_holder_goes_first() -> None:
    assert biggest([]) is None
    assert biggest([("a", 0), ("b", 0)]) is None
    assert biggest([("a", 5), ("b", 9), ("c", 9), ("d", 1)]) == ("b", 9)


def test_pools_report_what_they_hold() -> None:
    pool = BytePool("MessageMemoryLimit", 100)
    pool.total = 150
    pool.note_peak()
    pool.total = 20
    assert not pool.over
    assert pool.statistics() == {"bytes": 20, "limit_bytes": 100, "peak_bytes": 150}
    limits = InstanceLimits(1000, 2000)
    stats = limits.statistics()
    assert stats["queued"]["limit_bytes"] == 1000
    assert stats["incomplete_messages"]["limit_bytes"] == 2000
