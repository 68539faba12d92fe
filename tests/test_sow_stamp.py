"""SOW stores are stamped with the newest txid applied, so a start reads only the
journal after it; a store that failed a write is never stamped past what it lacks.

What a user relies on: a SOW topic that had no record for a while (or never had one)
does not make every start read the journal from its beginning; and after a store
write failed (a full disk), the next start still applies the records that store lacks,
so no SOW record is silently missing.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from amps_py.config.model import SowTopicConfig
from amps_py.server.sowing import SowState
from amps_py.sow.store import SowStoreError
from txlog import Record


def record(topic: str, txid: int) -> Record:
    return Record(
        topic=topic,
        payload=b'{"id": %d}' % txid,
        pub_hash=9,
        seq=txid,
        txid=txid,
        sow_key=f"k{txid % 3}",
    )


def sow_state(tmp_path: Path) -> SowState:
    state = SowState(
        [SowTopicConfig("orders", "json", ("/id",)), SowTopicConfig("quotes", "json", ("/id",))],
        tmp_path,
    )
    state.open()
    return state


def test_a_topic_without_records_is_stamped_with_the_newest_txid(tmp_path: Path) -> None:
    state = sow_state(tmp_path)
    try:
        state.apply([record("orders", t) for t in range(1, 11)] + [record("trades", 11)])
        quotes = state.topics["quotes"].store
        assert quotes.applied_txid == 0  # no record of its topic yet
        assert state.stamp() == 2  # orders is at 10, the journal at 11
        assert quotes.applied_txid == 11
        assert state.topics["orders"].store.applied_txid == 11
        assert state.stamp() == 0  # nothing moved since
    finally:
        state.close()


def test_a_store_that_failed_a_write_is_not_stamped_past_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    state = sow_state(tmp_path)
    quotes = state.topics["quotes"].store
    try:
        state.apply([record("orders", 1), record("quotes", 2)])
        assert quotes.applied_txid == 2

        def full_disk(*_: object, **__: object) -> None:
            raise SowStoreError("write failed: no space left on device", quotes.directory)

        monkeypatch.setattr(quotes, "apply", full_disk)
        with pytest.raises(SowStoreError):
            state.apply([record("orders", 3), record("quotes", 4)])
        monkeypatch.undo()
        state.stamp()
        assert quotes.applied_txid == 2, "a start must apply txid 4 to quotes again"
    finally:
        state.close()  # a clean stop stamps too
    again = sow_state(tmp_path)
    try:
        assert again.topics["quotes"].store.applied_txid == 2
    finally:
        again.close()
