"""Decode context parallelism in the spec layer, without vLLM: a dcp-sharded cache
keeps 1/dcp of a request's tokens per rank, a replicated one (``dcp_sharded=False``)
all of them, and a sharded sliding window is refused as vLLM 0.33.0 refuses it."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from kvcy.kv_cache_interface import ChunkedLocalAttentionSpec, FullAttentionSpec, MLAAttentionSpec, SlidingWindowSpec

ATTN = {"block_size": 16, "num_kv_heads": 8, "head_size": 64, "dtype": "bfloat16"}


def _config(dcp, max_model_len=1000, batched=256):
    return SimpleNamespace(
        model_config=SimpleNamespace(max_model_len=max_model_len),
        parallel_config=SimpleNamespace(decode_context_parallel_size=dcp),
        scheduler_config=SimpleNamespace(max_num_batched_tokens=batched),
    )


@pytest.mark.parametrize("dcp", [1, 2, 3, 8])
def test_sharded_full_attention_splits_tokens_over_ranks(dcp):
    spec = FullAttentionSpec(**ATTN)
    assert spec.dcp_sharded
    # 1000 tokens, 1000/dcp per rank rounded up, in 16-token blocks
    blocks = -(-(-(-1000 // dcp)) // 16)
    assert spec.max_memory_usage_bytes(_config(dcp)) == blocks * spec.page_size_bytes
    assert spec.max_num_blocks_per_req(_config(dcp), 1000) == -(-1000 // (16 * dcp))


def test_replicated_cache_is_not_split():
    sharded = MLAAttentionSpec(block_size=16, num_kv_heads=1, head_size=576, dtype="bfloat16")
    replicated = MLAAttentionSpec(block_size=16, num_kv_heads=1, head_size=576, dtype="bfloat16", dcp_sharded=False)
    assert sharded.max_num_blocks_per_req(_config(4), 1000) == 16
    assert replicated.max_num_blocks_per_req(_config(4), 1000) == 63
    assert replicated.max_memory_usage_bytes(_config(4)) == replicated.max_memory_usage_bytes(_config(1))
    assert sharded.max_memory_usage_bytes(_config(4)) == 16 * sharded.page_size_bytes


def test_sliding_window_under_dcp():
    sharded = SlidingWindowSpec(sliding_window=128, **ATTN)
    with pytest.raises(AssertionError, match="DCP not support sliding window"):
        sharded.max_memory_usage_bytes(_config(2))
    replicated = SlidingWindowSpec(sliding_window=128, dcp_sharded=False, **ATTN)
    assert replicated.max_memory_usage_bytes(_config(2)) == replicated.max_memory_usage_bytes(_config(1))
    # chunked local attention is sized by its chunks whatever dcp is (vLLM does not scale it)
    chunked = ChunkedLocalAttentionSpec(attention_chunk_size=64, **ATTN)
    assert chunked.max_memory_usage_bytes(_config(4)) == chunked.max_memory_usage_bytes(_config(1))


def test_config_without_parallel_section_means_no_dcp():
    spec = FullAttentionSpec(**ATTN)
    bare = SimpleNamespace(model_config=SimpleNamespace(max_model_len=1000))
    assert spec.max_memory_usage_bytes(bare) == 63 * spec.page_size_bytes


def test_resolve_dcp_kv_block_size_and_spec():
    from kvcy.kv_cache_interface import UniformTypeKVCacheSpecs
    from kvcy.kv_cache_utils import resolve_dcp_kv_block_size, resolve_dcp_kv_cache_spec

    sharded = FullAttentionSpec(**ATTN)
    replicated = FullAttentionSpec(dcp_sharded=False, **ATTN)
    assert resolve_dcp_kv_block_size(sharded, 4) == 64
    assert resolve_dcp_kv_block_size(replicated, 4) == 16
    assert resolve_dcp_kv_cache_spec(replicated, 4) is replicated
    assert resolve_dcp_kv_cache_spec(sharded, 1) is sharded
    assert resolve_dcp_kv_cache_spec(sharded, 4) == FullAttentionSpec(**{**ATTN, "block_size": 64})
    uniform = UniformTypeKVCacheSpecs(block_size=16, kv_cache_specs={"a": sharded, "b": sharded})
    resolved = resolve_dcp_kv_cache_spec(uniform, 2)
    assert resolved.block_size == 32
    assert {spec.block_size for spec in resolved.kv_cache_specs.values()} == {32}


class _BlockAlignedManager:
    """A manager class as partial_hash_hits_enabled reads it: block-aligned lookups only."""

    supports_fine_grained_hash_lookup = False


class _FineGrainedManager:
    supports_fine_grained_hash_lookup = True


@pytest.mark.parametrize("twin", ["cython", "python"])
def test_partial_hash_hits_under_dcp(twin):
    from kvcy import _fast
    from kvcy.kv_cache_interface import KVCacheGroupSpec, MambaSpec

    try:
        enabled = _fast.load(twin)["kv_cache"].partial_hash_hits_enabled
    except ImportError:
        pytest.skip(f"the {twin} twin is not built here")
    mamba = KVCacheGroupSpec(["m"], MambaSpec(block_size=16, shapes=((4,),), dtypes=("float32",),
                                              mamba_cache_mode="align"))
    attention = KVCacheGroupSpec(["f"], FullAttentionSpec(**{**ATTN, "block_size": 8}))
    replicated = KVCacheGroupSpec(["r"], FullAttentionSpec(**{**ATTN, "block_size": 8, "dcp_sharded": False}))
    managers = [_FineGrainedManager, _BlockAlignedManager]
    # a Mamba block equal to the hash block qualifies under dcp only
    assert enabled([mamba], 16, 1) is False
    assert enabled([mamba], 16, 2) is True
    # a block-aligned group must span exactly the hash block: 8 tokens * dcp 2 does
    assert enabled([mamba, attention], 16, 2, managers) is True
    assert enabled([mamba, attention], 8, 2, managers) is False
    # a replicated cache is not scaled: 8 tokens at any world size
    assert enabled([mamba, replicated], 16, 2, managers) is False
    assert enabled([mamba, replicated], 8, 2, managers) is True
    # no Mamba group, no partial hits, at any world size
    assert enabled([], 4, 2) is False
