"""The single-type managers (full attention, sliding window, chunked local, Mamba, sink): what
each keeps, frees and finds for one KV-cache group, both twins.
"""

from __future__ import annotations

import pytest

from kvcy.hashing import get_hash_fn_by_name, get_request_block_hasher, init_none_hash
from kvcy.kv_cache_interface import (
    ChunkedLocalAttentionSpec,
    FullAttentionSpec,
    KVCacheConfig,
    KVCacheGroupSpec,
    SlidingWindowSpec,
)
from kvcy.request import Request


BS = 4


@pytest.fixture(autouse=True)
def _none_hash():
    init_none_hash(get_hash_fn_by_name("sha256"))


def hasher(bs=BS):
    return get_request_block_hasher(bs, get_hash_fn_by_name("sha256"))


def full_config(num_blocks=16, bs=BS):
    spec = FullAttentionSpec(block_size=bs, num_kv_heads=1, head_size=8, dtype="float16")
    return KVCacheConfig(num_blocks=num_blocks, kv_cache_tensors=[], kv_cache_groups=[KVCacheGroupSpec(["l0"], spec)])


def manager(impl, num_blocks=16, **kw):
    kw.setdefault("max_model_len", 256)
    return impl.kv_cache.KVCacheManager(full_config(num_blocks), scheduler_block_size=BS, hash_block_size=BS, **kw)


def ids(blocks):
    return [b.block_id for b in blocks]


def _pool_state(pool):
    return (ids(pool.free_block_queue.get_all_free_blocks()), [b.ref_cnt for b in pool.blocks],
            [b.block_hash for b in pool.blocks], sorted(pool.cached_block_hash_to_block.keys()))


def test_sliding_window_frees_out_of_window_blocks(impl):
    spec = SlidingWindowSpec(block_size=4, num_kv_heads=1, head_size=8, dtype="float16", sliding_window=6)
    cfg = KVCacheConfig(num_blocks=20, kv_cache_tensors=[], kv_cache_groups=[KVCacheGroupSpec(["l"], spec)])
    mgr = impl.kv_cache.KVCacheManager(cfg, max_model_len=256, scheduler_block_size=4, hash_block_size=4)
    req = Request("s", list(range(24)), block_hasher=hasher())
    mgr.allocate_slots(req, 12)
    req.num_computed_tokens = 12
    mgr.allocate_slots(req, 12)
    # 12 computed: 12 - 6 + 1 = 7 tokens skipped -> block 0 is replaced by the null block
    assert mgr.get_block_ids("s")[0][0] == 0
    assert mgr.get_block_ids("s")[0][1:] == [2, 3, 4, 5, 6]


def test_chunked_local_hit_is_null_before_the_chunk(impl):
    spec = ChunkedLocalAttentionSpec(block_size=4, num_kv_heads=1, head_size=8, dtype="float16",
                                     attention_chunk_size=8)
    cfg = KVCacheConfig(num_blocks=20, kv_cache_tensors=[], kv_cache_groups=[KVCacheGroupSpec(["l"], spec)])
    mgr = impl.kv_cache.KVCacheManager(cfg, max_model_len=256, scheduler_block_size=4, hash_block_size=4)
    a = Request("a", list(range(16)), block_hasher=hasher())
    mgr.allocate_slots(a, 16)
    b = Request("b", list(range(16)), block_hasher=hasher())
    blocks, n, _ = mgr.get_computed_blocks(b)
    # max length 15: chunk start 8 -> blocks 0, 1 are null; block 2 (tokens 8..11) hits
    assert blocks.get_block_ids() == ([0, 0, 3],) and n == 12


def test_chunked_local_beside_another_block_size_asserts_at_lookup(impl):
    """vLLM 0.33.0's chunked-local lookup asserts that the group's block size is the hit
    alignment (the scheduler block): beside full attention of 8-token blocks, 4-token chunked
    blocks build but every lookup raises its AssertionError (a lookup that
    trimmed the hit to the alignment instead would differ; tests/vllm_live/test_vllm_state_machine.py
    drives this against vLLM)."""
    chunked = ChunkedLocalAttentionSpec(block_size=4, num_kv_heads=1, head_size=8, dtype="float16",
                                        attention_chunk_size=16)
    full = FullAttentionSpec(block_size=8, num_kv_heads=1, head_size=8, dtype="float16")
    cfg = KVCacheConfig(num_blocks=20, kv_cache_tensors=[],
                        kv_cache_groups=[KVCacheGroupSpec(["f"], full), KVCacheGroupSpec(["c"], chunked)])
    mgr = impl.kv_cache.KVCacheManager(cfg, max_model_len=256, scheduler_block_size=8, hash_block_size=4)
    req = Request("a", list(range(20)), block_hasher=hasher())
    msg = "KV cache groups with different block sizes are not compatible with chunked local attention now"
    with pytest.raises(AssertionError, match=msg):
        mgr.get_computed_blocks(req)
    manager_cls = type(mgr.coordinator.single_type_managers[1])
    with pytest.raises(AssertionError, match=msg):
        manager_cls.find_longest_cache_hit([], 16, [1], mgr.block_pool, chunked, False, 8)
    (hit,), n = manager_cls.find_longest_cache_hit([], 16, [1], mgr.block_pool, chunked, False, 4)
    assert [b.block_id for b in hit] == [0, 0, 0, 0] and n == 16  # (aligned: the chunk's null blocks)


def test_add_local_computed_blocks_rejects_bad_blocks_unchanged(impl):
    mgr = manager(impl)
    single = mgr.coordinator.single_type_managers[0]
    free_block = mgr.block_pool.free_block_queue.get_all_free_blocks()[0]
    before = _pool_state(mgr.block_pool)
    for bad, exc in (([free_block, None], TypeError), ([free_block, impl.kv_cache.KVCacheBlock(5)], RuntimeError)):
        with pytest.raises(exc):
            single.add_local_computed_blocks("r", bad, 2 * BS, 0)
        assert "r" not in single.req_to_blocks
        assert _pool_state(mgr.block_pool) == before


def test_managers_check_what_goes_into_their_tables(impl):
    """req_to_blocks / num_cached_block take entries from callers (vLLM's tests do), checked
    when they go in: a value that is not a list of this pool's blocks, or not a count, is
    refused and nothing changes."""
    mgr = manager(impl)
    other = manager(impl)
    single = mgr.coordinator.single_type_managers[0]
    req = impl.kv_cache.Request("r", list(range(8)), block_hasher=hasher())
    with pytest.raises(TypeError, match="req_to_blocks values must be lists"):
        single.req_to_blocks["r"] = ("not", "a list")
    with pytest.raises(TypeError, match="req_to_blocks values must be lists"):
        single.req_to_blocks["r"] = [1, 2]
    with pytest.raises(RuntimeError, match="not a block of this pool"):
        single.req_to_blocks["r"] = [other.block_pool.blocks[1]]
    with pytest.raises(TypeError, match="request ids must be str"):
        single.req_to_blocks[3] = []
    with pytest.raises(ValueError, match="num_cached_block values must be non-negative"):
        single.num_cached_block["r"] = -1
    assert "r" not in single.req_to_blocks and not single.num_cached_block
    assert mgr.allocate_slots(req, 8) is not None
    single.req_to_blocks["r"] = list(single.req_to_blocks["r"])  # a list of its own blocks: taken
    single.num_cached_block["r"] = 1
    assert dict(single.num_cached_block) == {"r": 1}


def full_spec(bs: int = BS) -> FullAttentionSpec:
    return FullAttentionSpec(block_size=bs, num_kv_heads=1, head_size=8, dtype="float16")


def request(impl, rid, tokens):
    return impl.kv_cache.Request(rid, tokens, block_hasher=get_request_block_hasher(BS, get_hash_fn_by_name("sha256")))


# ------------------------------------------------------- a spec no manager serves
def test_group_whose_spec_has_no_manager_asserts_as_vllm(impl):
    """A group of encoder-only layers, or of a ``UniformTypeKVCacheSpecs`` (the workers'
    spec, not the scheduler's), has no single-type manager: vLLM's factory asserts
    ("No manager registered for KVCacheSpec <class ...>"), with or without caching.
    kvcy raised ValueError."""
    from kvcy.kv_cache_interface import EncoderOnlyAttentionSpec, UniformTypeKVCacheSpecs

    attn = dict(block_size=BS, num_kv_heads=1, head_size=8, dtype="float16")
    for spec in (EncoderOnlyAttentionSpec(**attn),
                 UniformTypeKVCacheSpecs(block_size=BS, kv_cache_specs={"a": full_spec(), "b": full_spec()})):
        cfg = KVCacheConfig(num_blocks=16, kv_cache_tensors=[],
                            kv_cache_groups=[KVCacheGroupSpec(["l0"], full_spec()), KVCacheGroupSpec(["l1"], spec)])
        for caching in (True, False):
            with pytest.raises(AssertionError) as err:
                impl.kv_cache.KVCacheManager(cfg, max_model_len=64, scheduler_block_size=BS, hash_block_size=BS,
                                             enable_caching=caching)
            assert str(err.value) == f"No manager registered for KVCacheSpec {type(spec)}"


def test_find_longest_cache_hit_takes_vllms_context_parallel_sizes(impl):
    """vLLM's ``find_longest_cache_hit`` classmethods end with ``dcp_world_size=1,
    pcp_world_size=1`` (its coordinators pass them); kvcy takes them, and refuses other
    sizes as everywhere else (context parallelism is out of scope)."""
    from kvcy.kv_cache_interface import SlidingWindowSpec

    kv = impl.kv_cache
    pool = kv.BlockPool(16, True, BS)
    req = request(impl, "a", list(range(12)))
    blocks = pool.get_new_blocks(3)
    pool.cache_full_blocks(req, blocks, 0, 3, BS, 0)
    swa = SlidingWindowSpec(block_size=BS, num_kv_heads=1, head_size=8, dtype="float16", sliding_window=8)
    for cls, spec, expected in ((kv.FullAttentionManager, full_spec(), (12, [1, 2, 3])),
                                (kv.SlidingWindowManager, swa, (12, [0, 2, 3]))):
        got, length = cls.find_longest_cache_hit(
            block_hashes=req.block_hashes, max_length=12, kv_cache_group_ids=[0], block_pool=pool,
            kv_cache_spec=spec, drop_eagle_block=False, alignment_tokens=BS, dcp_world_size=1, pcp_world_size=1)
        assert (length, [b.block_id for b in got[0]]) == expected
        with pytest.raises(NotImplementedError, match="context parallelism"):
            cls.find_longest_cache_hit(req.block_hashes, 12, [0], pool, spec, False, BS, 2, 1)
