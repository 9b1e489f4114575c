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
from kvcy.request import Request, RequestStatus

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


def ids(blocks):
    return [b.block_id for b in blocks]


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


def _pool_state(pool):
    return (ids(pool.free_block_queue.get_all_free_blocks()), [b.ref_cnt for b in pool.blocks],
            [b.block_hash for b in pool.blocks], sorted(pool.cached_block_hash_to_block.keys()))


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
    # tests/test_dropin_manager.py.)
    mgr = manager(impl)
    req = Request("a", list(range(8)), block_hasher=hasher())
    before = ids(mgr.block_pool.free_block_queue.get_all_free_blocks())
    with pytest.raises(exc):
        mgr.allocate_slots(req, **kwargs)
    assert ids(mgr.block_pool.free_block_queue.get_all_free_blocks()) == before
    assert not mgr.coordinator.holds("a")


def test_free_unknown_and_twice(impl):
    # vLLM 0.33.0: freeing a request that holds no blocks is a no-op, and its
    # block table is empty (tests/test_dropin_manager.py covers more).
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


def hashed_ids(mgr):
    return [b.block_id for b in mgr.block_pool.blocks if b.block_hash is not None]


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
