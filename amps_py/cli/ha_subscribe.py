"""``amps-py subscribe`` on the HA client (a URI list, ``--store DIR``): print a
topic's messages across failovers, keeping in ``DIR/bookmarks`` which were printed so
that ``--resume`` continues after them, and on a queue acknowledge each once printed
(:func:`subscribe`)."""

from __future__ import annotations

import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final, TextIO

from amps_py.cli.ha import StoreMisuse, subscription_id
from amps_py.cli.ha_session import (
    client_log_on_stderr,
    closing,
    echo_err,
    first_logon,
    state_reporter,
)
from amps_py.cli.printing import RateLine, message_line
from amps_py.client import parse_uri

#: seconds ``subscribe`` waits for the first logon
SUBSCRIBE_CONNECT_TIMEOUT: Final = 30.0
#: said once, before the first server the HA client cannot use
_RETRY_NOTICE: Final = (
    "amps-py: retrying the URIs in turn until one accepts a logon (at first for up "
    f"to {SUBSCRIBE_CONNECT_TIMEOUT:g} s, after a lost connection for as long as it "
    "takes); Ctrl-C stops it"
)


async def subscribe(
    uris: list[str],
    topic: str,
    *,
    filter_: str | None,
    bookmark: str | None,
    resume: bool,
    options: str | None,
    count: int,
    timeout: float,
    raw: bool,
    name: str,
    store_dir: Path | None,
    logon_fields: Mapping[str, Any],
    ack: bool = False,
    ack_batch: int = 1,
    max_backlog: int | None = None,
) -> int:
    """Print the messages of ``topic`` as ``amps-py subscribe`` does, through the HA
    client; with a bookmark, each message is marked processed once it is printed and
    flushed. On a queue (``max_backlog``, ``ack``), each message is acknowledged once
    it is printed and flushed (``ack``), across failovers; at the end every
    acknowledgement is confirmed and a stderr line says how many. Returns how many
    were printed.

    Raises:
        StoreMisuse: ``--store`` without a position to start from, or a fresh start
            over a kept position.
        CommandError: the server refused the subscription.
        TimeoutError: no server accepted a logon in time, or --count messages did
            not come within --timeout.
        AMPSError: ``ack`` on a topic that is not a queue.
    """
    from amps_py.client import open_ha_client
    from amps_py.trio_util import unwrapping_groups

    start = "0" if resume else bookmark
    sub_id = subscription_id(topic, filter_) if store_dir is not None else None
    store = _bookmark_store(store_dir, start)
    with closing(store), client_log_on_stderr(_RETRY_NOTICE):
        if store is not None and sub_id is not None and not resume:
            _refuse_new_start_over_kept(store, sub_id, store_dir, topic)
        async with (
            unwrapping_groups(),
            open_ha_client(
                name,
                uris,
                bookmark_store=store,
                on_state=state_reporter(echo_err),
                ack_batch_size=ack_batch,
                **logon_fields,
            ) as ha,
        ):
            await first_logon(ha, uris, SUBSCRIBE_CONNECT_TIMEOUT)
            async with ha.subscribe(
                topic,
                filter=filter_,
                bookmark=start,
                options=options,
                sub_id=sub_id,
                max_backlog=max_backlog,
            ) as sub:
                _refuse_ack_off_queue(sub, ack, topic, ha.uri)
                printed, acked = await _print_messages(
                    sub,
                    parse_uri(uris[0]).message_type,
                    count=count,
                    timeout=timeout,
                    raw=raw,
                    processed=start is not None,
                    ack=ack,
                )
            if ack:
                await ha.flush_acks()
                echo_err(f"amps-py: acknowledged {acked} message(s) on {topic}")
    return printed


def _bookmark_store(store_dir: Path | None, start: str | None) -> Any:
    """The file bookmark store under ``store_dir`` (None without one).

    Raises:
        StoreMisuse: there is no bookmark to start from (neither --resume nor
            --bookmark).
    """
    from amps_py.client import FileBookmarkStore

    if store_dir is None:
        return None
    if start is None:
        raise StoreMisuse(
            "--store keeps the position of a bookmark subscription: add --resume "
            "(continue where the last run stopped; from the start of the journal the "
            "first time) or --bookmark BOOKMARK (start there)"
        )
    return FileBookmarkStore(store_dir / "bookmarks")


def _refuse_new_start_over_kept(
    store: Any, sub_id: str, store_dir: Path | None, topic: str
) -> None:
    """Raise :class:`StoreMisuse` when ``store`` keeps a position for ``sub_id``: a
    fresh start at --bookmark would lose it."""
    kept = store.resume_bookmark(sub_id)
    if kept:
        raise StoreMisuse(
            f"{store_dir} holds where an earlier run stopped on {topic} ({kept}); "
            "add --resume (instead of --bookmark) to continue from there, or give "
            "another --store directory to start at the bookmark"
        )


def _refuse_ack_off_queue(sub: Any, ack: bool, topic: str, uri: str | None) -> None:
    """Raise AMPSError for ``--ack`` on a subscription that is not to a queue (its
    subscribe ack reported no backlog)."""
    from amps_py.client import AMPSError

    if ack and sub.subscribes and sub.max_backlog is None:
        raise AMPSError(
            f"--ack acknowledges queue messages, and {topic!r} is not a queue on "
            f"{uri} (its subscribe ack reported no max_backlog); drop --ack, "
            "or give the queue's name"
        )


async def _print_messages(
    sub: Any,
    message_type: str,
    *,
    count: int,
    timeout: float,
    raw: bool,
    processed: bool,
    ack: bool,
) -> tuple[int, int]:
    """Print the messages of ``sub`` until ``count`` (0: no limit) are printed or none
    comes for ``timeout`` seconds (0: wait forever); each is marked ``processed`` and/or
    acknowledged (``ack``) once its line is flushed. Returns (printed, acknowledged).

    Raises:
        TimeoutError: ``count`` messages did not come in time.
        AMPSError: the subscription failed.
    """
    from amps_py.cli.progress import stderr_is_terminal

    out = sys.stdout
    n = acked = 0
    rate = RateLine(out, stderr_is_terminal())  # nothing extra when piped
    while not count or n < count:
        msg = await _next_message(sub, out, n, count, timeout)
        if msg is None:
            break
        n += 1
        out.write(message_line(msg, raw, message_type))
        if processed:
            out.flush()  # printed before it counts as processed
            msg.processed()
        if ack:
            out.flush()  # printed before it leaves the queue
            await msg.ack()
            acked += 1
        rate.tick(n)
    out.flush()
    return n, acked


async def _next_message(sub: Any, out: TextIO, n: int, count: int, timeout: float) -> Any:
    """The next message of ``sub``; None: stop (the subscription ended, or --timeout
    passed without --count)."""
    try:
        return await sub.get(timeout) if timeout else await sub.__anext__()
    except TimeoutError:
        out.flush()
        if count:
            raise TimeoutError(
                f"only {n} of {count} message(s) arrived: none came for {timeout:g} s"
            ) from None
        echo_err(f"amps-py: no message for {timeout:g} s; stopping after {n} message(s)")
        return None
    except StopAsyncIteration:
        out.flush()
        if sub.failure is not None:
            raise sub.failure from None
        return None
