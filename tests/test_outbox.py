"""The spilling outbox (amps_py.server.outbox): one client's waiting bytes, in memory or
spilled to disk while the client is offlined.

What a user relies on: the bytes reach the client in the order they were queued, each
frame whole, whether or not the client was offlined in between; the memory and disk
figures the limits act on are exact; an offlined client's files go away when it catches
up or is disconnected; a disk problem is an error that names the file and the fix; and a
slow client's backlog does not sit in memory while it is offline.
"""

from __future__ import annotations

import errno
import hashlib
import os
import tempfile
import time
import tracemalloc
from collections import deque
from pathlib import Path

import pytest
from hypothesis import given, seed, settings
from hypothesis import strategies as st

from amps_py.server import outbox as outbox_module
from amps_py.server.outbox import SpillError, SpillingOutbox

# ---------------------------------------------------------------- helpers


def drain(box: SpillingOutbox, max_bytes: int = 1 << 20) -> list[bytes]:
    """Take until take returns nothing, as a sender loop does."""
    out: list[bytes] = []
    while got := box.take(max_bytes):
        out.extend(got)
    assert len(box) == 0, "take returned nothing while pieces were queued"
    return out


def piece(i: int, size: int) -> bytes:
    """A piece whose bytes say which it is (so a reordering cannot go unnoticed)."""
    tag = f"<{i}>".encode()
    return (tag * (size // len(tag) + 1))[:size] if size >= len(tag) else tag


def fail_writes_of(box: SpillingOutbox, monkeypatch: pytest.MonkeyPatch, err: int) -> None:
    """Make writes to ``box``'s spill files fail with ``err`` (other writes go through)."""
    real_write = os.write

    def write(fd: int, data: bytes) -> int:
        if fd in {segment.fd for segment in box._segments}:
            raise OSError(err, os.strerror(err))
        return real_write(fd, data)

    monkeypatch.setattr(outbox_module.os, "write", write)


# ---------------------------------------------------------------- online basics


def test_take_returns_whole_pieces_in_order_within_max_bytes() -> None:
    box = SpillingOutbox("c")
    for data in (b"aaaa", b"bb", b"cccccccccc", b"d"):
        box.append(data, 0.0)
    assert box.take(6) == [b"aaaa", b"bb"]
    # a piece larger than max_bytes comes whole and alone, never split
    assert box.take(3) == [b"cccccccccc"]
    assert box.take(3) == [b"d"]
    assert box.take(3) == []
    assert len(box) == 0 and box.queued_bytes == 0


def test_bad_arguments_are_refused_with_the_parameter_named(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="write_batch"):
        SpillingOutbox("c", write_batch=0)
    box = SpillingOutbox("c")
    with pytest.raises(ValueError, match="max_bytes"):
        box.take(0)
    box.go_offline(tmp_path)
    with pytest.raises(RuntimeError, match="already offline"):
        box.go_offline(tmp_path)
    box.discard()


# ---------------------------------------------------------------- order across transitions

SEED = 14_0002
_seed_printed: list[bool] = []
OPS = st.lists(
    st.one_of(
        st.tuples(st.just("append"), st.integers(0, 300)),
        st.tuples(st.just("take"), st.integers(1, 700)),
        st.tuples(st.just("offline"), st.just(0)),
        st.tuples(st.just("spill"), st.integers(1, 500)),
        st.tuples(st.just("tick"), st.integers(0, 5)),
    ),
    max_size=120,
)


@seed(SEED)
@settings(max_examples=300, deadline=None, database=None)
@given(ops=OPS, write_batch=st.sampled_from([1, 64, 1000]), read_block=st.integers(1, 500))
def test_random_appends_and_takes_match_an_in_memory_queue_across_offlining(
    ops: list[tuple[str, int]], write_batch: int, read_block: int
) -> None:
    """Whatever the interleaving of appends, takes, offlining and steps of writing a
    moved backlog (with tiny batches,
    blocks and segments so records straddle every boundary), the outbox hands out
    exactly what a plain in-memory queue would, and its figures are exact."""
    if not _seed_printed:
        _seed_printed.append(True)
        print(f"hypothesis seed {SEED}")
    with tempfile.TemporaryDirectory() as tmp:
        directory = Path(tmp)
        box = SpillingOutbox(
            "conn-1", write_batch=write_batch, segment_bytes=700, read_block=read_block
        )
        reference: deque[tuple[bytes, float]] = deque()
        now = 0.0
        counter = 0
        sent: list[bytes] = []
        expected: list[bytes] = []
        for op, arg in ops:
            if op == "append":
                data = piece(counter, arg)
                counter += 1
                box.append(data, now)
                reference.append((data, now))
            elif op == "take":
                was_offline = box.offline
                got = box.take(arg)
                sent.extend(got)
                # the same pieces an in-memory queue gives: whole, in order, within
                # max_bytes unless the first alone is larger
                want: list[bytes] = []
                size = 0
                while reference and (not want or size + len(reference[0][0]) <= arg):
                    data = reference.popleft()[0]
                    want.append(data)
                    size += len(data)
                    if size >= arg:
                        break
                expected.extend(want)
                assert got == want
                if was_offline and not reference:
                    assert not box.offline
                    assert box.poll_transition() == "online"
                else:
                    assert box.offline == was_offline
                    assert box.poll_transition() is None
            elif op == "offline":
                if not box.offline:
                    box.go_offline(directory)
            elif op == "spill":
                box.spill(arg)
            else:
                now += arg
            queued = sum(len(data) for data, _ in reference)
            assert len(box) == len(reference)
            assert box.queued_bytes == queued
            if box.offline:
                assert (box.memory_bytes, box.disk_bytes) == (0, queued)
            else:
                assert (box.memory_bytes, box.disk_bytes) == (queued, 0)
                assert box.spill_paths == () and not list(directory.iterdir())
            assert box.oldest_age(now) == (now - reference[0][1] if reference else 0.0)
        rest = drain(box, 97)
        assert rest == [data for data, _ in reference]
        assert sent + rest == expected + rest
        assert not box.offline and not list(directory.iterdir())


def test_offline_then_online_again_keeps_the_wire_bytes_identical(tmp_path: Path) -> None:
    box = SpillingOutbox("c", write_batch=100, segment_bytes=1000, read_block=64)
    appended = [piece(i, 10 + i % 37) for i in range(300)]
    taken: list[bytes] = []
    for i, data in enumerate(appended):
        box.append(data, float(i))
        if i == 50:
            box.go_offline(tmp_path)
        if i % 3 == 0:
            taken += box.take(40)
        if i == 200:
            taken += drain(box)  # catches up: online again
            assert not box.offline and box.poll_transition() == "online"
        if i == 250:
            box.go_offline(tmp_path)
    taken += drain(box)
    assert b"".join(taken) == b"".join(appended)
    assert taken == appended


# ---------------------------------------------------------------- ages and accounting


def test_oldest_age_is_exact_online_offline_and_back(tmp_path: Path) -> None:
    box = SpillingOutbox("c", write_batch=1 << 20)
    assert box.oldest_age(5.0) == 0.0
    box.append(b"a" * 10, 1.0)
    box.append(b"b" * 10, 2.0)
    assert box.oldest_age(10.0) == 9.0
    box.go_offline(tmp_path)
    # the head is on disk now: its time comes from the record header
    assert box.oldest_age(10.0) == 9.0
    box.append(b"c" * 10, 3.0)  # buffered, not yet written
    assert box.take(10) == [b"a" * 10]
    assert box.oldest_age(10.0) == 8.0
    assert box.take(10) == [b"b" * 10]
    assert box.oldest_age(10.0) == 7.0  # the head is the buffered append
    assert box.take(10) == [b"c" * 10]
    assert not box.offline and box.oldest_age(10.0) == 0.0
    box.append(b"d", 20.0)
    assert box.oldest_age(21.5) == 1.5


def test_memory_and_disk_accounting_is_exact(tmp_path: Path) -> None:
    box = SpillingOutbox("c", write_batch=25)
    for i in range(4):
        box.append(b"x" * 10, float(i))
    assert (box.memory_bytes, box.disk_bytes, len(box)) == (40, 0, 4)
    box.go_offline(tmp_path)
    assert (box.memory_bytes, box.disk_bytes) == (0, 40)
    # the first batch (25 bytes: three pieces) is written at once, a 12-byte header per
    # record; the fourth waits in the write batch, counted on disk all the same
    assert box.file_bytes == 3 * (12 + 10)
    box.append(b"y" * 7, 5.0)
    assert (box.memory_bytes, box.disk_bytes, len(box)) == (0, 47, 5)
    box.take(15)
    assert (box.memory_bytes, box.disk_bytes, len(box)) == (0, 37, 4)
    stats = box.statistics()
    assert stats.offline and stats.offline_count == 1 and stats.disk_bytes == 37
    assert stats.spill_paths == box.spill_paths and len(stats.spill_paths) == 1
    drain(box)
    assert (box.memory_bytes, box.disk_bytes, box.file_bytes) == (0, 0, 0)


def test_a_large_backlog_is_written_a_step_at_a_time_and_delivered_in_order(
    tmp_path: Path,
) -> None:
    """Offlining a client with a big backlog writes one batch at once and leaves the
    rest to ``spill`` steps (so the server is never stalled by one long write); pieces
    the writer reaches before they are written are handed over directly. Either way
    the client gets every piece, in order, and the memory the backlog held goes as
    it is written."""
    box = SpillingOutbox("c", write_batch=1000)
    pieces = [piece(i, 100) for i in range(200)]  # 20,000 bytes
    for data in pieces:
        box.append(data, 0.0)
    box.go_offline(tmp_path)
    assert box.file_bytes == 10 * (12 + 100)  # one batch written
    assert box.unwritten_backlog == 20_000 - 1000 - 1000
    assert box.spill(5000) == 18_000 - 5000
    assert box.file_bytes == 60 * (12 + 100)
    later = [piece(1000 + i, 100) for i in range(30)]
    for data in later:
        box.append(data, 0.0)  # appends help: each full batch writes two batches' worth
    assert box.file_bytes > 60 * (12 + 100)
    got = box.take(10_000)  # from the file first
    while box.spill(3000):
        pass
    assert box.unwritten_backlog == 0
    got += drain(box, 700)
    assert got == pieces + later
    assert not box.offline and list(tmp_path.iterdir()) == []


def test_a_slow_writer_takes_unwritten_backlog_directly(tmp_path: Path) -> None:
    box = SpillingOutbox("c", write_batch=100)
    pieces = [piece(i, 50) for i in range(40)]
    for data in pieces:
        box.append(data, 0.0)
    box.go_offline(tmp_path)
    assert box.file_bytes == 2 * (12 + 50)
    # nothing more is spilled: the writer reads the file, then takes the rest as it is
    assert drain(box, 120) == pieces
    assert not box.offline and list(tmp_path.iterdir()) == []


def test_a_read_block_smaller_than_a_record_header_still_reads_whole_records(
    tmp_path: Path,
) -> None:
    """A tiny ``read_block`` (below the 12-byte record header) reads at least a header
    and then the whole record: the writer never gets nothing while pieces wait (found
    by the random interleavings with another hypothesis version)."""
    box = SpillingOutbox("c", write_batch=1, read_block=1)
    box.go_offline(tmp_path)
    box.append(b"<0>", 0.0)  # written at once (a batch of 1 byte)
    box.append(b"<1>", 0.0)
    assert box.take(1) == [b"<0>"]
    assert box.take(1) == [b"<1>"]
    assert not box.offline


def test_zero_length_pieces_are_kept_in_place(tmp_path: Path) -> None:
    box = SpillingOutbox("c")
    box.append(b"a", 0.0)
    box.go_offline(tmp_path)
    box.append(b"", 0.0)
    assert box.take(1) == [b"a"]
    # only an empty piece is left: no bytes, but still a piece to deliver in its place
    assert (len(box), box.disk_bytes, box.offline) == (1, 0, True)
    box.append(b"b", 0.0)
    assert box.take(1) == [b"", b"b"]
    assert not box.offline


# ---------------------------------------------------------------- spill files


def test_spill_files_are_named_after_the_connection_and_unique(tmp_path: Path) -> None:
    one = SpillingOutbox("client/a b:7")
    two = SpillingOutbox("client/a b:7")
    for box in (one, two):
        box.append(b"x", 0.0)
        box.go_offline(tmp_path)
    (a,), (b,) = one.spill_paths, two.spill_paths
    assert a != b and a.parent == tmp_path == b.parent
    assert a.name.startswith("amps-py-spill-client_a_b_7-") and a.name.endswith(".spill")
    one.discard()
    two.discard()


def test_spill_files_are_removed_after_coming_back_online(tmp_path: Path) -> None:
    box = SpillingOutbox("c", write_batch=10, segment_bytes=100)
    for i in range(50):
        box.append(piece(i, 20), 0.0)
    box.go_offline(tmp_path)
    while box.spill(100):
        pass
    assert len(list(tmp_path.iterdir())) > 1  # several segments
    drain(box, 50)
    assert box.poll_transition() == "online"
    assert box.poll_transition() is None  # reported once
    assert list(tmp_path.iterdir()) == []
    box.append(b"after", 1.0)  # in memory again
    assert (box.memory_bytes, box.disk_bytes) == (5, 0) and list(tmp_path.iterdir()) == []


def test_discard_removes_the_spill_files_and_empties_the_outbox(tmp_path: Path) -> None:
    box = SpillingOutbox("c", write_batch=10)
    box.append(b"x" * 100, 0.0)
    box.go_offline(tmp_path)
    box.append(b"y" * 100, 0.0)
    assert list(tmp_path.iterdir())
    box.discard()
    assert list(tmp_path.iterdir()) == []
    assert (len(box), box.queued_bytes, box.offline) == (0, 0, False)
    assert box.take(10) == [] and box.poll_transition() is None


def test_read_segments_are_deleted_while_an_offline_client_drains(tmp_path: Path) -> None:
    """A client that stays offline while it reads does not grow its files forever:
    the spill files hold its unread backlog plus at most about two segments."""
    segment = 10_000
    box = SpillingOutbox("c", write_batch=1000, segment_bytes=segment, read_block=500)
    box.append(b"first", 0.0)
    box.go_offline(tmp_path)
    written = 0
    worst_slack = 0
    for i in range(5000):
        box.append(piece(i, 100), 0.0)
        written += 12 + 100
        if i % 4:
            box.take(100)  # reads 3 of every 4 pieces sent: stays offline
        assert box.offline
        # every unread record on disk is 12 header bytes + its payload
        unread_records = box.disk_bytes * 112 // 100
        worst_slack = max(worst_slack, box.file_bytes - unread_records)
    print(
        f"{written} bytes written to spill files; backlog at the end {box.disk_bytes}, "
        f"files {box.file_bytes}, worst slack over the backlog {worst_slack}"
    )
    assert worst_slack <= 2 * segment + 1000
    assert box.file_bytes < written // 2
    drain(box)
    assert list(tmp_path.iterdir()) == []


# ---------------------------------------------------------------- disk errors


def test_a_missing_message_disk_path_is_a_spill_error_and_nothing_is_lost(
    tmp_path: Path,
) -> None:
    box = SpillingOutbox("c")
    box.append(b"kept", 1.0)
    missing = tmp_path / "no-such-dir"
    with pytest.raises(SpillError) as caught:
        box.go_offline(missing)
    message = str(caught.value)
    assert str(missing) in message and "MessageDiskPath" in message
    assert caught.value.errno == errno.ENOENT
    # still online, backlog intact
    assert not box.offline and box.memory_bytes == 4
    assert box.take(100) == [b"kept"]


def test_a_message_disk_path_that_is_a_file_is_a_spill_error(tmp_path: Path) -> None:
    not_a_dir = tmp_path / "file"
    not_a_dir.write_text("")
    box = SpillingOutbox("c")
    box.append(b"kept", 1.0)
    with pytest.raises(SpillError, match="MessageDiskPath") as caught:
        box.go_offline(not_a_dir)
    assert str(not_a_dir) in str(caught.value)
    assert not box.offline and box.take(100) == [b"kept"]


@pytest.mark.skipif(os.geteuid() == 0, reason="root may write to a read-only directory")
def test_an_unwritable_message_disk_path_is_a_spill_error(tmp_path: Path) -> None:
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o500)
    box = SpillingOutbox("c")
    box.append(b"kept", 1.0)
    try:
        with pytest.raises(SpillError, match="write permission") as caught:
            box.go_offline(locked)
        assert str(locked) in str(caught.value)
    finally:
        locked.chmod(0o700)


def test_a_full_disk_while_offlining_leaves_the_outbox_online_and_no_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    box = SpillingOutbox("c")
    box.append(b"kept" * 100, 1.0)
    fail_writes_of(box, monkeypatch, errno.ENOSPC)
    with pytest.raises(SpillError) as caught:
        box.go_offline(tmp_path)
    message = str(caught.value)
    assert "amps-py-spill-c-" in message and str(tmp_path) in message
    assert "free space" in message and "MessageDiskPath" in message
    assert caught.value.errno == errno.ENOSPC
    assert list(tmp_path.iterdir()) == []
    assert not box.offline and box.memory_bytes == 400


def test_a_full_disk_while_offline_is_a_spill_error_naming_the_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    box = SpillingOutbox("c", write_batch=100)
    box.append(b"x", 1.0)
    box.go_offline(tmp_path)
    (path,) = box.spill_paths
    fail_writes_of(box, monkeypatch, errno.ENOSPC)
    with pytest.raises(SpillError) as caught:
        for _ in range(10):
            box.append(b"y" * 50, 2.0)  # the batch write fails
    assert caught.value.path == path and str(path) in str(caught.value)
    assert "No space left on device" in str(caught.value)
    box.discard()  # what the caller does: disconnect the client, drop its backlog
    assert list(tmp_path.iterdir()) == []


def test_a_spill_file_truncated_under_the_server_is_a_spill_error(tmp_path: Path) -> None:
    box = SpillingOutbox("c")
    box.append(b"x" * 1000, 1.0)
    box.go_offline(tmp_path)
    (path,) = box.spill_paths
    os.truncate(path, 10)
    with pytest.raises(SpillError, match="shorter than written") as caught:
        box.take(100)
    assert caught.value.path == path
    box.discard()
    assert not path.exists()


# ---------------------------------------------------------------- large data, bounded memory


def test_100_mb_through_a_slow_client_keeps_memory_bounded(tmp_path: Path) -> None:
    """100 MB for a client that reads at half the rate it is sent to: with a 1 MiB
    memory share it is offlined, the backlog (~50 MB at its peak) sits on disk, and
    what the outbox holds in memory stays a few MiB; the bytes arrive intact."""
    total = 100 * 1024 * 1024
    size = 4096
    memory_share = 1024 * 1024
    base = os.urandom(size)
    sent_hash = hashlib.sha256()
    got_hash = hashlib.sha256()
    got_bytes = 0
    biggest_disk = 0
    box = SpillingOutbox("bulk")
    tracemalloc.start()
    started = time.perf_counter()
    try:
        for i in range(total // size):
            data = i.to_bytes(8, "big") + base[8:]
            sent_hash.update(data)
            box.append(data, float(i))
            if not box.offline and box.memory_bytes > memory_share:
                box.go_offline(tmp_path)
            if i % 2:
                for out in box.take(size):
                    got_hash.update(out)
                    got_bytes += len(out)
            biggest_disk = max(biggest_disk, box.disk_bytes)
        while len(box):
            for out in box.take(1024 * 1024):
                got_hash.update(out)
                got_bytes += len(out)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    elapsed = time.perf_counter() - started
    print(
        f"{total >> 20} MiB through in {elapsed:.1f}s (tracemalloc on); "
        f"largest backlog on disk {biggest_disk / 2**20:.1f} MiB; "
        f"peak traced memory {peak / 2**20:.2f} MiB"
    )
    assert got_bytes == total and got_hash.digest() == sent_hash.digest()
    assert biggest_disk > 40 * 1024 * 1024  # it really was offline with a big backlog
    assert peak < 8 * 1024 * 1024
    assert not box.offline and list(tmp_path.iterdir()) == []
