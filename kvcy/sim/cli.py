"""``kvcy replay``: drive the KV-cache manager with a request trace and report.

Examples::

    kvcy replay                                   # the bundled Mooncake trace head
    kvcy replay --impl both --plot replay.png     # Cython vs Python, same decisions?
    kvcy replay conversation_trace.jsonl --limit 500 --kv-memory 24GiB
    kvcy replay synthetic:conversations=200,max_turns=6 --seed 7 --num-blocks 2048
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from kvcy.cli import dtype_arg, float_arg, int_arg, parse_size, positive_int, size_arg
from kvcy.sim.fleet import MAX_INSTANCES, ROUTERS, TRANSPORTS
from kvcy.sim.scheduler import (
    MAX_BLOCK_SIZE,
    MAX_NUM_BLOCKS,
    MAX_STEP_MS,
    MAX_TOKEN_US,
    Divergence,
    ReplayConfig,
    ReplayResult,
    replay,
    timer_overhead_ns,
)
from kvcy.sim.traces import Trace, bundled_trace_path, read_mooncake

__all__ = ["DEFAULT_NUM_BLOCKS", "add_parser", "main", "parse_size", "run"]

#: Pool size when neither --num-blocks nor --kv-memory is given: 32,768 blocks
#: (512 Ki tokens at block size 16: a Llama-3-8B-shaped KV cache in 64 GiB).
DEFAULT_NUM_BLOCKS = 32768

#: Largest --seed: a seed is an unsigned 64-bit number.
MAX_SEED = (1 << 64) - 1

_DESCRIPTION = (
    "Replay a request trace through kvcy's KVCacheManager with a continuous-batching scheduler loop; "
    "report prefix-cache hits, evictions, preemptions, usage and manager CPU time."
)
_EPILOG = (
    "TRACE is a Mooncake JSONL file (.jsonl or .jsonl.gz), 'synthetic[:key=value,...]' "
    "(keys: conversations, max_turns, system_prompts, system_len, user_min, user_max, output_min, "
    "output_max, rate, think_ms), or omitted: the bundled head of Mooncake's conversation trace. "
    "Requests arrive at the trace's times on a simulated clock; a scheduler step takes "
    "STEP_MS + TOKEN_US x (tokens scheduled) of simulated time, and an idle engine jumps to the next arrival. "
    "Exit status: 0 done, 1 the implementations made different decisions, 2 bad arguments or input."
)


class _RenamedOption(argparse.Action):
    """An option that no longer exists here: refuse it, saying what to use instead."""

    def __init__(self, option_strings, dest, hint: str = "", **kwargs) -> None:
        self.hint = hint
        super().__init__(option_strings, dest, help=argparse.SUPPRESS, **kwargs)

    def __call__(self, parser, namespace, values, option_string=None) -> None:
        parser.error(f"{option_string} is not an option of kvcy replay: {self.hint}")


def _fractions(text: str) -> list[float]:
    try:
        values = [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        values = []
    if not values or any(not 0 < v <= 1024 for v in values):  # NaN fails too
        raise argparse.ArgumentTypeError(
            f"expected comma-separated multiples of the pool size, each > 0 and <= 1024, got {text!r}"
        )
    return values


def _routers(text: str) -> list[str]:
    names = [x.strip() for x in text.split(",") if x.strip()]
    bad = [x for x in names if x not in ROUTERS]
    if not names or bad:
        raise argparse.ArgumentTypeError(f"expected routers from {', '.join(ROUTERS)}, got {text!r}")
    return list(dict.fromkeys(names))


def _counts(text: str) -> list[int]:
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        values = []
    if not values or any(not 1 <= v <= MAX_INSTANCES for v in values):
        raise argparse.ArgumentTypeError(
            f"expected comma-separated instance counts from 1 to {MAX_INSTANCES}, got {text!r}"
        )
    return sorted(set(values))


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add ``replay`` to the ``kvcy`` sub-parsers; return its parser."""
    p = subparsers.add_parser(
        "replay", help="replay a request trace through the KV-cache manager",
        description=_DESCRIPTION, epilog=_EPILOG,
    )
    p.set_defaults(func=run)
    p.add_argument("trace", nargs="?", metavar="TRACE", help="trace to replay (default: the bundled trace)")
    p.add_argument("--limit", type=positive_int, metavar="K", help="replay only the first K requests")
    p.add_argument("--seed", metavar="N", type=int_arg(0, MAX_SEED), default=0,
                   help="seed of the synthetic trace (default 0)")
    _add_pool_options(p)
    _add_scheduler_options(p)
    _add_offload_options(p)
    _add_fleet_options(p)
    _add_output_options(p)
    return p


def _add_pool_options(p: argparse.ArgumentParser) -> None:
    from kvcy.hashing import _HASH_FNS

    pool = p.add_argument_group("KV-cache pool (default: %d blocks)" % DEFAULT_NUM_BLOCKS)
    size = pool.add_mutually_exclusive_group()
    size.add_argument("--num-blocks", type=int_arg(2, MAX_NUM_BLOCKS, " (block 0 is the null block)"), metavar="N",
                      help="blocks in the pool, block 0 (the null block) included")
    size.add_argument("--kv-memory", "--memory", dest="kv_memory", type=size_arg, metavar="SIZE",
                      help="memory of the KV cache itself (e.g. 32GiB, 40GB, 5e9), as in 'kvcy plan --kv-memory': "
                      "blocks = SIZE / bytes per block of the model shape below")
    p.add_argument("--gpu-memory", action=_RenamedOption, metavar="SIZE",
                   hint="give the KV-cache memory with --kv-memory SIZE ('kvcy plan' turns GPU memory, "
                   "utilization and model memory into a KV-cache budget)")
    pool.add_argument("--num-layers", metavar="N", type=positive_int, default=32,
                      help="model layers (default 32, Llama-3-8B)")
    pool.add_argument("--num-kv-heads", metavar="N", type=positive_int, default=8,
                      help="KV heads per layer (default 8)")
    pool.add_argument("--head-size", metavar="N", type=positive_int, default=128, help="head size (default 128)")
    pool.add_argument("--dtype", metavar="NAME", type=dtype_arg, default="bfloat16",
                      help="KV-cache dtype (default bfloat16)")
    pool.add_argument("--block-size", metavar="N", type=int_arg(1, MAX_BLOCK_SIZE), default=16,
                      help="tokens per block (default 16)")
    pool.add_argument("--hash", default="sha256", choices=sorted(_HASH_FNS), metavar="NAME",
                      help=f"prefix-cache hash: {', '.join(sorted(_HASH_FNS))} (default sha256)")
    pool.add_argument("--no-prefix-caching", action="store_true", help="turn prefix caching off")


def _add_scheduler_options(p: argparse.ArgumentParser) -> None:
    sched = p.add_argument_group("scheduler")
    sched.add_argument("--max-num-seqs", metavar="N", type=positive_int, default=256,
                       help="cap on running requests (default 256)")
    sched.add_argument("--max-num-batched-tokens", metavar="N", type=positive_int, default=8192,
                       help="token budget per step (default 8192)")
    sched.add_argument("--max-model-len", metavar="N", type=int_arg(2),
                       help="reject longer requests (default: the trace's longest, capped at the pool)")
    sched.add_argument("--no-reserve-full-isl", action="store_true",
                       help="admit a request when its first chunk fits, not its whole prompt "
                       "(vLLM's scheduler_reserve_full_isl=False)")
    sched.add_argument("--step-ms", metavar="MS", type=float_arg(0.0, MAX_STEP_MS), default=10.0,
                       help="simulated time per step, fixed part (default 10 ms)")
    sched.add_argument("--token-us", metavar="US", type=float_arg(0.0, MAX_TOKEN_US), default=12.5,
                       help="simulated time per scheduled token (default 12.5 µs)")


def _add_offload_options(p: argparse.ArgumentParser) -> None:
    off = p.add_argument_group("CPU offloading (a CPU tier behind the GPU pool, as vLLM's offloading connector)")
    off.add_argument("--cpu-offload", metavar="SIZE|Nx",
                     help="add a CPU tier of this size: a memory size (e.g. 64GiB, turned into blocks with the "
                     "model shape above) or a multiple of the GPU pool (e.g. 8x)")
    off.add_argument("--offload-policy", choices=["lru", "arc"], default="lru",
                     help="the CPU tier's eviction policy (default lru)")
    off.add_argument("--offload-sweep", type=_fractions, default=[1.0, 2.0, 4.0, 8.0, 16.0], metavar="F,F,...",
                     help="CPU-tier sizes of the --plot offloading panel, as multiples of the GPU pool, each run "
                     "with lru and with arc (default 1,2,4,8,16)")


def _add_fleet_options(p: argparse.ArgumentParser) -> None:
    fl = p.add_argument_group("fleet (N instances behind a router; their KV events feed a routing index)")
    fl.add_argument("--instances", type=int_arg(1, MAX_INSTANCES), metavar="N",
                    help="split the trace across N simulated instances, each with the pool above and KV events "
                    "published to the router's index")
    fl.add_argument("--router", type=_routers, metavar="NAME[,NAME...]",
                    help=f"with --instances: the router(s) to compare, from {', '.join(ROUTERS)} (default: all)")
    fl.add_argument("--fleet-transport", choices=list(TRANSPORTS), default="zmq",
                    help="how events reach the index: zmq (real sockets on the loopback interface, default) or "
                    "direct (applied in-process, deterministic)")
    fl.add_argument("--instances-sweep", type=_counts, default=[1, 2, 4, 8], metavar="N,N,...",
                    help="fleet sizes of the --plot fleet panel, each run with every router (default 1,2,4,8)")


def _add_output_options(p: argparse.ArgumentParser) -> None:
    out = p.add_argument_group("implementation and output")
    out.add_argument("--impl", choices=["cython", "python", "both"],
                     help="manager implementation (default: the live one); 'both' runs each and checks "
                     "that they made identical decisions")
    out.add_argument("--json", action="store_true", help="print the report as JSON")
    out.add_argument("--plot", metavar="FILE.png", help="plot hit rate against cache size (a sweep) and the "
                     "per-step manager time of each implementation")
    out.add_argument("--sweep", type=_fractions, default=[0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 16.0],
                     metavar="F,F,...", help="pool sizes of the --plot sweep, as multiples of this run's "
                     "(default 0.25,0.5,1,2,4,8,16)")
    out.add_argument("--no-progress", action="store_true", help="no progress bar")


def _load_trace(args: argparse.Namespace) -> Trace:
    spec = args.trace
    if spec is None or spec == "bundled":
        path = bundled_trace_path()
        trace = read_mooncake(path, limit=args.limit, name="mooncake conversation_trace (bundled head)")
        trace.source = "bundled"
        return trace
    if spec == "synthetic" or spec.startswith("synthetic:"):
        from kvcy.sim.synthetic import parse_synthetic_spec, synthetic_trace

        return synthetic_trace(args.seed, parse_synthetic_spec(spec), limit=args.limit)
    return read_mooncake(spec, limit=args.limit)


def _bytes_per_block(args: argparse.Namespace) -> tuple[int, int]:
    """Bytes of one block over all layers of the model shape, and of one layer's page."""
    from kvcy.kv_cache_interface import FullAttentionSpec

    spec = FullAttentionSpec(
        block_size=args.block_size, num_kv_heads=args.num_kv_heads, head_size=args.head_size, dtype=args.dtype
    )
    return spec.page_size_bytes * args.num_layers, spec.page_size_bytes


def _num_blocks(args: argparse.Namespace) -> int:
    if args.num_blocks is not None:
        return args.num_blocks
    if args.kv_memory is None:
        return DEFAULT_NUM_BLOCKS
    per_block, page = _bytes_per_block(args)
    n = args.kv_memory // per_block
    if n < 2:
        raise ValueError(
            f"--kv-memory {args.kv_memory:,} bytes holds {n} block(s) of {per_block:,} bytes "
            f"({args.num_layers} layers x {page:,}); need at least 2 (block 0 is the null block)"
        )
    if n > MAX_NUM_BLOCKS:
        raise ValueError(
            f"--kv-memory {args.kv_memory:,} bytes holds {n:,} blocks of {per_block:,} bytes; "
            f"the replay takes at most {MAX_NUM_BLOCKS:,}"
        )
    return int(n)


def _impls(choice: str | None) -> list[str]:
    from kvcy import IMPLEMENTATION, _fast

    if choice is None:
        return [IMPLEMENTATION]
    wanted = ["cython", "python"] if choice == "both" else [choice]
    if "cython" in wanted and _fast.NO_EXTENSIONS:
        raise ValueError(f"KVCY_NO_EXTENSIONS=1 rules out the compiled (cython) twins: --impl {choice} needs it "
                         "unset; use --impl python")
    if "cython" in wanted and "cython" not in _fast.available():
        raise ValueError("the compiled (cython) twins are not built in this install; use --impl python")
    return wanted


def _divergence_message(trace: Trace, config: ReplayConfig, ref_impl: str, err: Divergence) -> str:
    ref = replay(trace, config, ref_impl, capture_step=err.step, stop_after_step=err.step)
    ours = err.result.captured or ["(no such step)"]
    theirs = ref.captured or ["(no such step)"]
    first = next((i for i, (a, b) in enumerate(zip(theirs, ours)) if a != b), min(len(theirs), len(ours)))

    def show(decisions: list[str]) -> list[str]:
        return [f"  {'>>' if i == first else '  '} {x}" for i, x in enumerate(decisions)]

    lines = [
        f"DECISIONS DIFFER: {ref_impl} and {err.result.impl} disagree at scheduler step {err.step} "
        "(first differing decision marked >>).",
        f"  {ref_impl}:",
        *show(theirs),
        f"  {err.result.impl}:",
        *show(ours),
    ]
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    """Run ``kvcy replay`` with ``argv`` (the arguments after ``replay``); return the exit status."""
    from kvcy.cli import main as kvcy_main

    return kvcy_main(["replay", *argv])


def run(args: argparse.Namespace) -> int:
    """Run a parsed ``kvcy replay``; return the exit status."""
    from kvcy.sim.plot import MissingMatplotlib

    try:
        return _run(args)
    except BrokenPipeError:
        raise  # kvcy.cli.main stops quietly
    except (ValueError, OSError, MissingMatplotlib) as e:
        print(f"kvcy replay: error: {e}", file=sys.stderr)
        return 2


def _progress_bar(enabled: bool, total: int) -> Any:
    if not enabled:
        return None
    from tqdm import tqdm

    return tqdm(total=total, unit="req", leave=False, mininterval=0.25)


def _run(args: argparse.Namespace) -> int:
    from kvcy.sim.report import build_report

    if args.instances is None and args.router is None:
        _impls(args.impl)  # refused before the trace is read (the fleet has its own refusals first)
    plot_path = _checked_plot_path(args)
    trace = _load_trace(args)
    if not len(trace):
        raise ValueError("the trace has no requests")
    num_blocks = _num_blocks(args)
    if args.instances is not None or args.router is not None:
        return _run_fleet(args, trace, num_blocks, plot_path)
    impls = _impls(args.impl)
    config, bytes_per_block = _replay_config(args, num_blocks)
    # Every run (each implementation, then the --plot sweep) is built before
    # the first starts, so that a bad sweep size fails in a second, not after
    # the main replay; one progress bar covers them all.
    sweep_configs = _sweep_configs(args, config) if plot_path is not None else []
    outcome = _replay_runs(args, trace, config, impls, sweep_configs)
    if outcome is None:
        return 1
    results, sweep, offload_sweep = outcome
    identical: bool | None = None
    if len(results) > 1:
        identical = all(r.step_digests == results[0].step_digests for r in results[1:])
        if not identical:  # pragma: no cover - replay raises Divergence first
            print("DECISIONS DIFFER between implementations", file=sys.stderr)
            return 1

    rep = build_report(trace, results, identical, bytes_per_block=bytes_per_block)
    if plot_path is not None:
        _plot(rep, plot_path, trace, config, results, sweep, offload_sweep)
    _print_report(rep, args, plot_path)
    return 0


def _checked_plot_path(args: argparse.Namespace) -> Path | None:
    """``--plot``'s file, refused before the replay when it cannot be written (or matplotlib is missing)."""
    plot_path = Path(args.plot) if args.plot else None
    if plot_path is not None:
        if plot_path.suffix.lower() != ".png":
            raise ValueError(f"--plot writes a PNG; give a .png file name, got {args.plot!r}")
        if not plot_path.parent.is_dir():
            raise ValueError(f"--plot: folder {str(plot_path.parent)!r} does not exist")
        from kvcy.sim.plot import _pyplot

        _pyplot()  # fail early, before the replay, when matplotlib is missing
    return plot_path


def _replay_config(args: argparse.Namespace, num_blocks: int) -> tuple[ReplayConfig, int | None]:
    """The replay's configuration, and the bytes of one block when a CPU tier is sized from them."""
    cpu_blocks = 0
    bytes_per_block = None
    if args.cpu_offload is not None:
        from kvcy.sim.offload import cpu_blocks_from_spec

        bytes_per_block = _bytes_per_block(args)[0]
        cpu_blocks = cpu_blocks_from_spec(args.cpu_offload, num_blocks - 1, bytes_per_block)
        if args.no_prefix_caching:
            raise ValueError("--cpu-offload needs prefix caching (its keys are block hashes): drop --no-prefix-caching")
    config = ReplayConfig(
        num_blocks=num_blocks,
        block_size=args.block_size,
        hash_algo=args.hash,
        max_num_seqs=args.max_num_seqs,
        max_num_batched_tokens=args.max_num_batched_tokens,
        max_model_len=args.max_model_len,
        step_ms=args.step_ms,
        token_us=args.token_us,
        enable_caching=not args.no_prefix_caching,
        reserve_full_isl=not args.no_reserve_full_isl,
        cpu_offload_blocks=cpu_blocks,
        offload_policy=args.offload_policy,
    )
    return config, bytes_per_block


def _sweep_configs(args: argparse.Namespace, config: ReplayConfig) -> list[ReplayConfig]:
    """The --plot sweep's runs: GPU pool sizes, then (with a CPU tier) CPU-tier sizes per policy."""
    cpu_blocks = config.cpu_offload_blocks
    sweep_configs: list[ReplayConfig] = []
    # With a CPU tier the run's own GPU hit rate is not a GPU-only one:
    # the sweep then replays the run's pool size without the tier too.
    sizes = set() if cpu_blocks else {config.num_blocks}
    for f in args.sweep:
        n = max(2, int(round(config.num_blocks * f)))
        if n > MAX_NUM_BLOCKS:
            raise ValueError(
                f"--sweep {f:g} x {config.num_blocks:,} blocks is more than the replay takes ({MAX_NUM_BLOCKS:,})"
            )
        if n not in sizes:
            sizes.add(n)
            # the GPU sweep is GPU-only: hit rate against the GPU pool's size
            sweep_configs.append(ReplayConfig(**{**config.__dict__, "num_blocks": n, "cpu_offload_blocks": 0}))
    if cpu_blocks:
        # total hit rate against the CPU tier's size, for both policies
        for policy in ("lru", "arc"):
            for f in sorted(set(args.offload_sweep)):
                n = max(1, int(round((config.num_blocks - 1) * f)))
                sweep_configs.append(ReplayConfig(**{**config.__dict__, "cpu_offload_blocks": n,
                                                     "offload_policy": policy}))
    return sweep_configs


def _replay_runs(
    args: argparse.Namespace, trace: Trace, config: ReplayConfig, impls: list[str], sweep_configs: list[ReplayConfig]
) -> tuple[list[ReplayResult], list[tuple[int, float, int]], list[tuple[str, int, float, float]]] | None:
    """Replay once per implementation (each checked step by step against the first), then the sweep.

    Returns:
        The implementations' results, the GPU sweep ``(num_blocks, hit rate, rejected)`` and the
        CPU-tier sweep ``(policy, cpu blocks, total hit rate, GPU hit rate)``; None when the
        implementations' decisions diverged (said on stderr).
    """
    cpu_blocks = config.cpu_offload_blocks
    runs = [(impl, config) for impl in impls] + [(impls[0], cfg) for cfg in sweep_configs]
    bar = _progress_bar(not args.no_progress and sys.stderr.isatty(), total=len(trace) * len(runs))
    progress = bar if bar is not None else False

    def describe(k: int, impl: str, cfg: ReplayConfig) -> None:
        if bar is not None:
            what = "sweep" if k > len(impls) else "replay"
            cpu = f" + {cfg.cpu_offload_blocks:,} CPU {cfg.offload_policy}" if cfg.cpu_offload_blocks else ""
            bar.set_description(f"{what} {k}/{len(runs)} [{impl}, {cfg.num_blocks:,} blocks{cpu}]")

    results: list[ReplayResult] = []
    sweep = []
    offload_sweep = []
    try:
        timer_overhead = timer_overhead_ns()  # once, the same for every implementation
        for k, (impl, cfg) in enumerate(runs[: len(impls)], 1):
            describe(k, impl, cfg)
            expected = results[0].step_digests if results else None
            try:
                results.append(replay(trace, cfg, impl, progress=progress, expected_digests=expected,
                                      timer_overhead=timer_overhead))
            except Divergence as err:
                if bar is not None:
                    bar.close()
                print(_divergence_message(trace, config, results[0].impl, err), file=sys.stderr)
                return None
        if not cpu_blocks:
            sweep.append((config.num_blocks, results[0].hit_rate, results[0].rejected))
        for k, (impl, cfg) in enumerate(runs[len(impls):], len(impls) + 1):
            describe(k, impl, cfg)
            r = replay(trace, cfg, impl, progress=progress, timer_overhead=timer_overhead)
            if cfg.cpu_offload_blocks:
                offload_sweep.append((cfg.offload_policy, cfg.cpu_offload_blocks, r.total_hit_rate, r.hit_rate))
            else:
                sweep.append((cfg.num_blocks, r.hit_rate, r.rejected))
    finally:
        if bar is not None:
            bar.close()
    return results, sweep, offload_sweep


def _plot(
    rep: dict[str, Any],
    plot_path: Path,
    trace: Trace,
    config: ReplayConfig,
    results: list[ReplayResult],
    sweep: list[tuple[int, float, int]],
    offload_sweep: list[tuple[str, int, float, float]],
) -> None:
    """Write the --plot PNG and record its sweeps in the report."""
    from kvcy.sim.plot import plot_replay
    from kvcy.sim.traces import hit_rate_upper_bound

    cpu_blocks = config.cpu_offload_blocks
    gpu_only_rate = next((h for n, h, _ in sweep if n == config.num_blocks), None)
    plot_replay(
        plot_path,
        [(n, h) for n, h, _ in sweep],
        {r.impl: r.step_ns for r in results},
        block_size=config.block_size,
        chosen_blocks=config.num_blocks,
        upper_bound=hit_rate_upper_bound(trace, config.block_size),
        title=f"kvcy replay: {trace.name}, {len(trace):,} requests, block size {config.block_size}",
        offload_sweep=[(p, n, t) for p, n, t, _ in offload_sweep] if cpu_blocks else None,
        chosen_cpu_blocks=cpu_blocks or None,
        gpu_only_rate=gpu_only_rate,
    )
    rep["plot"] = {"path": str(plot_path), "sweep": [
        {"num_blocks": n, "hit_rate": h, "rejected": rej} for n, h, rej in sorted(sweep)
    ]}
    if cpu_blocks:
        rep["plot"]["offload_sweep"] = [
            {"policy": p, "cpu_blocks": n, "total_hit_rate": t, "gpu_hit_rate": g}
            for p, n, t, g in offload_sweep
        ]


def _print_report(rep: dict[str, Any], args: argparse.Namespace, plot_path: Path | None) -> None:
    from kvcy.sim.report import format_report

    if args.json:
        print(json.dumps(rep, indent=2, allow_nan=False))
    else:
        print(format_report(rep))
        if plot_path is not None:
            print(f"\nplot written to {plot_path}")


def _run_fleet(args: argparse.Namespace, trace: Trace, num_blocks: int, plot_path: Path | None) -> int:
    """``--instances N``: the fleet replay, once per router (and the --plot sweep over fleet sizes)."""
    from kvcy.sim.fleet import FleetConfig, replay_fleet
    from kvcy.sim.fleet_report import build_fleet_report, format_fleet_report

    if args.instances is None:
        raise ValueError("--router needs --instances N")
    if args.cpu_offload is not None:
        raise ValueError("the fleet replay has no CPU tier yet: drop --cpu-offload or --instances")
    if args.no_prefix_caching:
        raise ValueError("the fleet replay routes by cached prefixes: drop --no-prefix-caching")
    if args.impl == "both":
        raise ValueError("the fleet replay runs one implementation: --impl cython or --impl python")
    impl = _impls(args.impl)[0]
    routers = args.router or list(ROUTERS)
    config = ReplayConfig(
        num_blocks=num_blocks, block_size=args.block_size, hash_algo=args.hash, max_num_seqs=args.max_num_seqs,
        max_num_batched_tokens=args.max_num_batched_tokens, max_model_len=args.max_model_len,
        step_ms=args.step_ms, token_us=args.token_us, reserve_full_isl=not args.no_reserve_full_isl,
    )
    runs = [(args.instances, r) for r in routers]
    if plot_path is not None:
        runs += [(n, r) for n in args.instances_sweep if n != args.instances for r in routers]
    bar = _progress_bar(not args.no_progress and sys.stderr.isatty(), total=len(trace) * len(runs))
    results = []
    sweep: dict[str, list[tuple[int, float]]] = {r: [] for r in routers}
    imbalance: dict[str, list[tuple[int, float]]] = {r: [] for r in routers}
    try:
        timer_overhead = timer_overhead_ns()
        for k, (n, router) in enumerate(runs, 1):
            if bar is not None:
                bar.set_description(f"fleet {k}/{len(runs)} [{n} instances, {router}]")
            res = replay_fleet(trace, config, FleetConfig(instances=n, router=router, transport=args.fleet_transport),
                               impl, progress=bar if bar is not None else False, timer_overhead=timer_overhead)
            if n == args.instances:
                results.append(res)
            sweep[router].append((n, res.hit_rate))
            imbalance[router].append((n, res.imbalance))
    finally:
        if bar is not None:
            bar.close()
    rep = build_fleet_report(trace, results)
    if plot_path is not None:
        from kvcy.sim.plot import plot_fleet

        plot_fleet(plot_path, sweep, imbalance=imbalance, upper_bound=rep["hit_rate_upper_bound"],
                   chosen_instances=args.instances,
                   title=f"kvcy replay: {trace.name}, {len(trace):,} requests, {num_blocks:,} blocks per instance")
        rep["plot"] = {"path": str(plot_path), "sweep": [
            {"router": r, "instances": n, "hit_rate": h, "prompt_tokens_max_over_mean": dict(imbalance[r])[n]}
            for r in routers for n, h in sorted(sweep[r])
        ]}
    if args.json:
        print(json.dumps(rep, indent=2, allow_nan=False))
    else:
        print(format_fleet_report(rep))
        if plot_path is not None:
            print(f"\nplot written to {plot_path}")
    return 0
