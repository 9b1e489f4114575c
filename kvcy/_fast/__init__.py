"""Selector for the compiled (Cython) and pure-Python twins of the hot paths.

Every hot path lives twice: ``_<thing>_c.pyx`` and ``_<thing>_py.py``, with the
same names, signatures and error messages.  This module is the only place that
imports a twin directly.  The choice is made once, at import:

* ``KVCY_NO_EXTENSIONS=1`` forces the pure-Python twins;
* otherwise the compiled twins are used when *all* of them import, and the
  pure-Python ones when any is missing or broken (silently);
* ``KVCY_REQUIRE_EXTENSIONS=1`` turns a missing compiled twin into an error.

Tests and benchmarks that want both twins side by side call :func:`load`.

The offloading twin (``offload``) is imported on first use of ``kvcy._fast.offload``
rather than here: it needs ``kvcy.kv_offload``'s value types (and numpy), which
``import kvcy`` should not pay for.  Whether its compiled twin exists still counts
towards the choice above.
The KV-aware routing index's twin (``kv_index``, for routers, not engines) is
imported on first use of ``kvcy._fast.kv_index`` too, so that ``import kvcy``
does not pay for it either, nor for the worker's block-table rows (``block_table``,
which needs numpy).
"""

from __future__ import annotations

import importlib
import importlib.util
import os
from types import ModuleType

__all__ = ["IMPLEMENTATION", "NO_EXTENSIONS", "REQUIRE_EXTENSIONS", "TWINS", "load", "available"]

#: The twin modules, by concept.  Each has ``_<name>_c`` and ``_<name>_py``.
TWINS = ("hashing", "kv_cache", "offload", "kv_index", "block_table")

#: Twins imported on first use (see the module docstring).
_LAZY = ("offload", "kv_index", "block_table")


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


def _load_eager(impl: str) -> dict[str, ModuleType]:
    """The twins imported at import time; for the lazy ones, only a check that
    the compiled module exists."""
    mods = {name: _import(name, impl) for name in TWINS if name not in _LAZY}
    if impl == "cython":
        for name in _LAZY:
            if importlib.util.find_spec(f"kvcy._fast._{name}_c") is None:
                raise ImportError(f"No module named 'kvcy._fast._{name}_c'")
    return mods


def _select() -> tuple[str, dict[str, ModuleType]]:
    if NO_EXTENSIONS:
        return "python", _load_eager("python")
    try:
        return "cython", _load_eager("cython")
    except ImportError:
        if REQUIRE_EXTENSIONS:
            raise
        return "python", _load_eager("python")


IMPLEMENTATION, _modules = _select()


def __getattr__(name: str) -> ModuleType:
    # A lazy twin, imported on first use: the live implementation's, or (unless
    # KVCY_REQUIRE_EXTENSIONS) the pure-Python one when the compiled one fails.
    if name not in _LAZY:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    try:
        mod = _import(name, IMPLEMENTATION)
    except ImportError:
        if IMPLEMENTATION == "python" or REQUIRE_EXTENSIONS:
            raise
        mod = _import(name, "python")
    globals()[name] = mod
    return mod

hashing: ModuleType = _modules["hashing"]
kv_cache: ModuleType = _modules["kv_cache"]
offload: ModuleType  # bound on first use, by __getattr__ above
kv_index: ModuleType  # likewise
block_table: ModuleType  # likewise
