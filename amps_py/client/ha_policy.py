"""Which server the HA client dials next, and how long it waits first (pure; no I/O).

:class:`ServerChooser` turns the caller's ``servers`` (a list of equivalent URIs, or a
callable returning one) into the URI of each attempt; :class:`Backoff` says how long to
wait before an attempt, given how many attempts in a row have failed. The HA client
(:mod:`amps_py.client.ha`) owns the clock: nothing here sleeps or reads the time.

The policy, for a list of ``n`` servers:

* after a connection is lost, the next server is tried at once (failover);
* each server in the list is tried once without waiting (one *round*);
* after a whole round failed, the client waits ``initial`` seconds before the next
  round, then twice that before the one after, and so on up to ``maximum``;
* a successful logon starts the count again.

A callable chooser counts as a list of one server: the first retry is immediate, the
following ones back off.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from .uri import parse_uri

__all__ = ["Backoff", "ServerChooser"]


class ServerChooser:
    """The server of each connection attempt.

    Args:
        servers: equivalent URIs tried in turn (rotating: after the last comes the
            first), or a callable returning the URI to try now (called once per attempt;
            it may return the same URI again, or consult a directory).

    Raises:
        ValueError: an empty list, or a URI that does not parse (the message says which).
    """

    def __init__(self, servers: Sequence[str] | Callable[[], str]) -> None:
        if callable(servers):
            self._choose: Callable[[], str] | None = servers
            self._uris: list[str] = []
        else:
            if isinstance(servers, str):
                raise ValueError(
                    f"servers must be a list of URIs or a callable, not the string {servers!r}; "
                    "split a comma-separated list first (uris.split(','))"
                )
            self._choose = None
            self._uris = list(servers)
            if not self._uris:
                raise ValueError("servers is empty: give at least one tcp://host:port/amps/json")
            for uri in self._uris:
                parse_uri(uri)  # raises BadURI (a ValueError) naming the bad one
        self._index = 0

    @property
    def round_size(self) -> int:
        """How many attempts make one round (the list's length; 1 for a callable)."""
        return len(self._uris) if self._uris else 1

    def choose(self) -> str:
        """The URI to dial now (a callable chooser is called)."""
        if self._choose is not None:
            return str(self._choose())
        return self._uris[self._index % len(self._uris)]

    def advance(self) -> None:
        """The current server failed or its connection was lost: move to the next one."""
        self._index = (self._index + 1) % max(len(self._uris), 1)


@dataclass(frozen=True)
class Backoff:
    """Delays between connection attempts (see the module doc for the policy).

    Attributes:
        initial: seconds waited after the first whole round of failed attempts.
        maximum: the cap on any wait.
        factor: growth of the wait from one round to the next.
        round_size: attempts in one round (the number of servers).
    """

    initial: float = 0.05
    maximum: float = 5.0
    factor: float = 2.0
    round_size: int = 1

    def __post_init__(self) -> None:
        if self.initial < 0:
            raise ValueError(f"`initial` must be 0 or more seconds, got {self.initial:g}")
        if self.maximum < self.initial:
            raise ValueError(
                f"`maximum` ({self.maximum:g} s) must be at least `initial` ({self.initial:g} s)"
            )
        if self.factor < 1:
            raise ValueError(f"`factor` must be 1 or more, got {self.factor:g}")
        if self.round_size < 1:
            raise ValueError(f"`round_size` must be 1 or more, got {self.round_size}")

    def delay(self, failures: int) -> float:
        """Seconds to wait before the next attempt, after ``failures`` attempts in a row
        failed since the last successful logon (0: the first attempt after a lost
        connection, which is immediate)."""
        rounds, within = divmod(failures, self.round_size)
        if rounds == 0 or within:
            return 0.0
        return float(min(self.maximum, self.initial * self.factor ** (rounds - 1)))
