"""Small trio helpers shared by the server, the replication links and the client."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager


@asynccontextmanager
async def unwrapping_groups() -> AsyncIterator[None]:
    """Re-raise a lone exception out of a nursery's ExceptionGroup.

    trio wraps every nursery failure in an ExceptionGroup; when exactly one task failed,
    callers want that exception itself (``except LinkError:``). Put this outside the
    nursery: ``async with unwrapping_groups(), trio.open_nursery() as nursery:``.
    """
    try:
        yield
    except BaseExceptionGroup as group:
        if len(group.exceptions) == 1:
            inner = group.exceptions[0]
            while isinstance(inner, BaseExceptionGroup) and len(inner.exceptions) == 1:
                inner = inner.exceptions[0]
            raise inner from None
        raise
