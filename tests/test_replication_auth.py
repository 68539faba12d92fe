"""Authenticated replication links between real instance processes: the upstream's
Destination/Transport/Authenticator credentials are checked by the downstream's
Authentication module, then its Entitlement module must grant replication_logon."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from cluster import Cluster, InstanceView, destination_xml, replication_xml
from harness import wait_until

from amps_py import auth, events
from amps_py.client import open_client

USER = "repl"
PASSWORD = "Repl-Link-Secret-42"  # grepped for in the logs: it must never appear
WRONG = "Wrong-Link-Secret-17"


def password_file(tmp_path: Path) -> Path:
    path = tmp_path / "users.pw"
    auth.PasswordFile(str(path)).with_user(USER, PASSWORD).save()
    return path


def authentication_xml(users: Path) -> str:
    return (
        "<Authentication><Module>amps-password-file</Module>"
        f"<Options><PasswordFile>{users}</PasswordFile></Options></Authentication>"
    )


def entitlement_xml(rules: Path) -> str:
    return (
        "<Entitlement><Module>amps-rule-entitlement</Module>"
        f"<Options><RulesFile>{rules}</RulesFile></Options></Entitlement>"
    )


def upstream_body(options: str) -> Callable[[InstanceView], str]:
    """A's config: one async destination B whose Transport logs on with ``options``."""
    authenticator = (
        "<Authenticator><Module>amps-password-authenticator</Module>"
        f"<Options>{options}</Options></Authenticator>"
    )

    def make(view: InstanceView) -> str:
        dest = destination_xml("B", "gb", False, view.addr("B"), exclude=("replicate",))
        return replication_xml(dest.replace("</Transport>", authenticator + "</Transport>"))

    return make


def logs(cluster: Cluster, name: str) -> str:
    server = cluster.server(name)
    return "".join(
        f.read_text(errors="replace") for f in (server.log_file, server.output) if f.exists()
    )


def stored(cluster: Cluster, name: str) -> int:
    return int(cluster.server(name).statistics()["journal"]["records"])


async def publish(uri: str, n: int) -> None:
    async with open_client(uri, "pub") as pub:
        for i in range(n):
            await pub.publish("orders", b'{"i":%d}' % i)
        await pub.wait_persisted(pub.seq, timeout=30)


def start_pair(cluster: Cluster, options: str, downstream_xml: str) -> None:
    cluster.add_instance("A", "ga", upstream_body(options))
    cluster.add_instance("B", "gb", lambda _view: downstream_xml, replication_transport=True)
    cluster.start("B")
    cluster.start("A")


async def wait_refused(cluster: Cluster, reason: str) -> None:
    def refused() -> str | None:
        a, b = logs(cluster, "A"), logs(cluster, "B")
        # (an auth failure is logged by the auth gate, naming the upstream's hello)
        said = "replication hello of upstream A" if reason == "auth failure" else "from A"
        if said not in b or reason not in b:
            return f"B has not logged the {reason!r} refusal yet"
        if "refused by the peer" not in a or reason not in a:
            return f"A has not logged the {reason!r} refusal yet"
        return None

    await wait_until(refused, 30)


async def test_right_credentials_replicate(cluster: Cluster, tmp_path: Path) -> None:
    secret = tmp_path / "repl.secret"
    secret.write_text(PASSWORD + "\n")
    secret.chmod(0o600)
    start_pair(
        cluster,
        f"<Username>{USER}</Username><PasswordFile>{secret}</PasswordFile>",
        authentication_xml(password_file(tmp_path)),
    )
    await publish(cluster.uri("A"), 10)

    def replicated() -> str | None:
        n = stored(cluster, "B")
        return None if n == 10 else f"B stored {n} of 10"

    await wait_until(replicated, 30)
    assert "replication from A" in logs(cluster, "B")
    for name in "AB":
        assert PASSWORD not in logs(cluster, name), f"{name} logged the password"
        assert PASSWORD not in json.dumps(cluster.server(name).statistics())


async def test_wrong_password_is_refused_with_auth_failure(
    cluster: Cluster, tmp_path: Path
) -> None:
    start_pair(
        cluster,
        f"<Username>{USER}</Username><Password>{WRONG}</Password>",
        authentication_xml(password_file(tmp_path)),
    )
    await publish(cluster.uri("A"), 3)
    await wait_refused(cluster, "auth failure")
    b_log = logs(cluster, "B")
    refusal = next(line for line in b_log.splitlines() if "auth failure" in line)
    assert "upstream A" in refusal and repr(USER) in refusal, refusal
    assert stored(cluster, "B") == 0
    for name in "AB":
        text = logs(cluster, name)
        assert WRONG not in text, f"{name} logged the password sent"
        assert PASSWORD not in text


async def test_user_without_replication_logon_is_not_entitled(
    cluster: Cluster, tmp_path: Path
) -> None:
    rules = tmp_path / "rules.json"
    rules.write_text(json.dumps({USER: {"read": ".*", "write": ".*"}, "*": {"read": ".*"}}))
    start_pair(
        cluster,
        f"<Username>{USER}</Username><Password>{PASSWORD}</Password>",
        authentication_xml(password_file(tmp_path)) + entitlement_xml(rules),
    )
    await publish(cluster.uri("A"), 3)
    await wait_refused(cluster, "not entitled")
    assert "replication_logon" in logs(cluster, "B")
    assert stored(cluster, "B") == 0
    for name in "AB":
        assert PASSWORD not in logs(cluster, name), f"{name} logged the password"


async def test_replication_transport_authentication_leaves_clients_open(tmp_path: Path) -> None:
    """``Transport/Authentication`` on the amps-replication transport: upstreams must
    log on with a user of that password file (one without credentials, or with a wrong
    password, is refused with ``auth failure``) while clients of the same instance need
    no credentials (AMPSConfig/Authentication is the default module)."""
    from harness import ServerProcess, wait_until, write_config

    users = password_file(tmp_path)
    transport = (
        "<Transport><Name>amps-replication</Name><Type>amps-replication</Type>"
        "<InetAddr>127.0.0.1:0</InetAddr>"
        f"{authentication_xml(users)}</Transport>"
    )
    b = ServerProcess(write_config(tmp_path, "B", 0, extra_transport=transport), tmp_path, 0, "B")
    b.start()
    ready = json.loads(b.ready_file.read_text())
    b.port = ready["transports"]["json-tcp"]
    b_repl = ready["transports"]["amps-replication"]
    upstreams: list[ServerProcess] = []

    def upstream(name: str, options: str | None) -> ServerProcess:
        dest = destination_xml("B", "B", False, f"127.0.0.1:{b_repl}", exclude=("replicate",))
        if options is not None:
            dest = dest.replace(
                "</Transport>",
                "<Authenticator><Module>amps-password-authenticator</Module>"
                f"<Options>{options}</Options></Authenticator></Transport>",
            )
        config = write_config(tmp_path, name, 0, extra=replication_xml(dest))
        server = ServerProcess(config, tmp_path, 0, name)
        upstreams.append(server)
        server.start()
        server.port = json.loads(server.ready_file.read_text())["transports"]["json-tcp"]
        return server

    try:
        # a client of B needs no credentials
        async with open_client(b.uri, "local") as client:
            await client.publish_persisted("orders", b'{"local":1}', timeout=20)
        anonymous = upstream("Anon", None)
        wrong = upstream("Wrong", f"<Username>{USER}</Username><Password>{WRONG}</Password>")
        right = upstream("Right", f"<Username>{USER}</Username><Password>{PASSWORD}</Password>")
        for server in (anonymous, wrong, right):
            await publish(server.uri, 2)

        def settled() -> str | None:
            log = b.log_file.read_text()
            missing = [
                f"{who} refused"
                for who in ("Anon", "Wrong")
                if f"replication hello of upstream {who}" not in log
            ]
            n = int(b.statistics()["journal"]["records"])
            if n != 3:
                missing.append(f"B holds {n} records, want 3 (its own and Right's two)")
            return "; ".join(missing) or None

        await wait_until(settled, 30)
        log = b.log_file.read_text()
        refusals = [line for line in log.splitlines() if events.REPLICATION_AUTH_FAILED in line]
        assert all("auth failure" in line for line in refusals), refusals
        assert "user (none given)" in next(r for r in refusals if "Anon" in r)
        assert not [line for line in log.splitlines() if "refused replication from" in line]
        assert PASSWORD not in log and WRONG not in log
    finally:
        for server in (*upstreams, b):
            server.stop()
