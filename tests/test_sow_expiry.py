"""SOW record expiration: a topic's ``Expiration`` interval and a publish's ``e``,
records gone from queries the moment they expire, the sweeper's ``oof`` messages
(reason ``expired``) and ``amps-action-on-sow-expire-message``, and expiry across a
restart and a rebuild from the journal.

Real time is used only where the wiring needs it (a 2 s topic lifetime, polled with
deadlines); the rest moves the SOW clock (``SowState.clock``) or drives the sweep step
with a fake ``now``.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import orjson
import pytest
import trio
from inprocess import InProcessInstance, serve_instance

from amps_py.actions.runner import on_selects
from amps_py.client import Client, CommandError, open_client
from amps_py.config import ActionModule, SowTopicConfig
from amps_py.message_types import default_types
from amps_py.protocol import encode_frame
from amps_py.server.sow_commands import Query
from amps_py.server.sow_expiry import action_variables, sweep
from amps_py.server.sowing import SowState
from amps_py.sow.expiry import BadExpiration, parse_lifetime, wall_clock_us
from txlog import Record

SECOND = 1_000_000

SOW_XML = """
<SOW>
  <Topic><Name>ticks</Name><MessageType>json</MessageType><Key>/id</Key>
    <Expiration>2s</Expiration></Topic>
  <Topic><Name>alerts</Name><MessageType>json</MessageType><Key>/id</Key>
    <Expiration>enabled</Expiration></Topic>
  <Topic><Name>orders</Name><MessageType>json</MessageType><Key>/id</Key></Topic>
</SOW>
<Actions>
  <Action>
    <On><Module>amps-action-on-sow-expire-message</Module>
      <Options><Topic>ticks</Topic><MessageType>json</MessageType></Options></On>
    <Do><Module>amps-action-do-publish-message</Module>
      <Options><Topic>expired-log</Topic>
        <Data>{"topic":"{{AMPS_TOPIC}}","reason":"{{AMPS_REASON}}","doc":{{AMPS_DATA}}}</Data>
      </Options></Do>
  </Action>
</Actions>
"""


async def publish_docs(client: Client, topic: str, docs: list[dict[str, Any]]) -> None:
    for doc in docs:
        await client.publish(topic, orjson.dumps(doc))
    await client.wait_persisted(client.seq, timeout=10)


async def publish_with_e(client: Client, topic: str, doc: dict[str, Any], e: Any) -> None:
    """A persisted publish with an ``e`` (expiration) header (the client library has
    no argument for it: the frame is written by hand)."""
    client.seq += 1
    seq = client.seq
    header = {"c": "p", "t": topic, "s": seq, "a": "persisted", "e": e}
    await client.send_raw(encode_frame(header, orjson.dumps(doc)))
    await client.wait_persisted(seq, timeout=10)


async def ids(client: Client, topic: str) -> list[int]:
    return sorted(r.json()["id"] for r in await client.sow(topic))


def store_count(inst: InProcessInstance, topic: str) -> int:
    sow = inst.instance.sow.get(topic)
    assert sow is not None
    return sow.store.count


def expires_us(inst: InProcessInstance, topic: str, key: str) -> int:
    sow = inst.instance.sow.get(topic)
    assert sow is not None
    entry = sow.store.get(key)
    assert entry is not None, f"no record {key} in {topic}"
    return entry.expires_us


async def wait_until(check: Any, timeout: float = 10, what: str = "") -> None:
    with trio.move_on_after(timeout):
        while not check():
            await trio.sleep(0.02)
        return
    raise AssertionError(f"not within {timeout} s: {what}")


# ------------------------------------------------------------------ end to end


async def test_records_expire_after_the_topic_lifetime_with_oof_and_action(
    tmp_path: Path,
) -> None:
    async with serve_instance(tmp_path, "exp", extra=SOW_XML) as inst:
        async with (
            open_client(inst.uri, "p") as p,
            open_client(inst.uri, "oof") as s_oof,
            open_client(inst.uri, "plain") as s_plain,
            open_client(inst.uri, "log") as s_log,
        ):
            async with (
                s_oof.subscribe("ticks", options="oof") as with_oof,
                s_plain.subscribe("ticks") as without_oof,
                s_log.subscribe("expired-log") as log_topic,
            ):
                start = wall_clock_us()
                await publish_docs(p, "ticks", [{"id": i, "px": i * 10} for i in (1, 2, 3)])
                assert await ids(p, "ticks") == [1, 2, 3]
                for _ in range(3):
                    assert (await with_oof.get(10)).command == "publish"
                    assert (await without_oof.get(10)).command == "publish"
                oofs = [await with_oof.get(10) for _ in range(3)]
                gone_at = wall_clock_us()
                assert {m.command for m in oofs} == {"oof"}
                assert {m.reason for m in oofs} == {"expired"}
                assert sorted(m.json()["id"] for m in oofs) == [1, 2, 3]
                assert gone_at - start >= 2 * SECOND, "not before the 2 s lifetime"
                assert await ids(p, "ticks") == []
                assert store_count(inst, "ticks") == 0
                # the subscription without the oof option got none: its next message
                # is the one published after the records expired
                await publish_docs(p, "ticks", [{"id": 9}])
                nxt = await without_oof.get(10)
                assert (nxt.command, nxt.json()) == ("publish", {"id": 9})
                # one action run per expired record, with the AMPS variables
                logged = [(await log_topic.get(10)).json() for _ in range(3)]
                assert {(d["topic"], d["reason"]) for d in logged} == {("ticks", "time_limit")}
                assert sorted(d["doc"]["id"] for d in logged) == [1, 2, 3]


async def test_e_header_expires_a_record_of_an_enabled_topic(tmp_path: Path) -> None:
    async with serve_instance(tmp_path, "exp", extra=SOW_XML) as inst:
        async with open_client(inst.uri, "p") as p, open_client(inst.uri, "s") as s:
            async with s.subscribe("alerts", options="oof") as live:
                await publish_with_e(p, "alerts", {"id": 1, "msg": "short"}, 30)
                await publish_docs(p, "alerts", [{"id": 2, "msg": "no e: never expires"}])
                await publish_with_e(p, "alerts", {"id": 3, "msg": "string e"}, "7200")
                for _ in range(3):
                    await live.get(10)
                assert await ids(p, "alerts") == [1, 2, 3]
                state = inst.instance.sow
                key1 = (await s.sow("alerts", filter="/id = 1"))[0].key
                expiry = expires_us(inst, "alerts", key1)
                # move the SOW clock to 30 s after the publish: id 1 has expired
                state.clock = lambda: expiry
                assert await ids(p, "alerts") == [2, 3]
                oof = await live.get(10)  # the sweeper runs on the same clock
                assert (oof.command, oof.reason, oof.json()["id"]) == ("oof", "expired", 1)
                state.clock = lambda: expiry + 10_000 * SECOND
                assert await ids(p, "alerts") == [2]
                # e on an interval topic overrides the topic's lifetime
                state.clock = wall_clock_us
                await publish_with_e(p, "ticks", {"id": 5}, 3600)
                await publish_docs(p, "ticks", [{"id": 6}])
                state.clock = lambda: wall_clock_us() + 60 * SECOND
                assert await ids(p, "ticks") == [5]


async def test_a_bad_e_header_is_refused(tmp_path: Path) -> None:
    async with serve_instance(tmp_path, "exp", extra=SOW_XML) as inst:
        async with open_client(inst.uri, "p") as p:
            for bad in (-1, 0, "-5"):  # (not an integer at all: the codec refuses it)
                with pytest.raises(CommandError) as info:
                    await publish_with_e(p, "alerts", {"id": 1}, bad)
                assert info.value.reason == "invalid options"
                assert "expiration (e)" in str(info.value)
            # a topic whose records never expire ignores e
            await publish_with_e(p, "orders", {"id": 1}, -1)
            assert await ids(p, "orders") == [1]


async def test_a_query_at_the_expiry_time_never_returns_the_record(tmp_path: Path) -> None:
    async with serve_instance(tmp_path, "exp", extra=SOW_XML) as inst:
        async with open_client(inst.uri, "p") as p:
            await publish_docs(p, "ticks", [{"id": 1}])
            await publish_docs(p, "ticks", [{"id": 2}])
            records = await p.sow("ticks")
            expiry = {r.json()["id"]: expires_us(inst, "ticks", r.key) for r in records}
            first, second = expiry[1], expiry[2]
            assert first < second
            state = inst.instance.sow
            state.clock = lambda: first - 1
            assert await ids(p, "ticks") == [1, 2]
            state.clock = lambda: first  # at its expiry time a record has expired
            assert await ids(p, "ticks") == [2]
            state.clock = lambda: second
            assert await ids(p, "ticks") == []
            async with p.sow_and_subscribe("ticks") as sub:
                await publish_docs(p, "ticks", [{"id": 3}])
                got = await sub.get(10)
                # no snapshot record: the first message is the live publish
                assert (got.command, got.json()) == ("publish", {"id": 3})
            # a delta onto an expired record merges onto nothing
            await p.delta_publish("ticks", b'{"id":2,"note":"new"}')
            await p.wait_persisted(p.seq, timeout=10)
            state.clock = wall_clock_us
            assert [r.json() for r in await p.sow("ticks", filter="/id = 2")] == [
                {"id": 2, "note": "new"}
            ]


async def test_records_that_expired_while_down_are_gone_after_restart_and_rebuild(
    tmp_path: Path,
) -> None:
    async with serve_instance(tmp_path, "exp", extra=SOW_XML) as inst:
        async with open_client(inst.uri, "p") as p:
            await publish_docs(p, "ticks", [{"id": i} for i in range(5)])
            await publish_with_e(p, "alerts", {"id": 1}, 3600)
            key = (await p.sow("alerts"))[0].key
            deadline = max(expires_us(inst, "ticks", r.key) for r in await p.sow("ticks"))
            alert_expiry = expires_us(inst, "alerts", key)
        await inst.stop()
        while wall_clock_us() <= deadline:
            await trio.sleep(0.05)  # let the lifetime pass while the instance is down
        await inst.start()
        await wait_until(lambda: store_count(inst, "ticks") == 0, what="expired records swept")
        async with open_client(inst.uri, "q") as q:
            assert await ids(q, "ticks") == []
        # the accepting instance keeps a publish's own lifetime in its store
        assert expires_us(inst, "alerts", key) == alert_expiry
        await inst.stop()
        shutil.rmtree(inst.journal_dir / "sow")
        await inst.start()
        # rebuilt from the journal: the expiry comes again from the origin time
        await wait_until(lambda: store_count(inst, "ticks") == 0, what="rebuilt, then swept")
        async with open_client(inst.uri, "q") as q:
            assert await ids(q, "ticks") == []
            assert await ids(q, "alerts") == [1]
        assert "17-0001" in inst.log_text()


# ------------------------------------------------------------------ the pure parts


def _state(tmp_path: Path, expiration: float | None = 2.0) -> SowState:
    config = SowTopicConfig("ticks", "json", ("/id",), expiration=expiration)
    state = SowState([config], tmp_path)
    state.open()
    return state


def _record(txid: int, doc: dict[str, Any], origin_ts: int, local_ts: int) -> Record:
    return Record(
        topic="ticks",
        payload=orjson.dumps(doc),
        pub_hash=7,
        seq=txid,
        txid=txid,
        sow_key=str(doc["id"]),
        origin_ts=origin_ts,
        local_ts=local_ts,
    )


def test_expiry_counts_from_the_origin_time_on_every_instance(tmp_path: Path) -> None:
    origin = 1_700_000_000 * SECOND
    here, replica = _state(tmp_path / "a"), _state(tmp_path / "b")
    try:
        here.apply([_record(1, {"id": 1}, origin, origin)])
        # the replica journals it 0.5 s later: same expiry time
        replica.apply([_record(1, {"id": 1}, origin, origin + SECOND // 2)])
        for state in (here, replica):
            entry = state.topics["ticks"].store.get("1")
            assert entry is not None and entry.expires_us == origin + 2 * SECOND
    finally:
        here.close()
        replica.close()


def test_sweep_removes_due_records_in_batches_without_moving_the_applied_txid(
    tmp_path: Path,
) -> None:
    t0 = 1_700_000_000 * SECOND
    state = _state(tmp_path)
    try:
        state.apply([_record(i, {"id": i}, t0 + i * SECOND, t0 + i * SECOND) for i in range(1, 6)])
        store = state.topics["ticks"].store
        assert sweep(state, t0 + 2 * SECOND, limit=10) == ([], False)
        removed, more = sweep(state, t0 + 5 * SECOND, limit=2)  # ids 1, 2, 3 are due
        assert more and [e.key for e in removed[0].entries] == ["1", "2"]
        assert removed[0].reason == "expired" and removed[0].topic == "ticks"
        removed, more = sweep(state, t0 + 5 * SECOND, limit=2)
        assert not more and [e.key for e in removed[0].entries] == ["3"]
        assert store.count == 2 and store.applied_txid == 5
        # a record replaced before it expired lives from its new origin time
        state.apply([_record(6, {"id": 4}, t0 + 10 * SECOND, t0 + 10 * SECOND)])
        removed, _ = sweep(state, t0 + 11 * SECOND)
        assert [e.key for e in removed[0].entries] == ["5"]
        assert [e.key for e in store.expired(t0 + 12 * SECOND)] == ["4"]
    finally:
        state.close()


class _Session:
    """What a :class:`Query` reads of a session."""

    def __init__(self, state: SowState) -> None:
        self.instance = self
        self.sow = state
        self.message_type = "json"
        self.message_types = default_types()

    def topics_to_read(self, topic: str, non_regex: bool) -> None:
        return None  # an exact topic this user may read

    def compile_filter(self, text: str) -> Any:
        raise AssertionError("no filter in these queries")


def test_query_and_current_skip_an_expired_record_before_the_sweep(tmp_path: Path) -> None:
    t0 = 1_700_000_000 * SECOND
    state = _state(tmp_path)
    try:
        state.apply([_record(1, {"id": 1}, t0, t0), _record(2, {"id": 2}, t0 + SECOND, t0)])
        sow = state.topics["ticks"]
        query = Query(_Session(state), {"t": "ticks"})  # type: ignore[arg-type]
        for now, expected in ((t0 + 2 * SECOND - 1, ["1", "2"]), (t0 + 2 * SECOND, ["2"])):
            state.clock = lambda now=now: now  # type: ignore[misc]
            entries, matched, _held = query.collect([(sow, sow.store.snapshot())])
            assert [e.key for _, got in entries for e in got] == expected
            assert matched == len(expected)
        assert sow.current("1") is None and sow.current("2") == b'{"id":2}'
        assert sow.store.count == 2, "nothing was removed: reads alone skip it"
    finally:
        state.close()


def test_e_values() -> None:
    assert parse_lifetime(None) is None and parse_lifetime("") is None
    assert parse_lifetime(30) == 30.0 and parse_lifetime("1.5") == 1.5
    for bad in (0, -3, "soon", True, float("nan"), 1e12):
        with pytest.raises(BadExpiration, match=r"expiration \(e\)"):
            parse_lifetime(bad)


def test_the_expire_action_runs_for_its_topic_and_reasons_only() -> None:
    def on(**options: str) -> ActionModule:
        return ActionModule("amps-action-on-sow-expire-message", options, 1)

    from amps_py.sow.entry import SowEntry

    variables = action_variables("ticks", SowEntry("k1", 1, "1|1|", "cid", 0, b'{"id":1}', 5))
    assert variables["AMPS_DATA"] == '{"id":1}' and variables["AMPS_DATA_LENGTH"] == "8"
    assert variables["AMPS_CORRELATION_ID"] == "cid" and variables["AMPS_SOW_KEY"] == "k1"
    event = "sow-expire-message"
    assert on_selects(on(Topic="ticks", MessageType="json"), event, variables)
    assert not on_selects(on(Topic="alerts", MessageType="json"), event, variables)
    assert on_selects(on(Topic="ticks", Reason="forced_expire, time_limit"), event, variables)
    assert not on_selects(on(Topic="ticks", Reason="max_cancels"), event, variables)
    assert not on_selects(on(Topic="ticks"), "sow-delete-message", variables)


async def test_the_expire_action_needs_its_topic(tmp_path: Path) -> None:
    from harness import write_config

    from amps_py.config import ConfigError, load_config

    xml = (
        "<Actions><Action><On><Module>amps-action-on-sow-expire-message</Module>"
        "<Options><MessageType>json</MessageType></Options></On>"
        "<Do><Module>amps-action-do-nothing</Module></Do></Action></Actions>"
    )
    with pytest.raises(ConfigError, match="needs Options/Topic"):
        load_config(write_config(tmp_path, "bad", 0, extra=xml))
