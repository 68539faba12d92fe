"""What replication needs of the instance it runs in: a narrow view, not the instance.

:class:`ReplicationHost` is satisfied by :class:`amps_py.server.Instance`; naming only
what destinations, upstream connections and the manager use keeps the replication
package free of imports from :mod:`amps_py.server` (the instance imports replication,
never the reverse) and lets tests drive replication with a small stand-in.

The instance's replication manager, which upstream connections report to, is not part
of this view: :class:`.incoming.UpstreamHost` adds it, so that this module imports
nothing of the package (the manager imports the modules that use this one).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Protocol

from txlog import Journal, Record

if TYPE_CHECKING:
    from amps_py.auth import Authenticator, Entitler
    from amps_py.auth_gate import AuthGate
    from amps_py.config import InstanceConfig


class RecentCommits(Protocol):
    """The in-memory tail of recent commits (the writer keeps it)."""

    def after(self, txid: int, limit: int, upto: int) -> tuple[list[Record], list[bytes]] | None:
        """Up to ``limit`` committed records after ``txid`` (through ``upto``) with their
        stored bytes, or ``None`` when they are no longer in memory."""
        ...


class CommitFeed(Protocol):
    """The journal writer as replication sees it: received records go in, recent
    commits come out."""

    @property
    def failure(self) -> str:
        """Why journal writes are failing now ("" while they succeed)."""
        ...

    @property
    def failed_commits(self) -> int: ...

    @property
    def recent(self) -> RecentCommits: ...

    def submit_replicated(
        self,
        records: list[Record],
        upstream: str,
        cursor: tuple[int, str],
        on_durable: Callable[[], None],
    ) -> None:
        """Queue records received from ``upstream``; ``on_durable`` runs after the
        commit that stores them and the upstream's new position."""
        ...


class ReplicationHost(Protocol):
    """The instance, as its destinations and upstream connections use it."""

    @property
    def name(self) -> str: ...

    @property
    def group(self) -> str: ...

    @property
    def config(self) -> InstanceConfig: ...

    @property
    def journal(self) -> Journal | None: ...

    @property
    def writer(self) -> CommitFeed | None: ...

    @property
    def committed_txid(self) -> int:
        """The newest txid committed to the local journal."""
        ...

    @property
    def replication_authenticator(self) -> Authenticator:
        """Checks upstream instances' credentials (the replication transport's own
        Authentication, else the instance's)."""
        ...

    @property
    def replication_entitler(self) -> Entitler:
        """Decides which upstream users may replicate in (the replication transport's
        own Entitlement, else the instance's)."""
        ...

    @property
    def auth_gate(self) -> AuthGate:
        """Where passwords are checked (off the event loop, backed off, logged)."""
        ...

    @property
    def entitler(self) -> Entitler: ...

    async def wait_for_commit(self, after_txid: int, *, durable: bool = False) -> None:
        """Return once a txid after ``after_txid`` is committed."""
        ...

    def note_replicated(self, records: Sequence[Record]) -> None:
        """Records received by replication were queued for the journal."""
        ...

    def fire_action(self, on: str, variables: dict[str, str]) -> None:
        """Run the configured ``amps-action-on-<on>`` actions."""
        ...

    def replication_changed(self) -> None:
        """A destination connected, disconnected or changed sync/async."""
        ...

    def replication_acked(self) -> None:
        """A destination acknowledged more."""
        ...

    def acks_waiting_for(self, destination: str) -> int:
        """How many committed records routed to sync destination ``destination`` wait
        for its acknowledgement before they are durable."""
        ...
