"""A running instance survives garbage, malformed and oversized frames from one client
while another keeps publishing with persisted acks; nothing stored is damaged."""

from __future__ import annotations

import random
import struct
from pathlib import Path

import trio
from harness import assert_journal_sound, start_instance

from amps_py.client import open_client
from amps_py.protocol import encode_frame

SEED = 7


def garbage_inputs(rng: random.Random) -> list[bytes]:
    valid = encode_frame({"c": "p", "t": "orders", "s": 1}, b'{"a":1}')
    inputs = [
        b"GET / HTTP/1.1\r\nHost: x\r\n\r\n",  # wrong protocol entirely
        struct.pack(">I", 2**31) + b"{",  # oversized length prefix
        struct.pack(">I", 1) + b"{",  # too small to hold a header
        struct.pack(">I", 10) + b"not json!!",
        encode_frame({"c": "logon", "client_name": "g"})[:-3] + b"\x00\x00\x00",
        struct.pack(">I", 14) + b'{"c":{"x":1}}x',  # nested header value
        struct.pack(">I", 12) + b'{"t":"x"}abc',  # no command
        struct.pack(">I", 5) + b"\xff\xfe\xfd\xfc\xfb",
    ]
    for _ in range(20):
        data = bytearray(valid)
        for _ in range(rng.randint(1, 4)):
            data[rng.randrange(len(data))] = rng.randrange(256)
        inputs.append(bytes(data))
    inputs.extend(bytes(rng.randrange(256) for _ in range(rng.randint(1, 300))) for _ in range(20))
    return inputs


async def test_garbage_does_not_disturb_publishers(tmp_path: Path) -> None:
    print(f"seed {SEED}")
    rng = random.Random(SEED)
    server = start_instance(tmp_path, "robust", max_message_size="64KB")
    try:
        done = trio.Event()
        published = 0

        async def good_publisher() -> None:
            nonlocal published
            async with open_client(server.uri, "good") as pub:
                while not done.is_set():
                    await pub.publish_persisted("audit", b'{"ok":%d}' % (pub.seq + 1), timeout=20)
                published = pub.persisted_seq

        async def attacker() -> None:
            for data in garbage_inputs(rng):
                stream = await trio.open_tcp_stream("127.0.0.1", server.port)
                try:
                    logon = encode_frame(
                        {"c": "logon", "client_name": f"bad{rng.random()}", "a": "processed"}
                    )
                    if rng.random() < 0.5:
                        data = logon + data
                    await stream.send_all(data)
                    # the server answers or closes; it must never hang the other client
                    with trio.move_on_after(2):
                        while await stream.receive_some(65536):
                            pass
                except (trio.BrokenResourceError, trio.ClosedResourceError):
                    pass
                finally:
                    await stream.aclose()
            # an oversized but well-formed frame after a good logon
            async with open_client(server.uri, "big") as big:
                try:
                    await big.send_raw(
                        encode_frame({"c": "p", "t": "orders", "s": 1}, b"x" * 100_000)
                    )
                except trio.BrokenResourceError:
                    pass  # the server closed as soon as it read the length prefix
                with trio.fail_after(60):
                    while big.closed is None:
                        await trio.sleep(0.01)
            done.set()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(good_publisher)
            nursery.start_soon(attacker)
        assert server.alive, server.tail()
        assert published > 0
        log = server.log_file.read_text()
        assert "frame of 100" in log and "exceeds the maximum of 65536 bytes" in log
        assert "07-0010" in log
        # everything acknowledged replays, and nothing from the attacker was stored
        async with open_client(server.uri, "check") as c, c.subscribe("audit", bookmark="0") as sub:
            got = [(await sub.get(10)).json() for _ in range(published)]
            assert got == [{"ok": i} for i in range(1, published + 1)]
            with trio.move_on_after(0.3):
                extra = await sub.get(5)
                raise AssertionError(f"unexpected stored message {extra}")
    finally:
        server.stop()
    assert_journal_sound(server.journal_dir)
