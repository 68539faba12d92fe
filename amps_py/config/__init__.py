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

The package, one module per step or section:

- ``model``            the option objects and their defaults (no XML, no lxml), with
  ``credentials`` (a replication link's Authenticator), ``sow_model``
  (:class:`SowTopicConfig`, :class:`ConflatedTopicConfig`) and ``queue_model``
  (:class:`QueueConfig`), which it re-exports; ``sow_pattern`` (whether a
  TransactionLog provably records every topic a SOW Pattern matches; no lxml);
- ``defaults``         the configuration used when none is given;
- ``security``         settings that run but leave an instance open (no lxml);
- ``problems``         :class:`ConfigProblem`, :class:`ConfigError` and the collector;
- ``xmltree``, ``values``  element helpers; text -> durations, sizes, names, addresses;
- ``parsing``          steps 1-2 (XML, ``${VAR}``, entities, namespaces);
- ``schema``, ``structure``  the model of amps.xsd, the structural walk, the XSD backstop;
- ``message_types`` (``MessageTypes``, and every ``MessageType`` checked against them),
  ``transports``, ``tls``, ``transaction_log``, ``log_targets``, ``replication``,
  ``access`` (authentication, entitlement, link authenticators), ``actions``, ``sow``,
  ``queue``, ``conflated`` (``SOW/ConflatedTopic``): step 4, one ``_build_<section>``
  per section;
- ``loader``           :func:`parse_config` and :func:`load_config`, which run them all.

The names below are importable from ``amps_py.config`` as before. Those of ``model``,
``defaults`` and ``security`` are imported with the package; the loader's (which need
lxml) on first use, so that ``import amps_py.config.model`` (as routing and link
validation do) loads no XML machinery.

Adding support for an AMPS element (Admin, Actions, SOW, ...):

* describe it in ``config/amps.xsd`` (the structural checks follow automatically);
* remove it from :data:`UNSUPPORTED_AMPS_ELEMENTS` (and its values from
  :data:`UNSUPPORTED_AMPS_VALUES`);
* add a frozen option class to ``model``, a ``_build_<section>`` function in the
  section's module, a call in ``loader._build_instance`` and a field on
  :class:`InstanceConfig`.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Final

from amps_py.config.defaults import DEFAULT_ADMIN_ADDRESS, default_config, default_config_xml
from amps_py.config.model import (
    ACTION_DO_MODULES,
    ACTION_IF_MODULES,
    ACTION_ON_MODULES,
    DEFAULT_ACK_CONFLATION_INTERVAL,
    DEFAULT_CLIENT_MAX_CAPACITY,
    DEFAULT_FLUSH_INTERVAL,
    DEFAULT_HEARTBEAT_INTERVAL,
    DEFAULT_INCOMPLETE_MESSAGE_MEMORY_LIMIT,
    DEFAULT_INCOMPLETE_MESSAGE_TIMEOUT,
    DEFAULT_JOURNAL_SIZE,
    DEFAULT_LINK_AUTHENTICATOR,
    DEFAULT_LOGON_TIMEOUT,
    DEFAULT_MAP_SIZE,
    DEFAULT_MAX_MESSAGE_SIZE,
    DEFAULT_PREALLOCATED_JOURNAL_FILES,
    DEFAULT_RECONNECT_TIMEOUTS,
    DEFAULT_SEQUENCE_GAP_THRESHOLD,
    FALLBACK_MESSAGE_MEMORY_LIMIT,
    LOG_LEVELS,
    MAX_DEFAULT_CLIENT_CAPACITY,
    MAX_FLUSH_INTERVAL,
    MAX_NAME_LENGTH,
    MIN_FLUSH_INTERVAL,
    MIN_JOURNAL_SIZE,
    MIN_MAP_SIZE,
    MIN_TLS_VERSION,
    NON_EXCLUDABLE_VALIDATION_CHECKS,
    PASSWORD_LINK_AUTHENTICATOR,
    REPLICATION_SECURE_TRANSPORT_TYPE,
    REPLICATION_TRANSPORT_TYPE,
    REPLICATION_TRANSPORT_TYPES,
    REPLICATION_VALIDATION_CHECKS,
    SECURE_TRANSPORT_TYPES,
    ActionConfig,
    ActionModule,
    AuthenticationConfig,
    ClientCapacity,
    ConflatedTopicConfig,
    DestinationConfig,
    EntitlementConfig,
    InstanceConfig,
    JournalTopic,
    LinkAuthenticator,
    LinkCredentialsError,
    LogTarget,
    QueueConfig,
    ReplicationTopic,
    ServerTls,
    SowTopicConfig,
    TransactionLogConfig,
    TransportConfig,
    default_message_memory_limit,
    read_password_file,
    server_ssl_context,
)
from amps_py.config.security import security_warnings

if TYPE_CHECKING:
    from amps_py.config.loader import load_config, parse_config
    from amps_py.config.problems import ConfigError, ConfigProblem
    from amps_py.config.schema import schema_path
    from amps_py.config.structure import UNSUPPORTED_AMPS_ELEMENTS, UNSUPPORTED_AMPS_VALUES

#: names imported on first use, by the module of this package that defines them
_LAZY: Final[dict[str, str]] = {
    "ConfigError": "problems",
    "ConfigProblem": "problems",
    "UNSUPPORTED_AMPS_ELEMENTS": "structure",
    "UNSUPPORTED_AMPS_VALUES": "structure",
    "load_config": "loader",
    "parse_config": "loader",
    "schema_path": "schema",
}

if not TYPE_CHECKING:  # mypy sees the imports above and checks every name strictly

    def __getattr__(name: str) -> object:
        module = _LAZY.get(name)
        if module is None:
            raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
        globals()[name] = value
        return value

    def __dir__() -> list[str]:
        return sorted({*globals(), *_LAZY})


__all__ = [
    "ACTION_DO_MODULES",
    "ACTION_IF_MODULES",
    "ACTION_ON_MODULES",
    "DEFAULT_ACK_CONFLATION_INTERVAL",
    "DEFAULT_ADMIN_ADDRESS",
    "DEFAULT_CLIENT_MAX_CAPACITY",
    "DEFAULT_FLUSH_INTERVAL",
    "DEFAULT_HEARTBEAT_INTERVAL",
    "DEFAULT_INCOMPLETE_MESSAGE_MEMORY_LIMIT",
    "DEFAULT_INCOMPLETE_MESSAGE_TIMEOUT",
    "DEFAULT_JOURNAL_SIZE",
    "DEFAULT_LINK_AUTHENTICATOR",
    "DEFAULT_LOGON_TIMEOUT",
    "DEFAULT_MAP_SIZE",
    "DEFAULT_MAX_MESSAGE_SIZE",
    "DEFAULT_PREALLOCATED_JOURNAL_FILES",
    "DEFAULT_RECONNECT_TIMEOUTS",
    "DEFAULT_SEQUENCE_GAP_THRESHOLD",
    "FALLBACK_MESSAGE_MEMORY_LIMIT",
    "LOG_LEVELS",
    "MAX_DEFAULT_CLIENT_CAPACITY",
    "MAX_FLUSH_INTERVAL",
    "MAX_NAME_LENGTH",
    "MIN_FLUSH_INTERVAL",
    "MIN_JOURNAL_SIZE",
    "MIN_MAP_SIZE",
    "MIN_TLS_VERSION",
    "NON_EXCLUDABLE_VALIDATION_CHECKS",
    "PASSWORD_LINK_AUTHENTICATOR",
    "REPLICATION_SECURE_TRANSPORT_TYPE",
    "REPLICATION_TRANSPORT_TYPE",
    "REPLICATION_TRANSPORT_TYPES",
    "REPLICATION_VALIDATION_CHECKS",
    "SECURE_TRANSPORT_TYPES",
    "UNSUPPORTED_AMPS_ELEMENTS",
    "UNSUPPORTED_AMPS_VALUES",
    "ActionConfig",
    "ActionModule",
    "AuthenticationConfig",
    "ClientCapacity",
    "ConfigError",
    "ConfigProblem",
    "ConflatedTopicConfig",
    "DestinationConfig",
    "EntitlementConfig",
    "InstanceConfig",
    "JournalTopic",
    "LinkAuthenticator",
    "LinkCredentialsError",
    "LogTarget",
    "QueueConfig",
    "ReplicationTopic",
    "ServerTls",
    "SowTopicConfig",
    "TransactionLogConfig",
    "TransportConfig",
    "default_config",
    "default_config_xml",
    "default_message_memory_limit",
    "load_config",
    "parse_config",
    "read_password_file",
    "schema_path",
    "security_warnings",
    "server_ssl_context",
]
