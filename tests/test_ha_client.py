"""The HA client: failover, replay of unacknowledged publishes, durable resubscribe,
heartbeat detection of a frozen server.

What a user relies on:

- the server chooser rotates through the list (or asks the callable), the first retry
  after a loss is immediate and later ones back off up to a cap;
- a publisher that loses its server fails over and its messages end up stored once
  each, in its sequence order, on the new server (the unacknowledged tail is
  republished before any new message); the publish store ends empty;
- a full publish store blocks the publisher until persisted acks free room;
- a bookmark subscriber fails over and continues after its last *processed* message;
  redelivered messages are flagged, processed ones are never handed over again;
- ``on_state`` reports connected / disconnected / connected / failed_over /
  resubscribed;
- a server frozen with SIGSTOP is detected within two heartbeat intervals, every time.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Callable
from functools import partial
from typing import Any

import orjson
import pytest
import trio
import trio.testing
from checker import payload, replay_instance
from cluster import Cluster, InstanceView, destination_xml, replication_xml
from harness import reserve_port, wait_until
from inprocess import InProcessInstance

from amps_py.client import (
    CONNECTED,
    DISCONNECTED,
    FAILED_OVER,
    RESUBSCRIBED,
    HAClient,
    HASubscription,
    MemoryPublishStore,
    open_ha_client,
)
from amps_py.client import ha as ha_module
from amps_py.client.ha_policy import Backoff, ServerChooser

TOPIC = "orders"


def recorder(into: list[tuple[str, dict[str, Any]]]) -> Callable[[str, dict[str, Any]], None]:
    return lambda state, detail: into.append((state, detail))


# ---------------------------------------------------------------------- pure policy


def test_backoff_is_immediate_for_the_first_round_then_grows_to_the_cap() -> None:
    two = Backoff(initial=0.05, maximum=0.3, round_size=2)
    # failures 0 and 1: each server of the first round at once; then a wait per round
    assert [two.delay(n) for n in range(10)] == [0, 0, 0.05, 0, 0.1, 0, 0.2, 0, 0.3, 0]
    one = Backoff(initial=0.05, maximum=0.3, round_size=1)
    assert [one.delay(n) for n in range(6)] == [0, 0.05, 0.1, 0.2, 0.3, 0.3]


def test_chooser_rotates_the_list_and_calls_a_callable() -> None:
    chooser = ServerChooser(["tcp://a:1/amps/json", "tcp://b:2/amps/json"])
    seen = []
    for _ in range(4):
        seen.append(chooser.choose())
        chooser.advance()
    assert seen == ["tcp://a:1/amps/json", "tcp://b:2/amps/json"] * 2
    calls = iter(["tcp://x:1/amps/json", "tcp://y:1/amps/json"])
    by_call = ServerChooser(lambda: next(calls))
    assert (by_call.choose(), by_call.choose()) == ("tcp://x:1/amps/json", "tcp://y:1/amps/json")
    with pytest.raises(ValueError, match="split a comma-separated"):
        ServerChooser("tcp://a:1/amps/json,tcp://b:2/amps/json")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="at least one"):
        ServerChooser([])


async def test_reconnect_attempts_back_off_on_a_fake_clock(
    autojump_clock: trio.testing.MockClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Both servers down: A and B are tried at once, then each round waits longer, up
    to the cap (virtual time: no real waiting)."""
    attempts: list[tuple[str, float]] = []

    def refuse(uri: str, name: str, **_: Any) -> Any:
        attempts.append((uri, trio.current_time()))
        raise OSError(f"cannot connect to {uri}: refused (fake)")

    monkeypatch.setattr(ha_module, "open_client", refuse)
    servers = ["tcp://a:1/amps/json", "tcp://b:2/amps/json"]
    async with open_ha_client(
        "backoff", servers, reconnect_delay=0.1, max_reconnect_delay=0.4
    ) as ha:
        with trio.move_on_after(10):
            while len(attempts) < 10:
                await trio.sleep(0.01)
        assert not ha.connected
    start = attempts[0][1]
    times = [round(t - start, 6) for _, t in attempts[:10]]
    print("attempt times:", times)
    assert [uri for uri, _ in attempts[:10]] == servers * 5
    # waits before rounds: 0.1, 0.2, 0.4, 0.4 (capped); none within a round
    assert times == [0, 0, 0.1, 0.1, 0.3, 0.3, 0.7, 0.7, 1.1, 1.1]


# ---------------------------------------------------------------------- stores


# ---------------------------------------------------------------------- one instance


async def test_publishes_go_through_the_store_until_persisted(
    inproc: InProcessInstance,
) -> None:
    store = MemoryPublishStore(max_bytes=100)
    states: list[str] = []
    async with open_ha_client(
        "store-pub", [inproc.uri], publish_store=store, on_state=lambda s, d: states.append(s)
    ) as ha:
        await ha.wait_connected(10)
        seqs = [await ha.publish(TOPIC, payload("store-pub", i)) for i in range(1, 51)]
        assert seqs == list(range(1, 51))
        await ha.flush(timeout=30)
        assert len(store) == 0 and store.discarded_through == 50
    assert states == [CONNECTED]
    stored = await replay_instance(inproc.uri, TOPIC)
    assert [m.seq for m in stored] == list(range(1, 51))


async def test_a_full_store_blocks_the_publisher_until_acks_free_room(
    inproc: InProcessInstance,
) -> None:
    """While no server is reachable the store fills and the next publish waits; once
    the (callable) chooser names a live server, the replay is acknowledged and the
    waiting publish goes through."""
    messages = [payload("full", seq) for seq in (1, 2, 3)]  # of one length
    store = MemoryPublishStore(max_bytes=2 * len(messages[0]) + 1)  # room for two
    dead = reserve_port()  # bound, not listening: connections are refused
    reachable = False
    chosen: list[str] = []

    def choose() -> str:
        uri = inproc.uri if reachable else f"tcp://127.0.0.1:{dead.getsockname()[1]}/amps/json"
        chosen.append(uri)
        return uri

    blocked_seq: list[int] = []
    try:
        async with open_ha_client(
            "full", choose, publish_store=store, max_reconnect_delay=0.1
        ) as ha:
            first = [await ha.publish(TOPIC, message) for message in messages[:2]]
            assert first == [1, 2] and not ha.connected

            async def third() -> None:
                blocked_seq.append(await ha.publish(TOPIC, messages[2]))

            async with trio.open_nursery() as nursery:
                nursery.start_soon(third)
                await wait_until(lambda: None if len(chosen) >= 3 else "retrying", 60)
                assert blocked_seq == [], "a full store must block the publisher"
                reachable = True
                await ha.wait_connected(10)
            assert blocked_seq == [3]
            await ha.flush(timeout=10)
    finally:
        dead.close()
    assert len(store) == 0
    assert [m.seq for m in await replay_instance(inproc.uri, TOPIC)] == [1, 2, 3]


class SlowSyncStore(MemoryPublishStore):
    """A memory store whose sync costs what an fsync might (20 ms), and counts."""

    def __init__(self) -> None:
        super().__init__()
        self.syncs = 0

    def sync(self) -> None:
        time.sleep(0.02)  # the cost of an fsync, in the worker thread
        self.syncs += 1


async def test_the_store_is_synced_once_per_group_of_publishes(
    inproc: InProcessInstance,
) -> None:
    """A slow sync does not cost a sync per message: what publishers store while one
    sync runs goes out after the next one, as one group."""
    store = SlowSyncStore()
    async with open_ha_client("groups", [inproc.uri], publish_store=store) as ha:
        await ha.wait_connected(10)
        before = store.syncs
        for i in range(1, 501):
            await ha.publish(TOPIC, payload("groups", i))
        await ha.flush(timeout=30)
        syncs = store.syncs - before
    print(f"500 publishes, {syncs} syncs")
    assert 1 <= syncs <= 25
    assert [m.seq for m in await replay_instance(inproc.uri, TOPIC)] == list(range(1, 501))


async def test_the_stored_tail_is_sent_before_new_publishes(inproc: InProcessInstance) -> None:
    """20 publishes wait in the store while no server is reachable; a second task keeps
    publishing while the client connects and replays: the server stores them all in
    sequence order (a new publish never overtakes the replayed tail)."""
    dead = reserve_port()
    reachable = False

    def choose() -> str:
        return inproc.uri if reachable else f"tcp://127.0.0.1:{dead.getsockname()[1]}/amps/json"

    states: list[tuple[str, dict[str, Any]]] = []
    try:
        async with open_ha_client(
            "tail", choose, max_reconnect_delay=0.05, on_state=recorder(states)
        ) as ha:
            for i in range(1, 21):
                await ha.publish(TOPIC, payload("tail", i))

            async def more() -> None:
                # a steady stream through the connect and the replay, then 20 more
                i = 21
                after = 0
                while after < 20:
                    after += ha.connected
                    assert await ha.publish(TOPIC, payload("tail", i)) == i
                    i += 1
                    await trio.sleep(0.0005)

            async with trio.open_nursery() as nursery:
                nursery.start_soon(more)
                reachable = True
            await ha.flush(timeout=10)
            total = ha.publish_store.last_seq
    finally:
        dead.close()
    print(f"{states[0][1]['republished']} replayed, {total} in all")
    stored = await replay_instance(inproc.uri, TOPIC)
    assert [m.seq for m in stored] == list(range(1, total + 1))
    assert states[0][0] == CONNECTED and states[0][1]["republished"] >= 20


# ---------------------------------------------------------------------- a hot-hot pair


#: a sync peer that has not acknowledged for a second is downgraded to async, so that a
#: survivor's persisted acks do not wait for a dead peer (AMPS's automatic downgrade)
DOWNGRADE_XML = """
<Actions>
  <Action>
    <On><Module>amps-action-on-schedule</Module><Options><Every>0.25s</Every></Options></On>
    <Do><Module>amps-action-do-downgrade-replication</Module>
        <Options><Age>1s</Age></Options></Do>
    <Do><Module>amps-action-do-upgrade-replication</Module>
        <Options><Age>0.5s</Age></Options></Do>
  </Action>
</Actions>
"""


def pair_body(peer: str) -> Callable[[InstanceView], str]:
    def make(view: InstanceView) -> str:
        dest = destination_xml(peer, "hot", True, view.addr(peer))
        return replication_xml(dest) + DOWNGRADE_XML

    return make


def start_pair(cluster: Cluster) -> list[str]:
    """A and B replicating to each other synchronously; returns [A's URI, B's URI]."""
    cluster.add_instance("A", "hot", pair_body("B"))
    cluster.add_instance("B", "hot", pair_body("A"))
    cluster.start_all()
    return [cluster.uri("A"), cluster.uri("B")]


N = 200  # messages published
K = 30  # the subscriber processes 1..K, then only receives, until it has failed over


async def test_publisher_and_durable_subscriber_fail_over_when_a_is_killed(
    cluster: Cluster,
) -> None:
    servers = start_pair(cluster)
    pub_states: list[tuple[str, dict[str, Any]]] = []
    sub_states: list[tuple[str, dict[str, Any]]] = []
    received: list[tuple[int, bool]] = []  # (seq, possible_duplicate) as handed over
    published = 0
    pub_store = MemoryPublishStore()

    async def publish_all(pub: HAClient) -> None:
        nonlocal published
        for i in range(1, N + 1):
            assert await pub.publish(TOPIC, payload("ha-pub", i)) == i
            published = i
            await trio.sleep(0.005)  # pacing: a steady stream that A's death interrupts

    async def consume(sub: HASubscription) -> None:
        resumed = False
        async for message in sub:
            seq = int(orjson.loads(message.data)["s"])
            resumed = resumed or (bool(received) and seq <= received[-1][0])
            received.append((seq, message.possible_duplicate))
            if seq <= K or resumed:
                message.processed()
            if seq == N:
                return

    live_seqs: list[int] = []

    async def consume_live(live: HASubscription) -> None:
        async for message in live:
            live_seqs.append(int(orjson.loads(message.data)["s"]))
            assert not message.possible_duplicate  # never flagged: no bookmark store
            if live_seqs[-1] == N:
                return

    with trio.fail_after(90):
        async with (
            open_ha_client(
                "ha-pub", servers, publish_store=pub_store, on_state=recorder(pub_states)
            ) as pub,
            open_ha_client("ha-sub", servers, on_state=recorder(sub_states)) as sub_client,
        ):
            assert await pub.wait_connected(10) == servers[0]
            assert await sub_client.wait_connected(10) == servers[0]
            async with (
                sub_client.subscribe(TOPIC, bookmark="0", sub_id="durable") as sub,
                sub_client.subscribe(TOPIC, sub_id="live") as live,
                trio.open_nursery() as nursery,
            ):
                nursery.start_soon(consume, sub)
                nursery.start_soon(consume_live, live)
                nursery.start_soon(publish_all, pub)
                await wait_until(
                    lambda: (
                        None
                        if published >= 80 and len(received) >= K + 10
                        else f"published {published}, received {len(received)}"
                    ),
                    30,
                )
                await trio.to_thread.run_sync(cluster.kill, "A")
                print(f"A killed after {published} published, {len(received)} received")
            await pub.flush(timeout=30)
        assert len(pub_store) == 0, "every publish is acknowledged in the end"

    print("publisher states:", pub_states)
    print("subscriber states:", [s for s, _ in sub_states])
    expected = [CONNECTED, DISCONNECTED, CONNECTED, FAILED_OVER, RESUBSCRIBED]
    assert [s for s, _ in pub_states] == expected
    assert [s for s, _ in sub_states] == expected
    assert pub_states[2][1]["uri"] == servers[1] and sub_states[3][1]["previous"] == servers[0]
    # the live subscription was re-established too: it got what was published after
    assert sub_states[4][1]["subscriptions"] == 2 and live_seqs[-1] == N

    # on B: the publisher's messages once each, in its order (tail before new ones)
    stored = await replay_instance(servers[1], TOPIC)
    assert [m.seq for m in stored if m.publisher == "ha-pub"] == list(range(1, N + 1))

    # the subscriber: 1..m from A, then from K+1 (after its last processed message)
    # to N; redeliveries (<= m) flagged, nothing after them flagged
    cut = next(i for i in range(1, len(received)) if received[i][0] <= received[i - 1][0])
    before, after = received[:cut], received[cut:]
    m = before[-1][0]
    print(f"subscriber: received 1..{m} on A, resumed at {after[0][0]} on B")
    assert before == [(seq, False) for seq in range(1, m + 1)]
    assert after == [(seq, seq <= m) for seq in range(K + 1, N + 1)]


async def test_a_frozen_server_is_detected_within_two_heartbeat_intervals_every_time(
    cluster: Cluster,
) -> None:
    """SIGSTOP the server in use: the client notices within two intervals (plus a
    little scheduling slack) and fails over; twice in a row, so a watchdog armed
    only once would be caught."""
    servers = start_pair(cluster)
    uri = dict(zip("AB", servers, strict=True))
    interval, slack = 1.0, 0.5
    events: list[tuple[str, float, dict[str, Any]]] = []
    try:
        async with open_ha_client(
            "hb",
            servers,
            heartbeat=interval,
            connect_timeout=2,
            on_state=lambda s, d: events.append((s, trio.current_time(), d)),
        ) as ha:
            assert await ha.wait_connected(10) == uri["A"]
            for frozen, other in (("A", "B"), ("B", "A")):
                mark = len(events)
                # several quiet intervals on a healthy connection: nothing but
                # heartbeats arrives, and the watchdog must keep being re-armed by them
                await trio.sleep(3 * interval)  # the observation period itself
                assert ha.uri == uri[frozen] and ha.connected
                assert [s for s, _, _ in events[mark:]] == [], "no failover while healthy"
                cluster.server(frozen).signal(signal.SIGSTOP)
                frozen_at = trio.current_time()

                def lost(mark: int = mark) -> str | None:
                    if any(s == DISCONNECTED for s, _, _ in events[mark:]):
                        return None
                    return "the frozen server is not detected yet"

                await wait_until(lost, 60)
                noticed = next(t for s, t, _ in events[mark:] if s == DISCONNECTED) - frozen_at
                print(
                    f"{frozen} frozen: detected after {noticed:.3f} s "
                    f"(limit {2 * interval:g} s + {slack:g} s slack)"
                )
                assert noticed <= 2 * interval + slack
                # and not on a whim: a heartbeat came at most one interval before
                assert noticed >= interval - slack
                await ha.wait_connected(10)
                assert ha.uri == uri[other]
                assert FAILED_OVER in [s for s, _, _ in events[mark:]]
                cluster.server(frozen).signal(signal.SIGCONT)
    finally:
        for name in "AB":
            if cluster.server(name).alive:
                cluster.server(name).signal(signal.SIGCONT)


async def test_a_server_that_drops_every_logon_is_not_redialled_in_a_tight_loop() -> None:
    """A server that accepts the logon and closes the connection at once: each such
    connection counts as a failed attempt, so the back-off grows (before, a successful
    logon reset it and the client redialled as fast as it could)."""
    from amps_py.protocol import FrameDecoder, encode_frame

    connections = 0

    async def drop_after_logon(stream: trio.SocketStream) -> None:
        nonlocal connections
        connections += 1
        decoder = FrameDecoder()
        while True:
            data = await stream.receive_some(65536)
            if not data:
                return
            decoder.receive_data(data)
            for frame in decoder.frames():
                if frame.header.get("c") == "logon":
                    ack = {"c": "ack", "a": "processed", "status": "success", "s": 0}
                    ack["cid"] = frame.header.get("cid")
                    await stream.send_all(encode_frame(ack))
                    await stream.aclose()
                    return

    async with trio.open_nursery() as nursery:
        (listener,) = await nursery.start(
            partial(trio.serve_tcp, drop_after_logon, 0, host="127.0.0.1")
        )
        port = listener.socket.getsockname()[1]
        async with open_ha_client(
            "dropped",
            [f"tcp://127.0.0.1:{port}/amps/json"],
            reconnect_delay=0.1,
            max_reconnect_delay=0.4,
        ):
            await trio.sleep(1.5)  # the observation window, not a synchronisation
        print(f"{connections} connections in 1.5 s")
        assert 2 <= connections <= 10, connections
        nursery.cancel_scope.cancel()
