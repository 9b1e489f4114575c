"""Manager scenarios replayed on vLLM 0.33.0 and on kvcy, with everything observable recorded.

One driver, two back ends: ``run(api, scenario)`` drives a ``KVCacheManager`` through a
scenario's operations and returns plain data (hit lengths, block ids, free-queue order, the
blocks' cache keys, KV events).  ``vllm_api()`` builds vLLM's objects and ``kvcy_api(impl)``
kvcy's, so the expected data ``tests/test_prefix_caching.py`` reads is what this file printed
when run against vLLM, and the optional live test there compares the two directly.

Recording the expected data (``tests/data/dropin_behaviour_recorded.json``)::

    VLLM_TARGET_DEVICE=cpu VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=0 \
        /work/vllm-venv/bin/python tests/_dropin_scenarios.py > tests/data/dropin_behaviour_recorded.json

It prints JSON (``format_expected``): one entry per scenario of ``SCENARIOS``.

Operations of a scenario (``ops``), in order:

* ``("new", rid, tokens)``: a request with those prompt tokens (``tokens`` is a list of
  ``(start, count)`` runs of consecutive ids, so prompts share prefixes by sharing runs).
* ``("lookup", rid)``: ``get_computed_blocks``; records the hit length and the hit's block ids.
* ``("alloc", rid, n)``: ``allocate_slots`` for ``n`` new tokens (with the pending hit on the
  request's first allocation); records the new block ids; then advances the request's
  ``num_computed_tokens`` by the hit and ``n``, as a scheduler does after the step.
* ``("append", rid, tokens)``: output tokens appended (``(start, count)`` runs).
* ``("free", rid)``: ``free``.

After every operation the events queued so far are taken and recorded; after the last, the
free queue and every cached block's key.
"""

from __future__ import annotations

import os
import sys
from types import SimpleNamespace

# Each scenario: KV-cache groups as ("full", block_size) or ("swa", block_size, window);
# hash / scheduler block sizes; pool size; EAGLE; operations.
SCENARIOS: dict[str, dict] = {}


def _add(name, groups, hash_block_size, scheduler_block_size, num_blocks, use_eagle, ops, full_hashes=False):
    SCENARIOS[name] = dict(groups=groups, hash_block_size=hash_block_size,
                           scheduler_block_size=scheduler_block_size, num_blocks=num_blocks,
                           use_eagle=use_eagle, ops=ops, full_hashes=full_hashes)


# Prompt lengths are chosen so that vLLM registers no partial-block prefix entry
# (FullAttentionManager._cache_partial_tail_block, the fine-grained partial hits that are
# not part of these items): the last hash boundary a resend can reach (the whole prompt with
# EAGLE, all but its last token without) falls on a full-attention block boundary.  The
# recorded keys carry each block's ``block_hash_num_tokens``, so such an entry would show.


def _sibling(shared, full_block):
    """Prompt runs of a request sharing ``shared`` tokens with "a" and ending on a block edge."""
    tail = full_block - shared % full_block
    return [(0, shared), (5000, tail)]


def _reuse(prompt, shared, full_block):
    """Request "a" prefilled at once, cached and freed; then "b", sharing ``shared`` tokens."""
    return [
        ("new", "a", [(0, prompt)]), ("lookup", "a"), ("alloc", "a", None), ("free", "a"),
        ("new", "b", _sibling(shared, full_block)), ("lookup", "b"), ("alloc", "b", None), ("free", "b"),
    ]


# --- item 5: EAGLE over full attention + sliding window: hits at the groups' common alignment.
# (full 32 / window 16x2: no scratch blocks, so only item 5 is at play in the hits.)
for _shared in (48, 64, 80):
    _add(f"eagle_full32_swa16w32_share{_shared}", [("full", 32), ("swa", 16, 32)], 16, 32, 64, True,
         _reuse(128, _shared, 32))
    _add(f"eagle_full16_swa8w24_share{_shared}", [("full", 16), ("swa", 8, 24)], 8, 16, 64, True,
         _reuse(128, _shared, 16))
for _shared in (64, 80):
    _add(f"eagle_full32_swa8w16_share{_shared}", [("full", 32), ("swa", 8, 16)], 8, 32, 64, True,
         _reuse(128, _shared, 32))
# ... with chunked prefill (cache_blocks at unaligned chunk ends) and decode, then siblings.
_add("eagle_full32_swa8w16_chunked", [("full", 32), ("swa", 8, 16)], 8, 32, 64, True,
     [("new", "a", [(0, 96)]), ("lookup", "a"), ("alloc", "a", 40), ("alloc", "a", 36), ("alloc", "a", 20),
      ("append", "a", [(900, 32)]), ("alloc", "a", 32), ("free", "a"),
      ("new", "b", [(0, 96), (900, 16), (7000, 16)]), ("lookup", "b"), ("alloc", "b", None),
      ("new", "c", [(0, 72), (8000, 24)]), ("lookup", "c"), ("alloc", "c", None),
      ("free", "b"), ("free", "c")])

# --- item 6: a sliding-window group in a hybrid caches only the reachable tail of each
# aligned segment; its other full blocks are scratch (uncached, reused first once freed).
for _full, _swa, _window, _eagle in ((64, 16, 16, False), (64, 16, 32, False), (32, 8, 8, False),
                                     (64, 8, 16, True), (64, 16, 40, True)):
    _add(f"scratch_full{_full}_swa{_swa}w{_window}_eagle{int(_eagle)}",
         [("full", _full), ("swa", _swa, _window)], _swa, _full, 48, _eagle,
         [("new", "a", [(0, 130)]), ("lookup", "a"), ("alloc", "a", 70), ("alloc", "a", 60),
          ("append", "a", [(600, 20)]), ("alloc", "a", 20), ("free", "a"),
          ("new", "b", [(0, 128), (3000, 5)]), ("lookup", "b"), ("alloc", "b", None),
          ("new", "c", [(0, 64), (4000, 70)]), ("lookup", "c"), ("alloc", "c", None),
          ("free", "c"), ("free", "b")])

# --- item 7: blocks coarser than the hash block are keyed by their last fine hash (cache
# keys, BlockStored / BlockRemoved hashes).  Equal group block sizes: no scratch blocks.
for _bs, _hbs in ((32, 8), (16, 4), (24, 8)):
    _add(f"coarse_full{_bs}_swa{_bs}_hash{_hbs}", [("full", _bs), ("swa", _bs, 2 * _bs)], _hbs, _bs, 16, False,
         [("new", "a", [(0, 3 * _bs + 2)]), ("lookup", "a"), ("alloc", "a", None),
          ("append", "a", [(700, _bs)]), ("alloc", "a", _bs), ("free", "a"),
          ("new", "b", [(0, 2 * _bs), (3000, 2)]), ("lookup", "b"), ("alloc", "b", None), ("free", "b"),
          ("new", "c", [(9000, 6 * _bs + 2)]), ("lookup", "c"), ("alloc", "c", None), ("free", "c")],
         full_hashes=True)


def _tokens(runs):
    out = []
    for start, count in runs:
        out.extend(range(start, start + count))
    return out


def _hex(h, width):
    """A hash as hex: its first ``width`` bytes (all of it for None)."""
    if h is None:
        return None
    return bytes(h)[:width].hex()


def _key(b, width):
    """A cached block: id, key hash (hex), key group id, ``block_hash_num_tokens``."""
    key = bytes(b.block_hash)
    return [b.block_id, _hex(key[:-4], width), int.from_bytes(key[-4:], "big"), b.block_hash_num_tokens]


def _event(ev, width):
    name = type(ev).__name__
    if name == "BlockStored":
        return ["stored", [_hex(h, width) for h in ev.block_hashes], _hex(ev.parent_block_hash, width),
                len(ev.token_ids), ev.block_size, ev.group_idx]
    if name == "BlockRemoved":
        return ["removed", [_hex(h, width) for h in ev.block_hashes], ev.group_idx]
    return [name]


def run(api, scenario: dict) -> dict:
    """Drive one scenario; return what it observed (plain lists, ints and strings).

    Hashes (cache keys, event hashes) are kept whole in the scenarios on coarse keys
    (``full_hashes``) and cut to their first 8 bytes elsewhere, which still tells any two
    apart (and a key made of joined fine hashes from the last of them).
    """
    width = None if scenario.get("full_hashes") else 8
    specs = []
    for g in scenario["groups"]:
        if g[0] == "full":
            specs.append(api.full(g[1]))
        else:
            specs.append(api.swa(g[1], g[2]))
    mgr = api.manager(specs, scenario["num_blocks"], scenario["hash_block_size"],
                      scenario["scheduler_block_size"], scenario["use_eagle"])
    reqs: dict = {}
    hits: dict = {}
    trace = []
    for op in scenario["ops"]:
        kind, rid = op[0], op[1]
        if kind == "new":
            reqs[rid] = api.request(rid, _tokens(op[2]), scenario["hash_block_size"])
            rec = None
        elif kind == "lookup":
            blocks, n, _ = mgr.get_computed_blocks(reqs[rid])
            hits[rid] = (blocks, n)
            rec = [n, [list(ids) for ids in blocks.get_block_ids()]]
        elif kind == "alloc":
            req = reqs[rid]
            blocks, n_hit = hits.pop(rid, (None, 0))
            n_new = op[2] if op[2] is not None else req.num_tokens - n_hit
            if blocks is None:
                out = mgr.allocate_slots(req, n_new)
            else:
                out = mgr.allocate_slots(req, n_new, n_hit, blocks)
            rec = None if out is None else [list(ids) for ids in out.get_block_ids()]
            if out is not None:
                req.num_computed_tokens = req.num_computed_tokens + n_hit + n_new
        elif kind == "append":
            reqs[rid].append_output_token_ids(_tokens(op[2]))
            rec = None
        elif kind == "free":
            mgr.free(reqs[rid])
            rec = [b.block_id for b in mgr.block_pool.free_block_queue.get_all_free_blocks()]
        else:
            raise ValueError(kind)
        events = [_event(e, width) for e in mgr.take_events()]
        for ev in events:  # (the premise above: no partial-block entry, whose event is finer)
            if ev[0] == "stored" and ev[4] != scenario["groups"][ev[5]][1]:
                raise AssertionError(f"a partial-block prefix entry was cached: {ev}")
        trace.append([kind, rid, rec, events])
    keys = [_key(b, width) for b in mgr.block_pool.blocks if b.block_hash is not None]
    free = [b.block_id for b in mgr.block_pool.free_block_queue.get_all_free_blocks()]
    return {"trace": trace, "keys": keys, "free": free}


def kvcy_api(impl) -> SimpleNamespace:
    """kvcy's objects, from one twin (``impl.kv_cache``)."""
    from kvcy.hashing import get_hash_fn_by_name, get_request_block_hasher, init_none_hash
    from kvcy.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec, SlidingWindowSpec

    kv = impl.kv_cache
    sha = get_hash_fn_by_name("sha256")
    init_none_hash(sha)

    def manager(specs, num_blocks, hash_block_size, scheduler_block_size, use_eagle):
        cfg = KVCacheConfig(num_blocks=num_blocks, kv_cache_tensors=[],
                            kv_cache_groups=[KVCacheGroupSpec([f"l{i}"], s) for i, s in enumerate(specs)])
        return kv.KVCacheManager(cfg, max_model_len=4096, scheduler_block_size=scheduler_block_size,
                                 hash_block_size=hash_block_size, use_eagle=use_eagle,
                                 enable_kv_cache_events=True, use_int_block_hashes=False)

    return SimpleNamespace(
        full=lambda bs: FullAttentionSpec(block_size=bs, num_kv_heads=1, head_size=8, dtype="float16"),
        swa=lambda bs, w: SlidingWindowSpec(block_size=bs, num_kv_heads=1, head_size=8, dtype="float16",
                                            sliding_window=w),
        manager=manager,
        request=lambda rid, tokens, hbs: kv.Request(rid, tokens, block_hasher=get_request_block_hasher(hbs, sha)),
    )


def vllm_api() -> SimpleNamespace:
    """vLLM 0.33.0's objects (``VLLM_TARGET_DEVICE=cpu``; events keep bytes hashes only with
    ``VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=0``)."""
    import torch
    from vllm.sampling_params import SamplingParams
    from vllm.utils.hashing import get_hash_fn_by_name
    from vllm.v1.core.kv_cache_manager import KVCacheManager
    from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
    from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec, SlidingWindowSpec
    from vllm.v1.request import Request

    sha = get_hash_fn_by_name("sha256")
    init_none_hash(sha)

    def manager(specs, num_blocks, hash_block_size, scheduler_block_size, use_eagle):
        cfg = KVCacheConfig(num_blocks=num_blocks, kv_cache_tensors=[],
                            kv_cache_groups=[KVCacheGroupSpec([f"l{i}"], s) for i, s in enumerate(specs)])
        return KVCacheManager(cfg, max_model_len=4096, scheduler_block_size=scheduler_block_size,
                              hash_block_size=hash_block_size, use_eagle=use_eagle,
                              enable_kv_cache_events=True)

    def request(rid, tokens, hbs):
        return Request(rid, tokens, SamplingParams(max_tokens=4096), None,
                       block_hasher=get_request_block_hasher(hbs, sha))

    return SimpleNamespace(
        full=lambda bs: FullAttentionSpec(block_size=bs, num_kv_heads=1, head_size=8, dtype=torch.float16),
        swa=lambda bs, w: SlidingWindowSpec(block_size=bs, num_kv_heads=1, head_size=8, dtype=torch.float16,
                                            sliding_window=w),
        manager=manager,
        request=request,
    )


def format_expected(observed: dict) -> str:
    """The recording as JSON, one line per recorded operation or cache key, as
    ``tests/data/dropin_behaviour_recorded.json`` holds it."""
    import json

    def rows(items, indent):
        return ",\n".join(" " * indent + json.dumps(item) for item in items)

    out = ["{"]
    for i, (name, obs) in enumerate(observed.items()):
        out.append(f"  {json.dumps(name)}: {{")
        out.append('    "trace": [')
        out.append(rows(obs["trace"], 6))
        out.append("    ],")
        out.append('    "keys": [')
        out.append(rows(obs["keys"], 6))
        out.append("    ],")
        out.append(f'    "free": {json.dumps(obs["free"])}')
        out.append("  }" + ("," if i < len(observed) - 1 else ""))
    out.append("}")
    return "\n".join(out) + "\n"

if __name__ == "__main__":
    os.environ.setdefault("VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES", "0")
    api = vllm_api()
    names = sys.argv[1:] or list(SCENARIOS)
    print(format_expected({name: run(api, SCENARIOS[name]) for name in names}))
