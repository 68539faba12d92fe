"""The ``amps_txlog`` PySpark data source: journals as a DataFrame.

    import amps_py.pipeline
    amps_py.pipeline.register(spark)          # sessions from spark_session() have it
    df = spark.read.format("amps_txlog").load("/var/amps/journal")
    df.where("topic = 'orders' AND txid > 1000").groupBy("client_name").count()

One row per journal record, the columns of :mod:`.schema`. The path is an instance's
journal directory, or a directory holding several (``./amps-data`` holding
``amps-a`` and ``amps-b``): then every journal below it is read and the ``instance``
column tells them apart (see :func:`.sources.journal_directories`).

One DataFrame, one snapshot: ``load()`` notes each journal's newest txid, and every
query of that DataFrame (and of DataFrames derived from it, SQL views included)
reads the records up to there and no further, so a count, a filtered count and a
``groupBy`` of one DataFrame agree even while the instance keeps writing. Load again
to see newer records. The journals are opened read-only, so they can be read while
their instances run. Partitions are txid ranges (about 50,000 records each unless
``partitions`` says how many per journal), read in parallel; each partition opens
its journal itself (nothing of LMDB is ever pickled) and yields Arrow batches. On a
cluster, the driver and every executor must see the journal directories at the same
absolute path (relative paths are resolved on the driver). Records in compressed or
archived journal segments are read from their files; removed ones are gone.

Options (all optional but the path); they narrow what is read, so a query of a
narrowed DataFrame reads only that part of each journal:

======================  =========================================================
``min_txid``            first txid to read (inclusive)
``max_txid``            last txid to read (inclusive)
``start_time``          first local time to read (inclusive): ISO 8601 or µs since
                        the epoch
``end_time``            local time to stop before (exclusive)
``topics``              comma-separated exact topic names (other topics' records
                        are still read and CRC-checked, not decoded)
``partitions``          how many txid ranges to read in parallel, per journal
``partition_records``   records per partition when ``partitions`` is not given
``metrics_dir``         a directory where each partition writes what it read (JSON)
======================  =========================================================

``df.where(...)`` is applied by Spark to the rows read, never taken into the read
(see :class:`TxlogReader` for why): ``df.where("txid > 1000")`` reads the whole
journal and returns the right rows; ``.option("min_txid", "1001")`` reads only those.
See :mod:`.readplan` for how time bounds map to txids.

A record that fails its CRC (or any check every journal read makes) fails the
Spark task, and so the job, with an error naming the journal and the txid: a
damaged record never becomes a row.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace

import pyarrow as pa
from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition
from pyspark.sql.types import StructType

from txlog import Journal

from .readplan import BadOption, ReadPlan, Snapshot, read_range, take_snapshot
from .schema import ARROW_SCHEMA, SPARK_DDL

#: the format name: ``spark.read.format(FORMAT)``
FORMAT = "amps_txlog"


class TxlogDataSource(DataSource):
    """``spark.read.format("amps_txlog").load(JOURNAL_DIR)``; see the module doc.

    Spark makes one of these per ``load()``, and every query of that DataFrame plans
    from it: the options are checked and the snapshot (each journal's newest txid) is
    taken here, once, so a DataFrame reads the same records in every query.
    """

    def __init__(self, options: dict[str, str]) -> None:
        """Raises:
        BadOption: an option is unknown or malformed.
        JournalError: the path holds no journal (the message says what to pass)."""
        super().__init__(options)
        self.plan = ReadPlan.from_options(self.options)
        self.snapshot = take_snapshot(self.plan.path)

    @classmethod
    def name(cls) -> str:
        return FORMAT

    def schema(self) -> str:
        return SPARK_DDL

    def reader(self, schema: StructType) -> TxlogReader:
        """Raises:
        BadOption: a schema other than the journal's was given."""
        if list(schema.fieldNames()) != ARROW_SCHEMA.names:
            raise BadOption(
                "amps_txlog has a fixed schema (amps_py.pipeline.schema.SPARK_DDL): "
                "do not pass .schema(...); select the columns you want instead"
            )
        return TxlogReader(self.plan, self.snapshot)


@dataclass
class TxidRange(InputPartition):
    """One partition: the records ``after_txid < txid <= max_txid`` of the journal at
    ``journal`` (one of those the DataFrame reads)."""

    index: int
    journal: str
    after_txid: int
    max_txid: int


class TxlogReader(DataSourceReader):
    """Plans txid ranges at the driver and reads each in a task; holds only the plan
    and the snapshot (picklable).

    It takes no filter from Spark (no ``pushFilters``): Spark applies every ``where``
    itself. Spark 4.3 keeps the partitions planned for one query of a DataFrame and
    reuses them for the next query of that DataFrame that pushes no filter, so a
    reader narrowed by one query's filters would silently narrow the next (a count
    after a filtered count returned the filtered count). Narrow a read with the
    options instead: they belong to the DataFrame, so every query of it honours them.
    """

    def __init__(self, plan: ReadPlan, snapshot: Snapshot) -> None:
        self.plan = plan
        self.snapshot = snapshot

    def partitions(self) -> Sequence[InputPartition]:
        parts: list[InputPartition] = []
        for journal, newest in self.snapshot:
            with Journal(journal, readonly=True) as opened:
                ranges = self.plan.ranges(opened, newest)
            parts.extend(
                TxidRange(len(parts) + i, journal, after, last)
                for i, (after, last) in enumerate(ranges)
            )
        if not parts:
            return [TxidRange(0, self.snapshot[0][0], 0, 0)]  # reads nothing
        return parts

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, TxidRange)
        plan = replace(self.plan, path=partition.journal)
        return read_range(plan, partition.after_txid, partition.max_txid, partition.index)
