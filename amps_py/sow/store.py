"""The SOW store of one topic: the current record per SOW key, in LMDB.

**Derived from the journal.** Every committed record of a SOW topic (published here or
replicated) is applied to the store in txid order, and the store records the txid it
has applied through (:attr:`SowStore.applied_txid`, written in the same LMDB write
transaction as the records), so the records and ``applied_txid`` always agree. LMDB
runs with ``sync=False`` and ``metasync=False``: a commit reaches the OS page cache,
not the disk, so a crash of the process loses nothing, while a crash of the machine
can lose the newest transactions (the server re-applies the journal from
``applied_txid + 1``) or, LMDB warns, damage the file (caught at open where it can
be: :class:`SowStoreError`, and a rebuild). :meth:`SowStore.close` flushes, so a
clean shutdown leaves a store on disk. A store whose ``applied_txid`` is beyond the
journal's last txid (the journal lost a tail the store kept) must be rebuilt too:
that check is the caller's, which knows the journal. A store that is missing starts
empty (``applied_txid`` 0) and is rebuilt by applying the journal from its start; a
damaged one raises :class:`SowStoreError` and is rebuilt once the operator (or the
server) deletes its directory.

Layout of the LMDB environment (one per topic, in its own directory):

* ``records``: SOW key (UTF-8) -> the entry in the versioned binary layout of
  :mod:`amps_py.sow.layout` (txid, timestamp, expiry, bookmark, correlation id,
  payload), never pickle;
* ``expiry``: (expiry time as big-endian u64, key) -> empty, for records that expire;
* ``meta``: the format tag, the topic, and ``state`` = (applied txid, record count,
  payload bytes), kept exact by every write transaction.

Readers see a consistent point in time: :meth:`SowStore.snapshot` and
:meth:`SowStore.entries` hold one LMDB read transaction, so commits made meanwhile are
invisible to them. An open read transaction keeps the pages it sees from being reused:
close snapshots promptly, or the file grows while writes go on.

No trio here: the calls are synchronous and short; the server drives them.
"""

from __future__ import annotations

import builtins
import contextlib
import fcntl
import os
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Final, NamedTuple, cast

import lmdb

from txlog.preflight import DATA_FILE, DataFileDamage, check_data_file, check_lock_file_room

from .entry import SowEntry
from .layout import (
    EXPIRY,
    FORMAT,
    STATE,
    decode_entry,
    encode_entry,
    expires_of,
    expiry_key,
    payload_size,
)

__all__ = ["ApplyResult", "SowEntry", "SowSnapshot", "SowStore", "SowStoreError"]

LOCK_FILE: Final = "amps-py-sow.lock"
LMDB_LOCK_FILE: Final = "lock.mdb"
#: the map LMDB reserves at first (address space, not disk); it doubles when full
DEFAULT_MAP_SIZE: Final = 1 << 34
DEFAULT_MAX_READERS: Final = 512


def key_after(key: bytes, longest: int) -> bytes | None:
    """The lowest LMDB key above ``key`` when keys are at most ``longest`` bytes (None:
    there is none): ``key`` and a zero byte, or for a key of ``longest`` bytes, the key
    without its trailing 0xff bytes and its last byte raised by one (no longer key
    lies between them)."""
    if len(key) < longest:
        return key + b"\x00"
    stem = key.rstrip(b"\xff")
    if not stem:
        return None
    return stem[:-1] + bytes([stem[-1] + 1])


class SowStoreError(Exception):
    """The SOW store cannot be opened or used.

    Attributes:
        directory: the store's directory; deleting it makes the server rebuild the
            store from the journal.
        damaged: True when the files are damaged or unreadable (rebuild them); False for
            other problems (locked by another process, closed, full disk ...).
    """

    def __init__(self, message: str, directory: Path, *, damaged: bool = False) -> None:
        super().__init__(message)
        self.directory = directory
        self.damaged = damaged


class ApplyResult(NamedTuple):
    """What one :meth:`SowStore.apply` changed."""

    inserted: int
    replaced: int
    deleted: int


@dataclass(frozen=True, slots=True)
class _State:
    applied_txid: int
    count: int
    bytes: int


class SowSnapshot:
    """The store at one point in time (one LMDB read transaction).

    Iterate it for every entry in key order (as often as needed), :meth:`get` single
    keys; :attr:`count`, :attr:`bytes` and :attr:`applied_txid` are as of the snapshot.
    Commits made after it was taken are not seen. Use it from one thread at a time, and
    close it (or leave the ``with`` block of :meth:`SowStore.snapshot`) promptly.
    """

    def __init__(self, store: SowStore) -> None:
        self._store = store
        self._txn: lmdb.Transaction | None = store._begin_read()
        try:
            self._state = store._read_state(self._txn)
        except BaseException:
            self.close()
            raise

    @property
    def applied_txid(self) -> int:
        """The last journal txid the store had applied when the snapshot was taken."""
        return self._state.applied_txid

    @property
    def count(self) -> int:
        """Records in the snapshot."""
        return self._state.count

    @property
    def bytes(self) -> int:
        """Payload bytes of the records in the snapshot."""
        return self._state.bytes

    def _live(self) -> lmdb.Transaction:
        if self._txn is None:
            raise SowStoreError(
                f"SOW snapshot of topic {self._store.topic!r} is closed: read it inside the "
                "'with store.snapshot()' block",
                self._store.directory,
            )
        return self._txn

    def get(self, key: str) -> SowEntry | None:
        """The entry for ``key`` in the snapshot, or None."""
        txn = self._live()
        with self._store._errors("read"):
            value = txn.get(key.encode(), db=self._store._records)
            return None if value is None else self._store._decode(key, cast(bytes, value))

    def __iter__(self) -> Iterator[SowEntry]:
        return self.iter_from("")

    def iter_from(self, key: str) -> Iterator[SowEntry]:
        """Entries in key order, from the first key at or after ``key``.

        Each entry is found by a search for the lowest key after the one before (its
        key plus a zero byte), never by LMDB's step to the next page: a step onto a
        damaged page can fail an LMDB assertion, which aborts the process, while a
        search reports the damage. LMDB searches the cursor's current page first, so a
        search costs little more than a step.

        Raises:
            SowStoreError: LMDB reports a damaged page, or an entry does not decode
                (``damaged`` True; the message names the file and the fix), or the
                snapshot was closed under the iterator.
        """
        txn = self._live()
        store = self._store
        decode = store._decode
        try:
            longest = store._live_env().max_key_size()
            cursor = txn.cursor(db=store._records)
            found = cursor.set_range(key.encode()) if key else cursor.first()
            while found:
                raw_key = cast(bytes, cursor.key())
                text = raw_key.decode()
                yield decode(text, cast(bytes, cursor.value()))
                after = key_after(raw_key, longest)
                found = after is not None and cursor.set_range(after)
        except (lmdb.Error, UnicodeDecodeError) as exc:
            self._live()  # closed under the iterator: say so, it is not damage
            store._live_env()
            raise store._fail(
                f"SOW store file {store.directory / DATA_FILE} of topic {store.topic!r}: "
                f"read failed: {exc}",
                damaged=True,
            ) from exc

    def close(self) -> None:
        """End the read transaction (idempotent)."""
        txn, self._txn = self._txn, None
        if txn is not None:
            with contextlib.suppress(lmdb.Error):
                txn.abort()
            self._store._readers -= 1

    def __del__(self) -> None:
        # a snapshot dropped without close() must not block the map from growing
        if getattr(self, "_txn", None) is not None:
            self.close()

    def __enter__(self) -> SowSnapshot:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class SowStore:
    """The LMDB store of one SOW topic.

    Args:
        directory: the store's own directory (created when missing). Nothing else
            should live there.
        topic: the SOW topic; a store of another topic in ``directory`` is refused.
        transient: wipe the store's files on open (a transient SOW is rebuilt from the
            journal on every start). Only the files the store creates are removed,
            never the directory or other files in it.
        map_size: LMDB map size to start with (address space, not disk); doubled when
            full while no snapshot is open.
        max_readers: the most snapshots and entry iterators open at once.

    Raises:
        SowStoreError: the directory cannot be created or locked, another process has
            the store open, or the files are damaged or unreadable (``damaged`` is True;
            the message names the file and the fix: delete the directory, and the store
            is rebuilt from the journal).

    Resource handling: the store holds an exclusive lock on its directory until
    :meth:`close`; closing also ends any open snapshot.
    """

    def __init__(
        self,
        directory: str | os.PathLike[str],
        topic: str,
        *,
        transient: bool,
        map_size: int = DEFAULT_MAP_SIZE,
        max_readers: int = DEFAULT_MAX_READERS,
    ) -> None:
        self.directory = Path(directory)
        self.topic = topic
        self.transient = transient
        self._readers = 0
        self._env: lmdb.Environment | None = None
        self._lock_fd = self._lock()
        try:
            if transient:
                self._wipe()
            self._open(map_size, max_readers)
        except BaseException:
            self.close()
            raise

    # ------------------------------------------------------------------ opening

    def _fail(self, problem: str, *, damaged: bool) -> SowStoreError:
        if damaged:
            problem += (
                f". The SOW store is derived from the journal: delete the directory "
                f"{self.directory} and the store of topic {self.topic!r} is rebuilt from "
                "the transaction log"
            )
        return SowStoreError(problem, self.directory, damaged=damaged)

    def _lock(self) -> int:
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.directory / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as exc:
            raise self._fail(
                f"cannot create the SOW store of topic {self.topic!r} in {self.directory}: "
                f"{exc.strerror or exc}; check the path and its permissions (SOW/Topic/"
                "FileName)",
                damaged=False,
            ) from exc
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
            os.close(fd)
            raise self._fail(
                f"the SOW store in {self.directory} is already open (by process {holder}); "
                "give each instance and each SOW topic its own store directory",
                damaged=False,
            ) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        return fd

    def _wipe(self) -> None:
        for name in (DATA_FILE, LMDB_LOCK_FILE):
            try:
                (self.directory / name).unlink()
            except FileNotFoundError:
                pass
            except OSError as exc:
                raise self._fail(
                    f"cannot wipe the transient SOW store {self.directory / name}: "
                    f"{exc.strerror or exc}",
                    damaged=False,
                ) from exc

    def _open(self, map_size: int, max_readers: int) -> None:
        data = self.directory / DATA_FILE
        if data.exists():
            try:
                check_data_file(data)
            except DataFileDamage as exc:
                raise self._fail(
                    f"SOW store file {data} of topic {self.topic!r} is damaged: {exc}",
                    damaged=True,
                ) from exc
            except OSError as exc:
                raise self._fail(
                    f"SOW store file {data} of topic {self.topic!r} cannot be read: "
                    f"{exc.strerror or exc}",
                    damaged=True,
                ) from exc
        try:
            check_lock_file_room(self.directory)
        except OSError as exc:  # LMDB would die with SIGBUS creating its lock file
            raise self._fail(
                f"cannot open the SOW store of topic {self.topic!r} in {self.directory}: "
                f"{exc.strerror} ({exc.filename})",
                damaged=False,
            ) from exc
        try:
            self._env = lmdb.open(
                str(self.directory),
                map_size=map_size,
                subdir=True,
                max_dbs=4,
                sync=False,
                metasync=False,
                readahead=False,
                lock=True,
                max_readers=max_readers,
            )
            self._records = self._env.open_db(b"records")
            self._expiry = self._env.open_db(b"expiry")
            self._meta = self._env.open_db(b"meta")
            self._state = self._check_format()
        except lmdb.Error as exc:
            raise self._fail(
                f"SOW store file {data} of topic {self.topic!r} cannot be opened: LMDB says {exc}",
                damaged=not isinstance(exc, lmdb.DiskError),  # a full disk is not damage
            ) from exc

    def _check_format(self) -> _State:
        assert self._env is not None
        topic = self.topic.encode()
        with self._env.begin(write=True) as txn:
            fmt = txn.get(b"format", db=self._meta)
            if fmt is None:
                if txn.stat(self._records)["entries"]:
                    raise self._fail(
                        f"{self.directory / DATA_FILE} holds records but no format tag: it is "
                        "not an amps-py SOW store",
                        damaged=True,
                    )
                txn.put(b"format", FORMAT, db=self._meta)
                txn.put(b"topic", topic, db=self._meta)
                txn.put(b"state", STATE.pack(0, 0, 0), db=self._meta)
            elif fmt != FORMAT:
                raise self._fail(
                    f"{self.directory / DATA_FILE} is a SOW store of format "
                    f"{fmt.decode(errors='replace')!r}; this version reads {FORMAT.decode()!r}",
                    damaged=True,
                )
            elif txn.get(b"topic", db=self._meta) != topic:
                owner = (txn.get(b"topic", db=self._meta) or b"?").decode(errors="replace")
                raise self._fail(
                    f"the SOW store in {self.directory} belongs to topic {owner!r}, not "
                    f"{self.topic!r}: give each SOW topic its own FileName",
                    damaged=False,
                )
            return self._read_state(txn)

    def _read_state(self, txn: lmdb.Transaction) -> _State:
        raw = txn.get(b"state", db=self._meta)
        if raw is None or len(raw) != STATE.size:
            raise self._fail(
                f"SOW store file {self.directory / DATA_FILE} has no readable state record",
                damaged=True,
            )
        return _State(*STATE.unpack(raw))

    # ------------------------------------------------------------------ helpers

    def _live_env(self) -> lmdb.Environment:
        if self._env is None:
            raise SowStoreError(f"the SOW store of topic {self.topic!r} is closed", self.directory)
        return self._env

    @contextlib.contextmanager
    def _errors(self, doing: str) -> Iterator[None]:
        """LMDB errors as :class:`SowStoreError` naming the file."""
        try:
            yield
        except lmdb.Error as exc:
            raise self._fail(
                f"SOW store file {self.directory / DATA_FILE} of topic {self.topic!r}: "
                f"{doing} failed: {exc}",
                damaged=not isinstance(exc, lmdb.MapFullError),
            ) from exc

    def _decode(self, key: str, value: bytes) -> SowEntry:
        try:
            return decode_entry(key, value)
        except ValueError as exc:
            raise self._fail(
                f"SOW store file {self.directory / DATA_FILE}: {exc}", damaged=True
            ) from exc

    def _begin_read(self) -> lmdb.Transaction:
        env = self._live_env()
        with self._errors("starting a read"):
            txn = env.begin(write=False, buffers=False)
        self._readers += 1
        return txn

    # ------------------------------------------------------------------ reading

    @property
    def applied_txid(self) -> int:
        """The journal txid the store has applied through (0: none)."""
        return self._state.applied_txid

    @property
    def count(self) -> int:
        """Records in the store now."""
        return self._state.count

    @property
    def bytes(self) -> int:
        """Payload bytes of the records in the store now."""
        return self._state.bytes

    @property
    def file_bytes(self) -> int:
        """Size of the store's data file on disk (0 when unknown)."""
        try:
            return (self.directory / DATA_FILE).stat().st_size
        except OSError:
            return 0

    def get(self, key: str) -> SowEntry | None:
        """The current entry for ``key``, or None."""
        env = self._live_env()
        with self._errors("read"), env.begin(buffers=False) as txn:
            value = txn.get(key.encode(), db=self._records)
        return None if value is None else self._decode(key, value)

    def snapshot(self) -> SowSnapshot:
        """The store as it is now, for reading while commits go on.

        Use it as a context manager (``with store.snapshot() as snap:``); leaving the
        block ends it. Taking one is cheap and synchronous, so it can be taken in the
        same step that registers a subscription: records committed after it are not in
        it, and records committed before it are.
        """
        return SowSnapshot(self)

    def entries(self) -> Iterator[SowEntry]:
        """Every entry, in key order, from one consistent read snapshot.

        A generator holding an LMDB read transaction from its first item until it is
        exhausted or closed: the caller must exhaust it or call its ``close()`` (or
        wrap it in ``contextlib.closing``).
        """
        with self.snapshot() as snap:
            yield from snap

    def expired(self, now_us: int, limit: int | None = None) -> list[SowEntry]:
        """Entries whose expiry time (``expires_us`` > 0) is at or before ``now_us``,
        soonest first, at most ``limit``. Removing them is the caller's (journaled)
        ``sow_delete``."""
        out: list[SowEntry] = []
        with self.snapshot() as snap:
            txn = snap._live()
            with self._errors("read"):
                longest = self._live_env().max_key_size()
                cursor = txn.cursor(db=self._expiry)
                found = cursor.first()
                while found:  # searches, not steps (see SowSnapshot.iter_from)
                    raw = bytes(cursor.key())
                    if len(raw) < EXPIRY.size:  # a damaged page LMDB did not notice
                        raise lmdb.CorruptedError(f"an expiry key of {len(raw)} bytes")
                    if EXPIRY.unpack_from(raw)[0] > now_us:
                        break
                    entry = snap.get(raw[EXPIRY.size :].decode(errors="replace"))
                    if entry is not None:
                        out.append(entry)
                    if limit is not None and len(out) >= limit:
                        break
                    after = key_after(raw, longest)
                    found = after is not None and cursor.set_range(after)
        return out

    # ------------------------------------------------------------------ writing

    def apply(
        self, upserts: Iterable[SowEntry], deletes: Iterable[str], through_txid: int
    ) -> ApplyResult:
        """Upsert ``upserts`` (in order) then delete ``deletes``, in one write
        transaction that also sets :attr:`applied_txid` to ``through_txid``.

        A key may appear several times in ``upserts`` (the last one wins) but not in
        both lists, since their relative order would be lost: use
        :meth:`apply_changes` for a batch that upserts and deletes one key.

        Raises:
            ValueError: a key is in both lists, or ``through_txid`` is below
                :attr:`applied_txid` (the journal must be applied in order).
            SowStoreError: LMDB failed (the transaction is rolled back).
        """
        upserts = list(upserts)
        deletes = list(deletes)
        if deletes and upserts:
            both = {e.key for e in upserts}.intersection(deletes)
            if both:
                raise ValueError(
                    f"SOW keys {sorted(both)[:3]} are both upserted and deleted in one "
                    "apply(): pass the changes in journal order to apply_changes()"
                )
        changes: list[tuple[str, SowEntry | None]] = [(e.key, e) for e in upserts]
        changes.extend((key, None) for key in deletes)
        return self.apply_changes(changes, through_txid)

    def apply_changes(
        self, changes: Iterable[tuple[str, SowEntry | None]], through_txid: int
    ) -> ApplyResult:
        """Apply ``(key, entry)`` changes in order (``entry`` None deletes the key) in one
        write transaction that sets :attr:`applied_txid` to ``through_txid``.

        Raises:
            ValueError: ``through_txid`` is below :attr:`applied_txid`.
            SowStoreError: LMDB failed (the transaction is rolled back).
        """
        if through_txid < self._state.applied_txid:
            raise ValueError(
                f"SOW store of topic {self.topic!r} already applied the journal through "
                f"txid {self._state.applied_txid}; cannot apply through {through_txid} "
                "(apply the journal in txid order)"
            )
        encoded = [
            (key.encode(), None if entry is None else encode_entry(entry), entry)
            for key, entry in changes
        ]
        for _attempt in range(8):
            try:
                return self._write(encoded, through_txid)
            except lmdb.MapFullError:
                if not self._grow():
                    raise self._fail(
                        f"SOW store file {self.directory / DATA_FILE} of topic "
                        f"{self.topic!r} is full and cannot grow while {self._readers} "
                        "snapshot(s) are open; retry when they are closed",
                        damaged=False,
                    ) from None
        raise self._fail(f"SOW store of topic {self.topic!r} cannot grow", damaged=False)

    def _grow(self) -> bool:
        env = self._live_env()
        if self._readers:
            return False
        with self._errors("growing the map"):
            env.set_mapsize(env.info()["map_size"] * 2)
        return True

    def _write(
        self,
        encoded: list[tuple[builtins.bytes, builtins.bytes | None, SowEntry | None]],
        through_txid: int,
    ) -> ApplyResult:
        env = self._live_env()
        records, expiry = self._records, self._expiry
        state = self._state
        count, size = state.count, state.bytes
        inserted = replaced = deleted = 0
        try:
            with env.begin(write=True) as txn:
                for key, value, entry in encoded:
                    if value is None:
                        old = txn.pop(key, db=records)
                        if old is None:
                            continue
                        deleted += 1
                    else:
                        assert entry is not None
                        old = txn.replace(key, value, db=records)
                        size += len(entry.payload)
                        if entry.expires_us:
                            txn.put(expiry_key(entry.expires_us, key), b"", db=expiry)
                        if old is None:
                            inserted += 1
                            count += 1
                            continue
                        replaced += 1
                    if old is None:
                        continue
                    size -= payload_size(old)
                    if value is None:
                        count -= 1
                    old_expires = expires_of(old)
                    if old_expires and (entry is None or old_expires != entry.expires_us):
                        txn.delete(expiry_key(old_expires, key), db=expiry)
                new_state = _State(through_txid, count, size)
                txn.put(b"state", STATE.pack(through_txid, count, size), db=self._meta)
        except lmdb.MapFullError:
            raise
        except lmdb.Error as exc:
            raise self._fail(
                f"SOW store file {self.directory / DATA_FILE} of topic {self.topic!r}: "
                f"write failed: {exc}",
                damaged=not isinstance(exc, lmdb.DiskError),
            ) from exc
        self._state = new_state
        return ApplyResult(inserted, replaced, deleted)

    def clear(self) -> None:
        """Remove every record and set :attr:`applied_txid` to 0 (the start of a rebuild
        from the journal)."""
        env = self._live_env()
        with self._errors("clear"), env.begin(write=True) as txn:
            txn.drop(self._records, delete=False)
            txn.drop(self._expiry, delete=False)
            txn.put(b"state", STATE.pack(0, 0, 0), db=self._meta)
        self._state = _State(0, 0, 0)

    def sync(self) -> None:
        """Flush the store to disk (optional: the journal is the source of truth)."""
        env = self._live_env()
        with self._errors("sync"):
            env.sync(True)

    def close(self) -> None:
        """Flush and close the store, and release its directory (idempotent). Open
        snapshots end."""
        env, self._env = getattr(self, "_env", None), None
        if env is not None:
            with contextlib.suppress(lmdb.Error):
                env.sync(True)
            with contextlib.suppress(lmdb.Error):
                env.close()
        fd, self._lock_fd = getattr(self, "_lock_fd", -1), -1
        if fd >= 0:
            os.close(fd)

    def __enter__(self) -> SowStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"SowStore({str(self.directory)!r}, {self.topic!r}, count={self.count})"
