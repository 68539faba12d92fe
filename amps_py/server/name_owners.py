"""Which user owns each client name that holds publisher state.

A publisher's client name keys its sequence numbers in the journal: the logon ack
tells whoever logs on with the name the last seq held for it, and a publish whose seq
is not above that is a duplicate. So a name another user could log on with is a way
to lose acknowledged messages (the other user's messages take the seqs; the owner's
next publishes are acknowledged as duplicates and never stored) and to impersonate a
publisher. The rule (docs/GUARANTEES.md, "Security"):

- a name that holds publisher state (the journal has a seq for it) belongs to the user
  who last logged on with it; a logon with it by another user is refused ``not
  entitled``, naming the owner and how to hand the name over;
- a name without publisher state goes to whoever logs on with it (a subscriber's name
  costs nothing to reuse);
- an administrator hands a name over explicitly (``amps-py names give``), or releases
  it so that the next user to log on takes it.

The owners live in a small LMDB environment under the journal directory
(``<JournalDirectory>/client-names``), written synced whenever a name's owner changes
(rare: the first logon of a name, a hand-over), read at each logon; another process
(the ``amps-py names`` command) may change it while the instance runs. At open, names
that hold no publisher state any more are forgotten, so the store is bounded by the
journal's publishers, not by every name that ever logged on.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Final

import lmdb

log = logging.getLogger("amps_py.server")

#: the store's directory under the journal directory
DIRECTORY_NAME: Final = "client-names"
#: enough for millions of names; LMDB grows the file only as it fills
MAP_SIZE: Final = 256 * 1024**2
#: LMDB's longest key; a longer client name is stored under its SHA-256
MAX_KEY_BYTES: Final = 511
#: the prefix of such a key (never forgotten at open: the name is not known)
_HASHED: Final = "#sha256:"


class NameOwnersError(Exception):
    """The client-name store cannot be opened or written; the text names the
    directory and the fix."""


class NameOwners:
    """Client name -> owning user, persistent (see the module docstring)."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        try:
            directory.mkdir(parents=True, exist_ok=True)
            self._env = lmdb.open(
                str(directory),
                map_size=MAP_SIZE,
                subdir=True,
                max_dbs=1,
                sync=True,
                metasync=True,
                readahead=False,
                lock=True,
                max_readers=16,
            )
            self._db = self._env.open_db(b"owners")
        except (OSError, lmdb.Error) as exc:
            raise NameOwnersError(
                f"the client-name store {directory} cannot be opened: {exc}; check that "
                "the journal directory is writable by the user that runs amps-py (the "
                "store can be deleted when the instance is stopped: every name is then "
                "taken by the next user to log on with it)"
            ) from None

    @classmethod
    def of_journal(cls, journal_directory: Path) -> NameOwners:
        return cls(journal_directory / DIRECTORY_NAME)

    def owner(self, name: str) -> str | None:
        """The user who owns ``name``, or None."""
        with self._env.begin(db=self._db) as txn:
            raw = txn.get(_key(name))
        return None if raw is None else bytes(raw).decode("utf-8", "replace")

    def set_owner(self, name: str, user: str) -> None:
        """Make ``user`` the owner of ``name`` (synced before it returns).

        Raises:
            NameOwnersError: the write failed (a full disk, a read-only directory).
        """
        try:
            with self._env.begin(write=True, db=self._db) as txn:
                txn.put(_key(name), user.encode("utf-8"))
        except lmdb.Error as exc:
            raise NameOwnersError(
                f"cannot record that client name {name!r} belongs to user {user!r} in "
                f"{self.directory}: {exc}; free space on its disk or make it writable"
            ) from None

    def release(self, name: str) -> bool:
        """Forget ``name``'s owner (True if it had one)."""
        with self._env.begin(write=True, db=self._db) as txn:
            return bool(txn.delete(_key(name)))

    def items(self) -> Iterator[tuple[str, str]]:
        """Every (name, owner), in name order."""
        with self._env.begin(db=self._db) as txn:
            for key, value in txn.cursor():
                yield bytes(key).decode("utf-8", "replace"), bytes(value).decode(
                    "utf-8", "replace"
                )

    def forget_stateless(self, holds_state: Callable[[str], bool]) -> int:
        """Forget the owners of names for which ``holds_state(name)`` is false (their
        records were all removed, or never written); the count forgotten."""
        stale = [
            name
            for name, _ in self.items()
            if not name.startswith(_HASHED) and not holds_state(name)
        ]
        if stale:
            with self._env.begin(write=True, db=self._db) as txn:
                for name in stale:
                    txn.delete(_key(name))
        return len(stale)

    def close(self) -> None:
        self._env.close()


def _key(name: str) -> bytes:
    """The store's key for ``name``: its UTF-8 bytes, or for a name longer than LMDB
    allows, ``#sha256:`` and its digest (``items`` then lists that form)."""
    raw = name.encode("utf-8", "surrogatepass")
    if not raw:
        raise ValueError("a client name must not be empty")
    if len(raw) <= MAX_KEY_BYTES:
        return raw
    return _HASHED.encode() + hashlib.sha256(raw).hexdigest().encode("ascii")
