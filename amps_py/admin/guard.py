"""Which admin API requests are let through: pure checks, no I/O.

The admin API is reachable by any program on the machine (and by web pages the
operator opens in a browser, which can send requests to ``127.0.0.1``). Four rules
keep a web page from steering the instance:

- **State changes only by POST** (:func:`method_refusal`): every path under
  ``/amps/administrator`` changes something, except the listings
  (:data:`READ_ONLY_ADMINISTRATOR_PATHS`); any other method gets 405 with
  ``Allow: POST``. A link, an ``<img>`` or a redirect cannot POST.
- **No cross-site POST** (:func:`origin_refusal`): a state-changing request that carries
  an ``Origin`` header must come from the admin API's own origin (scheme, host and
  port of the request), else 403.
- **A custom header** (:func:`admin_header_refusal`): a state-changing request must
  carry :data:`ADMIN_HEADER` (any non-empty value; ``1`` by convention), else 403. An
  HTML form cannot send it, and a script on another origin can only after a CORS
  preflight, which this API never approves (it sends no ``Access-Control-Allow-*``
  header).
- **A known Host** (:func:`host_refusal`), for every request: an IP address,
  ``localhost`` (or a name under ``.localhost``), one of the machine's host names, or
  the host of ``Admin/InetAddr``; else 421. This defeats DNS rebinding, where a page's
  own domain is made to resolve to 127.0.0.1.

:func:`check_request` applies them in that order (Host first) and returns the first
:class:`Refusal`, or None when the request may proceed to authentication.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Final
from urllib.parse import urlsplit

#: the header every state-changing admin request must carry (``X-AMPS-Admin: 1``);
#: ``amps-py admin`` sends it
ADMIN_HEADER: Final = "X-AMPS-Admin"

#: paths under ``/amps/administrator`` that only list (GET is fine); every other path
#: there changes the instance and needs POST
READ_ONLY_ADMINISTRATOR_PATHS: Final = frozenset(
    {"/amps/administrator", "/amps/administrator/actions"}
)

_DEFAULT_PORTS: Final = {"http": 80, "https": 443}


@dataclass(frozen=True)
class Refusal:
    """Why a request is refused: the HTTP ``status``, the ``message`` for the body
    (what happened and how to fix it), extra response ``headers``, and a short
    ``reason`` for the log line."""

    status: int
    message: str
    reason: str
    headers: tuple[tuple[str, str], ...] = ()


def path_parts(path: str) -> list[str]:
    """The segments of a decoded request path as the router walks them: without a
    ``.json``/``.xml`` extension and without empty segments (``//`` or a trailing
    ``/``)."""
    path = path.rstrip("/")
    for ext in (".json", ".xml"):
        if path.endswith(ext):
            path = path[: -len(ext)]
            break
    return [p for p in path.split("/") if p]


def is_administrator_path(path: str) -> bool:
    """Whether ``path`` is ``/amps/administrator`` or below it."""
    return path_parts(path)[:2] == ["amps", "administrator"]


def is_state_changing(path: str) -> bool:
    """Whether ``path`` (decoded, as the router sees it) is an administrator action:
    anything under ``/amps/administrator`` but the listings
    (:data:`READ_ONLY_ADMINISTRATOR_PATHS`). An unknown path there counts as one, so
    that nothing new slips through as a GET."""
    parts = path_parts(path)
    if parts[:2] != ["amps", "administrator"]:
        return False
    return "/" + "/".join(parts) not in READ_ONLY_ADMINISTRATOR_PATHS


def allowed_methods(path: str) -> str:
    """The ``Allow`` header value for ``path``."""
    return "POST, OPTIONS" if is_state_changing(path) else "GET, HEAD, POST, OPTIONS"


def split_host(host_header: str) -> tuple[str, int | None] | None:
    """(host, port) of a Host header value (``example.com``, ``h:8085``,
    ``[::1]:8085``), the host lower-cased without a trailing dot; None when it is not
    a valid Host value."""
    value = host_header.strip()
    if not value:
        return None
    try:
        parts = urlsplit(f"//{value}")
        port = parts.port
    except ValueError:
        return None
    host = parts.hostname
    if not host or parts.username is not None or parts.path or parts.query or parts.fragment:
        return None
    return host.rstrip(".").lower(), port


def _is_ip_literal(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


def allowed_host_names(admin_host: str, machine_names: Iterable[str]) -> frozenset[str]:
    """The host names (besides IP addresses and ``localhost``) the admin API answers
    to: the machine's names and the host of ``Admin/InetAddr``, lower-cased."""
    names = {n.rstrip(".").lower() for n in machine_names if n}
    if admin_host:
        names.add(admin_host.strip("[]").rstrip(".").lower())
    return frozenset(names)


def host_refusal(host_header: str | None, allowed_names: frozenset[str]) -> Refusal | None:
    """421 unless the Host header names this machine: an IP address, ``localhost``
    (or ``*.localhost``), or one of ``allowed_names``. A request without a Host header
    (HTTP/1.0) passes: browsers always send one."""
    if host_header is None:
        return None
    parsed = split_host(host_header)
    if parsed is not None:
        host = parsed[0]
        if (
            _is_ip_literal(host)
            or host == "localhost"
            or host.endswith(".localhost")
            or host in allowed_names
        ):
            return None
    shown = ", ".join(sorted(allowed_names)) or "none"
    return Refusal(
        421,
        f"Host {host_header!r} is not a name of this machine, so the request is refused "
        "(a web page whose domain was made to resolve to this address must not reach the "
        "admin API); connect by IP address, by localhost, by the machine's host name or "
        f"by the host of Admin/InetAddr (names accepted: {shown})",
        "unknown Host",
    )


def method_refusal(method: str, path: str) -> Refusal | None:
    """405 for anything but POST (or OPTIONS) on a state-changing path."""
    if not is_state_changing(path) or method in ("POST", "OPTIONS"):
        return None
    return Refusal(
        405,
        f"{path} changes the instance, so it needs POST, not {method}; use "
        f"`curl -X POST -H '{ADMIN_HEADER}: 1' URL` or `amps-py admin`",
        "not POST",
        (("allow", "POST"),),
    )


def same_origin(origin: str, scheme: str, host_header: str | None) -> bool:
    """Whether the ``Origin`` header names the origin the request was sent to: the same
    scheme, host and port (the scheme's default port when none is written)."""
    if host_header is None:
        return False
    try:
        parts = urlsplit(origin.strip())
        origin_port = parts.port
    except ValueError:
        return False
    if parts.scheme.lower() != scheme.lower() or not parts.hostname:
        return False
    target = split_host(host_header)
    if target is None:
        return False
    default = _DEFAULT_PORTS.get(scheme.lower())
    same_host = parts.hostname.rstrip(".").lower() == target[0]
    return same_host and (origin_port or default) == (target[1] or default)


def origin_refusal(origin: str | None, scheme: str, host_header: str | None) -> Refusal | None:
    """403 when a state-changing request carries an ``Origin`` other than its own."""
    if origin is None or same_origin(origin, scheme, host_header):
        return None
    return Refusal(
        403,
        f"cross-site requests are refused: this request comes from origin {origin!r}, not "
        f"from the admin API's own ({scheme}://{host_header or '?'}); send administrator "
        "actions with amps-py admin or curl, not from a web page",
        "cross-origin",
    )


def admin_header_refusal(value: str | None) -> Refusal | None:
    """403 when a state-changing request lacks :data:`ADMIN_HEADER`."""
    if value is not None and value.strip():
        return None
    return Refusal(
        403,
        f"administrator actions need the request header '{ADMIN_HEADER}: 1' (which a web "
        f"page on another site cannot send); e.g. `curl -X POST -H '{ADMIN_HEADER}: 1' "
        "URL`. amps-py admin sends it",
        f"no {ADMIN_HEADER} header",
    )


def check_request(
    method: str,
    path: str,
    scheme: str,
    headers: Mapping[str, str],
    allowed_names: frozenset[str],
) -> Refusal | None:
    """The first rule the request breaks (Host, method, Origin, custom header), or None.

    Args:
        method: the HTTP method, upper case.
        path: the decoded request path.
        scheme: ``http`` or ``https``, as the request arrived.
        headers: the request headers by lower-case name (the last of a repeated one).
        allowed_names: from :func:`allowed_host_names`.
    """
    host = headers.get("host")
    refusal = host_refusal(host, allowed_names) or method_refusal(method, path)
    if refusal is not None or method != "POST" or not is_state_changing(path):
        return refusal
    return origin_refusal(headers.get("origin"), scheme, host) or admin_header_refusal(
        headers.get(ADMIN_HEADER.lower())
    )
