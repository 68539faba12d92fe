"""How many connections a transport keeps open at once (``Transport/MaxConnections``),
and how a refusal is reported.

:class:`ConnectionCap` counts a transport's open connections: an accepted connection
is admitted while fewer than the limit are open, else it is closed at once by the
listener. The first refusal is reported at once, then at most one line per
:data:`REPORT_INTERVAL` seconds carrying the refusals since the line before, so a
flood of connections cannot flood the log. A connection counts from its accept to its
close, whether it logged on (or completed a TLS or replication handshake) or not.

Pure bookkeeping: no trio, no sockets; the time is passed in.
"""

from __future__ import annotations

import math
from typing import Any, Final

from amps_py.config import TransportConfig

__all__ = ["REPORT_INTERVAL", "ConnectionCap"]

#: at most one refusal line per transport this often (seconds)
REPORT_INTERVAL: Final = 10.0


class ConnectionCap:
    """The open connections of one transport against its MaxConnections.

    Args:
        transport: the transport's config (its name, type and limit).
        interval: seconds between refusal lines at most.
    """

    def __init__(self, transport: TransportConfig, interval: float = REPORT_INTERVAL) -> None:
        self.transport = transport.name
        self.limit = transport.connection_limit
        self.configured = transport.max_connections is not None
        self.replication = transport.is_replication
        self.interval = interval
        self.open = 0
        self.peak = 0
        #: connections closed at once because the limit was reached
        self.refused = 0
        self._unreported = 0
        self._reported_at = -math.inf

    def admit(self) -> bool:
        """Whether a connection just accepted may stay (it then counts as open until
        :meth:`release`)."""
        if self.open >= self.limit:
            self.refused += 1
            self._unreported += 1
            return False
        self.open += 1
        if self.open > self.peak:
            self.peak = self.open
        return True

    def release(self) -> None:
        """An admitted connection closed."""
        self.open -= 1

    def report(self, now: float, peer: str) -> str | None:
        """The line to log for the refusal (of ``peer``) just counted, or None to stay
        quiet (a line went out less than ``interval`` seconds ago)."""
        if now - self._reported_at < self.interval:
            return None
        count, self._unreported, self._reported_at = self._unreported, 0, now
        default = (
            "100 for the replication transport"
            if self.replication
            else ("10k for client transports")
        )
        setting = (
            f"its MaxConnections of {self.limit}"
            if self.configured
            else f"its MaxConnections (default {self.limit})"
        )
        since = "so far" if self.refused == count else "since the last report"
        return (
            f"transport {self.transport} closed a connection from {peer} as soon as it was "
            f"accepted: {self.open} connections are open, {setting}; {count} refused "
            f"{since} ({self.refused} in all; reported at most every {self.interval:g} s). "
            f"Fix: raise <MaxConnections> of Transport {self.transport} (default "
            f"{default}) if this many are expected; else find what opens them "
            "(`amps-py admin clients` lists the connected clients and their addresses)"
        )

    def statistics(self) -> dict[str, Any]:
        """What the admin API and the statistics file show (``limits.connections``)."""
        return {
            "open": self.open,
            "limit": self.limit,
            "peak": self.peak,
            "refused": self.refused,
        }
