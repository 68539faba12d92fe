"""BSON (Binary JSON) messages, read with pymongo's ``bson`` package.

The document is the decoded BSON document, with the values JSON has no type for made
into values filters compare:

======================  ===============================================================
BSON                    document value
======================  ===============================================================
double, string, bool,   themselves (int32 and int64 are integers)
null, int32, int64
document, array         object, list
ObjectId                its 24 hex digits, ``'65a1...'``
UTC datetime            integer milliseconds since the Unix epoch (BSON's own value, any
                        year), so ``/ts > UNIX_TIMESTAMP() * 1000 - 60000`` works
Decimal128              its exact decimal text, ``'12.50'`` (it converts when compared
                        with a number, keeping every digit otherwise)
binary                  subtype 4 (UUID): the UUID's text; others: the bytes as UTF-8
                        text (U+FFFD where not UTF-8), as AMPS reads MessagePack bin
regular expression      its pattern text
JavaScript code         its text
timestamp (internal)    ``{"t": seconds, "i": increment}``
DBRef                   ``{"$ref": ..., "$id": ...}`` (and ``$db``)
min key, max key,       NULL
undefined
======================  ===============================================================

A payload that is not exactly one valid BSON document (truncated, trailing bytes,
wrong lengths, nested deeper than the decoder allows) has no document.
``delta_publish`` merges the decoded documents with
:func:`amps_py.sow.merge.delta_merge` (a sub-document merges field by field, an array
is replaced) and encodes the result, so every BSON type round-trips unchanged.
"""

from __future__ import annotations

import datetime
import re
import uuid
from dataclasses import dataclass
from typing import Any, ClassVar, Final

import bson
from bson.binary import UUID_SUBTYPE, Binary, UuidRepresentation
from bson.codec_options import CodecOptions, DatetimeConversion

from amps_py.message_types._base import MergeError, MessageType
from amps_py.message_types._trees import clean_tree, text_of

#: for documents: never fail on text, keep dates as integer milliseconds (any year)
_READ: Final = CodecOptions(
    document_class=dict,
    unicode_decode_error_handler="replace",
    datetime_conversion=DatetimeConversion.DATETIME_MS,
)
#: for merges: strict text, dates kept as they are so that they encode back unchanged
_MERGE: Final = CodecOptions(
    document_class=dict, datetime_conversion=DatetimeConversion.DATETIME_MS
)
_EPOCH: Final = datetime.datetime(1970, 1, 1, tzinfo=datetime.UTC)


def _leaf(value: object) -> object:
    """A decoded BSON value that is not plain JSON, as a document value."""
    if isinstance(value, int):  # Int64
        return int(value)
    if isinstance(value, bson.ObjectId | bson.Decimal128):
        return str(value)
    if isinstance(value, bson.DatetimeMS):
        return int(value)
    if isinstance(value, datetime.datetime):
        aware = value if value.tzinfo else value.replace(tzinfo=datetime.UTC)
        return (aware - _EPOCH) // datetime.timedelta(milliseconds=1)
    if isinstance(value, Binary) and value.subtype == UUID_SUBTYPE and len(value) == 16:
        return str(value.as_uuid(UuidRepresentation.STANDARD))
    if isinstance(value, bytes):
        return text_of(value)
    if isinstance(value, uuid.UUID):
        return str(value)
    if isinstance(value, str):  # Code, or another str subclass
        return str(value)
    if isinstance(value, bson.Regex | re.Pattern):
        pattern = value.pattern
        return text_of(pattern) if isinstance(pattern, bytes) else str(pattern)
    if isinstance(value, bson.Timestamp):
        return {"t": value.time, "i": value.inc}
    if isinstance(value, bson.DBRef):
        return dict(value.as_doc())
    if isinstance(value, dict):  # SON
        return dict(value)
    return None  # MinKey, MaxKey, anything else without a value


def _key(name: object) -> str | None:
    return name if isinstance(name, str) else None


@dataclass(frozen=True, slots=True)
class BsonType:
    """The ``bson`` module (see the module docstring). Immutable; thread-safe."""

    name: str = "bson"
    module: ClassVar[str] = "bson"
    supports_delta: ClassVar[bool] = True

    def document(self, payload: bytes) -> object | None:
        """The decoded document with BSON-only values converted (see the module
        docstring); None when the payload is not one valid BSON document. Never raises."""
        try:
            decoded = bson.decode(payload, codec_options=_READ)
        except Exception:  # hostile bytes raise InvalidBSON, but also others
            return None
        return clean_tree(decoded, _leaf, _key)

    def merge(self, stored: bytes, delta: bytes) -> bytes:
        """The delta merged into the stored document, encoded as BSON.

        Raises:
            MergeError: a message is not one valid BSON document.
        """
        old = _decode_for_merge(stored, "stored")
        new = _decode_for_merge(delta, "delta")
        from amps_py.sow.merge import delta_merge

        try:
            return bson.encode(delta_merge(old, new), codec_options=_MERGE)
        except Exception as exc:  # nested beyond the encoder's depth
            raise MergeError(f"the merged BSON document cannot be encoded ({exc})") from None

    def to_jsonable(self, payload: bytes) -> object | None:
        """The document (JSON-serialisable), or None when malformed."""
        return self.document(payload)


def _decode_for_merge(payload: bytes, which: str) -> dict[str, Any]:
    try:
        return bson.decode(payload, codec_options=_MERGE)
    except Exception as exc:
        raise MergeError(
            f"the {which} message is not a valid BSON document ({exc}); publish one "
            "BSON document per message"
        ) from None


#: the default ``bson`` type
BSON: Final[MessageType] = BsonType()
