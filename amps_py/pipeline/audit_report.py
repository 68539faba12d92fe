"""The fabric audit's report (pure: no Spark): the data, its JSON, a text summary and
one self-contained HTML page.

Findings are shown as *runs* (:func:`group_runs`): the findings of one class, on one
link (the last hop of the expected path, or the instance itself), of one publisher,
with contiguous seqs, make one run, named by the publisher's client name and hash, its
first and last bookmark, its count and its first and last time. A 300-message outage
is one run, not 300 rows.

The HTML page needs nothing but itself: styles inline, plots drawn as inline SVG
(lag over time per replication link on a log axis: p50, p99 and max of each time
bucket), no script, no font, image or style sheet from anywhere else. The verdict, the
per-instance table (its failing cells marked) and the runs come first, the plots after.
"""

from __future__ import annotations

import datetime as _dt
import html
import json
import math
import textwrap
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from amps_py.pipeline.audit_rules import CLASSES, PROBLEM_CLASSES, Counts, Finding

__all__ = [
    "AuditReport",
    "FindingRun",
    "FindingsLeftOut",
    "JournalInfo",
    "LagBucket",
    "LinkLag",
    "group_runs",
    "render_html",
    "render_text",
]

#: 2: findings carry ts_us; the report adds runs and publishers (client names)
FORMAT: Final = "amps-py-audit-2"


@dataclass(frozen=True)
class LagBucket:
    """Lag of the messages that arrived in ``[start_us, start_us + width)``."""

    start_us: int
    count: int
    p50_ms: float
    p99_ms: float
    max_ms: float


@dataclass(frozen=True)
class LinkLag:
    """Lag from origin timestamp to arrival at ``receiver``, of the records
    ``receiver`` stored from ``sender`` (the last hop of their path).

    ``label`` names the sender's destination that reaches the receiver (or says the
    configs have none)."""

    sender: str
    receiver: str
    label: str
    count: int
    p50_ms: float
    p99_ms: float
    max_ms: float
    buckets: tuple[LagBucket, ...] = ()

    @property
    def name(self) -> str:
        return f"{self.sender} -> {self.receiver}"


@dataclass(frozen=True)
class JournalInfo:
    """One audited journal."""

    instance: str
    path: str
    records: int
    first_txid: int
    last_txid: int


@dataclass(frozen=True)
class FindingsLeftOut:
    """Findings of one ``kind`` on ``instance`` arriving ``via`` one sender (the hop
    before ``instance`` on the expected path; ``""``: none) that the report does not
    list: ``found`` of them, of which it keeps the first ``kept`` (publisher, seq
    order). The counts count them all."""

    kind: str
    instance: str
    via: str
    found: int
    kept: int

    def __str__(self) -> str:
        via = f" via {self.via}" if self.via else ""
        return (
            f"{self.kind} on {self.instance}{via}: {self.found - self.kept} of {self.found} "
            f"left out (the first {self.kept} kept)"
        )


@dataclass
class AuditReport:
    """The result of an audit (see :mod:`amps_py.pipeline.audit_rules` for the
    classes).

    Attributes:
        instances: every instance of the configs, in load order.
        journals: the audited journals.
        messages: distinct messages (bookmarks) held by the audited journals.
        counts: per audited instance, records held and messages per class.
        findings: every problem, sorted (class, instance, publisher, seq).
        links: replication lag per link (sender, receiver), sorted.
        bucket_us: the width of the lag buckets.
        configs: the config files the fabric was loaded from.
        publishers: the client name of each publisher hash the findings name.
        run: facts about the run (time, Spark master) that do not describe the
            journals; two audits of the same journals differ only here.
        left_out: the groups of findings ``findings`` does not list in full (the
            audit keeps a bounded number per kind, instance and sender).
    """

    instances: tuple[str, ...]
    journals: tuple[JournalInfo, ...]
    messages: int
    counts: dict[str, Counts]
    findings: list[Finding]
    links: list[LinkLag]
    bucket_us: int
    configs: tuple[str, ...] = ()
    publishers: dict[str, str] = field(default_factory=dict)
    run: dict[str, Any] = field(default_factory=dict)
    left_out: tuple[FindingsLeftOut, ...] = ()

    @property
    def audited(self) -> tuple[str, ...]:
        return tuple(j.instance for j in self.journals)

    @property
    def unaudited(self) -> tuple[str, ...]:
        held = set(self.audited)
        return tuple(name for name in self.instances if name not in held)

    @property
    def total(self) -> Counts:
        total = Counts()
        for counts in self.counts.values():
            total.add(counts)
        return total

    @property
    def problems(self) -> int:
        """How many problems were found (0: the journals hold what the configs
        promise)."""
        return self.total.problems

    @property
    def exit_code(self) -> int:
        return 1 if self.problems else 0

    @property
    def runs(self) -> list[FindingRun]:
        """The findings grouped into runs (:func:`group_runs`)."""
        return group_runs(self.findings, self.publishers)

    def problem_counts(self) -> dict[str, int]:
        total = self.total
        return {name: getattr(total, name) for name in PROBLEM_CLASSES}

    # ------------------------------------------------------------------ JSON
    def as_dict(self) -> dict[str, Any]:
        return {
            "format": FORMAT,
            "ok": self.problems == 0,
            "problems": self.problem_counts(),
            "instances": list(self.instances),
            "audited": list(self.audited),
            "unaudited": list(self.unaudited),
            "configs": list(self.configs),
            "journals": [j.__dict__ for j in self.journals],
            "messages": self.messages,
            "counts": {name: c.as_dict() for name, c in self.counts.items()},
            "total": self.total.as_dict(),
            "publishers": dict(self.publishers),
            "runs": [r.as_dict() for r in self.runs],
            "findings": [f.as_dict() for f in self.findings],
            "findings_left_out": [g.__dict__ for g in self.left_out],
            "lag": {
                "definition": "receiver local timestamp - origin timestamp, per record "
                "stored from the sender (the last hop of its path)",
                "bucket_us": self.bucket_us,
                "links": [
                    {
                        "sender": link.sender,
                        "receiver": link.receiver,
                        "label": link.label,
                        "count": link.count,
                        "p50_ms": link.p50_ms,
                        "p99_ms": link.p99_ms,
                        "max_ms": link.max_ms,
                        "buckets": [b.__dict__ for b in link.buckets],
                    }
                    for link in self.links
                ],
            },
            "run": self.run,
        }

    def to_json(self) -> str:
        return json.dumps(self.as_dict(), indent=1, sort_keys=False) + "\n"


# ------------------------------------------------------------------------- runs


@dataclass(frozen=True)
class FindingRun:
    """Findings of one class, on one link, of one publisher, with contiguous seqs.

    Attributes:
        kind: their class.
        instance: the instance whose journal has them.
        link: ``sender -> instance`` when the expected path reaches ``instance``
            over a link, else ``instance`` (published there, or must not be there).
        publisher_hash: the publisher (the first part of the bookmarks).
        client_name: its client name as its records hold it ("" when unknown).
        origin: the origin of the first finding.
        topics: the topics of the findings, sorted.
        expected_path: the first finding's expected path.
        first_seq: the first bookmark's seq.
        last_seq: the last bookmark's seq.
        count: findings in the run (a phantom counts per record).
        first_us: the earliest ``ts_us`` of the findings (0: unknown).
        last_us: the latest ``ts_us`` of the findings (0: unknown).
        detail: the findings' detail (the first one's, saying so, when they differ).
    """

    kind: str
    instance: str
    link: str
    publisher_hash: str
    client_name: str
    origin: str
    topics: tuple[str, ...]
    expected_path: str | None
    first_seq: int
    last_seq: int
    count: int
    first_us: int
    last_us: int
    detail: str

    @property
    def first_bookmark(self) -> str:
        return f"{self.publisher_hash}|{self.first_seq}|"

    @property
    def last_bookmark(self) -> str:
        return f"{self.publisher_hash}|{self.last_seq}|"

    @property
    def bookmarks(self) -> str:
        """``hash|first|`` alone, or ``hash|first|..|last|``."""
        if self.first_seq == self.last_seq:
            return self.first_bookmark
        return f"{self.first_bookmark}..|{self.last_seq}|"

    @property
    def publisher(self) -> str:
        """The client name and the hash, e.g. ``pubA (1641...324)``."""
        if self.client_name:
            return f"{self.client_name} ({self.publisher_hash})"
        return self.publisher_hash

    def as_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "instance": self.instance,
            "link": self.link,
            "publisher_hash": self.publisher_hash,
            "client_name": self.client_name,
            "origin": self.origin,
            "topics": list(self.topics),
            "expected_path": self.expected_path,
            "first_bookmark": self.first_bookmark,
            "last_bookmark": self.last_bookmark,
            "first_seq": self.first_seq,
            "last_seq": self.last_seq,
            "count": self.count,
            "first_us": self.first_us,
            "last_us": self.last_us,
            "first_time": _utc(self.first_us),
            "last_time": _utc(self.last_us),
            "detail": self.detail,
        }


def finding_link(f: Finding) -> str:
    """The link a finding belongs to: ``sender -> instance`` (the last hop of its
    expected path) or the instance alone."""
    hops = f.expected_hops
    if len(hops) >= 2 and hops[-1] == f.instance:
        return f"{hops[-2]} -> {f.instance}"
    return f.instance


def group_runs(findings: Iterable[Finding], publishers: Mapping[str, str]) -> list[FindingRun]:
    """``findings`` grouped into runs: same class, instance, link and publisher, and
    each seq the previous one's or the next (a phantom can be several records of one
    bookmark). A bookmark without a numeric seq is a run of its own. Sorted by class
    (as the findings are), instance, publisher and first seq."""
    groups: dict[tuple[str, str, str, str], list[Finding]] = {}
    for f in findings:
        groups.setdefault((f.kind, f.instance, finding_link(f), f.publisher_hash), []).append(f)
    runs: list[FindingRun] = []
    for (kind, instance, link, publisher), members in groups.items():
        members.sort(key=lambda f: (f.seq, f.ts_us, f.bookmark, f.txids))
        current: list[Finding] = []
        for f in members:
            if current and (f.seq < 0 or current[-1].seq < 0 or f.seq - current[-1].seq > 1):
                runs.append(_run(kind, instance, link, publisher, publishers, current))
                current = []
            current.append(f)
        if current:
            runs.append(_run(kind, instance, link, publisher, publishers, current))
    order = {name: i for i, name in enumerate(PROBLEM_CLASSES)}
    runs.sort(
        key=lambda r: (order.get(r.kind, 99), r.instance, r.publisher_hash, r.first_seq, r.link)
    )
    return runs


def _run(
    kind: str,
    instance: str,
    link: str,
    publisher: str,
    publishers: Mapping[str, str],
    members: Sequence[Finding],
) -> FindingRun:
    first = members[0]
    times = [f.ts_us for f in members if f.ts_us]
    return FindingRun(
        kind=kind,
        instance=instance,
        link=link,
        publisher_hash=publisher,
        client_name=publishers.get(publisher, ""),
        origin=first.origin,
        topics=tuple(sorted({f.topic for f in members})),
        expected_path=first.expected_path,
        first_seq=first.seq,
        last_seq=members[-1].seq,
        count=len(members),
        first_us=min(times, default=0),
        last_us=max(times, default=0),
        detail=(
            first.detail
            if all(f.detail == first.detail for f in members)
            else f"{first.detail} (the first of the run; the others differ)"
        ),
    )


def _utc(us: int, date: bool = True) -> str:
    """``2026-11-28 03:47:22.123`` (UTC, ms), or without the date; "" for 0."""
    if not us:
        return ""
    t = _dt.datetime.fromtimestamp(us / 1e6, _dt.UTC)
    stamp = t.strftime("%Y-%m-%d %H:%M:%S" if date else "%H:%M:%S")
    return f"{stamp}.{t.microsecond // 1000:03d}"


def _span(first_us: int, last_us: int) -> str:
    """When a run happened: one time, or first .. last (the date once)."""
    if not first_us:
        return "time unknown"
    if last_us == first_us:
        return f"at {_utc(first_us)}"
    same_day = _utc(first_us)[:10] == _utc(last_us)[:10]
    return f"{_utc(first_us)} .. {_utc(last_us, date=not same_day)}"


# ------------------------------------------------------------------------- text

#: the text report's width
WIDTH: Final = 80


def _table(header: Sequence[str], rows: Sequence[Sequence[str]], left: int = 1) -> list[str]:
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(header)]

    def line(cells: Sequence[str]) -> str:
        out = [c.ljust(widths[i]) if i < left else c.rjust(widths[i]) for i, c in enumerate(cells)]
        return "  ".join(out).rstrip()

    return [line(header), *(line(r) for r in rows)]


def _problems(n: int) -> str:
    return f"{n} problem" if n == 1 else f"{n} problems"


def _ms(value: float) -> str:
    return f"{value:.3f}"


def _wrap(text: str, first: str, rest: str) -> list[str]:
    return textwrap.wrap(
        text,
        WIDTH,
        initial_indent=first,
        subsequent_indent=rest,
        break_long_words=False,
        break_on_hyphens=False,
    ) or [first.rstrip()]


def run_headline(run: FindingRun) -> str:
    """``missing on C: 300 messages, 1641...|1|..|300| of pubA``; a run of one
    finding: ``missing on C: 1641...|10| of pubA``."""
    who = f" of {run.client_name}" if run.client_name else ""
    many = f"{run.count} messages, " if run.count > 1 else ""
    if run.kind == "phantom" and run.count > 1:
        many = f"{run.count} records, "
    return f"{run.kind} on {run.instance}: {many}{run.bookmarks}{who}"


def render_run(run: FindingRun) -> list[str]:
    """One run as text lines of at most :data:`WIDTH` columns (a word longer than
    that, a bookmark say, stays whole)."""
    lines = _wrap(run_headline(run), "  ", "      ")
    topics = ", ".join(run.topics)
    where = f"link {run.link}; " if " -> " in run.link else ""
    lines += _wrap(
        f"{_span(run.first_us, run.last_us)}; {where}{topics}, from {run.origin}", "    ", "      "
    )
    lines += _wrap(run.detail, "    ", "      ")
    if run.expected_path:
        lines += _wrap(f"expected path {run.expected_path}", "    ", "      ")
    return lines


def render_text(report: AuditReport, limit: int = 20) -> str:
    """The readable summary (80 columns): the table per instance, lag per link, the
    first ``limit`` runs of findings (times UTC) and the verdict."""
    lines = _wrap(
        f"Fabric audit: {len(report.instances)} instances ({', '.join(report.instances)}); "
        f"journals of {', '.join(report.audited) or 'none'}; {report.messages} messages",
        "",
        "  ",
    )
    if report.unaudited:
        lines += _wrap(
            f"not audited (no journal given): {', '.join(report.unaudited)}; what those "
            "instances hold is not checked",
            "",
            "  ",
        )
    rows = [[name, *(str(getattr(c, k)) for k in CLASSES)] for name, c in report.counts.items()]
    rows.append(["total", *(str(getattr(report.total, k)) for k in CLASSES)])
    lines.append("")
    lines.extend(_table(["instance", *CLASSES], rows))
    lines.append("")
    if report.links:
        lines.append("Replication lag, origin timestamp -> arrival (ms):")
        link_rows = [
            [
                f"{link.name} ({link.label})",
                str(link.count),
                _ms(link.p50_ms),
                _ms(link.p99_ms),
                _ms(link.max_ms),
            ]
            for link in report.links
        ]
        lines.extend(_table(["link", "records", "p50", "p99", "max"], link_rows))
    else:
        lines.append("Replication lag: no replicated records in the audited journals")
    lines.append("")
    if report.findings:
        runs = report.runs
        shown = runs[:limit]
        more = f"; the first {len(shown)}" if len(shown) < len(runs) else ""
        lines += _wrap(
            f"Findings: {len(report.findings)} in {len(runs)} "
            f"{'run' if len(runs) == 1 else 'runs'}{more} (times UTC; every finding "
            "kept is in audit.json):",
            "",
            "  ",
        )
        for run in shown:
            lines.extend(render_run(run))
        if report.left_out:
            lines.append("Not in the report (counted, not listed):")
            lines.extend(f"  {g}" for g in report.left_out)
        lines.append("")
        counts = ", ".join(f"{n} {k}" for k, n in report.problem_counts().items() if n)
        lines += _wrap(f"Result: {_problems(report.problems)} ({counts})", "", "  ")
    else:
        lines += _wrap(
            "Result: no problems: every message is where the configs send it, once, "
            "in publisher order",
            "",
            "  ",
        )
    return "\n".join(lines)


# ------------------------------------------------------------------------- HTML

#: the marked (failing) cell: white on this red, bold, outlined
FAIL_RGB: Final = (0xB7, 0x1C, 0x1C)

_STYLE: Final = """
body { font-family: sans-serif; margin: 16px 24px; color: #222; background: #fff; }
h1 { font-size: 22px; margin: 0 0 8px 0; } h2 { font-size: 18px; margin: 20px 0 6px 0; }
table { border-collapse: collapse; margin: 6px 0; font-size: 13px; }
th, td { border: 1px solid #ccc; padding: 3px 8px; text-align: right; vertical-align: top; }
th:first-child, td:first-child, td.text, th.text { text-align: left; }
th { background: #f0f0f0; }
td.fail { background: #b71c1c; color: #fff; font-weight: bold; outline: 2px solid #7f0000;
  outline-offset: -2px; }
td.nowrap { white-space: nowrap; }
table.runs { width: 100%; }
.ok { color: #1a7f37; font-weight: bold; } .bad { color: #b71c1c; font-weight: bold; }
.sr { position: absolute; width: 1px; height: 1px; overflow: hidden; clip: rect(0 0 0 0);
  white-space: nowrap; }
figure { margin: 8px 0 20px 0; } figcaption { font-size: 13px; margin-bottom: 4px; }
svg.lag-chart { display: block; width: 100%; height: auto; border: 1px solid #ddd;
  background: #fcfcfc; }
details { font-size: 13px; margin-top: 4px; }
.note { font-size: 13px; color: #555; }
"""

#: the plotted series: name, colour, dash pattern ("" solid), marker
_SERIES: Final = (
    ("p50", "#1f77b4", "", "circle"),
    ("p99", "#ff7f0e", "7 4", "square"),
    ("max", "#d62728", "2 3", "diamond"),
)

#: the chart's geometry in SVG units (drawn at 100% of the page's width)
CHART_WIDTH: Final = 1200
CHART_HEIGHT: Final = 300
_LEFT, _RIGHT, _TOP, _BOTTOM = 72, 16, 30, 44

#: the lowest decade of the lag axis: 1 µs, the timestamps' resolution
_FLOOR_DECADE: Final = -3


def _time_label(us: int, span_us: int) -> str:
    t = _dt.datetime.fromtimestamp(us / 1e6, _dt.UTC)
    if span_us < 10_000_000:
        return t.strftime("%H:%M:%S.") + f"{t.microsecond // 1000:03d}"
    if span_us < 86_400_000_000:
        return t.strftime("%H:%M:%S")
    return t.strftime("%m-%d %H:%M")


def lag_decades(values: Iterable[float]) -> tuple[int, int]:
    """The decades of the log axis (powers of ten, in ms) that cover ``values``:
    from the one at or below the smallest positive value (not below 1 µs) to the one
    at or above the largest, at least one decade apart."""
    positive = [v for v in values if v > 0]
    if not positive:
        return 0, 2  # 1 ms .. 100 ms: nothing to show
    lo = max(_FLOOR_DECADE, math.floor(math.log10(min(positive))))
    hi = max(lo + 1, math.ceil(math.log10(max(positive))))
    return lo, hi


def _lag_label(decade: int) -> str:
    if decade < 0:
        return f"{10 ** (decade + 3):g} µs"
    if decade < 3:
        return f"{10**decade:g} ms"
    return f"{10 ** (decade - 3):g} s"


def _marker(shape: str, x: float, y: float, colour: str) -> str:
    if shape == "square":
        return f'<rect x="{x - 3:.1f}" y="{y - 3:.1f}" width="6" height="6" fill="{colour}"/>'
    if shape == "diamond":
        return (
            f'<polygon points="{x:.1f},{y - 4:.1f} {x + 4:.1f},{y:.1f} {x:.1f},{y + 4:.1f} '
            f'{x - 4:.1f},{y:.1f}" fill="{colour}"/>'
        )
    return f'<circle cx="{x:.1f}" cy="{y:.1f}" r="3" fill="{colour}"/>'


def _chart(link: LinkLag, bucket_us: int, x0: int, x1: int) -> str:
    """An inline SVG chart of ``link``'s buckets (x: arrival time from ``x0`` to
    ``x1``, the same for every link; y: lag in ms on a log axis, so a 44 s spike does
    not flatten 20 ms to nothing). p50, p99 and max differ in colour, dash and marker.
    A line joins adjacent buckets only: a gap (no arrival) stays a gap. A lag at or
    below the axis floor (0, or negative when clocks differ) is drawn on the floor.

    The ``svg`` carries ``data-plot-top`` and ``data-plot-bottom`` (the y of the plot
    area's edges) and ``data-decades`` (the axis' powers of ten, in ms)."""
    width, height = CHART_WIDTH, CHART_HEIGHT
    left, top = _LEFT, _TOP
    plot_w, plot_h = width - _LEFT - _RIGHT, height - _TOP - _BOTTOM
    bottom_y = top + plot_h
    buckets = link.buckets
    span = max(x1 - x0, 1)
    lo, hi = lag_decades(v for b in buckets for v in (b.p50_ms, b.p99_ms, b.max_ms))

    def x(us: float) -> float:
        return left + (us - x0) / span * plot_w

    def y(ms: float) -> float:
        if ms <= 0:
            return bottom_y
        d = min(max(math.log10(ms), lo), hi)
        return bottom_y - (d - lo) / (hi - lo) * plot_h

    esc = html.escape
    peak = max(buckets, key=lambda b: b.max_ms, default=None)
    summary = (
        f"{len(buckets)} buckets; p50 {_ms(link.p50_ms)} ms, p99 {_ms(link.p99_ms)} ms, "
        f"max {_ms(link.max_ms)} ms"
        + (f" (highest bucket max at {_utc(peak.start_us)} UTC)" if peak else "")
    )
    parts = [
        f'<svg class="lag-chart" xmlns="http://www.w3.org/2000/svg" width="{width}" '
        f'height="{height}" viewBox="0 0 {width} {height}" role="img" '
        f'data-plot-top="{top}" data-plot-bottom="{bottom_y}" data-decades="{lo} {hi}" '
        f'aria-label="lag over time on a log scale, {esc(link.name)}: {esc(summary)}">',
        f"<title>lag over time, {esc(link.name)} (log scale)</title>",
        f'<rect x="{left}" y="{top}" width="{plot_w}" height="{plot_h}" fill="#ffffff" '
        'stroke="#999"/>',
    ]
    for decade in range(lo, hi + 1):
        yy = y(10.0**decade)
        parts.append(
            f'<line x1="{left}" y1="{yy:.1f}" x2="{left + plot_w}" y2="{yy:.1f}" stroke="#d8d8d8"/>'
            f'<text x="{left - 6}" y="{yy + 4:.1f}" font-size="12" text-anchor="end">'
            f"{_lag_label(decade)}</text>"
        )
        if decade < hi:
            for m in (2, 5):
                ym = y(m * 10.0**decade)
                parts.append(
                    f'<line x1="{left}" y1="{ym:.1f}" x2="{left + plot_w}" y2="{ym:.1f}" '
                    'stroke="#f0f0f0"/>'
                )
    for i in range(7):
        us = x0 + span * i / 6
        xx = x(us)
        anchor = "start" if i == 0 else "end" if i == 6 else "middle"
        parts.append(
            f'<line x1="{xx:.1f}" y1="{bottom_y}" x2="{xx:.1f}" y2="{bottom_y + 4}" '
            'stroke="#666"/>'
            f'<text x="{xx:.1f}" y="{bottom_y + 17}" font-size="12" '
            f'text-anchor="{anchor}">{_time_label(int(us), span)}</text>'
        )
    parts.append(
        f'<text x="{left + plot_w / 2:.0f}" y="{height - 6}" font-size="12" '
        'text-anchor="middle">arrival time (UTC)</text>'
        f'<text x="14" y="{top + plot_h / 2:.0f}" font-size="12" text-anchor="middle" '
        f'transform="rotate(-90 14 {top + plot_h / 2:.0f})">lag (log scale)</text>'
    )
    runs: list[list[LagBucket]] = []
    for b in buckets:
        if runs and b.start_us - runs[-1][-1].start_us <= bucket_us:
            runs[-1].append(b)
        else:
            runs.append([b])
    for name, colour, dash, shape in reversed(_SERIES):  # p50 drawn last, on top
        dashes = f' stroke-dasharray="{dash}"' if dash else ""
        parts.append(f'<g class="series-{name}">')
        for run in runs:
            points = [(x(b.start_us + bucket_us / 2), y(getattr(b, f"{name}_ms"))) for b in run]
            if len(points) > 1:
                coords = " ".join(f"{px:.1f},{py:.1f}" for px, py in points)
                parts.append(
                    f'<polyline fill="none" stroke="{colour}" stroke-width="2"{dashes} '
                    f'points="{coords}"/>'
                )
            parts.extend(_marker(shape, px, py, colour) for px, py in points)
        parts.append("</g>")
    # the legend, above the plot area (never over the data)
    lx = left + plot_w
    for name, colour, dash, shape in reversed(_SERIES):
        lx -= 92
        dashes = f' stroke-dasharray="{dash}"' if dash else ""
        parts.append(
            f'<line x1="{lx}" y1="{top - 12}" x2="{lx + 30}" y2="{top - 12}" stroke="{colour}" '
            f'stroke-width="2"{dashes}/>'
            + _marker(shape, lx + 15, top - 12, colour)
            + f'<text x="{lx + 36}" y="{top - 8}" font-size="12">{name}</text>'
        )
    parts.append("</svg>")
    return "".join(parts)


def _cell(text: object, cls: str = "") -> str:
    attr = f' class="{cls}"' if cls else ""
    return f"<td{attr}>{html.escape(str(text))}</td>"


def _fail_cell(text: object, what: str, cls: str = "") -> str:
    """A marked cell: what fails, said in words too (title, and hidden text for
    screen readers)."""
    classes = f"fail {cls}".strip()
    return (
        f'<td class="{classes}" title="{html.escape(what)}">{html.escape(str(text))}'
        f'<span class="sr"> ({html.escape(what)})</span></td>'
    )


def _counts_rows(report: AuditReport) -> list[str]:
    out = ["<table><tr><th>instance</th>", *(f"<th>{c}</th>" for c in CLASSES), "</tr>"]
    rows: list[tuple[str, Counts]] = [*report.counts.items(), ("total", report.total)]
    for name, counts in rows:
        out.append(f"<tr>{_cell(name)}")
        for c in CLASSES:
            n = getattr(counts, c)
            if c in PROBLEM_CLASSES and n:
                out.append(_fail_cell(n, f"problem: {n} {c} on {name}"))
            else:
                out.append(_cell(n))
        out.append("</tr>")
    out.append("</table>")
    return out


def _runs_table(report: AuditReport, limit: int) -> list[str]:
    runs = report.runs
    if not runs:
        return ["<p>None.</p>"]
    shown = runs[:limit]
    out = [
        f'<p class="note">{len(report.findings)} findings in {len(runs)} runs: the findings '
        "of one class, link and publisher with contiguous seqs make one run. Times UTC "
        "(the record's local timestamp; for missing, when it was published)."
        + (
            f" The first {len(shown)} runs; the JSON report lists every finding kept."
            if len(shown) < len(runs)
            else ""
        )
        + "</p>",
        *(
            f'<p class="note">Not in the report (counted, not listed): '
            f"{html.escape(str(group))}.</p>"
            for group in report.left_out
        ),
        '<table class="runs" id="findings"><tr><th>class</th><th class="text">instance</th>'
        '<th class="text">link</th><th class="text">publisher</th>'
        '<th class="text">bookmarks</th><th>count</th><th class="text">first</th>'
        '<th class="text">last</th><th class="text">topic</th>'
        '<th class="text">expected path</th><th class="text">detail</th></tr>',
    ]
    for run in shown:
        name = html.escape(run.client_name) if run.client_name else "(unknown)"
        seqs = (
            f"{run.first_bookmark}"
            if run.first_seq == run.last_seq
            else f"{run.first_bookmark} .. {run.last_bookmark}"
        )
        out.append(
            "<tr>"
            + _fail_cell(run.kind, f"problem: {run.count} {run.kind}")
            + _cell(run.instance)
            + _cell(run.link, "text nowrap")
            + f'<td class="text"><b>{name}</b><br>{html.escape(run.publisher_hash)}</td>'
            + _cell(seqs, "text")
            + _cell(run.count)
            + _cell(_utc(run.first_us) or "unknown", "text")
            + _cell(_utc(run.last_us) or "unknown", "text")
            + _cell(", ".join(run.topics), "text")
            + _cell(run.expected_path or "(none: must not be there)", "text")
            + _cell(run.detail, "text")
            + "</tr>"
        )
    out.append("</table>")
    return out


def _bucket_table(link: LinkLag) -> str:
    rows = "".join(
        "<tr>"
        + _cell(_utc(b.start_us))
        + _cell(b.count)
        + _cell(_ms(b.p50_ms))
        + _cell(_ms(b.p99_ms))
        + _cell(_ms(b.max_ms))
        + "</tr>"
        for b in link.buckets
    )
    return (
        f"<details><summary>The plotted values of {html.escape(link.name)} "
        f"({len(link.buckets)} buckets)</summary><table><tr><th>bucket start (UTC)</th>"
        f"<th>records</th><th>p50 ms</th><th>p99 ms</th><th>max ms</th></tr>{rows}"
        "</table></details>"
    )


def render_html(report: AuditReport, limit: int = 2000) -> str:
    """One self-contained HTML page: the verdict, the per-instance table (failing
    counts marked), up to ``limit`` runs of findings, then lag per link (table, and
    one inline SVG plot per link on a log axis, its values in a table beneath)."""
    esc = html.escape
    out = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        "<title>amps-py fabric audit</title>",
        f"<style>{_STYLE}</style></head><body>",
        "<h1>amps-py fabric audit</h1>",
    ]
    if report.problems:
        which = ", ".join(f"{n} {k}" for k, n in report.problem_counts().items() if n)
        out.append(f'<p class="bad">{_problems(report.problems)}: {esc(which)}</p>')
    else:
        out.append(
            '<p class="ok">No problems: every message is where the configs send it, once, '
            "in publisher order.</p>"
        )
    out.append(
        f"<p>{len(report.instances)} instances ({esc(', '.join(report.instances))}); "
        f"journals of {esc(', '.join(report.audited))}; {report.messages} messages.</p>"
    )
    if report.unaudited:
        out.append(
            f'<p class="note">Not audited (no journal given): '
            f"{esc(', '.join(report.unaudited))}.</p>"
        )
    out.append("<h2>Per instance</h2>")
    out.extend(_counts_rows(report))
    out.append("<h2>Findings</h2>")
    out.extend(_runs_table(report, limit))

    out.append("<h2>Replication lag per link</h2>")
    out.append(
        '<p class="note">Lag = the receiving instance\'s local timestamp minus the origin '
        "timestamp, for every record it stored from the sender (the last hop of the "
        f"record's path); buckets of {report.bucket_us / 1000:g} ms by arrival time; log "
        "scale. Timestamps come from different hosts' clocks: a lag of 0 or less is "
        "drawn on the axis floor.</p>"
    )
    if report.links:
        out.append(
            '<table><tr><th>link</th><th class="text">destination</th><th>records</th>'
            "<th>p50 ms</th><th>p99 ms</th><th>max ms</th></tr>"
        )
        for link in report.links:
            out.append(
                "<tr>"
                + _cell(link.name)
                + _cell(link.label, "text")
                + _cell(link.count)
                + _cell(_ms(link.p50_ms))
                + _cell(_ms(link.p99_ms))
                + _cell(_ms(link.max_ms))
                + "</tr>"
            )
        out.append("</table>")
        starts = [b.start_us for link in report.links for b in link.buckets]
        x0 = min(starts, default=0)
        x1 = max(starts, default=0) + report.bucket_us
        for link in report.links:
            out.append(
                f"<figure><figcaption><b>{esc(link.name)}</b> ({esc(link.label)}): "
                f"{link.count} records, p50 {_ms(link.p50_ms)} ms, p99 "
                f"{_ms(link.p99_ms)} ms, max {_ms(link.max_ms)} ms</figcaption>"
                f"{_chart(link, report.bucket_us, x0, x1)}{_bucket_table(link)}</figure>"
            )
    else:
        out.append("<p>No replicated records in the audited journals.</p>")

    journals = "".join(
        f"<li>{esc(j.instance)}: {esc(j.path)} ({j.records} records, txids "
        f"{j.first_txid}..{j.last_txid})</li>"
        for j in report.journals
    )
    configs = "".join(f"<li>{esc(c)}</li>" for c in report.configs)
    out.append(f"<h2>Inputs</h2><p>Configs:</p><ul>{configs}</ul><p>Journals:</p><ul>")
    out.append(f"{journals}</ul>")
    run = ", ".join(f"{k} {v}" for k, v in report.run.items())
    if run:
        out.append(f'<p class="note">Run: {esc(run)}</p>')
    out.append("</body></html>\n")
    return "\n".join(out)


def report_from_dict(doc: Mapping[str, Any]) -> AuditReport:
    """An :class:`AuditReport` from its JSON (:meth:`AuditReport.as_dict`)."""
    counts = {name: Counts(**values) for name, values in doc["counts"].items()}
    links = [
        LinkLag(
            link["sender"],
            link["receiver"],
            link["label"],
            link["count"],
            link["p50_ms"],
            link["p99_ms"],
            link["max_ms"],
            tuple(LagBucket(**b) for b in link["buckets"]),
        )
        for link in doc["lag"]["links"]
    ]
    return AuditReport(
        instances=tuple(doc["instances"]),
        journals=tuple(JournalInfo(**j) for j in doc["journals"]),
        messages=doc["messages"],
        counts=counts,
        findings=[Finding.from_dict(f) for f in doc["findings"]],
        links=links,
        bucket_us=doc["lag"]["bucket_us"],
        configs=tuple(doc["configs"]),
        publishers=dict(doc.get("publishers", {})),
        run=dict(doc.get("run", {})),
        left_out=tuple(FindingsLeftOut(**g) for g in doc.get("findings_left_out", [])),
    )
