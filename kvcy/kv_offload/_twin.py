"""Which twin of the offloading hot paths is live, and both twins for tests.

The scheduler-side CPU tier (``CPUOffloadingManager``, its cache policies,
``ChunkStatus``) lives twice: ``kvcy/_fast/_offload_py.py`` and the compiled
``kvcy/_fast/_offload_c.pyx``.  Until ``"offload"`` is listed in
``kvcy._fast.TWINS`` this module selects on its own, following the same rules
as :mod:`kvcy._fast` (``KVCY_NO_EXTENSIONS`` / ``KVCY_REQUIRE_EXTENSIONS``):
the compiled twin when the compiled twins are live and ``_offload_c`` imports,
else the pure-Python one (``KVCY_REQUIRE_EXTENSIONS`` covers it only once it
is one of ``TWINS``).

Switching over: once ``"offload"`` is in ``kvcy._fast.TWINS`` and
``kvcy._fast`` binds ``offload = _modules["offload"]``, :data:`twin` and
:func:`load` below use ``kvcy._fast`` and nothing here needs changing (the
fallback branch can then be deleted).
"""

from __future__ import annotations

import importlib
from types import ModuleType

from kvcy import _fast

__all__ = ["IMPLEMENTATION", "load", "twin"]


def load(impl: str) -> ModuleType:
    """The offloading twin of one implementation (``"cython"`` or ``"python"``).

    Raises:
        ImportError: the compiled twin is missing or fails to import.
        ValueError: ``impl`` is neither ``"cython"`` nor ``"python"``.
    """
    if "offload" in _fast.TWINS:
        return _fast.load(impl)["offload"]
    if impl not in ("cython", "python"):
        raise ValueError(f"impl must be 'cython' or 'python', got {impl!r}")
    suffix = "c" if impl == "cython" else "py"
    return importlib.import_module(f"kvcy._fast._offload_{suffix}")


def _select() -> tuple[str, ModuleType]:
    live = getattr(_fast, "offload", None)
    if live is not None:
        return _fast.IMPLEMENTATION, live
    if _fast.IMPLEMENTATION == "cython":
        try:
            return "cython", load("cython")
        except ImportError:
            # Not yet one of kvcy._fast.TWINS, so KVCY_REQUIRE_EXTENSIONS does
            # not cover it: fall back like any optional twin.
            pass
    return "python", load("python")


#: ``"cython"`` or ``"python"``: the implementation :data:`twin` comes from.
IMPLEMENTATION, twin = _select()
