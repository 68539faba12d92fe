"""The option object of one queue (``SOW/Queue``, ``SOW/GroupLocalQueue``,
``SOW/LocalQueue``): :class:`QueueConfig`.

The loader builds it in ``amps_py.config.queue`` (which needs lxml); this module holds
only the frozen dataclass, knows nothing of XML and imports no lxml, so the server and
replication can read it. ``amps_py.config.model`` re-exports it.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Final, Literal, Protocol

#: ``QueueConfig.kind`` of each queue element (``QueueDefinition`` is AMPS's other
#: name for ``Queue``)
QUEUE_KINDS: Final = {
    "Queue": "distributed",
    "QueueDefinition": "distributed",
    "GroupLocalQueue": "group-local",
    "LocalQueue": "local",
}
#: the values of ``Semantics``, ``Leasing`` and ``FairnessModel``, default first
QUEUE_SEMANTICS: Final = ("at-least-once", "at-most-once")
QUEUE_LEASING: Final = ("sublet", "strict")
QUEUE_FAIRNESS: Final = ("proportional", "round-robin", "fast")


class _TopicEntry(Protocol):
    """A ``Replication/Destination/Topic`` as :meth:`QueueConfig.carried_by` reads it
    (:class:`amps_py.config.model.ReplicationTopic`)."""

    def matches(self, topic: str, message_type: str) -> bool: ...


#: How a replication Destination carries a queue (see :meth:`QueueConfig.carried_by`)
QueueCarriage = Literal["queue", "archive"]


@dataclass(frozen=True)
class QueueConfig:
    """One queue defined in ``SOW``: messages of an underlying topic, each delivered to
    one subscriber at a time and removed when acknowledged.

    amps-py derives a queue from the journal (every committed publish on the underlying
    topic enters it in txid order), so the loader only accepts a queue whose underlying
    topic the TransactionLog records.

    Raises:
        re.error: :attr:`underlying_is_regex` but :attr:`underlying_topic` is not a
            valid regular expression (the loader reports this as a ConfigProblem
            before constructing one).
    """

    kind: str
    """``distributed`` (``Queue`` or ``QueueDefinition``: the instance a message was
    published to owns it), ``group-local`` (``GroupLocalQueue``: :attr:`initial_owner`
    owns every message) or ``local`` (``LocalQueue``: this instance alone; never
    replicated)."""

    name: str
    """The queue topic subscribers use (``Name``, or its synonym ``Topic``); literal."""

    message_type: str
    """The message type of the queue and of its underlying topic, e.g. ``json``."""

    underlying_topic: str
    """The topic whose messages enter the queue (``UnderlyingTopic``; default
    :attr:`name`): a literal topic, or a regular expression when
    :attr:`underlying_is_regex`."""

    underlying_is_regex: bool
    """Whether :attr:`underlying_topic` is a regular expression (it contains one of
    ``* + ? [ ] ( ) { } | ^ $ \\``). Like every AMPS topic regex it is unanchored:
    ``^orders/`` matches ``orders/eu``; see :meth:`covers`."""

    default_publish_target: str | None = None
    """Where a publish to the queue's own name goes (``DefaultPublishTarget``, a
    literal topic that the underlying topic covers); required when
    :attr:`underlying_is_regex`; ``None`` otherwise means the underlying topic."""

    lease_period: float | None = None
    """Seconds a subscriber may hold a message before it returns to the queue
    (``LeasePeriod``, counted from the send); ``None``: leases never expire."""

    semantics: str = "at-least-once"
    """``at-least-once`` (a message leaves the queue when acknowledged) or
    ``at-most-once`` (it leaves the queue when sent)."""

    max_backlog: int | None = None
    """The most messages this instance may have leased out at once, over all
    subscribers (``MaxBacklog``, at least 1); ``None``: no instance-wide cap."""

    max_per_subscription_backlog: int = 1
    """The most leased messages one subscription may hold (``MaxPerSubscriptionBacklog``,
    at least 1); a subscription's backlog is the smaller of this and its own
    ``max_backlog`` option."""

    expiration: float | None = None
    """Seconds after its publish a message expires (``Expiration``); ``None``: never."""

    filter: str | None = None
    """Content filter (``Filter``, checked to compile): only underlying messages that
    match it enter the queue; ``None``: every message does."""

    max_deliveries: int = 0
    """Deliveries after which a returned message expires instead of being sent again
    (``MaxDeliveries``); 0: unlimited. Counted locally, reset on restart."""

    max_cancels: int = 0
    """Cancels (acknowledgements with option ``cancel``) after which a message
    expires (``MaxCancels``); 0: unlimited. Counted locally, reset on restart."""

    leasing: str = "sublet"
    """``sublet`` (any subscriber may acknowledge a message) or ``strict`` (only the
    lease holder may, or anyone while it is not leased)."""

    fairness: str = "proportional"
    """How messages are spread over subscribers (``FairnessModel``): ``proportional``,
    ``round-robin`` or ``fast``; always ``round-robin`` for an at-most-once queue,
    whatever ``FairnessModel`` says."""

    priority: str | None = None
    """An expression (``Priority``, checked to compile) whose value orders the queue,
    highest first, then oldest first; ``None``: oldest first. Never given together with
    :attr:`barrier_expression`."""

    barrier_expression: str | None = None
    """Content filter (``BarrierExpression``, checked to compile): a matching message is
    a barrier, held until every earlier message is acknowledged and then delivered to
    every subscriber; ``None``: no barriers."""

    initial_owner: str | None = None
    """The instance that owns every message of a ``group-local`` queue
    (``InitialOwner``, an instance Name; required there, absent otherwise)."""

    recovery_point: str = "epoch"
    """Where the queue is rebuilt from (``RecoveryPoint``): ``epoch``, the whole
    journal, the only value amps-py supports."""

    _pattern: re.Pattern[str] | None = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        pattern = re.compile(self.underlying_topic) if self.underlying_is_regex else None
        object.__setattr__(self, "_pattern", pattern)

    @property
    def at_most_once(self) -> bool:
        """Whether a message leaves the queue when it is sent (not when acknowledged)."""
        return self.semantics == "at-most-once"

    @property
    def publish_target(self) -> str:
        """The topic a publish to the queue's name is written to."""
        return self.default_publish_target or self.underlying_topic

    def covers(self, topic: str) -> bool:
        """Whether messages published on ``topic`` (of :attr:`message_type`) enter the
        queue, before :attr:`filter`: the literal underlying topic, or any topic the
        underlying regular expression finds a match in (``re.search``)."""
        if self._pattern is None:
            return topic == self.underlying_topic
        return self._pattern.search(topic) is not None

    def carried_by(self, topics: Iterable[_TopicEntry]) -> QueueCarriage | None:
        """How a replication Destination whose Topic entries are ``topics`` carries
        this queue:

        * ``"queue"``: an entry covers the queue's own name, so the queue is replicated
          (AMPS: "if the topic is a queue in this instance"): the downstream must host
          the same queue (the ``queue`` and ``queue_underlying`` checks);
        * ``"archive"``: no entry covers the name, but one covers the topic its
          messages are journaled on (the underlying topic, or the DefaultPublishTarget)
          - only possible when that topic has another name. AMPS replicates such
          underlying topics "without replicating the queue itself", e.g. to an
          archive or audit instance; amps-py sends the queue's acknowledgement and
          ownership records along with them (see ``DestinationConfig.archived_queues``);
        * ``None``: neither, and always for a LocalQueue that is not replicated (its
          records are this instance's own; its underlying topic may be replicated).
        """
        entries = list(topics)
        if any(t.matches(self.name, self.message_type) for t in entries):
            return "queue"
        if self.kind == "local":
            return None
        journaled = (self.underlying_topic, self.default_publish_target)
        if any(
            n is not None and t.matches(n, self.message_type) for t in entries for n in journaled
        ):
            return "archive"
        return None
