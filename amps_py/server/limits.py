"""Memory and time limits on client connections: the bookkeeping and the decisions.

Byte pools and per-connection deadlines keep one client (or many hostile ones) from
holding the instance's memory or sockets. The slow-client pools and policies
(MessageMemoryLimit, MessageDiskLimit, MessageDiskPath, ClientMessageAgeLimit) are the
instance's, shared by every client transport, unless a Transport sets its own: that
transport then gets its own pool (or directory, or age limit) for that setting and
shares the instance's for the others (:meth:`InstanceLimits.pools_for`,
:class:`ClientPools`). "All clients together" below means all clients sharing that
pool; ClientMaxCapacity is a share of the pool its transport's clients use.

* ``MessageMemoryLimit``: bytes waiting in memory to be sent to all clients together.
  A client past its own ``ClientMaxCapacity`` is disconnected as a slow client. When
  the pool is over its limit the client with the most bytes waiting in memory is
  *offlined*: its backlog moves to a spill file under ``MessageDiskPath`` and drains
  from there in order; it comes back online by itself once it has caught up. (With
  ``MessageDiskLimit`` 0 it is disconnected as a slow client instead.) A client whose
  bookmark replay is running (:attr:`~amps_py.server.flow.FlowSession.replaying`) is
  never offlined: the replay paces itself on the client's outbox, so the next biggest
  goes instead; its live subscriptions make it a candidate again once no replay of it
  runs.
* ``MessageDiskLimit``: bytes spilled for all offline clients together. Past it the
  offline client with the most spilled bytes is disconnected as a slow client (and its
  spill file removed); so is a client whose backlog could not be spilled or read back.
* ``ClientMessageAgeLimit``: a client whose oldest message not yet written to it has
  waited longer is disconnected as a slow client (:func:`age_closing`).
* ``IncompleteMessageMemoryLimit``: bytes of frames received in part, over all client
  connections. When it is over, the connection holding the largest partial frame is
  closed (see :func:`biggest`).
* ``LogonTimeout`` and ``IncompleteMessageTimeout`` (per transport): a connection
  must log on, and must finish a frame once its first byte arrived, in time
  (:func:`read_deadline`).

Which connections go, and in what words, is decided here too (:func:`shed`,
:func:`deadline_closing`, :func:`incomplete_memory_closing`, :func:`slow_client_closing`):
each returns a :class:`Closing` with the close reason, the failure ack's detail and the
log line, so the words are tested without a connection.

Pure logic: no trio, no sockets; the current time is passed in. The session
(:mod:`amps_py.server.session`) does the reading, writing and closing.
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, Protocol, TypeVar

from amps_py import events, reasons
from amps_py.protocol import PartialFrame

if TYPE_CHECKING:
    from amps_py.config import TransportConfig

__all__ = [
    "CLOSE_FLUSH_TIMEOUT",
    "MIN_DEFAULT_MESSAGE_DISK_LIMIT",
    "SLOW_CLIENT_FLUSH_TIMEOUT",
    "BytePool",
    "ClientPools",
    "Closing",
    "Connection",
    "InstanceLimits",
    "PoolSettings",
    "ReadDeadline",
    "age_closing",
    "biggest",
    "deadline_closing",
    "incomplete_memory_closing",
    "message_disk_limit",
    "offline_start_line",
    "read_deadline",
    "shed",
    "slow_client_closing",
    "spill_failed_closing",
]

#: How long a connection being closed by the server may take to write what it still
#: sends (a failure ack) before its socket is closed anyway.
CLOSE_FLUSH_TIMEOUT: Final = 1.0
#: How long a slow client being disconnected has to read the frames already being
#: written and the ``slow client`` notice before its socket is closed anyway. Longer
#: than CLOSE_FLUSH_TIMEOUT: it is behind by definition, and what it was owed is
#: already dropped, so the wait costs a socket and no memory.
SLOW_CLIENT_FLUSH_TIMEOUT: Final = 5.0

#: the default MessageDiskLimit is this or MessageMemoryLimit, whichever is more
MIN_DEFAULT_MESSAGE_DISK_LIMIT: Final = 1024**3

T = TypeVar("T")


def message_disk_limit(configured: int | None, message_memory_limit: int) -> int:
    """The MessageDiskLimit in force: the configured bytes (0: never offline, disconnect
    instead), else ``max(1 GiB, MessageMemoryLimit)``."""
    if configured is not None:
        return configured
    return max(MIN_DEFAULT_MESSAGE_DISK_LIMIT, message_memory_limit)


@dataclass
class BytePool:
    """Bytes held by many connections against one limit.

    Holders add and release their own bytes (``total`` is a plain int so the hot path
    can update it inline); the pool is over when ``total > limit``.

    Attributes:
        setting: the config element that sets ``limit``, for log lines.
        limit: bytes.
        total: bytes held now.
        peak: the highest ``total`` so far (holders update it when they add bytes).
    """

    setting: str
    limit: int
    total: int = 0
    peak: int = 0

    @property
    def over(self) -> bool:
        return self.total > self.limit

    def note_peak(self) -> None:
        if self.total > self.peak:
            self.peak = self.total

    def statistics(self) -> dict[str, Any]:
        return {"bytes": self.total, "limit_bytes": self.limit, "peak_bytes": self.peak}


def biggest(holders: Iterable[tuple[T, int]]) -> tuple[T, int] | None:
    """The holder with the most bytes (the first of equals), or None if none holds any.

    This is who goes when a pool is over its limit: one decision that frees the most
    memory, and never a small holder while a bigger one stays.
    """
    best: tuple[T, int] | None = None
    for holder, held in holders:
        if held > 0 and (best is None or held > best[1]):
            best = (holder, held)
    return best


def shed(holders: Iterable[tuple[T, int]], total: int, limit: int) -> list[tuple[T, int, int]]:
    """Who goes while a pool holds ``total`` bytes over ``limit``: the biggest holder
    first (the first of equals), then the next biggest, until the bytes of those gone
    bring the pool to its limit. Holders of no bytes never go.

    Returns (holder, its bytes, the pool's total before it goes) for each, in order:
    the caller frees each holder's bytes from the pool as it closes it.
    """
    gone: list[tuple[T, int, int]] = []
    # a stable sort keeps the first of equals first, as repeated :func:`biggest` would
    for holder, held in sorted(((h, n) for h, n in holders if n > 0), key=lambda x: -x[1]):
        if total <= limit:
            break
        gone.append((holder, held, total))
        total -= held
    return gone


class Connection(Protocol):
    """What the log lines name of a client connection."""

    @property
    def conn_id(self) -> int: ...
    @property
    def client_name(self) -> str: ...
    @property
    def peer(self) -> str: ...
    @property
    def transport(self) -> str: ...


@dataclass(frozen=True)
class Closing:
    """Why the server closes a connection, in its words.

    Attributes:
        reason: the close reason (and the failure ack's ``reason``).
        detail: the failure ack's ``detail`` (what the client is told).
        event: the log event (:mod:`amps_py.events`).
        message: the log line's %-format; ``args`` its arguments.
    """

    reason: str
    detail: str
    event: str
    message: str
    args: tuple[Any, ...]


def deadline_closing(
    deadline: ReadDeadline,
    conn: Connection,
    *,
    logon_timeout: float,
    frame_timeout: float,
    partial: PartialFrame | None,
) -> Closing:
    """The close of ``conn`` at a :class:`ReadDeadline`: no logon within LogonTimeout
    (``kind`` ``logon``), or a frame (``partial``) unfinished within
    IncompleteMessageTimeout."""
    if deadline.kind == "logon":
        return Closing(
            reasons.LOGON_TIMEOUT,
            f"no logon within {logon_timeout:g} s of connecting (LogonTimeout of "
            f"transport {conn.transport}); log on first",
            events.CLIENT_LOGON_TIMEOUT,
            "closing connection %d from %s: no logon within LogonTimeout of %g s (transport %s)",
            (conn.conn_id, conn.peer, logon_timeout, conn.transport),
        )
    received = partial.received if partial else 0
    expected = str(partial.expected) if partial and partial.expected is not None else "unknown"
    return Closing(
        reasons.INCOMPLETE_MESSAGE_TIMEOUT,
        f"a frame was still incomplete ({received} of {expected} bytes) "
        f"{frame_timeout:g} s after its first byte (IncompleteMessageTimeout "
        f"of transport {conn.transport})",
        events.CLIENT_INCOMPLETE_MESSAGE_TIMEOUT,
        "closing connection %d (client %r, %s): it sent %d of %s bytes of a frame "
        "and did not finish it within IncompleteMessageTimeout of %g s (transport %s)",
        (
            conn.conn_id,
            conn.client_name,
            conn.peer,
            received,
            expected,
            frame_timeout,
            conn.transport,
        ),
    )


def incomplete_memory_closing(
    conn: Connection, held: int, partial: PartialFrame | None, pool: BytePool, total: int
) -> Closing:
    """The close of ``conn``, holding the largest unfinished frame (``held`` bytes)
    while unfinished frames hold ``total`` bytes, over ``pool``'s limit (as decided by
    :func:`shed`). The connection is sent no failure ack (``detail`` is the reason)."""
    expected = partial.expected if partial and partial.expected is not None else "?"
    return Closing(
        reasons.INCOMPLETE_MESSAGE_MEMORY_LIMIT,
        reasons.INCOMPLETE_MESSAGE_MEMORY_LIMIT,
        events.CLIENT_INCOMPLETE_MESSAGE_MEMORY,
        "closing connection %d (client %r, %s): its unfinished frame holds %d of %s "
        "bytes, the largest of all connections, and unfinished frames together hold "
        "%d bytes, over IncompleteMessageMemoryLimit of %d bytes",
        (conn.conn_id, conn.client_name, conn.peer, held, expected, total, pool.limit),
    )


def slow_client_closing(
    conn: Connection,
    *,
    queued: int,
    capacity: int | None = None,
    pool: BytePool | None = None,
    total: int = 0,
    offline: bool = False,
) -> Closing:
    """The disconnect of a slow client with ``queued`` bytes waiting: past its own
    ClientMaxCapacity (``capacity``; for an ``offline`` client, its share of
    MessageDiskLimit and ``queued`` its spilled bytes), or the biggest while all clients
    together hold ``total`` bytes, over ``pool``'s limit (MessageMemoryLimit, or
    MessageDiskLimit for spilled bytes)."""
    if capacity is not None and offline:
        why = (
            f"it is offline with {queued} bytes spilled to disk, over its ClientMaxCapacity "
            f"share of MessageDiskLimit ({capacity} bytes)"
        )
    elif capacity is not None:
        why = (
            f"{queued} bytes wait to be sent to it, over its ClientMaxCapacity of {capacity} bytes"
        )
    else:
        assert pool is not None, "give the client's capacity or the pool it is over"
        why = (
            f"it has the most bytes waiting ({queued}) and all clients together have "
            f"{total}, over {pool.setting} of {pool.limit} bytes"
        )
    return Closing(
        reasons.SLOW_CLIENT,
        f"disconnected as a slow client: {why}; resume by bookmark",
        events.CLIENT_SLOW_DISCONNECTED,
        "disconnecting client %r (connection %d, %s) as a slow client: %s; it can "
        "resume by bookmark",
        (conn.client_name, conn.conn_id, conn.peer, why),
    )


def offline_start_line(
    conn: Connection, *, held: int, pool: BytePool, total: int, path: Path
) -> tuple[str, tuple[Any, ...]]:
    """The log line (%-format, arguments) of offlining ``conn``: it held the most bytes
    in memory (``held``) while all clients together held ``total``, over ``pool``'s
    limit; its backlog now spills under ``path``."""
    return (
        "offlined client %r (connection %d, %s): it had the most bytes waiting in "
        "memory (%d) and all clients together have %d, over %s of %d bytes; its "
        "backlog spills to %s until it catches up",
        (conn.client_name, conn.conn_id, conn.peer, held, total, pool.setting, pool.limit, path),
    )


def age_closing(conn: Connection, *, age: float, limit: float) -> Closing:
    """The disconnect of a client whose oldest message not yet written to it has
    waited ``age`` seconds, over ClientMessageAgeLimit (``limit`` seconds)."""
    why = (
        f"its oldest message has waited {age:.1f} s to be sent, over ClientMessageAgeLimit "
        f"of {limit:g} s"
    )
    return Closing(
        reasons.SLOW_CLIENT,
        f"disconnected as a slow client: {why}; resume by bookmark",
        events.CLIENT_SLOW_DISCONNECTED,
        "disconnecting client %r (connection %d, %s) as a slow client: %s; it can "
        "resume by bookmark",
        (conn.client_name, conn.conn_id, conn.peer, why),
    )


def spill_failed_closing(conn: Connection, error: Exception) -> Closing:
    """The disconnect of a client whose backlog could not be spilled or read back
    (``error``: a SpillError naming the file and the fix)."""
    why = f"its backlog could not be kept on disk: {error}"
    return Closing(
        reasons.SLOW_CLIENT,
        "disconnected as a slow client: the server could not keep its backlog on disk; "
        "resume by bookmark",
        events.CLIENT_SLOW_DISCONNECTED,
        "disconnecting client %r (connection %d, %s) as a slow client: %s; it can "
        "resume by bookmark",
        (conn.client_name, conn.conn_id, conn.peer, why),
    )


@dataclass(frozen=True)
class ReadDeadline:
    """When a connection's next read must have ended what it is waiting for.

    ``kind`` is ``"logon"`` (no logon yet) or ``"frame"`` (a frame is unfinished).
    """

    at: float
    kind: str


def read_deadline(
    *,
    logon_deadline: float | None,
    partial: PartialFrame | None,
    frame_timeout: float,
) -> ReadDeadline | None:
    """The earliest deadline that applies to a connection now, or None.

    Args:
        logon_deadline: when the connection must have logged on, or None once it has.
        partial: the frame its decoder holds in part (``since`` on the same clock),
            or None.
        frame_timeout: seconds a frame may take from its first byte.
    """
    found: ReadDeadline | None = None
    if logon_deadline is not None:
        found = ReadDeadline(logon_deadline, "logon")
    if partial is not None:
        at = partial.since + frame_timeout
        if found is None or at < found.at:
            found = ReadDeadline(at, "frame")
    return found


@dataclass(frozen=True)
class PoolSettings:
    """A client transport's own slow-client settings; ``None``: the instance's.

    Attributes:
        memory_limit: its MessageMemoryLimit in bytes.
        disk_limit: its MessageDiskLimit in bytes (0: its clients are disconnected
            instead of offlined).
        disk_path: its MessageDiskPath.
        age_limit: its ClientMessageAgeLimit in seconds.
    """

    memory_limit: int | None = None
    disk_limit: int | None = None
    disk_path: Path | None = None
    age_limit: float | None = None

    @classmethod
    def of(cls, transport: TransportConfig) -> PoolSettings:
        """The settings a Transport's config gives itself."""
        path = transport.message_disk_path
        return cls(
            transport.message_memory_limit,
            transport.message_disk_limit,
            Path(path) if path is not None else None,
            transport.client_message_age_limit,
        )

    @property
    def own_any(self) -> bool:
        """Whether it sets any of them (else its transport uses the instance's)."""
        return any(
            v is not None
            for v in (self.memory_limit, self.disk_limit, self.disk_path, self.age_limit)
        )


@dataclass(frozen=True, eq=False)
class ClientPools:
    """The pools and policies the clients of one transport use: the instance's
    objects, or the transport's own where it sets one (two transports share a pool
    exactly when they hold the same :class:`BytePool` object).

    Attributes:
        memory: the MessageMemoryLimit pool (bytes waiting in memory).
        disk: the MessageDiskLimit pool (bytes spilled by offline clients).
        disk_path: the MessageDiskPath directory of the spill files.
        age_limit: ClientMessageAgeLimit in seconds (0: none).
        own: the settings the transport gives itself (all ``None`` for the instance's).
    """

    memory: BytePool
    disk: BytePool
    disk_path: Path
    age_limit: float
    own: PoolSettings = field(default_factory=PoolSettings)

    @property
    def offlining(self) -> bool:
        """Whether a client over the memory pool is offlined (not disconnected): its
        MessageDiskLimit is not 0."""
        return self.disk.limit > 0

    def statistics(self, instance: ClientPools) -> dict[str, Any]:
        """What the admin API shows of a transport's pools; ``own`` says whether a
        pool or setting is the transport's, else the ``instance``'s (whose figures,
        shared with other transports, these are)."""
        return {
            "queued": {**self.memory.statistics(), "own": self.memory is not instance.memory},
            "offline": {
                "spilled_bytes": self.disk.total,
                "limit_bytes": self.disk.limit,
                "peak_bytes": self.disk.peak,
                "own": self.disk is not instance.disk,
                "path": str(self.disk_path),
                "own_path": self.own.disk_path is not None,
            },
            "client_message_age_limit_s": self.age_limit,
            "own_client_message_age_limit": self.own.age_limit is not None,
        }


class InstanceLimits:
    """The instance's byte pools, the transports' own ones, and the counts of
    connections they offlined or closed (instance-wide, whichever pool acted).

    Args:
        message_memory_limit: MessageMemoryLimit in bytes (waiting in memory to be sent).
        incomplete_limit: IncompleteMessageMemoryLimit in bytes (partial frames).
        disk_limit: MessageDiskLimit in bytes (spilled for offline clients); 0 turns
            offlining off; None: :func:`message_disk_limit`'s default.
        disk_path: MessageDiskPath, the directory of spill files; None: the system's
            temporary directory (:func:`tempfile.gettempdir`).
        age_limit: ClientMessageAgeLimit in seconds; 0: no age limit.
        transports: the client transports that set their own slow-client settings,
            by name (see :meth:`pools_for`).
    """

    def __init__(
        self,
        message_memory_limit: int,
        incomplete_limit: int,
        disk_limit: int | None = None,
        disk_path: Path | None = None,
        age_limit: float = 0.0,
        transports: Mapping[str, PoolSettings] | None = None,
    ) -> None:
        self.queued = BytePool("MessageMemoryLimit", message_memory_limit)
        self.incomplete = BytePool("IncompleteMessageMemoryLimit", incomplete_limit)
        disk = message_disk_limit(disk_limit, message_memory_limit)
        self.disk = BytePool("MessageDiskLimit", disk)
        self.disk_path = disk_path if disk_path is not None else Path(tempfile.gettempdir())
        #: clients offline now (their backlog on disk)
        self.offline_clients = 0
        #: times a client was offlined
        self.offlined = 0
        #: clients disconnected because offline clients together passed MessageDiskLimit
        self.slow_client_disk = 0
        #: clients disconnected because their backlog could not be spilled or read back
        self.slow_client_spill_errors = 0
        #: ClientMessageAgeLimit (seconds; 0: none)
        self.age_limit = age_limit
        #: clients disconnected because a message waited past ClientMessageAgeLimit
        self.slow_client_age = 0
        #: clients disconnected because they passed their own ClientMaxCapacity
        self.slow_client_capacity = 0
        #: clients disconnected because the MessageMemoryLimit pool was over
        self.slow_client_pool = 0
        #: connections closed because a frame was not finished in time
        self.incomplete_timeouts = 0
        #: connections closed because they did not log on in time
        self.logon_timeouts = 0
        #: connections closed because the IncompleteMessageMemoryLimit pool was over
        self.incomplete_pool = 0
        #: what a client of a transport without settings of its own uses
        self.instance_pools = ClientPools(self.queued, self.disk, self.disk_path, age_limit)
        self._transport_pools = {
            name: self._own_pools(name, own)
            for name, own in (transports or {}).items()
            if own.own_any
        }

    def _own_pools(self, transport: str, own: PoolSettings) -> ClientPools:
        """The pools of ``transport``: its own for what it sets, the instance's else."""
        memory = self.queued
        if own.memory_limit is not None:
            memory = BytePool(f"MessageMemoryLimit of transport {transport}", own.memory_limit)
        disk = self.disk
        if own.disk_limit is not None or own.memory_limit is not None:
            # a pool of its own for its offline clients: sized by its own memory limit
            # when it gives no MessageDiskLimit (the instance's default rule)
            disk = BytePool(
                f"MessageDiskLimit of transport {transport}",
                message_disk_limit(own.disk_limit, memory.limit),
            )
        return ClientPools(
            memory,
            disk,
            own.disk_path if own.disk_path is not None else self.disk_path,
            own.age_limit if own.age_limit is not None else self.age_limit,
            own,
        )

    def pools_for(self, transport: str) -> ClientPools:
        """The pools and policies of a client of ``transport``: the transport's own
        MessageMemoryLimit pool when it sets one, its own MessageDiskLimit pool when it
        sets MessageDiskLimit or MessageMemoryLimit (default then:
        :func:`message_disk_limit` of its memory limit), its MessageDiskPath and
        ClientMessageAgeLimit when set; the instance's objects for the rest (an
        unknown transport gets the instance's)."""
        return self._transport_pools.get(transport, self.instance_pools)

    @property
    def offlining(self) -> bool:
        """Whether the biggest client is offlined (not disconnected) over the instance's
        MessageMemoryLimit: its MessageDiskLimit is not 0."""
        return self.instance_pools.offlining

    def statistics(self) -> dict[str, Any]:
        """What the admin API shows (``/amps/instance/limits``)."""
        return {
            "queued": {
                **self.queued.statistics(),
                "slow_client_disconnects": {
                    "client_max_capacity": self.slow_client_capacity,
                    "message_memory_limit": self.slow_client_pool,
                    "message_disk_limit": self.slow_client_disk,
                    "spill_errors": self.slow_client_spill_errors,
                    "client_message_age_limit": self.slow_client_age,
                },
            },
            "offline": {
                "clients": self.offline_clients,
                "offlined": self.offlined,
                "spilled_bytes": self.disk.total,
                "limit_bytes": self.disk.limit,
                "peak_bytes": self.disk.peak,
                "path": str(self.disk_path),
            },
            "incomplete_messages": {
                **self.incomplete.statistics(),
                "closed_over_limit": self.incomplete_pool,
                "closed_timeout": self.incomplete_timeouts,
            },
            "logon_timeouts": self.logon_timeouts,
            # the transports with a pool or policy of their own
            "transports": {
                name: pools.statistics(self.instance_pools)
                for name, pools in self._transport_pools.items()
            },
        }
