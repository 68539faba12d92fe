"""What a read of one journal covers, and reading it as Arrow batches (no Spark).

A :class:`ReadPlan` holds the bounds a reader asked for (txid range, local time
range, topics) from the ``amps_txlog`` options and from the filters Spark pushes
down. :meth:`ReadPlan.ranges` turns them into txid ranges of the journal as it is when
called (planning: the snapshot every partition reads up to), and :func:`read_range`
reads one range as Arrow batches. The Spark data source (:mod:`.datasource`) is a thin
shell around these; the benchmark and tests call them directly.

Bounds: txids are exact. A time range becomes a txid range through the journal's time
index, as a timestamp bookmark replay does (the first record at or after the start,
the last record before the end), and every row is then checked against it; records
whose local clock went backwards across the range edge can be left out (the server's
clock is wall time). Topics are exact names; records of other topics are checked
(CRC) but not decoded.
"""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Final

import pyarrow as pa

from txlog import CorruptRecord, Journal, JournalDamaged
from txlog.record import STORED_FIELDS

from .decode import select_stored, stored_to_batch
from .sources import require_journals

_TXID_AT: Final = STORED_FIELDS.index("txid")

#: records per partition when the ``partitions`` option is not given
DEFAULT_PARTITION_RECORDS: Final = 50_000
#: at most this many partitions, whatever the options say
MAX_PARTITIONS: Final = 10_000
#: records read per LMDB transaction (and per Arrow batch, before pushdown)
BATCH_RECORDS: Final = 8192
#: a batch stops growing past this many stored bytes (large payloads)
BATCH_BYTES: Final = 32 * 1024 * 1024


class BadOption(ValueError):
    """An ``amps_txlog`` option that cannot be used; the message names it and the fix."""


@dataclass(frozen=True)
class ReadPlan:
    """The records a read wants. Bounds are inclusive txids and a half-open local
    time range in µs since the epoch; ``None`` places no bound."""

    path: str
    min_txid: int | None = None
    max_txid: int | None = None
    start_us: int | None = None
    end_us: int | None = None
    #: exact topic names; None: every topic
    topics: frozenset[str] | None = None
    partitions: int | None = None
    partition_records: int = DEFAULT_PARTITION_RECORDS
    #: where each partition's read writes a small JSON report (records scanned, rows)
    metrics_dir: str | None = None

    @classmethod
    def from_options(cls, options: Mapping[str, str]) -> ReadPlan:
        """A plan from the data source options (see :mod:`.datasource`).

        Raises:
            BadOption: an option is missing or malformed.
        """
        known = {
            "path",
            "min_txid",
            "max_txid",
            "start_time",
            "end_time",
            "topics",
            "partitions",
            "partition_records",
            "metrics_dir",
        }
        opts = {key.lower(): value for key, value in options.items()}
        unknown = sorted(set(opts) - known)
        if unknown:
            raise BadOption(
                f"amps_txlog has no option {', '.join(unknown)}; the options are "
                f"{', '.join(sorted(known))}"
            )
        path = opts.get("path")
        if not path:
            raise BadOption(
                'amps_txlog needs the journal directory: .load("/path/to/journal") (the '
                "instance's TransactionLog/JournalDirectory)"
            )
        topics = None
        if "topics" in opts:
            topics = frozenset(t.strip() for t in opts["topics"].split(",") if t.strip())
            if not topics:
                raise BadOption("amps_txlog option topics is empty; give topic names: a,b,c")
        return cls(
            path=path,
            min_txid=_int_option(opts, "min_txid", 0),
            max_txid=_int_option(opts, "max_txid", 0),
            start_us=_time_option(opts, "start_time"),
            end_us=_time_option(opts, "end_time"),
            topics=topics,
            partitions=_int_option(opts, "partitions", 1),
            partition_records=_int_option(opts, "partition_records", 1)
            or DEFAULT_PARTITION_RECORDS,
            metrics_dir=opts.get("metrics_dir") or None,
        )

    # ------------------------------------------------------------ narrowing
    def txids_within(self, lo: int | None, hi: int | None) -> ReadPlan:
        """This plan, also bounded by txids ``lo``..``hi`` (inclusive)."""
        return replace(
            self,
            min_txid=_tighter(self.min_txid, lo, max),
            max_txid=_tighter(self.max_txid, hi, min),
        )

    def times_within(self, start_us: int | None, end_us: int | None) -> ReadPlan:
        """This plan, also bounded by local times ``[start_us, end_us)``."""
        return replace(
            self,
            start_us=_tighter(self.start_us, start_us, max),
            end_us=_tighter(self.end_us, end_us, min),
        )

    def topics_within(self, topics: frozenset[str]) -> ReadPlan:
        """This plan, also limited to ``topics``."""
        return replace(self, topics=topics if self.topics is None else self.topics & topics)

    # ------------------------------------------------------------ planning
    def ranges(self, journal: Journal, newest: int | None = None) -> list[tuple[int, int]]:
        """``(after_txid, max_txid)`` ranges covering what this plan wants of
        ``journal`` up to txid ``newest`` (default: its newest txid now), in txid
        order; empty when nothing can match.

        ``newest`` ends every read of this plan: records committed later are not read
        (so every partition reads one consistent snapshot).
        """
        if self.topics is not None and not self.topics:
            return []
        last = journal.last_txid if newest is None else min(newest, journal.last_txid)
        first = journal.first_txid()
        if not first:
            return []
        lo = max(first, self.min_txid or 0)
        hi = min(last, self.max_txid) if self.max_txid is not None else last
        if self.start_us is not None:
            lo = max(lo, journal.txid_before_time(self.start_us) + 1)
        if self.end_us is not None:
            hi = min(hi, journal.txid_before_time(self.end_us))
        if lo > hi:
            return []
        count = hi - lo + 1
        parts = self.partitions or -(-count // self.partition_records)
        parts = max(1, min(parts, count, MAX_PARTITIONS))
        bounds = [lo - 1 + count * i // parts for i in range(parts + 1)]
        return [(bounds[i], bounds[i + 1]) for i in range(parts)]


#: what one DataFrame reads: each journal directory and its newest txid when the
#: DataFrame was loaded
Snapshot = tuple[tuple[str, int], ...]


def take_snapshot(path: str) -> Snapshot:
    """The journals ``path`` names (itself, or each one below it: see
    :func:`.sources.journal_directories`) with their newest txids now, as absolute
    paths (executors resolve them, not the driver's working directory).

    Raises:
        JournalError: no journal there (the message says what to pass), or one
            cannot be opened.
    """
    taken: list[tuple[str, int]] = []
    for directory in require_journals(path):
        with Journal(directory, readonly=True) as journal:
            taken.append((str(directory.resolve()), journal.last_txid))
    return tuple(taken)


def read_range(
    plan: ReadPlan, after_txid: int, max_txid: int, index: int = 0
) -> Iterator[pa.RecordBatch]:
    """The records ``after_txid < txid <= max_txid`` of ``plan``'s journal that the
    plan wants, as Arrow batches (:data:`.schema.ARROW_SCHEMA`) in txid order.

    Opens the journal read-only for the duration (safe while its instance runs) and
    reads it in short transactions. With ``plan.metrics_dir``, writes
    ``partition-<index>-<random>.json`` there at the end: ``{"partition", "after_txid",
    "max_txid", "scanned", "rows"}`` (records read from the journal, rows yielded).

    Raises:
        JournalDamaged: a record failed its CRC or other checks; the message names the
            journal and the txid. No row of a damaged record is ever yielded.
        JournalError: the path holds no journal (the message says what to pass).
    """
    topics = None if plan.topics is None else frozenset(t.encode() for t in plan.topics)
    scanned = rows = 0
    limit = BATCH_RECORDS
    with Journal(plan.path, readonly=True) as journal:
        if journal.damage is not None:
            raise journal.damage
        instance = journal.instance_name
        after = after_txid
        while after < max_txid:
            try:
                stored = journal.read_stored(after, limit, max_txid)
            except CorruptRecord as exc:
                raise JournalDamaged(f"journal {plan.path}: {exc}") from exc
            if not stored.values:
                break
            after = stored.fields[-1][_TXID_AT]
            count = len(stored.values)
            scanned += count
            size = sum(map(len, stored.values))
            limit = max(1, min(BATCH_RECORDS, BATCH_BYTES * count // max(size, 1)))
            chosen = select_stored(stored, topics, plan.start_us, plan.end_us)
            if not chosen.values:
                continue
            try:
                batch = stored_to_batch(instance, chosen)
            except CorruptRecord as exc:
                raise JournalDamaged(f"journal {plan.path}: {exc}") from exc
            rows += batch.num_rows
            yield batch
    if plan.metrics_dir:
        report = {
            "partition": index,
            "after_txid": after_txid,
            "max_txid": max_txid,
            "scanned": scanned,
            "rows": rows,
        }
        target = Path(plan.metrics_dir) / f"partition-{index}-{uuid.uuid4().hex}.json"
        temp = target.with_suffix(".tmp")
        temp.write_text(json.dumps(report))
        os.replace(temp, target)


def _tighter(current: int | None, new: int | None, pick: Callable[[int, int], int]) -> int | None:
    if new is None:
        return current
    if current is None:
        return new
    return pick(current, new)


def _int_option(opts: Mapping[str, str], name: str, minimum: int) -> int | None:
    raw = opts.get(name)
    if raw is None or raw == "":
        return None
    try:
        value = int(raw)
    except ValueError:
        raise BadOption(f"amps_txlog option {name}={raw!r} is not a whole number") from None
    if value < minimum:
        raise BadOption(f"amps_txlog option {name}={raw!r} must be at least {minimum}")
    return value


def _time_option(opts: Mapping[str, str], name: str) -> int | None:
    raw = opts.get(name)
    if raw is None or raw == "":
        return None
    return parse_time_us(raw, f"amps_txlog option {name}")


def parse_time_us(raw: str, what: str) -> int:
    """µs since the epoch from ``raw``: ISO 8601 (``2026-11-24T10:00:00Z``; no zone
    means UTC) or a whole number of µs since the epoch.

    Raises:
        BadOption: naming ``what`` and the accepted forms.
    """
    text = raw.strip()
    if text.lstrip("-").isdigit():
        return int(text)
    try:
        moment = datetime.fromisoformat(text.replace("Z", "+00:00").replace("z", "+00:00"))
    except ValueError:
        raise BadOption(
            f"{what}={raw!r} is not a time: give ISO 8601 (2026-11-24T10:00:00Z) or "
            "microseconds since the epoch"
        ) from None
    return datetime_us(moment)


def datetime_us(moment: datetime) -> int:
    """µs since the epoch of ``moment`` (naive: UTC, the pipeline's session zone)."""
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    delta = moment - datetime(1970, 1, 1, tzinfo=UTC)
    return (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds
