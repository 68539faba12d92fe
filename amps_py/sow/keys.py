"""SOW keys: generated from a record's key fields, or given by the publisher.

A SOW topic with ``Key`` paths (``/id``, ``/order/region``, ...) keys each record by the
values at those paths. The generated key is an opaque string of decimal digits (an
unsigned 64-bit number, as AMPS returns in ``k``): the first 8 bytes of BLAKE2b over the
key domain (the topic name unless ``KeyDomain`` is configured) and a canonical encoding
of the key values. It is the same on every instance, process, platform and Python
version (``hash()`` is never used: it is salted per process), so two instances of a
replicated pair agree on every record's key.

A topic without ``Key`` paths takes the publisher's explicit ``k`` header instead; AMPS
documents it as made of Base64 characters, which :meth:`SowKeyer.explicit_key` checks.

The canonical encoding, per key path in configuration order: one type byte, then a
4-byte big-endian length and the value's UTF-8 text. So ``5``, ``5.0``, ``"5"`` and
``true`` are four different keys (AMPS keys on the field's text; whether it equates
``5`` and ``5.0`` is UNCONFIRMED), and values cannot run into each other
(``("ab", "c")`` and ``("a", "bc")`` differ). A key path that reaches several values
(through an array) keys on all of them, in document order.

A key value that AMPS reads as NULL (a missing field, JSON ``null``, an empty string,
an object, an empty array) cannot key a record: :class:`SowKeyError`.

Pure: no I/O, no trio.
"""

from __future__ import annotations

import hashlib
import re
import struct
from collections.abc import Iterable, Sequence
from typing import Final

from amps_py.filters.context import DEFAULT_CONTEXT
from amps_py.filters.errors import FilterError
from amps_py.filters.lexer import PathStep, Tok, tokenize
from amps_py.filters.paths import Getter, make_getter
from amps_py.filters.values import Scalar, Value

#: the longest key LMDB (default build) stores: keys are the store's LMDB keys
MAX_KEY_BYTES: Final = 511

_EXPLICIT_KEY: Final = re.compile(r"[A-Za-z0-9+/=_-]+")
_LEN: Final = struct.Struct(">I")
_TAG_INT: Final = b"i"
_TAG_FLOAT: Final = b"f"
_TAG_BOOL: Final = b"b"
_TAG_STR: Final = b"s"
_TAG_MULTI: Final = b"m"


class SowKeyError(ValueError):
    """A record's SOW key cannot be found or is not acceptable.

    The message names the topic and, for a generated key, the key path; it says what
    the publisher must change.
    """


def parse_key_paths(paths: str | Iterable[str]) -> tuple[str, ...]:
    """Check SOW ``Key`` paths (``/id``, ``/a/b``, ``/items[0]``, ``[/odd name]``).

    Args:
        paths: one path, or several (one per ``Key`` element). A single string may
            also hold several paths separated by commas.

    Returns:
        The paths, stripped, in order, without duplicates.

    Raises:
        SowKeyError: a path is empty or is not an AMPS field identifier.
    """
    items = paths.split(",") if isinstance(paths, str) else list(paths)
    out: list[str] = []
    for raw in items:
        text = raw.strip()
        _steps_of(text)
        if text not in out:
            out.append(text)
    return tuple(out)


def _steps_of(path: str) -> tuple[PathStep, ...]:
    """The steps of one key path, or a :class:`SowKeyError` saying what is wrong."""
    if not path:
        raise SowKeyError("empty SOW key path: write a field path like /id or /order/id")
    try:
        tokens = tokenize(path)
    except FilterError as exc:
        raise SowKeyError(f"bad SOW key path {path!r}: {exc.problem}; {exc.hint}") from None
    if len(tokens) != 2 or tokens[0].kind is not Tok.PATH or tokens[1].kind is not Tok.EOF:
        raise SowKeyError(
            f"bad SOW key path {path!r}: a key is one field path like /id or /order/id "
            "(list several keys as separate Key elements)"
        )
    steps = tokens[0].value
    assert isinstance(steps, tuple)
    return steps


def path_getter(path: str) -> Getter:
    """What reads the value at one field path (``/id``, ``/order/id``) of a parsed
    JSON document: a SOW key path's reader, for others that key messages the same way
    (conflated subscriptions' ``conflation_key``).

    Raises:
        SowKeyError: ``path`` is empty or is not one field path.
    """
    return make_getter(_steps_of(path.strip()))


def _encode_scalar(value: Scalar, out: bytearray) -> None:
    if type(value) is bool:
        tag, text = _TAG_BOOL, b"true" if value else b"false"
    elif type(value) is int:
        tag, text = _TAG_INT, str(value).encode()
    elif type(value) is float:
        # repr is the shortest round-trip text: the same on every CPython >= 3.1
        tag, text = _TAG_FLOAT, repr(value).encode()
    else:
        tag, text = _TAG_STR, str(value).encode("utf-8", "surrogatepass")
    out += tag
    out += _LEN.pack(len(text))
    out += text


class SowKeyer:
    """Computes the SOW key of a topic's records.

    Args:
        topic: the SOW topic's name (used in messages, and as the key domain by default).
        key_paths: the topic's ``Key`` paths; empty when publishers send explicit keys.
        key_domain: the seed generated keys are hashed with (``KeyDomain``); empty means
            the topic name. Two topics with the same domain and key paths give equal
            records equal keys.

    Raises:
        SowKeyError: a key path is not a field path.
    """

    __slots__ = ("_domain", "_getters", "key_paths", "topic")

    def __init__(self, topic: str, key_paths: Sequence[str], key_domain: str = "") -> None:
        self.topic = topic
        self.key_paths = parse_key_paths(key_paths)
        self._getters = tuple((path, make_getter(_steps_of(path))) for path in self.key_paths)
        domain = (key_domain or topic).encode("utf-8", "surrogatepass")
        self._domain = _LEN.pack(len(domain)) + domain

    @property
    def generates_keys(self) -> bool:
        """True when keys come from the record (``Key`` paths are configured)."""
        return bool(self.key_paths)

    def key_of(self, doc: object) -> str:
        """The generated SOW key of the parsed JSON document ``doc``.

        Returns:
            Decimal digits of an unsigned 64-bit number, stable across processes.

        Raises:
            SowKeyError: the topic has no ``Key`` paths, or a key field is missing or
                NULL in ``doc`` (the message names the path and the topic).
        """
        if not self._getters:
            raise SowKeyError(
                f"SOW topic {self.topic!r} has no Key: the publisher must send the record's "
                "key in the k header (or configure Key paths for the topic)"
            )
        out = bytearray(self._domain)
        for path, getter in self._getters:
            value: Value = getter(doc, DEFAULT_CONTEXT)
            if value is None:
                raise SowKeyError(
                    f"the message has no value at key path {path} of SOW topic "
                    f"{self.topic!r}: every record of the topic needs a non-empty {path} "
                    '(a missing field, null, "" or an object cannot key a record)'
                )
            if type(value) is list:
                out += _TAG_MULTI
                out += _LEN.pack(len(value))
                for item in value:
                    _encode_scalar(item, out)
            else:
                _encode_scalar(value, out)  # type: ignore[arg-type]
        digest = hashlib.blake2b(bytes(out), digest_size=8).digest()
        return str(int.from_bytes(digest, "big"))

    def explicit_key(self, k: str) -> str:
        """Check a publisher's explicit SOW key (the ``k`` header) and return it verbatim.

        AMPS documents the key as made of Base64 characters (``A-Z a-z 0-9 + / =``; the
        URL-safe ``-`` and ``_`` are accepted too), at most :data:`MAX_KEY_BYTES` long.

        Raises:
            SowKeyError: ``k`` is empty, too long, or holds another character.
        """
        if not k:
            raise SowKeyError(
                f"empty SOW key for topic {self.topic!r}: send the record's key in the k "
                "header (Base64 characters)"
            )
        if len(k) > MAX_KEY_BYTES:
            raise SowKeyError(
                f"SOW key for topic {self.topic!r} is {len(k)} characters long; the limit is "
                f"{MAX_KEY_BYTES} (hash long keys to a shorter Base64 string)"
            )
        if _EXPLICIT_KEY.fullmatch(k) is None:
            bad = next(ch for ch in k if _EXPLICIT_KEY.fullmatch(ch) is None)
            raise SowKeyError(
                f"SOW key {k!r} for topic {self.topic!r} holds {bad!r}: an explicit key may "
                "only hold Base64 characters (A-Z a-z 0-9 + / =); Base64-encode it first"
            )
        return k

    def __repr__(self) -> str:
        return f"SowKeyer({self.topic!r}, {self.key_paths!r})"
