"""Small in-memory stores for the HA client (pure; no I/O).

:class:`SimplePublishStore` and :class:`SimpleBookmarkStore` implement the protocols of
:mod:`amps_py.client.store_api` with nothing on disk: they survive reconnects and
failovers, not a restart of the process. They are the HA client's defaults when no
store is given.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

from .store_api import Delivery, StoredPublish

__all__ = ["DEFAULT_MAX_BYTES", "SimpleBookmarkStore", "SimplePublishStore", "split_bookmark"]

#: the default bound on the payload bytes a publish store keeps
DEFAULT_MAX_BYTES = 64 * 1024 * 1024


class SimplePublishStore:
    """Publishes kept in memory until a persisted ack covers them.

    Args:
        max_bytes: the payload bytes kept at most (a publisher waits for room); a
            single larger message still fits into an empty store.
    """

    #: sync() does nothing, so it may run alongside any other call
    concurrent_sync = True

    def __init__(self, max_bytes: int = DEFAULT_MAX_BYTES) -> None:
        if max_bytes < 1:
            raise ValueError(f"max_bytes must be 1 or more, got {max_bytes}")
        self.max_bytes = max_bytes
        self._kept: dict[int, StoredPublish] = {}
        self._last_seq = 0
        self._discarded_through = 0
        self._bytes = 0

    @property
    def last_seq(self) -> int:
        return self._last_seq

    @property
    def discarded_through(self) -> int:
        return self._discarded_through

    def __len__(self) -> int:
        return len(self._kept)

    @property
    def bytes_kept(self) -> int:
        return self._bytes

    def has_room(self, size: int) -> bool:
        return not self._kept or self._bytes + size <= self.max_bytes

    def store(self, command: str, topic: str, data: bytes, sow_key: str = "") -> int:
        self._last_seq += 1
        self._kept[self._last_seq] = StoredPublish(self._last_seq, command, topic, data, sow_key)
        self._bytes += len(data)
        return self._last_seq

    def sync(self) -> None:
        pass

    def discard_through(self, seq: int) -> int:
        """Drop what ``seq`` covers. A ``seq`` above :attr:`last_seq` (the server holds
        more of this client name than this store assigned) moves :attr:`last_seq` up,
        so that new publishes are not taken for duplicates."""
        dropped = 0
        if seq > self._discarded_through:
            for kept in [s for s in self._kept if s <= seq]:
                self._bytes -= len(self._kept.pop(kept).data)
                dropped += 1
            self._discarded_through = seq
        self._last_seq = max(self._last_seq, seq)
        return dropped

    def unacked(self) -> Iterator[StoredPublish]:
        return iter(list(self._kept.values()))  # dict order is seq order

    def close(self) -> None:
        pass


def split_bookmark(bookmark: str) -> tuple[str, int] | None:
    """``"<publisher>|<seq>|"`` as (publisher, seq); None for any other form."""
    parts = bookmark.split("|")
    if len(parts) != 3 or parts[2] or not parts[0]:
        return None
    try:
        return parts[0], int(parts[1])
    except ValueError:
        return None


@dataclass
class _Publisher:
    """One publisher's messages on one subscription."""

    mark: int = 0  # every delivered seq at or below it is processed
    pending: set[int] = field(default_factory=set)  # delivered, not processed
    done: set[int] = field(default_factory=set)  # processed above the mark
    max_delivered: int = 0
    max_before_reconnect: int = 0


class SimpleBookmarkStore:
    """Per subscription and publisher, in memory: what was delivered and what the
    application processed (see :class:`~amps_py.client.store_api.BookmarkStore`)."""

    def __init__(self) -> None:
        self._subs: dict[str, dict[str, _Publisher]] = {}

    def _state(self, sub_id: str, publisher: str) -> _Publisher:
        return self._subs.setdefault(sub_id, {}).setdefault(publisher, _Publisher())

    def delivered(self, sub_id: str, bookmark: str) -> Delivery:
        parsed = split_bookmark(bookmark)
        if parsed is None:
            return Delivery()
        state = self._state(sub_id, parsed[0])
        seq = parsed[1]
        if seq <= state.mark or seq in state.done:
            return Delivery(duplicate=True)
        state.pending.add(seq)
        state.max_delivered = max(state.max_delivered, seq)
        return Delivery(possible_duplicate=seq <= state.max_before_reconnect)

    def processed(self, sub_id: str, bookmark: str) -> None:
        parsed = split_bookmark(bookmark)
        if parsed is None:
            return
        state = self._state(sub_id, parsed[0])
        seq = parsed[1]
        if seq <= state.mark:
            return
        state.pending.discard(seq)
        state.done.add(seq)
        below = min(state.pending, default=None)
        covered = [s for s in state.done if below is None or s < below]
        if covered:
            state.mark = max(covered)
            state.done.difference_update(covered)

    def resume_bookmark(self, sub_id: str) -> str:
        publishers = self._subs.get(sub_id, {})
        return ",".join(f"{p}|{s.mark}|" for p, s in publishers.items() if s.mark > 0)

    def reconnected(self, sub_id: str) -> None:
        for state in self._subs.get(sub_id, {}).values():
            state.max_before_reconnect = state.max_delivered

    def sync(self) -> None:
        pass

    def close(self) -> None:
        pass
