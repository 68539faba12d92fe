"""Memory held by replication connections that have not completed their handshake.

A connection to the replication port is a stranger until its hello has passed every
check: it may send at most :data:`~.link.MAX_HANDSHAKE_FRAME` bytes per frame, read
:data:`HANDSHAKE_READ` bytes at a time, and all such connections together may buffer
at most :data:`MAX_HANDSHAKE_MEMORY` bytes (:class:`PreHelloMemory`): past it, the
connection holding the most goes (it is refused, the log names it), so many slow
strangers cannot make the instance hold more than that. With the transport's
MaxConnections and the hello deadline (:data:`~.incoming.HELLO_TIMEOUT`) this bounds
what the port can be made to hold, and for how long.

When such connections close, their buffers are freed and, once at least
:data:`TRIM_AFTER` bytes were freed (at most once per :data:`TRIM_INTERVAL`, and when
the last of them has gone), the C allocator is asked to return free memory to the
system (:func:`return_free_memory`):
the buffers of hundreds of connections, freed among the allocations that live on,
otherwise stay in the process as free but unreturned heap.

Pure bookkeeping, no trio: the time is passed in.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import math
from collections.abc import Callable, Hashable
from typing import Any, Final

#: all connections before their handshake together buffer at most this many bytes
MAX_HANDSHAKE_MEMORY: Final = 4 * 1024 * 1024
#: bytes read from a socket at a time before the handshake
HANDSHAKE_READ: Final = 16 * 1024
#: free memory is handed back once this many pre-hello bytes were released
TRIM_AFTER: Final = 1024 * 1024
#: ... and at most this often (seconds)
TRIM_INTERVAL: Final = 1.0


def _malloc_trim() -> Callable[[int], int] | None:
    """glibc's ``malloc_trim``, or None on a C library without it."""
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    try:
        trim: Callable[[int], int] = ctypes.CDLL(name).malloc_trim
    except (OSError, AttributeError):
        return None
    return trim


_TRIM = _malloc_trim()


def return_free_memory() -> bool:
    """Ask the C allocator to give free heap pages back to the system (glibc's
    ``malloc_trim(0)``); False where the C library has no such call."""
    if _TRIM is None:
        return False
    _TRIM(0)
    return True


class PreHelloMemory:
    """The bytes buffered by connections before their handshake, against one limit.

    Each connection reports what its decoder holds (:meth:`hold`) and leaves when its
    handshake completes or it closes (:meth:`release`). When the total is over the
    limit, :meth:`hold` names the connections to close: the biggest first, until the
    rest fit.

    Args:
        limit: bytes all connections together may hold.
        trim: called to return freed memory to the system (:func:`return_free_memory`).
    """

    def __init__(
        self, limit: int = MAX_HANDSHAKE_MEMORY, trim: Callable[[], object] = return_free_memory
    ) -> None:
        self.limit = limit
        self.total = 0
        self.peak = 0
        #: connections closed because the total was over the limit
        self.closed_over_limit = 0
        #: times freed memory was handed back to the system
        self.trims = 0
        self._held: dict[Hashable, int] = {}
        self._freed = 0
        self._trimmed_at = -math.inf
        self._trim = trim

    @property
    def connections(self) -> int:
        """Connections holding bytes before their handshake now."""
        return len(self._held)

    def hold(self, holder: Hashable, held: int) -> list[tuple[Hashable, int]]:
        """``holder`` now buffers ``held`` bytes; returns the (holder, bytes) to close,
        biggest first, when that takes the total over the limit (they are released
        here; their bytes no longer count)."""
        self.total += held - self._held.get(holder, 0)
        self._held[holder] = held
        if self.total > self.peak:
            self.peak = self.total
        gone: list[tuple[Hashable, int]] = []
        if self.total > self.limit:
            for victim, size in sorted(self._held.items(), key=lambda item: -item[1]):
                if self.total <= self.limit or size <= 0:
                    break
                gone.append((victim, size))
                self.total -= size
                self._freed += size
                del self._held[victim]
                self.closed_over_limit += 1
        return gone

    def release(self, holder: Hashable, now: float) -> None:
        """``holder`` completed its handshake or closed, freeing its buffer; hands
        freed memory back to the system when enough was freed since the last time
        (see the module doc)."""
        held = self._held.pop(holder, 0)
        self.total -= held
        self._freed += held
        if self._freed >= TRIM_AFTER and (
            now - self._trimmed_at >= TRIM_INTERVAL or not self._held
        ):
            self._freed = 0
            self._trimmed_at = now
            self.trims += 1
            self._trim()

    def statistics(self) -> dict[str, Any]:
        """What the admin API and the statistics file show
        (``limits.replication_handshakes``)."""
        from .link import MAX_HANDSHAKE_FRAME

        return {
            "connections": self.connections,
            "bytes": self.total,
            "limit_bytes": self.limit,
            "peak_bytes": self.peak,
            "frame_limit_bytes": MAX_HANDSHAKE_FRAME,
            "closed_over_limit": self.closed_over_limit,
            "memory_returned": self.trims,
        }
