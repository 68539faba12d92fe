"""Where a Parquet export puts things: directory and file names (pure; no I/O, no
pyarrow).

An export directory ``OUT`` holds, for every instance exported into it::

    OUT/date=<YYYY-MM-DD>/part-<instance>-<first txid>-<last txid>.parquet
    OUT/_manifests/<instance>/export.json              the cumulative manifest
    OUT/_manifests/<instance>/run-<UTC time>-<first txid>-<last txid>.json   one per run

One file per commit: a commit is a run of consecutive txids of one instance whose
``local_ts`` falls on one UTC date (``date``); its rows are ordered by topic, then
txid, one row group per topic, so a reader filtering on ``topic`` skips the other
topics' row groups by their statistics.

Every column of :data:`.schema.ARROW_SCHEMA` is in every file, ``topic`` included
(whatever its length: no topic is a directory name). The only partition key is the
directory ``date=...``, and ``date`` is no column in the files: so pyarrow
(``pq.read_table(OUT)``), Spark (``spark.read.parquet(OUT)``) and DuckDB
(``read_parquet('OUT/**/*.parquet', hive_partitioning=true)``) read the whole
directory with no column twice, and prune dates by directory.

Txids in file names have at least 12 digits (zero-padded), so names sort in txid
order. Names beginning with ``_`` or ``.`` are hidden from Spark and pyarrow: the
manifests, and a file not published yet (``.part-...parquet.tmp``, which DuckDB's
``*.parquet`` does not match either).

Instance names are encoded so any name is one safe path component and decodes back
exactly: every ASCII character except letters, digits, ``-``, ``_`` and ``.``
becomes ``%XX`` (its code in upper-case hex: ``/`` -> ``%2F``, ``%`` -> ``%25``,
space -> ``%20``); characters beyond ASCII stay as they are (UTF-8 in the file
name). ``decode_name`` (or any percent-decoding) gives the name back.

The previous layout (format ``amps-py-export-1``: ``OUT/topic=<topic>/date=<d>/...``
with ``topic`` also a column in the files, which pyarrow refuses to merge and Spark
warns about) is not written into: an export directory holding it is refused, naming
the fix (:data:`OLD_LAYOUT_FIX`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Final

#: the format written into every manifest
EXPORT_FORMAT: Final = "amps-py-export-2"
#: the format of the previous layout (topic=/date= directories)
OLD_EXPORT_FORMAT: Final = "amps-py-export-1"
#: what to do with an export directory in the previous layout
OLD_LAYOUT_FIX: Final = (
    "export into a new, empty directory (amps-py pipeline export JOURNAL NEW_OUT), "
    "then delete the old one; its topic=... directories cannot be read whole by "
    "pyarrow, and Spark reads the topic column twice"
)
MANIFEST_DIR: Final = "_manifests"
CUMULATIVE_MANIFEST: Final = "export.json"
LOCK_FILE: Final = "export.lock"
#: records per commit (each commit is one file)
DEFAULT_BATCH_ROWS: Final = 250_000
#: payload bytes per commit (whichever of the two limits comes first). A run holds at
#: most two commits in memory (one being read, one being written), each about twice
#: its payload as Arrow columns (JSON bodies are also a text column), and the file
#: being encoded copies one topic's rows at a time. Measured with this default: a peak
#: RSS of 470 MB for 400,000 records of 256 B on 10 topics (the interpreter and
#: pyarrow included; 420 MB with the previous layout), whatever the journal's size
DEFAULT_BATCH_BYTES: Final = 32 * 1024 * 1024
#: the directory prefix of the previous layout's topic partitions
OLD_TOPIC_PREFIX: Final = "topic="
_SAFE: Final = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_.")
_ESCAPE: Final = re.compile(r"%([0-9A-Fa-f]{2})")
_TXID_DIGITS: Final = 12
_PART: Final = re.compile(r"^(\.?)part-(.+)-(\d+)-(\d+)\.parquet(\.tmp)?$")
_DATE_DIR: Final = re.compile(r"^date=(\d{4}-\d{2}-\d{2})$")


def encode_name(name: str) -> str:
    """``name`` as one path component that percent-decodes back to it exactly."""
    return "".join(c if c in _SAFE or ord(c) > 127 else f"%{ord(c):02X}" for c in name)


def decode_name(encoded: str) -> str:
    """The name :func:`encode_name` encoded (``%XX`` escapes undone)."""
    return _ESCAPE.sub(lambda m: chr(int(m.group(1), 16)), encoded)


def date_directory(day: str) -> str:
    """``date=YYYY-MM-DD``."""
    return f"date={day}"


def parse_date_directory(name: str) -> str | None:
    """The ``YYYY-MM-DD`` of a ``date=...`` directory name, or None for any other."""
    m = _DATE_DIR.match(name)
    return m.group(1) if m else None


def part_name(instance: str, first_txid: int, last_txid: int) -> str:
    """The file name of ``instance``'s commit of txids ``first_txid..last_txid``."""
    return (
        f"part-{encode_name(instance)}-{first_txid:0{_TXID_DIGITS}d}-"
        f"{last_txid:0{_TXID_DIGITS}d}.parquet"
    )


def part_path(instance: str, day: str, first_txid: int, last_txid: int) -> str:
    """``date=<day>/part-...parquet``: where that commit's file is published
    (relative to the export directory, ``/``-separated)."""
    return f"{date_directory(day)}/{part_name(instance, first_txid, last_txid)}"


def temporary_name(final_name: str) -> str:
    """Where a file is written before it is published as ``final_name`` (hidden from
    readers by its leading dot, and not ``*.parquet``)."""
    return f".{final_name}.tmp"


@dataclass(frozen=True)
class PartFile:
    """What a data file's name says."""

    instance: str
    first_txid: int
    last_txid: int
    temporary: bool


def parse_part_name(name: str) -> PartFile | None:
    """The instance and txid range a ``part-...`` (or its temporary) name holds, or
    None for any other name."""
    m = _PART.match(name)
    if m is None or bool(m.group(1)) != bool(m.group(5)):
        return None
    return PartFile(decode_name(m.group(2)), int(m.group(3)), int(m.group(4)), bool(m.group(1)))


def manifest_directory(instance: str) -> str:
    """``_manifests/<instance>``, relative to the export directory."""
    return f"{MANIFEST_DIR}/{encode_name(instance)}"


def run_manifest_name(started_unix: float, first_txid: int, last_txid: int) -> str:
    """The name of one run's manifest (sorts by start time)."""
    stamp = datetime.fromtimestamp(started_unix, UTC).strftime("%Y%m%dT%H%M%S.%fZ")
    return f"run-{stamp}-{first_txid}-{last_txid}.json"


def add_checksums(a: str, b: str) -> str:
    """Two row checksums (64 hex digits) combined: their sum modulo 2**256. The sum
    over files is the same whatever the order, so a re-read can check the whole."""
    return f"{(int(a, 16) + int(b, 16)) % (1 << 256):064x}"


ZERO_CHECKSUM: Final = "0" * 64
