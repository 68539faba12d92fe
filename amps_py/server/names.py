"""Client names: with a transaction log, each name belongs to one connection.

A publisher's name keys its ledger of persisted acks, so two live connections may not
share one: the same name and user logging on again takes the name over (the older
connection is closed, reason ``name in use``); a different user is refused.
"""

from __future__ import annotations

import logging
from typing import Protocol

from amps_py import events, reasons

log = logging.getLogger("amps_py.server")


class NamedClient(Protocol):
    """A connection that logs on with a client name."""

    @property
    def user_id(self) -> str: ...
    @property
    def peer(self) -> str: ...
    @property
    def conn_id(self) -> int: ...

    def close(self, reason: str) -> None: ...


class ClientNames:
    """Which connection holds each client name."""

    def __init__(self) -> None:
        self._holders: dict[str, NamedClient] = {}

    def claim(self, client: NamedClient, name: str, user: str) -> str:
        """Give ``name`` to ``client`` (logged on as ``user``); return why not, or ""
        when granted. An older connection of the same name and user is closed."""
        current = self._holders.get(name)
        if current is not None and current is not client:
            if current.user_id != user:
                return (
                    f"client name {name!r} is in use by another user; client names must be "
                    "unique per publisher"
                )
            log.warning(
                "client name %r logged on again from %s; disconnecting the older connection %d",
                name,
                client.peer,
                current.conn_id,
                extra=events.extra(events.NAME_IN_USE),
            )
            current.close(reasons.NAME_IN_USE)
        self._holders[name] = client
        return ""

    def release(self, client: NamedClient, name: str) -> bool:
        """``client`` ended: free ``name`` if it still holds it (True then)."""
        if name and self._holders.get(name) is client:
            del self._holders[name]
            return True
        return False
