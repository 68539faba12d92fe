"""The durable window: which committed records are durable by the persisted-ack rule,
and the durable watermark. Pure (no trio, no I/O): commits, the sync destinations'
positions and their routing verdicts are passed in.

The rule (docs/GUARANTEES.md, "Persisted acks" and "Replication"): a record is
*durable* once it is committed here and acknowledged by every sync destination that it
is routed to (:mod:`amps_py.replication.routing` decides: topic, message type, content
filter, passthrough, loop prevention). A destination that the record is not routed to,
and an async (or downgraded) one, never holds it. Once durable, a record stays durable:
an upgrade, a reconnect or a new verdict afterwards only concerns records not durable yet.

Two things follow from it:

- **per record**: what the persisted acks to publishers may cover
  (:attr:`Release.settled`, fed to :class:`~.durability.Ledgers`). A record published
  to a topic no sync destination replicates is durable at its commit, whatever waits
  before it;
- **the watermark** :attr:`DurableWindow.durable_txid`: the highest txid through which
  *every* record is durable. ``fully_durable`` subscriptions, bookmark replay for them
  and the bookmark subscriptions' persisted acks follow it (in journal order: a
  subscriber resumes after one bookmark, so it may not see a record before an earlier
  one that is not durable yet).

How it is kept, at a cost that follows live state (the records not durable yet), never
the journal's history:

- each commit's records are routed once per sync destination (a cached verdict per
  (topic, type, origin, path); the payload only for a content filter) and each routed
  one joins that destination's queue of *held* records, in txid order, with a count of
  the destinations holding it;
- an acknowledgement pops the destination's queue up to its acked txid; a record whose
  count drops to zero is durable (amortised O(1) per held record);
- the watermark advances over the front of the window while the front record is not
  held (each record passes once);
- only when a destination becomes sync (an upgrade, or first seen), when what decides
  its routing changes (:attr:`SyncHolder.routing_key`: the remote instance's name,
  learned at connect, drives loop prevention) or when its acked txid moves back (a
  resync from a peer that lost records) is its queue rebuilt: from the window's records
  not durable yet, which are in memory.

A destination that stops being sync (downgraded) releases at once what only it held.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

from txlog import Record

__all__ = ["DurableWindow", "Release", "SyncHolder"]


class SyncHolder(Protocol):
    """A replication destination whose acknowledgements persisted acks wait for now (a
    ``sync`` destination, not downgraded), as the window sees it."""

    @property
    def name(self) -> str:
        """Unique among the instance's destinations; the window keeps its state by it."""
        ...

    @property
    def acked_txid(self) -> int:
        """The local txid through which the destination has acknowledged the stream
        (records not routed to it included)."""
        ...

    @property
    def routing_key(self) -> object:
        """Changes whenever :meth:`routed` may answer differently for the same records
        (the window then routes its held records to it again)."""
        ...

    def routed(self, records: Sequence[Record]) -> list[int]:
        """The indexes, ascending, of the ``records`` routed to this destination."""
        ...


@dataclass
class Release:
    """What became durable: per publisher the seqs (for persisted acks), and the
    records the watermark passed, in txid order (for ``fully_durable`` subscriptions).
    A record is in ``settled`` once, when it becomes durable, and in ``records`` once,
    when the watermark passes it (possibly later)."""

    settled: dict[int, list[int]] = field(default_factory=dict)
    records: list[Record] = field(default_factory=list)


@dataclass
class _Holder:
    """The window's view of one sync destination."""

    routing_key: object
    #: the acked txid last seen
    acked: int
    #: the records routed to it, not durable yet and after ``acked``, in txid order
    held: deque[Record]


class DurableWindow:
    """The records committed here after the durable watermark, in txid order, which of
    them each sync destination holds (see the module doc), and the publishes the
    journal found already stored, waiting for the copy it holds.

    In: each commit (:meth:`committed`) and each change of the sync destinations (an
    acknowledgement, a connect, a downgrade or upgrade: :meth:`advance`), each with the
    destinations that are sync now. Out: :class:`Release` of what became durable;
    :attr:`durable_txid` and :attr:`last_bookmark` say where the watermark is,
    :meth:`is_durable` answers for one record, :meth:`held_by` how many records wait
    for one destination.

    Args:
        durable_txid: the watermark to start from (the journal's newest txid when it
            opens: what is already stored counts as durable).
        last_bookmark: the bookmark at ``durable_txid``.
    """

    def __init__(self, durable_txid: int = 0, last_bookmark: str = "") -> None:
        self.durable_txid = durable_txid
        self.last_bookmark = last_bookmark
        #: the newest txid committed, as far as the window was told
        self._committed = durable_txid
        #: the records after the watermark, in txid order
        self._pending: deque[Record] = deque()
        #: txid -> how many sync destinations hold the record (only records held)
        self._holds: dict[int, int] = {}
        self._holders: dict[str, _Holder] = {}
        #: txid of a held record -> (publisher, seq) of publishes found to duplicate it
        self._duplicates: dict[int, list[tuple[int, int]]] = {}
        #: (txid bound, publisher, seq) of duplicates whose copy was not found: settled
        #: once the watermark reaches the bound
        self._dropped: deque[tuple[int, int, int]] = deque()

    # ------------------------------------------------------------------ questions
    @property
    def waiting(self) -> bool:
        """Whether anything waits for the sync destinations."""
        return bool(self._pending or self._dropped or self._duplicates)

    @property
    def holds_records(self) -> bool:
        """Whether the watermark is behind the newest commit."""
        return bool(self._pending)

    def is_durable(self, txid: int) -> bool:
        """Whether the record committed here at ``txid`` is durable (0: a record
        journal removal deleted, durable long ago). A txid the window has not been
        told is committed is not."""
        return txid <= self.durable_txid or (txid <= self._committed and txid not in self._holds)

    def held_by(self, name: str) -> int:
        """How many records routed to destination ``name`` wait for its
        acknowledgement (0 when it is not sync)."""
        holder = self._holders.get(name)
        return len(holder.held) if holder is not None else 0

    # ------------------------------------------------------------------ events
    def committed(
        self,
        records: Sequence[Record],
        dropped: Sequence[tuple[int, int, int | None]],
        committed_txid: int,
        holders: Sequence[SyncHolder],
    ) -> Release:
        """A commit stored ``records`` (in txid order, after every earlier commit's)
        through ``committed_txid``, and found ``dropped`` already stored: publishes
        (publisher hash, seq, txid of the copy stored, or ``None`` if it was not
        found). ``holders``: the destinations that are sync now."""
        release = Release()
        self._committed = committed_txid
        if holders or self._holders:
            self._sync(holders, release)
        holds = self._holds
        held_now = False
        if holders and records:
            states = self._holders
            for holder in holders:
                routed = holder.routed(records)
                if not routed:
                    continue
                state = states[holder.name]
                acked, queue = state.acked, state.held
                for index in routed:
                    rec = records[index]
                    if rec.txid > acked:
                        holds[rec.txid] = holds.get(rec.txid, 0) + 1
                        queue.append(rec)
                        held_now = True
        settled = release.settled
        if not held_now and not self._pending:
            # the common case: nothing waits, the commit is durable as it is
            if records:
                release.records.extend(records)
                self.durable_txid = records[-1].txid
                self.last_bookmark = records[-1].bookmark
            for rec in records:
                _settle(settled, rec.pub_hash, rec.seq)
        else:
            for rec in records:
                if rec.txid not in holds:
                    _settle(settled, rec.pub_hash, rec.seq)
            self._pending.extend(records)
        for pub_hash, seq, txid in dropped:
            if txid is None or txid > committed_txid:
                # where the copy is is unknown: durable once everything committed is
                self._dropped.append((committed_txid, pub_hash, seq))
            elif txid in holds:
                self._duplicates.setdefault(txid, []).append((pub_hash, seq))
            else:
                _settle(settled, pub_hash, seq)
        self._advance_watermark(release)
        return release

    def advance(self, holders: Sequence[SyncHolder]) -> Release:
        """The sync destinations acknowledged more, or changed (``holders``: those
        that are sync now): release what is durable now."""
        release = Release()
        self._sync(holders, release)
        self._advance_watermark(release)
        return release

    # ------------------------------------------------------------------ inside
    def _sync(self, holders: Sequence[SyncHolder], release: Release) -> None:
        """Bring each destination's held records up to date with its acked txid and
        routing, drop the destinations no longer sync; what no destination holds any
        more goes into ``release``."""
        states = self._holders
        for holder in holders:
            name = holder.name
            acked = holder.acked_txid
            key = holder.routing_key
            state = states.get(name)
            if state is not None and state.routing_key == key and acked >= state.acked:
                if acked > state.acked:
                    state.acked = acked
                    held = state.held
                    if held and held[0].txid <= acked:
                        self._acknowledged(held, acked, release)
                continue
            # new (first seen, or sync again), routed differently, or acked moved back:
            # what it holds now is what of the records not durable yet it is routed
            holds = self._holds
            candidates = [r for r in self._pending if r.txid > acked and r.txid in holds]
            queue: deque[Record] = deque()
            if candidates:
                queue.extend(candidates[i] for i in holder.routed(candidates))
            for rec in queue:
                holds[rec.txid] += 1
            states[name] = _Holder(key, acked, queue)
            if state is not None:
                for rec in state.held:
                    self._unhold(rec, release)
        if len(states) > len(holders):
            current = {holder.name for holder in holders}
            for name in [n for n in states if n not in current]:
                # no longer sync (downgraded): it holds nothing any more
                for rec in states.pop(name).held:
                    self._unhold(rec, release)

    def _acknowledged(self, queue: deque[Record], acked: int, release: Release) -> None:
        """A destination acknowledged through ``acked``: it stops holding the records
        at the front of its ``queue`` up to there (:meth:`_unhold`, inlined: this is
        the per-record path of every acknowledgement)."""
        holds = self._holds
        settled = release.settled
        duplicates = self._duplicates
        while queue and queue[0].txid <= acked:
            rec = queue.popleft()
            txid = rec.txid
            left = holds[txid] - 1
            if left:
                holds[txid] = left
                continue
            del holds[txid]
            seqs = settled.get(rec.pub_hash)
            if seqs is None:
                settled[rec.pub_hash] = [rec.seq]
            else:
                seqs.append(rec.seq)
            if duplicates and txid in duplicates:
                for pub_hash, seq in duplicates.pop(txid):
                    _settle(settled, pub_hash, seq)

    def _unhold(self, rec: Record, release: Release) -> None:
        """One destination stops holding ``rec``; durable when none holds it any more."""
        holds = self._holds
        txid = rec.txid
        left = holds[txid] - 1
        if left:
            holds[txid] = left
            return
        del holds[txid]
        settled = release.settled
        _settle(settled, rec.pub_hash, rec.seq)
        duplicates = self._duplicates.pop(txid, None)
        if duplicates is not None:
            for pub_hash, seq in duplicates:
                _settle(settled, pub_hash, seq)

    def _advance_watermark(self, release: Release) -> None:
        """Move the watermark over the records at the front of the window that no
        destination holds; settle the duplicates waiting for it."""
        pending = self._pending
        holds = self._holds
        if pending and pending[0].txid not in holds:
            out = release.records
            while pending and pending[0].txid not in holds:
                out.append(pending.popleft())
            self.durable_txid = out[-1].txid
            self.last_bookmark = out[-1].bookmark
        dropped = self._dropped
        if dropped:
            bound = self.durable_txid if pending else self._committed
            while dropped and dropped[0][0] <= bound:
                _, pub_hash, seq = dropped.popleft()
                _settle(release.settled, pub_hash, seq)


def _settle(settled: dict[int, list[int]], pub_hash: int, seq: int) -> None:
    seqs = settled.get(pub_hash)
    if seqs is None:
        settled[pub_hash] = [seq]
    else:
        seqs.append(seq)
