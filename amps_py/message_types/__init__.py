"""Message types: how a payload of each AMPS message type is read and written.

Everything that looks inside a message (content filters, SOW keys, ``delta_publish``,
conflation keys, queue ``Priority``, the pipeline's decoded column) works on one form,
the *document*: what :meth:`MessageType.document` makes of a payload, a tree of
``dict``/``list``/scalars like parsed JSON. The filter compiler and the SOW key reader
only ever see documents, so a path such as ``/55`` (FIX tag 55), ``/Symbol`` (NVFIX)
or ``/Order/@id`` (an XML attribute) is looked up the same way for every type.

:class:`MessageTypes` is an instance's set of types: the AMPS defaults plus what
``<MessageTypes>`` in the configuration adds or changes (:func:`default_types`).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from typing import Final, Protocol

import orjson


class MergeError(ValueError):
    """A ``delta_publish`` could not be merged; ``str()`` says why and what to do."""


class MessageType(Protocol):
    """One message type. Implementations are immutable and shared by every thread.

    Attributes:
        name: the name clients and configuration use (``json``, ``fix``, or a name
            ``<MessageTypes>`` gives to a configured module).
        module: the AMPS module it is built on (``json``, ``fix``, ...).
        supports_delta: whether :meth:`merge` is defined (AMPS refuses
            ``delta_publish`` for the other types).
    """

    name: str
    module: str
    supports_delta: bool

    def document(self, payload: bytes) -> object | None:
        """The payload as a document, or None when it is not a well-formed message of
        this type (every filter path is then NULL). Never raises."""
        ...

    def merge(self, stored: bytes, delta: bytes) -> bytes:
        """The message that results from applying ``delta`` to ``stored`` (AMPS
        ``delta_publish`` rules for this type).

        Raises:
            MergeError: the type has no delta merge, or a payload is malformed.
        """
        ...

    def to_jsonable(self, payload: bytes) -> object | None:
        """A JSON-serialisable view of the payload for people and tools (``txlog
        dump``, the pipeline's decoded column); None when it cannot be decoded."""
        ...


class _Json:
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


class _Binary:
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
    """The message types an instance knows, by name (immutable)."""

    def __init__(self, types: Iterable[MessageType]) -> None:
        self._types = {t.name: t for t in types}

    def __getitem__(self, name: str) -> MessageType:
        return self._types[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._types)

    def __len__(self) -> int:
        return len(self._types)

    def document(self, name: str, payload: bytes) -> object | None:
        """The document of a payload of type ``name``; None for an unknown type or a
        malformed payload. Never raises."""
        t = self._types.get(name)
        return None if t is None else t.document(payload)


def default_types() -> MessageTypes:
    """The types every instance loads without configuration (as AMPS does)."""
    return MessageTypes((JSON, BINARY))
