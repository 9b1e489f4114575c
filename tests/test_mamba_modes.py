"""Mamba groups are refused or built as vLLM 0.33.0 refuses or builds them.

vLLM 0.33.0's ``MambaManager`` asserts that prefix caching comes with
``mamba_cache_mode='align'``: a Mamba group with caching in any other mode fails
that assertion when the manager is made (explicitly, so ``python -O`` too).  Align
mode, with caching or without, builds (its behaviour: tests/test_mamba_align.py), and
a Mamba group with caching off in any other mode works as before.  (The same cases
against live vLLM: tests/test_prefix_caching.py.)
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from kvcy.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec, MambaSpec

CACHING_MESSAGE = "Mamba prefix caching requires mamba_cache_mode='align'"


def _config(mode: str, hybrid: bool) -> KVCacheConfig:
    groups = [KVCacheGroupSpec(["m"], MambaSpec(block_size=16, shapes=((4,),), dtypes=("float32",),
                                                 mamba_cache_mode=mode))]
    if hybrid:
        full = FullAttentionSpec(block_size=16, num_kv_heads=1, head_size=8, dtype="float16")
        groups.insert(0, KVCacheGroupSpec(["a"], full))
    return KVCacheConfig(num_blocks=256, kv_cache_tensors=[], kv_cache_groups=groups)


@pytest.mark.parametrize("hybrid", [False, True], ids=["mamba", "full+mamba"])
@pytest.mark.parametrize("mode", ["none", "all"])  # (vLLM's spec takes any string; only "align" caches)
def test_mamba_manager_refuses_as_vllm(impl, hybrid, mode):
    cfg = _config(mode, hybrid)
    with pytest.raises(AssertionError) as info:
        impl.kv_cache.KVCacheManager(cfg, 256, 16, 16, enable_caching=True)
    assert str(info.value) == CACHING_MESSAGE
    # the single-type manager raises it, made by itself too
    pool = impl.kv_cache.BlockPool(8, True, 16)
    with pytest.raises(AssertionError, match="Mamba"):
        impl.kv_cache.MambaManager(cfg.kv_cache_groups[-1].kv_cache_spec, pool, True, 0, 16)


@pytest.mark.parametrize("hybrid", [False, True], ids=["mamba", "full+mamba"])
@pytest.mark.parametrize("caching", [True, False], ids=["caching", "no-caching"])
def test_align_mode_builds(impl, hybrid, caching):
    mgr = impl.kv_cache.KVCacheManager(_config("align", hybrid), 256, 16, 16, enable_caching=caching)
    mamba = mgr.coordinator.single_type_managers[-1]
    assert mamba.mamba_cache_mode == "align" and not mamba.has_positionally_stable_blocks
    req = impl.kv_cache.Request("r", list(range(40)))
    blocks = mgr.allocate_slots(req, 40)
    # (align mode: one state block, the states before it null)
    assert blocks.get_block_ids()[-1] == [0, 0, 1 + int(hybrid) * 3]


@pytest.mark.parametrize("mode", ["none", "all"])
def test_mamba_without_caching_allocates(impl, mode):
    mgr = impl.kv_cache.KVCacheManager(_config(mode, True), 256, 16, 16, enable_caching=False)
    req = impl.kv_cache.Request("r", list(range(40)))
    blocks = mgr.allocate_slots(req, 40)
    assert blocks is not None
    full_ids, mamba_ids = blocks.get_block_ids()
    assert len(full_ids) == 3 and len(mamba_ids) == 3  # (a block table per group)


def test_refusal_survives_python_O():
    """The AssertionError is raised explicitly: ``python -O`` (no asserts) refuses alike."""
    root = Path(__file__).resolve().parents[1]
    code = (
        "from kvcy.kv_cache_interface import KVCacheConfig, KVCacheGroupSpec, MambaSpec\n"
        "from kvcy import _fast\n"
        "spec = MambaSpec(block_size=16, shapes=((4,),), dtypes=('float32',))\n"
        "cfg = KVCacheConfig(num_blocks=8, kv_cache_tensors=[], kv_cache_groups=[KVCacheGroupSpec(['m'], spec)])\n"
        "for name in _fast.available():\n"
        "    try:\n"
        "        _fast.load(name)['kv_cache'].KVCacheManager(cfg, 256, 16, 16, enable_caching=True)\n"
        "    except AssertionError as exc:\n"
        "        print(name, exc)\n"
    )
    env = dict(os.environ, PYTHONPATH=str(root) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    out = subprocess.run([sys.executable, "-O", "-c", code], cwd=root, env=env, capture_output=True, text=True,
                         check=True).stdout.splitlines()
    assert "python " + CACHING_MESSAGE in out
    assert len(out) >= 1 and all(line.endswith(CACHING_MESSAGE) for line in out)
