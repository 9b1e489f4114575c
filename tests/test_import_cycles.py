"""kvcy's modules import one another downward only: no import cycle, statically or at run time.

The static half builds the module-level import graph from the sources (``ast`` for ``.py``;
``import`` / ``cimport`` / ``include`` lines for Cython, the ``include``-d pieces counting as
the extension that includes them) and asserts it is acyclic.  Two kinds of edge come from
outside the import statements: importing ``a.b.c`` from outside the package ``a.b`` first runs
``a.b``'s ``__init__`` (from inside it, the package is already running, so a package that
re-exports its submodules is no cycle), and the selector ``kvcy._fast`` imports every twin it
lists in ``TWINS``.
Imports inside functions and under ``if TYPE_CHECKING:`` run later, or never, and are left out.

The run-time half imports every module in a fresh interpreter of its own, as multidict's
``tests/test_circular_imports.py`` does, so that a module that only works when something
else was imported first fails here.
"""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "kvcy"

_CYTHON_IMPORT = re.compile(r"^\s*(?:from\s+([\w.]+)\s+c?import\s+([\w\s,()]+)|c?import\s+([\w.,\s]+))", re.MULTILINE)
_CYTHON_INCLUDE = re.compile(r'^include\s+"([^"]+)"', re.MULTILINE)


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _modules() -> dict[str, Path]:
    """Every importable kvcy module -> its source (``.py`` or the extension's ``.pyx``)."""
    found: dict[str, Path] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        if "__pycache__" not in path.parts:
            found[_module_name(path)] = path
    for path in sorted(PACKAGE.rglob("*.pyx")):
        if (path.parent / "__init__.py").is_file():  # not an include-d piece
            found[_module_name(path)] = path
    return found


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _import_time_nodes(body: list[ast.stmt]):
    """The import statements that run when the module is imported."""
    for node in body:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        elif isinstance(node, ast.If):
            if not _is_type_checking(node.test):
                yield from _import_time_nodes(node.body)
            yield from _import_time_nodes(node.orelse)
        elif isinstance(node, ast.Try):
            for part in (node.body, *(h.body for h in node.handlers), node.orelse, node.finalbody):
                yield from _import_time_nodes(part)
        elif isinstance(node, (ast.ClassDef, ast.With)):
            yield from _import_time_nodes(node.body)


def _targets(base: str, names: list[str], modules: dict[str, Path]) -> set[str]:
    """What ``from base import names`` imports: ``base`` and each name that is a submodule."""
    out = {base}
    out.update(f"{base}.{n}" for n in names if f"{base}.{n}" in modules)
    return out


def _python_imports(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out: set[str] = set()
    for node in _import_time_nodes(tree.body):
        if isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names)
        else:
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            out |= _targets(base, [alias.name for alias in node.names], modules)
    return out


def _cython_imports(path: Path, modules: dict[str, Path]) -> set[str]:
    """Module-level imports and cimports of a ``.pyx`` and everything it and its ``.pxd`` include."""
    out: set[str] = set()
    sources = [path, path.with_suffix(".pxd")]
    while sources:
        source = sources.pop()
        if not source.is_file():
            continue
        text = source.read_text(encoding="utf-8")
        sources += [source.parent / inc for inc in _CYTHON_INCLUDE.findall(text)]
        for line in text.splitlines():
            if line[:1].isspace():  # inside a function or class: runs later (or is a cdef body)
                continue
            m = _CYTHON_IMPORT.match(line)
            if m is None:
                continue
            if m[1]:
                out |= _targets(m[1], [n.strip() for n in m[2].strip("() ").split(",")], modules)
            else:
                out.update(part.split(" as ")[0].strip() for part in m[3].split(","))
    return out


def _selector_twins() -> set[str]:
    """The twin modules ``kvcy._fast`` imports: ``_<name>_c`` and ``_<name>_py`` per ``TWINS``."""
    tree = ast.parse((PACKAGE / "_fast" / "__init__.py").read_text(encoding="utf-8"))
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "TWINS" for t in node.targets):
            twins = ast.literal_eval(node.value)
            return {f"kvcy._fast._{name}_{impl}" for name in twins for impl in ("c", "py")}
    raise AssertionError("kvcy._fast defines no TWINS")


def import_graph() -> dict[str, set[str]]:
    """kvcy module -> the kvcy modules importing it runs first."""
    modules = _modules()
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        deps = _python_imports(name, path, modules) if path.suffix == ".py" else _cython_imports(path, modules)
        if name == "kvcy._fast":
            deps |= _selector_twins()
        closed: set[str] = set()
        for dep in deps:
            if not dep.startswith("kvcy."):  # (the root package is running already: it holds everything)
                continue
            closed.add(dep)
            parts = dep.split(".")
            for i in range(2, len(parts)):  # a package entered from outside runs its __init__ first
                package = ".".join(parts[:i])
                if not name.startswith(package + ".") and name != package:
                    closed.add(package)
        graph[name] = {d for d in closed if d in modules and d != name}
    return graph


def _find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of ``graph`` (its modules in import order, the first repeated), or None."""
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for dep in sorted(graph.get(node, ())):
            if state.get(dep) == 1:
                return stack[stack.index(dep):] + [dep]
            if dep not in state and (cycle := visit(dep)) is not None:
                return cycle
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)) is not None:
            return cycle
    return None


def test_graph_sees_the_imports():
    """The graph is built from what the sources say (a check of the checker)."""
    graph = import_graph()
    assert "kvcy._fast._kv_cache_c" in graph["kvcy._fast"]  # the selector's twins
    assert "kvcy.kv_events" in graph["kvcy._fast._kv_cache_c"]  # a .pyx's import
    assert "kvcy._fast._request_tables" in graph["kvcy._fast._kv_cache_c"]
    assert "kvcy._fast.kv_cache_py.block_pool" in graph["kvcy._fast._kv_cache_py"]  # from-import of a module
    # kvcy.kv_offload.base, from outside its package: the package's __init__ runs first
    assert {"kvcy.kv_offload.base", "kvcy.kv_offload"} <= graph["kvcy._fast.offload_py._common"]
    assert "kvcy.kv_cache_interface" not in graph["kvcy.kv_cache_interface.attention"]  # from inside: no
    assert _find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _find_cycle({"a": {"b"}, "b": set()}) is None


def test_module_level_imports_are_acyclic():
    cycle = _find_cycle(import_graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle or ())


def _importable() -> list[str]:
    return sorted(name for name in _modules() if name != "kvcy.__main__")


@pytest.mark.parametrize("module", _importable())
def test_each_module_imports_alone(module):
    """Importing any one kvcy module first, in a fresh interpreter, works."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    if module.endswith("_c") and module.startswith("kvcy._fast._"):
        env.pop("KVCY_NO_EXTENSIONS", None)  # a compiled twin is imported for what it is
    result = subprocess.run(
        [sys.executable, "-W", "error::ImportWarning", "-c", f"import {module}"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=120,
    )
    missing = re.search(r"ModuleNotFoundError: No module named '([\w.]+)'", result.stderr)
    if result.returncode and missing and (not missing[1].startswith("kvcy") or missing[1] == module):
        pytest.skip(f"{module} needs {missing[1]}, which is not installed or built here")
    assert result.returncode == 0, f"import {module} failed alone:\n{result.stderr[-2000:]}"
