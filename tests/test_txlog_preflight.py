"""txlog.preflight: LMDB's meta pages read by hand, on crafted bytes and files and on a
real journal, and the signs that a journal existed in a directory."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest
from test_txlog import make

from txlog import Journal, publisher_hash
from txlog.journal import WRITER_LOCK_FILE
from txlog.preflight import (
    LMDB_MAGIC,
    LOCK_FILES,
    META_BYTES,
    DataFileDamage,
    MetaPage,
    check_data_file,
    describe_traces,
    find_traces,
    journal_traces,
    newest_meta,
    parse_meta,
    set_aside,
    size_problem,
)

PAGE = 4096


def meta_page(
    page_no: int,
    *,
    txnid: int,
    last_page: int,
    page_size: int = PAGE,
    magic: int = LMDB_MAGIC,
    version: int = 1,
    flags: int = 0x08,
) -> bytes:
    """One LMDB meta page as LMDB 0.9 (64-bit) writes it, padded to ``page_size``."""
    header = struct.pack("=QHHI", page_no, 0, flags, 0)
    free_db = struct.pack("=IHHQQQQQ", page_size, 0, 0, 0, 0, 0, 0, 0)
    main_db = struct.pack("=IHHQQQQQ", 0, 0, 0, 0, 0, 0, 0, 0)
    meta = struct.pack("=IIQQ", magic, version, 0, 1 << 30) + free_db + main_db
    meta += struct.pack("=QQ", last_page, txnid)
    return (header + meta).ljust(page_size, b"\0")


def data_file(path: Path, meta0: bytes, meta1: bytes, pages: int) -> Path:
    """metas, then ``pages - 2`` filler pages."""
    path.write_bytes(meta0 + meta1 + b"\xaa" * PAGE * (pages - 2))
    return path


def test_parse_meta_reads_what_lmdb_wrote() -> None:
    meta = parse_meta(meta_page(1, txnid=31, last_page=264), 1)
    assert meta == MetaPage(1, PAGE, 1 << 30, 264, 31)
    assert meta.needed_bytes == 265 * PAGE
    assert META_BYTES == 152


@pytest.mark.parametrize(
    ("page", "problem"),
    [
        (meta_page(0, txnid=1, last_page=3)[:100], "cut short (100 of 152 bytes)"),
        (meta_page(0, txnid=1, last_page=3, flags=0x02), "not an LMDB meta page (flags 0x0002)"),
        (meta_page(0, txnid=1, last_page=3, magic=0xDEC0EFBE), "magic 0xdec0efbe"),
        (meta_page(0, txnid=1, last_page=3, version=999), "data version 999"),
        (meta_page(0, txnid=1, last_page=3, page_size=3000), "page size 3000"),
        (meta_page(0, txnid=1, last_page=0), "last used page 0"),
        (b"\0" * PAGE, "not an LMDB meta page"),
    ],
)
def test_parse_meta_refuses_what_is_not_a_meta_page(page: bytes, problem: str) -> None:
    with pytest.raises(DataFileDamage, match=problem.replace("(", r"\(").replace(")", r"\)")):
        parse_meta(page, 0)


def test_newest_meta_is_the_higher_txnid_page_0_on_a_tie() -> None:
    a = MetaPage(0, PAGE, 0, 10, 7)
    b = MetaPage(1, PAGE, 0, 12, 8)
    assert newest_meta(a, b) is b
    assert newest_meta(b, a) is b
    assert newest_meta(a, MetaPage(1, PAGE, 0, 12, 7)) is a


def test_size_problem_names_both_sizes() -> None:
    meta = MetaPage(1, PAGE, 0, 9, 4)
    assert size_problem(meta, 10 * PAGE) is None
    assert size_problem(meta, 11 * PAGE) is None  # a longer file is fine
    problem = size_problem(meta, 8192)
    assert problem is not None
    assert "data.mdb is 8192 bytes but LMDB needs 40960" in problem
    assert "truncated or damaged" in problem


def test_check_data_file_on_crafted_files(tmp_path: Path) -> None:
    sound = data_file(
        tmp_path / "sound",
        meta_page(0, txnid=4, last_page=5),
        meta_page(1, txnid=5, last_page=7),
        8,
    )
    assert check_data_file(sound).txnid == 5
    # the older meta needs less, but LMDB uses the newer one
    meta0, meta1 = meta_page(0, txnid=4, last_page=5), meta_page(1, txnid=5, last_page=7)
    short = data_file(tmp_path / "short", meta0, meta1, 6)
    with pytest.raises(DataFileDamage, match="is 24576 bytes but LMDB needs 32768"):
        check_data_file(short)
    empty = tmp_path / "empty"
    empty.write_bytes(b"")
    with pytest.raises(DataFileDamage, match=r"empty \(0 bytes\)"):
        check_data_file(empty)
    one_page = tmp_path / "one-page"
    one_page.write_bytes(meta_page(0, txnid=4, last_page=5))
    with pytest.raises(DataFileDamage, match=r"no valid LMDB meta pages \(meta page 1 is cut"):
        check_data_file(one_page)
    bad_second = data_file(
        tmp_path / "bad-second", meta_page(0, txnid=4, last_page=5), b"\xff" * PAGE, 8
    )
    with pytest.raises(DataFileDamage, match="meta page 1 has magic 0xffffffff"):
        check_data_file(bad_second)
    garbage = tmp_path / "garbage"
    garbage.write_bytes(b"hello")
    with pytest.raises(DataFileDamage, match=r"\(5 bytes\) has no valid LMDB meta pages"):
        check_data_file(garbage)


def test_check_data_file_agrees_with_lmdb_on_a_real_journal(tmp_path: Path) -> None:
    ph = publisher_hash("pub")
    with Journal(tmp_path / "j", instance_name="a") as j:
        for batch in range(5):
            j.append([make(ph, batch * 50 + i + 1) for i in range(50)], 1)
    data = tmp_path / "j" / "data.mdb"
    meta = check_data_file(data)
    assert meta.page_size == PAGE
    assert meta.needed_bytes == data.stat().st_size, "LMDB writes every page it counts"
    assert meta.txnid >= 5


def test_journal_traces() -> None:
    assert journal_traces([]) == []
    assert journal_traces(["lost+found.txt", "notes", ".gitkeep"]) == []
    names = ["amps-py.lock", "lock.mdb", "a.0000000001.journal.zst", "a.0000000002.journal.tmp"]
    assert journal_traces(names) == sorted(names)
    assert journal_traces(["data.mdb"]) == ["data.mdb"]
    archive = ["a.0000000003.journal", "b.0000000003.journal", "readme"]
    assert journal_traces([], archive, "a") == ["archive/a.0000000003.journal"]
    assert journal_traces([], archive, None) == [
        "archive/a.0000000003.journal",
        "archive/b.0000000003.journal",
    ]
    assert WRITER_LOCK_FILE in LOCK_FILES
    assert describe_traces(["a", "b", "c", "d", "e", "f"]) == "a, b, c, d and 2 more"


def test_set_aside_moves_segment_files_only(tmp_path: Path) -> None:
    journal, archive = tmp_path / "j", tmp_path / "archive"
    journal.mkdir()
    archive.mkdir()
    (journal / "amps-py.lock").write_text("1\n")
    (journal / "a.0000000001.journal.zst").write_bytes(b"one")
    (archive / "a.0000000002.journal").write_bytes(b"two")
    traces = find_traces(journal, archive, "a")
    assert traces == ["a.0000000001.journal.zst", "amps-py.lock", "archive/a.0000000002.journal"]
    used = set_aside(journal, archive, traces, now=0.0)
    stamp = "discarded-19700101T000000Z"
    assert used == [journal / stamp, archive / stamp]
    assert (journal / stamp / "a.0000000001.journal.zst").read_bytes() == b"one"
    assert (archive / stamp / "a.0000000002.journal").read_bytes() == b"two"
    assert (journal / "amps-py.lock").exists()
    assert find_traces(journal, archive, "a") == ["amps-py.lock"]
