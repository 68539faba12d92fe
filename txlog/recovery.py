"""The commit log at open: recovery of what it holds past LMDB, and a live reader's view.

A writer's open gives LMDB what the commit log (:mod:`txlog.commitlog`) holds past
LMDB's newest record (the previous run ended without closing the journal: a crash, a
kill, a power loss), with every index entry a stage makes for it, then syncs LMDB and
deletes the log (:func:`recover_commit_log`). A read-only open beside a running writer
serves what the live log holds past LMDB from memory (:func:`read_live_log`).

Both work on what :class:`txlog.journal.Journal` hands them while it opens: its LMDB
environment, its shared state and (recovery) its writer.
"""

from __future__ import annotations

import logging
import struct

import lmdb

from .commitlog import LoggedBatch, log_files, read_log, remove_log
from .environment import JournalEnv
from .errors import JournalDamaged, JournalError
from .pending import PendingTail
from .record import CorruptRecord
from .segments import grown_table
from .state import JournalState
from .writing import TIME_INDEX_STEP_US, BatchPuts, JournalWriter

log = logging.getLogger("txlog.journal")
_U64 = struct.Struct(">Q")
_U64x2 = struct.Struct(">QQ")


def recover_commit_log(
    env: JournalEnv, state: JournalState, writer: JournalWriter, map_size: int
) -> None:
    """Write what the commit log holds past LMDB's newest record into LMDB (after a
    crash or a power loss), make LMDB durable, and delete the log.

    Raises:
        JournalDamaged: the log does not continue LMDB's records (a gap), or is
            damaged beyond a cut last frame.
    """
    if not log_files(env.path):
        return
    try:
        batches = read_log(env.path)
    except OSError as exc:
        raise JournalError(
            f"journal {env.path}: its commit log cannot be read ({exc}); it may hold "
            "acknowledged records that LMDB lacks, so the journal is not opened. Fix: "
            f"make the commit-*.log files in {env.path} readable by this user"
        ) from exc
    todo = [batch for batch in batches if batch.last_txid > state.last_txid]
    expected = state.last_txid + 1
    for batch in todo:  # what LMDB lacks must follow on from it, batch after batch
        if batch.first_txid > expected:
            raise JournalDamaged(
                f"journal {env.path}: its commit log goes on at txid "
                f"{batch.first_txid} where txid {expected} is due (LMDB ends at txid "
                f"{state.last_txid}): the records between are missing (was data.mdb "
                f"restored from an older backup?). Fix: restore the whole directory "
                f"{env.path} from one backup, or move its commit-*.log files away to "
                "start from what data.mdb holds"
            )
        expected = batch.last_txid + 1
    if todo:
        count = 0
        txn = env.env.begin(write=True)
        writer.holding_puts = []
        try:
            for batch in todo:
                skip = state.last_txid - batch.first_txid + 1
                if skip > 0:  # partly in LMDB already
                    batch = LoggedBatch(
                        batch.first_txid + skip, batch.now_us, batch.values[skip:], {}
                    )
                apply_logged(env, state, writer, txn, batch)
                count += len(batch.values)
            writer.put_holdings(txn)
            txn.commit()
        except lmdb.MapFullError:
            txn.abort()
            raise JournalError(
                f"journal {env.path}: its commit log holds records LMDB does not, and "
                f"they do not fit in the MapSize of {map_size} bytes: raise "
                "TransactionLog/MapSize and restart (nothing was lost or changed)"
            ) from None
        except BaseException:
            txn.abort()
            raise
        log.warning(
            "journal %s: %d records the commit log held past LMDB's newest were "
            "written to LMDB (the previous run ended without closing the journal); "
            "now through txid %d",
            env.path,
            count,
            state.last_txid,
        )
    env.env.sync(True)
    remove_log(env.path)


def apply_logged(
    env: JournalEnv,
    state: JournalState,
    writer: JournalWriter,
    txn: lmdb.Transaction,
    batch: LoggedBatch,
) -> None:
    """Write a batch the commit log holds into ``txn`` when the journal opens: its
    records and every index entry a stage makes for them (see
    :meth:`txlog.writing.JournalWriter.put`); the in-memory state (segment table, newest
    txid) follows."""
    decode = env.codec.decode
    highs: dict[int, tuple[int, str]] = {}
    changed: set[int] = set()
    origins: dict[str, int] = {}
    rec_items: list[tuple[bytes, bytes]] = []
    bm_items: list[tuple[bytes, bytes]] = []
    others: list[tuple[int, str, int]] = []
    for offset, value in enumerate(batch.values):
        txid = batch.first_txid + offset
        rec = decode(value, txid)
        if rec.origin != env.instance_name or rec.origin_txid != txid:
            others.append((offset, rec.origin, rec.origin_txid))
        key = _U64.pack(txid)
        rec_items.append((key, value))
        bm_items.append((_U64x2.pack(rec.pub_hash, rec.seq), key))
        high = highs.get(rec.pub_hash)
        if high is None:
            raw = txn.get(_U64.pack(rec.pub_hash), db=env.publishers)
            high = (_U64.unpack_from(raw)[0] if raw else 0, "")
        if rec.seq > high[0]:
            high = (rec.seq, rec.client_name)
            changed.add(rec.pub_hash)
        highs[rec.pub_hash] = high
        if rec.origin and rec.origin != env.instance_name:
            origins[rec.origin] = max(origins.get(rec.origin, 0), rec.origin_txid)
    puts = BatchPuts(rec_items, bm_items, batch.cursors)
    puts.others = others
    if rec_items:
        puts.publishers = [
            (_U64.pack(ph), _U64.pack(highs[ph][0]) + highs[ph][1].encode()) for ph in changed
        ]
        puts.origins = [(origin.encode(), otx) for origin, otx in origins.items()]
        if batch.now_us - writer.last_time_entry >= TIME_INDEX_STEP_US:
            puts.time_entry = (_U64.pack(batch.now_us), rec_items[0][0])
            writer.last_time_entry = batch.now_us
        segments, touched = grown_table(
            state.segments,
            env.segment_size,
            batch.first_txid,
            batch.now_us,
            list(map(len, batch.values)),
        )
        if env.segments_db is not None:
            puts.segments = [(_U64.pack(seg.id), seg.encode()) for seg in touched]
        state.segments = segments
        state.last_txid = batch.last_txid
    writer.put(txn, puts)


def read_live_log(env: JournalEnv, state: JournalState) -> None:
    """A read-only open beside a running writer: what the commit log holds past
    LMDB (durable and acknowledged, not yet committed to LMDB) becomes this
    journal's staged tail, so a reader sees every acknowledged record at once.
    Records the writer commits to LMDB later are read from there."""
    expected = state.last_txid + 1
    tail = PendingTail(expected)
    decode = env.codec.decode
    try:
        batches = read_log(env.path, live=True)
    except (OSError, JournalError) as exc:
        log.warning("journal %s: its commit log cannot be read (%s)", env.path, exc)
        return
    for batch in batches:
        if batch.last_txid < expected:
            continue
        if batch.first_txid != expected:
            break  # not contiguous with LMDB as read here: LMDB holds what follows
        try:
            records = [decode(v, batch.first_txid + i) for i, v in enumerate(batch.values)]
        except CorruptRecord:
            break  # served from LMDB once committed (where every read checks it)
        marks = {_U64x2.pack(rec.pub_hash, rec.seq): rec.txid for rec in records}
        tail.add(batch.first_txid, batch.values, marks, {}, {}, batch.cursors)
        expected = batch.last_txid + 1
    if tail.values:
        state.pending = tail
        state.last_txid = expected - 1
