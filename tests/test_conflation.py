"""Conflated subscriptions, the pure part (amps_py.server.conflation): which message
of a key is delivered and when, with time passed in; and reading the options."""

from __future__ import annotations

import random

import pytest

from amps_py import reasons
from amps_py.protocol.server.commands import CommandFailed, options
from amps_py.server.conflation import ConflationSpec, Conflator, conflation_spec


def test_the_latest_of_a_key_is_delivered_once_its_interval_is_over() -> None:
    c: Conflator[str] = Conflator(2.0)
    assert c.next_deadline() is None
    assert c.offer("a", "a1", now=10.0) is True  # was idle: the timer must wake
    assert c.offer("a", "a2", now=10.5) is False
    assert c.offer("b", "b1", now=11.0) is False
    assert c.offer("a", "a3", now=11.9) is False
    assert c.next_deadline() == 12.0
    assert c.due(11.99) == []
    assert c.due(12.0) == ["a3"]
    assert c.next_deadline() == 13.0
    # a message of a after its delivery starts a new interval
    c.offer("a", "a4", now=12.5)
    assert c.due(13.0) == ["b1"]
    assert c.due(100.0) == ["a4"]
    assert len(c) == 0 and c.next_deadline() is None


def test_late_timer_delivers_everything_due_in_first_held_order() -> None:
    c: Conflator[int] = Conflator(1.0)
    for i, key in enumerate("xyzx"):
        c.offer(key, i, now=float(i) / 10)
    assert c.due(5.0) == [3, 1, 2]  # x (its latest), y, z


def test_clear_drops_what_is_held() -> None:
    c: Conflator[int] = Conflator(1.0)
    c.offer("k", 1, now=0.0)
    c.clear()
    assert c.due(10.0) == [] and len(c) == 0


def test_interval_must_be_positive() -> None:
    with pytest.raises(ValueError, match="interval"):
        Conflator(0)


def test_at_most_one_per_key_per_interval_and_always_the_latest() -> None:
    """A random stream driven through the conflator with a late-ish timer: per key,
    deliveries are at least an interval apart, each is the newest message of the key
    offered before it went out, and the key's last message is always delivered."""
    rnd = random.Random(28)
    interval = 0.5
    c: Conflator[tuple[str, int]] = Conflator(interval)
    now = 0.0
    delivered: list[tuple[float, tuple[str, int]]] = []
    latest: dict[str, int] = {}
    for seq in range(2000):
        now += rnd.expovariate(50)
        deadline = c.next_deadline()
        if deadline is not None and deadline <= now:
            fire = max(deadline, now - rnd.random() * 0.01)
            delivered.extend((fire, item) for item in c.due(fire))
        key = rnd.choice("abcde")
        latest[key] = seq
        c.offer(key, (key, seq), now)
        # the newest of each key seen so far is never older than what is held
    delivered.extend((now + interval, item) for item in c.due(now + interval))
    last_time: dict[str, float] = {}
    last_seq: dict[str, int] = {}
    for when, (key, seq) in delivered:
        if key in last_time:
            assert when - last_time[key] >= interval - 1e-9
            assert seq > last_seq[key]
        last_time[key], last_seq[key] = when, seq
    assert last_seq == latest


def test_options_read_bracketed_lists_whole() -> None:
    opts = options({"o": "conflation=2s, conflation_key = [/sym,/venue],oof"})
    assert opts == {"conflation": "2s", "conflation_key": "[/sym,/venue]", "oof": ""}


def test_conflation_spec_reads_interval_and_key_paths() -> None:
    assert conflation_spec({}) is None
    spec = conflation_spec({"conflation": "500ms"})
    assert spec is not None and spec.interval == 0.5 and spec.paths == ()
    spec = conflation_spec({"conflation": "2", "conflation_key": "[/sym, /venue]"})
    assert spec is not None and spec.interval == 2.0 and spec.paths == ("/sym", "/venue")
    spec = conflation_spec({"conflation": "1s", "conflation_key": "/id"})
    assert spec is not None and spec.paths == ("/id",)


@pytest.mark.parametrize(
    ("opts", "words"),
    [
        ({"conflation": "soon"}, "interval"),
        ({"conflation": "0s"}, "interval"),
        ({"conflation": "2d"}, "at most 1d"),
        ({"conflation": ""}, "interval"),
        ({"conflation_key": "[/id]"}, "needs conflation="),
        ({"conflation": "1s", "conflation_key": "[]"}, "field paths"),
        ({"conflation": "1s", "conflation_key": "[id]"}, "field paths"),
    ],
)
def test_bad_conflation_options_are_refused_saying_why(opts: dict[str, str], words: str) -> None:
    with pytest.raises(CommandFailed) as caught:
        conflation_spec(opts)
    assert caught.value.reason == reasons.INVALID_OPTIONS
    assert words in caught.value.detail


def test_keys_by_field_values_or_by_sow_key() -> None:
    spec = conflation_spec({"conflation": "1s", "conflation_key": "[/sym,/tags]"})
    assert spec is not None
    a = spec.key_of("t", b'{"sym":"X","px":1,"tags":[1,2]}', "")
    b = spec.key_of("t", b'{"sym":"X","px":2,"tags":[1,2]}', "")
    other = spec.key_of("t", b'{"sym":"Y","px":2,"tags":[1,2]}', "")
    elsewhere = spec.key_of("u", b'{"sym":"X","px":2,"tags":[1,2]}', "")
    assert a == b and a != other and a != elsewhere
    # not JSON, or the field missing: NULL, one key for all of them
    assert spec.key_of("t", b"not json", "") == spec.key_of("t", b"{}", "")
    by_sow = ConflationSpec(1.0)
    assert by_sow.key_of("t", b"{}", "42") == by_sow.key_of("t", b'{"x":1}', "42")
    assert by_sow.key_of("t", b"{}", "42") != by_sow.key_of("t", b"{}", "43")
    # no SOW key: its own key (delayed, never dropped)
    assert by_sow.key_of("t", b"{}", "") != by_sow.key_of("t", b"{}", "")
