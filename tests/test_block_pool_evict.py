"""``BlockPool._maybe_evict_cached_block``: the private eviction step vLLM's own tests call.

Both twins expose it, validated: it drops a block's prefix-cache entries (with their
``BlockRemoved`` events) and refuses a block that is not one of the pool's own, leaving the
pool as it was.
"""

from __future__ import annotations

import pytest

from kvcy.kv_cache_utils import BlockHash, make_block_hash_with_group_id


def pool_with_keys(impl, events=False):
    pool = impl.kv_cache.BlockPool(num_gpu_blocks=4, enable_caching=True, hash_block_size=16,
                                   enable_kv_cache_events=events)
    keys = [make_block_hash_with_group_id(BlockHash(h), g) for h, g in ((b"10", 1), (b"20", 2), (b"30", 3))]
    for block, key in zip(pool.blocks, keys + [keys[0]]):  # (block 3 shares block 0's key)
        block.set_block_hash(key)
        pool.cached_block_hash_to_block.insert(key, block)
    return pool, keys


def test_evicts_one_block_and_keeps_a_shared_key(impl):
    pool, keys = pool_with_keys(impl)
    b0, b1, b2, b3 = pool.blocks
    assert pool._maybe_evict_cached_block(b1) is True
    assert b1.block_hash is None
    assert pool.get_cached_block(BlockHash(b"20"), [2]) is None
    assert pool._maybe_evict_cached_block(b1) is False  # (no key left)
    assert pool._maybe_evict_cached_block(b0) is True
    assert pool.get_cached_block(BlockHash(b"10"), [1]) == [b3]  # (block 3 still holds the key)
    assert pool.num_evictions == 2


def test_eviction_emits_block_removed(impl):
    pool, keys = pool_with_keys(impl, events=True)
    pool.take_events()
    pool._maybe_evict_cached_block(pool.blocks[2])
    (event,) = pool.take_events()
    assert type(event).__name__ == "BlockRemoved" and event.group_idx == 3


@pytest.mark.parametrize("bad, exc, msg", [
    (None, TypeError, "block must be a KVCacheBlock"),
    ("block", TypeError, "block must be a KVCacheBlock"),
])
def test_not_a_block_is_refused(impl, bad, exc, msg):
    pool, _ = pool_with_keys(impl)
    with pytest.raises(exc, match=msg):
        pool._maybe_evict_cached_block(bad)


def test_a_block_of_another_pool_is_refused_and_nothing_changes(impl):
    pool, keys = pool_with_keys(impl)
    stranger = impl.kv_cache.KVCacheBlock(1)
    stranger.set_block_hash(keys[1])
    other, _ = pool_with_keys(impl)
    for foreign in (stranger, other.blocks[1], impl.kv_cache.KVCacheBlock(1000)):
        with pytest.raises(RuntimeError, match="is not a block of this pool"):
            pool._maybe_evict_cached_block(foreign)
    assert pool.get_cached_block(BlockHash(b"20"), [2]) == [pool.blocks[1]]
    assert pool.blocks[1].block_hash == keys[1]
