"""Authentication and entitlement: who may log on, and what they may read and write.

Pure code (no trio, no sockets): the server asks an :class:`Authenticator` whether a
logon's credentials are good and an :class:`Entitler` whether a user may use a topic.
Both are chosen in the config (``AMPSConfig/Authentication/Module`` and
``AMPSConfig/Entitlement/Module``) and built with :func:`open_authenticator` and
:func:`open_entitler`.

Authentication modules:

* ``amps-default-authentication-module`` (AMPS's default): everyone may log on; the
  logon ack says ``authentication disabled``.
* ``amps-password-file`` (amps-py's own): users and scrypt password hashes are read
  from ``Options/PasswordFile``.

Password file format, one user per line (``#`` comments and blank lines are ignored)::

    alice:scrypt$16384$8$1$<salt, base64>$<hash, base64>

``<n>$<r>$<p>`` are the scrypt cost parameters the hash was made with, so they can be
raised later without invalidating old hashes. User names cannot contain ``:`` or
whitespace. ``amps-py users add|remove|list FILE`` maintains the file.

Entitlement modules:

* ``amps-default-entitlement-module`` (AMPS's default): every user may do everything.
* ``amps-rule-entitlement`` (amps-py's own): rights per user from the JSON file named by
  ``Options/RulesFile``.

Rules file format: a JSON object whose keys are user names, plus optionally ``"*"`` for
every user that is not listed (a user with no entry and no ``"*"`` may do nothing)::

    {
      "alice": {"read": "orders|prices", "write": "orders"},
      "ops":   {"read": ".*", "write": ".*", "admin": true, "replication_logon": true},
      "*":     {"read": "public\\\\..*"}
    }

``read`` (subscribe, sow, replay) and ``write`` (publish, delta_publish, sow_delete)
are Python regular expressions matched against the *whole* topic. Reads are decided
per concrete topic: a subscription, SOW query or replay with a regex topic (``.*``,
``public\\..*|orders``) is accepted when the user may read some topic, and delivers
only the topics whose names the ``read`` rule matches; its pattern text is never
checked against the rule. A missing ``read``/``write`` allows nothing.
``replication_logon`` and ``admin`` (booleans, default false) are recorded for the
replication and admin interfaces.
"""

from __future__ import annotations

import base64
import binascii
import functools
import hashlib
import hmac
import json
import os
import re
import secrets
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final, Protocol, TypeVar

__all__ = [
    "AUTHENTICATION_MODULES",
    "DEFAULT_AUTHENTICATION_MODULE",
    "DEFAULT_ENTITLEMENT_MODULE",
    "ENTITLEMENT_MODULES",
    "PASSWORD_FILE_MODULE",
    "RULE_ENTITLEMENT_MODULE",
    "AllowAllAuthenticator",
    "AllowAllEntitler",
    "AuthFileError",
    "AuthResult",
    "Authenticator",
    "EntitlementRules",
    "Entitler",
    "PasswordFile",
    "PasswordFileAuthenticator",
    "RuleEntitler",
    "UserRights",
    "hash_password",
    "open_authenticator",
    "open_entitler",
    "verify_password",
]

DEFAULT_AUTHENTICATION_MODULE: Final = "amps-default-authentication-module"
PASSWORD_FILE_MODULE: Final = "amps-password-file"
AUTHENTICATION_MODULES: Final = (DEFAULT_AUTHENTICATION_MODULE, PASSWORD_FILE_MODULE)
DEFAULT_ENTITLEMENT_MODULE: Final = "amps-default-entitlement-module"
RULE_ENTITLEMENT_MODULE: Final = "amps-rule-entitlement"
ENTITLEMENT_MODULES: Final = (DEFAULT_ENTITLEMENT_MODULE, RULE_ENTITLEMENT_MODULE)

#: scrypt cost n=2**14, r=8, p=1: about 16 MiB and a few tens of ms per check, the
#: parameters the Python docs and RFC 7914 suggest for interactive logons.
SCRYPT_N: Final = 2**14
SCRYPT_R: Final = 8
SCRYPT_P: Final = 1
SALT_BYTES: Final = 16
HASH_BYTES: Final = 32
#: hashes with larger parameters are refused when loaded: one logon must not be able
#: to make the server allocate gigabytes
MAX_SCRYPT_MEMORY: Final = 256 * 1024**2

_USER = re.compile(r"[^\s:]+")


class AuthFileError(Exception):
    """A password or rules file that cannot be used.

    Attributes:
        path: the file.
        line: 1-based line of the problem, or ``None`` for the file as a whole.
        message: what is wrong.
        fix: how to make it right.
    """

    def __init__(self, path: str, line: int | None, message: str, fix: str) -> None:
        where = path if line is None else f"{path}:{line}"
        super().__init__(f"{where}: {message}. Fix: {fix}")
        self.path = path
        self.line = line
        self.message = message
        self.fix = fix


@dataclass(frozen=True)
class _AuthFileKind:
    """What :func:`_load_auth_file` says about one kind of file it cannot read."""

    noun: str
    #: the fix when the file does not exist
    create: str
    #: the fix when the file is not UTF-8 text
    rewrite: str


_PASSWORD_FILE: Final = _AuthFileKind(
    "password file",
    create="create it with `amps-py users add FILE USER`, or correct the path",
    rewrite="recreate it with amps-py users",
)
_RULES_FILE: Final = _AuthFileKind(
    "rules file",
    create='create it, e.g. {"alice": {"read": ".*", "write": "orders"}}, or correct the path',
    rewrite="save it as UTF-8 JSON",
)
_Parsed = TypeVar("_Parsed")


def _load_auth_file(
    path: str | os.PathLike[str], kind: _AuthFileKind, parse: Callable[[str, str], _Parsed]
) -> _Parsed:
    """Read ``path`` as UTF-8 text and return ``parse(text, str(path))``.

    ``parse`` checks the content and raises :class:`AuthFileError` naming the line of a
    problem; this function reports the file as a whole.

    Raises:
        AuthFileError: the file does not exist, is not UTF-8 text or cannot be read
            (the error names the file and says how to fix it), or ``parse``'s errors.
    """
    name = str(path)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise AuthFileError(name, None, f"the {kind.noun} does not exist", kind.create) from None
    except UnicodeDecodeError:
        problem = f"the {kind.noun} is not UTF-8 text"
        raise AuthFileError(name, None, problem, kind.rewrite) from None
    except OSError as exc:
        raise AuthFileError(
            name,
            None,
            f"the {kind.noun} cannot be read: {exc.strerror or exc}",
            "check the path and make the file readable by the user that runs amps-py",
        ) from None
    return parse(text, name)


# ------------------------------------------------------------------------ passwords


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def _scrypt_memory(n: int, r: int, p: int) -> int:
    return 128 * r * (n + p + 2)


def hash_password(
    password: str,
    *,
    n: int = SCRYPT_N,
    r: int = SCRYPT_R,
    p: int = SCRYPT_P,
    salt: bytes | None = None,
) -> str:
    """The password-file form of ``password``: ``scrypt$<n>$<r>$<p>$<salt>$<hash>``.

    Args:
        password: the clear-text password (UTF-8 encoded before hashing).
        n, r, p: scrypt cost parameters (``n`` a power of two above 1).
        salt: for tests only; a fresh random salt is used by default.
    """
    if n < 2 or n & (n - 1):
        raise ValueError(f"`n` must be a power of two above 1, got {n}")
    salt = secrets.token_bytes(SALT_BYTES) if salt is None else salt
    digest = hashlib.scrypt(
        password.encode("utf-8"),
        salt=salt,
        n=n,
        r=r,
        p=p,
        maxmem=_scrypt_memory(n, r, p) + 1024**2,
        dklen=HASH_BYTES,
    )
    return f"scrypt${n}${r}${p}${_b64(salt)}${_b64(digest)}"


@dataclass(frozen=True)
class _Hash:
    n: int
    r: int
    p: int
    salt: bytes
    digest: bytes


def _parse_hash(encoded: str) -> _Hash:
    """Split an encoded hash; ValueError with the reason when it is malformed."""
    parts = encoded.split("$")
    if len(parts) != 6 or parts[0] != "scrypt":
        raise ValueError("the hash must look like scrypt$<n>$<r>$<p>$<salt>$<hash>")
    try:
        n, r, p = (int(x) for x in parts[1:4])
    except ValueError:
        raise ValueError("scrypt n, r and p must be whole numbers") from None
    if n < 2 or n & (n - 1) or r < 1 or p < 1:
        raise ValueError("scrypt n must be a power of two above 1, r and p at least 1")
    if _scrypt_memory(n, r, p) > MAX_SCRYPT_MEMORY:
        raise ValueError(
            f"scrypt parameters n={n} r={r} p={p} need more than "
            f"{MAX_SCRYPT_MEMORY // 1024**2} MiB per check"
        )
    try:
        salt = base64.b64decode(parts[4], validate=True)
        digest = base64.b64decode(parts[5], validate=True)
    except (binascii.Error, ValueError):
        raise ValueError("the salt and hash must be base64") from None
    if not salt or not digest:
        raise ValueError("the salt and hash must not be empty")
    return _Hash(n, r, p, salt, digest)


def verify_password(password: str, encoded: str) -> bool:
    """Whether ``password`` matches ``encoded`` (constant-time compare; False if malformed)."""
    try:
        h = _parse_hash(encoded)
    except ValueError:
        return False
    digest = hashlib.scrypt(
        password.encode("utf-8"),
        salt=h.salt,
        n=h.n,
        r=h.r,
        p=h.p,
        maxmem=_scrypt_memory(h.n, h.r, h.p) + 1024**2,
        dklen=len(h.digest),
    )
    return hmac.compare_digest(digest, h.digest)


@functools.cache
def _dummy_hash() -> str:
    """Checked against for unknown users, so that "no such user" takes as long as "wrong
    password" and the timing does not reveal which user names exist."""
    return hash_password("", salt=b"\0" * SALT_BYTES)


@dataclass(frozen=True)
class PasswordFile:
    """The users of a password file and their hashes (immutable; edits return copies)."""

    path: str
    entries: Mapping[str, str] = field(default_factory=dict)

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> PasswordFile:
        """Read and check a password file.

        Raises:
            AuthFileError: the file cannot be read, or a line is malformed (the error
                names the line).
        """
        return _load_auth_file(path, _PASSWORD_FILE, cls.parse)

    @classmethod
    def parse(cls, text: str, path: str = "<string>") -> PasswordFile:
        """Parse password-file text (see the module docstring for the format)."""
        entries: dict[str, str] = {}
        first_line: dict[str, int] = {}
        for number, raw in enumerate(text.splitlines(), 1):
            line = raw.strip()
            if not line or line.startswith("#"):
                continue
            user, sep, encoded = line.partition(":")
            if not sep or not user:
                raise AuthFileError(
                    path,
                    number,
                    "expected USER:scrypt$<n>$<r>$<p>$<salt>$<hash>",
                    "write one user per line; `amps-py users add FILE USER` writes a valid line",
                )
            if not _USER.fullmatch(user):
                raise AuthFileError(
                    path,
                    number,
                    f"user name {user!r} contains whitespace",
                    "use a user name without spaces or colons",
                )
            if user in entries:
                raise AuthFileError(
                    path,
                    number,
                    f"user {user!r} is listed twice (first on line {first_line[user]})",
                    "keep one line per user",
                )
            try:
                _parse_hash(encoded.strip())
            except ValueError as exc:
                raise AuthFileError(
                    path,
                    number,
                    f"bad password hash for user {user!r}: {exc}",
                    f"set the password again with `amps-py users add FILE {user}`",
                ) from None
            entries[user] = encoded.strip()
            first_line[user] = number
        return cls(path, entries)

    def users(self) -> list[str]:
        """The user names, sorted."""
        return sorted(self.entries)

    def verify(self, user: str, password: str) -> bool:
        """Whether ``user`` exists and ``password`` is theirs (as slow for unknown users)."""
        encoded = self.entries.get(user)
        if encoded is None:
            verify_password(password, _dummy_hash())
            return False
        return verify_password(password, encoded)

    def with_user(self, user: str, password: str) -> PasswordFile:
        """A copy where ``user`` has ``password`` (added, or replaced)."""
        if not _USER.fullmatch(user):
            raise ValueError(f"user name {user!r} must be non-empty, without whitespace or ':'")
        return PasswordFile(self.path, {**self.entries, user: hash_password(password)})

    def without_user(self, user: str) -> PasswordFile:
        """A copy without ``user`` (KeyError when absent)."""
        if user not in self.entries:
            raise KeyError(user)
        return PasswordFile(self.path, {u: h for u, h in self.entries.items() if u != user})

    def dumps(self) -> str:
        return "".join(f"{user}:{self.entries[user]}\n" for user in self.users())

    def save(self, path: str | os.PathLike[str] | None = None) -> None:
        """Write the file atomically, readable by its owner only (mode 0600)."""
        target = Path(self.path if path is None else path)
        tmp = target.with_name(target.name + ".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(self.dumps())
            f.flush()
            os.fsync(f.fileno())
        tmp.replace(target)


# -------------------------------------------------------------------- authenticators


@dataclass(frozen=True)
class AuthResult:
    """The outcome of a logon check; ``reason`` goes into the success ack when set."""

    ok: bool
    reason: str | None = None


class Authenticator(Protocol):
    """Decides whether a logon's credentials are good."""

    @property
    def module(self) -> str:
        """The configured module name (for logs)."""
        ...

    def authenticate(self, user: str, password: str) -> AuthResult: ...


@dataclass(frozen=True)
class AllowAllAuthenticator:
    """``amps-default-authentication-module``: every logon succeeds."""

    module: str = DEFAULT_AUTHENTICATION_MODULE

    def authenticate(self, user: str, password: str) -> AuthResult:
        return AuthResult(True, "authentication disabled")


@dataclass(frozen=True)
class PasswordFileAuthenticator:
    """``amps-password-file``: the user must be in the file and the password right."""

    passwords: PasswordFile
    module: str = PASSWORD_FILE_MODULE

    def authenticate(self, user: str, password: str) -> AuthResult:
        return AuthResult(self.passwords.verify(user, password))


def open_authenticator(
    module: str, password_file: str | os.PathLike[str] | None = None
) -> Authenticator:
    """The authenticator for a configured ``Module`` (its files are read now).

    Raises:
        AuthFileError: the password file is missing or malformed.
        ValueError: an unknown module name.
    """
    if module == DEFAULT_AUTHENTICATION_MODULE:
        return AllowAllAuthenticator()
    if module == PASSWORD_FILE_MODULE:
        if password_file is None:
            raise ValueError(f"{PASSWORD_FILE_MODULE} needs a password file")
        return PasswordFileAuthenticator(PasswordFile.load(password_file))
    raise ValueError(
        f"unknown authentication module {module!r}; use one of {', '.join(AUTHENTICATION_MODULES)}"
    )


# ----------------------------------------------------------------------- entitlement


@dataclass(frozen=True)
class UserRights:
    """What one user may do; ``None`` patterns allow nothing."""

    read: re.Pattern[str] | None = None
    write: re.Pattern[str] | None = None
    replication_logon: bool = False
    admin: bool = False


_NO_RIGHTS: Final = UserRights()
_RULE_KEYS: Final = ("read", "write", "replication_logon", "admin")


def _line_of(text: str, user: str) -> int | None:
    """Best-effort line of a user's entry in the rules file text."""
    needle = json.dumps(user)
    for number, line in enumerate(text.splitlines(), 1):
        if needle in line:
            return number
    return None


@dataclass(frozen=True)
class EntitlementRules:
    """Per-user rights from a rules file (see the module docstring for the format)."""

    path: str
    users: Mapping[str, UserRights] = field(default_factory=dict)

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> EntitlementRules:
        """Read and check a rules file.

        Raises:
            AuthFileError: unreadable, not JSON, or an entry is malformed.
        """
        return _load_auth_file(path, _RULES_FILE, cls.parse)

    @classmethod
    def parse(cls, text: str, path: str = "<string>") -> EntitlementRules:
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise AuthFileError(
                path,
                exc.lineno,
                f"not valid JSON: {exc.msg} (column {exc.colno})",
                "correct the JSON syntax",
            ) from None
        if not isinstance(data, dict):
            raise AuthFileError(
                path,
                1,
                "the rules file must hold a JSON object keyed by user name",
                'write e.g. {"alice": {"read": ".*", "write": "orders"}}',
            )
        users: dict[str, UserRights] = {}
        for user, entry in data.items():
            line = _line_of(text, user)
            if not isinstance(entry, dict):
                raise AuthFileError(
                    path,
                    line,
                    f"the entry of user {user!r} must be an object",
                    'write e.g. {"read": ".*", "write": "orders"}',
                )
            unknown = sorted(set(entry) - set(_RULE_KEYS))
            if unknown:
                raise AuthFileError(
                    path,
                    line,
                    f"user {user!r} has unknown key(s) {', '.join(unknown)}",
                    f"use only {', '.join(_RULE_KEYS)}",
                )
            patterns: dict[str, re.Pattern[str] | None] = {}
            for key in ("read", "write"):
                value = entry.get(key)
                if value is None:
                    patterns[key] = None
                    continue
                if not isinstance(value, str):
                    raise AuthFileError(
                        path,
                        line,
                        f"{key} of user {user!r} must be a string (a topic regex)",
                        f'write e.g. "{key}": "orders|prices"',
                    )
                try:
                    patterns[key] = re.compile(value)
                except re.error as exc:
                    raise AuthFileError(
                        path,
                        line,
                        f"{key} of user {user!r} is not a valid regular expression: {exc}",
                        "correct the regular expression",
                    ) from None
            flags: dict[str, bool] = {}
            for key in ("replication_logon", "admin"):
                value = entry.get(key, False)
                if not isinstance(value, bool):
                    raise AuthFileError(
                        path,
                        line,
                        f"{key} of user {user!r} must be true or false",
                        f'write "{key}": true or leave it out',
                    )
                flags[key] = value
            users[user] = UserRights(
                patterns["read"], patterns["write"], flags["replication_logon"], flags["admin"]
            )
        return cls(path, users)

    def rights(self, user: str) -> UserRights:
        return self.users.get(user) or self.users.get("*") or _NO_RIGHTS


class Entitler(Protocol):
    """Decides what an authenticated user may do."""

    @property
    def module(self) -> str:
        """The configured module name (for logs)."""
        ...

    def can_read(self, user: str, topic: str) -> bool: ...

    def can_write(self, user: str, topic: str) -> bool: ...

    def reads_everything(self, user: str) -> bool:
        """True only when ``can_read`` is true for every topic (topic expressions then
        need no per-topic check)."""
        ...

    def reads_nothing(self, user: str) -> bool:
        """True when ``can_read`` is false for every topic."""
        ...

    def can_replicate(self, user: str) -> bool: ...

    def is_admin(self, user: str) -> bool: ...


@dataclass(frozen=True)
class AllowAllEntitler:
    """``amps-default-entitlement-module``: everything is allowed."""

    module: str = DEFAULT_ENTITLEMENT_MODULE

    def can_read(self, user: str, topic: str) -> bool:
        return True

    def can_write(self, user: str, topic: str) -> bool:
        return True

    def reads_everything(self, user: str) -> bool:
        return True

    def reads_nothing(self, user: str) -> bool:
        return False

    def can_replicate(self, user: str) -> bool:
        return True

    def is_admin(self, user: str) -> bool:
        return True


@dataclass(frozen=True)
class RuleEntitler:
    """``amps-rule-entitlement``: rights from a rules file."""

    rules: EntitlementRules
    module: str = RULE_ENTITLEMENT_MODULE

    def can_read(self, user: str, topic: str) -> bool:
        pattern = self.rules.rights(user).read
        return pattern is not None and pattern.fullmatch(topic) is not None

    def can_write(self, user: str, topic: str) -> bool:
        pattern = self.rules.rights(user).write
        return pattern is not None and pattern.fullmatch(topic) is not None

    def reads_everything(self, user: str) -> bool:
        return False  # whatever the rule's text, each topic is checked against it

    def reads_nothing(self, user: str) -> bool:
        return self.rules.rights(user).read is None

    def can_replicate(self, user: str) -> bool:
        return self.rules.rights(user).replication_logon

    def is_admin(self, user: str) -> bool:
        return self.rules.rights(user).admin


def open_entitler(module: str, rules_file: str | os.PathLike[str] | None = None) -> Entitler:
    """The entitler for a configured ``Module`` (its files are read now).

    Raises:
        AuthFileError: the rules file is missing or malformed.
        ValueError: an unknown module name.
    """
    if module == DEFAULT_ENTITLEMENT_MODULE:
        return AllowAllEntitler()
    if module == RULE_ENTITLEMENT_MODULE:
        if rules_file is None:
            raise ValueError(f"{RULE_ENTITLEMENT_MODULE} needs a rules file")
        return RuleEntitler(EntitlementRules.load(rules_file))
    raise ValueError(
        f"unknown entitlement module {module!r}; use one of {', '.join(ENTITLEMENT_MODULES)}"
    )
