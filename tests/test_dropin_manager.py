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
