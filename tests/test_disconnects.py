"""The recent disconnects the admin API shows (amps_py.server.disconnects): newest
first, bounded, and counted by reason since the instance started."""

from __future__ import annotations

from amps_py.server.disconnects import Disconnect, RecentDisconnects


def gone(i: int, reason: str) -> Disconnect:
    return Disconnect(1_700_000_000.0 + i, f"c{i}", i, "127.0.0.1:1", "json-tcp", reason)


def test_the_newest_are_kept_newest_first_and_every_one_is_counted() -> None:
    ended = RecentDisconnects(keep=3)
    for i in range(5):
        ended.record(gone(i, "slow client" if i % 2 else "connection closed"))
    assert [d.client_name for d in ended.recent()] == ["c4", "c3", "c2"]
    assert ended.counts == {"connection closed": 3, "slow client": 2}
    stats = ended.statistics()
    assert stats["counts"] == {"connection closed": 3, "slow client": 2}
    assert stats["recent"][0] == {
        "at": 1_700_000_004.0,
        "client_name": "c4",
        "connection": 4,
        "remote_address": "127.0.0.1:1",
        "transport": "json-tcp",
        "reason": "connection closed",
        "detail": "",
    }
