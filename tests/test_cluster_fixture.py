"""The cluster fixture (tests/cluster.py) on two standalone instances: configs, start,
publish, kill -9, restart, the data is still there (judged by tests/checker.py), proxies
on links, and nothing left running after stop_all."""

from __future__ import annotations

import os
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
import trio
from checker import Pub, classify, dump_published, payload, replay_instance
from cluster import Cluster, InstancePorts, destination_xml, replication_xml
from harness import REPO

from amps_py.client import open_client
from amps_py.config import load_config, parse_config

MESSAGES = 40


def assert_gone(pids: list[int]) -> None:
    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)


def test_generated_standalone_configs_load(cluster: Cluster) -> None:
    cluster.add_instance("A", "east")
    cluster.add_instance("B")
    config = load_config(cluster.write_config("A"))
    assert (config.name, config.group) == ("A", "east")
    # nothing is chosen ahead: the instance listens on a port the OS picks
    assert [t.port for t in config.transports] == [0]
    assert cluster.ports("A") == InstancePorts(0, 0)
    assert load_config(cluster.write_config("B")).group == "B"
    with pytest.raises(RuntimeError, match="'A' has not started"):
        cluster.uri("A")
    with pytest.raises(KeyError, match=r"no instance 'C' in the cluster \(instances: A, B\)"):
        cluster.uri("C")
    cluster.start("A")
    client = cluster.server("A").ports["json-tcp"]
    assert client != 0 and cluster.ports("A").client == client
    assert cluster.uri("A") == f"tcp://127.0.0.1:{client}/amps/json"
    # a restart comes back on the same port, so clients and peers find it again
    cluster.restart("A")
    assert cluster.server("A").ports["json-tcp"] == client


def test_destination_xml_has_the_replication_schema_shape() -> None:
    xml = destination_xml(
        "B",
        "groupB",
        True,
        ["127.0.0.1:1", "127.0.0.1:2"],
        topics=("orders", ("quotes.*", "json")),
        passthrough=(".*",),
    )
    dest = ET.fromstring(xml)
    assert [child.tag for child in dest] == [
        "Name",
        "Group",
        "SyncType",
        "Topic",
        "Topic",
        "PassThrough",
        "Transport",
    ]
    assert (dest.findtext("Name"), dest.findtext("Group"), dest.findtext("SyncType")) == (
        "B",
        "groupB",
        "sync",
    )
    assert [t.findtext("Name") for t in dest.findall("Topic")] == ["orders", "quotes.*"]
    assert dest.findtext("Transport/Type") == "amps-replication"
    assert [a.text for a in dest.findall("Transport/InetAddr")] == ["127.0.0.1:1", "127.0.0.1:2"]
    async_dest = ET.fromstring(destination_xml("C", "g", "async", "h:3"))
    assert async_dest.findtext("SyncType") == "async"
    assert async_dest.find("PassThrough") is None
    with pytest.raises(ValueError, match="`sync` must be"):
        destination_xml("C", "g", "eventually", "h:3")


def test_replication_configs_point_at_peers_or_their_proxies(cluster: Cluster) -> None:
    def to_peer(peer: str):  # type: ignore[no-untyped-def]
        return lambda view: replication_xml(
            destination_xml(peer, view.groups[peer], True, view.addr(peer))
        )

    cluster.add_instance("A", "gA", to_peer("B"))
    cluster.add_instance("B", "gB", to_peer("A"))
    # a peer's config names B before B has started: B's replication port is reserved
    assert cluster.ports("B").replication == 0
    assert cluster.view("A").addr("B") == f"127.0.0.1:{cluster.ports('B').replication}"
    assert cluster.ports("B").replication != 0
    assert cluster.view("B").addr("A") == f"127.0.0.1:{cluster.ports('A').replication}"
    ports = {n: cluster.ports(n) for n in ("A", "B")}
    assert ports["A"].replication not in (0, ports["B"].replication)
    link = cluster.proxy("A->B")
    assert cluster.proxy("A", "B") is link
    assert cluster.view("A").addr("B") == f"127.0.0.1:{link.listen_port}"
    assert cluster.view("B").addr("A") == f"127.0.0.1:{ports['A'].replication}"

    text = cluster.config_text("A")
    root = ET.fromstring(text.encode())
    assert root.findtext("Group") == "gA"
    transports = root.findall("Transports/Transport")
    assert [t.findtext("Type") for t in transports] == ["tcp", "amps-replication"]
    assert transports[1].findtext("InetAddr") == f"127.0.0.1:{ports['A'].replication}"
    inet = root.findtext("Replication/Destination/Transport/InetAddr")
    assert inet == f"127.0.0.1:{link.listen_port}"

    # amps_py.config accepts the generated config as it is
    config = parse_config(text, "A.xml")
    assert config.group == "gA"
    assert config.replication_transport is not None
    assert config.replication_transport.port == ports["A"].replication
    (dest,) = config.replication
    assert (dest.name, dest.group, dest.sync) == ("B", "gB", True)
    assert dest.inet_addrs == (("127.0.0.1", link.listen_port),)
    assert dest.replicates("orders", "json")


async def test_start_publish_kill_restart_and_the_data_is_still_there(
    cluster: Cluster, tmp_path: Path
) -> None:
    cluster.add_instance("A")
    cluster.add_instance("B")
    cluster.start_all()
    assert cluster.alive("A") and cluster.alive("B")

    published: dict[str, list[Pub]] = {}
    for name in ("A", "B"):
        publisher = f"pub-{name}"
        async with open_client(cluster.uri(name), publisher) as client:
            for _ in range(MESSAGES):
                seq = client.seq + 1
                await client.publish("orders", payload(publisher, seq, f"{publisher}-{seq}"))
            await client.wait_persisted(client.seq, timeout=20)
        published[publisher] = [Pub(s, f"{publisher}-{s}", True) for s in range(1, MESSAGES + 1)]

    old_pid = cluster.server("A").proc.pid  # type: ignore[union-attr]
    cluster.kill("A")
    assert not cluster.alive("A")
    assert_gone([old_pid])
    cluster.restart("A")
    assert cluster.alive("A") and cluster.server("A").starts == 2
    assert cluster.journal_dir("A").is_dir()
    assert cluster.log("A"), "instance A wrote no log"

    stored = {name: await replay_instance(cluster.uri(name), "orders", 20) for name in "AB"}
    report = classify({p: v for p, v in published.items() if p == "pub-A"}, {"A": stored["A"]})
    assert report.errors == 0 and report.total.ok == MESSAGES, report.describe()
    report = classify(published, stored)
    print(report.table())
    # each instance holds its own publisher's messages only (no replication here)
    assert report.instances["A"].ok == report.instances["B"].ok == MESSAGES
    assert report.instances["A"].lost == report.instances["B"].lost == MESSAGES

    # the checker program against the running instances
    published_file = tmp_path / "published.jsonl"
    dump_published(published_file, {"pub-A": published["pub-A"]})
    command = [
        sys.executable,
        str(REPO / "tests" / "checker.py"),
        f"A={cluster.uri('A')}",
        "--published",
        str(published_file),
        "--topic",
        "orders",
        "--timeout",
        "20",
    ]
    done = await trio.run_process(command, capture_stdout=True, capture_stderr=True, check=False)
    out = done.stdout.decode()
    assert done.returncode == 0, out + done.stderr.decode()
    assert out.splitlines()[1].split() == ["A", str(MESSAGES), "0", "0", "0", "0", "0"]

    # an acknowledged message the instance never got makes the program fail
    dump_published(published_file, {"pub-A": [*published["pub-A"], Pub(MESSAGES + 1)]})
    done = await trio.run_process(command, capture_stdout=True, capture_stderr=True, check=False)
    out = done.stdout.decode()
    assert done.returncode == 1, out + done.stderr.decode()
    assert f"A: lost pub-A#{MESSAGES + 1}: acknowledged but not replayed" in out

    pids = [p.pid for p in cluster.processes()]
    cluster.stop_all()
    assert not cluster.alive("A") and not cluster.alive("B")
    assert_gone(pids)


def test_proxies_are_controlled_and_stopped_with_the_cluster(cluster: Cluster) -> None:
    cluster.add_instance("A", xml_body_fn=lambda view: "", replication_transport=False)
    cluster.add_instance("B")
    link = cluster.proxy("A", "B", seed=3)
    assert link.stats()["accepted"] == 0
    cluster.partition("A", "B")
    assert link.stats()["blackhole"] is True
    link.delay(0.05)
    cluster.heal()
    stats = link.stats()
    assert (stats["blackhole"], stats["delay"]) == (False, 0.0)
    with pytest.raises(KeyError, match=r"call cluster\.proxy"):
        cluster.partition("B", "B")
    with pytest.raises(ValueError, match=r"proxy\('A', 'B'\)"):
        cluster.proxy("A")
    cluster.start("A")
    with pytest.raises(RuntimeError, match="already running"):
        cluster.start("A")
    pids = [p.pid for p in cluster.processes()]
    assert len(pids) == 2  # A and the proxy; B was never started
    cluster.stop_all()
    assert_gone(pids)
