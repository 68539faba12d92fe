"""What an HA ``sow_and_subscribe`` handed to the application, and how it resumes
after a reconnect without handing anything over twice or leaving anything out
(pure: no trio, no I/O; :mod:`amps_py.client.ha_sow` drives it).

The application holds a *view*: per record (topic and SOW key), the version it was
last given, a version being the message's bookmark ``<publisher hash>|<seq>|`` (the
same on every instance of a fabric). :class:`SowView` keeps it, with the highest seq
given of each publisher (``seen``).

After a reconnect the subscription is resumed by a bookmark replay, not by a new
snapshot: ``subscribe`` with ``bm`` = every publisher's highest seq given
(:meth:`SowView.resume_bookmark`). The server replays from the earliest of those it
holds, then goes live. :class:`Resumption` takes that stream in order and decides,
message by message:

* a message at or below its publisher's highest seq given is already reflected in
  the view (given itself, or overtaken by something given later: a publisher's
  messages are in seq order on every instance) and is dropped;
* a newer message of a record whose version the view holds from *another* publisher
  may be older than that version (superseded before the snapshot was taken, and
  replayed because the replay starts before it). The replay's order tells: it is
  held back until the view's version of that record comes by in the replay (then
  what was held back was older, and is dropped) or a later message of that version's
  publisher comes by, or the replay ends, without it (then the version lies before
  the replay's start, and what was held back is newer, and is handed over in its
  order). A newer message of a record held from the *same* publisher, or of a record
  not held, is handed over at once;
* an ``oof`` that arrives during the replay (the server sends them live) comes from a
  delete that happened after everything replayed: it is handed over at the end of the
  replay, so a replayed message of that record cannot bring it back.

Deletes are not replayed (the journal's delete records are no messages), and a
record that left the subscription's filter while the client was away simply stops
being replayed; so once the replay reached the live stream, the subscription's
records are queried once (``sow``) and :func:`reconcile` compares them with the view:
a record the view holds in another version is handed over as an update (flagged a
possible duplicate if its publisher's seq was given before), and a record the view
holds that the server no longer has is reported as an ``oof``. A record a live message
touched since the query was sent is left alone (the live stream is newer).
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Final, Generic, TypeVar

__all__ = [
    "Key",
    "Reconciled",
    "Resumption",
    "SowView",
    "Version",
    "reconcile",
    "version_of",
]

#: a record of the view: (topic, SOW key)
Key = tuple[str, str]
#: a message's place in its publisher's sequence: (publisher hash, seq)
Version = tuple[int, int]

M = TypeVar("M")
R = TypeVar("R")

_BOOKMARK: Final = re.compile(r"([0-9]{1,20})\|([0-9]{1,20})\|")


def version_of(bookmark: str) -> Version | None:
    """``(publisher hash, seq)`` of a message's bookmark, or None when it is not the
    bookmark of one message (empty, a timestamp, a list)."""
    m = _BOOKMARK.fullmatch(bookmark) if bookmark else None
    if m is None:
        return None
    return int(m[1]), int(m[2])


class SowView:
    """What the application was given: the version of each record it holds and, per
    publisher, the highest seq given.

    Attributes:
        held: record -> the version of the last message given for it (None when that
            message had no bookmark); a record that left (``oof``) is not held.
        seen: publisher hash -> the highest seq given.
    """

    def __init__(self) -> None:
        self.held: dict[Key, Version | None] = {}
        self.seen: dict[int, int] = {}

    def __bool__(self) -> bool:
        """Whether anything was given (with a version, or for a record)."""
        return bool(self.held or self.seen)

    def given(self, key: Key | None, version: Version | None) -> None:
        """A message (of record ``key``, if it has one) was handed over."""
        if version is not None:
            pub, seq = version
            if seq > self.seen.get(pub, 0):
                self.seen[pub] = seq
        if key is not None:
            self.held[key] = version

    def left(self, key: Key) -> None:
        """An ``oof`` for record ``key`` was handed over: the view no longer holds it."""
        self.held.pop(key, None)

    def reflects(self, version: Version) -> bool:
        """Whether the message ``version`` is in the view already: given, or overtaken
        by a later message of its publisher that was given."""
        return version[1] <= self.seen.get(version[0], 0)

    def resume_bookmark(self) -> str:
        """The ``bm`` to resume with: each publisher's highest seq given, as a comma
        list in publisher order; "" when no message with a bookmark was given."""
        return ",".join(f"{pub}|{seq}|" for pub, seq in sorted(self.seen.items()))


@dataclass(frozen=True)
class _Out(Generic[M]):
    """A message about to be handed over, with its arrival order."""

    order: int
    message: M
    key: Key | None
    version: Version | None
    oof: bool


@dataclass
class _Waiting(Generic[M]):
    """Messages of one record held back until the replay shows whether the view's
    version of it comes before or after them."""

    publisher: int
    seq: int
    messages: list[tuple[int, M, Version | None]] = field(default_factory=list)


class Resumption(Generic[M]):
    """One resumption by bookmark replay of a :class:`SowView` (see the module doc).

    Feed it the resubscription's stream in order: :meth:`message` for each message,
    :meth:`oof` for each ``oof``, :meth:`seam` when the replay reached the live stream
    (the ``completed`` ack). Each returns the messages to hand over now, in order, and
    updates the view as it hands them over.

    Attributes:
        live: the seam has passed.
        duplicates: messages dropped as already in the view.
        superseded: messages dropped as older than the view's version of their record.
    """

    def __init__(self, view: SowView) -> None:
        self.view = view
        self.live = False
        self.duplicates = 0
        self.superseded = 0
        self._order = itertools.count()
        #: records whose version in the view the replay has passed (newer from here)
        self._passed: set[Key] = set()
        self._waiting: dict[Key, _Waiting[M]] = {}
        #: ``oof`` messages that came during the replay
        self._deferred: list[_Out[M]] = []

    def message(self, message: M, key: Key | None, version: Version | None) -> list[M]:
        """A publish of the resubscription (replayed, or live after the seam): what to
        hand over now."""
        out: list[_Out[M]] = []
        if version is not None and not self.live:
            self._resolve(version, out)
        view = self.view
        if version is not None and view.reflects(version):
            self.duplicates += 1
            if key is not None and view.held.get(key) == version:
                self._passed.add(key)
            return self._hand(out)
        if not self.live and key is not None and self._must_wait(key, version):
            waiting = self._waiting.get(key)
            if waiting is None:
                held = view.held[key]
                assert held is not None
                waiting = self._waiting[key] = _Waiting(held[0], held[1])
            waiting.messages.append((next(self._order), message, version))
            return self._hand(out)
        out.append(_Out(next(self._order), message, key, version, False))
        return self._hand(out)

    def oof(self, message: M, key: Key) -> list[M]:
        """An ``oof`` of the resubscription: handed over now when live, else at the
        seam; the view stops holding ``key`` when it is handed over."""
        if self.live:
            self.view.left(key)
            return [message]
        self._deferred.append(_Out(next(self._order), message, key, None, True))
        return []

    def seam(self) -> list[M]:
        """The replay reached the live stream: what was held back is handed over (each
        record's version in the view lies before the replay's start, so what waited is
        newer), then the ``oof`` messages deferred, all in arrival order."""
        self.live = True
        out: list[_Out[M]] = []
        for key, waiting in self._waiting.items():
            out.extend(_Out(order, m, key, v, False) for order, m, v in waiting.messages)
        self._waiting.clear()
        out.extend(self._deferred)
        self._deferred.clear()
        return self._hand(out)

    def _must_wait(self, key: Key, version: Version | None) -> bool:
        """Whether a new message of ``key`` must wait: the view holds ``key`` from
        another publisher, and the replay has not shown yet which comes first (or
        earlier messages of ``key`` wait already: they keep their order)."""
        if key in self._waiting:
            return True
        if key in self._passed:
            return False
        held = self.view.held.get(key)
        if held is None:
            return False
        return version is None or held[0] != version[0]

    def _resolve(self, version: Version, out: list[_Out[M]]) -> None:
        """The replay reached ``version``: settle every waiting record whose version in
        the view is of that publisher and not after it."""
        pub, seq = version
        settled = [k for k, w in self._waiting.items() if w.publisher == pub and w.seq <= seq]
        for key in settled:
            waiting = self._waiting.pop(key)
            self._passed.add(key)
            if waiting.seq == seq:
                # the view's version itself came by: what waited came before it
                self.superseded += len(waiting.messages)
            else:
                # a later message of that publisher came first: the view's version
                # lies before the replay's start, and what waited is newer
                out.extend(_Out(order, m, key, v, False) for order, m, v in waiting.messages)

    def _hand(self, out: list[_Out[M]]) -> list[M]:
        """Hand ``out`` over in arrival order, bringing the view up to date."""
        out.sort(key=lambda item: item.order)
        for item in out:
            if item.oof:
                assert item.key is not None
                self.view.left(item.key)
            else:
                self.view.given(item.key, item.version)
                if item.key is not None:
                    self._passed.add(item.key)
        return [item.message for item in out]


@dataclass(frozen=True)
class Reconciled(Generic[R]):
    """What :func:`reconcile` found.

    Attributes:
        updates: records to hand over as updates, each with whether it may have been
            handed over before (its publisher's seq was given already).
        gone: records the view held that the server no longer has for this
            subscription (deleted, expired, or out of its filter).
    """

    updates: list[tuple[R, bool]]
    gone: list[Key]


def reconcile(
    view: SowView,
    records: Iterable[tuple[Key, Version | None, R]],
    touched: set[Key],
    *,
    complete: bool,
) -> Reconciled[R]:
    """Compare the server's records of the subscription (``(key, version, record)``,
    from a ``sow`` query) with ``view`` and bring the view up to date.

    Args:
        touched: records a message handed over after the query was sent (or to be
            handed over: it arrived) concerned; left alone, the live stream is newer.
        complete: the view held every record of the subscription once (its first
            snapshot was whole, without ``top_n``); when False a record the view never
            held is not added (the caller asked for part of the topic).
    """
    updates: list[tuple[R, bool]] = []
    present: set[Key] = set()
    for key, version, record in records:
        present.add(key)
        if key in touched:
            continue
        if key in view.held:
            if view.held[key] == version:
                continue
        elif not complete:
            continue
        updates.append((record, version is not None and view.reflects(version)))
        view.given(key, version)
    gone = [key for key in view.held if key not in present and key not in touched]
    for key in gone:
        view.left(key)
    return Reconciled(updates, gone)
