"""A client connection's heartbeat timing, pure: intervals and ``now`` in, decisions out.

A client starts heartbeats with ``heartbeat`` and option ``start,<seconds>``
(:func:`~amps_py.protocol.server.commands.heartbeat_start`). From then on the server
sends a beat every interval; after each beat it checks how long the client has been
silent: more than :data:`HEARTBEAT_GRACE_INTERVALS` intervals without a byte from it
and the connection is closed (reason ``heartbeat``). A later ``heartbeat start`` changes
the interval from the next beat on. No clock is read here: the caller passes ``now``
(on the clock of its reads).
"""

from __future__ import annotations

from typing import Final, NamedTuple

from ..messages import HEARTBEAT

__all__ = ["HEARTBEAT_GRACE_INTERVALS", "HeartbeatClock", "HeartbeatTick"]

#: a heartbeating client silent for more than this many intervals is disconnected
#: (two intervals plus one more: AMPS clients answer our beat when it arrives, so a
#: reply can trail it)
HEARTBEAT_GRACE_INTERVALS: Final = 3


class HeartbeatTick(NamedTuple):
    """What a beat that came due says."""

    #: the bytes to send (the heartbeat frame)
    beat: bytes
    #: seconds the client has been silent, when that is past the grace (close it); None
    #: while it is alive
    silent: float | None
    #: the interval the beat was timed with
    interval: float


class HeartbeatClock:
    """When the next beat is due and whether the client has gone silent.

    Attributes:
        interval: the interval the client asked for (0: no heartbeats).
        due: when the next beat is due (meaningful once :attr:`interval` is not 0).
        last_receive: when the client last sent a byte (the caller's clock).
    """

    __slots__ = ("_timed_with", "due", "interval", "last_receive")

    def __init__(self, now: float) -> None:
        self.interval = 0.0
        self.due = 0.0
        self.last_receive = now
        self._timed_with = 0.0

    def start(self, interval: float, now: float) -> bool:
        """The client asked for beats every ``interval`` seconds: whether this is the
        first such request (the caller then starts its beat timer, first due at
        ``now + interval``)."""
        first = self.interval == 0
        self.interval = interval
        if first:
            self._timed_with = interval
            self.due = now + interval
        return first

    def tick(self, now: float) -> HeartbeatTick:
        """The beat due at :attr:`due` is sent now: the beat, whether the client is
        silent past the grace, and the next due time (timed with the current
        interval)."""
        interval = self._timed_with
        silent = now - self.last_receive
        self._timed_with = self.interval
        self.due = now + self.interval
        expired = silent if silent > HEARTBEAT_GRACE_INTERVALS * interval else None
        return HeartbeatTick(HEARTBEAT, expired, interval)
