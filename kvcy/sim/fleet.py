"""The fleet replay: a trace split across N simulated instances by a router.

Each instance is the single replay's scheduler loop (:class:`~kvcy.sim.scheduler._ReplayLoop`)
around its own ``KVCacheManager`` with KV events on.  After every step an
instance publishes the events its manager produced as one ``KVEventBatch``;
a :class:`~kvcy.kv_index.KVIndex` on the router's side applies them as they
arrive.  A request is routed when it arrives (on the simulated clock) to one
instance, chosen by the router:

* ``round-robin``: instance ``k mod N`` for the ``k``-th request;
* ``least-loaded``: the instance with the fewest outstanding requests (routed,
  waiting or running), then the fewest outstanding tokens, then the lowest
  index;
* ``kv``: the instance that minimises the tokens it would have to process,
  ``prompt tokens - cached prefix tokens`` (the index's longest prefix on that
  instance) ``+ outstanding tokens``: a long cached prefix wins unless that
  instance is already much busier (the cost Dynamo's KV router and llm-d's
  scorer weigh, in its simplest form).

Instances step in simulated-time order (the one with the earliest clock next;
an arrival is routed before any step that starts after it), so a fleet replay
is one deterministic interleaving of N single replays.  Transports:

* ``zmq``: each instance has a :class:`~kvcy.kv_events.ZmqEventPublisher` on a
  loopback TCP port and the router's :class:`~kvcy.kv_events.EventSubscriber`
  receives from all of them; before each routing decision the subscriber
  applies whatever has arrived by then, so the index lags the instances by
  the sockets' real delay (the hit rate can vary a little between runs);
* ``direct``: a batch is applied to the index as it is published (no sockets,
  no lag: fully deterministic; the tests use it).

The result gives, per router: the fleet's prefix-cache hit rate (hits over the
prompt tokens of first admissions, summed over instances), the load balance
(requests and prompt tokens per instance), the event stream's figures (batches,
events, drops, replays, lag) and the index's size.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from kvcy.sim.scheduler import ReplayConfig, ReplayResult, _ReplayLoop, build_manager, request_class
from kvcy.sim.traces import Trace, TraceRequest

__all__ = ["MAX_INSTANCES", "ROUTERS", "TRANSPORTS", "FleetConfig", "FleetResult", "replay_fleet"]

#: The routers ``kvcy replay --router`` takes.
ROUTERS = ("kv", "round-robin", "least-loaded")
#: How instances' events reach the router's index.
TRANSPORTS = ("zmq", "direct")
#: Most instances a fleet replay builds.
MAX_INSTANCES = 256


@dataclass(frozen=True)
class FleetConfig:
    """How the trace is split.

    Attributes:
        instances: how many instances (each with the replay config's pool).
        router: one of :data:`ROUTERS`.
        transport: one of :data:`TRANSPORTS`.
        index_max_blocks: bound on the index's entries (``None``: unbounded).
    """

    instances: int
    router: str = "kv"
    transport: str = "zmq"
    index_max_blocks: int | None = None

    def __post_init__(self) -> None:
        if isinstance(self.instances, bool) or not isinstance(self.instances, int):
            raise TypeError(f"instances must be an int, got {self.instances!r}")
        if not 1 <= self.instances <= MAX_INSTANCES:
            raise ValueError(f"instances must be from 1 to {MAX_INSTANCES}, got {self.instances}")
        if self.router not in ROUTERS:
            raise ValueError(f"router must be one of {', '.join(ROUTERS)}, got {self.router!r}")
        if self.transport not in TRANSPORTS:
            raise ValueError(f"transport must be one of {', '.join(TRANSPORTS)}, got {self.transport!r}")
        m = self.index_max_blocks
        if m is not None and (isinstance(m, bool) or not isinstance(m, int) or m < 1):
            raise ValueError(f"index_max_blocks must be a positive int or None, got {m!r}")


@dataclass
class FleetResult:
    """What a fleet replay did.

    ``instances`` holds each instance's own :class:`ReplayResult` (its hits,
    steps and manager time); the fleet-wide figures are sums over them.
    ``route_ns`` is the router's own time (hashes to index query to
    choice), ``apply_ns`` the time spent receiving and applying event batches
    to the index before routing decisions.  ``predicted_hit_tokens`` is what the index said the chosen instance held
    when the request was routed (``kv`` router; for the others, what it
    would have said), against ``hit_tokens`` that the instance's manager
    then found.
    """

    impl: str
    trace: str
    config: ReplayConfig
    fleet: FleetConfig
    instances: list[ReplayResult]
    routed: list[int] = field(default_factory=list)
    routed_tokens: list[int] = field(default_factory=list)
    predicted_hit_tokens: int = 0
    route_ns: int = 0
    apply_ns: int = 0
    events: dict[str, Any] = field(default_factory=dict)
    index: dict[str, Any] = field(default_factory=dict)
    wall_s: float = 0.0

    @property
    def query_tokens(self) -> int:
        return sum(r.query_tokens for r in self.instances)

    @property
    def hit_tokens(self) -> int:
        return sum(r.hit_tokens for r in self.instances)

    @property
    def hit_rate(self) -> float:
        """Prefix-cache hits over prompt tokens of first admissions, over the whole fleet."""
        q = self.query_tokens
        return self.hit_tokens / q if q else 0.0

    @property
    def finished(self) -> int:
        return sum(r.finished for r in self.instances)

    @property
    def imbalance(self) -> float:
        """Most prompt tokens routed to one instance over the mean (1.0: even)."""
        t = self.routed_tokens
        mean = sum(t) / len(t) if t else 0.0
        return max(t) / mean if mean else 1.0


class _DirectTransport:
    """Batches go straight into the index as they are published."""

    def __init__(self, index: Any, names: list[str]) -> None:
        self.index, self.names = index, names
        self.batches = self.num_events = 0

    def publish(self, i: int, batch: Any) -> None:
        self.batches += 1
        self.num_events += len(batch.events)
        self.index.apply_batch(self.names[i], batch)

    def drain(self) -> None:
        pass

    def finish(self) -> None:
        pass

    def close(self) -> None:
        pass

    def stats(self) -> dict[str, Any]:
        return {"transport": "direct", "complete": True, "batches_published": self.batches,
                "events_published": self.num_events,
                "batches_applied": self.batches, "batches_dropped": 0, "batches_replayed": 0,
                "lag_ms_p50": 0.0, "lag_ms_p99": 0.0, "lag_ms_max": 0.0}


def _outstanding(loop: _ReplayLoop) -> tuple[int, int]:
    """(requests, tokens still to compute) of one instance: routed but not arrived, waiting and running."""
    n = len(loop.pending) + len(loop.waiting) + len(loop.running)
    tokens = 0
    for tr in loop.pending:
        tokens += tr.num_prompt_tokens + tr.num_output_tokens
    for live in loop.waiting:
        req = live.req
        if req is None:
            tokens += live.trace.num_prompt_tokens + live.trace.num_output_tokens
        else:
            tokens += req.num_tokens - req.num_computed_tokens + live.trace.num_output_tokens - req.num_output_tokens
    for live in loop.running:
        req = live.req
        tokens += req.num_tokens - req.num_computed_tokens + live.trace.num_output_tokens - req.num_output_tokens
    return n, tokens


def replay_fleet(
    trace: Trace,
    config: ReplayConfig,
    fleet: FleetConfig,
    impl: str = "cython",
    *,
    progress: bool | Any = False,
    timer_overhead: int | None = None,
) -> FleetResult:
    """Replay ``trace`` across ``fleet.instances`` instances, each with ``config``'s pool; see the module doc.

    Raises:
        ValueError: ``config`` has a CPU tier (the fleet replay has none yet)
            or no prefix caching (nothing to route by); bad arrival times as
            :func:`~kvcy.sim.scheduler.replay`.
        RuntimeError: an instance's loop stopped making progress.
    """
    from kvcy.kv_events import KVEventBatch
    from kvcy.kv_index import KVIndex
    from kvcy.sim.scheduler import _prepare, _progress_bar

    if config.cpu_offload_blocks:
        raise ValueError("the fleet replay has no CPU tier: drop --cpu-offload or --instances")
    if not config.enable_caching:
        raise ValueError("the fleet replay routes by cached prefixes: it needs prefix caching")
    timer_overhead, hasher, max_model_len, accepted_list = _prepare(trace, config, timer_overhead)
    n = fleet.instances
    names = [f"instance-{i}" for i in range(n)]
    bar, own_bar = _progress_bar(progress, impl, len(trace))

    loops = [_instance_loop(trace, config, impl, hasher, max_model_len, timer_overhead, bar) for _ in range(n)]
    use_int = bool(loops[0].mgr.block_pool.use_int_block_hashes)
    index = KVIndex(max_blocks=fleet.index_max_blocks)
    transport = _make_transport(fleet, index, names)

    out = FleetResult(impl=impl, trace=trace.name, config=config, fleet=fleet,
                      instances=[lp.res for lp in loops], routed=[0] * n, routed_tokens=[0] * n)
    accepted: deque[TraceRequest] = deque(accepted_list)
    rejected = len(trace) - len(accepted)
    if bar is not None and rejected:
        bar.update(rejected)
    wall0 = time.perf_counter()
    k = 0
    try:
        while True:
            t_next, nxt = _next_instance(loops)
            if accepted and (t_next is None or accepted[0].arrival_ms <= t_next):
                tr = accepted.popleft()
                # (the request is built, and its prompt hashed, once: the
                # chosen instance takes it over)
                req = loops[0].request_cls(tr.request_id, tr.prompt_token_ids(), max_tokens=tr.num_output_tokens,
                                           block_hasher=hasher, arrival_time=tr.arrival_ms / 1000.0)
                choice = _route(out, fleet.router, k, tr, req, loops, names, transport, index, use_int,
                                config.block_size)
                k += 1
                _hand_over(out, loops[choice], choice, tr, req)
                continue
            if nxt < 0:
                break
            lp = loops[nxt]
            if lp.step_once():
                events = lp.mgr.take_events()
                if events:
                    transport.publish(nxt, KVEventBatch(ts=time.time(), events=events))
        transport.finish()
    finally:
        transport.close()
        if own_bar is not None:
            own_bar.close()
    out.wall_s = time.perf_counter() - wall0
    for lp in loops:
        lp.report()
    if rejected:
        out.instances[0].rejected = rejected
    out.events = transport.stats()
    out.index = _index_summary(index, names, loops)
    return out


def _instance_loop(
    trace: Trace, config: ReplayConfig, impl: str, hasher: Any, max_model_len: int, timer_overhead: int, bar: Any
) -> _ReplayLoop:
    """One instance: the replay's scheduler loop around its own manager, KV events on."""
    mgr = build_manager(impl, config, max_model_len, kv_events=True)
    res = ReplayResult(impl=impl, trace=trace.name, config=config, max_model_len=max_model_len)
    res.timer_overhead_ns = timer_overhead
    return _ReplayLoop(res, mgr, [], hasher, request_class(mgr), None, bar=bar, names=None,
                       capture_step=None, expected_digests=None)


def _make_transport(fleet: FleetConfig, index: Any, names: list[str]) -> Any:
    """How the instances' event batches reach the router's index: at once, or over ZeroMQ."""
    if fleet.transport == "direct":
        return _DirectTransport(index, names)
    from kvcy.sim.fleet_zmq import ZmqTransport

    return ZmqTransport(index, names)


def _next_instance(loops: list[_ReplayLoop]) -> tuple[float | None, int]:
    """The instance whose next step starts first, and when (an idle one with a routed request
    starts at that request's arrival); ``(None, -1)`` when every instance is done."""
    t_next, nxt = None, -1
    for i, lp in enumerate(loops):
        if lp.waiting or lp.running:
            t = lp.clock
        elif lp.pending:
            t = max(lp.clock, lp.pending[0].arrival_ms)
        else:
            continue
        if t_next is None or t < t_next:
            t_next, nxt = t, i
    return t_next, nxt


def _route(
    out: FleetResult,
    router: str,
    k: int,
    tr: TraceRequest,
    req: Any,
    loops: list[_ReplayLoop],
    names: list[str],
    transport: Any,
    index: Any,
    use_int: bool,
    block_size: int,
) -> int:
    """The instance for the ``k``-th routed request: the index first takes in the batches that
    have arrived, then the router chooses (both timed into ``out``)."""
    from kvcy.kv_events import external_block_hash

    perf = time.perf_counter_ns
    n = len(loops)
    t0 = perf()
    transport.drain()
    t1 = perf()
    out.apply_ns += t1 - t0
    hashes = [external_block_hash(h, use_int) for h in req.block_hashes]
    held = index.longest_prefix(hashes)
    if router == "round-robin":
        choice = k % n
    else:  # (loads only where the router reads them)
        loads = [_outstanding(lp) for lp in loops]
        if router == "least-loaded":
            choice = min(range(n), key=lambda j: (loads[j][0], loads[j][1], j))
        else:
            prompt = tr.num_prompt_tokens
            choice = min(range(n), key=lambda j: (
                prompt - min(prompt, held.get(names[j], 0) * block_size) + loads[j][1], j))
    out.route_ns += perf() - t1
    out.predicted_hit_tokens += min(tr.num_prompt_tokens, held.get(names[choice], 0) * block_size)
    return choice


def _hand_over(out: FleetResult, lp: _ReplayLoop, choice: int, tr: TraceRequest, req: Any) -> None:
    """Give the routed request (built and hashed once, by the router) to instance ``choice``."""
    out.routed[choice] += 1
    out.routed_tokens[choice] += tr.num_prompt_tokens
    lp.prebuilt[tr.index] = req
    lp.pending.append(tr)
    lp.res.requests += 1


def _index_summary(index: Any, names: list[str], loops: list[_ReplayLoop]) -> dict[str, Any]:
    """What the index says each instance holds, beside what its pool caches (distinct cache
    keys): equal once every batch has been applied."""
    return {"instances": len(index.instances), "blocks": index.num_blocks(), "memory_bytes": index.memory_bytes,
            "per_instance_blocks": [index.num_blocks(name) if name in index.instances else 0 for name in names],
            "per_instance_cached": [len(lp.mgr.block_pool.cached_block_hash_to_block) for lp in loops],
            "stats": dict(index.stats)}
