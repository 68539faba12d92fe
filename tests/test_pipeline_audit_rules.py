"""The fabric audit's rules without Spark: expectations from the fabric's own routing
(content filters judged on the payload), the classes of a message, publisher order,
and the report's text, JSON and HTML."""

from __future__ import annotations

import json
import pickle
import random
import subprocess
import sys
from pathlib import Path

import pytest
from audit_fabric import FILTER, add_fabric
from cluster import Cluster

from amps_py.pipeline.audit_report import (
    AuditReport,
    JournalInfo,
    LagBucket,
    LinkLag,
    render_html,
    render_text,
    report_from_dict,
)
from amps_py.pipeline.audit_rules import (
    Copy,
    Counts,
    Expectation,
    FilterPlan,
    Finding,
    PubRecord,
    classify_message,
    count_statuses,
    expectation_for,
    longest_increasing,
    out_of_order,
    reordered,
)
from amps_py.replication.fabric import Fabric, load_fabric, simulate
from txlog import Journal, Record

BIG = b'{"qty": 80}'
SMALL = b'{"qty": 3}'


@pytest.fixture
def fabric(tmp_path: Path) -> Fabric:
    cluster = Cluster(tmp_path)
    add_fabric(cluster)
    return load_fabric(cluster.write_configs(("A", "B", "C")))


def test_simulate_applies_content_filters_to_a_payload(fabric: Fabric) -> None:
    assert simulate(fabric, "A", "orders").reached == {"A", "B", "C"}  # filters assumed to match
    assert simulate(fabric, "A", "orders", payload=BIG).reached == {"A", "B", "C"}
    assert simulate(fabric, "A", "orders", payload=SMALL).reached == {"A", "B"}
    assert simulate(fabric, "B", "internal", payload=BIG).reached == {"A", "B"}
    assert simulate(fabric, "A", "orders", payload=SMALL, failover=False).if_down == {}


def test_filter_plan_judges_with_routes_rebuilt_after_pickling(fabric: Fabric) -> None:
    plan = FilterPlan.from_fabric(fabric, [("orders", "json"), ("quotes", "json")])
    assert plan.relevant == {("orders", "json"): ("A:C", "B:C")}
    shipped = pickle.loads(pickle.dumps(plan))  # what an executor gets
    assert shipped.verdict("orders", "json", BIG) == "A:C=pass,B:C=pass"
    assert shipped.verdict("orders", "json", SMALL) == "A:C=drop,B:C=drop"
    assert shipped.verdict("orders", "json", b"not json") == "A:C=drop,B:C=drop"
    assert shipped.verdict("quotes", "json", SMALL) == ""


def test_expectation_names_the_path_and_its_filter(fabric: Fabric) -> None:
    big = expectation_for(fabric, "A", "orders", "json", BIG)
    assert set(big.arrivals) == {"A", "B", "C"}
    assert big.arrivals["C"].hops == ("A", "C")
    assert big.arrivals["C"].describe == f"C <- A  [C async, filter {FILTER}]"
    assert big.arrivals["B"].describe == "B <- A  [B sync]"
    assert big.arrivals["A"].describe == "A (published here)"
    assert set(expectation_for(fabric, "A", "orders", "json", SMALL).arrivals) == {"A", "B"}
    stranger = expectation_for(fabric, "Z", "orders", "json", None)
    assert stranger.reason is not None and "'Z' is not an instance" in stranger.reason


def _copy(instance: str, txid: int, **kw: object) -> Copy:
    fields: dict[str, object] = {
        "origin": "A",
        "origin_txid": 7,
        "topic": "orders",
        "message_type": "json",
        "kind": "publish",
        "fingerprint": 99,
        "path": () if instance == "A" else ("A",),
        "verdict": "A:C=pass,B:C=pass",
    }
    fields.update(kw)
    return Copy(instance, txid, **fields)  # type: ignore[arg-type]


def _expectations(fabric: Fabric) -> dict[tuple[str, str, str, str], Expectation]:
    return {
        ("A", "orders", "json", "A:C=pass,B:C=pass"): expectation_for(
            fabric, "A", "orders", "json", BIG
        ),
        ("A", "orders", "json", "A:C=drop,B:C=drop"): expectation_for(
            fabric, "A", "orders", "json", SMALL
        ),
    }


def test_classify_message_ok_missing_duplicate_phantom(fabric: Fabric) -> None:
    exp = _expectations(fabric)
    audited = ("A", "B", "C")
    ok = classify_message("1|5|", [_copy("A", 7), _copy("B", 3), _copy("C", 2)], exp, audited)
    assert sorted(ok.statuses) == [("A", "ok"), ("B", "ok"), ("C", "ok")]
    assert ok.findings == ()

    missing = classify_message("1|5|", [_copy("A", 7), _copy("B", 3)], exp, audited)
    (f,) = missing.findings
    assert (f.kind, f.instance, f.bookmark, f.expected_hops) == ("missing", "C", "1|5|", ("A", "C"))
    assert f.expected_path == f"C <- A  [C async, filter {FILTER}]"

    dup = classify_message(
        "1|5|", [_copy("A", 7), _copy("B", 3), _copy("B", 9), _copy("C", 2)], exp, audited
    )
    (f,) = dup.findings
    assert (f.kind, f.instance, f.txids) == ("duplicate", "B", (3, 9))

    # a payload the filter drops must not reach C
    small = [_copy(n, t, verdict="A:C=drop,B:C=drop") for n, t in (("A", 7), ("B", 3), ("C", 2))]
    phantom = classify_message("1|5|", small, exp, audited)
    (f,) = phantom.findings
    assert (f.kind, f.instance, f.expected_path) == ("phantom", "C", None)
    assert "routing sends it to A, B only" in f.detail
    assert ("A", "ok") in phantom.statuses

    # a copy that is not what the origin stored under this bookmark
    forged = classify_message(
        "1|5|", [_copy("A", 7), _copy("B", 3, fingerprint=5), _copy("C", 2)], exp, audited
    )
    kinds = sorted((f.kind, f.instance) for f in forged.findings)
    assert kinds == [("missing", "B"), ("phantom", "B")]
    assert "payload differs from the reference copy on A" in forged.findings[0].detail + (
        forged.findings[1].detail
    )


def test_findings_carry_the_time_of_the_record_concerned(fabric: Fabric) -> None:
    """ts_us: a missing message's publication time (its reference copy's origin
    timestamp); a duplicate's first copy's arrival; a phantom record's own; a
    reordered record's own."""
    exp = _expectations(fabric)
    audited = ("A", "B", "C")

    def at(instance: str, txid: int, local_us: int, **kw: object) -> Copy:
        return _copy(instance, txid, local_us=local_us, origin_us=1_000, **kw)

    (missing,) = classify_message(
        "1|5|", [at("A", 7, 1_000), at("B", 3, 1_400)], exp, audited
    ).findings
    assert (missing.kind, missing.ts_us) == ("missing", 1_000)
    copies = [at("A", 7, 1_000), at("B", 9, 2_000), at("B", 3, 1_500), at("C", 2, 1_900)]
    (dup,) = classify_message("1|5|", copies, exp, audited).findings
    assert (dup.kind, dup.txids, dup.ts_us) == ("duplicate", (3, 9), 1_500)
    small = [
        at(n, t, us, verdict="A:C=drop,B:C=drop")
        for n, t, us in (("A", 7, 1_000), ("B", 3, 1_300), ("C", 2, 1_700))
    ]
    (phantom,) = classify_message("1|5|", small, exp, audited).findings
    assert (phantom.kind, phantom.ts_us) == ("phantom", 1_700)
    records = [
        PubRecord(txid, seq, f"1|{seq}|", "A", "orders", "json", "A:C=pass,B:C=pass", 10 * txid)
        for txid, seq in ((1, 1), (2, 3), (3, 2), (4, 4))
    ]
    (late,) = reordered("B", records, exp)
    assert (late.bookmark, late.ts_us) == ("1|3|", 20)
    assert Finding.from_dict(late.as_dict()) == late


def test_the_reference_copy_is_the_origins_even_when_it_is_not_first(fabric: Fabric) -> None:
    exp = _expectations(fabric)
    out = classify_message(
        "1|5|", [_copy("B", 1, topic="quotes"), _copy("A", 7), _copy("C", 2)], exp, ("A", "B", "C")
    )
    (f,) = [f for f in out.findings if f.kind == "phantom"]
    assert f.instance == "B" and "topic 'quotes'" in f.detail


def test_unknown_origin_is_phantom_everywhere(fabric: Fabric) -> None:
    exp = {("Z", "orders", "json", ""): expectation_for(fabric, "Z", "orders", "json", None)}
    out = classify_message("1|5|", [_copy("A", 1, origin="Z", verdict="")], exp, ("A", "B", "C"))
    assert [(f.kind, f.instance) for f in out.findings] == [("phantom", "A")]
    assert count_statuses(out.statuses)["A"].phantom == 1


def test_longest_increasing_and_fewest_moves() -> None:
    assert longest_increasing([]) == set()
    assert longest_increasing([1, 2, 4, 3, 5]) == {0, 1, 3, 4}
    assert len(longest_increasing([5, 1, 2, 3, 4])) == 4


def test_reordered_counts_the_fewest_moves_on_first_copies(fabric: Fabric) -> None:
    exp = _expectations(fabric)
    v = "A:C=pass,B:C=pass"

    def rec(txid: int, seq: int) -> PubRecord:
        return PubRecord(txid, seq, f"1|{seq}|", "A", "orders", "json", v)

    # txids 3 and 4 swapped: seq 4 is stored before seq 3
    records = [rec(1, 1), rec(2, 2), rec(3, 4), rec(4, 3), rec(5, 5), rec(9, 2)]
    (f,) = reordered("B", records, exp)
    assert (f.kind, f.instance, f.bookmark, f.txids) == ("reordered", "B", "1|4|", (3,))
    assert f.expected_path == "B <- A  [B sync]"
    assert "between seq 2 and seq 3" in f.detail
    # one message moved far counts once
    late = [rec(i, s) for i, s in enumerate([2, 3, 4, 5, 6, 1], 1)]
    assert [f.bookmark for f in reordered("B", late, exp)] == ["1|1|"]


def _blocks(seqs: list[int]) -> list[tuple[int, int]]:
    """[start, end) of each block, cut as the audit's window functions cut: before
    position i when every seq before it is below every seq from it on."""
    starts = [i for i in range(len(seqs)) if i == 0 or max(seqs[:i]) < min(seqs[i:])]
    return list(zip(starts, [*starts[1:], len(seqs)], strict=True))


def test_checking_block_by_block_gives_the_findings_of_the_whole_sequence(
    fabric: Fabric,
) -> None:
    """The audit on Spark checks a publisher's order a block at a time, never the
    whole publisher at once: the findings, details included, must be exactly those
    of :func:`reordered` over every record."""
    exp = _expectations(fabric)
    seed = 27
    print(f"seed {seed}")
    rng = random.Random(seed)
    for trial in range(300):
        n = rng.randint(1, 40)
        seqs = list(range(1, n + 1))
        for _ in range(rng.randint(0, 4)):  # a few messages moved, near or far
            i, j = rng.randrange(n), rng.randrange(n)
            seqs.insert(j, seqs.pop(i))
        if trial % 10 == 0:
            rng.shuffle(seqs)
        records = [
            PubRecord(t, s, f"1|{s}|", "A", "orders", "json", "A:C=pass,B:C=pass", ts_us=t * 10)
            for t, s in enumerate(seqs, 1)
        ]
        whole = reordered("B", records, exp)
        by_block = []
        for start, end in _blocks(seqs):
            before = seqs[start - 1] if start else None
            after = seqs[end] if end < n else None
            by_block.extend(out_of_order("B", records[start:end], exp, before, after))
        assert by_block == whole, (trial, seqs)
        assert all(f.ts_us == f.txids[0] * 10 for f in whole)


def _report(**kw: object) -> AuditReport:
    buckets = tuple(
        LagBucket(1_700_000_000_000_000 + i * 50_000, 3, 1.0 + i, 2.0 + i, 3.0 + i)
        for i in range(4)
    )
    fields: dict[str, object] = {
        "instances": ("A", "B", "C"),
        "journals": (JournalInfo("A", "/j/A", 10, 1, 10), JournalInfo("B", "/j/B", 10, 1, 10)),
        "messages": 10,
        "counts": {"A": Counts(held=10, ok=10), "B": Counts(held=10, ok=10)},
        "findings": [],
        "links": [LinkLag("A", "B", "Destination B, sync", 12, 1.5, 4.9, 6.0, buckets)],
        "bucket_us": 50_000,
        "configs": ("a.xml",),
    }
    fields.update(kw)
    return AuditReport(**fields)  # type: ignore[arg-type]


def test_report_text_json_and_html() -> None:
    report = _report()
    assert report.exit_code == 0 and report.unaudited == ("C",)
    text = render_text(report)
    assert "Result: no problems" in text and "not audited (no journal given): C" in text
    assert "A -> B (Destination B, sync)" in text
    doc = json.loads(report.to_json())
    assert doc["ok"] is True and doc["lag"]["links"][0]["buckets"][0]["p99_ms"] == 2.0
    assert report_from_dict(doc).as_dict() == doc
    page = render_html(report)
    assert page.count('<svg class="lag-chart"') == 1
    assert "<script" not in page and "http://" not in page.replace(
        'xmlns="http://www.w3.org/2000/svg"', ""
    )


def test_problems_make_the_exit_status_one() -> None:
    f = Finding(
        "missing",
        "B",
        "1|5|",
        "A",
        "orders",
        "json",
        "B <- A  [B sync]",
        ("A", "B"),
        (),
        "not in the journal",
    )
    report = _report(
        findings=[f], counts={"A": Counts(held=10, ok=10), "B": Counts(held=9, ok=9, missing=1)}
    )
    assert report.exit_code == 1
    assert "Result: 1 problem (1 missing)" in render_text(report)
    text = render_text(report)
    assert "  missing on B: 1|5|\n" in text  # no client name known: the hash alone
    assert "    not in the journal\n    expected path B <- A  [B sync]" in text


# ---------------------------------------------------------------------- refusals


def _audit_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "amps_py", "pipeline", "audit", *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def _journal(path: Path, instance: str) -> Path:
    with Journal(path, instance_name=instance) as journal:
        journal.append([Record(topic="orders", payload=b"{}", pub_hash=1, seq=1)], 1)
    return path


def test_bad_inputs_are_refused_before_spark_starts(tmp_path: Path) -> None:
    cluster = Cluster(tmp_path / "fabric")
    add_fabric(cluster)
    configs = [str(path) for path in cluster.write_configs(("A", "B", "C"))]
    stranger = _journal(tmp_path / "journals" / "z-journal", "Z")
    twin = _journal(tmp_path / "twins" / "a1", "A").parent
    _journal(twin / "a2", "A")
    empty = tmp_path / "empty"
    empty.mkdir()
    cases = [
        (["--config", *configs, "--journals", str(tmp_path / "nope")], "no such directory"),
        (["--config", *configs, "--journals", str(empty)], "holds no journal (no data.mdb"),
        (
            ["--config", *configs, "--journals", str(stranger)],
            "journals of instances the configs do not name: Z",
        ),
        (["--config", *configs, "--journals", str(twin)], "both belong to instance 'A'"),
        (["--config", str(empty), "--journals", str(stranger)], "holds no *.xml config"),
        (["--config", *configs, "--journals", str(stranger), "--conf", "x"], "is not KEY=VALUE"),
        (["--config", *configs, "--journals", str(stranger), "--bucket", "0"], "must be positive"),
    ]
    for args, message in cases:
        done = _audit_cli(*args)
        assert done.returncode == 2, (args, done.stdout, done.stderr)
        assert message in done.stderr, (args, done.stderr)
        assert "Traceback" not in done.stderr
