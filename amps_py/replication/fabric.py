"""Fabric topology check (pure): load every instance of a replication fabric, work out
where a message published at each instance goes, and flag what would go wrong.

``amps-py config fabric DIR_OR_FILES...`` prints :meth:`Fabric.report`.

How the check models the fabric:

* Every ``Replication/Destination`` becomes a :class:`Link` from its instance to the
  instances its ``InetAddr`` list reaches, matched against the instances' replication
  listeners (``0.0.0.0``, ``::``, ``localhost`` and loopback addresses count as the same
  host; a listener on all interfaces is also reached through a host name whose first
  label is the instance name, e.g. ``chi-1.example.com``). The first address is the
  primary, the others failover members.
* A member that the server would refuse is no route: a Group that does not match, or a
  failed validation check. Validation runs :func:`amps_py.replication.validation.validate`
  on the topics the link describes, exactly as the downstream does on connect.
* Whether a message goes over a link is decided by
  :meth:`amps_py.replication.routing.Route.accepts`, with the origin and path the server
  would give it (path: the ``(instance, group)`` hops before the current instance, origin
  first). The rules are never restated here.
* :func:`simulate` walks the links breadth first: fewer hops arrive first, the first
  arrival is stored (and forwarded), a later arrival at an instance that already has the
  message is an *extra copy*: harmless (dedup drops it), counted as a statistic.
* Normal operation connects every link to its primary member. For failover, the
  simulation is repeated with each other instance down (links whose primary is down use
  their next member), which tells "never reached" apart from "reached only while X is
  down".
* Content filters: a message on a filtered topic reaches the instances whose filters
  match. Reachability is worked out as if every filter matched (the same Route, built
  from the destination without its filters, with an empty JSON object ``{}`` as
  payload), and the filters met along each path are printed.

Topic patterns (``.*``, ``orders-.*``) are simulated with a sample topic name that the
pattern matches (``sample``, ``orders-``...); :meth:`Fabric.report` also takes concrete
topic names.

The parts: :mod:`~amps_py.replication.fabric_model` (links, propagation,
:func:`simulate`), :mod:`~amps_py.replication.fabric_loading` (configs and address
resolution), :mod:`~amps_py.replication.fabric_report` (the text report); this module
holds the checks and re-exports the names of the others.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from amps_py.config import InstanceConfig, ReplicationTopic
from amps_py.replication.fabric_loading import load_configs, resolve_links
from amps_py.replication.fabric_model import (
    Arrival,
    Finding,
    Link,
    Member,
    Propagation,
    TopicCase,
    simulate,
)
from amps_py.replication.fabric_report import render_report

__all__ = [
    "Arrival",
    "Fabric",
    "Finding",
    "Link",
    "Member",
    "Propagation",
    "TopicCase",
    "load_fabric",
    "simulate",
]


# ------------------------------------------------------------------------- the fabric


@dataclass(eq=False)
class Fabric:
    """The instances of a fabric (in load order) and their resolved links."""

    instances: dict[str, InstanceConfig]
    links: dict[str, tuple[Link, ...]]
    problems: tuple[Finding, ...] = ()  # found while resolving addresses and groups
    unsampled: tuple[str, ...] = field(default=(), init=False)
    _findings: dict[tuple[TopicCase, ...], tuple[Finding, ...]] = field(
        default_factory=dict, init=False, repr=False
    )

    # ------------------------------------------------------------------ topics
    def topic_cases(self) -> tuple[TopicCase, ...]:
        """Every replicated Topic entry of the fabric (first seen first), each with a
        sample topic name it matches."""
        seen: dict[tuple[str | None, str], None] = {}
        for links in self.links.values():
            for link in links:
                for t in link.destination.topics:
                    seen.setdefault((t.name, t.message_type), None)
        cases: list[TopicCase] = []
        unsampled: list[str] = []
        for name, mt in seen:
            label = f"{name if name is not None else '(every topic)'} ({mt})"
            sample = _sample_topic(ReplicationTopic(name, mt))
            if sample is None:
                unsampled.append(label)
            else:
                cases.append(TopicCase(label, sample, mt))
        self.unsampled = tuple(unsampled)
        return tuple(cases)

    def journals(self, instance: str, topic: str, message_type: str) -> bool:
        tl = self.instances[instance].transaction_log
        return tl is not None and tl.journals(topic, message_type)

    # ------------------------------------------------------------------ checks
    def findings(self, cases: Sequence[TopicCase] | None = None) -> list[Finding]:
        """Every finding: link problems, failover pairs, sync across sites, and the
        instances a replicated topic cannot reach. Errors first."""
        key = tuple(self.topic_cases() if cases is None else cases)
        cached = self._findings.get(key)
        if cached is not None:
            return list(cached)
        out: list[Finding] = list(self.problems)
        out.extend(self._failover_pair_findings())
        out.extend(self._sync_across_sites_findings())
        for case in key:
            out.extend(self._unreachable_findings(case))
        result = _dedupe(sorted(out, key=lambda f: f.level != "error"))
        self._findings[key] = tuple(result)
        return result

    def _failover_pair_findings(self) -> Iterable[Finding]:
        pairs: dict[tuple[str, str], list[Link]] = {}
        for links in self.links.values():
            for link in links:
                targets = link.targets
                for a in targets:
                    for b in targets:
                        if a != b and self.instances[a].group == self.instances[b].group:
                            pairs.setdefault((a, b), []).append(link)
        for (a, b), listing in pairs.items():
            if any(b in back.targets for back in self.links[a]):
                continue
            where = ", ".join(f"{link.source.name}'s Destination {link.name}" for link in listing)
            groups = sorted({link.source.group for link in listing})
            yield Finding(
                "warning",
                a,
                "",
                f"{a} and {b} (Group {self.instances[a].group}) are failover members of "
                f"{where}, but {a} has no Destination to {b}: what {a} receives while it "
                f"is the member in use never reaches {b}, and clients failing over to {b} "
                "miss it (missing back replication)",
                f"add a Destination to {b} (Group {self.instances[b].group}) on {a}, with "
                f"PassThrough for {', '.join(groups)}",
            )

    def _sync_across_sites_findings(self) -> Iterable[Finding]:
        for name, links in self.links.items():
            source = self.instances[name]
            for link in links:
                if not link.destination.sync:
                    continue
                remote = [
                    t
                    for t in link.targets
                    if self.instances[t].group != source.group
                    and _is_site(self.instances[t])
                    and _is_site(source)
                ]
                if remote:
                    groups = sorted({self.instances[t].group for t in remote})
                    yield Finding(
                        "warning",
                        name,
                        "",
                        f"Destination {link.name} is sync to {', '.join(remote)} in Group "
                        f"{', '.join(groups)}, another site than {name} (Group "
                        f"{source.group}): a wide-area sync link puts the remote site's "
                        "latency (and its outages) on every persisted ack",
                        f"make Destination {link.name} async (SyncType async); keep sync "
                        "for partners at the same site, which clients fail over between",
                    )

    def _unreachable_findings(self, case: TopicCase) -> Iterable[Finding]:
        """Instances journaling the topic that a message published elsewhere does not
        reach in normal operation; one finding per instance and failover condition,
        naming every origin concerned."""
        missed: dict[tuple[str, tuple[str, ...]], list[Propagation]] = {}
        for origin in self.instances:
            if not self.journals(origin, case.topic, case.message_type):
                continue
            prop = simulate(self, origin, case.topic, case.message_type)
            for target in self.instances:
                if target in prop.reached:
                    continue
                if not self.journals(target, case.topic, case.message_type):
                    continue
                missed.setdefault((target, prop.only_while_down(target)), []).append(prop)
        for (target, only), props in missed.items():
            origins = ", ".join(p.origin for p in props)
            if only:
                reach = f"reaches it only while {' or '.join(only)} is down"
            else:
                reach = "never reaches it, not even while a failover member stands in"
            hints: dict[str, int] = {}
            for prop in props:
                for rank, hint in self._reach_hints(prop, target, case):
                    hints[hint] = min(rank, hints.get(hint, rank))
            best = sorted(hints, key=lambda h: hints[h])[:2]
            yield Finding(
                "warning",
                target,
                case.label,
                f"{target} journals {case.label} but a message published at {origins} "
                f"{reach} (unreachable in normal operation)",
                "; or ".join(best),
            )

    def _reach_hints(
        self, prop: Propagation, target: str, case: TopicCase
    ) -> Iterable[tuple[int, str]]:
        """Ways to make ``prop`` reach ``target``, ranked (0 first): a PassThrough on
        the target's partner, a Destination on the origin, other PassThroughs."""
        group = self.instances[target].group
        found = False
        for arrival in prop.arrivals:
            for link in self.links[arrival.instance]:
                refused = [m for m in link.members if m.instance == target and m.refused]
                if refused:
                    found = True
                    yield (
                        0,
                        f"fix {arrival.instance}'s Destination {link.name}, which {target} "
                        f"refuses ({refused[0].refused}: see the error)",
                    )
                    continue
                if link.name == target and not link.targets:
                    found = True
                    yield (
                        0,
                        f"fix the InetAddr of {arrival.instance}'s Destination {link.name} "
                        "(it reaches no instance: see the error)",
                    )
                    continue
                if target not in link.targets:
                    continue
                active = link.active(frozenset())
                if active is not None and active[1].instance != target:
                    continue  # a failover member only: its partner should forward
                rank = 0 if self.instances[arrival.instance].group == group else 2
                if arrival.path and not link.route.passes_through(arrival.path[-1][1]):
                    found = True
                    passed = re.escape(arrival.path[-1][1])
                    yield (
                        rank,
                        f"add <PassThrough>^{passed}$</PassThrough> to "
                        f"{arrival.instance}'s Destination {link.name}",
                    )
                elif not link.destination.replicates(case.topic, case.message_type):
                    found = True
                    yield rank, f"add the topic to {arrival.instance}'s Destination {link.name}"
        if not any(target in link.targets for link in self.links[prop.origin]):
            found = True
            yield 1, f"add a Destination to {target} on {prop.origin}"
        if not found:
            yield (
                3,
                f"add a Destination to {target} on {prop.origin}, or a PassThrough for "
                f"{prop.origin}'s Group {self.instances[prop.origin].group} on an "
                f"instance that receives the message and replicates to {target}",
            )

    # ------------------------------------------------------------------ report
    def cases_for(self, topics: Sequence[tuple[str, str]] = ()) -> tuple[TopicCase, ...]:
        """Concrete ``(name, message type)`` topics as cases; without any, a sample of
        every replicated topic pattern (:meth:`topic_cases`)."""
        if topics:
            return tuple(TopicCase(f"{name} ({mt})", name, mt) for name, mt in topics)
        return self.topic_cases()

    def report(self, topics: Sequence[tuple[str, str]] = ()) -> str:
        """The human-readable report: per instance its destinations and the
        propagation tree of each replicated topic, then the findings, then
        ``N warnings, M errors``. ``topics`` ((name, message type) pairs) replaces the
        sampled topic patterns with concrete topics."""
        return render_report(self, topics)


# ------------------------------------------------------------------------- loading


def load_fabric(paths: Iterable[str | Path]) -> Fabric:
    """Load the configs of a fabric: files, or directories scanned for ``*.xml``.

    Raises:
        ConfigError: a file does not load (the problems of every file at once), a
            directory holds no ``*.xml``, or two files name the same instance.
    """
    return build_fabric(load_configs(paths))


def build_fabric(configs: Iterable[InstanceConfig]) -> Fabric:
    """Resolve the destinations of loaded configs (names must be unique)."""
    instances, links, problems = resolve_links(configs)
    return Fabric(instances, links, problems)


# ------------------------------------------------------------------------- helpers


def _is_site(cfg: InstanceConfig) -> bool:
    """Whether the instance's Group names a site (set explicitly, not its own name)."""
    return cfg.group != cfg.name


def _dedupe(findings: Iterable[Finding]) -> list[Finding]:
    return list(dict.fromkeys(findings))


_FILL_ANY = "sample"


def _sample_topic(entry: ReplicationTopic) -> str | None:
    """A topic name ``entry`` matches, for simulating a pattern; ``None`` if none of a
    few simple guesses matches (the report then asks for a concrete ``--topic``)."""
    if entry.name is None:
        return _FILL_ANY
    name = re.sub(r"^\(\?[aiLmsux]+\)", "", entry.name)  # leading inline flags
    cores = [name]
    if "(" not in name and "[" not in name and "\\" not in name:
        cores.extend(name.split("|"))  # top-level alternatives
    guesses: list[str] = []
    for core in cores:
        core = core.removeprefix("^")
        if core.endswith("$") and not core.endswith("\\$"):
            core = core[:-1]
        for fill in ("", _FILL_ANY):
            guesses.append(_guess(core, fill))
    guesses.extend((_FILL_ANY, entry.name))
    for guess in guesses:
        if guess and entry.matches(guess, entry.message_type):
            return guess
    return None


def _guess(pattern: str, fill: str) -> str:
    """``pattern`` with its simplest regex constructs replaced by text they match."""
    s = re.sub(r"\(\?[:=!]", "(", pattern)
    s = re.sub(r"\[\^[^\]]*\]", "z", s)
    s = re.sub(r"\[([^\]])[^\]]*\]", r"\1", s)
    s = re.sub(r"\(([^()|]*)(\|[^()]*)?\)", r"\1", s)
    s = re.sub(r"\\d", "0", s)
    s = re.sub(r"\\w", "a", s)
    s = re.sub(r"\\s", " ", s)
    s = re.sub(r"\.[*+?]|\.\{[0-9,]*\}", fill, s)
    s = re.sub(r"(?<!\\)\.", "x", s)
    s = re.sub(r"([^\\])\{([0-9]+)(,[0-9]*)?\}", lambda m: m.group(1) * int(m.group(2)), s)
    s = re.sub(r"(?<!\\)[*?+]", "", s)
    return re.sub(r"\\(.)", r"\1", s)
