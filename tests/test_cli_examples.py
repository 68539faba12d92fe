"""`amps-py config examples` in the layout of an installed wheel: the package copied
alone into a site directory with the examples where the wheel puts them
(``amps_py/_data/examples``, pyproject.toml's force-include), run by the real CLI from
a directory that has no ``config/`` (what a user of ``pip install .`` has)."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from clirun import cli_env, installed_layout
from harness import REPO

#: a Description only the packaged copy has: proves the list is read from the package
MARKER = "packaged copy of the standalone example"


@pytest.fixture
def installed(tmp_path: Path) -> Path:
    """A site directory holding amps_py and txlog as a wheel installs them."""
    site = installed_layout(tmp_path / "site", REPO)
    standalone = site / "amps_py" / "_data" / "examples" / "standalone.xml"
    text = standalone.read_text()
    start = text.index("<Description>") + len("<Description>")
    end = text.index("</Description>")
    standalone.write_text(text[:start] + MARKER + text[end:])
    return site


def amps_py(site: Path, cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """``amps-py ARGS`` importing only the installed layout (not this checkout)."""
    env = cli_env({"PYTHONPATH": str(site)})
    return subprocess.run(
        [sys.executable, "-m", "amps_py", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_examples_are_listed_from_the_package_and_written_out(
    installed: Path, tmp_path: Path
) -> None:
    user = tmp_path / "user"
    user.mkdir()
    listed = amps_py(installed, user, "config", "examples")
    assert listed.returncode == 0, listed.stderr
    rows = dict(line.split(None, 1) for line in listed.stdout.splitlines())
    assert rows == {
        "geo-ha": "Geographic replication with high availability",
        "hot-hot": "Hot-hot pair",
        "secure": "Secure standalone instance",
        "standalone": MARKER,
    }
    secure = amps_py(installed, user, "config", "examples", "secure", "--to", "etc")
    assert secure.returncode == 0, secure.stderr
    assert secure.stdout.splitlines() == [
        "Serve it with:",
        "  amps-py serve etc/secure/secure.xml",
        "How to use it: etc/secure/README.md",
    ]
    written = {p.name: stat.S_IMODE(p.stat().st_mode) for p in (user / "etc/secure").iterdir()}
    assert written == {
        "README.md": 0o644,
        "entitlements.json": 0o644,
        "secure.xml": 0o644,
        "server.pem": 0o644,
        "server-key.pem": 0o600,
        "users.pw": 0o600,
    }
    # the README written out names the files where they are now, not the repository's
    readme = (user / "etc/secure/README.md").read_text()
    assert "config/examples/secure" not in readme and "repository root" not in readme
    assert "config check etc/secure/secure.xml" in readme, readme
    assert "--ca-file etc/secure/server.pem" in readme
    checked = amps_py(installed, user, "config", "check", "etc/secure/secure.xml")
    assert checked.returncode == 0, checked.stderr
    assert checked.stdout.startswith("etc/secure/secure.xml: OK — instance amps-secure")
    assert checked.stderr == ""  # no warning: the secret files are the owner's only
    again = amps_py(installed, user, "config", "examples", "secure", "--to", "etc")
    assert again.returncode == 2
    assert "etc/secure/README.md exists already; nothing was written" in again.stderr
    unknown = amps_py(installed, user, "config", "examples", "securer")
    assert unknown.returncode == 2
    assert "no example named 'securer'; the examples are geo-ha, hot-hot" in unknown.stderr
    standalone = amps_py(installed, user, "config", "examples", "standalone")
    assert standalone.returncode == 0, standalone.stderr
    assert "  amps-py serve standalone.xml" in standalone.stdout.splitlines()
    assert MARKER in (user / "standalone.xml").read_text()


def test_serving_a_documented_example_path_says_how_to_get_it(
    installed: Path, tmp_path: Path
) -> None:
    user = tmp_path / "user"
    user.mkdir()
    path = "config/examples/hot-hot/amps-a.xml"
    served = amps_py(installed, user, "serve", path)
    assert served.returncode == 2
    assert served.stderr == (
        f"amps-py: cannot read config {path}: no such file. It names the shipped example "
        "'hot-hot', which an installed amps-py keeps inside the package: write it out with "
        "`amps-py config examples hot-hot --to config/examples` (it writes "
        "config/examples/hot-hot/; then this command works as given)\n"
    )
    wrote = amps_py(installed, user, "config", "examples", "hot-hot", "--to", "config/examples")
    assert wrote.returncode == 0, wrote.stderr
    assert "  amps-py serve config/examples/hot-hot/amps-b.xml" in wrote.stdout.splitlines()
    checked = amps_py(installed, user, "config", "check", path)
    assert checked.returncode == 0, checked.stderr
    # a path naming no example keeps the usual message
    other = amps_py(installed, user, "serve", "mine.xml")
    assert other.returncode == 2
    assert "shipped example" not in other.stderr
    assert not os.path.exists(user / "mine.xml")


def test_config_examples_is_in_the_help(installed: Path, tmp_path: Path) -> None:
    helped = amps_py(installed, tmp_path, "config", "--help")
    assert "examples" in helped.stdout
