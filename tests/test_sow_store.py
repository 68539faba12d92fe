"""The SOW store on a real LMDB environment in tmp_path."""

from __future__ import annotations

import contextlib
import random
from collections.abc import Iterator
from pathlib import Path

import lmdb
import pytest

from amps_py.sow import SowEntry, SowStore, SowStoreError
from amps_py.sow.store import DATA_FILE


def rec(key: str, txid: int, payload: bytes = b"{}", expires_us: int = 0) -> SowEntry:
    return SowEntry(key, txid, f"bm-{txid}", f"cid-{txid}", 1_000 * txid, payload, expires_us)


@pytest.fixture
def store(tmp_path: Path) -> Iterator[SowStore]:
    with SowStore(tmp_path / "orders", "orders", transient=False) as s:
        yield s


def test_upsert_inserts_then_replaces_by_key(store: SowStore) -> None:
    assert store.apply([rec("a", 1, b'{"v":1}'), rec("b", 2)], [], 2) == (2, 0, 0)
    assert store.apply([rec("a", 3, b'{"v":3}')], [], 3) == (0, 1, 0)
    assert store.get("a") == rec("a", 3, b'{"v":3}')
    assert store.get("missing") is None
    assert store.count == 2
    assert store.applied_txid == 3


def test_every_field_round_trips(store: SowStore) -> None:
    entry = SowEntry("k/+=", 2**63, "bm|1|", "x" * 300, -5, bytes(range(256)) * 3, 2**64 - 1)
    store.apply([entry], [], 1)
    assert store.get("k/+=") == entry
    assert list(store.entries()) == [entry]


def test_delete_removes_and_missing_deletes_are_no_ops(store: SowStore) -> None:
    store.apply([rec("a", 1), rec("b", 2)], [], 2)
    assert store.apply([], ["a", "zzz"], 3) == (0, 0, 1)
    assert store.get("a") is None
    assert [e.key for e in store.entries()] == ["b"]
    assert store.count == 1


def test_entries_come_in_key_order(store: SowStore) -> None:
    store.apply([rec(k, i + 1) for i, k in enumerate(["m", "a", "z", "b"])], [], 4)
    assert [e.key for e in store.entries()] == ["a", "b", "m", "z"]


def test_count_and_bytes_stay_exact_after_mixed_operations(tmp_path: Path) -> None:
    seed = 14
    print(f"seed {seed}")
    rng = random.Random(seed)
    model: dict[str, SowEntry] = {}
    txid = 0
    with SowStore(tmp_path / "s", "t", transient=False) as store:
        for _ in range(60):
            changes: list[tuple[str, SowEntry | None]] = []
            for _ in range(rng.randint(1, 40)):
                key = f"k{rng.randint(0, 80)}"
                txid += 1
                if rng.random() < 0.3:
                    changes.append((key, None))
                    model.pop(key, None)
                else:
                    e = rec(key, txid, b"x" * rng.randint(0, 300))
                    changes.append((key, e))
                    model[key] = e
            store.apply_changes(changes, txid)
            assert store.count == len(model)
            assert store.bytes == sum(len(e.payload) for e in model.values())
        assert list(store.entries()) == [model[k] for k in sorted(model)]
    with SowStore(tmp_path / "s", "t", transient=False) as again:
        assert (again.count, again.bytes, again.applied_txid) == (
            len(model),
            sum(len(e.payload) for e in model.values()),
            txid,
        )
        assert list(again.entries()) == [model[k] for k in sorted(model)]


def test_apply_changes_follows_journal_order_for_one_key(store: SowStore) -> None:
    store.apply_changes([("a", rec("a", 1)), ("a", None)], 1)
    assert store.get("a") is None
    store.apply_changes([("b", None), ("b", rec("b", 2)), ("b", rec("b", 3))], 3)
    assert store.get("b") == rec("b", 3)
    assert store.count == 1


def test_apply_refuses_a_key_both_upserted_and_deleted(store: SowStore) -> None:
    with pytest.raises(ValueError, match="apply_changes"):
        store.apply([rec("a", 1)], ["a"], 1)
    assert store.count == 0 and store.applied_txid == 0


def test_applied_txid_survives_reopen_and_only_moves_forward(tmp_path: Path) -> None:
    with SowStore(tmp_path / "s", "t", transient=False) as store:
        assert store.applied_txid == 0
        store.apply([rec("a", 5)], [], 7)
        store.apply([], [], 9)  # records of other topics move the txid too
    with SowStore(tmp_path / "s", "t", transient=False) as store:
        assert store.applied_txid == 9
        assert store.get("a") == rec("a", 5)
        with pytest.raises(ValueError, match="txid 9"):
            store.apply([rec("b", 8)], [], 8)
        assert store.get("b") is None


def test_a_snapshot_is_isolated_from_later_applies(store: SowStore) -> None:
    store.apply([rec("a", 1), rec("b", 2)], [], 2)
    with store.snapshot() as snap:
        store.apply([rec("a", 3, b"new"), rec("c", 4)], ["b"], 4)
        assert (snap.count, snap.applied_txid) == (2, 2)
        assert [e.key for e in snap] == ["a", "b"]
        assert snap.get("a") == rec("a", 1)
        assert snap.get("b") == rec("b", 2)
        assert snap.get("c") is None
        with store.snapshot() as later:
            assert [e.key for e in later] == ["a", "c"]
            assert later.applied_txid == 4
        # iterating while applies go on, from a chosen key
        it = snap.iter_from("b")
        store.apply([rec("bb", 5)], [], 5)
        assert [e.key for e in it] == ["b"]
    with pytest.raises(SowStoreError, match="closed"):
        snap.get("a")


def test_entries_is_one_snapshot_and_can_be_closed_early(store: SowStore) -> None:
    store.apply([rec(f"k{i}", i + 1) for i in range(10)], [], 10)
    it = store.entries()
    first = next(it)
    store.apply([], [f"k{i}" for i in range(1, 10)], 11)
    assert [first.key, *(e.key for e in it)] == [f"k{i}" for i in range(10)]
    it2 = store.entries()
    next(it2)
    it2.close()  # the read transaction ends; the store stays usable
    assert [e.key for e in store.entries()] == ["k0"]


def test_transient_stores_are_wiped_on_open(tmp_path: Path) -> None:
    directory = tmp_path / "t"
    with SowStore(directory, "t", transient=True) as store:
        store.apply([rec("a", 1)], [], 1)
    (directory / "operator-notes.txt").write_text("keep me")
    with SowStore(directory, "t", transient=True) as store:
        assert (store.count, store.bytes, store.applied_txid) == (0, 0, 0)
        assert list(store.entries()) == []
    assert (directory / "operator-notes.txt").read_text() == "keep me"


def test_clear_empties_the_store_for_a_rebuild(store: SowStore) -> None:
    store.apply([rec("a", 1, expires_us=5)], [], 3)
    store.clear()
    assert (store.count, store.bytes, store.applied_txid) == (0, 0, 0)
    assert list(store.entries()) == [] and store.expired(10) == []
    store.apply([rec("a", 1)], [], 1)  # the journal is applied again from its start
    assert store.count == 1


def test_expired_lists_due_records_soonest_first(store: SowStore) -> None:
    store.apply([rec("a", 1, expires_us=300), rec("b", 2, expires_us=100), rec("c", 3)], [], 3)
    assert [e.key for e in store.expired(200)] == ["b"]
    assert [e.key for e in store.expired(1_000)] == ["b", "a"]
    assert [e.key for e in store.expired(1_000, limit=1)] == ["b"]
    store.apply([rec("b", 4, expires_us=500)], ["a"], 4)  # renewed; deleted
    assert store.expired(400) == []
    assert [e.key for e in store.expired(500)] == ["b"]
    store.apply([rec("b", 5)], [], 5)  # no longer expires
    assert store.expired(10**12) == []


def test_the_map_grows_when_full_but_not_under_an_open_snapshot(tmp_path: Path) -> None:
    with SowStore(tmp_path / "s", "t", transient=False, map_size=1 << 20) as store:
        big = b"x" * 4000
        txid = 0
        with store.snapshot(), pytest.raises(SowStoreError, match="snapshot"):
            for _ in range(100):
                txid += 1
                store.apply([rec(f"k{txid}", txid, big)], [], txid)
        stuck = store.count
        for _ in range(2000):  # 8 MB through a 1 MB map
            txid += 1
            store.apply([rec(f"k{txid}", txid, big)], [], txid)
        assert store.count == stuck + 2000
        assert store.bytes == store.count * len(big)


def test_a_closed_store_says_so(tmp_path: Path) -> None:
    store = SowStore(tmp_path / "s", "t", transient=False)
    store.close()
    store.close()
    with pytest.raises(SowStoreError, match="closed"):
        store.get("a")
    with pytest.raises(SowStoreError, match="closed"):
        store.apply([rec("a", 1)], [], 1)


def test_a_store_is_opened_by_one_owner_at_a_time(tmp_path: Path) -> None:
    with SowStore(tmp_path / "s", "t", transient=False):
        with pytest.raises(SowStoreError, match="already open") as info:
            SowStore(tmp_path / "s", "t", transient=True)
        assert not info.value.damaged
    with SowStore(tmp_path / "s", "t", transient=False):
        pass  # closing released it


def test_a_store_of_another_topic_is_refused(tmp_path: Path) -> None:
    with SowStore(tmp_path / "s", "orders", transient=False) as store:
        store.apply([rec("a", 1)], [], 1)
    with pytest.raises(SowStoreError, match="belongs to topic 'orders'"):
        SowStore(tmp_path / "s", "trades", transient=False)


def _assert_rebuild_advice(error: SowStoreError, directory: Path) -> None:
    message = str(error)
    assert error.damaged
    assert error.directory == directory
    assert str(directory / DATA_FILE) in message
    assert f"delete the directory {directory}" in message
    assert "rebuilt from the transaction log" in message


@pytest.mark.parametrize(
    "damage",
    ["garbage", "truncated", "empty"],
)
def test_a_damaged_store_file_raises_a_store_error_naming_the_fix(
    tmp_path: Path, damage: str
) -> None:
    directory = tmp_path / "s"
    with SowStore(directory, "t", transient=False) as store:
        store.apply([rec(f"k{i}", i + 1, b"y" * 1000) for i in range(500)], [], 500)
        store.sync()
    data = directory / DATA_FILE
    if damage == "garbage":
        data.write_bytes(b"this is not an LMDB file " * 400)
    elif damage == "truncated":
        with open(data, "r+b") as f:
            f.truncate(data.stat().st_size // 3)
    else:
        data.write_bytes(b"")
    with pytest.raises(SowStoreError) as info:
        SowStore(directory, "t", transient=False)
    _assert_rebuild_advice(info.value, directory)
    # the damaged store let go of its directory: the fix works in the same process
    for name in list(directory.iterdir()):
        name.unlink()
    directory.rmdir()
    with SowStore(directory, "t", transient=False) as rebuilt:
        assert rebuilt.applied_txid == 0


def test_a_record_in_an_unknown_layout_is_reported_as_damage(tmp_path: Path) -> None:
    directory = tmp_path / "s"
    with SowStore(directory, "t", transient=False) as store:
        store.apply([rec("a", 1)], [], 1)
    env = lmdb.open(str(directory), max_dbs=4)
    with contextlib.closing(env), env.begin(write=True) as txn:
        txn.put(b"a", b"\x09future layout", db=env.open_db(b"records", txn=txn))
    with SowStore(directory, "t", transient=False) as store:
        with pytest.raises(SowStoreError, match="layout version 9") as info:
            store.get("a")
        _assert_rebuild_advice(info.value, directory)
        with pytest.raises(SowStoreError, match="layout version 9"):
            list(store.entries())


def test_an_unwritable_directory_is_a_clear_error(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    with pytest.raises(SowStoreError, match="cannot create the SOW store") as info:
        SowStore(blocker / "s", "t", transient=False)
    assert not info.value.damaged


def test_closing_the_store_under_an_iterator_says_closed_not_damaged(tmp_path: Path) -> None:
    store = SowStore(tmp_path / "s", "t", transient=False)
    store.apply([rec(f"k{i}", i + 1) for i in range(1000)], [], 1000)
    it = store.entries()
    next(it)
    store.close()
    with pytest.raises(SowStoreError, match="closed") as info:
        list(it)
    assert not info.value.damaged


def test_a_dropped_snapshot_does_not_stop_the_map_from_growing(tmp_path: Path) -> None:
    with SowStore(tmp_path / "s", "t", transient=False, map_size=1 << 20) as store:
        snap = store.snapshot()
        assert snap.count == 0
        del snap  # never closed
        for txid in range(1, 600):
            store.apply([rec(f"k{txid}", txid, b"z" * 4000)], [], txid)
        assert store.count == 599


def test_entries_after_a_key_of_the_longest_size_lmdb_takes(store: SowStore) -> None:
    """Iteration searches for the key after each one (not LMDB's step onto the next
    page, which aborts the process on a damaged page): after a key of 511 bytes, the
    next key is not that key plus a byte."""
    longest = ["y" * 511, "y" * 510 + "z", "y" * 509 + "zz", "z" * 511]
    keys = sorted(["a", "y", "yy", *longest], key=str.encode)
    store.apply([rec(k, i + 1) for i, k in enumerate(keys)], [], len(keys))
    assert [e.key for e in store.entries()] == keys


def test_key_after() -> None:
    from amps_py.sow.store import key_after

    assert key_after(b"ab", 4) == b"ab\x00"
    assert key_after(b"abcd", 4) == b"abce"
    assert key_after(b"ab\xff\xff", 4) == b"ac"
    assert key_after(b"\xff\xff\xff\xff", 4) is None
