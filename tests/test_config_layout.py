"""Layout guard for the ``amps_py.config`` package.

* every function stays short (a section's builder is a list of named steps);
* ``amps_py.config.model``, the option objects that the server, routing and link
  validation read, and the model modules it re-exports from (``credentials``,
  ``sow_model``, ``queue_model``) never load lxml, neither directly nor through what they import
  (checked statically, and dynamically in a fresh interpreter);
* ``amps_py.config.model`` still gives every name it gave before those were split off;
* routing and validation import the model only, not the loader;
* ``amps_py.config`` still offers every name the code and the tests import from it.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from fresh import run_fresh

ROOT = Path(__file__).resolve().parent.parent
CONFIG = ROOT / "amps_py" / "config"
MAX_FUNCTION_LINES = 60
#: the modules of option objects, which code that only reads a configuration imports
MODEL_MODULES = (
    "amps_py.config.model",
    "amps_py.config.credentials",
    "amps_py.config.sow_model",
    "amps_py.config.queue_model",
)


def _functions(path: Path) -> list[ast.FunctionDef | ast.AsyncFunctionDef]:
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    return [n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)]


def _module_file(name: str) -> Path | None:
    """The source file of an ``amps_py`` module, or None if it is not one of ours."""
    base = ROOT.joinpath(*name.split("."))
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def _imports(path: Path, module: str) -> list[tuple[int, str]]:
    """(line, absolute module name) of every import in ``path``, ``from x import y``
    counted as both ``x`` and ``x.y`` (which may be a submodule)."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.extend((node.lineno, alias.name) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                parts = package.split(".")
                anchor = parts[: len(parts) - (node.level - 1)]
                base = ".".join([*anchor, *([node.module] if node.module else [])])
            else:
                base = node.module or ""
            found.append((node.lineno, base))
            found.extend((node.lineno, f"{base}.{alias.name}") for alias in node.names)
    return found


def _import_chains(start: str) -> dict[str, list[str]]:
    """Every module ``start`` imports, directly or through amps_py modules, with the
    chain of imports that reaches it."""
    chains: dict[str, list[str]] = {start: [start]}
    pending = [start]
    while pending:
        module = pending.pop()
        path = _module_file(module)
        if path is None:
            continue
        for _, imported in _imports(path, module):
            if imported not in chains:
                chains[imported] = [*chains[module], imported]
                if imported.split(".")[0] == "amps_py":
                    pending.append(imported)
    return chains


def test_scanner_follows_relative_and_absolute_imports(tmp_path: Path) -> None:
    source = tmp_path / "mod.py"
    source.write_text("import lxml.etree\nfrom . import sibling\nfrom ..units import parse\n")
    found = {name for _, name in _imports(source, "amps_py.config.mod")}
    assert {
        "lxml.etree",
        "amps_py.config",
        "amps_py.config.sibling",
        "amps_py.units",
        "amps_py.units.parse",
    } <= found


@pytest.mark.parametrize("path", sorted(CONFIG.glob("*.py")), ids=lambda p: p.name)
def test_no_config_function_is_longer_than_60_lines(path: Path) -> None:
    long = [
        f"{path.relative_to(ROOT)}:{f.lineno} {f.name} is {f.end_lineno - f.lineno + 1} lines"
        for f in _functions(path)
        if f.end_lineno is not None and f.end_lineno - f.lineno + 1 > MAX_FUNCTION_LINES
    ]
    assert not long, (
        f"split these into named steps (at most {MAX_FUNCTION_LINES} lines each):\n"
        + "\n".join(long)
    )


@pytest.mark.parametrize("module", MODEL_MODULES)
def test_model_imports_no_lxml_even_indirectly(module: str) -> None:
    chains = _import_chains(module)
    xml = {name: chain for name, chain in chains.items() if name.split(".")[0] == "lxml"}
    assert not xml, f"{module} reaches lxml: " + "; ".join(
        " -> ".join(chain) for chain in xml.values()
    )


@pytest.mark.parametrize("module", MODEL_MODULES)
def test_importing_the_model_loads_no_lxml(module: str) -> None:
    """In a fresh interpreter: the package ``__init__`` loads the loader lazily."""
    code = (
        f"import sys, {module}\n"
        "print(','.join(sorted(m for m in sys.modules if m.split('.')[0] == 'lxml')))\n"
    )
    out = run_fresh(code)
    assert out == "", f"importing {module} loaded {out}"


#: every name ``amps_py.config.model`` defined before the link credentials and the SOW
#: topic moved to their own modules; code outside the package still imports them from it
_MODEL_NAMES_BEFORE_THE_SPLIT = (
    "DEFAULT_LINK_AUTHENTICATOR",
    "PASSWORD_LINK_AUTHENTICATOR",
    "LinkAuthenticator",
    "LinkCredentialsError",
    "read_password_file",
    "SowTopicConfig",
)


def test_model_still_gives_the_names_split_off() -> None:
    from amps_py.config import credentials, model, sow_model

    missing = [n for n in _MODEL_NAMES_BEFORE_THE_SPLIT if not hasattr(model, n)]
    assert not missing, f"re-export these from amps_py.config.model: {missing}"
    assert model.LinkAuthenticator is credentials.LinkAuthenticator
    assert model.read_password_file is credentials.read_password_file
    assert model.SowTopicConfig is sow_model.SowTopicConfig


def test_model_gives_every_name_the_code_imports_from_it() -> None:
    from amps_py.config import model

    imported: dict[str, str] = {}
    for folder in ("amps_py", "tests", "tools", "txlog"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
            for node in ast.walk(tree):
                if isinstance(node, ast.ImportFrom) and node.module == "amps_py.config.model":
                    for alias in node.names:
                        imported.setdefault(alias.name, str(path.relative_to(ROOT)))
    assert "SowTopicConfig" in imported  # the scan sees the server and routing
    missing = {name: where for name, where in imported.items() if not hasattr(model, name)}
    assert not missing, f"amps_py.config.model no longer gives (imported by): {missing}"


#: the config modules replication may read: the model, and pure rules over it
MODEL_MODULES = ("amps_py.config.model", "amps_py.config.sow_pattern")


@pytest.mark.parametrize("name", ["routing", "validation", "validation_facts", "validation_queues"])
def test_routing_and_validation_import_only_the_model(name: str) -> None:
    path = ROOT / "amps_py" / "replication" / f"{name}.py"
    wrong = [
        f"line {line}: {imported}"
        for line, imported in _imports(path, f"amps_py.replication.{name}")
        if imported.startswith("amps_py.config") and not imported.startswith(MODEL_MODULES)
    ]
    assert not wrong, f"{name}.py imports amps_py.config beyond its model: {wrong}"


def test_the_pattern_rules_import_only_the_model() -> None:
    """sow_pattern counts as model (above) only while it stays pure: no lxml, no I/O,
    nothing of amps_py.config but the model."""
    path = CONFIG / "sow_pattern.py"
    imported = [name for _, name in _imports(path, "amps_py.config.sow_pattern")]
    assert all(
        name.startswith("amps_py.config.model") or not name.startswith(("amps_py", "lxml"))
        for name in imported
    ), imported


def _names_imported_from_config() -> dict[str, str]:
    """Name -> first file, for every ``from amps_py.config import NAME`` in the tree
    (not counting submodules imported that way)."""
    found: dict[str, str] = {}
    for folder in ("amps_py", "tests", "tools", "txlog"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            if CONFIG in path.parents:
                continue
            tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
            for node in ast.walk(tree):
                if isinstance(node, ast.ImportFrom) and node.module == "amps_py.config":
                    for alias in node.names:
                        if (CONFIG / f"{alias.name}.py").is_file():
                            continue  # a submodule, not a name
                        found.setdefault(alias.name, str(path.relative_to(ROOT)))
    return found


def test_config_exports_every_name_the_code_imports() -> None:
    import amps_py.config

    imported = _names_imported_from_config()
    assert "parse_config" in imported  # the scan sees the tests
    exported = set(amps_py.config.__all__)
    missing = {name: where for name, where in imported.items() if name not in exported}
    assert not missing, f"add these to amps_py.config.__all__ (imported by): {missing}"


def test_every_exported_name_resolves_in_a_fresh_interpreter() -> None:
    """The lazily loaded names too; an unknown name is an AttributeError."""
    code = (
        "import amps_py.config as c\n"
        "missing = [n for n in c.__all__ if not hasattr(c, n)]\n"
        "assert not hasattr(c, 'no_such_name')\n"
        "assert set(c.__all__) <= set(dir(c))\n"
        "print(','.join(missing))\n"
    )
    out = run_fresh(code)
    assert out == "", f"amps_py.config cannot give: {out}"
