"""The replication checker's classification core (tests/checker.py), on hand-built inputs
and on replays perturbed by hypothesis (derandomized, so every run sees the same cases)."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
from checker import (
    Counts,
    Pub,
    Report,
    Stored,
    classify,
    dump_published,
    load_published,
    parse_stored,
    payload,
)
from hypothesis import given, settings
from hypothesis import strategies as st


def pubs(n: int, *, unacked: tuple[int, ...] = (), prefix: str = "") -> list[Pub]:
    return [Pub(s, f"{prefix}{s}" if prefix else None, s not in unacked) for s in range(1, n + 1)]


def replay(publisher: str, *seqs: int) -> list[Stored]:
    return [Stored(publisher, s, f"bm{publisher}{s}") for s in seqs]


def counts(report: Report, instance: str) -> dict[str, int]:
    return report.instances[instance].as_dict()


def only(**nonzero: int) -> dict[str, int]:
    return {**Counts().as_dict(), **nonzero}


def test_a_complete_replay_is_all_ok() -> None:
    report = classify(
        {"a": pubs(3), "b": pubs(2)},
        {"X": [*replay("a", 1), *replay("b", 1), *replay("a", 2, 3), *replay("b", 2)]},
    )
    assert counts(report, "X") == only(ok=5)
    assert report.errors == 0
    assert [f.kind for f in report.findings] == []


def test_acked_and_absent_is_lost_unacked_and_absent_is_not_an_error() -> None:
    report = classify({"a": pubs(4, unacked=(4,))}, {"X": replay("a", 1, 3)})
    assert counts(report, "X") == only(ok=2, lost=1, unacked_missing=1)
    assert report.errors == 1
    kinds = {(f.kind, f.seq) for f in report.findings}
    assert kinds == {("lost", 2), ("unacked_missing", 4)}


def test_unacked_but_present_is_ok() -> None:
    report = classify({"a": pubs(2, unacked=(1, 2))}, {"X": replay("a", 1, 2)})
    assert counts(report, "X") == only(ok=2)


def test_present_more_than_once_is_duplicate() -> None:
    report = classify({"a": pubs(3)}, {"X": replay("a", 1, 2, 2, 3, 2)})
    assert counts(report, "X") == only(ok=2, duplicate=1)
    (finding,) = report.findings
    assert finding.kind == "duplicate" and finding.seq == 2
    assert "replayed 3 times" in finding.detail and "bma2" in finding.detail


def test_reordered_counts_the_fewest_messages_out_of_place() -> None:
    published = {"a": pubs(5), "b": pubs(2)}
    cases = {
        "swap": (replay("a", 1, 3, 2, 4, 5), 1),
        "one-late": (replay("a", 2, 3, 4, 5, 1), 1),
        "one-early": (replay("a", 5, 1, 2, 3, 4), 1),
        "reversed": (replay("a", 5, 4, 3, 2, 1), 4),
    }
    for name, (messages, expected) in cases.items():
        report = classify(published, {name: messages + replay("b", 1, 2)})
        assert counts(report, name) == only(ok=7, reordered=expected), name


def test_interleaving_publishers_is_not_reordering() -> None:
    report = classify(
        {"a": pubs(3), "b": pubs(3)},
        {"X": [*replay("b", 1, 2), *replay("a", 1), *replay("b", 3), *replay("a", 2, 3)]},
    )
    assert counts(report, "X") == only(ok=6)


def test_order_is_judged_on_first_copies() -> None:
    # the late copy of 1 is a duplicate, not a reorder
    report = classify({"a": pubs(3)}, {"X": replay("a", 1, 2, 3, 1)})
    assert counts(report, "X") == only(ok=2, duplicate=1)


def test_messages_nobody_published_are_phantoms() -> None:
    report = classify(
        {"a": pubs(2, prefix="a-")},
        {
            "X": [
                *replay("a", 1, 2),
                Stored("ghost", 1, "bm1"),  # unknown publisher
                Stored("a", 9, "bm2"),  # unknown seq
                Stored("a", 9, "bm3"),  # each copy counts
                Stored("a", 2, "bm4", payload_id="other"),  # known key, wrong payload
                parse_stored(b"not json", "bm5"),  # payload outside the convention
            ]
        },
    )
    assert counts(report, "X") == only(ok=2, phantom=5)
    assert report.errors == 5
    details = [f.detail for f in report.findings]
    assert any("payload id 'other', published 'a-2'" in d for d in details)
    assert any("without the p/s fields" in d for d in details)


def test_instances_are_classified_separately_and_totalled() -> None:
    report = classify(
        {"a": pubs(3)},
        {"A": replay("a", 1, 2, 3), "B": replay("a", 1, 3, 3), "C": replay("a", 2, 1, 3)},
    )
    assert counts(report, "A") == only(ok=3)
    assert counts(report, "B") == only(ok=1, lost=1, duplicate=1)
    assert counts(report, "C") == only(ok=3, reordered=1)
    assert report.total.as_dict() == only(ok=7, lost=1, duplicate=1, reordered=1)
    assert report.errors == 3
    assert {f.instance for f in report.findings} == {"B", "C"}


def test_table_is_fixed_width_with_a_total_row() -> None:
    report = classify({"a": pubs(12)}, {"A": replay("a", *range(1, 13)), "long-name": []})
    lines = report.table().splitlines()
    assert lines[0].split() == [
        "instance",
        "ok",
        "lost",
        "duplicate",
        "reordered",
        "phantom",
        "unacked_missing",
    ]
    assert [line.split() for line in lines[1:]] == [
        ["A", "12", "0", "0", "0", "0", "0"],
        ["long-name", "0", "12", "0", "0", "0", "0"],
        ["total", "12", "12", "0", "0", "0", "0"],
    ]
    assert len({len(line) for line in lines}) == 1, "rows differ in width"
    assert "long-name: lost a#1: acknowledged but not replayed" in report.describe(limit=3)
    assert "... and 9 more" in report.describe(limit=3)


def test_a_publisher_listing_a_seq_twice_is_refused() -> None:
    with pytest.raises(ValueError, match="lists seq 1 twice"):
        classify({"a": [Pub(1), Pub(1)]}, {})


def test_payload_convention_round_trips() -> None:
    data = payload("pub0", 7, "pub0-7", price=1.5)
    assert parse_stored(data, "bm", "orders") == Stored("pub0", 7, "bm", "pub0-7", "orders")
    assert parse_stored(payload("pub0", 8)) == Stored("pub0", 8)
    for bad in (b"[1]", b'{"p": 1, "s": 2}', b'{"p": "x", "s": "2"}', b'{"p": "x", "s": true}'):
        assert parse_stored(bad) == Stored("", -1), bad


def test_published_file_round_trips_and_errors_name_the_line(tmp_path: Path) -> None:
    published = {"a": [Pub(1, "a-1", True), Pub(2, None, False)], "b": [Pub(1, "b-1", True)]}
    path = tmp_path / "published.jsonl"
    dump_published(path, published)
    assert load_published(path) == published
    path.write_text('{"p": "a", "s": 1, "acked": true}\n\n{"p": "a", "s": 2}\n')
    with pytest.raises(ValueError, match=r"published.jsonl:3: not a published record"):
        load_published(path)


# ---------------------------------------------------------------------- properties


def ordered_subsequence_lengths(values: list[int]) -> int:
    """Longest increasing subsequence by the quadratic textbook method (an oracle
    independent of the checker's patience sorting)."""
    best = [1] * len(values)
    for i in range(len(values)):
        for j in range(i):
            if values[j] < values[i]:
                best[i] = max(best[i], best[j] + 1)
    return max(best, default=0)


@st.composite
def perturbed_replays(
    draw: st.DrawFn,
) -> tuple[dict[str, list[Pub]], list[Stored], dict[str, int], random.Random]:
    """A publish history, a replay of it with drops, duplicates and phantoms applied
    (publisher order kept), and the counts that perturbation must produce."""
    published: dict[str, list[Pub]] = {}
    for i in range(draw(st.integers(1, 3))):
        acks = draw(st.lists(st.booleans(), max_size=25))
        published[f"p{i}"] = [Pub(s, f"p{i}-{s}", a) for s, a in enumerate(acks, 1)]
    keys = [(p, pub.seq) for p, ps in published.items() for pub in ps]
    acked = {(p, pub.seq) for p, ps in published.items() for pub in ps if pub.acked}
    dropped = draw(st.sets(st.sampled_from(keys))) if keys else set()
    kept = [k for k in keys if k not in dropped]
    duplicated = draw(st.sets(st.sampled_from(kept))) if kept else set()
    rng = draw(st.randoms(use_true_random=False))

    # interleave publishers at random, keeping each publisher's order
    queues = {p: [k for k in kept if k[0] == p] for p in published}
    stream: list[Stored] = []
    while any(queues.values()):
        p = rng.choice([p for p, q in queues.items() if q])
        publisher, seq = queues[p].pop(0)
        stream.append(Stored(publisher, seq, f"bm{len(stream)}", f"{publisher}-{seq}"))
    # extra copies somewhere after the first one
    for key in sorted(duplicated):
        first = next(i for i, m in enumerate(stream) if (m.publisher, m.seq) == key)
        for _ in range(rng.randint(1, 2)):
            stream.insert(
                rng.randint(first + 1, len(stream)), Stored(*key, "dup", f"{key[0]}-{key[1]}")
            )
    phantoms = draw(st.integers(0, 3))
    for n in range(phantoms):
        ghost = rng.choice(
            [Stored("ghost", n), Stored("p0", 1000 + n), Stored("p0", 1, payload_id="forged")]
        )
        stream.insert(rng.randint(0, len(stream)), ghost)
    expected = {
        "ok": len(keys) - len(dropped) - len(duplicated),
        "lost": len(dropped & acked),
        "duplicate": len(duplicated),
        "reordered": 0,
        "phantom": phantoms,
        "unacked_missing": len(dropped - acked),
    }
    return published, stream, expected, rng


PROPERTY_SETTINGS = settings(derandomize=True, max_examples=200, database=None, deadline=None)


@PROPERTY_SETTINGS
@given(perturbed_replays())
def test_drops_duplicates_and_phantoms_are_classified_as_applied(
    case: tuple[dict[str, list[Pub]], list[Stored], dict[str, int], random.Random],
) -> None:
    published, stream, expected, _ = case
    report = classify(published, {"X": stream})
    assert counts(report, "X") == expected
    assert report.errors == sum(expected[k] for k in ("lost", "duplicate", "phantom"))


@PROPERTY_SETTINGS
@given(perturbed_replays())
def test_shuffling_changes_only_the_reordered_count(
    case: tuple[dict[str, list[Pub]], list[Stored], dict[str, int], random.Random],
) -> None:
    published, stream, expected, rng = case
    shuffled = rng.sample(stream, len(stream))
    report = classify(published, {"in-order": stream, "shuffled": shuffled})
    got = counts(report, "shuffled")
    assert {k: v for k, v in got.items() if k != "reordered"} == {
        k: v for k, v in expected.items() if k != "reordered"
    }
    # oracle: per publisher, messages minus the longest run already in order
    index = {(p, pub.seq) for p, ps in published.items() for pub in ps}
    want = 0
    for p in published:
        firsts: list[int] = []
        for m in shuffled:
            genuine = (p, m.seq) in index and m.payload_id != "forged"
            if m.publisher == p and genuine and m.seq not in firsts:
                firsts.append(m.seq)
        want += len(firsts) - ordered_subsequence_lengths(firsts)
    assert got["reordered"] == want
    assert report.total.reordered == want


def test_a_printed_seeded_shuffle_of_a_long_replay() -> None:
    seed = 424242
    print(f"seed {seed}")
    rng = random.Random(seed)
    published = {f"p{i}": pubs(200) for i in range(3)}
    stream = [Stored(p, s) for s in range(1, 201) for p in published]
    report = classify(published, {"X": stream})
    assert counts(report, "X") == only(ok=600)
    rng.shuffle(stream)
    report = classify(published, {"X": stream})
    assert report.instances["X"].ok == 600
    assert 0 < report.instances["X"].reordered < 600
