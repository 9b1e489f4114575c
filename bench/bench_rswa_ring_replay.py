"""R-SWA, circular-buffer and bounded-replay groups: Cython vs pure-Python twin, one group each.

Run: ``python -m pytest bench/bench_rswa_ring_replay.py --benchmark-only``.
Compare the ``cython`` and ``python`` rows of a group (the ratio of their means is the speedup).
"""

from __future__ import annotations

import itertools
import random

from kvcy.hashing import get_hash_fn_by_name, get_request_block_hasher, init_none_hash
from kvcy.kv_cache_interface import (
    CircularBufferSpec,
    FullAttentionSpec,
    KVCacheConfig,
    KVCacheGroupSpec,
    RSWASpec,
    SlidingWindowMLASpec,
)
from kvcy.request import RequestStatus

ATTN = {"block_size": 16, "num_kv_heads": 8, "head_size": 128, "dtype": "bfloat16"}


def _config(num_blocks: int, *specs) -> KVCacheConfig:
    return KVCacheConfig(num_blocks=num_blocks, kv_cache_tensors=[],
                         kv_cache_groups=[KVCacheGroupSpec([f"l{i}"], s) for i, s in enumerate(specs)])


def test_rswa_decode_steps(benchmark, impl):
    """64 running requests (256-token prompts) decode 64 steps on full attention + R-SWA
    (window 32): every step frees the R-SWA gap blocks that left the decode window."""
    init_none_hash(get_hash_fn_by_name("sha256"))
    hasher = get_request_block_hasher(16, get_hash_fn_by_name("sha256"))
    Request = impl.kv_cache.Request
    cfg = _config(20_000, FullAttentionSpec(**ATTN), RSWASpec(**ATTN, rswa_window=32))
    rng = random.Random(1)
    benchmark.group = "R-SWA: 64 decode steps x 64 requests, window 32 (full + R-SWA groups)"

    def setup():
        mgr = impl.kv_cache.KVCacheManager(cfg, max_model_len=8192, scheduler_block_size=16, hash_block_size=16)
        reqs = []
        for i in range(64):
            req = Request(f"r{i}", [rng.randrange(32000) for _ in range(256)], block_hasher=hasher)
            mgr.allocate_slots(req, req.num_tokens)
            req.num_computed_tokens = req.num_tokens
            req.status = RequestStatus.RUNNING
            reqs.append(req)
        return (mgr, reqs), {}

    def run(mgr, reqs):
        for step in range(64):
            for req in reqs:
                req.append_output_token_ids([step])
                mgr.allocate_slots(req, 1)
                req.num_computed_tokens += 1
        return sum(b.is_null for b in mgr.coordinator.get_blocks("r0")[1])

    nulls = benchmark.pedantic(run, setup=setup, rounds=5, warmup_rounds=1)
    assert nulls > 0  # (the gap was freed)


def test_ring_request_lifecycle(benchmark, impl, freeze_startup_heap):
    """get_computed_blocks + allocate_slots + free on full attention + a circular buffer,
    1024-token request sharing 512 tokens with a cached one: the ring takes no hit, one block."""
    init_none_hash(get_hash_fn_by_name("sha256"))
    hasher = get_request_block_hasher(16, get_hash_fn_by_name("sha256"))
    Request = impl.kv_cache.Request
    cfg = _config(10_000, FullAttentionSpec(**ATTN), CircularBufferSpec(**ATTN))
    mgr = impl.kv_cache.KVCacheManager(cfg, max_model_len=4096, scheduler_block_size=16, hash_block_size=16)
    rng = random.Random(2)
    prefix = [rng.randrange(32000) for _ in range(512)]
    warm = Request("warm", prefix + [1] * 32, block_hasher=hasher)
    mgr.allocate_slots(warm, warm.num_tokens)
    mgr.free(warm)
    freeze_startup_heap()
    counter = itertools.count()
    benchmark.group = "ring: get_computed_blocks+allocate_slots+free, 1024 tokens, 512 shared (full + ring)"

    def setup():
        req = Request(f"c{next(counter)}", prefix + [rng.randrange(32000) for _ in range(512)], block_hasher=hasher)
        return (req,), {}

    def run(req):
        blocks, hit, _ = mgr.get_computed_blocks(req)
        got = mgr.allocate_slots(req, req.num_tokens - hit, num_new_computed_tokens=hit, new_computed_blocks=blocks)
        mgr.free(req)
        return hit, len(got.get_block_ids()[1])

    assert benchmark.pedantic(run, setup=setup, rounds=300, warmup_rounds=10) == (512, 1)


def test_bounded_replay_admission(benchmark, impl, freeze_startup_heap):
    """A 1024-token admission sharing 512 tokens on full MLA + bounded-replay sliding-window MLA
    (window 128): the full group's hit, rewound by the window as vLLM's scheduler does, and
    fresh blocks for the replayed tokens."""
    from kvcy.kv_cache_interface import MLAAttentionSpec

    init_none_hash(get_hash_fn_by_name("sha256"))
    hasher = get_request_block_hasher(16, get_hash_fn_by_name("sha256"))
    Request = impl.kv_cache.Request
    mla = {"block_size": 16, "num_kv_heads": 1, "head_size": 576, "dtype": "bfloat16"}
    cfg = _config(10_000, MLAAttentionSpec(**mla),
                  SlidingWindowMLASpec(**mla, sliding_window=128, bounded_replay=True))
    mgr = impl.kv_cache.KVCacheManager(cfg, max_model_len=4096, scheduler_block_size=16, hash_block_size=16)
    rng = random.Random(3)
    prefix = [rng.randrange(32000) for _ in range(512)]
    warm = Request("warm", prefix + [1] * 32, block_hasher=hasher)
    mgr.allocate_slots(warm, warm.num_tokens)
    mgr.free(warm)
    freeze_startup_heap()
    counter = itertools.count()
    replay = cfg.kv_cache_groups[1].kv_cache_spec.prefix_replay_tokens
    benchmark.group = "bounded replay: admission with a 512-token hit rewound by 128 (MLA + replay SWA-MLA)"

    def setup():
        req = Request(f"b{next(counter)}", prefix + [rng.randrange(32000) for _ in range(512)], block_hasher=hasher)
        return (req,), {}

    def run(req):
        blocks, hit, _ = mgr.get_computed_blocks(req)
        n_new = req.num_tokens - (hit - replay)
        got = mgr.allocate_slots(req, n_new - replay, num_new_computed_tokens=hit, new_computed_blocks=blocks)
        held = [len(g) for g in mgr.get_blocks(req.request_id).blocks]
        mgr.free(req)
        return hit, got is not None, held

    # (the replay group: nulls below the window, fresh blocks from the replayed tokens on)
    assert benchmark.pedantic(run, setup=setup, rounds=300, warmup_rounds=10) == (512, True, [64, 64])
