"""Journal segments on real LMDB and real segment files: sealing by size, compress and
archive (records move to files and every read still serves them), remove (records and
index entries gone, reads start after them), crash-resumable purging, damaged files."""

from __future__ import annotations

import itertools
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest

from txlog import CorruptRecord, Journal, JournalError, Record, publisher_hash
from txlog.segments import Segment, bytes_through, grown_table, removed_through

PH = publisher_hash("pub")
SEGMENT_SIZE = 20_000  # bytes of records per segment: about 60 records of ~330 bytes


def make(seq: int) -> Record:
    return Record(
        topic="orders",
        # a hex pad from a fixed seed: compresses only about 2:1, so zstd journals still
        # fill several segments
        payload=b'{"seq":%d,"pad":"%s"}' % (seq, random.Random(seq).randbytes(120).hex().encode()),
        pub_hash=PH,
        seq=seq,
        client_name="pub",
    )


def fill(journal: Journal, n: int, per_commit: int = 10) -> None:
    seq = journal.publisher_last_seq(PH)
    for start in range(seq + 1, seq + n + 1, per_commit):
        batch = [make(s) for s in range(start, min(start + per_commit, seq + n + 1))]
        journal.append(batch, 1_000_000 + start)


def payloads(journal: Journal, after: int = 0) -> list[tuple[int, bytes]]:
    return [(rec.txid, rec.payload) for rec in journal.iter_records(after, chunk=37)]


def purge_all(journal: Journal) -> None:
    steps = 0
    while journal.purge_step(max_records=25):
        steps += 1
        assert steps < 1000, "purge_step never finished"


@pytest.fixture(params=["none", "zstd"])
def journal(request: pytest.FixtureRequest, tmp_path: Path) -> Journal:
    j = Journal(
        tmp_path / "j",
        instance_name="a",
        compression=request.param,
        segment_size=SEGMENT_SIZE,
        archive_directory=tmp_path / "archive",
    )
    request.addfinalizer(j.close)
    return j


def test_segments_seal_at_the_size_and_cover_every_txid(journal: Journal) -> None:
    fill(journal, 500)
    segs = journal.segments()
    assert len(segs) >= 4, f"500 records of ~330 bytes in {SEGMENT_SIZE}-byte segments: {segs}"
    assert segs[0].first_txid == 1 and segs[-1].last_txid == 500
    for older, newer in itertools.pairwise(segs):
        assert newer.first_txid == older.last_txid + 1
        assert older.size >= SEGMENT_SIZE  # sealed only once full
        assert newer.id == older.id + 1
    assert sum(s.records for s in segs) == 500
    assert all(s.state == "live" for s in segs)


def test_compressed_and_archived_segments_still_read_the_same(journal: Journal) -> None:
    fill(journal, 500)
    before = payloads(journal)
    segs = journal.segments()
    # compress segments 1-2, then archive 1 (it keeps its compression) and plain-archive 3
    for seg in segs[:2]:
        journal.mark_offloaded(seg.id, "compressed", journal.write_segment_file(seg, "compressed"))
    seg1 = journal.segments()[0]
    old = journal.mark_offloaded(seg1.id, "archived", journal.write_segment_file(seg1, "archived"))
    assert old.endswith(".journal.zst") and Path(old).parent == journal.path
    Path(old).unlink()
    seg3 = journal.segments()[2]
    journal.mark_offloaded(seg3.id, "archived", journal.write_segment_file(seg3, "archived"))
    # before purging, records are in LMDB and in the files; after, only in the files
    assert payloads(journal) == before
    purge_all(journal)
    assert journal.first_lmdb_record() is not None
    assert journal.first_lmdb_record().txid == segs[3].first_txid  # type: ignore[union-attr]
    assert payloads(journal) == before
    states = [s.state for s in journal.segments()[:4]]
    assert states == ["archived", "compressed", "archived", "live"]
    archive = journal.archive_directory
    assert archive is not None
    assert sorted(p.name for p in archive.iterdir()) == [
        "a.0000000001.journal.zst",
        "a.0000000003.journal",
    ]
    # point reads, bookmark lookups and reads starting mid-file
    txid = journal.lookup_bookmark(PH, 5)
    assert txid == 5
    rec = journal.get(5)
    assert rec is not None and rec.seq == 5
    assert payloads(journal, after=segs[0].last_txid - 3) == before[segs[0].last_txid - 3 :]
    views, damage = journal.read_views(2, 3)
    assert damage is None and [v.txid for v in views] == [3, 4, 5]
    assert journal.first_txid() == 1
    assert journal.verify() == []


def test_reopened_journal_keeps_segment_states(journal: Journal, tmp_path: Path) -> None:
    fill(journal, 300)
    seg = journal.segments()[0]
    journal.mark_offloaded(seg.id, "compressed", journal.write_segment_file(seg, "compressed"))
    purge_all(journal)
    before = payloads(journal)
    journal.close()
    with Journal(tmp_path / "j", readonly=True) as reader:
        assert payloads(reader) == before
        assert [s.state for s in reader.segments()][:2] == ["compressed", "live"]
    again = Journal(tmp_path / "j", instance_name="a", segment_size=SEGMENT_SIZE)
    try:
        fill(again, 100)
        assert payloads(again)[: len(before)] == before
        assert again.segments()[-1].last_txid == 400
    finally:
        again.close()


def test_removed_segments_are_gone_with_their_index_entries(journal: Journal) -> None:
    fill(journal, 500)
    segs = journal.segments()
    # segment 1 compressed first: removal must also drop the bookmarks of file-only records
    journal.mark_offloaded(
        segs[0].id, "compressed", journal.write_segment_file(segs[0], "compressed")
    )
    purge_all(journal)
    file1 = journal.segment_path(journal.segments()[0])
    removed = journal.mark_removed(segs[1].id)
    assert [s.id for s in removed] == [segs[0].id, segs[1].id]
    # reads skip them at once, before any purging
    assert journal.first_txid() == segs[2].first_txid
    assert payloads(journal)[0][0] == segs[2].first_txid
    assert journal.get(1) is None
    purge_all(journal)
    assert not file1.exists()
    assert journal.lookup_bookmark(PH, 1) is None
    assert journal.lookup_bookmark(PH, segs[1].last_txid) is None
    assert journal.lookup_bookmark(PH, segs[2].first_txid) == segs[2].first_txid
    # a timestamp before everything left replays from the first record kept
    assert journal.txid_before_time(0) == segs[2].first_txid - 1
    assert journal.verify() == []
    assert journal.statistics().segments == len(segs) - 2
    with pytest.raises(JournalError, match="current journal segment cannot be removed"):
        journal.mark_removed(journal.segments()[-1].id)


def test_purge_interrupted_by_a_crash_finishes_after_reopen(tmp_path: Path) -> None:
    j = Journal(tmp_path / "j", instance_name="a", segment_size=SEGMENT_SIZE)
    fill(j, 300)
    keep = payloads(j)
    first_kept = j.segments()[1].first_txid
    j.mark_removed(1)
    assert j.purge_step(max_records=5)  # deleted a little, then "crashed"
    j.close()
    j = Journal(tmp_path / "j", instance_name="a", segment_size=SEGMENT_SIZE)
    try:
        assert j.purge_pending()
        assert payloads(j) == [p for p in keep if p[0] >= first_kept]
        purge_all(j)
        assert not j.purge_pending()
        assert j.lookup_bookmark(PH, 1) is None
        assert payloads(j) == [p for p in keep if p[0] >= first_kept]
    finally:
        j.close()


def test_damaged_segment_file_is_reported_by_name(journal: Journal) -> None:
    fill(journal, 300)
    seg = journal.segments()[0]
    path = journal.write_segment_file(seg, "compressed")
    journal.mark_offloaded(seg.id, "compressed", path)
    purge_all(journal)
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF  # inside the zstd block
    path.write_bytes(bytes(data))
    journal._forget_file(str(path))  # a fresh reader, as after a restart
    views, damage = journal.read_views(0, 10)
    assert views == []
    assert isinstance(damage, CorruptRecord)
    assert str(path) in str(damage) and "restore it from a backup" in str(damage)
    problems = journal.verify()
    assert problems and str(path) in problems[0].problem


def test_archiving_without_an_archive_directory_says_how_to_fix(tmp_path: Path) -> None:
    j = Journal(tmp_path / "j", instance_name="a", segment_size=SEGMENT_SIZE)
    try:
        fill(j, 200)
        with pytest.raises(JournalError, match="set TransactionLog/JournalArchiveDirectory"):
            j.write_segment_file(j.segments()[0], "archived")
    finally:
        j.close()


def test_journal_from_before_segments_becomes_one_segment(tmp_path: Path) -> None:
    j = Journal(tmp_path / "j", instance_name="a")
    fill(j, 50)
    # drop the segment table, as a journal written before segments existed
    with j._env.begin(write=True) as txn:
        assert j._segments_db is not None
        txn.drop(j._segments_db, delete=False)
    j.close()
    j = Journal(tmp_path / "j", instance_name="a", segment_size=SEGMENT_SIZE)
    try:
        segs = j.segments()
        assert [(s.id, s.first_txid, s.last_txid, s.records) for s in segs] == [(1, 1, 50, 50)]
        fill(j, 10)
        assert j.segments()[-1].last_txid == 60
    finally:
        j.close()


def test_export_refuses_a_segment_with_a_damaged_record(tmp_path: Path) -> None:
    """``python -m txlog.export`` (what the server runs for compress and archive) checks
    every CRC: a damaged record fails the export, names the record and writes nothing,
    and the segment stays live in LMDB."""
    j = Journal(tmp_path / "j", instance_name="a", segment_size=SEGMENT_SIZE)
    fill(j, 200)
    seg = j.segments()[0]
    j.close()
    data = bytearray((tmp_path / "j" / "data.mdb").read_bytes())
    pos = data.find(b'{"seq":7,')
    assert pos >= 0
    data[pos + 3] ^= 0x20
    (tmp_path / "j" / "data.mdb").write_bytes(bytes(data))
    done = subprocess.run(
        [sys.executable, "-m", "txlog.export", str(tmp_path / "j"), str(seg.id), "compressed"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 1
    assert "record txid 7 is corrupt" in done.stderr
    assert not list((tmp_path / "j").glob("*.journal*")), "no segment file for damaged data"
    with Journal(tmp_path / "j", instance_name="a") as again:
        assert again.segments()[0].state == "live"
    usage = subprocess.run(
        [sys.executable, "-m", "txlog.export", str(tmp_path / "j")],
        capture_output=True,
        text=True,
        check=False,
    )
    assert usage.returncode == 2 and "JOURNAL_DIR SEGMENT_ID" in usage.stderr


def test_a_moved_journal_directory_still_reads_its_compressed_segments(tmp_path: Path) -> None:
    """Compressed segment files live in the journal directory and are recorded by name,
    so a journal restored to another path (a backup, a new disk) reads them there."""
    j = Journal(tmp_path / "j", instance_name="a", segment_size=SEGMENT_SIZE)
    fill(j, 300)
    seg = j.segments()[0]
    j.mark_offloaded(seg.id, "compressed", j.write_segment_file(seg, "compressed"))
    purge_all(j)
    before = payloads(j)
    j.close()
    (tmp_path / "j").rename(tmp_path / "restored")
    with Journal(tmp_path / "restored", instance_name="a") as moved:
        assert moved.segments()[0].file == "a.0000000001.journal.zst"
        assert payloads(moved) == before
        assert moved.verify() == []


def test_bytes_through_sums_segment_sizes(journal: Journal) -> None:
    fill(journal, 400)
    segs = journal.segments()
    total = sum(s.size for s in segs)
    assert journal.bytes_through(0) == 0
    assert journal.bytes_through(400) == total
    assert journal.bytes_through(segs[1].last_txid) == segs[0].size + segs[1].size
    # inside a segment: its mean record size times the records up to the txid
    mid = segs[1].first_txid + segs[1].records // 2 - 1
    expected = segs[0].size + segs[1].size * (segs[1].records // 2) // segs[1].records
    assert journal.bytes_through(mid) == expected


def test_removal_leaves_a_floor_under_late_copies_and_old_bookmarks(journal: Journal) -> None:
    """Removal deletes bookmark entries but remembers, per publisher, the highest seq it
    removed: a replicated copy at or below it arriving later is a duplicate, not new."""
    fill(journal, 300)
    seg1 = journal.segments()[0]
    journal.mark_removed(seg1.id)
    purge_all(journal)
    assert journal.publisher_floor(PH) == seg1.last_txid  # seq == txid for one publisher
    assert journal.publisher_floor(PH + 1) == 0

    def copy(seq: int) -> Record:
        rec = make(seq)
        rec.path = (("elsewhere", "g"),)
        rec.origin = "elsewhere"
        return rec

    # a late copy of a removed record: dropped; one of a record still held: dropped;
    # a replicated record above the floor that is not held yet: stored
    before = journal.last_txid
    assert journal.append([copy(seg1.last_txid)], 9_000_000) == [0]
    assert journal.append([copy(seg1.last_txid + 1)], 9_000_000) == [0]
    assert journal.append([copy(400)], 9_000_000) == [before + 1]
    # the floor survives a reopen
    journal.close()
    again = Journal(journal.path, instance_name="a")
    try:
        assert again.publisher_floor(PH) == seg1.last_txid
        assert again.append([copy(3)], 9_000_001) == [0]
    finally:
        again.close()


def test_a_full_journal_says_how_to_make_room(tmp_path: Path) -> None:
    j = Journal(tmp_path / "j", instance_name="a", map_size=1024 * 1024)
    try:
        with pytest.raises(JournalError, match="the journal is full") as full:
            fill(j, 10_000, per_commit=100)
        assert "raise TransactionLog/MapSize and restart" in str(full.value)
        last = j.last_txid
        assert last > 0 and j.verify() == []  # what was stored before is intact
    finally:
        j.close()
    # a larger map on reopen: writing goes on where it stopped
    j = Journal(tmp_path / "j", instance_name="a", map_size=8 * 1024 * 1024)
    try:
        assert j.last_txid == last
        fill(j, 100)
        assert j.last_txid == last + 100
    finally:
        j.close()


def test_offloading_every_record_out_of_lmdb_then_appending_again(tmp_path: Path) -> None:
    """The library lets a caller offload the newest segment too (the server never does):
    purging then empties LMDB, reads come from the file, and the next append starts a
    new segment."""
    j = Journal(tmp_path / "j", instance_name="a", segment_size=SEGMENT_SIZE)
    try:
        fill(j, 20)
        (only,) = j.segments()
        j.mark_offloaded(only.id, "compressed", j.write_segment_file(only, "compressed"))
        purge_all(j)
        assert j.first_lmdb_record() is None
        assert [p[0] for p in payloads(j)] == list(range(1, 21))
        j.close()
        j = Journal(tmp_path / "j", instance_name="a", segment_size=SEGMENT_SIZE)
        assert j.last_txid == 20, "a reopened journal continues after the offloaded records"
        fill(j, 5)
        assert [s.state for s in j.segments()] == ["compressed", "live"]
        assert [p[0] for p in payloads(j)] == list(range(1, 26))
    finally:
        j.close()


def test_one_writer_per_journal(tmp_path: Path) -> None:
    """A journal open for writing is locked: a second writer (another instance with the
    same JournalDirectory, an offline tool) is refused with the holder's pid; readers
    are not."""
    first = Journal(tmp_path / "j", instance_name="a")
    try:
        fill(first, 5)
        with pytest.raises(
            JournalError, match=rf"already open for writing \(by process {os.getpid()}\)"
        ):
            Journal(tmp_path / "j", instance_name="a")
        info = subprocess.run(  # a reader in another process, as `amps-py txlog` is
            [sys.executable, "-m", "amps_py", "txlog", "info", str(tmp_path / "j")],
            capture_output=True,
            text=True,
            check=False,
        )
        assert info.returncode == 0 and '"last_txid": 5' in info.stdout, info.stderr
        # a refused open of another instance's journal does not keep the lock
        with pytest.raises(JournalError, match="belongs to instance 'a'"):
            first.close()
            Journal(tmp_path / "j", instance_name="b")
        again = Journal(tmp_path / "j", instance_name="a")
        again.close()
    finally:
        first.close()


def txlog_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "amps_py", "txlog", *args],
        capture_output=True,
        text=True,
        check=False,
    )


def test_offline_maintenance_commands(tmp_path: Path) -> None:
    """`amps-py txlog compress|archive|remove PATH ID` on a stopped instance's journal:
    the same state changes as the admin API, removal held by the saved destination
    positions, and refused while the journal is open for writing."""
    j = Journal(tmp_path / "j", instance_name="a", segment_size=SEGMENT_SIZE)
    fill(j, 400)
    segs = j.segments()
    j.save_destination_positions({"B": segs[1].last_txid})  # B had journals 1-2
    # while open for writing (a running instance), the tools refuse
    busy = txlog_cli("compress", str(tmp_path / "j"), "1")
    assert busy.returncode == 2 and "already open for writing" in busy.stderr
    before = payloads(j)
    j.close()
    path = str(tmp_path / "j")

    done = txlog_cli("compress", path, "2")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "compress through journal 2: compressed journals 1, 2"
    done = txlog_cli("archive", path, "1", "--archive-dir", str(tmp_path / "arch"))
    assert done.returncode == 0 and "archived journal 1" in done.stdout, done.stderr
    done = txlog_cli("remove", path, "3")
    assert done.returncode == 0, done.stderr
    assert "removed journals 1, 2; kept journal 3: destination B (through txid" in done.stdout
    current = txlog_cli("remove", path, str(segs[-1].id))
    assert current.returncode == 2 and "is the current one" in current.stderr
    with Journal(tmp_path / "j", instance_name="a") as again:
        assert [s.state for s in again.segments()[:3]] == ["removed", "removed", "live"]
        assert payloads(again) == [p for p in before if p[0] > segs[1].last_txid]
        assert again.verify() == []
    assert not list((tmp_path / "arch").iterdir()), "removal deleted the archived file"


def test_one_large_commit_fills_several_segments(tmp_path: Path) -> None:
    """Segments are cut inside a commit: a batch far larger than JournalSize still
    yields segments of about JournalSize (at most one record over)."""
    j = Journal(tmp_path / "j", instance_name="a", segment_size=SEGMENT_SIZE)
    try:
        fill(j, 10, per_commit=10)  # a partly filled current segment first
        fill(j, 400, per_commit=400)  # then one commit of ~130 KB: several segments
        segs = j.segments()
        assert len(segs) >= 5, segs
        record = max(len(v) for v in [j._codec.encode(make(1))])
        for seg in segs[:-1]:
            assert SEGMENT_SIZE <= seg.size < SEGMENT_SIZE + 2 * record, seg
        assert segs[-1].size < SEGMENT_SIZE + 2 * record
        assert sum(s.records for s in segs) == 410
        for older, newer in itertools.pairwise(segs):
            assert newer.first_txid == older.last_txid + 1
        assert segs[-1].last_txid == 410
        j.close()
        again = Journal(tmp_path / "j", instance_name="a", segment_size=SEGMENT_SIZE)
        assert again.segments() == segs, "every row of the commit was stored"
        again.close()
    finally:
        j.close()


# ---------------------------------------------------------------- the table, pure


def test_grown_table_fills_the_current_segment_then_seals_it() -> None:
    # no table yet: the first commit starts segment 1
    table, touched = grown_table([], 100, 1, 5, [40, 40])
    assert table == touched == [Segment(1, 1, 2, 5, 5, 80, 2)]
    # below the size: the current segment grows, nothing else changes
    grown, touched = grown_table(table, 100, 3, 7, [10])
    assert grown == touched == [Segment(1, 1, 3, 5, 7, 90, 3)]
    assert table == [Segment(1, 1, 2, 5, 5, 80, 2)]  # the input is left as it was
    # crossing the size: the record that crosses it still goes in (outgrowing the size
    # by at most one record), the rest start segment 2, then 3
    sealed, touched = grown_table(grown, 100, 4, 9, [30, 60, 60, 5])
    assert sealed == [
        Segment(1, 1, 4, 5, 9, 120, 4),
        Segment(2, 5, 6, 9, 9, 120, 2),
        Segment(3, 7, 7, 9, 9, 5, 1),
    ]
    assert touched == sealed
    # a current segment that is not live (every record offloaded) is never extended
    offloaded = [Segment(1, 1, 2, 5, 5, 80, 2, state="compressed")]
    assert grown_table(offloaded, 100, 3, 6, [1])[1] == [Segment(2, 3, 3, 6, 6, 1, 1)]


def test_bytes_and_removed_through_read_the_table() -> None:
    table = [
        Segment(1, 1, 10, 0, 0, 1000, 10, state="removed", cleaned=True),
        Segment(2, 11, 20, 0, 0, 500, 10),
    ]
    assert bytes_through(table, 10) == 1000
    assert bytes_through(table, 15) == 1000 + 500 * 5 // 10
    assert bytes_through(table, 99) == 1500
    assert removed_through(table) == 10
    assert removed_through(table[1:]) == 0
