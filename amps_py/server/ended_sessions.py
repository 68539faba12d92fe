"""When a full garbage collection is due after sessions ended (pure: a count).

An ended session's tasks leave exceptions in reference cycles (trio's, with their
frames) that refer to the session; the server's tuned collector runs a full collection
only after some hundred million allocations, which a quiet instance whose clients come
and go (health checks, short-lived replays) may take days to reach. Collecting after
every :data:`COLLECT_EVERY_ENDED` ended sessions bounds what they keep (see
``Session._let_go`` in :mod:`.session`).
"""

from __future__ import annotations

from typing import Final

__all__ = ["COLLECT_EVERY_ENDED", "ENDED_SESSIONS", "EndedSessions"]

#: sessions that end between two full garbage collections
COLLECT_EVERY_ENDED: Final = 1000


class EndedSessions:
    """Counts ended sessions and says when a full garbage collection is due."""

    def __init__(self, every: int = COLLECT_EVERY_ENDED) -> None:
        self.every = every
        self.since_collection = 0

    def ended(self) -> bool:
        """A session ended: whether to collect now."""
        self.since_collection += 1
        if self.since_collection < self.every:
            return False
        self.since_collection = 0
        return True


#: the instance's ended sessions (one count per process: the collection is too)
ENDED_SESSIONS: Final = EndedSessions()
