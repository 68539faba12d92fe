"""Transport compression of a client connection (sans-IO: bytes in, bytes out).

An AMPS client that connects with ``?compression=zlib`` in its URI compresses its whole
byte stream, from the first byte on, with zlib, and expects the server's stream
compressed the same way. A zlib stream starts with a two-byte header whose first byte
is ``0x78`` (deflate, 32 KiB window) and whose 16-bit value is a multiple of 31. As a
frame length prefix that first byte alone would mean a frame of at least 2 GB, which no
transport accepts, so the server can tell the two apart from the first two bytes
without any negotiation (see :func:`sniff`).

Each direction is one zlib stream; every write is sync-flushed so the peer can decode
it at once. Inflation is bounded: :meth:`Inflater.feed` yields the output in pieces of
at most ``piece`` bytes, so a small compressed input that expands hugely is decoded
(and refused by the frame decoder's size limit) a piece at a time, never whole.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterator
from typing import Final

#: the most bytes one inflation step produces
INFLATE_PIECE: Final = 1024 * 1024


class CompressionError(ValueError):
    """The peer's compressed stream is damaged."""


def sniff(first: bytes | bytearray) -> bool | None:
    """Whether a connection whose first bytes are ``first`` is zlib-compressed: True,
    False, or None when fewer than two bytes are known."""
    if not first:
        return None
    if first[0] != 0x78:
        return False
    if len(first) < 2:
        return None
    return ((first[0] << 8) | first[1]) % 31 == 0


class Inflater:
    """Decompresses the peer's zlib stream in bounded pieces."""

    def __init__(self, piece: int = INFLATE_PIECE) -> None:
        self._z = zlib.decompressobj()
        self._piece = piece

    def feed(self, data: bytes | bytearray) -> Iterator[bytes]:
        """The plain bytes in ``data``, in pieces of at most ``piece`` bytes.

        Raises:
            CompressionError: the stream is not valid zlib.
        """
        z = self._z
        pending: bytes | bytearray = data
        while pending:
            try:
                out = z.decompress(pending, self._piece)
            except zlib.error as exc:
                raise CompressionError(f"the zlib stream is damaged ({exc})") from None
            pending = z.unconsumed_tail
            if out:
                yield out
            if z.eof:
                raise CompressionError(
                    "the zlib stream ended; a compressed connection stays one stream"
                )


class Deflater:
    """Compresses this side's stream; each :meth:`compress` output is sync-flushed."""

    def __init__(self, level: int = 1) -> None:
        self._z = zlib.compressobj(level)

    def compress(self, data: bytes) -> bytes:
        z = self._z
        return z.compress(data) + z.flush(zlib.Z_SYNC_FLUSH)
