"""A fabric audit report built in Python (no Spark, no journals), for the report's
tests and for the reference screenshot docs/audit-report.png.

The picture it paints: A and B a sync pair, C an async downstream. C was unreachable
for a while: 300 orders of publisher pubA never reached it (one run), the records that
did arrive after the outage came up to 44 s late, while normal lag is a few ms on the
sync links and about 20 ms to C. Besides, two more messages of pubB are missing on C,
one message is stored twice on B, one is out of order on A and one record on C is a
phantom.

Run it to write the page (and, with a second path, its screenshot in headless
Chromium at 1280 px)::

    python tests/audit_report_sample.py /tmp/audit.html docs/audit-report.png
"""

from __future__ import annotations

import random
import sys
from pathlib import Path

from headless import chromium_run, find_chromium

from amps_py.pipeline.audit_report import AuditReport, JournalInfo, LagBucket, LinkLag
from amps_py.pipeline.audit_rules import Counts, Finding

#: the seed of the lag noise (printed by the tests that use it)
SEED = 27
#: 2025-11-27 14:00:00 UTC, in µs
T0 = 1_764_252_000_000_000
BUCKET_US = 1_000_000
PUB_A = "164104423729713324"
PUB_B = "9923372036854775001"
C_PATH = "C <- A  [C async, filter /qty > 50]"
#: where the outage is: buckets 20..29 (messages lost), the backlog lands in 30..33
OUTAGE = range(20, 30)
BACKLOG = range(30, 34)
#: the lag spike of the backlog's first bucket (ms)
SPIKE_MS = 44_000.0


def _buckets(rng: random.Random, base_ms: float, spike: bool, gap: range) -> tuple[LagBucket, ...]:
    out = []
    for i in range(60):
        if i in gap:
            continue  # nothing arrived: the plot keeps the gap
        p50 = base_ms * rng.uniform(0.8, 1.2)
        p99 = p50 * rng.uniform(1.8, 2.6)
        peak = p99 * rng.uniform(1.1, 1.6)
        if spike and i in BACKLOG:
            late = SPIKE_MS / (1 + 3 * (i - BACKLOG.start))
            p50, p99, peak = late * 0.5, late * 0.95, late
        out.append(
            LagBucket(
                T0 + i * BUCKET_US,
                rng.randint(40, 60),
                round(p50, 3),
                round(p99, 3),
                round(peak, 3),
            )
        )
    return tuple(out)


def _link(sender: str, receiver: str, label: str, buckets: tuple[LagBucket, ...]) -> LinkLag:
    lags = sorted(b.p50_ms for b in buckets)
    return LinkLag(
        sender,
        receiver,
        label,
        sum(b.count for b in buckets),
        lags[len(lags) // 2],
        max(b.p99_ms for b in buckets if b.max_ms < SPIKE_MS) if buckets else 0.0,
        max(b.max_ms for b in buckets),
        buckets,
    )


def _missing(
    pub: str, seq: int, ts_us: int, origin: str, path: str, hops: tuple[str, ...]
) -> Finding:
    return Finding(
        "missing",
        "C",
        f"{pub}|{seq}|",
        origin,
        "orders",
        "json",
        path,
        hops,
        (),
        "not in the journal",
        ts_us,
    )


def sample_findings() -> list[Finding]:
    """302 missing on C (300 of pubA in one run, 2 of pubB), one duplicate on B, one
    reordered on A, one phantom on C."""
    outage_start = T0 + OUTAGE.start * BUCKET_US
    findings = [
        _missing(PUB_A, 1001 + i, outage_start + i * 33_000, "A", C_PATH, ("A", "C"))
        for i in range(300)
    ]
    b_path = "C <- B  [C async, filter /qty > 50]"
    findings += [
        _missing(PUB_B, 501 + i, outage_start + 5_000_000 + i * 40_000, "B", b_path, ("B", "C"))
        for i in range(2)
    ]
    findings.append(
        Finding(
            "duplicate",
            "B",
            f"{PUB_B}|77|",
            "B",
            "quotes",
            "json",
            "B (published here)",
            ("B",),
            (812, 2204),
            "stored 2 times",
            T0 + 7_250_000,
        )
    )
    findings.append(
        Finding(
            "reordered",
            "A",
            f"{PUB_A}|11|",
            "A",
            "orders",
            "json",
            "A (published here)",
            ("A",),
            (40,),
            "seq 11 is out of the publisher's seq order: stored between seq 9 and seq 10 "
            "(published here)",
            T0 + 1_500_000,
        )
    )
    findings.append(
        Finding(
            "phantom",
            "C",
            f"{PUB_B}|9000|",
            "B",
            "internal",
            "json",
            None,
            (),
            (1777,),
            "held here (stored via B <- C) but the routing sends it to A, B only",
            T0 + 41_000_000,
        )
    )
    findings.sort(key=Finding.sort_key)
    return findings


def sample_report(seed: int = SEED) -> AuditReport:
    rng = random.Random(seed)
    links = [
        _link("A", "B", "Destination B, sync", _buckets(rng, 1.5, False, range(0))),
        _link("A", "C", "Destination C, async", _buckets(rng, 20.0, True, OUTAGE)),
        _link("B", "A", "Destination A, sync", _buckets(rng, 1.5, False, range(0))),
        _link("B", "C", "Destination C, async", _buckets(rng, 20.0, True, OUTAGE)),
    ]
    held = 6000
    return AuditReport(
        instances=("A", "B", "C"),
        journals=(
            JournalInfo("A", "/var/amps/A/journal", held, 1, held),
            JournalInfo("B", "/var/amps/B/journal", held + 1, 1, held + 1),
            JournalInfo("C", "/var/amps/C/journal", 2699, 1, 2699),
        ),
        messages=held,
        counts={
            "A": Counts(held=held, ok=held, reordered=1),
            "B": Counts(held=held + 1, ok=held - 1, duplicate=1),
            "C": Counts(held=2699, ok=2698, missing=302, phantom=1),
        },
        findings=sample_findings(),
        links=links,
        bucket_us=BUCKET_US,
        configs=("/etc/amps/A.xml", "/etc/amps/B.xml", "/etc/amps/C.xml"),
        publishers={PUB_A: "pubA", PUB_B: "pubB"},
        run={"generated_at": "2026-11-27T14:05:00+00:00", "spark_master": "local[2]"},
    )


def main(argv: list[str]) -> int:
    import tempfile

    from amps_py.pipeline.audit_report import render_html

    if len(argv) not in (1, 2):
        print(__doc__, file=sys.stderr)
        return 2
    page = Path(argv[0]).resolve()
    page.write_text(render_html(sample_report()), encoding="utf-8")
    print(f"wrote {page} (seed {SEED})")
    if len(argv) == 2:
        chromium = find_chromium()
        if chromium is None:
            print("no chromium on PATH: apt-get install chromium", file=sys.stderr)
            return 1
        shot = Path(argv[1]).resolve()
        with tempfile.TemporaryDirectory() as profile:
            done = chromium_run(
                chromium, Path(profile), page, "--window-size=1280,1600", f"--screenshot={shot}"
            )
        if done.returncode != 0 or not shot.exists():
            print(done.stderr[-2000:], file=sys.stderr)
            return 1
        print(f"wrote {shot}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
