"""Specs and configs: the fields, defaults and errors vLLM 0.33.0's ``kv_cache_interface`` has,
with torch dtypes (the rest of the module's tests: tests/test_kv_cache_interface.py)."""

from __future__ import annotations

import dataclasses
from fractions import Fraction
from types import SimpleNamespace

import pytest

from kvcy.config import CacheConfig, KVCacheSettings
from kvcy.kv_cache_interface import (
    ChunkedLocalAttentionSpec,
    CrossAttentionSpec,
    FullAttentionSpec,
    KVCacheConfig,
    KVCacheGroupSpec,
    KVCacheSpec,
    KVCacheTensor,
    KVQuantMode,
    MambaSpec,
    MLAAttentionSpec,
    SlidingWindowMLASpec,
    SlidingWindowSpec,
    UniformTypeKVCacheSpecs,
    customize_spec,
    get_kv_quant_mode,
    is_full_attention_spec,
    iter_layer_specs,
)

torch = pytest.importorskip("torch")


def full(**kw):
    args = dict(block_size=16, num_kv_heads=8, head_size=128, dtype=torch.float16)
    return FullAttentionSpec(**{**args, **kw})


def mla(**kw):
    args = dict(block_size=16, num_kv_heads=1, head_size=576, dtype=torch.bfloat16)
    return MLAAttentionSpec(**{**args, **kw})


def swa(**kw):
    args = dict(block_size=16, num_kv_heads=8, head_size=128, dtype="bf16", sliding_window=64)
    return SlidingWindowSpec(**{**args, **kw})


# --------------------------------------------------------------------------- item 3
def test_torch_dtype_is_kept():
    spec = full(dtype=torch.float32)
    assert spec.dtype is torch.float32
    assert spec.page_size_bytes == 16 * 8 * 256 * 4
    assert dataclasses.replace(spec, block_size=32).dtype is torch.float32
    assert FullAttentionSpec.merge([spec, spec]).dtype is torch.float32
    assert MLAAttentionSpec.merge([mla(), mla()]).dtype is torch.bfloat16
    assert spec == full(dtype="float32") and hash(spec) == hash(full(dtype="fp32"))
    assert spec != full(dtype=torch.float16)


def test_mismatched_mla_merge_asserts():
    with pytest.raises(AssertionError):
        MLAAttentionSpec.merge([mla(), mla(cache_dtype_str="fp8_ds_mla", dtype="uint8")])
    with pytest.raises(AssertionError):
        MLAAttentionSpec.merge([mla(), mla(head_size=512)])
    with pytest.raises(AssertionError):
        MLAAttentionSpec.merge([mla(), mla(tokens_per_state=4)])
    with pytest.raises(AssertionError):
        MLAAttentionSpec.merge([mla(), full()])
    with pytest.raises(AssertionError):
        SlidingWindowMLASpec.merge([swa()])


# --------------------------------------------------------------------------- item 4: spec fields
def test_spec_defaults_as_in_vllm():
    spec = full()
    assert (spec.dcp_sharded, spec.is_draft, spec.max_tp_shards, spec.tokens_per_state) == (True, False, None, 1)
    assert (spec.prefix_cacheable, spec.prefix_replay_tokens, spec.has_layer_views, spec.uses_slot_mapping) == (
        True, 0, True, True)
    m = MambaSpec(block_size=16, shapes=((4, 8),), dtypes=("float32",))
    assert (m.dcp_sharded, m.is_draft, m.tokens_per_state, m.num_states) == (False, False, -1, 1)
    assert spec.num_states == 16


def test_is_draft_is_not_part_of_equality():
    a, b = full(), full(is_draft=True)
    assert a == b and hash(a) == hash(b) and b.is_draft
    assert FullAttentionSpec.merge([a, b]) == a
    with pytest.raises(TypeError, match="is_draft"):
        full(is_draft=1)


def test_max_tp_shards():
    spec = mla(max_tp_shards=4)
    assert spec.max_tp_shards == 4
    assert MLAAttentionSpec.merge([spec, spec]).max_tp_shards == 4
    assert FullAttentionSpec.merge([full(max_tp_shards=2), full(max_tp_shards=2)]).max_tp_shards == 2
    with pytest.raises(AssertionError, match="max_tp_shards"):
        FullAttentionSpec.merge([full(max_tp_shards=2), full()])
    with pytest.raises(ValueError, match="max_tp_shards"):
        mla(max_tp_shards=0)


def test_tokens_per_state():
    compressed = mla(tokens_per_state=4)
    assert compressed.num_states == 4
    assert compressed.page_size_bytes == mla().page_size_bytes // 4
    pooled = full(tokens_per_state=Fraction(1, 2))
    assert pooled.num_states == 32 and pooled.page_size_bytes == 2 * full().page_size_bytes
    with pytest.raises(ValueError, match="tokens_per_state"):
        full(tokens_per_state=0)
    with pytest.raises(ValueError, match="multiple of tokens_per_state"):
        full(tokens_per_state=3)


def test_max_num_blocks_per_req():
    settings = KVCacheSettings(cache_config=CacheConfig(), max_model_len=1000)
    assert full().max_num_blocks_per_req(settings, 1000) == 63
    assert swa().max_num_blocks_per_req(settings, 17) == 2
    assert KVCacheSpec.max_num_blocks_per_req(full(), settings, 16) == 1
    m = MambaSpec(block_size=16, shapes=((4, 8),), dtypes=("float32",), num_speculative_blocks=2)
    assert m.max_num_blocks_per_req(settings, 1000) == 3
    align = KVCacheSettings(cache_config=CacheConfig(mamba_cache_mode="align"), max_model_len=1000)
    assert m.max_num_blocks_per_req(align, 1000) == 63 + 2
    uni = UniformTypeKVCacheSpecs(block_size=16, kv_cache_specs={"a": full(), "b": mla()})
    assert uni.max_num_blocks_per_req(settings, 100) == 7
    dcp = SimpleNamespace(parallel_config=SimpleNamespace(decode_context_parallel_size=2))
    assert full().max_num_blocks_per_req(dcp, 100) == 4  # 100 tokens over 2 ranks of 16-token blocks


def test_int4_per_token_head():
    assert KVQuantMode.INT4_PER_TOKEN_HEAD == 4 and KVQuantMode.NVFP4 == 5
    assert KVQuantMode.INT4_PER_TOKEN_HEAD.is_per_token_head
    assert get_kv_quant_mode("int4_per_token_head") is KVQuantMode.INT4_PER_TOKEN_HEAD
    assert get_kv_quant_mode("nvfp4") is KVQuantMode.NVFP4
    # sized as vLLM sizes it: the backend's packed layout, two int4 values per byte plus two scales
    int4 = full(dtype="uint8", kv_quant_mode=KVQuantMode.INT4_PER_TOKEN_HEAD)
    assert int4.page_size_bytes == int4.num_kv_heads * int4.block_size * (int4.head_size * 2)
    packed = customize_spec(int4)
    assert packed.state_content_bytes == int4.head_size + 8


def test_layer_spec_helpers():
    uni = UniformTypeKVCacheSpecs(block_size=16, kv_cache_specs={"a": full(), "b": mla()})
    assert list(iter_layer_specs(uni)) == [full(), mla()]
    assert tuple(iter_layer_specs(swa())) == (swa(),)
    assert is_full_attention_spec(uni) and is_full_attention_spec(full())
    assert not is_full_attention_spec(swa())
    assert not is_full_attention_spec(UniformTypeKVCacheSpecs(block_size=16, kv_cache_specs={"s": swa()}))
    assert not is_full_attention_spec(UniformTypeKVCacheSpecs(block_size=16, kv_cache_specs={}))
    assert uni.prefix_cacheable and uni.prefix_replay_tokens == 0


# --------------------------------------------------------------------------- item 4: configs
def test_kv_cache_tensor_vllm_form():
    t = KVCacheTensor(size=4096, layers=["a", "b"], layer_stride=2048, block_stride=256, offset=0)
    assert (t.offset, t.host_resident) == (0, False)
    assert t.page_offset(1, 3) == 2048 + 3 * 256
    assert t.shared_by == [["a"], ["b"]] and t.num_layer_slots == 2 and t.layer_names == ["a", "b"]
    t2 = KVCacheTensor(4096, ["c"], 256, 512, 128)
    assert t2.page_offset(0, 2) == 128 + 1024
    assert t == KVCacheTensor(size=4096, layers=["a", "b"], layer_stride=2048, block_stride=256)
    assert dataclasses.replace(t, offset=64).page_offset(0, 0) == 64
    legacy = KVCacheTensor(size=100, shared_by=[["x", "y"]])
    assert legacy.layers == ["x", "y"] and legacy.shared_by == [["x", "y"]] and legacy.layer_stride is None
    with pytest.raises(ValueError, match="no strides"):
        legacy.page_offset(0, 0)
    with pytest.raises(TypeError, match="layer_stride"):
        KVCacheTensor(size=10, layers=["a"])
    with pytest.raises(ValueError, match="either shared_by"):
        KVCacheTensor(size=10, layers=["a"], layer_stride=1, block_stride=1, shared_by=[["a"]])
    with pytest.raises(TypeError, match="layers"):
        KVCacheTensor(size=10, layers=[["a"]], layer_stride=1, block_stride=1)
    with pytest.raises(ValueError, match="offset"):
        KVCacheTensor(size=10, layers=["a"], layer_stride=1, block_stride=1, offset=-1)
    host = KVCacheTensor(size=10, layers=["a"], layer_stride=1, block_stride=1, host_resident=True)
    assert host.host_resident is True
    with pytest.raises(TypeError, match="host_resident must be a bool"):
        KVCacheTensor(size=10, layers=["a"], layer_stride=1, block_stride=1, host_resident=1)


def test_kv_cache_config_fields():
    groups = [
        KVCacheGroupSpec(["f"], full()),
        KVCacheGroupSpec(["s"], swa()),
        KVCacheGroupSpec(["x"], full(), enable_kv_transfer=False),
    ]
    cfg = KVCacheConfig(num_blocks=8, kv_cache_tensors=[], kv_cache_groups=groups)
    assert cfg.hisparse_host_num_blocks is None
    assert cfg.transfer_group_ids == (0, 1) and cfg.prefix_cacheable_group_ids == (0, 1)
    assert not cfg.has_mamba_layers and cfg.has_mixed_precision_kv_cache  # float16 beside bfloat16
    assert cfg.needs_kv_cache_zeroing
    same = KVCacheConfig(num_blocks=8, kv_cache_tensors=[], kv_cache_groups=groups[:1])
    assert not same.needs_kv_cache_zeroing
    uni_mamba = UniformTypeKVCacheSpecs(
        block_size=16, kv_cache_specs={"m": MambaSpec(block_size=16, shapes=((2,),), dtypes=("float32",))})
    assert KVCacheConfig(1, [], [KVCacheGroupSpec(["m"], uni_mamba)]).has_mamba_layers
    # HiSparse configs are built as vLLM builds them (the managers refuse them:
    # tests/test_hisparse.py)
    host = KVCacheConfig(num_blocks=8, kv_cache_tensors=[], hisparse_host_num_blocks=4,
                         kv_cache_groups=[*groups, KVCacheGroupSpec(["h"], full(), host_resident=True)])
    assert host.host_group_ids == (3,) and host.hisparse_host_num_blocks == 4


def test_cross_and_chunked_specs_keep_new_fields():
    c = CrossAttentionSpec(block_size=16, num_kv_heads=8, head_size=64, dtype=torch.float16, max_tp_shards=2)
    assert c.dtype is torch.float16 and c.max_tp_shards == 2
    ch = ChunkedLocalAttentionSpec(block_size=16, num_kv_heads=8, head_size=64, dtype="fp16",
                                   attention_chunk_size=64, is_draft=True)
    assert ch.is_draft and ch.dcp_sharded


# --------------------------------------------------------------------------- gaps §6: non_causal
def test_full_attention_non_causal_and_its_merge():
    assert full().non_causal is False
    nc = full(non_causal=True)
    assert nc.non_causal and nc != full() and nc.page_size_bytes == full().page_size_bytes
    assert FullAttentionSpec.merge([full(), full()]).non_causal is False
    merged = FullAttentionSpec.merge([full(), nc, full()])
    assert merged.non_causal is True and merged == nc
    with pytest.raises(TypeError, match="non_causal"):
        full(non_causal=1)


# --------------------------------------------------------------------------- gaps §6: block stride alignment
def test_block_stride_alignment():
    from kvcy.kv_cache_interface import MultipleOf

    assert full().block_stride_alignment is None and full().get_block_stride_alignment() == 1
    assert full(block_stride_alignment=4096).get_block_stride_alignment() == 4096
    assert full(block_stride_alignment=4096) != full() and full(block_stride_alignment=4096).page_size_bytes == (
        full().page_size_bytes)
    # MultipleOf: whole kernel blocks of gcd(base, block_size) tokens
    spec = full(block_size=64, block_stride_alignment=MultipleOf(16))
    assert spec.get_block_stride_alignment() == full(block_size=16).page_size_bytes
    assert full(block_size=16, block_stride_alignment=MultipleOf(32)).get_block_stride_alignment() == 1
    assert full(block_size=48, block_stride_alignment=MultipleOf(32)).get_block_stride_alignment() == (
        full(block_size=16).page_size_bytes)
    assert hash(spec) == hash(full(block_size=64, block_stride_alignment=MultipleOf(16)))
    assert repr(MultipleOf(16)) == "MultipleOf(16)"
    m = MambaSpec(block_size=16, shapes=((2,),), dtypes=("float32",), block_stride_alignment=256)
    assert m.get_block_stride_alignment() == 256 and m.block_table_token_alignment is None
    assert full().block_table_token_alignment == 128 and swa().block_table_token_alignment == 128
    assert full().get_num_kernel_states(8) == 8 and full(tokens_per_state=4).get_num_kernel_states(8) == 2
    assert m.get_num_kernel_states(8) == 1
    # merges keep it and refuse a mix
    assert FullAttentionSpec.merge([spec, spec]).block_stride_alignment == MultipleOf(16)
    assert MLAAttentionSpec.merge([mla(block_stride_alignment=512)] * 2).block_stride_alignment == 512
    with pytest.raises(AssertionError, match="block_stride_alignment"):
        FullAttentionSpec.merge([full(), full(block_stride_alignment=4096)])
    with pytest.raises(AssertionError):
        MLAAttentionSpec.merge([mla(), mla(block_stride_alignment=512)])
    with pytest.raises(ValueError, match="block_stride_alignment must be positive"):
        full(block_stride_alignment=0)
    with pytest.raises(TypeError, match="block_stride_alignment"):
        full(block_stride_alignment=True)
    with pytest.raises(TypeError, match="block_stride_alignment"):
        full(block_stride_alignment="16")
    with pytest.raises(ValueError, match="MultipleOf.base"):
        MultipleOf(0)


# --------------------------------------------------------------------------- gaps §6: group role
def test_kv_cache_group_role():
    from kvcy.kv_cache_interface import KVCacheGroupRole

    assert [r.value for r in KVCacheGroupRole] == ["default", "hisparse_source", "hisparse_indexer"]
    group = KVCacheGroupSpec(["f"], full())
    assert group.role is KVCacheGroupRole.DEFAULT
    assert KVCacheGroupSpec(["f"], full(), role="default").role is KVCacheGroupRole.DEFAULT
    for role in (KVCacheGroupRole.HISPARSE_SOURCE, "hisparse_indexer"):
        assert KVCacheGroupSpec(["f"], full(), role=role).role is KVCacheGroupRole(role)
    with pytest.raises(ValueError, match="KVCacheGroupSpec.role"):
        KVCacheGroupSpec(["f"], full(), role="leader")


@pytest.mark.parametrize("name", ["is_eagle_group", "host_resident", "enable_kv_transfer"])
@pytest.mark.parametrize("value", [0, 1, "no", None])
def test_kv_cache_group_flags_must_be_bools(name, value):
    # enable_kv_transfer=0 silently left the group out of transfer_group_ids; "no" was truthy
    with pytest.raises(TypeError, match=f"KVCacheGroupSpec.{name} must be a bool"):
        KVCacheGroupSpec(["f"], full(), **{name: value})


# --------------------------------------------------------------------------- gaps §6: config fields
def test_kv_cache_config_engine_fields_and_group_views():
    groups = [
        KVCacheGroupSpec(["f0", "f1"], full()),
        KVCacheGroupSpec(["x"], full(), enable_kv_transfer=False),
        KVCacheGroupSpec(["s"], swa()),
    ]
    cfg = KVCacheConfig(8, [], groups)
    assert (cfg.kv_cache_layout, cfg.hash_block_size, cfg.cache_hit_alignment_tokens, cfg.kv_tp_replicas) == (
        None, None, None, 1)
    assert (cfg.hisparse_host_block_stride, cfg.hisparse_shared_host_pool) == (None, False)
    # positional order as vLLM's: ..., prefix_cache_retention_interval, kv_cache_layout, hash_block_size
    pos = KVCacheConfig(8, [], groups, None, "HND", 32, 64, kv_tp_replicas=2)
    assert (pos.kv_cache_layout, pos.hash_block_size, pos.cache_hit_alignment_tokens, pos.kv_tp_replicas) == (
        "HND", 32, 64, 2)
    assert cfg.transfer_groups == (groups[0], groups[2])
    assert cfg.prefix_cacheable_groups == (groups[0], groups[2])
    assert cfg.transfer_group_index_by_layer == {"f0": 0, "f1": 0, "s": 1}
    assert cfg.select_transfer_block_ids([[1], [2], [3]]) == ([1], [3])
    with pytest.raises(ValueError, match="Expected 3 KV cache groups, got 2"):
        cfg.select_transfer_block_ids([[1], [2]])
    assert cfg.host_group_ids == ()
    tensor = KVCacheTensor(size=1024, layers=["f0"], layer_stride=1024, block_stride=128)
    assert cfg.num_blocks_of(tensor) == 8
    for bad, exc in (({"kv_tp_replicas": 0}, ValueError), ({"hash_block_size": 0}, ValueError),
                     ({"cache_hit_alignment_tokens": "16"}, TypeError), ({"kv_cache_layout": 3}, TypeError),
                     ({"hisparse_shared_host_pool": 1}, TypeError),
                     ({"hisparse_host_block_stride": 0}, ValueError),
                     ({"hisparse_host_num_blocks": -1}, ValueError),
                     ({"hisparse_host_num_blocks": 4.0}, TypeError)):
        with pytest.raises(exc, match=next(iter(bad))):
            KVCacheConfig(8, [], groups, **bad)
    on = KVCacheConfig(8, [], groups, hisparse_host_block_stride=64, hisparse_shared_host_pool=True)
    assert (on.hisparse_host_block_stride, on.hisparse_shared_host_pool) == (64, True)


# --------------------------------------------------------------------------- gaps §6: extra retained tokens
def test_sliding_window_extra_retained_tokens():
    spec = swa()
    assert spec.extra_retained_tokens == 0 and spec.num_retained_tokens == 63
    assert swa(extra_retained_tokens=0) == spec
    assert SlidingWindowMLASpec(block_size=16, num_kv_heads=1, head_size=576, dtype="bf16",
                                sliding_window=128).num_retained_tokens == 127
    # Supported since the sliding-window manager keeps the extra blocks (tests/test_single_type_kv_cache_manager.py);
    # vLLM 0.33.0's values: 79 retained tokens, admission caps 22 and 8 blocks, a different spec.
    extra = swa(extra_retained_tokens=16)
    assert extra.num_retained_tokens == 79 and extra != spec
    assert extra.max_admission_blocks_per_request(256, 4096) == 22
    assert extra.max_admission_blocks_per_request(256, 100) == 8
    with pytest.raises(ValueError, match="extra_retained_tokens must be >= 0"):
        swa(extra_retained_tokens=-1)
    with pytest.raises(TypeError, match="extra_retained_tokens"):
        swa(extra_retained_tokens=1.0)


# --------------------------------------------------------------------------- gaps §6: uniform-type specs
def test_uniform_type_specs_helpers():
    a, b, c = full(), full(num_kv_heads=4), full(num_kv_heads=4)
    uni = UniformTypeKVCacheSpecs(block_size=16, kv_cache_specs={"a": a, "b": b, "c": c})
    assert uni.first_spec is a
    assert uni.block_table_token_alignment == 128 and uni.uses_slot_mapping
    assert uni.get_max_layers_per_page_size() == 2
    settings = SimpleNamespace(max_model_len=100, max_num_batched_tokens=32, max_num_encoder_input_tokens=0,
                               cache_config=None)
    assert uni.max_memory_usage_pages(settings) == 7
    assert uni.max_memory_usage_bytes(settings) == 7 * uni.page_size_bytes
    m = MambaSpec(block_size=16, shapes=((2,),), dtypes=("float32",))
    assert UniformTypeKVCacheSpecs(block_size=16, kv_cache_specs={"m": m}).block_table_token_alignment is None
    # layers that differ in dcp sharding are not one type (as in vLLM)
    assert not UniformTypeKVCacheSpecs.is_uniform_type({"a": a, "b": full(dcp_sharded=False)})
    with pytest.raises(ValueError, match="no layer specs"):
        UniformTypeKVCacheSpecs(block_size=16, kv_cache_specs={}).first_spec
