"""Why clients went: the recent disconnects and a count per reason.

A connection that ends is recorded with its close reason (``connection closed`` when
the client left, ``slow client``, ``logon timeout``, ``disconnected by admin``, ...)
and, where the server said more, the detail it sent the client (e.g. which slow-client
limit it passed). The admin API shows the newest :data:`KEEP` and the counts
(``/amps/instance/disconnects``), the metrics the counts
(``amps_client_disconnects_total{reason}``), and ``amps-py admin clients`` lists the
recent ones below the connected clients.

Pure bookkeeping: no trio; the time is passed in.
"""

from __future__ import annotations

from collections import deque
from dataclasses import asdict, dataclass
from typing import Any, Final

__all__ = ["KEEP", "Disconnect", "RecentDisconnects"]

#: how many recent disconnects are kept
KEEP: Final = 100


@dataclass(frozen=True)
class Disconnect:
    """One ended connection.

    Attributes:
        at: when it ended (seconds since the epoch).
        client_name: its client name ("" if it never logged on).
        connection: the connection id.
        remote_address: the client's address.
        transport: the transport it came in on.
        reason: the close reason.
        detail: what the server told the client about it ("" if nothing more).
    """

    at: float
    client_name: str
    connection: int
    remote_address: str
    transport: str
    reason: str
    detail: str = ""

    def entry(self) -> dict[str, Any]:
        return asdict(self)


class RecentDisconnects:
    """The newest ``keep`` disconnects, and how many there were per reason."""

    def __init__(self, keep: int = KEEP) -> None:
        self._recent: deque[Disconnect] = deque(maxlen=keep)
        #: close reason -> connections ended for it, since the instance started
        self.counts: dict[str, int] = {}

    def record(self, disconnect: Disconnect) -> None:
        self._recent.append(disconnect)
        self.counts[disconnect.reason] = self.counts.get(disconnect.reason, 0) + 1

    def recent(self) -> list[Disconnect]:
        """The kept disconnects, newest first."""
        return list(reversed(self._recent))

    def statistics(self) -> dict[str, Any]:
        """What the admin API shows: ``counts`` by reason and ``recent`` (newest first)."""
        return {
            "counts": dict(sorted(self.counts.items())),
            "recent": [d.entry() for d in self.recent()],
        }
