"""``amps-py users ...``: maintain an amps-password-file password file
(``amps_py.auth.PasswordFile``)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import click

from amps_py.cli.common import fail

__all__ = ["users"]


@click.group()
def users() -> None:
    """Maintain an amps-password-file password file (scrypt hashes, one user a line)."""


def _load_passwords(path: str, *, create: bool) -> Any:
    from amps_py.auth import AuthFileError, PasswordFile

    if create and not Path(path).exists():
        return PasswordFile(path)
    try:
        return PasswordFile.load(path)
    except AuthFileError as exc:
        fail(str(exc), 2)


@users.command("add")
@click.argument("path", metavar="FILE", type=click.Path(dir_okay=False))
@click.argument("user")
@click.option(
    "--password-stdin",
    is_flag=True,
    help="Read the password from the first line of stdin instead of prompting.",
)
def users_add(path: str, user: str, password_stdin: bool) -> None:
    """Add USER to FILE (created if missing), or set a new password for USER."""
    passwords = _load_passwords(path, create=True)
    if password_stdin:
        password = sys.stdin.readline().rstrip("\r\n")
    else:
        password = click.prompt(
            f"Password for {user}", hide_input=True, confirmation_prompt=True, err=True
        )
    if not password:
        fail("the password is empty; give a non-empty password", 2)
    try:
        updated = passwords.with_user(user, password)
    except ValueError as exc:
        fail(str(exc), 2)
    updated.save()
    verb = "updated" if user in passwords.entries else "added"
    click.echo(f"{path}: user {user} {verb}")


@users.command("remove")
@click.argument("path", metavar="FILE", type=click.Path(dir_okay=False))
@click.argument("user")
def users_remove(path: str, user: str) -> None:
    """Remove USER from FILE."""
    passwords = _load_passwords(path, create=False)
    if user not in passwords.entries:
        fail(f"{path}: no user {user!r}; `amps-py users list {path}` shows the users", 1)
    passwords.without_user(user).save()
    click.echo(f"{path}: user {user} removed")


@users.command("list")
@click.argument("path", metavar="FILE", type=click.Path(dir_okay=False))
def users_list(path: str) -> None:
    """Print the user names in FILE, one a line (never the hashes)."""
    for user in _load_passwords(path, create=False).users():
        click.echo(user)
