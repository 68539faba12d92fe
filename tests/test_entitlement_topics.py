"""Read entitlement is decided per concrete topic, never by a topic expression's text.

A user whose rule is ``"*": {"read": "public\\..*"}`` must not read ``secret`` through
``public.x|secret``, ``public.|.*`` or ``.*``: not in a bookmark replay, not in a
``sow`` or ``sow_and_subscribe`` over SOW topics, not in a live subscription. The
instance runs as a real process with the real rule entitlement module; clients speak
the wire protocol over TCP.
"""

from __future__ import annotations

import json
import random
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
import trio
from harness import ServerProcess, start_instance
from hypothesis import given, settings
from hypothesis import strategies as st

from amps_py import auth
from amps_py.client import Client, CommandError, open_client
from amps_py.server.subscriptions import EntitledTopics, compile_topic

#: every topic the tests publish to; the SOW topics are keyed by /id
TOPICS = ("public.x", "public.y", "public.book", "audit", "secret", "orders", "prices")
SOW_TOPICS = ("public.book", "orders", "prices")

SOW_XML = "<SOW>" + "".join(
    f"<Topic><Name>{t}</Name><MessageType>json</MessageType><Key>/id</Key></Topic>"
    for t in SOW_TOPICS
) + "</SOW>"

#: pieces random rules and topic expressions are made of
PIECES = (
    "public\\..*",
    "public\\.x",
    "public\\.",
    "audit",
    "secret",
    "orders",
    "prices",
    "o.*",
    ".*s",
    "p.*",
    ".*",
    "(audit|secret)",
    "[ao].*",
)


def rules_xml(rules_file: Path) -> str:
    return (
        "<Entitlement><Module>amps-rule-entitlement</Module>"
        f"<Options><RulesFile>{rules_file}</RulesFile></Options></Entitlement>"
    )


def readable(rule: str | None, expression: str, topics: tuple[str, ...] = TOPICS) -> set[str]:
    """The topics a user with read rule ``rule`` may get through ``expression``:
    those the expression's regex finds and the rule matches whole."""
    if rule is None:
        return set()
    pattern = re.compile(expression)
    allowed = re.compile(rule)
    return {t for t in topics if pattern.search(t) and allowed.fullmatch(t)}


def start(tmp_path: Path, rules: dict[str, dict[str, object]]) -> ServerProcess:
    rules_file = tmp_path / "rules.json"
    rules_file.write_text(json.dumps(rules))
    return start_instance(tmp_path, "ent", extra=rules_xml(rules_file) + SOW_XML)


@pytest.fixture
def server(tmp_path: Path) -> Iterator[ServerProcess]:
    rules: dict[str, dict[str, object]] = {
        "ops": {"read": ".*", "write": ".*"},
        "mute": {"write": ".*"},
        "*": {"read": "public\\..*"},
    }
    server = start(tmp_path, rules)
    try:
        yield server
    finally:
        server.stop()


async def publish_all(client: Client, marker: int = 0) -> None:
    """One persisted message on every topic (``{"id": 1, "m": marker}``)."""
    for topic in TOPICS:
        await client.publish_persisted(topic, json.dumps({"id": 1, "m": marker}))


async def replayed_topics(client: Client, expression: str) -> set[str]:
    """The topics a bookmark replay from EPOCH over ``expression`` delivers."""
    async with client.bookmark_subscribe(expression, "0") as sub:
        with trio.fail_after(30):
            await sub.completed.wait()
        # everything replayed arrived before the completed ack, in order
        return {(await sub.get(10)).topic for _ in range(sub.delivered)}


async def test_a_regex_replay_reads_only_entitled_topics(server: ServerProcess) -> None:
    async with open_client(server.uri, "ops-feed", user_id="ops") as ops:
        await publish_all(ops)
    async with open_client(server.uri, "guest-c", user_id="guest") as guest:
        got = await replayed_topics(guest, "public.x|audit|secret|orders")
        assert got == {"public.x"}, f"the replay delivered {sorted(got)}"
        got = await replayed_topics(guest, ".*")
        assert got == {"public.x", "public.y", "public.book"}, f"the replay delivered {sorted(got)}"
        # an exact topic the rule refuses is still refused outright
        with pytest.raises(CommandError) as info:
            await replayed_topics(guest, "secret")
        assert info.value.reason == "not entitled"


async def test_a_regex_sow_query_reads_only_entitled_sow_topics(server: ServerProcess) -> None:
    async with open_client(server.uri, "ops-feed", user_id="ops") as ops:
        await publish_all(ops)
        everything = await ops.sow(".*")
        assert {r.topic for r in everything} == set(SOW_TOPICS)
    async with open_client(server.uri, "guest-c", user_id="guest") as guest:
        # the same answer as if no SOW topic matched: orders is not revealed
        with pytest.raises(CommandError) as info:
            await guest.sow("public.x|orders")
        assert info.value.reason == "invalid topic"
        assert "matches no SOW topic user 'guest' may read" in str(info.value)
        found = await guest.sow("public\\..*|orders|prices")
        assert [r.topic for r in found] == ["public.book"]
        with pytest.raises(CommandError) as info:
            await guest.sow("orders")
        assert info.value.reason == "not entitled"


async def test_live_regex_subscriptions_skip_topics_the_user_may_not_read(
    server: ServerProcess,
) -> None:
    async with (
        open_client(server.uri, "ops-feed", user_id="ops") as ops,
        open_client(server.uri, "guest-c", user_id="guest") as guest,
    ):
        await publish_all(ops)
        async with (
            guest.subscribe("public.|.*") as live,
            guest.sow_and_subscribe(".*") as both,
        ):
            # the snapshot: only the SOW topic the rule lets this user read
            first = await both.get(10)
            assert (first.topic, first.snapshot) == ("public.book", True)
            # published in this order by one publisher, so delivered in this order
            await ops.publish_persisted("secret", b'{"id": 2}')
            await ops.publish_persisted("orders", b'{"id": 2}')
            await ops.publish_persisted("public.z", b'{"id": 2}')
            got = await live.get(10)
            assert got.topic == "public.z", f"the live subscription delivered {got.topic!r}"
            got = await both.get(10)
            assert got.topic == "public.z", f"sow_and_subscribe delivered {got.topic!r}"


async def test_a_user_who_may_read_nothing_gets_no_regex_subscription(
    server: ServerProcess,
) -> None:
    async with open_client(server.uri, "mute-c", user_id="mute") as mute:
        for expression in (".*", "public\\..*"):
            with pytest.raises(CommandError) as info:
                async with mute.subscribe(expression):
                    pass
            assert info.value.reason == "not entitled"
            assert "may read no topic" in str(info.value)
        # writing is still allowed by its rule
        await mute.publish_persisted("audit", b'{"id": 3}')


async def test_random_rules_and_expressions_read_exactly_the_entitled_topics(
    tmp_path: Path,
) -> None:
    seed = 2511
    print(f"random seed {seed}")
    rng = random.Random(seed)
    rules: dict[str, dict[str, object]] = {"ops": {"read": ".*", "write": ".*"}}
    for n in range(10):
        rules[f"u{n}"] = {"read": "|".join(rng.sample(PIECES, rng.randint(1, 3)))}
    server = start(tmp_path, rules)
    try:
        async with open_client(server.uri, "ops-feed", user_id="ops") as ops:
            await publish_all(ops)
        for n in range(10):
            user = f"u{n}"
            rule = str(rules[user]["read"])
            async with open_client(server.uri, f"{user}-c", user_id=user) as client:
                for _ in range(3):
                    expression = "|".join(rng.sample(PIECES, rng.randint(1, 3)))
                    if compile_topic(expression) is None:
                        continue  # an exact topic: checked outright, covered above
                    want = readable(rule, expression)
                    got = await replayed_topics(client, expression)
                    assert got == want, f"{user} (read {rule!r}) replaying {expression!r}"
                    sow_want = want & set(SOW_TOPICS)
                    try:
                        found = {r.topic for r in await client.sow(expression)}
                    except CommandError as exc:
                        assert exc.reason == "invalid topic", exc
                        found = set()
                    assert found == sow_want, f"{user} (read {rule!r}) sow {expression!r}"
    finally:
        server.stop()


# --------------------------------------------------------------------- pure


@settings(max_examples=300, deadline=None)
@given(
    rule=st.one_of(st.none(), st.lists(st.sampled_from(PIECES), min_size=1, max_size=3)),
    expression=st.lists(st.sampled_from(PIECES), min_size=1, max_size=3),
    topics=st.lists(
        st.one_of(
            st.sampled_from(TOPICS),
            st.text(alphabet="abcdeiloprstuxy.", min_size=1, max_size=12),
        ),
        min_size=1,
        max_size=20,
    ),
)
def test_entitled_topics_match_only_what_the_rule_allows(
    rule: list[str] | None, expression: list[str], topics: list[str]
) -> None:
    """Whatever the rule and the expression: the pattern a restricted user's
    subscription runs finds a topic exactly when the expression finds it and the
    rule matches it whole; the expression's own text never matters."""
    rule_text = None if rule is None else "|".join(rule)
    entry = {} if rule_text is None else {"read": rule_text}
    entitler = auth.RuleEntitler(auth.EntitlementRules.parse(json.dumps({"u": entry})))
    regex = re.compile("|".join(expression))
    pattern = EntitledTopics(regex, lambda topic: entitler.can_read("u", topic))
    assert entitler.reads_nothing("u") == (rule_text is None)
    assert not entitler.reads_everything("u")
    for topic in topics:
        expected = topic in readable(rule_text, regex.pattern, (topic,))
        assert (pattern.search(topic) is not None) == expected, topic
