"""The one error the filter compiler raises.

Every problem with filter text (lexing, parsing, checking) becomes a :class:`FilterError`;
nothing else escapes :func:`~amps_py.filters.compile_filter`. Evaluation never raises.
"""

from __future__ import annotations

from amps_py import reasons


class FilterError(ValueError):
    """Bad filter text.

    ``str(error)`` says what is wrong and at which column, shows the filter text with a
    caret under the problem, and ends with a hint on how to fix it::

        bad filter: unterminated string at column 6
          /a = 'abc
               ^
          hint: close the string with a matching ' quote

    Attributes:
        reason: the short, stable reason string sent in failure acks ("bad filter").
        position: 0-based offset into ``text`` where the problem is.
        problem: one line saying what is wrong, without the column.
        hint: one line saying how to fix it (may be empty).
        text: the whole filter text.
    """

    reason: str = reasons.BAD_FILTER

    def __init__(self, problem: str, *, text: str, position: int, hint: str = "") -> None:
        self.problem = problem
        self.text = text
        self.position = max(0, min(position, len(text)))
        self.hint = hint
        super().__init__(self._render())

    def __reduce__(self) -> tuple[object, ...]:
        # Keyword-only constructor arguments need help to survive pickling.
        return (_rebuild, (self.problem, self.text, self.position, self.hint))

    @property
    def line(self) -> int:
        """1-based line of :attr:`position` in :attr:`text`."""
        return self.text.count("\n", 0, self.position) + 1

    @property
    def column(self) -> int:
        """1-based column of :attr:`position` within its line."""
        return self.position - (self.text.rfind("\n", 0, self.position) + 1) + 1

    def _render(self) -> str:
        start = self.text.rfind("\n", 0, self.position) + 1
        end = self.text.find("\n", self.position)
        if end < 0:
            end = len(self.text)
        line_text = self.text[start:end].rstrip("\r")
        # Keep tabs so the caret lines up with the text above it.
        pad = "".join("\t" if ch == "\t" else " " for ch in line_text[: self.position - start])
        where = f"column {self.column}"
        if "\n" in self.text:
            where = f"line {self.line}, {where}"
        parts = [f"{self.reason}: {self.problem} at {where}", f"  {line_text}", f"  {pad}^"]
        if self.hint:
            parts.append(f"  hint: {self.hint}")
        return "\n".join(parts)


def _rebuild(problem: str, text: str, position: int, hint: str) -> FilterError:
    return FilterError(problem, text=text, position=position, hint=hint)
