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

#: Destination Transport Authenticator modules: send no credentials (amps-py's own
#: name) / a user and password (amps-py extension) / AMPS's default authenticator,
#: which sends a user name (``User``, else the user the process runs as) and the
#: password of its options, if any
DEFAULT_LINK_AUTHENTICATOR: Final = "amps-default-authenticator"
PASSWORD_LINK_AUTHENTICATOR: Final = "amps-password-authenticator"
AMPS_DEFAULT_LINK_AUTHENTICATOR: Final = "amps-default-authenticator-module"


def process_user(environ: Mapping[str, str] | None = None) -> str:
    """The name of the user this process runs as, as AMPS's default authenticator
    derives it: the system's answer, else ``$USER``; ``""`` when neither is known."""
    try:
        import pwd  # POSIX only

        return pwd.getpwuid(os.geteuid()).pw_name
    except (ImportError, KeyError, AttributeError):  # no pwd, or a uid without an entry
        env = os.environ if environ is None else environ
        return env.get("USER", "")


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
        module: ``amps-default-authenticator`` (send no credentials),
            ``amps-password-authenticator`` (send ``username`` and a password), or
            ``amps-default-authenticator-module`` (AMPS's default: send ``username``,
            else the user this process runs as, and the password of the one source
            set, else an empty password).
        username: the user to log on as (``Options/Username`` of the password module,
            ``Options/User`` of AMPS's default module, where ``None`` means the
            process's user).
        password: the literal password (``Options/Password``), or ``None``.
        password_file: a file whose first line is the password, read at each connect
            (``PasswordFile``, or ``PasswordFileName`` of AMPS's default module).
        password_env: an environment variable holding the password, read at each
            connect (``PasswordEnv``, or ``PasswordEnvironmentVariable``). Exactly one
            of the three password sources is set for the password module, at most one
            for AMPS's default module, none for ``amps-default-authenticator``.
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
        """(user, password) to send, or ``None`` for ``amps-default-authenticator``.

        AMPS's default module sends its ``User`` (else :func:`process_user`) with the
        password of its source, or an empty password when it has none.

        Raises:
            LinkCredentialsError: the password file cannot be read or is empty, or the
                environment variable is unset.
        """
        if self.module == AMPS_DEFAULT_LINK_AUTHENTICATOR:
            user = self.username if self.username is not None else process_user(environ)
            if self._has_password_source:
                return user, self._password(environ, "PasswordEnvironmentVariable")
            return user, ""
        if self.module != PASSWORD_LINK_AUTHENTICATOR or self.username is None:
            return None
        return self.username, self._password(environ, "PasswordEnv")

    @property
    def _has_password_source(self) -> bool:
        return (self.password, self.password_file, self.password_env) != (None, None, None)

    def _password(self, environ: Mapping[str, str] | None, env_option: str) -> str:
        """The password of the one source set (``env_option``: how the environment
        variable option is spelt in the config, for the error)."""
        if self.password is not None:
            return self.password
        if self.password_file is not None:
            return read_password_file(self.password_file)
        if self.password_env is not None:
            env = os.environ if environ is None else environ
            value = env.get(self.password_env)
            if not value:
                raise LinkCredentialsError(
                    f"environment variable {self.password_env} (Authenticator {env_option}) "
                    "is not set or empty; set it in the environment amps-py runs in"
                )
            return value
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
