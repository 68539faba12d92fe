"""Memory held by replication connections that have not completed their handshake.

A connection to the replication port is a stranger until its hello has passed every
check: it may send at most :data:`~.link.MAX_HANDSHAKE_FRAME` bytes per frame, read
:data:`HANDSHAKE_READ` bytes at a time, and all such connections together may buffer
at most :data:`MAX_HANDSHAKE_MEMORY` bytes (:class:`PreHelloMemory`): past it, the
connection holding the most goes (it is refused, the log names it), so many slow
strangers cannot make the instance hold more than that. With the transport's
MaxConnections and the hello deadline (:data:`~.incoming.HELLO_TIMEOUT`) this bounds
what the port can be made to hold, and for how long.

When such connections close, their buffers are freed. What an ended connection's
task leaves in reference cycles (its exceptions, their frames and the buffers those
refer to) is freed only by a full garbage collection, which the server runs rarely
(``cli.serve.tune_garbage_collector``); and the buffers of hundreds of connections, freed
among allocations that live on, stay in the process as free but unreturned heap. So
once at least :data:`TRIM_AFTER` bytes were freed, or :data:`COLLECT_AFTER_ENDED`
connections ended before their handshake completed, the next :meth:`PreHelloMemory.tick`
(every :data:`TRIM_INTERVAL`) collects garbage and asks the C allocator to return free
memory to the system (:func:`return_free_memory`).

Bookkeeping, no trio: the replication manager calls :meth:`PreHelloMemory.tick`.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
from collections.abc import Callable, Hashable
from typing import Any, Final

#: all connections before their handshake together buffer at most this many bytes
MAX_HANDSHAKE_MEMORY: Final = 4 * 1024 * 1024
#: bytes read from a socket at a time before the handshake
HANDSHAKE_READ: Final = 16 * 1024
#: free memory is handed back once this many pre-hello bytes were released
TRIM_AFTER: Final = 1024 * 1024
#: ... or once this many connections ended before completing their handshake
COLLECT_AFTER_ENDED: Final = 100
#: how often :meth:`PreHelloMemory.tick` runs (seconds): at most one collection per tick
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
    """Collect garbage (a full collection: ended tasks leave reference cycles), then ask
    the C allocator to give free heap pages back to the system (glibc's
    ``malloc_trim(0)``); False where the C library has no such call."""
    gc.collect()
    if _TRIM is None:
        return False
    _TRIM(0)
    return True


class PreHelloMemory:
    """The bytes buffered by connections before their handshake, against one limit.

    Each connection reports what its decoder holds (:meth:`hold`) and leaves when its
    handshake completes or it closes (:meth:`release`). When the total is over the
    limit, :meth:`hold` names the connections to close: the biggest first, until the
    rest fit. :meth:`tick`, called every :data:`TRIM_INTERVAL`, hands freed memory back
    to the system when enough was freed or enough connections ended (module doc).

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
        #: connections that ended before completing their handshake
        self.ended = 0
        #: times freed memory was handed back to the system
        self.trims = 0
        self._held: dict[Hashable, int] = {}
        self._freed = 0
        self._ended_since = 0
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

    def release(self, holder: Hashable, *, ended: bool) -> None:
        """``holder`` completed its handshake (``ended`` False) or closed before it
        did (``ended`` True): its buffer is freed."""
        held = self._held.pop(holder, 0)
        self.total -= held
        self._freed += held
        if ended:
            self.ended += 1
            self._ended_since += 1

    def tick(self) -> bool:
        """Hand freed memory back to the system if at least :data:`TRIM_AFTER` bytes
        were freed or :data:`COLLECT_AFTER_ENDED` connections ended since the last
        time; whether it did."""
        if self._freed < TRIM_AFTER and self._ended_since < COLLECT_AFTER_ENDED:
            return False
        self._freed = self._ended_since = 0
        self.trims += 1
        self._trim()
        return True

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
            "ended_before_handshake": self.ended,
            "memory_returned": self.trims,
        }
