"""The checkpoint of one message queue: what the queue held at a journal txid, in LMDB,
so a start loads it and applies only the journal records after it.

A queue is derived from the journal (:mod:`amps_py.server.queues`): publishes of its
underlying topic enter, ``QUEUE_ACK`` records leave, ``QUEUE_TRANSFER`` grants move
ownership. Rebuilding it by reading the journal from its first record costs time in
proportion to the journal's length; the checkpoint makes a start cost the queue's
depth plus the records since the newest checkpoint.

**What is kept.** Per message in the queue: txid, bookmark, owner, priority, barrier,
origin time and correlation id (never the payload: the server reads that from the
journal record when it sends the message, and journal removal keeps every record a
queue holds). Leases, delivery and cancel counts are not kept (as in AMPS, and as in
the journal). ``applied_txid`` says through which txid the journal was applied; the
entries and ``applied_txid`` change in one LMDB write transaction, so they always
agree.

**Layout** (one LMDB environment per queue, in its own directory):

* ``chunks``: chunk number (u64 BE, ``txid >> CHUNK_BITS``) -> CRC32 (u32 BE) + an
  orjson array ``[owners, rows]``: the owner names, then the rows ``[txid, bookmark,
  owner index, priority, barrier, published_at, correlation_id]`` in txid order.
  Chunks make loading a deep queue one decode per few hundred messages, and an update
  rewrites only the chunks it touches.
* ``meta``: ``format``, ``queue`` (the queue's name), ``definition`` (what decides
  which records enter and how: a changed Filter, Priority, BarrierExpression,
  UnderlyingTopic or ownership rule makes the checkpoint useless, and the queue is
  rebuilt), ``state`` = (applied txid, messages) as two u64.

**Durability.** Each checkpoint is one write transaction, synced (two fsyncs, off the
event loop, about once a second): a crash of the process or the machine leaves the
previous checkpoint or this one, never a mix. A damaged file (bad meta pages, a chunk
whose CRC does not match, an undecodable row) raises :class:`CheckpointDamaged`: the
server sets the directory aside and rebuilds the queue from the journal, saying so.

No trio here: the calls block; the server runs them in a worker thread.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import shutil
import struct
import time
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Final

import lmdb
import orjson

from amps_py.queue import QueueMessage
from txlog.preflight import DATA_FILE, DataFileDamage, check_data_file

__all__ = [
    "CHUNK_BITS",
    "Changes",
    "CheckpointDamaged",
    "CheckpointError",
    "QueueCheckpoint",
    "Row",
    "row_of",
]

FORMAT: Final = b"amps-py-queue-checkpoint-2"
LOCK_FILE: Final = "amps-py-queue.lock"
#: a chunk holds the messages of 2**CHUNK_BITS consecutive txids
CHUNK_BITS: Final = 12
_U64: Final = struct.Struct(">Q")
_STATE: Final = struct.Struct(">QQ")
_CRC: Final = struct.Struct(">I")
DEFAULT_MAP_SIZE: Final = 1 << 32

#: one message as the checkpoint keeps it: (txid, bookmark, owner, priority, barrier,
#: published_at, correlation_id)
Row = tuple[int, str, str, int, bool, float, str]


def row_of(message: QueueMessage) -> Row:
    """The checkpoint row of ``message`` (its owner as of now)."""
    return (
        message.txid,
        message.bookmark,
        message.owner,
        message.priority,
        message.barrier,
        message.published_at,
        message.correlation_id,
    )


class CheckpointError(Exception):
    """The checkpoint cannot be opened or written (not damage: a lock held by another
    process, a full disk, permissions). The message names the directory and the fix."""


class CheckpointDamaged(CheckpointError):
    """The checkpoint's files are damaged or not a checkpoint of this queue: the
    server sets them aside and rebuilds the queue from the journal."""


class QueueCheckpoint:
    """The LMDB checkpoint of queue ``queue`` in ``directory`` (created when missing).

    Args:
        directory: the checkpoint's own directory (nothing else should live there).
        queue: the queue's name; a checkpoint of another queue there is refused.
        definition: text naming everything that decides what the queue holds
            (:func:`amps_py.server.queues.queue_definition`); a checkpoint written
            under another definition opens empty (``stale`` says why).

    Raises:
        CheckpointDamaged: the files are damaged or belong to another queue.
        CheckpointError: the directory cannot be created or locked.
    """

    def __init__(self, directory: str | os.PathLike[str], queue: str, definition: str) -> None:
        self.directory = Path(directory)
        self.queue = queue
        self.definition = hashlib.blake2b(definition.encode(), digest_size=16).hexdigest()
        #: why the checkpoint on disk could not be used (it was cleared); "" when it could
        self.stale = ""
        self.applied_txid = 0
        self.count = 0
        #: seconds the last write took (statistics)
        self.last_write_seconds = 0.0
        self.writes = 0
        self._env: lmdb.Environment | None = None
        self._lock_fd = self._lock()
        try:
            self._open()
        except BaseException:
            self.close()
            raise

    # ------------------------------------------------------------------ opening
    def _where(self) -> Path:
        return self.directory / DATA_FILE

    def _lock(self) -> int:
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.directory / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as exc:
            raise CheckpointError(
                f"cannot create the checkpoint of queue {self.queue!r} in {self.directory}: "
                f"{exc.strerror or exc}; check that the JournalDirectory is writable"
            ) from exc
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise CheckpointError(
                f"the checkpoint of queue {self.queue!r} in {self.directory} is open in "
                "another process: give each instance its own JournalDirectory"
            ) from None
        return fd

    def _open(self) -> None:
        data = self._where()
        if data.exists():
            try:
                check_data_file(data)
            except (DataFileDamage, OSError) as exc:
                raise CheckpointDamaged(f"{data} is damaged: {exc}") from exc
        try:
            self._env = lmdb.open(
                str(self.directory),
                map_size=DEFAULT_MAP_SIZE,
                subdir=True,
                max_dbs=2,
                sync=True,
                metasync=True,
                readahead=False,
                lock=True,
                max_readers=8,
            )
            self._chunks = self._env.open_db(b"chunks")
            self._meta = self._env.open_db(b"meta")
            self._check_meta()
        except lmdb.Error as exc:
            raise CheckpointDamaged(f"{data} cannot be opened: LMDB says {exc}") from exc

    def _check_meta(self) -> None:
        assert self._env is not None
        with self._env.begin(write=True) as txn:
            fmt = txn.get(b"format", db=self._meta)
            if fmt is not None and fmt != FORMAT:
                raise CheckpointDamaged(
                    f"{self._where()} is not a queue checkpoint this version reads (format "
                    f"{bytes(fmt).decode(errors='replace')!r})"
                )
            owner = txn.get(b"queue", db=self._meta)
            if owner is not None and bytes(owner) != self.queue.encode():
                raise CheckpointDamaged(
                    f"{self._where()} is the checkpoint of queue "
                    f"{bytes(owner).decode(errors='replace')!r}, not {self.queue!r}"
                )
            state = txn.get(b"state", db=self._meta)
            definition = txn.get(b"definition", db=self._meta)
            if fmt is None or state is None:
                if txn.stat(self._chunks)["entries"]:
                    raise CheckpointDamaged(f"{self._where()} holds chunks but no state record")
                self._reset(txn)
                return
            if len(state) != _STATE.size:
                raise CheckpointDamaged(f"{self._where()} has no readable state record")
            if definition is None or bytes(definition).decode() != self.definition:
                self.stale = (
                    "the queue's definition changed since it was written (UnderlyingTopic, "
                    "Filter, Priority, BarrierExpression or ownership)"
                )
                txn.drop(self._chunks, delete=False)
                self._reset(txn)
                return
            self.applied_txid, self.count = _STATE.unpack(state)

    def _reset(self, txn: lmdb.Transaction) -> None:
        txn.put(b"format", FORMAT, db=self._meta)
        txn.put(b"queue", self.queue.encode(), db=self._meta)
        txn.put(b"definition", self.definition.encode(), db=self._meta)
        txn.put(b"state", _STATE.pack(0, 0), db=self._meta)
        self.applied_txid = self.count = 0

    def _live(self) -> lmdb.Environment:
        if self._env is None:
            raise CheckpointError(f"the checkpoint of queue {self.queue!r} is closed")
        return self._env

    # ------------------------------------------------------------------ reading
    def messages(self) -> Iterator[QueueMessage]:
        """The messages of the checkpoint, in txid order, as fresh unleased
        :class:`QueueMessage` objects without payload (``payload`` None); one string
        object per owner, shared by its messages.

        Raises:
            CheckpointDamaged: a chunk fails its CRC or does not decode.
        """
        env = self._live()
        shared: dict[str, str] = {}
        try:
            with env.begin(buffers=False) as txn:
                for key, value in txn.cursor(db=self._chunks):
                    owners, rows = self._decode(key, value)
                    owners = [shared.setdefault(o, o) for o in owners]
                    try:
                        chunk = [
                            QueueMessage(txid, mark, None, cid, published, owners[o], prio, bar)
                            for txid, mark, o, prio, bar, published, cid in rows
                        ]
                    except (TypeError, ValueError, IndexError) as exc:
                        raise self._bad_shape(key, exc) from exc
                    yield from chunk
        except lmdb.Error as exc:
            raise CheckpointDamaged(f"{self._where()}: reading failed: {exc}") from exc

    def _bad_shape(self, key: bytes, exc: Exception) -> CheckpointDamaged:
        chunk = _U64.unpack(key)[0] if len(key) == _U64.size else -1
        return CheckpointDamaged(
            f"{self._where()}: chunk {chunk} holds rows of another shape ({exc})"
        )

    def _decode(self, key: bytes, value: bytes) -> tuple[list[str], list[list[Any]]]:
        """(owner names, rows with owner indexes) of one chunk, checked by its CRC."""
        chunk = _U64.unpack(key)[0] if len(key) == _U64.size else -1
        if len(value) < _CRC.size or _CRC.unpack_from(value)[0] != zlib.crc32(value[_CRC.size :]):
            raise CheckpointDamaged(
                f"{self._where()}: chunk {chunk} (txids from {chunk << CHUNK_BITS}) fails its "
                "CRC check"
            )
        try:
            owners, rows = orjson.loads(value[_CRC.size :])
        except (orjson.JSONDecodeError, TypeError, ValueError) as exc:
            raise CheckpointDamaged(
                f"{self._where()}: chunk {chunk} does not decode: {exc}"
            ) from exc
        if not isinstance(owners, list) or not isinstance(rows, list):
            raise self._bad_shape(key, TypeError("not two lists"))
        return owners, rows

    def _rows(self, key: bytes, value: bytes) -> dict[int, list[Any]]:
        """txid -> row (owner by name) of one chunk, for rewriting it."""
        owners, rows = self._decode(key, value)
        try:
            return {r[0]: [r[0], r[1], owners[r[2]], r[3], r[4], r[5], r[6]] for r in rows}
        except (TypeError, IndexError) as exc:
            raise self._bad_shape(key, exc) from exc

    @staticmethod
    def _encode(rows: dict[int, list[Any]]) -> bytes:
        """One chunk: CRC32 + ``[owners, rows]``, rows in txid order with their owner as
        an index into ``owners``."""
        index: dict[str, int] = {}
        ordered = []
        for txid in sorted(rows):
            row = rows[txid]
            ordered.append(
                [txid, row[1], index.setdefault(row[2], len(index)), row[3], row[4], row[5], row[6]]
            )
        body = orjson.dumps([list(index), ordered])
        return _CRC.pack(zlib.crc32(body)) + body

    # ------------------------------------------------------------------ writing
    def write(
        self, through_txid: int, changes: Changes, txid_of: Callable[[str], int | None]
    ) -> None:
        """Apply ``changes`` and set ``applied_txid`` to ``through_txid``, in one synced
        write transaction (blocking). ``txid_of(bookmark)`` gives the local txid of a
        message whose txid the changes do not know (the journal's bookmark index);
        None skips it (it never entered this queue).

        Raises:
            ValueError: ``through_txid`` is below :attr:`applied_txid`.
            CheckpointError: LMDB failed (nothing of this write is kept; the previous
                checkpoint stands, and the caller keeps ``changes`` for the next one).
        """
        if through_txid < self.applied_txid:
            raise ValueError(
                f"the checkpoint of queue {self.queue!r} is at txid {self.applied_txid}; it "
                f"cannot go back to {through_txid}"
            )
        started = time.monotonic()
        removed = [
            txid for mark, known in changes.removed.items() if (txid := known or txid_of(mark))
        ]
        owners = [(txid, o) for mark, o in changes.owners.items() if (txid := txid_of(mark))]
        touched: dict[int, dict[int, Any]] = {}
        for row in changes.added.values():
            touched.setdefault(row[0] >> CHUNK_BITS, {})
        for txid in removed:
            touched.setdefault(txid >> CHUNK_BITS, {})
        for txid, _ in owners:
            touched.setdefault(txid >> CHUNK_BITS, {})
        env = self._live()
        count = self.count
        try:
            with env.begin(write=True) as txn:
                for chunk, rows in touched.items():
                    key = _U64.pack(chunk)
                    raw = txn.get(key, db=self._chunks)
                    if raw is not None:
                        rows.update(self._rows(key, raw))
                before = sum(len(rows) for rows in touched.values())
                for row in changes.added.values():
                    touched[row[0] >> CHUNK_BITS][row[0]] = list(row)
                for txid, owner in owners:
                    found = touched[txid >> CHUNK_BITS].get(txid)
                    if found is not None:
                        found[2] = owner
                for txid in removed:
                    touched[txid >> CHUNK_BITS].pop(txid, None)
                after = 0
                for chunk, rows in touched.items():
                    key = _U64.pack(chunk)
                    after += len(rows)
                    if not rows:
                        txn.delete(key, db=self._chunks)
                        continue
                    txn.put(key, self._encode(rows), db=self._chunks)
                count += after - before
                txn.put(b"state", _STATE.pack(through_txid, count), db=self._meta)
        except lmdb.Error as exc:
            raise CheckpointError(
                f"writing the checkpoint of queue {self.queue!r} in {self.directory} failed "
                f"({exc}); the previous checkpoint stands, and the next one retries"
            ) from exc
        self.applied_txid = through_txid
        self.count = count
        self.writes += 1
        self.last_write_seconds = time.monotonic() - started

    def clear(self) -> None:
        """Empty the checkpoint (``applied_txid`` 0): the start of a rebuild."""
        env = self._live()
        try:
            with env.begin(write=True) as txn:
                txn.drop(self._chunks, delete=False)
                self._reset(txn)
        except lmdb.Error as exc:
            raise CheckpointError(
                f"clearing the checkpoint of queue {self.queue!r} failed: {exc}"
            ) from exc

    def close(self) -> None:
        """Close the environment and release the directory (idempotent)."""
        env, self._env = self._env, None
        if env is not None:
            with contextlib.suppress(lmdb.Error):
                env.close()
        fd, self._lock_fd = getattr(self, "_lock_fd", -1), -1
        if fd >= 0:
            os.close(fd)


def set_aside(directory: Path) -> Path:
    """Move a damaged checkpoint directory out of the way (to ``<name>.damaged``,
    replacing an older one); returns where it went."""
    aside = directory.with_name(directory.name + ".damaged")
    shutil.rmtree(aside, ignore_errors=True)
    directory.rename(aside)
    return aside


class Changes:
    """What the committed journal records did to one queue since its last checkpoint:
    messages that entered, left, or changed owner (by bookmark, in commit order).

    Only committed records feed it (never a removal or grant made in memory ahead of
    its record's commit), so a checkpoint is exactly the journal applied through its
    txid. A message that entered and left within one checkpoint never reaches LMDB.
    """

    __slots__ = ("added", "owners", "removed")

    def __init__(self) -> None:
        #: bookmark -> row of a message that entered
        self.added: dict[str, Row] = {}
        #: bookmark -> txid (0: unknown, looked up in the journal's bookmark index when
        #: the checkpoint is written) of a message that left
        self.removed: dict[str, int] = {}
        #: bookmark -> new owner of a message that entered before
        self.owners: dict[str, str] = {}

    def __bool__(self) -> bool:
        return bool(self.added or self.removed or self.owners)

    def __len__(self) -> int:
        return len(self.added) + len(self.removed) + len(self.owners)

    def admit(self, row: Row) -> None:
        self.added[row[1]] = row

    def remove(self, bookmark: str, txid: int = 0) -> None:
        self.owners.pop(bookmark, None)
        if self.added.pop(bookmark, None) is None:
            self.removed[bookmark] = txid or self.removed.get(bookmark, 0)

    def transfer(self, bookmark: str, owner: str) -> None:
        row = self.added.get(bookmark)
        if row is not None:
            self.added[bookmark] = (row[0], row[1], owner, row[3], row[4], row[5], row[6])
        else:
            self.owners[bookmark] = owner

    def then(self, newer: Changes) -> Changes:
        """These changes followed by ``newer`` (a checkpoint write failed: its changes
        go before the ones collected since)."""
        for row in newer.added.values():
            self.admit(row)
        for bookmark, txid in newer.removed.items():
            self.remove(bookmark, txid)
        for bookmark, owner in newer.owners.items():
            self.transfer(bookmark, owner)
        return self
