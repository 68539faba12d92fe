"""The instance's message and command counters: one object that sessions, replay and
the publish path increment through methods, and the admin tree, the metrics and the
statistics read (pure; no trio).

The journal, the writer, replication and the limits keep their own statistics; these
are the counts that belong to no other part.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Counters:
    """Monotonic counts since the instance started.

    Attributes:
        published: publishes accepted (journaled or not, duplicates included).
        delivered: messages handed to subscriptions (live and replayed).
        duplicates: publishes that named a message already held or in flight.
        protocol_errors: connections closed for a frame the codec refused.
        failed_commands: commands answered with a failure ack.
        denied_commands: commands refused for entitlement (a subset of failed).
        denied_writes: of those, publishes (AMPS's ``denied_writes``).
        unparsed: per topic, messages whose payload a content filter needed and that
            did not parse as JSON (every filtered subscription skipped them); each
            counted at most once (see :meth:`count_unparsed`).
    """

    published: int = 0
    delivered: int = 0
    duplicates: int = 0
    protocol_errors: int = 0
    failed_commands: int = 0
    denied_commands: int = 0
    denied_writes: int = 0
    unparsed: dict[str, int] = field(default_factory=dict)
    #: per topic, the newest txid counted in ``unparsed``
    _unparsed_upto: dict[str, int] = field(default_factory=dict, repr=False)

    def count_published(self) -> None:
        self.published += 1

    def count_delivered(self, n: int) -> None:
        self.delivered += n

    def count_duplicate(self) -> None:
        self.duplicates += 1

    def count_protocol_error(self) -> None:
        self.protocol_errors += 1

    def count_failed_command(self) -> None:
        self.failed_commands += 1

    def count_denied(self, *, write: bool) -> None:
        self.denied_commands += 1
        if write:
            self.denied_writes += 1

    def count_unparsed(self, topic: str, txid: int) -> None:
        """Count a message of ``topic`` that a filter needed and that is not JSON.

        Live delivery parses a message once for all subscriptions, a replay once per
        replaying subscription: a journaled message (``txid`` > 0) is counted only when
        newer than the last one counted on its topic, so replays of what was counted
        (live, or by an earlier replay) add nothing. (A message first met by a replay
        after a newer one was counted is not counted: at most once, never twice.)"""
        if txid:
            if txid <= self._unparsed_upto.get(topic, 0):
                return
            self._unparsed_upto[topic] = txid
        self.unparsed[topic] = self.unparsed.get(topic, 0) + 1
