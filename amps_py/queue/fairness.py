"""Fairness models: which of the subscriptions able to take a message gets it.

Pure functions over the subscriptions in subscription order. ``start`` is the
rotation point (the index after the last subscription picked); the caller keeps it.

- ``fast``: the first able subscription in subscription order (the earliest
  subscriber gets everything it has room for).
- ``round-robin``: the first able subscription from the rotation point on, so
  consecutive messages go to consecutive subscriptions.
- ``proportional``: the able subscription with the most free backlog, ties broken by
  rotation, so a subscription with a larger backlog takes more of the messages and
  equal subscriptions alternate.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from .model import QueueSub


def pick(
    model: str,
    subs: Sequence[QueueSub],
    start: int,
    able: Callable[[QueueSub], bool],
) -> int | None:
    """The index in ``subs`` of the subscription that gets the message, or ``None``
    when none is ``able`` to take it.

    Args:
        model: ``"fast"``, ``"round-robin"`` or ``"proportional"``.
        subs: the subscriptions, in subscription order.
        start: the rotation point (any int; taken modulo ``len(subs)``).
        able: whether a subscription can take the message now (matches it, and has
            free backlog where backlog applies).

    Raises:
        ValueError: an unknown model (build it through QueuePolicy, which checks it).
    """
    count = len(subs)
    if count == 0:
        return None
    if model == "fast":
        return next((i for i in range(count) if able(subs[i])), None)
    order = [(start + step) % count for step in range(count)]
    if model == "round-robin":
        return next((i for i in order if able(subs[i])), None)
    if model == "proportional":
        best: int | None = None
        best_free = -1
        for i in order:
            free = subs[i].free_backlog
            if free > best_free and able(subs[i]):
                best, best_free = i, free
        return best
    raise ValueError(f"unknown fairness model {model!r}: use fast, round-robin or proportional")
