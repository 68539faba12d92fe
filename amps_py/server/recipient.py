"""What delivering to a client connection takes: the narrow view of a session.

A subscription (:mod:`.subscriptions`), the delivery path (:mod:`.delivery`), a
conflated subscription (:mod:`.conflating`) and a queue subscriber (:mod:`.queues`)
each hold the connection they deliver to. They need only this of it, so they name
:class:`Recipient` rather than :class:`~amps_py.server.session.Session` (which
satisfies it; mypy checks every place one is handed over): a leaf module, importing
nothing of the server, so the delivery side does not depend on the session that
drives it.
"""

from __future__ import annotations

from typing import Protocol

__all__ = ["Recipient"]


class Recipient(Protocol):
    """A client connection messages are sent to."""

    #: messages sent to it (the delivery path counts them)
    messages_out: int

    @property
    def conn_id(self) -> int:
        """The connection's number on this instance (unique while it runs)."""
        ...

    @property
    def message_type(self) -> str:
        """The type of every message it receives."""
        ...

    def send(self, data: bytes) -> None:
        """Queue bytes for the client (never blocks)."""
        ...
