"""The README's "Analyse journals with Spark" section, run word for word.

The hot-hot walkthrough (config/examples/hot-hot) leaves ``./amps-data/amps-a`` and
``./amps-data/amps-b`` beside ``config/examples/hot-hot/``; the README's pipeline
commands are written against exactly those directories. Here the two instances run
from copies of the shipped configs (fresh ports; the journals where the shipped
configs put them, relative to the working directory), take published messages, stop,
and then every command of the section's ``bash`` block and its ``python`` block runs
as the README prints it, from that working directory. A command the README shows
must work as shown.
"""

from __future__ import annotations

import re
import shlex
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import test_examples_running as examples_running
from clirun import amps_py_command, cli_env
from harness import REPO, ServerProcess, wait_until_sync

from txlog import Journal

pytestmark = pytest.mark.slow

README = REPO / "README.md"
HOT_HOT = REPO / "config" / "examples" / "hot-hot"
MESSAGES = 1200


def section() -> str:
    text = README.read_text()
    return text[text.index("## Analyse journals with Spark") : text.index("## The contract")]


def bash_commands() -> list[str]:
    """The command lines of the section's ``bash`` block (comments dropped)."""
    (block,) = re.findall(r"```bash\n(.*?)```", section(), re.DOTALL)
    return [line for line in block.splitlines() if line.strip() and not line.startswith("#")]


def python_block() -> str:
    (block,) = re.findall(r"```python\n(.*?)```", section(), re.DOTALL)
    return str(block)


def journal_count(path: Path) -> int:
    if not (path / "data.mdb").is_file():
        return 0
    with Journal(path, readonly=True) as journal:
        return journal.last_txid


def walkthrough_directories(workdir: Path, started: list[ServerProcess]) -> None:
    """``workdir`` as the hot-hot walkthrough leaves it: both instances' journals
    under ``./amps-data`` holding MESSAGES orders published to amps-a, and the
    configs under ``config/examples/hot-hot/``."""
    servers = examples_running.copy_example(sorted(HOT_HOT.glob("*.xml")), workdir)
    for name, server in servers.items():
        text = server.config.read_text()
        local = re.sub(
            r"<JournalDirectory>[^<]*</JournalDirectory>",
            f"<JournalDirectory>./amps-data/{name}</JournalDirectory>",
            text,
        )
        assert local != text, f"{server.config} names no JournalDirectory"
        server.config.write_text(local)
    configs = workdir / "config" / "examples" / "hot-hot"
    configs.mkdir(parents=True)
    for shipped in HOT_HOT.iterdir():  # the copied configs and the files beside them
        if (workdir / shipped.name).is_file():
            shutil.copy(workdir / shipped.name, configs / shipped.name)
    started.extend(servers.values())
    examples_running.start_all(servers)

    lines = workdir / "orders.jsonl"
    lines.write_text("".join(f'{{"id": {i}, "qty": {i % 7}}}\n' for i in range(MESSAGES)))
    a = servers["amps-a"]
    out = subprocess.run(
        [*amps_py_command(), "publish", a.uri, "orders", "--file", str(lines)],
        capture_output=True,
        text=True,
        timeout=180,
        env=cli_env(),
        cwd=workdir,
        check=False,
    )
    assert out.returncode == 0, out.stderr
    journals = {name: workdir / "amps-data" / name for name in servers}

    def replicated() -> str | None:
        held = {name: journal_count(path) for name, path in journals.items()}
        return None if min(held.values()) >= MESSAGES else f"journals hold {held}"

    wait_until_sync(replicated, 120)
    for server in servers.values():
        server.signal(signal.SIGINT)
        assert server.proc is not None and server.proc.wait(timeout=60) == 0, server.tail()


@pytest.fixture(scope="module")
def walkthrough(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The working directory the hot-hot walkthrough leaves (instances stopped)."""
    workdir = tmp_path_factory.mktemp("readme") / "walkthrough"
    started: list[ServerProcess] = []
    try:
        walkthrough_directories(workdir, started)
    finally:
        for server in started:
            if server.alive:
                server.stop()
        while examples_running._RESERVED:
            examples_running._RESERVED.pop().close()
    yield workdir


def readme_command(verb: str) -> str:
    commands = bash_commands()
    assert [shlex.split(c)[:3] for c in commands] == [
        ["amps-py", "pipeline", "export"],
        ["amps-py", "pipeline", "audit"],
        ["amps-py", "pipeline", "stats"],
    ], commands
    (command,) = [c for c in commands if shlex.split(c)[2] == verb]
    return command


def run_in(args: list[str], workdir: Path) -> subprocess.CompletedProcess[str]:
    """``args`` run in ``workdir`` with the test's environment, output captured."""
    return subprocess.run(
        args, capture_output=True, text=True, timeout=900, env=cli_env(), cwd=workdir, check=False
    )


def run_as_written(command: str, workdir: Path) -> subprocess.CompletedProcess[str]:
    """``command`` from the README, run in ``workdir``; it must succeed."""
    out = run_in([*amps_py_command(), *shlex.split(command)[1:]], workdir)
    print(f"$ {command}\n{out.stdout[-2000:]}{out.stderr[-2000:]}")
    assert out.returncode == 0, f"{command} exited {out.returncode}:\n{out.stderr}"
    assert "Traceback" not in out.stderr, out.stderr
    return out


def exported(workdir: Path) -> None:
    """The README's export, once (the audit and the Python block read it)."""
    if not (workdir / "export").is_dir():
        run_as_written(readme_command("export"), workdir)


def test_readme_export_exports_every_instance_under_amps_data(walkthrough: Path) -> None:
    out = run_as_written(readme_command("export"), walkthrough)
    for name in ("amps-a", "amps-b"):
        assert f"exported {MESSAGES:,} records of instance {name}" in out.stderr + out.stdout


def test_readme_audit_runs_as_written_and_finds_no_problem(walkthrough: Path) -> None:
    run_as_written(readme_command("audit"), walkthrough)
    assert (walkthrough / "audit-report").is_dir()


def test_readme_stats_counts_every_instance_under_amps_data(walkthrough: Path) -> None:
    out = run_as_written(readme_command("stats"), walkthrough)
    assert "amps-a" in out.stdout and "amps-b" in out.stdout, out.stdout
    assert f"{2 * MESSAGES:,} messages" in out.stdout, out.stdout


def test_readme_python_block_runs_as_written(walkthrough: Path) -> None:
    exported(walkthrough)
    script = python_block()
    assert 'load("./amps-data")' in script and 'read.parquet("./export")' in script, script
    shown = run_in([sys.executable, "-c", script + "\nspark.stop()\n"], walkthrough)
    print(shown.stdout[-3000:], shown.stderr[-3000:])
    assert shown.returncode == 0, shown.stderr
    assert "client_name" in shown.stdout and "count" in shown.stdout, shown.stdout
    assert "amps-a" in shown.stdout and "amps-b" in shown.stdout, shown.stdout
    assert "|symbol|" in shown.stdout, shown.stdout  # the decoded column's query ran
