"""Fault test of the geo-ha fabric: six instances at three sites under cuts between the
sites and kill -9 of one member inside a site, with one publisher per instance waiting
for persisted acks. After the faults stop, every instance replays from EPOCH and the
checker classifies every published message: each one must be on all six instances
exactly once, in publisher order, and nothing else may be there. Seeded and bounded in
time; the seed, the faults and the table are printed.

The topology is that of config/examples/geo-ha (see its README.md):

- sites (Groups) Chicago (chi-1, chi-2), NewYork (ny-1, ny-2), London (ldn-1, ldn-2);
- inside a site: a sync Destination to the partner, passing through the two other
  sites' Groups;
- between sites: one async Destination per remote site, named after it, listing its
  two servers as failover InetAddrs in priority order, no PassThrough; zstd, 50ms ack
  conflation and a 2s heartbeat, as in the example.

Only the ReconnectTimeout differs (a short back-off instead of up to 15 s), so that a
link that failed during a fault comes back within the time the test allows. Every
cross-site link (source instance, remote instance) goes through a fault proxy, so a
cut between sites is a proxy fault; kills are SIGKILL of one member of a site followed
by a restart, one member down at a time.
"""

from __future__ import annotations

import random
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor

import trio
from checker import Pub, Stored, classify, payload, replay_instance
from cluster import Cluster, InstanceView, ProxyHandle, destination_xml, replication_xml
from harness import wait_until

from amps_py.client import AMPSError, open_client

SEED = 20240611
TOPIC = "orders"
SITES: dict[str, tuple[str, str]] = {
    "Chicago": ("chi-1", "chi-2"),
    "NewYork": ("ny-1", "ny-2"),
    "London": ("ldn-1", "ldn-2"),
}
SITE_OF = {name: site for site, members in SITES.items() for name in members}
NAMES = [name for members in SITES.values() for name in members]
#: one publisher per instance, always connected to that instance
PUBLISHERS = {f"pub@{name}": name for name in NAMES}
#: messages a publisher may have without a persisted ack
WINDOW = 50
#: the faults, in a seeded random order
FAULTS = (
    ("kill",) * 4 + ("partition",) * 2 + ("partition+kill",) * 2 + ("cut",) * 3 + ("failover",) * 2
)
#: a short back-off so links are back soon after a fault (the example's is 1s..15s)
RECONNECT = "<ReconnectTimeout>200ms,500ms,1s</ReconnectTimeout>"
#: the wide-area settings of the example's remote-site Destinations
WAN = (
    "<Compression>zstd</Compression>"
    "<AckConflationInterval>50ms</AckConflationInterval>"
    "<HeartbeatInterval>2s</HeartbeatInterval>"
)


def _with_reconnect(destination: str) -> str:
    return destination.replace("</Transport>", RECONNECT + "</Transport>", 1)


def site_body(name: str) -> Callable[[InstanceView], str]:
    """The ``<Replication>`` element of ``name``, as in config/examples/geo-ha."""
    site = SITE_OF[name]
    (partner,) = [m for m in SITES[site] if m != name]
    others = [s for s in SITES if s != site]

    def make(view: InstanceView) -> str:
        destinations = [
            destination_xml(
                partner,
                site,
                True,
                view.addr(partner),
                passthrough=[f"^{s}$" for s in others],
            )
        ]
        for remote in others:
            destinations.append(
                destination_xml(
                    remote, remote, False, [view.addr(m) for m in SITES[remote]], extra=WAN
                )
            )
        return replication_xml(*(_with_reconnect(d) for d in destinations))

    return make


async def test_geo_ha_fabric_survives_site_cuts_and_kills(cluster: Cluster) -> None:
    rng = random.Random(SEED)
    print(f"\nseed {SEED}")
    began = time.monotonic()
    for name in NAMES:
        cluster.add_instance(name, SITE_OF[name], site_body(name))
    cross = [(a, b) for a in NAMES for b in NAMES if SITE_OF[a] != SITE_OF[b]]
    # the instances listen on port 0 (or on ports reserved for them while the proxies
    # start): no proxy can take one of their ports
    with ThreadPoolExecutor(8) as pool:  # start the proxy processes side by side
        handles = list(
            pool.map(lambda ab: cluster.proxy(ab[0], ab[1], seed=SEED + cross.index(ab)), cross)
        )
    links: dict[tuple[str, str], ProxyHandle] = dict(zip(cross, handles, strict=True))
    cluster.start_together(NAMES)

    #: instances the test killed and has not restarted yet
    down: set[str] = set()

    def check_running() -> None:
        """Fail at once, with its output, when an instance exited on its own."""
        for name in NAMES:
            if name not in down and not cluster.alive(name):
                server = cluster.server(name)
                code = server.proc.returncode if server.proc is not None else None
                raise AssertionError(
                    f"instance {name} exited on its own (code {code}); its output:\n"
                    f"{server.tail(80)}"
                )

    def site_links(src_site: str, dst_site: str) -> list[ProxyHandle]:
        return [links[(a, b)] for a in SITES[src_site] for b in SITES[dst_site]]

    def destinations_state() -> str:
        """Where each destination of each running instance is connected, or why not."""
        check_running()
        parts = []
        for name in NAMES:
            if not cluster.alive(name):
                parts.append(f"{name}: down")
                continue
            for d in cluster.server(name).statistics()["replication"]["destinations"]:
                where = d["remote_name"] if d["is_connected"] else f"DOWN ({d['last_error']})"
                parts.append(f"{name}->{d['name']}: {where}")
        return "; ".join(parts)

    def all_connected() -> str | None:
        check_running()
        for name in NAMES:
            for d in cluster.server(name).statistics()["replication"]["destinations"]:
                if not d["is_connected"]:
                    return f"not every destination is connected: {destinations_state()}"
        return None

    await wait_until(all_connected, 60)
    print(f"fabric up after {time.monotonic() - began:.1f} s")

    acked = dict.fromkeys(PUBLISHERS, 0)
    sent = dict.fromkeys(PUBLISHERS, 0)
    stop = trio.Event()

    async def publisher(name: str) -> None:
        """Publish with at most WINDOW messages unacknowledged; reconnect to the same
        instance after it restarts; once ``stop`` is set, publish nothing new but make
        sure everything sent so far is persisted (republishing what a killed instance
        never stored, under the same seq and payload)."""
        home = PUBLISHERS[name]
        while not (stop.is_set() and acked[name] >= sent[name]):
            pub = None
            try:
                async with open_client(cluster.uri(home), name, timeout=5) as pub:
                    assert pub.seq >= acked[name], f"{home} forgot acknowledged messages of {name}"
                    while not (stop.is_set() and pub.persisted_seq >= sent[name]):
                        limit = sent[name] if stop.is_set() else pub.seq + 1
                        if pub.seq - pub.persisted_seq < WINDOW and pub.seq < limit:
                            seq = pub.seq + 1
                            await pub.publish(TOPIC, payload(name, seq, f"{name}-{seq}"))
                            sent[name] = max(sent[name], seq)
                        else:
                            want = pub.seq if stop.is_set() else pub.seq - WINDOW // 2
                            with trio.move_on_after(0.2):
                                await pub.wait_persisted(want, timeout=1)
                        acked[name] = max(acked[name], pub.persisted_seq)
                        await trio.lowlevel.checkpoint()
            except (AMPSError, OSError, trio.BrokenResourceError, TimeoutError, trio.TooSlowError):
                pass
            finally:
                if pub is not None:
                    acked[name] = max(acked[name], pub.persisted_seq)
            if not (stop.is_set() and acked[name] >= sent[name]):
                await trio.sleep(0.05)  # reconnect pause while the instance restarts

    async def progress(low: int, high: int, during: str) -> None:
        """Wait until the publishers got ``low``..``high`` (seeded) more persisted acks,
        and each publisher at least a few: every site keeps working."""
        start = dict(acked)
        target = sum(start.values()) + rng.randint(low, high)

        def check() -> str | None:
            check_running()
            slow = [n for n in PUBLISHERS if acked[n] < start[n] + 5]
            total = sum(acked.values())
            if total >= target and not slow:
                return None
            return (
                f"{during}: {total}/{target} acked, no progress for {slow}; "
                f"acked {acked}; {destinations_state()}"
            )

        await wait_until(check, 60)

    # ------------------------------------------------------------------ the faults
    async def kill_member(name: str, detail: list[str], cut_off: str = "") -> None:
        """SIGKILL ``name``; once its partner and the other sites' destinations to its
        site (except those of site ``cut_off``, partitioned from it) have failed over
        to the partner, restart it."""
        site = SITE_OF[name]
        (partner,) = [m for m in SITES[site] if m != name]
        down.add(name)
        cluster.kill(name)

        def failed_over() -> str | None:
            check_running()
            if cluster.server(partner).destination(name)["is_connected"]:
                return f"{partner} still shows its sync destination {name} connected"
            for src in NAMES:
                if SITE_OF[src] in (site, cut_off):
                    continue
                d = cluster.server(src).destination(site)
                if not d["is_connected"] or d["remote_name"] != partner:
                    return (
                        f"{src}'s destination {site} has not failed over to {partner} "
                        f"(connected={d['is_connected']}, address {d['address']}, "
                        f"last error {d['last_error']!r})"
                    )
            return None

        killed_at = trio.current_time()
        await wait_until(failed_over, 30)
        failover_s = trio.current_time() - killed_at
        await trio.to_thread.run_sync(cluster.start, name)
        down.discard(name)
        detail.append(
            f"kill {name} (failover {failover_s:.1f}s, down {trio.current_time() - killed_at:.1f}s)"
        )

    async def kill(detail: list[str]) -> None:
        """Kill -9 one member of a site and restart it."""
        await kill_member(rng.choice(NAMES), detail)

    async def partition(detail: list[str], with_kill: bool = False) -> None:
        """Blackhole every link between two sites, both ways: what is in flight is lost
        and the connections stay open, while the publishers keep getting persisted acks
        (sync inside each site). Midway the connections are reset, so the reconnection
        attempts hang in the blackhole too; ``with_kill``: then a member of one of the
        two sites is killed and restarted. Then heal and reset the links: resync."""
        a, b = rng.sample(list(SITES), 2)
        held = site_links(a, b) + site_links(b, a)
        began_at = trio.current_time()
        for link in held:
            link.blackhole(True)
        await progress(1000, 2000, f"during the partition {a}|{b}")
        reset = sum(link.cut() for link in held)
        if with_kill:
            victim = rng.choice(SITES[a] + SITES[b])
            await kill_member(victim, detail, cut_off=b if SITE_OF[victim] == a else a)
        await progress(500, 1000, f"during the partition {a}|{b}, after a reset")
        for link in held:
            link.heal()
            link.cut()
        detail.insert(
            0,
            f"partition {a}|{b} for {trio.current_time() - began_at:.1f}s "
            f"({reset} connections reset in it)",
        )

    async def partition_kill(detail: list[str]) -> None:
        await partition(detail, with_kill=True)

    async def cut(detail: list[str]) -> None:
        """Reset every connection from one site to another."""
        a, b = rng.sample(list(SITES), 2)
        n = sum(link.cut() for link in site_links(a, b))
        detail.append(f"cut {a}->{b} ({n} connections)")

    async def failover(detail: list[str]) -> None:
        """One instance's first address for a remote site refuses connections: its
        destination moves to the second address; heal once it has."""
        src = rng.choice(NAMES)
        site = rng.choice([s for s in SITES if s != SITE_OF[src]])
        first, second = SITES[site]
        link = links[(src, first)]
        detail.append(f"refuse {src}->{first}")
        link.refuse(True)
        link.cut()

        def moved() -> str | None:
            check_running()
            d = cluster.server(src).destination(site)
            if d["is_connected"] and d["remote_name"] == second:
                return None
            return (
                f"{src}'s destination {site} is not on {second} (connected="
                f"{d['is_connected']}, address {d['address']}, error {d['last_error']!r})"
            )

        await wait_until(moved, 30)
        await progress(50, 150, f"while {src}->{first} refuses")
        link.heal()

    kinds: dict[str, Callable[[list[str]], Awaitable[None]]] = {
        "kill": kill,
        "partition": partition,
        "partition+kill": partition_kill,
        "cut": cut,
        "failover": failover,
    }
    schedule = list(FAULTS)
    rng.shuffle(schedule)
    actions: list[str] = []
    async with trio.open_nursery() as nursery:
        for name in PUBLISHERS:
            nursery.start_soon(publisher, name)
        with trio.fail_after(180):
            for kind in schedule:
                await progress(150, 400, f"before fault {len(actions) + 1} (done: {actions})")
                detail: list[str] = []
                print(f"fault {len(actions) + 1}: {kind}", flush=True)
                at = time.monotonic() - began
                await kinds[kind](detail)
                actions.append(f"[{at:.1f}s] " + ", ".join(detail))
                print(actions[-1], flush=True)
            await progress(100, 200, "after the faults")
            stop.set()  # the publishers finish once all they sent is persisted
    print(f"fault phase done after {time.monotonic() - began:.1f} s")
    print("sent", sent)
    print("acked", acked)
    assert acked == sent, f"publishers ended with unacknowledged messages: {acked} vs {sent}"

    # ------------------------------------------------------------------ catch up, check
    cluster.heal()
    check_running()  # all six run: the last kill restarted its instance
    total = sum(sent.values())

    def everywhere() -> str | None:
        check_running()
        counts = {n: int(cluster.server(n).statistics()["journal"]["records"]) for n in NAMES}
        short = {n: total - c for n, c in counts.items() if c < total}
        if not short:
            return None
        return (
            f"instances still missing messages (of {total}): {short}; "
            f"destinations: {destinations_state()}"
        )

    await wait_until(everywhere, 120)
    print(f"caught up after {time.monotonic() - began:.1f} s")
    resent = {n: cluster.server(n).statistics()["journal"]["duplicates"] for n in NAMES}
    print("copies offered again (resyncs, failovers) and discarded by each journal:", resent)

    stored: dict[str, list[Stored]] = {}

    async def replay(name: str) -> None:
        stored[name] = await replay_instance(cluster.uri(name), TOPIC, timeout=60)

    async with trio.open_nursery() as nursery:
        for name in NAMES:
            nursery.start_soon(replay, name)
    published = {
        name: [Pub(seq, f"{name}-{seq}", seq <= acked[name]) for seq in range(1, sent[name] + 1)]
        for name in PUBLISHERS
    }
    report = classify(published, {n: stored[n] for n in NAMES})
    print(report.table())
    print(f"checked after {time.monotonic() - began:.1f} s")
    logs = ", ".join(str(cluster.server(n).log_file) for n in NAMES)
    assert report.errors == 0, f"{report.describe()}\nlogs: {logs}"
    short = {n: c.ok for n, c in report.instances.items() if c.ok != total}
    assert not short, f"not every message is on every instance once (of {total}): {short}"
    # the faults must be survived by design, not by the destination supervisor
    crashed = [n for n in NAMES if "failed unexpectedly" in cluster.log(n)]
    assert not crashed, f"a destination failed unexpectedly (see the logs) on {crashed}"
