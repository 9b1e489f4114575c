"""kvcy's specs against live vLLM 0.33.0: page geometry, backend layouts, grouping and conversion.

Runs only where vLLM 0.33.0 imports (``.ci/run``'s vLLM step; ``KVCY_REQUIRE_VLLM=1`` makes a
missing vLLM an error).  The rows come from tests/_spec_table.py, whose recorded values
tests/test_spec_pages.py checks without vLLM.
"""

from __future__ import annotations

import dataclasses
import os

import pytest

os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import vllm  # noqa: E402

import torch  # noqa: E402
from _spec_table import CUSTOMIZED, TABLE  # noqa: E402
from test_spec_pages import geometry, kvcy_spec  # noqa: E402
from vllm.v1 import kv_cache_interface as v  # noqa: E402

import kvcy.vllm  # noqa: E402
from kvcy import kv_cache_interface as ki  # noqa: E402

IDS = [row[0] for row in TABLE]


def vllm_spec(cls_name: str, kwargs: dict):
    kw = dict(kwargs)
    if "dtype" in kw:
        kw["dtype"] = getattr(torch, kw["dtype"])
    if "dtypes" in kw:
        kw["dtypes"] = tuple(getattr(torch, d) for d in kw["dtypes"])
    if "kv_quant_mode" in kw:
        kw["kv_quant_mode"] = v.KVQuantMode[kw["kv_quant_mode"]]
    if "cache_role" in kw:
        kw["cache_role"] = v.SparseCacheRole[kw["cache_role"]]
    return getattr(v, cls_name)(**kw)


def _default_backend(spec):
    if isinstance(spec, (v.MLAAttentionSpec, v.SlidingWindowMLASpec)):
        from vllm.model_executor.layers.attention.mla_attention import MLACommonBackend

        return MLACommonBackend
    if spec.kv_quant_mode.is_nvfp4:
        try:
            from vllm.v1.attention.backends.flashinfer import FlashInferBackend
        except ImportError:  # flashinfer is not installed on CPU
            return None
        return FlashInferBackend
    from vllm.v1.attention.backends.triton_attn import TritonAttentionBackend

    return TritonAttentionBackend


@pytest.mark.parametrize("name, cls_name, kwargs", TABLE, ids=IDS)
def test_page_geometry_matches_live_vllm(name, cls_name, kwargs):
    theirs, ours = vllm_spec(cls_name, kwargs), kvcy_spec(cls_name, kwargs)
    assert geometry(ours) == geometry(theirs)
    assert ours.num_states == theirs.num_states
    assert ours.block_table_token_alignment == theirs.block_table_token_alignment
    assert ours.prefix_cacheable == theirs.prefix_cacheable
    assert ours.prefix_replay_tokens == theirs.prefix_replay_tokens
    for field in ("head_size_v", "page_size_padded", "num_head_slots", "state_content_bytes", "alignment",
                  "topk_buffer_width", "model_version", "is_index_group_leader", "num_prefill_checkpoint_blocks",
                  "prefill_checkpoint_alignment", "tp_replicated", "tokens_per_state"):
        if hasattr(theirs, field):
            assert getattr(ours, field) == getattr(theirs, field), field


@pytest.mark.parametrize("name, cls_name, kwargs", TABLE, ids=IDS)
def test_customize_spec_matches_vllms_default_backend(name, cls_name, kwargs):
    theirs, ours = vllm_spec(cls_name, kwargs), kvcy_spec(cls_name, kwargs)
    if not isinstance(theirs, v.AttentionSpec):
        return
    backend = _default_backend(theirs)
    if backend is None:
        pytest.skip("the default backend of this mode does not import here")
    packed_theirs, packed_ours = backend.customize_spec(theirs), ki.customize_spec(ours)
    assert geometry(packed_ours) == geometry(packed_theirs)
    assert (packed_ours.num_head_slots, packed_ours.state_content_bytes) == (
        packed_theirs.num_head_slots, packed_theirs.state_content_bytes)
    assert (name in CUSTOMIZED) == (packed_theirs is not theirs)


@pytest.mark.parametrize("name, cls_name, kwargs", TABLE, ids=IDS)
def test_conversion_carries_every_field(name, cls_name, kwargs):
    theirs = vllm_spec(cls_name, kwargs)
    converted = kvcy.vllm.convert_kv_cache_spec(theirs)
    assert converted == kvcy_spec(cls_name, kwargs)
    assert geometry(converted) == geometry(theirs)
    for field in dataclasses.fields(theirs):
        mine, value = getattr(converted, field.name), getattr(theirs, field.name)
        if field.name in ("kv_quant_mode", "cache_role"):
            assert mine.name == value.name, field.name
        elif field.name == "mamba_type":
            assert mine == value.name.lower()
        elif field.name == "dtypes":
            assert mine == tuple(str(d).removeprefix("torch.") for d in value)
        else:
            assert mine == value, field.name


def test_quant_modes_and_names_match_vllm():
    assert [(m.name, m.value) for m in ki.KVQuantMode] == [(m.name, m.value) for m in v.KVQuantMode]
    assert list(ki.KVQuantMode.__members__) == list(v.KVQuantMode.__members__)
    for mode in v.KVQuantMode:
        ours = ki.KVQuantMode(mode.value)
        for prop in ("is_per_token_head", "is_nvfp4", "is_octave", "is_turboquant", "is_ultraquant", "is_custom_mode"):
            assert getattr(ours, prop) == getattr(mode, prop), (mode, prop)
    for name in ("auto", "fp8", "fp8_e5m2", "int8_per_token_head", "fp8_per_token_head", "int4_per_token_head",
                 "nvfp4", "nvfp4_ds_mla", "turboquant_k8v4", "turboquant_4bit_nc", "octave_k3v3",
                 "ultraquant_4bit", "bfloat16"):
        assert ki.get_kv_quant_mode(name).name == v.get_kv_quant_mode(name).name, name
    assert [r.value for r in ki.SparseCacheRole] == [r.value for r in v.SparseCacheRole]


def test_mamba_type_accepts_vllms_enum():
    from vllm.v1.attention.backends.registry import MambaAttentionBackendEnum

    base = dict(block_size=16, shapes=((4, 8),), dtypes=("float32",))
    for member in (MambaAttentionBackendEnum.MAMBA1, MambaAttentionBackendEnum.GDN_ATTN):
        by_enum = ki.MambaSpec(**base, mamba_type=member)
        assert by_enum == ki.MambaSpec(**base, mamba_type=member.name.lower())
        assert by_enum == ki.MambaSpec(**base, mamba_type=member.value)
        assert by_enum.mamba_type == member.name.lower()


def _pairs():
    """Layer dicts on which vLLM's grouping decision is compared."""
    rows = {name: (cls_name, kwargs) for name, cls_name, kwargs in TABLE}

    def both(name, **changes):
        cls_name, kwargs = rows[name]
        kwargs = {**kwargs, **changes}
        return vllm_spec(cls_name, kwargs), kvcy_spec(cls_name, kwargs)

    swa16 = dict(block_size=16, num_kv_heads=1, head_size=576, dtype="bfloat16")
    yield "full+mla", [both("full-bf16"), both("mla")]
    yield "full+sink", [both("full-bf16"), both("sink")]
    yield "full+sliding", [both("full-bf16"), both("sliding-int8-pth")]
    yield "sliding+sliding-mla", [both("sliding-int8-pth"), both("sliding-mla", block_size=16)]
    yield "sliding-mla+sliding", [both("sliding-mla"), both("sliding-int8-pth", **swa16, sliding_window=128)]
    yield "sliding windows differ", [both("sliding-int8-pth"), both("sliding-int8-pth", sliding_window=64)]
    yield "chunked+chunked", [both("chunked"), both("chunked", num_kv_heads=8)]
    yield "chunks differ", [both("chunked"), both("chunked", attention_chunk_size=128)]
    yield "cross+full", [both("cross"), both("full-bf16")]
    yield "mamba+mamba", [both("mamba"), both("mamba")]
    yield "mamba tp differs", [both("mamba"), both("mamba", tp_replicated=True)]
    yield "mamba pages differ", [both("mamba"), both("mamba", shapes=((4, 9), (2, 3)))]
    yield "mamba checkpoints differ", [both("mamba"), both("mamba", num_prefill_checkpoint_blocks=1)]
    yield "block sizes differ", [both("full-bf16"), both("full-bf16", block_size=32)]


@pytest.mark.parametrize("case", list(_pairs()), ids=lambda case: case[0])
def test_is_uniform_type_decides_as_vllm(case):
    _, pairs = case
    theirs = {f"l{i}": pair[0] for i, pair in enumerate(pairs)}
    ours = {f"l{i}": pair[1] for i, pair in enumerate(pairs)}
    assert ki.UniformTypeKVCacheSpecs.is_uniform_type(ours) == v.UniformTypeKVCacheSpecs.is_uniform_type(theirs)


def test_unregistered_spec_types_fail_as_in_vllm():
    kw = dict(block_size=16, num_kv_heads=4, head_size=64, dtype="float16")
    theirs = v.EncoderOnlyAttentionSpec(**{**kw, "dtype": torch.float16})
    with pytest.raises(AssertionError, match="Unsupported KV cache spec type"):
        v.UniformTypeKVCacheSpecs.is_uniform_type({"a": theirs})
    with pytest.raises(AssertionError, match="Unsupported KV cache spec type"):
        ki.UniformTypeKVCacheSpecs.is_uniform_type({"a": ki.EncoderOnlyAttentionSpec(**kw)})


def test_mla_merges_as_vllm():
    rows = {name: (cls_name, kwargs) for name, cls_name, kwargs in TABLE}
    cls_name, kwargs = rows["mla-aligned"]
    a_theirs, a_ours = vllm_spec(cls_name, kwargs), kvcy_spec(cls_name, kwargs)
    decoding = {**kwargs, "non_causal_multi_token_decode": True}
    b_theirs, b_ours = vllm_spec(cls_name, decoding), kvcy_spec(cls_name, decoding)
    merged_theirs = v.MLAAttentionSpec.merge([a_theirs, b_theirs])
    merged_ours = ki.MLAAttentionSpec.merge([a_ours, b_ours])
    assert kvcy.vllm.convert_kv_cache_spec(merged_theirs) == merged_ours
    for field in ("topk_buffer_width", "model_version", "cache_role", "is_index_group_leader"):
        changed = {**kwargs, field: {"topk_buffer_width": 1024, "model_version": None, "cache_role": "INDEXER",
                                     "is_index_group_leader": True}[field]}
        with pytest.raises(AssertionError):
            v.MLAAttentionSpec.merge([a_theirs, vllm_spec(cls_name, changed)])
        with pytest.raises(AssertionError, match="top-k buffer width"):
            ki.MLAAttentionSpec.merge([a_ours, kvcy_spec(cls_name, changed)])
    cls_name, kwargs = rows["sliding-mla-aligned"]
    merged_theirs = v.SlidingWindowMLASpec.merge([vllm_spec(cls_name, kwargs)] * 2)
    assert kvcy.vllm.convert_kv_cache_spec(merged_theirs) == ki.SlidingWindowMLASpec.merge([kvcy_spec(cls_name, kwargs)] * 2)


def test_replace_as_as_vllm():
    rows = {name: (cls_name, kwargs) for name, cls_name, kwargs in TABLE}
    cls_name, kwargs = rows["sliding-int8-pth"]
    theirs = v.replace_as(vllm_spec(cls_name, kwargs), v.FullAttentionSpec, drop=("extra_retained_tokens",))
    ours = ki.replace_as(kvcy_spec(cls_name, kwargs), ki.FullAttentionSpec, drop=("extra_retained_tokens",))
    assert kvcy.vllm.convert_kv_cache_spec(theirs) == ours
    with pytest.raises(TypeError):
        v.replace_as(vllm_spec(cls_name, kwargs), v.FullAttentionSpec)
    with pytest.raises(TypeError):
        ki.replace_as(kvcy_spec(cls_name, kwargs), ki.FullAttentionSpec)
