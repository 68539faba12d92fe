"""The on-disk record codec of the file publish store (:mod:`amps_py.client.publish_store`).

Pure: bytes in, records out; no file I/O. The store reads a whole segment and asks
:func:`scan` what it holds, and :func:`encode_record` gives it the bytes to append.

Segment file: :data:`SEGMENT_MAGIC` (8 bytes), then records back to back. Record (all
integers big-endian)::

    offset size  field
    0      4     header CRC32 of bytes 4..25 (so a bad length is never trusted)
    4      4     body length (topic + sow_key + payload bytes)
    8      4     body CRC32
    12     8     seq
    20     1     command: 1 = publish, 2 = delta_publish, 3 = sow_delete_filter,
                 4 = sow_delete_keys, 5 = sow_delete_data (see store_api.StoredPublish)
    21     2     topic length (UTF-8 bytes)
    23     2     sow_key length (UTF-8 bytes)
    25     ...   body: topic, sow_key, payload

Damage classes (:func:`scan`), for a segment that stops being readable at offset X:

* torn tail (``Torn``): what follows X is an unfinished append, as a crash in the
  middle of a write leaves it: fewer bytes than a header, or a valid header whose
  record runs past the end of the file, or nothing but zero bytes (a file system that
  extended the file before the data reached the disk, after a power loss);
* damage (``Damaged``): anything else (a bad header CRC, a bad body CRC on a complete
  record, an unknown command): the file was changed under the store. The store does
  not guess which records to give up.

Discard marker file: two slots of :data:`MARKER_SLOT` bytes, each one line
``discarded_through <n> crc32 <8 hex digits>`` (the CRC is of the decimal ``n``) padded
with spaces; the store overwrites them alternately in place, so a torn write (a power
loss) leaves the other slot, and the higher intact value counts.
"""

from __future__ import annotations

import struct
import zlib
from dataclasses import dataclass
from typing import Final

__all__ = [
    "COMMANDS",
    "HEADER",
    "MARKER_SLOT",
    "SEGMENT_MAGIC",
    "Damaged",
    "Record",
    "Scan",
    "Torn",
    "decode_marker",
    "encode_marker",
    "encode_record",
    "scan",
]

SEGMENT_MAGIC: Final = b"APSSEG1\n"

#: crc of the rest of the header, body length, body crc, seq, command, topic len, key len
HEADER: Final = struct.Struct(">IIIQBHH")
_HEADER_REST: Final = struct.Struct(">IIQBHH")

#: command name -> its code on disk (codes 3-5 came with sow_delete: a store holding
#: them is refused as damaged by an amps-py from before them)
COMMANDS: Final = {
    "publish": 1,
    "delta_publish": 2,
    "sow_delete_filter": 3,
    "sow_delete_keys": 4,
    "sow_delete_data": 5,
}
_NAMES: Final = {code: name for name, code in COMMANDS.items()}

_MAX_FIELD: Final = 0xFFFF
_MAX_BODY: Final = 0xFFFFFFFF


@dataclass(frozen=True, slots=True)
class Record:
    """One decoded record and where it lies in its segment."""

    offset: int
    end: int
    seq: int
    command: str
    topic: str
    sow_key: str
    data: bytes


@dataclass(frozen=True, slots=True)
class Torn:
    """The segment ends with an unfinished append starting at ``offset``."""

    offset: int
    reason: str


@dataclass(frozen=True, slots=True)
class Damaged:
    """The record at ``offset`` is damaged (not an unfinished append)."""

    offset: int
    reason: str


@dataclass(frozen=True, slots=True)
class Scan:
    """What a segment holds: its intact records in file order, and what stopped the
    scan (``None`` when every byte was an intact record)."""

    records: list[Record]
    problem: Torn | Damaged | None


def encode_record(seq: int, command: str, topic: str, sow_key: str, data: bytes) -> bytes:
    """The bytes of one record.

    Raises:
        ValueError: an unknown command, a topic or sow_key over 65535 UTF-8 bytes, or a
            body over 4 GiB.
    """
    code = COMMANDS.get(command)
    if code is None:
        raise ValueError(
            f"a publish store keeps only {', '.join(COMMANDS)} commands, not {command!r}"
        )
    topic_b = topic.encode()
    key_b = sow_key.encode()
    if len(topic_b) > _MAX_FIELD or len(key_b) > _MAX_FIELD:
        raise ValueError("a stored publish's topic and sow_key must be at most 65535 bytes")
    body = b"".join((topic_b, key_b, data))
    if len(body) > _MAX_BODY:
        raise ValueError("a stored publish must be smaller than 4 GiB")
    rest = _HEADER_REST.pack(len(body), zlib.crc32(body), seq, code, len(topic_b), len(key_b))
    return b"".join((struct.pack(">I", zlib.crc32(rest)), rest, body))


def _decode(buf: bytes | memoryview, offset: int) -> Record | Torn | Damaged:
    if len(buf) - offset < HEADER.size:
        return Torn(offset, f"{len(buf) - offset} bytes, shorter than a record header")
    hcrc, length, bcrc, seq, code, tlen, klen = HEADER.unpack_from(buf, offset)
    if zlib.crc32(buf[offset + 4 : offset + HEADER.size]) != hcrc:
        return Damaged(offset, "bad header checksum")
    start = offset + HEADER.size
    end = start + length
    if end > len(buf):
        return Torn(offset, f"the record needs {end - offset} bytes, {len(buf) - offset} are there")
    body = bytes(buf[start:end])
    if zlib.crc32(body) != bcrc:
        return Damaged(offset, "bad body checksum")
    command = _NAMES.get(code)
    if command is None or tlen + klen > length:
        return Damaged(offset, "impossible header fields")
    try:
        topic = body[:tlen].decode()
        sow_key = body[tlen : tlen + klen].decode()
    except UnicodeDecodeError:
        return Damaged(offset, "topic or sow_key is not UTF-8")
    return Record(offset, end, seq, command, topic, sow_key, body[tlen + klen :])


def scan(buf: bytes | memoryview, start: int = len(SEGMENT_MAGIC)) -> Scan:
    """Decode the records of a segment's bytes ``buf`` from ``start`` on.

    Stops at the first record that is not intact and says whether it is a torn tail or
    damage (see the module docstring); the caller decides what each means.
    """
    records: list[Record] = []
    offset = start
    while offset < len(buf):
        got = _decode(buf, offset)
        if isinstance(got, Record):
            records.append(got)
            offset = got.end
            continue
        if isinstance(got, Damaged) and not any(buf[offset:]):
            got = Torn(offset, f"{len(buf) - offset} zero bytes")
        return Scan(records, got)
    return Scan(records, None)


#: the marker file holds two slots of this size, written alternately
MARKER_SLOT: Final = 64


def encode_marker(discarded_through: int) -> bytes:
    """One marker slot's bytes (:data:`MARKER_SLOT` long)."""
    text = str(discarded_through)
    line = f"discarded_through {text} crc32 {zlib.crc32(text.encode()):08x}"
    return line.encode().ljust(MARKER_SLOT - 1) + b"\n"


def decode_marker(raw: bytes) -> int | None:
    """The ``discarded_through`` the marker file ``raw`` holds: the higher of its intact
    slots, or ``None`` when no slot is intact."""
    found: list[int] = []
    for start in range(0, len(raw), MARKER_SLOT):
        parts = raw[start : start + MARKER_SLOT].split()
        if len(parts) != 4 or parts[0] != b"discarded_through" or parts[2] != b"crc32":
            continue
        if parts[1].isdigit() and f"{zlib.crc32(parts[1]):08x}".encode() == parts[3]:
            found.append(int(parts[1]))
    return max(found) if found else None
