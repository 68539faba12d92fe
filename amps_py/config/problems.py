"""Configuration problems: what the loader reports, and the collector it reports with."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from lxml import etree

from amps_py.config.xmltree import _element_path, _line


@dataclass(frozen=True)
class ConfigProblem:
    """One thing wrong with a configuration, located and with a way to fix it.

    Attributes:
        file: the config file as given to the loader (or ``"<string>"``).
        line: 1-based line in that file, or ``None`` when no line applies (an
            unreadable file).
        element: the element path, e.g. ``AMPSConfig/TransactionLog/Topic``; empty when
            the problem concerns the file as a whole.
        message: what is wrong, as a plain sentence.
        fix: what to change to make it right.
    """

    file: str
    line: int | None
    element: str
    message: str
    fix: str

    def __str__(self) -> str:
        where = self.file if self.line is None else f"{self.file}:{self.line}"
        head = f"{where}: {self.element}: " if self.element else f"{where}: "
        end = "" if self.message.endswith((".", "?", "!")) else "."
        return f"{head}{self.message}{end} Fix: {self.fix}"


class ConfigError(Exception):
    """A configuration could not be loaded; ``problems`` lists every reason at once.

    ``str()`` gives a count header followed by one problem per line, ready to print.
    """

    def __init__(self, problems: Iterable[ConfigProblem]) -> None:
        self.problems: tuple[ConfigProblem, ...] = tuple(problems)
        super().__init__(self._render())

    def _render(self) -> str:
        count = len(self.problems)
        files = sorted({p.file for p in self.problems})
        noun = "problem" if count == 1 else "problems"
        header = f"{count} configuration {noun} in {', '.join(files) or '<unknown>'}:"
        return "\n".join([header, *(f"  {p}" for p in self.problems)])

    def __str__(self) -> str:
        return self._render()

    def __reduce__(self) -> tuple[type[ConfigError], tuple[tuple[ConfigProblem, ...]]]:
        return (type(self), (self.problems,))


class _Problems:
    """Collects problems for one document and remembers which elements are at fault.

    Later phases skip elements that already have a problem, so one mistake is reported
    once (an undefined ${PORT} is not also reported as a bad port).
    """

    def __init__(self, source: str) -> None:
        self.source = source
        self.items: list[ConfigProblem] = []
        self._faulty: set[etree._Element] = set()

    def add(
        self,
        el: etree._Element | None,
        message: str,
        fix: str,
        *,
        line: int | None = None,
        element: str | None = None,
    ) -> None:
        if el is not None:
            self._faulty.add(el)
            line = line if line is not None else _line(el)
            element = element if element is not None else _element_path(el)
        self.items.append(ConfigProblem(self.source, line, element or "", message, fix))

    def faulty(self, el: etree._Element | None) -> bool:
        return el is not None and el in self._faulty

    def covered_lines(self) -> set[int]:
        """Lines of faulty elements and their ancestors (for de-duplicating XSD errors)."""
        lines: set[int] = set()
        for el in self._faulty:
            for node in (el, *el.iterancestors()):
                node_line = _line(node)
                if node_line is not None:
                    lines.add(node_line)
        return lines

    def error(self) -> ConfigError:
        ordered = sorted(self.items, key=lambda p: p.line or 0)
        return ConfigError(ordered)


class _BadValue(Exception):
    """A value that could not be converted: what is wrong, and how to fix it."""

    def __init__(self, message: str, fix: str) -> None:
        super().__init__(message)
        self.message = message
        self.fix = fix
