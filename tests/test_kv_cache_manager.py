"""KVCacheManager in a serving loop: what a caller's mistakes or a too-small pool get.

A prefix-cache hit that went stale between ``get_computed_blocks`` and
``allocate_slots`` (its block evicted, reused by another request, re-keyed) is
refused with a ValueError and nothing changes; a request that needs more blocks
than the whole pool holds gets a ValueError instead of ``None`` forever (unless
``refuse_unservable`` is off, as the vLLM drop-in sets it).  Both twins, both of
the compiled twin's paths (the full-attention fast path and the general one).
"""

from __future__ import annotations

import inspect
import logging
import re

import pytest

from kvcy import hashing
from kvcy.hashing import get_hash_fn_by_name, get_request_block_hasher, init_none_hash
from kvcy.kv_cache_interface import (
    FullAttentionSpec,
    KVCacheConfig,
    KVCacheGroupSpec,
    SlidingWindowSpec,
    MambaSpec,
)
from kvcy.request import Request, RequestStatus

from _public_state import _objects
from _kv_cache_helpers import (
    _pool_state, cached_flags, config, full_spec_api, full_spec_manager, hashed_ids, hasher_manager,
    hybrid_config, ids, manager_manager, manager_small, request_api, swa_spec,
)

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


def hasher(bs=BS):
    return get_request_block_hasher(bs, get_hash_fn_by_name("sha256"))


def full_config(num_blocks=16, bs=BS):
    spec = FullAttentionSpec(block_size=bs, num_kv_heads=1, head_size=8, dtype="float16")
    return KVCacheConfig(num_blocks=num_blocks, kv_cache_tensors=[], kv_cache_groups=[KVCacheGroupSpec(["l0"], spec)])


def manager(impl, num_blocks=16, **kw):
    kw.setdefault("max_model_len", 256)
    return impl.kv_cache.KVCacheManager(full_config(num_blocks), scheduler_block_size=BS, hash_block_size=BS, **kw)


def _decode_script(kv, managers, seed):
    """Requests admitted, decoded, preempted (freed, recomputed with the same
    Request object) and finished, over one or more managers sharing the
    Request objects; every manager's block table after every call."""
    import random

    rng = random.Random(seed)
    prompts = [[rng.randrange(50) for _ in range(rng.randrange(3, 30))] for _ in range(6)]
    reqs = [kv.Request(f"q{i}", p, block_hasher=hasher()) for i, p in enumerate(prompts)]
    held = {id(m): set() for m in managers}
    trace = []
    for _ in range(300):
        m = rng.choice(managers)
        r = rng.choice(reqs)
        mine = held[id(m)]
        if r.request_id not in mine:
            r.num_computed_tokens = 0
            if rng.random() < 0.5:
                blocks, hit, _ = m.get_computed_blocks(r)
                out = m.allocate_slots(r, r.num_tokens - hit, num_new_computed_tokens=hit,
                                       new_computed_blocks=blocks)
            else:  # no prefix lookup: the plain allocate_slots(request, n) path
                hit = 0
                out = m.allocate_slots(r, r.num_tokens)
            if out is not None:
                mine.add(r.request_id)
                r.num_computed_tokens = r.num_tokens
            trace.append(("admit", r.request_id, hit, None if out is None else out.get_block_ids()))
        elif rng.random() < 0.15:
            m.free(r)
            mine.discard(r.request_id)
            trace.append(("free", r.request_id))
        else:
            r.append_output_token_ids(rng.randrange(50))
            r.num_computed_tokens = r.num_tokens - 1
            out = m.allocate_slots(r, 1)
            trace.append(("decode", r.request_id, None if out is None else out.get_block_ids()))
            if out is not None:
                r.num_computed_tokens = r.num_tokens
        trace.append(tuple(m.get_block_ids(q.request_id) if q.request_id in mine else None for q in reqs))
    return trace


def _fast_vs_general_script(kv, seed, subclass):
    """Random admissions (with hits, must-fit, watermark, reserves, lookahead,
    delayed caching), chunks, decode steps, frees and bad calls on one
    compiled manager; every result, exception and block table, in order."""
    import random

    req_cls = kv.Request if not subclass else type("SubRequest", (kv.Request,), {})
    rng = random.Random(seed)
    # (With events on, lookups take the general path either way.)
    m = kv.KVCacheManager(full_config(24), max_model_len=64, scheduler_block_size=BS, hash_block_size=BS,
                          watermark=0.1, enable_kv_cache_events=seed % 2 == 1)
    prefixes = [[5] * 12, [1, 2, 3, 4, 5, 6, 7, 8], []]
    live = {}
    trace = []

    def note(tag, fn):
        try:
            out = fn()
            trace.append((tag, "ok", out.get_block_ids() if hasattr(out, "get_block_ids") else out))
        except (ValueError, TypeError, RuntimeError, AssertionError) as exc:
            trace.append((tag, type(exc).__name__, str(exc)))

    for step in range(160):
        op = rng.random()
        if op < 0.35 or not live:
            name = f"q{step}"
            tokens = rng.choice(prefixes) + [rng.randrange(20) for _ in range(rng.randrange(1, 30))]
            r = req_cls(name, tokens, block_hasher=hasher(), skip_reading_prefix_cache=rng.random() < 0.1)
            blocks, hit, boundary = m.get_computed_blocks(r)
            trace.append(("hit", hit, boundary, blocks.get_block_ids(), type(blocks).__name__))
            n = r.num_tokens - hit if rng.random() < 0.7 else max(1, (r.num_tokens - hit) // 2)
            kw = dict(num_new_computed_tokens=hit, new_computed_blocks=blocks,
                      full_sequence_must_fit=rng.random() < 0.5, has_scheduled_reqs=bool(live),
                      num_lookahead_tokens=rng.choice([0, 0, 3]), reserved_blocks=rng.choice([0, 0, 2]),
                      delay_cache_blocks=rng.random() < 0.1)
            before = len(trace)
            note("admit", lambda: m.allocate_slots(r, n, **kw))
            if trace[before][1] == "ok" and trace[before][2] is not None:
                r.num_computed_tokens = hit + n
                r.status = RequestStatus.RUNNING
                live[name] = r
                # Hits handed to a request that already holds blocks: refused.
                if hit:
                    note("again", lambda: m.allocate_slots(r, 1, num_new_computed_tokens=hit,
                                                           new_computed_blocks=blocks))
        elif op < 0.75:
            r = live[rng.choice(sorted(live))]
            if r.num_computed_tokens >= r.num_tokens:
                r.append_output_token_ids(rng.randrange(20))
            n = min(r.num_tokens - r.num_computed_tokens, rng.choice([1, 1, 5]))
            before = len(trace)
            note("extend", lambda: m.allocate_slots(r, n, num_lookahead_tokens=rng.choice([0, 2])))
            if trace[before][1] == "ok" and trace[before][2] is not None:
                r.num_computed_tokens += n
        elif op < 0.9:
            name = rng.choice(sorted(live))
            note("free", lambda: m.free(live.pop(name)))
        else:
            r = req_cls(f"bad{step}", [1] * 70, block_hasher=hasher())
            bad = kv.KVCacheBlocks(([object()],))
            note("too long", lambda: m.allocate_slots(r, 70))
            r2 = req_cls(f"bad2{step}", [1, 2, 3], block_hasher=hasher())
            note("not blocks", lambda: m.allocate_slots(r2, 3, num_new_computed_tokens=0, new_computed_blocks=bad))
        trace.append(("state", m.block_pool.get_num_free_blocks(),
                      [b.block_id for b in m.block_pool.free_block_queue.get_all_free_blocks()],
                      sorted((k, m.get_block_ids(k)) for k in live)))
    trace.append(("events", [type(e).__name__ for e in m.take_events()]))
    return trace


def test_allocate_none_changes_nothing(impl):
    mgr = manager(impl, num_blocks=5)
    a = Request("a", list(range(12)), block_hasher=hasher())
    mgr.allocate_slots(a, 12)
    free_before = ids(mgr.block_pool.free_block_queue.get_all_free_blocks())
    b = Request("b", [50 + i for i in range(12)], block_hasher=hasher())
    assert mgr.allocate_slots(b, 12) is None
    assert ids(mgr.block_pool.free_block_queue.get_all_free_blocks()) == free_before
    assert not mgr.coordinator.holds("b")


def test_watermark_applies_to_waiting_only(impl):
    mgr = manager(impl, num_blocks=11, watermark=0.3)  # 3 blocks kept for running requests
    a = Request("a", list(range(32)), block_hasher=hasher())
    assert mgr.allocate_slots(a, 32, has_scheduled_reqs=True) is None  # 8 + 3 > 10 free
    assert mgr.allocate_slots(a, 32, has_scheduled_reqs=False) is not None  # no one else scheduled
    a.status = RequestStatus.RUNNING
    b = Request("b", [99] * 8, block_hasher=hasher())
    assert mgr.allocate_slots(b, 8, has_scheduled_reqs=True) is None  # 2 + 3 > 2 free
    b.status = RequestStatus.RUNNING
    assert mgr.allocate_slots(b, 8, has_scheduled_reqs=True) is not None


# --------------------------------------------------------------------------- bad input
@pytest.mark.parametrize(
    "kwargs, exc",
    [
        ({"num_new_tokens": -1}, ValueError),
        ({"num_new_tokens": 0}, ValueError),
        ({"num_new_tokens": 1.5}, TypeError),
        ({"num_new_tokens": "3"}, TypeError),
        ({"num_new_tokens": 4, "num_lookahead_tokens": -2}, ValueError),
        ({"num_new_tokens": 4, "reserved_blocks": -1}, ValueError),
    ],
)
def test_allocate_slots_rejects_bad_counts(impl, kwargs, exc):
    # (Counts past max_model_len are clamped as in vLLM, not refused:
    # test_allocate_slots_clamps_new_tokens_to_max_model_len.)
    mgr = manager(impl)
    req = Request("a", list(range(8)), block_hasher=hasher())
    before = ids(mgr.block_pool.free_block_queue.get_all_free_blocks())
    with pytest.raises(exc):
        mgr.allocate_slots(req, **kwargs)
    assert ids(mgr.block_pool.free_block_queue.get_all_free_blocks()) == before
    assert not mgr.coordinator.holds("a")


def test_free_unknown_and_twice(impl):
    # vLLM 0.33.0: freeing a request that holds no blocks is a no-op, and its
    # block table is empty (test_free_and_get_blocks_of_a_request_holding_none covers more).
    mgr = manager(impl)
    req = Request("a", list(range(8)), block_hasher=hasher())
    mgr.free(req)
    assert mgr.block_pool.get_num_free_blocks() == 15
    mgr.allocate_slots(req, 8)
    mgr.free(req)
    mgr.free(req)
    assert mgr.get_block_ids("nope") == ([],)
    assert mgr.block_pool.get_num_free_blocks() == 15


def test_manager_accepts_either_twins_request(impl):
    """The compiled manager reads a compiled Request's fields directly; any other request works too."""
    from kvcy import _fast

    results = []
    for name in _fast.available():
        R = _fast.load(name)["kv_cache"].Request
        mgr = manager(impl)
        a = R("a", list(range(12)), block_hasher=hasher())
        mgr.allocate_slots(a, 12)
        mgr.free(a)
        b = R("b", list(range(12)) + [99, 98], block_hasher=hasher())
        blocks, hit, _ = mgr.get_computed_blocks(b)
        new = mgr.allocate_slots(b, 14 - hit, num_new_computed_tokens=hit, new_computed_blocks=blocks)
        results.append((hit, blocks.get_block_ids(), new.get_block_ids(), mgr.get_block_ids("b")))
    assert results[0][0] == 12  # the 3 full blocks of the 12-token prompt hit
    assert all(r == results[0] for r in results)


def test_free_lets_the_block_list_go(impl):
    """After free(request) nothing -- not the Request object either -- keeps
    the request's old block list (and through it the blocks) referenced."""
    import sys

    mgr = manager(impl, num_blocks=16)
    pool = mgr.block_pool
    def refs(i):
        return sys.getrefcount(pool.blocks[i])

    before = {i: refs(i) for i in range(len(pool.blocks))}
    req = Request("a", list(range(10)), block_hasher=hasher())  # 2 full blocks (cached) + 1 partial
    new = mgr.allocate_slots(req, 10)
    held = new.get_block_ids()[0]
    del new
    mgr.free(req)
    cached = [pool.blocks[i].block_hash is not None for i in held]
    assert cached == [True, True, False]
    # The free queue holds each block as before; a cached one is held by the cache map too.
    assert [refs(i) - before[i] for i in held] == [1, 1, 0]


@pytest.mark.parametrize("seed", range(4))
def test_request_reused_across_frees_and_managers(seed):
    """The compiled manager remembers a request's bookkeeping on the Request;
    frees, re-admissions and a second manager using the same Request objects
    must see exactly what the pure-Python twin sees."""
    from kvcy import _fast

    if "cython" not in _fast.available():
        pytest.skip("compiled twins not built")
    cy, py = _fast.load("cython")["kv_cache"], _fast.load("python")["kv_cache"]

    def run(kv):
        managers = [kv.KVCacheManager(full_config(12), max_model_len=256, scheduler_block_size=BS, hash_block_size=BS)
                    for _ in range(2)]
        for m in managers:  # (the script's long requests wait for a pool that can never hold them)
            m.refuse_unservable = False
        return _decode_script(kv, managers, seed)

    assert run(cy) == run(py)


@pytest.mark.parametrize("seed", range(6))
def test_compiled_fast_path_matches_general_path(seed):
    """The compiled manager's fast paths (a kvcy Request on one full-attention
    group: get_computed_blocks and allocate_slots) make exactly the decisions,
    with exactly the errors, of its general paths (reached with a Request
    subclass), which the pure-Python twin mirrors."""
    from kvcy import _fast

    if "cython" not in _fast.available():
        pytest.skip("compiled twins not built")
    cy = _fast.load("cython")["kv_cache"]
    fast = _fast_vs_general_script(cy, seed, subclass=False)
    general = _fast_vs_general_script(cy, seed, subclass=True)
    assert fast == general
    # Bad hits: a clear TypeError, before anything changes (the state rows
    # after them are compared above).
    bad = [t for t in fast if t[0] == "not blocks"]
    assert bad and all(t[1] == "TypeError" for t in bad)
    assert any(t[0] == "admit" and t[1] == "ok" for t in fast)
    assert any(t[0] == "again" and t[1] == "AssertionError" for t in fast)


def test_two_request_objects_with_one_id_share_its_blocks():
    """Two live Request objects with the same id (a serving loop's mistake)
    address one entry, as in vLLM: calls through either see the blocks and
    cached count the other made, and one free returns every block."""
    from kvcy import _fast

    if "cython" not in _fast.available():
        pytest.skip("compiled twins not built")
    results = {}
    for name in ("cython", "python"):
        kv = _fast.load(name)["kv_cache"]
        m = kv.KVCacheManager(full_config(16), max_model_len=64, scheduler_block_size=BS, hash_block_size=BS)
        a, b = (kv.Request("x", list(range(6)), block_hasher=hasher()) for _ in range(2))
        out = [m.allocate_slots(a, 6).get_block_ids()]
        for r in (a, b):
            r.num_computed_tokens = 6
        for step in range(14):
            for r in (a, b):
                r.append_output_token_ids(step)
            who = a if step % 3 else b
            got = m.allocate_slots(who, 1)
            out.append(None if got is None else got.get_block_ids())
            for r in (a, b):
                r.num_computed_tokens += 1
            out.append(m.get_block_ids("x"))
        out.append(len(m.block_pool.cached_block_hash_to_block))
        m.free(b)
        out.append(m.block_pool.get_num_free_blocks())
        m.free(a)  # its blocks went with b's free: a no-op now, as in vLLM
        out.append(m.block_pool.get_num_free_blocks())
        results[name] = out
    assert results["cython"] == results["python"]
    assert results["python"][-1] == 15


@pytest.mark.parametrize("call", ["free", "get_computed_blocks", "allocate_slots"])
def test_manager_calls_reject_what_is_not_a_request(impl, call):
    mgr = manager(impl)
    for bad in (5, None, "r0", [1, 2]):
        with pytest.raises(TypeError, match="expected a Request"):
            if call == "allocate_slots":
                mgr.allocate_slots(bad, 4)
            else:
                getattr(mgr, call)(bad)
    assert mgr.block_pool.get_num_free_blocks() == 15


@pytest.mark.parametrize("events", [False, True])
def test_allocate_slots_rejects_a_free_hit_outside_the_queue_unchanged(impl, events):
    """A free hit that is not in the free queue (another pool's block) is refused before
    anything is touched; it used to leave the hits before it touched and the request
    registered."""
    mgr = manager(impl, enable_kv_cache_events=events)
    req = impl.kv_cache.Request("r", list(range(12)), block_hasher=hasher())
    free_block = mgr.block_pool.free_block_queue.get_all_free_blocks()[0]
    before = _pool_state(mgr.block_pool)
    hits = impl.kv_cache.KVCacheBlocks(([free_block, impl.kv_cache.KVCacheBlock(5)],))
    with pytest.raises(RuntimeError, match="not a block of this pool"):
        mgr.allocate_slots(req, 4, num_new_computed_tokens=2 * BS, new_computed_blocks=hits)
    assert _pool_state(mgr.block_pool) == before
    assert not mgr.coordinator.single_type_managers[0].req_to_blocks
    assert mgr.allocate_slots(req, req.num_tokens) is not None  # the request is still new


def full_spec(bs: int = BS) -> FullAttentionSpec:
    return FullAttentionSpec(block_size=bs, num_kv_heads=1, head_size=8, dtype="float16")


def manager_edges(impl, num_blocks=20, max_model_len=40, **kw):
    cfg = KVCacheConfig(num_blocks=num_blocks, kv_cache_tensors=[],
                        kv_cache_groups=[KVCacheGroupSpec(["l0"], full_spec())])
    return impl.kv_cache.KVCacheManager(cfg, max_model_len=max_model_len, scheduler_block_size=BS,
                                        hash_block_size=BS, **kw)


def request(impl, rid, tokens):
    return impl.kv_cache.Request(rid, tokens, block_hasher=get_request_block_hasher(BS, get_hash_fn_by_name("sha256")))


# ------------------------------------------- a request longer than max_model_len
@pytest.mark.parametrize("events", [False, True])
def test_request_longer_than_max_model_len(impl, events):
    """A 50-token request under ``max_model_len=40`` (block size 4): vLLM allocates the 10
    blocks the clamp allows and caches those it holds although 12 blocks are full; with
    events on, its event loop then reads past the request's blocks (IndexError, no event
    queued), after the caching.  kvcy raised RuntimeError either way."""
    mgr = manager_edges(impl, enable_kv_cache_events=events)
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


# ------------------------------------------------------------- vLLM's own errors
def test_allocate_slots_with_nothing_to_do_says_what_vllm_says(impl):
    mgr = manager_edges(impl)
    with pytest.raises(ValueError) as err:
        mgr.allocate_slots(request(impl, "a", list(range(8))), 0)
    assert str(err.value) == "num_new_tokens must be greater than 0 when there are no computed tokens to adopt"


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


# ------------------------------------------------- §3 take_events
def test_take_events_annotates_and_warns_for_blockstored_subclasses(impl, caplog):
    """vLLM tests events with isinstance: a BlockStored subclass is annotated, or warned about."""
    import logging

    from kvcy.kv_events import BlockStored

    class MyStored(BlockStored):
        pass

    mgr = manager_small(impl, 2, enable_kv_cache_events=True)

    def stored(group_idx):
        return MyStored(block_hashes=[1], parent_block_hash=None, token_ids=[1, 2, 3, 4], block_size=BS,
                        lora_id=None, medium="GPU", lora_name=None, group_idx=group_idx)

    known, unknown = stored(1), stored(5)
    mgr.block_pool.kv_event_queue.extend([known, unknown])
    with caplog.at_level(logging.WARNING, logger="kvcy"):
        assert mgr.take_events() == [known, unknown]
    assert (known.kv_cache_spec_kind, known.kv_cache_spec_sliding_window) == mgr.kv_cache_event_metadata[1]
    assert known.kv_cache_spec_kind is not None
    assert unknown.kv_cache_spec_kind is None
    assert "Group index `5` not in KV cache metadata" in caplog.text


def free_ids(mgr):
    return [b.block_id for b in mgr.block_pool.free_block_queue.get_all_free_blocks()]


# ------------------------------------------------- 2. allocate_slots past max_model_len
def _at_end(impl, groups, computed, enable_caching=True):
    """A 16-token request, max_model_len=16, ``computed`` of its tokens already held."""
    mgr = manager_manager(impl, groups, num_blocks=32, max_model_len=16, enable_caching=enable_caching)
    req = impl.kv_cache.Request("a", list(range(16)), block_hasher=hasher_manager())
    if computed:
        assert mgr.allocate_slots(req, computed) is not None
        req.num_computed_tokens = computed
    return mgr, req


# ------------------------------------------------- 1. requests holding no blocks
@pytest.mark.parametrize("groups", [1, 2])
def test_free_and_get_blocks_of_a_request_holding_none(impl, groups):
    """vLLM frees nothing for such a request and reports empty block tables."""
    mgr = manager_manager(impl, groups)
    req = impl.kv_cache.Request("a", list(range(8)), block_hasher=hasher_manager())
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
    mgr = manager_manager(impl)

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


@pytest.mark.parametrize("groups", [1, 2])
@pytest.mark.parametrize("enable_caching", [True, False])
def test_allocate_slots_clamps_new_tokens_to_max_model_len(impl, groups, enable_caching):
    """vLLM clamps the slots needed to max_model_len; kvcy used to raise."""
    mgr, req = _at_end(impl, groups, 12, enable_caching)
    new = mgr.allocate_slots(req, 8, num_lookahead_tokens=3)  # 12 + 8 + 3 > 16
    assert new is not None
    assert [len(g) for g in new.get_block_ids()] == [1] * groups  # up to token 16, not 23
    # never more than max_model_len's worth of slots, in any group
    assert len(mgr.get_block_ids("a")[0]) == 16 // BS
    if enable_caching:
        assert len(mgr.block_pool.cached_block_hash_to_block) == groups * 16 // BS


@pytest.mark.parametrize("groups", [1, 2])
def test_allocate_slots_clamps_external_tokens_to_max_model_len(impl, groups):
    mgr, req = _at_end(impl, groups, 0)
    new = mgr.allocate_slots(req, 8, num_external_computed_tokens=12)  # 12 + 8 > 16
    assert new is not None
    assert len(mgr.get_block_ids("a")[0]) == 16 // BS
    assert mgr.block_pool.get_num_free_blocks() == 31 - sum(
        1 for g in mgr.get_block_ids("a") for b in g if b != 0)


def test_allocate_slots_clamp_is_the_same_in_both_twins():
    from kvcy import _fast

    if "cython" not in _fast.available():
        pytest.skip("compiled twins not built")
    runs = {}
    for name in ("cython", "python"):
        impl = type("I", (), {"kv_cache": _fast.load(name)["kv_cache"]})
        out = []
        for groups in (1, 2):
            mgr, req = _at_end(impl, groups, 12)
            out.append(mgr.allocate_slots(req, 8, num_lookahead_tokens=3).get_block_ids())
            out.append(mgr.get_block_ids("a"))
            mgr, req = _at_end(impl, groups, 0)
            out.append(mgr.allocate_slots(req, 8, num_external_computed_tokens=12).get_block_ids())
            out.append((mgr.get_block_ids("a"), free_ids(mgr)))
        runs[name] = out
    assert runs["cython"] == runs["python"]


@pytest.mark.parametrize("kwargs", [{"num_new_tokens": -1}, {"num_new_tokens": 4, "num_lookahead_tokens": -1},
                                    {"num_new_tokens": 4, "num_external_computed_tokens": -4}])
def test_allocate_slots_still_refuses_negative_counts(impl, kwargs):
    mgr, req = _at_end(impl, 1, 12)
    before = free_ids(mgr)
    with pytest.raises(ValueError):
        mgr.allocate_slots(req, **kwargs)
    assert free_ids(mgr) == before


# ------------------------------------------------- 3. external tokens already covered
@pytest.mark.parametrize("enable_caching", [True, False])
def test_external_computed_blocks_already_held_is_a_no_op(impl, enable_caching):
    """A request holding more blocks than its external tokens need: vLLM allocates nothing;
    kvcy refused it with ValueError("num_blocks must be non-negative, got -2")."""
    mgr = manager_manager(impl, enable_caching=enable_caching)
    req = impl.kv_cache.Request("r0", list(range(20)), block_hasher=hasher_manager())
    assert mgr.allocate_slots(req, 20) is not None
    stm = mgr.coordinator.single_type_managers[0]
    held = mgr.get_block_ids("r0")
    before = free_ids(mgr)
    stm.allocate_external_computed_blocks("r0", 3, 7)  # 10 tokens: 3 blocks, 5 held
    stm.allocate_external_computed_blocks("r0", 0, 20)  # exactly the 5 held
    assert mgr.get_block_ids("r0") == held and free_ids(mgr) == before
    stm.allocate_external_computed_blocks("r0", 20, 4)  # one block more: still allocated
    assert len(mgr.get_block_ids("r0")[0]) == 6 and len(free_ids(mgr)) == len(before) - 1


@pytest.mark.parametrize("groups", [1, 2])
def test_allocate_slots_with_external_tokens_inside_held_blocks(impl, groups):
    # (prefix caching on: with it off, vLLM's running request has no cached-block
    # entry and trips an assertion here, as kvcy's Python twin does)
    mgr = manager_manager(impl, groups, num_blocks=32)
    req = impl.kv_cache.Request("r0", list(range(20)), block_hasher=hasher_manager())
    assert mgr.allocate_slots(req, 20) is not None  # 5 blocks held, none computed yet
    held = mgr.get_block_ids("r0")
    before = free_ids(mgr)
    new = mgr.allocate_slots(req, 4, num_external_computed_tokens=4)  # 8 tokens: 2 blocks
    assert new is not None and new.get_block_ids() == tuple([] for _ in range(groups))
    assert mgr.get_block_ids("r0") == held and free_ids(mgr) == before


# ----------------------------- 9. pop_blocks_for_free and free leave the lists alone
@pytest.mark.parametrize("groups", [1, 2])
def test_free_leaves_the_request_block_lists_in_their_order(impl, groups):
    """vLLM frees ``reversed(...)`` of the popped list; the list itself (which
    ``get_blocks`` hands out) keeps its order. kvcy used to reverse it in place."""
    mgr = manager_manager(impl, groups, num_blocks=32)
    req = impl.kv_cache.Request("a", list(range(18)), block_hasher=hasher_manager())
    assert mgr.allocate_slots(req, 18) is not None
    held = mgr.get_blocks("a")
    lists = [list_ for list_ in held.blocks]
    ids = [[b.block_id for b in blocks] for blocks in lists]
    assert all(len(i) == 5 for i in ids)
    mgr.free(req)
    assert [[b.block_id for b in blocks] for blocks in lists] == ids
    assert held.get_block_ids() == tuple(ids)
    if groups == 1:
        # still freed tail first: the four cached blocks end the queue last-first,
        # the unhashed fifth went to the front
        assert free_ids(mgr)[-4:] == ids[0][3::-1]
        assert free_ids(mgr)[0] == ids[0][4]


def test_manager_checks_context_parallel_sizes_as_its_groups_do(impl):
    """One check for dcp / pcp sizes, in the manager and each single-type manager: a
    non-int is a TypeError (1.0 used to pass the manager's ``!= 1`` test)."""
    cfg = KVCacheConfig(num_blocks=16, kv_cache_tensors=[], kv_cache_groups=[KVCacheGroupSpec(["a"], full_spec_manager())])
    make = impl.kv_cache.KVCacheManager
    with pytest.raises(TypeError, match="dcp_world_size must be an int, got float"):
        make(cfg, 64, BS, BS, dcp_world_size=1.0)
    with pytest.raises(ValueError, match="pcp_world_size must be a positive int, got 0"):
        make(cfg, 64, BS, BS, pcp_world_size=0)
    assert make(cfg, 64, BS, BS, pcp_world_size=2).coordinator.single_type_managers[0].pcp_world_size == 2
    assert make(cfg, 64, BS, BS, dcp_world_size=1, pcp_world_size=1) is not None


SHA = get_hash_fn_by_name("sha256")


def mamba_spec():
    return MambaSpec(block_size=BS, shapes=((2,),), dtypes=("float32",))


def manager_api(impl, specs=None, num_blocks=16, **kw):
    specs = [full_spec_api()] if specs is None else specs
    return impl.kv_cache.KVCacheManager(config(specs, num_blocks), max_model_len=64, scheduler_block_size=BS,
                                        hash_block_size=BS, **kw)


# ----------------------------------------------------------------- 1. constructor
# vLLM 0.33.0's KVCacheManager.__init__, in order.
VLLM_INIT = [
    "kv_cache_config", "max_model_len", "scheduler_block_size", "hash_block_size", "max_in_flight_tokens",
    "enable_caching", "use_eagle", "num_hash_lookahead_tokens", "num_prefill_lookahead", "log_stats",
    "enable_kv_cache_events", "dcp_world_size", "pcp_world_size", "metrics_collector", "watermark",
    "enable_mamba_shared_prefix_checkpoint",
]


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


def test_constructor_parameters_are_vllms_in_vllms_order(impl):
    cfg = config([full_spec_api()])
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
        kv_cache_config=config([full_spec_api(), swa_spec()]),
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


@pytest.mark.parametrize("name", ["mamba_shared_prefix_checkpoint", "retained_hit_group_ids"])
def test_new_manager_attributes_are_read_only(impl, name):
    mgr = manager_api(impl)
    with pytest.raises(AttributeError):
        setattr(mgr, name, True)


def test_context_parallel_world_sizes_reach_the_managers(impl):
    # A dcp-sharded group's block spans block_size * dcp tokens: the unitary
    # coordinator then wants hashes (and scheduling) at that span, as vLLM does.
    with pytest.raises(AssertionError, match="hash_block_size == block_size"):
        manager_api(impl, dcp_world_size=2)
    mgr = impl.kv_cache.KVCacheManager(config([full_spec()]), max_model_len=64, scheduler_block_size=2 * BS,
                                       hash_block_size=2 * BS, dcp_world_size=2, pcp_world_size=3)
    (m,) = mgr.coordinator.single_type_managers
    assert (m.dcp_world_size, m.pcp_world_size, m.block_size) == (2, 3, 2 * BS)
    assert (mgr.coordinator.dcp_world_size, mgr.coordinator.pcp_world_size) == (2, 3)
    # A replicated (not dcp-sharded) group keeps its block size and world sizes of 1.
    mgr = manager_api(impl, [mamba_spec()], enable_caching=False, dcp_world_size=4, pcp_world_size=2)
    (m,) = mgr.coordinator.single_type_managers
    assert (m.dcp_world_size, m.pcp_world_size, m.block_size) == (1, 1, BS)


@pytest.mark.parametrize("kw, exc, match", [({"dcp_world_size": 0}, ValueError, "dcp_world_size must be a positive"),
                                            ({"pcp_world_size": -1}, ValueError, "pcp_world_size must be a positive"),
                                            ({"dcp_world_size": 2.0}, TypeError, "dcp_world_size must be an int")])
def test_context_parallel_world_sizes_are_checked(impl, kw, exc, match):
    with pytest.raises(exc, match=match):
        manager_api(impl, **kw)


def test_watermark_is_only_asserted_non_negative(impl):
    with pytest.raises(AssertionError, match="watermark must be non-negative"):
        manager_api(impl, watermark=-0.1)
    assert manager_api(impl, watermark=1.5).watermark_blocks == 24  # int(1.5 * 16), as in vLLM
    assert manager_api(impl, watermark=0.5).watermark_blocks == 8


@pytest.mark.parametrize("kw", [{"num_hash_lookahead_tokens": -1}, {"num_prefill_lookahead": -2},
                                {"num_hash_lookahead_tokens": 1.5}, {"num_prefill_lookahead": "2"}])
def test_lookahead_counts_are_checked(impl, kw):
    with pytest.raises(ValueError, match="must be a non-negative int"):
        manager_api(impl, **kw)


def test_multi_module_mtp_needs_a_scheduler_block_as_long_as_its_lookahead(impl):
    with pytest.raises(ValueError, match="Multi-module MTP"):
        manager_api(impl, use_eagle=True, num_prefill_lookahead=5)
    manager_api(impl, use_eagle=True, num_prefill_lookahead=5, enable_caching=False)  # no caching: fine
    manager_api(impl, use_eagle=False, num_prefill_lookahead=5)  # no EAGLE group: fine


def test_no_lookahead_no_lookahead_token_ids(impl):
    mgr = manager_api(impl, enable_kv_cache_events=True)
    mgr.allocate_slots(request_api(impl, "a", range(9)), 9)
    (event,) = mgr.take_events()
    assert event.lookahead_token_ids is None


# ----------------------------------------------------------------- 2. stats
def test_get_computed_blocks_no_longer_records_stats(impl):
    """vLLM 0.33.0's scheduler records them, at admission, with record_prefix_cache_stats."""
    mgr = manager_api(impl, log_stats=True)
    mgr.allocate_slots(request_api(impl, "a", range(10)), 10)
    req = request_api(impl, "b", range(10))
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
    mgr = manager_api(impl, log_stats=True)
    mgr.record_prefix_cache_stats(request_api(impl, "a", range(10), skip_reading_prefix_cache=True), 0)
    assert mgr.make_prefix_cache_stats().requests == 0
    off = manager_api(impl, log_stats=True, enable_caching=False)
    off.record_prefix_cache_stats(request_api(impl, "a", range(10)), 0)
    assert off.make_prefix_cache_stats().requests == 0
    quiet = manager_api(impl)
    quiet.record_prefix_cache_stats(request_api(impl, "a", range(10)), 0)  # no stats kept: nothing happens
    assert quiet.make_prefix_cache_stats() is None


def test_prefix_cache_lookup_enabled(impl):
    assert manager_api(impl).prefix_cache_lookup_enabled(request_api(impl, "a", range(4))) is True
    skip = request_api(impl, "a", range(4), skip_reading_prefix_cache=True)
    assert manager_api(impl).prefix_cache_lookup_enabled(skip) is False
    assert manager_api(impl, enable_caching=False).prefix_cache_lookup_enabled(request_api(impl, "a", range(4))) is False


# ----------------------------------------------------------------- lookups
@pytest.mark.parametrize("specs", [[full_spec_api()], [full_spec_api(), swa_spec()]])
def test_get_computed_blocks_max_cache_hit_length(impl, specs):
    mgr = manager_api(impl, specs)
    mgr.allocate_slots(request_api(impl, "a", range(13)), 13)
    req = request_api(impl, "b", range(13))
    assert mgr.get_computed_blocks(req)[1] == 12
    blocks, hit, boundary = mgr.get_computed_blocks(req, max_cache_hit_length=6)
    assert (hit, boundary) == (4, 0)
    assert [len(g) for g in blocks.blocks][0] == 1
    assert mgr.get_computed_blocks(req, 0)[1] == 0
    assert mgr.get_computed_blocks(req, max_cache_hit_length=None)[1] == 12


def test_get_computed_blocks_for_connector_without_a_hybrid_mamba(impl):
    mgr = manager_api(impl)
    mgr.allocate_slots(request_api(impl, "a", range(10)), 10)
    blocks, hit, boundary, diverged = mgr.get_computed_blocks_for_connector(request_api(impl, "b", range(10)))
    assert (hit, boundary, diverged) == (8, 0, False)
    assert blocks.get_block_ids() == ([1, 2],)


def test_get_block_ids_for_computed_tokens(impl):
    mgr = manager_api(impl, [full_spec_api(), swa_spec()])
    mgr.allocate_slots(request_api(impl, "c", range(10)), 10)
    full, swa = mgr.get_block_ids("c")
    assert mgr.get_block_ids_for_computed_tokens("c", 5) == (full[:2], swa[:2])
    assert mgr.get_block_ids_for_computed_tokens("c", 0) == ([], [])
    assert mgr.get_block_ids_for_computed_tokens("c", 100) == (full, swa)
    assert mgr.get_block_ids_for_computed_tokens("nobody", 8) == ([], [])


def test_get_block_ids_for_computed_tokens_leaves_mamba_whole(impl):
    mgr = manager_api(impl, [full_spec_api(), mamba_spec()], enable_caching=False)
    mgr.allocate_slots(request_api(impl, "c", range(10)), 10)
    full, mamba = mgr.get_block_ids("c")
    assert mgr.get_block_ids_for_computed_tokens("c", 4) == (full[:1], mamba)


def test_estimate_cached_tokens(impl):
    mgr = manager_api(impl, [full_spec_api(), swa_spec()])
    req = request_api(impl, "c", range(10))
    assert mgr.estimate_cached_tokens(req) == 0
    mgr.allocate_slots(req, 10)
    assert mgr.estimate_cached_tokens(req) == 8
    req2 = request_api(impl, "d", range(10))
    mgr.allocate_slots(req2, 10, delay_cache_blocks=True)
    assert mgr.estimate_cached_tokens(req2) == 0
    off = manager_api(impl, enable_caching=False)
    off.allocate_slots(req, 10)
    assert off.estimate_cached_tokens(req) == 0


def test_cache_blocks_on_the_manager(impl):
    mgr = manager_api(impl)
    req = request_api(impl, "a", range(10))
    mgr.allocate_slots(req, 10, delay_cache_blocks=True)
    assert cached_flags(mgr, "a") == [False, False, False]
    mgr.cache_blocks(req, 4)
    assert cached_flags(mgr, "a") == [True, False, False]
    mgr.cache_blocks(req, 10)
    assert cached_flags(mgr, "a") == [True, True, False]
    off = manager_api(impl, enable_caching=False)
    off.allocate_slots(req, 10)
    off.cache_blocks(req, 10)  # caching off: nothing
    assert cached_flags(off, "a") == [False, False, False]


def test_truncate_computed_blocks(impl):
    mgr = manager_api(impl, [full_spec_api(), swa_spec()])
    mgr.allocate_slots(request_api(impl, "a", range(10)), 10)
    blocks, hit, _ = mgr.get_computed_blocks(request_api(impl, "b", range(10)))
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
    mgr = manager_api(impl, [full_spec_api(), mamba_spec()], num_blocks=32, enable_caching=False)
    assert mgr.kv_cache_config.needs_kv_cache_zeroing
    req = request_api(impl, "a", range(10))
    mgr.allocate_slots(req, 10)
    full = mgr.get_block_ids("a")[0]
    assert mgr.take_new_block_ids() == full
    assert mgr.take_new_block_ids() == []
    mgr.record_blocks_for_zeroing("a", 4)
    assert mgr.take_new_block_ids() == full[1:]
    with pytest.raises(AssertionError):
        mgr.record_blocks_for_zeroing("a", 3)
    # External tokens' blocks too, unless their group is skipped.
    ext = request_api(impl, "b", range(50, 60))
    new = mgr.allocate_slots(ext, 2, num_external_computed_tokens=8)
    assert mgr.take_new_block_ids() == mgr.get_block_ids("b")[0]
    skipped = request_api(impl, "c", range(70, 80))
    new = mgr.allocate_slots(skipped, 2, num_external_computed_tokens=8, skip_zeroing_group_ids=(0,))
    assert mgr.take_new_block_ids() == new.get_block_ids()[0]
    assert len(mgr.get_block_ids("c")[0]) == 3


@pytest.mark.parametrize("enable_caching", [True, False])
def test_nothing_recorded_when_nothing_is_zeroed(impl, enable_caching):
    mgr = manager_api(impl, enable_caching=enable_caching)
    assert not mgr.kv_cache_config.needs_kv_cache_zeroing
    mgr.allocate_slots(request_api(impl, "a", range(10)), 10)
    assert mgr.take_new_block_ids() == []
    mgr.record_blocks_for_zeroing("a", 0)
    assert mgr.take_new_block_ids() == []


def test_no_copies_or_boundary_states_without_partial_hits(impl):
    mgr = manager_api(impl)
    req = request_api(impl, "a", range(10))
    mgr.allocate_slots(req, 10)
    assert mgr.take_kv_cache_block_copies() == ([], [])
    assert mgr.take_boundary_state_offloads() == {}
    assert mgr.finalize_partial_tail_offloads(req) == []


# ----------------------------------------------------------------- 3. changed signatures
def test_get_num_common_prefix_blocks_is_always_zero(impl):
    """Deprecated in vLLM 0.33.0 (cascade attention is gone): zero per group."""
    mgr = manager_api(impl, [full_spec_api(), swa_spec()])
    for rid in ("a", "b"):
        req = request_api(impl, rid, range(13))
        blocks, hit, _ = mgr.get_computed_blocks(req)
        mgr.allocate_slots(req, 13 - hit, num_new_computed_tokens=hit, new_computed_blocks=blocks)
    assert mgr.get_num_common_prefix_blocks("a") == [0, 0]
    assert manager_api(impl).get_num_common_prefix_blocks("nobody") == [0]


def test_remove_skipped_blocks_takes_num_prompt_tokens(impl):
    mgr = manager_api(impl, [full_spec_api(), swa_spec()])
    req = request_api(impl, "a", range(20))
    mgr.allocate_slots(req, 20)
    mgr.remove_skipped_blocks("a", 20, 20)
    mgr.coordinator.remove_skipped_blocks("a", 20, num_prompt_tokens=20)
    assert mgr.get_block_ids("a")[1][:3] == [0, 0, 0]
    mgr.remove_skipped_blocks("a", 20, num_prompt_tokens=None)


def test_allocate_slots_takes_skip_zeroing_group_ids(impl):
    params = inspect.signature(impl.kv_cache.KVCacheManager.allocate_slots).parameters
    assert list(params)[-1] == "skip_zeroing_group_ids"
    mgr = manager_api(impl)
    assert mgr.allocate_slots(request_api(impl, "a", range(10)), 10, skip_zeroing_group_ids=(0,)) is not None


def test_kv_cache_blocks_group_ids(impl):
    mgr = manager_api(impl, [full_spec_api(), swa_spec()])
    blocks = mgr.allocate_slots(request_api(impl, "a", range(10)), 10)
    full, swa = blocks.get_block_ids()
    assert blocks.get_block_ids(group_ids=[1]) == (swa,)
    assert blocks.get_block_ids(group_ids=(1, 0)) == (swa, full)
    assert blocks.get_block_ids(True, group_ids=[0]) == (full,)
    assert mgr.empty_kv_cache_blocks.get_block_ids(allow_none=True, group_ids=[1]) is None
    assert mgr.empty_kv_cache_blocks.get_block_ids(group_ids=[]) == ()
    with pytest.raises(TypeError):
        blocks.get_block_ids(False, [0])  # keyword only, as in vLLM


def test_kv_cache_blocks_unhashed_ids(impl):
    mgr = manager_api(impl, [full_spec_api(), swa_spec()])
    mgr.allocate_slots(request_api(impl, "a", range(10)), 10)
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
    mgr = manager_api(impl, enable_kv_cache_events=True)
    req = request_api(impl, "a", range(8))
    blocks = mgr.block_pool.get_new_blocks(2)
    mgr.block_pool.cache_full_blocks(req, blocks, 0, 2, BS, 3)
    with caplog.at_level(logging.WARNING, logger="kvcy"):
        (event,) = mgr.take_events()
    assert event.group_idx == 3 and event.kv_cache_spec_kind is None
    assert "Group index `3` not in KV cache metadata" in caplog.text


@pytest.mark.parametrize("name", sorted(VLLM_METHODS))
def test_manager_methods_have_vllms_parameters(impl, name):
    method = getattr(impl.kv_cache.KVCacheManager, name)
    params = [p for p in inspect.signature(method).parameters if p != "self"]
    assert params == VLLM_METHODS[name]


def test_cache_blocks_of_a_request_holding_none_does_nothing(impl):
    mgr = manager_api(impl)
    mgr.cache_blocks(request_api(impl, "a", range(8)), 8)
    assert mgr.get_block_ids("a") == ([],)
    with pytest.raises(ValueError):
        mgr.cache_blocks(request_api(impl, "a", range(8)), -1)


def test_block_stored_carries_the_request_session(impl):
    """vLLM's pool fills BlockStored.session_id from the request (kvcy's Request takes one, None
    by default, as vLLM's)."""
    mgr = manager_api(impl, enable_kv_cache_events=True)
    mgr.allocate_slots(request_api(impl, "a", range(8), session_id="chat-7"), 8)
    mgr.allocate_slots(request_api(impl, "b", range(100, 108)), 8)
    assert [e.session_id for e in mgr.take_events()] == ["chat-7", None]


def test_stats_object_set_to_none_is_asserted_as_in_vllm(impl):
    """vLLM 0.33.0 asserts ``prefix_cache_stats is not None`` (a public attribute)
    before recording or flagging a reset; the reset changes nothing first here."""
    mgr = manager_api(impl, log_stats=True)
    req = request_api(impl, "a", range(10))
    mgr.allocate_slots(req, 10)
    mgr.free(req)
    mgr.prefix_cache_stats = None
    with pytest.raises(AssertionError):
        mgr.record_prefix_cache_stats(req, 4)
    with pytest.raises(AssertionError):
        mgr.reset_prefix_cache()
    assert mgr.get_computed_blocks(request_api(impl, "b", range(10)))[1] == 8  # the cache was not reset


def test_manager_events_default_to_int_hashes(impl, monkeypatch):
    """vLLM reads VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES as on when it is unset."""
    from kvcy.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec

    hashing.init_none_hash(hashing.sha256)
    spec = FullAttentionSpec(block_size=4, num_kv_heads=1, head_size=8, dtype="float16")
    cfg = KVCacheConfig(num_blocks=8, kv_cache_tensors=[], kv_cache_groups=[KVCacheGroupSpec(["l"], spec)])
    for env, want_int in ((None, True), ("0", False), ("1", True)):
        if env is None:
            monkeypatch.delenv("VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES", raising=False)
        else:
            monkeypatch.setenv("VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES", env)
        mgr = impl.kv_cache.KVCacheManager(cfg, max_model_len=64, scheduler_block_size=4, hash_block_size=4,
                                           enable_kv_cache_events=True)
        req = impl.kv_cache.Request("r", list(range(8)),
                                    block_hasher=hashing.get_request_block_hasher(4, hashing.sha256))
        mgr.allocate_slots(req, 8)
        (ev,) = mgr.take_events()
        want = [int.from_bytes(h, "big") & (2**64 - 1) for h in req.block_hashes] if want_int else req.block_hashes
        assert ev.block_hashes == want


def full_config_hardening(num_blocks=64, bs=BS):
    spec = FullAttentionSpec(block_size=bs, num_kv_heads=1, head_size=8, dtype="float16")
    return KVCacheConfig(num_blocks=num_blocks, kv_cache_tensors=[], kv_cache_groups=[KVCacheGroupSpec(["l0"], spec)])


def manager_hardening(impl, num_blocks=64, config=None, **kw):
    kw.setdefault("max_model_len", 256)
    return impl.kv_cache.KVCacheManager(config or full_config_hardening(num_blocks), scheduler_block_size=BS,
                                        hash_block_size=BS, **kw)


def snapshot_hardening(mgr):
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


# --------------------------------------------------------------------------- item 6
def _tamper(req, how, index=5):
    if how == "not bytes":
        req.block_hashes[index] = 12345
    elif how == "removed":
        del req.block_hashes[index + 1:]
    elif how == "None":
        req.block_hashes[index] = None


# (Hashes removed are not an error: as in vLLM, only the blocks with hashes are cached --
# with hash lookahead the hashes lag behind the tokens; tests/test_prefix_caching.py,
# test_hash_lookahead_caches_only_the_blocks_that_have_hashes.)
TAMPERINGS = {"not bytes": TypeError, "None": TypeError}


@pytest.mark.parametrize("how", list(TAMPERINGS))
@pytest.mark.parametrize("layout", ["full", "hybrid"])
def test_tampered_hashes_are_refused_before_allocating(impl, how, layout):
    """Caching runs after allocating: a request whose hashes it cannot read must be refused
    before anything is taken (it used to leave 13 blocks held)."""
    mgr = manager_hardening(impl, config=hybrid_config() if layout == "hybrid" else None)
    other = impl.kv_cache.Request("other", list(range(100, 118)), block_hasher=hasher())
    mgr.allocate_slots(other, other.num_tokens)
    req = impl.kv_cache.Request("a", list(range(50)), block_hasher=hasher())
    _tamper(req, how)
    before = snapshot_hardening(mgr)
    with pytest.raises(TAMPERINGS[how]):
        mgr.allocate_slots(req, 50)
    assert snapshot_hardening(mgr) == before
    assert not mgr.coordinator.holds("a")


@pytest.mark.parametrize("how", list(TAMPERINGS))
def test_tampered_hashes_of_a_running_request(impl, how):
    """The same on a later step of a running request (the compiled decode path) and with prefix
    hits handed in: nothing is touched, allocated or recorded."""
    mgr = manager_hardening(impl)
    warm = impl.kv_cache.Request("warm", list(range(40)), block_hasher=hasher())
    mgr.allocate_slots(warm, warm.num_tokens)
    mgr.free(warm)
    req = impl.kv_cache.Request("a", list(range(50)), block_hasher=hasher())
    hits, n_hit, _ = mgr.get_computed_blocks(req)
    assert n_hit == 40
    _tamper(req, how, index=10)  # (the hits' hashes are not read again: the new blocks' are)
    before = snapshot_hardening(mgr)
    with pytest.raises(TAMPERINGS[how]):
        mgr.allocate_slots(req, 10, num_new_computed_tokens=n_hit, new_computed_blocks=hits)
    assert snapshot_hardening(mgr) == before
    # A running request: 8 tokens cached, then its hashes go bad before the next block fills.
    run = impl.kv_cache.Request("b", list(range(200, 208)), block_hasher=hasher())
    mgr.allocate_slots(run, 8)
    run.num_computed_tokens = 8
    run.append_output_token_ids([1, 2, 3, 4])
    run.block_hashes[2] = "x"
    before = snapshot_hardening(mgr)
    with pytest.raises(TypeError, match="block hashes must be bytes, got str"):
        mgr.allocate_slots(run, 4)
    assert snapshot_hardening(mgr) == before
    run.block_hashes[2] = b"y" * 32
    assert mgr.allocate_slots(run, 4) is not None


def test_wrong_length_digests_still_cache(impl):
    """A digest of another length is still a cache key (nothing reads its length): accepted."""
    mgr = manager_hardening(impl)
    req = impl.kv_cache.Request("a", list(range(8)), block_hasher=hasher())
    req.block_hashes[1] = b"xx"
    mgr.allocate_slots(req, 8)
    assert mgr.block_pool.blocks[2].block_hash == b"xx" + (0).to_bytes(4, "big")


# --------------------------------------------------------------------------- item 5
@pytest.mark.parametrize("held", [False, True], ids=["free hits", "held hits"])
def test_hits_from_another_manager_are_refused(impl, held):
    """Prefix hits looked up in one manager and handed to another: a clear error, both managers
    unchanged (the Python twin used to take them, listing block 1 twice and corrupting both
    pools; both twins took another pool's held blocks)."""
    m1, m2 = manager_hardening(impl), manager_hardening(impl)
    warm = impl.kv_cache.Request("w", list(range(20)), block_hasher=hasher())
    m2.allocate_slots(warm, 20)
    if not held:
        m2.free(warm)
    req = impl.kv_cache.Request("r", list(range(20)), block_hasher=hasher())
    hits, n_hit, _ = m2.get_computed_blocks(req)
    assert n_hit == 16
    before1, before2 = snapshot_hardening(m1), snapshot_hardening(m2)
    with pytest.raises(RuntimeError, match="not a block of this pool"):
        m1.allocate_slots(req, 4, num_new_computed_tokens=n_hit, new_computed_blocks=hits)
    with pytest.raises(RuntimeError, match="not a block of this pool"):
        m1.block_pool.touch(hits.blocks[0])
    with pytest.raises(RuntimeError, match="not a block of this pool"):
        m1.coordinator.allocate_new_computed_blocks("r", hits.blocks, n_hit, 0)
    assert snapshot_hardening(m1) == before1 and snapshot_hardening(m2) == before2
    # Its own hits are fine.
    assert m2.allocate_slots(req, 4, num_new_computed_tokens=n_hit, new_computed_blocks=hits) is not None


@pytest.mark.parametrize("name", ["retains_longer_hit", "supports_fine_grained_hash_lookup"])
def test_manager_class_constants_cannot_be_shadowed(impl, name):
    """A manager type's constants (read from the instance by the manager and the hybrid
    lookup) cannot be overridden on one instance: the compiled twin's instances have no
    ``__dict__``; the pure twin refuses the same way (AttributeError, value unchanged)."""
    objs = _objects(impl)
    for kind in ("full_manager", "sliding_manager", "mamba_manager", "rswa_manager", "ring_manager"):
        obj = objs[kind]
        before = getattr(obj, name)
        with pytest.raises(AttributeError):
            setattr(obj, name, not before)
        with pytest.raises(AttributeError):
            delattr(obj, name)
        assert getattr(obj, name) is before


@pytest.mark.parametrize("value, flag", [("x", True), (None, False), (0, False), (3, True), ([], False)])
def test_manager_flags_read_back_as_bools(impl, value, flag):
    """``use_eagle`` (like the other flags) is a C ``bint`` in the compiled twin: whatever is
    assigned reads back as a bool, the same in both twins."""
    objs = _objects(impl)
    for kind in ("full_manager", "sliding_manager", "mamba_manager", "rswa_manager", "ring_manager"):
        for name in ("use_eagle", "shared_prefix_checkpoint"):
            setattr(objs[kind], name, value)
            got = getattr(objs[kind], name)
            assert got is flag, f"{kind}.{name} = {value!r} read back {got!r}"


# --------------------------------------------------------------------------- item 2
def test_request_tables_changed_by_hand_are_followed(impl):
    """A decode step after a request's entry was popped and its blocks freed by hand must see
    the tables as they are (the compiled twin's per-request record used to go stale: it
    extended the orphaned list, which still held two freed blocks, and leaked the new block)."""
    mgr = manager_hardening(impl)
    single = mgr.coordinator.single_type_managers[0]
    req = impl.kv_cache.Request("r", list(range(8)), block_hasher=hasher())
    mgr.allocate_slots(req, 8)
    req.num_computed_tokens = 8
    req.append_output_token_ids([1])
    mgr.allocate_slots(req, 1)  # a decode step: the record is made here
    req.append_output_token_ids([2])
    blocks = single.req_to_blocks.pop("r")
    single.num_cached_block.pop("r")
    mgr.block_pool.free_blocks(reversed(blocks))
    free_before = mgr.block_pool.get_num_free_blocks()
    new = mgr.allocate_slots(req, 1)
    held = single.req_to_blocks["r"]
    assert ids(new.blocks[0]) == ids(held)  # every block it holds is new (nothing freed kept)
    assert all(b.ref_cnt == 1 for b in held)
    assert mgr.block_pool.get_num_free_blocks() == free_before - len(held)
    mgr.free(req)
    assert mgr.block_pool.get_num_free_blocks() == mgr.block_pool.num_gpu_blocks - 1  # nothing leaked


def test_request_table_entries_set_by_hand_are_followed(impl):
    """The same for an entry replaced or a cached count lowered by hand between steps."""
    mgr = manager_hardening(impl)
    single = mgr.coordinator.single_type_managers[0]
    req = impl.kv_cache.Request("r", list(range(8)), block_hasher=hasher())
    mgr.allocate_slots(req, 8)
    req.num_computed_tokens = 8
    req.append_output_token_ids([1])
    mgr.allocate_slots(req, 1)
    req.append_output_token_ids([2])
    blocks = single.req_to_blocks["r"]
    single.req_to_blocks["r"] = blocks[:2]  # hand the third block back
    mgr.block_pool.free_blocks([blocks[2]])
    mgr.allocate_slots(req, 1)
    assert len(single.req_to_blocks["r"]) == 3
    assert all(b.ref_cnt == 1 for b in single.req_to_blocks["r"])
    mgr.free(req)
    assert mgr.block_pool.get_num_free_blocks() == mgr.block_pool.num_gpu_blocks - 1


# --------------------------------------------------------------------------- lists callers can reach
# req_to_blocks hands out the manager's own lists and KVCacheBlocks.blocks is
# public: a non-block put there must be refused alike, never read as a block
# (the compiled twin read a None's or a bytes' memory as a block id).
@pytest.mark.parametrize("bad", [None, b"x" * 100, 7])
def test_a_non_block_in_a_held_list_is_refused_when_zeroing(impl, bad):
    from kvcy.kv_cache_interface import MambaSpec

    full = FullAttentionSpec(block_size=BS, num_kv_heads=1, head_size=8, dtype="float16")
    mamba = MambaSpec(block_size=BS, shapes=((2,),), dtypes=("float32",))
    config = KVCacheConfig(num_blocks=16, kv_cache_tensors=[],
                           kv_cache_groups=[KVCacheGroupSpec(["l0"], full), KVCacheGroupSpec(["l1"], mamba)])
    # (caching off: vLLM 0.33.0 caches a Mamba group only in Mamba align mode)
    mgr = impl.kv_cache.KVCacheManager(config, max_model_len=64, scheduler_block_size=BS, hash_block_size=BS,
                                       enable_caching=False)
    assert config.needs_kv_cache_zeroing
    mgr.allocate_slots(impl.kv_cache.Request("a", list(range(12)), block_hasher=hasher()), 12)
    before = mgr.take_new_block_ids()
    assert before
    mgr.coordinator.single_type_managers[0].req_to_blocks["a"].append(bad)
    with pytest.raises(TypeError, match=f"req_to_blocks values must be lists of blocks, got a list holding "
                                        f"{type(bad).__name__}"):
        mgr.record_blocks_for_zeroing("a", 0)
    assert mgr.take_new_block_ids() == []  # refused before any group recorded anything
    mgr.coordinator.single_type_managers[0].req_to_blocks["a"].pop()
    mgr.record_blocks_for_zeroing("a", 0)
    assert sorted(mgr.take_new_block_ids()) == sorted(before)


@pytest.mark.parametrize("bad", [None, b"x" * 100, 7])
def test_a_non_block_in_kv_cache_blocks_is_refused_alike(impl, bad):
    pool = impl.kv_cache.BlockPool(4, True, BS)
    blocks = impl.kv_cache.KVCacheBlocks(([pool.blocks[1], bad],))
    with pytest.raises(TypeError, match=f"blocks must be KVCacheBlock, got {type(bad).__name__}"):
        blocks.get_block_ids()
    with pytest.raises(TypeError, match=f"blocks must be KVCacheBlock, got {type(bad).__name__}"):
        repr(blocks)
    assert impl.kv_cache.KVCacheBlocks(([pool.blocks[1]],)).get_block_ids() == ([1],)
