"""State of the World queries of the trio client: :meth:`Client.sow`,
:meth:`Client.sow_and_subscribe` and :meth:`Client.sow_delete`, with what they return
(:class:`SowResult`, :class:`SowSubscription`).

The API functions take a :class:`SowClient` (the narrow interface they need; the
:class:`~amps_py.client.client.Client` is one) as their first argument; ``Client``
calls them from its methods of the same names (``client.sow(...)``), so they are
called through the client, never directly. The reader task of the client hands the
``sow`` result frames and ``group_end`` of a query to :func:`deliver_batch` and
:func:`end_snapshot`.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import AsyncIterator, Iterable
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any, Final, Protocol

import trio

from amps_py.protocol import Frame, ProtocolError, SowRecord, split_sow_batch

from .subscription import AMPSError, Message, Subscription, SubscriptionClient

if TYPE_CHECKING:
    from collections.abc import Collection
    from contextlib import AbstractAsyncContextManager

#: the counters a ``stats`` ack may carry (sow family and sow_delete)
STATS_FIELDS: Final = frozenset(
    {
        "records_returned",
        "records_deleted",
        "records_inserted",
        "records_updated",
        "topic_matches",
        "matches",
    }
)
#: the largest ``batch_size`` the server accepts for a query (AMPS refuses larger)
MAX_BATCH_SIZE: Final = 10_000


class SowResult(list[SowRecord]):
    """The records a :meth:`Client.sow` query returned, in the order the server sent
    them, with the server's ``stats`` ack counters in :attr:`stats`
    (``records_returned``, ``topic_matches``, ``matches``)."""

    def __init__(self, records: Iterable[SowRecord], stats: dict[str, int]) -> None:
        super().__init__(records)
        self.stats = stats


def _stats_of(ack: dict[str, Any]) -> dict[str, int]:
    """The integer counters of a ``stats`` ack."""
    found: dict[str, int] = {}
    for name in STATS_FIELDS.intersection(ack):
        with contextlib.suppress(TypeError, ValueError):
            found[name] = int(ack[name])
    return found


class _SowQuery:
    """The results of one :meth:`Client.sow` while they arrive."""

    def __init__(self) -> None:
        self.records: list[SowRecord] = []
        self.ended = False
        self.error: ProtocolError | None = None


class SowClient(SubscriptionClient, Protocol):
    """What the query functions here need of a client (:class:`~amps_py.client.Client`
    has it): fresh ids, commands awaited for their acks, best-effort sends, the running
    queries, subscriptions registered for their routing."""

    closed: BaseException | None
    _queries: dict[str, _SowQuery]

    def next_id(self) -> int: ...

    async def command(
        self,
        header: dict[str, Any],
        payload: bytes = b"",
        *,
        wait: int | Collection[str] = 1,
        timeout: float = 30,
    ) -> list[dict[str, Any]]: ...

    async def _send(self, header: dict[str, Any], payload: bytes = b"") -> None: ...

    def _subscribed(
        self, sub: Subscription, header: dict[str, Any], timeout: float
    ) -> AbstractAsyncContextManager[None]: ...


class SowSubscription(Subscription):
    """A ``sow_and_subscribe``: iterating it yields the snapshot records first
    (``message.snapshot`` is true, ``message.command == "sow"``), then the live
    messages (``publish``, and ``oof`` when the subscription asked for option ``oof``).

    ``snapshot_done`` is set at the server's ``group_end`` (every snapshot record has
    arrived); ``snapshot_size`` counts the snapshot records; ``completed`` (from the
    base class) is set by the ``completed`` ack, after which ``replayed`` is the
    snapshot's size; ``stats`` holds the ``stats`` ack's counters once it came.
    """

    def __init__(
        self,
        client: SubscriptionClient,
        sub_id: str,
        buffer: float,
        markers: bool = False,
        topic: str = "",
    ) -> None:
        super().__init__(client, sub_id, buffer, markers)
        self.topic = topic
        self.snapshot_done = trio.Event()
        self.snapshot_size = 0
        self.stats: dict[str, int] = {}


def deliver_batch(target: _SowQuery | SowSubscription, frame: Frame) -> None:
    """Hand the records of a ``sow`` result frame to a running :func:`sow` query, or
    as snapshot messages to a ``sow_and_subscribe``; a damaged frame fails the query
    (:attr:`_SowQuery.error`) or ends the subscription (its ``failure``)."""
    try:
        records = split_sow_batch(frame)
    except ProtocolError as exc:
        if isinstance(target, _SowQuery):
            target.error = target.error or exc
        else:
            target.failure = {"reason": exc.reason, "detail": str(exc)}
            target._send.close()
        return
    if isinstance(target, _SowQuery):
        target.records.extend(records)
        return
    head = {"c": "sow", "sub_id": target.sub_id}
    if "query_id" in frame.header:
        head["query_id"] = frame.header["query_id"]
    for record in records:
        header = {**head, "t": record.topic, "k": record.key}
        if record.correlation_id:
            header["x"] = record.correlation_id
        if record.bookmark:
            header["bm"] = record.bookmark
        if record.timestamp:
            header["ts"] = record.timestamp
        target.snapshot_size += 1
        target._put(Message(header, record.data))


def end_snapshot(target: _SowQuery | SowSubscription) -> None:
    """The server's ``group_end`` for a query: every result record has arrived."""
    if isinstance(target, _SowQuery):
        target.ended = True
    else:
        target.snapshot_done.set()
        target._mark({"c": "group_end", "t": target.topic})


async def sow(
    client: SowClient,
    topic: str,
    filter: str | None = None,
    *,
    top_n: int | None = None,
    orderby: str | None = None,
    skip_n: int | None = None,
    batch_size: int = 10,
    sow_keys: str | Iterable[str] | None = None,
    options: str | None = None,
    timeout: float = 60,
) -> SowResult:
    """Query the State of the World of ``topic`` (a SOW topic, or a regex of them).

    Args:
        filter: content filter the records must match, e.g. ``"/qty > 10"``.
        top_n: return at most this many records.
        orderby: sort order, e.g. ``"/qty DESC, /id"`` (unordered without it).
        skip_n: skip this many records first (pagination; with ``orderby``).
        batch_size: records per result frame (1..10000; bigger batches cost fewer
            frames, more server memory per frame).
        sow_keys: only the records with these SOW keys (a list, or a comma list).
        options: further query options (``o``).
        timeout: seconds allowed for the whole result.

    Returns:
        The records in the order the server sent them (``orderby``'s order when
        given); ``.stats`` holds the server's counts (``records_returned``,
        ``topic_matches``, ``matches``).

    Raises:
        CommandError: the server refused the query (``reason`` e.g. ``invalid
            topic`` for a topic without a SOW, ``bad filter``).
        AMPSError: the server sent damaged results.
        TimeoutError: the results did not all come within ``timeout``; the
            server is asked to stop the query.
        ValueError: ``batch_size`` is out of range.
    """
    header = query_header("sow", topic, filter, top_n, orderby, skip_n, batch_size)
    query_id = f"q{client.next_id()}"
    header["query_id"] = query_id
    header["a"] = "processed,completed,stats"
    if sow_keys is not None:
        header["sow_keys"] = _comma_list(sow_keys)
    _add_options(header, options)
    query = _SowQuery()
    client._queries[query_id] = query
    try:
        acks = await client.command(header, wait=("completed", "stats"), timeout=timeout)
    except (TimeoutError, trio.Cancelled):
        if client.closed is None:
            await stop_query(client, query_id)
        raise
    finally:
        client._queries.pop(query_id, None)
    if query.error is not None:
        raise AMPSError(f"sow {topic}: the server sent a damaged result batch ({query.error})")
    if not query.ended:
        raise AMPSError(
            f"sow {topic}: the server acknowledged the query as completed before its "
            "group_end; the results may be incomplete"
        )
    stats = next((_stats_of(a) for a in acks if a.get("a") == "stats"), {})
    return SowResult(query.records, stats)


async def stop_query(client: SowClient, query_id: str) -> None:
    """Ask the server to stop sending a query's results (best effort)."""
    with (
        trio.CancelScope(shield=True),
        trio.move_on_after(5),
        contextlib.suppress(AMPSError, trio.BrokenResourceError, trio.ClosedResourceError),
    ):
        await client._send({"c": "unsubscribe", "query_id": query_id})


def query_header(
    command: str,
    topic: str,
    filter: str | None,
    top_n: int | None,
    orderby: str | None,
    skip_n: int | None,
    batch_size: int,
) -> dict[str, Any]:
    """The header of a ``sow`` or ``sow_and_subscribe`` query (without ``cid``,
    ``query_id`` or acks).

    Raises:
        ValueError: ``batch_size``, ``top_n`` or ``skip_n`` is out of range.
    """
    if not 1 <= batch_size <= MAX_BATCH_SIZE:
        raise ValueError(f"batch_size must be between 1 and {MAX_BATCH_SIZE}, got {batch_size}")
    if top_n is not None and top_n < 0:
        raise ValueError(f"top_n must be 0 or more, got {top_n}")
    if skip_n is not None and skip_n < 0:
        raise ValueError(f"skip_n must be 0 or more, got {skip_n}")
    header: dict[str, Any] = {"c": command, "t": topic, "bs": batch_size}
    if filter:
        header["f"] = filter
    if top_n is not None:
        header["top_n"] = top_n
    if orderby:
        header["orderby"] = orderby
    if skip_n:
        header["o"] = f"skip_n={skip_n}"
    return header


@asynccontextmanager
async def sow_and_subscribe(
    client: SowClient,
    topic: str,
    filter: str | None = None,
    *,
    options: str | None = None,
    top_n: int | None = None,
    orderby: str | None = None,
    batch_size: int = 10,
    sow_keys: str | Iterable[str] | None = None,
    sub_id: str | None = None,
    buffer: float = math.inf,
    timeout: float = 30,
    markers: bool = False,
) -> AsyncIterator[SowSubscription]:
    """Query ``topic`` and subscribe to it in one atomic step: no update is lost
    or duplicated between the snapshot and the live stream.

    Iterate the :class:`SowSubscription` for the snapshot records
    (``message.snapshot``), then live publishes, then (with option ``oof``) ``oof``
    messages for records that left it. The context manager waits for the server's
    processed ack, so a refused query (``invalid topic``, ``bad filter``) raises
    :class:`CommandError` here; leaving it unsubscribes.

    Args: as :meth:`Client.sow` and :meth:`Client.subscribe` (``options``: e.g.
    ``"oof"``; ``markers``: see :class:`Subscription`).
    """
    header = query_header("sow_and_subscribe", topic, filter, top_n, orderby, None, batch_size)
    sid = sub_id or f"s{client.next_id()}"
    header["sub_id"] = sid
    header["query_id"] = sid
    header["a"] = "processed,completed,stats"
    if sow_keys is not None:
        header["sow_keys"] = _comma_list(sow_keys)
    _add_options(header, options)
    sub = SowSubscription(client, sid, buffer, markers, topic)
    async with client._subscribed(sub, header, timeout):
        yield sub


async def sow_delete(
    client: SowClient,
    topic: str,
    *,
    filter: str | None = None,
    keys: str | Iterable[str] | None = None,
    data: bytes | str | None = None,
    timeout: float = 30,
) -> dict[str, int]:
    """Delete records of the SOW topic ``topic``, selected by exactly one of:
    ``filter`` (a content filter; ``"1=1"`` deletes every record), ``keys`` (SOW
    keys, a list or a comma list) or ``data`` (a message whose key fields name
    the record, as if it were published).

    Returns:
        The server's ``stats`` counts: ``records_deleted``, ``matches``,
        ``topic_matches``. Subscribers with option ``oof`` get an ``oof``
        (``deleted``) for each deleted record.

    Raises:
        ValueError: not exactly one selector was given.
        CommandError: the server refused it (e.g. ``invalid topic``: no SOW).
        TimeoutError: no stats ack within ``timeout`` seconds.
    """
    given = [
        name
        for name, value in (("filter", filter), ("keys", keys), ("data", data))
        if value is not None
    ]
    if len(given) != 1:
        got = ", ".join(f"{name}=" for name in given) or "none"
        raise ValueError(
            "sow_delete needs exactly one of filter=, keys= or data= (got "
            f"{got}); filter='1=1' deletes every record"
        )
    header: dict[str, Any] = {"c": "sow_delete", "t": topic, "a": "processed,stats"}
    header["query_id"] = f"q{client.next_id()}"
    payload = b""
    if filter is not None:
        header["f"] = filter
    elif keys is not None:
        header["sow_keys"] = _comma_list(keys)
    elif data is not None:
        payload = data.encode() if isinstance(data, str) else data
    acks = await client.command(header, payload, wait=("processed", "stats"), timeout=timeout)
    return next((_stats_of(a) for a in acks if a.get("a") == "stats"), {})


def _comma_list(values: str | Iterable[str]) -> str:
    return values if isinstance(values, str) else ",".join(values)


def _add_options(header: dict[str, Any], options: str | None) -> None:
    """Append ``options`` to the header's ``o`` (which may already hold ``skip_n``)."""
    if options:
        header["o"] = f"{header['o']},{options}" if header.get("o") else options
