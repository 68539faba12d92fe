"""The server side of the client protocol, sans-IO (amps_py.protocol.server).

:class:`ServerConnection` is driven here as the session drives it, without trio or a
socket: bytes and ``now`` in, events and bytes out. Unit tests pin the rules one at a
time (logon state, refusals and their texts, frame limits, heartbeat timing, timers,
acks); a hypothesis state machine (derandomized: the same cases on every run) drives a
connection with arbitrary frames, fragments and time steps and checks the invariants
after every step.
"""

from __future__ import annotations

import zlib
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from amps_py import reasons
from amps_py.protocol import Frame, FrameDecoder, FrameTooLarge, ProtocolError, encode_frame
from amps_py.protocol.compression import CompressionError
from amps_py.protocol.messages import HEARTBEAT
from amps_py.protocol.server.acks import PublishAcks, ack, failure_frames
from amps_py.protocol.server.commands import ACK_ORDER, CommandFailed
from amps_py.protocol.server.connection import (
    CloseConnection,
    CommandRefused,
    CompressionStarted,
    ConnectionEvent,
    LogonRequested,
    LogonState,
    ServerConnection,
)
from amps_py.protocol.server.heartbeat import HEARTBEAT_GRACE_INTERVALS

COMMANDS = frozenset(
    {"logon", "publish", "subscribe", "heartbeat", "flush", "start_timer", "stop_timer"}
)


def connection(now: float = 0.0, **kwargs: Any) -> ServerConnection:
    options: dict[str, Any] = {"max_frame_size": 1024, "now": now, "logon_timeout": 5.0}
    options.update(kwargs)
    return ServerConnection(COMMANDS, **options)


def decode(frames: list[bytes]) -> list[dict[str, Any]]:
    decoder = FrameDecoder()
    decoder.receive_data(b"".join(frames))
    return [frame.header for frame in decoder.frames()]


def logged_on(now: float = 0.0, **kwargs: Any) -> ServerConnection:
    conn = connection(now, **kwargs)
    (event,) = conn.receive_data(encode_frame({"c": "logon", "client_name": "a"}), now)
    assert isinstance(event, LogonRequested)
    conn.logon_accepted(event.frame.header, event.acks, {"client_name": "a"})
    return conn


# ------------------------------------------------------------------ logon state


def test_a_logon_is_handed_to_the_driver_and_accepted() -> None:
    conn = connection()
    (event,) = conn.receive_data(encode_frame({"c": "logon", "cid": "1", "a": "processed"}), 1.0)
    assert isinstance(event, LogonRequested)
    assert event.acks == frozenset({"processed"})
    assert conn.state is LogonState.CHECKING
    assert conn.logon_deadline == 5.0
    replies = conn.logon_accepted(event.frame.header, event.acks, {"client_name": "a", "s": 0})
    assert decode(replies) == [
        {"c": "ack", "a": "processed", "cid": "1", "status": "success", "client_name": "a", "s": 0}
    ]
    assert conn.logged_on and conn.logon_deadline is None


def test_a_logon_without_ack_types_is_answered_and_one_without_processed_is_not() -> None:
    conn = connection()
    (event,) = conn.receive_data(encode_frame({"c": "logon"}), 0.0)
    assert isinstance(event, LogonRequested)
    assert len(conn.logon_accepted(event.frame.header, event.acks, {})) == 1
    conn = connection()
    (event,) = conn.receive_data(encode_frame({"c": "logon", "a": "received"}), 0.0)
    assert isinstance(event, LogonRequested)
    assert conn.logon_accepted(event.frame.header, event.acks, {}) == []


def test_anything_known_before_the_logon_is_refused_and_closes() -> None:
    conn = connection()
    data = encode_frame({"c": "publish", "t": "x", "cid": "7", "a": "processed,completed"})
    data += encode_frame({"c": "logon"})
    events = list(conn.receive_data(data, 0.0))
    assert len(events) == 1  # nothing after the close
    (close,) = events
    assert isinstance(close, CloseConnection)
    assert close.reason == reasons.LOGON_REQUIRED
    acks = decode(close.output)
    assert [(a["a"], a["status"], a["reason"]) for a in acks] == [
        ("processed", "failure", reasons.LOGON_REQUIRED),
        ("completed", "failure", reasons.LOGON_REQUIRED),
    ]
    assert acks[0]["detail"] == "the first command on a connection must be logon (with client_name)"
    assert conn.state is LogonState.CLOSED
    assert list(conn.receive_data(encode_frame({"c": "logon"}), 1.0)) == []


def test_an_unknown_command_is_refused_and_the_connection_stays() -> None:
    for conn in (connection(), logged_on()):
        before = conn.state
        (event,) = conn.receive_data(encode_frame({"c": "bogus", "cid": "9"}), 0.0)
        assert isinstance(event, CommandRefused)
        assert event.failure.reason == reasons.UNKNOWN_COMMAND
        assert event.failure.detail == "unknown command 'bogus'; see the AMPS command reference"
        assert decode(event.output)[0]["reason"] == reasons.UNKNOWN_COMMAND
        assert conn.state is before


def test_a_second_logon_is_refused() -> None:
    conn = logged_on()
    (event,) = conn.receive_data(encode_frame({"c": "logon", "a": "processed"}), 0.0)
    assert isinstance(event, CommandRefused)
    assert event.failure.reason == reasons.INVALID_LOGON
    assert event.failure.detail == "this connection is already logged on"
    assert conn.logged_on


def test_a_logon_with_unknown_ack_types_is_refused_and_may_be_retried() -> None:
    conn = connection()
    (event,) = conn.receive_data(encode_frame({"c": "logon", "a": "bogus"}), 0.0)
    assert isinstance(event, CommandRefused)
    assert event.failure.reason == reasons.INVALID_OPTIONS
    assert conn.state is LogonState.AWAITING
    (event,) = conn.receive_data(encode_frame({"c": "logon"}), 0.0)
    assert isinstance(event, LogonRequested)


def test_a_refused_logon_closes_the_connection() -> None:
    conn = connection()
    (event,) = conn.receive_data(encode_frame({"c": "logon", "a": "processed"}), 0.0)
    assert isinstance(event, LogonRequested)
    replies = conn.logon_refused(
        event.frame.header, CommandFailed(reasons.AUTH_FAILURE, "wrong password")
    )
    assert decode(replies) == [
        {
            "c": "ack",
            "a": "processed",
            "status": "failure",
            "reason": reasons.AUTH_FAILURE,
            "detail": "wrong password",
        }
    ]
    assert conn.state is LogonState.CLOSED
    assert list(conn.receive_data(encode_frame({"c": "publish", "t": "x"}), 0.0)) == []


def test_commands_of_a_logged_on_connection_come_out_as_frames() -> None:
    conn = logged_on()
    data = encode_frame({"c": "p", "t": "x"}, b"{}") + encode_frame({"c": "subscribe", "t": "y"})
    events = list(conn.receive_data(data, 2.0))
    assert events == [
        Frame({"c": "publish", "t": "x"}, b"{}"),
        Frame({"c": "subscribe", "t": "y"}, b""),
    ]
    assert conn.last_receive == 2.0


# ------------------------------------------------------------------ frames


def test_an_oversized_frame_is_refused_before_its_body_arrives() -> None:
    conn = logged_on()
    with pytest.raises(FrameTooLarge) as caught:
        list(conn.receive_data((4096).to_bytes(4, "big"), 0.0))
    assert str(caught.value) == (
        "frame of 4096 bytes exceeds the maximum of 1024 bytes; send smaller messages or "
        "raise the transport's MaxMessageSize"
    )
    assert caught.value.reason == "frame too large"
    with pytest.raises(ProtocolError):  # the decoder stays broken
        list(conn.receive_data(encode_frame({"c": "publish"}), 0.0))


def test_a_half_sent_frame_waits_and_says_since_when() -> None:
    conn = logged_on()
    frame = encode_frame({"c": "publish", "t": "x"}, b"payload")
    assert list(conn.receive_data(frame[:7], 3.0)) == []
    partial = conn.decoder.partial_frame()
    assert partial is not None
    assert (partial.received, partial.expected, partial.since) == (7, len(frame), 3.0)
    assert list(conn.receive_data(frame[7:], 4.0)) == [
        Frame({"c": "publish", "t": "x"}, b"payload")
    ]
    assert conn.decoder.partial_frame() is None


def test_a_compressed_stream_is_sniffed_inflated_and_answered_compressed() -> None:
    conn = connection()
    deflate = zlib.compressobj()
    data = deflate.compress(encode_frame({"c": "logon"})) + deflate.flush(zlib.Z_SYNC_FLUSH)
    assert list(conn.receive_data(data[:1], 0.0)) == []  # one byte: not enough to tell
    started, logon = conn.receive_data(data[1:], 0.0)
    assert isinstance(started, CompressionStarted)
    assert isinstance(logon, LogonRequested)
    inflate = zlib.decompressobj()
    assert inflate.decompress(conn.encode(HEARTBEAT)) == HEARTBEAT
    with pytest.raises(CompressionError):
        list(conn.receive_data(b"not zlib at all", 0.0))


def test_a_plain_stream_is_sent_plain() -> None:
    conn = logged_on()
    assert conn.encode(HEARTBEAT) is HEARTBEAT


# ------------------------------------------------------------------ heartbeats and timers


def test_heartbeats_beat_every_interval_and_give_up_on_a_silent_client() -> None:
    conn = logged_on(now=0.0)
    replies = conn.start_heartbeat({"c": "heartbeat", "o": "start,2", "a": "processed"}, 1.0)
    assert len(replies) == 1
    clock = conn.heartbeat
    assert (clock.interval, clock.due) == (2.0, 3.0)
    tick = clock.tick(3.0)
    assert tick.beat == HEARTBEAT and tick.silent is None and clock.due == 5.0
    # a later start changes the interval from the next beat on (the due time stays)
    assert conn.start_heartbeat({"c": "heartbeat", "o": "start,1"}, 4.0) == []
    assert clock.due == 5.0
    assert clock.tick(5.0).silent is None  # silent 5 s: not more than 3 x 2 s
    assert clock.due == 6.0
    tick = clock.tick(6.0)  # silent 6 s, timed with 1 s: past the grace
    assert tick.silent == 6.0 and tick.interval == 1.0


def test_a_heartbeat_start_with_unknown_ack_types_still_starts_the_beats() -> None:
    conn = logged_on()
    with pytest.raises(CommandFailed) as caught:
        conn.start_heartbeat({"c": "heartbeat", "o": "start,2", "a": "bogus"}, 1.0)
    assert caught.value.reason == reasons.INVALID_OPTIONS
    assert (conn.heartbeat.interval, conn.heartbeat.due) == (2.0, 3.0)


def test_a_heartbeat_without_start_starts_nothing() -> None:
    conn = logged_on()
    assert conn.start_heartbeat({"c": "heartbeat"}, 0.0) == []
    assert conn.heartbeat.interval == 0
    with pytest.raises(CommandFailed, match="heartbeat interval must be positive"):
        conn.start_heartbeat({"c": "heartbeat", "o": "start,0"}, 0.0)


def test_the_timer_answers_with_the_elapsed_time() -> None:
    conn = logged_on()
    with pytest.raises(CommandFailed, match="stop_timer needs a start_timer first"):
        conn.stop_timer({"c": "stop_timer"}, 0.0)
    assert decode(conn.start_timer({"c": "start_timer", "cid": "t"}, 10.0))[0]["a"] == "processed"
    (reply,) = decode(conn.stop_timer({"c": "stop_timer", "cid": "t"}, 12.5))
    assert (reply["a"], reply["reason"]) == ("completed", "elapsed 2.500000 s")


# ------------------------------------------------------------------ acks


def test_publish_seqs_are_counted_checked_and_note_persisted_wishes() -> None:
    acks = PublishAcks()
    assert acks.seq({}, frozenset(), None) == 1
    assert acks.seq({}, frozenset(), None) == 2
    assert acks.seq({}, frozenset(), 41) == 42
    assert acks.seq({"s": 7}, frozenset(), 41) == 7
    assert not acks.wants_persisted
    with pytest.raises(CommandFailed) as caught:
        acks.seq({"s": -1}, frozenset(), None)
    assert caught.value.reason == reasons.INVALID_SEQ
    acks.seq({"s": 8}, frozenset({"persisted"}), None)
    assert acks.wants_persisted
    always = PublishAcks(always_persisted=True)
    always.seq({}, frozenset(), None)
    assert not always.wants_persisted
    always.seq({"s": 1}, frozenset(), None)
    assert always.wants_persisted


def test_a_publish_gets_the_acks_it_asked_for_in_order() -> None:
    header = {"c": "publish", "cid": "c"}
    asked = frozenset({"completed", "received", "processed", "persisted"})
    acks = decode(PublishAcks.accepted(header, asked, 5))
    assert [(a["a"], a["s"], a["cid"]) for a in acks] == [
        ("received", 5, "c"),
        ("processed", 5, "c"),
        ("completed", 5, "c"),
    ]


def test_persisted_acks_conflate_and_release_held_back_flushes() -> None:
    acks = PublishAcks()
    acks.seq({"s": 1}, frozenset({"persisted"}), None)
    header = {"c": "flush", "cid": "f"}
    out = acks.flush(header, frozenset({"processed", "persisted", "completed"}), pending=2)
    assert [a["a"] for a in decode(out)] == ["processed"]
    assert acks.progress(None, pending=1, pub_hash=9) == []
    out = decode(acks.progress(3, pending=0, pub_hash=9, not_journaled=3))
    assert [(a["a"], a.get("s"), a.get("cid")) for a in out] == [
        ("persisted", 3, None),
        ("persisted", None, "f"),
        ("completed", None, "f"),
    ]
    assert out[0]["reason"] == "not journaled" and out[0]["bm"] == "9|3|"
    assert acks.progress(None, pending=0, pub_hash=9) == []  # answered once
    assert [a["status"] for a in decode(acks.failed([4, 5], "r", "d"))] == ["failure"] * 2
    assert decode(acks.not_journaled(6, 9))[0]["reason"] == "not journaled"


def test_a_connection_that_never_asked_for_persisted_acks_gets_none() -> None:
    acks = PublishAcks()
    acks.seq({"s": 1}, frozenset(), None)
    assert acks.progress(1, pending=0, pub_hash=9) == []
    assert acks.failed([1], "r", "d") == []
    assert acks.not_journaled(1, 9) == []


def test_a_refusal_answers_every_ack_type_asked_for() -> None:
    exc = CommandFailed(reasons.NO_TOPIC, "publish needs a topic (t)")
    header = {"c": "publish", "cid": "x", "a": "stats,received", "s": 3}
    acks = decode(failure_frames(header, exc))
    assert [(a["a"], a["status"], a["s"]) for a in acks] == [
        ("received", "failure", 3),
        ("stats", "failure", 3),
    ]
    assert [a["a"] for a in decode(failure_frames({"a": "bogus"}, exc))] == ["processed"]


# ------------------------------------------------------------------ properties

_CIDS = st.integers(min_value=0, max_value=10**6).map(str)
_ACKS = st.sets(st.sampled_from(sorted(set(ACK_ORDER) - {"persisted", "stats"})), max_size=3)
_COMMAND = st.sampled_from(
    ["logon", "publish", "subscribe", "heartbeat", "flush", "start_timer", "bogus"]
)


def _split(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({c % (len(data) + 1) for c in cuts})
    pieces, start = [], 0
    for point in points:
        pieces.append(data[start:point])
        start = point
    pieces.append(data[start:])
    return pieces


def _events_of(conn: ServerConnection, pieces: list[bytes]) -> list[Any]:
    seen: list[Any] = []
    for piece in pieces:
        for event in conn.receive_data(piece, 0.0):
            seen.append(event)
            if isinstance(event, LogonRequested):
                conn.logon_accepted(event.frame.header, event.acks, {})
    return [_comparable(event) for event in seen]


def _comparable(event: ConnectionEvent) -> Any:
    if isinstance(event, Frame):
        return ("frame", event.header, event.payload)
    if isinstance(event, LogonRequested):
        return ("logon", event.frame.header)
    if isinstance(event, CommandRefused):
        return ("refused", event.header, event.output)
    if isinstance(event, CloseConnection):
        return ("close", event.reason, event.output)
    return ("compressed",)


@settings(derandomize=True, max_examples=150, database=None, deadline=None)
@given(
    commands=st.lists(st.tuples(_COMMAND, _CIDS, st.binary(max_size=40)), min_size=1, max_size=8),
    cuts=st.lists(st.integers(min_value=0), max_size=12),
    compressed=st.booleans(),
)
def test_a_stream_split_anywhere_decodes_the_same(
    commands: list[tuple[str, str, bytes]], cuts: list[int], compressed: bool
) -> None:
    data = b"".join(encode_frame({"c": c, "cid": cid}, payload) for c, cid, payload in commands)
    if compressed:
        deflate = zlib.compressobj()
        data = deflate.compress(data) + deflate.flush(zlib.Z_SYNC_FLUSH)
    whole = _events_of(connection(max_frame_size=4096), [data])
    split = _events_of(connection(max_frame_size=4096), _split(data, cuts))
    assert split == whole


class ConnectionMachine(RuleBasedStateMachine):
    """Drives a ServerConnection the way the session does, with a model driver: frames
    go out in arbitrary fragments, time moves on, logons are accepted or refused, and
    every command run is answered by a stand-in handler."""

    @initialize(logon_acks=st.none() | _ACKS)
    def start(self, logon_acks: set[str] | None) -> None:
        """A new connection; most clients send their logon first (``None``: this one
        does not)."""
        self.now = 0.0
        self.conn = connection(self.now, max_frame_size=4096)
        self.unsent = b""
        #: cid -> (command, the ack types it asked for), in the order sent
        self.sent: dict[str, tuple[str, frozenset[str]]] = {}
        self.order: list[str] = []
        #: where each frame sent ends in the byte stream, and how much of it arrived
        self.ends: list[int] = []
        self.delivered = 0
        self.handled: list[str] = []
        self.owed: frozenset[str] = frozenset()
        self.accept_logons = True
        self.closed = False
        self.beating = False
        self.next_cid = 0
        if logon_acks is not None:
            self.client_sends("logon", logon_acks, b"")

    # -------------------------------------------------------------- the client
    @rule(command=_COMMAND, acks=_ACKS, payload=st.binary(max_size=30))
    def client_sends(self, command: str, acks: set[str], payload: bytes) -> None:
        cid = str(self.next_cid)
        self.next_cid += 1
        header: dict[str, Any] = {"c": command, "cid": cid}
        if acks:
            header["a"] = ",".join(sorted(acks))
        if command == "heartbeat":
            header["o"] = "start,1"
        self.sent[cid] = (command, frozenset(acks))
        self.order.append(cid)
        frame = encode_frame(header, payload)
        self.unsent += frame
        self.ends.append((self.ends[-1] if self.ends else 0) + len(frame))

    @rule(
        size=st.one_of(st.integers(min_value=1, max_value=200), st.just(1 << 20)),
        step=st.floats(min_value=0, max_value=0.5),
    )
    def bytes_arrive(self, size: int, step: float) -> None:
        """The next ``size`` bytes the client sent arrive (all of them for 1 MiB)."""
        piece, self.unsent = self.unsent[:size], self.unsent[size:]
        self.delivered += len(piece)
        self.now += step
        for event in self.conn.receive_data(piece, self.now):
            self._handle(event)

    @rule(accept=st.booleans())
    def credentials(self, accept: bool) -> None:
        self.accept_logons = accept

    @precondition(lambda self: self.beating)
    @rule(late=st.floats(min_value=0, max_value=2))
    def heartbeat_due(self, late: float) -> None:
        clock = self.conn.heartbeat
        self.now = max(self.now, clock.due + late)
        silent_for = self.now - clock.last_receive
        tick = clock.tick(self.now)
        assert tick.beat == HEARTBEAT
        assert (tick.silent is not None) == (silent_for > HEARTBEAT_GRACE_INTERVALS * tick.interval)
        assert clock.due == self.now + clock.interval

    # -------------------------------------------------------------- the driver
    def _handle(self, event: ConnectionEvent) -> None:
        assert not self.closed, "an event after the close"
        conn = self.conn
        was_logged_on = conn.logged_on
        if isinstance(event, Frame):
            assert was_logged_on, "a command before the logon"
            self._answer(event.header["cid"], self._run(event.header))
        elif isinstance(event, LogonRequested):
            assert not was_logged_on and conn.state is LogonState.CHECKING
            header = event.frame.header
            if self.accept_logons:
                replies = conn.logon_accepted(header, event.acks, {})
                owed = {"processed"} & (event.acks or {"processed"})
                self._answer(header["cid"], replies, owed)
            else:
                exc = CommandFailed(reasons.AUTH_FAILURE)
                self._answer(header["cid"], conn.logon_refused(header, exc), refused=True)
                self.closed = True
        elif isinstance(event, CommandRefused):
            command = event.header["c"]
            assert command == "bogus" or (command == "logon" and was_logged_on)
            self._answer(event.header["cid"], event.output, refused=True)
        elif isinstance(event, CloseConnection):
            assert not was_logged_on and event.reason == reasons.LOGON_REQUIRED
            cid = self.order[len(self.handled)]
            assert self.sent[cid][0] not in ("logon", "bogus")
            self._answer(cid, event.output, refused=True)
            self.closed = True

    def _run(self, header: dict[str, Any]) -> list[bytes]:
        """A stand-in handler per command, answering as the session's do; notes the
        acks the command is owed."""
        conn = self.conn
        command = header["c"]
        asked = self.sent[header["cid"]][1]
        if command == "publish":
            seq = conn.publish_acks.seq(header, asked, None)
            self.owed = asked & {"received", "processed", "completed"}
            return PublishAcks.accepted(header, asked, seq)
        if command == "heartbeat":
            out = conn.start_heartbeat(header, self.now)
            self.beating = conn.heartbeat.interval > 0
            self.owed = asked & {"processed"}
            return out
        self.owed = asked or frozenset({"processed"})
        if command == "flush":  # (a flush has no parsed ack)
            out = conn.publish_acks.flush(header, self.owed, pending=0)
            self.owed = self.owed - {"parsed"}
            return out
        if command == "start_timer":
            return conn.start_timer(header, self.now)
        return [ack(header, kind) for kind in sorted(self.owed)]  # subscribe

    def _answer(
        self, cid: str, frames: list[bytes], owed: set[str] | None = None, *, refused: bool = False
    ) -> None:
        """The command ``cid`` was answered with ``frames``: every ack names it, and
        they are exactly the acks it is owed, none twice (a refusal's in ack order)."""
        self.handled.append(cid)
        asked = self.sent[cid][1]
        if refused:  # a failure ack in every type asked for, or processed
            owed = set(asked) or {"processed"}
        elif owed is None:
            owed = set(self.owed)
        acks = decode(frames)
        assert all(a["cid"] == cid for a in acks)
        assert all(a["status"] == ("failure" if refused else "success") for a in acks)
        kinds = [a["a"] for a in acks]
        assert len(kinds) == len(set(kinds)), f"an ack sent twice for {cid}: {kinds}"
        assert set(kinds) == owed, f"{self.sent[cid]} answered with {kinds}"
        if refused:
            assert kinds == [k for k in ACK_ORDER if k in owed]

    # -------------------------------------------------------------- invariants
    @invariant()
    def commands_are_handled_in_order_once_each(self) -> None:
        assert self.handled == self.order[: len(self.handled)]

    @invariant()
    def every_complete_frame_is_handled_until_the_close(self) -> None:
        if not self.closed:
            complete = sum(1 for end in self.ends if end <= self.delivered)
            assert len(self.handled) == complete

    @invariant()
    def nothing_after_the_close(self) -> None:
        if self.closed:
            assert list(self.conn.receive_data(b"", self.now)) == []

    @invariant()
    def the_logon_deadline_holds_until_the_logon(self) -> None:
        expected = None if self.conn.logged_on else 5.0
        assert self.conn.logon_deadline == expected


ConnectionMachine.TestCase.settings = settings(
    derandomize=True, max_examples=100, stateful_step_count=40, database=None, deadline=None
)
test_connection_state_machine = ConnectionMachine.TestCase
