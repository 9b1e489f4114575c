"""Mamba align mode: Cython vs pure-Python twin, side by side in one group.

Run: ``python -m pytest bench/bench_mamba.py --benchmark-only``.
One round is a hybrid (full attention + Mamba align, hash block finer than the blocks)
lifecycle of 8 requests, pairs of which share a prompt: chunked admissions with fine-grained
partial hits (copy-on-write of the shared state block), decode steps, step ends (copies
taken and released, boundary states handed off) and frees.  The ratio of the ``cython``
and ``python`` rows' means is the speedup.
"""

from __future__ import annotations

import pytest

from kvcy.hashing import get_hash_fn_by_name, get_request_block_hasher, init_none_hash
from kvcy.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec, MambaSpec

HBS = 4
N_REQ = 8
PROMPT = 90
DECODE = 24


def _manager(impl):
    groups = [
        KVCacheGroupSpec(["attn"], FullAttentionSpec(block_size=16, num_kv_heads=8, head_size=128, dtype="bfloat16")),
        KVCacheGroupSpec(["mamba"], MambaSpec(block_size=16, shapes=((64, 128),), dtypes=("float32",),
                                              mamba_cache_mode="align")),
    ]
    cfg = KVCacheConfig(num_blocks=512, kv_cache_tensors=[], kv_cache_groups=groups)
    return impl.kv_cache.KVCacheManager(cfg, 4096, 16, HBS, enable_kv_cache_events=True)


def test_mamba_align_lifecycle(benchmark, impl):
    """8 requests: admission in two chunks (the first ending at the prompt's last reusable
    hash boundary), 24 decode steps each, step ends, frees; later requests hit the earlier
    ones' states, partial hits included."""
    sha = get_hash_fn_by_name("sha256")
    init_none_hash(sha)
    hasher = get_request_block_hasher(HBS, sha)
    mod = impl.kv_cache
    # (pairs of requests with one prompt: the second resends the first, whose state at the
    # prompt's last reusable hash boundary -- inside a block -- it hits)
    prompts = [list(range(1000, 1060)) + list(range(5000 + 100 * (r // 2), 5000 + 100 * (r // 2) + PROMPT - 60))
               for r in range(N_REQ)]
    benchmark.group = f"mamba align: hybrid lifecycle, {N_REQ} requests x {DECODE} decode steps"
    hits = []

    def run():
        mgr = _manager(impl)
        reqs = []
        for r, prompt in enumerate(prompts):
            req = mod.Request(f"r{r}", prompt, block_hasher=hasher)
            blocks, n_hit, boundary = mgr.get_computed_blocks(req)
            req.shared_prefix_boundary = boundary
            hits.append(n_hit)
            tail = (len(prompt) - 1) // HBS * HBS
            first = tail - n_hit if tail > n_hit else len(prompt) - n_hit
            assert mgr.allocate_slots(req, first, n_hit, blocks) is not None
            req.num_computed_tokens = n_hit + first
            reqs.append(req)
            mgr.block_pool.free_blocks(mgr.take_kv_cache_block_copies()[1])
            mgr.take_boundary_state_offloads()
            mgr.new_step_starts()
        for req in reqs:  # the rest of each prompt
            rest = req.num_tokens - req.num_computed_tokens
            if rest:
                assert mgr.allocate_slots(req, rest) is not None
                req.num_computed_tokens += rest
        for step in range(DECODE):
            for req in reqs:
                req.append_output_token_ids([7 + step])
                assert mgr.allocate_slots(req, 1) is not None
                req.num_computed_tokens += 1
            copies, retained = mgr.take_kv_cache_block_copies()
            mgr.block_pool.free_blocks(retained)
            mgr.take_boundary_state_offloads()
            mgr.new_step_starts()
        for req in reqs:
            mgr.finalize_partial_tail_offloads(req)
            mgr.free(req)
        return mgr

    mgr = benchmark(run)
    assert hits[:N_REQ] == [0, 88] * (N_REQ // 2)  # (partial hits: 88 tokens end inside a 16-token block)
    assert mgr.block_pool.get_num_free_blocks() == 511
