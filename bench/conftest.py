"""Benchmark fixtures: each hot path gets a Cython row and a Python row in one group."""

from __future__ import annotations

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
