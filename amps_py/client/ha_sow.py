"""The HA client's ``sow_and_subscribe``: :class:`HASowSubscription`, a subscription
to a State of the World topic that survives reconnects without handing the
application the snapshot again (see :meth:`amps_py.client.ha.HAClient.sow_and_subscribe`
for the contract; the decisions are in :mod:`amps_py.client.sow_view`).

On its first connection (and on any connection while nothing has been handed over
yet) it is a ``sow_and_subscribe`` as the caller issued it, asking also for the
bookmark of every live message. After a reconnect it resumes with a bookmark
``subscribe`` from what it had handed over, then checks its records once with a
``sow`` query. Every message handed over carries the bookmark that identifies its
version; the iterator yields :class:`~amps_py.client.ha_subscription.HAMessage`.
"""

from __future__ import annotations

import contextlib
import logging
from typing import TYPE_CHECKING, Any, Final

import trio

from amps_py import reasons

from .ha_subscription import HAMessage, HAOwner, HASubscription
from .sow_view import Key, Resumption, SowView, reconcile, version_of
from .subscription import AMPSError, CommandError, ConnectionLost, Message

if TYPE_CHECKING:
    from amps_py.protocol import SowRecord

    from .client import Client

__all__ = ["HASowSubscription"]

log = logging.getLogger("amps_py.client.ha")

#: options of a ``sow_and_subscribe`` that shape the snapshot only: not sent when it is
#: resumed as a bookmark subscription
SNAPSHOT_OPTIONS: Final = frozenset({"top_n", "orderby", "batch_size", "skip_n"})
#: seconds allowed for the reconciliation query after a resumption
RECONCILE_TIMEOUT: Final = 60.0

_LOST: Final = (ConnectionLost, trio.BrokenResourceError, trio.ClosedResourceError)


def _with_option(options: str | None, name: str) -> str:
    """``options`` with ``name`` added (once)."""
    names = [o.strip() for o in (options or "").split(",") if o.strip()]
    if not any(o.partition("=")[0] == name for o in names):
        names.append(name)
    return ",".join(names)


def _resume_options(options: str | None) -> str | None:
    """The caller's options without those that shape a snapshot only."""
    kept = [
        o.strip()
        for o in (options or "").split(",")
        if o.strip() and o.strip().partition("=")[0] not in SNAPSHOT_OPTIONS
    ]
    return ",".join(kept) or None


def _key_of(message: Message) -> Key | None:
    return (message.topic, message.key) if message.key else None


class HASowSubscription(HASubscription):
    """An HA ``sow_and_subscribe``: iterate it for the snapshot records
    (``message.snapshot``), then the live messages, across reconnects.

    Attributes:
        snapshot_done: set once the application has been handed a whole snapshot
            (the first ``group_end``; or, when the first snapshot was cut short by a
            lost connection, once the reconciliation after the resumption handed
            over the rest).
        resumes: how many times it was resumed by a bookmark replay.
        resynced: messages handed over by a reconciliation (updates and ``oof``).
        superseded_dropped: replayed messages dropped as older than the version of
            their record the application holds.
        view: what the application holds (:class:`~amps_py.client.sow_view.SowView`).
    """

    def __init__(
        self,
        ha: HAOwner,
        sub_id: str,
        topic: str,
        filter: str | None,
        options: str | None,
        *,
        top_n: int | None = None,
        orderby: str | None = None,
        batch_size: int = 10,
    ) -> None:
        super().__init__(ha, sub_id, topic, filter, None, options)
        self.top_n = top_n
        self.orderby = orderby
        self.batch_size = batch_size
        self.snapshot_done = trio.Event()
        self.resumes = 0
        self.resynced = 0
        self.superseded_dropped = 0
        self.view = SowView()
        #: the first snapshot reached its group_end (the view held every record once)
        self._whole = False
        #: records touched by messages while a reconciliation query runs
        self._touched: set[Key] | None = None
        #: the server refused a bookmark subscription on the topic: re-issue instead
        self._not_replayable = False

    @property
    def _wants_oof(self) -> bool:
        return any(o.strip() == "oof" for o in (self.options or "").split(","))

    async def _serve(
        self, client: Client, connection: int, task_status: trio.TaskStatus[None]
    ) -> AMPSError | None:
        if self.view and not self._not_replayable:
            try:
                return await self._resume(client, connection, task_status)
            except CommandError as exc:
                if exc.reason != reasons.INVALID_TOPIC or self.view.held:
                    raise
                # not journaled (and no SOW): nothing to replay; re-issue it as it was
                self._not_replayable = True
        return await self._snapshot(client, connection, task_status)

    async def _snapshot(
        self, client: Client, connection: int, task_status: trio.TaskStatus[None]
    ) -> AMPSError | None:
        """The ``sow_and_subscribe`` as the caller issued it (with option
        ``bookmark``): snapshot records, then live messages."""
        async with client.sow_and_subscribe(
            self.topic,
            self.filter,
            options=_with_option(self.options, "bookmark"),
            top_n=self.top_n,
            orderby=self.orderby,
            batch_size=self.batch_size,
            sub_id=self.sub_id,
            markers=True,
        ) as raw:
            self.subscribes += 1
            task_status.started()
            async for message in raw:
                command = message.command
                if command == "group_end":
                    self._whole = self.top_n is None
                    self.snapshot_done.set()
                elif command == "oof":
                    key = _key_of(message)
                    if key is not None:
                        self.view.left(key)
                    self._give(message, connection)
                elif command != "ack":
                    self.view.given(_key_of(message), version_of(message.bookmark))
                    self._give(message, connection)
        return None if raw.failure is None else CommandError("sow_and_subscribe", raw.failure)

    async def _resume(
        self, client: Client, connection: int, task_status: trio.TaskStatus[None]
    ) -> AMPSError | None:
        """Resume by a bookmark replay from what was handed over, then reconcile."""
        resume = Resumption[Message](self.view)
        bookmark = self.view.resume_bookmark() or "0|1|"
        async with (
            client.subscribe(
                self.topic,
                filter=self.filter,
                bookmark=bookmark,
                options=_resume_options(self.options),
                sub_id=self.sub_id,
                markers=True,
            ) as raw,
            trio.open_nursery() as nursery,
        ):
            self.subscribes += 1
            self.resumes += 1
            log.info(
                "HA client %r: sow_and_subscribe %s on %r resumed from %s (%d records held)",
                self._ha.name,
                self.sub_id,
                self.topic,
                bookmark[:200],
                len(self.view.held),
            )
            task_status.started()
            dropped = self.duplicates_dropped
            superseded = self.superseded_dropped
            async for message in raw:
                command = message.command
                key = _key_of(message)
                if self._touched is not None and key is not None:
                    self._touched.add(key)
                if command == "ack":
                    self._give_all(resume.seam(), connection)
                    nursery.start_soon(self._reconcile, client, connection)
                elif command == "oof":
                    if key is not None:
                        self._give_all(resume.oof(message, key), connection)
                else:
                    version = version_of(message.bookmark)
                    self._give_all(resume.message(message, key, version), connection)
                self.duplicates_dropped = dropped + resume.duplicates
                self.superseded_dropped = superseded + resume.superseded
            nursery.cancel_scope.cancel()
        return None if raw.failure is None else CommandError("subscribe", raw.failure)

    async def _reconcile(self, client: Client, connection: int) -> None:
        """Query the subscription's records once and bring the application's view up
        to date (see :func:`~amps_py.client.sow_view.reconcile`): what changed is
        handed over at once, what is gone (with option ``oof``) once its reason is
        known, unless a live message touched it meanwhile."""
        touched = self._touched = set()
        try:
            result = await client.sow(
                self.topic, self.filter, batch_size=self.batch_size, timeout=RECONCILE_TIMEOUT
            )
            records = [((r.topic, r.key), version_of(r.bookmark), r) for r in result]
            found = reconcile(self.view, records, touched, complete=self._whole)
            for record, possible in found.updates:
                self._give(self._as_message(record), connection, possible_duplicate=possible)
            gone: dict[Key, str] = {}
            if found.gone and self._wants_oof:
                gone = dict.fromkeys(found.gone, "deleted")
                gone.update(await self._why_gone(client, found.gone))
        except CommandError as exc:
            if exc.reason != reasons.INVALID_TOPIC:  # invalid topic: no SOW to check
                log.error(
                    "HA client %r: sow_and_subscribe %s on %r: the query that checks its "
                    "records after the resumption failed (%s); deletes made while the "
                    "client was away may not be reported",
                    self._ha.name,
                    self.sub_id,
                    self.topic,
                    exc,
                )
            return
        except (*_LOST, TimeoutError):
            return  # the next connection resumes and checks again
        finally:
            self._touched = None
        for key, why in gone.items():
            if key not in touched:  # a live message re-created it meanwhile: keep it
                header = {"c": "oof", "t": key[0], "sub_id": self.sub_id, "k": key[1]}
                header["reason"] = why
                self._give(Message(header, b""), connection)
        self.resynced += len(found.updates) + len(gone)
        if found.updates or found.gone:
            log.info(
                "HA client %r: sow_and_subscribe %s on %r: %d record(s) changed and %d "
                "gone while the client was away, handed over",
                self._ha.name,
                self.sub_id,
                self.topic,
                len(found.updates),
                len(found.gone),
            )
        if not self._whole and self.top_n is None:
            self._whole = True
            self.snapshot_done.set()

    async def _why_gone(self, client: Client, gone: list[Key]) -> dict[Key, str]:
        """Why each record left: ``match`` when the topic still has it (it no longer
        matches the filter), ``deleted`` when it has not (deleted or expired)."""
        if self.filter is None:
            return {}
        found: dict[Key, str] = {}
        by_topic: dict[str, list[str]] = {}
        for topic, key in gone:
            by_topic.setdefault(topic, []).append(key)
        for topic, keys in by_topic.items():
            with contextlib.suppress(CommandError):
                for record in await client.sow(topic, sow_keys=keys, timeout=RECONCILE_TIMEOUT):
                    found[(topic, record.key)] = "match"
        return found

    def _as_message(self, record: SowRecord) -> Message:
        """A record of the reconciliation query as an update message."""
        header: dict[str, Any] = {"c": "publish", "t": record.topic, "sub_id": self.sub_id}
        header["k"] = record.key
        if record.bookmark:
            header["bm"] = record.bookmark
        if record.correlation_id:
            header["x"] = record.correlation_id
        if record.timestamp:
            header["ts"] = record.timestamp
        return Message(header, record.data)

    def _give(self, message: Message, connection: int, *, possible_duplicate: bool = False) -> None:
        self._hand_over(
            HAMessage(message.header, message.data, self, possible_duplicate, connection)
        )

    def _give_all(self, messages: list[Message], connection: int) -> None:
        for message in messages:
            self._give(message, connection)
