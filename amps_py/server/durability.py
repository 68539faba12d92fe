"""Per-publisher persisted-ack bookkeeping: pure (no trio, no I/O).

One :class:`PublisherLedger` per client name that publishes here. It lives on the
instance, not on a connection, so a publisher that reconnects (or a second logon that
takes the name over) finds what its earlier connection still has in flight.

The rules it keeps (docs/GUARANTEES.md, "Persisted acks"):

- A publish is a duplicate only if that exact ``(publisher, seq)`` is journaled or in
  flight; any other seq is stored, also one below the publisher's highest (a client
  that reorders after a failover). :meth:`PublisherLedger.is_pending` answers the "in
  flight" half; the journal's bookmark index answers the other.
- A persisted ack for N never covers a seq below N that this publisher sent here and
  that is neither durable nor settled by a failure ack: the acked seq is the highest
  settled seq, capped below the lowest seq still pending.
- ``high`` bounds every seq this instance holds or has queued for the publisher (from
  any source), so the server's own next seq (a publish without ``s``) never names an
  existing message.

Which records are durable, and when, is :mod:`.durable_window`'s to say; the ledgers
take the seqs it settles.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Container, Iterable, Mapping

from txlog import Record


class PublisherLedger:
    """What one publisher has in flight here and what it was told.

    Attributes:
        high: the highest seq accepted here or known to be held or queued here for
            this publisher; seqs above it take the fast path (no lookup).
        pending: seqs accepted here and not yet durable (queued for the journal, or
            duplicates of a record that is not durable yet), ascending, no repeats.
        done: the highest seq durable here (a seq answered with a failure ack leaves
            ``pending`` without moving it).
        acked: the highest seq already sent in a persisted ack.
        reack: a seq at or below ``acked`` was accepted again (resent after a
            failover): once it is durable, the persisted ack is sent again, so the
            publisher learns it too.
    """

    __slots__ = ("acked", "done", "high", "pending", "reack")

    def __init__(self, held: int, queued: int = 0) -> None:
        """``held``: the highest seq in the journal for this publisher; ``queued``:
        the highest one queued for it (received by replication, not yet committed)."""
        self.high = max(held, queued)
        self.done = held
        self.acked = held
        self.pending: list[int] = []
        self.reack = False

    def accept(self, seq: int) -> None:
        """``seq`` was queued for the journal, or waits for a copy that is not durable."""
        pending = self.pending
        if not pending or seq > pending[-1]:
            pending.append(seq)
        else:
            at = bisect.bisect_left(pending, seq)
            if at == len(pending) or pending[at] != seq:
                pending.insert(at, seq)
        if seq > self.high:
            self.high = seq
        elif seq <= self.acked:
            self.reack = True

    def is_pending(self, seq: int) -> bool:
        pending = self.pending
        if not pending or seq > pending[-1] or seq < pending[0]:
            return False
        at = bisect.bisect_left(pending, seq)
        return pending[at] == seq

    def saw(self, seq: int) -> None:
        """A record of this publisher with ``seq`` is queued or stored here (for
        example received by replication): later server-assigned seqs go above it."""
        if seq > self.high:
            self.high = seq

    def settle(self, seqs: Iterable[int]) -> None:
        """These seqs are durable here."""
        pending = self.pending
        top = self.done
        n = len(pending)
        matched = 0  # the usual case: durable in the order accepted, a prefix
        others: list[int] = []
        for seq in seqs:
            if seq > top:
                top = seq
            if matched < n and pending[matched] == seq:
                matched += 1
            elif n:
                others.append(seq)
        if matched:
            del pending[:matched]
        for seq in others:
            if pending and pending[0] <= seq <= pending[-1]:
                at = bisect.bisect_left(pending, seq)
                if pending[at] == seq:
                    del pending[at]
        self.done = top
        if top > self.high:
            self.high = top

    def resent_durable(self, seq: int) -> None:
        """``seq`` was sent again and is already durable here: settle it, and if an
        ack already covered it, send that ack again (the publisher waits for one)."""
        self.settle((seq,))
        if seq <= self.acked:
            self.reack = True

    def fail(self, seqs: Iterable[int]) -> None:
        """These seqs were not stored (answered with a failure ack): they stop holding
        back acks, and no success ack is sent for them (``done`` does not move)."""
        pending = self.pending
        for seq in seqs:
            if pending and pending[0] <= seq <= pending[-1]:
                at = bisect.bisect_left(pending, seq)
                if pending[at] == seq:
                    del pending[at]

    def safe(self) -> int:
        """The highest seq a persisted ack may carry now."""
        pending = self.pending
        if pending and pending[0] <= self.done:
            return pending[0] - 1
        return self.done

    def advance(self) -> int | None:
        """The seq of the persisted ack to send now, or ``None`` if nothing moved."""
        safe = self.safe()
        if safe > self.acked or (self.reack and safe >= self.acked):
            self.acked = safe
            self.reack = False
            return safe
        return None

    @property
    def idle(self) -> bool:
        """Nothing in flight: the ledger can be rebuilt from the journal if dropped."""
        return not self.pending


class Ledgers:
    """The ledgers of the publishers active here, by publisher hash.

    A ledger is built on first use from what the journal holds for the publisher
    (``held``) and what the writer has queued for it (``queued``), and dropped once
    its publisher left and nothing of it is in flight (it can always be rebuilt).

    Args:
        held: the highest seq the journal holds for a publisher hash.
        queued: the highest seq queued for the journal for a publisher hash.
    """

    def __init__(self, held: Callable[[int], int], queued: Callable[[int], int]) -> None:
        self._held = held
        self._queued = queued
        self._by_hash: dict[int, PublisherLedger] = {}

    def get(self, pub_hash: int) -> PublisherLedger | None:
        return self._by_hash.get(pub_hash)

    def of(self, pub_hash: int) -> PublisherLedger:
        """The publisher's ledger, built on first use."""
        ledger = self._by_hash.get(pub_hash)
        if ledger is None:
            ledger = PublisherLedger(self._held(pub_hash), self._queued(pub_hash))
            self._by_hash[pub_hash] = ledger
        return ledger

    def saw(self, records: Iterable[Record]) -> None:
        """Records of these publishers were queued (received by replication): seqs
        the server assigns later go above theirs."""
        by_hash = self._by_hash
        if not by_hash:
            return
        get = by_hash.get
        for rec in records:
            ledger = get(rec.pub_hash)
            if ledger is not None:
                ledger.saw(rec.seq)

    def settle(self, durable: Mapping[int, list[int]], present: Container[int]) -> list[int]:
        """These seqs are durable. Returns the publisher hashes whose persisted acks
        may advance; the ledger of a publisher not ``present`` (no session) is dropped
        once idle."""
        moved: list[int] = []
        by_hash = self._by_hash
        for ph, seqs in durable.items():
            ledger = by_hash.get(ph)
            if ledger is None:
                continue  # nobody publishing as it here: its ledger starts from the journal
            ledger.settle(seqs)
            if ph in present:
                moved.append(ph)
            elif ledger.idle:
                del by_hash[ph]
        return moved

    def forget_if_idle(self, pub_hash: int) -> None:
        """Its publisher left: drop the ledger unless something is in flight."""
        ledger = self._by_hash.get(pub_hash)
        if ledger is not None and ledger.idle:
            del self._by_hash[pub_hash]
