"""KV-cache specs, layouts and views (kvcy.kv_cache_interface).

Every expected number is worked out by hand in the test from the formula
written next to it, never by calling the code under test.
"""

from __future__ import annotations

import dataclasses
import subprocess
import sys
import types

import pytest

from kvcy.config import CacheConfig, KVCacheSettings
from kvcy.kv_cache_interface import (
    AttentionSpec,
    ChunkedLocalAttentionSpec,
    CrossAttentionSpec,
    FullAttentionSpec,
    HiddenStateCacheSpec,
    KVCacheConfig,
    KVCacheGroupSpec,
    KVCacheLayout,
    KVCacheSpec,
    KVCacheSpecKind,
    KVCacheTensor,
    KVQuantMode,
    MambaSpec,
    MLAAttentionSpec,
    SinkFullAttentionSpec,
    SlidingWindowMLASpec,
    SlidingWindowSpec,
    TQFullAttentionSpec,
    UniformTypeKVCacheSpecs,
    compute_layer_kv_cache_shape_bytes,
    customize_spec,
    get_dtype_size,
    get_kv_cache_spec_kind,
    get_kv_cache_spec_sliding_window,
    get_kv_quant_mode,
    is_quantized_kv_cache,
    kv_cache_uses_per_token_head_scales,
    num_states_for,
    reshape_kv_cache,
)

KIB = 1024


def full(**kw) -> FullAttentionSpec:
    args = dict(block_size=16, num_kv_heads=8, head_size=128, dtype="bfloat16")
    args.update(kw)
    return FullAttentionSpec(**args)


def swa(window: int = 128, **kw) -> SlidingWindowSpec:
    args = dict(block_size=16, num_kv_heads=8, head_size=128, dtype="bfloat16", sliding_window=window)
    args.update(kw)
    return SlidingWindowSpec(**args)


def chunked(chunk: int = 512, **kw) -> ChunkedLocalAttentionSpec:
    args = dict(block_size=16, num_kv_heads=8, head_size=128, dtype="bfloat16", attention_chunk_size=chunk)
    args.update(kw)
    return ChunkedLocalAttentionSpec(**args)


# ---------------------------------------------------------------------------
# Import without torch
# ---------------------------------------------------------------------------


def test_import_does_not_need_torch():
    code = (
        "import sys\n"
        "import kvcy.kv_cache_interface as k\n"
        "s = k.FullAttentionSpec(block_size=16, num_kv_heads=2, head_size=64, dtype='float16')\n"
        "assert s.page_size_bytes == 16 * 2 * 128 * 2\n"
        "assert 'torch' not in sys.modules, 'torch was imported'\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


# ---------------------------------------------------------------------------
# Page sizes and vocabulary
# ---------------------------------------------------------------------------


def test_full_attention_page_size():
    # 16 tokens x 8 heads x (128 K + 128 V) x 2 bytes
    assert full().page_size_bytes == 16 * 8 * 256 * 2 == 64 * KIB
    assert full().real_page_size_bytes == 65536


def test_full_attention_page_size_with_value_head_size():
    spec = full(head_size=192, head_size_v=128, dtype="float16")
    assert spec.page_size_bytes == 16 * 8 * (192 + 128) * 2 == 81920
    assert spec.state_content_size_bytes == (192 + 128) * 2 == 640


def test_head_size_v_defaults_to_head_size():
    assert full().head_size_v == 128
    assert swa().head_size_v == 128


@pytest.mark.parametrize(
    "dtype, size",
    [("float32", 4), ("float", 4), ("fp32", 4), ("bfloat16", 2), ("bf16", 2), ("half", 2), ("fp8", 1),
     ("fp8_e5m2", 1), ("int8", 1), ("torch.float16", 2)],
)
def test_dtype_names(dtype, size):
    spec = full(dtype=dtype)
    assert spec.page_size_bytes == 16 * 8 * 256 * size
    assert get_dtype_size(dtype) == size


def test_sliding_window_and_chunked_pages_match_full():
    assert swa().page_size_bytes == 65536
    assert chunked().page_size_bytes == 65536
    assert CrossAttentionSpec(block_size=16, num_kv_heads=8, head_size=128, dtype="bf16").page_size_bytes == 65536


def test_mla_page_size():
    # one latent of 576 values per token, no separate V
    spec = MLAAttentionSpec(block_size=16, num_kv_heads=1, head_size=576, dtype="bfloat16")
    assert spec.page_size_bytes == 16 * 576 * 2 == 18432
    assert (spec.num_heads, spec.head_size_v) == (1, 0)  # vLLM: num_kv_heads slots, no V
    assert spec.state_content_size_bytes == 1152
    # the opaque fp8_ds_mla blob is published as state_content_bytes; the name alone sizes nothing
    named = MLAAttentionSpec(block_size=16, num_kv_heads=1, head_size=576, dtype="uint8", cache_dtype_str="fp8_ds_mla")
    assert named.page_size_bytes == 16 * 576
    ds = dataclasses.replace(named, state_content_bytes=656)
    assert ds.page_size_bytes == 16 * 656 == 10496
    hidden = HiddenStateCacheSpec(block_size=16, num_kv_heads=1, head_size=4096, dtype="float16")
    assert hidden.page_size_bytes == 16 * 4096 * 2


def test_sliding_window_mla_page_size():
    spec = SlidingWindowMLASpec(block_size=16, num_kv_heads=1, head_size=576, dtype="bf16", sliding_window=128)
    assert spec.page_size_bytes == 16 * 576 * 2


def test_tq_page_size():
    spec = TQFullAttentionSpec(block_size=16, num_kv_heads=8, head_size=128, dtype="uint8", tq_slot_size=100)
    assert spec.page_size_bytes == 16 * 8 * 100 == 12800
    plain = TQFullAttentionSpec(block_size=16, num_kv_heads=8, head_size=128, dtype="uint8")
    assert plain.page_size_bytes == 16 * 8 * 256 * 1


def test_per_token_head_scales_are_the_backends_layout():
    spec = full(dtype="int8", kv_quant_mode=KVQuantMode.INT8_PER_TOKEN_HEAD)
    # as in vLLM, the mode alone adds nothing: the backend publishes its packed layout
    assert spec.page_size_bytes == 16 * 8 * 256 * 1 == 32768
    packed = customize_spec(spec)
    # K and V bytes plus one float32 scale for K and one for V per (token, head)
    assert packed.state_content_bytes == 256 + 8
    assert packed.page_size_bytes == 32768 + 2 * 16 * 8 * 4 == 33792


def test_nvfp4_page_size():
    spec = full(dtype="uint8", kv_quant_mode=KVQuantMode.NVFP4)
    assert spec.page_size_bytes == 16 * 8 * 256
    packed = customize_spec(spec)
    # K and V in separate slots; per slot: 128/2 bytes of fp4 + 128/16 fp8 scales = 72 bytes
    assert (packed.num_heads, packed.state_content_size_bytes) == (16, 72)
    assert packed.page_size_bytes == 16 * 16 * 72 == 18432


def test_page_size_padded():
    spec = full(page_size_padded=70000)
    assert spec.page_size_bytes == 70000
    assert spec.real_page_size_bytes == 65536
    with pytest.raises(ValueError, match="page_size_padded"):
        full(page_size_padded=65535)


def test_mamba_page_size():
    spec = MambaSpec(block_size=16, shapes=((3, 10240), (128, 64, 128)), dtypes=("bfloat16", "float32"))
    assert spec.page_size_bytes == 3 * 10240 * 2 + 128 * 64 * 128 * 4 == 4255744
    assert (spec.num_heads, spec.tokens_per_state, spec.state_content_size_bytes) == (1, -1, 4255744)
    padded = MambaSpec(block_size=16, shapes=((4, 4),), dtypes=("float32",), page_size_padded=128)
    assert padded.page_size_bytes == 128


def test_attention_vocabulary():
    spec = full()
    assert (spec.num_heads, spec.tokens_per_state, spec.state_content_size_bytes) == (8, 1, 256 * 2)


# ---------------------------------------------------------------------------
# Frozen, keyword-only, hashable
# ---------------------------------------------------------------------------


def test_specs_are_frozen_keyword_only_and_hashable():
    spec = full()
    with pytest.raises(dataclasses.FrozenInstanceError):
        spec.block_size = 32
    with pytest.raises(TypeError):
        FullAttentionSpec(16, 8, 128, "bfloat16")
    d = {spec: "a", swa(): "b", full(): "c"}
    assert len(d) == 2 and d[full()] == "c"


def test_dtype_spellings_give_equal_specs():
    torch = pytest.importorskip("torch")
    a = full(dtype=torch.bfloat16)
    b = full(dtype="bf16")
    assert a == b and hash(a) == hash(b)
    # A torch.dtype is kept as given (vLLM's code reads spec.dtype as one); a name is canonical.
    assert a.dtype is torch.bfloat16 and b.dtype == "bfloat16"
    assert a.torch_dtype is torch.bfloat16 and b.torch_dtype is torch.bfloat16


def test_uniform_type_specs_are_hashable():
    u = UniformTypeKVCacheSpecs(block_size=16, kv_cache_specs={"a": full(), "b": full(num_kv_heads=4)})
    v = UniformTypeKVCacheSpecs(block_size=16, kv_cache_specs={"a": full(), "b": full(num_kv_heads=4)})
    assert u == v and hash(u) == hash(v)
    assert {u: 1}[v] == 1


@pytest.mark.parametrize(
    "factory, field",
    [
        (lambda: full(block_size=0), "block_size"),
        (lambda: full(block_size=-16), "block_size"),
        (lambda: full(num_kv_heads=0), "num_kv_heads"),
        (lambda: full(head_size=-1), "head_size"),
        (lambda: full(head_size_v=-1), "head_size_v"),
        (lambda: full(sliding_window=0), "sliding_window"),
        (lambda: full(attention_chunk_size=-5), "attention_chunk_size"),
        (lambda: swa(window=0), "sliding_window"),
        (lambda: chunked(chunk=0), "attention_chunk_size"),
        # A Mamba state layout is checked where vLLM's fails: when its page size is computed.
        (lambda: MambaSpec(block_size=16, shapes=((0, 4),), dtypes=("float32",)).page_size_bytes, "shapes"),
        (lambda: MambaSpec(block_size=16, shapes=((2, 4),), dtypes=("float32", "float16")).page_size_bytes, "dtypes"),
        (lambda: MambaSpec(block_size=0, shapes=((2, 4),), dtypes=("float32",)), "block_size"),
        (lambda: full(dtype="float13"), "float13"),
    ],
)
def test_bad_sizes_raise_value_error_naming_the_field(factory, field):
    with pytest.raises(ValueError, match=field):
        factory()


def test_mamba_spec_builds_from_any_layout_as_vllm_and_refuses_it_when_sized():
    # vLLM's own tests build MambaSpec(shapes=(1, 1), ...) for managers that never size a page.
    spec = MambaSpec(block_size=16, shapes=(1, 1), dtypes=(torch.float32,))
    assert spec.shapes == (1, 1) and spec.dtypes == (torch.float32,)
    assert spec == MambaSpec(block_size=16, shapes=(1, 1), dtypes=(torch.float32,))
    for read in (lambda: spec.page_size_bytes, lambda: spec.real_page_size_bytes,
                 lambda: spec.state_content_size_bytes):
        with pytest.raises(TypeError, match="shapes must be a sequence of shapes"):
            read()
    with pytest.raises(TypeError, match="dtypes must be a sequence"):
        MambaSpec(block_size=16, shapes=((2,),), dtypes=7).page_size_bytes
    # well-formed layouts are still normalised at construction
    ok = MambaSpec(block_size=16, shapes=[[2, 3]], dtypes=[torch.float32])
    assert ok.shapes == ((2, 3),) and ok.page_size_bytes == 24


def test_wrong_types_raise_type_error():
    with pytest.raises(TypeError, match="block_size"):
        full(block_size=16.0)
    with pytest.raises(TypeError, match="num_kv_heads"):
        full(num_kv_heads=True)
    with pytest.raises(TypeError, match="dtype"):
        full(dtype=2)


def test_full_attention_cannot_record_both_windows():
    with pytest.raises(ValueError, match="both sliding_window and attention_chunk_size"):
        full(sliding_window=128, attention_chunk_size=512)


# ---------------------------------------------------------------------------
# Memory per request
# ---------------------------------------------------------------------------


@pytest.fixture
def settings() -> KVCacheSettings:
    return KVCacheSettings(
        cache_config=CacheConfig(block_size=16),
        max_model_len=1000,
        max_num_batched_tokens=256,
        max_num_encoder_input_tokens=300,
    )


def test_max_memory_full(settings):
    # cdiv(1000, 16) = 63 pages
    assert full().max_memory_usage_bytes(settings) == 63 * 65536


def test_max_memory_sliding_window(settings):
    # min(128 - 1 + 256, 1000) = 383 tokens -> cdiv(383, 16) = 24 blocks, +1 for an unaligned window
    spec = swa(128)
    assert spec.max_admission_blocks_per_request(max_in_flight_tokens=256, max_model_len=1000) == 25
    assert spec.max_memory_usage_bytes(settings) == 25 * 65536
    # a window wider than the model: capped at cdiv(1000, 16) + 1 = 64
    assert swa(4096).max_memory_usage_bytes(settings) == 64 * 65536


def test_max_memory_chunked_local(settings):
    # min(512 + 256, 1000) = 768 tokens -> 48 blocks
    spec = chunked(512)
    assert spec.max_admission_blocks_per_request(max_in_flight_tokens=256, max_model_len=1000) == 48
    assert spec.max_memory_usage_bytes(settings) == 48 * 65536


def test_max_memory_cross_attention(settings):
    spec = CrossAttentionSpec(block_size=16, num_kv_heads=8, head_size=128, dtype="bf16")
    # cdiv(300 encoder tokens, 16) = 19
    assert spec.max_memory_usage_bytes(settings) == 19 * 65536


def test_max_memory_mamba(settings):
    spec = MambaSpec(block_size=16, shapes=((4, 8),), dtypes=("float32",), num_speculative_blocks=2)
    page = 4 * 8 * 4
    assert spec.max_memory_usage_bytes(settings) == page * (1 + 2)
    align = dataclasses.replace(settings, cache_config=CacheConfig(block_size=16, mamba_cache_mode="align"))
    assert spec.max_memory_usage_bytes(align) == page * (2 + 2)
    # vLLM 0.33.0 has no "all" mode (its CacheConfig refuses it); a spec's own mode other than
    # "align" holds one state, as "none" does
    every = dataclasses.replace(spec, mamba_cache_mode="all")
    assert every.max_memory_usage_bytes(types.SimpleNamespace()) == page * (1 + 2)
    assert dataclasses.replace(spec, mamba_cache_mode="align").max_memory_usage_bytes(
        types.SimpleNamespace()) == page * (2 + 2)
    with pytest.raises(ValueError, match="Unknown mamba_cache_mode: all"):
        CacheConfig(block_size=16, mamba_cache_mode="all")
    checkpoints = dataclasses.replace(spec, num_prefill_checkpoint_blocks=3)
    assert checkpoints.max_memory_usage_bytes(align) == page * (2 + 2 + 3)
    assert checkpoints.max_memory_usage_bytes(settings) == page * (1 + 2)


def test_max_memory_uniform_type(settings):
    u = UniformTypeKVCacheSpecs(block_size=16, kv_cache_specs={"a": full(), "b": full(num_kv_heads=4)})
    assert u.page_size_bytes == 65536 + 32768
    assert u.max_memory_usage_bytes(settings) == 63 * (65536 + 32768)


# ---------------------------------------------------------------------------
# merge, copy_with_new_block_size, uniform types
# ---------------------------------------------------------------------------


def test_merge_full_with_recorded_window():
    merged = FullAttentionSpec.merge([full(), full(sliding_window=128), full()])
    assert merged == full(sliding_window=128)
    merged = FullAttentionSpec.merge([full(attention_chunk_size=512), full()])
    assert merged.attention_chunk_size == 512


# vLLM asserts in its merges (AssertionError), except for differing window sizes.
@pytest.mark.parametrize(
    "specs, error, message",
    [
        ([full(sliding_window=128), full(sliding_window=256)], ValueError, "same window size"),
        ([full(sliding_window=128), full(attention_chunk_size=512)], AssertionError, "both sliding window"),
        ([full(), full(head_size=64)], AssertionError, "head_size"),
        ([full(), swa()], AssertionError, "FullAttentionSpec"),
        ([], ValueError, "empty"),
    ],
)
def test_merge_rejects(specs, error, message):
    with pytest.raises(error, match=message):
        FullAttentionSpec.merge(specs)


def test_base_merge_requires_equal_specs():
    assert SlidingWindowSpec.merge([swa(), swa()]) == swa()
    with pytest.raises(AssertionError, match="same KV cache spec"):
        SlidingWindowSpec.merge([swa(128), swa(256)])


def test_sink_and_tq_merge_keep_their_fields():
    a = SinkFullAttentionSpec(block_size=16, num_kv_heads=8, head_size=128, dtype="bf16", sink_len=4)
    assert SinkFullAttentionSpec.merge([a, a]).sink_len == 4
    t = TQFullAttentionSpec(block_size=16, num_kv_heads=8, head_size=128, dtype="uint8", tq_slot_size=100)
    assert TQFullAttentionSpec.merge([t, t]) == t
    t2 = dataclasses.replace(t, tq_slot_size=50)
    with pytest.raises(AssertionError, match="tq_slot_size"):
        TQFullAttentionSpec.merge([t, t2])


def test_mla_merge():
    m = MLAAttentionSpec(block_size=16, num_kv_heads=1, head_size=576, dtype="bf16")
    assert MLAAttentionSpec.merge([m, m]) == m
    with pytest.raises(AssertionError, match="quantization"):
        MLAAttentionSpec.merge([m, dataclasses.replace(m, cache_dtype_str="fp8_ds_mla")])
    with pytest.raises(AssertionError, match="MLAAttentionSpec"):
        FullAttentionSpec.merge([m, m])


def test_copy_with_new_block_size():
    assert full().copy_with_new_block_size(32).page_size_bytes == 32 * 8 * 256 * 2
    padded = full(page_size_padded=70000).copy_with_new_block_size(32)
    assert padded.page_size_padded == 140000
    assert swa(128).copy_with_new_block_size(64) == swa(128, block_size=64)


def test_is_uniform_type():
    assert UniformTypeKVCacheSpecs.is_uniform_type({"a": full(), "b": full(num_kv_heads=4)})
    assert UniformTypeKVCacheSpecs.is_uniform_type({"a": full(), "b": full(sliding_window=64)})
    assert not UniformTypeKVCacheSpecs.is_uniform_type({"a": full(), "b": swa()})
    assert not UniformTypeKVCacheSpecs.is_uniform_type({"a": swa(128), "b": swa(256)})
    assert UniformTypeKVCacheSpecs.is_uniform_type({"a": swa(128), "b": swa(128, num_kv_heads=2)})
    assert not UniformTypeKVCacheSpecs.is_uniform_type({"a": chunked(512), "b": chunked(1024)})
    assert not UniformTypeKVCacheSpecs.is_uniform_type({"a": full(), "b": full(block_size=32)})
    with pytest.raises(ValueError, match="empty"):
        UniformTypeKVCacheSpecs.is_uniform_type({})


def test_from_specs():
    specs = {"a": full(), "b": full(num_kv_heads=4)}
    u = UniformTypeKVCacheSpecs.from_specs(specs)
    assert u is not None and u.block_size == 16 and u.kv_cache_specs == specs
    assert UniformTypeKVCacheSpecs.from_specs({"a": full(), "b": swa()}) is None


# ---------------------------------------------------------------------------
# Kinds and windows (as KV events publish them)
# ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "spec, kind, window",
    [
        (full(), "full_attention", None),
        (full(sliding_window=128), "full_attention", None),
        (swa(128), "sliding_window", 128),
        (chunked(512), "chunked_local_attention", None),
        (MLAAttentionSpec(block_size=16, num_kv_heads=1, head_size=576, dtype="bf16"), "mla_attention", None),
        (SlidingWindowMLASpec(block_size=16, num_kv_heads=1, head_size=576, dtype="bf16", sliding_window=64),
         "sliding_window_mla", 64),
        (SinkFullAttentionSpec(block_size=16, num_kv_heads=8, head_size=128, dtype="bf16"), "sink_full_attention",
         None),
        (MambaSpec(block_size=16, shapes=((2,),), dtypes=("float32",)), "mamba", None),
        (CrossAttentionSpec(block_size=16, num_kv_heads=8, head_size=128, dtype="bf16"), "cross_attention", None),
    ],
)
def test_spec_kind_and_window(spec, kind, window):
    assert get_kv_cache_spec_kind(spec).value == kind
    assert get_kv_cache_spec_kind(spec) == kind  # a str enum
    assert get_kv_cache_spec_sliding_window(spec) == window


def test_uniform_type_kind_and_window():
    u = UniformTypeKVCacheSpecs(block_size=16, kv_cache_specs={"a": swa(64), "b": swa(64, num_kv_heads=2)})
    assert get_kv_cache_spec_kind(u) is KVCacheSpecKind.SLIDING_WINDOW
    assert get_kv_cache_spec_sliding_window(u) == 64


# ---------------------------------------------------------------------------
# Quantization modes
# ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "name, mode, per_token_head",
    [
        ("auto", KVQuantMode.NONE, False),
        ("bfloat16", KVQuantMode.NONE, False),
        ("fp8", KVQuantMode.FP8_PER_TENSOR, False),
        ("fp8_e5m2", KVQuantMode.FP8_PER_TENSOR, False),
        ("int8_per_token_head", KVQuantMode.INT8_PER_TOKEN_HEAD, True),
        ("fp8_per_token_head", KVQuantMode.FP8_PER_TOKEN_HEAD, True),
        ("nvfp4", KVQuantMode.NVFP4, False),
    ],
)
def test_kv_quant_mode(name, mode, per_token_head):
    assert get_kv_quant_mode(name) is mode
    assert kv_cache_uses_per_token_head_scales(name) is per_token_head
    assert is_quantized_kv_cache(name) is (mode is not KVQuantMode.NONE)


# ---------------------------------------------------------------------------
# Tensors, groups, configs
# ---------------------------------------------------------------------------


def test_kv_cache_tensor_slots():
    t = KVCacheTensor(size=3 * 65536, shared_by=[["full.0", "sw.0"], ["full.1", "sw.1"]])
    assert t.num_layer_slots == 2
    assert t.layer_names == ["full.0", "sw.0", "full.1", "sw.1"]
    with pytest.raises(ValueError, match="size"):
        KVCacheTensor(size=-1, shared_by=[["x"]])


def test_kv_cache_config_defaults():
    mamba = MambaSpec(block_size=16, shapes=((2,),), dtypes=("float32",))
    cfg = KVCacheConfig(num_blocks=4, kv_cache_tensors=[], kv_cache_groups=[KVCacheGroupSpec(["m"], mamba)])
    assert cfg.prefix_cache_retention_interval is None
    assert cfg.has_mamba_layers and cfg.needs_kv_cache_zeroing
    assert KVCacheGroupSpec(["a"], full()).is_eagle_group is False


# ---------------------------------------------------------------------------
# Layouts
# ---------------------------------------------------------------------------

L, B, H, N, C = 0, 1, 2, 3, 4


def test_layouts_and_stride_orders():
    assert {m.name: m.stride_order for m in KVCacheLayout} == {
        "LBHNC": (L, B, H, N, C),
        "LBNHC": (L, B, N, H, C),
        "LHBNC": (L, H, B, N, C),
        "BLHNC": (B, L, H, N, C),
        "BLNHC": (B, L, N, H, C),
        "BHLNC": (B, H, L, N, C),
    }


def test_layout_properties():
    # per-layer 4D view: drop L, renumber B, H, N, C as 0..3
    assert KVCacheLayout.LBNHC.layer_view_order == (0, 2, 1, 3)
    assert KVCacheLayout.LHBNC.layer_view_order == (1, 0, 2, 3)
    assert KVCacheLayout.BHLNC.layer_view_order == (0, 1, 2, 3)
    assert [m.name for m in KVCacheLayout if m.is_layer_compact] == ["LBHNC", "LBNHC", "LHBNC"]
    assert [m.name for m in KVCacheLayout if m.is_block_contiguous] == ["LBHNC", "BLHNC"]
    assert [m.name for m in KVCacheLayout if m.is_block_outermost] == ["BLHNC", "BLNHC", "BHLNC"]
    assert KVCacheLayout.from_name("NHD") is KVCacheLayout.LBNHC
    assert KVCacheLayout.from_name("hnd") is KVCacheLayout.LBHNC
    assert KVCacheLayout.from_name("BLNHC") is KVCacheLayout.BLNHC
    with pytest.raises(ValueError, match="unknown KV cache layout"):
        KVCacheLayout.from_name("NCHW")


# ---------------------------------------------------------------------------
# Shapes
# ---------------------------------------------------------------------------


def test_num_states_for():
    assert num_states_for(16, 1) == 16
    assert num_states_for(16, -1) == 1
    assert num_states_for(16, 4) == 4
    with pytest.raises(ValueError, match="multiple"):
        num_states_for(16, 3)
    with pytest.raises(ValueError, match="block_size"):
        num_states_for(0, 1)


def test_compute_layer_kv_cache_shape_bytes():
    assert compute_layer_kv_cache_shape_bytes(full(), 10) == (10, 8, 16, 512)
    # kernel blocks of 8 tokens: every page holds two
    assert compute_layer_kv_cache_shape_bytes(full(), 10, block_size=8) == (20, 8, 8, 512)
    mla = MLAAttentionSpec(block_size=16, num_kv_heads=1, head_size=576, dtype="bf16")
    assert compute_layer_kv_cache_shape_bytes(mla, 10) == (10, 1, 16, 1152)
    mamba = MambaSpec(block_size=16, shapes=((4, 8),), dtypes=("float32",))
    assert compute_layer_kv_cache_shape_bytes(mamba, 10) == (10, 1, 1, 128)
    with pytest.raises(ValueError, match="divide"):
        compute_layer_kv_cache_shape_bytes(full(), 10, block_size=5)
    with pytest.raises(ValueError, match="num_blocks"):
        compute_layer_kv_cache_shape_bytes(full(), -1)


# ---------------------------------------------------------------------------
# Views
# ---------------------------------------------------------------------------

torch = pytest.importorskip("torch")

INT16_SPEC = dict(block_size=4, num_kv_heads=3, head_size=2, dtype="int16")  # C = 4 int16 = 8 bytes


def _expected_views(raw, layout, shape5_elems, item_dtype, cell_elems, total_elems):
    """Per-slot [B, H, N, C] tensors, copied out of ``raw`` by plain reshapes.

    Independent of reshape_kv_cache: it builds the physical 5D tensor (with its
    padding) by reshaping and slicing a contiguous buffer, then permutes back.
    """
    typed = raw[: total_elems * item_dtype.itemsize].view(item_dtype)
    order = layout.stride_order
    phys_shape = [shape5_elems[d] for d in order]
    h, n, c = shape5_elems[H], shape5_elems[N], shape5_elems[C]
    if set(order[:2]) == {L, B}:
        # outer two axes (L and B), then one padded cell of H*N*C elements each
        cells = typed.reshape(phys_shape[0], phys_shape[1], cell_elems)[:, :, : h * n * c]
        phys = cells.reshape(phys_shape)
    else:
        outer = phys_shape[0]
        rest = typed.reshape(outer, total_elems // outer)[:, : int(torch.tensor(phys_shape[1:]).prod())]
        phys = rest.reshape(phys_shape)
    inverse = [order.index(d) for d in range(5)]
    logical = phys.permute(*inverse)
    return [logical[i].clone() for i in range(shape5_elems[L])]


def _same_bytes(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Equal shape, dtype and bytes (NaN bit patterns compare equal too)."""
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    return torch.equal(a.contiguous().view(torch.uint8), b.contiguous().view(torch.uint8))


def _fill(num_bytes: int) -> torch.Tensor:
    return (torch.arange(num_bytes, dtype=torch.int64) * 7 % 251 - 125).to(torch.int8)


@pytest.mark.parametrize("layout", list(KVCacheLayout), ids=lambda m: m.name)
@pytest.mark.parametrize("padded", [False, True], ids=["dense", "padded"])
def test_reshape_matches_strided_copy(layout, padded):
    extra = {"page_size_padded": 4 * 3 * 8 + 16} if padded else {}
    spec = FullAttentionSpec(**INT16_SPEC, **extra)
    page = spec.page_size_bytes
    assert page == (4 * 3 * (2 + 2) * 2 + (16 if padded else 0))
    num_blocks, slots = 5, 3
    raw = _fill(slots * num_blocks * page + 10)  # a longer buffer is fine
    views = reshape_kv_cache(raw, spec, num_blocks, slots, layout)
    assert len(views) == slots
    shape5 = (slots, num_blocks, 3, 4, 4)  # C = 4 int16 elements
    expected = _expected_views(raw, layout, shape5, torch.int16, page // 2, slots * num_blocks * page // 2)
    for view, exp in zip(views, expected):
        assert view.shape == (num_blocks, 3, 4, 4)
        assert view.dtype == torch.int16
        assert _same_bytes(view, exp)


@pytest.mark.parametrize("layout", list(KVCacheLayout), ids=lambda m: m.name)
def test_reshape_views_share_memory(layout):
    spec = FullAttentionSpec(**INT16_SPEC)
    raw = torch.zeros(2 * 3 * spec.page_size_bytes, dtype=torch.int8)
    views = reshape_kv_cache(raw, spec, 3, 2, layout)
    views[1][2, 1, 3, 0] = 0x0101  # both bytes 1
    assert int(raw.sum()) == 2
    assert views[0].untyped_storage().data_ptr() == raw.untyped_storage().data_ptr()


def test_reshape_strides_by_hand():
    spec = full()  # bf16, C = 256 elements, H = 8, N = 16
    raw = torch.zeros(2 * 3 * spec.page_size_bytes, dtype=torch.int8)
    views = reshape_kv_cache(raw, spec, 3, 2, KVCacheLayout.LBNHC)
    # LBNHC, in elements: C 1, H 256, N 8*256 = 2048, B 16*2048 = 32768, L 3*32768
    assert views[0].stride() == (32768, 256, 2048, 1)
    assert views[1].storage_offset() == 98304
    assert views[0].dtype == torch.bfloat16
    views = reshape_kv_cache(raw, spec, 3, 2, KVCacheLayout.BHLNC)
    # BHLNC: C 1, N 256, L 16*256 = 4096, H 2*4096 = 8192, B 8*8192 = 65536
    assert views[0].stride() == (65536, 8192, 256, 1)
    assert views[1].storage_offset() == 4096
    # a 70000-byte padded page: a block of one layer is 35000 elements apart, a slot 3 x 35000
    padded = full(page_size_padded=70000)
    raw = torch.zeros(2 * 3 * 70000, dtype=torch.int8)
    views = reshape_kv_cache(raw, padded, 3, 2, KVCacheLayout.LBNHC)
    assert views[0].stride() == (35000, 256, 2048, 1)
    assert views[1].storage_offset() == 105000


def test_reshape_kernel_block_size():
    spec = FullAttentionSpec(**INT16_SPEC)
    raw = _fill(2 * spec.page_size_bytes)
    views = reshape_kv_cache(raw, spec, 2, 1, KVCacheLayout.LBHNC, block_size=2)
    assert views[0].shape == (4, 3, 2, 4)
    # a kernel block is half a page: 3 heads x 2 tokens x 4 elements
    flat = raw.view(torch.int16)
    assert torch.equal(views[0][1].reshape(-1), flat[24:48])


def test_reshape_mamba_is_bytes():
    spec = MambaSpec(block_size=16, shapes=((2, 3),), dtypes=("float32",))
    raw = _fill(4 * 24)
    views = reshape_kv_cache(raw, spec, 2, 2, KVCacheLayout.LBHNC)
    assert views[1].shape == (2, 1, 1, 24) and views[1].dtype == torch.int8
    assert torch.equal(views[1].reshape(-1), raw[48:96])


def test_reshape_bad_input():
    spec = FullAttentionSpec(**INT16_SPEC)
    page = spec.page_size_bytes
    with pytest.raises(ValueError, match="need"):
        reshape_kv_cache(torch.zeros(page, dtype=torch.int8), spec, 2, 1, KVCacheLayout.LBHNC)
    with pytest.raises(ValueError, match="1-D int8"):
        reshape_kv_cache(torch.zeros(page, dtype=torch.float32), spec, 1, 1, KVCacheLayout.LBHNC)
    with pytest.raises(ValueError, match="1-D int8"):
        reshape_kv_cache(torch.zeros(2, page, dtype=torch.int8), spec, 1, 1, KVCacheLayout.LBHNC)
    with pytest.raises(ValueError, match="num_layer_slots"):
        reshape_kv_cache(torch.zeros(page, dtype=torch.int8), spec, 1, 0, KVCacheLayout.LBHNC)
    with pytest.raises(TypeError, match="layout"):
        reshape_kv_cache(torch.zeros(page, dtype=torch.int8), spec, 1, 1, "LBHNC")


def test_attention_spec_is_base_of_attention_kinds():
    for spec in (full(), swa(), chunked()):
        assert isinstance(spec, AttentionSpec) and isinstance(spec, KVCacheSpec)


from hypothesis import given, settings as hsettings, strategies as st  # noqa: E402


@hsettings(max_examples=40, deadline=None)
@given(
    layout=st.sampled_from(list(KVCacheLayout)),
    block_size=st.sampled_from([1, 2, 4]),
    heads=st.integers(1, 3),
    head_size=st.integers(1, 3),
    num_blocks=st.integers(1, 4),
    slots=st.integers(1, 3),
    pad_elems=st.integers(0, 3),
    dtype=st.sampled_from(["int16", "float32", "int8"]),
)
def test_reshape_matches_strided_copy_property(layout, block_size, heads, head_size, num_blocks, slots, pad_elems,
                                               dtype):
    item = {"int16": 2, "float32": 4, "int8": 1}[dtype]
    real = block_size * heads * 2 * head_size * item
    padded = real + pad_elems * item if pad_elems else None
    spec = FullAttentionSpec(block_size=block_size, num_kv_heads=heads, head_size=head_size, dtype=dtype,
                             page_size_padded=padded)
    page = spec.page_size_bytes
    raw = _fill(slots * num_blocks * page)
    views = reshape_kv_cache(raw, spec, num_blocks, slots, layout)
    torch_dtype = getattr(torch, dtype)
    shape5 = (slots, num_blocks, heads, block_size, 2 * head_size)
    expected = _expected_views(raw, layout, shape5, torch_dtype, page // item, slots * num_blocks * page // item)
    for view, exp in zip(views, expected):
        assert _same_bytes(view, exp)


def test_mamba_checkpoint_helpers_from_kv_cache_interface():
    """vLLM defines them in ``kv_cache_interface``; kvcy serves the selected twin's there
    (values recorded from vLLM 0.33.0)."""
    from kvcy import kv_cache_interface as ki

    position = ki.get_mamba_prefill_checkpoint_position
    assert [position(n, 4, drop, la) for n, drop, la in
            ((17, False, 0), (17, False, 2), (17, True, 0), (16, False, 0), (3, False, 0), (16, True, 5))] == \
        [16, 12, 12, 12, 0, 12]
    valid = ki.is_mamba_prefill_checkpoint_valid
    assert [valid(*a) for a in ((0, 16, 8, 4, 8, None), (0, 16, 8, 4, 8, 4), (4, 16, 8, 4, 8, 4), (8, 24, 20, 4, 8, 4),
                                (8, 24, 20, 4, 8, 8), (0, 17, 12, 4, 4, 2))] == [False, True, False, True, False, True]
    with pytest.raises(AttributeError):
        ki.no_such_name  # noqa: B018
