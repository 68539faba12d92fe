"""The simulator's trace: what happened, when, where (docs/SIMULATION.md).

A trace is a list of events ``(time, node, kind, detail)`` on trio's clock. Its
digest (BLAKE2b over the events as text) is what ``tools/sim.py --seed S --digest``
prints: the same seed must give the same digest, run after run.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import NamedTuple

__all__ = ["Event", "Trace"]


class Event(NamedTuple):
    """One thing that happened: ``time`` (seconds of virtual time), the ``node`` it
    happened on (``-`` for the network as a whole), its ``kind`` and a ``detail``."""

    time: float
    node: str
    kind: str
    detail: str

    def line(self) -> str:
        """The event as one line of text (what the digest covers)."""
        return f"{self.time:.6f} {self.node} {self.kind} {self.detail}"


@dataclass
class Trace:
    """The events of one schedule, in order, and their running digest."""

    events: list[Event] = field(default_factory=list)
    _hash: hashlib.blake2b = field(default_factory=lambda: hashlib.blake2b(digest_size=16))

    def record(self, time: float, node: str, kind: str, detail: str = "") -> None:
        event = Event(time, node, kind, detail)
        self.events.append(event)
        self._hash.update(event.line().encode() + b"\n")

    def digest(self) -> str:
        """Hex digest of every event recorded so far."""
        return self._hash.hexdigest()

    def tail(self, count: int = 40) -> list[str]:
        """The last ``count`` events as lines (for a failure report)."""
        return [event.line() for event in self.events[-count:]]
