"""Protocol errors.

Every malformed input the codec sees raises :class:`ProtocolError` (or a subclass) and
nothing else; that is the codec's one promise to the I/O layer above it.
"""

from __future__ import annotations


class ProtocolError(Exception):
    """The peer sent bytes that are not a valid AMPS frame.

    ``reason`` is the short, stable reason string sent in failure acks and logged on
    disconnect; the message text says what was wrong and how the sender can fix it.
    """

    def __init__(self, message: str, *, reason: str = "invalid frame") -> None:
        super().__init__(message)
        self.reason = reason


class FrameTooLarge(ProtocolError):
    """A frame's length prefix exceeds the configured maximum."""

    def __init__(self, size: int, limit: int) -> None:
        super().__init__(
            f"frame of {size} bytes exceeds the maximum of {limit} bytes; send smaller "
            "messages or raise the transport's MaxMessageSize",
            reason="frame too large",
        )
        self.size = size
        self.limit = limit
