"""Publish stores: every publish is kept until a persisted ack covers it.

:class:`MemoryPublishStore` and :class:`FilePublishStore` implement
:class:`amps_py.client.store_api.PublishStore`; read its contract first. Both are plain
blocking code, used by one task at a time, except that :meth:`~FilePublishStore.sync`
may run in a worker thread while the owner's thread stores (``concurrent_sync``). The HA
client calls ``store`` on its own thread (one OS write, no fsync) and ``sync``,
``discard_through`` and ``unacked`` in a worker thread.

Common to both:

* Sequence numbers are 1, 2, ...; a file store continues after the highest ever
  assigned, across reopens, even when everything was discarded.
* ``discard_through(s)`` with ``s`` beyond :attr:`last_seq` (a logon ack from a server
  that holds more of this client name than the store remembers, e.g. the store
  directory was deleted) discards everything and moves :attr:`last_seq` up to ``s``,
  so that new publishes are not taken for duplicates by the server.
* :meth:`store` does not refuse a message: :meth:`has_room` is the caller's check
  (``bytes_kept + size <= max_bytes``, or the store is empty).
* :meth:`unacked` yields what is kept when it is called, in sequence order, skipping
  what a :meth:`discard_through` drops while the iteration is under way. A file store
  keeps only an index in memory and reads each publish back from its segment as the
  iterator advances (blocking I/O: iterate it in a worker thread).

File store on disk (directory ``D``)::

    D/lock                              flock()ed while open; holds the owner's pid
    D/seg-<first seq, 20 digits>.aps    segments: append-only records
    D/discarded                         2 slots "discarded_through <n> crc32 <crc>"

The record format is in :mod:`amps_py.client.publish_record` (a header with the body
length, CRCs of header and body, seq, command, topic and sow_key lengths; then topic,
sow_key and payload). A segment's name is the seq of its first record; a new segment
is started when the current one would pass ``segment_bytes`` (a larger record goes in
a segment of its own). Segments never have gaps inside; a gap between segments (after
a ``discard_through`` beyond :attr:`last_seq`) means everything before it is discarded.
Only the last segment is appended to; it is never deleted, so its name and records
remember :attr:`last_seq` even when the store is empty. Earlier segments are deleted
once every record in them is discarded. Each :meth:`discard_through` that moves the
mark overwrites one of the marker's two slots in place (alternately: a torn write
leaves the other; a temporary file and rename would cost a flush of the data on ext4,
hundreds of microseconds per ack); on open, records at or below the higher intact
slot are skipped. A lost or damaged marker only makes the store offer again publishes
the server already has (the logon ack's ``s`` discards them again), never lose one.

Durability contract (file store):

* :meth:`store` writes the record to the OS before it returns (no fsync): a crash of
  the process loses nothing :meth:`store` returned for.
* :meth:`sync` fsyncs the current segment and, when a segment was created or deleted
  since, the directory: everything stored before it survives a power loss. The HA
  client calls it once per group of publishes, before sending the group. Starting a
  new segment fsyncs the finished one (one fsync per ``segment_bytes``), so only the
  last segment can ever end in an unfinished record. The marker is never fsynced (see
  above: losing it costs only resends).
* On open, an unfinished record at the end of the last segment (a crash in the middle
  of :meth:`store`; it was never returned for) is truncated away with a warning.
  Anything else that does not read back intact (a bad checksum in the middle of a
  segment, a broken sequence) raises :class:`PublishStoreDamaged` naming the file and
  the offset: the store never drops publishes on its own.

Error handling: file system failures raise :class:`PublishStoreError` (an ``OSError``
with the errno of the failure) naming the file and what to do; a directory in use by
another open store raises :class:`PublishStoreInUse` naming the directory and the
process holding it.
"""

from __future__ import annotations

import errno
import fcntl
import logging
import os
import re
import threading
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Final

from . import publish_record as codec
from .store_api import StoredPublish

__all__ = [
    "DEFAULT_MAX_BYTES",
    "DEFAULT_SEGMENT_BYTES",
    "FilePublishStore",
    "MemoryPublishStore",
    "PublishStoreDamaged",
    "PublishStoreError",
    "PublishStoreInUse",
]

log = logging.getLogger("amps_py.client.publish_store")

#: the default bound on payload bytes kept (the publisher blocks beyond it)
DEFAULT_MAX_BYTES: Final = 64 * 1024 * 1024
#: the default segment size: small enough that acked data is freed soon, large enough
#: that the fsync at each new segment is rare
DEFAULT_SEGMENT_BYTES: Final = 4 * 1024 * 1024

LOCK_FILE: Final = "lock"
MARKER_FILE: Final = "discarded"
_SEGMENT_RE: Final = re.compile(r"seg-(\d{20})\.aps")


class PublishStoreError(OSError):
    """A file publish store could not do its work; the message names the file and the
    fix. ``errno`` is that of the failing call (or ``EIO`` for damage)."""


class PublishStoreDamaged(PublishStoreError):
    """A store file does not read back as written (not a torn tail)."""


class PublishStoreInUse(PublishStoreError):
    """The directory is held by another open publish store."""


def _check_sizes(max_bytes: int) -> None:
    if max_bytes <= 0:
        raise ValueError(f"max_bytes must be positive, not {max_bytes}")


def _check_command(command: str) -> None:
    if command not in codec.COMMANDS:
        raise ValueError(
            f"a publish store keeps only {', '.join(codec.COMMANDS)} commands, not {command!r}"
        )


class MemoryPublishStore:
    """Publishes kept in memory: they survive reconnects and failovers, not a crash of
    the process."""

    #: :meth:`sync` (a no-op) may run while other calls do (see the HA client)
    concurrent_sync = True

    def __init__(self, max_bytes: int = DEFAULT_MAX_BYTES) -> None:
        _check_sizes(max_bytes)
        self.max_bytes = max_bytes
        self._kept: deque[StoredPublish] = deque()
        self._last_seq = 0
        self._discarded = 0
        self._bytes = 0

    @property
    def last_seq(self) -> int:
        return self._last_seq

    @property
    def discarded_through(self) -> int:
        return self._discarded

    def __len__(self) -> int:
        return len(self._kept)

    @property
    def bytes_kept(self) -> int:
        return self._bytes

    def has_room(self, size: int) -> bool:
        return not self._kept or self._bytes + size <= self.max_bytes

    def store(self, command: str, topic: str, data: bytes, sow_key: str = "") -> int:
        _check_command(command)
        self._last_seq += 1
        self._kept.append(StoredPublish(self._last_seq, command, topic, bytes(data), sow_key))
        self._bytes += len(data)
        return self._last_seq

    def sync(self) -> None:
        pass

    def discard_through(self, seq: int) -> int:
        dropped = 0
        while self._kept and self._kept[0].seq <= seq:
            self._bytes -= len(self._kept.popleft().data)
            dropped += 1
        self._discarded = max(self._discarded, seq)
        self._last_seq = max(self._last_seq, self._discarded)
        return dropped

    def unacked(self) -> Iterator[StoredPublish]:
        for publish in list(self._kept):
            if publish.seq > self._discarded:
                yield publish

    def close(self) -> None:
        pass

    def __enter__(self) -> MemoryPublishStore:
        return self

    def __exit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


@dataclass(slots=True)
class _Segment:
    first_seq: int
    path: Path
    last_seq: int  # first_seq - 1 while it holds no record
    size: int


@dataclass(frozen=True, slots=True)
class _Entry:
    seq: int
    segment: _Segment
    offset: int
    end: int
    payload: int


def _advice(exc: OSError) -> str:
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return (
            "the file system is full: free space there, or give the store a directory on "
            "another disk (a store needs max_bytes plus one segment)"
        )
    if exc.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
        return (
            "this process may not write there: give its user write access to the "
            "directory, or choose another store directory"
        )
    if exc.errno in (errno.ENOTDIR, errno.EEXIST):
        return "a file is in the way of the store directory: choose another path"
    return "check the path, its permissions and the disk"


class FilePublishStore:
    """Publishes kept in append-only segment files in ``directory``: they survive a
    crash of the process (and, once :meth:`sync` returned, a power loss). See the
    module docstring for the files and the durability contract.

    Args:
        directory: the store's own directory (created if missing); one open store per
            directory (one per client name).
        max_bytes: the bound on payload bytes kept (:meth:`has_room`).
        segment_bytes: start a new segment file beyond this size.

    Raises:
        PublishStoreInUse: another open store holds the directory.
        PublishStoreDamaged: a store file is damaged (not a torn tail).
        PublishStoreError: the directory or a file cannot be created, read or written.
    """

    #: :meth:`sync` may run in a worker thread while :meth:`store` runs in the owner's
    concurrent_sync = True

    def __init__(
        self,
        directory: str | os.PathLike[str],
        max_bytes: int = DEFAULT_MAX_BYTES,
        segment_bytes: int = DEFAULT_SEGMENT_BYTES,
    ) -> None:
        _check_sizes(max_bytes)
        if segment_bytes <= len(codec.SEGMENT_MAGIC):
            raise ValueError(f"segment_bytes must be larger than {len(codec.SEGMENT_MAGIC)}")
        self.directory = Path(directory)
        self.max_bytes = max_bytes
        self.segment_bytes = segment_bytes
        self._index: deque[_Entry] = deque()
        self._segments: deque[_Segment] = deque()
        self._bytes = 0
        self._discarded = 0
        self._fd = -1  # the last segment, open for appending
        #: guards swapping ``_fd`` against a :meth:`sync` in another thread
        self._fd_lock = threading.Lock()
        self._marker_fd = -1
        self._marker_slot = 0
        self._dir_dirty = False
        self._closed = False
        self._lock_fd = self._lock()
        try:
            self._open()
        except BaseException:
            self._release()
            raise

    # ------------------------------------------------------------------ opening

    def _fail(self, exc: OSError, doing: str, path: Path) -> PublishStoreError:
        return PublishStoreError(
            exc.errno or errno.EIO,
            f"publish store: cannot {doing} {path}: {exc.strerror or exc}; {_advice(exc)}",
        )

    def _lock(self) -> int:
        path = self.directory / LOCK_FILE
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as exc:
            raise self._fail(exc, "create", path) from exc
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
            os.close(fd)
            raise PublishStoreInUse(
                errno.EBUSY,
                f"publish store directory {self.directory} is already in use (by process "
                f"{holder}); give each publisher (each client name) its own store "
                "directory, or stop the other process first",
            ) from None
        try:
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        except OSError as exc:
            os.close(fd)
            raise self._fail(exc, "write", path) from exc
        return fd

    def _open(self) -> None:
        self._discarded = self._read_marker()
        names = sorted(
            (int(m.group(1)), p)
            for p in self.directory.iterdir()
            if (m := _SEGMENT_RE.fullmatch(p.name)) is not None
        )
        previous_last = 0
        for position, (first_seq, path) in enumerate(names):
            last = position == len(names) - 1
            if previous_last >= first_seq:
                raise self._damaged(
                    path,
                    0,
                    f"it starts at seq {first_seq}, at or below the previous "
                    f"segment's last seq {previous_last}",
                )
            if first_seq > previous_last + 1:
                # before the first segment, or a gap left by a discard_through beyond
                # last_seq: everything before it is discarded
                self._discarded = max(self._discarded, first_seq - 1)
            segment = self._load(first_seq, path, last)
            previous_last = segment.last_seq
            self._segments.append(segment)
        # drop index entries at or below the marker / gaps
        while self._index and self._index[0].seq <= self._discarded:
            self._bytes -= self._index.popleft().payload
        if not self._segments or self._segments[-1].last_seq < self._discarded:
            # a new store; or the marker is ahead of the segments (they were removed by
            # hand): numbering goes on after the mark
            self._new_segment(self._discarded + 1)
        else:
            tail = self._segments[-1]
            try:
                self._fd = os.open(tail.path, os.O_WRONLY)
            except OSError as exc:
                raise self._fail(exc, "open", tail.path) from exc
        self._delete_discarded_segments()

    def _read_marker(self) -> int:
        path = self.directory / MARKER_FILE
        try:
            self._marker_fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
            raw = os.pread(self._marker_fd, 2 * codec.MARKER_SLOT, 0)
        except OSError as exc:
            raise self._fail(exc, "open", path) from exc
        if not raw:
            return 0
        value = codec.decode_marker(raw)
        if value is None:
            log.warning(
                "publish store: %s is damaged; starting from the segments alone (the "
                "server's logon ack discards what it already has again)",
                path,
            )
            return 0
        return value

    def _damaged(self, path: Path, offset: int, reason: str) -> PublishStoreDamaged:
        return PublishStoreDamaged(
            errno.EIO,
            f"publish store: {path} is damaged at offset {offset} ({reason}). The store "
            "does not drop publishes on its own. If the machine lost power before the "
            "last sync(), the records from this offset on were never made durable: "
            f"truncate the file there (truncate -s {offset} {path}) to give them up; "
            "otherwise restore the directory from a copy, or move it away to start "
            "afresh (the server then has only what it acknowledged)",
        )

    def _load(self, first_seq: int, path: Path, last: bool) -> _Segment:
        try:
            with open(path, "rb") as f:
                buf = f.read()
        except OSError as exc:
            raise self._fail(exc, "read", path) from exc
        magic = codec.SEGMENT_MAGIC
        if buf[: len(magic)] != magic:
            if last and len(buf) < len(magic) and magic.startswith(buf):
                log.warning(
                    "publish store: %s is a segment whose creation was cut short (%d "
                    "bytes): rewritten empty",
                    path,
                    len(buf),
                )
                self._rewrite(path, magic)
                return _Segment(first_seq, path, first_seq - 1, len(magic))
            raise self._damaged(path, 0, "not a publish store segment")
        result = codec.scan(buf)
        expected = first_seq
        segment = _Segment(first_seq, path, first_seq - 1, len(buf))
        for record in result.records:
            if record.seq != expected:
                raise self._damaged(
                    path, record.offset, f"seq {record.seq} where {expected} was expected"
                )
            expected += 1
            self._index.append(
                _Entry(record.seq, segment, record.offset, record.end, len(record.data))
            )
            self._bytes += len(record.data)
        segment.last_seq = expected - 1
        problem = result.problem
        if isinstance(problem, codec.Torn) and last:
            log.warning(
                "publish store: %s ends with an unfinished record at offset %d (%s; a "
                "crash during store(), which never returned for it): truncated",
                path,
                problem.offset,
                problem.reason,
            )
            try:
                os.truncate(path, problem.offset)
            except OSError as exc:
                raise self._fail(exc, "truncate", path) from exc
            segment.size = problem.offset
        elif problem is not None:
            where = "" if last else " (not the last segment, which is never torn)"
            raise self._damaged(path, problem.offset, problem.reason + where)
        return segment

    def _rewrite(self, path: Path, content: bytes) -> None:
        try:
            with open(path, "wb") as f:
                f.write(content)
        except OSError as exc:
            raise self._fail(exc, "write", path) from exc

    # ------------------------------------------------------------------ the protocol

    @property
    def last_seq(self) -> int:
        return self._segments[-1].last_seq

    @property
    def discarded_through(self) -> int:
        return self._discarded

    def __len__(self) -> int:
        return len(self._index)

    @property
    def bytes_kept(self) -> int:
        return self._bytes

    def has_room(self, size: int) -> bool:
        return not self._index or self._bytes + size <= self.max_bytes

    def store(self, command: str, topic: str, data: bytes, sow_key: str = "") -> int:
        self._check_open()
        tail = self._segments[-1]
        seq = tail.last_seq + 1
        record = codec.encode_record(seq, command, topic, sow_key, data)
        if tail.last_seq >= tail.first_seq and tail.size + len(record) > self.segment_bytes:
            self._new_segment(seq)
            tail = self._segments[-1]
        offset = tail.size
        try:
            self._write_all(record, offset)
        except OSError as exc:
            self._undo(tail, offset)
            raise self._fail(exc, "write", tail.path) from exc
        tail.size = offset + len(record)
        tail.last_seq = seq
        self._index.append(_Entry(seq, tail, offset, tail.size, len(data)))
        self._bytes += len(data)
        return seq

    def _write_all(self, record: bytes, offset: int) -> None:
        view = memoryview(record)
        while view:
            written = os.pwrite(self._fd, view, offset)
            view = view[written:]
            offset += written

    def _undo(self, tail: _Segment, offset: int) -> None:
        """Cut a partly written record off again (a full disk): the store stays as it was."""
        try:
            os.ftruncate(self._fd, offset)
        except OSError:
            log.warning(
                "publish store: could not cut the failed write off %s at offset %d; the "
                "next open truncates it as a torn tail",
                tail.path,
                offset,
            )

    def _new_segment(self, first_seq: int) -> None:
        """Start the segment ``first_seq``; the finished one is fsynced first, so only
        the last segment can ever end in an unfinished record."""
        path = self.directory / f"seg-{first_seq:020d}.aps"
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        except OSError as exc:
            raise self._fail(exc, "create", path) from exc
        try:
            self._write_magic(fd, path)
            if self._fd >= 0:
                self._fsync(self._fd, self._segments[-1].path)
        except BaseException:
            os.close(fd)
            path.unlink(missing_ok=True)
            raise
        with self._fd_lock:  # a sync in another thread holds a duplicate, not this fd
            old, self._fd = self._fd, fd
        if old >= 0:
            os.close(old)
        self._segments.append(_Segment(first_seq, path, first_seq - 1, len(codec.SEGMENT_MAGIC)))
        self._dir_dirty = True

    def _write_magic(self, fd: int, path: Path) -> None:
        try:
            os.pwrite(fd, codec.SEGMENT_MAGIC, 0)
        except OSError as exc:
            raise self._fail(exc, "write", path) from exc

    def _fsync(self, fd: int, path: Path) -> None:
        try:
            os.fsync(fd)
        except OSError as exc:
            raise self._fail(exc, "fsync", path) from exc

    def sync(self) -> None:
        """fsync the last segment (and the directory after a new segment). May run in
        a worker thread while the owner's thread calls :meth:`store`
        (``concurrent_sync``): it fsyncs a duplicate of the segment's descriptor taken
        under a lock, so a segment started meanwhile (the finished one is fsynced
        before it is closed) never leaves it fsyncing a closed or reused descriptor."""
        self._check_open()
        with self._fd_lock:
            fd = os.dup(self._fd)
            path = self._segments[-1].path
            directory_dirty, self._dir_dirty = self._dir_dirty, False
        try:
            self._fsync(fd, path)
        finally:
            os.close(fd)
        if directory_dirty:
            try:
                self._fsync_directory()
            except BaseException:
                self._dir_dirty = True
                raise

    def _fsync_directory(self) -> None:
        try:
            fd = os.open(self.directory, os.O_RDONLY)
        except OSError as exc:
            raise self._fail(exc, "open", self.directory) from exc
        try:
            self._fsync(fd, self.directory)
        finally:
            os.close(fd)
        self._dir_dirty = False

    def discard_through(self, seq: int) -> int:
        self._check_open()
        if seq <= self._discarded:
            return 0
        dropped = 0
        while self._index and self._index[0].seq <= seq:
            self._bytes -= self._index.popleft().payload
            dropped += 1
        self._discarded = seq
        if seq > self.last_seq:
            # the server holds more of ours than we remember: continue after it
            self._new_segment(seq + 1)
        self._write_marker()
        self._delete_discarded_segments()
        return dropped

    def _write_marker(self) -> None:
        slot = self._marker_slot
        try:
            os.pwrite(
                self._marker_fd, codec.encode_marker(self._discarded), slot * codec.MARKER_SLOT
            )
        except OSError as exc:
            raise self._fail(exc, "write", self.directory / MARKER_FILE) from exc
        self._marker_slot = 1 - slot

    def _delete_discarded_segments(self) -> None:
        while len(self._segments) > 1 and self._segments[0].last_seq <= self._discarded:
            path = self._segments[0].path
            try:
                path.unlink()
            except FileNotFoundError:
                pass
            except OSError as exc:
                raise self._fail(exc, "delete", path) from exc
            self._segments.popleft()
            self._dir_dirty = True

    def unacked(self) -> Iterator[StoredPublish]:
        self._check_open()
        entries = list(self._index)
        fds: dict[Path, int] = {}
        try:
            for entry in entries:
                if entry.seq <= self._discarded:
                    continue
                path = entry.segment.path
                fd = fds.get(path)
                try:
                    if fd is None:
                        fd = fds[path] = os.open(path, os.O_RDONLY)
                    raw = os.pread(fd, entry.end - entry.offset, entry.offset)
                except OSError as exc:
                    raise self._fail(exc, "read", path) from exc
                got = codec.scan(raw, 0)
                if len(got.records) != 1 or got.records[0].seq != entry.seq:
                    reason = got.problem.reason if got.problem else "not the record written"
                    raise self._damaged(path, entry.offset, reason)
                record = got.records[0]
                yield StoredPublish(
                    record.seq, record.command, record.topic, record.data, record.sow_key
                )
        finally:
            for fd in fds.values():
                os.close(fd)

    def close(self) -> None:
        """Release the files and the lock; what was not discarded stays on disk.
        Does not fsync (call :meth:`sync` first for that)."""
        if self._closed:
            return
        self._closed = True
        self._release()

    def _release(self) -> None:
        for fd in (self._fd, self._marker_fd):
            if fd >= 0:
                os.close(fd)
        self._fd = self._marker_fd = -1
        if self._lock_fd >= 0:
            os.close(self._lock_fd)  # closing the file releases the flock
            self._lock_fd = -1

    def _check_open(self) -> None:
        if self._closed:
            raise ValueError(f"the publish store in {self.directory} is closed")

    def __enter__(self) -> FilePublishStore:
        return self

    def __exit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()
