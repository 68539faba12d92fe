"""``amps-py publish`` and ``amps-py subscribe`` on the HA client: with a comma-separated
list of URIs (failover across it, reconnect) or with ``--store DIR`` (durable).

Store directory ``DIR`` (one per publisher, or per subscriber)::

    DIR/publish/            publish: the FilePublishStore (unacknowledged publishes)
    DIR/client-name         publish: the client name the store belongs to
    DIR/publish-file.json   publish --file: the unfinished run of a file {file, base}
    DIR/bookmarks/          subscribe: the FileBookmarkStore (what was processed)

Resuming ``publish --file F`` (the rule ``amps-py publish --help`` states): a run of a
file records, before its first line is stored, the store's ``last_seq`` as its
``base``; its N-th non-blank line is then sequence number ``base + N``. A restarted run
of the same file finds the record and skips the first ``last_seq - base`` lines: every
one of them is in the store already, either acknowledged (discarded) or kept, and the HA
client republishes the kept ones (in order, before any new publish) after its logon. So
nothing acknowledged is sent again and nothing is lost. The record is removed once every
line is persisted.

Pure functions (:func:`split_uris`, :func:`plan_file_run`, :func:`subscription_id`)
and the small files are here; :func:`publish` and :func:`subscribe` are the trio code
the commands run.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import stat
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import click
import orjson
import trio

from amps_py.client import BadURI, parse_uri
from amps_py.client.bookmark_store import fsync_directory

__all__ = [
    "FileRun",
    "StoreMisuse",
    "plan_file_run",
    "publish",
    "split_uris",
    "subscribe",
    "subscription_id",
]

RUN_FILE: Final = "publish-file.json"
NAME_FILE: Final = "client-name"
#: seconds ``subscribe`` waits for the first logon
SUBSCRIBE_CONNECT_TIMEOUT: Final = 30.0


class StoreMisuse(ValueError):
    """A store directory used in a way that would lose or duplicate messages; the text
    says what to do."""


# ------------------------------------------------------------------ pure
def split_uris(text: str) -> list[str]:
    """The URIs of ``tcp://h1:9107/amps/json,tcp://h2:9207/amps/json`` (one URI is a
    list of one), each checked.

    Raises:
        BadURI: an entry is empty or malformed (the message says which).
    """
    uris = [part.strip() for part in text.split(",")]
    for position, uri in enumerate(uris, 1):
        if not uri:
            raise BadURI(
                f"URI list {text!r}: entry {position} is empty; separate the URIs by single "
                "commas, e.g. tcp://h1:9107/amps/json,tcp://h2:9207/amps/json"
            )
        parse_uri(uri)
    return uris


@dataclass(frozen=True)
class FileRun:
    """A publish of a file with a store: its N-th non-blank line is seq ``base + N``.

    Attributes:
        file: the file's absolute path.
        base: the store's ``last_seq`` before the run stored its first line.
    """

    file: str
    base: int


def plan_file_run(
    unfinished: FileRun | None, file: str, last_seq: int, store_dir: str
) -> tuple[FileRun, int]:
    """The run of ``file`` to make, and how many of its first lines to skip, given the
    unfinished run recorded in the store (None: none) and the store's ``last_seq``
    (after the logon: what the server already holds is counted in it).

    Raises:
        StoreMisuse: the store holds an unfinished run of another file, or a run that
            does not fit the store (the store was replaced).
    """
    if unfinished is None:
        return FileRun(file, last_seq), 0
    if unfinished.file != file:
        raise StoreMisuse(
            f"{store_dir} holds an unfinished publish of {unfinished.file}; finish it "
            f"first by running the same command with --file {unfinished.file}, or give "
            f"its unstored lines up by deleting {Path(store_dir) / RUN_FILE} (the lines "
            "already stored are still sent)"
        )
    skip = last_seq - unfinished.base
    if skip < 0:
        raise StoreMisuse(
            f"{Path(store_dir) / RUN_FILE} says the publish of {file} started after seq "
            f"{unfinished.base}, but the publish store in {store_dir} only reaches seq "
            f"{last_seq}: the store was replaced or deleted. Delete {RUN_FILE} to publish "
            "the whole file again (the subscribers may then get lines twice)"
        )
    return unfinished, skip


def subscription_id(topic: str, filter_: str | None) -> str:
    """The stable subscription id under which ``subscribe --store`` keeps what it
    processed of ``topic`` with ``filter_`` (the same command resumes the same one)."""
    digest = hashlib.blake2b(f"{topic}\0{filter_ or ''}".encode(), digest_size=8).hexdigest()
    return f"amps-py-cli-{digest}"


# ------------------------------------------------------------------ store files
def read_run(store_dir: Path) -> FileRun | None:
    """The unfinished file run recorded in ``store_dir`` (None: none).

    Raises:
        StoreMisuse: the record is not readable (the message says what to do).
    """
    path = store_dir / RUN_FILE
    try:
        record = json.loads(path.read_text())
        return FileRun(str(record["file"]), int(record["base"]))
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise StoreMisuse(
            f"cannot read {path} ({exc}): it should hold the unfinished publish of a file "
            '({"file": PATH, "base": SEQ}); repair it, or delete it to give that publish up'
        ) from exc


def write_run(store_dir: Path, run: FileRun) -> None:
    """Record ``run`` durably (a temporary file fsynced, renamed, the directory fsynced)
    before its first line is stored."""
    path = store_dir / RUN_FILE
    tmp = path.with_suffix(".tmp")
    with open(tmp, "w") as f:
        json.dump({"file": run.file, "base": run.base}, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fsync_directory(store_dir)


def finish_run(store_dir: Path) -> None:
    """Every line of the run is persisted: forget it."""
    (store_dir / RUN_FILE).unlink(missing_ok=True)
    fsync_directory(store_dir)



def claim_store(store_dir: Path, name: str) -> None:
    """Tie ``store_dir`` to the client name ``name`` (the first use records it).

    Raises:
        StoreMisuse: it belongs to another client name.
    """
    path = store_dir / NAME_FILE
    store_dir.mkdir(parents=True, exist_ok=True)
    try:
        owner = path.read_text().strip()
    except FileNotFoundError:
        path.write_text(name + "\n")
        return
    if owner != name:
        raise StoreMisuse(
            f"the publish store {store_dir} belongs to client name {owner!r}, not {name!r}: "
            f"the server knows a publisher's sequence numbers by its name. Use --name "
            f"{owner}, or another --store directory for {name!r}"
        )


# ------------------------------------------------------------------ shared
def _state_reporter(out: Callable[[str], None]) -> Callable[[str, dict[str, Any]], None]:
    """An ``on_state`` that tells the user about reconnects on stderr."""
    from amps_py.client.ha import CONNECTED, DISCONNECTED, FAILED_OVER

    def report(state: str, detail: dict[str, Any]) -> None:
        if state == DISCONNECTED:
            out(f"amps-py: lost {detail.get('uri')} ({detail.get('reason')}); reconnecting")
        elif state == FAILED_OVER:
            out(f"amps-py: failed over to {detail.get('uri')}")
        elif state == CONNECTED and detail.get("republished"):
            out(
                f"amps-py: connected to {detail.get('uri')}; republished "
                f"{detail['republished']} unacknowledged message(s) from the store"
            )

    return report


def _is_regular(file_: Any) -> bool:
    """Whether ``file_`` is a regular file (it can be read again: a run of it resumes),
    not a pipe or a terminal."""
    try:
        return stat.S_ISREG(os.fstat(file_.fileno()).st_mode)
    except (OSError, ValueError, AttributeError):
        return False


class _RetryNotice(logging.Filter):
    """Writes ``notice`` on stderr once, before the first warning it lets through (a
    server the HA client cannot use): how long the command keeps retrying and how to
    stop it."""

    def __init__(self, notice: str) -> None:
        super().__init__()
        self.notice = notice
        self.given = False

    def filter(self, record: logging.LogRecord) -> bool:
        if not self.given and record.levelno >= logging.WARNING:
            self.given = True
            _echo_err(self.notice)
        return True


class _ShortRepeats(logging.Filter):
    """A server the HA client cannot use for the reason it already gave is one short
    line (``... cannot use URI (as before); next attempt in 0.8 s``): the reason, and
    its hint, are written once per server and reason, not on every retry."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: set[tuple[str, str]] = set()

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args
        if not (isinstance(args, tuple) and len(args) == 4 and "cannot use" in record.msg):
            return True
        client, uri, why, delay = args
        if not isinstance(delay, (int, float)):
            return True
        if (str(uri), str(why)) not in self.seen:
            self.seen.add((str(uri), str(why)))
            return True
        _echo_err(
            f"amps-py: HA client {client!r}: cannot use {uri} (as before); "
            f"next attempt in {delay:.3g} s"
        )
        return False


@contextlib.contextmanager
def _client_log_on_stderr(notice: str = "") -> Iterator[None]:
    """The HA client's warnings (a server it cannot use, and why) as ``amps-py:``
    lines on stderr while the command runs; ``notice`` once before the first."""
    logger = logging.getLogger("amps_py.client")
    handler = logging.StreamHandler(sys.stderr)
    if notice:
        handler.addFilter(_RetryNotice(notice))
    handler.addFilter(_ShortRepeats())
    handler.setLevel(logging.WARNING)
    handler.setFormatter(logging.Formatter("amps-py: %(message)s"))
    logger.addHandler(handler)
    try:
        yield
    finally:
        logger.removeHandler(handler)


def _echo_err(text: str) -> None:
    click.echo(text, err=True)


async def _first_logon(ha: Any, uris: list[str], timeout: float) -> None:
    try:
        await ha.wait_connected(timeout)
    except TimeoutError:
        raise TimeoutError(
            f"none of {', '.join(uris)} accepted a logon within {timeout:g} s (the lines "
            "above say why); start an instance there or correct the URIs"
        ) from None


@contextlib.contextmanager
def _closing(store: Any) -> Iterator[Any]:
    try:
        yield store
    finally:
        if store is not None:
            store.close()


# ------------------------------------------------------------------ publish
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
    through the HA client, resuming a file run as the module doc says, and wait until
    everything is persisted.

    ``explain_timeout(message, uri)`` is awaited when the persisted acks do not come
    within ``timeout``: it raises the user's error (else the TimeoutError is raised).
    ``rate`` paces the lines sent (not the ones a resumed run skips) at most that many
    per second.

    Raises:
        StoreMisuse, OSError, TimeoutError, CommandError: as the CLI reports them.
    """
    from amps_py.cli_client import progress
    from amps_py.cli_common import Pacer
    from amps_py.client import CommandError, FilePublishStore, open_ha_client
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
    with _closing(store), _client_log_on_stderr(notice):
        async with (
            unwrapping_groups(),
            open_ha_client(
                name,
                uris,
                publish_store=store,
                connect_timeout=timeout,
                on_state=_state_reporter(_echo_err),
                **logon_fields,
            ) as ha,
        ):
            await _first_logon(ha, uris, timeout)
            pstore = ha.publish_store
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
                    _echo_err(
                        f"amps-py: resuming {run.file}: its first {done.skipped} line(s) are "
                        f"in the store already (seq {run.base + 1}..{run.base + done.skipped}"
                        "); publishing the lines after them"
                    )
                else:
                    write_run(store_dir, run)
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
                done.refused = {
                    seq: ack for seq, ack in ha.failed_publishes.items() if first < seq
                }
                done.first = first
            if run is not None and store_dir is not None:
                finish_run(store_dir)
    return done


# ------------------------------------------------------------------ subscribe
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
    from amps_py.cli_client import stderr_is_terminal
    from amps_py.client import AMPSError, FileBookmarkStore, open_ha_client
    from amps_py.trio_util import unwrapping_groups

    out = sys.stdout
    start = "0" if resume else bookmark
    sub_id = subscription_id(topic, filter_) if store_dir is not None else None
    store = None
    if store_dir is not None:
        if start is None:
            raise StoreMisuse(
                "--store keeps the position of a bookmark subscription: add --resume "
                "(continue where the last run stopped; from the start of the journal the "
                "first time) or --bookmark BOOKMARK (start there)"
            )
        store = FileBookmarkStore(store_dir / "bookmarks")
    n = 0
    notice = (
        "amps-py: retrying the URIs in turn until one accepts a logon (at first for up "
        f"to {SUBSCRIBE_CONNECT_TIMEOUT:g} s, after a lost connection for as long as it "
        "takes); Ctrl-C stops it"
    )
    with _closing(store), _client_log_on_stderr(notice):
        if store is not None and sub_id is not None and not resume:
            kept = store.resume_bookmark(sub_id)
            if kept:
                raise StoreMisuse(
                    f"{store_dir} holds where an earlier run stopped on {topic} ({kept}); "
                    "add --resume (instead of --bookmark) to continue from there, or give "
                    "another --store directory to start at the bookmark"
                )
        async with (
            unwrapping_groups(),
            open_ha_client(
                name,
                uris,
                bookmark_store=store,
                on_state=_state_reporter(_echo_err),
                ack_batch_size=ack_batch,
                **logon_fields,
            ) as ha,
        ):
            await _first_logon(ha, uris, SUBSCRIBE_CONNECT_TIMEOUT)
            acked = 0
            async with ha.subscribe(
                topic,
                filter=filter_,
                bookmark=start,
                options=options,
                sub_id=sub_id,
                max_backlog=max_backlog,
            ) as sub:
                if ack and sub.subscribes and sub.max_backlog is None:
                    raise AMPSError(
                        f"--ack acknowledges queue messages, and {topic!r} is not a queue on "
                        f"{ha.uri} (its subscribe ack reported no max_backlog); drop --ack, "
                        "or give the queue's name"
                    )
                started = last_report = time.monotonic()
                rate_lines = stderr_is_terminal()  # nothing extra when piped
                while not count or n < count:
                    try:
                        msg = await sub.get(timeout) if timeout else await sub.__anext__()
                    except TimeoutError:
                        out.flush()
                        if count:
                            raise TimeoutError(
                                f"only {n} of {count} message(s) arrived: none came for "
                                f"{timeout:g} s"
                            ) from None
                        _echo_err(
                            f"amps-py: no message for {timeout:g} s; stopping after {n} message(s)"
                        )
                        break
                    except StopAsyncIteration:
                        out.flush()
                        if sub.failure is not None:
                            raise sub.failure from None
                        break
                    n += 1
                    out.write(message_line(msg, raw, parse_uri(uris[0]).message_type))
                    if start is not None:
                        out.flush()  # printed before it counts as processed
                        msg.processed()
                    if ack:
                        out.flush()  # printed before it leaves the queue
                        await msg.ack()
                        acked += 1
                    now = time.monotonic()
                    if rate_lines and now - last_report >= 5:
                        out.flush()
                        _echo_err(f"[{n} messages, {n / (now - started):,.0f} msg/s]")
                        last_report = now
                out.flush()
            if ack:
                await ha.flush_acks()
                _echo_err(f"amps-py: acknowledged {acked} message(s) on {topic}")
    return n


def message_line(msg: Any, raw: bool, message_type: str = "json") -> str:
    """One printed message: its payload (``raw``), or the JSON envelope ``{topic,
    bookmark, data}`` (``bookmark`` only when the message has one) with
    ``"possible_duplicate": true`` added when the HA client flags it (it may have
    been printed before: redelivered after a reconnect or a restart). ``data`` is the
    payload as JSON: a JSON message as it is, a fix, nvfix, xml, bson or msgpack one
    (``message_type``, from the URI) as its fields, else the payload as text."""
    if raw:
        return str(msg.data.decode(errors="replace")) + "\n"
    from amps_py.cli_client import payload_as_json

    data = payload_as_json(msg.data, message_type)
    env: dict[str, Any] = {"topic": msg.topic}
    if msg.bookmark:  # a live subscription's messages carry none
        env["bookmark"] = msg.bookmark
    env["data"] = data
    if getattr(msg, "possible_duplicate", False):
        env["possible_duplicate"] = True
    return orjson.dumps(env).decode() + "\n"
