"""Decode / prefill context parallelism in the single-type managers and coordinators.

Both twins, no vLLM.  Under decode context parallelism each of ``dcp_world_size`` ranks
holds every dcp-th token of a sharded (``dcp_sharded``) group, so one of its blocks spans
``block_size * dcp_world_size`` tokens: the managers allocate, cache and look hits up at that
span.  A replicated group (Mamba, a draft model's ``dcp_sharded=False`` attention) keeps
its own block size and world sizes of 1.  The expected values follow vLLM 0.33.0's
``single_type_kv_cache_manager.py`` and ``kv_cache_coordinator.py`` (and
tests/vllm_live/test_vllm_state_machine.py compares the two libraries' managers under dcp).
"""

from __future__ import annotations

import pytest

from kvcy.hashing import get_hash_fn_by_name, get_request_block_hasher, init_none_hash
from kvcy.kv_cache_interface import (
    ChunkedLocalAttentionSpec,
    FullAttentionSpec,
    KVCacheConfig,
    KVCacheGroupSpec,
    MambaSpec,
    MLAAttentionSpec,
    SlidingWindowSpec,
)

BS = 4
SHA = get_hash_fn_by_name("sha256")
ATTN = dict(num_kv_heads=1, head_size=8, dtype="float16")


@pytest.fixture(autouse=True)
def _none_hash():
    init_none_hash(SHA)


def _config(*specs, num_blocks=32):
    return KVCacheConfig(num_blocks=num_blocks, kv_cache_tensors=[],
                         kv_cache_groups=[KVCacheGroupSpec([f"l{i}"], s) for i, s in enumerate(specs)])


def _full(bs=BS, **kw):
    return FullAttentionSpec(block_size=bs, **ATTN, **kw)


def _mamba(bs=BS, mode="align"):
    return MambaSpec(block_size=bs, shapes=((2,),), dtypes=("float32",), mamba_cache_mode=mode)


def _request(impl, rid, tokens, hash_block_size):
    return impl.kv_cache.Request(rid, list(tokens), block_hasher=get_request_block_hasher(hash_block_size, SHA, 0))


def _ids(blocks):
    return [b.block_id for b in blocks]


# ------------------------------------------------------------------ geometry
@pytest.mark.parametrize("dcp", [1, 2, 4])
def test_sharded_block_spans_block_size_times_dcp(impl, dcp):
    kv = impl.kv_cache
    pool = kv.BlockPool(16, True, BS)
    sharded = kv.FullAttentionManager(_full(), pool, True, 0, BS * dcp, dcp_world_size=dcp, pcp_world_size=2)
    assert (sharded.block_size, sharded.dcp_world_size, sharded.pcp_world_size) == (BS * dcp, dcp, 2)
    # (a replicated group is whole on every rank: neither size reaches it)
    replicated = kv.FullAttentionManager(_full(dcp_sharded=False), pool, True, 1, BS, dcp_world_size=dcp,
                                         pcp_world_size=2)
    assert (replicated.block_size, replicated.dcp_world_size, replicated.pcp_world_size) == (BS, 1, 1)
    # A request of 5 * BS tokens takes ceil(5 / dcp) sharded blocks.
    assert len(sharded.allocate_new_blocks("r", 5 * BS, 5 * BS)) == -(-5 // dcp)
    assert len(replicated.allocate_new_blocks("r", 5 * BS, 5 * BS)) == 5


def test_world_sizes_are_positive_ints(impl):
    kv = impl.kv_cache
    pool = kv.BlockPool(16, True, BS)
    for kw, exc, msg in (({"dcp_world_size": 0}, ValueError, "dcp_world_size must be a positive int, got 0"),
                         ({"pcp_world_size": -2}, ValueError, "pcp_world_size must be a positive int, got -2"),
                         ({"dcp_world_size": True}, TypeError, "dcp_world_size must be an int, got bool"),
                         ({"pcp_world_size": 2.0}, TypeError, "pcp_world_size must be an int, got float")):
        with pytest.raises(exc, match=msg):
            kv.FullAttentionManager(_full(), pool, True, 0, BS, **kw)
        with pytest.raises(exc, match=msg):
            kv.FullAttentionManager.find_longest_cache_hit([], 8, [0], pool, _full(), False, BS, **kw)


# ------------------------------------------------------------------ the manager end to end
def test_unitary_manager_allocates_caches_and_hits_at_the_sharded_span(impl):
    """dcp=2 over 4-token blocks: 8-token blocks, hashed and scheduled at 8 tokens."""
    kv = impl.kv_cache
    dcp, span = 2, 2 * BS
    mgr = kv.KVCacheManager(_config(_full()), max_model_len=256, scheduler_block_size=span,
                            hash_block_size=span, dcp_world_size=dcp)
    assert (mgr.coordinator.dcp_world_size, mgr.coordinator.block_size) == (dcp, span)
    first = _request(impl, "a", range(20), span)
    blocks, hit, _ = mgr.get_computed_blocks(first)
    assert hit == 0
    new = mgr.allocate_slots(first, 20, 0, blocks)
    held = _ids(new.blocks[0])
    assert len(held) == 3  # ceil(20 / 8)
    # the same 20-token prompt: two whole 8-token blocks hit, the first request's own
    again = _request(impl, "b", range(20), span)
    blocks, hit, _ = mgr.get_computed_blocks(again)
    assert hit == 16
    assert _ids(blocks.blocks[0]) == held[:2]
    # a 12-token prefix of it can hit at most 11 tokens: one block
    short = _request(impl, "c", range(12), span)
    blocks, hit, _ = mgr.get_computed_blocks(short)
    assert (hit, _ids(blocks.blocks[0])) == (8, held[:1])


def test_unitary_dcp_needs_hashes_at_the_sharded_span(impl):
    with pytest.raises(AssertionError, match="hash_block_size == block_size"):
        impl.kv_cache.KVCacheManager(_config(_full()), max_model_len=64, scheduler_block_size=2 * BS,
                                     hash_block_size=BS, dcp_world_size=2)


# ------------------------------------------------------------------ the hybrid coordinator
@pytest.mark.parametrize("dcp", [2, 4])
def test_hybrid_full_and_mamba_take_partial_hits_at_the_hash_block(impl, dcp):
    """A Mamba align group as large as the hash block qualifies under dcp (vLLM's rule):
    hits land on hash-block boundaries; the Mamba group is replicated (dcp 1)."""
    kv = impl.kv_cache
    mgr = kv.KVCacheManager(_config(_full(2), _mamba(2)), max_model_len=256, scheduler_block_size=2 * dcp,
                            hash_block_size=2, dcp_world_size=dcp)
    coordinator = mgr.coordinator
    assert type(coordinator).__name__ == "HybridKVCacheCoordinator"
    assert coordinator.enable_partial_hash_hits
    full, mamba = coordinator.single_type_managers
    assert (full.block_size, full.dcp_world_size, mamba.block_size, mamba.dcp_world_size) == (2 * dcp, dcp, 2, 1)
    assert full.cache_hit_alignment_tokens == mamba.cache_hit_alignment_tokens == 2
    # without dcp the same blocks are not coarser than the hash block: no partial hits
    plain = kv.KVCacheManager(_config(_full(2), _mamba(2)), max_model_len=256, scheduler_block_size=2,
                              hash_block_size=2)
    assert not plain.coordinator.enable_partial_hash_hits


def test_hybrid_replicated_draft_group_keeps_its_block(impl):
    kv = impl.kv_cache
    draft = MLAAttentionSpec(block_size=BS, num_kv_heads=1, head_size=8, dtype="float16", dcp_sharded=False)
    mgr = kv.KVCacheManager(_config(_full(), draft), max_model_len=256, scheduler_block_size=4 * BS,
                            hash_block_size=BS, dcp_world_size=4)
    target, drafter = mgr.coordinator.single_type_managers
    assert (target.block_size, drafter.block_size) == (4 * BS, BS)
    assert (target.dcp_world_size, drafter.dcp_world_size) == (4, 1)


@pytest.mark.parametrize("dcp, pcp, match", [
    (2, 1, "DCP with hybrid KV cache layouts only supports full-attention, Mamba, and replicated draft "
           "groups, got: SlidingWindowSpec."),
    (1, 2, "PCP only supports full attention and replicated draft groups."),
])
def test_hybrid_refuses_sharded_sliding_window_as_vllm(impl, dcp, pcp, match):
    swa = SlidingWindowSpec(block_size=BS, sliding_window=8, **ATTN)
    with pytest.raises(AssertionError, match=match):
        impl.kv_cache.KVCacheManager(_config(_full(), swa), max_model_len=64, scheduler_block_size=BS * dcp,
                                     hash_block_size=BS, dcp_world_size=dcp, pcp_world_size=pcp)


def test_pcp_allows_a_replicated_mamba_free_hybrid(impl):
    # pcp over full attention plus a replicated attention group: accepted, sizes unchanged
    draft = FullAttentionSpec(block_size=BS, dcp_sharded=False, **ATTN)
    mgr = impl.kv_cache.KVCacheManager(_config(_full(), draft), max_model_len=64, scheduler_block_size=BS,
                                       hash_block_size=BS, pcp_world_size=2)
    target, drafter = mgr.coordinator.single_type_managers
    assert (target.pcp_world_size, drafter.pcp_world_size) == (2, 1)
    assert mgr.coordinator.pcp_world_size == 2


# ------------------------------------------------------------------ vLLM's per-type assertions
def test_lookups_vllm_does_not_support_under_cp_assert(impl):
    kv = impl.kv_cache
    pool = kv.BlockPool(16, True, BS)
    swa = SlidingWindowSpec(block_size=BS, sliding_window=8, **ATTN)
    chunked = ChunkedLocalAttentionSpec(block_size=BS, attention_chunk_size=8, **ATTN)
    for cls, spec, kind in ((kv.SlidingWindowManager, swa, "sliding window attn"),
                            (kv.ChunkedLocalAttentionManager, chunked, "chunked local attn"),
                            (kv.MambaManager, _mamba(), "mamba")):
        with pytest.raises(AssertionError, match=f"^DCP not support {kind} now.$"):
            cls.find_longest_cache_hit([], 8, [0], pool, spec, False, BS, 2, 1)
        with pytest.raises(AssertionError, match=f"^PCP not support {kind} now.$"):
            cls.find_longest_cache_hit([], 8, [0], pool, spec, False, BS, 1, 2)
        cls.find_longest_cache_hit([], 8, [0], pool, spec, False, BS, 1, 1)  # (accepted without cp)


def test_sliding_window_mask_reads_the_sharded_block(impl):
    kv = impl.kv_cache
    spec = SlidingWindowSpec(block_size=BS, sliding_window=6, **ATTN)
    twice = SlidingWindowSpec(block_size=2 * BS, sliding_window=6, **ATTN)
    for kw in ({}, {"retention_interval": 0, "reachable_boundaries": [40]}):
        got = kv.SlidingWindowManager.reachable_block_mask(0, 8, 32, spec, False, dcp_world_size=2, **kw)
        assert got == kv.SlidingWindowManager.reachable_block_mask(0, 8, 32, twice, False, **kw)
        assert got is not None
    # (an alignment that is not a whole number of sharded blocks: every block kept)
    assert kv.SlidingWindowManager.reachable_block_mask(0, 8, 4, spec, False, dcp_world_size=2) is None
