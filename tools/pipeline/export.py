#!/usr/bin/env python3
"""Export a journal to Parquet: ``amps-py pipeline export`` as a standalone script.

Plain Python + pyarrow (no Spark, no Java, no spark-submit): run it on the server
host, beside a running instance, with the Python that has amps-py installed::

    python tools/pipeline/export.py JOURNAL OUT [--verify] [--instance NAME] ...

Same options, output and exit status as ``amps-py pipeline export --help`` says.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # a checkout, not installed

from amps_py.cli.pipeline import pipeline_export

if __name__ == "__main__":
    pipeline_export.main(prog_name="export.py")
