"""Where the pipeline reads records from: a journal directory (through the
``amps_txlog`` data source), a directory holding several (:func:`journal_directories`)
or an export directory (the Parquet files ``amps-py pipeline export`` writes, which
need neither LMDB nor the instance's host).

Both give the same columns (:data:`.schema.ARROW_SCHEMA`), so a job does not care
which it reads: export on the server host without Java, copy the directory where Spark
runs, and run the job there.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

from .export_layout import (
    CUMULATIVE_MANIFEST,
    MANIFEST_DIR,
    OLD_EXPORT_FORMAT,
    OLD_LAYOUT_FIX,
    OLD_TOPIC_PREFIX,
    decode_name,
)
from .schema import ARROW_SCHEMA

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession


def journal_directories(path: str | os.PathLike[str]) -> list[Path]:
    """The journals in ``path``: ``path`` itself when it is a journal directory (it
    holds ``data.mdb``), else the directories below it holding ``data.mdb``, sorted,
    except the stores a journal directory keeps inside it (its SOW stores, queue
    checkpoints and client-name owners, each an LMDB environment of its own). Empty
    when there is none."""
    root = Path(path)
    if (root / "data.mdb").is_file():
        return [root]
    holding = sorted(d.parent for d in root.rglob("data.mdb"))
    journals: list[Path] = []
    for directory in holding:
        if not any(directory.is_relative_to(j) for j in journals):
            journals.append(directory)
    return journals


def require_journals(path: str | os.PathLike[str]) -> list[Path]:
    """:func:`journal_directories` of ``path``, which must name at least one.

    Raises:
        JournalError: ``path`` does not exist, or neither it nor anything below it
            holds a journal (the message says what to pass).
    """
    from txlog import JournalError

    base = Path(path)
    if not base.is_dir():
        raise JournalError(
            f"{base}: no such directory; pass an instance's TransactionLog/JournalDirectory "
            "or a directory holding them"
        )
    journals = journal_directories(base)
    if not journals:
        raise JournalError(
            f"{base} holds no journal (no data.mdb in it or below it); pass an instance's "
            "TransactionLog/JournalDirectory or a directory holding them"
        )
    return journals


def old_export_layout(path: str | os.PathLike[str]) -> str | None:
    """What says the export directory ``path`` is in the previous layout (which
    readers cannot read whole), with the fix; None when it is not."""
    root = Path(path)
    old = sorted(p.name for p in root.glob(f"{OLD_TOPIC_PREFIX}*") if p.is_dir())
    if not old:
        for manifest in sorted(root.glob(f"{MANIFEST_DIR}/*/{CUMULATIVE_MANIFEST}")):
            with open(manifest, "rb") as f:
                if f'"{OLD_EXPORT_FORMAT}"'.encode() in f.read(200):
                    old = [str(manifest.relative_to(root))]
                    break
    if not old:
        return None
    return (
        f"{root} holds an export in the previous layout ({OLD_EXPORT_FORMAT}: {old[0]}); "
        f"{OLD_LAYOUT_FIX}"
    )


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
    journal columns. Filters on ``topic`` skip other topics' row groups; the
    partition column ``date`` (not selected) prunes directories.

    Raises:
        ValueError: ``path`` holds an export in the previous layout (the message
            names the fix).
    """
    from pyspark.sql import functions as F

    old = old_export_layout(path)
    if old is not None:
        raise ValueError(old)
    df = spark.read.parquet(str(path))
    if instance is not None:
        df = df.where(F.col("instance") == instance)
    return df.select(*ARROW_SCHEMA.names)
