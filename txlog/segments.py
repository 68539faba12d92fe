"""Journal segments: AMPS's "journal files" over one LMDB journal.

The journal's records are grouped, in txid order, into numbered **segments** of about
``segment_size`` bytes of stored records (AMPS ``JournalSize``). The newest segment is
*current*: new records go there, and it is sealed (the next commit starts the next
segment) once it holds ``segment_size`` bytes. A sealed segment can be

- **compressed**: its records are moved out of LMDB into a zstd-compressed segment
  file in the journal directory;
- **archived**: its records are moved into a segment file in
  ``JournalArchiveDirectory`` (kept compressed if the segment was compressed);
- **removed**: its records, bookmark index entries and file are deleted.

Compressed and archived segments are still part of the log: replay, replication and
tools read them from their files. Each state change applies to a segment and every
older one, so the segments in each state form a run: removed, then offloaded
(compressed or archived, in any mix), then live ones in LMDB, the current last.

Segment file layout (all integers big-endian)::

    magic   b"AMPSPYSEG1"
    blocks  each one zstd frame (compressed file) or raw bytes (plain file) of
            repeated (u64 txid, u32 length, record value)
    index   per block: u64 first txid, u64 last txid, u64 offset, u32 length
    footer  u32 block count, u8 compressed (0/1), b"SEGEND"

A file is written to a temporary name, fsynced and renamed into place, so a crash
never leaves a partial file under a segment's name. Record values keep their own CRC,
checked whenever they are decoded; compressed blocks carry zstd's frame checksum.
"""

from __future__ import annotations

import bisect
import os
import struct
import threading
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final

import zstandard

SEGMENT_STATES: Final = ("live", "compressed", "archived", "removed")
_STATE_CODE: Final = {name: i for i, name in enumerate(SEGMENT_STATES)}
#: segment table value: first/last txid, first/last local ts, bytes, records, state,
#: cleaned (the LMDB side of the state change is done), then the file path (UTF-8)
_ENTRY = struct.Struct(">QQQQQQBB")
_MAGIC: Final = b"AMPSPYSEG1"
_FOOTER_MAGIC: Final = b"SEGEND"
_FOOTER = struct.Struct(">IB")
_INDEX = struct.Struct(">QQQI")
_REC_HEAD = struct.Struct(">QI")
#: raw bytes of records per block; a read decodes one block
BLOCK_BYTES: Final = 1024 * 1024


class SegmentFileError(Exception):
    """A segment file is missing, truncated or damaged; the text names the file."""


@dataclass(frozen=True)
class Segment:
    """One segment of the journal (a row of the segment table).

    Attributes:
        id: 1, 2, ... in txid order.
        first_txid, last_txid: the txids it holds (inclusive).
        first_ts, last_ts: local timestamps (µs since the epoch) of its first and last
            record.
        size: stored bytes of its records (before segment-file compression).
        records: how many records it holds.
        state: one of :data:`SEGMENT_STATES`.
        cleaned: whether the LMDB side of ``state`` is finished (records moved out of
            LMDB, or for ``removed`` also index entries and file deleted); work still
            to do after a crash is finished by :meth:`txlog.Journal.purge_step`.
        file: the segment file of a compressed or archived segment ("" otherwise).
    """

    id: int
    first_txid: int
    last_txid: int
    first_ts: int
    last_ts: int
    size: int
    records: int
    state: str = "live"
    cleaned: bool = True
    file: str = ""

    @property
    def offloaded(self) -> bool:
        return self.state in ("compressed", "archived")

    def encode(self) -> bytes:
        return (
            _ENTRY.pack(
                self.first_txid,
                self.last_txid,
                self.first_ts,
                self.last_ts,
                self.size,
                self.records,
                _STATE_CODE[self.state],
                int(self.cleaned),
            )
            + self.file.encode()
        )

    @classmethod
    def decode(cls, seg_id: int, value: bytes) -> Segment:
        first, last, first_ts, last_ts, size, records, state, cleaned = _ENTRY.unpack_from(value)
        return cls(
            seg_id,
            first,
            last,
            first_ts,
            last_ts,
            size,
            records,
            SEGMENT_STATES[state],
            bool(cleaned),
            bytes(value[_ENTRY.size :]).decode(),
        )

    def extended(self, last_txid: int, last_ts: int, added_bytes: int, added: int) -> Segment:
        """This (current) segment after a commit appended ``added`` records."""
        # positional: once per commit, and dataclasses.replace costs ~3 µs
        return Segment(
            self.id,
            self.first_txid,
            last_txid,
            self.first_ts,
            last_ts,
            self.size + added_bytes,
            self.records + added,
            self.state,
            self.cleaned,
            self.file,
        )


# ------------------------------------------------------------------ the table (pure)


def grown_table(
    segments: Sequence[Segment], segment_size: int, first: int, now_us: int, sizes: Sequence[int]
) -> tuple[list[Segment], list[Segment]]:
    """The segment table once records of ``sizes`` stored bytes (txids from ``first``,
    local time ``now_us``) are appended, and the rows that changed.

    Records fill the current segment until it holds at least ``segment_size`` bytes,
    then the next one: a commit may fill several, and a segment outgrows the size by
    at most one record. ``segments`` is not changed.
    """
    table = list(segments)
    current = table[-1] if table else None
    open_room = 0
    if current is not None and current.state == "live" and current.size < segment_size:
        open_room = segment_size - current.size
    n = len(sizes)
    if current is not None and open_room:
        added = sum(sizes)
        if added < open_room:  # the usual case: no boundary in this commit
            grown = current.extended(first + n - 1, now_us, added, n)
            table[-1] = grown
            return table, [grown]
    touched: list[Segment] = []
    next_id = current.id + 1 if current is not None else 1
    i, txid = 0, first
    if current is not None and open_room:
        size = count = 0
        while i < n and size < open_room:
            size += sizes[i]
            count += 1
            i += 1
        grown = current.extended(txid + count - 1, now_us, size, count)
        table[-1] = grown
        touched.append(grown)
        txid += count
    while i < n:
        size = count = 0
        while i < n and size < segment_size:
            size += sizes[i]
            count += 1
            i += 1
        seg = Segment(next_id, txid, txid + count - 1, now_us, now_us, size, count)
        table.append(seg)
        touched.append(seg)
        next_id += 1
        txid += count
    return table, touched


def bytes_through(segments: Iterable[Segment], txid: int) -> int:
    """Stored bytes of every record up to ``txid``: exact at segment boundaries, within
    a segment estimated from its mean record size."""
    total = 0
    for seg in segments:
        if txid >= seg.last_txid:
            total += seg.size
            continue
        if txid >= seg.first_txid and seg.records:
            total += seg.size * (txid - seg.first_txid + 1) // seg.records
        break
    return total


def removed_through(segments: Iterable[Segment]) -> int:
    """The newest txid of a removed segment (0 when none is removed)."""
    through = 0
    for seg in segments:
        if seg.state == "removed":
            through = seg.last_txid
    return through


# ------------------------------------------------------------------ segment files


def wants_file(seg: Segment, state: str) -> bool:
    """Whether ``seg`` needs a new segment file to enter ``state`` (``compressed`` only
    from live; ``archived`` from live or compressed)."""
    if state == "compressed":
        return seg.state == "live"
    return seg.state in ("live", "compressed")


def segment_file_name(instance: str, seg_id: int, compressed: bool) -> str:
    """``<instance>.<id, 10 digits>.journal`` (``.journal.zst`` when compressed)."""
    return f"{instance or 'amps'}.{seg_id:010d}.journal" + (".zst" if compressed else "")


def write_segment_file(
    path: Path, records: Iterable[tuple[int, bytes]], *, compressed: bool
) -> tuple[int, int]:
    """Write ``(txid, value)`` pairs (in txid order) as a segment file at ``path``.

    Written to ``path`` + ``.tmp``, fsynced, renamed, and the directory fsynced, so
    ``path`` either does not exist or is complete. Returns (records, file bytes).
    """
    tmp = path.with_name(path.name + ".tmp")
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        index: list[bytes] = []
        count = 0
        compressor = zstandard.ZstdCompressor(level=3, write_checksum=True)
        with open(tmp, "wb") as out:
            out.write(_MAGIC)
            offset = len(_MAGIC)
            block: list[bytes] = []
            block_size = 0
            first = last = 0

            def flush() -> None:
                nonlocal offset, block, block_size
                raw = b"".join(block)
                data = compressor.compress(raw) if compressed else raw
                out.write(data)
                index.append(_INDEX.pack(first, last, offset, len(data)))
                offset += len(data)
                block, block_size = [], 0

            for txid, value in records:
                if not block:
                    first = txid
                last = txid
                block.append(_REC_HEAD.pack(txid, len(value)))
                block.append(value)
                block_size += _REC_HEAD.size + len(value)
                count += 1
                if block_size >= BLOCK_BYTES:
                    flush()
            if block:
                flush()
            out.write(b"".join(index))
            out.write(_FOOTER.pack(len(index), int(compressed)) + _FOOTER_MAGIC)
            out.flush()
            os.fsync(out.fileno())
            size = out.tell()
    except BaseException:
        tmp.unlink(missing_ok=True)  # a damaged record or a full disk: no partial file
        raise
    os.replace(tmp, path)
    fsync_directory(path.parent)
    return count, size


def copy_segment_file(source: Path, target: Path) -> None:
    """Copy a segment file to ``target`` durably (temporary name, fsync, rename)."""
    tmp = target.with_name(target.name + ".tmp")
    target.parent.mkdir(parents=True, exist_ok=True)
    try:
        with open(source, "rb") as src, open(tmp, "wb") as out:
            while chunk := src.read(4 * 1024 * 1024):
                out.write(chunk)
            out.flush()
            os.fsync(out.fileno())
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    os.replace(tmp, target)
    fsync_directory(target.parent)


def fsync_directory(directory: Path) -> None:
    """Make the entries of ``directory`` (a file created, renamed or deleted in it)
    durable."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class SegmentFile:
    """Reads one segment file; safe to share between threads.

    Keeps the file open and the most recently decoded block in memory, so a
    sequential reader (replay, replication catch-up) decodes each block once.

    Raises:
        SegmentFileError: the file is missing, truncated or not a segment file.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        try:
            self._fd = os.open(path, os.O_RDONLY)
        except OSError as exc:
            raise SegmentFileError(
                f"journal segment file {path} cannot be opened ({exc.strerror}); it holds "
                "records the journal still lists: restore it from a backup"
            ) from None
        try:
            size = os.fstat(self._fd).st_size
            tail_size = _FOOTER.size + len(_FOOTER_MAGIC)
            tail = os.pread(self._fd, tail_size, size - tail_size) if size >= tail_size else b""
            if (
                size < len(_MAGIC) + tail_size
                or not tail.endswith(_FOOTER_MAGIC)
                or os.pread(self._fd, len(_MAGIC), 0) != _MAGIC
            ):
                raise self._damaged("not a complete segment file (bad header or footer)")
            n_blocks, compressed = _FOOTER.unpack_from(tail)
            index_size = n_blocks * _INDEX.size
            raw_index = os.pread(self._fd, index_size, size - tail_size - index_size)
            if len(raw_index) != index_size:
                raise self._damaged("its block index is truncated")
        except OSError as exc:
            os.close(self._fd)
            raise self._damaged(f"it cannot be read ({exc.strerror})") from None
        except BaseException:
            os.close(self._fd)
            raise
        self.compressed = bool(compressed)
        self.blocks = [_INDEX.unpack_from(raw_index, i * _INDEX.size) for i in range(n_blocks)]
        self._firsts = [b[0] for b in self.blocks]
        self._lock = threading.Lock()
        self._cached: tuple[int, list[tuple[int, bytes]]] | None = None

    def _damaged(self, what: str) -> SegmentFileError:
        return SegmentFileError(
            f"journal segment file {self.path} is damaged: {what}; restore it from a backup"
        )

    def close(self) -> None:
        """Close the file now (only when no other thread can be reading it)."""
        fd, self._fd = self._fd, -1
        if fd >= 0:
            os.close(fd)

    def __del__(self) -> None:
        # readers may still hold a file the journal let go of; the last one closes it
        if getattr(self, "_fd", -1) >= 0:
            os.close(self._fd)

    def _block(self, i: int) -> list[tuple[int, bytes]]:
        with self._lock:
            cached = self._cached
        if cached is not None and cached[0] == i:
            return cached[1]
        _first, _last, offset, length = self.blocks[i]
        try:
            data = os.pread(self._fd, length, offset)
        except OSError as exc:
            raise self._damaged(f"block {i} cannot be read ({exc.strerror})") from None
        if len(data) != length:
            raise self._damaged(f"block {i} is truncated")
        if self.compressed:
            try:
                data = zstandard.ZstdDecompressor().decompress(data)
            except zstandard.ZstdError as exc:
                raise self._damaged(f"block {i} does not decompress ({exc})") from None
        out: list[tuple[int, bytes]] = []
        pos = 0
        view = memoryview(data)
        while pos < len(data):
            if pos + _REC_HEAD.size > len(data):
                raise self._damaged(f"block {i} ends inside a record header")
            txid, n = _REC_HEAD.unpack_from(data, pos)
            pos += _REC_HEAD.size
            if pos + n > len(data):
                raise self._damaged(f"block {i} ends inside record {txid}")
            out.append((txid, bytes(view[pos : pos + n])))
            pos += n
        with self._lock:
            self._cached = (i, out)
        return out

    def after(self, after_txid: int, stop_txid: int, limit: int) -> list[tuple[int, bytes]]:
        """Up to ``limit`` ``(txid, value)`` pairs with ``after_txid < txid <= stop_txid``."""
        out: list[tuple[int, bytes]] = []
        i = max(bisect.bisect_right(self._firsts, after_txid + 1) - 1, 0)
        while i < len(self.blocks) and len(out) < limit:
            first, last, _offset, _length = self.blocks[i]
            if first > stop_txid:
                break
            if last > after_txid:
                for txid, value in self._block(i):
                    if txid <= after_txid:
                        continue
                    if txid > stop_txid or len(out) >= limit:
                        return out
                    out.append((txid, value))
            i += 1
        return out

    def __iter__(self) -> Iterator[tuple[int, bytes]]:
        for i in range(len(self.blocks)):
            yield from self._block(i)
