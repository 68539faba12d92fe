"""`amps-py publish` / `subscribe` (and `admin`) as a newcomer meets them: credentials,
refusals that say how to fix them, progress on a terminal (and nothing extra in a
pipe), the replay/live line, and a persisted-ack wait that names what it waits for.

Every command runs as a real subprocess (tests/clirun.py) against real instances.
"""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from clirun import DefaultServe, amps_py_command, cli_env, run, run_on_terminal
from cluster import destination_xml, replication_xml
from harness import ServerProcess, reserve_port, security_xml, start_instance

PASSWORD = "alice-Secret-42"
ADMIN_XML = "<Admin><InetAddr>127.0.0.1:0</InetAddr></Admin>"


def admin_url(server: ServerProcess) -> str:
    ready = json.loads(server.ready_file.read_text())
    return f"http://127.0.0.1:{ready['transports']['admin']}"


@pytest.fixture
def secured(tmp_path: Path) -> Iterator[ServerProcess]:
    """An instance whose logons and admin API need a password (alice, bob), where bob
    may only read."""
    security = security_xml(
        tmp_path,
        {"alice": PASSWORD, "bob": "bob-Secret-42"},
        {"alice": {"read": ".*", "write": ".*", "admin": True}, "bob": {"read": ".*"}},
    )
    server = start_instance(tmp_path, "secured", extra=security + ADMIN_XML)
    try:
        yield server
    finally:
        server.stop()


def test_publish_and_subscribe_log_on_with_user_and_password_variable(
    secured: ServerProcess, tmp_path: Path
) -> None:
    uri = secured.uri
    env = {"AMPS_PY_PASSWORD": PASSWORD}
    res = run("publish", uri, "orders", '{"id": 1}', "--user", "alice", cwd=tmp_path, env=env)
    assert res.returncode == 0, res.stderr
    # the user in the URI (AMPS's form), the password still from the variable
    at = uri.replace("tcp://", "tcp://alice@")
    res = run("subscribe", at, "orders", "--bookmark", "0", "--count", "1", cwd=tmp_path, env=env)
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout)["data"] == {"id": 1}
    # the whole AMPS form, and a variable of one's own choosing
    full = uri.replace("tcp://", f"tcp://alice:{PASSWORD}@")
    assert run("publish", full, "orders", '{"id": 2}', cwd=tmp_path).returncode == 0
    res = run(
        "publish", uri, "orders", '{"id": 3}', "--user", "alice", "--password-env", "MY_PW",
        cwd=tmp_path, env={"MY_PW": PASSWORD},
    )  # fmt: skip
    assert res.returncode == 0, res.stderr
    log = secured.log_file.read_text()
    assert PASSWORD not in log


def test_auth_failure_says_how_to_pass_credentials(secured: ServerProcess, tmp_path: Path) -> None:
    uri = secured.uri
    none = run("publish", uri, "orders", "{}", "--name", "pub-1", cwd=tmp_path)
    assert none.returncode == 1
    line = none.stderr.strip()
    assert len(line.splitlines()) == 1 and "Traceback" not in line
    assert "logon failed: auth failure" in line
    assert "refused no user (the client name 'pub-1') with no password" in line
    assert "--user NAME" in line and "AMPS_PY_PASSWORD" in line
    assert "tcp://NAME:PASSWORD@HOST:PORT/amps/json" in line
    wrong = run(
        "subscribe", uri, "orders", "--user", "alice", "--timeout", "1",
        cwd=tmp_path, env={"AMPS_PY_PASSWORD": "not-it"},
    )  # fmt: skip
    assert wrong.returncode == 1
    assert "refused user 'alice' with the password from $AMPS_PY_PASSWORD" in wrong.stderr
    twice = run("publish", uri.replace("tcp://", "tcp://alice@"), "o", "{}", "--user", "bob",
                cwd=tmp_path)  # fmt: skip
    assert twice.returncode == 1
    assert "two users given: --user bob and 'alice' in the URI; give one" in twice.stderr
    helped = run("publish", "--help", cwd=tmp_path)
    assert "tcp://USER:PASSWORD@HOST:PORT/amps/json" in " ".join(helped.stdout.split())


def test_auth_failure_hint_keeps_the_uris_scheme_and_type() -> None:
    """A tcps (or fix) URI's hint names a tcps (fix) URI, not tcp://.../json."""
    from amps_py.cli.client import explain_refusal, resolve_credentials
    from amps_py.client import CommandError

    creds = resolve_credentials("tcps://alice:x@h:9/amps/fix", None, "PW", {})
    refused = CommandError("logon", {"reason": "auth failure"})
    line = explain_refusal(refused, creds, "c", "PW", "t")
    assert line.endswith("or use tcps://NAME:PASSWORD@HOST:PORT/amps/fix"), line
    plain = resolve_credentials("tcp://h:9/amps/json", None, "PW", {})
    assert explain_refusal(refused, plain, "c", "PW", "t").endswith(
        "or use tcp://NAME:PASSWORD@HOST:PORT/amps/json"
    )


def test_not_entitled_names_the_user_and_topic(secured: ServerProcess, tmp_path: Path) -> None:
    env = {"AMPS_PY_PASSWORD": "bob-Secret-42"}
    res = run(
        "publish", secured.uri, "orders", "{}", "--user", "bob", "--timeout", "10",
        cwd=tmp_path, env=env,
    )  # fmt: skip
    print(res.stderr)
    assert res.returncode == 1
    assert "not entitled" in res.stderr
    assert "user 'bob' may not publish to topic 'orders'" in res.stderr, res.stderr
    assert res.stderr.count("bob") == 1 and res.stderr.count("rules decide") == 1, res.stderr


def test_admin_http_401_says_how_to_pass_credentials(
    secured: ServerProcess, tmp_path: Path
) -> None:
    base = admin_url(secured)
    anonymous = run("admin", "--url", base, "status", cwd=tmp_path)
    assert anonymous.returncode == 1
    assert "HTTP 401" in anonymous.stderr
    assert "no user was given" in anonymous.stderr
    assert "amps-py admin --user NAME" in anonymous.stderr
    assert "AMPS_PY_ADMIN_PASSWORD" in anonymous.stderr
    wrong = run(
        "admin", "--url", base, "--user", "alice", "status",
        cwd=tmp_path, env={"AMPS_PY_ADMIN_PASSWORD": "not-it"},
    )  # fmt: skip
    assert wrong.returncode == 1
    assert "user 'alice' with a password was refused" in wrong.stderr
    right = run(
        "admin", "--url", base, "--user", "alice", "--json", "status",
        cwd=tmp_path, env={"AMPS_PY_ADMIN_PASSWORD": PASSWORD},
    )  # fmt: skip
    assert right.returncode == 0, right.stderr
    assert json.loads(right.stdout)["name"] == "secured"


# ---------------------------------------------------------------------------- feedback
@pytest.fixture
def default_serve(tmp_path: Path) -> Iterator[DefaultServe]:
    serve = DefaultServe(tmp_path / "serve")
    try:
        yield serve
    finally:
        serve.stop()


def test_publish_file_shows_progress_on_a_terminal_only(
    default_serve: DefaultServe, tmp_path: Path
) -> None:
    lines = tmp_path / "orders.jsonl"
    lines.write_text("".join(f'{{"n": {i}}}\n' for i in range(3000)))
    code, _, screen = run_on_terminal(
        "publish", default_serve.uri, "orders", "--file", str(lines), "--name", "tty-pub",
        cwd=tmp_path,
    )  # fmt: skip
    assert code == 0, screen
    assert "publishing to orders" in screen, screen
    assert "published 3000 message(s) to orders; persisted through seq 3000" in screen
    # piped (what scripts and tests see): the summary line and nothing else
    piped = run(
        "publish", default_serve.uri, "orders", "--file", str(lines), "--name", "pipe-pub",
        cwd=tmp_path,
    )  # fmt: skip
    assert piped.returncode == 0, piped.stderr
    assert piped.stderr == "published 3000 message(s) to orders; persisted through seq 3000\n"
    # stdin is read as it comes, not all at first
    streamed = run(
        "publish", default_serve.uri, "orders", "--file", "-", "--name", "stdin-pub",
        cwd=tmp_path, input='{"n": 1}\n\n{"n": 2}',
    )  # fmt: skip
    assert streamed.stderr == "published 2 message(s) to orders; persisted through seq 2\n"


def test_publish_rate_paces_a_file_and_refuses_a_rate_that_is_not_positive(
    default_serve: DefaultServe, tmp_path: Path
) -> None:
    lines = tmp_path / "paced.jsonl"
    lines.write_text("".join(f'{{"n": {i}}}\n' for i in range(21)))
    started = time.monotonic()
    paced = run(
        "publish", default_serve.uri, "paced", "--file", str(lines), "--rate", "10",
        cwd=tmp_path,
    )  # fmt: skip
    took = time.monotonic() - started
    assert paced.returncode == 0, paced.stderr
    assert paced.stderr == "published 21 message(s) to paced; persisted through seq 21\n"
    # 21 lines at 10 a second: 20 gaps of 0.1 s at least (a lower bound: a loaded
    # machine only adds to it)
    assert took >= 2.0, f"21 lines at --rate 10 took {took:.2f} s"
    zero = run("publish", default_serve.uri, "paced", "--file", str(lines), "--rate", "0",
               cwd=tmp_path)  # fmt: skip
    assert zero.returncode == 2
    assert "--rate" in zero.stderr and "0" in zero.stderr, zero.stderr


def test_subscribe_says_when_the_replay_ends_and_live_starts(
    default_serve: DefaultServe, tmp_path: Path
) -> None:
    uri = default_serve.uri
    for i in range(3):
        assert run("publish", uri, "ticks", f'{{"i": {i}}}', cwd=tmp_path).returncode == 0
    proc = subprocess.Popen(
        [*amps_py_command(), "subscribe", uri, "ticks", "--bookmark", "0", "--count", "4",
         "--timeout", "20"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,  # one stream: the line's place among the messages shows
        text=True,
        env=cli_env(),
        cwd=tmp_path,
    )  # fmt: skip
    assert proc.stdout is not None
    try:
        seen = [proc.stdout.readline() for _ in range(4)]
        assert [json.loads(line)["data"] for line in seen[:3]] == [{"i": 0}, {"i": 1}, {"i": 2}]
        assert seen[3] == "amps-py: replay complete (3 message(s) replayed); live messages follow\n"
        assert run("publish", uri, "ticks", '{"i": 3}', cwd=tmp_path).returncode == 0
        rest, _ = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, rest
    assert [json.loads(line)["data"] for line in rest.splitlines()] == [{"i": 3}]


def test_subscribe_whose_server_goes_away_exits_1_with_the_reason(tmp_path: Path) -> None:
    serve = DefaultServe(tmp_path / "serve")
    proc = subprocess.Popen(
        [*amps_py_command(), "subscribe", serve.uri, "ticks", "--bookmark", "0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=cli_env(),
        cwd=tmp_path,
    )
    assert proc.stderr is not None
    try:
        line = proc.stderr.readline()  # subscribed: the (empty) replay is complete
        assert line.startswith("amps-py: replay complete (0 message(s) replayed)"), line
        assert serve.stop() == 0, serve.log()
        out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 1 and out == ""
    assert "subscription ended after 0 message(s): server closed the connection" in err, err
    assert "Traceback" not in err


def test_persisted_ack_timeout_names_the_sync_destination_it_waits_for(
    tmp_path: Path,
) -> None:
    """A sync destination that is down holds persisted acks back; the publish that
    times out says so, names it with its address, and how to stop waiting for it."""
    # bound and not listening for the whole test: connections to them are refused
    with reserve_port() as b_down, reserve_port() as no_admin:
        down, no_admin_port = b_down.getsockname()[1], no_admin.getsockname()[1]
        dest = destination_xml("B", "B", True, f"127.0.0.1:{down}", exclude=("replicate",))
        server = start_instance(tmp_path, "A", extra=replication_xml(dest) + ADMIN_XML)
        other = DefaultServe(tmp_path / "other")
        try:
            base = admin_url(server)
            started = time.monotonic()
            res = run(
                "publish", server.uri, "orders", '{"id": 1}', "--timeout", "2", "--admin-url", base,
                cwd=tmp_path,
            )  # fmt: skip
            assert res.returncode == 1
            assert time.monotonic() - started < 30
            line = res.stderr.strip()
            assert len(line.splitlines()) == 1 and "Traceback" not in line, line
            assert "no persisted ack for seq 1 within 2 s" in line
            assert "the instance has not confirmed that the messages are stored" in line
            waits = "A waits for its sync replication destination(s) B (not connected; "
            assert waits in line and f"127.0.0.1:{down}" in line
            assert f"amps-py admin --url {base} downgrade B" in line
            # its admin API unknown: says how to name it
            unknown = run(
                "publish", server.uri, "orders", "{}", "--timeout", "1",
                "--admin-url", f"http://127.0.0.1:{no_admin_port}", cwd=tmp_path,
            )  # fmt: skip
            assert unknown.returncode == 1
            assert "could not say why" in unknown.stderr and "pass --admin-url" in unknown.stderr
            # another instance's admin API is not mistaken for this one's
            wrong = run(
                "publish", server.uri, "orders", "{}", "--timeout", "1",
                cwd=tmp_path, env={"AMPS_PY_ADMIN_URL": other.admin_url},
            )  # fmt: skip
            assert wrong.returncode == 1
            assert f"The admin API at {other.admin_url} belongs to another instance" in wrong.stderr
            # no admin URL given: the default port's answer (another instance, or
            # nothing) is not passed off as this one's; it says what to pass
            guessed = run(
                "publish", server.uri, "orders", "{}", "--timeout", "1", cwd=tmp_path,
                env={"AMPS_PY_ADMIN_URL": ""},
            )  # fmt: skip
            assert guessed.returncode == 1
            assert "another instance" not in guessed.stderr, guessed.stderr
            assert "pass --admin-url http://HOST:PORT (the instance's Admin/InetAddr)" in (
                guessed.stderr
            )
            # the advice works: once B is downgraded, persisted acks stop waiting for it
            assert run("admin", "--url", base, "downgrade", "B", cwd=tmp_path).returncode == 0
            res = run("publish", server.uri, "orders", '{"id": 2}', "--timeout", "20", cwd=tmp_path)
            assert res.returncode == 0, res.stderr
        finally:
            other.stop()
            server.stop()


def test_waiting_destinations_are_the_sync_ones_down_or_behind() -> None:
    """The pure part of the persisted-wait message, on an admin document: async and
    caught-up destinations are not blamed; a connected one behind says by how much."""
    from amps_py.cli.client import explain_persisted_wait, waiting_destinations

    def dest(kind: str, connected: bool, acked: int, **extra: object) -> dict[str, object]:
        return {"replication_type": kind, "is_connected": connected, "acked_txid": acked,
                "address": "10.0.0.9:9100", **extra}  # fmt: skip

    document = {
        "name": "A",
        "clients": {"pub": {}},
        "transaction_log": {"last_txid": 40},
        "replication": {
            "destinations": {
                "async-down": dest("async", False, 0),
                "caught-up": dest("sync", True, 40),
                "slow": dest("sync", True, 28, seconds_behind=3.25),
                "gone": dest("sync", False, 12, address="", last_error="connection refused"),
            }
        },
    }
    assert waiting_destinations(document) == [
        "gone (not connected; connection refused)",
        "slow (connected to 10.0.0.9:9100, 12 record(s) and 3.2 s not acknowledged)",
    ]
    text = explain_persisted_wait("no persisted ack", "http://h:1", document, "pub")
    assert "downgrade gone`" in text
    # a guessed URL (none given) is used only when it is this client's instance
    guessed = explain_persisted_wait("no persisted ack", "http://h:1", document, "pub", False)
    assert guessed == text
    other = {**document, "name": "amps-standalone", "clients": {}}
    guessed = explain_persisted_wait("no persisted ack", "http://h:1", other, "pub", False)
    assert "amps-standalone" not in guessed and "http://h:1" not in guessed, guessed
    assert "pass --admin-url http://HOST:PORT" in guessed
    document["replication"] = {"destinations": {"caught-up": dest("sync", True, 40)}}
    text = explain_persisted_wait("no persisted ack", "http://h:1", document, "pub")
    assert "no sync replication destination that is down or behind" in text
    # an instance that says which destinations hold acks (acks follow routing): a sync
    # destination down with nothing routed to it waiting is not blamed
    document["replication"] = {
        "destinations": {
            "partial": dest("sync", False, 0, acks_waiting=0, last_error="refused"),
            "full": dest("sync", False, 0, acks_waiting=3, last_error="refused"),
            "busy": dest("sync", True, 39, acks_waiting=1),
        }
    }
    assert waiting_destinations(document) == [
        "busy (connected to 10.0.0.9:9100; 1 message(s) routed to it not acknowledged)",
        "full (not connected to 10.0.0.9:9100; refused; 3 message(s) routed to it not "
        "acknowledged)",
    ]


def test_publish_to_a_topic_that_is_not_journaled_says_it_is_not_stored(
    tmp_path: Path,
) -> None:
    """An instance that journals only ``orders`` acknowledges a publish to ``prices``
    (as AMPS does) with ``reason: not journaled``; the CLI says received, not stored,
    and still says persisted for ``orders``, also through the HA client."""
    server = start_instance(tmp_path, "A", topics=(("orders", "json"),))
    try:
        pair = f"{server.uri},{server.uri}"
        for uri in (server.uri, pair):
            res = run("publish", uri, "prices", '{"px": 1}', cwd=tmp_path)
            print(res.stderr)
            assert res.returncode == 0, res.stderr
            assert res.stderr.strip() == (
                "published 1 message(s) to prices; received through seq 1 (topic 'prices' "
                "is not journaled on this instance: not stored, not replayable)"
            )
            res = run("publish", uri, "orders", '{"id": 1}', cwd=tmp_path)
            assert res.returncode == 0, res.stderr
            assert res.stderr.strip().endswith("to orders; persisted through seq 1"), res.stderr
    finally:
        server.stop()
    # an instance without a TransactionLog stores nothing: it says so at once (it used
    # to send no persisted ack at all, and the publish timed out)
    bare = start_instance(tmp_path / "bare", "B", journal=False)
    try:
        started = time.monotonic()
        res = run("publish", bare.uri, "orders", '{"id": 1}', "--timeout", "20", cwd=tmp_path)
        assert res.returncode == 0, res.stderr
        assert "received through seq 1 (topic 'orders' is not journaled" in res.stderr
        assert time.monotonic() - started < 15
    finally:
        bare.stop()


def test_publish_to_the_admin_port_says_it_is_an_http_port(tmp_path: Path) -> None:
    """The admin API answers a logon frame with an HTTP response; its first bytes
    ("HTTP") read as a frame length of 1213486160. The CLI says what the port is."""
    server = start_instance(tmp_path, "A", extra=ADMIN_XML)
    try:
        port = admin_url(server).rsplit(":", 1)[1]
        res = run("publish", f"tcp://127.0.0.1:{port}/amps/json", "orders", "{}", cwd=tmp_path)
        print(res.stderr)
        assert res.returncode == 1 and "Traceback" not in res.stderr
        assert "1213486160" not in res.stderr and "tcps" not in res.stderr, res.stderr
        assert "this is an HTTP port (the admin API?); use the instance's client transport" in (
            res.stderr
        )
    finally:
        server.stop()


def test_connection_refused_says_what_to_check(tmp_path: Path) -> None:
    with reserve_port() as held:  # bound, not listening: connections are refused
        port = held.getsockname()[1]
        res = run("publish", f"tcp://127.0.0.1:{port}/amps/json", "orders", "{}", cwd=tmp_path)
    print(res.stderr)
    assert res.returncode == 1
    assert res.stderr.strip() == (
        f"amps-py: cannot connect to 127.0.0.1:{port}: connection refused: nothing listens "
        f"on port {port}. Is the instance running, and does a client Transport of its config "
        "name that port in InetAddr? (`amps-py serve` listens on 127.0.0.1:9007 by default)"
    )


def test_uri_list_with_nothing_up_says_once_how_long_it_retries(tmp_path: Path) -> None:
    with reserve_port() as one, reserve_port() as two:
        pair_ports = [s.getsockname()[1] for s in (one, two)]
        pair = ",".join(f"tcp://127.0.0.1:{port}/amps/json" for port in pair_ports)
        res = run("publish", pair, "orders", "{}", "--timeout", "2", cwd=tmp_path)
    print(res.stderr)
    lines = res.stderr.splitlines()
    assert res.returncode == 1
    notice = (
        "amps-py: retrying the URIs in turn until one accepts a logon (for up to 2 s, "
        "--timeout); Ctrl-C stops it"
    )
    assert lines[0] == notice and lines.count(notice) == 1, lines
    assert "cannot use" in lines[1] and "accepted a logon within 2 s" in lines[-1]
    # each server's reason (and its hint) once; a retry for the same reason is short
    for port in pair_ports:
        hinted = [line for line in lines if f":{port}: connection refused" in line]
        assert len(hinted) == 1, lines
        assert "Is the instance running" in hinted[0]
    repeats = [line for line in lines if "(as before); next attempt in" in line]
    assert repeats, f"the client retried for 2 s and said nothing of it: {lines}"


def test_publish_without_a_topic_says_the_topic_is_missing(tmp_path: Path) -> None:
    res = run("publish", "tcp://127.0.0.1:9/amps/json", '{"id":1}', cwd=tmp_path)
    assert res.returncode == 1
    assert res.stderr.strip() == (
        """amps-py: '{"id":1}' looks like a message, not a topic: the topic is missing. Give """
        "both: amps-py publish URI TOPIC DATA, e.g. amps-py publish "
        """tcp://127.0.0.1:9/amps/json orders '{"id":1}'"""
    )
