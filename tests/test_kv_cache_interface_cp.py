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
