"""Helpers the KV-cache test modules share: requests, hashers, managers and configs built the
same way, and small readers of their state."""

from __future__ import annotations

from kvcy.hashing import get_hash_fn_by_name, get_request_block_hasher
from kvcy.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec, SlidingWindowSpec

BS = 4

ATTN = dict(num_kv_heads=1, head_size=8, dtype="float16")

SHA = get_hash_fn_by_name("sha256")


def ids(blocks):
    return [b.block_id for b in blocks]


def _pool_state(pool):
    return (ids(pool.free_block_queue.get_all_free_blocks()), [b.ref_cnt for b in pool.blocks],
            [b.block_hash for b in pool.blocks], sorted(pool.cached_block_hash_to_block.keys()))


def hashed_ids(mgr):
    return [b.block_id for b in mgr.block_pool.blocks if b.block_hash is not None]


def request_api(impl, rid, tokens, lookahead=0, **kw):
    return impl.kv_cache.Request(rid, list(tokens), block_hasher=get_request_block_hasher(BS, SHA, lookahead), **kw)


def manager_small(impl, groups=1, num_blocks=16, max_model_len=256, **kw):
    """A manager over ``groups`` groups: full attention, then sliding windows."""
    specs = [FullAttentionSpec(block_size=BS, num_kv_heads=1, head_size=8, dtype="float16")] + [
        SlidingWindowSpec(block_size=BS, num_kv_heads=1, head_size=8, dtype="float16", sliding_window=8)
        for _ in range(groups - 1)
    ]
    cfg = KVCacheConfig(num_blocks=num_blocks, kv_cache_tensors=[],
                        kv_cache_groups=[KVCacheGroupSpec([f"l{i}"], s) for i, s in enumerate(specs)])
    return impl.kv_cache.KVCacheManager(cfg, max_model_len=max_model_len, scheduler_block_size=BS,
                                        hash_block_size=BS, **kw)


def full_spec_api():
    return FullAttentionSpec(block_size=BS, num_kv_heads=1, head_size=8, dtype="float16")


def swa_spec():
    return SlidingWindowSpec(block_size=BS, num_kv_heads=1, head_size=8, dtype="float16", sliding_window=8)


def config(specs, num_blocks=16):
    return KVCacheConfig(num_blocks=num_blocks, kv_cache_tensors=[],
                         kv_cache_groups=[KVCacheGroupSpec([f"l{i}"], s) for i, s in enumerate(specs)])


def _mamba_outcome(make):
    try:
        make()
    except Exception as exc:  # (the type and message are what is compared)
        return type(exc).__name__, str(exc)
    return "built", ""


def hybrid_config(num_blocks=64, bs=BS):
    full = FullAttentionSpec(block_size=bs, num_kv_heads=1, head_size=8, dtype="float16")
    swa = SlidingWindowSpec(block_size=bs, num_kv_heads=1, head_size=8, dtype="float16", sliding_window=8)
    return KVCacheConfig(num_blocks=num_blocks, kv_cache_tensors=[],
                         kv_cache_groups=[KVCacheGroupSpec(["l0"], full), KVCacheGroupSpec(["l1"], swa)])


def cached_flags(mgr, rid, group=0):
    return [b.block_hash is not None for b in mgr.get_blocks(rid).blocks[group]]


def hasher_manager():
    return get_request_block_hasher(BS, get_hash_fn_by_name("sha256"))


def full_spec_manager():
    return FullAttentionSpec(block_size=BS, num_kv_heads=1, head_size=8, dtype="float16")


def manager_manager(impl, groups=1, num_blocks=16, max_model_len=256, **kw):
    """A manager over ``groups`` groups: full attention, then sliding windows."""
    specs = [full_spec_manager()] + [
        SlidingWindowSpec(block_size=BS, num_kv_heads=1, head_size=8, dtype="float16", sliding_window=8)
        for _ in range(groups - 1)
    ]
    cfg = KVCacheConfig(num_blocks=num_blocks, kv_cache_tensors=[],
                        kv_cache_groups=[KVCacheGroupSpec([f"l{i}"], s) for i, s in enumerate(specs)])
    return impl.kv_cache.KVCacheManager(cfg, max_model_len=max_model_len, scheduler_block_size=BS,
                                        hash_block_size=BS, **kw)


def _full(bs=4):
    return FullAttentionSpec(block_size=bs, **ATTN)


def _swa(bs=4, window=6, extra=0):
    return SlidingWindowSpec(block_size=bs, sliding_window=window, extra_retained_tokens=extra, **ATTN)
