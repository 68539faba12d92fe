"""Replication between real instance processes: passthrough, loops, hot-hot pairs,
resync, refused links. (Persisted acks and fully_durable subscriptions with sync and
async destinations: test_sync_acks.py, in process.)"""

from __future__ import annotations

import pytest
import trio
from cluster import Cluster, destination_xml, replication_xml
from harness import assert_journal_sound, wait_until

from amps_py.client import open_client


def dest(cluster_view, to: str, sync: bool = True, passthrough=(), topics=(".*",)):  # type: ignore[no-untyped-def]
    """A destination; one-way links (the target does not replicate back) exclude the
    ``replicate`` validation check, as an AMPS operator would."""
    return destination_xml(
        to,
        cluster_view.groups[to],
        sync,
        cluster_view.addr(to),
        topics=topics,
        passthrough=passthrough,
        exclude=("replicate",),
    )


def body(*targets: tuple[str, bool, tuple[str, ...]]):  # type: ignore[no-untyped-def]
    """xml_body_fn replicating to each (name, sync, passthrough)."""

    def make(view) -> str:  # type: ignore[no-untyped-def]
        if not targets:
            return ""  # only accepts replication (the transport is still configured)
        return replication_xml(*(dest(view, to, sync, pt) for to, sync, pt in targets))

    return make


async def publish(uri: str, name: str, n: int, topic: str = "orders", start: int = 0) -> list[int]:
    async with open_client(uri, name) as pub:
        for i in range(n):
            await pub.publish(topic, b'{"p":"%s","i":%d}' % (name.encode(), start + i))
        await pub.wait_persisted(pub.seq, timeout=30)
        return list(range(start, start + n))


async def replay(uri: str, topic: str = "orders", quiet: float = 0.3) -> list[tuple[str, int, str]]:
    """(publisher, i, bookmark) of every message replayed from EPOCH."""
    out = []
    async with open_client(uri, "replayer") as client, client.subscribe(topic, bookmark="0") as sub:
        with trio.fail_after(30):
            await sub.completed.wait()
        while True:
            with trio.move_on_after(quiet) as scope:
                msg = await sub.get(30)
            if scope.cancelled_caught:
                return out
            doc = msg.json()
            out.append((doc["p"], doc["i"], msg.bookmark))


def stored_count(cluster: Cluster, name: str) -> int:
    return int(cluster.server(name).statistics()["journal"]["records"])


async def wait_stored(cluster: Cluster, counts: dict[str, int], timeout: float = 30) -> None:
    def check() -> str | None:
        wrong = {
            n: stored_count(cluster, n) for n in counts if stored_count(cluster, n) != counts[n]
        }
        return None if not wrong else f"stored {wrong}, want {counts}"

    await wait_until(check, timeout)


@pytest.mark.parametrize("passthrough", [True, False])
async def test_chain_forwards_only_with_passthrough(cluster: Cluster, passthrough: bool) -> None:
    pt = ("^ga$",) if passthrough else ()
    cluster.add_instance("A", "ga", body(("B", False, ())))
    cluster.add_instance("B", "gb", body(("C", False, pt)))
    cluster.add_instance("C", "gc", body())
    cluster.start_all()
    await publish(cluster.uri("A"), "pa", 20)
    await publish(cluster.uri("B"), "pb", 5)
    await wait_stored(cluster, {"A": 20, "B": 25, "C": 25 if passthrough else 5})
    got = await replay(cluster.uri("C"))
    from_a = [i for p, i, _ in got if p == "pa"]
    assert from_a == (list(range(20)) if passthrough else [])
    # B's own messages always reach C (published directly to B)
    assert [i for p, i, _ in got if p == "pb"] == list(range(5))


async def test_ring_stores_each_message_once_and_never_loops(cluster: Cluster) -> None:
    everything = (".*",)
    cluster.add_instance("A", "ga", body(("B", False, everything)))
    cluster.add_instance("B", "gb", body(("C", False, everything)))
    cluster.add_instance("C", "gc", body(("A", False, everything)))
    cluster.start_all()
    for name in "ABC":
        await publish(cluster.uri(name), f"p{name}", 30)
    await wait_stored(cluster, {"A": 90, "B": 90, "C": 90})
    for name in "ABC":
        got = await replay(cluster.uri(name))
        assert sorted((p, i) for p, i, _ in got) == sorted(
            (f"p{n}", i) for n in "ABC" for i in range(30)
        ), f"{name} stored a message twice or missed one"

    # every message crossed each link at most once: A's messages go A->B->C and stop
    def frames_settled() -> str | None:
        out = {
            n: cluster.server(n).statistics()["replication"]["destinations"][0]["messages_out"]
            for n in "ABC"
        }
        return None if out == {"A": 60, "B": 60, "C": 60} else f"messages_out {out}, want 60 each"

    await wait_until(frames_settled, 60)


async def test_hot_hot_pair_bookmarks_identical_and_failover_resume(cluster: Cluster) -> None:
    cluster.add_instance("A", "hot", body(("B", True, ())))
    cluster.add_instance("B", "hot", body(("A", True, ())))
    cluster.start_all()
    async with open_client(cluster.uri("B"), "subB") as sb, sb.subscribe("orders") as live_b:
        await publish(cluster.uri("A"), "pa", 50)
        await publish(cluster.uri("B"), "pb", 50)
        got_live = [await live_b.get(10) for _ in range(100)]
        assert sorted(m.json()["p"] for m in got_live) == ["pa"] * 50 + ["pb"] * 50
    await wait_stored(cluster, {"A": 100, "B": 100})
    on_a = await replay(cluster.uri("A"))
    on_b = await replay(cluster.uri("B"))
    assert {(p, i): bm for p, i, bm in on_a} == {(p, i): bm for p, i, bm in on_b}, (
        "a message has different bookmarks on the two instances"
    )

    # a subscriber reads 40 messages from A, then fails over to B and resumes there
    seen: list[tuple[str, int]] = []
    last_bm = ""
    async with (
        open_client(cluster.uri("A"), "mover") as ca,
        ca.subscribe("orders", bookmark="0") as s,
    ):
        for _ in range(40):
            m = await s.get(10)
            seen.append((m.json()["p"], m.json()["i"]))
            last_bm = m.bookmark
    async with (
        open_client(cluster.uri("B"), "mover") as cb,
        cb.subscribe("orders", bookmark=last_bm) as s,
    ):
        with trio.fail_after(60):
            await s.completed.wait()
        while True:
            with trio.move_on_after(0.3) as scope:
                m = await s.get(10)
            if scope.cancelled_caught:
                break
            seen.append((m.json()["p"], m.json()["i"]))
    assert len(seen) == len(set(seen)) == 100, "gap or duplicate after switching instance"


# ----------------------------------------------------------------------------- resync


def resync_records(cluster: Cluster, source: str, dest_name: str) -> int:
    return int(cluster.server(source).destination(dest_name)["resync_records"])


async def wait_connected(
    cluster: Cluster, source: str, dest_name: str, timeout: float = 30
) -> None:
    def check() -> str | None:
        d = cluster.server(source).destination(dest_name)
        return (
            None
            if d["is_connected"]
            else f"{source}->{dest_name} not connected ({d['last_error']})"
        )

    await wait_until(check, timeout)


async def test_resync_after_downstream_restart_sends_only_the_missing_tail(
    cluster: Cluster,
) -> None:
    cluster.add_instance("A", "g", body(("B", False, ())))
    cluster.add_instance("B", "g", body())
    cluster.start_all()
    await publish(cluster.uri("A"), "pa", 300)
    await wait_stored(cluster, {"B": 300})
    cluster.stop("B")

    def link_down() -> str | None:
        # statistics written after the link dropped include everything it sent (a file
        # from before the first connection also says "not connected": count the drop)
        d = cluster.server("A").destination("B")
        if d["is_connected"] or d["disconnect_count"] < 1:
            return f"A shows B connected={d['is_connected']}, drops={d['disconnect_count']}"
        return None

    await wait_until(link_down, 60)
    await publish(cluster.uri("A"), "pa", 40, start=300)
    before = resync_records(cluster, "A", "B")
    cluster.start("B")
    await wait_stored(cluster, {"B": 340})

    def resent() -> str | None:
        n = resync_records(cluster, "A", "B") - before
        return None if n >= 40 else f"{n} records resent so far"

    await wait_until(resent, 60)
    assert resync_records(cluster, "A", "B") - before == 40, (
        "resync resent more than the missing tail"
    )
    assert [i for _, i, _ in await replay(cluster.uri("B"))] == list(range(340))


async def test_resync_to_a_downstream_restored_from_an_older_copy(cluster: Cluster) -> None:
    import shutil

    cluster.add_instance("A", "g", body(("B", False, ())))
    cluster.add_instance("B", "g", body())
    cluster.start_all()
    await publish(cluster.uri("A"), "pa", 100)
    await wait_stored(cluster, {"B": 100})
    cluster.stop("B")
    backup = cluster.journal_dir("B").with_name("B-backup")
    shutil.copytree(cluster.journal_dir("B"), backup)
    cluster.start("B")
    await publish(cluster.uri("A"), "pa", 100, start=100)
    await wait_stored(cluster, {"B": 200})
    cluster.stop("B")
    shutil.rmtree(cluster.journal_dir("B"))
    shutil.copytree(backup, cluster.journal_dir("B"))  # B lost its last 100 messages
    cluster.start("B")
    await wait_stored(cluster, {"B": 200})
    assert [i for _, i, _ in await replay(cluster.uri("B"))] == list(range(200))


async def test_resync_after_upstream_restart(cluster: Cluster) -> None:
    cluster.add_instance("A", "g", body(("B", True, ())))
    cluster.add_instance("B", "g", body())
    cluster.start_all()
    await publish(cluster.uri("A"), "pa", 100)
    await wait_stored(cluster, {"B": 100})
    cluster.kill("A")
    cluster.start("A")
    await wait_connected(cluster, "A", "B")
    assert resync_records(cluster, "A", "B") == 0, "a caught-up destination got records again"
    await publish(cluster.uri("A"), "pa", 50, start=100)  # sync: acks need B again
    await wait_stored(cluster, {"A": 150, "B": 150})
    assert [i for _, i, _ in await replay(cluster.uri("B"))] == list(range(150))
    # the 50 new ones went live; nothing of the first 100 was sent again
    assert resync_records(cluster, "A", "B") == 0


async def wait_remote(cluster: Cluster, source: str, dest_name: str, remote: str) -> None:
    """Until ``source``'s statistics show destination ``dest_name`` connected to instance
    ``remote`` (the statistics file is rewritten 4 times a second: poll, never read once)."""

    def check() -> str | None:
        d = cluster.server(source).destination(dest_name)
        ok = d["is_connected"] and d["remote_name"] == remote
        return None if ok else f"{source}->{dest_name} reaches {d['remote_name']!r}, not {remote!r}"

    await wait_until(check, 60)


async def test_failover_to_the_other_member_of_a_group(cluster: Cluster) -> None:
    def a_body(view) -> str:  # type: ignore[no-untyped-def]
        return replication_xml(
            destination_xml(
                "site-b",
                "site-b",
                False,
                [view.addr("B1"), view.addr("B2")],
                exclude=("replicate",),
            )
        )

    cluster.add_instance("A", "site-a", a_body)
    cluster.add_instance("B1", "site-b", body(("B2", True, ("^site-a$",))))
    cluster.add_instance("B2", "site-b", body(("B1", True, ("^site-a$",))))
    cluster.start_all()
    await publish(cluster.uri("A"), "pa", 60)
    await wait_stored(cluster, {"B1": 60, "B2": 60})
    await wait_remote(cluster, "A", "site-b", "B1")
    cluster.kill("B1")
    await publish(cluster.uri("A"), "pa", 40, start=60)
    await wait_stored(cluster, {"B2": 100})
    await wait_remote(cluster, "A", "site-b", "B2")
    cluster.start("B1")
    await wait_stored(cluster, {"B1": 100, "B2": 100})
    for member in ("B1", "B2"):
        assert [i for _, i, _ in await replay(cluster.uri(member))] == list(range(100)), member


# ----------------------------------------------------------------------------- refusals


async def test_wrong_group_is_refused_and_logged_on_both_sides(cluster: Cluster) -> None:
    def a_body(view) -> str:  # type: ignore[no-untyped-def]
        return replication_xml(destination_xml("B", "not-b-group", True, view.addr("B")))

    cluster.add_instance("A", "ga", a_body)
    cluster.add_instance("B", "gb", body())
    cluster.start_all()

    def logged() -> str | None:
        a, b = cluster.log("A"), cluster.log("B")
        if "group mismatch" in a and "group mismatch" in b:
            return None
        return "group mismatch not yet in both logs"

    await wait_until(logged, 60)
    assert "expects Group 'not-b-group'" in cluster.log("B")  # the detecting side
    assert "refused by the peer: group mismatch" in cluster.log("A")
    # A still serves clients (a sync destination that never connects blocks persisted
    # acks, so publish to a topic A does not replicate... A replicates .*: use processed)
    async with open_client(cluster.uri("B"), "pb") as pb:
        await pb.publish_persisted("orders", b'{"p":"pb","i":0}')
    assert stored_count(cluster, "A") == 0
    cluster.stop("A")
    cluster.stop("B")
    for name in "AB":
        assert_journal_sound(cluster.journal_dir(name))


async def test_wrong_version_and_garbage_are_refused(cluster: Cluster) -> None:
    from amps_py.protocol import FrameDecoder, encode_frame

    cluster.add_instance("B", "gb", body())
    cluster.start_all()
    port = cluster.ports("B").replication

    async def exchange(data: bytes) -> list:  # type: ignore[type-arg]
        stream = await trio.open_tcp_stream("127.0.0.1", port)
        await stream.send_all(data)
        decoder = FrameDecoder()
        frames = []
        with trio.fail_after(60):
            while True:
                chunk = await stream.receive_some(65536)
                if not chunk:
                    break
                decoder.receive_data(chunk)
                frames.extend(decoder.frames())
        await stream.aclose()
        return frames

    import orjson

    hello = encode_frame(
        {"c": "repl_hello", "v": 99}, orjson.dumps({"version": 99, "name": "future", "group": "x"})
    )
    (refusal,) = await exchange(hello)
    assert refusal.command == "repl_refuse"
    assert orjson.loads(refusal.payload)["reason"] == "protocol version"
    frames = await exchange(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
    assert [orjson.loads(f.payload)["reason"] for f in frames] == ["not a replication peer"]
    log = cluster.log("B")
    assert "protocol version" in log and "not a replication peer" in log
    await publish(cluster.uri("B"), "pb", 5)  # still serving
    cluster.stop("B")
    assert_journal_sound(cluster.journal_dir("B"))


async def test_compressed_link_is_smaller_on_the_wire(cluster: Cluster) -> None:
    def a_body(view) -> str:  # type: ignore[no-untyped-def]
        return replication_xml(
            destination_xml(
                "B",
                "g",
                False,
                view.addr("B"),
                extra="<Compression>zstd</Compression>",
                exclude=("replicate",),
            )
        )

    cluster.add_instance("A", "g", a_body)
    cluster.add_instance("B", "g", body())
    cluster.start_all()
    await publish(cluster.uri("A"), "pa", 500)
    await wait_stored(cluster, {"B": 500})
    assert [i for _, i, _ in await replay(cluster.uri("B"))] == list(range(500))

    def counted() -> str | None:
        d = cluster.server("A").destination("B")
        return None if d["messages_out"] == 500 else f"messages_out {d['messages_out']}"

    await wait_until(counted, 60)
    d = cluster.server("A").destination("B")
    assert d["bytes_out"] < d["raw_bytes_out"] / 2, d


async def test_content_filtered_destination_and_its_resync(cluster: Cluster) -> None:
    def a_body(view) -> str:  # type: ignore[no-untyped-def]
        topic = (
            "<Topic><Name>orders</Name><MessageType>json</MessageType>"
            "<Filter>/i % 2 = 0</Filter><ExcludeValidation>replicate</ExcludeValidation></Topic>"
        )
        return replication_xml(
            "<Destination><Name>B</Name><Group>g</Group><SyncType>async</SyncType>"
            f"{topic}<Transport><Type>amps-replication</Type><InetAddr>{view.addr('B')}"
            "</InetAddr></Transport></Destination>"
        )

    cluster.add_instance("A", "g", a_body)
    cluster.add_instance("B", "g", body())
    link = cluster.proxy("A", "B")
    cluster.start_all()
    await publish(cluster.uri("A"), "pa", 20)
    await wait_stored(cluster, {"A": 20, "B": 10})
    # cut the link while more is published: the resync must apply the filter too
    link.blackhole(True)
    await publish(cluster.uri("A"), "pa", 20, start=20)
    link.heal()
    link.cut()
    await wait_stored(cluster, {"A": 40, "B": 20})
    assert [i for _, i, _ in await replay(cluster.uri("B"))] == list(range(0, 40, 2))
