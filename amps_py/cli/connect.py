"""What the client commands (``publish``, ``subscribe``, ``sow``) share to connect:
their common click options and the URI help, the client name, the credentials from the
flags, the URI and the environment (one set for a whole URI list), what a URI says
about its transport, and :func:`client_errors`, which turns what a command meets into
one ``amps-py:`` line and exit status 1."""

from __future__ import annotations

import contextlib
import os
import socket
from collections.abc import Iterator
from typing import TYPE_CHECKING

import click

from amps_py.cli.common import fail
from amps_py.redact import redact_uris

if TYPE_CHECKING:
    from amps_py.cli.client import Credentials


def client_name_for(name: str | None, role: str) -> str:
    """``name``, or one made up of ``role``, the host and the process id."""
    return name or f"amps-py-{role}-{socket.gethostname()}-{os.getpid()}"


ca_file_option = click.option(
    "--ca-file",
    type=click.Path(dir_okay=False),
    default=None,
    help="For tcps:// URIs: PEM file of the CA that issued the server's certificate "
    "(the certificate itself if self-signed); default: the system's CAs.",
)
URI_HELP = (
    "URI is tcp://HOST:PORT/amps/json, or tcps://... for a TLS transport; publish and "
    "subscribe also take a comma-separated list of equivalent URIs "
    "(tcp://h1:9107/amps/json,tcp://h2:9207/amps/json): they connect to the first that "
    "answers and fail over to the next when it is lost. Credentials: "
    "--user NAME with the password in the environment variable AMPS_PY_PASSWORD "
    "(--password-env names another), or the AMPS form "
    "tcp://USER:PASSWORD@HOST:PORT/amps/json (a password in a URI shows in shell "
    "history and process lists: prefer the variable)."
)
user_option = click.option(
    "--user",
    default=None,
    help="Log on as this user (or give it in the URI: tcp://USER@HOST:PORT/amps/json).",
)
password_env_option = click.option(
    "--password-env",
    default="AMPS_PY_PASSWORD",
    show_default=True,
    metavar="VAR",
    help="Environment variable holding the logon password (there is no password flag: "
    "it would stay in shell history).",
)


def credentials_for(uri: str, user: str | None, password_env: str) -> Credentials:
    """The credentials to log on to ``uri`` with; exits with status 1 (and why) when
    they cannot be had."""
    from amps_py.cli.client import CredentialsError, resolve_credentials
    from amps_py.client import BadURI

    try:
        return resolve_credentials(uri, user, password_env, os.environ)
    except (BadURI, CredentialsError) as exc:
        fail(str(exc))


def uri_list(uri: str, user: str | None, password_env: str) -> tuple[list[str], Credentials]:
    """The URIs of URI (a comma-separated list, or one) and the credentials, which
    every URI must agree on (the HA client logs on with the same ones everywhere)."""
    from amps_py.cli.ha import split_uris
    from amps_py.client import BadURI

    try:
        uris = split_uris(uri)
    except BadURI as exc:
        fail(str(exc))
    found = [credentials_for(u, user, password_env) for u in uris]
    for u, other in zip(uris[1:], found[1:], strict=True):
        if (other.user, other.password) != (found[0].user, found[0].password):
            fail(
                f"{redact_uris(uris[0])} and {redact_uris(u)} log on with different "
                "credentials; the client logs on to every server of the list with the same "
                "ones: give the user with --user (the password in the environment variable) "
                "and none in the URIs"
            )
    return uris, found[0]


class CommandFailed(Exception):
    """A client command failed; the text is the whole line for the user."""


@contextlib.contextmanager
def client_errors(
    credentials: Credentials, client_name: str, password_env: str, topic: str
) -> Iterator[None]:
    """Turn what a client command meets into one line and exit status 1."""
    from amps_py.cli.client import explain_refusal
    from amps_py.cli.ha import StoreMisuse
    from amps_py.client import AMPSError, BadURI, CommandError

    try:
        yield
    except CommandError as exc:
        fail(explain_refusal(exc, credentials, client_name, password_env, topic))
    except (CommandFailed, AMPSError, BadURI, OSError, TimeoutError, StoreMisuse) as exc:
        fail(str(exc))


def uri_message_type(uri: str) -> str:
    """The message type the (first) URI of ``uri`` names (``/amps/fix`` -> ``fix``);
    ``json`` for a URI that does not parse (connecting reports it)."""
    from amps_py.cli.ha import split_uris
    from amps_py.client import BadURI, parse_uri

    try:
        return str(parse_uri(split_uris(uri)[0]).message_type)
    except (BadURI, IndexError):
        return "json"


def json_transport(uri: str) -> bool:
    """Whether the transport of ``uri`` (any of a list) carries json messages (its path
    /amps/json says so); False for a URI that does not parse (reported later)."""
    from amps_py.cli.ha import split_uris
    from amps_py.client import BadURI, parse_uri

    try:
        return any(parse_uri(u).message_type == "json" for u in split_uris(uri))
    except BadURI:
        return False
