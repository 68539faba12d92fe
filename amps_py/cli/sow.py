"""``amps-py sow``: print the records of a SOW topic, one per line, and count them on
stderr; the URI as publish and subscribe take it, as ``--uri``, or the embedded
default's."""

from __future__ import annotations

import sys

import click
import trio

from amps_py.cli.common import fail
from amps_py.cli.connect import (
    URI_HELP,
    ca_file_option,
    client_errors,
    client_name_for,
    credentials_for,
    password_env_option,
    uri_message_type,
    user_option,
)


@click.command(epilog=URI_HELP)
@click.argument("first", metavar="[URI] TOPIC")
@click.argument("second", required=False, metavar=" ")
@click.option("--filter", "filter_", default=None, help='Content filter, e.g. "/qty > 10".')
@click.option("--top-n", type=click.IntRange(min=0), default=None, help="At most N records.")
@click.option(
    "--orderby", default=None, help='Sort order, e.g. "/qty DESC,/id" (unordered without it).'
)
@click.option(
    "--batch-size",
    type=click.IntRange(1, 10_000),
    default=10,
    show_default=True,
    help="Records per result frame from the server.",
)
@click.option(
    "--uri",
    default=None,
    help="The instance to ask (the same as giving URI); default: the embedded default's "
    "tcp://127.0.0.1:9007/amps/json.",
)
@click.option(
    "--json",
    "as_json",
    is_flag=True,
    help='Print each record as {"key", "bookmark", "data"} instead of its payload.',
)
@click.option("--name", default=None, help="Client name.")
@click.option(
    "--timeout",
    type=float,
    default=60,
    show_default=True,
    help="Seconds allowed to connect, log on and receive the whole result.",
)
@ca_file_option
@user_option
@password_env_option
def sow(
    first: str,
    second: str | None,
    filter_: str | None,
    top_n: int | None,
    orderby: str | None,
    batch_size: int,
    uri: str | None,
    as_json: bool,
    name: str | None,
    timeout: float,
    ca_file: str | None,
    user: str | None,
    password_env: str,
) -> None:
    """Print the records of the SOW topic TOPIC (State of the World), one per line:
    `amps-py sow tcp://HOST:PORT/amps/json TOPIC` (as publish and subscribe take the
    URI), or `amps-py sow TOPIC --uri URI`, or `amps-py sow TOPIC` for the embedded
    default's instance.

    Each line is a record's payload, or with --json a JSON object {key, bookmark,
    data}. A last line on stderr counts them. Exit status 0, or 1 with a line on
    stderr when the query was refused (e.g. `invalid topic`: TOPIC has no SOW) or
    failed.
    """
    from amps_py.cli.client import DEFAULT_URI, sow_record_line, sow_summary
    from amps_py.client import open_client

    topic = first if second is None else second
    if second is not None:
        if uri is not None and uri != first:
            fail(f"two URIs given: {first} and --uri {uri}; give one", 2)
        uri = first
    target = uri or DEFAULT_URI
    credentials = credentials_for(target, user, password_env)
    client_name = client_name_for(name, "sow")
    message_type = uri_message_type(target)
    out = sys.stdout

    async def run() -> tuple[int, dict[str, int]]:
        async with open_client(
            target, client_name, timeout=timeout, ca_file=ca_file, **credentials.logon_fields()
        ) as client:
            records = await client.sow(
                topic,
                filter_,
                top_n=top_n,
                orderby=orderby,
                batch_size=batch_size,
                timeout=timeout,
            )
        for record in records:
            out.write(sow_record_line(record, as_json, message_type) + "\n")
        out.flush()
        return len(records), records.stats

    with client_errors(credentials, client_name, password_env, topic):
        count, stats = trio.run(run)
    click.echo(sow_summary(topic, count, stats), err=True)
