"""Damage one live LMDB page of a real file the way a disk does: 4 KiB of random bytes
(a seeded, printed :class:`random.Random`) over the leaf page that holds a given key.

The page is found by walking the B-tree from the newer meta page, reading the file's
own bytes (LMDB's on-disk layout, 64-bit): the sub-database's root from the main
database, then branch pages down to the leaf whose key range holds the key. So exactly
the page a read of that key goes through is damaged, not an older copy LMDB no longer
uses, and the test knows which records it hid.
"""

from __future__ import annotations

import random
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Final

#: page header: page number, pad, flags, lower and upper free-space bounds
_HEADER: Final = struct.Struct("=QHHHH")
_HEADER_SIZE: Final = 16
#: node header: lo, hi (data size, or for a branch the child page number), flags, key size
_NODE: Final = struct.Struct("=HHHH")
#: MDB_db: pad (the page size, in the free database), flags, depth, branch, leaf and
#: overflow pages, entries, root
_DB: Final = struct.Struct("=IHHQQQQQ")
#: MDB_meta: magic, version, address, map size; then the two MDB_db, last page, txnid
_META: Final = struct.Struct("=IIQQ")
_MAGIC: Final = 0xBEEFC0DE
P_BRANCH: Final = 0x01
P_LEAF: Final = 0x02
F_SUBDATA: Final = 0x02
_NO_ROOT: Final = (1 << 64) - 1


@dataclass(frozen=True)
class Damage:
    """What :func:`damage_leaf` did: the page number and size, and the seed."""

    page: int
    page_size: int
    seed: int


def _meta(data: bytes) -> tuple[int, int]:
    """(page size, main database root) from the newer of the two meta pages."""
    best: tuple[int, int, int] | None = None
    for page in (0, 1):
        # both meta pages are in the first two pages of the file, at whatever page size
        for psize in (4096, 8192, 16384, 65536):
            base = page * psize + _HEADER_SIZE
            if base + _META.size + 2 * _DB.size + 16 > len(data):
                continue
            magic, _version, _address, _mapsize = _META.unpack_from(data, base)
            if magic != _MAGIC:
                continue
            free = _DB.unpack_from(data, base + _META.size)
            main = _DB.unpack_from(data, base + _META.size + _DB.size)
            if free[0] != psize:
                continue
            txnid = struct.unpack_from("=Q", data, base + _META.size + 2 * _DB.size + 8)[0]
            if best is None or txnid > best[0]:
                best = (txnid, psize, main[7])
            break
    assert best is not None, "no valid LMDB meta page"
    return best[1], best[2]


def _nodes(page: bytes) -> list[tuple[int, int, int, bytes, int]]:
    """Each node of a branch or leaf page: (lo, hi, flags, key, offset of its data)."""
    _pgno, _pad, _flags, lower, _upper = _HEADER.unpack_from(page)
    found = []
    for i in range((lower - _HEADER_SIZE) // 2):
        offset = struct.unpack_from("=H", page, _HEADER_SIZE + 2 * i)[0]
        lo, hi, flags, ksize = _NODE.unpack_from(page, offset)
        key_at = offset + _NODE.size
        found.append((lo, hi, flags, page[key_at : key_at + ksize], key_at + ksize))
    return found


def _page(data: bytes, pgno: int, psize: int) -> bytes:
    return data[pgno * psize : (pgno + 1) * psize]


def _leaf_of(data: bytes, psize: int, root: int, key: bytes) -> int:
    """The leaf page under ``root`` whose key range holds ``key``."""
    pgno = root
    while True:
        page = _page(data, pgno, psize)
        flags = _HEADER.unpack_from(page)[2]
        if flags & P_LEAF:
            return pgno
        assert flags & P_BRANCH, f"page {pgno} is neither a branch nor a leaf"
        child = None
        for i, (lo, hi, node_flags, node_key, _data_at) in enumerate(_nodes(page)):
            if i > 0 and node_key > key:  # the first node's key is "below everything"
                break
            child = lo | hi << 16 | node_flags << 32
        assert child is not None
        pgno = child


def leaf_page(data_file: Path, database: bytes, key: bytes) -> tuple[int, int]:
    """(page number, page size) of the leaf of sub-database ``database`` in LMDB file
    ``data_file`` whose key range holds ``key``."""
    data = data_file.read_bytes()
    psize, main_root = _meta(data)
    assert main_root != _NO_ROOT, f"{data_file} has no databases"
    main_leaf = _leaf_of(data, psize, main_root, database)
    for _lo, _hi, flags, name, data_at in _nodes(_page(data, main_leaf, psize)):
        if name == database:
            assert flags & F_SUBDATA, f"{database!r} is not a sub-database"
            root = _DB.unpack_from(_page(data, main_leaf, psize), data_at)[7]
            assert root != _NO_ROOT, f"sub-database {database!r} is empty"
            return _leaf_of(data, psize, root, key), psize
    raise AssertionError(f"{data_file} has no sub-database {database!r}")


def damage_leaf(data_file: Path, database: bytes, key: bytes, seed: int) -> Damage:
    """Overwrite the leaf page of ``database`` that holds ``key`` in ``data_file`` with
    random bytes from ``random.Random(seed)`` (printed, to replay a failure)."""
    pgno, psize = leaf_page(data_file, database, key)
    noise = random.Random(seed).randbytes(psize)
    print(f"damage: {psize} random bytes (seed {seed}) over page {pgno} of {data_file}")
    with open(data_file, "r+b") as f:
        f.seek(pgno * psize)
        f.write(noise)
    return Damage(pgno, psize, seed)


def clear_page_type(data_file: Path, database: bytes, key: bytes) -> Damage:
    """Clear the page-type flags of the leaf of ``database`` holding ``key``, keeping
    every other byte: a read that steps onto it fails LMDB's ``IS_LEAF`` assertion
    (which aborts the process); a search reports ``MDB_CORRUPTED``."""
    pgno, psize = leaf_page(data_file, database, key)
    print(f"damage: page-type flags of page {pgno} of {data_file} cleared")
    with open(data_file, "r+b") as f:
        f.seek(pgno * psize + 10)
        f.write(b"\0\0")
    return Damage(pgno, psize, -1)


def damage_root(data_file: Path, database: bytes | None, seed: int) -> Damage:
    """Overwrite the root page of sub-database ``database`` (None: the main database,
    whose leaf names every sub-database) in ``data_file`` with random bytes from
    ``random.Random(seed)`` (printed): every read of it, or of any sub-database for the
    main one, goes through that page."""
    data = data_file.read_bytes()
    psize, main_root = _meta(data)
    assert main_root != _NO_ROOT, f"{data_file} has no databases"
    pgno = main_root
    if database is not None:
        main_leaf = _leaf_of(data, psize, main_root, database)
        page = _page(data, main_leaf, psize)
        roots = {name: _DB.unpack_from(page, at)[7] for _lo, _hi, _f, name, at in _nodes(page)}
        assert roots.get(database, _NO_ROOT) != _NO_ROOT, f"no sub-database {database!r}"
        pgno = roots[database]
    noise = random.Random(seed).randbytes(psize)
    what = f"sub-database {database!r}" if database is not None else "the main database"
    print(f"damage: {psize} random bytes (seed {seed}) over page {pgno}, the root of {what}")
    with open(data_file, "r+b") as f:
        f.seek(pgno * psize)
        f.write(noise)
    return Damage(pgno, psize, seed)
