"""The option object of one ``SOW/Topic``: :class:`SowTopicConfig`.

The loader builds it in ``amps_py.config.sow`` (which needs lxml); this module holds
only the frozen dataclass, knows nothing of XML and imports no lxml, so the server and
routing can read it. ``amps_py.config.model`` re-exports it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class SowTopicConfig:
    """One ``SOW/Topic``: a topic whose last value per key is kept (State of the World).

    amps-py derives a SOW topic's store from the journal, so the loader only accepts a
    SOW topic that the TransactionLog records.

    Attributes:
        name: the topic, literal (``Name``, or its pre-5.0 synonym ``Topic``).
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
            name.
    """

    name: str
    message_type: str
    keys: tuple[str, ...]
    durability: str = "persistent"
    expiration: float | None = None
    expiration_enabled: bool = False
    file_name: Path | None = None
    key_domain: str = ""

    @property
    def transient(self) -> bool:
        """Whether the store is kept only for the life of the process."""
        return self.durability == "transient"

    @property
    def expires(self) -> bool:
        """Whether records of this topic can expire (a default lifetime, or the
        per-message ``e`` header honoured)."""
        return self.expiration is not None or self.expiration_enabled
