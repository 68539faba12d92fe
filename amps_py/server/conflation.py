"""Conflated subscriptions: at most one message per key per interval, the latest.

AMPS's "Conflated Subscriptions": a subscription with option ``conflation=<interval>``
has its messages held; the first message of a key starts that key's interval, later
messages of the key replace the held one, and when the interval is over the latest
is delivered. The next message of the key starts a new interval. So a subscriber
gets no more than one message per key per interval, and each is the newest one the
interval saw. The key is the values at the ``conflation_key`` paths
(``conflation_key=[/sym,/venue]``), or, without it, the message's SOW key: then the
topic must be a SOW topic (an exact name), or no key can be determined and the
subscription is refused.

This module decides, the session delivers: :class:`Conflator` takes items and
``now`` and says what is due and when the next is (aioquic's ``get_timer`` /
``handle_timer`` shape); :mod:`amps_py.server.conflating` runs it with trio.

Pure: no trio, no I/O.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass
from typing import Final, Generic, TypeVar

from amps_py import reasons
from amps_py.filters.context import DEFAULT_CONTEXT
from amps_py.filters.paths import Getter
from amps_py.message_types import JSON
from amps_py.protocol.server.commands import CommandFailed
from amps_py.sow.keys import SowKeyError, path_getter
from amps_py.units import UnitError, parse_duration

__all__ = ["MAX_INTERVAL", "ConflationSpec", "Conflator", "conflation_spec"]

#: the longest conflation interval taken (a day): held messages live that long
MAX_INTERVAL: Final = 86_400.0

T = TypeVar("T")


class Conflator(Generic[T]):
    """Holds the latest item of each key until its interval is over.

    Args:
        interval: seconds from a key's first held item to its delivery (> 0).

    Every key's deadline is its first item's time plus the same interval, so keys
    fall due in the order they were first held: a FIFO, O(1) per item.
    """

    __slots__ = ("_held", "interval")

    def __init__(self, interval: float) -> None:
        if not interval > 0:
            raise ValueError(f"`interval` must be positive, got {interval!r}")
        self.interval = interval
        self._held: OrderedDict[Hashable, tuple[float, T]] = OrderedDict()

    def offer(self, key: Hashable, item: T, now: float) -> bool:
        """Hold ``item`` as the latest of ``key``, arrived at ``now``.

        Returns:
            True when nothing was held before (the caller's timer, idle until now,
            must wake for :meth:`next_deadline`).
        """
        held = self._held
        found = held.get(key)
        if found is not None:
            held[key] = (found[0], item)  # keeps its place: the deadline stays
            return False
        was_idle = not held
        held[key] = (now + self.interval, item)
        return was_idle

    def next_deadline(self) -> float | None:
        """When the next key falls due; None when nothing is held."""
        if not self._held:
            return None
        return next(iter(self._held.values()))[0]

    def due(self, now: float) -> list[T]:
        """The items whose interval is over at ``now`` (each key's latest), in the
        order their keys were first held; they are no longer held."""
        out: list[T] = []
        held = self._held
        while held:
            deadline, item = next(iter(held.values()))
            if deadline > now:
                break
            held.popitem(last=False)
            out.append(item)
        return out

    def clear(self) -> None:
        """Drop everything held (the subscription ended)."""
        self._held.clear()

    def __len__(self) -> int:
        return len(self._held)


def _json_document(payload: bytes) -> object | None:
    return JSON.document(payload)


@dataclass(frozen=True, slots=True)
class ConflationSpec:
    """What a subscription's ``conflation`` options ask for.

    ``paths`` are the ``conflation_key`` field paths; empty means the SOW key.
    """

    interval: float
    paths: tuple[str, ...] = ()
    getters: tuple[Getter, ...] = ()
    #: the payload as a document for the getters (its message type's reader)
    document: Callable[[bytes], object | None] = _json_document

    def key_of(self, topic: str, payload: bytes, sow_key: str) -> Hashable:
        """The key ``payload`` (of ``topic``) is conflated under.

        With ``conflation_key`` paths: the topic and the values at the paths (a
        missing field, or a payload that is not JSON, is NULL: such messages share
        the key, as they would share a NULL in a filter; other message types are read
        by :attr:`document`). Without: the topic and the
        SOW key; a message without one (which a SOW topic does not deliver) is its
        own key, so it is only delayed, never dropped.
        """
        if not self.getters:
            return (topic, sow_key) if sow_key else object()
        doc = self.document(payload)
        values = []
        for getter in self.getters:
            value = getter(doc, DEFAULT_CONTEXT)
            values.append(tuple(value) if type(value) is list else value)
        return (topic, tuple(values))


def conflation_spec(opts: Mapping[str, str]) -> ConflationSpec | None:
    """The conflation a subscription's options ask for; None without ``conflation``.

    ``conflation`` takes an AMPS interval (``500ms``, ``2s``, ``1m``; a bare number is
    seconds); ``conflation_key`` one field path or a bracketed list
    (``[/sym,/venue]``).

    Raises:
        CommandFailed: ``invalid options``: an interval that is not a positive
            duration of at most a day, a key path that is not a field path, or
            ``conflation_key`` without ``conflation``.
    """
    raw = opts.get("conflation")
    raw_key = opts.get("conflation_key")
    if raw is None:
        if raw_key is not None:
            raise CommandFailed(
                reasons.INVALID_OPTIONS,
                "conflation_key needs conflation=<interval> too, e.g. "
                "conflation=1s,conflation_key=[/id]",
            )
        return None
    try:
        interval = parse_duration(raw)
    except UnitError:
        interval = -1.0
    if not 0 < interval <= MAX_INTERVAL:
        raise CommandFailed(
            reasons.INVALID_OPTIONS,
            f"conflation must be an interval above 0 and at most 1d, like 500ms or 2s; got {raw!r}",
        )
    if raw_key is None:
        return ConflationSpec(interval)
    paths = _key_paths(raw_key)
    try:
        getters = tuple(path_getter(p) for p in paths)
    except SowKeyError:
        getters = ()
    if not paths or len(getters) != len(paths):
        raise CommandFailed(
            reasons.INVALID_OPTIONS,
            f"conflation_key must be field paths like [/id] or [/sym,/venue]; got {raw_key!r}",
        )
    return ConflationSpec(interval, tuple(paths), getters)


def _key_paths(raw: str) -> Sequence[str]:
    text = raw.strip()
    if text.startswith("[") and text.endswith("]"):
        text = text[1:-1]
    return [p.strip() for p in text.split(",") if p.strip()]
