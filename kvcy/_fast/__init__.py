"""Selector for the compiled (Cython) and pure-Python twins of the hot paths.

Every hot path lives twice: ``_<thing>_c.pyx`` and ``_<thing>_py.py``, with the
same names, signatures and error messages.  This module is the only place that
imports a twin directly.  The choice is made once, at import:

* ``KVCY_NO_EXTENSIONS=1`` forces the pure-Python twins;
* otherwise the compiled twins are used when *all* of them import, and the
  pure-Python ones when any is missing or broken (silently);
* ``KVCY_REQUIRE_EXTENSIONS=1`` turns a missing compiled twin into an error.

Tests and benchmarks that want both twins side by side call :func:`load`.
"""

from __future__ import annotations

import importlib
import os
from types import ModuleType

__all__ = ["IMPLEMENTATION", "NO_EXTENSIONS", "REQUIRE_EXTENSIONS", "TWINS", "load", "available"]

#: The twin modules, by concept.  Each has ``_<name>_c`` and ``_<name>_py``.
TWINS = ("hashing", "kv_cache")


def _flag(name: str) -> bool:
    return os.environ.get(name, "") not in ("", "0")


NO_EXTENSIONS = _flag("KVCY_NO_EXTENSIONS")
REQUIRE_EXTENSIONS = _flag("KVCY_REQUIRE_EXTENSIONS")

if NO_EXTENSIONS and REQUIRE_EXTENSIONS:
    raise ImportError("KVCY_NO_EXTENSIONS and KVCY_REQUIRE_EXTENSIONS are both set")


def _import(name: str, impl: str) -> ModuleType:
    suffix = "c" if impl == "cython" else "py"
    return importlib.import_module(f"kvcy._fast._{name}_{suffix}")


def load(impl: str) -> dict[str, ModuleType]:
    """Import every twin of one implementation (``"cython"`` or ``"python"``).

    Raises:
        ImportError: a compiled twin is missing or fails to import.
        ValueError: ``impl`` is neither ``"cython"`` nor ``"python"``.
    """
    if impl not in ("cython", "python"):
        raise ValueError(f"impl must be 'cython' or 'python', got {impl!r}")
    return {name: _import(name, impl) for name in TWINS}


def available() -> list[str]:
    """The implementations that import in this process (``"python"`` always)."""
    impls = ["python"]
    try:
        load("cython")
    except ImportError:
        pass
    else:
        impls.insert(0, "cython")
    return impls


def _select() -> tuple[str, dict[str, ModuleType]]:
    if NO_EXTENSIONS:
        return "python", load("python")
    try:
        return "cython", load("cython")
    except ImportError:
        if REQUIRE_EXTENSIONS:
            raise
        return "python", load("python")


IMPLEMENTATION, _modules = _select()

hashing: ModuleType = _modules["hashing"]
kv_cache: ModuleType = _modules["kv_cache"]
