"""Bytes in and out of client connections, within the instance's limits: the acting.

:mod:`amps_py.server.limits` decides who goes and in what words; this module applies
those decisions to the connections, through what each exposes (:class:`FlowSession`):

* :func:`deadline_passed`: a connection missed its LogonTimeout or
  IncompleteMessageTimeout: counted, logged, told why;
* :func:`close_over_incomplete_limit`: unfinished frames hold more than
  IncompleteMessageMemoryLimit: the largest holders are closed;
* :func:`disconnect_slow_clients`: a client is past its ClientMaxCapacity (it is
  disconnected as a slow client), the clients sharing its MessageMemoryLimit pool are
  together past it (the biggest in memory among them are offlined, or disconnected when
  their MessageDiskLimit is 0), or the offline clients sharing a MessageDiskLimit pool
  are together past it (the biggest on disk among them are disconnected). Each client
  uses its transport's pools (:meth:`~amps_py.server.limits.InstanceLimits.pools_for`):
  a pool over its limit only ever acts on the clients that share it, and an offlined
  client spills under its own MessageDiskPath into its own disk pool. A client whose
  bookmark replay runs (:attr:`FlowSession.replaying`) is never offlined (the replay
  paces itself on its outbox); the next biggest is offlined instead;
* :func:`disconnect_if_too_old`: a client's oldest waiting message is past its
  ClientMessageAgeLimit;

These run only when a limit is hit (never per message). No trio: the session does the
reading, writing and closing, so a test drives these with stand-in connections.
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Iterator
from pathlib import Path
from typing import Final, Protocol

from amps_py import events
from amps_py.protocol import PartialFrame, messages

from .limits import (
    BytePool,
    ClientPools,
    Closing,
    Connection,
    InstanceLimits,
    ReadDeadline,
    age_closing,
    deadline_closing,
    incomplete_memory_closing,
    offline_start_line,
    shed,
    slow_client_closing,
)

__all__ = [
    "SEND_CHUNK",
    "FlowSession",
    "close_over_incomplete_limit",
    "deadline_passed",
    "disconnect_if_too_old",
    "disconnect_slow_clients",
]

#: the session's logger: these lines are a connection's, as before they moved here
log = logging.getLogger("amps_py.server.session")

#: the send loop writes at most about this many bytes per ``send_all`` (never one join
#: of a whole backlog), so bytes leave the outbox, and its count, steadily
SEND_CHUNK: Final = 1024 * 1024


class PartialFrames(Protocol):
    def partial_frame(self) -> PartialFrame | None: ...


class FlowSession(Connection, Protocol):
    """What the limits act on of a client connection (:class:`~.session.Session`)."""

    @property
    def decoder(self) -> PartialFrames: ...
    @property
    def logon_timeout(self) -> float: ...
    @property
    def frame_timeout(self) -> float: ...
    @property
    def incomplete_held(self) -> int:
        """Bytes of its unfinished frame counted in IncompleteMessageMemoryLimit."""
        ...

    @property
    def out_bytes(self) -> int:
        """Bytes waiting to be sent to it (counted in MessageMemoryLimit)."""
        ...

    @property
    def memory_held(self) -> int:
        """Bytes waiting for it in memory that offlining it would move to disk."""
        ...

    @property
    def spilled(self) -> int:
        """Bytes waiting for it on disk (counted in MessageDiskLimit)."""
        ...

    @property
    def offline(self) -> bool:
        """Whether its backlog is on disk."""
        ...

    @property
    def queue_limit(self) -> int:
        """Its ClientMaxCapacity (bytes) while online."""
        ...

    @property
    def disk_queue_limit(self) -> int:
        """Its ClientMaxCapacity share of MessageDiskLimit (bytes) while offline."""
        ...

    @property
    def discarding(self) -> bool:
        """Whether it is being disconnected as a slow client (or has ended)."""
        ...

    @property
    def pools(self) -> ClientPools:
        """The memory and disk pools, MessageDiskPath and ClientMessageAgeLimit of its
        transport (its own or the instance's)."""
        ...

    @property
    def replaying(self) -> int:
        """How many of its bookmark replays are running (it is not offlined while any
        is)."""
        ...

    def send(self, data: bytes) -> None: ...

    def close(self, reason: str) -> None: ...

    def drop_partial_frame(self, reason: str) -> None: ...

    def disconnect_slow(self, closing: Closing) -> None: ...

    def oldest_age(self, now: float) -> float:
        """Seconds its oldest message not yet written (queued or being written) has
        waited."""
        ...

    def go_offline(self, directory: Path) -> bool:
        """Spill its backlog under ``directory``; False if that failed (it is then
        being disconnected as a slow client)."""
        ...


def deadline_passed(session: FlowSession, deadline: ReadDeadline, limits: InstanceLimits) -> str:
    """``session`` did not log on, or finish a frame, by ``deadline``: count it, log
    why, queue a failure ack saying so, and return the close reason."""
    if deadline.kind == "logon":
        limits.logon_timeouts += 1
    else:
        limits.incomplete_timeouts += 1
    closing = deadline_closing(
        deadline,
        session,
        logon_timeout=session.logon_timeout,
        frame_timeout=session.frame_timeout,
        partial=session.decoder.partial_frame(),
    )
    log.warning(closing.message, *closing.args, extra=events.extra(closing.event))
    session.send(messages.ack("processed", "failure", reason=closing.reason, detail=closing.detail))
    return closing.reason


def close_over_incomplete_limit(limits: InstanceLimits, sessions: Collection[FlowSession]) -> None:
    """Unfinished frames hold more than IncompleteMessageMemoryLimit: close the
    connections holding the largest until they do not.

    The biggest holder goes rather than the connection whose bytes tipped the pool
    over: a hostile client holding large partial frames goes first, and a small message
    that happens to arrive at the wrong moment is not the victim.
    """
    pool = limits.incomplete
    held_by = ((s, s.incomplete_held) for s in sessions)
    for victim, held, total in shed(held_by, pool.total, pool.limit):
        limits.incomplete_pool += 1
        closing = incomplete_memory_closing(
            victim, held, victim.decoder.partial_frame(), pool, total
        )
        log.warning(closing.message, *closing.args, extra=events.extra(closing.event))
        victim.drop_partial_frame(closing.reason)
        victim.close(closing.reason)


def disconnect_slow_clients(
    session: FlowSession, limits: InstanceLimits, sessions: Collection[FlowSession]
) -> None:
    """``session`` queued bytes past its ClientMaxCapacity, or the clients sharing its
    pools are together past their MessageMemoryLimit or MessageDiskLimit: disconnect
    ``session`` if it is past its own capacity (of memory while online, of disk while
    offline); then, while its memory pool is over, offline the clients sharing that
    pool with the most bytes waiting in memory, passing over those whose bookmark
    replay runs (disconnect them instead when their MessageDiskLimit is 0) and those
    holding less than 1 % of the pool's limit; then, for
    each disk pool that is over (``session``'s, or one a client was just offlined
    into), disconnect the offline clients sharing it with the most bytes spilled.
    ``limits`` keeps the counts (instance-wide).

    When offlining is on and ``session``'s memory pool is over at the same moment, the
    pool acts first and ``session``'s capacity is checked after: a client that is the
    biggest is offlined rather than disconnected (with ClientMaxCapacity 100%, past its
    capacity means past the pool too), and once offline its capacity is its share of
    MessageDiskLimit."""
    pools = session.pools
    pool_first = pools.offlining and pools.memory.total > pools.memory.limit
    if not pool_first:
        _past_own_capacity(session, limits)
    disks = [pools.disk]
    pool = pools.memory
    if pool.total > pool.limit:
        # a client holding less than 1 % of the pool is passed over: offlining it frees
        # next to nothing (when an exempt replay holds most of the pool, it would
        # offline one small client after another, a publisher for its acks)
        floor = max(1, pool.limit // 100)
        holders = ((s, n) for s, n in _memory_holders(pool, sessions) if n >= floor)
        for victim, held, total in shed(holders, pool.total, pool.limit):
            own = victim.pools
            if not own.offlining:
                limits.slow_client_pool += 1
                victim.disconnect_slow(
                    slow_client_closing(victim, queued=held, pool=pool, total=total)
                )
            elif victim.go_offline(own.disk_path):
                limits.offlined += 1
                if all(own.disk is not d for d in disks):  # pools are told apart by identity
                    disks.append(own.disk)
                message, args = offline_start_line(
                    victim, held=held, pool=pool, total=total, path=own.disk_path
                )
                log.warning(message, *args, extra=events.extra(events.CLIENT_OFFLINE_START))
    if pool_first:
        _past_own_capacity(session, limits)
    for disk in disks:
        if disk.total > disk.limit:
            on_disk = (
                (s, s.spilled)
                for s in sessions
                if s.pools.disk is disk and s.offline and not s.discarding
            )
            for victim, held, total in shed(on_disk, disk.total, disk.limit):
                limits.slow_client_disk += 1
                victim.disconnect_slow(
                    slow_client_closing(victim, queued=held, pool=disk, total=total)
                )


def _past_own_capacity(session: FlowSession, limits: InstanceLimits) -> None:
    """Disconnect ``session`` if it is past its own ClientMaxCapacity: of memory while
    online, of its share of MessageDiskLimit while offline."""
    if session.discarding:
        return
    if session.offline:
        if session.spilled > session.disk_queue_limit:
            limits.slow_client_capacity += 1
            session.disconnect_slow(
                slow_client_closing(
                    session,
                    queued=session.spilled,
                    capacity=session.disk_queue_limit,
                    offline=True,
                )
            )
    elif session.out_bytes > session.queue_limit:
        limits.slow_client_capacity += 1
        session.disconnect_slow(
            slow_client_closing(session, queued=session.out_bytes, capacity=session.queue_limit)
        )


def _memory_holders(
    pool: BytePool, sessions: Collection[FlowSession]
) -> Iterator[tuple[FlowSession, int]]:
    """The clients sharing the memory ``pool`` that going over it may act on, with the
    bytes acting on each frees from it: what offlining moves to disk (bytes in memory),
    or for a client that is disconnected instead (MessageDiskLimit 0) all it has
    queued. Not: clients being disconnected, offline ones, and clients that would be
    offlined while a bookmark replay of theirs runs."""
    for s in sessions:
        if s.pools.memory is not pool or s.discarding or s.offline:
            continue
        if not s.pools.offlining:
            yield s, s.out_bytes
        elif not s.replaying:
            yield s, s.memory_held


def disconnect_if_too_old(session: FlowSession, limits: InstanceLimits, now: float) -> bool:
    """Disconnect ``session`` as a slow client if its oldest message not yet written
    has waited longer than its transport's ClientMessageAgeLimit (``session.pools``;
    0: no limit). Returns whether it was disconnected."""
    limit = session.pools.age_limit
    if limit <= 0 or session.discarding:
        return False
    age = session.oldest_age(now)
    if age <= limit:
        return False
    limits.slow_client_age += 1
    session.disconnect_slow(age_closing(session, age=age, limit=limit))
    return True
