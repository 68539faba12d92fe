"""The back-off after failed logons and the rate limit of their log lines: the pure
rules of amps_py/auth_backoff.py, driven by a fake clock (plain numbers for ``now``)."""

from __future__ import annotations

import random

import pytest

from amps_py.auth_backoff import (
    FIRST_BACKOFF,
    MAX_BACKOFF,
    THRESHOLD,
    FailureLog,
    FailureTracker,
    RecentWrong,
    address_of,
    shown_user,
)

SEED = 2511


def fail_times(tracker: FailureTracker, n: int, user: str, address: str, now: float) -> None:
    for _ in range(n):
        assert tracker.check(user, address, now) is None
        tracker.failed(user, address, now)


def test_threshold_failures_back_off_the_user_and_the_address() -> None:
    tracker = FailureTracker()
    fail_times(tracker, THRESHOLD - 1, "alice", "10.0.0.1", 100.0)
    assert tracker.check("alice", "10.0.0.1", 100.0) is None
    started = tracker.failed("alice", "10.0.0.1", 100.0)
    assert {(s.kind, s.key, s.seconds) for s in started} == {
        ("address", "10.0.0.1", FIRST_BACKOFF),
        ("user", "alice", FIRST_BACKOFF),
    }
    refused = tracker.check("alice", "10.0.0.1", 100.5)
    assert refused is not None and refused.retry_in == pytest.approx(FIRST_BACKOFF - 0.5)
    assert "too many failed logons" in refused.words() and "retry in 1 s" in refused.words()
    # the user from elsewhere, and anyone from the address, are refused too
    assert tracker.check("alice", "10.0.0.2", 100.5) is not None
    assert tracker.check("bob", "10.0.0.1", 100.5) is not None
    # another user from another address is not
    assert tracker.check("bob", "10.0.0.2", 100.5) is None
    # when the back-off ends, attempts are checked again
    assert tracker.check("alice", "10.0.0.1", 100.0 + FIRST_BACKOFF) is None


def test_each_failure_after_a_back_off_doubles_it_up_to_the_cap() -> None:
    tracker = FailureTracker()
    now = 0.0
    fail_times(tracker, THRESHOLD, "u", "a", now)
    seen = []
    for _ in range(10):
        refused = tracker.check("u", "a", now)
        assert refused is not None
        now = refused.until  # the first moment it is let through
        assert tracker.check("u", "a", now) is None
        started = tracker.failed("u", "a", now)
        seen.append(max(s.seconds for s in started))
    assert seen[:5] == [2 * FIRST_BACKOFF, 4 * FIRST_BACKOFF, 8.0, 16.0, MAX_BACKOFF]
    assert set(seen[5:]) == {MAX_BACKOFF}


def test_failures_spread_beyond_the_window_do_not_back_off() -> None:
    tracker = FailureTracker(window=60.0)
    for i in range(3 * THRESHOLD):
        now = i * 20.0  # at most 3 failures in any 60 s window, never THRESHOLD
        assert tracker.check("u", "a", now) is None
        assert tracker.failed("u", "a", now) == []


def test_a_success_resets_the_user_and_the_address() -> None:
    tracker = FailureTracker()
    fail_times(tracker, THRESHOLD, "u", "a", 0.0)
    assert tracker.check("u", "a", 1.0) is None  # back-off over
    tracker.succeeded("u", "a")
    assert len(tracker) == 0
    # a fresh start: THRESHOLD - 1 more failures start nothing
    fail_times(tracker, THRESHOLD - 1, "u", "a", 2.0)
    assert tracker.check("u", "a", 2.0) is None


def test_records_are_forgotten_and_bounded() -> None:
    rng = random.Random(SEED)
    print(f"seed {SEED}")
    tracker = FailureTracker(max_entries=50, forget_after=100.0)
    for i in range(1000):
        user = f"user-{rng.randrange(10**9)}"
        tracker.failed(user, f"10.{i % 256}.{i // 256}.1", float(i))
        assert len(tracker) <= 100
    # one whose record is older than forget_after starts over
    fail_times(tracker, THRESHOLD, "old", "1.1.1.1", 2000.0)
    assert tracker.check("old", "1.1.1.1", 2000.5) is not None
    started = tracker.failed("old", "1.1.1.1", 2000.0 + 1000.0)
    assert started == []  # forgotten: the first failure of a new record


def test_long_user_names_share_one_bounded_key() -> None:
    tracker = FailureTracker()
    long_name = "x" * 100_000
    fail_times(tracker, THRESHOLD, long_name, "a", 0.0)
    refused = tracker.check(long_name + "y", "b", 0.5)
    assert refused is not None and refused.kind == "user"
    words = refused.words()
    assert "(cut," in words and len(words) < 300


def test_an_empty_user_counts_against_the_address_only() -> None:
    tracker = FailureTracker()
    fail_times(tracker, THRESHOLD, "", "a", 0.0)
    assert tracker.check("anyone", "a", 0.5) is not None
    assert tracker.check("", "b", 0.5) is None


def test_recent_wrong_remembers_bounded_and_expires() -> None:
    wrong = RecentWrong(max_entries=3, keep=10.0)
    assert not wrong.seen(b"a", 0.0)
    wrong.add(b"a", 0.0)
    assert wrong.seen(b"a", 5.0)
    assert wrong.seen(b"a", 14.0)  # refreshed at 5.0
    assert not wrong.seen(b"a", 30.0)  # expired
    for key in (b"1", b"2", b"3", b"4"):
        wrong.add(key, 40.0)
    assert len(wrong) == 3 and not wrong.seen(b"1", 40.0)


def test_the_log_gives_a_few_lines_per_address_then_one_summary() -> None:
    log = FailureLog(lines_per_window=5, window=10.0)
    logged = [log.note("10.0.0.1", 100.0 + i * 0.01) for i in range(200)]
    assert logged.count(True) == 5 and logged[:5] == [True] * 5
    assert log.note("10.0.0.2", 101.0)  # another address has its own lines
    assert log.next_due() == pytest.approx(110.0)
    assert log.due(109.9) == []
    summaries = log.due(110.0)
    assert [(s.address, s.count) for s in summaries] == [("10.0.0.1", 195)]
    assert summaries[0].words() == "195 more failed logons from 10.0.0.1 in the last 10 s"
    assert log.due(111.0) == []  # 10.0.0.2's window: nothing unlogged, no summary
    assert log.next_due() is None
    # a new window: lines of their own again
    assert log.note("10.0.0.1", 120.0)


def test_the_log_is_bounded_in_addresses() -> None:
    log = FailureLog(lines_per_window=1, window=10.0, max_addresses=3)
    for i in range(100):
        log.note(f"10.0.0.{i}", 0.0)
    summaries = log.due(10.0)
    assert [(s.address, s.count) for s in summaries] == [("other addresses", 97)]


@pytest.mark.parametrize(
    ("peer", "address"),
    [
        ("127.0.0.1:5000", "127.0.0.1"),
        ("::1:5000", "::1"),
        ("[::1]:5000", "::1"),
        ("?", "?"),
    ],
)
def test_address_of_drops_the_port(peer: str, address: str) -> None:
    assert address_of(peer) == address


def test_shown_user_cuts_and_says_so() -> None:
    assert shown_user("alice") == "'alice'"
    assert shown_user("") == "(none given)"
    shown = shown_user("é" * 1000)
    assert shown.endswith("(cut, 1000 characters)") and shown.count("é") == 64


def test_checks_in_flight_count_as_failures_to_come() -> None:
    tracker = FailureTracker()
    for _ in range(THRESHOLD):
        assert tracker.may_start("u", "a", 0.0)
        tracker.started("u", "a")
    # as many in flight as failures would back it off: the next one waits
    assert not tracker.may_start("u", "a", 0.0)
    assert not tracker.may_start("other", "a", 0.0)  # the address is full
    assert not tracker.may_start("u", "b", 0.0)  # and so is the user
    assert tracker.may_start("other", "b", 0.0)
    for _ in range(THRESHOLD):
        tracker.failed("u", "a", 0.1)
        tracker.finished("u", "a")
    # they all failed: the waiting one is refused without a check
    assert tracker.check("u", "a", 0.2) is not None
    # after a back-off ended, one check at a time
    assert tracker.check("u", "a", 5.0) is None
    assert tracker.may_start("u", "a", 5.0)
    tracker.started("u", "a")
    assert not tracker.may_start("u", "a", 5.0)
    tracker.succeeded("u", "a")
    tracker.finished("u", "a")
    assert tracker.may_start("u", "a", 5.0)


def test_a_failure_in_flight_leaves_room_for_the_rest_of_the_window() -> None:
    tracker = FailureTracker()
    fail_times(tracker, THRESHOLD - 2, "u", "a", 0.0)
    tracker.started("u", "a")
    assert tracker.may_start("u", "a", 1.0)
    tracker.started("u", "a")
    assert not tracker.may_start("u", "a", 1.0)
    # once the window has passed, earlier failures leave the full room
    assert tracker.may_start("u", "a", 100.0)
