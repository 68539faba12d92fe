"""The reconnect schedule of a destination (amps_py.replication.backoff): pure, time
passed in."""

from __future__ import annotations

import pytest

from amps_py.config import DestinationConfig
from amps_py.replication.backoff import QUICK_RETRIES, STABLE_AFTER, ReconnectBackoff

CONFIGURED = (1.0, 2.0, 4.0, 8.0)  # ReconnectTimeout 1s,2s,4s,8s (the default)


def waits_after_failures(policy: ReconnectBackoff, now: float, rounds: int) -> list[float]:
    """Fail ``rounds`` rounds, each as soon as it is due; the waits between them."""
    waits = []
    for _ in range(rounds):
        now += policy.delay(now)
        policy.failed(now)
        waits.append(policy.delay(now))
    return waits


def test_a_new_destination_dials_at_once_then_quick_retries_then_the_configured_backoff() -> None:
    policy = ReconnectBackoff(CONFIGURED)
    assert policy.delay(0.0) == 0.0
    assert waits_after_failures(policy, 0.0, 9) == pytest.approx(
        [*QUICK_RETRIES, 1.0, 2.0, 4.0, 8.0, 8.0, 8.0]  # the last configured value repeats
    )
    assert max(QUICK_RETRIES) <= 0.2 and len(QUICK_RETRIES) >= 2


def test_losing_a_stable_connection_redials_at_once_and_starts_the_schedule_over() -> None:
    policy = ReconnectBackoff(CONFIGURED)
    waits_after_failures(policy, 0.0, 7)  # the peer was down a while: 8 s waits now
    assert policy.wait == 8.0
    policy.connected(100.0)
    policy.lost(100.0 + STABLE_AFTER + 30)
    assert policy.delay(100.0 + STABLE_AFTER + 30) == 0.0
    assert policy.wait == 0.0
    assert waits_after_failures(policy, 200.0, 4) == pytest.approx([*QUICK_RETRIES, 1.0])


def test_a_connection_lost_soon_after_its_handshake_keeps_the_backoff_growing() -> None:
    """A peer that accepts the link and drops it at once is not redialled in a loop."""
    policy = ReconnectBackoff(CONFIGURED)
    now = 0.0
    waits = []
    for _ in range(8):
        now += policy.delay(now)
        policy.connected(now)
        now += 0.01
        policy.lost(now)
        waits.append(policy.delay(now))
    assert waits == pytest.approx([*QUICK_RETRIES, 1.0, 2.0, 4.0, 8.0, 8.0])


def test_delay_counts_down_with_the_time_passed_in() -> None:
    policy = ReconnectBackoff(CONFIGURED, quick=())
    policy.failed(10.0)
    assert policy.delay(10.0) == 1.0
    assert policy.delay(10.25) == 0.75
    assert policy.delay(12.0) == 0.0
    assert policy.wait == 1.0  # the length of the wait, for statistics


def test_lost_without_a_handshake_counts_as_a_failed_round() -> None:
    policy = ReconnectBackoff((3.0,), quick=(0.1,))
    policy.lost(5.0)
    assert policy.delay(5.0) == pytest.approx(0.1)
    policy.lost(6.0)
    assert policy.delay(6.0) == 3.0


@pytest.mark.parametrize(
    ("timeouts", "quick", "message"),
    [((), QUICK_RETRIES, "at least one wait"), ((1.0,), (-0.1,), "must not be negative")],
)
def test_bad_schedules_are_refused_with_what_to_fix(
    timeouts: tuple[float, ...], quick: tuple[float, ...], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        ReconnectBackoff(timeouts, quick=quick)


def test_a_destination_backs_off_on_its_configured_reconnect_delay() -> None:
    """The outgoing driver builds its policy from ``DestinationConfig.reconnect_delay``:
    the default config waits as the default ReconnectTimeout list does, a configured
    list is followed and its last value repeats."""
    default = DestinationConfig(name="b", group=None, sync_type="sync", topics=())
    assert default.reconnect_timeouts == CONFIGURED
    assert waits_after_failures(ReconnectBackoff(default.reconnect_delay), 0.0, 9) == (
        pytest.approx(waits_after_failures(ReconnectBackoff(CONFIGURED), 0.0, 9))
    )
    configured = DestinationConfig(
        name="b", group=None, sync_type="sync", topics=(), reconnect_timeouts=(0.5, 3.0)
    )
    assert waits_after_failures(
        ReconnectBackoff(configured.reconnect_delay), 0.0, 6
    ) == pytest.approx([*QUICK_RETRIES, 0.5, 3.0, 3.0])
