"""``Logging``: the log targets (stdout, stderr, files), their levels and filters."""

from __future__ import annotations

import re

from lxml import etree

from amps_py.config.model import LOG_LEVELS, LogTarget
from amps_py.config.problems import _Problems
from amps_py.config.values import _bytes_value, _text
from amps_py.config.xmltree import _children, _closest, _first, _one_of, _split_list


def _check_code_patterns(el: etree._Element | None, problems: _Problems) -> str | None:
    text = _text(el, problems)
    if el is None or text is None:
        return None
    for item in _split_list(text):
        try:
            re.compile(item)
        except re.error as exc:
            problems.add(
                el,
                f"{el.tag} entry {item!r} is not a valid regular expression: {exc.msg}",
                "list event codes separated by commas (e.g. 00-0001,12-1.*); "
                "each entry is a code or a regular expression",
            )
            return None
    return text


def _build_logging(root: etree._Element, problems: _Problems) -> tuple[LogTarget, ...]:
    targets: list[LogTarget] = []
    for target in _children(_first(root, "Logging"), "Target"):
        built = _build_log_target(target, problems)
        if built is not None:
            targets.append(built)
    return tuple(targets)


def _build_log_target(target: etree._Element, problems: _Problems) -> LogTarget | None:
    """One ``Logging/Target``; None (and problems) when wrong."""
    protocol = _text(_first(target, "Protocol"), problems)
    level_el = _first(target, "Level")
    levels_el = _first(target, "Levels")
    level = _text(level_el, problems) if level_el is not None else None
    ok = level_el is None or level is not None
    if level is None and level_el is None:
        level = "none" if levels_el is not None else "info"
    levels = _log_levels(levels_el, problems)

    file_el = _first(target, "FileName")
    file_name = _text(file_el, problems)
    rotation_el = _first(target, "RotationThreshold")
    rotation = _bytes_value(rotation_el, problems) if rotation_el is not None else None
    ok &= rotation_el is None or rotation is not None
    include = _check_code_patterns(_first(target, "IncludeErrors"), problems)
    exclude = _check_code_patterns(_first(target, "ExcludeErrors"), problems)
    ok &= include is not None or _first(target, "IncludeErrors") is None
    ok &= exclude is not None or _first(target, "ExcludeErrors") is None
    ok = _check_file_options(target, protocol, file_el, file_name, rotation_el, problems) and ok

    if not ok or levels is None or protocol is None or level is None:
        return None
    return LogTarget(
        protocol=protocol,
        level=level,
        levels=levels,
        file_name=file_name if protocol == "file" else None,
        rotation_threshold=rotation,
        include_errors=include,
        exclude_errors=exclude,
    )


def _log_levels(levels_el: etree._Element | None, problems: _Problems) -> tuple[str, ...] | None:
    """The Levels list without duplicates (empty when not given); None (and a problem)
    when it names something that is not a log level."""
    levels_text = _text(levels_el, problems)
    if levels_el is None or not levels_text:
        return ()
    named = _split_list(levels_text)
    valid = [lvl for lvl in LOG_LEVELS if lvl != "none"]
    bad = [lvl for lvl in named if lvl not in valid]
    if bad:
        close = _closest(bad[0], valid)
        suggestion = f"; did you mean {close!r}?" if close else ""
        problems.add(
            levels_el,
            f"{bad[0]!r} in Levels is not a log level{suggestion}",
            f"list levels separated by commas, from: {_one_of(valid)}",
        )
        return None
    return tuple(dict.fromkeys(named))


def _check_file_options(
    target: etree._Element,
    protocol: str | None,
    file_el: etree._Element | None,
    file_name: str | None,
    rotation_el: etree._Element | None,
    problems: _Problems,
) -> bool:
    """Whether FileName and RotationThreshold suit the Protocol: a file target needs a
    FileName (with %n when it rotates); stdout and stderr take neither."""
    ok = True
    if protocol == "file" and file_el is None:
        problems.add(
            target,
            "a log target with Protocol file needs a <FileName>",
            "add e.g. <FileName>./logs/amps-%Y%m%d-%n.log</FileName> inside this <Target>",
        )
        ok = False
    if protocol in ("stdout", "stderr"):
        for el in (file_el, rotation_el):
            if el is not None:
                problems.add(
                    el,
                    f"<{el.tag}> only applies to targets with Protocol file, "
                    f"and this target writes to {protocol}",
                    f"remove <{el.tag}>, or set <Protocol>file</Protocol>",
                )
                ok = False
    if protocol == "file" and rotation_el is not None and file_name and "%n" not in file_name:
        problems.add(
            rotation_el,
            "RotationThreshold is set but FileName has no %n rotation counter, "
            "so a rotated file would overwrite the previous one",
            "add %n to FileName, e.g. ./logs/amps-%n.log",
        )
        ok = False
    return ok
