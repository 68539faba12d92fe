"""Power loss against the commit scheme: writes not yet synced are dropped.

The journal acknowledges a batch once its commit log frame is synced (``fdatasync``), and
commits LMDB behind it (``sync`` on, ``metasync`` off: a commit's meta page becomes
durable with the next commit or ``env.sync``). A power loss may therefore leave:

- each commit log file as synced, and after the last synced frame whatever part of
  the next (unsynced) write the disk happened to keep: nothing, garbage, or a prefix
  or all of a real frame;
- ``data.mdb`` as of the last LMDB commit or the one before it (the last commit's meta
  page may be lost), or of the last commit after which LMDB was synced, if newer (a
  big batch skips the log: LMDB commits and syncs it).

These tests build such images from a journal driven like the server drives it (batches
staged, LMDB committed every few batches, the log rotating through small files), at
seeded random moments, and check that opening each image recovers every acknowledged
record exactly, continues the txids, and verifies clean.
"""

from __future__ import annotations

import random
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from txlog import Journal, JournalDamaged, JournalError, Record
from txlog.commitlog import CommitLog, encode_batch, log_files, read_file, read_log
from txlog.journal import DIRECT_RECORDS

SEED = 1726
LOG_FILE_SIZE = 16 * 1024  # small files: the log rotates (and is released) often


def record(pub: int, seq: int, size: int) -> Record:
    return Record(
        topic=f"t{pub}",
        payload=(f'{{"p":{pub},"s":{seq},"x":"' + "y" * size + '"}').encode(),
        pub_hash=1000 + pub,
        seq=seq,
        client_name=f"pub-{pub}",
    )


class Image:
    """A power-loss image: what the disk may hold at one moment."""

    def __init__(
        self, lmdb_copy: Path, logs: dict[str, bytes], acked: dict[int, tuple[int, int]]
    ) -> None:
        self.lmdb_copy = lmdb_copy
        self.logs = logs
        self.acked = dict(acked)

    def write(self, target: Path, rng: random.Random, next_frame: bytes) -> str:
        """Lay the image out in ``target`` with one kind of unsynced tail; return which."""
        target.mkdir(parents=True)
        shutil.copy(self.lmdb_copy, target / "data.mdb")
        names = sorted(self.logs)
        for name in names:
            (target / name).write_bytes(self.logs[name])
        tail = rng.choice(["none", "garbage", "prefix", "whole"])
        if names and tail != "none":
            newest = target / names[-1]
            data = bytearray(newest.read_bytes())
            end = len(data.rstrip(b"\0"))  # the synced frames end where the zeros begin
            if tail == "garbage":
                junk = rng.randbytes(rng.randint(1, 300))
            elif tail == "prefix":
                junk = next_frame[: rng.randint(1, len(next_frame) - 1)]
            else:
                junk = next_frame
            if end + len(junk) <= len(data):
                data[end : end + len(junk)] = junk
                newest.write_bytes(bytes(data))
            else:
                tail = "none"
        return tail


def drive(tmp_path: Path, rng: random.Random, images_wanted: int) -> list[tuple[Image, bytes]]:
    """Run a journal the way the server does and take power-loss images on the way."""
    path = tmp_path / "live"
    journal = Journal(path, instance_name="crash")
    assert journal._log is not None
    journal._log.file_size = LOG_FILE_SIZE
    lmdb_states: list[Path] = []  # data.mdb after each LMDB commit (and at open)

    def keep_lmdb_state() -> None:
        copy = tmp_path / f"lmdb-{len(lmdb_states)}"
        shutil.copy(path / "data.mdb", copy)
        lmdb_states.append(copy)

    keep_lmdb_state()
    floor = 0
    bigs = 0
    acked: dict[int, tuple[int, int]] = {}  # txid -> (pub, seq)
    seqs = [0] * 4
    images: list[tuple[Image, bytes]] = []
    try:
        for step in range(400):
            batch: list[Record] = []
            big = rng.random() < 0.03  # made durable in LMDB itself, not the log
            for _ in range(DIRECT_RECORDS if big else rng.randint(1, 12)):
                pub = rng.randrange(4)
                if seqs[pub] and rng.random() < 0.1:
                    batch.append(record(pub, rng.randint(1, seqs[pub]), 10))  # a duplicate
                else:
                    seqs[pub] += 1
                    batch.append(record(pub, seqs[pub], 5 if big else rng.randint(0, 600)))
            cursors = {"up": (step, f"9|{step}|")} if rng.random() < 0.2 else None
            txids = journal.stage(batch, 1_000_000 + step * 1000, cursors=cursors)
            for rec, txid in zip(batch, txids, strict=True):
                if txid > 0:
                    acked[txid] = (rec.pub_hash - 1000, rec.seq)
            if big:  # committed and synced by stage()
                keep_lmdb_state()
                floor = len(lmdb_states) - 1
            elif rng.random() < 0.25:
                synced = journal._log.files > 1  # a commit that lets log files go syncs
                journal.commit()
                keep_lmdb_state()
                # the oldest LMDB state the disk may hold: the commit before the newest
                # (whose meta page may be lost), or the newest once LMDB was synced
                floor = len(lmdb_states) - 1 if synced else max(len(lmdb_states) - 2, floor)
            if rng.random() < images_wanted / 400:
                bigs += big
                lmdb_copy = lmdb_states[rng.choice([floor, len(lmdb_states) - 1])]
                logs = {p.name: p.read_bytes() for _, p in log_files(path)}
                # the next batch's frame, which a crash may cut or keep unsynced
                nxt = record(5, step + 1, 40)
                nxt.txid = nxt.origin_txid = journal.last_txid + 1
                nxt.local_ts = nxt.origin_ts = 1
                value = journal._codec.encode(nxt)
                next_frame = encode_batch(nxt.txid, 1, [value], None)
                images.append((Image(lmdb_copy, logs, acked), next_frame))
    finally:
        journal.close()
    assert not log_files(path), "a clean close leaves no commit log"
    print(f"{len(images)} images, {bigs} of them right after a batch LMDB took itself")
    return images


def test_power_loss_at_random_moments_loses_no_acknowledged_record(tmp_path: Path) -> None:
    rng = random.Random(SEED)
    print(f"seed {SEED}")
    images = drive(tmp_path, rng, images_wanted=30)
    assert len(images) >= 15
    tails: dict[str, int] = {}
    for number, (image, next_frame) in enumerate(images):
        target = tmp_path / f"image-{number}"
        tail = image.write(target, rng, next_frame)
        tails[tail] = tails.get(tail, 0) + 1
        journal = Journal(target, instance_name="crash")
        try:
            newest = max(image.acked, default=0)
            assert journal.last_txid >= newest, f"image {number} ({tail}): acked records lost"
            for txid, (pub, seq) in image.acked.items():
                rec = journal.get(txid)
                assert rec is not None, f"image {number} ({tail}): acked txid {txid} lost"
                assert (rec.pub_hash, rec.seq) == (1000 + pub, seq), f"txid {txid} differs"
                assert journal.lookup_bookmark(1000 + pub, seq) == txid
            assert journal.verify() == [], f"image {number} ({tail})"
            # writing goes on after the newest record the image holds
            last = journal.last_txid
            assert journal.append([record(9, 1, 5)], 9_000_000) == [last + 1]
        finally:
            journal.close()
        assert not log_files(target)
        reopened = Journal(target, instance_name="crash")
        try:
            assert reopened.last_txid == last + 1
        finally:
            reopened.close()
    print("unsynced tails tried:", tails)
    assert set(tails) >= {"none", "garbage", "prefix"}


def test_a_restored_older_data_file_beside_a_newer_log_is_refused(tmp_path: Path) -> None:
    """A commit log that starts past LMDB's newest record means records in between are
    missing: the journal refuses to open rather than continue over the hole."""
    path = tmp_path / "j"
    journal = Journal(path, instance_name="a")
    assert journal._log is not None
    journal._log.file_size = 4096
    journal.append([record(0, s, 10) for s in range(1, 4)], 1)
    shutil.copy(path / "data.mdb", tmp_path / "old-data.mdb")  # the "backup": txids 1..3
    seq = 3
    while journal.last_txid < 60:  # rotate and commit: the log lets go of 4.. on
        seq += 1
        journal.stage([record(0, seq, 400)], seq)
        journal.commit()
    journal.stage([record(0, seq + 1, 10)], seq + 1)  # only in the log
    newest = journal.last_txid
    shutil.copytree(path, tmp_path / "crashed")  # as if the power failed now
    journal.close()
    crashed = tmp_path / "crashed"
    first_logged = min(b.first_txid for _, f in log_files(crashed) for b in read_file(f)[0])
    assert first_logged > 4
    shutil.copy(tmp_path / "old-data.mdb", crashed / "data.mdb")
    (crashed / "lock.mdb").unlink(missing_ok=True)
    with pytest.raises(
        JournalDamaged,
        match=f"goes on at txid {first_logged} where txid 4 is due \\(LMDB ends at txid 3\\)",
    ):
        Journal(crashed, instance_name="a")
    # the refusal changed nothing: with the data file of the same moment it recovers
    shutil.copy(path / "data.mdb", crashed / "data.mdb")
    reopened = Journal(crashed, instance_name="a")
    try:
        assert reopened.last_txid == newest
    finally:
        reopened.close()


def test_a_damaged_log_before_a_later_file_is_refused(tmp_path: Path) -> None:
    """Only the last write can be cut by a crash: a bad frame with sound frames in a later
    file is damage, and opening says so instead of dropping the later records."""
    path = tmp_path / "j"
    journal = Journal(path, instance_name="a")
    assert journal._log is not None
    journal._log.file_size = 4096
    seq = 0
    while len(log_files(path)) < 3:
        seq += 1
        journal.stage([record(0, seq, 500)], seq)
    shutil.copytree(path, tmp_path / "crashed")
    journal.close()
    first = log_files(tmp_path / "crashed")[0][1]
    data = bytearray(first.read_bytes())
    data[20] ^= 0xFF  # inside the first frame
    first.write_bytes(bytes(data))
    (tmp_path / "crashed" / "lock.mdb").unlink(missing_ok=True)
    with pytest.raises(JournalDamaged, match="damaged, not cut by a crash"):
        Journal(tmp_path / "crashed", instance_name="a")


WRITER = """
import sys, time
from txlog import Journal, Record
j = Journal(sys.argv[1], instance_name="a")
for seq in range(1, 301):
    j.stage([Record(topic="t", payload=b'{"n":%d}' % seq, pub_hash=7, seq=seq)], seq)
print(j.last_txid, j.staged_records, flush=True)
sys.stdin.readline()
"""


def test_a_reader_beside_a_running_writer_sees_every_acknowledged_record(
    tmp_path: Path,
) -> None:
    """Records a writer has made durable in its commit log, but LMDB has not committed
    yet, are what a tool or the Spark pipeline must see too: a read-only open serves
    them from the log. After the writer is killed, a read-only open recovers them."""
    path = tmp_path / "j"
    with subprocess.Popen(
        [sys.executable, "-c", WRITER, str(path)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    ) as writer:
        try:
            assert writer.stdout is not None
            last, staged = map(int, writer.stdout.readline().split())
            assert (last, staged) == (300, 300), "the writer stages without committing LMDB"
            with Journal(path, readonly=True) as reader:
                assert reader.last_txid == 300
                assert [r.seq for r in reader.read(0, 1000)] == list(range(1, 301))
                assert reader.lookup_bookmark(7, 150) == 150
                assert reader.get(300) is not None
        finally:
            writer.kill()
    assert log_files(path), "killed: the commit log is all there is"
    with Journal(path, readonly=True) as reader:  # no writer now: recovers first
        assert reader.last_txid == 300
        assert [r.seq for r in reader.read(295, 10)] == list(range(296, 301))
    assert not log_files(path)


def test_an_unreadable_commit_log_is_refused_with_the_fix(tmp_path: Path) -> None:
    """The log may hold acknowledged records LMDB lacks: when it cannot be read, the
    journal does not open (and says what to do) rather than start without them."""
    path = tmp_path / "j"
    journal = Journal(path, instance_name="a")
    journal.stage([record(0, 1, 10)], 1)
    shutil.copytree(path, tmp_path / "crashed")
    journal.close()
    crashed = tmp_path / "crashed"
    (crashed / "lock.mdb").unlink(missing_ok=True)
    for _, log in log_files(crashed):
        log.unlink()
        log.mkdir()  # unreadable as a file, whoever runs the test (root too)
    with pytest.raises(JournalError, match=r"commit log cannot be read .* make the commit-"):
        Journal(crashed, instance_name="a")


def test_a_cursor_only_batch_is_staged_served_and_committed(tmp_path: Path) -> None:
    """A batch that only moves an upstream's replication cursor (every record a
    duplicate) is durable in the log, read back at once, and waits for an LMDB commit
    like records do, so the writer commits it (and lets the log go) in time."""
    journal = Journal(tmp_path / "j", instance_name="a")
    try:
        journal.append([record(0, 1, 10)], 1)
        assert not journal.has_staged
        txids = journal.stage([record(0, 1, 10)], 2, cursors={"up": (42, "9|42|")})
        assert txids == [0]  # a duplicate: only the cursor moves
        assert journal.has_staged and journal.staged_records == 0
        assert journal.upstream_cursor("up") == (42, "9|42|")
        journal.commit()
        assert not journal.has_staged
        assert journal.upstream_cursor("up") == (42, "9|42|")
    finally:
        journal.close()


def test_duplicates_are_found_among_staged_batches_before_lmdb_has_them(
    tmp_path: Path,
) -> None:
    """A staged batch is in the commit log and in memory only (LMDB takes it with the
    next commit): a copy of one of its records is still a duplicate, a lower seq that
    was never stored is not, and a publisher's highest seq counts staged records also
    once the writer forgot what it cached (as it does after any failed write)."""
    journal = Journal(tmp_path / "j", instance_name="a")
    try:
        assert journal.stage([record(0, 5, 10), record(0, 6, 10)], 1) == [1, 2]
        assert journal.stage([record(0, 5, 10)], 2) == [0]  # staged: a duplicate
        assert journal.stage([record(0, 3, 10)], 3) == [3]  # lower, never stored: kept
        journal._pub_cache.clear()  # what a failed write does
        assert journal.stage([record(0, 6, 10), record(0, 7, 10)], 4) == [0, 4]
        assert journal.publisher_last_seq(1000) == 7
        assert journal.staged_records == 4
        journal.commit()
        assert not journal.has_staged
        assert journal.stage([record(0, 3, 10), record(0, 8, 10)], 5) == [0, 5]
        assert [r.seq for r in journal.read(0, 100)] == [5, 6, 3, 7, 8]
    finally:
        journal.close()


def test_a_big_batch_after_staged_ones_takes_them_into_lmdb_first(tmp_path: Path) -> None:
    """A big batch goes into LMDB at once; the staged batches before it go into the
    same LMDB transaction first, so the txids stay in order and nothing is left for
    the log: a reopen (even without a clean close) finds every record."""
    path = tmp_path / "j"
    journal = Journal(path, instance_name="a")
    staged = journal.stage([record(0, 1, 10), record(1, 1, 10)], 1)
    big = journal.stage([record(2, seq, 10) for seq in range(1, DIRECT_RECORDS + 1)], 2)
    assert staged == [1, 2] and big == list(range(3, DIRECT_RECORDS + 3))
    assert not journal.has_staged  # LMDB holds the staged ones too now
    shutil.copytree(path, tmp_path / "copy")  # as a kill -9 would leave it
    journal.close()
    copy = tmp_path / "copy"
    (copy / "lock.mdb").unlink(missing_ok=True)
    reopened = Journal(copy, instance_name="a")
    try:
        records = reopened.read(0, DIRECT_RECORDS + 10)
        assert [r.txid for r in records] == list(range(1, DIRECT_RECORDS + 3))
        assert reopened.verify() == []
    finally:
        reopened.close()


def test_a_frame_whose_sync_failed_leaves_nothing_that_reads_as_damage(tmp_path: Path) -> None:
    """A frame written but never counted (its write or fdatasync failed, so the journal
    abandoned its batch) is overwritten by the next frame. Its remains must not stay
    behind a shorter next frame, nor at the end of a file the log moves on from: a
    reader stops there, and sound batches in a later file would make the whole log
    read as damaged (and the journal refuse to open)."""
    log = CommitLog(tmp_path, file_size=4096)
    log.append(encode_batch(1, 1, [b"a" * 100], {}), 1)
    log.write(encode_batch(2, 2, [b"b" * 1500], {}))  # never counted: its sync failed
    txid = 1
    while log.files < 2:  # shorter frames over it, then on into a second file
        txid += 1
        log.append(encode_batch(txid, txid, [b"c" * 50], {}), txid)
    # and once more at the end of a file: an uncounted frame, then one that needs a
    # new file
    while log._offset < 2500:
        txid += 1
        log.append(encode_batch(txid, txid, [b"d" * 400], {}), txid)
    log.write(encode_batch(txid + 1, txid + 1, [b"e" * 1200], {}))  # never counted
    txid += 1
    log.append(encode_batch(txid, txid, [b"f" * 2000], {}), txid)  # does not fit: file 3
    assert log.files == 3
    log.close(remove=False)
    assert [b.first_txid for b in read_log(tmp_path)] == list(range(1, txid + 1))
