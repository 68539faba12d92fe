"""The options (header field ``o``) each command takes, in one catalogue.

An option amps-py does not implement is refused with a failure ack, never silently
ignored: a client that asks for ``conflation``, ``projection`` or a misspelt option
learns at once that it will not get what it asked for (issue 28). Each option is one
of:

* **implemented**: the server does what AMPS documents (or what docs/FEATURES.md says
  where amps-py differs);
* **advisory**: accepted, and nothing needs doing here (docs/FEATURES.md says why:
  e.g. ``live``, since delivery already follows the journal commit);
* **refused**: AMPS documents it, amps-py does not implement it; the failure ack's
  detail names the option and the AMPS feature behind it.

Anything else is unknown to AMPS as well, and refused naming the option and the
options the command does take. Every refusal has the reason ``invalid options`` (the
AMPS spelling client libraries match on); the ``detail`` says which option and why.
docs/FEATURES.md ("Command options") lists the same table for people; keep the two
in step.

Pure: no trio, no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

from amps_py import reasons
from amps_py.protocol.server.commands import CommandFailed

__all__ = [
    "ADVISORY",
    "IMPLEMENTED",
    "REFUSED",
    "check_options",
]

_SUBSCRIBE: Final = frozenset(
    {
        "replace",
        "oof",
        "timestamp",
        "bookmark",
        "fully_durable",
        "non_regex_topic",
        "bookmark_not_found",
        "max_backlog",
        "conflation",
        "conflation_key",
    }
)
_SOW: Final = frozenset(
    {"top_n", "skip_n", "orderby", "batch_size", "non_regex_topic", "timestamp"}
)
_SOW_AND_SUBSCRIBE: Final = _SUBSCRIBE | {"top_n", "orderby", "batch_size"}

#: command -> the options amps-py implements for it
IMPLEMENTED: Final[Mapping[str, frozenset[str]]] = {
    "subscribe": _SUBSCRIBE,
    "delta_subscribe": _SUBSCRIBE,
    "sow": _SOW,
    "sow_and_subscribe": _SOW_AND_SUBSCRIBE,
    "sow_and_delta_subscribe": _SOW_AND_SUBSCRIBE,
    "sow_delete": frozenset({"cancel", "expire"}),
}

_DELTA: Final = ("delta_subscribe", "sow_and_delta_subscribe")
_SUBSCRIBING: Final = (
    "subscribe",
    "delta_subscribe",
    "sow_and_subscribe",
    "sow_and_delta_subscribe",
)

#: option -> (the commands it is accepted on with nothing to do, why)
ADVISORY: Final[Mapping[str, tuple[tuple[str, ...], str]]] = {
    "live": (
        _SUBSCRIBING,
        "messages are delivered once their journal commit is done, never before",
    ),
    "send_keys": (
        (*_SUBSCRIBING, "sow"),
        "messages and records of SOW topics always carry their SOW key (k)",
    ),
    "no_empties": (
        _DELTA,
        "a delta subscription gets whole messages here, so never an empty delta",
    ),
}

#: option AMPS documents -> the AMPS feature amps-py does not implement
REFUSED: Final[Mapping[str, str]] = {
    "select": "select lists (retrieving part of a message)",
    "projection": "aggregated subscriptions",
    "grouping": "aggregated subscriptions",
    "rate": "rate-limited bookmark replay",
    "rate_max_gap": "rate-limited bookmark replay",
    "pause": "paused subscriptions",
    "resume": "paused subscriptions",
    "no_sowkey": "leaving the SOW key out of messages",
    "skip_n": "paginated subscriptions (skip_n works on sow)",
    "conflation": "conflation of a query (it works on subscriptions)",
    "conflation_key": "conflation of a query (it works on subscriptions)",
}


def check_options(command: str, opts: Mapping[str, str]) -> None:
    """Refuse any option of ``command`` that amps-py does not implement.

    Args:
        command: the command's name (``c``), e.g. ``subscribe``.
        opts: its options, as :func:`amps_py.protocol.server.commands.options` read them.

    Raises:
        CommandFailed: ``invalid options``; the detail names the first option (in
            the order sent) that is unknown, or documented by AMPS but not
            implemented here, and says what to do.
    """
    implemented = IMPLEMENTED.get(command)
    if implemented is None:
        return
    for name in opts:
        if name in implemented:
            continue
        advisory = ADVISORY.get(name)
        if advisory is not None and command in advisory[0]:
            continue
        feature = REFUSED.get(name)
        if feature is not None:
            raise CommandFailed(
                reasons.INVALID_OPTIONS,
                f"option {name!r} is not supported on {command} by amps-py ({feature}); "
                "send the command without it (docs/FEATURES.md lists every option)",
            )
        known = sorted(implemented | {n for n, (cmds, _) in ADVISORY.items() if command in cmds})
        raise CommandFailed(
            reasons.INVALID_OPTIONS,
            f"unknown option {name!r} on {command}; the options of {command} are "
            f"{', '.join(known)}",
        )
