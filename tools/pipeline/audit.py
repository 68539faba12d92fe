"""The fabric audit as a plain script, for spark-submit (same options as
``amps-py pipeline audit``)::

    PYSPARK_PYTHON=.venv/bin/python .venv/bin/spark-submit --master spark://HOST:7077 \\
        tools/pipeline/audit.py --config fabric/ --journals journals/ --out report/

Without ``--master`` here, spark-submit's master is used; the executors need the same
Python with amps-py installed (PYSPARK_PYTHON).

Exit status as the command's: 0 no problems, 1 problems found, 2 the audit could not
run (a config, journal or option), 3 the audit could not complete (the Spark job
failed: a damaged record, out of memory, a lost executor; one line says which).
"""

from __future__ import annotations

from amps_py.cli.pipeline import audit_command

if __name__ == "__main__":
    audit_command(prog_name="audit.py")
