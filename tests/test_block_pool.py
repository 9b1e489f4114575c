"""vLLM 0.33.0's ``BlockPool`` / ``KVCacheBlock`` surface and its block residency metrics.

Both twins.  What is expected comes from vLLM 0.33.0's ``v1/core/block_pool.py``,
``kv_cache_utils.py`` and ``kv_cache_metrics.py``:

* ``is_block_writable`` / ``move_block_hashes`` serve Mamba align mode (a
  speculative block's relocation, and copy-on-write of a partial hit in a
  running request); ``unpin_blocks`` and ``KVCacheBlock(pool=...)`` serve
  HiSparse only: those two raise ``NotImplementedError`` naming the feature
  (``cache_partial_block``: tests/test_partial_prefix_cache_primitives.py).
* ``KVCacheMetricsCollector`` is called by the pool on allocation
  (``on_block_allocated``), on a touch (``on_block_accessed``), before a block
  is reused with caching on and in ``evict_blocks`` (``on_block_evicted``) and
  on ``reset_prefix_cache`` (``reset``).

``test_random_sequences_as_vllm`` replays random pool sequences on vLLM's own
pool and collector when vLLM is importable (``/tmp/kvh-venv``); without it the
same sequences compare the two twins.
"""

from __future__ import annotations

import copy
import gc
import math
import os
import random
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from kvcy import _fast
from kvcy.hashing import get_hash_fn_by_name, get_request_block_hasher, init_none_hash
from kvcy.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
from kvcy.kv_cache_metrics import BlockMetricsState, KVCacheMetricsCollector
from kvcy.kv_cache_utils import BlockHash, make_block_hash_with_group_id
from kvcy.kv_events import BlockRemoved, BlockStored
from kvcy.metrics import KVCacheEvictionEvent
from kvcy.request import Request

from _kv_cache_helpers import _pool_state, hashed_ids, ids, request_api
from _vllm_live import live

BS = 4


def _hash(family: int, i: int) -> bytes:
    """A stand-in block hash (32 bytes): block i of a request of prompt family ``family``."""
    return f"family{family}-block{i}".encode().ljust(32, b".")


def _key(block_hash: bytes, group: int = 0) -> bytes:
    return block_hash + group.to_bytes(4, "big")


def _request(family: int, n: int = 8) -> SimpleNamespace:
    """What the pool reads of a request (its events too): the hashes, tokens and hash inputs."""
    return SimpleNamespace(request_id=f"r{family}", block_hashes=[_hash(family, i) for i in range(n)],
                           all_token_ids=list(range(n * BS)), lora_request=None, mm_features=[],
                           cache_salt=None, prompt_embeds=None, session_id=None)


@pytest.fixture
def clock(monkeypatch):
    """``time.monotonic_ns`` made a counter: each reading is 1000 ns after the last (the first: 1000)."""
    now = [0]

    def fake() -> int:
        now[0] += 1000
        return now[0]

    monkeypatch.setattr(time, "monotonic_ns", fake)
    return now


def _cached_pool(impl, n_blocks=8, n_cached=2, **kw):
    """A caching pool whose first ``n_cached`` allocated blocks hold family 0's hashes."""
    pool = impl.kv_cache.BlockPool(n_blocks, True, BS, **kw)
    blocks = pool.get_new_blocks(n_cached)
    pool.cache_full_blocks(_request(0), blocks, 0, n_cached, BS, 0)
    return pool, blocks


# ------------------------------------------------------------------ KVCacheBlock(pool=)
def test_block_pool_keyword_accepts_none_only(impl):
    block = impl.kv_cache.KVCacheBlock(3, pool=None)
    assert (block.block_id, block.ref_cnt, block.block_hash) == (3, 0, None)
    pool = impl.kv_cache.BlockPool(4, True, BS)
    with pytest.raises(NotImplementedError, match="HiSparse"):
        impl.kv_cache.KVCacheBlock(3, pool=pool)
    with pytest.raises(TypeError):  # keyword only, as in vLLM
        impl.kv_cache.KVCacheBlock(3, None)


def test_compiled_block_stays_one_cache_line_and_out_of_the_collector():
    """The refused ``pool`` keyword adds no field: 64 bytes, not tracked by the cycle collector."""
    if _fast.NO_EXTENSIONS or "cython" not in _fast.available():
        pytest.skip("needs the compiled twin")
    block_type = _fast.load("cython")["kv_cache"].KVCacheBlock
    assert block_type.__basicsize__ == 64
    assert not gc.is_tracked(block_type(1))
    assert not gc.is_tracked(block_type(1, pool=None))


# ------------------------------------------------------------------ is_block_writable
def test_is_block_writable(impl):
    pool, (cached, _) = _cached_pool(impl)
    (plain,) = pool.get_new_blocks(1)
    assert pool.is_block_writable(plain)  # one reference, no key
    assert not pool.is_block_writable(cached)  # shared through the prefix cache
    assert not pool.is_block_writable(pool.null_block)
    pool.touch([plain])
    assert not pool.is_block_writable(plain)  # two holders
    pool.free_blocks([plain, plain])
    assert not pool.is_block_writable(plain)  # free
    with pytest.raises(TypeError, match="block must be a KVCacheBlock, got int"):
        pool.is_block_writable(3)


# ------------------------------------------------------------------ move_block_hashes
def test_move_block_hashes_moves_the_entry_silently(impl):
    pool, (first, src) = _cached_pool(impl, enable_kv_cache_events=True)
    pool.take_events()
    key = _key(_hash(0, 1))
    (dst,) = pool.get_new_blocks(1)
    evictions = pool.num_evictions
    pool.move_block_hashes(src, dst)
    assert (src.block_hash, src.block_hash_num_tokens) == (None, None)
    assert (dst.block_hash, dst.block_hash_num_tokens) == (key, 2 * BS)
    assert pool.cached_block_hash_to_block.get_one_block(key) is dst
    assert pool.get_cached_block(_hash(0, 1), [0]) == [dst]
    assert pool.take_events() == []  # the entry stays cached: no BlockRemoved / BlockStored
    assert pool.num_evictions == evictions
    assert (src.ref_cnt, dst.ref_cnt) == (1, 1)
    assert pool.is_block_writable(src)  # the request may now write its block
    # Freed, the unkeyed source is reused first and the keyed copy last.
    pool.free_blocks([src, dst])
    queue = [b.block_id for b in pool.free_block_queue.get_all_free_blocks()]
    assert queue[0] == src.block_id and queue[-1] == dst.block_id
    # A block without a key moves nothing.
    (other,) = pool.get_new_blocks(1)
    pool.move_block_hashes(pool.blocks[other.block_id], pool.blocks[5])
    assert pool.blocks[5].block_hash is None


def test_move_block_hashes_with_duplicate_keys_moves_only_src(impl):
    """Two blocks cached under one key: the other stays, dst joins it."""
    pool, (_, src) = _cached_pool(impl)
    (twin,) = pool.get_new_blocks(1)
    pool.cache_full_blocks(_request(0), [pool.null_block, twin], 1, 2, BS, 0)
    key = _key(_hash(0, 1))
    (dst,) = pool.get_new_blocks(1)
    pool.move_block_hashes(src, dst)
    mapping = pool.cached_block_hash_to_block
    assert (mapping.contain(key, twin.block_id), mapping.contain(key, dst.block_id),
            mapping.contain(key, src.block_id)) == (True, True, False)


def test_move_block_hashes_refusals_change_nothing(impl):
    pool, (first, src) = _cached_pool(impl)
    other = impl.kv_cache.BlockPool(8, True, BS)
    (dst,) = pool.get_new_blocks(1)
    state = [(b.ref_cnt, b.block_hash) for b in pool.blocks]
    with pytest.raises(AssertionError, match="already has a cache key"):
        pool.move_block_hashes(src, first)
    with pytest.raises(ValueError, match="null block"):
        pool.move_block_hashes(src, pool.null_block)
    with pytest.raises(TypeError, match="dst_block must be a KVCacheBlock, got NoneType"):
        pool.move_block_hashes(src, None)
    with pytest.raises(RuntimeError, match=r"src_block \(block 2\) is not a block of this pool"):
        pool.move_block_hashes(other.blocks[2], dst)
    with pytest.raises(RuntimeError, match=r"dst_block \(block 7\) is not a block of this pool"):
        pool.move_block_hashes(src, impl.kv_cache.KVCacheBlock(7))
    assert [(b.ref_cnt, b.block_hash) for b in pool.blocks] == state
    assert pool.get_cached_block(_hash(0, 1), [0]) == [src]


# ------------------------------------------------------------------ out-of-scope names
def test_unpin_blocks_is_hisparse(impl):
    pool, blocks = _cached_pool(impl)
    with pytest.raises(NotImplementedError, match="HiSparse"):
        pool.unpin_blocks(blocks, lambda block: None)
    assert [b.ref_cnt for b in blocks] == [1, 1]


# ------------------------------------------------------------------ the collector itself
@pytest.mark.parametrize("rate", [0, 0.0, -0.5, 1.5, math.nan, math.inf])
def test_sample_rate_outside_zero_one_is_vllms_assertion(rate):
    with pytest.raises(AssertionError, match=r"sample_rate must be in \(0, 1.0\]"):
        KVCacheMetricsCollector(sample_rate=rate)


def test_sample_rate_defaults_and_types():
    assert KVCacheMetricsCollector().sample_rate == 0.01
    assert KVCacheMetricsCollector(1).sample_rate == 1
    with pytest.raises(TypeError):  # the comparison's own TypeError, as in vLLM
        KVCacheMetricsCollector("0.5")


def test_block_metrics_state(clock):
    state = BlockMetricsState()
    assert (state.birth_time_ns, state.last_access_ns, list(state.access_history)) == (1000, 1000, [])
    assert state.get_reuse_gaps_seconds() == []
    for _ in range(6):
        state.record_access()  # 2000 .. 7000; the last four kept
    assert list(state.access_history) == [4000, 5000, 6000, 7000]
    assert state.last_access_ns == 7000
    assert state.get_reuse_gaps_seconds() == [1e-6, 1e-6, 1e-6]
    assert state.get_lifetime_seconds() == 7000 / 1e9  # read at 8000
    assert state.get_idle_time_seconds() == 2000 / 1e9  # read at 9000


def _metrics(collector):
    return {bid: (s.birth_time_ns, s.last_access_ns, list(s.access_history))
            for bid, s in sorted(collector.block_metrics.items())}


def _events(collector):
    return [(e.lifetime_seconds, e.idle_seconds, e.reuse_gaps_seconds) for e in collector.drain_events()]


# ------------------------------------------------------------------ the pool's hooks
def test_pool_records_a_scripted_sequence(impl, clock):
    """Every block sampled (rate 1.0), a counter for a clock: what the collector holds after each step."""
    collector = KVCacheMetricsCollector(sample_rate=1.0)
    pool = impl.kv_cache.BlockPool(6, True, BS, metrics_collector=collector)
    b1, b2 = pool.get_new_blocks(2)  # evicted(1) allocated(1) evicted(2) allocated(2): births 1000, 2000
    assert _metrics(collector) == {1: (1000, 1000, []), 2: (2000, 2000, [])}
    pool.touch([b1])
    pool.touch([pool.null_block, b1])  # the null block is skipped, as in vLLM
    assert _metrics(collector)[1] == (1000, 4000, [3000, 4000])
    pool.free_blocks([b2, b1])  # freeing records nothing
    assert pool.get_new_blocks(1) == [b2]  # reused: evicted at 5000/6000, re-sampled at 7000
    assert _metrics(collector) == {1: (1000, 4000, [3000, 4000]), 2: (7000, 7000, [])}
    pool.evict_blocks({1})  # a held block: its key (none) dropped, its record closed
    assert _metrics(collector) == {2: (7000, 7000, [])}
    assert _events(collector) == [(3000 / 1e9, 4000 / 1e9, ()), (7000 / 1e9, 5000 / 1e9, (1000 / 1e9,))]
    assert collector.drain_events() == []
    pool.free_blocks([b1, b1, b2])  # (b1: its allocation and two touches)
    assert pool.reset_prefix_cache()
    assert (collector.block_metrics, collector.drain_events()) == ({}, [])
    assert clock[0] == 9000  # no reading the hooks did not need


def test_pool_without_caching_never_evicts_on_reuse(impl, clock):
    collector = KVCacheMetricsCollector(sample_rate=1.0)
    pool = impl.kv_cache.BlockPool(4, False, BS, metrics_collector=collector)
    blocks = pool.get_new_blocks(3)
    pool.free_blocks(blocks)
    pool.get_new_blocks(3)  # re-sampled, no eviction hook (vLLM's get_new_blocks without caching)
    assert collector.drain_events() == []
    assert _metrics(collector) == {1: (4000, 4000, []), 2: (5000, 5000, []), 3: (6000, 6000, [])}
    pool.evict_blocks({2})  # evict_blocks calls the hook whatever the caching
    assert len(collector.drain_events()) == 1


def test_pool_samples_with_the_random_module(impl):
    """One ``random.random()`` draw per allocated block, in order: seeding reproduces the choice."""
    random.seed(1234)
    draws = [random.random() for _ in range(12)]
    random.seed(1234)
    collector = KVCacheMetricsCollector(sample_rate=0.5)
    pool = impl.kv_cache.BlockPool(16, True, BS, metrics_collector=collector)
    ids = [b.block_id for b in pool.get_new_blocks(12)]
    expected = {bid for bid, draw in zip(ids, draws) if draw < 0.5}
    assert set(collector.block_metrics) == expected
    assert 0 < len(expected) < 12


class _Recorder:
    """A collector stand-in that logs its calls; ``truth`` is what ``bool()`` of it gives."""

    def __init__(self, truth=True):
        self.calls = []
        self.truth = truth

    def __bool__(self):
        return self.truth

    def __getattr__(self, name):
        if not name.startswith("on_") and name != "reset":
            raise AttributeError(name)
        return lambda *args: self.calls.append((name, *(a.block_id for a in args)))


def test_pool_calls_hooks_where_vllm_does(impl):
    collector = _Recorder()
    pool, (c1, c2) = _cached_pool(impl, n_blocks=5, metrics_collector=collector)
    assert collector.calls == [("on_block_evicted", 1), ("on_block_allocated", 1),
                               ("on_block_evicted", 2), ("on_block_allocated", 2)]
    del collector.calls[:]
    pool.touch([c1, c2])
    pool.free_blocks([c2, c1, c2, c1])  # cached: to the tail, c2 first
    pool.touch([c2])  # a free hit leaves the queue
    pool.get_new_blocks(3)  # 3, 4 (never cached) and c1 (cached: its key dropped)
    pool.evict_blocks({4})
    assert collector.calls == [
        ("on_block_accessed", 1), ("on_block_accessed", 2), ("on_block_accessed", 2),
        ("on_block_evicted", 3), ("on_block_allocated", 3), ("on_block_evicted", 4), ("on_block_allocated", 4),
        ("on_block_evicted", 1), ("on_block_allocated", 1),
        ("on_block_evicted", 4),
    ]
    assert pool.num_evictions == 1  # (c1's key; the hooks are not evictions)
    del collector.calls[:]
    pool.move_block_hashes(pool.blocks[2], pool.blocks[3])  # no hook
    pool.free_blocks(pool.blocks[1:5])
    assert pool.reset_prefix_cache()
    assert collector.calls == [("reset",)]


def test_falsy_collector_is_not_called(impl):
    """vLLM tests ``if self.metrics_collector:``: a collector that is false is skipped."""
    collector = _Recorder(truth=False)
    pool, blocks = _cached_pool(impl, metrics_collector=collector)
    pool.touch(blocks)
    pool.free_blocks(blocks + blocks)
    pool.get_new_blocks(7)
    pool.evict_blocks({1, 2})
    assert collector.calls == []


def test_collector_can_be_set_later(impl, clock):
    pool = impl.kv_cache.BlockPool(4, True, BS)
    pool.get_new_blocks(1)
    pool.metrics_collector = KVCacheMetricsCollector(1.0)
    pool.get_new_blocks(1)
    assert set(pool.metrics_collector.block_metrics) == {2}


def test_manager_passes_the_collector_to_its_pool(impl, clock):
    """Through vLLM's keyword: admissions sample, prefix hits record accesses."""
    from kvcy.hashing import get_hash_fn_by_name, get_request_block_hasher, init_none_hash
    from kvcy.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec

    sha = get_hash_fn_by_name("sha256")
    init_none_hash(sha)
    spec = FullAttentionSpec(block_size=BS, num_kv_heads=1, head_size=8, dtype="float16")
    config = KVCacheConfig(num_blocks=16, kv_cache_tensors=[], kv_cache_groups=[KVCacheGroupSpec(["l0"], spec)])
    collector = KVCacheMetricsCollector(1.0)
    mgr = impl.kv_cache.KVCacheManager(config, max_model_len=64, scheduler_block_size=BS, hash_block_size=BS,
                                       metrics_collector=collector)
    assert mgr.metrics_collector is collector and mgr.block_pool.metrics_collector is collector

    def request(rid):
        return impl.kv_cache.Request(rid, list(range(10)), block_hasher=get_request_block_hasher(BS, sha))

    a = request("a")
    mgr.allocate_slots(a, 10)
    held = [b.block_id for b in mgr.get_blocks("a").blocks[0]]
    assert sorted(collector.block_metrics) == sorted(held)
    b = request("b")
    hits, num_hits, _ = mgr.get_computed_blocks(b)
    assert num_hits == 8
    mgr.allocate_slots(b, 10 - num_hits, num_hits, hits)
    touched = [bid for bid, s in collector.block_metrics.items() if s.access_history]
    assert sorted(touched) == held[:2]
    mgr.free(a)
    mgr.free(b)
    assert mgr.reset_prefix_cache()
    assert collector.block_metrics == {}


# ------------------------------------------------------------------ random sequences, against vLLM
def _drive(pool, collector, seed: int, steps: int = 160) -> list:
    """Random admissions (prefix hits + new blocks, cached in part), frees, evictions, moves,
    writability checks and resets; what the pool and the collector hold after each step."""
    rng = random.Random(seed)
    held: list[list] = []
    trace = []
    n = pool.num_gpu_blocks
    for step in range(steps):
        op = rng.choices(["admit", "free", "evict", "move", "writable", "reset"], [6, 4, 1, 2, 1, 1])[0]
        out = None
        if op == "admit":
            family = rng.randrange(3)
            req = SimpleNamespace(request_id=f"s{step}", block_hashes=[_hash(family, i) for i in range(6)])
            hits = []
            for h in req.block_hashes:
                got = pool.get_cached_block(h, [0])
                if not got:
                    break
                hits.append(got[0])
            hits = hits[: rng.randint(0, len(hits))]
            room = pool.get_num_free_blocks() - sum(b.ref_cnt == 0 for b in hits)
            n_new = min(rng.randint(0 if hits else 1, 3), room, 6 - len(hits))
            if n_new < 0 or not (hits or n_new):
                continue
            pool.touch(hits)
            blocks = hits + pool.get_new_blocks(n_new)
            pool.cache_full_blocks(req, blocks, len(hits), rng.randint(len(hits), len(blocks)), BS, 0)
            held.append(blocks)
            out = [b.block_id for b in blocks]
        elif op == "free" and held:
            blocks = held.pop(rng.randrange(len(held)))
            pool.free_blocks(reversed(blocks))
        elif op == "evict":
            pool.evict_blocks({rng.randrange(1, n) for _ in range(rng.randint(1, 3))})
        elif op == "move":
            sources = [(i, b) for i, blocks in enumerate(held) for b in blocks
                       if b.block_hash is not None and b.ref_cnt == 1]
            if not sources or pool.get_num_free_blocks() == 0:
                continue
            i, src = sources[rng.randrange(len(sources))]
            (dst,) = pool.get_new_blocks(1)
            pool.move_block_hashes(src, dst)
            held[i].append(dst)
            out = (src.block_id, dst.block_id)
        elif op == "writable":
            out = [pool.is_block_writable(b) for b in pool.blocks]
        elif op == "reset":
            out = pool.reset_prefix_cache()
        else:
            continue
        trace.append((
            op, out,
            [(b.ref_cnt, b.block_hash, b.block_hash_num_tokens) for b in pool.blocks],
            [b.block_id for b in pool.free_block_queue.get_all_free_blocks()],
            _metrics(collector), _events(collector),
        ))
    return trace


def _run(pool_type, collector_type, seed, clock):
    random.seed(seed)  # the collector's draws
    clock[0] = 0
    collector = collector_type(sample_rate=0.6)
    return _drive(pool_type(12, True, BS, metrics_collector=collector), collector, seed)



SEEDS = [0, 1, 2, 3]


@pytest.mark.parametrize("seed", SEEDS)
def test_random_sequences_twins_agree(seed, clock):
    if _fast.NO_EXTENSIONS or "cython" not in _fast.available():
        pytest.skip("needs the compiled twin")
    compiled = _run(_fast.load("cython")["kv_cache"].BlockPool, KVCacheMetricsCollector, seed, clock)
    pure = _run(_fast.load("python")["kv_cache"].BlockPool, KVCacheMetricsCollector, seed, clock)
    assert compiled == pure
    ops = [step[0] for step in compiled]
    assert {"admit", "free", "move", "reset"} <= set(ops)
    assert any(step[5] for step in compiled), "no eviction recorded"


@live
@pytest.mark.parametrize("seed", SEEDS)
def test_random_sequences_as_vllm(impl, seed, clock, monkeypatch):
    """vLLM's pool with vLLM's collector is the oracle; kvcy's pool with either collector, and
    vLLM's pool with kvcy's collector, record the same thing step by step."""
    monkeypatch.setenv("VLLM_TARGET_DEVICE", "cpu")
    from vllm.v1.core.block_pool import BlockPool as VllmPool
    from vllm.v1.core.kv_cache_metrics import KVCacheMetricsCollector as VllmCollector

    oracle = _run(VllmPool, VllmCollector, seed, clock)
    assert any(step[5] for step in oracle) and any(step[0] == "move" for step in oracle)
    assert _run(impl.kv_cache.BlockPool, KVCacheMetricsCollector, seed, clock) == oracle
    assert _run(impl.kv_cache.BlockPool, VllmCollector, seed, clock) == oracle
    assert _run(VllmPool, KVCacheMetricsCollector, seed, clock) == oracle


def test_eviction_event_fields():
    event = KVCacheEvictionEvent(lifetime_seconds=2.0, idle_seconds=1.0, reuse_gaps_seconds=(0.5,))
    assert (event.lifetime_seconds, event.idle_seconds, event.reuse_gaps_seconds) == (2.0, 1.0, (0.5,))


def test_partial_entries_are_a_read_only_view(impl):
    """``cached_block_hashes_by_block`` (vLLM's name) is a read-only view of frozen key
    sets in both twins: Python cannot put into it what a later eviction would trust."""
    kv = impl.kv_cache
    pool = kv.BlockPool(6, True, 4)
    view = pool.cached_block_hashes_by_block
    assert dict(view) == {}
    with pytest.raises(TypeError):
        view[1] = {b"abcdefgh"}
    with pytest.raises(AttributeError):
        pool.cached_block_hashes_by_block = {}
    # an extra key lands in the view as a frozenset (the sequence is test_partial_prefix_cache_primitives.py's story)
    from types import SimpleNamespace

    pool = kv.BlockPool(6, True, 4)
    req = SimpleNamespace(request_id="r", block_hashes=[f"hash-{i}".encode().ljust(32, b".") for i in range(4)],
                          all_token_ids=list(range(16)), lora_request=None, mm_features=[], cache_salt=None,
                          prompt_embeds=None, session_id=None)
    (a,) = pool.get_new_blocks(1)
    pool.cache_partial_block(req, a, 4, 0, 8)  # a's own key
    pool.cache_full_blocks(req, [a], 0, 1, 8, 0)  # promoted to the full key
    pool.cache_partial_block(req, a, 4, 0, 8)  # now an extra key of a
    extra = pool.cached_block_hashes_by_block[a.block_id]
    assert type(extra) is frozenset and len(extra) == 1
    with pytest.raises(AttributeError):
        extra.add(b"junk-key")


# =================================================================================================
# ``BlockPool._maybe_evict_cached_block``: the private eviction step vLLM's own tests call.
#
# Both twins expose it, validated: it drops a block's prefix-cache entries (with their
# ``BlockRemoved`` events) and refuses a block that is not one of the pool's own, leaving the
# pool as it was.
# =================================================================================================

def pool_with_keys(impl, events=False):
    pool = impl.kv_cache.BlockPool(num_gpu_blocks=4, enable_caching=True, hash_block_size=16,
                                   enable_kv_cache_events=events)
    keys = [make_block_hash_with_group_id(BlockHash(h), g) for h, g in ((b"10", 1), (b"20", 2), (b"30", 3))]
    for block, key in zip(pool.blocks, keys + [keys[0]]):  # (block 3 shares block 0's key)
        block.set_block_hash(key)
        pool.cached_block_hash_to_block.insert(key, block)
    return pool, keys


def test_evicts_one_block_and_keeps_a_shared_key(impl):
    pool, keys = pool_with_keys(impl)
    b0, b1, b2, b3 = pool.blocks
    assert pool._maybe_evict_cached_block(b1) is True
    assert b1.block_hash is None
    assert pool.get_cached_block(BlockHash(b"20"), [2]) is None
    assert pool._maybe_evict_cached_block(b1) is False  # (no key left)
    assert pool._maybe_evict_cached_block(b0) is True
    assert pool.get_cached_block(BlockHash(b"10"), [1]) == [b3]  # (block 3 still holds the key)
    assert pool.num_evictions == 2


def test_eviction_emits_block_removed(impl):
    pool, keys = pool_with_keys(impl, events=True)
    pool.take_events()
    pool._maybe_evict_cached_block(pool.blocks[2])
    (event,) = pool.take_events()
    assert type(event).__name__ == "BlockRemoved" and event.group_idx == 3


@pytest.mark.parametrize("bad, exc, msg", [
    (None, TypeError, "block must be a KVCacheBlock"),
    ("block", TypeError, "block must be a KVCacheBlock"),
])
def test_not_a_block_is_refused(impl, bad, exc, msg):
    pool, _ = pool_with_keys(impl)
    with pytest.raises(exc, match=msg):
        pool._maybe_evict_cached_block(bad)


def test_a_block_of_another_pool_is_refused_and_nothing_changes(impl):
    pool, keys = pool_with_keys(impl)
    stranger = impl.kv_cache.KVCacheBlock(1)
    stranger.set_block_hash(keys[1])
    other, _ = pool_with_keys(impl)
    for foreign in (stranger, other.blocks[1], impl.kv_cache.KVCacheBlock(1000)):
        with pytest.raises(RuntimeError, match="is not a block of this pool"):
            pool._maybe_evict_cached_block(foreign)
    assert pool.get_cached_block(BlockHash(b"20"), [2]) == [pool.blocks[1]]
    assert pool.blocks[1].block_hash == keys[1]


# =================================================================================================
# ``BlockHashToBlockMap._cache``: vLLM's dict of the prefix cache, which vLLM's own tests read,
# pop, clear and restore to stage a lookup.
#
# In the pure twin it is the map's dict itself; in the compiled twin a live view of the
# open-addressing table, so both twins see the same effects.  The compiled view checks what is
# assigned (a block, or a non-empty dict of blocks keyed by their ids) before it changes anything.
# =================================================================================================

def filled(impl):
    pool = impl.kv_cache.BlockPool(num_gpu_blocks=5, enable_caching=True, hash_block_size=16)
    keys = [make_block_hash_with_group_id(BlockHash(h), 0) for h in (b"a", b"b", b"c")]
    for block, key in zip(pool.blocks[1:], keys + [keys[0]]):  # (block 4 shares block 1's key)
        block.set_block_hash(key)
        pool.cached_block_hash_to_block.insert(key, block)
    return pool, keys


def test_reads_are_vllms_dict(impl):
    pool, (ka, kb, kc) = filled(impl)
    b = pool.blocks
    cache = pool.cached_block_hash_to_block._cache
    assert cache == {ka: {1: b[1], 4: b[4]}, kb: b[2], kc: b[3]}
    assert len(cache) == 3 and set(cache) == {ka, kb, kc} and kb in cache
    assert cache[kb] is b[2] and cache.get(b"nope\x00\x00\x00\x00") is None


def test_pop_and_restore_stage_a_miss(impl):
    pool, (ka, kb, kc) = filled(impl)
    m = pool.cached_block_hash_to_block
    backup = copy.copy(m._cache)
    assert m._cache.pop(kb) is pool.blocks[2]
    assert m.get_one_block(kb) is None and len(m) == 2
    assert backup[kb] is pool.blocks[2]  # (the copy is a snapshot)
    m._cache[kb] = backup[kb]
    assert m.get_one_block(kb) is pool.blocks[2]
    m._cache.pop(ka)
    m._cache[ka] = backup[ka]  # (a shared key comes back whole, first block first)
    assert m.get_one_block(ka) is pool.blocks[1] and m._cache[ka] == {1: pool.blocks[1], 4: pool.blocks[4]}


def test_clear_empties_the_map_and_inserts_work_after(impl):
    pool, (ka, kb, kc) = filled(impl)
    m = pool.cached_block_hash_to_block
    m._cache.clear()
    assert len(m) == 0 and m._cache == {} and m.get_one_block(ka) is None
    m.insert(kc, pool.blocks[3])
    assert m._cache == {kc: pool.blocks[3]}


def test_missing_key_is_a_key_error(impl):
    pool, _ = filled(impl)
    missing = make_block_hash_with_group_id(BlockHash(b"zz"), 0)
    with pytest.raises(KeyError):
        del pool.cached_block_hash_to_block._cache[missing]
    with pytest.raises(KeyError):
        pool.cached_block_hash_to_block._cache[missing]


@pytest.mark.parametrize("value", [None, 3, "block", {}, {1: None}, {2: "x"}, [1], {"1": None}])
def test_compiled_view_refuses_bad_entries_and_changes_nothing(impl, value):
    if impl.name != "cython":
        pytest.skip("the pure twin's _cache is the map's own dict")
    pool, (ka, kb, kc) = filled(impl)
    m = pool.cached_block_hash_to_block
    before = m._cache.copy()
    with pytest.raises((TypeError, ValueError)):
        m._cache[kb] = value
    with pytest.raises((TypeError, ValueError)):
        m._cache[kb] = {7: pool.blocks[2]} if value is None else value  # (an id that is not the block's)
    assert m._cache == before and m.get_one_block(kb) is pool.blocks[2]


@pytest.mark.parametrize("key", [None, 7, b"", b"ab", "abcdef"])
def test_compiled_view_refuses_bad_keys(impl, key):
    if impl.name != "cython":
        pytest.skip("the pure twin's _cache is the map's own dict")
    pool, (ka, kb, kc) = filled(impl)
    m = pool.cached_block_hash_to_block
    for op in (lambda: m._cache[key], lambda: m._cache.__setitem__(key, pool.blocks[2]),
               lambda: m._cache.__delitem__(key)):
        with pytest.raises((TypeError, ValueError, KeyError)):
            op()
    assert len(m) == 3


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


def _key_kv_cache_core(n: int, gid: int = 0, width: int = 32) -> bytes:
    return n.to_bytes(width, "big") + gid.to_bytes(4, "big")


# --------------------------------------------------------------------------- pool-level bad input
# Found by fuzzing the public pool API with wrong types and counts: the compiled twin crashed
# the interpreter on the first three (unchecked casts and indexes), the Python twin left
# half-cached blocks behind.
def _pool_with_request(impl, tokens=16):
    pool = impl.kv_cache.BlockPool(16, enable_caching=True, hash_block_size=BS)
    req = impl.kv_cache.Request("r", list(range(tokens)), block_hasher=hasher())
    return pool, req


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
    keys = [_key_kv_cache_core(rng.randrange(300), gid=rng.randrange(3), width=rng.choice((8, 16, 32))) for _ in range(600)]
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
    cache.insert(_key_kv_cache_core(1), blocks[0])
    assert cache.get_one_block(_key_kv_cache_core(1)) is blocks[0]


def test_evicting_blocks_keyed_by_hand(impl):
    """Blocks given their keys through the public setters (not by caching),
    some sharing a key through different bytes objects, are found and
    dropped by eviction in any order."""
    m = impl.kv_cache
    pool = m.BlockPool(12, enable_caching=True, hash_block_size=BS)
    cache = pool.cached_block_hash_to_block
    blocks = pool.get_new_blocks(8)
    keys = [_key_kv_cache_core(i % 5, gid=i % 5 % 2, width=32) for i in range(8)]  # blocks 5-7 repeat the keys of 0-2
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
        cache.insert(_key_kv_cache_core(i), blk)
    cache.insert(_key_kv_cache_core(0), m.KVCacheBlock(6))  # a duplicate key
    assert cache.pop(_key_kv_cache_core(3), 5) is blk
    del cache
    assert sys.getrefcount(blk) == before


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


def test_evict_blocks_takes_any_iterable(impl):
    pool, req = _pool_with_request(impl)
    blocks = pool.get_new_blocks(2)
    pool.cache_full_blocks(req, blocks, 0, 2, BS, 0)
    pool.evict_blocks(b.block_id for b in blocks)  # (a generator: read once)
    assert [b.block_hash for b in blocks] == [None, None]
    assert len(pool.cached_block_hash_to_block) == 0


def full_spec(bs: int = BS) -> FullAttentionSpec:
    return FullAttentionSpec(block_size=bs, num_kv_heads=1, head_size=8, dtype="float16")


def manager_edges(impl, num_blocks=20, max_model_len=40, **kw):
    cfg = KVCacheConfig(num_blocks=num_blocks, kv_cache_tensors=[],
                        kv_cache_groups=[KVCacheGroupSpec(["l0"], full_spec())])
    return impl.kv_cache.KVCacheManager(cfg, max_model_len=max_model_len, scheduler_block_size=BS,
                                        hash_block_size=BS, **kw)


def request(impl, rid, tokens):
    return impl.kv_cache.Request(rid, tokens, block_hasher=get_request_block_hasher(BS, get_hash_fn_by_name("sha256")))


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


def test_evict_blocks_past_the_pool_asserts_as_vllm(impl):
    """A block id past the pool is vLLM's ``AssertionError`` (a connector bug), raised
    before any key is dropped."""
    mgr = manager_edges(impl)
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


def test_empty_pool_asserts_as_vllm(impl):
    """A KV-cache config of 0 blocks (or a non-int count): vLLM's ``BlockPool`` asserts
    ``isinstance(num_gpu_blocks, int) and num_gpu_blocks > 0``, so building the manager
    raises AssertionError.  kvcy raised ValueError / TypeError."""
    cfg = KVCacheConfig(num_blocks=0, kv_cache_tensors=[], kv_cache_groups=[KVCacheGroupSpec(["l0"], full_spec())])
    with pytest.raises(AssertionError, match="at least 1"):
        impl.kv_cache.KVCacheManager(cfg, max_model_len=64, scheduler_block_size=BS, hash_block_size=BS)
    for bad in (0, -3, 4.0, "4"):
        with pytest.raises(AssertionError):
            impl.kv_cache.BlockPool(bad, True, BS)


SHA = get_hash_fn_by_name("sha256")


def test_block_pool_takes_vllms_keywords(impl):
    pool = impl.kv_cache.BlockPool(8, True, BS, enable_kv_cache_events=True, metrics_collector=None,
                                   num_hash_lookahead_tokens=3, medium="CPU")
    assert (pool.num_hash_lookahead_tokens, pool.medium) == (3, "CPU")
    assert impl.kv_cache.BlockPool(8, True, BS).medium == "GPU"
    req = request_api(impl, "a", range(8))
    blocks = pool.get_new_blocks(2)
    pool.cache_full_blocks(req, blocks, 0, 2, BS, 0)
    (event,) = pool.take_events()
    assert event.medium == "CPU"
    with pytest.raises(ValueError, match="num_hash_lookahead_tokens must be a non-negative int"):
        impl.kv_cache.BlockPool(8, True, BS, num_hash_lookahead_tokens=-1)


def test_block_pool_parameters_in_vllms_order(impl):
    pool = impl.kv_cache.BlockPool(8, True, BS, True, None, 3, "CPU")
    assert (pool.enable_kv_cache_events, pool.num_hash_lookahead_tokens, pool.medium) == (True, 3, "CPU")


ROOT = Path(__file__).resolve().parents[1]


def run_isolated(impl, body: str) -> subprocess.CompletedProcess:
    """Run ``body`` in a fresh interpreter with the twin's module as ``m`` (a crash kills only
    that interpreter); the caller checks the return code (negative: killed by a signal)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    prelude = textwrap.dedent(
        f"""
        from kvcy import _fast
        from kvcy.hashing import get_hash_fn_by_name, get_request_block_hasher, init_none_hash
        from kvcy.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
        m = _fast.load({impl.name!r})["kv_cache"]
        init_none_hash(get_hash_fn_by_name("sha256"))
        hasher = get_request_block_hasher({BS}, get_hash_fn_by_name("sha256"))
        spec = FullAttentionSpec(block_size={BS}, num_kv_heads=1, head_size=8, dtype="float16")
        config = KVCacheConfig(num_blocks=64, kv_cache_tensors=[],
                               kv_cache_groups=[KVCacheGroupSpec(["l0"], spec)])
        """
    )
    return subprocess.run([sys.executable, "-c", prelude + textwrap.dedent(body)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)


def assert_clean_exit(proc: subprocess.CompletedProcess) -> None:
    assert proc.returncode == 0, (
        f"exit status {proc.returncode} (a negative one: killed by that signal)\n"
        f"stdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
    )


# --------------------------------------------------------------------------- item 4
def test_a_dead_pool_gives_its_memory_back(impl):
    """Building a manager of 10^6 blocks, using it and deleting it brings RSS back to within
    10 % of where it was (the compiled twin's slab allocator kept every block's memory: RSS
    went from 25 to 118 MiB and back to only 86)."""
    body = """
        import gc, os, random

        def rss_mib():
            with open(f"/proc/{os.getpid()}/statm") as f:
                return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20

        def use(num_blocks):
            cfg = KVCacheConfig(num_blocks=num_blocks, kv_cache_tensors=[],
                                kv_cache_groups=[KVCacheGroupSpec(["l0"], spec)])
            mgr = m.KVCacheManager(cfg, max_model_len=4096, scheduler_block_size=4, hash_block_size=4)
            rng = random.Random(num_blocks)
            for i in range(200):
                req = m.Request(f"r{i}", [rng.randrange(1000) for _ in range(400)], block_hasher=hasher)
                mgr.allocate_slots(req, req.num_tokens)
                if i % 2:
                    mgr.free(req)
            return mgr, rss_mib()

        # A process that has used kvcy already (its one-time growth -- interpreter
        # caches, the C allocator's thresholds -- happens here, not in the figure).
        use(100_000)
        gc.collect()
        try:
            import ctypes
            ctypes.CDLL("libc.so.6").malloc_trim(0)
        except (OSError, AttributeError):
            pass
        before = rss_mib()
        mgr, peak = use(1_000_000)
        del mgr
        gc.collect()
        try:  # (hand glibc's free pages back too: what is measured is what kvcy still holds)
            import ctypes
            ctypes.CDLL("libc.so.6").malloc_trim(0)
        except (OSError, AttributeError):
            pass
        after = rss_mib()
        print(f"rss before {before:.1f} MiB, with the pool {peak:.1f}, after {after:.1f}")
        assert peak - before > 60, (before, peak)  # (the pool was big enough to tell)
        assert after <= before * 1.10, (before, peak, after)
    """
    assert_clean_exit(run_isolated(impl, body))


def test_blocks_are_seen_by_tracemalloc(impl):
    import tracemalloc

    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        blocks = [impl.kv_cache.KVCacheBlock(i) for i in range(20_000)]
        grown = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert grown >= 20_000 * 48, grown  # (each block's object, not just the list)
    del blocks


def test_cycles_through_the_queue_and_the_map_are_collected(impl):
    """A block subclass whose instance refers back to the queue (or map) holding it forms a
    cycle; the collector must see the queue's and map's references to find it."""
    import gc
    import weakref

    mod = impl.kv_cache

    class Tagged(mod.KVCacheBlock):
        pass

    class Token:
        pass

    gc.collect()
    block = Tagged(7)
    queue = mod.FreeKVCacheBlockQueue([block])
    block.owner, block.token = queue, Token()
    queue_token = weakref.ref(block.token)
    cache = mod.BlockHashToBlockMap()
    other = Tagged(8)
    cache.insert(b"h" * 32 + (0).to_bytes(4, "big"), other)
    other.owner, other.token = cache, Token()
    cache_token = weakref.ref(other.token)
    del block, queue, other, cache
    gc.collect()
    assert queue_token() is None  # the cycle block -> queue -> ring -> block was found
    assert cache_token() is None  # ... and block -> map -> table -> block
