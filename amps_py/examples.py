"""The shipped example configurations (``config/examples`` in a source checkout; an
installed wheel carries them as ``amps_py/_data/examples``): list them, write one out,
and recognise a path that names one.

An example is a single config file (``standalone.xml``: the example ``standalone``) or
a directory of files (``secure/``, ``hot-hot/``, ``geo-ha/``: its configs, their
README, and the password, key and secret files they name through
``${AMPS_CONFIG_DIRECTORY}``). Written out, the secret files are readable by their
owner only (mode 0600), as ``amps-py config check`` wants them.
"""

from __future__ import annotations

import importlib.resources
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass
from importlib.resources.abc import Traversable
from pathlib import Path

__all__ = [
    "Example",
    "ExampleError",
    "example_named_by",
    "examples",
    "examples_root",
    "write_example",
]

#: files written readable by their owner only: passwords, keys, shared secrets
_SECRET = re.compile(r"(\.pw|\.secret|key\.pem)$")


class ExampleError(Exception):
    """An example that does not exist, or cannot be written; the text says why."""


@dataclass(frozen=True)
class Example:
    """One shipped example.

    Attributes:
        name: what ``amps-py config examples NAME`` takes (``standalone``, ``secure``).
        description: one line: the README's title, or the config's Description.
        files: its files, relative to the directory it is written to
            (``secure/secure.xml``, ..., or ``standalone.xml``).
        configs: of those, the configs to serve (``secure/secure.xml``).
    """

    name: str
    description: str
    files: tuple[str, ...]
    configs: tuple[str, ...]


def examples_root() -> Traversable:
    """Where the examples are read from: the installed package's copy, else the source
    checkout's ``config/examples``."""
    packaged = importlib.resources.files("amps_py").joinpath("_data").joinpath("examples")
    if packaged.is_dir():
        return packaged
    return Path(__file__).resolve().parents[1] / "config" / "examples"


def _description(entry: Traversable) -> str:
    if entry.is_dir():
        readme = entry.joinpath("README.md")
        if readme.is_file():
            for line in readme.read_text(encoding="utf-8").splitlines():
                if line.startswith("# "):
                    return line[2:].strip()
        return ""
    found = re.search(r"<Description>(.*?)</Description>", entry.read_text(encoding="utf-8"))
    return found.group(1).strip() if found else ""


def _files(entry: Traversable, prefix: str) -> Iterator[str]:
    for child in sorted(entry.iterdir(), key=lambda c: c.name):
        if child.is_dir():
            yield from _files(child, f"{prefix}{child.name}/")
        else:
            yield f"{prefix}{child.name}"


def examples(root: Traversable | None = None) -> list[Example]:
    """The shipped examples, by name."""
    root = root if root is not None else examples_root()
    found = []
    for entry in sorted(root.iterdir(), key=lambda c: c.name):
        if entry.is_dir():
            files = tuple(_files(entry, f"{entry.name}/"))
            configs = tuple(f for f in files if f.endswith(".xml"))
            found.append(Example(entry.name, _description(entry), files, configs))
        elif entry.name.endswith(".xml"):
            name = entry.name.removesuffix(".xml")
            found.append(Example(name, _description(entry), (entry.name,), (entry.name,)))
    return found


def find_example(name: str, root: Traversable | None = None) -> Example:
    """The example called ``name``.

    Raises:
        ExampleError: there is none by that name (the text lists the names).
    """
    known = examples(root)
    for example in known:
        if example.name == name:
            return example
    names = ", ".join(e.name for e in known)
    raise ExampleError(
        f"no example named {name!r}; the examples are {names} "
        "(`amps-py config examples` describes them)"
    )


def write_example(name: str, to: Path, root: Traversable | None = None) -> list[Path]:
    """Write the files of example ``name`` under directory ``to`` (created when
    missing; a directory example goes into ``to/NAME/``); secret files get mode 0600.
    Returns the paths written.

    Raises:
        ExampleError: no such example, or one of its files exists already in ``to``
            (nothing is written then), or it cannot be written.
    """
    root = root if root is not None else examples_root()
    example = find_example(name, root)
    targets = [to / relative for relative in example.files]
    present = [t for t in targets if t.exists()]
    if present:
        raise ExampleError(
            f"{present[0]} exists already; nothing was written. Give another directory "
            "with --to DIR, or move it away"
        )
    written = []
    try:
        for relative, target in zip(example.files, targets, strict=True):
            source = root
            for part in relative.split("/"):
                source = source.joinpath(part)
            target.parent.mkdir(parents=True, exist_ok=True)
            mode = 0o600 if _SECRET.search(relative) else 0o644
            fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
            with os.fdopen(fd, "wb") as out:
                body = source.read_bytes()
                if relative.endswith("/README.md"):
                    body = _readme_for(body, name, to)
                out.write(body)
            os.chmod(target, mode)  # whatever the umask
            written.append(target)
    except OSError as exc:
        raise ExampleError(f"cannot write {exc.filename or to}: {exc.strerror or exc}") from exc
    return written


def _readme_for(body: bytes, name: str, to: Path) -> bytes:
    """An example's README as written out under ``to``: its commands name the files
    where they now are (``config/examples/NAME`` becomes ``to/NAME``), run from the
    directory the example was written out from, not the repository root."""
    where = os.path.normpath(to / name)
    text = body.decode("utf-8")
    text = text.replace(f"config/examples/{name}", where)
    text = text.replace(
        "From the repository root",
        f"From the directory `amps-py config examples {name}` was run in",
    )
    return text.encode("utf-8")


def example_named_by(path: str, root: Traversable | None = None) -> Example | None:
    """The example a config path names (``config/examples/standalone.xml``,
    ``hot-hot/amps-a.xml``, ``secure``), or None. For a path that does not exist: the
    user followed the docs of a source checkout without one."""
    parts = Path(path).parts
    candidates = [Path(path).stem, *(parts[-2:-1])]
    for example in examples(root):
        if example.name in candidates:
            return example
    return None
