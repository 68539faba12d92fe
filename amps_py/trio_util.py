"""Small trio helpers shared by the server, the replication links and the client."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import trio


def _leaves(group: BaseExceptionGroup[BaseException]) -> list[BaseException]:
    out: list[BaseException] = []
    for exc in group.exceptions:
        if isinstance(exc, BaseExceptionGroup):
            out.extend(_leaves(exc))
        else:
            out.append(exc)
    return out


@asynccontextmanager
async def unwrapping_groups(
    expected: tuple[type[BaseException], ...] = (),
) -> AsyncIterator[None]:
    """Re-raise a lone exception out of a nursery's ExceptionGroup.

    trio wraps every nursery failure in an ExceptionGroup; when exactly one task failed,
    callers want that exception itself (``except LinkError:``). Put this outside the
    nursery: ``async with unwrapping_groups(), trio.open_nursery() as nursery:``.

    ``trio.Cancelled`` does not count: when one task fails while an enclosing scope is
    being cancelled, the others end with Cancelled, and the failure is still the lone
    exception worth raising (the enclosing scope stays cancelled).

    ``expected``: failures that several tasks may hit at once for one cause (a
    connection that broke under both its reader and its writer). When every failure
    is one of these, the first of the kind listed first is raised; anything else
    keeps the whole group (a bug must stay visible).
    """
    try:
        yield
    except BaseExceptionGroup as group:
        _, failures = group.split(trio.Cancelled)
        if failures is None:
            raise
        leaves = _leaves(failures)
        if len(leaves) == 1:
            raise leaves[0] from None
        if expected and all(isinstance(leaf, expected) for leaf in leaves):
            for kind in expected:
                for leaf in leaves:
                    if isinstance(leaf, kind):
                        raise leaf from None
        raise
