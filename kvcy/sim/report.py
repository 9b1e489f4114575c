"""The replay report: one JSON-able dict, and the table printed from it."""

from __future__ import annotations

from typing import Any

from kvcy.sim.scheduler import ReplayResult, nearest_rank
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


def _offload_per_step(res: ReplayResult) -> dict[str, float]:
    n = len(res.offload_step_ns)
    both = [a + b for a, b in zip(res.step_ns, res.offload_step_ns)]
    both.sort()
    return {
        "offload_mean_us": (res.offload_ns / n / 1e3) if n else 0.0,
        "manager_and_offload_mean_us": (sum(both) / n / 1e3) if n else 0.0,
        "manager_and_offload_p50_us": nearest_rank(both, 50) / 1e3,
        "manager_and_offload_p99_us": nearest_rank(both, 99) / 1e3,
    }


def build_report(
    trace: Trace, results: list[ReplayResult], identical: bool | None = None, *, bytes_per_block: int | None = None
) -> dict[str, Any]:
    """Everything the replay measured, as plain JSON types.

    The workload and cache numbers come from the first result (with
    ``identical`` true every implementation made the same decisions, so they
    are the same); timings are per implementation.  ``speedup`` is Python's
    manager CPU time over Cython's when both ran; ``speedup_timer_included``
    the same with the timer's own cost left in the times.  With a CPU tier,
    ``offload`` says what it did (bytes with ``bytes_per_block``, the bytes of
    one block over all layers) and each implementation's timings add the
    offloading work (the offloading manager's calls and the connector work
    around them).
    """
    if not results:
        raise ValueError("no replay results to report")
    r = results[0]
    cfg = r.config
    impls = {res.impl: _timings(res) for res in results}
    speedup, speedup_raw = _speedups(results)
    upper_bound = hit_rate_upper_bound(trace, cfg.block_size)
    offload = _offload_summary(r, upper_bound, bytes_per_block) if cfg.cpu_offload_blocks else None
    return {
        "trace": {
            "name": trace.name,
            "source": trace.source,
            "requests_in_source": trace.total_in_source,
            "requests_replayed": len(trace),
        },
        "config": _config_summary(r),
        "requests": {"admitted": r.requests, "finished": r.finished, "rejected": r.rejected},
        "tokens": {"prompt": r.prompt_tokens, "output": r.output_tokens},
        "prefix_cache": {
            "hit_rate": r.hit_rate,
            "hit_rate_upper_bound": upper_bound,
            "hit_tokens": r.hit_tokens,
            "query_tokens": r.query_tokens,
            "recompute_hit_tokens": r.recompute_hit_tokens,
            "recompute_query_tokens": r.recompute_query_tokens,
            "manager_stats": r.manager_prefix_cache_stats,
        },
        "offload": offload,
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


def _timings(res: ReplayResult) -> dict[str, Any]:
    """One implementation's manager (and offloading) timings."""
    out: dict[str, Any] = {
        "manager_cpu_s": res.manager_ns / 1e9,
        "manager_cpu_s_timer_included": res.manager_ns_raw / 1e9,
        "timer_overhead_ns_per_call": res.timer_overhead_ns,
        "manager_calls": res.manager_calls,
        "per_step": _per_step(res),
        "replay_wall_s": res.wall_s,
        "decisions_digest": res.decisions_digest,
    }
    if res.offload_impl is not None:
        out["offload"] = {
            "twin": res.offload_impl,
            "cpu_s": res.offload_ns / 1e9,
            "cpu_s_timer_included": res.offload_ns_raw / 1e9,
            "timed_calls": res.offload_calls,
            "per_step": _offload_per_step(res),
        }
    return out


def _speedups(results: list[ReplayResult]) -> tuple[float | None, float | None]:
    """Python's manager CPU time over Cython's, without and with the timer's cost; None unless both ran."""
    speedup = speedup_raw = None
    by = {res.impl: res for res in results}
    if "cython" in by and "python" in by and by["cython"].manager_ns > 0:
        speedup = by["python"].manager_ns / by["cython"].manager_ns
        if by["cython"].manager_ns_raw > 0:
            speedup_raw = by["python"].manager_ns_raw / by["cython"].manager_ns_raw
    return speedup, speedup_raw


def _offload_summary(r: ReplayResult, upper_bound: float, bytes_per_block: int | None) -> dict[str, Any]:
    """What the CPU tier did."""
    cfg = r.config
    return {
        "cpu_blocks": cfg.cpu_offload_blocks,
        "cpu_tokens": cfg.cpu_offload_blocks * cfg.block_size,
        "times_gpu_pool": cfg.cpu_offload_blocks / (cfg.num_blocks - 1),
        "policy": cfg.offload_policy,
        "cpu_hit_tokens": r.cpu_hit_tokens,
        "cpu_hit_rate": r.cpu_hit_tokens / r.query_tokens if r.query_tokens else 0.0,
        "total_hit_rate": r.total_hit_rate,
        "hit_rate_upper_bound": upper_bound,
        "recompute_cpu_hit_tokens": r.recompute_cpu_hit_tokens,
        "blocks_stored": r.cpu_blocks_stored,
        "blocks_loaded": r.cpu_blocks_loaded,
        "bytes_per_block": bytes_per_block,
        "bytes_stored": None if bytes_per_block is None else r.cpu_blocks_stored * bytes_per_block,
        "bytes_loaded": None if bytes_per_block is None else r.cpu_blocks_loaded * bytes_per_block,
        "evictions": r.cpu_evictions,
        "stores_refused": r.cpu_stores_refused,
    }


def _config_summary(r: ReplayResult) -> dict[str, Any]:
    """The replay's configuration (``max_model_len`` as the replay resolved it)."""
    cfg = r.config
    return {
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
        "cpu_offload_blocks": cfg.cpu_offload_blocks,
        "offload_policy": cfg.offload_policy if cfg.cpu_offload_blocks else None,
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


def _bytes(n: int | None) -> str:
    if n is None:
        return ""
    for unit, div in (("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= div:
            return f" ({n / div:,.1f} {unit})"
    return f" ({n} B)"


def _offload_rows(off: dict[str, Any] | None) -> list[tuple[str, str]]:
    if not off:
        return []
    bound = off.get("hit_rate_upper_bound")
    return [
        ("CPU tier", f"{off['cpu_blocks']:,} blocks ({off['cpu_tokens']:,} tokens, "
         f"{off['times_gpu_pool']:.1f}x the GPU pool), {off['policy']}"),
        ("  CPU-tier hits", f"{_pct(off['cpu_hit_rate'])} of prompt tokens ({off['cpu_hit_tokens']:,} tokens loaded"
         + (f"; {off['recompute_cpu_hit_tokens']:,} more for re-admissions)" if off["recompute_cpu_hit_tokens"] else ")")),
        ("total hit rate", f"{_pct(off['total_hit_rate'])} GPU + CPU"
         + (f" (upper bound {_pct(bound)})" if bound is not None else "")),
        ("  blocks stored", f"{off['blocks_stored']:,}{_bytes(off['bytes_stored'])}"),
        ("  blocks loaded", f"{off['blocks_loaded']:,}{_bytes(off['bytes_loaded'])}"),
        ("  CPU evictions", f"{off['evictions']:,} blocks; {off['stores_refused']:,} offers refused (tier full)"),
    ]


def format_report(rep: dict[str, Any]) -> str:
    """The report as an aligned text table."""
    rows = _workload_rows(rep)
    width = max(len(k) for k, _ in rows) + 2
    lines = _header_lines(rep)
    lines += [f"{k:<{width}}{v}" for k, v in rows]
    lines.append("")
    lines += _timing_lines(rep, width)
    lines += _verdict_lines(rep, width)
    return "\n".join(lines)


def _header_lines(rep: dict[str, Any]) -> list[str]:
    """The trace and the pool, then a blank line."""
    t, c = rep["trace"], rep["config"]
    subset = ""
    if t["requests_replayed"] != t["requests_in_source"]:
        subset = f" (first {t['requests_replayed']:,} of {t['requests_in_source']:,} requests)"
    return [
        f"kvcy replay: {t['name']}{subset}",
        f"  pool {c['num_blocks']:,} blocks x {c['block_size']} tokens ({c['pool_tokens']:,} tokens), "
        f"hash {c['hash']}, max {c['max_num_seqs']} running, {c['max_num_batched_tokens']:,} tokens/step, "
        f"max_model_len {c['max_model_len']:,}",
        "",
    ]


def _workload_rows(rep: dict[str, Any]) -> list[tuple[str, str]]:
    """What the replay did: requests, tokens, hits, the CPU tier, evictions, preemptions, usage."""
    pc = rep["prefix_cache"]
    rq = rep["requests"]
    return [
        ("requests", f"{rq['finished']:,} finished of {rq['admitted']:,}"
         + (f" ({rq['rejected']:,} rejected: longer than max_model_len)" if rq["rejected"] else "")),
        ("prompt tokens", f"{rep['tokens']['prompt']:,}"),
        ("output tokens", f"{rep['tokens']['output']:,}"),
        ("prefix-cache hit rate", f"{_pct(pc['hit_rate'])} of prompt tokens "
         f"({pc['hit_tokens']:,} of {pc['query_tokens']:,})"),
        *([("  upper bound", f"{_pct(pc['hit_rate_upper_bound'])} if every earlier prompt block stayed cached")]
          if pc.get("hit_rate_upper_bound") is not None else []),
        *_offload_rows(rep.get("offload")),
        ("evictions", "n/a" if rep["evictions"] is None else f"{rep['evictions']:,} cached blocks"),
        ("preemptions", f"{rep['preemptions']:,}"
         + (f" (re-admissions hit {_pct(pc['recompute_hit_tokens'] / pc['recompute_query_tokens'])})"
            if pc["recompute_query_tokens"] else "")),
        ("KV-cache usage", f"peak {_pct(rep['usage']['peak'])}, mean {_pct(rep['usage']['mean'])}"),
        ("steps", f"{rep['steps']:,} ({rep['simulated_time_s']:,.1f} s simulated)"),
    ]


def _timing_lines(rep: dict[str, Any], width: int) -> list[str]:
    """Manager (and offloading) CPU time, one column per implementation."""
    impls = rep["implementations"]
    names = list(impls)
    lines = [f"{'manager CPU time':<{width}}" + "".join(f"{n:>14}" for n in names)]

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
    if any("offload" in d for d in impls.values()):
        def off(fn):
            return lambda d: fn(d["offload"]) if "offload" in d else "-"

        lines.append(row("offloading, total", off(lambda o: format_duration(o["cpu_s"]))))
        lines.append(row("  per step, mean", off(lambda o: format_duration(o["per_step"]["offload_mean_us"] / 1e6))))
        lines.append(row("  twin", off(lambda o: o["twin"])))
        lines.append(row("manager + offloading", off(lambda o: format_duration(
            o["per_step"]["manager_and_offload_mean_us"] / 1e6))))
        lines.append(row("  per step, p99", off(lambda o: format_duration(
            o["per_step"]["manager_and_offload_p99_us"] / 1e6))))
    lines.append(row("replay wall time", lambda d: format_duration(d["replay_wall_s"])))
    return lines


def _verdict_lines(rep: dict[str, Any], width: int) -> list[str]:
    """The speedup and whether the implementations decided the same, when both ran."""
    lines = []
    if rep["speedup"] is not None:
        raw = rep.get("speedup_timer_included")
        lines.append(
            f"{'speedup':<{width}}{rep['speedup']:.1f}x less manager CPU time with cython"
            + (f" ({raw:.1f}x with the timer's cost left in)" if raw is not None else "")
        )
    if rep["identical_decisions"] is not None:
        impls = rep["implementations"]
        digest = impls[next(iter(impls))]["decisions_digest"]
        verdict = "identical" if rep["identical_decisions"] else "DIFFERENT"
        lines.append(f"{'decisions':<{width}}{verdict} (block ids per request per step; digest {digest[:16]})")
    return lines
