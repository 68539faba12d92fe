"""The hot-hot demos, run as their documents write them.

- config/examples/hot-hot/README.md, "Trying it": every command of its ``sh`` blocks,
  read from the README (so the test follows the text), with the shipped ports mapped
  to the ports of the running copies (see test_examples_running.copy_example); the
  instances are stopped and started where the prose says so.
- docs/CLIENT.md's ``failover_states`` example: killed with SIGKILL under it while it
  publishes, then the documented downgrade on the survivor; it must finish, and the
  survivor must hold every order once.
"""

from __future__ import annotations

import json
import re
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path

import test_examples_running as examples_running
from clirun import amps_py_command, cli_env
from harness import REPO, ServerProcess, wait_until_sync

README = REPO / "config" / "examples" / "hot-hot" / "README.md"
GUIDE = REPO / "docs" / "CLIENT.md"
FILES = sorted((REPO / "config" / "examples" / "hot-hot").glob("*.xml"))

# the fixtures of test_examples_running: the servers a test started are stopped at
# teardown; the ports reserved for the copies are released
running = examples_running.running
_release_reserved_ports = examples_running._release_reserved_ports


def start_pair(
    workdir: Path, running: list[ServerProcess]
) -> tuple[dict[str, ServerProcess], dict[int, int]]:
    """The example's two instances on fresh ports, and shipped port -> port used."""
    servers = examples_running.copy_example(FILES, workdir)
    ports: dict[int, int] = {}
    for path in FILES:
        shipped = examples_running._INET.finditer(path.read_text())
        used = examples_running._INET.finditer((workdir / path.name).read_text())
        for old, new in zip(shipped, used, strict=True):
            ports[int(old.group(3))] = int(new.group(3))
    running.extend(servers.values())
    examples_running.start_all(servers)
    return servers, ports


def localise(line: str, ports: Mapping[int, int]) -> list[str]:
    """A README command line as arguments: ``amps-py`` as installed here, every
    ``127.0.0.1:PORT`` of the shipped configs mapped to the running copy's port."""
    for old, new in ports.items():
        line = line.replace(f"127.0.0.1:{old}", f"127.0.0.1:{new}")
    args = shlex.split(line, comments=True)
    assert args[0] == "amps-py", line
    return [*amps_py_command(), *args[1:]]


def trying_it_blocks() -> list[list[str]]:
    """The command lines of each ``sh`` block in the README's "Trying it" section."""
    text = README.read_text()
    section = text[text.index("## Trying it") : text.index("## Watching it")]
    blocks = re.findall(r"```sh\n(.*?)```", section, re.DOTALL)
    return [[line for line in block.splitlines() if line.strip()] for block in blocks]


def cli(args: list[str], timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        args, capture_output=True, text=True, timeout=timeout, check=False, env=cli_env()
    )


def test_hot_hot_readme_trying_it(tmp_path: Path, running: list[ServerProcess]) -> None:
    blocks = trying_it_blocks()
    assert [[shlex.split(line)[1] for line in b] for b in blocks] == [
        ["subscribe"],
        ["publish"],
        ["publish"],
        ["admin", "publish", "publish"],
        ["admin", "subscribe"],
    ], blocks
    servers, ports = start_pair(tmp_path / "hot-hot", running)
    b = servers["amps-b"]

    # the subscriber on amps-b, then the publish to amps-a
    out = tmp_path / "subscriber.out"
    with out.open("w") as sink:
        subscriber = subprocess.Popen(
            localise(blocks[0][0], ports),
            stdout=sink,
            stderr=subprocess.PIPE,
            text=True,
            env=cli_env(),
        )
    try:
        b_admin = examples_running.admin_url(b)

        def subscribed() -> str | None:
            clients = examples_running.admin_get(b_admin, "/amps/instance/clients.json")
            return None if clients else "the subscriber has not connected to amps-b"

        wait_until_sync(subscribed, 20)
        first = cli(localise(blocks[1][0], ports))
        assert first.returncode == 0, first.stderr
        assert "published 1 message(s) to orders; persisted through seq 1" in first.stderr
        wait_until_sync(lambda: None if '"id":1' in out.read_text() else "not delivered", 20)

        # Ctrl-C amps-b: its subscriber ends
        b.signal(signal.SIGINT)
        assert b.proc is not None and b.proc.wait(timeout=30) == 0, b.tail()
        _, err = subscriber.communicate(timeout=30)
        assert subscriber.returncode == 1 and "Traceback" not in err, err
    finally:
        if subscriber.poll() is None:
            subscriber.kill()
            subscriber.communicate()

    # amps-b down: a publish waits for it, and the failure says what to do
    (waiting,) = blocks[2]
    done = cli(localise(waiting, ports))
    print(f"$ {waiting}\n{done.stderr}")
    a_admin = f"http://127.0.0.1:{ports[9108]}"
    assert done.returncode == 1, done.stderr
    assert "no persisted ack for seq 1 within 5 s" in done.stderr
    waits = (
        "amps-a waits for its sync replication destination(s) amps-b (not connected to "
        f"127.0.0.1:{ports[9204]}"
    )
    assert waits in done.stderr
    assert f"stop waiting with `amps-py admin --url {a_admin} downgrade amps-b`" in done.stderr

    # the downgrade, then the publishes return at once
    downgrade, *publishes = blocks[3]
    done = cli(localise(downgrade, ports))
    print(f"$ {downgrade}\n{done.stdout}{done.stderr}")
    assert done.returncode == 0 and done.stdout.strip() == "amps-b: downgraded to async", done
    for line in publishes:
        started = time.monotonic()
        done = cli(localise(line, ports))
        took = time.monotonic() - started
        print(f"$ {line}\n{done.stderr}({took:.1f} s)")
        assert done.returncode == 0, done.stderr
        assert "published 1 message(s) to orders; persisted through seq 1" in done.stderr
        assert took < 15, f"the publish took {took:.1f} s with amps-b downgraded"

    # amps-b again: the upgrade, and amps-b holds all four
    b.start()
    upgrade, replay = blocks[4]
    done = cli(localise(upgrade, ports))
    print(f"$ {upgrade}\n{done.stdout}{done.stderr}")
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("amps-b: "), done.stdout
    assert "upgrade" in done.stdout or "already sync" in done.stdout, done.stdout
    done = cli(localise(replay, ports))
    assert done.returncode == 0, done.stderr
    lines = [json.loads(line) for line in done.stdout.splitlines()]
    # 2 too: its publish timed out waiting for amps-b, but amps-a had stored it
    want = [{"id": n} for n in (1, 2, 3, 4)]
    assert [line["data"] for line in lines] == want, done.stdout


def failover_example() -> str:
    text = GUIDE.read_text()
    found = re.search(r"<!-- example: failover_states -->\n```python\n(.*?)```", text, re.DOTALL)
    assert found, "docs/CLIENT.md has no failover_states example"
    return found.group(1)


def documented_downgrade(killed: str, ports: Mapping[int, int]) -> list[str]:
    """The guide's downgrade command for the survivor of ``killed``."""
    text = GUIDE.read_text()
    section = text[text.index("## Failover across") : text.index("## From the command line")]
    for line in re.findall(r"`(amps-py admin --url \S+ downgrade \S+)`", section) + re.findall(
        r"^(amps-py admin --url .*? downgrade \S+)", section, re.MULTILINE
    ):
        if line.endswith(f"downgrade {killed}"):
            return localise(line, ports)
    raise AssertionError(f"docs/CLIENT.md gives no downgrade command for {killed} killed")


def test_failover_demo_survives_kill_9(tmp_path: Path, running: list[ServerProcess]) -> None:
    servers, ports = start_pair(tmp_path / "hot-hot", running)
    code = failover_example()
    for old, new in ports.items():
        code = code.replace(f"127.0.0.1:{old}", f"127.0.0.1:{new}")
    out = tmp_path / "demo.out"
    with out.open("w") as sink:
        demo = subprocess.Popen(
            [sys.executable, "-c", code],
            stdout=sink,
            stderr=subprocess.PIPE,
            text=True,
            cwd=REPO,
            env=cli_env(),
        )
    try:
        # connected, and a few orders out: kill the instance it is connected to
        def published(n: int) -> str | None:
            return None if f"published {n}\n" in out.read_text() else out.read_text()

        wait_until_sync(lambda: published(3), 30)
        first = out.read_text().splitlines()[0]
        assert first.startswith("connected "), first
        by_port = {s.port: name for name, s in servers.items()}
        port = int(re.search(r":(\d+)/", first).group(1))  # type: ignore[union-attr]
        killed = by_port[port]
        survivor = servers["amps-b" if killed == "amps-a" else "amps-a"]
        servers[killed].kill()
        print(f"killed {killed} after: {out.read_text()!r}")
        wait_until_sync(lambda: None if "failed_over" in out.read_text() else "no failover", 30)
        done = cli(documented_downgrade(killed, ports))
        assert done.returncode == 0, done.stderr
        assert done.stdout.strip() == f"{killed}: downgraded to async", done.stdout
        _, err = demo.communicate(timeout=120)
    finally:
        if demo.poll() is None:
            demo.kill()
            demo.communicate()
    text = out.read_text()
    print(text)
    assert demo.returncode == 0, f"{text}\n{err}"
    assert text.splitlines()[-1] == "persisted through 20", text
    assert f"127.0.0.1:{survivor.port}" in text.split("failed_over", 1)[1].splitlines()[0]

    replay = cli(
        [*amps_py_command(), "subscribe", survivor.uri, "orders", "--bookmark", "0",
         "--timeout", "3"]
    )  # fmt: skip
    assert replay.returncode == 0, replay.stderr
    ids = [json.loads(line)["data"]["id"] for line in replay.stdout.splitlines()]
    assert sorted(ids, key=lambda i: int(i.split("-")[1])) == [f"demo-{n}" for n in range(1, 21)], (
        replay.stdout
    )
