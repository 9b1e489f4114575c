"""kvcy's sizing against live vLLM 0.33.0's planner.

For each model in a table (full attention, sliding window, chunked local, MLA,
Mamba, cross attention, hybrids, one type with several shapes, memory budgets
that leave odd block counts, ``num_gpu_blocks_override``) and each physical
layout, vLLM's ``get_global_kv_cache_groups`` + ``get_kv_cache_configs`` and
kvcy's functions of the same names must give the same ``KVCacheConfig``:
block count, every field of every tensor, and the groups.  The views built
from the config must index the same bytes as vLLM's ``create_kv_cache_views``.

Skipped without vLLM; run it with the vLLM venv (see docs/vllm-dropin-gaps.md).
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest

import vllm  # noqa: E402
torch = pytest.importorskip("torch")

from vllm.v1 import kv_cache_interface as V  # noqa: E402
from vllm.v1.core import kv_cache_planning as P  # noqa: E402

from kvcy import kv_cache_interface as K  # noqa: E402
from kvcy import kv_cache_sizing as S  # noqa: E402
from kvcy.config import CacheConfig, KVCacheSettings  # noqa: E402
from kvcy.kv_cache_views import compute_layout_strides, create_kv_cache_views  # noqa: E402
from kvcy.vllm import convert_kv_cache_config, convert_kv_cache_spec  # noqa: E402

GiB = 1 << 30
LAYOUTS = ["LBNHC", "LBHNC", "LHBNC", "BLNHC", "BLHNC", "BHLNC"]


def vllm_config(layout, max_model_len, override=None, disable_hybrid=False, batched=2048, encoder=1500):
    """The parts of a ``VllmConfig`` vLLM's planner reads (one worker, no TP/PP/DCP, no spec decode)."""
    cache = SimpleNamespace(
        num_gpu_blocks_override=override,
        prefix_cache_retention_interval=None,
        kv_cache_layout=layout,
        mamba_cache_mode="none",
        get_resolved_kv_cache_layout=lambda: V.KVCacheLayout[layout],
    )
    return SimpleNamespace(
        cache_config=cache,
        attention_config=SimpleNamespace(hisparse_config=None),
        scheduler_config=SimpleNamespace(
            disable_hybrid_kv_cache_manager=disable_hybrid,
            max_num_batched_tokens=batched,
            max_num_encoder_input_tokens=encoder,
        ),
        model_config=SimpleNamespace(
            max_model_len=max_model_len, original_max_model_len=max_model_len, supports_kv_cache_grouping=False
        ),
        parallel_config=SimpleNamespace(
            tensor_parallel_size=1, decode_context_parallel_size=1, prefill_context_parallel_size=1
        ),
        speculative_config=None,
        num_prefill_lookahead_tokens=0,
        max_in_flight_tokens=batched,  # one batch in flight: what kvcy's max_num_batched_tokens bounds
    )


def kvcy_settings(layout, max_model_len, override=None, disable_hybrid=False, batched=2048, encoder=1500):
    return KVCacheSettings(
        cache_config=CacheConfig(block_size=16, num_gpu_blocks_override=override, kv_cache_layout=layout),
        max_model_len=max_model_len,
        disable_hybrid_kv_cache_manager=disable_hybrid,
        max_num_batched_tokens=batched,
        max_num_encoder_input_tokens=encoder,
    )


BF16 = torch.bfloat16


def full(**kw):
    return V.FullAttentionSpec(**{"block_size": 16, "num_kv_heads": 8, "head_size": 128, "dtype": BF16, **kw})


def swa(window, **kw):
    return V.SlidingWindowSpec(
        **{"block_size": 16, "num_kv_heads": 8, "head_size": 128, "dtype": BF16, "sliding_window": window, **kw}
    )


def chunked(chunk, **kw):
    return V.ChunkedLocalAttentionSpec(
        **{"block_size": 16, "num_kv_heads": 8, "head_size": 128, "dtype": BF16, "attention_chunk_size": chunk, **kw}
    )


def mla(**kw):
    return V.MLAAttentionSpec(**{"block_size": 16, "num_kv_heads": 1, "head_size": 576, "dtype": BF16, **kw})


def cross(**kw):
    return V.CrossAttentionSpec(**{"block_size": 16, "num_kv_heads": 8, "head_size": 128, "dtype": BF16, **kw})


def mamba(shapes=((256,), (1024,)), **kw):
    return V.MambaSpec(**{"block_size": 16, "shapes": shapes, "dtypes": (BF16,) * len(shapes), **kw})


def pattern(n, every, other, base):
    """``n`` layers, layer ``i`` being ``other`` when ``i % every == every - 1``."""
    return {f"layers.{i}": (other if i % every == every - 1 else base) for i in range(n)}


# name -> (specs, memory, max_model_len, extra settings)
MODELS = {
    "llama-uniform": ({f"layers.{i}": full() for i in range(32)}, 20 * GiB + 12345, 8192, {}),
    "uniform-override": ({f"layers.{i}": full() for i in range(4)}, 10 * GiB, 8192, {"override": 600}),
    "override-too-small": ({f"layers.{i}": full() for i in range(4)}, 10 * GiB, 8192, {"override": 123}),
    "gemma-sw-full-1to2": (pattern(30, 3, full(), swa(1024)), 3 * GiB + 777, 8192, {}),
    "sw-full-padded-10-25": (
        {**{f"full.{i}": full() for i in range(10)}, **{f"sw.{i}": swa(128) for i in range(25)}},
        10 * 65536 * 1000 + 99,
        1024,
        {"batched": 256},
    ),
    "gpt-oss-12-13": (
        {**{f"sw.{i}": swa(128) for i in range(12)}, **{f"full.{i}": full() for i in range(13)}},
        GiB,
        4096,
        {},
    ),
    "llama4-chunked": (pattern(48, 4, full(), chunked(8192)), 16 * GiB, 32768, {}),
    "page-grown-block": ({"full.0": full(), "sw.0": swa(128, num_kv_heads=4)}, 300 * 65536 + 5, 2048, {}),
    "page-padded-swa": ({"full.0": full(), "sw.0": swa(128, num_kv_heads=3)}, 300 * 65536 + 5, 2048, {}),
    "one-type-two-shapes": ({"a": full(), "b": full(num_kv_heads=4)}, 100 * (65536 + 32768) + 1, 160, {}),
    "deepseek-mla": ({f"layers.{i}": mla() for i in range(61)}, 20 * GiB, 163840, {}),
    "mla-two-shapes": ({"a": mla(), "b": mla(head_size=512)}, 2 * GiB, 8192, {}),
    "mamba-hybrid": (
        {**{f"attn.{i}": full(num_kv_heads=1, head_size=16, dtype=torch.float32) for i in range(2)},
         **{f"mamba.{i}": mamba(shapes=((512,),), dtypes=(torch.float32,)) for i in range(6)}},
        2 * 2048 * 50 + 3,
        160,
        {},
    ),
    "mamba-padded": (
        {**{f"attn.{i}": full() for i in range(4)}, **{f"mamba.{i}": mamba() for i in range(12)}},
        GiB,
        4096,
        {},
    ),
    "mamba-two-shapes": (
        {**{f"attn.{i}": full() for i in range(2)},
         **{f"mamba.{i}": mamba(shapes=((256,), (1024 * (1 + i % 2),))) for i in range(4)}},
        GiB // 4,
        2048,
        {},
    ),
    "whisper-cross": (
        {**{f"dec.{i}.self": full() for i in range(4)}, **{f"dec.{i}.cross": cross() for i in range(4)}},
        GiB // 2,
        448,
        {},
    ),
    "disabled-hybrid": (pattern(30, 3, full(), swa(1024)), 3 * GiB, 8192, {"disable_hybrid": True}),
    "disabled-hybrid-chunked": (pattern(8, 4, full(), chunked(4096)), GiB, 8192, {"disable_hybrid": True}),
    "mla-with-swa-fallback": (
        {**{f"mla.{i}": mla() for i in range(3)}, **{f"sw.{i}": swa(128, num_kv_heads=3) for i in range(3)}},
        GiB,
        4096,
        {},
    ),
    "aligned-blocks": (
        {f"layers.{i}": full(block_stride_alignment=4096 * 3) for i in range(3)},
        64 * 1024 * 1024,
        2048,
        {},
    ),
    "aligned-kernel-blocks": (
        {f"layers.{i}": full(block_size=64, block_stride_alignment=V_MultipleOf(16)) for i in range(2)}
        if (V_MultipleOf := __import__("vllm.v1.attention.backend", fromlist=["MultipleOf"]).MultipleOf)
        else {},
        32 * 1024 * 1024,
        2048,
        {},
    ),
    "sliding-window-mla": (
        {"m.0": mla(), "m.1": mla(),
         "s.0": V.SlidingWindowMLASpec(block_size=16, num_kv_heads=1, head_size=576, dtype=BF16, sliding_window=128)},
        GiB // 8,
        1024,
        {},
    ),
    "hidden-state": (
        {"f.0": full(), "s.0": swa(64),
         "h.0": V.HiddenStateCacheSpec(block_size=16, num_kv_heads=1, head_size=4096, dtype=BF16)},
        GiB // 8,
        1024,
        {},
    ),
    "sink-full-and-swa": (
        {"a": V.SinkFullAttentionSpec(block_size=16, num_kv_heads=8, head_size=128, dtype=BF16, sink_len=4),
         "s": swa(64)},
        GiB // 8,
        1024,
        {},
    ),
    "two-windows": ({"a": swa(64), "b": swa(128), "c": full()}, GiB // 8 + 1, 1024, {}),
    "disabled-hybrid-block-sizes": (
        {"a": full(block_size=32), "b": swa(64)}, GiB // 8, 1024, {"disable_hybrid": True}),
    "attention-free": ({}, 0, 2048, {}),
    # R-SWA groups with full attention; a circular buffer (a state-like bucket, one
    # block per request) beside full and sliding-window layers; bounded-replay sliding-window MLA
    "rswa-with-full": (
        {**{f"f.{i}": full() for i in range(2)},
         **{f"r.{i}": V.RSWASpec(block_size=16, num_kv_heads=8, head_size=128, dtype=BF16, rswa_window=256)
            for i in range(2)}},
        GiB // 8 + 3,
        2048,
        {},
    ),
    "ring-with-full-and-swa": (
        {**{f"f.{i}": full() for i in range(2)}, **{f"s.{i}": swa(128) for i in range(2)},
         **{f"c.{i}": V.CircularBufferSpec(block_size=16, num_kv_heads=2, head_size=128, dtype=BF16)
            for i in range(12)}},
        GiB // 8 + 5,
        2048,
        {},
    ),
    "rswa-disabled-hybrid": (
        {"f.0": full(), "s.0": swa(128),
         "r.0": V.RSWASpec(block_size=16, num_kv_heads=8, head_size=128, dtype=BF16, rswa_window=64)},
        GiB // 8,
        2048,
        {"disable_hybrid": True},
    ),
    "bounded-replay-swa-mla": (
        {"m.0": mla(), "m.1": mla(),
         "s.0": V.SlidingWindowMLASpec(block_size=16, num_kv_heads=1, head_size=576, dtype=BF16, sliding_window=128,
                                       bounded_replay=True)},
        GiB // 8,
        1024,
        {},
    ),
}


def _plan_vllm(specs, memory, max_len, layout, extra):
    cfg = vllm_config(layout, max_len, **extra)
    groups = P.get_global_kv_cache_groups(cfg, [dict(specs)])
    return P.get_kv_cache_configs(cfg, [dict(specs)], [memory], groups)[0]


def _plan_kvcy(specs, memory, max_len, layout, extra):
    settings = kvcy_settings(layout, max_len, **extra)
    kspecs = {name: convert_kv_cache_spec(spec) for name, spec in specs.items()}
    groups = S.get_global_kv_cache_groups(settings, [dict(kspecs)])
    return S.get_kv_cache_configs(settings, [dict(kspecs)], [memory], groups)[0]


def _outcome(plan, *args):
    try:
        return plan(*args), None
    except (ValueError, AssertionError, NotImplementedError) as exc:
        return None, exc


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("model", sorted(MODELS))
def test_kv_cache_config_matches_vllm(model, layout):
    specs, memory, max_len, extra = MODELS[model]
    expected, vllm_error = _outcome(_plan_vllm, specs, memory, max_len, layout, extra)
    got, kvcy_error = _outcome(_plan_kvcy, specs, memory, max_len, layout, extra)
    if vllm_error is not None:
        # vLLM refuses this model in this layout: kvcy refuses it with the same exception type
        assert isinstance(kvcy_error, type(vllm_error)), (vllm_error, kvcy_error)
        return
    assert kvcy_error is None, kvcy_error
    expected = convert_kv_cache_config(expected)
    assert got.num_blocks == expected.num_blocks
    assert [vars(t) for t in got.kv_cache_tensors] == [vars(t) for t in expected.kv_cache_tensors]
    assert got.kv_cache_groups == expected.kv_cache_groups
    assert got == expected


def test_the_table_covers_non_trivial_block_counts_and_every_kind():
    """The table is not degenerate: budgets leave remainders, and every spec kind and layout is planned."""
    kinds = set()
    for model, (specs, memory, max_len, extra) in MODELS.items():
        if model == "override-too-small":
            continue
        cfg = _plan_vllm(specs, memory, max_len, "LBNHC", extra)
        kinds.update(type(g.kv_cache_spec).__name__ for g in cfg.kv_cache_groups)
        if model == "gemma-sw-full-1to2":
            # 3 GiB + 777 bytes over 10 layers of 64 KiB pages: a remainder is left over
            assert cfg.num_blocks == 4915 and memory % (10 * 65536)
    assert {"FullAttentionSpec", "SlidingWindowSpec", "ChunkedLocalAttentionSpec", "MLAAttentionSpec",
            "MambaSpec", "CrossAttentionSpec", "UniformTypeKVCacheSpecs"} <= kinds


@pytest.mark.parametrize("max_len", [416, 400])
def test_memory_check_matches_vllm(max_len):
    """A budget one block short: both refuse (null block held back) or both plan, the same way."""
    specs = {"full": full(), "sw.0": swa(64), "sw.1": swa(64)}
    extra = {"batched": 32}
    expected, vllm_error = _outcome(_plan_vllm, specs, 40 * 65536, max_len, "LBNHC", extra)
    got, kvcy_error = _outcome(_plan_kvcy, specs, 40 * 65536, max_len, "LBNHC", extra)
    assert (vllm_error is None) == (kvcy_error is None) and (max_len == 400) == (kvcy_error is None)
    if kvcy_error is not None:
        assert "estimated maximum model length is 400" in str(kvcy_error)
        assert "estimated maximum model length is 400" in str(vllm_error)
    else:
        assert got == convert_kv_cache_config(expected)


def test_pipeline_parallel_workers_match_vllm():
    """Two workers holding halves of a hybrid model, with different memory: re-planned to the smaller count."""
    model = pattern(12, 3, full(), swa(256))
    names = list(model)
    workers = [{n: model[n] for n in names[:6]}, {n: model[n] for n in names[6:]}]
    memory = [GiB, GiB // 3]
    cfg = vllm_config("LBNHC", 4096)
    expected = P.get_kv_cache_configs(cfg, workers, memory, P.get_global_kv_cache_groups(cfg, workers))
    settings = kvcy_settings("LBNHC", 4096)
    kworkers = [{n: convert_kv_cache_spec(s) for n, s in w.items()} for w in workers]
    got = S.get_kv_cache_configs(settings, kworkers, memory, S.get_global_kv_cache_groups(settings, kworkers))
    assert got == [convert_kv_cache_config(c) for c in expected]
    assert got[0].num_blocks == got[1].num_blocks


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize(
    "model", ["gemma-sw-full-1to2", "one-type-two-shapes", "mamba-hybrid", "page-padded-swa", "aligned-blocks"]
)
def test_views_index_the_same_bytes_as_vllms(model, layout):
    """kvcy's and vLLM's create_kv_cache_views over one buffer: same shapes, strides, offsets and dtypes."""
    specs, _, _, extra = MODELS[model]
    # a small pool (about 50 blocks) so that the buffer is small
    memory = 50 * sum(spec.page_size_bytes for spec in specs.values()) + 7
    expected, vllm_error = _outcome(_plan_vllm, specs, memory, 64, layout, extra)
    got, kvcy_error = _outcome(_plan_kvcy, specs, memory, 64, layout, extra)
    if vllm_error is not None:
        assert isinstance(kvcy_error, type(vllm_error)), (vllm_error, kvcy_error)
        return
    raw = torch.zeros(got.kv_cache_tensors[0].size, dtype=torch.int8)
    vlayout = V.KVCacheLayout[layout]
    klayout = K.KVCacheLayout[layout]
    vspecs = {}
    for group in expected.kv_cache_groups:
        for name in group.layer_names:
            spec = group.kv_cache_spec
            vspecs[name] = spec.kv_cache_specs[name] if isinstance(spec, V.UniformTypeKVCacheSpecs) else spec
    checked = 0
    for vt, kt in zip(expected.kv_cache_tensors, got.kv_cache_tensors):
        vspec = vspecs[vt.layers[0]]
        kspec = S._layer_spec(next(g for g in got.kv_cache_groups if kt.layers[0] in g.layer_names), kt.layers[0])
        vviews = V.create_kv_cache_views(raw, vspec, expected.num_blocks, vlayout, vt)
        kviews = create_kv_cache_views(raw, kspec, got.num_blocks, klayout, kt)
        assert compute_layout_strides(kspec, got.num_blocks, len(kt.layers), klayout) == V.compute_layout_strides(
            vspec, expected.num_blocks, len(vt.layers), vlayout
        )
        for a, b in zip(vviews, kviews):
            assert (a.shape, a.stride(), a.storage_offset(), a.dtype) == (b.shape, b.stride(), b.storage_offset(),
                                                                          b.dtype)
            checked += 1
    assert checked == sum(len(g.layer_names) for g in got.kv_cache_groups)


@pytest.mark.parametrize("model", ["gemma-sw-full-1to2", "disabled-hybrid", "mamba-padded", "one-type-two-shapes"])
def test_single_worker_entry_point_is_the_engine_cores_plan(model):
    """kvcy's get_kv_cache_config = what vLLM's engine core ends with for one worker (layout name recorded)."""
    specs, memory, max_len, extra = MODELS[model]
    expected = _plan_vllm(specs, memory, max_len, "BLHNC", extra)
    expected.kv_cache_layout = "BLHNC"  # what EngineCore writes into every worker's config
    settings = kvcy_settings("BLHNC", max_len, **extra)
    kspecs = {name: convert_kv_cache_spec(spec) for name, spec in specs.items()}
    assert S.get_kv_cache_config(settings, kspecs, memory) == convert_kv_cache_config(expected)


from hypothesis import HealthCheck, given, settings, strategies as st  # noqa: E402

_LAYER_KINDS = st.sampled_from(["full", "full-small", "swa", "swa-wide", "chunked", "mla", "mamba"])


def _random_layer(kind, block_size):
    if kind == "full":
        return full(block_size=block_size)
    if kind == "full-small":
        return full(block_size=block_size, num_kv_heads=2)
    if kind == "swa":
        return swa(64, block_size=block_size)
    if kind == "swa-wide":
        return swa(512, block_size=block_size, num_kv_heads=4)
    if kind == "chunked":
        return chunked(256, block_size=block_size)
    if kind == "mla":
        return mla(block_size=block_size)
    return mamba(block_size=block_size)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    kinds=st.lists(_LAYER_KINDS, min_size=1, max_size=9),
    block_size=st.sampled_from([16, 32]),
    layout=st.sampled_from(LAYOUTS),
    memory=st.one_of(st.integers(min_value=1 << 22, max_value=GiB), st.sampled_from([0, 100_000, 1 << 20])),
    max_len=st.sampled_from([64, 1000, 4096]),
    disable_hybrid=st.booleans(),
    override=st.sampled_from([None, None, None, 50, 3000]),
)
def test_random_models_match_vllm(kinds, block_size, layout, memory, max_len, disable_hybrid, override):
    """Random mixes of layer kinds, budgets and layouts: kvcy plans what vLLM plans, or refuses alike.

    (Mamba layers all have one shape here: two shapes are the known spec-side gap above.)"""
    specs = {f"layers.{i}": _random_layer(kind, block_size) for i, kind in enumerate(kinds)}
    extra = {"disable_hybrid": disable_hybrid, "override": override}
    try:
        expected, vllm_error = _outcome(_plan_vllm, specs, memory, max_len, layout, extra)
    except TypeError:  # vLLM's own promotion of some specs fails this way; nothing to compare
        return
    got, kvcy_error = _outcome(_plan_kvcy, specs, memory, max_len, layout, extra)
    if vllm_error is not None:
        assert isinstance(kvcy_error, type(vllm_error)), (vllm_error, kvcy_error)
        return
    assert kvcy_error is None, kvcy_error
    assert got == convert_kv_cache_config(expected)



@pytest.mark.parametrize("model", ["llama-uniform", "gemma-sw-full-1to2", "llama4-chunked", "mamba-hybrid",
                                   "one-type-two-shapes", "whisper-cross", "sw-full-padded-10-25"])
def test_concurrency_and_memory_check_match_vllm(model):
    """get_max_concurrency_for_kv_cache_config and check_enough_kv_cache_memory agree with vLLM's."""
    from vllm.v1.core.kv_cache_utils import get_kv_cache_capacity as vllm_capacity
    from vllm.v1.core.kv_cache_utils import get_max_concurrency_for_kv_cache_config as vllm_concurrency

    specs, memory, max_len, extra = MODELS[model]
    cfg = vllm_config("LBNHC", max_len, **extra)
    settings = kvcy_settings("LBNHC", max_len, **extra)
    expected = _plan_vllm(specs, memory, max_len, "LBNHC", extra)
    got = _plan_kvcy(specs, memory, max_len, "LBNHC", extra)
    assert S.get_max_concurrency_for_kv_cache_config(settings, got) == vllm_concurrency(cfg, expected)
    assert S.get_kv_cache_capacity(settings, got) == vllm_capacity(cfg, expected)
    kspecs = {name: convert_kv_cache_spec(spec) for name, spec in specs.items()}
    need = S.max_memory_usage_bytes(settings, kspecs.values())
    # around the threshold (null block included): both accept or both refuse, with the same estimate
    for budget in (need, need + 64 * 1024 * 1024, need // 2):
        vllm_error = kvcy_error = None
        try:
            P.check_enough_kv_cache_memory(cfg, dict(specs), budget)
        except ValueError as exc:
            vllm_error = exc
        try:
            S.check_enough_kv_cache_memory(settings, dict(kspecs), budget)
        except ValueError as exc:
            kvcy_error = exc
        assert (vllm_error is None) == (kvcy_error is None), (budget, vllm_error, kvcy_error)
        if vllm_error is not None:
            estimate = str(vllm_error).partition("estimated maximum model length is ")[2].split(".")[0]
            assert kvcy_error.estimated_max_model_len == (int(estimate) if estimate else 0)
