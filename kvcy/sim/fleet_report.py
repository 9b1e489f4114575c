"""The fleet replay's report: one JSON-able dict per run of routers, and the table printed from it."""

from __future__ import annotations

from typing import Any

from kvcy.sim.fleet import FleetResult
from kvcy.sim.report import _bytes, _pct, format_duration
from kvcy.sim.traces import Trace, hit_rate_upper_bound

__all__ = ["build_fleet_report", "format_fleet_report"]


def _spread(values: list[int]) -> dict[str, Any]:
    mean = sum(values) / len(values) if values else 0.0
    return {"per_instance": list(values), "min": min(values, default=0), "max": max(values, default=0),
            "max_over_mean": (max(values) / mean) if mean else 1.0}


def build_fleet_report(trace: Trace, results: list[FleetResult]) -> dict[str, Any]:
    """Everything the fleet replays measured (one result per router), as plain JSON types."""
    if not results:
        raise ValueError("no fleet results to report")
    r0 = results[0]
    cfg = r0.config
    routers = {}
    for r in results:
        mgr_s = sum(x.manager_ns for x in r.instances) / 1e9
        routers[r.fleet.router] = {
            "hit_rate": r.hit_rate,
            "hit_tokens": r.hit_tokens,
            "query_tokens": r.query_tokens,
            "predicted_hit_tokens": r.predicted_hit_tokens,
            "finished": r.finished,
            "requests": _spread(r.routed),
            "prompt_tokens": _spread(r.routed_tokens),
            "preemptions": sum(x.preemptions for x in r.instances),
            "steps": [x.steps for x in r.instances],
            "simulated_time_s": max((x.sim_time_s for x in r.instances), default=0.0),
            "manager_cpu_s": mgr_s,
            "routing_cpu_s": r.route_ns / 1e9,
            "event_apply_cpu_s": r.apply_ns / 1e9,
            "events": r.events,
            "index": r.index,
            "wall_s": r.wall_s,
        }
    return {
        "trace": {"name": trace.name, "requests_replayed": len(trace)},
        "fleet": {
            "instances": r0.fleet.instances,
            "transport": r0.fleet.transport,
            "impl": r0.impl,
            "num_blocks_per_instance": cfg.num_blocks,
            "block_size": cfg.block_size,
            "hash": cfg.hash_algo,
            "index_max_blocks": r0.fleet.index_max_blocks,
        },
        "hit_rate_upper_bound": hit_rate_upper_bound(trace, cfg.block_size),
        "rejected": r0.instances[0].rejected if r0.instances else 0,
        "routers": routers,
    }


def format_fleet_report(rep: dict[str, Any]) -> str:
    """The fleet report as an aligned text table, one column per router."""
    f = rep["fleet"]
    names = list(rep["routers"])
    lines = [
        f"kvcy replay --instances {f['instances']}: {rep['trace']['name']} ({rep['trace']['requests_replayed']:,} requests)",
        f"  {f['instances']} instances x {f['num_blocks_per_instance']:,} blocks x {f['block_size']} tokens, "
        f"hash {f['hash']}, {f['impl']} managers, events over {f['transport']}",
        "",
    ]
    width = 30
    col = max(16, *(len(n) + 2 for n in names))
    lines.append(f"{'router':<{width}}" + "".join(f"{n:>{col}}" for n in names))

    def row(label: str, fn) -> None:
        lines.append(f"{label:<{width}}" + "".join(f"{fn(rep['routers'][n]):>{col}}" for n in names))

    row("prefix-cache hit rate", lambda d: _pct(d["hit_rate"]))
    row("  index predicted", lambda d: _pct(d["predicted_hit_tokens"] / d["query_tokens"]) if d["query_tokens"] else "-")
    row("requests per instance", lambda d: f"{d['requests']['min']:,}-{d['requests']['max']:,}")
    row("prompt tokens, max/mean", lambda d: f"{d['prompt_tokens']['max_over_mean']:.2f}")
    row("preemptions", lambda d: f"{d['preemptions']:,}")
    row("simulated time", lambda d: f"{d['simulated_time_s']:,.1f} s")
    row("event batches", lambda d: f"{d['events'].get('batches_published', 0):,}")
    row("  events", lambda d: f"{d['events'].get('events_published', 0):,}")
    row("  dropped / lost / replayed", lambda d: f"{d['events'].get('batches_dropped', 0)}/"
        f"{d['events'].get('batches_lost', 0)}/{d['events'].get('batches_replayed', 0)}")
    row("  index caught up", lambda d: {True: "yes", False: "NO", None: "-"}[d["events"].get("complete")])
    row("  lag p50 / p99", lambda d: f"{d['events'].get('lag_ms_p50', 0):.2f}/{d['events'].get('lag_ms_p99', 0):.2f} ms")
    row("index blocks", lambda d: f"{d['index']['blocks']:,}")
    row("index memory", lambda d: _bytes(d["index"]["memory_bytes"]).strip(" ()") or "0 B")
    row("routing CPU time", lambda d: format_duration(d["routing_cpu_s"]))
    row("receiving + applying events", lambda d: format_duration(d["event_apply_cpu_s"]))
    row("manager CPU time", lambda d: format_duration(d["manager_cpu_s"]))
    row("wall time", lambda d: format_duration(d["wall_s"]))
    bound = rep.get("hit_rate_upper_bound")
    if bound is not None:
        lines.append(f"{'upper bound':<{width}}{_pct(bound)} if every earlier prompt block stayed cached")
    if rep.get("rejected"):
        lines.append(f"{'rejected':<{width}}{rep['rejected']:,} (longer than max_model_len)")
    return "\n".join(lines)
