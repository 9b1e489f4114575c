"""Memory planning (kvcy.kv_cache_sizing): groups, padding, block counts, concurrency.

The expected numbers are worked out by hand next to each assertion; they are
vLLM 0.33.0's (tests/vllm_live/test_sizing_vllm_differential.py checks the planner
against live vLLM).  The layout is kvcy's default, LBNHC (layer-outer): each
layer owns a region of ``num_blocks`` pages, so ``layer_stride = num_blocks *
page`` and ``block_stride = page``; all groups alias one allocation.
"""

from __future__ import annotations

import pytest

from kvcy.config import CacheConfig, KVCacheSettings
from kvcy.kv_cache_interface import (
    ChunkedLocalAttentionSpec,
    FullAttentionSpec,
    KVCacheConfig,
    KVCacheGroupSpec,
    KVCacheTensor,
    MambaSpec,
    MLAAttentionSpec,
    SlidingWindowSpec,
    UniformTypeKVCacheSpecs,
)
from kvcy.kv_cache_sizing import (
    _get_kv_cache_config_attention_free,
    _get_kv_cache_config_uniform_page_size,
    _get_kv_cache_config_uniform_type,
    check_enough_kv_cache_memory,
    create_kv_cache_group_specs,
    estimate_max_model_len,
    generate_scheduler_kv_cache_config,
    get_kv_cache_capacity,
    get_kv_cache_config,
    get_kv_cache_groups,
    get_max_concurrency_for_kv_cache_config,
    get_num_blocks,
    get_num_tokens_for_kv_cache_config,
    get_uniform_page_size,
    is_kv_cache_page_size_uniform,
    is_kv_cache_spec_uniform,
    is_kv_cache_type_attention_free,
    is_kv_cache_type_uniform,
    max_memory_usage_bytes,
    max_memory_usage_bytes_from_groups,
    unify_hybrid_kv_cache_specs,
    unify_kv_cache_configs,
    unify_kv_cache_spec_page_size,
)

GiB = 1 << 30
PAGE = 16 * 8 * (128 + 128) * 2  # 65536: 16 tokens, 8 kv heads, K+V of 128, bf16


def full(**kw) -> FullAttentionSpec:
    args = dict(block_size=16, num_kv_heads=8, head_size=128, dtype="bfloat16")
    args.update(kw)
    return FullAttentionSpec(**args)


def swa(window: int, **kw) -> SlidingWindowSpec:
    args = dict(block_size=16, num_kv_heads=8, head_size=128, dtype="bfloat16", sliding_window=window)
    args.update(kw)
    return SlidingWindowSpec(**args)


def settings(max_model_len: int = 8192, **kw) -> KVCacheSettings:
    cache = kw.pop("cache_config", None) or CacheConfig(block_size=16)
    return KVCacheSettings(cache_config=cache, max_model_len=max_model_len, **kw)


def hybrid_10_full_20_swa(window: int = 1024) -> dict:
    """30 layers in the pattern (sw, sw, full) x 10."""
    return {f"layers.{i}": (full() if i % 3 == 2 else swa(window)) for i in range(30)}


# ---------------------------------------------------------------------------
# One attention type
# ---------------------------------------------------------------------------


def test_uniform_model_llama3_8b_numbers():
    spec = {f"layers.{i}": full() for i in range(32)}
    cfg = get_kv_cache_config(settings(), spec, 20 * GiB)
    # 20 GiB / 64 KiB page / 32 layers = 327680 / 32
    assert cfg.num_blocks == 10240
    assert len(cfg.kv_cache_groups) == 1
    assert cfg.kv_cache_groups[0].layer_names == [f"layers.{i}" for i in range(32)]
    assert cfg.kv_cache_groups[0].kv_cache_spec == full()
    # one allocation of 32 regions, one per layer
    (tensor,) = cfg.kv_cache_tensors
    assert tensor.size == 32 * 10240 * PAGE == 20 * GiB
    assert tensor.layers == [f"layers.{i}" for i in range(32)]
    assert (tensor.layer_stride, tensor.block_stride, tensor.offset) == (10240 * PAGE, PAGE, 0)
    assert tensor.page_offset(3, 5) == 3 * 10240 * PAGE + 5 * PAGE
    assert cfg.kv_cache_layout == "LBNHC"
    # a request of 8192 tokens needs 8192/16 = 512 blocks -> 10240 / 512 = 20 at once
    assert get_max_concurrency_for_kv_cache_config(settings(), cfg) == 20.0
    assert get_num_tokens_for_kv_cache_config(cfg) == 10240 * 16


def test_one_type_with_different_shapes_is_one_uniform_type_group():
    spec = {"a": full(), "b": full(num_kv_heads=4)}  # pages 65536 and 32768
    assert not is_kv_cache_spec_uniform(spec)
    cfg = get_kv_cache_config(settings(max_model_len=160), spec, 100 * (65536 + 32768))
    (group,) = cfg.kv_cache_groups
    assert isinstance(group.kv_cache_spec, UniformTypeKVCacheSpecs)
    assert cfg.num_blocks == 100
    # one tensor per distinct layer spec; "b"'s region follows "a"'s
    assert [t.size for t in cfg.kv_cache_tensors] == [100 * (65536 + 32768)] * 2
    assert [(t.layers, t.layer_stride, t.block_stride, t.offset) for t in cfg.kv_cache_tensors] == [
        (["a"], 100 * 65536, 65536, 0),
        (["b"], 100 * 32768, 32768, 100 * 65536),
    ]
    # 160 tokens -> 10 blocks per request
    assert get_max_concurrency_for_kv_cache_config(settings(max_model_len=160), cfg) == 10.0
    sched = generate_scheduler_kv_cache_config([cfg])
    assert sched.kv_cache_groups[0].kv_cache_spec == full()


def test_attention_free():
    cfg = get_kv_cache_config(settings(), {}, 0)
    assert (cfg.num_blocks, cfg.kv_cache_tensors, cfg.kv_cache_groups) == (1, [], [])
    assert is_kv_cache_type_attention_free({})
    with pytest.raises(ValueError, match="no KV cache groups"):
        get_max_concurrency_for_kv_cache_config(settings(), cfg)


# ---------------------------------------------------------------------------
# Hybrid: grouping and padding
# ---------------------------------------------------------------------------


def test_10_full_20_sliding_window_split_into_3_groups_of_10():
    cfg = get_kv_cache_config(settings(), hybrid_10_full_20_swa(), 3 * GiB)
    names = [g.layer_names for g in cfg.kv_cache_groups]
    sw = [f"layers.{i}" for i in range(30) if i % 3 != 2]
    fa = [f"layers.{i}" for i in range(30) if i % 3 == 2]
    # types in order of first appearance; 20 sliding-window layers -> 2 groups taking every other one
    assert names == [sw[0::2], sw[1::2], fa]
    assert names[0][:3] == ["layers.0", "layers.3", "layers.6"]
    assert [type(g.kv_cache_spec) for g in cfg.kv_cache_groups] == [SlidingWindowSpec, SlidingWindowSpec,
                                                                      FullAttentionSpec]
    # 3 GiB / 64 KiB / 10 pools = 49152 / 10
    assert cfg.num_blocks == 4915
    # one tensor per group, all over one allocation of 10 layer regions: region i
    # backs layer i of every group, (sw, sw, full) = layers 3i, 3i+1, 3i+2
    assert [t.layers for t in cfg.kv_cache_tensors] == names
    assert all(t.size == 10 * 4915 * PAGE for t in cfg.kv_cache_tensors)
    assert all((t.layer_stride, t.block_stride, t.offset) == (4915 * PAGE, PAGE, 0) for t in cfg.kv_cache_tensors)
    assert [t.page_offset(4, 0) for t in cfg.kv_cache_tensors] == [4 * 4915 * PAGE] * 3


def test_hybrid_concurrency_and_tokens():
    s = settings()
    cfg = get_kv_cache_config(s, hybrid_10_full_20_swa(1024), 3 * GiB)
    # per request: full 8192/16 = 512 blocks; each sliding-window group
    # cdiv(min(1023 + 2048, 8192), 16) + 1 = 192 + 1 = 193 blocks
    per_request = 512 + 193 + 193
    assert get_max_concurrency_for_kv_cache_config(s, cfg) == pytest.approx(4915 / per_request)
    # the seed's token count: blocks per group times the block size
    assert get_num_tokens_for_kv_cache_config(cfg) == 4915 // 3 * 16
    # vLLM 0.33.0's: max-length requests that fit, in tokens
    assert get_kv_cache_capacity(s, cfg) == (int(4915 / per_request * 8192), 4915 / per_request)


def test_padding_when_a_type_does_not_divide_into_the_group_size():
    spec = {f"full.{i}": full() for i in range(10)}
    spec.update({f"sw.{i}": swa(128) for i in range(25)})
    groups = get_kv_cache_groups(settings(), spec)
    # group size 10 (25 >= 1.5 * 10); 25 sliding-window layers -> cdiv(25, 10) = 3 groups of 9, 8, 8
    assert [len(g.layer_names) for g in groups] == [10, 9, 8, 8]
    assert groups[1].layer_names[:3] == ["sw.0", "sw.3", "sw.6"]
    s = settings(max_model_len=1024, max_num_batched_tokens=256)
    # full: 1024/16 = 64 blocks; sliding: cdiv(min(127 + 256, 1024), 16) + 1 = 25 each.
    # Every block costs one page in each of the 10 pools, padding slots included.
    assert max_memory_usage_bytes_from_groups(s, groups) == 10 * PAGE * (64 + 3 * 25)
    cfg = get_kv_cache_config(s, spec, 10 * PAGE * 1000)
    assert cfg.num_blocks == 1000
    assert [len(t.layers) for t in cfg.kv_cache_tensors] == [10, 9, 8, 8]
    # region 9 only holds a layer of the one group that has 10 layers
    assert [t.layers[8] for t in cfg.kv_cache_tensors[:2]] == ["full.8", "sw.24"]
    assert all(t.size == 10 * 1000 * PAGE for t in cfg.kv_cache_tensors)


def test_near_equal_counts_use_the_larger_group_size():
    spec = {f"sw.{i}": swa(128) for i in range(12)}
    spec.update({f"full.{i}": full() for i in range(13)})
    groups = get_kv_cache_groups(settings(), spec)
    # 13 < 1.5 * 12: group size 13, the 12 sliding-window layers are padded by one
    assert [len(g.layer_names) for g in groups] == [12, 13]


def test_page_sizes_are_unified_by_growing_block_size():
    spec = {"full.0": full(), "sw.0": swa(128, num_kv_heads=4)}  # pages 65536 and 32768
    unified = unify_kv_cache_spec_page_size(spec)
    assert unified["sw.0"].block_size == 32
    assert unified["sw.0"].page_size_bytes == PAGE
    groups = get_kv_cache_groups(settings(), dict(spec))
    assert [g.kv_cache_spec.block_size for g in groups] == [16, 32]


def test_a_page_that_does_not_divide_is_padded_and_mla_cannot_be():
    spec = {"full.0": full(), "sw.0": swa(128, num_kv_heads=3)}  # 65536 vs 24576
    groups = get_kv_cache_groups(settings(), dict(spec))
    # vLLM 0.33.0 pads a non-MLA attention page up to the largest instead of refusing
    assert groups[1].kv_cache_spec == swa(128, num_kv_heads=3, page_size_padded=PAGE)
    cfg = get_kv_cache_config(settings(max_model_len=2048), dict(spec), 300 * PAGE)
    assert cfg.num_blocks == 300 and [t.block_stride for t in cfg.kv_cache_tensors] == [PAGE, PAGE]
    mla = MLAAttentionSpec(block_size=16, num_kv_heads=1, head_size=576, dtype="bfloat16")  # 18432-byte page
    chunk = ChunkedLocalAttentionSpec(block_size=16, num_kv_heads=8, head_size=128, dtype="bf16",
                                      attention_chunk_size=8192)
    with pytest.raises(NotImplementedError, match="cannot be padded"):
        get_kv_cache_groups(settings(), {"chunk.0": chunk, "mla.0": mla})
    # next to sliding-window layers MLA falls back to one group allocating them as full attention
    (group,) = get_kv_cache_groups(settings(), {"sw.0": swa(128, num_kv_heads=3), "mla.0": mla})
    assert isinstance(group.kv_cache_spec, UniformTypeKVCacheSpecs)
    assert group.kv_cache_spec.kv_cache_specs["sw.0"] == full(num_kv_heads=3, sliding_window=128)
    with pytest.raises(ValueError, match="not uniform"):
        get_uniform_page_size(spec)
    assert not is_kv_cache_page_size_uniform(spec)
    assert get_uniform_page_size({"a": full(), "b": swa(64)}) == PAGE
    with pytest.raises(ValueError, match="no KV cache specs"):
        get_uniform_page_size([])


def test_mamba_hybrid_groups():
    attn = FullAttentionSpec(block_size=16, num_kv_heads=1, head_size=16, dtype="float32")
    mamba = MambaSpec(block_size=16, shapes=((512,),), dtypes=("float32",))
    assert attn.page_size_bytes == mamba.page_size_bytes == 2048  # 16 * (16 + 16) * 4 == 512 * 4
    spec = {f"attn.{i}": attn for i in range(2)}
    spec.update({f"mamba.{i}": mamba for i in range(6)})
    s = settings(max_model_len=160)
    cfg = get_kv_cache_config(s, spec, 2 * 2048 * 50)
    assert [len(g.layer_names) for g in cfg.kv_cache_groups] == [2, 2, 2, 2]
    assert cfg.num_blocks == 50
    assert cfg.has_mamba_layers
    # a request: 160/16 = 10 attention blocks + 1 state block per Mamba group
    assert get_max_concurrency_for_kv_cache_config(s, cfg) == pytest.approx(50 / 13)


# ---------------------------------------------------------------------------
# Hybrid manager disabled
# ---------------------------------------------------------------------------


def test_disabled_hybrid_manager_makes_one_full_attention_group():
    s = settings(disable_hybrid_kv_cache_manager=True)
    spec = hybrid_10_full_20_swa(1024)
    cfg = get_kv_cache_config(s, spec, 3 * GiB)
    (group,) = cfg.kv_cache_groups
    assert len(group.layer_names) == 30
    assert group.kv_cache_spec == full(sliding_window=1024)
    # converted in place
    assert spec["layers.0"] == full(sliding_window=1024)
    # 49152 pages over 30 layers
    assert cfg.num_blocks == 49152 // 30 == 1638
    assert get_max_concurrency_for_kv_cache_config(s, cfg) == pytest.approx(1638 / 512)


def test_unify_hybrid_chunked_local():
    chunk = ChunkedLocalAttentionSpec(block_size=16, num_kv_heads=8, head_size=128, dtype="bf16",
                                      attention_chunk_size=8192)
    spec = {"a": full(), "b": chunk}
    unify_hybrid_kv_cache_specs(spec)
    assert spec["b"] == full(attention_chunk_size=8192)
    assert is_kv_cache_type_uniform(spec)


def test_unify_hybrid_without_full_attention_fails():
    chunk = ChunkedLocalAttentionSpec(block_size=16, num_kv_heads=8, head_size=128, dtype="bf16",
                                      attention_chunk_size=8192)
    with pytest.raises(ValueError, match="failed to promote"):
        unify_hybrid_kv_cache_specs({"a": swa(128), "b": chunk})


# ---------------------------------------------------------------------------
# Blocks, override, memory checks
# ---------------------------------------------------------------------------


def test_get_num_blocks():
    assert get_num_blocks(settings(), 4, 4 * PAGE * 7 + PAGE - 1, PAGE) == 7
    assert get_num_blocks(settings(), 4, 0, PAGE) == 0


def test_num_gpu_blocks_override():
    s = settings(cache_config=CacheConfig(block_size=16, num_gpu_blocks_override=600))
    assert get_num_blocks(s, 4, 10 * GiB, PAGE) == 600
    cfg = get_kv_cache_config(s, {f"l{i}": full() for i in range(4)}, 10 * GiB)
    assert cfg.num_blocks == 600
    assert [(t.size, t.layer_stride) for t in cfg.kv_cache_tensors] == [(4 * 600 * PAGE, 600 * PAGE)]
    # the override is the capacity the memory check sees (599 usable blocks < 512 + ...)
    small = settings(cache_config=CacheConfig(block_size=16, num_gpu_blocks_override=512))
    with pytest.raises(ValueError, match="estimated maximum model length is 8176"):
        get_kv_cache_config(small, {f"l{i}": full() for i in range(4)}, 10 * GiB)


@pytest.mark.parametrize(
    "args, message",
    [((0, 100, PAGE), "num_layers"), ((4, 100, 0), "page_size"), ((4, 100, -PAGE), "page_size"),
     ((4, -1, PAGE), "available_memory")],
)
def test_get_num_blocks_bad_input(args, message):
    with pytest.raises(ValueError, match=message):
        get_num_blocks(settings(), *args)


def test_estimate_max_model_len_by_binary_search():
    spec = {"l0": full(), "l1": full()}
    # 2 layers x cdiv(L, 16) pages <= 200 pages  ->  cdiv(L, 16) <= 100  ->  L = 1600
    assert estimate_max_model_len(settings(), spec, 200 * PAGE) == 1600
    assert estimate_max_model_len(settings(), spec, 200 * PAGE + PAGE) == 1600
    assert estimate_max_model_len(settings(), spec, 202 * PAGE) == 1616
    # never above max_model_len, 0 when one token does not fit
    assert estimate_max_model_len(settings(max_model_len=100), spec, 200 * PAGE) == 100
    assert estimate_max_model_len(settings(), spec, PAGE) == 0


def test_check_enough_memory_names_the_estimate():
    s = settings()
    spec = {"l0": full(), "l1": full()}
    assert max_memory_usage_bytes(s, spec.values()) == 2 * 512 * PAGE
    # exactly enough: one block of both layers (the null block) is held back first
    check_enough_kv_cache_memory(s, spec, 2 * 512 * PAGE + 2 * PAGE)
    with pytest.raises(ValueError, match="estimated maximum model length is 8176"):
        check_enough_kv_cache_memory(s, spec, 2 * 512 * PAGE)
    with pytest.raises(ValueError, match="estimated maximum model length is 1600") as info:
        check_enough_kv_cache_memory(s, spec, 202 * PAGE)
    assert "(8192)" in info.value.args[0]
    assert "0.06 GiB KV cache is needed" in info.value.args[0]  # 64 MiB
    with pytest.raises(ValueError, match="No available memory"):
        check_enough_kv_cache_memory(s, spec, 0)
    check_enough_kv_cache_memory(s, {}, 0)  # attention-free: nothing to check


def test_get_kv_cache_config_too_little_memory_for_a_hybrid_model():
    s = settings(max_model_len=4096, max_num_batched_tokens=32)
    spec = {"full": full(), "sw.0": swa(64), "sw.1": swa(64)}
    # one page per block (group size 1); a request of L tokens needs cdiv(L, 16) full blocks
    # plus 2 x (cdiv(min(63 + 32, L), 16) + 1) = 2 x 7 sliding-window blocks once L >= 95.
    # 40 pages less the null block: cdiv(L, 16) <= 25  ->  L = 400
    with pytest.raises(ValueError, match="estimated maximum model length is 400"):
        get_kv_cache_config(s, spec, 40 * PAGE)
    cfg = get_kv_cache_config(settings(max_model_len=400, max_num_batched_tokens=32), spec, 40 * PAGE)
    assert cfg.num_blocks == 40


def test_too_little_memory_even_for_one_token():
    with pytest.raises(ValueError, match="larger than the available") as info:
        get_kv_cache_config(settings(), {"l0": full()}, 2 * PAGE - 1)  # a page short once the null block is out
    with pytest.raises(ValueError, match="No available memory"):
        get_kv_cache_config(settings(), {"l0": full()}, PAGE - 1)
    assert "estimated" not in info.value.args[0]


def test_available_memory_must_be_an_int():
    with pytest.raises(TypeError, match="available_memory"):
        get_kv_cache_config(settings(), {"l0": full()}, 1.5 * GiB)


# ---------------------------------------------------------------------------
# Groups from names, several workers
# ---------------------------------------------------------------------------


def test_create_kv_cache_group_specs():
    spec = {"a": full(), "b": full(sliding_window=64), "c": swa(64)}
    groups = create_kv_cache_group_specs(spec, [["a", "b"], ["c"]])
    assert groups[0] == KVCacheGroupSpec(["a", "b"], full(sliding_window=64))
    assert groups[1] == KVCacheGroupSpec(["c"], swa(64))
    with pytest.raises(ValueError, match="no KV cache spec"):
        create_kv_cache_group_specs(spec, [["a", "zzz"]])
    with pytest.raises(AssertionError, match="FullAttentionSpec"):  # vLLM's merge asserts
        create_kv_cache_group_specs(spec, [["a", "c"]])
    with pytest.raises(ValueError, match="at least one layer"):
        create_kv_cache_group_specs(spec, [[]])


def test_unify_kv_cache_configs_takes_the_smallest_block_count():
    def config(num_blocks, groups):
        return KVCacheConfig(
            num_blocks=num_blocks,
            kv_cache_tensors=[KVCacheTensor(size=num_blocks * PAGE, shared_by=[["a"]])],
            kv_cache_groups=groups,
        )

    a = config(100, [KVCacheGroupSpec(["full"], full()), KVCacheGroupSpec(["sw"], swa(64))])
    b = config(80, [KVCacheGroupSpec(["sw"], swa(64)), KVCacheGroupSpec(["full"], full())])
    unify_kv_cache_configs([a, b])
    assert a.num_blocks == b.num_blocks == 80
    assert a.kv_cache_tensors[0].size == 80 * PAGE
    # groups sorted by spec type name: FullAttentionSpec before SlidingWindowSpec
    assert [g.layer_names for g in b.kv_cache_groups] == [["full"], ["sw"]]
    c = config(90, [KVCacheGroupSpec(["full"], full(num_kv_heads=4)), KVCacheGroupSpec(["sw"], swa(64))])
    with pytest.raises(ValueError, match="different spec"):
        unify_kv_cache_configs([a, c])
    with pytest.raises(ValueError, match="no KV cache configs"):
        unify_kv_cache_configs([])


def test_seed_private_entry_points():
    cfg = _get_kv_cache_config_attention_free()
    assert (cfg.num_blocks, cfg.kv_cache_tensors, cfg.kv_cache_groups) == (1, [], [])
    cfg = _get_kv_cache_config_uniform_type(settings(), {"a": full(), "b": full()}, 2 * PAGE * 7)
    assert cfg.num_blocks == 7 and [t.layers for t in cfg.kv_cache_tensors] == [["a", "b"]]
    cfg = _get_kv_cache_config_uniform_page_size(settings(), hybrid_10_full_20_swa(), 10 * PAGE * 5)
    assert cfg.num_blocks == 5 and [len(g.layer_names) for g in cfg.kv_cache_groups] == [10, 10, 10]
    with pytest.raises(ValueError, match="not uniform"):
        _get_kv_cache_config_uniform_page_size(settings(), {"a": full(), "b": swa(64, num_kv_heads=4)}, GiB)


def test_unify_kv_cache_configs_re_places_strided_tensors_for_the_smaller_count():
    """Shrinking a strided config is planning it again for the smaller count (layer_stride scales)."""
    for layout in ("LBNHC", "BLHNC"):
        s = settings(max_model_len=256, cache_config=CacheConfig(block_size=16, kv_cache_layout=layout))
        spec = hybrid_10_full_20_swa(64)
        big = get_kv_cache_config(s, dict(spec), 10 * PAGE * 300)
        small = get_kv_cache_config(s, dict(spec), 10 * PAGE * 200)
        unify_kv_cache_configs([big, small])
        assert big.num_blocks == small.num_blocks == 200
        assert big.kv_cache_tensors == small.kv_cache_tensors
        # groups are sorted (full attention first) and the tensors follow them
        assert [t.layers for t in big.kv_cache_tensors] == [g.layer_names for g in big.kv_cache_groups]
        assert big.kv_cache_tensors[0].size == 10 * PAGE * 200
        expected_layer_stride = 200 * PAGE if layout == "LBNHC" else PAGE
        assert big.kv_cache_tensors[0].layer_stride == expected_layer_stride


def test_full_attention_layers_with_two_recorded_windows_are_refused_as_vllm_does():
    # vLLM's uniformity check treats only a merge's AssertionError as "not uniform"; the merge's
    # ValueError for two window sizes goes through (so grouping refuses such a model)
    with pytest.raises(ValueError, match="same window size"):
        is_kv_cache_spec_uniform({"a": full(sliding_window=64), "b": full(sliding_window=128)})
    s = settings(max_model_len=64, disable_hybrid_kv_cache_manager=True)
    with pytest.raises(ValueError, match="same window size"):
        get_kv_cache_config(s, {"f": full(), "s1": swa(64), "s2": swa(512, num_kv_heads=4)}, 800 * PAGE)
    assert not is_kv_cache_spec_uniform({"a": full(), "b": swa(64)})  # an AssertionError: not uniform
