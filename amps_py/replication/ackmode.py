"""A destination's ack mode, and when it changes (sans-IO: facts in, decisions out).

Persisted acks to publishers wait for every destination that is currently *sync*
(:meth:`ReplicationManager.durable_txid`). :class:`AckMode` holds that mode for one
destination and moves it between these states:

- **sync**: persisted acks wait for the destination (its configured ``SyncType``);
- **downgraded**: they no longer wait (:meth:`AckMode.downgrade`, by an action or the
  admin); the acks already waiting are released by the caller;
- **upgrade pending** (a target txid): still async, and sync again once the
  destination has acknowledged the target, everything committed when the upgrade was
  asked for (:meth:`AckMode.upgrade`, then :meth:`AckMode.acked`), so publishers never
  wait for a backlog.

A destination configured async is async for good: asking it to change says so. Per
connection the ack mode also tracks the resync: once the peer has acknowledged what
the journal held when the connection started, :meth:`AckMode.resync_complete` says so,
once (``on-replication-resync-complete``).

The actions' hysteresis is here too: :class:`DowngradeRule` (``do-downgrade-
replication``) and :class:`UpgradeRule` (``do-upgrade-replication``) look at each
destination's lag (:class:`Observed`, the time passed in as ``now``) and say which to
downgrade or upgrade. With the upgrade Age below the downgrade Age, a lag between the
two changes nothing, whichever mode the destination is in.

Nothing here logs, fires actions or touches a connection: the driver
(:mod:`.outgoing`, :mod:`amps_py.actions`) acts on the decisions returned.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

#: what :meth:`AckMode.downgrade` answers for a destination configured async
NOT_DOWNGRADED_ASYNC = "not downgraded: the destination is configured async"
#: what :meth:`AckMode.upgrade` answers for a destination configured async
NOT_UPGRADED_ASYNC = "not upgraded: the destination is configured async"


# ---------------------------------------------------------------- decisions
@dataclass(frozen=True)
class NoChange:
    """The mode stays as it is; ``outcome`` says why (e.g. ``already async``)."""

    outcome: str


@dataclass(frozen=True)
class Downgraded:
    """The destination became async: persisted acks no longer wait for it."""

    why: str

    @property
    def outcome(self) -> str:
        return "downgraded to async"


@dataclass(frozen=True)
class Upgraded:
    """The destination became sync again: persisted acks wait for it again."""

    why: str

    @property
    def outcome(self) -> str:
        return "upgraded to sync"


@dataclass(frozen=True)
class UpgradePending:
    """The destination becomes sync once it has acknowledged txid ``target``."""

    target: int
    why: str

    @property
    def outcome(self) -> str:
        return f"upgrade pending: sync again once txid {self.target} is acknowledged"


@dataclass(frozen=True)
class ResyncComplete:
    """The peer has acknowledged everything the journal held when it connected
    (txid ``upto``)."""

    upto: int


#: what asking for a downgrade or an upgrade can answer
Decision = NoChange | Downgraded | Upgraded | UpgradePending


# ---------------------------------------------------------------- the state machine
class AckMode:
    """The ack mode of one destination (see the module doc for the states).

    Args:
        configured_sync: whether the destination is configured sync (``SyncType``);
            it starts in that mode.
    """

    def __init__(self, configured_sync: bool) -> None:
        self.configured_sync = configured_sync
        #: whether persisted acks wait for the destination now
        self.sync = configured_sync
        #: downgrades and upgrades so far (statistics)
        self.downgrades = 0
        self.upgrades = 0
        #: sync again once the destination has acknowledged this txid (upgrade pending)
        self.upgrade_target: int | None = None
        self._upgrade_why = ""
        #: the committed txid when the current connection started, until the peer
        #: has acknowledged it (then None); None between connections too
        self.resync_end: int | None = None

    @property
    def upgrade_pending(self) -> bool:
        return self.upgrade_target is not None

    def downgrade(self, why: str) -> Downgraded | NoChange:
        """Async from now on, because of ``why``. Cancels a pending upgrade."""
        if not self.configured_sync:
            return NoChange(NOT_DOWNGRADED_ASYNC)
        self.upgrade_target = None
        if not self.sync:
            return NoChange("already async")
        self.sync = False
        self.downgrades += 1
        return Downgraded(why)

    def upgrade(
        self, why: str, *, committed: int, acked: int, connected: bool
    ) -> Upgraded | UpgradePending | NoChange:
        """Sync again, because of ``why``, once the destination has acknowledged
        ``committed`` (the local journal's committed txid now): at once when it is
        ``connected`` and has ``acked`` that far, else pending (:meth:`acked` completes
        it). Asking again while pending moves the target to the new ``committed``."""
        if not self.configured_sync:
            return NoChange(NOT_UPGRADED_ASYNC)
        if self.sync:
            return NoChange("already sync")
        if connected and acked >= committed:
            return self._to_sync(why)
        self.upgrade_target = committed
        self._upgrade_why = why
        return UpgradePending(committed, why)

    def acked(self, acked: int) -> Upgraded | None:
        """The destination has acknowledged up to ``acked``: completes a pending
        upgrade whose target that reaches."""
        if self.upgrade_target is not None and acked >= self.upgrade_target:
            return self._to_sync(self._upgrade_why)
        return None

    def _to_sync(self, why: str) -> Upgraded:
        self.upgrade_target = None
        self.sync = True
        self.upgrades += 1
        return Upgraded(why)

    # -------------------------------------------------------------- per connection
    def connected(self, resync_end: int) -> None:
        """A connection's handshake completed while the local journal was committed
        up to ``resync_end``: the resync lasts until the peer acknowledges it."""
        self.resync_end = resync_end

    def resync_complete(self, acked: int) -> ResyncComplete | None:
        """Whether ``acked`` completes the current connection's resync; answers
        :class:`ResyncComplete` once per connection."""
        end = self.resync_end
        if end is not None and acked >= end:
            self.resync_end = None
            return ResyncComplete(end)
        return None

    def disconnected(self) -> None:
        """The connection ended: no resync is in progress."""
        self.resync_end = None


# ---------------------------------------------------------------- hysteresis
def seconds_behind(now: float, oldest_unacked_at: float | None) -> float:
    """The age at ``now`` (epoch seconds) of the oldest record a destination has not
    acknowledged, written at ``oldest_unacked_at`` (None: it has acknowledged all)."""
    if oldest_unacked_at is None:
        return 0.0
    return max(0.0, now - oldest_unacked_at)


@dataclass(frozen=True)
class Observed:
    """What a rule looks at of one destination when an action runs.

    Attributes:
        name: the destination's name (unique in the instance).
        configured_sync: whether it is configured sync.
        sync: whether it is sync now.
        connected: whether its link is up.
        upgrade_pending: whether an upgrade waits for its acks.
        oldest_unacked_at: when (epoch seconds) the oldest record it has not
            acknowledged was written here; None when it has acknowledged everything.
    """

    name: str
    configured_sync: bool
    sync: bool
    connected: bool
    upgrade_pending: bool
    oldest_unacked_at: float | None

    def behind(self, now: float) -> float:
        return seconds_behind(now, self.oldest_unacked_at)


@dataclass(frozen=True)
class DowngradeDue:
    """Downgrade destination ``name``, ``behind`` seconds behind, because of ``why``."""

    name: str
    behind: float
    why: str


@dataclass(frozen=True)
class KeptSync:
    """Destination ``name`` lags over the Age but stays sync: downgrading it would
    leave fewer than MinimumSyncDestinations sync."""

    name: str
    behind: float


@dataclass(frozen=True)
class UpgradeDue:
    """Upgrade destination ``name``, ``behind`` seconds behind, because of ``why``."""

    name: str
    behind: float
    why: str


@dataclass(frozen=True)
class DowngradeRule:
    """``amps-action-do-downgrade-replication``: make async every sync destination
    whose oldest unacknowledged message is older than ``age`` seconds, the most behind
    first, while more than ``minimum_sync`` destinations stay sync.

    Attributes:
        age: the lag (seconds) over which a destination is downgraded.
        grace: seconds after startup during which nothing is downgraded (``GracePeriod``);
            None: no grace period.
        minimum_sync: amps-py's ``MinimumSyncDestinations``: a floor under the number
            of sync destinations (0, AMPS's behaviour: no floor).
    """

    age: float
    grace: float | None = None
    minimum_sync: int = 0

    def decide(
        self, now: float, started_at: float, destinations: Sequence[Observed]
    ) -> list[DowngradeDue | KeptSync]:
        """What to do at ``now`` (epoch seconds) for an instance started at
        ``started_at``: a :class:`DowngradeDue` or :class:`KeptSync` per destination
        over the Age, the most behind first; nothing during the grace period."""
        if self.grace is not None and now - started_at < self.grace:
            return []
        lagging = [
            (behind, d)
            for d in destinations
            if d.configured_sync and d.sync and (behind := d.behind(now)) > self.age
        ]
        sync_now = sum(1 for d in destinations if d.sync)
        decisions: list[DowngradeDue | KeptSync] = []
        for behind, d in sorted(lagging, key=lambda pair: -pair[0]):
            if sync_now <= self.minimum_sync:
                decisions.append(KeptSync(d.name, behind))
                continue
            why = (
                f"action: its oldest unacknowledged message is {behind:.1f} s old, "
                f"over the Age of {self.age:g} s"
            )
            decisions.append(DowngradeDue(d.name, behind, why))
            sync_now -= 1
        return decisions


@dataclass(frozen=True)
class UpgradeRule:
    """``amps-action-do-upgrade-replication``: ask a downgraded destination that is
    connected and lags less than ``age`` seconds to become sync again (it does once it
    has caught up: :meth:`AckMode.upgrade`)."""

    age: float

    def decide(self, now: float, destinations: Sequence[Observed]) -> list[UpgradeDue]:
        """The destinations to upgrade at ``now`` (epoch seconds), in order."""
        decisions = []
        for d in destinations:
            if d.configured_sync and not d.sync and d.connected and not d.upgrade_pending:
                behind = d.behind(now)
                if behind < self.age:
                    why = (
                        f"action: its oldest unacknowledged message is {behind:.1f} s old, "
                        f"under the Age of {self.age:g} s"
                    )
                    decisions.append(UpgradeDue(d.name, behind, why))
        return decisions
