"""The ``amps_txlog`` PySpark data source: one instance's journal as a DataFrame.

    import amps_py.pipeline
    amps_py.pipeline.register(spark)          # sessions from spark_session() have it
    df = spark.read.format("amps_txlog").load("/var/amps/journal")
    df.where("topic = 'orders' AND txid > 1000").groupBy("client_name").count()

One row per journal record, the columns of :mod:`.schema`. The journal is opened
read-only, so it can be read while its instance runs: the newest txid when the query
is planned ends every partition's read (one consistent snapshot; later records are
not read). Partitions are txid ranges (about 50,000 records each unless
``partitions`` says how many), read in parallel; each partition opens the journal
itself (nothing of LMDB is ever pickled) and yields Arrow batches. On a cluster, the
driver and every executor must see the journal directory at the same path. Records
in compressed or archived journal segments are read from their files; removed ones
are gone.

Options (all optional but the path):

==================  =============================================================
``min_txid``        first txid to read (inclusive)
``max_txid``        last txid to read (inclusive)
``start_time``      first local time to read (inclusive): ISO 8601 or µs since epoch
``end_time``        local time to stop before (exclusive)
``topics``          comma-separated exact topic names
``partitions``      how many txid ranges to read in parallel
``partition_records``  records per partition when ``partitions`` is not given
``metrics_dir``     a directory where each partition writes what it read (JSON)
==================  =============================================================

Filters on ``txid`` (=, <, <=, >, >=), ``local_ts`` (the same) and ``topic`` (=, IN)
in ``df.where(...)`` are pushed down like the options: txid and time bounds narrow the
txid ranges read, topics skip decoding other topics' records (they are still read
and CRC-checked). A ``txid IN (...)`` narrows the range to its smallest and largest
value and Spark applies the rest. See :mod:`.readplan` for how time bounds map to
txids.

A record that fails its CRC (or any check every journal read makes) fails the
Spark task, and so the job, with an error naming the journal and the txid: a
damaged record never becomes a row.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    EqualTo,
    Filter,
    GreaterThan,
    GreaterThanOrEqual,
    In,
    InputPartition,
    LessThan,
    LessThanOrEqual,
)
from pyspark.sql.types import StructType

from txlog import Journal

from .readplan import BadOption, ReadPlan, datetime_us, read_range
from .schema import ARROW_SCHEMA, SPARK_DDL

#: the format name: ``spark.read.format(FORMAT)``
FORMAT = "amps_txlog"


class TxlogDataSource(DataSource):
    """``spark.read.format("amps_txlog").load(JOURNAL_DIR)``; see the module doc."""

    @classmethod
    def name(cls) -> str:
        return FORMAT

    def schema(self) -> str:
        return SPARK_DDL

    def reader(self, schema: StructType) -> TxlogReader:
        """Raises:
        BadOption: an option is unknown or malformed, or a schema other than the
            journal's was given."""
        if list(schema.fieldNames()) != ARROW_SCHEMA.names:
            raise BadOption(
                "amps_txlog has a fixed schema (amps_py.pipeline.schema.SPARK_DDL): "
                "do not pass .schema(...); select the columns you want instead"
            )
        return TxlogReader(ReadPlan.from_options(self.options))


@dataclass
class TxidRange(InputPartition):
    """One partition: the records ``after_txid < txid <= max_txid``."""

    index: int
    after_txid: int
    max_txid: int


class TxlogReader(DataSourceReader):
    """Plans txid ranges at the driver and reads each in a task; holds only the plan
    (picklable)."""

    def __init__(self, plan: ReadPlan) -> None:
        self.plan = plan

    def pushFilters(self, filters: list[Filter]) -> list[Filter]:
        """Take the filters on txid, local_ts and topic into the plan; return the rest
        (and ``txid IN``, which is only narrowed to its range) for Spark to apply."""
        rest: list[Filter] = []
        for condition in filters:
            plan, exact = push_filter(self.plan, condition)
            self.plan = plan
            if not exact:
                rest.append(condition)
        return rest

    def partitions(self) -> Sequence[InputPartition]:
        with Journal(self.plan.path, readonly=True) as journal:
            ranges = self.plan.ranges(journal)
        if not ranges:
            return [TxidRange(0, 0, 0)]  # reads nothing
        return [TxidRange(i, after, last) for i, (after, last) in enumerate(ranges)]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, TxidRange)
        return read_range(self.plan, partition.after_txid, partition.max_txid, partition.index)


def push_filter(plan: ReadPlan, condition: Any) -> tuple[ReadPlan, bool]:
    """``plan`` narrowed by one pushed-down Spark filter, and whether the plan now
    applies it exactly (else Spark must still apply it; the plan is then unchanged or
    only narrowed to a superset)."""
    column = getattr(condition, "attribute", None)
    value: Any = getattr(condition, "value", None)
    if column == ("txid",):
        if isinstance(condition, In):
            numbers = [v for v in value if _is_int(v)]
            if not numbers or len(numbers) != len(value):
                return plan, False
            return plan.txids_within(min(numbers), max(numbers)), False
        if not _is_int(value):
            return plan, False
        bounds = _bounds(condition, value)
        if bounds is None:
            return plan, False
        lo, hi = bounds
        return plan.txids_within(lo, None if hi is None else hi - 1), True
    if column == ("local_ts",):
        if not isinstance(value, datetime):
            return plan, False
        bounds = _bounds(condition, datetime_us(value))
        if bounds is None:
            return plan, False
        return plan.times_within(*bounds), True
    if column == ("topic",):
        if isinstance(condition, EqualTo) and isinstance(value, str):
            return plan.topics_within(frozenset([value])), True
        if isinstance(condition, In) and all(isinstance(v, str) for v in value):
            return plan.topics_within(frozenset(value)), True
    return plan, False


def _bounds(condition: Any, value: int) -> tuple[int | None, int | None] | None:
    """A comparison with a whole number (txid, µs) as a half-open range ``[lo, hi)``
    (None: open), or None for another kind of filter."""
    if isinstance(condition, EqualTo):
        return value, value + 1
    if isinstance(condition, GreaterThan):
        return value + 1, None
    if isinstance(condition, GreaterThanOrEqual):
        return value, None
    if isinstance(condition, LessThan):
        return None, value
    if isinstance(condition, LessThanOrEqual):
        return None, value + 1
    return None


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)
