"""When an unreachable destination is logged (the pure OutageLog, time passed in)."""

from __future__ import annotations

import pytest

from amps_py.replication.outage import REPORT_INTERVALS, OutageLog

REFUSED = "connect to 127.0.0.1:9999: Connection refused"


def fail_every(log: OutageLog, start: float, end: float, step: float, *errors: str) -> list[float]:
    """Fail an attempt every ``step`` seconds in [start, end), with ``errors`` in turn;
    the times that reported."""
    reported = []
    t, n = start, 0
    while t < end:
        if log.failed(t, errors[n % len(errors)]) is not None:
            reported.append(t)
        t, n = round(t + step, 6), n + 1
    return reported


def test_first_failure_then_growing_intervals_with_counts() -> None:
    log = OutageLog()
    first = log.failed(100.0, REFUSED)
    assert first is not None and first.first and first.new_error
    assert (first.attempts, first.total_attempts, first.down_for) == (1, 1, 0.0)
    assert log.down_since == 100.0
    # one attempt a second for an hour: reported at 10 s, then 30, 60, 120, 300, 600 later
    reported = fail_every(log, 101.0, 100.0 + 3600, 1.0, REFUSED)
    gaps = [b - a for a, b in zip([100.0, *reported], reported, strict=False)]
    assert gaps[:6] == list(REPORT_INTERVALS)
    assert all(g == REPORT_INTERVALS[-1] for g in gaps[6:]), gaps
    assert len(reported) == 6 + (3600 - sum(REPORT_INTERVALS)) // 600
    # a report counts the attempts since the one before, and in all
    log2 = OutageLog()
    log2.failed(0.0, REFUSED)
    assert fail_every(log2, 0.5, 10.0, 0.5, REFUSED) == []
    report = log2.failed(10.0, REFUSED)
    assert report is not None and not report.first and not report.new_error
    assert (report.attempts, report.total_attempts, report.down_for) == (20, 21, 10.0)


def test_a_new_error_is_reported_at_once_but_alternating_errors_are_not_repeated() -> None:
    log = OutageLog()
    assert log.failed(0.0, REFUSED) is not None
    refused_by_peer = "refused by the peer: validation failed (check txlog failed)"
    changed = log.failed(1.0, refused_by_peer)
    assert changed is not None and changed.new_error and not changed.first
    assert changed.attempts == 1
    # two InetAddrs failing in turn: each error once, then only the scheduled reports
    assert fail_every(log, 2.0, 10.9, 0.5, REFUSED, refused_by_peer) == []
    assert log.failed(11.0, refused_by_peer) is not None  # 10 s after the last report
    assert log.last_error == refused_by_peer


def test_recovery_says_how_long_and_how_many_attempts_only_after_a_report() -> None:
    log = OutageLog()
    log.lost(50.0)  # the connection dropped: down from then, nothing to report yet
    assert log.is_down and log.down_since == 50.0 and log.attempts == 0
    assert log.recovered(50.1) is None  # mended by the first reconnect: no line
    assert not log.is_down
    log.lost(60.0)
    log.failed(60.2, REFUSED)
    log.failed(61.2, REFUSED)
    recovery = log.recovered(75.0)
    assert recovery is not None
    assert (recovery.total_attempts, recovery.down_for) == (2, 15.0)
    assert (log.down_since, log.attempts, log.last_error) == (None, 0, "")
    # the next outage starts over: its first failure is reported at once
    again = log.failed(80.0, REFUSED)
    assert again is not None and again.first and again.down_for == 0.0


def test_intervals_are_checked() -> None:
    with pytest.raises(ValueError, match="at least one positive wait"):
        OutageLog(())
    with pytest.raises(ValueError, match="at least one positive wait"):
        OutageLog((10.0, 0.0))
