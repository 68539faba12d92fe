"""``Transports`` (listeners), the instance's memory limits and the ``Admin`` address."""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Final, TypedDict

from lxml import etree

from amps_py.config.access import _transport_access
from amps_py.config.model import (
    DEFAULT_INCOMPLETE_MESSAGE_TIMEOUT,
    DEFAULT_LOGON_TIMEOUT,
    DEFAULT_MAX_MESSAGE_SIZE,
    DEFAULT_SEQUENCE_GAP_THRESHOLD,
    REPLICATION_TRANSPORT_TYPE,
    REPLICATION_TRANSPORT_TYPES,
    AuthenticationConfig,
    ClientCapacity,
    EntitlementConfig,
    TransportConfig,
)
from amps_py.config.problems import _BadValue, _Problems
from amps_py.config.tls import _transport_tls
from amps_py.config.values import (
    _bytes_value,
    _duration_value,
    _listener_text,
    _parse_inet_addr,
    _ports_clash,
    _positive_duration,
    _text,
    _unit_error,
)
from amps_py.config.xmltree import _children, _first, _line
from amps_py.units import UnitError, parse_bytes, parse_count, parse_percent


@dataclass
class _TransportsSeen:
    """What the Transports before the current one claimed (to report clashes)."""

    names: dict[str, etree._Element] = field(default_factory=dict)
    addresses: list[tuple[tuple[str, int], str, etree._Element]] = field(default_factory=list)
    replication_el: etree._Element | None = None  # the first amps-replication transport


def _build_transports(root: etree._Element, problems: _Problems) -> tuple[TransportConfig, ...]:
    seen = _TransportsSeen()
    transports: list[TransportConfig] = []
    for transport in _children(_first(root, "Transports"), "Transport"):
        built = _build_transport(transport, seen, problems)
        if built is not None:
            transports.append(built)
    return tuple(transports)


def _build_transport(
    transport: etree._Element, seen: _TransportsSeen, problems: _Problems
) -> TransportConfig | None:
    """One ``Transport`` (``seen``: updated); None (and problems) when wrong."""
    name = _transport_name(transport, seen, problems)
    type_el = _first(transport, "Type")
    kind = _transport_type(transport, type_el, seen, problems)
    address = _transport_address(transport, name, seen, problems)
    protocol, message_type, message_type_ok = _protocol_and_type(transport, kind, problems)
    size_el = _first(transport, "MaxMessageSize")
    size = _bytes_value(size_el, problems) if size_el is not None else DEFAULT_MAX_MESSAGE_SIZE
    state_el = _first(transport, "InitialState")
    state = _text(state_el, problems) if state_el is not None else "enabled"
    tls = _transport_tls(transport, type_el, kind, problems)
    incoming = _incoming_replication(transport, kind, problems)
    limits = _client_limits(transport, kind, problems)
    max_connections = _max_connections(transport, problems)
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
        or limits is None
        or max_connections == 0
    ):
        return None
    return TransportConfig(
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
        entitlement=incoming[1],
        sequence_gap_threshold=incoming[2],
        **limits,
        always_persisted_acks=always_acks,
        max_connections=max_connections,
    )


def _protocol_and_type(
    transport: etree._Element, kind: str | None, problems: _Problems
) -> tuple[str | None, str | None, bool]:
    """``Protocol`` (``json`` is another name for ``amps``), ``MessageType``, and
    whether the MessageType given (if any) was readable; a replication transport has
    its own framing and carries every message type."""
    protocol_el = _first(transport, "Protocol")
    protocol = _text(protocol_el, problems) if protocol_el is not None else "amps"
    if protocol == "json":  # AMPS accepts json as another name for the amps protocol
        protocol = "amps"
    message_type_el = _first(transport, "MessageType")
    message_type = _text(message_type_el, problems)
    message_type_ok = message_type_el is None or message_type is not None
    if kind in REPLICATION_TRANSPORT_TYPES and protocol is not None:
        protocol, message_type = REPLICATION_TRANSPORT_TYPE, None
    return protocol, message_type, message_type_ok


def _max_connections(transport: etree._Element, problems: _Problems) -> int | None:
    """``MaxConnections``: a count of at least 1; None when absent (the default), 0
    (and a problem) when wrong."""
    el = _first(transport, "MaxConnections")
    if el is None:
        return None
    text = _text(el, problems)
    if text is None:
        return 0
    try:
        count = parse_count(text)
    except UnitError as exc:
        problems.add(
            el,
            f"{exc.text!r} is not a valid count for MaxConnections",
            f"{exc.accepted}; e.g. 10k (the default for client transports, 100 for "
            "the replication transport)",
        )
        return 0
    if count < 1:
        problems.add(
            el,
            f"MaxConnections {text} would refuse every connection",
            "give at least 1 (10k is the default for client transports, 100 for the "
            "replication transport), or disable the transport with InitialState",
        )
        return 0
    return count


def _transport_name(
    transport: etree._Element, seen: _TransportsSeen, problems: _Problems
) -> str | None:
    """The Transport's Name, unique in the instance."""
    name_el = _first(transport, "Name")
    name = _text(name_el, problems)
    if name_el is not None and name:
        if name in seen.names:
            problems.add(
                name_el,
                f"transport name {name!r} is already used by the transport on line "
                f"{_line(seen.names[name])}",
                "give each Transport a unique Name",
            )
            name = None
        else:
            seen.names[name] = name_el
    return name


def _transport_type(
    transport: etree._Element,
    type_el: etree._Element | None,
    seen: _TransportsSeen,
    problems: _Problems,
) -> str | None:
    """The Transport's Type; at most one transport is an amps-replication listener."""
    kind = _text(type_el, problems)
    if type_el is not None and kind in REPLICATION_TRANSPORT_TYPES:
        if seen.replication_el is None:
            seen.replication_el = transport
        else:
            first_name = _text(_first(seen.replication_el, "Name"), problems) or "?"
            problems.add(
                type_el,
                "an instance has at most one amps-replication transport, and transport "
                f"{first_name!r} on line {_line(seen.replication_el)} already is one "
                "(amps-replication and amps-replication-secure count together)",
                "remove this transport (one amps-replication listener accepts every "
                "upstream instance), or change its Type to tcp or tcps",
            )
            kind = None
    return kind


def _transport_address(
    transport: etree._Element, name: str | None, seen: _TransportsSeen, problems: _Problems
) -> tuple[str, int] | None:
    """The Transport's InetAddr as (host, port), on a port no earlier transport binds."""
    inet_el = _first(transport, "InetAddr")
    inet_text = _text(inet_el, problems)
    address: tuple[str, int] | None = None
    if inet_el is not None and inet_text:
        try:
            address = _parse_inet_addr(inet_text)
        except _BadValue as bad:
            problems.add(inet_el, bad.message, bad.fix)
    if inet_el is not None and address is not None:
        for other, other_name, other_el in seen.addresses:
            if _ports_clash(address, other):
                problems.add(
                    inet_el,
                    f"InetAddr {inet_text} clashes with transport {other_name!r} on "
                    f"line {_line(other_el)}, which listens on the same port "
                    f"({_listener_text(other)}): the second transport could not start",
                    "give each Transport its own port (or port 0 for a free one)",
                )
                return None
        seen.addresses.append((address, name or "?", inet_el))
    return address


class _ClientLimits(TypedDict):
    """The client limits of a Transport, as TransportConfig's fields (``None``: the
    instance's)."""

    logon_timeout: float
    incomplete_message_timeout: float
    client_max_capacity: ClientCapacity | None
    message_memory_limit: int | None
    message_disk_limit: int | None
    message_disk_path: str | None
    client_message_age_limit: float | None


def _client_limits(
    transport: etree._Element, kind: str | None, problems: _Problems
) -> _ClientLimits | None:
    """LogonTimeout, IncompleteMessageTimeout, ClientMaxCapacity and the slow-client
    pools (:func:`_transport_pools`) of a Transport of type ``kind``; None (and
    problems) when one is wrong."""
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
    pools = _transport_pools(transport, kind, problems)
    if (
        logon_timeout is None
        or frame_timeout is None
        or (capacity_el is not None and capacity is None)
        or pools is None
    ):
        return None
    return _ClientLimits(
        logon_timeout=logon_timeout,
        incomplete_message_timeout=frame_timeout,
        client_max_capacity=capacity,
        message_memory_limit=pools[0],
        message_disk_limit=pools[1],
        message_disk_path=pools[2],
        client_message_age_limit=pools[3],
    )


def _incoming_replication(
    transport: etree._Element, kind: str | None, problems: _Problems
) -> tuple[AuthenticationConfig | None, EntitlementConfig | None, int] | None:
    """(``Authentication``, ``Entitlement``, ``SequenceGapThreshold``) of a Transport:
    its own access modules (any transport; ``None``: the instance's) and a setting of
    the replication listener only; None (and problems) when wrong."""
    access = _transport_access(transport, problems)
    gap_el = _first(transport, "SequenceGapThreshold")
    if kind is not None and kind not in REPLICATION_TRANSPORT_TYPES:
        if gap_el is not None:
            problems.add(
                gap_el,
                "<SequenceGapThreshold> is read on the amps-replication transport only, and "
                f"this transport's Type is {kind}",
                "remove it; it applies to records received by replication",
            )
            return None
        return None if access is None else (*access, DEFAULT_SEQUENCE_GAP_THRESHOLD)
    ok = access is not None
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
    return (*access, threshold) if ok and access is not None else None


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


def _build_disk_limits(
    root: etree._Element, problems: _Problems
) -> tuple[int | None, str | None, float]:
    """MessageDiskLimit (bytes; 0 turns offlining off) and MessageDiskPath (an existing
    directory) of the instance (``None`` where not given or wrong, with a problem), and
    ClientMessageAgeLimit (seconds; 0 when not given or wrong)."""
    limit_el = _first(root, "MessageDiskLimit")
    limit = _disk_limit_value(limit_el, problems) if limit_el is not None else None
    path_el = _first(root, "MessageDiskPath")
    path = _disk_path_value(path_el, problems) if path_el is not None else None
    age_el = _first(root, "ClientMessageAgeLimit")
    age = _age_limit_value(age_el, problems) if age_el is not None else None
    return limit, path, age or 0.0


#: the slow-client settings a client Transport may give itself (its own pool or policy)
_TRANSPORT_POOL_ELEMENTS: Final = (
    "MessageMemoryLimit",
    "MessageDiskLimit",
    "MessageDiskPath",
    "ClientMessageAgeLimit",
)


def _disk_limit_value(el: etree._Element, problems: _Problems) -> int | None:
    """MessageDiskLimit in bytes (0 turns offlining off); None (and a problem) when
    wrong."""
    text = _text(el, problems)
    if text is None:
        return None
    try:
        limit = parse_bytes(text)
    except UnitError as exc:
        _unit_error(el, exc, problems)
        return None
    if limit < 0:
        problems.add(
            el,
            f"MessageDiskLimit must not be negative, got {text!r}",
            "give a size, e.g. 10GB, or 0 to disconnect slow clients instead "
            "of offlining them to disk",
        )
        return None
    return limit


def _disk_path_value(
    el: etree._Element, problems: _Problems, *, in_transport: bool = False
) -> str | None:
    """MessageDiskPath: an existing directory; None (and a problem) otherwise
    (``in_transport``: the fix says leaving it out means the instance's)."""
    path = _text(el, problems)
    if path is not None and not os.path.isdir(path):
        what = "is not a directory" if os.path.exists(path) else "does not exist"
        default = (
            "the instance's MessageDiskPath" if in_transport else "the system's temporary directory"
        )
        problems.add(
            el,
            f"MessageDiskPath {path!r} {what}; offlined clients' spill files are written there",
            "create that directory (writable by the server), or name an existing one; "
            f"leave MessageDiskPath out to use {default}",
        )
        return None
    return path


def _age_limit_value(
    el: etree._Element, problems: _Problems, *, in_transport: bool = False
) -> float | None:
    """ClientMessageAgeLimit in seconds, above 0; None (and a problem) otherwise
    (``in_transport``: the fix says leaving it out means the instance's)."""
    value = _duration_value(el, problems)
    if value is not None and value <= 0:
        default = "the instance's age limit" if in_transport else "no age limit"
        problems.add(
            el,
            f"ClientMessageAgeLimit {_text(el, problems)} must be more than 0",
            "give the longest a message may wait to be sent to a client, e.g. 30s, or "
            f"leave ClientMessageAgeLimit out for {default}",
        )
        return None
    return value


#: (MessageMemoryLimit, MessageDiskLimit, MessageDiskPath, ClientMessageAgeLimit) of a
#: Transport; ``None`` where it does not set one (the instance's applies)
_PoolSettings = tuple[int | None, int | None, str | None, float | None]


def _transport_pools(
    transport: etree._Element, kind: str | None, problems: _Problems
) -> _PoolSettings | None:
    """The MessageMemoryLimit, MessageDiskLimit, MessageDiskPath and
    ClientMessageAgeLimit a client Transport gives itself, read as at instance level;
    None (and problems) when one is wrong or the transport is the replication listener
    (replication connections are not slow clients)."""
    given = [el for name in _TRANSPORT_POOL_ELEMENTS if (el := _first(transport, name)) is not None]
    if not given:
        return None, None, None, None
    if kind in REPLICATION_TRANSPORT_TYPES:
        for el in given:
            problems.add(
                el,
                f"<{el.tag}> applies to client connections only, and this transport's "
                f"Type is {kind}: replication connections are never offlined or "
                "disconnected as slow clients",
                f"remove <{el.tag}> from this transport; set it on a tcp or tcps "
                "Transport, or in AMPSConfig for every client transport",
            )
        return None
    memory_el = _first(transport, "MessageMemoryLimit")
    limit_el = _first(transport, "MessageDiskLimit")
    path_el = _first(transport, "MessageDiskPath")
    age_el = _first(transport, "ClientMessageAgeLimit")
    pools = (
        _bytes_value(memory_el, problems) if memory_el is not None else None,
        _disk_limit_value(limit_el, problems) if limit_el is not None else None,
        _disk_path_value(path_el, problems, in_transport=True) if path_el is not None else None,
        _age_limit_value(age_el, problems, in_transport=True) if age_el is not None else None,
    )
    if any(problems.faulty(el) for el in given):
        return None
    return pools


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
