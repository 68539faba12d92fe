"""The simulator's checker: docs/GUARANTEES.md as assertions over what a schedule
observed (docs/SIMULATION.md). Pure: observations in, violations (sentences) out."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

__all__ = ["Observations", "check"]


@dataclass
class Observations:
    """What the actors of one schedule saw.

    ``published``: publisher -> the highest seq it handed to publish.
    ``acked``: publisher -> the highest seq a persisted ack covered.
    ``replayed``: instance -> publisher -> the seqs a replay from EPOCH delivered, in
    order (taken after the faults healed).
    ``early_acks``: violations seen at the moment of an ack (an instance the message
    is routed to did not hold it yet).
    """

    published: dict[str, int] = field(default_factory=dict)
    acked: dict[str, int] = field(default_factory=dict)
    replayed: dict[str, dict[str, list[int]]] = field(default_factory=dict)
    early_acks: list[str] = field(default_factory=list)
    unsettled: list[str] = field(default_factory=list)


def check(seen: Observations) -> list[str]:
    """Every way ``seen`` breaks a guarantee, one sentence each (empty: none)."""
    problems = list(seen.early_acks) + list(seen.unsettled)
    for instance, by_publisher in sorted(seen.replayed.items()):
        for publisher in sorted(set(seen.acked) | set(by_publisher)):
            problems += _one_stream(
                instance,
                publisher,
                by_publisher.get(publisher, []),
                seen.acked.get(publisher, 0),
                seen.published.get(publisher, 0),
            )
    problems += _converged(seen.replayed)
    return problems


def _one_stream(
    instance: str, publisher: str, seqs: Sequence[int], acked: int, published: int
) -> list[str]:
    where = f"instance {instance}, publisher {publisher}"
    problems = []
    missing = sorted(set(range(1, acked + 1)) - set(seqs))
    if missing:
        problems.append(f"{where}: persisted-acked seqs lost: {missing[:10]}")
    if len(seqs) != len(set(seqs)):
        twice = sorted({s for s in seqs if seqs.count(s) > 1})
        problems.append(f"{where}: stored twice: {twice[:10]}")
    if list(seqs) != sorted(seqs):
        problems.append(f"{where}: replayed out of publisher order")
    if seqs and max(seqs) > published:
        problems.append(f"{where}: holds seq {max(seqs)}, never published ({published})")
    return problems


def _converged(replayed: Mapping[str, Mapping[str, Sequence[int]]]) -> list[str]:
    contents = {
        instance: {p: sorted(set(s)) for p, s in streams.items() if s}
        for instance, streams in replayed.items()
    }
    if len({repr(sorted(c.items())) for c in contents.values()}) <= 1:
        return []
    shown = "; ".join(
        f"{instance}: " + ", ".join(f"{p} {len(s)}" for p, s in sorted(c.items()))
        for instance, c in sorted(contents.items())
    )
    return [f"replicas did not converge after the faults healed: {shown}"]
