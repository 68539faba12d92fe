"""HAClient.wait_persisted, as a pipelining publisher uses it (publish seq n, then wait
for the ack of n - window): a seq already covered returns at once, with any timeout;
one that is not covered waits, and times out with a message saying where it stands.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing
from checker import payload, replay_instance
from inprocess import InProcessInstance

from amps_py.client import FilePublishStore, open_ha_client
from amps_py.client import ha as ha_module

TOPIC = "orders"


async def test_a_pipelining_publisher_waits_only_for_what_is_not_covered(
    inproc: InProcessInstance, tmp_path: Path
) -> None:
    window = 20
    with FilePublishStore(tmp_path / "store") as store:
        async with open_ha_client("window", [inproc.uri], publish_store=store) as ha:
            await ha.wait_connected(10)
            for i in range(1, 201):
                if i > window:
                    await ha.wait_persisted(i - window, timeout=30)
                    assert store.discarded_through >= i - window
                    assert store.last_seq - store.discarded_through <= window
                assert await ha.publish(TOPIC, payload("window", i)) == i
            await ha.wait_persisted(200, timeout=30)
            # covered seqs return at once, even with no time left
            for seq in (1, 100, 200):
                await ha.wait_persisted(seq, timeout=0)
            assert len(store) == 0
    assert [m.seq for m in await replay_instance(inproc.uri, TOPIC)] == list(range(1, 201))


async def test_an_uncovered_seq_times_out_saying_where_it_stands(
    autojump_clock: trio.testing.MockClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    def refuse(uri: str, name: str, **_: Any) -> Any:
        raise OSError(f"cannot connect to {uri}: refused (fake)")

    monkeypatch.setattr(ha_module, "open_client", refuse)
    async with open_ha_client("nowhere", ["tcp://a:1/amps/json"]) as ha:
        assert await ha.publish(TOPIC, payload("nowhere", 1)) == 1
        start = trio.current_time()
        with pytest.raises(TimeoutError, match=r"seq 1 not persisted within 5 s .*not connected"):
            await ha.wait_persisted(1, timeout=5)
        assert trio.current_time() - start == pytest.approx(5)
        with pytest.raises(TimeoutError):
            await ha.wait_persisted(1, timeout=0)


async def test_an_error_in_the_callers_block_comes_out_as_itself() -> None:
    """As with open_client: the application's own exception, not an ExceptionGroup."""
    with pytest.raises(LookupError, match="the application's own"):
        async with open_ha_client("unwrap", ["tcp://127.0.0.1:9/amps/json"]):
            raise LookupError("the application's own")
