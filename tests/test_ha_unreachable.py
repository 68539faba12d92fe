"""When every server of the HA client's list is down: a clear error once the policy's
``failover_timeout`` has run out, not an endless wait.

What a user relies on:

- with ``failover_timeout``, a client that cannot log on anywhere ends its block with
  ``NoServerReachable`` after that long (from the start, or from the loss of its
  connection), naming each server and why its last attempt failed, and saying how
  many publishes the store keeps unacknowledged; whatever waited in the block (a
  publish's ``wait_persisted``, a subscription's ``get``) is cancelled;
- without it the client keeps trying (the default), and a wait with its own timeout
  raises ``TimeoutError``.
"""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path

import pytest
import trio
from harness import reserve_port
from inprocess import serve_instance

from amps_py.client import MemoryPublishStore, NoServerReachable, open_ha_client

SOW_XML = (
    "<SOW><Topic><Name>orders</Name><MessageType>json</MessageType><Key>/id</Key></Topic></SOW>"
)


@pytest.fixture
def dead_uris() -> Iterator[list[str]]:
    """Two URIs whose ports are bound and not listening: connections are refused."""
    held: list[socket.socket] = [reserve_port(), reserve_port()]
    try:
        yield [f"tcp://127.0.0.1:{s.getsockname()[1]}/amps/json" for s in held]
    finally:
        for s in held:
            s.close()


async def test_both_servers_down_from_the_start_ends_the_block_after_the_timeout(
    dead_uris: list[str],
) -> None:
    started = trio.current_time()
    with pytest.raises(NoServerReachable) as caught:
        async with open_ha_client(
            "nobody-home", dead_uris, failover_timeout=1.0, max_reconnect_delay=0.2
        ) as ha:
            await ha.publish("orders", b'{"id": 1}')  # kept: nothing to send it to
            async with ha.sow_and_subscribe("orders") as sub:
                await sub.get(timeout=60)  # cancelled when the client gives up
    took = trio.current_time() - started
    text = str(caught.value)
    print(f"after {took:.2f} s: {text}")
    assert 1.0 <= took < 3.0
    for uri in dead_uris:
        assert uri in text
    assert "connection refused" in text and "failover_timeout" in text
    assert "keeps 1 publish" in text


async def test_a_lost_connection_counts_from_the_loss_and_the_store_keeps_the_rest(
    tmp_path: Path, dead_uris: list[str]
) -> None:
    """Connected for longer than the timeout, then the only live server stops: the
    client gives up ``failover_timeout`` after the loss, not after the start, and
    what it published meanwhile stays in its store."""
    store = MemoryPublishStore()
    async with serve_instance(tmp_path, "only", extra=SOW_XML) as inst:
        servers = [inst.uri, dead_uris[0]]
        with pytest.raises(NoServerReachable, match="keeps 2 publish"):
            async with open_ha_client(
                "lonely", servers, publish_store=store, failover_timeout=1.0
            ) as ha:
                await ha.wait_connected(10)
                await ha.flush(timeout=10)
                await trio.sleep(1.5)  # in service past the timeout: it does not count
                await inst.stop()
                lost_at = trio.current_time()
                await ha.publish("orders", b'{"id": 1}')
                seq = await ha.publish("orders", b'{"id": 2}')
                await ha.wait_persisted(seq, timeout=60)  # cancelled by the give-up
        took = trio.current_time() - lost_at
        print(f"gave up {took:.2f} s after the loss")
        assert 1.0 <= took < 3.0
    assert [p.seq for p in store.unacked()] == [1, 2]


async def test_without_a_failover_timeout_waits_time_out_on_their_own(
    dead_uris: list[str],
) -> None:
    async with open_ha_client("patient", dead_uris, max_reconnect_delay=0.1) as ha:
        with pytest.raises(TimeoutError, match=r"no server reachable within 0\.5 s"):
            await ha.wait_connected(0.5)
        seq = await ha.publish("orders", b'{"id": 1}')
        with pytest.raises(TimeoutError, match="not connected"):
            await ha.wait_persisted(seq, timeout=0.5)
        with pytest.raises(ValueError, match="failover_timeout"):
            async with open_ha_client("bad", dead_uris, failover_timeout=0):
                pass
