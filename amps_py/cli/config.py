"""``amps-py config ...``: check one config, print the embedded default, list or write
out the shipped examples, check a whole replication fabric. Thin: each subcommand calls
``amps_py.config``, ``amps_py.examples`` or ``amps_py.replication.fabric``."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING

import click

from amps_py.cli.common import fail

if TYPE_CHECKING:
    from amps_py.config import InstanceConfig

__all__ = ["config"]


@click.group()
def config() -> None:
    """Check configuration files; print the embedded default; write out the shipped
    examples (`amps-py config examples`)."""


def missing_example_hint(path: str) -> str | None:
    """For a config ``path`` that does not exist but names a shipped example (the docs'
    ``config/examples/...``, outside a source checkout), the line that says how to get
    it; else None."""
    if Path(path).exists():
        return None
    from amps_py.examples import example_named_by

    example = example_named_by(path)
    if example is None:
        return None
    given = Path(path)
    to = given.parent.parent if given.parent.name == example.name else given.parent
    directory = example.files[0].startswith(f"{example.name}/")
    written = f"{to / example.name}/" if directory else str(to / example.files[0])
    return (
        f"cannot read config {path}: no such file. It names the shipped example "
        f"{example.name!r}, which an installed amps-py keeps inside the package: write it "
        f"out with `amps-py config examples {example.name} --to {to}` (it writes "
        f"{written}; then this command works as given)"
    )


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

    hint = missing_example_hint(path)
    if hint is not None:
        fail(hint, 2)
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
    if cfg.sow_topics or cfg.conflated_topics:
        click.echo(f"  sow: {sow_summary(cfg)}")


def sow_summary(cfg: InstanceConfig) -> str:
    """The SOW topics of ``cfg`` in one line: ``orders (json), all (json, Pattern
    ^fx/), orders-C (json, conflated orders every 1s)``."""
    parts = []
    for topic in cfg.sow_topics:
        pattern = f", Pattern {topic.pattern}" if topic.pattern is not None else ""
        parts.append(f"{topic.name} ({topic.message_type}{pattern})")
    for c in cfg.conflated_topics:
        where = f" where {c.filter}" if c.filter else ""
        parts.append(
            f"{c.name} ({c.message_type}, conflated {c.underlying_topic} every "
            f"{c.interval:g}s{where})"
        )
    return ", ".join(parts)


@config.command("show-default")
def config_show_default() -> None:
    """Print the embedded default config (what `amps-py serve` runs without --config)."""
    from amps_py.config import default_config_xml

    click.echo(default_config_xml())


@config.command("examples")
@click.argument("name", required=False)
@click.option(
    "--to",
    "to",
    type=click.Path(file_okay=False),
    default=".",
    show_default=True,
    metavar="DIR",
    help="Write the example NAME here (a directory example into DIR/NAME/).",
)
def config_examples(name: str | None, to: str) -> None:
    """List the shipped example configs, or write example NAME out and print how to
    serve it.

    The examples come with amps-py (a source checkout has them in config/examples; an
    installed package inside it, where they are not meant to be edited). `amps-py
    config examples standalone` writes ./standalone.xml; `amps-py config examples
    secure --to /etc/amps` writes /etc/amps/secure/ with its certificate, password
    and entitlement files (the password, key and secret files readable by their owner
    only). Existing files are never overwritten. Paths inside a config are relative to
    the directory you serve it from (journals under ./amps-data).
    """
    from amps_py.examples import ExampleError, examples, write_example

    if name is None:
        known = examples()
        width = max(len(e.name) for e in known)
        for example in known:
            click.echo(f"{example.name:<{width}}  {example.description}")
        click.echo(
            "\nWrite one out with `amps-py config examples NAME [--to DIR]`.", err=True
        )
        return
    try:
        written = write_example(name, Path(to))
    except ExampleError as exc:
        fail(str(exc), 2)
    for path in written:
        click.echo(f"wrote {path}", err=True)
    from amps_py.examples import find_example

    configs = [Path(to) / c for c in find_example(name).configs]
    readme = [p for p in written if p.name == "README.md"]
    click.echo(f"Serve it with{' (one per instance)' if len(configs) > 1 else ''}:")
    for config_file in configs:
        click.echo(f"  amps-py serve {config_file}")
    if readme:
        click.echo(f"How to use it: {readme[0]}")


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
