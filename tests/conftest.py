"""Shared fixtures: run every twin-level test against both implementations."""

from __future__ import annotations

import os
from pathlib import Path
from types import SimpleNamespace

import pytest

from kvcy import _fast

IMPLS = ["cython", "python"]


def shared_dir() -> Path:
    """The read-only ``shared/`` folder beside the checkout (golden vectors, traces)."""
    env = os.environ.get("KVCY_SHARED")
    if env:
        return Path(env)
    return Path(__file__).resolve().parents[1].parent / "shared"


def _impl_param(name: str):
    """A pytest param for one twin, skipped when it is not importable here."""
    marks = []
    if name == "cython":
        if _fast.NO_EXTENSIONS:
            marks.append(pytest.mark.skip(reason="KVCY_NO_EXTENSIONS=1: pure-Python run"))
        elif "cython" not in _fast.available():
            if _fast.REQUIRE_EXTENSIONS:
                raise RuntimeError("KVCY_REQUIRE_EXTENSIONS=1 but the compiled twins do not import")
            marks.append(pytest.mark.skip(reason="compiled twins not built"))
    return pytest.param(name, id=name, marks=marks)


@pytest.fixture(params=[_impl_param(n) for n in IMPLS])
def impl(request) -> SimpleNamespace:
    """The twin modules of one implementation, as ``impl.hashing``, ``impl.kv_cache``.

    ``impl.name`` is ``"cython"`` or ``"python"``.
    """
    mods = _fast.load(request.param)
    return SimpleNamespace(name=request.param, **mods)


def _offload_param(name: str):
    """A pytest param for one offloading twin, skipped when it does not import here.

    The compiled offloading twin is optional until "offload" joins
    ``kvcy._fast.TWINS``; from then on it follows the rules of the other twins.
    """
    from kvcy import _fast

    if name == "cython" and "offload" in _fast.TWINS:
        return _impl_param(name)
    marks = []
    if name == "cython":
        if _fast.NO_EXTENSIONS:
            marks.append(pytest.mark.skip(reason="KVCY_NO_EXTENSIONS=1: pure-Python run"))
        else:
            try:
                _fast.load("cython")["offload"]
            except ImportError:
                marks.append(pytest.mark.skip(reason="compiled offloading twin not built"))
    return pytest.param(name, id=name, marks=marks)


@pytest.fixture(params=[_offload_param(n) for n in IMPLS])
def offload_impl(request):
    """The offloading twin module of one implementation (``.IMPLEMENTATION`` names it)."""
    from kvcy import _fast

    return _fast.load(request.param)["offload"]


@pytest.fixture
def golden_dir() -> Path:
    path = shared_dir() / "golden"
    if not path.is_dir():
        pytest.skip(f"golden vectors not found at {path}")
    return path
