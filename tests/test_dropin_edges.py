"""Edge inputs where kvcy used to decide differently from vLLM 0.33.0, both twins.

Found by driving vLLM 0.33.0's ``KVCacheManager`` and kvcy's side by side on unusual
inputs (the scratch comparisons behind tests/_vllm_diff.py).  The expected values were
recorded from vLLM 0.33.0 itself and are written out here, so the tests run without vLLM.
"""

from __future__ import annotations

import pytest

from kvcy.hashing import get_hash_fn_by_name, get_request_block_hasher, init_none_hash
from kvcy.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec

BS = 4


@pytest.fixture(autouse=True)
def _none_hash():
    init_none_hash(get_hash_fn_by_name("sha256"))


def full_spec(bs: int = BS) -> FullAttentionSpec:
    return FullAttentionSpec(block_size=bs, num_kv_heads=1, head_size=8, dtype="float16")


def manager(impl, num_blocks=20, max_model_len=40, **kw):
    cfg = KVCacheConfig(num_blocks=num_blocks, kv_cache_tensors=[],
                        kv_cache_groups=[KVCacheGroupSpec(["l0"], full_spec())])
    return impl.kv_cache.KVCacheManager(cfg, max_model_len=max_model_len, scheduler_block_size=BS,
                                        hash_block_size=BS, **kw)


def request(impl, rid, tokens):
    return impl.kv_cache.Request(rid, tokens, block_hasher=get_request_block_hasher(BS, get_hash_fn_by_name("sha256")))


def hashed_ids(mgr):
    return [b.block_id for b in mgr.block_pool.blocks if b.block_hash is not None]


# ------------------------------------------- a request longer than max_model_len
@pytest.mark.parametrize("events", [False, True])
def test_request_longer_than_max_model_len(impl, events):
    """A 50-token request under ``max_model_len=40`` (block size 4): vLLM allocates the 10
    blocks the clamp allows and caches those it holds although 12 blocks are full; with
    events on, its event loop then reads past the request's blocks (IndexError, no event
    queued), after the caching.  kvcy raised RuntimeError either way."""
    mgr = manager(impl, enable_kv_cache_events=events)
    tokens = list(range(100, 150))
    a = request(impl, "a", tokens)
    if events:
        with pytest.raises(IndexError):
            mgr.allocate_slots(a, 50)
        assert mgr.take_events() == []
    else:
        assert mgr.allocate_slots(a, 50).get_block_ids() == (list(range(1, 11)),)
    assert mgr.get_block_ids("a") == (list(range(1, 11)),)
    assert mgr.block_pool.get_num_free_blocks() == 9
    assert hashed_ids(mgr) == list(range(1, 11))
    a.num_computed_tokens = 40
    blocks, hit, _ = mgr.get_computed_blocks(request(impl, "b", tokens))
    assert hit == 40 and blocks.get_block_ids() == (list(range(1, 11)),)


def test_cache_full_blocks_caches_the_blocks_there_are(impl):
    """``BlockPool.cache_full_blocks`` asked for more full blocks than it is given caches
    the given ones (vLLM slices ``blocks``); with events on it raises IndexError after
    that, queuing no event."""
    for events in (False, True):
        pool = impl.kv_cache.BlockPool(8, True, BS, enable_kv_cache_events=events)
        req = request(impl, "a", list(range(12)))
        blocks = pool.get_new_blocks(2)
        if events:
            with pytest.raises(IndexError):
                pool.cache_full_blocks(req, blocks, 0, 3, BS, 0)
            assert pool.take_events() == []
        else:
            pool.cache_full_blocks(req, blocks, 0, 3, BS, 0)
        assert [b.block_hash is not None for b in blocks] == [True, True]
        assert [b.block_hash_num_tokens for b in blocks] == [4, 8]
        # a block mask counts the blocks given (vLLM asserts its length against them)
        other = pool.get_new_blocks(1)
        with pytest.raises(AssertionError):
            pool.cache_full_blocks(request(impl, "b", list(range(50, 62))), other, 0, 3, BS, 0, [True] * 3)
        assert other[0].block_hash is None


# ------------------------------------------------------------- vLLM's own errors
def test_allocate_slots_with_nothing_to_do_says_what_vllm_says(impl):
    mgr = manager(impl)
    with pytest.raises(ValueError) as err:
        mgr.allocate_slots(request(impl, "a", list(range(8))), 0)
    assert str(err.value) == "num_new_tokens must be greater than 0 when there are no computed tokens to adopt"


def test_evict_blocks_past_the_pool_asserts_as_vllm(impl):
    """A block id past the pool is vLLM's ``AssertionError`` (a connector bug), raised
    before any key is dropped."""
    mgr = manager(impl)
    a = request(impl, "a", list(range(9)))
    mgr.allocate_slots(a, 9)
    mgr.free(a)
    assert hashed_ids(mgr) == [1, 2]
    for bad in ({20}, {1, 25}):
        with pytest.raises(AssertionError) as err:
            mgr.evict_blocks(bad)
        assert str(err.value).startswith(f"Invalid block_id {max(bad)} >= 20. This indicates a bug in the KV connector")
        assert hashed_ids(mgr) == [1, 2]
    mgr.evict_blocks({19, 2})
    assert hashed_ids(mgr) == [1]


# ------------------------------------------------------------------ CachingMetrics
def test_caching_metrics_with_an_empty_window_keeps_the_latest_interval():
    """vLLM takes ``max_recent_requests=0``: the window keeps only the latest observed
    interval (it never drops the last one).  kvcy refused it with ValueError."""
    from kvcy.metrics import CachingMetrics, PrefixCacheStats

    metrics = CachingMetrics(max_recent_requests=0)
    seen = []
    for requests, queries, hits in ((1, 10, 5), (2, 20, 0), (1, 8, 8)):
        metrics.observe(PrefixCacheStats(requests=requests, queries=queries, hits=hits))
        seen.append((metrics.hit_rate, metrics.aggregated_requests, len(metrics.query_queue)))
    assert seen == [(0.5, 1, 1), (0.0, 2, 1), (1.0, 1, 1)]  # (recorded from vLLM 0.33.0)


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


def test_mamba_checkpoint_helpers_from_kv_cache_interface():
    """vLLM defines them in ``kv_cache_interface``; kvcy serves the selected twin's there
    (values recorded from vLLM 0.33.0)."""
    from kvcy import kv_cache_interface as ki

    position = ki.get_mamba_prefill_checkpoint_position
    assert [position(n, 4, drop, la) for n, drop, la in
            ((17, False, 0), (17, False, 2), (17, True, 0), (16, False, 0), (3, False, 0), (16, True, 5))] == \
        [16, 12, 12, 12, 0, 12]
    valid = ki.is_mamba_prefill_checkpoint_valid
    assert [valid(*a) for a in ((0, 16, 8, 4, 8, None), (0, 16, 8, 4, 8, 4), (4, 16, 8, 4, 8, 4), (8, 24, 20, 4, 8, 4),
                                (8, 24, 20, 4, 8, 8), (0, 17, 12, 4, 4, 2))] == [False, True, False, True, False, True]
    with pytest.raises(AttributeError):
        ki.no_such_name  # noqa: B018


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


def test_empty_pool_asserts_as_vllm(impl):
    """A KV-cache config of 0 blocks (or a non-int count): vLLM's ``BlockPool`` asserts
    ``isinstance(num_gpu_blocks, int) and num_gpu_blocks > 0``, so building the manager
    raises AssertionError.  kvcy raised ValueError / TypeError."""
    cfg = KVCacheConfig(num_blocks=0, kv_cache_tensors=[], kv_cache_groups=[KVCacheGroupSpec(["l0"], full_spec())])
    with pytest.raises(AssertionError, match="at least 1"):
        impl.kv_cache.KVCacheManager(cfg, max_model_len=64, scheduler_block_size=BS, hash_block_size=BS)
    for bad in (0, -3, 4.0, "4"):
        with pytest.raises(AssertionError):
            impl.kv_cache.BlockPool(bad, True, BS)


def test_popleft_n_past_the_free_blocks_asserts_as_vllm(impl):
    """``FreeKVCacheBlockQueue.popleft_n(n)`` with fewer than ``n`` free blocks: vLLM
    asserts (kvcy raised ValueError); nothing is popped."""
    blocks = [impl.kv_cache.KVCacheBlock(i) for i in range(3)]
    queue = impl.kv_cache.FreeKVCacheBlockQueue(blocks)
    with pytest.raises(AssertionError):
        queue.popleft_n(4)
    assert queue.num_free_blocks == 3 and [b.block_id for b in queue.get_all_free_blocks()] == [0, 1, 2]


def test_event_media_names_as_vllm():
    """``kv_events`` names the three storage media vLLM 0.33.0's events carry."""
    from kvcy import kv_events

    assert (kv_events.MEDIUM_GPU, kv_events.MEDIUM_CPU, kv_events.MEDIUM_STORAGE) == ("GPU", "CPU", "STORAGE")
    assert {"MEDIUM_GPU", "MEDIUM_CPU", "MEDIUM_STORAGE"} <= set(kv_events.__all__)


def test_find_longest_cache_hit_takes_vllms_context_parallel_sizes(impl):
    """vLLM's ``find_longest_cache_hit`` classmethods end with ``dcp_world_size=1,
    pcp_world_size=1`` (its coordinators pass them); kvcy takes them, and refuses other
    sizes as vLLM does: full attention reads hashes at the dcp-scaled block, the other
    types assert (vLLM's "DCP not support ..." messages)."""
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
    # dcp=3: one block spans 3 hash blocks, keyed by the last one's hash (which chains
    # over the whole prefix): the 12 cached tokens are one block, the third cached one
    got, length = kv.FullAttentionManager.find_longest_cache_hit(
        req.block_hashes, 12, [0], pool, full_spec(), False, 3 * BS, 3, 1)
    assert (length, [b.block_id for b in got[0]]) == (12, [3])
    got, length = kv.FullAttentionManager.find_longest_cache_hit(
        req.block_hashes, 11, [0], pool, full_spec(), False, 3 * BS, 3, 1)
    assert (length, got) == (0, ([],))  # (max_length below one 12-token block)
    with pytest.raises(AssertionError, match="DCP not support sliding window attn now."):
        kv.SlidingWindowManager.find_longest_cache_hit(req.block_hashes, 12, [0], pool, swa, False, BS, 2, 1)
    with pytest.raises(AssertionError, match="PCP not support sliding window attn now."):
        kv.SlidingWindowManager.find_longest_cache_hit(req.block_hashes, 12, [0], pool, swa, False, BS, 1, 2)


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


def test_kv_cache_blocks_take_a_list_of_groups(impl):
    """vLLM's ``KVCacheBlocks`` takes any sequence of groups (``KVCacheBlocks([[b]])``); kvcy
    takes a list too (kept as a tuple) and still refuses anything else."""
    kv = impl.kv_cache
    a, b = kv.KVCacheBlock(1), kv.KVCacheBlock(2)
    blocks = kv.KVCacheBlocks([[a, b], []])
    assert blocks.get_block_ids() == ([1, 2], []) and type(blocks.blocks) is tuple
    assert (blocks + kv.KVCacheBlocks(blocks=[[b], [a]])).get_block_ids() == ([1, 2, 2], [1])
    assert blocks.new_empty().get_block_ids() == ([], [])
    with pytest.raises(TypeError, match="expected tuple"):
        kv.KVCacheBlocks({"a": [a]})


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


def test_embeddings_only_prompt_as_vllm(impl):
    """vLLM's ``Request`` takes ``prompt_token_ids=None`` with ``prompt_embeds``: the prompt
    is as long as the embeddings, its token ids are zeros, and its blocks are keyed by the
    embeddings' digests; with neither, vLLM's ValueError.  kvcy raised TypeError."""
    import hashlib

    torch = pytest.importorskip("torch")
    embeds = torch.arange(40, dtype=torch.float32).reshape(10, 4)
    hasher = get_request_block_hasher(BS, get_hash_fn_by_name("sha256"))
    req = impl.kv_cache.Request("r", None, prompt_embeds=embeds, block_hasher=hasher)
    assert req.prompt_token_ids is None
    assert (req.num_prompt_tokens, req.num_tokens, list(req.all_token_ids)) == (10, 10, [0] * 10)
    same = impl.kv_cache.Request("s", [0] * 10, prompt_embeds=embeds, block_hasher=hasher)
    assert req.block_hashes == same.block_hashes and len(req.block_hashes) == 2
    digest = hashlib.sha256(embeds[:4].numpy().tobytes()).digest()
    from kvcy.hashing import generate_block_hash_extra_keys
    assert generate_block_hash_extra_keys(req, 0, 4, 0) == ((("prompt_embeds", digest),), 0)
    with pytest.raises(ValueError, match="Neither prompt_token_ids nor prompt_embeds were defined."):
        impl.kv_cache.Request("r", None)
