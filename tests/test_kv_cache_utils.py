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


# ------------------------------------------- names vLLM's modules export
def test_lookahead_extra_keys_as_vllm(impl):
    """``kv_cache_utils.generate_lookahead_block_hash_extra_keys``: keys over the block and
    its lookahead tokens, the multimodal index stepped back to the items still open at the
    block's end (values recorded from vLLM 0.33.0)."""
    from kvcy.kv_cache_utils import generate_lookahead_block_hash_extra_keys
    from kvcy.request import MultiModalFeatureSpec, PlaceholderRange

    items = [MultiModalFeatureSpec(identifier=i, mm_position=PlaceholderRange(o, n), modality="image")
             for i, o, n in (("A", 2, 5), ("B", 7, 2), ("C", 10, 6))]
    req = impl.kv_cache.Request("r", list(range(20)), mm_features=items, cache_salt="s")
    expected = {
        (0, 4, 6, 0): ((("mm", "A", 2), ("cache_salt", "s")), 0),
        (4, 8, 10, 0): ((("mm", "A", -2), ("mm", "B", 3)), 1),
        (8, 12, 14, 1): ((("mm", "B", -1), ("mm", "C", 2)), 2),
        (12, 16, 18, 2): ((("mm", "C", -2),), 3),
        (4, 8, 8, 0): ((("mm", "A", -2), ("mm", "B", 3)), 1),
    }
    for args, keys in expected.items():
        assert generate_lookahead_block_hash_extra_keys(req, *args) == keys, args


def test_null_head_helpers():
    """``kv_cache_utils.null_head_len`` / ``trim_null_head``: the leading null blocks."""
    from kvcy.kv_cache_utils import KVCacheBlock, null_head_len, trim_null_head

    null = KVCacheBlock(0, is_null=True)
    blocks = [null, null, KVCacheBlock(3), null]
    assert null_head_len(blocks) == 2 and null_head_len([]) == 0 and null_head_len(blocks[2:]) == 0
    assert [b.block_id for b in trim_null_head(blocks)] == [3, 0]
    assert trim_null_head(blocks[2:]) == blocks[2:] and type(trim_null_head(tuple(blocks))) is tuple


def test_popleft_n_past_the_free_blocks_asserts_as_vllm(impl):
    """``FreeKVCacheBlockQueue.popleft_n(n)`` with fewer than ``n`` free blocks: vLLM
    asserts (kvcy raised ValueError); nothing is popped."""
    blocks = [impl.kv_cache.KVCacheBlock(i) for i in range(3)]
    queue = impl.kv_cache.FreeKVCacheBlockQueue(blocks)
    with pytest.raises(AssertionError):
        queue.popleft_n(4)
    assert queue.num_free_blocks == 3 and [b.block_id for b in queue.get_all_free_blocks()] == [0, 1, 2]


def test_iter_blocks_after_walks_the_free_queue_as_vllm(impl):
    """``FreeKVCacheBlockQueue.iter_blocks_after(cursor)``: the free blocks after ``cursor``
    in eviction order (from the head for None), read lazily (values recorded from vLLM)."""
    blocks = [impl.kv_cache.KVCacheBlock(i) for i in range(6)]
    queue = impl.kv_cache.FreeKVCacheBlockQueue(blocks)
    queue.remove(blocks[2])
    queue.append(blocks[2])
    queue.popleft()
    walk = lambda cursor: [b.block_id for b in queue.iter_blocks_after(cursor)]  # noqa: E731
    assert walk(None) == [1, 3, 4, 5, 2]
    assert [walk(c) for c in (blocks[1], blocks[3], blocks[2], blocks[0], queue.fake_free_list_tail)] == \
        [[3, 4, 5, 2], [4, 5, 2], [], [], []]
    it = queue.iter_blocks_after(None)
    first = next(it)
    queue.remove(blocks[3])  # (the walk reads each next block when it gets there)
    assert [first.block_id] + [b.block_id for b in it] == [1, 4, 5, 2]


def test_block_repr_as_vllm(impl):
    """``repr(KVCacheBlock)`` names the same fields as vLLM 0.33.0's, in its order
    (strings recorded from vLLM)."""
    kv = impl.kv_cache
    blocks = [kv.KVCacheBlock(i) for i in range(3)]
    queue = kv.FreeKVCacheBlockQueue(blocks)
    cached = kv.KVCacheBlock(7)
    cached.set_block_hash(b"abcd\x00\x00\x00\x01", 4)
    assert repr(blocks[1]) == ("KVCacheBlock(block_id=1, ref_cnt=0, _block_hash=None, _block_hash_num_tokens=None, "
                               "prev_free_block=0, next_free_block=2)")
    assert repr(cached) == ("KVCacheBlock(block_id=7, ref_cnt=0, _block_hash=b'abcd\\x00\\x00\\x00\\x01', "
                            "_block_hash_num_tokens=4, prev_free_block=None, next_free_block=None)")
    assert queue.num_free_blocks == 3


# ------------------------------------------------- §7 NONE_HASH seed for vLLM's own functions
def test_none_hash_seed_is_random_for_vllms_own_xxhash_functions(monkeypatch):
    """vLLM randomises the seed of its own xxhash and xxhash_cbor (by identity): so does kvcy.

    A stand-in for ``vllm.utils.hashing`` (vLLM itself takes seconds to import);
    test_none_hash_seed_with_vllm checks the real module where it is installed.
    """
    import sys
    import types

    from kvcy import hashing

    monkeypatch.delenv("PYTHONHASHSEED", raising=False)

    def xxhash(obj):  # another function object than kvcy's
        return hashing.xxhash(obj)

    def xxhash_cbor(obj):
        return hashing.xxhash_cbor(obj)

    def sha256(obj):
        return hashing.sha256(obj)

    fake = types.ModuleType("vllm.utils.hashing")
    fake.xxhash, fake.xxhash_cbor, fake.sha256 = xxhash, xxhash_cbor, sha256
    for fn in (xxhash, xxhash_cbor, sha256):
        assert hashing.resolve_none_hash_seed(fn) == "vllm-none-hash"  # vLLM not loaded: unknown functions
    monkeypatch.setitem(sys.modules, "vllm.utils.hashing", fake)
    for fn in (xxhash, xxhash_cbor):
        a, b = hashing.resolve_none_hash_seed(fn), hashing.resolve_none_hash_seed(fn)
        assert a != b and len(a) == 64
    assert hashing.resolve_none_hash_seed(sha256) == "vllm-none-hash"
    assert hashing.resolve_none_hash_seed(lambda obj: b"x") == "vllm-none-hash"
    hashing.init_none_hash(xxhash)
    seed = hashing.get_none_hash_seed()
    assert seed != "vllm-none-hash" and hashing.NONE_HASH == xxhash(seed)
    # kvcy's extra non-collision-resistant functions keep their random seed.
    for name in ("xxhash", "xxhash_cbor", "xxh3_raw", "builtin", "sha256_cbor_64bit"):
        fn = hashing.get_hash_fn_by_name(name)
        assert hashing.resolve_none_hash_seed(fn) != hashing.resolve_none_hash_seed(fn)
    monkeypatch.setenv("PYTHONHASHSEED", "9")
    assert hashing.resolve_none_hash_seed(xxhash) == "9"
    hashing.init_none_hash(hashing.sha256)


def test_none_hash_seed_with_vllm(monkeypatch):
    """The real vLLM 0.33.0 functions, where vLLM is installed."""
    vllm_hashing = pytest.importorskip("vllm.utils.hashing")
    from kvcy import hashing

    monkeypatch.delenv("PYTHONHASHSEED", raising=False)
    for fn in (vllm_hashing.xxhash, vllm_hashing.xxhash_cbor):
        assert hashing.resolve_none_hash_seed(fn) != hashing.resolve_none_hash_seed(fn)
    for fn in (vllm_hashing.sha256, vllm_hashing.sha256_cbor):
        assert hashing.resolve_none_hash_seed(fn) == "vllm-none-hash"


def test_kv_cache_block_is_null_keyword(impl):
    kv = impl.kv_cache
    assert kv.KVCacheBlock(3, is_null=True).is_null is True
    assert kv.KVCacheBlock(3).is_null is False
    with pytest.raises(TypeError, match="is_null must be a bool"):
        kv.KVCacheBlock(3, is_null=1)
