"""Memory and time limits on client connections: the bookkeeping and the decisions.

Two instance-wide byte pools and two per-connection deadlines keep one client (or many
hostile ones) from holding the instance's memory or sockets:

* ``MessageMemoryLimit``: bytes waiting to be sent to all clients together. A client
  past its own ``ClientMaxCapacity``, or the client with the most waiting bytes when
  the pool is over its limit, is disconnected as a slow client.
* ``IncompleteMessageMemoryLimit``: bytes of frames received in part, over all client
  connections. When it is over, the connection holding the largest partial frame is
  closed (see :func:`biggest`).
* ``LogonTimeout`` and ``IncompleteMessageTimeout`` (per transport): a connection
  must log on, and must finish a frame once its first byte arrived, in time
  (:func:`read_deadline`).

Pure logic: no trio, no sockets; the current time is passed in. The session
(:mod:`amps_py.server.session`) does the reading, writing and closing.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Final, TypeVar

from amps_py.protocol import PartialFrame

__all__ = [
    "CLOSE_FLUSH_TIMEOUT",
    "BytePool",
    "InstanceLimits",
    "ReadDeadline",
    "biggest",
    "read_deadline",
]

#: How long a connection being closed by the server may take to write what it still
#: sends (a failure ack, the ``slow client`` notice) before its socket is closed anyway.
CLOSE_FLUSH_TIMEOUT: Final = 1.0

T = TypeVar("T")


@dataclass
class BytePool:
    """Bytes held by many connections against one limit.

    Holders add and release their own bytes (``total`` is a plain int so the hot path
    can update it inline); the pool is over when ``total > limit``.

    Attributes:
        setting: the config element that sets ``limit``, for log lines.
        limit: bytes.
        total: bytes held now.
        peak: the highest ``total`` so far (holders update it when they add bytes).
    """

    setting: str
    limit: int
    total: int = 0
    peak: int = 0

    @property
    def over(self) -> bool:
        return self.total > self.limit

    def note_peak(self) -> None:
        if self.total > self.peak:
            self.peak = self.total

    def statistics(self) -> dict[str, Any]:
        return {"bytes": self.total, "limit_bytes": self.limit, "peak_bytes": self.peak}


def biggest(holders: Iterable[tuple[T, int]]) -> tuple[T, int] | None:
    """The holder with the most bytes (the first of equals), or None if none holds any.

    This is who goes when a pool is over its limit: one decision that frees the most
    memory, and never a small holder while a bigger one stays.
    """
    best: tuple[T, int] | None = None
    for holder, held in holders:
        if held > 0 and (best is None or held > best[1]):
            best = (holder, held)
    return best


@dataclass(frozen=True)
class ReadDeadline:
    """When a connection's next read must have ended what it is waiting for.

    ``kind`` is ``"logon"`` (no logon yet) or ``"frame"`` (a frame is unfinished).
    """

    at: float
    kind: str


def read_deadline(
    *,
    logon_deadline: float | None,
    partial: PartialFrame | None,
    frame_timeout: float,
) -> ReadDeadline | None:
    """The earliest deadline that applies to a connection now, or None.

    Args:
        logon_deadline: when the connection must have logged on, or None once it has.
        partial: the frame its decoder holds in part (``since`` on the same clock),
            or None.
        frame_timeout: seconds a frame may take from its first byte.
    """
    found: ReadDeadline | None = None
    if logon_deadline is not None:
        found = ReadDeadline(logon_deadline, "logon")
    if partial is not None:
        at = partial.since + frame_timeout
        if found is None or at < found.at:
            found = ReadDeadline(at, "frame")
    return found


class InstanceLimits:
    """The instance's two byte pools and the counts of connections they closed.

    Args:
        message_memory_limit: MessageMemoryLimit in bytes (waiting to be sent).
        incomplete_limit: IncompleteMessageMemoryLimit in bytes (partial frames).
    """

    def __init__(self, message_memory_limit: int, incomplete_limit: int) -> None:
        self.queued = BytePool("MessageMemoryLimit", message_memory_limit)
        self.incomplete = BytePool("IncompleteMessageMemoryLimit", incomplete_limit)
        #: clients disconnected because they passed their own ClientMaxCapacity
        self.slow_client_capacity = 0
        #: clients disconnected because the MessageMemoryLimit pool was over
        self.slow_client_pool = 0
        #: connections closed because a frame was not finished in time
        self.incomplete_timeouts = 0
        #: connections closed because they did not log on in time
        self.logon_timeouts = 0
        #: connections closed because the IncompleteMessageMemoryLimit pool was over
        self.incomplete_pool = 0

    def statistics(self) -> dict[str, Any]:
        """What the admin API shows (``/amps/instance/limits``)."""
        return {
            "queued": {
                **self.queued.statistics(),
                "slow_client_disconnects": {
                    "client_max_capacity": self.slow_client_capacity,
                    "message_memory_limit": self.slow_client_pool,
                },
            },
            "incomplete_messages": {
                **self.incomplete.statistics(),
                "closed_over_limit": self.incomplete_pool,
                "closed_timeout": self.incomplete_timeouts,
            },
            "logon_timeouts": self.logon_timeouts,
        }
