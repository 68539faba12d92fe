"""The configuration's option objects: frozen dataclasses and the constants they use.

What :func:`amps_py.config.load_config` returns and the rest of amps-py reads: an
:class:`InstanceConfig` and the option objects it holds (transports, the transaction log,
log targets, replication destinations, authentication, entitlement, actions), with their
defaults. This module knows nothing of XML and imports no lxml, so code that only reads a
configuration (routing, link validation, the server) does not load the XML machinery.

Two parts live in their own modules and are re-exported here, so every name stays
importable from ``amps_py.config.model``: the replication link credentials
(:class:`LinkAuthenticator`, :class:`LinkCredentialsError`, :func:`read_password_file`,
in ``amps_py.config.credentials``), :class:`SowTopicConfig` (in
``amps_py.config.sow_model``) and :class:`QueueConfig` (in ``amps_py.config.queue_model``).
None of them imports lxml either.
"""

from __future__ import annotations

import contextlib
import os
import re
import ssl
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

from amps_py import auth
from amps_py.config.credentials import (
    DEFAULT_LINK_AUTHENTICATOR as DEFAULT_LINK_AUTHENTICATOR,
)
from amps_py.config.credentials import (
    PASSWORD_LINK_AUTHENTICATOR as PASSWORD_LINK_AUTHENTICATOR,
)
from amps_py.config.credentials import LinkAuthenticator as LinkAuthenticator
from amps_py.config.credentials import LinkCredentialsError as LinkCredentialsError
from amps_py.config.credentials import read_password_file as read_password_file
from amps_py.config.queue_model import QueueConfig as QueueConfig
from amps_py.config.sow_model import ConflatedTopicConfig as ConflatedTopicConfig
from amps_py.config.sow_model import SowTopicConfig as SowTopicConfig
from amps_py.message_types import MessageTypes, default_types

# ----------------------------------------------------------------------------- constants

#: Default largest frame a client may send on a transport (AMPS has no documented
#: default; 16 MiB is far above normal messages and still bounds a hostile sender).
DEFAULT_MAX_MESSAGE_SIZE: Final = 16 * 1024**2
#: How long a new client connection may take to log on (amps-py's Transport/LogonTimeout;
#: AMPS has no such setting). AMPS clients log on as soon as they connect, so 30 s is
#: generous, and it still closes connections that never say anything.
DEFAULT_LOGON_TIMEOUT: Final = 30.0
#: How long a client may take to send one frame once its first byte has arrived
#: (Transport/IncompleteMessageTimeout): 16 MiB (the default MaxMessageSize) at about
#: 2 Mbit/s. A frame not complete by then is a stalled or hostile sender.
DEFAULT_INCOMPLETE_MESSAGE_TIMEOUT: Final = 60.0
#: Default IncompleteMessageMemoryLimit: bytes of unfinished frames all client
#: connections together may hold. The default is this or twice the largest client
#: MaxMessageSize, whichever is more.
DEFAULT_INCOMPLETE_MESSAGE_MEMORY_LIMIT: Final = 256 * 1024**2
#: Default ClientMaxCapacity: AMPS's 50% of MessageMemoryLimit, but at most
#: MAX_DEFAULT_CLIENT_CAPACITY while a backlog can only live in memory (no offlining).
DEFAULT_CLIENT_MAX_CAPACITY: Final = 0.5
MAX_DEFAULT_CLIENT_CAPACITY: Final = 512 * 1024**2
#: MessageMemoryLimit when the host's memory cannot be read.
FALLBACK_MESSAGE_MEMORY_LIMIT: Final = 1024**3
#: AMPS documents 100ms as the default FlushInterval, allowed from 1us to 1000ms.
DEFAULT_FLUSH_INTERVAL: Final = 0.1
MIN_FLUSH_INTERVAL: Final = 1e-6
MAX_FLUSH_INTERVAL: Final = 1.0
#: AMPS's default journal file (segment) size and its documented minimum.
DEFAULT_JOURNAL_SIZE: Final = 1024**3
MIN_JOURNAL_SIZE: Final = 10 * 1000**2
DEFAULT_PREALLOCATED_JOURNAL_FILES: Final = 2
#: LMDB reserves address space, not disk, for the map: a large default costs nothing
#: and avoids MapFullError on busy instances.
DEFAULT_MAP_SIZE: Final = 64 * 1024**3
#: Below this LMDB has hardly room for its own pages; a smaller map is always a mistake.
MIN_MAP_SIZE: Final = 1024**2
#: Instance names prefix files and travel in replication paths; keep them short.
MAX_NAME_LENGTH: Final = 64
#: A replicated record whose publisher seq is more than this above the highest seq the
#: instance holds for that publisher is logged (15-0011) and counted; see
#: ``Transport/SequenceGapThreshold`` in config/amps.xsd.
DEFAULT_SEQUENCE_GAP_THRESHOLD: Final = 100_000
#: Connections a client transport keeps open at most (``Transport/MaxConnections``,
#: an amps-py element): far above what one instance serves well, and still below the
#: file descriptors a process is usually allowed.
DEFAULT_MAX_CLIENT_CONNECTIONS: Final = 10_000
#: The same for the replication transport: one connection per upstream instance (two
#: briefly while a link reconnects) is what a fabric needs.
DEFAULT_MAX_REPLICATION_CONNECTIONS: Final = 100

#: The transport Type of the one listener that accepts replication from upstream instances.
REPLICATION_TRANSPORT_TYPE: Final = "amps-replication"
#: The same listener over TLS (an instance has at most one of either kind).
REPLICATION_SECURE_TRANSPORT_TYPE: Final = "amps-replication-secure"
#: Transport Types that accept replication from upstream instances.
REPLICATION_TRANSPORT_TYPES: Final = frozenset(
    {REPLICATION_TRANSPORT_TYPE, REPLICATION_SECURE_TRANSPORT_TYPE}
)
#: Transport Types that speak TLS and so need a Certificate and a PrivateKey.
SECURE_TRANSPORT_TYPES: Final = frozenset({"tcps", REPLICATION_SECURE_TRANSPORT_TYPE})
#: The oldest TLS version a secure listener or a secure replication link accepts:
#: TLS 1.0 and 1.1 are deprecated (RFC 8996).
MIN_TLS_VERSION: Final = ssl.TLSVersion.TLSv1_2
#: How long a replication destination may hold back its acks to batch them (seconds).
DEFAULT_ACK_CONFLATION_INTERVAL: Final = 0.01
#: Back-off between rounds of failed connection attempts to a destination (seconds);
#: the last value repeats.
DEFAULT_RECONNECT_TIMEOUTS: Final[tuple[float, ...]] = (1.0, 2.0, 4.0, 8.0)
#: How often an idle replication link sends a heartbeat (seconds); a link silent for 5
#: intervals is dropped and reconnected.
DEFAULT_HEARTBEAT_INTERVAL: Final = 1.0
#: The checks a replication link runs when it connects (AMPS's names), in AMPS's order.
REPLICATION_VALIDATION_CHECKS: Final[tuple[str, ...]] = (
    "txlog",
    "replicate",
    "sow",
    "cascade",
    "queue",
    "keys",
    "replicate_filter",
    "queue_passthrough",
    "queue_underlying",
)
#: Checks that ExcludeValidation may not name: without them a replicated queue could
#: lose or duplicate messages.
NON_EXCLUDABLE_VALIDATION_CHECKS: Final = frozenset({"queue", "queue_underlying"})

#: AMPS log levels, least severe first. ``none`` disables a target.
LOG_LEVELS: Final[tuple[str, ...]] = (
    "developer",
    "trace",
    "stats",
    "info",
    "warning",
    "error",
    "critical",
    "emergency",
    "none",
)


_REGEX_METACHARACTERS = frozenset(".^$*+?{}[]\\|()")
#: journals() caches answers per (topic, message type); topics can be unbounded
#: (per-order topics), so the cache is dropped when it reaches this size.
_JOURNAL_CACHE_LIMIT = 65_536


# ---------------------------------------------------------------------- option objects


@dataclass(frozen=True)
class ClientCapacity:
    """``ClientMaxCapacity``: how many bytes may wait to be sent to one client.

    AMPS gives it as a share of ``MessageMemoryLimit`` (``fraction``, from ``50%``);
    amps-py also accepts a byte size (``size``, from ``64MB``). Exactly one is set.
    """

    fraction: float | None = None
    size: int | None = None

    def of(self, message_memory_limit: int) -> int:
        """The limit in bytes for an instance whose MessageMemoryLimit is given."""
        if self.size is not None:
            return self.size
        return max(1, int(message_memory_limit * (self.fraction or 0.0)))

    def __str__(self) -> str:
        if self.size is not None:
            return f"{self.size} bytes"
        return f"{(self.fraction or 0.0) * 100:g}%"


def default_message_memory_limit() -> int:
    """AMPS's default MessageMemoryLimit: 10% of the memory this process may use (the
    host's RAM, or less when ``ulimit -m`` or the cgroup memory limit says so);
    :data:`FALLBACK_MESSAGE_MEMORY_LIMIT` when none of these can be read."""
    candidates: list[int] = []
    with contextlib.suppress(ValueError, OSError, AttributeError):
        candidates.append(os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))
    try:
        import resource

        soft = resource.getrlimit(resource.RLIMIT_RSS)[0]
        if soft > 0 and soft != resource.RLIM_INFINITY:
            candidates.append(soft)
    except (ImportError, ValueError, OSError):
        pass
    try:
        text = Path("/sys/fs/cgroup/memory.max").read_text().strip()
        if text.isdigit():
            candidates.append(int(text))
    except OSError:
        pass
    usable = [c for c in candidates if c > 0]
    return min(usable) // 10 if usable else FALLBACK_MESSAGE_MEMORY_LIMIT


@dataclass(frozen=True)
class TransportConfig:
    """A listener (``AMPSConfig/Transports/Transport``).

    Attributes:
        name: unique within the instance.
        type: ``tcp`` for clients (``tcps`` over TLS), or ``amps-replication``
            (``amps-replication-secure`` over TLS) for the (at most one) listener that
            accepts replication from upstream instances.
        host: address to bind; ``0.0.0.0`` when InetAddr is a bare port, an IPv6
            address without brackets (``::1``) when given as ``[::1]:port``.
        port: 0 to 65535; 0 asks the OS for a free port, which the server reports.
        protocol: ``amps`` (``json`` in the XML is accepted as another name for it);
            ``amps-replication`` for the replication listener, whatever the XML says.
        message_type: the only message type allowed on this transport, or ``None``
            for any (always ``None`` for the replication listener).
        max_message_size: the largest frame a client may send, in bytes.
        enabled: whether the transport listens at start (``InitialState``).
        certificate: for ``tcps``/``amps-replication-secure``: the PEM certificate
            chain file (checked to load with ``private_key`` when the config is
            loaded); ``None`` for plain transports.
        private_key: the PEM private key of ``certificate``, or ``None``.
        ciphers: an OpenSSL cipher string limiting the TLS 1.2 ciphers, or ``None``
            for OpenSSL's defaults.
        authentication: ``Transport/Authentication``: who may log on over this
            transport (clients; on the replication transport, upstream instances);
            ``None``: ``AMPSConfig/Authentication`` applies (see
            :meth:`InstanceConfig.authentication_of`).
        entitlement: ``Transport/Entitlement``: what users logged on over this
            transport may do (on the replication transport: which may replicate in);
            ``None``: ``AMPSConfig/Entitlement`` applies (see
            :meth:`InstanceConfig.entitlement_of`).
        sequence_gap_threshold: for the replication transport
            (``SequenceGapThreshold``): a received record whose publisher seq is more
            than this above the highest this instance holds for that publisher is
            logged and counted; 0 turns the check off.
        logon_timeout: seconds a new client connection has to log on before it is
            closed (client transports only).
        incomplete_message_timeout: seconds a client has to finish a frame once its
            first byte arrived (client transports only).
        client_max_capacity: this transport's ClientMaxCapacity, or ``None`` for the
            instance's; a share of the MessageMemoryLimit pool its clients use (of its
            MessageDiskLimit pool once offline).
        message_memory_limit: this transport's MessageMemoryLimit in bytes (its
            clients get a memory pool of their own), or ``None``: they share the
            instance's (client transports only, like the three below).
        message_disk_limit: this transport's MessageDiskLimit in bytes (a disk pool of
            its own; 0: its clients are disconnected instead of offlined), or ``None``:
            the instance's, unless it sets MessageMemoryLimit (then a pool of its own of
            max(1 GiB, its MessageMemoryLimit)).
        message_disk_path: this transport's MessageDiskPath, or ``None``: the instance's.
        client_message_age_limit: this transport's ClientMessageAgeLimit in seconds, or
            ``None``: the instance's.
        max_connections: ``MaxConnections``: connections open at once on this
            transport, or ``None`` for the default (:attr:`connection_limit`); one more
            is closed as soon as it is accepted.
    """

    name: str
    type: str
    host: str
    port: int
    protocol: str
    message_type: str | None
    max_message_size: int = DEFAULT_MAX_MESSAGE_SIZE
    enabled: bool = True
    certificate: Path | None = None
    private_key: Path | None = None
    ciphers: str | None = None
    authentication: AuthenticationConfig | None = None
    entitlement: EntitlementConfig | None = None
    sequence_gap_threshold: int = DEFAULT_SEQUENCE_GAP_THRESHOLD
    logon_timeout: float = DEFAULT_LOGON_TIMEOUT
    incomplete_message_timeout: float = DEFAULT_INCOMPLETE_MESSAGE_TIMEOUT
    client_max_capacity: ClientCapacity | None = None
    message_memory_limit: int | None = None
    message_disk_limit: int | None = None
    message_disk_path: str | None = None
    client_message_age_limit: float | None = None
    #: send persisted acks to every client that publishes with ``s``, asked or not
    always_persisted_acks: bool = False
    max_connections: int | None = None

    @property
    def connection_limit(self) -> int:
        """The connections this transport keeps open at most: its MaxConnections, else
        :data:`DEFAULT_MAX_CLIENT_CONNECTIONS` (client transports) or
        :data:`DEFAULT_MAX_REPLICATION_CONNECTIONS` (the replication transport)."""
        if self.max_connections is not None:
            return self.max_connections
        if self.is_replication:
            return DEFAULT_MAX_REPLICATION_CONNECTIONS
        return DEFAULT_MAX_CLIENT_CONNECTIONS

    @property
    def secure(self) -> bool:
        """Whether clients (or upstream instances) connect over TLS."""
        return self.type in SECURE_TRANSPORT_TYPES

    @property
    def is_replication(self) -> bool:
        """Whether this is the listener for upstream instances (plain or secure)."""
        return self.type in REPLICATION_TRANSPORT_TYPES

    def ssl_context(self) -> ssl.SSLContext | None:
        """A new server-side TLS context for this listener, or ``None`` if it is plain.

        Raises:
            OSError, ssl.SSLError: the files cannot be loaded (the loader has checked
                them, so only a file changed since then fails here).
        """
        if not self.secure or self.certificate is None or self.private_key is None:
            return None
        return server_ssl_context(self.certificate, self.private_key, self.ciphers)

    @property
    def address(self) -> str:
        """``host:port`` as written in InetAddr, with brackets around IPv6 hosts."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.port}"


@dataclass(frozen=True)
class ServerTls:
    """The TLS settings of a listener that is not a Transport (the admin interface):
    the same Certificate, PrivateKey and Ciphers a tcps Transport takes, checked by the
    loader the same way."""

    certificate: Path
    private_key: Path
    ciphers: str | None = None

    def ssl_context(self) -> ssl.SSLContext:
        """A new server-side TLS context (see :func:`server_ssl_context`).

        Raises:
            OSError, ssl.SSLError: the files cannot be loaded (changed since the
                configuration was loaded).
        """
        return server_ssl_context(self.certificate, self.private_key, self.ciphers)


@dataclass(frozen=True)
class JournalTopic:
    """A ``TransactionLog/Topic``: which topics of which message type are journaled.

    ``name`` is a literal topic when it contains no regular-expression metacharacter,
    otherwise a regular expression that must match the whole topic (``orders`` matches
    only ``orders``; ``orders.*`` matches ``orders`` and ``orders/new``).

    Raises:
        re.error: ``name`` has metacharacters but is not a valid regular expression
            (the loader reports this as a ConfigProblem before constructing one).
    """

    name: str
    message_type: str
    _pattern: re.Pattern[str] | None = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        literal = not (_REGEX_METACHARACTERS & set(self.name))
        object.__setattr__(self, "_pattern", None if literal else re.compile(self.name))

    def matches(self, topic: str, message_type: str) -> bool:
        """Whether a message on ``topic`` with ``message_type`` is covered by this entry."""
        if message_type != self.message_type:
            return False
        if self._pattern is None:
            return topic == self.name
        return self._pattern.fullmatch(topic) is not None


@dataclass(frozen=True)
class TransactionLogConfig:
    """The journal (``AMPSConfig/TransactionLog``).

    Attributes:
        journal_directory: where the LMDB environment lives; relative paths are
            relative to the server's working directory, as in AMPS.
        topics: what is journaled; an empty tuple journals nothing.
        flush_interval: seconds a partial batch may wait before commit (1us..1s).
        journal_size: target size of one journal segment, in bytes (at least 10MB,
            as in AMPS).
        archive_directory: where archived segments go (``JournalArchiveDirectory``);
            ``None`` when not configured (archiving is then refused).
        durability: ``fsync`` (every commit is fsynced before a persisted ack) or
            ``page-cache`` (not fsynced: survives a process crash, not a power loss;
            opt-in and reported by the admin status).
        compression: ``none`` or ``zstd`` (payloads compressed in the journal).
        map_size: the LMDB map size in bytes, the most the journal can hold.
        preallocated_journal_files: AMPS's PreallocatedJournalFiles (segments to
            prepare ahead); accepted for compatibility, at least 1.
    """

    journal_directory: Path
    topics: tuple[JournalTopic, ...] = ()
    flush_interval: float = DEFAULT_FLUSH_INTERVAL
    journal_size: int = DEFAULT_JOURNAL_SIZE
    durability: str = "fsync"
    compression: str = "none"
    map_size: int = DEFAULT_MAP_SIZE
    preallocated_journal_files: int = DEFAULT_PREALLOCATED_JOURNAL_FILES
    archive_directory: Path | None = None
    _journal_cache: dict[tuple[str, str], bool] = field(
        default_factory=dict, init=False, repr=False, compare=False
    )

    def journals(self, topic: str, message_type: str) -> bool:
        """Whether messages on ``topic`` with ``message_type`` are written to the journal.

        Answers are cached per (topic, message type), so the publish path pays for the
        regular expressions once per topic.
        """
        key = (topic, message_type)
        cache = self._journal_cache
        answer = cache.get(key)
        if answer is None:
            answer = any(t.matches(topic, message_type) for t in self.topics)
            if len(cache) >= _JOURNAL_CACHE_LIMIT:
                cache.clear()
            cache[key] = answer
        return answer


#: On modules amps-py runs, and the Options each requires
ACTION_ON_MODULES: Final[Mapping[str, tuple[str, ...]]] = {
    "amps-action-on-schedule": ("Every",),
    "amps-action-on-startup": (),
    "amps-action-on-shutdown": (),
    "amps-action-on-signal": ("Signal",),
    "amps-action-on-connect-client": (),
    "amps-action-on-admin": ("Path",),
    "amps-action-on-logon-client": (),
    "amps-action-on-disconnect-client": (),
    "amps-action-on-offline-start": (),
    "amps-action-on-offline-stop": (),
    "amps-action-on-connect-replication": (),
    "amps-action-on-disconnect-replication": (),
    "amps-action-on-replication-resync-complete": (),
    "amps-action-on-downgrade-replication": (),
    "amps-action-on-upgrade-replication": (),
    "amps-action-on-sow-expire-message": ("Topic", "MessageType"),
}
#: If modules amps-py runs, and the Options each requires
ACTION_IF_MODULES: Final[Mapping[str, tuple[str, ...]]] = {
    "amps-action-if-condition": ("Condition",),
    "amps-action-if-file-system-usage": ("Path",),
}
#: Do modules amps-py runs, and the Options each requires
ACTION_DO_MODULES: Final[Mapping[str, tuple[str, ...]]] = {
    "amps-action-do-downgrade-replication": ("Age",),
    "amps-action-do-upgrade-replication": ("Age",),
    "amps-action-do-archive-journal": ("Age",),
    "amps-action-do-compress-journal": ("Age",),
    "amps-action-do-remove-journal": ("Age",),
    "amps-action-do-publish-message": ("Topic",),
    "amps-action-do-disable-transport": ("Transport",),
    "amps-action-do-enable-transport": ("Transport",),
    "amps-action-do-enable-proxied-transfer": ("Topic", "MessageType"),
    "amps-action-do-disable-proxied-transfer": ("Topic", "MessageType"),
    "amps-action-do-rotate-logs": (),
    "amps-action-do-shutdown": (),
    "amps-action-do-nothing": (),
}


@dataclass(frozen=True)
class ActionModule:
    """One ``On`` or ``Do`` of an Action: the module and its Options as text."""

    module: str
    options: Mapping[str, str]
    line: int = 0


@dataclass(frozen=True)
class ActionConfig:
    """One ``Actions/Action``: when any of ``on`` fires and every ``conditions`` (the
    ``If`` modules) holds, run ``do`` in order."""

    on: tuple[ActionModule, ...]
    do: tuple[ActionModule, ...]
    line: int = 0
    conditions: tuple[ActionModule, ...] = ()


@dataclass(frozen=True)
class LogTarget:
    """One ``AMPSConfig/Logging/Target``.

    Attributes:
        protocol: ``stdout``, ``stderr`` or ``file``.
        level: log this level and everything more severe (one of :data:`LOG_LEVELS`);
            ``none`` logs nothing by level. Defaults to ``info`` when the XML gives
            neither Level nor Levels, and to ``none`` when it gives only Levels.
        levels: further individual levels to log.
        file_name: for ``file``: the name mask (strftime tokens, ``%n`` counter).
        rotation_threshold: for ``file``: bytes after which the next ``%n`` file starts.
        include_errors: event codes logged whatever their level (comma list of codes or
            regular expressions), as written.
        exclude_errors: event codes never logged (wins over include), as written.
    """

    protocol: str
    level: str = "info"
    levels: tuple[str, ...] = ()
    file_name: str | None = None
    rotation_threshold: int | None = None
    include_errors: str | None = None
    exclude_errors: str | None = None


@dataclass(frozen=True)
class ReplicationTopic:
    """A ``Replication/Destination/Topic``: which messages go to a destination.

    ``name`` follows the :class:`JournalTopic` rule (a literal topic unless it contains a
    regular-expression metacharacter, then a regular expression that must match the
    whole topic); ``None`` (no Name in the XML) covers every topic of ``message_type``.

    Attributes:
        name: the topic or topic regex, or ``None`` for every topic.
        message_type: a name in :attr:`InstanceConfig.message_types`, e.g. ``json``.
        filter: a content filter (checked to compile when loaded); only messages that
            match it are replicated. ``None`` replicates every message of the topic.
        exclude_validation: validation checks (from
            :data:`REPLICATION_VALIDATION_CHECKS`) skipped for these topics when the
            link connects, in the order written, without duplicates.

    Raises:
        re.error: ``name`` has metacharacters but is not a valid regular expression
            (the loader reports this as a ConfigProblem before constructing one).
    """

    name: str | None
    message_type: str
    filter: str | None = None
    exclude_validation: tuple[str, ...] = ()
    _pattern: re.Pattern[str] | None = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        name = self.name
        regex = name is not None and bool(_REGEX_METACHARACTERS & set(name))
        object.__setattr__(self, "_pattern", re.compile(name) if name and regex else None)

    def matches(self, topic: str, message_type: str) -> bool:
        """Whether ``topic`` with ``message_type`` is covered (the Filter is not applied)."""
        if message_type != self.message_type:
            return False
        if self.name is None:
            return True
        if self._pattern is None:
            return topic == self.name
        return self._pattern.fullmatch(topic) is not None


@dataclass(frozen=True)
class DestinationConfig:
    """One ``Replication/Destination``: an outgoing replication link.

    Attributes:
        name: the destination's label, unique in the instance (usually the remote
            instance's Name); used in logs and in the link's client name.
        group: the Group the remote instance must have, or ``None`` to accept any.
        sync_type: ``sync`` (persisted acks to publishers wait for this destination)
            or ``async``.
        topics: what is replicated; a message goes out when any entry matches it.
        passthrough: regular expressions searched for (``re.search``, as AMPS's
            ``^NYC`` example implies) in the Group of the instance a replicated message
            was received from; a match forwards that message here as well. Messages
            published directly to this instance ignore them.
        inet_addrs: the remote instance's replication listener as (host, port) pairs,
            failover equivalents in priority order; a bare port in the XML means
            ``127.0.0.1``. Empty: wait for the remote instance to connect.
        reconnect_timeouts: seconds to wait after a round in which every address
            failed; round n waits ``reconnect_timeouts[n]``, the last value repeating
            (counted after the quick retries of :mod:`amps_py.replication.backoff`).
        ack_conflation_interval: seconds the destination may hold back its acks.
        compression: ``none`` or ``zstd`` (the stream to this destination is
            compressed; the receiver detects it).
        heartbeat_interval: seconds between heartbeats on an idle link; a link silent
            for 5 intervals is dropped and reconnected.
        secure: connect over TLS (Transport Type ``amps-replication-secure``).
        ca_file: for ``secure``: the PEM file of CA certificates the peer's certificate
            must chain to (Transport ``Certificate``); ``None``: the system's default
            CAs, so a peer with a self-signed certificate needs ``ca_file`` pointing at
            that certificate.
        server_name: for ``secure``: the name the peer's certificate must be issued
            for (Transport ``ServerName``); ``None``: the host of the InetAddr being
            connected to.
        authenticator: the credentials the link logs on with
            (``Transport/Authenticator``); ``None``: none are sent.
        archived_queues: (queue name, message type) of this instance's queues that the
            destination carries as an archive (:meth:`QueueConfig.carried_by`): its
            Topic entries cover a queue's underlying topic but not the queue's name.
            The queue's acknowledgement and ownership records (journaled on the queue's
            name) go to it with the messages, so the archive holds what left the queue
            as well as what entered it. Derived by the loader from the queues
            (:func:`archived_queues`); not written in the XML.
        line: the line of the ``<Destination>`` element, for messages; not compared.
    """

    name: str
    group: str | None
    sync_type: str
    topics: tuple[ReplicationTopic, ...]
    passthrough: tuple[str, ...] = ()
    inet_addrs: tuple[tuple[str, int], ...] = ()
    reconnect_timeouts: tuple[float, ...] = DEFAULT_RECONNECT_TIMEOUTS
    ack_conflation_interval: float = DEFAULT_ACK_CONFLATION_INTERVAL
    compression: str = "none"
    heartbeat_interval: float = DEFAULT_HEARTBEAT_INTERVAL
    secure: bool = False
    ca_file: Path | None = None
    server_name: str | None = None
    authenticator: LinkAuthenticator | None = None
    archived_queues: tuple[tuple[str, str], ...] = ()
    line: int | None = field(default=None, compare=False)
    _passthrough_patterns: tuple[re.Pattern[str], ...] = field(
        init=False, repr=False, compare=False
    )

    def __post_init__(self) -> None:
        patterns = tuple(re.compile(p) for p in self.passthrough)
        object.__setattr__(self, "_passthrough_patterns", patterns)

    @property
    def sync(self) -> bool:
        """Whether persisted acks wait for this destination (``SyncType`` sync)."""
        return self.sync_type == "sync"

    def replicates(self, topic: str, message_type: str) -> bool:
        """Whether any Topic entry covers ``topic`` (Filters are not applied here)."""
        return any(t.matches(topic, message_type) for t in self.topics)

    def passes_through(self, group: str) -> bool:
        """Whether a message received from an instance in ``group`` is forwarded here."""
        return any(p.search(group) is not None for p in self._passthrough_patterns)

    def reconnect_delay(self, round_number: int) -> float:
        """Seconds to wait after failed round ``round_number`` (0-based) of attempts."""
        timeouts = self.reconnect_timeouts or DEFAULT_RECONNECT_TIMEOUTS
        return timeouts[min(max(round_number, 0), len(timeouts) - 1)]


def archived_queues(
    topics: tuple[ReplicationTopic, ...], queues: tuple[QueueConfig, ...]
) -> tuple[tuple[str, str], ...]:
    """(name, message type) of the ``queues`` a Destination with Topic entries
    ``topics`` carries as an archive (see :attr:`DestinationConfig.archived_queues`)."""
    return tuple((q.name, q.message_type) for q in queues if q.carried_by(topics) == "archive")


@dataclass(frozen=True)
class AuthenticationConfig:
    """``AMPSConfig/Authentication``: who may log on (see :mod:`amps_py.auth`).

    Attributes:
        module: ``amps-default-authentication-module`` or ``amps-password-file``.
        password_file: for ``amps-password-file``: the file of users and scrypt hashes,
            as written in the config (checked to exist and parse when loaded).
    """

    module: str = auth.DEFAULT_AUTHENTICATION_MODULE
    password_file: Path | None = None


@dataclass(frozen=True)
class EntitlementConfig:
    """``AMPSConfig/Entitlement``: what users may do (see :mod:`amps_py.auth`).

    Attributes:
        module: ``amps-default-entitlement-module`` or ``amps-rule-entitlement``.
        rules_file: for ``amps-rule-entitlement``: the JSON rules file (checked to
            exist and parse when loaded).
    """

    module: str = auth.DEFAULT_ENTITLEMENT_MODULE
    rules_file: Path | None = None


@dataclass(frozen=True)
class InstanceConfig:
    """A whole instance configuration (``AMPSConfig``).

    Attributes:
        name: the instance name (no path separators, at most 64 characters).
        group: the replication group; equals ``name`` unless the XML sets Group.
        description: free text, empty by default.
        transports: every listener in file order: the client ones and at most one
            ``amps-replication`` or ``amps-replication-secure`` one (see
            :attr:`client_transports` and :attr:`replication_transport`).
        transaction_log: the journal settings, or ``None`` when not configured.
        logging: the log targets; empty means nothing is logged.
        source: the file the config came from, or ``"<embedded default>"``/``"<string>"``.
        process_name: ``ProcessName`` when given.
        replication: the outgoing replication links, in file order.
        authentication: the logon check of every transport without its own (and of
            the admin API); the default module lets everyone on.
        entitlement: the per-user rights on every transport without its own (and on
            the admin API); the default module allows everything.
        sow_topics: the SOW topics (see :meth:`sow_topic`).
        queues: the queues (see :meth:`queue`).
        message_types: every message type the instance knows, by name: AMPS's
            defaults (fix, nvfix, xml, json, msgpack, bson, binary) and what
            ``MessageTypes`` adds or changes.
    """

    name: str
    group: str
    description: str
    transports: tuple[TransportConfig, ...]
    transaction_log: TransactionLogConfig | None
    logging: tuple[LogTarget, ...]
    source: str
    process_name: str | None = None
    replication: tuple[DestinationConfig, ...] = ()
    authentication: AuthenticationConfig = field(default_factory=AuthenticationConfig)
    entitlement: EntitlementConfig = field(default_factory=EntitlementConfig)
    #: ``Admin/InetAddr`` as (host, port); ``None``: no admin interface
    admin: tuple[str, int] | None = None
    #: ``Admin``'s Certificate, PrivateKey and Ciphers: the admin API is served over
    #: HTTPS; ``None``: plain HTTP
    admin_tls: ServerTls | None = None
    #: ``Actions/Action``, in file order
    actions: tuple[ActionConfig, ...] = ()
    #: ``MessageMemoryLimit`` in bytes; ``None``: :func:`default_message_memory_limit`
    message_memory_limit: int | None = None
    #: ``ClientMaxCapacity`` at instance level; ``None``: the default (see
    #: :meth:`client_capacity`)
    client_max_capacity: ClientCapacity | None = None
    #: ``IncompleteMessageMemoryLimit`` in bytes; ``None``: the default (see
    #: :meth:`incomplete_message_budget`)
    incomplete_message_memory_limit: int | None = None
    #: ``MessageDiskLimit`` in bytes (0: never offline a client, disconnect it);
    #: ``None``: max(1 GiB, MessageMemoryLimit)
    message_disk_limit: int | None = None
    #: ``MessageDiskPath``, the directory of offline clients' spill files; ``None``:
    #: the system's temporary directory
    message_disk_path: str | None = None
    #: ``ClientMessageAgeLimit`` in seconds; 0: no age limit
    client_message_age_limit: float = 0.0
    #: ``SOW/Topic``, in file order (names are unique)
    sow_topics: tuple[SowTopicConfig, ...] = ()
    #: ``SOW/ConflatedTopic`` (or ``ReplicaDefinition``), in file order (names are
    #: unique, and no SOW topic's or queue's)
    conflated_topics: tuple[ConflatedTopicConfig, ...] = ()
    #: ``SOW/Queue`` (or ``QueueDefinition``), ``SOW/GroupLocalQueue`` and
    #: ``SOW/LocalQueue``, in file order (names are unique, and no SOW topic's)
    queues: tuple[QueueConfig, ...] = ()
    #: ``MessageTypes`` added to the defaults (:func:`amps_py.message_types.default_types`)
    message_types: MessageTypes = field(default_factory=default_types)
    _sow_by_name: dict[str, SowTopicConfig] = field(
        init=False, repr=False, compare=False, default_factory=dict
    )
    _queue_by_name: dict[str, QueueConfig] = field(
        init=False, repr=False, compare=False, default_factory=dict
    )

    def __post_init__(self) -> None:
        self._sow_by_name.update((t.name, t) for t in self.sow_topics)
        self._queue_by_name.update((q.name, q) for q in self.queues)

    def sow_topic(self, topic: str) -> SowTopicConfig | None:
        """The SOW topic named exactly ``topic`` (its Name, a Pattern topic's too), or
        ``None`` when it is not one."""
        return self._sow_by_name.get(topic)

    def sow_topic_holding(self, topic: str) -> SowTopicConfig | None:
        """The SOW topic whose records ``topic``'s publishes are: the one without
        Pattern named ``topic``, else the first (in file order) whose Pattern matches
        it; ``None``: ``topic`` keeps no State of the World."""
        found = self._sow_by_name.get(topic)
        if found is not None and found.pattern is None:
            return found
        return next((t for t in self.sow_topics if t.pattern is not None and t.holds(topic)), None)

    def sow_pattern(self, pattern: str) -> SowTopicConfig | None:
        """The SOW topic whose Pattern is ``pattern`` (as written), or ``None``."""
        return next((t for t in self.sow_topics if t.pattern == pattern), None)

    def queue(self, topic: str) -> QueueConfig | None:
        """The queue named exactly ``topic`` (its Name, not its underlying topic), or
        ``None`` when it is not one."""
        return self._queue_by_name.get(topic)

    def message_memory_budget(self) -> int:
        """Bytes that may wait to be sent to all clients together (MessageMemoryLimit)."""
        if self.message_memory_limit is not None:
            return self.message_memory_limit
        return default_message_memory_limit()

    def client_capacity(self, transport: TransportConfig | None, pool: int) -> int:
        """Bytes that may wait to be sent to one client of ``transport``, for a
        MessageMemoryLimit of ``pool``: the transport's ClientMaxCapacity, else the
        instance's, else 50% of ``pool`` capped at 512 MiB."""
        capacity = (transport.client_max_capacity if transport else None) or (
            self.client_max_capacity
        )
        if capacity is not None:
            return capacity.of(pool)
        return min(MAX_DEFAULT_CLIENT_CAPACITY, int(pool * DEFAULT_CLIENT_MAX_CAPACITY))

    def incomplete_message_budget(self) -> int:
        """Bytes of unfinished frames all client connections together may hold
        (IncompleteMessageMemoryLimit; default: 256 MiB or twice the largest client
        MaxMessageSize, whichever is more)."""
        if self.incomplete_message_memory_limit is not None:
            return self.incomplete_message_memory_limit
        largest = max((t.max_message_size for t in self.client_transports), default=0)
        return max(DEFAULT_INCOMPLETE_MESSAGE_MEMORY_LIMIT, 2 * largest)

    @property
    def replication_transport(self) -> TransportConfig | None:
        """The ``amps-replication`` (or ``-secure``) listener upstream instances connect
        to, if any."""
        for transport in self.transports:
            if transport.is_replication:
                return transport
        return None

    @property
    def replication_authentication(self) -> AuthenticationConfig:
        """Who may replicate into this instance: the replication transport's own
        ``Authentication`` if it has one, else ``AMPSConfig/Authentication``."""
        return self.authentication_of(self.replication_transport)

    @property
    def replication_entitlement(self) -> EntitlementConfig:
        """Which upstream users may replicate in (``replication_logon``): the
        replication transport's own ``Entitlement`` if it has one, else
        ``AMPSConfig/Entitlement``."""
        return self.entitlement_of(self.replication_transport)

    def authentication_of(self, transport: TransportConfig | None) -> AuthenticationConfig:
        """The Authentication that checks logons over ``transport``: its own, else the
        instance's (as in AMPS; ``None``: the instance's)."""
        if transport is not None and transport.authentication is not None:
            return transport.authentication
        return self.authentication

    def entitlement_of(self, transport: TransportConfig | None) -> EntitlementConfig:
        """The Entitlement that decides for users logged on over ``transport``: its
        own, else the instance's (as in AMPS; ``None``: the instance's)."""
        if transport is not None and transport.entitlement is not None:
            return transport.entitlement
        return self.entitlement

    @property
    def client_transports(self) -> tuple[TransportConfig, ...]:
        """The listeners for clients: every transport but the replication one (tcp,
        tcps)."""
        return tuple(t for t in self.transports if not t.is_replication)


# -------------------------------------------------------------------------- TLS contexts


class _PassphraseRequired(ValueError):
    """The private key is encrypted; amps-py never prompts for a passphrase."""


def _no_passphrase() -> str:
    raise _PassphraseRequired(
        "the private key is protected by a passphrase, which amps-py cannot prompt for; "
        "store it unencrypted (openssl pkey -in key.pem -out key-plain.pem) and protect "
        "the file with its permissions instead"
    )


def server_ssl_context(
    certificate: Path, private_key: Path, ciphers: str | None = None
) -> ssl.SSLContext:
    """The server-side TLS context of a ``tcps`` or ``amps-replication-secure`` listener.

    TLS 1.2 or later (:data:`MIN_TLS_VERSION`); no client certificate is requested. The
    loader builds one for every secure transport, so a config that loads has files that
    load here too (unless they change in between).

    Args:
        certificate: PEM file: the listener's certificate, then any intermediates.
        private_key: PEM file: the certificate's private key, unencrypted.
        ciphers: an OpenSSL cipher string for TLS 1.2 (TLS 1.3 suites are not
            affected), or ``None`` for OpenSSL's defaults.

    Raises:
        OSError: a file cannot be read.
        ssl.SSLError: a file is not PEM, the key does not match the certificate, or
            ``ciphers`` selects no cipher.
        ValueError: the private key is passphrase-protected.
    """
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = MIN_TLS_VERSION
    context.load_cert_chain(certificate, private_key, password=_no_passphrase)
    if ciphers:
        context.set_ciphers(ciphers)
    return context
