"""The admin API on ``Admin/InetAddr``, served by hypercorn on trio: HTTP, or HTTPS
when ``Admin`` has a Certificate and PrivateKey (the same settings and checks as a tcps
Transport; plain HTTP to that port fails its TLS handshake and only that connection is
closed).

Reads (GET; ``.json`` or ``.xml`` picks the format, JSON without an extension):

- ``/amps`` — everything below.
- ``/amps/instance[/...]`` — name, version, uptime, ``clients`` (one entry per
  connection, see :func:`client_sessions`), ``client_count``, subscriptions,
  ``statistics``, ``transaction_log``, ``replication`` (``destinations`` and
  ``upstreams`` keyed by name), ``transports``, ``limits`` (bytes queued for all
  clients and in partly received messages, their limits, and the connections they
  closed; under ``limits/transports`` the pools of each transport that sets its own),
  ``sow`` (records and bytes per SOW topic) and ``queues`` (per queue: depth, leases,
  backlog, counters, seconds behind; see :func:`queues_tree`).
  Any subtree can be asked for by path,
  e.g. ``/amps/instance/replication/destinations/B.json``.
- ``/amps/host[/...]`` — host name, CPUs, load, memory, and ``disks``: space on the
  file systems of the journal and the archive directory.
- ``/amps/administrator/actions`` — the ``amps-action-on-admin`` actions.
- ``/metrics`` — Prometheus text format.

Administrator actions (POST only, with the ``X-AMPS-Admin: 1`` header; see below):

- ``/amps/administrator/replication/<destination>/downgrade`` and ``.../upgrade`` —
  change a destination's acknowledgment mode.
- ``/amps/administrator/clients/<client>/disconnect`` — close that client's connection;
  ``<client>`` is a key of ``/amps/instance/clients`` (the client name, or
  ``connection-<id>``, which always works).
- ``/amps/administrator/transports/<transport>/disable`` and ``.../enable``.
- ``/amps/administrator/queues/<queue>/enable_proxied_transfer`` and
  ``.../disable_proxied_transfer``.
- ``/amps/administrator/transaction_log/journals/<id>/compress``, ``.../archive``,
  ``.../remove`` — that journal segment and every older one (see
  :mod:`amps_py.server.maintenance`; remove waits until nothing needs them).
- ``/amps/administrator/actions/<Path>?name=value`` runs the on-admin actions with that
  Path, the query parameters as their variables, and answers with each run's outcome.

Before anything else each request passes :mod:`amps_py.admin.guard`: its Host must be
an IP address, ``localhost``, a host name of this machine or the host of
``Admin/InetAddr`` (421 otherwise: DNS rebinding); an administrator action by any
method but POST gets 405 with ``Allow: POST`` and changes nothing; a POST action with
an ``Origin`` of another site, or without the ``X-AMPS-Admin`` header, gets 403. An
OPTIONS request (a browser's CORS preflight) gets 204 with ``Allow`` and no
``Access-Control-Allow-*`` header, so a cross-origin script is never let through.

An unknown path gets 404 with a message naming the known children. When the instance
has a non-default Authentication module, requests need HTTP Basic credentials that it
accepts (401 otherwise) and the Entitlement module's ``admin`` right (403 otherwise);
administrator actions always need the ``admin`` right. Every 403 and 421 is logged
in one line with the user named (never the password or the Authorization header), the
peer address, the method and the path (``07-0051`` for a missing admin right,
``07-0052`` for a guard refusal); a 401 is logged by the auth gate
(:mod:`amps_py.auth_gate`: ``20-0001``, the user and the peer, a summary line per
address under a flood).
"""

from __future__ import annotations

import base64
import binascii
import logging
import os
import shutil
import socket
import ssl
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote

import orjson
import trio
from lxml import etree

from amps_py import __version__, events
from amps_py.config.security import _loopback_only
from amps_py.units import utc_iso, utc_timestamp

from . import guard
from .metrics import render_metrics

if TYPE_CHECKING:
    from amps_py.config import InstanceConfig

    from .host import AdminHost, ClientView

log = logging.getLogger("amps_py.admin")

Scope = Mapping[str, Any]
Receive = Callable[[], Awaitable[Mapping[str, Any]]]
Send = Callable[[Mapping[str, Any]], Awaitable[None]]


class HttpError(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


def instance_tree(instance: AdminHost) -> dict[str, Any]:
    """The ``/amps/instance`` tree, built from the instance's statistics."""
    stats = instance.statistics()
    repl = stats.replication or {"destinations": [], "upstreams": []}
    for d in repl["destinations"]:
        d["lag_txids"] = max(instance.committed_txid - int(d["acked_txid"]), 0)
        d["lag_bytes"] = instance.bytes_after(int(d["acked_txid"]))
    journal = dict(stats.journal or {})
    if stats.writer:
        journal["writer"] = stats.writer
    if instance.journal is not None:
        journal.update(journals_tree(instance))
    return {
        "name": stats.name,
        "group": instance.group,
        "version": __version__,
        "uptime_s": round(stats.uptime, 3),
        "clients": {key: client_entry(s) for key, s in client_sessions(instance).items()},
        "client_count": stats.clients,
        "disconnects": instance.disconnects.statistics(),
        "subscriptions": stats.subscriptions,
        "statistics": {
            "published": stats.published,
            "delivered": stats.delivered,
            "duplicates": stats.duplicates,
            "protocol_errors": stats.protocol_errors,
            "failed_commands": stats.failed_commands,
            "denied_commands": stats.denied_commands,
            "denied_writes": stats.denied_writes,
            "durable_txid": stats.durable_txid,
            "unparsed_payloads": stats.unparsed_payloads,
        },
        "transaction_log": journal,
        "replication": {
            "destinations": {d["name"]: d for d in repl["destinations"]},
            "upstreams": {u["name"]: u for u in repl["upstreams"]},
        },
        "transports": {name: {"port": port} for name, port in stats.listeners.items()},
        "actions": instance.actions.statistics() if instance.actions is not None else [],
        "limits": stats.limits or {},
        "sow": {
            topic: {
                **figures,
                "topic": topic,
                "valid_keys": figures["records"],
                **sow_kind(instance.config, topic),
            }
            for topic, figures in stats.sow.items()
        },
        "queues": queues_tree(instance),
        "startup": stats.startup,
    }


def sow_kind(config: InstanceConfig, topic: str) -> dict[str, Any]:
    """What kind of SOW topic ``topic`` is, for its entry in ``/amps/instance/sow``:
    ``pattern`` (a Pattern topic: the store of every topic it matches), or
    ``conflated_from`` and ``interval`` (a conflated topic); nothing for a plain one."""
    sow = config.sow_topic(topic)
    if sow is not None and sow.pattern is not None:
        return {"pattern": sow.pattern}
    conflated = next((c for c in config.conflated_topics if c.name == topic), None)
    if conflated is not None:
        return {"conflated_from": conflated.underlying_topic, "interval": conflated.interval}
    return {}


def queues_tree(instance: AdminHost) -> dict[str, dict[str, Any]]:
    """``/amps/instance/queues``: per queue (by name; empty without queues) its
    configuration (``kind``, ``underlying_topic``, ``publish_target``, ``semantics``,
    ``max_backlog``), its state here (``depth``: messages waiting or leased;
    ``leased``; ``owned``: those this instance may deliver; ``subscriptions``;
    ``backlog_capacity``: the subscriptions' backlogs, capped by ``max_backlog``;
    ``seconds_behind``: how long the oldest message has been in the queue, 0 when
    empty) and its counters since start (``delivered``, ``acked``, ``returned``,
    ``cancelled``, ``lease_timeouts``, ``expired``, ``removed_by_peer``: removed by
    another instance's ack or expiry, ``transferred_in`` / ``transferred_out``:
    ownership moves), ``proxied_transfer`` (whether it is enabled here) and
    ``proxied_claims`` (messages claimed by it) when the server reports them. The AMPS
    monitoring names (``queue_depth``, ``backlog``: leased, ``expired_leases``: the
    lease timeouts) are given too, for tools written against AMPS."""
    book = instance.queues
    if book is None:
        return {}
    now = book.clock()
    tree: dict[str, dict[str, Any]] = {}
    for name, figures in book.statistics().items():
        queue = book.get(name)
        entry: dict[str, Any] = {"id": name, "name": name, **figures}
        if queue is not None:
            config = queue.config
            entry["semantics"] = config.semantics
            entry["publish_target"] = config.publish_target
            entry["seconds_behind"] = round(queue.seconds_behind(now), 3)
        entry.setdefault("seconds_behind", 0.0)
        entry.setdefault("proxied_transfer", False)
        # AMPS's names
        entry["queue_depth"] = figures.get("depth", 0)
        entry["backlog"] = figures.get("leased", 0)
        entry["expired_leases"] = figures.get("lease_timeouts", 0)
        tree[name] = entry
    return tree





def journals_tree(instance: AdminHost) -> dict[str, Any]:
    """The journal segments (AMPS's journal files) by id, with the log's time span and
    the maintenance state: ``journals``, ``min_timestamp``, ``max_timestamp``,
    ``maintenance`` (requests counted, removals pending and what holds them).

    A segment's ``bytes`` are its records' stored bytes (before segment-file
    compression); ``file_bytes`` is the size of its segment file on disk (a compressed
    or archived segment), null for a segment still in ``data.mdb`` or whose file is
    missing."""
    journal, maintenance = instance.journal, instance.maintenance
    assert journal is not None
    segments = [seg for seg in journal.segments() if seg.state != "removed"]
    pending = set(maintenance.pending_removal()) if maintenance else set()
    current = segments[-1].id if segments else 0
    journals = {
        str(seg.id): {
            "id": seg.id,
            "file_name": str(journal.segment_path(seg)) if seg.file else f"{journal.path}/data.mdb",
            "state": seg.state,
            "is_current": seg.id == current,
            "is_compressed": seg.file.endswith(".zst"),
            "is_archived": seg.state == "archived",
            "pending_removal": seg.id in pending,
            "first_txid": seg.first_txid,
            "last_txid": seg.last_txid,
            "records": seg.records,
            "bytes": seg.size,
            "file_bytes": _file_size(journal.segment_path(seg)) if seg.file else None,
            "min_timestamp": utc_timestamp(seg.first_ts),
            "max_timestamp": utc_timestamp(seg.last_ts),
        }
        for seg in segments
    }
    tree: dict[str, Any] = {"journals": journals}
    if segments:
        tree["min_timestamp"] = utc_timestamp(segments[0].first_ts)
        tree["max_timestamp"] = utc_timestamp(segments[-1].last_ts)
    if maintenance is not None:
        positions = maintenance.destination_positions()
        removable, holders = maintenance.removable_txid(positions)
        tree["maintenance"] = {
            "requests": dict(maintenance.counts),
            "failures": maintenance.failures,
            "pending_removal": sorted(pending),
            "removable_through_txid": removable,
            "held_by": holders,
            "destination_positions": positions,
        }
    return tree


def _file_size(path: Path) -> int | None:
    """The size of a segment file on disk; None when it is not there (removed by hand,
    or an archive directory that is not mounted)."""
    try:
        return path.stat().st_size
    except OSError:
        return None


def client_sessions(instance: AdminHost) -> dict[str, ClientView]:
    """The connected clients by their key in ``/amps/instance/clients``, oldest first.

    The key is the client name, or ``connection-<id>`` for a connection that has not
    logged on yet, and for every connection of a name several connections share (only
    possible without a transaction log, where names need not be unique).
    """
    sessions = sorted(instance.sessions, key=lambda s: s.conn_id)
    names = Counter(s.client_name for s in sessions if s.logged_on and s.client_name)
    by_connection = {f"connection-{s.conn_id}" for s in sessions}
    keyed: dict[str, ClientView] = {}
    for s in sessions:
        name = s.client_name if s.logged_on else ""
        unique = bool(name) and names[name] == 1 and name not in by_connection
        keyed[name if unique else f"connection-{s.conn_id}"] = s
    return keyed


def client_entry(session: ClientView) -> dict[str, Any]:
    """What the admin API shows of one connection (the user, never a password).

    ``queued_bytes`` are bytes waiting to be written to the client: a client that does
    not keep up shows a growing figure, and is disconnected as a slow client past
    ``queued_limit_bytes`` (its ClientMaxCapacity). When all clients together pass
    MessageMemoryLimit the biggest is offlined (``offline`` true): ``spill_bytes`` of
    its queued bytes wait in a spill file under MessageDiskPath until it catches up
    (``/amps/instance/limits`` has the totals). The AMPS monitoring names
    (``connect_time``, ``authenticated_id``, ``client_name_hash``, ``subscription_count``,
    ``queued_bytes_out``) are given too, for tools written against AMPS.
    """
    connect_time = utc_iso(session.connected_at)
    return {
        "client_name": session.client_name,
        "connection": session.conn_id,
        "logged_on": session.logged_on,
        "user": session.user_id,
        "transport": session.transport,
        "remote_address": session.peer,
        "connected_at": connect_time,
        "connected_s": round(max(time.time() - session.connected_at, 0.0), 3),
        "subscriptions": len(session.subscriptions),
        "messages_in": session.messages_in,
        "messages_out": session.messages_out,
        "queued_bytes": session.out_bytes,
        "queued_limit_bytes": session.queue_limit,
        "offline": session.offline,
        "spill_bytes": session.spilled,
        "awaiting_persisted_ack": session.awaiting_persisted,
        "heartbeat_s": session.heartbeat_interval,
        "closing": session.close_reason or None,
        # AMPS's names
        "connect_time": connect_time,
        "authenticated_id": session.user_id,
        "client_name_hash": str(session.pub_hash) if session.pub_hash else "",
        "subscription_count": len(session.subscriptions),
        "queued_bytes_out": session.out_bytes,
    }


def disks_of(instance: AdminHost) -> dict[str, dict[str, Any]]:
    """Space on the file systems holding the journal and the archive directory, keyed
    by what they hold (``journal``, ``archive``)."""
    tl = instance.config.transaction_log
    places: dict[str, Path] = {}
    if tl is not None:
        places["journal"] = tl.journal_directory
        if tl.archive_directory is not None:
            places["archive"] = tl.archive_directory
    disks: dict[str, dict[str, Any]] = {}
    for what, path in places.items():
        probe = path
        while not probe.exists() and probe != probe.parent:
            probe = probe.parent  # an archive directory is created at its first use
        try:
            usage = shutil.disk_usage(probe)
        except OSError:
            continue
        disks[what] = {
            "path": str(path),
            "total_bytes": usage.total,
            "used_bytes": usage.used,
            "free_bytes": usage.free,
            "usage_percent": round(100 * usage.used / usage.total, 1) if usage.total else 0.0,
        }
    return disks


def host_tree(instance: AdminHost | None = None) -> dict[str, Any]:
    load = os.getloadavg()
    memory: dict[str, int] = {}
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                key, _, rest = line.partition(":")
                if key in ("MemTotal", "MemAvailable"):
                    memory[key.lower() + "_bytes"] = int(rest.split()[0]) * 1024
    except OSError:
        pass
    return {
        "name": socket.gethostname(),
        "cpus": os.cpu_count() or 0,
        "load": {"1m": load[0], "5m": load[1], "15m": load[2]},
        "memory": memory,
        "disks": disks_of(instance) if instance is not None else {},
    }


def to_xml(name: str, value: Any) -> bytes:
    """The XML form of a subtree: dict keys become elements (names not valid as XML
    element names become ``<item name="...">``), lists repeat ``<item>``."""

    def build(parent: etree._Element, key: str, val: Any) -> None:
        tag = key if _valid_tag(key) else "item"
        el = etree.SubElement(parent, tag)
        if tag != key:
            el.set("name", key)
        fill(el, val)

    def fill(el: etree._Element, val: Any) -> None:
        if isinstance(val, Mapping):
            for k, v in val.items():
                build(el, str(k), v)
        elif isinstance(val, list | tuple):
            for v in val:
                build(el, "item", v)
        elif val is None:
            pass
        elif isinstance(val, bool):
            el.text = "true" if val else "false"
        else:
            el.text = str(val)

    root = etree.Element(name if _valid_tag(name) else "item")
    fill(root, value)
    return etree.tostring(root, xml_declaration=True, encoding="UTF-8", pretty_print=True)


def _valid_tag(name: str) -> bool:
    return (
        bool(name)
        and (name[0].isalpha() or name[0] == "_")
        and all(c.isalnum() or c in "_-." for c in name)
    )


class AdminApp:
    """The ASGI application; one per instance.

    Every request first passes :func:`amps_py.admin.guard.check_request` (Host,
    POST-only administrator actions, Origin, the ``X-AMPS-Admin`` header), then the
    credentials check. ``host_names``: the names besides IP addresses and localhost
    that the Host header may give (:func:`amps_py.admin.guard.allowed_host_names`).
    """

    def __init__(self, instance: AdminHost, host_names: frozenset[str] = frozenset()) -> None:
        self.instance = instance
        self.host_names = host_names

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            while True:
                message = await receive()
                if message["type"] == "lifespan.startup":
                    await send({"type": "lifespan.startup.complete"})
                elif message["type"] == "lifespan.shutdown":
                    await send({"type": "lifespan.shutdown.complete"})
                    return
        if scope["type"] != "http":
            return
        extra: tuple[tuple[str, str], ...] = ()
        refusal = guard.check_request(
            scope["method"],
            unquote(scope["path"]),
            scope.get("scheme", "http"),
            _headers(scope),
            self.host_names,
        )
        if refusal is not None:
            status, content_type, extra = refusal.status, "application/json", refusal.headers
            body = orjson.dumps({"error": refusal.message, "status": status})
            if status in (403, 421):
                _log_refusal(scope, status, refusal.reason, events.ADMIN_REQUEST_REFUSED)
        elif scope["method"] == "OPTIONS":
            # no Access-Control-Allow-* header: a browser's CORS preflight fails
            status, content_type, body = 204, "text/plain", b""
            extra = (("allow", guard.allowed_methods(unquote(scope["path"]))),)
        else:
            try:
                status, content_type, body = await self.handle(scope)
            except HttpError as exc:
                status, content_type = exc.status, "application/json"
                body = orjson.dumps({"error": exc.message, "status": exc.status})
                # a 401 is logged by the auth gate (one line each, a summary under a
                # flood), not here
                if status == 403:  # no admin right
                    _log_refusal(scope, 403, exc.message, events.CLIENT_NOT_ENTITLED)
        headers = [(b"content-type", content_type.encode()), (b"cache-control", b"no-store")]
        headers.extend((name.encode(), value.encode()) for name, value in extra)
        if status == 401:
            headers.append((b"www-authenticate", b'Basic realm="amps-py admin"'))
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": body})

    # ---------------------------------------------------------------- routing
    async def handle(self, scope: Scope) -> tuple[int, str, bytes]:
        path = unquote(scope["path"]).rstrip("/") or "/"
        is_admin_action = guard.is_administrator_path(path)
        await self._authorise(scope, is_admin_action)
        if path == "/metrics":
            return 200, "text/plain; version=0.0.4; charset=utf-8", render_metrics(self.instance)
        fmt = "json"
        for ext in (".json", ".xml"):
            if path.endswith(ext):
                fmt, path = ext[1:], path[: -len(ext)]
        parts = [p for p in path.split("/") if p]
        if not parts or parts[0] != "amps":
            raise HttpError(404, f"no such path {scope['path']!r}; start at /amps or /metrics")
        if is_admin_action:  # the guard let only POST through to an action
            result = await self._administrator(
                parts[2:], _basic_credentials(scope)[0], _query(scope)
            )
            return self._render("administrator", result, fmt)
        tree: dict[str, Any] = {
            "instance": instance_tree(self.instance),
            "host": host_tree(self.instance),
        }
        node: Any = tree
        walked = ["amps"]
        for part in parts[1:]:
            if isinstance(node, Mapping) and part in node:
                node = node[part]
                walked.append(part)
                continue
            known = ", ".join(sorted(node)) if isinstance(node, Mapping) else "none"
            raise HttpError(404, f"/{'/'.join(walked)} has no {part!r}; its children are: {known}")
        return self._render(walked[-1], node, fmt)

    def _render(self, name: str, value: Any, fmt: str) -> tuple[int, str, bytes]:
        if fmt == "xml":
            return 200, "application/xml", to_xml(name, value)
        return 200, "application/json", orjson.dumps(value, option=orjson.OPT_INDENT_2)

    async def _authorise(self, scope: Scope, admin_action: bool) -> None:
        instance = self.instance
        authenticator, entitler = instance.authenticator, instance.entitler
        open_access = authenticator.module == "amps-default-authentication-module"
        user, password = _basic_credentials(scope)
        if open_access and not admin_action:
            return
        if not open_access:
            # checked off the event loop, backed off after failures, logged (auth_gate)
            client = scope.get("client")
            peer = f"{client[0]}:{client[1]}" if client else "?"
            where = f"admin API, {scope['method']} {scope['path'][:200]}"
            verdict = await instance.auth_gate.check(
                authenticator, user, password, peer, where, events.ADMIN_AUTH_FAILED
            )
            if not verdict.ok:
                why = (
                    verdict.refusal
                    if verdict.backed_off is not None
                    else "the admin interface needs credentials this instance's Authentication "
                    "module accepts (HTTP Basic: user and password)"
                )
                raise HttpError(401, why)
        if not entitler.is_admin(user):  # logged by _log_refusal
            raise HttpError(
                403,
                f'user {user!r} has no admin right; grant it "admin": true in the '
                "Entitlement rules file",
            )

    async def _administrator(
        self, parts: list[str], user: str, query: Mapping[str, str]
    ) -> dict[str, Any]:
        if parts[:1] == ["actions"]:
            return await self._custom_action("/".join(parts[1:]), user, query)
        if len(parts) == 3 and parts[0] == "replication" and parts[2] in ("downgrade", "upgrade"):
            manager = self.instance.replication
            destinations = {d.name: d for d in manager.destinations} if manager else {}
            dest = destinations.get(parts[1])
            if dest is None:
                known = ", ".join(sorted(destinations)) or "none"
                raise HttpError(
                    404, f"no replication destination {parts[1]!r}; destinations: {known}"
                )
            outcome = dest.downgrade("admin") if parts[2] == "downgrade" else dest.upgrade("admin")
            return {"destination": dest.name, "action": parts[2], "result": outcome}
        if (
            len(parts) == 4
            and parts[:2] == ["transaction_log", "journals"]
            and parts[3] in ("compress", "archive", "remove")
        ):
            return await self._journal_action(parts[2], parts[3], user)
        if len(parts) == 3 and parts[0] == "clients" and parts[2] == "disconnect":
            return self._disconnect_client(parts[1], user)
        if len(parts) == 3 and parts[0] == "transports" and parts[2] in ("enable", "disable"):
            instance = self.instance
            try:
                if parts[2] == "disable":
                    outcome = instance.disable_transport(parts[1])
                else:
                    outcome = await instance.enable_transport(parts[1])
            except KeyError as exc:
                raise HttpError(404, str(exc.args[0])) from None
            except OSError as exc:
                raise HttpError(
                    409, f"transport {parts[1]!r} cannot listen again: {exc}; free its port"
                ) from None
            log.warning(
                "administrator %s: transport %s %s: %s",
                user or "(anonymous)",
                parts[1],
                parts[2],
                outcome,
                extra=events.extra(events.TRANSPORT_STOPPED),
            )
            return {"transport": parts[1], "action": parts[2], "result": outcome}
        if (
            len(parts) == 3
            and parts[0] == "queues"
            and parts[2] in ("enable_proxied_transfer", "disable_proxied_transfer")
        ):
            enable = parts[2] == "enable_proxied_transfer"
            try:
                outcome = self.instance.set_proxied_transfer(parts[1], enable)
            except KeyError as exc:  # names the queues
                raise HttpError(404, str(exc.args[0])) from None
            log.warning(
                "administrator %s: queue %s: %s",
                user or "(anonymous)",
                parts[1],
                outcome,
                extra=events.extra(events.QUEUE_PROXIED_CLAIM),
            )
            return {"queue": parts[1], "action": parts[2], "result": outcome}
        raise HttpError(
            404,
            "administrator actions: /amps/administrator/replication/<destination>/downgrade "
            "and .../upgrade, /amps/administrator/clients/<client>/disconnect, "
            "/amps/administrator/queues/<queue>/enable_proxied_transfer and "
            ".../disable_proxied_transfer, "
            "/amps/administrator/transports/<transport>/enable and .../disable, "
            "/amps/administrator/transaction_log/journals/<id>/compress, .../archive "
            "and .../remove, /amps/administrator/actions/<Path> (amps-action-on-admin)",
        )

    async def _custom_action(
        self, path: str, user: str, query: Mapping[str, str]
    ) -> dict[str, Any]:
        """``/amps/administrator/actions``: the on-admin actions; ``.../<Path>`` runs
        those with that Path (query parameters become their variables) and waits."""
        runner = self.instance.actions
        if not path:
            return {"actions": runner.admin_actions() if runner is not None else []}
        if runner is None:
            raise HttpError(404, "this instance has no Actions; add an amps-action-on-admin")
        try:
            outcomes = await runner.run_admin(path, query)
        except KeyError as exc:
            raise HttpError(404, str(exc.args[0])) from None
        except ValueError as exc:
            raise HttpError(400, str(exc)) from None
        log.warning(
            "administrator%s ran admin action %s: %s",
            f" {user!r}" if user else "",
            path,
            ", ".join(f"{o['name']} {o['outcome']}" for o in outcomes),
            extra=events.extra(events.ACTION_RUN),
        )
        return {"path": path, "runs": outcomes}

    async def _journal_action(self, journal_id: str, action: str, user: str) -> dict[str, Any]:
        """Compress, archive or remove journal ``journal_id`` and every older one."""
        from amps_py.errors import JournalMaintenanceError

        if not journal_id.isdigit():
            raise HttpError(
                404,
                f"journal ids are numbers (see /amps/instance/transaction_log/journals), "
                f"not {journal_id!r}",
            )
        try:
            result = await self.instance.maintain_journal(action, through=int(journal_id))
        except JournalMaintenanceError as exc:
            status = 404 if "there is no journal" in str(exc) else 409
            raise HttpError(status, str(exc)) from None
        log.warning(
            "administrator%s: %s",
            f" {user!r}" if user else "",
            result.summary,
            extra=events.extra(events.JOURNAL_MAINTENANCE),
        )
        return {"journal": int(journal_id), **result.as_dict()}

    def _disconnect_client(self, key: str, user: str) -> dict[str, Any]:
        """Close the connection of the client ``key`` (a key of /amps/instance/clients).

        The session ends as for any server-side close (its subscriptions are dropped,
        the socket closed); the client sees the connection close and may reconnect.
        """
        keyed = client_sessions(self.instance)
        session = keyed.get(key)
        if session is None:
            # a connection id always works, also for a client listed by its name
            session = next((s for s in keyed.values() if f"connection-{s.conn_id}" == key), None)
        if session is None:
            shared = sorted(k for k, s in keyed.items() if s.logged_on and s.client_name == key)
            if shared:
                raise HttpError(
                    409,
                    f"{len(shared)} connections use client name {key!r}; disconnect one at a "
                    f"time by its key: {', '.join(shared)}",
                )
            known = ", ".join(sorted(keyed)) or "none"
            raise HttpError(404, f"no client {key!r} is connected; clients: {known}")
        if session.close_reason:
            result = f"already closing ({session.close_reason})"
        else:
            log.warning(
                "administrator%s disconnects client %r (connection %d, %s)",
                f" {user!r}" if user else "",
                session.client_name,
                session.conn_id,
                session.peer,
                extra=events.extra(events.CLIENT_DISCONNECTED),
            )
            session.close("disconnected by the administrator")
            result = "disconnected"
        return {
            "client": key,
            "action": "disconnect",
            "result": result,
            "connection": session.conn_id,
            "remote_address": session.peer,
        }


def _headers(scope: Scope) -> dict[str, str]:
    """The request headers by lower-case name (the last value of a repeated one)."""
    return {
        bytes(key).decode("latin-1").lower(): bytes(value).decode("latin-1")
        for key, value in scope.get("headers", ())
    }


def _log_refusal(scope: Scope, status: int, reason: str, event: str) -> None:
    """One line for a refused request (401, 403, 421): the user it named (never the
    password or the Authorization header), the peer address, the method and path."""
    user = _basic_credentials(scope)[0]
    client = scope.get("client")
    peer = f"{client[0]}:{client[1]}" if client else "unknown peer"
    log.warning(
        "admin request %s %s from %s%s refused (HTTP %d): %s",
        scope["method"],
        scope["path"],
        peer,
        f" as user {user!r}" if user else " without credentials",
        status,
        reason,
        extra=events.extra(event),
    )


def _query(scope: Scope) -> dict[str, str]:
    """The request's query parameters (the last value of a repeated name)."""
    from urllib.parse import parse_qsl

    raw = scope.get("query_string", b"").decode("latin-1")
    return dict(parse_qsl(raw, keep_blank_values=True))


def _basic_credentials(scope: Scope) -> tuple[str, str]:
    for key, value in scope.get("headers", ()):
        if key.lower() == b"authorization" and value[:6].lower() == b"basic ":
            try:
                user, _, password = base64.b64decode(value[6:]).decode().partition(":")
            except (binascii.Error, UnicodeDecodeError):
                return "", ""
            return user, password
    return "", ""


def machine_host_names() -> frozenset[str]:
    """The names this machine knows itself by (its host name and fully qualified name);
    may ask DNS, so call it off the event loop."""
    names = {socket.gethostname(), socket.getfqdn()}
    return frozenset(n for n in names if n)


def listening_line(host: str, port: int, *, tls: bool, open_access: bool) -> str:
    """The start-up log line of the admin interface: where, HTTP or HTTPS, and when it
    is the unauthenticated loopback default, that it is and how to secure it."""
    scheme = "https" if tls else "http"
    shown = f"[{host}]" if ":" in host else host
    line = f"admin interface listening on {scheme}://{shown}:{port}"
    if not open_access:
        return line
    if _loopback_only(host):
        return (
            f"{line} (loopback only, no authentication: any program on this machine may "
            "read and steer the instance; administrator actions need POST and the "
            f"{guard.ADMIN_HEADER} header. To secure it, configure an Authentication "
            "module and the admin right, and Admin Certificate/PrivateKey for HTTPS; see "
            "config/examples/secure)"
        )
    return (
        f"{line} (reachable beyond this machine WITHOUT authentication: configure an "
        "Authentication module and the admin right, or listen on 127.0.0.1)"
    )


async def serve_admin(
    instance: AdminHost,
    host: str,
    port: int,
    ssl_context: ssl.SSLContext | None = None,
    task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve the admin API until cancelled; ``task_status`` gets the bound port.

    With ``ssl_context`` (from the Admin element's Certificate and PrivateKey) it is
    HTTPS only: a plain HTTP request fails its TLS handshake, and only that connection
    is closed.

    Raises:
        OSError: the port cannot be bound (hypercorn raises it in an exception group).
    """
    from hypercorn.config import Config
    from hypercorn.trio import serve

    class _AdminConfig(Config):
        """hypercorn's settings, with our TLS context (same rules as tcps transports)."""

        def create_ssl_context(self) -> ssl.SSLContext | None:
            if ssl_context is not None:
                ssl_context.set_alpn_protocols(self.alpn_protocols)
            return ssl_context

    config = _AdminConfig()
    config.bind = [f"[{host}]:{port}" if ":" in host else f"{host}:{port}"]
    config.accesslog = None
    config.errorlog = logging.getLogger("amps_py.admin.http")
    config.graceful_timeout = 1.0
    if ssl_context is not None:
        # hypercorn serves the bind over TLS when these are set; it uses the context
        # create_ssl_context returns, not the files
        config.certfile, config.keyfile = "admin-certificate", "admin-key"
        config.ssl_handshake_timeout = 10.0
    names = await trio.to_thread.run_sync(machine_host_names)
    app = AdminApp(instance, guard.allowed_host_names(host, names))
    open_access = instance.authenticator.module == "amps-default-authentication-module"

    class _Started:
        def started(self, binds: list[str] | None = None) -> None:
            bound = int((binds or [config.bind[0]])[0].rpartition(":")[2])
            exposed = open_access and not _loopback_only(host)
            log.log(
                logging.WARNING if exposed else logging.INFO,
                "%s",
                listening_line(host, bound, tls=ssl_context is not None, open_access=open_access),
                extra=events.extra(events.TRANSPORT_LISTENING),
            )
            task_status.started(bound)

    await serve(app, config, task_status=_Started())  # type: ignore[arg-type]
