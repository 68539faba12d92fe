"""Sans-IO AMPS wire protocol: framing, header normalisation, errors.

No trio, no sockets, no clocks: bytes in, :class:`Frame` objects out, bytes to send.
"""

from .codec import (
    DEFAULT_MAX_FRAME_SIZE,
    Frame,
    FrameDecoder,
    PartialFrame,
    encode_frame,
    encode_raw,
    normalise_header,
    split_header,
)
from .errors import FrameTooLarge, ProtocolError
from .header import ACK_TYPES, CLIENT_COMMANDS, COMMAND_ALIASES, LONG_TO_SHORT
from .sow import SowRecord, split_sow_batch

__all__ = [
    "ACK_TYPES",
    "CLIENT_COMMANDS",
    "COMMAND_ALIASES",
    "DEFAULT_MAX_FRAME_SIZE",
    "LONG_TO_SHORT",
    "Frame",
    "FrameDecoder",
    "FrameTooLarge",
    "PartialFrame",
    "ProtocolError",
    "SowRecord",
    "encode_frame",
    "encode_raw",
    "normalise_header",
    "split_header",
    "split_sow_batch",
]
