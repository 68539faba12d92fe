"""Forged or damaged queue records from a peer are logged and left out; they never
stop the commit step (which would stop the instance)."""

from __future__ import annotations

import logging

import pytest

from amps_py.config.queue_model import QueueConfig
from amps_py.filters import compile_filter
from amps_py.server.queues import QUEUE_ACK, QUEUE_TRANSFER, QueueBook
from txlog import Record


def book() -> QueueBook:
    config = QueueConfig(
        kind="distributed",
        name="work",
        message_type="json",
        underlying_topic="work",
        underlying_is_regex=False,
    )
    return QueueBook([config], "A", compile_filter, lambda *_: None)


def record(kind: int, payload: bytes, txid: int) -> Record:
    rec = Record(topic="work", payload=payload, pub_hash=7, seq=txid, kind=kind, origin="B")
    rec.txid = txid
    return rec


@pytest.mark.parametrize(
    "kind,payload",
    [
        (QUEUE_ACK, b"not json"),
        (QUEUE_ACK, b'{"bookmarks": "7|1|"}'),
        (QUEUE_ACK, b'{"bookmarks": [1, 2]}'),
        (QUEUE_TRANSFER, b'{"op": "steal", "bookmarks": ["7|1|"], "to": "B"}'),
        (QUEUE_TRANSFER, b'{"op": "grant", "bookmarks": ["7|1|"], "to": ""}'),
        (QUEUE_TRANSFER, b"[]"),
    ],
)
def test_a_forged_queue_record_is_logged_and_left_out(
    kind: int, payload: bytes, caplog: pytest.LogCaptureFixture
) -> None:
    queues = book()
    queues.rebuild(lambda after, limit: [] if after else [record(1, b'{"n": 1}', 1)])
    with caplog.at_level(logging.WARNING, logger="amps_py.server.queues"):
        queues.on_commit([record(kind, payload, 2)])
    state = queues.get("work").state  # type: ignore[union-attr]
    assert len(state) == 1 and next(state.messages()).owner == "B"  # unchanged
    assert any(getattr(r, "code", None) == "18-0002" for r in caplog.records), caplog.text
