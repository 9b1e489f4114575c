"""Offloading worker throughput on the CPU: CPUOffloadingWorker vs plain torch copies of the same bytes.

Run: ``python -m pytest bench/bench_offload_worker.py --benchmark-only``.

One group per (model size, layout, direction, GPU blocks per CPU block).  Rows:

* ``worker-cpp``: ``CPUOffloadingWorker.transfer_async`` + ``get_finished``
  with the kvcy._C kernels (the whole job: checks, plan, copies);
* ``worker-ref``: the same with kvcy.ops forced to the plain-torch reference;
* ``index_copy``: the same block copies as one ``index_select`` +
  ``index_copy_`` per canonical tensor, plan precomputed (what a hand-written
  torch worker would do per job);
* ``copy_``: one contiguous ``Tensor.copy_`` of the same number of bytes
  (the memory-bandwidth yardstick).

The module prints each row's throughput (bytes moved per second, one way)
and the worker rows' speed relative to ``index_copy``, all from one run.

Torch runs single-threaded here (``KVCY_BENCH_THREADS``, default 1): on the
shared 2-core VMs this project runs on, torch's OpenMP regions stall whenever
another process holds a core, which turned a 16 MiB ``copy_`` from 6 GB/s
into 1 GB/s and ``index_copy`` into 0.01-0.1 GB/s; one thread measures the
copies rather than the scheduler.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from kvcy import ops  # noqa: E402
from kvcy.kv_cache_interface import FullAttentionSpec, KVCacheLayout, reshape_kv_cache  # noqa: E402
from kvcy.kv_offload.base import GPULoadStoreSpec  # noqa: E402
from kvcy.kv_offload.canonical import block_rows, canonicalize_kv_caches  # noqa: E402
from kvcy.kv_offload.cpu.common import CPULoadStoreSpec  # noqa: E402
from kvcy.kv_offload.worker import CPUOffloadingWorker  # noqa: E402


@dataclass(frozen=True)
class Model:
    name: str
    layers: int
    heads: int
    head_size: int
    block_size: int
    num_blocks: int
    job_blocks: int  # GPU blocks per job


MODELS = [
    # 8 layers x 64 KiB pages: 512 KiB per block, 16 MiB per job
    Model("large", layers=8, heads=8, head_size=128, block_size=16, num_blocks=96, job_blocks=32),
    # 4 layers x 2 KiB pages: per-job overhead dominates
    Model("small", layers=4, heads=2, head_size=32, block_size=8, num_blocks=256, job_blocks=64),
]
LAYOUTS = [KVCacheLayout.LBNHC, KVCacheLayout.LHBNC]  # one run per block / heads outside blocks
ROWS = ["worker-cpp", "worker-ref", "index_copy", "copy_"]


@dataclass
class _Results:
    rows: dict[str, dict[str, tuple[float, int]]] = field(default_factory=dict)


RESULTS = _Results()


class Setup:
    def __init__(self, model: Model, layout: KVCacheLayout, bpc: int):
        spec = FullAttentionSpec(
            block_size=model.block_size, num_kv_heads=model.heads, head_size=model.head_size, dtype=torch.float16
        )
        raw = torch.randint(-128, 128, (model.layers * model.num_blocks * spec.page_size_bytes,), dtype=torch.int8)
        views = reshape_kv_cache(raw, spec, model.num_blocks, model.layers, layout)
        names = [f"l{i}" for i in range(model.layers)]
        self.canon = canonicalize_kv_caches(dict(zip(names, views)), [names])
        num_chunks = model.num_blocks // bpc
        self.worker = CPUOffloadingWorker(self.canon, blocks_per_chunk=bpc, num_cpu_chunks=num_chunks)
        rng = np.random.default_rng(0)
        n = model.job_blocks
        self.gpu_ids = sorted(rng.permutation(model.num_blocks)[:n].tolist())
        self.cpu_ids = rng.permutation(num_chunks)[: n // bpc].tolist()
        self.gpu_spec = GPULoadStoreSpec(self.gpu_ids, [n], [0])
        self.cpu_spec = CPULoadStoreSpec(self.cpu_ids)
        self.nbytes = n * model.layers * spec.page_size_bytes
        # the plain-torch plan: row indices per canonical tensor (all rows of one block size)
        pos = np.arange(n)
        cpu_rows = np.asarray(self.cpu_ids)[pos // bpc] * bpc + pos % bpc
        self.gpu_idx = torch.tensor(self.gpu_ids, dtype=torch.int64)
        self.cpu_idx = torch.from_numpy(cpu_rows.astype(np.int64))
        self.gpu_rows = [block_rows(t) for t in self.canon.tensors]
        self.cpu_rows = [c.view(-1, g.shape[1]) for c, g in zip(self.worker.cpu_tensors, self.gpu_rows)]
        self.job_id = 0

    def worker_fn(self, store: bool):
        spec = (self.gpu_spec, self.cpu_spec) if store else (self.cpu_spec, self.gpu_spec)

        def run():
            self.job_id += 1
            self.worker.transfer_async(self.job_id, spec)
            (result,) = self.worker.get_finished()
            assert result.success

        return run

    def index_copy_fn(self, store: bool):
        pairs = list(zip(self.gpu_rows, self.cpu_rows))

        def run():
            for g, c in pairs:
                if store:
                    c.index_copy_(0, self.cpu_idx, g.index_select(0, self.gpu_idx))
                else:
                    g.index_copy_(0, self.gpu_idx, c.index_select(0, self.cpu_idx))

        return run

    def copy_fn(self):
        src = torch.randint(-128, 128, (self.nbytes,), dtype=torch.int8)
        dst = torch.empty_like(src)
        return lambda: dst.copy_(src)


@pytest.fixture(scope="module", autouse=True)
def _threads():
    before = torch.get_num_threads()
    torch.set_num_threads(int(os.environ.get("KVCY_BENCH_THREADS", "1")))
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module", autouse=True)
def _summary(write_summary, _threads):
    yield
    if not RESULTS.rows:
        return
    lines = [
        "",
        f"offload worker (CPU, {torch.get_num_threads()} torch thread(s)): bytes moved per second, "
        "worker rows vs index_copy (>1 = faster)",
    ]
    for group, rows in RESULTS.rows.items():
        parts = [f"{name} {nb / mean / 1e9:6.2f} GB/s" for name, (mean, nb) in rows.items()]
        for name in ("worker-cpp", "worker-ref"):
            if name in rows and "index_copy" in rows:
                parts.append(f"{name}/index_copy {rows['index_copy'][0] / rows[name][0]:5.2f}x")
        lines.append(f"  {group:<34} " + " | ".join(parts))
    write_summary(lines)


@pytest.mark.parametrize("row", ROWS)
@pytest.mark.parametrize("bpc", [1, 2], ids=["bpc1", "bpc2"])
@pytest.mark.parametrize("direction", ["store", "load"])
@pytest.mark.parametrize("layout", LAYOUTS, ids=lambda m: m.name)
@pytest.mark.parametrize("model", MODELS, ids=lambda m: m.name)
def test_offload_throughput(benchmark, monkeypatch, model, layout, direction, bpc, row):
    if row == "worker-cpp" and not ops.HAS_EXTENSION:
        pytest.skip("kvcy._C not loaded")
    if row == "worker-ref":
        monkeypatch.setattr(ops, "HAS_EXTENSION", False)
    s = Setup(model, layout, bpc)
    store = direction == "store"
    fn = {"index_copy": lambda: s.index_copy_fn(store), "copy_": s.copy_fn}.get(row, lambda: s.worker_fn(store))()
    group = f"{model.name} {layout.name} {direction} bpc={bpc}"
    benchmark.group = group
    fn()  # warm up
    benchmark(fn)
    if benchmark.stats is None:  # --benchmark-disable: ran once, nothing timed
        return
    mean = benchmark.stats.stats.mean
    benchmark.extra_info["bytes"] = s.nbytes
    benchmark.extra_info["GB/s"] = round(s.nbytes / mean / 1e9, 3)
    RESULTS.rows.setdefault(group, {})[row] = (mean, s.nbytes)
