"""Splitting a ``sow`` batch frame into its records (sans-IO).

A ``sow`` frame carries up to ``bs`` records after its outer header (AMPS-NOTES 1.4.2)::

    {"c":"sow","t":"orders","query_id":"q1","bs":2}{"k":"11","l":8}{"id":11}{"k":"12","l":8,"x":"abc"}{"id":12}

Each record is a small flat JSON header (``k`` sow key, ``l`` = exact byte length of
its payload, optionally ``x`` correlation id, ``bm`` bookmark, ``ts`` timestamp; long
names such as ``sow_key``/``msg_len`` are accepted too) followed by exactly ``l``
payload bytes. :func:`split_sow_batch` checks all of it: a record without ``l``, an
``l`` that runs past the frame or lands inside the next record, and a record count
other than ``bs`` each raise :class:`ProtocolError` saying which record is wrong.
(:func:`amps_py.protocol.messages.sow_batch` builds such frames.)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson

from .codec import Frame, _coerce_int, _header_end
from .errors import ProtocolError
from .header import LONG_TO_SHORT

#: ``ProtocolError.reason`` of every damaged sow batch
INVALID_SOW_BATCH = "invalid sow batch"


@dataclass(frozen=True, slots=True)
class SowRecord:
    """One record of a SOW query result.

    Attributes:
        topic: the topic the record is stored under (the batch's ``t``).
        key: its SOW key (``k``).
        data: the message payload, exactly as stored.
        correlation_id: the publisher's correlation id (``x``), or "".
        bookmark: the bookmark of the message that set the record (``bm``), or "".
        timestamp: the processing time (``ts``, AMPS ISO-8601 form), or "".
    """

    topic: str
    key: str
    data: bytes
    correlation_id: str = ""
    bookmark: str = ""
    timestamp: str = ""

    def json(self) -> Any:
        """The payload parsed as JSON (raises ``orjson.JSONDecodeError`` if it is not)."""
        return orjson.loads(self.data)


def split_sow_batch(frame: Frame) -> list[SowRecord]:
    """The records of a decoded ``sow`` frame, in the order the server sent them.

    Raises:
        ProtocolError: (reason ``invalid sow batch``) the frame is not a ``sow``
            frame, a record has no JSON header or no valid ``l``, a record's ``l``
            runs past the end of the frame (truncated record) or ends inside the next
            record's header, or the number of records differs from the header's ``bs``.
    """
    header = frame.header
    if header.get("c") != "sow":
        raise ProtocolError(
            f"not a sow batch: the frame's command is {header.get('c')!r}; only frames "
            'with "c":"sow" hold sow records',
            reason=INVALID_SOW_BATCH,
        )
    topic = str(header.get("t", ""))
    payload = frame.payload
    size = len(payload)
    records: list[SowRecord] = []
    pos = 0
    while pos < size:
        number = len(records) + 1
        fields, body_start = _record_header(payload, pos, number, records)
        length = fields.get("l")
        if length is None:
            raise _damaged(
                f"sow record {number} has no 'l' (msg_len) field; every record header "
                f"must give the exact byte length of its payload{_hint(records)}"
            )
        length = _record_int(length, number)
        if length < 0:
            raise _damaged(f"sow record {number} has a negative length l={length}")
        end = body_start + length
        if end > size:
            raise _damaged(
                f"sow record {number} (key {fields.get('k', '')!r}) says l={length} but only "
                f"{size - body_start} byte(s) follow its header: the record is truncated "
                "or its l is wrong"
            )
        records.append(
            SowRecord(
                topic,
                str(fields.get("k", "")),
                payload[body_start:end],
                str(fields.get("x", "")),
                str(fields.get("bm", "")),
                str(fields.get("ts", "")),
            )
        )
        pos = end
    expected = header.get("bs")
    if expected is not None and expected != len(records):
        raise _damaged(
            f"sow batch header says bs={expected} but the frame holds {len(records)} "
            "record(s): records are missing or the batch size is wrong"
        )
    return records


def _hint(before: list[SowRecord]) -> str:
    """What probably went wrong when record ``len(before) + 1`` makes no sense."""
    if before:
        return f"; record {len(before)} (key {before[-1].key!r}) has a wrong l"
    return "; the batch is damaged"


def _damaged(text: str) -> ProtocolError:
    return ProtocolError(text, reason=INVALID_SOW_BATCH)


def _record_int(value: Any, number: int) -> int:
    try:
        return _coerce_int("l", value)
    except ProtocolError as exc:
        raise _damaged(f"sow record {number}: {exc}") from None


def _record_header(
    payload: bytes, pos: int, number: int, before: list[SowRecord]
) -> tuple[dict[str, Any], int]:
    """The normalised header of the record starting at ``pos`` and where its payload
    starts."""
    hint = _hint(before)
    if payload[pos] != 0x7B:  # "{"
        raise _damaged(
            f"sow record {number} at byte {pos} of the batch does not start with a JSON "
            f"header '{{'{hint}"
        )
    raw: Any = None
    end = payload.find(b"}", pos) + 1
    if end:
        try:
            raw = orjson.loads(payload[pos:end])
        except orjson.JSONDecodeError:
            raw = None
    if raw is None:  # a "}" inside a string, or no complete object
        rest = payload[pos:]
        length = _header_end(rest)
        try:
            if length < 0:
                raise ValueError("unterminated")
            raw = orjson.loads(rest[:length])
        except (ValueError, orjson.JSONDecodeError):
            raise _damaged(
                f"sow record {number} at byte {pos} has no complete JSON header{hint}"
            ) from None
        end = pos + length
    if not isinstance(raw, dict):
        raise _damaged(f"sow record {number} header is not a JSON object{hint}")
    fields: dict[str, Any] = {}
    for key, value in raw.items():
        if not isinstance(value, (str, int, float, bool)):
            raise _damaged(
                f"sow record {number} header field {key!r} is not a string or a number{hint}"
            )
        fields[LONG_TO_SHORT.get(key) or key] = value
    return fields, end
