"""A queue's messages replicated to an archive (audit) instance that has no queue.

The seed (Replicated Queues, Configuration for Queue Replication): "If the underlying
topic uses a different name than the queue topic, it is possible to replicate the
messages from the underlying topic without replicating the queue itself. This approach
can be convenient for simply recording and storing the messages provided to the queue
on an archival or auditing instance. When only the underlying topic (or topics) are
replicated, the requirements above do not apply". amps-py sends the queue's
acknowledgement and ownership records with them, so the archive holds what left the
queue as well as what entered it; it journals them and does nothing else with them.

What is still refused: a downstream with a queue of that name defined differently (it
would apply the upstream's acknowledgements), a SOW topic of that name (the records
would land on it; excludable with ``sow``), and replicating the queue's own name to an
instance without the queue (AMPS's ``queue`` check, which cannot be excluded: the
refusal says how to archive instead).
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import orjson
import pytest
import trio
from cluster import destination_xml, replication_xml
from harness import wait_until
from inprocess import REPLICATION_TRANSPORT, InProcessInstance, replicated_by, serve_instance

from amps_py.client import CommandError, open_client
from amps_py.config import parse_config
from amps_py.config.model import InstanceConfig, ReplicationTopic
from amps_py.replication.routing import Route
from amps_py.replication.validation import QueueFacts, TopicDescriptor, queue_facts, validate
from txlog import Journal, Kind

QUEUE = "work"
UNDERLYING = "jobs"
#: A's queue: its messages are journaled on jobs, its records on work
QUEUE_XML = (
    f"<SOW><Queue><Name>{QUEUE}</Name><UnderlyingTopic>{UNDERLYING}</UnderlyingTopic>"
    "<MessageType>json</MessageType></Queue></SOW>"
)


# --------------------------------------------------------------------- the rules


def instance(name: str, body: str, journal: str = ".*") -> InstanceConfig:
    return parse_config(
        f"""<AMPSConfig><Name>{name}</Name><Group>{name}</Group>
<TransactionLog><JournalDirectory>/tmp/{name}</JournalDirectory>
<Topic><Name>{journal}</Name><MessageType>json</MessageType></Topic></TransactionLog>
{body}</AMPSConfig>""",
        f"{name}.xml",
        environ={},
    )


def to_archive(*topics: str) -> str:
    entries = "".join(
        f"<Topic><Name>{t}</Name><MessageType>json</MessageType>"
        "<ExcludeValidation>replicate</ExcludeValidation></Topic>"
        for t in topics
    )
    return (
        "<Replication><Destination><Name>B</Name><SyncType>async</SyncType>"
        f"{entries}<Transport><Type>amps-replication</Type>"
        "<InetAddr>127.0.0.1:19990</InetAddr></Transport></Destination></Replication>"
    )


def hello_of(upstream: InstanceConfig) -> list[TopicDescriptor]:
    """What ``upstream`` describes to its first destination, as the downstream reads it."""
    route = Route(upstream.replication[0])
    described = route.describe_topics(upstream.sow_topics, upstream.queues)
    return [TopicDescriptor.from_wire(d) for d in described]


def test_replicating_only_the_underlying_topic_archives_the_queue() -> None:
    a = instance("A", QUEUE_XML + to_archive(UNDERLYING))
    (destination,) = a.replication
    assert destination.archived_queues == ((QUEUE, "json"),)
    ((facts,),) = [t.queues for t in hello_of(a)]
    assert facts == QueueFacts.from_config(a.queues[0], archived=True)
    # an archive journaling the underlying topic, without the queue, passes
    archive = instance("B", "", journal=UNDERLYING)
    assert validate(hello_of(a), archive, "A", "A") == []


def test_the_queue_records_follow_the_underlying_topic_whatever_its_filter() -> None:
    a = instance(
        "A",
        QUEUE_XML
        + to_archive(UNDERLYING).replace(
            "<ExcludeValidation>", "<Filter>/n &gt; 1</Filter><ExcludeValidation>"
        ),
    )
    route = Route(a.replication[0])

    def goes(topic: str, payload: bytes) -> bool:
        return route.accepts(
            topic=topic, message_type="json", origin="A", path=(), payload=payload,
            remote_name="B",
        )  # fmt: skip

    assert goes(UNDERLYING, b'{"n": 2}') and not goes(UNDERLYING, b'{"n": 1}')
    ack = b'{"bookmarks": ["1|1|"], "reason": "ack"}'
    assert goes(QUEUE, ack)  # the queue's acknowledgements and transfers
    assert not goes("other", b'{"n": 2}')
    assert route.verdict(QUEUE, "json", "A", (), "B") is True  # no filter to consult


def test_replicating_the_queue_name_replicates_the_queue() -> None:
    """A Topic covering the queue's name (``.*``, or both names) replicates the queue:
    no archive, the queue checks apply."""
    for topics in ((".*",), (UNDERLYING, QUEUE)):
        a = instance("A", QUEUE_XML + to_archive(*topics))
        assert a.replication[0].archived_queues == ()
        assert all(not q.archived for t in hello_of(a) for q in t.queues)


def test_a_local_queue_is_never_archived() -> None:
    local = QUEUE_XML.replace("<Queue>", "<LocalQueue>").replace("</Queue>", "</LocalQueue>")
    a = instance("A", local + to_archive(UNDERLYING))
    assert a.replication[0].archived_queues == ()
    assert queue_facts(ReplicationTopic(UNDERLYING, "json"), a.queues) == []


def test_an_archive_with_a_queue_of_that_name_must_define_it_the_same_way() -> None:
    a = instance("A", QUEUE_XML + to_archive(UNDERLYING))
    same = instance("B", QUEUE_XML)
    assert validate(hello_of(a), same, "A", "A") == []
    other = instance(
        "B", QUEUE_XML.replace("</Queue>", "<Semantics>at-most-once</Semantics></Queue>")
    )
    (failure,) = validate(hello_of(a), other, "A", "A")
    assert (failure.check, failure.topic) == ("queue", "work (json)")
    assert failure.problem == (
        "queue work is defined differently: Semantics at-least-once on A but Semantics "
        "at-most-once on B"
    )
    assert failure.fix == (
        "define queue work the same way on both instances: in B's SOW queue work, set "
        "<Semantics>at-least-once</Semantics> (the queue check cannot be excluded)"
    )


def test_an_archive_with_a_sow_topic_of_the_queue_name_is_refused_unless_excluded() -> None:
    a = instance("A", QUEUE_XML + to_archive(UNDERLYING))
    sow = "<SOW><Topic><Name>work</Name><MessageType>json</MessageType><Key>/id</Key></Topic></SOW>"
    b = instance("B", sow)
    (failure,) = validate(hello_of(a), b, "A", "A")
    assert (failure.check, failure.topic) == ("sow", "work (json)")
    assert failure.problem == (
        "work is a queue on A whose acknowledgement and ownership records reach B with its "
        "underlying topic jobs, but work is a SOW topic on B, where those records are no "
        "SOW records"
    )
    assert "ExcludeValidation sow on A's Destination Topic jobs (json)" in failure.fix
    relaxed = instance(
        "A", QUEUE_XML + to_archive(UNDERLYING).replace("replicate<", "replicate,sow<")
    )
    assert validate(hello_of(relaxed), b, "A", "A") == []


def test_replicating_the_queue_to_an_instance_without_it_says_how_to_archive() -> None:
    for queue_xml, how in (
        (QUEUE_XML, "replicate only its underlying topic jobs (a Destination Topic that "
                    "does not cover work)"),
        (QUEUE_XML.replace(f"<UnderlyingTopic>{UNDERLYING}</UnderlyingTopic>", ""),
         "give queue work an UnderlyingTopic of another name on A (and every instance "
         "that hosts it), and replicate only that topic"),
    ):  # fmt: skip
        a = instance("A", queue_xml + to_archive(".*"))
        failures = validate(hello_of(a), instance("B", ""), "A", "A")
        (failure,) = [f for f in failures if f.check == "queue"]
        assert failure.problem.startswith("work is a queue on A (a <Queue>")
        assert "(the queue check cannot be excluded)" in failure.fix
        assert f"If B only archives the queue's messages (an audit instance), {how}" in (
            failure.fix
        ), failure.fix


# -------------------------------------------------------------- two real instances


@asynccontextmanager
async def archive_pair(
    tmp_path: Path, archive_extra: str = ""
) -> AsyncIterator[tuple[InProcessInstance, InProcessInstance]]:
    """B (journaling jobs only; ``archive_extra`` inside AMPSConfig), then A (the
    queue, journaling everything) replicating jobs to B, one way."""
    b_kwargs = replicated_by("B", archive_extra)
    async with serve_instance(tmp_path / "B", "B", topics=((UNDERLYING, "json"),), **b_kwargs) as b:
        dest = destination_xml(
            "B",
            "B",
            False,
            f"127.0.0.1:{b.bound_port(REPLICATION_TRANSPORT)}",
            topics=(UNDERLYING,),
            exclude=("replicate",),
        )
        async with serve_instance(
            tmp_path / "A", "A", extra=f"<Group>A</Group>{QUEUE_XML}{replication_xml(dest)}"
        ) as a:
            yield a, b


def stored(served: InProcessInstance) -> int:
    return int(served.statistics()["journal"]["records"])


def journal_entries(path: Path) -> list[tuple[str, int, str]]:
    """(topic, kind, bookmark) of every queue-related record of a stopped instance."""
    with Journal(path, readonly=True) as journal:
        return [
            (r.topic, int(r.kind), r.bookmark)
            for r in journal.iter_records()
            if r.topic in (QUEUE, UNDERLYING)
        ]


async def test_an_archive_journals_the_queue_messages_and_acks_and_stays_a_plain_topic(
    tmp_path: Path,
) -> None:
    async with archive_pair(tmp_path) as (a, b):
        for path in (a.workdir / "A.xml", b.workdir / "B.xml"):
            check = subprocess.run(
                [sys.executable, "-m", "amps_py", "config", "check", str(path)],
                capture_output=True, text=True, timeout=60, check=False,
            )  # fmt: skip
            assert check.returncode == 0 and ": OK" in check.stdout, check.stderr
        async with open_client(b.uri, "watcher") as watcher:
            async with (
                watcher.subscribe(UNDERLYING) as live_jobs,
                watcher.subscribe(QUEUE) as live_work,
                open_client(a.uri, "worker") as worker,
                worker.subscribe(QUEUE, max_backlog=10) as queue,
            ):
                async with open_client(a.uri, "pub") as pub:
                    for n in range(6):
                        await pub.publish(QUEUE, orjson.dumps({"n": n}))  # to jobs
                    await pub.wait_persisted(pub.seq, timeout=30)
                for _ in range(4):
                    message = await queue.get(10)
                    await message.ack()
                await worker.flush_acks()
                # on B, jobs is a plain topic: every message, live, whoever consumed it
                got = [orjson.loads((await live_jobs.get(10)).data)["n"] for _ in range(6)]
                assert got == list(range(6))

                def archived() -> str | None:
                    n, want = stored(b), stored(a)
                    return None if n == want else f"B stored {n} of A's {want} records"

                await wait_until(archived, 30)
                with trio.move_on_after(0.5):
                    extra = await live_work.get(10)
                    pytest.fail(f"a queue record was delivered on B as a message: {extra}")
            # a replay of everything on B holds the six messages and nothing else
            replayed = []
            async with watcher.subscribe(".*", bookmark="0") as replay:
                with trio.fail_after(30):
                    await replay.completed.wait()
                with trio.move_on_after(0.5):
                    while True:
                        replayed.append(await replay.get(10))
            assert [(m.topic, orjson.loads(m.data)["n"]) for m in replayed] == [
                (UNDERLYING, n) for n in range(6)
            ]
            # sow answers on jobs as on any topic that is not a SOW topic
            with pytest.raises(CommandError) as on_jobs:
                await watcher.sow(UNDERLYING)
            with pytest.raises(CommandError) as on_other:
                await watcher.sow("elsewhere")
            assert on_jobs.value.reason == on_other.value.reason
        assert b.alive
        troubles = [
            line
            for line in b.log_text().splitlines()
            if any(f"] {level}:" in line for level in ("warning", "error", "critical"))
        ]
        assert troubles == [], troubles  # (A's and B's lines: they share the process)
    a_records = journal_entries(a.journal_dir)
    b_records = journal_entries(b.journal_dir)
    assert b_records == a_records
    kinds = [kind for _, kind, _ in b_records]
    assert kinds.count(Kind.PUBLISH) == 6
    assert kinds.count(Kind.QUEUE_ACK) >= 1
    assert {topic for topic, kind, _ in b_records if kind == Kind.QUEUE_ACK} == {QUEUE}


async def test_an_archive_with_the_queue_defined_differently_is_refused(tmp_path: Path) -> None:
    other = QUEUE_XML.replace("</Queue>", "<Semantics>at-most-once</Semantics></Queue>")
    async with archive_pair(tmp_path, other) as (a, b):
        async with open_client(a.uri, "pub") as pub:
            await pub.publish_persisted(QUEUE, b'{"n": 1}', timeout=20)

        def refused() -> str | None:
            for d in a.statistics()["replication"]["destinations"]:
                if d["name"] == "B" and "validation failed" in d["last_error"]:
                    return None
            return "A's destination B is not refused yet"

        await wait_until(refused, 30)
        (destination,) = a.statistics()["replication"]["destinations"]
        assert (
            "check queue failed for topic work (json): queue work is defined differently: "
            "Semantics at-least-once on A but Semantics at-most-once on B. Fix: define queue "
            "work the same way on both instances" in destination["last_error"]
        ), destination["last_error"]
        assert "refused replication from A" in b.log_text()
        assert stored(b) == 0
