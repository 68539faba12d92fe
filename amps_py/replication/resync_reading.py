"""The resync exchange as an outgoing destination runs it on this journal: what its
hello offers (:func:`offered_holdings`) and, once the peer's welcome answers, which
records it is proven to hold (:func:`read_plan`, reading on a worker thread). The
comparison itself is :mod:`.exchange`'s (pure).
"""

from __future__ import annotations

import logging
import struct
from typing import TYPE_CHECKING, Final

from amps_py import events, offload
from txlog import CorruptRecord
from txlog.holdings import Fingerprint, Holdings

from .exchange import (
    MAX_BUCKETS,
    ResyncPlan,
    Scan,
    floors,
    hello_holdings,
    partial_fingerprints,
    plan,
    scans,
)

if TYPE_CHECKING:
    from txlog import Journal

    from .link import Welcome

__all__ = ["offered_holdings", "read_plan", "scanned"]

#: the outgoing driver's logger: these lines are a destination's, as before they moved
log = logging.getLogger("amps_py.replication.outgoing")
_BOOKMARK_KEY = struct.Struct(">QQ")
#: records read from the journal per batch while scanning (as many as a data frame's)
READ_BATCH: Final = 8192


def offered_holdings(journal: Journal | None, destination: str) -> dict[str, int] | None:
    """What the hello of ``destination`` says ``journal`` holds (the resync exchange),
    or None when the journal keeps no holdings (or they cannot be read)."""
    if journal is None or not journal.holdings_valid:
        return None
    try:
        mine = journal.holdings()
    except CorruptRecord as exc:
        log.warning(
            "replication to %s: this journal's holdings cannot be read (%s); a peer "
            "without a cursor is resent everything",
            destination,
            exc,
            extra=events.extra(events.REPLICATION_HOLE),
        )
        return None
    return None if mine is None else hello_holdings(mine)


async def read_plan(
    journal: Journal | None, welcome: Welcome, destination: str
) -> ResyncPlan | None:
    """The resync of ``destination``, a peer without a usable cursor that answered the
    exchange: its holdings compared with ``journal``'s (read on a worker thread). None
    when the journal's cannot be read: everything is resent."""
    reported = welcome.holdings
    if journal is None or reported is None:
        return None

    def read() -> ResyncPlan | None:
        compared = journal.holdings(list(reported), MAX_BUCKETS, floors(reported))
        every = journal.holdings()
        if compared is None or every is None:
            return None
        mine = Holdings(compared.through, {**every.origins, **compared.origins})
        partial = scanned(journal, scans(reported, mine), mine.through)
        return plan(reported, mine, welcome.name, partial)

    try:
        found = await offload.run_sync(read)
    except CorruptRecord as exc:
        log.warning(
            "replication to %s: this journal's holdings cannot be read (%s); "
            "resending everything it replicates to %s",
            destination,
            exc,
            welcome.name,
            extra=events.extra(events.REPLICATION_HOLE),
        )
        return None
    if found is not None and found.held:
        proven = ", ".join(f"{o} below {t}" for o, t in sorted(found.proven.items()))
        log.info(
            "replication to %s: no usable cursor, but %s is proven to hold %d of the "
            "records journaled here (of origin txids %s): resuming after txid %d, "
            "without those",
            destination,
            welcome.name,
            found.held,
            proven,
            found.after,
            extra=events.extra(events.REPLICATION_CONNECTED),
        )
    return found


def scanned(journal: Journal, wanted: list[Scan], through: int) -> dict[str, Fingerprint]:
    """The fingerprints of the records :func:`.exchange.scans` asks for, read from
    ``journal`` up to ``through`` (blocking: call it on a worker thread). A damaged
    record on the way leaves them all out: those origins are then compared at their
    cuts only."""
    if not wanted:
        return {}
    origins = {s.origin for s in wanted}
    found: list[tuple[str, int, bytes]] = []
    after = min(s.after for s in wanted)
    while after < through:
        batch, damage = journal.read_route_views(after, READ_BATCH, through)
        if damage is not None:
            return {}
        if not batch:
            break
        for view in batch:
            if view.origin in origins:
                found.append((view.origin, view.origin_txid, _bookmark_key(view.bookmark)))
        after = batch[-1].txid
    return partial_fingerprints(wanted, found)


def _bookmark_key(bookmark: str) -> bytes:
    """The journal's bookmark index key (publisher hash, seq) of ``pub|seq|``."""
    pub, seq, _ = bookmark.split("|", 2)
    return _BOOKMARK_KEY.pack(int(pub), int(seq))
