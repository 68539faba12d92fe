"""What the ``amps-py`` client commands (publish, subscribe, sow) need beyond the client
library: credentials from flags, the URI and the environment; error lines that say how
to fix a refusal; when a persisted ack does not come, which replication destinations
the instance is waiting for; and how a sow record is printed (progress on a terminal is
:mod:`amps_py.cli.progress`).

Everything here is plain functions over values (no sockets, no trio), except
:func:`fetch_instance`, which asks an admin API over HTTP.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final

import orjson

from amps_py.client import CommandError, SowRecord, parse_uri
from amps_py.message_types import default_types

#: the admin API port of the embedded default (``Admin/InetAddr`` 127.0.0.1:8085)
DEFAULT_ADMIN_PORT: Final = 8085
#: the client transport of the embedded default (``amps-py serve`` without a config)
DEFAULT_URI: Final = "tcp://127.0.0.1:9007/amps/json"


class CredentialsError(ValueError):
    """The user is given twice, differently."""


@dataclass(frozen=True)
class Credentials:
    """Who the client logs on as.

    Attributes:
        user: the user name (empty: none given; the server then uses the client name).
        password: the password (empty: none given).
        password_from: where the password came from, for messages ("" when none).
        uri_form: the URI's form with a user and password in it, for messages
            (``tcps://NAME:PASSWORD@HOST:PORT/amps/fix`` for a tcps fix URI).
    """

    user: str
    password: str = field(repr=False)  # never in a repr, a log or a message
    password_from: str = ""
    uri_form: str = "tcp://NAME:PASSWORD@HOST:PORT/amps/json"

    def logon_fields(self) -> dict[str, Any]:
        """The logon header fields carrying these credentials (``open_client``'s
        ``logon_fields``)."""
        fields: dict[str, Any] = {}
        if self.user:
            fields["user_id"] = self.user
        if self.password:
            fields["pw"] = self.password
        return fields

    def describe(self, client_name: str) -> str:
        """What was sent, in words (never the password itself)."""
        who = f"user {self.user!r}" if self.user else f"no user (the client name {client_name!r})"
        how = f"the password from {self.password_from}" if self.password else "no password"
        return f"{who} with {how}"


def resolve_credentials(
    uri: str, user: str | None, password_env: str, environ: Mapping[str, str]
) -> Credentials:
    """The credentials for ``uri``: ``user`` (``--user``) or the URI's user; the URI's
    password, else the one in the environment variable ``password_env``.

    Raises:
        BadURI: the URI is malformed.
        CredentialsError: ``user`` and the URI's user differ.
    """
    target = parse_uri(uri)
    if user and target.user and user != target.user:
        raise CredentialsError(
            f"two users given: --user {user} and {target.user!r} in the URI; give one"
        )
    form = f"{target.scheme}://NAME:PASSWORD@HOST:PORT/{target.protocol}/{target.message_type}"
    if target.password:
        return Credentials(user or target.user, target.password, "the URI", form)
    password = environ.get(password_env, "")
    return Credentials(
        user or target.user, password, f"${password_env}" if password else "", form
    )


def explain_refusal(
    exc: CommandError, credentials: Credentials, client_name: str, password_env: str, topic: str
) -> str:
    """One line for a command the server refused, with how to fix it when the reason
    is about credentials or rights; else the error as it is."""
    if exc.reason == "auth failure":
        return (
            f"{exc}: the instance refused {credentials.describe(client_name)}. Pass the "
            f"user with --user NAME and the password in the environment variable "
            f"{password_env} (e.g. `read -rs {password_env} && export {password_env}`), "
            f"or use {credentials.uri_form}"
        )
    if exc.reason == "not entitled" and exc.detail:
        # the instance's detail names the user, the topic and the rules that decide
        return f"{exc}; log on as a user who may, with --user NAME"
    if exc.reason == "not entitled":
        who = credentials.user or client_name
        right = {"p": "publish to", "publish": "publish to", "sow_delete": "acknowledge on"}.get(
            exc.command, "subscribe to"
        )
        return (
            f"{exc}: user {who!r} may not {right} {topic!r} on this instance (its "
            "Entitlement rules decide); log on as a user who may, with --user NAME"
        )
    return str(exc)


def sow_record_line(record: SowRecord, as_json: bool, message_type: str = "json") -> str:
    """How ``amps-py sow`` prints one record: its payload as text, or with ``as_json``
    a JSON object ``{"key", "bookmark", "data"}`` whose ``data`` is the payload as
    JSON: a JSON record as it is, a fix, nvfix, xml, bson or msgpack one
    (``message_type``, from the URI) as its fields, else its text. Never contains a
    line break unless the payload text itself does (without ``as_json``)."""
    if not as_json:
        return record.data.decode(errors="replace")
    data = payload_as_json(record.data, message_type)
    return orjson.dumps({"key": record.key, "bookmark": record.bookmark, "data": data}).decode()


#: the message types the CLI reads payloads of (the defaults: a URI names one of them)
_TYPES: Final = default_types()


def payload_as_json(payload: bytes, message_type: str) -> Any:
    """What the CLI prints as a message's ``data``: a fix, nvfix, xml, bson or msgpack
    payload (``message_type``) as its fields; else the payload parsed as JSON, else
    its text."""
    if message_type != "json":
        reader = _TYPES.get(message_type)
        data = reader.to_jsonable(payload) if reader is not None else None
        if data is not None:
            return data
    try:
        return orjson.loads(payload)
    except orjson.JSONDecodeError:
        return payload.decode(errors="replace")


def sow_summary(topic: str, count: int, stats: Mapping[str, int]) -> str:
    """The line ``amps-py sow`` writes on stderr after the records."""
    line = f"amps-py: {count} record(s) from {topic}"
    if "matches" in stats and "topic_matches" in stats:
        line += f" ({stats['matches']} matched of {stats['topic_matches']} in the topic)"
    return line


# ------------------------------------------------------------------ payload checks
_JSON_KINDS: Final = {
    str: "a JSON string",
    int: "a JSON number",
    float: "a JSON number",
    bool: "a JSON true/false",
    list: "a JSON array",
    type(None): "JSON null",
}


def json_problem(payload: bytes) -> str | None:
    """Why ``payload`` is not a JSON object, the kind of message a json transport's
    content filters read (None: it is one). One phrase, e.g. ``not JSON: single quotes
    — JSON needs double quotes``."""
    if not payload.strip():
        return "empty (a JSON message is an object: '{}' at least)"
    try:
        doc = orjson.loads(payload)
    except orjson.JSONDecodeError as exc:
        if b"'" in payload:
            try:
                orjson.loads(payload.replace(b"'", b'"'))
            except orjson.JSONDecodeError:
                pass
            else:
                return "not JSON: single quotes — JSON needs double quotes"
        first = payload.lstrip()[:1]
        if first and first not in b'{["-0123456789tfn':
            return """not JSON: plain text (a JSON message is an object: '{"text": "..."}')"""
        if exc.lineno == 1:
            return f"not JSON: {exc.msg} (at column {exc.colno})"
        return f"not JSON: {exc.msg} (at line {exc.lineno} column {exc.colno})"
    if isinstance(doc, dict):
        return None
    kind = _JSON_KINDS.get(type(doc), "a JSON value")
    if isinstance(doc, str):
        return (
            f"{kind}, not an object: the whole payload is in double quotes (did the shell "
            """keep them? write '{"id": 1}' in single quotes)"""
        )
    return f"{kind}, not an object: content filters find no fields in it"


def json_refusal(problem: str, where: str, sent: int = 0) -> str:
    """The line ``amps-py publish`` fails with for a payload that is not a JSON object
    (``where``: "DATA" or "FILE line N"; ``sent``: lines published before it, from a
    pipe, which cannot be checked ahead)."""
    done = (
        f"The {sent} line(s) before it were published; nothing after it."
        if sent
        else "Nothing was sent."
    )
    return (
        f"{where} is {problem}. The transport's message type is json: content filters "
        f"would skip it. {done} Fix it, or pass --raw to send it as it is"
    )


# ------------------------------------------------------------------ persisted-ack waits
def admin_url_for(
    uri: str, admin_url: str | None, environ: Mapping[str, str]
) -> tuple[str, bool]:
    """Where to look for the admin API of the instance at ``uri``, and whether the user
    named it: ``admin_url``, else ``$AMPS_PY_ADMIN_URL`` (named), else a guess: port
    8085 (the embedded default's) on the URI's host, which only an instance started
    with the default Admin port has (:func:`explain_persisted_wait` ignores a guess
    that turns out to be another instance's)."""
    if admin_url:
        return admin_url, True
    if environ.get("AMPS_PY_ADMIN_URL"):
        return environ["AMPS_PY_ADMIN_URL"], True
    host = parse_uri(uri).host
    host = f"[{host}]" if ":" in host else host
    return f"http://{host}:{DEFAULT_ADMIN_PORT}", False


def fetch_instance(
    url: str, credentials: Credentials, ca_file: str | None = None
) -> dict[str, Any] | str:
    """``/amps/instance.json`` from the admin API at ``url`` (HTTP Basic with
    ``credentials`` when they name a user; an ``https://`` URL verified against
    ``ca_file``, the one the client's tcps connection trusts), or why it could not be
    read."""
    from amps_py.admin.console import AdminError, fetch

    try:
        document = fetch(
            url,
            "/amps/instance.json",
            user=credentials.user or None,
            password=credentials.password,
            ca_file=ca_file,
        )
    except AdminError as exc:
        if ": HTTP 401" in str(exc):
            return (
                f"{url} answered HTTP 401: it needs the logon of a user with the admin "
                "right; give one with --user (password as for the logon)"
            )
        if ": HTTP 403" in str(exc):
            return f"{url} answered HTTP 403: user {credentials.user!r} has no admin right"
        return str(exc)
    if not isinstance(document, dict):
        return f"{url}/amps/instance.json is not an amps-py instance document"
    return document


def waiting_destinations(instance: Mapping[str, Any]) -> list[str]:
    """The sync replication destinations that hold persisted acks back: with messages
    routed to them not acknowledged (``acks_waiting``), not connected or connected but
    behind; each as ``"NAME (what is wrong)"``. (An instance that does not report
    ``acks_waiting`` holds acks for every record a sync destination has not
    acknowledged.)"""
    last_txid = int((instance.get("transaction_log") or {}).get("last_txid", 0) or 0)
    found = []
    destinations = (instance.get("replication") or {}).get("destinations") or {}
    for name, d in sorted(destinations.items()):
        if d.get("replication_type") != "sync":
            continue
        address = d.get("address") or ""
        where = f" to {address}" if address else ""
        if "acks_waiting" in d:
            waiting = int(d["acks_waiting"] or 0)
            if not waiting:
                continue  # nothing routed to it waits: it holds no persisted ack
            state = "connected" if d.get("is_connected") else "not connected"
            error = "" if d.get("is_connected") else d.get("last_error") or ""
            found.append(
                f"{name} ({state}{where}{f'; {error}' if error else ''}; {waiting} "
                "message(s) routed to it not acknowledged)"
            )
            continue
        if not d.get("is_connected"):
            error = d.get("last_error") or ""
            found.append(f"{name} (not connected{where}{f'; {error}' if error else ''})")
            continue
        behind = last_txid - int(d.get("acked_txid", 0) or 0)
        if behind > 0:
            seconds = float(d.get("seconds_behind", 0) or 0)
            found.append(
                f"{name} (connected{f' to {address}' if address else ''}, {behind} "
                f"record(s) and {seconds:.1f} s not acknowledged)"
            )
    return found


def explain_persisted_wait(
    timeout_text: str,
    url: str,
    instance: Mapping[str, Any] | str,
    client_name: str,
    named: bool = True,
) -> str:
    """The message for a persisted-ack wait that timed out: that the instance has not
    confirmed persistence and, from its admin document (or why there is none), which
    sync destinations it waits for and what to do. ``named``: the user gave ``url``
    (--admin-url or $AMPS_PY_ADMIN_URL); a guessed one that is unreachable or another
    instance's is not mentioned, the message asks for the right one instead."""
    head = f"{timeout_text}: the instance has not confirmed that the messages are stored"
    mine = not isinstance(instance, str) and client_name in (instance.get("clients") or {})
    if not named and not mine:
        return (
            f"{head}. If it replicates with SyncType sync, a destination that is down or "
            "behind holds the acks back: pass --admin-url http://HOST:PORT (the "
            "instance's Admin/InetAddr) to have amps-py name it, or look with `amps-py "
            "admin --url http://HOST:PORT status`"
        )
    if isinstance(instance, str):
        return (
            f"{head}. Its admin API could not say why ({instance}); pass --admin-url "
            "http://HOST:PORT to name the replication destinations it waits for"
        )
    if not mine:
        return (
            f"{head}. The admin API at {url} belongs to another instance "
            f"({instance.get('name')!r}, where this client is not connected); pass "
            "--admin-url with this instance's Admin/InetAddr"
        )
    name = instance.get("name", "the instance")
    waiting = waiting_destinations(instance)
    if not waiting:
        return (
            f"{head}. {name} has no sync replication destination that is down or behind; "
            "its journal may be slow or failing: see `amps-py admin status` and its log"
        )
    first = waiting[0].partition(" ")[0]
    return (
        f"{head}. {name} waits for its sync replication destination(s) {', '.join(waiting)}. "
        f"Start or reach them, or stop waiting with `amps-py admin --url {url} downgrade "
        f"{first}` (persisted acks then no longer wait for it)"
    )
