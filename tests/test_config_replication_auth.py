"""``Replication/Destination/Transport/Authenticator``: parsing, and the problems a bad
one gets (each with file:line and a fix, never with the password in it)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from amps_py.config import (
    ConfigError,
    LinkAuthenticator,
    LinkCredentialsError,
    parse_config,
)

SECRET = "s3cret-Do-Not-Log"

#: A valid instance up to the Authenticator; the Authenticator opens on line 16.
PRELUDE = [
    "<AMPSConfig>",  # 1
    "  <Name>amps-a</Name>",  # 2
    "  <TransactionLog>",  # 3
    "    <JournalDirectory>./data</JournalDirectory>",  # 4
    "    <Topic><Name>.*</Name><MessageType>json</MessageType></Topic>",  # 5
    "  </TransactionLog>",  # 6
    "  <Transports>",  # 7
    "    <Transport><Name>json-tcp</Name><Type>tcp</Type>"
    "<InetAddr>127.0.0.1:9107</InetAddr></Transport>",  # 8
    "  </Transports>",  # 9
    "  <Replication>",  # 10
    "    <Destination>",  # 11
    "      <Name>amps-b</Name><SyncType>sync</SyncType>",  # 12
    "      <Topic><Name>.*</Name><MessageType>json</MessageType></Topic>",  # 13
    "      <Transport><Type>amps-replication</Type>",  # 14
    "        <InetAddr>127.0.0.1:9204</InetAddr>",  # 15
]
AUTH_LINE = 16
END = ["      </Transport>", "    </Destination>", "  </Replication>", "</AMPSConfig>"]


def doc(module: str | None, *options: str, with_options: bool = True) -> str:
    """A config whose Destination Transport has an Authenticator with ``module`` and
    one ``options`` element per line (the first option is on line AUTH_LINE + 3)."""
    lines = ["        <Authenticator>"]  # 16
    if module is not None:
        lines.append(f"          <Module>{module}</Module>")  # 17
    if with_options:
        lines.append("          <Options>")  # 18
        lines.extend(f"            {o}" for o in options)  # 19...
        lines.append("          </Options>")
    lines.append("        </Authenticator>")
    return "\n".join([*PRELUDE, *lines, *END])


def problems(text: str, environ: dict[str, str] | None = None) -> list[str]:
    with pytest.raises(ConfigError) as info:
        parse_config(text, "amps.xml", environ=environ or {})
    return [str(p) for p in info.value.problems]


def authenticator(text: str, environ: dict[str, str] | None = None) -> LinkAuthenticator | None:
    config = parse_config(text, "amps.xml", environ=environ or {})
    return config.replication[0].authenticator


# ----------------------------------------------------------------------------- valid


def test_no_authenticator_is_none() -> None:
    text = "\n".join([*PRELUDE, *END])
    assert authenticator(text) is None


def test_default_module_sends_nothing() -> None:
    found = authenticator(doc("amps-default-authenticator", with_options=False))
    assert found == LinkAuthenticator("amps-default-authenticator")
    assert found is not None and found.credentials() is None


def test_literal_password_with_substitution_and_hidden_repr() -> None:
    text = doc(
        "amps-password-authenticator",
        "<Username>repl</Username>",
        "<Password>${REPL_PW}</Password>",
    )
    found = authenticator(text, {"REPL_PW": SECRET})
    assert found is not None
    assert found.credentials() == ("repl", SECRET)
    assert SECRET not in repr(found)
    assert SECRET not in str(found)
    config = parse_config(text, "amps.xml", environ={"REPL_PW": SECRET})
    assert SECRET not in repr(config)
    assert "password='***'" in repr(found)


def test_password_file_first_line_read_at_each_call(tmp_path: Path) -> None:
    secret = tmp_path / "repl.secret"
    secret.write_text(SECRET + "\nsecond line ignored\n")
    found = authenticator(
        doc(
            "amps-password-authenticator",
            "<Username>repl</Username>",
            f"<PasswordFile>{secret}</PasswordFile>",
        )
    )
    assert found is not None and found.password_file == secret
    assert found.credentials() == ("repl", SECRET)
    secret.write_text("rotated\r\n")
    assert found.credentials() == ("repl", "rotated")
    secret.unlink()
    with pytest.raises(LinkCredentialsError, match="cannot be read"):
        found.credentials()
    assert SECRET not in repr(found)


def test_password_env_read_when_asked() -> None:
    found = authenticator(
        doc(
            "amps-password-authenticator",
            "<Username>repl</Username>",
            "<PasswordEnv>REPL_PW</PasswordEnv>",
        )
    )
    assert found is not None and found.password_env == "REPL_PW"
    assert found.credentials({"REPL_PW": SECRET}) == ("repl", SECRET)
    with pytest.raises(LinkCredentialsError, match="REPL_PW"):
        found.credentials({})


# ---------------------------------------------------------------------------- errors

CASES = [
    pytest.param(
        doc(None, "<Username>repl</Username>", f"<Password>{SECRET}</Password>"),
        "is missing the required element <Module>",
        AUTH_LINE,
        id="no-module",
    ),
    pytest.param(
        doc("amps-pasword-authenticator", with_options=False),
        "did you mean 'amps-password-authenticator'",
        AUTH_LINE + 1,
        id="misspelt-module",
    ),
    pytest.param(
        doc("amps-password-authenticator", with_options=False),
        "needs Options/Username",
        AUTH_LINE,
        id="password-module-without-options",
    ),
    pytest.param(
        doc("amps-password-authenticator", f"<Password>{SECRET}</Password>"),
        "needs Options/Username",
        AUTH_LINE + 2,
        id="no-username",
    ),
    pytest.param(
        doc("amps-password-authenticator", "<Username>repl</Username>"),
        "needs a password: one of Options/Password, Options/PasswordFile or Options/PasswordEnv",
        AUTH_LINE + 2,
        id="no-password-source",
    ),
    pytest.param(
        doc(
            "amps-password-authenticator",
            "<Username>repl</Username>",
            f"<Password>{SECRET}</Password>",
            "<PasswordEnv>REPL_PW</PasswordEnv>",
        ),
        "<PasswordEnv> is given as well as <Password> (line 20)",
        AUTH_LINE + 5,
        id="two-password-sources",
    ),
    pytest.param(
        doc(
            "amps-default-authenticator",
            "<Username>repl</Username>",
            f"<Password>{SECRET}</Password>",
        ),
        "<Username> is only used by the amps-password-authenticator and "
        "amps-default-authenticator-module modules",
        AUTH_LINE + 3,
        id="options-on-default-module",
    ),
    pytest.param(
        doc(
            "amps-password-authenticator",
            "<Username>repl user</Username>",
            f"<Password>{SECRET}</Password>",
        ),
        "Username 'repl user' contains whitespace or ':'",
        AUTH_LINE + 3,
        id="bad-username",
    ),
    pytest.param(
        doc(
            "amps-password-authenticator",
            "<Username>repl</Username>",
            "<PasswordEnv>${REPL_PW}</PasswordEnv>",
        ),
        "is not an environment variable name",
        AUTH_LINE + 4,
        id="password-env-holding-a-value",
    ),
    pytest.param(
        doc(
            "amps-password-authenticator",
            "<Username>repl</Username>",
            "<PasswordFile>/nonexistent/repl.secret</PasswordFile>",
        ),
        "Authenticator PasswordFile '/nonexistent/repl.secret' cannot be read",
        AUTH_LINE + 4,
        id="password-file-missing",
    ),
    pytest.param(
        doc(
            "amps-password-authenticator",
            "<Username>repl</Username>",
            "<Passwort>x</Passwort>",
        ),
        "did you mean Password",
        AUTH_LINE + 4,
        id="misspelt-option",
    ),
    pytest.param(
        doc(
            "amps-password-authenticator",
            "<Username>repl</Username>",
            "<Password></Password>",
        ),
        "<Password> is empty",
        AUTH_LINE + 4,
        id="empty-password",
    ),
]


@pytest.mark.parametrize(("text", "message", "line"), CASES)
def test_authenticator_problems(text: str, message: str, line: int) -> None:
    found = problems(text, {"REPL_PW": SECRET})
    matching = [p for p in found if message in p]
    assert matching, f"no problem says {message!r}; got {found}"
    assert matching[0].startswith(f"amps.xml:{line}: "), matching[0]
    assert " Fix: " in matching[0]
    assert all(SECRET not in p for p in found), found


def test_password_file_with_empty_first_line(tmp_path: Path) -> None:
    secret = tmp_path / "empty.secret"
    secret.write_text("\nnot-the-first-line\n")
    found = problems(
        doc(
            "amps-password-authenticator",
            "<Username>repl</Username>",
            f"<PasswordFile>{secret}</PasswordFile>",
        )
    )
    assert any("first line" in p and "is empty" in p for p in found), found
    assert all("not-the-first-line" not in p for p in found)


def test_authenticator_given_twice() -> None:
    text = doc("amps-default-authenticator", with_options=False).replace(
        "</Authenticator>",
        "</Authenticator><Authenticator><Module>amps-default-authenticator</Module>"
        "</Authenticator>",
    )
    found = problems(text)
    assert any("<Authenticator> is given more than once" in p for p in found), found


# ------------------------------------------------- the replication transport's own


def instance_doc(inet: str, transport_extra: str = "", root_extra: str = "") -> str:
    return (
        "<AMPSConfig><Name>amps-b</Name>"
        "<TransactionLog><JournalDirectory>./data</JournalDirectory></TransactionLog>"
        "<Transports><Transport><Name>json-tcp</Name><Type>tcp</Type>"
        "<InetAddr>127.0.0.1:9207</InetAddr></Transport>"
        "<Transport><Name>repl-in</Name><Type>amps-replication</Type>"
        f"<InetAddr>{inet}</InetAddr>{transport_extra}</Transport></Transports>"
        f"{root_extra}</AMPSConfig>"
    )


def users_file(tmp_path: Path) -> Path:
    from amps_py import auth

    path = tmp_path / "replication-users.pw"
    auth.PasswordFile(str(path)).with_user("repl", SECRET).save()
    return path


def auth_xml(users: Path) -> str:
    return (
        "<Authentication><Module>amps-password-file</Module>"
        f"<Options><PasswordFile>{users}</PasswordFile></Options></Authentication>"
    )


def test_replication_transport_authentication(tmp_path: Path) -> None:
    users = users_file(tmp_path)
    config = parse_config(instance_doc("9204", auth_xml(users)), "b.xml", environ={})
    transport = config.replication_transport
    assert transport is not None and transport.authentication is not None
    assert config.replication_authentication == transport.authentication
    assert config.replication_authentication.password_file == users
    assert config.authentication.module == "amps-default-authentication-module"
    assert transport.sequence_gap_threshold == 100_000
    # without one, the instance's Authentication applies to replication too
    plain = parse_config(
        instance_doc("9204", "<SequenceGapThreshold>2M</SequenceGapThreshold>", auth_xml(users)),
        "b.xml",
        environ={},
    )
    assert plain.replication_authentication == plain.authentication
    assert plain.replication_transport is not None
    assert plain.replication_transport.sequence_gap_threshold == 2_000_000


@pytest.mark.parametrize(
    ("inet", "transport_extra", "root_extra", "warned"),
    [
        ("9204", "", "", "0.0.0.0:9204 (every interface)"),  # a bare port: every interface
        ("0.0.0.0:9204", "", "", "0.0.0.0:9204 (every interface)"),
        ("[::]:9204", "", "", "[::]:9204 (every interface)"),
        ("10.1.2.3:9204", "", "", "10.1.2.3:9204 (10.1.2.3, beyond this machine)"),
        ("127.0.0.1:9204", "", "", None),
        ("[::1]:9204", "", "", None),
        ("localhost:9204", "", "", None),
        ("0.0.0.0:9204", "AUTH", "", None),  # the transport's own Authentication
        ("0.0.0.0:9204", "", "AUTH", None),  # the instance's
    ],
)
def test_config_check_warns_about_an_open_replication_port(
    tmp_path: Path, inet: str, transport_extra: str, root_extra: str, warned: str | None
) -> None:
    """``amps-py config check`` warns (exit status 0) when the replication transport
    has no authentication and listens beyond loopback, naming the transport and fix."""
    users = users_file(tmp_path)
    text = instance_doc(
        inet,
        auth_xml(users) if transport_extra == "AUTH" else "",
        auth_xml(users) if root_extra == "AUTH" else "",
    )
    path = tmp_path / "amps-b.xml"
    path.write_text(text)
    res = subprocess.run(
        [sys.executable, "-m", "amps_py", "config", "check", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert res.returncode == 0 and ": OK" in res.stdout, res.stdout + res.stderr
    if warned is None:
        assert res.stderr == "", res.stderr
        return
    assert res.stderr.startswith(f"{path}: warning: replication transport 'repl-in' "), res.stderr
    assert f"listens on {warned} without authentication" in res.stderr, res.stderr
    assert "<Authentication><Module>amps-password-file</Module>" in res.stderr
    assert "amps-py users add FILE USER" in res.stderr
