"""What the queue core needs to know of a queue's definition: :class:`QueuePolicy`.

The server builds one from the queue's ``QueueConfig`` (``amps_py.config.queue_model``);
this package does not import the config package, so the core can be tested, and
reasoned about, on its own.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

SEMANTICS: Final = ("at-least-once", "at-most-once")
LEASING: Final = ("sublet", "strict")
FAIRNESS: Final = ("proportional", "round-robin", "fast")
KINDS: Final = ("distributed", "group-local", "local")


@dataclass(frozen=True)
class QueuePolicy:
    """The delivery rules of one queue, as the core applies them.

    The server builds it from ``QueueConfig`` (same names, same units); the core never
    reads the config itself.

    Attributes:
        semantics: ``"at-least-once"`` (a delivered message is leased until acked) or
            ``"at-most-once"`` (removed from the queue when it is sent).
        lease_period: seconds a lease lasts from the delivery; ``None``: leases never
            time out (they end with an ack, a cancel, an unsubscribe or a disconnect).
        max_backlog: the most messages leased at once on this instance, all
            subscriptions together; ``None``: no cap.
        max_per_subscription_backlog: the most messages one subscription may hold
            leased; a subscription asking for more (``max_backlog`` option) gets this.
        expiration: seconds a message may stay in the queue, from its publish time;
            ``None``: never expires.
        max_deliveries: a message delivered this many times is expired instead of
            being returned to the queue; 0: unlimited.
        max_cancels: a message cancelled this many times is expired; 0: unlimited.
        leasing: ``"sublet"`` (any connection may ack any message) or ``"strict"``
            (only the connection holding the lease, or anyone for an unleased message).
        fairness: ``"proportional"``, ``"round-robin"`` or ``"fast"``, how a message
            picks among the subscriptions able to take it. An at-most-once queue is
            always round-robin, as in AMPS.
        kind: ``"distributed"`` (``Queue``), ``"group-local"`` (``GroupLocalQueue``)
            or ``"local"`` (``LocalQueue``: every message is owned here).

    Raises:
        ValueError: a value outside its list or range; the message names the field.
    """

    semantics: str = "at-least-once"
    lease_period: float | None = None
    max_backlog: int | None = None
    max_per_subscription_backlog: int = 1
    expiration: float | None = None
    max_deliveries: int = 0
    max_cancels: int = 0
    leasing: str = "sublet"
    fairness: str = "proportional"
    kind: str = "distributed"

    def __post_init__(self) -> None:
        for name, allowed in (
            ("semantics", SEMANTICS),
            ("leasing", LEASING),
            ("fairness", FAIRNESS),
            ("kind", KINDS),
        ):
            value = getattr(self, name)
            if value not in allowed:
                raise ValueError(
                    f"QueuePolicy.{name} must be one of {', '.join(allowed)}; got {value!r}"
                )
        for name in ("lease_period", "expiration"):
            seconds = getattr(self, name)
            if seconds is not None and not seconds > 0:
                raise ValueError(
                    f"QueuePolicy.{name} must be a number of seconds above 0, or None for "
                    f"never; got {seconds!r}"
                )
        if self.max_backlog is not None and self.max_backlog < 1:
            raise ValueError(
                f"QueuePolicy.max_backlog must be at least 1, or None for no cap; got "
                f"{self.max_backlog!r}"
            )
        if self.max_per_subscription_backlog < 1:
            raise ValueError(
                "QueuePolicy.max_per_subscription_backlog must be at least 1; got "
                f"{self.max_per_subscription_backlog!r}"
            )
        for name in ("max_deliveries", "max_cancels"):
            if getattr(self, name) < 0:
                raise ValueError(
                    f"QueuePolicy.{name} must be 0 (unlimited) or more; got {getattr(self, name)!r}"
                )

    @property
    def at_least_once(self) -> bool:
        """Whether delivered messages are leased (rather than removed on send)."""
        return self.semantics == "at-least-once"

    @property
    def effective_fairness(self) -> str:
        """The fairness model in force: at-most-once queues are always round-robin."""
        return self.fairness if self.at_least_once else "round-robin"
