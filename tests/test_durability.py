"""PublisherLedger: the persisted-ack rules, without trio or a server (which records
are durable: tests/test_durable_window.py)."""

from __future__ import annotations

import random

from hypothesis import given
from hypothesis import strategies as st

from amps_py.server.durability import Ledgers, PublisherLedger
from txlog import Record


def test_in_order_publishes_are_acked_as_they_become_durable() -> None:
    ledger = PublisherLedger(held=0)
    for seq in (1, 2, 3):
        ledger.accept(seq)
    assert ledger.advance() is None  # nothing durable yet
    ledger.settle([1, 2])
    assert ledger.advance() == 2
    ledger.settle([3])
    assert ledger.advance() == 3
    assert ledger.idle


def test_an_ack_never_covers_a_lower_seq_still_in_flight() -> None:
    ledger = PublisherLedger(held=0)
    for seq in (1, 2, 5, 3, 4):
        ledger.accept(seq)
    ledger.settle([1, 2, 5])  # 5 committed before 3 and 4
    assert ledger.advance() == 2
    ledger.settle([3])
    assert ledger.advance() == 3
    ledger.settle([4])
    assert ledger.advance() == 5


def test_pending_lookup_is_exact() -> None:
    ledger = PublisherLedger(held=10)
    ledger.accept(20)
    ledger.accept(15)
    assert ledger.is_pending(15) and ledger.is_pending(20)
    assert not ledger.is_pending(16) and not ledger.is_pending(10) and not ledger.is_pending(21)
    assert ledger.high == 20


def test_seqs_queued_by_replication_raise_the_next_server_seq() -> None:
    ledger = PublisherLedger(held=100, queued=120)
    assert ledger.high == 120 and ledger.done == 100
    ledger.saw(130)
    assert ledger.high == 130
    ledger.saw(90)
    assert ledger.high == 130


def test_a_resent_seq_below_the_last_ack_is_acked_again_once_durable() -> None:
    ledger = PublisherLedger(held=50)  # the logon said 50; 40 was lost before commit
    ledger.accept(40)
    assert ledger.advance() is None
    ledger.settle([40])
    assert ledger.advance() == 50, "the publisher must learn that 40 is durable now"
    assert ledger.advance() is None


def test_a_resent_seq_that_is_already_durable_is_acked_again() -> None:
    ledger = PublisherLedger(held=50)
    ledger.resent_durable(30)
    assert ledger.advance() == 50
    assert ledger.advance() is None


@given(st.lists(st.integers(min_value=1, max_value=60), min_size=1, max_size=60, unique=True))
def test_acks_only_cover_settled_seqs(order: list[int]) -> None:
    """Any arrival order, settled in a random order in random chunks: every ack N
    covers only seqs at or below N that were settled (or never sent)."""
    rng = random.Random(len(order))
    ledger = PublisherLedger(held=0)
    for seq in order:
        ledger.accept(seq)
    unsettled = list(order)
    rng.shuffle(unsettled)
    settled: set[int] = set()
    while unsettled:
        size = rng.randint(1, 5)
        chunk, unsettled = unsettled[:size], unsettled[size:]
        ledger.settle(chunk)
        settled.update(chunk)
        acked = ledger.advance()
        if acked is not None:
            sent_below = {s for s in order if s <= acked}
            assert sent_below <= settled, f"ack {acked} covers {sent_below - settled}"
    assert ledger.advance() in (max(order), None)
    assert ledger.acked == max(order) and ledger.idle


def rec(txid: int, ph: int, seq: int) -> Record:
    return Record(topic="t", payload=b"{}", pub_hash=ph, seq=seq, txid=txid)


def test_ledgers_are_built_on_need_and_dropped_when_idle() -> None:
    ledgers = Ledgers(held=lambda ph: 10, queued=lambda ph: 12)
    ledger = ledgers.of(7)
    assert (ledger.done, ledger.high) == (10, 12)
    ledger.accept(13)
    assert ledgers.settle({7: [13]}, present={7}) == [7]
    ledgers.saw([rec(0, 7, 20)])
    assert ledgers.of(7).high == 20
    assert ledgers.settle({7: [13]}, present=set()) == []
    assert ledgers.get(7) is None, "an idle ledger whose publisher left is dropped"
