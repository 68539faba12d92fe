"""Authentication (amps-password-file) and entitlement (amps-rule-entitlement).

The password file is written by the real ``amps-py users`` CLI, the instance runs as a
real process (tests/harness.py), and clients speak the wire protocol over TCP.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import trio
from harness import ServerProcess, start_instance, wait_until, write_config

from amps_py import auth, events
from amps_py.client import CommandError, open_client
from amps_py.config import ConfigError, load_config
from amps_py.protocol import FrameDecoder, encode_frame

PASSWORD = "correct-horse-Battery-9"  # a test credential, grepped for in the logs


def users_cli(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "amps_py", "users", *args],
        input=stdin,
        capture_output=True,
        text=True,
        check=False,
    )


def auth_xml(password_file: Path) -> str:
    return (
        "<Authentication><Module>amps-password-file</Module>"
        f"<Options><PasswordFile>{password_file}</PasswordFile></Options></Authentication>"
    )


def rules_xml(rules_file: Path) -> str:
    return (
        "<Entitlement><Module>amps-rule-entitlement</Module>"
        f"<Options><RulesFile>{rules_file}</RulesFile></Options></Entitlement>"
    )


@pytest.fixture
def password_file(tmp_path: Path) -> Path:
    path = tmp_path / "users.pw"
    done = users_cli("add", str(path), "alice", "--password-stdin", stdin=PASSWORD + "\n")
    assert done.returncode == 0, done.stderr
    return path


@pytest.fixture
def secured(tmp_path: Path, password_file: Path) -> Iterator[ServerProcess]:
    server = start_instance(tmp_path, "secured", extra=auth_xml(password_file))
    try:
        yield server
    finally:
        if server.alive:
            server.stop()


async def raw_logon(server: ServerProcess, header: dict[str, Any]) -> list[dict[str, Any]]:
    """Send one logon frame; return every frame received until the server closes."""
    stream = await trio.open_tcp_stream("127.0.0.1", server.port)
    decoder = FrameDecoder(1024 * 1024)
    frames: list[dict[str, Any]] = []
    async with stream:
        await stream.send_all(encode_frame(header))
        with trio.fail_after(60):  # the server must close the connection by itself
            while data := await stream.receive_some(65536):
                decoder.receive_data(data)
                frames.extend(f.header for f in decoder.frames())
    return frames


def log_text(server: ServerProcess) -> str:
    return "".join(
        f.read_text(errors="replace") for f in (server.log_file, server.output) if f.exists()
    )


# --------------------------------------------------------------------- pure functions


def test_hash_and_verify() -> None:
    encoded = auth.hash_password("pw", n=2**4)
    assert encoded.startswith("scrypt$16$8$1$")
    assert auth.verify_password("pw", encoded)
    assert not auth.verify_password("pW", encoded)
    assert not auth.verify_password("pw", "scrypt$16$8$1$not-base64$x")


def test_password_file_errors_name_the_line(tmp_path: Path) -> None:
    good = auth.hash_password("x", n=2**4)
    path = tmp_path / "p"
    path.write_text(f"# users\nalice:{good}\n\nbob:plain-text\n")
    with pytest.raises(auth.AuthFileError) as info:
        auth.PasswordFile.load(path)
    assert info.value.line == 4 and "bob" in info.value.message
    path.write_text(f"alice:{good}\nalice:{good}\n")
    with pytest.raises(auth.AuthFileError, match="listed twice"):
        auth.PasswordFile.load(path)


@pytest.mark.parametrize(
    ("load", "noun"),
    [(auth.PasswordFile.load, "password file"), (auth.EntitlementRules.load, "rules file")],
)
def test_unreadable_auth_files_name_the_file_and_the_fix(
    tmp_path: Path, load: Callable[[Path], object], noun: str
) -> None:
    absent = tmp_path / "absent"
    with pytest.raises(auth.AuthFileError) as info:
        load(absent)
    assert info.value.path == str(absent) and info.value.line is None
    assert info.value.message == f"the {noun} does not exist"
    assert "correct the path" in info.value.fix
    latin1 = tmp_path / "latin1"
    latin1.write_bytes(b"caf\xe9\n")
    with pytest.raises(auth.AuthFileError) as info:
        load(latin1)
    assert str(info.value).startswith(f"{latin1}: the {noun} is not UTF-8 text. Fix: ")
    with pytest.raises(auth.AuthFileError) as info:
        load(tmp_path)  # a directory
    assert info.value.message.startswith(f"the {noun} cannot be read: ")


def test_rules_file() -> None:
    rules = auth.EntitlementRules.parse(
        json.dumps({"alice": {"read": "orders|prices", "write": "orders"}, "*": {"read": "pub"}})
    )
    entitler = auth.RuleEntitler(rules)
    assert entitler.can_write("alice", "orders") and not entitler.can_write("alice", "orders2")
    assert entitler.can_read("bob", "pub") and not entitler.can_write("bob", "pub")
    assert not entitler.is_admin("alice")
    with pytest.raises(auth.AuthFileError, match="unknown key"):
        auth.EntitlementRules.parse('{\n"alice": {"reed": ".*"}\n}')


# ------------------------------------------------------------------------ CLI


def test_users_cli_round_trip(tmp_path: Path) -> None:
    path = tmp_path / "u.pw"
    for user, pw in (("alice", "a-pw"), ("bob", "b-pw")):
        done = users_cli("add", str(path), user, "--password-stdin", stdin=pw + "\n")
        assert done.returncode == 0, done.stderr
    listed = users_cli("list", str(path))
    assert listed.returncode == 0
    assert listed.stdout.split() == ["alice", "bob"]
    assert "scrypt" not in listed.stdout
    assert (path.stat().st_mode & 0o777) == 0o600
    assert auth.PasswordFile.load(path).verify("bob", "b-pw")
    removed = users_cli("remove", str(path), "bob")
    assert removed.returncode == 0, removed.stderr
    assert users_cli("list", str(path)).stdout.split() == ["alice"]
    missing = users_cli("remove", str(path), "bob")
    assert missing.returncode != 0 and "no user 'bob'" in missing.stderr


# ---------------------------------------------------------------------- config


def test_config_missing_password_file(tmp_path: Path) -> None:
    cfg = write_config(tmp_path, "c", 0, extra=auth_xml(tmp_path / "absent.pw"))
    with pytest.raises(ConfigError) as info:
        load_config(cfg)
    (problem,) = info.value.problems
    assert problem.file == str(cfg)
    assert (
        problem.line
        == cfg.read_text()
        .splitlines()
        .index(next(line for line in cfg.read_text().splitlines() if "absent.pw" in line))
        + 1
    )
    assert "does not exist" in problem.message
    assert "amps-py users add" in problem.fix


def test_config_malformed_password_file(tmp_path: Path) -> None:
    bad = tmp_path / "bad.pw"
    bad.write_text("alice:scrypt$16$8$1$AAAA$\n")
    cfg = write_config(tmp_path, "c", 0, extra=auth_xml(bad))
    with pytest.raises(ConfigError) as info:
        load_config(cfg)
    assert f"{bad}:1" in str(info.value)


def test_config_unknown_module(tmp_path: Path) -> None:
    cfg = write_config(
        tmp_path,
        "c",
        0,
        extra="<Authentication><Module>amps-pasword-file</Module></Authentication>\n"
        "  <Entitlement><Module>ldap</Module></Entitlement>",
    )
    with pytest.raises(ConfigError) as info:
        load_config(cfg)
    text = str(info.value)
    assert "'amps-pasword-file' is not a valid Module; did you mean 'amps-password-file'" in text
    assert "'ldap' is not a valid Module" in text
    assert "amps-default-entitlement-module, amps-rule-entitlement" in text
    assert len(info.value.problems) == 2


# ---------------------------------------------------------------------- logon


async def test_right_password_logs_on(secured: ServerProcess) -> None:
    async with open_client(secured.uri, "c1", user_id="alice", pw=PASSWORD) as client:
        assert client.logon_ack["status"] == "success"
        assert "reason" not in client.logon_ack
        await client.publish_persisted("orders", b'{"a":1}')


@pytest.mark.parametrize(
    ("user", "password", "acks"),
    [
        ("alice", "wrong-password-123", "processed"),
        ("mallory", PASSWORD, "processed"),
        ("alice", "wrong-password-456", None),  # no ack asked for: the failure is sent anyway
    ],
)
async def test_bad_credentials_are_refused_and_closed(
    secured: ServerProcess, user: str, password: str, acks: str | None
) -> None:
    header: dict[str, Any] = {"c": "logon", "client_name": f"c-{user}", "user_id": user}
    header["pw"] = password
    if acks:
        header["a"] = acks
        header["cid"] = "1"
    frames = await raw_logon(secured, header)
    assert [(f["c"], f["status"], f["reason"]) for f in frames] == [
        ("ack", "failure", "auth failure")
    ]

    def logged() -> str | None:
        lines = [ln for ln in log_text(secured).splitlines() if events.CLIENT_AUTH_FAILED in ln]
        if not any(repr(user) in ln for ln in lines):
            return f"no {events.CLIENT_AUTH_FAILED} line for user {user!r}"
        return None

    await wait_until(logged, 60)
    assert password not in log_text(secured)


async def test_password_never_logged(secured: ServerProcess) -> None:
    async with open_client(secured.uri, "ok", user_id="alice", pw=PASSWORD):
        pass
    with pytest.raises(CommandError) as info:
        async with open_client(secured.uri, "bad", user_id="alice", pw=PASSWORD + "x"):
            pass
    assert info.value.reason == "auth failure"
    await wait_until(
        lambda: None if "disconnected: auth" in log_text(secured) else "no disconnect line", 60
    )
    text = log_text(secured)
    assert "'alice'" in text
    assert PASSWORD not in text


# ----------------------------------------------------------------- entitlement


async def test_entitlement_denials_keep_the_connection(tmp_path: Path) -> None:
    rules = tmp_path / "rules.json"
    rules.write_text(json.dumps({"alice": {"read": "orders|public", "write": "orders"}}))
    server = start_instance(tmp_path, "ent", extra=rules_xml(rules))
    try:
        async with open_client(server.uri, "c1", user_id="alice") as client:
            assert client.logon_ack["reason"] == "authentication disabled"
            with pytest.raises(CommandError) as info:
                await client.command({"c": "publish", "t": "secret", "a": "processed"}, b"{}")
            assert info.value.reason == "not entitled"
            with pytest.raises(CommandError) as info:
                async with client.subscribe("secret"):
                    pass
            assert info.value.reason == "not entitled"
            # still connected, and allowed topics work
            async with client.subscribe("orders") as sub:
                await client.publish_persisted("orders", b'{"ok":1}')
                assert (await sub.get(10)).json() == {"ok": 1}

        async with open_client(server.uri, "c2", user_id="nobody") as other:
            with pytest.raises(CommandError) as info:
                await other.command({"c": "publish", "t": "orders", "a": "processed"}, b"{}")
            assert info.value.reason == "not entitled"

        def counted() -> str | None:
            stats = server.statistics()
            if stats.get("denied_writes") != 2 or stats.get("denied_commands") != 3:
                return f"denied counters are {stats.get('denied_writes')}, " + str(
                    stats.get("denied_commands")
                )
            return None

        await wait_until(counted, 60)
        assert events.CLIENT_NOT_ENTITLED in log_text(server)
    finally:
        server.stop()
