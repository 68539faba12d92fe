"""``amps-py config ...``: check one config, print the embedded default, check a whole
replication fabric. Thin: each subcommand calls ``amps_py.config`` or
``amps_py.replication.fabric``."""

from __future__ import annotations

import sys

import click

from amps_py.cli_common import fail

__all__ = ["config"]


@click.group()
def config() -> None:
    """Check configuration files."""


@config.command("check")
@click.argument("path", type=click.Path(dir_okay=False))
def config_check(path: str) -> None:
    """Validate FILE against the schema and the semantic rules, without starting.

    Settings that work but leave the instance open (a replication transport without
    authentication reachable beyond this machine, a password or key file that other
    users may read, a rules file they may change) are printed as warnings on stderr;
    they do not change the exit status.
    """
    from amps_py.config import ConfigError, load_config, security_warnings

    try:
        cfg = load_config(path)
    except ConfigError as exc:
        fail(str(exc), 2)
    except OSError as exc:
        fail(f"cannot read {path}: {exc.strerror or exc}", 2)
    for warning in security_warnings(cfg):
        click.echo(f"{path}: warning: {warning}", err=True)
    transports = ", ".join(f"{t.name}={t.host}:{t.port}" for t in cfg.transports)
    journal = cfg.transaction_log.journal_directory if cfg.transaction_log else "none"
    scheme = "https" if cfg.admin_tls is not None else "http"
    admin = f"{scheme}://{cfg.admin[0]}:{cfg.admin[1]}" if cfg.admin else "none"
    click.echo(
        f"{path}: OK — instance {cfg.name} (group {cfg.group}); "
        f"transports {transports}; journal {journal}; admin {admin}"
    )


@config.command("show-default")
def config_show_default() -> None:
    """Print the embedded default config (what `amps-py serve` runs without --config)."""
    from amps_py.config import default_config_xml

    click.echo(default_config_xml())


@config.command("fabric")
@click.argument("paths", nargs=-1, required=True, type=click.Path(exists=True))
@click.option(
    "--topic",
    "topics",
    multiple=True,
    metavar="NAME[:TYPE]",
    help="Simulate this topic (message type json unless given) instead of a sample of "
    "each replicated topic pattern; repeatable.",
)
def config_fabric(paths: tuple[str, ...], topics: tuple[str, ...]) -> None:
    """Load the configs of a whole fabric (files, or directories of *.xml) and print,
    for each instance and replicated topic, where a message published there goes and
    by which path, then the problems found.

    Exit status: 0 no problems, 1 warnings, 2 errors or a config that does not load.
    """
    from amps_py.config import ConfigError
    from amps_py.replication.fabric import load_fabric

    try:
        fabric = load_fabric(paths)
    except ConfigError as exc:
        fail(str(exc), 2)
    cases = []
    for spec in topics:
        name, _, message_type = spec.partition(":")
        cases.append((name, message_type or "json"))
    click.echo(fabric.report(cases), nl=False)
    findings = fabric.findings(fabric.cases_for(cases))
    if any(f.level == "error" for f in findings):
        sys.exit(2)
    if findings:
        sys.exit(1)
