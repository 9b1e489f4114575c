"""Mamba align mode and fine-grained partial prefix hits, both twins.

vLLM 0.33.0's ``MambaManager`` in ``mamba_cache_mode="align"`` caches the recurrent state
at block boundaries (and, with blocks coarser than the hash block, at hash-block boundaries:
the hybrid coordinator then lets every hit end inside a block, ``enable_partial_hash_hits``).
A request keeps its running state block, the speculative blocks, and while it prefills the
states a later request can resume from; the states in between become null blocks.  A hit
that ends inside a block is copied before the request writes it (copy-on-write:
``take_kv_cache_block_copies``).  With EAGLE, prefill checkpoints move one hash block down.

The recorded values in ``tests/data/mamba_align_recorded.json`` are what vLLM 0.33.0 returned
for the cases in ``CASES`` (``python tests/test_mamba_align.py --record`` under
/tmp/kvh-venv rewrites them); the live tests replay random operation sequences on vLLM's own
``KVCacheManager`` beside kvcy's and compare everything observable after every operation.
"""

from __future__ import annotations

import json
import math
import os
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from _vllm_live import live

DATA = Path(__file__).resolve().parent / "data" / "mamba_align_recorded.json"


# ------------------------------------------------------------------ the two back ends
class _Api:
    """Builds one library's hybrid full-attention + Mamba manager and its requests."""

    def __init__(self, which: str, impl=None) -> None:
        self.which = which
        if which == "vllm":
            os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
            import torch
            from vllm.sampling_params import SamplingParams
            from vllm.utils.hashing import get_hash_fn_by_name
            from vllm.v1.core.kv_cache_manager import KVCacheManager
            from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
            from vllm.v1.kv_cache_interface import (FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec, MambaSpec,
                                                    SlidingWindowSpec)
            from vllm.v1.request import Request

            self._sha = get_hash_fn_by_name("sha256")
            init_none_hash(self._sha)
            self._full = lambda bs: FullAttentionSpec(block_size=bs, num_kv_heads=1, head_size=8,
                                                      dtype=torch.float16)
            self._mamba = lambda bs, **kw: MambaSpec(block_size=bs, shapes=((4,),), dtypes=(torch.float32,),
                                                     mamba_cache_mode="align", **kw)
            self._swa = lambda bs, w: SlidingWindowSpec(block_size=bs, num_kv_heads=1, head_size=8,
                                                        dtype=torch.float16, sliding_window=w)
            self._Cfg, self._Group, self._Manager = KVCacheConfig, KVCacheGroupSpec, KVCacheManager
            self._hasher = get_request_block_hasher
            self._request = lambda rid, toks, hasher: Request(rid, toks, SamplingParams(max_tokens=4096), None,
                                                              block_hasher=hasher)
        else:
            from kvcy.hashing import get_hash_fn_by_name, get_request_block_hasher, init_none_hash
            from kvcy.kv_cache_interface import (FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec, MambaSpec,
                                                 SlidingWindowSpec)

            kv = impl.kv_cache
            self._sha = get_hash_fn_by_name("sha256")
            init_none_hash(self._sha)
            self._full = lambda bs: FullAttentionSpec(block_size=bs, num_kv_heads=1, head_size=8, dtype="float16")
            self._mamba = lambda bs, **kw: MambaSpec(block_size=bs, shapes=((4,),), dtypes=("float32",),
                                                     mamba_cache_mode="align", **kw)
            self._swa = lambda bs, w: SlidingWindowSpec(block_size=bs, num_kv_heads=1, head_size=8, dtype="float16",
                                                        sliding_window=w)
            self._Cfg, self._Group, self._Manager = KVCacheConfig, KVCacheGroupSpec, kv.KVCacheManager
            self._hasher = get_request_block_hasher
            self._request = lambda rid, toks, hasher: kv.Request(rid, toks, block_hasher=hasher)

    def manager(self, case: dict):
        self.hbs = case["hbs"]
        specs = [self._full(case["full_bs"]),
                 self._mamba(case["mamba_bs"], num_speculative_blocks=case["spec_blocks"],
                             num_prefill_checkpoint_blocks=case["checkpoint_blocks"],
                             prefill_checkpoint_alignment=case["checkpoint_alignment"])]
        if case.get("window"):  # (a sliding-window group with blocks of the hash block's size)
            specs.append(self._swa(case["hbs"], case["window"]))
        extra = {} if case["retention"] is None else {"prefix_cache_retention_interval": case["retention"]}
        cfg = self._Cfg(num_blocks=case["num_blocks"], kv_cache_tensors=[],
                        kv_cache_groups=[self._Group([f"l{i}"], s) for i, s in enumerate(specs)], **extra)
        mgr = self._Manager(
            cfg, max_model_len=4096, scheduler_block_size=math.lcm(case["full_bs"], case["mamba_bs"]),
            hash_block_size=case["hbs"], use_eagle=case["eagle"], enable_kv_cache_events=True,
            enable_mamba_shared_prefix_checkpoint=case["shared_checkpoint"])
        if hasattr(mgr, "refuse_unservable"):  # (kvcy's: None where vLLM's gives None, as the recording)
            mgr.refuse_unservable = False
        return mgr

    def request(self, rid, tokens):
        return self._request(rid, tokens, self._hasher(self.hbs, self._sha))


def _h(h):
    return h if h is None or isinstance(h, int) else bytes(h).hex()


def _ev(e) -> list:
    name = type(e).__name__
    if name == "BlockStored":
        return ["stored", [_h(h) for h in e.block_hashes], _h(e.parent_block_hash), len(e.token_ids),
                e.block_size, e.group_idx]
    if name == "BlockRemoved":
        return ["removed", [_h(h) for h in e.block_hashes], e.group_idx]
    return [name]


def _state(mgr, reqs) -> list:
    """Free-queue order, reference counts, every block's key and token count, the partial
    entries, and each request's block table per group."""
    pool = mgr.block_pool
    return [
        [b.block_id for b in pool.free_block_queue.get_all_free_blocks()],
        [b.ref_cnt for b in pool.blocks],
        [[b.block_id, bytes(b.block_hash).hex(), b.block_hash_num_tokens] for b in pool.blocks
         if b.block_hash is not None],
        sorted([bid, sorted(bytes(k).hex() for k in ks)] for bid, ks in pool.cached_block_hashes_by_block.items()),
        {rid: [list(g) for g in mgr.get_block_ids(rid)] for rid in sorted(reqs)},
    ]


def _ids(blocks):
    return None if blocks is None else [list(g) for g in blocks.get_block_ids()]


def _replay(api: _Api, case: dict) -> list:
    """Run a case's operations as vLLM's scheduler calls them; what each returned, its
    events and the state after it."""
    mgr = api.manager(case)
    look = case["lookahead"]
    reqs: dict = {}
    out = []
    for op in case["ops"]:
        kind, rid = op[0], op[1]
        rec = None
        if kind == "new":
            reqs[rid] = api.request(rid, list(op[2]))
        elif kind == "admit":
            req = reqs[rid]
            blocks, n_hit, boundary = mgr.get_computed_blocks(req)
            req.shared_prefix_boundary = boundary
            n_new = min(op[2], req.num_tokens - n_hit)
            if op[2] == -1:  # up to the prompt's last reusable hash boundary, where the scheduler stops
                p = req.num_prompt_tokens
                tail = p // api.hbs * api.hbs - api.hbs if case["eagle"] else (p - 1) // api.hbs * api.hbs
                n_new = tail - n_hit if tail > n_hit else req.num_tokens - n_hit
            got = mgr.allocate_slots(req, n_new, n_hit, blocks, num_lookahead_tokens=look)
            rec = [n_hit, boundary, _ids(blocks), _ids(got)]
            if got is not None:
                req.num_computed_tokens = n_hit + n_new
        elif kind == "step":
            req = reqs[rid]
            if req.num_computed_tokens >= req.num_tokens:
                req.append_output_token_ids(list(op[3]))
            n_new = min(op[2], req.num_tokens - req.num_computed_tokens)
            got = mgr.allocate_slots(req, n_new, num_lookahead_tokens=look)
            rec = _ids(got)
            if got is None:  # preempted, as the scheduler does
                mgr.free(req)
                req.num_computed_tokens = 0
            else:
                req.num_computed_tokens += n_new
        elif kind == "tick":  # a scheduler step ends and the next begins
            copies, retained = mgr.take_kv_cache_block_copies()
            rec = [[[c.src_block_id, c.dst_block_id] for c in copies], [b.block_id for b in retained],
                   sorted([k, sorted(v)] for k, v in mgr.take_boundary_state_offloads().items())]
            mgr.block_pool.free_blocks(retained)
            mgr.new_step_starts()
        elif kind == "finish":
            rec = mgr.finalize_partial_tail_offloads(reqs[rid])
            mgr.free(reqs[rid])
            reqs[rid].num_computed_tokens = 0
        elif kind == "evict":
            mgr.block_pool.evict_blocks(set(op[2]))
        elif kind == "reset":
            rec = mgr.reset_prefix_cache()
        else:
            raise ValueError(kind)
        out.append([kind, rid, rec, [_ev(e) for e in mgr.take_events()], _state(mgr, reqs)])
    return out


def _labelled(trace: list) -> list:
    """A replay with every hash replaced by its order of first appearance (h0, h1, ...)."""
    labels: dict = {}

    def lab(h):
        return None if h is None else labels.setdefault(h, f"h{len(labels)}")

    out = []
    for kind, rid, rec, events, (free, refs, keyed, extra, tables) in trace:
        evs = [[e[0], [lab(h) for h in e[1]], *([lab(e[2]), *e[3:]] if e[0] == "stored" else e[2:])]
               if e[0] in ("stored", "removed") else e for e in events]
        keyed = [[bid, lab(key[:-8]), int(key[-8:], 16), n] for bid, key, n in keyed]
        extra = [[bid, sorted([lab(k[:-8]), int(k[-8:], 16)] for k in ks)] for bid, ks in extra]
        out.append([kind, rid, rec, evs, free, refs, keyed, extra, tables])
    return out


# ------------------------------------------------------------------ recorded cases
_P = list(range(100, 140))  # a 40-token prompt


def _case(ops, full_bs=16, mamba_bs=16, hbs=4, eagle=False, lookahead=0, spec_blocks=0, checkpoint_blocks=0,
          checkpoint_alignment=None, shared_checkpoint=False, retention=None, num_blocks=32, window=0):
    return dict(full_bs=full_bs, mamba_bs=mamba_bs, hbs=hbs, eagle=eagle, lookahead=lookahead, window=window,
                spec_blocks=spec_blocks, checkpoint_blocks=checkpoint_blocks,
                checkpoint_alignment=checkpoint_alignment, shared_checkpoint=shared_checkpoint,
                retention=retention, num_blocks=num_blocks, ops=ops)


CASES = {
    # The scheduler ends a chunk at the prompt's last reusable hash boundary (36 of 40 tokens),
    # inside Mamba block 2: its state becomes a partial entry; the producer copies it before
    # computing over it (a CoW in a running request: the entry moves to the copy, which is handed
    # to a connector).  A resend hits 36 tokens and copies the shared tail block at admission.
    "partial_hit_cow": _case([
        ("new", "a", _P), ("admit", "a", 36), ("tick", None), ("step", "a", 4, [0]), ("tick", None),
        ("step", "a", 1, [900]), ("tick", None), ("new", "b", _P), ("admit", "b", 200), ("tick", None),
        ("step", "b", 1, [902]), ("tick", None), ("finish", "b"), ("finish", "a"), ("reset", None)]),
    # Chunked prefill with prefill checkpoints: a chunk reserves the block the backend writes its
    # checkpoint into; states in between are nulled and freed two steps later.
    "chunked_checkpoints": _case([
        ("new", "a", _P + list(range(300, 330))), ("admit", "a", 24), ("tick", None), ("step", "a", 24, [0]),
        ("tick", None), ("step", "a", 22, [0]), ("tick", None), ("step", "a", 1, [900]), ("tick", None),
        ("new", "b", _P + list(range(300, 310))), ("admit", "b", 200), ("tick", None), ("finish", "a"),
        ("finish", "b")], checkpoint_blocks=1, checkpoint_alignment=4),
    # EAGLE with speculative blocks: hits drop one hash block, checkpoints move one hash block
    # down (36 of 40), speculative blocks move along the table as the request decodes.
    "eagle_spec_blocks": _case([
        ("new", "a", _P), ("admit", "a", 36), ("tick", None), ("step", "a", 4, [0]), ("tick", None),
        ("step", "a", 3, [901]), ("tick", None), ("step", "a", 3, [902]), ("tick", None),
        ("new", "b", _P + [7, 8, 9]), ("admit", "b", 200), ("tick", None), ("step", "b", 3, [5]),
        ("tick", None), ("finish", "a"), ("finish", "b")],
        eagle=True, lookahead=2, spec_blocks=2, shared_checkpoint=True),
    # A hit on a state cached this same step waits (more blocks than the pool has); a small pool
    # preempts a decoding request, whose states return to the free queue.
    "same_step_and_preemption": _case([
        ("new", "a", _P), ("new", "b", _P), ("admit", "a", 36), ("admit", "b", 200), ("tick", None),
        ("admit", "b", 200), ("new", "c", list(range(500, 560))), ("admit", "c", 200), ("tick", None),
        ("step", "a", 16, [900]), ("step", "b", 16, [901]), ("tick", None), ("step", "c", 16, [1]),
        ("tick", None), ("finish", "a"), ("finish", "b"), ("finish", "c")], num_blocks=12),
    # Whole-block hits only (hash block = Mamba block): no partial entries, no copies; sparse
    # retention keeps only the replay boundary's state (block 3 of the 80-token prompt).
    "whole_blocks_sparse": _case([
        ("new", "a", _P + list(range(300, 340))), ("admit", "a", 32), ("tick", None), ("step", "a", 32, [0]),
        ("tick", None), ("step", "a", 16, [0]), ("tick", None), ("new", "b", _P + list(range(300, 340))),
        ("admit", "b", 200), ("tick", None), ("finish", "a"), ("finish", "b"), ("evict", None, [1, 2, 3, 4, 5])],
        hbs=16, retention=0),
    # Finer full-attention blocks than Mamba's (full 8, Mamba 16, hash 4): the partial hit ends
    # at 28 of 30 tokens, inside a full-attention block too.
    "finer_full_blocks": _case([
        ("new", "a", _P[:30]), ("admit", "a", 28), ("tick", None), ("step", "a", 2, [0]), ("tick", None),
        ("step", "a", 1, [900]), ("tick", None), ("new", "b", _P[:30] + [1, 2]), ("admit", "b", 200),
        ("tick", None), ("step", "b", 1, [3]), ("tick", None), ("finish", "b"), ("finish", "a")], full_bs=8),
}


def _recorded() -> dict:
    return json.loads(DATA.read_text())


@pytest.mark.parametrize("name", list(CASES))
def test_recorded_cases(impl, name):
    """Partial hits, copies, checkpoints, EAGLE, same-step deferral, preemption, sparse
    retention: kvcy's manager returns, queues and holds what vLLM 0.33.0's did."""
    got = json.loads(json.dumps(_labelled(_replay(_Api("kvcy", impl), CASES[name]))))  # (as the file holds it)
    assert got == _recorded()[name]


def test_recorded_cases_exercise_the_features():
    """The recorded traces hold what each case is for (so a trace of nothing cannot pass)."""
    rec = _recorded()
    assert sorted(rec) == sorted(CASES)

    def ops(name, kind, rid=None):
        return [r[2] for r in rec[name] if r[0] == kind and (rid is None or r[1] == rid)]

    for name in ("partial_hit_cow", "eagle_spec_blocks", "finer_full_blocks"):
        assert any(t[0] for t in ops(name, "tick")) and any(t[2] for t in ops(name, "tick"))  # copies, hand-offs
        assert ops(name, "admit", "b")[0][0] % 16 != 0  # a hit ending inside a Mamba block
    assert len(ops("eagle_spec_blocks", "admit", "a")[0][3][1]) == 3 + 2  # two speculative blocks
    same = ops("same_step_and_preemption", "admit", "b")
    assert same[0][0] == 36 and same[0][3] is None and same[1][3] is not None  # waited a step
    assert None in ops("same_step_and_preemption", "step")  # preempted
    assert any(t[2] for t in ops("chunked_checkpoints", "tick"))  # checkpoints handed off
    assert ops("whole_blocks_sparse", "admit", "b")[0][0] == 64


def test_partial_hits_need_align_mode_and_finer_hashes(impl):
    """``enable_partial_hash_hits``: an align-mode Mamba group with blocks coarser than the
    hash block; not with equal sizes, nor with a sliding-window group coarser than the hash."""
    from kvcy.kv_cache_interface import (FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec, MambaSpec,
                                         SlidingWindowSpec)

    def mgr(hbs, other=None):
        full = FullAttentionSpec(block_size=16, num_kv_heads=1, head_size=8, dtype="float16")
        mamba = MambaSpec(block_size=16, shapes=((4,),), dtypes=("float32",), mamba_cache_mode="align")
        groups = [KVCacheGroupSpec(["a"], other or full), KVCacheGroupSpec(["m"], mamba)]
        return impl.kv_cache.KVCacheManager(KVCacheConfig(num_blocks=16, kv_cache_tensors=[], kv_cache_groups=groups),
                                            256, 16, hbs)

    assert mgr(4).coordinator.enable_partial_hash_hits
    assert [m.cache_hit_alignment_tokens for m in mgr(4).coordinator.single_type_managers] == [4, 4]
    assert not mgr(16).coordinator.enable_partial_hash_hits
    swa = SlidingWindowSpec(block_size=16, num_kv_heads=1, head_size=8, dtype="float16", sliding_window=32)
    assert not mgr(4, swa).coordinator.enable_partial_hash_hits
    assert [m.cache_hit_alignment_tokens for m in mgr(4, swa).coordinator.single_type_managers] == [16, 16]


@pytest.mark.parametrize("value, error", [(0, ValueError), (-4, ValueError), ("4", TypeError), (None, TypeError)])
def test_alignment_is_checked(impl, value, error):
    """``cache_hit_alignment_tokens`` takes a positive int only (it divides token counts)."""
    pool = impl.kv_cache.BlockPool(8, True, 4)
    from kvcy.kv_cache_interface import MambaSpec

    m = impl.kv_cache.MambaManager(MambaSpec(block_size=16, shapes=((4,),), dtypes=("float32",),
                                             mamba_cache_mode="align"), pool, True, 0, 16)
    with pytest.raises(error):
        m.cache_hit_alignment_tokens = value
    assert m.cache_hit_alignment_tokens == 16


@pytest.mark.parametrize("bad", ["foreign", "not a block"])
def test_bad_hits_change_nothing(impl, bad):
    """Hits that are not this pool's blocks are refused by allocate_slots before anything
    changes: no block taken, no checkpoint reserved, no copy queued."""
    api = _Api("kvcy", impl)
    mgr = api.manager(CASES["partial_hit_cow"])
    a = api.request("a", _P)
    assert mgr.allocate_slots(a, 36) is not None
    mgr.new_step_starts()
    b = api.request("b", _P)
    hits, n_hit, _ = mgr.get_computed_blocks(b)
    assert n_hit == 36
    junk = impl.kv_cache.KVCacheBlock(5) if bad == "foreign" else "block"
    blocks = impl.kv_cache.KVCacheBlocks((list(hits.blocks[0]), list(hits.blocks[1][:-1]) + [junk]))
    before = _state(mgr, {"a": a, "b": b})
    with pytest.raises((RuntimeError, TypeError)):
        mgr.allocate_slots(b, 4, n_hit, blocks)
    assert _state(mgr, {"a": a, "b": b}) == before
    assert mgr.take_kv_cache_block_copies() == ([], [])
    # and the real hits still go through afterwards (a partial hit: its tail block is copied)
    assert mgr.allocate_slots(b, 4, n_hit, hits) is not None
    copies, retained = mgr.take_kv_cache_block_copies()
    assert len(copies) == 2 and len(retained) == 4


@pytest.mark.parametrize("bad", [None, "a"])
def test_cache_blocks_of_a_non_request_is_the_same_type_error(impl, bad):
    """Every group's cache_blocks (full attention's and Mamba align's) refuses what is not a
    request with the compiled twin's TypeError, in both twins, and caches nothing."""
    api = _Api("kvcy", impl)
    mgr = api.manager(CASES["partial_hit_cow"])
    a = api.request("a", _P)
    assert mgr.allocate_slots(a, 36) is not None
    before = _state(mgr, {"a": a})
    for manager in mgr.coordinator.single_type_managers:
        with pytest.raises(TypeError, match=f"^expected a Request, got {type(bad).__name__}$"):
            manager.cache_blocks(bad, 36)
    assert _state(mgr, {"a": a}) == before


def test_mamba_block_count_of_none_hits_is_the_same_type_error(impl):
    """Mamba's get_num_blocks_to_allocate with None for the hits: the same TypeError in
    both twins, before any checkpoint is recorded."""
    api = _Api("kvcy", impl)
    mgr = api.manager(CASES["chunked_checkpoints"])
    a = api.request("a", _P)
    assert mgr.allocate_slots(a, 24) is not None
    before = _state(mgr, {"a": a})
    mamba = mgr.coordinator.single_type_managers[1]
    assert type(mamba).__name__ == "MambaManager"
    with pytest.raises(TypeError, match="^object of type 'NoneType' has no len\\(\\)$"):
        mamba.get_num_blocks_to_allocate("a", 100, None, 24, 24, 100)
    assert _state(mgr, {"a": a}) == before


def test_inconsistent_partial_hit_refused_before_a_block_is_taken(impl):
    """A partial hit recorded past the request's blocks (a direct call with a token count
    its hits do not cover) fails vLLM's copy-on-write assertion -- raised even under
    ``python -O`` -- before the copy's block is taken (vLLM takes it first)."""
    from kvcy.kv_cache_interface import FullAttentionSpec

    kv = impl.kv_cache
    pool = kv.BlockPool(8, True, 4)
    spec = FullAttentionSpec(block_size=16, num_kv_heads=1, head_size=8, dtype="float16")
    mgr = kv.FullAttentionManager(spec, pool, True, 0, 16)
    hit = pool.get_new_blocks(1)[0]
    mgr.add_local_computed_blocks("r", [hit], 100, 0)  # (one block; 100 tokens end in block 6)
    free = pool.get_num_free_blocks()
    with pytest.raises(AssertionError, match="not the partial hit's block"):
        mgr.allocate_new_blocks("r", 112, 112)
    assert pool.get_num_free_blocks() == free and mgr.req_to_blocks["r"] == [hit]
    assert mgr.take_pending_cow_copies() == []


# ------------------------------------------------------------------ random cases
_PREFIXES = [list(range(1000 * k, 1000 * k + 80)) for k in range(2)]


@st.composite
def _cases(draw):
    full_bs, mamba_bs, hbs = draw(st.sampled_from([(16, 16, 4), (16, 16, 8), (8, 16, 4), (16, 16, 16), (8, 8, 4),
                                                   (4, 16, 4), (8, 8, 8)]))
    eagle = draw(st.booleans())
    checkpoints = draw(st.booleans())
    sbs = math.lcm(full_bs, mamba_bs)
    case = _case([], full_bs=full_bs, mamba_bs=mamba_bs, hbs=hbs, eagle=eagle,
                 lookahead=draw(st.sampled_from([1, 2])) if eagle else 0,
                 spec_blocks=draw(st.sampled_from([0, 1, 2])) if eagle else 0,
                 checkpoint_blocks=int(checkpoints),
                 checkpoint_alignment=draw(st.sampled_from([None, hbs, 2 * hbs])) if checkpoints else None,
                 shared_checkpoint=draw(st.booleans()),
                 retention=draw(st.sampled_from([None, None, None, 0, 2 * sbs])),
                 num_blocks=draw(st.sampled_from([16, 24, 48])),
                 window=draw(st.sampled_from([0, 0, 0, 6, 13])))
    n_req = draw(st.integers(2, 5))
    ops = case["ops"]
    states = {}
    prompts = []
    for r in range(n_req):
        if prompts and draw(st.booleans()):  # the same prompt again (a resend)
            prompt = draw(st.sampled_from(prompts))
        else:
            prefix = draw(st.sampled_from(_PREFIXES))
            shared = draw(st.sampled_from([0, 8, 16, 20, 32, 36, 44, 64]))
            tail = draw(st.integers(1, 19))
            prompt = prefix[:shared] + list(range(50000 + 100 * r, 50000 + 100 * r + tail))
        prompts.append(prompt)
        ops.append(("new", f"r{r}", prompt))
        states[f"r{r}"] = "new"
    for _ in range(draw(st.integers(4, 30))):
        rid = f"r{draw(st.integers(0, n_req - 1))}"
        kind = draw(st.sampled_from(["admit", "admit", "step", "step", "step", "tick", "tick", "tick", "free",
                                     "evict", "reset"]))
        if kind == "admit" or (kind == "step" and states[rid] != "running"):
            if states[rid] == "running":
                continue
            ops.append(("admit", rid, draw(st.sampled_from([4, 8, 12, 16, 24, 200, -1, -1]))))
            states[rid] = "running"  # (or left waiting: the replay tells, a later admit retries)
        elif kind == "step":
            ops.append(("step", rid, draw(st.sampled_from([1, 3, 8, 16])), [draw(st.integers(60000, 60003))]))
        elif kind == "tick":
            ops.append(("tick", None))
        elif kind == "free":
            ops.append(("finish", rid))
            states[rid] = "done"
        elif kind == "evict":
            ops.append(("evict", None, draw(st.lists(st.integers(1, case["num_blocks"] - 1), max_size=3))))
        else:
            ops.append(("reset", None))
    ops.append(("tick", None))
    return case


def _guarded(api, case):
    """The replay, or the exception it ended with (same type on both sides)."""
    try:
        return _replay(api, case)
    except Exception as exc:  # (a refused operation: both must refuse it alike)
        return ["raised", type(exc).__name__, str(exc)[:60]]


@pytest.fixture(scope="module")
def vllm_api():
    return _Api("vllm")


@live
@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture],
          derandomize=True)
@given(case=_cases())
def test_random_sequences_as_vllm(impl, vllm_api, case):
    """Random chunked admissions with prefix hits (partial ones too), decode steps with
    preemption, step ends (copies, hand-offs), finishes, evictions and resets on full
    attention + Mamba align (+ sometimes a sliding window at the hash block size), with and
    without EAGLE, prefill checkpoints, sparse retention and hash blocks finer than the
    blocks: kvcy returns, queues and holds what vLLM does after every operation."""
    expected = _guarded(vllm_api, case)
    assert _guarded(_Api("kvcy", impl), case) == expected


def _record() -> None:  # pragma: no cover - run by hand under /tmp/kvh-venv
    api = _Api("vllm")
    DATA.parent.mkdir(exist_ok=True)
    DATA.write_text(json.dumps({name: _labelled(_replay(api, case)) for name, case in CASES.items()},
                               separators=(",", ":")) + "\n")


if __name__ == "__main__" and "--record" in sys.argv:  # pragma: no cover
    _record()
