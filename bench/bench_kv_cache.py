"""Block-manager hot paths: Cython vs pure-Python twin, side by side per group.

Run: ``python -m pytest bench/bench_kv_cache.py --benchmark-only``.
Rows are grouped per hot path; compare the ``cython`` and ``python`` rows of a
group (the ratio of their means is the speedup).  Per-block costs: divide by
the block count in the group name.
"""

from __future__ import annotations

import itertools
import random
from types import SimpleNamespace

import pytest

from kvcy.hashing import get_hash_fn_by_name, get_request_block_hasher, init_none_hash
from kvcy.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
from kvcy.request import RequestStatus

N_BLOCKS = 256


def _config(num_blocks: int, block_size: int = 16) -> KVCacheConfig:
    spec = FullAttentionSpec(block_size=block_size, num_kv_heads=8, head_size=128, dtype="bfloat16")
    return KVCacheConfig(num_blocks=num_blocks, kv_cache_tensors=[],
                         kv_cache_groups=[KVCacheGroupSpec(["layer.0"], spec)])


@pytest.mark.parametrize("pool_size", [1_000, 10_000, 100_000, 1_000_000])
def test_free_queue_popleft_n_append_n(benchmark, impl, pool_size, freeze_startup_heap):
    """popleft_n(256) + append_n(256) on a queue of pool_size blocks."""
    mod = impl.kv_cache
    blocks = [mod.KVCacheBlock(i) for i in range(pool_size)]
    queue = mod.FreeKVCacheBlockQueue(blocks)
    freeze_startup_heap()
    benchmark.group = f"free queue: popleft_n+append_n, {N_BLOCKS} blocks (pool {pool_size})"

    def run():
        queue.append_n(queue.popleft_n(N_BLOCKS))

    benchmark(run)
    assert queue.num_free_blocks == pool_size


@pytest.mark.parametrize("pool_size", [1_000, 10_000, 100_000, 1_000_000])
def test_block_pool_get_new_free(benchmark, impl, pool_size, freeze_startup_heap):
    """get_new_blocks(256) + free_blocks on a caching pool of pool_size blocks."""
    pool = impl.kv_cache.BlockPool(pool_size, enable_caching=True, hash_block_size=16)
    freeze_startup_heap()
    benchmark.group = f"block pool: get_new_blocks+free_blocks, {N_BLOCKS} blocks (pool {pool_size})"

    def run():
        pool.free_blocks(pool.get_new_blocks(N_BLOCKS))

    benchmark(run)
    assert pool.get_num_free_blocks() == pool_size - 1


def _fill_cache(pool, rng: random.Random) -> None:
    """Give every free block that has no cache key one (random hashes), so that
    from here on every allocation evicts: the steady state of a full cache."""
    blocks = [b for b in pool.free_block_queue.get_all_free_blocks() if b.block_hash is None]
    taken = pool.get_new_blocks(len(blocks))  # the uncached ones sit at the head
    hashes = SimpleNamespace(request_id="fill", block_hashes=[rng.randbytes(32) for _ in taken],
                             all_token_ids=[0] * (16 * len(taken)), lora_request=None, mm_features=[],
                             cache_salt=None, prompt_embeds=None)  # (what events read, when on)
    pool.cache_full_blocks(hashes, taken, 0, len(taken), 16, 0)  # (all a request it needs)
    pool.free_blocks(taken)
    assert all(b.block_hash is not None for b in pool.free_block_queue.get_all_free_blocks())


def _bench_lifecycle(benchmark, impl, mgr, group: str, freeze, *, seed: int, warm_tail: int = 16,
                     fill: bool = False, after=None, rounds: int = 1000, warmup: int = 20):
    """Time get_computed_blocks + allocate_slots + free (+ ``after(mgr)``) of fresh 1024-token
    requests whose first 512 tokens a warm-up request cached (``fill``: then every free block gets
    a key, so each allocation evicts).  Each request is built outside the timing.

    Returns ``(hit, what after returned, requests run)`` of the last round.
    """
    init_none_hash(get_hash_fn_by_name("sha256"))
    hasher = get_request_block_hasher(16, get_hash_fn_by_name("sha256"))
    Request = impl.kv_cache.Request
    rng = random.Random(seed)
    prefix = [rng.randrange(32000) for _ in range(512)]
    warm = Request("warm", prefix + [1] * warm_tail, block_hasher=hasher)
    mgr.allocate_slots(warm, warm.num_tokens)
    mgr.free(warm)
    if fill:
        _fill_cache(mgr.block_pool, rng)
    if after is not None:
        after(mgr)  # (what the warm-up left behind)
    freeze()
    counter = itertools.count()
    benchmark.group = group

    def setup():
        req = Request(f"r{next(counter)}", prefix + [rng.randrange(32000) for _ in range(512)], block_hasher=hasher)
        return (req,), {}

    def run(req):
        blocks, hit, _ = mgr.get_computed_blocks(req)
        mgr.allocate_slots(req, req.num_tokens - hit, num_new_computed_tokens=hit, new_computed_blocks=blocks)
        mgr.free(req)
        return hit, (None if after is None else after(mgr))

    hit, extra = benchmark.pedantic(run, setup=setup, rounds=rounds, warmup_rounds=warmup)
    return hit, extra, next(counter)


@pytest.mark.parametrize("pool_size", [1_000, 10_000, 100_000, 1_000_000])
def test_request_lifecycle_half_cached(benchmark, impl, pool_size, freeze_startup_heap):
    """get_computed_blocks + allocate_slots + free, 1024-token request, first 512 tokens cached,
    in a full cache: the request's 32 new blocks evict 32 cached ones (at every pool size)."""
    mgr = impl.kv_cache.KVCacheManager(_config(pool_size), max_model_len=4096,
                                       scheduler_block_size=16, hash_block_size=16)
    evictions0 = []
    hit, _, requests = _bench_lifecycle(
        benchmark, impl, mgr, "request: get_computed_blocks+allocate_slots+free, 1024 tokens, 512 cached, full cache",
        lambda: (freeze_startup_heap(), evictions0.append(mgr.block_pool.num_evictions)), seed=0, fill=True)
    assert hit == 512
    # (1020 requests when timed; 1 with --benchmark-disable): every request evicted 32 blocks
    assert mgr.block_pool.num_evictions - evictions0[0] == 32 * requests


def test_request_lifecycle_kv_events(benchmark, impl, freeze_startup_heap):
    """The half-cached lifecycle above (pool 10,000) with KV events on: each round queues one
    BlockStored of 32 blocks and 32 BlockRemoved (int hashes), drained by take_events."""
    mgr = impl.kv_cache.KVCacheManager(_config(10_000), max_model_len=4096, scheduler_block_size=16,
                                       hash_block_size=16, enable_kv_cache_events=True)
    _, events, _ = _bench_lifecycle(
        benchmark, impl, mgr, "request lifecycle with KV events: 1024 tokens, 512 cached, full cache (pool 10,000)",
        freeze_startup_heap, seed=0, fill=True, after=lambda m: m.take_events())
    stored = [e for e in events if type(e).__name__ == "BlockStored"]
    removed = [e for e in events if type(e).__name__ == "BlockRemoved"]
    assert len(stored) == 1 and len(stored[0].block_hashes) == 32 and len(removed) == 32
    assert all(type(h) is int for h in stored[0].block_hashes)


@pytest.mark.parametrize("sample_rate", [None, 0.01, 1.0])
def test_request_lifecycle_metrics_collector(benchmark, impl, sample_rate, freeze_startup_heap):
    """The half-cached request lifecycle (pool 10_000) with a KVCacheMetricsCollector sampling
    ``sample_rate`` of the allocations (None: no collector), drained every round."""
    from kvcy.kv_cache_metrics import KVCacheMetricsCollector

    collector = None if sample_rate is None else KVCacheMetricsCollector(sample_rate)
    mgr = impl.kv_cache.KVCacheManager(_config(10_000), max_model_len=4096, scheduler_block_size=16,
                                       hash_block_size=16, metrics_collector=collector)
    hit, _, _ = _bench_lifecycle(
        benchmark, impl, mgr, f"request lifecycle (1024 tokens, 512 cached, pool 10000) with metrics collector, "
        f"sample_rate {sample_rate}", freeze_startup_heap, seed=0, fill=True,
        after=None if collector is None else (lambda m: collector.drain_events()))
    assert hit == 512
    if sample_rate == 1.0:
        assert len(collector.block_metrics) >= 64  # every block the last request held is followed


def test_decode_step_256_requests(benchmark, impl):
    """One decode step: allocate_slots(1 token) for each of 256 running requests."""
    init_none_hash(get_hash_fn_by_name("sha256"))
    hasher = get_request_block_hasher(16, get_hash_fn_by_name("sha256"))
    benchmark.group = "decode step: allocate_slots(1) x 256 running requests"
    Request = impl.kv_cache.Request
    rng = random.Random(1)
    state = {}

    def setup():
        mgr = impl.kv_cache.KVCacheManager(_config(20_000), max_model_len=8192,
                                           scheduler_block_size=16, hash_block_size=16)
        reqs = []
        for i in range(256):
            req = Request(f"d{i}", [rng.randrange(32000) for _ in range(100 + i % 16)], block_hasher=hasher)
            mgr.allocate_slots(req, req.num_tokens)
            req.num_computed_tokens = req.num_tokens
            req.status = RequestStatus.RUNNING
            req.append_output_token_ids([7])
            reqs.append(req)
        state["mgr"] = mgr
        return (mgr, reqs), {}

    def run(mgr, reqs):
        n = 0
        for req in reqs:
            if mgr.allocate_slots(req, 1) is not None:
                n += 1
        return n

    n = benchmark.pedantic(run, setup=setup, rounds=100, warmup_rounds=2)
    assert n == 256


def test_hybrid_request_lifecycle(benchmark, impl, freeze_startup_heap):
    """get_computed_blocks + allocate_slots + free on a hybrid cache (full attention, block 32,
    + sliding window 64, block 16; hashes at 16), 1024-token request sharing 512 tokens with a
    cached one: coarse keys, the sliding window's reachable tails, the hybrid hit search."""
    from kvcy.kv_cache_interface import SlidingWindowSpec

    full = FullAttentionSpec(block_size=32, num_kv_heads=8, head_size=128, dtype="bfloat16")
    swa = SlidingWindowSpec(block_size=16, num_kv_heads=8, head_size=128, dtype="bfloat16", sliding_window=64)
    cfg = KVCacheConfig(num_blocks=10_000, kv_cache_tensors=[],
                        kv_cache_groups=[KVCacheGroupSpec(["full.0"], full), KVCacheGroupSpec(["swa.0"], swa)])
    mgr = impl.kv_cache.KVCacheManager(cfg, max_model_len=4096, scheduler_block_size=32, hash_block_size=16)
    hit, _, _ = _bench_lifecycle(
        benchmark, impl, mgr, "hybrid request: get_computed_blocks+allocate_slots+free, 1024 tokens, 512 shared",
        freeze_startup_heap, seed=2, warm_tail=32, rounds=300, warmup=10)
    assert hit == 512


def test_zeroing_request_lifecycle(benchmark, impl, freeze_startup_heap):
    """get_computed_blocks + allocate_slots + free + take_new_block_ids on a mixed-precision cache
    (two full-attention groups, bfloat16 and float16: needs_kv_cache_zeroing), 1024-token request
    sharing 512 tokens with a cached one: every new block of each group is reported for zeroing."""
    a = FullAttentionSpec(block_size=16, num_kv_heads=8, head_size=128, dtype="bfloat16")
    b = FullAttentionSpec(block_size=16, num_kv_heads=8, head_size=128, dtype="float16")
    cfg = KVCacheConfig(num_blocks=10_000, kv_cache_tensors=[],
                        kv_cache_groups=[KVCacheGroupSpec(["a.0"], a), KVCacheGroupSpec(["b.0"], b)])
    assert cfg.needs_kv_cache_zeroing
    mgr = impl.kv_cache.KVCacheManager(cfg, max_model_len=4096, scheduler_block_size=16, hash_block_size=16)
    hit, ids, _ = _bench_lifecycle(
        benchmark, impl, mgr, "zeroing request: get_computed_blocks+allocate_slots+free+take_new_block_ids, 2 groups",
        freeze_startup_heap, seed=3, after=lambda m: m.take_new_block_ids(), rounds=300, warmup=10)
    assert hit == 512 and len(ids) == 2 * 32  # 32 new blocks in each group to zero
