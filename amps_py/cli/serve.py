"""``amps-py serve``: run an instance until SIGTERM or Ctrl-C, from a config file or
the embedded default (with its ports movable by flags), and say in one line why one
could not start (exit status 1; 2 for a config that cannot be used)."""

from __future__ import annotations

import gc
import signal
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING

import click
import trio

from amps_py.cli.common import fail

if TYPE_CHECKING:
    from amps_py.config import InstanceConfig


def tune_garbage_collector() -> None:
    """Collect the young generation every 50,000 allocations instead of 700.

    The server allocates a few objects per message and keeps tens of thousands alive
    (the commit tail, records awaiting acks), none in reference cycles of note; with
    the default threshold the cyclic collector ran every few hundred messages and took
    a measurable share of a replication stream's CPU. Memory is still reclaimed by
    reference counting as before; only cycle detection runs less often.
    """
    gc.freeze()  # what was imported and configured so far is never collected
    gc.set_threshold(50_000, 20, 100)


@click.command()
@click.argument("config_file", metavar="[CONFIG]", required=False, type=click.Path(dir_okay=False))
@click.option(
    "--config",
    "config_path",
    type=click.Path(dir_okay=False),
    default=None,
    help="AMPS-style XML config (the same as giving CONFIG); without either the "
    "embedded default runs.",
)
@click.option(
    "--data-dir",
    default="amps-data",
    show_default=True,
    help="Journal directory of the embedded default (ignored with a config).",
)
@click.option(
    "--port",
    type=click.IntRange(0, 65535),
    default=None,
    help="Embedded default only: the client port instead of 9007 (0: any free port; "
    "--ready-file tells which).",
)
@click.option(
    "--admin-port",
    type=click.IntRange(0, 65535),
    default=None,
    help="Embedded default only: the admin API port instead of 8085 (0: any free port).",
)
@click.option(
    "--ready-file",
    type=click.Path(dir_okay=False),
    default=None,
    help="Write {name, pid, transports: {name: port}} as JSON here once listening "
    "(the admin API's port under the name admin).",
)
@click.option(
    "--stats-file",
    type=click.Path(dir_okay=False),
    default=None,
    help="Rewrite the instance's statistics (JSON) here four times a second.",
)
@click.option(
    "--allow-empty-journal",
    is_flag=True,
    help="Start with an empty journal even where a journal existed (its data.mdb is "
    "empty or missing): every message it held is absent from this instance. Without "
    "it such a start is refused.",
)
def serve(
    config_file: str | None,
    config_path: str | None,
    data_dir: str,
    port: int | None,
    admin_port: int | None,
    ready_file: str | None,
    stats_file: str | None,
    allow_empty_journal: bool,
) -> None:
    """Run an instance until SIGTERM or Ctrl-C: `amps-py serve config.xml` (as
    `ampServer config.xml`), or `amps-py serve --config config.xml`.

    With no config: the embedded default (`amps-py config show-default` prints it), a
    standalone instance journaling every topic under ./amps-data, clients on
    127.0.0.1:9007 (tcp://127.0.0.1:9007/amps/json), the admin API on 127.0.0.1:8085.

    Example configs ship with amps-py: `amps-py config examples` lists them and
    `amps-py config examples NAME --to DIR` writes one out to serve.
    """
    from amps_py.logs import configure_logging

    config = _instance_config(config_file, config_path, data_dir, port, admin_port)
    configure_logging(config.logging, config.name)
    _run_instance(
        config,
        ready_file=ready_file,
        stats_file=stats_file,
        allow_empty_journal=allow_empty_journal,
    )


def _instance_config(
    config_file: str | None,
    config_path: str | None,
    data_dir: str,
    port: int | None,
    admin_port: int | None,
) -> InstanceConfig:
    """The config ``serve`` runs: the file given (CONFIG or --config), else the embedded
    default with its ports moved. Exits with status 2 (and the reason) when there is
    none to run."""
    config_path = _one_config(config_file, config_path)
    if config_path and (port is not None or admin_port is not None):
        flag = "--port" if port is not None else "--admin-port"
        fail(
            f"{flag} applies to the embedded default only; with {config_path}, set the "
            "port in its Transport's (or Admin's) InetAddr",
            2,
        )
    from amps_py.cli.config import missing_example_hint
    from amps_py.config import ConfigError, default_config, load_config

    hint = missing_example_hint(config_path) if config_path else None
    if hint is not None:
        fail(hint, 2)
    try:
        if config_path:
            return load_config(config_path)
        return _with_ports(default_config(Path(data_dir)), port, admin_port)
    except ConfigError as exc:
        fail(str(exc), 2)
    except OSError as exc:
        fail(f"cannot read config {config_path}: {exc.strerror or exc}", 2)


def _run_instance(
    config: InstanceConfig,
    *,
    ready_file: str | None,
    stats_file: str | None,
    allow_empty_journal: bool,
) -> None:
    """Serve ``config`` until SIGTERM or SIGINT; a start that fails exits with status 1
    and one line (:func:`_startup_failure`)."""
    from amps_py.server import serve_instance

    async def run() -> None:
        async with trio.open_nursery() as nursery:
            with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
                await nursery.start(serve_instance_task, nursery)
                async for _ in signals:
                    nursery.cancel_scope.cancel()
                    return

    async def serve_instance_task(
        nursery: trio.Nursery, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
    ) -> None:
        task_status.started()
        try:
            async with trio.open_nursery() as inner:
                await inner.start(
                    partial(
                        serve_instance,
                        config,
                        ready_file=ready_file,
                        stats_file=stats_file,
                        allow_empty_journal=allow_empty_journal,
                    )
                )
                # what start-up built (a deep queue loaded from its checkpoint, the
                # config) lives as long as the instance: no collection rescans it
                gc.freeze()
        except BaseException:
            nursery.cancel_scope.cancel()
            raise

    tune_garbage_collector()
    try:
        trio.run(run)
    except (OSError, BaseExceptionGroup) as exc:
        message = _startup_failure(exc)
        if message is None:
            raise
        fail(message, 1)


def _startup_failure(exc: BaseException) -> str | None:
    """The line to print for an instance that could not start: the refusal's own text
    (a listener that cannot bind, a journal directory that cannot be written, a
    journal refused at open), or for another OS error its text and file. None: not a
    start failure (a bug), let it propagate."""
    from amps_py.server.startup import ConfigurationError
    from txlog import JournalError

    first = exc
    while isinstance(first, BaseExceptionGroup):
        first = first.exceptions[0]
    if isinstance(first, ConfigurationError | JournalError):
        return f"cannot start: {first}"
    if isinstance(first, OSError):
        where = f" ({first.filename})" if first.filename else ""
        return f"cannot start: {first.strerror or first}{where}"
    return None


def _one_config(positional: str | None, option: str | None) -> str | None:
    """The config file given as CONFIG or --config (both only when they agree)."""
    if positional and option and Path(positional).resolve() != Path(option).resolve():
        fail(
            f"two configs given: {positional} and --config {option}; give one "
            f"(amps-py serve {option})",
            2,
        )
    return positional or option


def _with_ports(config: InstanceConfig, port: int | None, admin_port: int | None) -> InstanceConfig:
    """The embedded default ``config`` with its client (and admin) port replaced."""
    import dataclasses

    if port is not None:
        config = dataclasses.replace(
            config, transports=tuple(dataclasses.replace(t, port=port) for t in config.transports)
        )
    if admin_port is not None and config.admin is not None:
        config = dataclasses.replace(config, admin=(config.admin[0], admin_port))
    return config
