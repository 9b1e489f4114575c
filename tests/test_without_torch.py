"""kvcy without torch: the scheduler side, the offloading API and README.md's test command.

torch is optional (only ``kvcy.ops``, the offloading worker and canonical caches use it), so a
fresh virtual environment with just README.md's two commands has none.  These checks hide torch
from a child interpreter (``sys.modules['torch'] = None`` makes ``import torch`` fail as it does
where torch is not installed); .ci/run also runs README.md's commands in a torch-free venv.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
_HIDE_TORCH = "import sys\nsys.modules['torch'] = None\n"


def _run_hidden(code: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    return subprocess.run([sys.executable, "-c", _HIDE_TORCH + code], capture_output=True, text=True,
                          cwd=ROOT, env=env, timeout=300)


def test_offloading_api_imports_without_torch():
    """``kvcy.kv_offload`` and the canonical-cache dataclasses that vLLM's ``base`` names load
    without torch; using them (a tensor check) is where torch is needed."""
    out = _run_hidden(
        "import kvcy.kv_offload\n"
        "from kvcy.kv_offload import base, canonical\n"
        "assert isinstance(base.CanonicalKVCaches, type) and isinstance(canonical.CanonicalKVCacheRef, type)\n"
        "assert 'torch' not in [m for m in sys.modules if sys.modules[m] is not None]\n"
        "try:\n"
        "    canonical.CanonicalKVCacheTensor(object(), 16)\n"
        "except ImportError as exc:\n"
        "    print('needs torch:', exc)\n"
    )
    assert out.returncode == 0, out.stderr
    assert "needs torch: import of torch halted" in out.stdout


def test_readme_test_command_without_torch():
    """The tests that used torch unguarded, under README.md's ``python -m pytest`` without torch:
    each passes or skips, none fails on the missing module."""
    nodes = ["tests/test_request.py::test_embeddings_only_prompt_as_vllm",
             "tests/test_offload_vllm_regressions.py::test_base_names_as_vllm",
             "tests/test_offload_vllm_regressions.py::test_base_worker_names_as_vllm"]
    out = _run_hidden(f"import pytest\nsys.exit(pytest.main(['-q', '-p', 'no:cacheprovider', '-rs', *{nodes!r}]))\n")
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-2000:]
    assert "failed" not in out.stdout and "error" not in out.stdout.lower(), out.stdout[-3000:]
    assert "skipped" in out.stdout and "passed" in out.stdout, out.stdout[-3000:]


def test_readme_commands_and_timings_are_what_ci_checks():
    """README.md's two commands are the lines .ci/run runs in its fresh venv (it finds them by
    these patterns), and its timings are stated as measured, on a named machine, with the
    build's share, not as bare "about N s" promises."""
    import re

    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    setup = ('pip install "setuptools>=77" wheel "Cython>=3" && pip install --no-build-isolation -e . '
             "&& kvcy replay --impl both")
    tests = "pip install -r requirements-dev.txt && python -m pytest"
    assert f"\n{setup}\n" in readme and f"\n{tests}\n" in readme
    patterns = re.findall(r"for pattern in '([^']+)' '([^']+)'; do", ci)
    assert len(patterns) == 1, "the fresh-venv step of .ci/run is gone"
    for pattern, line in zip(patterns[0], (setup, tests)):
        assert re.search(pattern, line) and re.search(pattern, readme, re.M), pattern
    assert '$PY -m venv "$tmp/venv" ||' in ci  # a bare venv: no system site packages, so no torch
    assert not re.search(r"about \d+ s\b", readme), "a timing stated without the machine it was measured on"
    assert "measured on a 2-core VM (AMD EPYC" in readme and "compiling the twins" in readme
    assert "kvcy[plot]" not in readme
