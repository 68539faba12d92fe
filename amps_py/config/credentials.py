"""The credentials a replication link logs on with: ``Destination/Transport/Authenticator``.

:class:`LinkAuthenticator` is the option object the loader builds (see
``amps_py.config.access``); :meth:`LinkAuthenticator.credentials` reads the password
(literal, from a file, or from the environment) each time a link connects, and raises
:class:`LinkCredentialsError` when it cannot. Like ``amps_py.config.model``, which
re-exports these names, this module knows nothing of XML and imports no lxml.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Final

#: Destination Transport Authenticator modules: send no credentials / a user and password.
DEFAULT_LINK_AUTHENTICATOR: Final = "amps-default-authenticator"
PASSWORD_LINK_AUTHENTICATOR: Final = "amps-password-authenticator"


class LinkCredentialsError(Exception):
    """The password of a link's Authenticator cannot be read when the link connects
    (its PasswordFile vanished, its PasswordEnv variable is unset); the text says which
    and never contains a password."""


@dataclass(frozen=True, repr=False)
class LinkAuthenticator:
    """A ``Destination/Transport/Authenticator``: what a replication link logs on with.

    The credentials travel in the link's hello, so they are only as private as the
    link's transport: use ``amps-replication-secure`` (TLS) across untrusted networks.
    ``repr()`` never shows the password.

    Attributes:
        module: ``amps-default-authenticator`` (send no credentials) or
            ``amps-password-authenticator`` (send ``username`` and a password).
        username: for the password module: the user to log on as.
        password: the literal password (``Options/Password``), or ``None``.
        password_file: a file whose first line is the password, read at each connect.
        password_env: an environment variable holding the password, read at each
            connect. Exactly one of the three password sources is set for the
            password module; none for the default module.
    """

    module: str = DEFAULT_LINK_AUTHENTICATOR
    username: str | None = None
    password: str | None = None
    password_file: Path | None = None
    password_env: str | None = None

    def __repr__(self) -> str:
        if self.password is not None:
            source = "password='***'"
        elif self.password_file is not None:
            source = f"password_file={str(self.password_file)!r}"
        elif self.password_env is not None:
            source = f"password_env={self.password_env!r}"
        else:
            source = ""
        fields = [f"module={self.module!r}"]
        if self.username is not None:
            fields.append(f"username={self.username!r}")
        if source:
            fields.append(source)
        return f"LinkAuthenticator({', '.join(fields)})"

    def credentials(self, environ: Mapping[str, str] | None = None) -> tuple[str, str] | None:
        """(user, password) to send, or ``None`` for the default module.

        Raises:
            LinkCredentialsError: the password file cannot be read or is empty, or the
                environment variable is unset.
        """
        if self.module != PASSWORD_LINK_AUTHENTICATOR or self.username is None:
            return None
        if self.password is not None:
            return self.username, self.password
        if self.password_file is not None:
            return self.username, read_password_file(self.password_file)
        if self.password_env is not None:
            env = os.environ if environ is None else environ
            value = env.get(self.password_env)
            if not value:
                raise LinkCredentialsError(
                    f"environment variable {self.password_env} (Authenticator PasswordEnv) "
                    "is not set or empty; set it in the environment amps-py runs in"
                )
            return self.username, value
        raise LinkCredentialsError("the Authenticator has no password source")


def read_password_file(path: Path) -> str:
    """The first line of ``path`` without its line ending (the password).

    Raises:
        LinkCredentialsError: unreadable, or the first line is empty.
    """
    try:
        with path.open(encoding="utf-8") as f:
            first = f.readline()
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise LinkCredentialsError(
            f"Authenticator PasswordFile {str(path)!r} cannot be read: {reason}"
        ) from None
    password = first.rstrip("\r\n")
    if not password:
        raise LinkCredentialsError(
            f"the first line of Authenticator PasswordFile {str(path)!r} is empty; "
            "write the password on the first line"
        )
    return password
