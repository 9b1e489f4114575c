"""``--plot``: hit rate against cache size, per-step manager time per implementation, and the CPU tier.

matplotlib is optional (the ``plot`` extra, or ``pip install matplotlib``); it is imported
only here, only when a plot is asked for.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

__all__ = ["MissingMatplotlib", "plot_fleet", "plot_replay"]


class MissingMatplotlib(RuntimeError):
    """``--plot`` needs matplotlib, which is not installed."""


def _pyplot():
    try:
        import matplotlib
    except ImportError:
        raise MissingMatplotlib(
            # Not ``pip install 'kvcy[plot]'``: in a source checkout (the README's editable
            # install) that would fetch another kvcy from the package index.
            "--plot needs matplotlib, which is not installed: pip install matplotlib"
        ) from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _tokens_label(x: float) -> str:
    for div, unit in ((2**20, "Mi"), (2**10, "Ki")):
        if x >= div:
            v = x / div
            return f"{v:.0f} {unit}" if abs(v - round(v)) < 0.05 else f"{v:.1f} {unit}"
    return f"{x:.0f}"


def _token_formatter():
    from matplotlib.ticker import FuncFormatter

    return FuncFormatter(lambda x, _pos: _tokens_label(x))


def plot_replay(
    path: str | Path,
    sweep: Sequence[tuple[int, float]],
    step_ns: Mapping[str, Sequence[int]],
    *,
    block_size: int,
    chosen_blocks: int | None = None,
    upper_bound: float | None = None,
    title: str = "",
    offload_sweep: Sequence[tuple[str, int, float]] | None = None,
    chosen_cpu_blocks: int | None = None,
    gpu_only_rate: float | None = None,
) -> Path:
    """Write a two-panel PNG, three with ``offload_sweep``.

    Args:
        path: the output file.
        sweep: ``(num_blocks, hit_rate)`` points of the cache-size sweep.
        step_ns: per-step manager CPU time (ns) for each implementation.
        block_size: tokens per block (for the cache-size axis in tokens).
        chosen_blocks: the run's own pool size, marked on the sweep.
        upper_bound: the hit rate with every earlier block cached, drawn as a line.
        title: figure title.
        offload_sweep: ``(policy, cpu_blocks, total_hit_rate)`` points: total
            (GPU + CPU) hit rate against the CPU tier's size, per policy.
        chosen_cpu_blocks: the run's own CPU-tier size, marked on that panel.
        gpu_only_rate: the hit rate without a CPU tier, drawn as a line there.
    """
    plt = _pyplot()
    if offload_sweep:
        fig, (ax1, ax2, ax3) = plt.subplots(1, 3, figsize=(18, 4.6))
    else:
        fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4.6))
    _plot_cache_sweep(plt, ax1, sweep, block_size, chosen_blocks, upper_bound)
    _plot_step_times(ax2, step_ns)
    if offload_sweep:
        _plot_offload_sweep(plt, ax3, offload_sweep, block_size, chosen_cpu_blocks, gpu_only_rate, upper_bound)
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    out = Path(path)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def _plot_cache_sweep(
    plt: Any,
    ax: Any,
    sweep: Sequence[tuple[int, float]],
    block_size: int,
    chosen_blocks: int | None,
    upper_bound: float | None,
) -> None:
    """The first panel: hit rate against the GPU pool's size."""
    pts = sorted(sweep)
    if pts:
        xs = [n * block_size for n, _ in pts]
        ys = [100.0 * h for _, h in pts]
        ax.plot(xs, ys, "o-", color="tab:blue")
        for x, y in zip(xs, ys):
            ax.annotate(f"{y:.1f}%", (x, y), textcoords="offset points", xytext=(0, 7), ha="center", fontsize=8)
        ax.set_xscale("log", base=2)
        ax.set_xticks(xs)
        ax.xaxis.set_major_formatter(_token_formatter())
        ax.xaxis.set_minor_formatter(plt.NullFormatter())
        if chosen_blocks is not None:
            ax.axvline(chosen_blocks * block_size, color="gray", ls="--", lw=1, label="this run")
        top = max(ys)
        if upper_bound is not None:
            ax.axhline(100.0 * upper_bound, color="tab:red", ls=":", lw=1.2,
                       label=f"every earlier block cached: {100.0 * upper_bound:.1f}%")
            top = max(top, 100.0 * upper_bound)
        ax.legend(loc="upper left", fontsize=8)
        ax.set_ylim(0, max(5.0, top * 1.2))
    ax.set_xlabel(f"KV-cache size (tokens; block size {block_size})")
    ax.set_ylabel("prefix-cache hit rate (% of prompt tokens)")
    ax.set_title("hit rate against cache size")
    ax.grid(True, alpha=0.3)


def _plot_step_times(ax: Any, step_ns: Mapping[str, Sequence[int]]) -> None:
    """The second panel: histograms of per-step manager time, one per implementation."""
    colors = {"cython": "tab:orange", "python": "tab:green"}
    positive = [v for series in step_ns.values() for v in series if v > 0]
    if positive:
        lo, hi = math.log10(min(positive) / 1e3), math.log10(max(positive) / 1e3)
        if hi - lo < 1e-9:
            hi = lo + 1.0
        bins = [10 ** (lo + (hi - lo) * i / 60) for i in range(61)]
        for name, series in step_ns.items():
            us = [v / 1e3 for v in series if v > 0]
            if not us:
                continue
            s = sorted(us)
            p50 = s[len(s) // 2]
            p99 = s[min(len(s) - 1, int(0.99 * len(s)))]
            color = colors.get(name, None)
            ax.hist(us, bins=bins, histtype="step", lw=1.6, color=color,
                    label=f"{name}: p50 {p50:,.0f} µs, p99 {p99:,.0f} µs")
            ax.axvline(p50, color=color, ls=":", lw=1)
        ax.set_xscale("log")
        ax.legend(fontsize=8)
    ax.set_xlabel("manager CPU time per scheduler step (µs)")
    ax.set_ylabel("steps")
    ax.set_title("per-step manager time")
    ax.grid(True, alpha=0.3)


def _plot_offload_sweep(
    plt: Any,
    ax: Any,
    offload_sweep: Sequence[tuple[str, int, float]],
    block_size: int,
    chosen_cpu_blocks: int | None,
    gpu_only_rate: float | None,
    upper_bound: float | None,
) -> None:
    """The third panel: total (GPU + CPU) hit rate against the CPU tier's size, per policy."""
    policy_colors = {"lru": "tab:purple", "arc": "tab:brown"}
    tops = []
    for k, policy in enumerate(sorted({p for p, _, _ in offload_sweep})):
        pts = sorted((n, h) for p, n, h in offload_sweep if p == policy)
        xs = [n * block_size for n, _ in pts]
        ys = [100.0 * h for _, h in pts]
        tops += ys
        color = policy_colors.get(policy)
        ax.plot(xs, ys, "o-", color=color, label=f"GPU + CPU, {policy}")
        for x, y in zip(xs, ys):  # one policy's labels above its points, the other's below
            ax.annotate(f"{y:.1f}%", (x, y), textcoords="offset points", xytext=(0, 7 if k == 0 else -13),
                        ha="center", fontsize=7, color=color)
    xs = sorted({n * block_size for _, n, _ in offload_sweep})
    ax.set_xscale("log", base=2)
    ax.set_xticks(xs)
    ax.xaxis.set_major_formatter(_token_formatter())
    ax.xaxis.set_minor_formatter(plt.NullFormatter())
    if chosen_cpu_blocks is not None:
        ax.axvline(chosen_cpu_blocks * block_size, color="gray", ls="--", lw=1, label="this run")
    if gpu_only_rate is not None:
        ax.axhline(100.0 * gpu_only_rate, color="tab:blue", ls="--", lw=1.2,
                   label=f"GPU only: {100.0 * gpu_only_rate:.1f}%")
        tops.append(100.0 * gpu_only_rate)
    if upper_bound is not None:
        ax.axhline(100.0 * upper_bound, color="tab:red", ls=":", lw=1.2,
                   label=f"every earlier block cached: {100.0 * upper_bound:.1f}%")
        tops.append(100.0 * upper_bound)
    ax.set_ylim(0, max(5.0, max(tops) * 1.2))
    ax.legend(loc="upper left", fontsize=8)
    ax.set_xlabel(f"CPU-tier size (tokens; block size {block_size})")
    ax.set_ylabel("total hit rate (% of prompt tokens)")
    ax.set_title("GPU + CPU hit rate against CPU-tier size")
    ax.grid(True, alpha=0.3)


def plot_fleet(
    path: str | Path,
    sweep: Mapping[str, Sequence[tuple[int, float]]],
    *,
    imbalance: Mapping[str, Sequence[tuple[int, float]]] | None = None,
    upper_bound: float | None = None,
    chosen_instances: int | None = None,
    title: str = "",
) -> Path:
    """Write the fleet replay's PNG: hit rate against the number of instances, one line per router.

    With ``imbalance`` (router -> (instances, most prompt tokens on one
    instance over the mean)) a second panel shows the load balance.
    """
    plt = _pyplot()
    panels = 2 if imbalance else 1
    fig, axes = plt.subplots(1, panels, figsize=(6.5 * panels, 4.5), squeeze=False)
    ax = axes[0][0]
    for router, points in sweep.items():
        pts = sorted(points)
        ax.plot([n for n, _ in pts], [100.0 * h for _, h in pts], marker="o", label=router)
    if upper_bound is not None:
        ax.axhline(100.0 * upper_bound, color="grey", linestyle=":", label="upper bound (every prompt block kept)")
    if chosen_instances is not None:
        ax.axvline(chosen_instances, color="grey", linestyle="--", linewidth=0.8)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("instances")
    ax.set_ylabel("prefix-cache hit rate (% of prompt tokens)")
    ax.set_title("hit rate against fleet size, per router")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    if imbalance:
        ax2 = axes[0][1]
        for router, points in imbalance.items():
            pts = sorted(points)
            ax2.plot([n for n, _ in pts], [v for _, v in pts], marker="o", label=router)
        ax2.axhline(1.0, color="grey", linestyle=":")
        ax2.set_xscale("log", base=2)
        ax2.set_xlabel("instances")
        ax2.set_ylabel("prompt tokens on the busiest instance / mean")
        ax2.set_title("load balance")
        ax2.grid(True, alpha=0.3)
        ax2.legend(fontsize=8)
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    out = Path(path)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out
