"""The queue checkpoint on its own (no server): what it keeps, what a write changes,
and that damage or a changed queue definition is caught, never loaded as a queue.

What a user relies on: a queue loaded from its checkpoint holds exactly the messages
(and owners) the journal says it holds at the checkpoint's txid; a checkpoint that is
damaged or was written for another definition of the queue is refused with a reason,
so the server rebuilds the queue from the journal instead of serving a wrong one.
"""

from __future__ import annotations

import struct
from pathlib import Path

import lmdb
import pytest

from amps_py.queue import QueueMessage, QueuePolicy, QueueState
from amps_py.server.queue_checkpoint import Changes, CheckpointDamaged, QueueCheckpoint, row_of


def message(txid: int, owner: str = "A", priority: int = 0) -> QueueMessage:
    published = 1_700_000_000.5 + txid
    return QueueMessage(txid, f"7|{txid}|", None, f"c{txid}", published, owner, priority)


def no_lookup(bookmark: str) -> int | None:
    raise AssertionError(f"{bookmark} should not need the journal's index")


def lookup(bookmark: str) -> int | None:
    """The test's bookmark index: ``7|<txid>|``."""
    return int(bookmark.split("|")[1])


def written(directory: Path, txids: range) -> None:
    """A checkpoint of queue ``work`` (definition ``d``) in ``directory`` holding a
    message per txid, closed."""
    cp = QueueCheckpoint(directory, "work", "d")
    changes = Changes()
    for txid in txids:
        changes.admit(row_of(message(txid)))
    cp.write(txids[-1] + 1, changes, no_lookup)
    cp.close()


def loaded(cp: QueueCheckpoint) -> list[tuple[int, str, str, int]]:
    return [(m.txid, m.bookmark, m.owner, m.priority) for m in cp.messages()]


def test_a_message_that_entered_and_left_between_checkpoints_is_never_written() -> None:
    changes = Changes()
    changes.admit(row_of(message(5)))
    changes.transfer("7|5|", "B")
    changes.remove("7|5|")
    changes.remove("7|3|", 3)  # entered before: its removal is kept, with its txid
    changes.transfer("7|2|", "C")
    assert changes.added == {} and changes.removed == {"7|3|": 3}
    assert changes.owners == {"7|2|": "C"}


def test_changes_after_a_failed_write_follow_the_ones_it_held() -> None:
    older = Changes()
    older.admit(row_of(message(10)))
    older.remove("7|4|", 4)
    newer = Changes()
    newer.remove("7|10|")  # acked after the failed write: the two cancel out
    newer.admit(row_of(message(11)))
    newer.transfer("7|6|", "B")
    merged = older.then(newer)
    assert list(merged.added) == ["7|11|"]
    assert merged.removed == {"7|4|": 4} and merged.owners == {"7|6|": "B"}


def test_a_checkpoint_round_trips_messages_owners_and_its_txid(tmp_path: Path) -> None:
    cp = QueueCheckpoint(tmp_path / "q", "work", "def-1")
    changes = Changes()
    for txid in (3, 9, 5000, 5001, 90_000):  # several chunks
        changes.admit(row_of(message(txid, priority=txid % 3)))
    cp.write(90_010, changes, no_lookup)
    later = Changes()
    later.remove("7|9|")  # txid unknown here: looked up in the index
    later.transfer("7|5000|", "B")
    later.admit(row_of(message(90_011)))
    cp.write(90_020, later, lookup)
    cp.close()

    again = QueueCheckpoint(tmp_path / "q", "work", "def-1")
    assert again.stale == "" and again.applied_txid == 90_020 and again.count == 5
    assert loaded(again) == [
        (3, "7|3|", "A", 0),
        (5000, "7|5000|", "B", 2),
        (5001, "7|5001|", "A", 0),
        (90_000, "7|90000|", "A", 0),
        (90_011, "7|90011|", "A", 0),
    ]
    # what a queue is filled with: the same as adding each message in turn
    state = QueueState(QueuePolicy(), "A")
    assert state.restore(again.messages()) == 5
    assert [m.txid for m in state.messages()] == [3, 5000, 5001, 90_000, 90_011]
    assert all(m.payload is None for m in state.messages())
    again.close()


def test_a_checkpoint_of_another_definition_opens_empty_and_says_why(tmp_path: Path) -> None:
    cp = QueueCheckpoint(tmp_path / "q", "work", "filter /a > 1")
    changes = Changes()
    changes.admit(row_of(message(1)))
    cp.write(1, changes, no_lookup)
    cp.close()
    changed = QueueCheckpoint(tmp_path / "q", "work", "filter /a > 2")
    assert "definition changed" in changed.stale
    assert changed.applied_txid == 0 and loaded(changed) == []
    changed.close()


def test_a_checkpoint_of_another_queue_is_refused(tmp_path: Path) -> None:
    QueueCheckpoint(tmp_path / "q", "work", "d").close()
    with pytest.raises(CheckpointDamaged, match="checkpoint of queue 'work', not 'jobs'"):
        QueueCheckpoint(tmp_path / "q", "jobs", "d")


def test_a_chunk_damaged_on_disk_fails_its_crc_when_loaded(tmp_path: Path) -> None:
    written(tmp_path / "q", range(1, 50))
    # one byte of the chunk's rows changes (bit rot LMDB itself cannot see)
    env = lmdb.open(str(tmp_path / "q"), max_dbs=2)
    chunks = env.open_db(b"chunks")
    with env.begin(write=True) as txn:
        key = struct.pack(">Q", 0)
        value = bytearray(txn.get(key, db=chunks))
        value[20] ^= 0x01
        txn.put(key, bytes(value), db=chunks)
    env.close()
    damaged = QueueCheckpoint(tmp_path / "q", "work", "d")
    with pytest.raises(CheckpointDamaged, match=r"chunk 0 .* fails its CRC check"):
        list(damaged.messages())
    damaged.close()


def test_a_truncated_checkpoint_file_is_damage(tmp_path: Path) -> None:
    written(tmp_path / "q", range(1, 3000))
    data = tmp_path / "q" / "data.mdb"
    with open(data, "r+b") as f:
        f.truncate(data.stat().st_size // 3)
    with pytest.raises(CheckpointDamaged, match=r"data\.mdb is damaged"):
        QueueCheckpoint(tmp_path / "q", "work", "d")
