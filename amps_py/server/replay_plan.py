"""Where a bookmark replay starts and ends, and what it skips (pure: journal lookups,
no trio, no I/O).

A bookmark ``<publisher>|<seq>|`` names a message. When the journal holds it, the
replay resumes after it. When it does not, but the journal knows the publisher (it
holds or held records of it), the bookmark still says exactly where the subscriber
stands for that publisher: it has every record of it up to ``seq``. That happens on
failover: a subscriber leaves instance A with the bookmark of a message that B has not
received yet, while B already holds that publisher's newer seqs (a failed-over
publisher sends new messages before it resends its older tail; replication
interleaves). Such a bookmark resumes at the *earliest record (txid) this instance
holds of that publisher with a seq above ``seq``*, or at "now" when it holds none yet,
and the subscription skips that publisher's records at or below ``seq`` wherever they
are (replayed, or arriving later): nothing of that publisher above ``seq`` is skipped,
nothing at or below it repeated. Records of other publishers are delivered from the
resume point on, as for any bookmark. See docs/GUARANTEES.md, "Replay".

A bookmark list (``a,b,c``, what a client's bookmark store sends: one bookmark per
publisher) resumes at the earliest of its points (held bookmarks, and the points above
found for known publishers), and skips, per publisher of the list, its records at or
below that publisher's seq. A bookmark of a publisher the instance does not know at all
has no point: when no bookmark of the list has one, ``bookmark_not_found`` decides
(``now``, the default; ``epoch``; ``fail``), as before.

Cost: a held bookmark is one index lookup; a known publisher's point is a search of
the bookmark index over that publisher's seqs above the bookmark
(:class:`txlog.reading.EarliestAbove`), which reads neither the journal's records nor
the entries below the seq, so it follows what the replay will send, not the journal's
length. The plan runs such searches up to :data:`PLAN_SEARCH_ENTRIES` index entries
in the subscribe handler; a longer one is finished by the replay task in steps.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Final

from txlog import EarliestAbove, Journal

from .bookmark_spec import BookmarkSpec, Point

__all__ = [
    "PLAN_SEARCH_ENTRIES",
    "BookmarkNotFound",
    "ReplayPlan",
    "plan_replay",
]

#: bookmark-index entries the subscribe handler reads to place bookmarks of known
#: publishers (about 2 µs each: a few milliseconds); the replay task reads the rest
PLAN_SEARCH_ENTRIES: Final = 2048
#: bookmarks of a list the not-found sentence names one by one
_NAMED: Final = 4


class BookmarkNotFound(Exception):
    """No bookmark of the subscribe is held here, with ``bookmark_not_found=fail``."""


@dataclass(frozen=True)
class ReplayPlan:
    """Where a bookmark replay starts and ends, what it skips, and what to tell the
    client.

    Attributes:
        start: replay the records after this txid (the replay task may lower it for
            the searches in ``searches``).
        end: the last txid to deliver (a range), or None (then go live).
        resumed_from: the bookmark the replay resumes after (the earliest of the
            requested ones that the journal holds), or "".
        not_found: when a requested bookmark is not in the journal, a sentence saying
            where the replay starts instead (and, for known publishers, what it skips);
            else "".
        skip: per publisher hash, the highest seq the subscriber already has: its
            records at or below it are never delivered (replayed or live). Empty for
            EPOCH, NOW and timestamps.
        searches: searches for a known publisher's earliest record above its seq that
            did not finish in the handler: the replay task finishes them and starts no
            later than just before each one's :attr:`EarliestAbove.earliest`.
    """

    start: int
    end: int | None
    resumed_from: str = ""
    not_found: str = ""
    skip: Mapping[int, int] = field(default_factory=dict)
    searches: tuple[EarliestAbove, ...] = ()


@dataclass
class _Placed:
    """Where the bookmarks of a list put the start, one bookmark at a time."""

    #: (txid, bookmark) of each held bookmark (or of the removal point)
    held: list[tuple[int, str]] = field(default_factory=list)
    #: the start each known publisher's bookmark asks for (its earliest record above
    #: the seq, less one, or "now"), when its search finished
    known: list[int] = field(default_factory=list)
    #: searches still running (their start is at most "now", and lower once done)
    searching: list[EarliestAbove] = field(default_factory=list)
    #: per not-held bookmark, how it was placed (for the not-found sentence)
    phrases: list[str] = field(default_factory=list)


def _place_bookmarks(
    journal: Journal, point: Point, inclusive: bool, last_txid: int, budget: int
) -> _Placed:
    """Each bookmark of ``point``: held (its txid), removed (everything held is after
    it), of a known publisher (its earliest record above the seq, searched within
    ``budget`` index entries in all), or of an unknown publisher (no point)."""
    placed = _Placed()
    for h, s in point.bookmarks:
        mark = f"{h}|{s}|"
        txid = journal.lookup_bookmark(h, s)
        if txid is not None:
            placed.held.append((min(txid - 1 if inclusive else txid, last_txid), mark))
            continue
        floor = journal.publisher_floor(h)
        if 0 < s <= floor:
            # older than what the journal keeps: everything still held comes after it
            placed.held.append((journal.removed_through, ""))
            continue
        last_seq = journal.publisher_last_seq(h)
        if last_seq == 0 and floor == 0:
            placed.phrases.append(f"{mark}: publisher unknown here")
            continue
        if last_seq <= s:
            # nothing of it above the seq yet: its later records arrive live
            placed.known.append(last_txid)
            placed.phrases.append(
                f"{mark}: not held, and no record of its publisher above seq {s} yet "
                f"(held up to seq {last_seq}): its records above seq {s} are delivered "
                "as they arrive"
            )
            continue
        search = journal.earliest_above(h, s, last_txid)
        if budget > 0:
            search.step(budget)
            budget -= search.entries_read + 1
        if search.done:
            placed.known.append(last_txid if search.earliest is None else search.earliest - 1)
        else:
            placed.searching.append(search)
        placed.phrases.append(
            f"{mark}: not held; resumed at the first record of its publisher above seq {s}"
        )
    return placed


def _not_found_sentence(point: Point, placed: _Placed, suffix: str) -> str:
    """What the processed and completed acks say about bookmarks not held."""
    if len(point.bookmarks) == 1:
        head = f"bookmark {placed.phrases[0]}"
    else:
        named = "; ".join(placed.phrases[:_NAMED])
        more = len(placed.phrases) - _NAMED
        if more > 0:
            named += f"; and {more} more not held"
        head = f"bookmark list: {named}"
    return f"{head}; {suffix}"


def _skips(point: Point, inclusive: bool) -> dict[int, int]:
    """Per publisher of the list, the highest seq the subscriber has (the lowest, if
    a publisher is named twice: nothing it lacks is skipped)."""
    skip: dict[int, int] = {}
    for h, s in point.bookmarks:
        have = s - 1 if inclusive else s
        skip[h] = min(skip.get(h, have), have)
    return skip


def _resolve_bookmarks(
    journal: Journal,
    point: Point,
    inclusive: bool,
    last_txid: int,
    not_found: str,
    budget: int,
) -> ReplayPlan:
    """The start of a replay from a bookmark list (``end`` left None)."""
    placed = _place_bookmarks(journal, point, inclusive, last_txid, budget)
    skip = _skips(point, inclusive)
    searching = tuple(placed.searching)
    known = bool(placed.known or placed.searching)
    if placed.held and not known:
        # as AMPS: the earliest held bookmark (one of an unknown publisher has no point).
        # Every bookmark is held: nothing is skipped, as before (the client drops the
        # repeats of a list, as its bookmark store does; the HA client's
        # sow_and_subscribe resumption reads them to order the records it holds)
        txid, bookmark = min(placed.held)
        return ReplayPlan(txid, None, bookmark, "", {})
    if not placed.held and not_found != "now":
        if not_found == "fail":
            raise BookmarkNotFound()
        asked = ",".join(f"{h}|{s}|" for h, s in point.bookmarks)
        sentence = (
            f"bookmark {asked} is not in this instance's journal; replaying from the "
            "start (bookmark_not_found=epoch)"
        )
        if known:
            sentence += "; records at or below the seq of each bookmark's publisher are skipped"
        return ReplayPlan(0, None, "", sentence, skip)
    if not placed.held and not known:
        asked = ",".join(f"{h}|{s}|" for h, s in point.bookmarks)
        return ReplayPlan(
            last_txid,
            None,
            "",
            (
                f"bookmark {asked} is not in this instance's journal; starting with new "
                "messages (bookmark_not_found=now, the default; use epoch to replay "
                "everything held, or fail to refuse)"
            ),
            skip,
        )
    starts = [txid for txid, _ in placed.held] + placed.known
    if searching:
        starts.append(last_txid)
    start = min(starts)
    resumed_from = min(placed.held)[1] if placed.held and min(placed.held)[0] == start else ""
    suffix = "replay starts at the earliest point of the list; each publisher's records "
    suffix += "at or below its seq are skipped"
    if len(point.bookmarks) == 1:
        suffix = "its records at or below that seq are skipped (bookmark_not_found=now)"
        if start == last_txid and not searching:
            suffix = f"starting with new messages; {suffix}"
    return ReplayPlan(
        start, None, resumed_from, _not_found_sentence(point, placed, suffix), skip, searching
    )


def _resolve_end(journal: Journal, point: Point, inclusive: bool, last_txid: int) -> int | None:
    """The last txid to deliver for a range end, or None for "never ends"."""
    if point.kind == "epoch":
        return 0
    if point.kind == "now":
        return last_txid
    if point.kind == "time":
        return journal.txid_before_time(point.time_us)
    found = [journal.lookup_bookmark(h, s) for h, s in point.bookmarks]
    txids = [t for t in found if t is not None]
    if not txids:
        # an end older than what the journal keeps: nothing held is before it
        return journal.removed_through if _removed(journal, point) else None
    end = max(txids)
    return end if inclusive else end - 1


def _removed(journal: Journal, point: Point) -> bool:
    """Whether a bookmark of ``point`` is one the journal had and removed (its seq is at
    or below what removal deleted of its publisher)."""
    return any(0 < s <= journal.publisher_floor(h) for h, s in point.bookmarks)


def plan_replay(
    journal: Journal,
    spec: BookmarkSpec,
    committed_txid: int,
    not_found: str,
    search_budget: int | None = None,
) -> ReplayPlan:
    """Where a replay starts (exclusive txid), ends (inclusive txid or None), and what
    it skips per publisher (see the module doc).

    Runs in the session's handler, before the processed ack, so a bookmark that is not
    found with ``bookmark_not_found=fail`` fails the subscribe command itself. Cheap:
    index lookups, at most ``search_budget`` (default :data:`PLAN_SEARCH_ENTRIES`)
    bookmark-index entries of searches (the rest is left in
    :attr:`ReplayPlan.searches`), plus at most one time-index step of records.

    Raises:
        BookmarkNotFound: no bookmark of the list is held and not_found is fail.
        CorruptRecord: a damaged journal page on the way (an index or a record).
    """
    start = spec.start
    if start.kind == "epoch":
        plan = ReplayPlan(0, None)
    elif start.kind == "now":
        now = committed_txid - 1 if spec.start_inclusive and committed_txid > 0 else committed_txid
        plan = ReplayPlan(now, None)
    elif start.kind == "time":
        plan = ReplayPlan(min(journal.txid_before_time(start.time_us), committed_txid), None)
    else:
        budget = PLAN_SEARCH_ENTRIES if search_budget is None else search_budget
        plan = _resolve_bookmarks(
            journal, start, spec.start_inclusive, committed_txid, not_found, budget
        )
        if spec.start_inclusive:
            plan = ReplayPlan(
                plan.start, None, "", plan.not_found, plan.skip, plan.searches
            )  # the replay includes it: it resumes before it
    if spec.end is None:
        return plan
    end = _resolve_end(journal, spec.end, spec.end_inclusive, committed_txid)
    return ReplayPlan(plan.start, end, plan.resumed_from, plan.not_found, plan.skip, plan.searches)
