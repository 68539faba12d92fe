"""``amps-py publish`` on the HA client (a URI list, ``--store DIR``): publish through
it, resuming an unfinished run of a file from the store as :mod:`amps_py.cli.ha`
describes, and wait until everything is persisted (:func:`publish`)."""

from __future__ import annotations

import os
import stat
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import trio

from amps_py.cli.common import Pacer
from amps_py.cli.ha import FileRun, claim_store, finish_run, plan_file_run, read_run, write_run
from amps_py.cli.ha_session import (
    client_log_on_stderr,
    closing,
    echo_err,
    first_logon,
    state_reporter,
)


@dataclass
class Published:
    """What :func:`publish` did: ``sent`` new messages, the last seq, lines skipped."""

    sent: int = 0
    last: int = 0
    skipped: int = 0
    #: the instance acknowledged the last publish as not journaled (not stored)
    not_journaled: bool = False
    #: the seq before this run's first message
    first: int = 0
    #: the messages of this run the server refused (not stored): seq -> failure ack
    refused: dict[int, dict[str, Any]] = field(default_factory=dict)


async def publish(
    uris: list[str],
    topic: str,
    data: str | None,
    file_: Any,
    lines: Callable[[Any], AsyncIterator[tuple[bytes, int]]],
    *,
    name: str,
    store_dir: Path | None,
    timeout: float,
    logon_fields: Mapping[str, Any],
    explain_timeout: Callable[[str, str], Awaitable[None]],
    rate: float | None = None,
) -> Published:
    """Publish ``data`` or each non-blank line of ``file_`` (read with ``lines``)
    through the HA client, resuming a file run as :mod:`amps_py.cli.ha` says, and wait until
    everything is persisted.

    ``explain_timeout(message, uri)`` is awaited when the persisted acks do not come
    within ``timeout``: it raises the user's error (else the TimeoutError is raised).
    ``rate`` paces the lines sent (not the ones a resumed run skips) at most that many
    per second.

    Raises:
        StoreMisuse, OSError, TimeoutError, CommandError: as the CLI reports them.
    """
    from amps_py.client import FilePublishStore, open_ha_client
    from amps_py.trio_util import unwrapping_groups

    store = None
    if store_dir is not None:
        claim_store(store_dir, name)
        store = FilePublishStore(store_dir / "publish")
    done = Published()
    notice = (
        "amps-py: retrying the URIs in turn until one accepts a logon (for up to "
        f"{timeout:g} s, --timeout); Ctrl-C stops it"
    )
    with closing(store), client_log_on_stderr(notice):
        async with (
            unwrapping_groups(),
            open_ha_client(
                name,
                uris,
                publish_store=store,
                connect_timeout=timeout,
                on_state=state_reporter(echo_err),
                **logon_fields,
            ) as ha,
        ):
            await first_logon(ha, uris, timeout)
            run = await _plan_run(ha.publish_store, file_, store_dir, done)
            await _send_and_wait(
                ha,
                uris,
                topic,
                data,
                file_,
                lines,
                done,
                store_dir=store_dir,
                timeout=timeout,
                explain_timeout=explain_timeout,
                rate=rate,
            )
            if run is not None and store_dir is not None:
                finish_run(store_dir)
    return done


async def _plan_run(
    pstore: Any, file_: Any, store_dir: Path | None, done: Published
) -> FileRun | None:
    """The run of a regular ``file_`` to record in ``store_dir`` (None: no store, or
    not a regular file), with ``done.skipped`` set to the lines a resumed run skips;
    a new run is recorded before its first line is stored.

    Raises:
        StoreMisuse: as :func:`amps_py.cli.ha.plan_file_run` (also for standard input
            over an unfinished run of a file).
    """
    run: FileRun | None = None
    regular = file_ is not None and _is_regular(file_)
    if store_dir is not None and not regular:
        unfinished = read_run(store_dir)
        if unfinished is not None:
            plan_file_run(unfinished, "-", pstore.last_seq, str(store_dir))  # raises
    elif store_dir is not None:
        run, done.skipped = plan_file_run(
            read_run(store_dir),
            str(await trio.Path(file_.name).resolve()),
            pstore.last_seq,
            str(store_dir),
        )
        if done.skipped:
            echo_err(
                f"amps-py: resuming {run.file}: its first {done.skipped} line(s) are "
                f"in the store already (seq {run.base + 1}..{run.base + done.skipped}"
                "); publishing the lines after them"
            )
        else:
            write_run(store_dir, run)
    return run


async def _send_and_wait(
    ha: Any,
    uris: list[str],
    topic: str,
    data: str | None,
    file_: Any,
    lines: Callable[[Any], AsyncIterator[tuple[bytes, int]]],
    done: Published,
    *,
    store_dir: Path | None,
    timeout: float,
    explain_timeout: Callable[[str, str], Awaitable[None]],
    rate: float | None,
) -> None:
    """Publish ``data`` or the lines after ``done.skipped``, with progress on a
    terminal, then wait for the persisted acks; ``done`` says what happened."""
    from amps_py.cli.progress import progress
    from amps_py.client import CommandError

    pstore = ha.publish_store
    regular = file_ is not None and _is_regular(file_)
    first = pstore.discarded_through
    size = os.fstat(file_.fileno()).st_size if regular else None
    with progress(f"publishing to {topic}", size, "bytes") as bar:

        def show(at: int | None = None) -> None:
            persisted = max(pstore.discarded_through - first, 0)
            bar.update(completed=at, detail=f"{done.sent} sent, {persisted} persisted")

        if data is not None:
            done.last = await ha.publish(topic, data.encode())
            done.sent = 1
        else:
            await _send_lines(ha, topic, file_, lines, done, show, rate)
        done.last = max(done.last, pstore.last_seq)
        bar.update(what=f"waiting for the persisted ack of seq {done.last}")
        try:
            await ha.flush(timeout=timeout)
        except CommandError:
            if done.sent == 1 and data is not None:
                raise  # the one message: its own failure says it all
        except TimeoutError as exc:
            kept = (
                f"; the {len(pstore)} unacknowledged message(s) stay in "
                f"{store_dir / 'publish'}: rerun the same command to send them"
                if store_dir is not None
                else ""
            )
            await explain_timeout(str(exc) + kept, ha.uri or uris[0])
            raise
        done.not_journaled = done.last > 0 and ha.not_journaled_seq == done.last
        done.refused = {seq: ack for seq, ack in ha.failed_publishes.items() if first < seq}
        done.first = first


async def _send_lines(
    ha: Any,
    topic: str,
    file_: Any,
    lines: Callable[[Any], AsyncIterator[tuple[bytes, int]]],
    done: Published,
    show: Callable[..., None],
    rate: float | None,
) -> None:
    """Publish the lines of ``file_`` after the first ``done.skipped``, at most
    ``rate`` a second, counting them in ``done``; ``show(bytes_read)`` every 512."""
    index = 0
    pacer = Pacer(rate)
    async for line, at in lines(file_):
        index += 1
        if index <= done.skipped:
            continue
        await pacer.wait()
        done.last = await ha.publish(topic, line)
        done.sent += 1
        if done.sent % 512 == 0:
            show(at)
    show()


def _is_regular(file_: Any) -> bool:
    """Whether ``file_`` is a regular file (it can be read again: a run of it resumes),
    not a pipe or a terminal."""
    try:
        return stat.S_ISREG(os.fstat(file_.fileno()).st_mode)
    except (OSError, ValueError, AttributeError):
        return False
