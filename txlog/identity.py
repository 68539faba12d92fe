"""Message identity: publisher hashes and bookmarks.

A bookmark is ``<publisher hash>|<publisher seq>|``. The hash is the first 8 bytes of
BLAKE2b over the UTF-8 client name, read big-endian: stable across instances,
processes, platforms and versions (never Python's ``hash()``).
"""

from __future__ import annotations

import hashlib
from functools import lru_cache


@lru_cache(maxsize=65536)
def publisher_hash(client_name: str) -> int:
    """The stable unsigned 64-bit hash of a client name."""
    return int.from_bytes(hashlib.blake2b(client_name.encode(), digest_size=8).digest(), "big")


def format_bookmark(pub_hash: int, seq: int) -> str:
    return f"{pub_hash}|{seq}|"


class BadBookmark(ValueError):
    """Text that is not a ``<hash>|<seq>|`` bookmark."""


def parse_bookmark(text: str) -> tuple[int, int]:
    """Parse ``<hash>|<seq>|`` (trailing ``|`` optional) into ``(pub_hash, seq)``.

    Raises:
        BadBookmark: with a message showing the expected form.
    """
    parts = text.strip().split("|")
    if parts and parts[-1] == "":
        parts.pop()
    if len(parts) != 2 or not parts[0].isdigit() or not parts[1].isdigit():
        raise BadBookmark(
            f"{text!r} is not a bookmark; expected '<publisher hash>|<sequence>|', "
            "e.g. '7094790850998930143|12|', or 0 (EPOCH), 0|1| (NOW) or a timestamp "
            "YYYYMMDDTHHMMSS"
        )
    return int(parts[0]), int(parts[1])
