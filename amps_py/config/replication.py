"""``Replication``: the outgoing destinations, their topics, filters and addresses,
checked against this instance's own listeners and transaction log."""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final

from lxml import etree

from amps_py.config.access import _link_authenticator
from amps_py.config.model import (
    _REGEX_METACHARACTERS,
    DEFAULT_ACK_CONFLATION_INTERVAL,
    DEFAULT_HEARTBEAT_INTERVAL,
    DEFAULT_RECONNECT_TIMEOUTS,
    MAX_NAME_LENGTH,
    NON_EXCLUDABLE_VALIDATION_CHECKS,
    REPLICATION_TRANSPORT_TYPES,
    REPLICATION_VALIDATION_CHECKS,
    DestinationConfig,
    ReplicationTopic,
    TransactionLogConfig,
    TransportConfig,
)
from amps_py.config.problems import _BadValue, _Problems
from amps_py.config.tls import _destination_tls
from amps_py.config.values import (
    _check_name,
    _compile_regex,
    _inet_text,
    _optional_choice,
    _parse_inet_addr,
    _positive_duration,
    _text,
)
from amps_py.config.xmltree import (
    _children,
    _closest,
    _first,
    _line,
    _one_of,
    _snippet,
    _split_list,
)
from amps_py.filters import FilterError, compile_filter
from amps_py.units import UnitError, parse_duration

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
    """One ``Destination``, checked against this instance (``own``) and the destinations
    before it (``names``, ``targets``: updated); None (and problems) when wrong."""
    name_el = _first(dest, "Name")
    name = _destination_name(dest, name_el, names, problems)
    group, ok = _destination_group(dest, name_el, name, own, problems)
    sync_type = _text(_first(dest, "SyncType"), problems)
    topics, topics_ok = _destination_topics(dest, problems)
    passthrough, passthrough_ok = _destination_passthrough(dest, problems)
    transport_el = _first(dest, "Transport")
    reconnect = _reconnect_timeouts(_first(transport_el, "ReconnectTimeout"), problems)
    inet_addrs, addrs_ok = _destination_addresses(transport_el, name, own, targets, problems)
    ok = ok and topics_ok and passthrough_ok and reconnect is not None and addrs_ok
    ok &= _check_reachable(dest, transport_el, name, own, problems)
    tls = _destination_tls(transport_el, problems)
    authenticator_el = _first(transport_el, "Authenticator")
    authenticator = (
        _link_authenticator(authenticator_el, problems) if authenticator_el is not None else None
    )
    ok &= authenticator_el is None or authenticator is not None

    stream = _stream_settings(dest, problems)
    if (
        not ok
        or name is None
        or sync_type is None
        or reconnect is None
        or stream is None
        or tls is None
    ):
        return None
    ack, heartbeat, compression = stream
    return DestinationConfig(
        name=name,
        group=group,
        sync_type=sync_type,
        topics=topics,
        passthrough=passthrough,
        inet_addrs=inet_addrs,
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


def _stream_settings(dest: etree._Element, problems: _Problems) -> tuple[float, float, str] | None:
    """(AckConflationInterval, HeartbeatInterval, Compression) of a Destination, the
    defaults where not given; None (and problems) when one is wrong."""
    ack = _positive_duration(
        dest, "AckConflationInterval", DEFAULT_ACK_CONFLATION_INTERVAL, problems, zero_ok=True
    )
    heartbeat = _positive_duration(
        dest, "HeartbeatInterval", DEFAULT_HEARTBEAT_INTERVAL, problems, zero_ok=False
    )
    compression = _optional_choice(dest, "Compression", "none", problems)
    if ack is None or heartbeat is None or compression is None:
        return None
    return ack, heartbeat, compression


def _destination_name(
    dest: etree._Element,
    name_el: etree._Element | None,
    names: dict[str, etree._Element],
    problems: _Problems,
) -> str | None:
    """The Destination Name, unique among the destinations (``names``: updated)."""
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
    return name


def _destination_group(
    dest: etree._Element,
    name_el: etree._Element | None,
    name: str | None,
    own: _Self,
    problems: _Problems,
) -> tuple[str | None, bool]:
    """(Group or None, ok): the Group, and whether Name and Group are not this instance's."""
    ok = True
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
    return group, ok


def _destination_topics(
    dest: etree._Element, problems: _Problems
) -> tuple[tuple[ReplicationTopic, ...], bool]:
    """(the Topic entries that are right, whether all are)."""
    ok = True
    topics: list[ReplicationTopic] = []
    for topic_el in _children(dest, "Topic"):
        topic = _build_replication_topic(topic_el, problems)
        if topic is None:
            ok = False
        else:
            topics.append(topic)
    return tuple(topics), ok


def _destination_passthrough(
    dest: etree._Element, problems: _Problems
) -> tuple[tuple[str, ...], bool]:
    """(the PassThrough expressions that compile, whether all do)."""
    ok = True
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
    return tuple(passthrough), ok


def _destination_addresses(
    transport_el: etree._Element | None,
    name: str | None,
    own: _Self,
    targets: dict[tuple[str, int], tuple[str, etree._Element]],
    problems: _Problems,
) -> tuple[tuple[tuple[str, int], ...], bool]:
    """(the Transport's InetAddrs that are right, whether all are): none may be this
    instance's own listener, repeat in this Destination or be another destination's
    (``targets``: updated)."""
    ok = True
    inet_addrs: list[tuple[str, int]] = []
    for inet_el in _children(transport_el, "InetAddr"):
        address = _destination_addr(inet_el, problems)
        if address is None:
            ok = False
            continue
        if _address_clash(inet_el, address, name, own, inet_addrs, targets, problems):
            ok = False
            continue
        inet_addrs.append(address)
        targets[address] = (name or "?", inet_el)
    return tuple(inet_addrs), ok


def _address_clash(
    inet_el: etree._Element,
    address: tuple[str, int],
    name: str | None,
    own: _Self,
    earlier: list[tuple[str, int]],
    targets: dict[tuple[str, int], tuple[str, etree._Element]],
    problems: _Problems,
) -> bool:
    """Whether ``address`` cannot be connected to (and a problem saying why)."""
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
    elif address in earlier:
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
        return False
    return True


def _check_reachable(
    dest: etree._Element,
    transport_el: etree._Element | None,
    name: str | None,
    own: _Self,
    problems: _Problems,
) -> bool:
    """A Destination without Transport waits for the remote instance to connect: false
    (and a problem) when this instance has no replication listener to accept it."""
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
        return False
    return True


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
