"""The pure queue core (amps_py.queue): which subscription gets which message, and when
a message leaves the queue.

What a user relies on: a message is held by at most one subscriber at a time and is
acked, expired, or still in the queue (never lost, never duplicated); backlogs are
respected; leases that end without an ack (timeout, cancel, unsubscribe, disconnect)
return the message for redelivery until MaxDeliveries/MaxCancels/Expiration expire it;
strict leasing refuses acks from other connections; barrier messages wait for
everything before them; only the owner delivers.
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import given, seed, settings
from hypothesis import strategies as st

from amps_py.queue import QueueMessage, QueuePolicy, QueueState, QueueSub

ME = "A"
PEER = "B"


# ---------------------------------------------------------------- helpers


def msg(
    txid: int,
    *,
    owner: str = ME,
    priority: int = 0,
    barrier: bool = False,
    published_at: float = 0.0,
) -> QueueMessage:
    return QueueMessage(
        txid=txid,
        bookmark=f"bm{txid}",
        payload=b"p%d" % txid,
        correlation_id="",
        published_at=published_at,
        owner=owner,
        priority=priority,
        barrier=barrier,
    )


def queue(
    n: int = 0,
    matches: Callable[[QueueSub, QueueMessage], bool] | None = None,
    **policy: object,
) -> QueueState:
    state = QueueState(QueuePolicy(**policy), ME, matches)
    for txid in range(1, n + 1):
        state.add(msg(txid))
    return state


def sub(state: QueueState, conn: int, backlog: int = 1, name: str = "s", context: object = None):
    s = QueueSub((conn, name), requested_backlog=backlog, context=context)
    state.subscribe(s)
    return s


def deliveries(state: QueueState, now: float = 0.0) -> list[tuple[int, str]]:
    """assign, as (connection, bookmark) pairs."""
    return [(s.key[0], m.bookmark) for s, m in state.assign(now)]


def by_context(s: QueueSub, m: QueueMessage) -> bool:
    """A test filter: the subscription's context is a set of txid parities (or None)."""
    return s.context is None or m.txid % 2 in s.context


# ---------------------------------------------------------------- policy and subscribe


def test_bad_policy_values_are_refused_naming_the_field() -> None:
    with pytest.raises(ValueError, match="semantics"):
        QueuePolicy(semantics="exactly-once")
    with pytest.raises(ValueError, match="fairness"):
        QueuePolicy(fairness="random")
    with pytest.raises(ValueError, match="max_per_subscription_backlog"):
        QueuePolicy(max_per_subscription_backlog=0)
    with pytest.raises(ValueError, match="lease_period"):
        QueuePolicy(lease_period=0)
    with pytest.raises(ValueError, match="max_deliveries"):
        QueuePolicy(max_deliveries=-1)


def test_subscribe_returns_the_effective_backlog_and_replacing_keeps_leases() -> None:
    state = queue(3, max_per_subscription_backlog=2)
    assert state.subscribe(QueueSub((1, "s"), requested_backlog=10)) == 2
    assert state.subscribe(QueueSub((2, "s"))) == 1  # the AMPS default max_backlog is 1
    with pytest.raises(ValueError, match="max_backlog must be at least 1"):
        state.subscribe(QueueSub((3, "s"), requested_backlog=0))
    assert sorted(deliveries(state)) == [(1, "bm1"), (1, "bm3"), (2, "bm2")]
    replacement = QueueSub((1, "s"), requested_backlog=1)
    assert state.subscribe(replacement) == 1
    assert list(replacement.leased) == ["bm1", "bm3"]
    assert state.ack(["bm1"], 1, "", 0).acked[0].bookmark == "bm1"
    assert deliveries(state) == []  # still holds bm3 with a backlog of 1


# ---------------------------------------------------------------- at-least-once delivery


def test_each_message_goes_to_one_subscriber_oldest_first_within_backlog() -> None:
    state = queue(4, fairness="round-robin")
    sub(state, 1)
    sub(state, 2)
    assert deliveries(state) == [(1, "bm1"), (2, "bm2")]
    assert deliveries(state) == []  # both backlogs full
    state.ack(["bm2"], 2, "", 0)
    assert deliveries(state) == [(2, "bm3")]
    assert state.statistics().leased == 2


def test_higher_priority_is_delivered_first_then_txid() -> None:
    state = queue(max_per_subscription_backlog=10)
    for txid, priority in ((1, 0), (2, 5), (3, 1), (4, 5)):
        state.add(msg(txid, priority=priority))
    sub(state, 1, backlog=10)
    assert [b for _, b in deliveries(state)] == ["bm2", "bm4", "bm3", "bm1"]


def test_max_backlog_caps_leased_messages_on_the_instance() -> None:
    state = queue(10, max_backlog=3, max_per_subscription_backlog=5)
    sub(state, 1, backlog=5)
    sub(state, 2, backlog=5)
    assert len(deliveries(state)) == 3
    state.ack(["bm1"], None, "", 0)
    assert len(deliveries(state)) == 1
    assert state.statistics().leased == 3 and state.statistics().backlog_capacity == 3


def test_a_message_only_goes_to_a_subscription_that_matches_and_does_not_block_others() -> None:
    state = queue(4, matches=by_context, max_per_subscription_backlog=5)
    sub(state, 1, backlog=5, context={0})  # even txids only
    assert deliveries(state) == [(1, "bm2"), (1, "bm4")]
    sub(state, 2, backlog=5, context={1})
    assert deliveries(state) == [(2, "bm1"), (2, "bm3")]


# ---------------------------------------------------------------- fairness models


def test_fast_fills_the_first_subscription_first() -> None:
    state = queue(5, fairness="fast", max_per_subscription_backlog=3)
    sub(state, 1, backlog=3)
    sub(state, 2, backlog=3)
    assert deliveries(state) == [(1, "bm1"), (1, "bm2"), (1, "bm3"), (2, "bm4"), (2, "bm5")]


def test_round_robin_rotates_among_subscriptions() -> None:
    state = queue(5, fairness="round-robin", max_per_subscription_backlog=3)
    for conn in (1, 2, 3):
        sub(state, conn, backlog=3)
    assert [c for c, _ in deliveries(state)] == [1, 2, 3, 1, 2]
    state.add(msg(6))
    assert deliveries(state) == [(3, "bm6")]  # the rotation carries on across calls


def test_proportional_picks_the_most_free_backlog_ties_by_rotation() -> None:
    state = queue(6, fairness="proportional", max_per_subscription_backlog=4)
    sub(state, 1, backlog=4)
    sub(state, 2, backlog=2)
    # free 4/2 -> 1; 3/2 -> 1; 2/2 tie -> 2 (rotation after 1); 2/1 -> 1; 1/1 tie -> 2; 1/0 -> 1
    assert [c for c, _ in deliveries(state)] == [1, 1, 2, 1, 2, 1]


def test_at_most_once_is_always_round_robin() -> None:
    state = queue(4, semantics="at-most-once", fairness="fast")
    sub(state, 1)
    sub(state, 2)
    assert [c for c, _ in deliveries(state)] == [1, 2, 1, 2]


# ---------------------------------------------------------------- at-most-once


def test_at_most_once_removes_on_send_and_never_redelivers() -> None:
    state = queue(3, semantics="at-most-once", lease_period=1.0)
    sub(state, 1)
    assert [b for _, b in deliveries(state)] == ["bm1", "bm2", "bm3"]  # no backlog
    assert len(state) == 0 and state.statistics().leased == 0
    assert state.unsubscribe((1, "s"), 5.0).returned == []
    assert state.expire_leases(100.0).returned == []
    state.add(msg(4))
    result = state.ack(["bm4"], 1, "cancel", 0)
    assert result.refused == ["bm4"] and "bm4" in state  # cancel has no effect
    assert state.ack(["bm4"], 1, "expire", 0).refused == ["bm4"]


# ---------------------------------------------------------------- acks and leasing


def test_acks_report_unknown_bookmarks_without_raising() -> None:
    state = queue(2)
    sub(state, 1)
    deliveries(state)
    result = state.ack(["bm1", "nope", "bm1"], 1, "", 0)
    assert [m.bookmark for m in result.acked] == ["bm1"] and result.unknown == ["nope"]
    assert state.ack(["bm1"], 1, "", 0).unknown == ["bm1"]
    with pytest.raises(ValueError, match="cancel"):
        state.ack(["bm2"], 1, "later", 0)


def test_strict_leasing_refuses_acks_from_another_connection() -> None:
    state = queue(3, leasing="strict")
    sub(state, 1)
    deliveries(state)  # bm1 leased to connection 1
    result = state.ack(["bm1", "bm2"], 2, "", 0)
    assert result.refused == ["bm1"]  # leased to connection 1
    assert [m.bookmark for m in result.acked] == ["bm2"]  # not leased: anyone may
    assert state.ack(["bm1"], None, "expire", 0).refused == ["bm1"]
    assert [m.bookmark for m in state.ack(["bm1"], 1, "", 0).acked] == ["bm1"]


def test_sublet_leasing_lets_anyone_ack() -> None:
    state = queue(1, leasing="sublet")
    sub(state, 1)
    deliveries(state)
    assert [m.bookmark for m in state.ack(["bm1"], 2, "", 0).acked] == ["bm1"]
    assert state.statistics().leased == 0


def test_ack_matching_acks_by_filter_subject_to_leasing() -> None:
    state = queue(4, leasing="strict")
    sub(state, 1)
    deliveries(state)  # bm1 leased to connection 1
    result = state.ack_matching(lambda m: m.txid <= 3, 2, 0)
    assert result.refused == ["bm1"]
    assert [m.bookmark for m in result.acked] == ["bm2", "bm3"]
    assert [m.bookmark for m in state.messages()] == ["bm1", "bm4"]


def test_cancel_returns_a_message_and_max_cancels_expires_it() -> None:
    state = queue(1, max_cancels=2)
    sub(state, 1)
    deliveries(state)
    result = state.ack(["bm1"], 1, "cancel", 0)
    assert [m.bookmark for m in result.cancelled] == ["bm1"]
    assert deliveries(state) == [(1, "bm1")]  # redelivered
    result = state.ack(["bm1"], 1, "cancel", 0)
    assert [m.bookmark for m in result.expired] == ["bm1"] and len(state) == 0
    assert state.statistics().cancelled == 1 and state.statistics().expired == 1


def test_cancel_of_a_message_nobody_holds_is_refused() -> None:
    state = queue(1)
    assert state.ack(["bm1"], 1, "cancel", 0).refused == ["bm1"]
    assert state.get("bm1") is not None and state.get("bm1").cancels == 0


def test_expire_option_expires_now() -> None:
    state = queue(2)
    sub(state, 1)
    deliveries(state)
    result = state.ack(["bm1", "bm2"], 1, "expire", 0)
    assert [m.bookmark for m in result.expired] == ["bm1", "bm2"] and len(state) == 0
    assert sub(state, 2).leased_count == 0


# ---------------------------------------------------------------- returns and expiry


def test_lease_expiry_returns_the_message_for_redelivery_with_a_higher_count() -> None:
    state = queue(1, lease_period=30.0)
    sub(state, 1)
    assert deliveries(state, now=100.0) == [(1, "bm1")]
    assert state.next_deadline() == 130.0
    assert state.expire_leases(129.9).returned == []
    returned = state.expire_leases(130.0).returned
    assert [m.bookmark for m in returned] == ["bm1"]
    state.unsubscribe((1, "s"), 130.0)
    sub(state, 2)
    [(s, m)] = state.assign(131.0)
    assert s.key == (2, "s") and m.deliveries == 2
    assert state.statistics().lease_timeouts == 1 and state.statistics().returned == 1


def test_an_acked_message_has_no_lease_deadline_left() -> None:
    state = queue(1, lease_period=30.0)
    sub(state, 1)
    deliveries(state)
    state.ack(["bm1"], 1, "", 0)
    assert state.next_deadline() is None
    assert state.expire_leases(1000.0).returned == []


def test_max_deliveries_expires_instead_of_returning() -> None:
    state = queue(1, lease_period=1.0, max_deliveries=2)
    sub(state, 1)
    now = 0.0
    for expected_returned in (1, 0):
        assert len(state.assign(now)) == 1
        now += 1.0
        result = state.expire_leases(now)
        assert len(result.returned) == expected_returned
    assert [m.bookmark for m in result.expired] == ["bm1"] and len(state) == 0


def test_max_deliveries_also_applies_when_a_subscriber_leaves() -> None:
    state = queue(1, max_deliveries=1)
    sub(state, 1)
    deliveries(state)
    result = state.unsubscribe((1, "s"), 0)
    assert result.returned == [] and [m.bookmark for m in result.expired] == ["bm1"]


def test_unsubscribe_and_disconnect_return_leases() -> None:
    state = queue(3, max_per_subscription_backlog=3)
    sub(state, 1, backlog=2, name="a")
    sub(state, 2, backlog=1, name="b")
    assert len(deliveries(state)) == 3
    assert [m.bookmark for m in state.disconnect(1, 5.0).returned] == ["bm1", "bm3"]
    assert state.unsubscribe((9, "x"), 5.0).returned == []  # unknown: nothing
    sub(state, 3, backlog=3)
    assert deliveries(state) == [(3, "bm1"), (3, "bm3")]
    assert [m.bookmark for m in state.unsubscribe((2, "b"), 6.0).returned] == ["bm2"]


def test_messages_expire_from_their_publish_time() -> None:
    state = queue(expiration=60.0)
    state.add(msg(1, published_at=1000.0))
    state.add(msg(2, published_at=1010.0))
    sub(state, 1)
    deliveries(state, now=1001.0)  # bm1 leased: it expires all the same
    assert state.next_deadline() == 1060.0
    assert state.expire_messages(1059.0) == []
    assert [m.bookmark for m in state.expire_messages(1060.0)] == ["bm1"]
    assert sub(state, 1).leased_count == 0 and state.next_deadline() == 1070.0
    assert [m.bookmark for m in state.expire_messages(2000.0)] == ["bm2"]
    assert state.next_deadline() is None and state.statistics().expired == 2


def test_a_cancel_past_expiration_expires() -> None:
    state = queue(expiration=10.0)
    state.add(msg(1, published_at=0.0))
    sub(state, 1)
    deliveries(state, now=1.0)
    assert [m.bookmark for m in state.ack(["bm1"], 1, "cancel", 11.0).expired] == ["bm1"]


# ---------------------------------------------------------------- barriers


def test_barrier_waits_for_earlier_messages_then_goes_to_every_subscriber() -> None:
    state = queue(max_per_subscription_backlog=1)
    state.add(msg(1))
    state.add(msg(2, barrier=True))
    state.add(msg(3))
    sub(state, 1)
    sub(state, 2)
    assert deliveries(state) == [(1, "bm1")]  # bm3 waits behind the barrier
    state.ack(["bm1"], 1, "", 0)
    # to both, whatever their backlog, then bm3 in the same pass
    out = deliveries(state)
    assert out[:2] == [(1, "bm2"), (2, "bm2")] and out[2:] == [(2, "bm3")]
    assert "bm2" not in state


def test_barrier_is_delivered_by_every_instance_regardless_of_ownership() -> None:
    state = queue()
    state.add(msg(1, owner=PEER))
    state.add(msg(2, owner=PEER, barrier=True))
    sub(state, 1, backlog=1)
    assert deliveries(state) == []  # bm1 is the peer's to deliver; the barrier waits
    state.apply_removed(["bm1"])  # the peer's subscriber acked it
    assert deliveries(state) == [(1, "bm2")]


def test_a_barrier_only_goes_to_matching_subscribers_and_waits_for_one() -> None:
    state = queue(matches=by_context)
    state.add(msg(1, barrier=True))
    sub(state, 1, context={0})
    assert deliveries(state) == []
    sub(state, 2, context={1})
    assert deliveries(state) == [(2, "bm1")]


# ---------------------------------------------------------------- ownership


def test_only_owned_messages_are_delivered_and_a_transfer_makes_them_deliverable() -> None:
    state = queue(max_per_subscription_backlog=5)
    state.add(msg(1, owner=PEER))
    state.add(msg(2))
    sub(state, 1, backlog=5)
    assert deliveries(state) == [(1, "bm2")]
    assert state.statistics().owned == 1
    assert state.transfer("bm1", ME)
    assert deliveries(state) == [(1, "bm1")]
    stats = state.statistics()
    assert stats.owned == 2 and stats.transferred_in == 1
    assert not state.transfer("gone", ME)


def test_a_message_transferred_away_is_no_longer_delivered_here() -> None:
    state = queue(2, lease_period=5.0)
    state.transfer("bm2", PEER)
    s = sub(state, 1, backlog=1)
    assert deliveries(state) == [(1, "bm1")]
    # leased here, then granted away (proxied transfer): the lease stands ...
    state.transfer("bm1", PEER)
    assert s.leased_count == 1
    # ... and once it times out the message waits for its new owner
    assert [m.bookmark for m in state.expire_leases(5.0).returned] == ["bm1"]
    assert deliveries(state, 6.0) == []
    assert state.statistics().transferred_out == 2 and state.statistics().owned == 0


def test_a_local_queue_owns_every_message() -> None:
    state = queue(kind="local")
    state.add(msg(1, owner=PEER))
    sub(state, 1)
    assert deliveries(state) == [(1, "bm1")]


def test_a_replicated_ack_removes_a_leased_message_and_frees_the_backlog() -> None:
    state = queue(2)
    s = sub(state, 1)
    deliveries(state)
    removed = state.apply_removed(["bm1", "unknown"])
    assert [m.bookmark for m in removed] == ["bm1"] and s.leased_count == 0
    assert deliveries(state) == [(1, "bm2")]
    assert state.statistics().removed_by_peer == 1


def test_grant_and_request_helpers() -> None:
    state = queue(matches=by_context)
    state.add(msg(1))  # ours
    state.add(msg(2, owner=PEER), now=100.0)
    state.add(msg(3, owner=PEER), now=100.0)
    assert state.may_grant("bm1")  # nobody here can take it
    assert not state.may_grant("bm2")  # not ours to grant
    sub(state, 1, context={1})
    assert not state.may_grant("bm1")  # a local subscriber can take it
    deliveries(state)
    assert not state.may_grant("bm1")  # leased here
    sub(state, 2, context={0})
    # bm2 matches connection 2, which has room; bm3 matches only the full connection 1
    assert state.transfer_candidates(now=101.0, min_wait=5.0) == []  # not waited long
    assert [m.bookmark for m in state.transfer_candidates(now=106.0, min_wait=5.0)] == ["bm2"]
    assert queue(kind="local").transfer_candidates(now=1e9, min_wait=0) == []


def test_messages_must_be_added_once_in_journal_order() -> None:
    state = queue(2)
    with pytest.raises(ValueError, match="journal order"):
        state.add(msg(1))
    with pytest.raises(ValueError, match="already in the queue"):
        state.add(QueueMessage(txid=9, bookmark="bm1", payload=b""))


# ---------------------------------------------------------------- random interleavings

SEED = 15_0001
_seed_printed: list[bool] = []

POLICIES = st.builds(
    QueuePolicy,
    semantics=st.sampled_from(["at-least-once", "at-least-once", "at-most-once"]),
    lease_period=st.sampled_from([None, 2.0, 5.0]),
    max_backlog=st.sampled_from([None, 1, 3]),
    max_per_subscription_backlog=st.integers(1, 3),
    expiration=st.sampled_from([None, None, 8.0]),
    max_deliveries=st.integers(0, 3),
    max_cancels=st.integers(0, 2),
    leasing=st.sampled_from(["sublet", "strict"]),
    fairness=st.sampled_from(["proportional", "round-robin", "fast"]),
    kind=st.sampled_from(["distributed", "group-local", "local"]),
)
#: operation names, repeated to weigh them; each op carries three numbers its branch
#: reads modulo what it needs (so the mix stays even, whatever hypothesis draws)
OP_NAMES = (
    ["add"] * 4
    + ["assign"] * 3
    + ["ack"] * 3
    + ["tick"] * 2
    + ["subscribe", "unsubscribe", "disconnect", "ack_matching", "transfer", "peer_removed"]
)
ARG = st.integers(0, 1000)
OPS = st.lists(st.tuples(st.sampled_from(OP_NAMES), ARG, ARG, ARG), min_size=20, max_size=120)
#: what a subscription's context means to the test filter: None (all), even, odd txids
FILTERS: tuple[frozenset[int] | None, ...] = (None, frozenset({0}), frozenset({1}))


def _check_invariants(state: QueueState) -> None:
    """Leases are consistent: each leased message is held by exactly one live
    subscription, which lists it; counts add up."""
    subs = {s.key: s for s in state.subscriptions()}
    held: dict[str, tuple[int, str]] = {}
    for s in subs.values():
        for bookmark in s.leased:
            assert bookmark not in held, f"{bookmark} leased to {held[bookmark]} and {s.key}"
            held[bookmark] = s.key
    leased = {m.bookmark: m.lease.sub for m in state.messages() if m.lease is not None}
    assert leased == held
    stats = state.statistics()
    assert stats.leased == len(leased) and stats.depth == len(state)
    assert stats.owned == sum(1 for m in state.messages() if state.owns(m))
    if not state.policy.at_least_once:
        assert not leased


@seed(SEED)
@settings(max_examples=600, deadline=None, database=None)
@given(policy=POLICIES, ops=OPS)
def test_random_interleavings_never_lose_or_duplicate_a_message(
    policy: QueuePolicy, ops: list[tuple[str, int, int, int]]
) -> None:
    """Whatever the interleaving of publishes, subscribers coming and going, acks with
    every option, filters, lease timeouts, expiries, ownership transfers and replicated
    acks: no message is leased to two subscriptions at once, none goes over a backlog,
    barriers keep their order, only owned messages (and barriers) are delivered, and
    every message added ends exactly one way (acked, expired, sent at-most-once,
    barrier delivered, removed by a peer) or is still in the queue; at the end a
    subscriber that takes everything drains the queue."""
    if not _seed_printed:
        _seed_printed.append(True)
        print(f"hypothesis seed {SEED}")
    state = QueueState(policy, ME, by_context)
    fate: dict[str, str] = {}  # bookmark -> how it left the queue
    added: list[str] = []
    ever_sent_once: set[str] = set()  # at-most-once and barrier sends
    now = 0.0
    txid = 0

    def settle(how: str, bookmarks: list[str]) -> None:
        for bookmark in bookmarks:
            assert bookmark not in fate, (
                f"{bookmark} left the queue twice ({fate[bookmark]}, {how})"
            )
            assert bookmark not in state
            fate[bookmark] = how

    def do_assign() -> None:
        before = {s.key: s.leased_count for s in state.subscriptions()}
        leased_before = state.statistics().leased
        out = state.assign(now)
        barrier_at: dict[int, int] = {}  # barrier txid -> first position in out
        for position, (_, m) in enumerate(out):
            if m.barrier:
                barrier_at.setdefault(m.txid, position)
        for position, (s, m) in enumerate(out):
            # barrier order: nothing older is left, nothing newer went before it
            for other in state.messages():
                if m.barrier:
                    assert other.txid > m.txid, f"barrier {m.txid} passed {other.txid}"
                elif other.barrier:
                    assert other.txid > m.txid, f"{m.txid} passed barrier {other.txid}"
            if m.barrier:
                continue
            for barrier_txid, barrier_position in barrier_at.items():
                if barrier_txid < m.txid:
                    assert barrier_position < position, f"{m.txid} sent before its barrier"
                else:
                    assert position < barrier_position, f"barrier sent before {m.txid}"
            assert state.owns(m), f"delivered {m.bookmark} owned by {m.owner}"
            if policy.max_deliveries:
                assert m.deliveries <= policy.max_deliveries, "delivered past MaxDeliveries"
            assert by_context(s, m)
            if policy.at_least_once:
                assert m.lease is not None and m.lease.sub == s.key
            else:
                assert m.bookmark not in ever_sent_once
                ever_sent_once.add(m.bookmark)
        if policy.at_least_once:
            for s in state.subscriptions():
                gained = s.leased_count - before.get(s.key, 0)
                assert gained <= 0 or s.leased_count <= s.backlog, f"{s.key} over its backlog"
            if policy.max_backlog is not None and state.statistics().leased > leased_before:
                assert state.statistics().leased <= policy.max_backlog
        barriers = {m.bookmark for _, m in out if m.barrier}
        amo = {m.bookmark for _, m in out if not m.barrier and not policy.at_least_once}
        settle("barrier", sorted(barriers))
        settle("sent at-most-once", sorted(amo))

    for op, a, b, c in [("subscribe", 0, 0, 0), *ops]:
        conn = a % 3 + 1
        if op == "add":
            txid += 1
            owner = (ME, ME, PEER)[a % 3]
            state.add(msg(txid, owner=owner, priority=b % 3, barrier=c % 5 == 0), now)
            added.append(f"bm{txid}")
        elif op == "subscribe":
            context = FILTERS[(0, 0, 1, 2)[c % 4]]
            state.subscribe(QueueSub((conn, "s"), requested_backlog=b % 4 + 1, context=context))
        elif op == "unsubscribe":
            result = state.unsubscribe((conn, "s"), now)
            settle("expired", [m.bookmark for m in result.expired])
        elif op == "disconnect":
            result = state.disconnect(conn, now)
            settle("expired", [m.bookmark for m in result.expired])
        elif op == "assign":
            do_assign()
        elif op == "ack":
            # two messages from the queue (leased ones when there are), one unknown
            present = [m.bookmark for m in state.messages()]
            held = [m.bookmark for m in state.messages() if m.lease is not None]
            pool = held or (present if a % 4 == 0 else [])
            names = [pool[(a + i * 7) % len(pool)] for i in range(2)] if pool else []
            names.append(f"bm{a}")
            holders = {m.bookmark: m.lease.sub[0] for m in state.messages() if m.lease}
            ack = state.ack(names, conn := c % 3 + 1, ("", "", "cancel", "expire")[b % 4], now)
            settle("acked", [m.bookmark for m in ack.acked])
            settle("expired", [m.bookmark for m in ack.expired])
            for m in ack.cancelled:
                assert m.bookmark in state and m.lease is None
                if policy.max_cancels:
                    assert m.cancels < policy.max_cancels, "returned past MaxCancels"
            if policy.leasing == "strict":
                changed = [*ack.acked, *ack.expired, *ack.cancelled]
                assert all(holders.get(m.bookmark, conn) == conn for m in changed)
                assert all(holders[bm] != conn for bm in ack.refused if bm in holders)
        elif op == "ack_matching":
            ack = state.ack_matching(lambda m, a=a: m.txid % 4 == a % 4, c % 3 + 1, now)
            settle("acked", [m.bookmark for m in ack.acked])
        elif op == "tick":
            now += a % 7
            returned = state.expire_leases(now)
            settle("expired", [m.bookmark for m in returned.expired])
            settle("expired", [m.bookmark for m in state.expire_messages(now)])
            # nothing overdue is left, and the next deadline is the earliest one to come
            deadlines = [m.lease.expires_at for m in state.messages() if m.lease]
            if policy.expiration is not None:
                deadlines += [m.published_at + policy.expiration for m in state.messages()]
            due = [d for d in deadlines if d is not None]
            assert all(d > now for d in due), "a lease or message outlived its deadline"
            assert state.next_deadline() == (min(due) if due else None)
        elif op == "transfer":
            present = [m.bookmark for m in state.messages()]
            name = present[a % len(present)] if present else "none"
            assert state.transfer(name, (ME, PEER)[b % 2]) == bool(present)
        elif op == "peer_removed":
            present = [m.bookmark for m in state.messages()]
            name = present[a % len(present)] if present and a % 3 else f"bm{a}"
            settle("removed by peer", [m.bookmark for m in state.apply_removed([name])])
        _check_invariants(state)

    # none lost, none duplicated: every message left exactly one way, or is still here
    in_queue = {m.bookmark for m in state.messages()}
    assert set(fate).isdisjoint(in_queue)
    assert set(fate) | in_queue == set(added)

    # liveness: a subscriber that takes everything, once it owns everything, drains it
    for s in state.subscriptions():
        settle("expired", [m.bookmark for m in state.unsubscribe(s.key, now).expired])
    for bookmark in list(in_queue):
        state.transfer(bookmark, ME)
    state.subscribe(QueueSub((99, "drain"), requested_backlog=3))
    for _ in range(3 * len(added) + 3):
        out = state.assign(now)
        settle("barrier", [m.bookmark for _, m in out if m.barrier])
        if not policy.at_least_once:
            settle("sent at-most-once", [m.bookmark for _, m in out if not m.barrier])
        leased = [m.bookmark for _, m in out if not m.barrier and policy.at_least_once]
        settle("acked", [m.bookmark for m in state.ack(leased, 99, "", now).acked])
        if not out:
            break
    assert len(state) == 0, f"left in the queue: {[m.bookmark for m in state.messages()]}"
    assert set(fate) == set(added)


# ---------------------------------------------------------------- the package stays pure


def test_the_queue_core_imports_only_the_standard_library_and_itself() -> None:
    """The server drives the core, never the other way round: no trio, no socket, no
    amps_py.server (nor any other amps_py package), so it is testable on its own. The
    one library beside the standard one is sortedcontainers (pure data structures: the
    delivery order of a deep queue)."""
    package = Path(__file__).resolve().parent.parent / "amps_py" / "queue"
    problems = []
    for path in sorted(package.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                names = [node.module or ""]
            else:
                continue
            for name in names:
                top = name.split(".", 1)[0]
                pure = top in sys.stdlib_module_names or top == "sortedcontainers"
                if not pure or top == "socket":
                    problems.append(f"{path.name}:{node.lineno} imports {name}")
    assert not problems, "amps_py.queue must stay pure:\n" + "\n".join(problems)
