"""TLS on the wire: tcps client transports and amps-replication-secure links.

Real instance processes (harness.py, cluster.py) with throwaway certificates from
trustme: a TLS client publishes and subscribes; a plain-TCP client on the TLS port gets
no cleartext and is logged; a replication pair over TLS replicates and its bytes on the
wire (recorded by a tiny relay in the test) never show the payload; a destination that
trusts the wrong CA is refused with reason ``tls``. The client-side failure messages of
the replication link are checked in-process against a trio TLS listener.
"""

from __future__ import annotations

import ssl
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import trio
import trustme
from cluster import Cluster, destination_xml, replication_xml
from harness import ServerProcess, start_instance, wait_until

from amps_py import events
from amps_py.client import BadURI, open_client
from amps_py.config import DestinationConfig, ReplicationTopic, server_ssl_context
from amps_py.protocol import encode_frame
from amps_py.replication import LinkError
from amps_py.replication.dialing import LinkTls

#: A string that must never appear on the wire of a TLS link.
MARKER = "cleartext-marker-5f1c9a"


@dataclass(frozen=True)
class Certs:
    ca: Path  # the CA that issued ``cert``
    cert: Path  # server certificate chain for localhost and 127.0.0.1
    key: Path
    other_ca: Path  # a CA that issued nothing here


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Certs:
    root = tmp_path_factory.mktemp("certs")
    ca, other = trustme.CA(), trustme.CA()
    server = ca.issue_cert("localhost", "127.0.0.1")
    out = Certs(root / "ca.pem", root / "server.pem", root / "server-key.pem", root / "other.pem")
    ca.cert_pem.write_to_path(str(out.ca))
    other.cert_pem.write_to_path(str(out.other_ca))
    for blob in server.cert_chain_pems:
        blob.write_to_path(str(out.cert), append=True)
    server.private_key_pem.write_to_path(str(out.key))
    return out


def tls_transport_xml(port: int, certs: Certs) -> str:
    return (
        "<Transport><Name>json-tls</Name><Type>tcps</Type>"
        f"<InetAddr>127.0.0.1:{port}</InetAddr><Protocol>amps</Protocol>"
        f"<MessageType>json</MessageType><Certificate>{certs.cert}</Certificate>"
        f"<PrivateKey>{certs.key}</PrivateKey></Transport>"
    )


@dataclass
class TlsInstance:
    server: ServerProcess
    port: int  # the tcps transport (server.port is the plain tcp one)

    @property
    def uri(self) -> str:
        return f"tcps://127.0.0.1:{self.port}/amps/json"


@pytest.fixture
def tls_instance(tmp_path: Path, certs: Certs) -> Iterator[TlsInstance]:
    server = start_instance(tmp_path, "tls", extra_transport=tls_transport_xml(0, certs))
    try:
        yield TlsInstance(server, server.ports["json-tls"])
    finally:
        if server.alive:
            server.stop()


def log_text(server: ServerProcess) -> str:
    return server.log_file.read_text(errors="replace") if server.log_file.exists() else ""


# ---------------------------------------------------------------- tcps client transport


async def test_tls_client_publishes_and_subscribes(tls_instance: TlsInstance, certs: Certs) -> None:
    uri = tls_instance.uri
    async with (
        open_client(uri, "tls-sub", ca_file=certs.ca) as subscriber,
        subscriber.subscribe("orders") as sub,
    ):
        async with open_client(uri, "tls-pub", ca_file=certs.ca) as publisher:
            seq = await publisher.publish("orders", b'{"id":1}')
            await publisher.wait_persisted(seq, timeout=10)
        assert (await sub.get(10)).json() == {"id": 1}
    # one journal behind both transports: a plain client replays what came over TLS
    server = tls_instance.server
    async with (
        open_client(server.uri, "plain") as plain,
        plain.subscribe("orders", bookmark="0") as replay,
    ):
        assert (await replay.get(10)).json() == {"id": 1}
    assert f"listening on 127.0.0.1:{tls_instance.port} (TLS, certificate {certs.cert})" in (
        log_text(server)
    )


async def test_tls_client_refuses_an_untrusted_or_misnamed_server(
    tls_instance: TlsInstance, certs: Certs
) -> None:
    with pytest.raises(OSError, match="does not verify against the system's CAs"):
        async with open_client(tls_instance.uri, "no-ca"):
            pass
    with pytest.raises(OSError, match=r"does not verify against CA file .*other\.pem"):
        async with open_client(tls_instance.uri, "wrong-ca", ca_file=certs.other_ca):
            pass
    with pytest.raises(OSError, match=r"for 'amps\.example\.com'"):
        async with open_client(
            tls_instance.uri, "misnamed", ca_file=certs.ca, server_hostname="amps.example.com"
        ):
            pass
    with pytest.raises(BadURI, match="use a tcps:// URI"):
        async with open_client(tls_instance.server.uri, "plain-with-ca", ca_file=certs.ca):
            pass
    # a plain client on the TLS port: the client library says what is wrong
    with pytest.raises(OSError, match="is it a tcps transport"):
        async with open_client(
            f"tcps://127.0.0.1:{tls_instance.server.port}/amps/json", "tls-on-plain", timeout=5
        ):
            pass


async def test_plain_tcp_client_on_the_tls_port_gets_no_cleartext(
    tls_instance: TlsInstance, certs: Certs
) -> None:
    server = tls_instance.server
    stream = await trio.open_tcp_stream("127.0.0.1", tls_instance.port)
    local_port = stream.socket.getsockname()[1]
    await stream.send_all(
        encode_frame({"c": "logon", "cid": "1", "client_name": "plain", "a": "processed"})
    )
    received = b""
    with trio.fail_after(60):  # the server closes the connection; no timeout fires
        try:
            while chunk := await stream.receive_some(65536):
                received += chunk
        except trio.BrokenResourceError:
            pass  # reset by the server: closed all the same
    await stream.aclose()
    # nothing an AMPS client could read: no JSON header, at most a TLS alert record
    assert b"{" not in received and b"ack" not in received, received
    assert received[:1] in (b"", b"\x15"), received

    def logged() -> str | None:
        text = log_text(server)
        wanted = (
            f"{events.TRANSPORT_TLS_HANDSHAKE_FAILED} TLS handshake with 127.0.0.1:{local_port}"
        )
        return None if wanted in text else f"{wanted!r} not yet in {server.log_file}"

    await wait_until(logged, 60)
    line = next(ln for ln in log_text(server).splitlines() if f":{local_port} " in ln)
    assert "on transport json-tls (tcps) failed: the client does not speak TLS" in line
    assert "clients must connect with TLS (a tcps:// URI) and trust the CA of" in line
    # only that connection was closed: the transport still serves TLS clients
    async with open_client(tls_instance.uri, "after", ca_file=certs.ca) as client:
        await client.publish_persisted("orders", b'{"id":2}')
    assert server.alive


def test_cli_publish_and_subscribe_with_ca_file(tls_instance: TlsInstance, certs: Certs) -> None:
    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "amps_py", *args],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )

    published = cli("publish", tls_instance.uri, "orders", '{"id":3}', "--ca-file", str(certs.ca))
    assert published.returncode == 0, published.stderr
    got = cli(
        "subscribe",
        tls_instance.uri,
        "orders",
        "--bookmark",
        "0",
        "--count",
        "1",
        "--raw",
        "--ca-file",
        str(certs.ca),
    )
    assert got.returncode == 0, got.stderr
    assert got.stdout.strip() == '{"id":3}'
    untrusted = cli("publish", tls_instance.uri, "orders", '{"id":4}')
    assert untrusted.returncode == 1
    assert "does not verify" in untrusted.stderr and "--ca-file" in untrusted.stderr


# ---------------------------------------------------------------- replication over TLS


class RecordingRelay:
    """A tiny TCP relay that keeps a copy of every byte it forwards.

    tests/faultproxy.py counts bytes but does not expose them, so the test puts this in
    the link instead: upstream -> relay -> downstream's replication port.
    """

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.to_target = bytearray()
        self.to_source = bytearray()
        self.connections = 0

    @property
    def wire(self) -> bytes:
        return bytes(self.to_target + self.to_source)

    async def serve(self, *, task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED) -> None:
        listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
        async with trio.open_nursery() as nursery:
            await nursery.start(trio.serve_listeners, self._handle, listeners)
            task_status.started(int(listeners[0].socket.getsockname()[1]))

    async def _handle(self, source: trio.SocketStream) -> None:
        self.connections += 1
        try:
            target = await trio.open_tcp_stream("127.0.0.1", self.target_port)
        except OSError:
            await source.aclose()
            return

        async def pump(
            src: trio.SocketStream, dst: trio.SocketStream, copy: bytearray, done: trio.CancelScope
        ) -> None:
            try:
                while data := await src.receive_some(65536):
                    copy.extend(data)
                    await dst.send_all(data)
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                pass
            done.cancel()

        async with source, target, trio.open_nursery() as nursery:
            nursery.start_soon(pump, source, target, self.to_target, nursery.cancel_scope)
            nursery.start_soon(pump, target, source, self.to_source, nursery.cancel_scope)


@pytest.mark.parametrize("secure", [True, False], ids=["tls", "plain-control"])
async def test_replication_pair_over_tls_replicates_and_hides_the_payload(
    cluster: Cluster, certs: Certs, secure: bool
) -> None:
    """The plain run is the control: the same relay does see MARKER on a plain link."""
    cluster.add_instance(
        "B", "g", lambda view: "", replication_tls=(certs.cert, certs.key) if secure else None
    )
    await trio.to_thread.run_sync(cluster.start, "B")  # on port 0: the relay needs its port
    relay = RecordingRelay(cluster.ports("B").replication)
    async with trio.open_nursery() as nursery:
        relay_port = await nursery.start(relay.serve)

        def a_body(view: Any) -> str:
            return replication_xml(
                destination_xml(
                    "B",
                    "g",
                    True,
                    f"127.0.0.1:{relay_port}",
                    exclude=("replicate",),
                    secure=secure,
                    ca_file=certs.ca if secure else None,
                )
            )

        cluster.add_instance("A", "g", a_body, replication_transport=False)
        await trio.to_thread.run_sync(cluster.start_all)  # the relay runs meanwhile
        async with (
            open_client(cluster.uri("B"), "sub-b") as on_b,
            on_b.subscribe("orders") as sub,
            open_client(cluster.uri("A"), "pub-a") as on_a,
        ):
            # sync destination: the persisted ack means B has stored it
            await on_a.publish_persisted("orders", f'{{"secret":"{MARKER}"}}'.encode())
            assert (await sub.get(20)).json() == {"secret": MARKER}

        def counted() -> str | None:  # statistics are rewritten 4 times a second
            d = cluster.server("A").destination("B")
            return None if d["is_connected"] and d["messages_out"] >= 1 else str(d)

        await wait_until(counted, 60)
        nursery.cancel_scope.cancel()

    assert relay.connections >= 1 and len(relay.to_target) > 200
    if secure:
        assert MARKER.encode() not in relay.wire
        assert relay.to_target[:1] == b"\x16"  # a TLS handshake record opens the link
        assert b'"B"' not in relay.wire and b"amps-replication" not in relay.wire
        assert "(amps-replication-secure/amps-replication) listening" in cluster.log("B")
    else:
        assert MARKER.encode() in relay.wire


async def test_destination_trusting_the_wrong_ca_is_refused_with_reason_tls(
    cluster: Cluster, certs: Certs
) -> None:
    cluster.add_instance("B", "g", lambda view: "", replication_tls=(certs.cert, certs.key))

    def a_body(view: Any) -> str:
        return replication_xml(
            destination_xml(
                "B",
                "g",
                False,
                view.addr("B"),
                exclude=("replicate",),
                secure=True,
                ca_file=certs.other_ca,
            )
        )

    cluster.add_instance("A", "g", a_body, replication_transport=False)
    cluster.start_all()

    def refused() -> str | None:
        a, b = cluster.log("A"), cluster.log("B")
        if "failed: tls: the TLS handshake with" not in a:
            return "A has not logged the tls failure yet"
        if events.TRANSPORT_TLS_HANDSHAKE_FAILED not in b:
            return "B has not logged the failed handshake yet"
        return None

    await wait_until(refused, 60)
    line = next(ln for ln in cluster.log("A").splitlines() if "failed: tls:" in ln)
    assert events.REPLICATION_LINK_ERROR in line
    assert f"does not verify against the CA certificates in {certs.other_ca}" in line
    assert "put the CA that issued the peer's certificate into" in line  # the fix

    def reported() -> str | None:  # statistics are rewritten 4 times a second
        d = cluster.server("A").destination("B")
        return None if d["last_error"].startswith("tls: ") and not d["is_connected"] else str(d)

    await wait_until(reported, 60)
    b_line = next(
        ln for ln in cluster.log("B").splitlines() if events.TRANSPORT_TLS_HANDSHAKE_FAILED in ln
    )
    assert "on transport repl (amps-replication-secure) failed: " in b_line
    assert "Destination Transport of Type amps-replication-secure" in b_line  # the fix
    assert "replication from" not in cluster.log("B")  # never accepted


# ------------------------------------------- the replication client side, in-process


def secure_destination(port: int, **tls: Any) -> DestinationConfig:
    return DestinationConfig(
        name="B",
        group=None,
        sync_type="async",
        topics=(ReplicationTopic(None, "json"),),
        inet_addrs=(("127.0.0.1", port),),
        secure=True,
        **tls,
    )


async def tls_failure(
    certs: Certs, config: DestinationConfig, *, plain_peer: bool = False
) -> LinkError:
    """Run LinkTls.wrap against an in-process listener; return its LinkError."""
    context = server_ssl_context(certs.cert, certs.key)

    async def serve(stream: trio.SocketStream) -> None:
        if plain_peer:  # answers in cleartext, like a plain amps-replication listener
            await stream.send_all(b"\x00\x00\x00\x10not tls at all!!")
            await stream.aclose()
            return
        secured = trio.SSLStream(stream, context, server_side=True)
        try:
            await secured.do_handshake()
        except trio.BrokenResourceError:
            pass
        await trio.aclose_forcefully(stream)

    async with trio.open_nursery() as nursery:
        listeners = await nursery.start(trio.serve_tcp, serve, 0)
        port = listeners[0].socket.getsockname()[1]
        host, _ = config.inet_addrs[0]
        config = secure_destination(port, ca_file=config.ca_file, server_name=config.server_name)
        tls = LinkTls(config)
        stream = await trio.open_tcp_stream(host, port)
        try:
            with pytest.raises(LinkError) as info:
                await tls.wrap(stream, host, f"{host}:{port}")
        finally:
            await trio.aclose_forcefully(stream)
            nursery.cancel_scope.cancel()
    assert info.value.reason == "tls"
    return info.value


async def test_secure_link_handshake_succeeds_with_the_right_ca(certs: Certs) -> None:
    context = server_ssl_context(certs.cert, certs.key)
    async with trio.open_nursery() as nursery:

        async def serve(stream: trio.SocketStream) -> None:
            secured = trio.SSLStream(stream, context, server_side=True)
            await secured.send_all(b"hello")
            await secured.aclose()

        listeners = await nursery.start(trio.serve_tcp, serve, 0)
        port = listeners[0].socket.getsockname()[1]
        tls = LinkTls(secure_destination(port, ca_file=certs.ca))
        stream = await trio.open_tcp_stream("127.0.0.1", port)
        try:
            secured = await tls.wrap(stream, "127.0.0.1", f"127.0.0.1:{port}")
            assert secured.transport_stream is stream
            assert await secured.receive_some(5) == b"hello"
            await secured.aclose()
        finally:
            await trio.aclose_forcefully(stream)
            nursery.cancel_scope.cancel()


async def test_secure_link_without_ca_file_names_the_certificate_fix(certs: Certs) -> None:
    error = await tls_failure(certs, secure_destination(0))
    assert "does not verify against the system's default CAs" in error.detail
    assert "set Destination/Transport/Certificate to the PEM file of the CA" in error.detail
    assert "self-signed" in error.detail


async def test_secure_link_with_the_wrong_server_name(certs: Certs) -> None:
    error = await tls_failure(
        certs, secure_destination(0, ca_file=certs.ca, server_name="amps-b.example.com")
    )
    assert "not issued for 'amps-b.example.com'" in error.detail
    assert "set Destination/Transport/ServerName" in error.detail


async def test_secure_link_to_a_plain_listener(certs: Certs) -> None:
    error = await tls_failure(certs, secure_destination(0, ca_file=certs.ca), plain_peer=True)
    assert "a plain amps-replication transport does not speak TLS" in error.detail


def test_tls_context_is_tls12_or_later(certs: Certs) -> None:
    tls = LinkTls(secure_destination(1, ca_file=certs.ca))
    context = tls.context()
    assert context.minimum_version == ssl.TLSVersion.TLSv1_2
    assert context.check_hostname and context.verify_mode == ssl.CERT_REQUIRED
    assert tls.context() is context  # built once
