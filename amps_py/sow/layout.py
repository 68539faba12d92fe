"""The SOW store's on-disk value layout (version 1), and its meta records.

A stored value is a fixed header, then the bookmark, the correlation id and the
payload, back to back::

    version u8 (1) | txid u64 | ts_us i64 | expires_us u64 | len(bookmark) u32 |
    len(correlation id) u32 | bookmark | correlation id | payload

all integers big-endian; the key is the LMDB key, not repeated. A reader refuses a
version it does not know (the store then reports damage and is rebuilt from the
journal), so a later layout can add fields behind a new version byte. Never pickle.

Pure: no I/O, no trio.
"""

from __future__ import annotations

import struct
from typing import Final

from .entry import SowEntry

FORMAT: Final = b"amps-py-sow/1"
#: value layout version 1: version, txid, ts_us, expires_us, len(bookmark), len(cid)
HEADER: Final = struct.Struct(">BQqQII")
VERSION: Final = 1
STATE: Final = struct.Struct(">QQQ")  # applied txid, count, payload bytes
EXPIRY: Final = struct.Struct(">Q")


def encode_entry(entry: SowEntry) -> bytes:
    """``entry`` (less its key, which is the LMDB key) in the version-1 value layout."""
    bookmark = entry.bookmark.encode()
    cid = entry.correlation_id.encode()
    header = HEADER.pack(
        VERSION, entry.txid, entry.ts_us, entry.expires_us, len(bookmark), len(cid)
    )
    return b"".join((header, bookmark, cid, entry.payload))


def decode_entry(key: str, value: bytes) -> SowEntry:
    """The entry stored under ``key``.

    Raises:
        ValueError: ``value`` is not in a layout this version reads.
    """
    if len(value) < HEADER.size or value[0] != VERSION:
        version = value[0] if value else None
        raise ValueError(f"SOW record {key!r} has layout version {version} of {len(value)} bytes")
    _, txid, ts_us, expires_us, bm_len, cid_len = HEADER.unpack_from(value)
    start = HEADER.size
    cid_start = start + bm_len
    payload_start = cid_start + cid_len
    if payload_start > len(value):
        raise ValueError(f"SOW record {key!r} is cut short ({len(value)} bytes)")
    return SowEntry(
        key,
        txid,
        value[start:cid_start].decode(),
        value[cid_start:payload_start].decode(),
        ts_us,
        value[payload_start:],
        expires_us,
    )


def payload_size(value: bytes) -> int:
    """Payload bytes of a stored value, from its header alone."""
    _, _, _, _, bm_len, cid_len = HEADER.unpack_from(value)
    return len(value) - HEADER.size - int(bm_len) - int(cid_len)


def expires_of(value: bytes) -> int:
    """The expiry time (µs, 0 = never) of a stored value, from its header alone."""
    return int(HEADER.unpack_from(value)[3])


def expiry_key(expires_us: int, key: bytes) -> bytes:
    """The expiry index key: expiry time then SOW key, so a cursor sees the soonest first."""
    return EXPIRY.pack(expires_us) + key
