"""The replication chapter's own example configurations (the AMPS User Guide text this
project started from, "Replication"), with only what the text elides filled in: an
instance name, a client transport, a TransactionLog for the replicated topic, and
paths and ports (tests never need a fixed port: the replication ports are reserved,
client transports listen on port 0). Each passes ``amps-py config check`` and runs
(the two-instance ones as a pair), publishing in the message type it names:

- Example 25.1/25.2: a sync hot-hot pair replicating topic ``topic`` of type fix;
- automatic downgrade and upgrade: the ``<Actions>`` block;
- slow client offlining: instance and per-transport limits, a bson transport;
- replication security: Entitlement and Authentication on the replication transport,
  an Authenticator on the destination's transport, the AMPS default modules.
"""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path

import bson
import pytest
from clirun import run
from harness import ServerProcess, reserve_port

from amps_py.client import open_client

FIX_ORDER = "35=D\x0111={n}\x0155=IBM\x0138=100\x01"


def _pair_config(
    name: str, peer: str, listen: int, peer_port: int, journal: Path, *, secure: bool
) -> str:
    """Example 25.1 (amps-1) or 25.2 (amps-2); with ``secure``, the Replication
    Security snippet's modules on the replication transport and the destination."""
    receiving = (
        "<Entitlement><Module>amps-default-entitlement-module</Module></Entitlement>"
        "<Authentication><Module>amps-default-authentication-module</Module>"
        "</Authentication>"
        if secure
        else ""
    )
    authenticator = (
        "<Authenticator><Module>amps-default-authenticator-module</Module></Authenticator>"
        if secure
        else ""
    )
    sync = "async" if secure else "sync"
    return f"""<AMPSConfig>
    <Name>{name}</Name>
    <Group>DataCenter-NYC-1</Group>
    <Transports>
        <Transport>
            <Name>amps-replication</Name>
            <Type>amps-replication</Type>
            <InetAddr>127.0.0.1:{listen}</InetAddr>
            {receiving}
        </Transport>
        <Transport>
            <Name>fix-tcp</Name><Type>tcp</Type><InetAddr>127.0.0.1:0</InetAddr>
            <Protocol>amps</Protocol><MessageType>fix</MessageType>
        </Transport>
    </Transports>
    <TransactionLog>
        <JournalDirectory>{journal}</JournalDirectory>
        <Topic><Name>topic</Name><MessageType>fix</MessageType></Topic>
    </TransactionLog>
    <Replication>
        <Destination>
            <Topic>
                <MessageType>fix</MessageType>
                <Name>topic</Name>
            </Topic>
            <Name>{peer}</Name>
            <Group>DataCenter-NYC-1</Group>
            <SyncType>{sync}</SyncType>
            <Transport>
                <InetAddr>127.0.0.1:{peer_port}</InetAddr>
                <Type>amps-replication</Type>
                {authenticator}
            </Transport>
        </Destination>
    </Replication>
</AMPSConfig>
"""


ACTIONS_CONFIG = """<AMPSConfig>
    <Name>amps-actions</Name>
    <Transports>
        <Transport>
            <Name>json-tcp</Name><Type>tcp</Type><InetAddr>127.0.0.1:0</InetAddr>
            <Protocol>amps</Protocol><MessageType>json</MessageType>
        </Transport>
    </Transports>
    <TransactionLog>
        <JournalDirectory>{journal}</JournalDirectory>
        <Topic><Name>.*</Name><MessageType>json</MessageType></Topic>
    </TransactionLog>
    <Actions>
        <Action>
            <On>
                <Module>amps-action-on-schedule</Module>
                <Options>
                    <Every>15s</Every>
                </Options>
            </On>
            <Do>
                <Module>amps-action-do-downgrade-replication</Module>
                <Options>
                    <Age>60s</Age>
                </Options>
            </Do>
            <Do>
                <Module>amps-action-do-upgrade-replication</Module>
                <Options>
                    <Age>10s</Age>
                </Options>
            </Do>
        </Action>
    </Actions>
</AMPSConfig>
"""

SLOW_CLIENT_CONFIG = """<AMPSConfig>
    <Name>amps-offlining</Name>
    <MessageMemoryLimit>10GB</MessageMemoryLimit>
    <MessageDiskPath>{offline}</MessageDiskPath>
    <ClientMessageAgeLimit>30s</ClientMessageAgeLimit>
    <Transports>
        <Transport>
            <Name>regular-tcp</Name>
            <Type>tcp</Type>
            <InetAddr>127.0.0.1:0</InetAddr>
        </Transport>
        <Transport>
            <Name>low-priority-tcp</Name>
            <Type>tcp</Type>
            <InetAddr>127.0.0.1:0</InetAddr>
            <MessageType>bson</MessageType>
            <ClientMessageAgeLimit>15s</ClientMessageAgeLimit>
            <ClientMaxCapacity>10%</ClientMaxCapacity>
        </Transport>
    </Transports>
    <TransactionLog>
        <JournalDirectory>{journal}</JournalDirectory>
        <Topic><Name>.*</Name><MessageType>bson</MessageType></Topic>
    </TransactionLog>
</AMPSConfig>
"""


@pytest.fixture
def servers() -> Iterator[list[ServerProcess]]:
    started: list[ServerProcess] = []
    yield started
    for server in started:
        server.stop()


@pytest.fixture
def reserved() -> Iterator[list[socket.socket]]:
    held: list[socket.socket] = []
    yield held
    for sock in held:
        sock.close()


def _check(path: Path) -> None:
    res = run("config", "check", str(path), cwd=path.parent)
    assert res.returncode == 0, f"config check refused {path.name}:\n{res.stdout}{res.stderr}"


def _port(reserved: list[socket.socket]) -> int:
    sock = reserve_port()
    reserved.append(sock)
    return int(sock.getsockname()[1])


def _start(
    servers: list[ServerProcess], path: Path, name: str, transport: str
) -> ServerProcess:
    server = ServerProcess(path, path.parent, 0, name, client_transport=transport)
    servers.append(server)
    return server.start()


async def _replays(uri: str, topic: str, count: int) -> list[bytes]:
    """The first ``count`` messages of ``topic`` replayed from the start of the journal."""
    async with open_client(uri, "reader") as reader, reader.subscribe(topic, bookmark="0") as sub:
        return [(await sub.get(60)).data for _ in range(count)]


@pytest.mark.parametrize("secure", [False, True], ids=["example-25.1-25.2", "security"])
async def test_the_replication_pair_examples_run_and_replicate_fix(
    tmp_path: Path,
    servers: list[ServerProcess],
    reserved: list[socket.socket],
    secure: bool,
) -> None:
    ports = {"amps-1": _port(reserved), "amps-2": _port(reserved)}
    paths = {}
    for name, peer in (("amps-1", "amps-2"), ("amps-2", "amps-1")):
        workdir = tmp_path / name
        workdir.mkdir()
        paths[name] = workdir / f"{name}.xml"
        paths[name].write_text(
            _pair_config(
                name, peer, ports[name], ports[peer], workdir / "journal", secure=secure
            )
        )
        _check(paths[name])
    one = _start(servers, paths["amps-1"], "amps-1", "fix-tcp")
    two = _start(servers, paths["amps-2"], "amps-2", "fix-tcp")
    orders = [FIX_ORDER.format(n=n).encode() for n in range(1, 6)]
    async with open_client(f"tcp://127.0.0.1:{one.port}/amps/fix", "fix-pub") as pub:
        for order in orders:
            await pub.publish("topic", order)
        await pub.wait_persisted(pub.seq, timeout=60)
    assert await _replays(f"tcp://127.0.0.1:{two.port}/amps/fix", "topic", 5) == orders


async def test_the_downgrade_upgrade_actions_example_runs(
    tmp_path: Path, servers: list[ServerProcess]
) -> None:
    path = tmp_path / "actions.xml"
    path.write_text(ACTIONS_CONFIG.format(journal=tmp_path / "journal"))
    _check(path)
    server = _start(servers, path, "amps-actions", "json-tcp")
    async with open_client(server.uri, "pub") as pub:
        await pub.publish("orders", b'{"id": 1}')
        await pub.wait_persisted(pub.seq, timeout=30)


async def test_the_slow_client_example_runs_with_its_bson_transport(
    tmp_path: Path, servers: list[ServerProcess]
) -> None:
    path = tmp_path / "offlining.xml"
    (tmp_path / "offline").mkdir()  # the example's MessageDiskPath, as an operator makes it
    path.write_text(
        SLOW_CLIENT_CONFIG.format(journal=tmp_path / "journal", offline=tmp_path / "offline")
    )
    _check(path)
    server = _start(servers, path, "amps-offlining", "low-priority-tcp")
    uri = f"tcp://127.0.0.1:{server.port}/amps/bson"
    order = bson.encode({"id": 1, "sym": "IBM", "qty": 500})
    async with open_client(uri, "bson-pub") as pub:
        await pub.publish("orders", order)
        await pub.wait_persisted(pub.seq, timeout=30)
    async with open_client(uri, "bson-sub") as sub_client:
        async with sub_client.subscribe("orders", filter="/qty > 100", bookmark="0") as sub:
            assert (await sub.get(30)).data == order
