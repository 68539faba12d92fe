"""The values the queue core works on: messages, leases, subscriptions and results.

Plain dataclasses; :class:`~amps_py.queue.state.QueueState` is the only code that
changes a message's ``lease``, ``deliveries``, ``cancels`` or ``owner``, and a
subscription's leases. Callers read them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

#: a queue subscription's identity: (connection id, sub_id)
SubKey = tuple[int, str]


@dataclass
class Lease:
    """A delivered at-least-once message, held by one subscription until it is acked,
    cancelled, or returned (lease timeout, unsubscribe, disconnect).

    Attributes:
        sub: the subscription holding it.
        leased_at: when it was delivered (``now`` of the ``assign`` that sent it).
        expires_at: when the lease times out; ``None``: never (no ``LeasePeriod``).
    """

    sub: SubKey
    leased_at: float
    expires_at: float | None


@dataclass(slots=True)
class QueueMessage:
    """One message in the queue, as the journal committed it.

    ``txid``, ``bookmark``, ``payload``, ``correlation_id``, ``published_at``,
    ``priority`` and ``barrier`` are set by the caller when it adds the message (the
    caller evaluates the queue's ``Priority`` expression and ``BarrierExpression``);
    ``owner`` by the caller too, then only by :meth:`QueueState.transfer`. The rest is
    local delivery state, not journaled (AMPS resets it on restart too).

    Compact (``__slots__``): a deep queue holds one per message. The core never reads
    ``payload``; the server leaves it ``None`` for messages whose data it reads from
    the journal by ``txid`` when it sends them, so a queued message costs memory for
    its identity and delivery state, not for its data.

    Attributes:
        txid: the local journal txid of the publish; messages enter in txid order.
        bookmark: the message's bookmark: what an ack names.
        payload: the message data, delivered as is; ``None``: not held in memory (the
            server reads it from the journal record ``txid``).
        correlation_id: the publish's correlation id (delivered with the message).
        published_at: origin time of the publish (seconds, the wall clock every
            ``now`` passed to the core uses): ``Expiration`` counts from it.
        owner: the instance that may deliver it (distributed / group-local queues).
        priority: higher is delivered first; equal priorities go in txid order.
        barrier: a barrier message (see :meth:`QueueState.assign`).
        arrived_at: when it entered this instance's queue (set by ``add``).
        deliveries: times it was sent from this instance.
        cancels: times a holder cancelled it.
        lease: who holds it now (at-least-once), or ``None`` while it waits.
    """

    txid: int
    bookmark: str
    payload: bytes | None
    correlation_id: str = ""
    published_at: float = 0.0
    owner: str = ""
    priority: int = 0
    barrier: bool = False
    arrived_at: float = 0.0
    deliveries: int = 0
    cancels: int = 0
    lease: Lease | None = None


@dataclass(eq=False)
class QueueSub:
    """One subscription to the queue on this instance.

    The caller builds it with its key, the ``max_backlog`` the subscriber asked for
    and whatever its ``matches`` callable needs (``context``: e.g. the compiled
    filter; the core never reads it). :meth:`QueueState.subscribe` sets ``backlog``.

    Attributes:
        key: (connection id, sub_id).
        requested_backlog: the subscribe command's ``max_backlog`` option (AMPS
            default 1).
        context: opaque to the core; for the caller's ``matches``.
        backlog: the effective backlog: ``min(requested_backlog,
            MaxPerSubscriptionBacklog)``; 0 until subscribed.
        leased: bookmarks of the messages it holds leased, oldest lease first.
    """

    key: SubKey
    requested_backlog: int = 1
    context: Any = None
    backlog: int = 0
    leased: dict[str, None] = field(default_factory=dict, repr=False)

    @property
    def leased_count(self) -> int:
        """How many messages it holds leased."""
        return len(self.leased)

    @property
    def free_backlog(self) -> int:
        """How many more messages it may be leased now (never below 0)."""
        return max(self.backlog - len(self.leased), 0)


@dataclass(frozen=True)
class AckResult:
    """What one ack command (``sow_delete`` on the queue) did.

    Attributes:
        acked: messages removed from the queue (the ack is the caller's journal record);
            on an at-most-once queue, messages acked before they were sent.
        cancelled: messages returned to the queue by option ``cancel``.
        expired: messages expired (option ``expire``, or ``cancel`` past
            ``MaxCancels`` / ``MaxDeliveries`` / ``Expiration``): for the dead-letter
            action and the journal.
        refused: bookmarks named but not changed: leased by another connection under
            strict leasing, ``cancel`` of a message nobody holds, or ``cancel`` /
            ``expire`` on an at-most-once queue (no effect there, as in AMPS).
        unknown: bookmarks not in the queue (already acked or expired, or never in it).
    """

    acked: list[QueueMessage] = field(default_factory=list)
    cancelled: list[QueueMessage] = field(default_factory=list)
    expired: list[QueueMessage] = field(default_factory=list)
    refused: list[str] = field(default_factory=list)
    unknown: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class Returned:
    """Leases that ended without an ack (timeout, unsubscribe, disconnect).

    Attributes:
        returned: messages back in the queue, to be redelivered.
        expired: messages expired instead (``MaxDeliveries``, ``Expiration``): for
            the dead-letter action and the journal.
    """

    returned: list[QueueMessage] = field(default_factory=list)
    expired: list[QueueMessage] = field(default_factory=list)


@dataclass(frozen=True)
class QueueStatistics:
    """A snapshot of one queue on one instance (counters since the state was built).

    Attributes:
        depth: messages in the queue (waiting or leased, owned here or not).
        leased: messages leased now.
        owned: messages in the queue this instance may deliver.
        waiting_barriers: barrier messages not delivered yet.
        subscriptions: queue subscriptions here.
        backlog_capacity: sum of the subscriptions' effective backlogs, capped by
            ``max_backlog``.
        max_backlog: the instance cap in force (``None``: none).
        delivered: deliveries made (a barrier counts once per subscription).
        acked: messages acked here.
        returned: leases ended without an ack and put back (timeout, unsubscribe,
            disconnect); cancels are counted in ``cancelled``.
        cancelled: messages cancelled back into the queue.
        lease_timeouts: leases that timed out (returned or expired).
        expired: messages expired here (any reason).
        removed_by_peer: messages removed by a replicated ack or expiry.
        transferred_in: messages whose ownership moved to this instance.
        transferred_out: messages whose ownership moved away from it.
    """

    depth: int
    leased: int
    owned: int
    waiting_barriers: int
    subscriptions: int
    backlog_capacity: int
    max_backlog: int | None
    delivered: int
    acked: int
    returned: int
    cancelled: int
    lease_timeouts: int
    expired: int
    removed_by_peer: int
    transferred_in: int
    transferred_out: int
