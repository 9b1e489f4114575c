"""vLLM 0.33.0's own ``Scheduler`` over the bundled Mooncake trace: vLLM's KV-cache manager
against kvcy's (``kvcy.vllm.install()``), sides alternating in one process.

Run (vLLM 0.33.0 in the interpreter; CPU platform, no hub, a config-only model written here)::

    VLLM_TARGET_DEVICE=cpu HF_HUB_OFFLINE=1 PYTHONPATH=$PWD \\
        python bench/bench_vllm_scheduler.py --limit 300 --rounds 3

``KVCY_NO_EXTENSIONS=1`` runs kvcy's side on the pure-Python twin.  Each round builds a fresh
``Scheduler`` (full attention, ``--num-blocks`` blocks of 16 tokens, ``max_num_seqs=256``,
``max_num_batched_tokens=8192``, prefix caching with sha256) and drives it as vLLM's engine
core does: requests are built with the block hasher ``vllm.v1.core.kv_cache_utils`` hands out
*at that moment* (kvcy's while installed, unless ``--sides`` asks for ``kvcy-keep-hasher``) and
added when their arrival time has passed on a simulated clock (10 ms a step plus 2 us a
scheduled token; an idle engine jumps to the next arrival); a fake model samples one token per
request that finished its prompt, ``max_tokens`` being the trace's output length.

Per side, the CPU time (``time.process_time``) of ``add_request`` (building vLLM's ``Request``,
its block hashes, and the scheduler's call), ``schedule`` and ``update_from_output``, the median
over ``--rounds`` rounds, and ratios against vLLM's side.  One more round per side (untimed
for the totals) wraps the scheduler's manager in a proxy that times every call with
``thread_time_ns`` (CPU time, so other work on a loaded machine does not count; less the timer's
own cost, measured first): the manager's share of the scheduler and its
cost per call.  Every round records what each step decided (``SchedulerOutput`` and what
``update_from_output`` returned, as tests/vllm_live/test_vllm_scheduler.py records them) and the report
says whether every side decided exactly what vLLM's did.

tests/vllm_live/test_vllm_bench_scheduler.py runs a short prefix of it, untimed, in CI's vLLM step.
"""

from __future__ import annotations

import argparse
import gc
import hashlib
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

_ROOT = Path(__file__).resolve().parent.parent
if str(_ROOT) not in sys.path:  # run as a script: the tests' helpers live beside kvcy
    sys.path.insert(0, str(_ROOT))

BLOCK_SIZE = 16
MAX_NUM_SEQS = 256
MAX_NUM_BATCHED_TOKENS = 8192
MAX_MODEL_LEN = 131072
NUM_BLOCKS = 32768
STEP_MS = 10.0
TOKEN_US = 2.0
SIDES = ("vllm", "kvcy", "kvcy-keep-hasher")
PHASES = ("add_request", "schedule", "update_from_output")


@dataclass
class RoundResult:
    side: str
    phase_ns: dict[str, int]
    steps: int
    requests: int
    digest: str  # of every step's decisions, in order
    manager_class: str
    manager_ns: int = 0  # instrumented rounds only, timer cost removed
    manager_calls: int = 0
    manager_by_method: dict[str, list[int]] = field(default_factory=dict)  # name -> [calls, ns]
    gc_ns: int = 0  # the cycle collector's CPU time during the round
    gc_collections: int = 0

    @property
    def scheduler_ns(self) -> int:
        return sum(self.phase_ns.values())


class _TimedManager:
    """The scheduler's KV-cache manager with every method call timed (attributes pass through)."""

    def __init__(self, manager: Any, timer_cost_ns: float) -> None:
        object.__setattr__(self, "_m", manager)
        object.__setattr__(self, "_cost", timer_cost_ns)
        object.__setattr__(self, "_by_method", {})

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._m, name)
        if not callable(attr) or isinstance(attr, type):
            return attr
        slot = self._by_method.setdefault(name, [0, 0])
        clock = time.thread_time_ns

        def timed(*args: Any, **kwargs: Any) -> Any:
            t0 = clock()
            try:
                return attr(*args, **kwargs)
            finally:
                slot[1] += clock() - t0
                slot[0] += 1

        object.__setattr__(self, name, timed)  # bound methods do not change: look each up once
        return timed

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(self._m, name, value)

    def totals(self) -> tuple[int, int, dict[str, list[int]]]:
        calls = sum(c for c, _ in self._by_method.values())
        ns = sum(t for _, t in self._by_method.values())
        return calls, max(0, int(ns - calls * self._cost)), dict(self._by_method)


def timer_cost_ns(calls: int = 20_000, rounds: int = 5) -> float:
    """What the proxy adds to one timed call: the smallest, over ``rounds``, mean interval it
    measures around a call that does next to nothing (a builtin's bound method through the same
    wrapper): the tail and head of the two ``thread_time_ns`` system calls, and the few ns of
    calling a C method, which the manager's calls then do not count."""
    best = float("inf")
    for _ in range(rounds):
        proxy = _TimedManager([], 0.0)
        empty = proxy.__len__  # a list's C method: next to no work
        for _ in range(calls):
            empty()
        n, _, by_method = proxy.totals()
        best = min(best, by_method["__len__"][1] / n)
    return best


def load_trace(limit: int | None) -> list[tuple[str, float, list[int], int]]:
    """``(request_id, arrival_ms, prompt, max_tokens)`` for the bundled trace's first ``limit`` requests."""
    from kvcy.sim.traces import bundled_trace_path, read_mooncake

    trace = read_mooncake(bundled_trace_path(), limit=limit)
    return [(r.request_id, r.arrival_ms, r.prompt_token_ids(), r.num_output_tokens) for r in trace]


def _build_scheduler(model_dir: str, num_blocks: int, max_model_len: int) -> Any:
    from tests.vllm_live.test_vllm_scheduler import make_kv_cache_config, make_vllm_config
    from vllm.v1.core.sched.scheduler import Scheduler
    from vllm.v1.structured_output import StructuredOutputManager

    config = make_vllm_config(model_dir, num_blocks, 0.0, max_num_seqs=MAX_NUM_SEQS,
                              max_num_batched_tokens=MAX_NUM_BATCHED_TOKENS, max_model_len=max_model_len)
    return Scheduler(vllm_config=config, kv_cache_config=make_kv_cache_config("full-attention", num_blocks),
                     structured_output_manager=StructuredOutputManager(config), block_size=BLOCK_SIZE,
                     hash_block_size=BLOCK_SIZE, log_stats=True)


def _install(side: str) -> None:
    import kvcy.vllm

    kvcy.vllm.uninstall()
    if side == "kvcy":
        kvcy.vllm.install()
    elif side == "kvcy-keep-hasher":
        kvcy.vllm.install(block_hasher=False)


def run_round(side: str, trace: list[tuple[str, float, list[int], int]], model_dir: str, *,
              num_blocks: int = NUM_BLOCKS, max_model_len: int = MAX_MODEL_LEN, instrument: bool = False,
              timer_cost: float = 0.0, on_step: Callable[[int, dict[str, Any]], None] | None = None) -> RoundResult:
    """One fresh ``Scheduler`` on ``side``'s manager through the whole trace.

    ``on_step(step, record)`` sees each step's decisions (tests compare them record by record).
    """
    import kvcy.vllm
    from tests.vllm_live.test_vllm_scheduler import record_engine_outputs, record_output
    from vllm.sampling_params import SamplingParams
    from vllm.utils.hashing import get_hash_fn_by_name
    from vllm.v1.core import kv_cache_utils
    from vllm.v1.outputs import ModelRunnerOutput
    from vllm.v1.request import Request

    _install(side)
    try:
        scheduler = _build_scheduler(model_dir, num_blocks, max_model_len)
        # What vLLM's engine core does when it starts: NONE_HASH, then the hasher (kvcy's while installed).
        hash_fn = get_hash_fn_by_name(scheduler.cache_config.prefix_caching_hash_algo)
        kv_cache_utils.init_none_hash(hash_fn)
        block_hasher = kv_cache_utils.get_request_block_hasher(BLOCK_SIZE, hash_fn)
    finally:
        kvcy.vllm.uninstall()
    manager_class = f"{type(scheduler.kv_cache_manager).__module__}.{type(scheduler.kv_cache_manager).__name__}"
    proxy = None
    if instrument:
        proxy = _TimedManager(scheduler.kv_cache_manager, timer_cost)
        scheduler.kv_cache_manager = proxy

    params = []
    for _, _, _, max_tokens in trace:
        p = SamplingParams(max_tokens=max_tokens, ignore_eos=True)
        params.append(p)
    cpu = time.process_time_ns
    phase = dict.fromkeys(PHASES, 0)
    digest = hashlib.sha256()
    clock_ms = 0.0
    nxt = 0
    step = 0
    gc_time = [0, 0, 0]  # start, total, collections

    def on_gc(phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            gc_time[0] = time.thread_time_ns()
        else:
            gc_time[1] += time.thread_time_ns() - gc_time[0]
            gc_time[2] += 1

    gc.collect()
    gc.freeze()
    gc.callbacks.append(on_gc)
    try:
        while nxt < len(trace) or scheduler.requests:
            if nxt < len(trace) and not scheduler.requests and trace[nxt][1] > clock_ms:
                clock_ms = trace[nxt][1]  # idle: jump to the next arrival
            t0 = cpu()
            while nxt < len(trace) and trace[nxt][1] <= clock_ms:
                request_id, arrival_ms, prompt, _ = trace[nxt]
                scheduler.add_request(Request(request_id=request_id, prompt_token_ids=prompt,
                                              sampling_params=params[nxt], pooling_params=None,
                                              arrival_time=arrival_ms / 1000.0, block_hasher=block_hasher))
                nxt += 1
            t1 = cpu()
            out = scheduler.schedule()
            t2 = cpu()
            req_ids = list(out.num_scheduled_tokens)
            requests = scheduler.requests
            sampled = []
            for req_id in req_ids:
                request = requests[req_id]
                if request.num_computed_tokens >= request.num_tokens:  # prompt done: one token
                    sampled.append([(request.num_tokens * 7919 + len(req_id)) % 65536])
                else:
                    sampled.append([])
            runner_output = ModelRunnerOutput(req_ids=req_ids,
                                              req_id_to_index={r: i for i, r in enumerate(req_ids)},
                                              sampled_token_ids=sampled)
            t3 = cpu()
            engine_outputs = scheduler.update_from_output(out, runner_output)
            t4 = cpu()
            phase["add_request"] += t1 - t0
            phase["schedule"] += t2 - t1
            phase["update_from_output"] += t4 - t3
            record = {"scheduler_output": record_output(out), "engine_outputs": record_engine_outputs(engine_outputs)}
            news = record["scheduler_output"]["new"]  # the prompt is the trace's: its length says enough
            news[:] = [(rid, len(prompt), blocks, computed) for rid, prompt, blocks, computed in news]
            if on_step is not None:
                on_step(step, record)
            digest.update(repr(record).encode())
            clock_ms += STEP_MS + TOKEN_US * out.total_num_scheduled_tokens / 1000.0
            step += 1
    finally:
        gc.callbacks.remove(on_gc)
        gc.unfreeze()
    result = RoundResult(side, phase, step, nxt, digest.hexdigest(), manager_class, gc_ns=gc_time[1],
                         gc_collections=gc_time[2])
    if proxy is not None:
        result.manager_calls, result.manager_ns, result.manager_by_method = proxy.totals()
    return result


def _fmt_s(ns: float) -> str:
    return f"{ns / 1e9:.2f} s"


def report(timed: dict[str, list[RoundResult]], instrumented: dict[str, RoundResult], out=sys.stdout) -> bool:
    """Prints the table; returns whether every round of every side decided what vLLM's did."""
    import kvcy

    ref = timed["vllm"][0].digest
    same = all(r.digest == ref for rounds in timed.values() for r in rounds) and all(
        r.digest == ref for r in instrumented.values())
    first = timed["vllm"][0]
    print(f"vLLM 0.33.0 Scheduler, bundled Mooncake trace: {first.requests} requests, {first.steps} steps; "
          f"kvcy twin: {kvcy.IMPLEMENTATION}; rounds per side: {len(timed['vllm'])}", file=out)
    med = {side: {ph: statistics.median(r.phase_ns[ph] for r in rounds) for ph in PHASES}
           for side, rounds in timed.items()}
    for side, m in med.items():
        m["whole"] = sum(m[ph] for ph in PHASES)
        m["GC (whole round)"] = statistics.median(r.gc_ns for r in timed[side])
    sides = list(timed)
    header = f"{'median CPU':<24}" + "".join(f"{s:>26}" for s in sides)
    print(header, file=out)
    for ph in (*PHASES, "whole", "GC (whole round)"):
        row = f"{ph:<24}"
        for s in sides:
            v = med[s][ph]
            ratio = "" if s == "vllm" or not v else f" ({med['vllm'][ph] / v:.2f}x)"
            row += f"{_fmt_s(v) + ratio:>26}"
        print(row, file=out)
    if instrumented:
        print("instrumented round (manager calls timed one by one, timer cost removed):", file=out)
        for label, fn in (
            ("manager CPU", lambda r: _fmt_s(r.manager_ns)),
            ("manager calls", lambda r: f"{r.manager_calls:,}"),
            ("per manager call", lambda r: f"{r.manager_ns / max(1, r.manager_calls) / 1e3:.2f} us"),
            ("manager share", lambda r: f"{100 * r.manager_ns / max(1, r.scheduler_ns):.1f} %"),
        ):
            print(f"{label:<24}" + "".join(f"{fn(instrumented[s]):>26}" for s in sides if s in instrumented),
                  file=out)
        v = instrumented.get("vllm")
        for s in sides:
            r = instrumented.get(s)
            if s != "vllm" and r is not None and v is not None and r.manager_ns:
                print(f"manager ratio {s}: {v.manager_ns / r.manager_ns:.1f}x less CPU than vLLM's", file=out)
        for s in sides:
            r = instrumented.get(s)
            if r is None:
                continue
            top = sorted(r.manager_by_method.items(), key=lambda kv: -kv[1][1])[:5]
            print(f"  {s}: " + ", ".join(f"{k} {c:,} calls {t / 1e9:.2f} s" for k, (c, t) in top), file=out)
    print(f"every SchedulerOutput and engine output identical to vLLM's: {same}", file=out)
    return same


def manager_call_costs(repeats: int = 5) -> dict[str, tuple[float, float, float]]:
    """Per-call CPU of the manager with vLLM's own ``Request`` objects, timed in batches (thread
    CPU time around a loop of 200 calls, so the clock's cost is spread thin): 200 requests of
    1,000-token prompts (10 shared 600-token prefixes) admitted (``get_computed_blocks`` +
    ``allocate_slots``), then 64 decode steps (a token appended to each, ``allocate_slots(r, 1,
    num_lookahead_tokens=0)`` as vLLM's scheduler calls it), then ``free``.

    Returns:
        side -> (admission ns, decode allocate_slots ns, free ns), the minimum over ``repeats``.
    """
    import torch
    from vllm.sampling_params import SamplingParams
    from vllm.utils.hashing import sha256
    from vllm.v1.core import kv_cache_utils
    from vllm.v1.core.kv_cache_manager import KVCacheManager as VllmManager
    from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
    from vllm.v1.request import Request, RequestStatus

    import kvcy.vllm

    kv_cache_utils.init_none_hash(sha256)
    hasher = kv_cache_utils.get_request_block_hasher(BLOCK_SIZE, sha256)
    clock = time.thread_time_ns

    def one(side: str) -> tuple[float, float, float]:
        spec = FullAttentionSpec(block_size=BLOCK_SIZE, num_kv_heads=4, head_size=16, dtype=torch.float16)
        cfg = KVCacheConfig(num_blocks=40960, kv_cache_tensors=[], kv_cache_groups=[KVCacheGroupSpec(["l0"], spec)])
        kw = dict(max_model_len=8192, scheduler_block_size=BLOCK_SIZE, hash_block_size=BLOCK_SIZE,
                  enable_caching=True, log_stats=True)
        mgr = VllmManager(cfg, **kw) if side == "vllm" else kvcy.vllm.make_kv_cache_manager(cfg, **kw)
        params = SamplingParams(max_tokens=100)
        reqs, admit, decode = [], 0, 0
        for i in range(200):
            prompt = [(i % 10) * 1000 + j for j in range(600)] + [i * 7 + j for j in range(400)]
            r = Request(f"r{i}", prompt, params, None, block_hasher=hasher)
            t0 = clock()
            blocks, hit = mgr.get_computed_blocks(r)[:2]
            mgr.allocate_slots(r, r.num_tokens - hit, num_new_computed_tokens=hit, new_computed_blocks=blocks,
                               num_lookahead_tokens=0)
            admit += clock() - t0
            r.num_computed_tokens = r.num_tokens
            r.status = RequestStatus.RUNNING
            reqs.append(r)
        alloc = mgr.allocate_slots
        for step in range(64):
            for r in reqs:
                r.append_output_token_ids(step)
            t0 = clock()
            for r in reqs:
                alloc(r, 1, num_lookahead_tokens=0)
            decode += clock() - t0
            for r in reqs:
                r.num_computed_tokens += 1
        t0 = clock()
        for r in reqs:
            mgr.free(r)
        return admit / 200, decode / (64 * 200), (clock() - t0) / 200

    runs: dict[str, list[tuple[float, float, float]]] = {"vllm": [], "kvcy": []}
    for _ in range(repeats):
        for side in runs:
            runs[side].append(one(side))
    return {side: tuple(min(r[i] for r in rs) for i in range(3)) for side, rs in runs.items()}  # type: ignore[misc]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--limit", type=int, default=300, help="first N requests of the bundled trace (default 300)")
    ap.add_argument("--rounds", type=int, default=3, help="timed rounds per side, alternating (default 3)")
    ap.add_argument("--num-blocks", type=int, default=NUM_BLOCKS)
    ap.add_argument("--sides", default="vllm,kvcy", help=f"comma-separated, from {','.join(SIDES)}")
    ap.add_argument("--no-instrument", action="store_true", help="skip the per-call manager timing round")
    ap.add_argument("--calls", action="store_true",
                    help="instead: the manager's per-call cost with vLLM's Request, timed in batches")
    args = ap.parse_args(argv)
    if args.calls:
        import kvcy

        costs = manager_call_costs()
        v = costs["vllm"]
        for side, (a, d, f) in costs.items():
            ratio = "" if side == "vllm" else f" ({v[0] / a:.1f}x, {v[1] / d:.1f}x, {v[2] / f:.1f}x)"
            print(f"{side} ({kvcy.IMPLEMENTATION if side == 'kvcy' else 'vLLM 0.33.0'}): admission {a / 1e3:.2f} us, "
                  f"decode allocate_slots {d:.0f} ns, free {f / 1e3:.2f} us{ratio} (min of 5)")
        return 0
    sides = [s for s in args.sides.split(",") if s]
    if "vllm" not in sides or any(s not in SIDES for s in sides):
        ap.error(f"--sides must include vllm and name only {SIDES}")
    trace = load_trace(args.limit)
    with tempfile.TemporaryDirectory() as tmp:
        from tests.vllm_live.test_vllm_scheduler import write_model_config

        model_dir = write_model_config(tmp, max_position_embeddings=MAX_MODEL_LEN)
        timed: dict[str, list[RoundResult]] = {s: [] for s in sides}
        for i in range(args.rounds):
            for s in sides if i % 2 == 0 else reversed(sides):
                timed[s].append(run_round(s, trace, model_dir, num_blocks=args.num_blocks))
                r = timed[s][-1]
                print(f"round {i} {s}: " + ", ".join(f"{ph} {_fmt_s(r.phase_ns[ph])}" for ph in PHASES),
                      file=sys.stderr)
        instrumented: dict[str, RoundResult] = {}
        if not args.no_instrument:
            cost = timer_cost_ns()
            for s in sides:
                instrumented[s] = run_round(s, trace, model_dir, num_blocks=args.num_blocks, instrument=True,
                                            timer_cost=cost)
    return 0 if report(timed, instrumented) else 1


if __name__ == "__main__":
    sys.exit(main())
