"""Benchmark fixtures: each hot path gets a Cython row and a Python row in one group."""

from __future__ import annotations

import gc
from types import SimpleNamespace

import pytest

from kvcy import _fast


def _param(name: str):
    marks = []
    if name == "cython" and "cython" not in _fast.available():
        marks.append(pytest.mark.skip(reason="compiled twins not built"))
    return pytest.param(name, id=name, marks=marks)


@pytest.fixture(params=[_param("cython"), _param("python")])
def impl(request) -> SimpleNamespace:
    """The twin modules of one implementation (``impl.name``, ``impl.kv_cache``, ...)."""
    return SimpleNamespace(name=request.param, **_fast.load(request.param))


@pytest.fixture
def freeze_startup_heap():
    """A function to call once a bench has built its pool: it collects, then moves every live
    object into the permanent GC generation, as a vLLM server does once it has started
    (``vllm.utils.gc_utils.freeze_gc_heap``).  Cycle collections during the timed rounds then
    skip the pool (a Python twin's pool of 10^6 blocks otherwise costs a round up to 18 ms
    now and then).  Undone when the test ends."""
    frozen = []

    def freeze() -> None:
        gc.collect()
        gc.freeze()
        frozen.append(True)

    yield freeze
    if frozen:
        gc.unfreeze()
        gc.collect()


@pytest.fixture(scope="module")
def write_summary(request):
    """A function that prints summary lines to the terminal, past pytest's output capture."""

    def write(lines: list[str]) -> None:
        reporter = request.config.pluginmanager.get_plugin("terminalreporter")
        if reporter is None:
            return
        capture = request.config.pluginmanager.get_plugin("capturemanager")
        if capture is None:
            for line in lines:
                reporter.write_line(line)
            return
        with capture.global_and_fixture_disabled():
            for line in lines:
                reporter.write_line(line)

    return write
