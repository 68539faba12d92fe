"""The SOW expiry sweeper: removes expired records and tells who asked.

Every :data:`SWEEP_INTERVAL` seconds (and once as soon as the instance serves, so
records that expired while it was down, or while a store was rebuilt from the
journal, go at once) each topic whose records can expire gives up the records whose
expiry time has passed, in batches of :data:`SWEEP_BATCH` (the event loop runs
between batches). For each removed record:

- subscriptions with option ``oof`` that the record matched get an ``oof`` message,
  reason ``expired`` (the path of a ``sow_delete``'s ``deleted`` oofs);
- actions ``On`` ``amps-action-on-sow-expire-message`` for its topic run, with
  ``AMPS_TOPIC``, ``AMPS_DATA``, ``AMPS_DATA_LENGTH``, ``AMPS_REASON``
  (``time_limit``), ``AMPS_CORRELATION_ID`` and amps-py's ``AMPS_SOW_KEY``.

Expiry is not journaled: each instance applies it to its own store, from the expiry
times the replicated records give (see :mod:`amps_py.server.sowing`). Reads skip an
expired record before the sweeper removes it, so how late a sweep runs only decides
when the ``oof`` goes out.

:func:`sweep` is the step, synchronous and with ``now`` passed in (tests drive it on
a fake clock); :func:`run_sow_expiry` is the task the instance starts.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Final

import trio

from amps_py import events
from amps_py.sow.store import SowEntry, SowStoreError

from .sowing import Removed, SowState

log = logging.getLogger("amps_py.server.sow")

#: seconds between sweeps
SWEEP_INTERVAL: Final = 1.0
#: records removed per topic per write
SWEEP_BATCH: Final = 1000
#: the On module that runs for each expired record, as ``fire_action`` names it
EXPIRE_EVENT: Final = "sow-expire-message"
#: AMPS_REASON of an expiry by time (AMPS's spelling)
TIME_LIMIT: Final = "time_limit"

OutOfFocus = Callable[[list[Removed]], None]
FireAction = Callable[[str, dict[str, str]], None]


def sweep(state: SowState, now_us: int, limit: int = SWEEP_BATCH) -> tuple[list[Removed], bool]:
    """Remove up to ``limit`` expired records (expiry time at or before ``now_us``) of
    each expiring topic. Returns what went, per topic, and whether any topic may have
    more to remove now (it gave up a full batch).

    Raises:
        SowStoreError: a store could not be read or written (nothing of that topic
            was removed).
    """
    removed: list[Removed] = []
    more = False
    for sow in state.expiring:
        gone = state.expire(sow, now_us, limit)
        if gone:
            more = more or len(gone) >= limit
            removed.extend(state.removals(sow, gone, "expired"))
    return removed, more


def action_variables(topic: str, entry: SowEntry) -> dict[str, str]:
    """The variables of an ``amps-action-on-sow-expire-message`` run for ``entry``."""
    return {
        "AMPS_TOPIC": topic,
        "AMPS_DATA": entry.payload.decode("utf-8", errors="replace"),
        "AMPS_DATA_LENGTH": str(len(entry.payload)),
        "AMPS_REASON": TIME_LIMIT,
        "AMPS_CORRELATION_ID": entry.correlation_id,
        "AMPS_SOW_KEY": entry.key,
    }


def announce(removed: list[Removed], out_of_focus: OutOfFocus, fire_action: FireAction) -> None:
    """Send the ``oof`` messages of expired records and fire their actions."""
    if not removed:
        return
    out_of_focus(removed)
    for gone in removed:
        for entry in gone.entries:
            fire_action(EXPIRE_EVENT, action_variables(gone.topic, entry))
        log.debug("SOW topic %s: %d record(s) expired", gone.topic, len(gone.entries))


def sweep_and_announce(
    state: SowState,
    out_of_focus: OutOfFocus,
    fire_action: FireAction,
    now_us: int,
    limit: int = SWEEP_BATCH,
) -> bool:
    """One :func:`sweep` at ``now_us`` and its announcements; True when there may be
    more to remove now. A store that fails is logged (the next sweep tries again)."""
    try:
        removed, more = sweep(state, now_us, limit)
    except SowStoreError as exc:
        log.error(
            "SOW expiry: expired records could not be removed (the next sweep tries again): %s",
            exc,
            extra=events.extra(events.SOW_EXPIRY_FAILED),
        )
        return False
    announce(removed, out_of_focus, fire_action)
    return more


async def run_sow_expiry(
    state: SowState,
    out_of_focus: OutOfFocus,
    fire_action: FireAction,
    *,
    interval: float = SWEEP_INTERVAL,
    limit: int = SWEEP_BATCH,
) -> None:
    """Sweep ``state``'s expiring topics now and every ``interval`` seconds, until
    cancelled (times by ``state.clock``)."""
    while True:
        while sweep_and_announce(state, out_of_focus, fire_action, state.now_us(), limit):
            await trio.lowlevel.checkpoint()  # a large backlog: let the loop run between
        await trio.sleep(interval)
