"""Bookmark stores: what a bookmark subscription delivered and what the application
processed, so that a resubscription (reconnect, failover, process restart) resumes just
after the last processed message of each publisher and never skips an unprocessed one.

:class:`MemoryBookmarkStore` keeps everything in memory (it survives reconnects and
failovers, not a restart of the process); :class:`FileBookmarkStore` also keeps the
resume points in a directory, so a restarted process resumes where the last one
stopped. Both implement :class:`~amps_py.client.store_api.BookmarkStore`. Plain
blocking code; no trio.

Semantics, per subscription id and per publisher (the ``<publisher hash>`` of a message
bookmark ``<publisher hash>|<seq>|``):

* **Contiguous processed mark** (``mark``): the highest ``seq`` such that every
  *delivered* message of that publisher at or below it was processed (the ordered ack
  of UM): with 1..5 delivered, processing 1, 2 and 5 leaves the mark at 2, because 3
  and 4 are delivered and not processed; processing 3 moves it to 3; processing 4 then
  moves it to 5. A message is in the application's hands from :meth:`delivered` until
  :meth:`processed`.
* **Out-of-order processed set**: processed messages above the mark (5 above), kept in
  memory only.
* **Max delivered**: the highest ``seq`` handed to the application.
* :meth:`delivered` answers ``duplicate=True`` (the client drops the message) for a
  message known processed (at or below the mark, or in the out-of-order set), and
  ``possible_duplicate=True`` (the client hands it over flagged) for a message at or
  below the max delivered as of the last :meth:`reconnected` call (for a reopened file
  store: at or below the max delivered it found on disk), or one delivered before and
  not processed yet.
* :meth:`resume_bookmark` is the comma list of ``<publisher>|<mark>|`` of every
  publisher with a mark (in publisher hash order: the same before and after a
  restart). The server replays from the earliest point of the list (for a publisher
  whose bookmark it does not hold yet: its first record above the mark), so no
  publisher's unprocessed message is skipped; an amps-py server skips each
  publisher's records at or below its mark, and what another server replays again
  below a mark is dropped here as a duplicate. One exception: when a publisher has
  delivered messages but none of them processed (its mark is 0), no bookmark of it
  can name a point before its first message, so the answer is ``""``: the
  subscriber's own starting bookmark applies (replay from there; duplicates are
  dropped), rather than a list that could start after that publisher's unprocessed
  messages.

Bookmarks that are not a delivered message's ``<publisher hash>|<seq>|`` (a timestamp,
``0``, ``0|1|``, a list, garbage) make :meth:`delivered` and :meth:`processed` raise
:class:`ValueError` saying what was expected.

On-disk format of a :class:`FileBookmarkStore` directory:

* ``LOCK``: held with ``fcntl.flock`` by the open store and containing its pid; a second
  opener (another process, or another store object in this one) is refused.
* ``bookmarks.log``: an append-only log (see :mod:`amps_py.client.bookmark_log` for the
  bytes): a header, then records ``(sub_id, publisher, mark, max delivered)`` each with
  its length and a CRC-32; the last record of a pair wins. :meth:`processed` appends a
  record whenever the mark or the max delivered of the pair changed since the last
  record (one ``write`` to the OS; no fsync); :meth:`FileBookmarkStore.sync` fsyncs.
  A write also carries a first record for each other publisher of the subscription
  delivered since the last write and not recorded yet, so that after a restart the
  store knows they had messages in the application's hands (and the resume list does
  not start after them).
* ``bookmarks.log.tmp``: compaction in progress. Opening the store, and appending more
  than ``compact_after`` records (and more than twice the live pairs), rewrites the log
  as one record per pair into this file, fsyncs it, renames it over ``bookmarks.log``
  and fsyncs the directory; a leftover temporary file (a crash mid-compaction) is
  deleted on open.

What survives:

* a crash of the process (kill -9): every record :meth:`processed` returned from (it is
  in the OS), i.e. each publisher's contiguous mark and max delivered;
* a crash of the machine: what :meth:`FileBookmarkStore.sync` (or :meth:`close`, or a
  compaction) made durable; later records may be lost, so the resume points may be
  older (more duplicates, flagged or dropped; never a skipped message);
* never the out-of-order processed set: after a restart a message processed out of
  order (5 after 1, 2 while 3 and 4 were not) is redelivered flagged
  ``possible_duplicate`` (it is at or below the persisted max delivered), and the
  unprocessed 4 is redelivered too;
* a record cut short by a crash in the middle of a write (a torn tail), or one with a
  wrong CRC, ends the log: it and anything after it are ignored with a warning on the
  ``amps_py.client.bookmark_store`` logger.
"""

from __future__ import annotations

import bisect
import contextlib
import fcntl
import logging
import os
import re
import threading
from dataclasses import dataclass, field
from pathlib import Path

from .bookmark_log import MAGIC as _MAGIC
from .bookmark_log import BadLog, decode_log, encode_record, encode_sub_id, fits_u64
from .store_api import Delivery

__all__ = [
    "BookmarkStoreInUse",
    "FileBookmarkStore",
    "MemoryBookmarkStore",
    "parse_message_bookmark",
]

log = logging.getLogger("amps_py.client.bookmark_store")

_BOOKMARK = re.compile(r"([0-9]{1,20})\|([0-9]{1,20})\|")
_DUPLICATE = Delivery(duplicate=True)
_POSSIBLE = Delivery(possible_duplicate=True)
_NEW = Delivery()
_LOG_NAME = "bookmarks.log"
_TMP_NAME = "bookmarks.log.tmp"
_LOCK_NAME = "LOCK"


class BookmarkStoreInUse(OSError):
    """The store's directory is already open (its lock file is held)."""


def parse_message_bookmark(bookmark: str) -> tuple[int, int]:
    """``(publisher hash, seq)`` of a delivered message's bookmark ``<hash>|<seq>|``.

    Raises:
        ValueError: anything else (a timestamp, EPOCH ``0``, NOW ``0|1|``, a list,
            garbage); the message shows the text and the expected form.
    """
    m = _BOOKMARK.fullmatch(bookmark) if isinstance(bookmark, str) else None
    if m is not None:
        pub, seq = int(m[1]), int(m[2])
        if pub > 0 and seq > 0 and fits_u64(pub) and fits_u64(seq):
            return pub, seq
    raise ValueError(
        f"{bookmark!r} is not the bookmark of a delivered message; a bookmark store "
        "takes '<publisher hash>|<seq>|' with both numbers from 1 to 2**64-1 (e.g. "
        "'7094790850998930143|12|', the 'bm' of a message), not a timestamp, EPOCH (0), "
        "NOW (0|1|) or a list"
    )


@dataclass(eq=False)
class _Track:
    """One publisher in one subscription."""

    mark: int = 0
    max_delivered: int = 0
    #: deliveries at or below this may have been seen before (set by reconnected())
    boundary: int = 0
    #: delivered, not processed, above the mark (sorted)
    pending: list[int] = field(default_factory=list)
    #: processed out of order, above the mark (sorted)
    done: list[int] = field(default_factory=list)
    #: (mark, max_delivered) of the last record written (file store), None if none
    saved: tuple[int, int] | None = None


def _contains(values: list[int], value: int) -> bool:
    at = bisect.bisect_left(values, value)
    return at < len(values) and values[at] == value


class _Marks:
    """The bookkeeping both stores share (pure; callers hold the lock)."""

    def __init__(self) -> None:
        self.subs: dict[str, dict[int, _Track]] = {}

    def track(self, sub_id: str, pub: int) -> _Track:
        pubs = self.subs.get(sub_id)
        if pubs is None:
            if not isinstance(sub_id, str):
                raise TypeError(f"sub_id must be a str, not {type(sub_id).__name__}")
            pubs = self.subs[sub_id] = {}
        track = pubs.get(pub)
        if track is None:
            track = pubs[pub] = _Track()
        return track

    def delivered(self, sub_id: str, pub: int, seq: int) -> Delivery:
        track = self.track(sub_id, pub)
        if seq <= track.mark or _contains(track.done, seq):
            return _DUPLICATE
        pending = track.pending
        if not pending or seq > pending[-1]:
            pending.append(seq)
            seen = False
        else:
            at = bisect.bisect_left(pending, seq)
            seen = pending[at] == seq
            if not seen:
                pending.insert(at, seq)
        if seq > track.max_delivered:
            track.max_delivered = seq
        return _POSSIBLE if seen or seq <= track.boundary else _NEW

    def processed(self, sub_id: str, pub: int, seq: int) -> _Track:
        track = self.track(sub_id, pub)
        if seq <= track.mark:
            return track
        if seq > track.max_delivered:
            track.max_delivered = seq
        pending = track.pending
        at = bisect.bisect_left(pending, seq)
        if at < len(pending) and pending[at] == seq:
            del pending[at]
        done = track.done
        at = bisect.bisect_left(done, seq)
        if at == len(done) or done[at] != seq:
            done.insert(at, seq)
        # the mark moves over every processed seq below the lowest unprocessed one
        below = bisect.bisect_left(done, pending[0]) if pending else len(done)
        if below:
            track.mark = done[below - 1]
            del done[:below]
        return track

    def resume(self, sub_id: str) -> str:
        parts = []
        for pub, track in sorted(self.subs.get(sub_id, {}).items()):
            if track.mark:
                parts.append(f"{pub}|{track.mark}|")
            elif track.max_delivered:
                return ""  # nothing of this publisher processed: see the module doc
        return ",".join(parts)

    def reconnected(self, sub_id: str) -> None:
        for track in self.subs.get(sub_id, {}).values():
            track.boundary = track.max_delivered


class _MarksHolder:
    """What both stores answer from their marks alone, under their lock."""

    _marks: _Marks
    _lock: threading.Lock

    def resume_bookmark(self, sub_id: str) -> str:
        """Comma list of ``<publisher>|<contiguous mark>|``; ``""`` when nothing was
        processed or a publisher has delivered messages but none processed."""
        with self._lock:
            return self._marks.resume(sub_id)

    def reconnected(self, sub_id: str) -> None:
        """From now on, redeliveries at or below what was delivered so far are flagged
        ``possible_duplicate`` (unless known processed: then ``duplicate``)."""
        with self._lock:
            self._marks.reconnected(sub_id)


class MemoryBookmarkStore(_MarksHolder):
    """A bookmark store in memory: survives reconnects and failovers of this process,
    not a restart. See the module doc for the semantics. Thread-safe."""

    def __init__(self) -> None:
        self._marks = _Marks()
        self._lock = threading.Lock()

    def delivered(self, sub_id: str, bookmark: str) -> Delivery:
        """A message with ``bookmark`` arrived for ``sub_id``: is it a duplicate
        (processed: drop it) or a possible one (flag it)? Records it as delivered.

        Raises:
            ValueError: ``bookmark`` is not ``<publisher hash>|<seq>|``.
        """
        pub, seq = parse_message_bookmark(bookmark)
        with self._lock:
            return self._marks.delivered(sub_id, pub, seq)

    def processed(self, sub_id: str, bookmark: str) -> None:
        """The application is done with ``bookmark``; the publisher's contiguous mark
        moves over it once every delivered message below it is processed too.

        Raises:
            ValueError: ``bookmark`` is not ``<publisher hash>|<seq>|``.
        """
        pub, seq = parse_message_bookmark(bookmark)
        with self._lock:
            self._marks.processed(sub_id, pub, seq)

    def sync(self) -> None:
        """Nothing to make durable."""

    def close(self) -> None:
        """Nothing to release."""


class FileBookmarkStore(_MarksHolder):
    """A bookmark store kept in ``directory`` (created if missing) that survives a
    restart of the process; see the module doc for the semantics, the files and what
    survives which crash. Thread-safe; one open store per directory.

    Args:
        directory: where the lock file and the log live.
        compact_after: rewrite the log once it holds more than this many records (and
            more than twice the live (sub_id, publisher) pairs).

    Raises:
        BookmarkStoreInUse: the directory is open in another store (this or another
            process).
        OSError: the directory or its files cannot be created, read or written (the
            message names the path), or the log is not a bookmark log.

    Resource handling: the store holds a lock file descriptor and a log descriptor
    until :meth:`close`.
    """

    def __init__(self, directory: str | os.PathLike[str], *, compact_after: int = 10_000) -> None:
        if compact_after < 1:
            raise ValueError(f"compact_after must be at least 1, not {compact_after}")
        self.directory = Path(directory)
        self._compact_after = compact_after
        self._marks = _Marks()
        self._lock = threading.Lock()
        self._log_path = self.directory / _LOG_NAME
        self._tmp_path = self.directory / _TMP_NAME
        self._fd = -1
        self._records = 0  # records in the log file
        self._live = 0  # (sub_id, publisher) pairs with a record
        #: per sub_id, publishers delivered that have no record yet
        self._fresh: dict[str, dict[int, _Track]] = {}
        self._closed = False
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise OSError(
                exc.errno,
                f"cannot create bookmark store directory {self.directory}: {exc.strerror}",
            ) from exc
        self._lock_fd = self._take_lock()
        try:
            self._load()
            self._compact()
        except BaseException:
            self._release()
            raise

    # -- opening -------------------------------------------------------------------

    def _take_lock(self) -> int:
        path = self.directory / _LOCK_NAME
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            try:
                holder = os.pread(fd, 32, 0).decode("ascii", "replace").strip() or "unknown"
            finally:
                os.close(fd)
            raise BookmarkStoreInUse(
                f"bookmark store directory {self.directory} is in use by another open "
                f"FileBookmarkStore (process {holder} holds {path}); close that store, "
                "or give each subscriber its own directory"
            ) from None
        except BaseException:
            os.close(fd)
            raise
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        return fd

    def _load(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            self._tmp_path.unlink()  # a compaction that did not finish
        try:
            data = self._log_path.read_bytes()
        except FileNotFoundError:
            return
        except OSError as exc:
            raise OSError(exc.errno, f"cannot read {self._log_path}: {exc.strerror}") from exc
        try:
            contents = decode_log(data)
        except BadLog as exc:
            raise OSError(
                f"{self._log_path} is not a bookmark store log: {exc}; move it away or "
                "open the store on another directory"
            ) from None
        if contents.problem:
            log.warning(
                "bookmark store %s: ignoring the end of %s (%d bytes from offset %d): %s "
                "(a write cut short by a crash); the resume points are those before it",
                self.directory,
                self._log_path,
                len(data) - contents.good_bytes,
                contents.good_bytes,
                contents.problem,
            )
        for entry in contents.entries:
            track = self._marks.track(entry.sub_id, entry.pub_hash)
            track.mark = entry.mark
            track.max_delivered = track.boundary = entry.max_delivered
            track.saved = (entry.mark, entry.max_delivered)

    # -- the log -------------------------------------------------------------------

    def _compact(self) -> None:
        """Rewrite the log as one record per live pair (temp file, fsync, rename)."""
        chunks = [_MAGIC]
        for sub_id, pubs in self._marks.subs.items():
            for pub, track in pubs.items():
                if track.saved is not None or track.mark or track.max_delivered:
                    chunks.append(encode_record(sub_id, pub, track.mark, track.max_delivered))
        try:
            fd = os.open(self._tmp_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            try:
                _write_all(fd, b"".join(chunks))
                os.fsync(fd)
            finally:
                os.close(fd)
            os.replace(self._tmp_path, self._log_path)
            fsync_directory(self.directory)
            new_fd = os.open(self._log_path, os.O_WRONLY | os.O_APPEND)
        except OSError as exc:
            raise OSError(
                exc.errno, f"cannot rewrite bookmark store log {self._log_path}: {exc.strerror}"
            ) from exc
        if self._fd >= 0:
            os.close(self._fd)
        self._fd = new_fd
        self._records = self._live = len(chunks) - 1
        self._fresh.clear()
        for pubs in self._marks.subs.values():
            for track in pubs.values():
                if track.saved is not None or track.mark or track.max_delivered:
                    track.saved = (track.mark, track.max_delivered)

    def _append(self, sub_id: str, pub: int, track: _Track) -> None:
        """Write ``track``'s record if it changed, preceded by first records for the
        other publishers of the subscription delivered since the last record (so that
        after a restart a resume list never starts after their unprocessed messages)."""
        state = (track.mark, track.max_delivered)
        if track.saved == state:
            return
        fresh = self._fresh.get(sub_id)
        owed = [(p, t) for p, t in fresh.items() if t is not track] if fresh else []
        owed.append((pub, track))
        new_pairs = sum(1 for _, t in owed if t.saved is None)
        data = b"".join(encode_record(sub_id, p, t.mark, t.max_delivered) for p, t in owed)
        try:
            _write_all(self._fd, data)
        except OSError as exc:
            raise OSError(
                exc.errno, f"cannot write bookmark store log {self._log_path}: {exc.strerror}"
            ) from exc
        if fresh is not None:
            del self._fresh[sub_id]
        for _, t in owed:
            t.saved = (t.mark, t.max_delivered)
        self._records += len(owed)
        self._live += new_pairs
        if self._records > self._compact_after and self._records > 2 * self._live:
            self._compact()

    def _check_open(self) -> None:
        if self._closed:
            raise ValueError(f"the bookmark store on {self.directory} is closed")

    # -- BookmarkStore -------------------------------------------------------------

    def delivered(self, sub_id: str, bookmark: str) -> Delivery:
        """A message with ``bookmark`` arrived for ``sub_id``: is it a duplicate
        (processed: drop it) or a possible one (flag it)? Records it as delivered, in
        memory only (no I/O).

        Raises:
            ValueError: ``bookmark`` is not ``<publisher hash>|<seq>|``, the sub_id is
                too long for the log, or the store is closed.
        """
        pub, seq = parse_message_bookmark(bookmark)
        with self._lock:
            self._check_open()
            if sub_id not in self._marks.subs:
                encode_sub_id(sub_id)
            delivery = self._marks.delivered(sub_id, pub, seq)
            track = self._marks.subs[sub_id][pub]
            if track.saved is None and not delivery.duplicate:
                self._fresh.setdefault(sub_id, {})[pub] = track
            return delivery

    def processed(self, sub_id: str, bookmark: str) -> None:
        """The application is done with ``bookmark``; when the publisher's contiguous
        mark or max delivered moves, a record is written to the OS (no fsync).
        Blocking.

        Raises:
            ValueError: ``bookmark`` is not ``<publisher hash>|<seq>|`` or the store is
                closed.
            OSError: the log could not be written (the message names it).
        """
        pub, seq = parse_message_bookmark(bookmark)
        with self._lock:
            self._check_open()
            if sub_id not in self._marks.subs:
                encode_sub_id(sub_id)
            track = self._marks.processed(sub_id, pub, seq)
            self._append(sub_id, pub, track)

    def sync(self) -> None:
        """fsync the log: the marks written so far survive a power loss. Blocking."""
        with self._lock:
            self._check_open()
            try:
                os.fsync(self._fd)
            except OSError as exc:
                raise OSError(
                    exc.errno, f"cannot fsync bookmark store log {self._log_path}: {exc.strerror}"
                ) from exc

    def close(self) -> None:
        """fsync and close the log and release the directory's lock. Idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            try:
                if self._fd >= 0:
                    os.fsync(self._fd)
            finally:
                self._release()

    def _release(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
        if self._lock_fd >= 0:
            os.close(self._lock_fd)  # releases the flock
            self._lock_fd = -1

    def __enter__(self) -> FileBookmarkStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self._closed else "open"
        return f"FileBookmarkStore({str(self.directory)!r}, {state})"


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        view = view[written:]


def fsync_directory(directory: Path) -> None:
    """Make the entries of ``directory`` (a file created, renamed or deleted in it)
    durable."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
