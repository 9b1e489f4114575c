"""``KVCacheManager.get_computed_blocks_for_connector`` on a hybrid of Mamba and full attention.

Such a cache searches its groups one by one: the full-attention hit is the local prefix, and
``hit_diverged`` says another group hit less; a group that hit deeper than full attention means
the full-attention tail was evicted, and the hit all groups share is returned instead.
"""

from __future__ import annotations

import pytest

from kvcy.hashing import get_hash_fn_by_name, get_request_block_hasher, init_none_hash
from kvcy.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec, MambaSpec

BS = 4
SHA = get_hash_fn_by_name("sha256")


@pytest.fixture(autouse=True)
def _none_hash():
    init_none_hash(SHA)


def manager(impl, enable_caching=True):
    specs = [FullAttentionSpec(block_size=BS, num_kv_heads=1, head_size=8, dtype="float16"),
             MambaSpec(block_size=BS, shapes=((2,),), dtypes=("float32",), mamba_cache_mode="align")]
    cfg = KVCacheConfig(num_blocks=32, kv_cache_tensors=[],
                        kv_cache_groups=[KVCacheGroupSpec([f"l{i}"], s) for i, s in enumerate(specs)])
    return impl.kv_cache.KVCacheManager(cfg, max_model_len=64, scheduler_block_size=BS, hash_block_size=BS,
                                        enable_caching=enable_caching)


def request(impl, rid, tokens, **kw):
    return impl.kv_cache.Request(rid, list(tokens), block_hasher=get_request_block_hasher(BS, SHA, 0), **kw)


def prefill(mgr, req, chunks):
    for n in chunks:
        assert mgr.allocate_slots(req, n) is not None
        req.num_computed_tokens += n


def test_full_attention_hit_deeper_than_mamba_is_the_local_prefix(impl):
    mgr = manager(impl)
    prefill(mgr, request(impl, "a", range(14)), [8, 6])  # Mamba state kept at 8 only
    b = request(impl, "b", range(14))
    assert mgr.get_computed_blocks(b)[1] == 8
    blocks, hit, boundary, diverged = mgr.get_computed_blocks_for_connector(b)
    assert (hit, boundary, diverged) == (12, 0, True)
    full, mamba = blocks.get_block_ids()
    assert len(full) == 3 and len(mamba) == 2 and mamba[-1] != 0  # Mamba's blocks end on its own hit


def test_converged_hit_is_not_diverged(impl):
    mgr = manager(impl)
    prefill(mgr, request(impl, "a", range(14)), [4, 4, 4, 2])
    blocks, hit, boundary, diverged = mgr.get_computed_blocks_for_connector(request(impl, "b", range(14)))
    assert (hit, boundary, diverged) == (12, 0, False)


def test_mamba_deeper_than_full_attention_falls_back_to_the_shared_hit(impl):
    mgr = manager(impl)
    a = request(impl, "a", range(14))
    prefill(mgr, a, [4, 4, 4, 2])
    full_ids = mgr.get_block_ids("a")[0]
    mgr.free(a)
    mgr.evict_blocks({full_ids[2]})  # full attention loses tokens 8..12, Mamba keeps its state at 12
    b = request(impl, "b", range(14))
    expected = mgr.get_computed_blocks(b)
    blocks, hit, boundary, diverged = mgr.get_computed_blocks_for_connector(b)
    assert (hit, boundary, diverged) == (*expected[1:], False)
    assert hit == 8 and blocks.get_block_ids() == expected[0].get_block_ids()


def test_max_cache_hit_length_caps_each_group(impl):
    mgr = manager(impl)
    prefill(mgr, request(impl, "a", range(14)), [8, 6])
    _, hit, _, diverged = mgr.get_computed_blocks_for_connector(request(impl, "b", range(14)), 8)
    assert (hit, diverged) == (8, False)


@pytest.mark.parametrize("bad, exc", [(-1, ValueError), ("8", TypeError), (1.5, TypeError)])
def test_bad_max_cache_hit_length_is_refused(impl, bad, exc):
    mgr = manager(impl)
    with pytest.raises(exc, match="max_cache_hit_length"):
        mgr.get_computed_blocks_for_connector(request(impl, "b", range(14)), bad)


def test_no_lookup_without_caching_or_when_skipping(impl):
    off = manager(impl, enable_caching=False)
    blocks, hit, boundary, diverged = off.get_computed_blocks_for_connector(request(impl, "b", range(14)))
    assert (hit, boundary, diverged) == (0, 0, False) and blocks is off.empty_kv_cache_blocks
    mgr = manager(impl)
    prefill(mgr, request(impl, "a", range(14)), [8, 6])
    skipper = request(impl, "s", range(14), skip_reading_prefix_cache=True)
    assert mgr.get_computed_blocks_for_connector(skipper)[1:] == (0, 0, False)


def test_not_a_request_is_a_type_error(impl):
    with pytest.raises(TypeError, match="expected a Request"):
        manager(impl).get_computed_blocks_for_connector(object())
