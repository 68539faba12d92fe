"""Loading a fabric's configs and resolving its destinations into links (pure).

Each ``Replication/Destination`` address is matched against the instances' replication
listeners (see :mod:`amps_py.replication.fabric` for the rules), and each member gets
the refusal the server would give it: itself, a Group or transport mismatch, a failed
:func:`amps_py.replication.validation.validate`.
"""

from __future__ import annotations

import dataclasses
import ipaddress
from collections.abc import Iterable, Mapping
from pathlib import Path

from amps_py import reasons
from amps_py.config import (
    ConfigError,
    ConfigProblem,
    DestinationConfig,
    InstanceConfig,
    load_config,
)
from amps_py.replication.fabric_model import Finding, Link, Member
from amps_py.replication.validation import TopicDescriptor, validate

_WILDCARD_HOSTS = frozenset({"0.0.0.0", "::"})
_LOCAL_NAMES = frozenset({"0.0.0.0", "::", "localhost"})


def load_configs(paths: Iterable[str | Path]) -> list[InstanceConfig]:
    """Load the configs of a fabric: files, or directories scanned for ``*.xml``;
    one config per instance name.

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
    return list(by_name.values())


def resolve_links(
    configs: Iterable[InstanceConfig],
) -> tuple[dict[str, InstanceConfig], dict[str, tuple[Link, ...]], tuple[Finding, ...]]:
    """Resolve the destinations of loaded configs (names must be unique) into
    links: ``(instances by name, each one's links, the problems met)``: an
    address that reaches no instance or several, and what the server would refuse
    (itself, a Group or transport mismatch, a failed validation)."""
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
    return instances, links, tuple(problems)


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
    descriptors = [
        TopicDescriptor.from_wire(t)
        for t in link.route.describe_topics(source.sow_topics, source.queues)
    ]
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
