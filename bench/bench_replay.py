"""``kvcy replay`` as a benchmark: the scheduler loop over a real and a synthetic trace.

Run: ``python -m pytest bench/bench_replay.py --benchmark-only``.
Each group has a ``cython`` and a ``python`` row.  The rows time the whole
replay (scheduler loop, request hashing and the manager); the manager's own CPU
time, which is what the two twins differ in, is in each row's ``extra_info``
(``manager_cpu_s``, less the timer's own cost; ``manager_cpu_s_timer_included``
with it; ``--benchmark-json`` keeps both).  Request hashing runs in
the live hashing twin in both rows; only the manager differs.
"""

from __future__ import annotations

import pytest

from kvcy.sim.scheduler import ReplayConfig, replay, timer_overhead_ns
from kvcy.sim.synthetic import SyntheticConfig, synthetic_trace
from kvcy.sim.traces import bundled_trace_path, read_mooncake

MOONCAKE_REQUESTS = 200


@pytest.fixture(scope="module")
def mooncake_head():
    return read_mooncake(bundled_trace_path(), limit=MOONCAKE_REQUESTS)


@pytest.fixture(scope="module")
def synthetic():
    return synthetic_trace(0, SyntheticConfig(conversations=150, system_len=2048, output_max=128))


@pytest.fixture(scope="module")
def timer_cost():
    """The timer's cost per timed call, measured once, so both rows remove the same amount
    (as ``kvcy replay --impl both`` does) and no round times the calibration."""
    return timer_overhead_ns()


def _run(benchmark, trace, config, impl_name, timer_cost):
    result = benchmark.pedantic(lambda: replay(trace, config, impl_name, timer_overhead=timer_cost),
                                rounds=3, iterations=1, warmup_rounds=0)
    benchmark.extra_info["manager_cpu_s"] = result.manager_ns / 1e9
    benchmark.extra_info["manager_cpu_s_timer_included"] = result.manager_ns_raw / 1e9
    benchmark.extra_info["manager_calls"] = result.manager_calls
    benchmark.extra_info["steps"] = result.steps
    benchmark.extra_info["hit_rate"] = result.hit_rate
    benchmark.extra_info["preemptions"] = result.preemptions
    assert result.finished == result.requests == len(trace)
    return result


@pytest.mark.parametrize("num_blocks", [8192, 32768])
def test_replay_mooncake_head(benchmark, impl, mooncake_head, num_blocks, timer_cost):
    """The first 200 requests of Mooncake's conversation trace, block size 16, sha256."""
    benchmark.group = f"replay: Mooncake conversation, {MOONCAKE_REQUESTS} requests, {num_blocks} blocks"
    _run(benchmark, mooncake_head, ReplayConfig(num_blocks=num_blocks), impl.name, timer_cost)


def test_replay_synthetic(benchmark, impl, synthetic, timer_cost):
    """Seeded shared-prefix multi-turn trace, a pool small enough to evict and preempt."""
    benchmark.group = f"replay: synthetic multi-turn, {len(synthetic)} requests, 2048 blocks"
    _run(benchmark, synthetic, ReplayConfig(num_blocks=2048, max_num_batched_tokens=2048), impl.name,
         timer_cost)


def test_replay_mooncake_head_offload(benchmark, impl, mooncake_head, timer_cost):
    """The same head with a small GPU pool and a CPU tier 4x as large behind it (LRU): the replay's
    connector (``ReplayConnector``) and the offloading manager of each twin.  ``offload_cpu_s`` in
    ``extra_info`` is their CPU time (``offload_per_step_us`` per step), less the timer's cost."""
    benchmark.group = f"replay + CPU tier: Mooncake conversation, {MOONCAKE_REQUESTS} requests, 8192 + 32768 blocks"
    cfg = ReplayConfig(num_blocks=8192, cpu_offload_blocks=32768, offload_policy="lru")
    result = _run(benchmark, mooncake_head, cfg, impl.name, timer_cost)
    assert result.offload_impl == impl.name and result.cpu_blocks_stored > 0
    benchmark.extra_info["offload_cpu_s"] = result.offload_ns / 1e9
    benchmark.extra_info["offload_per_step_us"] = result.offload_ns / result.steps / 1e3
    benchmark.extra_info["cpu_hit_tokens"] = result.cpu_hit_tokens
