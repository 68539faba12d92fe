"""Outgoing replication: one task per Destination pushes this instance's journal.

Connects to the destination's ``InetAddr`` list in priority order with growing
back-off (reset after a successful handshake), resyncs from the cursor the downstream
reports, then streams journal records as they commit and processes acks.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

import trio

from amps_py import events
from amps_py.config import DestinationConfig
from amps_py.trio_util import unwrapping_groups

from .link import Ack, LinkError, Refused, UpstreamLink, Welcome
from .routing import Route

if TYPE_CHECKING:
    from amps_py.server.instance import Instance

log = logging.getLogger("amps_py.replication.outgoing")

#: records read from the journal per data frame
SEND_BATCH: Final = 1024
#: stop sending while this many records are sent but not acknowledged
MAX_UNACKED_RECORDS: Final = 200_000
CONNECT_TIMEOUT: Final = 5.0
HANDSHAKE_TIMEOUT: Final = 10.0


@dataclass(frozen=True)
class DestinationStatistics:
    name: str
    remote_name: str
    group: str | None
    replication_type: str
    configured_sync_type: str
    is_connected: bool
    address: str
    messages_out: int
    bytes_out: int
    raw_bytes_out: int
    sent_txid: int
    acked_txid: int
    seconds_behind: float
    disconnect_count: int
    resyncs: int
    resync_records: int
    holes: int
    pass_through: tuple[str, ...]
    last_error: str


class Destination:
    """Runtime state of one configured destination."""

    def __init__(self, instance: Instance, config: DestinationConfig) -> None:
        self.instance = instance
        self.config = config
        self.name = config.name
        self.route = Route(config)
        self.sync = config.sync
        self.remote_name = ""
        self.connected = False
        self.address = ""
        self.sent_txid = 0
        self.acked_txid = 0
        self.messages_out = 0
        self.bytes_out = 0
        self.raw_bytes_out = 0
        self.disconnect_count = 0
        self.resyncs = 0
        self.resync_records = 0
        self.holes = 0
        self.last_error = ""
        self._ack_event = trio.Event()
        self._send_lock = trio.Lock()

    async def _send(self, stream: trio.SocketStream, data: bytes) -> None:
        async with self._send_lock:
            await stream.send_all(data)

    # ---------------------------------------------------------------- lifecycle
    async def run(self) -> None:
        """Connect, stream, reconnect: forever (until cancelled)."""
        if not self.config.inet_addrs:
            log.info(
                "destination %s has no InetAddr: waiting for the peer to connect "
                "(back replication arrives with a later release)",
                self.name,
                extra=events.extra(events.REPLICATION_WAITING),
            )
            await trio.sleep_forever()
        timeouts = self.config.reconnect_timeouts or (1.0,)
        failures = 0
        while True:
            for host, port in self.config.inet_addrs:
                address = f"{host}:{port}"
                try:
                    with trio.fail_after(CONNECT_TIMEOUT):
                        stream = await trio.open_tcp_stream(host, port)
                except (OSError, trio.TooSlowError) as exc:
                    self.last_error = f"connect to {address}: {exc}"
                    log.debug("destination %s: %s", self.name, self.last_error)
                    continue
                self.address = address
                handshook = False
                try:
                    handshook = await self._session(stream)
                except LinkError as exc:
                    self.last_error = str(exc)
                    log.warning(
                        "replication to %s (%s) ended: %s",
                        self.name,
                        address,
                        exc,
                        extra=events.extra(events.REPLICATION_LINK_ERROR),
                    )
                except (
                    trio.BrokenResourceError,
                    trio.ClosedResourceError,
                    OSError,
                    trio.TooSlowError,
                ) as exc:
                    self.last_error = f"connection lost: {exc}"
                    log.info(
                        "replication to %s (%s): connection lost (%s)",
                        self.name,
                        address,
                        exc,
                        extra=events.extra(events.REPLICATION_DISCONNECTED),
                    )
                finally:
                    if self.connected:
                        self.disconnect_count += 1
                    self.connected = False
                    self.instance.replication_changed()
                    with trio.CancelScope(shield=True):
                        await stream.aclose()
                if handshook:
                    failures = 0
                    break  # start again from the first (preferred) address
            else:
                delay = timeouts[min(failures, len(timeouts) - 1)]
                failures += 1
                await trio.sleep(delay)

    async def _session(self, stream: trio.SocketStream) -> bool:
        """One connection: handshake, resync, stream. Returns True once handshook."""
        instance = self.instance
        cfg = self.config
        now = trio.current_time
        link = UpstreamLink(now(), cfg.heartbeat_interval, cfg.compression)
        await stream.send_all(
            link.hello(
                name=instance.name,
                group=instance.group,
                destination=cfg.name,
                sync=cfg.sync_type,
                topics=self.route.describe_topics(),
                now=now(),
                expected_group=cfg.group or "",
            )
        )
        welcome = await self._await_welcome(stream, link)
        if cfg.group is not None and welcome.group != cfg.group:
            detail = (
                f"destination {cfg.name} expects Group {cfg.group!r} but instance "
                f"{welcome.name!r} is in Group {welcome.group!r}; fix Destination/Group in "
                f"{instance.name}'s config or the peer's Group"
            )
            await stream.send_all(link.refuse("group mismatch", detail, now()))
            raise LinkError("group mismatch", detail)
        if welcome.name == instance.name:
            detail = "the destination is this instance itself; fix Destination/Transport/InetAddr"
            await stream.send_all(link.refuse("replicates to itself", detail, now()))
            raise LinkError("replicates to itself", detail)
        self.remote_name = welcome.name
        start = await self._resync_point(welcome)
        self.sent_txid = self.acked_txid = start
        self.connected = True
        self.resyncs += 1
        resync_end = instance.committed_txid
        log.info(
            "replication to %s (%s, instance %s, %s) connected; resuming after txid %d "
            "(local journal at %d)",
            cfg.name,
            self.address,
            welcome.name,
            "sync" if self.sync else "async",
            start,
            resync_end,
            extra=events.extra(events.REPLICATION_CONNECTED),
        )
        instance.replication_changed()
        async with unwrapping_groups(), trio.open_nursery() as nursery:
            nursery.start_soon(self._receive_loop, stream, link, nursery.cancel_scope)
            nursery.start_soon(self._heartbeat_loop, stream, link)
            await self._send_loop(stream, link, resync_end)
        return True

    async def _await_welcome(self, stream: trio.SocketStream, link: UpstreamLink) -> Welcome:
        with trio.fail_after(HANDSHAKE_TIMEOUT):
            while True:
                data = await stream.receive_some(65536)
                if not data:
                    raise LinkError("closed", "the peer closed the connection during the handshake")
                for event in link.receive_data(data, trio.current_time()):
                    if isinstance(event, Welcome):
                        return event
                    if isinstance(event, Refused):
                        what = (
                            "the peer refused validation (its log names each check)"
                            if event.reason == "validation failed"
                            else "refused by the peer"
                        )
                        log.error(
                            "replication to %s: %s: %s (%s)",
                            self.name,
                            what,
                            event.reason,
                            event.detail,
                            extra=events.extra(events.REPLICATION_REFUSED),
                        )
                        raise LinkError(event.reason, f"refused by the peer: {event.detail}")

    async def _resync_point(self, welcome: Welcome) -> int:
        """The txid after which to resend: the downstream's cursor if this journal
        still has that record with that bookmark, else 0 (resend everything)."""
        if welcome.cursor_txid <= 0:
            return 0
        journal = self.instance.journal
        assert journal is not None
        rec = journal.get(welcome.cursor_txid) if welcome.cursor_txid <= journal.last_txid else None
        if rec is None or rec.bookmark != welcome.cursor_bm:
            log.warning(
                "replication to %s: the peer holds my stream up to txid %d (%s), which this "
                "journal does not have; resending from the start of the journal",
                self.name,
                welcome.cursor_txid,
                welcome.cursor_bm,
                extra=events.extra(events.REPLICATION_RESYNC_FULL),
            )
            return 0
        return welcome.cursor_txid

    async def _send_loop(
        self, stream: trio.SocketStream, link: UpstreamLink, resync_end: int
    ) -> None:
        instance = self.instance
        journal = instance.journal
        assert journal is not None
        accepts = self.route.accepts
        remote = self.remote_name
        while True:
            committed = instance.committed_txid
            if self.sent_txid >= committed:
                await instance.wait_for_commit(self.sent_txid)
                continue
            while self.sent_txid - self.acked_txid > MAX_UNACKED_RECORDS:
                self._ack_event = trio.Event()
                await self._ack_event.wait()
            batch, damage = journal.read_raw(self.sent_txid, SEND_BATCH, committed)
            selected = [
                raw
                for rec, raw in batch
                if accepts(
                    topic=rec.topic,
                    message_type=rec.message_type,
                    origin=rec.origin,
                    path=rec.path,
                    payload=rec.payload,
                    remote_name=remote,
                )
            ]
            if damage is not None:
                # a damaged record cannot be sent; say so loudly, never skip quietly
                self.holes += 1
                log.error(
                    "replication hole: destination %s cannot receive txid %s: %s",
                    self.name,
                    damage.txid,
                    damage,
                    extra=events.extra(events.REPLICATION_HOLE),
                )
                upto = damage.txid if damage.txid is not None else self.sent_txid + 1
                upto_bm = batch[-1][0].bookmark if batch else ""
            elif batch:
                upto = batch[-1][0].txid
                upto_bm = batch[-1][0].bookmark
            else:
                await instance.wait_for_commit(self.sent_txid)
                continue
            frame = link.data(selected, upto, upto_bm, trio.current_time())
            await self._send(stream, frame)
            if self.sent_txid < resync_end:
                self.resync_records += len(selected)
            self.sent_txid = upto
            self.messages_out += len(selected)
            self.bytes_out = link.bytes_out
            self.raw_bytes_out = link.raw_bytes_out

    async def _receive_loop(
        self, stream: trio.SocketStream, link: UpstreamLink, scope: trio.CancelScope
    ) -> None:
        while True:
            data = await stream.receive_some(65536)
            if not data:
                raise LinkError("closed", "the peer closed the connection")
            for event in link.receive_data(data, trio.current_time()):
                if isinstance(event, Ack):
                    if event.upto > self.acked_txid:
                        self.acked_txid = min(event.upto, self.sent_txid)
                        self._ack_event.set()
                        self.instance.replication_acked()
                elif isinstance(event, Refused):
                    raise LinkError(event.reason, f"the peer closed the link: {event.detail}")

    async def _heartbeat_loop(self, stream: trio.SocketStream, link: UpstreamLink) -> None:
        while True:
            await trio.sleep_until(link.next_deadline())
            data = link.handle_timer(trio.current_time())
            if data:
                await self._send(stream, data)

    # ---------------------------------------------------------------- info
    def seconds_behind(self) -> float:
        """Age of the oldest local record the destination has not acknowledged."""
        instance = self.instance
        if self.acked_txid >= instance.committed_txid or instance.journal is None:
            return 0.0
        rec = instance.journal.get(self.acked_txid + 1)
        if rec is None:
            return 0.0
        return max(0.0, time.time() - rec.local_ts / 1e6)

    def statistics(self) -> DestinationStatistics:
        return DestinationStatistics(
            name=self.name,
            remote_name=self.remote_name,
            group=self.config.group,
            replication_type="sync" if self.sync else "async",
            configured_sync_type=self.config.sync_type,
            is_connected=self.connected,
            address=self.address,
            messages_out=self.messages_out,
            bytes_out=self.bytes_out,
            raw_bytes_out=self.raw_bytes_out,
            sent_txid=self.sent_txid,
            acked_txid=self.acked_txid,
            seconds_behind=self.seconds_behind(),
            disconnect_count=self.disconnect_count,
            resyncs=self.resyncs,
            resync_records=self.resync_records,
            holes=self.holes,
            pass_through=self.config.passthrough,
            last_error=self.last_error,
        )


def describe(stats: DestinationStatistics) -> dict[str, Any]:
    return dict(stats.__dict__)
