"""The Spark session the pipeline jobs run in: local by default, any master by flag.

Defaults are quiet and safe offline: no web UI, the driver bound to 127.0.0.1 (unless
a remote master is given), WARN logs, and no packages fetched at run time. Python
workers run this interpreter (unless ``PYSPARK_PYTHON`` says otherwise), so they import
amps_py and pyarrow from the same environment. ``conf`` pairs override any of them.
The session has the ``amps_txlog`` data source registered (:func:`amps_py.pipeline.register`).
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Iterable
from typing import TYPE_CHECKING, Final

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

DEFAULT_MASTER: Final = "local[*]"

#: settings every session gets unless ``conf`` says otherwise
QUIET_DEFAULTS: Final = (
    ("spark.ui.enabled", "false"),
    ("spark.ui.showConsoleProgress", "false"),
    ("spark.sql.session.timeZone", "UTC"),
    ("spark.sql.execution.arrow.pyspark.enabled", "true"),
    ("spark.sql.shuffle.partitions", "8"),
    # pyspark's daemon, minus the traceback of a worker whose task Spark cancelled
    ("spark.python.daemon.module", "amps_py.pipeline.spark_daemon"),
)


#: the Spark loggers that report every failed task with its Java stack trace and the
#: Python worker's traceback (the executor, the task scheduler, the block manager that
#: drops the task's half-cached block); see :func:`quiet_task_failures`
TASK_FAILURE_LOGGERS: Final = (
    "org.apache.spark.executor.Executor",
    "org.apache.spark.scheduler.TaskSetManager",
    "org.apache.spark.storage.BlockManager",
)


class SparkUnavailable(RuntimeError):
    """Spark cannot start: pyspark or Java is missing, or a setting is refused (too
    little driver memory, say); the message says what to install or change."""


def error_text(exc: BaseException) -> str:
    """``str(exc)``, even when ``exc`` came from a JVM that has since died: py4j asks
    the JVM for a Java exception's text, and a JVM that ran out of memory and exited
    cannot answer. Then the text says so ("the JVM stopped answering")."""
    try:
        return str(exc)
    except Exception as lost:  # py4j lost its connection to the JVM
        said = str(getattr(exc, "errmsg", "") or "").strip()
        return (
            f"{type(exc).__name__}: {said or 'a Spark call failed'} (and then the JVM "
            f"stopped answering: {type(lost).__name__}: Connection refused)"
        )


def spark_session(
    app: str,
    master: str | None = None,
    conf: Iterable[tuple[str, str]] = (),
) -> SparkSession:
    """A Spark session named ``app`` on ``master`` (default ``local[*]``; under
    ``spark-submit`` with no ``master``, the one spark-submit was given, and its
    ``--conf`` settings win over the quiet defaults). Python workers run this
    interpreter unless ``PYSPARK_PYTHON`` says otherwise.

    Raises:
        SparkUnavailable: pyspark is not installed, Java cannot be found, or Spark
            refused to start (a setting of ``conf``, e.g. too little
            ``spark.driver.memory``: the message has Spark's own first line).
    """
    try:
        from pyspark.sql import SparkSession
    except ImportError:
        from . import install_command

        raise SparkUnavailable(
            f"the Spark pipeline needs pyspark: {install_command()} (Java 17 or newer must "
            "be installed too)"
        ) from None
    if not os.environ.get("JAVA_HOME") and not _on_path("java"):
        raise SparkUnavailable(
            "Spark needs Java (17 or newer): install a JDK (e.g. apt-get install "
            "openjdk-17-jre-headless) or set JAVA_HOME"
        )
    # Python workers (local or on a worker of this machine) run this interpreter, so
    # they import amps_py and pyarrow; pyspark's own default is whatever "python3" is
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    # under spark-submit (a JVM already runs the app) its --master and --conf stand
    submitted = master is None and "PYSPARK_GATEWAY_PORT" in os.environ
    chosen = master or DEFAULT_MASTER
    builder = SparkSession.builder.appName(app)
    settings = dict(QUIET_DEFAULTS)
    if submitted:
        from pyspark import SparkConf

        given = SparkConf()
        settings = {k: v for k, v in settings.items() if not given.contains(k)}
    else:
        builder = builder.master(chosen)
        if chosen.startswith("local"):
            os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")  # no other interface
            settings["spark.driver.bindAddress"] = "127.0.0.1"
            settings["spark.driver.host"] = "127.0.0.1"
    settings.update(conf)
    for key, value in settings.items():
        builder = builder.config(key, value)
    try:
        session = builder.getOrCreate()
    except Exception as exc:  # Spark's own check of a setting, or the JVM not starting
        raise SparkUnavailable(f"Spark could not start: {_first_line(exc)}") from None
    session.sparkContext.setLogLevel("WARN")
    from amps_py.pipeline import register

    register(session)
    return session


def quiet_task_failures(session: SparkSession) -> None:
    """Silence the loggers of :data:`TASK_FAILURE_LOGGERS` in ``session``'s JVM (the
    driver's, and a local master's executors, which run in it).

    For the ``amps-py pipeline`` commands: they report a failed job in one line
    (a damaged journal: its path, the txids and the fix, see
    :func:`amps_py.cli.pipeline._spark_failure`), which the tens of lines of stack
    trace Spark logs for each failed task would otherwise bury. Other warnings and
    errors are still logged."""
    jvm = session.sparkContext._jvm
    if jvm is None:  # a stopped session
        return
    off = jvm.org.apache.logging.log4j.Level.OFF
    for name in TASK_FAILURE_LOGGERS:
        jvm.org.apache.logging.log4j.core.config.Configurator.setLevel(name, off)


def _first_line(exc: BaseException) -> str:
    """What a start failure says is wrong: Spark's own error after its
    ``[ERROR_CLASS]`` tag (with the advice on the next line, without the SQLSTATE),
    else the first line."""
    lines = [line.strip() for line in error_text(exc).splitlines() if line.strip()]
    for i, line in enumerate(lines):
        tagged = _ERROR_CLASS.search(line)
        if tagged:
            said = [tagged.group(1)]
            if i + 1 < len(lines) and not lines[i + 1].startswith("at "):
                said.append(lines[i + 1])
            return _SQLSTATE.sub("", " ".join(said)).strip()
    return lines[0] if lines else type(exc).__name__


#: Spark's error messages: ``SomeException: [ERROR_CLASS.SUBCLASS] what is wrong``
_ERROR_CLASS: Final = re.compile(r"Exception: \[[A-Z_.]+\] (.+)$")
_SQLSTATE: Final = re.compile(r"\s*SQLSTATE: \w+\s*$")


def _on_path(program: str) -> bool:
    return any(
        os.access(os.path.join(folder, program), os.X_OK)
        for folder in os.environ.get("PATH", "").split(os.pathsep)
        if folder
    )
