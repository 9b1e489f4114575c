"""bench/bench_vllm_scheduler.py, short and untimed: vLLM 0.33.0's ``Scheduler`` over the head of the
bundled Mooncake trace decides exactly the same on kvcy (manager and block hasher installed, or
the manager alone) as on vLLM's own manager, step by step.

A pool of 1,024 blocks (16k tokens) under the head's requests of up to 12k tokens: requests wait
for blocks, are preempted and resumed, and prompts sharing Mooncake blocks hit the prefix cache.
Runs under whichever twin this process selected; skipped where vLLM 0.33.0 does not import,
unless ``KVCY_REQUIRE_VLLM=1``.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

import pytest

os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import vllm  # noqa: E402

import kvcy.vllm  # noqa: E402

LIMIT = 40
NUM_BLOCKS = 1024
MAX_MODEL_LEN = 12288  # the requests of the head that fit, with room to spare in the pool


def _bench():
    path = Path(__file__).resolve().parents[2] / "bench" / "bench_vllm_scheduler.py"
    spec = importlib.util.spec_from_file_location("bench_vllm_scheduler", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def bench():
    return _bench()


@pytest.fixture(scope="module")
def trace(bench):
    return [t for t in bench.load_trace(LIMIT) if len(t[2]) + t[3] <= MAX_MODEL_LEN]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    from tests.vllm_live.test_vllm_scheduler import write_model_config

    return write_model_config(str(tmp_path_factory.mktemp("bench-model")), max_position_embeddings=MAX_MODEL_LEN)


def _records(bench, side, trace, model_dir, **kw):
    records = []
    result = bench.run_round(side, trace, model_dir, num_blocks=NUM_BLOCKS, max_model_len=MAX_MODEL_LEN,
                             on_step=lambda step, record: records.append(record), **kw)
    assert not kvcy.vllm.is_installed() and not kvcy.vllm.block_hasher_installed()
    return result, records


@pytest.fixture(scope="module")
def vllm_run(bench, trace, model_dir):
    result, records = _records(bench, "vllm", trace, model_dir)
    assert result.manager_class == "vllm.v1.core.kv_cache_manager.KVCacheManager"
    return result, records


def test_the_head_exercises_the_pool(vllm_run, trace):
    """The scenario is not trivial: every request finishes, some are preempted, prefixes hit."""
    result, records = vllm_run
    assert result.requests == len(trace) >= 20
    preempted = sum(len(r["scheduler_output"]["preempted"] or ()) for r in records)
    hits = sum(s["prefix_cache_stats"]["hits"] for r in records for s in r["engine_outputs"]["stats"]
               if s["prefix_cache_stats"] is not None)
    finished = sum(len(r["engine_outputs"]["outputs"]) for r in records)
    print(f"{len(trace)} requests, {result.steps} steps, {preempted} preemptions, {hits} prefix-hit tokens")
    assert preempted >= 1 and hits >= 16 * 64 and finished >= len(trace)


@pytest.mark.parametrize("side", ["kvcy", "kvcy-keep-hasher"])
def test_kvcy_decides_as_vllm(bench, trace, model_dir, vllm_run, side):
    """Every SchedulerOutput and every engine output of kvcy's side equals vLLM's; the
    instrumented round (the manager behind the timing proxy) decides the same too."""
    want_result, want = vllm_run
    got_result, got = _records(bench, side, trace, model_dir, instrument=side == "kvcy")
    assert got_result.manager_class.startswith("kvcy.")
    assert len(got) == len(want)
    for i, (a, b) in enumerate(zip(want, got)):
        assert a == b, f"step {i} differs"
    assert got_result.digest == want_result.digest
    if side == "kvcy":
        assert got_result.manager_calls > got_result.steps  # the proxy saw the scheduler's calls
