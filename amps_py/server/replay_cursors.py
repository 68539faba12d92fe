"""Where each running bookmark replay stands (pure bookkeeping, no trio).

A replay (:mod:`.replay`) notes the txid it has read through; journal maintenance
(:mod:`.maintenance`) never removes a segment a replay still has to read. A leaf
module: the instance's narrow views (:mod:`.host`) name it without depending on the
replay task.
"""

from __future__ import annotations

__all__ = ["ActiveReplays"]


class ActiveReplays:
    """The txid each running bookmark replay has read through: journal removal never
    deletes a record a replay still has to read."""

    def __init__(self) -> None:
        self._cursors: dict[int, int] = {}

    def reading(self, key: int, cursor: int) -> None:
        """Replay ``key`` has read through txid ``cursor`` (registers it when new)."""
        self._cursors[key] = cursor

    def ended(self, key: int) -> None:
        self._cursors.pop(key, None)

    def cursors(self) -> list[int]:
        """Where each running replay stands."""
        return list(self._cursors.values())

    def __len__(self) -> int:
        return len(self._cursors)
