"""Where a Parquet export puts things: directory and file names (pure; no I/O, no
pyarrow).

An export directory ``OUT`` holds, for every instance exported into it::

    OUT/topic=<topic>/date=<YYYY-MM-DD>/part-<instance>-<first txid>-<last txid>.parquet
    OUT/_manifests/<instance>/export.json              the cumulative manifest
    OUT/_manifests/<instance>/run-<UTC time>-<first txid>-<last txid>.json   one per run

Txids in file names have at least 12 digits (zero-padded), so names sort in txid
order. Partition values are Hive-style ``name=value`` directories, as Spark and
pyarrow write and read them. ``date`` is the UTC date of the record's ``local_ts`` (when this
instance stored it). Names beginning with ``_`` or ``.`` are hidden from both readers:
the manifests, and a file being written (``.part-...parquet.tmp``).

Topic (and instance) names are encoded so any name is one safe path component and
decodes back exactly, with the unescaping Spark and pyarrow already apply to
partition values: every ASCII character except letters, digits, ``-``, ``_`` and
``.`` becomes ``%XX`` (its code in upper-case hex: ``/`` -> ``%2F``, ``%`` -> ``%25``,
space -> ``%20``); characters beyond ASCII stay as they are (UTF-8 in the file
name). ``decode_name`` (or any percent-decoding) gives the name back.

Two kinds of topic cannot be their own directory name; they are *renamed*: the
first :data:`SHORTENED_PREFIX_BYTES` bytes of the encoded name, ``~`` and 16 hex
digits of the topic's SHA-256 (``~`` is always encoded in a full name, so a renamed
one never equals a full one). Readers then see that value in the partition column
(the ``topic`` column inside each file keeps the full name), and the manifest's
``renamed_topics`` maps it back:

- a topic whose ``topic=...`` name would pass the file system's 255 bytes: refused
  (:class:`TopicTooLong`) unless renaming is asked for (``--shorten-long-topics``);
- a topic named ``__HIVE_DEFAULT_PARTITION__``, which readers take for the null
  partition: always renamed.

The empty topic (which the server never stores) is that null partition.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Final

#: the format written into every manifest
EXPORT_FORMAT: Final = "amps-py-export-1"
MANIFEST_DIR: Final = "_manifests"
CUMULATIVE_MANIFEST: Final = "export.json"
LOCK_FILE: Final = "export.lock"
#: records per commit: each commit writes one file per topic and date among them
DEFAULT_BATCH_ROWS: Final = 250_000
#: payload bytes per commit (whichever of the two limits comes first). A run holds at
#: most two commits in memory (one being read, one being written), each about twice
#: its payload as Arrow columns (JSON bodies are also a text column): with this
#: default a run stays near 220 MB (measured), whatever the journal's size
DEFAULT_BATCH_BYTES: Final = 32 * 1024 * 1024
#: bytes a file system allows in one name (ext4, xfs, btrfs, APFS: 255)
NAME_MAX: Final = 255
SHORTENED_PREFIX_BYTES: Final = 200
#: Hive's (and Spark's and pyarrow's) name of the null partition
NULL_PARTITION: Final = "__HIVE_DEFAULT_PARTITION__"
_SAFE: Final = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_.")
_ESCAPE: Final = re.compile(r"%([0-9A-Fa-f]{2})")
_TXID_DIGITS: Final = 12
_PART: Final = re.compile(r"^(\.?)part-(.+)-(\d+)-(\d+)\.parquet(\.tmp)?$")


class TopicTooLong(ValueError):
    """A topic name too long for one directory name; the message says what to do."""


def encode_name(name: str) -> str:
    """``name`` as one path component that percent-decodes back to it exactly."""
    return "".join(c if c in _SAFE or ord(c) > 127 else f"%{ord(c):02X}" for c in name)


def decode_name(encoded: str) -> str:
    """The name :func:`encode_name` encoded (``%XX`` escapes undone)."""
    return _ESCAPE.sub(lambda m: chr(int(m.group(1), 16)), encoded)


def topic_directory(topic: str, *, shorten: bool = False) -> str:
    """The ``topic=...`` directory name of ``topic``.

    Raises:
        TopicTooLong: the name would pass :data:`NAME_MAX` bytes and ``shorten`` is off.
    """
    if not topic:
        return f"topic={NULL_PARTITION}"
    encoded = encode_name(topic)
    if encoded == NULL_PARTITION:  # readers would take it for the null partition
        return f"topic={renamed(encoded, topic)}"
    component = f"topic={encoded}"
    if len(component.encode()) <= NAME_MAX:
        return component
    if not shorten:
        raise TopicTooLong(
            f"topic {topic[:60]!r}... is {len(topic.encode())} bytes: as a directory name "
            f"it would pass the file system's {NAME_MAX}-byte limit; export with "
            "--shorten-long-topics (its partition directory is then the first "
            f"{SHORTENED_PREFIX_BYTES} bytes and a hash, and the manifest's "
            "'renamed_topics' gives the full name)"
        )
    return f"topic={renamed(encoded, topic)}"


def renamed(encoded: str, topic: str) -> str:
    """The partition value of a topic that cannot be its own (the module docstring)."""
    prefix = encoded.encode()[:SHORTENED_PREFIX_BYTES].decode("utf-8", "ignore")
    cut = prefix.rfind("%", len(prefix) - 2)  # never end inside a %XX escape
    if cut >= 0:
        prefix = prefix[:cut]
    return f"{prefix}~{hashlib.sha256(topic.encode()).hexdigest()[:16]}"


def date_directory(day: str) -> str:
    """``date=YYYY-MM-DD``."""
    return f"date={day}"


def part_name(instance: str, first_txid: int, last_txid: int) -> str:
    """The file name of ``instance``'s rows ``first_txid..last_txid`` in one partition."""
    return (
        f"part-{encode_name(instance)}-{first_txid:0{_TXID_DIGITS}d}-"
        f"{last_txid:0{_TXID_DIGITS}d}.parquet"
    )


def temporary_name(final_name: str) -> str:
    """Where a file is written before it is renamed to ``final_name`` (hidden from
    readers by its leading dot)."""
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
