"""What a command handler uses of the session a command came on.

The handlers of subscription, SOW and replay commands (:mod:`.subscribing`,
:mod:`.sow_commands`, :mod:`.replay`) take a :class:`CommandSession`, not the
:class:`~amps_py.server.session.Session` that calls them (which satisfies it; mypy
checks each call), so they do not depend on the session module and it on them in a
cycle. It names everything they reach, the instance's narrow view
(:class:`~amps_py.server.host.SessionHost`) among it; narrower services per handler
(publish, subscribe, SOW, queue) are the next step.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, Protocol

from .conflating import ConflatingRecipient
from .publishing import Publisher
from .queue_commands import QueueClient

if TYPE_CHECKING:
    from .host import SessionHost
    from .subscriptions import Subscription, TopicPattern

__all__ = ["CommandSession"]


class CommandSession(Publisher, QueueClient, ConflatingRecipient, Protocol):
    """A client connection as its command handlers see it."""

    #: commands / messages received from it, and bookmark replays of it running
    messages_in: int
    replaying: int

    @property
    def instance(self) -> SessionHost: ...
    @property
    def user_id(self) -> str: ...

    def topics_to_read(self, topic: str, non_regex: bool) -> TopicPattern | None:
        """None for an exact topic the user may read, else the topics to run over.

        Raises:
            CommandFailed: not entitled, or a bad regex.
        """
        ...

    def require_entitled(self, topic: str, *, write: bool, action: str = "") -> None:
        """Raise ``not entitled`` unless the user may read/write ``topic``."""
        ...

    def publish_seq(self, header: dict[str, Any], acks: frozenset[str]) -> int:
        """The seq of a publish or sow_delete."""
        ...

    def persisted_progress(self, not_journaled: int = 0) -> None: ...

    def start_soon(self, fn: Callable[..., Awaitable[object]], *args: Any) -> None:
        """Run ``fn(*args)`` as a task of this session (it ends with the session)."""
        ...

    async def wait_outbox_below(self, high_water: int | None = None) -> None:
        """Wait until the outbox is small enough for a replay to go on."""
        ...

    def subscription_failed(self, sub: Subscription, cid: Any, reason: str, detail: str) -> None:
        """A replay could not run: drop the subscription and tell the client."""
        ...

    def end_subscription(self, sub: Subscription) -> None:
        """``sub`` is over: it leaves the session and the registry."""
        ...
