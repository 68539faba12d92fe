"""What to log while a destination cannot be reached (sans-IO: the caller passes the time).

A destination that cannot connect retries on its back-off schedule
(:mod:`.backoff`), which ends in one attempt every few seconds for as long as the peer
stays away: hours, for a peer that is down for maintenance. Logging every attempt
would bury the log, logging none would hide the outage. :class:`OutageLog` decides:

- the first failed attempt of an outage is reported at once;
- an error not seen before in this outage (the peer came back but refuses the link,
  the certificate changed) is reported at once;
- otherwise the outage is reported again after :data:`REPORT_INTERVALS` (growing, the
  last repeating), each report counting the attempts since the one before;
- when the destination connects again, :meth:`OutageLog.recovered` says how long it
  was down and how many attempts failed.

It also keeps what the admin API shows of a destination that is down: since when,
how many attempts failed, the last error; and it words the log lines
(:func:`outage_line`, :func:`duration`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

from amps_py.units import utc_iso

#: waits (seconds) between reports of an outage after the first; the last repeats
REPORT_INTERVALS: Final[tuple[float, ...]] = (10.0, 30.0, 60.0, 120.0, 300.0, 600.0)
#: distinct errors of one outage remembered (each is reported at once the first time);
#: past this, new errors wait for the next scheduled report
MAX_DISTINCT_ERRORS: Final = 16


@dataclass(frozen=True)
class OutageReport:
    """One log line about a destination that is down.

    Attributes:
        first: the first report of this outage.
        attempts: failed attempts since the previous report (this one included).
        total_attempts: failed attempts since the destination went down.
        down_for: seconds since it went down.
        error: the error of the attempt that triggered this report.
        new_error: the error had not been reported in this outage before.
    """

    first: bool
    attempts: int
    total_attempts: int
    down_for: float
    error: str
    new_error: bool


@dataclass(frozen=True)
class Recovery:
    """A destination that had been reported down connected again."""

    total_attempts: int
    down_for: float


class OutageLog:
    """The outage of one destination, if any, and when to report it.

    Feed it what happened, each with the current time on one clock (the caller's
    choice; :attr:`down_since` is on that clock): :meth:`lost` (a connection that had
    completed its handshake ended), :meth:`failed` (an attempt failed),
    :meth:`recovered` (a connection completed its handshake).

    Args:
        intervals: waits between reports after the first, seconds, at least one; the
            last repeats.

    Raises:
        ValueError: ``intervals`` is empty or holds a wait that is not positive.
    """

    def __init__(self, intervals: Sequence[float] = REPORT_INTERVALS) -> None:
        if not intervals or any(i <= 0 for i in intervals):
            raise ValueError("`intervals` needs at least one positive wait")
        self.intervals = tuple(intervals)
        #: when the destination went down (lost its connection, or first failed to
        #: connect); None while it is up or has not tried yet
        self.down_since: float | None = None
        #: failed attempts since it went down
        self.attempts = 0
        #: the error of the last failed attempt of this outage
        self.last_error = ""
        self._reported_at: float | None = None
        self._unreported = 0
        self._scheduled = 0
        self._errors: set[str] = set()

    @property
    def is_down(self) -> bool:
        return self.down_since is not None

    def lost(self, now: float) -> None:
        """A connection that had completed its handshake ended at ``now``: the
        destination is down from now (nothing to report yet: the first failed attempt
        to reconnect is)."""
        self._reset()
        self.down_since = now

    def failed(self, now: float, error: str) -> OutageReport | None:
        """An attempt to connect failed at ``now`` with ``error``; returns the report
        to log now, or None to stay quiet."""
        if self.down_since is None:
            self.down_since = now
        self.attempts += 1
        self._unreported += 1
        self.last_error = error
        first = self._reported_at is None
        new_error = error not in self._errors and len(self._errors) < MAX_DISTINCT_ERRORS
        due = first or new_error
        if not due:
            assert self._reported_at is not None
            wait = self.intervals[min(self._scheduled, len(self.intervals) - 1)]
            due = now - self._reported_at >= wait
            if due:
                self._scheduled += 1
        if not due:
            return None
        if new_error:
            self._errors.add(error)
        report = OutageReport(
            first=first,
            attempts=self._unreported,
            total_attempts=self.attempts,
            down_for=max(0.0, now - self.down_since),
            error=error,
            new_error=new_error,
        )
        self._reported_at = now
        self._unreported = 0
        return report

    def recovered(self, now: float) -> Recovery | None:
        """A connection completed its handshake at ``now``: the outage is over.
        Returns how it went when it had been reported (else None: a blip that the
        first reconnect attempt mended is not worth a line)."""
        recovery = None
        if self._reported_at is not None and self.down_since is not None:
            recovery = Recovery(self.attempts, max(0.0, now - self.down_since))
        self._reset()
        return recovery

    def _reset(self) -> None:
        self.down_since = None
        self.attempts = 0
        self.last_error = ""
        self._reported_at = None
        self._unreported = 0
        self._scheduled = 0
        self._errors.clear()


def duration(seconds: float) -> str:
    """``45s``, ``2m05s``, ``3h10m``: how long an outage lasted, for a log line."""
    s = int(seconds)
    if s < 60:
        return f"{seconds:.1f}s" if seconds < 10 else f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"


def outage_line(
    name: str,
    address: str,
    report: OutageReport,
    down_since: float | None,
    *,
    sync: bool,
    waiting: int = 0,
    grace: float | None = None,
) -> str:
    """The log line of one :class:`OutageReport` of destination ``name`` (at
    ``address``), down since ``down_since`` (epoch seconds). A ``sync`` destination's
    line says whether persisted acks wait for it: they do for the ``waiting`` committed
    messages routed to it that it has not acknowledged, and will for the next ones
    routed to it. ``grace``: the destination has not connected since the instance
    started, and is reported as a warning only after that many seconds (the first line
    says so)."""
    acks = ""
    if sync and waiting:
        acks = (
            f"; persisted acks wait for it (sync destination, {waiting} message"
            f"{'s' if waiting != 1 else ''} routed to it not acknowledged)"
        )
    elif sync:
        acks = "; persisted acks of messages routed to it will wait for it (sync destination)"
    if report.first and grace is not None:
        return (
            f"replication to {name} ({address}) is not up yet: {report.error} (the peer "
            f"may still be starting){acks}; retrying on the ReconnectTimeout back-off, "
            f"logged as a warning if it is still down {grace:g} s after this first attempt"
        )
    if report.first:
        return (
            f"replication to {name} ({address}) failed: {report.error}{acks}; "
            "retrying on the ReconnectTimeout back-off, and logging again at growing "
            "intervals while it fails"
        )
    since = utc_iso(down_since or 0.0)
    head = f"replication to {name} still down since {since} ({duration(report.down_for)})"
    counts = (
        f"{report.attempts} failed attempt{'s' if report.attempts != 1 else ''} since the "
        f"last report, {report.total_attempts} in all"
    )
    if report.new_error:
        return f"{head}, {counts}; now failing with: {report.error}{acks}"
    return f"{head}, {counts}; last error: {report.error}{acks}"
