"""Per-transport slow-client pools and bookmark replays, in process (see test_offline).

What a user relies on: a transport with its own small MessageMemoryLimit offlines its
own slow reader, spilling under that transport's MessageDiskPath, while a slow reader
of a transport on the instance's large pool holding more is left online; both get
everything in order once they read. A subscriber whose bookmark replay runs is never
offlined: its replay paces itself on its outbox, and a live slow reader of the same
pool is offlined instead.
"""

from __future__ import annotations

import socket
from pathlib import Path

import trio
from harness import wait_until
from inprocess import InProcessInstance, serve_instance
from test_offline import SIZE, RawSubscriber, metrics_of, payload, session_of

from amps_py.admin.http import to_xml
from amps_py.client import open_client
from amps_py.protocol import encode_frame

MiB = 1024 * 1024


def client_transport(name: str, settings: str) -> str:
    return (
        f"<Transport><Name>{name}</Name><Type>tcp</Type><InetAddr>127.0.0.1:0</InetAddr>"
        f"<Protocol>amps</Protocol><MessageType>json</MessageType>{settings}</Transport>"
    )


async def publish_range(served: InProcessInstance, start: int, stop: int) -> None:
    """Publish messages ``start`` to ``stop - 1`` (payload(i)) in persisted-ack rounds."""
    async with open_client(served.uri, "pub") as pub:
        for first in range(start, stop, 64):
            seq = 0
            for i in range(first, min(stop, first + 64)):
                seq = await pub.publish("feed", payload(i))
            await pub.wait_persisted(seq, timeout=20)


async def bookmark_subscriber(port: int, name: str) -> RawSubscriber:
    """A raw subscriber that asks for a replay from the start of the journal and does
    not read (its replay then pauses on its outbox)."""
    sock = trio.socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 16 * 1024)
    await sock.connect(("127.0.0.1", port))
    sub = RawSubscriber(trio.SocketStream(sock))
    await sub.command({"c": "logon", "client_name": name, "cid": "l"})
    # no wait for its ack: replayed messages may share a read with it
    await sub.stream.send_all(
        encode_frame({"c": "subscribe", "t": "feed", "sub_id": "r1", "bm": "0", "cid": "r"})
    )
    return sub


async def test_a_transport_with_its_own_small_pool_offlines_its_reader_under_its_own_path(
    tmp_path: Path,
) -> None:
    own_dir, instance_dir = tmp_path / "small-spill", tmp_path / "instance-spill"
    own_dir.mkdir()
    instance_dir.mkdir()
    small = client_transport(
        "small",
        "<MessageMemoryLimit>4MB</MessageMemoryLimit><ClientMaxCapacity>1GB</ClientMaxCapacity>"
        f"<MessageDiskPath>{own_dir}</MessageDiskPath>",
    )
    # a share of its own pool: 10% of 10MB, and of its own disk pool once offline
    pct = client_transport(
        "pct",
        "<MessageMemoryLimit>10MB</MessageMemoryLimit><ClientMaxCapacity>10%</ClientMaxCapacity>",
    )
    extra = (
        f"<MessageMemoryLimit>64MB</MessageMemoryLimit><MessageDiskPath>{instance_dir}"
        "</MessageDiskPath>"
    )
    count = 3000  # ~12 MiB: three times the small pool, a fifth of the instance's
    async with serve_instance(tmp_path, "pools", extra=extra, extra_transport=small + pct) as (
        served
    ):
        instance = served.instance
        assert instance.client_limits("pct")[2] == MiB
        assert instance.client_disk_capacity("pct") == 1024**3 // 10
        assert instance.client_limits("json-tcp")[2] == 32 * MiB  # 50% of the instance's
        on_small = await RawSubscriber.connect(served.bound_port("small"), "on-small", "feed")
        on_shared = await RawSubscriber.connect(served.port, "on-shared", "feed")
        try:
            await publish_range(served, 0, count)
            small_session = session_of(served, "on-small")
            shared_session = session_of(served, "on-shared")
            print(
                f"published {count} x {SIZE} B; on-small: {small_session.spilled / MiB:.2f} "
                f"MiB spilled; on-shared: {shared_session.out_bytes / MiB:.2f} MiB waiting"
            )
            assert small_session.offline and small_session.spilled > 2 * MiB
            # more waits for the shared reader than the small pool allows, within its own
            assert not shared_session.offline and shared_session.out_bytes > 4 * MiB
            assert list(own_dir.glob("amps-py-spill-*.spill"))
            assert list(instance_dir.iterdir()) == []
            limits = served.statistics()["limits"]
            # the counts are instance-wide
            assert (limits["offline"]["clients"], limits["offline"]["offlined"]) == (1, 1)
            assert limits["offline"]["spilled_bytes"] == 0  # the instance's disk pool
            own = limits["transports"]["small"]
            assert own["queued"]["own"] and own["queued"]["limit_bytes"] == 4 * MiB
            assert own["offline"]["spilled_bytes"] == small_session.spilled
            assert own["offline"]["path"] == str(own_dir)
            assert "over MessageMemoryLimit of transport small of 4194304 bytes" in (
                served.log_text()
            )
            # the admin API's XML form and the metrics still read the limits
            assert b"<small>" in to_xml("limits", limits)
            assert metrics_of(served)[("amps_offline_clients", "")] == 1

            # both read again: everything, in order; the small one comes back online
            await on_small.read_until(count, timeout=60)
            await on_shared.read_until(count, timeout=60)
            assert on_small.messages == on_shared.messages == list(range(count))
            await wait_until(
                lambda: None if not small_session.offline else "still offline", timeout=60
            )
            assert list(own_dir.iterdir()) == []
        finally:
            await trio.aclose_forcefully(on_small.stream)
            await trio.aclose_forcefully(on_shared.stream)


async def test_a_replaying_subscriber_is_not_offlined_a_live_one_is(tmp_path: Path) -> None:
    spill_dir = tmp_path / "spill"
    spill_dir.mkdir()
    # the replay holds about 4 MiB (its high-water mark): the biggest when the live
    # reader's backlog takes the pool past 5 MiB
    extra = (
        "<MessageMemoryLimit>5MB</MessageMemoryLimit><ClientMaxCapacity>1GB</ClientMaxCapacity>"
        f"<MessageDiskPath>{spill_dir}</MessageDiskPath>"
    )
    journaled, live_count = 3000, 3000  # ~12 MiB each
    async with serve_instance(tmp_path, "replays", extra=extra) as served:
        await publish_range(served, 0, journaled)
        replayer = await bookmark_subscriber(served.port, "replayer")
        live = await RawSubscriber.connect(served.port, "live", "feed")
        try:
            replaying = session_of(served, "replayer")
            # its replay fills the outbox to the high-water mark, then waits
            await wait_until(
                lambda: None if replaying.out_bytes > 2 * MiB else f"{replaying.out_bytes}",
                timeout=60,
            )
            assert replaying.replaying == 1
            await publish_range(served, journaled, journaled + live_count)
            live_session = session_of(served, "live")
            print(
                f"replayer: {replaying.out_bytes / MiB:.2f} MiB waiting; live: "
                f"{live_session.spilled / MiB:.2f} MiB spilled"
            )
            assert live_session.offline and not replaying.offline
            assert replaying.replaying == 1 and served.instance.limits.offlined == 1

            # the replayer reads: the whole journal, then live, in order
            total = journaled + live_count
            await replayer.read_until(total, timeout=60)
            assert replayer.messages == list(range(total))
            assert replaying.replaying == 0 and not replaying.offline
            await live.read_until(live_count, timeout=60)
            assert live.messages == list(range(journaled, total))
        finally:
            await trio.aclose_forcefully(replayer.stream)
            await trio.aclose_forcefully(live.stream)
