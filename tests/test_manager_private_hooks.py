"""Private single-type-manager internals vLLM's own tests reach: both twins expose them.

``_pending_cow_copies`` is the live queue ``take_kv_cache_block_copies`` drains (a test may
queue a copy of its own); ``MambaManager._relocate_speculative_block`` and
``_cache_partial_tail_block`` are callable, with the index checked before anything moves.
"""

from __future__ import annotations

import pytest

from kvcy.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec, MambaSpec


def manager(impl, specs):
    cfg = KVCacheConfig(num_blocks=16, kv_cache_tensors=[],
                        kv_cache_groups=[KVCacheGroupSpec([f"l{i}"], s) for i, s in enumerate(specs)])
    return impl.kv_cache.KVCacheManager(cfg, max_model_len=64, scheduler_block_size=4, hash_block_size=4)


def full():
    return FullAttentionSpec(block_size=4, num_kv_heads=1, head_size=8, dtype="float16")


def mamba_manager(impl):
    spec = MambaSpec(block_size=4, shapes=((2,),), dtypes=("float32",), mamba_cache_mode="align")
    pool = impl.kv_cache.BlockPool(num_gpu_blocks=8, enable_caching=True, hash_block_size=4)
    return impl.kv_cache.MambaManager(spec, block_pool=pool, enable_caching=True, kv_cache_group_id=0,
                                      scheduler_block_size=4), pool


def test_pending_cow_copies_is_the_live_queue(impl):
    mgr = manager(impl, [full()])
    single = mgr.coordinator.single_type_managers[0]
    src, dst = mgr.block_pool.get_new_blocks(2)
    single._pending_cow_copies.append((src, dst))
    copies, retained = mgr.take_kv_cache_block_copies()
    assert [(c.src_block_id, c.dst_block_id) for c in copies] == [(src.block_id, dst.block_id)]
    assert retained == [src, dst] and single._pending_cow_copies == []


def test_pending_cow_copies_cannot_be_rebound(impl):
    single = manager(impl, [full()]).coordinator.single_type_managers[0]
    with pytest.raises(AttributeError):
        single._pending_cow_copies = None


def test_relocate_speculative_block(impl):
    mgr, pool = mamba_manager(impl)
    block = pool.get_new_blocks(1)[0]
    blocks = [block]
    mgr._relocate_speculative_block(blocks, 0)
    assert blocks == [pool.null_block, block] and block.ref_cnt == 1
    shared = pool.get_new_blocks(1)[0]
    pool.touch([shared])  # (a second holder: not writable in place)
    with pytest.raises(AssertionError):
        mgr._relocate_speculative_block([shared], 0)


@pytest.mark.parametrize("idx", [1, 5, -2])
def test_relocate_out_of_range_is_an_index_error_and_moves_nothing(impl, idx):
    mgr, pool = mamba_manager(impl)
    block = pool.get_new_blocks(1)[0]
    blocks = [block]
    with pytest.raises(IndexError):
        mgr._relocate_speculative_block(blocks, idx)
    assert blocks == [block]


def test_cache_partial_tail_block_caches_nothing_off_the_prompt_boundary(impl):
    mgr, pool = mamba_manager(impl)
    req = impl.kv_cache.Request("r", list(range(10)))
    for num_tokens in (3, 4, 0, -4):  # (off a hash boundary, short of the prompt's, none)
        assert mgr._cache_partial_tail_block(req, num_tokens, None) is None
    assert len(pool.cached_block_hash_to_block) == 0
