"""The data pipeline over journals: a PySpark data source, Parquet export, the fabric
audit and topic statistics.

Nothing here is imported by the server: pyspark and pyarrow are the optional ``spark``
extra (:func:`install_command` says how to install it). :mod:`.schema` turns journal
records into Arrow columns (pyarrow only, no Spark); :mod:`.spark` builds the Spark
session with quiet, offline-safe defaults. Export runs without Java; the Spark jobs
read its Parquet or the ``amps_txlog`` data source (:mod:`.datasource`; it plans txid ranges with
:mod:`.readplan` and builds Arrow batches with :mod:`.decode`). :mod:`.stats` is the
topic statistics job.

In your own PySpark code::

    import amps_py.pipeline
    amps_py.pipeline.register(spark)
    df = spark.read.format("amps_txlog").load("/path/to/journal")
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

__all__ = ["install_command", "register", "with_decoded"]


def register(spark: SparkSession) -> None:
    """Make ``spark.read.format("amps_txlog")`` available in ``spark`` (a session you
    built yourself; sessions from :func:`.spark.spark_session` already have it).

    Spark's Python workers must import amps_py and pyarrow: start such a session with
    ``PYSPARK_PYTHON`` naming this environment's Python (``spark_session`` does)."""
    from .datasource import TxlogDataSource

    spark.dataSource.register(TxlogDataSource)


def with_decoded(df: DataFrame) -> DataFrame:
    """``df`` with a ``decoded`` column: each body as JSON text, whatever its message
    type (:func:`.decoded.with_decoded`)."""
    from .decoded import with_decoded as add

    return add(df)


def install_command() -> str:
    """How to install the spark extra for this amps-py: from its source checkout
    (pyproject.toml of the amps-py project beside the package) ``pip install -e
    '.[spark]'`` there (``cd CHECKOUT && `` first when elsewhere), else the published
    distribution's ``pip install 'amps-py[spark]'``."""
    root = Path(__file__).resolve().parents[2]
    pyproject = root / "pyproject.toml"
    try:
        checkout = 'name = "amps-py"' in pyproject.read_text(encoding="utf-8")
    except OSError:
        checkout = False
    if not checkout:
        return "pip install 'amps-py[spark]'"
    here = Path.cwd().resolve() == root
    return ("" if here else f"cd {root} && ") + "pip install -e '.[spark]'"
