"""Incoming replication: accept an upstream on the amps-replication transport, tell it
how far this journal holds its stream, store what it sends, acknowledge after commit.

An upstream is authenticated like a client: the ``user_id``/``pw`` of its hello go to
the replication transport's Authentication module (``Transport/Authentication``, else
the instance's; the default module accepts anyone, with or without credentials), and
the Entitlement module must then grant that user ``replication_logon``. Refusals carry
the reasons ``auth failure`` and ``not entitled``; the password is never logged.

A hello whose fields have the wrong types is refused with reason ``malformed hello``
(the detail names the field); nothing else of the peer is looked at. Frames are
limited to the handshake size until the hello has passed every check.

Records are stored as received (after their CRC check). One that makes its publisher's
seq jump more than ``SequenceGapThreshold`` above what this instance holds for that
publisher is logged loudly (``15-0011``) and counted (``sequence_gaps``), not refused:
see "Replication trust" in docs/GUARANTEES.md.

When the hello offers the resync exchange (its ``holdings``), the welcome answers with
what this journal holds of each origin the upstream named (:func:`.exchange.report`),
so that an upstream without a usable cursor for this instance sends only what it
lacks. The answer is read from the journal's holdings index on a worker thread.
"""

from __future__ import annotations

import functools
import logging
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final, Protocol

import trio

from amps_py import events, offload, reasons
from amps_py.auth_backoff import MAX_USER_CHARS, shown_user
from amps_py.config import DEFAULT_SEQUENCE_GAP_THRESHOLD, TransportConfig
from amps_py.trio_util import unwrapping_groups
from txlog import CorruptRecord, Record, ReplicaReader

from .exchange import MAX_BUCKETS, MAX_ORIGINS, report
from .host import ReplicationHost
from .link import Data, DownstreamLink, HeldOrigin, Hello, LinkError, Refused
from .mux import RoleStream, SharedConnection
from .validation import TopicDescriptor, describe, validate

log = logging.getLogger("amps_py.replication.incoming")

HELLO_TIMEOUT: Final = 10.0
#: heartbeat interval of the receiving end
HEARTBEAT_INTERVAL: Final = 1.0
#: link errors that mean the hello itself is refused (logged as a refusal)
_HELLO_REFUSALS: Final = frozenset({reasons.MALFORMED_HELLO, reasons.PROTOCOL_VERSION})
#: link errors after which the peer is told why before the connection closes
_TOLD_REASONS: Final = frozenset(
    {
        reasons.NOT_A_REPLICATION_PEER,
        reasons.PROTOCOL_VIOLATION,
        reasons.BAD_DATA,
        reasons.DATA_TOO_LARGE,
        reasons.FRAME_TOO_LARGE,
    }
)
#: at most one sequence-gap warning per upstream connection in this many seconds
#: (the rest are counted and summed up in the next one)
GAP_LOG_INTERVAL: Final = 1.0


@dataclass(frozen=True)
class UpstreamStatistics:
    name: str
    group: str
    address: str
    connected: bool
    messages_in: int
    duplicates: int
    bytes_in: int
    cursor_txid: int
    #: records whose publisher seq jumped more than SequenceGapThreshold (15-0011)
    sequence_gaps: int = 0


class SequenceGapWatch:
    """Notices replicated records whose publisher seq is far above anything this
    instance holds for that publisher (pure: the journal lookup is passed in).

    Args:
        threshold: report a record more than this many above the publisher's highest
            seq; 0 reports nothing.
        held: the highest seq this instance holds for a publisher hash (the journal's
            publisher index: published here or replicated in, from any upstream).

    The highest seq seen from this upstream is remembered per publisher (records still
    waiting for their commit count too); a suspected jump is checked against the
    journal again before it is reported, so publishes that reached this instance
    meanwhile are no false alarm.
    """

    #: publishers remembered at most (then forgotten and looked up again)
    MAX_TRACKED: Final = 65_536

    def __init__(self, threshold: int, held: Callable[[int], int]) -> None:
        self.threshold = threshold
        self._held = held
        self._high: dict[int, int] = {}

    def check(self, pub_hash: int, seq: int) -> int | None:
        """The publisher's previous highest seq if ``seq`` is more than the threshold
        above it, else ``None``. Either way ``seq`` now counts as held."""
        threshold = self.threshold
        if not threshold:
            return None
        high = self._high.get(pub_hash)
        if high is not None and seq <= high + threshold:  # the usual case: in step
            if seq > high:
                self._high[pub_hash] = seq
            return None
        if high is None:
            if len(self._high) >= self.MAX_TRACKED:
                self._high.clear()
            high = self._held(pub_hash)
        else:  # a suspected jump: did this publisher reach the journal meanwhile?
            high = max(high, self._held(pub_hash))
        self._high[pub_hash] = max(high, seq)
        return high if seq - high > threshold else None


class UpstreamRegistry(Protocol):
    """Where accepted upstream connections are recorded (the instance's
    :class:`~.manager.ReplicationManager`)."""

    def upstream_connected(self, conn: UpstreamConnection) -> None:
        """``conn`` passed its hello checks (before its welcome is sent)."""
        ...

    def upstream_disconnected(self, conn: UpstreamConnection) -> None:
        """``conn``, once connected, ended."""
        ...

    def keeps_own_link(self, peer_name: str) -> bool:
        """Whether the tie rule keeps this instance's connection to ``peer_name`` over
        the one the peer opened."""
        ...


class UpstreamHost(ReplicationHost, Protocol):
    """The instance as upstream connections use it: :class:`.host.ReplicationHost` and
    its replication manager (``None`` until it has one)."""

    @property
    def replication(self) -> UpstreamRegistry | None: ...


@functools.lru_cache(maxsize=4096)
def _passes(path: tuple[tuple[str, str], ...], name: str) -> bool:
    """Whether instance ``name`` is on ``path`` (cached: paths repeat)."""
    return any(hop == name for hop, _ in path)


class UpstreamConnection:
    """One accepted connection from an upstream instance."""

    def __init__(
        self,
        instance: UpstreamHost,
        stream: RoleStream,
        peer: str,
        shared: SharedConnection | None = None,
    ) -> None:
        self.instance = instance
        self.stream = stream
        self.peer = peer
        #: the connection this stream arrives on, when the peer opened it to this
        #: instance (it may carry a destination's stream back: back replication)
        self.shared = shared
        #: the upstream offered to take this instance's stream back over its connection
        self.back_offered = False
        self.name = ""
        self.group = ""
        self.messages_in = 0
        self.duplicates = 0
        self.cursor_txid = 0
        self.sequence_gaps = 0
        self._gaps_unlogged = 0
        self._gap_logged_at = -math.inf
        self._link: DownstreamLink | None = None
        self._acked = 0
        self._pending_ack = 0
        self._ack_wanted = trio.Event()
        self._cancel: trio.CancelScope | None = None
        self._send_lock = trio.Lock()

    async def _send(self, data: bytes) -> None:
        async with self._send_lock:
            await self.stream.send_all(data)

    def close(self) -> None:
        if self._cancel is not None:
            self._cancel.cancel()

    async def run(self) -> None:
        now = trio.current_time
        link = self._link = DownstreamLink(now(), HEARTBEAT_INTERVAL)
        try:
            hello, refusal = await self._receive_hello(link)
            writer = self.instance.writer
            if refusal is None and writer is not None and writer.failure:
                refusal = (reasons.JOURNAL_UNAVAILABLE, writer.failure)
            if refusal is not None or hello is None:
                reason, detail = refusal or (reasons.REFUSED, "")
                # (an auth failure was logged by the auth gate: at most a few lines per
                # address and 10 s, however many hellos fail)
                if reason != reasons.AUTH_FAILURE:
                    log.error(
                        "refused replication from %s (%s): %s — %s",
                        hello.name if hello is not None else "an unidentified peer",
                        self.peer,
                        reason,
                        detail,
                        extra=events.extra(events.REPLICATION_REFUSED),
                    )
                with trio.move_on_after(1):
                    await self.stream.send_all(link.refuse(reason, detail, now()))
                return
            # a peer that passed every check may send full-size data frames
            self.stream.handshake_done()
            self.name, self.group = hello.name, hello.group
            self.back_offered = hello.back
            journal = self.instance.journal
            assert journal is not None
            cursor = journal.upstream_cursor(hello.name)
            self.cursor_txid = cursor[0]
            self._acked = cursor[0]
            manager = self.instance.replication
            assert manager is not None
            manager.upstream_connected(self)
            holdings = await self._holdings_report(hello)
            await self.stream.send_all(
                link.welcome(
                    name=self.instance.name,
                    group=self.instance.group,
                    cursor=cursor,
                    now=now(),
                    holdings=holdings,
                )
            )
            log.info(
                "replication from %s (group %s, %s, %s) accepted; holding its stream up to "
                "txid %d%s",
                hello.name,
                hello.group,
                self.peer,
                hello.sync,
                cursor[0],
                ""
                if holdings is None
                else f"; told it what is held here of {len(holdings)} of the origins it holds",
                extra=events.extra(events.REPLICATION_CONNECTED),
            )
            async with (
                unwrapping_groups((LinkError, trio.BrokenResourceError, trio.ClosedResourceError)),
                trio.open_nursery() as nursery,
            ):
                self._cancel = nursery.cancel_scope
                nursery.start_soon(self._ack_loop, link)
                nursery.start_soon(self._heartbeat_loop, link)
                await self._receive_loop(link)
                nursery.cancel_scope.cancel()
        except LinkError as exc:
            await self._link_failed(exc, link)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass
        finally:
            if self.name and self.instance.replication is not None:
                self.instance.replication.upstream_disconnected(self)
            with trio.CancelScope(shield=True):
                await self.stream.aclose()

    async def _link_failed(self, exc: LinkError, link: DownstreamLink) -> None:
        """The link ended with ``exc``: log it (at info when the peer closed this
        connection as the tie rule wants), and tell the peer why when it should know."""
        manager = self.instance.replication
        if (
            exc.reason == reasons.CLOSED
            and self.shared is not None
            and self.back_offered
            and manager is not None
            and manager.keeps_own_link(self.name)
        ):
            # the peer took its stream back over this instance's own connection
            # (the tie rule) and closed the one it had opened: no fault (a peer that
            # went away also ends this instance's connection, logged there)
            log.info(
                "replication from %s (%s) ended: the peer closed this connection, "
                "as the tie rule wants once this instance's own connection reaches it",
                self.name,
                self.peer,
                extra=events.extra(events.REPLICATION_DISCONNECTED),
            )
        else:
            log.warning(
                "replication from %s (%s) ended: %s",
                self.name or "?",
                self.peer,
                exc,
                extra=events.extra(events.REPLICATION_LINK_ERROR),
            )
        if exc.reason in _TOLD_REASONS:
            with trio.move_on_after(1):
                refusal = link.refuse(exc.reason, exc.detail, trio.current_time())
                await self.stream.send_all(refusal)

    async def _holdings_report(self, hello: Hello) -> dict[str, HeldOrigin] | None:
        """The welcome's answer to the hello's resync exchange: None when the hello
        does not offer it (an older upstream) or this journal keeps no holdings (then
        the upstream resyncs as it always did)."""
        journal = self.instance.journal
        asked = hello.holdings
        if asked is None or journal is None or not journal.holdings_valid:
            return None

        def read() -> dict[str, HeldOrigin] | None:
            mine = journal.holdings(list(asked)[:MAX_ORIGINS], MAX_BUCKETS)
            return None if mine is None else report(asked, mine)

        try:
            return await offload.run_sync(read)
        except CorruptRecord as exc:  # a damaged holdings index: answer nothing
            log.warning(
                "replication from %s: what this journal holds cannot be read (%s); it "
                "resends everything it replicates here",
                hello.name,
                exc,
                extra=events.extra(events.REPLICATION_HOLE),
            )
            return None

    async def _receive_hello(
        self, link: DownstreamLink
    ) -> tuple[Hello | None, tuple[str, str] | None]:
        """The peer's hello and why it is refused (``None``: accepted); ``(None, why)``
        for a hello too malformed to read.

        Raises:
            LinkError: no hello at all (the peer closed, sent something else, or
                nothing within :data:`HELLO_TIMEOUT`).
        """
        try:
            hello = await self._await_hello(link)
        except LinkError as exc:
            if exc.reason not in _HELLO_REFUSALS:
                raise
            return None, (exc.reason, exc.detail)
        return hello, await self._check_hello(hello)

    async def _await_hello(self, link: DownstreamLink) -> Hello:
        with trio.move_on_after(HELLO_TIMEOUT):
            while True:
                frames = await self.stream.receive_frames()
                if not frames:
                    raise LinkError(
                        reasons.CLOSED, "the peer closed the connection before its hello"
                    )
                for event in link.receive_frames(frames, trio.current_time()):
                    if isinstance(event, Hello):
                        return event
                    if isinstance(event, Refused):
                        raise LinkError(event.reason, event.detail)
        raise LinkError(reasons.NO_HELLO, f"nothing valid received within {HELLO_TIMEOUT:g} s")

    async def _check_hello(self, hello: Hello) -> tuple[str, str] | None:
        """Why ``hello`` (well-formed, of this protocol version) is refused, if it is."""
        refusal = await self._check_credentials(hello)
        if refusal is not None:
            return refusal
        if hello.name == self.instance.name:
            return (
                reasons.REPLICATES_TO_ITSELF,
                f"an instance named {hello.name!r} connected to itself; fix its "
                "Destination/Transport/InetAddr",
            )
        own_group = self.instance.group
        if hello.expected_group and hello.expected_group != own_group:
            return (
                reasons.GROUP_MISMATCH,
                f"{hello.name}'s destination {hello.destination} expects Group "
                f"{hello.expected_group!r} but this instance ({self.instance.name}) is in Group "
                f"{own_group!r}; fix Destination/Group in {hello.name}'s config or the Group here",
            )
        failures = validate(
            [TopicDescriptor.from_wire(t) for t in hello.topics],
            self.instance.config,
            hello.name,
            hello.group,
        )
        for failure in failures:
            log.error(
                "replication from %s fails validation: %s",
                hello.name,
                failure,
                extra=events.extra(events.REPLICATION_VALIDATION_FAILED),
            )
        if failures:
            return (reasons.VALIDATION_FAILED, describe(failures))
        return None

    async def _check_credentials(self, hello: Hello) -> tuple[str, str] | None:
        """Authenticate the upstream (through the instance's auth gate: off the event
        loop, backed off after failures, the failure logged there, naming the
        replication transport and the module) and check its ``replication_logon``
        entitlement, with the replication transport's own modules, else the
        instance's. A refusal names the transport, the module and where it is set."""
        instance = self.instance
        user = hello.user_id
        shown = shown_user(user) if user else "(no credentials sent)"
        transport = instance.config.replication_transport
        listener = f"replication transport {transport.name!r}" if transport else "replication"
        authenticator = instance.replication_authenticator
        verdict = await instance.auth_gate.check(
            authenticator,
            user,
            hello.pw,
            self.peer,
            f"replication hello of upstream {hello.name[:MAX_USER_CHARS]} on {listener}",
            events.REPLICATION_AUTH_FAILED,
        )
        if verdict.backed_off is not None:
            return (reasons.AUTH_FAILURE, verdict.refusal)
        if not verdict.ok:
            return (
                reasons.AUTH_FAILURE,
                f"upstream {hello.name} failed to authenticate as user {shown} on "
                f"{instance.name}'s {listener} with the {authenticator.module} module "
                f"({_set_where(transport, 'Authentication')}); fix the user and password of "
                f"the Authenticator in {hello.name}'s Destination/Transport, or add the "
                "user here with `amps-py users add FILE USER`",
            )
        entitler = instance.replication_entitler
        if not entitler.can_replicate(user):
            # (logged with the refusal by run())
            return (
                reasons.NOT_ENTITLED,
                f"user {shown} of upstream {hello.name} may not replicate to "
                f"{instance.name} over its {listener} (no replication_logon under the "
                f"{entitler.module} module, {_set_where(transport, 'Entitlement')}); grant "
                'it "replication_logon": true in the rules file',
            )
        return None

    async def _receive_loop(self, link: DownstreamLink) -> None:
        writer = self.instance.writer
        assert writer is not None
        own = self.instance.name
        replica = ReplicaReader((self.name, self.group))
        journal = self.instance.journal
        assert journal is not None
        transport = self.instance.config.replication_transport
        watch = SequenceGapWatch(
            transport.sequence_gap_threshold if transport else DEFAULT_SEQUENCE_GAP_THRESHOLD,
            journal.publisher_last_seq,
        )
        # a failed commit drops what was queued: positions acknowledged on this
        # connection after that would skip records, so the connection starts over
        failures = writer.failed_commits
        while True:
            frames = await self.stream.receive_frames()
            if not frames:
                raise LinkError(reasons.CLOSED, "the upstream closed the connection")
            for event in link.receive_frames(frames, trio.current_time()):
                if isinstance(event, Refused):
                    raise LinkError(event.reason, event.detail)
                if not isinstance(event, Data):
                    continue
                if writer.failed_commits != failures:
                    raise LinkError(
                        reasons.JOURNAL_UNAVAILABLE,
                        "this instance's journal commit failed; the upstream resends "
                        "after it reconnects",
                    )
                records: list[Record] = []
                for raw in event.records:
                    try:
                        rec = replica(raw)
                    except CorruptRecord as exc:
                        raise LinkError(
                            reasons.BAD_DATA,
                            f"a received record cannot be stored: {exc.problem} (damaged in "
                            "transit, or not sent by an amps-py instance)",
                        ) from None
                    if rec.origin == own or _passes(rec.path, own):
                        self.duplicates += 1  # came back around a loop: never store twice
                        continue
                    previous = watch.check(rec.pub_hash, rec.seq)
                    if previous is not None:
                        self._sequence_gap(rec, previous, watch.threshold)
                    records.append(rec)
                self.messages_in += len(records)
                upto = event.upto
                self.instance.note_replicated(records)
                writer.submit_replicated(
                    records,
                    self.name,
                    (upto, event.upto_bm),
                    functools.partial(self._durable, upto),
                )

    def _sequence_gap(self, rec: Record, previous: int, threshold: int) -> None:
        """Count a record whose seq jumps far above its publisher's; log it (at most
        one line per :data:`GAP_LOG_INTERVAL`, with the count of the others)."""
        self.sequence_gaps += 1
        now = trio.current_time()
        if now - self._gap_logged_at < GAP_LOG_INTERVAL:
            self._gaps_unlogged += 1
            return
        others = self._gaps_unlogged
        self._gap_logged_at, self._gaps_unlogged = now, 0
        log.warning(
            "replication from %s (%s): publisher %r seq %d is %d above the highest seq this "
            "instance held for it (%d), more than SequenceGapThreshold %d; stored. A trusted "
            "peer does this after routing filters or journal removal skipped that "
            "publisher's messages; from an untrusted peer it may be a forged record that "
            "makes the publisher's next messages look like duplicates: require "
            "authentication on the replication transport%s",
            self.name,
            self.peer,
            rec.client_name,
            rec.seq,
            rec.seq - previous,
            previous,
            threshold,
            f" ({others} more such records since the last report)" if others else "",
            extra=events.extra(events.REPLICATION_SEQUENCE_GAP),
        )

    def _durable(self, upto: int) -> None:
        if upto > self._pending_ack:
            self._pending_ack = upto
            self.cursor_txid = upto
            self._ack_wanted.set()

    async def _ack_loop(self, link: DownstreamLink) -> None:
        while True:
            await self._ack_wanted.wait()
            self._ack_wanted = trio.Event()
            if self._pending_ack > self._acked:
                self._acked = self._pending_ack
                await self._send(link.ack(self._acked, trio.current_time()))

    async def _heartbeat_loop(self, link: DownstreamLink) -> None:
        while True:
            await trio.sleep_until(link.next_deadline())
            data = link.handle_timer(trio.current_time())
            if data:
                await self._send(data)

    def statistics(self) -> UpstreamStatistics:
        return UpstreamStatistics(
            name=self.name,
            group=self.group,
            address=self.peer,
            connected=True,
            messages_in=self.messages_in,
            duplicates=self.duplicates,
            bytes_in=self.stream.bytes_in,
            cursor_txid=self.cursor_txid,
            sequence_gaps=self.sequence_gaps,
        )


def _set_where(transport: TransportConfig | None, element: str) -> str:
    """Where the module deciding for the replication transport is configured: its own
    ``element`` (``Authentication`` or ``Entitlement``), else the instance's."""
    own = (
        None
        if transport is None
        else transport.authentication
        if element == "Authentication"
        else transport.entitlement
    )
    if transport is not None and own is not None:
        return f"the {element} of transport {transport.name!r}"
    return f"AMPSConfig/{element}, used as the replication transport has no {element} of its own"
