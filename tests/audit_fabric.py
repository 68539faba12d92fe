"""The three-instance fabric the audit tests run, and tools to tamper with a stopped
instance's journal.

The fabric: A and B are a sync pair (each replicates every topic to the other, sync);
C is an async downstream of both. A and B send C ``orders`` only when ``/qty > 50``
(a content filter) and every ``quotes`` message; ``internal`` stays on A and B. No
PassThrough: C gets A's messages from A and B's from B.

Tampering (:func:`delete_record`, :func:`duplicate_record`, :func:`swap_records`)
rewrites records in the journal's LMDB ``records`` database directly, with
:class:`txlog.RecordCodec` (the server's own encoding, CRC included), on a journal
whose instance is stopped. :meth:`txlog.Journal.append` cannot do it: it refuses a
second copy of a bookmark and always writes the next txid, which is exactly what the
audit has to catch when it goes wrong.
"""

from __future__ import annotations

import random
import struct
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from xml.sax.saxutils import escape

import lmdb
import trio
from cluster import Cluster, InstanceView, destination_xml, replication_xml

from amps_py.client import open_client
from txlog import Journal, Record, RecordCodec

FILTER = "/qty > 50"
TOPICS = ("orders", "quotes", "internal")
PUBLISHERS = {"pubA": "A", "pubB": "B"}  # publisher client name -> the instance it uses
PER_PUBLISHER = 120
SEED = 12


def _to_c(view: InstanceView) -> str:
    one_way = "<ExcludeValidation>replicate</ExcludeValidation>"
    return (
        "<Destination><Name>C</Name><Group>C</Group><SyncType>async</SyncType>"
        "<Topic><Name>orders</Name><MessageType>json</MessageType>"
        f"<Filter>{escape(FILTER)}</Filter>{one_way}</Topic>"
        f"<Topic><Name>quotes</Name><MessageType>json</MessageType>{one_way}</Topic>"
        "<Transport><Type>amps-replication</Type>"
        f"<InetAddr>{view.addr('C')}</InetAddr></Transport></Destination>"
    )


def add_fabric(cluster: Cluster) -> None:
    """Add A, B and C (not started)."""
    cluster.add_instance(
        "A", None, lambda v: replication_xml(destination_xml("B", "B", True, v.addr("B")), _to_c(v))
    )
    cluster.add_instance(
        "B", None, lambda v: replication_xml(destination_xml("A", "A", True, v.addr("A")), _to_c(v))
    )
    cluster.add_instance("C", None, None, replication_transport=True)


@dataclass(frozen=True)
class Published:
    publisher: str
    seq: int
    topic: str
    qty: int

    @property
    def reaches_c(self) -> bool:
        return self.topic == "quotes" or (self.topic == "orders" and self.qty > 50)


def messages(seed: int = SEED) -> dict[str, list[Published]]:
    """What each publisher sends (seeded)."""
    rng = random.Random(seed)
    return {
        name: [
            Published(name, seq, rng.choice(TOPICS), rng.randint(0, 100))
            for seq in range(1, PER_PUBLISHER + 1)
        ]
        for name in PUBLISHERS
    }


ROUNDS = 6


async def publish_round(cluster: Cluster, batch: dict[str, list[Published]]) -> None:
    """Publish ``batch`` (each publisher's part concurrently) and wait for the
    persisted acks: the sync partner has it too."""

    async def one(name: str) -> None:
        async with open_client(cluster.uri(PUBLISHERS[name]), name, timeout=30) as pub:
            for m in batch[name]:
                body = b'{"p":"%s","s":%d,"qty":%d}' % (name.encode(), m.seq, m.qty)
                await pub.publish(m.topic, body, seq=m.seq)
            await pub.wait_persisted(batch[name][-1].seq, timeout=30)

    async with trio.open_nursery() as nursery:
        for name in batch:
            nursery.start_soon(one, name)


def stored(cluster: Cluster, name: str) -> int:
    return int(cluster.server(name).statistics()["journal"]["records"])


def run_fabric(root: Path) -> tuple[Cluster, dict[str, list[Published]]]:
    """Start the fabric under ``root``; publish in :data:`ROUNDS` rounds, each once C
    has everything it must get from the one before (so arrivals spread over time);
    stop every instance. Returns the (stopped) cluster and what was sent."""
    cluster = Cluster(root)
    add_fabric(cluster)
    sent = messages()
    per_round = PER_PUBLISHER // ROUNDS
    try:
        cluster.start_all()
        for r in range(ROUNDS):
            batch = {n: v[r * per_round : (r + 1) * per_round] for n, v in sent.items()}
            trio.run(publish_round, cluster, batch)
            so_far = {n: v[: (r + 1) * per_round] for n, v in sent.items()}
            total = sum(len(v) for v in so_far.values())
            to_c = sum(m.reaches_c for v in so_far.values() for m in v)
            want = {"A": total, "B": total, "C": to_c}

            def check(want: dict[str, int] = want) -> str | None:
                have = {n: stored(cluster, n) for n in want}
                return None if have == want else f"stored {have}, want {want}"

            cluster.wait_until_sync(check, 60)
    finally:
        cluster.stop_all()
    return cluster, sent


# ---------------------------------------------------------------------- tampering

_U64 = struct.Struct(">Q")


@contextmanager
def _writing(journal_dir: Path) -> Iterator[tuple[lmdb.Transaction, Any, Any]]:
    """One write transaction on the journal's LMDB, with its ``records`` and
    ``bookmarks`` databases (the instance must be stopped)."""
    env = lmdb.open(str(journal_dir), max_dbs=16, subdir=True)
    try:
        records = env.open_db(b"records", create=False)
        bookmarks = env.open_db(b"bookmarks", create=False)
        with env.begin(write=True) as txn:
            yield txn, records, bookmarks
    finally:
        env.close()


def read_all(journal_dir: Path) -> list[Record]:
    with Journal(journal_dir, readonly=True) as journal:
        return list(journal.iter_records())


def delete_record(journal_dir: Path, txid: int) -> None:
    """Remove record ``txid`` and its bookmark index entry, as if never stored."""
    codec = RecordCodec()
    with _writing(journal_dir) as (txn, records, bookmarks):
        value = txn.get(_U64.pack(txid), db=records)
        assert value is not None, f"no record {txid} in {journal_dir}"
        rec = codec.decode(value, txid)
        txn.delete(_U64.pack(txid), db=records)
        txn.delete(struct.pack(">QQ", rec.pub_hash, rec.seq), db=bookmarks)


def duplicate_record(journal_dir: Path, txid: int) -> int:
    """Store a second copy of record ``txid`` after the newest record; returns its
    txid."""
    codec = RecordCodec()
    with _writing(journal_dir) as (txn, records, _):
        value = txn.get(_U64.pack(txid), db=records)
        assert value is not None, f"no record {txid} in {journal_dir}"
        cursor = txn.cursor(db=records)
        assert cursor.last()
        new = int(_U64.unpack(cursor.key())[0]) + 1
        rec = codec.decode(value, txid)
        rec.txid = new
        txn.put(_U64.pack(new), codec.encode(rec), db=records)
    return new


def swap_records(journal_dir: Path, first: int, second: int) -> None:
    """Exchange the records at txids ``first`` and ``second`` (each keeps its own
    content and timestamps, re-encoded under the other's txid)."""
    codec = RecordCodec()
    with _writing(journal_dir) as (txn, records, _):
        a = codec.decode(txn.get(_U64.pack(first), db=records), first)
        b = codec.decode(txn.get(_U64.pack(second), db=records), second)
        a.txid, b.txid = second, first
        txn.put(_U64.pack(second), codec.encode(a), db=records)
        txn.put(_U64.pack(first), codec.encode(b), db=records)
