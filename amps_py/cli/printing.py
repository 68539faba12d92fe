"""How ``amps-py subscribe`` prints (on one server and on the HA client alike): each
message as one line (:func:`message_line`), and on a terminal a rate line every few
seconds (:class:`RateLine`)."""

from __future__ import annotations

import time
from typing import Any, TextIO

import click
import orjson

#: seconds between two rate lines
RATE_LINE_EVERY = 5


def message_line(msg: Any, raw: bool, message_type: str = "json") -> str:
    """One printed message: its payload (``raw``), or the JSON envelope ``{topic,
    bookmark, data}`` (``bookmark`` only when the message has one) with
    ``"possible_duplicate": true`` added when the HA client flags it (it may have
    been printed before: redelivered after a reconnect or a restart). ``data`` is the
    payload as JSON: a JSON message as it is, a fix, nvfix, xml, bson or msgpack one
    (``message_type``, from the URI) as its fields, else the payload as text."""
    if raw:
        return str(msg.data.decode(errors="replace")) + "\n"
    from amps_py.cli.client import payload_as_json

    data = payload_as_json(msg.data, message_type)
    env: dict[str, Any] = {"topic": msg.topic}
    if msg.bookmark:  # a live subscription's messages carry none
        env["bookmark"] = msg.bookmark
    env["data"] = data
    if getattr(msg, "possible_duplicate", False):
        env["possible_duplicate"] = True
    return orjson.dumps(env).decode() + "\n"


class RateLine:
    """``[N messages, R msg/s]`` on stderr at most every :data:`RATE_LINE_EVERY`
    seconds, the rate counted from when this was made; nothing when ``enabled`` is
    false (stderr is not a terminal: nothing extra when piped)."""

    def __init__(self, out: TextIO, enabled: bool) -> None:
        self.out = out
        self.enabled = enabled
        self.started = self.last_report = time.monotonic()

    def tick(self, printed: int) -> None:
        """``printed`` messages so far: write the line when it is due (``out`` flushed
        first, so the line follows the messages it counts)."""
        now = time.monotonic()
        if self.enabled and now - self.last_report >= RATE_LINE_EVERY:
            self.out.flush()
            click.echo(
                f"[{printed} messages, {printed / (now - self.started):,.0f} msg/s]", err=True
            )
            self.last_report = now
