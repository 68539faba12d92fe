"""Message types: how a payload of each AMPS message type is read and written.

Everything that looks inside a message (content filters, SOW keys, ``delta_publish``,
conflation keys, queue ``Priority``, the pipeline's decoded column) works on one form,
the *document*: what :meth:`MessageType.document` makes of a payload, a tree of
``dict``/``list``/scalars like parsed JSON. The filter compiler and the SOW key reader
only ever see documents, so a path such as ``/55`` (FIX tag 55), ``/Symbol`` (NVFIX)
or ``/Order/@id`` (an XML attribute) is looked up the same way for every type.

:class:`MessageTypes` is an instance's set of types: the AMPS defaults plus what
``<MessageTypes>`` in the configuration adds or changes (:func:`default_types`,
:func:`make_type`).

One module per type, each with its document mapping in its docstring: ``fix`` and
``nvfix`` (over ``_fields``, the shared tag=value format), ``xml`` (over ``_xml_tree``,
which holds lxml and is imported on first use), ``bson`` and ``msgpack`` (over
``_trees``); json and binary live here. Every ``document()`` takes any bytes without
raising (``tests/test_message_types_hostile.py``).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from typing import Final

import orjson

from amps_py.message_types._base import MergeError, MessageType
from amps_py.message_types._fields import TagValueType
from amps_py.message_types.bson import BSON, BsonType
from amps_py.message_types.fix import FIX, FixType
from amps_py.message_types.msgpack import MSGPACK, MsgpackType
from amps_py.message_types.nvfix import NVFIX, NvfixType
from amps_py.message_types.xml import XML, XmlType

__all__ = [
    "AMPS_ONLY_MODULES",
    "BINARY",
    "BSON",
    "BUILT_MODULES",
    "FIX",
    "JSON",
    "MSGPACK",
    "NVFIX",
    "SEPARATED_MODULES",
    "XML",
    "MergeError",
    "MessageType",
    "MessageTypes",
    "default_types",
    "make_type",
]

#: the modules amps-py builds, in the order AMPS's documentation lists them
BUILT_MODULES: Final = ("fix", "nvfix", "xml", "json", "msgpack", "bson", "binary")
#: modules AMPS has that amps-py does not build (yet); soapfix is in older AMPS releases
AMPS_ONLY_MODULES: Final = (
    "bflat",
    "protobuf",
    "struct",
    "composite-local",
    "composite-global",
    "soapfix",
)
#: the modules whose messages are tag=value fields with configurable separators
SEPARATED_MODULES: Final = ("fix", "nvfix")


class _Singleton:
    """Equal to any instance of its own class (a copy or an unpickled one too)."""

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self)

    def __hash__(self) -> int:
        return hash(type(self))

    def __repr__(self) -> str:
        return f"{type(self).__name__.strip('_').lower()} type"


class _Json(_Singleton):
    name = "json"
    module = "json"
    supports_delta = True

    def document(self, payload: bytes) -> object | None:
        try:
            doc: object = orjson.loads(payload)
        except orjson.JSONDecodeError:
            return None
        return doc

    def merge(self, stored: bytes, delta: bytes) -> bytes:
        from amps_py.sow.merge import delta_merge

        try:
            old, new = orjson.loads(stored), orjson.loads(delta)
        except orjson.JSONDecodeError as exc:
            raise MergeError(f"the message is not JSON ({exc})") from None
        return orjson.dumps(delta_merge(old, new))

    def to_jsonable(self, payload: bytes) -> object | None:
        return self.document(payload)


class _Binary(_Singleton):
    name = "binary"
    module = "binary"
    supports_delta = False

    def document(self, payload: bytes) -> object | None:
        return None

    def merge(self, stored: bytes, delta: bytes) -> bytes:
        raise MergeError(
            "binary messages have no fields, so a delta cannot be merged: publish the "
            "whole message instead"
        )

    def to_jsonable(self, payload: bytes) -> object | None:
        return None


JSON: Final[MessageType] = _Json()
BINARY: Final[MessageType] = _Binary()


class MessageTypes(Mapping[str, MessageType]):
    """The message types an instance knows, by name (immutable; hashable).

    Built from an iterable of types; when two share a name the later one wins, so
    ``MessageTypes((*default_types().values(), *configured))`` is the defaults with the
    configured types added or replacing them (as ``<MessageTypes>`` does in AMPS).
    """

    def __init__(self, types: Iterable[MessageType]) -> None:
        self._types = {t.name: t for t in types}

    def __getitem__(self, name: str) -> MessageType:
        return self._types[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._types)

    def __len__(self) -> int:
        return len(self._types)

    def __hash__(self) -> int:
        return hash(frozenset(self._types.items()))

    def __repr__(self) -> str:
        return f"MessageTypes({', '.join(self._types)})"

    def document(self, name: str, payload: bytes) -> object | None:
        """The document of a payload of type ``name``; None for an unknown type or a
        malformed payload. Never raises."""
        t = self._types.get(name)
        return None if t is None else t.document(payload)


def make_type(
    name: str,
    module: str,
    *,
    field_separator: bytes | None = None,
    header_separator: bytes | None = None,
    message_separator: bytes | None = None,
) -> MessageType:
    """A message type called ``name`` built on ``module`` (what one
    ``<MessageTypes><MessageType>`` declares).

    Args:
        name: the name topics, transports and clients use.
        module: one of :data:`BUILT_MODULES`.
        field_separator, header_separator, message_separator: one byte each, for the
            :data:`SEPARATED_MODULES` only; None keeps the module's default.

    Raises:
        ValueError: an unknown module, a separator for a module that has none, or a
            separator that is not one byte (or is ``=``). The configuration loader
            checks all of these first and reports them with the element's line.
    """
    separators = {
        "field_separator": field_separator,
        "header_separator": header_separator,
        "message_separator": message_separator,
    }
    given = {label: sep for label, sep in separators.items() if sep is not None}
    if module in SEPARATED_MODULES:
        kind: type[TagValueType] = FixType if module == "fix" else NvfixType
        return kind(name, **given)
    if given:
        raise ValueError(
            f"{', '.join(given)} apply to the {' and '.join(SEPARATED_MODULES)} modules "
            f"only, not to {module}"
        )
    built: dict[str, MessageType] = {
        "json": JSON,
        "binary": BINARY,
        "xml": XmlType(name),
        "bson": BsonType(name),
        "msgpack": MsgpackType(name),
    }
    if module not in built:
        raise ValueError(f"unknown message type module {module!r}: use one of {BUILT_MODULES}")
    if module in ("json", "binary") and name != module:
        return _Renamed(name, built[module])
    return built[module]


class _Renamed:
    """A json or binary type under another name (those two are singletons)."""

    __slots__ = ("_base", "name")

    def __init__(self, name: str, base: MessageType) -> None:
        self.name = name
        self._base = base

    @property
    def module(self) -> str:
        return self._base.module

    @property
    def supports_delta(self) -> bool:
        return self._base.supports_delta

    def document(self, payload: bytes) -> object | None:
        return self._base.document(payload)

    def merge(self, stored: bytes, delta: bytes) -> bytes:
        return self._base.merge(stored, delta)

    def to_jsonable(self, payload: bytes) -> object | None:
        return self._base.to_jsonable(payload)

    def __eq__(self, other: object) -> bool:
        return type(other) is _Renamed and other.name == self.name and other._base == self._base

    def __hash__(self) -> int:
        return hash((self.name, self._base.module))

    def __repr__(self) -> str:
        return f"{self._base.module} type {self.name!r}"


def default_types() -> MessageTypes:
    """The types every instance loads without configuration, as AMPS does: fix, nvfix,
    xml, json, msgpack, bson and binary (AMPS's bflat is not built; see
    :data:`AMPS_ONLY_MODULES`)."""
    return MessageTypes((FIX, NVFIX, XML, JSON, MSGPACK, BSON, BINARY))
