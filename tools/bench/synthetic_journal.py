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


# ------------------------------------------------------------------------- audit fabric

#: the audit benchmark's fabric: A and B a sync pair (every topic, both ways), C an
#: async downstream of both that gets ``orders`` only when ``/qty > 50`` (a content
#: filter) and every ``quotes``; ``internal`` stays on A and B
FABRIC_GROUPS = {"A": "A", "B": "B", "C": "C"}
FABRIC_PORTS = {"A": 29101, "B": 29201, "C": 29301}  # in the configs only: nothing listens
FABRIC_FILTER = "/qty > 50"
FABRIC_FORMAT = 1  # bump when what build_audit_fabric writes changes (cached copies go stale)


def _fabric_config(name: str, journal: Path) -> str:
    def destination(peer: str, sync: str, topics: str) -> str:
        return (
            f"<Destination><Name>{peer}</Name><Group>{FABRIC_GROUPS[peer]}</Group>"
            f"<SyncType>{sync}</SyncType>{topics}<Transport><Type>amps-replication</Type>"
            f"<InetAddr>127.0.0.1:{FABRIC_PORTS[peer] + 1}</InetAddr></Transport></Destination>"
        )

    one_way = "<ExcludeValidation>replicate</ExcludeValidation>"
    to_c = (
        "<Topic><Name>orders</Name><MessageType>json</MessageType>"
        f"<Filter>/qty &gt; 50</Filter>{one_way}</Topic>"
        f"<Topic><Name>quotes</Name><MessageType>json</MessageType>{one_way}</Topic>"
    )
    every = "<Topic><Name>.*</Name><MessageType>json</MessageType></Topic>"
    replication = ""
    if name in ("A", "B"):
        peer = "B" if name == "A" else "A"
        replication = (
            "<Replication>"
            + destination(peer, "sync", every)
            + destination("C", "async", to_c)
            + "</Replication>"
        )
    port = FABRIC_PORTS[name]
    return (
        '<?xml version="1.0"?>\n<AMPSConfig>'
        f"<Name>{name}</Name><Group>{FABRIC_GROUPS[name]}</Group>"
        "<Transports><Transport><Name>json-tcp</Name><Type>tcp</Type>"
        f"<InetAddr>127.0.0.1:{port}</InetAddr><Protocol>amps</Protocol>"
        "<MessageType>json</MessageType></Transport>"
        "<Transport><Name>repl</Name><Type>amps-replication</Type>"
        f"<InetAddr>127.0.0.1:{port + 1}</InetAddr></Transport></Transports>"
        f"<TransactionLog><JournalDirectory>{journal}</JournalDirectory>{every}"
        f"</TransactionLog>{replication}</AMPSConfig>\n"
    )


def build_audit_fabric(
    root: Path, records: int, *, fault_every: int = 100_000, progress: bool = False
) -> dict[str, Any]:
    """Write the journals of the fabric above (``root/journals/{A,B,C}``) and its
    configs (``root/configs/*.xml``), replacing what ``root`` held: about ``records``
    records in all, as the servers would have journaled them (publisher ``pubA`` on
    A, ``pubB`` on B, alternating; every message on A and B, the ones C must get on
    C; paths and origin txids as replication writes them; lags of 0.2-5.2 ms between
    A and B and 1-11 ms to C, varying over time). The three journals are written by
    three processes at once.

    Every ``fault_every`` messages (an even number, at least 4) two faults: on A two
    consecutive messages of ``pubB`` stored in swapped order (one reordered finding
    on A), and the next message C must get left out of C's journal (one missing
    finding on C). Deterministic.

    Returns what was written, with the problem counts the audit must report
    (``expected``)."""
    from concurrent.futures import ProcessPoolExecutor

    if fault_every < 4 or fault_every % 2:
        raise ValueError(f"fault_every must be even and at least 4, not {fault_every}")
    shutil.rmtree(root, ignore_errors=True)
    (root / "configs").mkdir(parents=True)
    journals = {name: root / "journals" / name for name in FABRIC_GROUPS}
    for name, journal in journals.items():
        (root / "configs" / f"{name}.xml").write_text(_fabric_config(name, journal))
    messages = max(2, round(records / 2.55))  # A and B hold each, C about 55 %
    t0 = time.time()
    base_us = int((t0 - 86_400) * 1e6)
    with ProcessPoolExecutor(len(journals)) as pool:
        futures = {
            name: pool.submit(
                _write_fabric_journal,
                name,
                path,
                messages,
                fault_every,
                base_us,
                progress and name == "A",
            )
            for name, path in journals.items()
        }
        done = {name: future.result() for name, future in futures.items()}
    held = {name: n for name, (n, _) in done.items()}
    return {
        "format": FABRIC_FORMAT,
        "records": sum(held.values()),
        "held": held,
        "messages": messages,
        "fault_every": fault_every,
        "expected": {"missing": done["C"][1], "reordered": done["A"][1]},
        "build_s": round(time.time() - t0, 1),
    }


def _write_fabric_journal(
    name: str, path: Path, messages: int, fault_every: int, base_us: int, progress: bool
) -> tuple[int, int]:
    """Write instance ``name``'s journal of :func:`build_audit_fabric`; returns the
    records written and the faults planted in it."""
    publishers = {"A": ("pubA", publisher_hash("pubA")), "B": ("pubB", publisher_hash("pubB"))}
    pad = b"x" * 100
    chunk = 2_000
    held = faults = 0
    drop_next_to_c = False
    t0 = time.time()
    with Journal(
        path, instance_name=name, durability="page-cache", segment_size=256 << 20
    ) as journal:
        for start in range(0, messages, chunk):
            now_us = base_us + start * 20  # 50,000 messages a second
            step = start // chunk
            lag = {"A": 200 + (step * 7_919) % 5_000, "C": 1_000 + (step * 104_729) % 10_000}
            lag["B"] = lag["A"] // 2 + 100
            batch: list[Record] = []
            swaps: list[int] = []
            for k in range(start, min(messages, start + chunk)):
                origin = "A" if k % 2 == 0 else "B"
                shape = k % 20
                topic = "orders" if shape < 10 else "quotes" if shape < 16 else "internal"
                qty = (k * 37) % 101
                if k % fault_every == 1:  # a pubB message (k odd)
                    drop_next_to_c = True
                if name == "C":
                    if topic == "internal" or (topic == "orders" and qty <= 50):
                        continue
                    if drop_next_to_c:
                        drop_next_to_c = False
                        faults += 1
                        continue
                client, pub = publishers[origin]
                seq = k // 2 + 1
                payload = b'{"p":"%s","s":%d,"qty":%d,"pad":"%s"}' % (
                    client.encode(),
                    seq,
                    qty,
                    pad,
                )
                # message k is record k + 1 on both A and B: its origin txid is k + 1
                replicated = (
                    {}
                    if origin == name
                    else {
                        "origin_txid": k + 1,
                        "origin_ts": now_us - lag[name],
                        "path": ((origin, FABRIC_GROUPS[origin]),),
                    }
                )
                rec = Record(
                    topic=topic,
                    payload=payload,
                    pub_hash=pub,
                    seq=seq,
                    client_name=client,
                    origin=origin,
                    **replicated,
                )
                batch.append(rec)
                if k % fault_every == 1 and name == "A":
                    swaps.append(len(batch) - 1)
            for at in swaps:
                # pubB's next message is two records on (A's own in between)
                if at + 2 < len(batch):
                    batch[at], batch[at + 2] = batch[at + 2], batch[at]
                    faults += 1
            if batch:
                held += len(journal.append(batch, now_us))
            if progress and step % 500 == 0:
                print(f"  A: {held:,} records ({time.time() - t0:.0f} s)", flush=True)
    return held, faults
