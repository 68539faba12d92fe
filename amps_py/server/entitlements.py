"""What one connection's user may read and write: the answers, cached, and the refusals.

A session asks :class:`TopicEntitlements` before it publishes to, reads from or deletes
from a topic. The answers come from its transport's entitlement module
(:class:`amps_py.auth.Entitler`) and are cached per topic for the connection's life
(a user's rules do not change under a connection). A regex topic is never judged by its
text: entitlement is decided per concrete topic (docs/GUARANTEES.md, "Security").
Refusals are counted (``denied_commands``, and ``denied_writes`` for writes) and raised
as ``not entitled``; the connection stays open.

No trio, no I/O.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Final

from amps_py import reasons
from amps_py.protocol.server.commands import CommandFailed

from .subscriptions import BadTopic, EntitledTopics, TopicPattern, compile_topic

if TYPE_CHECKING:
    from amps_py.auth import Entitler

    from .counters import Counters

__all__ = ["TopicEntitlements"]

#: cached answers per connection; the cache is emptied past this many
MAX_CACHED: Final = 4096


class TopicEntitlements:
    """The entitlement answers for one connection's user.

    Args:
        entitler: the module of the connection's transport.
        counters: where refusals are counted (the instance's).

    Attributes:
        user_id: the user the connection logged on as ("" before the logon).
    """

    def __init__(self, entitler: Entitler, counters: Counters) -> None:
        self.entitler = entitler
        self.user_id = ""
        self._counters = counters
        self._answers: dict[tuple[bool, str], bool] = {}

    def is_entitled(self, topic: str, *, write: bool) -> bool:
        """Whether the user may read/write the concrete topic ``topic`` (cached per
        topic; nothing counted)."""
        key = (write, topic)
        allowed = self._answers.get(key)
        if allowed is None:
            entitler = self.entitler
            if write:
                allowed = entitler.can_write(self.user_id, topic)
            else:
                allowed = entitler.can_read(self.user_id, topic)
            if len(self._answers) >= MAX_CACHED:
                self._answers.clear()
            self._answers[key] = allowed
        return allowed

    def may_read(self, topic: str) -> bool:
        """:meth:`is_entitled` for reading: what :class:`EntitledTopics` asks per topic."""
        return self.is_entitled(topic, write=False)

    def topics_to_read(self, topic: str, non_regex: bool) -> TopicPattern | None:
        """What a subscription, SOW query or replay on ``topic`` may run over: None
        for an exact topic (which this user may read), else the topic regex, limited
        to the topics this user may read unless the user reads everything.

        Raises:
            CommandFailed: ``not entitled`` for an exact topic the user may not read,
                or a regex when the user may read no topic at all; ``bad regex
                topic`` for a regex that does not compile.
        """
        try:
            regex = compile_topic(topic, non_regex)
        except BadTopic as exc:
            raise CommandFailed(exc.reason, str(exc)) from None
        if regex is None:
            self.require(topic, write=False)
            return None
        entitler = self.entitler
        if entitler.reads_everything(self.user_id):
            return regex
        if entitler.reads_nothing(self.user_id):
            self._counters.count_denied(write=False)
            raise CommandFailed(
                reasons.NOT_ENTITLED,
                f"user {self.user_id!r} may read no topic (asked for topic expression "
                f"{topic!r}); the {entitler.module} rules decide",
            )
        return EntitledTopics(regex, self.may_read)

    def require(self, topic: str, *, write: bool, action: str = "") -> None:
        """Raise ``not entitled`` unless the user may read/write the concrete topic
        ``topic`` (reads over a topic expression go through :meth:`topics_to_read`
        instead), counting the refusal. ``action`` names what was refused in the
        detail ("delete from"; default "publish to" or "read").

        Raises:
            CommandFailed: ``not entitled``.
        """
        if self.is_entitled(topic, write=write):
            return
        self._counters.count_denied(write=write)
        action = action or ("publish to" if write else "read")
        raise CommandFailed(
            reasons.NOT_ENTITLED,
            f"user {self.user_id!r} may not {action} topic {topic!r}; the "
            f"{self.entitler.module} rules decide",
        )

    def forget(self) -> None:
        """Drop the cached answers (the connection ended)."""
        self._answers.clear()
