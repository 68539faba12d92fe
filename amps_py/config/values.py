"""Converting element text into values (durations, sizes, names, addresses), each
reporting a problem with a fix when the text is wrong."""

from __future__ import annotations

import ipaddress
import re

from lxml import etree

from amps_py.config.model import MAX_NAME_LENGTH
from amps_py.config.problems import _BadValue, _Problems
from amps_py.config.xmltree import _first
from amps_py.units import UnitError, parse_bytes, parse_duration

#: how to name a file (TLS files, password and rules files), for the fix of a problem
_PATH_HINT = (
    "a relative path is relative to the working directory of amps-py; "
    "${AMPS_CONFIG_DIRECTORY}/NAME.pem names a file NAME.pem beside the config"
)


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


def _optional_choice(
    parent: etree._Element, name: str, default: str, problems: _Problems
) -> str | None:
    """An enumerated child's value (already checked by the walk), or the default."""
    el = _first(parent, name)
    return default if el is None else _text(el, problems)
