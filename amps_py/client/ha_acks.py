"""The queue acknowledgements of the HA client, across reconnects (the contract is
:meth:`amps_py.client.ha.HAClient.ack`'s).

:class:`HAQueueAcks` is composed into the HA client: each acknowledgement goes through
the current connection's batching (:mod:`amps_py.client.queue`); the plain ones a lost
connection had not had confirmed are kept and sent on the next connection before the
subscriptions are renewed; a cancel or expire of a lease that is gone is dropped.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Final, Protocol

import trio

from amps_py.redact import redact_uris

from .queue import send_pending as send_pending_acks
from .subscription import ConnectionLost

if TYPE_CHECKING:
    from .client import Client

log = logging.getLogger("amps_py.client.ha")

#: what a send on a connection that is going raises
LOST: Final = (ConnectionLost, trio.BrokenResourceError, trio.ClosedResourceError)


@dataclass
class Live:
    """The current connection of an HA client, once logged on and replayed."""

    client: Client
    uri: str
    nursery: trio.Nursery
    #: its number (``HAClient.connections`` when it logged on)
    connection: int
    #: set once the connection is over
    ended: trio.Event = field(default_factory=trio.Event)


class AckOwner(Protocol):
    """What :class:`HAQueueAcks` needs of the HA client (the
    :class:`~amps_py.client.ha.HAClient` has it): its name and current server (for
    logs and errors), its current connection and the event set at each logon."""

    name: str
    uri: str
    _live: Live | None
    _connected: trio.Event

    @property
    def connected(self) -> bool: ...


class HAQueueAcks:
    """The acknowledgements of an HA client's queue messages.

    Attributes:
        acks_resent: acknowledgements sent on a later connection than the one they
            were made for.
        stale_acks_dropped: cancels and expires not sent because the message's lease
            ended with its connection.
    """

    def __init__(self, owner: AckOwner) -> None:
        self._owner = owner
        self.acks_resent = 0
        self.stale_acks_dropped = 0
        #: acknowledgements for the next connection: topic -> bookmarks (a dict for
        #: its order and to hold each once)
        self._unsent: dict[str, dict[str, None]] = {}

    def take_over(self, client: Client) -> None:
        """The connection of ``client`` is lost: keep the plain acknowledgements it had
        not had confirmed (batched, or sent and not answered) to send on the next one
        (see :meth:`ack`)."""
        for topic, bookmarks in client._acks.unconfirmed().items():
            kept = self._unsent.setdefault(topic, {})
            kept.update(dict.fromkeys(bookmarks))
        client._acks.forget()

    async def resend(self, client: Client) -> None:
        """Send the acknowledgements kept from earlier connections (each topic's as one
        batch through ``client``'s batching)."""
        pending, self._unsent = self._unsent, {}
        try:
            for topic, marks in pending.items():
                log.info(
                    "HA client %r: acknowledging %d message(s) of %r on %s (made while no "
                    "connection could take them, or not confirmed before one was lost)",
                    self._owner.name,
                    len(marks),
                    topic,
                    redact_uris(self._owner.uri),
                )
                for bookmark in marks:
                    await client.ack(topic, bookmark)
                self.acks_resent += len(marks)
            await send_pending_acks(client)
        except BaseException:
            # lost meanwhile: keep them all (one acknowledged twice is harmless)
            for topic, marks in pending.items():
                self._unsent.setdefault(topic, {}).update(marks)
            raise

    async def ack(
        self, topic: str, bookmark: str, cancel: bool, expire: bool, connection: int | None
    ) -> None:
        """:meth:`HAClient.ack <amps_py.client.ha.HAClient.ack>`; ``connection``: the
        connection (``HAClient.connections`` count) the message was leased on, None
        when not known (the current one)."""
        if not bookmark:
            raise ValueError(
                f"acknowledging a message of {topic!r} needs its bookmark (message.bookmark)"
            )
        if cancel and expire:
            raise ValueError("give cancel=True or expire=True, not both")
        live = self._owner._live
        current = live is not None and (connection is None or connection == live.connection)
        if (cancel or expire) and not current:
            self.stale_acks_dropped += 1
            log.info(
                "HA client %r: %s of %s on %r not sent: it was leased on a connection "
                "that is gone, so the server has returned it to the queue already",
                self._owner.name,
                "cancel" if cancel else "expire",
                bookmark,
                topic,
            )
            return
        if live is not None:
            try:
                await live.client.ack(topic, bookmark, cancel=cancel, expire=expire)
                return
            except LOST:
                if cancel or expire:
                    self.stale_acks_dropped += 1
                    return
                if self._owner._live is not live:  # the session is over: keep it for the next
                    self._unsent.setdefault(topic, {})[bookmark] = None
                else:  # the session ends soon and takes over what its client holds
                    live.client._acks.keep(topic, [bookmark])
                return
        self._unsent.setdefault(topic, {})[bookmark] = None

    async def flush(self, timeout: float) -> None:
        """:meth:`HAClient.flush_acks <amps_py.client.ha.HAClient.flush_acks>`.

        Raises:
            CommandError: the server refused an acknowledgement.
            TimeoutError: not done within ``timeout`` seconds (e.g. no server).
        """
        with trio.move_on_after(timeout):
            while True:
                live = self._owner._live
                if live is None:
                    await self._owner._connected.wait()
                    continue
                try:
                    if self._unsent:
                        await self.resend(live.client)
                    await live.client.flush_acks(timeout=math.inf)
                except LOST:
                    await live.ended.wait()  # then the next connection sends them
                    continue
                return
        raise TimeoutError(
            f"{self._owner.name}: acknowledgements not confirmed within {timeout:g} s "
            f"({'connected to ' + self._owner.uri if self._owner.connected else 'not connected'})"
        )
