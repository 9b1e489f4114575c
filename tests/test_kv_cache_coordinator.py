"""The coordinators, which drive one single-type manager per KV-cache group: their factory,
parameters, attributes, checks and hit search, both twins.

(vLLM 0.33.0 has no test module of this name: it tests its coordinators through the manager.)
"""

from __future__ import annotations

import pytest

from kvcy.hashing import get_hash_fn_by_name, init_none_hash
from kvcy.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec, SlidingWindowSpec


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
