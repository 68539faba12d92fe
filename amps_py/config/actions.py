"""``Actions``: the On, If and Do modules of each Action and their Options."""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Final

from lxml import etree

from amps_py.config.model import (
    ACTION_DO_MODULES,
    ACTION_IF_MODULES,
    ACTION_ON_MODULES,
    ActionConfig,
    ActionModule,
)
from amps_py.config.problems import _Problems
from amps_py.config.values import _text
from amps_py.config.xmltree import _child_elements, _children, _first, _line, _snippet
from amps_py.filters import FilterError, compile_filter
from amps_py.units import UnitError, parse_duration, parse_percent

_ACTION_VARIABLE = re.compile(r"\{\{\s*([A-Za-z0-9_]+)\s*\}\}")
#: what a ``{{VAR}}`` stands for while a Condition is checked at load time: a word that
#: is valid both as a number and inside quotes
_SAMPLE_VARIABLE_VALUE = "0"
_CONDITION_FIX = (
    "write an AMPS filter, e.g. <Condition>'{{AMPS_CLIENT_NAME}}' LIKE '^important'</Condition>"
)


def _sample_condition(text: str) -> tuple[str, Callable[[int], int]]:
    """``text`` with every ``{{VAR}}`` replaced by a sample value, and a function that maps
    an offset in the result back to ``text`` (for error columns)."""
    pieces: list[str] = []
    # (offset in the result, offset in text, True inside a replaced variable)
    marks: list[tuple[int, int, bool]] = [(0, 0, False)]
    out = 0
    last = 0
    for match in _ACTION_VARIABLE.finditer(text):
        pieces.append(text[last : match.start()])
        out += match.start() - last
        marks.append((out, match.start(), True))
        pieces.append(_SAMPLE_VARIABLE_VALUE)
        out += len(_SAMPLE_VARIABLE_VALUE)
        marks.append((out, match.end(), False))
        last = match.end()
    pieces.append(text[last:])

    def original(position: int) -> int:
        at, source, inside = next(m for m in reversed(marks) if m[0] <= position)
        return source if inside else source + position - at

    return "".join(pieces), original


def _check_condition(option: etree._Element, text: str, problems: _Problems) -> bool:
    """Whether an If Condition compiles once its ``{{VAR}}`` are filled in."""
    sample, original = _sample_condition(text)
    try:
        compile_filter(sample)
    except FilterError as exc:
        raw = option.text or ""
        lead = len(raw) - len(raw.lstrip())
        position = original(exc.position)
        line = (_line(option) or 1) + raw.count("\n", 0, lead + position)
        column = position - (text.rfind("\n", 0, position) + 1) + 1
        problems.add(
            option,
            f"Condition {_snippet(text)!r} is not a valid AMPS filter: {exc.problem} "
            f"(column {column})",
            (exc.hint + "; " if exc.hint else "") + _CONDITION_FIX,
            line=line,
        )
        return False
    return True


def _check_if_module(
    el: etree._Element,
    module: str,
    options: Mapping[str, str],
    option_els: Mapping[str, etree._Element],
    problems: _Problems,
) -> bool:
    """The checks of one If module beyond its required Options."""
    if module == "amps-action-if-condition":
        condition = options.get("Condition")
        return not condition or _check_condition(option_els["Condition"], condition, problems)
    ok = True
    if not options.get("GreaterThan") and not options.get("LessThan"):
        problems.add(
            el,
            f"{module} needs Options/GreaterThan or Options/LessThan (the usage, in percent, "
            "that makes the condition true)",
            "add e.g. <Options><Path>./</Path><GreaterThan>90%</GreaterThan></Options>",
        )
        ok = False
    for name in ("GreaterThan", "LessThan"):
        value = options.get(name)
        if value:
            try:
                parse_percent(value)
            except UnitError as exc:
                problems.add(
                    option_els[name],
                    f"Options/{name}: {exc}",
                    "write a percentage of the file system's size, such as 90%",
                )
                ok = False
    return ok


def _build_action_module(
    el: etree._Element, known: Mapping[str, tuple[str, ...]], kind: str, problems: _Problems
) -> ActionModule | None:
    """One ``On``, ``If`` or ``Do`` (``kind``) of an Action, whose module must be one of
    ``known`` with the Options it requires; None (and problems) when wrong."""
    module_el = _first(el, "Module")
    module = _text(module_el, problems)
    if module_el is None or not module:
        return None
    options: dict[str, str] = {}
    option_els: dict[str, etree._Element] = {}
    options_el = _first(el, "Options")
    for option in _child_elements(options_el) if options_el is not None else []:
        options[str(option.tag)] = (option.text or "").strip()
        option_els[str(option.tag)] = option
    if module not in known:
        problems.add(
            module_el,
            f"{kind} module {module!r} is unknown",
            f"use one of {', '.join(sorted(known))}",
        )
        return None
    ok = _check_required_options(el, module, known[module], options, problems)
    ok = _check_option_values(el, options, problems) and ok
    if kind == "If":
        ok = _check_if_module(el, module, options, option_els, problems) and ok
    ok = _check_on_module(el, module, options, problems) and ok
    return ActionModule(module, options, _line(el) or 0) if ok else None


#: what to add after "add <Options><X>...</X></Options>" for a required option X
_OPTION_HINTS: Final[Mapping[str, str]] = {
    "Every": ", e.g. 30s",
    "Age": ", e.g. 30s or 7d",
    "Path": ", e.g. ./ (the file system holding that path is checked)",
}


def _check_required_options(
    el: etree._Element,
    module: str,
    required: tuple[str, ...],
    options: Mapping[str, str],
    problems: _Problems,
) -> bool:
    """Whether every Option ``module`` requires is given (a problem for each that is not)."""
    ok = True
    for name in required:
        if not options.get(name):
            if name == "Condition":
                hint = (
                    " with an AMPS filter (AMPS calls this option Condition, not Expression)"
                    if "Expression" in options
                    else " with an AMPS filter, e.g. '{{AMPS_CLIENT_NAME}}' LIKE '^important'"
                )
            else:
                hint = _OPTION_HINTS.get(name, "")
            problems.add(
                el,
                f"{module} needs Options/{name}",
                f"add <Options><{name}>...</{name}></Options>{hint}",
            )
            ok = False
    return ok


def _check_option_values(
    el: etree._Element, options: Mapping[str, str], problems: _Problems
) -> bool:
    """Whether the Age and GracePeriod durations and MinimumSyncDestinations (a whole
    number) are valid where given."""
    ok = True
    for name in ("Age", "GracePeriod"):
        value = options.get(name)
        if value:
            try:
                parse_duration(value)
            except UnitError as exc:
                problems.add(el, f"Options/{name}: {exc}", "write a duration such as 30s or 5m")
                ok = False
    minimum = options.get("MinimumSyncDestinations")
    if minimum is not None and not (minimum.isascii() and minimum.isdigit()):
        problems.add(
            el,
            f"Options/MinimumSyncDestinations {minimum!r} is not a whole number",
            "write how many sync destinations must stay sync, e.g. 1",
        )
        ok = False
    return ok


def _check_on_module(
    el: etree._Element, module: str, options: Mapping[str, str], problems: _Problems
) -> bool:
    """The checks of the schedule and signal On modules: Every parses, and Signal is one
    an action may use."""
    ok = True
    if module == "amps-action-on-schedule" and options.get("Every"):
        from amps_py.schedule import ScheduleError, parse_every

        try:
            parse_every(options["Every"])
        except ScheduleError as exc:
            problems.add(el, str(exc), "e.g. <Every>30s</Every> or <Every>Monday at 17:47</Every>")
            ok = False
    if module == "amps-action-on-signal" and options.get("Signal") not in (
        None,
        "",
        "SIGUSR1",
        "SIGUSR2",
        "SIGHUP",
    ):
        problems.add(
            el,
            f"Signal {options['Signal']!r} cannot start an action (SIGINT and SIGTERM stop "
            "the instance, SIGQUIT is reserved)",
            "use SIGUSR1, SIGUSR2 or SIGHUP",
        )
        ok = False
    return ok


def _build_actions(root: etree._Element, problems: _Problems) -> tuple[ActionConfig, ...]:
    out: list[ActionConfig] = []
    for action in _children(_first(root, "Actions"), "Action"):
        built: dict[str, list[ActionModule | None]] = {}
        for kind, known in (
            ("On", ACTION_ON_MODULES),
            ("If", ACTION_IF_MODULES),
            ("Do", ACTION_DO_MODULES),
        ):
            built[kind] = [
                _build_action_module(el, known, kind, problems) for el in _children(action, kind)
            ]
        ons, ifs, dos = (
            tuple(m for m in built[kind] if m is not None) for kind in ("On", "If", "Do")
        )
        if ons and dos and all(None not in modules for modules in built.values()):
            out.append(ActionConfig(ons, dos, _line(action) or 0, ifs))
    return tuple(out)
