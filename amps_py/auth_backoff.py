"""Back-off after failed logons, and the rate limit of their log lines (pure).

Two decisions, both sans-IO (no trio, no sockets; every call takes ``now``, seconds on
any monotonic clock) so they are tested with a fake clock; ``amps_py.auth_gate`` is the
trio glue that asks them around each password check.

:class:`FailureTracker` — per user name and per peer address (an IP, never a port):

* a failure is remembered; :data:`THRESHOLD` failures of one key within
  :data:`WINDOW` seconds start a back-off of :data:`FIRST_BACKOFF` seconds;
* once a key has been backed off, each further failure (an attempt let through after
  the back-off ended, and refused again) starts a back-off twice as long as the one
  before, up to :data:`MAX_BACKOFF`;
* checks in flight count as failures to come: no more run at once for one user or
  address than would start its back-off (the rest wait for them, see
  :meth:`FailureTracker.may_start`), so many connections opened at once cost no more
  checks than the same attempts one after another;
* while the user's or the address's back-off runs, every attempt is refused *without
  checking the password* (a flood costs no CPU), the right password included: a
  guesser must not learn which guess was right by being let on;
* a success resets the user's and the address's records; a record with no failure
  for :data:`FORGET_AFTER` seconds is forgotten;
* memory is bounded: at most ``max_entries`` records per kind; when full, forgotten
  records go first, then the least recently failed.

:class:`FailureLog` — which failures get a log line of their own: the first
:data:`LINES_PER_WINDOW` per address in each :data:`LOG_WINDOW` seconds; the rest are
counted and reported once per address and window by :meth:`FailureLog.due` ("N more
failed logons from ADDR in the last 10 s").
"""

from __future__ import annotations

import math
from collections import OrderedDict
from dataclasses import dataclass
from typing import Final

__all__ = [
    "FIRST_BACKOFF",
    "FORGET_AFTER",
    "LINES_PER_WINDOW",
    "LOG_WINDOW",
    "MAX_BACKOFF",
    "MAX_ENTRIES",
    "MAX_USER_CHARS",
    "MAX_WRONG",
    "THRESHOLD",
    "WINDOW",
    "BackedOff",
    "BackoffStarted",
    "FailureLog",
    "FailureTracker",
    "RecentWrong",
    "Summary",
    "address_of",
    "shown_user",
]

#: failures of one user or address within WINDOW seconds that start a back-off
THRESHOLD: Final = 5
WINDOW: Final = 60.0
#: the first back-off, in seconds; each one after is twice the one before, up to MAX
FIRST_BACKOFF: Final = 1.0
MAX_BACKOFF: Final = 30.0
#: a record with no failure for this long is forgotten (its back-offs start over)
FORGET_AFTER: Final = 900.0
#: records kept per kind (users, addresses)
MAX_ENTRIES: Final = 10_000
#: the longest user name a log line shows (the rest is cut, and the line says so)
MAX_USER_CHARS: Final = 64
#: the longest user name a record is kept under (longer names share a record)
_MAX_KEY_CHARS: Final = 256
#: failed credentials remembered (see RecentWrong)
MAX_WRONG: Final = 4_096
#: failure lines of their own per address and LOG_WINDOW seconds; the rest are summed
LINES_PER_WINDOW: Final = 5
LOG_WINDOW: Final = 10.0
#: addresses the log keeps separate counts for at once (the rest share one count)
_MAX_LOG_ADDRESSES: Final = 1_000
#: the address under which failures beyond _MAX_LOG_ADDRESSES are summed
OTHER_ADDRESSES: Final = "other addresses"


def shown_user(user: str) -> str:
    """``user`` as a log line shows it: its ``repr``, cut to :data:`MAX_USER_CHARS`
    characters with the cut said (a user name is the client's to choose, and may be
    as long as a frame)."""
    if not user:
        return "(none given)"
    if len(user) <= MAX_USER_CHARS:
        return repr(user)
    return f"{user[:MAX_USER_CHARS]!r}... (cut, {len(user)} characters)"


def address_of(peer: str) -> str:
    """The address part of ``peer`` as the listeners write it (``host:port``, also for
    IPv6 hosts, or ``[v6]:port``; ``?`` when unknown): failures are counted per
    address, whatever port a connection comes from."""
    text = peer.strip()
    if text.startswith("["):
        return text[1:].partition("]")[0]
    host, sep, port = text.rpartition(":")
    return host if sep and host and port.isdigit() else text


@dataclass
class _Record:
    #: failures in the current window (reset when the window passes without a back-off)
    failures: int = 0
    window_start: float = 0.0
    last_failure: float = 0.0
    #: back-offs started so far (the next lasts FIRST_BACKOFF * 2**backoffs)
    backoffs: int = 0
    until: float = 0.0


@dataclass(frozen=True)
class BackedOff:
    """An attempt refused without a check: ``kind`` ("user" or "address") ``key`` is
    backed off until ``until`` (``retry_in`` seconds after the attempt)."""

    kind: str
    key: str
    until: float
    retry_in: float

    def words(self) -> str:
        """The refusal's text, for the peer and the log."""
        subject = f"user {shown_user(self.key)}" if self.kind == "user" else f"address {self.key}"
        return (
            f"too many failed logons for {subject}: refused without checking the password; "
            f"retry in {max(1, math.ceil(self.retry_in))} s"
        )


@dataclass(frozen=True)
class BackoffStarted:
    """A failure that started a back-off of ``seconds`` for ``kind`` ``key``."""

    kind: str
    key: str
    seconds: float
    failures: int


class _Keyed:
    """Records of one kind, least recently failed first, at most ``max_entries``."""

    def __init__(self, max_entries: int) -> None:
        self.max_entries = max_entries
        self.records: OrderedDict[str, _Record] = OrderedDict()

    def get(self, key: str, now: float, forget_after: float) -> _Record | None:
        record = self.records.get(key)
        if record is not None and now - record.last_failure > forget_after and now >= record.until:
            del self.records[key]
            return None
        return record

    def touch(self, key: str, now: float, forget_after: float) -> _Record:
        record = self.get(key, now, forget_after)
        if record is None:
            self._make_room(now, forget_after)
            record = self.records[key] = _Record(window_start=now)
        else:
            self.records.move_to_end(key)
        return record

    def _make_room(self, now: float, forget_after: float) -> None:
        if len(self.records) < self.max_entries:
            return
        for key in [k for k, r in self.records.items() if now - r.last_failure > forget_after]:
            del self.records[key]
        while len(self.records) >= self.max_entries:
            self.records.popitem(last=False)


class FailureTracker:
    """Which logon attempts to refuse without a check, and for how long (see the
    module docstring for the rule). Not thread-safe: one event loop calls it."""

    def __init__(
        self,
        *,
        threshold: int = THRESHOLD,
        window: float = WINDOW,
        first_backoff: float = FIRST_BACKOFF,
        max_backoff: float = MAX_BACKOFF,
        forget_after: float = FORGET_AFTER,
        max_entries: int = MAX_ENTRIES,
    ) -> None:
        if threshold < 1 or first_backoff <= 0 or max_backoff < first_backoff:
            raise ValueError("need threshold >= 1 and 0 < first_backoff <= max_backoff")
        self.threshold = threshold
        self.window = window
        self.first_backoff = first_backoff
        self.max_backoff = max_backoff
        self.forget_after = forget_after
        self._users = _Keyed(max_entries)
        self._addresses = _Keyed(max_entries)
        #: checks running now, per (kind, key): as many as connections wait for them
        self._in_flight: dict[tuple[str, str], int] = {}

    def __len__(self) -> int:
        """Records held (users and addresses)."""
        return len(self._users.records) + len(self._addresses.records)

    def check(self, user: str, address: str, now: float) -> BackedOff | None:
        """Whether an attempt by ``user`` from ``address`` at ``now`` is refused without
        a check (the longer running back-off of the two), or None: check it."""
        found: BackedOff | None = None
        for kind, keyed, key in self._keys(user, address):
            record = keyed.get(key, now, self.forget_after)
            if (
                record is not None
                and now < record.until
                and (found is None or record.until > found.until)
            ):
                found = BackedOff(kind, key, record.until, record.until - now)
        return found

    def may_start(self, user: str, address: str, now: float) -> bool:
        """Whether a check for ``user`` from ``address`` may start now, or must wait for
        one in flight to end: checks in flight count as failures to come, so at most
        as many run at once as failures would start a back-off (one, after a back-off
        ended). Many connections opened at once get no more checks than one after
        another would (the rest wait, then are refused once a back-off starts)."""
        for kind, keyed, key in self._keys(user, address):
            flying = self._in_flight.get((kind, key), 0)
            if not flying:
                continue
            record = keyed.get(key, now, self.forget_after)
            if record is None:
                room = self.threshold
            elif record.backoffs:
                room = 1
            else:
                fresh = now - record.window_start <= self.window
                room = self.threshold - (record.failures if fresh else 0)
            if flying >= room:
                return False
        return True

    def started(self, user: str, address: str) -> None:
        """A check for ``user`` from ``address`` started (see :meth:`may_start`)."""
        for kind, _, key in self._keys(user, address):
            self._in_flight[kind, key] = self._in_flight.get((kind, key), 0) + 1

    def finished(self, user: str, address: str) -> None:
        """That check ended (after :meth:`failed` or :meth:`succeeded` was told)."""
        for kind, _, key in self._keys(user, address):
            left = self._in_flight.get((kind, key), 0) - 1
            if left > 0:
                self._in_flight[kind, key] = left
            else:
                self._in_flight.pop((kind, key), None)

    def failed(self, user: str, address: str, now: float) -> list[BackoffStarted]:
        """A checked attempt failed: count it; the back-offs it started (if any)."""
        started: list[BackoffStarted] = []
        for kind, keyed, key in self._keys(user, address):
            record = keyed.touch(key, now, self.forget_after)
            if now - record.window_start > self.window:
                record.window_start, record.failures = now, 0
            record.failures += 1
            record.last_failure = now
            if record.backoffs or record.failures >= self.threshold:
                seconds = min(self.first_backoff * 2**record.backoffs, self.max_backoff)
                record.until = now + seconds
                record.backoffs += 1
                started.append(BackoffStarted(kind, key, seconds, record.failures))
                record.failures = 0
                record.window_start = now
        return started

    def succeeded(self, user: str, address: str) -> None:
        """A checked attempt succeeded: forget the user's and the address's failures."""
        for _, keyed, key in self._keys(user, address):
            keyed.records.pop(key, None)

    def _keys(self, user: str, address: str) -> list[tuple[str, _Keyed, str]]:
        keys = [("address", self._addresses, address)]
        if user:
            keys.append(("user", self._users, user[:_MAX_KEY_CHARS]))
        return keys


class RecentWrong:
    """Digests of credentials whose check failed (least recently seen first), each
    kept ``keep`` seconds after it was last seen, at most ``max_entries``.

    The caller makes the digest (an HMAC with a secret of its own over the
    authenticator, the user and the password), so nothing here can give a password
    back. Good only while the password file does not change, which holds: it is read
    once, at start.
    """

    def __init__(self, *, max_entries: int = MAX_WRONG, keep: float = FORGET_AFTER) -> None:
        self.max_entries = max_entries
        self.keep = keep
        self._seen: OrderedDict[bytes, float] = OrderedDict()

    def __len__(self) -> int:
        return len(self._seen)

    def seen(self, digest: bytes, now: float) -> bool:
        """Whether ``digest`` failed within ``keep`` seconds (refreshing it if so)."""
        last = self._seen.get(digest)
        if last is None:
            return False
        if now - last > self.keep:
            del self._seen[digest]
            return False
        self._seen[digest] = now
        self._seen.move_to_end(digest)
        return True

    def add(self, digest: bytes, now: float) -> None:
        """``digest`` failed a check at ``now``."""
        self._seen[digest] = now
        self._seen.move_to_end(digest)
        while len(self._seen) > self.max_entries:
            self._seen.popitem(last=False)


@dataclass(frozen=True)
class Summary:
    """``count`` failures from ``address`` had no line of their own in the window that
    began at ``since``."""

    address: str
    count: int
    since: float

    def words(self, window: float = LOG_WINDOW) -> str:
        return f"{self.count} more failed logons from {self.address} in the last {window:g} s"


@dataclass
class _Window:
    start: float
    lines: int = 0
    unlogged: int = 0


class FailureLog:
    """Which failed logons get a line of their own; sums of the rest (see the module
    docstring). Bounded: at most ``max_addresses`` windows at once; failures from
    further addresses share the window of :data:`OTHER_ADDRESSES`."""

    def __init__(
        self,
        *,
        lines_per_window: int = LINES_PER_WINDOW,
        window: float = LOG_WINDOW,
        max_addresses: int = _MAX_LOG_ADDRESSES,
    ) -> None:
        self.lines_per_window = lines_per_window
        self.window = window
        self.max_addresses = max_addresses
        self._windows: dict[str, _Window] = {}

    def note(self, address: str, now: float) -> bool:
        """A failure from ``address`` at ``now``: whether to log it on its own line
        (False: it is counted into that address's next :class:`Summary`)."""
        win = self._windows.get(address)
        if win is None:
            if len(self._windows) >= self.max_addresses:
                address = OTHER_ADDRESSES
                win = self._windows.get(address)
            if win is None:
                win = self._windows[address] = _Window(now)
        if win.lines < self.lines_per_window and address != OTHER_ADDRESSES:
            win.lines += 1
            return True
        win.unlogged += 1
        return False

    def next_due(self) -> float | None:
        """When the earliest window ends (None when no window is open)."""
        if not self._windows:
            return None
        return min(w.start for w in self._windows.values()) + self.window

    def due(self, now: float) -> list[Summary]:
        """Close the windows that ended by ``now``: a summary for each that counted
        failures without a line (a window with none just closes)."""
        summaries: list[Summary] = []
        for address, win in list(self._windows.items()):
            if now - win.start >= self.window:
                del self._windows[address]
                if win.unlogged:
                    summaries.append(Summary(address, win.unlogged, win.start))
        return summaries
