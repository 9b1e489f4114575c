"""Unit tests for the block manager's behaviour (as ../shared/REFERENCE.md, beside the checkout,
describes it), run against both twins."""

from __future__ import annotations

import pytest

from kvcy.hashing import get_hash_fn_by_name, get_request_block_hasher, init_none_hash
from kvcy.kv_cache_interface import (
    ChunkedLocalAttentionSpec,
    FullAttentionSpec,
    KVCacheConfig,
    KVCacheGroupSpec,
    SlidingWindowSpec,
)
from kvcy.kv_events import AllBlocksCleared, BlockRemoved, BlockStored
from kvcy.request import Request, RequestStatus

BS = 4


@pytest.fixture(autouse=True)
def _none_hash():
    init_none_hash(get_hash_fn_by_name("sha256"))


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


# --------------------------------------------------------------------------- free queue
def test_free_queue_order_and_errors(impl):
    m = impl.kv_cache
    blocks = [m.KVCacheBlock(i) for i in range(6)]
    q = m.FreeKVCacheBlockQueue(blocks)
    assert ids(q.get_all_free_blocks()) == [0, 1, 2, 3, 4, 5]
    assert q.popleft().block_id == 0
    assert ids(q.popleft_n(2)) == [1, 2]
    q.remove(blocks[4])
    assert ids(q.get_all_free_blocks()) == [3, 5]
    q.append(blocks[0])
    q.prepend_n([blocks[2], blocks[1]])
    q.append_n([blocks[4]])
    assert ids(q.get_all_free_blocks()) == [2, 1, 3, 5, 0, 4]
    assert q.num_free_blocks == 6
    with pytest.raises(RuntimeError):
        q.append(blocks[0])  # already queued: nothing changes
    assert q.num_free_blocks == 6
    assert ids(q.popleft_n(6)) == [2, 1, 3, 5, 0, 4]
    with pytest.raises(ValueError, match="No free blocks available"):
        q.popleft()
    with pytest.raises(RuntimeError):
        q.remove(blocks[0])
    with pytest.raises(AssertionError):  # (vLLM asserts num_free_blocks >= n)
        q.popleft_n(1)


# --------------------------------------------------------------------------- block pool
def test_pool_null_block_and_usage(impl):
    pool = impl.kv_cache.BlockPool(11, enable_caching=True, hash_block_size=BS)
    assert pool.null_block.block_id == 0 and pool.null_block.is_null
    assert pool.get_num_free_blocks() == 10
    assert pool.get_usage() == 0.0
    got = pool.get_new_blocks(4)
    assert ids(got) == [1, 2, 3, 4] and all(b.ref_cnt == 1 for b in got)
    assert pool.get_usage() == pytest.approx(0.4)
    with pytest.raises(ValueError, match="Cannot get 7 free blocks"):
        pool.get_new_blocks(7)
    assert pool.get_num_free_blocks() == 6  # nothing taken by the failed call
    pool.free_blocks(reversed(got))
    # unhashed blocks go to the front, in the given (tail-first) order
    assert ids(pool.free_block_queue.get_all_free_blocks())[:4] == [4, 3, 2, 1]
    with pytest.raises(RuntimeError):
        pool.free_blocks([got[0]])  # second free of the same block


def test_pool_size_is_checked(impl):
    BlockPool = impl.kv_cache.BlockPool
    with pytest.raises(AssertionError, match="at least 1"):  # (vLLM asserts an int above 0)
        BlockPool(0, enable_caching=True, hash_block_size=BS)
    with pytest.raises(ValueError, match="at most 2\\*\\*31.*int32"):
        BlockPool(2**31 + 1, enable_caching=True, hash_block_size=BS)  # refused before any block is made
    with pytest.raises(AssertionError):
        BlockPool(8.0, enable_caching=True, hash_block_size=BS)
    with pytest.raises(TypeError):
        BlockPool(True, enable_caching=True, hash_block_size=BS)


def test_lru_eviction_and_events(impl):
    mgr = manager(impl, num_blocks=9, enable_kv_cache_events=True, use_int_block_hashes=False)
    req = Request("a", list(range(16)), block_hasher=hasher())  # 4 full blocks
    assert mgr.allocate_slots(req, 16).get_block_ids() == ([1, 2, 3, 4],)
    events = mgr.take_events()
    assert [type(e) for e in events] == [BlockStored]
    assert events[0].block_hashes == req.block_hashes and events[0].parent_block_hash is None
    assert events[0].kv_cache_spec_kind == "full_attention"
    mgr.free(req)
    pool = mgr.block_pool
    # hashed blocks go to the back, tail first: head blocks are evicted last
    assert ids(pool.free_block_queue.get_all_free_blocks()) == [5, 6, 7, 8, 4, 3, 2, 1]
    other = Request("b", [100 + i for i in range(24)], block_hasher=hasher())
    assert mgr.allocate_slots(other, 24).get_block_ids() == ([5, 6, 7, 8, 4, 3],)
    removed = [e for e in mgr.take_events() if isinstance(e, BlockRemoved)]
    assert [e.block_hashes[0] for e in removed] == [req.block_hashes[3], req.block_hashes[2]]
    assert pool.num_evictions == 2


def test_prefix_hit_touch_and_max_length(impl):
    mgr = manager(impl)
    a = Request("a", list(range(12)), block_hasher=hasher())
    mgr.allocate_slots(a, 12)
    b = Request("b", list(range(12)), block_hasher=hasher())
    blocks, n, boundary = mgr.get_computed_blocks(b)
    # the last token is never a hit: 11 tokens -> 2 full blocks
    assert blocks.get_block_ids() == ([1, 2],) and n == 8 and boundary == 0
    assert all(blk.ref_cnt == 1 for blk in blocks.blocks[0])  # lookup changes nothing
    new = mgr.allocate_slots(b, 4, num_new_computed_tokens=8, new_computed_blocks=blocks)
    assert new.get_block_ids() == ([4],)
    assert [blk.ref_cnt for blk in blocks.blocks[0]] == [2, 2]
    assert mgr.get_block_ids("b") == ([1, 2, 4],)


def test_allocate_none_changes_nothing(impl):
    mgr = manager(impl, num_blocks=5)
    a = Request("a", list(range(12)), block_hasher=hasher())
    mgr.allocate_slots(a, 12)
    free_before = ids(mgr.block_pool.free_block_queue.get_all_free_blocks())
    b = Request("b", [50 + i for i in range(12)], block_hasher=hasher())
    assert mgr.allocate_slots(b, 12) is None
    assert ids(mgr.block_pool.free_block_queue.get_all_free_blocks()) == free_before
    assert not mgr.coordinator.holds("b")


def test_reset_prefix_cache(impl):
    mgr = manager(impl, enable_kv_cache_events=True)
    a = Request("a", list(range(8)), block_hasher=hasher())
    mgr.allocate_slots(a, 8)
    assert mgr.reset_prefix_cache() is False
    mgr.free(a)
    mgr.take_events()
    assert mgr.reset_prefix_cache() is True
    assert all(b.block_hash is None for b in mgr.block_pool.blocks)
    assert [type(e) for e in mgr.take_events()] == [AllBlocksCleared]


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


def test_sliding_window_frees_out_of_window_blocks(impl):
    spec = SlidingWindowSpec(block_size=4, num_kv_heads=1, head_size=8, dtype="float16", sliding_window=6)
    cfg = KVCacheConfig(num_blocks=20, kv_cache_tensors=[], kv_cache_groups=[KVCacheGroupSpec(["l"], spec)])
    mgr = impl.kv_cache.KVCacheManager(cfg, max_model_len=256, scheduler_block_size=4, hash_block_size=4)
    req = Request("s", list(range(24)), block_hasher=hasher())
    mgr.allocate_slots(req, 12)
    req.num_computed_tokens = 12
    mgr.allocate_slots(req, 12)
    # 12 computed: 12 - 6 + 1 = 7 tokens skipped -> block 0 is replaced by the null block
    assert mgr.get_block_ids("s")[0][0] == 0
    assert mgr.get_block_ids("s")[0][1:] == [2, 3, 4, 5, 6]


def test_chunked_local_hit_is_null_before_the_chunk(impl):
    spec = ChunkedLocalAttentionSpec(block_size=4, num_kv_heads=1, head_size=8, dtype="float16",
                                     attention_chunk_size=8)
    cfg = KVCacheConfig(num_blocks=20, kv_cache_tensors=[], kv_cache_groups=[KVCacheGroupSpec(["l"], spec)])
    mgr = impl.kv_cache.KVCacheManager(cfg, max_model_len=256, scheduler_block_size=4, hash_block_size=4)
    a = Request("a", list(range(16)), block_hasher=hasher())
    mgr.allocate_slots(a, 16)
    b = Request("b", list(range(16)), block_hasher=hasher())
    blocks, n, _ = mgr.get_computed_blocks(b)
    # max length 15: chunk start 8 -> blocks 0, 1 are null; block 2 (tokens 8..11) hits
    assert blocks.get_block_ids() == ([0, 0, 3],) and n == 12


def test_chunked_local_beside_another_block_size_asserts_at_lookup(impl):
    """vLLM 0.33.0's chunked-local lookup asserts that the group's block size is the hit
    alignment (the scheduler block): beside full attention of 8-token blocks, 4-token chunked
    blocks build but every lookup raises its AssertionError (a lookup that
    trimmed the hit to the alignment instead would differ; tests/vllm_live/test_vllm_state_machine.py
    drives this against vLLM)."""
    chunked = ChunkedLocalAttentionSpec(block_size=4, num_kv_heads=1, head_size=8, dtype="float16",
                                        attention_chunk_size=16)
    full = FullAttentionSpec(block_size=8, num_kv_heads=1, head_size=8, dtype="float16")
    cfg = KVCacheConfig(num_blocks=20, kv_cache_tensors=[],
                        kv_cache_groups=[KVCacheGroupSpec(["f"], full), KVCacheGroupSpec(["c"], chunked)])
    mgr = impl.kv_cache.KVCacheManager(cfg, max_model_len=256, scheduler_block_size=8, hash_block_size=4)
    req = Request("a", list(range(20)), block_hasher=hasher())
    msg = "KV cache groups with different block sizes are not compatible with chunked local attention now"
    with pytest.raises(AssertionError, match=msg):
        mgr.get_computed_blocks(req)
    manager_cls = type(mgr.coordinator.single_type_managers[1])
    with pytest.raises(AssertionError, match=msg):
        manager_cls.find_longest_cache_hit([], 16, [1], mgr.block_pool, chunked, False, 8)
    (hit,), n = manager_cls.find_longest_cache_hit([], 16, [1], mgr.block_pool, chunked, False, 4)
    assert [b.block_id for b in hit] == [0, 0, 0, 0] and n == 16  # (aligned: the chunk's null blocks)


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


def test_bad_tokens_rejected_without_change():
    with pytest.raises(TypeError):
        Request("a", [1, 2, "x"])
    with pytest.raises(ValueError):
        Request("a", [1, 2**64])
    req = Request("a", [1, 2, 3], block_hasher=hasher())
    with pytest.raises(TypeError):
        req.append_output_token_ids([4, None])
    with pytest.raises(ValueError):
        req.append_output_token_ids([-(2**70)])
    assert req.all_token_ids == [1, 2, 3] and req.num_tokens == 3


def test_prefix_hits_for_running_request_rejected(impl):
    mgr = manager(impl)
    a = Request("a", list(range(12)), block_hasher=hasher())
    mgr.allocate_slots(a, 12)
    b = Request("b", list(range(12)), block_hasher=hasher())
    blocks, n, _ = mgr.get_computed_blocks(b)
    mgr.allocate_slots(b, 4, num_new_computed_tokens=n, new_computed_blocks=blocks)
    free_before = mgr.block_pool.get_num_free_blocks()
    # vLLM's coordinator asserts; kvcy asserts before anything changes.
    with pytest.raises(AssertionError, match="already holds blocks"):
        mgr.allocate_slots(b, 4, num_new_computed_tokens=n, new_computed_blocks=blocks)
    assert mgr.block_pool.get_num_free_blocks() == free_before


# --------------------------------------------------------------------------- bad batches leave no trace
def test_free_queue_rejects_bad_batches_unchanged(impl):
    m = impl.kv_cache
    blocks = [m.KVCacheBlock(i) for i in range(6)]
    q = m.FreeKVCacheBlockQueue(blocks[:3])
    loose = blocks[3:]
    for bad, exc, msg in (
        ([loose[0], loose[1], loose[0]], RuntimeError, "appears twice"),
        ([loose[0], blocks[1]], RuntimeError, "already in the free queue"),
        ([loose[0], "x"], TypeError, "KVCacheBlock"),
    ):
        for op in (q.append_n, q.prepend_n):
            with pytest.raises(exc, match=msg):
                op(bad)
            assert ids(q.get_all_free_blocks()) == [0, 1, 2] and q.num_free_blocks == 3
            assert all(b.prev_free_block is None and b.next_free_block is None for b in loose)
    q.append_n(loose)  # the rejected blocks are still usable
    assert ids(q.get_all_free_blocks()) == [0, 1, 2, 3, 4, 5]


def test_free_blocks_over_free_rolls_back(impl):
    pool = impl.kv_cache.BlockPool(8, enable_caching=True, hash_block_size=BS)
    a, b, c = pool.get_new_blocks(3)
    pool.touch([b])  # b is held twice
    queue_before = ids(pool.free_block_queue.get_all_free_blocks())
    # a listed twice but held once: the second drop would go below zero
    with pytest.raises(RuntimeError, match=f"block {a.block_id} freed more times"):
        pool.free_blocks([c, b, a, a])
    with pytest.raises(TypeError, match="KVCacheBlock"):
        pool.free_blocks([c, b, None])
    assert [a.ref_cnt, b.ref_cnt, c.ref_cnt] == [1, 2, 1]
    assert ids(pool.free_block_queue.get_all_free_blocks()) == queue_before
    # b listed twice and held twice: queued once, where its count reaches 0
    pool.free_blocks([b, c, b, a])
    assert [a.ref_cnt, b.ref_cnt, c.ref_cnt] == [0, 0, 0]
    assert ids(pool.free_block_queue.get_all_free_blocks())[:3] == [c.block_id, b.block_id, a.block_id]
    assert pool.get_num_free_blocks() == 7


def test_block_hash_round_trip(impl):
    blk = impl.kv_cache.KVCacheBlock(3)
    key = b"\x01" * 32 + (2).to_bytes(4, "big")
    blk.set_block_hash(key, 48)
    assert blk.block_hash == key and blk.block_hash_num_tokens == 48
    blk.reset_hash()
    assert blk.block_hash is None and blk.block_hash_num_tokens is None


# --------------------------------------------------------------------------- Request twins
def test_request_twins_match():
    from kvcy import _fast

    impls = _fast.available()
    reqs = []
    for name in impls:
        R = _fast.load(name)["kv_cache"].Request
        r = R("r", list(range(10)), max_tokens=4, block_hasher=hasher(), cache_salt="s")
        r.append_output_token_ids(7)
        r.append_output_token_ids([8, 9])
        r.num_computed_tokens = 5
        r.status = RequestStatus.RUNNING
        r.extra = "free attribute"
        reqs.append(r)
        for bad, exc in ((True, TypeError), (2**63, ValueError), ([1, "x"], TypeError), ([1.0], TypeError)):
            with pytest.raises(exc):
                r.append_output_token_ids(bad)
        assert r.num_tokens == 13 and r.output_token_ids == [7, 8, 9]  # nothing appended by the failures
    fields = ("request_id", "num_tokens", "num_output_tokens", "all_token_ids", "block_hashes",
              "num_computed_tokens", "status", "num_prompt_tokens", "cache_salt", "max_tokens", "extra")
    for r in reqs[1:]:
        assert {f: getattr(r, f) for f in fields} == {f: getattr(reqs[0], f) for f in fields}
    assert len(reqs[0].block_hashes) == 3


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


def _key(n: int, gid: int = 0, width: int = 32) -> bytes:
    return n.to_bytes(width, "big") + gid.to_bytes(4, "big")


def test_hash_to_block_map_matches_a_model(impl):
    """Random inserts / pops / lookups (duplicate keys, growth, deletions
    inside probe runs) agree with a plain dict-of-dicts model."""
    import random

    m = impl.kv_cache
    rng = random.Random(7)
    cache = m.BlockHashToBlockMap()
    blocks = [m.KVCacheBlock(i) for i in range(400)]
    model: dict[bytes, dict[int, object]] = {}
    # Keys of several lengths and groups; few enough values that keys repeat.
    keys = [_key(rng.randrange(300), gid=rng.randrange(3), width=rng.choice((8, 16, 32))) for _ in range(600)]
    for _ in range(6000):
        key = rng.choice(keys)
        op = rng.random()
        if op < 0.45:
            blk = rng.choice(blocks)
            cache.insert(key, blk)
            model.setdefault(key, {})[blk.block_id] = blk
        elif op < 0.85:
            bid = rng.randrange(400)
            got = cache.pop(key, bid)
            want = model.get(key, {}).pop(bid, None)
            if key in model and not model[key]:
                del model[key]
            assert got is want
        else:
            want = next(iter(model[key].values())) if key in model else None
            assert cache.get_one_block(key) is want
            bid = rng.randrange(400)
            assert cache.contain(key, bid) == (key in model and bid in model[key])
        assert len(cache) == len(model)
    assert sorted(cache.keys()) == sorted(model)
    for key, group in model.items():
        assert cache.get_one_block(key) is next(iter(group.values()))
    # Draining everything leaves an empty, still usable map.
    for key, group in list(model.items()):
        for bid in list(group):
            assert cache.pop(key, bid) is group[bid]
    assert len(cache) == 0 and cache.keys() == []
    cache.insert(_key(1), blocks[0])
    assert cache.get_one_block(_key(1)) is blocks[0]


def test_evicting_blocks_keyed_by_hand(impl):
    """Blocks given their keys through the public setters (not by caching),
    some sharing a key through different bytes objects, are found and
    dropped by eviction in any order."""
    m = impl.kv_cache
    pool = m.BlockPool(12, enable_caching=True, hash_block_size=BS)
    cache = pool.cached_block_hash_to_block
    blocks = pool.get_new_blocks(8)
    keys = [_key(i % 5, gid=i % 5 % 2, width=32) for i in range(8)]  # blocks 5-7 repeat the keys of 0-2
    for blk, key in zip(blocks, keys):
        key = bytes(bytearray(key))  # a distinct object for every block
        if blk.block_id % 2:
            blk.set_block_hash(key, num_tokens=16)
        else:
            blk.block_hash = key
        cache.insert(key, blk)
    assert len(cache) == len(set(keys)) == 5
    order = [blocks[i].block_id for i in (5, 0, 7, 2, 3, 6, 1, 4)]
    for n, bid in enumerate(order, 1):
        pool.evict_blocks([bid])
        assert pool.blocks[bid].block_hash is None
        left = [b for b in blocks if b.block_id not in order[:n]]
        assert sorted(cache.keys()) == sorted({b.block_hash for b in left})
        for b in left:
            assert cache.contain(b.block_hash, b.block_id)
    assert len(cache) == 0 and pool.num_evictions == 8


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


def _sneaky_hits_script(kv):
    """Prefix hits handed over in a sequence type whose reading allocates for
    the very request being admitted; what each call did, and the state."""
    from collections.abc import Sequence

    spec = FullAttentionSpec(block_size=BS, num_kv_heads=1, head_size=8, dtype="float16")
    cfg = KVCacheConfig(num_blocks=16, kv_cache_tensors=[], kv_cache_groups=[KVCacheGroupSpec(["l0"], spec)])
    mgr = kv.KVCacheManager(cfg, max_model_len=256, scheduler_block_size=BS, hash_block_size=BS)
    a = kv.Request("a", list(range(12)), block_hasher=hasher())
    mgr.allocate_slots(a, 12)
    mgr.free(a)
    b = kv.Request("b", list(range(12)) + [5, 6], block_hasher=hasher())
    blocks, hit, _ = mgr.get_computed_blocks(b)
    inner: list[object] = []

    class Sneaky(Sequence):
        def __init__(self, items):
            self.items = list(items)

        def __len__(self):
            return len(self.items)

        def __getitem__(self, i):
            if not inner:
                inner.append(mgr.allocate_slots(b, 1).get_block_ids())
            return self.items[i]

    try:
        outer = mgr.allocate_slots(b, 2, num_new_computed_tokens=hit,
                                   new_computed_blocks=kv.KVCacheBlocks((Sneaky(blocks.blocks[0]),)))
        outcome: object = outer.get_block_ids()
    except Exception as err:  # noqa: BLE001 - the outcome is compared across twins
        outcome = type(err).__name__
    held = sorted(blk.block_id for blk in mgr.block_pool.blocks if blk.ref_cnt > 0 and not blk.is_null)
    return hit, inner, outcome, mgr.get_block_ids("b"), mgr.block_pool.get_num_free_blocks(), held


def test_hits_in_a_sequence_that_runs_code():
    """The compiled fast path takes hits in a list or tuple only: reading
    another sequence runs its code, which may change the manager under the
    fast path's record (here: allocate for the same request).  Both twins
    answer and end alike."""
    from kvcy import _fast

    got = {name: _sneaky_hits_script(_fast.load(name)["kv_cache"]) for name in _fast.available()}
    hit, inner, outcome, b_ids, n_free, held = got["python"]
    assert hit == 12 and len(inner) == 1 and b_ids == inner[0]
    assert n_free + len(held) + 1 == 16  # no block lost
    assert all(v == got["python"] for v in got.values()), got


def test_hash_to_block_map_rejects_bad_keys(impl):
    """The compiled map keeps keys split (hash bytes + group id), so a key must
    be bytes ending in a 4-byte group id; the Python twin, like vLLM, takes
    any hashable key."""
    if impl.name != "cython":
        pytest.skip("the Python twin's map takes any hashable key, as vLLM's does")
    m = impl.kv_cache
    cache = m.BlockHashToBlockMap()
    blk = m.KVCacheBlock(1)
    for bad in ("abcdefgh", 12345, b"ab", None):
        with pytest.raises(ValueError, match="4-byte group id"):
            cache.insert(bad, blk)
    assert len(cache) == 0


def test_hash_to_block_map_releases_blocks(impl):
    import sys

    m = impl.kv_cache
    cache = m.BlockHashToBlockMap()
    blk = m.KVCacheBlock(5)
    before = sys.getrefcount(blk)
    for i in range(50):
        cache.insert(_key(i), blk)
    cache.insert(_key(0), m.KVCacheBlock(6))  # a duplicate key
    assert cache.pop(_key(3), 5) is blk
    del cache
    assert sys.getrefcount(blk) == before


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


# --------------------------------------------------------------------------- pool-level bad input
# Found by fuzzing the public pool API with wrong types and counts: the compiled twin crashed
# the interpreter on the first three (unchecked casts and indexes), the Python twin left
# half-cached blocks behind.
def _pool_with_request(impl, tokens=16):
    pool = impl.kv_cache.BlockPool(16, enable_caching=True, hash_block_size=BS)
    req = impl.kv_cache.Request("r", list(range(tokens)), block_hasher=hasher())
    return pool, req


def _pool_state(pool):
    return (ids(pool.free_block_queue.get_all_free_blocks()), [b.ref_cnt for b in pool.blocks],
            [b.block_hash for b in pool.blocks], sorted(pool.cached_block_hash_to_block.keys()))


def test_touch_rejects_bad_blocks_unchanged(impl):
    pool, _ = _pool_with_request(impl)
    held = pool.get_new_blocks(2)
    free_block = pool.free_block_queue.get_all_free_blocks()[0]
    loose = impl.kv_cache.KVCacheBlock(3)  # never queued, no references
    before = _pool_state(pool)
    for bad, exc in (
        ("x", TypeError),  # str: its items are strs again (the compiled twin recursed until it crashed)
        ([held[0], None], TypeError),
        ([free_block, [held[0]]], TypeError),
        ([[free_block], ["x"]], TypeError),  # second group bad: the first is not touched either
        ([free_block, loose], RuntimeError),
        ([[free_block], [loose]], RuntimeError),
    ):
        with pytest.raises(exc):
            pool.touch(bad)
        assert _pool_state(pool) == before
    pool.touch([[free_block], [held[0]]])  # per-group sequences
    assert free_block.ref_cnt == 1 and held[0].ref_cnt == 2


def test_cache_full_blocks_rejects_bad_input_unchanged(impl):
    pool, req = _pool_with_request(impl)
    blocks = pool.get_new_blocks(4)
    before = _pool_state(pool)
    for args, exc, msg in (
        (([[]], -1, 0), ValueError, "num_cached_blocks must be non-negative"),
        ((blocks, -1, 2), ValueError, "num_cached_blocks must be non-negative"),
        ((None, 0, 2), TypeError, "got None"),
        # (more full blocks than given: the given ones are cached, as in vLLM;
        # tests/test_dropin_edges.py)
        ((blocks[:2] + ["x"] + blocks[3:], 0, 4), TypeError, "KVCacheBlock"),
    ):
        with pytest.raises(exc, match=msg):
            pool.cache_full_blocks(req, *args, BS, 0)
        assert _pool_state(pool) == before
    # (a size that is not a multiple of the hash block: vLLM's assertion)
    for block_size, exc in ((0, ValueError), (-4, ValueError), (6, AssertionError), (2, AssertionError)):
        with pytest.raises(exc, match="multiple of the hash block size"):
            pool.cache_full_blocks(req, blocks, 0, 1, block_size, 0)
    with pytest.raises(ValueError, match="4 bytes"):
        pool.cache_full_blocks(req, blocks, 0, 2, BS, 2**32)
    assert _pool_state(pool) == before
    # a block that already has a key, third in line: the first two are not left cached
    pool.cache_full_blocks(req, blocks, 2, 3, BS, 0)  # block 2 gets its key
    before = _pool_state(pool)
    with pytest.raises(AssertionError, match="already has a hash"):
        pool.cache_full_blocks(req, blocks, 0, 4, BS, 0)
    assert _pool_state(pool) == before
    pool.cache_full_blocks(req, blocks, 0, 2, BS, 0)
    assert [b.block_hash is not None for b in blocks] == [True, True, True, False]


def test_resolve_block_hashes_rejects_bad_sizes(impl):
    hashes = [b"a" * 32, b"b" * 32]
    assert impl.kv_cache.resolve_block_hashes(hashes, 4, 4) is hashes
    assert len(impl.kv_cache.resolve_block_hashes(hashes, 4, 8)) == 1
    for hash_bs, bs, exc in ((4, 2, AssertionError), (4, 0, ValueError), (0, 4, ValueError), (4, -8, ValueError),
                             (4, 6, AssertionError)):
        with pytest.raises(exc, match="multiple of the hash block size"):
            impl.kv_cache.resolve_block_hashes(hashes, hash_bs, bs)


def test_add_local_computed_blocks_rejects_bad_blocks_unchanged(impl):
    mgr = manager(impl)
    single = mgr.coordinator.single_type_managers[0]
    free_block = mgr.block_pool.free_block_queue.get_all_free_blocks()[0]
    before = _pool_state(mgr.block_pool)
    for bad, exc in (([free_block, None], TypeError), ([free_block, impl.kv_cache.KVCacheBlock(5)], RuntimeError)):
        with pytest.raises(exc):
            single.add_local_computed_blocks("r", bad, 2 * BS, 0)
        assert "r" not in single.req_to_blocks
        assert _pool_state(mgr.block_pool) == before


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


def test_cache_map_holds_block_subclasses(impl):
    """A KVCacheBlock subclass in the map is a block, not a dict of blocks (the compiled
    map told them apart by exact type and crashed)."""
    class Tagged(impl.kv_cache.KVCacheBlock):
        pass

    table = impl.kv_cache.BlockHashToBlockMap()
    key = b"h" * 32 + (0).to_bytes(4, "big")
    one, two = Tagged(1), Tagged(2)
    table.insert(key, one)
    assert table.get_one_block(key) is one and table.contain(key, 1) and not table.contain(key, 2)
    table.insert(key, two)  # now a dict of two
    assert table.contain(key, 2)
    assert table.pop(key, 1) is one and table.get_one_block(key) is two
    assert table.pop(key, 2) is two and table.get_one_block(key) is None


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


def test_evict_blocks_takes_any_iterable(impl):
    pool, req = _pool_with_request(impl)
    blocks = pool.get_new_blocks(2)
    pool.cache_full_blocks(req, blocks, 0, 2, BS, 0)
    pool.evict_blocks(b.block_id for b in blocks)  # (a generator: read once)
    assert [b.block_hash for b in blocks] == [None, None]
    assert len(pool.cached_block_hash_to_block) == 0


def test_managers_check_what_goes_into_their_tables(impl):
    """req_to_blocks / num_cached_block take entries from callers (vLLM's tests do), checked
    when they go in: a value that is not a list of this pool's blocks, or not a count, is
    refused and nothing changes."""
    mgr = manager(impl)
    other = manager(impl)
    single = mgr.coordinator.single_type_managers[0]
    req = impl.kv_cache.Request("r", list(range(8)), block_hasher=hasher())
    with pytest.raises(TypeError, match="req_to_blocks values must be lists"):
        single.req_to_blocks["r"] = ("not", "a list")
    with pytest.raises(TypeError, match="req_to_blocks values must be lists"):
        single.req_to_blocks["r"] = [1, 2]
    with pytest.raises(RuntimeError, match="not a block of this pool"):
        single.req_to_blocks["r"] = [other.block_pool.blocks[1]]
    with pytest.raises(TypeError, match="request ids must be str"):
        single.req_to_blocks[3] = []
    with pytest.raises(ValueError, match="num_cached_block values must be non-negative"):
        single.num_cached_block["r"] = -1
    assert "r" not in single.req_to_blocks and not single.num_cached_block
    assert mgr.allocate_slots(req, 8) is not None
    single.req_to_blocks["r"] = list(single.req_to_blocks["r"])  # a list of its own blocks: taken
    single.num_cached_block["r"] = 1
    assert dict(single.num_cached_block) == {"r": 1}
