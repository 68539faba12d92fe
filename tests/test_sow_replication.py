"""State of the World on a hot-hot pair of real instance processes: each instance takes
publishes, delta_publishes and sow_deletes (by data, by keys, by filter) on its own keys,
plus updates to keys its peer created and handed over, while the replication link is
cut (both directions blackholed) and restored mid-way; and one instance is killed
with SIGKILL and restarted. Afterwards both instances' ``sow`` results hold the same
records (same keys, same payload bytes), equal to the state the test computes from
what it sent. Seeds are fixed and printed.

Who writes which key (so that no key is ever written on both sides at once, the rule a
hot-hot SOW relies on): side ``A`` creates ``A-0`` .. ``A-<n>``, side ``B`` likewise.
Keys whose number is a multiple of 10 are *handed over* once their creation has
replicated: from then on only the peer updates them (publish and delta_publish), and
the creator leaves them alone. Everything else is written only by its creator.
"""

from __future__ import annotations

import random
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import orjson
import pytest
import trio
from cluster import Cluster, InstanceView, destination_xml, replication_xml

from amps_py.client import Client, open_client

SEED = 1414_2024
TOPIC = "orders"
#: keys each side creates; numbers that are multiples of 10 are handed to the peer
KEYS_PER_SIDE = 40
SOW_XML = (
    f"<SOW><Topic><Name>{TOPIC}</Name><MessageType>json</MessageType><Key>/id</Key></Topic></SOW>"
)
PEER = {"A": "B", "B": "A"}


def pair_body(peer: str, sync: bool) -> Callable[[InstanceView], str]:
    """Both instances of the pair: the same SOW topic, and a destination to the peer."""

    def make(view: InstanceView) -> str:
        dest = destination_xml(peer, "hot", sync, view.addr(peer))
        return SOW_XML + replication_xml(dest)

    return make


def start_pair(cluster: Cluster, sync: bool) -> None:
    cluster.add_instance("A", "hot", pair_body("B", sync))
    cluster.add_instance("B", "hot", pair_body("A", sync))
    cluster.proxy("A", "B", seed=SEED)
    cluster.proxy("B", "A", seed=SEED + 1)
    cluster.start_all()


def merged(stored: Any, delta: Any) -> Any:
    """The test's own model of a delta merge: objects merge field by field at every
    depth, anything else (scalars, arrays) is replaced."""
    if not isinstance(stored, dict) or not isinstance(delta, dict):
        return delta
    out = dict(stored)
    for name, value in delta.items():
        out[name] = merged(out.get(name), value) if isinstance(value, dict) else value
    return out


@dataclass
class Model:
    """The SOW the test expects: id -> document."""

    docs: dict[str, dict[str, Any]] = field(default_factory=dict)
    #: id -> SOW key string, learned from the instances once every key exists
    sow_keys: dict[str, str] = field(default_factory=dict)


async def sow_delete(client: Client, **selector: Any) -> dict[str, int]:
    """``client.sow_delete`` on the test's topic (a delete without ``s`` takes none
    of the client's publish seqs: tests/test_sow_delete_seq.py)."""
    stats: dict[str, int] = await client.sow_delete(TOPIC, **selector)
    return stats


def own_id(side: str, n: int) -> str:
    return f"{side}-{n}"


def handed_over(n: int) -> bool:
    return n % 10 == 0


class Writer:
    """One side's writer: a seeded sequence of SOW operations through one client
    connected to that side's instance, applied to the shared model as they are sent
    (each id is written by one side only, so the order per id is the send order)."""

    def __init__(self, side: str, model: Model, rng: random.Random) -> None:
        self.side = side
        self.model = model
        self.rng = rng
        self.counter = 0
        self.log: list[str] = []

    def _doc(self, ident: str, owner: str, n: int) -> dict[str, Any]:
        self.counter += 1
        return {
            "id": ident,
            "owner": owner,
            "grp": n % 10,
            "v": self.counter,
            "by": self.side,
            "px": {"bid": self.rng.randint(1, 99), "ask": self.rng.randint(100, 199)},
        }

    async def create_all(self, client: Client) -> None:
        for n in range(KEYS_PER_SIDE):
            doc = self._doc(own_id(self.side, n), self.side, n)
            self.model.docs[doc["id"]] = doc
            await client.publish(TOPIC, orjson.dumps(doc))
        await client.wait_persisted(client.seq, timeout=60)

    def _mine(self) -> list[int]:
        """Numbers of this side's own keys it still writes (not handed over)."""
        return [n for n in range(KEYS_PER_SIDE) if not handed_over(n)]

    def _present(self, numbers: list[int]) -> list[str]:
        ids = [own_id(self.side, n) for n in numbers]
        return [i for i in ids if i in self.model.docs]

    async def step(self, client: Client) -> None:
        """One random operation."""
        rng = self.rng
        docs = self.model.docs
        op = rng.choices(
            [
                "publish",
                "delta",
                "peer_publish",
                "peer_delta",
                "del_data",
                "del_keys",
                "del_filter",
            ],
            weights=[30, 30, 8, 8, 8, 8, 3],
        )[0]
        peer = PEER[self.side]
        if op in ("peer_publish", "peer_delta"):
            n = rng.choice([n for n in range(KEYS_PER_SIDE) if handed_over(n)])
            ident = own_id(peer, n)
            if op == "peer_publish":
                doc = self._doc(ident, peer, n)
                docs[ident] = doc
                await client.publish(TOPIC, orjson.dumps(doc))
            else:
                self.counter += 1
                change = {"id": ident, "v": self.counter, "px": {"ask": rng.randint(200, 299)}}
                docs[ident] = merged(docs[ident], change)
                await client.delta_publish(TOPIC, orjson.dumps(change))
            self.log.append(f"{op} {ident}")
            return
        if op == "publish":
            n = rng.choice(self._mine())
            doc = self._doc(own_id(self.side, n), self.side, n)
            docs[doc["id"]] = doc  # a deleted key comes back
            await client.publish(TOPIC, orjson.dumps(doc))
            self.log.append(f"publish {doc['id']}")
        elif op == "delta":
            n = rng.choice(self._mine())
            ident = own_id(self.side, n)
            self.counter += 1
            delta: dict[str, Any] = {"id": ident, "v": self.counter}
            if rng.random() < 0.5:
                delta["px"] = {"bid": rng.randint(1, 99)}
            else:
                delta["note"] = f"n{self.counter}"
            if ident not in docs:  # a delta to no record is stored as it is
                delta.update(owner=self.side, grp=n % 10)
            docs[ident] = merged(docs.get(ident), delta)
            await client.delta_publish(TOPIC, orjson.dumps(delta))
            self.log.append(f"delta {ident}")
        elif op == "del_data":
            present = self._present(self._mine())
            if not present:
                return
            ident = rng.choice(present)
            stats = await sow_delete(client, data=orjson.dumps({"id": ident}))
            del docs[ident]
            assert stats["records_deleted"] == 1, self.history([ident], stats)
            self.log.append(f"del_data {ident}")
        elif op == "del_keys":
            present = self._present(self._mine())
            if not present:
                return
            chosen = rng.sample(present, min(len(present), rng.randint(1, 3)))
            stats = await sow_delete(client, keys=[self.model.sow_keys[i] for i in chosen])
            for ident in chosen:
                del docs[ident]
            assert stats["records_deleted"] == len(chosen), self.history(chosen, stats)
            self.log.append(f"del_keys {chosen}")
        else:
            grp = rng.randint(1, 9)
            gone = [
                i for i, d in docs.items() if d.get("owner") == self.side and d.get("grp") == grp
            ]
            stats = await sow_delete(client, filter=f"/owner = '{self.side}' AND /grp = {grp}")
            for ident in gone:
                del docs[ident]
            assert stats["records_deleted"] == len(gone), self.history(gone, stats)
            self.log.append(f"del_filter grp={grp} {gone}")

    def history(self, ids: list[str], stats: dict[str, int]) -> str:
        """A failed delete's message: the stats ack and what this side did to ``ids``."""
        lines = [
            f"#{n} {line}"
            for n, line in enumerate(self.log)
            if any(re.search(rf"{re.escape(i)}(?!\d)", line) for i in ids)
        ]
        return f"side {self.side}: delete of {ids} answered {stats}; earlier ops: {lines}"

    async def run(self, client: Client, steps: int) -> None:
        for _ in range(steps):
            await self.step(client)


async def sow_state(uri: str) -> dict[str, tuple[str, bytes]]:
    """id -> (SOW key, payload bytes) of every record an instance's ``sow`` returns."""
    async with open_client(uri, "sow-check", timeout=10) as client:
        records = await client.sow(TOPIC, batch_size=100, timeout=30)
    state: dict[str, tuple[str, bytes]] = {}
    for r in records:
        ident = orjson.loads(r.data)["id"]
        assert ident not in state, f"{uri} returned id {ident} twice"
        state[ident] = (r.key, r.data)
    return state


def describe_difference(
    expected: dict[str, Any], states: dict[str, dict[str, tuple[str, bytes]]]
) -> str | None:
    """What differs between the instances' SOWs and the expected documents, or None."""
    problems = []
    for name, state in states.items():
        got = {i: orjson.loads(data) for i, (_, data) in state.items()}
        missing = sorted(set(expected) - set(got))
        extra = sorted(set(got) - set(expected))
        wrong = sorted(i for i in set(expected) & set(got) if expected[i] != got[i])
        if missing or extra or wrong:
            example = (
                f" e.g. {wrong[0]}: got {got[wrong[0]]} want {expected[wrong[0]]}" if wrong else ""
            )
            problems.append(
                f"{name}: missing {missing}, unexpected {extra}, different {wrong[:5]}" + example
            )
    a, b = states["A"], states["B"]
    if a != b and not problems:
        differ = sorted(i for i in set(a) | set(b) if a.get(i) != b.get(i))
        problems.append(f"A and B hold different keys or payload bytes for {differ[:5]}")
    return "; ".join(problems) or None


async def wait_converged(cluster: Cluster, model: Model, timeout: float = 60) -> None:
    """Poll both instances' ``sow`` until both equal the model and each other."""
    deadline = trio.current_time() + timeout
    while True:
        states = {name: await sow_state(cluster.uri(name)) for name in "AB"}
        problem = describe_difference(model.docs, states)
        if problem is None:
            return
        if trio.current_time() > deadline:
            raise AssertionError(f"after {timeout} s the SOWs still differ: {problem}")
        await trio.sleep(0.2)  # polling interval of a condition


def written_by(side: str, ident: str) -> bool:
    """Whether ``side`` is the one writer of ``ident`` once keys are handed over."""
    creator, _, number = ident.partition("-")
    return (creator == side) != handed_over(int(number))


async def wait_local_writes(cluster: Cluster, side: str, model: Model, timeout: float = 30) -> None:
    """Poll until ``side``'s instance shows every write ``side`` made as the model has it
    (what it wrote is committed there even while the link is cut)."""
    deadline = trio.current_time() + timeout
    while True:
        state = await sow_state(cluster.uri(side))
        got = {i: orjson.loads(data) for i, (_, data) in state.items() if written_by(side, i)}
        want = {i: doc for i, doc in model.docs.items() if written_by(side, i)}
        if got == want:
            return
        if trio.current_time() > deadline:
            differ = sorted(i for i in set(got) | set(want) if got.get(i) != want.get(i))
            raise AssertionError(f"{side} does not hold its own writes of {differ[:5]}")
        await trio.sleep(0.1)  # polling interval of a condition


async def run_phase(
    cluster: Cluster, writers: dict[str, Writer], clients: dict[str, Client], steps: int
) -> None:
    async with trio.open_nursery() as nursery:
        for side, writer in writers.items():
            nursery.start_soon(writer.run, clients[side], steps)


async def create_and_hand_over(
    cluster: Cluster, writers: dict[str, Writer], clients: dict[str, Client], model: Model
) -> None:
    """Every key created on its side and replicated to the other, so handed-over keys
    may now be written by the peer; the SOW key strings learned."""
    async with trio.open_nursery() as nursery:
        for side, writer in writers.items():
            nursery.start_soon(writer.create_all, clients[side])
    await wait_converged(cluster, model)
    for ident, (key, _) in (await sow_state(cluster.uri("A"))).items():
        model.sow_keys[ident] = key


@pytest.mark.parametrize("sync", [True, False], ids=["sync", "async"])
async def test_pair_sow_identical_after_cut_and_resync(cluster: Cluster, sync: bool) -> None:
    seed = SEED + (0 if sync else 1)
    print(f"\nseed {seed} ({'sync' if sync else 'async'} pair)")
    start_pair(cluster, sync)
    model = Model()
    writers = {s: Writer(s, model, random.Random(f"{seed}-{s}")) for s in "AB"}
    with trio.fail_after(240):
        async with (
            open_client(cluster.uri("A"), "writer-A") as ca,
            open_client(cluster.uri("B"), "writer-B") as cb,
        ):
            clients = {"A": ca, "B": cb}
            await create_and_hand_over(cluster, writers, clients, model)
            await run_phase(cluster, writers, clients, 60)
            # cut: both directions dropped while each side goes on writing
            cluster.partition("A", "B")
            await run_phase(cluster, writers, clients, 200)
            # each side holds its own writes of the cut, and not its peer's: the two
            # SOWs differ until the link is back
            for side in "AB":
                await wait_local_writes(cluster, side, model)
            states = {side: await sow_state(cluster.uri(side)) for side in "AB"}
            assert states["A"] != states["B"], "the cut did not stop replication"
            # restored: new connections, resync, and more writes meanwhile
            cluster.heal()
            for link in cluster.proxies().values():
                link.cut()
            await run_phase(cluster, writers, clients, 60)
            for client in clients.values():
                await client.wait_persisted(client.seq, timeout=60)
            await wait_converged(cluster, model)
    for side, writer in writers.items():
        print(f"{side}: {len(writer.log)} operations, e.g. {writer.log[-3:]}")
    print(f"final SOW: {len(model.docs)} records")


async def test_killed_instance_sow_equals_its_peer_after_restart(cluster: Cluster) -> None:
    seed = SEED + 7
    print(f"\nseed {seed}")
    start_pair(cluster, True)
    model = Model()
    writers = {s: Writer(s, model, random.Random(f"{seed}-{s}")) for s in "AB"}
    with trio.fail_after(240):
        async with (
            open_client(cluster.uri("A"), "writer-A") as ca,
            open_client(cluster.uri("B"), "writer-B") as cb,
        ):
            clients = {"A": ca, "B": cb}
            await create_and_hand_over(cluster, writers, clients, model)
            await run_phase(cluster, writers, clients, 80)
            # every write is durable on both (sync pair) before B dies
            for client in clients.values():
                await client.wait_persisted(client.seq, timeout=60)
        cluster.kill("B")
        # A goes on writing while B is down (its persisted acks wait for B)
        async with open_client(cluster.uri("A"), "writer-A") as ca:
            await writers["A"].run(ca, 80)
            cluster.start("B")
            async with open_client(cluster.uri("B"), "writer-B") as cb:
                # B's deltas after the restart merge onto what its store kept
                await run_phase(cluster, writers, {"A": ca, "B": cb}, 40)
                for client in (ca, cb):
                    await client.wait_persisted(client.seq, timeout=60)
                await wait_converged(cluster, model)
    print(f"final SOW: {len(model.docs)} records")
