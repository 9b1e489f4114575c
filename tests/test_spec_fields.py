"""vLLM 0.33.0's spec fields kvcy carries: MLA's sparse/DeepSeek fields, sliding-window MLA's
padding and replay policy, Mamba's checkpoint and replication fields, the spec registry and
``replace_as`` (no vLLM needed; tests/vllm_live/test_vllm_specs.py compares with live vLLM)."""

from __future__ import annotations

import dataclasses

import pytest

from kvcy import kv_cache_interface as ki
from kvcy._fast import kv_cache as twin

MLA = dict(block_size=64, num_kv_heads=1, head_size=584, dtype="uint8")


def mla(**kw):
    return ki.MLAAttentionSpec(**{**MLA, **kw})


def swmla(**kw):
    return ki.SlidingWindowMLASpec(**{**MLA, "sliding_window": 128, **kw})


def mamba(**kw):
    return ki.MambaSpec(**{"block_size": 16, "shapes": ((4, 8),), "dtypes": ("float32",), **kw})


# ---------------------------------------------------------------------------
# MLA
# ---------------------------------------------------------------------------


def test_mla_defaults_are_vllms():
    spec = mla()
    assert (spec.head_size_v, spec.num_heads, spec.topk_buffer_width, spec.alignment, spec.model_version) == (
        0, 1, None, None, None)
    assert spec.cache_role is ki.SparseCacheRole.SPARSE
    assert (spec.is_index_group_leader, spec.non_causal_multi_token_decode) == (False, False)
    assert mla(num_kv_heads=2).num_heads == 2  # one slot per kv head, as vLLM


def test_alignment_pads_the_page():
    assert mla().page_size_bytes == 64 * 584
    aligned = mla(alignment=4096)
    assert aligned.page_size_padded == aligned.page_size_bytes == 40960  # 37376 rounded up
    assert aligned.real_page_size_bytes == 64 * 584
    assert mla(alignment=584).page_size_padded is None  # already a multiple: no padding
    assert swmla(alignment=1000).page_size_bytes == 38000
    with pytest.raises(ValueError, match="alignment"):
        mla(alignment=0)


def test_mla_field_types_are_checked():
    assert mla(cache_role="indexer").cache_role is ki.SparseCacheRole.INDEXER
    with pytest.raises(ValueError, match="cache_role"):
        mla(cache_role="dense")
    with pytest.raises(TypeError, match="is_index_group_leader"):
        mla(is_index_group_leader=1)
    with pytest.raises(TypeError, match="non_causal_multi_token_decode"):
        mla(non_causal_multi_token_decode="yes")
    with pytest.raises(ValueError, match="topk_buffer_width"):
        mla(topk_buffer_width=0)
    with pytest.raises(TypeError, match="model_version"):
        mla(model_version=4)


def test_mla_merge_checks_vllms_fields_and_ors_multi_token_decode():
    a, b = mla(topk_buffer_width=2048), mla(topk_buffer_width=2048, non_causal_multi_token_decode=True)
    merged = ki.MLAAttentionSpec.merge([a, b])
    assert merged.non_causal_multi_token_decode and merged.topk_buffer_width == 2048
    for change in ({"topk_buffer_width": 1024}, {"model_version": "deepseek_v4"}, {"cache_role": "indexer"},
                   {"is_index_group_leader": True}, {"block_stride_alignment": 4096}, {"tokens_per_state": 4},
                   {"cache_dtype_str": "fp8_ds_mla"}):
        with pytest.raises(AssertionError, match="same quantization method"):
            ki.MLAAttentionSpec.merge([a, dataclasses.replace(a, **change)])
    with pytest.raises(AssertionError, match="same attention spec"):
        ki.MLAAttentionSpec.merge([a, dataclasses.replace(a, state_content_bytes=656)])
    # the merged spec keeps the padded page but not the alignment (as vLLM's merge)
    aligned = mla(alignment=4096)
    merged = ki.MLAAttentionSpec.merge([aligned, aligned])
    assert (merged.alignment, merged.page_size_bytes) == (None, aligned.page_size_bytes)


# ---------------------------------------------------------------------------
# Sliding-window MLA
# ---------------------------------------------------------------------------


def test_sliding_window_mla_fields():
    spec = swmla(model_version="deepseek_v4")
    assert (spec.head_size_v, spec.bounded_replay, spec.prefix_cacheable, spec.prefix_replay_tokens) == (
        0, False, True, 0)
    with pytest.raises(AssertionError, match="Unsupported model version"):
        swmla(model_version="deepseek_v3")
    bounded = swmla(bounded_replay=True, sliding_window=64)
    assert (bounded.prefix_cacheable, bounded.prefix_replay_tokens) == (False, 64)
    with pytest.raises(TypeError, match="bounded_replay"):
        swmla(bounded_replay=1)


def test_sliding_window_mla_merge():
    a = swmla(alignment=1000, kv_quant_mode=ki.KVQuantMode.FP8_PER_TENSOR)
    merged = ki.SlidingWindowMLASpec.merge([a, a])
    # vLLM's merge keeps shape, window, format and padded page, and leaves the rest at defaults
    assert (merged.sliding_window, merged.page_size_bytes, merged.alignment) == (128, 38000, None)
    assert merged.kv_quant_mode is ki.KVQuantMode.NONE
    for change in ({"sliding_window": 64}, {"model_version": "deepseek_v4"}, {"block_stride_alignment": 512}):
        with pytest.raises(AssertionError, match="replay policy"):
            ki.SlidingWindowMLASpec.merge([a, dataclasses.replace(a, **change)])
    with pytest.raises(AssertionError, match="dcp sharding"):
        ki.SlidingWindowMLASpec.merge([a, dataclasses.replace(a, max_tp_shards=2)])


# ---------------------------------------------------------------------------
# Mamba
# ---------------------------------------------------------------------------


def test_mamba_fields_are_fields():
    spec = mamba()
    names = {f.name for f in dataclasses.fields(spec)}
    assert {"num_prefill_checkpoint_blocks", "prefill_checkpoint_alignment", "tp_replicated", "num_heads",
            "tokens_per_state"} <= names
    assert (spec.num_heads, spec.tokens_per_state, spec.num_states, spec.tp_replicated) == (1, -1, 1, False)
    assert mamba(num_heads=2).num_heads == 2
    assert mamba(tp_replicated=True) != spec
    for bad, error in (({"num_prefill_checkpoint_blocks": -1}, ValueError), ({"prefill_checkpoint_alignment": 0},
                       ValueError), ({"num_heads": 0}, ValueError), ({"tokens_per_state": 0}, ValueError),
                       ({"tp_replicated": 1}, TypeError), ({"mamba_type": 2}, TypeError)):
        with pytest.raises(error, match=next(iter(bad))):
            mamba(**bad)


def test_mamba_type_names():
    assert mamba().mamba_type == "mamba2"
    assert mamba(mamba_type="GDN_ATTN").mamba_type == "gdn_attn"
    assert mamba(mamba_type="vllm.v1.attention.backends.mamba1_attn.Mamba1AttentionBackend").mamba_type == "mamba1"
    assert mamba(mamba_type="my_backend").mamba_type == "my_backend"  # a backend registered by name


def test_mamba_uniformity_compares_vllms_fields():
    base = mamba()
    assert ki.UniformTypeKVCacheSpecs.is_uniform_type({"a": base, "b": mamba()})
    for change in ({"num_speculative_blocks": 1}, {"num_prefill_checkpoint_blocks": 1},
                   {"prefill_checkpoint_alignment": 16}, {"tp_replicated": True}, {"shapes": ((4, 9),)}):
        assert not ki.UniformTypeKVCacheSpecs.is_uniform_type({"a": base, "b": mamba(**change)}), change


# ---------------------------------------------------------------------------
# Registry, uniformity, replace_as
# ---------------------------------------------------------------------------


def full(**kw):
    return ki.FullAttentionSpec(**{"block_size": 16, "num_kv_heads": 4, "head_size": 64, "dtype": "float16", **kw})


def test_builtin_registrations():
    reg = ki.KVCacheSpecRegistry
    assert reg.get_manager_class(full()) is twin.FullAttentionManager
    assert reg.get_manager_class(mla()) is twin.FullAttentionManager
    assert reg.get_manager_class(swmla()) is twin.SlidingWindowManager
    assert reg.get_manager_class(mamba()) is twin.MambaManager
    assert reg.get_uniform_type_base_spec(mla()) is ki.FullAttentionSpec
    assert reg.get_uniform_type_base_spec(swmla()) is ki.SlidingWindowMLASpec
    encoder = ki.EncoderOnlyAttentionSpec(block_size=16, num_kv_heads=4, head_size=64, dtype="float16")
    assert reg.get_uniform_type_base_spec(encoder) is None  # vLLM registers no manager for it
    with pytest.raises(ValueError, match="Unsupported KV cache spec type for layer enc"):
        reg.check_kv_cache_spec_registry({"dec": full(), "enc": encoder})
    with pytest.raises(AssertionError, match="Unsupported KV cache spec type"):
        ki.UniformTypeKVCacheSpecs.is_uniform_type({"enc": encoder})


def test_registering_a_spec_class():
    @ki.register_kv_cache_spec(manager_class=twin.FullAttentionManager, uniform_type_base_spec=ki.FullAttentionSpec)
    @dataclasses.dataclass(frozen=True, kw_only=True)
    class ModelFullSpec(ki.FullAttentionSpec):
        pass

    @dataclasses.dataclass(frozen=True, kw_only=True)
    class OwnKind(ki.FullAttentionSpec):
        pass

    ki.KVCacheSpecRegistry.register(OwnKind, twin.FullAttentionManager)  # its own grouping base
    args = dict(block_size=16, num_kv_heads=4, head_size=64, dtype="float16")
    assert ki.UniformTypeKVCacheSpecs.is_uniform_type({"a": full(), "b": ModelFullSpec(**args)})
    assert not ki.UniformTypeKVCacheSpecs.is_uniform_type({"a": OwnKind(**args), "b": full()})
    # the same registration twice is fine; a different one is refused (as in vLLM)
    ki.KVCacheSpecRegistry.register(OwnKind, twin.FullAttentionManager)
    with pytest.raises(AssertionError, match="Conflicting registration"):
        ki.KVCacheSpecRegistry.register(OwnKind, twin.SlidingWindowManager)
    with pytest.raises(AssertionError, match="manager_class is required"):
        ki.KVCacheSpecRegistry.register(OwnKind)
    with pytest.raises(AssertionError, match="must inherit"):
        ki.KVCacheSpecRegistry.register(OwnKind, twin.FullAttentionManager, uniform_type_base_spec=ki.MambaSpec)


def test_uniformity_as_vllm_decides_it():
    swa = ki.SlidingWindowSpec(block_size=16, num_kv_heads=1, head_size=576, dtype="bf16", sliding_window=128)
    swmla_16 = ki.SlidingWindowMLASpec(block_size=16, num_kv_heads=1, head_size=576, dtype="bf16", sliding_window=128)
    assert ki.UniformTypeKVCacheSpecs.is_uniform_type({"a": swa, "b": swmla_16})  # SWA groups with its MLA form
    assert not ki.UniformTypeKVCacheSpecs.is_uniform_type({"a": swmla_16, "b": swa})  # but not the other way
    assert ki.UniformTypeKVCacheSpecs.is_uniform_type({"a": full(), "b": mla(block_size=16)})
    assert full().is_uniform_with_collection({"x": full(num_kv_heads=8)})


def test_replace_as():
    swa = ki.SlidingWindowSpec(block_size=16, num_kv_heads=4, head_size=64, dtype="float16", sliding_window=32)
    as_full = ki.replace_as(swa, ki.FullAttentionSpec, drop=("extra_retained_tokens",))
    assert type(as_full) is ki.FullAttentionSpec
    assert (as_full.sliding_window, as_full.num_kv_heads, as_full.page_size_bytes) == (32, 4, swa.page_size_bytes)
    assert ki.replace_as(swa, ki.FullAttentionSpec, drop=("extra_retained_tokens", "sliding_window")).sliding_window is None
    with pytest.raises(TypeError):
        ki.replace_as(swa, ki.FullAttentionSpec)  # extra_retained_tokens has no place in a full-attention spec
