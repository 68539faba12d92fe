"""Journals with known content for the pipeline tests, and what ``amps-py txlog dump``
says they hold.

- :func:`fill_varied` writes a journal through :class:`txlog.Journal` (the server's own
  storage code) whose records use every field: several topics and publishers, every
  kind, SOW keys, correlation ids, replicated records with paths, a non-JSON type with
  binary payloads, JSON with invalid UTF-8, empty and large (zstd) payloads, and local
  timestamps one second apart per batch (so time ranges are known).
- :func:`dump` runs the real ``amps-py txlog dump`` and returns its records.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import orjson
from clirun import run

from txlog import Journal, Record, publisher_hash

TOPICS = ("orders", "trades", "quotes")
PUBLISHERS = ("pub-a", "pub-b", "pub-c", "pub-d")
#: local time of batch 0 (µs); batch i is stored at BASE_US + i seconds
BASE_US = 1_790_000_000_000_000


def varied_record(k: int, rng: random.Random) -> Record:
    """The k-th record of :func:`fill_varied` (before the journal stamps it)."""
    client = PUBLISHERS[k % len(PUBLISHERS)]
    topic = TOPICS[k % len(TOPICS)]
    mtype = "json"
    kind = 1
    payload = b'{"k":%d,"pad":"%s"}' % (k, b"x" * rng.randrange(0, 60))
    if k % 97 == 5:
        payload = b'{"big":"' + b"abcdefgh" * rng.randrange(40, 200) + b'"}'  # zstd-worthy
    if k % 89 == 7:
        mtype, payload = "binary", bytes(rng.randrange(256) for _ in range(rng.randrange(1, 40)))
    if k % 83 == 3:
        payload = b'{"bad":"\xff\xfe"}'  # json that is not UTF-8
    if k % 79 == 2:
        payload = b""
    if k % 31 == 4:
        kind = 3  # sow_delete
    elif k % 37 == 6:
        kind = 2  # delta_publish
    origin, origin_txid, path = "", 0, ()
    if k % 5 == 1:  # replicated in, through one or two hops
        origin, origin_txid = "east-1", 10_000 + k
        path = (("east-1", "east"),) if k % 10 == 1 else (("east-1", "east"), ("mid", "core"))
    return Record(
        topic=topic,
        payload=payload,
        pub_hash=publisher_hash(client),
        seq=k // len(PUBLISHERS) + 1,
        client_name=client,
        message_type=mtype,
        kind=kind,
        origin=origin,
        origin_txid=origin_txid,
        origin_ts=BASE_US - 5_000_000 if origin else 0,
        path=path,
        sow_key=f"key-{k % 13}" if k % 4 == 0 else "",
        correlation_id=f"cid-{k}" if k % 6 == 0 else "",
    )


def fill_varied(
    path: Path,
    n: int,
    *,
    name: str = "inst",
    batch: int = 100,
    seed: int = 12,
    compression: str = "zstd",
    segment_size: int | None = None,
) -> None:
    """``n`` records in batches of ``batch``, batch i stamped ``BASE_US + i`` seconds."""
    rng = random.Random(seed)
    print(f"fill_varied seed {seed}")
    sizing = {"segment_size": segment_size} if segment_size else {}
    with Journal(
        path, instance_name=name, compression=compression, durability="page-cache", **sizing
    ) as j:
        for start in range(0, n, batch):
            records = [varied_record(k, rng) for k in range(start, min(n, start + batch))]
            j.append(records, BASE_US + (start // batch) * 1_000_000)


def dump(journal: Path, cwd: Path) -> list[dict[str, Any]]:
    """Every record ``amps-py txlog dump JOURNAL`` prints (the real command)."""
    out = run("txlog", "dump", str(journal), cwd=cwd, timeout=300)
    assert out.returncode == 0, out.stderr
    return [orjson.loads(line) for line in out.stdout.splitlines()]


def dumped_payload(rec: dict[str, Any]) -> bytes:
    """The payload bytes of one dumped record."""
    data = rec["payload"]
    return bytes.fromhex(data) if rec["payload_encoding"] == "hex" else data.encode()
