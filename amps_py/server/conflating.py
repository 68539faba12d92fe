"""Runs a conflated subscription's :class:`~amps_py.server.conflation.Conflator`
with trio: frames the delivery built for the subscription are held by key, and a task
of the session sends each key's latest when its interval is over.

Resource handling: the task runs in the session's nursery, so it ends with the
connection; :meth:`ConflatedDelivery.close` (called when the subscription ends:
unsubscribe, replace) cancels it and drops what is held. Held frames are not counted
against the client's ``ClientMaxCapacity``: at most one per key is held, and they are
counted when they are sent.
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import Protocol

import trio

from .conflation import ConflationSpec, Conflator
from .counters import Counters
from .recipient import Recipient

__all__ = ["ConflatedDelivery", "ConflatingRecipient"]


class _Counted(Protocol):
    @property
    def counters(self) -> Counters: ...


class ConflatingRecipient(Recipient, Protocol):
    """The connection of a conflated subscription: deliveries are counted on its
    instance."""

    @property
    def instance(self) -> _Counted: ...


class ConflatedDelivery:
    """The conflation of one subscription: ``offer`` frames, ``run`` sends them."""

    __slots__ = ("_cancel", "_conflator", "_session", "_wake", "spec")

    def __init__(self, session: ConflatingRecipient, spec: ConflationSpec) -> None:
        self._session = session
        self.spec = spec
        self._conflator: Conflator[bytes] = Conflator(spec.interval)
        self._wake = trio.Event()
        self._cancel = trio.CancelScope()

    def key_of(self, topic: str, payload: bytes, sow_key: str) -> Hashable:
        return self.spec.key_of(topic, payload, sow_key)

    def offer(self, key: Hashable, frame: bytes) -> None:
        """Hold ``frame`` (one whole delivery frame) as the latest of ``key``."""
        if self._conflator.offer(key, frame, trio.current_time()):
            self._wake.set()

    @property
    def held(self) -> int:
        """How many keys have a frame waiting."""
        return len(self._conflator)

    async def run(self) -> None:
        """Send each key's latest frame when its interval is over, until closed."""
        conflator = self._conflator
        session = self._session
        with self._cancel:
            while True:
                deadline = conflator.next_deadline()
                if deadline is None:
                    await self._wake.wait()
                    self._wake = trio.Event()
                    continue
                await trio.sleep_until(deadline)
                frames = conflator.due(trio.current_time())
                if frames:
                    session.send(b"".join(frames))
                    session.messages_out += len(frames)
                    session.instance.counters.count_delivered(len(frames))

    def close(self) -> None:
        """The subscription ended: stop, and drop what is held."""
        self._cancel.cancel()
        self._conflator.clear()
