"""Actions: a scheduled replication downgrade/upgrade on a real sync pair whose link is
slowed by the fault proxy (AMPS's "automatically downgrading acknowledgment"; the
hysteresis itself is tested on a fake clock in test_replication_ackmode.py); If
conditions; client connect/disconnect events on a real instance; config errors for
Actions."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import trio
from cluster import Cluster, destination_xml, replication_xml
from harness import reserve_port, start_instance, wait_until

from amps_py.actions import ActionRunner
from amps_py.client import ConnectionLost, open_client
from amps_py.config import ConfigError, parse_config

DOWNGRADE_AGE = 2.0
UPGRADE_AGE = 0.5
EVERY = 0.25

ACTIONS_XML = f"""
<Actions>
  <Action>
    <On><Module>amps-action-on-schedule</Module><Options><Every>{EVERY}s</Every></Options></On>
    <Do><Module>amps-action-do-downgrade-replication</Module>
        <Options><Age>{DOWNGRADE_AGE}s</Age></Options></Do>
    <Do><Module>amps-action-do-upgrade-replication</Module>
        <Options><Age>{UPGRADE_AGE}s</Age></Options></Do>
  </Action>
</Actions>
<Admin><InetAddr>127.0.0.1:0</InetAddr></Admin>
"""


def destination(base: str) -> dict[str, object]:
    with urllib.request.urlopen(
        f"{base}/amps/instance/replication/destinations/B.json", timeout=10
    ) as response:
        return dict(json.loads(response.read()))


def actions_of(base: str) -> list[dict[str, object]]:
    with urllib.request.urlopen(f"{base}/amps/instance/actions.json", timeout=10) as response:
        return list(json.loads(response.read()))


def metric(base: str, name: str) -> float:
    with urllib.request.urlopen(f"{base}/metrics", timeout=10) as response:
        for line in response.read().decode().splitlines():
            if line.startswith(name + "{"):
                return float(line.split()[-1])
    raise AssertionError(f"no metric {name}")


def start_sync_pair(cluster: Cluster, a_extra: str, seed: int) -> tuple[Any, str]:
    """A -> B sync through a fault proxy, ``a_extra`` (Actions, Admin) in A's config;
    returns (the proxy, A's admin URL)."""

    def a_body(view) -> str:  # type: ignore[no-untyped-def]
        dest = destination_xml("B", "g", True, view.addr("B"), exclude=("replicate",))
        return replication_xml(dest) + a_extra

    cluster.add_instance("A", "g", a_body)
    cluster.add_instance("B", "g", lambda view: "")
    link = cluster.proxy("A", "B", seed=seed)
    cluster.start_all()
    ready = json.loads(cluster.server("A").ready_file.read_text())
    return link, f"http://127.0.0.1:{ready['transports']['admin']}"


async def test_scheduled_downgrade_and_upgrade_follow_the_lag(cluster: Cluster) -> None:
    """The scheduled action acts on the link: a slow one is downgraded (waiting
    publishers get their persisted acks), a healthy one upgraded, once each. That a lag
    between the two Ages changes nothing either way (the hysteresis) is tested on a fake
    clock in tests/test_replication_ackmode.py."""
    link, base = start_sync_pair(cluster, ACTIONS_XML, seed=7)

    def mode() -> str:
        return str(destination(base)["replication_type"])

    def transitions() -> tuple[int, int]:
        d = destination(base)
        return int(str(d["downgrades"])), int(str(d["upgrades"]))

    async def await_mode(want: str, timeout: float) -> None:
        await wait_until(lambda: None if mode() == want else f"B is {mode()}", timeout)

    async with open_client(cluster.uri("A"), "steady") as steady, trio.open_nursery() as nursery:

        async def publish_steadily() -> None:
            # keeps a stream of unacknowledged messages whose age the action measures
            i = 0
            while True:
                await steady.publish("orders", b'{"i":%d}' % i)
                i += 1
                await trio.sleep(0.02)  # pacing, not synchronisation

        nursery.start_soon(publish_steadily)
        assert mode() == "sync"

        # 1. acks would take >= 8 s (4 s each way); the action downgrades once the oldest
        #    unacknowledged message is DOWNGRADE_AGE old, and waiting publishers get
        #    their persisted acks then, long before the link would have delivered them
        link.delay(4.0)
        async with open_client(cluster.uri("A"), "waiting") as waiting:
            await waiting.publish("orders", b'{"w":1}')
            with trio.fail_after(DOWNGRADE_AGE + 3 * EVERY + 2.5):
                await waiting.wait_persisted(waiting.seq, timeout=30)
        assert mode() == "async"
        assert transitions() == (1, 0)
        assert metric(base, "amps_replication_sync") == 0.0
        assert metric(base, "amps_replication_downgrades_total") == 1.0

        # 2. link healthy: upgraded once the lag is under UPGRADE_AGE and caught up
        link.delay(0)
        await await_mode("sync", 30)
        assert transitions() == (1, 1)
        nursery.cancel_scope.cancel()
    log = cluster.log("A")
    assert "15-0009" in log and "15-0010" in log  # both changes logged with their codes
    [action] = actions_of(base)
    # the schedule kept firing while the lag built up (a run every EVERY)
    assert action["runs"] >= DOWNGRADE_AGE / EVERY and action["failures"] == 0
    assert action["do"] == [
        "amps-action-do-downgrade-replication",
        "amps-action-do-upgrade-replication",
    ]


async def test_minimum_sync_destinations_keeps_a_lagging_destination_sync(
    cluster: Cluster,
) -> None:
    """With MinimumSyncDestinations 1 and a single sync destination, a lag over Age is
    logged at every run but never downgrades: publishers keep waiting for B's copy."""

    floor = ACTIONS_XML.replace(
        f"<Age>{DOWNGRADE_AGE}s</Age></Options>",
        "<Age>0.5s</Age><MinimumSyncDestinations>1</MinimumSyncDestinations></Options>",
        1,
    )
    link, base = start_sync_pair(cluster, floor, seed=11)
    link.delay(3.0)
    async with open_client(cluster.uri("A"), "waiting") as waiting:
        await waiting.publish("orders", b'{"w":1}')

        def held_back_twice() -> str | None:
            # the floor's warning is logged once per run that found B over the Age
            held = cluster.log("A").count("MinimumSyncDestinations is 1")
            return None if held >= 2 else f"{held} runs have held B sync so far"

        await wait_until(held_back_twice, 60)
        assert destination(base)["replication_type"] == "sync"
        assert int(str(destination(base)["downgrades"])) == 0
        link.delay(0)
        await waiting.wait_persisted(waiting.seq, timeout=30)  # B's copy, then the ack


@pytest.mark.parametrize(
    ("action", "fragment"),
    [
        (
            "<On><Module>amps-action-on-startup</Module></On>"
            "<Do><Module>amps-action-do-downgrade-replication</Module>"
            "<Options><Age>1s</Age><MinimumSyncDestinations>one</MinimumSyncDestinations>"
            "</Options></Do>",
            "MinimumSyncDestinations 'one' is not a whole number",
        ),
        (
            "<On><Module>amps-action-on-schedule</Module></On>"
            "<Do><Module>amps-action-do-nothing</Module></Do>",
            "amps-action-on-schedule needs Options/Every",
        ),
        (
            "<On><Module>amps-action-on-startup</Module></On>"
            "<Do><Module>amps-action-do-remove-journal</Module></Do>",
            "amps-action-do-remove-journal needs Options/Age",
        ),
        (
            "<On><Module>amps-action-on-startup</Module></On>"
            "<Do><Module>amps-action-do-archive-journal</Module></Do>",
            "add <Options><Age>...</Age></Options>, e.g. 30s or 7d",
        ),
        (
            "<On><Module>amps-action-on-startup</Module></On>"
            "<Do><Module>amps-action-do-compress-journal</Module>"
            "<Options><Age>a week</Age></Options></Do>",
            "write a duration such as 30s or 5m",
        ),
        (
            "<On><Module>amps-action-on-startup</Module></On>"
            "<If><Module>amps-action-if-condition</Module>"
            "<Options><Expression>1 = 1</Expression></Options></If>"
            "<Do><Module>amps-action-do-nothing</Module></Do>",
            "AMPS calls this option Condition, not Expression",
        ),
        (
            "<On><Module>amps-action-on-startup</Module></On>"
            "<If><Module>amps-action-if-file-system-usage</Module>"
            "<Options><Path>.</Path></Options></If>"
            "<Do><Module>amps-action-do-nothing</Module></Do>",
            "needs Options/GreaterThan or Options/LessThan",
        ),
        (
            "<On><Module>amps-action-on-startup</Module></On>"
            "<If><Module>amps-action-if-file-system-usage</Module>"
            "<Options><Path>.</Path><GreaterThan>0.9</GreaterThan></Options></If>"
            "<Do><Module>amps-action-do-nothing</Module></Do>",
            "write a percentage of the file system's size, such as 90%",
        ),
        (
            "<On><Module>amps-action-on-startup</Module></On>"
            "<If><Module>amps-action-if-when-i-feel-like-it</Module></If>"
            "<Do><Module>amps-action-do-nothing</Module></Do>",
            "If module 'amps-action-if-when-i-feel-like-it' is unknown",
        ),
        (
            "<On><Module>amps-action-on-startup</Module></On>"
            "<Do><Module>amps-action-do-downgrade-replication</Module>"
            "<Options><Age>soon</Age></Options></Do>",
            "Options/Age",
        ),
        (
            "<On><Module>amps-action-on-schedule</Module><Options><Every>Caturday at 10:00"
            "</Every></Options></On><Do><Module>amps-action-do-nothing</Module></Do>",
            "'Caturday' is not a weekday",
        ),
        (
            "<On><Module>amps-action-on-signal</Module><Options><Signal>SIGTERM</Signal>"
            "</Options></On><Do><Module>amps-action-do-nothing</Module></Do>",
            "use SIGUSR1, SIGUSR2 or SIGHUP",
        ),
        (
            "<On><Module>amps-action-on-whenever</Module></On>"
            "<Do><Module>amps-action-do-nothing</Module></Do>",
            "On module 'amps-action-on-whenever' is unknown",
        ),
    ],
)
def test_bad_actions_are_config_errors(tmp_path: Path, action: str, fragment: str) -> None:
    text = f"<AMPSConfig><Name>x</Name><Actions><Action>{action}</Action></Actions></AMPSConfig>"
    with pytest.raises(ConfigError) as info:
        parse_config(text)
    assert fragment in str(info.value)


async def test_startup_and_scheduled_actions_publish_messages(tmp_path: Path) -> None:
    """``do-publish-message`` on startup and on a schedule: the messages are journaled
    like any publish (here replayed from EPOCH), with ``{{VAR}}`` substituted."""
    actions = """
<Actions>
  <Action>
    <On><Module>amps-action-on-startup</Module></On>
    <Do><Module>amps-action-do-publish-message</Module>
        <Options><Topic>events</Topic>
                 <Data>{"started":"{{AMPS_INSTANCE_NAME}}","none":"{{NOT_SET}}"}</Data></Options></Do>
  </Action>
  <Action>
    <On><Module>amps-action-on-schedule</Module><Options><Every>100ms</Every></Options></On>
    <Do><Module>amps-action-do-publish-message</Module>
        <Options><Topic>ticks</Topic><Data>{"at":{{AMPS_UNIX_TIMESTAMP}}}</Data></Options></Do>
  </Action>
</Actions>"""
    server = start_instance(tmp_path, "acts", extra=actions)
    try:
        async with open_client(server.uri, "reader") as client:
            async with client.subscribe("events", bookmark="0") as sub:
                msg = await sub.get(10)
                assert msg.json() == {"started": "acts", "none": ""}
            async with client.subscribe("ticks", bookmark="0") as sub:
                for _ in range(3):  # the schedule keeps publishing
                    assert isinstance((await sub.get(10)).json()["at"], int)
    finally:
        server.stop()


# ------------------------------------------------------------------ If modules


class FakeInstance:
    """What ActionRunner uses of an instance, recording what the Do modules ask for."""

    def __init__(self, maintain: Any = None) -> None:
        self.name = "fake"
        self.started_at = 0.0
        self.replication = None
        self.published: list[tuple[str, bytes]] = []
        if maintain is not None:
            self.maintain_journal = maintain

    def publish_internal(self, topic: str, payload: bytes) -> str:
        self.published.append((topic, payload))
        return ""


def actions_from(body: str) -> Any:
    return parse_config(f"<AMPSConfig><Name>x</Name><Actions>{body}</Actions></AMPSConfig>").actions


def startup_action(if_xml: str, topic: str) -> str:
    return (
        "<Action><On><Module>amps-action-on-startup</Module></On>"
        f"{if_xml}"
        "<Do><Module>amps-action-do-publish-message</Module>"
        f"<Options><Topic>{topic}</Topic><Data>{{}}</Data></Options></Do></Action>"
    )


def if_condition(condition: str) -> str:
    return (
        "<If><Module>amps-action-if-condition</Module>"
        f"<Options><Condition>{condition}</Condition></Options></If>"
    )


def if_usage(path: Path, **limits: str) -> str:
    options = "".join(f"<{k}>{v}</{k}>" for k, v in limits.items())
    return (
        "<If><Module>amps-action-if-file-system-usage</Module>"
        f"<Options><Path>{path}</Path>{options}</Options></If>"
    )


async def run_startup(body: str, instance: FakeInstance | None = None) -> tuple[Any, Any]:
    """Run the startup actions of ``body``; returns (instance, statistics by index)."""
    instance = instance or FakeInstance()
    runner = ActionRunner(instance, actions_from(body))  # type: ignore[arg-type]
    async with trio.open_nursery() as nursery:
        await nursery.start(runner.run)  # the startup actions have run when it returns
        nursery.cancel_scope.cancel()
    return instance, runner.statistics()


async def test_if_conditions_gate_the_do_modules_and_count_skips() -> None:
    body = "".join(
        [
            startup_action(if_condition("'{{AMPS_INSTANCE_NAME}}' LIKE '^fa'"), "liked"),
            startup_action(if_condition("'{{AMPS_INSTANCE_NAME}}' = 'other'"), "unequal"),
            startup_action(if_condition("{{AMPS_UNIX_TIMESTAMP}} &gt;= 1700000000"), "later"),
            startup_action(if_condition("2 &lt; 1 OR NOT (1 = 1)"), "never"),
            # every If must hold: the second one does not
            startup_action(if_condition("1 = 1") + if_condition("1 != 1"), "both"),
            startup_action(if_condition("AMPS_INSTANCE_NAME() = 'fake' AND 3 &lt;= 3"), "fn"),
        ]
    )
    instance, stats = await run_startup(body)
    assert [topic for topic, _ in instance.published] == ["liked", "later", "fn"]
    assert [(s["runs"], s["skipped"], s["failures"]) for s in stats] == [
        (1, 0, 0),
        (1, 1, 0),
        (1, 0, 0),
        (1, 1, 0),
        (1, 1, 0),
        (1, 0, 0),
    ]
    assert stats[4]["conditions"] == ["amps-action-if-condition"] * 2


async def test_file_system_usage_thresholds(tmp_path: Path) -> None:
    body = "".join(
        [
            # the file system holding tmp_path is certainly more than 0% used ...
            startup_action(if_usage(tmp_path, GreaterThan="0%"), "over-0"),
            # ... and certainly not more than 100%
            startup_action(if_usage(tmp_path, GreaterThan="100%"), "over-100"),
            startup_action(if_usage(tmp_path, GreaterThan="0%", LessThan="100.5%"), "between"),
            startup_action(if_usage(tmp_path, LessThan="0%"), "under-0"),
            startup_action(if_usage(tmp_path / "no-such-dir", GreaterThan="0%"), "missing"),
        ]
    )
    instance, stats = await run_startup(body)
    assert [topic for topic, _ in instance.published] == ["over-0", "between"]
    assert [s["skipped"] for s in stats] == [0, 1, 0, 1, 0]
    # a Path that cannot be examined is a failure (logged, counted), not a skip
    assert stats[4]["failures"] == 1
    assert "no-such-dir" in stats[4]["last_error"]


async def test_a_condition_broken_by_a_substituted_value_fails_the_run() -> None:
    body = (
        "<Action><On><Module>amps-action-on-connect-client</Module></On>"
        + if_condition("'{{AMPS_CLIENT_NAME}}' LIKE '^important'")
        + "<Do><Module>amps-action-do-publish-message</Module>"
        "<Options><Topic>t</Topic><Data>{{AMPS_CLIENT_NAME}}</Data></Options></Do></Action>"
    )
    instance = FakeInstance()
    runner = ActionRunner(instance, actions_from(body))  # type: ignore[arg-type]
    async with trio.open_nursery() as nursery:
        await nursery.start(runner.run)
        for name in ("important-1", "dull", "o'brien"):
            runner.fire("connect-client", {"AMPS_CLIENT_NAME": name})
        await wait_until(
            lambda: (
                None
                if runner.stats[0].runs == 3 and len(instance.published) == 1
                else f"{runner.stats[0]}"
            ),
            60,
        )
        nursery.cancel_scope.cancel()
    [stats] = runner.statistics()
    assert instance.published == [("t", b"important-1")]
    assert (stats["skipped"], stats["failures"]) == (1, 1)
    assert "is not a valid AMPS filter once its variables are substituted" in stats["last_error"]


def test_a_bad_condition_is_a_config_error_naming_its_line() -> None:
    text = """<AMPSConfig><Name>x</Name><Actions><Action>
  <On><Module>amps-action-on-startup</Module></On>
  <If><Module>amps-action-if-condition</Module>
      <Options>
        <Condition>'{{AMPS_CLIENT_NAME}}' LIKE 'x' AND = {{N}}</Condition>
      </Options></If>
  <Do><Module>amps-action-do-nothing</Module></Do>
</Action></Actions></AMPSConfig>"""
    with pytest.raises(ConfigError) as info:
        parse_config(text)
    [problem] = info.value.problems
    assert problem.line == 5
    assert "Condition" in problem.message and "is not a valid AMPS filter" in problem.message
    # the column counts in the text as written, {{AMPS_CLIENT_NAME}} and all
    assert "found '=' (column 37)" in problem.message
    assert "e.g. <Condition>'{{AMPS_CLIENT_NAME}}' LIKE '^important'</Condition>" in problem.fix


# ---------------------------------------------------------- journal maintenance


JOURNAL_ACTIONS = """
<Actions>
  <Action>
    <On><Module>amps-action-on-schedule</Module><Options><Every>250ms</Every></Options></On>
    <Do><Module>amps-action-do-compress-journal</Module><Options><Age>1s</Age></Options></Do>
  </Action>
  <Action>
    <On><Module>amps-action-on-signal</Module><Options><Signal>SIGUSR1</Signal></Options></On>
    <Do><Module>amps-action-do-remove-journal</Module><Options><Age>1s</Age></Options></Do>
  </Action>
</Actions>
<Admin><InetAddr>127.0.0.1:0</InetAddr></Admin>
"""


async def test_journal_actions_compress_on_schedule_and_remove_on_signal(tmp_path: Path) -> None:
    server = start_instance(
        tmp_path,
        "journaling",
        extra=JOURNAL_ACTIONS,
        journal_extra="<JournalSize>10MB</JournalSize>",
    )
    try:
        ready = json.loads(server.ready_file.read_text())
        base = f"http://127.0.0.1:{ready['transports']['admin']}"

        def journals() -> dict[str, Any]:
            with urllib.request.urlopen(
                f"{base}/amps/instance/transaction_log/journals.json", timeout=10
            ) as response:
                return dict(json.loads(response.read()))

        pad = "p" * 16_384
        total = 1_500  # 16 KB each: two sealed 10 MB journals and the current one
        async with open_client(server.uri, "pub") as pub:
            for n in range(1, total + 1):
                await pub.publish("orders", json.dumps({"n": n, "pad": pad}).encode())
            await pub.flush(timeout=60)
        sealed = [k for k, j in journals().items() if not j["is_current"]]
        assert len(sealed) >= 2, journals()

        def compressed() -> str | None:
            states = {k: j["state"] for k, j in journals().items() if k in sealed}
            left = [k for k, state in states.items() if state != "compressed"]
            return f"journals {left} not compressed yet ({states})" if left else None

        await wait_until(compressed, 30)  # once older than 1 s, at the next 250 ms tick
        async with open_client(server.uri, "reader") as reader:
            async with reader.subscribe("orders", bookmark="0") as sub:
                for n in range(1, total + 1):
                    assert (await sub.get(30)).json()["n"] == n

        server.signal(signal.SIGUSR1)

        def removed() -> str | None:
            left = [k for k in journals() if k in sealed]
            return f"journals {left} not removed yet" if left else None

        await wait_until(removed, 30)
        first = min(int(j["first_txid"]) for j in journals().values())
        async with open_client(server.uri, "reader2") as reader:
            async with reader.subscribe("orders", bookmark="0") as sub:
                assert (await sub.get(30)).json()["n"] == first
        stats = actions_of(base)
        assert [s["failures"] for s in stats] == [0, 0], stats
    finally:
        server.stop()


# ------------------------------------------------------- client connect/disconnect

CLIENT_ACTIONS = """
<Actions>
  <Action>
    <On><Module>amps-action-on-connect-client</Module></On>
    <Do><Module>amps-action-do-publish-message</Module>
        <Options><Topic>client-events</Topic>
                 <Data>{"event":"connect","name":"{{AMPS_CLIENT_NAME}}",
                        "connection":"{{AMPS_CONNECTION_NAME}}",
                        "address":"{{AMPS_REMOTE_ADDRESS}}"}</Data></Options></Do>
  </Action>
  <Action>
    <On><Module>amps-action-on-disconnect-client</Module></On>
    <If><Module>amps-action-if-condition</Module>
        <Options><Condition>'{{AMPS_CLIENT_NAME}}' LIKE '^important'</Condition></Options></If>
    <Do><Module>amps-action-do-publish-message</Module>
        <Options><Topic>client-events</Topic>
                 <Data>{"event":"disconnect","name":"{{AMPS_CLIENT_NAME}}",
                        "connection":"{{AMPS_CONNECTION_NAME}}",
                        "user":"{{AMPS_AUTHENTICATION_ID}}"}</Data></Options></Do>
  </Action>
  <Action>
    <On><Module>amps-action-on-logon-client</Module></On>
    <Do><Module>amps-action-do-publish-message</Module>
        <Options><Topic>logon-events</Topic>
                 <Data>{"name":"{{AMPS_CLIENT_NAME}}","user":"{{AMPS_AUTHENTICATION_ID}}"}</Data>
        </Options></Do>
  </Action>
</Actions>
<Admin><InetAddr>127.0.0.1:0</InetAddr></Admin>
"""


async def test_client_connect_and_disconnect_fire_actions(tmp_path: Path) -> None:
    server = start_instance(tmp_path, "clients", extra=CLIENT_ACTIONS)
    try:
        ready = json.loads(server.ready_file.read_text())
        base = f"http://127.0.0.1:{ready['transports']['admin']}"

        def disconnects() -> tuple[int, int]:
            stats = actions_of(base)[1]
            return int(str(stats["runs"])), int(str(stats["skipped"]))

        async with open_client(server.uri, "watcher") as watcher:
            async with watcher.subscribe("client-events", bookmark="0") as sub:
                # the watcher's own connection, announced before it logged on
                first = (await sub.get(10)).json()
                assert first["event"] == "connect"
                assert first["name"] == first["connection"]
                assert first["connection"].startswith("connection-")
                assert first["address"].startswith("127.0.0.1:")

                async with open_client(server.uri, "dull"):
                    pass
                # its disconnect fails the If, so nothing is published for it
                await wait_until(
                    lambda: None if disconnects() == (1, 1) else f"{disconnects()}", 60
                )
                async with open_client(server.uri, "important-7"):
                    pass

                seen = [(await sub.get(10)).json() for _ in range(3)]
        assert [m["event"] for m in seen] == ["connect", "connect", "disconnect"]
        dull, important, gone = seen
        assert dull["connection"] != important["connection"]
        assert gone == {
            "event": "disconnect",
            "name": "important-7",
            "connection": important["connection"],
            "user": "important-7",
        }
        await wait_until(lambda: None if disconnects() == (3, 2) else f"{disconnects()}", 60)
        connects = actions_of(base)[0]
        assert (connects["runs"], connects["skipped"], connects["failures"]) == (3, 0, 0)
        # logons come after the connection, with the name the client logged on with
        async with (
            open_client(server.uri, "reader") as reader,
            reader.subscribe("logon-events", bookmark="0") as logons,
        ):
            names = [(await logons.get(10)).json()["name"] for _ in range(4)]
        assert names == ["watcher", "dull", "important-7", "reader"]
    finally:
        server.stop()


# ------------------------------------------------------------ replication events

REPLICATION_EVENT_ACTIONS = (
    "<Actions>"
    + "".join(
        f"""
  <Action>
    <On><Module>amps-action-on-{on}</Module></On>
    <Do><Module>amps-action-do-publish-message</Module>
        <Options><Topic>repl-events</Topic>
                 <Data>{{"event":"{on}","peer":"{{{{AMPS_REPLICATION_PEER_NAME}}}}",
                        "destination":"{{{{AMPS_DESTINATION_NAME}}}}",
                        "address":"{{{{AMPS_REPLICATION_REMOTE_ADDRESS}}}}"}}</Data></Options></Do>
  </Action>"""
        for on in ("connect-replication", "replication-resync-complete", "disconnect-replication")
    )
    + "</Actions>"
)


async def test_replication_connect_resync_and_disconnect_fire_actions(cluster: Cluster) -> None:
    def a_body(view) -> str:  # type: ignore[no-untyped-def]
        dest = destination_xml("B", "g", False, view.addr("B"), exclude=("replicate",))
        return replication_xml(dest) + REPLICATION_EVENT_ACTIONS

    cluster.add_instance("A", "g", a_body)
    cluster.add_instance("B", "g", lambda view: "")
    cluster.start("A")
    async with open_client(cluster.uri("A"), "pub") as pub:
        for i in range(50):  # B has something to catch up on when it comes up
            await pub.publish("orders", b'{"i":%d}' % i)
        await pub.flush()
    cluster.start("B")
    async with (
        open_client(cluster.uri("A"), "watcher") as watcher,
        watcher.subscribe("repl-events", bookmark="0") as events_sub,
    ):
        connected = (await events_sub.get(30)).json()
        assert connected["event"] == "connect-replication"
        assert connected["peer"] == "B" and connected["destination"] == "B"
        assert connected["address"] == cluster.view("A").addr("B")
        assert (await events_sub.get(30)).json()["event"] == "replication-resync-complete"
        cluster.stop("B")
        gone = (await events_sub.get(30)).json()
        assert gone["event"] == "disconnect-replication" and gone["peer"] == "B"


# ------------------------------------------------------------------ on-admin

ADMIN_ACTIONS = """
<Actions>
  <Action>
    <On><Module>amps-action-on-admin</Module>
        <Options><Path>say-hello</Path><Name>hello</Name>
                 <Description>publish a greeting</Description>
                 <RequiredParameter>who</RequiredParameter></Options></On>
    <Do><Module>amps-action-do-publish-message</Module>
        <Options><Topic>greetings</Topic><Data>{"hello":"{{who}}"}</Data></Options></Do>
  </Action>
</Actions>
<Admin><InetAddr>127.0.0.1:0</InetAddr></Admin>
"""


def http_get(url: str) -> tuple[int, Any]:
    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def http_post(url: str) -> tuple[int, Any]:
    """Run an admin action: POST with the header the admin API requires of changes."""
    request = urllib.request.Request(url, method="POST", headers={"X-AMPS-Admin": "1"})
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


async def test_admin_actions_run_with_query_parameters(tmp_path: Path) -> None:
    server = start_instance(tmp_path, "adminact", extra=ADMIN_ACTIONS)
    try:
        ready = json.loads(server.ready_file.read_text())
        base = f"http://127.0.0.1:{ready['transports']['admin']}/amps/administrator/actions"
        status, listing = http_get(f"{base}.json")
        assert status == 200
        assert listing["actions"] == [
            {
                "path": "say-hello",
                "name": "hello",
                "description": "publish a greeting",
                "required_parameters": ["who"],
                "action": 1,
            }
        ]
        status, body = http_post(f"{base}/say-hello.json")
        assert status == 400 and "needs the parameter(s) who" in body["error"]
        status, body = http_post(f"{base}/say-goodbye.json")
        assert status == 404 and "paths: say-hello" in body["error"]
        status, body = http_post(f"{base}/say-hello.json?who=operators")
        assert status == 200
        assert body["runs"] == [{"action": 1, "name": "hello", "outcome": "done"}]
        async with (
            open_client(server.uri, "reader") as reader,
            reader.subscribe("greetings", bookmark="0") as sub,
        ):
            assert (await sub.get(10)).json() == {"hello": "operators"}
    finally:
        server.stop()


def test_admin_action_from_the_console(tmp_path: Path) -> None:
    server = start_instance(tmp_path, "adminact", extra=ADMIN_ACTIONS)
    try:
        ready = json.loads(server.ready_file.read_text())
        url = f"http://127.0.0.1:{ready['transports']['admin']}"

        def console(*args: str) -> subprocess.CompletedProcess[str]:
            return subprocess.run(
                [sys.executable, "-m", "amps_py", "admin", "--url", url, *args],
                capture_output=True,
                text=True,
                timeout=60,
                check=False,
            )

        listed = console("actions")
        assert (
            listed.returncode == 0 and "say-hello: hello (who) publish a greeting" in listed.stdout
        )
        ran = console("action", "say-hello", "who=the night shift")
        assert ran.returncode == 0 and "hello (action 1): done" in ran.stdout, ran.stderr
        missing = console("action", "say-hello")
        assert missing.returncode != 0 and "needs the parameter(s) who" in missing.stderr
        bad = console("action", "say-hello", "who")
        assert bad.returncode == 2 and "is not NAME=VALUE" in bad.stderr
    finally:
        server.stop()


DOORS_ACTIONS = """
<Actions>
  <Action>
    <On><Module>amps-action-on-admin</Module><Options><Path>close</Path></Options></On>
    <Do><Module>amps-action-do-disable-transport</Module>
        <Options><Transport>json-tcp</Transport></Options></Do>
  </Action>
  <Action>
    <On><Module>amps-action-on-admin</Module><Options><Path>open</Path></Options></On>
    <Do><Module>amps-action-do-enable-transport</Module>
        <Options><Transport>json-tcp</Transport></Options></Do>
  </Action>
  <Action>
    <On><Module>amps-action-on-admin</Module><Options><Path>typo</Path></Options></On>
    <Do><Module>amps-action-do-disable-transport</Module>
        <Options><Transport>json-tpc</Transport></Options></Do>
  </Action>
</Actions>
<Admin><InetAddr>127.0.0.1:0</InetAddr></Admin>
"""


async def test_transport_actions_close_and_open_the_client_port(tmp_path: Path) -> None:
    # a reserved port: the transport opened again listens on its configured port
    with reserve_port() as held:
        server = start_instance(tmp_path, "doors", port=held.getsockname()[1], extra=DOORS_ACTIONS)
        try:
            ready = json.loads(server.ready_file.read_text())
            base = f"http://127.0.0.1:{ready['transports']['admin']}/amps/administrator/actions"
            async with open_client(server.uri, "early") as early:
                status, body = await trio.to_thread.run_sync(http_post, f"{base}/close.json")
                assert status == 200 and body["runs"][0]["outcome"] == "done", body
                with pytest.raises(ConnectionLost):
                    await early.publish_persisted("orders", b"{}", timeout=10)
            with pytest.raises(OSError):
                await trio.open_tcp_stream("127.0.0.1", server.port)
            status, body = await trio.to_thread.run_sync(http_post, f"{base}/open.json")
            assert status == 200 and body["runs"][0]["outcome"] == "done", body
            async with open_client(server.uri, "late") as late:
                await late.publish_persisted("orders", b"{}", timeout=10)
            status, body = await trio.to_thread.run_sync(http_post, f"{base}/typo.json")
            assert status == 200
            outcome = body["runs"][0]["outcome"]
            assert outcome == (
                "failed: amps-action-do-disable-transport: no client transport 'json-tpc'; "
                "client transports: json-tcp"
            ), outcome
        finally:
            server.stop()
