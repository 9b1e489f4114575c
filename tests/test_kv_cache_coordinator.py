"""The coordinators, which drive one single-type manager per KV-cache group: their factory,
parameters, attributes, checks and hit search, both twins.

(vLLM 0.33.0 has no test module of this name: it tests its coordinators through the manager.)
"""

from __future__ import annotations

import pytest

from kvcy.hashing import get_hash_fn_by_name, init_none_hash, get_request_block_hasher
from kvcy.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec, SlidingWindowSpec
from kvcy.kv_events import AllBlocksCleared

from _kv_cache_helpers import (
    _full, _mamba_outcome, _pool_state, _swa, config, full_spec_api, hybrid_config, ids, manager_small,
    request_api, swa_spec,
)
from _vllm_live import live


BS = 4


@pytest.fixture(autouse=True)
def _none_hash():
    init_none_hash(get_hash_fn_by_name("sha256"))


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
    # dcp / pcp positionally too: dcp scales the full group's block past the hash block
    # (vLLM's unitary assertion), and neither supports a sharded sliding window (vLLM's).
    with pytest.raises(AssertionError, match="hash_block_size == block_size"):
        kv.get_kv_cache_coordinator(one, 64, 64, False, True, False, 2, 1, BS, BS)
    assert kv.get_kv_cache_coordinator(one, 64, 64, False, True, False, 1, 2, BS, BS).pcp_world_size == 2
    with pytest.raises(AssertionError, match="DCP with hybrid KV cache layouts only supports .* SlidingWindowSpec"):
        kv.HybridKVCacheCoordinator(two, 64, 64, False, True, False, 2, 1, 2 * BS, BS)
    with pytest.raises(AssertionError, match="PCP only supports full attention and replicated draft groups"):
        kv.HybridKVCacheCoordinator(two, 64, 64, False, True, False, 1, 2, BS, BS)

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


def hasher():
    return get_request_block_hasher(BS, get_hash_fn_by_name("sha256"))


# ------------------------------------------------- §5 coordinator.get_blocks
@pytest.mark.parametrize("groups", [1, 2])
@pytest.mark.parametrize("enable_caching", [True, False])
def test_coordinator_get_blocks_of_an_unknown_request_is_empty(impl, groups, enable_caching):
    """vLLM's coordinator answers an empty list per group for an id it does not know."""
    mgr = manager_small(impl, groups, enable_caching=enable_caching)
    assert mgr.coordinator.get_blocks("nobody") == tuple([] for _ in range(groups))
    req = impl.kv_cache.Request("a", list(range(8)), block_hasher=hasher())
    assert mgr.allocate_slots(req, 8) is not None
    held = mgr.coordinator.get_blocks("a")
    assert len(held) == groups and all(len(g) == 2 for g in held)
    mgr.free(req)
    assert mgr.coordinator.get_blocks("a") == tuple([] for _ in range(groups))


# ------------------------------------------------- §5 new_step_starts
@pytest.mark.parametrize("groups", [1, 2])
@pytest.mark.parametrize("enable_caching", [True, False])
def test_new_step_starts_reaches_every_single_type_manager(impl, groups, enable_caching, monkeypatch):
    """The manager tells the coordinator, which tells each single-type manager, as vLLM does."""
    mgr = manager_small(impl, groups, enable_caching=enable_caching)
    coordinator = mgr.coordinator
    assert coordinator.new_step_starts() is None
    for single in coordinator.single_type_managers:
        assert single.new_step_starts() is None
    assert mgr.new_step_starts() is None
    if impl.name != "python":
        return  # compiled classes cannot be patched; the calls above show the methods exist
    seen = []
    for cls in {type(m) for m in coordinator.single_type_managers}:
        monkeypatch.setattr(cls, "new_step_starts", lambda self: seen.append(self))
    coordinator_calls = []
    original = type(coordinator).new_step_starts

    def spy(self):
        coordinator_calls.append(self)
        return original(self)

    monkeypatch.setattr(type(coordinator), "new_step_starts", spy)
    mgr.new_step_starts()
    assert coordinator_calls == [coordinator]
    assert seen == list(coordinator.single_type_managers)


# ------------------------------------------------- §3 hits for a request that holds blocks
@pytest.mark.parametrize("groups", [1, 2])
def test_hits_for_a_request_that_holds_blocks_assert(impl, groups):
    """vLLM's coordinator asserts that a tracked request brings no new hits; kvcy asserts first."""
    mgr = manager_small(impl, groups)
    a = impl.kv_cache.Request("a", list(range(12)), block_hasher=hasher())
    assert mgr.allocate_slots(a, 12) is not None
    b = impl.kv_cache.Request("b", list(range(12)), block_hasher=hasher())
    blocks, n, _ = mgr.get_computed_blocks(b)
    assert n > 0
    assert mgr.allocate_slots(b, 4, num_new_computed_tokens=n, new_computed_blocks=blocks) is not None
    held = mgr.get_block_ids("b")
    free_before = sorted(x.block_id for x in mgr.block_pool.free_block_queue.get_all_free_blocks())
    with pytest.raises(AssertionError, match="already holds blocks"):
        mgr.allocate_slots(b, 4, num_new_computed_tokens=n, new_computed_blocks=blocks)
    with pytest.raises(AssertionError, match="already holds blocks"):
        mgr.coordinator.allocate_new_computed_blocks("b", blocks.blocks, n, 0)
    assert mgr.get_block_ids("b") == held
    assert sorted(x.block_id for x in mgr.block_pool.free_block_queue.get_all_free_blocks()) == free_before
    # Empty hits for a running request are fine (vLLM's coordinator returns at once).
    mgr.coordinator.allocate_new_computed_blocks("b", tuple([] for _ in range(groups)), n, 0)
    assert mgr.get_block_ids("b") == held


# ------------------------------------------------- §1 no KV-cache groups
def test_no_groups_with_caching_asserts_as_vllm(impl):
    """vLLM keeps caching on with no groups, so its hybrid coordinator asserts; kvcy too."""
    cfg = KVCacheConfig(num_blocks=8, kv_cache_tensors=[], kv_cache_groups=[])
    with pytest.raises(AssertionError, match="HybridKVCacheCoordinator requires at least one cacheable group."):
        impl.kv_cache.KVCacheManager(cfg, max_model_len=64, scheduler_block_size=BS, hash_block_size=BS)
    mgr = impl.kv_cache.KVCacheManager(cfg, max_model_len=64, scheduler_block_size=BS, hash_block_size=BS,
                                       enable_caching=False)
    assert mgr.enable_caching is False
    assert type(mgr.coordinator) is impl.kv_cache.KVCacheCoordinatorNoPrefixCache
    assert mgr.num_kv_cache_groups == 0
    assert mgr.get_blocks("x").blocks == ()
    assert mgr.new_step_starts() is None


SHA = get_hash_fn_by_name("sha256")


def manager_api(impl, specs=None, num_blocks=16, **kw):
    specs = [full_spec_api()] if specs is None else specs
    return impl.kv_cache.KVCacheManager(config(specs, num_blocks), max_model_len=64, scheduler_block_size=BS,
                                        hash_block_size=BS, **kw)


@pytest.mark.parametrize("use_eagle", [False, True])
@pytest.mark.parametrize("num_prefill_lookahead, reprefillable", [(0, 0), (1, 0), (3, 2)])
def test_coordinator_attributes(impl, use_eagle, num_prefill_lookahead, reprefillable):
    mgr = manager_api(impl, [full_spec_api(), swa_spec()], use_eagle=use_eagle, num_prefill_lookahead=num_prefill_lookahead)
    assert mgr.coordinator.num_reprefillable_tokens == reprefillable
    assert mgr.coordinator.drop_eagle_group_ids == ({0, 1} if use_eagle else set())
    assert mgr.coordinator.eagle_group_ids == ({0, 1} if use_eagle else set())


def test_flagged_eagle_groups_drop_nothing_without_use_eagle(impl):
    """vLLM: groups flagged ``is_eagle_group`` stay flagged, but only ``use_eagle`` drops a block."""
    cfg = KVCacheConfig(num_blocks=16, kv_cache_tensors=[],
                        kv_cache_groups=[KVCacheGroupSpec(["l0"], full_spec_api(), is_eagle_group=True)])
    mgr = impl.kv_cache.KVCacheManager(cfg, max_model_len=64, scheduler_block_size=BS, hash_block_size=BS)
    assert mgr.coordinator.eagle_group_ids == {0}
    assert mgr.coordinator.drop_eagle_group_ids == set()
    first = request_api(impl, "a", range(13))
    mgr.allocate_slots(first, 13)
    second = request_api(impl, "b", range(13))
    _, hit, _ = mgr.get_computed_blocks(second)
    assert hit == 12  # vLLM: 3 blocks; with the EAGLE drop it would be 8


@pytest.mark.parametrize("name", ["num_reprefillable_tokens", "drop_eagle_group_ids", "enable_partial_hash_hits"])
def test_new_coordinator_attributes_are_read_only(impl, name):
    mgr = manager_api(impl)
    with pytest.raises(AttributeError):
        setattr(mgr.coordinator, name, 5)


def test_coordinator_get_num_blocks_to_allocate_by_keyword(impl):
    """How scheduler.py's _request_remaining_blocks calls it."""
    mgr = manager_api(impl)
    req = request_api(impl, "a", range(10))
    n = mgr.coordinator.get_num_blocks_to_allocate(
        request_id=req.request_id, num_tokens=10, new_computed_blocks=mgr.empty_kv_cache_blocks.blocks,
        num_encoder_tokens=0, total_computed_tokens=0, num_local_computed_tokens=0, num_tokens_main_model=10,
        apply_admission_cap=True, prefill_end=10,
    )
    assert n == 3


def _coordinator_cases(kvcy_side: bool):
    """(name, specs, manager keywords, probe) for the construction and lookup checks vLLM
    0.33.0 makes with ``assert``; ``specs`` are kvcy's or vLLM's, by ``kvcy_side``."""
    if kvcy_side:
        from kvcy import kv_cache_interface as v

        dtype = "float16"
    else:
        import torch
        from vllm.v1 import kv_cache_interface as v

        dtype = torch.float16
    full = v.FullAttentionSpec(block_size=16, num_kv_heads=1, head_size=8, dtype=dtype)
    chunked = v.ChunkedLocalAttentionSpec(block_size=16, num_kv_heads=1, head_size=8, dtype=dtype,
                                          attention_chunk_size=64)
    base = dict(max_model_len=256, scheduler_block_size=16, hash_block_size=16, enable_caching=True)
    lookup = lambda m: m.coordinator.find_longest_cache_hit([], 64)  # noqa: E731
    return v, [
        ("eagle+chunked local", [chunked], {**base, "use_eagle": True}, lookup),
        ("eagle+chunked local, no caching", [chunked], {**base, "use_eagle": True, "enable_caching": False}, None),
        ("eagle+full+chunked local", [full, chunked], {**base, "use_eagle": True}, lookup),
        ("one group, hash block 8", [full], {**base, "hash_block_size": 8, "scheduler_block_size": 16}, None),
        ("scheduler block 24", [full, chunked], {**base, "scheduler_block_size": 24, "hash_block_size": 8}, None),
    ]


def _coordinator_outcomes(kvcy_side: bool, make_manager):
    v, cases = _coordinator_cases(kvcy_side)
    out = {}
    for name, specs, kw, probe in cases:
        cfg = v.KVCacheConfig(num_blocks=64, kv_cache_tensors=[],
                              kv_cache_groups=[v.KVCacheGroupSpec([f"l{i}"], s) for i, s in enumerate(specs)])
        built = []
        outcome = _mamba_outcome(lambda: built.append(make_manager(cfg, kw)))
        if outcome == ("built", "") and probe is not None:
            outcome = _mamba_outcome(lambda: probe(built[0]))
        out[name] = outcome
    return out


# vLLM 0.33.0's outcomes (types; its asserts' messages where it has one), recorded by
# test_live_vllm_coordinator_asserts below.
COORDINATOR_ASSERTS = {
    "eagle+chunked local": ("AssertionError", "Hybrid KV cache is not supported for eagle + chunked local attention."),
    "eagle+chunked local, no caching": ("built", ""),
    "eagle+full+chunked local": ("AssertionError",
                                 "Hybrid KV cache is not supported for eagle + chunked local attention."),
    "one group, hash block 8": ("AssertionError", "UnitaryKVCacheCoordinator assumes hash_block_size == block_size"),
    "scheduler block 24": ("AssertionError", ""),
}


def _same_outcome(got, expected):
    # kvcy's messages may say more than vLLM's (the values): vLLM's message must begin them
    return got[0] == expected[0] and got[1].startswith(expected[1])


def test_coordinator_asserts_as_vllm(impl):
    """EAGLE with a chunked-local group builds (vLLM asserts at the lookup, not before);
    the unitary coordinator's and the block-size checks are vLLM's AssertionErrors."""
    got = _coordinator_outcomes(True, lambda cfg, kw: impl.kv_cache.KVCacheManager(cfg, **kw))
    bad = {k: (got[k], e) for k, e in COORDINATOR_ASSERTS.items() if not _same_outcome(got[k], e)}
    assert bad == {}


@live
def test_live_vllm_coordinator_asserts(monkeypatch):
    monkeypatch.setenv("VLLM_TARGET_DEVICE", "cpu")
    from vllm.v1.core.kv_cache_manager import KVCacheManager as VllmManager

    live = _coordinator_outcomes(False, lambda cfg, kw: VllmManager(cfg, **kw))
    assert live == COORDINATOR_ASSERTS


ATTN = dict(num_kv_heads=1, head_size=8, dtype="float16")


def _manager(impl, specs, retention=None, *, sbs=4, hbs=4, caching=True, events=False, num_blocks=32):
    cfg = KVCacheConfig(num_blocks=num_blocks, kv_cache_tensors=[],
                        kv_cache_groups=[KVCacheGroupSpec([f"l{i}"], s) for i, s in enumerate(specs)],
                        prefix_cache_retention_interval=retention)
    return impl.kv_cache.KVCacheManager(cfg, max_model_len=256, scheduler_block_size=sbs, hash_block_size=hbs,
                                        enable_caching=caching, enable_kv_cache_events=events,
                                        max_in_flight_tokens=64, use_int_block_hashes=False)


# ------------------------------------------------------------------ reset through the coordinator
def test_reset_prefix_cache_through_the_coordinator(impl):
    kv = impl.kv_cache
    from kvcy.hashing import get_hash_fn_by_name, get_request_block_hasher, init_none_hash

    sha = get_hash_fn_by_name("sha256")
    init_none_hash(sha)
    # vLLM 0.33.0, no groups (caching off, events on): reset -> True, take_events() -> [].
    empty = _manager(impl, [], caching=False, events=True)
    assert empty.reset_prefix_cache() is True and empty.take_events() == []
    mgr = _manager(impl, [_full(), _swa()], events=True)
    req = kv.Request("r", list(range(16)), block_hasher=get_request_block_hasher(4, sha))
    mgr.allocate_slots(req, 16)
    assert mgr.coordinator.reset_prefix_cache() is False and mgr.reset_prefix_cache() is False
    mgr.free(req)
    mgr.take_events()
    assert mgr.coordinator.reset_prefix_cache() is True
    assert [type(e) for e in mgr.take_events()] == [AllBlocksCleared]
    assert all(b.block_hash is None for b in mgr.block_pool.blocks)


def hasher_hardening(bs=BS):
    return get_request_block_hasher(bs, get_hash_fn_by_name("sha256"))


def full_config(num_blocks=64, bs=BS):
    spec = FullAttentionSpec(block_size=bs, num_kv_heads=1, head_size=8, dtype="float16")
    return KVCacheConfig(num_blocks=num_blocks, kv_cache_tensors=[], kv_cache_groups=[KVCacheGroupSpec(["l0"], spec)])


def manager_hardening(impl, num_blocks=64, config=None, **kw):
    kw.setdefault("max_model_len", 256)
    return impl.kv_cache.KVCacheManager(config or full_config(num_blocks), scheduler_block_size=BS,
                                        hash_block_size=BS, **kw)


def snapshot(mgr):
    """Everything observable about a manager's blocks: free count, queue order, block tables,
    reference counts and cache keys."""
    pool = mgr.block_pool
    tables = tuple(
        {rid: ids(blocks) for rid, blocks in m.req_to_blocks.items()}
        for m in mgr.coordinator.single_type_managers
    )
    cached = tuple(dict(m.num_cached_block) for m in mgr.coordinator.single_type_managers)
    return (
        pool.get_num_free_blocks(),
        ids(pool.free_block_queue.get_all_free_blocks()),
        tables,
        cached,
        [b.ref_cnt for b in pool.blocks],
        [b.block_hash for b in pool.blocks],
    )


def test_retention_interval_assigned_on_a_live_coordinator_acts_as_the_configs(impl):
    """``coordinator.retention_interval = 0`` (as vLLM's tests set it) caches what a manager
    built with ``prefix_cache_retention_interval=0`` caches; deleting it is refused."""
    import dataclasses

    def run(mgr):
        req = impl.kv_cache.Request("r", list(range(6 * BS + 1)), block_hasher=hasher_hardening())
        req.shared_prefix_boundary = 2 * BS
        mgr.allocate_slots(req, 6 * BS + 1)
        req.num_computed_tokens = 6 * BS + 1
        mgr.free(req)
        return snapshot(mgr)

    configured = manager_hardening(impl, config=dataclasses.replace(hybrid_config(), prefix_cache_retention_interval=0))
    assigned = manager_hardening(impl, config=hybrid_config())
    assigned.coordinator.retention_interval = 0
    assert assigned.coordinator.retention_interval == 0
    expected = run(configured)
    assert run(assigned) == expected
    assert run(manager_hardening(impl, config=hybrid_config())) != expected  # (dense retention caches more)
    assigned.coordinator.retention_interval = None
    assert assigned.coordinator.retention_interval is None
    with pytest.raises(AttributeError):
        del assigned.coordinator.retention_interval
    assert assigned.coordinator.retention_interval is None


@pytest.mark.parametrize("ids, error, message", [
    (["x"], TypeError, "kv_cache_group_ids must be ints, got str"),
    ([0, None], TypeError, "kv_cache_group_ids must be ints, got NoneType"),
    ([1.0], TypeError, "kv_cache_group_ids must be ints, got float"),
    ([-1], ValueError, "KV-cache group id -1 does not fit in 4 bytes"),
    ([2**33], ValueError, "KV-cache group id 8589934592 does not fit in 4 bytes"),
])
@pytest.mark.parametrize("kind", ["FullAttentionManager", "SlidingWindowManager"])
def test_bad_group_ids_in_a_hit_search_are_refused_alike(impl, kind, ids, error, message):
    # (the twins raised different errors: the compiled one TypeError/ValueError from
    # its conversions, the Python one AttributeError/OverflowError)
    full = FullAttentionSpec(block_size=BS, num_kv_heads=1, head_size=8, dtype="float16")
    swa = SlidingWindowSpec(block_size=BS, num_kv_heads=1, head_size=8, dtype="float16", sliding_window=8)
    spec = full if kind == "FullAttentionManager" else swa
    pool = impl.kv_cache.BlockPool(16, True, BS)
    req = impl.kv_cache.Request("a", list(range(20)), block_hasher=hasher_hardening())
    pool.cache_full_blocks(req, pool.get_new_blocks(2), 0, 2, BS, 0)
    cls = getattr(impl.kv_cache, kind)
    with pytest.raises(error, match=message):
        cls.find_longest_cache_hit(req.block_hashes, 20, ids, pool, spec, False, BS)
    assert cls.find_longest_cache_hit(req.block_hashes, 20, [0], pool, spec, False, BS)[1] == 8


@pytest.mark.parametrize("mode", ["none", "align"])
def test_num_speculative_blocks_too_large_to_compute_with_is_refused(impl, mode):
    """A Mamba spec asking 2**59 speculative blocks a request: the compiled twin's
    ``block_size * num_speculative_blocks`` wrapped in C and it handed out blocks the pure
    twin (and vLLM) refuse; both twins now refuse the manager (ValueError) when it is made."""
    from kvcy.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec, MambaSpec

    cfg = KVCacheConfig(num_blocks=16, kv_cache_tensors=[], kv_cache_groups=[
        KVCacheGroupSpec(["a"], FullAttentionSpec(block_size=16, num_kv_heads=1, head_size=8, dtype="float16")),
        KVCacheGroupSpec(["m"], MambaSpec(block_size=16, shapes=((4,),), dtypes=("float32",),
                                          mamba_cache_mode=mode, num_speculative_blocks=2**59))])
    with pytest.raises(ValueError, match=r"num_speculative_blocks must be below 2\*\*31, got 576460752303423488"):
        impl.kv_cache.KVCacheManager(cfg, 4096, 16, 16, enable_caching=mode == "align")
    ok = MambaSpec(block_size=16, shapes=((4,),), dtypes=("float32",), mamba_cache_mode=mode,
                   num_speculative_blocks=2**31 - 1)
    mgr = impl.kv_cache.KVCacheManager(KVCacheConfig(num_blocks=16, kv_cache_tensors=[], kv_cache_groups=[
        cfg.kv_cache_groups[0], KVCacheGroupSpec(["m"], ok)]), 4096, 16, 16, enable_caching=mode == "align")
    req = impl.kv_cache.Request("r", list(range(40)), block_hasher=hasher_hardening(16))
    with pytest.raises(ValueError, match="can never be scheduled"):  # (more blocks than the pool has)
        mgr.allocate_slots(req, 40)
    mgr.refuse_unservable = False
    assert mgr.allocate_slots(req, 40) is None  # (as in vLLM)
