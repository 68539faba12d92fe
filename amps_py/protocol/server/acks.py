"""The acks a client connection is owed, pure: which to send, and their bytes.

A command names the ack types it wants in its header (``a``,
:func:`~amps_py.protocol.server.commands.ack_types`). This module builds the frames
that answer it:

* :func:`ack` and :func:`failure_frames`: one ack (echoing the command's ``cid``), and
  the failure acks of a refused command: one in every type it asked for, or
  ``processed`` when it asked for none (:func:`~.commands.failure_acks`);
* :class:`PublishAcks`: what a publisher is owed: the seq of each publish (its ``s``,
  or the next one here), the ``received``/``processed``/``completed`` acks of a
  publish, the conflated ``persisted`` acks as the publisher's seqs become durable
  (docs/GUARANTEES.md, "Persisted acks"), persisted failure acks for publishes that
  were not stored, and ``flush`` answers, held back until nothing is in flight.

Which seqs are durable is the caller's to say (the instance's ledger); nothing here
reads a clock or a socket.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from amps_py import reasons

from .. import messages
from .commands import MAX_SEQ, CommandFailed, failure_acks

__all__ = ["PublishAcks", "ack", "failure_frames"]


def ack(header: Mapping[str, Any], ack_type: str, status: str = "success", **fields: Any) -> bytes:
    """An ack of ``ack_type`` for the command whose header is ``header`` (its ``cid``
    echoed); ``fields`` become ack header fields."""
    return messages.ack(ack_type, status, header.get("cid"), **fields)


def failure_frames(header: Mapping[str, Any], exc: CommandFailed) -> list[bytes]:
    """The failure acks that answer a refused command at once: one in every ack type it
    asked for (so a client never waits for an ack that cannot come), or ``processed``
    when it asked for none."""
    return [ack(header, kind, "failure", **fields) for kind, fields in failure_acks(header, exc)]


class PublishAcks:
    """The ack bookkeeping of one publishing connection.

    Args:
        always_persisted: the transport's AlwaysSendPersistedAcks: persisted acks for
            every publish that carries ``s``, asked for or not.

    Attributes:
        wants_persisted: the connection asked for persisted acks (once asked, for the
            rest of its life).
    """

    __slots__ = ("_auto_seq", "_flush_waiters", "always_persisted", "wants_persisted")

    def __init__(self, always_persisted: bool = False) -> None:
        self.always_persisted = always_persisted
        self.wants_persisted = False
        self._auto_seq = 0
        self._flush_waiters: list[tuple[Any, frozenset[str]]] = []

    def seq(self, header: Mapping[str, Any], acks: frozenset[str], held_high: int | None) -> int:
        """The seq of a publish or sow_delete: its ``s``, or the next one above
        ``held_high`` (the highest seq held or queued here for the client name), or
        with no ledger (``None``) the next of this connection's own count. Notes a wish
        for persisted acks.

        Raises:
            CommandFailed: ``s`` is not a whole number in range.
        """
        seq = header.get("s")
        if seq is None:
            if held_high is not None:
                seq = held_high + 1
            else:  # no journal: the seq only numbers the acks
                self._auto_seq += 1
                seq = self._auto_seq
        elif type(seq) is not int or not 0 <= seq <= MAX_SEQ:
            raise CommandFailed(
                reasons.INVALID_SEQ, f"seq (s) must be an integer from 0 to {MAX_SEQ}, got {seq!r}"
            )
        if "persisted" in acks or (self.always_persisted and "s" in header):
            self.wants_persisted = True
        return int(seq)

    @staticmethod
    def accepted(header: Mapping[str, Any], acks: frozenset[str], seq: int) -> list[bytes]:
        """The acks of a publish the server took: ``received``, ``processed`` and
        ``completed``, those asked for, in that order, each with the publish's seq."""
        return [
            ack(header, kind, s=seq)
            for kind in ("received", "processed", "completed")
            if kind in acks
        ]

    def not_journaled(self, seq: int, pub_hash: int) -> list[bytes]:
        """A publish to a topic this instance does not journal, on a connection with
        no ledger: a publisher that asked for persisted acks is told so at once, not
        left waiting."""
        if not self.wants_persisted:
            return []
        return [messages.persisted_ack(seq, pub_hash, messages.NOT_JOURNALED)]

    def progress(
        self, safe: int | None, pending: int, pub_hash: int, not_journaled: int = 0
    ) -> list[bytes]:
        """The persisted ack for ``safe`` (the ledger's advance; None: nothing moved),
        when persisted acks were asked for, saying ``not journaled`` when ``safe`` is
        ``not_journaled``; and, once nothing is ``pending``, the held-back answers of
        flushes that asked for ``persisted``."""
        out: list[bytes] = []
        if safe is not None and self.wants_persisted:
            reason = messages.NOT_JOURNALED if safe == not_journaled else ""
            out.append(messages.persisted_ack(safe, pub_hash, reason))
        if not pending and self._flush_waiters:
            for cid, types in self._flush_waiters:
                out.append(ack({"cid": cid}, "persisted"))
                if "completed" in types:
                    out.append(ack({"cid": cid}, "completed"))
            self._flush_waiters.clear()
        return out

    def failed(self, seqs: list[int], reason: str, detail: str) -> list[bytes]:
        """These publishes were not stored: a persisted failure ack for each (when
        persisted acks were asked for), so the publisher never waits for them."""
        if not self.wants_persisted:
            return []
        return [messages.publish_failed(seq, reason, detail) for seq in seqs]

    def flush(self, header: Mapping[str, Any], acks: frozenset[str], pending: int) -> list[bytes]:
        """Answer a ``flush`` (``acks``: its ack types, ``processed`` when none):
        ``received`` and ``processed`` at once; ``persisted`` (and ``completed`` after
        it) once none of this publisher's ``pending`` seqs is left, else held back
        until :meth:`progress` sees none pending."""
        out = [ack(header, kind) for kind in ("received", "processed") if kind in acks]
        if "persisted" in acks:
            if pending:
                self._flush_waiters.append((header.get("cid", ""), acks))
                return out
            out.append(ack(header, "persisted"))
        if "completed" in acks:
            out.append(ack(header, "completed"))
        return out

    def forget(self) -> None:
        """The connection ended: drop the held-back flush answers."""
        self._flush_waiters.clear()
