"""Layout guard: the sans-IO packages import no trio and no socket.

``amps_py.protocol`` (and ``amps_py.filters`` and the top-level ``txlog`` journal
library) must stay usable without an event loop or a network: bytes in, objects
out. Two checks keep it that way:

* a static one that reads every module's source with :mod:`ast` and looks at its
  ``import`` statements (so it works on packages that do not import cleanly yet,
  and skips packages that do not exist yet);
* a dynamic one that imports ``amps_py.protocol`` in a fresh interpreter and
  looks at ``sys.modules``, which also catches imports made indirectly.
"""

from __future__ import annotations

import ast
import itertools
from pathlib import Path

import pytest
from fresh import run_fresh

ROOT = Path(__file__).resolve().parent.parent

#: package directory -> dotted package name, for every package that must stay sans-IO.
SANS_IO_PACKAGES = {
    ROOT / "amps_py" / "protocol": "amps_py.protocol",
    ROOT / "amps_py" / "filters": "amps_py.filters",
    ROOT / "amps_py" / "queue": "amps_py.queue",
    ROOT / "txlog": "txlog",
}

#: top-level modules a sans-IO package must not import, with why.
FORBIDDEN = {
    "trio": "I/O and scheduling belong in amps_py.server / amps_py.client",
    "socket": "the codec gets bytes from its caller; it never owns a connection",
}


def _module_name(package: str, package_dir: Path, path: Path) -> str:
    parts = list(path.relative_to(package_dir).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join([package, *parts])


def _imported_modules(path: Path, module: str) -> list[tuple[int, str]]:
    """Every module ``path`` imports, as (line, absolute dotted name).

    Relative imports are resolved against ``module``; string arguments of
    ``__import__(...)`` and ``importlib.import_module(...)`` count too.
    """
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    is_package = path.name == "__init__.py"
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.extend((node.lineno, alias.name) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level == 0:
                base = node.module or ""
            else:
                anchor = module.split(".")
                drop = node.level - 1 if is_package else node.level
                anchor = anchor[: len(anchor) - drop] if drop else anchor
                base = ".".join([*anchor, *([node.module] if node.module else [])])
            found.append((node.lineno, base))
            # "from x import y" may import the submodule x.y.
            found.extend((node.lineno, f"{base}.{alias.name}") for alias in node.names)
        elif (
            isinstance(node, ast.Call)
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
            and (
                (isinstance(node.func, ast.Name) and node.func.id == "__import__")
                or (isinstance(node.func, ast.Attribute) and node.func.attr == "import_module")
            )
        ):
            found.append((node.lineno, node.args[0].value))
    return found


def _existing_packages() -> list[tuple[Path, str]]:
    return [
        (path, name)
        for path, name in SANS_IO_PACKAGES.items()
        if path.is_dir() and any(path.rglob("*.py"))
    ]


@pytest.mark.parametrize(
    ("package_dir", "package"),
    [pytest.param(path, name, id=name) for path, name in SANS_IO_PACKAGES.items()],
)
def test_sans_io_sources_import_no_trio_or_socket(package_dir: Path, package: str) -> None:
    if not package_dir.is_dir() or not any(package_dir.rglob("*.py")):
        pytest.skip(f"{package} does not exist yet")
    problems = []
    for path in sorted(package_dir.rglob("*.py")):
        module = _module_name(package, package_dir, path)
        for line, imported in _imported_modules(path, module):
            top = imported.split(".", 1)[0]
            if top in FORBIDDEN:
                rel = path.relative_to(ROOT)
                problems.append(f"{rel}:{line} imports {imported}: {FORBIDDEN[top]}")
    assert not problems, "sans-IO package imports I/O modules:\n" + "\n".join(problems)


def test_import_scanner_sees_every_import_form(tmp_path: Path) -> None:
    """The static check is only as good as its parser; pin down what it catches."""
    source = tmp_path / "mod.py"
    source.write_text(
        "import os, trio.lowlevel\n"
        "from socket import socketpair\n"
        "from . import sibling\n"
        "from ..server import session\n"
        "import importlib\n"
        "def f():\n"
        "    import socket as s\n"
        "    return __import__('trio'), importlib.import_module('ssl')\n"
    )
    found = {name for _, name in _imported_modules(source, "amps_py.protocol.mod")}
    assert {
        "os",
        "trio.lowlevel",
        "socket",
        "socket.socketpair",
        "amps_py.protocol",
        "amps_py.protocol.sibling",
        "amps_py.server.session",
        "trio",
        "ssl",
    } <= found


def test_sans_io_packages_known() -> None:
    """The protocol package exists; the others are checked once they appear."""
    names = [name for _, name in _existing_packages()]
    assert "amps_py.protocol" in names


def test_importing_protocol_loads_no_trio_or_socket() -> None:
    """Import in a fresh interpreter so modules other tests loaded do not count."""
    code = (
        "import sys, amps_py.protocol\n"
        f"bad = sorted(m for m in sys.modules if m.split('.')[0] in {sorted(FORBIDDEN)!r})\n"
        "print(','.join(bad))\n"
    )
    loaded = run_fresh(code)
    assert loaded == "", f"importing amps_py.protocol loaded {loaded}"


# ---------------------------------------------------------------- the server and Spark
#: what the server runs: it must never load the optional pipeline extras
SERVER_PACKAGES = {
    ROOT / "amps_py" / "server": "amps_py.server",
    ROOT / "amps_py" / "replication": "amps_py.replication",
    ROOT / "amps_py" / "protocol": "amps_py.protocol",
    ROOT / "txlog": "txlog",
}

#: modules only the data pipeline may import, with why
PIPELINE_ONLY = {
    "pyspark": "Spark is an optional extra: the server runs without it (and without Java)",
    "pyarrow": "pyarrow is an optional extra; the server runs without it",
    "amps_py.pipeline": "the pipeline reads journals; the server never depends on it",
}


def _pipeline_only(imported: str) -> str | None:
    for name, why in PIPELINE_ONLY.items():
        if imported == name or imported.startswith(name + "."):
            return why
    return None


@pytest.mark.parametrize(
    ("package_dir", "package"),
    [pytest.param(path, name, id=name) for path, name in SERVER_PACKAGES.items()],
)
def test_server_sources_never_import_spark_or_the_pipeline(package_dir: Path, package: str) -> None:
    problems = []
    for path in sorted(package_dir.rglob("*.py")):
        module = _module_name(package, package_dir, path)
        for line, imported in _imported_modules(path, module):
            why = _pipeline_only(imported)
            if why:
                problems.append(f"{path.relative_to(ROOT)}:{line} imports {imported}: {why}")
    assert not problems, "the server imports pipeline-only modules:\n" + "\n".join(problems)


def test_starting_the_server_and_the_cli_loads_no_spark() -> None:
    """A fresh interpreter imports what ``amps-py serve`` imports (the CLI with every
    command group, the instance, replication, the journal): none of pyspark, pyarrow
    or amps_py.pipeline is loaded."""
    code = (
        "import sys, amps_py.cli, amps_py.server.instance, amps_py.replication, txlog\n"
        "bad = sorted(m for m in sys.modules\n"
        "             if m.split('.')[0] in ('pyspark', 'pyarrow') or m == 'amps_py.pipeline'\n"
        "             or m.startswith('amps_py.pipeline.'))\n"
        "print(','.join(bad))\n"
    )
    out = run_fresh(code)
    assert out == "", f"starting the server loaded {out}"


# ------------------------------------------------- issue 13: pure modules stay pure
# (one block on purpose: the package-cycle check lives in its own block elsewhere)

#: sans-IO modules of packages that also hold trio code: none of them may import trio
#: itself, so their decisions stay testable without an event loop
PURE_REPLICATION_MODULES = (
    "amps_py/replication/link.py",
    "amps_py/replication/hello.py",
    "amps_py/replication/link_errors.py",
    "amps_py/replication/routing.py",
    "amps_py/replication/validation.py",
    "amps_py/replication/validation_facts.py",
    "amps_py/replication/validation_queues.py",
    "amps_py/replication/fabric.py",
    "amps_py/replication/fabric_model.py",
    "amps_py/replication/fabric_loading.py",
    "amps_py/replication/fabric_report.py",
    "amps_py/replication/ackmode.py",
    "amps_py/replication/backoff.py",
    "amps_py/replication/host.py",
    "amps_py/replication/outage.py",
    "amps_py/replication/destination_stats.py",
    "amps_py/replication/exchange.py",
    # the server's decisions and bookkeeping (the trio driver is instance.py & co.)
    "amps_py/server/durability.py",
    "amps_py/server/durable_window.py",
    "amps_py/server/delivery.py",
    "amps_py/server/counters.py",
    "amps_py/server/names.py",
    "amps_py/server/bookmark_spec.py",
    "amps_py/server/replay_plan.py",
    "amps_py/server/subscriptions.py",
    "amps_py/server/host.py",
    # (commands.py and logon.py moved to amps_py/protocol/server/, checked with the
    # protocol package, for trio and socket both)
    "amps_py/protocol/server/commands.py",
    "amps_py/protocol/server/logon.py",
    "amps_py/server/limits.py",
    "amps_py/server/flow.py",
    "amps_py/server/recipient.py",
    "amps_py/server/replay_cursors.py",
    "amps_py/server/entitlements.py",
    "amps_py/server/ended_sessions.py",
    "amps_py/server/outbox.py",
    # State of the World: the pure core and the LMDB store (driven by the server)
    "amps_py/sow/__init__.py",
    "amps_py/sow/entry.py",
    "amps_py/sow/keys.py",
    "amps_py/sow/layout.py",
    "amps_py/sow/merge.py",
    "amps_py/sow/query.py",
    "amps_py/sow/store.py",
    # the back-off after failed logons (the trio glue is amps_py/auth_gate.py)
    "amps_py/auth_backoff.py",
    # leaves every package may import
    "amps_py/events.py",
    "amps_py/reasons.py",
    "amps_py/errors.py",
    "amps_py/statistics.py",
    "amps_py/units.py",
    "amps_py/redact.py",
)


def _imports_of(relative: str) -> list[tuple[int, str]]:
    path = ROOT / relative
    assert path.is_file(), f"{relative} is gone: update the layout guard's list"
    module = ".".join(Path(relative).with_suffix("").parts)
    return _imported_modules(path, module)


@pytest.mark.parametrize("relative", PURE_REPLICATION_MODULES)
def test_pure_modules_import_no_trio(relative: str) -> None:
    problems = [
        f"{relative}:{line} imports {imported}: {FORBIDDEN['trio']}"
        for line, imported in _imports_of(relative)
        if imported.split(".", 1)[0] == "trio"
    ]
    assert not problems, "a sans-IO module imports trio:\n" + "\n".join(problems)


def test_txlog_imports_nothing_of_amps_py() -> None:
    """txlog is the journal library the tools and the Spark pipeline use on their own:
    it may not depend on the server package, not even for type hints."""
    problems = []
    for path in sorted((ROOT / "txlog").rglob("*.py")):
        for line, imported in _imports_of(str(path.relative_to(ROOT))):
            if imported == "amps_py" or imported.startswith("amps_py."):
                problems.append(f"{path.relative_to(ROOT)}:{line} imports {imported}")
    why = "txlog imports amps_py (move what both need into txlog):\n"
    assert not problems, why + "\n".join(problems)


# ---------------------------------------------------------------- no cycle between packages
#: the units whose imports must form no cycle: each package directly under amps_py
#: (and each top-level module) is one unit; ``txlog`` is one more. Every import
#: counts, also one under ``if TYPE_CHECKING:`` or inside a function: a cycle that
#: only type checkers follow still means two packages cannot be read apart.
COMPOSITION_ROOTS = {
    "amps_py.cli",  # the whole amps_py/cli package: every command module
    "amps_py.__main__",
}


def _unit_of(module: str) -> str | None:
    """The unit ``module`` belongs to (None for modules outside amps_py and txlog)."""
    parts = module.split(".")
    if parts[0] == "txlog":
        return "txlog"
    if parts[0] != "amps_py" or len(parts) < 2:
        return None
    return ".".join(parts[:2])


def _unit_graph() -> dict[str, dict[str, list[str]]]:
    """unit -> imported unit -> where (``path:line imports name``)."""
    graph: dict[str, dict[str, list[str]]] = {}
    for package, package_dir in (("amps_py", ROOT / "amps_py"), ("txlog", ROOT / "txlog")):
        for path in sorted(package_dir.rglob("*.py")):
            module = _module_name(package, package_dir, path)
            unit = _unit_of(module)
            if unit is None or unit in COMPOSITION_ROOTS:
                continue
            for line, imported in _imported_modules(path, module):
                target = _unit_of(imported)
                if target is None or target == unit or target == "amps_py.__init__":
                    continue
                if not (ROOT / Path(*target.split(".")).with_suffix(".py")).exists() and not (
                    ROOT / Path(*target.split("."))
                ).is_dir():
                    continue  # "from amps_py import x" where x is a unit: counted as x
                where = f"{path.relative_to(ROOT)}:{line} imports {imported}"
                graph.setdefault(unit, {}).setdefault(target, []).append(where)
    return graph


def _find_cycle(graph: dict[str, dict[str, list[str]]]) -> list[str] | None:
    """One cycle of units (first unit repeated at the end), or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(unit: str) -> list[str] | None:
        state[unit] = 1
        path.append(unit)
        for nxt in sorted(graph.get(unit, {})):
            if state.get(nxt) == 1:
                return [*path[path.index(nxt) :], nxt]
            if nxt not in state:
                found = visit(nxt)
                if found:
                    return found
        path.pop()
        state[unit] = 2
        return None

    for unit in sorted(graph):
        if unit not in state:
            found = visit(unit)
            if found:
                return found
    return None


def test_no_import_cycle_between_packages() -> None:
    graph = _unit_graph()
    cycle = _find_cycle(graph)
    if cycle is None:
        return
    steps = []
    for a, b in itertools.pairwise(cycle):
        steps.append(f"{a} -> {b}: " + "; ".join(graph[a][b][:3]))
    pytest.fail(
        "packages import each other in a cycle (type-only imports count): "
        + " -> ".join(cycle)
        + "\n"
        + "\n".join(steps)
        + "\nbreak it with a Protocol on the importing side (see amps_py/replication/host.py) "
        "or a leaf module both can import"
    )


def test_the_cycle_finder_reports_a_cycle() -> None:
    graph = {"a": {"b": ["x"]}, "b": {"c": ["y"]}, "c": {"a": ["z"]}, "d": {"a": ["w"]}}
    assert _find_cycle(graph) == ["a", "b", "c", "a"]
    assert _find_cycle({"a": {"b": ["x"]}, "b": {}}) is None


#: modules every package may import: they import nothing of amps_py themselves
LEAF_MODULES = (
    "amps_py/events.py",
    "amps_py/reasons.py",
    "amps_py/errors.py",
    "amps_py/statistics.py",
    "amps_py/units.py",
)


@pytest.mark.parametrize("relative", LEAF_MODULES)
def test_leaf_modules_import_nothing_of_amps_py(relative: str) -> None:
    found = [
        f"{relative}:{line} imports {imported}"
        for line, imported in _imports_of(relative)
        if imported == "amps_py" or imported.startswith("amps_py.")
    ]
    assert not found, "a leaf module imports amps_py (move the shared part to a leaf):\n" + (
        "\n".join(found)
    )


# ------------------------------------------------------ no cycle between modules of a package
#: packages whose modules must not import each other in a cycle (type-only imports count)
ACYCLIC_PACKAGES = {
    "amps_py.server": ROOT / "amps_py" / "server",
    "amps_py.client": ROOT / "amps_py" / "client",
    "amps_py.replication": ROOT / "amps_py" / "replication",
    "txlog": ROOT / "txlog",
}

#: cycles tolerated as debt being paid off (none left): the test fails on any other
#: cycle, and on a listed one that is gone (so the list only shrinks)
KNOWN_MODULE_CYCLES: dict[str, list[frozenset[str]]] = {}


def _module_graph(package: str, package_dir: Path) -> dict[str, dict[str, list[str]]]:
    """module -> module of the same package it imports -> where (``path:line``); the
    modules are the package's direct ``.py`` files, named without the package."""
    names = {path.stem for path in package_dir.glob("*.py") if path.stem != "__init__"}
    graph: dict[str, dict[str, list[str]]] = {name: {} for name in names}
    for name in sorted(names):
        path = package_dir / f"{name}.py"
        for line, imported in _imported_modules(path, f"{package}.{name}"):
            if not imported.startswith(package + "."):
                continue
            target = imported[len(package) + 1 :].split(".", 1)[0]
            if target in names and target != name:
                where = f"{path.relative_to(ROOT)}:{line} imports {imported}"
                graph[name].setdefault(target, []).append(where)
    return graph


def _strongly_connected(graph: dict[str, dict[str, list[str]]]) -> list[frozenset[str]]:
    """The groups of two or more nodes that reach each other (Tarjan's algorithm,
    iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[frozenset[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, edges = work[-1]
            for nxt in edges:
                if nxt not in index:
                    index[nxt] = low[nxt] = len(index)
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(sorted(graph[nxt]))))
                    break
                if nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    group = set()
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        group.add(member)
                        if member == node:
                            break
                    if len(group) > 1:
                        groups.append(frozenset(group))
    return groups


@pytest.mark.parametrize("package", sorted(ACYCLIC_PACKAGES))
def test_no_import_cycle_between_modules_of_a_package(package: str) -> None:
    graph = _module_graph(package, ACYCLIC_PACKAGES[package])
    found = _strongly_connected(graph)
    known = KNOWN_MODULE_CYCLES.get(package, [])
    new = [group for group in found if group not in known]
    problems = []
    for group in new:
        edges = [
            f"  {a} -> {b}: {graph[a][b][0]}"
            for a in sorted(group)
            for b in sorted(graph[a])
            if b in group
        ]
        problems.append(
            f"{package}: {', '.join(sorted(group))} import each other:\n" + "\n".join(edges)
        )
    assert not problems, (
        "modules import each other in a cycle (type-only imports count):\n"
        + "\n".join(problems)
        + "\nbreak it with a Protocol in a leaf module, or move what both need into one"
    )
    gone = [sorted(group) for group in known if group not in found]
    assert not gone, f"{package}: these cycles are gone, take them off KNOWN_MODULE_CYCLES: {gone}"


def test_the_module_cycle_finder_finds_every_cycle() -> None:
    graph: dict[str, dict[str, list[str]]] = {
        "a": {"b": ["x"]},
        "b": {"a": ["y"], "c": ["z"]},
        "c": {"d": ["w"]},
        "d": {"c": ["v"]},
        "e": {"a": ["u"]},
    }
    assert sorted(map(sorted, _strongly_connected(graph))) == [["a", "b"], ["c", "d"]]
    assert _strongly_connected({"a": {"b": ["x"]}, "b": {}}) == []
