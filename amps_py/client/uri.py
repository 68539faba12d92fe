"""AMPS-style connection URIs: ``tcp://[user[:password]@]host:port/amps/json``
(``tcps://`` for TLS)."""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import parse_qs, unquote, urlsplit

from amps_py.redact import redact_uris


class BadURI(ValueError):
    """A URI the client cannot use; the message shows the expected form."""


@dataclass(frozen=True)
class ServerURI:
    scheme: str
    host: str
    port: int
    user: str
    password: str
    protocol: str
    message_type: str
    #: transport compression from the URI's ``?compression=zlib`` ("" for none)
    compression: str = ""

    def __str__(self) -> str:
        return f"{self.scheme}://{self.host}:{self.port}/{self.protocol}/{self.message_type}"

    @property
    def secure(self) -> bool:
        """Whether the connection uses TLS (``tcps://``)."""
        return self.scheme == "tcps"


EXAMPLE = "tcp://127.0.0.1:9007/amps/json"


def parse_uri(text: str) -> ServerURI:
    """Parse a server URI; ``/amps/json`` may be omitted.

    Raises:
        BadURI: naming what is wrong and showing an example.
    """
    parts = urlsplit(text)
    if parts.scheme not in ("tcp", "tcps"):
        raise BadURI(f"{redact_uris(text)!r}: scheme must be tcp:// or tcps://, e.g. {EXAMPLE}")
    try:
        port = parts.port
    except ValueError:
        raise BadURI(
            f"{redact_uris(text)!r}: the port is not a number between 0 and 65535"
        ) from None
    if not parts.hostname or port is None:
        raise BadURI(f"{redact_uris(text)!r}: needs host and port, e.g. {EXAMPLE}")
    path = [p for p in parts.path.split("/") if p]
    protocol = path[0] if path else "amps"
    message_type = path[1] if len(path) > 1 else "json"
    if protocol not in ("amps", "json"):
        raise BadURI(
            f"{redact_uris(text)!r}: protocol {protocol!r} is not supported; use /amps/json"
        )
    compression = parse_qs(parts.query).get("compression", [""])[-1]
    if compression not in ("", "zlib"):
        raise BadURI(
            f"{redact_uris(text)!r}: compression={compression} is not supported; use "
            "compression=zlib or leave it out"
        )
    return ServerURI(
        scheme=parts.scheme,
        host=parts.hostname,
        port=port,
        user=unquote(parts.username or ""),
        password=unquote(parts.password or ""),
        protocol=protocol,
        message_type=message_type,
        compression=compression,
    )
