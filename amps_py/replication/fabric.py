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
"""

from __future__ import annotations

import dataclasses
import ipaddress
import re
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from amps_py import reasons
from amps_py.config import (
    ConfigError,
    ConfigProblem,
    DestinationConfig,
    InstanceConfig,
    ReplicationTopic,
    load_config,
)
from amps_py.replication.routing import Route
from amps_py.replication.validation import TopicDescriptor, validate

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

Level = Literal["warning", "error"]
Path_ = tuple[tuple[str, str], ...]

_EMPTY_JSON = b"{}"
_WILDCARD_HOSTS = frozenset({"0.0.0.0", "::"})
_LOCAL_NAMES = frozenset({"0.0.0.0", "::", "localhost"})


# ------------------------------------------------------------------------- results


@dataclass(frozen=True)
class Finding:
    """A problem in the fabric.

    Attributes:
        level: ``warning`` (messages do not go where they should) or ``error`` (a link
            that cannot work as configured).
        instance: the instance whose config the finding is about.
        topic: the replicated topic (``pattern (type)``), or ``""`` for a whole link.
        message: what is wrong.
        fix: how to fix it.
    """

    level: Level
    instance: str
    topic: str
    message: str
    fix: str

    def __str__(self) -> str:
        topic = f" [{self.topic}]" if self.topic else ""
        return f"{self.level}: {self.instance}{topic}: {self.message}\n    fix: {self.fix}"


@dataclass(frozen=True)
class Member:
    """One ``InetAddr`` of a destination and the instance listening there (if any)."""

    host: str
    port: int
    instance: str | None
    refused: str | None = None  # why the instance would refuse the link, if it would
    #: no address: the link runs back over the connection ``instance`` opens here
    back: bool = False

    @property
    def address(self) -> str:
        if self.back:
            return f"back over {self.instance}'s connection"
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.port}"

    @property
    def usable(self) -> bool:
        return self.instance is not None and self.refused is None


@dataclass(eq=False)
class Link:
    """A destination of ``source``, resolved to the instances it reaches."""

    source: InstanceConfig
    destination: DestinationConfig
    members: tuple[Member, ...]
    route: Route = field(init=False, repr=False)
    open_route: Route = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self.route = Route(self.destination)
        # The same rules with every Filter removed: "reaches when the filters match".
        unfiltered = tuple(dataclasses.replace(t, filter=None) for t in self.destination.topics)
        self.open_route = Route(dataclasses.replace(self.destination, topics=unfiltered))

    @property
    def name(self) -> str:
        return self.destination.name

    @property
    def targets(self) -> tuple[str, ...]:
        """The known instances among the members, in priority order, without repeats."""
        out: list[str] = []
        for m in self.members:
            if m.instance is not None and m.instance not in out:
                out.append(m.instance)
        return tuple(out)

    def active(self, down: frozenset[str]) -> tuple[int, Member] | None:
        """The member the link connects to while the instances in ``down`` are down:
        the first address, in order, where a known instance is up and accepts it."""
        for index, m in enumerate(self.members):
            if m.usable and m.instance not in down:
                return index, m
        return None

    def filters(self, topic: str, message_type: str) -> tuple[str, ...]:
        """The Filters a message on ``topic`` meets on this link (empty: unfiltered)."""
        entries = [t for t in self.destination.topics if t.matches(topic, message_type)]
        if not entries or any(t.filter is None for t in entries):
            return ()
        return tuple(t.filter for t in entries if t.filter is not None)


@dataclass(frozen=True)
class Arrival:
    """How a message got to ``instance`` (first arrival, or an extra copy).

    ``path`` is the path the message carries at ``instance``: the ``(instance, group)``
    hops before it, origin first (empty at the origin)."""

    instance: str
    path: Path_
    sender: str | None = None  # None at the origin
    link: str | None = None  # the sender's destination name
    sync_type: str | None = None
    member_index: int = 0  # 0: the destination's primary address; >0: failover member
    filters: tuple[str, ...] = ()  # filters on the last hop
    passed_group: str | None = None  # set when forwarded by PassThrough of this group

    @property
    def hops(self) -> tuple[str, ...]:
        """``instance <- sender <- ... <- origin``."""
        return (self.instance, *(name for name, _ in reversed(self.path)))

    def describe(self) -> str:
        if self.sender is None:
            return f"{self.instance} (published here)"
        detail = [f"{self.link} {self.sync_type}"]
        if self.member_index:
            detail.append(f"failover member {self.member_index + 1}")
        if self.passed_group is not None:
            detail.append(f"passes {self.passed_group}")
        detail.extend(f"filter {f}" for f in self.filters)
        return f"{' <- '.join(self.hops)}  [{', '.join(detail)}]"


@dataclass(frozen=True)
class Propagation:
    """Where one message published at ``origin`` goes, with the instances in ``down``
    down. ``if_down`` holds the same simulation with each other instance down (filled
    for the normal case only)."""

    origin: str
    topic: str
    message_type: str
    down: frozenset[str]
    journaled: bool
    arrivals: tuple[Arrival, ...]
    extra_copies: tuple[Arrival, ...]
    if_down: Mapping[str, Propagation] = field(default_factory=dict)

    @property
    def reached(self) -> frozenset[str]:
        return frozenset(a.instance for a in self.arrivals)

    def arrival(self, instance: str) -> Arrival | None:
        for a in self.arrivals:
            if a.instance == instance:
                return a
        return None

    @property
    def filtered(self) -> bool:
        return any(a.filters for a in self.arrivals)

    def only_while_down(self, instance: str) -> tuple[str, ...]:
        """The instances whose failure lets the message reach ``instance`` when normal
        operation does not."""
        if instance in self.reached:
            return ()
        return tuple(x for x, p in self.if_down.items() if instance in p.reached)


@dataclass(frozen=True)
class TopicCase:
    """A topic to simulate: a concrete ``topic`` standing for ``label``."""

    label: str
    topic: str
    message_type: str


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
        cases = self.cases_for(topics)
        lines: list[str] = []
        names = list(self.instances)
        lines.append(f"fabric: {len(names)} instances: {', '.join(names)}")
        extra_total = 0
        for name in names:
            lines.append("")
            extra_total += self._report_instance(name, cases, lines)
        for label in () if topics else self.unsampled:
            lines.append("")
            lines.append(
                f"note: no sample topic matches the pattern {label}; "
                "check it with --topic NAME[:TYPE]"
            )
        findings = self.findings(cases)
        lines.append("")
        lines.append(f"extra copies (duplicate arrivals, dropped by dedup): {extra_total}")
        if findings:
            lines.append("findings:")
            lines.extend(f"  {line}" for f in findings for line in str(f).splitlines())
        warnings = sum(1 for f in findings if f.level == "warning")
        errors = sum(1 for f in findings if f.level == "error")
        lines.append(f"{warnings} warnings, {errors} errors")
        return "\n".join(lines) + "\n"

    def _report_instance(self, name: str, cases: Sequence[TopicCase], lines: list[str]) -> int:
        cfg = self.instances[name]
        listener = cfg.replication_transport
        tl = cfg.transaction_log
        journal = ", ".join(f"{t.name} ({t.message_type})" for t in tl.topics) if tl else "nothing"
        lines.append(f"{name} (Group {cfg.group})  {cfg.source}")
        lines.append(
            f"  replication listener {listener.address if listener else 'none'}; "
            f"journals {journal or 'nothing'}"
        )
        if not self.links[name]:
            lines.append("  no destinations")
        for link in self.links[name]:
            first, second = _describe_link(link, self.instances)
            lines.append(f"  -> {first}")
            lines.append(f"  {second}")
        extra = 0
        for case in cases:
            prop = simulate(self, name, case.topic, case.message_type)
            extra += len(prop.extra_copies)
            head = f"  topic {case.label}"
            if case.topic != case.label.rsplit(" (", 1)[0]:
                head += f", simulated as {case.topic!r}"
            if not prop.journaled:
                lines.append(f"{head}: not journaled here, so never replicated from here")
                continue
            filtered = " (the instances whose filters match)" if prop.filtered else ""
            lines.append(
                f"{head}: reaches {len(prop.reached)} of {len(self.instances)}{filtered}, "
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


# ------------------------------------------------------------------------- loading


def load_fabric(paths: Iterable[str | Path]) -> Fabric:
    """Load the configs of a fabric: files, or directories scanned for ``*.xml``.

    Raises:
        ConfigError: a file does not load (the problems of every file at once), a
            directory holds no ``*.xml``, or two files name the same instance.
    """
    files: list[Path] = []
    problems: list[ConfigProblem] = []
    for p in paths:
        path = Path(p)
        if path.is_dir():
            found = sorted(path.glob("*.xml"))
            if not found:
                problems.append(
                    ConfigProblem(
                        str(path),
                        None,
                        "",
                        "the directory holds no *.xml config",
                        "name the config files or a directory that holds them",
                    )
                )
            files.extend(found)
        else:
            files.append(path)
    configs: list[InstanceConfig] = []
    seen_files: set[Path] = set()
    for f in files:
        key = f.resolve()
        if key in seen_files:
            continue
        seen_files.add(key)
        try:
            configs.append(load_config(f))
        except ConfigError as exc:
            problems.extend(exc.problems)
        except OSError as exc:
            problems.append(
                ConfigProblem(
                    str(f), None, "", f"cannot read it: {exc.strerror or exc}", "fix the path"
                )
            )
    by_name: dict[str, InstanceConfig] = {}
    for cfg in configs:
        other = by_name.get(cfg.name)
        if other is not None:
            problems.append(
                ConfigProblem(
                    cfg.source,
                    None,
                    "AMPSConfig/Name",
                    f"instance name {cfg.name!r} is also used by {other.source}",
                    "give every instance of the fabric its own Name",
                )
            )
        else:
            by_name[cfg.name] = cfg
    if problems:
        raise ConfigError(problems)
    return build_fabric(by_name.values())


def build_fabric(configs: Iterable[InstanceConfig]) -> Fabric:
    """Resolve the destinations of loaded configs (names must be unique)."""
    instances = {cfg.name: cfg for cfg in configs}
    problems: list[Finding] = []
    links: dict[str, tuple[Link, ...]] = {}
    for cfg in instances.values():
        out: list[Link] = []
        for dest in cfg.replication:
            members = tuple(
                _resolve(cfg, dest, host, port, instances, problems)
                for host, port in dest.inet_addrs
            )
            link = Link(cfg, dest, members)
            link.members = tuple(_check_member(link, m, instances, problems) for m in members)
            out.append(link)
        links[cfg.name] = tuple(out)
    for own in links.values():
        for link in own:
            if not link.destination.inet_addrs:
                _resolve_back(link, links, instances, problems)
    return Fabric(instances, links, tuple(problems))


def _back_peers(
    link: Link, links: Mapping[str, tuple[Link, ...]], instances: Mapping[str, InstanceConfig]
) -> list[str]:
    """Instances that open a connection to ``link``'s source on which this destination
    (without InetAddr) would replicate back: the server's rule in
    ``ReplicationManager.back_destination``."""
    source, dest = link.source, link.destination
    peers: list[str] = []
    for other, their_links in links.items():
        if other == source.name:
            continue
        dials_here = any(source.name in theirs.targets for theirs in their_links)
        if not dials_here:
            continue
        named = [d for d in source.replication if d.name == other]
        chosen = named[0] if named else None
        if chosen is None:
            group = instances[other].group
            chosen = next(
                (d for d in source.replication if not d.inet_addrs and d.group == group), None
            )
        if chosen is dest:
            peers.append(other)
    return peers


def _resolve_back(
    link: Link,
    links: Mapping[str, tuple[Link, ...]],
    instances: Mapping[str, InstanceConfig],
    problems: list[Finding],
) -> None:
    """Members of a destination without InetAddr: the peers whose connections it
    replicates back over (or a warning that nothing ever connects)."""
    cfg, dest = link.source, link.destination
    peers = _back_peers(link, links, instances)
    if not peers:
        problems.append(
            Finding(
                "warning",
                cfg.name,
                "",
                f"Destination {dest.name} has no InetAddr, so it only replicates back over "
                "a connection its peer opens, and no instance in this fabric with that name "
                f"(or Group {dest.group!r}) replicates to {cfg.name}: nothing is sent on it",
                f"give Destination {dest.name} the peer's replication address "
                f"(Transport/InetAddr), or add a Destination for {cfg.name} to the peer",
            )
        )
        return
    members = tuple(Member("", 0, peer, back=True) for peer in peers)
    link.members = tuple(_check_member(link, m, instances, problems) for m in members)


def _host_key(host: str) -> str:
    host = host.strip("[]").lower()
    if host in _LOCAL_NAMES:
        return "local"
    try:
        if ipaddress.ip_address(host).is_loopback:
            return "local"
    except ValueError:
        pass
    return host


def _resolve(
    cfg: InstanceConfig,
    dest: DestinationConfig,
    host: str,
    port: int,
    instances: Mapping[str, InstanceConfig],
    problems: list[Finding],
) -> Member:
    key = _host_key(host)
    exact: list[str] = []
    wildcard: list[str] = []
    clients: list[str] = []
    for other in instances.values():
        listener = other.replication_transport
        if listener is not None and listener.port == port:
            if _host_key(listener.host) == key:
                exact.append(other.name)
            elif listener.host in _WILDCARD_HOSTS:
                wildcard.append(other.name)
        for t in other.client_transports:
            if t.port == port and (_host_key(t.host) == key or t.host in _WILDCARD_HOSTS):
                clients.append(f"{other.name}'s client transport {t.name}")
    candidates = exact or wildcard
    if len(candidates) > 1:
        label = host.split(".")[0].lower()
        named = [c for c in candidates if c.lower() == label]
        candidates = named or candidates
    address = Member(host, port, None).address
    if len(candidates) == 1:
        return Member(host, port, candidates[0])
    if candidates:
        problems.append(
            Finding(
                "error",
                cfg.name,
                "",
                f"Destination {dest.name}: {address} is the replication listener of "
                f"{', '.join(candidates)}; the check cannot tell which one it reaches",
                "give each instance its own replication address, or name the host after "
                "the instance (chi-1.example.com for chi-1)",
            )
        )
        return Member(host, port, None)
    there = f" (that is {', '.join(clients)}, not a replication listener)" if clients else ""
    problems.append(
        Finding(
            "error",
            cfg.name,
            "",
            f"Destination {dest.name}: {address} matches no instance of the fabric{there} "
            "(unknown peer)",
            "point InetAddr at a replication listener (Transport of Type "
            "amps-replication) of an instance in the fabric, or add that instance's config "
            "to the check",
        )
    )
    return Member(host, port, None)


def _check_member(
    link: Link, member: Member, instances: Mapping[str, InstanceConfig], problems: list[Finding]
) -> Member:
    """The refusals the server would give: itself, Group mismatch, validation."""
    if member.instance is None:
        return member
    source, dest = link.source, link.destination
    target = instances[member.instance]
    where = f"Destination {dest.name} -> {target.name} ({member.address})"
    if target.name == source.name:
        problems.append(
            Finding(
                "error",
                source.name,
                "",
                f"{where} is this instance itself: the link is refused",
                f"point Destination {dest.name}'s InetAddr at another instance",
            )
        )
        return dataclasses.replace(member, refused=reasons.REPLICATES_TO_ITSELF)
    if dest.group is not None and dest.group != target.group:
        problems.append(
            Finding(
                "error",
                source.name,
                "",
                f"{where}: the Destination's Group is {dest.group!r} but {target.name} is "
                f"in Group {target.group!r}: the link would be refused (group mismatch)",
                f"set Destination {dest.name}'s Group to {target.group!r} (or fix the "
                f"InetAddr, or {target.name}'s Group)",
            )
        )
        return dataclasses.replace(member, refused=reasons.GROUP_MISMATCH)
    listener = target.replication_transport
    target_secure = listener is not None and listener.secure
    if dest.secure != target_secure:
        mine = "TLS (amps-replication-secure)" if dest.secure else "plain TCP (amps-replication)"
        theirs = "TLS" if target_secure else "plain TCP"
        problems.append(
            Finding(
                "error",
                source.name,
                "",
                f"{where}: the Destination speaks {mine} but {target.name}'s replication "
                f"transport expects {theirs}: the link cannot connect",
                f"make Destination {dest.name}'s Transport/Type match {target.name}'s "
                "replication transport Type",
            )
        )
        return dataclasses.replace(member, refused="transport mismatch")
    descriptors = [TopicDescriptor.from_wire(t) for t in link.route.describe_topics()]
    failures = validate(descriptors, target, source.name, source.group)
    for failure in failures:
        problems.append(
            Finding(
                "error",
                source.name,
                failure.topic,
                f"{where}: {target.name} would refuse the link: check {failure.check} "
                f"fails: {failure.problem}",
                failure.fix,
            )
        )
    if failures:
        return dataclasses.replace(member, refused=reasons.VALIDATION_FAILED)
    return member


# ------------------------------------------------------------------------- simulation


def simulate(
    fabric: Fabric,
    origin: str,
    topic: str,
    message_type: str = "json",
    *,
    down: Iterable[str] = (),
    payload: bytes | None = None,
    failover: bool = True,
) -> Propagation:
    """Where a message published at ``origin`` on ``topic`` goes.

    Breadth first over the links that connect (each to its first usable member that is
    not ``down``); :meth:`Route.accepts` decides each hop with the message's origin and
    path. Without ``payload``, content filters are taken to match (the filters are
    recorded per hop); with it, each hop applies its filters to ``payload`` as the
    server does for that message (the Spark audit's expectation for one message). With
    no ``down`` instances and ``failover`` true, ``if_down`` holds the simulation with
    each other instance down."""
    down_set = frozenset(down)
    if origin not in fabric.instances:
        raise KeyError(f"no instance {origin!r} in the fabric")
    journaled = fabric.journals(origin, topic, message_type)
    start = Arrival(origin, ())
    arrivals: list[Arrival] = [start]
    extra: list[Arrival] = []
    stored = {origin}
    queue = deque([start]) if journaled else deque()
    while queue:
        here = queue.popleft()
        cfg = fabric.instances[here.instance]
        for link in fabric.links[here.instance]:
            active = link.active(down_set)
            if active is None:
                continue
            index, member = active
            remote = member.instance
            assert remote is not None
            route = link.open_route if payload is None else link.route
            if not route.accepts(
                topic=topic,
                message_type=message_type,
                origin=origin,
                path=here.path,
                payload=_EMPTY_JSON if payload is None else payload,
                remote_name=remote,
            ):
                continue
            arrival = Arrival(
                remote,
                (*here.path, (cfg.name, cfg.group)),
                sender=cfg.name,
                link=link.name,
                sync_type=link.destination.sync_type,
                member_index=index,
                filters=link.filters(topic, message_type),
                passed_group=here.path[-1][1] if here.path else None,
            )
            if remote in stored:
                extra.append(arrival)
                continue
            stored.add(remote)
            arrivals.append(arrival)
            queue.append(arrival)
    if not journaled:
        arrivals = [start]
    if_down: dict[str, Propagation] = {}
    if not down_set and journaled and failover:
        for name in fabric.instances:
            if name != origin:
                if_down[name] = simulate(
                    fabric, origin, topic, message_type, down=(name,), payload=payload
                )
    return Propagation(
        origin,
        topic,
        message_type,
        down_set,
        journaled,
        tuple(arrivals),
        tuple(extra),
        if_down,
    )


# ------------------------------------------------------------------------- helpers


def _is_site(cfg: InstanceConfig) -> bool:
    """Whether the instance's Group names a site (set explicitly, not its own name)."""
    return cfg.group != cfg.name


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
