"""What the log, refusals and errors may show: no secret, no unbounded echo.

* a replication hello whose ``pw`` is over-long or not a string is refused without
  the secret or its length in the refusal or the log;
* a logon with a 1 MiB user_id, or a 1 MiB client name, gives a log line that is cut
  and says so;
* the redaction rule and the caps themselves (pure).

Real server processes and sockets, as in ``test_replication_trust.py``.
"""

from __future__ import annotations

import logging
import random
from pathlib import Path
from typing import Any

import pytest
import trio
from harness import ServerProcess, wait_until, write_config
from test_replication_trust import GOOD_HELLO, Downstream, peer

from amps_py import redact
from amps_py.config import LogTarget
from amps_py.logs import configure_logging, log_event, reset_logging
from amps_py.protocol import FrameDecoder, encode_frame

SEED = 20261128
#: a password with nothing in common with the rest of the log
SECRET = "Tr0ub4dor&3-correct-horse-battery-staple"


def secret_pw(length: int) -> str:
    rng = random.Random(SEED)
    return SECRET + "".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(length))


# --------------------------------------------------------------------------- the rules


def test_secret_names() -> None:
    for name in (
        "pw",
        "PW",
        "pwd",
        "password",
        "Password",
        "passwd",
        "passphrase",
        "client_secret",
        "token",
        "access_token",
        "credentials",
        "Authorization",
        "private_key",
        "PrivateKey",
        "api-key",
        "cookie",
    ):
        assert redact.is_secret(name), name
    for name in (
        "user_id",
        "client_name",
        "k",
        "key",
        "topic",
        "PasswordFile",
        "PasswordEnv",
        "password_path",
        "",
        "s",
        "bm",
    ):
        assert not redact.is_secret(name), name
    assert not redact.is_secret(3)


def test_shown_masks_secrets_whatever_their_type_and_cuts_the_rest() -> None:
    for value in (SECRET, 12345678901234567890, ["a", SECRET], {"x": SECRET}, None, "x" * 10**6):
        assert redact.shown("pw", value) == redact.MASK
    assert redact.shown("user_id", "u" * 1000) == "u" * 256 + "... [cut 744 chars]"
    assert redact.redact_fields({"c": "logon", "pw": SECRET, "nested": {"password": 1}}) == {
        "c": "logon",
        "pw": redact.MASK,
        "nested": {"password": redact.MASK},
    }


def test_uri_passwords_are_masked_and_the_user_kept() -> None:
    text = "cannot reach tcp://alice:s3cr@t@host:9007/amps/json, tcps://bob@h:1/amps and x://y"
    assert redact.redact_uris(text) == (
        "cannot reach tcp://alice:[redacted]@host:9007/amps/json, tcps://bob@h:1/amps and x://y"
    )


def test_every_log_line_is_cut_and_masked(tmp_path: Path) -> None:
    """The formatter caps arguments and lines and masks URI passwords for every logger;
    log_event masks secret fields."""
    log_file = tmp_path / "t.log"
    configure_logging((LogTarget(protocol="file", file_name=str(log_file), level="info"),), "t")
    try:
        log = logging.getLogger("amps_py.test_hygiene")
        log.info("logon of user %r refused", "u" * 1_048_576)
        log.info("x" * 100_000)
        log.info("cannot connect to %s", f"tcp://alice:{SECRET}@h:1/amps/json")
        log_event(log, "info", "07-0099", "hello", pw=SECRET, password=123456789, user="bob")
    finally:
        reset_logging()
    lines = log_file.read_text().splitlines()
    assert len(lines) == 4, lines
    assert all(len(line) < redact.MAX_LINE_CHARS + 200 for line in lines)
    assert "[cut 1046528 chars]" in lines[0], lines[0][-80:]
    assert "[cut 91808 chars]" in lines[1], lines[1][-80:]
    assert SECRET not in lines[2] and "tcp://alice:[redacted]@h:1" in lines[2]
    assert SECRET not in lines[3] and "123456789" not in lines[3], lines[3]
    assert "pw=[redacted] password=[redacted] user=bob" in lines[3]


# ------------------------------------------------------------------ replication hellos

#: (what, the pw field of the hello, texts that must appear in neither refusal nor log)
BAD_PW: list[tuple[str, Any, list[str]]] = [
    ("an over-long string", secret_pw(5000), [SECRET, "5040", "Tr0ub"]),
    ("a number", 84726193650127, ["84726193650127", "8472619"]),
    ("a list", [SECRET, "second"], [SECRET, "second", "Tr0ub"]),
    ("an object", {"secret": SECRET}, [SECRET, "Tr0ub"]),
]


@pytest.mark.parametrize("auth", [False, True], ids=["open", "password-file"])
async def test_bad_pw_in_a_hello_is_refused_without_echoing_it(tmp_path: Path, auth: bool) -> None:
    print(f"seed {SEED}")
    extra = ""
    if auth:
        users = tmp_path / "users.pw"
        users.write_text("")
        users.chmod(0o600)
        extra = (
            "<Authentication><Module>amps-password-file</Module><Options>"
            f"<PasswordFile>{users}</PasswordFile></Options></Authentication>"
        )
    b = Downstream(tmp_path, extra=extra)
    try:
        refusals = []
        for what, pw, _ in BAD_PW:
            async with peer(b.replication_port) as p:
                await p.hello({**GOOD_HELLO, "user_id": "up", "pw": pw})
                answer = await p.refusal()
                assert answer["reason"] == "malformed hello", (what, answer)
                assert "field 'pw'" in answer["detail"], (what, answer)
                refusals.append((what, answer["detail"]))
        await b.wait_logged("15-0003", "field 'pw'", "an object")
        log = b.log()
        for (what, _, hidden), (_, detail) in zip(BAD_PW, refusals, strict=True):
            for text in hidden:
                assert text not in detail, f"{what}: the refusal shows {text!r}: {detail}"
                assert text not in log, f"{what}: the log shows {text!r}"
            assert redact.MASK in detail, detail
        # the type is said, so the operator knows what the upstream got wrong
        assert "got a number [redacted]" in log and "got a list [redacted]" in log
    finally:
        b.stop()


# ----------------------------------------------------------------- client logons


async def _logon(port: int, header: dict[str, Any]) -> dict[str, Any]:
    """Send one logon; the ack's header (``{}`` if the server closed first)."""
    stream = await trio.open_tcp_stream("127.0.0.1", port)
    decoder = FrameDecoder(64 * 1024 * 1024)
    try:
        await stream.send_all(encode_frame({"c": "logon", "a": "processed", "cid": "1", **header}))
        with trio.fail_after(60):
            while True:
                for frame in decoder.frames():
                    return dict(frame.header)
                data = await stream.receive_some(65536)
                if not data:
                    return {}
                decoder.receive_data(data)
    finally:
        await trio.aclose_forcefully(stream)


async def test_a_1_mib_user_id_or_a_long_client_name_gives_a_cut_log_line(tmp_path: Path) -> None:
    config = write_config(tmp_path, "A", 0)
    server = ServerProcess(config, tmp_path, 0, "A")
    server.start()
    try:
        huge_user = "U" * 1_048_576
        ack = await _logon(server.port, {"client_name": "short", "user_id": huge_user})
        assert ack.get("status") == "success", ack
        # a client name of 1 MiB is refused unechoed (invalid client name); the longest
        # accepted (65,535 bytes, what the journal stores) is echoed, cut
        ack = await _logon(server.port, {"client_name": "N" * 1_048_576})
        assert ack.get("status") == "failure", ack
        ack = await _logon(server.port, {"client_name": "N" * 65_535})
        assert ack.get("status") == "success", ack

        def both_logged() -> str | None:
            text = server.log_file.read_text()
            if "UUUU" not in text or "NNNN" not in text:
                return "the two logons are not logged yet"
            return None

        await wait_until(both_logged, 60)
        lines = server.log_file.read_text().splitlines()
        for letter in "UN":
            found = [ln for ln in lines if letter * 100 in ln]
            assert found, f"no line shows the {letter} field"
            for line in found:
                assert len(line) <= redact.MAX_LINE_CHARS + 200, len(line)
                assert "[cut " in line, line[-120:]
        assert server.alive
    finally:
        assert server.stop() == 0, server.tail()
