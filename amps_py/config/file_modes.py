"""Secret files that others may read, and rules files that others may change.

:func:`file_mode_warnings` looks at the files a configuration names and says, in a
sentence naming the file, its mode and the fix, which ones are open to other users of
the machine:

* **secret files** (group or others may read or write them, ``mode & 0o077``): the
  ``PasswordFile`` of every ``amps-password-file`` Authentication (the instance's and
  each transport's: users and password hashes, which an attacker can
  guess against offline), the ``PrivateKey`` of every TLS transport and of the admin
  interface, and the password file of every Destination's Authenticator (a password
  in clear). Fix:
  ``chmod 600 FILE``;
* **rules files** (group or others may write them, ``mode & 0o022``): an
  Entitlement ``RulesFile`` (the instance's or a transport's) is not secret, but
  whoever may change it grants rights. Fix: ``chmod 644 FILE``.

They are warnings, never errors: ``amps-py config check`` prints them (exit status
unchanged) and the instance logs them when it starts. A file that cannot be examined
is left to the loader, which reports it as a problem when it matters.
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from pathlib import Path

from amps_py.config.model import InstanceConfig

__all__ = ["NamedFile", "file_mode_warnings", "named_files"]


@dataclass(frozen=True)
class NamedFile:
    """A file a configuration names: what it is (``PasswordFile of
    AMPSConfig/Authentication``), where it is, and whether it holds a secret."""

    what: str
    path: Path
    secret: bool


def named_files(config: InstanceConfig) -> list[NamedFile]:
    """Every password, key and rules file ``config`` names, each once, secret first."""
    found: list[NamedFile] = []
    if config.authentication.password_file is not None:
        found.append(
            NamedFile(
                "PasswordFile of AMPSConfig/Authentication",
                config.authentication.password_file,
                True,
            )
        )
    for transport in config.transports:
        if transport.private_key is not None:
            found.append(
                NamedFile(f"PrivateKey of transport {transport.name}", transport.private_key, True)
            )
        auth = transport.authentication
        if auth is not None and auth.password_file is not None:
            found.append(
                NamedFile(
                    f"PasswordFile of transport {transport.name}'s Authentication",
                    auth.password_file,
                    True,
                )
            )
        rules = transport.entitlement
        if rules is not None and rules.rules_file is not None:
            found.append(
                NamedFile(
                    f"RulesFile of transport {transport.name}'s Entitlement",
                    rules.rules_file,
                    False,
                )
            )
    if config.admin_tls is not None:
        found.append(NamedFile("PrivateKey of Admin", config.admin_tls.private_key, True))
    for destination in config.replication:
        authenticator = destination.authenticator
        if authenticator is not None and authenticator.password_file is not None:
            found.append(
                NamedFile(
                    f"PasswordFile of Destination {destination.name}'s Authenticator",
                    authenticator.password_file,
                    True,
                )
            )
    if config.entitlement.rules_file is not None:
        found.append(
            NamedFile("RulesFile of AMPSConfig/Entitlement", config.entitlement.rules_file, False)
        )
    seen: set[str] = set()
    unique: list[NamedFile] = []
    for named in found:
        key = os.path.realpath(named.path)
        if key not in seen:
            seen.add(key)
            unique.append(named)
    return unique


def _who(bits: int, *, group: int, other: int) -> str:
    if bits & group and bits & other:
        return "its group and every other user"
    return "its group" if bits & group else "every other user"


def file_mode_warnings(config: InstanceConfig) -> list[str]:
    """What others may do to the files ``config`` names, one sentence per file at
    fault, naming the file, its mode and the ``chmod`` that fixes it (see the module
    doc)."""
    warnings: list[str] = []
    for named in named_files(config):
        try:
            mode = stat.S_IMODE(os.stat(named.path).st_mode)
        except OSError:
            continue
        if named.secret:
            bits = mode & 0o077
            if not bits:
                continue
            may = (
                "read and change"
                if bits & 0o044 and bits & 0o022
                else ("read" if bits & 0o044 else "change")
            )
            who = _who(bits, group=0o070, other=0o007)
            warnings.append(
                f"{named.what} {named.path} has mode {mode:04o}: {who} may {may} it, "
                "and it holds a secret. Fix: chmod 600 "
                f"{named.path} (and make it owned by the user amps-py runs as)"
            )
        else:
            bits = mode & 0o022
            if not bits:
                continue
            who = _who(bits, group=0o020, other=0o002)
            warnings.append(
                f"{named.what} {named.path} has mode {mode:04o}: {who} may change it, and "
                f"so grant any user any right. Fix: chmod 644 {named.path}"
            )
    return warnings
