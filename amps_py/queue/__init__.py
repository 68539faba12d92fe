"""Message queues: the pure delivery core of one queue on one instance.

No trio and no I/O anywhere in this package: the server drives it, passing time in as
``now``, and acts on what it returns (deliveries to send, acks and expiries to
journal, dead-letter actions to fire).

- ``policy``   :class:`QueuePolicy`, the delivery rules (built from QueueConfig)
- ``model``    messages, leases, subscriptions and the results the core returns
- ``fairness`` which subscription gets a message (fast, round-robin, proportional)
- ``state``    :class:`QueueState`, the messages in the queue and who holds them
"""

from .model import AckResult, Lease, QueueMessage, QueueStatistics, QueueSub, Returned, SubKey
from .policy import QueuePolicy
from .state import QueueState

__all__ = [
    "AckResult",
    "Lease",
    "QueueMessage",
    "QueuePolicy",
    "QueueState",
    "QueueStatistics",
    "QueueSub",
    "Returned",
    "SubKey",
]
