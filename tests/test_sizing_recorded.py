"""kvcy's sizing against KV-cache configs recorded from vLLM 0.33.0 (no vLLM needed).

Each case below was planned by vLLM 0.33.0's ``get_global_kv_cache_groups`` +
``get_kv_cache_configs`` (one worker, the layout given) and its result written
down: the block count, every tensor's ``(size, layers, layer_stride,
block_stride, offset)`` and every group's layers and block size.  kvcy must
give exactly the same.  (tests/vllm_live/test_sizing_vllm_differential.py does the same
against live vLLM for a larger table.)  The views test checks that
:func:`kvcy.kv_cache_views.create_kv_cache_views` over a planned config puts
every layer's page of every block where the tensor's strides say.
"""

from __future__ import annotations

import pytest

from kvcy.config import CacheConfig, KVCacheSettings
from kvcy.kv_cache_interface import (
    ChunkedLocalAttentionSpec,
    CrossAttentionSpec,
    FullAttentionSpec,
    KVCacheLayout,
    KVCacheTensor,
    MambaSpec,
    MLAAttentionSpec,
    MultipleOf,
    SlidingWindowSpec,
    UniformTypeKVCacheSpecs,
)
from kvcy.kv_cache_sizing import get_global_kv_cache_groups, get_kv_cache_config, get_kv_cache_configs
from kvcy.kv_cache_views import compute_layout_strides, create_kv_cache_views

# Small attention layers: 16 tokens x 2 heads x (64 + 64) x 2 bytes = an 8 KiB page.
ATTN = {"block_size": 16, "num_kv_heads": 2, "head_size": 64, "dtype": "float16"}
SPEC_KINDS = {
    "full": FullAttentionSpec,
    "swa": SlidingWindowSpec,
    "chunked": ChunkedLocalAttentionSpec,
    "mla": MLAAttentionSpec,
    "cross": CrossAttentionSpec,
    "mamba": MambaSpec,
}


def layer(kind: str, **kw):
    """(kind, keyword arguments): one layer's spec as data, so the recorder can build vLLM's too."""
    base = {} if kind == "mamba" else dict(ATTN)
    if kind == "mla":
        base.update(num_kv_heads=1, head_size=72)  # 16 x 72 x 2 = 2304-byte page
    return kind, {**base, **kw}


def build(kind_and_args):
    kind, args = kind_and_args
    if kind == "mamba":
        args = {"block_size": 16, **args}
    if args.get("block_stride_alignment") == "kernel16":
        args = {**args, "block_stride_alignment": MultipleOf(16)}
    return SPEC_KINDS[kind](**args)


def sw_full(n, window=64):
    return {f"layers.{i}": (layer("full") if i % 3 == 2 else layer("swa", sliding_window=window)) for i in range(n)}


# name -> (layers, layout, memory, settings)
CASES = {
    "hybrid-LBNHC": (sw_full(6), "LBNHC", 1_000_003, {"max_model_len": 256, "max_num_batched_tokens": 64}),
    "hybrid-BLHNC": (sw_full(6), "BLHNC", 1_000_003, {"max_model_len": 256, "max_num_batched_tokens": 64}),
    "hybrid-LHBNC": (sw_full(6), "LHBNC", 1_000_003, {"max_model_len": 256, "max_num_batched_tokens": 64}),
    "padded-7-sw-2-full": (
        {**{f"sw.{i}": layer("swa", sliding_window=32) for i in range(7)},
         **{f"full.{i}": layer("full") for i in range(2)}},
        "LBNHC",
        900_000,
        {"max_model_len": 128, "max_num_batched_tokens": 32},
    ),
    "two-shapes-LBNHC": (
        {"a": layer("full"), "b": layer("full", num_kv_heads=1)}, "LBNHC", 500_000, {"max_model_len": 64}),
    "two-shapes-BLNHC": (
        {"a": layer("full"), "b": layer("full", num_kv_heads=1)}, "BLNHC", 500_000, {"max_model_len": 64}),
    "grown-block": (
        {"full.0": layer("full"), "sw.0": layer("swa", sliding_window=32, num_kv_heads=1)},
        "LBNHC", 300_000, {"max_model_len": 128}),
    "padded-page": (
        {"full.0": layer("full", num_kv_heads=3), "sw.0": layer("swa", sliding_window=32)},
        "LBNHC", 400_000, {"max_model_len": 128}),
    "mamba-LBNHC": (
        {**{f"attn.{i}": layer("full") for i in range(2)},
         **{f"mamba.{i}": layer("mamba", shapes=((1000,),), dtypes=("float32",)) for i in range(4)}},
        "LBNHC", 700_000, {"max_model_len": 128}),
    "mamba-BLNHC": (
        {**{f"attn.{i}": layer("full") for i in range(2)},
         **{f"mamba.{i}": layer("mamba", shapes=((1000,),), dtypes=("float32",)) for i in range(4)}},
        "BLNHC", 700_000, {"max_model_len": 128}),
    "chunked-disabled-hybrid": (
        {f"layers.{i}": (layer("full") if i % 2 else layer("chunked", attention_chunk_size=64)) for i in range(4)},
        "LBNHC", 600_000, {"max_model_len": 256, "disable_hybrid_kv_cache_manager": True}),
    "mla-swa-fallback": (
        {"mla.0": layer("mla"), "mla.1": layer("mla"), "sw.0": layer("swa", sliding_window=32, num_kv_heads=3)},
        "LBNHC", 400_000, {"max_model_len": 128}),
    "cross-attention": (
        {**{f"self.{i}": layer("full") for i in range(2)}, **{f"cross.{i}": layer("cross") for i in range(2)}},
        "LBNHC", 800_000, {"max_model_len": 128, "max_num_encoder_input_tokens": 100}),
    "aligned-LBNHC": (
        {f"layers.{i}": layer("full", block_stride_alignment=12288) for i in range(2)},
        "LBNHC", 500_000, {"max_model_len": 128}),
    "aligned-BLHNC": (
        {f"layers.{i}": layer("full", block_stride_alignment=12288) for i in range(2)},
        "BLHNC", 500_000, {"max_model_len": 128}),
    "kernel-blocks-BLNHC": (
        {f"layers.{i}": layer("full", block_size=64, block_stride_alignment="kernel16") for i in range(2)}
        | {"sw.0": layer("swa", block_size=64, sliding_window=64, block_stride_alignment="kernel16")},
        "BLNHC", 2_000_000, {"max_model_len": 256}),
    "override": ({f"layers.{i}": layer("full") for i in range(3)}, "LBNHC", 10**9,
                 {"max_model_len": 512, "num_gpu_blocks_override": 40}),
}

# Recorded from vLLM 0.33.0: num_blocks, tensors (size, layers, layer_stride, block_stride, offset)
# and groups (layers, block size).
RECORDED = {
    'aligned-BLHNC': (20, [(491520, ['layers.0', 'layers.1'], 8192, 24576, 0)], [(['layers.0', 'layers.1'], 16)]),
    'aligned-LBNHC': (20, [(491520, ['layers.0', 'layers.1'], 245760, 12288, 0)], [(['layers.0', 'layers.1'], 16)]),
    'chunked-disabled-hybrid': (18, [(589824, ['layers.0', 'layers.1', 'layers.2', 'layers.3'], 147456, 8192, 0)], [(['layers.0', 'layers.1', 'layers.2', 'layers.3'], 16)]),
    'cross-attention': (48, [(786432, ['self.0', 'self.1'], 393216, 8192, 0), (786432, ['cross.0', 'cross.1'], 393216, 8192, 0)], [(['self.0', 'self.1'], 16), (['cross.0', 'cross.1'], 16)]),
    'grown-block': (36, [(294912, ['full.0'], 294912, 8192, 0), (294912, ['sw.0'], 294912, 8192, 0)], [(['full.0'], 16), (['sw.0'], 32)]),
    'hybrid-BLHNC': (61, [(999424, ['layers.0', 'layers.3'], 8192, 16384, 0), (999424, ['layers.1', 'layers.4'], 8192, 16384, 0), (999424, ['layers.2', 'layers.5'], 8192, 16384, 0)], [(['layers.0', 'layers.3'], 16), (['layers.1', 'layers.4'], 16), (['layers.2', 'layers.5'], 16)]),
    'hybrid-LBNHC': (61, [(999424, ['layers.0', 'layers.3'], 499712, 8192, 0), (999424, ['layers.1', 'layers.4'], 499712, 8192, 0), (999424, ['layers.2', 'layers.5'], 499712, 8192, 0)], [(['layers.0', 'layers.3'], 16), (['layers.1', 'layers.4'], 16), (['layers.2', 'layers.5'], 16)]),
    'hybrid-LHBNC': (61, [(999424, ['layers.0', 'layers.3'], 499712, 4096, 0), (999424, ['layers.1', 'layers.4'], 499712, 4096, 0), (999424, ['layers.2', 'layers.5'], 499712, 4096, 0)], [(['layers.0', 'layers.3'], 16), (['layers.1', 'layers.4'], 16), (['layers.2', 'layers.5'], 16)]),
    'kernel-blocks-BLNHC': (61, [(1998848, ['layers.0'], 32768, 32768, 0), (1998848, ['layers.1'], 32768, 32768, 0), (1998848, ['sw.0'], 32768, 32768, 0)], [(['layers.0'], 64), (['layers.1'], 64), (['sw.0'], 64)]),
    'mamba-BLNHC': (42, [(688128, ['attn.0', 'attn.1'], 8192, 16384, 0), (688128, ['mamba.0', 'mamba.1', 'mamba.2', 'mamba.3'], 4000, 16384, 0)], [(['attn.0', 'attn.1'], 16), (['mamba.0', 'mamba.1', 'mamba.2', 'mamba.3'], 16)]),
    'mamba-LBNHC': (42, [(688128, ['attn.0', 'attn.1'], 344064, 8192, 0), (688128, ['mamba.0', 'mamba.2'], 344064, 8192, 0), (688128, ['mamba.1', 'mamba.3'], 344064, 8192, 0)], [(['attn.0', 'attn.1'], 16), (['mamba.0', 'mamba.2'], 16), (['mamba.1', 'mamba.3'], 16)]),
    'mla-swa-fallback': (23, [(388608, ['mla.0', 'mla.1'], 52992, 2304, 0), (388608, ['sw.0'], 282624, 12288, 105984)], [(['mla.0', 'mla.1', 'sw.0'], 16)]),
    'override': (40, [(983040, ['layers.0', 'layers.1', 'layers.2'], 327680, 8192, 0)], [(['layers.0', 'layers.1', 'layers.2'], 16)]),
    'padded-7-sw-2-full': (54, [(884736, ['sw.0', 'sw.4'], 442368, 8192, 0), (884736, ['sw.1', 'sw.5'], 442368, 8192, 0), (884736, ['sw.2', 'sw.6'], 442368, 8192, 0), (884736, ['sw.3'], 442368, 8192, 0), (884736, ['full.0', 'full.1'], 442368, 8192, 0)], [(['sw.0', 'sw.4'], 16), (['sw.1', 'sw.5'], 16), (['sw.2', 'sw.6'], 16), (['sw.3'], 16), (['full.0', 'full.1'], 16)]),
    'padded-page': (32, [(393216, ['full.0'], 393216, 12288, 0), (393216, ['sw.0'], 393216, 12288, 0)], [(['full.0'], 16), (['sw.0'], 16)]),
    'two-shapes-BLNHC': (40, [(491520, ['a'], 8192, 12288, 0), (491520, ['b'], 4096, 12288, 8192)], [(['a', 'b'], 16)]),
    'two-shapes-LBNHC': (40, [(491520, ['a'], 327680, 8192, 0), (491520, ['b'], 163840, 4096, 327680)], [(['a', 'b'], 16)]),
}


def settings_for(layout, extra):
    extra = dict(extra)
    cache = CacheConfig(block_size=16, kv_cache_layout=layout,
                        num_gpu_blocks_override=extra.pop("num_gpu_blocks_override", None))
    return KVCacheSettings(cache_config=cache, **extra)


def plan(name):
    layers, layout, memory, extra = CASES[name]
    specs = {n: build(k) for n, k in layers.items()}
    settings = settings_for(layout, extra)
    groups = get_global_kv_cache_groups(settings, [dict(specs)])
    return get_kv_cache_configs(settings, [dict(specs)], [memory], groups)[0]


def summary(cfg):
    return (
        cfg.num_blocks,
        [(t.size, list(t.layers), t.layer_stride, t.block_stride, t.offset) for t in cfg.kv_cache_tensors],
        [(list(g.layer_names), g.kv_cache_spec.block_size) for g in cfg.kv_cache_groups],
    )


@pytest.mark.parametrize("name", sorted(CASES))
def test_sizing_matches_what_vllm_recorded(name):
    assert summary(plan(name)) == RECORDED[name]


def test_every_case_is_recorded():
    assert sorted(RECORDED) == sorted(CASES)


def _layer_spec(cfg, name):
    for group in cfg.kv_cache_groups:
        if name in group.layer_names:
            spec = group.kv_cache_spec
            return spec.kv_cache_specs[name] if isinstance(spec, UniformTypeKVCacheSpecs) else spec
    raise KeyError(name)


@pytest.mark.parametrize("name", sorted(CASES))
def test_views_round_trip_through_the_strides(name):
    """Every layer's view of every block starts at ``offset + l * layer_stride + b * block_stride``
    and, where a page is one run of bytes, stays inside that page; a write through it lands there."""
    torch = pytest.importorskip("torch")
    cfg = plan(name)
    layout = KVCacheLayout[CASES[name][1]]
    raw = torch.zeros(cfg.kv_cache_tensors[0].size, dtype=torch.uint8)
    base = raw.untyped_storage().data_ptr()
    checked = 0
    for tensor in cfg.kv_cache_tensors:
        spec = _layer_spec(cfg, tensor.layers[0])
        views = create_kv_cache_views(raw, spec, cfg.num_blocks, layout, tensor)
        assert len(views) == len(tensor.layers)
        for l, view in enumerate(views):
            assert view.shape[0] == cfg.num_blocks
            for b in sorted({*range(0, cfg.num_blocks, 5), cfg.num_blocks - 1}):
                start = tensor.page_offset(l, b)
                cell = view[b]
                first = cell.data_ptr() - base
                extent = sum((n - 1) * st for n, st in zip(cell.shape, cell.stride())) + 1
                last = first + extent * cell.element_size() - 1
                assert first == start, (l, b)
                if layout.is_block_compact:  # a page is one run of bytes: the cell stays inside it
                    assert last < start + spec.page_size_bytes <= tensor.size, (l, b)
                checked += 1
            block = cfg.num_blocks - 1
            view[block].fill_(7)
            start = tensor.page_offset(l, block)
            assert raw[start:start + spec.page_size_bytes].any()
            view[block].zero_()
    assert not raw.any()
    blocks_checked = len({*range(0, cfg.num_blocks, 5), cfg.num_blocks - 1})
    assert checked == blocks_checked * sum(len(g.layer_names) for g in cfg.kv_cache_groups)


def test_views_write_the_bytes_the_strides_name():
    """A full write through one layer's view lands exactly in that layer's pages, in every layout."""
    torch = pytest.importorskip("torch")
    spec = FullAttentionSpec(**ATTN)
    for layout in KVCacheLayout:
        settings = settings_for(layout.name, {"max_model_len": 32})
        cfg = get_kv_cache_config(settings, {"a": spec, "b": spec, "c": spec}, 3 * 8192 * 6)
        (tensor,) = cfg.kv_cache_tensors
        raw = torch.zeros(tensor.size, dtype=torch.int8)
        views = create_kv_cache_views(raw, spec, cfg.num_blocks, layout, tensor)
        assert [tuple(v.shape) for v in views] == [(6, 2, 16, 128)] * 3 and views[0].dtype == torch.float16
        views[1].fill_(1.0)  # 0x3C00
        touched = (raw != 0).nonzero().flatten()
        assert len(touched) == 6 * 8192 // 2  # the high byte of every fp16 of layer "b"'s 6 pages
        if layout.is_block_compact:
            pages = {tensor.page_offset(1, b) for b in range(6)}
            assert {int(i) // 8192 * 8192 for i in touched} == pages, layout
        views[1].zero_()
        assert not raw.any()


def test_views_refuse_bad_input():
    torch = pytest.importorskip("torch")
    spec = FullAttentionSpec(**ATTN)
    tensor = KVCacheTensor(size=8192 * 4, layers=["a"], layer_stride=8192 * 4, block_stride=8192)
    layout = KVCacheLayout.LBNHC
    with pytest.raises(ValueError, match="1-D int8 or uint8"):
        create_kv_cache_views(torch.zeros(10, dtype=torch.float32), spec, 4, layout, tensor)
    with pytest.raises(ValueError, match="reach byte"):
        create_kv_cache_views(torch.zeros(8192 * 3, dtype=torch.int8), spec, 4, layout, tensor)
    with pytest.raises(ValueError, match="shared_by form"):
        create_kv_cache_views(torch.zeros(8192 * 4, dtype=torch.int8), spec, 4, layout,
                              KVCacheTensor(size=8192 * 4, shared_by=[["a"]]))
    with pytest.raises(ValueError, match="dense, unpadded pages"):
        padded = KVCacheTensor(size=8192 * 8, layers=["a"], layer_stride=8192 * 8, block_stride=16384)
        create_kv_cache_views(torch.zeros(8192 * 8, dtype=torch.int8), spec, 4, layout, padded, kernel_block_size=8)
    with pytest.raises(AssertionError, match="fixed_strides"):
        compute_layout_strides(spec, 4, 1, layout, fixed_strides=(None, None))
    with pytest.raises(AssertionError, match="positive"):
        compute_layout_strides(spec, 4, 1, layout, fixed_strides=(0, None, None, None, None))
    # kernel blocks of 8 tokens: twice the blocks, half the block stride
    views = create_kv_cache_views(torch.zeros(8192 * 4, dtype=torch.int8), spec, 4, layout, tensor,
                                  kernel_block_size=8)
    assert tuple(views[0].shape) == (8, 2, 8, 128)
