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


def test_pop_blocks_for_free_leaves_out_leading_null_blocks(impl):
    """A sliding window's skipped prefix is null blocks at the head of its table;
    vLLM's pop_blocks_for_free returns the blocks without them (trim_null_head)."""
    mgr = manager_manager(impl, groups=2, num_blocks=32)
    req = impl.kv_cache.Request("a", list(range(24)), block_hasher=hasher_manager())
    assert mgr.allocate_slots(req, 24) is not None
    req.num_computed_tokens = 24
    mgr.remove_skipped_blocks("a", 24)
    full, window = mgr.coordinator.get_blocks("a")
    null = mgr.block_pool.null_block
    # window 8, 24 tokens computed: 24 - 8 + 1 = 17 tokens skipped, so 4 blocks of 4 are null
    assert [b is null for b in window] == [True] * 4 + [False] * 2
    expected = [b.block_id for b in full] + [b.block_id for b in window[4:]]
    popped = mgr.pop_blocks_for_free(req)
    assert [b.block_id for b in popped] == expected
    assert not any(b is null for b in popped)
    assert not mgr.coordinator.holds("a")
    # the caller frees them, last first, as vLLM's scheduler does
    mgr.block_pool.free_blocks(reversed(popped))
    assert mgr.block_pool.get_num_free_blocks() == 31


# -------------------------- names and parameters as vLLM 0.33.0 spells them
def test_single_type_manager_takes_vllms_positional_order(impl):
    """vLLM: (spec, pool, enable_caching, group id, scheduler block size,
    dcp_world_size=1, pcp_world_size=1, needs_kv_cache_zeroing=False,
    max_admission_blocks_per_request=None)."""
    kv = impl.kv_cache
    pool = kv.BlockPool(16, True, BS)
    mgr = kv.FullAttentionManager(full_spec_manager(), pool, True, 0, BS, 1, 1, True, 3)
    assert mgr._max_admission_blocks_per_request == 3
    mgr.allocate_new_blocks("a", 8, 8)
    assert sorted(mgr.take_new_block_ids()) == sorted(b.block_id for b in mgr.req_to_blocks["a"])
    with pytest.raises(NotImplementedError, match="context parallelism"):
        kv.FullAttentionManager(full_spec_manager(), pool, True, 0, BS, 2)
    with pytest.raises(NotImplementedError, match="context parallelism"):
        kv.FullAttentionManager(full_spec_manager(), pool, True, 0, BS, pcp_world_size=2)
    with pytest.raises(TypeError, match="dcp_world_size must be an int"):
        kv.FullAttentionManager(full_spec_manager(), pool, True, 0, BS, dcp_world_size=1.0)


def test_register_all_kvcache_specs():
    import kvcy.single_type_kv_cache_manager as st
    from kvcy.kv_cache_interface import KVCacheSpecRegistry, SinkFullAttentionSpec

    st.register_all_kvcache_specs(None)
    st.register_all_kvcache_specs()  # again: nothing changes
    sink = SinkFullAttentionSpec(block_size=BS, num_kv_heads=1, head_size=8, dtype="float16", sink_len=BS)
    assert KVCacheSpecRegistry.get_manager_class(sink) is st.SinkFullAttentionManager
    assert KVCacheSpecRegistry.get_manager_class(full_spec_manager()) is st.FullAttentionManager
    assert "register_all_kvcache_specs" in st.__all__
