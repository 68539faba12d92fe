"""Opening the HA client: :func:`open_ha_client` makes an
:class:`~amps_py.client.ha.HAClient` and runs its connection loop for as long as the
block runs (see :mod:`amps_py.client.ha` for what the client does)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from typing import Any

import trio

from amps_py import offload
from amps_py.trio_util import unwrapping_groups

from .ha import HAClient, StateCallback
from .queue import DEFAULT_ACK_BATCH_SIZE, DEFAULT_ACK_TIMEOUT
from .store_api import BookmarkStore, PublishStore


@asynccontextmanager
async def open_ha_client(
    name: str,
    servers: Sequence[str] | Callable[[], str],
    *,
    publish_store: PublishStore | None = None,
    bookmark_store: BookmarkStore | None = None,
    heartbeat: float | None = None,
    reconnect_delay: float = 0.05,
    max_reconnect_delay: float = 5.0,
    connect_timeout: float = 10.0,
    on_state: StateCallback | None = None,
    ack_batch_size: int = DEFAULT_ACK_BATCH_SIZE,
    ack_timeout: float = DEFAULT_ACK_TIMEOUT,
    failover_timeout: float | None = None,
    **logon_fields: Any,
) -> AsyncIterator[HAClient]:
    """An :class:`HAClient` connecting in the background for as long as the block runs.

    Args:
        name: the client name, the same on every connection (the server identifies
            the publisher by it: it must be unique in the fabric).
        servers: equivalent URIs tried in turn, or a callable returning the URI to try.
        publish_store: keeps publishes until persisted (default: in memory).
        bookmark_store: keeps what bookmark subscriptions delivered and processed
            (default: in memory).
        heartbeat: seconds between server heartbeats; a server silent for two of them
            is dropped. None: no heartbeats.
        reconnect_delay: seconds waited after the first whole round of failed
            attempts (doubling each round).
        max_reconnect_delay: the cap on that wait.
        connect_timeout: seconds allowed for each connect and logon.
        on_state: called as ``on_state(state, detail)`` on each state change (see the
            module doc); an exception it raises is logged and ignored.
        ack_batch_size: queue acknowledgements sent in one command (default 1: each
            at once); see :meth:`HAClient.ack`.
        ack_timeout: seconds a partial batch of acknowledgements waits before it is
            sent (default 1.0).
        failover_timeout: give up when no server could be logged on to for this many
            seconds (from the start, or from the loss of a connection): the block
            ends with :class:`NoServerReachable`, naming each server and why its last
            attempt failed. None (the default): keep trying for as long as the block
            runs.
        logon_fields: further logon header fields (also ``ca_file`` and friends of
            :func:`open_client`).

    The block is entered at once, before any connection: publishes are stored and wait
    to be sent, subscriptions wait to be subscribed; :meth:`HAClient.wait_connected`
    waits for the first logon.

    Raises:
        ValueError: ``servers`` is empty or holds a malformed URI, or an argument is
            out of range.
        NoServerReachable: (from the block) ``failover_timeout`` ran out.
    """
    ha = HAClient(
        name,
        servers,
        publish_store=publish_store,
        bookmark_store=bookmark_store,
        heartbeat=heartbeat,
        reconnect_delay=reconnect_delay,
        max_reconnect_delay=max_reconnect_delay,
        connect_timeout=connect_timeout,
        on_state=on_state,
        ack_batch_size=ack_batch_size,
        ack_timeout=ack_timeout,
        failover_timeout=failover_timeout,
        **logon_fields,
    )
    # unwrapping_groups: the caller's exception comes out as itself, not in a group
    async with (
        _closing(ha, publish_store is None, bookmark_store is None),
        unwrapping_groups(),
        trio.open_nursery() as nursery,
    ):
        nursery.start_soon(ha._run)
        try:
            yield ha
        finally:
            nursery.cancel_scope.cancel()


@asynccontextmanager
async def _closing(
    ha: HAClient, own_publish_store: bool, own_bookmark_store: bool
) -> AsyncIterator[None]:
    """On exit: end every subscription iterator, sync both stores, close the ones made
    here (``own_*``)."""
    try:
        yield
    finally:
        for sub in list(ha._subs.values()):
            sub._end()
        with trio.CancelScope(shield=True):
            await offload.run_sync(ha.publish_store.sync)
            await offload.run_sync(ha.bookmark_store.sync)
        if own_publish_store:
            ha.publish_store.close()
        if own_bookmark_store:
            ha.bookmark_store.close()
