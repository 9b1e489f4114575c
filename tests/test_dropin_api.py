"""vLLM 0.33.0's ``KVCacheManager`` surface, as its ``Scheduler`` drives it (issue 14).

Both twins.  The expected values were read from vLLM 0.33.0 itself (its
``kv_cache_manager.py``, ``kv_cache_coordinator.py``,
``single_type_kv_cache_manager.py`` and ``block_pool.py``, and the same
calls run on vLLM's CPU build): the names, keywords and results a scheduler
written for vLLM relies on.
"""

from __future__ import annotations

import inspect
import logging

import pytest

from kvcy._request_types import MultiModalFeatureSpec, PlaceholderRange
from kvcy.hashing import get_hash_fn_by_name, get_request_block_hasher, init_none_hash
from kvcy.kv_cache_interface import (
    FullAttentionSpec,
    KVCacheConfig,
    KVCacheGroupSpec,
    MambaSpec,
    SlidingWindowSpec,
)

BS = 4
SHA = get_hash_fn_by_name("sha256")


@pytest.fixture(autouse=True)
def _none_hash():
    init_none_hash(SHA)


def full_spec():
    return FullAttentionSpec(block_size=BS, num_kv_heads=1, head_size=8, dtype="float16")


def swa_spec():
    return SlidingWindowSpec(block_size=BS, num_kv_heads=1, head_size=8, dtype="float16", sliding_window=8)


def mamba_spec():
    return MambaSpec(block_size=BS, shapes=((2,),), dtypes=("float32",))


def config(specs, num_blocks=16):
    return KVCacheConfig(num_blocks=num_blocks, kv_cache_tensors=[],
                         kv_cache_groups=[KVCacheGroupSpec([f"l{i}"], s) for i, s in enumerate(specs)])


def manager(impl, specs=None, num_blocks=16, **kw):
    specs = [full_spec()] if specs is None else specs
    return impl.kv_cache.KVCacheManager(config(specs, num_blocks), max_model_len=64, scheduler_block_size=BS,
                                        hash_block_size=BS, **kw)


def request(impl, rid, tokens, lookahead=0, **kw):
    return impl.kv_cache.Request(rid, list(tokens), block_hasher=get_request_block_hasher(BS, SHA, lookahead), **kw)


def cached_flags(mgr, rid, group=0):
    return [b.block_hash is not None for b in mgr.get_blocks(rid).blocks[group]]


# ----------------------------------------------------------------- 1. constructor
# vLLM 0.33.0's KVCacheManager.__init__, in order.
VLLM_INIT = [
    "kv_cache_config", "max_model_len", "scheduler_block_size", "hash_block_size", "max_in_flight_tokens",
    "enable_caching", "use_eagle", "num_hash_lookahead_tokens", "num_prefill_lookahead", "log_stats",
    "enable_kv_cache_events", "dcp_world_size", "pcp_world_size", "metrics_collector", "watermark",
    "enable_mamba_shared_prefix_checkpoint",
]


def test_constructor_parameters_are_vllms_in_vllms_order(impl):
    cfg = config([full_spec()])
    mgr = impl.kv_cache.KVCacheManager(cfg, 64, BS, BS, 32, True, True, 0, 3, True, False, 1, 1, None, 0.5, False)
    assert (mgr.max_model_len, mgr.enable_caching, mgr.use_eagle, mgr.log_stats) == (64, True, True, True)
    assert mgr.coordinator.num_reprefillable_tokens == 2
    assert (mgr.enable_kv_cache_events, mgr.metrics_collector, mgr.watermark_blocks) == (False, None, 8)
    assert mgr.mamba_shared_prefix_checkpoint is False
    if impl.name == "python":  # (a compiled class's __init__ has no introspectable signature)
        params = [p for p in inspect.signature(impl.kv_cache.KVCacheManager.__init__).parameters if p != "self"]
        assert params[: len(VLLM_INIT)] == VLLM_INIT


def test_constructor_as_vllms_scheduler_calls_it(impl):
    """The keywords of scheduler.py's KVCacheManager(...) call, and what it reads back."""
    mgr = impl.kv_cache.KVCacheManager(
        kv_cache_config=config([full_spec(), swa_spec()]),
        max_model_len=64,
        max_in_flight_tokens=32,
        enable_caching=True,
        use_eagle=False,
        num_hash_lookahead_tokens=0,
        num_prefill_lookahead=0,
        log_stats=True,
        enable_kv_cache_events=False,
        dcp_world_size=1,
        pcp_world_size=1,
        scheduler_block_size=BS,
        hash_block_size=BS,
        metrics_collector=None,
        watermark=0.0,
        enable_mamba_shared_prefix_checkpoint=True,
    )
    assert mgr.mamba_shared_prefix_checkpoint is False  # needs fine-grained partial hits
    assert mgr.retained_hit_group_ids == ()
    assert mgr.coordinator.enable_partial_hash_hits is False
    assert mgr.coordinator.num_reprefillable_tokens == 0
    assert mgr.coordinator.drop_eagle_group_ids == set()


@pytest.mark.parametrize("use_eagle", [False, True])
@pytest.mark.parametrize("num_prefill_lookahead, reprefillable", [(0, 0), (1, 0), (3, 2)])
def test_coordinator_attributes(impl, use_eagle, num_prefill_lookahead, reprefillable):
    mgr = manager(impl, [full_spec(), swa_spec()], use_eagle=use_eagle, num_prefill_lookahead=num_prefill_lookahead)
    assert mgr.coordinator.num_reprefillable_tokens == reprefillable
    assert mgr.coordinator.drop_eagle_group_ids == ({0, 1} if use_eagle else set())
    assert mgr.coordinator.eagle_group_ids == ({0, 1} if use_eagle else set())


def test_flagged_eagle_groups_drop_nothing_without_use_eagle(impl):
    """vLLM: groups flagged ``is_eagle_group`` stay flagged, but only ``use_eagle`` drops a block."""
    cfg = KVCacheConfig(num_blocks=16, kv_cache_tensors=[],
                        kv_cache_groups=[KVCacheGroupSpec(["l0"], full_spec(), is_eagle_group=True)])
    mgr = impl.kv_cache.KVCacheManager(cfg, max_model_len=64, scheduler_block_size=BS, hash_block_size=BS)
    assert mgr.coordinator.eagle_group_ids == {0}
    assert mgr.coordinator.drop_eagle_group_ids == set()
    first = request(impl, "a", range(13))
    mgr.allocate_slots(first, 13)
    second = request(impl, "b", range(13))
    _, hit, _ = mgr.get_computed_blocks(second)
    assert hit == 12  # vLLM: 3 blocks; with the EAGLE drop it would be 8


@pytest.mark.parametrize("name", ["mamba_shared_prefix_checkpoint", "retained_hit_group_ids"])
def test_new_manager_attributes_are_read_only(impl, name):
    mgr = manager(impl)
    with pytest.raises(AttributeError):
        setattr(mgr, name, True)


@pytest.mark.parametrize("name", ["num_reprefillable_tokens", "drop_eagle_group_ids", "enable_partial_hash_hits"])
def test_new_coordinator_attributes_are_read_only(impl, name):
    mgr = manager(impl)
    with pytest.raises(AttributeError):
        setattr(mgr.coordinator, name, 5)


def test_context_parallel_world_sizes_reach_the_managers(impl):
    # A dcp-sharded group's block spans block_size * dcp tokens: the unitary
    # coordinator then wants hashes (and scheduling) at that span, as vLLM does.
    with pytest.raises(AssertionError, match="hash_block_size == block_size"):
        manager(impl, dcp_world_size=2)
    mgr = impl.kv_cache.KVCacheManager(config([full_spec()]), max_model_len=64, scheduler_block_size=2 * BS,
                                       hash_block_size=2 * BS, dcp_world_size=2, pcp_world_size=3)
    (m,) = mgr.coordinator.single_type_managers
    assert (m.dcp_world_size, m.pcp_world_size, m.block_size) == (2, 3, 2 * BS)
    assert (mgr.coordinator.dcp_world_size, mgr.coordinator.pcp_world_size) == (2, 3)
    # A replicated (not dcp-sharded) group keeps its block size and world sizes of 1.
    mgr = manager(impl, [mamba_spec()], enable_caching=False, dcp_world_size=4, pcp_world_size=2)
    (m,) = mgr.coordinator.single_type_managers
    assert (m.dcp_world_size, m.pcp_world_size, m.block_size) == (1, 1, BS)


@pytest.mark.parametrize("kw, exc, match", [({"dcp_world_size": 0}, ValueError, "dcp_world_size must be a positive"),
                                            ({"pcp_world_size": -1}, ValueError, "pcp_world_size must be a positive"),
                                            ({"dcp_world_size": 2.0}, TypeError, "dcp_world_size must be an int")])
def test_context_parallel_world_sizes_are_checked(impl, kw, exc, match):
    with pytest.raises(exc, match=match):
        manager(impl, **kw)


def test_watermark_is_only_asserted_non_negative(impl):
    with pytest.raises(AssertionError, match="watermark must be non-negative"):
        manager(impl, watermark=-0.1)
    assert manager(impl, watermark=1.5).watermark_blocks == 24  # int(1.5 * 16), as in vLLM
    assert manager(impl, watermark=0.5).watermark_blocks == 8


@pytest.mark.parametrize("kw", [{"num_hash_lookahead_tokens": -1}, {"num_prefill_lookahead": -2},
                                {"num_hash_lookahead_tokens": 1.5}, {"num_prefill_lookahead": "2"}])
def test_lookahead_counts_are_checked(impl, kw):
    with pytest.raises(ValueError, match="must be a non-negative int"):
        manager(impl, **kw)


# ------------------------------------------------- num_prefill_lookahead (MTP re-prefill)
@pytest.mark.parametrize("use_eagle", [True, False])
@pytest.mark.parametrize("num_prefill_lookahead, flags", [
    (3, [True, True, False, False]),  # 13 - 2 re-prefillable tokens: 2 full blocks
    (1, [True, True, True, False]),
    (0, [True, True, True, False]),
])
def test_prefill_lookahead_caches_only_finalized_tokens(impl, use_eagle, num_prefill_lookahead, flags):
    mgr = manager(impl, use_eagle=use_eagle, num_prefill_lookahead=num_prefill_lookahead)
    req = request(impl, "a", range(13))
    assert mgr.allocate_slots(req, 13) is not None
    assert cached_flags(mgr, "a") == flags
    mgr.cache_blocks(req, 13)
    assert cached_flags(mgr, "a") == flags


def test_prefill_lookahead_in_a_hybrid_with_eagle(impl):
    mgr = manager(impl, [full_spec(), swa_spec()], use_eagle=True, num_prefill_lookahead=3)
    req = request(impl, "a", range(13))
    assert mgr.allocate_slots(req, 13) is not None
    assert cached_flags(mgr, "a", 0) == [True, True, False, False]
    assert cached_flags(mgr, "a", 1) == [True, True, False, False]


def test_multi_module_mtp_needs_a_scheduler_block_as_long_as_its_lookahead(impl):
    with pytest.raises(ValueError, match="Multi-module MTP"):
        manager(impl, use_eagle=True, num_prefill_lookahead=5)
    manager(impl, use_eagle=True, num_prefill_lookahead=5, enable_caching=False)  # no caching: fine
    manager(impl, use_eagle=False, num_prefill_lookahead=5)  # no EAGLE group: fine


# ------------------------------------------------- num_hash_lookahead_tokens: events
def test_hash_lookahead_reaches_the_events(impl):
    mgr = manager(impl, num_hash_lookahead_tokens=2, enable_kv_cache_events=True)
    assert mgr.block_pool.num_hash_lookahead_tokens == 2
    req = request(impl, "b", range(100, 111), lookahead=2)
    assert len(req.block_hashes) == 2
    mgr.allocate_slots(req, 11)
    (event,) = mgr.take_events()
    assert event.token_ids == list(range(100, 108))
    assert event.lookahead_token_ids == [[104, 105], [108, 109]]
    assert event.extra_keys is None or event.extra_keys == [None, None]


def test_hash_lookahead_event_extra_keys_cover_the_lookahead(impl):
    """A block's event keys are those of the block and its lookahead tokens, as its hash's are."""
    mgr = manager(impl, num_hash_lookahead_tokens=2, enable_kv_cache_events=True)
    image = MultiModalFeatureSpec("img", PlaceholderRange(offset=8, length=2))
    req = request(impl, "b", range(100, 111), lookahead=2, mm_features=[image])
    mgr.allocate_slots(req, 11)
    (event,) = mgr.take_events()
    # Block 1 (tokens 4-7) looks ahead at tokens 8-9: the image, 4 tokens into the block.
    assert event.extra_keys == [None, (("img", 4),)]
    assert event.lookahead_token_ids == [[104, 105], [108, 109]]


def test_no_lookahead_no_lookahead_token_ids(impl):
    mgr = manager(impl, enable_kv_cache_events=True)
    mgr.allocate_slots(request(impl, "a", range(9)), 9)
    (event,) = mgr.take_events()
    assert event.lookahead_token_ids is None


def test_block_pool_takes_vllms_keywords(impl):
    pool = impl.kv_cache.BlockPool(8, True, BS, enable_kv_cache_events=True, metrics_collector=None,
                                   num_hash_lookahead_tokens=3, medium="CPU")
    assert (pool.num_hash_lookahead_tokens, pool.medium) == (3, "CPU")
    assert impl.kv_cache.BlockPool(8, True, BS).medium == "GPU"
    req = request(impl, "a", range(8))
    blocks = pool.get_new_blocks(2)
    pool.cache_full_blocks(req, blocks, 0, 2, BS, 0)
    (event,) = pool.take_events()
    assert event.medium == "CPU"
    with pytest.raises(ValueError, match="num_hash_lookahead_tokens must be a non-negative int"):
        impl.kv_cache.BlockPool(8, True, BS, num_hash_lookahead_tokens=-1)


def test_block_pool_parameters_in_vllms_order(impl):
    pool = impl.kv_cache.BlockPool(8, True, BS, True, None, 3, "CPU")
    assert (pool.enable_kv_cache_events, pool.num_hash_lookahead_tokens, pool.medium) == (True, 3, "CPU")


# ----------------------------------------------------------------- 2. stats
def test_get_computed_blocks_no_longer_records_stats(impl):
    """vLLM 0.33.0's scheduler records them, at admission, with record_prefix_cache_stats."""
    mgr = manager(impl, log_stats=True)
    mgr.allocate_slots(request(impl, "a", range(10)), 10)
    req = request(impl, "b", range(10))
    _, hit, _ = mgr.get_computed_blocks(req)
    assert hit == 8
    assert mgr.prefix_cache_stats.requests == 0
    mgr.record_prefix_cache_stats(req, hit)
    stats = mgr.make_prefix_cache_stats()
    assert (stats.requests, stats.queries, stats.hits) == (1, 10, 8)
    req.num_preemptions = 1
    mgr.record_prefix_cache_stats(req, 4)
    stats = mgr.make_prefix_cache_stats()
    assert (stats.preempted_requests, stats.preempted_queries, stats.preempted_hits) == (1, 10, 4)
    assert (stats.requests, stats.queries, stats.hits) == (0, 0, 0)


def test_record_prefix_cache_stats_skips_what_did_not_look_up(impl):
    mgr = manager(impl, log_stats=True)
    mgr.record_prefix_cache_stats(request(impl, "a", range(10), skip_reading_prefix_cache=True), 0)
    assert mgr.make_prefix_cache_stats().requests == 0
    off = manager(impl, log_stats=True, enable_caching=False)
    off.record_prefix_cache_stats(request(impl, "a", range(10)), 0)
    assert off.make_prefix_cache_stats().requests == 0
    quiet = manager(impl)
    quiet.record_prefix_cache_stats(request(impl, "a", range(10)), 0)  # no stats kept: nothing happens
    assert quiet.make_prefix_cache_stats() is None


def test_prefix_cache_lookup_enabled(impl):
    assert manager(impl).prefix_cache_lookup_enabled(request(impl, "a", range(4))) is True
    skip = request(impl, "a", range(4), skip_reading_prefix_cache=True)
    assert manager(impl).prefix_cache_lookup_enabled(skip) is False
    assert manager(impl, enable_caching=False).prefix_cache_lookup_enabled(request(impl, "a", range(4))) is False


# ----------------------------------------------------------------- lookups
@pytest.mark.parametrize("specs", [[full_spec()], [full_spec(), swa_spec()]])
def test_get_computed_blocks_max_cache_hit_length(impl, specs):
    mgr = manager(impl, specs)
    mgr.allocate_slots(request(impl, "a", range(13)), 13)
    req = request(impl, "b", range(13))
    assert mgr.get_computed_blocks(req)[1] == 12
    blocks, hit, boundary = mgr.get_computed_blocks(req, max_cache_hit_length=6)
    assert (hit, boundary) == (4, 0)
    assert [len(g) for g in blocks.blocks][0] == 1
    assert mgr.get_computed_blocks(req, 0)[1] == 0
    assert mgr.get_computed_blocks(req, max_cache_hit_length=None)[1] == 12


def test_get_computed_blocks_for_connector_without_a_hybrid_mamba(impl):
    mgr = manager(impl)
    mgr.allocate_slots(request(impl, "a", range(10)), 10)
    blocks, hit, boundary, diverged = mgr.get_computed_blocks_for_connector(request(impl, "b", range(10)))
    assert (hit, boundary, diverged) == (8, 0, False)
    assert blocks.get_block_ids() == ([1, 2],)


def test_get_block_ids_for_computed_tokens(impl):
    mgr = manager(impl, [full_spec(), swa_spec()])
    mgr.allocate_slots(request(impl, "c", range(10)), 10)
    full, swa = mgr.get_block_ids("c")
    assert mgr.get_block_ids_for_computed_tokens("c", 5) == (full[:2], swa[:2])
    assert mgr.get_block_ids_for_computed_tokens("c", 0) == ([], [])
    assert mgr.get_block_ids_for_computed_tokens("c", 100) == (full, swa)
    assert mgr.get_block_ids_for_computed_tokens("nobody", 8) == ([], [])


def test_get_block_ids_for_computed_tokens_leaves_mamba_whole(impl):
    mgr = manager(impl, [full_spec(), mamba_spec()], enable_caching=False)
    mgr.allocate_slots(request(impl, "c", range(10)), 10)
    full, mamba = mgr.get_block_ids("c")
    assert mgr.get_block_ids_for_computed_tokens("c", 4) == (full[:1], mamba)


def test_estimate_cached_tokens(impl):
    mgr = manager(impl, [full_spec(), swa_spec()])
    req = request(impl, "c", range(10))
    assert mgr.estimate_cached_tokens(req) == 0
    mgr.allocate_slots(req, 10)
    assert mgr.estimate_cached_tokens(req) == 8
    req2 = request(impl, "d", range(10))
    mgr.allocate_slots(req2, 10, delay_cache_blocks=True)
    assert mgr.estimate_cached_tokens(req2) == 0
    off = manager(impl, enable_caching=False)
    off.allocate_slots(req, 10)
    assert off.estimate_cached_tokens(req) == 0


def test_cache_blocks_on_the_manager(impl):
    mgr = manager(impl)
    req = request(impl, "a", range(10))
    mgr.allocate_slots(req, 10, delay_cache_blocks=True)
    assert cached_flags(mgr, "a") == [False, False, False]
    mgr.cache_blocks(req, 4)
    assert cached_flags(mgr, "a") == [True, False, False]
    mgr.cache_blocks(req, 10)
    assert cached_flags(mgr, "a") == [True, True, False]
    off = manager(impl, enable_caching=False)
    off.allocate_slots(req, 10)
    off.cache_blocks(req, 10)  # caching off: nothing
    assert cached_flags(off, "a") == [False, False, False]


def test_truncate_computed_blocks(impl):
    mgr = manager(impl, [full_spec(), swa_spec()])
    mgr.allocate_slots(request(impl, "a", range(10)), 10)
    blocks, hit, _ = mgr.get_computed_blocks(request(impl, "b", range(10)))
    assert hit == 8
    ids = blocks.get_block_ids()
    cut = mgr.truncate_computed_blocks(blocks, 4)
    assert cut.get_block_ids() == (ids[0][:1], ids[1][:1])
    assert blocks.get_block_ids() == ids  # a view: the argument is not changed
    assert mgr.truncate_computed_blocks(blocks, 0) is mgr.empty_kv_cache_blocks
    with pytest.raises(AssertionError):
        mgr.truncate_computed_blocks(blocks, 6)  # not block-aligned
    with pytest.raises(AssertionError):
        mgr.truncate_computed_blocks(blocks, 12)  # more than the hit


# ----------------------------------------------------------------- KV-cache zeroing
def test_new_block_ids_are_recorded_for_zeroing(impl):
    """A cache with Mamba layers is zeroed (KVCacheConfig.needs_kv_cache_zeroing): the
    attention group's new blocks are reported; Mamba's are not."""
    mgr = manager(impl, [full_spec(), mamba_spec()], num_blocks=32, enable_caching=False)
    assert mgr.kv_cache_config.needs_kv_cache_zeroing
    req = request(impl, "a", range(10))
    mgr.allocate_slots(req, 10)
    full = mgr.get_block_ids("a")[0]
    assert mgr.take_new_block_ids() == full
    assert mgr.take_new_block_ids() == []
    mgr.record_blocks_for_zeroing("a", 4)
    assert mgr.take_new_block_ids() == full[1:]
    with pytest.raises(AssertionError):
        mgr.record_blocks_for_zeroing("a", 3)
    # External tokens' blocks too, unless their group is skipped.
    ext = request(impl, "b", range(50, 60))
    new = mgr.allocate_slots(ext, 2, num_external_computed_tokens=8)
    assert mgr.take_new_block_ids() == mgr.get_block_ids("b")[0]
    skipped = request(impl, "c", range(70, 80))
    new = mgr.allocate_slots(skipped, 2, num_external_computed_tokens=8, skip_zeroing_group_ids=(0,))
    assert mgr.take_new_block_ids() == new.get_block_ids()[0]
    assert len(mgr.get_block_ids("c")[0]) == 3


@pytest.mark.parametrize("enable_caching", [True, False])
def test_nothing_recorded_when_nothing_is_zeroed(impl, enable_caching):
    mgr = manager(impl, enable_caching=enable_caching)
    assert not mgr.kv_cache_config.needs_kv_cache_zeroing
    mgr.allocate_slots(request(impl, "a", range(10)), 10)
    assert mgr.take_new_block_ids() == []
    mgr.record_blocks_for_zeroing("a", 0)
    assert mgr.take_new_block_ids() == []


def test_no_copies_or_boundary_states_without_partial_hits(impl):
    mgr = manager(impl)
    req = request(impl, "a", range(10))
    mgr.allocate_slots(req, 10)
    assert mgr.take_kv_cache_block_copies() == ([], [])
    assert mgr.take_boundary_state_offloads() == {}
    assert mgr.finalize_partial_tail_offloads(req) == []


# ----------------------------------------------------------------- 3. changed signatures
def test_get_num_common_prefix_blocks_is_always_zero(impl):
    """Deprecated in vLLM 0.33.0 (cascade attention is gone): zero per group."""
    mgr = manager(impl, [full_spec(), swa_spec()])
    for rid in ("a", "b"):
        req = request(impl, rid, range(13))
        blocks, hit, _ = mgr.get_computed_blocks(req)
        mgr.allocate_slots(req, 13 - hit, num_new_computed_tokens=hit, new_computed_blocks=blocks)
    assert mgr.get_num_common_prefix_blocks("a") == [0, 0]
    assert manager(impl).get_num_common_prefix_blocks("nobody") == [0]


def test_remove_skipped_blocks_takes_num_prompt_tokens(impl):
    mgr = manager(impl, [full_spec(), swa_spec()])
    req = request(impl, "a", range(20))
    mgr.allocate_slots(req, 20)
    mgr.remove_skipped_blocks("a", 20, 20)
    mgr.coordinator.remove_skipped_blocks("a", 20, num_prompt_tokens=20)
    assert mgr.get_block_ids("a")[1][:3] == [0, 0, 0]
    mgr.remove_skipped_blocks("a", 20, num_prompt_tokens=None)


def test_coordinator_get_num_blocks_to_allocate_by_keyword(impl):
    """How scheduler.py's _request_remaining_blocks calls it."""
    mgr = manager(impl)
    req = request(impl, "a", range(10))
    n = mgr.coordinator.get_num_blocks_to_allocate(
        request_id=req.request_id, num_tokens=10, new_computed_blocks=mgr.empty_kv_cache_blocks.blocks,
        num_encoder_tokens=0, total_computed_tokens=0, num_local_computed_tokens=0, num_tokens_main_model=10,
        apply_admission_cap=True, prefill_end=10,
    )
    assert n == 3


def test_allocate_slots_takes_skip_zeroing_group_ids(impl):
    params = inspect.signature(impl.kv_cache.KVCacheManager.allocate_slots).parameters
    assert list(params)[-1] == "skip_zeroing_group_ids"
    mgr = manager(impl)
    assert mgr.allocate_slots(request(impl, "a", range(10)), 10, skip_zeroing_group_ids=(0,)) is not None


def test_kv_cache_blocks_group_ids(impl):
    mgr = manager(impl, [full_spec(), swa_spec()])
    blocks = mgr.allocate_slots(request(impl, "a", range(10)), 10)
    full, swa = blocks.get_block_ids()
    assert blocks.get_block_ids(group_ids=[1]) == (swa,)
    assert blocks.get_block_ids(group_ids=(1, 0)) == (swa, full)
    assert blocks.get_block_ids(True, group_ids=[0]) == (full,)
    assert mgr.empty_kv_cache_blocks.get_block_ids(allow_none=True, group_ids=[1]) is None
    assert mgr.empty_kv_cache_blocks.get_block_ids(group_ids=[]) == ()
    with pytest.raises(TypeError):
        blocks.get_block_ids(False, [0])  # keyword only, as in vLLM


def test_kv_cache_blocks_unhashed_ids(impl):
    mgr = manager(impl, [full_spec(), swa_spec()])
    mgr.allocate_slots(request(impl, "a", range(10)), 10)
    blocks = mgr.get_blocks("a")

    def unhashed(group):
        return [b.block_id for b in group if b.block_hash is None and not b.is_null]

    full = blocks.get_block_ids()[0]
    assert unhashed(blocks.blocks[0]) == [full[2]]
    assert blocks.get_unhashed_block_ids_all_groups() == [unhashed(g) for g in blocks.blocks]
    with pytest.raises(AssertionError, match="Only one group is supported"):
        blocks.get_unhashed_block_ids()
    # Leading null blocks (a sliding window's skipped prefix) are left out.
    mgr.remove_skipped_blocks("a", 12)
    after = mgr.get_blocks("a")
    assert after.get_block_ids()[1][0] == 0
    assert after.get_unhashed_block_ids_all_groups() == [unhashed(g) for g in after.blocks]
    assert after.get_unhashed_block_ids_all_groups()[0] == [full[2]]


def test_take_events_warns_about_an_unknown_group(impl, caplog):
    mgr = manager(impl, enable_kv_cache_events=True)
    req = request(impl, "a", range(8))
    blocks = mgr.block_pool.get_new_blocks(2)
    mgr.block_pool.cache_full_blocks(req, blocks, 0, 2, BS, 3)
    with caplog.at_level(logging.WARNING, logger="kvcy"):
        (event,) = mgr.take_events()
    assert event.group_idx == 3 and event.kv_cache_spec_kind is None
    assert "Group index `3` not in KV cache metadata" in caplog.text


# ----------------------------------------------------------------- the method surface
# Every KVCacheManager method vLLM 0.33.0's scheduler calls, with vLLM's parameters.
VLLM_METHODS = {
    "get_computed_blocks": ["request", "max_cache_hit_length"],
    "get_computed_blocks_for_connector": ["request", "max_cache_hit_length"],
    "allocate_slots": ["request", "num_new_tokens", "num_new_computed_tokens", "new_computed_blocks",
                       "num_lookahead_tokens", "num_external_computed_tokens", "delay_cache_blocks",
                       "num_encoder_tokens", "full_sequence_must_fit", "reserved_blocks", "has_scheduled_reqs",
                       "skip_zeroing_group_ids"],
    "free": ["request"],
    "remove_skipped_blocks": ["request_id", "processed_computed_tokens", "num_prompt_tokens"],
    "pop_blocks_for_free": ["request"],
    "evict_blocks": ["block_ids"],
    "reset_prefix_cache": [],
    "get_num_common_prefix_blocks": ["running_request_id"],
    "take_events": [],
    "get_blocks": ["request_id"],
    "get_block_ids": ["request_id"],
    "get_block_ids_for_computed_tokens": ["request_id", "num_computed_tokens"],
    "estimate_cached_tokens": ["request"],
    "cache_blocks": ["request", "num_computed_tokens"],
    "create_kv_cache_blocks": ["blocks"],
    "truncate_computed_blocks": ["blocks", "num_computed_tokens"],
    "take_new_block_ids": [],
    "record_blocks_for_zeroing": ["request_id", "start_token"],
    "take_kv_cache_block_copies": [],
    "take_boundary_state_offloads": [],
    "finalize_partial_tail_offloads": ["request"],
    "new_step_starts": [],
    "make_prefix_cache_stats": [],
    "prefix_cache_lookup_enabled": ["request"],
    "record_prefix_cache_stats": ["request", "num_hits"],
}


@pytest.mark.parametrize("name", sorted(VLLM_METHODS))
def test_manager_methods_have_vllms_parameters(impl, name):
    method = getattr(impl.kv_cache.KVCacheManager, name)
    params = [p for p in inspect.signature(method).parameters if p != "self"]
    assert params == VLLM_METHODS[name]


def test_hash_lookahead_caches_only_the_blocks_that_have_hashes(impl):
    """With lookahead a block's hash waits for the tokens after it; vLLM caches only the
    blocks that have hashes, and the rest once they get them."""
    mgr = manager(impl, num_hash_lookahead_tokens=2)
    req = request(impl, "a", range(12), lookahead=2)
    assert len(req.block_hashes) == 2  # block 2 needs tokens 12 and 13
    assert mgr.allocate_slots(req, 12) is not None
    assert cached_flags(mgr, "a") == [True, True, False]
    req.num_computed_tokens = 12
    req.append_output_token_ids([12, 13])
    assert len(req.block_hashes) == 3
    mgr.cache_blocks(req, 12)
    assert cached_flags(mgr, "a") == [True, True, True]


def test_cache_blocks_of_a_request_holding_none_does_nothing(impl):
    mgr = manager(impl)
    mgr.cache_blocks(request(impl, "a", range(8)), 8)
    assert mgr.get_block_ids("a") == ([],)
    with pytest.raises(ValueError):
        mgr.cache_blocks(request(impl, "a", range(8)), -1)


@pytest.mark.parametrize("specs", [[full_spec()], [full_spec(), swa_spec()]])
def test_blocks_without_hashes_are_not_cached(impl, specs):
    """A request with fewer hashes than full blocks (its hasher lags, or none was given):
    vLLM caches the blocks that have hashes and raises nothing."""
    mgr = manager(impl, specs, num_blocks=32)
    req = request(impl, "a", range(13))
    del req.block_hashes[1:]
    assert mgr.allocate_slots(req, 13) is not None
    assert cached_flags(mgr, "a") == [True, False, False, False]
    bare = impl.kv_cache.Request("b", list(range(13)))  # no hasher: no hashes at all
    assert mgr.allocate_slots(bare, 13) is not None
    assert cached_flags(mgr, "b") == [False] * 4


def test_block_stored_carries_the_request_session(impl):
    """vLLM's pool fills BlockStored.session_id from the request (kvcy's Request takes one, None
    by default, as vLLM's)."""
    mgr = manager(impl, enable_kv_cache_events=True)
    mgr.allocate_slots(request(impl, "a", range(8), session_id="chat-7"), 8)
    mgr.allocate_slots(request(impl, "b", range(100, 108)), 8)
    assert [e.session_id for e in mgr.take_events()] == ["chat-7", None]


def test_stats_object_set_to_none_is_asserted_as_in_vllm(impl):
    """vLLM 0.33.0 asserts ``prefix_cache_stats is not None`` (a public attribute)
    before recording or flagging a reset; the reset changes nothing first here."""
    mgr = manager(impl, log_stats=True)
    req = request(impl, "a", range(10))
    mgr.allocate_slots(req, 10)
    mgr.free(req)
    mgr.prefix_cache_stats = None
    with pytest.raises(AssertionError):
        mgr.record_prefix_cache_stats(req, 4)
    with pytest.raises(AssertionError):
        mgr.reset_prefix_cache()
    assert mgr.get_computed_blocks(request(impl, "b", range(10)))[1] == 8  # the cache was not reset
