"""The text report of the fabric check (``amps-py config fabric``): per instance its
destinations and the propagation tree of each replicated topic, then the findings."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Protocol

from amps_py.config import InstanceConfig
from amps_py.replication.fabric_model import (
    Arrival,
    FabricView,
    Finding,
    Link,
    Propagation,
    TopicCase,
    simulate,
)


class ReportedFabric(FabricView, Protocol):
    """What the report reads of a :class:`~amps_py.replication.fabric.Fabric`."""

    @property
    def unsampled(self) -> tuple[str, ...]:
        """Topic patterns no sample topic was found for (set by its topic cases)."""
        ...

    def cases_for(self, topics: Sequence[tuple[str, str]] = ()) -> tuple[TopicCase, ...]:
        """Concrete ``(name, message type)`` topics as cases; without any, a sample of
        every replicated topic pattern."""
        ...

    def findings(self, cases: Sequence[TopicCase] | None = None) -> list[Finding]:
        """Every finding, errors first."""
        ...


def render_report(fabric: ReportedFabric, topics: Sequence[tuple[str, str]] = ()) -> str:
    """The text of :meth:`Fabric.report <amps_py.replication.fabric.Fabric.report>`."""
    cases = fabric.cases_for(topics)
    lines: list[str] = []
    names = list(fabric.instances)
    lines.append(f"fabric: {len(names)} instances: {', '.join(names)}")
    extra_total = 0
    for name in names:
        lines.append("")
        extra_total += _report_instance(fabric, name, cases, lines)
    for label in () if topics else fabric.unsampled:
        lines.append("")
        lines.append(
            f"note: no sample topic matches the pattern {label}; check it with --topic NAME[:TYPE]"
        )
    findings = fabric.findings(cases)
    lines.append("")
    lines.append(f"extra copies (duplicate arrivals, dropped by dedup): {extra_total}")
    if findings:
        lines.append("findings:")
        lines.extend(f"  {line}" for f in findings for line in str(f).splitlines())
    warnings = sum(1 for f in findings if f.level == "warning")
    errors = sum(1 for f in findings if f.level == "error")
    lines.append(f"{warnings} warnings, {errors} errors")
    return "\n".join(lines) + "\n"


def _report_instance(
    fabric: ReportedFabric, name: str, cases: Sequence[TopicCase], lines: list[str]
) -> int:
    cfg = fabric.instances[name]
    listener = cfg.replication_transport
    tl = cfg.transaction_log
    journal = ", ".join(f"{t.name} ({t.message_type})" for t in tl.topics) if tl else "nothing"
    lines.append(f"{name} (Group {cfg.group})  {cfg.source}")
    lines.append(
        f"  replication listener {listener.address if listener else 'none'}; "
        f"journals {journal or 'nothing'}"
    )
    if not fabric.links[name]:
        lines.append("  no destinations")
    for link in fabric.links[name]:
        first, second = _describe_link(link, fabric.instances)
        lines.append(f"  -> {first}")
        lines.append(f"  {second}")
    extra = 0
    for case in cases:
        prop = simulate(fabric, name, case.topic, case.message_type)
        extra += len(prop.extra_copies)
        head = f"  topic {case.label}"
        if case.topic != case.label.rsplit(" (", 1)[0]:
            head += f", simulated as {case.topic!r}"
        if not prop.journaled:
            lines.append(f"{head}: not journaled here, so never replicated from here")
            continue
        filtered = " (the instances whose filters match)" if prop.filtered else ""
        lines.append(
            f"{head}: reaches {len(prop.reached)} of {len(fabric.instances)}{filtered}, "
            f"{len(prop.extra_copies)} extra copies"
        )
        _tree(prop, prop.arrivals[0], 4, lines)
        for copy in prop.extra_copies:
            lines.append(f"    extra copy: {copy.describe()}")
        for down, alt in prop.if_down.items():
            normal = {a.instance: (a.sender, a.link) for a in prop.arrivals}
            changed = [a for a in alt.arrivals if normal.get(a.instance) != (a.sender, a.link)]
            missed = sorted(prop.reached - alt.reached - {down})
            for a in changed:
                lines.append(f"    if {down} is down: {a.describe()}")
            if missed:
                lines.append(
                    f"    if {down} is down: {', '.join(missed)} not reached until it is back"
                )
    return extra


def _describe_link(link: Link, instances: Mapping[str, InstanceConfig]) -> list[str]:
    dest = link.destination
    parts: list[str] = []
    for i, m in enumerate(link.members):
        who = f"{m.instance} (Group {instances[m.instance].group})" if m.instance else "unknown"
        text = f"{who} at {m.address}"
        if m.refused:
            text += f" REFUSED: {m.refused}"
        parts.append(text if i == 0 else f"failover {text}")
    target = ", ".join(parts) if parts else "no InetAddr (waits for the peer)"
    passthrough = ", ".join(dest.passthrough) if dest.passthrough else "none"
    topics = ", ".join(
        f"{t.name if t.name is not None else '(every topic)'} ({t.message_type})"
        + (f" filter {t.filter}" if t.filter else "")
        for t in dest.topics
    )
    return [
        f"{dest.name} ({dest.sync_type}) to {target}",
        f"   passthrough {passthrough}; topics {topics}",
    ]


def _tree(prop: Propagation, node: Arrival, indent: int, lines: list[str]) -> None:
    lines.append(" " * indent + node.describe())
    for child in prop.arrivals:
        if child.sender == node.instance and child.path[:-1] == node.path:
            _tree(prop, child, indent + 2, lines)
