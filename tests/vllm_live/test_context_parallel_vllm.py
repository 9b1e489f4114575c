"""Decode context parallelism in the spec layer, against live vLLM 0.33.0.

For random attention specs (full, MLA, sliding window, chunked local, sharded or
replicated across dcp ranks) and random dcp world sizes and model lengths, kvcy's
``max_num_blocks_per_req`` and ``max_memory_usage_bytes`` must give vLLM's numbers,
and refuse (``AssertionError``) exactly where vLLM does.
"""

from __future__ import annotations

import random
from types import SimpleNamespace

import pytest


torch = pytest.importorskip("torch")

from vllm.v1 import kv_cache_interface as V  # noqa: E402

from kvcy.vllm import convert_kv_cache_spec  # noqa: E402

BF16 = torch.bfloat16


def _config(max_model_len, dcp, batched):
    """The fields of a ``VllmConfig`` both sides read (vLLM's names and kvcy's settings)."""
    return SimpleNamespace(
        model_config=SimpleNamespace(max_model_len=max_model_len),
        parallel_config=SimpleNamespace(decode_context_parallel_size=dcp, prefill_context_parallel_size=1),
        scheduler_config=SimpleNamespace(max_num_batched_tokens=batched),
        max_in_flight_tokens=batched,
    )


def _random_spec(rng):
    block_size = rng.choice([1, 4, 16, 64])
    common = {"block_size": block_size, "dtype": BF16, "dcp_sharded": rng.random() < 0.6}
    kind = rng.choice(["full", "mla", "swa", "chunked"])
    if kind == "full":
        return V.FullAttentionSpec(num_kv_heads=rng.choice([1, 8]), head_size=64, **common)
    if kind == "mla":
        return V.MLAAttentionSpec(num_kv_heads=1, head_size=576, **common)
    if kind == "swa":
        return V.SlidingWindowSpec(num_kv_heads=8, head_size=64, sliding_window=rng.randint(1, 300), **common)
    return V.ChunkedLocalAttentionSpec(num_kv_heads=8, head_size=64, attention_chunk_size=rng.choice([16, 64]), **common)


def _outcome(fn):
    try:
        return ("ok", fn())
    except AssertionError as exc:
        return ("assert", str(exc))


@pytest.mark.parametrize("seed", range(4))
def test_spec_sizing_matches_vllm_under_dcp(seed):
    rng = random.Random(seed)
    refusals = dcp_cases = 0
    for _ in range(250):
        theirs = _random_spec(rng)
        ours = convert_kv_cache_spec(theirs)
        assert ours.dcp_sharded == theirs.dcp_sharded
        dcp = rng.choice([1, 2, 3, 4, 8])
        dcp_cases += dcp > 1
        config = _config(rng.randint(1, 5000), dcp, rng.choice([16, 256, 2048]))
        max_len = rng.randint(0, 5000)
        assert ours.max_num_blocks_per_req(config, max_len) == theirs.max_num_blocks_per_req(config, max_len)
        want = _outcome(lambda: theirs.max_memory_usage_bytes(config))
        got = _outcome(lambda: ours.max_memory_usage_bytes(config))
        assert got == want, (theirs, dcp)
        refusals += want[0] == "assert"
    # the random table reaches both the scaled sizes and vLLM's refusal
    assert dcp_cases > 100 and refusals > 0


def _group_pair(rng):
    """One group as vLLM builds it and as kvcy does (the spec converted)."""
    from vllm.v1.kv_cache_interface import KVCacheGroupSpec as VGroup

    from kvcy.kv_cache_interface import KVCacheGroupSpec

    block_size = rng.choice([4, 8, 16, 32])
    kind = rng.choice(["full", "mamba"])
    if kind == "full":
        spec = V.FullAttentionSpec(block_size=block_size, num_kv_heads=8, head_size=64, dtype=BF16,
                                   dcp_sharded=rng.random() < 0.7)
    else:
        spec = V.MambaSpec(block_size=block_size, shapes=((4,),), dtypes=(BF16,),
                           mamba_cache_mode=rng.choice(["align", "align", "all"]))
    return VGroup(["l"], spec), KVCacheGroupSpec(["l"], convert_kv_cache_spec(spec))


@pytest.mark.parametrize("seed", range(3))
def test_dcp_block_sizes_and_partial_hits_match_vllm(seed):
    from vllm.v1.core import kv_cache_utils as VU
    from vllm.v1.core.single_type_kv_cache_manager import FullAttentionManager as VFull
    from vllm.v1.core.single_type_kv_cache_manager import MambaManager as VMamba

    from kvcy import kv_cache_utils as KU
    from kvcy.single_type_kv_cache_manager import FullAttentionManager, MambaManager

    rng = random.Random(seed)
    enabled = 0
    for _ in range(300):
        pairs = [_group_pair(rng) for _ in range(rng.randint(1, 3))]
        theirs, ours = [p[0] for p in pairs], [p[1] for p in pairs]
        dcp = rng.choice([1, 2, 4])
        hash_block_size = rng.choice([4, 8, 16, 32])
        for v_group, k_group in pairs:
            assert KU.resolve_dcp_kv_block_size(k_group.kv_cache_spec, dcp) == VU.resolve_dcp_kv_block_size(
                v_group.kv_cache_spec, dcp)
            resolved = KU.resolve_dcp_kv_cache_spec(k_group.kv_cache_spec, dcp)
            assert resolved.block_size == VU.resolve_dcp_kv_cache_spec(v_group.kv_cache_spec, dcp).block_size
        v_classes = [VMamba if isinstance(g.kv_cache_spec, V.MambaSpec) else VFull for g in theirs]
        k_classes = [MambaManager if c is VMamba else FullAttentionManager for c in v_classes]
        want = VU.partial_hash_hits_enabled(theirs, hash_block_size, dcp)
        assert KU.partial_hash_hits_enabled(ours, hash_block_size, dcp) == want
        want_m = VU.partial_hash_hits_enabled(theirs, hash_block_size, dcp, v_classes)
        assert KU.partial_hash_hits_enabled(ours, hash_block_size, dcp, k_classes) == want_m
        enabled += want_m
    assert enabled > 0
