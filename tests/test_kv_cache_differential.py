"""Differential test: the Cython and Python twins make the same decisions.

A hypothesis state machine drives both twins with the same random operation
sequence (add requests sharing prefixes, look up, allocate, decode, preempt,
free, reset) and compares every observable after each step: results, block
ids, free-queue order, hashes, events and exceptions.  Invariants are checked
on each twin: free + held + null = all blocks, each ref count equals its
holders, every cached key points at a block carrying that key.
"""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import settings, strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from kvcy import _fast
from kvcy.hashing import get_hash_fn_by_name, get_request_block_hasher, init_none_hash
from kvcy.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec, SlidingWindowSpec
from kvcy.request import Request, RequestStatus
from kvcy.testing.golden import encode_event

if "cython" not in _fast.available():
    pytest.skip("compiled twins not built", allow_module_level=True)

CY = _fast.load("cython")["kv_cache"]
PY = _fast.load("python")["kv_cache"]
BS = 4
PREFIXES = [[7] * 8, [3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5, 8], []]


def _config(kind: str, num_blocks: int) -> KVCacheConfig:
    full = FullAttentionSpec(block_size=BS, num_kv_heads=1, head_size=8, dtype="float16")
    groups = [KVCacheGroupSpec(["f"], full)]
    if kind == "hybrid":
        swa = SlidingWindowSpec(block_size=BS, num_kv_heads=1, head_size=8, dtype="float16", sliding_window=6)
        groups.append(KVCacheGroupSpec(["s"], swa))
    return KVCacheConfig(num_blocks=num_blocks, kv_cache_tensors=[], kv_cache_groups=groups)


def _outcome(fn):
    try:
        return ("ok", fn())
    except (ValueError, TypeError, RuntimeError) as exc:
        return ("raised", type(exc).__name__, str(exc))


def _ids(result):
    if result is None:
        return None
    if isinstance(result, tuple):
        return tuple(_ids(r) for r in result)
    if hasattr(result, "get_block_ids"):
        return result.get_block_ids()
    return result


class TwinMachine(RuleBasedStateMachine):
    def __init__(self):
        super().__init__()
        init_none_hash(get_hash_fn_by_name("sha256"))
        self.hasher = get_request_block_hasher(BS, get_hash_fn_by_name("sha256"))
        self.reqs: dict[str, tuple[Request, Request]] = {}
        self.last: dict[str, tuple] = {}
        self.n = 0

    # Events, stats and EAGLE are drawn too.  The compiled twin's fast paths (lookup and
    # admission without the coordinator, eviction inlined) run only with all of them off and
    # one full-attention group with caching on, so that case is drawn most often.
    @initialize(kind=st.sampled_from(["full", "full", "hybrid"]), num_blocks=st.integers(8, 40),
                caching=st.sampled_from([True, True, False]), watermark=st.sampled_from([0.0, 0.1]),
                extras=st.sampled_from([(), (), ("events",), ("stats",), ("eagle",), ("events", "stats", "eagle")]))
    def setup(self, kind, num_blocks, caching, watermark, extras):
        cfg = _config(kind, num_blocks)
        kw = dict(max_model_len=96, scheduler_block_size=BS, hash_block_size=BS, enable_caching=caching,
                  enable_kv_cache_events="events" in extras, log_stats="stats" in extras,
                  use_eagle="eagle" in extras, watermark=watermark, max_in_flight_tokens=32)
        self.managers = (CY.KVCacheManager(cfg, **kw), PY.KVCacheManager(cfg, **kw))
        self.events = "events" in extras

    def both(self, name, fn):
        out = [_outcome(lambda m=m, r=r: fn(m, r)) for m, r in zip(self.managers, self._pairs(name))]
        out = [(o[0], _ids(o[1])) if o[0] == "ok" else o for o in out]
        assert out[0] == out[1], f"twins disagree: {out}"
        return out[0]

    def _pairs(self, name):
        return self.reqs[name] if name is not None else (None, None)

    @rule(prefix=st.sampled_from(range(len(PREFIXES))), tail=st.lists(st.integers(0, 50), max_size=20))
    def add_request(self, prefix, tail):
        name = f"r{self.n}"
        self.n += 1
        tokens = PREFIXES[prefix] + tail
        if not tokens:
            tokens = [1]
        self.reqs[name] = tuple(Request(name, tokens, max_tokens=8, block_hasher=self.hasher) for _ in range(2))
        assert self.reqs[name][0].block_hashes == self.reqs[name][1].block_hashes

    def _waiting(self):
        return [n for n, (r, _) in self.reqs.items() if r.num_computed_tokens == 0 and not self.managers[1].coordinator.holds(n)]

    def _running(self):
        return [n for n in self.reqs if self.managers[1].coordinator.holds(n)]

    @precondition(lambda self: self._waiting())
    @rule(data=st.data(), full_fit=st.booleans())
    def admit(self, data, full_fit):
        name = data.draw(st.sampled_from(self._waiting()))
        res = self.both(name, lambda m, r: m.get_computed_blocks(r))
        results = []
        for m, r in zip(self.managers, self.reqs[name]):
            blocks, hit, _ = m.get_computed_blocks(r)
            results.append(_outcome(lambda: m.allocate_slots(
                r, r.num_tokens - hit, num_new_computed_tokens=hit, new_computed_blocks=blocks,
                full_sequence_must_fit=full_fit, has_scheduled_reqs=bool(self._running()))))
        got = [(o[0], _ids(o[1])) if o[0] == "ok" else o for o in results]
        assert got[0] == got[1], got
        if got[0][0] == "ok" and got[0][1] is not None:
            for r in self.reqs[name]:
                r.num_computed_tokens = r.num_tokens
                r.status = RequestStatus.RUNNING
        assert res[0] == "ok"

    @precondition(lambda self: self._running())
    @rule(data=st.data(), token=st.integers(0, 50), lookahead=st.integers(0, 2))
    def decode(self, data, token, lookahead):
        name = data.draw(st.sampled_from(self._running()))
        for r in self.reqs[name]:
            r.append_output_token_ids([token])
        out = self.both(name, lambda m, r: m.allocate_slots(r, 1, num_lookahead_tokens=lookahead))
        if out[0] == "ok" and out[1] is not None:
            for r in self.reqs[name]:
                r.num_computed_tokens += 1

    @precondition(lambda self: self._running())
    @rule(data=st.data(), preempt=st.booleans())
    def free(self, data, preempt):
        name = data.draw(st.sampled_from(self._running()))
        self.both(name, lambda m, r: m.free(r))
        for r in self.reqs[name]:
            if preempt:
                r.num_computed_tokens = 0
                r.status = RequestStatus.PREEMPTED
                r.num_preemptions += 1
            else:
                r.status = RequestStatus.FINISHED_LENGTH_CAPPED
        if not preempt:
            del self.reqs[name]

    @rule(name=st.sampled_from(["nope", "r0"]))
    def free_bad(self, name):
        if name in self.reqs:
            return
        fake = Request(name, [1, 2, 3])
        outs = [_outcome(lambda m=m: m.free(fake)) for m in self.managers]
        assert outs[0] == outs[1] and outs[0][0] == "raised"

    @rule()
    def reset(self):
        self.both(None, lambda m, r: m.reset_prefix_cache())

    @invariant()
    def same_state(self):
        if not hasattr(self, "managers"):
            return
        cy, py = self.managers
        qc = [b.block_id for b in cy.block_pool.free_block_queue.get_all_free_blocks()]
        qp = [b.block_id for b in py.block_pool.free_block_queue.get_all_free_blocks()]
        assert qc == qp
        assert [b.block_hash for b in cy.block_pool.blocks] == [b.block_hash for b in py.block_pool.blocks]
        events = [[encode_event(e) for e in m.take_events()] for m in self.managers]
        assert events[0] == events[1]
        if not self.events:
            assert events[0] == []
        stats = [m.make_prefix_cache_stats() for m in self.managers]
        assert stats[0] == stats[1]
        assert cy.usage == py.usage
        for name in self._running():
            assert cy.get_block_ids(name) == py.get_block_ids(name)
        for m in self.managers:
            self._check_invariants(m)

    def _check_invariants(self, m):
        pool = m.block_pool
        free = pool.free_block_queue.get_all_free_blocks()
        assert len(free) == pool.get_num_free_blocks()
        holders: Counter = Counter()
        for manager in m.coordinator.single_type_managers:
            for blocks in manager.req_to_blocks.values():
                for b in blocks:
                    if not b.is_null:
                        holders[b.block_id] += 1
        free_ids = {b.block_id for b in free}
        assert len(free_ids) == len(free)
        for b in pool.blocks[1:]:
            assert b.ref_cnt == holders[b.block_id], (b.block_id, b.ref_cnt, holders[b.block_id])
            assert (b.ref_cnt == 0) == (b.block_id in free_ids)
        # free + held + null = all blocks
        assert len(free_ids) + len(holders) + 1 == pool.num_gpu_blocks
        for key in pool.cached_block_hash_to_block.keys():
            block = pool.cached_block_hash_to_block.get_one_block(key)
            assert block.block_hash == key


TwinMachine.TestCase.settings = settings(max_examples=150, stateful_step_count=40, deadline=None)
test_twins_agree = TwinMachine.TestCase
