"""Per-transport slow-client pools (amps_py.server.limits.InstanceLimits.pools_for) and
who the limits act on when one pool is over (amps_py.server.flow), with the stand-in
connections of test_flow: a pool over its limit only acts on the clients sharing it,
an offlined client spills under its own MessageDiskPath into its own disk pool, and a
client whose bookmark replay runs is never offlined. No sockets, no event loop."""

from __future__ import annotations

from pathlib import Path

import pytest
from test_flow import StubSession

from amps_py import reasons
from amps_py.server.flow import disconnect_if_too_old, disconnect_slow_clients
from amps_py.server.limits import InstanceLimits, PoolSettings

GiB = 1024**3


def two_pools(tmp_path: Path, own: PoolSettings) -> InstanceLimits:
    """The instance's pools (1000 bytes in memory, 10_000 on disk, spilling under
    tmp_path/instance), transport ``a`` with settings of its own (``own``) and
    transport ``plain`` with none."""
    (tmp_path / "instance").mkdir(exist_ok=True)
    return InstanceLimits(
        1000,
        1 << 30,
        disk_limit=10_000,
        disk_path=tmp_path / "instance",
        transports={"a": own, "plain": PoolSettings()},
    )


def client(limits: InstanceLimits, conn_id: int, transport: str) -> StubSession:
    return StubSession(limits, conn_id, client_name=f"{transport}{conn_id}", transport=transport)


def test_a_transport_gets_its_own_pool_only_for_what_it_sets(tmp_path: Path) -> None:
    limits = InstanceLimits(
        1000,
        1 << 30,
        disk_limit=10_000,
        disk_path=tmp_path,
        age_limit=30.0,
        transports={
            "memory": PoolSettings(memory_limit=100),
            "disk": PoolSettings(disk_limit=0),
            "path": PoolSettings(disk_path=tmp_path / "p", age_limit=5.0),
            "plain": PoolSettings(),
        },
    )
    shared = limits.instance_pools
    # an own memory pool, and a disk pool of its own sized by the default rule
    memory = limits.pools_for("memory")
    assert memory.memory is not shared.memory and memory.memory.limit == 100
    assert memory.memory.setting == "MessageMemoryLimit of transport memory"
    assert memory.disk is not shared.disk and memory.disk.limit == GiB
    assert memory.disk.setting == "MessageDiskLimit of transport memory"
    assert (memory.disk_path, memory.age_limit) == (tmp_path, 30.0)
    # an own disk pool only: the instance's memory pool, no offlining for its clients
    disk = limits.pools_for("disk")
    assert disk.memory is shared.memory and disk.disk is not shared.disk
    assert not disk.offlining and shared.offlining
    # policies only: the instance's pools
    path = limits.pools_for("path")
    assert path.memory is shared.memory and path.disk is shared.disk
    assert (path.disk_path, path.age_limit) == (tmp_path / "p", 5.0)
    # no settings of its own, or a transport not named: the instance's objects
    assert limits.pools_for("plain") is shared
    assert limits.pools_for("unknown") is shared
    # a big own memory limit gets a disk pool as big (max(1 GiB, MessageMemoryLimit))
    big = InstanceLimits(1000, 1, transports={"big": PoolSettings(memory_limit=3 * GiB)})
    assert big.pools_for("big").disk.limit == 3 * GiB


def test_a_transport_pool_over_its_limit_offlines_only_its_own_clients(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    own_dir = tmp_path / "a"
    own_dir.mkdir()
    limits = two_pools(tmp_path, PoolSettings(memory_limit=500, disk_path=own_dir))
    small_a, big_a = client(limits, 1, "a"), client(limits, 2, "a")
    huge = client(limits, 3, "plain")
    everyone = [small_a, big_a, huge]
    huge.queue(900)  # the biggest of all, within the instance's 1000
    small_a.queue(200)
    big_a.queue(400)  # 600 in a's pool: over its 500
    with caplog.at_level("WARNING", logger="amps_py.server.session"):
        disconnect_slow_clients(small_a, limits, everyone)
    assert big_a.offline and big_a.spilled_to == own_dir
    assert not huge.offline and not small_a.offline
    a = limits.pools_for("a")
    assert (a.memory.total, a.disk.total) == (200, 400)
    # the instance's pools did not move
    assert (limits.queued.total, limits.disk.total) == (900, 0)
    assert limits.offlined == 1  # the counts stay instance-wide
    (record,) = caplog.records
    assert "over MessageMemoryLimit of transport a of 500 bytes" in record.getMessage()
    assert f"spills to {own_dir}" in record.getMessage()


def test_the_instance_pool_over_its_limit_never_offlines_a_transport_with_its_own(
    tmp_path: Path,
) -> None:
    limits = two_pools(tmp_path, PoolSettings(memory_limit=5000))
    own = client(limits, 1, "a")
    shared_big, shared_small = client(limits, 2, "plain"), client(limits, 3, "json-tcp")
    own.queue(3000)  # the biggest, but in a's pool (within its 5000)
    shared_big.queue(700)
    shared_small.queue(400)  # 1100 in the instance's pool: over 1000
    disconnect_slow_clients(shared_small, limits, [own, shared_big, shared_small])
    assert shared_big.offline and shared_big.spilled_to == tmp_path / "instance"
    assert not own.offline and not shared_small.offline
    assert limits.disk.total == 700


def test_a_disk_pool_over_its_limit_disconnects_only_among_its_sharers(tmp_path: Path) -> None:
    limits = two_pools(tmp_path, PoolSettings(memory_limit=500, disk_limit=1000))
    a_small, a_big = client(limits, 1, "a"), client(limits, 2, "a")
    shared = client(limits, 3, "plain")
    for s in (a_small, a_big, shared):
        s.offline = True
    shared.spill(5000)  # the most on disk, within the instance's 10_000
    a_small.spill(300)
    a_big.spill(800)  # 1100 on a's disk: over its 1000
    disconnect_slow_clients(a_small, limits, [a_small, a_big, shared])
    assert a_big.slow is not None and a_big.slow.reason == reasons.SLOW_CLIENT
    assert "over MessageDiskLimit of transport a of 1000 bytes" in a_big.slow.detail
    assert a_small.slow is None and shared.slow is None
    assert limits.slow_client_disk == 1


def test_offlining_into_a_full_disk_pool_sheds_in_that_pool(tmp_path: Path) -> None:
    """A client offlined from the instance's memory pool into a transport's own (small)
    disk pool: that disk pool is checked too, and sheds among its own clients."""
    limits = two_pools(
        tmp_path, PoolSettings(disk_limit=600)
    )  # a shares the instance's memory pool
    a = client(limits, 1, "a")
    shared = client(limits, 2, "plain")
    a.queue(700)
    shared.queue(400)  # 1100 in the instance's memory pool
    disconnect_slow_clients(shared, limits, [a, shared])
    # a was the biggest: offlined into its own disk pool (700 > 600), then disconnected
    assert a.slow is not None and "over MessageDiskLimit of transport a of 600" in a.slow.detail
    assert shared.slow is None and not shared.offline
    assert (limits.offlined, limits.slow_client_disk) == (1, 1)


def test_sharing_the_memory_pool_with_disk_limit_0_disconnects_instead(tmp_path: Path) -> None:
    limits = two_pools(tmp_path, PoolSettings(disk_limit=0))
    a = client(limits, 1, "a")
    shared = client(limits, 2, "plain")
    a.queue(700)
    shared.queue(600)  # 1300: over 1000
    disconnect_slow_clients(shared, limits, [a, shared])
    # a is the biggest and may not be offlined (its MessageDiskLimit is 0)
    assert a.slow is not None and not a.offline
    assert "over MessageMemoryLimit of 1000 bytes" in a.slow.detail
    assert not shared.offline and limits.slow_client_pool == 1


def test_a_client_whose_bookmark_replay_runs_is_not_offlined_the_next_biggest_is(
    tmp_path: Path,
) -> None:
    limits = InstanceLimits(1000, 1 << 30, disk_limit=10_000, disk_path=tmp_path)
    replaying, live, small = (client(limits, i, "json-tcp") for i in range(3))
    replaying.replaying = 1
    replaying.queue(600)  # the biggest
    live.queue(500)
    small.queue(100)  # 1200: over 1000
    disconnect_slow_clients(small, limits, [replaying, live, small])
    assert live.offline and not replaying.offline and not small.offline
    # once its replay has ended (gone live), it is a candidate like any other
    replaying.replaying = 0
    small.queue(400)  # 600 + 500 in memory
    disconnect_slow_clients(small, limits, [replaying, live, small])
    assert replaying.offline and not small.offline
    assert limits.offlined == 2


def test_a_client_that_only_replays_keeps_the_pool_over_rather_than_going_offline(
    tmp_path: Path,
) -> None:
    limits = InstanceLimits(1000, 1 << 30, disk_limit=10_000, disk_path=tmp_path)
    replaying = client(limits, 0, "json-tcp")
    replaying.replaying = 2
    replaying.queue(1500)  # within its own capacity (1 GiB in the stand-in)
    disconnect_slow_clients(replaying, limits, [replaying])
    assert not replaying.offline and replaying.slow is None and limits.offlined == 0


def test_a_transport_age_limit_overrides_the_instance_one(tmp_path: Path) -> None:
    limits = two_pools(tmp_path, PoolSettings(age_limit=5.0))
    a, shared = client(limits, 1, "a"), client(limits, 2, "plain")
    a.oldest_since = shared.oldest_since = 0.0
    assert disconnect_if_too_old(a, limits, now=6.0)  # a's 5 s
    assert not disconnect_if_too_old(shared, limits, now=1e6)  # the instance has none
    assert a.slow is not None and "over ClientMessageAgeLimit of 5 s" in a.slow.detail
    assert limits.slow_client_age == 1


def test_statistics_keep_the_instance_keys_and_show_each_transport_pool(tmp_path: Path) -> None:
    own_dir = tmp_path / "a"
    limits = two_pools(tmp_path, PoolSettings(memory_limit=500, disk_path=own_dir, age_limit=5.0))
    client(limits, 1, "a").queue(300)
    client(limits, 2, "plain").queue(100)
    stats = limits.statistics()
    assert stats["queued"]["bytes"] == 100 and stats["queued"]["limit_bytes"] == 1000
    assert stats["offline"]["path"] == str(tmp_path / "instance")
    # only transports with a pool or policy of their own are listed
    assert list(stats["transports"]) == ["a"]
    a = stats["transports"]["a"]
    assert a["queued"] == {"bytes": 300, "limit_bytes": 500, "peak_bytes": 0, "own": True}
    assert a["offline"]["own"] is True and a["offline"]["limit_bytes"] == GiB
    assert a["offline"]["path"] == str(own_dir) and a["offline"]["own_path"] is True
    assert a["client_message_age_limit_s"] == 5.0 and a["own_client_message_age_limit"]
