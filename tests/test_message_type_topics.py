"""Each message type has its own topics, as in AMPS: a connection speaks one type (its
transport's MessageType, else the logon's ``mt`` from the client's URI, else json),
publishes and receives only that type, and a SOW or journal entry for a topic covers
the type it names. Through a real instance served in the test's trio run (localhost
sockets, the amps_py client library)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import trio
from inprocess import InProcessInstance, serve_instance

from amps_py.client import CommandError, open_client

ANY_TYPE = """
<Transport>
  <Name>any-tcp</Name><Type>tcp</Type><InetAddr>127.0.0.1:0</InetAddr>
  <Protocol>amps</Protocol>
</Transport>
"""

SOW_XML = """
<SOW>
  <Topic><Name>orders</Name><MessageType>json</MessageType><Key>/id</Key></Topic>
</SOW>
"""


@pytest.fixture
async def inst(tmp_path: Path) -> AsyncIterator[InProcessInstance]:
    async with serve_instance(
        tmp_path,
        "types",
        topics=((".*", "json"), (".*", "binary")),
        extra_transport=ANY_TYPE,
        extra=SOW_XML,
    ) as served:
        yield served


def _uri(inst: InProcessInstance, message_type: str) -> str:
    return f"tcp://127.0.0.1:{inst.bound_port('any-tcp')}/amps/{message_type}"


async def _quiet(sub: object, seconds: float = 0.3) -> list[bytes]:
    """What arrives on ``sub`` until nothing came for ``seconds``."""
    got = []
    while True:
        with trio.move_on_after(seconds) as scope:
            message = await sub.get(seconds + 5)  # type: ignore[attr-defined]
        if scope.cancelled_caught:
            return got
        got.append(message.data)


async def test_a_subscriber_receives_only_its_own_message_type(inst: InProcessInstance) -> None:
    async with (
        open_client(_uri(inst, "json"), "json-side") as js,
        open_client(_uri(inst, "binary"), "binary-side") as bs,
        js.subscribe("t") as json_sub,
        bs.subscribe("t") as binary_sub,
    ):
        await js.publish("t", b'{"n": 1}')
        await bs.publish("t", b"\x00\x01raw")
        await js.wait_persisted(js.seq, timeout=10)
        await bs.wait_persisted(bs.seq, timeout=10)
        assert (await json_sub.get(10)).data == b'{"n": 1}'
        assert (await binary_sub.get(10)).data == b"\x00\x01raw"
        assert await _quiet(json_sub) == []
        assert await _quiet(binary_sub) == []
    # a bookmark replay from the start sees its own type only
    async with (
        open_client(_uri(inst, "binary"), "replayer") as rs,
        rs.subscribe("t", bookmark="0") as replay,
    ):
        assert (await replay.get(10)).data == b"\x00\x01raw"
        assert await _quiet(replay) == []


async def test_a_sow_topic_holds_its_own_type_only(inst: InProcessInstance) -> None:
    async with (
        open_client(_uri(inst, "json"), "json-pub") as js,
        open_client(_uri(inst, "binary"), "binary-pub") as bs,
    ):
        await js.publish("orders", b'{"id": 1, "v": "json"}')
        # the same topic name in binary is another topic: journaled, not in the SOW
        await bs.publish("orders", b"not json at all")
        await js.wait_persisted(js.seq, timeout=10)
        await bs.wait_persisted(bs.seq, timeout=10)
        records = [r.data for r in await js.sow("orders")]
        assert records == [b'{"id": 1, "v": "json"}']
        with pytest.raises(CommandError) as refused:
            await bs.sow("orders")
        assert refused.value.reason == "invalid topic"


async def test_a_logon_asking_for_an_unloaded_type_is_refused(inst: InProcessInstance) -> None:
    with pytest.raises(Exception) as refused:
        async with open_client(_uri(inst, "klingon"), "alien"):
            pass
    text = str(refused.value)
    assert "invalid message type" in text and "klingon" in text, text
    assert "<MessageTypes>" in text, text


async def test_a_typed_transport_refuses_another_type(inst: InProcessInstance) -> None:
    # the harness's json-tcp transport has MessageType json
    uri = f"tcp://127.0.0.1:{inst.port}/amps/binary"
    with pytest.raises(Exception) as refused:
        async with open_client(uri, "wrong-type"):
            pass
    text = str(refused.value)
    assert "accepts json messages only" in text, text
    # a client that names no type on a typed transport gets the transport's
    async with open_client(inst.uri, "plain", mt="") as plain:
        await plain.publish("t", b'{"ok": true}')
        await plain.wait_persisted(plain.seq, timeout=10)
