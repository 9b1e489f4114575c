"""A continuous-batching scheduler loop driving :class:`KVCacheManager`.

It uses the manager the way vLLM's v1 ``Scheduler`` does (FCFS, chunked
prefill, recompute preemption), synchronously and without a model:

1. **Arrivals.** Trace requests whose arrival time has passed join the back of
   the waiting queue.  A request's ``kvcy.Request`` (tokens, block hashes) is
   built the first time the scheduler looks at it.
2. **Running requests**, in order, while the step's token budget lasts: the
   rest of the prefill (chunked by the budget) or one decode token;
   ``allocate_slots(request, n)``.  When it returns ``None`` the *last* running
   request is preempted (``free``, status ``PREEMPTED``, computed tokens 0, to
   the front of the waiting queue) and the allocation is retried; if the
   preempted request is the current one, running-request scheduling stops.
3. **Waiting requests**, only if nothing was preempted this step, while the
   budget lasts and fewer than ``max_num_seqs`` run: ``get_computed_blocks``
   then ``allocate_slots`` with the hit, ``has_scheduled_reqs=bool(running)``
   and, by default, ``full_sequence_must_fit=True`` (vLLM's
   ``scheduler_reserve_full_isl``); on ``None`` admission stops.
4. Every scheduled request's ``num_computed_tokens`` advances; a request whose
   prefill or decode completed samples one token (the trace's output tokens, or
   fresh ones); one that reached its output length finishes and is freed.
5. **Time.** A step takes ``step_ms + token_us * scheduled_tokens / 1000``
   simulated milliseconds; an idle engine jumps to the next arrival.  Only the
   interleaving of arrivals and steps depends on this model, and it never reads
   the wall clock, so a replay is deterministic.
6. **CPU tier** (``ReplayConfig.cpu_offload_blocks``): admission looks the
   blocks after the GPU hit up in a ``CPUOffloadingManager`` and loads the hit
   (``num_external_computed_tokens``); every step offers the new prompt blocks
   for storing; see :mod:`kvcy.sim.offload`.  Its calls are timed apart
   (``offload_ns``).

The loop is a small state class, one method per phase above
(``_ReplayLoop.take_arrivals``, ``schedule_running``, ``admit_waiting``,
``offer_stores``, ``advance``, ``end_step``, then ``report``).

No input makes the loop spin: arrival times are checked before it starts
(finite, in order), an idle engine must reach the next arrival, a step must
schedule something, and more steps than ``max_model_len`` without a finished
request stop it (the oldest running request gets a token every step).

Manager CPU time is ``time.perf_counter_ns()`` around the manager calls only
(``get_computed_blocks``, ``allocate_slots``, ``free``), summed per step, less
the timer's own cost: an empty timed interval, calibrated before the replay
(:func:`timer_overhead_ns`), for every timed call.  The uncorrected total is
kept too (``manager_ns_raw``).

Every manager decision (hit blocks, new block ids per request per step, which
request is preempted, each finished request's block table) is folded into one
digest per step, so two implementations can be checked for identical decisions.
"""

from __future__ import annotations

import gc
import hashlib
import math
import sys
import time
from array import array
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from kvcy.request import Request, RequestStatus
from kvcy.sim.traces import MAX_ARRIVAL_MS, Trace, TraceRequest

__all__ = [
    "MAX_BLOCK_SIZE",
    "MAX_CPU_OFFLOAD_BLOCKS",
    "MAX_NUM_BLOCKS",
    "MAX_STEP_MS",
    "MAX_TOKEN_US",
    "ReplayConfig",
    "ReplayResult",
    "Divergence",
    "build_manager",
    "decode_decisions",
    "manager_class",
    "nearest_rank",
    "replay",
    "timer_overhead_ns",
]

#: Largest pool a replay builds (16 Mi blocks: 256 Gi tokens at block size 16).
MAX_NUM_BLOCKS = 1 << 24
#: Largest CPU tier, in blocks.
MAX_CPU_OFFLOAD_BLOCKS = 1 << 28
#: Largest block size, in tokens.
MAX_BLOCK_SIZE = 1 << 16
#: Largest fixed simulated time per step (one hour, in ms).
MAX_STEP_MS = 3.6e6
#: Largest simulated time per scheduled token (one second, in µs).
MAX_TOKEN_US = 1e6

# Decision codes folded into the per-step digest.
_LOOKUP, _ALLOC, _PREEMPT, _FINISH = 1, 2, 3, 4
# ... and the CPU tier's, each followed by the request's index: the offloading twins'
# ReplayConnector writes them (offload_c/offloading_connector.pyx, offload_py/offloading_connector.py hold the same
# values; tests/test_offload_connector.py checks them against these).
CPU_LOOKUP, CPU_LOAD, CPU_STORE, CPU_STORE_REFUSED, CPU_FINISH = 11, 12, 13, 14, 15


@dataclass(frozen=True)
class ReplayConfig:
    """What a replay runs with.

    Attributes:
        num_blocks: KV-cache blocks in the pool (block 0 is the null block).
        block_size: tokens per block (also the hash block size).
        hash_algo: prefix-cache hash (``kvcy.hashing`` name).
        max_num_seqs: cap on running requests.
        max_num_batched_tokens: token budget per step.
        max_model_len: longest request (prompt + output) accepted; ``None``:
            the longest in the trace, capped at what the pool holds.  Longer
            requests are rejected, as an engine rejects them.
        step_ms: fixed simulated time per step (ms).
        token_us: simulated time per scheduled token (µs).
        enable_caching: prefix caching on.
        reserve_full_isl: admit a waiting request only if its whole prompt fits
            (``allocate_slots(..., full_sequence_must_fit=True)``), vLLM 0.33's
            default (``scheduler_reserve_full_isl``); off: only the first chunk
            has to fit.
        cpu_offload_blocks: blocks of a CPU tier behind the GPU pool (a
            ``CPUOffloadingManager``, see :mod:`kvcy.sim.offload`); 0: none.
        offload_policy: the CPU tier's cache policy, ``"lru"`` or ``"arc"``.
    """

    num_blocks: int
    block_size: int = 16
    hash_algo: str = "sha256"
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 8192
    max_model_len: int | None = None
    step_ms: float = 10.0
    token_us: float = 12.5
    enable_caching: bool = True
    reserve_full_isl: bool = True
    cpu_offload_blocks: int = 0
    offload_policy: str = "lru"

    def __post_init__(self) -> None:
        for name in ("num_blocks", "block_size", "max_num_seqs", "max_num_batched_tokens", "cpu_offload_blocks"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int):
                raise TypeError(f"{name} must be an int, got {value!r}")
        if not 2 <= self.num_blocks <= MAX_NUM_BLOCKS:
            raise ValueError(
                f"num_blocks must be >= 2 (block 0 is the null block) and <= {MAX_NUM_BLOCKS:,}, got {self.num_blocks}"
            )
        if not 1 <= self.block_size <= MAX_BLOCK_SIZE:
            raise ValueError(f"block_size must be from 1 to {MAX_BLOCK_SIZE:,}, got {self.block_size}")
        if self.max_num_seqs < 1:
            raise ValueError(f"max_num_seqs must be >= 1, got {self.max_num_seqs}")
        if self.max_num_batched_tokens < 1:
            raise ValueError(f"max_num_batched_tokens must be >= 1, got {self.max_num_batched_tokens}")
        if self.max_model_len is not None and self.max_model_len < 2:
            raise ValueError(f"max_model_len must be >= 2, got {self.max_model_len}")
        if not 0 <= self.cpu_offload_blocks <= MAX_CPU_OFFLOAD_BLOCKS:
            raise ValueError(
                f"cpu_offload_blocks must be from 0 to {MAX_CPU_OFFLOAD_BLOCKS:,}, got {self.cpu_offload_blocks}"
            )
        if self.offload_policy not in ("lru", "arc"):
            raise ValueError(f"offload_policy must be 'lru' or 'arc', got {self.offload_policy!r}")
        if self.cpu_offload_blocks and not self.enable_caching:
            raise ValueError("a CPU tier needs prefix caching (its keys are the block hashes)")
        if not 0.0 <= self.step_ms <= MAX_STEP_MS:  # NaN fails too
            raise ValueError(f"step_ms must be a number from 0 to {MAX_STEP_MS:g}, got {self.step_ms!r}")
        if not 0.0 <= self.token_us <= MAX_TOKEN_US:
            raise ValueError(f"token_us must be a number from 0 to {MAX_TOKEN_US:g}, got {self.token_us!r}")

    @property
    def pool_tokens(self) -> int:
        """Tokens the pool holds (usable blocks times block size)."""
        return (self.num_blocks - 1) * self.block_size

    def resolve_max_model_len(self, trace: Trace) -> int:
        longest = max((r.num_prompt_tokens + r.num_output_tokens for r in trace), default=2)
        wanted = self.max_model_len if self.max_model_len is not None else longest
        return max(2, min(wanted, self.pool_tokens))


@dataclass
class ReplayResult:
    """What one replay did and what the manager cost.

    Token counts are over admitted (not rejected) requests.  ``hit_tokens /
    query_tokens`` is the prefix-cache hit rate of first admissions;
    re-admissions after a preemption are counted apart (``recompute_*``).
    """

    impl: str
    trace: str
    config: ReplayConfig
    max_model_len: int
    requests: int = 0
    finished: int = 0
    rejected: int = 0
    prompt_tokens: int = 0
    output_tokens: int = 0
    query_tokens: int = 0
    hit_tokens: int = 0
    recompute_query_tokens: int = 0
    recompute_hit_tokens: int = 0
    preemptions: int = 0
    evictions: int | None = None
    steps: int = 0
    sim_time_s: float = 0.0
    peak_usage: float = 0.0
    mean_usage: float = 0.0
    manager_calls: int = 0
    manager_ns: int = 0
    manager_ns_raw: int = 0
    timer_overhead_ns: int = 0
    step_ns: array = field(default_factory=lambda: array("q"))
    wall_s: float = 0.0
    step_digests: list[bytes] = field(default_factory=list)
    free_blocks_at_end: int = 0
    manager_prefix_cache_stats: dict[str, int] | None = None
    captured: list[str] | None = None
    # The CPU tier (with config.cpu_offload_blocks); tokens as hit_tokens.
    offload_impl: str | None = None
    cpu_hit_tokens: int = 0
    recompute_cpu_hit_tokens: int = 0
    cpu_blocks_loaded: int = 0
    cpu_blocks_stored: int = 0
    cpu_evictions: int = 0
    cpu_stores_refused: int = 0
    offload_calls: int = 0
    offload_ns: int = 0
    offload_ns_raw: int = 0
    offload_step_ns: array = field(default_factory=lambda: array("q"))

    @property
    def hit_rate(self) -> float:
        """GPU prefix-cache hits over prompt tokens (first admissions)."""
        return self.hit_tokens / self.query_tokens if self.query_tokens else 0.0

    @property
    def total_hit_rate(self) -> float:
        """GPU and CPU-tier hits over prompt tokens (first admissions)."""
        return (self.hit_tokens + self.cpu_hit_tokens) / self.query_tokens if self.query_tokens else 0.0

    @property
    def decisions_digest(self) -> str:
        h = hashlib.blake2b(digest_size=16)
        for d in self.step_digests:
            h.update(d)
        return h.hexdigest()

    def step_ns_percentile(self, q: float) -> float:
        """Per-step manager time at percentile ``q`` (0-100), nearest rank, in ns."""
        return nearest_rank(sorted(self.step_ns), q)


def nearest_rank(ordered: Sequence[float], q: float) -> float:
    """Percentile ``q`` (0-100) of ``ordered`` (sorted ascending), nearest rank; 0.0 when empty.

    The one percentile of the replay's reports (per-step times, fleet event lag)."""
    if not ordered:
        return 0.0
    k = max(0, min(len(ordered) - 1, math.ceil(q / 100.0 * len(ordered)) - 1))
    return float(ordered[k])


class Divergence(RuntimeError):
    """Two implementations made different decisions at ``step``."""

    def __init__(self, step: int, result: ReplayResult) -> None:
        super().__init__(f"decisions differ at step {step}")
        self.step = step
        self.result = result


def timer_overhead_ns(samples: int = 20_001) -> int:
    """The timer's own cost in one timed manager call, in ns.

    ``t0 = perf_counter_ns(); call(); ns += perf_counter_ns() - t0`` also
    counts the tail of the first timer call and the head of the second: an
    empty interval measures 40-55 ns on a small VM, about a seventh of all
    the compiled manager's measured time in the bundled replay (which times
    724k calls).  This is the median of ``samples`` empty intervals in a
    tight loop, where the timer's code is hot: a low estimate of the cost
    inside the replay, so removing it errs towards leaving timer time in.
    """
    if samples < 1:
        raise ValueError(f"samples must be at least 1, got {samples}")
    perf = time.perf_counter_ns
    out = array("q", bytes(8 * samples))
    for i in range(samples):
        t0 = perf()
        out[i] = perf() - t0
    return int(sorted(out)[samples // 2])


def manager_class(impl: str) -> type:
    """The ``KVCacheManager`` class of one twin (``"cython"`` or ``"python"``)."""
    from kvcy import _fast

    if impl not in ("cython", "python"):
        raise ValueError(f"impl must be 'cython' or 'python', got {impl!r}")
    if impl == "cython" and "cython" not in _fast.available():
        raise ValueError("the compiled (cython) twins are not built in this install; use --impl python")
    return _fast.load(impl)["kv_cache"].KVCacheManager


def build_manager(impl: str, config: ReplayConfig, max_model_len: int, *, kv_events: bool = False) -> Any:
    """A one-group full-attention ``KVCacheManager`` for ``config`` (``kv_events``: with KV events on)."""
    from kvcy.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec

    spec = FullAttentionSpec(block_size=config.block_size, num_kv_heads=8, head_size=128, dtype="bfloat16")
    kv_cfg = KVCacheConfig(
        num_blocks=config.num_blocks,
        kv_cache_tensors=[],
        kv_cache_groups=[KVCacheGroupSpec(["layer.0"], spec)],
    )
    return manager_class(impl)(
        kv_cfg,
        max_model_len=max_model_len,
        scheduler_block_size=config.block_size,
        hash_block_size=config.block_size,
        max_in_flight_tokens=None,
        enable_caching=config.enable_caching,
        use_eagle=False,
        log_stats=True,
        enable_kv_cache_events=kv_events,
        watermark=0.0,
    )


class _Live:
    """Scheduler-side state of one request (``off``: its CPU-tier state)."""

    __slots__ = ("trace", "req", "outputs", "off")

    def __init__(self, trace: TraceRequest) -> None:
        self.trace = trace
        self.req: Request | None = None
        self.outputs: list[int] = []
        self.off: Any = None


def _put_ids(dec: list[int], block_ids: Any) -> None:
    if block_ids is None:
        dec.append(-1)
        return
    dec.append(len(block_ids))
    for group in block_ids:
        dec.append(len(group))
        dec.extend(group)


def decode_decisions(dec: list[int], names: Mapping[int, str] | None = None) -> list[str]:
    """Readable lines for one step's encoded decisions (for divergence reports)."""

    def name(i: int) -> str:
        return names.get(i, f"#{i}") if names is not None else f"#{i}"

    out: list[str] = []
    pos = 0

    def take_ids() -> Any:
        nonlocal pos
        n = dec[pos]
        pos += 1
        if n < 0:
            return None
        groups = []
        for _ in range(n):
            k = dec[pos]
            groups.append(dec[pos + 1 : pos + 1 + k])
            pos += 1 + k
        return groups

    while pos < len(dec):
        op, idx = dec[pos], dec[pos + 1]
        pos += 2
        if op == _LOOKUP:
            hit = dec[pos]
            pos += 1
            out.append(f"get_computed_blocks({name(idx)}) -> hit {hit} tokens, blocks {take_ids()}")
        elif op == _ALLOC:
            n = dec[pos]
            pos += 1
            ids = take_ids()
            out.append(f"allocate_slots({name(idx)}, {n}) -> {'None' if ids is None else ids}")
        elif op == _PREEMPT:
            out.append(f"preempt {name(idx)} (free)")
        elif op == _FINISH:
            out.append(f"finish {name(idx)}: block table {take_ids()} (free)")
        elif op == CPU_LOOKUP:
            out.append(f"CPU tier lookup({name(idx)}) -> hit {dec[pos]} blocks")
            pos += 1
        elif op == CPU_LOAD:
            n = dec[pos]
            out.append(f"CPU tier prepare_load({name(idx)}) -> chunks {dec[pos + 1 : pos + 1 + n]}")
            pos += 1 + n
        elif op == CPU_STORE:
            n = dec[pos]
            ids = dec[pos + 1 : pos + 1 + n]
            evicted, evicted_digest = dec[pos + 1 + n], dec[pos + 2 + n]
            pos += 3 + n
            out.append(f"CPU tier prepare_store({name(idx)}) -> store in chunks {ids}, evict {evicted} keys "
                       f"(digest {evicted_digest & 0xFFFFFFFFFFFFFFFF:016x})")
        elif op == CPU_STORE_REFUSED:
            out.append(f"CPU tier prepare_store({name(idx)}, {dec[pos]} keys) -> None")
            pos += 1
        elif op == CPU_FINISH:
            out.append(f"CPU tier on_request_finished({name(idx)})")
        else:  # pragma: no cover - corrupt encoding
            out.append(f"?op {op}")
            break
    return out


def replay(
    trace: Trace,
    config: ReplayConfig,
    impl: str = "cython",
    *,
    manager: Any = None,
    progress: bool | Any = False,
    expected_digests: list[bytes] | None = None,
    capture_step: int | None = None,
    stop_after_step: int | None = None,
    timer_overhead: int | None = None,
) -> ReplayResult:
    """Replay ``trace`` through a fresh manager and report what happened.

    Args:
        trace: the requests.
        config: pool and scheduler settings.
        impl: which twin's manager to build (``"cython"`` / ``"python"``).
        manager: use this manager instead of building one (tests).
        progress: ``True``: show a tqdm bar on stderr; or an object with
            tqdm's ``update(n)`` (a bar shared by several replays): it gets
            one tick per finished request and one per rejected request, so
            a whole replay advances it by ``len(trace)``.
        expected_digests: another run's ``step_digests``; the replay raises
            :class:`Divergence` at the first step whose decisions differ.
        capture_step: keep that step's decisions, readable, in ``captured``.
        stop_after_step: stop after this step (with ``capture_step``).
        timer_overhead: ns to remove from the measured time per timed call
            (default: :func:`timer_overhead_ns`, measured now; 0 keeps the
            raw times).

    Raises:
        ValueError: a request whose arrival time is not a number from 0 to
            :data:`~kvcy.sim.traces.MAX_ARRIVAL_MS`, or that arrives before
            the request ahead of it in the trace.
        Divergence: see ``expected_digests``.
        RuntimeError: the loop stopped making progress (a manager bug): a
            step that schedules nothing, or more steps without a finished
            request than the oldest running request can take (it gets at
            least one token a step and is never the one preempted unless it
            runs alone, so it finishes within ``max_model_len`` steps).
    """
    timer_overhead, hasher, max_model_len, accepted = _prepare(trace, config, timer_overhead)
    mgr = manager if manager is not None else build_manager(impl, config, max_model_len)
    request_cls = request_class(mgr)
    res = ReplayResult(impl=impl, trace=trace.name, config=config, max_model_len=max_model_len)
    res.rejected = len(trace) - len(accepted)
    res.requests = len(accepted)
    names = None
    if capture_step is not None or expected_digests is not None:
        names = {tr.index: tr.request_id for tr in trace}
    res.timer_overhead_ns = timer_overhead
    tier = None
    if config.cpu_offload_blocks:
        from kvcy.sim.offload import build_tier

        res.offload_impl, tier = build_tier(impl, config.cpu_offload_blocks, config.offload_policy, config.block_size)

    bar, own_bar = _progress_bar(progress, impl, len(trace))
    if bar is not None and res.rejected:
        bar.update(res.rejected)
    loop = _ReplayLoop(
        res, mgr, accepted, hasher, request_cls, tier,
        bar=bar, names=names, capture_step=capture_step, expected_digests=expected_digests,
    )
    gc.collect()
    wall0 = time.perf_counter()
    try:
        loop.run(stop_after_step)
    finally:
        if own_bar is not None:
            own_bar.close()
    res.wall_s = time.perf_counter() - wall0
    if expected_digests is not None and stop_after_step is None and loop.step != len(expected_digests):
        res.steps = loop.step
        raise Divergence(loop.step, res)
    loop.report()
    return res


def _prepare(trace: Trace, config: ReplayConfig, timer_overhead: int | None) -> tuple[int, Any, int, list[TraceRequest]]:
    """What every replay (single or fleet) starts from: the timer's cost (measured when ``None``),
    the request block hasher, ``max_model_len`` and the requests it accepts, after checking arrivals.

    Raises:
        ValueError: a negative ``timer_overhead``, or arrival times the clock cannot follow.
    """
    from kvcy.hashing import get_hash_fn_by_name, get_request_block_hasher, init_none_hash

    if timer_overhead is None:
        timer_overhead = timer_overhead_ns()
    if timer_overhead < 0:
        raise ValueError(f"timer_overhead must be >= 0 ns, got {timer_overhead}")
    _check_arrivals(trace)
    hash_fn = get_hash_fn_by_name(config.hash_algo)
    init_none_hash(hash_fn)
    hasher = get_request_block_hasher(config.block_size, hash_fn)
    max_model_len = config.resolve_max_model_len(trace)
    accepted = [tr for tr in trace if tr.num_prompt_tokens + tr.num_output_tokens <= max_model_len]
    return timer_overhead, hasher, max_model_len, accepted


def request_class(mgr: Any) -> type:
    """The ``Request`` class of ``mgr``'s twin (the compiled manager reads the compiled Request's C fields)."""
    return getattr(sys.modules.get(type(mgr).__module__), "Request", Request)


def _check_arrivals(trace: Trace) -> None:
    """Refuse times the simulated clock cannot follow (NaN never compares as arrived), before anything runs."""
    last_arrival = 0.0
    for tr in trace:
        a = tr.arrival_ms
        if isinstance(a, bool) or not isinstance(a, (int, float)) or not 0.0 <= a <= MAX_ARRIVAL_MS:
            raise ValueError(
                f"request {tr.request_id!r}: arrival_ms must be a number from 0 to {MAX_ARRIVAL_MS:g}, got {a!r}"
            )
        if a < last_arrival:
            raise ValueError(
                f"request {tr.request_id!r} arrives at {a!r} ms, before the request ahead of it ({last_arrival!r} ms): "
                "a trace is in arrival order"
            )
        last_arrival = a


def _progress_bar(progress: bool | Any, impl: str, total: int) -> tuple[Any, Any]:
    """The bar to tick (or ``None``) and the bar this replay opened and must close (or ``None``)."""
    if progress is True:
        from tqdm import tqdm

        bar = tqdm(total=total, unit="req", desc=f"replay [{impl}]", leave=False, mininterval=0.25)
        return bar, bar
    if progress is not False and progress is not None:
        return progress, None
    return None, None


class _ReplayLoop:
    """The scheduler loop of one replay, one method per phase of a step.

    :meth:`run` calls, each step: :meth:`take_arrivals`, :meth:`schedule_running`,
    :meth:`admit_waiting` (unless something was preempted), :meth:`offer_stores`
    (with a CPU tier), :meth:`advance` (the model step: sample, finish, free) and
    :meth:`end_step` (times, digest).  :meth:`report` fills the result at the
    end.  The step's decisions (``dec``), its token budget, what it scheduled and
    its timed nanoseconds live on the instance while the step runs; each phase
    binds what it uses to locals, so the timed manager calls run as they would
    in one long function.
    """

    __slots__ = (
        # Fixed for the replay.
        "res", "mgr", "hasher", "request_cls", "tier", "bar", "names", "capture_step", "expected_digests",
        "get_computed_blocks", "allocate_slots", "free", "timer_overhead", "max_model_len", "budget_per_step",
        "max_seqs", "reserve_full_isl", "step_ms", "token_ms", "stall_steps", "prebuilt",
        # The queues: not yet arrived, waiting (front first), running (oldest first).
        "pending", "waiting", "running",
        # Running totals.
        "clock", "step", "calls", "raw_ns", "off_calls", "off_raw_ns", "usage_sum", "last_finish_step",
        # This step.
        "dec", "ns", "off_ns", "step_calls0", "off_calls0", "budget", "scheduled", "preempted",
    )

    def __init__(
        self, res: ReplayResult, mgr: Any, accepted: list[TraceRequest], hasher: Any, request_cls: type, tier: Any,
        *, bar: Any, names: Mapping[int, str] | None, capture_step: int | None, expected_digests: list[bytes] | None,
    ) -> None:
        config = res.config
        self.res, self.mgr, self.hasher, self.request_cls, self.tier = res, mgr, hasher, request_cls, tier
        self.bar, self.names, self.capture_step, self.expected_digests = bar, names, capture_step, expected_digests
        self.get_computed_blocks = mgr.get_computed_blocks
        self.allocate_slots = mgr.allocate_slots
        self.free = mgr.free
        self.timer_overhead = res.timer_overhead_ns
        self.max_model_len = res.max_model_len
        self.budget_per_step = config.max_num_batched_tokens
        self.max_seqs = config.max_num_seqs
        self.reserve_full_isl = config.reserve_full_isl
        self.step_ms, self.token_ms = config.step_ms, config.token_us / 1000.0
        # The stall guard: the oldest running request finishes within
        # max_model_len steps (see replay's Raises), so more steps than that
        # without a finished request mean the loop is not getting anywhere.
        self.stall_steps = res.max_model_len + 2
        # Requests built ahead of their first look (the fleet router hashes a
        # prompt to route it), by trace index; taken by first_look.
        self.prebuilt: dict[int, Any] = {}
        self.last_finish_step = 0
        self.pending: deque[TraceRequest] = deque(accepted)
        self.waiting: deque[_Live] = deque()
        self.running: list[_Live] = []
        self.clock = self.usage_sum = 0.0
        self.step = self.calls = self.raw_ns = self.off_calls = self.off_raw_ns = 0
        self.dec: list[int] = []
        self.scheduled: list[tuple[_Live, int]] = []
        self.ns = self.off_ns = self.step_calls0 = self.off_calls0 = self.budget = 0
        self.preempted = False

    def run(self, stop_after_step: int | None) -> None:
        """Step until every request finished (or past ``stop_after_step``)."""
        while self.pending or self.waiting or self.running:
            if self.step_once() and stop_after_step is not None and self.step > stop_after_step:
                break

    @property
    def busy(self) -> bool:
        """Requests are waiting or running (pending ones have not arrived yet)."""
        return bool(self.waiting or self.running)

    def step_once(self) -> bool:
        """One scheduler step; ``False``: the engine was idle and the clock jumped to the next arrival instead.

        The fleet replay (:mod:`kvcy.sim.fleet`) drives several loops with
        this, one step at a time, in simulated-time order.
        """
        if not self.take_arrivals():
            return False
        self.dec = []
        self.ns = self.off_ns = 0
        self.off_calls0 = self.off_calls
        self.step_calls0 = self.calls
        self.budget = self.budget_per_step
        self.scheduled = []
        self.preempted = False
        self.schedule_running()
        if not self.preempted:
            self.admit_waiting()
        if not self.scheduled:
            raise RuntimeError(
                f"the scheduler made no progress at step {self.step} "
                f"({len(self.running)} running, {len(self.waiting)} waiting)"
            )
        usage = self.mgr.usage
        self.usage_sum += usage
        if usage > self.res.peak_usage:
            self.res.peak_usage = usage
        if self.tier is not None:
            self.offer_stores()
        num_scheduled = self.advance()
        self.end_step()
        self.step += 1
        self.clock += self.step_ms + self.token_ms * num_scheduled
        return True

    def take_arrivals(self) -> bool:
        """Requests whose arrival time has passed join the waiting queue; ``False``: idle, the clock jumped."""
        pending, waiting, clock = self.pending, self.waiting, self.clock
        while pending and pending[0].arrival_ms <= clock:
            waiting.append(_Live(pending.popleft()))
        if waiting or self.running:
            return True
        self.clock = pending[0].arrival_ms  # idle: jump to the next arrival
        if not pending[0].arrival_ms <= self.clock:  # pragma: no cover - arrivals are checked before the loop
            raise RuntimeError(f"the simulated clock cannot reach the arrival of {pending[0].request_id!r}")
        return False

    def schedule_running(self) -> None:
        """Running requests, in order, while the budget lasts: the rest of the prefill or one decode token.

        When ``allocate_slots`` refuses, the last running request is preempted
        (freed, to the front of the waiting queue) and the allocation retried;
        when that was the current request, scheduling stops.
        """
        running, waiting, dec, scheduled, res = self.running, self.waiting, self.dec, self.scheduled, self.res
        perf = time.perf_counter_ns
        allocate_slots, free = self.allocate_slots, self.free
        PREEMPTED = RequestStatus.PREEMPTED
        max_model_len = self.max_model_len
        budget = self.budget
        ns = 0
        calls = self.calls
        i = 0
        while i < len(running) and budget > 0:
            live = running[i]
            req = live.req
            n = req.num_tokens - req.num_computed_tokens
            if n > budget:
                n = budget
            cap = max_model_len - 1 - req.num_computed_tokens
            if n > cap:
                n = cap
            if n <= 0:
                i += 1
                continue
            while True:
                t0 = perf()
                new = allocate_slots(req, n)
                ns += perf() - t0
                calls += 1
                if new is not None:
                    break
                victim = running.pop()
                vreq = victim.req
                t0 = perf()
                free(vreq)
                ns += perf() - t0
                calls += 1
                vreq.status = PREEMPTED
                vreq.num_computed_tokens = 0
                vreq.num_preemptions += 1
                waiting.appendleft(victim)
                res.preemptions += 1
                self.preempted = True
                dec += (_PREEMPT, victim.trace.index)
                if victim is live:
                    break
            if new is None:
                break
            dec += (_ALLOC, live.trace.index, n)
            _put_ids(dec, new.get_block_ids())
            scheduled.append((live, n))
            budget -= n
            i += 1
        self.budget = budget
        self.ns += ns
        self.calls = calls

    def first_look(self, live: _Live) -> Any:
        """Build a waiting request's ``Request`` (tokens, block hashes) and its CPU-tier state."""
        tr = live.trace
        req = self.prebuilt.pop(tr.index, None)
        if req is None:
            req = self.request_cls(
                tr.request_id,
                tr.prompt_token_ids(),
                max_tokens=tr.num_output_tokens,
                block_hasher=self.hasher,
                arrival_time=tr.arrival_ms / 1000.0,
            )
        live.req = req
        live.outputs = tr.output_token_ids()
        if self.tier is not None:
            perf = time.perf_counter_ns
            t0 = perf()
            live.off = self.tier.new_request(tr.request_id, tr.num_prompt_tokens, tr.index)
            self.off_ns += perf() - t0
            self.off_calls += 1
        return req

    def admit_waiting(self) -> None:
        """Waiting requests, front first, while the budget lasts and fewer than ``max_num_seqs`` run.

        Admission stops at the first request :meth:`admit` refuses.
        """
        waiting, running, max_seqs = self.waiting, self.running, self.max_seqs
        while waiting and self.budget > 0 and len(running) < max_seqs:
            live = waiting[0]
            if not self.admit(live):
                break
            waiting.popleft()
            running.append(live)

    def admit(self, live: _Live) -> bool:
        """Admit one waiting request, or return ``False`` when the pool refuses it.

        ``get_computed_blocks``, then (with a CPU tier) the tier's lookup, then
        ``allocate_slots`` with the hits; on success the tier loads its hit.
        """
        req = live.req
        if req is None:
            req = self.first_look(live)
        dec, tier, running, res = self.dec, self.tier, self.running, self.res
        perf = time.perf_counter_ns
        get_computed_blocks, allocate_slots = self.get_computed_blocks, self.allocate_slots
        reserve_full_isl, budget = self.reserve_full_isl, self.budget
        t0 = perf()
        blocks, hit, _boundary = get_computed_blocks(req)
        ns = perf() - t0
        dec += (_LOOKUP, live.trace.index, hit)
        _put_ids(dec, blocks.get_block_ids())
        if tier is None:
            ext = 0
            n = req.num_tokens - hit
            if n > budget:
                n = budget
            t0 = perf()
            new = allocate_slots(req, n, num_new_computed_tokens=hit, new_computed_blocks=blocks,
                                 num_lookahead_tokens=0, full_sequence_must_fit=reserve_full_isl,
                                 has_scheduled_reqs=bool(running))
            ns += perf() - t0
        else:
            t0 = perf()
            ext = tier.lookup(live.off, req, hit, dec)
            off_ns = perf() - t0
            n = req.num_tokens - hit - ext
            if n > budget:
                n = budget
            t0 = perf()
            new = allocate_slots(req, n, num_new_computed_tokens=hit, new_computed_blocks=blocks,
                                 num_lookahead_tokens=0, num_external_computed_tokens=ext,
                                 full_sequence_must_fit=reserve_full_isl, has_scheduled_reqs=bool(running))
            ns += perf() - t0
            self.off_calls += 1
            if new is not None:
                t0 = perf()
                tier.allocated(live.off, hit + ext, dec)  # loads the CPU hit, if any
                off_ns += perf() - t0
                self.off_calls += 1
            self.off_ns += off_ns
        self.ns += ns
        self.calls += 2
        dec += (_ALLOC, live.trace.index, n)
        _put_ids(dec, None if new is None else new.get_block_ids())
        if new is None:
            return False
        self.mgr.record_prefix_cache_stats(req, hit)  # (as vLLM's scheduler: once, at admission)
        req.status = RequestStatus.RUNNING
        req.num_computed_tokens = hit + ext
        if req.num_preemptions:
            res.recompute_query_tokens += req.num_tokens
            res.recompute_hit_tokens += hit
            res.recompute_cpu_hit_tokens += ext
        else:
            res.query_tokens += req.num_tokens
            res.hit_tokens += hit
            res.cpu_hit_tokens += ext
        self.scheduled.append((live, n))
        self.budget = budget - n
        return True

    def offer_stores(self) -> None:
        """The CPU tier's store offers (the connector's build_connector_meta).

        This step's blocks, then the ends of the requests that finished last step.
        """
        tier, dec = self.tier, self.dec
        perf = time.perf_counter_ns
        t0 = perf()
        tier.build_connector_meta(self.scheduled, dec)
        self.off_ns += perf() - t0
        self.off_calls += 1

    def advance(self) -> int:
        """The model step: computed tokens advance, completed prefills and decodes sample, finished requests free.

        Returns the tokens scheduled this step.
        """
        dec, res, tier, bar, mgr = self.dec, self.res, self.tier, self.bar, self.mgr
        perf = time.perf_counter_ns
        free = self.free
        FINISHED = RequestStatus.FINISHED_LENGTH_CAPPED
        scheduled = self.scheduled
        num_scheduled = 0
        done = False
        for live, n in scheduled:
            num_scheduled += n
            live.req.num_computed_tokens += n
        for live, n in scheduled:
            req = live.req
            if req.num_computed_tokens < req.num_tokens:
                continue  # a prefill chunk
            req.append_output_token_ids(live.outputs[req.num_output_tokens])
            if req.num_output_tokens >= live.trace.num_output_tokens:
                req.status = FINISHED
                dec += (_FINISH, live.trace.index)
                _put_ids(dec, mgr.get_block_ids(req.request_id))
                t0 = perf()
                free(req)
                self.ns += perf() - t0
                self.calls += 1
                res.finished += 1
                res.prompt_tokens += req.num_prompt_tokens
                res.output_tokens += req.num_output_tokens
                if tier is not None:
                    tier.finished(live.off)
                live.req = None  # drop the tokens
                live.outputs = []
                done = True
                if bar is not None:
                    bar.update(1)
        step = self.step
        if done:
            self.running = [lv for lv in self.running if lv.req is not None]
            self.last_finish_step = step
        elif step - self.last_finish_step > self.stall_steps:
            raise RuntimeError(
                f"the scheduler made no progress: no request finished in {step - self.last_finish_step:,} steps "
                f"(step {step}, {len(self.running)} running, {len(self.waiting)} waiting, "
                f"max_model_len {self.max_model_len:,})"
            )
        return num_scheduled

    def end_step(self) -> None:
        """Record the step's manager (and CPU-tier) time less the timer's cost, and its decisions digest.

        Raises:
            Divergence: the digest is not the expected one.
        """
        res, tier, dec, step = self.res, self.tier, self.dec, self.step
        timer_overhead = self.timer_overhead
        ns = self.ns
        self.raw_ns += ns
        ns -= (self.calls - self.step_calls0) * timer_overhead
        res.step_ns.append(ns if ns > 0 else 0)
        if tier is not None:
            perf = time.perf_counter_ns
            t0 = perf()
            tier.step_end()  # the worker reports this step's stores and loads done
            if not (self.pending or self.waiting or self.running) and tier.has_pending:
                # The last step: the requests that finished in it end now
                # rather than at a next step that never comes.
                tier.end_previous(dec)
                tier.step_end()
            off_ns = self.off_ns + perf() - t0
            self.off_calls += 1
            self.off_raw_ns += off_ns
            off_ns -= (self.off_calls - self.off_calls0) * timer_overhead
            res.offload_step_ns.append(off_ns if off_ns > 0 else 0)
        digest = hashlib.blake2b(array("q", dec).tobytes(), digest_size=8).digest()
        res.step_digests.append(digest)
        if self.capture_step == step:
            res.captured = decode_decisions(dec, self.names)
        expected = self.expected_digests
        if expected is not None and (step >= len(expected) or expected[step] != digest):
            res.captured = decode_decisions(dec, self.names)
            res.steps = step + 1
            raise Divergence(step, res)

    def report(self) -> None:
        """Fill the result's totals and the manager's (and CPU tier's) counters once the loop is done."""
        res, mgr, tier, step = self.res, self.mgr, self.tier, self.step
        res.steps = step
        res.sim_time_s = self.clock / 1000.0
        res.mean_usage = self.usage_sum / step if step else 0.0
        res.manager_calls = self.calls
        res.manager_ns = sum(res.step_ns)
        res.manager_ns_raw = self.raw_ns
        res.free_blocks_at_end = mgr.block_pool.get_num_free_blocks()
        if tier is not None:
            res.offload_calls = self.off_calls
            res.offload_ns = sum(res.offload_step_ns)
            res.offload_ns_raw = self.off_raw_ns
            res.cpu_blocks_loaded = tier.blocks_loaded
            res.cpu_blocks_stored = tier.blocks_stored
            res.cpu_evictions = tier.evictions
            res.cpu_stores_refused = tier.stores_refused
        res.evictions = getattr(mgr.block_pool, "num_evictions", None)
        stats = mgr.make_prefix_cache_stats() if hasattr(mgr, "make_prefix_cache_stats") else None
        if stats is not None:
            res.manager_prefix_cache_stats = {
                k: int(getattr(stats, k))
                for k in ("requests", "queries", "hits", "preempted_requests", "preempted_queries", "preempted_hits")
                if hasattr(stats, k)
            }
