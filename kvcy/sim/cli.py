"""``kvcy replay``: drive the KV-cache manager with a request trace and report.

Examples::

    kvcy replay                                   # the bundled Mooncake trace head
    kvcy replay --impl both --plot replay.png     # Cython vs Python, same decisions?
    kvcy replay conversation_trace.jsonl --limit 500 --gpu-memory 24GiB
    kvcy replay synthetic:conversations=200,max_turns=6 --seed 7 --num-blocks 2048
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

from kvcy.sim.scheduler import Divergence, ReplayConfig, ReplayResult, replay, timer_overhead_ns
from kvcy.sim.traces import Trace, bundled_trace_path, read_mooncake

__all__ = ["DEFAULT_NUM_BLOCKS", "main", "parse_size"]

#: Pool size when neither --num-blocks nor --gpu-memory is given: 32,768 blocks
#: (512 Ki tokens at block size 16: a Llama-3-8B-shaped KV cache in 64 GiB).
DEFAULT_NUM_BLOCKS = 32768

_SIZE_RE = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:e[0-9]+)?)\s*([kmgt]?)(i?)(b?)\s*$", re.IGNORECASE)


def parse_size(text: str) -> int:
    """Bytes in ``"32GiB"``, ``"32G"`` (binary), ``"40GB"`` (decimal), ``"5e9"``.

    Raises:
        ValueError: not a size.
    """
    m = _SIZE_RE.match(text)
    if not m:
        raise ValueError(f"not a memory size: {text!r} (e.g. 32GiB, 40GB, 5e9)")
    number, unit, binary, byte = m.groups()
    power = " kmgt".index(unit.lower()) if unit else 0
    base = 1000 if (byte and not binary and unit) else 1024
    value = int(float(number) * base**power)
    if value <= 0:
        raise ValueError(f"memory size must be positive, got {text!r}")
    return value


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value


def _non_negative_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"expected a non-negative number, got {text!r}")
    return value


def _fractions(text: str) -> list[float]:
    try:
        values = [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated numbers, got {text!r}") from None
    if not values or any(not v > 0 for v in values):
        raise argparse.ArgumentTypeError(f"expected positive comma-separated numbers, got {text!r}")
    return values


def _parser() -> argparse.ArgumentParser:
    from kvcy.hashing import _HASH_FNS

    p = argparse.ArgumentParser(
        prog="kvcy replay",
        description="Replay a request trace through kvcy's KVCacheManager with a continuous-batching "
        "scheduler loop; report prefix-cache hits, evictions, preemptions, usage and manager CPU time.",
        epilog="TRACE is a Mooncake JSONL file (.jsonl or .jsonl.gz), 'synthetic[:key=value,...]' "
        "(keys: conversations, max_turns, system_prompts, system_len, user_min, user_max, output_min, "
        "output_max, rate, think_ms), or omitted: the bundled head of Mooncake's conversation trace. "
        "Requests arrive at the trace's times on a simulated clock; a scheduler step takes "
        "STEP_MS + TOKEN_US x (tokens scheduled) of simulated time, and an idle engine jumps to the next arrival.",
    )
    p.add_argument("trace", nargs="?", metavar="TRACE", help="trace to replay (default: the bundled trace)")
    p.add_argument("--limit", type=_positive_int, metavar="K", help="replay only the first K requests")
    p.add_argument("--seed", metavar="N", type=int, default=0, help="seed of the synthetic trace (default 0)")

    pool = p.add_argument_group("KV-cache pool (default: %d blocks)" % DEFAULT_NUM_BLOCKS)
    size = pool.add_mutually_exclusive_group()
    size.add_argument("--num-blocks", type=_positive_int, metavar="N", help="blocks in the pool (block 0 is the null block)")
    size.add_argument("--gpu-memory", metavar="SIZE", help="KV-cache memory (e.g. 32GiB); blocks = SIZE / bytes per block "
                      "of the model shape below")
    pool.add_argument("--num-layers", metavar="N", type=_positive_int, default=32, help="model layers (default 32, Llama-3-8B)")
    pool.add_argument("--num-kv-heads", metavar="N", type=_positive_int, default=8, help="KV heads per layer (default 8)")
    pool.add_argument("--head-size", metavar="N", type=_positive_int, default=128, help="head size (default 128)")
    pool.add_argument("--dtype", metavar="NAME", default="bfloat16", help="KV-cache dtype (default bfloat16)")
    pool.add_argument("--block-size", metavar="N", type=_positive_int, default=16, help="tokens per block (default 16)")
    pool.add_argument("--hash", default="sha256", choices=sorted(_HASH_FNS), metavar="NAME",
                      help=f"prefix-cache hash: {', '.join(sorted(_HASH_FNS))} (default sha256)")
    pool.add_argument("--no-prefix-caching", action="store_true", help="turn prefix caching off")

    sched = p.add_argument_group("scheduler")
    sched.add_argument("--max-num-seqs", metavar="N", type=_positive_int, default=256, help="cap on running requests (default 256)")
    sched.add_argument("--max-num-batched-tokens", metavar="N", type=_positive_int, default=8192,
                       help="token budget per step (default 8192)")
    sched.add_argument("--max-model-len", metavar="N", type=_positive_int,
                       help="reject longer requests (default: the trace's longest, capped at the pool)")
    sched.add_argument("--no-reserve-full-isl", action="store_true",
                       help="admit a request when its first chunk fits, not its whole prompt "
                       "(vLLM's scheduler_reserve_full_isl=False)")
    sched.add_argument("--step-ms", metavar="MS", type=_non_negative_float, default=10.0,
                       help="simulated time per step, fixed part (default 10 ms)")
    sched.add_argument("--token-us", metavar="US", type=_non_negative_float, default=12.5,
                       help="simulated time per scheduled token (default 12.5 µs)")

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
    return p


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


def _num_blocks(args: argparse.Namespace) -> int:
    if args.num_blocks is not None:
        return args.num_blocks
    if args.gpu_memory is None:
        return DEFAULT_NUM_BLOCKS
    from kvcy.kv_cache_interface import FullAttentionSpec

    spec = FullAttentionSpec(
        block_size=args.block_size, num_kv_heads=args.num_kv_heads, head_size=args.head_size, dtype=args.dtype
    )
    per_block = spec.page_size_bytes * args.num_layers
    n = parse_size(args.gpu_memory) // per_block
    if n < 2:
        raise ValueError(
            f"--gpu-memory {args.gpu_memory} holds {n} block(s) of {per_block:,} bytes; need at least 2"
        )
    return int(n)


def _impls(choice: str | None) -> list[str]:
    from kvcy import IMPLEMENTATION, _fast

    have = _fast.available()
    if choice is None:
        return [IMPLEMENTATION]
    wanted = ["cython", "python"] if choice == "both" else [choice]
    if "cython" in wanted and "cython" not in have:
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
    """Run ``kvcy replay``; return the exit status."""
    parser = _parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as e:  # argparse has printed the usage and the error
        return int(e.code or 0)
    from kvcy.sim.plot import MissingMatplotlib

    try:
        return _run(args)
    except BrokenPipeError:  # e.g. piped into head: stop quietly
        import os

        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
    except (ValueError, OSError, MissingMatplotlib) as e:
        print(f"kvcy replay: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("kvcy replay: interrupted", file=sys.stderr)
        return 130


def _run(args: argparse.Namespace) -> int:
    from kvcy.sim.report import build_report, format_report

    impls = _impls(args.impl)
    plot_path = Path(args.plot) if args.plot else None
    if plot_path is not None:
        if plot_path.suffix.lower() != ".png":
            raise ValueError(f"--plot writes a PNG; give a .png file name, got {args.plot!r}")
        if not plot_path.parent.is_dir():
            raise ValueError(f"--plot: folder {str(plot_path.parent)!r} does not exist")
        from kvcy.sim.plot import _pyplot

        _pyplot()  # fail early, before the replay, when matplotlib is missing
    trace = _load_trace(args)
    if not len(trace):
        raise ValueError("the trace has no requests")
    config = ReplayConfig(
        num_blocks=_num_blocks(args),
        block_size=args.block_size,
        hash_algo=args.hash,
        max_num_seqs=args.max_num_seqs,
        max_num_batched_tokens=args.max_num_batched_tokens,
        max_model_len=args.max_model_len,
        step_ms=args.step_ms,
        token_us=args.token_us,
        enable_caching=not args.no_prefix_caching,
        reserve_full_isl=not args.no_reserve_full_isl,
    )
    progress = not args.no_progress and sys.stderr.isatty()

    results: list[ReplayResult] = []
    identical: bool | None = None
    timer_overhead = timer_overhead_ns()  # once, the same for every implementation
    for impl in impls:
        expected = results[0].step_digests if results else None
        try:
            results.append(replay(trace, config, impl, progress=progress, expected_digests=expected,
                                  timer_overhead=timer_overhead))
        except Divergence as err:
            print(_divergence_message(trace, config, results[0].impl, err), file=sys.stderr)
            return 1
    if len(results) > 1:
        identical = all(r.step_digests == results[0].step_digests for r in results[1:])
        if not identical:  # pragma: no cover - replay raises Divergence first
            print("DECISIONS DIFFER between implementations", file=sys.stderr)
            return 1

    rep = build_report(trace, results, identical)
    if plot_path is not None:
        from kvcy.sim.plot import plot_replay
        from kvcy.sim.traces import hit_rate_upper_bound

        sweep = [(config.num_blocks, results[0].hit_rate)]
        rejected = {config.num_blocks: results[0].rejected}
        for f in args.sweep:
            n = max(2, int(round(config.num_blocks * f)))
            if any(n == m for m, _ in sweep):
                continue
            cfg = ReplayConfig(**{**config.__dict__, "num_blocks": n})
            r = replay(trace, cfg, impls[0], progress=progress)
            sweep.append((n, r.hit_rate))
            rejected[n] = r.rejected
        plot_replay(
            plot_path,
            sweep,
            {r.impl: r.step_ns for r in results},
            block_size=config.block_size,
            chosen_blocks=config.num_blocks,
            upper_bound=hit_rate_upper_bound(trace, config.block_size),
            title=f"kvcy replay: {trace.name}, {len(trace):,} requests, block size {config.block_size}",
        )
        rep["plot"] = {"path": str(plot_path), "sweep": [
            {"num_blocks": n, "hit_rate": h, "rejected": rejected[n]} for n, h in sorted(sweep)
        ]}

    if args.json:
        print(json.dumps(rep, indent=2))
    else:
        print(format_report(rep))
        if plot_path is not None:
            print(f"\nplot written to {plot_path}")
    return 0
