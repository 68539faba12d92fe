"""AMPS-style XML configuration -> frozen option objects.

An instance is configured with the same XML that AMPS uses (``<AMPSConfig>`` with
``Name``, ``Transports``, ``TransactionLog``, ``Logging``, ...). :func:`load_config` and
:func:`parse_config` turn such a file into an :class:`InstanceConfig`, a tree of frozen
dataclasses that the rest of amps-py reads and never changes.

Loading happens in one pass that collects every problem before reporting, the way
nats-server's ``processConfigFile`` does, so an operator fixes a file in one round:

1. Parse the XML (a file that is not well-formed stops here, with the parser's line).
2. Substitute ``${VAR}`` in element text from the environment (or the ``environ``
   mapping), plus the built-ins ``AMPS_CONFIG_DIRECTORY``, ``AMPS_CONFIG_PATH`` and
   ``AMPS_VERSION``. An undefined variable is a problem, reported with its line.
3. Walk the tree against a model read from ``config/amps.xsd``: unknown, misspelt,
   wrongly-cased, misplaced, repeated and missing elements, and values outside an
   enumeration, each with a suggestion (difflib) where one is close. Elements that AMPS
   has but amps-py does not support yet are named as such (see
   :data:`UNSUPPORTED_AMPS_ELEMENTS`).
4. Convert values (units, addresses, regexes) and run the checks the schema cannot
   express (duplicate transports, ranges, a file log target without a file name, ...).
5. Validate with the XSD itself as a backstop; anything it finds that steps 3-4 did not
   already report is translated into a plain sentence.

Every problem is a :class:`ConfigProblem` carrying the file, line, element path, what is
wrong and how to fix it; they are raised together as one :class:`ConfigError`.

Adding support for an AMPS element (Admin, Actions, SOW, ...):

* describe it in ``config/amps.xsd`` (the structural checks follow automatically);
* remove it from :data:`UNSUPPORTED_AMPS_ELEMENTS` (and its values from
  :data:`UNSUPPORTED_AMPS_VALUES`);
* add a frozen option class, a ``_build_<section>`` function next to the others and a
  field on :class:`InstanceConfig`.
"""

from __future__ import annotations

import contextlib
import difflib
import importlib.resources
import importlib.resources.abc
import ipaddress
import os
import re
import ssl
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Final, Protocol, cast
from xml.sax.saxutils import escape as _xml_escape

from lxml import etree

from amps_py import __version__, auth
from amps_py.filters import FilterError, compile_filter
from amps_py.units import UnitError, parse_bytes, parse_count, parse_duration, parse_percent

__all__ = [
    "DEFAULT_ACK_CONFLATION_INTERVAL",
    "DEFAULT_CLIENT_MAX_CAPACITY",
    "DEFAULT_FLUSH_INTERVAL",
    "DEFAULT_HEARTBEAT_INTERVAL",
    "DEFAULT_INCOMPLETE_MESSAGE_MEMORY_LIMIT",
    "DEFAULT_INCOMPLETE_MESSAGE_TIMEOUT",
    "DEFAULT_JOURNAL_SIZE",
    "DEFAULT_LOGON_TIMEOUT",
    "DEFAULT_MAP_SIZE",
    "DEFAULT_MAX_MESSAGE_SIZE",
    "DEFAULT_RECONNECT_TIMEOUTS",
    "DEFAULT_SEQUENCE_GAP_THRESHOLD",
    "LOG_LEVELS",
    "MIN_TLS_VERSION",
    "NON_EXCLUDABLE_VALIDATION_CHECKS",
    "REPLICATION_SECURE_TRANSPORT_TYPE",
    "REPLICATION_TRANSPORT_TYPE",
    "REPLICATION_TRANSPORT_TYPES",
    "REPLICATION_VALIDATION_CHECKS",
    "SECURE_TRANSPORT_TYPES",
    "UNSUPPORTED_AMPS_ELEMENTS",
    "UNSUPPORTED_AMPS_VALUES",
    "AuthenticationConfig",
    "ClientCapacity",
    "ConfigError",
    "ConfigProblem",
    "DestinationConfig",
    "EntitlementConfig",
    "InstanceConfig",
    "JournalTopic",
    "LinkAuthenticator",
    "LinkCredentialsError",
    "LogTarget",
    "ReplicationTopic",
    "TransactionLogConfig",
    "TransportConfig",
    "default_config",
    "default_config_xml",
    "default_message_memory_limit",
    "load_config",
    "parse_config",
    "schema_path",
    "security_warnings",
    "server_ssl_context",
]

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

#: Elements AMPS defines that amps-py does not support yet, by the path of the parent
#: they appear in. A config that uses one gets a clear "not supported yet" problem
#: instead of "unknown element". Shrink this as features arrive (and add the element to
#: config/amps.xsd at the same time).
UNSUPPORTED_AMPS_ELEMENTS: Final[Mapping[str, frozenset[str]]] = {
    "AMPSConfig": frozenset(
        {
            "ClientMessageAgeLimit",
            "ConfigCycleDetectionThreshold",
            "ConfigIncludeCommentDefault",
            "Environment",
            "Include",
            "MessageDiskLimit",
            "MessageDiskPath",
            "MessageTypes",
            "MiniDumpDirectory",
            "Modules",
            "Protocols",
            "RequiredMinimumVersion",
            "SOW",
            "SuggestedMinimumVersion",
            "Tuning",
            "UserDefinedFunctions",
        }
    ),
    "AMPSConfig/Transports/Transport": frozenset(
        {
            "ClientMessageAgeLimit",
            "Entitlement",
            "FileName",
            "MessageDiskLimit",
            "MessageDiskPath",
            "MessageMemoryLimit",
            "TransportFilter",
        }
    ),
    "AMPSConfig/Replication/Destination/Transport": frozenset(
        {
            "Ciphers",
            "IpProtocolPrefer",
            "PrivateKey",
        }
    ),
    "AMPSConfig/TransactionLog": frozenset(
        {
            "BlockSize",
            "CompressedJournalCacheMemoryLimit",
            "InactiveClientAckExpiration",
            "O_DIRECT",
        }
    ),
}

_AMPS_ONLY_MESSAGE_TYPES = frozenset(
    {
        "bflat",
        "bson",
        "composite-global",
        "composite-local",
        "fix",
        "msgpack",
        "nvfix",
        "protobuf",
        "struct",
        "xml",
    }
)

#: Values AMPS accepts for an element that amps-py does not support yet, by element path.
UNSUPPORTED_AMPS_VALUES: Final[Mapping[str, frozenset[str]]] = {
    "AMPSConfig/Transports/Transport/Type": frozenset({"amps-unix"}),
    "AMPSConfig/Transports/Transport/Protocol": frozenset(
        {"websocket", "fix", "nvfix", "xml", "soap", "fix-session"}
    ),
    "AMPSConfig/Transports/Transport/MessageType": _AMPS_ONLY_MESSAGE_TYPES,
    "AMPSConfig/TransactionLog/Topic/MessageType": _AMPS_ONLY_MESSAGE_TYPES,
    "AMPSConfig/Replication/Destination/Topic/MessageType": _AMPS_ONLY_MESSAGE_TYPES,
    "AMPSConfig/Logging/Target/Protocol": frozenset({"gzip", "syslog"}),
    "AMPSConfig/Authentication/Module": frozenset(
        {
            "amps-implicit-authentication-module",
            "amps-default-no-authentication-module",
            "libamps_multi_authentication",
            "libamps_oauth_authentication",
        }
    ),
    "AMPSConfig/Entitlement/Module": frozenset(
        {
            "amps-default-no-entitlement-module",
            "libamps_http_entitlement",
            "libamps_simple_access_entitlement",
        }
    ),
}

_XS = "{http://www.w3.org/2001/XMLSchema}"
_AMPSPY_NS = "{urn:amps-py:config}"
_ROOT = "AMPSConfig"
_REGEX_METACHARACTERS = frozenset(".^$*+?{}[]\\|()")
#: journals() caches answers per (topic, message type); topics can be unbounded
#: (per-order topics), so the cache is dropped when it reaches this size.
_JOURNAL_CACHE_LIMIT = 65_536

# ------------------------------------------------------------------------------ problems


@dataclass(frozen=True)
class ConfigProblem:
    """One thing wrong with a configuration, located and with a way to fix it.

    Attributes:
        file: the config file as given to the loader (or ``"<string>"``).
        line: 1-based line in that file, or ``None`` when no line applies (an
            unreadable file).
        element: the element path, e.g. ``AMPSConfig/TransactionLog/Topic``; empty when
            the problem concerns the file as a whole.
        message: what is wrong, as a plain sentence.
        fix: what to change to make it right.
    """

    file: str
    line: int | None
    element: str
    message: str
    fix: str

    def __str__(self) -> str:
        where = self.file if self.line is None else f"{self.file}:{self.line}"
        head = f"{where}: {self.element}: " if self.element else f"{where}: "
        end = "" if self.message.endswith((".", "?", "!")) else "."
        return f"{head}{self.message}{end} Fix: {self.fix}"


class ConfigError(Exception):
    """A configuration could not be loaded; ``problems`` lists every reason at once.

    ``str()`` gives a count header followed by one problem per line, ready to print.
    """

    def __init__(self, problems: Iterable[ConfigProblem]) -> None:
        self.problems: tuple[ConfigProblem, ...] = tuple(problems)
        super().__init__(self._render())

    def _render(self) -> str:
        count = len(self.problems)
        files = sorted({p.file for p in self.problems})
        noun = "problem" if count == 1 else "problems"
        header = f"{count} configuration {noun} in {', '.join(files) or '<unknown>'}:"
        return "\n".join([header, *(f"  {p}" for p in self.problems)])

    def __str__(self) -> str:
        return self._render()

    def __reduce__(self) -> tuple[type[ConfigError], tuple[tuple[ConfigProblem, ...]]]:
        return (type(self), (self.problems,))


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
        authentication: for the replication transport: ``Transport/Authentication``,
            who may replicate in; ``None``: ``AMPSConfig/Authentication`` applies (see
            :attr:`InstanceConfig.replication_authentication`).
        sequence_gap_threshold: for the replication transport
            (``SequenceGapThreshold``): a received record whose publisher seq is more
            than this above the highest this instance holds for that publisher is
            logged and counted; 0 turns the check off.
        logon_timeout: seconds a new client connection has to log on before it is
            closed (client transports only).
        incomplete_message_timeout: seconds a client has to finish a frame once its
            first byte arrived (client transports only).
        client_max_capacity: this transport's ClientMaxCapacity, or ``None`` for the
            instance's.
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
    sequence_gap_threshold: int = DEFAULT_SEQUENCE_GAP_THRESHOLD
    logon_timeout: float = DEFAULT_LOGON_TIMEOUT
    incomplete_message_timeout: float = DEFAULT_INCOMPLETE_MESSAGE_TIMEOUT
    client_max_capacity: ClientCapacity | None = None
    #: send persisted acks to every client that publishes with ``s``, asked or not
    always_persisted_acks: bool = False

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
    "amps-action-on-connect-replication": (),
    "amps-action-on-disconnect-replication": (),
    "amps-action-on-replication-resync-complete": (),
    "amps-action-on-downgrade-replication": (),
    "amps-action-on-upgrade-replication": (),
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
        message_type: ``json`` or ``binary``.
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


#: Destination Transport Authenticator modules: send no credentials / a user and password.
DEFAULT_LINK_AUTHENTICATOR: Final = "amps-default-authenticator"
PASSWORD_LINK_AUTHENTICATOR: Final = "amps-password-authenticator"
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_LINK_USER = re.compile(r"[^\s:]+")


class LinkCredentialsError(Exception):
    """The password of a link's Authenticator cannot be read when the link connects
    (its PasswordFile vanished, its PasswordEnv variable is unset); the text says which
    and never contains a password."""


@dataclass(frozen=True, repr=False)
class LinkAuthenticator:
    """A ``Destination/Transport/Authenticator``: what a replication link logs on with.

    The credentials travel in the link's hello, so they are only as private as the
    link's transport: use ``amps-replication-secure`` (TLS) across untrusted networks.
    ``repr()`` never shows the password.

    Attributes:
        module: ``amps-default-authenticator`` (send no credentials) or
            ``amps-password-authenticator`` (send ``username`` and a password).
        username: for the password module: the user to log on as.
        password: the literal password (``Options/Password``), or ``None``.
        password_file: a file whose first line is the password, read at each connect.
        password_env: an environment variable holding the password, read at each
            connect. Exactly one of the three password sources is set for the
            password module; none for the default module.
    """

    module: str = DEFAULT_LINK_AUTHENTICATOR
    username: str | None = None
    password: str | None = None
    password_file: Path | None = None
    password_env: str | None = None

    def __repr__(self) -> str:
        if self.password is not None:
            source = "password='***'"
        elif self.password_file is not None:
            source = f"password_file={str(self.password_file)!r}"
        elif self.password_env is not None:
            source = f"password_env={self.password_env!r}"
        else:
            source = ""
        fields = [f"module={self.module!r}"]
        if self.username is not None:
            fields.append(f"username={self.username!r}")
        if source:
            fields.append(source)
        return f"LinkAuthenticator({', '.join(fields)})"

    def credentials(self, environ: Mapping[str, str] | None = None) -> tuple[str, str] | None:
        """(user, password) to send, or ``None`` for the default module.

        Raises:
            LinkCredentialsError: the password file cannot be read or is empty, or the
                environment variable is unset.
        """
        if self.module != PASSWORD_LINK_AUTHENTICATOR or self.username is None:
            return None
        if self.password is not None:
            return self.username, self.password
        if self.password_file is not None:
            return self.username, read_password_file(self.password_file)
        if self.password_env is not None:
            env = os.environ if environ is None else environ
            value = env.get(self.password_env)
            if not value:
                raise LinkCredentialsError(
                    f"environment variable {self.password_env} (Authenticator PasswordEnv) "
                    "is not set or empty; set it in the environment amps-py runs in"
                )
            return self.username, value
        raise LinkCredentialsError("the Authenticator has no password source")


def read_password_file(path: Path) -> str:
    """The first line of ``path`` without its line ending (the password).

    Raises:
        LinkCredentialsError: unreadable, or the first line is empty.
    """
    try:
        with path.open(encoding="utf-8") as f:
            first = f.readline()
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise LinkCredentialsError(
            f"Authenticator PasswordFile {str(path)!r} cannot be read: {reason}"
        ) from None
    password = first.rstrip("\r\n")
    if not password:
        raise LinkCredentialsError(
            f"the first line of Authenticator PasswordFile {str(path)!r} is empty; "
            "write the password on the first line"
        )
    return password


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
        authentication: the logon check; the default module lets everyone on.
        entitlement: the per-user rights; the default module allows everything.
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
        transport = self.replication_transport
        if transport is not None and transport.authentication is not None:
            return transport.authentication
        return self.authentication

    @property
    def client_transports(self) -> tuple[TransportConfig, ...]:
        """The listeners for clients: every transport but the replication one (tcp,
        tcps)."""
        return tuple(t for t in self.transports if not t.is_replication)


# ------------------------------------------------------------------------ schema model


@dataclass(frozen=True)
class _Decl:
    """What config/amps.xsd says about one element position (read once, cached)."""

    name: str
    path: str
    min_occurs: int
    max_occurs: int | None  # None: unbounded
    doc: str
    children: Mapping[str, _Decl] | None  # None: the element holds a value
    enumeration: tuple[str, ...] = ()
    min_length: int = 0
    #: the type ends in xs:any: children are free-form (module Options), checked later
    open_content: bool = False


def _packaged_schema() -> importlib.resources.abc.Traversable:
    return importlib.resources.files("amps_py").joinpath("_data").joinpath("amps.xsd")


def schema_path() -> Path:
    """Where amps.xsd is read from: the installed wheel's copy, else the source tree's.

    Wheels carry the schema as ``amps_py/_data/amps.xsd``; a source checkout uses
    ``config/amps.xsd``.
    """
    packaged = _packaged_schema()
    if packaged.is_file():
        return Path(str(packaged))
    return Path(__file__).resolve().parents[1] / "config" / "amps.xsd"


@dataclass(frozen=True)
class _Schema:
    xsd: etree.XMLSchema
    model: _Decl
    index: Mapping[str, list[_Decl]]


@lru_cache(maxsize=1)
def _schema() -> _Schema:
    packaged = _packaged_schema()
    data = packaged.read_bytes() if packaged.is_file() else schema_path().read_bytes()
    root = etree.fromstring(data)
    model = _read_model(root)
    return _Schema(etree.XMLSchema(root), model, _index_model(model))


def _occurs(value: str | None, default: int | None) -> int | None:
    if value is None:
        return default
    return None if value == "unbounded" else int(value)


def _read_model(schema: etree._Element) -> _Decl:
    """Build the element tree that the structural walk checks against.

    Understands the subset of XSD that amps.xsd uses: global named complex and simple
    types, inline types, xs:all / xs:sequence / xs:choice (nested too), min/maxOccurs
    (or ampspy:min/maxOccurs inside an unbounded choice), and the enumeration and
    minLength facets. Other facets are left to the XSD backstop.
    """
    complex_types = {t.get("name"): t for t in schema.iterchildren(f"{_XS}complexType")}
    simple_types = {t.get("name"): t for t in schema.iterchildren(f"{_XS}simpleType")}
    groups = {f"{_XS}all", f"{_XS}sequence", f"{_XS}choice"}

    def facets(simple: etree._Element | None) -> tuple[tuple[str, ...], int]:
        enumeration: tuple[str, ...] = ()
        min_length = 0
        while simple is not None:
            restriction = simple.find(f"{_XS}restriction")
            if restriction is None:
                break
            values = tuple(
                str(e.get("value")) for e in restriction.iterchildren(f"{_XS}enumeration")
            )
            enumeration = enumeration or values
            length = restriction.find(f"{_XS}minLength")
            if length is not None:
                min_length = max(min_length, int(str(length.get("value"))))
            simple = simple_types.get(restriction.get("base"))
        return enumeration, min_length

    def documentation(decl: etree._Element) -> str:
        text = decl.findtext(f"{_XS}annotation/{_XS}documentation") or ""
        return " ".join(text.split())

    def particles(group: etree._Element) -> Iterable[etree._Element]:
        for node in group:
            if node.tag == f"{_XS}element":
                yield node
            elif node.tag in groups:
                yield from particles(node)

    def element(decl: etree._Element, parent_path: str) -> _Decl:
        name = str(decl.get("name"))
        path = f"{parent_path}/{name}" if parent_path else name
        # Children of an unbounded choice carry their real limits as ampspy:* attributes.
        min_occurs = _occurs(decl.get(f"{_AMPSPY_NS}minOccurs") or decl.get("minOccurs"), 1)
        max_occurs = _occurs(decl.get(f"{_AMPSPY_NS}maxOccurs") or decl.get("maxOccurs"), 1)
        type_name = decl.get("type")
        complex_type = complex_types.get(type_name) if type_name else decl.find(f"{_XS}complexType")
        doc = documentation(decl)
        if complex_type is None:
            simple = simple_types.get(type_name) if type_name else decl.find(f"{_XS}simpleType")
            enumeration, min_length = facets(simple)
            return _Decl(
                name, path, min_occurs or 0, max_occurs, doc, None, enumeration, min_length
            )
        children = {
            str(child.get("name")): element(child, path) for child in particles(complex_type)
        }
        open_content = complex_type.find(f".//{_XS}any") is not None
        return _Decl(
            name, path, min_occurs or 0, max_occurs, doc, children, open_content=open_content
        )

    root = schema.find(f"{_XS}element[@name='{_ROOT}']")
    if root is None:  # pragma: no cover - the schema ships with the package
        raise RuntimeError(f"{schema_path()} does not declare <{_ROOT}>")
    return element(root, "")


def _index_model(root: _Decl) -> dict[str, list[_Decl]]:
    """Where each element name is allowed, for "belongs inside X" hints."""
    index: dict[str, list[_Decl]] = {}

    def visit(decl: _Decl) -> None:
        index.setdefault(decl.name, []).append(decl)
        for child in (decl.children or {}).values():
            visit(child)

    visit(root)
    return index


# ---------------------------------------------------------------------------- helpers


class _LogEntry(Protocol):
    """The fields of an lxml error-log entry that the loader reads."""

    line: int
    level: int
    message: str
    path: str | None


#: libxml2's error level for errors (warnings are 1, fatal errors 3).
_LIBXML_ERROR = 2


def _log_entries(log: object) -> list[_LogEntry]:
    """The entries of an lxml error log (typed; lxml-stubs leave the log opaque)."""
    return list(cast("Iterable[_LogEntry]", log))


def _line(el: etree._Element) -> int | None:
    """The source line of ``el`` (lxml-stubs do not type ``sourceline``)."""
    return cast("int | None", el.sourceline)


def _element_path(el: etree._Element) -> str:
    names = [str(a.tag) for a in el.iterancestors()][::-1]
    return "/".join([*names, str(el.tag)])


def _child_elements(el: etree._Element) -> list[etree._Element]:
    return [c for c in el if isinstance(c.tag, str)]


def _children(el: etree._Element | None, name: str) -> list[etree._Element]:
    if el is None:
        return []
    return [c for c in el if c.tag == name]


def _first(el: etree._Element | None, name: str) -> etree._Element | None:
    found = _children(el, name)
    return found[0] if found else None


def _closest(word: str, candidates: Iterable[str]) -> str | None:
    """The candidate closest to ``word`` (ignoring case), or None if none is close."""
    by_lower = {c.lower(): c for c in candidates}
    lower = word.lower()
    match = difflib.get_close_matches(lower, list(by_lower), n=1, cutoff=0.6)
    if match:
        return by_lower[match[0]]
    # A shortened or extended spelling ("warn", "fsync-always") is close as well.
    related = [c for c in by_lower if min(len(c), len(lower)) >= 3]
    related = [c for c in related if c.startswith(lower) or lower.startswith(c)]
    return by_lower[max(related, key=len)] if related else None


def _one_of(values: Iterable[str]) -> str:
    return ", ".join(values)


class _Problems:
    """Collects problems for one document and remembers which elements are at fault.

    Later phases skip elements that already have a problem, so one mistake is reported
    once (an undefined ${PORT} is not also reported as a bad port).
    """

    def __init__(self, source: str) -> None:
        self.source = source
        self.items: list[ConfigProblem] = []
        self._faulty: set[etree._Element] = set()

    def add(
        self,
        el: etree._Element | None,
        message: str,
        fix: str,
        *,
        line: int | None = None,
        element: str | None = None,
    ) -> None:
        if el is not None:
            self._faulty.add(el)
            line = line if line is not None else _line(el)
            element = element if element is not None else _element_path(el)
        self.items.append(ConfigProblem(self.source, line, element or "", message, fix))

    def faulty(self, el: etree._Element | None) -> bool:
        return el is not None and el in self._faulty

    def covered_lines(self) -> set[int]:
        """Lines of faulty elements and their ancestors (for de-duplicating XSD errors)."""
        lines: set[int] = set()
        for el in self._faulty:
            for node in (el, *el.iterancestors()):
                node_line = _line(node)
                if node_line is not None:
                    lines.add(node_line)
        return lines

    def error(self) -> ConfigError:
        ordered = sorted(self.items, key=lambda p: p.line or 0)
        return ConfigError(ordered)


class _BadValue(Exception):
    """A value that could not be converted: what is wrong, and how to fix it."""

    def __init__(self, message: str, fix: str) -> None:
        super().__init__(message)
        self.message = message
        self.fix = fix


# -------------------------------------------------------------------- 1. parsing XML

_SYNTAX_FIXES: tuple[tuple[re.Pattern[str], str], ...] = (
    (
        re.compile(r"Opening and ending tag mismatch: (\S+) line (\d+) and (\S+)"),
        "close <{0}> (opened on line {1}) with </{0}> before </{2}>, "
        "or correct the misspelt closing tag",
    ),
    (
        re.compile(r"Premature end of data|EndTag: '</' not found|end of data"),
        "the document ends before every element is closed; add the missing closing tags",
    ),
    (
        re.compile(r"EntityRef|xmlParseEntityRef|entity"),
        "write & as &amp; and < as &lt; inside values",
    ),
    (
        re.compile(r"[Dd]ouble hyphen within comment|Comment not terminated"),
        "XML comments cannot contain -- and must end with -->; reword the comment",
    ),
    (
        re.compile(r"Extra content at the end of the document"),
        "a config has exactly one root element, <AMPSConfig>; put everything inside it",
    ),
    (
        re.compile(r"AttValue|attributes construct error|Couldn't find end of Start Tag"),
        "check the start tag on this line: quote attribute values and close it with >",
    ),
)


def _parse_xml(data: bytes, problems: _Problems) -> etree._Element | None:
    parser = etree.XMLParser(
        resolve_entities=False,
        no_network=True,
        load_dtd=False,
        remove_comments=True,
        remove_pis=True,
        huge_tree=False,
    )
    try:
        return etree.fromstring(data, parser)
    except etree.XMLSyntaxError as exc:
        entries = [e for e in _log_entries(parser.error_log) if e.level >= _LIBXML_ERROR]
        line: int | None = exc.lineno
        text = str(exc.msg)
        if entries:
            line, text = entries[0].line, entries[0].message.strip()
        fix = "correct the XML syntax on this line"
        for pattern, template in _SYNTAX_FIXES:
            match = pattern.search(text)
            if match:
                fix = template.format(*match.groups())
                break
        problems.add(None, f"not well-formed XML: {text}", fix, line=line or None, element="")
        return None


# ---------------------------------------------------------- 2. environment variables

_VAR_REF = re.compile(r"\$\{([^}]*)\}")
_VAR_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def _substitute_all(root: etree._Element, values: Mapping[str, str], problems: _Problems) -> None:
    for el in root.iter():
        if not isinstance(el.tag, str) or not el.text or "${" not in el.text:
            continue
        el.text = _substitute(el, el.text, values, problems)


def _substitute(
    el: etree._Element, text: str, values: Mapping[str, str], problems: _Problems
) -> str:
    base_line = _line(el) or 1
    out: list[str] = []
    pos = 0

    def report(offset: int, message: str, fix: str) -> None:
        problems.add(el, message, fix, line=base_line + text.count("\n", 0, offset))

    for match in _VAR_REF.finditer(text):
        out.append(text[pos : match.start()])
        pos = match.end()
        name = match.group(1)
        if not _VAR_NAME.fullmatch(name):
            report(
                match.start(),
                f"'{match.group(0)}' is not a valid variable reference",
                "write ${NAME} where NAME uses letters, digits and _ (e.g. ${HOME})",
            )
            out.append(match.group(0))
        elif name not in values:
            report(
                match.start(),
                f"environment variable {name} is not defined (used as ${{{name}}})",
                f"set {name} in the environment before starting amps-py, "
                f"or replace ${{{name}}} with a value",
            )
            out.append(match.group(0))
        else:
            out.append(values[name])
    rest = text[pos:]
    unterminated = rest.find("${")
    if unterminated >= 0:
        report(
            pos + unterminated,
            "'${' starts a variable reference that is never closed",
            "close the reference with } (e.g. ${HOME})",
        )
    out.append(rest)
    return "".join(out)


# ------------------------------------- 3. entities, namespaces and the structural walk


def _drop_entity_references(root: etree._Element, problems: _Problems) -> None:
    """Report and remove references to DTD entities (``&name;``).

    Entities are never expanded: an external one could read any file on the host.
    The five predefined ones (``&amp;``, ``&lt;``...) and character references are
    ordinary text and unaffected.
    """
    for entity in list(root.iter(etree.Entity)):
        parent = entity.getparent()
        if parent is None:  # pragma: no cover - an entity is never the root
            continue
        problems.add(
            parent,
            f"the entity reference {entity.text} is not supported",
            f"replace {entity.text} with the value itself, or with ${{VAR}} to take it "
            "from the environment",
        )
        tail = entity.tail or ""
        previous = entity.getprevious()
        if previous is None:
            parent.text = (parent.text or "") + tail
        else:
            previous.tail = (previous.tail or "") + tail
        parent.remove(entity)


def _strip_namespaces(root: etree._Element, problems: _Problems) -> None:
    """Report elements in an XML namespace once, then carry on without namespaces.

    AMPS config elements have no namespace; a stray ``xmlns="..."`` would otherwise
    make every element unknown.
    """
    reported = False
    for el in root.iter():
        if not isinstance(el.tag, str) or not el.tag.startswith("{"):
            continue
        namespace, _, local = el.tag[1:].partition("}")
        if not reported:
            problems.add(
                el,
                f"<{local}> is in the XML namespace {namespace!r}, "
                "but amps-py config elements have no namespace",
                f"remove the xmlns declaration that puts elements in {namespace!r}",
                element=local,
            )
            reported = True
        el.tag = local


def _check_structure(
    el: etree._Element, decl: _Decl, problems: _Problems, index: Mapping[str, list[_Decl]]
) -> None:
    tag = str(el.tag)
    for raw_attribute in el.attrib:
        attribute = str(raw_attribute)
        problems.add(
            el,
            f"attribute {attribute}= is not supported on <{tag}>",
            f"remove the attribute; settings are written as child elements, e.g. "
            f"<{tag}><Name>...</Name></{tag}>"
            if decl.children is not None
            else "remove the attribute",
        )
    kids = _child_elements(el)
    if decl.children is None:
        _check_value(el, decl, kids, problems)
        return
    if decl.open_content:
        return  # free-form (module Options): the section's builder checks the names

    stray = " ".join(t.strip() for t in [el.text or "", *(k.tail or "" for k in kids)] if t.strip())
    if stray:
        problems.add(
            el,
            f"<{tag}> contains the text {_snippet(stray)!r}, but it only holds elements",
            "remove the text, or put it inside the child element it belongs to",
        )

    seen: dict[str, list[etree._Element]] = {}
    suggested: set[str] = set()
    for kid in kids:
        child_decl = decl.children.get(str(kid.tag))
        if child_decl is None:
            suggestion = _unknown_element(kid, decl, problems, index)
            if suggestion:
                suggested.add(suggestion)
            continue
        seen.setdefault(child_decl.name, []).append(kid)
        _check_structure(kid, child_decl, problems, index)

    for name, found in seen.items():
        limit = decl.children[name].max_occurs
        if limit is not None and len(found) > limit:
            for extra in found[limit:]:
                problems.add(
                    extra,
                    f"<{name}> is given more than once in <{tag}>",
                    f"keep one <{name}> (the first is on line {_line(found[0])}) "
                    "and remove the others",
                )
    for name, child_decl in decl.children.items():
        if len(seen.get(name, ())) < child_decl.min_occurs and name not in suggested:
            hint = f": {child_decl.doc}" if child_decl.doc else ""
            problems.add(
                el,
                f"<{tag}> is missing the required element <{name}>",
                f"add <{name}> inside <{tag}>{hint}",
            )


def _snippet(text: str, limit: int = 40) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _check_value(
    el: etree._Element, decl: _Decl, kids: list[etree._Element], problems: _Problems
) -> None:
    tag = str(el.tag)
    if kids:
        problems.add(
            kids[0],
            f"<{tag}> holds a value and cannot contain <{kids[0].tag}>",
            f"remove <{kids[0].tag}> from <{tag}>, or move it to where it belongs",
        )
        return
    if problems.faulty(el):  # e.g. an undefined ${VAR}: already reported
        return
    value = (el.text or "").strip()
    hint = f": {decl.doc}" if decl.doc else ""
    if decl.min_length and len(value) < decl.min_length:
        problems.add(el, f"<{tag}> is empty", f"give <{tag}> a value{hint}")
    elif decl.enumeration and value not in decl.enumeration:
        accepted = f"use one of: {_one_of(decl.enumeration)}"
        if value in UNSUPPORTED_AMPS_VALUES.get(decl.path, frozenset()):
            problems.add(
                el,
                f"{tag} {value!r} is recognised by AMPS but not supported by amps-py yet",
                accepted,
            )
            return
        close = _closest(value, decl.enumeration)
        suggestion = f"; did you mean {close!r}?" if close else ""
        problems.add(el, f"{value!r} is not a valid {tag}{suggestion}", accepted)


def _unknown_element(
    kid: etree._Element,
    parent: _Decl,
    problems: _Problems,
    index: Mapping[str, list[_Decl]],
) -> str | None:
    """Report a child that the schema does not allow here; return the name suggested."""
    name = str(kid.tag)
    parent_tag = parent.name
    assert parent.children is not None
    allowed = list(parent.children)
    unsupported = UNSUPPORTED_AMPS_ELEMENTS.get(parent.path, frozenset())
    allowed_text = f"elements allowed in <{parent_tag}> are: {_one_of(allowed)}"

    if name in unsupported:
        problems.add(
            kid,
            f"<{name}> is a recognised AMPS element, not supported by amps-py yet; remove it",
            f"delete <{name}> and its contents; {allowed_text}",
        )
        return None
    same_but_case = {a.lower(): a for a in allowed}.get(name.lower())
    if same_but_case:
        problems.add(
            kid,
            f"unknown element <{name}>: element names are case-sensitive; "
            f"did you mean {same_but_case}?",
            f"rename <{name}> to <{same_but_case}>",
        )
        return same_but_case
    homes = [d for d in index.get(name, []) if d.path != f"{parent.path}/{name}"]
    if homes:
        places = " or ".join(f"<{d.path.rpartition('/')[0]}>" for d in homes)
        problems.add(
            kid,
            f"<{name}> is not allowed inside <{parent_tag}>; it belongs inside {places}",
            f"move <{name}> into {places}",
        )
        return None
    close = _closest(name, allowed)
    if close:
        problems.add(
            kid,
            f"unknown element <{name}>; did you mean {close}?",
            f"rename <{name}> to <{close}>",
        )
        return close
    close_unsupported = _closest(name, unsupported)
    if close_unsupported:
        problems.add(
            kid,
            f"unknown element <{name}>; did you mean {close_unsupported}? That is a "
            "recognised AMPS element, not supported by amps-py yet",
            f"remove <{name}>; {allowed_text}",
        )
        return None
    problems.add(
        kid,
        f"unknown element <{name}> inside <{parent_tag}>",
        f"remove it; {allowed_text}",
    )
    return None


# --------------------------------------------------------------- 4. values and checks


def _text(el: etree._Element | None, problems: _Problems) -> str | None:
    """The stripped text of ``el``; None when absent or already reported as faulty."""
    if el is None or problems.faulty(el):
        return None
    return (el.text or "").strip()


def _unit_error(el: etree._Element, exc: UnitError, problems: _Problems) -> None:
    problems.add(el, f"{exc.text!r} is not a valid {exc.kind} for {el.tag}", exc.accepted)


def _duration_value(el: etree._Element, problems: _Problems) -> float | None:
    """Seconds from a duration element; None (and a problem) when malformed."""
    text = _text(el, problems)
    if text is None:
        return None
    try:
        return parse_duration(text)
    except UnitError as exc:
        _unit_error(el, exc, problems)
        return None


def _bytes_value(el: etree._Element, problems: _Problems) -> int | None:
    """Bytes from a size element, which must be above 0; None (and a problem) otherwise."""
    text = _text(el, problems)
    if text is None:
        return None
    try:
        value = parse_bytes(text)
    except UnitError as exc:
        _unit_error(el, exc, problems)
        return None
    if value <= 0:
        problems.add(el, f"{el.tag} must be more than 0 bytes", f"give {el.tag} a size, e.g. 16MB")
        return None
    return value


def _check_name(el: etree._Element | None, problems: _Problems) -> str | None:
    """Instance Name/Group rules: no path separators, at most MAX_NAME_LENGTH chars."""
    text = _text(el, problems)
    if el is None or not text:
        return None
    if "/" in text or "\\" in text:
        problems.add(
            el,
            f"{el.tag} {text!r} contains a path separator; it is used to name files",
            "use letters, digits, '-', '_' or '.', e.g. "
            + text.replace("/", "-").replace("\\", "-"),
        )
        return None
    if len(text) > MAX_NAME_LENGTH:
        problems.add(
            el,
            f"{el.tag} is {len(text)} characters long; the limit is {MAX_NAME_LENGTH}",
            f"shorten {el.tag} to at most {MAX_NAME_LENGTH} characters",
        )
        return None
    return text


_HOST_LABEL = re.compile(r"(?!-)[A-Za-z0-9-]{1,63}(?<!-)")
_INET_FORMS = "write a port (9007), host:port (127.0.0.1:9007) or [ipv6]:port ([::1]:9007)"


def _parse_inet_addr(text: str) -> tuple[str, int]:
    """Split InetAddr into (host, port); raise _BadValue with a fix when malformed."""
    if text.startswith("["):
        match = re.fullmatch(r"\[([^\]]*)\]:(.*)", text)
        if match is None:
            raise _BadValue(f"InetAddr {text!r} has an IPv6 address but no :port", _INET_FORMS)
        host, port_text = match.group(1), match.group(2)
        try:
            ipaddress.IPv6Address(host)
        except ValueError:
            raise _BadValue(f"{host!r} is not an IPv6 address", _INET_FORMS) from None
    elif ":" in text:
        if text.count(":") > 1:
            raise _BadValue(
                f"InetAddr {text!r} looks like an IPv6 address without brackets",
                "put the address in brackets, e.g. [::1]:9007",
            )
        host, _, port_text = text.partition(":")
        _check_host(host, text)
    else:
        host, port_text = "0.0.0.0", text
    if not port_text.isdigit() or not port_text.isascii():
        raise _BadValue(f"InetAddr {text!r} has no valid port number", _INET_FORMS)
    port = int(port_text)
    if port > 65535:
        raise _BadValue(
            f"port {port} is out of range; ports are 0 to 65535",
            "use a port from 1 to 65535 (or 0 to let the OS pick a free one)",
        )
    return host, port


def _check_host(host: str, text: str) -> None:
    if not host:
        raise _BadValue(f"InetAddr {text!r} has an empty host", _INET_FORMS)
    labels = host.rstrip(".").split(".")
    if all(label.isdigit() for label in labels):
        try:
            ipaddress.IPv4Address(host)
        except ValueError:
            raise _BadValue(f"{host!r} is not a valid IPv4 address", _INET_FORMS) from None
    elif len(host) > 253 or not all(_HOST_LABEL.fullmatch(label) for label in labels):
        raise _BadValue(f"{host!r} is not a valid host name or address", _INET_FORMS)


def _bound_hosts(host: str, *, dual_stack_wildcard: bool) -> tuple[str, ...]:
    """The addresses a listener on ``host`` binds: ``localhost`` is both loopbacks, and
    a transport's ``0.0.0.0`` (or no host) binds the IPv4 and the IPv6 wildcard
    (``dual_stack_wildcard``; the admin interface binds only what it is given)."""
    if host == "localhost":
        return ("127.0.0.1", "::1")
    if host in ("", "0.0.0.0") and dual_stack_wildcard:
        return ("0.0.0.0", "::")
    return (host or "0.0.0.0",)


def _ports_clash(
    a: tuple[str, int], b: tuple[str, int], *, a_dual: bool = True, b_dual: bool = True
) -> bool:
    """Whether two listeners cannot both bind (same port, and the same, a wildcard or a
    loopback-name host on the same IP version); ``a_dual``/``b_dual``: whether that
    listener's wildcard covers IPv6 too (transports: yes; the admin interface: no)."""
    if a[1] == 0 or a[1] != b[1]:
        return False
    return any(
        _hosts_clash(host_a, host_b)
        for host_a in _bound_hosts(a[0], dual_stack_wildcard=a_dual)
        for host_b in _bound_hosts(b[0], dual_stack_wildcard=b_dual)
    )


def _hosts_clash(host_a: str, host_b: str) -> bool:
    if host_a == host_b:
        return True
    v6_a, v6_b = ":" in host_a, ":" in host_b
    if v6_a != v6_b:
        return False
    wildcard = "::" if v6_a else "0.0.0.0"
    return wildcard in (host_a, host_b)


def _listener_text(address: tuple[str, int]) -> str:
    host, port = address
    if host in ("", "0.0.0.0"):
        return f"port {port} on every address"
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _build_transports(root: etree._Element, problems: _Problems) -> tuple[TransportConfig, ...]:
    transports: list[TransportConfig] = []
    names: dict[str, etree._Element] = {}
    addresses: list[tuple[tuple[str, int], str, etree._Element]] = []
    replication_el: etree._Element | None = None  # the first amps-replication transport
    for transport in _children(_first(root, "Transports"), "Transport"):
        name_el = _first(transport, "Name")
        name = _text(name_el, problems)
        if name_el is not None and name:
            if name in names:
                problems.add(
                    name_el,
                    f"transport name {name!r} is already used by the transport on line "
                    f"{_line(names[name])}",
                    "give each Transport a unique Name",
                )
                name = None
            else:
                names[name] = name_el
        type_el = _first(transport, "Type")
        kind = _text(type_el, problems)
        if type_el is not None and kind in REPLICATION_TRANSPORT_TYPES:
            if replication_el is None:
                replication_el = transport
            else:
                first_name = _text(_first(replication_el, "Name"), problems) or "?"
                problems.add(
                    type_el,
                    "an instance has at most one amps-replication transport, and transport "
                    f"{first_name!r} on line {_line(replication_el)} already is one "
                    "(amps-replication and amps-replication-secure count together)",
                    "remove this transport (one amps-replication listener accepts every "
                    "upstream instance), or change its Type to tcp or tcps",
                )
                kind = None

        inet_el = _first(transport, "InetAddr")
        inet_text = _text(inet_el, problems)
        address: tuple[str, int] | None = None
        if inet_el is not None and inet_text:
            try:
                address = _parse_inet_addr(inet_text)
            except _BadValue as bad:
                problems.add(inet_el, bad.message, bad.fix)
        if inet_el is not None and address is not None:
            for other, other_name, other_el in addresses:
                if _ports_clash(address, other):
                    problems.add(
                        inet_el,
                        f"InetAddr {inet_text} clashes with transport {other_name!r} on "
                        f"line {_line(other_el)}, which listens on the same port "
                        f"({_listener_text(other)}): the second transport could not start",
                        "give each Transport its own port (or port 0 for a free one)",
                    )
                    address = None
                    break
            else:
                addresses.append((address, name or "?", inet_el))

        protocol_el = _first(transport, "Protocol")
        protocol = _text(protocol_el, problems) if protocol_el is not None else "amps"
        if protocol == "json":  # AMPS accepts json as another name for the amps protocol
            protocol = "amps"
        message_type_el = _first(transport, "MessageType")
        message_type = _text(message_type_el, problems)
        message_type_ok = message_type_el is None or message_type is not None
        if kind in REPLICATION_TRANSPORT_TYPES and protocol is not None:
            # Replication has its own framing and carries every message type.
            protocol, message_type = REPLICATION_TRANSPORT_TYPE, None
        size_el = _first(transport, "MaxMessageSize")
        size = _bytes_value(size_el, problems) if size_el is not None else DEFAULT_MAX_MESSAGE_SIZE
        state_el = _first(transport, "InitialState")
        state = _text(state_el, problems) if state_el is not None else "enabled"
        tls = _transport_tls(transport, type_el, kind, problems)
        incoming = _incoming_replication(transport, kind, problems)
        logon_timeout = _positive_duration(
            transport, "LogonTimeout", DEFAULT_LOGON_TIMEOUT, problems, zero_ok=False
        )
        frame_timeout = _positive_duration(
            transport,
            "IncompleteMessageTimeout",
            DEFAULT_INCOMPLETE_MESSAGE_TIMEOUT,
            problems,
            zero_ok=False,
        )
        capacity_el = _first(transport, "ClientMaxCapacity")
        capacity = _capacity_value(capacity_el, problems) if capacity_el is not None else None
        # the schema allows only true/false
        always_acks = _text(_first(transport, "AlwaysSendPersistedAcks"), problems) == "true"

        if (
            name is None
            or kind is None
            or address is None
            or protocol is None
            or not message_type_ok
            or size is None
            or state is None
            or tls is None
            or incoming is None
            or logon_timeout is None
            or frame_timeout is None
            or (capacity_el is not None and capacity is None)
        ):
            continue
        transports.append(
            TransportConfig(
                name=name,
                type=kind,
                host=address[0],
                port=address[1],
                protocol=protocol,
                message_type=message_type,
                max_message_size=size,
                enabled=state == "enabled",
                certificate=tls[0],
                private_key=tls[1],
                ciphers=tls[2],
                authentication=incoming[0],
                sequence_gap_threshold=incoming[1],
                logon_timeout=logon_timeout,
                incomplete_message_timeout=frame_timeout,
                client_max_capacity=capacity,
                always_persisted_acks=always_acks,
            )
        )
    return tuple(transports)


def _incoming_replication(
    transport: etree._Element, kind: str | None, problems: _Problems
) -> tuple[AuthenticationConfig | None, int] | None:
    """(``Authentication``, ``SequenceGapThreshold``) of a Transport: settings of the
    replication listener only; None (and problems) when wrong."""
    auth_el = _first(transport, "Authentication")
    gap_el = _first(transport, "SequenceGapThreshold")
    if kind is not None and kind not in REPLICATION_TRANSPORT_TYPES:
        for el, fix in (
            (
                auth_el,
                "move it to AMPSConfig/Authentication (which every client transport "
                "uses), or remove it",
            ),
            (gap_el, "remove it; it applies to records received by replication"),
        ):
            if el is not None:
                problems.add(
                    el,
                    f"<{el.tag}> is read on the amps-replication transport only, and "
                    f"this transport's Type is {kind}",
                    fix,
                )
        if auth_el is not None or gap_el is not None:
            return None
        return None, DEFAULT_SEQUENCE_GAP_THRESHOLD
    ok = True
    authentication = None
    if auth_el is not None:
        authentication = _authentication_config(auth_el, problems)
        ok = not problems.faulty(auth_el)
    threshold = DEFAULT_SEQUENCE_GAP_THRESHOLD
    gap_text = _text(gap_el, problems)
    if gap_el is not None and gap_text is not None:
        try:
            threshold = parse_count(gap_text)
        except UnitError as exc:
            problems.add(
                gap_el,
                f"{exc.text!r} is not a valid count for SequenceGapThreshold",
                f"{exc.accepted}; 100k is the default, 0 turns the check off",
            )
            ok = False
    return (authentication, threshold) if ok else None


def _capacity_value(el: etree._Element, problems: _Problems) -> ClientCapacity | None:
    """ClientMaxCapacity: a percentage of MessageMemoryLimit above 0 and at most 100%,
    or a byte size above 0; None (and a problem) otherwise."""
    text = _text(el, problems)
    if text is None:
        return None
    if text.endswith("%"):
        try:
            fraction = parse_percent(text)
        except UnitError as exc:
            _unit_error(el, exc, problems)
            return None
        if not 0 < fraction <= 1:
            problems.add(
                el,
                f"ClientMaxCapacity {text} must be above 0% and at most 100%",
                "give a share of MessageMemoryLimit such as 50%, or a byte size such as 64MB",
            )
            return None
        return ClientCapacity(fraction=fraction)
    size = _bytes_value(el, problems)
    return ClientCapacity(size=size) if size is not None else None


def _build_memory_limits(
    root: etree._Element, transports: tuple[TransportConfig, ...], problems: _Problems
) -> tuple[int | None, ClientCapacity | None, int | None]:
    """MessageMemoryLimit, ClientMaxCapacity and IncompleteMessageMemoryLimit of the
    instance (``None`` where not given)."""
    memory_el = _first(root, "MessageMemoryLimit")
    memory = _bytes_value(memory_el, problems) if memory_el is not None else None
    capacity_el = _first(root, "ClientMaxCapacity")
    capacity = _capacity_value(capacity_el, problems) if capacity_el is not None else None
    incomplete_el = _first(root, "IncompleteMessageMemoryLimit")
    incomplete = _bytes_value(incomplete_el, problems) if incomplete_el is not None else None
    if incomplete_el is not None and incomplete is not None:
        for transport in transports:
            if not transport.is_replication and transport.max_message_size > incomplete:
                problems.add(
                    incomplete_el,
                    f"IncompleteMessageMemoryLimit {_text(incomplete_el, problems)} is smaller "
                    f"than MaxMessageSize of transport {transport.name!r} "
                    f"({transport.max_message_size} bytes): a message of that size could "
                    "never be received",
                    "raise IncompleteMessageMemoryLimit to at least the largest MaxMessageSize "
                    "(a few times it lets several large messages arrive at once), or lower "
                    "MaxMessageSize",
                )
                incomplete = None
                break
    return memory, capacity, incomplete


# ---------------------------------------------------------------------------- TLS

_TLS_FILE_ELEMENTS: Final = ("Certificate", "PrivateKey", "Ciphers")
_PEM_CERTIFICATE = b"-----BEGIN CERTIFICATE-----"
_PEM_PRIVATE_KEY = re.compile(rb"-----BEGIN (?:[A-Z0-9]+ )*PRIVATE KEY-----")
_PEM_ENCRYPTED = re.compile(rb"-----BEGIN ENCRYPTED PRIVATE KEY-----|Proc-Type: *4, *ENCRYPTED")
_PLAIN_TWIN: Final[Mapping[str, str]] = {
    "tcps": "tcp",
    REPLICATION_SECURE_TRANSPORT_TYPE: REPLICATION_TRANSPORT_TYPE,
}
_SECURE_TWIN: Final[Mapping[str, str]] = {plain: secure for secure, plain in _PLAIN_TWIN.items()}
_EXAMPLE_FILE: Final[Mapping[str, str]] = {
    "Certificate": "server-cert.pem",
    "PrivateKey": "server-key.pem",
}
_PATH_HINT = (
    "a relative path is relative to the working directory of amps-py; "
    "${AMPS_CONFIG_DIRECTORY}/NAME.pem names a file NAME.pem beside the config"
)


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


def _read_tls_file(el: etree._Element, what: str, problems: _Problems) -> tuple[Path, bytes] | None:
    """(path, contents) of a Certificate/PrivateKey file; None (and a problem) if unreadable."""
    text = _text(el, problems)
    if not text:
        return None
    path = Path(text)
    where = "" if path.is_absolute() else f" (looked for in {Path.cwd()})"
    try:
        return path, path.read_bytes()
    except FileNotFoundError:
        problems.add(
            el,
            f"{el.tag} file {text!r} does not exist{where}",
            f"give the path of the {what}; {_PATH_HINT}",
        )
    except IsADirectoryError:
        problems.add(
            el,
            f"{el.tag} {text!r} is a directory, not a file",
            f"give the path of the {what} file itself, not of its directory",
        )
    except PermissionError:
        problems.add(
            el,
            f"{el.tag} file {text!r} cannot be read: permission denied",
            "make the file readable by the user that runs amps-py "
            "(e.g. chown it to that user and chmod 600 it)",
        )
    except OSError as exc:
        problems.add(
            el,
            f"{el.tag} file {text!r} cannot be read: {exc.strerror or exc}",
            "check the path and the file's permissions",
        )
    return None


def _check_certificate_pem(el: etree._Element, data: bytes, problems: _Problems) -> bool:
    if _PEM_CERTIFICATE in data:
        return True
    swapped = (
        " (it holds a private key: are Certificate and PrivateKey swapped?)"
        if _PEM_PRIVATE_KEY.search(data)
        else ""
    )
    problems.add(
        el,
        f"{el.tag} file {_text(el, problems)!r} holds no PEM certificate{swapped}",
        "give a PEM file that starts with -----BEGIN CERTIFICATE----- (convert a DER file "
        "with `openssl x509 -inform der -in cert.der -out cert.pem`)",
    )
    return False


def _check_private_key_pem(el: etree._Element, data: bytes, problems: _Problems) -> bool:
    if _PEM_ENCRYPTED.search(data):
        problems.add(
            el,
            f"PrivateKey file {_text(el, problems)!r} is protected by a passphrase, which "
            "amps-py cannot prompt for",
            "store the key unencrypted (`openssl pkey -in key.pem -out key-plain.pem`) and "
            "protect the file with its permissions (chmod 600)",
        )
        return False
    if _PEM_PRIVATE_KEY.search(data):
        return True
    swapped = (
        " (it holds a certificate: are Certificate and PrivateKey swapped?)"
        if _PEM_CERTIFICATE in data
        else ""
    )
    problems.add(
        el,
        f"PrivateKey file {_text(el, problems)!r} holds no PEM private key{swapped}",
        "give the PEM file of the certificate's private key, which starts with "
        "-----BEGIN PRIVATE KEY----- (or BEGIN RSA/EC PRIVATE KEY)",
    )
    return False


def _check_ciphers(el: etree._Element | None, problems: _Problems) -> str | None:
    """The Ciphers text, or None (and a problem) if OpenSSL selects no cipher from it."""
    text = _text(el, problems)
    if el is None or not text:
        return None
    try:
        ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER).set_ciphers(text)
    except ssl.SSLError:
        problems.add(
            el,
            f"Ciphers {text!r} selects no cipher this OpenSSL ({ssl.OPENSSL_VERSION}) supports",
            "give an OpenSSL cipher string such as ECDHE+AESGCM:ECDHE+CHACHA20 "
            "(`openssl ciphers -v 'STRING'` lists what a string selects), or remove "
            "<Ciphers> to use OpenSSL's defaults",
        )
        return None
    return text


def _transport_tls(
    transport: etree._Element,
    type_el: etree._Element | None,
    kind: str | None,
    problems: _Problems,
) -> tuple[Path | None, Path | None, str | None] | None:
    """(certificate, private key, ciphers) of a Transport; None when something is wrong.

    A secure Type needs Certificate and PrivateKey, which must load together (the same
    check the listener makes when it starts); a plain Type must not have them.
    """
    els = {name: _first(transport, name) for name in _TLS_FILE_ELEMENTS}
    given = [el for el in els.values() if el is not None]
    if kind is None or type_el is None:
        return None
    if kind not in SECURE_TRANSPORT_TYPES:
        for el in given:
            problems.add(
                el,
                f"<{el.tag}> only applies to TLS transports (Type tcps or "
                f"amps-replication-secure), and this transport's Type is {kind}",
                f"remove <{el.tag}>, or set <Type>{_SECURE_TWIN.get(kind, 'tcps')}</Type> "
                "to accept TLS connections",
            )
        return None if given else (None, None, None)

    ok = True
    for name, what in (
        ("Certificate", "PEM certificate chain file (the listener's certificate first)"),
        ("PrivateKey", "PEM private key file of that certificate"),
    ):
        if els[name] is None:
            problems.add(
                type_el,
                f"Type {kind} needs a <{name}>: the {what}",
                f"add <{name}>/path/to/{_EXAMPLE_FILE[name]}</{name}> inside this "
                f"<Transport>, or set <Type>{_PLAIN_TWIN[kind]}</Type> for unencrypted "
                "connections",
            )
            ok = False
    cert_el, key_el, ciphers_el = els["Certificate"], els["PrivateKey"], els["Ciphers"]
    ciphers = _check_ciphers(ciphers_el, problems)
    ok &= ciphers_el is None or ciphers is not None
    cert = (
        _read_tls_file(cert_el, "PEM certificate chain file", problems)
        if cert_el is not None
        else None
    )
    key = _read_tls_file(key_el, "PEM private key file", problems) if key_el is not None else None
    if cert is not None and cert_el is not None:
        ok &= _check_certificate_pem(cert_el, cert[1], problems)
    if key is not None and key_el is not None:
        ok &= _check_private_key_pem(key_el, key[1], problems)
    if not ok or cert is None or key is None or cert_el is None or key_el is None:
        return None
    try:
        server_ssl_context(cert[0], key[0])
    except _PassphraseRequired as exc:
        problems.add(key_el, f"PrivateKey file {str(key[0])!r}: {exc}", "store it unencrypted")
        return None
    except ssl.SSLError as exc:
        _report_load_failure(cert_el, key_el, cert[0], key[0], exc, problems)
        return None
    except OSError as exc:  # pragma: no cover - the files were readable a moment ago
        problems.add(
            cert_el,
            f"the Certificate and PrivateKey files cannot be loaded: {exc.strerror or exc}",
            "check the paths and the files' permissions",
        )
        return None
    return cert[0], key[0], ciphers


def _report_load_failure(
    cert_el: etree._Element,
    key_el: etree._Element,
    cert: Path,
    key: Path,
    exc: ssl.SSLError,
    problems: _Problems,
) -> None:
    """Say which of Certificate and PrivateKey OpenSSL refused, and why."""
    if exc.reason == "KEY_VALUES_MISMATCH":
        problems.add(
            key_el,
            f"PrivateKey {str(key)!r} is not the key of Certificate {str(cert)!r} "
            f"(line {_line(cert_el)})",
            "give the private key that belongs to the certificate (when they match, "
            "`openssl x509 -noout -pubkey -in CERT` and `openssl pkey -pubout -in KEY` "
            "print the same public key), or the certificate issued for this key",
        )
        return
    try:
        ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT).load_verify_locations(cafile=cert)
    except ssl.SSLError:
        problems.add(
            cert_el,
            f"Certificate file {str(cert)!r} is damaged: OpenSSL cannot load it "
            f"({exc.reason or exc})",
            "re-export the certificate chain in PEM form (`openssl x509 -in CERT -text` "
            "shows whether a certificate is readable)",
        )
        return
    problems.add(
        key_el,
        f"PrivateKey file {str(key)!r} is damaged or of an unsupported kind: OpenSSL "
        f"cannot load it ({exc.reason or exc})",
        "re-export the key in PEM form (`openssl pkey -in KEY -noout` shows whether it is "
        "readable)",
    )


def _build_journal_topic(topic: etree._Element, problems: _Problems) -> JournalTopic | None:
    name_el = _first(topic, "Name")
    name = _text(name_el, problems)
    message_type = _text(_first(topic, "MessageType"), problems)
    if name_el is None or not name or not message_type:
        return None
    try:
        return JournalTopic(name, message_type)
    except re.error as exc:
        where = f" at position {exc.pos}" if exc.pos is not None else ""
        problems.add(
            name_el,
            f"Topic Name {name!r} is not a valid regular expression: {exc.msg}{where}",
            "correct the expression, or escape regex characters with a backslash to "
            "match them literally (e.g. orders\\.new)",
        )
        return None


def _build_transaction_log(
    root: etree._Element, problems: _Problems
) -> TransactionLogConfig | None:
    log = _first(root, "TransactionLog")
    if log is None:
        return None
    ok = True

    directory = _text(_first(log, "JournalDirectory"), problems)
    ok &= bool(directory)

    topics: list[JournalTopic] = []
    for topic_el in _children(log, "Topic"):
        topic = _build_journal_topic(topic_el, problems)
        if topic is None:
            ok = False
        else:
            topics.append(topic)

    flush_interval = DEFAULT_FLUSH_INTERVAL
    flush_el = _first(log, "FlushInterval")
    if flush_el is not None:
        value = _duration_value(flush_el, problems)
        if value is None:
            ok = False
        elif not MIN_FLUSH_INTERVAL <= value <= MAX_FLUSH_INTERVAL:
            problems.add(
                flush_el,
                f"FlushInterval {_text(flush_el, problems)} is out of range",
                "use a value from 1us to 1s, e.g. 100ms (the default)",
            )
            ok = False
        else:
            flush_interval = float(value)

    journal_size = DEFAULT_JOURNAL_SIZE
    size_els = _children(log, "JournalSize") + _children(log, "MinJournalSize")
    if len(size_els) > 1 and {str(e.tag) for e in size_els} == {"JournalSize", "MinJournalSize"}:
        later = max(size_els, key=lambda e: _line(e) or 0)
        problems.add(
            later,
            "JournalSize and MinJournalSize are the same setting and both are given",
            "keep only one of <JournalSize> and <MinJournalSize>",
        )
        ok = False
    elif size_els:
        size = _bytes_value(size_els[0], problems)
        ok &= size is not None
        if size is not None and size < MIN_JOURNAL_SIZE:
            problems.add(
                size_els[0],
                f"{size_els[0].tag} {_text(size_els[0], problems)} is below the minimum "
                "journal size of 10MB",
                "use 10MB or more; the default is 1GB",
            )
            ok = False
        journal_size = size or journal_size

    archive_el = _first(log, "JournalArchiveDirectory")
    archive_directory = _text(archive_el, problems) if archive_el is not None else None

    preallocated = DEFAULT_PREALLOCATED_JOURNAL_FILES
    prealloc_el = _first(log, "PreallocatedJournalFiles")
    prealloc_text = _text(prealloc_el, problems)
    if prealloc_el is not None and prealloc_text is not None:
        if prealloc_text.isascii() and prealloc_text.isdigit() and int(prealloc_text) >= 1:
            preallocated = int(prealloc_text)
        else:
            problems.add(
                prealloc_el,
                f"PreallocatedJournalFiles {prealloc_text!r} is not a whole number of at least 1",
                "use a whole number such as 2 (the default)",
            )
            ok = False

    durability = _optional_choice(log, "Durability", "fsync", problems)
    compression = _optional_choice(log, "Compression", "none", problems)

    map_size = DEFAULT_MAP_SIZE
    map_el = _first(log, "MapSize")
    if map_el is not None:
        value_bytes = _bytes_value(map_el, problems)
        if value_bytes is None:
            ok = False
        elif value_bytes < MIN_MAP_SIZE:
            problems.add(
                map_el,
                f"MapSize {_text(map_el, problems)} is too small; the minimum is 1MB",
                "use a size of at least 1MB; the default is 64GB",
            )
            ok = False
        else:
            map_size = value_bytes
    if ok and journal_size > map_size and size_els:
        problems.add(
            size_els[0],
            f"{size_els[0].tag} ({journal_size} bytes) is larger than MapSize "
            f"({map_size} bytes), so one journal segment could never fit",
            f"lower {size_els[0].tag} or raise MapSize",
        )
        ok = False

    if not ok or directory is None or durability is None or compression is None:
        return None
    return TransactionLogConfig(
        journal_directory=Path(directory),
        topics=tuple(topics),
        flush_interval=flush_interval,
        journal_size=journal_size,
        archive_directory=Path(archive_directory) if archive_directory else None,
        durability=durability,
        compression=compression,
        map_size=map_size,
        preallocated_journal_files=preallocated,
    )


def _optional_choice(
    parent: etree._Element, name: str, default: str, problems: _Problems
) -> str | None:
    """An enumerated child's value (already checked by the walk), or the default."""
    el = _first(parent, name)
    return default if el is None else _text(el, problems)


def _split_list(text: str) -> list[str]:
    return [item.strip() for item in text.split(",") if item.strip()]


def _check_code_patterns(el: etree._Element | None, problems: _Problems) -> str | None:
    text = _text(el, problems)
    if el is None or text is None:
        return None
    for item in _split_list(text):
        try:
            re.compile(item)
        except re.error as exc:
            problems.add(
                el,
                f"{el.tag} entry {item!r} is not a valid regular expression: {exc.msg}",
                "list event codes separated by commas (e.g. 00-0001,12-1.*); "
                "each entry is a code or a regular expression",
            )
            return None
    return text


def _build_logging(root: etree._Element, problems: _Problems) -> tuple[LogTarget, ...]:
    targets: list[LogTarget] = []
    for target in _children(_first(root, "Logging"), "Target"):
        ok = True
        protocol = _text(_first(target, "Protocol"), problems)
        level_el = _first(target, "Level")
        levels_el = _first(target, "Levels")
        level = _text(level_el, problems) if level_el is not None else None
        ok &= level_el is None or level is not None
        if level is None and level_el is None:
            level = "none" if levels_el is not None else "info"

        levels: tuple[str, ...] = ()
        levels_text = _text(levels_el, problems)
        if levels_el is not None and levels_text:
            named = _split_list(levels_text)
            valid = [lvl for lvl in LOG_LEVELS if lvl != "none"]
            bad = [lvl for lvl in named if lvl not in valid]
            if bad:
                close = _closest(bad[0], valid)
                suggestion = f"; did you mean {close!r}?" if close else ""
                problems.add(
                    levels_el,
                    f"{bad[0]!r} in Levels is not a log level{suggestion}",
                    f"list levels separated by commas, from: {_one_of(valid)}",
                )
                ok = False
            levels = tuple(dict.fromkeys(named))

        file_el = _first(target, "FileName")
        file_name = _text(file_el, problems)
        rotation_el = _first(target, "RotationThreshold")
        rotation = _bytes_value(rotation_el, problems) if rotation_el is not None else None
        ok &= rotation_el is None or rotation is not None
        include = _check_code_patterns(_first(target, "IncludeErrors"), problems)
        exclude = _check_code_patterns(_first(target, "ExcludeErrors"), problems)
        ok &= include is not None or _first(target, "IncludeErrors") is None
        ok &= exclude is not None or _first(target, "ExcludeErrors") is None

        if protocol == "file" and file_el is None:
            problems.add(
                target,
                "a log target with Protocol file needs a <FileName>",
                "add e.g. <FileName>./logs/amps-%Y%m%d-%n.log</FileName> inside this <Target>",
            )
            ok = False
        if protocol in ("stdout", "stderr"):
            for el in (file_el, rotation_el):
                if el is not None:
                    problems.add(
                        el,
                        f"<{el.tag}> only applies to targets with Protocol file, "
                        f"and this target writes to {protocol}",
                        f"remove <{el.tag}>, or set <Protocol>file</Protocol>",
                    )
                    ok = False
        if protocol == "file" and rotation_el is not None and file_name and "%n" not in file_name:
            problems.add(
                rotation_el,
                "RotationThreshold is set but FileName has no %n rotation counter, "
                "so a rotated file would overwrite the previous one",
                "add %n to FileName, e.g. ./logs/amps-%n.log",
            )
            ok = False

        if not ok or protocol is None or level is None:
            continue
        targets.append(
            LogTarget(
                protocol=protocol,
                level=level,
                levels=levels,
                file_name=file_name if protocol == "file" else None,
                rotation_threshold=rotation,
                include_errors=include,
                exclude_errors=exclude,
            )
        )
    return tuple(targets)


# ------------------------------------------------------------------------ replication

_FILTER_FIX = "correct the filter (see the content filter syntax), e.g. /region = 'EU'"
_LOCAL_HOSTS = frozenset({"0.0.0.0", "::", "localhost"})
_NON_EXCLUDABLE_REASONS: Final[Mapping[str, str]] = {
    "queue": "a topic that is a queue here must be a queue on the destination too",
    "queue_underlying": "a replicated queue must have the same underlying topic and "
    "filter on both sides",
}


def _is_local_host(host: str) -> bool:
    if host in _LOCAL_HOSTS:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _same_endpoint(listener: tuple[str, int], target: tuple[str, int]) -> bool:
    """Whether connecting to ``target`` reaches ``listener`` of this instance.

    Same port and same host, where a wildcard or loopback listener is also reached
    through any loopback name (``0.0.0.0:9104`` is reached by ``localhost:9104``).
    """
    (listen_host, listen_port), (host, port) = listener, target
    if listen_port != port or listen_port == 0:
        return False
    if listen_host == host:
        return True
    return _is_local_host(listen_host) and _is_local_host(host)


def _check_label(el: etree._Element | None, problems: _Problems) -> str | None:
    """A Destination Name: it is part of the link's client name (``a!b!sync!...``)."""
    text = _text(el, problems)
    if el is None or not text:
        return None
    bad = sorted(set("!/\\") & set(text))
    if bad:
        problems.add(
            el,
            f"Destination Name {text!r} contains {' and '.join(repr(c) for c in bad)}; "
            "it becomes part of the link's client name",
            "use letters, digits, '-', '_' or '.', e.g. the remote instance's Name",
        )
        return None
    if len(text) > MAX_NAME_LENGTH:
        problems.add(
            el,
            f"Destination Name is {len(text)} characters long; the limit is {MAX_NAME_LENGTH}",
            f"shorten it to at most {MAX_NAME_LENGTH} characters",
        )
        return None
    return text


def _compile_regex(el: etree._Element, what: str, fix: str, problems: _Problems) -> bool:
    text = _text(el, problems)
    if text is None:
        return False
    try:
        re.compile(text)
    except re.error as exc:
        where = f" at position {exc.pos}" if exc.pos is not None else ""
        problems.add(
            el, f"{what} {text!r} is not a valid regular expression: {exc.msg}{where}", fix
        )
        return False
    return True


def _check_filter(el: etree._Element | None, problems: _Problems) -> tuple[bool, str | None]:
    """(ok, filter text); a filter that does not compile is reported on its own line."""
    text = _text(el, problems)
    if el is None or text is None:
        return el is None, None
    try:
        compile_filter(text)
    except FilterError as exc:
        raw = el.text or ""
        lead = len(raw) - len(raw.lstrip())
        line = (_line(el) or 1) + raw.count("\n", 0, lead + exc.position)
        problems.add(
            el,
            f"Filter {_snippet(text)!r} is not a valid content filter: {exc.problem} "
            f"(column {exc.column})",
            exc.hint or _FILTER_FIX,
            line=line,
        )
        return False, None
    return True, text


def _check_exclusions(el: etree._Element | None, problems: _Problems) -> tuple[str, ...] | None:
    """The ExcludeValidation names, or None (and a problem) when one is not allowed."""
    text = _text(el, problems)
    if el is None or text is None:
        return () if el is None else None
    excludable = [
        c for c in REPLICATION_VALIDATION_CHECKS if c not in NON_EXCLUDABLE_VALIDATION_CHECKS
    ]
    names = _split_list(text)
    if not names:
        problems.add(
            el,
            "ExcludeValidation names no check",
            f"list checks separated by commas, from: {_one_of(excludable)}; or remove it",
        )
        return None
    ok = True
    for name in names:
        if name in NON_EXCLUDABLE_VALIDATION_CHECKS:
            problems.add(
                el,
                f"the {name} validation check cannot be excluded: {_NON_EXCLUDABLE_REASONS[name]}",
                f"remove {name} from ExcludeValidation; checks that can be excluded are: "
                f"{_one_of(excludable)}",
            )
            ok = False
        elif name not in REPLICATION_VALIDATION_CHECKS:
            close = _closest(name, REPLICATION_VALIDATION_CHECKS)
            suggestion = f"; did you mean {close!r}?" if close else ""
            problems.add(
                el,
                f"{name!r} in ExcludeValidation is not a validation check{suggestion}",
                f"list checks separated by commas, from: {_one_of(excludable)}",
            )
            ok = False
    return tuple(dict.fromkeys(names)) if ok else None


def _build_replication_topic(topic: etree._Element, problems: _Problems) -> ReplicationTopic | None:
    name_el = _first(topic, "Name")
    name = _text(name_el, problems)
    message_type = _text(_first(topic, "MessageType"), problems)
    filter_ok, filter_text = _check_filter(_first(topic, "Filter"), problems)
    exclusions = _check_exclusions(_first(topic, "ExcludeValidation"), problems)
    if (name_el is not None and not name) or not message_type:
        return None
    if name_el is not None and not _compile_regex(
        name_el,
        "Topic Name",
        "correct the expression, or escape regex characters with a backslash to "
        "match them literally (e.g. orders\\.new); omit Name to replicate every topic",
        problems,
    ):
        return None
    if not filter_ok or exclusions is None:
        return None
    return ReplicationTopic(name, message_type, filter_text, exclusions)


def _destination_addr(el: etree._Element, problems: _Problems) -> tuple[str, int] | None:
    """A Destination InetAddr: where to connect (a bare port means this host)."""
    text = _text(el, problems)
    if not text:
        return None
    try:
        host, port = _parse_inet_addr(text)
    except _BadValue as bad:
        problems.add(el, bad.message, bad.fix)
        return None
    if port == 0:
        problems.add(
            el,
            f"InetAddr {text} has port 0, which cannot be connected to",
            "give the port of the remote instance's amps-replication transport, e.g. host:9004",
        )
        return None
    if not text.startswith("[") and ":" not in text:
        host = "127.0.0.1"
    return host, port


def _reconnect_timeouts(el: etree._Element | None, problems: _Problems) -> tuple[float, ...] | None:
    text = _text(el, problems)
    if el is None or text is None:
        return DEFAULT_RECONNECT_TIMEOUTS if el is None else None
    items = _split_list(text)
    timeouts: list[float] = []
    for item in items:
        try:
            value = parse_duration(item)
        except UnitError as exc:
            problems.add(
                el,
                f"{exc.text!r} is not a valid duration for ReconnectTimeout",
                f"{exc.accepted}; give one duration or a comma-separated back-off "
                "sequence such as 1s,2s,4s,8s",
            )
            return None
        if value <= 0:
            problems.add(
                el,
                f"ReconnectTimeout {item!r} is not more than 0",
                "use durations above 0, e.g. 1s,2s,4s,8s (the default)",
            )
            return None
        timeouts.append(value)
    if not timeouts:
        problems.add(
            el,
            "ReconnectTimeout names no duration",
            "give one duration or a comma-separated back-off sequence such as 1s,2s,4s,8s",
        )
        return None
    return tuple(timeouts)


def _positive_duration(
    parent: etree._Element, name: str, default: float, problems: _Problems, *, zero_ok: bool
) -> float | None:
    el = _first(parent, name)
    if el is None:
        return default
    value = _duration_value(el, problems)
    if value is None:
        return None
    if value < 0 or (value == 0 and not zero_ok):
        problems.add(
            el,
            f"{name} {_text(el, problems)} must be more than 0",
            f"use a duration above 0, e.g. {default:g}s (the default)",
        )
        return None
    return value


@dataclass(frozen=True)
class _Self:
    """What a Destination is checked against: this instance's own identity."""

    name: str | None
    group: str | None
    replication: TransportConfig | None
    clients: tuple[TransportConfig, ...]
    has_replication_listener: bool  # an amps-replication Transport, even a faulty one


def _build_destination(
    dest: etree._Element,
    own: _Self,
    names: dict[str, etree._Element],
    targets: dict[tuple[str, int], tuple[str, etree._Element]],
    problems: _Problems,
) -> DestinationConfig | None:
    ok = True
    name_el = _first(dest, "Name")
    name = _check_label(name_el, problems)
    if name_el is not None and name is not None:
        if name in names:
            problems.add(
                name_el,
                f"destination name {name!r} is already used by the destination on line "
                f"{_line(names[name])}",
                "give each Destination a unique Name (usually the remote instance's Name)",
            )
            name = None
        else:
            names[name] = dest

    group_el = _first(dest, "Group")
    group = _check_name(group_el, problems) if group_el is not None else None
    ok &= group_el is None or group is not None
    if name_el is not None and name and group and (name, group) == (own.name, own.group):
        problems.add(
            name_el,
            f"Destination {name!r} in Group {group!r} is this instance itself: it "
            "replicates to itself",
            "set Name and Group to those of the remote instance",
        )
        ok = False

    sync_type = _text(_first(dest, "SyncType"), problems)

    topics: list[ReplicationTopic] = []
    for topic_el in _children(dest, "Topic"):
        topic = _build_replication_topic(topic_el, problems)
        if topic is None:
            ok = False
        else:
            topics.append(topic)

    passthrough: list[str] = []
    for pass_el in _children(dest, "PassThrough"):
        if _compile_regex(
            pass_el,
            "PassThrough",
            "correct the expression; it is searched for in the Group of the instance a "
            "message came from, e.g. ^NewYork$, or .* for every group",
            problems,
        ):
            passthrough.append(_text(pass_el, problems) or "")
        else:
            ok = False

    inet_addrs: list[tuple[str, int]] = []
    transport_el = _first(dest, "Transport")
    reconnect = _reconnect_timeouts(_first(transport_el, "ReconnectTimeout"), problems)
    ok &= reconnect is not None
    for inet_el in _children(transport_el, "InetAddr"):
        address = _destination_addr(inet_el, problems)
        if address is None:
            ok = False
            continue
        shown = _inet_text(address)
        listener = own.replication
        client = next((t for t in own.clients if _same_endpoint((t.host, t.port), address)), None)
        if listener is not None and _same_endpoint((listener.host, listener.port), address):
            problems.add(
                inet_el,
                f"Destination {name or '?'!r} replicates to itself: InetAddr {shown} is this "
                f"instance's own amps-replication transport {listener.name!r}",
                "point InetAddr at the remote instance's amps-replication transport",
            )
        elif client is not None:
            problems.add(
                inet_el,
                f"InetAddr {shown} is this instance's client transport {client.name!r}; "
                "replication connects to an amps-replication transport",
                "point InetAddr at the remote instance's amps-replication transport",
            )
        elif address in inet_addrs:
            problems.add(
                inet_el,
                f"InetAddr {shown} is listed twice in this Destination",
                "list each failover address once, in priority order",
            )
        elif address in targets:
            other, other_el = targets[address]
            problems.add(
                inet_el,
                f"InetAddr {shown} is already used by destination {other!r} on line "
                f"{_line(other_el)}; one instance replicates to another over one link",
                "merge the two Destinations (several Topic entries can share one), "
                "or correct the address",
            )
        else:
            inet_addrs.append(address)
            targets[address] = (name or "?", inet_el)
            continue
        ok = False

    if transport_el is None and not own.has_replication_listener and not problems.faulty(dest):
        problems.add(
            dest,
            f"Destination {name or '?'!r} has no Transport, so it waits for the remote "
            "instance to connect, but this instance has no amps-replication transport "
            "to accept that connection",
            "add <Transport><Type>amps-replication</Type><InetAddr>host:port</InetAddr>"
            "</Transport> to the Destination, or an amps-replication Transport to "
            "<Transports>",
        )
        ok = False

    tls = _destination_tls(transport_el, problems)
    ok &= tls is not None
    authenticator_el = _first(transport_el, "Authenticator")
    authenticator = (
        _link_authenticator(authenticator_el, problems) if authenticator_el is not None else None
    )
    ok &= authenticator_el is None or authenticator is not None

    ack = _positive_duration(
        dest, "AckConflationInterval", DEFAULT_ACK_CONFLATION_INTERVAL, problems, zero_ok=True
    )
    heartbeat = _positive_duration(
        dest, "HeartbeatInterval", DEFAULT_HEARTBEAT_INTERVAL, problems, zero_ok=False
    )
    compression = _optional_choice(dest, "Compression", "none", problems)

    if (
        not ok
        or name is None
        or sync_type is None
        or reconnect is None
        or ack is None
        or heartbeat is None
        or compression is None
        or tls is None
    ):
        return None
    return DestinationConfig(
        name=name,
        group=group,
        sync_type=sync_type,
        topics=tuple(topics),
        passthrough=tuple(passthrough),
        inet_addrs=tuple(inet_addrs),
        reconnect_timeouts=reconnect,
        ack_conflation_interval=ack,
        compression=compression,
        heartbeat_interval=heartbeat,
        secure=tls[0],
        ca_file=tls[1],
        server_name=tls[2],
        authenticator=authenticator,
        line=_line(dest),
    )


def _link_authenticator(el: etree._Element, problems: _Problems) -> LinkAuthenticator | None:
    """The ``Destination/Transport/Authenticator``; None (and problems) when wrong.

    Never puts a password in a problem: messages name the elements only.
    """
    module = _text(_first(el, "Module"), problems)
    options = _first(el, "Options")
    given = {
        tag: option
        for tag in ("Username", "Password", "PasswordFile", "PasswordEnv")
        if (option := _first(options, tag)) is not None
    }
    if module is None or problems.faulty(el):
        return None
    if module == DEFAULT_LINK_AUTHENTICATOR:
        for tag, option in given.items():
            problems.add(
                option,
                f"<{tag}> is only used by the {PASSWORD_LINK_AUTHENTICATOR} module; "
                f"{DEFAULT_LINK_AUTHENTICATOR} sends no credentials",
                f"remove <{tag}>, or set <Module>{PASSWORD_LINK_AUTHENTICATOR}</Module> "
                "to log on with a user and password",
            )
        return None if given else LinkAuthenticator(DEFAULT_LINK_AUTHENTICATOR)
    ok = True
    example = "<Options><Username>repl</Username><PasswordEnv>REPL_PW</PasswordEnv></Options>"
    user_el = given.get("Username")
    username = _text(user_el, problems)
    if user_el is None:
        problems.add(
            options if options is not None else el,
            f"the {PASSWORD_LINK_AUTHENTICATOR} module needs Options/Username",
            f"add the user the link logs on as, e.g. {example}",
        )
        ok = False
    elif username is not None and not _LINK_USER.fullmatch(username):
        problems.add(
            user_el,
            f"Username {username!r} contains whitespace or ':', which no user name can",
            "give the user name as written in the remote instance's password file",
        )
        ok = False
    sources = [given[t] for t in ("Password", "PasswordFile", "PasswordEnv") if t in given]
    if not sources:
        problems.add(
            options if options is not None else el,
            f"the {PASSWORD_LINK_AUTHENTICATOR} module needs a password: one of "
            "Options/Password, Options/PasswordFile or Options/PasswordEnv",
            f"add one, e.g. {example}",
        )
        return None
    for extra in sources[1:]:
        problems.add(
            extra,
            f"<{extra.tag}> is given as well as <{sources[0].tag}> (line {_line(sources[0])}); "
            "an Authenticator takes exactly one password source",
            f"keep one of <Password>, <PasswordFile> and <PasswordEnv> and remove <{extra.tag}>",
        )
        ok = False
    source = sources[0]
    value = _text(source, problems)
    if value is None or not ok or username is None:
        return None
    if source.tag == "Password":
        return LinkAuthenticator(PASSWORD_LINK_AUTHENTICATOR, username, password=value)
    if source.tag == "PasswordEnv":
        if not _ENV_NAME.fullmatch(value):
            problems.add(
                source,
                # the value is not echoed: it may well be the password itself
                "PasswordEnv is not an environment variable name",
                "give the variable's name (letters, digits and _, not starting with a "
                "digit), e.g. REPL_PW, not its value or ${...}",
            )
            return None
        return LinkAuthenticator(PASSWORD_LINK_AUTHENTICATOR, username, password_env=value)
    path = Path(value)
    try:
        read_password_file(path)
    except LinkCredentialsError as exc:
        looked = "" if path.is_absolute() else f" (looked for in {Path.cwd()})"
        problems.add(
            source,
            f"{exc}{looked}",
            "give a file readable by the user that runs amps-py whose first line is the "
            f"password; {_PATH_HINT.replace('NAME.pem', 'NAME')}",
        )
        return None
    return LinkAuthenticator(PASSWORD_LINK_AUTHENTICATOR, username, password_file=path)


def _destination_tls(
    transport_el: etree._Element | None, problems: _Problems
) -> tuple[bool, Path | None, str | None] | None:
    """(secure, CA file, server name) of a Destination Transport; None on a problem."""
    if transport_el is None:
        return False, None, None
    kind = _text(_first(transport_el, "Type"), problems)
    secure = kind == REPLICATION_SECURE_TRANSPORT_TYPE
    ca_el = _first(transport_el, "Certificate")
    name_el = _first(transport_el, "ServerName")
    if not secure:
        given = [el for el in (ca_el, name_el) if el is not None]
        if kind is not None:
            for el in given:
                problems.add(
                    el,
                    f"<{el.tag}> only applies to TLS links (Type amps-replication-secure), "
                    f"and this Transport's Type is {kind}",
                    f"remove <{el.tag}>, or set <Type>{REPLICATION_SECURE_TRANSPORT_TYPE}"
                    "</Type> to replicate over TLS",
                )
        return None if given else (False, None, None)
    ok = True
    ca_file: Path | None = None
    if ca_el is not None:
        read = _read_tls_file(ca_el, "PEM file of CA certificates", problems)
        ok = read is not None and _check_certificate_pem(ca_el, read[1], problems)
        if ok and read is not None:
            try:
                ssl.create_default_context(cafile=read[0])
            except ssl.SSLError as exc:
                problems.add(
                    ca_el,
                    f"Certificate file {str(read[0])!r} holds no CA certificate OpenSSL "
                    f"can load ({exc.reason or exc})",
                    "give a PEM file of the CA certificates that issued the remote "
                    "instance's certificate (or that certificate itself if it is "
                    "self-signed)",
                )
                ok = False
            else:
                ca_file = read[0]
    server_name = _text(name_el, problems)
    if name_el is not None and server_name is not None and not _is_host_name(server_name):
        problems.add(
            name_el,
            f"ServerName {server_name!r} is not a host name or IP address",
            "give the DNS name (or IP address) the remote instance's certificate is "
            "issued for, e.g. amps-b.example.com; omit ServerName to use the InetAddr host",
        )
        ok = False
    if not ok or (name_el is not None and not server_name):
        return None
    return True, ca_file, server_name


def _is_host_name(text: str) -> bool:
    try:
        ipaddress.ip_address(text)
    except ValueError:
        labels = text.rstrip(".").split(".")
        return len(text) <= 253 and all(_HOST_LABEL.fullmatch(label) for label in labels)
    return True


def _inet_text(address: tuple[str, int]) -> str:
    host, port = address
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _check_journaled(
    dest: etree._Element, log: TransactionLogConfig | None, problems: _Problems
) -> None:
    """Report Destination Topics that the transaction log certainly does not record."""
    if log is None:
        return
    for topic_el in _children(dest, "Topic"):
        name_el = _first(topic_el, "Name")
        type_el = _first(topic_el, "MessageType")
        name = _text(name_el, problems) if name_el is not None else None
        message_type = _text(type_el, problems)
        if type_el is None or not message_type or problems.faulty(topic_el):
            continue
        if not any(t.message_type == message_type for t in log.topics):
            problems.add(
                type_el,
                f"no {message_type} topic is recorded in the transaction log, so none "
                "can be replicated",
                f"add a <TransactionLog><Topic> with MessageType {message_type} "
                "for the topics to replicate",
            )
        elif (
            name_el is not None
            and name
            and not (_REGEX_METACHARACTERS & set(name))
            and not log.journals(name, message_type)
        ):
            problems.add(
                name_el,
                f"topic {name!r} ({message_type}) is not recorded in the transaction log, "
                "so it cannot be replicated",
                "add a <TransactionLog><Topic> that records it, or correct the Name",
            )


def _build_replication(
    root: etree._Element,
    own: _Self,
    log: TransactionLogConfig | None,
    problems: _Problems,
) -> tuple[DestinationConfig, ...]:
    replication = _first(root, "Replication")
    destination_els = _children(replication, "Destination")
    if replication is not None and destination_els and _first(root, "TransactionLog") is None:
        problems.add(
            replication,
            "replication sends messages from the transaction log, but this instance has "
            "no <TransactionLog>",
            "add a <TransactionLog> that records the topics to replicate",
        )
    if _first(root, "TransactionLog") is None:
        for transport in _children(_first(root, "Transports"), "Transport"):
            kinds = [(t.text or "").strip() for t in _children(transport, "Type")]
            if REPLICATION_TRANSPORT_TYPES & set(kinds):
                problems.add(
                    transport,
                    "the amps-replication transport stores what upstream instances send "
                    "in the transaction log, but this instance has no <TransactionLog>",
                    "add a <TransactionLog> that records the replicated topics, or remove "
                    "this transport",
                )
                break
    names: dict[str, etree._Element] = {}
    targets: dict[tuple[str, int], tuple[str, etree._Element]] = {}
    destinations: list[DestinationConfig] = []
    for dest in destination_els:
        built = _build_destination(dest, own, names, targets, problems)
        _check_journaled(dest, log, problems)
        if built is not None:
            destinations.append(built)
    return tuple(destinations)


def _module_file(
    section: etree._Element,
    option: str,
    wants_file: str,
    what: str,
    load: Callable[[Path], object],
    problems: _Problems,
) -> tuple[str | None, Path | None]:
    """(Module, path of Options/<option>) of an Authentication/Entitlement element.

    ``wants_file`` is the module that needs the file; any other module must not have
    it. The file is loaded with ``load`` so that a missing or malformed file is a
    configuration problem now rather than a failure at start-up.
    """
    tag = str(section.tag)
    module_el = _first(section, "Module")
    module = _text(module_el, problems)
    file_el = _first(_first(section, "Options"), option)
    text = _text(file_el, problems)
    if module is None:
        return None, None
    if module != wants_file:
        if file_el is not None and text:
            problems.add(
                file_el,
                f"Options/{option} is only used by the {wants_file} module, not by {module}",
                f"remove <{option}>, or set <Module>{wants_file}</Module>",
            )
        return module, None
    if file_el is None:
        problems.add(
            section,
            f"<{tag}> with Module {wants_file} needs Options/{option}",
            f"add <Options><{option}>FILE</{option}></Options> naming the {what}",
        )
        return module, None
    if not text:
        return module, None
    path = Path(text)
    try:
        load(path)
    except auth.AuthFileError as exc:
        where = exc.path if exc.line is None else f"{exc.path}:{exc.line}"
        looked = "" if path.is_absolute() else f" (looked for in {Path.cwd()})"
        problems.add(
            file_el,
            f"{option} {where}: {exc.message}{looked if exc.line is None else ''}",
            f"{exc.fix}; {_PATH_HINT.replace('NAME.pem', 'NAME')}",
        )
        return module, None
    return module, path


def _build_authentication(root: etree._Element, problems: _Problems) -> AuthenticationConfig:
    section = _first(root, "Authentication")
    if section is None:
        return AuthenticationConfig()
    return _authentication_config(section, problems)


def _authentication_config(section: etree._Element, problems: _Problems) -> AuthenticationConfig:
    """An ``Authentication`` element (of AMPSConfig or of the replication Transport)."""
    module, path = _module_file(
        section,
        "PasswordFile",
        auth.PASSWORD_FILE_MODULE,
        "password file (amps-py users add FILE USER creates one)",
        auth.PasswordFile.load,
        problems,
    )
    return AuthenticationConfig(module or auth.DEFAULT_AUTHENTICATION_MODULE, path)


def _build_entitlement(root: etree._Element, problems: _Problems) -> EntitlementConfig:
    section = _first(root, "Entitlement")
    if section is None:
        return EntitlementConfig()
    module, path = _module_file(
        section,
        "RulesFile",
        auth.RULE_ENTITLEMENT_MODULE,
        "JSON rules file",
        auth.EntitlementRules.load,
        problems,
    )
    return EntitlementConfig(module or auth.DEFAULT_ENTITLEMENT_MODULE, path)


_ACTION_VARIABLE = re.compile(r"\{\{\s*([A-Za-z0-9_]+)\s*\}\}")
#: what a ``{{VAR}}`` stands for while a Condition is checked at load time: a word that
#: is valid both as a number and inside quotes
_SAMPLE_VARIABLE_VALUE = "0"
_CONDITION_FIX = (
    "write an AMPS filter, e.g. <Condition>'{{AMPS_CLIENT_NAME}}' LIKE '^important'</Condition>"
)


def _sample_condition(text: str) -> tuple[str, Callable[[int], int]]:
    """``text`` with every ``{{VAR}}`` replaced by a sample value, and a function that maps
    an offset in the result back to ``text`` (for error columns)."""
    pieces: list[str] = []
    # (offset in the result, offset in text, True inside a replaced variable)
    marks: list[tuple[int, int, bool]] = [(0, 0, False)]
    out = 0
    last = 0
    for match in _ACTION_VARIABLE.finditer(text):
        pieces.append(text[last : match.start()])
        out += match.start() - last
        marks.append((out, match.start(), True))
        pieces.append(_SAMPLE_VARIABLE_VALUE)
        out += len(_SAMPLE_VARIABLE_VALUE)
        marks.append((out, match.end(), False))
        last = match.end()
    pieces.append(text[last:])

    def original(position: int) -> int:
        at, source, inside = next(m for m in reversed(marks) if m[0] <= position)
        return source if inside else source + position - at

    return "".join(pieces), original


def _check_condition(option: etree._Element, text: str, problems: _Problems) -> bool:
    """Whether an If Condition compiles once its ``{{VAR}}`` are filled in."""
    sample, original = _sample_condition(text)
    try:
        compile_filter(sample)
    except FilterError as exc:
        raw = option.text or ""
        lead = len(raw) - len(raw.lstrip())
        position = original(exc.position)
        line = (_line(option) or 1) + raw.count("\n", 0, lead + position)
        column = position - (text.rfind("\n", 0, position) + 1) + 1
        problems.add(
            option,
            f"Condition {_snippet(text)!r} is not a valid AMPS filter: {exc.problem} "
            f"(column {column})",
            (exc.hint + "; " if exc.hint else "") + _CONDITION_FIX,
            line=line,
        )
        return False
    return True


def _check_if_module(
    el: etree._Element,
    module: str,
    options: Mapping[str, str],
    option_els: Mapping[str, etree._Element],
    problems: _Problems,
) -> bool:
    """The checks of one If module beyond its required Options."""
    if module == "amps-action-if-condition":
        condition = options.get("Condition")
        return not condition or _check_condition(option_els["Condition"], condition, problems)
    ok = True
    if not options.get("GreaterThan") and not options.get("LessThan"):
        problems.add(
            el,
            f"{module} needs Options/GreaterThan or Options/LessThan (the usage, in percent, "
            "that makes the condition true)",
            "add e.g. <Options><Path>./</Path><GreaterThan>90%</GreaterThan></Options>",
        )
        ok = False
    for name in ("GreaterThan", "LessThan"):
        value = options.get(name)
        if value:
            try:
                parse_percent(value)
            except UnitError as exc:
                problems.add(
                    option_els[name],
                    f"Options/{name}: {exc}",
                    "write a percentage of the file system's size, such as 90%",
                )
                ok = False
    return ok


def _build_action_module(
    el: etree._Element, known: Mapping[str, tuple[str, ...]], kind: str, problems: _Problems
) -> ActionModule | None:
    module_el = _first(el, "Module")
    module = _text(module_el, problems)
    if module_el is None or not module:
        return None
    options: dict[str, str] = {}
    option_els: dict[str, etree._Element] = {}
    options_el = _first(el, "Options")
    for option in _child_elements(options_el) if options_el is not None else []:
        options[str(option.tag)] = (option.text or "").strip()
        option_els[str(option.tag)] = option
    if module not in known:
        problems.add(
            module_el,
            f"{kind} module {module!r} is unknown",
            f"use one of {', '.join(sorted(known))}",
        )
        return None
    ok = True
    for required in known[module]:
        if not options.get(required):
            hint = {
                "Every": ", e.g. 30s",
                "Age": ", e.g. 30s or 7d",
                "Path": ", e.g. ./ (the file system holding that path is checked)",
                "Condition": (
                    " with an AMPS filter (AMPS calls this option Condition, not Expression)"
                    if "Expression" in options
                    else " with an AMPS filter, e.g. '{{AMPS_CLIENT_NAME}}' LIKE '^important'"
                ),
            }.get(required, "")
            problems.add(
                el,
                f"{module} needs Options/{required}",
                f"add <Options><{required}>...</{required}></Options>{hint}",
            )
            ok = False
    for name in ("Age", "GracePeriod"):
        value = options.get(name)
        if value:
            try:
                parse_duration(value)
            except UnitError as exc:
                problems.add(el, f"Options/{name}: {exc}", "write a duration such as 30s or 5m")
                ok = False
    minimum = options.get("MinimumSyncDestinations")
    if minimum is not None and not (minimum.isascii() and minimum.isdigit()):
        problems.add(
            el,
            f"Options/MinimumSyncDestinations {minimum!r} is not a whole number",
            "write how many sync destinations must stay sync, e.g. 1",
        )
        ok = False
    if kind == "If":
        ok = _check_if_module(el, module, options, option_els, problems) and ok
    if module == "amps-action-on-schedule" and options.get("Every"):
        from amps_py.schedule import ScheduleError, parse_every

        try:
            parse_every(options["Every"])
        except ScheduleError as exc:
            problems.add(el, str(exc), "e.g. <Every>30s</Every> or <Every>Monday at 17:47</Every>")
            ok = False
    if module == "amps-action-on-signal" and options.get("Signal") not in (
        None,
        "",
        "SIGUSR1",
        "SIGUSR2",
        "SIGHUP",
    ):
        problems.add(
            el,
            f"Signal {options['Signal']!r} cannot start an action (SIGINT and SIGTERM stop "
            "the instance, SIGQUIT is reserved)",
            "use SIGUSR1, SIGUSR2 or SIGHUP",
        )
        ok = False
    return ActionModule(module, options, _line(el) or 0) if ok else None


def _build_actions(root: etree._Element, problems: _Problems) -> tuple[ActionConfig, ...]:
    out: list[ActionConfig] = []
    for action in _children(_first(root, "Actions"), "Action"):
        built: dict[str, list[ActionModule | None]] = {}
        for kind, known in (
            ("On", ACTION_ON_MODULES),
            ("If", ACTION_IF_MODULES),
            ("Do", ACTION_DO_MODULES),
        ):
            built[kind] = [
                _build_action_module(el, known, kind, problems) for el in _children(action, kind)
            ]
        ons, ifs, dos = (
            tuple(m for m in built[kind] if m is not None) for kind in ("On", "If", "Do")
        )
        if ons and dos and all(None not in modules for modules in built.values()):
            out.append(ActionConfig(ons, dos, _line(action) or 0, ifs))
    return tuple(out)


def _build_admin(
    root: etree._Element, transports: Sequence[TransportConfig], problems: _Problems
) -> tuple[str, int] | None:
    section = _first(root, "Admin")
    if section is None:
        return None
    inet_el = _first(section, "InetAddr")
    text = _text(inet_el, problems)
    if inet_el is None or not text:
        return None
    try:
        address = _parse_inet_addr(text)
    except _BadValue as bad:
        problems.add(inet_el, bad.message, bad.fix)
        return None
    lines = {
        _text(_first(t, "Name"), problems): _line(inet)
        for t in _children(_first(root, "Transports"), "Transport")
        if (inet := _first(t, "InetAddr")) is not None
    }
    for transport in transports:
        listener = (transport.host, transport.port)
        if _ports_clash(address, listener, a_dual=False):
            problems.add(
                inet_el,
                f"Admin InetAddr {text} clashes with transport {transport.name!r} on line "
                f"{lines.get(transport.name, '?')}, which listens on the same port "
                f"({_listener_text(listener)}): the instance could not start",
                "give the admin interface a port of its own (or port 0 for a free one)",
            )
            return None
    return address


def _build_instance(root: etree._Element, source: str, problems: _Problems) -> InstanceConfig:
    name = _check_name(_first(root, "Name"), problems)
    group_el = _first(root, "Group")
    group = _check_name(group_el, problems) if group_el is not None else name
    description = _text(_first(root, "Description"), problems) or ""
    process_name = _text(_first(root, "ProcessName"), problems)
    transports = _build_transports(root, problems)
    transaction_log = _build_transaction_log(root, problems)
    logging_targets = _build_logging(root, problems)
    own = _Self(
        name=name,
        group=group,
        replication=next((t for t in transports if t.is_replication), None),
        clients=tuple(t for t in transports if not t.is_replication),
        has_replication_listener=any(
            (el.text or "").strip() in REPLICATION_TRANSPORT_TYPES
            for t in _children(_first(root, "Transports"), "Transport")
            for el in _children(t, "Type")
        ),
    )
    replication = _build_replication(root, own, transaction_log, problems)
    authentication = _build_authentication(root, problems)
    entitlement = _build_entitlement(root, problems)
    memory_limit, capacity, incomplete_limit = _build_memory_limits(root, transports, problems)
    return InstanceConfig(
        name=name or "",
        group=group or "",
        description=description,
        transports=transports,
        transaction_log=transaction_log,
        logging=logging_targets,
        source=source,
        process_name=process_name,
        replication=replication,
        authentication=authentication,
        entitlement=entitlement,
        admin=_build_admin(root, transports, problems),
        actions=_build_actions(root, problems),
        message_memory_limit=memory_limit,
        client_max_capacity=capacity,
        incomplete_message_memory_limit=incomplete_limit,
    )


def _loopback_only(host: str) -> bool:
    """Whether a listener bound to ``host`` is reachable from this machine only."""
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:  # "" (every interface) or a host name
        return host.lower() == "localhost" or host.lower().endswith(".localhost")


def security_warnings(config: InstanceConfig) -> list[str]:
    """What loads and runs, but leaves the instance open to anyone on the network, in
    sentences naming the setting and the fix (``amps-py config check`` prints them; they
    never stop an instance)."""
    warnings: list[str] = []
    transport = config.replication_transport
    if (
        transport is not None
        and config.replication_authentication.module == auth.DEFAULT_AUTHENTICATION_MODULE
        and not _loopback_only(transport.host)
    ):
        where = (
            "every interface"
            if transport.host in ("", "0.0.0.0", "::")
            else f"{transport.host}, beyond this machine"
        )
        warnings.append(
            f"replication transport {transport.name!r} ({transport.type}) listens on "
            f"{transport.address} ({where}) without authentication: any program that "
            "reaches it and names itself after a peer may write into this instance's "
            "journal (see Replication trust in docs/GUARANTEES.md). Fix: add "
            "<Authentication><Module>amps-password-file</Module><Options><PasswordFile>"
            "FILE</PasswordFile></Options></Authentication> to the transport (create FILE "
            "with `amps-py users add FILE USER`) and an Authenticator with that user to "
            "each upstream's Destination/Transport; or listen on 127.0.0.1 only"
        )
    return warnings


# ------------------------------------------------------------------ 5. XSD backstop

_SCHEMA_MESSAGES: tuple[tuple[re.Pattern[str], str, str], ...] = (
    (
        re.compile(r"This element is not expected\. Expected is one of \( (.*) \)"),
        "<{element}> is not allowed here",
        "use one of the elements allowed at this position: {0}",
    ),
    (
        re.compile(r"This element is not expected\. Expected is \( (.*) \)"),
        "<{element}> is not allowed here",
        "the element expected at this position is {0}",
    ),
    (
        re.compile(r"This element is not expected"),
        "<{element}> is not allowed here",
        "remove it; see config/amps.xsd for the elements allowed here",
    ),
    (
        re.compile(r"Missing child element\(s\)\. Expected is(?: one of)? \( (.*) \)"),
        "<{element}> is missing a required element",
        "add one of: {0}",
    ),
    (
        re.compile(
            r"\[facet 'enumeration'\] The value '(.*)' is not an element of the set \{(.*)\}"
        ),
        "{0!r} is not a valid {element}",
        "use one of: {1}",
    ),
    (
        re.compile(r"\[facet '(?:minLength|length)'\]"),
        "<{element}> is empty or too short",
        "give <{element}> a value",
    ),
    (
        re.compile(r"\[facet 'pattern'\] The value '(.*)' is not accepted"),
        "{0!r} is not in the form <{element}> requires",
        "see the documentation of <{element}> in config/amps.xsd",
    ),
    (
        re.compile(
            r"'(.*)' is not a valid value of the (?:atomic|local atomic) type '(?:xs:)?(\w+)'"
        ),
        "{0!r} is not a valid {element} (it must be a {1})",
        "write a {1} value",
    ),
    (
        re.compile(r"attribute '(.*)': The attribute '.*' is not allowed"),
        "attribute {0}= is not supported on <{element}>",
        "remove the attribute",
    ),
    (
        re.compile(r"No matching global declaration available for the validation root"),
        "the root element must be <AMPSConfig>, not <{element}>",
        "wrap the configuration in <AMPSConfig>...</AMPSConfig>",
    ),
    (
        re.compile(r"Character content other than whitespace is not allowed"),
        "<{element}> contains text, but it only holds elements",
        "remove the text, or put it inside the child element it belongs to",
    ),
    (
        re.compile(r"Element content is not allowed, because the content type is a simple"),
        "<{element}> holds a value and cannot contain elements",
        "remove the child elements of <{element}>",
    ),
)


def _translate_schema_error(message: str) -> tuple[str, str]:
    """Turn one libxml2 schema message into (plain message, fix)."""
    match = re.match(r"Element '([^']*)'(?:, (attribute '[^']*'))?: ", message)
    element = match.group(1) if match else "element"
    if element.startswith("{"):
        element = element.partition("}")[2]
    detail = message[match.end() :] if match else message
    if match and match.group(2):
        detail = f"{match.group(2)}: {detail}"
    for pattern, text, fix in _SCHEMA_MESSAGES:
        found = pattern.search(detail)
        if found:
            groups = [g.replace("'", "") if i else g for i, g in enumerate(found.groups())]
            return (
                text.format(*groups, element=element),
                fix.format(*groups, element=element),
            )
    return (
        f"<{element}> does not match the amps-py schema ({detail.rstrip('.')})",
        "compare with config/amps.xsd or the output of `amps-py config show-default`",
    )


def _schema_path_to_element(path: str | None) -> str:
    if not path:
        return ""
    parts = [re.sub(r"\[\d+\]$", "", p) for p in path.strip("/").split("/")]
    return "/".join(p.partition("}")[2] if p.startswith("{") else p for p in parts)


def _check_schema(root: etree._Element, schema: etree.XMLSchema, problems: _Problems) -> None:
    try:
        if schema.validate(root):
            return
    except etree.XMLSchemaValidateError as exc:  # pragma: no cover - libxml2 internal error
        problems.add(
            None,
            f"the document could not be checked against config/amps.xsd ({exc})",
            "simplify the document (no DTD, no entities) and try again",
            line=None,
            element="",
        )
        return
    covered = problems.covered_lines()
    for entry in _log_entries(schema.error_log):
        if entry.line in covered:
            continue
        message, fix = _translate_schema_error(entry.message)
        problems.add(
            None,
            message,
            fix,
            line=entry.line or None,
            element=_schema_path_to_element(entry.path),
        )


# -------------------------------------------------------------------------- entry points


def _parse(
    data: bytes,
    source: str,
    environ: Mapping[str, str] | None,
    config_path: Path | None,
) -> InstanceConfig:
    problems = _Problems(source)
    if not data.strip():
        problems.add(
            None,
            "the configuration is empty",
            "write an <AMPSConfig> document; `amps-py config show-default` prints one "
            "to start from",
            line=1,
            element="",
        )
        raise problems.error()
    root = _parse_xml(data, problems)
    if root is None:
        raise problems.error()

    values = dict(os.environ if environ is None else environ)
    values["AMPS_CONFIG_DIRECTORY"] = str(config_path.parent if config_path else Path.cwd())
    values["AMPS_CONFIG_PATH"] = str(config_path) if config_path else source
    values["AMPS_VERSION"] = __version__
    _drop_entity_references(root, problems)
    _strip_namespaces(root, problems)
    _substitute_all(root, values, problems)

    schema = _schema()
    if root.tag != _ROOT:
        tag = str(root.tag)
        hint = " (element names are case-sensitive)" if tag.lower() == _ROOT.lower() else ""
        problems.add(
            root,
            f"the root element must be <{_ROOT}>, not <{tag}>{hint}",
            f"rename the root element to <{_ROOT}>",
        )
    _check_structure(root, schema.model, problems, schema.index)
    config = _build_instance(root, source, problems)
    _check_schema(root, schema.xsd, problems)
    if problems.items:
        raise problems.error()
    return config


def parse_config(
    text: str | bytes,
    source: str = "<string>",
    environ: Mapping[str, str] | None = None,
) -> InstanceConfig:
    """Parse and validate configuration XML held in memory.

    Args:
        text: the XML document. ``str`` is parsed as Unicode whatever its encoding
            declaration says; ``bytes`` honour the declaration (UTF-8 by default).
        source: the name used in problems (``file:line``) and as ``InstanceConfig.source``.
        environ: variables for ``${VAR}`` substitution instead of ``os.environ``.
            ``AMPS_CONFIG_DIRECTORY`` (the working directory here), ``AMPS_CONFIG_PATH``
            (``source``) and ``AMPS_VERSION`` are always defined and take precedence.

    Returns:
        The validated configuration.

    Raises:
        ConfigError: with every problem found, each with file, line, element and fix.
    """
    data = text.encode("utf-8") if isinstance(text, str) else text
    if isinstance(text, str):
        # A str has already been decoded: drop any encoding declaration so that lxml
        # reads the bytes we hand it as the UTF-8 they are.
        data = re.sub(rb"^(\s*<\?xml[^>]*?)\s+encoding=(['\"])[^'\"]*\2", rb"\1", data)
    return _parse(data, source, environ, None)


def load_config(path: str | Path, environ: Mapping[str, str] | None = None) -> InstanceConfig:
    """Read, parse and validate an AMPS-style configuration file.

    Args:
        path: the config file. Problems name it as given.
        environ: variables for ``${VAR}`` substitution instead of ``os.environ``.
            ``AMPS_CONFIG_DIRECTORY`` (the file's absolute directory),
            ``AMPS_CONFIG_PATH`` (its absolute path) and ``AMPS_VERSION`` are always
            defined and take precedence.

    Returns:
        The validated configuration, with ``source`` set to ``str(path)``.

    Raises:
        ConfigError: the file cannot be read, or has problems (all of them are listed).
    """
    source = str(path)
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        reason = exc.strerror or str(exc)
        raise ConfigError(
            [
                ConfigProblem(
                    source,
                    None,
                    "",
                    f"cannot read the configuration file: {reason}",
                    "check the path and its permissions; `amps-py config show-default` "
                    "prints a configuration to start from",
                )
            ]
        ) from exc
    return _parse(data, source, environ, Path(path).resolve())


# ------------------------------------------------------------------------------ defaults

_DEFAULT_NAME = "amps-py"
_DEFAULT_TRANSPORT = "json-tcp"
_DEFAULT_HOST = "127.0.0.1"
_DEFAULT_PORT = 9007
#: where the embedded default serves the admin API (and ``amps-py admin`` looks)
DEFAULT_ADMIN_ADDRESS: Final = ("127.0.0.1", 8085)


def default_config(data_dir: Path = Path("amps-data")) -> InstanceConfig:
    """The configuration used when none is given.

    A standalone instance ``amps-py`` with one transport ``json-tcp`` (tcp, amps
    protocol, json messages) on 127.0.0.1:9007, a transaction log journaling every json
    topic into ``data_dir`` (archived journal segments in ``data_dir/archive``), the
    admin interface on 127.0.0.1:8085, and info-level logging to stdout. It is the same
    configuration as :func:`default_config_xml` describes.
    """
    return InstanceConfig(
        name=_DEFAULT_NAME,
        group=_DEFAULT_NAME,
        description="",
        transports=(
            TransportConfig(
                name=_DEFAULT_TRANSPORT,
                type="tcp",
                host=_DEFAULT_HOST,
                port=_DEFAULT_PORT,
                protocol="amps",
                message_type="json",
            ),
        ),
        transaction_log=TransactionLogConfig(
            journal_directory=data_dir,
            topics=(JournalTopic(".*", "json"),),
            archive_directory=data_dir / "archive",
        ),
        logging=(LogTarget(protocol="stdout", level="info"),),
        source="<embedded default>",
        admin=DEFAULT_ADMIN_ADDRESS,
    )


def default_config_xml(data_dir: str = "./amps-data") -> str:
    """The default configuration (see :func:`default_config`) as commented XML text.

    ``amps-py config show-default`` prints it; parsing it gives back
    ``default_config(Path(data_dir))`` (apart from ``source``).
    """
    directory = _xml_escape(data_dir)
    return f"""<?xml version="1.0" encoding="UTF-8"?>
<!-- amps-py default configuration: one standalone instance.
     Save this, edit it, and start the server with it. Element names are AMPS's and are
     case-sensitive; ${{VAR}} is replaced from the environment. -->
<AMPSConfig>
  <!-- Unique name of this instance; it prefixes the files the instance creates. -->
  <Name>{_DEFAULT_NAME}</Name>

  <Transports>
    <!-- Clients connect here, e.g. tcp://127.0.0.1:{_DEFAULT_PORT}/amps/json -->
    <Transport>
      <Name>{_DEFAULT_TRANSPORT}</Name>
      <Type>tcp</Type>
      <InetAddr>{_DEFAULT_HOST}:{_DEFAULT_PORT}</InetAddr>
      <Protocol>amps</Protocol>
      <MessageType>json</MessageType>
    </Transport>
  </Transports>

  <TransactionLog>
    <!-- The journal (LMDB) lives here. -->
    <JournalDirectory>{directory}</JournalDirectory>
    <!-- Record every topic with json messages. -->
    <Topic>
      <Name>.*</Name>
      <MessageType>json</MessageType>
    </Topic>
    <!-- Durability defaults to fsync: a persisted ack means the message is on disk. -->
    <!-- Journal segments of 1GB (JournalSize); `amps-py admin journal archive ID`
         moves sealed ones here, where replay and replication still read them. -->
    <JournalArchiveDirectory>{directory}/archive</JournalArchiveDirectory>
  </TransactionLog>

  <Logging>
    <Target>
      <Protocol>stdout</Protocol>
      <Level>info</Level>
    </Target>
  </Logging>

  <!-- The HTTP admin interface (/amps.json, /amps.xml, /metrics);
       `amps-py admin status` reads it. -->
  <Admin>
    <InetAddr>{DEFAULT_ADMIN_ADDRESS[0]}:{DEFAULT_ADMIN_ADDRESS[1]}</InetAddr>
  </Admin>
</AMPSConfig>
"""
