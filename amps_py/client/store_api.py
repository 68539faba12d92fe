"""What the HA client asks of its publish store and its bookmark store.

The client (:mod:`amps_py.client.ha`) is written against these protocols; the stores
(:mod:`amps_py.client.publish_store`, :mod:`amps_py.client.bookmark_store`) implement
them in memory and in files. Both are used from one trio task at a time; a file store
does its blocking I/O in the calls that say so, which the client runs in a worker
thread (``trio.to_thread.run_sync``), except ``PublishStore.store`` (one OS write, run
on the client's thread). A publish store whose ``sync`` may run in a worker thread
while ``store`` runs says so with the class attribute ``concurrent_sync = True``.

Publish store contract:

* :meth:`PublishStore.store` assigns the next sequence number (1, 2, ... across
  restarts of a file store: it continues after the highest ever stored) and keeps the
  message until :meth:`PublishStore.discard_through` covers it. Messages are
  ``publish`` and ``delta_publish``, and ``sow_delete`` commands, which share the
  publisher's sequence numbers and persisted acks (one of :data:`SOW_DELETES`, the
  selector in ``data``; see :class:`StoredPublish`).
* Order: :meth:`PublishStore.unacked` yields what is kept in sequence order; after a
  reconnect the client republishes exactly that, before any new publish.
* Space: ``max_bytes`` bounds the payload bytes kept; :meth:`PublishStore.has_room`
  says whether a message of ``size`` bytes fits now (a message larger than
  ``max_bytes`` alone fits when the store is empty); the client blocks the publisher
  until a persisted ack discards enough.
* Durability of a file store: :meth:`PublishStore.store` writes to the OS (a client
  crash loses nothing it returned from); :meth:`PublishStore.sync` makes everything
  stored so far durable against a power loss, and the client calls it once per group
  of publishes (before sending the group), not per message.

Bookmark store contract (per subscription id):

* :meth:`BookmarkStore.delivered` records that a message arrived and says whether it
  is a duplicate of one the application already processed (then the client drops it)
  or may be one (redelivered after a failover: the client flags it).
* :meth:`BookmarkStore.processed` records that the application is done with a
  message (its ``discard``/ack). Only the highest contiguous processed sequence number
  of each publisher counts for resuming, so processing out of order never skips an
  unprocessed message.
* :meth:`BookmarkStore.resume_bookmark` is what the client sends as ``bm`` when it
  (re)subscribes: a comma-separated list with, for each publisher seen, the bookmark
  of its last contiguously processed message (``""`` when nothing was processed: the
  caller's own starting bookmark applies).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Final, Protocol

__all__ = [
    "SOW_DELETES",
    "SOW_DELETE_BY_DATA",
    "SOW_DELETE_BY_FILTER",
    "SOW_DELETE_BY_KEYS",
    "BookmarkStore",
    "Delivery",
    "PublishStore",
    "StoredPublish",
]

#: a stored ``sow_delete`` whose ``data`` is a content filter (header ``f``)
SOW_DELETE_BY_FILTER: Final = "sow_delete_filter"
#: a stored ``sow_delete`` whose ``data`` is a comma list of SOW keys (``sow_keys``)
SOW_DELETE_BY_KEYS: Final = "sow_delete_keys"
#: a stored ``sow_delete`` whose ``data`` is a message naming the record by its key
#: fields (the payload)
SOW_DELETE_BY_DATA: Final = "sow_delete_data"
#: the stored command names of ``sow_delete`` (on the wire all are ``sow_delete``)
SOW_DELETES: Final = frozenset({SOW_DELETE_BY_FILTER, SOW_DELETE_BY_KEYS, SOW_DELETE_BY_DATA})


@dataclass(frozen=True)
class StoredPublish:
    """One publish (or ``sow_delete``) kept until a persisted ack covers it.

    Attributes:
        seq: its sequence number (``s``), assigned by the store.
        command: ``publish``, ``delta_publish``, or a ``sow_delete`` by what selects
            the records: :data:`SOW_DELETE_BY_FILTER`, :data:`SOW_DELETE_BY_KEYS` or
            :data:`SOW_DELETE_BY_DATA`.
        topic: its topic.
        data: its payload; for a ``sow_delete`` the selector (the filter's text, the
            comma list of keys, or the message).
        sow_key: the explicit SOW key (``k``), or ``""``.
    """

    seq: int
    command: str
    topic: str
    data: bytes
    sow_key: str = ""


class PublishStore(Protocol):
    """Publishes kept until the server says they are persisted."""

    @property
    def last_seq(self) -> int:
        """The highest sequence number ever assigned (0 for a new store)."""
        ...

    @property
    def discarded_through(self) -> int:
        """Everything up to this sequence number is known persisted and dropped."""
        ...

    def __len__(self) -> int:
        """How many publishes are kept."""
        ...

    @property
    def bytes_kept(self) -> int:
        """Payload bytes kept."""
        ...

    def has_room(self, size: int) -> bool:
        """Whether a publish of ``size`` payload bytes fits now."""
        ...

    def store(self, command: str, topic: str, data: bytes, sow_key: str = "") -> int:
        """Keep a new publish and return its sequence number (blocking I/O for a file
        store: written to the OS, not fsynced).

        Raises:
            OSError: a file store could not write (the message names the file).
        """
        ...

    def sync(self) -> None:
        """Make everything stored so far durable (fsync for a file store; nothing for a
        memory store). Blocking."""
        ...

    def discard_through(self, seq: int) -> int:
        """A persisted ack (or the logon ack's ``s``) covers everything up to ``seq``:
        drop it; returns how many publishes were dropped. Blocking for a file store."""
        ...

    def unacked(self) -> Iterator[StoredPublish]:
        """What is kept, in sequence order (to republish after a reconnect)."""
        ...

    def close(self) -> None:
        """Release files (a file store); the stored publishes stay on disk."""
        ...


@dataclass(frozen=True)
class Delivery:
    """What :meth:`BookmarkStore.delivered` says of an arriving message.

    Attributes:
        duplicate: the application already processed it: drop it.
        possible_duplicate: it may have been delivered before (a redelivery after a
            reconnect, at or before the highest bookmark this store saw delivered for
            its publisher): hand it over flagged.
    """

    duplicate: bool = False
    possible_duplicate: bool = False


class BookmarkStore(Protocol):
    """Per subscription: what arrived and what the application processed."""

    def delivered(self, sub_id: str, bookmark: str) -> Delivery:
        """A message with ``bookmark`` (``<publisher hash>|<seq>|``) arrived."""
        ...

    def processed(self, sub_id: str, bookmark: str) -> None:
        """The application is done with the message ``bookmark`` (blocking I/O for a
        file store; written to the OS)."""
        ...

    def resume_bookmark(self, sub_id: str) -> str:
        """The ``bm`` to resubscribe with: per publisher, the bookmark of its last
        contiguously processed message, comma-separated; ``""`` if none."""
        ...

    def reconnected(self, sub_id: str) -> None:
        """The subscription is being re-established: deliveries from now on that are
        at or below what was delivered before are possible duplicates."""
        ...

    def sync(self) -> None:
        """Make the processed marks durable (fsync for a file store). Blocking."""
        ...

    def close(self) -> None:
        """Release files (a file store)."""
        ...
