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
and the small files are here; the trio code the commands run is
:func:`amps_py.cli.ha_publish.publish` and :func:`amps_py.cli.ha_subscribe.subscribe`,
with :mod:`amps_py.cli.ha_session` telling the user what the HA client does.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from amps_py.client import BadURI, parse_uri
from amps_py.client.bookmark_store import fsync_directory

__all__ = [
    "FileRun",
    "StoreMisuse",
    "plan_file_run",
    "split_uris",
    "subscription_id",
]

RUN_FILE: Final = "publish-file.json"
NAME_FILE: Final = "client-name"


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
