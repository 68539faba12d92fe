"""Per-evaluation facts that do not come from the message body."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class EvalContext:
    """What the context functions return while one message is being filtered.

    The filter package never reads a clock or a connection itself: the server fills one of
    these per message (or per client) and passes it to :meth:`Filter.matches`.

    Attributes:
        client_name: returned by ``CLIENT_NAME()``; an empty name is NULL.
        instance_name: returned by ``AMPS_INSTANCE_NAME()``; an empty name is NULL.
        message_size: returned by ``MESSAGE_SIZE()``, in bytes. ``Filter.matches_json``
            uses the payload's length instead when this is 0.
        now: UNIX seconds returned by ``UNIX_TIMESTAMP()``; ``None`` means ``time.time()``
            at the moment the function runs (pass a value to make tests deterministic).
    """

    client_name: str = ""
    instance_name: str = ""
    message_size: int = 0
    now: float | None = None


DEFAULT_CONTEXT = EvalContext()
