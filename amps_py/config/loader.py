"""The entry points: :func:`parse_config` and :func:`load_config` run every step over
one document and raise every problem at once; ``_build_instance`` calls the section
builders in a fixed order (which is the order of problems on the same line)."""

from __future__ import annotations

import dataclasses
import os
import re
from collections.abc import Mapping
from pathlib import Path

from lxml import etree

from amps_py import __version__
from amps_py.config.access import _build_authentication, _build_entitlement
from amps_py.config.actions import _build_actions
from amps_py.config.conflated import _build_conflated
from amps_py.config.log_targets import _build_logging
from amps_py.config.message_types import _build_message_types, _check_references
from amps_py.config.model import (
    REPLICATION_TRANSPORT_TYPES,
    InstanceConfig,
    TransportConfig,
    archived_queues,
)
from amps_py.config.parsing import (
    _drop_entity_references,
    _parse_xml,
    _strip_namespaces,
    _substitute_all,
)
from amps_py.config.problems import ConfigError, ConfigProblem, _Problems
from amps_py.config.queue import _build_queues
from amps_py.config.replication import _build_replication, _Self
from amps_py.config.schema import _ROOT, _check_schema, _schema
from amps_py.config.sow import _build_sow
from amps_py.config.structure import _check_structure
from amps_py.config.tls import _admin_tls
from amps_py.config.transaction_log import _build_transaction_log
from amps_py.config.transports import (
    _build_admin,
    _build_disk_limits,
    _build_memory_limits,
    _build_transports,
)
from amps_py.config.values import _check_name, _text
from amps_py.config.xmltree import _children, _first


def _own_side(
    root: etree._Element,
    name: str | None,
    group: str | None,
    transports: tuple[TransportConfig, ...],
) -> _Self:
    """What replication needs to know of this instance: names and transports."""
    return _Self(
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


def _build_instance(root: etree._Element, source: str, problems: _Problems) -> InstanceConfig:
    name = _check_name(_first(root, "Name"), problems)
    group_el = _first(root, "Group")
    group = _check_name(group_el, problems) if group_el is not None else name
    description = _text(_first(root, "Description"), problems) or ""
    process_name = _text(_first(root, "ProcessName"), problems)
    message_types = _build_message_types(root, problems)
    _check_references(root, message_types, problems)
    transports = _build_transports(root, problems)
    transaction_log = _build_transaction_log(root, problems)
    logging_targets = _build_logging(root, problems)
    own = _own_side(root, name, group, transports)
    replication = _build_replication(root, own, transaction_log, problems)
    authentication = _build_authentication(root, problems)
    entitlement = _build_entitlement(root, problems)
    memory_limit, capacity, incomplete_limit = _build_memory_limits(root, transports, problems)
    disk_limit, disk_path, age_limit = _build_disk_limits(root, problems)
    sow_topics = _build_sow(root, transaction_log, problems, message_types)
    queues = _build_queues(root, transaction_log, problems)
    conflated_topics = _build_conflated(root, sow_topics, queues, problems)
    replication = tuple(
        dataclasses.replace(d, archived_queues=archived)
        if (archived := archived_queues(d.topics, queues))
        else d
        for d in replication
    )
    return InstanceConfig(
        name=name or "",
        group=group or "",
        description=description,
        transports=transports,
        message_types=message_types,
        transaction_log=transaction_log,
        logging=logging_targets,
        source=source,
        process_name=process_name,
        replication=replication,
        authentication=authentication,
        entitlement=entitlement,
        admin=_build_admin(root, transports, problems),
        admin_tls=_admin_tls(_first(root, "Admin"), problems),
        actions=_build_actions(root, problems),
        message_memory_limit=memory_limit,
        client_max_capacity=capacity,
        incomplete_message_memory_limit=incomplete_limit,
        message_disk_limit=disk_limit,
        message_disk_path=disk_path,
        client_message_age_limit=age_limit,
        sow_topics=sow_topics,
        conflated_topics=conflated_topics,
        queues=queues,
    )


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
