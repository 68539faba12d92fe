"""The handshake of an outgoing replication connection, after the hello: the peer's
welcome (or refusal), the checks of the welcome, and where the stream resumes.

* :func:`await_welcome`: the welcome, within :data:`~.dialing.HANDSHAKE_TIMEOUT`; a
  refusal raises :class:`RefusedByPeer`, a malformed answer a
  :class:`~.link.LinkError` the peer is told about;
* :func:`welcome_refusal` (pure): a welcome from the wrong Group, or from this
  instance itself, is refused;
* :func:`resync_point`: the downstream's cursor, if this journal still holds that
  record with that bookmark (or holds it damaged: a replication hole ended there);
  else the oldest record kept, or the start.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Final

import trio

from amps_py import events, reasons
from amps_py.config import DestinationConfig
from txlog import CorruptRecord

from .dialing import HANDSHAKE_TIMEOUT
from .link import LinkError, Refused, UpstreamLink, Welcome

if TYPE_CHECKING:
    from txlog import Journal

    from .mux import RoleStream

__all__ = ["RefusedByPeer", "await_welcome", "resync_point", "welcome_refusal"]

#: the outgoing driver's logger: these lines are a destination's, as before they moved
log = logging.getLogger("amps_py.replication.outgoing")

#: link errors in the handshake the peer is told about before the connection closes
TOLD_REASONS: Final = frozenset(
    {reasons.MALFORMED_WELCOME, reasons.NOT_A_REPLICATION_PEER, reasons.PROTOCOL_VIOLATION}
)


class RefusedByPeer(LinkError):
    """The peer answered the handshake with a refusal (validation, credentials, ...);
    ``str()`` is ``<what>: <reason> (<the peer's detail>)``."""

    def __init__(self, reason: str, detail: str, what: str) -> None:
        super().__init__(reason, detail)
        self.args = (f"{what}: {reason} ({detail})",)


async def await_welcome(
    stream: RoleStream, link: UpstreamLink, config: DestinationConfig, instance_name: str
) -> Welcome:
    """The peer's welcome to the hello just sent, checked (:func:`welcome_refusal`).

    Raises:
        RefusedByPeer: the peer refused the link.
        LinkError: the peer closed the connection, answered what is not a welcome (it
            is told why, when it can still hear it), or its welcome is refused here
            (it is told why).
        trio.TooSlowError: no answer within :data:`HANDSHAKE_TIMEOUT`.
    """
    try:
        welcome = await _welcome(stream, link)
    except LinkError as exc:
        if exc.reason in TOLD_REASONS:  # tell the peer why (it may be misconfigured)
            with trio.move_on_after(1):
                await stream.send_all(link.refuse(exc.reason, exc.detail, trio.current_time()))
        raise
    refusal = welcome_refusal(config, instance_name, welcome)
    if refusal is not None:
        await stream.send_all(link.refuse(refusal.reason, refusal.detail, trio.current_time()))
        raise refusal
    return welcome


async def _welcome(stream: RoleStream, link: UpstreamLink) -> Welcome:
    with trio.fail_after(HANDSHAKE_TIMEOUT):
        while True:
            frames = await stream.receive_frames()
            if not frames:
                raise LinkError(
                    reasons.CLOSED, "the peer closed the connection during the handshake"
                )
            for event in link.receive_frames(frames, trio.current_time()):
                if isinstance(event, Welcome):
                    return event
                if isinstance(event, Refused):
                    # logged by the caller, as a failed attempt (not every time)
                    what = (
                        "the peer refused validation (its log names each check)"
                        if event.reason == reasons.VALIDATION_FAILED
                        else "refused by the peer"
                    )
                    raise RefusedByPeer(event.reason, event.detail, what)


def welcome_refusal(
    config: DestinationConfig, instance_name: str, welcome: Welcome
) -> LinkError | None:
    """Why destination ``config`` of instance ``instance_name`` refuses ``welcome``
    (``group mismatch``, ``replicates to itself``), or None when it takes it."""
    if config.group is not None and welcome.group != config.group:
        return LinkError(
            reasons.GROUP_MISMATCH,
            f"destination {config.name} expects Group {config.group!r} but instance "
            f"{welcome.name!r} is in Group {welcome.group!r}; fix Destination/Group in "
            f"{instance_name}'s config or the peer's Group",
        )
    if welcome.name == instance_name:
        return LinkError(
            reasons.REPLICATES_TO_ITSELF,
            "the destination is this instance itself; fix Destination/Transport/InetAddr",
        )
    return None


def resync_point(
    name: str, welcome: Welcome, journal: Journal | None, *, exchange: bool = False
) -> int:
    """The txid after which destination ``name`` is sent this journal: the
    downstream's cursor if this journal still has that record with that bookmark (or
    holds it damaged, which is where a replication hole ended), the last removed txid
    if the cursor lies in removed journals, else 0: no usable cursor. Then everything
    is resent (logged as a full resync), unless ``exchange`` says the welcome answered
    the resync exchange (:mod:`.exchange`), which decides instead."""
    if welcome.cursor_txid <= 0:
        return 0
    assert journal is not None, "a destination runs only on an instance with a journal"
    if welcome.cursor_txid <= journal.removed_through:
        # its position lies in journals removed here (removal waited for its ack):
        # nothing to check it against, and nothing older to send anyway
        log.info(
            "replication to %s: the peer holds my stream up to txid %d, in journals "
            "removed here; sending from the oldest record kept (after txid %d)",
            name,
            welcome.cursor_txid,
            journal.removed_through,
            extra=events.extra(events.REPLICATION_CONNECTED),
        )
        return journal.removed_through
    try:
        rec = journal.get(welcome.cursor_txid) if welcome.cursor_txid <= journal.last_txid else None
    except CorruptRecord as exc:
        # the stream passed over a damaged record there (a replication hole, logged when
        # it was passed): its bookmark cannot be checked, and resending from the start
        # would only meet the same damage again
        log.warning(
            "replication to %s: the peer holds my stream up to txid %d, which this journal "
            "holds damaged (%s); resuming after it",
            name,
            welcome.cursor_txid,
            exc,
            extra=events.extra(events.REPLICATION_HOLE),
        )
        return welcome.cursor_txid
    if rec is None or rec.bookmark != welcome.cursor_bm:
        log.warning(
            "replication to %s: the peer holds my stream up to txid %d (%s), which this "
            "journal does not have; %s",
            name,
            welcome.cursor_txid,
            welcome.cursor_bm,
            "comparing what each holds instead"
            if exchange
            else "resending from the start of the journal",
            extra=events.extra(events.REPLICATION_RESYNC_FULL),
        )
        return 0
    return welcome.cursor_txid
