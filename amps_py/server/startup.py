"""Starting an instance: opening its journal and access control, and why it could not
start, in words an operator can act on.

The listeners and the journal directory fail with a bare :class:`OSError`
(``[Errno 98] Address already in use``, ``[Errno 30] Read-only file system``) that says
neither which listener or directory nor what to change. These functions turn such an
error into one line naming the thing that failed, the cause, and the fix. They only
build text (:func:`journal_directory_failure` looks at which parts of a path exist).
"""

from __future__ import annotations

import errno
import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

from amps_py import auth, events, offload
from amps_py.config import InstanceConfig, TransactionLogConfig
from amps_py.config.model import (
    AuthenticationConfig,
    ConflatedTopicConfig,
    EntitlementConfig,
    SowTopicConfig,
)
from amps_py.message_types import MessageTypes
from amps_py.sow.store import SowStoreError
from txlog import Journal, JournalError, JournalNoSpace
from txlog.opening import is_full_disk
from txlog.preflight import describe_traces, free_bytes

from .conflated_topics import open_conflated
from .sowing import SowState

log = logging.getLogger("amps_py.server")


class ConfigurationError(Exception):
    """The config cannot run as given; the message says what to change."""


def address_text(host: str, port: int) -> str:
    """``host:port`` as written in an InetAddr (``[v6]:port``), with ``0.0.0.0``
    and ``::`` spelled out as every address."""
    shown = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    if host in ("", "0.0.0.0", "::"):
        shown += " (every address of this host)"
    return shown


def listen_failure(what: str, host: str, port: int, exc: OSError, setting: str) -> str:
    """One line saying that ``what`` (``transport json-tcp (tcp)``, ``the admin
    interface``) cannot listen on ``host:port`` because of ``exc``, and what to change;
    ``setting`` names the config element that holds the address (``the InetAddr of
    Transport json-tcp``)."""
    where = f"{what} cannot listen on {address_text(host, port)}"
    code = exc.errno
    if code == errno.EADDRINUSE:
        return (
            f"{where}: the address is already in use by another process (another amps-py "
            f"instance, or another server; `ss -ltnp 'sport = :{port}'` shows which). "
            f"Fix: stop that process, or change {setting} to a free port"
        )
    if code == errno.EADDRNOTAVAIL:
        return (
            f"{where}: {host} is not an address of this host. "
            f"Fix: change {setting} to an address of this host (0.0.0.0 for every address)"
        )
    if code in (errno.EACCES, errno.EPERM) and 0 < port < 1024:
        return (
            f"{where}: ports below 1024 need privileges this process does not have. "
            f"Fix: change {setting} to a port from 1024 up"
        )
    cause = exc.strerror or str(exc) or type(exc).__name__
    return f"{where}: {cause}. Fix: check {setting}"


#: how a full-disk refusal names the journal directory's setting in its fix
JOURNAL_DIRECTORY_MOVE: Final = (
    "TransactionLog/JournalDirectory (the whole directory: data.mdb with its "
    "commit-*.log files) to a larger disk"
)


def full_disk_failure(what: str, directory: Path, free: int, cause: str, move: str) -> str:
    """One line saying that ``what`` (``the journal directory``, ``the SOW store of
    topic 'x' in``) ``directory`` cannot be written because its file system is full,
    with the bytes free (as the running instance's failure acks say it), that nothing
    stored was lost, and the fix: free space there, or ``move`` (the setting to change
    and where to)."""
    shown = f"has {free} bytes free" if free >= 0 else "is full (its free space cannot be read)"
    return (
        f"{what} {directory} cannot be written: no space left on device: the file "
        f"system of {directory} {shown} ({cause}); nothing stored was lost or changed. "
        f"Fix: free space on the file system of {directory}, or move {move}; then "
        "start again"
    )


def journal_directory_failure(directory: Path, exc: OSError) -> str:
    """One line saying that the journal directory cannot be used for writing, why
    (``exc`` from creating the directory, its lock file or LMDB's files), and how to
    fix it. Names the part of the path at fault: a regular file where a directory
    must be, a read-only file system, missing permissions, a full disk (with the
    bytes free)."""
    failed_on = Path(exc.filename) if exc.filename else directory
    code = exc.errno
    free = free_bytes(directory)
    if is_full_disk(exc, free):
        cause = f"writing {failed_on} failed: {exc.strerror or exc}"
        return full_disk_failure(
            "the journal directory", directory, free, cause, JOURNAL_DIRECTORY_MOVE
        )
    blocker = _file_in_the_way(directory)
    if blocker is not None:
        why = f"{blocker} is a file, not a directory"
    elif code == errno.EROFS:
        why = f"it is on a read-only file system (writing {failed_on} failed)"
    elif code in (errno.EACCES, errno.EPERM):
        who = f"uid {os.getuid()}" if hasattr(os, "getuid") else "this user"
        why = f"permission denied: the user running amps-py ({who}) cannot write {failed_on}"
    else:
        why = f"{exc.strerror or exc} ({failed_on})"
    return (
        f"the journal directory {directory} cannot be opened for writing: {why}. "
        "Fix: make it a directory the user running amps-py can write, or set "
        "TransactionLog/JournalDirectory to one"
    )


def _file_in_the_way(directory: Path) -> Path | None:
    """The part of ``directory`` (itself or a parent) that exists but is not a
    directory, if any."""
    for part in (directory, *directory.parents):
        try:
            if part.exists():
                return None if part.is_dir() else part
        except OSError:
            return None
    return None


def os_error_in(exc: BaseException) -> OSError | None:
    """The first :class:`OSError` in ``exc`` or, for an exception group, in its
    members (depth first); None when there is none."""
    if isinstance(exc, OSError):
        return exc
    if isinstance(exc, BaseExceptionGroup):
        for member in exc.exceptions:
            found = os_error_in(member)
            if found is not None:
                return found
    return None


def _refused(tl: TransactionLogConfig, why: str) -> None:
    log.critical(
        "journal %s not opened, instance not started: %s",
        tl.journal_directory,
        why,
        extra=events.extra(events.JOURNAL_OPEN_REFUSED),
    )


def open_journal(tl: TransactionLogConfig, name: str, *, allow_empty: bool) -> Journal:
    """Open instance ``name``'s journal (blocking: run it in a worker thread). A
    refusal (damaged files, an empty journal where one was, a journal held by another
    process) is logged and
    raised as the :class:`txlog.JournalError` whose one line names the fix; a start
    on an empty journal allowed over a former one is logged as a warning.
    """
    try:
        journal = Journal(
            tl.journal_directory,
            instance_name=name,
            durability=tl.durability,
            compression=tl.compression,
            map_size=tl.map_size,
            segment_size=tl.journal_size,
            archive_directory=tl.archive_directory,
            allow_empty=allow_empty,
        )
    except JournalNoSpace as exc:
        why = full_disk_failure(
            "the journal directory",
            tl.journal_directory,
            exc.free,
            exc.cause,
            JOURNAL_DIRECTORY_MOVE,
        )
        _refused(tl, why)
        raise ConfigurationError(why) from exc
    except JournalError as exc:
        _refused(tl, str(exc))
        raise
    except OSError as exc:  # the directory, its lock file or LMDB's files
        why = journal_directory_failure(tl.journal_directory, exc)
        _refused(tl, why)
        raise ConfigurationError(why) from exc
    if journal.started_empty_over:
        aside = ", ".join(str(p) for p in journal.set_aside_to)
        log.warning(
            "journal %s STARTED EMPTY (--allow-empty-journal): a journal existed there "
            "(%s) but its data.mdb was empty or missing; every message it held is "
            "absent from this instance, and replication peers resync only what they "
            "replicate to it%s",
            tl.journal_directory,
            describe_traces(journal.started_empty_over),
            f"; its segment files were moved to {aside}" if aside else "",
            extra=events.extra(events.JOURNAL_STARTED_EMPTY),
        )
    log.info(
        "journal %s opened: last txid %d, durability %s, compression %s",
        tl.journal_directory,
        journal.last_txid,
        tl.durability,
        tl.compression,
        extra=events.extra(events.JOURNAL_OPENED),
    )
    if tl.durability != "fsync":
        log.warning(
            "journal durability is %s: commits are not fsynced, a power loss "
            "can lose acknowledged messages",
            tl.durability,
            extra=events.extra(events.JOURNAL_OPENED),
        )
    return journal


@dataclass(frozen=True)
class AccessControl:
    """Who may connect and what they may do, per transport.

    A Transport with its own ``Authentication`` or ``Entitlement`` uses that module for
    the connections it accepts; every other transport, and the admin API, uses the
    instance's (AMPS's rule). Modules configured alike are opened once and shared.
    """

    #: checks clients' credentials (the instance's Authentication; the admin API's)
    authenticator: auth.Authenticator
    #: decides what a user may publish, subscribe to and administer (the instance's)
    entitler: auth.Entitler
    #: checks upstream instances' credentials (the replication transport's own
    #: Authentication, else the instance's)
    replication_authenticator: auth.Authenticator
    #: decides which upstream users may replicate in (the replication transport's own
    #: Entitlement, else the instance's)
    replication_entitler: auth.Entitler
    #: the modules of each transport, by transport name
    by_transport: Mapping[str, tuple[auth.Authenticator, auth.Entitler]] = field(
        default_factory=dict
    )

    def authenticator_for(self, transport: str) -> auth.Authenticator:
        """The module that checks logons over ``transport`` (the instance's for a
        transport not configured)."""
        found = self.by_transport.get(transport)
        return found[0] if found is not None else self.authenticator

    def entitler_for(self, transport: str) -> auth.Entitler:
        """The module that decides for users logged on over ``transport`` (the
        instance's for a transport not configured)."""
        found = self.by_transport.get(transport)
        return found[1] if found is not None else self.entitler


def open_access_control(config: InstanceConfig) -> AccessControl:
    """Load the configured authentication and entitlement modules and their files:
    the instance's and each transport's own.

    Raises:
        ConfigurationError: a password or rules file cannot be read or is invalid.
    """
    authenticators: dict[AuthenticationConfig, auth.Authenticator] = {}
    entitlers: dict[EntitlementConfig, auth.Entitler] = {}

    def authenticator(which: AuthenticationConfig) -> auth.Authenticator:
        if which not in authenticators:
            authenticators[which] = auth.open_authenticator(which.module, which.password_file)
        return authenticators[which]

    def entitler(which: EntitlementConfig) -> auth.Entitler:
        if which not in entitlers:
            entitlers[which] = auth.open_entitler(which.module, which.rules_file)
        return entitlers[which]

    try:
        by_transport = {
            t.name: (
                authenticator(config.authentication_of(t)),
                entitler(config.entitlement_of(t)),
            )
            for t in config.transports
        }
        return AccessControl(
            authenticator(config.authentication),
            entitler(config.entitlement),
            authenticator(config.replication_authentication),
            entitler(config.replication_entitlement),
            by_transport,
        )
    except (auth.AuthFileError, ValueError) as exc:
        raise ConfigurationError(str(exc)) from None


async def open_sow(
    topics: tuple[SowTopicConfig, ...],
    journal: Journal,
    tl: TransactionLogConfig,
    types: MessageTypes | None = None,
    conflated: tuple[ConflatedTopicConfig, ...] = (),
) -> SowState:
    """Open the SOW topics' stores and apply what of the journal they lack (a missing
    store is rebuilt from the journal), before anything new commits; then fill the
    ``conflated`` topics from them (:func:`open_conflated`).

    Raises:
        ConfigurationError: a store cannot be opened or brought up to date (logged as
            well): one line naming its directory; on a full disk, with the bytes free
            and the fix.
    """
    sow = SowState(topics, tl.journal_directory, types)
    try:
        await offload.run_sync(sow.open)
        await offload.run_sync(sow.catch_up, journal)
        if conflated:
            sow.conflated.update(await offload.run_sync(open_conflated, sow, conflated))
    except SowStoreError as exc:
        # close the stores as they are: nothing may record them as current past what
        # they hold (the catch-up that failed did not apply its records)
        for topic in [*sow.topics.values(), *sow.conflated.values()]:
            topic.store.close()
        why = sow_store_failure(sow, exc)
        log.critical(
            "SOW store %s not opened, instance not started: %s",
            exc.directory,
            why,
            extra=events.extra(events.INSTANCE_FAILED),
        )
        raise ConfigurationError(why) from exc
    return sow


def sow_store_failure(sow: SowState, exc: SowStoreError) -> str:
    """The line for a SOW store that could not be opened or caught up at start: on a
    full disk, which store, the bytes free and the fix (free space, or move the store:
    its FileName, or the JournalDirectory it is under); otherwise the store's own
    words."""
    cause = exc.__cause__ if exc.__cause__ is not None else exc
    free = free_bytes(exc.directory)
    if not is_full_disk(cause, free):
        return str(exc)
    config = next((c for c in sow.configs if sow.store_directory(c) == exc.directory), None)
    topic = f"topic {config.name!r}" if config is not None else "a SOW topic"
    if config is not None and config.file_name is not None:
        move = (
            f"the store (SOW/Topic/FileName of {topic}) to a larger disk: a store that is "
            "missing is rebuilt from the journal"
        )
    else:
        move = JOURNAL_DIRECTORY_MOVE + " (the SOW stores are under it)"
    return full_disk_failure(f"the SOW store of {topic} in", exc.directory, free, str(exc), move)
