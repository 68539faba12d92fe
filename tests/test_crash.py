"""kill -9 during a stream of publishes: every message that got a persisted ack is in
the journal exactly once after restart and replays in publisher order."""

from __future__ import annotations

import random
from pathlib import Path

import trio
from harness import ServerProcess, assert_journal_sound, start_instance, wait_until

from amps_py.client import AMPSError, open_client

SEED = 20261122
PUBLISHERS = 3


async def test_kill_9_loses_no_acknowledged_message(tmp_path: Path) -> None:
    rng = random.Random(SEED)
    print(f"seed {SEED}")
    server: ServerProcess = start_instance(tmp_path, "crash")
    acked: dict[str, int] = {f"pub{i}": 0 for i in range(PUBLISHERS)}
    # the highest seq each publisher handed to publish(), acked or not
    published: dict[str, int] = dict.fromkeys(acked, 0)
    try:
        for round_no in range(3):
            threshold = sum(acked.values()) + rng.randint(300, 1500)
            stop = trio.Event()

            async def publisher(name: str, stop: trio.Event = stop) -> None:
                pub = None
                try:
                    async with open_client(server.uri, name) as pub:
                        # resume after what the server says it has (a publish store would
                        # resend the unacked tail; here we simply continue after it)
                        assert pub.seq >= acked[name], "server forgot acknowledged messages"
                        while not stop.is_set():
                            for _ in range(20):
                                seq = pub.seq + 1
                                published[name] = max(published[name], seq)
                                await pub.publish(
                                    "orders", b'{"p":"%s","s":%d}' % (name.encode(), seq)
                                )
                            await trio.lowlevel.checkpoint()
                            acked[name] = max(acked[name], pub.persisted_seq)
                        acked[name] = max(acked[name], pub.persisted_seq)
                except (AMPSError, trio.BrokenResourceError, OSError):
                    pass  # the server was killed under us
                finally:
                    # acks that arrived before the connection dropped still count
                    if pub is not None:
                        acked[name] = max(acked[name], pub.persisted_seq)

            async with trio.open_nursery() as nursery:
                for name in acked:
                    nursery.start_soon(publisher, name)

                def enough(threshold: int = threshold) -> str | None:
                    total = sum(acked.values())
                    return None if total >= threshold else f"only {total}/{threshold} acked"

                await wait_until(enough, 60)
                server.kill()
                stop.set()
            print(f"round {round_no}: killed after acks {acked}")
            server.start()

        # every acknowledged message is there exactly once, in order
        async with (
            open_client(server.uri, "checker") as client,
            client.subscribe("orders", bookmark="0") as sub,
        ):
            with trio.fail_after(60):
                await sub.completed.wait()
            seen: dict[str, list[int]] = {name: [] for name in acked}
            while True:
                with trio.move_on_after(0.5) as scope:
                    msg = await sub.get(5)
                if scope.cancelled_caught:
                    break
                doc = msg.json()
                seen[doc["p"]].append(doc["s"])
        for name, seqs in seen.items():
            assert seqs == sorted(seqs), f"{name}: replay out of publisher order"
            assert len(seqs) == len(set(seqs)), f"{name}: duplicates in the journal"
            missing = set(range(1, acked[name] + 1)) - set(seqs)
            assert not missing, f"{name}: acknowledged seqs lost: {sorted(missing)[:10]}"
            # nothing beyond what was published (no phantom)
            assert not seqs or seqs[-1] <= published[name], (
                f"{name}: the journal holds seq {seqs[-1]}, never published (last "
                f"published {published[name]})"
            )
            assert seqs == list(range(1, len(seqs) + 1)), f"{name}: gap in the stored sequence"
        stored = {n: len(s) for n, s in seen.items()}
        print("acked", acked, "published", published, "stored", stored)
    finally:
        server.stop()
    # a clean stop commits LMDB and syncs it: no commit log is left to replay
    assert not list(server.journal_dir.glob("commit-*.log"))
    assert_journal_sound(server.journal_dir)
