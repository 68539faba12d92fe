"""`amps-py sow` end to end: a real `amps-py serve` process with a SOW topic, records
published through the client library, and the `amps-py sow` console script run as a
subprocess (tests/clirun.py): its lines, its --json lines, its summary on stderr and
its exit status. (Option passing and output formats in detail: test_cli_sow.py.)"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest
import trio
from clirun import run
from harness import ServerProcess, start_instance

from amps_py.client import open_client

SOW_XML = (
    "<SOW><Topic><Name>orders</Name><MessageType>json</MessageType><Key>/id</Key></Topic></SOW>"
)


def expected_records() -> dict[int, dict[str, object]]:
    """What the SOW of ``orders`` holds after :func:`fill`."""
    docs: dict[int, dict[str, object]] = {i: {"id": i, "qty": i * 10} for i in range(10)}
    docs[3] = {"id": 3, "qty": 99}
    docs[4] = {"id": 4, "qty": 40, "note": "merged"}
    del docs[0]
    return docs


async def fill(uri: str) -> None:
    async with open_client(uri, "filler") as client:
        for i in range(10):
            await client.publish("orders", orjson.dumps({"id": i, "qty": i * 10}))
        await client.publish("orders", b'{"id":3,"qty":99}')
        await client.delta_publish("orders", b'{"id":4,"note":"merged"}')
        await client.publish("trades", b'{"id":1}')  # journaled, no SOW
        await client.wait_persisted(client.seq, timeout=30)
        stats = await client.sow_delete("orders", data=b'{"id":0}')
        assert stats["records_deleted"] == 1


@pytest.fixture
def served(tmp_path: Path) -> Iterator[ServerProcess]:
    server = start_instance(tmp_path, "sowcli", extra=SOW_XML)
    try:
        trio.run(fill, server.uri)
        yield server
    finally:
        server.stop()


def test_sow_prints_the_filtered_records_of_a_real_instance(
    served: ServerProcess, tmp_path: Path
) -> None:
    res = run("sow", "orders", "--uri", served.uri, "--filter", "/qty >= 50", cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    want = {i: d for i, d in expected_records().items() if int(d["qty"]) >= 50}  # type: ignore[call-overload]
    got = [json.loads(line) for line in res.stdout.splitlines()]
    assert sorted(got, key=lambda d: d["id"]) == [want[i] for i in sorted(want)]
    assert res.stderr.startswith(f"amps-py: {len(want)} record(s) from orders")
    assert len(res.stderr.splitlines()) == 1
    # ordered and cut: the payloads exactly as stored, one per line
    res = run(
        "sow", "orders", "--uri", served.uri, "--orderby", "/qty DESC", "--top-n", "2",
        cwd=tmp_path,
    )  # fmt: skip
    assert res.returncode == 0, res.stderr
    assert res.stdout.splitlines() == ['{"id":3,"qty":99}', '{"id":9,"qty":90}']


def test_sow_summary_counts_are_consistent(served: ServerProcess, tmp_path: Path) -> None:
    res = run("sow", "orders", "--uri", served.uri, "--filter", "/qty >= 50", cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    matched, total = re.search(r"\((\d+) matched of (\d+) in the topic\)", res.stderr).groups()  # type: ignore[union-attr]
    assert int(matched) == 6
    assert int(total) == len(expected_records()), res.stderr


def test_sow_json_lines_carry_key_bookmark_and_data(served: ServerProcess, tmp_path: Path) -> None:
    res = run("sow", "orders", "--uri", served.uri, "--json", "--batch-size", "3", cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    lines = [json.loads(line) for line in res.stdout.splitlines()]
    assert sorted((d["data"]["id"], d["data"]) for d in lines) == sorted(expected_records().items())
    assert all(set(d) == {"key", "bookmark", "data"} for d in lines)
    assert len({d["key"] for d in lines}) == len(lines) and all(d["key"] for d in lines)
    assert all(d["bookmark"] for d in lines)

    # the keys printed are the ones the instance deletes by
    async def delete_first() -> dict[str, int]:
        async with open_client(served.uri, "deleter") as client:
            stats: dict[str, int] = await client.sow_delete("orders", keys=[lines[0]["key"]])
            return stats

    assert trio.run(delete_first)["records_deleted"] == 1
    res = run("sow", "orders", "--uri", served.uri, "--json", cwd=tmp_path)
    assert len(res.stdout.splitlines()) == len(lines) - 1


def test_sow_of_a_topic_without_sow_fails_with_exit_status_1(
    served: ServerProcess, tmp_path: Path
) -> None:
    res = run("sow", "trades", "--uri", served.uri, cwd=tmp_path)
    assert (res.returncode, res.stdout) == (1, "")
    (line,) = res.stderr.splitlines()
    assert line.startswith("amps-py: sow failed: invalid topic")
    assert "add a SOW/Topic" in line, "the refusal says how to fix it"
    res = run("sow", "orders", "--uri", served.uri, "--filter", "/qty >", cwd=tmp_path)
    assert res.returncode == 1 and res.stdout == ""
    assert res.stderr.startswith("amps-py: sow failed: bad filter")
    assert "column 7" in res.stderr and "Traceback" not in res.stderr


def test_sow_takes_the_uri_positionally_as_publish_does(
    served: ServerProcess, tmp_path: Path
) -> None:
    """`amps-py sow URI TOPIC` (the order publish and subscribe use) prints what
    `amps-py sow TOPIC --uri URI` prints; two different URIs are refused."""
    positional = run("sow", served.uri, "orders", "--filter", "/qty >= 50", cwd=tmp_path)
    option = run("sow", "orders", "--uri", served.uri, "--filter", "/qty >= 50", cwd=tmp_path)
    assert positional.returncode == 0, positional.stderr
    assert positional.stdout == option.stdout
    assert len(positional.stdout.splitlines()) == len(
        [d for d in expected_records().values() if int(d["qty"]) >= 50]  # type: ignore[call-overload]
    )
    both = run("sow", served.uri, "orders", "--uri", "tcp://127.0.0.1:1/amps/json", cwd=tmp_path)
    assert both.returncode == 2
    assert "two URIs given" in both.stderr


def test_publish_file_names_every_message_the_server_refused(
    served: ServerProcess, tmp_path: Path
) -> None:
    """A SOW topic refuses a body it cannot parse (no key). In a --raw file run the
    refused line must not hide behind the later lines' persisted ack: the command
    names it, says the others are stored, and exits 1; the same through the HA
    client (a URI list)."""
    lines = tmp_path / "mixed.jsonl"
    lines.write_text('{"id": 101}\nnot json at all\n{"id": 103}\n')
    for uri in (served.uri, f"{served.uri},{served.uri}"):
        res = run("publish", uri, "orders", "--file", str(lines), "--raw", cwd=tmp_path)
        assert res.returncode == 1, res.stderr
        assert "the server refused 1 of the 3 message(s) published to orders: message 2 (seq" in (
            res.stderr
        ), res.stderr
        assert "Those are not stored; every other one is persisted." in res.stderr
        assert "persisted through" not in res.stderr, res.stderr
    out = run("sow", served.uri, "orders", "--filter", "/id > 100", "--json", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert sorted(json.loads(line)["data"]["id"] for line in out.stdout.splitlines()) == [101, 103]


def test_sow_json_prints_an_nvfix_records_fields_from_the_uris_type(tmp_path: Path) -> None:
    """`amps-py sow URI/amps/nvfix TOPIC --json`: data is the record's fields, as
    subscribe prints them, not the raw NVFIX text."""
    server = start_instance(
        tmp_path,
        "sownvfix",
        topics=((".*", "json"), (".*", "nvfix")),
        client_message_type=None,
        extra="<SOW><Topic><Name>quotes</Name><MessageType>nvfix</MessageType>"
        "<Key>/Symbol</Key></Topic></SOW>",
    )
    try:
        uri = server.uri.replace("/amps/json", "/amps/nvfix")
        for body in ("Symbol=IBM\x01Price=140.5\x01", "Symbol=IBM\x01Price=141\x01"):
            res = run("publish", uri, "quotes", body, cwd=tmp_path)
            assert res.returncode == 0, res.stderr
        res = run("sow", uri, "quotes", "--json", cwd=tmp_path)
        assert res.returncode == 0, res.stderr
        (row,) = [json.loads(line) for line in res.stdout.splitlines()]
        assert row["data"] == {"Symbol": "IBM", "Price": "141"}, row
        res = run("sow", uri, "quotes", cwd=tmp_path)
        assert res.stdout == "Symbol=IBM\x01Price=141\x01\n", res.stdout
    finally:
        server.stop()
