"""The delivery state of one message queue on one instance: :class:`QueueState`.

What is in the queue (which messages, who owns each) is derived from the journal:
the caller adds every committed publish of the underlying topic in txid order and
applies every journaled removal (ack, expiry) and ownership grant. What is NOT
journaled lives only here, as in AMPS (reset on restart): leases, delivery counts,
cancel counts.

Pure: no trio, no I/O, no clock. Every call that depends on time takes ``now`` (wall
clock seconds, the clock ``QueueMessage.published_at`` uses). Filtering is the
caller's ``matches(sub, message)``; priority and barrier are set on the message by the
caller. The caller acts on what the methods return: it sends the deliveries
``assign`` returns, journals acks and expiries, fires the dead-letter action for
expired messages, and sleeps until :meth:`QueueState.next_deadline`.

Ownership: only messages this instance owns (``owner == instance_name``; a
``local`` queue owns everything) are delivered to subscribers, except barrier
messages, which every instance delivers to its own subscribers.
"""

from __future__ import annotations

import bisect
import heapq
import itertools
from collections.abc import Callable, Iterable, Iterator
from typing import Final

from sortedcontainers import SortedList

from .fairness import pick
from .model import AckResult, Lease, QueueMessage, QueueStatistics, QueueSub, Returned, SubKey
from .policy import QueuePolicy

#: ack options (the ``sow_delete`` ``o`` header on a queue)
ACK_OPTIONS = ("", "cancel", "expire")
#: txids are below this (u64 in the journal): a ready key is ``txid - priority * TXIDS``
TXIDS: Final = 1 << 64


def ready_key(message: QueueMessage) -> int:
    """The delivery order of a waiting message as one int: highest priority first,
    then oldest. The txid itself for priority 0 (no object of its own), ``txid -
    priority * 2**64`` otherwise; ``key % 2**64`` is the txid again."""
    priority = message.priority
    return message.txid - priority * TXIDS if priority else message.txid

Matcher = Callable[[QueueSub, QueueMessage], bool]


def _match_all(sub: QueueSub, message: QueueMessage) -> bool:
    return True


class QueueState:
    """The messages of one queue on one instance and who holds them.

    Args:
        policy: the queue's delivery rules (built by the server from QueueConfig).
        instance_name: this instance's name, compared with ``QueueMessage.owner``.
        matches: whether a subscription wants a message (its filter, entitlement);
            default: every subscription wants every message.

    Error handling: calls that name messages (acks, removals, transfers) report
    unknown bookmarks in their result and never raise for them; a message already
    acked elsewhere is a normal race. Only caller bugs raise ``ValueError``
    (messages added out of txid order, a bad ack option, a backlog below 1).
    """

    def __init__(self, policy: QueuePolicy, instance_name: str, matches: Matcher | None = None):
        self.policy = policy
        self.instance_name = instance_name
        self._matches = matches or _match_all
        #: bookmark -> message, in txid order (add is in txid order, nothing reinserts)
        self._messages: dict[str, QueueMessage] = {}
        self._by_txid: dict[int, QueueMessage] = {}
        #: :func:`ready_key` of the messages assign may hand out: owned here, not
        #: leased, not a barrier; sorted (O(log n) insert and delete, so a deep queue
        #: costs no memmove per delivery), delivery order is a walk from the front
        self._ready: SortedList = SortedList()
        #: txids of the barrier messages in the queue, ascending
        self._barriers: list[int] = []
        self._subs: dict[SubKey, QueueSub] = {}
        self._rotation = 0
        self._leased = 0
        self._owned = 0
        self._last_txid = 0
        #: (expires_at, serial, bookmark, lease); entries of ended leases are skipped
        self._lease_heap: list[tuple[float, int, str, Lease]] = []
        #: (published_at + expiration, txid, bookmark); entries of gone messages skipped
        self._expiry_heap: list[tuple[float, int, str]] = []
        self._serial = itertools.count()
        self._delivered = 0
        self._acked = 0
        self._returned = 0
        self._cancelled = 0
        self._lease_timeouts = 0
        self._expired = 0
        self._removed_by_peer = 0
        self._transferred_in = 0
        self._transferred_out = 0

    # ------------------------------------------------------------ reading

    def __len__(self) -> int:
        return len(self._messages)

    def __contains__(self, bookmark: object) -> bool:
        return bookmark in self._messages

    def get(self, bookmark: str) -> QueueMessage | None:
        """The message with ``bookmark`` while it is in the queue, else ``None``."""
        return self._messages.get(bookmark)

    def messages(self) -> Iterator[QueueMessage]:
        """The messages in the queue (waiting or leased), in txid order: what a ``sow``
        query on the queue reads. Do not add or remove while iterating."""
        return iter(self._messages.values())

    def subscriptions(self) -> list[QueueSub]:
        """The queue subscriptions here, in subscription order."""
        return list(self._subs.values())

    def owns(self, message: QueueMessage) -> bool:
        """Whether this instance may deliver ``message`` to a subscriber."""
        return self.policy.kind == "local" or message.owner == self.instance_name

    # ------------------------------------------------------------ messages in

    def add(self, message: QueueMessage, now: float | None = None) -> None:
        """Enter a committed publish (local or replicated) into the queue.

        Args:
            message: a new message, not leased, with a txid above every txid added
                before (the journal's order).
            now: when it arrived here (for :meth:`transfer_candidates`); default: its
                ``published_at``, which is what a rebuild from the journal should use.

        Raises:
            ValueError: txid not above the last one added, or bookmark already in the
                queue, or the message carries a lease: the caller must add each
                journal record once, in journal order.
        """
        if message.txid <= self._last_txid:
            raise ValueError(
                f"queue messages must be added in journal order: txid {message.txid} after "
                f"{self._last_txid}; add each committed publish once, oldest first"
            )
        if message.bookmark in self._messages:
            raise ValueError(f"bookmark {message.bookmark!r} is already in the queue")
        if message.lease is not None:
            raise ValueError("a message enters the queue unleased; build a fresh QueueMessage")
        self._last_txid = message.txid
        message.arrived_at = message.published_at if now is None else now
        self._messages[message.bookmark] = message
        self._by_txid[message.txid] = message
        if self.owns(message):
            self._owned += 1
        if message.barrier:
            self._barriers.append(message.txid)
        elif self.owns(message):
            self._ready_add(message)
        if self.policy.expiration is not None:
            deadline = message.published_at + self.policy.expiration
            heapq.heappush(self._expiry_heap, (deadline, message.txid, message.bookmark))

    def restore(self, messages: Iterable[QueueMessage]) -> int:
        """Fill an empty queue with the messages a checkpoint held (at start, before any
        :meth:`add`): the same result as adding each in turn with ``now=None``, built
        in one pass (a deep queue loads in a fraction of the time). Returns how many.

        Raises:
            ValueError: the queue is not empty, or the messages are not in ascending
                txid order, or one repeats a bookmark or carries a lease.
        """
        if self._messages:
            raise ValueError("restore fills an empty queue: call it before adding messages")
        by_mark = self._messages
        by_txid = self._by_txid
        ready: list[int] = []
        barriers = self._barriers
        expiry = self.policy.expiration
        last = 0
        owned = 0
        for message in messages:
            txid = message.txid
            if txid <= last or message.bookmark in by_mark or message.lease is not None:
                self._messages, self._by_txid, self._barriers = {}, {}, []
                raise ValueError(
                    f"restored queue messages must be new, unleased and in journal order: "
                    f"txid {txid} ({message.bookmark!r}) after {last}"
                )
            last = txid
            message.arrived_at = message.published_at
            by_mark[message.bookmark] = message
            by_txid[txid] = message
            mine = self.owns(message)
            owned += mine
            if message.barrier:
                barriers.append(txid)
            elif mine:
                ready.append(ready_key(message))
            if expiry is not None:
                self._expiry_heap.append((message.published_at + expiry, txid, message.bookmark))
        self._ready = SortedList(ready)
        heapq.heapify(self._expiry_heap)
        self._owned = owned
        self._last_txid = last
        return len(by_mark)

    # ------------------------------------------------------------ subscriptions

    def subscribe(self, sub: QueueSub) -> int:
        """Add a queue subscription (or replace the one with the same key) and return
        its effective backlog: ``min(sub.requested_backlog,
        MaxPerSubscriptionBacklog)``, what the subscribe ack reports as
        ``max_backlog``.

        Replacing a subscription keeps its leases (and its place in subscription
        order), as in AMPS; a smaller backlog than it holds just leaves it no room
        until it acks.

        Raises:
            ValueError: ``requested_backlog`` below 1 (the subscriber's
                ``max_backlog`` option must be a whole number of at least 1).
        """
        if sub.requested_backlog < 1:
            raise ValueError(
                f"max_backlog must be at least 1, got {sub.requested_backlog}; leave it out "
                "for the default of 1"
            )
        old = self._subs.get(sub.key)
        if old is not None and old is not sub:
            sub.leased = old.leased
        sub.backlog = min(sub.requested_backlog, self.policy.max_per_subscription_backlog)
        self._subs[sub.key] = sub
        return sub.backlog

    def unsubscribe(self, key: SubKey, now: float) -> Returned:
        """Remove a subscription; the messages it holds leased go back to the queue
        (or expire, past ``MaxDeliveries`` or ``Expiration``). An unknown key is a
        no-op."""
        sub = self._subs.get(key)
        if sub is None:
            return Returned()
        result = self._return_all(list(sub.leased), now)
        del self._subs[key]
        return result

    def disconnect(self, connection_id: int, now: float) -> Returned:
        """Unsubscribe every subscription of a connection that went away."""
        returned: list[QueueMessage] = []
        expired: list[QueueMessage] = []
        for key in [key for key in self._subs if key[0] == connection_id]:
            result = self.unsubscribe(key, now)
            returned.extend(result.returned)
            expired.extend(result.expired)
        return Returned(returned, expired)

    # ------------------------------------------------------------ delivery

    def assign(self, now: float) -> list[tuple[QueueSub, QueueMessage]]:
        """The deliveries to make now, in the order to send them.

        Ordinary messages: only messages owned here and not leased; highest priority
        first, then oldest (txid); each to one subscription that matches it and has
        free backlog, chosen by the fairness model; at most ``MaxBacklog`` messages
        leased on this instance at once. At-least-once: the message is leased to the
        subscription (``deliveries`` + 1, lease until ``now + LeasePeriod``).
        At-most-once: it leaves the queue now, is never redelivered, and backlog does
        not apply (nothing stays outstanding); the caller journals its removal as it
        journals an ack, so the other queue hosts drop it too.

        Barrier messages: held until no message with a lower txid is left in the
        queue here (acked or expired; leased and not-owned ones count as left), then
        delivered to every current subscription that matches, whatever its backlog
        and whoever owns the message, and removed from the queue (not leased; the
        caller journals the removal only if it wants other hosts to drop it too, which
        AMPS does not: each host delivers its own copy). A barrier no current
        subscription matches waits for one. Messages after a barrier wait until it is
        delivered.

        Call it after anything that may free a delivery: add, subscribe, ack,
        cancel, unsubscribe, lease expiry, transfer in.

        Cost: a walk of the waiting owned messages from the front, which stops once
        no backlog is free; messages no subscription matches are walked past each
        time (the whole queue when no filter matches anything).
        """
        out: list[tuple[QueueSub, QueueMessage]] = []
        progressed = True
        while progressed:
            progressed = self._deliver_barriers(out)
            progressed = self._assign_ready(now, out) or progressed
        return out

    def _deliver_barriers(self, out: list[tuple[QueueSub, QueueMessage]]) -> bool:
        progressed = False
        while self._barriers:
            message = self._by_txid[self._barriers[0]]
            oldest = next(iter(self._messages.values()))
            if oldest is not message:
                break
            targets = [sub for sub in self._subs.values() if self._matches(sub, message)]
            if not targets:
                break
            self._remove(message)
            message.deliveries += 1
            self._delivered += len(targets)
            out.extend((sub, message) for sub in targets)
            progressed = True
        return progressed

    def _assign_ready(self, now: float, out: list[tuple[QueueSub, QueueMessage]]) -> bool:
        if not self._subs or not self._ready:
            return False
        policy = self.policy
        leasing = policy.at_least_once
        model = policy.effective_fairness
        subs = list(self._subs.values())
        barrier = self._barriers[0] if self._barriers else None
        free = sum(sub.free_backlog for sub in subs)
        if leasing and policy.max_backlog is not None:
            free = min(free, policy.max_backlog - self._leased)
        progressed = False
        index = 0
        while index < len(self._ready):
            if leasing and free <= 0:
                break
            txid = self._ready[index] % TXIDS
            if barrier is not None and txid > barrier:
                index += 1
                continue
            message = self._by_txid[txid]

            def able(sub: QueueSub, message: QueueMessage = message) -> bool:
                return (not leasing or sub.free_backlog > 0) and self._matches(sub, message)

            chosen = pick(model, subs, self._rotation, able)
            if chosen is None:
                index += 1
                continue
            del self._ready[index]
            sub = subs[chosen]
            self._rotation = chosen + 1
            message.deliveries += 1
            self._delivered += 1
            if leasing:
                self._lease(message, sub, now)
                free -= 1
            else:
                self._remove(message)
            out.append((sub, message))
            progressed = True
        return progressed

    def _lease(self, message: QueueMessage, sub: QueueSub, now: float) -> None:
        period = self.policy.lease_period
        lease = Lease(sub.key, now, None if period is None else now + period)
        message.lease = lease
        sub.leased[message.bookmark] = None
        self._leased += 1
        if lease.expires_at is not None:
            entry = (lease.expires_at, next(self._serial), message.bookmark, lease)
            heapq.heappush(self._lease_heap, entry)
            if len(self._lease_heap) > 2 * self._leased + 64:
                self._compact_lease_heap()

    # ------------------------------------------------------------ acks

    def ack(self, bookmarks: Iterable[str], by: int | None, option: str, now: float) -> AckResult:
        """Apply an ack command: ``sow_delete`` on the queue naming bookmarks.

        Args:
            bookmarks: the bookmarks named (duplicates count once).
            by: the connection id of the client acking (``None``: not a client, e.g.
                an action); ``Leasing strict`` lets a connection ack only messages
                leased to one of its subscriptions, or not leased at all.
            option: ``""`` removes the messages (acked); ``"cancel"`` returns a leased
                message to the queue (``cancels`` + 1; expired instead once
                ``MaxCancels`` or ``MaxDeliveries`` is reached or it is past
                ``Expiration``); ``"expire"`` expires it now. On an at-most-once queue
                ``cancel`` and ``expire`` have no effect (reported as refused).
            now: the time (for the expiry checks of a cancel).

        Returns:
            What happened to each bookmark; unknown bookmarks never raise.

        Raises:
            ValueError: an option other than "", "cancel" or "expire" (the server
                refuses those before calling).
        """
        if option not in ACK_OPTIONS:
            raise ValueError(
                f"unknown queue ack option {option!r}: use no option, 'cancel' or 'expire'"
            )
        result = AckResult()
        for bookmark in dict.fromkeys(bookmarks):
            message = self._messages.get(bookmark)
            if message is None:
                result.unknown.append(bookmark)
            elif (option and not self.policy.at_least_once) or not self._may_ack(message, by):
                # cancel/expire do nothing on at-most-once; strict leasing says no
                result.refused.append(bookmark)
            elif option == "":
                self._remove(message)
                self._acked += 1
                result.acked.append(message)
            elif option == "expire":
                self._remove(message)
                self._expired += 1
                result.expired.append(message)
            elif message.lease is None:  # cancel of a message nobody holds
                result.refused.append(bookmark)
            elif self._return(message, now, cancelled=True):
                result.cancelled.append(message)
            else:
                result.expired.append(message)
        return result

    def ack_matching(
        self, predicate: Callable[[QueueMessage], bool], by: int | None, now: float
    ) -> AckResult:
        """Ack every message ``predicate`` selects (``sow_delete`` with a filter),
        subject to ``Leasing`` like :meth:`ack`; the ones refused are listed.
        ``now`` is unused today and kept for symmetry with :meth:`ack`."""
        result = AckResult()
        for message in [m for m in self._messages.values() if predicate(m)]:
            if self._may_ack(message, by):
                self._remove(message)
                self._acked += 1
                result.acked.append(message)
            else:
                result.refused.append(message.bookmark)
        return result

    def _may_ack(self, message: QueueMessage, by: int | None) -> bool:
        if self.policy.leasing == "sublet" or message.lease is None:
            return True
        return by is not None and message.lease.sub[0] == by

    # ------------------------------------------------------------ timers

    def expire_leases(self, now: float) -> Returned:
        """End the leases whose ``expires_at`` is not after ``now``: their messages go
        back to the queue, or expire when ``deliveries`` reached ``MaxDeliveries``
        (or they are past ``Expiration``)."""
        timed_out: list[QueueMessage] = []
        while self._lease_heap and self._lease_heap[0][0] <= now:
            _, _, bookmark, lease = heapq.heappop(self._lease_heap)
            message = self._messages.get(bookmark)
            if message is not None and message.lease is lease:
                timed_out.append(message)
        self._lease_timeouts += len(timed_out)
        return self._return_all([m.bookmark for m in timed_out], now)

    def expire_messages(self, now: float) -> list[QueueMessage]:
        """Remove and return the messages past ``Expiration`` (``published_at +
        expiration <= now``), leased or not: the caller journals each expiry and
        fires the dead-letter action."""
        expired: list[QueueMessage] = []
        while self._expiry_heap and self._expiry_heap[0][0] <= now:
            _, txid, bookmark = heapq.heappop(self._expiry_heap)
            message = self._messages.get(bookmark)
            if message is not None and message.txid == txid:
                self._remove(message)
                expired.append(message)
        self._expired += len(expired)
        return expired

    def next_deadline(self) -> float | None:
        """The earliest lease timeout or message expiry to come (``None``: none), so
        the caller can sleep until then and call :meth:`expire_leases` and
        :meth:`expire_messages`."""
        while self._lease_heap:
            _, _, bookmark, lease = self._lease_heap[0]
            message = self._messages.get(bookmark)
            if message is not None and message.lease is lease:
                break
            heapq.heappop(self._lease_heap)
        while self._expiry_heap:
            _, txid, bookmark = self._expiry_heap[0]
            message = self._messages.get(bookmark)
            if message is not None and message.txid == txid:
                break
            heapq.heappop(self._expiry_heap)
        deadlines = [heap[0][0] for heap in (self._lease_heap, self._expiry_heap) if heap]
        return min(deadlines) if deadlines else None

    # ------------------------------------------------------------ replication

    def apply_removed(self, bookmarks: Iterable[str]) -> list[QueueMessage]:
        """Apply a journaled ack or expiry that came from another instance: remove the
        messages with no lease check (a local lease on one just ends). Unknown
        bookmarks are skipped. Returns the messages removed; their ``arrived_at``
        gives the replication layer its arrival-to-ack times."""
        removed: list[QueueMessage] = []
        for bookmark in dict.fromkeys(bookmarks):
            message = self._messages.get(bookmark)
            if message is not None:
                self._remove(message)
                removed.append(message)
        self._removed_by_peer += len(removed)
        return removed

    def drop(self, bookmark: str) -> QueueMessage | None:
        """Take a message out of the queue because it cannot be delivered (its data is
        unreadable); counted as expired. Returns it (None: not in the queue)."""
        message = self._messages.get(bookmark)
        if message is not None:
            self._remove(message)
            self._expired += 1
        return message

    def transfer(self, bookmark: str, new_owner: str) -> bool:
        """Apply a journaled ownership grant: ``new_owner`` owns the message from now.

        A message transferred to this instance becomes deliverable (next
        :meth:`assign`). One transferred away while leased here keeps its lease: the
        subscriber may still ack it (the ack is journaled and removes it everywhere);
        if the lease ends without an ack, the message goes back to the queue, now not
        owned here, and waits for its new owner. (An owner grants only messages it
        has not leased, see :meth:`may_grant`, so this arises only with proxied
        transfer.) On a ``local`` queue the owner is recorded and changes nothing.

        Returns:
            False when the message is no longer in the queue (acked or expired
            before the grant arrived: nothing to do), else True.
        """
        message = self._messages.get(bookmark)
        if message is None:
            return False
        owned_before = self.owns(message)
        message.owner = new_owner
        owned_now = self.owns(message)
        if owned_before == owned_now:
            return True
        waiting = message.lease is None and not message.barrier
        if owned_now:
            self._owned += 1
            self._transferred_in += 1
            if waiting:
                self._ready_add(message)
        else:
            self._owned -= 1
            self._transferred_out += 1
            if waiting:
                self._ready_discard(message)
        return True

    def may_grant(self, bookmark: str) -> bool:
        """Whether this instance, asked to transfer the message, may grant it as far as
        the queue is concerned: it owns it, it is waiting (not leased, not a barrier),
        and no local subscription can take it now. Whether the request is the first
        one for the message is for the caller to track."""
        message = self._messages.get(bookmark)
        if message is None or not self.owns(message) or message.barrier:
            return False
        if message.lease is not None:
            return False
        return not self._has_taker(message)

    def transfer_candidates(
        self, now: float, min_wait: float, limit: int | None = None
    ) -> list[QueueMessage]:
        """Messages worth asking their owner for: not owned here, waiting (not leased,
        not a barrier, not behind a waiting barrier), here for longer than
        ``min_wait`` seconds (the typical arrival-to-ack time), and matched by a local
        subscription with free backlog. In delivery order, at most the free backlog
        here (and at most ``limit``). Empty on a ``local`` queue.

        Cost: one pass over the queue; for a periodic timer, not for every message.
        """
        if self.policy.kind == "local" or not self._subs:
            return []
        leasing = self.policy.at_least_once
        room = len(self._messages)
        if leasing:
            room = sum(sub.free_backlog for sub in self._subs.values())
            if self.policy.max_backlog is not None:
                room = min(room, self.policy.max_backlog - self._leased)
        if limit is not None:
            room = min(room, limit)
        if room <= 0:
            return []
        barrier = self._barriers[0] if self._barriers else None
        found = [
            message
            for message in self._messages.values()
            if not self.owns(message)
            and message.lease is None
            and not message.barrier
            and (barrier is None or message.txid < barrier)
            and now - message.arrived_at > min_wait
            and self._has_taker(message, check_room=False)
        ]
        found.sort(key=lambda m: (-m.priority, m.txid))
        return found[:room]

    def _has_taker(self, message: QueueMessage, check_room: bool = True) -> bool:
        leasing = self.policy.at_least_once
        if (
            check_room
            and leasing
            and self.policy.max_backlog is not None
            and self._leased >= self.policy.max_backlog
        ):
            return False
        return any(
            (not leasing or sub.free_backlog > 0) and self._matches(sub, message)
            for sub in self._subs.values()
        )

    # ------------------------------------------------------------ statistics

    def statistics(self) -> QueueStatistics:
        """A snapshot of the queue's figures (see :class:`QueueStatistics`)."""
        capacity = sum(sub.backlog for sub in self._subs.values())
        if self.policy.max_backlog is not None:
            capacity = min(capacity, self.policy.max_backlog)
        return QueueStatistics(
            depth=len(self._messages),
            leased=self._leased,
            owned=self._owned,
            waiting_barriers=len(self._barriers),
            subscriptions=len(self._subs),
            backlog_capacity=capacity,
            max_backlog=self.policy.max_backlog,
            delivered=self._delivered,
            acked=self._acked,
            returned=self._returned,
            cancelled=self._cancelled,
            lease_timeouts=self._lease_timeouts,
            expired=self._expired,
            removed_by_peer=self._removed_by_peer,
            transferred_in=self._transferred_in,
            transferred_out=self._transferred_out,
        )

    # ------------------------------------------------------------ internals

    def _ready_add(self, message: QueueMessage) -> None:
        self._ready.add(ready_key(message))

    def _ready_discard(self, message: QueueMessage) -> None:
        self._ready.discard(ready_key(message))

    def _end_lease(self, message: QueueMessage) -> None:
        lease = message.lease
        if lease is None:
            return
        sub = self._subs.get(lease.sub)
        if sub is not None:
            sub.leased.pop(message.bookmark, None)
        self._leased -= 1
        message.lease = None

    def _remove(self, message: QueueMessage) -> None:
        """Take ``message`` out of the queue, whatever its state."""
        del self._messages[message.bookmark]
        del self._by_txid[message.txid]
        if message.lease is not None:
            self._end_lease(message)
        elif not message.barrier:
            self._ready_discard(message)
        if message.barrier:
            index = bisect.bisect_left(self._barriers, message.txid)
            if index < len(self._barriers) and self._barriers[index] == message.txid:
                del self._barriers[index]
        if self.owns(message):
            self._owned -= 1
        if len(self._expiry_heap) > 2 * len(self._messages) + 64:
            self._compact_expiry_heap()

    def _return(self, message: QueueMessage, now: float, cancelled: bool) -> bool:
        """End ``message``'s lease without an ack. True: it is back in the queue;
        False: it expired instead (and is gone)."""
        self._end_lease(message)
        if cancelled:
            message.cancels += 1
        policy = self.policy
        if (
            (policy.max_cancels and message.cancels >= policy.max_cancels)
            or (policy.max_deliveries and message.deliveries >= policy.max_deliveries)
            or (policy.expiration is not None and message.published_at + policy.expiration <= now)
        ):
            self._remove(message)
            self._expired += 1
            return False
        if cancelled:
            self._cancelled += 1
        else:
            self._returned += 1
        if self.owns(message) and not message.barrier:
            self._ready_add(message)
        return True

    def _return_all(self, bookmarks: list[str], now: float) -> Returned:
        result = Returned()
        for bookmark in bookmarks:
            message = self._messages[bookmark]
            if self._return(message, now, cancelled=False):
                result.returned.append(message)
            else:
                result.expired.append(message)
        return result

    def _compact_lease_heap(self) -> None:
        self._lease_heap = [
            entry
            for entry in self._lease_heap
            if (m := self._messages.get(entry[2])) is not None and m.lease is entry[3]
        ]
        heapq.heapify(self._lease_heap)

    def _compact_expiry_heap(self) -> None:
        self._expiry_heap = [
            entry
            for entry in self._expiry_heap
            if (m := self._messages.get(entry[2])) is not None and m.txid == entry[1]
        ]
        heapq.heapify(self._expiry_heap)
