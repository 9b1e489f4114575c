"""The coordinators, which drive one single-type manager per KV-cache group: their factory,
parameters, attributes, checks and hit search, both twins.

(vLLM 0.33.0 has no test module of this name: it tests its coordinators through the manager.)
"""

from __future__ import annotations

import pytest

from kvcy.hashing import get_hash_fn_by_name, init_none_hash
from kvcy.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec, SlidingWindowSpec
from kvcy.hashing import get_request_block_hasher


BS = 4


@pytest.fixture(autouse=True)
def _none_hash():
    init_none_hash(get_hash_fn_by_name("sha256"))


def ids(blocks):
    return [b.block_id for b in blocks]


def _pool_state(pool):
    return (ids(pool.free_block_queue.get_all_free_blocks()), [b.ref_cnt for b in pool.blocks],
            [b.block_hash for b in pool.blocks], sorted(pool.cached_block_hash_to_block.keys()))


def test_coordinator_checks_every_group_before_attaching(impl):
    full = FullAttentionSpec(block_size=BS, num_kv_heads=1, head_size=8, dtype="float16")
    swa = SlidingWindowSpec(block_size=BS, num_kv_heads=1, head_size=8, dtype="float16", sliding_window=64)
    cfg = KVCacheConfig(num_blocks=16, kv_cache_tensors=[],
                        kv_cache_groups=[KVCacheGroupSpec(["f"], full), KVCacheGroupSpec(["s"], swa)])
    mgr = impl.kv_cache.KVCacheManager(cfg, max_model_len=256, scheduler_block_size=BS, hash_block_size=BS)
    coordinator = mgr.coordinator
    free_a, free_b = mgr.block_pool.free_block_queue.get_all_free_blocks()[:2]
    before = _pool_state(mgr.block_pool)
    with pytest.raises(TypeError, match="KVCacheBlock"):
        coordinator.allocate_new_computed_blocks("r", ([free_a], ["x"]), BS, 0)
    assert _pool_state(mgr.block_pool) == before
    assert all("r" not in m.req_to_blocks for m in coordinator.single_type_managers)
    coordinator.allocate_new_computed_blocks("r", ([free_a], [free_b]), BS, 0)
    assert free_a.ref_cnt == free_b.ref_cnt == 1


def full_spec(bs: int = BS) -> FullAttentionSpec:
    return FullAttentionSpec(block_size=bs, num_kv_heads=1, head_size=8, dtype="float16")


def manager(impl, num_blocks=20, max_model_len=40, **kw):
    cfg = KVCacheConfig(num_blocks=num_blocks, kv_cache_tensors=[],
                        kv_cache_groups=[KVCacheGroupSpec(["l0"], full_spec())])
    return impl.kv_cache.KVCacheManager(cfg, max_model_len=max_model_len, scheduler_block_size=BS,
                                        hash_block_size=BS, **kw)


def request(impl, rid, tokens):
    return impl.kv_cache.Request(rid, tokens, block_hasher=get_request_block_hasher(BS, get_hash_fn_by_name("sha256")))


# ------------------------------------------------ the hybrid coordinator's assertion
@pytest.mark.parametrize("hash_block_size", [8, 16])
def test_hybrid_block_sizes_not_divisible_by_the_hash_block_assert_as_vllm(impl, hash_block_size):
    """Full attention (8) beside a sliding window (4) hashed every 8 or 16 tokens:
    vLLM's ``HybridKVCacheCoordinator`` asserts, listing the prefix-cacheable groups'
    block sizes.  kvcy raised ValueError."""
    from kvcy.kv_cache_interface import SlidingWindowSpec

    groups = [KVCacheGroupSpec(["full"], full_spec(8)),
              KVCacheGroupSpec(["swa"], SlidingWindowSpec(block_size=4, num_kv_heads=1, head_size=8, dtype="float16",
                                                          sliding_window=12))]
    cfg = KVCacheConfig(num_blocks=16, kv_cache_tensors=[], kv_cache_groups=groups)
    with pytest.raises(AssertionError) as err:
        impl.kv_cache.KVCacheManager(cfg, max_model_len=64, scheduler_block_size=max(8, hash_block_size),
                                     hash_block_size=hash_block_size)
    assert str(err.value) == ("Each KV cache group's real block_size must be divisible by hash_block_size. "
                              f"block_sizes=[8, 4], hash_block_size={hash_block_size}")
    # without prefix caching there is no hybrid coordinator to assert
    impl.kv_cache.KVCacheManager(cfg, max_model_len=64, scheduler_block_size=max(8, hash_block_size),
                                 hash_block_size=hash_block_size, enable_caching=False)


# ------------------------------------- vLLM's factory signatures (dcp / pcp positional)
def test_coordinator_and_manager_factories_take_vllms_arguments(impl):
    """``get_kv_cache_coordinator`` and the coordinators take vLLM 0.33.0's parameters in
    its order (``dcp_world_size``, ``pcp_world_size`` before the block sizes; kvcy's
    ``use_int_block_hashes`` last); ``get_manager_for_kv_cache_spec`` is vLLM's
    ``(kv_cache_spec, max_in_flight_tokens, max_model_len, role=None, **kwargs)``."""
    from kvcy.kv_cache_interface import SlidingWindowSpec

    kv = impl.kv_cache
    one = KVCacheConfig(num_blocks=16, kv_cache_tensors=[], kv_cache_groups=[KVCacheGroupSpec(["l0"], full_spec())])
    swa = SlidingWindowSpec(block_size=BS, num_kv_heads=1, head_size=8, dtype="float16", sliding_window=8)
    two = KVCacheConfig(num_blocks=16, kv_cache_tensors=[],
                        kv_cache_groups=[KVCacheGroupSpec(["l0"], full_spec()), KVCacheGroupSpec(["l1"], swa)])
    # positionally, as vLLM's KVCacheManager would: (..., events, dcp, pcp, scheduler block, hash block, ...)
    for cfg, caching, expected in ((one, True, kv.UnitaryKVCacheCoordinator), (two, True, kv.HybridKVCacheCoordinator),
                                   (two, False, kv.KVCacheCoordinatorNoPrefixCache)):
        coordinator = kv.get_kv_cache_coordinator(cfg, 64, 64, False, caching, False, 1, 1, BS, BS, None, 0, 3)
        assert type(coordinator) is expected
        assert coordinator.scheduler_block_size == coordinator.hash_block_size == BS
        assert coordinator.num_reprefillable_tokens == 2  # num_prefill_lookahead=3 (after the hash lookahead)
    coordinator = kv.get_kv_cache_coordinator(
        kv_cache_config=two, max_model_len=64, max_in_flight_tokens=64, use_eagle=False, enable_caching=True,
        enable_kv_cache_events=False, dcp_world_size=1, pcp_world_size=1, scheduler_block_size=BS,
        hash_block_size=BS, metrics_collector=None, num_hash_lookahead_tokens=0, num_prefill_lookahead=0,
        allow_partial_hash_hits=True)
    assert [type(m).__name__ for m in coordinator.single_type_managers] == ["FullAttentionManager",
                                                                           "SlidingWindowManager"]
    for dcp, pcp in ((2, 1), (1, 2)):
        with pytest.raises(NotImplementedError, match="context parallelism"):
            kv.get_kv_cache_coordinator(one, 64, 64, False, True, False, dcp, pcp, BS, BS)
        with pytest.raises(NotImplementedError, match="context parallelism"):
            kv.HybridKVCacheCoordinator(two, 64, 64, False, True, False, dcp, pcp, BS, BS)

    manager = kv.get_manager_for_kv_cache_spec(
        kv_cache_spec=swa, max_in_flight_tokens=64, max_model_len=64, role=None, block_pool=coordinator.block_pool,
        enable_caching=True, kv_cache_group_id=1, dcp_world_size=1, pcp_world_size=1, scheduler_block_size=BS,
        needs_kv_cache_zeroing=False)
    assert type(manager) is kv.SlidingWindowManager and manager.kv_cache_group_id == 1
    with pytest.raises(NotImplementedError, match="HiSparse"):
        kv.get_manager_for_kv_cache_spec(swa, 64, 64, "hisparse_source", block_pool=coordinator.block_pool,
                                         enable_caching=True, kv_cache_group_id=1, scheduler_block_size=BS)


def test_coordinator_cacheable_tokens_and_cached_block_events_as_vllm(impl):
    """vLLM's coordinators answer ``get_num_cacheable_tokens(num_computed_tokens, group)``
    (connectors ask it) and ``emit_cached_block_events(request, computed_blocks)``.
    Values recorded from vLLM 0.33.0: EAGLE over full attention (8) + sliding window (4),
    and an MTP drafter re-prefilling 3 tokens."""
    from kvcy.kv_cache_interface import SlidingWindowSpec

    kv = impl.kv_cache
    swa = SlidingWindowSpec(block_size=4, num_kv_heads=1, head_size=8, dtype="float16", sliding_window=12)
    hybrid = KVCacheConfig(num_blocks=32, kv_cache_tensors=[],
                           kv_cache_groups=[KVCacheGroupSpec(["f"], full_spec(8)), KVCacheGroupSpec(["s"], swa)])
    mgr = kv.KVCacheManager(hybrid, max_model_len=64, scheduler_block_size=8, hash_block_size=4, use_eagle=True)
    ns = (0, 3, 8, 13, 17, 25)
    assert [[mgr.coordinator.get_num_cacheable_tokens(n, g) for n in ns] for g in (0, 1)] == \
        [[0, 0, 8, 13, 17, 25], [0, 0, 8, 12, 17, 25]]
    one = KVCacheConfig(num_blocks=32, kv_cache_tensors=[], kv_cache_groups=[KVCacheGroupSpec(["f"], full_spec(8))])
    mtp = kv.KVCacheManager(one, max_model_len=64, scheduler_block_size=8, hash_block_size=8, use_eagle=True,
                            num_prefill_lookahead=3)
    assert [mtp.coordinator.get_num_cacheable_tokens(n, 0) for n in ns] == [0, 1, 6, 11, 15, 23]

    pool_mgr = manager(impl, num_blocks=16, enable_kv_cache_events=True)
    tokens = list(range(100, 113))
    a = request(impl, "a", tokens)
    pool_mgr.allocate_slots(a, 13)
    stored = pool_mgr.take_events()
    blocks, hit, _ = pool_mgr.get_computed_blocks(request(impl, "b", tokens))
    assert hit == 12
    pool_mgr.coordinator.emit_cached_block_events(a, blocks.blocks)
    (again,) = pool_mgr.take_events()
    assert (again.block_hashes, again.parent_block_hash, again.token_ids) == \
        (stored[0].block_hashes, None, tokens[:12])
    pool_mgr.coordinator.emit_cached_block_events(a, ([],))
    assert pool_mgr.take_events() == []


def test_context_parallel_and_group_attributes_as_vllm(impl):
    """Attributes vLLM 0.33.0's coordinators and single-type managers carry (connectors
    read them): ``group_block_sizes``, ``dcp_world_size`` / ``pcp_world_size`` (1 here),
    the hybrid's ``full_attention_group_id`` and each manager's
    ``max_admission_blocks_per_request``; read-only.  Values recorded from vLLM."""
    from kvcy.kv_cache_interface import SlidingWindowSpec

    swa = SlidingWindowSpec(block_size=8, num_kv_heads=1, head_size=8, dtype="float16", sliding_window=12)
    for groups, full_id in (([swa, full_spec(8)], 1), ([full_spec(8), swa], 0)):
        cfg = KVCacheConfig(num_blocks=32, kv_cache_tensors=[],
                            kv_cache_groups=[KVCacheGroupSpec([f"l{i}"], s) for i, s in enumerate(groups)])
        mgr = impl.kv_cache.KVCacheManager(cfg, max_model_len=256, scheduler_block_size=8, hash_block_size=8)
        coordinator = mgr.coordinator
        assert coordinator.group_block_sizes == (8, 8)
        assert coordinator.full_attention_group_id == full_id
        assert (coordinator.dcp_world_size, coordinator.pcp_world_size) == (1, 1)
        caps = [m.max_admission_blocks_per_request for m in coordinator.single_type_managers]
        assert caps == ([33, None] if full_id else [None, 33])  # (max_in_flight_tokens = max_model_len = 256)
        assert all((m.dcp_world_size, m.pcp_world_size) == (1, 1) for m in coordinator.single_type_managers)
        with pytest.raises(AttributeError):
            coordinator.dcp_world_size = 2
        with pytest.raises(AttributeError):
            coordinator.single_type_managers[0].max_admission_blocks_per_request = 5
