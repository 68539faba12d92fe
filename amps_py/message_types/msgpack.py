"""MessagePack messages, read with the ``msgpack`` package.

The document is the unpacked value, mapped as AMPS documents for MessagePack
("MessagePack Messages" in the AMPS User Guide): nil is NULL, bool, int and float are
themselves, str is text, array is a list, map is an object, and **bin and ext are
text** (AMPS keeps their bytes as a String; here UTF-8, with U+FFFD where not). One
addition: the standard timestamp extension (type -1, newer than AMPS's table) is an
integer count of nanoseconds since the Unix epoch, its exact value.

Map keys: text keys are themselves; bin keys become text (as above); integer and float
keys become their decimal text (so ``/1`` finds the key 1); keys of any other kind
(nil, bool, array, map) cannot be named by a path and are dropped. A repeated key
keeps its last value.

Hostile payloads: every length in the payload (str, bin, array, map, ext) is limited
by the payload's own length, so a forged header cannot make the decoder allocate more
than a small multiple of the bytes received, and nesting is limited by the decoder's
stack. A payload that is not exactly one MessagePack value has no document.

``delta_publish`` merges the unpacked maps with :func:`amps_py.sow.merge.delta_merge`
(a nested map merges key by key, an array is replaced) and packs the result (bin stays
bin, ext stays ext).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Final

import msgpack

from amps_py.message_types._base import MergeError, MessageType
from amps_py.message_types._trees import clean_tree, text_of

#: msgpack's option for timestamps as integer nanoseconds since the epoch
_TIMESTAMP_AS_NANOSECONDS: Final = 2


def _ext_text(code: int, data: bytes) -> str:
    return text_of(data)


def _leaf(value: object) -> object:
    if isinstance(value, bytes):
        return text_of(value)
    return None  # nothing else reaches here: ext is text already, timestamps are ints


def _key(name: object) -> str | None:
    if isinstance(name, bytes):
        return text_of(name)
    if isinstance(name, int | float) and not isinstance(name, bool):
        return str(name)
    return None


def _unpack(payload: bytes, *, for_merge: bool) -> Any:
    """Unpack exactly one value with every length limited by ``len(payload)``."""
    limit = len(payload)
    return msgpack.unpackb(
        payload,
        raw=False,
        strict_map_key=False,
        unicode_errors="strict" if for_merge else "replace",
        timestamp=0 if for_merge else _TIMESTAMP_AS_NANOSECONDS,
        ext_hook=msgpack.ExtType if for_merge else _ext_text,
        max_str_len=limit,
        max_bin_len=limit,
        max_array_len=limit,
        max_map_len=limit,
        max_ext_len=limit,
    )


@dataclass(frozen=True, slots=True)
class MsgpackType:
    """The ``msgpack`` module (see the module docstring). Immutable; thread-safe."""

    name: str = "msgpack"
    module: ClassVar[str] = "msgpack"
    supports_delta: ClassVar[bool] = True

    def document(self, payload: bytes) -> object | None:
        """The unpacked value mapped as in the module docstring; None when the payload
        is not exactly one MessagePack value. Never raises."""
        try:
            decoded = _unpack(payload, for_merge=False)
        except Exception:  # ValueError, FormatError, StackError, TypeError (bad keys), ...
            return None
        return clean_tree(decoded, _leaf, _key)

    def merge(self, stored: bytes, delta: bytes) -> bytes:
        """The delta merged into the stored message, packed.

        Raises:
            MergeError: a message is not one well-formed MessagePack value.
        """
        old = _unpack_for_merge(stored, "stored")
        new = _unpack_for_merge(delta, "delta")
        from amps_py.sow.merge import delta_merge

        try:
            packed: bytes = msgpack.packb(delta_merge(old, new), use_bin_type=True)
        except Exception as exc:  # nested beyond the packer's limit
            raise MergeError(f"the merged message cannot be packed ({exc})") from None
        return packed

    def to_jsonable(self, payload: bytes) -> object | None:
        """The document (JSON-serialisable), or None when malformed."""
        return self.document(payload)


def _unpack_for_merge(payload: bytes, which: str) -> Any:
    try:
        return _unpack(payload, for_merge=True)
    except Exception as exc:
        raise MergeError(
            f"the {which} message is not one well-formed MessagePack value ({exc}); "
            "publish one MessagePack map per message"
        ) from None


#: the default ``msgpack`` type
MSGPACK: Final[MessageType] = MsgpackType()
