"""Replication routing rules (pure): topic, passthrough, loop prevention, filters."""

from __future__ import annotations

import pytest

from amps_py.config import DestinationConfig, ReplicationTopic
from amps_py.replication import Route
from txlog import Record, RecordCodec
from txlog.record import RouteView


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


# ---------------------------------------------------------------- Route.select
#: (topic, origin, path, payload) of a batch exercising every rule: a plain topic, a
#: content filter both ways, a topic not replicated, the destination as origin, a
#: passthrough group and one that is not, and a payload a filter cannot parse
BATCH = [
    ("audit", "a", (), b"{}"),
    ("orders", "a", (), b'{"qty": 11, "pad": "' + b"x" * 200 + b'"}'),
    ("orders", "a", (), b'{"qty": 5}'),
    ("quotes", "a", (), b'{"qty": 99}'),
    ("audit", "b", (), b"{}"),
    ("orders", "x", (("x", "NYC"),), b'{"qty": 50}'),
    ("orders", "x", (("x", "LDN"),), b'{"qty": 50}'),
    ("orders", "a", (), b"not json"),
]
#: which of BATCH go to instance "b"
EXPECTED = [0, 1, 5]


def filtered_route() -> Route:
    return Route(dest(topics=(("orders", "/qty > 10"), ("audit", None)), passthrough=("NY",)))


def journaled(compress: bool) -> tuple[list[Record], list[bytes], RecordCodec]:
    """BATCH as the writer holds it (records and their stored values)."""
    codec = RecordCodec(compress=compress)
    records = [
        Record(topic=topic, payload=payload, pub_hash=1, seq=i, origin=origin, path=path, txid=i)
        for i, (topic, origin, path, payload) in enumerate(BATCH, start=1)
    ]
    return records, [codec.encode(r) for r in records], codec


def test_select_just_committed_records_sends_their_stored_values_in_order() -> None:
    """The send loop's fresh path: in-memory records, their stored bytes go out."""
    records, values, _ = journaled(compress=False)
    selected = filtered_route().select(records, values, "b", lambda r: r.payload)
    assert selected == [values[i] for i in EXPECTED]
    for i, (topic, origin, path, payload) in enumerate(BATCH):
        expected = accepts(filtered_route(), topic=topic, origin=origin, path=path, payload=payload)
        assert expected is (i in EXPECTED), BATCH[i]  # select agrees with accepts


@pytest.mark.parametrize("compress", [False, True])
def test_select_journal_views_reads_a_payload_only_for_a_content_filter(compress: bool) -> None:
    """The send loop's catch-up path: routing views decoded from the stored values
    (compressed or not); the payload is decoded only where a filter decides."""
    _, values, codec = journaled(compress)
    views = [codec.route_view(v, txid) for txid, v in enumerate(values, start=1)]
    read: list[int] = []

    def payload(view: RouteView) -> bytes:
        read.append(view.txid)
        return codec.route_payload(view)

    route = filtered_route()
    selected = route.select(views, [v.raw for v in views], "b", payload)
    assert selected == [values[i] for i in EXPECTED]
    # only "orders" from here or through NYC reach the filter; the rest is decided
    # from topic, origin and path
    assert read == [2, 3, 6, 8]
    read.clear()
    assert route.select(views, [v.raw for v in views], "b", payload) == selected
    assert read == [2, 3, 6, 8]  # verdicts are cached, filter results are not


def test_select_routes_for_the_remote_instance_it_is_given() -> None:
    records, values, _ = journaled(compress=False)
    # towards "x": what came from x never goes back to it; what "b" sent may go
    selected = filtered_route().select(records, values, "x", lambda r: r.payload)
    assert selected == [values[i] for i in (0, 1, 4)]


def test_select_needs_one_value_per_message() -> None:
    records, values, _ = journaled(compress=False)
    with pytest.raises(ValueError):
        filtered_route().select(records, values[:-1], "b", lambda r: r.payload)
