"""The simulator's checker (amps_py/sim/checker.py): each guarantee of
docs/GUARANTEES.md it asserts, broken one at a time."""

from __future__ import annotations

from amps_py.sim.checker import Observations, check


def seen(a: list[int], b: list[int], *, acked: int = 3, published: int = 4) -> Observations:
    return Observations(
        published={"p1": published},
        acked={"p1": acked},
        replayed={"a": {"p1": a}, "b": {"p1": b}},
    )


def test_a_sound_run_has_no_violation() -> None:
    assert check(seen([1, 2, 3, 4], [1, 2, 3, 4])) == []
    assert check(seen([1, 2, 3], [1, 2, 3])) == []  # the unacked 4th may be lost


def test_a_lost_acked_message_is_named_with_its_instance() -> None:
    (problem, converged) = check(seen([1, 3], [1, 2, 3]))
    assert problem == "instance a, publisher p1: persisted-acked seqs lost: [2]"
    assert converged.startswith("replicas did not converge")


def test_a_duplicate_an_order_break_and_a_phantom_are_each_named() -> None:
    assert "stored twice: [2]" in check(seen([1, 2, 2, 3], [1, 2, 3]))[0]
    assert "out of publisher order" in " ".join(check(seen([1, 3, 2], [1, 2, 3])))
    assert "holds seq 5, never published (4)" in " ".join(check(seen([1, 2, 3, 5], [1, 2, 3, 5])))


def test_an_early_ack_and_an_unsettled_publisher_are_reported() -> None:
    observed = seen([1, 2, 3], [1, 2, 3])
    observed.early_acks.append("publisher p1 had a persisted ack through seq 2 while ...")
    observed.unsettled.append("publisher p1: persisted through seq 1 of 3 ...")
    assert check(observed)[:2] == [observed.early_acks[0], observed.unsettled[0]]
