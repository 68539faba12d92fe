"""The publishing side of the HA client: the publish store, the sender, the replay
after each logon and the discards that persisted acks allow.

:class:`HAPublisher` is composed into :class:`~amps_py.client.ha.HAClient`; each
connection's sequence and ack rules (publish seqs, persisted acks, failed publishes)
are its :class:`~amps_py.client.client.Client`'s
:class:`~amps_py.protocol.client_connection.ClientConnection`. The stores are used from
one task at a time (:mod:`amps_py.client.store_api`), under :attr:`HAPublisher.lock`.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, Final

import trio

from amps_py import offload
from amps_py.protocol import encode_frame

from .store_api import (
    SOW_DELETE_BY_FILTER,
    SOW_DELETE_BY_KEYS,
    SOW_DELETES,
    PublishStore,
    StoredPublish,
)
from .subscription import CommandError, ConnectionLost

if TYPE_CHECKING:
    from .client import Client

log = logging.getLogger("amps_py.client.ha")

#: bytes of replayed publishes written to the socket at a time
REPLAY_CHUNK: Final = 1024 * 1024


class HAPublisher:
    """What the HA client ``name`` published: stored first, sent from the store (one
    sync per group of sends), sent again after each logon until persisted.

    Attributes:
        store: the publish store.
        failed_publishes: publishes a server reported as not stored: seq -> the
            failure ack (a later persisted ack still discards them from the store).
        not_journaled_seq: the newest seq whose persisted ack said the topic is not
            journaled on that instance; 0 if none.
    """

    def __init__(self, name: str, store: PublishStore) -> None:
        self.name = name
        self.store = store
        self.failed_publishes: dict[int, dict[str, Any]] = {}
        self.not_journaled_seq = 0
        # the stores are used from one task at a time (store_api): this lock
        self._store_lock = trio.Lock()
        self._pending: list[StoredPublish] = []  # stored, not yet sent on this connection
        self._pending_ready = trio.Event()
        self._discarded = trio.Event()  # replaced after each discard or failure ack

    async def replay(self, client: Client, held: int) -> tuple[int, int]:
        """After a logon: discard what the server holds (``held``, the logon ack's
        ``s``), republish the rest in order; new publishes wait (the store lock) until
        it is written. Returns (republished, discarded)."""
        store = self.store
        async with self._store_lock:
            before = store.discarded_through
            discarded = await offload.run_sync(store.discard_through, held)
            if held < before:
                log.warning(
                    "HA client %r: %s holds this client's publishes only up to seq %d, but "
                    "seqs up to %d were acknowledged before (by another server that has "
                    "not replicated them here); they are not republished",
                    self.name,
                    client.name,
                    held,
                    before,
                )
            if store.last_seq < held:
                log.error(
                    "HA client %r: the server already holds seq %d of this client name but "
                    "the publish store assigned only up to %d; new publishes would be taken "
                    "for duplicates. Use the store that belongs to this client name, or "
                    "another client name",
                    self.name,
                    held,
                    store.last_seq,
                )
            tail = await offload.run_sync(lambda: list(store.unacked()))
            self._pending.clear()  # the replay covers them
            await offload.run_sync(store.sync)
            chunk: list[bytes] = []
            size = 0
            for kept in tail:
                frame = _publish_frame(kept)
                chunk.append(frame)
                size += len(frame)
                if size >= REPLAY_CHUNK:
                    await client.send_raw(b"".join(chunk))
                    chunk, size = [], 0
            if chunk:
                await client.send_raw(b"".join(chunk))
        if discarded:
            self._discard_done()
        return len(tail), discarded

    async def sender(self, client: Client) -> None:
        """Send what publishers stored, a group at a time: one store sync per group,
        then one socket write.

        The group is what was stored since the last one: while a sync runs, publishers
        store the next group, if the store allows it (:func:`_sync_is_concurrent`);
        otherwise they wait for the sync (the store lock)."""
        store = self.store
        concurrent = _sync_is_concurrent(store)
        while True:
            await self._pending_ready.wait()
            self._pending_ready = trio.Event()
            if not self._pending:
                continue
            batch, self._pending = self._pending, []
            if concurrent:
                await offload.run_sync(store.sync)
            else:
                async with self._store_lock:
                    await offload.run_sync(store.sync)
            await client.send_raw(b"".join(_publish_frame(kept) for kept in batch))

    async def ack_watcher(self, client: Client) -> None:
        """Discard what persisted acks cover; raises ConnectionLost when the
        connection ends (that ends the session)."""
        store = self.store
        while True:
            changed = client._persisted_changed
            if client.failed_publishes:
                self.failed_publishes.update(client.failed_publishes)
                client.failed_publishes.clear()
                self._discard_done()
            if client.not_journaled_seq > self.not_journaled_seq:
                self.not_journaled_seq = client.not_journaled_seq
            if client.persisted_seq > store.discarded_through:
                async with self._store_lock:
                    seq = client.persisted_seq
                    await offload.run_sync(store.discard_through, seq)
                self._discard_done()
                continue  # acks may have come meanwhile
            if client.closed is not None:
                raise ConnectionLost(str(client.closed))
            await changed.wait()

    def _discard_done(self) -> None:
        event = self._discarded
        self._discarded = trio.Event()
        event.set()

    async def publish(
        self, command: str, topic: str, data: bytes | str, sow_key: str | None
    ) -> int:
        """Store a publish (or ``sow_delete``) and queue it for the sender; returns its
        seq. Waits while the store has no room, until persisted acks discard enough."""
        payload = data.encode() if isinstance(data, str) else data
        store = self.store
        while True:
            async with self._store_lock:
                if store.has_room(len(payload)):
                    seq = store.store(command, topic, payload, sow_key or "")
                    self._pending.append(StoredPublish(seq, command, topic, payload, sow_key or ""))
                    self._pending_ready.set()
                    return seq
                room = self._discarded
            await room.wait()

    async def wait_persisted(self, seq: int, timeout: float, where: str) -> None:
        """Wait until a persisted ack (or a logon ack's ``s``) covers ``seq``, across
        reconnects.

        Raises:
            CommandError: the server reported that ``seq`` was not stored.
            TimeoutError: not covered within ``timeout`` seconds (the message says
                ``where`` the client is connected).
        """
        store = self.store
        if store.discarded_through >= seq:
            return  # covered already (a pipelining publisher's usual case): no cancel scope
        with trio.move_on_after(timeout):
            while store.discarded_through < seq:
                if seq in self.failed_publishes:
                    raise CommandError("publish", self.failed_publishes[seq])
                await self._discarded.wait()
            return
        raise TimeoutError(
            f"{self.name}: seq {seq} not persisted within {timeout:g} s (persisted through "
            f"{store.discarded_through}, {len(store)} kept, "
            f"{where})"
        )


def _sync_is_concurrent(store: PublishStore) -> bool:
    """Whether ``store`` declares (attribute ``concurrent_sync = True``) that its
    ``sync()`` may run in a worker thread while its other methods are called; then
    publishers keep storing during a sync, and groups grow with the sync's cost.
    Without it the client keeps to the protocol's one-call-at-a-time rule."""
    return bool(getattr(store, "concurrent_sync", False))


def _publish_frame(kept: StoredPublish) -> bytes:
    """The frame that (re)sends a stored publish or ``sow_delete``: its seq, asking
    for persisted acks only (they are conflated per connection)."""
    command = kept.command
    if command in SOW_DELETES:
        header: dict[str, Any] = {"c": "sow_delete", "t": kept.topic, "s": kept.seq}
        header["a"] = "persisted"
        if command == SOW_DELETE_BY_FILTER:
            header["f"] = kept.data.decode()
            return encode_frame(header)
        if command == SOW_DELETE_BY_KEYS:
            header["sow_keys"] = kept.data.decode()
            return encode_frame(header)
        return encode_frame(header, kept.data)
    header = {"c": command, "t": kept.topic, "s": kept.seq, "a": "persisted"}
    if kept.sow_key:
        header["k"] = kept.sow_key
    return encode_frame(header, kept.data)
