"""A destination's ack mode and the downgrade/upgrade hysteresis
(amps_py.replication.ackmode): pure, on a fake clock (the time is passed in)."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest
from fresh import run_fresh

from amps_py.replication.ackmode import (
    NOT_DOWNGRADED_ASYNC,
    NOT_UPGRADED_ASYNC,
    AckMode,
    Downgraded,
    DowngradeDue,
    DowngradeRule,
    KeptSync,
    NoChange,
    Observed,
    ResyncComplete,
    Upgraded,
    UpgradeDue,
    UpgradePending,
    UpgradeRule,
    seconds_behind,
)

# the Ages of tests/test_actions.py's scheduled action (AMPS recommends upgrade = half)
DOWNGRADE_AGE = 2.0
UPGRADE_AGE = 0.5
EVERY = 0.25


# ---------------------------------------------------------------- AckMode
def test_a_sync_destination_downgrades_once() -> None:
    mode = AckMode(configured_sync=True)
    assert mode.sync and not mode.upgrade_pending
    first = mode.downgrade("admin")
    assert first == Downgraded("admin") and first.outcome == "downgraded to async"
    assert not mode.sync and mode.downgrades == 1
    assert mode.downgrade("admin") == NoChange("already async")
    assert mode.downgrades == 1


def test_an_async_destination_is_never_downgraded_or_upgraded() -> None:
    mode = AckMode(configured_sync=False)
    assert mode.downgrade("admin") == NoChange(NOT_DOWNGRADED_ASYNC)
    assert NOT_DOWNGRADED_ASYNC == "not downgraded: the destination is configured async"
    upgrade = mode.upgrade("admin", committed=5, acked=5, connected=True)
    assert upgrade == NoChange(NOT_UPGRADED_ASYNC)
    assert upgrade.outcome == "not upgraded: the destination is configured async"
    assert not mode.sync and (mode.downgrades, mode.upgrades) == (0, 0)


def test_upgrading_a_sync_destination_changes_nothing() -> None:
    mode = AckMode(configured_sync=True)
    assert mode.upgrade("admin", committed=9, acked=0, connected=True) == NoChange("already sync")
    assert mode.upgrades == 0


def test_a_caught_up_connected_destination_upgrades_at_once() -> None:
    mode = AckMode(configured_sync=True)
    mode.downgrade("lag")
    upgraded = mode.upgrade("healthy", committed=40, acked=40, connected=True)
    assert upgraded == Upgraded("healthy") and upgraded.outcome == "upgraded to sync"
    assert mode.sync and mode.upgrades == 1 and not mode.upgrade_pending


@pytest.mark.parametrize(("acked", "connected"), [(39, True), (40, False)])
def test_a_destination_behind_or_down_upgrades_once_it_acknowledges_the_target(
    acked: int, connected: bool
) -> None:
    """Publishers never wait for a backlog: sync again only once everything committed
    when the upgrade was asked for is acknowledged."""
    mode = AckMode(configured_sync=True)
    mode.downgrade("lag")
    pending = mode.upgrade("healthy", committed=40, acked=acked, connected=connected)
    assert pending == UpgradePending(40, "healthy")
    assert pending.outcome == "upgrade pending: sync again once txid 40 is acknowledged"
    assert mode.upgrade_pending and not mode.sync
    assert mode.acked(39) is None and not mode.sync
    assert mode.acked(41) == Upgraded("healthy")  # the reason given when it was asked for
    assert mode.sync and not mode.upgrade_pending and mode.upgrades == 1
    assert mode.acked(42) is None and mode.upgrades == 1


def test_asking_again_while_pending_moves_the_target() -> None:
    mode = AckMode(configured_sync=True)
    mode.downgrade("lag")
    mode.upgrade("first", committed=10, acked=0, connected=True)
    assert mode.upgrade("second", committed=20, acked=10, connected=True) == UpgradePending(
        20, "second"
    )
    assert mode.acked(10) is None
    assert mode.acked(20) == Upgraded("second")


def test_a_downgrade_cancels_a_pending_upgrade() -> None:
    mode = AckMode(configured_sync=True)
    mode.downgrade("lag")
    mode.upgrade("healthy", committed=10, acked=0, connected=True)
    assert mode.downgrade("lag again") == NoChange("already async")
    assert not mode.upgrade_pending
    assert mode.acked(10) is None and not mode.sync
    assert (mode.downgrades, mode.upgrades) == (1, 0)


def test_resync_completes_once_per_connection() -> None:
    mode = AckMode(configured_sync=True)
    assert mode.resync_complete(100) is None  # not connected: no resync
    mode.connected(50)
    assert mode.resync_complete(49) is None
    assert mode.resync_complete(50) == ResyncComplete(50)
    assert mode.resync_complete(60) is None  # once
    mode.connected(70)
    mode.disconnected()  # lost before the peer caught up
    assert mode.resync_complete(70) is None
    mode.connected(0)  # an empty journal: complete at once
    assert mode.resync_complete(0) == ResyncComplete(0)


def test_resync_and_ack_mode_are_independent() -> None:
    mode = AckMode(configured_sync=True)
    mode.downgrade("lag")
    mode.upgrade("healthy", committed=30, acked=0, connected=True)
    mode.connected(30)
    assert mode.acked(30) == Upgraded("healthy")
    assert mode.resync_complete(30) == ResyncComplete(30)


# ---------------------------------------------------------------- the rules
def observed(
    name: str = "B",
    *,
    behind: float,
    now: float = 1000.0,
    sync: bool = True,
    configured_sync: bool = True,
    connected: bool = True,
    upgrade_pending: bool = False,
) -> Observed:
    return Observed(
        name=name,
        configured_sync=configured_sync,
        sync=sync,
        connected=connected,
        upgrade_pending=upgrade_pending,
        oldest_unacked_at=now - behind if behind else None,
    )


def test_seconds_behind_is_the_age_of_the_oldest_unacknowledged_record() -> None:
    assert seconds_behind(100.0, None) == 0.0
    assert seconds_behind(100.0, 97.5) == 2.5
    assert seconds_behind(100.0, 101.0) == 0.0  # written "in the future": clock stepped back


def test_downgrade_only_strictly_over_the_age() -> None:
    rule = DowngradeRule(DOWNGRADE_AGE)
    assert rule.decide(1000.0, 0.0, [observed(behind=DOWNGRADE_AGE)]) == []
    [due] = rule.decide(1000.0, 0.0, [observed(behind=2.25)])
    assert due == DowngradeDue(
        "B", 2.25, "action: its oldest unacknowledged message is 2.2 s old, over the Age of 2 s"
    )


def test_downgrade_skips_async_and_already_downgraded_destinations() -> None:
    rule = DowngradeRule(DOWNGRADE_AGE)
    assert rule.decide(1000.0, 0.0, [observed(behind=9, configured_sync=False, sync=False)]) == []
    assert rule.decide(1000.0, 0.0, [observed(behind=9, sync=False)]) == []
    # connected or not: a destination that is down lags all the same
    assert len(rule.decide(1000.0, 0.0, [observed(behind=9, connected=False)])) == 1


def test_nothing_is_downgraded_during_the_grace_period() -> None:
    rule = DowngradeRule(DOWNGRADE_AGE, grace=30.0)
    lagging = [observed(behind=9)]
    assert rule.decide(1029.9, 1000.0, lagging) == []
    assert len(rule.decide(1030.0, 1000.0, lagging)) == 1  # the grace period is over
    assert len(DowngradeRule(DOWNGRADE_AGE).decide(1000.1, 1000.0, lagging)) == 1


def test_the_most_behind_goes_first_and_minimum_sync_destinations_stay_sync() -> None:
    destinations = [
        observed("B", behind=3.0),
        observed("C", behind=5.0),
        observed("D", behind=0.0),  # sync and healthy: counts towards the floor
        observed("E", behind=4.0),
    ]
    decisions = DowngradeRule(DOWNGRADE_AGE, minimum_sync=2).decide(1000.0, 0.0, destinations)
    assert [(type(d), d.name, d.behind) for d in decisions] == [
        (DowngradeDue, "C", 5.0),
        (DowngradeDue, "E", 4.0),
        (KeptSync, "B", 3.0),
    ]
    floor = DowngradeRule(DOWNGRADE_AGE, minimum_sync=1).decide(1000.0, 0.0, [observed(behind=3)])
    assert floor == [KeptSync("B", 3.0)]


def test_upgrade_only_strictly_under_the_age() -> None:
    rule = UpgradeRule(UPGRADE_AGE)
    assert rule.decide(1000.0, [observed(behind=UPGRADE_AGE, sync=False)]) == []
    [due] = rule.decide(1000.0, [observed(behind=0.25, sync=False)])
    assert due == UpgradeDue(
        "B", 0.25, "action: its oldest unacknowledged message is 0.2 s old, under the Age of 0.5 s"
    )
    assert len(rule.decide(1000.0, [observed(behind=0.0, sync=False)])) == 1


@pytest.mark.parametrize(
    "destination",
    [
        observed(behind=0, sync=True),  # already sync
        observed(behind=0, sync=False, configured_sync=False),  # configured async
        observed(behind=0, sync=False, connected=False),  # down: cannot catch up
        observed(behind=0, sync=False, upgrade_pending=True),  # already asked
    ],
)
def test_upgrade_skips_what_it_cannot_or_need_not_upgrade(destination: Observed) -> None:
    assert UpgradeRule(UPGRADE_AGE).decide(1000.0, [destination]) == []


# ---------------------------------------------------------------- hysteresis, simulated
@dataclass
class SimulatedDestination:
    """One sync destination on a fake clock: a publisher commits one record per tick,
    and the link delivers acks ``lag`` seconds late (0: at once)."""

    name: str = "B"
    mode: AckMode = field(default_factory=lambda: AckMode(configured_sync=True))
    lag: float = 0.0
    committed: int = 0
    acked: int = 0
    changes: list[str] = field(default_factory=list)

    def tick(self) -> None:
        self.committed += 1
        self.acked = self.committed if self.lag == 0 else self.committed - 1
        upgraded = self.mode.acked(self.acked)
        if upgraded is not None:
            self.changes.append("upgraded")

    def observe(self, now: float) -> Observed:
        return Observed(
            name=self.name,
            configured_sync=self.mode.configured_sync,
            sync=self.mode.sync,
            connected=True,
            upgrade_pending=self.mode.upgrade_pending,
            oldest_unacked_at=now - self.lag if self.lag else None,
        )


def run_schedule(dest: SimulatedDestination, now: float, seconds: float) -> float:
    """Fire the scheduled action (downgrade Do, then upgrade Do, as in test_actions'
    config) every EVERY for ``seconds`` of fake time; returns the time reached."""
    downgrade, upgrade = DowngradeRule(DOWNGRADE_AGE), UpgradeRule(UPGRADE_AGE)
    end = now + seconds
    while now < end:
        now += EVERY
        dest.tick()
        for down in downgrade.decide(now, 0.0, [dest.observe(now)]):
            if isinstance(dest.mode.downgrade(down.why), Downgraded):
                dest.changes.append("downgraded")
        for up in upgrade.decide(now, [dest.observe(now)]):
            outcome = dest.mode.upgrade(
                up.why, committed=dest.committed, acked=dest.acked, connected=True
            )
            if isinstance(outcome, Upgraded):
                dest.changes.append("upgraded")
    return now


@pytest.mark.parametrize("lag", [0.6, 1.0, 1.5, 1.99])
def test_a_lag_between_the_ages_never_flips_a_downgraded_destination(lag: float) -> None:
    dest = SimulatedDestination()
    dest.lag = 4.0
    now = run_schedule(dest, 0.0, 1.0)
    assert dest.changes == ["downgraded"]
    dest.lag = lag
    run_schedule(dest, now, 60.0)
    assert dest.changes == ["downgraded"] and not dest.mode.sync


@pytest.mark.parametrize("lag", [0.5, 1.0, 1.5, 2.0])
def test_a_lag_between_the_ages_never_flips_a_sync_destination(lag: float) -> None:
    dest = SimulatedDestination()
    dest.lag = lag
    run_schedule(dest, 0.0, 60.0)
    assert dest.changes == [] and dest.mode.sync


def test_the_mode_follows_the_lag_once_each_way() -> None:
    """tests/test_actions.py's scenario on a fake clock: a slow link is downgraded, a
    middling one changes nothing either way, a healthy one is upgraded."""
    dest = SimulatedDestination()
    dest.lag = 4.0
    now = run_schedule(dest, 0.0, 1.0)
    assert dest.changes == ["downgraded"]
    dest.lag = 1.0
    now = run_schedule(dest, now, 4.0)
    dest.lag = 0.0
    now = run_schedule(dest, now, 1.0)
    assert dest.changes == ["downgraded", "upgraded"] and dest.mode.sync
    dest.lag = 1.0
    run_schedule(dest, now, 4.0)
    assert dest.changes == ["downgraded", "upgraded"]
    assert (dest.mode.downgrades, dest.mode.upgrades) == (1, 1)


def test_the_decisions_load_no_trio() -> None:
    """The ack mode, the back-off and routing are pure: importing them in a fresh
    interpreter loads no trio."""
    code = (
        "import sys, amps_py.replication.ackmode, amps_py.replication.backoff,"
        " amps_py.replication.routing\n"
        "print(','.join(sorted(m for m in sys.modules if m.split('.')[0] == 'trio')))\n"
    )
    out = run_fresh(code)
    assert out == "", f"loaded {out}"
