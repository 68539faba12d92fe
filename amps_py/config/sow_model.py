"""The option object of one ``SOW/Topic``: :class:`SowTopicConfig`.

The loader builds it in ``amps_py.config.sow`` (which needs lxml); this module holds
only the frozen dataclass, knows nothing of XML and imports no lxml, so the server and
routing can read it. ``amps_py.config.model`` re-exports it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path


@dataclass(frozen=True)
class SowTopicConfig:
    """One ``SOW/Topic``: a topic whose last value per key is kept (State of the World).

    amps-py derives a SOW topic's store from the journal, so the loader only accepts a
    SOW topic that the TransactionLog records.

    Attributes:
        name: the topic, literal (``Name``, or its pre-5.0 synonym ``Topic``); with a
            :attr:`pattern`, the name of the physical store (its directory, statistics,
            a ConflatedTopic's ``UnderlyingTopic``), a topic of its own only when the
            pattern matches it.
        message_type: the message type of the topic, e.g. ``json``.
        keys: the ``Key`` identifier paths (``/id``, ``/order/id``) that together
            form a record's key, in the order written; ``()``: publishers send an
            explicit key (the ``k`` header).
        durability: ``persistent`` (the store survives a restart) or ``transient``
            (rebuilt from the journal at start); ``Durability`` or its synonym
            ``Duration``.
        expiration: the default lifetime of a record in seconds (``Expiration``
            given as a duration); ``None``: no default lifetime.
        expiration_enabled: ``Expiration`` is ``enabled``: only records published
            with an ``e`` header expire. Records expire at all when either this is
            true or :attr:`expiration` is set (see :attr:`expires`).
        file_name: the directory of this topic's store (``FileName``, ``%n``
            expanded); ``None``: ``<JournalDirectory>/sow/<name>``.
        key_domain: ``KeyDomain``, the seed for generated keys; ``""``: the topic
            name (for a :attr:`pattern` topic, its Name: a key's ``k`` is the same in
            every topic it holds).
        pattern: ``Pattern``, a regular expression (searched, not anchored, as AMPS
            topic expressions are): every topic it matches is a logical SOW topic
            kept in this one store, records distinct per (topic, key); ``None``: the
            topic is :attr:`name` alone.
    """

    name: str
    message_type: str
    keys: tuple[str, ...]
    durability: str = "persistent"
    expiration: float | None = None
    expiration_enabled: bool = False
    file_name: Path | None = None
    key_domain: str = ""
    pattern: str | None = None
    _regex: re.Pattern[str] | None = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        regex = None if self.pattern is None else re.compile(self.pattern)
        object.__setattr__(self, "_regex", regex)

    def holds(self, topic: str) -> bool:
        """Whether records published to ``topic`` belong to this SOW topic: ``topic``
        is the Name of a topic without Pattern, or a topic the Pattern matches."""
        if self._regex is None:
            return topic == self.name
        return self._regex.search(topic) is not None

    @property
    def transient(self) -> bool:
        """Whether the store is kept only for the life of the process."""
        return self.durability == "transient"

    @property
    def expires(self) -> bool:
        """Whether records of this topic can expire (a default lifetime, or the
        per-message ``e`` header honoured)."""
        return self.expiration is not None or self.expiration_enabled


@dataclass(frozen=True)
class ConflatedTopicConfig:
    """One ``SOW/ConflatedTopic`` (or its synonym ``ReplicaDefinition``): a SOW topic
    of its own that holds the latest record of each key of a SOW topic, brought up to
    date once per :attr:`interval` (only the keys that changed; a key deleted below is
    removed at the next interval). It is derived and never journaled: a start fills it
    from its underlying topic's store.

    Attributes:
        name: the conflated topic (``Name``, or its synonym ``Topic``), literal.
        underlying_topic: the ``Name`` of the SOW topic it copies (one without
            ``Pattern``: amps-py does not build ``TopicFormat``).
        message_type: the message type, the underlying topic's.
        interval: seconds between updates (``Interval``; default 5, at least 0.1).
        filter: ``Filter``, a content filter: only records that match it are kept;
            ``None``: every record.
        hash_indexes: ``HashIndex`` field lists, accepted and not used: AMPS documents
            them as an index that speeds up exact-match queries, and every query
            here reads the store.
    """

    name: str
    underlying_topic: str
    message_type: str
    interval: float = 5.0
    filter: str | None = None
    hash_indexes: tuple[str, ...] = ()
