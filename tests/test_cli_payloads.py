"""What `amps-py publish` does with a payload that is not a JSON object on a json
transport (refused, saying why, unless --raw), and how the server counts such payloads
per topic when a content filter meets them (`amps-py admin status`, the admin API, the
metrics). Also the output details of `amps-py subscribe` (no empty bookmark, no rate
line when stderr is piped) and `admin SUBCOMMAND --url`. Real `amps-py` processes.
"""

from __future__ import annotations

import json
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from clirun import DefaultServe, amps_py_command, cli_env, run
from harness import wait_until_sync


@pytest.fixture
def serve(tmp_path: Path) -> Iterator[DefaultServe]:
    served = DefaultServe(tmp_path / "serve")
    try:
        yield served
    finally:
        served.stop()


def instance(serve: DefaultServe) -> dict[str, Any]:
    with urllib.request.urlopen(f"{serve.admin_url}/amps/instance.json", timeout=10) as r:
        document: dict[str, Any] = json.load(r)
    return document


def start_subscriber(serve: DefaultServe, *args: str) -> subprocess.Popen[str]:
    """`amps-py subscribe URI TOPIC ARGS` with stdout and stderr piped; returns once the
    instance counts one more subscription."""
    before = instance(serve)["subscriptions"]
    proc = subprocess.Popen(
        [*amps_py_command(), "subscribe", serve.uri, *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=cli_env(),
    )

    def subscribed() -> str | None:
        if proc.poll() is not None:
            raise AssertionError(f"subscribe exited: {proc.communicate()}")
        now = instance(serve)["subscriptions"]
        return None if now > before else "not subscribed yet"

    wait_until_sync(subscribed, 30)
    return proc


REFUSED = [
    ("hello world", "DATA is not JSON: plain text (a JSON message is an object: "),
    ("", "DATA is empty (a JSON message is an object: '{}' at least)"),
    ("\"{'id': 1}\"", "DATA is a JSON string, not an object: the whole payload is in double"),
    ("{'id': 1}", "DATA is not JSON: single quotes — JSON needs double quotes"),
    ("[1, 2]", "DATA is a JSON array, not an object"),
]


def test_publish_refuses_payloads_that_are_not_json_objects(
    serve: DefaultServe, tmp_path: Path
) -> None:
    for data, expected in REFUSED:
        res = run("publish", serve.uri, "t", data, cwd=tmp_path)
        assert res.returncode == 1, (data, res.stderr)
        assert res.stderr.startswith(f"amps-py: {expected}"), res.stderr
        assert "Nothing was sent" in res.stderr and "--raw" in res.stderr
        assert "Traceback" not in res.stderr
    lines = tmp_path / "lines.jsonl"
    lines.write_text('{"id": 1}\n\n{"id": 2}\n{"id": 3,}\n')
    res = run("publish", serve.uri, "t", "--file", str(lines), cwd=tmp_path)
    assert res.returncode == 1
    assert res.stderr.startswith(f"amps-py: {lines} line 4 is not JSON: "), res.stderr
    assert "Nothing was sent" in res.stderr
    assert instance(serve)["statistics"]["published"] == 0  # the good lines neither
    # a pipe cannot be read ahead: the lines before the bad one went out, and it says so
    res = run("publish", serve.uri, "t", "--file", "-", cwd=tmp_path, input='{"id": 1}\nnope\n')
    assert res.returncode == 1
    assert res.stderr.startswith("amps-py: standard input line 2 is not JSON: "), res.stderr
    assert "The 1 line(s) before it were published; nothing after it." in res.stderr
    # a transport of another message type takes anything
    other = serve.uri.replace("/amps/json", "/amps/binary")
    res = run("publish", other, "t", "hello world", "--timeout", "5", cwd=tmp_path)
    assert "not JSON" not in res.stderr


def test_raw_payload_is_sent_and_counted_by_topic_when_a_filter_meets_it(
    serve: DefaultServe, tmp_path: Path
) -> None:
    sub = start_subscriber(serve, "orders", "--filter", "/id = 1", "--count", "1")
    res = run("publish", serve.uri, "orders", "hello world", "--raw", cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    assert "published 1 message(s) to orders" in res.stderr
    res = run("publish", serve.uri, "orders", '{"id": 1}', cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    out, err = sub.communicate(timeout=30)
    assert sub.returncode == 0, err
    # a live message has no bookmark: the envelope leaves the key out
    assert [json.loads(line) for line in out.splitlines()] == [
        {"topic": "orders", "data": {"id": 1}}
    ]
    assert instance(serve)["statistics"]["unparsed_payloads"] == {"orders": 1}
    status = run("admin", "status", "--url", serve.admin_url, cwd=tmp_path)
    assert status.returncode == 0, status.stderr
    assert "not JSON (skipped by every content filter): orders 1" in status.stdout
    with urllib.request.urlopen(f"{serve.admin_url}/metrics", timeout=10) as r:
        metrics = r.read().decode()
    assert 'amps_unparsed_payloads_total{instance="' in metrics
    assert 'topic="orders"} 1.0' in metrics


def test_admin_options_after_the_subcommand(serve: DefaultServe, tmp_path: Path) -> None:
    after = run("admin", "status", "--url", serve.admin_url, "--json", cwd=tmp_path)
    before = run("admin", "--url", serve.admin_url, "--json", "status", cwd=tmp_path)
    assert after.returncode == before.returncode == 0, after.stderr
    assert json.loads(after.stdout)["name"] == json.loads(before.stdout)["name"]
    res = run("admin", "clients", "--url", "http://127.0.0.1:1", cwd=tmp_path)
    assert res.returncode != 0
    assert "http://127.0.0.1:1" in res.stderr  # the --url after the subcommand was used


def test_subscribe_prints_no_rate_line_when_stderr_is_piped(
    serve: DefaultServe, tmp_path: Path
) -> None:
    """The rate line comes at the first message 5 s after the start: publish one after
    that and check that a piped stderr got no rate line."""
    sub = start_subscriber(serve, "slow", "--count", "1", "--timeout", "60")
    started = time.monotonic()  # after the subscriber's own start
    wait_until_sync(lambda: None if time.monotonic() - started > 5.5 else "not yet", 10)
    res = run("publish", serve.uri, "slow", '{"n": 1}', cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    out, err = sub.communicate(timeout=30)
    assert sub.returncode == 0, err
    assert json.loads(out) == {"topic": "slow", "data": {"n": 1}}
    assert "msg/s" not in err


def test_a_replay_counts_what_was_published_before_once(
    serve: DefaultServe, tmp_path: Path
) -> None:
    """Published with no subscriber (nothing parsed it), then met by filtered replays:
    counted once, however many replays read it."""
    res = run("publish", serve.uri, "late", "hello world", "--raw", cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    res = run("publish", serve.uri, "late", '{"id": 1}', cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    assert "late" not in instance(serve)["statistics"]["unparsed_payloads"]
    for _ in range(2):
        replay = run("subscribe", serve.uri, "late", "--bookmark", "0", "--filter", "/id = 1",
                     "--count", "1", cwd=tmp_path)  # fmt: skip
        assert replay.returncode == 0, replay.stderr
        row = json.loads(replay.stdout)
        assert row["data"] == {"id": 1} and row["bookmark"]  # a replayed message has one
    assert instance(serve)["statistics"]["unparsed_payloads"] == {"late": 1}
