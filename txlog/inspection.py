"""What the tools ask of a journal: its statistics and the full check.

:func:`journal_statistics` and :func:`verify_journal` are behind
:meth:`txlog.journal.Journal.statistics` and :meth:`~txlog.journal.Journal.verify`
(``amps-py txlog info`` and ``verify``, the admin's journal page). Both only read, and
both work on a journal whose LMDB file has damaged pages: verify walks around them and
names the txids they hide, instead of letting LMDB abort the process.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

from .maintenance import PROGRESS_EVERY
from .opening import LMDB_READ_DAMAGE_ERRORS
from .reading import readable_from
from .record import CorruptRecord
from .segments import SegmentFile, SegmentFileError

if TYPE_CHECKING:
    from .environment import JournalEnv
    from .reading import RecordReader
    from .state import JournalState

_U64: Final = struct.Struct(">Q")


@dataclass(frozen=True)
class JournalStatistics:
    path: str
    instance_name: str
    durability: str
    compression: str
    first_txid: int
    last_txid: int
    records: int
    publishers: int
    file_bytes: int
    commits: int
    appended: int
    duplicates: int
    segments: int = 0


@dataclass(frozen=True)
class VerifyProblem:
    txid: int | None
    problem: str


def journal_statistics(
    env: JournalEnv, state: JournalState, reader: RecordReader
) -> JournalStatistics:
    """The journal's size, owner, settings and the counts of this process's appends.
    Records and segments count what is held (removed segments are not)."""
    j = env
    with j.env.begin() as txn:
        n_pubs = txn.stat(j.publishers)["entries"]
    segments = [seg for seg in state.segments if seg.state != "removed"]
    data = j.path / "data.mdb"
    return JournalStatistics(
        path=str(j.path),
        instance_name=j.instance_name,
        durability=j.durability,
        compression=j.compression,
        first_txid=reader.first_txid(),
        last_txid=state.last_txid,
        records=sum(seg.records for seg in segments),
        publishers=n_pubs,
        file_bytes=data.stat().st_size if data.exists() else 0,
        commits=state.commits,
        appended=state.appended,
        duplicates=state.duplicates,
        segments=len(segments),
    )


def verify_journal(
    env: JournalEnv, state: JournalState, progress: Callable[[int], None] | None = None
) -> list[VerifyProblem]:
    """Check every record's CRC and decoding, and that txids strictly increase.

    Returns the problems found (empty when the journal is sound); never raises
    for damaged records. ``progress``, when given, is called with the number of
    records checked so far, every few thousand records and once at the end.
    """
    j = env
    problems: list[VerifyProblem] = []
    decode = j.codec.decode
    checked = 0

    def count() -> None:
        nonlocal checked
        checked += 1
        if progress is not None and checked % PROGRESS_EVERY == 0:
            progress(checked)

    for seg in state.segments:
        if not seg.offloaded:
            continue
        try:
            pairs = iter(SegmentFile(j.segment_path(seg)))
            for file_txid, file_value in pairs:
                if not seg.first_txid <= file_txid <= seg.last_txid:
                    problems.append(
                        VerifyProblem(
                            file_txid,
                            f"outside segment {seg.id} in its file {j.segment_path(seg)}",
                        )
                    )
                    continue
                count()
                try:
                    decode(file_value, file_txid)
                except CorruptRecord as exc:
                    problems.append(VerifyProblem(file_txid, exc.problem))
        except SegmentFileError as exc:
            problems.append(VerifyProblem(None, str(exc)))
    prev = 0
    for item in _walk_records(env, state):
        if isinstance(item, VerifyProblem):
            problems.append(item)
            continue
        key, value = item
        txid = _U64.unpack(key)[0] if len(key) == 8 else None
        if txid is None:
            problems.append(VerifyProblem(None, f"bad record key {key.hex()}"))
            continue
        if txid <= prev:
            problems.append(VerifyProblem(txid, f"txid not after previous {prev}"))
        prev = txid
        if txid <= state.removed_through:
            continue  # left over from a removal still in progress
        count()
        try:
            decode(value, txid)
        except CorruptRecord as exc:
            problems.append(VerifyProblem(txid, exc.problem))
    if progress is not None:
        progress(checked)
    return problems


def _next_key(key: bytes) -> bytes:
    """The lowest key above ``key``: the next txid for a txid key."""
    if len(key) == 8 and key != b"\xff" * 8:
        return _U64.pack(_U64.unpack(key)[0] + 1)
    return key + b"\x00"


def _walk_records(
    env: JournalEnv, state: JournalState
) -> Iterator[tuple[bytes, bytes] | VerifyProblem]:
    """Every (key, value) of the LMDB records database in key order; a damaged
    LMDB page is reported as a :class:`VerifyProblem` naming the txids it hides,
    and the walk goes on after it.

    Each record is found by a search (``set_range`` of the next txid), not by
    LMDB's step to the next page: that step asserts, killing the process, when the
    next page is damaged, while a search reports ``MDB_CORRUPTED``. LMDB looks in
    the cursor's current page first, so a search costs little more than a step.
    """
    after: bytes | None = None
    while True:
        with env.env.begin(db=env.records, buffers=False) as txn:
            cur = txn.cursor()
            try:
                found = cur.first() if after is None else cur.set_range(_next_key(after))
                while found:
                    after = cur.key()
                    yield after, cur.value()
                    found = cur.set_range(_next_key(after))
                return
            except LMDB_READ_DAMAGE_ERRORS as exc:
                damage = exc
        if after is not None and len(after) != 8:
            yield VerifyProblem(None, f"LMDB cannot read past key {after.hex()} ({damage})")
            return
        first = _U64.unpack(after)[0] + 1 if after is not None else 1
        resume = readable_from(env, state, first)
        hidden = f"txids {first} to {resume - 1}" if resume else f"txids from {first}"
        yield VerifyProblem(first, f"{hidden} unreadable: LMDB reports a damaged page ({damage})")
        if resume is None:
            return
        after = _U64.pack(resume - 1)
