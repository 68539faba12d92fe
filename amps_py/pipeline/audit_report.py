"""The fabric audit's report (pure: no Spark): the data, its JSON, a text summary and
one self-contained HTML page.

The HTML page needs nothing but itself: styles inline, plots drawn as inline SVG
(lag over time per replication link: p50, p99 and max of each time bucket), no
script, no font, image or style sheet from anywhere else.
"""

from __future__ import annotations

import datetime as _dt
import html
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from amps_py.pipeline.audit_rules import CLASSES, PROBLEM_CLASSES, Counts, Finding

__all__ = [
    "AuditReport",
    "FindingsLeftOut",
    "JournalInfo",
    "LagBucket",
    "LinkLag",
    "render_html",
    "render_text",
]

FORMAT: Final = "amps-py-audit-1"


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


# ------------------------------------------------------------------------- text


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


def render_text(report: AuditReport, limit: int = 20) -> str:
    """The readable summary: the table per instance, lag per link, the first
    ``limit`` findings and the verdict."""
    lines = [
        f"Fabric audit: {len(report.instances)} instances ({', '.join(report.instances)}); "
        f"journals of {', '.join(report.audited) or 'none'}; {report.messages} messages",
    ]
    if report.unaudited:
        lines.append(
            f"not audited (no journal given): {', '.join(report.unaudited)}; what those "
            "instances hold is not checked"
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
        shown = report.findings[:limit]
        more = f"; the first {len(shown)}" if len(shown) < len(report.findings) else ""
        lines.append(f"Findings ({len(report.findings)}{more}):")
        lines.extend(f"  {f}" for f in shown)
        if report.left_out:
            lines.append("Not in the report (counted, not listed):")
            lines.extend(f"  {g}" for g in report.left_out)
        lines.append("")
        counts = ", ".join(f"{n} {k}" for k, n in report.problem_counts().items() if n)
        lines.append(f"Result: {_problems(report.problems)} ({counts})")
    else:
        lines.append(
            "Result: no problems: every message is where the configs send it, once, "
            "in publisher order"
        )
    return "\n".join(lines)


# ------------------------------------------------------------------------- HTML

_STYLE: Final = """
body { font-family: sans-serif; margin: 24px; color: #222; background: #fff; }
h1 { font-size: 22px; } h2 { font-size: 18px; margin-top: 28px; }
table { border-collapse: collapse; margin: 8px 0; font-size: 13px; }
th, td { border: 1px solid #ccc; padding: 3px 8px; text-align: right; }
th:first-child, td:first-child, td.text, th.text { text-align: left; }
th { background: #f0f0f0; }
.ok { color: #1a7f37; font-weight: bold; } .bad { color: #c62828; font-weight: bold; }
.problem { background: #fdecea; }
figure { margin: 12px 0 24px 0; } figcaption { font-size: 13px; margin-bottom: 4px; }
svg.lag-chart { border: 1px solid #ddd; background: #fcfcfc; }
.note { font-size: 13px; color: #555; }
"""

_SERIES: Final = (("p50", "#1f77b4"), ("p99", "#ff7f0e"), ("max", "#d62728"))


def _nice_step(span: float, ticks: int = 5) -> float:
    raw = span / max(ticks, 1)
    if raw <= 0:
        return 1.0
    magnitude = 10 ** math.floor(math.log10(raw))
    for m in (1, 2, 5, 10):
        if raw <= m * magnitude:
            return float(m * magnitude)
    return float(10 * magnitude)


def _time_label(us: int, span_us: int) -> str:
    t = _dt.datetime.fromtimestamp(us / 1e6, _dt.UTC)
    if span_us < 10_000_000:
        return t.strftime("%H:%M:%S.") + f"{t.microsecond // 1000:03d}"
    if span_us < 86_400_000_000:
        return t.strftime("%H:%M:%S")
    return t.strftime("%m-%d %H:%M")


def _chart(link: LinkLag, bucket_us: int, x0: int, x1: int) -> str:
    """An inline SVG line chart of ``link``'s buckets (x: arrival time from ``x0`` to
    ``x1``, the same for every link; y: lag in ms). A line joins adjacent buckets
    only: a gap (no arrival) stays a gap."""
    width, height = 760, 260
    left, right, top, bottom = 64, 16, 16, 44
    plot_w, plot_h = width - left - right, height - top - bottom
    buckets = link.buckets
    span = max(x1 - x0, 1)
    y_top = max((b.max_ms for b in buckets), default=0.0)
    step = _nice_step(y_top if y_top > 0 else 1.0)
    y_max = step * max(1, math.ceil(y_top / step)) if y_top > 0 else step * 5

    def x(us: float) -> float:
        return left + (us - x0) / span * plot_w

    def y(ms: float) -> float:
        return top + plot_h - (ms / y_max) * plot_h

    parts = [
        f'<svg class="lag-chart" xmlns="http://www.w3.org/2000/svg" width="{width}" '
        f'height="{height}" viewBox="0 0 {width} {height}" role="img" '
        f'aria-label="lag over time, {html.escape(link.name)}">',
        f'<rect x="{left}" y="{top}" width="{plot_w}" height="{plot_h}" fill="#ffffff" '
        'stroke="#999"/>',
    ]
    ticks = round(y_max / step)
    for i in range(ticks + 1):
        value = i * step
        yy = y(value)
        parts.append(
            f'<line x1="{left}" y1="{yy:.1f}" x2="{left + plot_w}" y2="{yy:.1f}" stroke="#e4e4e4"/>'
        )
        label = f"{value:g}"
        parts.append(
            f'<text x="{left - 6}" y="{yy + 4:.1f}" font-size="11" text-anchor="end">{label}</text>'
        )
    for i in range(5):
        us = x0 + span * i / 4
        xx = x(us)
        parts.append(
            f'<line x1="{xx:.1f}" y1="{top + plot_h}" x2="{xx:.1f}" y2="{top + plot_h + 4}" '
            'stroke="#666"/>'
        )
        anchor = "start" if i == 0 else "end" if i == 4 else "middle"
        parts.append(
            f'<text x="{xx:.1f}" y="{top + plot_h + 17}" font-size="11" '
            f'text-anchor="{anchor}">{_time_label(int(us), span)}</text>'
        )
    parts.append(
        f'<text x="{left + plot_w / 2:.0f}" y="{height - 6}" font-size="11" '
        'text-anchor="middle">arrival time (UTC)</text>'
    )
    parts.append(
        f'<text x="14" y="{top + plot_h / 2:.0f}" font-size="11" text-anchor="middle" '
        f'transform="rotate(-90 14 {top + plot_h / 2:.0f})">lag (ms)</text>'
    )
    runs: list[list[LagBucket]] = []
    for b in buckets:
        if runs and b.start_us - runs[-1][-1].start_us <= bucket_us:
            runs[-1].append(b)
        else:
            runs.append([b])
    for name, colour in _SERIES:
        for run in runs:
            points = [(x(b.start_us + bucket_us / 2), y(getattr(b, f"{name}_ms"))) for b in run]
            if len(points) > 1:
                coords = " ".join(f"{px:.1f},{py:.1f}" for px, py in points)
                parts.append(
                    f'<polyline class="series-{name}" fill="none" stroke="{colour}" '
                    f'stroke-width="2" points="{coords}"/>'
                )
            for px, py in points:
                parts.append(f'<circle cx="{px:.1f}" cy="{py:.1f}" r="2.5" fill="{colour}"/>')
    for i, (name, colour) in enumerate(_SERIES):
        lx = left + 10 + i * 70
        parts.append(
            f'<rect x="{lx}" y="{top + 6}" width="12" height="12" fill="{colour}"/>'
            f'<text x="{lx + 16}" y="{top + 16}" font-size="12">{name}</text>'
        )
    parts.append("</svg>")
    return "".join(parts)


def _cell(text: object, cls: str = "") -> str:
    attr = f' class="{cls}"' if cls else ""
    return f"<td{attr}>{html.escape(str(text))}</td>"


def render_html(report: AuditReport, limit: int = 2000) -> str:
    """One self-contained HTML page: the verdict, the per-instance table, lag per link
    (table and one inline SVG plot per link), and up to ``limit`` findings."""
    esc = html.escape
    out = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
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
    out.append("<h2>Per instance</h2><table><tr><th>instance</th>")
    out.extend(f"<th>{c}</th>" for c in CLASSES)
    out.append("</tr>")
    rows: list[tuple[str, Counts]] = [*report.counts.items(), ("total", report.total)]
    for name, counts in rows:
        cls = ' class="problem"' if counts.problems else ""
        out.append(f"<tr{cls}>{_cell(name)}")
        out.extend(_cell(getattr(counts, c)) for c in CLASSES)
        out.append("</tr>")
    out.append("</table>")

    out.append("<h2>Replication lag per link</h2>")
    out.append(
        '<p class="note">Lag = the receiving instance\'s local timestamp minus the origin '
        "timestamp, for every record it stored from the sender (the last hop of the "
        f"record's path); buckets of {report.bucket_us / 1000:g} ms by arrival time. "
        "Timestamps come from different hosts' clocks.</p>"
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
                f"{_chart(link, report.bucket_us, x0, x1)}</figure>"
            )
    else:
        out.append("<p>No replicated records in the audited journals.</p>")

    out.append("<h2>Findings</h2>")
    if not report.findings:
        out.append("<p>None.</p>")
    else:
        shown = report.findings[:limit]
        if len(shown) < len(report.findings):
            out.append(
                f'<p class="note">The first {len(shown)} of {len(report.findings)}; the '
                "JSON report lists them all.</p>"
            )
        for group in report.left_out:
            out.append(f'<p class="note">Not in the report: {html.escape(str(group))}.</p>')
        out.append(
            '<table><tr><th>class</th><th class="text">instance</th>'
            '<th class="text">bookmark</th><th class="text">topic</th>'
            '<th class="text">origin</th><th class="text">txids</th>'
            '<th class="text">expected path</th><th class="text">detail</th></tr>'
        )
        for f in shown:
            out.append(
                '<tr class="problem">'
                + _cell(f.kind)
                + _cell(f.instance)
                + _cell(f.bookmark, "text")
                + _cell(f.topic, "text")
                + _cell(f.origin, "text")
                + _cell(", ".join(map(str, f.txids)), "text")
                + _cell(f.expected_path or "(none: must not be there)", "text")
                + _cell(f.detail, "text")
                + "</tr>"
            )
        out.append("</table>")
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
        run=dict(doc.get("run", {})),
        left_out=tuple(FindingsLeftOut(**g) for g in doc.get("findings_left_out", [])),
    )
