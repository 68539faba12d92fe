"""What the ``amps-py`` commands that run on the HA client (publish and subscribe with
a URI list or ``--store``) tell the user while it runs: reconnects and failovers
(:func:`state_reporter`), the servers it cannot use and why, once per server and reason
(:func:`client_log_on_stderr`), and a first logon that does not come
(:func:`first_logon`); each as an ``amps-py:`` line on stderr."""

from __future__ import annotations

import contextlib
import logging
import sys
from collections.abc import Callable, Iterator
from typing import Any

import click


def state_reporter(out: Callable[[str], None]) -> Callable[[str, dict[str, Any]], None]:
    """An ``on_state`` that tells the user about reconnects on stderr."""
    from amps_py.client.ha import CONNECTED, DISCONNECTED, FAILED_OVER

    def report(state: str, detail: dict[str, Any]) -> None:
        if state == DISCONNECTED:
            out(f"amps-py: lost {detail.get('uri')} ({detail.get('reason')}); reconnecting")
        elif state == FAILED_OVER:
            out(f"amps-py: failed over to {detail.get('uri')}")
        elif state == CONNECTED and detail.get("republished"):
            out(
                f"amps-py: connected to {detail.get('uri')}; republished "
                f"{detail['republished']} unacknowledged message(s) from the store"
            )

    return report


class _RetryNotice(logging.Filter):
    """Writes ``notice`` on stderr once, before the first warning it lets through (a
    server the HA client cannot use): how long the command keeps retrying and how to
    stop it."""

    def __init__(self, notice: str) -> None:
        super().__init__()
        self.notice = notice
        self.given = False

    def filter(self, record: logging.LogRecord) -> bool:
        if not self.given and record.levelno >= logging.WARNING:
            self.given = True
            echo_err(self.notice)
        return True


class _ShortRepeats(logging.Filter):
    """A server the HA client cannot use for the reason it already gave is one short
    line (``... cannot use URI (as before); next attempt in 0.8 s``): the reason, and
    its hint, are written once per server and reason, not on every retry."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: set[tuple[str, str]] = set()

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args
        if not (isinstance(args, tuple) and len(args) == 4 and "cannot use" in record.msg):
            return True
        client, uri, why, delay = args
        if not isinstance(delay, (int, float)):
            return True
        if (str(uri), str(why)) not in self.seen:
            self.seen.add((str(uri), str(why)))
            return True
        echo_err(
            f"amps-py: HA client {client!r}: cannot use {uri} (as before); "
            f"next attempt in {delay:.3g} s"
        )
        return False


@contextlib.contextmanager
def client_log_on_stderr(notice: str = "") -> Iterator[None]:
    """The HA client's warnings (a server it cannot use, and why) as ``amps-py:``
    lines on stderr while the command runs; ``notice`` once before the first."""
    logger = logging.getLogger("amps_py.client")
    handler = logging.StreamHandler(sys.stderr)
    if notice:
        handler.addFilter(_RetryNotice(notice))
    handler.addFilter(_ShortRepeats())
    handler.setLevel(logging.WARNING)
    handler.setFormatter(logging.Formatter("amps-py: %(message)s"))
    logger.addHandler(handler)
    try:
        yield
    finally:
        logger.removeHandler(handler)


def echo_err(text: str) -> None:
    """``text`` as a line on stderr."""
    click.echo(text, err=True)


async def first_logon(ha: Any, uris: list[str], timeout: float) -> None:
    """Wait until the HA client ``ha`` is logged on to one of ``uris``.

    Raises:
        TimeoutError: none accepted a logon within ``timeout`` seconds (the message
            says what to do).
    """
    try:
        await ha.wait_connected(timeout)
    except TimeoutError:
        raise TimeoutError(
            f"none of {', '.join(uris)} accepted a logon within {timeout:g} s (the lines "
            "above say why); start an instance there or correct the URIs"
        ) from None


@contextlib.contextmanager
def closing(store: Any) -> Iterator[Any]:
    """``store`` (a publish or bookmark store, or None), closed when the block ends."""
    try:
        yield store
    finally:
        if store is not None:
            store.close()
