"""Back replication: a mutually replicating pair shares one TCP connection, both
directions flow over it, and a destination without InetAddr (the DMZ case) replicates
over the connection its peer opens. Connections are counted from the kernel's socket
table (/proc/net/tcp), not from the servers' own statistics."""

from __future__ import annotations

import re
from pathlib import Path

from cluster import Cluster, destination_xml, replication_xml
from harness import wait_until
from test_replication import publish, replay, wait_stored

from amps_py.client import open_client

ESTABLISHED = "01"


def established_to(ports: set[int]) -> list[tuple[int, int]]:
    """(local port, remote port) of every established IPv4 TCP socket whose local port
    is one of ``ports``: the accepting ends of connections to those listeners."""
    found = []
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        local, remote, state = fields[1], fields[2], fields[3]
        local_port = int(local.rpartition(":")[2], 16)
        if state == ESTABLISHED and local_port in ports:
            found.append((local_port, int(remote.rpartition(":")[2], 16)))
    return found


def to_peer(view, peer: str, *, dial: bool = True) -> str:  # type: ignore[no-untyped-def]
    """A sync destination for ``peer``; without ``dial`` it has no Transport (so no
    InetAddr): it only replicates over connections the peer opens."""
    xml = destination_xml(peer, view.groups[peer], True, view.addr(peer))
    if not dial:
        xml = re.sub(r"<Transport>.*?</Transport>", "", xml)
    return replication_xml(xml)


async def wait_single_connection(cluster: Cluster, a: str, b: str) -> None:
    ports = {cluster.ports(a).replication, cluster.ports(b).replication}

    def check() -> str | None:
        conns = established_to(ports)
        return None if len(conns) == 1 else f"{len(conns)} connections between {a} and {b}"

    await wait_until(check, 30)


async def wait_back_over(cluster: Cluster, name: str, peer: str) -> None:
    """Until ``name``'s destination ``peer`` streams over the connection ``peer`` opened."""

    def check() -> str | None:
        d = cluster.server(name).destination(peer)
        ok = d["is_connected"] and "back over" in d["address"]
        return None if ok else f"{name}->{peer}: connected={d['is_connected']} via {d['address']}"

    await wait_until(check, 30)


async def wait_connected(cluster: Cluster, a: str, b: str) -> None:
    def check() -> str | None:
        down = [
            f"{src}->{dst}"
            for src, dst in ((a, b), (b, a))
            if not cluster.server(src).destination(dst)["is_connected"]
        ]
        return None if not down else f"not connected: {down}"

    await wait_until(check, 30)


async def test_mutual_pair_uses_one_connection_both_ways(cluster: Cluster) -> None:
    cluster.add_instance("A", "hot", lambda v: to_peer(v, "B"))
    cluster.add_instance("B", "hot", lambda v: to_peer(v, "A"))
    cluster.start_all()
    await wait_connected(cluster, "A", "B")
    await wait_single_connection(cluster, "A", "B")
    # the one kept is the connection opened by the lower name (A), to B's port
    [(local, _)] = established_to({cluster.ports("A").replication, cluster.ports("B").replication})
    assert local == cluster.ports("B").replication
    await wait_back_over(cluster, "B", "A")
    # sync both ways: persisted acks need the other side, so this also proves the acks
    # flow back over the shared connection
    await publish(cluster.uri("A"), "pa", 40)
    await publish(cluster.uri("B"), "pb", 30)
    await wait_stored(cluster, {"A": 70, "B": 70})
    for name in "AB":
        got = await replay(cluster.uri(name))
        assert sorted((p, i) for p, i, _ in got) == sorted(
            [("pa", i) for i in range(40)] + [("pb", i) for i in range(30)]
        ), f"{name} is missing messages or stored one twice"
    assert len(established_to({cluster.ports(n).replication for n in "AB"})) == 1


async def test_records_coming_back_to_their_origin_cost_no_frame_per_commit(
    cluster: Cluster,
) -> None:
    """In a hot-hot pair, B's commits of A's records hold nothing for B's destination A
    (A has them): B counts them as acknowledged at once instead of sending A a
    position-only frame per commit and waiting for its ack. Persisted acks on both
    sides still work, and the next frame B sends starts where A's stream really is."""
    cluster.add_instance("A", "hot", lambda v: to_peer(v, "B"))
    cluster.add_instance("B", "hot", lambda v: to_peer(v, "A"))
    cluster.start_all()
    await wait_connected(cluster, "A", "B")
    await publish(cluster.uri("A"), "warm", 1)
    await wait_stored(cluster, {"A": 1, "B": 1})
    before = cluster.server("B").destination("A")
    async with open_client(cluster.uri("A"), "one-by-one") as pub:
        for i in range(40):  # one commit each
            await pub.publish("orders", b'{"p":"one","i":%d}' % i)
            await pub.wait_persisted(pub.seq, timeout=30)
    await wait_stored(cluster, {"A": 41, "B": 41})

    def b_acked_all() -> str | None:
        d = cluster.server("B").destination("A")
        committed = cluster.server("B").statistics()["journal"]["last_txid"]
        return None if d["acked_txid"] == committed else f"B->A acked {d['acked_txid']}"

    await wait_until(b_acked_all, 60)
    after = cluster.server("B").destination("A")
    sent = after["bytes_out"] - before["bytes_out"]
    # a position-only frame is ~100 bytes: 40 commits would have sent ~4 KB
    assert sent < 1500, f"B sent A {sent} bytes for 40 commits of A's own records"
    assert after["messages_out"] == before["messages_out"]
    # B's own publish goes to A in a frame that starts at A's real position
    await publish(cluster.uri("B"), "pb", 3)
    await wait_stored(cluster, {"A": 44, "B": 44})
    got = await replay(cluster.uri("A"))
    assert sorted(p for p, _, _ in got if p == "pb") == ["pb"] * 3


async def test_pair_converges_to_one_connection_after_restarts(cluster: Cluster) -> None:
    cluster.add_instance("A", "hot", lambda v: to_peer(v, "B"))
    cluster.add_instance("B", "hot", lambda v: to_peer(v, "A"))
    cluster.start_all()
    await wait_connected(cluster, "A", "B")
    for victim in ("A", "B"):
        cluster.kill(victim)
        cluster.start(victim)
        await wait_connected(cluster, "A", "B")
        await wait_single_connection(cluster, "A", "B")
    await publish(cluster.uri("B"), "pb", 10)
    await publish(cluster.uri("A"), "pa", 10)
    await wait_stored(cluster, {"A": 20, "B": 20})


async def test_dmz_destination_without_inetaddr_replicates_over_the_peers_connection(
    cluster: Cluster,
) -> None:
    # "inside" can reach "dmz"; "dmz" has no address for "inside" and never dials
    cluster.add_instance("inside", "site", lambda v: to_peer(v, "dmz"))
    cluster.add_instance("dmz", "site", lambda v: to_peer(v, "inside", dial=False))
    cluster.start("dmz")
    cluster.start("inside")
    await wait_connected(cluster, "inside", "dmz")
    await wait_back_over(cluster, "dmz", "inside")
    await publish(cluster.uri("dmz"), "pd", 25)
    await publish(cluster.uri("inside"), "pi", 15)
    await wait_stored(cluster, {"inside": 40, "dmz": 40})
    got = await replay(cluster.uri("inside"))
    assert [i for p, i, _ in got if p == "pd"] == list(range(25))
    assert len(established_to({cluster.ports(n).replication for n in ("inside", "dmz")})) == 1
    # the DMZ side waits (never dials) while the inside instance is down, then resumes
    cluster.kill("inside")

    def dmz_waits() -> str | None:
        d = cluster.server("dmz").destination("inside")
        return None if not d["is_connected"] else "dmz still reports a connection"

    await wait_until(dmz_waits, 30)
    cluster.start("inside")
    await publish(cluster.uri("dmz"), "pd", 5, start=25)
    await wait_stored(cluster, {"inside": 45, "dmz": 45})
