"""The SOW commands of a session: ``sow``, ``sow_and_subscribe`` and ``sow_delete``.

A query reads one point-in-time snapshot of each store it covers, taken in the
synchronous step that handles the command. Stores change only in that same event loop,
when commits are applied, so a snapshot holds exactly what was committed and delivered
when the command arrived. ``sow_and_subscribe`` registers its subscription in that
step too, paused like a bookmark replay at the snapshot's txid: once the snapshot is
sent, the replay machinery sends what committed meanwhile and goes live at the seam
(:func:`~amps_py.server.replay.run_replay`), so no update is lost or duplicated.

Results go out as ``group_begin``, ``sow`` batches of up to ``bs`` records,
``group_end``, then the ``completed`` and ``stats`` acks the command asked for.

A ``sow`` on a queue's name reads the messages in the queue (:class:`QueueSnapshot`)
through the same query, batching and acks; ``sow_delete`` on it acknowledges
(:func:`amps_py.server.queues.acknowledge`).

A store that cannot be read (a damaged page of its LMDB file, :class:`SowStoreError`)
fails only the command that met it: a failure ack ``sow store unreadable`` whose detail
names the store file and the fix (event ``17-0004`` in the log), the results sent
before it stand, a ``sow_and_subscribe`` ends; the connection and everything else go
on.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any, Final, Protocol

import orjson

from amps_py import events, offload, reasons
from amps_py.protocol import Frame, messages
from amps_py.protocol.server.commands import CommandFailed, ack_types, options
from amps_py.sow.expiry import is_expired
from amps_py.sow.query import parse_orderby, select
from amps_py.sow.store import SowEntry, SowStoreError
from txlog import CorruptRecord

from .option_catalogue import check_options
from .queue_commands import acknowledge
from .replay import run_replay
from .sowing import SOW_DELETE, LogicalTopic, SowSource, SowTopic
from .subscriptions import EntitledTopics, is_regex_topic

if TYPE_CHECKING:
    from .command_session import CommandSession
    from .queues import ServedQueue
    from .subscriptions import Subscription

log = logging.getLogger("amps_py.server.session")

#: AMPS refuses a larger batch size
MAX_BATCH_SIZE: Final = 10_000
#: records per sow frame when the command does not say (AMPS's default is 1)
DEFAULT_BATCH_SIZE: Final = 1


class Source(Protocol):
    """What a query reads records from: a SOW topic, or a queue; results carry its
    name as their topic."""

    @property
    def name(self) -> str: ...


def _int_option(
    header: dict[str, Any], opts: dict[str, Any], name: str, field: str | None = None
) -> int | None:
    """A whole-number setting from header ``field`` (default: ``name``) or option
    ``name``; None when neither is given."""
    raw = header.get(field or name, opts.get(name))
    if raw is None or raw == "":
        return None
    try:
        value = int(raw)
    except (TypeError, ValueError):
        value = -1
    if value < 0:
        raise CommandFailed(
            reasons.INVALID_OPTIONS, f"{name} must be a whole number of 0 or more, got {raw!r}"
        )
    return value


class Query:
    """A parsed SOW query: which topics, which records, in what order, how batched."""

    def __init__(self, session: CommandSession, header: dict[str, Any]) -> None:
        topic = header.get("t")
        if not topic or not isinstance(topic, str):
            raise CommandFailed(reasons.NO_TOPIC, "a SOW query needs a topic (t)")
        self.topic = topic
        opts = options(header)
        check_options(str(header.get("c") or "sow"), opts)
        # entitlement per concrete topic: a regex covers only the SOW topics this
        # user may read
        pattern = session.topics_to_read(topic, "non_regex_topic" in opts)
        #: a topic expression limited to the topics this user may read
        self.restricted = isinstance(pattern, EntitledTopics)
        sow = session.instance.sow
        self.topics: list[SowSource] = (
            sow.matching(pattern, topic, session.message_type) if sow else []
        )
        ftext = header.get("f")
        self.filter = session.instance.compile_filter(str(ftext)) if ftext else None
        #: reads the topics' payloads (all of the session's message type) for the filter
        self.document = session.instance.message_types[session.message_type].document
        try:
            self.orderby = parse_orderby(str(header.get("orderby") or opts.get("orderby") or ""))
        except ValueError as exc:
            raise CommandFailed(reasons.INVALID_OPTIONS, str(exc)) from None
        self.top_n = _int_option(header, opts, "top_n")
        self.skip_n = _int_option(header, opts, "skip_n")
        batch = _int_option(header, opts, "batch_size", "bs")
        self.batch_size = max(1, batch if batch is not None else DEFAULT_BATCH_SIZE)
        if self.batch_size > MAX_BATCH_SIZE:
            raise CommandFailed(
                reasons.INVALID_OPTIONS,
                f"batch size {self.batch_size} is above the largest AMPS allows ({MAX_BATCH_SIZE})",
            )
        keys = header.get("sow_keys")
        self.keys = {k for k in str(keys).split(",") if k} if keys else None
        self.query_id = str(
            header.get("query_id") or header.get("sub_id") or header.get("cid") or ""
        )
        #: now in µs, for records that expired but are not removed yet
        self.clock = sow.now_us

    def matches(self, entry: SowEntry) -> bool:
        if self.keys is not None and entry.key not in self.keys:
            return False
        return self.filter is None or bool(self.filter.matches(self.document(entry.payload)))

    @property
    def streams(self) -> bool:
        """Results go out while the snapshot is read when nothing needs the whole
        result first (no ``orderby``, ``top_n`` or ``skip_n``)."""
        return not self.orderby and self.top_n is None and not self.skip_n

    def collect(
        self, snapshots: Sequence[tuple[Source, Any]]
    ) -> tuple[list[TopicResult], int, int]:
        """The selected records of every topic (blocking: runs in a worker thread),
        how many records matched before top_n/skip_n, and how many the topics held
        (the stats ack's ``topic_matches``). A record whose expiry time has passed when
        the collection starts is left out, removed or not yet."""
        out: list[TopicResult] = []
        matched = held = 0
        now_us = self.clock()
        for sow, snapshot in snapshots:
            try:
                hits = [e for e in snapshot if not is_expired(e, now_us) and self.matches(e)]
                held += snapshot.count  # after the iteration: a topic's view counts then
            finally:
                snapshot.close()
            matched += len(hits)
            out.append((sow.name, select(hits, None, self.orderby, self.top_n, self.skip_n or 0)))
        return out, matched, held


#: one topic's records of a query result
TopicResult = tuple[str, list[SowEntry]]

#: records a worker thread reads per hop while a query streams
STREAM_CHUNK: Final = 2048


async def send_results(
    session: CommandSession,
    header: dict[str, Any],
    query: Query,
    snapshots: Sequence[tuple[Source, Any]],
    sub_id: str | None = None,
) -> int:
    """Send one query's results: group_begin, batches, group_end, and the stats ack
    when asked; returns how many records went out."""
    session.send(messages.group_begin(query.query_id))
    if query.streams:
        sent, matched, held = await _stream(session, query, snapshots, sub_id)
    else:
        results, matched, held = await offload.run_sync(query.collect, snapshots)
        sent = 0
        for topic, entries in results:
            await _send_batches(session, query, topic, entries, sub_id)
            sent += len(entries)
    session.send(messages.group_end(query.query_id))
    if "stats" in ack_types(header):
        session.ack(
            header,
            "stats",
            query_id=query.query_id,
            records_returned=sent,
            topic_matches=held,
            matches=matched,
        )
    return sent


async def _stream(
    session: CommandSession,
    query: Query,
    snapshots: Sequence[tuple[Source, Any]],
    sub_id: str | None,
) -> tuple[int, int, int]:
    """Read each snapshot in chunks in a worker thread and send what matches as it is
    found (memory stays at a chunk, the first batch leaves at once); (records sent,
    matched, held)."""
    sent = held = 0
    now_us = query.clock()
    for sow, snapshot in snapshots:
        records = iter(snapshot)
        try:
            done = False
            while not done:
                hits, done = await offload.run_sync(_read_chunk, records, query, now_us)
                await _send_batches(session, query, sow.name, hits, sub_id)
                sent += len(hits)
            held += snapshot.count  # after the iteration: a topic's view counts then
        finally:
            snapshot.close()
    return sent, sent, held


def _read_chunk(
    records: Iterator[SowEntry], query: Query, now_us: int
) -> tuple[list[SowEntry], bool]:
    """The matching, unexpired records among the next :data:`STREAM_CHUNK` (blocking:
    a worker thread reads the store), and whether the snapshot is exhausted."""
    hits: list[SowEntry] = []
    for _ in range(STREAM_CHUNK):
        entry = next(records, None)
        if entry is None:
            return hits, True
        if not is_expired(entry, now_us) and query.matches(entry):
            hits.append(entry)
    return hits, False


async def _send_batches(
    session: CommandSession, query: Query, topic: str, entries: list[SowEntry], sub_id: str | None
) -> None:
    """``entries`` as sow frames of up to the batch size, pacing on the client's
    outbox; each on ``topic``, or on its own (``SowEntry.topic``: a Pattern SOW
    topic's), a frame holding one topic's records only."""
    size = query.batch_size
    start = 0
    while start < len(entries):
        on = entries[start].topic or topic
        end = start + 1
        while end < len(entries) and end - start < size and (entries[end].topic or topic) == on:
            end += 1
        batch = entries[start:end]
        start = end
        session.send(
            messages.sow_batch(
                on,
                query.query_id,
                [(e.key, e.payload, e.correlation_id, e.bookmark, e.ts_us) for e in batch],
                sub_id=sub_id,
            )
        )
        session.messages_out += len(batch)
        await session.wait_outbox_below()


def _snapshots(session: CommandSession, query: Query) -> list[tuple[SowSource, Any]]:
    """A snapshot of each store the query covers.

    Raises:
        CommandFailed: a store cannot be read (``sow store unreadable``).
    """
    taken: list[tuple[SowSource, Any]] = []
    try:
        for sow in query.topics:
            taken.append((sow, sow.snapshot()))
    except SowStoreError as exc:
        _close_all(taken)
        raise store_unreadable(session, query.topic, exc) from None
    return taken


def no_sow_detail(session: CommandSession, topic: str, fix: str) -> str:
    """Why ``topic`` has no State of the World, and ``fix``; the Name of a Pattern SOW
    topic that its Pattern does not match says what to query instead."""
    state = session.instance.sow
    named = state.topics.get(topic) if state else None
    if named is not None and named.config.pattern is not None:
        return (
            f"{topic!r} is the Name of the SOW topic that keeps every topic matching "
            f"{named.config.pattern!r}, not a topic of its own: query a topic it holds, or "
            f"the regex topic {named.config.pattern}"
        )
    return f"topic {topic!r} has no State of the World; {fix}"


def _close_all(snapshots: Sequence[tuple[Source, Any]]) -> None:
    """End every snapshot (closing one twice does nothing)."""
    for _source, snapshot in snapshots:
        snapshot.close()


def store_unreadable(session: CommandSession, topic: str, exc: SowStoreError) -> CommandFailed:
    """Log that a command of ``session`` on ``topic`` met a SOW store it cannot read
    (``17-0004``, with the store file and the fix) and return the failure its client
    gets: ``sow store unreadable``, the same words as detail."""
    log.error(
        "SOW command on %r from client %r failed: %s",
        topic,
        session.client_name,
        exc,
        extra=events.extra(events.SOW_QUERY_FAILED),
    )
    return CommandFailed(reasons.SOW_STORE_UNREADABLE, str(exc))


def journal_unreadable(session: CommandSession, topic: str, exc: CorruptRecord) -> CommandFailed:
    """Log that a query of ``session`` on queue ``topic`` met a damaged journal record
    (``05-0003``) and return the failure its client gets: ``journal corrupt``, naming
    the txids and the fix."""
    log.error(
        "sow query on queue %r from client %r failed: %s",
        topic,
        session.client_name,
        exc,
        extra=events.extra(events.JOURNAL_CORRUPT_RECORD),
    )
    return CommandFailed(
        reasons.JOURNAL_CORRUPT,
        f"{exc}; the queue's other messages are unaffected (`amps-py txlog verify` on the "
        "journal lists the damage)",
    )


def _failed_midway(
    session: CommandSession, header: dict[str, Any], query_id: str, failure: CommandFailed
) -> None:
    """A query whose results were under way failed: its ``completed`` ack (or, when it
    asked for none, ``processed``) carries the failure, so the client never waits for
    the rest."""
    ack_type = "completed" if "completed" in ack_types(header) else "processed"
    session.ack(
        header,
        ack_type,
        "failure",
        query_id=query_id,
        reason=failure.reason,
        detail=failure.detail,
    )


class QueueSnapshot:
    """The messages in a queue (waiting or leased) when a ``sow`` query on it arrived,
    in txid order, as the records a query reads: key and bookmark are the message's
    bookmark (what a consumer acknowledges), the timestamp its publish time. Copied in
    the command's synchronous step (the queue changes in the event loop), so a worker
    thread may filter it while the queue moves on; the query removes nothing."""

    def __init__(self, queue: ServedQueue) -> None:
        self.queue = queue
        # the messages as they are now; their payloads (mostly in the journal, not in
        # memory) are read as the entries are iterated, in the worker thread
        self.messages = [
            (m.bookmark, m.txid, m.correlation_id, m.published_at, m.payload)
            for m in queue.state.messages()
        ]
        self.count = len(self.messages)

    def __iter__(self) -> Iterator[SowEntry]:
        read = self.queue.read_record
        for mark, txid, cid, published_at, payload in self.messages:
            if payload is None:
                record = read(txid) if read is not None else None
                if record is None:
                    continue  # left the queue and the journal meanwhile
                payload = record.payload
            yield SowEntry(
                key=mark,
                txid=txid,
                bookmark=mark,
                correlation_id=cid,
                ts_us=int(published_at * 1_000_000),
                payload=payload,
            )

    def close(self) -> None:
        """Nothing to release (the copy is garbage collected)."""


def on_sow(session: CommandSession, frame: Frame) -> None:
    """``sow``: query the State of the World of a topic (or of every SOW topic a regex
    topic matches), or the messages in a queue (topic = the queue's name)."""
    header = frame.header
    query = Query(session, header)
    queues = session.instance.queues
    queue = queues.get(query.topic, session.message_type) if queues is not None else None
    snapshots: Sequence[tuple[Source, Any]]
    if queue is not None:
        snapshots = [(queue, QueueSnapshot(queue))]
    elif not query.topics and query.restricted:
        # the same answer as if the SOW topics this user may not read did not exist
        raise CommandFailed(
            reasons.INVALID_TOPIC,
            f"topic expression {query.topic!r} matches no SOW topic user "
            f"{session.user_id!r} may read",
        )
    elif not query.topics:
        raise CommandFailed(
            reasons.INVALID_TOPIC,
            no_sow_detail(session, query.topic, "add a SOW/Topic for it to the config to query it"),
        )
    else:
        snapshots = _snapshots(session, query)

    async def run() -> None:
        try:
            await send_results(session, header, query, snapshots)
        except SowStoreError as exc:
            failure = store_unreadable(session, query.topic, exc)
            _failed_midway(session, header, query.query_id, failure)
            return
        except CorruptRecord as exc:  # a queue's message read from a damaged journal
            failure = journal_unreadable(session, query.topic, exc)
            _failed_midway(session, header, query.query_id, failure)
            return
        finally:
            _close_all(snapshots)
        if "completed" in ack_types(header):
            session.ack(header, "completed", query_id=query.query_id)

    if "processed" in ack_types(header):
        session.ack(header, "processed", query_id=query.query_id)
    session.start_soon(run)


def start_sow_and_subscribe(session: CommandSession, header: dict[str, Any], sub: Any) -> None:
    """``sow_and_subscribe`` on a SOW topic: the snapshot, then what committed since,
    then live (``sub`` is built, not registered)."""
    query = Query(session, header)
    instance = session.instance
    conflated = [t for t in query.topics if isinstance(t, SowTopic) and t.derived_from]
    if conflated:
        if len(conflated) < len(query.topics):
            raise CommandFailed(
                reasons.INVALID_TOPIC,
                f"topic expression {query.topic!r} matches conflated topic(s) "
                f"{', '.join(t.name for t in conflated)} and journaled SOW topics: send one "
                "sow_and_subscribe for the conflated topics and one for the others",
            )
        _start_conflated(session, header, sub, query, conflated)
        return
    snapshots = _snapshots(session, query)
    # paused at the snapshot: the registry skips it until the replay flips it live
    cursor = instance.committed_txid
    sub.live = False
    sub.delivered_upto = cursor
    session.subscriptions[sub.sub_id] = sub
    instance.registry.add(sub)

    async def run() -> None:
        if await _send_snapshot(session, header, sub, query, snapshots):
            await run_replay(session, sub, cursor, None, header.get("cid"))

    if "processed" in sub.acks:
        session.ack(header, "processed", sub_id=sub.sub_id)
    session.start_soon(run)


async def _send_snapshot(
    session: CommandSession,
    header: dict[str, Any],
    sub: Subscription,
    query: Query,
    snapshots: Sequence[tuple[Source, Any]],
) -> bool:
    """Send a ``sow_and_subscribe``'s snapshot and close its snapshots; False (the
    subscription failed, the client told) when a store could not be read."""
    try:
        await send_results(session, header, query, snapshots, sub_id=sub.sub_id)
    except SowStoreError as exc:
        failure = store_unreadable(session, query.topic, exc)
        session.subscription_failed(sub, header.get("cid"), failure.reason, failure.detail)
        return False
    finally:
        _close_all(snapshots)
    return True


def _start_conflated(
    session: CommandSession,
    header: dict[str, Any],
    sub: Subscription,
    query: Query,
    topics: list[SowTopic],
) -> None:
    """``sow_and_subscribe`` on conflated topics (not journaled, so no replay): the
    snapshot, then the interval updates held for it meanwhile, then live, all in
    order (see :mod:`amps_py.server.conflated_topics`)."""
    from .conflated_topics import ConflatedTopic, send_oofs

    instance = session.instance
    held = [t for t in topics if isinstance(t, ConflatedTopic)]
    snapshots = _snapshots(session, query)
    sub.live = False
    session.subscriptions[sub.sub_id] = sub
    instance.registry.add(sub)
    for topic in held:
        topic.hold(sub)

    async def run() -> None:
        try:
            if not await _send_snapshot(session, header, sub, query, snapshots):
                return
            if session.subscriptions.get(sub.sub_id) is not sub:
                return  # unsubscribed meanwhile
            # the seam: no await from here until it is live
            for topic in held:
                for entry, removed in topic.release(sub):
                    if removed:
                        if "oof" in sub.options:
                            send_oofs(topic, [entry], [sub])
                        continue
                    instance.delivery.fan_out(
                        topic.name,
                        entry.payload,
                        "",
                        0,
                        [sub],
                        entry.correlation_id or None,
                        entry.ts_us,
                        entry.key,
                        topic.message_type,
                    )
            sub.live = True
            instance.registry.changed()
            if "completed" in sub.acks:
                session.ack(header, "completed", sub_id=sub.sub_id)
        finally:
            for topic in held:
                topic.release(sub)

    if "processed" in sub.acks:
        session.ack(header, "processed", sub_id=sub.sub_id)
    session.start_soon(run)


def on_sow_delete(session: CommandSession, frame: Frame) -> None:
    """``sow_delete`` by filter, by ``sow_keys`` or by data: the records it selects
    are removed by one journaled delete record (replicated like a publish)."""
    header = frame.header
    topic = header.get("t")
    if not topic or not isinstance(topic, str):
        raise CommandFailed(reasons.NO_TOPIC, "sow_delete needs a topic (t)")
    opts = options(header)
    check_options("sow_delete", opts)
    queues = session.instance.queues
    queue = queues.get(topic, session.message_type) if queues else None
    session.require_entitled(
        topic, write=True, action="acknowledge on" if queue is not None else "delete from"
    )
    if queue is not None:
        session.messages_in += 1
        acknowledge(session, queue, header, frame.payload)
        return
    state = session.instance.sow
    sow = state.get(topic, session.message_type) if state else None
    if sow is None:
        raise CommandFailed(
            reasons.INVALID_TOPIC, no_sow_detail(session, topic, "sow_delete needs a SOW topic")
        )
    if isinstance(sow, LogicalTopic) and is_regex_topic(topic):
        # AMPS reads a topic with regex characters as a regex; the Pattern would take
        # it as one more literal topic name and delete nothing (journaling it anyway)
        raise CommandFailed(
            reasons.INVALID_TOPIC,
            f"sow_delete takes one topic name, and {topic!r} has regular-expression "
            f"characters (SOW topic {sow.container.name!r} holds the topics its Pattern "
            "matches): send one sow_delete per topic name (`sow` with the expression "
            "lists the records and their topics)",
        )
    if sow.derived_from is not None:
        raise CommandFailed(
            reasons.INVALID_TOPIC,
            f"{topic!r} is a conflated topic, derived from SOW topic {sow.derived_from!r}: "
            f"send the sow_delete to {sow.derived_from} (the conflated topic drops the "
            "records at its next interval)",
        )
    for name in opts:  # cancel, expire: the catalogue's, for queue acknowledgements
        raise CommandFailed(
            reasons.INVALID_OPTIONS,
            f"option {name!r} of sow_delete acknowledges queue messages; {topic!r} is a "
            "SOW topic, not a queue: send the delete without it",
        )
    acks = ack_types(header)
    try:
        held = sow.count() if "stats" in acks else 0
        keys = _delete_selection(session, sow, header, frame.payload)
    except SowStoreError as exc:
        raise store_unreadable(session, topic, exc) from None
    session.messages_in += 1
    payload = orjson.dumps({"keys": keys})
    query_id = str(header.get("query_id") or header.get("cid") or "")
    if "s" in header:
        # sequenced (a client's publish store): the delete is that publisher's message,
        # deduplicated and acknowledged as persisted like its publishes
        seq = session.publish_seq(header, acks)
        outcome = session.instance.publish(session, topic, seq, payload, header, kind=SOW_DELETE)
        if outcome == "done":
            session.persisted_progress()
        if "processed" in acks:
            session.ack(header, "processed", s=seq, query_id=query_id)
    else:
        # no seq: the delete must not take one of the publisher's (its next publish
        # would be a "duplicate"); the instance journals it under its own name
        outcome = session.instance.publish_internal(
            topic, payload, kind=SOW_DELETE, message_type=sow.message_type
        )
        if "processed" in acks:
            session.ack(header, "processed", query_id=query_id)
    if "stats" not in acks:
        return
    record = state.last_queued if outcome == "queued" else None

    async def stats_when_applied() -> None:
        # "after the command has fully completed": once the delete is committed and
        # applied, a query on this connection no longer finds the records
        instance = session.instance
        while record is not None and record.txid == 0:
            writer = instance.writer
            if writer is None or writer.failure:
                break  # the publisher gets a persisted failure ack for it
            await instance.wait_for_any_commit()
        deleted = len(keys) if record is None or record.txid else 0
        session.ack(
            header,
            "stats",
            query_id=query_id,
            records_deleted=deleted,
            topic_matches=held,
            matches=len(keys),
        )

    session.start_soon(stats_when_applied)


def _delete_selection(
    session: CommandSession, sow: SowTopic, header: dict[str, Any], payload: bytes
) -> list[str]:
    """The keys a sow_delete removes: by ``sow_keys``, by data (the key the message
    would have), or by filter (``1=1``: all)."""
    if header.get("sow_keys"):
        wanted = [k for k in str(header["sow_keys"]).split(",") if k]
        return [k for k in wanted if sow.current(k) is not None]
    if payload:
        state = session.instance.sow
        assert state is not None
        _kind, key, _payload = state.prepare(sow, header, payload, delta=False)
        return [key] if sow.current(key) is not None else []
    ftext = header.get("f")
    if not ftext:
        raise CommandFailed(
            reasons.BAD_FILTER,
            "sow_delete needs a filter (f; 1=1 removes every record), sow_keys or a message",
        )
    flt = session.instance.compile_filter(str(ftext))
    found: list[str] = []
    seen: set[str] = set()
    for key, rec in sow.queued_records():
        seen.add(key)
        if rec.kind != SOW_DELETE and flt.matches(sow.reader.document(rec.payload)):
            found.append(key)
    snapshot = sow.snapshot()
    now_us = sow.clock()
    try:
        for entry in snapshot:
            if entry.key in seen or is_expired(entry, now_us):
                continue
            if flt.matches(sow.reader.document(entry.payload)):
                found.append(entry.key)
    finally:
        snapshot.close()
    return found
