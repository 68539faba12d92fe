"""The client end of the wire protocol, sans-IO (amps_py/protocol/client_connection.py).

No server, no trio: frames are built with the server's own builders
(:mod:`amps_py.protocol.messages`) and fed to a :class:`ClientConnection` as bytes, at
times the test chooses. The stateful test drives it with arbitrary sequences of
commands, acks, publishes, heartbeats and time, and checks its invariants.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from amps_py.protocol import FrameDecoder, ProtocolError, encode_frame
from amps_py.protocol import messages as server
from amps_py.protocol.client_connection import (
    BEAT,
    ClientConnection,
    CommandDone,
    Delivery,
    HeartbeatReceived,
    LoggedOn,
    Persisted,
    PublishFailed,
    QueryFrame,
    ServerClosed,
    ServerNotice,
    ServerSilent,
    SubscriptionAck,
    TrackedAck,
)


def sent(data: bytes) -> dict[str, Any]:
    """The header of the one frame in ``data``."""
    decoder = FrameDecoder()
    decoder.receive_data(data)
    (frame,) = decoder.frames()
    return frame.header


def only(events: list[Any], kind: type) -> list[Any]:
    return [event for event in events if isinstance(event, kind)]


# ------------------------------------------------------------------------ logon
def test_logon_names_the_client_and_carries_the_credentials() -> None:
    conn = ClientConnection("app")
    cid, data = conn.logon({"mt": "json", "user_id": "u", "pw": "secret"})
    header = sent(data)
    assert header["c"] == "logon" and header["cid"] == cid
    assert header["client_name"] == "app" and header["a"] == "processed"
    assert (header["user_id"], header["pw"], header["mt"]) == ("u", "secret", "json")


def test_a_logon_ack_sets_the_publish_sequence_to_what_the_server_holds() -> None:
    conn = ClientConnection("app")
    cid, _ = conn.logon({})
    events = conn.receive_data(server.ack("processed", cid=cid, s=41), 1.0)
    (logged_on,) = only(events, LoggedOn)
    assert logged_on.ack["s"] == 41
    assert only(events, CommandDone) == [CommandDone(cid, [logged_on.ack], True)]
    assert (conn.seq, conn.persisted_seq) == (41, 41)
    seq, data = conn.publish("p", "t", b"{}")
    assert seq == 42 and sent(data)["s"] == 42


def test_a_refused_logon_is_a_failure_and_changes_nothing() -> None:
    conn = ClientConnection("app")
    cid, _ = conn.logon({"pw": "wrong"})
    events = conn.receive_data(
        server.ack("processed", "failure", cid=cid, reason="not entitled", s=9), 1.0
    )
    assert not only(events, LoggedOn)
    (done,) = only(events, CommandDone)
    assert done.failure is not None and done.failure["reason"] == "not entitled"
    assert (conn.seq, conn.persisted_seq, conn.logon_ack) == (0, 0, {})


# ------------------------------------------------------------------------ commands
def test_a_command_waits_for_the_ack_types_it_names() -> None:
    conn = ClientConnection("app")
    cid, _ = conn.command({"c": "sow", "t": "t"}, want=("completed", "stats"))
    assert not conn.receive_data(server.ack("processed", cid=cid), 1)
    assert not conn.receive_data(server.ack("stats", cid=cid), 1)
    (done,) = conn.receive_data(server.ack("completed", cid=cid), 1)
    assert isinstance(done, CommandDone) and done.complete
    assert [ack["a"] for ack in done.acks] == ["processed", "stats", "completed"]
    assert cid not in conn.waiting
    assert not conn.receive_data(server.ack("completed", cid=cid), 1)  # resolved once


def test_a_failure_ack_ends_the_wait_at_once() -> None:
    conn = ClientConnection("app")
    cid, _ = conn.command({"c": "subscribe"}, want=2)
    (done,) = conn.receive_data(server.ack("processed", "failure", cid=cid, reason="bad"), 1)
    assert done.failure["reason"] == "bad"


def test_an_abandoned_command_drops_its_late_acks() -> None:
    conn = ClientConnection("app")
    cid, _ = conn.command({"c": "flush", "a": "persisted"})
    conn.abandon(cid)
    assert not conn.receive_data(server.ack("persisted", cid=cid), 1)


def test_closing_ends_every_wait_incomplete() -> None:
    conn = ClientConnection("app")
    first, _ = conn.command({"c": "flush"})
    second, _ = conn.command({"c": "sow"}, want=("completed", "stats"))
    conn.receive_data(server.ack("stats", cid=second), 1)
    done = {event.cid: event for event in conn.close()}
    assert set(done) == {first, second}
    assert not done[first].complete and not done[second].complete
    assert [ack["a"] for ack in done[second].acks] == ["stats"]


def test_a_tracked_command_reports_its_one_answer() -> None:
    conn = ClientConnection("app")
    cid = conn.next_cid()
    conn.track(cid)
    (event,) = conn.receive_data(server.ack("processed", cid=cid), 1)
    assert event == TrackedAck(cid, event.ack)
    assert not conn.receive_data(server.ack("processed", cid=cid), 1)


# ------------------------------------------------------------------------ publishing
def test_publishes_are_numbered_and_a_given_seq_moves_the_sequence_on() -> None:
    conn = ClientConnection("app")
    assert conn.publish("p", "t", b"a")[0] == 1
    assert conn.publish("p", "t", b"b", seq=10)[0] == 10
    assert conn.publish("p", "t", b"c", seq=5)[0] == 5
    seq, data = conn.publish("delta_publish", "t", b"d", ack=False, sow_key="k")
    header = sent(data)
    assert seq == 11 and header["c"] == "delta_publish" and "a" not in header
    assert header["k"] == "k"


def test_persisted_acks_only_move_forward() -> None:
    conn = ClientConnection("app")
    assert conn.receive_data(server.persisted_ack(5, 1), 1) == [Persisted(5, False)]
    assert conn.receive_data(server.persisted_ack(3, 1), 1) == []
    assert conn.persisted_seq == 5
    events = conn.receive_data(server.persisted_ack(6, 1, server.NOT_JOURNALED), 1)
    assert events == [Persisted(6, True)] and conn.not_journaled_seq == 6


def test_a_failed_publish_is_recorded_until_it_is_sent_again() -> None:
    conn = ClientConnection("app")
    (event,) = conn.receive_data(server.publish_failed(3, "journal write failed", "full"), 1)
    assert isinstance(event, PublishFailed) and event.seq == 3
    assert conn.failed_publishes[3]["reason"] == "journal write failed"
    conn.publish("p", "t", b"again", seq=3)
    assert 3 not in conn.failed_publishes


# ------------------------------------------------------------------------ routing
def test_deliveries_name_their_subscriptions() -> None:
    conn = ClientConnection("app")
    one = encode_frame({"c": "p", "t": "t", "sub_id": "s1"}, b"x")
    many = encode_frame({"c": "p", "t": "t", "sub_id": "s1", "sids": "s1,s2"}, b"y")
    first, second = conn.receive_data(one + many, 1)
    assert isinstance(first, Delivery) and first.sub_ids == ["s1"]
    assert isinstance(second, Delivery) and second.sub_ids == ["s1", "s2"]
    assert second.frame.payload == b"y"


def test_query_frames_go_out_as_they_are() -> None:
    conn = ClientConnection("app")
    data = server.group_begin("q1") + server.sow_batch("t", "q1", []) + server.group_end("q1")
    events = conn.receive_data(data, 1)
    assert [e.frame.command for e in only(events, QueryFrame)] == [
        "group_begin",
        "sow",
        "group_end",
    ]


def test_acks_for_routed_subscriptions_by_sub_id_or_query_id() -> None:
    conn = ClientConnection("app")
    conn.add_route("s1")
    by_sub = conn.receive_data(server.subscription_persisted("s1", "1|2|"), 1)
    assert by_sub == [SubscriptionAck("s1", by_sub[0].ack)]
    by_query = conn.receive_data(server.ack("stats", query_id="s1", matches=2), 1)
    assert [type(e) for e in by_query] == [SubscriptionAck]
    conn.drop_route("s1")
    assert not conn.receive_data(server.subscription_persisted("s1", "1|3|"), 1)


def test_a_failure_naming_nothing_is_a_notice_and_closing_reports_it() -> None:
    conn = ClientConnection("app")
    (notice,) = conn.receive_data(
        server.ack("process", "failure", reason="slow client", detail="behind"), 1
    )
    assert isinstance(notice, ServerNotice)
    (closed,) = conn.receive_data(b"", 2)
    assert isinstance(closed, ServerClosed)
    assert closed.message == "server closed the connection: slow client (behind)"


def test_frames_split_across_reads_are_reassembled() -> None:
    conn = ClientConnection("app")
    data = server.persisted_ack(7, 1)
    assert conn.receive_data(data[:3], 1) == []
    assert conn.receive_data(data[3:], 2) == [Persisted(7, False)]


def test_a_malformed_frame_raises() -> None:
    conn = ClientConnection("app")
    with pytest.raises(ProtocolError):
        conn.receive_data(b"\x00\x00\x00\x05nope!", 1)


# ------------------------------------------------------------------------ heartbeats
def test_each_server_heartbeat_is_answered_with_a_beat() -> None:
    conn = ClientConnection("app")
    events = conn.receive_data(server.HEARTBEAT * 2, 1)
    assert events == [HeartbeatReceived(BEAT)] * 2 and conn.heartbeats == 2
    assert sent(BEAT) == {"c": "heartbeat", "o": "beat"}


def test_a_silent_server_is_reported_once_at_its_limit_and_bytes_rearm_it() -> None:
    conn = ClientConnection("app", now=100.0)
    assert conn.tick(1000.0) == [] and conn.silence_deadline is None  # not watched
    conn.watch_silence(2.0)
    assert conn.silence_deadline == 102.0
    assert conn.tick(101.9) == []
    assert conn.tick(102.0) == [ServerSilent(2.0, 2.0)]
    assert conn.tick(103.0) == []  # reported already
    conn.receive_data(server.HEARTBEAT, 103.5)
    assert conn.tick(105.4) == []
    assert conn.tick(105.5) == [ServerSilent(2.0, 2.0)]


# ------------------------------------------------------------------------ stateful
class ClientConnectionMachine(RuleBasedStateMachine):
    """Arbitrary commands, acks, publishes, heartbeats and time against one
    connection; a model of what it must report."""

    @initialize(limit=st.sampled_from([0.5, 1.0, 2.0]))
    def start(self, limit: float) -> None:
        self.now = 0.0
        self.conn = ClientConnection("model", now=self.now)
        self.limit = limit
        self.conn.watch_silence(limit)
        self.received_at = 0.0
        self.silent_reported = False
        self.issued: dict[str, Any] = {}  # cid -> what it waits for
        self.resolved: set[str] = set()
        self.tracked: set[str] = set()
        self.last_persisted = 0
        self.heartbeats_in = 0
        self.beats_out = 0
        self.routes: set[str] = set()

    # -------------------------------------------------------------- feeding
    def feed(self, data: bytes, *, split: int = 0) -> list[Any]:
        events: list[Any] = []
        cut = min(split, len(data))
        for piece in (data[:cut], data[cut:]) if cut else (data,):
            events += self.conn.receive_data(piece, self.now)
        self.received_at = self.now
        self.silent_reported = False
        for event in events:
            if isinstance(event, CommandDone):
                assert event.cid in self.issued, "a command that was never sent"
                assert event.cid not in self.resolved, "a command resolved twice"
                self.resolved.add(event.cid)
            elif isinstance(event, TrackedAck):
                assert event.cid in self.tracked
                self.tracked.discard(event.cid)
            elif isinstance(event, HeartbeatReceived):
                self.beats_out += 1
            elif isinstance(event, SubscriptionAck):
                assert event.sub_id in self.routes
        return events

    # -------------------------------------------------------------- rules
    @rule(want=st.one_of(st.integers(1, 3), st.sets(st.sampled_from(["processed", "stats"]))))
    def send_command(self, want: Any) -> None:
        cid, data = self.conn.command({"c": "sow", "t": "t"}, want=want or 1)
        assert sent(data)["cid"] == cid and cid not in self.issued
        self.issued[cid] = want

    @rule()
    def track_one(self) -> None:
        cid = self.conn.next_cid()
        self.conn.track(cid)
        self.tracked.add(cid)

    @precondition(lambda self: self.issued or self.tracked)
    @rule(
        data=st.data(),
        kind=st.sampled_from(["processed", "stats", "completed"]),
        failure=st.booleans(),
        split=st.integers(0, 40),
    )
    def ack_a_command(self, data: Any, kind: str, failure: bool, split: int) -> None:
        cid = data.draw(st.sampled_from(sorted(set(self.issued) | self.tracked)))
        status = "failure" if failure else "success"
        self.feed(server.ack(kind, status, cid=cid, reason="r"), split=split)

    @rule(cid=st.integers(1, 50))
    def abandon(self, cid: int) -> None:
        self.conn.abandon(str(cid))
        if str(cid) in self.issued:
            self.resolved.add(str(cid))  # given up on: never reported after this

    @rule(seq=st.integers(0, 40), failure=st.booleans(), split=st.integers(0, 30))
    def persisted(self, seq: int, failure: bool, split: int) -> None:
        data = server.publish_failed(seq, "r", "d") if failure else server.persisted_ack(seq, 1)
        events = self.feed(data, split=split)
        if failure:
            assert seq in self.conn.failed_publishes
        elif seq > self.last_persisted:
            assert events == [Persisted(seq, False)]
        else:
            assert events == []

    @rule(seq=st.one_of(st.none(), st.integers(1, 40)))
    def publish(self, seq: int | None) -> None:
        before = self.conn.seq
        got, data = self.conn.publish("p", "t", b"{}", seq=seq)
        assert sent(data)["s"] == got
        assert got == (before + 1 if seq is None else seq)
        assert self.conn.seq == max(before, got) and got not in self.conn.failed_publishes

    @rule(sub_id=st.sampled_from(["s1", "s2"]), add=st.booleans())
    def route(self, sub_id: str, add: bool) -> None:
        if add:
            self.conn.add_route(sub_id)
            self.routes.add(sub_id)
        else:
            self.conn.drop_route(sub_id)
            self.routes.discard(sub_id)

    @rule(sub_id=st.sampled_from(["s1", "s2", "s3"]))
    def subscription_ack(self, sub_id: str) -> None:
        events = self.feed(server.subscription_persisted(sub_id, "1|1|"))
        assert len(only(events, SubscriptionAck)) == (sub_id in self.routes)

    @rule(count=st.integers(1, 3))
    def heartbeat(self, count: int) -> None:
        self.heartbeats_in += count
        self.feed(server.HEARTBEAT * count, split=5)

    @rule(step=st.sampled_from([0.0, 0.1, 0.25, 0.5, 1.0, 3.0]))
    def advance(self, step: float) -> None:
        self.now += step

    @rule()
    def tick(self) -> None:
        events = self.conn.tick(self.now)
        due = self.now >= self.received_at + self.limit and not self.silent_reported
        assert events == ([ServerSilent(self.now - self.received_at, self.limit)] if due else [])
        if due:
            self.silent_reported = True

    # -------------------------------------------------------------- invariants
    @invariant()
    def persisted_seq_never_goes_backwards(self) -> None:
        assert self.conn.persisted_seq >= self.last_persisted
        self.last_persisted = self.conn.persisted_seq

    @invariant()
    def waiting_is_what_was_sent_and_not_resolved(self) -> None:
        assert set(self.conn.waiting) == set(self.issued) - self.resolved

    @invariant()
    def every_heartbeat_is_answered(self) -> None:
        assert self.conn.heartbeats == self.heartbeats_in == self.beats_out

    @invariant()
    def silence_deadline_follows_the_last_bytes(self) -> None:
        assert self.conn.silence_deadline == self.received_at + self.limit


ClientConnectionMachine.TestCase.settings = settings(
    derandomize=True,
    max_examples=150,
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
test_client_connection_state_machine = ClientConnectionMachine.TestCase
