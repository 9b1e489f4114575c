"""vLLM 0.33.0 behaviours a drop-in manager must keep (issue 14), run against both twins.

Each is something vLLM tolerates -- a no-op, a clamp or an empty result --
where kvcy used to raise.
"""

from __future__ import annotations

import pytest

from kvcy.hashing import get_hash_fn_by_name, get_request_block_hasher, init_none_hash
from kvcy.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec, SlidingWindowSpec

BS = 4


@pytest.fixture(autouse=True)
def _none_hash():
    init_none_hash(get_hash_fn_by_name("sha256"))


def hasher():
    return get_request_block_hasher(BS, get_hash_fn_by_name("sha256"))


def full_spec():
    return FullAttentionSpec(block_size=BS, num_kv_heads=1, head_size=8, dtype="float16")


def manager(impl, groups=1, num_blocks=16, max_model_len=256, **kw):
    """A manager over ``groups`` groups: full attention, then sliding windows."""
    specs = [full_spec()] + [
        SlidingWindowSpec(block_size=BS, num_kv_heads=1, head_size=8, dtype="float16", sliding_window=8)
        for _ in range(groups - 1)
    ]
    cfg = KVCacheConfig(num_blocks=num_blocks, kv_cache_tensors=[],
                        kv_cache_groups=[KVCacheGroupSpec([f"l{i}"], s) for i, s in enumerate(specs)])
    return impl.kv_cache.KVCacheManager(cfg, max_model_len=max_model_len, scheduler_block_size=BS,
                                        hash_block_size=BS, **kw)


def free_ids(mgr):
    return [b.block_id for b in mgr.block_pool.free_block_queue.get_all_free_blocks()]


# ------------------------------------------------- 1. requests holding no blocks
@pytest.mark.parametrize("groups", [1, 2])
def test_free_and_get_blocks_of_a_request_holding_none(impl, groups):
    """vLLM frees nothing for such a request and reports empty block tables."""
    mgr = manager(impl, groups)
    req = impl.kv_cache.Request("a", list(range(8)), block_hasher=hasher())
    before = free_ids(mgr)
    mgr.free(req)  # never allocated
    assert free_ids(mgr) == before
    empty = mgr.get_blocks("a")
    assert type(empty) is impl.kv_cache.KVCacheBlocks
    assert [list(g) for g in empty.blocks] == [[] for _ in range(groups)]
    assert mgr.get_block_ids("a") == tuple([] for _ in range(groups))

    held = mgr.allocate_slots(req, 8)
    assert held is not None
    assert type(mgr.get_block_ids("a")) is tuple and all(mgr.get_block_ids("a"))
    mgr.free(req)
    after_free = free_ids(mgr)
    mgr.free(req)  # freed already: nothing happens
    assert free_ids(mgr) == after_free
    assert sorted(after_free) == sorted(before)
    assert mgr.get_block_ids("a") == tuple([] for _ in range(groups))
    assert mgr.get_blocks("nope").get_block_ids() == tuple([] for _ in range(groups))
    assert not mgr.coordinator.holds("a")


def test_free_and_get_blocks_still_refuse_what_is_not_a_request(impl):
    mgr = manager(impl)

    class NoStrId:
        request_id = 5

    for call in (lambda: mgr.free(object()), lambda: mgr.free(NoStrId()),
                 lambda: mgr.get_blocks(5), lambda: mgr.get_block_ids(None)):
        with pytest.raises(TypeError):
            call()
    with pytest.raises(TypeError, match="request_id must be a str, got int"):
        mgr.get_blocks(5)
    with pytest.raises(TypeError, match="request_id must be a str, got int"):
        mgr.free(NoStrId())


# ------------------------------------------------- 2. allocate_slots past max_model_len
def _at_end(impl, groups, computed, enable_caching=True):
    """A 16-token request, max_model_len=16, ``computed`` of its tokens already held."""
    mgr = manager(impl, groups, num_blocks=32, max_model_len=16, enable_caching=enable_caching)
    req = impl.kv_cache.Request("a", list(range(16)), block_hasher=hasher())
    if computed:
        assert mgr.allocate_slots(req, computed) is not None
        req.num_computed_tokens = computed
    return mgr, req


@pytest.mark.parametrize("groups", [1, 2])
@pytest.mark.parametrize("enable_caching", [True, False])
def test_allocate_slots_clamps_new_tokens_to_max_model_len(impl, groups, enable_caching):
    """vLLM clamps the slots needed to max_model_len; kvcy used to raise."""
    mgr, req = _at_end(impl, groups, 12, enable_caching)
    new = mgr.allocate_slots(req, 8, num_lookahead_tokens=3)  # 12 + 8 + 3 > 16
    assert new is not None
    assert [len(g) for g in new.get_block_ids()] == [1] * groups  # up to token 16, not 23
    # never more than max_model_len's worth of slots, in any group
    assert len(mgr.get_block_ids("a")[0]) == 16 // BS
    if enable_caching:
        assert len(mgr.block_pool.cached_block_hash_to_block) == groups * 16 // BS


@pytest.mark.parametrize("groups", [1, 2])
def test_allocate_slots_clamps_external_tokens_to_max_model_len(impl, groups):
    mgr, req = _at_end(impl, groups, 0)
    new = mgr.allocate_slots(req, 8, num_external_computed_tokens=12)  # 12 + 8 > 16
    assert new is not None
    assert len(mgr.get_block_ids("a")[0]) == 16 // BS
    assert mgr.block_pool.get_num_free_blocks() == 31 - sum(
        1 for g in mgr.get_block_ids("a") for b in g if b != 0)


def test_allocate_slots_clamp_is_the_same_in_both_twins():
    from kvcy import _fast

    if "cython" not in _fast.available():
        pytest.skip("compiled twins not built")
    runs = {}
    for name in ("cython", "python"):
        impl = type("I", (), {"kv_cache": _fast.load(name)["kv_cache"]})
        out = []
        for groups in (1, 2):
            mgr, req = _at_end(impl, groups, 12)
            out.append(mgr.allocate_slots(req, 8, num_lookahead_tokens=3).get_block_ids())
            out.append(mgr.get_block_ids("a"))
            mgr, req = _at_end(impl, groups, 0)
            out.append(mgr.allocate_slots(req, 8, num_external_computed_tokens=12).get_block_ids())
            out.append((mgr.get_block_ids("a"), free_ids(mgr)))
        runs[name] = out
    assert runs["cython"] == runs["python"]


@pytest.mark.parametrize("kwargs", [{"num_new_tokens": -1}, {"num_new_tokens": 4, "num_lookahead_tokens": -1},
                                    {"num_new_tokens": 4, "num_external_computed_tokens": -4}])
def test_allocate_slots_still_refuses_negative_counts(impl, kwargs):
    mgr, req = _at_end(impl, 1, 12)
    before = free_ids(mgr)
    with pytest.raises(ValueError):
        mgr.allocate_slots(req, **kwargs)
    assert free_ids(mgr) == before


# ------------------------------------------------- 3. external tokens already covered
@pytest.mark.parametrize("enable_caching", [True, False])
def test_external_computed_blocks_already_held_is_a_no_op(impl, enable_caching):
    """A request holding more blocks than its external tokens need: vLLM allocates nothing;
    kvcy refused it with ValueError("num_blocks must be non-negative, got -2")."""
    mgr = manager(impl, enable_caching=enable_caching)
    req = impl.kv_cache.Request("r0", list(range(20)), block_hasher=hasher())
    assert mgr.allocate_slots(req, 20) is not None
    stm = mgr.coordinator.single_type_managers[0]
    held = mgr.get_block_ids("r0")
    before = free_ids(mgr)
    stm.allocate_external_computed_blocks("r0", 3, 7)  # 10 tokens: 3 blocks, 5 held
    stm.allocate_external_computed_blocks("r0", 0, 20)  # exactly the 5 held
    assert mgr.get_block_ids("r0") == held and free_ids(mgr) == before
    stm.allocate_external_computed_blocks("r0", 20, 4)  # one block more: still allocated
    assert len(mgr.get_block_ids("r0")[0]) == 6 and len(free_ids(mgr)) == len(before) - 1


@pytest.mark.parametrize("groups", [1, 2])
def test_allocate_slots_with_external_tokens_inside_held_blocks(impl, groups):
    # (prefix caching on: with it off, vLLM's running request has no cached-block
    # entry and trips an assertion here, as kvcy's Python twin does)
    mgr = manager(impl, groups, num_blocks=32)
    req = impl.kv_cache.Request("r0", list(range(20)), block_hasher=hasher())
    assert mgr.allocate_slots(req, 20) is not None  # 5 blocks held, none computed yet
    held = mgr.get_block_ids("r0")
    before = free_ids(mgr)
    new = mgr.allocate_slots(req, 4, num_external_computed_tokens=4)  # 8 tokens: 2 blocks
    assert new is not None and new.get_block_ids() == tuple([] for _ in range(groups))
    assert mgr.get_block_ids("r0") == held and free_ids(mgr) == before


# ----------------------------- 9. pop_blocks_for_free and free leave the lists alone
@pytest.mark.parametrize("groups", [1, 2])
def test_free_leaves_the_request_block_lists_in_their_order(impl, groups):
    """vLLM frees ``reversed(...)`` of the popped list; the list itself (which
    ``get_blocks`` hands out) keeps its order. kvcy used to reverse it in place."""
    mgr = manager(impl, groups, num_blocks=32)
    req = impl.kv_cache.Request("a", list(range(18)), block_hasher=hasher())
    assert mgr.allocate_slots(req, 18) is not None
    held = mgr.get_blocks("a")
    lists = [list_ for list_ in held.blocks]
    ids = [[b.block_id for b in blocks] for blocks in lists]
    assert all(len(i) == 5 for i in ids)
    mgr.free(req)
    assert [[b.block_id for b in blocks] for blocks in lists] == ids
    assert held.get_block_ids() == tuple(ids)
    if groups == 1:
        # still freed tail first: the four cached blocks end the queue last-first,
        # the unhashed fifth went to the front
        assert free_ids(mgr)[-4:] == ids[0][3::-1]
        assert free_ids(mgr)[0] == ids[0][4]


def test_pop_blocks_for_free_leaves_out_leading_null_blocks(impl):
    """A sliding window's skipped prefix is null blocks at the head of its table;
    vLLM's pop_blocks_for_free returns the blocks without them (trim_null_head)."""
    mgr = manager(impl, groups=2, num_blocks=32)
    req = impl.kv_cache.Request("a", list(range(24)), block_hasher=hasher())
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
    mgr = kv.FullAttentionManager(full_spec(), pool, True, 0, BS, 1, 1, True, 3)
    assert mgr._max_admission_blocks_per_request == 3
    mgr.allocate_new_blocks("a", 8, 8)
    assert sorted(mgr.take_new_block_ids()) == sorted(b.block_id for b in mgr.req_to_blocks["a"])
    cp = kv.FullAttentionManager(full_spec(), pool, True, 0, BS, 2, 3)
    assert (cp.dcp_world_size, cp.pcp_world_size, cp.block_size) == (2, 3, 2 * BS)
    with pytest.raises(TypeError, match="dcp_world_size must be an int"):
        kv.FullAttentionManager(full_spec(), pool, True, 0, BS, dcp_world_size=1.0)


def test_kv_cache_block_is_null_keyword(impl):
    kv = impl.kv_cache
    assert kv.KVCacheBlock(3, is_null=True).is_null is True
    assert kv.KVCacheBlock(3).is_null is False
    with pytest.raises(TypeError, match="is_null must be a bool"):
        kv.KVCacheBlock(3, is_null=1)


def test_register_all_kvcache_specs():
    import kvcy.single_type_kv_cache_manager as st
    from kvcy.kv_cache_interface import KVCacheSpecRegistry, SinkFullAttentionSpec

    st.register_all_kvcache_specs(None)
    st.register_all_kvcache_specs()  # again: nothing changes
    sink = SinkFullAttentionSpec(block_size=BS, num_kv_heads=1, head_size=8, dtype="float16", sink_len=BS)
    assert KVCacheSpecRegistry.get_manager_class(sink) is st.SinkFullAttentionManager
    assert KVCacheSpecRegistry.get_manager_class(full_spec()) is st.FullAttentionManager
    assert "register_all_kvcache_specs" in st.__all__


def test_manager_checks_context_parallel_sizes_as_its_groups_do(impl):
    """One check for dcp / pcp sizes, in the manager and each single-type manager: a
    non-int is a TypeError (1.0 used to pass the manager's ``!= 1`` test)."""
    cfg = KVCacheConfig(num_blocks=16, kv_cache_tensors=[], kv_cache_groups=[KVCacheGroupSpec(["a"], full_spec())])
    make = impl.kv_cache.KVCacheManager
    with pytest.raises(TypeError, match="dcp_world_size must be an int, got float"):
        make(cfg, 64, BS, BS, dcp_world_size=1.0)
    with pytest.raises(ValueError, match="pcp_world_size must be a positive int, got 0"):
        make(cfg, 64, BS, BS, pcp_world_size=0)
    assert make(cfg, 64, BS, BS, pcp_world_size=2).coordinator.single_type_managers[0].pcp_world_size == 2
    assert make(cfg, 64, BS, BS, dcp_world_size=1, pcp_world_size=1) is not None
