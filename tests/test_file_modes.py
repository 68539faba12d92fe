"""Password, key and rules files that other users may read or change are warned about
by ``amps-py config check`` (exit status 0) and in the log when the instance starts
(``00-0020``), naming the file, its mode and the chmod that fixes it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from harness import ServerProcess, wait_until, write_config

from amps_py import auth
from amps_py.config import load_config, security_warnings
from amps_py.config.file_modes import file_mode_warnings

REPO = Path(__file__).resolve().parent.parent
SECURE = REPO / "config" / "examples" / "secure"


def users_file(tmp_path: Path, mode: int) -> Path:
    path = tmp_path / "users.pw"
    auth.PasswordFile(str(path)).with_user("alice", "example-only-pw").save()
    path.chmod(mode)
    return path


def auth_xml(users: Path) -> str:
    return (
        "<Authentication><Module>amps-password-file</Module><Options>"
        f"<PasswordFile>{users}</PasswordFile></Options></Authentication>"
    )


def config_check(path: Path) -> subprocess.CompletedProcess[str]:
    res = subprocess.run(
        [sys.executable, "-m", "amps_py", "config", "check", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert res.returncode == 0 and ": OK" in res.stdout, res.stdout + res.stderr
    return res


@pytest.mark.parametrize(
    ("mode", "who"),
    [
        (0o644, "its group and every other user may read it"),
        (0o666, "its group and every other user may read and change it"),
        (0o640, "its group may read it"),
        (0o604, "every other user may read it"),
        (0o600, None),
        (0o400, None),
    ],
)
def test_config_check_warns_about_a_password_file_others_may_read(
    tmp_path: Path, mode: int, who: str | None
) -> None:
    users = users_file(tmp_path, mode)
    path = write_config(tmp_path, "A", 0, extra=auth_xml(users))
    res = config_check(path)
    if who is None:
        assert res.stderr == "", res.stderr
        return
    lines = res.stderr.splitlines()
    assert len(lines) == 1, res.stderr
    assert lines[0].startswith(f"{path}: warning: PasswordFile of AMPSConfig/Authentication "), (
        lines[0]
    )
    assert f"{users} has mode {mode:04o}: {who}" in lines[0], lines[0]
    assert f"Fix: chmod 600 {users}" in lines[0], lines[0]


def test_key_and_rules_files(tmp_path: Path) -> None:
    """The secure example copied: its key and password file at 0644 (as git checks them
    out) are warned about; its rules file only once others may change it."""
    for name in ("secure.xml", "server.pem", "server-key.pem", "users.pw", "entitlements.json"):
        (tmp_path / name).write_bytes((SECURE / name).read_bytes())
        (tmp_path / name).chmod(0o644)
    config = load_config(tmp_path / "secure.xml", environ={})
    warnings = file_mode_warnings(config)
    assert [w.split(" has mode")[0] for w in warnings] == [
        f"PasswordFile of AMPSConfig/Authentication {tmp_path / 'users.pw'}",
        f"PrivateKey of transport json-tls {tmp_path / 'server-key.pem'}",
    ], warnings
    (tmp_path / "entitlements.json").chmod(0o666)
    (tmp_path / "users.pw").chmod(0o600)
    (tmp_path / "server-key.pem").chmod(0o600)
    warnings = security_warnings(config)
    assert len(warnings) == 1, warnings
    rules = tmp_path / "entitlements.json"
    assert warnings[0].startswith(f"RulesFile of AMPSConfig/Entitlement {rules} has mode 0666")
    assert (
        f"may change it, and so grant any user any right. Fix: chmod 644 {rules}" in (warnings[0])
    )
    (tmp_path / "entitlements.json").chmod(0o644)
    assert security_warnings(config) == []


def test_a_replication_link_password_file_is_a_secret(tmp_path: Path) -> None:
    secret = tmp_path / "replication.secret"
    secret.write_text("example-only\n")
    secret.chmod(0o644)
    users = users_file(tmp_path, 0o600)
    replication = (
        "<Transport><Name>repl</Name><Type>amps-replication</Type>"
        f"<InetAddr>127.0.0.1:0</InetAddr>{auth_xml(users)}</Transport>"
    )
    extra = (
        "<Replication><Destination><Name>B</Name><SyncType>async</SyncType>"
        "<Topic><Name>.*</Name><MessageType>json</MessageType></Topic>"
        "<Transport><Type>amps-replication</Type><InetAddr>127.0.0.1:1</InetAddr>"
        "<Authenticator><Module>amps-password-authenticator</Module><Options>"
        f"<Username>repl</Username><PasswordFile>{secret}</PasswordFile></Options>"
        "</Authenticator></Transport></Destination></Replication>"
    )
    path = write_config(tmp_path, "A", 0, extra_transport=replication, extra=extra)
    warnings = file_mode_warnings(load_config(path))
    assert len(warnings) == 1, warnings
    assert warnings[0].startswith(f"PasswordFile of Destination B's Authenticator {secret}")
    assert f"Fix: chmod 600 {secret}" in warnings[0]


async def test_start_up_logs_the_warning(tmp_path: Path) -> None:
    users = users_file(tmp_path, 0o644)
    path = write_config(tmp_path, "A", 0, extra=auth_xml(users))
    server = ServerProcess(path, tmp_path, 0, "A")
    server.start()
    try:

        def warned() -> str | None:
            text = server.log_file.read_text()
            return None if "00-0020" in text else "no 00-0020 warning in the log yet"

        await wait_until(warned, 60)
        (line,) = [ln for ln in server.log_file.read_text().splitlines() if "00-0020" in ln]
        assert " warning: 00-0020 PasswordFile of AMPSConfig/Authentication " in line, line
        assert f"Fix: chmod 600 {users}" in line, line
        assert json.loads(server.ready_file.read_text())["name"] == "A"
    finally:
        assert server.stop() == 0, server.tail()


def test_an_unauthenticated_admin_api_beyond_this_machine_is_warned_about(
    tmp_path: Path,
) -> None:
    def config_with(admin: str, auth_xml: str = "") -> Path:
        path = tmp_path / "admin.xml"
        path.write_text(
            "<AMPSConfig><Name>a</Name><Transports><Transport><Name>t</Name><Type>tcp</Type>"
            "<InetAddr>127.0.0.1:0</InetAddr><Protocol>amps</Protocol>"
            "<MessageType>json</MessageType></Transport></Transports>"
            f"{auth_xml}<Admin><InetAddr>{admin}</InetAddr></Admin></AMPSConfig>"
        )
        return path

    warnings = security_warnings(load_config(config_with("0.0.0.0:8085")))
    assert len(warnings) == 1 and warnings[0].startswith(
        "the admin API listens on 0.0.0.0:8085 (beyond this machine) without authentication"
    ), warnings
    assert "set Admin/InetAddr to 127.0.0.1:PORT" in warnings[0]
    assert security_warnings(load_config(config_with("127.0.0.1:8085"))) == []
    users = tmp_path / "users.pw"
    users.write_text("")
    users.chmod(0o600)
    secured = config_with(
        "0.0.0.0:8085",
        "<Authentication><Module>amps-password-file</Module><Options>"
        f"<PasswordFile>{users}</PasswordFile></Options></Authentication>",
    )
    assert security_warnings(load_config(secured)) == []
