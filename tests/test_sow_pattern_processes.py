"""Pattern SOW topics and conflated topics in real instance processes, as a user runs
them (``amps-py serve`` per instance, port 0 and ready files, kill -9):

- a sync hot-hot pair holding the same Pattern SOW topic (``prices``, ``^prices/``,
  Key ``/sym``) takes publishes to ``prices/us`` and ``prices/eu`` on both instances,
  the same keys under both topics; one side is killed -9 while both publish, and
  restarted; then both SOWs, queried per topic and by regex, hold exactly the latest
  value per (topic, key), the same records on both sides, each on its own topic;
- a conflated topic over a SOW topic: after a kill -9 mid-stream and a restart it
  holds what the underlying SOW holds (filled at start), and a subscriber gets the
  next intervals' updates;
- the replication ``sow`` check between two processes: Patterns that differ refuse the
  link both ways, naming the check, the Pattern and the fix (destination statistics,
  admin tree, both logs); the same Pattern under another Name is accepted.

Seed 20261129 (printed) picks keys, topics and prices.
"""

from __future__ import annotations

import random
import re
import time
import urllib.request
from collections import Counter
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import orjson
import pytest
import trio
from cluster import Cluster, InstanceView, destination_xml, replication_xml

from amps_py.client import CommandError, open_client
from amps_py.client.client import Client
from txlog import Journal

SEED = 20261129
SYMBOLS = ("IBM", "MSFT", "ORCL", "SAP")
TOPICS = ("prices/us", "prices/eu")


def pattern_sow_xml(name: str, pattern: str) -> str:
    return (
        f"<SOW><Topic><Name>{name}</Name><Pattern>{pattern}</Pattern>"
        "<MessageType>json</MessageType><Key>/sym</Key></Topic></SOW>"
    )


async def poll(check: Callable[[], Awaitable[str | None]], timeout: float) -> None:
    """Await ``check`` (what is still wrong, or None) until None or the deadline."""
    deadline = trio.current_time() + timeout
    while (problem := await check()) is not None:
        if trio.current_time() > deadline:
            raise AssertionError(f"after {timeout} s still: {problem}")
        await trio.sleep(0.1)  # polling interval of a condition


# ------------------------------------------------------------ the hot-hot pair


def owner(topic: str, sym: str) -> str:
    """The one instance publishing to (topic, sym): each topic gets publishes from
    both instances, each key under both topics, yet every record has one writer (a
    hot-hot pair orders two writers of one record differently on each side)."""
    return "A" if (TOPICS.index(topic) + SYMBOLS.index(sym)) % 2 == 0 else "B"


def pair_body(peer: str) -> Callable[[InstanceView], str]:
    def body(view: InstanceView) -> str:
        dest = destination_xml(peer, peer, True, view.addr(peer), topics=("prices/.*",))
        return pattern_sow_xml("prices", "^prices/") + replication_xml(dest)

    return body


Held = dict[tuple[str, str], dict[str, Any]]


async def sow_views(uri: str) -> tuple[Held, Held, list[str], list[tuple[str, str, bytes]]]:
    """One instance's SOW, queried per topic (merged) and by regex; the problems of
    records not on their own topic; (topic, k, data) of the regex query."""
    wrong: list[str] = []
    async with open_client(uri, "sow-reader") as reader:
        per_topic: Held = {}
        for topic in TOPICS:
            for r in await reader.sow(topic):
                doc = r.json()
                if r.topic != topic or doc["topic"] != topic:
                    wrong.append(f"sow {topic} returned {doc} on topic {r.topic!r}")
                per_topic[(r.topic, doc["sym"])] = doc
        regex: Held = {}
        records = await reader.sow("prices/.*", batch_size=5)
        for r in records:
            doc = r.json()
            if r.topic != doc["topic"]:
                wrong.append(f"sow prices/.* returned {doc} on topic {r.topic!r}")
            if (r.topic, doc["sym"]) in regex:
                wrong.append(f"sow prices/.* returned two records of {(r.topic, doc['sym'])}")
            regex[(r.topic, doc["sym"])] = doc
        return per_topic, regex, wrong, sorted((r.topic, r.key, r.data) for r in records)


async def converged(cluster: Cluster, want: Held, timeout: float) -> None:
    """Both instances' SOWs are ``want`` (per topic and by regex), and the same
    records (topic, SOW key, data) on both sides."""

    async def check() -> str | None:
        raw: dict[str, list[tuple[str, str, bytes]]] = {}
        for name in ("A", "B"):
            per_topic, regex, wrong, raw[name] = await sow_views(cluster.uri(name))
            if wrong:
                return f"{name}: {wrong}"
            for how, held in (("per topic", per_topic), ("by regex", regex)):
                if held != want:
                    diff = {
                        slot: (held.get(slot), want.get(slot))
                        for slot in sorted(set(held) | set(want))
                        if held.get(slot) != want.get(slot)
                    }
                    return f"{name}'s SOW {how} differs (held, latest): {diff}"
        if raw["A"] != raw["B"]:
            return f"A and B hold different records: {raw['A']} vs {raw['B']}"
        return None

    await poll(check, timeout)


def journaled(journal_dir: Path) -> Counter[tuple[str, str, bytes]]:
    """(client, topic, payload) of every message journaled on a topic of the Pattern."""
    with Journal(journal_dir, readonly=True) as journal:
        return Counter(
            (rec.client_name, rec.topic, rec.payload)
            for rec in journal.iter_records(0)
            if rec.topic.startswith("prices/")
        )


@pytest.mark.parametrize("killed", ["B", "A"], ids=["kill-B", "kill-A"])
async def test_a_hot_hot_pair_keeps_each_topic_and_key_through_a_kill(
    cluster: Cluster, killed: str
) -> None:
    print(f"seed {SEED}")
    rng = random.Random(SEED)
    survivor = "A" if killed == "B" else "B"
    topics = (("prices/.*", "json"),)  # the whole-topic form of ^prices/
    cluster.add_instance("A", "A", pair_body("B"), journal_topics=topics)
    cluster.add_instance("B", "B", pair_body("A"), journal_topics=topics)
    await trio.to_thread.run_sync(cluster.start_all)

    slots = [(t, s) for t in TOPICS for s in SYMBOLS]
    mine = {name: [slot for slot in slots if owner(*slot) == name] for name in ("A", "B")}
    n = 0

    def stream(name: str, count: int) -> list[tuple[str, dict[str, Any]]]:
        nonlocal n
        out = []
        for _ in range(count):
            n += 1
            topic, sym = rng.choice(mine[name])
            doc = {"sym": sym, "topic": topic, "px": rng.randint(1, 10_000), "n": n, "by": name}
            out.append((topic, doc))
        return out

    # three chunks per side: both up; one side killed while both publish; it is down
    chunks = {name: [stream(name, size) for size in (100, 400, 100)] for name in ("A", "B")}
    latest: Held = {}
    for name in ("A", "B"):
        for chunk in chunks[name]:
            for topic, doc in chunk:
                latest[(topic, doc["sym"])] = doc

    async def publish(client: Client, messages: list[tuple[str, dict[str, Any]]]) -> None:
        for topic, doc in messages:
            await client.publish(topic, orjson.dumps(doc))

    async with open_client(cluster.uri(survivor), f"pub{survivor}") as pub_s:
        async with open_client(cluster.uri(killed), f"pub{killed}") as pub_k:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(publish, pub_s, chunks[survivor][0])
                nursery.start_soon(publish, pub_k, chunks[killed][0])
            await pub_s.wait_persisted(pub_s.seq, timeout=30)
            await pub_k.wait_persisted(pub_k.seq, timeout=30)
            # mid-stream: the survivor's chunk on its way over, the victim's own chunk
            # in flight, not acknowledged
            await publish(pub_s, chunks[survivor][1][:200])
            await publish(pub_k, chunks[killed][1])
            await publish(pub_s, chunks[survivor][1][200:])
            await trio.to_thread.run_sync(cluster.kill, killed)
        await publish(pub_s, chunks[survivor][2])
        await trio.to_thread.run_sync(cluster.start, killed)
        # what of the victim's in-flight chunk it stored goes out before this, in order
        async with open_client(cluster.uri(killed), f"pub{killed}-again") as pub_k2:
            await publish(pub_k2, chunks[killed][1] + chunks[killed][2])
            await pub_k2.wait_persisted(pub_k2.seq, timeout=60)
        await pub_s.wait_persisted(pub_s.seq, timeout=60)

    await converged(cluster, latest, timeout=60)

    # the other instance overwrites a record of each: the later write wins on both
    handover = [("A", ("prices/eu", "IBM")), ("B", ("prices/us", "IBM"))]
    for name, (topic, sym) in handover:
        assert owner(topic, sym) != name
        doc = {"sym": sym, "topic": topic, "px": -1, "n": n + 1, "by": name}
        async with open_client(cluster.uri(name), f"handover-{name}") as pub:
            await pub.publish_persisted(topic, orjson.dumps(doc), timeout=30)
        latest[(topic, sym)] = doc
    await converged(cluster, latest, timeout=30)
    assert len(latest) == len(slots)

    # a sow_delete on one topic of the Pattern reaches the peer, and that topic only
    async with open_client(cluster.uri(killed), "deleter") as deleter:
        stats = await deleter.sow_delete("prices/eu", filter="/sym = 'IBM'")
        assert stats["records_deleted"] == 1, stats
        await deleter.wait_persisted(deleter.seq, timeout=30)
    del latest[("prices/eu", "IBM")]
    await converged(cluster, latest, timeout=30)
    await trio.to_thread.run_sync(cluster.stop_all)
    stored = {name: journaled(cluster.journal_dir(name)) for name in ("A", "B")}
    assert stored["A"] == stored["B"], "A and B journaled different messages"
    sent = Counter(
        (f"pub{survivor}", topic, orjson.dumps(doc))
        for chunk in chunks[survivor]
        for topic, doc in chunk
    )
    assert sent == Counter({m: c for m, c in stored["A"].items() if m[0] == f"pub{survivor}"}), (
        f"{survivor}'s publisher's messages are not each journaled once"
    )


# ------------------------------------------------------------ a conflated topic

INTERVAL = 1.0
CONFLATED_XML = f"""
<SOW>
  <Topic><Name>quotes</Name><MessageType>json</MessageType><Key>/sym</Key></Topic>
  <ConflatedTopic><Name>quotes-C</Name><UnderlyingTopic>quotes</UnderlyingTopic>
    <MessageType>json</MessageType><Interval>{int(INTERVAL * 1000)}ms</Interval>
  </ConflatedTopic>
</SOW>
"""


async def by_sym(client: Client, topic: str) -> dict[str, tuple[str, bytes]]:
    out = {}
    for r in await client.sow(topic):
        assert r.topic == topic, f"sow {topic} returned a record of {r.topic}"
        out[r.json()["sym"]] = (r.key, r.data)
    return out


async def test_a_conflated_topic_is_refilled_after_a_kill(cluster: Cluster) -> None:
    print(f"seed {SEED}")
    rng = random.Random(SEED)
    cluster.add_instance("C", xml_body_fn=lambda _view: CONFLATED_XML, replication_transport=False)
    await trio.to_thread.run_sync(cluster.start, "C")
    syms = [f"S{i}" for i in range(8)]
    acked = 30
    # the second half leaves S6 and S7 alone: S7, deleted between, must stay deleted
    sent = [
        orjson.dumps({"sym": rng.choice(syms if n < acked else syms[:6]), "px": n, "n": n})
        for n in range(acked + 1000)
    ]
    gone = "S7"
    assert any(orjson.loads(data)["sym"] == gone for data in sent[:acked])
    async with open_client(cluster.uri("C"), "pub") as pub:
        for data in sent[:acked]:
            await pub.publish("quotes", data)
        await pub.wait_persisted(pub.seq, timeout=30)

        async def caught_up() -> str | None:
            below, above = await by_sym(pub, "quotes"), await by_sym(pub, "quotes-C")
            return None if above == below else f"quotes-C holds {above}, quotes {below}"

        # the conflated store holds records now: the restart must not keep them as
        # they are (S7 is deleted below it, likely before the next interval)
        await poll(caught_up, 30)
        stats = await pub.sow_delete("quotes", filter=f"/sym = '{gone}'")
        assert stats["records_deleted"] == 1, stats
        seqs = [await pub.publish("quotes", data) for data in sent[acked:]]
        # killed mid-stream: ten more persisted, the rest in flight
        await pub.wait_persisted(seqs[9], timeout=30)
        acked += 10
        await trio.to_thread.run_sync(cluster.kill, "C")
        with trio.move_on_after(5):
            try:
                await pub.wait_persisted(pub.seq, timeout=2)
            except Exception as exc:  # the connection died with C
                print(f"pub after the kill: {exc!r}")
    await trio.to_thread.run_sync(cluster.start, "C")

    def latest(prefix: int) -> dict[str, bytes]:
        out = {}
        for data in sent[:prefix]:
            out[orjson.loads(data)["sym"]] = data
        out.pop(gone, None)
        return out

    async with open_client(cluster.uri("C"), "q") as q:
        # filled at start: no interval needs to pass (nothing new was published)
        underlying = await by_sym(q, "quotes")
        conflated = await by_sym(q, "quotes-C")
        assert conflated == underlying, "the conflated topic differs from its SOW topic"
        held = {sym: data for sym, (_k, data) in underlying.items()}
        prefixes = [p for p in range(acked, len(sent) + 1) if latest(p) == held]
        assert prefixes, f"quotes holds {held}: the latest of no prefix of what was published"
        print(f"the journal kept the first {prefixes} of {len(sent)} messages")
    copied = re.findall(r"conflated topic quotes-C: (\d+) record\(s\) copied", cluster.log("C"))
    assert copied[-1:] == [str(len(underlying))], copied

    # a subscriber to the conflated topic gets the next intervals' updates
    burst = [orjson.dumps({"sym": sym, "px": 5000 + i, "n": i}) for i in range(40) for sym in "XY"]
    async with (
        open_client(cluster.uri("C"), "sub") as sub,
        open_client(cluster.uri("C"), "pub2") as pub,
        sub.subscribe("quotes-C") as live,
    ):
        started = time.monotonic()
        for data in burst:
            await pub.publish("quotes", data)
        await pub.wait_persisted(pub.seq, timeout=30)
        last: dict[str, int] = {}
        got = 0
        with trio.fail_after(30):
            while last != {"X": 5039, "Y": 5039}:
                m = await live.get(30)
                doc = m.json()
                assert m.topic == "quotes-C" and m.key, (m.topic, m.key)
                assert doc["px"] > last.get(doc["sym"], 0), f"{doc} after {last}"
                last[doc["sym"]] = doc["px"]
                got += 1
        elapsed = time.monotonic() - started
        # one update per key per interval at most (the first interval may be partial)
        assert got <= 2 * (elapsed / INTERVAL + 2), (got, elapsed)
        async with open_client(cluster.uri("C"), "q2") as q:
            final = await by_sym(q, "quotes-C")
        assert {s: orjson.loads(final[s][1])["px"] for s in "XY"} == {"X": 5039, "Y": 5039}
    await trio.to_thread.run_sync(cluster.stop_all)


# ------------------------------------------------------------ the sow check


def checked_body(peer: str, name: str, pattern: str) -> Callable[[InstanceView], str]:
    def body(view: InstanceView) -> str:
        dest = destination_xml(peer, peer, True, view.addr(peer))  # topics .*
        return (
            pattern_sow_xml(name, pattern)
            + "<Admin><InetAddr>127.0.0.1:0</InetAddr></Admin>"
            + replication_xml(dest)
        )

    return body


def admin_tree(cluster: Cluster, name: str) -> dict[str, Any]:
    port = cluster.server(name).ports["admin"]
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/amps/instance", timeout=10) as r:
        return dict(orjson.loads(r.read()))


async def test_patterns_that_differ_refuse_the_link_both_ways(cluster: Cluster) -> None:
    cluster.add_instance("A", "A", checked_body("B", "prices", "^prices/"))
    cluster.add_instance("B", "B", checked_body("A", "prices", "^quotes/"))
    await trio.to_thread.run_sync(cluster.start_all)
    async with open_client(cluster.uri("A"), "pub") as pub:
        await pub.publish("prices/us", b'{"sym":"IBM","px":1}')  # no ack: B refuses it

        # each side's hello describes its Pattern topic; the other lacks that Pattern
        for up, down, pattern in (("A", "B", "^prices/"), ("B", "A", "^quotes/")):
            fix = (
                f"Fix: add <SOW><Topic><Name>prices</Name><Pattern>{pattern}</Pattern>"
                f"<MessageType>json</MessageType><Key>/sym</Key></Topic></SOW> to {down}'s "
                "config (a Pattern topic is matched by its Pattern; the Name may differ), "
                f"or ExcludeValidation sow on {up}'s Destination Topic .* (json)"
            )
            problem = (
                f"check sow failed for topic Pattern {pattern} (json): SOW topic prices on "
                f"{up} keeps every topic matching {pattern} (MessageType json, Key /sym), "
                f"but {down} has no SOW topic with that Pattern"
            )

            def refused(up: str = up, down: str = down) -> str | None:
                error = cluster.server(up).destination(down)["last_error"]
                return None if "validation failed" in error else f"{up}->{down}: {error!r}"

            await trio.to_thread.run_sync(
                lambda refused=refused: cluster.wait_until_sync(refused, 30)
            )
            error = cluster.server(up).destination(down)["last_error"]
            assert problem in error and fix in error, error
            tree = await trio.to_thread.run_sync(admin_tree, cluster, up)
            shown = tree["replication"]["destinations"][down]
            assert not shown["is_connected"] and problem in shown["last_error"], shown
            log = cluster.log(down)
            assert f"refused replication from {up}" in log and problem in log and fix in log, (
                f"{down}'s log does not name the refusal:\n{log[-3000:]}"
            )
    assert cluster.server("B").statistics()["journal"]["records"] == 0, "B stored A's message"
    assert pub.persisted_seq == 0
    await trio.to_thread.run_sync(cluster.stop_all)


async def test_the_same_pattern_under_another_name_is_accepted(cluster: Cluster) -> None:
    cluster.add_instance("A", "A", checked_body("B", "prices", "^prices/"))
    cluster.add_instance("B", "B", checked_body("A", "px", "^prices/"))
    await trio.to_thread.run_sync(cluster.start_all)
    async with open_client(cluster.uri("A"), "pub") as pub:
        await pub.publish_persisted("prices/us", b'{"sym":"IBM","px":1}', timeout=30)
    async with open_client(cluster.uri("B"), "pub") as pub:
        await pub.publish_persisted("prices/eu", b'{"sym":"IBM","px":2}', timeout=30)
    for name in ("A", "B"):
        async with open_client(cluster.uri(name), "q") as q:

            async def both(q: Client = q, name: str = name) -> str | None:
                held = sorted((r.topic, r.data) for r in await q.sow("^prices/"))
                want = [
                    ("prices/eu", b'{"sym":"IBM","px":2}'),
                    ("prices/us", b'{"sym":"IBM","px":1}'),
                ]
                return None if held == want else f"{name} holds {held}"

            await poll(both, 30)
            with pytest.raises(CommandError):
                await q.sow("px" if name == "B" else "prices")  # a Name is no topic
    for name in ("A", "B"):
        log = cluster.log(name)
        assert "validation failed" not in log and "refused replication" not in log, log[-3000:]
    await trio.to_thread.run_sync(cluster.stop_all)
