"""The failure-reason catalogue (:mod:`amps_py.reasons`): AMPS's spellings stay as they
are, and no failure is raised with a reason spelled outside the catalogue.

``tests/test_wire_clients.py`` checks the same ack spellings on the wire, literally on
purpose: the spelling is the contract with client libraries, so it is pinned there and
here independently of the catalogue that produces it.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from amps_py import reasons

ROOT = Path(__file__).resolve().parent.parent

#: the ack reasons AMPS clients match on, as AMPS spells them
AMPS_SPELLINGS = {
    "UNKNOWN_COMMAND": "unknown command",
    "LOGON_REQUIRED": "logon required",
    "AUTH_FAILURE": "auth failure",
    "NAME_IN_USE": "name in use",
    "NOT_ENTITLED": "not entitled",
    "INVALID_OPTIONS": "invalid options",
    "NO_TOPIC": "no topic",
    "INVALID_TOPIC": "invalid topic",
    "BAD_REGEX_TOPIC": "bad regex topic",
    "BAD_FILTER": "bad filter",
    "SUBID_IN_USE": "subid in use",
    "INVALID_BOOKMARK": "invalid bookmark",
    "BOOKMARK_NOT_FOUND": "bookmark not found",
}


def _catalogue() -> dict[str, str]:
    return {
        name: value
        for name, value in vars(reasons).items()
        if name.isupper() and isinstance(value, str)
    }


def test_ack_reasons_keep_amps_spellings() -> None:
    catalogue = _catalogue()
    assert {name: catalogue.get(name) for name in AMPS_SPELLINGS} == AMPS_SPELLINGS


def test_every_reason_has_one_name_and_a_short_stable_form() -> None:
    catalogue = _catalogue()
    by_value: dict[str, list[str]] = {}
    for name, value in catalogue.items():
        by_value.setdefault(value, []).append(name)
        assert value == value.strip().lower() and 0 < len(value) <= 40, (name, value)
    shared = {value: names for value, names in by_value.items() if len(names) > 1}
    assert not shared, f"one reason under several names: {shared}"


#: calls whose first argument is a failure reason (``check_field_size``: the third)
_REASON_ARGUMENT = {
    "CommandFailed": 0,
    "Disconnect": 0,
    "LinkError": 0,
    "RemoteProtocolError": 0,
    "LocalProtocolError": 0,
    "RefusedByPeer": 0,
    "refuse": 0,
    "subscription_failed": 2,
    "publishes_failed": 1,
    "_fail_publishes": 1,
    "check_field_size": 2,
}


def _literal_reasons(path: Path, root: Path = ROOT) -> list[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        name = func.id if isinstance(func, ast.Name) else getattr(func, "attr", "")
        index = _REASON_ARGUMENT.get(name)
        if index is None or len(node.args) <= index:
            continue
        arg = node.args[index]
        if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
            found.append(f"{path.relative_to(root)}:{node.lineno} {name}({arg.value!r}, ...)")
    return found


@pytest.mark.parametrize(
    "package",
    [
        "amps_py/server",
        "amps_py/protocol",  # (the server's command and logon rules: protocol/server/)
        "amps_py/replication",
        "amps_py/filters",
        "amps_py/admin",
    ],
)
def test_failures_take_their_reason_from_the_catalogue(package: str) -> None:
    spelled_here = [
        hit for path in sorted((ROOT / package).rglob("*.py")) for hit in _literal_reasons(path)
    ]
    assert not spelled_here, (
        "failure reasons spelled outside amps_py/reasons.py (add a name there and use "
        "it):\n" + "\n".join(spelled_here)
    )


def test_the_guard_sees_a_literal_reason(tmp_path: Path) -> None:
    source = tmp_path / "mod.py"
    source.write_text(
        "raise CommandFailed('bad filter', 'x')\n"
        "raise CommandFailed(reasons.BAD_FILTER, 'x')\n"
        "session.subscription_failed(sub, cid, 'journal corrupt', 'x')\n"
    )
    hits = [hit.split(" ", 1)[1] for hit in _literal_reasons(source, tmp_path)]
    assert hits == [
        "CommandFailed('bad filter', ...)",
        "subscription_failed('journal corrupt', ...)",
    ]
