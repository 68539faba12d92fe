"""Replication security as the seed's "Replication Security" section configures it,
between two in-process instances replicating over real sockets:

* the receiving instance's ``amps-replication`` Transport has its own
  ``Authentication`` and ``Entitlement`` (the seed's snippet: AMPS's default modules),
  which govern upstream hellos instead of the instance's;
* the sending instance's Destination Transport has an ``Authenticator``
  (``amps-default-authenticator-module``) that supplies the outgoing credentials;
* a Transport's own modules override the instance's for its connections only: a
  password-file module on the replication transport refuses an upstream with a wrong
  password (saying which transport and module) while clients of the same instance log
  on without one, and a client transport with its own modules checks its clients while
  another keeps the instance's.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
from cluster import destination_xml, replication_xml
from harness import wait_until
from inprocess import REPLICATION_TRANSPORT, InProcessInstance, serve_instance

from amps_py import auth, events
from amps_py.client import CommandError, ConnectionLost, open_client
from amps_py.config.credentials import process_user

USER = "repl"
PASSWORD = "Repl-Secret-For-Tests-31"  # must never reach a log line
WRONG = "Wrong-Secret-For-Tests-32"


def password_file(tmp_path: Path, users: dict[str, str]) -> Path:
    path = tmp_path / "users.pw"
    entries = auth.PasswordFile(str(path))
    for user, password in users.items():
        entries = entries.with_user(user, password)
    entries.save()
    return path


def password_auth(path: Path) -> str:
    return (
        "<Authentication><Module>amps-password-file</Module>"
        f"<Options><PasswordFile>{path}</PasswordFile></Options></Authentication>"
    )


def rules_entitlement(path: Path, rules: dict[str, dict[str, object]]) -> str:
    path.write_text(json.dumps(rules))
    return (
        "<Entitlement><Module>amps-rule-entitlement</Module>"
        f"<Options><RulesFile>{path}</RulesFile></Options></Entitlement>"
    )


#: the seed's modules on the replication transport
SEED_TRANSPORT_MODULES = (
    "<Entitlement><Module>amps-default-entitlement-module</Module></Entitlement>"
    "<Authentication><Module>amps-default-authentication-module</Module></Authentication>"
)


def replication_transport(modules: str) -> str:
    return (
        f"<Transport><Name>{REPLICATION_TRANSPORT}</Name><Type>amps-replication</Type>"
        f"<InetAddr>127.0.0.1:0</InetAddr>{modules}</Transport>"
    )


def authenticator(module: str, options: str = "") -> str:
    return f"<Authenticator><Module>{module}</Module><Options>{options}</Options></Authenticator>"


@asynccontextmanager
async def downstream(
    tmp_path: Path, transport_modules: str, instance_modules: str = ""
) -> AsyncIterator[InProcessInstance]:
    """Instance B: a client transport, a replication transport with
    ``transport_modules``, and ``instance_modules`` at AMPSConfig level."""
    async with serve_instance(
        tmp_path / "B",
        "B",
        extra_transport=replication_transport(transport_modules),
        extra=f"<Group>B</Group>{instance_modules}",
    ) as b:
        yield b


@asynccontextmanager
async def upstream(
    tmp_path: Path, name: str, b: InProcessInstance, link_authenticator: str
) -> AsyncIterator[InProcessInstance]:
    """Instance ``name`` replicating every json topic to B (one way), logging on with
    ``link_authenticator`` (an ``<Authenticator>``, or "")."""
    dest = destination_xml(
        "B",
        "B",
        False,
        f"127.0.0.1:{b.bound_port(REPLICATION_TRANSPORT)}",
        exclude=("replicate",),
    ).replace("</Transport>", link_authenticator + "</Transport>")
    async with serve_instance(
        tmp_path / name, name, extra=f"<Group>{name}</Group>{replication_xml(dest)}"
    ) as a:
        yield a


def stored(instance: InProcessInstance) -> int:
    return int(instance.statistics()["journal"]["records"])


async def publish(uri: str, n: int, **logon: str) -> None:
    async with open_client(uri, "pub", **logon) as pub:
        for i in range(n):
            await pub.publish("orders", b'{"i":%d}' % i)
        await pub.wait_persisted(pub.seq, timeout=30)


async def wait_stored(instance: InProcessInstance, want: int) -> None:
    def check() -> str | None:
        n = stored(instance)
        return None if n == want else f"{instance.name} stored {n} of {want}"

    await wait_until(check, 30)


def destination_error(instance: InProcessInstance) -> str:
    for d in instance.statistics()["replication"]["destinations"]:
        if d["name"] == "B":
            return str(d["last_error"])
    raise AssertionError(f"{instance.name} has no destination B")


async def test_the_seed_snippet_replicates_with_amps_default_modules(tmp_path: Path) -> None:
    """B checks client passwords (AMPSConfig/Authentication) but its replication
    transport has the seed's default modules: A, whose Authenticator is
    amps-default-authenticator-module (the process's user, no password), replicates
    in; without the transport's own Authentication it would be refused."""
    users = password_file(tmp_path, {"alice": PASSWORD})
    async with (
        downstream(tmp_path, SEED_TRANSPORT_MODULES, password_auth(users)) as b,
        upstream(tmp_path, "A", b, authenticator("amps-default-authenticator-module")) as a,
    ):
        await publish(a.uri, 5)
        await wait_stored(b, 5)
        (link,) = [d for d in a.statistics()["replication"]["destinations"] if d["name"] == "B"]
        assert link["authenticated_id"] == process_user()
        # B's clients still need the instance's password file
        with pytest.raises((CommandError, ConnectionLost)):
            async with open_client(b.uri, "nobody", user_id="alice", pw=WRONG):
                pass
        async with open_client(b.uri, "alice", user_id="alice", pw=PASSWORD) as client:
            await client.publish_persisted("orders", b'{"local":1}', timeout=20)
        assert stored(b) == 6
        assert PASSWORD not in a.log_text() and WRONG not in a.log_text()


async def test_replication_transport_password_module_refuses_a_wrong_password(
    tmp_path: Path,
) -> None:
    """The replication transport's own amps-password-file refuses an upstream whose
    Authenticator sends a wrong password (B logs it naming the transport and the
    module; A's destination reports B's refusal), accepts one with the right
    password, while B's clients log on with the instance's default module."""
    users = password_file(tmp_path, {USER: PASSWORD})
    wrong = authenticator(
        "amps-default-authenticator-module", f"<User>{USER}</User><Password>{WRONG}</Password>"
    )
    right = authenticator(
        "amps-default-authenticator-module", f"<User>{USER}</User><Password>{PASSWORD}</Password>"
    )
    async with (
        downstream(tmp_path, password_auth(users)) as b,
        upstream(tmp_path, "Wrong", b, wrong) as bad,
        upstream(tmp_path, "Right", b, right) as good,
    ):
        # a client of B needs no credentials: the instance's module is the default
        async with open_client(b.uri, "local") as client:
            await client.publish_persisted("orders", b'{"local":1}', timeout=20)
        await publish(bad.uri, 2)
        await publish(good.uri, 3)
        await wait_stored(b, 4)  # its own and Right's three

        def refused() -> str | None:
            error = destination_error(bad)
            return None if "auth failure" in error else f"Wrong's destination B says {error!r}"

        await wait_until(refused, 30)
        error = destination_error(bad)
        assert "refused by the peer" in error, error
        assert (
            f"upstream Wrong failed to authenticate as user {USER!r} on B's replication "
            f"transport {REPLICATION_TRANSPORT!r} with the amps-password-file module (the "
            f"Authentication of transport {REPLICATION_TRANSPORT!r})" in error
        ), error
        lines = [
            line for line in b.log_text().splitlines() if events.REPLICATION_AUTH_FAILED in line
        ]
        line = next(line for line in lines if "Wrong" in line)
        assert (
            f"replication hello of upstream Wrong on replication transport "
            f"{REPLICATION_TRANSPORT!r}" in line
        ), line
        assert "amps-password-file" in line, line
        assert not [line for line in lines if "upstream Right" in line]
        assert stored(b) == 4
        for text in (b.log_text(), json.dumps(b.statistics()), json.dumps(bad.statistics())):
            assert PASSWORD not in text and WRONG not in text


async def test_replication_transport_entitlement_refuses_without_replication_logon(
    tmp_path: Path,
) -> None:
    """The replication transport's own rule Entitlement (the instance's is the
    default, which allows everything) refuses an upstream user without
    replication_logon, naming the transport and the module."""
    rules = rules_entitlement(tmp_path / "rules.json", {"*": {"read": ".*", "write": ".*"}})
    async with (
        downstream(tmp_path, rules) as b,
        upstream(
            tmp_path, "A", b, authenticator("amps-default-authenticator-module", "<User>u</User>")
        ) as a,
    ):
        await publish(a.uri, 2)

        def refused() -> str | None:
            error = destination_error(a)
            return None if "not entitled" in error else f"A's destination B says {error!r}"

        await wait_until(refused, 30)
        error = destination_error(a)
        assert (
            f"user 'u' of upstream A may not replicate to B over its replication transport "
            f"{REPLICATION_TRANSPORT!r} (no replication_logon under the amps-rule-entitlement "
            f"module, the Entitlement of transport {REPLICATION_TRANSPORT!r})" in error
        ), error
        assert "refused replication from A" in b.log_text()
        assert stored(b) == 0
        # B's clients keep the instance's default entitlement
        async with open_client(b.uri, "local") as client:
            await client.publish_persisted("orders", b'{"local":1}', timeout=20)


async def test_a_client_transport_with_its_own_modules_checks_only_its_clients(
    tmp_path: Path,
) -> None:
    """Transport ``locked`` has a password file and rules; ``json-tcp`` keeps the
    instance's default modules."""
    users = password_file(tmp_path, {"alice": PASSWORD})
    rules = rules_entitlement(
        tmp_path / "rules.json", {"alice": {"read": "orders", "write": "orders"}}
    )
    locked = (
        "<Transport><Name>locked</Name><Type>tcp</Type><InetAddr>127.0.0.1:0</InetAddr>"
        f"<Protocol>amps</Protocol><MessageType>json</MessageType>{password_auth(users)}"
        f"{rules}</Transport>"
    )
    async with serve_instance(tmp_path / "C", "C", extra_transport=locked) as c:
        locked_uri = f"tcp://127.0.0.1:{c.bound_port('locked')}/amps/json"
        async with open_client(c.uri, "open") as client:  # no password: the default
            await client.publish_persisted("secret", b'{"i":1}', timeout=20)
        with pytest.raises((CommandError, ConnectionLost)) as refused:
            async with open_client(locked_uri, "bad", user_id="alice", pw=WRONG):
                pass
        if isinstance(refused.value, CommandError):
            assert refused.value.reason == "auth failure"
        failures = [line for line in c.log_text().splitlines() if "auth failure" in line]
        assert any("on transport locked" in line for line in failures), failures
        async with open_client(locked_uri, "alice", user_id="alice", pw=PASSWORD) as client:
            await client.publish_persisted("orders", b'{"i":2}', timeout=20)
            with pytest.raises(CommandError) as denied:
                await client.publish_persisted("secret", b'{"i":3}', timeout=20)
            assert denied.value.reason == "not entitled"
            assert "the amps-rule-entitlement rules decide" in denied.value.detail
        assert PASSWORD not in c.log_text() and WRONG not in c.log_text()
