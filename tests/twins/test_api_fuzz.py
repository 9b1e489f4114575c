"""The twins survive wrong types and counts at their public boundary, and tampering.

Cython with bounds checks off must validate what it is given; each fuzz run is a separate
interpreter so that a crash fails the test instead of ending the session.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from kvcy import _fast

SCRIPT = Path(__file__).resolve().parents[1] / "_api_fuzz.py"
ROOT = Path(__file__).resolve().parents[2]
compiled = pytest.mark.skipif("cython" not in _fast.available() or _fast.NO_EXTENSIONS,
                              reason="compiled twins not in use")
# Each twin's run in the parent's own mode (KVCY_NO_EXTENSIONS=1 runs only the pure twin).
TWINS = [pytest.param("cython", marks=compiled), "python"]


def _fuzz(*args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    return subprocess.run([sys.executable, "-X", "faulthandler", str(SCRIPT), *args],
                          capture_output=True, text=True, timeout=timeout, env=env)


@compiled
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_public_api_survives_garbage(seed):
    proc = _fuzz(str(seed), "1000")
    assert proc.returncode == 0, f"the interpreter died ({proc.returncode}):\n{proc.stderr[-3000:]}"
    lines = proc.stdout.splitlines()
    assert lines and lines[-1] == "done", proc.stdout[-3000:]
    assert lines == ["done"], "exceptions that bad input should not raise:\n" + "\n".join(lines[:-1])


# Iterations per seed, enough for a few seconds a twin; KVCY_FUZZ_ITERATIONS=20000 for a long run.
SURFACE_ITERATIONS = int(os.environ.get("KVCY_FUZZ_ITERATIONS", "150"))


@pytest.mark.parametrize("seed", [11, 12, 13])
@pytest.mark.parametrize("impl", TWINS)
def test_writable_surface_survives_tampering(impl, seed, tmp_path):
    """Assign None / 0 / huge ints / wrong types / another manager's objects to every
    attribute Python can write, then call every public method: no signal, no hang, no
    SystemError.  On a crash the reproducing steps are printed."""
    log = tmp_path / "steps.log"
    proc = _fuzz("surface", impl, str(seed), str(SURFACE_ITERATIONS), str(log))
    if proc.returncode != 0:
        steps = log.read_text() if log.exists() else "(no log)"
        first = steps.splitlines()[0].split() if steps.strip() else ["?"]
        pytest.fail(
            f"the interpreter died ({proc.returncode}) in {impl}, seed {seed}, iteration {first[-1]}.\n"
            f"Replay: python -X faulthandler {SCRIPT.relative_to(ROOT)} surface {impl} {seed} "
            f"{int(first[-1]) + 1 if first[-1].isdigit() else '?'} - {first[-1]}\n"
            f"Steps (the last one crashed):\n{steps[-4000:]}\nstderr:\n{proc.stderr[-2000:]}"
        )
    lines = proc.stdout.splitlines()
    assert lines and lines[-1] == "done", proc.stdout[-3000:]
    assert lines == ["done"], "SystemError (the C API misused):\n" + "\n".join(lines[:-1])


def test_surface_discovery_finds_the_scheduler_fields():
    """The fuzzer's introspection sees what a scheduler must write (so it is not fuzzing nothing)."""
    sys.path.insert(0, str(SCRIPT.parent))
    try:
        import _api_fuzz
    finally:
        sys.path.remove(str(SCRIPT.parent))
    for impl in _fast.available():
        kv = _fast.load(impl)["kv_cache"]
        req = kv.Request("r", [1, 2, 3])
        _api_fuzz._discover(req)
        assert {"num_computed_tokens", "status", "num_preemptions"} <= set(_api_fuzz._WRITABLE[type(req)]), impl
        assert "append_output_token_ids" in _api_fuzz._METHODS[type(req)], impl
        assert "num_tokens" not in _api_fuzz._WRITABLE[type(req)], impl  # a property without setter


@compiled
@pytest.mark.parametrize("seed", [1, 2])
def test_twins_refuse_the_same_assignments(seed):
    """The same value assigned to the same public attribute is refused by both twins (with
    the same exception type) or accepted by both."""
    proc = _fuzz("agree", str(seed), "30")
    assert proc.returncode == 0, f"the interpreter died ({proc.returncode}):\n{proc.stderr[-3000:]}"
    lines = proc.stdout.splitlines()
    assert lines and lines[-1] == "done", proc.stdout[-3000:]
    assert lines == ["done"], "the twins disagree on assignments:\n" + "\n".join(lines[:-1])
