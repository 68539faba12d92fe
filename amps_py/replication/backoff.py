"""When a destination dials its peer again (sans-IO: the caller passes the time).

A destination tries its ``InetAddr`` list in rounds. After a connection that had been
up for a while (:data:`STABLE_AFTER`) is lost, the next round starts at once and the
first failed rounds are followed by short waits (:data:`QUICK_RETRIES`), so a peer
that restarts or a connection cut by a blip is back within a second; after those the
configured ``ReconnectTimeout`` list applies, its last value repeating.

A connection that ends sooner after its handshake does not earn the quick retries
again: the back-off goes on growing, so a peer that accepts the link and then drops it
is not redialled in a tight loop.

The policy only decides *when*; the driver (:mod:`.outgoing`) sleeps, and may be woken
early when the peer connects to this instance.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from typing import Final

#: waits after the first failed rounds, before the configured back-off (seconds)
QUICK_RETRIES: Final[tuple[float, ...]] = (0.05, 0.1, 0.2)
#: a connection up at least this long (seconds) resets the back-off when it is lost
STABLE_AFTER: Final = 2.0


class ReconnectBackoff:
    """The reconnect schedule of one destination.

    Feed it what happened (:meth:`connected`, :meth:`lost`, :meth:`failed`, each with
    the current time); :meth:`delay` says how long to wait before the next round of
    attempts. A new policy attempts at once.

    Args:
        configured: the configured back-off (``ReconnectTimeout``): either the wait
            after configured round n (0-based) as a function, as
            :meth:`DestinationConfig.reconnect_delay` gives it, or the waits
            themselves (seconds, at least one; the last value repeats).
        quick: waits after the first failed rounds, before ``timeouts`` apply.
        stable_after: seconds a connection must have been up for its loss to start
            the schedule over.

    Raises:
        ValueError: the configured waits are empty, or a wait is negative.
    """

    def __init__(
        self,
        configured: Sequence[float] | Callable[[int], float],
        *,
        quick: Sequence[float] = QUICK_RETRIES,
        stable_after: float = STABLE_AFTER,
    ) -> None:
        if any(t < 0 for t in quick):
            raise ValueError("back-off waits must not be negative")
        if callable(configured):
            self._configured = configured
        else:
            timeouts = tuple(configured)
            if not timeouts:
                raise ValueError(
                    "the configured back-off needs at least one wait (ReconnectTimeout)"
                )
            if any(t < 0 for t in timeouts):
                raise ValueError("back-off waits must not be negative")
            self._configured = functools.partial(_nth_repeating_last, timeouts)
        self.quick = tuple(quick)
        self.stable_after = stable_after
        #: failed rounds since the schedule last started over
        self.failures = 0
        #: the wait chosen by the last failure (0 after a reset)
        self.wait = 0.0
        self._next_at = -math.inf
        self._up_since: float | None = None

    def wait_after(self, failures: int) -> float:
        """The wait after failed round number ``failures`` (0-based) of a schedule."""
        if failures < len(self.quick):
            return self.quick[failures]
        return self._configured(failures - len(self.quick))

    def connected(self, now: float) -> None:
        """A connection completed its handshake at ``now``."""
        self._up_since = now

    def lost(self, now: float) -> None:
        """The connection that :meth:`connected` reported ended at ``now``.

        After a stable one the next round is due at once and the schedule starts over;
        after a short one it counts as a failed round.
        """
        up_since, self._up_since = self._up_since, None
        if up_since is not None and now - up_since >= self.stable_after:
            self.failures = 0
            self.wait = 0.0
            self._next_at = now
        else:
            self.failed(now)

    def failed(self, now: float) -> None:
        """A round of attempts (every address) failed at ``now``: the next waits."""
        self.wait = self.wait_after(self.failures)
        self.failures += 1
        self._next_at = now + self.wait

    def delay(self, now: float) -> float:
        """Seconds from ``now`` until the next round is due (0: due now)."""
        return max(0.0, self._next_at - now)


def _nth_repeating_last(waits: tuple[float, ...], n: int) -> float:
    """``waits[n]``, the last one for any ``n`` beyond."""
    return waits[min(n, len(waits) - 1)]
