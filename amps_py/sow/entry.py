"""One SOW record as the store holds it (re-exported by :mod:`amps_py.sow.store`)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(slots=True)
class SowEntry:
    """The current value of one SOW key.

    Attributes:
        key: the SOW key (generated digits or the publisher's explicit key).
        txid: the journal transaction id of the record that wrote this value.
        bookmark: the record's bookmark, as sent in ``bm`` ("" when none).
        correlation_id: the publisher's correlation id (``x``), "" when none.
        ts_us: the record's timestamp, microseconds since the UNIX epoch.
        payload: the message body (for ``delta_publish``, the merged message).
        expires_us: when the record expires, microseconds since the epoch; 0 = never.
        topic: the record's topic when the store holds several (a Pattern SOW
            topic's, read through :mod:`amps_py.sow.slots`); "" otherwise.
    """

    key: str
    txid: int
    bookmark: str
    correlation_id: str
    ts_us: int
    payload: bytes
    expires_us: int = 0
    topic: str = ""
