"""Where amps_py opens TCP connections and listeners: trio's sockets, unless a task
tree runs on another network (the simulator's, docs/SIMULATION.md).

The server's transports, replication's outgoing links and the client call
:func:`open_tcp_stream` / :func:`open_tcp_listeners` here instead of trio's. A
network is chosen per task tree with :func:`using` (a context variable, inherited by
the tasks started inside): the simulator runs each instance's tasks on its host's
view of the simulated network. What comes back duck-types the parts of
``trio.SocketStream`` / ``trio.SocketListener`` amps_py uses (the stream methods,
``socket.getpeername``, ``socket.getsockname``, ``socket.setsockopt``).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any, Protocol, cast

import trio

__all__ = ["Network", "open_tcp_listeners", "open_tcp_stream", "using"]


class Network(Protocol):
    """What a network offers: trio's two TCP entry points."""

    async def open_tcp_stream(self, host: str, port: int) -> Any: ...

    async def open_tcp_listeners(self, port: int, *, host: str | None = None) -> Sequence[Any]: ...


class _TrioNetwork:
    """The real one."""

    async def open_tcp_stream(self, host: str, port: int) -> trio.SocketStream:
        return await trio.open_tcp_stream(host, port)

    async def open_tcp_listeners(
        self, port: int, *, host: str | None = None
    ) -> list[trio.SocketListener]:
        return await trio.open_tcp_listeners(port, host=host)


_TRIO: Network = _TrioNetwork()
_CURRENT: ContextVar[Network | None] = ContextVar("amps_py_network", default=None)


def _current() -> Network:
    return _CURRENT.get() or _TRIO


@contextmanager
def using(network: Network) -> Iterator[None]:
    """Within the block (and in the tasks started inside it), connections and
    listeners are opened on ``network``."""
    token = _CURRENT.set(network)
    try:
        yield
    finally:
        _CURRENT.reset(token)


async def open_tcp_stream(host: str, port: int) -> trio.SocketStream:
    """``trio.open_tcp_stream`` on the current network."""
    return cast(trio.SocketStream, await _current().open_tcp_stream(host, port))


async def open_tcp_listeners(port: int, *, host: str | None = None) -> list[trio.SocketListener]:
    """``trio.open_tcp_listeners`` on the current network."""
    found = await _current().open_tcp_listeners(port, host=host)
    return cast(list[trio.SocketListener], list(found))
