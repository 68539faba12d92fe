"""What the actions need of the instance and of a client session: narrow views.

:class:`ActionsHost` is satisfied by :class:`amps_py.server.Instance` (mypy checks it
where the instance builds its :class:`~amps_py.actions.ActionRunner`), and
:class:`ClientIdentity` by a server session. Naming only what the Do modules and the
client events use keeps this package free of imports from :mod:`amps_py.server`: the
server imports the actions, never the reverse.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from amps_py.replication.manager import ReplicationManager


class JournalMaintenanceOutcome(Protocol):
    """What one journal maintenance request did."""

    @property
    def summary(self) -> str: ...


class ActionsHost(Protocol):
    """The instance, as the action runner uses it."""

    @property
    def name(self) -> str: ...

    @property
    def started_at(self) -> float:
        """When the instance started (epoch seconds): the GracePeriod counts from it."""
        ...

    @property
    def replication(self) -> ReplicationManager | None: ...

    def disable_transport(self, name: str) -> str:
        """Stop listening on client transport ``name``; raises KeyError naming those
        that exist."""
        ...

    async def enable_transport(self, name: str) -> str:
        """Listen on client transport ``name`` again; raises KeyError naming those
        that exist."""
        ...

    def set_proxied_transfer(self, queue: str, enabled: bool) -> str:
        """Enable or disable proxied transfer on ``queue``; KeyError names the queues."""
        ...

    def publish_internal(self, topic: str, payload: bytes) -> str:
        """Publish ``payload`` to ``topic`` as the instance itself."""
        ...

    async def maintain_journal(
        self, action: str, *, through: int | None = None, older_than: float | None = None
    ) -> JournalMaintenanceOutcome:
        """Compress, archive or remove journal segments; raises
        JournalMaintenanceError when that cannot be done."""
        ...


class ClientIdentity(Protocol):
    """A client connection, as the client events' variables name it."""

    @property
    def conn_id(self) -> int: ...

    @property
    def client_name(self) -> str: ...

    @property
    def peer(self) -> str: ...

    @property
    def user_id(self) -> str: ...
