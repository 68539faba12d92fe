"""What a running instance reports about itself: one snapshot, read by the admin API,
the Prometheus metrics and the stats file (``serve --stats-file``).

A leaf module (it imports nothing of amps_py), so the packages that read statistics
need not import the server that writes them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Final

#: most records the journal writer puts in one transaction (bounds commit latency)
WRITER_MAX_BATCH: Final = 8192
#: upper bounds (seconds) of the commit-latency histogram; the last bucket is +Inf
COMMIT_SECONDS_BUCKETS: Final = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 1.0)
#: upper bounds (records) of the batch-size histogram; the last bucket is +Inf
BATCH_SIZE_BUCKETS: Final = (1, 10, 100, 1000, 4096, WRITER_MAX_BATCH)


@dataclass(frozen=True)
class InstanceStatistics:
    name: str
    uptime: float
    clients: int
    subscriptions: int
    published: int
    delivered: int
    duplicates: int
    protocol_errors: int
    failed_commands: int
    #: commands refused because the user is not entitled (publish, subscribe, ...)
    denied_commands: int = 0
    #: the subset of denied_commands that were publishes (AMPS's denied_writes)
    denied_writes: int = 0
    journal: dict[str, Any] | None = None
    writer: dict[str, Any] | None = None
    listeners: dict[str, int] = field(default_factory=dict)
    replication: dict[str, Any] | None = None
    durable_txid: int = 0
    #: the client memory pools and the connections they closed (InstanceLimits)
    limits: dict[str, Any] | None = None
    #: per SOW topic: ``records``, ``bytes`` (payload bytes), ``file_bytes`` and the
    #: journal txid its store has applied through (empty without SOW)
    sow: dict[str, dict[str, int]] = field(default_factory=dict)
    #: per queue: depth, leased, owned, delivered, acked, transfers, ... (see
    #: ``QueueBook.statistics``); empty without queues
    queues: dict[str, dict[str, Any]] = field(default_factory=dict)
    #: the last start: ``seconds`` to ready, ``journal_records_read`` (past the SOW
    #: stores' and the queues' checkpoints), ``queue_messages_loaded`` (from checkpoints)
    startup: dict[str, Any] = field(default_factory=dict)
    #: per topic: messages a content filter needed that did not parse as JSON (every
    #: filtered subscription skipped them); topics without any are absent
    unparsed_payloads: dict[str, int] = field(default_factory=dict)
