"""The replay report: one JSON-able dict, and the table printed from it."""

from __future__ import annotations

from typing import Any

from kvcy.sim.scheduler import ReplayResult
from kvcy.sim.traces import Trace, hit_rate_upper_bound

__all__ = ["build_report", "format_report", "format_duration"]


def _per_step(res: ReplayResult) -> dict[str, float]:
    n = len(res.step_ns)
    return {
        "mean_us": (res.manager_ns / n / 1e3) if n else 0.0,
        "p50_us": res.step_ns_percentile(50) / 1e3,
        "p99_us": res.step_ns_percentile(99) / 1e3,
        "max_us": (max(res.step_ns) / 1e3) if n else 0.0,
    }


def build_report(trace: Trace, results: list[ReplayResult], identical: bool | None = None) -> dict[str, Any]:
    """Everything the replay measured, as plain JSON types.

    The workload and cache numbers come from the first result (with
    ``identical`` true every implementation made the same decisions, so they
    are the same); timings are per implementation.  ``speedup`` is Python's
    manager CPU time over Cython's when both ran; ``speedup_timer_included``
    the same with the timer's own cost left in the times.
    """
    if not results:
        raise ValueError("no replay results to report")
    r = results[0]
    cfg = r.config
    impls: dict[str, Any] = {}
    for res in results:
        impls[res.impl] = {
            "manager_cpu_s": res.manager_ns / 1e9,
            "manager_cpu_s_timer_included": res.manager_ns_raw / 1e9,
            "timer_overhead_ns_per_call": res.timer_overhead_ns,
            "manager_calls": res.manager_calls,
            "per_step": _per_step(res),
            "replay_wall_s": res.wall_s,
            "decisions_digest": res.decisions_digest,
        }
    speedup = speedup_raw = None
    by = {res.impl: res for res in results}
    if "cython" in by and "python" in by and by["cython"].manager_ns > 0:
        speedup = by["python"].manager_ns / by["cython"].manager_ns
        if by["cython"].manager_ns_raw > 0:
            speedup_raw = by["python"].manager_ns_raw / by["cython"].manager_ns_raw
    return {
        "trace": {
            "name": trace.name,
            "source": trace.source,
            "requests_in_source": trace.total_in_source,
            "requests_replayed": len(trace),
        },
        "config": {
            "num_blocks": cfg.num_blocks,
            "block_size": cfg.block_size,
            "pool_tokens": cfg.pool_tokens,
            "hash": cfg.hash_algo,
            "max_num_seqs": cfg.max_num_seqs,
            "max_num_batched_tokens": cfg.max_num_batched_tokens,
            "max_model_len": r.max_model_len,
            "step_ms": cfg.step_ms,
            "token_us": cfg.token_us,
            "enable_caching": cfg.enable_caching,
            "reserve_full_isl": cfg.reserve_full_isl,
        },
        "requests": {"admitted": r.requests, "finished": r.finished, "rejected": r.rejected},
        "tokens": {"prompt": r.prompt_tokens, "output": r.output_tokens},
        "prefix_cache": {
            "hit_rate": r.hit_rate,
            "hit_rate_upper_bound": hit_rate_upper_bound(trace, cfg.block_size),
            "hit_tokens": r.hit_tokens,
            "query_tokens": r.query_tokens,
            "recompute_hit_tokens": r.recompute_hit_tokens,
            "recompute_query_tokens": r.recompute_query_tokens,
            "manager_stats": r.manager_prefix_cache_stats,
        },
        "evictions": r.evictions,
        "preemptions": r.preemptions,
        "usage": {"peak": r.peak_usage, "mean": r.mean_usage},
        "steps": r.steps,
        "simulated_time_s": r.sim_time_s,
        "free_blocks_at_end": r.free_blocks_at_end,
        "implementations": impls,
        "speedup": speedup,
        "speedup_timer_included": speedup_raw,
        "identical_decisions": identical,
    }


def format_duration(seconds: float) -> str:
    """``1.23 s``, ``45.6 ms`` or ``789 µs``."""
    if seconds >= 1.0:
        return f"{seconds:.2f} s"
    if seconds >= 1e-3:
        return f"{seconds * 1e3:.1f} ms"
    return f"{seconds * 1e6:.0f} µs"


def _pct(x: float) -> str:
    return f"{100.0 * x:.1f} %"


def format_report(rep: dict[str, Any]) -> str:
    """The report as an aligned text table."""
    t, c, pc = rep["trace"], rep["config"], rep["prefix_cache"]
    lines: list[str] = []
    subset = ""
    if t["requests_replayed"] != t["requests_in_source"]:
        subset = f" (first {t['requests_replayed']:,} of {t['requests_in_source']:,} requests)"
    lines.append(f"kvcy replay: {t['name']}{subset}")
    lines.append(
        f"  pool {c['num_blocks']:,} blocks x {c['block_size']} tokens ({c['pool_tokens']:,} tokens), "
        f"hash {c['hash']}, max {c['max_num_seqs']} running, {c['max_num_batched_tokens']:,} tokens/step, "
        f"max_model_len {c['max_model_len']:,}"
    )
    lines.append("")
    rq = rep["requests"]
    rows = [
        ("requests", f"{rq['finished']:,} finished of {rq['admitted']:,}"
         + (f" ({rq['rejected']:,} rejected: longer than max_model_len)" if rq["rejected"] else "")),
        ("prompt tokens", f"{rep['tokens']['prompt']:,}"),
        ("output tokens", f"{rep['tokens']['output']:,}"),
        ("prefix-cache hit rate", f"{_pct(pc['hit_rate'])} of prompt tokens "
         f"({pc['hit_tokens']:,} of {pc['query_tokens']:,})"),
        *([("  upper bound", f"{_pct(pc['hit_rate_upper_bound'])} if every earlier prompt block stayed cached")]
          if pc.get("hit_rate_upper_bound") is not None else []),
        ("evictions", "n/a" if rep["evictions"] is None else f"{rep['evictions']:,} cached blocks"),
        ("preemptions", f"{rep['preemptions']:,}"
         + (f" (re-admissions hit {_pct(pc['recompute_hit_tokens'] / pc['recompute_query_tokens'])})"
            if pc["recompute_query_tokens"] else "")),
        ("KV-cache usage", f"peak {_pct(rep['usage']['peak'])}, mean {_pct(rep['usage']['mean'])}"),
        ("steps", f"{rep['steps']:,} ({rep['simulated_time_s']:,.1f} s simulated)"),
    ]
    width = max(len(k) for k, _ in rows) + 2
    lines += [f"{k:<{width}}{v}" for k, v in rows]
    lines.append("")

    impls = rep["implementations"]
    names = list(impls)
    head = f"{'manager CPU time':<{width}}" + "".join(f"{n:>14}" for n in names)
    lines.append(head)

    def row(label: str, fn) -> str:
        return f"{'  ' + label:<{width}}" + "".join(f"{fn(impls[n]):>14}" for n in names)

    lines.append(row("total", lambda d: format_duration(d["manager_cpu_s"])))
    lines.append(row("per step, mean", lambda d: format_duration(d["per_step"]["mean_us"] / 1e6)))
    lines.append(row("per step, p50", lambda d: format_duration(d["per_step"]["p50_us"] / 1e6)))
    lines.append(row("per step, p99", lambda d: format_duration(d["per_step"]["p99_us"] / 1e6)))
    lines.append(row("manager calls", lambda d: f"{d['manager_calls']:,}"))
    lines.append(row("timer cost removed", lambda d: format_duration(
        d["manager_cpu_s_timer_included"] - d["manager_cpu_s"])))
    lines.append(row("  per timed call", lambda d: f"{d['timer_overhead_ns_per_call']} ns"))
    lines.append(row("replay wall time", lambda d: format_duration(d["replay_wall_s"])))
    if rep["speedup"] is not None:
        raw = rep.get("speedup_timer_included")
        lines.append(
            f"{'speedup':<{width}}{rep['speedup']:.1f}x less manager CPU time with cython"
            + (f" ({raw:.1f}x with the timer's cost left in)" if raw is not None else "")
        )
    if rep["identical_decisions"] is not None:
        digest = impls[names[0]]["decisions_digest"]
        verdict = "identical" if rep["identical_decisions"] else "DIFFERENT"
        lines.append(f"{'decisions':<{width}}{verdict} (block ids per request per step; digest {digest[:16]})")
    return "\n".join(lines)
