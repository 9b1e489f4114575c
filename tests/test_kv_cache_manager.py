"""KVCacheManager in a serving loop: what a caller's mistakes or a too-small pool get.

A prefix-cache hit that went stale between ``get_computed_blocks`` and
``allocate_slots`` (its block evicted, reused by another request, re-keyed) is
refused with a ValueError and nothing changes; a request that needs more blocks
than the whole pool holds gets a ValueError instead of ``None`` forever (unless
``refuse_unservable`` is off, as the vLLM drop-in sets it).  Both twins, both of
the compiled twin's paths (the full-attention fast path and the general one).
"""

from __future__ import annotations

import re

import pytest

from kvcy.hashing import get_hash_fn_by_name, get_request_block_hasher, init_none_hash
from kvcy.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec, SlidingWindowSpec

BS = 4
STALE = re.compile(r"stale prefix-cache hit for request 'c': block \d+ \(group \d+, position \d+\) no longer holds "
                   r"the request's prefix \(evicted, reused or re-keyed since get_computed_blocks\); look the hits up again")


@pytest.fixture(autouse=True)
def _none_hash():
    init_none_hash(get_hash_fn_by_name("sha256"))


def _spec(window=None):
    if window is None:
        return FullAttentionSpec(block_size=BS, num_kv_heads=1, head_size=8, dtype="float16")
    return SlidingWindowSpec(block_size=BS, num_kv_heads=1, head_size=8, dtype="float16", sliding_window=window)


def make_manager(impl, num_blocks, hybrid=False, max_model_len=256, **kw):
    groups = [KVCacheGroupSpec(["l0"], _spec())]
    if hybrid:
        groups.append(KVCacheGroupSpec(["l1"], _spec(window=8)))
    cfg = KVCacheConfig(num_blocks=num_blocks, kv_cache_tensors=[], kv_cache_groups=groups)
    return impl.kv_cache.KVCacheManager(cfg, max_model_len=max_model_len, scheduler_block_size=BS,
                                        hash_block_size=BS, **kw)


def make_request(impl, rid, tokens, subclass=False):
    cls = impl.kv_cache.Request
    if subclass:  # (another request type: the compiled twin's general path)
        cls = type("OtherRequest", (cls,), {})
    return cls(rid, tokens, block_hasher=get_request_block_hasher(BS, get_hash_fn_by_name("sha256")))


def snapshot(mgr):
    pool = mgr.block_pool
    return (
        pool.get_num_free_blocks(),
        [b.block_id for b in pool.free_block_queue.get_all_free_blocks()],
        [b.ref_cnt for b in pool.blocks],
        [b.block_hash for b in pool.blocks],
        tuple({r: [b.block_id for b in bl] for r, bl in m.req_to_blocks.items()}
              for m in mgr.coordinator.single_type_managers),
    )


PROMPT = list(range(100, 116))  # 4 full blocks


def _cached_prompt(impl, mgr, subclass):
    """Request 'a' computes PROMPT and finishes: its blocks stay cached, free.  Request
    'c' (same prompt, one more token) looks its hit up: returns c and the hit."""
    a = make_request(impl, "a", PROMPT, subclass)
    assert mgr.allocate_slots(a, len(PROMPT)) is not None
    a.num_computed_tokens = len(PROMPT)
    mgr.free(a)
    c = make_request(impl, "c", PROMPT + [7], subclass)
    hits, n, _ = mgr.get_computed_blocks(c)
    assert n == len(PROMPT)
    return c, hits, n


def _reuse_all_blocks(impl, mgr, subclass, **kw):
    # Another request takes every block of the pool (cached ones evicted, reused).
    per_group = (mgr.block_pool.num_gpu_blocks - 1) // mgr.num_kv_cache_groups
    b = make_request(impl, "b", list(range(500, 500 + per_group * BS)), subclass)
    assert mgr.allocate_slots(b, b.num_tokens, **kw) is not None
    return b


@pytest.mark.parametrize("hybrid", [False, True], ids=["full", "full+swa"])
@pytest.mark.parametrize("subclass", [False, True], ids=["request", "subclass"])
@pytest.mark.parametrize("how", ["evicted", "reused_freed", "rekeyed_freed"])
def test_stale_hit_is_refused_and_nothing_changes(impl, hybrid, subclass, how):
    mgr = make_manager(impl, num_blocks=13 if hybrid else 9, hybrid=hybrid)
    c, hits, n = _cached_prompt(impl, mgr, subclass)
    if how == "evicted":  # dropped from the cache, still free
        mgr.evict_blocks({b.block_id for g in hits.blocks for b in g})
    else:
        # Another request takes every block, caching its own tokens in them (rekeyed) or
        # not, and gives them back: free again, holding other KV or none.
        mgr.free(_reuse_all_blocks(impl, mgr, subclass, delay_cache_blocks=how == "reused_freed"))
    before = snapshot(mgr)
    with pytest.raises(ValueError, match=STALE):
        mgr.allocate_slots(c, c.num_tokens - n, num_new_computed_tokens=n, new_computed_blocks=hits)
    assert snapshot(mgr) == before
    assert mgr.get_block_ids("c") == tuple([] for _ in hits.blocks)


@pytest.mark.parametrize("subclass", [False, True], ids=["request", "subclass"])
@pytest.mark.parametrize("cache", [False, True], ids=["reused", "rekeyed"])
def test_hit_held_by_its_new_owner_is_refused(impl, subclass, cache):
    """Two of the hit blocks evicted and now held by another request (with its own tokens
    cached in them, or not yet): refused once the allocation would go ahead; while it
    cannot, None (nothing is taken either way)."""
    mgr = make_manager(impl, num_blocks=12)  # 11 usable
    c, hits, n = _cached_prompt(impl, mgr, subclass)  # hits: the 4 blocks 'a' freed (queue tail)
    x = make_request(impl, "x", list(range(300, 328)), subclass)
    assert mgr.allocate_slots(x, 28) is not None  # the 7 never-used blocks
    b = make_request(impl, "b", list(range(500, 508)), subclass)
    assert mgr.allocate_slots(b, 8, delay_cache_blocks=not cache) is not None  # evicts 2 of the hits
    assert {blk.block_id for blk in mgr.get_blocks("b").blocks[0]} < {blk.block_id for blk in hits.blocks[0]}
    before = snapshot(mgr)
    assert mgr.allocate_slots(c, 1, num_new_computed_tokens=n, new_computed_blocks=hits) is None
    assert snapshot(mgr) == before
    mgr.free(x)
    before = snapshot(mgr)
    with pytest.raises(ValueError, match=STALE):
        mgr.allocate_slots(c, 1, num_new_computed_tokens=n, new_computed_blocks=hits)
    assert snapshot(mgr) == before


@pytest.mark.parametrize("hybrid", [False, True], ids=["full", "full+swa"])
@pytest.mark.parametrize("subclass", [False, True], ids=["request", "subclass"])
def test_fresh_hits_are_accepted(impl, hybrid, subclass):
    """The same hits, not disturbed (or shared with a running request, or re-cached with
    the same tokens by another request), are taken as before."""
    mgr = make_manager(impl, num_blocks=24, hybrid=hybrid)
    c, hits, n = _cached_prompt(impl, mgr, subclass)
    other = make_request(impl, "o", PROMPT + [9], subclass)
    ohits, on, _ = mgr.get_computed_blocks(other)
    assert mgr.allocate_slots(other, 1, num_new_computed_tokens=on, new_computed_blocks=ohits) is not None
    assert mgr.allocate_slots(c, 1, num_new_computed_tokens=n, new_computed_blocks=hits) is not None
    assert mgr.get_block_ids("c")[0][:4] == [b.block_id for b in hits.blocks[0]]


def test_hit_of_another_request_is_refused(impl):
    """Hits looked up for one request and handed to another with other tokens are stale for it."""
    mgr = make_manager(impl, num_blocks=16)
    c, hits, n = _cached_prompt(impl, mgr, False)
    d = make_request(impl, "c", [1] * 17)  # (same id, other tokens)
    before = snapshot(mgr)
    with pytest.raises(ValueError, match=STALE):
        mgr.allocate_slots(d, 1, num_new_computed_tokens=n, new_computed_blocks=hits)
    assert snapshot(mgr) == before


@pytest.mark.parametrize("subclass", [False, True], ids=["request", "subclass"])
def test_stale_hits_are_taken_as_handed_with_the_check_off(impl, subclass):
    """refuse_stale_hits = False: any block handed over is taken, as vLLM's manager takes it
    (the drop-in's setting; vLLM's own tests hand free, uncached blocks as hits)."""
    mgr = make_manager(impl, num_blocks=9)
    c, hits, n = _cached_prompt(impl, mgr, subclass)
    mgr.evict_blocks({b.block_id for g in hits.blocks for b in g})
    mgr.refuse_stale_hits = False
    assert mgr.allocate_slots(c, c.num_tokens - n, num_new_computed_tokens=n, new_computed_blocks=hits) is not None
    assert mgr.get_block_ids("c")[0][:4] == [b.block_id for b in hits.blocks[0]]


@pytest.mark.parametrize("hybrid", [False, True], ids=["full", "full+swa"])
@pytest.mark.parametrize("subclass", [False, True], ids=["request", "subclass"])
def test_request_that_can_never_fit_is_an_error(impl, hybrid, subclass):
    mgr = make_manager(impl, num_blocks=9, hybrid=hybrid)  # 8 usable blocks: 32 tokens
    big = make_request(impl, "big", list(range(40)), subclass)  # (full attention alone needs 10)
    before = snapshot(mgr)
    msg = (r"request 'big' needs \d+ blocks, more than the 8 usable blocks of the whole pool: it can never be "
           r"scheduled; the pool holds 32 tokens, fewer than max_model_len 256 \(vLLM's engine refuses to start "
           r"with such a pool\)")
    with pytest.raises(ValueError, match=msg):
        mgr.allocate_slots(big, 40)
    with pytest.raises(ValueError, match=msg):
        mgr.allocate_slots(big, 8, full_sequence_must_fit=True)
    assert snapshot(mgr) == before
    mgr.refuse_unservable = False  # (vLLM's answer, as the drop-in sets it)
    assert mgr.allocate_slots(big, 40) is None
    assert snapshot(mgr) == before


def test_request_that_fits_later_still_gets_none(impl):
    """Not enough free blocks now, but enough in the pool: None, as in vLLM (the loop
    preempts or waits)."""
    mgr = make_manager(impl, num_blocks=9, max_model_len=32)  # (8 blocks: max_model_len fits)
    a = make_request(impl, "a", list(range(24)))
    assert mgr.allocate_slots(a, 24) is not None
    b = make_request(impl, "b", list(range(100, 132)))
    assert mgr.allocate_slots(b, 32) is None
    a.num_computed_tokens = 24
    assert mgr.allocate_slots(a, 8, num_lookahead_tokens=100) is not None  # (clamped to max_model_len)
    assert mgr.allocate_slots(b, 32) is None
    mgr.free(a)
    assert mgr.allocate_slots(b, 32) is not None


@pytest.mark.parametrize("subclass", [False, True], ids=["request", "subclass"])
def test_groups_together_can_outgrow_the_pool(impl, subclass):
    """Each group's blocks fit, all of them together do not: refused, without the hint about
    max_model_len (the full-attention group alone holds it)."""
    mgr = make_manager(impl, num_blocks=9, hybrid=True, max_model_len=32)
    r = make_request(impl, "r", list(range(32)), subclass)
    with pytest.raises(ValueError, match=r"request 'r' needs 16 blocks, more than the 8 usable blocks of the whole "
                                         r"pool: it can never be scheduled$"):
        mgr.allocate_slots(r, 32)
    assert mgr.allocate_slots(r, 16) is not None  # (a chunk at a time fits)


def test_flag_is_a_bool_in_both_twins(impl):
    mgr = make_manager(impl, num_blocks=9)
    assert mgr.refuse_unservable is True
    mgr.refuse_unservable = 0
    assert mgr.refuse_unservable is False


def test_stale_hit_flag_is_a_bool_in_both_twins(impl):
    mgr = make_manager(impl, num_blocks=9)
    assert mgr.refuse_stale_hits is True
    mgr.refuse_stale_hits = 0
    assert mgr.refuse_stale_hits is False


@pytest.mark.parametrize("hybrid", [False, True], ids=["full", "full+swa"])
@pytest.mark.parametrize("subclass", [False, True], ids=["request", "subclass"])
def test_hit_check_runs_no_hash_eq(impl, hybrid, subclass):
    """The freshness check compares hashes as bytes: a bytes subclass whose __eq__ empties
    the request's hashes mid-check is never called (the compiled twin read the list on
    borrowed pointers), and equal bytes are the same prefix."""
    calls = []

    class Evil(bytes):
        __hash__ = bytes.__hash__

        def __eq__(self, other):
            calls.append(1)
            del c.block_hashes[:]
            return bytes.__eq__(self, other)

    mgr = make_manager(impl, num_blocks=24, hybrid=hybrid)
    c, hits, n = _cached_prompt(impl, mgr, subclass)
    try:
        for i, h in enumerate(list(c.block_hashes)):
            c.block_hashes[i] = Evil(h)
    except TypeError:
        pytest.skip("this twin's request takes no bytes subclass as a block hash")
    try:
        mgr.allocate_slots(c, 1, num_new_computed_tokens=n, new_computed_blocks=hits)
    except (TypeError, ValueError):
        pass  # (refusing the hashes is fine; reading freed memory is not)
    if impl.name == "cython":
        assert calls == []
