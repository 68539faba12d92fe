"""The audit's publisher-order check on Spark (``audit._order``) finds exactly what the
plain rule (:func:`~amps_py.pipeline.audit_rules.reordered`, every record of a
publisher at once) finds, whatever the width of the txid slices it works in: slices
of a few txids put cuts, blocks, and the seqs just before and after a block across
slice boundaries (and across empty slices), where a bug would show.

The ``spark`` fixture is the session-scoped one in conftest.py.
"""

from __future__ import annotations

import json
import random
from typing import Any

import pytest

pytest.importorskip("pyspark", reason="the audit tests need the spark extra (pyspark)")
pytest.importorskip("pyarrow", reason="the audit tests need the spark extra (pyarrow)")

from amps_py.pipeline.audit import _FirstFindings, _order
from amps_py.pipeline.audit_rules import PubRecord, reordered

SEED = 20261128
COLUMNS = (
    "instance STRING, publisher_hash STRING, bookmark STRING, txid LONG, seq LONG, "
    "origin STRING, topic STRING, message_type STRING, verdict STRING, local_us LONG"
)


def publisher_records(
    rng: random.Random, instance: str, pub: str, start: int
) -> list[tuple[Any, ...]]:
    """One publisher's records on ``instance``: seqs mostly in order, with swapped
    neighbours, a message stored far from its place, and copies stored twice (only
    the first copy counts); txids spaced unevenly so some slices are empty."""
    seqs = list(range(1, 121))
    for _ in range(6):
        i = rng.randrange(len(seqs) - 1)
        seqs[i], seqs[i + 1] = seqs[i + 1], seqs[i]
    far = seqs.pop(rng.randrange(10, 30))
    seqs.insert(rng.randrange(60, 110), far)
    early = seqs.pop(rng.randrange(80, 110))
    seqs.insert(rng.randrange(5, 40), early)
    rows = []
    txid = start
    for seq in seqs:
        txid += rng.choice((1, 1, 2, 5, 17))
        rows.append((instance, pub, f"{pub}|{seq}|", txid, seq, instance, "t", "json", "", txid))
        if rng.random() < 0.05:  # the same message again, later: not a first copy
            rows.append(
                (instance, pub, f"{pub}|{seq}|", txid + 1, seq, instance, "t", "json", "", 0)
            )
            txid += 1
    return rows


def findings_by_rule(rows: list[tuple[Any, ...]]) -> list[dict[str, Any]]:
    out = []
    for instance, pub in sorted({(r[0], r[1]) for r in rows}):
        records = [
            PubRecord(r[3], r[4], r[2], r[5], r[6], r[7], r[8], r[9])
            for r in rows
            if (r[0], r[1]) == (instance, pub)
        ]
        out.extend(f.as_dict() for f in reordered(instance, records, {}))
    return sorted(out, key=lambda d: json.dumps(d, sort_keys=True))


@pytest.mark.parametrize("slice_txids", [1, 3, 7, 64, 1 << 16])
def test_order_check_over_slices_finds_what_the_whole_publisher_rule_finds(
    spark: Any, slice_txids: int
) -> None:
    print(f"seed {SEED}, slices of {slice_txids} txids")
    rng = random.Random(SEED)
    rows: list[tuple[Any, ...]] = []
    for instance in ("A", "B"):
        start = 0
        for pub in ("101", "202", "303"):
            rows.extend(publisher_records(rng, instance, pub, start))
            start += 50  # publishers' txids overlap: slices hold several publishers
    expected = findings_by_rule(rows)
    assert len(expected) >= 12, "the generated records must hold reordered messages"

    frame = spark.createDataFrame(rows, COLUMNS)
    ordered, cached = _order(frame, spark.sparkContext.broadcast({}), 1000, slice_txids)
    try:
        out = ordered.collect()
    finally:
        for df in cached:
            df.unpersist()
    found = sorted(
        (json.loads(r[8]) for r in out if r[0] == "finding"),
        key=lambda d: json.dumps(d, sort_keys=True),
    )
    assert found == expected
    counted = sum(json.loads(r[8]) for r in out if r[0] == "found")
    assert counted == len(expected)


def test_a_task_sends_its_first_findings_per_group_and_counts_them_all() -> None:
    """However many findings one task makes (an outage: every message missing), it
    sends the first ``keep`` per (kind, instance, via) in the report's order, and a
    count of all; the first ``keep`` overall are always among them."""
    rng = random.Random(SEED)
    print(f"seed {SEED}")
    rows = [
        ("finding", kind, "C", "B", f"pub{rng.randrange(3)}", rng.randrange(10_000), "d", t, "{}")
        for t, kind in enumerate(rng.choice(("missing", "phantom")) for _ in range(5_000))
    ]
    kept = _FirstFindings(7)
    for row in rows:
        kept.add(row)
    out = list(kept.rows())
    sent = [r for r in out if r[0] == "finding"]
    for kind in ("missing", "phantom"):
        mine = sorted((r for r in rows if r[1] == kind), key=lambda r: (r[4], r[5], r[6], r[7]))
        assert [r for r in sent if r[1] == kind] == mine[:7]
    counts = {r[1]: json.loads(r[8]) for r in out if r[0] == "found"}
    assert counts == {k: sum(r[1] == k for r in rows) for k in ("missing", "phantom")}
