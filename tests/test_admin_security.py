"""The admin API refuses what a web page could make a browser send, over real sockets.

A real instance (hypercorn on port 0, the ready file), raw HTTP requests with the
headers a browser would send: GET on an administrator action (405, nothing changes), a
cross-origin POST (403), a POST without X-AMPS-Admin (403), a foreign Host (421), a CORS
preflight (never approved); a same-origin POST with the header works. Refusals are
logged with the peer and the path, never a password. The HTTPS admin interface (Admin
Certificate/PrivateKey): the CLI verifies it with --ca-file and refuses an unverified
certificate; plain HTTP to it fails without harming the instance.
"""

from __future__ import annotations

import http.client
import json
import os
import shutil
import socket
import ssl
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import trio
from clirun import DefaultServe
from harness import ServerProcess, reserve_port, security_xml, start_instance, wait_until

from amps_py.cli.client import Credentials, fetch_instance
from amps_py.client import open_client

ADMIN_XML = "<Admin><InetAddr>127.0.0.1:0</InetAddr></Admin>"
EXAMPLE = Path(__file__).resolve().parent.parent / "config" / "examples" / "secure"

#: every state-changing path, with the thing it would change in this test's instance
ACTIONS = (
    "/amps/administrator/clients/victim/disconnect",
    "/amps/administrator/clients/victim/disconnect.json",
    "/amps/administrator/transports/json-tcp/disable",
    "/amps/administrator/transports/json-tcp/enable",
    "/amps/administrator/replication/B/downgrade",
    "/amps/administrator/replication/B/upgrade",
    "/amps/administrator/transaction_log/journals/1/compress",
    "/amps/administrator/transaction_log/journals/1/archive",
    "/amps/administrator/transaction_log/journals/1/remove",
    "/amps/administrator/queues/q/enable_proxied_transfer",
    "/amps/administrator/queues/q/disable_proxied_transfer",
    "/amps/administrator/actions/anything",
)


def admin_port(server: ServerProcess) -> int:
    return int(json.loads(server.ready_file.read_text())["transports"]["admin"])


def request(
    port: int,
    method: str,
    path: str,
    headers: dict[str, str] | None = None,
    *,
    context: ssl.SSLContext | None = None,
) -> tuple[int, dict[str, str], dict[str, Any]]:
    """One raw request (http.client sends exactly these headers, Host included when
    given); (status, headers by lower-case name, JSON body or {})."""
    if context is None:
        conn: http.client.HTTPConnection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    else:
        conn = http.client.HTTPSConnection("127.0.0.1", port, timeout=10, context=context)
    try:
        conn.request(method, path, headers=headers or {})
        response = conn.getresponse()
        raw = response.read()
        got = {k.lower(): v for k, v in response.getheaders()}
        body = json.loads(raw) if raw and "json" in got.get("content-type", "") else {}
        return response.status, got, body
    finally:
        conn.close()


def clients(port: int) -> dict[str, Any]:
    status, _, body = request(port, "GET", "/amps/instance/clients.json")
    assert status == 200, body
    return body


def admin_cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "amps_py", "admin", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, **(env or {})},
    )


@pytest.fixture
def server(tmp_path: Path) -> Iterator[ServerProcess]:
    # a reserved client port: the transport must still listen there after the tests
    with reserve_port() as held:
        proc = start_instance(tmp_path, "guarded", port=held.getsockname()[1], extra=ADMIN_XML)
        yield proc
        proc.stop()


async def connected(server: ServerProcess, port: int) -> None:
    def listed() -> str | None:
        return None if "victim" in clients(port) else f"clients are {sorted(clients(port))}"

    await wait_until(listed, 60)


async def test_get_on_an_administrator_action_is_refused_and_changes_nothing(
    server: ServerProcess,
) -> None:
    port = admin_port(server)
    async with open_client(server.uri, "victim") as victim:
        await connected(server, port)
        for path in ACTIONS:
            for method in ("GET", "HEAD", "PUT", "DELETE"):
                status, headers, body = await trio.to_thread.run_sync(
                    lambda: request(port, method, path)  # noqa: B023 - called at once
                )
                assert status == 405, (method, path, status, body)
                assert headers["allow"] == "POST", headers
                if method != "HEAD":
                    assert "needs POST" in body["error"] and "X-AMPS-Admin: 1" in body["error"]
        # the client is still connected and the transport still listens
        assert victim.closed is None
        assert "victim" in clients(port)
        await victim.publish_persisted("orders", b'{"still":"here"}', timeout=30)
        stream = await trio.open_tcp_stream("127.0.0.1", server.port)
        await stream.aclose()
    # the listings stay readable with GET
    status, _, listing = request(port, "GET", "/amps/administrator/actions.json")
    assert status == 200 and listing == {"actions": []}
    # an https:// URL for this plain-HTTP admin API: one line saying so
    tls = admin_cli("--url", f"https://127.0.0.1:{port}", "status")
    assert tls.returncode == 2 and len(tls.stderr.strip().splitlines()) == 1, tls.stderr
    assert "if it serves plain HTTP" in tls.stderr, tls.stderr


async def test_cross_origin_and_headerless_posts_are_refused_and_logged(
    server: ServerProcess,
) -> None:
    port = admin_port(server)
    path = "/amps/administrator/clients/victim/disconnect"
    async with open_client(server.uri, "victim") as victim:
        await connected(server, port)

        def post(headers: dict[str, str]) -> tuple[int, dict[str, str], dict[str, Any]]:
            return request(port, "POST", path, headers)

        # what a form on another site sends, with or without the header
        for headers in (
            {"Origin": "http://evil.example", "X-AMPS-Admin": "1"},
            {"Origin": "http://evil.example"},
            {"Origin": "null", "X-AMPS-Admin": "1"},
            {"Origin": f"http://127.0.0.1:{port + 1}", "X-AMPS-Admin": "1"},
        ):
            status, _, body = await trio.to_thread.run_sync(post, headers)
            assert status == 403, (headers, body)
            assert "cross-site requests are refused" in body["error"]
            assert repr(headers["Origin"]) in body["error"]
        # without the custom header (no Origin: e.g. a script or tool)
        status, _, body = await trio.to_thread.run_sync(post, {})
        assert status == 403
        assert "'X-AMPS-Admin: 1'" in body["error"] and "amps-py admin sends it" in body["error"]
        # DNS rebinding: the page's own name resolved to 127.0.0.1
        status, _, body = await trio.to_thread.run_sync(
            post, {"Host": f"rebound.evil.example:{port}", "X-AMPS-Admin": "1"}
        )
        assert status == 421 and "is not a name of this machine" in body["error"]
        status, _, body = await trio.to_thread.run_sync(
            lambda: request(port, "GET", "/amps/instance.json", {"Host": "evil.example"})
        )
        assert status == 421
        # a CORS preflight is answered, never approved
        status, headers, _ = await trio.to_thread.run_sync(
            lambda: request(
                port,
                "OPTIONS",
                path,
                {
                    "Origin": "http://evil.example",
                    "Access-Control-Request-Method": "POST",
                    "Access-Control-Request-Headers": "x-amps-admin",
                },
            )
        )
        assert status == 204 and headers["allow"] == "POST, OPTIONS"
        assert not [h for h in headers if h.startswith("access-control-")], headers

        assert victim.closed is None and "victim" in clients(port)

        # the admin API's own origin, with the header: done
        status, _, body = await trio.to_thread.run_sync(
            post, {"Origin": f"http://127.0.0.1:{port}", "X-AMPS-Admin": "1"}
        )
        assert status == 200 and body["result"] == "disconnected", body
        await wait_until(lambda: None if victim.closed else "victim still connected", 60)

    log = server.log_file.read_text()
    refusals = [line for line in log.splitlines() if "07-0052" in line]
    assert len(refusals) == 7, refusals  # 4 cross-origin, 1 headerless, 2 foreign Host
    assert all(f"POST {path} from 127.0.0.1:" in r for r in refusals[:6]), refusals
    assert "cross-origin" in refusals[0] and "no X-AMPS-Admin header" in refusals[4]
    assert "unknown Host" in refusals[5] and "GET /amps/instance.json" in refusals[6]


async def test_401_and_403_are_logged_without_the_password(tmp_path: Path) -> None:
    security = security_xml(
        tmp_path,
        {"alice": "alice-secret-9", "bob": "bob-secret-9"},
        {"alice": {"read": ".*", "write": ".*", "admin": True}, "bob": {"read": ".*"}},
    )
    server = start_instance(tmp_path, "sec", extra=security + ADMIN_XML)
    try:
        port = admin_port(server)
        path = "/amps/administrator/transports/json-tcp/disable"

        def as_user(user: str, password: str) -> int:
            env = {"AMPS_PY_ADMIN_PASSWORD": password}
            url = f"http://127.0.0.1:{port}"
            done = admin_cli(
                "--url", url, "--user", user, "transport", "disable", "json-tcp", env=env
            )
            return done.returncode

        assert await trio.to_thread.run_sync(as_user, "alice", "wrong-guess-1") == 1
        assert await trio.to_thread.run_sync(as_user, "bob", "bob-secret-9") == 1
        status, _, _ = request(port, "GET", "/amps/instance.json")
        assert status == 401
        stream = await trio.open_tcp_stream("127.0.0.1", server.port)  # still listening
        await stream.aclose()
    finally:
        server.stop()
    log = server.log_file.read_text()
    denied = [line for line in log.splitlines() if "20-0001" in line or "07-0051" in line]
    assert len(denied) == 3, denied
    # 401s: logged by the auth gate (which summarises a flood), naming user and path
    assert "20-0001" in denied[0] and "user 'alice' from 127.0.0.1:" in denied[0]
    assert f"(admin API, POST {path})" in denied[0]
    assert "07-0051" in denied[1] and "as user 'bob'" in denied[1] and "(HTTP 403)" in denied[1]
    assert "20-0001" in denied[2] and "user (none given)" in denied[2]
    assert "(admin API, GET /amps/instance.json)" in denied[2]
    assert "wrong-guess-1" not in log and "bob-secret-9" not in log
    assert "Authorization" not in log and "Basic " not in log


def tls_admin_xml(directory: Path) -> str:
    for name in ("server.pem", "server-key.pem"):
        shutil.copy(EXAMPLE / name, directory / name)
    return (
        "<Admin><InetAddr>127.0.0.1:0</InetAddr>"
        f"<Certificate>{directory / 'server.pem'}</Certificate>"
        f"<PrivateKey>{directory / 'server-key.pem'}</PrivateKey></Admin>"
    )


async def test_https_admin_verified_by_the_cli_and_plain_http_refused(tmp_path: Path) -> None:
    server = start_instance(tmp_path, "tlsadmin", extra=tls_admin_xml(tmp_path))
    try:
        port = admin_port(server)
        ca = str(tmp_path / "server.pem")
        assert "admin interface listening on https://127.0.0.1:" in server.log_file.read_text()
        for host in ("127.0.0.1", "localhost"):  # the certificate names both
            url = f"https://{host}:{port}"
            status = admin_cli("--url", url, "--ca-file", ca, "--json", "status")
            assert status.returncode == 0, status.stderr
            assert json.loads(status.stdout)["name"] == "tlsadmin"

        # the publish command's persisted-ack explanation reads it with its --ca-file
        url = f"https://localhost:{port}"
        document = fetch_instance(url, Credentials("", ""), ca)
        assert isinstance(document, dict) and document["name"] == "tlsadmin", document
        refused = fetch_instance(url, Credentials("", ""), None)
        assert isinstance(refused, str) and "does not verify" in refused

        # not verified: the system's CAs do not know the example certificate
        untrusted = admin_cli("--url", f"https://127.0.0.1:{port}", "status")
        assert untrusted.returncode == 2
        assert "certificate that does not verify" in untrusted.stderr
        assert "--ca-file" in untrusted.stderr
        # plain HTTP to the HTTPS port: the connection fails, the instance serves on
        plain = admin_cli("--url", f"http://127.0.0.1:{port}", "status")
        assert plain.returncode == 2 and len(plain.stderr.strip().splitlines()) == 1, plain
        assert "if it is served over HTTPS" in plain.stderr, plain.stderr
        with pytest.raises((http.client.HTTPException, OSError)):
            request(port, "GET", "/amps/instance.json")
        raw = socket.create_connection(("127.0.0.1", port), timeout=10)
        raw.sendall(b"POST /amps/administrator/transports/json-tcp/disable HTTP/1.1\r\n\r\n")
        raw.settimeout(10)
        try:
            answer = raw.recv(4096)
        except OSError:
            answer = b""
        raw.close()
        assert b"200" not in answer

        # the same guard over HTTPS: the Origin must be https://, POST needs the header
        context = ssl.create_default_context(cafile=ca)
        async with open_client(server.uri, "victim") as victim:
            status, _, body = await trio.to_thread.run_sync(
                lambda: request(
                    port,
                    "POST",
                    "/amps/administrator/clients/victim/disconnect",
                    {"Origin": f"http://localhost:{port}", "X-AMPS-Admin": "1"},
                    context=context,
                )
            )
            assert status == 403, body
            done = await trio.to_thread.run_sync(
                lambda: admin_cli(
                    "--url", f"https://localhost:{port}", "--ca-file", ca, "disconnect", "victim"
                )
            )
            assert done.returncode == 0 and "victim: disconnected" in done.stdout, done.stderr
            await wait_until(lambda: None if victim.closed else "victim still connected", 60)
        env = {"AMPS_PY_ADMIN_URL": f"https://127.0.0.1:{port}", "AMPS_PY_ADMIN_CA_FILE": ca}
        again = admin_cli("transport", "disable", "json-tcp", env=env)
        assert again.returncode == 0 and "disabled" in again.stdout, again.stderr
    finally:
        server.stop()


def test_admin_tls_config_errors_name_the_element_and_the_fix(tmp_path: Path) -> None:
    from amps_py.config import ConfigError, parse_config

    def problems(admin: str) -> str:
        xml = (
            "<AMPSConfig><Name>a</Name><Transports><Transport><Name>t</Name><Type>tcp</Type>"
            "<InetAddr>127.0.0.1:0</InetAddr><Protocol>amps</Protocol>"
            f"<MessageType>json</MessageType></Transport></Transports>{admin}</AMPSConfig>"
        )
        with pytest.raises(ConfigError) as info:
            parse_config(xml)
        return str(info.value)

    cert = EXAMPLE / "server.pem"
    missing = problems(
        f"<Admin><InetAddr>1</InetAddr><Certificate>{cert}</Certificate>"
        f"<PrivateKey>{tmp_path}/none.pem</PrivateKey></Admin>"
    )
    assert "AMPSConfig/Admin/PrivateKey" in missing and "does not exist" in missing
    alone = problems(f"<Admin><InetAddr>1</InetAddr><Certificate>{cert}</Certificate></Admin>")
    assert "<Admin> has a <Certificate> but no <PrivateKey>" in alone
    assert "add <PrivateKey>" in alone


def test_embedded_default_admin_is_loopback_and_says_so(tmp_path: Path) -> None:
    served = DefaultServe(tmp_path / "default")
    try:
        port = int(served.ready["transports"]["admin"])
        status, _, _ = request(port, "GET", "/amps/instance.json")
        assert status == 200
        line = next(
            (ln for ln in served.log().splitlines() if "admin interface listening" in ln), ""
        )
        assert f"http://127.0.0.1:{port}" in line, served.log()
        assert "loopback only, no authentication" in line
        assert "X-AMPS-Admin" in line and "config/examples/secure" in line
    finally:
        served.stop()
