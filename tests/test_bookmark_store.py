"""The bookmark stores (amps_py/client/bookmark_store.py): one contract suite run against
the memory store and the file store, the issue's out-of-order processing scenario
(1..5 delivered, 1, 2, 5, 3 processed, then a reconnect or a crash), what a file store
keeps across a restart (close and reopen; a child process killed -9), compaction, a torn
log tail, the directory lock, and a property test against a model of a server's log:
the resume point never passes a delivered message the application did not process, no
processed message is ever handed over again unflagged, and nothing unprocessed is ever
dropped.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import tempfile
import textwrap
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, seed, settings
from hypothesis import strategies as st

from amps_py.client.bookmark_log import MAGIC, decode_log, encode_record
from amps_py.client.bookmark_store import (
    BookmarkStoreInUse,
    FileBookmarkStore,
    MemoryBookmarkStore,
    parse_message_bookmark,
)
from amps_py.client.store_api import BookmarkStore, Delivery
from txlog.identity import publisher_hash

A = publisher_hash("publisher-a")
B = publisher_hash("publisher-b")
C = publisher_hash("publisher-c")
SUB = "sub-1"

NEW = Delivery()
DUP = Delivery(duplicate=True)
MAYBE = Delivery(possible_duplicate=True)


def bm(pub: int, seq: int) -> str:
    return f"{pub}|{seq}|"


def resume_set(text: str) -> set[str]:
    return {f"{part}" for part in text.split(",")} if text else set()


def log_path(directory: Path) -> Path:
    return directory / "bookmarks.log"


# -- the contract suite, for both stores --------------------------------------------------

StoreFactory = Callable[[], BookmarkStore]


@pytest.fixture(params=["memory", "file"])
def make_store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[StoreFactory]:
    opened: list[BookmarkStore] = []

    def make() -> BookmarkStore:
        store: BookmarkStore
        if request.param == "memory":
            store = MemoryBookmarkStore()
        else:
            store = FileBookmarkStore(tmp_path / "bookmarks")
        opened.append(store)
        return store

    yield make
    for store in opened:
        store.close()


def test_a_new_subscription_has_no_resume_point(make_store: StoreFactory) -> None:
    store = make_store()
    assert store.resume_bookmark(SUB) == ""
    assert store.delivered(SUB, bm(A, 1)) == NEW
    assert store.resume_bookmark(SUB) == ""  # delivered is not processed


def test_in_order_processing_moves_the_resume_point(make_store: StoreFactory) -> None:
    store = make_store()
    for seq in range(1, 4):
        assert store.delivered(SUB, bm(A, seq)) == NEW
        store.processed(SUB, bm(A, seq))
        assert store.resume_bookmark(SUB) == bm(A, seq)


def test_out_of_order_processing_keeps_the_mark_below_the_unprocessed(
    make_store: StoreFactory,
) -> None:
    """The issue's scenario without a restart: 1..5 delivered, 1, 2, 5, 3 processed.
    The resume point is 3 (4 is not processed); after a reconnect 4 comes flagged and
    5, known processed, is dropped."""
    store = make_store()
    for seq in range(1, 6):
        assert store.delivered(SUB, bm(A, seq)) == NEW
    for seq, mark in ((1, 1), (2, 2), (5, 2), (3, 3)):
        store.processed(SUB, bm(A, seq))
        assert store.resume_bookmark(SUB) == bm(A, mark), f"after processing {seq}"
    store.reconnected(SUB)
    # the server replays after A|3|
    assert store.delivered(SUB, bm(A, 4)) == MAYBE
    assert store.delivered(SUB, bm(A, 5)) == DUP
    assert store.delivered(SUB, bm(A, 6)) == NEW  # new since the reconnect
    store.processed(SUB, bm(A, 4))
    assert store.resume_bookmark(SUB) == bm(A, 5)  # 4 closes the gap up to 5
    store.processed(SUB, bm(A, 6))
    assert store.resume_bookmark(SUB) == bm(A, 6)


def test_the_mark_moves_over_gaps_never_delivered(make_store: StoreFactory) -> None:
    """A filtered subscription sees 1, 3, 7 of a publisher: the mark is over delivered
    messages, so processing 1 and 3 puts it at 3, and 7 at 7."""
    store = make_store()
    for seq in (1, 3, 7):
        store.delivered(SUB, bm(A, seq))
    store.processed(SUB, bm(A, 3))
    assert store.resume_bookmark(SUB) == ""  # 1 is still in the application's hands
    store.processed(SUB, bm(A, 1))
    assert store.resume_bookmark(SUB) == bm(A, 3)
    store.processed(SUB, bm(A, 7))
    assert store.resume_bookmark(SUB) == bm(A, 7)


def test_processed_messages_come_again_as_duplicates_after_reconnect(
    make_store: StoreFactory,
) -> None:
    store = make_store()
    for seq in range(1, 4):
        store.delivered(SUB, bm(A, seq))
        store.processed(SUB, bm(A, seq))
    store.delivered(SUB, bm(A, 4))
    store.reconnected(SUB)
    assert [store.delivered(SUB, bm(A, seq)) for seq in range(1, 6)] == [
        DUP,
        DUP,
        DUP,
        MAYBE,  # delivered before the reconnect, not processed
        NEW,
    ]


def test_a_redelivery_of_an_unprocessed_message_is_flagged(make_store: StoreFactory) -> None:
    store = make_store()
    store.delivered(SUB, bm(A, 1))
    assert store.delivered(SUB, bm(A, 1)) == MAYBE  # even without reconnected()
    store.processed(SUB, bm(A, 1))
    assert store.delivered(SUB, bm(A, 1)) == DUP


def test_reconnect_before_any_delivery_flags_nothing(make_store: StoreFactory) -> None:
    store = make_store()
    store.reconnected(SUB)
    assert store.delivered(SUB, bm(A, 1)) == NEW


def test_several_publishers_interleaved(make_store: StoreFactory) -> None:
    """Each publisher has its own mark; the resume list names all of them, so the
    server (which starts after the earliest it finds) skips nobody's unprocessed
    message."""
    store = make_store()
    stream = [(A, 1), (B, 1), (A, 2), (C, 1), (B, 2), (A, 3), (C, 2), (B, 3)]
    for pub, seq in stream:
        assert store.delivered(SUB, bm(pub, seq)) == NEW
    for pub, seq in [(A, 1), (B, 1), (C, 1), (A, 3), (B, 2), (C, 2)]:
        store.processed(SUB, bm(pub, seq))
    assert resume_set(store.resume_bookmark(SUB)) == {bm(A, 1), bm(B, 2), bm(C, 2)}
    store.reconnected(SUB)
    replay = [(A, 2), (C, 2), (B, 3), (A, 3), (A, 4), (B, 4)]
    assert [store.delivered(SUB, bm(p, s)) for p, s in replay] == [
        MAYBE,
        DUP,
        MAYBE,
        DUP,
        NEW,
        NEW,
    ]


def test_a_publisher_with_nothing_processed_makes_the_resume_point_empty(
    make_store: StoreFactory,
) -> None:
    """A's only message is unprocessed: no bookmark of A lies before it, so rather than
    a list that could start after it, the caller's own starting bookmark applies."""
    store = make_store()
    store.delivered(SUB, bm(B, 1))
    store.processed(SUB, bm(B, 1))
    assert store.resume_bookmark(SUB) == bm(B, 1)
    store.delivered(SUB, bm(A, 1))
    store.delivered(SUB, bm(B, 2))
    store.processed(SUB, bm(B, 2))
    assert store.resume_bookmark(SUB) == ""
    store.processed(SUB, bm(A, 1))
    assert resume_set(store.resume_bookmark(SUB)) == {bm(A, 1), bm(B, 2)}


def test_two_subscriptions_are_independent(make_store: StoreFactory) -> None:
    store = make_store()
    for seq in range(1, 4):
        store.delivered("one", bm(A, seq))
        store.delivered("two", bm(A, seq))
    store.processed("one", bm(A, 1))
    store.processed("one", bm(A, 2))
    store.processed("two", bm(A, 3))
    assert store.resume_bookmark("one") == bm(A, 2)
    assert store.resume_bookmark("two") == ""
    store.reconnected("one")
    assert store.delivered("one", bm(A, 3)) == MAYBE
    assert store.delivered("two", bm(A, 2)) == MAYBE  # in hands, not reconnect-flagged
    assert store.delivered("two", bm(A, 3)) == DUP
    assert store.delivered("two", bm(A, 4)) == NEW
    assert store.resume_bookmark("three") == ""


BAD_BOOKMARKS = [
    "20240131T120000",  # a timestamp
    "20240131T120000Z",
    "0",  # EPOCH
    "0|1|",  # NOW
    f"{A}|1|,{B}|2|",  # a list
    "garbage",
    "",
    f"{A}|1",  # no trailing bar
    f"|{A}|1|",
    f"{A}|0|",
    f"-{A}|1|",
    f"{2**64}|1|",
    f"{A}| 1|",
]


@pytest.mark.parametrize("text", BAD_BOOKMARKS)
def test_anything_but_a_message_bookmark_is_refused(make_store: StoreFactory, text: str) -> None:
    store = make_store()
    for call in (store.delivered, store.processed):
        with pytest.raises(ValueError) as info:
            call(SUB, text)
        assert repr(text) in str(info.value)
        assert "'<publisher hash>|<seq>|'" in str(info.value)
    assert store.resume_bookmark(SUB) == ""


def test_parse_message_bookmark() -> None:
    assert parse_message_bookmark(bm(A, 12)) == (A, 12)
    assert parse_message_bookmark(f"{2**64 - 1}|{2**64 - 1}|") == (2**64 - 1, 2**64 - 1)


# -- the file store across restarts --------------------------------------------------------


def test_file_store_out_of_order_then_crash(tmp_path: Path) -> None:
    """The issue's scenario: 1..5 delivered, 1, 2, 5, 3 processed, then a crash (the
    store closed without sync() and reopened). Resume after 3; 4 is redelivered (not a
    duplicate) and 5 is flagged, not dropped: the out-of-order set is not kept."""
    store = FileBookmarkStore(tmp_path)
    for seq in range(1, 6):
        store.delivered(SUB, bm(A, seq))
    for seq in (1, 2, 5, 3):
        store.processed(SUB, bm(A, seq))
    store.close()

    store = FileBookmarkStore(tmp_path)
    assert store.resume_bookmark(SUB) == bm(A, 3)
    # no reconnected() call needed: a reopened store flags up to the persisted max
    four = store.delivered(SUB, bm(A, 4))
    assert not four.duplicate
    assert store.delivered(SUB, bm(A, 5)) == MAYBE
    assert store.delivered(SUB, bm(A, 6)) == NEW
    assert store.delivered(SUB, bm(A, 3)) == DUP
    for seq in (4, 5, 6):
        store.processed(SUB, bm(A, seq))
    assert store.resume_bookmark(SUB) == bm(A, 6)
    store.close()


def test_file_store_keeps_every_publisher_and_subscription(tmp_path: Path) -> None:
    store = FileBookmarkStore(tmp_path)
    for pub, seq in [(A, 1), (B, 1), (A, 2), (B, 2), (C, 1), (A, 3)]:
        store.delivered("one", bm(pub, seq))
        store.delivered("two", bm(pub, seq))
    for pub, seq in [(A, 1), (A, 2), (B, 1), (C, 1), (A, 3)]:
        store.processed("one", bm(pub, seq))
    store.processed("two", bm(B, 1))
    store.processed("two", bm(B, 2))
    before = {sub: store.resume_bookmark(sub) for sub in ("one", "two")}
    store.sync()
    store.close()

    store = FileBookmarkStore(tmp_path)
    after = {sub: store.resume_bookmark(sub) for sub in ("one", "two")}
    assert after == before
    assert resume_set(after["one"]) == {bm(A, 3), bm(B, 1), bm(C, 1)}
    # "two" had A's and C's messages in hand, none processed: its own start applies
    assert after["two"] == ""
    assert store.delivered("one", bm(B, 2)) == MAYBE
    assert store.delivered("two", bm(B, 2)) == DUP
    assert store.delivered("two", bm(A, 1)) == MAYBE
    store.close()


def test_file_store_remembers_publishers_delivered_after_the_first_record(
    tmp_path: Path,
) -> None:
    """C appears after B already has a mark on disk; B's next record carries C's first
    record, so after a crash the resume point cannot start after C's unprocessed
    message."""
    store = FileBookmarkStore(tmp_path)
    store.delivered(SUB, bm(B, 1))
    store.processed(SUB, bm(B, 1))
    store.delivered(SUB, bm(C, 1))
    store.delivered(SUB, bm(B, 2))
    store.processed(SUB, bm(B, 2))
    store.close()
    store = FileBookmarkStore(tmp_path)
    assert store.resume_bookmark(SUB) == ""
    assert store.delivered(SUB, bm(C, 1)) == MAYBE
    assert store.delivered(SUB, bm(B, 2)) == DUP
    store.close()


CHILD = textwrap.dedent(
    """
    import random, sys
    from amps_py.client.bookmark_store import FileBookmarkStore
    directory, seed, a, b = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
    rng = random.Random(seed)
    store = FileBookmarkStore(directory)
    for seq in range(1, 6):
        store.delivered("sub-1", f"{a}|{seq}|")
    for seq in (1, 2, 5, 3):
        store.processed("sub-1", f"{a}|{seq}|")
    for seq in range(1, 21):
        store.delivered("sub-1", f"{b}|{seq}|")
    rest = list(range(2, 21))
    rng.shuffle(rest)
    for seq in [1] + rest[: rng.randint(0, 19)]:
        store.processed("sub-1", f"{b}|{seq}|")
        print("processed", seq, flush=True)
    print("ready", flush=True)
    sys.stdin.read()  # wait to be killed
    """
)


@pytest.mark.parametrize("child_seed", [3, 5, 11])
def test_file_store_survives_kill_9(tmp_path: Path, child_seed: int) -> None:
    """A child process processes A's 1, 2, 5, 3 and a seeded random part of B's 1..20
    (never calling sync()), then is killed -9. The reopened store resumes after A|3 and
    after B's contiguous mark; everything the child processed comes back dropped or
    flagged, and what it did not process comes back."""
    print(f"child seed {child_seed}")
    proc = subprocess.Popen(
        [sys.executable, "-c", CHILD, str(tmp_path), str(child_seed), str(A), str(B)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    processed_b: set[int] = set()
    deadline = threading.Timer(60, proc.kill)  # a stuck child ends the reading below
    deadline.start()
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            if line.strip() == "ready":
                break
            processed_b.add(int(line.split()[1]))
        else:
            stderr = proc.stderr.read() if proc.stderr else ""
            pytest.fail(
                f"the child exited (status {proc.wait()}; -9 after the 60 s deadline) "
                f"before it was ready: {stderr}"
            )
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        deadline.cancel()
        proc.kill()
        proc.wait(timeout=60)
        for pipe in (proc.stdin, proc.stdout, proc.stderr):
            if pipe is not None:
                pipe.close()
    assert proc.returncode == -signal.SIGKILL
    mark_b = 0
    while mark_b + 1 in processed_b:
        mark_b += 1
    print(f"child processed B {sorted(processed_b)}: B's mark {mark_b}")

    store = FileBookmarkStore(tmp_path)
    assert resume_set(store.resume_bookmark(SUB)) == {bm(A, 3), bm(B, mark_b)}
    assert not store.delivered(SUB, bm(A, 4)).duplicate
    assert store.delivered(SUB, bm(A, 5)) == MAYBE
    for seq in range(1, 21):
        got = store.delivered(SUB, bm(B, seq))
        assert got == (DUP if seq <= mark_b else MAYBE), seq
    store.close()


# -- the file store's log ------------------------------------------------------------------


def count_records(directory: Path) -> int:
    return len(decode_log(log_path(directory).read_bytes()).entries)


def test_compaction_keeps_the_state(tmp_path: Path) -> None:
    store = FileBookmarkStore(tmp_path, compact_after=20)
    for seq in range(1, 301):
        for pub in (A, B):
            for sub in ("one", "two"):
                store.delivered(sub, bm(pub, seq))
                if (pub, sub) != (B, "two") or seq <= 150:
                    store.processed(sub, bm(pub, seq))
        assert count_records(tmp_path) <= 21 + 4
    store.delivered("one", bm(A, 301))
    store.delivered("one", bm(A, 302))
    store.processed("one", bm(A, 302))  # out of order: the mark stays at 300
    resumes = {sub: store.resume_bookmark(sub) for sub in ("one", "two")}
    assert resume_set(resumes["one"]) == {bm(A, 300), bm(B, 300)}
    assert resume_set(resumes["two"]) == {bm(A, 300), bm(B, 150)}
    store.close()

    assert count_records(tmp_path) <= 21 + 4
    store = FileBookmarkStore(tmp_path, compact_after=20)
    # opening compacts: one record per (sub_id, publisher)
    assert log_path(tmp_path).stat().st_size == len(MAGIC) + 4 * len(
        encode_record("one", A, 300, 300)
    )
    assert {sub: store.resume_bookmark(sub) for sub in ("one", "two")} == resumes
    assert store.delivered("one", bm(A, 301)) == MAYBE
    assert store.delivered("one", bm(A, 302)) == MAYBE
    assert store.delivered("two", bm(B, 151)) == MAYBE
    assert store.delivered("two", bm(B, 150)) == DUP
    store.close()
    assert not (tmp_path / "bookmarks.log.tmp").exists()


def test_a_leftover_compaction_file_is_ignored(tmp_path: Path) -> None:
    store = FileBookmarkStore(tmp_path)
    store.delivered(SUB, bm(A, 1))
    store.processed(SUB, bm(A, 1))
    store.close()
    (tmp_path / "bookmarks.log.tmp").write_bytes(MAGIC + b"half a compac")
    store = FileBookmarkStore(tmp_path)
    assert store.resume_bookmark(SUB) == bm(A, 1)
    store.close()
    assert not (tmp_path / "bookmarks.log.tmp").exists()


def process_in_order(directory: Path, seqs: range) -> None:
    store = FileBookmarkStore(directory)
    for seq in seqs:
        store.delivered(SUB, bm(A, seq))
        store.processed(SUB, bm(A, seq))
    store.close()


def test_a_torn_tail_is_ignored_with_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    process_in_order(tmp_path, range(1, 4))
    with log_path(tmp_path).open("ab") as f:  # a crash in the middle of a write
        f.write(encode_record(SUB, A, 4, 4)[:15])
    with caplog.at_level(logging.WARNING, logger="amps_py.client.bookmark_store"):
        store = FileBookmarkStore(tmp_path)
    assert store.resume_bookmark(SUB) == bm(A, 3)
    [warning] = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert str(log_path(tmp_path)) in warning.getMessage()
    assert "15 bytes" in warning.getMessage()
    # the torn bytes are gone: what is written now is read back, with no warning
    store.delivered(SUB, bm(A, 4))
    store.processed(SUB, bm(A, 4))
    store.close()
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="amps_py.client.bookmark_store"):
        store = FileBookmarkStore(tmp_path)
    assert store.resume_bookmark(SUB) == bm(A, 4)
    assert not caplog.records
    store.close()


def test_a_record_with_a_wrong_crc_ends_the_log(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    store = FileBookmarkStore(tmp_path)
    for seq in range(1, 4):
        store.delivered(SUB, bm(A, seq))
        store.processed(SUB, bm(A, seq))
    store.close()
    data = bytearray(log_path(tmp_path).read_bytes())
    data[-len(SUB) - 1] ^= 0xFF  # inside the last record (A's mark 3)
    log_path(tmp_path).write_bytes(bytes(data))
    with caplog.at_level(logging.WARNING, logger="amps_py.client.bookmark_store"):
        store = FileBookmarkStore(tmp_path)
    assert store.resume_bookmark(SUB) == bm(A, 2)
    assert "wrong CRC" in caplog.text
    store.close()


def test_a_file_that_is_not_a_bookmark_log_is_refused(tmp_path: Path) -> None:
    log_path(tmp_path).write_bytes(b"something else entirely\n")
    with pytest.raises(OSError, match="not a bookmark store log") as info:
        FileBookmarkStore(tmp_path)
    assert str(log_path(tmp_path)) in str(info.value)
    # the lock was released: fixing the file makes the directory usable
    log_path(tmp_path).unlink()
    FileBookmarkStore(tmp_path).close()


def test_a_second_opener_is_refused(tmp_path: Path) -> None:
    directory = tmp_path / "store"
    store = FileBookmarkStore(directory)
    with pytest.raises(BookmarkStoreInUse) as info:
        FileBookmarkStore(directory)
    assert str(directory) in str(info.value)
    assert f"process {os.getpid()}" in str(info.value)
    store.close()
    store.close()  # idempotent
    FileBookmarkStore(directory).close()


def test_a_closed_file_store_refuses_work(tmp_path: Path) -> None:
    store = FileBookmarkStore(tmp_path)
    store.close()
    with pytest.raises(ValueError, match="closed"):
        store.processed(SUB, bm(A, 1))
    with pytest.raises(ValueError, match="closed"):
        store.delivered(SUB, bm(A, 1))


def test_processed_writes_to_the_os_without_sync(tmp_path: Path) -> None:
    """What processed() returned from is in the file before any sync() or close()."""
    store = FileBookmarkStore(tmp_path)
    store.delivered(SUB, bm(A, 1))
    store.processed(SUB, bm(A, 1))
    entries = decode_log(log_path(tmp_path).read_bytes()).entries
    assert [(e.sub_id, e.pub_hash, e.mark, e.max_delivered) for e in entries] == [(SUB, A, 1, 1)]
    store.close()


# -- the property test ---------------------------------------------------------------------

PROPERTY_SEED = 20240616
PUBS = [A, B, C]


@st.composite
def scenarios(draw: st.DrawFn) -> tuple[list[tuple[int, int]], list[tuple[str, int]]]:
    """A server log (messages of up to three publishers, interleaved, some filtered out
    of the subscription) and a list of steps."""
    npubs = draw(st.integers(1, 3))
    owners = draw(st.lists(st.integers(0, npubs - 1), min_size=4, max_size=30))
    seqs = dict.fromkeys(range(npubs), 0)
    log: list[tuple[int, int]] = []
    for owner in owners:
        seqs[owner] += 1
        if draw(st.integers(0, 5)):  # one in six does not match the filter
            log.append((PUBS[owner], seqs[owner]))
    steps = draw(
        st.lists(
            st.tuples(
                st.sampled_from(["deliver"] * 4 + ["process"] * 3 + ["reconnect", "crash"]),
                st.integers(0, 1000),
            ),
            min_size=20,
            max_size=120,
        )
    )
    return log, steps


def check_scenario(
    store_kind: str, log: list[tuple[int, int]], steps: list[tuple[str, int]]
) -> None:
    position = {msg: at for at, msg in enumerate(log)}
    with tempfile.TemporaryDirectory() as tmp:

        def open_store() -> BookmarkStore:
            return MemoryBookmarkStore() if store_kind == "memory" else FileBookmarkStore(tmp)

        store = open_store()
        cursor = 0  # the next message of the log the server sends
        hands: list[tuple[int, int]] = []  # delivered, not processed, in this process
        delivered: set[tuple[int, int]] = set()
        processed: set[tuple[int, int]] = set()
        try:
            for kind, pick in steps:
                if kind == "deliver" and cursor < len(log):
                    msg = log[cursor]
                    cursor += 1
                    got = store.delivered(SUB, bm(*msg))
                    if got.duplicate:
                        assert msg in processed, f"{msg} dropped, never processed"
                    else:
                        assert msg not in processed or got.possible_duplicate, (
                            f"{msg} processed before, handed over unflagged"
                        )
                        if msg not in hands:
                            hands.append(msg)
                        delivered.add(msg)
                elif kind == "process" and hands:
                    msg = hands.pop(pick % len(hands))
                    store.processed(SUB, bm(*msg))
                    processed.add(msg)
                elif kind in ("reconnect", "crash"):
                    if kind == "crash" and store_kind == "file":
                        store.close()  # the process dies; the OS has what was written
                        store = open_store()
                        hands.clear()
                    else:  # a memory store does not survive a crash: a reconnect only
                        store.reconnected(SUB)
                    resume = store.resume_bookmark(SUB)
                    start = 0  # "" -> the subscriber's own bookmark: EPOCH here
                    if resume:
                        found = []
                        for part in resume.split(","):
                            msg = parse_message_bookmark(part)
                            assert msg in processed, f"resume {part} is not processed"
                            found.append(position[msg])
                        start = min(found) + 1
                    for msg in delivered - processed:
                        assert position[msg] >= start, (
                            f"resume {resume!r} starts after unprocessed {msg}"
                        )
                    cursor = start
        finally:
            store.close()


@pytest.mark.parametrize("store_kind", ["memory", "file"])
def test_property_resume_never_skips_and_duplicates_are_flagged(store_kind: str) -> None:
    print(f"hypothesis seed {PROPERTY_SEED}")

    @seed(PROPERTY_SEED)
    @settings(
        database=None,
        deadline=None,
        max_examples=300,
        suppress_health_check=[HealthCheck.too_slow],
    )
    @given(scenarios())
    def run(scenario: tuple[list[tuple[int, int]], list[tuple[str, int]]]) -> None:
        check_scenario(store_kind, *scenario)

    run()
