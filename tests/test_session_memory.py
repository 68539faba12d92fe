"""An ended session keeps little alive, whatever the garbage collector does.

A session's tasks end with exceptions (a reset, a cancellation) that trio keeps in
reference cycles with the tasks' frames; the server's tuned collector runs a full
collection rarely (see ``amps_py.cli.serve.tune_garbage_collector``), so what those frames
refer to stays allocated until then. Before issue 24 that was each ended session's
last write batch and receive buffer (about 360 KiB per replaying client, measured
here), so a soak's memory grew with every client that had ever connected. Now an
ended session holds a few KiB until a collection, and a full collection runs every
``COLLECT_EVERY_ENDED`` ended sessions.
"""

from __future__ import annotations

import gc
import random
import socket
import struct
import tracemalloc
from pathlib import Path

import trio
from harness import wait_until
from inprocess import serve_instance

from amps_py.client import open_client
from amps_py.protocol import encode_frame
from amps_py.server.ended_sessions import EndedSessions

SEED = 2424
CLIENTS = 40
#: what an ended session may keep until a full collection (measured: about 14 KiB;
#: 360 KiB before the fix)
MAX_KEPT_PER_SESSION = 48 * 1024


def test_a_full_collection_is_due_every_n_ended_sessions() -> None:
    ended = EndedSessions(every=3)
    assert [ended.ended() for _ in range(7)] == [False, False, True, False, False, True, False]


async def replaying_client(port: int, name: str, abrupt: bool) -> None:
    """Log on, replay the backlog, read a little of it, and leave (reset or close)."""
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    await stream.send_all(
        encode_frame({"c": "logon", "cid": "1", "client_name": name, "a": "processed"})
    )
    await stream.receive_some(65536)
    await stream.send_all(encode_frame({"c": "subscribe", "t": "orders", "sub_id": "s", "bm": "0"}))
    await stream.receive_some(65536)
    if abrupt:
        stream.socket.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        stream.socket.close()
    else:
        await stream.aclose()


async def test_ended_sessions_keep_little_until_a_full_collection(tmp_path: Path) -> None:
    rng = random.Random(SEED)
    print(f"seed {SEED}")
    async with serve_instance(tmp_path, "mem") as served:
        async with open_client(served.uri, "backlog") as pub:
            body = b'{"pad":"' + b"x" * 400 + b'"}'
            for seq in range(1, 5001):  # a 2 MB backlog: each replay is mid-way at its end
                await pub.publish("orders", body, seq=seq)
            await pub.wait_persisted(5000)
        instance = served.instance
        gc.collect()
        gc.disable()  # what the ended sessions keep, as a collector that has not run
        tracemalloc.start()
        try:
            for i in range(CLIENTS):
                await replaying_client(served.port, f"r{i}", abrupt=rng.random() < 0.5)
            await wait_until(
                lambda: (
                    None
                    if not instance.sessions
                    else f"{len(instance.sessions)} sessions not ended yet"
                ),
                60,
            )
            before = tracemalloc.get_traced_memory()[0]
            gc.collect()
            after = tracemalloc.get_traced_memory()[0]
        finally:
            tracemalloc.stop()
            gc.enable()
        kept = (before - after) / CLIENTS
        print(f"an ended session kept {kept / 1024:.1f} KiB until the full collection")
        assert kept < MAX_KEPT_PER_SESSION, (
            f"each ended session kept {kept / 1024:.0f} KiB until a full garbage collection "
            f"(at most {MAX_KEPT_PER_SESSION // 1024} KiB): something big (a write batch, a "
            "receive buffer) is still referenced from the ended tasks' frames or the session"
        )
