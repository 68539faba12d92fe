"""Synthetic journals for the start-up benchmark and tests: the same live state (SOW
keys, queue depth) spread over histories of any length, written straight through
:mod:`txlog` (the records a server would journal, much faster than publishing them).
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path
from typing import Any

import orjson

from amps_py.server.queues import ack_payload
from amps_py.sow.keys import SowKeyer
from txlog import Journal, Kind, Record, publisher_hash

PAYLOAD_BYTES = 256
CHUNK = 20_000
ACKS_PER_RECORD = 100


def padded(doc: dict[str, Any]) -> bytes:
    raw = orjson.dumps(doc)
    pad = max(0, PAYLOAD_BYTES - len(raw) - 10)
    doc["pad"] = "x" * pad
    return orjson.dumps(doc)


def build_journal(
    path: Path,
    instance: str,
    total: int,
    sow_keys: int,
    queue_messages: int,
    *,
    progress: bool = False,
) -> dict[str, int]:
    """Write a journal of ``total`` records for instance ``instance`` in ``path``
    (replacing one there): ``sow_keys`` keys of SOW topic ``orders`` (``/id``)
    updated through the history (at least once each, a fifth of the records when that
    is more), ``queue_messages`` publishes to queue ``work`` of which the older half
    are acknowledged by ``QUEUE_ACK`` records of 100 bookmarks, and plain ``trades``
    for the rest, every kind spread evenly over the history. Returns how many of
    each kind were written (``plain``, ``sow``, ``queue``, ``acks``, ``total``).

    Raises:
        ValueError: ``total`` cannot hold them.
    """
    shutil.rmtree(path, ignore_errors=True)
    acks = queue_messages // 2
    ack_records = (acks + ACKS_PER_RECORD - 1) // ACKS_PER_RECORD
    sow_updates = max(sow_keys, total // 5)
    plain = total - sow_updates - queue_messages - ack_records
    if plain < 0:
        raise ValueError(
            f"{total} records cannot hold {sow_updates} SOW updates, {queue_messages} queue "
            f"messages and {ack_records} acks: use a bigger size or --queue-messages"
        )
    keyer = SowKeyer("orders", ("/id",))
    feeds = {
        "trades": publisher_hash("feed-trades"),
        "orders": publisher_hash("feed-orders"),
        "work": publisher_hash("feed-work"),
        "acks": publisher_hash(f"{instance}-internal"),
    }
    seqs = dict.fromkeys(feeds, 0)
    made = dict.fromkeys(("plain", "sow", "queue", "acks"), 0)
    quota = {"plain": plain, "sow": sow_updates, "queue": queue_messages, "acks": ack_records}
    acked_marks: list[str] = []
    t0 = time.time()
    base_us = int((t0 - 86_400) * 1e6)
    step_us = max(1, int(86_400e6 / total))
    written = 0
    with Journal(
        path, instance_name=instance, durability="page-cache", segment_size=256 << 20
    ) as j:
        while written < total:
            batch: list[Record] = []
            n = min(CHUNK, total - written)
            # each chunk holds its share of every kind, so live state is spread over history
            share = {k: round(quota[k] * (written + n) / total) - made[k] for k in quota}
            for _ in range(share["sow"]):
                key_id = made["sow"] % sow_keys
                doc = {"id": key_id, "qty": made["sow"], "side": "buy"}
                seqs["orders"] += 1
                batch.append(
                    Record(
                        topic="orders",
                        payload=padded(doc),
                        pub_hash=feeds["orders"],
                        seq=seqs["orders"],
                        client_name="feed-orders",
                        sow_key=keyer.key_of(doc),
                    )
                )
                made["sow"] += 1
            for _ in range(share["queue"]):
                seqs["work"] += 1
                batch.append(
                    Record(
                        topic="work",
                        payload=padded({"job": made["queue"]}),
                        pub_hash=feeds["work"],
                        seq=seqs["work"],
                        client_name="feed-work",
                    )
                )
                if made["queue"] < acks:
                    acked_marks.append(f"{feeds['work']}|{seqs['work']}|")
                made["queue"] += 1
            for _ in range(share["acks"]):
                # acknowledge the oldest published messages first (never one not yet published)
                take, acked_marks[:] = acked_marks[:ACKS_PER_RECORD], acked_marks[ACKS_PER_RECORD:]
                if not take:
                    continue
                seqs["acks"] += 1
                batch.append(
                    Record(
                        topic="work",
                        payload=ack_payload(take, "ack"),
                        pub_hash=feeds["acks"],
                        seq=seqs["acks"],
                        client_name=f"{instance}-internal",
                        kind=int(Kind.QUEUE_ACK),
                    )
                )
                made["acks"] += 1
            for _ in range(n - len(batch)):
                seqs["trades"] += 1
                batch.append(
                    Record(
                        topic="trades",
                        payload=padded({"trade": seqs["trades"], "px": 101.25}),
                        pub_hash=feeds["trades"],
                        seq=seqs["trades"],
                        client_name="feed-trades",
                    )
                )
                made["plain"] += 1
            j.append(batch, base_us + written * step_us)
            written += len(batch)
            if progress and written % 1_000_000 < CHUNK:
                print(f"  built {written:,} records ({time.time() - t0:.0f} s)", flush=True)
    return {**made, "total": total}
