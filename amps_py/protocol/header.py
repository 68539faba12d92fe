"""AMPS header keys: long names, short names, and normalisation.

The server accepts both the long and the short key for every header field and keeps
headers internally under the short key when one exists (``c``, ``cid``, ``t``, ...),
so the rest of the code only ever looks up one spelling.
"""

from __future__ import annotations

from typing import Final

#: long key -> short key, for every field that has a short form.
LONG_TO_SHORT: Final[dict[str, str]] = {
    "cmd": "c",
    "cmd_id": "cid",
    "topic": "t",
    "ack_type": "a",
    "bookmark": "bm",
    "batch_size": "bs",
    "correlation_id": "x",
    "expiration": "e",
    "filter": "f",
    "msg_len": "l",
    "opts": "o",
    "options": "o",
    "seq": "s",
    "sow_key": "k",
    "timestamp": "ts",
    "leaseperiod": "lp",
    "password": "pw",
}

#: abbreviated command names -> canonical command names.
COMMAND_ALIASES: Final[dict[str, str]] = {"p": "publish"}

#: commands a client may send; anything else is answered with ``unknown command``.
CLIENT_COMMANDS: Final[frozenset[str]] = frozenset(
    {
        "logon",
        "publish",
        "delta_publish",
        "subscribe",
        "delta_subscribe",
        "unsubscribe",
        "sow",
        "sow_and_subscribe",
        "sow_and_delta_subscribe",
        "sow_delete",
        "heartbeat",
        "flush",
    }
)

#: header fields that must be integers when present.
INTEGER_FIELDS: Final[frozenset[str]] = frozenset({"s", "bs", "e", "l", "top_n", "max_msgs"})

ACK_TYPES: Final[frozenset[str]] = frozenset(
    {"none", "received", "parsed", "processed", "persisted", "completed", "stats"}
)


def split_outside_brackets(text: str) -> list[str]:
    """``text`` split at the commas outside ``[...]``: header fields that list
    things (options ``o``, ``orderby``) may hold AMPS lists such as
    ``conflation_key=[/a,/b]``, whose commas belong to the value. An unmatched ``]``
    is an ordinary character."""
    if "[" not in text:
        return text.split(",")
    parts: list[str] = []
    depth = 0
    start = 0
    for index, char in enumerate(text):
        if char == "[":
            depth += 1
        elif char == "]" and depth:
            depth -= 1
        elif char == "," and not depth:
            parts.append(text[start:index])
            start = index + 1
    parts.append(text[start:])
    return parts
