"""NVFIX (name/value FIX): FIX's layout with names for tags, e.g. ``Symbol=IBM``.

A name is any run of bytes other than ``=`` and the field separator (so it may hold
spaces: address it with a bracketed path, ``[/Order Qty]``). Document:
``{"Symbol": "IBM", "Qty": "100"}``; values are strings, a repeated name is a list in
message order. A non-empty field without ``=`` makes the message malformed (document
None). ``delta_publish`` merges field by field, as for FIX.
"""

from __future__ import annotations

from typing import ClassVar, Final

from amps_py.message_types._base import MessageType
from amps_py.message_types._fields import TagValueType


class NvfixType(TagValueType):
    """The ``nvfix`` module (see the module docstring)."""

    __slots__ = ()
    module: ClassVar[str] = "nvfix"
    numeric_tags: ClassVar[bool] = False


#: the default ``nvfix`` type: SOH between fields
NVFIX: Final[MessageType] = NvfixType("nvfix")
