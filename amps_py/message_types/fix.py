"""FIX: ``tag=value`` fields with numeric tags, ended by the field separator (SOH).

Document: ``{"35": "D", "55": "IBM", "38": "100"}``, so ``/55 = 'IBM'`` and ``/38 > 50``
work (a numeric string compared with a number is converted, as in AMPS). Values are
strings; a repeated tag is a list in message order (``/448`` is every value,
``/448[0]`` the first). A field whose tag is not a number, or that has no ``=``, makes
the message malformed (document None). ``delta_publish`` merges field by field (see
:func:`amps_py.message_types._fields.merge_fields`).
"""

from __future__ import annotations

from typing import ClassVar, Final

from amps_py.message_types._base import MessageType
from amps_py.message_types._fields import TagValueType


class FixType(TagValueType):
    """The ``fix`` module (see the module docstring)."""

    __slots__ = ()
    module: ClassVar[str] = "fix"
    numeric_tags: ClassVar[bool] = True


#: the default ``fix`` type: SOH between fields
FIX: Final[MessageType] = FixType("fix")
