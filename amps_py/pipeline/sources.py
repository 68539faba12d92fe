"""Where the Spark jobs read records from: a journal directory (through the
``amps_txlog`` data source) or an export directory (the Parquet files ``amps-py
pipeline export`` writes, which need neither LMDB nor the instance's host).

Both give the same columns (:data:`.schema.ARROW_SCHEMA`), so a job does not care
which it reads: export on the server host without Java, copy the directory where Spark
runs, and run the job there.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

from .export_layout import CUMULATIVE_MANIFEST, MANIFEST_DIR, decode_name
from .schema import ARROW_SCHEMA

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession


def is_export(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` is an export directory (it holds export manifests)."""
    return (Path(path) / MANIFEST_DIR).is_dir()


def export_instances(path: str | os.PathLike[str]) -> list[str]:
    """The instances whose records the export directory ``path`` holds (those with a
    cumulative manifest), sorted."""
    base = Path(path) / MANIFEST_DIR
    if not base.is_dir():
        return []
    return sorted(
        decode_name(d.name) for d in base.iterdir() if (d / CUMULATIVE_MANIFEST).is_file()
    )


def read_export(
    spark: SparkSession, path: str | os.PathLike[str], instance: str | None = None
) -> DataFrame:
    """The exported records in ``path`` (of ``instance`` only, when given) with the
    journal columns; topic and date filters prune directories."""
    from pyspark.sql import functions as F

    df = spark.read.parquet(str(path))
    if instance is not None:
        df = df.where(F.col("instance") == instance)
    return df.select(*ARROW_SCHEMA.names)
