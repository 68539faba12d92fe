"""Password checks behind the auth gate, on a real instance process: back-off after
failed logons (per user and per address, client logons, replication hellos and the
admin API alike), the failure log lines, and their summary under a flood.

Peers on other addresses connect from 127.0.0.2, 127.0.0.3, ... (Linux routes all of
127/8 to the loopback), so per-address counts are seen apart without a second host.
Each wrong password is different (a repeat of the same wrong credentials is answered
from memory and not counted): drawn from a seeded random generator, the seed printed.
"""

from __future__ import annotations

import base64
import http.client
import json
import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import trio
from harness import ServerProcess, security_xml, wait_until, write_config

from amps_py import events
from amps_py.auth_backoff import FIRST_BACKOFF, THRESHOLD
from amps_py.protocol import FrameDecoder, encode_frame
from amps_py.replication.link import Refused, UpstreamLink

PASSWORDS = {"alice": "Alice-Secret-771", "bob": "Bob-Secret-772", "repl": "Repl-Secret-773"}
RULES = {
    "alice": {"read": ".*", "write": ".*", "admin": True},
    "bob": {"read": ".*", "write": ".*"},
    "repl": {"replication_logon": True},
}
SEED = 2025_11_28
TOO_MANY = "too many failed logons"
WRONG = "unknown user or wrong password"


@pytest.fixture
def rng() -> random.Random:
    print(f"random seed {SEED}")
    return random.Random(SEED)


def wrong_password(rng: random.Random) -> str:
    return f"wrong-{rng.randrange(10**12):012d}"


@pytest.fixture
def server(tmp_path: Path) -> Iterator[ServerProcess]:
    extra = security_xml(tmp_path, PASSWORDS, RULES) + (
        "<Admin><InetAddr>127.0.0.1:0</InetAddr></Admin>"
    )
    replication = (
        "<Transport><Name>amps-replication</Name><Type>amps-replication</Type>"
        "<InetAddr>127.0.0.1:0</InetAddr></Transport>"
    )
    config = write_config(tmp_path, "gate", 0, extra=extra, extra_transport=replication)
    proc = ServerProcess(config, tmp_path, 0, "gate")
    proc.start()
    try:
        yield proc
    finally:
        if proc.alive:
            proc.stop()


def ports(server: ServerProcess) -> dict[str, int]:
    return dict(json.loads(server.ready_file.read_text())["transports"])


def log_text(server: ServerProcess) -> str:
    return "".join(
        f.read_text(errors="replace") for f in (server.log_file, server.output) if f.exists()
    )


def lines_with(server: ServerProcess, code: str) -> list[str]:
    return [line for line in log_text(server).splitlines() if code in line]


async def logon(
    server: ServerProcess, user: str, password: str, local: str = "127.0.0.1"
) -> dict[str, Any]:
    """One logon from ``local``: the server's answer (the logon ack's header)."""
    stream = await trio.open_tcp_stream("127.0.0.1", server.port, local_address=local)
    decoder = FrameDecoder(1024 * 1024)
    header = {"c": "logon", "client_name": f"c-{user[:20]}-{local}", "user_id": user}
    header.update(pw=password, a="processed", cid="1")
    async with stream:
        await stream.send_all(encode_frame(header))
        with trio.fail_after(60):
            while data := await stream.receive_some(65536):
                decoder.receive_data(data)
                for frame in decoder.frames():
                    return dict(frame.header)
    raise AssertionError(f"no answer to the logon of {user!r} from {local}")


def refusal(ack: dict[str, Any]) -> str:
    """'' for a success, else the failure's reason and detail."""
    if ack.get("status") == "success":
        return ""
    return f"{ack.get('reason')}: {ack.get('detail', '')}"


async def wait_logged_on(server: ServerProcess, user: str, local: str) -> None:
    """Poll until ``user`` (right password) logs on from ``local``: a back-off ended."""
    state = {"last": ""}

    async def attempt() -> None:
        state["last"] = refusal(await logon(server, user, PASSWORDS[user], local))

    deadline = trio.current_time() + 20 * FIRST_BACKOFF
    await attempt()
    while state["last"]:
        assert TOO_MANY in state["last"], state["last"]
        assert trio.current_time() < deadline, f"still refused: {state['last']}"
        await trio.sleep(0.05)  # polling interval of a condition, not a synchronisation
        await attempt()


# ------------------------------------------------------------------ client logons


async def test_wrong_passwords_back_off_the_address_and_the_user(
    server: ServerProcess, rng: random.Random
) -> None:
    for _ in range(THRESHOLD):
        answer = refusal(await logon(server, "alice", wrong_password(rng)))
        assert answer == f"auth failure: {WRONG}", answer
    # the right password is refused too while the back-off runs, without a check
    answer = refusal(await logon(server, "alice", PASSWORDS["alice"]))
    assert answer.startswith("auth failure: ") and TOO_MANY in answer and "retry in" in answer
    # the same user from another address, and another user from the same address
    assert TOO_MANY in refusal(await logon(server, "alice", PASSWORDS["alice"], "127.0.0.2"))
    assert TOO_MANY in refusal(await logon(server, "bob", PASSWORDS["bob"], "127.0.0.1"))
    # another user from another address is not affected
    assert refusal(await logon(server, "bob", PASSWORDS["bob"], "127.0.0.3")) == ""
    # the back-off ends; a success resets the user's and the address's counts
    await wait_logged_on(server, "alice", "127.0.0.1")
    for _ in range(THRESHOLD - 1):
        answer = refusal(await logon(server, "alice", wrong_password(rng)))
        assert answer == f"auth failure: {WRONG}", answer
    assert refusal(await logon(server, "alice", PASSWORDS["alice"])) == ""
    started = lines_with(server, events.AUTH_BACKOFF_STARTED)
    assert any("address 127.0.0.1" in line for line in started), started
    assert any("user 'alice'" in line for line in started), started


async def test_logons_opened_at_once_get_no_more_checks_than_one_after_another(
    server: ServerProcess, rng: random.Random
) -> None:
    """Checks in flight count as failures to come: 30 wrong logons sent at once from
    one address get at most THRESHOLD checks, the rest wait and are refused unchecked."""
    answers: list[str] = []

    async def one(password: str) -> None:
        answers.append(refusal(await logon(server, "alice", password, "127.0.0.10")))

    async with trio.open_nursery() as nursery:
        for _ in range(30):
            nursery.start_soon(one, wrong_password(rng))
    checked = [a for a in answers if a == f"auth failure: {WRONG}"]
    unchecked = [a for a in answers if TOO_MANY in a]
    assert 1 <= len(checked) <= THRESHOLD, answers
    assert len(checked) + len(unchecked) == 30, answers


async def test_the_same_wrong_password_again_is_not_counted(server: ServerProcess) -> None:
    """A peer retrying its one wrong password (a misconfiguration) locks nobody out:
    a repeat is answered at once and not counted."""
    for _ in range(3 * THRESHOLD):
        answer = refusal(await logon(server, "alice", "the-same-wrong-password"))
        assert answer == f"auth failure: {WRONG}", answer
    assert refusal(await logon(server, "alice", PASSWORDS["alice"])) == ""

    def logged() -> str | None:
        lines = lines_with(server, events.CLIENT_AUTH_FAILED)
        again = [line for line in lines if f"{WRONG} (again)" in line]
        # the first was checked; the next ones (up to 5 lines per address in 10 s) not
        if len(lines) < THRESHOLD or len(again) != THRESHOLD - 1:
            return f"{len(lines)} failure lines, {len(again)} of them for a repeat"
        return None

    await wait_until(logged, 60)
    assert not lines_with(server, events.AUTH_BACKOFF_STARTED)


async def test_failure_lines_name_user_peer_and_transport_never_the_password(
    server: ServerProcess, rng: random.Random
) -> None:
    secret = wrong_password(rng)
    long_user = "u" * 500
    assert refusal(await logon(server, "alice", secret, "127.0.0.4"))
    assert refusal(await logon(server, long_user, secret + "x", "127.0.0.4"))

    def logged() -> str | None:
        lines = lines_with(server, events.CLIENT_AUTH_FAILED)
        if len(lines) < 2:
            return f"{len(lines)} failure lines, want 2"
        return None

    await wait_until(logged, 60)
    first, second = lines_with(server, events.CLIENT_AUTH_FAILED)[:2]
    assert "user 'alice' from 127.0.0.4:" in first and "on transport json-tcp" in first, first
    assert WRONG in first
    assert "(cut, 500 characters)" in second and "u" * 65 not in second, second
    text = log_text(server)
    assert secret not in text and PASSWORDS["alice"] not in text


async def test_a_flood_is_summed_into_one_line_per_address(
    server: ServerProcess, rng: random.Random
) -> None:
    flood = 40
    for _ in range(flood):
        assert refusal(await logon(server, "mallory", wrong_password(rng), "127.0.0.5"))

    def summed() -> str | None:
        if not lines_with(server, events.AUTH_FAILURES_SUMMARY):
            return "no summary line yet"
        return None

    await wait_until(summed, 30)  # the summary comes when the 10 s window ends
    own = [ln for ln in lines_with(server, events.CLIENT_AUTH_FAILED) if "127.0.0.5" in ln]
    (summary,) = lines_with(server, events.AUTH_FAILURES_SUMMARY)
    assert len(own) < flood
    assert f"{flood - len(own)} more failed logons from 127.0.0.5 in the last 10 s" in summary


async def test_commands_behind_a_logon_are_handled_after_its_answer(
    server: ServerProcess,
) -> None:
    """The logon awaits its check off the event loop; what the client sent behind it in
    the same packet is handled after the logon's answer, in order."""
    stream = await trio.open_tcp_stream("127.0.0.1", server.port, local_address="127.0.0.11")
    logon_frame = {"c": "logon", "client_name": "pipelined", "user_id": "bob"}
    logon_frame.update(pw=PASSWORDS["bob"], a="processed", cid="1")
    packet = (
        encode_frame(logon_frame)
        + encode_frame({"c": "publish", "t": "orders", "a": "processed", "cid": "2"}, b"{}")
        + encode_frame({"c": "heartbeat", "a": "processed", "cid": "3"})
    )
    decoder = FrameDecoder(1024 * 1024)
    seen: list[tuple[str, str]] = []
    async with stream:
        await stream.send_all(packet)
        with trio.fail_after(60):
            while len(seen) < 3:
                data = await stream.receive_some(65536)
                assert data, f"closed after {seen}"
                decoder.receive_data(data)
                seen += [(f.header["cid"], f.header["status"]) for f in decoder.frames()]
    assert seen == [("1", "success"), ("2", "success"), ("3", "success")]


# ------------------------------------------------------------------ replication hellos


async def hello(
    port: int, credentials: tuple[str, str] | None, local: str = "127.0.0.1"
) -> Refused | None:
    """Send one replication hello; the refusal (None: not refused)."""
    link = UpstreamLink(0.0, 1.0)
    stream = await trio.open_tcp_stream("127.0.0.1", port, local_address=local)
    async with stream:
        data = link.hello(
            name="Z",
            group="gz",
            destination="gate",
            sync="async",
            topics=[],
            now=0.0,
            credentials=credentials,
        )
        await stream.send_all(data)
        with trio.fail_after(60):
            while data := await stream.receive_some(65536):
                for event in link.receive_data(data, 0.0):
                    if isinstance(event, Refused):
                        return event
    return None


async def test_replication_hellos_are_logged_and_backed_off(
    server: ServerProcess, rng: random.Random
) -> None:
    port = ports(server)["amps-replication"]
    refused = await hello(port, None, "127.0.0.6")
    assert refused is not None and refused.reason == "auth failure"
    for _ in range(THRESHOLD):
        refused = await hello(port, ("repl", wrong_password(rng)), "127.0.0.7")
        assert refused is not None and refused.reason == "auth failure"
        assert TOO_MANY not in refused.detail
    refused = await hello(port, ("repl", PASSWORDS["repl"]), "127.0.0.7")
    assert refused is not None and refused.reason == "auth failure"
    assert TOO_MANY in refused.detail and "retry in" in refused.detail

    def logged() -> str | None:
        lines = lines_with(server, events.REPLICATION_AUTH_FAILED)
        if not any("user (none given) from 127.0.0.6" in line for line in lines):
            return "no line for the hello without credentials"
        if sum("user 'repl' from 127.0.0.7" in line for line in lines) < THRESHOLD:
            return "fewer lines than wrong passwords from 127.0.0.7"
        started = lines_with(server, events.AUTH_BACKOFF_STARTED)
        if not any("address 127.0.0.7" in line for line in started):
            return "no back-off line for 127.0.0.7"
        return None

    await wait_until(logged, 60)
    first = lines_with(server, events.REPLICATION_AUTH_FAILED)[0]
    assert "replication hello of upstream Z" in first, first
    assert PASSWORDS["repl"] not in log_text(server)


# ------------------------------------------------------------------ the admin API


def admin_get(port: int, user: str, password: str, local: str) -> tuple[int, str]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=20, source_address=(local, 0))
    token = base64.b64encode(f"{user}:{password}".encode()).decode()
    try:
        conn.request("GET", "/amps/instance/name", headers={"Authorization": f"Basic {token}"})
        response = conn.getresponse()
        return response.status, response.read().decode()
    finally:
        conn.close()


async def test_admin_401s_are_counted_the_same_way(
    server: ServerProcess, rng: random.Random
) -> None:
    port = ports(server)["admin"]
    assert admin_get(port, "alice", PASSWORDS["alice"], "127.0.0.8")[0] == 200
    for _ in range(THRESHOLD):
        status, body = admin_get(port, "alice", wrong_password(rng), "127.0.0.8")
        assert status == 401 and TOO_MANY not in body, body
    status, body = admin_get(port, "alice", PASSWORDS["alice"], "127.0.0.8")
    assert status == 401 and TOO_MANY in body and "retry in" in body, body
    # one tracker for every entry point: a client logon as alice is backed off too
    assert TOO_MANY in refusal(await logon(server, "alice", PASSWORDS["alice"], "127.0.0.9"))

    def logged() -> str | None:
        lines = lines_with(server, events.ADMIN_AUTH_FAILED)
        # (the backed-off one, past 5 lines from one address in 10 s, goes to a summary)
        if len(lines) < THRESHOLD:
            return f"{len(lines)} admin failure lines, want {THRESHOLD}"
        return None

    await wait_until(logged, 60)
    lines = lines_with(server, events.ADMIN_AUTH_FAILED)
    assert all("user 'alice' from 127.0.0.8:" in ln and "admin API" in ln for ln in lines)
    assert PASSWORDS["alice"] not in log_text(server)


async def test_the_metrics_count_failures_checks_and_unchecked_refusals(
    server: ServerProcess, rng: random.Random
) -> None:
    for _ in range(THRESHOLD):
        assert WRONG in refusal(await logon(server, "bob", wrong_password(rng), "127.0.0.20"))
    # backed off: refused without a check
    assert TOO_MANY in refusal(await logon(server, "bob", wrong_password(rng), "127.0.0.20"))
    port = ports(server)["admin"]
    conn = http.client.HTTPConnection(
        "127.0.0.1", port, timeout=20, source_address=("127.0.0.22", 0)
    )
    token = base64.b64encode(f"alice:{PASSWORDS['alice']}".encode()).decode()
    try:
        conn.request("GET", "/metrics", headers={"Authorization": f"Basic {token}"})
        response = conn.getresponse()
        text = response.read().decode()
    finally:
        conn.close()
    assert response.status == 200, text
    values = {
        line.split("{")[0]: float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("amps_auth_")
    }
    assert values["amps_auth_checks_total"] == THRESHOLD + 1, values  # and alice's own
    assert values["amps_auth_failures_total"] == THRESHOLD + 1, values
    assert values["amps_auth_refused_unchecked_total"] >= 1, values
