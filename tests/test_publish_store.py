"""The publish stores (amps_py.client.publish_store): one contract suite for the memory
and the file store, then what only a file store promises: reopening, crashes (kill -9
at seeded random moments), torn tails, damage, the directory lock, full disks."""

from __future__ import annotations

import errno
import logging
import os
import random
import signal
import subprocess
import sys
import tempfile
import textwrap
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from hypothesis import given, seed, settings
from hypothesis import strategies as st

from amps_py.client import publish_record as codec
from amps_py.client.publish_store import (
    FilePublishStore,
    MemoryPublishStore,
    PublishStoreDamaged,
    PublishStoreError,
    PublishStoreInUse,
)
from amps_py.client.store_api import (
    SOW_DELETE_BY_DATA,
    SOW_DELETE_BY_FILTER,
    SOW_DELETE_BY_KEYS,
    PublishStore,
    StoredPublish,
)

REPO = Path(__file__).resolve().parents[1]

Opener = Callable[..., PublishStore]


@pytest.fixture(params=["memory", "file"])
def open_store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Opener]:
    opened: list[PublishStore] = []

    def make(**kwargs: int) -> PublishStore:
        store: PublishStore
        if request.param == "memory":
            store = MemoryPublishStore(**kwargs)
        else:
            store = FilePublishStore(tmp_path / "store", segment_bytes=300, **kwargs)
        opened.append(store)
        return store

    yield make
    for store in opened:
        store.close()


def seqs(store: PublishStore) -> list[int]:
    return [p.seq for p in store.unacked()]


# ---------------------------------------------------------------- the contract, both stores


def test_seqs_count_from_one_and_unacked_gives_everything_in_order(open_store: Opener) -> None:
    store = open_store()
    assert (store.last_seq, store.discarded_through, len(store), store.bytes_kept) == (0, 0, 0, 0)
    got = [
        store.store("publish", "orders", b"a" * 10),
        store.store("delta_publish", "orders", b"bb", sow_key="k1"),
        store.store("publish", "trades/\u00e9", b""),
    ]
    assert got == [1, 2, 3]
    assert list(store.unacked()) == [
        StoredPublish(1, "publish", "orders", b"a" * 10),
        StoredPublish(2, "delta_publish", "orders", b"bb", "k1"),
        StoredPublish(3, "publish", "trades/\u00e9", b""),
    ]
    assert (store.last_seq, len(store), store.bytes_kept) == (3, 3, 12)


def test_discard_through_drops_what_the_ack_covers_and_keeps_the_rest_in_order(
    open_store: Opener,
) -> None:
    store = open_store()
    for i in range(10):
        store.store("publish", "t", bytes([i]) * 20)
    assert store.discard_through(4) == 4
    assert seqs(store) == [5, 6, 7, 8, 9, 10]
    assert (store.discarded_through, len(store), store.bytes_kept) == (4, 6, 120)
    # an older ack covers nothing new
    assert store.discard_through(2) == 0
    assert store.discarded_through == 4
    assert store.discard_through(10) == 6
    assert (seqs(store), len(store), store.bytes_kept) == ([], 0, 0)
    # numbering goes on after the highest ever assigned
    assert store.store("publish", "t", b"x") == 11
    assert seqs(store) == [11]


def test_a_logon_ack_beyond_last_seq_discards_all_and_new_seqs_follow_it(
    open_store: Opener,
) -> None:
    """The server holds more of this client name than the store remembers: new
    publishes must not reuse seqs the server would drop as duplicates."""
    store = open_store()
    store.store("publish", "t", b"x")
    assert store.discard_through(500) == 1
    assert (store.last_seq, store.discarded_through, len(store)) == (500, 500, 0)
    assert store.store("publish", "t", b"y") == 501


def test_has_room_bounds_payload_bytes_and_a_single_oversized_message_fits_alone(
    open_store: Opener,
) -> None:
    store = open_store(max_bytes=1000)
    assert store.has_room(5000)  # empty: anything fits, alone
    store.store("publish", "t", b"x" * 600)
    assert store.has_room(400)
    assert not store.has_room(401)
    store.store("publish", "t", b"x" * 400)
    assert not store.has_room(1)
    store.discard_through(1)
    assert store.has_room(600) and not store.has_room(601)
    store.discard_through(2)
    big = store.store("publish", "t", b"y" * 3000)
    assert store.bytes_kept == 3000 and not store.has_room(1)
    store.discard_through(big)
    assert store.has_room(1000)


def test_unacked_is_what_was_kept_when_called_minus_what_is_discarded_meanwhile(
    open_store: Opener,
) -> None:
    """The client replays while persisted acks may arrive; publishes stored during the
    replay are sent by their own path, not by the replay."""
    store = open_store()
    for _ in range(6):
        store.store("publish", "t", b"p" * 50)
    replay = store.unacked()
    assert next(replay).seq == 1
    store.discard_through(3)
    store.store("publish", "t", b"new")
    assert [p.seq for p in replay] == [4, 5, 6]


def test_only_publish_and_sow_delete_commands_are_kept(open_store: Opener) -> None:
    store = open_store()
    with pytest.raises(ValueError, match="publish, delta_publish, sow_delete_filter"):
        store.store("sow_delete", "t", b"x")  # a delete is kept with what selects
    assert store.store("publish", "t", b"x") == 1


def test_sow_deletes_are_kept_in_sequence_with_the_publishes(
    open_store: Opener, tmp_path: Path
) -> None:
    """A sow_delete takes the publisher's next seq; each kind keeps its selector, and
    a file store gives them back after a reopen."""
    store = open_store()
    store.store("publish", "orders", b'{"id":1}')
    store.store(SOW_DELETE_BY_FILTER, "orders", b"/id > 0")
    store.store(SOW_DELETE_BY_KEYS, "orders", b"k1,k2")
    store.store(SOW_DELETE_BY_DATA, "orders", b'{"id":1}')
    store.store("publish", "orders", b'{"id":2}')
    expected = [
        StoredPublish(1, "publish", "orders", b'{"id":1}'),
        StoredPublish(2, SOW_DELETE_BY_FILTER, "orders", b"/id > 0"),
        StoredPublish(3, SOW_DELETE_BY_KEYS, "orders", b"k1,k2"),
        StoredPublish(4, SOW_DELETE_BY_DATA, "orders", b'{"id":1}'),
        StoredPublish(5, "publish", "orders", b'{"id":2}'),
    ]
    assert list(store.unacked()) == expected
    store.discard_through(2)
    if isinstance(store, FilePublishStore):
        store.close()
        with FilePublishStore(tmp_path / "store", segment_bytes=300) as again:
            assert list(again.unacked()) == expected[2:]


# ---------------------------------------------------------------- file store: reopening


def test_reopen_keeps_what_was_not_discarded_and_continues_the_seqs(tmp_path: Path) -> None:
    directory = tmp_path / "store"
    with FilePublishStore(directory, segment_bytes=250) as store:
        for i in range(20):
            store.store("publish", f"t{i}", bytes([i]) * 40, sow_key=f"k{i}" if i % 2 else "")
        store.discard_through(7)
        want = list(store.unacked())
        store.sync()
    with FilePublishStore(directory, segment_bytes=250) as store:
        assert list(store.unacked()) == want
        assert (store.last_seq, store.discarded_through, len(store)) == (20, 7, 13)
        assert store.bytes_kept == 13 * 40
        assert store.store("publish", "t", b"z") == 21


def test_an_empty_file_store_remembers_its_last_seq(tmp_path: Path) -> None:
    directory = tmp_path / "store"
    with FilePublishStore(directory, segment_bytes=100) as store:
        for _ in range(30):
            store.store("publish", "t", b"x" * 30)
        store.discard_through(30)
    with FilePublishStore(directory, segment_bytes=100) as store:
        assert (store.last_seq, len(store), seqs(store)) == (30, 0, [])
    with FilePublishStore(directory) as store:
        assert store.store("publish", "t", b"x") == 31
        store.discard_through(1000)
    with FilePublishStore(directory) as store:
        assert store.last_seq == 1000
        assert store.store("publish", "t", b"x") == 1001


def test_segments_whose_records_are_all_discarded_are_deleted(tmp_path: Path) -> None:
    directory = tmp_path / "store"
    with FilePublishStore(directory, segment_bytes=200) as store:
        for _ in range(40):
            store.store("publish", "t", b"x" * 50)  # about 2 records a segment
        segments = sorted(directory.glob("seg-*.aps"))
        assert len(segments) == 20
        store.discard_through(35)
        left = sorted(directory.glob("seg-*.aps"))
        assert len(left) == 3  # 35..36, 37..38, 39..40
        assert seqs(store) == [36, 37, 38, 39, 40]
        store.discard_through(40)
        assert len(list(directory.glob("seg-*.aps"))) == 1  # the last one stays
    with FilePublishStore(directory) as store:
        assert (store.last_seq, len(store)) == (40, 0)


def test_a_record_larger_than_a_segment_gets_a_segment_of_its_own(tmp_path: Path) -> None:
    directory = tmp_path / "store"
    with FilePublishStore(directory, segment_bytes=100) as store:
        store.store("publish", "t", b"a" * 10)
        store.store("publish", "t", b"b" * 1000)
        store.store("publish", "t", b"c" * 10)
    with FilePublishStore(directory, segment_bytes=100) as store:
        assert [p.data[:1] for p in store.unacked()] == [b"a", b"b", b"c"]
        assert len(list(directory.glob("seg-*.aps"))) == 3


# ---------------------------------------------------------------- file store: crashes

CHILD = textwrap.dedent(
    """
    import random, sys
    from amps_py.client.publish_store import FilePublishStore

    def payload(seq):
        size = random.Random(seq).randrange(0, 2_000_000 if seq % 4 == 0 else 30_000)
        return (seq.to_bytes(8, "big") * (size // 8 + 1))[:size]

    def say(line):  # one write per line: print() may write a line in pieces
        sys.stdout.write(line + "\\n")
        sys.stdout.flush()

    store = FilePublishStore(sys.argv[1], segment_bytes=1_000_000)
    for _ in range(int(sys.argv[2])):
        seq = store.last_seq + 1
        got = store.store("publish", f"topic-{seq}", payload(seq), sow_key=f"k{seq}")
        assert got == seq, (got, seq)
        say(f"stored {seq}")
        if seq % 37 == 0:
            store.discard_through(seq - 20)
            say(f"discarded {seq - 20}")
        if seq % 100 == 0:
            store.sync()
    say("done")
    """
)


def payload(seq: int) -> bytes:
    """What the child stores as ``seq``: sizes up to 2 MB, so a kill often lands in
    the middle of a write."""
    size = random.Random(seq).randrange(0, 2_000_000 if seq % 4 == 0 else 30_000)
    return (seq.to_bytes(8, "big") * (size // 8 + 1))[:size]


CRASH_SEED = 16_0001


def test_a_publisher_killed_at_random_moments_finds_every_returned_store_on_reopen(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """kill -9 mid-stream, several rounds on the same directory: each reopen finds
    a gapless run of intact publishes that holds everything store() returned for
    (what the child printed), and the seqs go on from there."""
    print(f"crash seed {CRASH_SEED}")
    rng = random.Random(CRASH_SEED)
    directory = tmp_path / "store"
    stored = discarded = 0
    for round_ in range(10):
        kill_after = rng.randrange(1, 120)
        child = subprocess.Popen(
            [sys.executable, "-c", CHILD, str(directory), "100000"],
            stdout=subprocess.PIPE,
            cwd=REPO,
        )
        assert child.stdout is not None
        printed: list[str] = []
        while len(printed) < kill_after:
            line = child.stdout.readline().decode()
            assert line, f"the child died on its own: {printed[-3:]}"
            printed.append(line)
        child.send_signal(signal.SIGKILL)
        # what it printed before it died; an unfinished last line does not count
        printed += child.stdout.read().decode().rpartition("\n")[0].splitlines()
        child.wait()
        child.stdout.close()
        assert child.returncode == -signal.SIGKILL
        for line in printed:
            what, _, number = line.strip().partition(" ")
            if what == "stored":
                stored = int(number)
            elif what == "discarded":
                discarded = int(number)
        caplog.clear()
        with caplog.at_level(logging.WARNING), FilePublishStore(directory) as store:
            kept = list(store.unacked())
            torn = "unfinished record" in caplog.text
            print(
                f"round {round_}: killed after {len(printed)} lines; last printed store "
                f"{stored}, discard {discarded}; reopened: last_seq {store.last_seq}, "
                f"discarded_through {store.discarded_through}, kept {len(kept)}"
                f"{', torn tail truncated' if torn else ''}"
            )
            # at most the one store (discard) in flight when killed went further
            assert store.last_seq in (stored, stored + 1)
            assert store.discarded_through >= discarded
            assert store.discarded_through <= store.last_seq
            assert [p.seq for p in kept] == list(
                range(store.discarded_through + 1, store.last_seq + 1)
            )
            for p in kept:
                assert (p.topic, p.sow_key, p.data) == (
                    f"topic-{p.seq}",
                    f"k{p.seq}",
                    payload(p.seq),
                )
            stored = store.last_seq
            discarded = store.discarded_through
    assert stored > 0


@pytest.mark.parametrize("tail", ["half header", "short body", "zero fill"])
def test_a_torn_tail_is_truncated_with_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, tail: str
) -> None:
    directory = tmp_path / "store"
    with FilePublishStore(directory) as store:
        for i in range(3):
            store.store("publish", "t", bytes([i]) * 100)
    (segment,) = directory.glob("seg-*.aps")
    intact = segment.stat().st_size
    record = codec.encode_record(4, "publish", "t", "", b"d" * 100)
    torn = {"half header": record[:10], "short body": record[:-30], "zero fill": bytes(4096)}
    with open(segment, "ab") as f:
        f.write(torn[tail])
    with caplog.at_level(logging.WARNING), FilePublishStore(directory) as store:
        assert seqs(store) == [1, 2, 3]
        assert segment.stat().st_size == intact
        assert store.store("publish", "t", b"next") == 4
    assert f"{segment} ends with an unfinished record at offset {intact}" in caplog.text
    with FilePublishStore(directory) as store:
        assert [p.data for p in store.unacked()][-1] == b"next"


@pytest.mark.parametrize("where", ["header", "body"])
def test_a_damaged_record_in_the_middle_is_an_error_naming_file_and_offset(
    tmp_path: Path, where: str
) -> None:
    directory = tmp_path / "store"
    with FilePublishStore(directory) as store:
        for i in range(3):
            store.store("publish", "t", bytes([i]) * 100)
    (segment,) = directory.glob("seg-*.aps")
    second = len(codec.SEGMENT_MAGIC) + len(codec.encode_record(1, "publish", "t", "", b"x" * 100))
    raw = bytearray(segment.read_bytes())
    raw[second + (14 if where == "header" else codec.HEADER.size + 50)] ^= 0x40
    segment.write_bytes(bytes(raw))
    with pytest.raises(PublishStoreDamaged) as caught:
        FilePublishStore(directory)
    message = str(caught.value)
    assert f"{segment} is damaged at offset {second}" in message
    assert f"truncate -s {second} {segment}" in message
    assert segment.read_bytes() == bytes(raw)  # nothing dropped
    # the directory is not left locked by the failed open
    with pytest.raises(PublishStoreDamaged):
        FilePublishStore(directory)


def test_an_unfinished_record_in_an_earlier_segment_is_damage_not_a_torn_tail(
    tmp_path: Path,
) -> None:
    """Starting a segment fsyncs the one before, so only the last can end torn."""
    directory = tmp_path / "store"
    with FilePublishStore(directory, segment_bytes=150) as store:
        for _ in range(4):
            store.store("publish", "t", b"x" * 100)
    first = sorted(directory.glob("seg-*.aps"))[0]
    os.truncate(first, first.stat().st_size - 20)
    with pytest.raises(PublishStoreDamaged, match="not the last segment"):
        FilePublishStore(directory, segment_bytes=150)


def test_a_damaged_marker_brings_publishes_back_rather_than_losing_any(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    directory = tmp_path / "store"
    with FilePublishStore(directory) as store:
        for _ in range(5):
            store.store("publish", "t", b"x")
        store.discard_through(3)
    (directory / "discarded").write_bytes(b"discarded_through 3 crc32 00000000\n")
    with caplog.at_level(logging.WARNING), FilePublishStore(directory) as store:
        assert seqs(store) == [1, 2, 3, 4, 5]
    assert "discarded is damaged" in caplog.text


def test_a_torn_marker_slot_falls_back_to_the_other_slot(tmp_path: Path) -> None:
    directory = tmp_path / "store"
    with FilePublishStore(directory) as store:
        for _ in range(5):
            store.store("publish", "t", b"x")
        store.discard_through(2)  # slot 0
        store.discard_through(4)  # slot 1
    marker = directory / "discarded"
    raw = bytearray(marker.read_bytes())
    raw[codec.MARKER_SLOT + 20 :] = bytes(len(raw) - codec.MARKER_SLOT - 20)
    marker.write_bytes(bytes(raw))
    with FilePublishStore(directory) as store:
        assert (store.discarded_through, seqs(store)) == (2, [3, 4, 5])


def test_a_second_opener_of_a_directory_is_refused_naming_it(tmp_path: Path) -> None:
    directory = tmp_path / "store"
    with FilePublishStore(directory) as store:
        store.store("publish", "t", b"x")
        with pytest.raises(PublishStoreInUse) as caught:
            FilePublishStore(directory)
        assert f"{directory} is already in use (by process {os.getpid()})" in str(caught.value)
        child = subprocess.run(
            [
                sys.executable,
                "-c",
                "import sys; from amps_py.client.publish_store import FilePublishStore as S; "
                "S(sys.argv[1])",
                str(directory),
            ],
            capture_output=True,
            cwd=REPO,
        )
        assert child.returncode != 0
        assert f"{directory} is already in use" in child.stderr.decode()
        assert seqs(store) == [1]
    with FilePublishStore(directory) as store:  # released by close()
        assert seqs(store) == [1]


def test_a_directory_that_cannot_be_created_names_the_path_and_the_fix(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    with pytest.raises(PublishStoreError) as caught:
        FilePublishStore(blocker / "store")
    assert str(blocker / "store") in str(caught.value)
    assert "choose another" in str(caught.value)


def test_a_full_disk_fails_store_with_the_file_named_and_leaves_the_store_as_it_was(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    directory = tmp_path / "store"
    store = FilePublishStore(directory)
    store.store("publish", "t", b"a" * 100)
    (segment,) = directory.glob("seg-*.aps")
    real_pwrite = os.pwrite

    def half_then_full(fd: int, data: bytes | memoryview, offset: int) -> int:
        if len(data) > 8:  # a partial write, then the disk is full
            return real_pwrite(fd, bytes(data[: len(data) // 2]), offset)
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "pwrite", half_then_full)
    with pytest.raises(PublishStoreError) as caught:
        store.store("publish", "t", b"b" * 100)
    monkeypatch.undo()
    assert caught.value.errno == errno.ENOSPC
    assert f"cannot write {segment}" in str(caught.value)
    assert "file system is full" in str(caught.value)
    assert (store.last_seq, len(store), seqs(store)) == (1, 1, [1])
    assert store.store("publish", "t", b"c" * 100) == 2
    store.close()
    with FilePublishStore(directory) as store:
        assert [p.data[:1] for p in store.unacked()] == [b"a", b"c"]


# ---------------------------------------------------------------- against a model

MODEL_SEED = 16_0002
_model_seed_printed: list[bool] = []
OPS = st.lists(
    st.one_of(
        st.tuples(st.just("store"), st.integers(0, 120)),
        st.tuples(st.just("discard"), st.integers(-3, 12)),
        st.tuples(st.just("reopen"), st.just(0)),
        st.tuples(st.just("sync"), st.just(0)),
        st.tuples(st.just("jump"), st.integers(1, 50)),
    ),
    max_size=60,
)


@seed(MODEL_SEED)
@settings(max_examples=150, deadline=None, database=None)
@given(ops=OPS, file=st.booleans(), segment_bytes=st.sampled_from([60, 200, 4096]))
def test_random_store_discard_reopen_sequences_match_a_model(
    ops: list[tuple[str, int]], file: bool, segment_bytes: int
) -> None:
    if not _model_seed_printed:
        _model_seed_printed.append(True)
        print(f"hypothesis seed {MODEL_SEED}")
    with tempfile.TemporaryDirectory() as tmp:

        def open_() -> PublishStore:
            if file:
                return FilePublishStore(Path(tmp), max_bytes=500, segment_bytes=segment_bytes)
            return MemoryPublishStore(max_bytes=500)

        store = open_()
        kept: list[StoredPublish] = []
        last = discarded = 0
        try:
            for op, arg in ops:
                if op == "store":
                    room = not kept or sum(len(p.data) for p in kept) + arg <= 500
                    assert store.has_room(arg) == room
                    data = bytes([last % 251]) * arg
                    seq = store.store("publish", f"t{last}", data, sow_key=str(arg))
                    last += 1
                    assert seq == last
                    kept.append(StoredPublish(seq, "publish", f"t{seq - 1}", data, str(arg)))
                elif op in ("discard", "jump"):
                    through = last + arg if op == "jump" else discarded + arg
                    want = [p for p in kept if p.seq <= through]
                    assert store.discard_through(through) == len(want)
                    kept = kept[len(want) :]
                    discarded = max(discarded, through)
                    last = max(last, discarded)
                elif op == "reopen" and file:
                    store.close()
                    store = open_()
                elif op == "sync":
                    store.sync()
                assert list(store.unacked()) == kept
                assert (store.last_seq, store.discarded_through, len(store)) == (
                    last,
                    discarded,
                    len(kept),
                )
                assert store.bytes_kept == sum(len(p.data) for p in kept)
        finally:
            store.close()
