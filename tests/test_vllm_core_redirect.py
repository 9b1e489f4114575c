"""The redirect's spec rebinding (kvcy.testing.vllm_core), without vLLM: every spec class kvcy
defines replaces vLLM's original wherever a ``vllm.*`` module holds it, so that vLLM's own
planner, which stays vLLM's, sorts kvcy's specs with ``isinstance`` as it sorts its own."""

from __future__ import annotations

import sys
import types

import pytest

import kvcy.kv_cache_interface as kvcy_specs
from kvcy.testing import vllm_core


def _vllm_class(name: str) -> type:
    # A stand-in for one of vLLM's spec classes: what the rebinding goes by is the
    # class's home module, vllm.v1.kv_cache_interface.
    return type(name, (), {"__module__": "vllm.v1.kv_cache_interface"})


@pytest.fixture
def fake_planner(monkeypatch: pytest.MonkeyPatch) -> types.ModuleType:
    module = types.ModuleType("vllm._kvcy_fake_planner")
    module.UniformTypeKVCacheSpecs = _vllm_class("UniformTypeKVCacheSpecs")
    module.AttentionSpec = _vllm_class("AttentionSpec")
    module.MLAAttentionSpec = _vllm_class("MLAAttentionSpec")
    module.NotASpecOfKvcy = _vllm_class("NotASpecOfKvcy")
    module.Helper = type("Helper", (), {"__module__": "vllm.v1.core.kv_cache_planning"})
    module.constant = 3
    monkeypatch.setitem(sys.modules, module.__name__, module)
    return module


def test_every_kvcy_spec_class_is_rebound(fake_planner: types.ModuleType) -> None:
    rebound: dict[str, list[str]] = {}
    vllm_core._rebind_specs_everywhere(rebound)
    assert fake_planner.UniformTypeKVCacheSpecs is kvcy_specs.UniformTypeKVCacheSpecs
    assert fake_planner.AttentionSpec is kvcy_specs.AttentionSpec
    assert fake_planner.MLAAttentionSpec is kvcy_specs.MLAAttentionSpec
    assert sorted(rebound[fake_planner.__name__]) == ["AttentionSpec", "MLAAttentionSpec", "UniformTypeKVCacheSpecs"]


def test_names_kvcy_lacks_and_other_modules_classes_stay(fake_planner: types.ModuleType) -> None:
    lacking = fake_planner.NotASpecOfKvcy
    helper = fake_planner.Helper
    vllm_core._rebind_specs_everywhere({})
    assert fake_planner.NotASpecOfKvcy is lacking
    assert fake_planner.Helper is helper
    assert fake_planner.constant == 3


def test_a_kvcy_uniform_group_is_seen_per_layer_once_rebound(fake_planner: types.ModuleType) -> None:
    # What vLLM's planner does with a group (its _get_per_layer_spec): a uniform group is
    # taken apart per layer only when isinstance recognises it.  (The dtype by name: this
    # runs where torch is not installed.)
    layers = {"a": kvcy_specs.MLAAttentionSpec(block_size=64, num_kv_heads=1, head_size=512, dtype="uint8"),
              "b": kvcy_specs.MLAAttentionSpec(block_size=64, num_kv_heads=1, head_size=128, dtype="uint8")}
    group = kvcy_specs.UniformTypeKVCacheSpecs(block_size=64, kv_cache_specs=layers)

    def per_layer_page(name: str) -> int:
        spec = group
        if isinstance(spec, fake_planner.UniformTypeKVCacheSpecs):
            spec = spec.kv_cache_specs[name]
        return spec.page_size_bytes

    assert per_layer_page("a") == group.page_size_bytes  # vLLM's class: the whole group per layer
    vllm_core._rebind_specs_everywhere({})
    assert [per_layer_page(n) for n in layers] == [64 * 512, 64 * 128]
    assert sum(per_layer_page(n) for n in layers) == group.page_size_bytes
