"""The fabric audit's report without Spark: findings grouped into runs (a 300-message
outage is one run with its client name, count and first and last time), lag drawn on
a log axis (a 44 s spike does not flatten 20 ms to the floor), the failing cell
marked rather than the row, the text at 80 columns, and the page as headless Chromium
lays it out at 1280 px (findings above the plots, the marked cell red in the
screenshot)."""

from __future__ import annotations

import html
import json
import re
from pathlib import Path
from typing import Any

import pytest
from audit_report_sample import PUB_A, PUB_B, SEED, T0, sample_report
from headless import chromium_run, find_chromium, png_pixels, png_size

from amps_py.pipeline.audit_report import (
    FAIL_RGB,
    WIDTH,
    LagBucket,
    LinkLag,
    _chart,
    group_runs,
    lag_decades,
    render_html,
    render_text,
    report_from_dict,
)
from amps_py.pipeline.audit_rules import Finding


def _finding(kind: str, seq: int, ts_us: int, **kw: Any) -> Finding:
    fields: dict[str, Any] = {
        "kind": kind,
        "instance": "C",
        "bookmark": f"{PUB_A}|{seq}|",
        "origin": "A",
        "topic": "orders",
        "message_type": "json",
        "expected_path": "C <- A  [C async]",
        "expected_hops": ("A", "C"),
        "txids": (),
        "detail": "not in the journal",
        "ts_us": ts_us,
    }
    fields.update(kw)
    return Finding(**fields)


# ---------------------------------------------------------------------- runs


def test_a_300_message_outage_is_one_run_with_client_name_count_and_times() -> None:
    outage = [_finding("missing", 1000 + i, T0 + i * 10_000) for i in range(300)]
    later = [_finding("missing", 1400 + i, T0 + 60_000_000 + i) for i in range(2)]  # a gap
    other_link = _finding("missing", 1300, T0 + 5, expected_hops=("B", "C"))
    other_pub = _finding("missing", 1300, T0 + 6, bookmark=f"{PUB_B}|1300|")
    dup = _finding("duplicate", 1001, T0 + 7, txids=(4, 9), detail="stored 2 times")
    # a phantom can be two records of one bookmark: still one run
    phantoms = [
        _finding("phantom", 5, T0 + 8, expected_path=None, expected_hops=(), detail="x"),
        _finding("phantom", 5, T0 + 9, expected_path=None, expected_hops=(), detail="y"),
        _finding("phantom", 6, T0 + 10, expected_path=None, expected_hops=(), detail="x"),
    ]
    findings = [*reversed(outage), *later, other_link, other_pub, dup, *phantoms]
    runs = group_runs(findings, {PUB_A: "pubA"})
    got = [(r.kind, r.link, r.client_name, r.first_seq, r.last_seq, r.count) for r in runs]
    assert got == [
        ("missing", "A -> C", "pubA", 1000, 1299, 300),
        ("missing", "B -> C", "pubA", 1300, 1300, 1),
        ("missing", "A -> C", "pubA", 1400, 1401, 2),
        ("missing", "A -> C", "", 1300, 1300, 1),
        ("duplicate", "A -> C", "pubA", 1001, 1001, 1),
        ("phantom", "C", "pubA", 5, 6, 3),
    ]
    outage_run = runs[0]
    assert (outage_run.first_us, outage_run.last_us) == (T0, T0 + 299 * 10_000)
    assert outage_run.bookmarks == f"{PUB_A}|1000|..|1299|"
    assert outage_run.detail == "not in the journal"
    assert runs[-1].detail == "x (the first of the run; the others differ)"
    doc = outage_run.as_dict()
    assert doc["first_time"] == "2025-11-27 14:00:00.000"
    assert doc["last_time"] == "2025-11-27 14:00:02.990"
    assert (doc["first_bookmark"], doc["last_bookmark"]) == (f"{PUB_A}|1000|", f"{PUB_A}|1299|")


def test_the_report_keeps_runs_in_json_and_prints_them_at_80_columns() -> None:
    print(f"sample report seed {SEED}")
    report = sample_report()
    doc = json.loads(report.to_json())
    assert doc["format"] == "amps-py-audit-2"
    assert len(doc["findings"]) == 305 and all(f["ts_us"] > 0 for f in doc["findings"])
    runs = doc["runs"]
    assert [(r["kind"], r["instance"], r["count"]) for r in runs] == [
        ("missing", "C", 300),
        ("missing", "C", 2),
        ("duplicate", "B", 1),
        ("reordered", "A", 1),
        ("phantom", "C", 1),
    ]
    assert runs[0]["client_name"] == "pubA" and runs[0]["link"] == "A -> C"
    assert (runs[0]["first_time"], runs[0]["last_time"]) == (
        "2025-11-27 14:00:20.000",
        "2025-11-27 14:00:29.867",
    )
    assert report_from_dict(doc).as_dict() == doc
    text = render_text(report)
    assert "Findings: 305 in 5 runs" in text
    assert f"  missing on C: 300 messages, {PUB_A}|1001|..|1300| of pubA\n" in text
    assert "    2025-11-27 14:00:20.000 .. 14:00:29.867; link A -> C; orders, from A\n" in text
    assert f"  duplicate on B: {PUB_B}|77| of pubB\n    at 2025-11-27 14:00:07.250;" in text
    assert "Result: 305 problems (302 missing, 1 duplicate, 1 reordered, 1 phantom)" in text
    assert text.count(PUB_A) <= 3  # no row per message
    too_wide = [line for line in text.splitlines() if len(line) > WIDTH]
    assert too_wide == []
    # the limit counts runs
    assert "Findings: 305 in 5 runs; the first 2" in render_text(report, limit=2)


# ---------------------------------------------------------------------- the lag axis


def _points(svg: str, series: str) -> list[float]:
    """The y of every marker of ``series`` in a chart."""
    group = re.search(rf'<g class="series-{series}">(.*?)</g>', svg)
    assert group is not None, series
    ys = [float(v) for v in re.findall(r'<circle cx="[\d.]+" cy="([\d.]+)"', group.group(1))]
    ys += [float(v) + 3 for v in re.findall(r'<rect x="[\d.]+" y="([\d.]+)"', group.group(1))]
    tops = re.findall(r'<polygon points="[\d.]+,([\d.]+) ', group.group(1))
    ys += [float(v) + 4 for v in tops]
    return ys


def test_the_log_axis_keeps_20_ms_clear_of_the_floor_beside_a_44_s_spike() -> None:
    start = 1_700_000_000_000_000
    buckets = tuple(
        LagBucket(start + i * 1_000_000, 50, 20.0, 20.0, 20.0 if i != 5 else 44_000.0)
        for i in range(10)
    )
    link = LinkLag("A", "C", "Destination C, async", 500, 20.0, 20.0, 44_000.0, buckets)
    svg = _chart(link, 1_000_000, start, start + 10_000_000)
    top = float(re.search(r'data-plot-top="([\d.]+)"', svg).group(1))  # type: ignore[union-attr]
    bottom = float(re.search(r'data-plot-bottom="([\d.]+)"', svg).group(1))  # type: ignore[union-attr]
    height = bottom - top
    assert re.search(r'data-decades="(-?\d+) (-?\d+)"', svg).groups() == ("1", "5")  # type: ignore[union-attr]
    for label in ("10 ms", "100 ms", "1 s", "10 s", "100 s"):
        assert f">{label}</text>" in svg
    p50 = _points(svg, "p50")
    assert len(p50) == 10
    # 20 ms sits 0.075 of the way up 10 ms..100 s; a linear axis would put it at
    # 20/44000 of the height, i.e. on the floor
    for y in p50:
        assert (bottom - y) / height == pytest.approx(0.0753, abs=0.005)
        assert bottom - y > 15  # SVG units: clearly above the axis
    peak = min(_points(svg, "max"))
    assert (bottom - peak) / height == pytest.approx(0.9106, abs=0.005)
    # three series, told apart by colour, dash and marker, and named in a legend
    for name, colour in (("p50", "#1f77b4"), ("p99", "#ff7f0e"), ("max", "#d62728")):
        assert f'<g class="series-{name}">' in svg and colour in svg
        assert f">{name}</text>" in svg
    assert 'stroke-dasharray="7 4"' in svg and 'stroke-dasharray="2 3"' in svg
    assert "<title>lag over time, A -&gt; C (log scale)</title>" in svg


def test_lag_decades_cover_the_data_and_zero_lag_lies_on_the_floor() -> None:
    assert lag_decades([20.0, 44_000.0]) == (1, 5)
    assert lag_decades([0.5, 3.0]) == (-1, 1)
    assert lag_decades([1.0]) == (0, 1)
    assert lag_decades([]) == (0, 2)
    assert lag_decades([0.0, -3.0, 1e-6, 7.0]) == (-3, 1)  # not below 1 µs
    start = 1_700_000_000_000_000
    buckets = (LagBucket(start, 1, 0.0, -2.0, 5.0), LagBucket(start + 1000, 1, 1.0, 2.0, 5.0))
    svg = _chart(LinkLag("A", "B", "x", 2, 0.5, 2.0, 5.0, buckets), 1000, start, start + 2000)
    bottom = float(re.search(r'data-plot-bottom="([\d.]+)"', svg).group(1))  # type: ignore[union-attr]
    assert max(_points(svg, "p50")) == pytest.approx(bottom)


# ---------------------------------------------------------------------- the page


def test_the_failing_cell_is_marked_not_the_row() -> None:
    page = render_html(sample_report())
    assert 'class="problem"' not in page and "<tr class" not in page
    counts = page[page.index("<h2>Per instance</h2>") : page.index("<h2>Findings</h2>")]
    row_c = re.search(r"<tr><td>C</td>(.*?)</tr>", counts, re.S)
    assert row_c is not None
    cells = re.findall(r"<td( class=\"fail\"[^>]*)?>(\d+)", row_c.group(1))
    # held, ok, missing, duplicate, reordered, phantom: missing and phantom marked
    assert [(bool(mark), int(n)) for mark, n in cells] == [
        (False, 2699),
        (False, 2698),
        (True, 302),
        (False, 0),
        (False, 0),
        (True, 1),
    ]
    assert 'title="problem: 302 missing on C"' in counts  # said in words, not colour only
    assert '<span class="sr"> (problem: 302 missing on C)</span>' in counts
    # problems first: the verdict, the table, the findings, then the plots
    order = [page.index(s) for s in ('class="bad"', "<h2>Per instance", 'id="findings"', "<svg")]
    assert order == sorted(order)
    assert "<script" not in page
    assert page.count("<details>") == 4  # each plot's values as a table
    assert html.escape("pubA") in page and "2025-11-27 14:00:29.867" in page


_MEASURE = """<script>
(function () {
  function box(e) {
    var r = e.getBoundingClientRect();
    return [r.left, r.top, r.right, r.bottom];
  }
  var fail = document.querySelector('#findings td.fail');
  var row = fail.parentElement;
  document.body.setAttribute('data-layout', JSON.stringify({
    findings: box(document.getElementById('findings')),
    chart: box(document.querySelector('svg.lag-chart')),
    fail: box(fail),
    neighbour: box(row.children[5]),
    counts: box(document.querySelector('table td.fail')),
    page_width: document.documentElement.scrollWidth
  }));
})();
</script>"""


def test_the_page_at_1280_px_in_headless_chromium(tmp_path: Path) -> None:
    """The screenshot at 1280 px: findings above the first chart and inside the first
    screen, the plots across the page, no horizontal scrolling, the marked cell red
    and its neighbour in the row white. The layout is measured by a copy of the page
    with a script added (the page itself has none) and read back with --dump-dom."""
    chromium = find_chromium()
    if chromium is None:
        pytest.skip("no chromium on PATH: apt-get install chromium (.ci/run installs it)")
    print(f"sample report seed {SEED}")
    page = tmp_path / "audit.html"
    text = render_html(sample_report())
    page.write_text(text, encoding="utf-8")
    measured = tmp_path / "measure.html"
    measured.write_text(text.replace("</body>", _MEASURE + "</body>"), encoding="utf-8")
    width, height = 1280, 2000
    window = f"--window-size={width},{height}"
    dom = chromium_run(chromium, tmp_path / "profile", measured, window, "--dump-dom")
    assert dom.returncode == 0, dom.stderr[-2000:]
    found = re.search(r'data-layout="([^"]*)"', dom.stdout)
    assert found is not None, dom.stdout[:2000]
    layout = json.loads(html.unescape(found.group(1)))
    print("layout", layout)
    assert layout["page_width"] <= width, "the page scrolls sideways"
    findings, chart = layout["findings"], layout["chart"]
    assert findings[3] < chart[1], "the findings table ends below the first chart's top"
    assert findings[1] < height * 0.5, "the findings are not in the first half screen"
    assert chart[2] - chart[0] > 0.9 * width - 48, "the plot does not use the page's width"

    shot = tmp_path / "page.png"
    done = chromium_run(chromium, tmp_path / "profile", page, window, f"--screenshot={shot}")
    assert done.returncode == 0 and shot.exists(), done.stderr[-2000:]
    data = shot.read_bytes()
    assert len(data) > 10_000
    got_width, got_height, rows = png_pixels(data, rows_wanted=int(chart[3]) + 1)
    assert (got_width, got_height) == (width, height)
    bpp = len(rows[0]) // got_width

    def pixel(x: float, y: float) -> tuple[int, ...]:
        row = rows[int(y)]
        return tuple(row[int(x) * bpp : int(x) * bpp + 3])

    def inside(box: list[float]) -> tuple[int, ...]:
        # the cell's left padding, half way down: background, never a glyph
        return pixel(box[0] + 4, (box[1] + box[3]) / 2)

    assert inside(layout["fail"]) == FAIL_RGB, "the failing run's class cell is not marked"
    assert inside(layout["counts"]) == FAIL_RGB, "the failing count cell is not marked"
    assert inside(layout["neighbour"]) == (255, 255, 255), "the row is tinted, not the cell"
    # the plots are drawn: the p50 blue and the max red among the chart's pixels
    colours = {
        pixel(x, y)
        for y in range(int(chart[1]) + 2, min(int(chart[3]), len(rows)) - 2, 2)
        for x in range(int(chart[0]) + 2, int(chart[2]) - 2, 2)
    }
    assert (0x1F, 0x77, 0xB4) in colours and (0xD6, 0x27, 0x28) in colours


def test_the_reference_screenshot_is_checked_in() -> None:
    shot = Path(__file__).resolve().parents[1] / "docs" / "audit-report.png"
    width, height = png_size(shot.read_bytes())
    assert width == 1280 and height >= 1000
    assert "audit-report.png" in (shot.parent / "GUARANTEES.md").read_text()
