"""Where every password is checked: off the event loop, bounded, backed off, logged.

Client logons (``server/session.py``), replication hellos (``replication/incoming.py``)
and the admin API's HTTP Basic credentials (``admin/http.py``) all call
:meth:`AuthGate.check`. It

* answers at once, without a thread, for ``amps-default-authentication-module``
  (everyone may log on: nothing to check, nothing to count);
* refuses at once, without a check: the same wrong user and password as a recent
  failed check (:class:`amps_py.auth_backoff.RecentWrong`; not counted, so a
  misconfigured peer retrying locks nobody out), an attempt whose user or peer
  address is backed off after failed logons
  (:class:`amps_py.auth_backoff.FailureTracker`), and an empty user name (no
  password-file user has one): a flood costs no CPU;
* otherwise runs the authenticator (scrypt: some 40-60 ms of CPU and 16 MiB each) on a
  worker thread, at most :func:`default_check_threads` at once (a
  :class:`trio.CapacityLimiter`): the event loop keeps serving every other connection
  meanwhile, and memory stays bounded however many logons wait;
* logs every failure (user name cut to 64 characters, peer, where; never the
  password), each address's first few per 10 s on their own lines and the rest as one
  summary line per address (:class:`amps_py.auth_backoff.FailureLog`, flushed by
  :meth:`AuthGate.run`).

One gate per instance; the pure decisions live in :mod:`amps_py.auth_backoff`.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import os
import secrets
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

import trio

from amps_py import events
from amps_py.auth import AllowAllAuthenticator, Authenticator, AuthResult, PasswordFileAuthenticator
from amps_py.auth_backoff import (
    BackedOff,
    FailureLog,
    FailureTracker,
    RecentWrong,
    address_of,
    shown_user,
)

__all__ = ["WRONG_CREDENTIALS", "AuthGate", "GateVerdict", "default_check_threads"]

log = logging.getLogger("amps_py.auth")

#: the refusal text of a checked attempt (it never says which of the two was wrong)
WRONG_CREDENTIALS: Final = "unknown user or wrong password"


def default_check_threads() -> int:
    """Password checks run at once: one per core beyond the event loop's, 1 to 2."""
    return max(1, min(2, (os.cpu_count() or 1) - 1))


@dataclass(frozen=True)
class GateVerdict:
    """The answer of :meth:`AuthGate.check`.

    Attributes:
        ok: the credentials were accepted.
        result: the authenticator's answer (its ``reason`` goes into a logon ack);
            ``None`` when the attempt was refused without a check.
        refusal: why it was refused ("" when ok): :data:`WRONG_CREDENTIALS`, or the
            back-off's words saying when to retry.
        backed_off: the back-off that refused it without a check, if one did.
    """

    ok: bool
    result: AuthResult | None
    refusal: str = ""
    backed_off: BackedOff | None = None


class AuthGate:
    """Password checks for one instance (see the module docstring).

    Args:
        threads: checks run at once (default :func:`default_check_threads`).
        tracker: the back-off rule (default: the module constants of
            :mod:`amps_py.auth_backoff`).
        failure_log: the log-line rate limit (idem).
        recent_wrong: the credentials known to be wrong (idem).
        clock: the time the tracker and the log are given (trio's clock by default).
    """

    def __init__(
        self,
        *,
        threads: int | None = None,
        tracker: FailureTracker | None = None,
        failure_log: FailureLog | None = None,
        recent_wrong: RecentWrong | None = None,
        clock: Callable[[], float] = trio.current_time,
    ) -> None:
        self.limiter = trio.CapacityLimiter(threads or default_check_threads())
        self.tracker = tracker or FailureTracker()
        self.failure_log = failure_log or FailureLog()
        self.recent_wrong = recent_wrong or RecentWrong()
        self._key = secrets.token_bytes(32)
        self._clock = clock
        self._window_opened = trio.Event()
        #: set (and replaced) whenever a check ends: attempts waiting to start look again
        self._check_ended = trio.Event()
        #: password checks run on a worker thread (each one scrypt)
        self.checks_run = 0
        #: attempts refused without a check (backed off, or no user name)
        self.refused_unchecked = 0
        #: failed attempts, checked or not
        self.failures = 0

    async def check(
        self,
        authenticator: Authenticator,
        user: str,
        password: str,
        peer: str,
        where: str,
        event: str,
    ) -> GateVerdict:
        """Whether ``user`` with ``password`` may log on, from ``peer`` (``host:port``).

        ``where`` names the entry point for the log ("client 'c1' on transport
        json-tcp", "replication from upstream B", "admin API"); ``event`` is the event
        code of its failure lines. Failures are counted, backed off and logged here;
        the caller only answers its peer. The password is passed to the authenticator
        and nowhere else.
        """
        if isinstance(authenticator, AllowAllAuthenticator):
            return GateVerdict(True, authenticator.authenticate(user, password))
        address = address_of(peer)
        now = self._clock()
        digest = self._digest(authenticator, user, password)
        while True:
            if self.recent_wrong.seen(digest, now):
                # the same wrong credentials again: the answer is known, nothing counts
                self.refused_unchecked += 1
                again = f"{WRONG_CREDENTIALS} (again)"
                self._failed(user, peer, address, where, event, again, now)
                return GateVerdict(False, AuthResult(False), WRONG_CREDENTIALS)
            backed_off = self.tracker.check(user, address, now)
            if backed_off is not None:
                self.refused_unchecked += 1
                refusal = backed_off.words()
                self._failed(user, peer, address, where, event, refusal, now)
                return GateVerdict(False, None, refusal, backed_off)
            if self.tracker.may_start(user, address, now):
                break
            # as many checks of this user or address run as failures would back it
            # off: wait for one to end, then look again
            await self._check_ended.wait()
            now = self._clock()
        if not user and isinstance(authenticator, PasswordFileAuthenticator):
            # no password-file user has an empty name: nothing to check
            self.refused_unchecked += 1
            result = AuthResult(False)
            return self._checked(result, authenticator, user, digest, peer, address, where, event)
        self.checks_run += 1
        self.tracker.started(user, address)
        try:
            result = await trio.to_thread.run_sync(
                authenticator.authenticate, user, password, limiter=self.limiter
            )
            return self._checked(result, authenticator, user, digest, peer, address, where, event)
        finally:
            self.tracker.finished(user, address)
            self._check_ended.set()
            self._check_ended = trio.Event()

    def _checked(
        self,
        result: AuthResult,
        authenticator: Authenticator,
        user: str,
        digest: bytes,
        peer: str,
        address: str,
        where: str,
        event: str,
    ) -> GateVerdict:
        """Count, remember and log the authenticator's answer."""
        now = self._clock()
        if result.ok:
            self.tracker.succeeded(user, address)
            return GateVerdict(True, result)
        self.recent_wrong.add(digest, now)
        refusal = f"{WRONG_CREDENTIALS} ({authenticator.module})"
        for started in self.tracker.failed(user, address, now):
            if started.seconds == self.tracker.first_backoff:
                subject = (
                    f"user {shown_user(started.key)}"
                    if started.kind == "user"
                    else f"address {started.key}"
                )
                log.warning(
                    "%d failed logons for %s within %g s: further attempts are refused "
                    "without checking the password for %g s, for twice as long after each "
                    "further failure (at most %g s); a success resets it",
                    started.failures,
                    subject,
                    self.tracker.window,
                    started.seconds,
                    self.tracker.max_backoff,
                    extra=events.extra(events.AUTH_BACKOFF_STARTED),
                )
        self._failed(user, peer, address, where, event, refusal, now)
        return GateVerdict(False, result, WRONG_CREDENTIALS)

    def _digest(self, authenticator: Authenticator, user: str, password: str) -> bytes:
        """The keyed digest :attr:`recent_wrong` knows credentials by (unambiguous:
        the user's length comes first; the key never leaves this object)."""
        raw = user.encode("utf-8", "surrogatepass")
        message = b"%d:%d:%b%b" % (
            id(authenticator),
            len(raw),
            raw,
            password.encode("utf-8", "surrogatepass"),
        )
        return hmac.new(self._key, message, hashlib.sha256).digest()

    def _failed(
        self, user: str, peer: str, address: str, where: str, event: str, refusal: str, now: float
    ) -> None:
        self.failures += 1
        if self.failure_log.next_due() is None:
            self._window_opened.set()
        if self.failure_log.note(address, now):
            log.warning(
                "auth failure for user %s from %s (%s): %s",
                shown_user(user),
                peer,
                where,
                refusal,
                extra=events.extra(event),
            )

    async def run(self) -> None:
        """Write the failure summaries as their windows end (runs until cancelled)."""
        while True:
            due = self.failure_log.next_due()
            if due is None:
                self._window_opened = trio.Event()
                await self._window_opened.wait()
                continue
            await trio.sleep_until(due)
            for summary in self.failure_log.due(self._clock()):
                log.warning(
                    summary.words(self.failure_log.window),
                    extra=events.extra(events.AUTH_FAILURES_SUMMARY),
                )
