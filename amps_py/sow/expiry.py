"""SOW record expiration: a record's lifetime and when it ends.

A SOW topic's records expire when its ``Expiration`` is an interval (every record
lives that long, unless its publish gave its own lifetime) or ``enabled`` (only
records published with an ``e`` header expire). ``e`` is the lifetime in whole
seconds, as AMPS documents the publish header ("an interval in seconds, used to define
the lifetime of a publish message"); the protocol codec refuses an ``e`` that is not
an integer, and :func:`parse_lifetime` one that is not above 0.

A lifetime counts from the record's **origin time**: when the instance that accepted
the publish journaled it (``Record.origin_ts``, carried unchanged by replication), so
every instance of a fabric, and a store rebuilt from the journal, computes the same
expiry time for a record that expires by its topic's interval.

Pure: no I/O, no trio; time is passed in.
"""

from __future__ import annotations

import math
import time
from typing import Any, Final

from .entry import SowEntry

#: the largest ``e`` accepted: 100 years (beyond it a lifetime means "never", say so)
MAX_LIFETIME_S: Final = 100 * 365 * 86400.0


class BadExpiration(ValueError):
    """An ``e`` header that is not a lifetime; the message says what is accepted."""


def wall_clock_us() -> int:
    """Now, in microseconds since the UNIX epoch (the journal's timestamps' clock)."""
    return time.time_ns() // 1000


def parse_lifetime(raw: Any) -> float | None:
    """The lifetime in seconds an ``e`` (expiration) header asks for; ``None`` when the
    header is absent or empty.

    Raises:
        BadExpiration: not a number of seconds above 0 (and at most 100 years).
    """
    if raw is None or raw == "":
        return None
    if isinstance(raw, bool):
        raise BadExpiration(f"expiration (e) must be a number of seconds above 0, got {raw!r}")
    try:
        seconds = float(raw)
    except (TypeError, ValueError):
        seconds = math.nan
    if not (0 < seconds <= MAX_LIFETIME_S):
        raise BadExpiration(
            f"expiration (e) must be a number of seconds above 0 and at most "
            f"{MAX_LIFETIME_S:.0f}, got {raw!r}; leave it out for the topic's default"
        )
    return seconds


def expires_at(origin_us: int, lifetime_s: float | None) -> int:
    """The expiry time (µs since the epoch) of a record journaled at ``origin_us`` that
    lives ``lifetime_s`` seconds; 0 (never) without a lifetime."""
    if lifetime_s is None:
        return 0
    return max(origin_us + round(lifetime_s * 1_000_000), 1)


def is_expired(entry: SowEntry, now_us: int) -> bool:
    """Whether ``entry`` has expired at ``now_us`` (its expiry time is not later)."""
    return 0 < entry.expires_us <= now_us
