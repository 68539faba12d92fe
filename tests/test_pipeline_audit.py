"""The fabric audit on Spark, against a real three-instance fabric (see audit_fabric.py):
a clean run finds nothing; journals tampered with on purpose (a record deleted on C, one
duplicated on B, two of one publisher swapped on A) give exactly those findings, with
instance, bookmark and expected path, and exit status 1; the HTML report renders in
headless Chromium with no network; a standalone Spark cluster (master and worker on
127.0.0.1) gives the same report as local mode.

The ``spark`` fixture is the session-scoped one in conftest.py.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from audit_fabric import (
    FILTER,
    Published,
    delete_record,
    duplicate_record,
    read_all,
    run_fabric,
    swap_records,
)
from harness import wait_until_sync
from headless import OFFLINE_FLAGS, find_chromium, png_pixels

pytest.importorskip("pyspark", reason="the audit tests need the spark extra (pyspark)")
pytest.importorskip("pyarrow", reason="the audit tests need the spark extra (pyarrow)")
if not os.environ.get("JAVA_HOME") and shutil.which("java") is None:
    pytest.skip(
        "Spark needs Java (17 or newer): apt-get install openjdk-17-jre-headless",
        allow_module_level=True,
    )

from amps_py.pipeline.audit import prepare_audit, run_audit, write_report

pytestmark = pytest.mark.slow

NAMES = ("A", "B", "C")


@dataclass(frozen=True)
class FabricRun:
    root: Path
    configs: tuple[Path, ...]
    journals: dict[str, Path]
    sent: dict[str, list[Published]]


@pytest.fixture(scope="module")
def fabric_run(tmp_path_factory: pytest.TempPathFactory) -> FabricRun:
    """The fabric, run once for the module: published to, then stopped."""
    root = tmp_path_factory.mktemp("audit-fabric")
    cluster, sent = run_fabric(root / "fabric")
    return FabricRun(
        root,
        tuple(cluster.server(n).config for n in NAMES),
        {n: cluster.journal_dir(n) for n in NAMES},
        sent,
    )


def audit_command(configs: tuple[Path, ...], journals: Path, out: Path, master: str) -> list[str]:
    """``amps-py pipeline audit`` as a user types it (several values after one option)."""
    return [
        sys.executable,
        "-m",
        "amps_py",
        "pipeline",
        "audit",
        "--config",
        *map(str, configs),
        "--journals",
        str(journals),
        "--out",
        str(out),
        "--master",
        master,
    ]


# ---------------------------------------------------------------------- clean run


def test_clean_fabric_audit_finds_no_problem(
    spark: Any, fabric_run: FabricRun, tmp_path: Path
) -> None:
    report = run_audit(spark, prepare_audit(fabric_run.configs, [fabric_run.root / "fabric"]))
    everything = [m for v in fabric_run.sent.values() for m in v]
    to_c = [m for m in everything if m.reaches_c]
    assert report.problems == 0, report.findings[:5]
    assert report.findings == []
    assert report.exit_code == 0
    assert report.messages == len(everything)
    assert report.audited == NAMES
    held = {n: (c.held, c.ok) for n, c in report.counts.items()}
    assert held == {
        "A": (len(everything), len(everything)),
        "B": (len(everything), len(everything)),
        "C": (len(to_c), len(to_c)),
    }
    links = {(link.sender, link.receiver): link for link in report.links}
    assert set(links) == {("A", "B"), ("B", "A"), ("A", "C"), ("B", "C")}
    assert links[("A", "C")].label == "Destination C, async"
    assert links[("A", "B")].label == "Destination B, sync"
    assert links[("A", "B")].count == len(fabric_run.sent["pubA"])
    assert links[("A", "C")].count == sum(m.reaches_c for m in fabric_run.sent["pubA"])
    for link in report.links:
        assert 0 <= link.p50_ms <= link.p99_ms <= link.max_ms
        assert sum(b.count for b in link.buckets) == link.count
    json_path, html_path = write_report(report, tmp_path / "out")
    assert json.loads(json_path.read_text())["ok"] is True
    assert html_path.read_text().count('<svg class="lag-chart"') == 4


# ---------------------------------------------------------------------- tampering


@dataclass(frozen=True)
class Tampered:
    root: Path
    expected: list[dict[str, Any]]  # the findings the audit must report, exactly
    times: list[set[int]]  # per expected finding, the ts_us it may have
    clients: list[str]  # per expected finding, its publisher's client name


@pytest.fixture(scope="module")
def tampered(fabric_run: FabricRun) -> Tampered:
    """Copies of the three journals with one record deleted on C (an order from A that
    passed C's filter), one duplicated on B (a quote published at B) and two of
    publisher pubA swapped on A (seqs 10 and 11)."""
    root = fabric_run.root / "tampered"
    dirs = {}
    for name, journal in fabric_run.journals.items():
        dirs[name] = root / journal.name
        shutil.copytree(journal, dirs[name])
    on_c = next(r for r in read_all(dirs["C"]) if r.topic == "orders" and r.origin == "A")
    delete_record(dirs["C"], on_c.txid)
    on_b = next(r for r in read_all(dirs["B"]) if r.topic == "quotes" and r.origin == "B")
    copy_txid = duplicate_record(dirs["B"], on_b.txid)
    pub_a = {r.seq: r for r in read_all(dirs["A"]) if r.client_name == "pubA"}
    swap_records(dirs["A"], pub_a[10].txid, pub_a[11].txid)

    def finding(kind: str, instance: str, rec: Any, path: str, hops: list[str], txids: list[int]):  # type: ignore[no-untyped-def]
        return {
            "kind": kind,
            "instance": instance,
            "bookmark": rec.bookmark,
            "origin": rec.origin,
            "topic": rec.topic,
            "expected_path": path,
            "expected_hops": hops,
            "txids": txids,
        }

    expected = [
        finding("missing", "C", on_c, f"C <- A  [C async, filter {FILTER}]", ["A", "C"], []),
        finding("duplicate", "B", on_b, "B (published here)", ["B"], [on_b.txid, copy_txid]),
        # seq 11 now comes before seq 10: the one message out of place is seq 11, stored
        # at seq 10's old txid
        finding("reordered", "A", pub_a[11], "A (published here)", ["A"], [pub_a[10].txid]),
    ]
    times = [
        {on_c.origin_ts},  # missing: when it was published
        {on_b.local_ts},  # duplicate: the first copy's arrival
        {pub_a[10].local_ts, pub_a[11].local_ts},  # reordered: the record out of place
    ]
    clients = [on_c.client_name, on_b.client_name, "pubA"]
    return Tampered(root, expected, times, clients)


@dataclass(frozen=True)
class CliRun:
    returncode: int
    stdout: str
    stderr: str
    report: dict[str, Any]
    html: Path


def run_cli(fabric_run: FabricRun, journals: Path, out: Path, master: str) -> CliRun:
    done = subprocess.run(
        audit_command(fabric_run.configs, journals, out, master),
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert (out / "audit.json").exists(), f"no report; stderr:\n{done.stderr[-4000:]}"
    return CliRun(
        done.returncode,
        done.stdout,
        done.stderr,
        json.loads((out / "audit.json").read_text()),
        out / "audit.html",
    )


@pytest.fixture(scope="module")
def tampered_local(fabric_run: FabricRun, tampered: Tampered) -> CliRun:
    """``amps-py pipeline audit`` on the tampered journals, local Spark."""
    return run_cli(fabric_run, tampered.root, fabric_run.root / "report-local", "local[2]")


def test_tampered_journals_give_exactly_those_findings(
    tampered: Tampered, tampered_local: CliRun
) -> None:
    run = tampered_local
    assert run.returncode == 1, run.stderr[-4000:]
    keys = list(tampered.expected[0])
    got = [{k: f[k] for k in keys} for f in run.report["findings"]]
    assert got == tampered.expected
    for f, times in zip(run.report["findings"], tampered.times, strict=True):
        assert f["ts_us"] in times, (f, times)
    # each finding is a run of its own, named by client name, hash, count and time
    runs = run.report["runs"]
    assert [(r["kind"], r["instance"], r["count"]) for r in runs] == [
        (f["kind"], f["instance"], 1) for f in tampered.expected
    ]
    assert [r["client_name"] for r in runs] == tampered.clients
    assert all(r["client_name"] for r in runs)
    assert [r["first_us"] for r in runs] == [f["ts_us"] for f in run.report["findings"]]
    assert [r["first_bookmark"] for r in runs] == [f["bookmark"] for f in tampered.expected]
    assert run.report["publishers"] == {r["publisher_hash"]: r["client_name"] for r in runs}
    assert run.report["problems"] == {"missing": 1, "duplicate": 1, "reordered": 1, "phantom": 0}
    assert run.report["ok"] is False
    counts = run.report["counts"]
    assert (counts["C"]["missing"], counts["B"]["duplicate"], counts["A"]["reordered"]) == (1, 1, 1)
    assert "Result: 3 problems (1 missing, 1 duplicate, 1 reordered)" in run.stdout
    for f, client in zip(tampered.expected, tampered.clients, strict=True):
        assert f"{f['kind']} on {f['instance']}: {f['bookmark']} of {client}" in run.stdout
        assert f"expected path {f['expected_path']}" in run.stdout


def test_exports_of_the_journals_give_the_same_audit(
    spark: Any, tampered: Tampered, tampered_local: CliRun, fabric_run: FabricRun
) -> None:
    """The journals exported to Parquet (plain Python, on the hosts), audited from the
    export directory: the same findings as from the journals."""
    from amps_py.pipeline.export import export_journal

    out = fabric_run.root / "tampered-export"
    for journal in sorted(tampered.root.iterdir()):
        export_journal(journal, out)
    report = run_audit(spark, prepare_audit(fabric_run.configs, [out]))
    keys = list(tampered.expected[0])
    got = [{k: f.as_dict()[k] for k in keys} for f in report.findings]
    assert got == tampered.expected
    assert (
        report.counts == run_audit(spark, prepare_audit(fabric_run.configs, [tampered.root])).counts
    )


def test_findings_beyond_the_cap_are_counted_not_listed(
    spark: Any, fabric_run: FabricRun, tmp_path: Path
) -> None:
    """Three records A sent C deleted from C, two findings kept per class, instance
    and sender: the counts say 3, the report lists the first two by seq and says one
    was left out."""
    from amps_py.pipeline.audit_report import FindingsLeftOut, render_text

    root = tmp_path / "journals"
    for journal in fabric_run.journals.values():
        shutil.copytree(journal, root / journal.name)
    on_c = root / fabric_run.journals["C"].name
    gone = [r for r in read_all(on_c) if r.origin == "A"][3:6]
    for rec in gone:
        delete_record(on_c, rec.txid)
    report = run_audit(spark, prepare_audit(fabric_run.configs, [root]), keep_findings=2)
    assert report.counts["C"].missing == 3
    assert report.problem_counts() == {"missing": 3, "duplicate": 0, "reordered": 0, "phantom": 0}
    first_two = sorted(gone, key=lambda r: r.seq)[:2]
    assert [f.bookmark for f in report.findings] == [r.bookmark for r in first_two]
    assert report.left_out == (FindingsLeftOut("missing", "C", "A", 3, 2),)
    assert report.as_dict()["findings_left_out"] == [
        {"kind": "missing", "instance": "C", "via": "A", "found": 3, "kept": 2}
    ]
    assert "missing on C via A: 1 of 3 left out (the first 2 kept)" in render_text(report)
    assert report.exit_code == 1


def test_a_damaged_record_stops_the_audit_with_status_3_and_one_line(
    fabric_run: FabricRun, tmp_path: Path
) -> None:
    """A failed Spark job is not "problems found" (1): status 3, no report, and one
    line naming the journal, the record and the fix."""
    root = tmp_path / "damaged"
    for journal in fabric_run.journals.values():
        shutil.copytree(journal, root / journal.name)
    data_file = root / fabric_run.journals["A"].name / "data.mdb"
    data = bytearray(data_file.read_bytes())
    body = next(b for seq in range(5, 60) if data.count(b := b'"p":"pubA","s":%d,' % seq) == 1)
    data[data.find(body) + 2] ^= 0x20  # "p" -> "P": the record's CRC no longer holds
    data_file.write_bytes(bytes(data))
    done = subprocess.run(
        audit_command(fabric_run.configs, root, tmp_path / "out", "local[2]"),
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert done.returncode == 3, done.stderr[-4000:]
    ours = [line for line in done.stderr.splitlines() if line.startswith("amps-py:")]
    assert len(ours) == 1, done.stderr[-4000:]
    assert re.fullmatch(
        rf"amps-py: the audit could not complete: journal {re.escape(str(data_file.parent))}: "
        r"record txid \d+ is corrupt: CRC mismatch.*amps-py txlog verify.*",
        ours[0],
    ), ours[0]
    assert "Traceback" not in done.stderr
    assert not (tmp_path / "out" / "audit.json").exists()


# ---------------------------------------------------------------------- the HTML page


def test_html_report_renders_offline_in_headless_chromium(
    tampered_local: CliRun, tmp_path: Path
) -> None:
    chromium = find_chromium()
    if chromium is None:
        pytest.skip("no chromium on PATH (Debian: apt-get install chromium; .ci/run does)")
    page = tampered_local.html
    text = page.read_text()
    for reference in ('src="http', "src='http", 'href="http', "url(http", "<script", "<link"):
        assert reference not in text, f"the page loads {reference!r}"
    base = [chromium, *OFFLINE_FLAGS, f"--user-data-dir={tmp_path / 'profile'}"]
    dom = subprocess.run(
        [*base, "--dump-dom", page.as_uri()],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert dom.returncode == 0, dom.stderr[-2000:]
    assert dom.stdout.count('<svg class="lag-chart"') == 4, dom.stdout[:2000]
    assert dom.stdout.count("<circle") >= 4
    assert "3 problems" in dom.stdout
    shot = tmp_path / "page.png"
    done = subprocess.run(
        [*base, "--window-size=1000,1600", f"--screenshot={shot}", page.as_uri()],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0 and shot.exists(), done.stderr[-2000:]
    width, height, rows = png_pixels(shot.read_bytes())
    assert (width, height) == (1000, 1600)
    bpp = len(rows[0]) // width
    colours = set()
    ink = 0
    for row in rows[::4]:
        for x in range(0, len(row), bpp * 4):
            pixel = row[x : x + 3]
            colours.add(pixel)
            ink += pixel != b"\xff\xff\xff"
    sampled = (height // 4) * (width // 4)
    assert len(colours) > 20, f"only {len(colours)} colours: the page looks blank"
    assert ink > sampled // 50, f"{ink} of {sampled} sampled pixels are not white"
    # the plots' colours are there: the p50 line's blue and the max line's red
    assert b"\x1f\x77\xb4" in colours and b"\xd6\x27\x28" in colours


# ---------------------------------------------------------------------- standalone Spark


@contextmanager
def standalone_spark(work: Path) -> Iterator[str]:
    """A Spark master and one worker on 127.0.0.1 (pyspark's own ``spark-class``,
    SPARK_HOME = the pyspark package); yields the master URL; stops both."""
    import pyspark

    home = Path(pyspark.__file__).parent
    spark_class = home / "bin" / "spark-class"
    work.mkdir(parents=True, exist_ok=True)
    env = {
        **os.environ,
        "SPARK_HOME": str(home),
        "SPARK_LOCAL_IP": "127.0.0.1",
        "SPARK_NO_DAEMONIZE": "1",
    }
    procs: list[subprocess.Popen[bytes]] = []

    def start(name: str, args: list[str]) -> Path:
        log = work / f"{name}.log"
        with open(log, "wb") as out:
            procs.append(
                subprocess.Popen(
                    ["bash", str(spark_class), *args],
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    env=env,
                    cwd=work,
                )
            )
        return log

    def waiting_for(log: Path, text: str, proc: subprocess.Popen[bytes]) -> str | None:
        if proc.poll() is not None:
            raise AssertionError(f"{log.stem} exited with {proc.returncode}:\n{log.read_text()}")
        seen = log.read_text(errors="replace") if log.exists() else ""
        return None if text in seen else f"{log.stem} has not logged {text!r}"

    try:
        master_log = start(
            "master",
            [
                "org.apache.spark.deploy.master.Master",
                "--host",
                "127.0.0.1",
                "--port",
                "0",  # the OS picks both ports; the master logs its URL
                "--webui-port",
                "0",
            ],
        )
        wait_until_sync(lambda: waiting_for(master_log, "elected leader", procs[0]), 120, 0.2)
        started = re.search(r"Starting Spark master at (spark://\S+)", master_log.read_text())
        assert started is not None, f"the master logged no URL:\n{master_log.read_text()}"
        url = started.group(1)
        worker_log = start(
            "worker",
            [
                "org.apache.spark.deploy.worker.Worker",
                url,
                "--host",
                "127.0.0.1",
                "--cores",
                "2",
                "--memory",
                "2g",
                "--webui-port",
                "0",
                "--work-dir",
                str(work / "work"),
            ],
        )
        wait_until_sync(
            lambda: waiting_for(worker_log, "Successfully registered with master", procs[1]),
            120,
            0.2,
        )
        yield url
    finally:
        for proc in reversed(procs):
            if proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()


def test_audit_on_a_standalone_spark_cluster_gives_the_local_report(
    fabric_run: FabricRun, tampered: Tampered, tampered_local: CliRun
) -> None:
    with standalone_spark(fabric_run.root / "spark-standalone") as url:
        run = run_cli(fabric_run, tampered.root, fabric_run.root / "report-cluster", url)
    assert run.returncode == 1, run.stderr[-4000:]
    assert run.report["run"]["spark_master"] == url
    local = dict(tampered_local.report)
    remote = dict(run.report)
    local.pop("run")
    remote.pop("run")
    assert remote == local


def test_the_audit_script_runs_with_spark_submit(
    fabric_run: FabricRun, tampered: Tampered, tampered_local: CliRun
) -> None:
    """``tools/pipeline/audit.py`` under spark-submit (its --master): the CLI's report."""
    submit = Path(sys.executable).parent / "spark-submit"
    if not submit.exists():
        pytest.skip(f"no spark-submit beside {sys.executable}")
    script = Path(__file__).resolve().parents[1] / "tools" / "pipeline" / "audit.py"
    out = fabric_run.root / "report-submit"
    args = audit_command(fabric_run.configs, tampered.root, out, "local[2]")
    done = subprocess.run(
        [str(submit), "--master", "local[1]", str(script), *args[5:-2]],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "PYSPARK_PYTHON": sys.executable},
        check=False,
    )
    assert done.returncode == 1, done.stderr[-4000:]
    submitted = json.loads((out / "audit.json").read_text())
    assert submitted["run"]["spark_master"].startswith("local[1]")
    local = dict(tampered_local.report)
    submitted.pop("run")
    local.pop("run")
    assert submitted == local
