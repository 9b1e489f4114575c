"""The replay's CPU tier run by vLLM 0.33.0's own ``CPUOffloadingManager`` decides what kvcy's does.

``kvcy replay --cpu-offload`` drives its CPU tier through a ``ReplayConnector``, which
calls the manager only through the ``OffloadingManager`` API.  Here the same replay of
the bundled Mooncake trace's head runs twice: once on kvcy's manager (the active twin)
and once on vLLM's, with a ``count_hits`` shim over vLLM's ``lookup`` (kvcy's batched
lookup; vLLM's connector loops over ``lookup`` the same way).  The decisions digest
covers every lookup hit, loaded chunk id, stored key with its chunk, evicted-key list,
refused store and finished request of the CPU tier, with the GPU manager's decisions:
the two runs must agree on all of them.  Runs where vLLM 0.33.0 imports (.ci/run's vLLM
step); skips elsewhere.
"""

from __future__ import annotations

import os

import pytest

import vllm  # noqa: E402

from vllm.v1.kv_offload.base import LookupResult  # noqa: E402
from vllm.v1.kv_offload.cpu.manager import CPUOffloadingManager as VllmCPUOffloadingManager  # noqa: E402

import kvcy  # noqa: E402
from kvcy import _fast  # noqa: E402
from kvcy.sim import offload as offload_mod  # noqa: E402
from kvcy.sim.scheduler import ReplayConfig, replay  # noqa: E402
from kvcy.sim.traces import bundled_trace_path, read_mooncake  # noqa: E402

LIMIT = int(os.environ.get("KVCY_OFFLOAD_VLLM_REQUESTS", "200"))


class _VllmTier(VllmCPUOffloadingManager):
    """vLLM's manager, with ``count_hits`` as lookups until the first that is not a HIT."""

    def count_hits(self, keys, req_context, start=0, stop=None):
        stop = len(keys) if stop is None else min(stop, len(keys))
        hits = 0
        for key in keys[start:stop]:
            if self.lookup(key, req_context) != LookupResult.HIT:
                break
            hits += 1
        return hits


@pytest.fixture(scope="module")
def trace():
    return read_mooncake(bundled_trace_path(), limit=LIMIT)


def _run(trace, policy, monkeypatch=None):
    # a CPU tier that fills and evicts within the first 200 requests, and still serves hits
    cfg = ReplayConfig(num_blocks=32768, cpu_offload_blocks=100_000, offload_policy=policy)
    return replay(trace, cfg, kvcy.IMPLEMENTATION, timer_overhead=0)


@pytest.mark.parametrize("policy", ["lru", "arc"])
def test_vllms_offloading_manager_makes_the_replays_decisions(trace, policy, monkeypatch):
    ours = _run(trace, policy)

    def vllm_tier(impl, num_blocks, tier_policy, block_size):
        manager = _VllmTier(num_chunks=num_blocks, cache_policy=tier_policy)
        return "vllm", _fast.load("python")["offload"].ReplayConnector(manager, block_size)

    monkeypatch.setattr(offload_mod, "build_tier", vllm_tier)
    theirs = _run(trace, policy)
    assert theirs.offload_impl == "vllm"
    # the tier did work worth comparing: stores, loads from CPU hits, evictions
    assert ours.cpu_blocks_stored > 0 and ours.cpu_hit_tokens > 0 and ours.cpu_evictions > 0
    assert (ours.cpu_hit_tokens, ours.cpu_blocks_stored, ours.cpu_blocks_loaded, ours.cpu_evictions,
            ours.cpu_stores_refused) == (theirs.cpu_hit_tokens, theirs.cpu_blocks_stored, theirs.cpu_blocks_loaded,
                                         theirs.cpu_evictions, theirs.cpu_stores_refused)
    assert ours.decisions_digest == theirs.decisions_digest
