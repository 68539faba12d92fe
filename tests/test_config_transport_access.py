"""Per-transport ``Authentication`` and ``Entitlement``, AMPS's default module names,
and ``amps-default-authenticator-module``: what the loader builds from them, and the
problems a wrong one gets.

The seed's "Replication Security" snippet (an ``amps-replication`` Transport with
``amps-default-entitlement-module`` and ``amps-default-authentication-module``, and a
Destination Transport with ``amps-default-authenticator-module``) must pass
``amps-py config check`` as written, its ``...`` filled in with a Name, a client
transport and a TransactionLog. Its Topic MessageType ``fix`` is replaced by ``json``
here: amps-py does not take ``fix`` yet (another change adds it).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from amps_py import auth
from amps_py.config import ConfigError, parse_config, security_warnings
from amps_py.config.credentials import (
    AMPS_DEFAULT_LINK_AUTHENTICATOR,
    LinkAuthenticator,
    LinkCredentialsError,
    process_user,
)
from amps_py.config.model import AuthenticationConfig
from amps_py.server.startup import open_access_control

SECRET = "Audit-Link-Secret-7"

#: the receiving instance of the seed's snippet (the ``...`` filled in minimally)
RECEIVER = """<AMPSConfig>
  <Name>amps-1</Name>
  <Transports>
    <Transport>
      <Name>json-tcp</Name><Type>tcp</Type><InetAddr>127.0.0.1:10003</InetAddr>
      <Protocol>amps</Protocol><MessageType>json</MessageType>
    </Transport>
    <Transport>
        <Name>amps-replication</Name>
        <Type>amps-replication</Type>
        <InetAddr>10005</InetAddr>

        <Entitlement>
            <Module>amps-default-entitlement-module</Module>
        </Entitlement>

        <Authentication>
            <Module>amps-default-authentication-module</Module>
       </Authentication>
    </Transport>
  </Transports>
  <TransactionLog>
    <JournalDirectory>./amps-1-journal</JournalDirectory>
    <Topic><Name>topic</Name><MessageType>json</MessageType></Topic>
  </TransactionLog>
</AMPSConfig>
"""

#: the sending instance of the seed's snippet
SENDER = """<AMPSConfig>
  <Name>amps-0</Name>
  <Transports>
    <Transport>
      <Name>json-tcp</Name><Type>tcp</Type><InetAddr>127.0.0.1:10013</InetAddr>
      <Protocol>amps</Protocol><MessageType>json</MessageType>
    </Transport>
  </Transports>
  <TransactionLog>
    <JournalDirectory>./amps-0-journal</JournalDirectory>
    <Topic><Name>topic</Name><MessageType>json</MessageType></Topic>
  </TransactionLog>
<Replication>
    <Destination>
        <Topic>
            <MessageType>json</MessageType>
            <Name>topic</Name>
        </Topic>
        <Name>amps-1</Name>
        <SyncType>async</SyncType>
        <Transport>
            <InetAddr>amps-1-server.example.com:10004</InetAddr>
            <Type>amps-replication</Type>

            <Authenticator>
                <Module>amps-default-authenticator-module</Module>
            </Authenticator>
        </Transport>
    </Destination>
</Replication>
</AMPSConfig>
"""


def config_check(path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "amps_py", "config", "check", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


@pytest.mark.parametrize(("name", "text"), [("receiver", RECEIVER), ("sender", SENDER)])
def test_config_check_accepts_the_seed_snippet(tmp_path: Path, name: str, text: str) -> None:
    path = tmp_path / f"{name}.xml"
    path.write_text(text)
    res = config_check(path)
    assert res.returncode == 0 and ": OK" in res.stdout, res.stdout + res.stderr


def test_the_snippet_means_what_it_means_in_amps() -> None:
    receiver = parse_config(RECEIVER, "receiver.xml", environ={})
    transport = receiver.replication_transport
    assert transport is not None
    assert transport.authentication is not None and transport.entitlement is not None
    assert receiver.replication_authentication.module == auth.DEFAULT_AUTHENTICATION_MODULE
    assert receiver.replication_entitlement.module == auth.DEFAULT_ENTITLEMENT_MODULE
    access = open_access_control(receiver)
    assert access.replication_authenticator.authenticate("anyone", "").ok
    assert access.replication_entitler.can_replicate("anyone")

    sender = parse_config(SENDER, "sender.xml", environ={})
    found = sender.replication[0].authenticator
    assert found == LinkAuthenticator(AMPS_DEFAULT_LINK_AUTHENTICATOR)
    # AMPS's default authenticator: the user amps-py runs as, no password
    assert found.credentials() == (process_user(), "")


# ------------------------------------------------------------- per-transport modules


def users_file(tmp_path: Path) -> Path:
    path = tmp_path / "users.pw"
    auth.PasswordFile(str(path)).with_user("alice", SECRET).save()
    return path


def rules_file(tmp_path: Path) -> Path:
    path = tmp_path / "rules.json"
    path.write_text('{"alice": {"read": ".*", "write": "orders"}}')
    return path


def two_transports(tmp_path: Path, public: str = "", locked: str = "", root: str = "") -> str:
    """An instance with client transports ``public`` and ``locked`` (their extra XML)
    and AMPSConfig-level ``root`` XML."""
    return f"""<AMPSConfig>
  <Name>two</Name>
  <Transports>
    <Transport><Name>public</Name><Type>tcp</Type><InetAddr>127.0.0.1:9101</InetAddr>{public}
    </Transport>
    <Transport><Name>locked</Name><Type>tcp</Type><InetAddr>127.0.0.1:9102</InetAddr>{locked}
    </Transport>
    <Transport><Name>repl</Name><Type>amps-replication</Type><InetAddr>127.0.0.1:9104</InetAddr>
    </Transport>
  </Transports>
  <TransactionLog><JournalDirectory>{tmp_path / "j"}</JournalDirectory>
    <Topic><Name>.*</Name><MessageType>json</MessageType></Topic></TransactionLog>
  {root}
</AMPSConfig>"""


def test_a_transport_overrides_the_instance_modules_for_its_connections(
    tmp_path: Path,
) -> None:
    users, rules = users_file(tmp_path), rules_file(tmp_path)
    locked = (
        "<Authentication><Module>amps-password-file</Module>"
        f"<Options><PasswordFile>{users}</PasswordFile></Options></Authentication>"
        "<Entitlement><Module>amps-rule-entitlement</Module>"
        f"<Options><RulesFile>{rules}</RulesFile></Options></Entitlement>"
    )
    config = parse_config(two_transports(tmp_path, locked=locked), "two.xml", environ={})
    public, locked_t, _ = config.transports
    assert config.authentication_of(public) == config.authentication  # the instance's
    assert config.authentication_of(locked_t).module == auth.PASSWORD_FILE_MODULE
    assert config.entitlement_of(locked_t).module == auth.RULE_ENTITLEMENT_MODULE
    assert config.replication_authentication == config.authentication

    access = open_access_control(config)
    assert access.authenticator_for("public") is access.authenticator
    assert access.entitler_for("public").can_write("bob", "secret")
    assert not access.authenticator_for("locked").authenticate("alice", "wrong").ok
    assert access.authenticator_for("locked").authenticate("alice", SECRET).ok
    assert not access.entitler_for("locked").can_write("alice", "secret")
    # the replication transport has none of its own: the instance's modules, shared
    assert access.replication_authenticator is access.authenticator
    assert access.authenticator_for("repl") is access.authenticator
    # (an unknown transport name gets the instance's)
    assert access.entitler_for("nope") is access.entitler


def test_transport_modules_configured_alike_are_opened_once(tmp_path: Path) -> None:
    users = users_file(tmp_path)
    same = (
        "<Authentication><Module>amps-password-file</Module>"
        f"<Options><PasswordFile>{users}</PasswordFile></Options></Authentication>"
    )
    config = parse_config(
        two_transports(tmp_path, public=same, locked=same, root=same), "two.xml", environ={}
    )
    access = open_access_control(config)
    assert access.authenticator_for("public") is access.authenticator_for("locked")
    assert access.authenticator_for("locked") is access.authenticator


def test_a_default_module_on_a_transport_of_a_password_instance_is_warned_about(
    tmp_path: Path,
) -> None:
    users = users_file(tmp_path)
    root = (
        "<Authentication><Module>amps-password-file</Module>"
        f"<Options><PasswordFile>{users}</PasswordFile></Options></Authentication>"
    )
    open_one = (
        "<Authentication><Module>amps-default-authentication-module</Module></Authentication>"
    )
    config = parse_config(
        two_transports(tmp_path, public=open_one, root=root).replace(
            "127.0.0.1:9101", "0.0.0.0:9101"
        ),
        "two.xml",
        environ={},
    )
    warnings = [w for w in security_warnings(config) if "transport 'public'" in w]
    assert len(warnings) == 1, security_warnings(config)
    assert "may log on as any user" in warnings[0]
    assert "Fix: remove its <Authentication>" in warnings[0]
    # on loopback only: no warning
    loopback = parse_config(two_transports(tmp_path, public=open_one, root=root), "two.xml")
    assert not [w for w in security_warnings(loopback) if "transport 'public'" in w]


@pytest.mark.parametrize("value", ["true", "enabled"])
def test_the_default_module_options_amps_py_always_applies_are_accepted(
    tmp_path: Path, value: str
) -> None:
    options = (
        "<Authentication><Module>amps-default-authentication-module</Module><Options>"
        f"<AllowSpoofing>{value}</AllowSpoofing><RequireLogon>{value}</RequireLogon>"
        "</Options></Authentication>"
    )
    config = parse_config(two_transports(tmp_path, locked=options), "two.xml", environ={})
    assert config.transports[1].authentication == AuthenticationConfig(
        auth.DEFAULT_AUTHENTICATION_MODULE
    )


def problems(text: str, environ: dict[str, str] | None = None) -> list[str]:
    with pytest.raises(ConfigError) as info:
        parse_config(text, "two.xml", environ=environ or {})
    return [str(p) for p in info.value.problems]


def test_a_default_module_option_on_another_module_is_refused(tmp_path: Path) -> None:
    users = users_file(tmp_path)
    locked = (
        "<Authentication><Module>amps-password-file</Module><Options>"
        f"<PasswordFile>{users}</PasswordFile><RequireLogon>false</RequireLogon>"
        "</Options></Authentication>"
    )
    (problem,) = problems(two_transports(tmp_path, locked=locked))
    assert (
        "Options/RequireLogon is an option of amps-default-authentication-module, not of "
        "amps-password-file. Fix: remove <RequireLogon>" in problem
    ), problem


# ------------------------------------------------------ amps-default-authenticator-module


def destination(options: str) -> str:
    """A sender whose Destination Transport has AMPS's default authenticator with
    ``options`` (inside Options)."""
    return SENDER.replace(
        "<Module>amps-default-authenticator-module</Module>",
        f"<Module>amps-default-authenticator-module</Module><Options>{options}</Options>",
    )


def test_amps_default_authenticator_sends_its_user_and_password_options(
    tmp_path: Path,
) -> None:
    secret = tmp_path / "secret"
    secret.write_text(SECRET + "\n")
    cases = {
        "<User>audit</User>": ("audit", ""),
        f"<User>audit</User><Password>{SECRET}</Password>": ("audit", SECRET),
        f"<User>audit</User><PasswordFileName>{secret}</PasswordFileName>": ("audit", SECRET),
        "<PasswordEnvironmentVariable>AUDIT_PW</PasswordEnvironmentVariable>": (
            process_user(),
            SECRET,
        ),
    }
    for options, sent in cases.items():
        config = parse_config(destination(options), "sender.xml", environ={})
        found = config.replication[0].authenticator
        assert found is not None and found.module == AMPS_DEFAULT_LINK_AUTHENTICATOR
        assert found.credentials({"AUDIT_PW": SECRET}) == sent, options
        assert SECRET not in repr(found)
    unset = (
        parse_config(
            destination("<PasswordEnvironmentVariable>AUDIT_PW</PasswordEnvironmentVariable>"),
            "sender.xml",
            environ={},
        )
        .replication[0]
        .authenticator
    )
    assert unset is not None
    unset_text = r"AUDIT_PW \(Authenticator PasswordEnvironmentVariable\) is not set"
    with pytest.raises(LinkCredentialsError, match=unset_text):
        unset.credentials({})


def test_process_user_falls_back_to_the_user_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    import pwd

    def no_entry(uid: int) -> pwd.struct_passwd:
        raise KeyError(uid)

    monkeypatch.setattr(pwd, "getpwuid", no_entry)
    assert process_user({"USER": "from-env"}) == "from-env"
    assert process_user({}) == ""


@pytest.mark.parametrize(
    ("options", "fragment"),
    [
        (
            "<Username>audit</Username>",
            "<Username> is not an option of the amps-default-authenticator-module module. "
            "Fix: write <User> instead",
        ),
        (
            "<PasswordEnv>AUDIT_PW</PasswordEnv>",
            "<PasswordEnv> is not an option of the amps-default-authenticator-module module. "
            "Fix: write <PasswordEnvironmentVariable> instead",
        ),
        (
            f"<Password>{SECRET}</Password><PasswordFileName>x</PasswordFileName>",
            "<PasswordFileName> is given as well as <Password>",
        ),
        ("<User>a b</User>", "User 'a b' contains whitespace or ':'"),
        (
            "<PasswordEnvironmentVariable>not a name</PasswordEnvironmentVariable>",
            "PasswordEnvironmentVariable is not an environment variable name",
        ),
    ],
)
def test_amps_default_authenticator_problems(options: str, fragment: str) -> None:
    found = problems(destination(options))
    assert any(fragment in p for p in found), found
    assert not any(SECRET in p for p in found)


def test_the_password_authenticator_names_the_amps_spelling_it_does_not_take() -> None:
    text = SENDER.replace(
        "<Module>amps-default-authenticator-module</Module>",
        "<Module>amps-password-authenticator</Module><Options><User>audit</User>"
        f"<Password>{SECRET}</Password></Options>",
    )
    found = problems(text)
    assert any(
        "<User> is not an option of the amps-password-authenticator module. Fix: write "
        "<Username> instead" in p
        for p in found
    ), found
