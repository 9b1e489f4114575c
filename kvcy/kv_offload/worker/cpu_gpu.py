"""Moving KV blocks between the GPU tier (canonical KV caches) and a CPU tier, with kvcy.ops.

:class:`SingleDirectionOffloadingHandler` runs the jobs of one direction
(GPU -> CPU stores or CPU -> GPU loads); :class:`CPUOffloadingWorker`
allocates the CPU tier for a :class:`~kvcy.kv_offload.canonical.CanonicalKVCaches`
and routes jobs to a store, a load and an expedited-load handler (vLLM
0.33.0's ``vllm.v1.kv_offload.cpu.gpu_worker`` classes of the same names).

**Geometry.**  Canonical tensor ``t`` is ``(num_gpu_blocks, P_t)`` bytes on
the GPU side and ``(num_cpu_chunks, P_t * blocks_per_chunk)`` on the CPU side:
one CPU chunk (an offloaded block) holds ``blocks_per_chunk`` GPU blocks, GPU
block ``j`` of a chunk at bytes ``[j * P_t, (j + 1) * P_t)``.  A job names GPU
blocks per KV cache group (``GPULoadStoreSpec.group_sizes``) and the chunks
they live in; ``block_indices[g]`` (the request-level index of group ``g``'s
first GPU block) says where in its first chunk that block sits, so group
``g`` spans ``cdiv(group_sizes[g] + block_indices[g] % blocks_per_chunk,
blocks_per_chunk)`` chunks.  Only the first ``CanonicalKVCacheRef.page_size_bytes``
bytes of each block are moved for each ref of the group.

**Execution.**  A job is checked in full before any byte moves (ValueError /
TypeError, nothing copied), then runs as one :func:`kvcy.ops.swap_blocks` per
group and *stack*: the canonical tensors of one GPU allocation that lie
equally spaced (layers of one buffer, or heads cut out of each block) are one
``[L, B, 1, 1, page]`` view, and :class:`CPUOffloadingWorker` lays their CPU
tensors out the same way, so every layout moves a group in one call.  With the GPU tier on CUDA the copies run on the
handler's own stream, after the work already queued on the current stream,
between device memory and pinned host memory; a CUDA event per job tells
:meth:`~SingleDirectionOffloadingHandler.get_finished` when it is done, and
nothing blocks the caller.  With the GPU tier on the CPU (tests, CI, CPU
inference) the same calls copy synchronously and a job is finished when
``transfer_async`` returns.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

import numpy as np
import torch

from kvcy import ops
from kvcy.kv_offload.base import BlockIDsLoadStoreSpec, GPULoadStoreSpec, LoadStoreSpec
from kvcy.kv_offload.canonical import CanonicalKVCacheRef, CanonicalKVCaches, block_rows
from kvcy.kv_offload.cpu.common import CPULoadStoreSpec
from kvcy.kv_offload.worker.worker import (
    OffloadingHandler,
    OffloadingWorker,
    TransferResult,
    TransferSpec,
    check_job_id,
    job_id_set,
    unpack_transfer_spec,
)

__all__ = ["CPUOffloadingWorker", "SingleDirectionOffloadingHandler"]


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _check_count(name: str, value: object, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {int(value)}")
    return int(value)


def _ids(spec: BlockIDsLoadStoreSpec, what: str, limit: int) -> np.ndarray:
    """The spec's block ids as int64, each checked to lie in ``[0, limit)``."""
    ids = np.asarray(spec.block_ids)
    if ids.ndim != 1:
        raise ValueError(f"{what} block ids must be one-dimensional, got shape {ids.shape}")
    if ids.size and ids.dtype.kind not in "iu":
        raise TypeError(f"{what} block ids must be integers, got dtype {ids.dtype}")
    ids = ids.astype(np.int64, copy=False)
    bad = (ids < 0) | (ids >= limit)
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise ValueError(f"{what} block id {int(ids[i])} (position {i}) is out of range [0, {limit})")
    return ids


def _per_group(name: str, values: Sequence[int] | None, num_groups: int, default: list[int]) -> list[int]:
    if values is None:
        return default
    if isinstance(values, (str, bytes)):
        raise TypeError(f"{name} must be a sequence of ints, got {type(values).__name__}")
    out = [_check_count(f"{name}[{i}]", v, 0) for i, v in enumerate(values)]
    if len(out) != num_groups:
        raise ValueError(f"{name} has {len(out)} entries but the KV caches have {num_groups} groups")
    return out


@dataclass
class _Job:
    job_id: int
    num_bytes: int
    start: torch.cuda.Event | None = None
    end: torch.cuda.Event | None = None
    keep_alive: list[torch.Tensor] = field(default_factory=list)


class SingleDirectionOffloadingHandler(OffloadingHandler):
    """Runs the jobs of one direction between GPU-tier and CPU-tier tensors, in submission order.

    Args:
        gpu_tensors: int8 ``(num_gpu_blocks, page_size)`` tensors, rows
            contiguous (:func:`~kvcy.kv_offload.canonical.block_rows` of the
            canonical tensors); CUDA for the asynchronous path, CPU otherwise.
        cpu_tensors: contiguous int8 CPU tensors, ``(num_cpu_chunks,
            page_size * blocks_per_chunk)``, one per GPU tensor, in order
            (pinned when the GPU tier is on CUDA).
        blocks_per_chunk: GPU blocks per CPU chunk (offloaded block).
        layer_refs_per_group: ``CanonicalKVCaches.group_data_refs``.
        gpu_to_cpu: True for stores (GPU -> CPU), False for loads.

    Raises:
        TypeError: tensors of the wrong type or dtype.
        ValueError: shapes, devices or refs that do not fit together.
        NotImplementedError: a ref with a canonical page mapping.
    """

    def __init__(
        self,
        gpu_tensors: list[torch.Tensor],
        cpu_tensors: list[torch.Tensor],
        blocks_per_chunk: int,
        layer_refs_per_group: list[list[CanonicalKVCacheRef]],
        gpu_to_cpu: bool,
    ):
        bpc = _check_count("blocks_per_chunk", blocks_per_chunk, 1)
        gpu_tensors, cpu_tensors = list(gpu_tensors), list(cpu_tensors)
        if not gpu_tensors:
            raise ValueError("no KV cache tensors to offload")
        if len(gpu_tensors) != len(cpu_tensors):
            raise ValueError(f"{len(gpu_tensors)} GPU tensors but {len(cpu_tensors)} CPU tensors")
        device = None
        for i, (g, c) in enumerate(zip(gpu_tensors, cpu_tensors)):
            for side, t in (("gpu", g), ("cpu", c)):
                if not isinstance(t, torch.Tensor):
                    raise TypeError(f"{side}_tensors[{i}] must be a torch.Tensor, got {type(t).__name__}")
                if t.dtype != torch.int8 or t.dim() != 2:
                    raise TypeError(f"{side}_tensors[{i}] must be a 2-D int8 tensor, got {t.dtype} {list(t.shape)}")
            if g.stride(1) != 1 and g.shape[1] > 1:
                raise ValueError(f"gpu_tensors[{i}]: each block's bytes must be contiguous (strides {list(g.stride())})")
            device = g.device if device is None else device
            if g.device != device:
                raise ValueError(f"gpu_tensors[{i}] is on {g.device} but gpu_tensors[0] is on {device}")
            if c.device.type != "cpu":
                raise ValueError(f"cpu_tensors[{i}] must be in host memory, got {c.device}")
            if not c.is_contiguous():
                raise ValueError(f"cpu_tensors[{i}] must be contiguous")
            if c.shape[1] != g.shape[1] * bpc:
                raise ValueError(
                    f"cpu_tensors[{i}] rows hold {c.shape[1]} bytes; {bpc} blocks of {g.shape[1]} bytes need "
                    f"{g.shape[1] * bpc}"
                )
            if g.shape[0] != gpu_tensors[0].shape[0] or c.shape[0] != cpu_tensors[0].shape[0]:
                raise ValueError("all GPU tensors (and all CPU tensors) must have the same number of blocks")
        groups: list[list[tuple[int, int]]] = []
        for gi, refs in enumerate(layer_refs_per_group):
            group: dict[int, int] = {}
            for ref in refs:
                if not isinstance(ref, CanonicalKVCacheRef):
                    raise TypeError(f"group {gi}: refs must be CanonicalKVCacheRef, got {type(ref).__name__}")
                if ref.mapping is not None:
                    raise NotImplementedError("canonical page mappings (vLLM's tensor-parallel layout) are not supported")
                if not 0 <= ref.tensor_idx < len(gpu_tensors):
                    raise ValueError(f"group {gi} refers to tensor {ref.tensor_idx} of {len(gpu_tensors)}")
                if not 0 < ref.page_size_bytes <= gpu_tensors[ref.tensor_idx].shape[1]:
                    raise ValueError(
                        f"group {gi} moves {ref.page_size_bytes} bytes per block of tensor {ref.tensor_idx}, "
                        f"whose blocks hold {gpu_tensors[ref.tensor_idx].shape[1]}"
                    )
                group[ref.tensor_idx] = max(group.get(ref.tensor_idx, 0), ref.page_size_bytes)
            groups.append(sorted(group.items()))
        if not groups:
            raise ValueError("no KV cache groups")

        self.gpu_to_cpu: bool = bool(gpu_to_cpu)
        self.blocks_per_chunk: int = bpc
        self.num_gpu_blocks: int = gpu_tensors[0].shape[0]
        self.num_cpu_chunks: int = cpu_tensors[0].shape[0]
        self._gpu = gpu_tensors
        # CPU tensors seen as (num_cpu_chunks * blocks_per_chunk) GPU-block-sized rows
        self._cpu = [c.view(self.num_cpu_chunks * bpc, g.shape[1]) for g, c in zip(gpu_tensors, cpu_tensors)]
        # per group: its stacks (GPU view, CPU view, bytes per block), and the tensors it writes
        self._stacks = [self._make_stacks(group) for group in groups]
        self._group_bytes = [sum(page for _, page in group) for group in groups]
        users: dict[int, int] = {}
        for group in groups:
            for t, _ in group:
                users[t] = users.get(t, 0) + 1
        # tensors written by several groups: their rows are checked across groups
        self._shared = [[t for t, _ in group if users[t] > 1] for group in groups]
        self._cuda = device.type == "cuda"
        self._stream = torch.cuda.Stream(device=device) if self._cuda else None
        self._device = device
        self._jobs: deque[_Job] = deque()
        self._done: list[TransferResult] = []
        self._held: set[int] = set()
        self._closed = False

    # -- planning -----------------------------------------------------------

    @staticmethod
    def _as_5d(t: torch.Tensor, page: int, count: int, step: int) -> torch.Tensor:
        """``count`` equally spaced (``step`` bytes apart) copies of ``t[:, :page]`` as ``[L, B, 1, 1, page]``."""
        return torch.empty(0, dtype=torch.int8, device=t.device).set_(
            t.untyped_storage(),
            t.storage_offset(),
            (count, t.shape[0], 1, 1, page),
            (step, t.stride(0), page, page, 1),
        )

    def _make_stacks(self, group: list[tuple[int, int]]) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Cut a group's (tensor, page) refs into stacks one swap_blocks call can move.

        Tensors with the same page and row strides that lie equally spaced
        (at least a page apart, so the stacked rows never overlap) in one GPU
        storage, with their CPU tensors equally spaced in one CPU storage,
        become one ``[L, B, 1, 1, page]`` view per side (the L axis walks the
        tensors).
        """

        def geometry(item):
            t, page = item
            g, c = self._gpu[t], self._cpu[t]
            gpu_key = (g.untyped_storage().data_ptr(), g.shape[1], g.stride(0))
            return (page, *gpu_key, c.untyped_storage().data_ptr(), g.storage_offset())

        items = sorted(group, key=geometry)
        stacks = []
        i = 0
        while i < len(items):
            t0, page = items[i]
            key0 = geometry(items[i])[:5]
            j = i + 1
            g_step = c_step = None
            while j < len(items) and geometry(items[j])[:5] == key0:
                tj, tp = items[j - 1][0], items[j][0]
                dg = self._gpu[tp].storage_offset() - self._gpu[tj].storage_offset()
                dc = self._cpu[tp].storage_offset() - self._cpu[tj].storage_offset()
                if g_step is None and dg >= page and dc >= page:
                    g_step, c_step = dg, dc
                elif dg != g_step or dc != c_step:
                    break
                j += 1
            count = j - i
            stacks.append((
                self._as_5d(self._gpu[t0], page, count, g_step or 0),
                self._as_5d(self._cpu[t0], page, count, c_step or 0),
            ))
            i = j
        return stacks

    def _plan(self, src: LoadStoreSpec, dst: LoadStoreSpec) -> tuple[list[tuple[int, torch.Tensor]], int]:
        """Check a job and return its copies: (group, ``[n, 2]`` (src row, dst row)) pairs, and its bytes."""
        gpu_spec, cpu_spec = (src, dst) if self.gpu_to_cpu else (dst, src)
        gpu_side, cpu_side = ("src", "dst") if self.gpu_to_cpu else ("dst", "src")
        if not isinstance(gpu_spec, GPULoadStoreSpec):
            raise TypeError(f"the {gpu_side} spec must be a GPULoadStoreSpec, got {type(gpu_spec).__name__}")
        if not isinstance(cpu_spec, BlockIDsLoadStoreSpec) or isinstance(cpu_spec, GPULoadStoreSpec):
            raise TypeError(f"the {cpu_side} spec must be a CPU block-ids spec, got {type(cpu_spec).__name__}")
        gpu_ids = _ids(gpu_spec, "GPU", self.num_gpu_blocks)
        cpu_ids = _ids(cpu_spec, "CPU", self.num_cpu_chunks)
        num_groups = len(self._stacks)
        if gpu_spec.group_sizes is None and num_groups != 1:
            raise ValueError(f"group_sizes is None (one group) but the KV caches have {num_groups} groups")
        sizes = _per_group("group_sizes", gpu_spec.group_sizes, num_groups, [len(gpu_ids)])
        if sum(sizes) != len(gpu_ids):
            raise ValueError(f"group_sizes add up to {sum(sizes)} but the GPU spec has {len(gpu_ids)} block ids")
        starts = _per_group("block_indices", gpu_spec.block_indices, num_groups, [0] * num_groups)

        bpc = self.blocks_per_chunk
        plan: list[tuple[int, np.ndarray]] = []
        g_off = c_off = 0
        num_bytes = 0
        for g, (n, start) in enumerate(zip(sizes, starts)):
            if n == 0:
                continue
            skip = start % bpc
            num_chunks = _cdiv(n + skip, bpc)
            if c_off + num_chunks > len(cpu_ids):
                raise ValueError(
                    f"group {g} needs {num_chunks} CPU blocks ({n} GPU blocks from block index {start}, "
                    f"{bpc} per CPU block) but the CPU spec has {len(cpu_ids) - c_off} left"
                )
            gpu_rows = gpu_ids[g_off : g_off + n]
            if bpc == 1:
                cpu_rows = cpu_ids[c_off : c_off + n]
            else:
                pos = np.arange(skip, skip + n, dtype=np.int64)
                cpu_rows = cpu_ids[c_off + pos // bpc] * bpc + pos % bpc
            m = np.stack((gpu_rows, cpu_rows) if self.gpu_to_cpu else (cpu_rows, gpu_rows), axis=1)
            plan.append((g, m))
            num_bytes += n * self._group_bytes[g]
            g_off += n
            c_off += num_chunks
        if c_off != len(cpu_ids):
            raise ValueError(f"the CPU spec has {len(cpu_ids)} block ids but the groups use {c_off}")

        # no destination row written twice: within a group, then across the groups sharing a tensor
        for g, m in plan:
            self._check_unique(m[:, 1], f"group {g}")
        shared: dict[int, list[np.ndarray]] = {}
        for g, m in plan:
            for t in self._shared[g]:
                shared.setdefault(t, []).append(m[:, 1])
        for t, rows in shared.items():
            if len(rows) > 1:
                self._check_unique(np.concatenate(rows), f"tensor {t}, shared by several groups")
        return [(g, torch.from_numpy(m)) for g, m in plan], num_bytes

    def _check_unique(self, rows: np.ndarray, where: str) -> None:
        if len(rows) < 2:
            return
        s = np.sort(rows)
        dup = np.flatnonzero(s[1:] == s[:-1])
        if dup.size:
            row = int(s[dup[0]])
            bpc = self.blocks_per_chunk
            what = f"CPU block {row // bpc} (GPU block {row % bpc} in it)" if self.gpu_to_cpu else f"GPU block {row}"
            raise ValueError(f"{what} is written more than once by this job ({where})")

    # -- OffloadingHandler --------------------------------------------------

    def transfer_async(self, job_id: int, spec: TransferSpec) -> bool:
        """Check and start one job (see the module docstring); returns True.

        Raises:
            TypeError: a bad job id or spec types.
            ValueError: a job id still held, block ids out of range, counts
                that do not match ``group_sizes`` / ``block_indices``, or a
                block written twice.  Nothing is copied.
            RuntimeError: the handler was shut down.
        """
        if self._closed:
            raise RuntimeError("this offloading handler has been shut down")
        check_job_id(job_id)
        src, dst = unpack_transfer_spec(spec)
        if job_id in self._held:
            raise ValueError(f"job {job_id} has not been reported finished yet; job ids must be unique")
        plan, num_bytes = self._plan(src, dst)

        job = _Job(job_id, num_bytes)
        if self._cuda:
            job.start = torch.cuda.Event(enable_timing=True)
            job.end = torch.cuda.Event(enable_timing=True)
            job.keep_alive = [m for _, m in plan]
            stream = self._stream
            # Stores read what the model wrote; loads must not overtake writes
            # already queued to their destination blocks.
            stream.wait_stream(torch.cuda.current_stream(self._device))
            with torch.cuda.stream(stream):
                job.start.record(stream)
                self._run(plan)
                job.end.record(stream)
            self._jobs.append(job)
        else:
            t0 = time.perf_counter()
            self._run(plan)
            self._done.append(TransferResult(job_id, True, num_bytes, time.perf_counter() - t0))
        self._held.add(job_id)
        return True

    def _run(self, plan: list[tuple[int, torch.Tensor]]) -> None:
        for g, m in plan:
            for gpu, cpu in self._stacks[g]:
                if self.gpu_to_cpu:
                    ops.swap_blocks(gpu, cpu, m)
                else:
                    ops.swap_blocks(cpu, gpu, m)

    def get_finished(self) -> list[TransferResult]:
        """Jobs finished since the last call, in submission order."""
        results, self._done = self._done, []
        while self._jobs and self._jobs[0].end.query():
            job = self._jobs.popleft()
            seconds = job.start.elapsed_time(job.end) * 1e-3
            results.append(TransferResult(job.job_id, True, job.num_bytes, seconds))
        for r in results:
            self._held.discard(r.job_id)
        return results

    def wait(self, job_ids: set[int]) -> None:
        """Block until the given jobs are done (a no-op for the CPU path, where jobs finish at submit)."""
        ids = job_id_set(job_ids)
        for job in self._jobs:
            if job.job_id in ids:
                job.end.synchronize()

    def shutdown(self) -> None:
        """Wait for in-flight jobs, drop unreported results, refuse further jobs."""
        for job in self._jobs:
            job.end.synchronize()
        self._jobs.clear()
        self._done.clear()
        self._held.clear()
        self._stacks = []
        self._closed = True


class CPUOffloadingWorker(OffloadingWorker):
    """The CPU tier's transfer worker: allocates the CPU cache and runs stores and loads.

    Stores (:class:`~kvcy.kv_offload.base.GPULoadStoreSpec` ->
    :class:`~kvcy.kv_offload.cpu.common.CPULoadStoreSpec`) and loads (the
    reverse) each have a handler; expedited loads have their own, so on CUDA
    they do not queue behind regular loads.

    Args:
        kv_caches: the canonical GPU-tier caches
            (:func:`~kvcy.kv_offload.canonical.canonicalize_kv_caches`).
        blocks_per_chunk: GPU blocks per CPU chunk.
        num_cpu_chunks: chunks in the CPU tier.
        pin_memory: pin the CPU tier; default: when the GPU tier is on CUDA.

    Raises:
        TypeError, ValueError: see :class:`SingleDirectionOffloadingHandler`.
    """

    def __init__(
        self,
        kv_caches: CanonicalKVCaches,
        blocks_per_chunk: int,
        num_cpu_chunks: int,
        *,
        pin_memory: bool | None = None,
    ):
        super().__init__()
        if not isinstance(kv_caches, CanonicalKVCaches):
            raise TypeError(f"kv_caches must be CanonicalKVCaches, got {type(kv_caches).__name__}")
        bpc = _check_count("blocks_per_chunk", blocks_per_chunk, 1)
        chunks = _check_count("num_cpu_chunks", num_cpu_chunks, 0)
        if not kv_caches.tensors:
            raise ValueError("no KV cache tensors to offload")
        gpu_tensors = [block_rows(t) for t in kv_caches.tensors]
        if pin_memory is None:
            pin_memory = gpu_tensors[0].is_cuda
        # Tensors of one GPU allocation with one row geometry get one CPU
        # buffer, in GPU memory order, so a job moves them in one call.
        families: dict[tuple[int, int, int], list[int]] = {}
        for t, g in enumerate(gpu_tensors):
            families.setdefault((g.untyped_storage().data_ptr(), g.shape[1], g.stride(0)), []).append(t)
        cpu: list[torch.Tensor | None] = [None] * len(gpu_tensors)
        for (_, page, _), members in families.items():
            members.sort(key=lambda t: gpu_tensors[t].storage_offset())
            buf = torch.zeros((len(members), chunks, page * bpc), dtype=torch.int8, pin_memory=bool(pin_memory))
            for rank, t in enumerate(members):
                cpu[t] = buf[rank]
        self.cpu_tensors: list[torch.Tensor] = cpu
        self.blocks_per_chunk: int = bpc
        self.num_cpu_chunks: int = chunks

        def make(gpu_to_cpu: bool) -> SingleDirectionOffloadingHandler:
            return SingleDirectionOffloadingHandler(
                gpu_tensors, self.cpu_tensors, bpc, kv_caches.group_data_refs, gpu_to_cpu
            )

        self._store_handler = make(True)
        self._load_handler = make(False)
        self._expedited_load_handler = make(False)
        self.register_handler(GPULoadStoreSpec, CPULoadStoreSpec, self._store_handler)
        self.register_handler(CPULoadStoreSpec, GPULoadStoreSpec, self._load_handler)
        self._add_handler(self._expedited_load_handler)

    @property
    def chunk_size_bytes(self) -> int:
        """Bytes of one CPU chunk across all canonical tensors."""
        return sum(c.shape[1] for c in self.cpu_tensors)

    def submit_load(
        self, job_id: int, src_spec: LoadStoreSpec, dst_spec: GPULoadStoreSpec, expedited: bool = False
    ) -> bool:
        """CPU -> GPU; an expedited load runs on its own handler (and CUDA stream)."""
        if not expedited:
            return super().submit_load(job_id, src_spec, dst_spec)
        check_job_id(job_id)
        if not isinstance(dst_spec, GPULoadStoreSpec):
            raise TypeError(f"submit_load: dst_spec must be a GPULoadStoreSpec, got {type(dst_spec).__name__}")
        src, dst = unpack_transfer_spec((src_spec, dst_spec))
        return self._submit(self._expedited_load_handler, job_id, (src, dst))

    def get_handlers(self) -> Iterator[tuple[type[LoadStoreSpec], type[LoadStoreSpec], OffloadingHandler]]:
        """``(src_type, dst_type, handler)`` per direction, as ``OffloadingSpec.get_handlers`` yields them."""
        yield GPULoadStoreSpec, CPULoadStoreSpec, self._store_handler
        yield CPULoadStoreSpec, GPULoadStoreSpec, self._load_handler
