"""A hypothesis state machine drives vLLM 0.33.0's ``KVCacheManager`` and kvcy's side by side.

Each rule is an operation vLLM's scheduler makes (tests/_vllm_diff.py ``Op``): admit a new
request whose prompt shares a random prefix with earlier prompts (chunked, with lookahead
slots, connector tokens and lookups, a capped hit, a cache salt), schedule a running
request's next prefill chunk or a decode step with draft tokens (some rejected) and tokens in
flight, preempt and re-admit, finish or abort (the blocks' return maybe deferred), drop skipped
blocks, finish (or fail) an async load, reset the prefix cache, evict blocks, start a step.
After every operation the two managers' results and everything observable (block ids per
group of every request, the free-queue order, keys, extra keys and the cache map, events, new
block ids to zero, usage, prefix-cache stats) must be equal.  This generalises ../shared/golden (the
offline floor, replayed without vLLM by tests/test_golden.py): it looks for what those
vectors do not cover.

It runs where vLLM 0.33.0 imports (``.ci/run``'s vLLM step, once per twin: the active twin,
``kvcy.IMPLEMENTATION``) and skips elsewhere; ``KVCY_REQUIRE_VLLM=1`` makes a missing vLLM an
error.  Examples are derandomized with no database and not shrunk, so CI replays the same
sequences and reports a failing one as found.  To explore locally: ``KVCY_SM_EXAMPLES=60
KVCY_SM_STEPS=50 KVCY_SM_RANDOM=1`` (fresh seeds, failures shrunk to a minimal sequence;
``KVCY_SM_SHRINK=1`` shrinks the derandomized ones).

Adding a config: one ``Config`` in ``CONFIGS`` (tests/_vllm_diff.py documents the fields).
A feature kvcy may not have yet gets ``pending="<feature>"``: while kvcy's manager raises
``NotImplementedError`` for it the test skips with that name, and runs as soon as kvcy builds
it.  A config on which kvcy and vLLM are known to differ gets ``xfail="<the minimal failing
sequence>"`` (a strict xfail).
Not here: ``SinkFullAttentionSpec`` (vLLM 0.33.0's coordinator cannot build its manager,
tests/test_single_type_kv_cache_manager.py ``test_live_sink``), Mamba prefix caching outside align mode
(vLLM asserts) and the HiSparse specs (out of scope).
"""

from __future__ import annotations

import os

import pytest

import vllm  # noqa: E402

from hypothesis import HealthCheck, Phase, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from hypothesis.stateful import (  # noqa: E402
    RuleBasedStateMachine,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

import kvcy  # noqa: E402
from kvcy import _fast  # noqa: E402

from _vllm_diff import Config, Op, Pair, Side, first_difference  # noqa: E402

FULL = "FullAttentionSpec"
SWA = "SlidingWindowSpec"


def full(bs=8, **kw):
    return (FULL, dict(block_size=bs, **kw))


def swa(bs=4, window=12, **kw):
    return (SWA, dict(block_size=bs, sliding_window=window, **kw))


def chunked(bs=4, chunk=16):
    return ("ChunkedLocalAttentionSpec", dict(block_size=bs, attention_chunk_size=chunk))


def mamba(bs=8, **kw):
    return ("MambaSpec", dict(block_size=bs, shapes=((4,),), dtypes=("float32",), **kw))


# ------------------------------------------------------------------ the table of configs
CONFIGS = [
    # one group
    Config("full", (full(),), num_blocks=24),
    Config("full-nocache", (full(),), enable_caching=False, num_blocks=20),
    Config("full-eagle", (full(),), use_eagle=True, spec_tokens=2, lookahead=2),
    Config("full-spec-decode", (full(4),), spec_tokens=3, lookahead=3, num_blocks=40),
    Config("full-hash-lookahead", (full(4),), num_hash_lookahead_tokens=2, spec_tokens=2, num_blocks=40),
    Config("full-mtp", (full(),), use_eagle=True, num_prefill_lookahead=3, spec_tokens=3, lookahead=3),
    Config("full-watermark", (full(4),), watermark=0.15, num_blocks=40),
    Config("full-max-model-len", (full(4),), max_model_len=40, spec_tokens=2, lookahead=4, num_blocks=40),
    Config("full-connector", (full(),), external=True, num_blocks=32),
    Config("full-must-fit", (full(4),), full_sequence_must_fit=True, num_blocks=40),
    Config("mla", (("MLAAttentionSpec", dict(block_size=8)),), num_blocks=24),
    Config("swa", (swa(4, 10),), num_blocks=32),
    Config("swa-extra-retained", (swa(4, 10, extra_retained_tokens=3),), num_blocks=32),
    Config("swa-async", (swa(4, 10),), in_flight=5, num_blocks=32),
    Config("swa-eagle-spec", (swa(4, 10),), use_eagle=True, spec_tokens=2, lookahead=2, num_blocks=32),
    Config("swa-mla", (("SlidingWindowMLASpec", dict(block_size=4, sliding_window=9)),), num_blocks=32),
    Config("chunked-local", (chunked(4, 16),), num_blocks=32),
    # hybrids
    Config("full8+swa4", (full(8), swa(4, 12)), num_blocks=48),
    Config("full8+swa4-eagle", (full(8), swa(4, 12)), use_eagle=True, spec_tokens=2, lookahead=2, num_blocks=48),
    Config("full8+swa4-async-spec", (full(8), swa(4, 12)), in_flight=3, spec_tokens=2, lookahead=2, num_blocks=48),
    Config("full8+swa4-admission-cap", (full(8), swa(4, 12)), max_in_flight_tokens=48, full_sequence_must_fit=True,
           watermark=0.1, num_blocks=48),
    Config("full8+swa4-nocache-eagle", (full(8), swa(4, 12)), enable_caching=False, use_eagle=True, num_blocks=40),
    Config("full16+swa8-hash4", (full(16), swa(8, 20)), hash_block_size=4, num_blocks=40),
    Config("full8+swa4-retention16", (full(8), swa(4, 10)), retention=16, num_blocks=48),
    Config("full8+swa4-retention0-eagle", (full(8), swa(4, 10, extra_retained_tokens=2)), retention=0,
           use_eagle=True, num_blocks=48),
    Config("full8+full4-coarse-eagle", (full(8), full(4)), use_eagle=True, num_blocks=40),
    Config("full8+swa4-eagle-group1", (full(8), swa(4, 12)), use_eagle=True, eagle_groups=(1,), spec_tokens=1,
           num_blocks=48),
    Config("full-eagle-flag-no-eagle", (full(8), full(8, dtype="bfloat16")), eagle_groups=(0,), num_blocks=40),
    # (chunked local beside another block size: vLLM asserts at every lookup; tests/test_single_type_kv_cache_manager.py)
    Config("full4+chunked4", (full(4), chunked(4, 16)), num_blocks=48),
    Config("full+mla", (full(8), ("MLAAttentionSpec", dict(block_size=8))), num_blocks=40),
    Config("mixed-precision-zeroing", (full(8), full(8, dtype="bfloat16")), external=True, num_blocks=40),
    Config("full+swa+chunked", (full(8), swa(4, 12), chunked(8, 32)), num_blocks=64),
    Config("cross-attention", (full(8), ("CrossAttentionSpec", dict(block_size=8))), enable_caching=False,
           encoder_tokens=20, num_blocks=40),
    Config("full+mamba-nocache", (full(8), mamba(8)), enable_caching=False, num_blocks=40),
    Config("full+swa+mamba-nocache", (full(8), swa(4, 12), mamba(8)), enable_caching=False, spec_tokens=2,
           num_blocks=48),
    # R-SWA, Mamba align mode and bounded replay (the harness models the scheduler's side of them: R-SWA's
    # num_prompt_tokens, Mamba align mode's block-aligned chunks, bounded replay's recomputed window)
    Config("full+rswa", (full(8), ("RSWASpec", dict(block_size=8, rswa_window=16))), num_blocks=48),
    Config("full+circular-buffer", (full(8), ("CircularBufferSpec", dict(block_size=8))), num_blocks=48),
    Config("full+swa-bounded-replay", (full(8), ("SlidingWindowMLASpec", dict(block_size=4, sliding_window=12,
                                                                             bounded_replay=True))),
           external=True, num_blocks=48),
    Config("full+mamba-align", (full(8), mamba(8, mamba_cache_mode="align")), hash_block_size=4,
           aligned_chunks=True, num_blocks=48),
    Config("full+mamba-align-connector", (full(8), mamba(8, mamba_cache_mode="align")), hash_block_size=4,
           aligned_chunks=True, external=True, num_blocks=32),
    Config("full+mamba-align-eagle", (full(8), mamba(8, mamba_cache_mode="align")), hash_block_size=4,
           aligned_chunks=True, use_eagle=True, num_blocks=48),
    Config("full+swa+mamba-align", (full(8), swa(8, 24), mamba(8, mamba_cache_mode="align")), hash_block_size=4,
           aligned_chunks=True, num_blocks=64),
    # Mamba align mode's options: 16-token blocks hashed every 4 (three partial positions per
    # block) with EAGLE and the shared-prefix checkpoint, speculative blocks, prefill checkpoints
    Config("full16+mamba16-hash4-eagle-shared", (full(16), mamba(16, mamba_cache_mode="align")), hash_block_size=4,
           aligned_chunks=True, use_eagle=True, shared_prefix_checkpoint=True, num_blocks=48),
    Config("full+mamba-align-spec-blocks", (full(8), mamba(8, mamba_cache_mode="align", num_speculative_blocks=2)),
           hash_block_size=4, aligned_chunks=True, spec_tokens=2, lookahead=2, num_blocks=64),
    Config("full16+mamba-align-checkpoints", (full(16), mamba(16, mamba_cache_mode="align", num_prefill_checkpoint_blocks=2,
                                                              prefill_checkpoint_alignment=4)),
           hash_block_size=4, aligned_chunks=True, num_blocks=64),
    # decode / prefill context parallelism: sharded blocks span block_size * dcp tokens (hashed
    # and scheduled at that span); Mamba and a draft's replicated group keep their own blocks
    Config("full-dcp2", (full(4),), dcp_world_size=2, hash_block_size=8, scheduler_block_size=8, num_blocks=24),
    Config("full-dcp4-eagle", (full(2),), dcp_world_size=4, hash_block_size=8, scheduler_block_size=8,
           use_eagle=True, spec_tokens=2, lookahead=2, num_blocks=32),
    Config("full+mamba-align-dcp2", (full(4), mamba(8, mamba_cache_mode="align")), dcp_world_size=2,
           hash_block_size=4, scheduler_block_size=8, aligned_chunks=True, num_blocks=48),
    Config("full+replicated-draft-dcp2", (full(4), ("MLAAttentionSpec", dict(block_size=4, dcp_sharded=False))),
           dcp_world_size=2, hash_block_size=4, scheduler_block_size=8, num_blocks=48),
    Config("full-pcp2", (full(8),), pcp_world_size=2, num_blocks=24),
    Config("full+rswa+ring+swa", (full(8), ("RSWASpec", dict(block_size=8, rswa_window=16)),
                                  ("CircularBufferSpec", dict(block_size=8)), swa(8, 24)), num_blocks=64),
]

EXAMPLES = int(os.environ.get("KVCY_SM_EXAMPLES", "6"))
STEPS = int(os.environ.get("KVCY_SM_STEPS", "30"))
EXPLORE = os.environ.get("KVCY_SM_RANDOM") == "1"
# Shrinking a long sequence of these steps can take minutes: CI reports the failing sequence
# as found; exploring (KVCY_SM_RANDOM=1, or KVCY_SM_SHRINK=1) shrinks it to a minimal one.
PHASES = [Phase.explicit, Phase.reuse, Phase.generate, Phase.target]
if EXPLORE or os.environ.get("KVCY_SM_SHRINK") == "1":
    PHASES.append(Phase.shrink)
SETTINGS = settings(max_examples=EXAMPLES, stateful_step_count=STEPS, deadline=None, derandomize=not EXPLORE,
                    database=None, phases=PHASES, print_blob=True,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])

MAX_REQUESTS = 8


class ManagerMachine(RuleBasedStateMachine):
    """The scheduler's legal operations on both managers; a subclass names the config and
    the twin (``cfg``, ``kv``)."""

    cfg: Config
    kv: object

    def __init__(self) -> None:
        super().__init__()
        self.pair = Pair(self.cfg, self.kv)
        self.seen: dict[str, tuple] = {}  # every request's tokens, as last seen
        self.next_rid = 0
        self.next_token = 100_000

    # -- bookkeeping (read from vLLM's side; the snapshots keep both equal)
    def _with(self, *statuses: str) -> list[str]:
        return sorted(rid for rid, r in self.pair.vllm.reqs.items() if r.status.name in statuses)

    def _fresh(self, n: int) -> list[int]:
        self.next_token += n
        return list(range(self.next_token - n, self.next_token))

    def _check(self, op: Op) -> None:
        (r_v, s_v), (r_k, s_k) = self.pair.step(op)
        diff = first_difference([r_v, s_v], [r_k, s_k])
        assert diff is None, f"after {op}: {diff}"

    def _admission(self, data, rid: str, tokens: tuple = ()) -> Op:
        cfg = self.cfg
        n_tokens = len(tokens) if tokens else self.pair.vllm.reqs[rid].num_tokens
        chunk = data.draw(st.sampled_from([cfg.sbs, cfg.hbs + 1, 2 * cfg.sbs + 3, 10_000]), label="chunk")
        external = data.draw(st.sampled_from([0, 0, cfg.hbs, 2 * cfg.sbs + 1]), label="external") if cfg.external else 0
        delay = external > 0 and data.draw(st.booleans(), label="delay")
        max_hit = data.draw(st.sampled_from([None, None, None, max(0, n_tokens - 1 - cfg.sbs)]), label="max_hit")
        groups = len(cfg.groups)
        skip = data.draw(st.sampled_from([(), (groups - 1,)]), label="skip_zeroing") if delay else ()
        lookahead = data.draw(st.sampled_from([0, cfg.lookahead]), label="lookahead")
        connector_lookup = cfg.external and data.draw(st.booleans(), label="connector_lookup")
        return Op("admit", rid, tokens=tuple(tokens), chunk=chunk, lookahead=lookahead, external=external,
                  delay=delay, max_hit=max_hit, skip_zeroing=skip, connector_lookup=connector_lookup,
                  has_scheduled=bool(self._with("RUNNING")))

    # -- rules
    @precondition(lambda self: len(self.pair.vllm.reqs) < MAX_REQUESTS)
    @rule(data=st.data())
    def admit_new(self, data) -> None:
        """A new request: a prefix of an earlier prompt (or of an earlier request's prompt and
        outputs), or none, then fresh tokens."""
        cfg = self.cfg
        limit = cfg.max_model_len // 2
        prefix: list[int] = []
        if self.seen and data.draw(st.integers(0, 3), label="shares") > 0:
            base = list(data.draw(st.sampled_from(list(self.seen.values())), label="base"))
            cut = data.draw(st.sampled_from([len(base), cfg.hbs, cfg.sbs, 2 * cfg.sbs, 3 * cfg.sbs + 1,
                                             len(base) - 1, len(base) + cfg.hbs]), label="cut")
            prefix = base[:max(0, min(cut, limit - 1))]
        tail = data.draw(st.integers(0 if prefix else 1, 6 * cfg.sbs), label="tail")
        tokens = (prefix + self._fresh(tail))[:limit]
        rid = f"r{self.next_rid}"
        self.next_rid += 1
        self.seen[rid] = tuple(tokens)
        op = self._admission(data, rid, tuple(tokens))
        op.salt = data.draw(st.sampled_from([None, None, None, "salt"]), label="salt")
        op.session = data.draw(st.sampled_from([None, None, "session"]), label="session")
        op.report_full = data.draw(st.integers(0, 3), label="report") == 0
        self._check(op)

    @precondition(lambda self: self._with("WAITING", "PREEMPTED"))
    @rule(data=st.data())
    def admit_waiting(self, data) -> None:
        """A request that did not fit, or was preempted, is admitted again."""
        rid = data.draw(st.sampled_from(self._with("WAITING", "PREEMPTED")), label="rid")
        self._check(self._admission(data, rid))

    def _step(self, data, rid: str) -> None:
        """One scheduled step of a running request: its next chunk or a decode step with
        drafts; a request near max_model_len finishes instead."""
        cfg = self.cfg
        req = self.pair.vllm.reqs[rid]
        if req.num_tokens + 2 + cfg.spec_tokens >= cfg.max_model_len - 1:
            self._check(Op("finish", rid))
            return
        chunk = data.draw(st.sampled_from([cfg.sbs, 1, cfg.hbs, cfg.sbs + 1, 10_000]), label="chunk")
        drafts = data.draw(st.integers(0, cfg.spec_tokens), label="drafts")
        accepted = data.draw(st.integers(0, drafts), label="accepted")
        lookahead = data.draw(st.sampled_from([cfg.lookahead, 0]), label="lookahead")
        in_flight = data.draw(st.sampled_from([0, cfg.in_flight]), label="in_flight") if cfg.in_flight else 0
        out = tuple(self._fresh(1 + drafts))
        if data.draw(st.integers(0, 4), label="repeat") == 0:  # a token seen before
            out = (self.seen[rid][0],) + out[1:]
        self._check(Op("step", rid, chunk=chunk, drafts=drafts, accepted=accepted, lookahead=lookahead,
                       out_tokens=out, in_flight=in_flight))
        req = self.pair.vllm.reqs.get(rid)
        if req is not None:
            self.seen[rid] = tuple(req.all_token_ids)

    @precondition(lambda self: self._with("RUNNING"))
    @rule(data=st.data(), steps=st.integers(1, 8))
    def schedule(self, data, steps) -> None:
        """Scheduler steps: each starts a step and runs every running request once (in
        admission order); a request that finds no room is preempted."""
        for _ in range(steps):
            self._check(Op("new_step"))
            for rid in sorted(self._with("RUNNING"), key=lambda r: int(r[1:])):
                if rid in self._with("RUNNING"):
                    self._step(data, rid)

    @precondition(lambda self: self._with("RUNNING"))
    @rule(data=st.data())
    def step_one(self, data) -> None:
        self._step(data, data.draw(st.sampled_from(self._with("RUNNING")), label="rid"))

    @precondition(lambda self: self._with("WAITING_FOR_REMOTE_KVS"))
    @rule(data=st.data(), failed=st.booleans())
    def loaded(self, data, failed) -> None:
        """An async KV load finished, or failed past a block boundary."""
        rid = data.draw(st.sampled_from(self._with("WAITING_FOR_REMOTE_KVS")), label="rid")
        self._check(Op("loaded", rid, failed=failed))

    @precondition(lambda self: self.pair.vllm.reqs)
    @rule(data=st.data(), what=st.sampled_from(["finish", "finish", "preempt", "skip", "finish_deferred"]))
    def release(self, data, what) -> None:
        """A request finishes or is aborted (a waiting one holds nothing: free is a no-op), maybe
        with its blocks' return deferred; a running one is preempted (to be admitted again), or
        its skipped blocks are dropped."""
        rids = sorted(self.pair.vllm.reqs) if what.startswith("finish") else self._with("RUNNING")
        if rids:
            self._check(Op(what, data.draw(st.sampled_from(rids), label="rid")))

    @rule(what=st.sampled_from(["evict", "reset", "new_step", "drain"]), ids=st.lists(st.integers(1, 63), max_size=4))
    def housekeeping(self, what, ids) -> None:
        """Evict blocks (a connector's invalid blocks), reset the prefix cache, start a step,
        free the deferred blocks."""
        self._check(Op(what, ids=tuple(i for i in ids if i < self.cfg.num_blocks) if what == "evict" else ()))

    @invariant()
    def requests_agree(self) -> None:
        """Both sides hold the same requests with the same counts."""
        mine = {rid: (r.status.name, r.num_computed_tokens, r.num_tokens) for rid, r in self.pair.kvcy.reqs.items()}
        theirs = {rid: (r.status.name, r.num_computed_tokens, r.num_tokens) for rid, r in self.pair.vllm.reqs.items()}
        assert mine == theirs


def _active_twin():
    return _fast.load(kvcy.IMPLEMENTATION)["kv_cache"]


def test_configs_cover_the_features():
    """The table holds each feature and hybrids of them (a guard on the table itself)."""
    kinds = {name for c in CONFIGS for name, _ in c.groups}
    assert {FULL, SWA, "ChunkedLocalAttentionSpec", "MLAAttentionSpec", "SlidingWindowMLASpec",
            "CrossAttentionSpec", "MambaSpec"} <= kinds
    assert any(not c.enable_caching for c in CONFIGS) and any(c.use_eagle for c in CONFIGS)
    assert any(c.hbs < min(c.block_sizes) or c.hbs < max(c.block_sizes) for c in CONFIGS)
    assert any(c.retention is not None for c in CONFIGS) and any(c.watermark for c in CONFIGS)
    assert any(c.num_hash_lookahead_tokens for c in CONFIGS) and any(c.num_prefill_lookahead for c in CONFIGS)
    assert any(c.external for c in CONFIGS) and any(c.encoder_tokens for c in CONFIGS)
    assert any(c.in_flight for c in CONFIGS) and any(c.spec_tokens for c in CONFIGS)
    assert sum(len(c.groups) > 2 for c in CONFIGS) >= 2
    assert any(c.shared_prefix_checkpoint for c in CONFIGS)
    assert any(c.dcp_world_size > 1 for c in CONFIGS) and any(c.pcp_world_size > 1 for c in CONFIGS)
    mamba_options = {k for c in CONFIGS for name, kw in c.groups if name == "MambaSpec" for k in kw}
    assert {"num_speculative_blocks", "num_prefill_checkpoint_blocks"} <= mamba_options
    assert len({c.name for c in CONFIGS}) == len(CONFIGS)


def _param(cfg: Config):
    marks = [pytest.mark.xfail(strict=True, reason=cfg.xfail)] if cfg.xfail else []
    return pytest.param(cfg, id=cfg.name, marks=marks)


@pytest.mark.parametrize("cfg", [_param(c) for c in CONFIGS])
def test_kvcy_manager_follows_vllm(cfg):
    kv = _active_twin()
    Side("vllm", cfg)  # (every config is one vLLM 0.33.0 builds)
    try:
        Side("kvcy", cfg, kv)
    except NotImplementedError as exc:
        if cfg.pending is None:
            raise
        pytest.skip(f"kvcy does not implement {cfg.pending} yet: {exc}")
    machine = type(f"Machine_{cfg.name}", (ManagerMachine,), {"cfg": cfg, "kv": kv})
    run_state_machine_as_test(machine, settings=SETTINGS)
