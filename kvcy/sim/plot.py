"""``--plot``: hit rate against cache size, per-step manager time per implementation, and the CPU tier.

matplotlib is optional (the ``plot`` extra, or ``pip install matplotlib``); it is imported
only here, only when a plot is asked for.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path

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

    pts = sorted(sweep)
    if pts:
        xs = [n * block_size for n, _ in pts]
        ys = [100.0 * h for _, h in pts]
        ax1.plot(xs, ys, "o-", color="tab:blue")
        for x, y in zip(xs, ys):
            ax1.annotate(f"{y:.1f}%", (x, y), textcoords="offset points", xytext=(0, 7), ha="center", fontsize=8)
        ax1.set_xscale("log", base=2)
        ax1.set_xticks(xs)
        ax1.xaxis.set_major_formatter(_token_formatter())
        ax1.xaxis.set_minor_formatter(plt.NullFormatter())
        if chosen_blocks is not None:
            ax1.axvline(chosen_blocks * block_size, color="gray", ls="--", lw=1, label="this run")
        top = max(ys)
        if upper_bound is not None:
            ax1.axhline(100.0 * upper_bound, color="tab:red", ls=":", lw=1.2,
                        label=f"every earlier block cached: {100.0 * upper_bound:.1f}%")
            top = max(top, 100.0 * upper_bound)
        ax1.legend(loc="upper left", fontsize=8)
        ax1.set_ylim(0, max(5.0, top * 1.2))
    ax1.set_xlabel(f"KV-cache size (tokens; block size {block_size})")
    ax1.set_ylabel("prefix-cache hit rate (% of prompt tokens)")
    ax1.set_title("hit rate against cache size")
    ax1.grid(True, alpha=0.3)

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
            ax2.hist(us, bins=bins, histtype="step", lw=1.6, color=color,
                     label=f"{name}: p50 {p50:,.0f} µs, p99 {p99:,.0f} µs")
            ax2.axvline(p50, color=color, ls=":", lw=1)
        ax2.set_xscale("log")
        ax2.legend(fontsize=8)
    ax2.set_xlabel("manager CPU time per scheduler step (µs)")
    ax2.set_ylabel("steps")
    ax2.set_title("per-step manager time")
    ax2.grid(True, alpha=0.3)

    if offload_sweep:
        policy_colors = {"lru": "tab:purple", "arc": "tab:brown"}
        tops = []
        for k, policy in enumerate(sorted({p for p, _, _ in offload_sweep})):
            pts = sorted((n, h) for p, n, h in offload_sweep if p == policy)
            xs = [n * block_size for n, _ in pts]
            ys = [100.0 * h for _, h in pts]
            tops += ys
            color = policy_colors.get(policy)
            ax3.plot(xs, ys, "o-", color=color, label=f"GPU + CPU, {policy}")
            for x, y in zip(xs, ys):  # one policy's labels above its points, the other's below
                ax3.annotate(f"{y:.1f}%", (x, y), textcoords="offset points", xytext=(0, 7 if k == 0 else -13),
                             ha="center", fontsize=7, color=color)
        xs = sorted({n * block_size for _, n, _ in offload_sweep})
        ax3.set_xscale("log", base=2)
        ax3.set_xticks(xs)
        ax3.xaxis.set_major_formatter(_token_formatter())
        ax3.xaxis.set_minor_formatter(plt.NullFormatter())
        if chosen_cpu_blocks is not None:
            ax3.axvline(chosen_cpu_blocks * block_size, color="gray", ls="--", lw=1, label="this run")
        if gpu_only_rate is not None:
            ax3.axhline(100.0 * gpu_only_rate, color="tab:blue", ls="--", lw=1.2,
                        label=f"GPU only: {100.0 * gpu_only_rate:.1f}%")
            tops.append(100.0 * gpu_only_rate)
        if upper_bound is not None:
            ax3.axhline(100.0 * upper_bound, color="tab:red", ls=":", lw=1.2,
                        label=f"every earlier block cached: {100.0 * upper_bound:.1f}%")
            tops.append(100.0 * upper_bound)
        ax3.set_ylim(0, max(5.0, max(tops) * 1.2))
        ax3.legend(loc="upper left", fontsize=8)
        ax3.set_xlabel(f"CPU-tier size (tokens; block size {block_size})")
        ax3.set_ylabel("total hit rate (% of prompt tokens)")
        ax3.set_title("GPU + CPU hit rate against CPU-tier size")
        ax3.grid(True, alpha=0.3)

    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    out = Path(path)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


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
