"""The interface every message type implements, and the merge error (no codec here, so
every codec module can import it)."""

from __future__ import annotations

from typing import Protocol


class MergeError(ValueError):
    """A ``delta_publish`` could not be merged; ``str()`` says why and what to do."""


class MessageType(Protocol):
    """One message type. Implementations are immutable and shared by every thread.

    Attributes:
        name: the name clients and configuration use (``json``, ``fix``, or a name
            ``<MessageTypes>`` gives to a configured module).
        module: the AMPS module it is built on (``json``, ``fix``, ...).
        supports_delta: whether :meth:`merge` is defined. Every type AMPS ships but
            binary (and protobuf 3, struct) supports it; for the others AMPS accepts a
            ``delta_publish`` and stores the delta as the whole message ("Delta
            Publish Support", AMPS User Guide).
    """

    @property
    def name(self) -> str: ...

    @property
    def module(self) -> str: ...

    @property
    def supports_delta(self) -> bool: ...

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
