"""``amps-py names ...``: which user owns each client name that holds publisher state
(:mod:`amps_py.server.name_owners`), and handing a name over.

The store sits in the journal directory (``<JournalDirectory>/client-names``); these
commands work while the instance runs (the instance reads the owner at each logon).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING

import click

from amps_py import events
from amps_py.cli.common import fail

if TYPE_CHECKING:
    from amps_py.server.name_owners import NameOwners

__all__ = ["names"]

log = logging.getLogger("amps_py.cli")


@click.group()
def names() -> None:
    """Client names and the users that own them (a name that holds publisher state
    belongs to one user; another user's logon with it is refused)."""


def _open(journal_directory: str) -> NameOwners:
    from amps_py.server.name_owners import DIRECTORY_NAME, NameOwners, NameOwnersError

    directory = Path(journal_directory)
    if not directory.is_dir():
        fail(
            f"{journal_directory} is not a directory: give the instance's "
            "TransactionLog/JournalDirectory",
            2,
        )
    if not (directory / DIRECTORY_NAME).is_dir() and not (directory / "data.mdb").exists():
        fail(
            f"{journal_directory} holds no journal: give the instance's "
            "TransactionLog/JournalDirectory",
            2,
        )
    try:
        return NameOwners.of_journal(directory)
    except NameOwnersError as exc:
        fail(str(exc), 1)


@names.command("list")
@click.argument("journal_directory", metavar="JOURNAL_DIR", type=click.Path(file_okay=False))
def names_list(journal_directory: str) -> None:
    """Print each owned client name and its user, tab-separated, in name order."""
    owners = _open(journal_directory)
    try:
        for name, user in owners.items():
            click.echo(f"{name}\t{user}")
    finally:
        owners.close()


@names.command("give")
@click.argument("journal_directory", metavar="JOURNAL_DIR", type=click.Path(file_okay=False))
@click.argument("name")
@click.argument("user")
def names_give(journal_directory: str, name: str, user: str) -> None:
    """Hand client name NAME to USER: USER's next logon with it continues its
    publisher state (the seqs already stored), and the former owner's is refused."""
    from amps_py.server.name_owners import NameOwnersError

    owners = _open(journal_directory)
    try:
        before = owners.owner(name)
        owners.set_owner(name, user)
    except (NameOwnersError, ValueError) as exc:
        fail(str(exc), 1)
    finally:
        owners.close()
    log.info(
        "client name %r handed from %r to %r",
        name,
        before,
        user,
        extra=events.extra(events.NAME_HANDED_OVER),
    )
    click.echo(
        f"client name {name!r}: owner {user!r} (was {before!r})"
        if before is not None
        else f"client name {name!r}: owner {user!r} (had none)"
    )


@names.command("release")
@click.argument("journal_directory", metavar="JOURNAL_DIR", type=click.Path(file_okay=False))
@click.argument("name")
def names_release(journal_directory: str, name: str) -> None:
    """Forget NAME's owner: the next user to log on with it takes it (and its
    publisher state)."""
    owners = _open(journal_directory)
    try:
        before = owners.owner(name)
        released = owners.release(name) if before is not None else False
    except ValueError as exc:
        fail(str(exc), 1)
    finally:
        owners.close()
    if not released:
        fail(f"client name {name!r} has no owner in {journal_directory}", 1)
    click.echo(f"client name {name!r}: released (was owned by {before!r})")
