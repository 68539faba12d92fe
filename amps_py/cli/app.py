"""The ``amps-py`` click group (:func:`main`, the console script's entry point through
``amps_py.cli``) with every command and command group of the package registered on
it."""

from __future__ import annotations

import click

from amps_py import __version__
from amps_py.cli.admin import admin
from amps_py.cli.config import config
from amps_py.cli.names import names
from amps_py.cli.pipeline import pipeline
from amps_py.cli.publish import publish
from amps_py.cli.serve import serve
from amps_py.cli.sow import sow
from amps_py.cli.subscribe import subscribe
from amps_py.cli.txlog import txlog
from amps_py.cli.users import users


@click.group()
@click.version_option(__version__, prog_name="amps-py")
def main() -> None:
    """amps-py: an AMPS-like message server with a durable journal and replication."""


for command in (serve, publish, subscribe, sow, admin, config, names, pipeline, txlog, users):
    main.add_command(command)
