"""The instances of a simulated fabric: real amps_py instances, each on its host of
the simulated network, started, crashed and restarted by the schedule
(docs/SIMULATION.md).

Each instance is the real :func:`amps_py.server.serve_instance` on a config written
here: a json client transport on :data:`CLIENT_PORT`, a replication transport on
:data:`REPLICATION_PORT`, a journal of every topic, and a sync replication
destination to every other instance (the AMPS HA pair, generalised). Its tasks run
with :func:`amps_py.net.using` the host's view of the network and with
:func:`amps_py.offload.inline` (no worker threads: the run is repeatable).

A crash here cancels the instance's tasks (its cleanup code runs) and resets its
connections: the journal keeps what it wrote, as after ``kill -9``. What a power
loss would drop (writes not yet synced) is not simulated: the real-process tests
(tests/test_crash.py, tests/test_ha_storm.py) cover kill -9 with its fsync.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Final
from xml.sax.saxutils import escape

import trio

from amps_py import net, offload
from amps_py.config import InstanceConfig, load_config
from amps_py.server import Instance, serve_instance
from amps_py.sim.network import SimNetwork

__all__ = ["CLIENT_PORT", "REPLICATION_PORT", "SimInstance", "fabric_xml"]

CLIENT_PORT: Final = 9007
REPLICATION_PORT: Final = 9107


def fabric_xml(name: str, peers: list[str], journal: Path, topic: str) -> str:
    """The config of instance ``name``: journals ``topic`` (json) and replicates it,
    sync, to each of ``peers``."""
    destinations = "".join(
        f"<Destination><Name>{escape(peer)}</Name><Group>{escape(peer)}</Group>"
        f"<SyncType>sync</SyncType><Topic><Name>{escape(topic)}</Name>"
        "<MessageType>json</MessageType></Topic><Transport><Type>amps-replication</Type>"
        f"<InetAddr>{escape(peer)}:{REPLICATION_PORT}</InetAddr></Transport></Destination>"
        for peer in peers
    )
    return f"""<?xml version="1.0"?>
<AMPSConfig>
  <Name>{escape(name)}</Name>
  <Group>{escape(name)}</Group>
  <Transports>
    <Transport><Name>json-tcp</Name><Type>tcp</Type><InetAddr>127.0.0.1:{CLIENT_PORT}</InetAddr>
      <Protocol>amps</Protocol><MessageType>json</MessageType></Transport>
    <Transport><Name>replication</Name><Type>amps-replication</Type>
      <InetAddr>127.0.0.1:{REPLICATION_PORT}</InetAddr></Transport>
  </Transports>
  <TransactionLog><JournalDirectory>{escape(str(journal))}</JournalDirectory>
    <Topic><Name>{escape(topic)}</Name><MessageType>json</MessageType></Topic>
  </TransactionLog>
  <Replication>{destinations}</Replication>
</AMPSConfig>
"""


@dataclass(eq=False)
class SimInstance:
    """One instance of the fabric: ``start`` it in a nursery, ``crash`` and ``start``
    it again; ``instance`` is the running :class:`Instance` (None while down)."""

    name: str
    config_path: Path
    network: SimNetwork
    instance: Instance | None = None
    starts: int = 0
    _scope: trio.CancelScope | None = None
    _stopped: trio.Event = field(default_factory=trio.Event)

    @property
    def uri(self) -> str:
        return f"tcp://{self.name}:{CLIENT_PORT}/amps/json"

    @property
    def up(self) -> bool:
        return self.instance is not None

    async def start(self, nursery: trio.Nursery) -> None:
        """Start the instance (returns once its transports listen)."""
        config = load_config(self.config_path)
        self._scope = trio.CancelScope()
        self._stopped = trio.Event()
        with net.using(self.network.node(self.name)), offload.inline():
            self.instance = await nursery.start(self._run, config, self._scope, self._stopped)
        self.starts += 1
        self.network.trace.record(trio.current_time(), self.name, "instance-up", str(self.starts))

    async def _run(
        self,
        config: InstanceConfig,
        scope: trio.CancelScope,
        stopped: trio.Event,
        *,
        task_status: trio.TaskStatus[Instance] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        try:
            with scope:
                await serve_instance(config, task_status=task_status)
        finally:
            self.instance = None
            stopped.set()

    async def crash(self) -> None:
        """The process dies: connections reset, tasks cancelled, the journal as written."""
        self.network.crash(self.name)
        if self._scope is not None:
            self._scope.cancel()
            await self._stopped.wait()
        self.instance = None
