"""The replication handshake on the wire, sans-IO: hello and welcome payloads built
and parsed (see :mod:`.link` for the whole protocol, which frames them).

:func:`hello_body` and :func:`welcome_body` build the JSON payloads an upstream and a
downstream send; :func:`parse_hello` and :func:`parse_welcome` turn a received payload
(:func:`decode_payload` first) into a :class:`Hello` or :class:`Welcome`. Nothing a peer
sends is trusted to have the right shape: every field is type-checked, and a wrong one
raises :class:`RemoteProtocolError` with reason ``malformed hello`` / ``malformed
welcome`` and a detail naming the field and what was expected.

Compatibility: a field this version does not know is ignored, and a field added since
version 2 first appeared is optional: its absence means an older peer, which gets
what that peer always got. ``holdings`` (the resync exchange, :mod:`.exchange`) is
such a field, in the hello and in the welcome.

No trio, no sockets, no clock. Every name here is also importable from :mod:`.link`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final

import orjson

from amps_py import reasons
from amps_py.redact import MASK, is_secret

from .link_errors import RemoteProtocolError

PROTOCOL_VERSION: Final = 2
#: instance names and groups are at most this long (as in the config)
MAX_NAME_LENGTH: Final = 64
_U64_MAX: Final = (1 << 64) - 1
#: the longest bookmark or free-text field accepted in a handshake or data header
_MAX_LABEL: Final = 256


@dataclass(frozen=True)
class Hello:
    """The upstream introduces itself (received by the downstream)."""

    version: int
    name: str
    group: str
    destination: str
    sync: str
    compression: str
    topics: tuple[dict[str, Any], ...]
    #: the Group the upstream's Destination requires of this instance ("" = any)
    expected_group: str = ""
    #: the user the upstream logs on as ("" = no credentials sent)
    user_id: str = ""
    #: its password; never shown by repr()
    pw: str = field(default="", repr=False)
    #: the upstream accepts this instance's stream back over the same connection
    back: bool = False
    #: per origin instance, the highest origin txid the upstream holds (it offers the
    #: resync exchange, :mod:`.exchange`); None: not offered (an older upstream)
    holdings: dict[str, int] | None = None


@dataclass(frozen=True)
class HeldOrigin:
    """What a downstream reports holding of one origin instance (the resync exchange,
    :mod:`.exchange`): fingerprint digests of its records of that origin up to origin
    txid ``upto`` (``None``: not reported), and below each of the ``cuts`` (bucket
    number, digest)."""

    upto: int | None = None
    digest: int = 0
    cuts: tuple[tuple[int, int], ...] = ()

    def to_wire(self) -> dict[str, Any]:
        body: dict[str, Any] = {"cuts": [list(cut) for cut in self.cuts]}
        if self.upto is not None:
            body["upto"], body["digest"] = self.upto, self.digest
        return body


@dataclass(frozen=True)
class Welcome:
    """The downstream accepts (received by the upstream); the cursor says how far it
    holds this upstream's stream."""

    name: str
    group: str
    cursor_txid: int
    cursor_bm: str
    #: per origin, what the downstream holds of it (see :mod:`.exchange`); None: no
    #: answer to the exchange (an older downstream, a journal that keeps no holdings,
    #: or an upstream that did not offer it)
    holdings: dict[str, HeldOrigin] | None = None


def hello_body(
    *,
    name: str,
    group: str,
    destination: str,
    sync: str,
    compression: str,
    topics: list[dict[str, Any]],
    expected_group: str = "",
    credentials: tuple[str, str] | None = None,
    back: bool = False,
    holdings: Mapping[str, int] | None = None,
) -> dict[str, Any]:
    """The payload of a ``repl_hello`` (what :func:`parse_hello` reads back);
    ``credentials`` (user, password) become ``user_id`` and ``pw``, ``back`` offers to
    receive the peer's stream over the same connection, ``holdings`` offers the resync
    exchange. Nothing is checked here."""
    body: dict[str, Any] = {
        "version": PROTOCOL_VERSION,
        "name": name,
        "group": group,
        "destination": destination,
        "sync": sync,
        "compression": compression,
        "topics": topics,
        "expected_group": expected_group,
    }
    if back:
        body["back"] = True
    if credentials is not None:
        body["user_id"], body["pw"] = credentials
    if holdings is not None:
        body["holdings"] = dict(holdings)
    return body


def welcome_body(
    *,
    name: str,
    group: str,
    cursor: tuple[int, str],
    holdings: Mapping[str, HeldOrigin] | None = None,
) -> dict[str, Any]:
    """The payload of a ``repl_welcome`` (what :func:`parse_welcome` reads back);
    ``cursor`` is (txid, bookmark): how far the downstream holds the upstream's stream;
    ``holdings`` answers the hello's exchange (origin -> what is held of it)."""
    body: dict[str, Any] = {
        "name": name,
        "group": group,
        "cursor_txid": cursor[0],
        "cursor_bm": cursor[1],
    }
    if holdings is not None:
        body["holdings"] = {origin: held.to_wire() for origin, held in holdings.items()}
    return body


def decode_payload(payload: bytes, what: str) -> dict[str, Any]:
    """The JSON object of a hello, welcome or refusal payload (``what`` names the
    frame in the error).

    Raises:
        RemoteProtocolError: reason ``protocol violation``: not JSON, or not an object.
    """
    try:
        body = orjson.loads(payload)
    except orjson.JSONDecodeError:
        raise RemoteProtocolError(
            reasons.PROTOCOL_VIOLATION, f"{what} payload is not JSON"
        ) from None
    if not isinstance(body, dict):
        raise RemoteProtocolError(
            reasons.PROTOCOL_VIOLATION, f"{what} payload is not a JSON object"
        )
    return body


def _shown(value: object, key: str = "") -> str:
    """A JSON value as a log can show it: its JSON type and a short excerpt; for a
    secret field (``pw``: :func:`amps_py.redact.is_secret` of the last part of ``key``)
    its JSON type and :data:`~amps_py.redact.MASK`, never its value or its length."""
    kinds = {
        bool: "a boolean",
        int: "a number",
        float: "a number",
        str: "a string",
        list: "a list",
        dict: "an object",
        type(None): "null",
    }
    kind = kinds.get(type(value), type(value).__name__)
    if is_secret(key.rsplit(".", 1)[-1]):
        return f"{kind} {MASK}" if value is not None else kind
    text = json.dumps(value, default=repr) if value is not None else ""
    if len(text) > 60:
        text = text[:57] + "..."
    return f"{kind} {text}".rstrip()


def _is_u64(value: object) -> bool:
    return type(value) is int and 0 <= value <= _U64_MAX


class _Fields:
    """Reads the fields of one handshake payload. Any field of the wrong type or
    value raises :class:`RemoteProtocolError` (reason ``malformed <what>``) naming the
    field and what was expected."""

    def __init__(self, what: str, reason: str, body: dict[str, Any]) -> None:
        self.what = what
        self.reason = reason
        self.body = body

    def bad(self, key: str, expected: str, value: object) -> RemoteProtocolError:
        return RemoteProtocolError(
            self.reason,
            f"repl_{self.what} field {key!r}: expected {expected}, got {_shown(value, key)}; "
            "the peer is not an amps-py instance of this version, or is forged",
        )

    def name(self, key: str, *, required: bool = False) -> str:
        """An instance name or group: 1 to 64 printable characters, no path separator
        (the config's rule); ``""`` when absent, null or empty (refused when
        ``required``)."""
        value = self.body.get(key)
        if value in (None, "") and not required:
            return ""
        if (
            not isinstance(value, str)
            or not 0 < len(value) <= MAX_NAME_LENGTH
            or "/" in value
            or "\\" in value
            or not value.isprintable()  # no control characters: logs, journal paths
        ):
            expected = (
                f"an instance name (1 to {MAX_NAME_LENGTH} printable characters, no '/' or '\\')"
            )
            raise self.bad(key, expected, value)
        return value

    def text(self, key: str, *, limit: int = _MAX_LABEL) -> str:
        """A string of at most ``limit`` characters; ``""`` when absent."""
        value = self.body.get(key, "")
        if not isinstance(value, str) or len(value) > limit:
            raise self.bad(key, f"a string of at most {limit} characters", value)
        return value

    def choice(self, key: str, options: tuple[str, ...], default: str) -> str:
        value = self.body.get(key, default)
        if value not in options or not isinstance(value, str):
            raise self.bad(key, " or ".join(repr(o) for o in options), value)
        return value

    def count(self, key: str, default: int = 0) -> int:
        """An integer from 0 to 2**64-1 (a txid)."""
        value = self.body.get(key, default)
        if type(value) is not int or not 0 <= value <= _U64_MAX:
            raise self.bad(key, "an integer from 0 to 2**64-1", value)
        return value

    def origins(self, key: str) -> dict[str, Any] | None:
        """An object keyed by origin instance name (as stored in records: at most 64
        printable characters, possibly empty); None when absent or null."""
        value = self.body.get(key)
        if value is None:
            return None
        if not isinstance(value, dict) or not all(
            len(k) <= MAX_NAME_LENGTH and k.isprintable() for k in value
        ):
            raise self.bad(key, "an object keyed by instance name", value)
        return value

    def highs(self, key: str) -> dict[str, int] | None:
        """``{origin: highest origin txid}`` (the hello's ``holdings``)."""
        value = self.origins(key)
        if value is None:
            return None
        for origin, high in value.items():
            if not _is_u64(high):
                raise self.bad(f"{key}.{origin}", "an integer from 0 to 2**64-1", high)
        return value

    def held(self, key: str) -> dict[str, HeldOrigin] | None:
        """``{origin: {"upto": n, "digest": n, "cuts": [[bucket, digest], ...]}}`` (the
        welcome's ``holdings``; ``upto`` and ``digest`` together or not at all), numbers
        from 0 to 2**64-1."""
        value = self.origins(key)
        if value is None:
            return None
        out: dict[str, HeldOrigin] = {}
        for origin, held in value.items():
            where = f"{key}.{origin}"
            shape = '{"upto": integer, "digest": integer, "cuts": [[bucket, digest], ...]}'
            if not isinstance(held, dict):
                raise self.bad(where, shape, held)
            cuts = held.get("cuts", [])
            ok = isinstance(cuts, list) and all(
                isinstance(c, list) and len(c) == 2 and all(_is_u64(n) for n in c) for c in cuts
            )
            if not ok:
                raise self.bad(f"{where}.cuts", "a list of [bucket, digest] integer pairs", cuts)
            upto, digest = held.get("upto"), held.get("digest")
            if (upto is None) != (digest is None) or not (
                upto is None or (_is_u64(upto) and _is_u64(digest))
            ):
                raise self.bad(where, shape, held)
            out[origin] = HeldOrigin(upto, digest or 0, tuple((c[0], c[1]) for c in cuts))
        return out

    def flag(self, key: str) -> bool:
        value = self.body.get(key, False)
        if not isinstance(value, bool):
            raise self.bad(key, "true or false", value)
        return value

    def topics(self, key: str) -> tuple[dict[str, Any], ...]:
        """The replicated Topic descriptors (see :mod:`.validation`): a list of
        objects with ``name`` (string or null), ``message_type`` (a non-empty string),
        ``filter`` (string or null), ``exclude_validation`` (a list of strings) and
        ``sow_topics`` (a list of objects with ``name``, ``message_type`` and ``keys``, a
        list of strings) and ``queues`` (a list of objects, see :meth:`_queues`); a
        missing key takes its default, other keys are ignored."""
        value = self.body.get(key, [])
        shape = (
            'a list of topic objects {"name": string|null, "message_type": string, '
            '"filter": string|null, "exclude_validation": [string, ...]}'
        )
        if not isinstance(value, list):
            raise self.bad(key, shape, value)
        for i, topic in enumerate(value):
            where = f"{key}[{i}]"
            if not isinstance(topic, dict):
                raise self.bad(where, shape, topic)
            name, mtype = topic.get("name"), topic.get("message_type", "json")
            if name is not None and not isinstance(name, str):
                raise self.bad(f"{where}.name", "a topic name or regex (string) or null", name)
            if not isinstance(mtype, str) or not 0 < len(mtype) <= MAX_NAME_LENGTH:
                raise self.bad(f"{where}.message_type", "a message type such as json", mtype)
            flt = topic.get("filter")
            if flt is not None and not isinstance(flt, str):
                raise self.bad(f"{where}.filter", "a content filter (string) or null", flt)
            excluded = topic.get("exclude_validation")
            if excluded is not None and not (
                isinstance(excluded, list)
                and all(isinstance(c, str) and len(c) <= MAX_NAME_LENGTH for c in excluded)
            ):
                raise self.bad(
                    f"{where}.exclude_validation", "a list of check names (strings)", excluded
                )
            self._sow_topics(f"{where}.sow_topics", topic.get("sow_topics"))
            self._queues(f"{where}.queues", topic.get("queues"))
        return tuple(value)

    def _sow_topics(self, where: str, value: object) -> None:
        """Check the ``sow_topics`` of one Topic descriptor (``None``: absent)."""
        if value is None:
            return
        shape = 'a list of SOW topics {"name": string, "message_type": string, "keys": [string]}'
        if not isinstance(value, list):
            raise self.bad(where, shape, value)
        for i, sow in enumerate(value):
            at = f"{where}[{i}]"
            if not isinstance(sow, dict):
                raise self.bad(at, shape, sow)
            name, mtype, keys = sow.get("name"), sow.get("message_type", "json"), sow.get("keys")
            if not isinstance(name, str) or not name:
                raise self.bad(f"{at}.name", "a topic name (non-empty string)", name)
            if not isinstance(mtype, str) or not 0 < len(mtype) <= MAX_NAME_LENGTH:
                raise self.bad(f"{at}.message_type", "a message type such as json", mtype)
            if keys is not None and not (
                isinstance(keys, list) and all(isinstance(k, str) for k in keys)
            ):
                raise self.bad(f"{at}.keys", "a list of Key paths (strings)", keys)
            pattern = sow.get("pattern")
            if pattern is not None and not (isinstance(pattern, str) and pattern):
                raise self.bad(f"{at}.pattern", "a SOW Pattern (non-empty string)", pattern)

    def _queues(self, where: str, value: object) -> None:
        """Check the ``queues`` of one Topic descriptor (``None``: absent): objects with
        ``name`` (a non-empty string), the strings ``kind``, ``message_type``,
        ``underlying_topic`` and ``semantics``, ``underlying_is_regex`` and
        ``archived`` (true or false), the strings or nulls ``default_publish_target``,
        ``initial_owner``, ``priority``, ``barrier_expression`` and ``filter``, and
        ``expiration`` (seconds above 0, or null); a missing key takes the queue
        default."""
        if value is None:
            return
        shape = 'a list of queues {"name": string, "kind": string, "message_type": string, ...}'
        if not isinstance(value, list):
            raise self.bad(where, shape, value)
        for i, queue in enumerate(value):
            at = f"{where}[{i}]"
            if not isinstance(queue, dict):
                raise self.bad(at, shape, queue)
            name = queue.get("name")
            if not isinstance(name, str) or not name:
                raise self.bad(f"{at}.name", "a queue name (non-empty string)", name)
            for key in ("kind", "message_type", "semantics"):
                word = queue.get(key, "json")
                if not isinstance(word, str) or not 0 < len(word) <= MAX_NAME_LENGTH:
                    raise self.bad(f"{at}.{key}", f"a {key.replace('_', ' ')} (string)", word)
            underlying = queue.get("underlying_topic")
            if underlying is not None and not isinstance(underlying, str):
                raise self.bad(f"{at}.underlying_topic", "a topic or regex (string)", underlying)
            for key in ("underlying_is_regex", "archived"):
                flag = queue.get(key, False)
                if not isinstance(flag, bool):
                    raise self.bad(f"{at}.{key}", "true or false", flag)
            for key in (
                "default_publish_target",
                "initial_owner",
                "priority",
                "barrier_expression",
                "filter",
            ):
                text = queue.get(key)
                if text is not None and not isinstance(text, str):
                    raise self.bad(f"{at}.{key}", "a string or null", text)
            expiration = queue.get("expiration")
            if expiration is not None and not (
                type(expiration) in (int, float) and 0 < expiration < float("inf")
            ):
                raise self.bad(f"{at}.expiration", "seconds above 0 (a number) or null", expiration)


def parse_hello(body: dict[str, Any]) -> Hello:
    """The :class:`Hello` of a ``repl_hello`` payload, every field type-checked.

    Raises:
        RemoteProtocolError: reason ``protocol version`` when the peer speaks another version
            (checked first: another version may shape its fields differently), else
            ``malformed hello`` naming the first field that is missing or wrong.
    """
    fields = _Fields("hello", reasons.MALFORMED_HELLO, body)
    version = body.get("version")
    if type(version) is not int:
        raise fields.bad(
            "version", f"the replication protocol version ({PROTOCOL_VERSION})", version
        )
    if version != PROTOCOL_VERSION:
        name = body.get("name")
        who = f"peer {name!r}" if isinstance(name, str) and len(name) <= 64 else "the peer"
        raise RemoteProtocolError(
            reasons.PROTOCOL_VERSION,
            f"{who} speaks replication protocol version {version}, this instance speaks "
            f"{PROTOCOL_VERSION}; run the same amps-py version on both",
        )
    name = fields.name("name", required=True)
    return Hello(
        version=version,
        name=name,
        group=fields.name("group") or name,
        destination=fields.text("destination"),
        sync=fields.choice("sync", ("sync", "async"), "async"),
        compression=fields.choice("compression", ("none", "zstd"), "none"),
        topics=fields.topics("topics"),
        expected_group=fields.name("expected_group"),
        user_id=fields.text("user_id"),
        pw=fields.text("pw", limit=4096),
        back=fields.flag("back"),
        holdings=fields.highs("holdings"),
    )


def parse_welcome(body: dict[str, Any]) -> Welcome:
    """The :class:`Welcome` of a ``repl_welcome`` payload, every field type-checked.

    Raises:
        RemoteProtocolError: reason ``malformed welcome`` naming the first field that is
            missing or wrong.
    """
    fields = _Fields("welcome", reasons.MALFORMED_WELCOME, body)
    name = fields.name("name", required=True)
    return Welcome(
        name=name,
        group=fields.name("group") or name,
        cursor_txid=fields.count("cursor_txid"),
        cursor_bm=fields.text("cursor_bm"),
        holdings=fields.held("holdings"),
    )
