"""The decisions of an HA sow_and_subscribe resumption (amps_py.client.sow_view), on
made-up streams: no server.

What a user relies on: after a reconnect the application is handed every message it
had not been given, in order, and nothing it had (or something that overtook it); a
message older than the version of its record the application holds is never handed
over, whichever publishers wrote them; an ``oof`` that comes during the replay is
handed over after it; the reconciliation query hands over what differs and reports
what is gone.
"""

from __future__ import annotations

from amps_py.client.sow_view import Key, Resumption, SowView, Version, reconcile, version_of

P, Q = 111, 222
T = "orders"


def k(name: str) -> Key:
    return (T, name)


def view_of(records: dict[str, Version]) -> SowView:
    view = SowView()
    for name, version in records.items():
        view.given(k(name), version)
    return view


def feed(resume: Resumption[str], stream: list[tuple[str, str, Version | None]]) -> list[str]:
    """Run ``stream`` (label, record, version; record "" for none; label "oof:..." for
    an oof, "SEAM" for the completed ack) through ``resume``; the labels handed over."""
    handed: list[str] = []
    for label, name, version in stream:
        if label == "SEAM":
            handed += resume.seam()
        elif label.startswith("oof"):
            handed += resume.oof(label, k(name))
        else:
            handed += resume.message(label, k(name) if name else None, version)
    return handed


def test_bookmarks_parse_and_the_resume_list_names_every_publisher() -> None:
    assert version_of("111|5|") == (111, 5)
    assert version_of("") is None and version_of("20261128T000000") is None
    assert version_of("1|2|,3|4|") is None
    view = view_of({"a": (Q, 20), "b": (P, 3), "c": (P, 2)})
    assert view.resume_bookmark() == f"{P}|3|,{Q}|20|"
    assert SowView().resume_bookmark() == "" and not SowView()


def test_one_publisher_what_was_given_is_dropped_and_the_rest_handed_over_in_order() -> None:
    view = view_of({"a": (P, 4), "b": (P, 2)})
    resume = Resumption[str](view)
    handed = feed(
        resume,
        [
            ("p3", "c", (P, 3)),  # below the highest given: overtaken by (P, 4)
            ("p4", "a", (P, 4)),  # given
            ("p5", "b", (P, 5)),
            ("SEAM", "", None),
            ("p5-again", "b", (P, 5)),  # a live duplicate
            ("p6", "a", (P, 6)),
        ],
    )
    assert handed == ["p5", "p6"]
    assert resume.duplicates == 3
    assert view.held == {k("a"): (P, 6), k("b"): (P, 5)}


def test_a_superseded_message_of_another_publisher_is_never_handed_over() -> None:
    """The snapshot held a = Q20, which overwrote P10 before it was taken; the replay
    starts before P10 (P's highest given is 3). P10 waits until Q20 comes by, and is
    dropped then; P11 after it is newer and handed over."""
    view = view_of({"a": (Q, 20), "b": (P, 3)})
    resume = Resumption[str](view)
    handed = feed(
        resume,
        [
            ("p3", "b", (P, 3)),
            ("p10", "a", (P, 10)),
            ("q20", "a", (Q, 20)),
            ("p11", "a", (P, 11)),
            ("SEAM", "", None),
        ],
    )
    assert handed == ["p11"]
    assert (resume.superseded, resume.duplicates) == (1, 2)
    assert view.held[k("a")] == (P, 11)


def test_a_version_before_the_replay_start_lets_what_waited_through_in_order() -> None:
    """a = Q5 lies before the replay's start: P31 (for a) waits, and goes when a later
    message of Q shows Q5 is behind, before that message; P32 waits behind P31 to keep
    a's order; at the seam whatever still waits is handed over."""
    view = view_of({"a": (Q, 5), "b": (Q, 9), "c": (P, 30), "d": (Q, 7)})
    resume = Resumption[str](view)
    handed = feed(
        resume,
        [
            ("p31", "a", (P, 31)),
            ("p32", "a", (P, 32)),
            ("p33", "d", (P, 33)),  # d = Q7 waits as well
            ("q12", "e", (Q, 12)),  # Q5 and Q7 are behind: a's and d's go first
            ("p34", "a", (P, 34)),
            ("SEAM", "", None),
        ],
    )
    assert handed == ["p31", "p32", "p33", "q12", "p34"]
    resume2 = Resumption[str](view_of({"a": (Q, 5), "b": (Q, 9), "c": (P, 30)}))
    assert feed(resume2, [("p31", "a", (P, 31)), ("x", "z", (P, 32)), ("SEAM", "", None)]) == [
        "x",
        "p31",
    ]


def test_an_oof_during_the_replay_comes_after_it() -> None:
    view = view_of({"a": (P, 2)})
    resume = Resumption[str](view)
    handed = feed(
        resume,
        [
            ("oof-a", "a", None),  # a delete that happened after the resubscribe
            ("p3", "a", (P, 3)),  # replayed: before that delete
            ("SEAM", "", None),
            ("p4", "b", (P, 4)),
            ("oof-b", "b", None),  # live: at once
        ],
    )
    assert handed == ["p3", "oof-a", "p4", "oof-b"]
    assert view.held == {}


def test_reconcile_hands_over_what_differs_and_reports_what_is_gone() -> None:
    view = view_of({"a": (P, 5), "b": (P, 6), "c": (Q, 1), "d": (Q, 2), "e": (P, 3)})
    records = [
        (k("a"), (P, 5), "A5"),  # the same version: nothing
        (k("b"), (Q, 9), "B-Q9"),  # another version: an update, not seen before
        (k("c"), (P, 4), "C-P4"),  # another version whose seq was given: flagged
        (k("f"), (Q, 10), "F"),  # new to the view
        (k("e"), (P, 8), "E8"),  # touched by the live stream: left alone
    ]
    found = reconcile(view, records, {k("e")}, complete=True)
    assert found.updates == [("B-Q9", False), ("C-P4", True), ("F", False)]
    assert found.gone == [k("d")]
    assert view.held == {
        k("a"): (P, 5),
        k("b"): (Q, 9),
        k("c"): (P, 4),
        k("e"): (P, 3),
        k("f"): (Q, 10),
    }
    partial = view_of({"a": (P, 5)})
    assert reconcile(partial, [(k("x"), (P, 1), "X")], set(), complete=False).updates == []
