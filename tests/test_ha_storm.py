"""Failover storm on the shipped hot-hot example (issue 16's acceptance test).

The two configs of ``config/examples/hot-hot`` run as they are (copied with fresh ports
and local journals by ``test_examples_running.copy_example``: the sync pair, its
authenticated replication links and its back-off are the user's). A publisher (an
:class:`HAClient` with a :class:`FilePublishStore`) and a durable subscriber (an
:class:`HAClient` with a :class:`FileBookmarkStore`, a bookmark subscription from EPOCH,
each message marked processed) start on instance A with the URIs [A, B]. The instance
the clients are on is killed with SIGKILL at seeded random moments, A and B alternately,
and restarted after a seeded random delay; the next kill waits until the restarted
instance is back and both replication links are up, so the pair is never down at once.
No downgrade action is configured: the example's link is ``sync``, so while one
instance is down the survivor holds persisted acks back until its partner returns; the
publisher's store grows meanwhile and empties when the pair is whole again.

What a user relies on, checked at the end:

- both clients fail over at every kill (to the other instance);
- the subscriber received every acknowledged message, in the publisher's order, with
  no gap; a message handed over twice is flagged ``possible_duplicate`` and was not
  processed when the connection was lost (only the unprocessed tail is redelivered);
- the publisher's store ends empty (also when opened again from its directory);
- each instance's journal holds each message once, in publisher order
  (``tests/checker.py``); and ``amps-py txlog verify`` finds both journals sound.

The seed is fixed and printed; ``AMPS_STORM_SEED`` replays another storm.
"""

from __future__ import annotations

import os
import random
from collections import deque
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

import orjson
import pytest
import test_examples_running as examples
import trio
from checker import Pub, Stored, classify, payload, replay_instance
from harness import ServerProcess, assert_journal_sound, wait_until

from amps_py.client import (
    CONNECTED,
    DISCONNECTED,
    FAILED_OVER,
    FileBookmarkStore,
    FilePublishStore,
    HAClient,
    HAMessage,
    HASubscription,
    open_ha_client,
)

SEED = int(os.environ.get("AMPS_STORM_SEED", "1616"))
KILLS = 10
TOPIC = "orders"
PUBLISHER = "storm-pub"
#: pause between two publishes: a steady stream of a few hundred messages a second
PACE = 0.004
#: seconds from "pair whole again" to the next kill (seeded, uniform)
KILL_AFTER = (0.3, 1.5)
#: seconds a killed instance stays down (seeded, uniform)
DOWN_FOR = (0.1, 1.0)
#: the subscriber processes a message once this many later ones arrived ...
LAG = 20
#: ... or nothing arrived for this long
IDLE = 1.0


@pytest.fixture
def pair(tmp_path: Path) -> Iterator[dict[str, ServerProcess]]:
    """The hot-hot example's two instances, started; stopped (or killed) at teardown."""
    servers = examples.copy_example(
        sorted((examples.EXAMPLES / "hot-hot").glob("*.xml")), tmp_path / "hot-hot"
    )
    try:
        examples.start_all(servers)
        yield servers
    finally:
        for server in servers.values():
            if server.alive:
                try:
                    server.stop()
                except AssertionError:
                    server.kill()
        while examples._RESERVED:
            examples._RESERVED.pop().close()


def pair_whole(servers: dict[str, ServerProcess], survivor: str, losses: int) -> str | None:
    """None once both destinations are connected and the survivor's has seen more than
    ``losses`` disconnects (so its "connected" is the new link, not a stale figure)."""
    restarted = next(name for name in servers if name != survivor)
    out = servers[survivor].destination(restarted)
    back = servers[restarted].destination(survivor)
    if out["disconnect_count"] <= losses:
        return f"{survivor} has not noticed that {restarted} went down yet"
    if not (out["is_connected"] and back["is_connected"]):
        return (
            f"replication links not both up: {survivor}->{restarted} "
            f"{out['is_connected']}, {restarted}->{survivor} {back['is_connected']}"
        )
    return None


async def test_failover_storm_on_the_hot_hot_example(
    tmp_path: Path, pair: dict[str, ServerProcess]
) -> None:
    rng = random.Random(SEED)
    print(f"storm seed {SEED} (AMPS_STORM_SEED to change)")
    names = sorted(pair)  # amps-a, amps-b
    uris = [pair[name].uri for name in names]
    by_uri = {pair[name].uri: name for name in names}
    # (client, state, detail) as the clients report them
    states: list[tuple[str, str, dict[str, Any]]] = []
    received: list[tuple[int, bool]] = []  # (seq, possible_duplicate) as handed over
    processed_through = 0  # the consumer's highest processed seq (it processes in order)
    # the consumer's processed_through when the subscriber lost each connection
    processed_at_loss: list[int] = [0]
    bad_duplicates: list[str] = []
    stop_publishing = trio.Event()
    publisher_stopped = trio.Event()

    def on_state(client: str) -> Any:
        def record(state: str, detail: dict[str, Any]) -> None:
            states.append((client, state, detail))
            if client == "sub" and state == DISCONNECTED:
                processed_at_loss.append(processed_through)

        return record

    async def publish_stream(pub: HAClient) -> None:
        seq = 0
        while not stop_publishing.is_set():
            seq += 1
            assert await pub.publish(TOPIC, payload(PUBLISHER, seq, f"{PUBLISHER}-{seq}")) == seq
            await trio.sleep(PACE)  # pacing of the stream, not a synchronisation
        publisher_stopped.set()

    async def consume(sub: HASubscription) -> None:
        """Hand messages over in order; process each once LAG later ones have arrived
        (or the stream went quiet): an application with work in progress, so a
        failover finds an unprocessed tail."""
        nonlocal processed_through
        highest = 0
        pending: deque[HAMessage] = deque()
        while True:
            try:
                message: HAMessage | None = await sub.get(IDLE)
            except TimeoutError:
                message = None
            except StopAsyncIteration:
                return
            if message is not None:
                doc = orjson.loads(message.data)
                assert doc["p"] == PUBLISHER
                seq = int(doc["s"])
                received.append((seq, message.possible_duplicate))
                if seq <= highest:  # handed over before
                    if not message.possible_duplicate:
                        bad_duplicates.append(f"seq {seq} handed over again, not flagged")
                    if seq <= processed_at_loss[-1]:
                        bad_duplicates.append(
                            f"seq {seq} redelivered although processed before the "
                            f"connection was lost (processed through {processed_at_loss[-1]})"
                        )
                highest = max(highest, seq)
                pending.append(message)
            while pending and (message is None or len(pending) > LAG):
                done = pending.popleft()
                done.processed()
                seq = int(orjson.loads(done.data)["s"])
                if seq == processed_through + 1:
                    processed_through = seq

    def connected_to(clients: list[HAClient], name: str) -> str | None:
        wrong = [c.name for c in clients if not (c.connected and by_uri.get(c.uri) == name)]
        return f"{wrong} not connected to {name}" if wrong else None

    pub_store = FilePublishStore(tmp_path / "publish-store")
    bookmark_store = FileBookmarkStore(tmp_path / "bookmark-store")
    kills: list[tuple[str, float]] = []  # (victim, seconds down)
    try:
        with trio.fail_after(150):
            async with (
                open_ha_client(
                    PUBLISHER, uris, publish_store=pub_store, on_state=on_state("pub")
                ) as pub,
                open_ha_client(
                    "storm-sub", uris, bookmark_store=bookmark_store, on_state=on_state("sub")
                ) as sub_client,
            ):
                clients = [pub, sub_client]
                assert await pub.wait_connected(20) == uris[0]
                assert await sub_client.wait_connected(20) == uris[0]
                async with (
                    sub_client.subscribe(TOPIC, bookmark="0", sub_id="storm") as sub,
                    trio.open_nursery() as nursery,
                ):
                    nursery.start_soon(consume, sub)
                    nursery.start_soon(publish_stream, pub)
                    for k in range(KILLS):
                        victim, survivor = names[k % 2], names[(k + 1) % 2]
                        await trio.sleep(rng.uniform(*KILL_AFTER))  # the seeded kill moment
                        await wait_until(partial(connected_to, clients, victim), 60)
                        losses = pair[survivor].destination(victim)["disconnect_count"]
                        down_for = rng.uniform(*DOWN_FOR)
                        await trio.to_thread.run_sync(pair[victim].kill)
                        kills.append((victim, down_for))
                        # both clients fail over to the survivor while the victim is down
                        await wait_until(partial(connected_to, clients, survivor), 60)
                        await trio.sleep(down_for)  # the seeded outage
                        await trio.to_thread.run_sync(pair[victim].start)
                        await wait_until(partial(pair_whole, pair, survivor, losses), 30)
                    stop_publishing.set()
                    await publisher_stopped.wait()  # no publish after the flush's last seq
                    await pub.flush(timeout=60)
                    last = pub_store.last_seq
                    await wait_until(
                        lambda: (
                            None
                            if processed_through >= last
                            else f"subscriber processed through {processed_through} of {last}"
                        ),
                        60,
                    )
                    nursery.cancel_scope.cancel()
        acked = pub_store.discarded_through
        kept = len(pub_store)
    finally:
        pub_store.close()
        bookmark_store.close()

    # the publisher's store is empty, on disk too
    with FilePublishStore(tmp_path / "publish-store") as reopened:
        assert (len(reopened), reopened.last_seq) == (0, last)
    assert kept == 0 and acked == last

    # every kill made both clients fail over, to the other instance
    for client in ("pub", "sub"):
        overs = [d for c, s, d in states if c == client and s == FAILED_OVER]
        assert [by_uri[d["uri"]] for d in overs] == [names[(k + 1) % 2] for k in range(KILLS)], (
            f"{client} failed over {[(by_uri[d['previous']], by_uri[d['uri']]) for d in overs]}"
        )

    # the subscriber: every acknowledged message, in order, no gap; duplicates flagged
    published = {PUBLISHER: [Pub(seq, f"{PUBLISHER}-{seq}") for seq in range(1, last + 1)]}
    seen = classify(published, {"sub": [Stored(PUBLISHER, seq) for seq, _ in received]})
    firsts: list[int] = []
    known: set[int] = set()
    for seq, _ in received:
        if seq not in known:
            known.add(seq)
            firsts.append(seq)
    counts = seen.instances["sub"]
    dup = len(received) - len(firsts)
    columns = ("seed", "kills", "acked", "delivered", "lost", "dup", "reordered")
    values = (SEED, len(kills), acked, len(firsts), counts.lost, dup, counts.reordered)
    print("  ".join(f"{c:>9}" for c in columns))
    print("  ".join(f"{v:>9}" for v in values))
    print("kills (victim, seconds down):", [(v, round(s, 2)) for v, s in kills])
    replays = [d["republished"] for c, s, d in states if c == "pub" and s == CONNECTED]
    republished = sum(replays)
    print("publisher republished at each logon:", replays)
    print("flagged possible duplicates:", [seq for seq, flagged in received if flagged][:40])
    assert firsts == list(range(1, last + 1)), seen.describe()
    assert counts.lost == 0 and counts.reordered == 0
    assert not bad_duplicates, bad_duplicates[:10]
    # the storm exercised the replay of the publisher's tail and redeliveries
    assert republished > 0 and dup > 0, f"republished {republished}, duplicates {dup}"

    # each journal holds each message once, in publisher order
    stored: dict[str, list[Stored]] = {}
    for name in names:
        stored[name] = await replay_instance(pair[name].uri, TOPIC, timeout=30, quiet=0.3)
    report = classify(published, stored)
    print(report.describe())
    assert report.errors == 0 and all(c.ok == last for c in report.instances.values()), (
        report.describe()
    )
    for name in names:
        assert pair[name].stop() == 0, pair[name].tail()
        assert_journal_sound(pair[name].journal_dir)
