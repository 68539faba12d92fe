"""`amps-py sow TOPIC`: one record per line (payload, or --json {key, bookmark, data}),
the query options passed on, a refusal on one line with exit status 1. Run in-process
with click's CliRunner against the fake server of fake_amps.py (its own thread); the
end-to-end run against a real instance belongs with the server's SOW tests."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
from click.testing import CliRunner
from fake_amps import FakeServer, SowFake, fake_server_thread

from amps_py.cli import main
from amps_py.cli.client import sow_record_line, sow_summary
from amps_py.client import SowRecord


@pytest.fixture
def fake() -> Iterator[FakeServer]:
    sow = SowFake(topics={"orders", "empty"})
    sow.put("orders", "1", b'{"id":1,"qty":10}')
    sow.put("orders", "2", b"not json")
    sow.put("orders", "3", b'{"id":3,"qty":30}')
    with fake_server_thread(sow) as server:
        yield server


def run(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(main, list(args))
    return result.exit_code, result.stdout, result.stderr


def test_sow_prints_one_payload_per_line(fake: FakeServer) -> None:
    code, out, err = run("sow", "orders", "--uri", fake.uri)
    assert code == 0, err
    assert out.splitlines() == ['{"id":1,"qty":10}', "not json", '{"id":3,"qty":30}']
    assert err.strip() == "amps-py: 3 record(s) from orders (3 matched of 3 in the topic)"


def test_sow_json_lines_and_query_options(fake: FakeServer) -> None:
    code, out, err = run(
        "sow", "orders", "--uri", fake.uri, "--json", "--filter", "/qty > 5",
        "--top-n", "2", "--orderby", "/qty DESC", "--batch-size", "1",
    )  # fmt: skip
    assert code == 0, err
    lines = [json.loads(line) for line in out.splitlines()]
    assert lines == [
        {"key": "1", "bookmark": "77|1|", "data": {"id": 1, "qty": 10}},
        {"key": "2", "bookmark": "77|2|", "data": "not json"},
    ]
    (query,) = [f.header for f in fake.sow.received if f.header["c"] == "sow"]
    assert (query["f"], query["top_n"], query["orderby"], query["bs"]) == (
        "/qty > 5",
        2,
        "/qty DESC",
        1,
    )
    code, out, err = run("sow", "empty", "--uri", fake.uri)
    assert (code, out) == (0, "")
    assert "0 record(s) from empty" in err


def test_sow_refusal_is_one_line_with_exit_status_1(fake: FakeServer) -> None:
    code, out, err = run("sow", "nope", "--uri", fake.uri)
    assert (code, out) == (1, "")
    assert err.splitlines() == ["amps-py: sow failed: invalid topic"]
    code, _, err = run("sow", "orders", "--uri", fake.uri, "--batch-size", "0")
    assert code == 2 and "--batch-size" in err


def test_record_lines() -> None:
    record = SowRecord("t", "k1", b'{"a":[1,2]}', "x", "1|2|")
    assert sow_record_line(record, False) == '{"a":[1,2]}'
    assert json.loads(sow_record_line(record, True)) == {
        "key": "k1",
        "bookmark": "1|2|",
        "data": {"a": [1, 2]},
    }
    binary = json.loads(sow_record_line(SowRecord("t", "k", b"\xff"), True))
    assert binary == {"key": "k", "bookmark": "", "data": "\ufffd"}
    assert sow_summary("t", 0, {}) == "amps-py: 0 record(s) from t"
