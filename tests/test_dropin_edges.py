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

