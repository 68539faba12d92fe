"""A publish that follows a ``sow_delete`` on the same connection is stored.

The AMPS client library numbers its publishes (``s``); a ``sow_delete`` sent without
``s`` must not use up a number the client will give its next publish, or that publish
is taken for a duplicate of the delete, acknowledged as persisted, and never stored.
"""

from __future__ import annotations

from pathlib import Path

import orjson
from inprocess import serve_instance

from amps_py.client import open_client

SOW_XML = (
    "<SOW><Topic><Name>orders</Name><MessageType>json</MessageType><Key>/id</Key></Topic></SOW>"
)


async def test_publish_after_sow_delete_on_the_same_connection_is_stored(
    tmp_path: Path,
) -> None:
    async with serve_instance(tmp_path, "sow", extra=SOW_XML) as inst:
        async with open_client(inst.uri, "writer") as c:
            await c.publish("orders", b'{"id":1,"v":1}')
            await c.wait_persisted(c.seq, timeout=10)
            stats = await c.sow_delete("orders", data=b'{"id":1}')
            assert stats["records_deleted"] == 1
            await c.publish("orders", b'{"id":1,"v":2}')
            await c.delta_publish("orders", b'{"id":2,"v":3}')
            await c.wait_persisted(c.seq, timeout=10)
            stored = sorted(orjson.loads(r.data)["v"] for r in await c.sow("orders"))
        assert stored == [2, 3], "a publish after the sow_delete was acked but not stored"
