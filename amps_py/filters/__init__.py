"""The AMPS content-filter language: parse once, evaluate per message.

Pure Python and sans-IO: no trio, no sockets, no clock reads except ``UNIX_TIMESTAMP()``
when the caller gives no time. Layout, in pipeline order:

- ``lexer``      text -> tokens (field paths, literals, operators)
- ``parser``     tokens -> a tree of ``nodes`` (recursive descent, nesting limits)
- ``compiler``   tree -> Python closures (constant folding, precompiled regexes and sets)
- ``values``     NULL, type conversions and comparison rules shared by the closures
- ``paths``      field paths over parsed JSON (arrays give multi-values)
- ``functions``  the built-in function table
- ``api``        ``compile_filter`` and ``Filter``; ``context`` and ``errors`` hold the rest

Usage::

    f = compile_filter("/qty > 100 AND /sym IN ('IBM', 'MSFT')")
    f.matches({"qty": 150, "sym": "IBM"})       # True
    f.matches_json(b'{"qty": 5, "sym": "IBM"}')  # False
"""

from .api import Expression, Filter, compile_expression, compile_filter
from .context import EvalContext
from .errors import FilterError

__all__ = [
    "EvalContext",
    "Expression",
    "Filter",
    "FilterError",
    "compile_expression",
    "compile_filter",
]
