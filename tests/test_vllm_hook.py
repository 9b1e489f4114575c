"""``kvcy.vllm`` without vLLM: importing kvcy never imports vLLM, the plugin entry point is
declared, and ``install()`` refuses a missing vLLM or another version before it changes anything.

(The drop-in itself, against vLLM 0.33.0's real Scheduler, is tests/vllm_live/test_vllm_scheduler.py.)
"""

from __future__ import annotations

import importlib
import importlib.util
import subprocess
import sys
import types
from pathlib import Path

import pytest

import kvcy.vllm

ROOT = Path(__file__).resolve().parents[1]


def test_importing_kvcy_does_not_import_vllm() -> None:
    code = (
        "import sys, kvcy, kvcy.vllm, kvcy.kv_cache_manager, kvcy.kv_cache_interface\n"
        "assert not kvcy.vllm.is_installed()\n"
        "loaded = sorted(m for m in sys.modules if m == 'vllm' or m.startswith('vllm.'))\n"
        "assert not loaded, loaded\n"
    )
    subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True)


def test_general_plugin_entry_point_is_declared() -> None:
    tomllib = pytest.importorskip("tomllib")
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    target = project["entry-points"]["vllm.general_plugins"]["kvcy"]
    module, _, name = target.partition(":")
    assert getattr(importlib.import_module(module), name) is kvcy.vllm.load_general_plugin


def test_install_refuses_another_vllm_version(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = types.ModuleType("vllm")
    fake.__version__ = "0.32.1"
    monkeypatch.setitem(sys.modules, "vllm", fake)
    with pytest.raises(RuntimeError, match=r"supports vLLM 0\.33\.0 only.*installed vLLM is 0\.32\.1"):
        kvcy.vllm.install()
    with pytest.raises(RuntimeError, match="0.32.1"):
        kvcy.vllm.load_general_plugin()
    assert not kvcy.vllm.is_installed()


@pytest.mark.skipif(importlib.util.find_spec("vllm") is not None, reason="vLLM is installed here")
def test_install_without_vllm_says_what_is_missing() -> None:
    with pytest.raises(ImportError, match="kvcy.vllm needs vLLM 0.33.0 installed"):
        kvcy.vllm.install()
    assert not kvcy.vllm.is_installed()
    kvcy.vllm.uninstall()  # nothing installed: a no-op, not an import of vLLM
    assert "vllm" not in sys.modules
