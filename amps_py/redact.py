"""What may be shown of a value a peer or an operator gave: secrets masked, long text cut.

One rule for every place that echoes a field into a log line, an error, a refusal, a
failure ack or the admin output:

* **Secret fields.** A field whose name :func:`is_secret` is shown as :data:`MASK`,
  whatever its type or length, so neither the value nor its size can be read back.
  The name is lower-cased and stripped of everything but letters and digits
  (``private_key``, ``Private-Key`` and ``PrivateKey`` are the same name); it is
  secret when it is ``pw`` or ``pwd``, or contains one of :data:`SECRET_WORDS`
  (``password``, ``passwd``, ``passphrase``, ``secret``, ``token``, ``credential``,
  ``authorization``, ``cookie``, ``privatekey``, ``apikey``) -- unless it ends with
  ``file``, ``path``, ``env`` or ``dir``: those name *where* a secret is kept
  (``PasswordFile``, ``PasswordEnv``), which is configuration, not the secret. A bare
  ``key`` is not secret (it is the SOW key of a message).
* **Credentials in URIs.** ``scheme://user:password@host`` shows as
  ``scheme://user:[redacted]@host`` (:func:`redact_uris`); the user stays.
* **Length.** An echoed value is cut to :data:`MAX_FIELD_CHARS` characters and a log
  line to :data:`MAX_LINE_CHARS` (:func:`cut`), and the cut says how much went:
  ``... [cut 1048320 chars]``.

Pure functions, no I/O; nothing here imports the rest of amps_py.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Final

__all__ = [
    "MASK",
    "MAX_FIELD_CHARS",
    "MAX_LINE_CHARS",
    "SECRET_WORDS",
    "cut",
    "is_secret",
    "redact_fields",
    "redact_uris",
    "shown",
]

#: what a secret value is shown as (fixed: says nothing of the value's type or length)
MASK: Final = "[redacted]"
#: the longest value of a field echoed into a message or log line, in characters
MAX_FIELD_CHARS: Final = 256
#: the longest log line (its message; a traceback has its own allowance), in characters
MAX_LINE_CHARS: Final = 8 * 1024

#: a field name containing one of these (after :func:`_normalised`) names a secret
SECRET_WORDS: Final = (
    "password",
    "passwd",
    "passphrase",
    "secret",
    "token",
    "credential",
    "authorization",
    "cookie",
    "privatekey",
    "apikey",
)
_SECRET_NAMES: Final = frozenset({"pw", "pwd"})
#: names ending so name where a secret is kept, not the secret
_LOCATION_SUFFIXES: Final = ("file", "path", "env", "dir")
_NOT_ALNUM = re.compile(r"[^0-9a-z]")
#: ``scheme://user:password@``: the password is everything up to the last ``@`` of the
#: authority (a password may hold ``@`` when the URI was written by hand)
_URI_CREDENTIALS = re.compile(
    r"(?P<head>\b[A-Za-z][A-Za-z0-9+.\-]*://[^\s/?#@:]*):(?P<password>[^\s/?#]*)@"
)


def _normalised(name: str) -> str:
    return _NOT_ALNUM.sub("", name.lower())


def is_secret(name: object) -> bool:
    """Whether a field called ``name`` holds a secret (the rule in the module doc)."""
    if not isinstance(name, str):
        return False
    norm = _normalised(name)
    if norm in _SECRET_NAMES:
        return True
    if norm.endswith(_LOCATION_SUFFIXES):
        return False
    return any(word in norm for word in SECRET_WORDS)


def cut(text: str, limit: int = MAX_FIELD_CHARS) -> str:
    """``text`` when it has at most ``limit`` characters, else its first ``limit``
    followed by ``... [cut N chars]`` (N: how many were left out)."""
    if len(text) <= limit:
        return text
    return f"{text[:limit]}... [cut {len(text) - limit} chars]"


def redact_uris(text: str) -> str:
    """``text`` with the password of every ``scheme://user:password@`` replaced by
    :data:`MASK` (the scheme, the user and the rest stay)."""
    if "://" not in text:
        return text
    return _URI_CREDENTIALS.sub(lambda m: f"{m.group('head')}:{MASK}@", text)


def shown(name: object, value: object, limit: int = MAX_FIELD_CHARS) -> object:
    """What may be shown of field ``name``'s ``value``: :data:`MASK` for a secret field;
    a string cut to ``limit`` characters with its URI passwords masked; any other value
    as it is (numbers, booleans and ``None`` are short), lists and objects with their
    secret fields masked (:func:`redact_fields`)."""
    if is_secret(name):
        return MASK
    if isinstance(value, str):
        return cut(redact_uris(value), limit)
    if isinstance(value, Mapping):
        return redact_fields(value, limit)
    if isinstance(value, list | tuple):
        return [shown("", item, limit) for item in value]
    return value


def redact_fields(
    fields: Mapping[object, object], limit: int = MAX_FIELD_CHARS
) -> dict[object, object]:
    """A copy of ``fields`` (a header, a hello, the fields of a log event) whose values
    are what :func:`shown` allows, nested objects included."""
    return {key: shown(key, value, limit) for key, value in fields.items()}
