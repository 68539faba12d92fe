"""Pure parts of the client limits: the decoder's partial-frame report and the decisions
in amps_py.server.limits (no sockets, time passed in)."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from amps_py import events, reasons
from amps_py.protocol import FrameDecoder, PartialFrame, ProtocolError, encode_frame
from amps_py.server.limits import (
    BytePool,
    InstanceLimits,
    ReadDeadline,
    biggest,
    deadline_closing,
    incomplete_memory_closing,
    read_deadline,
    shed,
    slow_client_closing,
)

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


# ---------------------------------------------------------------- who goes, in what words
def test_shed_closes_the_biggest_first_until_the_pool_is_at_its_limit() -> None:
    holders = [("a", 10), ("b", 50), ("c", 30), ("d", 0), ("e", 30)]
    # 120 held, limit 60: b goes (70 left), then c, the first of the two 30s (40 left)
    assert shed(holders, 120, 60) == [("b", 50, 120), ("c", 30, 70)]
    assert shed(holders, 60, 60) == []  # at the limit is not over it
    # holders of nothing never go, even when the pool cannot get under its limit
    assert shed([("d", 0), ("a", 5)], 100, 10) == [("a", 5, 100)]


def test_shed_picks_what_repeated_biggest_would() -> None:
    holders = [("x", 7), ("y", 9), ("z", 9), ("w", 1)]
    remaining, total, picked = dict(holders), 26, []
    while total > 3:
        found = biggest(remaining.items())
        if found is None:
            break
        picked.append((*found, total))
        total -= found[1]
        del remaining[found[0]]
    assert shed(holders, 26, 3) == picked


@dataclass
class Conn:
    conn_id: int = 7
    client_name: str = "sub"
    peer: str = "10.0.0.1:5000"
    transport: str = "json-tcp"


def test_logon_deadline_closing_names_the_timeout_and_transport() -> None:
    closing = deadline_closing(
        ReadDeadline(30.0, "logon"), Conn(), logon_timeout=2.5, frame_timeout=60, partial=None
    )
    assert closing.reason == reasons.LOGON_TIMEOUT
    assert closing.event == events.CLIENT_LOGON_TIMEOUT
    assert closing.detail == (
        "no logon within 2.5 s of connecting (LogonTimeout of transport json-tcp); log on first"
    )
    assert closing.message % closing.args == (
        "closing connection 7 from 10.0.0.1:5000: no logon within LogonTimeout of 2.5 s "
        "(transport json-tcp)"
    )


def test_frame_deadline_closing_says_how_much_of_the_frame_came() -> None:
    partial = PartialFrame(40, 104, 1.0)
    closing = deadline_closing(
        ReadDeadline(2.0, "frame"), Conn(), logon_timeout=5, frame_timeout=1, partial=partial
    )
    assert closing.reason == reasons.INCOMPLETE_MESSAGE_TIMEOUT
    assert closing.event == events.CLIENT_INCOMPLETE_MESSAGE_TIMEOUT
    assert "still incomplete (40 of 104 bytes) 1 s after its first byte" in closing.detail
    assert closing.message % closing.args == (
        "closing connection 7 (client 'sub', 10.0.0.1:5000): it sent 40 of 104 bytes of a "
        "frame and did not finish it within IncompleteMessageTimeout of 1 s (transport json-tcp)"
    )
    unknown = deadline_closing(
        ReadDeadline(2.0, "frame"),
        Conn(),
        logon_timeout=5,
        frame_timeout=1,
        partial=PartialFrame(2, None, 1.0),
    )
    assert "(2 of unknown bytes)" in unknown.detail


def test_incomplete_memory_closing_names_the_pool() -> None:
    pool = BytePool("IncompleteMessageMemoryLimit", 1000)
    closing = incomplete_memory_closing(Conn(), 900, PartialFrame(900, 5000, 0.0), pool, 1200)
    assert closing.reason == reasons.INCOMPLETE_MESSAGE_MEMORY_LIMIT
    assert closing.event == events.CLIENT_INCOMPLETE_MESSAGE_MEMORY
    assert closing.message % closing.args == (
        "closing connection 7 (client 'sub', 10.0.0.1:5000): its unfinished frame holds 900 "
        "of 5000 bytes, the largest of all connections, and unfinished frames together hold "
        "1200 bytes, over IncompleteMessageMemoryLimit of 1000 bytes"
    )


def test_slow_client_closing_says_which_limit_and_how_to_resume() -> None:
    own = slow_client_closing(Conn(), queued=5000, capacity=4096)
    assert own.reason == reasons.SLOW_CLIENT
    assert own.event == events.CLIENT_SLOW_DISCONNECTED
    assert own.detail == (
        "disconnected as a slow client: 5000 bytes wait to be sent to it, over its "
        "ClientMaxCapacity of 4096 bytes; resume by bookmark"
    )
    pool = BytePool("MessageMemoryLimit", 8000)
    shared = slow_client_closing(Conn(), queued=3000, pool=pool, total=9000)
    assert shared.message % shared.args == (
        "disconnecting client 'sub' (connection 7, 10.0.0.1:5000) as a slow client: it has "
        "the most bytes waiting (3000) and all clients together have 9000, over "
        "MessageMemoryLimit of 8000 bytes; it can resume by bookmark"
    )
