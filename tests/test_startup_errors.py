"""`amps-py serve` says what actually failed when an instance cannot start, and
`amps-py config check` finds listeners that share an address before anything starts.

Every case runs the real `amps-py` command in a subprocess, as a user would.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from cluster import replication_transport_xml
from harness import start_instance, write_config

from amps_py.config import load_config


def command() -> list[str]:
    """The venv's `amps-py` console script (``python -m amps_py`` if not installed)."""
    script = Path(sys.executable).with_name("amps-py")
    return [str(script)] if script.exists() else [sys.executable, "-m", "amps_py"]


def amps_py(*args: str, cwd: Path, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*command(), *args], cwd=cwd, capture_output=True, text=True, timeout=timeout, check=False
    )


def one_line(result: subprocess.CompletedProcess[str]) -> str:
    """The single error line `amps-py` printed (no traceback)."""
    assert "Traceback" not in result.stderr, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    return lines[0]


@pytest.fixture
def held_port() -> Iterator[int]:
    """A port some other program listens on (a socket this test holds, bound on port 0)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield int(sock.getsockname()[1])


# ------------------------------------------------------------------ journal directory


def journal_at(tmp_path: Path, journal: Path) -> Path:
    """A config whose JournalDirectory is ``journal`` (client transport on port 0)."""
    config = write_config(tmp_path, "jd", 0)
    config.write_text(config.read_text().replace(str(tmp_path / "jd-journal"), str(journal)))
    return config


def assert_journal_directory_named(line: str, journal: Path, why: str) -> None:
    assert line.startswith("amps-py: cannot start: "), line
    assert f"the journal directory {journal} cannot be opened for writing" in line, line
    assert why in line, line
    assert "Fix: " in line and "TransactionLog/JournalDirectory" in line, line
    assert "port" not in line, f"a journal problem reported as a port problem: {line}"


def test_a_journal_directory_under_a_file_is_named(tmp_path: Path) -> None:
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("a file where the journal's parent directory should be\n")
    journal = blocker / "journal"
    result = amps_py("serve", "--config", str(journal_at(tmp_path, journal)), cwd=tmp_path)
    assert result.returncode == 1
    line = one_line(result)
    assert_journal_directory_named(line, journal, f"{blocker} is a file, not a directory")
    log = (tmp_path / "jd.log").read_text()
    assert "05-0020" in log and "is a file, not a directory" in log  # the log says it too


def test_a_read_only_journal_directory_is_named(tmp_path: Path) -> None:
    """The journal directory on a read-only file system (as root, where permissions do
    not stop writes, a read-only bind mount in a private mount namespace), or without
    write permission (as another user)."""
    parent = tmp_path / "ro"
    (parent / "journal").mkdir(parents=True)
    journal = parent / "journal"
    config = journal_at(tmp_path, journal)
    serve = [*command(), "serve", "--config", str(config)]
    if os.geteuid() != 0:
        parent.chmod(0o500)
        journal.chmod(0o500)
        try:
            result = subprocess.run(serve, capture_output=True, text=True, timeout=60)
        finally:
            journal.chmod(0o700)
            parent.chmod(0o700)
        why = "permission denied"
    else:
        unshare = shutil.which("unshare")
        probe = (
            subprocess.run(
                [unshare or "unshare", "--mount", "true"], capture_output=True, check=False
            )
            if unshare
            else None
        )
        if probe is None or probe.returncode != 0:
            pytest.skip("root without `unshare --mount`: no way to make a directory read-only")
        # the mount exists only in the namespace of this one command
        mount = f"mount --bind -o ro '{parent}' '{parent}'"
        result = subprocess.run(
            [unshare or "unshare", "--mount", "sh", "-c", f'{mount} && exec "$@"', "sh", *serve],
            capture_output=True,
            text=True,
            timeout=60,
        )
        if "mount" in result.stderr and "amps-py" not in result.stderr:
            pytest.skip(f"cannot bind-mount read-only here: {result.stderr.strip()}")
        why = "it is on a read-only file system"
    assert result.returncode == 1, result.stderr
    assert_journal_directory_named(one_line(result), journal, why)


# ------------------------------------------------------------------ listeners


def test_a_port_in_use_by_a_running_instance_names_the_transport(tmp_path: Path) -> None:
    """The README's Quick start server still running, a second instance configured on
    its port: the second says which transport and address, and what to do."""
    first = start_instance(tmp_path / "first", "first")
    try:
        config = write_config(tmp_path / "second", "second", first.port)
        result = amps_py("serve", "--config", str(config), cwd=tmp_path)
        assert first.alive
    finally:
        first.stop()
    assert result.returncode == 1
    line = one_line(result)
    assert line.startswith(
        f"amps-py: cannot start: transport json-tcp (tcp) cannot listen on "
        f"127.0.0.1:{first.port}: the address is already in use by another process"
    ), line
    assert line.endswith(
        "Fix: stop that process, or change the InetAddr of Transport json-tcp to a free port"
    ), line
    log = (tmp_path / "second" / "second.log").read_text()
    assert f"cannot listen on 127.0.0.1:{first.port}" in log


def test_the_embedded_default_on_a_port_in_use_says_which_flag_moves_it(
    tmp_path: Path, held_port: int
) -> None:
    result = amps_py(
        "serve", "--port", str(held_port), "--admin-port", "0", "--data-dir", "data", cwd=tmp_path
    )
    assert result.returncode == 1
    line = one_line(result)
    assert (
        f"transport json-tcp (tcp) cannot listen on 127.0.0.1:{held_port}: the address is "
        "already in use" in line
    ), line
    assert "the embedded default's: run `amps-py serve --port N`, 0 for any free port" in line


def test_a_replication_port_in_use_names_the_replication_transport(
    tmp_path: Path, held_port: int
) -> None:
    config = write_config(
        tmp_path, "r", 0, extra_transport=replication_transport_xml(held_port, name="peers")
    )
    result = amps_py("serve", "--config", str(config), cwd=tmp_path)
    assert result.returncode == 1
    line = one_line(result)
    assert (
        f"transport peers (amps-replication) cannot listen on 127.0.0.1:{held_port}: "
        "the address is already in use" in line
    ), line
    assert "change the InetAddr of Transport peers" in line, line


def test_an_admin_port_in_use_names_the_admin_interface(tmp_path: Path, held_port: int) -> None:
    config = write_config(
        tmp_path, "a", 0, extra=f"<Admin><InetAddr>127.0.0.1:{held_port}</InetAddr></Admin>"
    )
    result = amps_py("serve", "--config", str(config), cwd=tmp_path)
    assert result.returncode == 1
    line = one_line(result)
    assert (
        f"amps-py: cannot start: the admin interface cannot listen on 127.0.0.1:{held_port}: "
        "the address is already in use" in line
    ), line
    assert "Fix: stop that process, or change Admin/InetAddr to a free port" in line, line


def test_an_address_of_another_host_is_named(tmp_path: Path) -> None:
    config = write_config(tmp_path, "far", 0)
    config.write_text(config.read_text().replace("127.0.0.1:0", "192.0.2.1:0"))
    result = amps_py("serve", "--config", str(config), cwd=tmp_path)
    assert result.returncode == 1
    line = one_line(result)
    assert "transport json-tcp (tcp) cannot listen on 192.0.2.1:0" in line, line
    assert "192.0.2.1 is not an address of this host" in line, line


# ------------------------------------------------------------------ config check

SHARED = """<?xml version="1.0"?>
<AMPSConfig>
  <Name>shared</Name>
  <Transports>
    <Transport>
      <Name>json-tcp</Name><Type>tcp</Type><InetAddr>{client}</InetAddr>
      <Protocol>amps</Protocol><MessageType>json</MessageType>
    </Transport>
    <Transport>
      <Name>peers</Name><Type>amps-replication</Type><InetAddr>{replication}</InetAddr>
    </Transport>
  </Transports>
  <TransactionLog>
    <JournalDirectory>./journal</JournalDirectory>
    <Topic><Name>.*</Name><MessageType>json</MessageType></Topic>
  </TransactionLog>
  <Admin>
    <InetAddr>{admin}</InetAddr>
  </Admin>
</AMPSConfig>
"""


@pytest.mark.parametrize(
    ("client", "replication", "admin", "line", "problem"),
    [
        (
            "127.0.0.1:9307",
            "9307",
            "127.0.0.1:9308",
            10,
            "AMPSConfig/Transports/Transport/InetAddr: InetAddr 9307 clashes with transport "
            "'json-tcp' on line 6, which listens on the same port (127.0.0.1:9307)",
        ),
        (
            "127.0.0.1:9307",
            "127.0.0.1:9309",
            "localhost:9307",
            18,
            "AMPSConfig/Admin/InetAddr: Admin InetAddr localhost:9307 clashes with transport "
            "'json-tcp' on line 6, which listens on the same port (127.0.0.1:9307)",
        ),
        (
            "127.0.0.1:9307",
            "9309",
            "127.0.0.1:9309",
            18,
            "AMPSConfig/Admin/InetAddr: Admin InetAddr 127.0.0.1:9309 clashes with transport "
            "'peers' on line 10, which listens on the same port (port 9309 on every address)",
        ),
    ],
    ids=["replication-and-client", "admin-and-client", "admin-and-replication"],
)
def test_config_check_finds_listeners_on_one_address(
    tmp_path: Path, client: str, replication: str, admin: str, line: int, problem: str
) -> None:
    path = tmp_path / "shared.xml"
    path.write_text(SHARED.format(client=client, replication=replication, admin=admin))
    result = amps_py("config", "check", str(path), cwd=tmp_path)
    assert result.returncode == 2, result.stdout + result.stderr
    lines = result.stderr.strip().splitlines()
    assert lines[0] == f"amps-py: 1 configuration problem in {path}:", result.stderr
    assert lines[1].startswith(f"  {path}:{line}: {problem}"), lines[1]
    assert "Fix: give " in lines[1] and "(or port 0 for a free one)" in lines[1], lines[1]
    # the same config with every address distinct loads
    path.write_text(
        SHARED.format(client="127.0.0.1:9307", replication="9309", admin="127.0.0.1:9308")
    )
    assert load_config(path).admin == ("127.0.0.1", 9308)
