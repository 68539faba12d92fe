"""A client name that holds publisher state belongs to one user.

The sequence that lost an acknowledged message before: ops published s=1..3 as
``ops-feed`` and left; alice logged on as ``ops-feed`` (getting s=3) and published
s=4,5; ops came back and published s=4, which was acknowledged ``persisted`` as a
duplicate and never stored. Now alice's logon is refused ``not entitled`` naming the
owner, and an administrator can hand the name over explicitly (``amps-py names``).
Real instance processes, real sockets, the real CLI.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import trio
from harness import ServerProcess, start_instance

from amps_py.client import Client, CommandError, open_client
from amps_py.server.name_owners import NameOwners


def names_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "amps_py", "names", *args],
        capture_output=True,
        text=True,
        check=False,
    )


def journal_dir(tmp_path: Path) -> Path:
    return tmp_path / "own-journal"


async def publish_n(client: Client, n: int, who: str) -> None:
    for _ in range(n):
        seq = await client.publish("feed", json.dumps({"by": who}))
        await client.wait_persisted(seq)


async def replay(server: ServerProcess) -> list[tuple[str, dict[str, str]]]:
    """(bookmark, payload) of every record of ``feed``, from EPOCH."""
    async with (
        open_client(server.uri, "reader", user_id="reader") as reader,
        reader.bookmark_subscribe("feed", "0") as sub,
    ):
        with trio.fail_after(30):
            await sub.completed.wait()
        out = []
        for _ in range(sub.delivered):
            message = await sub.get(10)
            out.append((message.bookmark, message.json()))
        return out


async def wait_released(server: ServerProcess, name: str, user: str) -> None:
    """Poll until ``user`` can log on with ``name`` (no live connection holds it)."""

    async def attempt() -> str | None:
        try:
            async with open_client(server.uri, name, user_id=user):
                return None
        except CommandError as exc:
            if exc.reason != "name in use":
                raise
            return f"{name!r} is still held by another connection: {exc}"

    with trio.fail_after(30):
        while (problem := await attempt()) is not None:
            print(problem)
            await trio.sleep(0.05)


async def refused_logon(server: ServerProcess, name: str, user: str) -> CommandError:
    with pytest.raises(CommandError) as info:
        async with open_client(server.uri, name, user_id=user):
            pass
    return info.value


async def test_another_user_cannot_take_a_publishers_name(tmp_path: Path) -> None:
    server = start_instance(tmp_path, "own")
    try:
        async with open_client(server.uri, "ops-feed", user_id="ops") as ops:
            await publish_n(ops, 3, "ops")
        error = await refused_logon(server, "ops-feed", "alice")
        assert error.reason == "not entitled"
        assert "belongs to user 'ops'" in str(error) and "last seq 3" in str(error)
        # ops comes back where it left off, and its next message is stored as seq 4
        async with open_client(server.uri, "ops-feed", user_id="ops") as ops:
            assert int(ops.logon_ack["s"]) == 3
            await publish_n(ops, 1, "ops")
        records = await replay(server)
        assert [payload["by"] for _, payload in records] == ["ops"] * 4
        assert records[-1][0].split("|")[1] == "4"
        # alice's own name is hers: bob cannot take it after she left, she can return
        async with open_client(server.uri, "alice-feed", user_id="alice") as alice:
            await publish_n(alice, 1, "alice")
        assert (await refused_logon(server, "alice-feed", "bob")).reason == "not entitled"
        async with open_client(server.uri, "alice-feed", user_id="alice") as alice:
            assert int(alice.logon_ack["s"]) == 1
        # the refusal is logged, naming the owner
        log = server.log_file.read_text()
        assert "refused: client name 'ops-feed' belongs to user 'ops'" in log
    finally:
        server.stop()


async def test_a_name_without_publisher_state_goes_to_whoever_logs_on(
    tmp_path: Path,
) -> None:
    server = start_instance(tmp_path, "own")
    try:
        async with (
            open_client(server.uri, "dashboard", user_id="alice") as alice,
            alice.subscribe("feed"),
        ):
            pass
        # (alice's connection may still hold the name for a moment after she left)
        await wait_released(server, "dashboard", "bob")
        async with open_client(server.uri, "dashboard", user_id="bob") as bob:
            await publish_n(bob, 1, "bob")
        assert (await refused_logon(server, "dashboard", "alice")).reason == "not entitled"
    finally:
        server.stop()


async def test_ownership_survives_a_restart_and_an_admin_hands_a_name_over(
    tmp_path: Path,
) -> None:
    server = start_instance(tmp_path, "own")
    try:
        async with open_client(server.uri, "ops-feed", user_id="ops") as ops:
            await publish_n(ops, 2, "ops")
        server.stop()
        server.start()
        assert (await refused_logon(server, "ops-feed", "alice")).reason == "not entitled"

        listed = names_cli("list", str(journal_dir(tmp_path)))
        assert listed.returncode == 0, listed.stderr
        assert "ops-feed\tops" in listed.stdout.splitlines()

        # handed over while the instance runs: alice continues the name's seqs
        given = names_cli("give", str(journal_dir(tmp_path)), "ops-feed", "alice")
        assert given.returncode == 0, given.stderr
        assert "owner 'alice' (was 'ops')" in given.stdout
        async with open_client(server.uri, "ops-feed", user_id="alice") as alice:
            assert int(alice.logon_ack["s"]) == 2
            await publish_n(alice, 1, "alice")
        assert (await refused_logon(server, "ops-feed", "ops")).reason == "not entitled"

        # released: the next user to log on takes it
        released = names_cli("release", str(journal_dir(tmp_path)), "ops-feed")
        assert released.returncode == 0, released.stderr
        async with open_client(server.uri, "ops-feed", user_id="ops") as ops:
            assert int(ops.logon_ack["s"]) == 3
        assert (await refused_logon(server, "ops-feed", "alice")).reason == "not entitled"
    finally:
        server.stop()


def test_names_cli_says_what_is_wrong(tmp_path: Path) -> None:
    done = names_cli("list", str(tmp_path / "nowhere"))
    assert done.returncode == 2
    assert "is not a directory" in done.stderr and "JournalDirectory" in done.stderr
    (tmp_path / "empty").mkdir()
    done = names_cli("list", str(tmp_path / "empty"))
    assert done.returncode == 2 and "holds no journal" in done.stderr
    owners = NameOwners.of_journal(tmp_path / "j")
    owners.close()
    done = names_cli("release", str(tmp_path / "j"), "nobody-feed")
    assert done.returncode == 1 and "has no owner" in done.stderr


def test_the_store_forgets_names_without_publisher_state(tmp_path: Path) -> None:
    owners = NameOwners.of_journal(tmp_path)
    try:
        owners.set_owner("kept", "ops")
        owners.set_owner("gone", "ops")
        long_name = "x" * 600  # longer than an LMDB key: stored under its digest
        owners.set_owner(long_name, "ops")
        assert owners.owner(long_name) == "ops"
        assert owners.forget_stateless(lambda name: name == "kept") == 1
        assert owners.owner("kept") == "ops" and owners.owner("gone") is None
        assert owners.owner(long_name) == "ops"
    finally:
        owners.close()
