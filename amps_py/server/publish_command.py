"""The ``publish`` (and ``delta_publish``) command of a client: checks, then the publish
path, then the acks.

:func:`on_publish` is the session's handler (synchronous, like every handler: a
publish is queued for the journal before the next frame is looked at). It refuses a
publish without a topic, with a topic or correlation id the journal cannot store, to a
topic the user may not write, or to a conflated topic (derived: publish to the SOW
topic under it); routes a publish to a queue's name to its DefaultPublishTarget; hands
it to the instance's publish path (:meth:`~amps_py.server.host.SessionHost.publish`);
and answers in the ack types asked for (:class:`~amps_py.protocol.server.acks.PublishAcks`),
with the persisted ack once the publisher's seqs are durable.

It takes the narrow :class:`PublishingSession`, not the session module.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Protocol

from amps_py import reasons
from amps_py.protocol import Frame
from amps_py.protocol.server.commands import (
    MAX_FIELD_BYTES,
    CommandFailed,
    ack_types,
    check_field_size,
)

from .publishing import Publisher

if TYPE_CHECKING:
    from amps_py.protocol.server.acks import PublishAcks

    from .durability import PublisherLedger
    from .host import SessionHost

__all__ = ["PublishingSession", "on_publish"]


class PublishingSession(Publisher, Protocol):
    """What a publish uses of the session it came on."""

    messages_in: int

    @property
    def instance(self) -> SessionHost: ...
    @property
    def ledger(self) -> PublisherLedger | None:
        """The publisher's ledger (None without a transaction log or a client name)."""
        ...

    @property
    def publish_acks(self) -> PublishAcks: ...
    @property
    def publish_routes(self) -> Mapping[str, str] | None:
        """Queue name -> DefaultPublishTarget (None when no queue has one)."""
        ...

    def require_entitled(self, topic: str, *, write: bool, action: str = "") -> None: ...

    def send_all(self, frames: list[bytes]) -> None: ...

    def persisted_progress(self, not_journaled: int = 0) -> None: ...


def on_publish(session: PublishingSession, frame: Frame) -> None:
    """Handle one ``publish`` / ``delta_publish``.

    Raises:
        CommandFailed: the publish is refused (the session answers with failure acks).
    """
    header = frame.header
    topic = header.get("t")
    if not topic or not isinstance(topic, str):
        raise CommandFailed(reasons.NO_TOPIC, "publish needs a topic (t)")
    if len(topic) > MAX_FIELD_BYTES // 4:
        check_field_size(topic, "topic", reasons.INVALID_TOPIC)
    cid = header.get("x")
    if cid is not None:
        check_field_size(str(cid), "correlation id (x)", reasons.INVALID_CORRELATION_ID)
    session.require_entitled(topic, write=True)
    instance = session.instance
    conflated = instance.sow.conflated
    if conflated and topic in conflated:
        underlying = conflated[topic].derived_from
        raise CommandFailed(
            reasons.INVALID_TOPIC,
            f"{topic!r} is a conflated topic, derived from SOW topic {underlying!r}: "
            f"publish to {underlying} instead",
        )
    routes = session.publish_routes
    if routes is not None:
        topic = routes.get(topic, topic)  # a queue's name: to its DefaultPublishTarget
    acks = ack_types(header)
    session.messages_in += 1
    ledger = session.ledger
    publish_acks = session.publish_acks
    seq = publish_acks.seq(header, acks, None if ledger is None else ledger.high)
    outcome = instance.publish(session, topic, seq, frame.payload, header)
    if outcome == "done" and ledger is not None:
        ledger.resent_durable(seq)
    if acks:
        session.send_all(publish_acks.accepted(header, acks, seq))
    if outcome == "done":
        journaled = instance.journals_topic(topic, session.message_type)
        if ledger is not None:
            session.persisted_progress(0 if journaled else seq)
        elif not journaled:
            # no ledger (no transaction log, or no client name): nothing is stored
            session.send_all(publish_acks.not_journaled(seq, session.pub_hash))
