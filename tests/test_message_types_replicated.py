"""Every message type through a sync hot-hot pair, as an AMPS estate runs it: two real
instances (processes) replicate topic ``orders`` of one type both ways, A's
destination B with a content filter written for that type, both with a SOW topic keyed
by a field of that type. B is killed -9 mid-stream and restarted; then each journal
must hold each message where its routing says, exactly once (A: every message; B:
those the filter passes), and each SOW the latest message per key of what reached it.

Seed 20261128 (printed) picks symbols and quantities.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import bson
import msgpack
import pytest
import trio
from cluster import Cluster, InstanceView

from amps_py.client import open_client
from txlog import Journal

SEED = 20261128
MESSAGES = 40
SYMBOLS = ("IBM", "MSFT", "ORCL", "SAP")


@dataclass(frozen=True)
class TypeCase:
    """How one message type writes an order, filters on its quantity and keys by its
    symbol."""

    name: str
    encode: Callable[[int, str, int], bytes]
    big_qty_filter: str
    symbol_key: str


def _fix(n: int, sym: str, qty: int) -> bytes:
    return f"35=D\x0111={n}\x0155={sym}\x0138={qty}\x01".encode()


def _nvfix(n: int, sym: str, qty: int) -> bytes:
    return f"N={n}\x01Symbol={sym}\x01Qty={qty}\x01".encode()


def _xml(n: int, sym: str, qty: int) -> bytes:
    return f'<Order sym="{sym}"><N>{n}</N><Qty>{qty}</Qty></Order>'.encode()


def _json(n: int, sym: str, qty: int) -> bytes:
    return f'{{"n": {n}, "sym": "{sym}", "qty": {qty}}}'.encode()


CASES = [
    TypeCase("json", _json, "/qty > 50", "/sym"),
    TypeCase("fix", _fix, "/38 > 50", "/55"),
    TypeCase("nvfix", _nvfix, "/Qty > 50", "/Symbol"),
    TypeCase("xml", _xml, "/Order/Qty > 50", "/Order/@sym"),
    TypeCase(
        "bson",
        lambda n, sym, qty: bson.encode({"n": n, "sym": sym, "qty": qty}),
        "/qty > 50",
        "/sym",
    ),
    TypeCase(
        "msgpack",
        lambda n, sym, qty: msgpack.packb({"n": n, "sym": sym, "qty": qty}),
        "/qty > 50",
        "/sym",
    ),
]


def _destination(view: InstanceView, peer: str, case: TypeCase, filtered: bool) -> str:
    flt = f"<Filter>{case.big_qty_filter}</Filter>" if filtered else ""
    return (
        f"<Destination><Name>{peer}</Name><Group>{peer}</Group><SyncType>sync</SyncType>"
        f"<Topic><Name>orders</Name><MessageType>{case.name}</MessageType>{flt}"
        # a filtered one-way half: B does not replicate the filter back
        "<ExcludeValidation>replicate_filter</ExcludeValidation></Topic>"
        f"<Transport><Type>amps-replication</Type><InetAddr>{view.addr(peer)}</InetAddr>"
        "</Transport></Destination>"
    )


def _body(peer: str, case: TypeCase, filtered: bool) -> Callable[[InstanceView], str]:
    key = case.symbol_key.replace("&", "&amp;")

    def body(view: InstanceView) -> str:
        return (
            f"<SOW><Topic><Name>orders</Name><MessageType>{case.name}</MessageType>"
            f"<Key>{key}</Key></Topic></SOW>"
            f"<Replication>{_destination(view, peer, case, filtered)}</Replication>"
        )

    return body


def _uri(cluster: Cluster, name: str, message_type: str) -> str:
    return f"tcp://127.0.0.1:{cluster.ports(name).client}/amps/{message_type}"


async def _sow_until(uri: str, want: set[bytes], deadline: float) -> set[bytes]:
    """The SOW of topic orders at ``uri``, queried until it is ``want`` or the
    deadline passes (B applies what A resends after its restart as it arrives)."""
    async with open_client(uri, "sow-reader") as reader:
        held: set[bytes] = set()
        with trio.move_on_after(deadline):
            while True:
                held = {r.data for r in await reader.sow("orders")}
                if held == want:
                    break
                await trio.sleep(0.1)
        return held


def _journaled(journal_dir: Path) -> list[tuple[int, bytes]]:
    """(seq, payload) of every message publisher ``pub`` stored on topic orders."""
    with Journal(journal_dir, readonly=True) as journal:
        return [
            (rec.seq, rec.payload)
            for rec in journal.iter_records(0)
            if rec.topic == "orders" and rec.client_name == "pub"
        ]


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
async def test_each_type_replicates_filters_and_keys_through_a_kill(
    cluster: Cluster, case: TypeCase
) -> None:
    print(f"seed {SEED}")
    rng = random.Random(SEED)
    orders = [(n, rng.choice(SYMBOLS), rng.randint(1, 100)) for n in range(1, MESSAGES + 1)]
    topics = (("orders", case.name),)
    cluster.add_instance(
        "A", "A", _body("B", case, True), journal_topics=topics, client_message_type=None
    )
    cluster.add_instance(
        "B", "B", _body("A", case, False), journal_topics=topics, client_message_type=None
    )
    await trio.to_thread.run_sync(cluster.start_all)
    payloads = {n: case.encode(n, sym, qty) for n, sym, qty in orders}
    async with open_client(_uri(cluster, "A", case.name), "pub") as pub:
        for n, _sym, _qty in orders[: MESSAGES // 2]:
            await pub.publish("orders", payloads[n])
        await trio.to_thread.run_sync(cluster.kill, "B")
        for n, _sym, _qty in orders[MESSAGES // 2 :]:
            await pub.publish("orders", payloads[n])
        await trio.to_thread.run_sync(cluster.start, "B")
        await pub.wait_persisted(pub.seq, timeout=120)

    routed = {n for n, _sym, qty in orders if qty > 50}

    def latest(of: set[int]) -> dict[str, bytes]:
        newest: dict[str, bytes] = {}
        for n, sym, _qty in orders:
            if n in of:
                newest[sym] = payloads[n]
        return newest

    expected_sow = {"A": latest(set(payloads)), "B": latest(routed)}
    for name in ("A", "B"):
        want = set(expected_sow[name].values())
        held = await _sow_until(_uri(cluster, name, case.name), want, deadline=60)
        assert held == want, f"{name}'s SOW is not the latest message per key"

    await trio.to_thread.run_sync(cluster.stop_all)
    stored = {name: _journaled(cluster.journal_dir(name)) for name in ("A", "B")}
    assert sorted(stored["A"]) == [(n, payloads[n]) for n in sorted(payloads)], (
        "A must hold every message once"
    )
    assert sorted(stored["B"]) == [(n, payloads[n]) for n in sorted(routed)], (
        "B must hold exactly the messages A's filter passes, once each"
    )
