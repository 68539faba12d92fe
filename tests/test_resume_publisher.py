"""A bookmark this instance does not hold, of a publisher it knows, resumes at that
publisher's first record above the seq (issue 28 item 8).

On failover a subscriber arrives with the bookmark of a message the new instance has
not received yet, while that instance already holds newer seqs of the same publisher
(a failed-over publisher sends new seqs before resending its older tail). Nothing of
that publisher above the seq may be skipped, whatever order its records arrived in,
and nothing at or below it repeated. A list (one bookmark per publisher) does the same
per publisher. Unknown publishers keep ``bookmark_not_found``.

The journal-level tests call :func:`plan_replay` on a real journal; the others run a
real instance in the test's trio run (inprocess.py) and publish with explicit seqs.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import trio
from harness import wait_until
from inprocess import InProcessInstance

from amps_py.client import Client, CommandError, open_client
from amps_py.server import replay, replay_plan
from amps_py.server.bookmark_spec import parse_bookmark_spec
from amps_py.server.replay_plan import BookmarkNotFound, plan_replay
from txlog import EarliestAbove, Journal, Record, publisher_hash
from txlog.reading import RecordReader

P = publisher_hash("pub-p")
Q = publisher_hash("pub-q")
OTHER = publisher_hash("other")


def rec(ph: int, seq: int) -> Record:
    return Record(topic="orders", payload=b'{"s":%d}' % seq, pub_hash=ph, seq=seq, client_name="x")


def store(journal: Journal, *pairs: tuple[int, int]) -> list[int]:
    """Append records (publisher, seq) in this order; their txids."""
    return journal.append([rec(ph, seq) for ph, seq in pairs], 1000)


@pytest.fixture
def journal(tmp_path: Path) -> Iterator[Journal]:
    with Journal(tmp_path / "j", instance_name="a") as j:
        yield j


def plan(journal: Journal, bm: str, not_found: str = "now", budget: int = 2048):  # type: ignore[no-untyped-def]
    return plan_replay(journal, parse_bookmark_spec(bm), journal.last_txid, not_found, budget)


# ------------------------------------------------------------------ the journal's search
def test_search_finds_the_earliest_txid_not_the_smallest_seq(journal: Journal) -> None:
    """Arrivals 1..996, then 1005, 1006 (new seqs), then 1001 and 997 (a resend out of
    order): above 999 the smallest held seq is 1001, but 1005 came first."""
    store(journal, *[(P, s) for s in range(1, 997)])
    t1005, _, t1001, _ = store(journal, (P, 1005), (P, 1006), (P, 1001), (P, 997))
    search = journal.earliest_above(P, 999, journal.last_txid)
    assert search.step(100)
    assert search.earliest == t1005 < t1001
    assert search.entries_read == 3  # 1001, 1005, 1006: nothing at or below 999
    # nothing above the highest seq; a publisher never seen
    for ph, seq in ((P, 1006), (OTHER, 0)):
        none = journal.earliest_above(ph, seq, journal.last_txid)
        assert none.step(100) and none.earliest is None and none.entries_read == 0


def test_search_ignores_records_after_its_point_and_runs_in_steps(journal: Journal) -> None:
    store(journal, *[(P, s) for s in range(10, 0, -1)])  # seq 10 first, 1 last
    search = journal.earliest_above(P, 4, through_txid=3)  # txids 1..3 hold 10, 9, 8
    steps = 0
    while not search.step(2):
        steps += 1
    assert steps == 3 and search.entries_read == 6  # the 4th step finds the end
    assert search.earliest == 1
    later = journal.earliest_above(P, 8, through_txid=0)
    assert later.step(100) and later.earliest is None  # 9, 10 are after txid 0


def test_search_sees_records_staged_but_not_committed_to_lmdb(tmp_path: Path) -> None:
    with Journal(tmp_path / "j", instance_name="a", durability="fsync") as journal:
        store(journal, (P, 1), (P, 2))
        staged = journal.stage([rec(P, 9), rec(P, 5)], 2000)
        assert journal.has_staged
        search = journal.earliest_above(P, 4, journal.last_txid)
        journal.commit()  # a commit between steps: the search took the staged tail first
        assert search.step(100) and search.earliest == staged[0]


@pytest.mark.parametrize("others", [1_000, 20_000])
def test_cost_follows_the_publisher_above_the_seq_not_the_journal(
    journal: Journal, others: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same index entries and no record read, for a journal of 1,000 or 20,000
    records of another publisher plus 2,000 of P below the seq."""
    for first in range(0, others, 5_000):
        store(journal, *[(OTHER, s) for s in range(first + 1, min(first + 5_000, others) + 1)])
    store(journal, *[(P, s) for s in range(1, 2_001)])
    store(journal, (P, 3_005), (P, 3_006), (P, 3_001))
    reads = []
    original = RecordReader.scan
    monkeypatch.setattr(
        RecordReader, "scan", lambda self, *a: reads.append(a) or original(self, *a)
    )
    searches: list[EarliestAbove] = []
    original_search = Journal.earliest_above

    def recorded(self: Journal, *args: int) -> EarliestAbove:
        searches.append(original_search(self, *args))
        return searches[-1]

    monkeypatch.setattr(Journal, "earliest_above", recorded)
    result = plan(journal, f"{P}|3000|")
    assert reads == [], "placing the bookmark read journal records"
    (search,) = searches
    assert search.entries_read == 3  # 3001, 3005, 3006, whatever the journal's size
    assert result.start == others + 2_000  # just before 3005
    print(f"journal of {journal.last_txid} records: {search.entries_read} index entries read")


# ------------------------------------------------------------------ plans
def test_single_bookmark_of_a_known_publisher(journal: Journal) -> None:
    store(journal, *[(P, s) for s in range(1, 997)])
    store(journal, (OTHER, 1))
    t1005, *_ = store(journal, (P, 1005), (P, 1006), (OTHER, 2))
    result = plan(journal, f"{P}|999|")
    assert result.start == t1005 - 1
    assert dict(result.skip) == {P: 999}
    assert result.resumed_from == "" and result.searches == ()
    assert f"bookmark {P}|999|: not held; resumed at the first record of its publisher " in (
        result.not_found
    )
    assert "above seq 999" in result.not_found and "at or below that seq are skipped" in (
        result.not_found
    )
    # nothing of P above 1010 held yet: "now", and P's seqs up to 1010 skipped later
    later = plan(journal, f"{P}|1010|")
    assert later.start == journal.last_txid and dict(later.skip) == {P: 1010}
    assert "no record of its publisher above seq 1010 yet (held up to seq 1006)" in (
        later.not_found
    )
    assert "starting with new messages" in later.not_found
    # epoch and fail still decide when the bookmark is not held
    assert plan(journal, f"{P}|999|", "epoch").start == 0
    with pytest.raises(BookmarkNotFound):
        plan(journal, f"{P}|999|", "fail")


def test_unknown_publisher_keeps_bookmark_not_found(journal: Journal) -> None:
    store(journal, (P, 1), (P, 2))
    result = plan(journal, "12345|99|")
    assert result.start == journal.last_txid
    assert result.not_found.startswith("bookmark 12345|99| is not in this instance's journal")
    assert "bookmark_not_found=now, the default" in result.not_found
    assert plan(journal, "12345|99|", "epoch").start == 0
    with pytest.raises(BookmarkNotFound):
        plan(journal, "12345|99|", "fail")
    # a held bookmark: as before, resumed after it, no sentence
    held = plan(journal, f"{P}|1|")
    assert (held.start, held.resumed_from, held.not_found) == (1, f"{P}|1|", "")


def test_list_resumes_at_the_earliest_point_of_each_publisher(journal: Journal) -> None:
    """P held at txid 6; Q's 7 not held, but Q's 9 arrived at txid 3 (before P's
    bookmark): the replay starts at txid 2, skipping P <= 5 and Q <= 7."""
    store(journal, (Q, 1), (Q, 2), (Q, 9), (P, 4), (OTHER, 1), (P, 5), (Q, 8))
    result = plan(journal, f"{P}|5|,{Q}|7|,12345|1|")
    assert result.start == 2
    assert dict(result.skip) == {P: 5, Q: 7, 12345: 1}
    assert result.not_found.startswith(f"bookmark list: {Q}|7|: not held; resumed at")
    assert "12345|1|: publisher unknown here" in result.not_found
    # every bookmark held: as before (the earliest), no sentence
    both = plan(journal, f"{P}|5|,{Q}|2|")
    assert (both.start, both.resumed_from, both.not_found) == (2, f"{Q}|2|", "")


def test_a_long_search_is_left_to_the_replay(journal: Journal) -> None:
    store(journal, *[(P, s) for s in range(100, 10, -1)])  # 100 first; 10 never
    result = plan(journal, f"{P}|10|", budget=5)
    assert result.start == journal.last_txid
    (search,) = result.searches
    assert not search.done
    while not search.step(7):
        pass
    assert search.earliest == 1


# ------------------------------------------------------------------ a real instance
def payload(seq: int) -> bytes:
    return b'{"s":%d}' % seq


async def publish(pub: Client, *seqs: int) -> None:
    for seq in seqs:
        await pub.publish("orders", payload(seq), seq=seq)
    await pub.flush()


async def receive(sub, count: int) -> list[int]:  # type: ignore[no-untyped-def]
    with trio.fail_after(30):
        return [(await sub.get(30)).json()["s"] for _ in range(count)]


async def nothing_more(sub) -> None:  # type: ignore[no-untyped-def]
    with trio.move_on_after(0.3):
        extra = await sub.get(5)
        pytest.fail(f"unexpected extra message {extra}")


async def processed_reason(client: Client, bm: str) -> str:
    """The reason of the processed ack of a raw bookmark subscribe, checked to be the
    completed ack's too (then unsubscribed)."""
    header = {
        "c": "subscribe",
        "t": "orders",
        "bm": bm,
        "a": "processed,completed",
        "sub_id": "probe",
    }
    acks = await client.command(header, wait={"processed", "completed"})
    await client.unsubscribe("probe")
    reasons = {ack["a"]: str(ack.get("reason", "")) for ack in acks}
    assert reasons["processed"] == reasons["completed"], reasons
    return reasons["processed"]


async def test_resume_from_a_seq_not_held_with_newer_seqs_held(inproc: InProcessInstance) -> None:
    """1..10, then 15, 16 (new seqs first), then the subscriber asks for after 12; then
    11..14 arrive: it receives 15, 16, 13, 14, each once."""
    async with open_client(inproc.uri, "pub-p") as pub, open_client(inproc.uri, "sub") as sub:
        await publish(pub, *range(1, 11), 15, 16)
        async with open_client(inproc.uri, "other") as other:
            await publish(other, 1)
        bm = f"{P}|12|"
        reason = await processed_reason(sub, bm)
        assert "resumed at the first record of its publisher above seq 12" in reason
        async with sub.subscribe("orders", bookmark=bm) as s:
            assert await receive(s, 3) == [15, 16, 1]  # "other" 1 is after the point
            with trio.fail_after(30):
                await s.completed.wait()
            await publish(pub, 11, 12, 13, 14)
            assert await receive(s, 2) == [13, 14]
            await nothing_more(s)


async def test_resume_before_the_seq_arrives(inproc: InProcessInstance) -> None:
    """The instance holds 1..10; the subscriber asks for after 12: it starts with new
    messages and, as 11..16 arrive, receives 13..16 only."""
    async with open_client(inproc.uri, "pub-p") as pub, open_client(inproc.uri, "sub") as sub:
        await publish(pub, *range(1, 11))
        bm = f"{P}|12|"
        reason = await processed_reason(sub, bm)
        assert "no record of its publisher above seq 12 yet (held up to seq 10)" in reason
        async with sub.subscribe("orders", bookmark=bm) as s:
            with trio.fail_after(30):
                await s.completed.wait()
            await publish(pub, 16, 11, 12, 13, 14, 15)
            assert await receive(s, 4) == [16, 13, 14, 15]
            await nothing_more(s)


async def test_a_search_the_replay_task_finishes(
    inproc: InProcessInstance, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The handler reads one index entry, the replay task one at a time after that: the
    replay still starts at the earliest record above the seq (15, stored first)."""
    monkeypatch.setattr(replay_plan, "PLAN_SEARCH_ENTRIES", 1)
    monkeypatch.setattr(replay, "SEARCH_STEP", 1)
    async with open_client(inproc.uri, "pub-p") as pub, open_client(inproc.uri, "sub") as sub:
        await publish(pub, *range(1, 11), 15, 16, 14, 13)
        journal = inproc.instance.journal
        assert journal is not None
        # in LMDB's index, not only the staged tail (which a search reads at its end)
        await wait_until(lambda: "records staged" if journal.has_staged else None, 30)
        async with sub.subscribe("orders", bookmark=f"{P}|12|") as s:
            assert await receive(s, 4) == [15, 16, 14, 13]
            await publish(pub, 11, 12, 17)
            assert await receive(s, 1) == [17]
            await nothing_more(s)


async def test_list_of_publishers_on_an_instance(inproc: InProcessInstance) -> None:
    """pub-p's bookmark is held; pub-q's is not, and pub-q's newer seqs were stored
    before pub-p's bookmark. Each publisher resumes after its own seq, once."""
    async with (
        open_client(inproc.uri, "pub-p") as pub_p,
        open_client(inproc.uri, "pub-q") as pub_q,
        open_client(inproc.uri, "sub") as sub,
    ):
        await publish(pub_q, 1, 2, 9)
        await publish(pub_p, 1, 2, 3)
        await publish(pub_q, 3)
        await publish(pub_p, 4)
        async with sub.subscribe("orders", bookmark=f"{P}|2|,{Q}|5|") as s:
            # from q's 9 on: q 9, p 1 and 2 skipped, p 3, q 3 skipped, p 4
            assert await receive(s, 3) == [9, 3, 4]
            with trio.fail_after(30):
                await s.completed.wait()
            await publish(pub_q, 4, 5, 6, 7)
            assert await receive(s, 2) == [6, 7]
            await nothing_more(s)


async def test_unknown_publisher_on_an_instance_starts_with_new_messages(
    inproc: InProcessInstance,
) -> None:
    async with open_client(inproc.uri, "pub-p") as pub, open_client(inproc.uri, "sub") as sub:
        await publish(pub, 1, 2)
        async with sub.subscribe("orders", bookmark="12345|7|") as s:
            with trio.fail_after(30):
                await s.completed.wait()
            await publish(pub, 3)
            assert await receive(s, 1) == [3]
        with pytest.raises(CommandError):
            async with sub.subscribe(
                "orders", bookmark=f"{P}|7|", options="bookmark_not_found=fail"
            ):
                pass
