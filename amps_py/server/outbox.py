"""The bytes waiting for one client, in memory or spilled to disk (client offlining).

A :class:`SpillingOutbox` is a FIFO of byte pieces (whole frames or frame pieces, as
the caller appends them). While it is *online* the pieces wait in memory. When the
instance's ``MessageMemoryLimit`` is exceeded the session offlines its biggest client
(:meth:`SpillingOutbox.go_offline`): the in-memory backlog becomes the head of the spill
file's write batch and every later append goes behind it, until the writer
(:meth:`~SpillingOutbox.take`) has caught up with everything spilled. The moved backlog
is written a step at a time (:meth:`~SpillingOutbox.spill`, called by the session
between other work, and a step with each batch of appends), so offlining a client with
hundreds of megabytes waiting never stalls the caller for long. Then the
spill files are removed and the outbox is online again by itself;
:meth:`~SpillingOutbox.poll_transition` reports that once, so the caller can log it
and fire ``amps-action-on-offline-stop``.

Contract:

* Order: :meth:`~SpillingOutbox.take` returns the appended pieces in append order, each
  piece whole and unchanged, whatever the online/offline transitions in between: the
  bytes on the wire are identical to an in-memory-only outbox's.
* Accounting (exact, payload bytes only): a queued piece counts in
  :attr:`~SpillingOutbox.memory_bytes` if it was appended while online, and in
  :attr:`~SpillingOutbox.disk_bytes` if it was moved by ``go_offline`` or appended while
  offline, until it is taken. So an offline outbox holds 0 memory bytes; the small,
  bounded buffers it keeps while offline (a write batch of about ``write_batch`` bytes
  and a read-ahead of about ``max(max_bytes, read_block)`` bytes, each plus at most one
  piece) are overhead, not backlog; right after ``go_offline`` the write batch also
  holds the moved backlog not yet written (:attr:`~SpillingOutbox.unwritten_backlog`),
  which only shrinks. :attr:`~SpillingOutbox.file_bytes` is the space the spill
  files really take (record headers and already-read records included).
* Ages: every piece carries the time it was appended (also on disk), so
  :meth:`~SpillingOutbox.oldest_age` is exact for ``ClientMessageAgeLimit`` across
  transitions.
* Disk space is bounded: the spill is a chain of segment files of about
  ``segment_bytes`` each; a segment is deleted as soon as the reader has read past it,
  so a client that stays offline while draining does not grow its files forever.

Error handling: a disk error (full disk, permission denied, a missing or unwritable
``MessageDiskPath``, a read error) raises :class:`SpillError` naming the file and the
fix; the caller disconnects the client (reason ``slow client``) and calls
:meth:`~SpillingOutbox.discard`. A failed ``go_offline`` leaves the outbox online with
its backlog in memory and no file behind; after a failed append or take the outbox is
only good for ``discard``.

Resource handling: the outbox owns its spill files and their descriptors; ``discard``
(a disconnected client) and coming back online close and delete them. File I/O is
plain blocking ``os`` calls (no fsync: a spill file is never read after a restart);
``go_offline`` writes one batch at once (so a missing, unwritable or full
``MessageDiskPath`` is found there) and leaves the rest of the backlog to
:meth:`~SpillingOutbox.spill`, which a caller on an event loop calls a step at a time.

Spill file format: a sequence of records, each a 12-byte header (big-endian ``u32``
piece length, ``f64`` append time) followed by the piece's bytes.

Pure logic: no trio; the current time is passed in.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import struct
import tempfile
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass
from itertools import islice
from pathlib import Path
from typing import Final, Literal

__all__ = [
    "READ_BLOCK",
    "SEGMENT_BYTES",
    "WRITE_BATCH",
    "OutboxStatistics",
    "SpillError",
    "SpillingOutbox",
]

#: appends while offline are buffered and written in batches of about this many bytes
WRITE_BATCH: Final = 256 * 1024
#: a spill segment file is closed for writing (and a new one begun) past this size
SEGMENT_BYTES: Final = 64 * 1024 * 1024
#: the reader reads the spill file in blocks of about this many bytes
READ_BLOCK: Final = 1024 * 1024

_HEADER: Final = struct.Struct(">Id")
_MAX_PIECE: Final = 2**32 - 1
_UNSAFE: Final = re.compile(r"[^A-Za-z0-9._-]+")

Transition = Literal["online"]


class SpillError(Exception):
    """A spill file could not be created, written or read.

    ``path`` is the file (or, when it could not be created, the directory); the
    message says what to fix. The client this outbox belongs to cannot be served any
    more: disconnect it as a slow client and :meth:`SpillingOutbox.discard` the outbox.
    """

    def __init__(self, path: Path, doing: str, exc: OSError) -> None:
        self.path = path
        self.errno = exc.errno
        reason = exc.strerror or str(exc)
        if exc.errno in (errno.ENOSPC, errno.EDQUOT):
            fix = (
                "free space on that disk, or set MessageDiskPath to a disk with room "
                "(and MessageDiskLimit below its free space)"
            )
        elif exc.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
            fix = "give the server write permission there, or set MessageDiskPath elsewhere"
        elif exc.errno in (errno.ENOENT, errno.ENOTDIR):
            fix = "create that directory, or set MessageDiskPath to an existing directory"
        else:
            fix = "check that disk, or set MessageDiskPath to another directory"
        super().__init__(f"cannot {doing} the spill file {path}: {reason}; {fix}")


@dataclass(frozen=True)
class OutboxStatistics:
    """A snapshot of one outbox, for the admin tree and metrics."""

    pieces: int
    memory_bytes: int
    disk_bytes: int
    file_bytes: int
    offline: bool
    #: how many times this outbox went offline
    offline_count: int
    #: the spill segment files now open, oldest first (empty while online)
    spill_paths: tuple[Path, ...]


class _Segment:
    """One spill file: written at its end, read from ``read_pos``."""

    __slots__ = ("fd", "path", "read_pos", "size")

    def __init__(self, fd: int, path: Path) -> None:
        self.fd = fd
        self.path = path
        self.size = 0  # bytes written (records are complete on disk up to here)
        self.read_pos = 0

    def close(self) -> None:
        """Close and delete the file; errors are ignored (it is being given up)."""
        with contextlib.suppress(OSError):
            os.close(self.fd)
        with contextlib.suppress(OSError):
            os.unlink(self.path)


def _write_all(segment: _Segment, data: bytes | memoryview) -> None:
    view = memoryview(data)
    while view:
        try:
            written = os.write(segment.fd, view)
        except OSError as exc:
            raise SpillError(segment.path, "write", exc) from exc
        view = view[written:]
        segment.size += written


def _safe_name(name: str) -> str:
    return _UNSAFE.sub("_", name).strip("._")[:64] or "client"


class SpillingOutbox:
    """The bytes waiting for one client, in order; spills to disk while offline.

    Args:
        name: the connection's name (e.g. client name and connection id); spill files
            are named ``amps-py-spill-<name>-<random>.spill``.
        write_batch: bytes buffered while offline before one write to the spill file.
        segment_bytes: size past which a new spill segment file is begun.
        read_block: bytes read from the spill file at a time (more when ``take`` asks
            for more, or when one piece is larger).
    """

    def __init__(
        self,
        name: str,
        *,
        write_batch: int = WRITE_BATCH,
        segment_bytes: int = SEGMENT_BYTES,
        read_block: int = READ_BLOCK,
    ) -> None:
        if min(write_batch, segment_bytes, read_block) <= 0:
            raise ValueError("`write_batch`, `segment_bytes` and `read_block` must be positive")
        self.name = name
        self._prefix = f"amps-py-spill-{_safe_name(name)}-"
        self._write_batch = write_batch
        self._segment_bytes = segment_bytes
        self._read_block_bytes = read_block
        # online: the backlog, (piece, append time) in order
        self._memory: deque[tuple[bytes, float]] = deque()
        self._memory_bytes = 0
        # offline: read-ahead (from the oldest segment), then the segments' unread
        # records, then the write batch not yet written
        self._directory: Path | None = None
        self._segments: deque[_Segment] = deque()
        self._read_ahead: deque[tuple[bytes, float]] = deque()
        self._batch: deque[tuple[bytes, float]] = deque()
        self._batch_bytes = 0
        self._disk_bytes = 0
        self._disk_head_time: float | None = None  # cached header time at the read position
        self._pieces = 0
        self._offline_count = 0
        self._transition: Transition | None = None

    # ---------------------------------------------------------------- state
    @property
    def offline(self) -> bool:
        """Whether the backlog is on disk (appends go to the spill file)."""
        return self._directory is not None

    @property
    def memory_bytes(self) -> int:
        """Queued bytes held in memory (appended while online, not yet taken)."""
        return self._memory_bytes

    @property
    def disk_bytes(self) -> int:
        """Queued bytes spilled (moved to or appended to disk while offline, not yet
        taken); what counts against ``MessageDiskLimit``."""
        return self._disk_bytes

    @property
    def queued_bytes(self) -> int:
        """All bytes not yet taken: ``memory_bytes + disk_bytes``."""
        return self._memory_bytes + self._disk_bytes

    @property
    def file_bytes(self) -> int:
        """Bytes the spill files take on disk now (headers and read records included,
        the write batch not yet written excluded)."""
        return sum(segment.size for segment in self._segments)

    @property
    def spill_paths(self) -> tuple[Path, ...]:
        """The spill segment files, oldest first (empty while online)."""
        return tuple(segment.path for segment in self._segments)

    def __len__(self) -> int:
        """The number of pieces not yet taken."""
        return self._pieces

    def oldest_age(self, now: float) -> float:
        """Seconds the oldest piece not yet taken has waited (0.0 when empty), for
        ``ClientMessageAgeLimit``. Offline, this may read one record header from disk
        (then it is cached until the read position moves)."""
        oldest = self._oldest_time()
        return 0.0 if oldest is None else max(0.0, now - oldest)

    def poll_transition(self) -> Transition | None:
        """``"online"`` once after the outbox came back online by itself (the reader
        caught up with everything spilled and the files were removed), else None."""
        transition, self._transition = self._transition, None
        return transition

    def statistics(self) -> OutboxStatistics:
        return OutboxStatistics(
            pieces=self._pieces,
            memory_bytes=self._memory_bytes,
            disk_bytes=self._disk_bytes,
            file_bytes=self.file_bytes,
            offline=self.offline,
            offline_count=self._offline_count,
            spill_paths=self.spill_paths,
        )

    # ---------------------------------------------------------------- writing
    def append(self, data: bytes, now: float) -> None:
        """Queue ``data`` (taken later whole, never split or joined with others).

        Raises:
            SpillError: offline, and writing a batch to the spill file failed.
            ValueError: ``data`` is 4 GiB or more.
        """
        if self._directory is None:
            # online: the hot path (one call per delivery piece); a piece in memory is
            # a frame or part of one, so below the transport's MaxMessageSize and the
            # spill format's 4 GiB
            self._memory.append((data, now))
            self._memory_bytes += len(data)
            self._pieces += 1
            return
        size = len(data)
        if size > _MAX_PIECE:
            raise ValueError(f"a piece of {size} bytes is too large for the outbox (max 4 GiB)")
        self._pieces += 1
        self._batch.append((data, now))
        self._batch_bytes += size
        self._disk_bytes += size
        if self._batch_bytes >= self._write_batch:
            self._flush()

    def go_offline(self, directory: Path) -> None:
        """Spill: write the whole in-memory backlog to a new spill file under
        ``directory`` (``MessageDiskPath``); later appends go to disk until the reader
        catches up.

        The backlog becomes the head of the write batch: its first ``write_batch`` bytes
        are written now, the rest by :meth:`spill` (and a step with each batch of later
        appends); :meth:`take` hands unwritten pieces over directly once it reaches
        them.

        Raises:
            SpillError: the file could not be created or its first batch written; the
                outbox is then unchanged (online, backlog in memory) and no file is
                left behind.
            RuntimeError: already offline.
        """
        if self._directory is not None:
            raise RuntimeError(f"the outbox of {self.name!r} is already offline")
        assert not self._batch, "an online outbox has no write batch"
        self._directory = directory
        self._batch, self._batch_bytes = self._memory, self._memory_bytes
        try:
            self._new_segment()
            self._write_batch_head(self._write_batch)
        except SpillError:
            for segment in self._segments:
                segment.close()
            self._segments.clear()
            self._directory = None
            # nothing was taken from the batch: it is the backlog, whole
            self._memory, self._batch, self._batch_bytes = self._batch, deque(), 0
            raise
        self._disk_bytes = self._memory_bytes
        self._memory = deque()
        self._memory_bytes = 0
        self._disk_head_time = None
        self._offline_count += 1

    def _new_segment(self) -> _Segment:
        assert self._directory is not None
        try:
            fd, name = tempfile.mkstemp(prefix=self._prefix, suffix=".spill", dir=self._directory)
        except OSError as exc:
            where = self._directory / f"{self._prefix}*.spill"
            raise SpillError(where, "create", exc) from exc
        segment = _Segment(fd, Path(name))
        self._segments.append(segment)
        return segment

    def _write_records(self, records: Iterable[tuple[bytes, float]]) -> None:
        """Write records at the end of the spill, in chunks of about ``write_batch``
        bytes, beginning a new segment when the last one is full."""
        chunk: list[bytes] = []
        chunk_bytes = 0
        pack = _HEADER.pack
        for data, when in records:
            chunk.append(pack(len(data), when))
            chunk.append(data)
            chunk_bytes += _HEADER.size + len(data)
            if chunk_bytes >= self._write_batch:
                self._write_chunk(b"".join(chunk))
                chunk = []
                chunk_bytes = 0
        if chunk:
            self._write_chunk(b"".join(chunk))

    def _write_chunk(self, chunk: bytes) -> None:
        segment = self._segments[-1] if self._segments else self._new_segment()
        if segment.size >= self._segment_bytes:
            segment = self._new_segment()
        _write_all(segment, chunk)

    def _flush(self) -> None:
        """Write the head of the batch: all of a normal batch (about ``write_batch``
        bytes); two batches' worth while a moved backlog is still being written, so
        appends help write it out without one long write."""
        self._write_batch_head(2 * self._write_batch)

    def _write_batch_head(self, max_bytes: int) -> None:
        """Write whole pieces from the head of the write batch to the spill file, about
        ``max_bytes`` (at least one piece); they leave the batch only once written."""
        batch = self._batch
        count = 0
        size = 0
        for data, _ in batch:
            count += 1
            size += len(data)
            if size >= max_bytes:
                break
        if not count:
            return
        self._write_records(list(islice(batch, count)))
        for _ in range(count):
            batch.popleft()
        self._batch_bytes -= size

    @property
    def unwritten_backlog(self) -> int:
        """Bytes of the write batch beyond one normal batch (``write_batch``): the part
        of a moved backlog still to be written, which :meth:`spill` writes."""
        return max(0, self._batch_bytes - self._write_batch) if self._directory else 0

    def spill(self, max_bytes: int) -> int:
        """Write about ``max_bytes`` more of the moved backlog to the spill file (nothing
        while :attr:`unwritten_backlog` is 0); returns :attr:`unwritten_backlog` after.

        Raises:
            SpillError: the write failed (the outbox is then only good for
                :meth:`discard`).
        """
        if self.unwritten_backlog:
            self._write_batch_head(min(max_bytes, self.unwritten_backlog))
        return self.unwritten_backlog

    # ---------------------------------------------------------------- reading
    def take(self, max_bytes: int) -> list[bytes]:
        """Remove and return the next pieces, in order: as many whole pieces as fit in
        ``max_bytes``, but always at least one when any is queued (a larger piece is
        returned whole, alone). The caller writes them to the client.

        Offline, the pieces come from the spill files (then from the write batch, which
        is handed over without a disk round trip once the files are read). When the
        last spilled piece is taken the outbox is online again: the files are removed
        and :meth:`poll_transition` returns ``"online"``.

        Raises:
            SpillError: reading the spill file failed.
            ValueError: ``max_bytes`` is not positive.
        """
        if max_bytes <= 0:
            raise ValueError("`max_bytes` must be positive")
        if self._directory is None:
            return self._take_from(self._memory, max_bytes, online=True)
        taken: list[bytes] = []
        budget = max_bytes
        while budget > 0 or not taken:
            if not self._read_ahead and not self._read_block(max(budget, 1)):
                break
            before = len(taken)
            got = self._take_from(self._read_ahead, budget, online=False, into=taken)
            if len(taken) == before:
                break
            budget -= sum(len(piece) for piece in got)
        if (budget > 0 or not taken) and not self._read_ahead and not self._unread_on_disk():
            # the files are read: hand the write batch over directly
            moved = self._take_from(self._batch, budget, online=False, into=taken)
            self._batch_bytes -= sum(len(piece) for piece in moved)
        self._disk_head_time = None
        if self._pieces == 0:
            self._come_online()
        return taken

    def _take_from(
        self,
        source: deque[tuple[bytes, float]],
        budget: int,
        *,
        online: bool,
        into: list[bytes] | None = None,
    ) -> list[bytes]:
        """Move whole pieces from the head of ``source`` while they fit in ``budget``
        (at least one if ``into`` is still empty); returns the pieces moved."""
        out = into if into is not None else []
        moved: list[bytes] = []
        size_taken = 0
        while source:
            size = len(source[0][0])
            if size > budget - size_taken and (out or moved):
                break
            data = source.popleft()[0]
            moved.append(data)
            out.append(data)
            size_taken += size
            if size_taken >= budget:
                break
        self._pieces -= len(moved)
        if online:
            self._memory_bytes -= size_taken
        else:
            self._disk_bytes -= size_taken
        return moved

    def _unread_on_disk(self) -> bool:
        segments = self._segments
        while segments and segments[0].read_pos >= segments[0].size and len(segments) > 1:
            segments.popleft().close()
        return bool(segments) and segments[0].read_pos < segments[0].size

    def _read_block(self, want: int) -> bool:
        """Read records from the oldest segment into the read-ahead (about
        ``max(want, read_block)`` bytes, at least one whole record); False when the
        files hold no unread record."""
        if not self._unread_on_disk():
            return False
        segment = self._segments[0]
        pos = segment.read_pos
        length = min(segment.size - pos, max(want, self._read_block_bytes, _HEADER.size))
        block = self._pread(segment, length, pos)
        view = memoryview(block)
        offset = 0
        header = _HEADER.size
        while len(view) - offset >= header:
            size, when = _HEADER.unpack_from(view, offset)
            if offset + header + size > len(view):
                if offset:
                    break
                # a record larger than the block: read exactly it
                record = self._pread(segment, header + size, pos)
                self._read_ahead.append((record[header:], when))
                offset = header + size
                break
            start = offset + header
            self._read_ahead.append((bytes(view[start : start + size]), when))
            offset = start + size
        segment.read_pos = pos + offset
        return True

    def _pread(self, segment: _Segment, length: int, pos: int) -> bytes:
        try:
            data = os.pread(segment.fd, length, pos)
        except OSError as exc:
            raise SpillError(segment.path, "read", exc) from exc
        if len(data) != length:
            raise SpillError(
                segment.path,
                "read",
                OSError(
                    errno.EIO,
                    f"the file is shorter than written (read {len(data)} of "
                    f"{length} bytes at {pos}); was it truncated or removed?",
                ),
            )
        return data

    def _oldest_time(self) -> float | None:
        if self._directory is None:
            return self._memory[0][1] if self._memory else None
        if self._read_ahead:
            return self._read_ahead[0][1]
        if self._disk_head_time is None and self._unread_on_disk():
            segment = self._segments[0]
            header = self._pread(segment, _HEADER.size, segment.read_pos)
            self._disk_head_time = _HEADER.unpack(header)[1]
        if self._disk_head_time is not None:
            return self._disk_head_time
        return self._batch[0][1] if self._batch else None

    # ---------------------------------------------------------------- ending
    def _come_online(self) -> None:
        self._close_files()
        self._read_ahead.clear()
        self._batch.clear()
        self._batch_bytes = 0
        self._transition = "online"

    def _close_files(self) -> None:
        for segment in self._segments:
            segment.close()
        self._segments.clear()
        self._directory = None
        self._disk_head_time = None

    def discard(self) -> None:
        """Empty the outbox and delete its spill files (a disconnected client); the
        outbox is online and empty afterwards. Safe after a :class:`SpillError`."""
        self._close_files()
        self._read_ahead.clear()
        self._batch.clear()
        self._batch_bytes = 0
        self._memory.clear()
        self._memory_bytes = 0
        self._disk_bytes = 0
        self._pieces = 0
        self._transition = None
