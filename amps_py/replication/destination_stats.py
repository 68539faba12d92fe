"""What the admin API, the metrics and the stats file show of one outgoing
destination: :class:`DestinationStatistics`, and the per-second :class:`Rates` of its
counters.

Pure: no trio; the caller passes the time.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["DestinationStatistics", "Rates"]


@dataclass(frozen=True)
class DestinationStatistics:
    name: str
    remote_name: str
    group: str | None
    replication_type: str
    configured_sync_type: str
    is_connected: bool
    address: str
    messages_out: int
    bytes_out: int
    raw_bytes_out: int
    sent_txid: int
    acked_txid: int
    seconds_behind: float
    disconnect_count: int
    resyncs: int
    resync_records: int
    holes: int
    pass_through: tuple[str, ...]
    last_error: str
    downgrades: int = 0
    #: committed records routed to it that wait for its acknowledgement before their
    #: persisted acks (0 while it is async, or when nothing routed to it is unacked)
    acks_waiting: int = 0
    upgrades: int = 0
    upgrade_pending: bool = False
    #: the reconnect back-off wait in progress (seconds); 0 while connected or dialling
    reconnect_wait: float = 0.0
    #: while the destination is down (its connection lost, or its attempts failing):
    #: since when (UTC, ISO 8601), for how long (seconds), and how many attempts to
    #: connect failed since; "", 0 and 0 while it is connected or has not tried yet
    down_since: str = ""
    down_s: float = 0.0
    failed_attempts: int = 0
    #: the last replication hole (records a damaged journal could not send): which
    #: txids, why and the fix; "" when there was none
    last_hole: str = ""
    # AMPS's monitoring names (AMPS-NOTES 7.7)
    client_name: str = ""
    client_type: str = "destination"
    authenticated_id: str = ""
    destination_name: str = ""
    destination_group_name: str = ""
    connect_time: str = ""
    disconnect_time: str = ""
    messages_out_per_sec: float = 0.0
    bytes_out_per_sec: float = 0.0
    #: records of this journal a resync without a cursor did not send again, the peer
    #: being proven to hold them (the resync exchange); counted since the instance
    #: started
    resync_skipped: int = 0


class Rates:
    """Per-second rates of two counters, over at least the last second between reads
    (statistics are read by the admin API, the stats file and metrics scrapes)."""

    def __init__(self) -> None:
        self._at = 0.0
        self._counts = (0, 0)
        self._rates = (0.0, 0.0)

    def update(self, now: float, messages: int, nbytes: int) -> tuple[float, float]:
        elapsed = now - self._at
        if self._at and elapsed >= 1.0:
            self._rates = (
                round((messages - self._counts[0]) / elapsed, 1),
                round((nbytes - self._counts[1]) / elapsed, 1),
            )
        if not self._at or elapsed >= 1.0:
            self._at, self._counts = now, (messages, nbytes)
        return self._rates
