"""Small trio helpers shared by the server, the replication links and the client."""

from __future__ import annotations

import errno
import traceback
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Final

import trio

#: what a connection that broke under a task raises: trio's stream errors (a reset, a
#: broken pipe or a TLS failure arrive as their ``__cause__``) and the OS's own
#: connection errors (``ConnectionResetError``, ``BrokenPipeError``, ...). A client
#: that goes away abruptly makes its reader and its writer raise these at once.
CONNECTION_ERRORS: Final = (trio.BrokenResourceError, trio.ClosedResourceError, ConnectionError)


def leaves_of(exc: BaseException) -> list[BaseException]:
    """The exceptions ``exc`` is made of: itself, or the leaves of an exception group
    (nested groups flattened), ``trio.Cancelled`` left out."""
    if not isinstance(exc, BaseExceptionGroup):
        return [] if isinstance(exc, trio.Cancelled) else [exc]
    return [leaf for leaf in _leaves(exc) if not isinstance(leaf, trio.Cancelled)]


def is_connection_error(exc: BaseException) -> bool:
    """Whether ``exc`` (an exception or a group of them) says only that a connection
    broke: every failure in it is one of :data:`CONNECTION_ERRORS` (``Cancelled`` does
    not count), and there is at least one. A group with anything else in it (a bug)
    is not."""
    leaves = leaves_of(exc)
    return bool(leaves) and all(isinstance(leaf, CONNECTION_ERRORS) for leaf in leaves)


def connection_error_words(exc: BaseException) -> str:
    """How a connection broke, in words for a log line: the OS error under the first
    failure (``connection reset by peer (ECONNRESET)``), else the failure itself."""
    leaves = leaves_of(exc) or [exc]
    seen: BaseException | None = leaves[0]
    for _ in range(8):  # the chain of causes is short; never follow a cycle for ever
        if seen is None:
            break
        if isinstance(seen, OSError) and seen.errno is not None:
            name = errno.errorcode.get(seen.errno, str(seen.errno))
            text = (seen.strerror or type(seen).__name__).lower()
            return f"{text} ({name})"
        seen = seen.__cause__ or seen.__context__
    first = leaves[0]
    return f"{type(first).__name__}: {first}" if str(first) else type(first).__name__


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
            raise leaves[0] from leaves[0].__cause__  # (its own cause kept, not the group)
        if expected and all(isinstance(leaf, expected) for leaf in leaves):
            chosen = next(leaf for kind in expected for leaf in leaves if isinstance(leaf, kind))
            for leaf in leaves:
                if leaf is not chosen:
                    # dropped unseen: its frames (the locals of a task that ended) need
                    # not outlive it in the group's reference cycles
                    traceback.clear_frames(leaf.__traceback__)
            raise chosen from chosen.__cause__
        raise
