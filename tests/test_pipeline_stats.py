"""``amps-py pipeline stats`` on journals with known content: exact counts, bytes,
buckets and percentiles (the shared ``spark`` fixture), the readable table and
``--json`` from the real command, and ``tools/pipeline/stats.py`` under
``spark-submit``."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from clirun import cli_env, run

from txlog import Journal, Record, publisher_hash

#: a minute boundary (µs): bucket starts are multiples of the bucket width
T0 = 1_790_000_040_000_000
S = 1_000_000

#: (journal, topic, publisher, payload size, seconds after T0)
MESSAGES = [
    ("a", "orders", "alice", 10, 0),
    ("a", "orders", "alice", 20, 1),
    ("a", "orders", "bob", 100, 1),
    ("a", "orders", "alice", 30, 2),
    ("a", "trades", "alice", 5, 30),
    ("a", "trades", "alice", 5, 31),
    ("a", "orders", "alice", 40, 61),
    ("a", "orders", "bob", 300, 62),
    ("a", "orders", "alice", 50, 62),
    ("a", "trades", "alice", 5, 90),
    ("a", "orders", "alice", 60, 125),
    ("b", "orders", "carol", 7, 3),
]


def write_journals(root: Path) -> dict[str, Path]:
    paths = {}
    seqs: dict[str, int] = {}
    for name in ("a", "b"):
        paths[name] = root / f"{name}-journal"
        with Journal(paths[name], instance_name=f"inst-{name}") as j:
            for journal, topic, who, size, at in MESSAGES:
                if journal != name:
                    continue
                seqs[who] = seqs.get(who, 0) + 1
                payload = b'{"p":"' + b"x" * (size - 8) + b'"}' if size >= 8 else b"7" * size
                assert len(payload) == size
                rec = Record(
                    topic=topic,
                    payload=payload,
                    pub_hash=publisher_hash(who),
                    seq=seqs[who],
                    client_name=who,
                )
                j.append([rec], T0 + at * S)
    return paths


@pytest.fixture(scope="module")
def journals(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return write_journals(tmp_path_factory.mktemp("stats"))


def iso(seconds: int) -> str:
    from amps_py.pipeline.stats import iso as to_iso

    return to_iso(T0 + seconds * S)


def test_counts_bytes_rates_and_sizes_are_exact(spark: Any, journals: dict[str, Path]) -> None:
    from amps_py.pipeline.stats import StatsRequest, journal_stats

    report = journal_stats(spark, StatsRequest((str(journals["a"]), str(journals["b"]))))
    assert report["messages"] == 12 and report["bytes"] == 632
    assert (report["first"], report["last"]) == (iso(0), iso(125))
    by = {(p["instance"], p["topic"], p["publisher"]): p for p in report["publishers"]}
    assert sorted(by) == [
        ("inst-a", "orders", "alice"),
        ("inst-a", "orders", "bob"),
        ("inst-a", "trades", "alice"),
        ("inst-b", "orders", "carol"),
    ]
    alice = by[("inst-a", "orders", "alice")]
    assert alice == {
        "instance": "inst-a",
        "topic": "orders",
        "publisher": "alice",
        "messages": 6,
        "bytes": 210,
        "first": iso(0),
        "last": iso(125),
        "rate_per_s": round(6 / 180, 3),  # three one-minute buckets
        "peak_rate_per_s": 0.05,  # 3 in the first minute
        # sizes 10..60: linear interpolation, as Spark's percentile
        "size": {"min": 10, "mean": 35.0, "p50": 35.0, "p90": 55.0, "p99": 59.5, "max": 60},
        "buckets": [
            {"start": iso(0), "messages": 3, "bytes": 60},
            {"start": iso(60), "messages": 2, "bytes": 90},
            {"start": iso(120), "messages": 1, "bytes": 60},
        ],
    }
    bob = by[("inst-a", "orders", "bob")]
    assert (bob["messages"], bob["bytes"], bob["size"]["p50"]) == (2, 400, 200.0)
    assert by[("inst-b", "orders", "carol")]["bytes"] == 7
    topics = {(t["instance"], t["topic"]): t for t in report["topics"]}
    orders = topics[("inst-a", "orders")]
    assert (orders["messages"], orders["bytes"], orders["publishers"]) == (8, 610, 2)
    assert orders["buckets"] == [
        {"start": iso(0), "messages": 4, "bytes": 160},
        {"start": iso(60), "messages": 3, "bytes": 390},
        {"start": iso(120), "messages": 1, "bytes": 60},
    ]
    assert orders["size"]["max"] == 300 and orders["size"]["p50"] == 45.0
    trades = topics[("inst-a", "trades")]
    assert (trades["messages"], trades["bytes"], trades["size"]["p99"]) == (3, 15, 5.0)


def test_topic_and_time_bounds_and_bucket_width(spark: Any, journals: dict[str, Path]) -> None:
    from amps_py.pipeline.stats import StatsRequest, journal_stats

    request = StatsRequest(
        (str(journals["a"]),),
        bucket_seconds=30,
        topics=("orders",),
        start_time=iso(1),
        end_time=iso(62),
    )
    report = journal_stats(spark, request)
    assert [(p["publisher"], p["messages"], p["bytes"]) for p in report["publishers"]] == [
        ("alice", 3, 90),  # 20, 30, 40: seconds 1, 2, 61
        ("bob", 1, 100),
    ]
    assert [b["start"] for b in report["topics"][0]["buckets"]] == [iso(0), iso(60)]


def test_a_damaged_journal_fails_naming_the_txid(spark: Any, tmp_path: Path) -> None:
    from amps_py.cli.pipeline import _spark_failure
    from amps_py.pipeline.stats import StatsRequest, journal_stats

    path = write_journals(tmp_path)["a"]
    data = bytearray((path / "data.mdb").read_bytes())
    # bob's 300-byte payload, txid 8, in every page holding it: LMDB's copy-on-write
    # leaves stale copies in free pages, and the first one found may be one of them
    at = data.find(b"x" * 292)
    assert at >= 0
    while at >= 0:
        data[at + 10] ^= 0x01
        at = data.find(b"x" * 292, at + 292)
    (path / "data.mdb").write_bytes(bytes(data))
    with pytest.raises(Exception, match="record txid 8 is corrupt") as err:
        journal_stats(spark, StatsRequest((str(path),)))
    message, code = _spark_failure(err.value)
    assert code == 3
    assert message.startswith(f"journal {path}: record txid 8 is corrupt: CRC mismatch")


def test_an_export_directory_gives_the_journals_statistics(
    spark: Any, journals: dict[str, Path], tmp_path: Path
) -> None:
    """Export on the server host (no Java), run the job where Spark runs: the same
    report from the Parquet files as from the journals, bounds included."""
    from amps_py.pipeline.export import export_journal
    from amps_py.pipeline.stats import StatsRequest, journal_stats

    out = tmp_path / "export"
    for path in journals.values():
        export_journal(path, out)
    for request in (
        StatsRequest((str(journals["a"]), str(journals["b"]))),
        StatsRequest((str(journals["a"]),), 30, ("orders",), iso(1), iso(62)),
    ):
        from_journals = journal_stats(spark, request)
        exported = StatsRequest((str(out),), *dataclass_tail(request))
        from_export = journal_stats(spark, exported)
        if len(request.journals) == 1:  # the export holds both instances: compare one
            from_export["publishers"] = [
                p for p in from_export["publishers"] if p["instance"] == "inst-a"
            ]
            from_export["topics"] = [t for t in from_export["topics"] if t["instance"] == "inst-a"]
            for key in ("messages", "bytes", "first", "last", "journals"):
                from_export.pop(key, None)
                from_journals.pop(key, None)
        else:
            from_export.pop("journals", None)
            from_journals.pop("journals", None)
        assert from_export == from_journals


def dataclass_tail(request: Any) -> tuple[Any, ...]:
    return (request.bucket_seconds, request.topics, request.start_time, request.end_time)


def test_render_text_shows_every_publisher_topic_totals_and_buckets() -> None:
    from amps_py.pipeline.stats import StatsRequest, build_report, render_text

    def summary(instance: str, topic: str, who: str | None, sizes: list[int]) -> dict[str, Any]:
        row: dict[str, Any] = {
            "instance": instance,
            "topic": topic,
            "messages": len(sizes),
            "bytes": sum(sizes),
            "first_us": T0,
            "last_us": T0 + 90 * S,
            "size_min": min(sizes),
            "size_max": max(sizes),
            "size_mean": sum(sizes) / len(sizes),
            "size_percentiles": [20.0, 28.0, 29.8],
        }
        if who:
            row["publisher"] = who
        return row

    buckets = [
        {"instance": "i", "topic": "t", "publisher": "p", "bucket": T0, "messages": 2, "bytes": 30},
        {
            "instance": "i",
            "topic": "t",
            "publisher": "p",
            "bucket": T0 + 60 * S,
            "messages": 1,
            "bytes": 30,
        },
    ]
    report = build_report(
        StatsRequest(("j",)),
        [summary("i", "t", "p", [10, 20, 30])],
        [summary("i", "t", None, [10, 20, 30])],
        buckets,
    )
    text = render_text(report, shown_buckets=1)
    lines = text.splitlines()
    assert lines[0] == f"3 messages, 60 B of payload in 1 instance(s), {iso(0)} to {iso(90)}"
    assert lines[2].split() == [
        "instance",
        "topic",
        "publisher",
        "messages",
        "bytes",
        "msg/s",
        "peak",
        "msg/s",
        "size",
        "p50",
        "p90",
        "p99",
        "max",
    ]
    assert lines[3].split() == [
        "i",
        "t",
        "p",
        "3",
        "60",
        "B",
        "0.025",
        "0.033",
        "20",
        "28",
        "29.8",
        "30",
    ]
    assert lines[4].split()[:4] == ["i", "t", "(all", "1)"]
    assert "t on i: messages per 60 s bucket" in text
    assert "(the latest 1 of 2; --json has them all)" in text
    assert lines[-1].split() == [iso(60), "1", "0.0167", "0.5", "B/s"]


@pytest.mark.slow
def test_the_command_prints_a_table(journals: dict[str, Path], tmp_path: Path) -> None:
    out = run(
        "pipeline", "stats", str(journals["a"]), str(journals["b"]), cwd=tmp_path, timeout=240
    )
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0] == f"12 messages, 632 B of payload in 2 instance(s), {iso(0)} to {iso(125)}"
    rows = [line.split() for line in lines[3:9]]
    assert [r[:5] for r in rows] == [
        ["inst-a", "orders", "alice", "6", "210"],
        ["inst-a", "orders", "bob", "2", "400"],
        ["inst-a", "orders", "(all", "2)", "8"],
        ["inst-a", "trades", "alice", "3", "15"],
        ["inst-a", "trades", "(all", "1)", "3"],
        ["inst-b", "orders", "carol", "1", "7"],
    ]
    assert "orders on inst-a: messages per 60 s bucket" in out.stdout


@pytest.mark.slow
def test_the_script_runs_with_spark_submit(journals: dict[str, Path], tmp_path: Path) -> None:
    submit = Path(sys.executable).parent / "spark-submit"
    if not submit.exists():
        pytest.skip(f"no spark-submit beside {sys.executable}")
    script = Path(__file__).resolve().parents[1] / "tools" / "pipeline" / "stats.py"
    out = subprocess.run(
        [
            str(submit),
            "--master",
            "local[1]",
            str(script),
            str(journals["a"]),
            "--json",
            "--topic",
            "trades",
        ],
        capture_output=True,
        text=True,
        timeout=240,
        cwd=tmp_path,
        env=cli_env({"PYSPARK_PYTHON": sys.executable, "PATH": os.environ["PATH"]}),
        check=False,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    report = json.loads(out.stdout)
    assert [(p["publisher"], p["messages"], p["bytes"]) for p in report["publishers"]] == [
        ("alice", 3, 15)
    ]


@pytest.mark.slow
def test_a_directory_of_journals_and_relative_paths_on_a_standalone_cluster(
    journals: dict[str, Path], tmp_path: Path
) -> None:
    """``stats ./amps-data`` (a directory holding each instance's journal, as the
    walkthrough leaves it) counts every instance; on a standalone cluster the
    executors run in their own working directories, so the relative path the user
    typed must reach them resolved: the report equals the local one."""
    from test_pipeline_audit import standalone_spark

    data = tmp_path / "amps-data"
    for name, path in journals.items():
        shutil.copytree(path, data / f"amps-{name}")
    local = run("pipeline", "stats", "./amps-data", "--json", cwd=tmp_path, timeout=240)
    assert local.returncode == 0, local.stderr
    report = json.loads(local.stdout)
    assert report["messages"] == len(MESSAGES)
    assert {t["instance"] for t in report["topics"]} == {"inst-a", "inst-b"}
    assert report["journals"] == [str(data.resolve())]

    with standalone_spark(tmp_path / "spark-standalone") as url:
        remote = run(
            "pipeline",
            "stats",
            "./amps-data",
            "--json",
            "--master",
            url,
            cwd=tmp_path,
            timeout=600,
        )
    assert remote.returncode == 0, remote.stderr[-4000:]
    assert json.loads(remote.stdout) == report


def test_a_path_without_journals_is_refused_before_spark_starts(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    out = run("pipeline", "stats", "empty", cwd=tmp_path, timeout=60)
    assert out.returncode == 2, out.stderr
    assert "holds no journal (no data.mdb in it or below it)" in out.stderr
    assert "Spark" not in out.stderr and "log4j" not in out.stderr, out.stderr


@pytest.mark.slow
def test_a_setting_spark_refuses_gives_one_line_and_exit_2(
    journals: dict[str, Path], tmp_path: Path
) -> None:
    """Too little driver memory: Spark refuses to start; the user sees Spark's own
    reason and the setting to change in one line, not a py4j traceback."""
    out = run(
        "pipeline",
        "stats",
        str(journals["a"]),
        "--conf",
        "spark.driver.memory=200m",
        cwd=tmp_path,
        timeout=240,
    )
    assert out.returncode == 2, out.stderr
    assert "Traceback" not in out.stderr, out.stderr
    (line,) = [s for s in out.stderr.splitlines() if s.startswith("amps-py: ")]
    assert line.startswith("amps-py: Spark could not start: Insufficient driver memory"), line
    assert "spark.driver.memory" in line, line
