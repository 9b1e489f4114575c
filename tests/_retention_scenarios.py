"""Sparse prefix-cache retention and ``extra_retained_tokens``, driven on vLLM 0.33.0 and on kvcy.

One driver, two back ends (as ``tests/_dropin_scenarios.py``): ``run(api, case)`` admits,
steps and frees requests on a ``KVCacheManager`` the way vLLM's scheduler does and
returns plain data (hits, ``shared_prefix_boundary``, new block ids, the free queue after
each free, every cached block's key at the end).  ``vllm_api()`` builds vLLM's objects,
``kvcy_api(impl)`` kvcy's.  ``tests/test_single_type_kv_cache_manager.py`` holds what this printed for
its fixed cases on vLLM (``summary``; ``python tests/_retention_scenarios.py`` with vLLM
importable, ``VLLM_TARGET_DEVICE=cpu``) and
compares the two live over random cases when vLLM is importable.

A case: ``groups`` (``("full", block_size)`` / ``("swa", block_size, window, extra)``),
``hash_block_size``, ``scheduler_block_size``, ``num_blocks``, ``use_eagle``,
``retention`` (the config's ``prefix_cache_retention_interval``) and ``ops``:

* ``("admit", rid, runs, chunk)``: a request with the prompt made of ``(start, count)``
  runs; ``get_computed_blocks`` (the request's ``shared_prefix_boundary`` is set from
  it, as the scheduler does), then ``allocate_slots`` with the hit and up to ``chunk`` new
  tokens.  A request that does not fit is dropped.
* ``("step", rid, chunk)``: the next prefill chunk, or (prompt done) one decode token.
* ``("free", rid)``.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from types import SimpleNamespace


def _tokens(runs):
    out = []
    for start, count in runs:
        out.extend(range(start, start + count))
    return out


def _key(block):
    key = bytes(block.block_hash)
    return [block.block_id, key[:-4][:8].hex(), int.from_bytes(key[-4:], "big"), block.block_hash_num_tokens]


def run(api, case: dict) -> dict:
    specs = [api.full(g[1]) if g[0] == "full" else api.swa(g[1], g[2], g[3]) for g in case["groups"]]
    mgr = api.manager(specs, case["num_blocks"], case["hash_block_size"], case["scheduler_block_size"],
                      case["use_eagle"], case["retention"])
    reqs: dict = {}
    trace: list = []

    def alloc(req, n_new, n_hit=0, blocks=None):
        if blocks is None:
            out = mgr.allocate_slots(req, n_new)
        else:
            out = mgr.allocate_slots(req, n_new, n_hit, blocks)
        if out is not None:
            req.num_computed_tokens = req.num_computed_tokens + n_hit + n_new
        return None if out is None else [list(ids) for ids in out.get_block_ids()]

    for op in case["ops"]:
        kind, rid = op[0], op[1]
        if kind == "admit":
            if rid in reqs:
                continue
            req = api.request(rid, _tokens(op[2]), case["hash_block_size"])
            blocks, n_hit, boundary = mgr.get_computed_blocks(req)
            req.shared_prefix_boundary = boundary
            n_new = min(op[3], req.num_tokens - n_hit)
            got = alloc(req, n_new, n_hit, blocks)
            rec = [n_hit, boundary, [list(ids) for ids in blocks.get_block_ids()], got]
            if got is not None:
                reqs[rid] = req
        elif kind == "step":
            req = reqs.get(rid)
            if req is None:
                continue
            if req.num_computed_tokens < req.num_prompt_tokens:
                rec = alloc(req, min(op[2], req.num_prompt_tokens - req.num_computed_tokens))
            else:
                req.append_output_token_ids([90000 + req.num_tokens])
                rec = alloc(req, 1)
        elif kind == "free":
            req = reqs.pop(rid, None)
            if req is None:
                continue
            mgr.free(req)
            rec = [b.block_id for b in mgr.block_pool.free_block_queue.get_all_free_blocks()]
        else:
            raise ValueError(kind)
        trace.append([kind, rid, rec])
    keys = sorted(_key(b) for b in mgr.block_pool.blocks if b.block_hash is not None)
    return {"trace": trace, "keys": keys}


def summary(observed: dict) -> dict:
    """What the test module records of a run: each admission's ``[hit, shared_prefix_boundary]``,
    the cached blocks as ``[block id, group, tokens]``, and a digest of everything observed
    (hit and new block ids, free-queue orders, cache keys with their hashes)."""
    digest = hashlib.sha256(json.dumps(observed, sort_keys=True).encode()).hexdigest()[:16]
    hits = [rec[:2] for kind, _, rec in observed["trace"] if kind == "admit"]
    cached = [[k[0], k[2], k[3]] for k in observed["keys"]]
    return {"hits": hits, "cached": cached, "digest": digest}


def kvcy_api(impl) -> SimpleNamespace:
    from kvcy.hashing import get_hash_fn_by_name, get_request_block_hasher, init_none_hash
    from kvcy.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec, SlidingWindowSpec

    kv = impl.kv_cache
    sha = get_hash_fn_by_name("sha256")
    init_none_hash(sha)

    def manager(specs, num_blocks, hash_block_size, scheduler_block_size, use_eagle, retention):
        cfg = KVCacheConfig(num_blocks=num_blocks, kv_cache_tensors=[],
                            kv_cache_groups=[KVCacheGroupSpec([f"l{i}"], s) for i, s in enumerate(specs)],
                            prefix_cache_retention_interval=retention)
        mgr = kv.KVCacheManager(cfg, max_model_len=4096, scheduler_block_size=scheduler_block_size,
                                hash_block_size=hash_block_size, use_eagle=use_eagle, max_in_flight_tokens=256,
                                use_int_block_hashes=False)
        mgr.refuse_unservable = False  # (the cases replay vLLM's manager: None for what can never fit)
        return mgr

    return SimpleNamespace(
        full=lambda bs: FullAttentionSpec(block_size=bs, num_kv_heads=1, head_size=8, dtype="float16"),
        swa=lambda bs, w, extra: SlidingWindowSpec(block_size=bs, num_kv_heads=1, head_size=8, dtype="float16",
                                                   sliding_window=w, extra_retained_tokens=extra),
        manager=manager,
        request=lambda rid, tokens, hbs: kv.Request(rid, tokens, block_hasher=get_request_block_hasher(hbs, sha)),
    )


def vllm_api() -> SimpleNamespace:
    import torch
    from vllm.sampling_params import SamplingParams
    from vllm.utils.hashing import get_hash_fn_by_name
    from vllm.v1.core.kv_cache_manager import KVCacheManager
    from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
    from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec, SlidingWindowSpec
    from vllm.v1.request import Request

    sha = get_hash_fn_by_name("sha256")
    init_none_hash(sha)

    def manager(specs, num_blocks, hash_block_size, scheduler_block_size, use_eagle, retention):
        cfg = KVCacheConfig(num_blocks=num_blocks, kv_cache_tensors=[],
                            kv_cache_groups=[KVCacheGroupSpec([f"l{i}"], s) for i, s in enumerate(specs)],
                            prefix_cache_retention_interval=retention)
        return KVCacheManager(cfg, max_model_len=4096, scheduler_block_size=scheduler_block_size,
                              hash_block_size=hash_block_size, use_eagle=use_eagle, max_in_flight_tokens=256)

    def request(rid, tokens, hbs):
        return Request(rid, tokens, SamplingParams(max_tokens=4096), None,
                       block_hasher=get_request_block_hasher(hbs, sha))

    return SimpleNamespace(
        full=lambda bs: FullAttentionSpec(block_size=bs, num_kv_heads=1, head_size=8, dtype=torch.float16),
        swa=lambda bs, w, extra: SlidingWindowSpec(block_size=bs, num_kv_heads=1, head_size=8,
                                                   dtype=torch.float16, sliding_window=w,
                                                   extra_retained_tokens=extra),
        manager=manager,
        request=request,
    )


# Fixed cases whose vLLM results test_single_type_kv_cache_manager.py records.  Prompts: "a" and "b"
# share a long prefix (run 0), "c" a shorter one; chunked prefill; decode; frees.  Prompt
# lengths (66, 74) keep vLLM from registering a partial-block prefix entry in the 8-token
# full-attention group over 4-token hashes (fine-grained partial hits, not kvcy's yet): the
# last hash boundary a resend reaches falls on a full block's edge, with EAGLE or without.
def _ops(prompt, shared_b, shared_c, chunk):
    return [
        ("admit", "a", [(0, prompt)], chunk), ("step", "a", chunk), ("step", "a", chunk), ("step", "a", chunk),
        ("step", "a", chunk), ("step", "a", chunk), ("step", "a", 1), ("free", "a"),
        ("admit", "b", [(0, shared_b), (5000, prompt - shared_b)], prompt), ("step", "b", 1),
        ("admit", "c", [(0, shared_c), (7000, prompt - shared_c + 8)], chunk), ("step", "c", chunk),
        ("step", "c", chunk), ("free", "b"), ("step", "c", chunk), ("step", "c", chunk), ("free", "c"),
        ("admit", "d", [(0, prompt)], prompt), ("free", "d"),
    ]


CASES: dict[str, dict] = {}


def _case(name, groups, hbs, sbs, eagle, retention, ops, num_blocks=96):
    CASES[name] = dict(groups=groups, hash_block_size=hbs, scheduler_block_size=sbs, num_blocks=num_blocks,
                       use_eagle=eagle, retention=retention, ops=ops)


for _r in (None, 0, 32, 64):
    _tag = "dense" if _r is None else f"r{_r}"
    _case(f"swa4w6_{_tag}", [("swa", 4, 6, 0)], 4, 4, False, _r, _ops(66, 50, 22, 24))
    _case(f"swa4w6_eagle_{_tag}", [("swa", 4, 6, 0)], 4, 4, True, _r, _ops(66, 50, 22, 24))
    _case(f"full8_swa4w6_{_tag}", [("full", 8), ("swa", 4, 6, 0)], 4, 8, False, _r, _ops(66, 50, 22, 24))
    _case(f"full8_swa4w6_eagle_{_tag}", [("full", 8), ("swa", 4, 6, 0)], 4, 8, True, _r, _ops(66, 50, 22, 24))
for _extra in (3, 9):
    _case(f"swa4w6_extra{_extra}", [("swa", 4, 6, _extra)], 4, 4, False, None, _ops(66, 50, 22, 24))
    _case(f"full8_swa4w6_extra{_extra}_r32", [("full", 8), ("swa", 4, 6, _extra)], 4, 8, False, 32,
          _ops(66, 50, 22, 24))
_case("swa4w6_extra5_tight", [("swa", 4, 6, 5)], 4, 4, False, None, _ops(66, 50, 22, 24), num_blocks=14)


if __name__ == "__main__":
    import pprint

    os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
    api = vllm_api()
    names = sys.argv[1:] or list(CASES)
    print("EXPECTED = " + pprint.pformat({n: summary(run(api, CASES[n])) for n in names}, width=118, compact=True))
