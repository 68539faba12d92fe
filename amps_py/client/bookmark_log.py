"""The record format of :class:`~amps_py.client.bookmark_store.FileBookmarkStore`'s log
(pure: bytes in, entries out; no I/O).

A log file is a header followed by records::

    header  = b"amps-py bookmark log 1\\n"                      (23 bytes)
    record  = length:u32le  crc:u32le  body                     (8 + length bytes)
    body    = pub_hash:u64le  mark:u64le  max_delivered:u64le
              sub_id_len:u16le  sub_id:utf-8[sub_id_len]

``crc`` is the CRC-32 (``zlib.crc32``) of ``body``. A record says "for subscription
``sub_id``, publisher ``pub_hash``: every delivered message up to ``mark`` was processed,
and messages up to ``max_delivered`` were handed to the application"; a later record for
the same pair replaces an earlier one.
"""

from __future__ import annotations

import struct
import zlib
from dataclasses import dataclass

__all__ = [
    "MAGIC",
    "BadLog",
    "Entry",
    "LogContents",
    "decode_log",
    "encode_record",
    "encode_sub_id",
    "fits_u64",
]

MAGIC = b"amps-py bookmark log 1\n"
_HEAD = struct.Struct("<II")
_BODY = struct.Struct("<QQQH")
_MAX_SUB_ID = 0xFFFF
_MAX_U64 = 2**64 - 1


class BadLog(ValueError):
    """The file does not start like a bookmark log (it is some other file)."""


@dataclass(frozen=True)
class Entry:
    """One record: the persisted marks of one publisher in one subscription."""

    sub_id: str
    pub_hash: int
    mark: int
    max_delivered: int


@dataclass(frozen=True)
class LogContents:
    """What :func:`decode_log` read.

    Attributes:
        entries: the intact records, in file order.
        good_bytes: the length of the file up to the end of the last intact record.
        problem: why reading stopped before the end of the data (a torn or corrupt
            record), or ``""`` when every byte was read.
    """

    entries: list[Entry]
    good_bytes: int
    problem: str = ""


def encode_sub_id(sub_id: str) -> bytes:
    """The UTF-8 of ``sub_id``.

    Raises:
        ValueError: longer than 65535 bytes in UTF-8 (the log's limit).
    """
    raw = sub_id.encode("utf-8")
    if len(raw) > _MAX_SUB_ID:
        raise ValueError(
            f"sub_id {sub_id[:40]!r}... is {len(raw)} bytes in UTF-8; a file bookmark "
            f"store keeps sub_ids up to {_MAX_SUB_ID} bytes: use a shorter sub_id"
        )
    return raw


def encode_record(sub_id: str, pub_hash: int, mark: int, max_delivered: int) -> bytes:
    """One record (header and body) as bytes."""
    raw = encode_sub_id(sub_id)
    body = _BODY.pack(pub_hash, mark, max_delivered, len(raw)) + raw
    return _HEAD.pack(len(body), zlib.crc32(body)) + body


def decode_log(data: bytes) -> LogContents:
    """Read a whole log file's bytes.

    A record cut short (a crash in the middle of a write) or one whose CRC does not
    match ends the reading: everything before it is returned, and
    :attr:`LogContents.problem` says what was wrong and where.

    Raises:
        BadLog: ``data`` does not start with the log header.
    """
    if not data.startswith(MAGIC):
        raise BadLog(
            f"does not start with the bookmark log header {MAGIC!r} "
            f"(it starts with {data[: len(MAGIC)]!r})"
        )
    entries: list[Entry] = []
    at = len(MAGIC)
    end = len(data)
    while at < end:
        if end - at < _HEAD.size:
            return LogContents(entries, at, f"{end - at} bytes of a record header at offset {at}")
        length, crc = _HEAD.unpack_from(data, at)
        start = at + _HEAD.size
        if length < _BODY.size or length > _BODY.size + _MAX_SUB_ID:
            return LogContents(entries, at, f"a record length of {length} at offset {at}")
        if start + length > end:
            return LogContents(
                entries,
                at,
                f"a record at offset {at} cut short ({end - start} of {length} bytes)",
            )
        body = data[start : start + length]
        if zlib.crc32(body) != crc:
            return LogContents(entries, at, f"a record at offset {at} with a wrong CRC")
        pub_hash, mark, max_delivered, sub_len = _BODY.unpack_from(body)
        if _BODY.size + sub_len != length:
            return LogContents(entries, at, f"a record at offset {at} with a wrong sub_id length")
        try:
            sub_id = body[_BODY.size :].decode("utf-8")
        except UnicodeDecodeError:
            return LogContents(entries, at, f"a record at offset {at} with a sub_id not UTF-8")
        entries.append(Entry(sub_id, pub_hash, mark, max_delivered))
        at = start + length
    return LogContents(entries, at)


def fits_u64(value: int) -> bool:
    """Whether ``value`` fits the log's unsigned 64-bit fields."""
    return 0 <= value <= _MAX_U64
