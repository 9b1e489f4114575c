"""kvcy's CPU tier inside vLLM 0.33.0's own ``OffloadingConnector``: the same decisions.

vLLM's real ``Scheduler`` runs with vLLM's ``OffloadingConnector`` (its scheduler
side; the worker side is a stub that reports every transfer job done one or two
steps after the scheduler issued it, the way vLLM's worker reports them: job
completions in ``OffloadingWorkerMetadata``, finished loads in
``finished_recving``).  The same seeded workload runs twice, once with vLLM's
``CPUOffloadingSpec`` (vLLM's ``CPUOffloadingManager``) and once with kvcy's
``KvcyCPUOffloadingSpec`` loaded by name from ``kv_connector_extra_config``
(kvcy's manager, under whichever twin this process selected), for the LRU and
the ARC policy.  The workload has shared prefixes on a GPU pool too small to
keep them, so prefixes come back from the CPU tier (loads), a CPU tier smaller
than what is offered (evictions), and aborts of waiting, loading and running
requests.  Every ``SchedulerOutput`` must be identical, with every connector
metadata it carries (load and store jobs: request, CPU chunk ids, GPU block ids,
group sizes and indices, sync flag, jobs to flush), and what each step returned.

Also here: ``KVCY_VLLM_OFFLOADING``'s switch (vLLM's default spec name loads
kvcy's spec) and the manager speaking vLLM's types.
"""

from __future__ import annotations

import os
import random
from typing import Any

import pytest

os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import vllm  # noqa: E402

import kvcy  # noqa: E402
from kvcy.kv_offload import vllm_spec  # noqa: E402
from test_vllm_scheduler import (  # noqa: E402,F401  (model_dir: the shared config-only model fixture)
    BLOCK_SIZE,
    EOS,
    VOCAB,
    make_vllm_config,
    model_dir,
    record_engine_outputs,
    record_output,
    sampled_token,
)

NUM_GPU_BLOCKS = 48
CPU_CHUNKS = 100         # smaller than what the workload offers: the tier evicts
NUM_REQUESTS = 140
SEED = 4321
KVCY_SPEC = {"spec_name": "KvcyCPUOffloadingSpec", "spec_module_path": "kvcy.kv_offload.vllm_spec"}
VLLM_SPEC = {"spec_name": "CPUOffloadingSpec"}


def make_kv_cache_config() -> Any:
    import torch
    from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec

    layers = [f"model.decoder.layers.{i}.self_attn.attn" for i in range(2)]
    full = FullAttentionSpec(block_size=BLOCK_SIZE, num_kv_heads=4, head_size=16, dtype=torch.float16)
    return KVCacheConfig(num_blocks=NUM_GPU_BLOCKS, kv_cache_tensors=[], kv_cache_groups=[KVCacheGroupSpec(layers, full)])


def make_scheduler(model_dir: str, spec: dict[str, Any], policy: str, cpu_chunks: int = CPU_CHUNKS) -> Any:
    """vLLM's ``Scheduler`` with vLLM's ``OffloadingConnector`` on a CPU tier of ``cpu_chunks`` chunks."""
    from vllm.config import KVTransferConfig
    from vllm.v1.core.sched.scheduler import Scheduler
    from vllm.v1.structured_output import StructuredOutputManager

    config = make_vllm_config(model_dir, NUM_GPU_BLOCKS, 0.0)
    # 2 layers x K and V x 4 heads x 16 dims x 2 bytes x 16 tokens: 8 KiB of KV per block
    config.kv_transfer_config = KVTransferConfig(
        kv_connector="OffloadingConnector",
        kv_role="kv_both",
        kv_connector_extra_config={**spec, "cpu_bytes_to_use": cpu_chunks * 8192, "eviction_policy": policy},
    )
    scheduler = Scheduler(
        vllm_config=config,
        kv_cache_config=make_kv_cache_config(),
        structured_output_manager=StructuredOutputManager(config),
        block_size=BLOCK_SIZE,
        hash_block_size=BLOCK_SIZE,
        log_stats=True,
    )
    assert scheduler.connector is not None
    assert manager_of(scheduler)._num_chunks == cpu_chunks
    return scheduler


def manager_of(scheduler: Any) -> Any:
    return scheduler.connector.connector_scheduler.manager


def make_workload(seed: int) -> list[tuple[str, tuple[int, ...], int, int]]:
    """(request id, prompt, max_tokens, arrival step): long shared prefixes, arriving in waves."""
    rng = random.Random(seed)

    def tokens(n: int) -> list[int]:
        return [rng.randrange(3, VOCAB) for _ in range(n)]

    prefixes = [tokens(rng.randrange(48, 200)) for _ in range(10)]
    out = []
    step = 0
    for i in range(NUM_REQUESTS):
        prefix = rng.choice(prefixes) if rng.random() < 0.85 else []
        prompt = tuple(prefix + tokens(rng.randrange(1 if prefix else 16, 70)))
        step += rng.choice((0, 1, 1, 2, 4, 8))
        out.append((f"req-{i}", prompt, rng.randrange(1, 40), step))
    return out


def _spec_record(spec: Any) -> dict[str, Any]:
    return {
        "type": type(spec).__name__,
        "block_ids": [int(b) for b in spec.block_ids],
        "group_sizes": None if getattr(spec, "group_sizes", None) is None else [int(x) for x in spec.group_sizes],
        "block_indices": None if getattr(spec, "block_indices", None) is None else [int(x) for x in spec.block_indices],
    }


def record_connector_metadata(meta: Any) -> Any:
    """Every job of an ``OffloadingConnectorMetadata``, as plain values."""
    if meta is None:
        return None

    def jobs(d: dict[int, Any]) -> list[Any]:
        return [(job_id, job.req_id, _spec_record(job.src_spec), _spec_record(job.dst_spec), job.sync)
                for job_id, job in sorted(d.items())]

    return {
        "type": type(meta).__name__,
        "load_jobs": jobs(meta.load_jobs),
        "store_jobs": jobs(meta.store_jobs),
        "jobs_to_flush": None if meta.jobs_to_flush is None else sorted(meta.jobs_to_flush),
    }


def run_scenario(model_dir: str, spec: dict[str, Any], policy: str, seed: int = SEED,
                 wrap_manager: Any = None, max_steps: int = 3000) -> tuple[list[dict[str, Any]], dict[str, int]]:
    """One fresh scheduler through the whole workload; a record per step, and counts of what happened."""
    from vllm.distributed.kv_transfer.kv_connector.v1.offloading.common import OffloadingWorkerMetadata
    from vllm.sampling_params import SamplingParams
    from vllm.utils.hashing import get_hash_fn_by_name
    from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
    from vllm.v1.outputs import KVConnectorOutput, ModelRunnerOutput
    from vllm.v1.request import Request, RequestStatus

    scheduler = make_scheduler(model_dir, spec, policy)
    if wrap_manager is not None:
        conn = scheduler.connector.connector_scheduler
        conn.manager = wrap_manager(conn.manager)
    hash_fn = get_hash_fn_by_name(scheduler.cache_config.prefix_caching_hash_algo)
    init_none_hash(hash_fn)
    block_hasher = get_request_block_hasher(BLOCK_SIZE, hash_fn)
    workload = make_workload(seed)
    rng = random.Random(seed + 1)
    counts = {"loads": 0, "stores": 0, "evicted": 0, "aborts": 0, "flushes": 0}
    pending: list[tuple[int, int, str | None]] = []  # (due step, job id, request whose load ends it)
    records: list[dict[str, Any]] = []
    next_request = 0
    for step in range(max_steps):
        while next_request < len(workload) and workload[next_request][3] <= step:
            req_id, prompt, max_tokens, _ = workload[next_request]
            params = SamplingParams(max_tokens=max_tokens, ignore_eos=False)
            params.update_from_generation_config({}, EOS)
            scheduler.add_request(Request(request_id=req_id, prompt_token_ids=list(prompt), sampling_params=params,
                                          pooling_params=None, arrival_time=float(step), block_hasher=block_hasher))
            next_request += 1
        aborted: list[str] = []
        live = sorted(scheduler.requests)
        if live and rng.random() < 0.05:
            aborted = rng.sample(live, k=min(len(live), rng.choice((1, 1, 2))))
            scheduler.finish_requests(aborted, RequestStatus.FINISHED_ABORTED)
            counts["aborts"] += len(aborted)

        out = scheduler.schedule()
        meta = out.kv_connector_metadata
        record = {"step": step, "aborted": aborted, "scheduler_output": record_output(out),
                  "connector_metadata": record_connector_metadata(meta)}

        # the worker stub: a job is done one or two steps after it was issued
        done_now: dict[int, int] = {}
        if meta is not None:
            for job_id in sorted(meta.jobs_to_flush or ()):
                if job_id in meta.store_jobs:
                    done_now[job_id] = 1
                    counts["flushes"] += 1
            for job_id, job in sorted(meta.load_jobs.items()):
                counts["loads"] += 1
                if job.sync:
                    done_now[job_id] = 1
                else:
                    pending.append((step + rng.choice((1, 1, 2)), job_id, job.req_id))
            for job_id in sorted(meta.store_jobs):
                counts["stores"] += 1
                if job_id not in done_now:
                    pending.append((step + rng.choice((1, 2)), job_id, None))
        finished_recving: set[str] = set()
        still = []
        for due, job_id, load_req in pending:
            if due <= step:
                done_now[job_id] = 1
                if load_req is not None:
                    finished_recving.add(load_req)
            else:
                still.append((due, job_id, load_req))
        pending = still

        req_ids = list(out.num_scheduled_tokens)
        sampled: list[list[int]] = []
        for req_id in req_ids:
            request = scheduler.requests[req_id]
            if request.num_computed_tokens >= request.num_tokens:
                sampled.append([sampled_token(seed, req_id, request.num_tokens)])
            else:
                sampled.append([])
        connector_output = KVConnectorOutput(
            finished_recving=finished_recving or None,
            kv_connector_worker_meta=OffloadingWorkerMetadata(completed_jobs=done_now) if done_now else None,
        )
        runner_output = ModelRunnerOutput(req_ids=req_ids, req_id_to_index={r: i for i, r in enumerate(req_ids)},
                                          sampled_token_ids=sampled, kv_connector_output=connector_output)
        engine_outputs = scheduler.update_from_output(out, runner_output)
        record["engine_outputs"] = record_engine_outputs(engine_outputs)
        # the connector's stats: the manager's gauges and allocation sizes, and its config info
        record["connector_stats"] = [
            without_timings(outs.scheduler_stats.kv_connector_stats) for _, outs in sorted(engine_outputs.items())
            if outs.scheduler_stats is not None
        ]
        records.append(record)
        if next_request == len(workload) and not scheduler.requests and not pending:
            break
    else:  # pragma: no cover
        raise AssertionError(f"the workload did not drain in {max_steps} steps")
    manager = manager_of(scheduler)
    counts["evicted"] = sum(len(e.keys) for e in _evictions(manager))
    records.append({"manager": manager_state(manager)})
    return records, counts


def without_timings(stats: Any) -> Any:
    """A stats payload less the connector's wall-clock metrics (``*_seconds``), which differ run to run."""
    if not stats:
        return stats
    out = dict(stats)
    for section in ("types", "data"):
        if isinstance(out.get(section), dict):
            out[section] = {k: v for k, v in out[section].items() if not k.endswith("_seconds")}
    return out


def _evictions(manager: Any) -> list[Any]:
    return getattr(manager, "_test_evictions", [])


def manager_state(manager: Any) -> dict[str, Any]:
    """What the tier holds at the end: chunk count, free list, evictable and pending counts."""
    inner = getattr(manager, "inner", manager)
    return {
        "allocated": inner._num_allocated_chunks,
        "free": sorted(inner._free_list),
        "evictable": inner._num_evictable_cache_chunks,
        "pending": inner._num_write_pending_chunks,
    }


class CountingManager:
    """A pass-through to a manager that notes the keys each ``prepare_store`` evicted."""

    def __init__(self, inner: Any):
        self.inner = inner
        self._test_evictions: list[Any] = []

    def prepare_store(self, keys: Any, req_context: Any) -> Any:
        out = self.inner.prepare_store(keys, req_context)
        if out is not None and out.evicted_keys:
            self._test_evictions.append(type("E", (), {"keys": list(out.evicted_keys)}))
        return out

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def first_difference(a: list[dict[str, Any]], b: list[dict[str, Any]]) -> str:
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            keys = [k for k in x if x.get(k) != y.get(k)]
            return f"step record {i} differs in {keys}: vLLM {[x.get(k) for k in keys]!r} kvcy {[y.get(k) for k in keys]!r}"
    return f"lengths differ: vLLM {len(a)} records, kvcy {len(b)}"


@pytest.mark.parametrize("policy", ["lru", "arc"])
def test_scheduler_outputs_identical_under_vllm_connector(model_dir: str, policy: str) -> None:
    ref, ref_counts = run_scenario(model_dir, VLLM_SPEC, policy, wrap_manager=CountingManager)
    got, got_counts = run_scenario(model_dir, KVCY_SPEC, policy, wrap_manager=CountingManager)
    # the workload exercises what it is meant to: loads, stores, evictions, aborts
    assert ref_counts["loads"] >= 10 and ref_counts["stores"] >= 50, ref_counts
    assert ref_counts["evicted"] >= 20 and ref_counts["aborts"] >= 5, ref_counts
    assert got_counts == ref_counts
    assert len(got) == len(ref) and got == ref, first_difference(ref, got)


def test_kvcy_spec_builds_kvcys_manager_speaking_vllms_types(model_dir: str) -> None:
    from vllm.v1.kv_offload.base import LookupResult, Medium, OffloadingManager, ReqContext, make_offload_key
    from vllm.v1.kv_offload.cpu.common import CPULoadStoreSpec
    from vllm.v1.kv_offload.cpu.spec import CPUOffloadingSpec

    scheduler = make_scheduler(model_dir, KVCY_SPEC, "arc", cpu_chunks=4)
    connector = scheduler.connector.connector_scheduler
    assert connector.manager._num_chunks == 4
    spec_cls = vllm_spec.KvcyCPUOffloadingSpec
    assert issubclass(spec_cls, CPUOffloadingSpec) and spec_cls.__module__ == "kvcy.kv_offload.vllm_spec"
    manager = connector.manager
    assert type(manager).__module__ == ("kvcy._fast._offload_c" if kvcy.IMPLEMENTATION == "cython"
                                        else "kvcy._fast.offload_py.manager")
    assert isinstance(manager, OffloadingManager) and manager.medium is Medium.CPU

    from vllm.distributed.kv_transfer.kv_connector.v1.offloading.metrics import OffloadingConnectorStats
    from vllm.v1.kv_offload.cpu.manager import CPUOffloadingManager as VllmManager

    from kvcy.kv_offload.cpu import CPUOffloadingManager

    def ops(manager: Any) -> list[Any]:
        ctx = ReqContext(req_id="r")
        manager.on_new_request(ctx)
        keys = [make_offload_key(bytes([i]) * 8, 0) for i in range(5)]
        for i, key in enumerate(keys):
            ctx.set_offload_key_position(key, 16 * (i + 1))
        seen: list[Any] = [manager.lookup(keys[0], ctx)]
        out = manager.prepare_store(keys[:4], ctx)
        seen += [type(out), type(out.store_spec), list(out.store_spec.block_ids), manager.lookup(keys[0], ctx)]
        manager.complete_store(keys[:4], ctx)
        seen.append(manager.lookup(keys[0], ctx))
        out = manager.prepare_store(keys[4:], ctx)  # a full tier of 4 evicts one
        seen += [out.keys_to_store, out.evicted_keys, list(out.store_spec.block_ids)]
        spec = manager.prepare_load(keys[1:3], ctx)
        seen += [type(spec), list(spec.block_ids), type(manager.on_new_request(ctx)), manager.get_load_source(keys[1], ctx)]
        manager.on_request_finished(ctx)
        seen += [list(manager.take_events()), type(manager.get_stats()), manager.medium]
        return seen

    got = ops(vllm_spec.use_vllm_types(CPUOffloadingManager(num_chunks=4, cache_policy="arc", enable_events=True)))
    want = ops(VllmManager(num_chunks=4, cache_policy="arc", enable_events=True))
    assert got == want
    assert got[0] is LookupResult.MISS and got[4] is LookupResult.HIT_PENDING and got[5] is LookupResult.HIT
    assert got[2] is CPULoadStoreSpec and got[7] and got[-2] is OffloadingConnectorStats and got[-1] is Medium.CPU
    assert [(type(e).__module__, e.removed) for e in got[-3]] == [("vllm.v1.kv_offload.base", False), ("vllm.v1.kv_offload.base", True)]


def test_switch_makes_the_default_spec_kvcys(model_dir: str, monkeypatch: pytest.MonkeyPatch) -> None:
    import kvcy.vllm

    assert not vllm_spec.is_installed()
    monkeypatch.setenv("KVCY_VLLM_OFFLOADING", "1")
    try:
        kvcy.vllm.load_general_plugin()
        assert vllm_spec.is_installed()
        scheduler = make_scheduler(model_dir, {}, "lru")  # no spec_name: vLLM's default name
        assert type(manager_of(scheduler)).__module__.startswith("kvcy.")
        vllm_spec.install()  # idempotent
    finally:
        vllm_spec.uninstall()
        kvcy.vllm.uninstall()
    assert not vllm_spec.is_installed()
    scheduler = make_scheduler(model_dir, {}, "lru")
    assert type(manager_of(scheduler)).__module__ == "vllm.v1.kv_offload.cpu.manager"


def test_use_api_types_refuses_what_is_not_a_class() -> None:
    from kvcy.kv_offload.cpu import CPUOffloadingManager

    manager = CPUOffloadingManager(num_chunks=2)
    api = dict(vllm_spec_kwargs())
    api["LookupResult"] = "MISS"
    with pytest.raises(TypeError, match="LookupResult must be a class, got str"):
        manager._use_api_types(**api)
    api = dict(vllm_spec_kwargs())
    api["Medium"] = int
    with pytest.raises(TypeError, match="int has no member CPU"):
        manager._use_api_types(**api)
    assert manager.medium is kvcy.kv_offload.Medium.CPU  # refused: nothing changed


def vllm_spec_kwargs() -> dict[str, Any]:
    from vllm.distributed.kv_transfer.kv_connector.v1.offloading.metrics import OffloadingConnectorStats
    from vllm.v1.kv_offload import base
    from vllm.v1.kv_offload.cpu.common import CPULoadStoreSpec
    from vllm.v1.metrics.cache_hit_source import CacheHitSource

    return dict(LookupResult=base.LookupResult, Medium=base.Medium, CacheHitSource=CacheHitSource,
                OffloadingEvent=base.OffloadingEvent, PrepareStoreOutput=base.PrepareStoreOutput,
                CPULoadStoreSpec=CPULoadStoreSpec, OffloadingConnectorStats=OffloadingConnectorStats,
                RequestOffloadingContext=base.RequestOffloadingContext, ReqContext=base.ReqContext)


def test_the_records_see_the_managers_decisions(model_dir: str) -> None:
    # LRU and ARC evict differently on this workload: the records tell them apart
    lru, _ = run_scenario(model_dir, VLLM_SPEC, "lru")
    arc, _ = run_scenario(model_dir, VLLM_SPEC, "arc")
    assert [r.get("connector_metadata") for r in lru] != [r.get("connector_metadata") for r in arc]
