"""Replication routing rules (pure): topic, passthrough, loop prevention, filters."""

from __future__ import annotations

from amps_py.config import DestinationConfig, ReplicationTopic
from amps_py.replication import Route


def dest(topics=((".*", None),), passthrough=(), name="b") -> DestinationConfig:  # type: ignore[no-untyped-def]
    return DestinationConfig(
        name=name,
        group="G",
        sync_type="sync",
        topics=tuple(ReplicationTopic(n, "json", f) for n, f in topics),
        passthrough=tuple(passthrough),
    )


def accepts(
    route: Route, *, topic="orders", path=(), origin="a", payload=b"{}", remote="b", mt="json"
) -> bool:  # type: ignore[no-untyped-def]
    return route.accepts(
        topic=topic, message_type=mt, origin=origin, path=path, payload=payload, remote_name=remote
    )


def test_published_here_goes_when_the_topic_matches() -> None:
    route = Route(dest(topics=(("orders", None), ("trades.*", None))))
    assert accepts(route, topic="orders")
    assert accepts(route, topic="trades-us")
    assert not accepts(route, topic="orders2")  # literal names match exactly
    assert not accepts(route, topic="quotes")
    assert not accepts(route, mt="binary")


def test_replicated_messages_need_a_matching_passthrough() -> None:
    path = (("x", "NYC"),)
    assert not accepts(Route(dest()), path=path, origin="x")
    assert accepts(Route(dest(passthrough=("NY",))), path=path, origin="x")
    assert not accepts(Route(dest(passthrough=("^LDN$",))), path=path, origin="x")
    # the group that counts is the one the message was received from (the last hop)
    path2 = (("x", "LDN"), ("y", "NYC"))
    assert accepts(Route(dest(passthrough=("NYC",))), path=path2, origin="x")
    assert not accepts(Route(dest(passthrough=("LDN",))), path=path2, origin="x")


def test_never_back_through_an_instance_on_the_path() -> None:
    route = Route(dest(passthrough=(".*",)))
    assert not accepts(route, origin="b")  # the destination published it
    assert not accepts(route, path=(("b", "G"), ("c", "H")), origin="b")
    assert not accepts(route, path=(("a", "G"), ("b", "G")), origin="a")
    assert accepts(route, path=(("a", "G"), ("c", "H")), origin="a")


def test_filters_apply_per_topic_entry() -> None:
    route = Route(dest(topics=(("orders", "/qty > 10"), ("audit", None))))
    assert accepts(route, payload=b'{"qty": 11}')
    assert not accepts(route, payload=b'{"qty": 5}')
    assert not accepts(route, payload=b"not json")
    assert accepts(route, topic="audit", payload=b"not json")


def test_any_topic_when_the_name_is_omitted() -> None:
    route = Route(dest(topics=((None, None),)))
    assert accepts(route, topic="anything/at/all")


def test_cached_verdicts_agree_with_accepts_and_defer_to_filters() -> None:
    """The send loop's cached verdict must never disagree with the full rule; where a
    content filter decides, it says so (None) instead of guessing."""
    route = Route(dest(topics=(("orders", "/qty > 10"), ("audit", None)), passthrough=("NY",)))
    cases = [
        ("audit", "a", ()),
        ("audit", "b", ()),
        ("audit", "x", (("x", "NYC"),)),
        ("audit", "x", (("x", "LDN"),)),
        ("audit", "x", (("b", "NYC"),)),
        ("quotes", "a", ()),
    ]
    for _ in range(2):  # the second round answers from the cache
        for topic, origin, path in cases:
            expected = accepts(route, topic=topic, origin=origin, path=path)
            assert route.verdict(topic, "json", origin, path, "b") is expected, (topic, path)
    assert route.verdict("orders", "json", "a", (), "b") is None
    assert route.verdict("orders", "json", "b", (), "b") is False  # loop rule first
    assert route.verdict("orders", "binary", "a", (), "b") is False
