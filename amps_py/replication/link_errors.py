"""The errors of a replication link (see :mod:`.link`), in a module of their own so
that the link and the handshake codec (:mod:`.hello`) share them without importing
each other. Every name here is also importable from :mod:`.link`."""

from __future__ import annotations


class LinkError(Exception):
    """The link cannot continue; ``reason`` is short and stable, the text says why.

    The link itself raises one of the two subclasses, as h11 does:
    :class:`RemoteProtocolError` when the peer sent something wrong (or fell silent),
    :class:`LocalProtocolError` when this end's own code used the link wrongly. The
    drivers also raise plain ``LinkError`` for failures around the link (the peer
    closed, a group mismatch, ...). ``except LinkError`` catches all of them.
    """

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail


class RemoteProtocolError(LinkError):
    """The peer broke the protocol: malformed or oversized frames, a frame not allowed
    in the link's state, bad data, or silence past the limit. Close the connection
    (and tell the peer with the link's ``refuse`` where the reason is worth telling)."""


class LocalProtocolError(LinkError, RuntimeError):
    """This end's own code used the link wrongly: sent data before the handshake
    completed, a welcome before a hello arrived, or a hello larger than a peer
    accepts. A bug or a configuration to fix here, not the peer's fault. Also a
    :class:`RuntimeError`, as such misuse was before the split."""
