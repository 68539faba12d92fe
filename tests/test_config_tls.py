"""amps_py.config: TLS transports (tcps, amps-replication-secure) and secure destinations.

Good configurations and the option objects first, then a table of bad configurations in
the style of test_config_errors.py: (config, message fragment, line), each config written
one element per line so that the line can be read off. The certificates are throwaway
ones made by trustme.
"""

from __future__ import annotations

import ssl
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
import trustme
from cryptography.hazmat.primitives import serialization

from amps_py.config import (
    MIN_TLS_VERSION,
    ConfigError,
    DestinationConfig,
    InstanceConfig,
    TransportConfig,
    load_config,
    parse_config,
    server_ssl_context,
)


@dataclass(frozen=True)
class Pki:
    """Files for the tests: a CA, a server certificate (chain) and key, and bad files."""

    ca: Path  # the CA certificate (what a destination trusts)
    cert: Path  # the server certificate chain, issued by ``ca`` for localhost/127.0.0.1
    key: Path  # its private key
    other_key: Path  # the key of another certificate (does not match ``cert``)
    encrypted_key: Path  # ``key`` protected by a passphrase
    damaged_key: Path  # a PEM private key header around garbage
    junk: Path  # not PEM at all
    directory: Path


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    root = tmp_path_factory.mktemp("pki")
    ca = trustme.CA()
    server = ca.issue_cert("localhost", "127.0.0.1")
    other = ca.issue_cert("other.example")
    files = Pki(
        ca=root / "ca.pem",
        cert=root / "server-cert.pem",
        key=root / "server-key.pem",
        other_key=root / "other-key.pem",
        encrypted_key=root / "encrypted-key.pem",
        damaged_key=root / "damaged-key.pem",
        junk=root / "junk.pem",
        directory=root,
    )
    ca.cert_pem.write_to_path(str(files.ca))
    for blob in server.cert_chain_pems:
        blob.write_to_path(str(files.cert), append=True)
    server.private_key_pem.write_to_path(str(files.key))
    other.private_key_pem.write_to_path(str(files.other_key))
    key = serialization.load_pem_private_key(server.private_key_pem.bytes(), None)
    files.encrypted_key.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.BestAvailableEncryption(b"secret"),
        )
    )
    files.damaged_key.write_text(
        "-----BEGIN PRIVATE KEY-----\nbm90IGEga2V5\n-----END PRIVATE KEY-----\n"
    )
    files.junk.write_text("this is not a certificate\n")
    return files


def parse(text: str) -> InstanceConfig:
    return parse_config(text, source="tls.xml", environ={})


# ---------------------------------------------------------------- document builders

JOURNAL = (
    "  <TransactionLog><JournalDirectory>./data</JournalDirectory>"
    "<Topic><Name>.*</Name><MessageType>json</MessageType></Topic></TransactionLog>"
)


def listener_doc(kind: str, *children: str) -> str:
    """One listener of Type ``kind``; its children start on line 9, one per line."""
    return "\n".join(
        [
            "<AMPSConfig>",  # 1
            "  <Name>amps-1</Name>",  # 2
            JOURNAL,  # 3
            "  <Transports>",  # 4
            "    <Transport>",  # 5
            "      <Name>secure</Name>",  # 6
            f"      <Type>{kind}</Type>",  # 7
            "      <InetAddr>127.0.0.1:9443</InetAddr>",  # 8
            *(f"      {c}" for c in children),  # 9...
            "    </Transport>",
            "  </Transports>",
            "</AMPSConfig>",
        ]
    )


def files(pki: Pki, cert: Path | None = None, key: Path | None = None) -> tuple[str, str]:
    """The Certificate and PrivateKey lines (lines 9 and 10 in listener_doc)."""
    return (
        f"<Certificate>{cert or pki.cert}</Certificate>",
        f"<PrivateKey>{key or pki.key}</PrivateKey>",
    )


def destination_doc(kind: str, *children: str) -> str:
    """A destination whose Transport children start on line 16, one per line."""
    return "\n".join(
        [
            "<AMPSConfig>",  # 1
            "  <Name>amps-a</Name>",  # 2
            JOURNAL,  # 3
            "  <Transports>",  # 4
            "    <Transport><Name>json-tcp</Name><Type>tcp</Type>"
            "<InetAddr>127.0.0.1:9107</InetAddr></Transport>",  # 5
            "  </Transports>",  # 6
            "  <Replication>",  # 7
            "    <Destination>",  # 8
            "      <Name>amps-b</Name>",  # 9
            "      <SyncType>sync</SyncType>",  # 10
            "      <Topic><MessageType>json</MessageType></Topic>",  # 11
            "      <Transport>",  # 12
            f"        <Type>{kind}</Type>",  # 13
            "        <InetAddr>amps-b.example.com:9204</InetAddr>",  # 14
            "        <ReconnectTimeout>1s</ReconnectTimeout>",  # 15
            *(f"        {c}" for c in children),  # 16...
            "      </Transport>",
            "    </Destination>",
            "  </Replication>",
            "</AMPSConfig>",
        ]
    )


# ------------------------------------------------------------------ good configurations


def test_tcps_listener_with_certificate_key_and_ciphers(pki: Pki) -> None:
    cfg = parse(listener_doc("tcps", *files(pki), "<Ciphers>ECDHE+AESGCM</Ciphers>"))
    (transport,) = cfg.transports
    assert transport == TransportConfig(
        name="secure",
        type="tcps",
        host="127.0.0.1",
        port=9443,
        protocol="amps",
        message_type=None,
        certificate=pki.cert,
        private_key=pki.key,
        ciphers="ECDHE+AESGCM",
    )
    assert transport.secure and not transport.is_replication
    assert cfg.client_transports == (transport,)
    assert cfg.replication_transport is None
    context = transport.ssl_context()
    assert context is not None
    assert context.minimum_version == MIN_TLS_VERSION == ssl.TLSVersion.TLSv1_2
    assert context.verify_mode == ssl.CERT_NONE  # no client certificates (yet)


def test_plain_transports_have_no_tls(pki: Pki) -> None:
    (transport,) = parse(listener_doc("tcp")).transports
    assert (transport.certificate, transport.private_key, transport.ciphers) == (None,) * 3
    assert not transport.secure
    assert transport.ssl_context() is None


def test_secure_replication_listener_is_the_replication_transport(pki: Pki) -> None:
    cfg = parse(listener_doc("amps-replication-secure", *files(pki)))
    (transport,) = cfg.transports
    assert cfg.replication_transport == transport
    assert cfg.client_transports == ()
    assert transport.is_replication and transport.secure
    assert transport.protocol == "amps-replication"  # the same framing inside TLS
    assert transport.certificate == pki.cert


def test_secure_listener_accepts_destinations_without_transport(pki: Pki) -> None:
    """A Destination with no Transport waits for the peer: a secure listener will do."""
    text = listener_doc("amps-replication-secure", *files(pki)).replace(
        "</AMPSConfig>",
        "<Replication><Destination><Name>amps-b</Name><SyncType>async</SyncType>"
        "<Topic><MessageType>json</MessageType></Topic></Destination></Replication>"
        "</AMPSConfig>",
    )
    (dest,) = parse(text).replication
    assert dest.inet_addrs == () and not dest.secure


def test_secure_destination_options(pki: Pki) -> None:
    cfg = parse(
        destination_doc(
            "amps-replication-secure",
            f"<Certificate>{pki.ca}</Certificate>",
            "<ServerName>amps-b.internal</ServerName>",
        )
    )
    (dest,) = cfg.replication
    assert dest.secure
    assert dest.ca_file == pki.ca
    assert dest.server_name == "amps-b.internal"
    assert dest.inet_addrs == (("amps-b.example.com", 9204),)


def test_secure_destination_defaults_to_system_cas_and_inetaddr_host() -> None:
    (dest,) = parse(destination_doc("amps-replication-secure")).replication
    assert (dest.secure, dest.ca_file, dest.server_name) == (True, None, None)
    (plain,) = parse(destination_doc("amps-replication")).replication
    assert (plain.secure, plain.ca_file, plain.server_name) == (False, None, None)
    assert DestinationConfig("b", None, "sync", ()).secure is False  # the default


def test_server_name_may_be_an_ip_address() -> None:
    text = destination_doc("amps-replication-secure", "<ServerName>10.1.2.3</ServerName>")
    assert parse(text).replication[0].server_name == "10.1.2.3"


def test_paths_relative_to_the_config_directory(pki: Pki, tmp_path: Path) -> None:
    """${AMPS_CONFIG_DIRECTORY} names files beside the config, wherever amps-py runs."""
    (tmp_path / "server-cert.pem").write_bytes(pki.cert.read_bytes())
    (tmp_path / "server-key.pem").write_bytes(pki.key.read_bytes())
    path = tmp_path / "amps.xml"
    path.write_text(
        listener_doc(
            "tcps",
            "<Certificate>${AMPS_CONFIG_DIRECTORY}/server-cert.pem</Certificate>",
            "<PrivateKey>${AMPS_CONFIG_DIRECTORY}/server-key.pem</PrivateKey>",
        )
    )
    (transport,) = load_config(path, environ={}).transports
    assert transport.certificate == tmp_path / "server-cert.pem"


def test_server_ssl_context_refuses_an_encrypted_key_without_prompting(pki: Pki) -> None:
    with pytest.raises(ValueError, match="passphrase"):
        server_ssl_context(pki.cert, pki.encrypted_key)


# ------------------------------------------------------------------ bad configurations


@dataclass(frozen=True)
class Case:
    id: str
    text: Callable[[Pki], str]
    fragment: str  # must appear in str(problem)
    line: int
    count: int = 1  # problems expected in total


CASES = [
    Case(
        "tcps without Certificate",
        lambda p: listener_doc("tcps", f"<PrivateKey>{p.key}</PrivateKey>"),
        "Type tcps needs a <Certificate>: the PEM certificate chain file",
        7,
    ),
    Case(
        "tcps without PrivateKey",
        lambda p: listener_doc("tcps", f"<Certificate>{p.cert}</Certificate>"),
        "Type tcps needs a <PrivateKey>",
        7,
    ),
    Case(
        "amps-replication-secure without either",
        lambda p: listener_doc("amps-replication-secure"),
        "or set <Type>amps-replication</Type> for unencrypted connections",
        7,
        count=2,
    ),
    Case(
        "Certificate file does not exist",
        lambda p: listener_doc("tcps", *files(p, cert=p.directory / "missing.pem")),
        "Certificate file '{dir}/missing.pem' does not exist",
        9,
    ),
    Case(
        "relative path names the working directory it was looked for in",
        lambda p: listener_doc("tcps", *files(p, key=Path("no-such-key.pem"))),
        "PrivateKey file 'no-such-key.pem' does not exist (looked for in",
        10,
    ),
    Case(
        "Certificate is a directory",
        lambda p: listener_doc("tcps", *files(p, cert=p.directory)),
        "Certificate '{dir}' is a directory, not a file",
        9,
    ),
    Case(
        "key does not match the certificate",
        lambda p: listener_doc("tcps", *files(p, key=p.other_key)),
        "PrivateKey '{dir}/other-key.pem' is not the key of Certificate "
        "'{dir}/server-cert.pem' (line 9)",
        10,
    ),
    Case(
        "Certificate and PrivateKey swapped",
        lambda p: listener_doc("tcps", *files(p, cert=p.key, key=p.cert)),
        "holds no PEM certificate (it holds a private key: are Certificate and "
        "PrivateKey swapped?)",
        9,
        count=2,
    ),
    Case(
        "Certificate is not PEM",
        lambda p: listener_doc("tcps", *files(p, cert=p.junk)),
        "Certificate file '{dir}/junk.pem' holds no PEM certificate",
        9,
    ),
    Case(
        "passphrase-protected key",
        lambda p: listener_doc("tcps", *files(p, key=p.encrypted_key)),
        "is protected by a passphrase, which amps-py cannot prompt for",
        10,
    ),
    Case(
        "damaged key",
        lambda p: listener_doc("tcps", *files(p, key=p.damaged_key)),
        "PrivateKey file '{dir}/damaged-key.pem' is damaged or of an unsupported kind",
        10,
    ),
    Case(
        "Ciphers selecting nothing",
        lambda p: listener_doc("tcps", *files(p), "<Ciphers>NO-SUCH-CIPHER</Ciphers>"),
        "Ciphers 'NO-SUCH-CIPHER' selects no cipher",
        11,
    ),
    Case(
        "Certificate on a plain tcp transport",
        lambda p: listener_doc("tcp", f"<Certificate>{p.cert}</Certificate>"),
        "<Certificate> only applies to TLS transports (Type tcps or amps-replication-secure), "
        "and this transport's Type is tcp. Fix: remove <Certificate>, or set <Type>tcps</Type>",
        9,
    ),
    Case(
        "Ciphers on a plain amps-replication transport",
        lambda p: listener_doc("amps-replication", "<Ciphers>HIGH</Ciphers>"),
        "set <Type>amps-replication-secure</Type> to accept TLS connections",
        9,
    ),
    Case(
        "a secure and a plain replication listener",
        lambda p: listener_doc("amps-replication-secure", *files(p)).replace(
            "  </Transports>",
            "    <Transport><Name>repl</Name><Type>amps-replication</Type>"
            "<InetAddr>9104</InetAddr></Transport>\n  </Transports>",
        ),
        "an instance has at most one amps-replication transport, and transport 'secure' "
        "on line 5 already is one (amps-replication and amps-replication-secure count "
        "together)",
        12,
    ),
    Case(
        "secure replication listener without a TransactionLog",
        lambda p: listener_doc("amps-replication-secure", *files(p)).replace(JOURNAL + "\n", ""),
        "the amps-replication transport stores what upstream instances send in the "
        "transaction log, but this instance has no <TransactionLog>",
        4,
    ),
    Case(
        "destination CA file does not exist",
        lambda p: destination_doc(
            "amps-replication-secure", f"<Certificate>{p.directory}/nope.pem</Certificate>"
        ),
        "Certificate file '{dir}/nope.pem' does not exist",
        16,
    ),
    Case(
        "destination CA file holds a key, not a certificate",
        lambda p: destination_doc("amps-replication-secure", f"<Certificate>{p.key}</Certificate>"),
        "holds no PEM certificate (it holds a private key",
        16,
    ),
    Case(
        "ServerName that is no host name",
        lambda p: destination_doc("amps-replication-secure", "<ServerName>amps_b!</ServerName>"),
        "ServerName 'amps_b!' is not a host name or IP address",
        16,
    ),
    Case(
        "ServerName on a plain destination",
        lambda p: destination_doc("amps-replication", "<ServerName>amps-b</ServerName>"),
        "<ServerName> only applies to TLS links (Type amps-replication-secure), and this "
        "Transport's Type is amps-replication",
        16,
    ),
    Case(
        "ServerName given twice",
        lambda p: destination_doc(
            "amps-replication-secure", "<ServerName>a</ServerName>", "<ServerName>b</ServerName>"
        ),
        "<ServerName> is given more than once",
        17,
    ),
    Case(
        "client certificates (PrivateKey) are not supported yet",
        lambda p: destination_doc("amps-replication-secure", f"<PrivateKey>{p.key}</PrivateKey>"),
        "<PrivateKey> is a recognised AMPS element, not supported by amps-py yet",
        16,
    ),
    Case(
        "tcps listener options do not belong in a destination",
        lambda p: destination_doc("amps-replication-secure", "<Ciphers>HIGH</Ciphers>"),
        "<Ciphers> is a recognised AMPS element, not supported by amps-py yet",
        16,
    ),
]


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_bad_tls_config(case: Case, pki: Pki) -> None:
    with pytest.raises(ConfigError) as info:
        parse(case.text(pki))
    problems = info.value.problems
    assert len(problems) == case.count, str(info.value)
    fragment = case.fragment.format(dir=pki.directory)
    problem = next((p for p in problems if fragment in str(p)), None)
    assert problem is not None, f"{fragment!r} not in:\n{info.value}"
    assert problem.line == case.line, str(problem)
    text = str(problem)
    assert text.startswith(f"tls.xml:{case.line}: ")
    assert problem.element and problem.fix and " Fix: " in text


def test_unreadable_certificate(pki: Pki, monkeypatch: pytest.MonkeyPatch) -> None:
    """Permission denied is reported with the fix (simulated: tests may run as root)."""
    real = Path.read_bytes

    def read_bytes(self: Path) -> bytes:
        if self == pki.cert:
            raise PermissionError(13, "Permission denied", str(self))
        return real(self)

    monkeypatch.setattr(Path, "read_bytes", read_bytes)
    with pytest.raises(ConfigError) as info:
        parse(listener_doc("tcps", *files(pki)))
    (problem,) = info.value.problems
    assert problem.line == 9
    assert f"Certificate file '{pki.cert}' cannot be read: permission denied" in str(problem)
    assert "readable by the user that runs amps-py" in problem.fix


def test_every_problem_of_a_file_is_reported_at_once(pki: Pki) -> None:
    text = listener_doc("tcps", *files(pki, cert=pki.junk, key=pki.directory / "gone.pem"))
    with pytest.raises(ConfigError) as info:
        parse(text)
    assert [p.line for p in info.value.problems] == [9, 10]


def test_config_check_cli_reports_a_mismatched_key(pki: Pki, tmp_path: Path) -> None:
    from click.testing import CliRunner

    from amps_py.cli import main

    path = tmp_path / "amps.xml"
    path.write_text(listener_doc("tcps", *files(pki, key=pki.other_key)))
    result = CliRunner().invoke(main, ["config", "check", str(path)])
    assert result.exit_code == 2
    assert f"{path}:10: " in result.output
    assert "is not the key of Certificate" in result.output
