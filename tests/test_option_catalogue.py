"""The option catalogue (amps_py.server.option_catalogue): implemented options pass,
advisory ones pass where AMPS documents them, everything else is refused naming it."""

from __future__ import annotations

import pytest

from amps_py import reasons
from amps_py.protocol.server.commands import CommandFailed, options
from amps_py.server.option_catalogue import ADVISORY, IMPLEMENTED, REFUSED, check_options

COMMANDS = sorted(IMPLEMENTED)


@pytest.mark.parametrize("command", COMMANDS)
def test_implemented_options_pass(command: str) -> None:
    check_options(command, dict.fromkeys(IMPLEMENTED[command], ""))


def test_advisory_options_pass_where_documented_only() -> None:
    check_options("subscribe", {"live": ""})
    check_options("sow_and_delta_subscribe", {"no_empties": "", "send_keys": ""})
    with pytest.raises(CommandFailed):
        check_options("subscribe", {"no_empties": ""})
    with pytest.raises(CommandFailed):
        check_options("sow", {"live": ""})


@pytest.mark.parametrize("command", COMMANDS)
def test_an_unknown_option_is_refused_naming_it(command: str) -> None:
    with pytest.raises(CommandFailed) as caught:
        check_options(command, options({"o": f"{sorted(IMPLEMENTED[command])[0]},frobnicate=3"}))
    assert caught.value.reason == reasons.INVALID_OPTIONS
    assert "'frobnicate'" in caught.value.detail and command in caught.value.detail


@pytest.mark.parametrize(
    ("command", "name", "feature"),
    [
        ("subscribe", "projection", "aggregated"),
        ("subscribe", "grouping", "aggregated"),
        ("subscribe", "rate", "rate"),
        ("subscribe", "pause", "paused"),
        ("delta_subscribe", "select", "select lists"),
        ("sow", "conflation", "conflation of a query"),
        ("sow_and_subscribe", "skip_n", "paginated"),
        ("sow", "no_sowkey", "SOW key"),
    ],
)
def test_amps_options_not_implemented_are_refused_naming_the_feature(
    command: str, name: str, feature: str
) -> None:
    with pytest.raises(CommandFailed) as caught:
        check_options(command, {name: "1"})
    assert caught.value.reason == reasons.INVALID_OPTIONS
    assert f"{name!r}" in caught.value.detail and feature in caught.value.detail


def test_the_tables_do_not_overlap() -> None:
    for command, names in IMPLEMENTED.items():
        for name in names:
            assert command not in ADVISORY.get(name, ((), ""))[0], (command, name)
    # a refused name is implemented somewhere only when its refusal says where
    for name in REFUSED:
        users = [c for c, names in IMPLEMENTED.items() if name in names]
        assert not users or "works on" in REFUSED[name], name


def test_commands_without_options_are_not_checked() -> None:
    check_options("heartbeat", {"start": "", "30": ""})
