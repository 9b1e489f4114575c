"""``kv_cache_utils``: ``KVCacheBlock``, the free-block queue and the block-hash helpers, both twins.

vLLM 0.33.0's ``tests/v1/core/test_kv_cache_utils.py`` tests the same module.
"""

from __future__ import annotations

import pytest

from kvcy.hashing import get_hash_fn_by_name, init_none_hash


@pytest.fixture(autouse=True)
def _none_hash():
    init_none_hash(get_hash_fn_by_name("sha256"))


def ids(blocks):
    return [b.block_id for b in blocks]


# --------------------------------------------------------------------------- free queue
def test_free_queue_order_and_errors(impl):
    m = impl.kv_cache
    blocks = [m.KVCacheBlock(i) for i in range(6)]
    q = m.FreeKVCacheBlockQueue(blocks)
    assert ids(q.get_all_free_blocks()) == [0, 1, 2, 3, 4, 5]
    assert q.popleft().block_id == 0
    assert ids(q.popleft_n(2)) == [1, 2]
    q.remove(blocks[4])
    assert ids(q.get_all_free_blocks()) == [3, 5]
    q.append(blocks[0])
    q.prepend_n([blocks[2], blocks[1]])
    q.append_n([blocks[4]])
    assert ids(q.get_all_free_blocks()) == [2, 1, 3, 5, 0, 4]
    assert q.num_free_blocks == 6
    with pytest.raises(RuntimeError):
        q.append(blocks[0])  # already queued: nothing changes
    assert q.num_free_blocks == 6
    assert ids(q.popleft_n(6)) == [2, 1, 3, 5, 0, 4]
    with pytest.raises(ValueError, match="No free blocks available"):
        q.popleft()
    with pytest.raises(RuntimeError):
        q.remove(blocks[0])
    with pytest.raises(AssertionError):  # (vLLM asserts num_free_blocks >= n)
        q.popleft_n(1)


# --------------------------------------------------------------------------- bad batches leave no trace
def test_free_queue_rejects_bad_batches_unchanged(impl):
    m = impl.kv_cache
    blocks = [m.KVCacheBlock(i) for i in range(6)]
    q = m.FreeKVCacheBlockQueue(blocks[:3])
    loose = blocks[3:]
    for bad, exc, msg in (
        ([loose[0], loose[1], loose[0]], RuntimeError, "appears twice"),
        ([loose[0], blocks[1]], RuntimeError, "already in the free queue"),
        ([loose[0], "x"], TypeError, "KVCacheBlock"),
    ):
        for op in (q.append_n, q.prepend_n):
            with pytest.raises(exc, match=msg):
                op(bad)
            assert ids(q.get_all_free_blocks()) == [0, 1, 2] and q.num_free_blocks == 3
            assert all(b.prev_free_block is None and b.next_free_block is None for b in loose)
    q.append_n(loose)  # the rejected blocks are still usable
    assert ids(q.get_all_free_blocks()) == [0, 1, 2, 3, 4, 5]


def test_block_hash_round_trip(impl):
    blk = impl.kv_cache.KVCacheBlock(3)
    key = b"\x01" * 32 + (2).to_bytes(4, "big")
    blk.set_block_hash(key, 48)
    assert blk.block_hash == key and blk.block_hash_num_tokens == 48
    blk.reset_hash()
    assert blk.block_hash is None and blk.block_hash_num_tokens is None


def test_resolve_block_hashes_rejects_bad_sizes(impl):
    hashes = [b"a" * 32, b"b" * 32]
    assert impl.kv_cache.resolve_block_hashes(hashes, 4, 4) is hashes
    assert len(impl.kv_cache.resolve_block_hashes(hashes, 4, 8)) == 1
    for hash_bs, bs in ((4, 2), (4, 0), (0, 4), (4, -8), (4, 6)):
        with pytest.raises(ValueError, match="multiple of the hash block size"):
            impl.kv_cache.resolve_block_hashes(hashes, hash_bs, bs)
