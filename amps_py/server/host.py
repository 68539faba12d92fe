"""What the parts of the server need of the instance: narrow views, not the instance.

A session, a bookmark replay and journal maintenance each take one of these
:class:`~typing.Protocol` s; :class:`~amps_py.server.instance.Instance` satisfies all of
them (mypy checks it, see the end of ``instance.py``). Each names exactly what its
user reads or calls, so a reader sees what a session may touch, and a test may hand a
part a small stand-in.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import TYPE_CHECKING, Any, Protocol

from txlog import Journal

if TYPE_CHECKING:
    from amps_py.auth import Authenticator, Entitler
    from amps_py.auth_gate import AuthGate
    from amps_py.config import TransportConfig
    from amps_py.message_types import MessageTypes
    from amps_py.replication import ReplicationManager

    from .counters import Counters
    from .delivery import Delivery
    from .durability import PublisherLedger
    from .flow import FlowSession
    from .limits import InstanceLimits
    from .names import NamedClient
    from .publishing import Publisher, PublisherSession
    from .queues import QueueBook
    from .recipient import Recipient
    from .replay_cursors import ActiveReplays
    from .sowing import SowState
    from .subscriptions import Subscription, SubscriptionRegistry
    from .writer import JournalWriter

    # only annotations name it (its bases import trio): defined for the type checker
    class HostedSession(PublisherSession, NamedClient, FlowSession, Recipient, Protocol):
        """What the instance keeps of a client connection
        (:class:`~amps_py.server.session.Session`): it is counted, named, closed, and
        forgotten when it ends."""

        @property
        def transport(self) -> str: ...
        @property
        def close_reason(self) -> str: ...
        @property
        def close_detail(self) -> str: ...
        @property
        def subscriptions(self) -> dict[str, Subscription]: ...


class ReplayHost(Protocol):
    """What a bookmark replay reads and waits on."""

    @property
    def journal(self) -> Journal | None: ...
    @property
    def registry(self) -> SubscriptionRegistry: ...
    @property
    def delivery(self) -> Delivery: ...
    @property
    def active_replays(self) -> ActiveReplays: ...

    def visible_txid(self, durable: bool) -> int:
        """The newest txid a (``fully_durable``) subscription may see."""
        ...

    async def wait_for_commit(self, after_txid: int, *, durable: bool = False) -> None: ...

    async def wait_for_any_commit(self) -> None:
        """Return after the next commit (or failed commit)."""
        ...


class SessionHost(ReplayHost, Protocol):
    """What a client session uses: logon, entitlements, publish, subscribe, limits."""

    @property
    def journal(self) -> Journal | None: ...
    @property
    def writer(self) -> JournalWriter | None: ...
    @property
    def sessions(self) -> Collection[HostedSession]: ...
    @property
    def counters(self) -> Counters: ...
    @property
    def limits(self) -> InstanceLimits: ...
    @property
    def authenticator(self) -> Authenticator: ...
    @property
    def auth_gate(self) -> AuthGate: ...
    @property
    def entitler(self) -> Entitler: ...
    def authenticator_for(self, transport: str) -> Authenticator:
        """The module that checks logons over client transport ``transport``."""
        ...

    def entitler_for(self, transport: str) -> Entitler:
        """The module that decides for users logged on over ``transport``."""
        ...

    @property
    def last_durable_bookmark(self) -> str: ...
    @property
    def committed_txid(self) -> int: ...
    @property
    def sow(self) -> SowState:
        """The SOW topics and their stores (empty without SOW)."""
        ...

    @property
    def queues(self) -> QueueBook | None:
        """The message queues (None when none is configured)."""
        ...

    def next_connection_id(self) -> int: ...

    def transport_config(self, transport: str) -> TransportConfig: ...

    def max_frame_size(self, transport: str) -> int: ...

    def client_limits(self, transport: str) -> tuple[float, float, int]:
        """(LogonTimeout s, IncompleteMessageTimeout s, ClientMaxCapacity bytes)."""
        ...

    def client_disk_capacity(self, transport: str) -> int:
        """ClientMaxCapacity as a share of MessageDiskLimit (bytes), for an offline client."""
        ...

    def compile_filter(self, text: str) -> Any: ...

    def journals_topic(self, topic: str, message_type: str = "json") -> bool: ...

    @property
    def message_types(self) -> MessageTypes:
        """The message types the instance loads (defaults and ``<MessageTypes>``)."""
        ...

    def claim_client_name(self, session: HostedSession, name: str, user: str) -> str:
        """ "" when ``session`` may use ``name``; else why not."""
        ...

    def name_owner_refusal(self, name: str, user: str) -> str:
        """ "" unless ``name`` holds publisher state and belongs to another user; else
        why ``user`` may not log on with it."""
        ...

    def session_ended(self, session: HostedSession) -> None: ...

    def held_seq(self, pub_hash: int) -> int: ...

    def ledger(self, pub_hash: int) -> PublisherLedger: ...

    def publish(
        self,
        session: Publisher,
        topic: str,
        seq: int,
        payload: bytes,
        header: dict[str, Any],
        kind: int = ...,
        message_type: str = ...,
    ) -> str:
        """``queued``, ``pending`` or ``done`` (see :meth:`PublishPath.publish`)."""
        ...

    def publish_internal(
        self,
        topic: str,
        payload: bytes,
        kind: int = ...,
        on_committed: Any = ...,
        message_type: str = ...,
    ) -> str:
        """Publish as the instance itself (its own publisher name and seqs)."""
        ...

    def fire_action(self, on: str, variables: dict[str, str]) -> None: ...


class MaintenanceHost(Protocol):
    """What journal maintenance needs: the journal, who still reads it, and where."""

    @property
    def journal(self) -> Journal | None: ...
    @property
    def writer(self) -> JournalWriter | None: ...
    @property
    def replication(self) -> ReplicationManager | None: ...
    @property
    def committed_txid(self) -> int: ...
    @property
    def active_replays(self) -> ActiveReplays: ...
    @property
    def queues(self) -> QueueBook | None: ...
    @property
    def sow(self) -> SowState: ...
