"""The tag=value format shared by FIX and NVFIX: parsing, merging and separators.

A message is ``tag=value`` fields, each ended (or separated) by the *field separator*
(by default the ASCII SOH byte, 0x01). The tag runs to the first ``=``; the value is
everything after it up to the separator, so a value may hold ``=``. Empty fields
(two separators in a row, a trailing separator) are skipped.

A tag that occurs more than once is a repeated field: the document holds its values
as a list in message order, as AMPS reads FIX and NVFIX "as though they were an XML
fragment with no root element" (repeated elements are an array), so ``/448 = 'X'`` is
TRUE when any occurrence is ``X`` and ``/448[1]`` is the second.

Bytes that are not UTF-8 are read as U+FFFD in documents (a filter compares text);
:func:`merge_fields` works on the raw bytes and never changes a byte it keeps.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Final

from amps_py.message_types._base import MergeError

#: AMPS's field separator for FIX and NVFIX: SOH
DEFAULT_FIELD_SEPARATOR: Final = b"\x01"
#: the separator between a legacy-protocol header and its body (STX); amps-py keeps it
#: in the configuration only: its ``amps`` protocol frames carry the header apart
DEFAULT_HEADER_SEPARATOR: Final = b"\x02"
#: the separator between messages of a legacy-protocol batch (ETX); kept likewise
DEFAULT_MESSAGE_SEPARATOR: Final = b"\x03"


@dataclass(frozen=True, slots=True)
class TagValueType:
    """A tag=value message type (the base of FIX and NVFIX). Immutable; thread-safe.

    Attributes:
        name: the type's name (``fix``, ``nvfix``, or a name ``<MessageTypes>`` gives).
        field_separator: the one byte that ends each field.
        header_separator: kept from the configuration (see the module docstring).
        message_separator: kept from the configuration (see the module docstring).
    """

    name: str
    field_separator: bytes = DEFAULT_FIELD_SEPARATOR
    header_separator: bytes = DEFAULT_HEADER_SEPARATOR
    message_separator: bytes = DEFAULT_MESSAGE_SEPARATOR

    module: ClassVar[str] = ""
    supports_delta: ClassVar[bool] = True
    #: FIX tags are numbers; NVFIX tags are any bytes but ``=`` and the separator
    numeric_tags: ClassVar[bool] = False

    def __post_init__(self) -> None:
        for label, sep in (
            ("field_separator", self.field_separator),
            ("header_separator", self.header_separator),
            ("message_separator", self.message_separator),
        ):
            if len(sep) != 1:
                raise ValueError(f"{label} must be exactly one byte, not {sep!r}")
        if self.field_separator == b"=":
            raise ValueError("field_separator cannot be '=': it separates a tag from its value")

    def document(self, payload: bytes) -> object | None:
        """``{tag: value}`` with string values (a list for a repeated tag); None when
        a field has no ``=``, an empty tag, or (FIX) a tag that is not a number.
        Never raises."""
        if self.field_separator.isascii():
            # An ASCII byte is never part of a UTF-8 sequence (nor of a replaced invalid
            # one), so decoding first and splitting the text gives the same fields.
            fields = payload.decode("utf-8", "replace").split(self.field_separator.decode())
        else:
            fields = [f.decode("utf-8", "replace") for f in payload.split(self.field_separator)]
        doc: dict[str, object] = {}
        numeric = self.numeric_tags
        for field in fields:
            if not field:
                continue
            tag, eq, value = field.partition("=")
            if not eq or not tag or (numeric and not (tag.isdigit() and tag.isascii())):
                return None
            previous = doc.get(tag)
            if previous is None:
                doc[tag] = value
            elif type(previous) is list:
                previous.append(value)
            else:
                doc[tag] = [previous, value]
        return doc

    def merge(self, stored: bytes, delta: bytes) -> bytes:
        """``delta``'s fields applied to ``stored`` (see :func:`merge_fields`).

        Raises:
            MergeError: either message is not a well-formed message of this type.
        """
        return merge_fields(
            self._fields(stored, "stored"), self._fields(delta, "delta"), self.field_separator
        )

    def to_jsonable(self, payload: bytes) -> object | None:
        """The document (already JSON-serialisable), or None when malformed."""
        return self.document(payload)

    def _fields(self, payload: bytes, which: str) -> list[tuple[bytes, bytes]]:
        fields: list[tuple[bytes, bytes]] = []
        for raw in payload.split(self.field_separator):
            if not raw:
                continue
            tag, eq, value = raw.partition(b"=")
            if not eq or not tag or (self.numeric_tags and not (tag.isdigit() and tag.isascii())):
                shown = raw[:40].decode("utf-8", "replace")
                need = "a numeric tag=value field" if self.numeric_tags else "a name=value field"
                raise MergeError(
                    f"the {which} message is not {self.module.upper()}: {shown!r} is not "
                    f"{need} (fields end with {_shown_byte(self.field_separator)}); publish "
                    f"well-formed {self.module} messages"
                )
            fields.append((tag, value))
        return fields


def merge_fields(
    stored: list[tuple[bytes, bytes]], delta: list[tuple[bytes, bytes]], separator: bytes
) -> bytes:
    """The merged message: AMPS ``delta_publish`` rules over tag=value fields.

    A tag in the delta replaces every occurrence of that tag in the stored message (a
    repeated tag is replaced as a whole, like an array), at the place of its first
    occurrence; tags the delta does not name are kept as they were; tags new to the
    message follow the stored ones in the delta's order. Every field of the result
    ends with ``separator`` (as AMPS 4.0 and later write merged FIX).
    """
    replacements: dict[bytes, list[bytes]] = {}
    for tag, value in delta:
        replacements.setdefault(tag, []).append(value)
    out: list[bytes] = []
    placed: set[bytes] = set()
    for tag, value in stored:
        new_values = replacements.get(tag)
        if new_values is None:
            out.append(tag + b"=" + value + separator)
        elif tag not in placed:
            placed.add(tag)
            out.extend(tag + b"=" + v + separator for v in new_values)
    for tag, new_values in replacements.items():
        if tag not in placed:
            out.extend(tag + b"=" + v + separator for v in new_values)
    return b"".join(out)


def _shown_byte(sep: bytes) -> str:
    text = sep.decode("latin-1")
    return repr(text) if sep.isascii() and text.isprintable() else f"byte {sep[0]}"
