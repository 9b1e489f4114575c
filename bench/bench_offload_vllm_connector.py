"""CPU time of the offloading manager's calls under vLLM 0.33.0's own OffloadingConnector:
vLLM's ``CPUOffloadingManager`` against kvcy's (the live twin, speaking vLLM's types).

Run with vLLM 0.33.0 importable (its own environment)::

    VLLM_TARGET_DEVICE=cpu HF_HUB_OFFLINE=1 PYTHONPATH=. python bench/bench_offload_vllm_connector.py

1. vLLM's real ``Scheduler`` with vLLM's ``OffloadingConnector`` runs the workload of
   ``tests/vllm_live/test_offload_connector_vllm.py`` (loads, stores, evictions, aborts) on
   vLLM's manager, behind a pass-through that logs every call the connector makes
   (method, keys, which request, the request's key positions at that moment).
2. The log is replayed, alternately, on a fresh vLLM manager and a fresh kvcy
   manager (``--rounds`` times each, garbage collection off while timing); each
   call is timed alone (``perf_counter_ns`` around it, minus the timer's own
   cost), so only the managers' work is counted, not the scheduler's.  The two
   replays' results are checked equal call by call.

Prints, per method and in total: calls, microseconds per replay (each method's
best round; the total is their sum), and vLLM / kvcy.  Timings are noisy on a shared machine; the ratio is from one run.
"""

from __future__ import annotations

import argparse
import gc
import os
import sys
import tempfile
import time
from typing import Any

os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
for _tests in ("tests", os.path.join("tests", "vllm_live")):
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", _tests))

_CTX_METHODS = {"lookup", "get_load_source", "prepare_load", "touch", "complete_load", "prepare_store",
                "complete_store", "on_new_request", "on_request_finished"}
_KEYS_FIRST = {"prepare_load", "touch", "complete_load", "prepare_store", "complete_store"}


class Recorder:
    """Passes every call on to ``inner`` and logs it."""

    def __init__(self, inner: Any, log: list[Any]):
        self.inner = inner
        self.log = log

    def __getattr__(self, name: str) -> Any:
        value = getattr(self.inner, name)
        if name == "lock" or not callable(value):
            return value

        def call(*args: Any, **kwargs: Any) -> Any:
            entry: list[Any] = [name, None, None, [], kwargs]
            if name in _CTX_METHODS:
                if "req_context" in kwargs:
                    ctx, rest = kwargs["req_context"], args
                    entry[4] = {k: v for k, v in kwargs.items() if k != "req_context"}
                else:
                    ctx, rest = args[-1], args[:-1]
                entry[1] = ctx.req_id
                entry[2] = dict(ctx._offload_key_positions)
                entry[3] = [list(a) if name in _KEYS_FIRST and i == 0 else a for i, a in enumerate(rest)]
            else:
                entry[3] = list(args)
            self.log.append(entry)
            result = value(*args, **kwargs)
            if name == "take_events":
                result = list(result)
                return iter(result)
            return result

        return call


def canonical(result: Any) -> Any:
    """A call's result as plain values (specs by their block ids, events by their fields)."""
    if result is None or isinstance(result, (bool, int, float, str, bytes)):
        return result
    if hasattr(result, "keys_to_store"):
        return ("store", list(result.keys_to_store), list(result.evicted_keys), canonical(result.store_spec))
    if hasattr(result, "block_ids"):
        return ("spec", [int(b) for b in result.block_ids])
    if isinstance(result, list):
        return [canonical(r) for r in result]
    if hasattr(result, "removed") and hasattr(result, "medium"):
        return ("event", list(result.keys), result.medium.name, result.removed, result.metadata_only)
    if hasattr(result, "name") and hasattr(result, "value"):  # an enum member
        return result.name
    return type(result).__name__


def timer_cost(n: int = 20000) -> float:
    best = float("inf")
    for _ in range(5):
        total = 0
        for _ in range(n):
            t0 = time.perf_counter_ns()
            t1 = time.perf_counter_ns()
            total += t1 - t0
        best = min(best, total / n)
    return best


def replay(log: list[Any], make_manager: Any, cost_ns: float) -> tuple[dict[str, float], list[Any]]:
    """Run the logged calls on a fresh manager; ns per method (timer cost removed) and the results."""
    from vllm.v1.kv_offload.base import ReqContext

    manager = make_manager()
    contexts: dict[str, Any] = {}
    per_method: dict[str, float] = {}
    results: list[Any] = []
    perf = time.perf_counter_ns
    for name, req_id, positions, args, kwargs in log:
        fn = getattr(manager, name)
        if req_id is not None:
            ctx = contexts.get(req_id)
            if ctx is None:
                ctx = contexts[req_id] = ReqContext(req_id=req_id)
            if positions != ctx._offload_key_positions:
                ctx._offload_key_positions.clear()
                ctx._offload_key_positions.update(positions)
            call_args = [list(a) if isinstance(a, list) else a for a in args] + [ctx]
        else:
            call_args = list(args)
        if name == "take_events":
            t0 = perf()
            result = list(fn(*call_args, **kwargs))
            t1 = perf()
        else:
            t0 = perf()
            result = fn(*call_args, **kwargs)
            t1 = perf()
        per_method[name] = per_method.get(name, 0.0) + (t1 - t0 - cost_ns)
        results.append(canonical(result))
    return per_method, results


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--policy", choices=("lru", "arc", "both"), default="both")
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()

    import kvcy
    import test_offload_connector_vllm as t
    from transformers import OPTConfig
    from vllm.v1.kv_offload.cpu.manager import CPUOffloadingManager as VllmManager

    from kvcy.kv_offload import vllm_spec
    from kvcy.kv_offload.cpu import CPUOffloadingManager as KvcyManager

    model_dir = tempfile.mkdtemp()
    OPTConfig(vocab_size=t.VOCAB, hidden_size=64, num_hidden_layers=2, ffn_dim=128, num_attention_heads=4,
              max_position_embeddings=2048, architectures=["OPTForCausalLM"]).save_pretrained(model_dir)
    cost = timer_cost()
    print(f"kvcy {kvcy.IMPLEMENTATION} twin; timer cost {cost:.0f} ns per call (removed); best of {args.rounds}")
    policies = ("lru", "arc") if args.policy == "both" else (args.policy,)
    for policy in policies:
        log: list[Any] = []
        t.run_scenario(model_dir, t.VLLM_SPEC, policy, wrap_manager=lambda m, log=log: Recorder(m, log))

        def make_vllm(policy: str = policy) -> Any:
            return VllmManager(num_chunks=t.CPU_CHUNKS, cache_policy=policy, store_threshold=0)

        def make_kvcy(policy: str = policy) -> Any:
            return vllm_spec.use_vllm_types(KvcyManager(num_chunks=t.CPU_CHUNKS, cache_policy=policy,
                                                        store_threshold=0))

        best: dict[str, dict[str, float]] = {"vllm": {}, "kvcy": {}}
        for _ in range(args.rounds):
            for label, make in (("vllm", make_vllm), ("kvcy", make_kvcy)):
                gc.collect()
                gc.disable()  # (a collection inside one timed call would be charged to it)
                try:
                    per_method, results = replay(log, make, cost)
                finally:
                    gc.enable()
                if label == "vllm":
                    reference = results
                elif results != reference:
                    raise SystemExit(f"{policy}: kvcy's replay answered differently from vLLM's")
                for name, ns in per_method.items():  # each method's best round
                    best[label][name] = min(best[label].get(name, float("inf")), ns)
        counts: dict[str, int] = {}
        for entry in log:
            counts[entry[0]] = counts.get(entry[0], 0) + 1
        print(f"\npolicy {policy}: {len(log)} manager calls from vLLM's connector")
        print(f"{'method':<22}{'calls':>7}{'vLLM us':>11}{'kvcy us':>11}{'vLLM/kvcy':>11}")
        for name in sorted(counts, key=lambda n: -best["vllm"].get(n, 0.0)):
            v, k = best["vllm"].get(name, 0.0) / 1e3, best["kvcy"].get(name, 0.0) / 1e3
            print(f"{name:<22}{counts[name]:>7}{v:>11.1f}{k:>11.1f}{(v / k if k > 0 else float('nan')):>10.1f}x")
        v, k = sum(best["vllm"].values()) / 1e3, sum(best["kvcy"].values()) / 1e3
        print(f"{'all calls':<22}{len(log):>7}{v:>11.1f}{k:>11.1f}{v / k:>10.1f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
