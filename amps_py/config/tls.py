"""TLS settings: Certificate, PrivateKey and Ciphers of secure transports and of the
admin interface (``Admin``), and the CA file and ServerName of secure replication
destinations, loaded with OpenSSL when the configuration is."""

from __future__ import annotations

import re
import ssl
from collections.abc import Mapping
from pathlib import Path
from typing import Final

from lxml import etree

from amps_py.config.model import (
    REPLICATION_SECURE_TRANSPORT_TYPE,
    REPLICATION_TRANSPORT_TYPE,
    SECURE_TRANSPORT_TYPES,
    ServerTls,
    _PassphraseRequired,
    server_ssl_context,
)
from amps_py.config.problems import _Problems
from amps_py.config.values import _PATH_HINT, _is_host_name, _text
from amps_py.config.xmltree import _first, _line

_TLS_FILE_ELEMENTS: Final = ("Certificate", "PrivateKey", "Ciphers")
_PEM_CERTIFICATE = b"-----BEGIN CERTIFICATE-----"
_PEM_PRIVATE_KEY = re.compile(rb"-----BEGIN (?:[A-Z0-9]+ )*PRIVATE KEY-----")
_PEM_ENCRYPTED = re.compile(rb"-----BEGIN ENCRYPTED PRIVATE KEY-----|Proc-Type: *4, *ENCRYPTED")
_PLAIN_TWIN: Final[Mapping[str, str]] = {
    "tcps": "tcp",
    REPLICATION_SECURE_TRANSPORT_TYPE: REPLICATION_TRANSPORT_TYPE,
}
_SECURE_TWIN: Final[Mapping[str, str]] = {plain: secure for secure, plain in _PLAIN_TWIN.items()}
_EXAMPLE_FILE: Final[Mapping[str, str]] = {
    "Certificate": "server-cert.pem",
    "PrivateKey": "server-key.pem",
}


def _read_tls_file(el: etree._Element, what: str, problems: _Problems) -> tuple[Path, bytes] | None:
    """(path, contents) of a Certificate/PrivateKey file; None (and a problem) if unreadable."""
    text = _text(el, problems)
    if not text:
        return None
    path = Path(text)
    where = "" if path.is_absolute() else f" (looked for in {Path.cwd()})"
    try:
        return path, path.read_bytes()
    except FileNotFoundError:
        problems.add(
            el,
            f"{el.tag} file {text!r} does not exist{where}",
            f"give the path of the {what}; {_PATH_HINT}",
        )
    except IsADirectoryError:
        problems.add(
            el,
            f"{el.tag} {text!r} is a directory, not a file",
            f"give the path of the {what} file itself, not of its directory",
        )
    except PermissionError:
        problems.add(
            el,
            f"{el.tag} file {text!r} cannot be read: permission denied",
            "make the file readable by the user that runs amps-py "
            "(e.g. chown it to that user and chmod 600 it)",
        )
    except OSError as exc:
        problems.add(
            el,
            f"{el.tag} file {text!r} cannot be read: {exc.strerror or exc}",
            "check the path and the file's permissions",
        )
    return None


def _check_certificate_pem(el: etree._Element, data: bytes, problems: _Problems) -> bool:
    if _PEM_CERTIFICATE in data:
        return True
    swapped = (
        " (it holds a private key: are Certificate and PrivateKey swapped?)"
        if _PEM_PRIVATE_KEY.search(data)
        else ""
    )
    problems.add(
        el,
        f"{el.tag} file {_text(el, problems)!r} holds no PEM certificate{swapped}",
        "give a PEM file that starts with -----BEGIN CERTIFICATE----- (convert a DER file "
        "with `openssl x509 -inform der -in cert.der -out cert.pem`)",
    )
    return False


def _check_private_key_pem(el: etree._Element, data: bytes, problems: _Problems) -> bool:
    if _PEM_ENCRYPTED.search(data):
        problems.add(
            el,
            f"PrivateKey file {_text(el, problems)!r} is protected by a passphrase, which "
            "amps-py cannot prompt for",
            "store the key unencrypted (`openssl pkey -in key.pem -out key-plain.pem`) and "
            "protect the file with its permissions (chmod 600)",
        )
        return False
    if _PEM_PRIVATE_KEY.search(data):
        return True
    swapped = (
        " (it holds a certificate: are Certificate and PrivateKey swapped?)"
        if _PEM_CERTIFICATE in data
        else ""
    )
    problems.add(
        el,
        f"PrivateKey file {_text(el, problems)!r} holds no PEM private key{swapped}",
        "give the PEM file of the certificate's private key, which starts with "
        "-----BEGIN PRIVATE KEY----- (or BEGIN RSA/EC PRIVATE KEY)",
    )
    return False


def _check_ciphers(el: etree._Element | None, problems: _Problems) -> str | None:
    """The Ciphers text, or None (and a problem) if OpenSSL selects no cipher from it."""
    text = _text(el, problems)
    if el is None or not text:
        return None
    try:
        ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER).set_ciphers(text)
    except ssl.SSLError:
        problems.add(
            el,
            f"Ciphers {text!r} selects no cipher this OpenSSL ({ssl.OPENSSL_VERSION}) supports",
            "give an OpenSSL cipher string such as ECDHE+AESGCM:ECDHE+CHACHA20 "
            "(`openssl ciphers -v 'STRING'` lists what a string selects), or remove "
            "<Ciphers> to use OpenSSL's defaults",
        )
        return None
    return text


def _transport_tls(
    transport: etree._Element,
    type_el: etree._Element | None,
    kind: str | None,
    problems: _Problems,
) -> tuple[Path | None, Path | None, str | None] | None:
    """(certificate, private key, ciphers) of a Transport; None when something is wrong.

    A secure Type needs Certificate and PrivateKey, which must load together (the same
    check the listener makes when it starts); a plain Type must not have them.
    """
    els = {name: _first(transport, name) for name in _TLS_FILE_ELEMENTS}
    given = [el for el in els.values() if el is not None]
    if kind is None or type_el is None:
        return None
    if kind not in SECURE_TRANSPORT_TYPES:
        for el in given:
            problems.add(
                el,
                f"<{el.tag}> only applies to TLS transports (Type tcps or "
                f"amps-replication-secure), and this transport's Type is {kind}",
                f"remove <{el.tag}>, or set <Type>{_SECURE_TWIN.get(kind, 'tcps')}</Type> "
                "to accept TLS connections",
            )
        return None if given else (None, None, None)

    ok = _check_tls_files_given(els, type_el, kind, problems)
    return _load_server_tls(els, ok, problems)


def _load_server_tls(
    els: Mapping[str, etree._Element | None], ok: bool, problems: _Problems
) -> tuple[Path, Path, str | None] | None:
    """(certificate, private key, ciphers) from the Certificate, PrivateKey and Ciphers
    elements ``els`` of a TLS listener (a Transport, or Admin); None (and problems)
    when a file is missing, unreadable, not PEM, or the pair does not load together.
    ``ok``: whether the caller found the elements complete."""
    cert_el, key_el, ciphers_el = els["Certificate"], els["PrivateKey"], els["Ciphers"]
    ciphers = _check_ciphers(ciphers_el, problems)
    ok &= ciphers_el is None or ciphers is not None
    cert = (
        _read_tls_file(cert_el, "PEM certificate chain file", problems)
        if cert_el is not None
        else None
    )
    key = _read_tls_file(key_el, "PEM private key file", problems) if key_el is not None else None
    if cert is not None and cert_el is not None:
        ok &= _check_certificate_pem(cert_el, cert[1], problems)
    if key is not None and key_el is not None:
        ok &= _check_private_key_pem(key_el, key[1], problems)
    if not ok or cert is None or key is None or cert_el is None or key_el is None:
        return None
    if not _check_key_pair(cert_el, key_el, cert[0], key[0], problems):
        return None
    return cert[0], key[0], ciphers


def _admin_tls(section: etree._Element | None, problems: _Problems) -> ServerTls | None:
    """The TLS settings of ``Admin`` (Certificate, PrivateKey, Ciphers, as on a tcps
    Transport), or None when it has none (plain HTTP) or they are wrong (problems)."""
    if section is None:
        return None
    els = {name: _first(section, name) for name in _TLS_FILE_ELEMENTS}
    if all(el is None for el in els.values()):
        return None
    if els["Certificate"] is None and els["PrivateKey"] is None:  # only Ciphers
        ciphers_el = els["Ciphers"]
        problems.add(
            ciphers_el,
            "<Admin> has <Ciphers> but no <Certificate> and <PrivateKey>: Ciphers only "
            "applies to HTTPS",
            "add <Certificate> and <PrivateKey> inside <Admin> to serve the admin API over "
            "HTTPS, or remove <Ciphers>",
        )
        return None
    ok = True
    for name, other in (("Certificate", "PrivateKey"), ("PrivateKey", "Certificate")):
        if els[name] is None:
            problems.add(
                els[other],
                f"<Admin> has a <{other}> but no <{name}>: serving the admin API over "
                "HTTPS needs both",
                f"add <{name}>/path/to/{_EXAMPLE_FILE[name]}</{name}> inside <Admin>, or "
                f"remove <{other}> to serve plain HTTP",
            )
            ok = False
    loaded = _load_server_tls(els, ok, problems)
    if loaded is None:
        return None
    return ServerTls(certificate=loaded[0], private_key=loaded[1], ciphers=loaded[2])


def _check_tls_files_given(
    els: Mapping[str, etree._Element | None],
    type_el: etree._Element,
    kind: str,
    problems: _Problems,
) -> bool:
    """Whether the secure Type ``kind`` has both its Certificate and its PrivateKey."""
    ok = True
    for name, what in (
        ("Certificate", "PEM certificate chain file (the listener's certificate first)"),
        ("PrivateKey", "PEM private key file of that certificate"),
    ):
        if els[name] is None:
            problems.add(
                type_el,
                f"Type {kind} needs a <{name}>: the {what}",
                f"add <{name}>/path/to/{_EXAMPLE_FILE[name]}</{name}> inside this "
                f"<Transport>, or set <Type>{_PLAIN_TWIN[kind]}</Type> for unencrypted "
                "connections",
            )
            ok = False
    return ok


def _check_key_pair(
    cert_el: etree._Element,
    key_el: etree._Element,
    cert: Path,
    key: Path,
    problems: _Problems,
) -> bool:
    """Whether the certificate and key load together, as the listener will load them."""
    try:
        server_ssl_context(cert, key)
    except _PassphraseRequired as exc:
        problems.add(key_el, f"PrivateKey file {str(key)!r}: {exc}", "store it unencrypted")
        return False
    except ssl.SSLError as exc:
        _report_load_failure(cert_el, key_el, cert, key, exc, problems)
        return False
    except OSError as exc:  # pragma: no cover - the files were readable a moment ago
        problems.add(
            cert_el,
            f"the Certificate and PrivateKey files cannot be loaded: {exc.strerror or exc}",
            "check the paths and the files' permissions",
        )
        return False
    return True


def _report_load_failure(
    cert_el: etree._Element,
    key_el: etree._Element,
    cert: Path,
    key: Path,
    exc: ssl.SSLError,
    problems: _Problems,
) -> None:
    """Say which of Certificate and PrivateKey OpenSSL refused, and why."""
    if exc.reason == "KEY_VALUES_MISMATCH":
        problems.add(
            key_el,
            f"PrivateKey {str(key)!r} is not the key of Certificate {str(cert)!r} "
            f"(line {_line(cert_el)})",
            "give the private key that belongs to the certificate (when they match, "
            "`openssl x509 -noout -pubkey -in CERT` and `openssl pkey -pubout -in KEY` "
            "print the same public key), or the certificate issued for this key",
        )
        return
    try:
        ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT).load_verify_locations(cafile=cert)
    except ssl.SSLError:
        problems.add(
            cert_el,
            f"Certificate file {str(cert)!r} is damaged: OpenSSL cannot load it "
            f"({exc.reason or exc})",
            "re-export the certificate chain in PEM form (`openssl x509 -in CERT -text` "
            "shows whether a certificate is readable)",
        )
        return
    problems.add(
        key_el,
        f"PrivateKey file {str(key)!r} is damaged or of an unsupported kind: OpenSSL "
        f"cannot load it ({exc.reason or exc})",
        "re-export the key in PEM form (`openssl pkey -in KEY -noout` shows whether it is "
        "readable)",
    )


def _destination_tls(
    transport_el: etree._Element | None, problems: _Problems
) -> tuple[bool, Path | None, str | None] | None:
    """(secure, CA file, server name) of a Destination Transport; None on a problem."""
    if transport_el is None:
        return False, None, None
    kind = _text(_first(transport_el, "Type"), problems)
    secure = kind == REPLICATION_SECURE_TRANSPORT_TYPE
    ca_el = _first(transport_el, "Certificate")
    name_el = _first(transport_el, "ServerName")
    if not secure:
        given = [el for el in (ca_el, name_el) if el is not None]
        if kind is not None:
            for el in given:
                problems.add(
                    el,
                    f"<{el.tag}> only applies to TLS links (Type amps-replication-secure), "
                    f"and this Transport's Type is {kind}",
                    f"remove <{el.tag}>, or set <Type>{REPLICATION_SECURE_TRANSPORT_TYPE}"
                    "</Type> to replicate over TLS",
                )
        return None if given else (False, None, None)
    ok = True
    ca_file: Path | None = None
    if ca_el is not None:
        read = _read_tls_file(ca_el, "PEM file of CA certificates", problems)
        ok = read is not None and _check_certificate_pem(ca_el, read[1], problems)
        if ok and read is not None:
            try:
                ssl.create_default_context(cafile=read[0])
            except ssl.SSLError as exc:
                problems.add(
                    ca_el,
                    f"Certificate file {str(read[0])!r} holds no CA certificate OpenSSL "
                    f"can load ({exc.reason or exc})",
                    "give a PEM file of the CA certificates that issued the remote "
                    "instance's certificate (or that certificate itself if it is "
                    "self-signed)",
                )
                ok = False
            else:
                ca_file = read[0]
    server_name = _text(name_el, problems)
    if name_el is not None and server_name is not None and not _is_host_name(server_name):
        problems.add(
            name_el,
            f"ServerName {server_name!r} is not a host name or IP address",
            "give the DNS name (or IP address) the remote instance's certificate is "
            "issued for, e.g. amps-b.example.com; omit ServerName to use the InetAddr host",
        )
        ok = False
    if not ok or (name_el is not None and not server_name):
        return None
    return True, ca_file, server_name
