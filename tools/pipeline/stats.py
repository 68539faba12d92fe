"""Topic statistics as a plain script, for spark-submit (same arguments and options as
``amps-py pipeline stats``)::

    PYSPARK_PYTHON=.venv/bin/python .venv/bin/spark-submit tools/pipeline/stats.py \\
        JOURNAL_DIR... [--bucket 60] [--topic T] [--json]

The Python that runs it (and the executors', PYSPARK_PYTHON) needs amps-py installed
with the spark extra.
"""

from __future__ import annotations

from amps_py.cli.pipeline import stats_command

if __name__ == "__main__":
    stats_command(prog_name="stats.py")
