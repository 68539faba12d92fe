"""The model of the fabric check (pure): the links between instances, a message's
propagation over them, and the findings.

:func:`simulate` walks the links of a :class:`~amps_py.replication.fabric.Fabric` breadth
first, deciding each hop with :meth:`amps_py.replication.routing.Route.accepts` (see
:mod:`amps_py.replication.fabric` for how the check models a fabric). Everything here is
re-exported by :mod:`amps_py.replication.fabric`.
"""

from __future__ import annotations

import dataclasses
from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Literal, Protocol

from amps_py.config import DestinationConfig, InstanceConfig
from amps_py.replication.routing import Route

Level = Literal["warning", "error"]
Path_ = tuple[tuple[str, str], ...]

_EMPTY_JSON = b"{}"

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


# ------------------------------------------------------------------------- simulation


class FabricView(Protocol):
    """What :func:`simulate` reads of a fabric
    (a :class:`~amps_py.replication.fabric.Fabric`)."""

    @property
    def instances(self) -> Mapping[str, InstanceConfig]:
        """The instances by name, in load order."""
        ...

    @property
    def links(self) -> Mapping[str, tuple[Link, ...]]:
        """Each instance's resolved links (its destinations)."""
        ...

    def journals(self, instance: str, topic: str, message_type: str) -> bool:
        """Whether ``instance`` journals ``topic`` of ``message_type``."""
        ...


def simulate(
    fabric: FabricView,
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
        if_down = _with_each_down(fabric, origin, topic, message_type, payload)
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


def _with_each_down(
    fabric: FabricView, origin: str, topic: str, message_type: str, payload: bytes | None
) -> dict[str, Propagation]:
    """:func:`simulate` with each instance other than ``origin`` down, by its name."""
    if_down: dict[str, Propagation] = {}
    for name in fabric.instances:
        if name != origin:
            if_down[name] = simulate(
                fabric, origin, topic, message_type, down=(name,), payload=payload
            )
    return if_down
