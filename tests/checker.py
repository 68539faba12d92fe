"""The replication checker: what every publisher sent against what every instance replays.

Payload convention. Every message a checked publisher sends is a JSON object with at
least::

    {"p": "<publisher name>", "s": <the publisher's seq, an int>, "id": "<optional>", ...}

``p`` and ``s`` identify the message; ``id`` (optional) is a payload id that must match
the published one when both sides have it (a mismatch means the instance stores
something else under that publisher and seq). Other fields are ignored. :func:`payload`
builds such a payload. A replayed message whose payload does not follow the convention is
counted as a phantom.

The classification core is pure: :func:`classify` takes ``published`` (publisher name
to what it sent, as :class:`Pub`) and ``stored`` (instance name to the messages it
replays from EPOCH, in replay order, as :class:`Stored`) and returns a :class:`Report`.
Per instance, each published message is exactly one of:

- ``ok``: present exactly once;
- ``lost``: acknowledged (persisted ack) but absent, an error;
- ``unacked_missing``: never acknowledged and absent, allowed, not an error;
- ``duplicate``: present more than once, an error.

So ``ok + lost + duplicate + unacked_missing`` is the number of published messages.
Two further classes:

- ``reordered``: per publisher, the fewest messages that would have to move for the
  publisher's messages (first copies) to be in increasing seq order in the replay, that
  is, those outside a longest increasing run; a single message replayed too early or too
  late counts once. These messages are also counted in ``ok`` or ``duplicate``. An
  error.
- ``phantom``: a replayed message nobody published (unknown publisher or seq, payload id
  mismatch, or a payload outside the convention), one per replayed copy, an error.

The total row adds up the instances. ``Report.errors`` is the number of bad findings
(lost + duplicate + reordered + phantom over every instance).

:func:`replay_instance` reads one instance from EPOCH with a bookmark subscription.

Published files (``--published``) are JSON lines, one per published message::

    {"p": "pub0", "s": 1, "id": "pub0-1", "acked": true}

Command line::

    python tests/checker.py [NAME=]URI [[NAME=]URI ...] --published FILE.jsonl \\
        [--topic REGEX] [--timeout SECONDS] [--findings N]

prints the table (and the first findings) and exits 1 when there is any error, 0
otherwise.
"""

from __future__ import annotations

import argparse
import bisect
import itertools
import json
import os
import sys
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Final

import orjson
import trio

from amps_py.client import AMPSError, BadURI, open_client, parse_uri

#: Column order of the table, and the classes a :class:`Counts` holds.
CLASSES: Final = ("ok", "lost", "duplicate", "reordered", "phantom", "unacked_missing")
#: The classes that make a check fail.
ERROR_CLASSES: Final = ("lost", "duplicate", "reordered", "phantom")

_client_names = itertools.count(1)


@dataclass(frozen=True)
class Pub:
    """One message as its publisher sent it.

    Attributes:
        seq: the publisher's sequence number (unique per publisher).
        payload_id: the payload's ``id`` field, or None when it has none.
        acked: whether the publisher got a persisted ack covering it.
    """

    seq: int
    payload_id: str | None = None
    acked: bool = True


@dataclass(frozen=True)
class Stored:
    """One message as an instance replays it.

    Attributes:
        publisher: the payload's ``p`` ("" when the payload broke the convention).
        seq: the payload's ``s`` (-1 when the payload broke the convention).
        bookmark: the instance's bookmark for it.
        payload_id: the payload's ``id``, or None.
        topic: the topic it was replayed from.
    """

    publisher: str
    seq: int
    bookmark: str = ""
    payload_id: str | None = None
    topic: str = ""


@dataclass
class Counts:
    """How many messages fell into each class (one row of the table)."""

    ok: int = 0
    lost: int = 0
    duplicate: int = 0
    reordered: int = 0
    phantom: int = 0
    unacked_missing: int = 0

    @property
    def errors(self) -> int:
        return sum(getattr(self, name) for name in ERROR_CLASSES)

    def add(self, other: Counts) -> None:
        for f in fields(self):
            setattr(self, f.name, getattr(self, f.name) + getattr(other, f.name))

    def as_dict(self) -> dict[str, int]:
        return {name: getattr(self, name) for name in CLASSES}


@dataclass(frozen=True)
class Finding:
    """One bad (or notable) message: which instance, which class, and what was seen."""

    instance: str
    kind: str
    publisher: str
    seq: int
    detail: str

    def __str__(self) -> str:
        return f"{self.instance}: {self.kind} {self.publisher or '?'}#{self.seq}: {self.detail}"


@dataclass(frozen=True)
class Report:
    """The result of :func:`classify`.

    Attributes:
        instances: the counts of each instance, in the order they were given.
        findings: one entry per message in a class other than ``ok``, instance by
            instance.
    """

    instances: Mapping[str, Counts]
    findings: tuple[Finding, ...] = field(default=())

    @property
    def total(self) -> Counts:
        total = Counts()
        for counts in self.instances.values():
            total.add(counts)
        return total

    @property
    def errors(self) -> int:
        """How many findings are in the bad classes (0 means the check passed)."""
        return self.total.errors

    def table(self) -> str:
        """A fixed-width table: one row per instance, then the total."""
        rows = [(name, counts.as_dict()) for name, counts in self.instances.items()]
        rows.append(("total", self.total.as_dict()))
        name_width = max(len("instance"), *(len(name) for name, _ in rows))
        widths = {c: max(len(c), *(len(str(values[c])) for _, values in rows)) for c in CLASSES}
        lines = ["  ".join(["instance".ljust(name_width), *(c.rjust(widths[c]) for c in CLASSES)])]
        for name, values in rows:
            cells = [str(values[c]).rjust(widths[c]) for c in CLASSES]
            lines.append("  ".join([name.ljust(name_width), *cells]))
        return "\n".join(lines)

    def describe(self, limit: int = 20) -> str:
        """The table, then up to ``limit`` findings of the bad classes."""
        bad = [f for f in self.findings if f.kind in ERROR_CLASSES]
        text = self.table()
        if bad:
            text += "\n" + "\n".join(str(f) for f in bad[:limit])
            if len(bad) > limit:
                text += f"\n... and {len(bad) - limit} more"
        return text


def classify(
    published: Mapping[str, Sequence[Pub]], stored: Mapping[str, Sequence[Stored]]
) -> Report:
    """Classify every published message on every instance (see the module docstring).

    Args:
        published: publisher name to the messages it sent (any order).
        stored: instance name to what it replays from EPOCH, in replay order.

    Raises:
        ValueError: a publisher lists the same seq twice.
    """
    index: dict[tuple[str, int], Pub] = {}
    for publisher, pubs in published.items():
        for pub in pubs:
            key = (publisher, pub.seq)
            if key in index:
                raise ValueError(
                    f"publisher {publisher!r} lists seq {pub.seq} twice; each published "
                    "message needs its own seq"
                )
            index[key] = pub
    instances: dict[str, Counts] = {}
    findings: list[Finding] = []
    for instance, replay in stored.items():
        counts, found = _classify_instance(instance, index, replay)
        instances[instance] = counts
        findings.extend(found)
    return Report(instances, tuple(findings))


def _classify_instance(
    instance: str, index: Mapping[tuple[str, int], Pub], replay: Sequence[Stored]
) -> tuple[Counts, list[Finding]]:
    counts = Counts()
    findings: list[Finding] = []
    copies: dict[tuple[str, int], list[str]] = defaultdict(list)  # key -> bookmarks
    firsts: dict[str, list[tuple[int, int, str]]] = defaultdict(list)  # (seq, position, bm)
    for position, message in enumerate(replay):
        key = (message.publisher, message.seq)
        pub = index.get(key)
        where = f"replay position {position}, bookmark {message.bookmark or '?'}"
        if pub is None:
            counts.phantom += 1
            why = (
                "payload without the p/s fields"
                if message.seq < 0 or not message.publisher
                else "nobody published it"
            )
            findings.append(Finding(instance, "phantom", *key, f"{why} ({where})"))
            continue
        if (
            message.payload_id is not None
            and pub.payload_id is not None
            and message.payload_id != pub.payload_id
        ):
            counts.phantom += 1
            findings.append(
                Finding(
                    instance,
                    "phantom",
                    *key,
                    f"payload id {message.payload_id!r}, published {pub.payload_id!r} ({where})",
                )
            )
            continue
        copies[key].append(message.bookmark)
        if len(copies[key]) == 1:  # order is judged on first copies
            firsts[message.publisher].append((message.seq, position, message.bookmark))

    for publisher, seen in firsts.items():
        in_order = _longest_increasing([seq for seq, _, _ in seen])
        for i, (seq, position, bookmark) in enumerate(seen):
            if i in in_order:
                continue
            counts.reordered += 1
            before = seen[i - 1][0] if i > 0 else None
            after = seen[i + 1][0] if i + 1 < len(seen) else None
            findings.append(
                Finding(
                    instance,
                    "reordered",
                    publisher,
                    seq,
                    f"out of publisher order between seq {before} and seq {after} "
                    f"(replay position {position}, bookmark {bookmark or '?'})",
                )
            )

    for key, pub in sorted(index.items()):
        n = len(copies.get(key, ()))
        if n == 1:
            counts.ok += 1
        elif n == 0 and pub.acked:
            counts.lost += 1
            findings.append(Finding(instance, "lost", *key, "acknowledged but not replayed"))
        elif n == 0:
            counts.unacked_missing += 1
            findings.append(
                Finding(instance, "unacked_missing", *key, "never acknowledged, not replayed")
            )
        else:
            counts.duplicate += 1
            marks = ", ".join(b or "?" for b in copies[key])
            findings.append(
                Finding(instance, "duplicate", *key, f"replayed {n} times (bookmarks {marks})")
            )
    return counts, findings


def _longest_increasing(values: Sequence[int]) -> set[int]:
    """Indices of one longest strictly increasing subsequence of ``values`` (patience
    sorting, O(n log n)); the earliest-ending choice, so the result is deterministic."""
    tails: list[int] = []  # tails[k]: smallest last value of an increasing run of length k+1
    tail_at: list[int] = []  # the index of that value
    previous = [-1] * len(values)
    for i, value in enumerate(values):
        k = bisect.bisect_left(tails, value)
        if k == len(tails):
            tails.append(value)
            tail_at.append(i)
        else:
            tails[k] = value
            tail_at[k] = i
        previous[i] = tail_at[k - 1] if k > 0 else -1
    keep: set[int] = set()
    i = tail_at[-1] if tail_at else -1
    while i != -1:
        keep.add(i)
        i = previous[i]
    return keep


# ---------------------------------------------------------------------- payloads and files


def payload(publisher: str, seq: int, payload_id: str | None = None, **extra: Any) -> bytes:
    """A JSON payload following the checker's convention (``p``, ``s``, optional ``id``)."""
    doc: dict[str, Any] = {"p": publisher, "s": seq}
    if payload_id is not None:
        doc["id"] = payload_id
    doc.update(extra)
    return orjson.dumps(doc)


def parse_stored(data: bytes, bookmark: str = "", topic: str = "") -> Stored:
    """The :class:`Stored` record of one replayed payload (``p``/``s`` convention).

    A payload that is not a JSON object with a string ``p`` and an integer ``s`` gives
    ``Stored("", -1, ...)``, which :func:`classify` counts as a phantom.
    """
    try:
        doc = orjson.loads(data)
    except orjson.JSONDecodeError:
        doc = None
    if (
        not isinstance(doc, dict)
        or not isinstance(doc.get("p"), str)
        or not isinstance(doc.get("s"), int)
        or isinstance(doc.get("s"), bool)
    ):
        return Stored("", -1, bookmark, None, topic)
    pid = doc.get("id")
    return Stored(doc["p"], doc["s"], bookmark, None if pid is None else str(pid), topic)


def load_published(path: str | Path) -> dict[str, list[Pub]]:
    """Read a published file (JSON lines: ``p``, ``s``, ``acked``, optional ``id``).

    Raises:
        ValueError: naming the file and line of a malformed record.
    """
    published: dict[str, list[Pub]] = defaultdict(list)
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                doc = json.loads(line)
                publisher, seq, acked = doc["p"], doc["s"], doc["acked"]
                if not isinstance(publisher, str) or not isinstance(seq, int):
                    raise TypeError("p must be a string and s an integer")
                if not isinstance(acked, bool):
                    raise TypeError("acked must be true or false")
            except (ValueError, KeyError, TypeError) as exc:
                raise ValueError(
                    f"{path}:{number}: not a published record ({exc}); expected e.g. "
                    '{"p": "pub0", "s": 1, "id": "pub0-1", "acked": true}'
                ) from None
            pid = doc.get("id")
            published[publisher].append(Pub(seq, None if pid is None else str(pid), acked))
    return dict(published)


def dump_published(path: str | Path, published: Mapping[str, Iterable[Pub]]) -> None:
    """Write ``published`` in the format :func:`load_published` reads."""
    with open(path, "w", encoding="utf-8") as f:
        for publisher, pubs in published.items():
            for pub in pubs:
                record: dict[str, Any] = {"p": publisher, "s": pub.seq, "acked": pub.acked}
                if pub.payload_id is not None:
                    record["id"] = pub.payload_id
                f.write(json.dumps(record) + "\n")


# ---------------------------------------------------------------------- reading an instance


#: a replay still delivering is given this many times its stall timeout in all
STILL_ARRIVING_FACTOR = 10


async def replay_instance(
    uri: str, topic_regex: str = ".*", timeout: float = 30, *, quiet: float = 0.5
) -> list[Stored]:
    """Everything ``uri`` replays from EPOCH on topics matching ``topic_regex``.

    Subscribes with bookmark ``"0"`` (EPOCH), collects messages until the server's
    ``completed`` ack has arrived and then no message came for ``quiet`` seconds.
    Payloads are parsed with :func:`parse_stored`.

    ``timeout`` bounds a stall, not the replay: a replay that keeps delivering may
    take longer (a loaded machine, a long journal), up to ``STILL_ARRIVING_FACTOR``
    times ``timeout`` in all.

    Raises:
        TimeoutError: nothing arrived and no ``completed`` ack for ``timeout``
            seconds, or messages still arriving (publishers still running?) after
            ``STILL_ARRIVING_FACTOR * timeout`` seconds.
        amps_py.client.AMPSError: the connection or the subscription failed.
        OSError: the instance cannot be reached.
    """
    name = f"checker-{os.getpid()}-{next(_client_names)}"
    out: list[Stored] = []
    started = trio.current_time()
    stall_deadline = started + timeout
    hard_deadline = started + timeout * STILL_ARRIVING_FACTOR
    async with (
        open_client(uri, name, timeout=timeout) as client,
        client.subscribe(topic_regex, bookmark="0", timeout=timeout) as sub,
    ):
        while True:
            with trio.move_on_after(quiet) as scope:
                try:
                    message = await sub.__anext__()
                except StopAsyncIteration:
                    reason = sub.failure or client.closed
                    raise ConnectionError(
                        f"{uri}: the replay ended after {len(out)} messages: {reason}"
                    ) from None
            now = trio.current_time()
            if not scope.cancelled_caught:
                out.append(parse_stored(message.data, message.bookmark, message.topic))
                stall_deadline = now + timeout
            elif sub.completed.is_set():
                return out
            if now > stall_deadline or now > hard_deadline:
                state = (
                    f"nothing arrived for {timeout} s and no completed ack"
                    if now > stall_deadline
                    else "messages were still arriving"
                )
                raise TimeoutError(
                    f"{uri}: replay of {topic_regex!r} not finished after "
                    f"{now - started:.0f} s ({len(out)} messages, {state}); stop the "
                    "publishers before checking or raise --timeout"
                )


# ---------------------------------------------------------------------- program


def _named(text: str) -> tuple[str, str]:
    name, sep, uri = text.partition("=")
    if sep and "://" not in name:
        return name, uri
    try:
        parsed = parse_uri(text)
    except BadURI as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return f"{parsed.host}:{parsed.port}", text


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description="Classify what instances replay against what publishers sent."
    )
    parser.add_argument("uris", nargs="+", type=_named, metavar="[NAME=]URI")
    parser.add_argument("--published", required=True, type=Path, help="JSON lines file")
    parser.add_argument("--topic", default=".*", help="topic regex to replay (default .*)")
    parser.add_argument("--timeout", type=float, default=60.0, help="per instance, seconds")
    parser.add_argument("--findings", type=int, default=20, help="bad findings to print")
    args = parser.parse_args(argv)
    try:
        published = load_published(args.published)
    except (OSError, ValueError) as exc:
        print(f"checker: {exc}", file=sys.stderr)
        return 2

    async def read_all() -> dict[str, list[Stored]]:
        stored: dict[str, list[Stored]] = {}
        for name, uri in args.uris:
            stored[name] = await replay_instance(uri, args.topic, args.timeout)
        return stored

    try:
        stored = trio.run(read_all)
    except (OSError, TimeoutError, AMPSError) as exc:
        print(f"checker: {exc}", file=sys.stderr)
        return 2
    report = classify(published, stored)
    print(report.describe(args.findings))
    return 1 if report.errors else 0


if __name__ == "__main__":
    sys.exit(main())
