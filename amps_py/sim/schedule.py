"""One simulated schedule: a fabric, its publishers, faults drawn from a seed, and
the checker at the end (docs/SIMULATION.md).

:func:`run_schedule` builds two instances replicating ``orders`` to each other
(sync), starts HA publishers that fail over between them, and applies a plan of
faults drawn from the seed (partitions, resets, crashes and restarts, half-open
links, slow readers) one after another while they publish. Then it heals the
network, restarts what is down, waits for every publish to be persisted, replays
each instance's journal from EPOCH and hands what it saw to the checker.

Everything runs in one trio run on a virtual clock, with trio's scheduling order,
the network's latencies and the plan drawn from the seed: the same seed gives the
same trace (:attr:`Result.digest`).
"""

from __future__ import annotations

import random
import shutil
import tempfile
from collections.abc import Callable, Sequence
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

import orjson
import trio
import trio.testing

from amps_py import net, offload
from amps_py.client import MemoryPublishStore, open_client, open_ha_client
from amps_py.sim.checker import Observations, check
from amps_py.sim.determinism import seeded_scheduling
from amps_py.sim.fabric import SimInstance, fabric_xml
from amps_py.sim.network import SimNetwork
from amps_py.sim.trace import Trace
from amps_py.sim.wallclock import virtual_wall_clock
from txlog.identity import publisher_hash

__all__ = ["Fault", "Result", "draw_plan", "run_schedule"]

TOPIC: Final = "orders"
INSTANCES: Final = ("a", "b")
PUBLISHERS: Final = ("p1", "p2")
#: virtual seconds allowed, once the faults healed, for every publish to be persisted
SETTLE_SECONDS: Final = 120.0
#: virtual seconds a whole schedule may take before it counts as hung
HUNG_SECONDS: Final = 900.0


@dataclass(frozen=True)
class Fault:
    """One fault of a plan: ``kind`` on ``target`` at ``at`` (virtual seconds after
    the start), for ``duration`` seconds."""

    at: float
    kind: str
    target: tuple[str, ...]
    duration: float

    def describe(self) -> str:
        return f"{self.kind} {','.join(self.target)} at {self.at:.3f}s for {self.duration:.3f}s"


FAULT_KINDS: Final = ("partition", "reset", "crash", "vanish", "slow", "isolate-client")


def draw_plan(rng: random.Random, max_faults: int = 3) -> list[Fault]:
    """Up to ``max_faults`` faults, one after another, drawn from ``rng``."""
    plan = []
    at = rng.uniform(0.0, 0.3)
    for _ in range(rng.randint(0, max_faults)):
        kind = rng.choice(FAULT_KINDS)
        duration = rng.uniform(0.05, 3.0)
        if kind in ("partition", "crash", "vanish"):
            target: tuple[str, ...] = (rng.choice(INSTANCES),)
        elif kind == "reset":
            target = tuple(sorted(rng.sample([*INSTANCES, *PUBLISHERS], 2)))
        else:
            target = (rng.choice(PUBLISHERS),)
        plan.append(Fault(round(at, 6), kind, target, round(duration, 6)))
        at += duration + rng.uniform(0.0, 1.0)
    return plan


@dataclass
class Result:
    """What one schedule came to."""

    seed: int
    plan: list[Fault]
    violations: list[str]
    trace: Trace
    observations: Observations
    digest: str = ""


@dataclass
class _World:
    rng: random.Random
    network: SimNetwork
    instances: dict[str, SimInstance]
    seen: Observations = field(default_factory=Observations)
    healed: trio.Event = field(default_factory=trio.Event)

    def record(self, node: str, kind: str, detail: str = "") -> None:
        self.network.trace.record(trio.current_time(), node, kind, detail)


def run_schedule(
    seed: int,
    *,
    messages: int = 20,
    max_faults: int = 3,
    inject: Callable[[], ExitStack] | None = None,
    workdir: Path | None = None,
    keep: Sequence[int] | None = None,
) -> Result:
    """Run schedule ``seed`` and check it. ``inject`` (for the simulator's own test)
    returns an ExitStack that plants a bug for the duration of the run; ``keep``
    (when shrinking a failure) keeps only those faults of the seed's plan, by index."""
    rng = random.Random(seed)
    plan = draw_plan(random.Random(rng.getrandbits(64)), max_faults)
    if keep is not None:
        plan = [fault for index, fault in enumerate(plan) if index in keep]
    trace = Trace()
    network = SimNetwork(random.Random(rng.getrandbits(64)), trace)
    base = Path(tempfile.mkdtemp(prefix=f"amps-py-sim-{seed}-", dir=workdir))
    try:
        instances = {}
        for name in INSTANCES:
            peers = [peer for peer in INSTANCES if peer != name]
            config = base / f"{name}.xml"
            config.write_text(fabric_xml(name, peers, base / f"{name}-journal", TOPIC))
            instances[name] = SimInstance(name, config, network)
        world = _World(random.Random(rng.getrandbits(64)), network, instances)
        with ExitStack() as stack:
            if inject is not None:
                stack.enter_context(inject())
            stack.enter_context(seeded_scheduling(seed))
            stack.enter_context(virtual_wall_clock())
            clock = trio.testing.MockClock(autojump_threshold=0)
            trio.run(_main, world, plan, messages, clock=clock)
    finally:
        shutil.rmtree(base, ignore_errors=True)
    result = Result(seed, plan, check(world.seen), trace, world.seen)
    result.digest = trace.digest()
    return result


async def _main(world: _World, plan: list[Fault], messages: int) -> None:
    with offload.inline(), trio.move_on_after(HUNG_SECONDS) as hung:
        async with trio.open_nursery() as nursery:
            for instance in world.instances.values():
                await instance.start(nursery)
            async with trio.open_nursery() as actors:
                for name in PUBLISHERS:
                    actors.start_soon(_publisher, world, name, messages)
                actors.start_soon(_apply_plan, world, plan, nursery)
            for name, instance in sorted(world.instances.items()):
                world.seen.replayed[name] = await _replay(world, instance)
            nursery.cancel_scope.cancel()
    if hung.cancelled_caught:
        world.seen.unsettled.append(f"the schedule hung: not done after {HUNG_SECONDS:g} s")


async def _apply_plan(world: _World, plan: list[Fault], nursery: trio.Nursery) -> None:
    start = trio.current_time()
    for fault in plan:
        await trio.sleep_until(start + fault.at)
        world.record("-", "fault", fault.describe())
        await _fault(world, fault, nursery)
    world.network.heal()
    for instance in world.instances.values():
        if not instance.up:
            await instance.start(nursery)
    world.record("-", "healed")
    world.healed.set()


async def _fault(world: _World, fault: Fault, nursery: trio.Nursery) -> None:
    network = world.network
    target = fault.target
    if fault.kind in ("partition", "isolate-client"):  # an instance, or a publisher, alone
        others = [n for n in [*INSTANCES, *PUBLISHERS] if n != target[0]]
        network.partition({target[0]}, others)
    elif fault.kind == "reset":
        network.reset(*target)
    elif fault.kind == "crash":
        await world.instances[target[0]].crash()
    elif fault.kind == "vanish":
        network.vanish(target[0])
        await world.instances[target[0]].crash()
    elif fault.kind == "slow":
        network.slow_reader(target[0], 2000.0)
    await trio.sleep(fault.duration)
    if fault.kind in ("partition", "isolate-client"):
        network.heal()
    elif fault.kind in ("crash", "vanish"):
        await world.instances[target[0]].start(nursery)
    elif fault.kind == "slow":
        network.slow_reader(target[0], None)


async def _publisher(world: _World, name: str, messages: int) -> None:
    """Publish ``messages`` messages through an HA client over both instances (this
    publisher's preferred one first), check each persisted ack as it comes, then wait
    for the last one once the faults healed."""
    order = list(INSTANCES) if name == PUBLISHERS[0] else list(reversed(INSTANCES))
    uris = [world.instances[n].uri for n in order]
    seen = world.seen
    seen.published[name] = 0
    seen.acked[name] = 0
    store = _WatchedStore(_ack_checker(world, name))
    with net.using(world.network.node(name)):
        async with open_ha_client(name, uris, publish_store=store, heartbeat=1.0) as ha:
            for n in range(1, messages + 1):
                await trio.sleep(world.rng.uniform(0.0, 0.05))
                seq = await ha.publish(TOPIC, orjson.dumps({"p": name, "n": n}))
                seen.published[name] = n
                world.record(name, "publish", str(seq))
                if seq != n:  # the checker reads n out of the payload as the seq
                    seen.unsettled.append(f"publisher {name}: message {n} got seq {seq}")
            await world.healed.wait()
            try:
                await ha.flush(timeout=SETTLE_SECONDS)
            except TimeoutError:
                seen.unsettled.append(
                    f"publisher {name}: persisted through seq {store.discarded_through} of "
                    f"{seen.published[name]} {SETTLE_SECONDS:g} s after the faults healed"
                )


class _WatchedStore(MemoryPublishStore):
    """A publisher's store that reports each persisted ack the moment the client
    applies it (so the check sees the fabric as it was when the ack came)."""

    def __init__(self, on_acked: Callable[[int], None]) -> None:
        super().__init__()
        self._on_acked = on_acked

    def discard_through(self, seq: int) -> int:
        dropped = super().discard_through(seq)
        self._on_acked(self.discarded_through)
        return dropped


def _ack_checker(world: _World, name: str) -> Callable[[int], None]:
    """Each persisted ack: every instance up must hold the message already (each is a
    sync destination of the other)."""
    pub_hash = publisher_hash(name)

    def acked(through: int) -> None:
        if through <= world.seen.acked[name]:
            return
        world.seen.acked[name] = through
        world.record(name, "acked", str(through))
        for instance in world.instances.values():
            if instance.instance is None:
                continue
            held = instance.instance.publishing.held_seq(pub_hash)
            if held < through:
                world.seen.early_acks.append(
                    f"publisher {name} had a persisted ack through seq {through} while "
                    f"instance {instance.name} held only through {held}"
                )

    return acked


async def _replay(world: _World, instance: SimInstance) -> dict[str, list[int]]:
    """What a replay of ``instance``'s journal from EPOCH delivers, per publisher."""
    found: dict[str, list[int]] = {}
    with net.using(world.network.node("checker")):
        async with (
            open_client(instance.uri, f"checker-{instance.name}") as client,
            client.subscribe(TOPIC, bookmark="0") as sub,
        ):
            await sub.completed.wait()
            for _ in range(sub.replayed or 0):
                message = await sub.get(60)
                doc = orjson.loads(message.data)
                found.setdefault(doc["p"], []).append(int(doc["n"]))
    world.record("checker", "replayed", f"{instance.name} {sum(map(len, found.values()))}")
    return found
