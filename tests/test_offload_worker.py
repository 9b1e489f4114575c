"""Canonical KV caches and the offloading transfer worker (kvcy.kv_offload.canonical / .worker).

Round trips GPU tier -> CPU tier -> GPU tier are checked bit for bit on every
KVCacheLayout and block-copy dtype, with one and two KV cache groups, CPU
blocks of one and two GPU blocks, and first GPU blocks that sit mid CPU block
(block_indices).  The CPU tier's bytes are also checked against an oracle
written as plain loops over the spec.  Bad jobs must raise before any byte
moves: every error test compares all GPU-tier and CPU-tier bytes before and
after.  The GPU tier lives on the CPU here; the CUDA cases skip without a GPU.
"""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from kvcy import ops  # noqa: E402
from kvcy.kv_cache_interface import (  # noqa: E402
    FullAttentionSpec,
    KVCacheConfig,
    KVCacheGroupSpec,
    KVCacheLayout,
    KVCacheTensor,
    reshape_kv_cache,
)
from kvcy.kv_offload.base import GPULoadStoreSpec, LoadStoreSpec  # noqa: E402
from kvcy.kv_offload.canonical import (  # noqa: E402
    CanonicalKVCacheRef,
    CanonicalKVCaches,
    CanonicalKVCacheTensor,
    block_rows,
    canonicalize_kv_caches,
)
from kvcy.kv_offload.cpu.common import CPULoadStoreSpec  # noqa: E402
from kvcy.kv_offload.worker import (  # noqa: E402
    CPUOffloadingWorker,
    OffloadingHandler,
    OffloadingWorker,
    SingleDirectionOffloadingHandler,
    TransferResult,
)

FP8 = torch.float8_e4m3fn
DTYPES = [torch.float16, torch.bfloat16, torch.float32, FP8]
DTYPE_IDS = ["fp16", "bf16", "fp32", "fp8"]
LAYOUTS = list(KVCacheLayout)
NUM_BLOCKS = 12

_CUDA_SKIP = None if torch.cuda.is_available() else f"no CUDA device visible to torch {torch.__version__}"
DEVICES = [
    pytest.param("cpu", id="cpu"),
    pytest.param(
        "cuda", id="cuda", marks=[pytest.mark.gpu, pytest.mark.skipif(_CUDA_SKIP is not None, reason=_CUDA_SKIP or "")]
    ),
]


# ---------------------------------------------------------------------------
# Helpers
# ---------------------------------------------------------------------------


class Caches:
    """Per-layer KV caches of one model: raw byte buffers and their reshape_kv_cache views."""

    def __init__(self, layout, dtype, group_layers=(2, 1), num_blocks=NUM_BLOCKS, device="cpu", shared=False, seed=0):
        spec = FullAttentionSpec(block_size=4, num_kv_heads=2, head_size=8, dtype=dtype)
        self.gen = torch.Generator().manual_seed(seed)
        self.raws: list[torch.Tensor] = []
        self.kv: dict[str, torch.Tensor] = {}
        self.groups: list[list[str]] = []
        tensors = []
        if shared:
            # every group's layer i shares layer slot i of one allocation (kvcy's hybrid sharing)
            n = max(group_layers)
            slots = [[f"g{g}.l{i}" for g in range(len(group_layers)) if i < group_layers[g]] for i in range(n)]
            tensors.append(KVCacheTensor(size=n * num_blocks * spec.page_size_bytes, shared_by=slots))
        else:
            for g, n in enumerate(group_layers):
                slots = [[f"g{g}.l{i}"] for i in range(n)]
                tensors.append(KVCacheTensor(size=n * num_blocks * spec.page_size_bytes, shared_by=slots))
        for kt in tensors:
            raw = torch.randint(-128, 128, (kt.size,), dtype=torch.int8, generator=self.gen).to(device)
            views = reshape_kv_cache(raw, spec, num_blocks, kt.num_layer_slots, layout)
            for slot, names in enumerate(kt.shared_by):
                for name in names:
                    self.kv[name] = views[slot]
            self.raws.append(raw)
        self.groups = [[f"g{g}.l{i}" for i in range(n)] for g, n in enumerate(group_layers)]
        self.config = KVCacheConfig(
            num_blocks=num_blocks,
            kv_cache_tensors=tensors,
            kv_cache_groups=[KVCacheGroupSpec(names, spec) for names in self.groups],
        )

    def snapshot(self) -> list[torch.Tensor]:
        return [r.clone() for r in self.raws]

    def scramble(self) -> None:
        for r in self.raws:
            r.copy_(torch.randint(-128, 128, r.shape, dtype=torch.int8, generator=self.gen).to(r.device))

    def block(self, name: str, block_id: int) -> torch.Tensor:
        """Bytes of one block of one layer, logical order."""
        return self.kv[name][block_id].cpu().clone().view(torch.uint8)


def assert_bytes_equal(a: list[torch.Tensor], b: list[torch.Tensor]) -> None:
    assert len(a) == len(b)
    for x, y in zip(a, b):
        assert torch.equal(x.cpu().view(torch.uint8), y.cpu().view(torch.uint8))


def expected_placements(gpu_ids, cpu_ids, group_sizes, block_indices, bpc):
    """Oracle: per group, the (gpu block, cpu chunk, GPU-block slot in the chunk) triples, by plain loops."""
    out = []
    g_off = c_off = 0
    for n, start in zip(group_sizes, block_indices):
        triples = []
        if n:
            skip = start % bpc
            for j in range(n):
                p = skip + j
                triples.append((gpu_ids[g_off + j], cpu_ids[c_off + p // bpc], p % bpc))
            g_off += n
            c_off += (skip + n + bpc - 1) // bpc
        out.append(triples)
    assert g_off == len(gpu_ids) and c_off == len(cpu_ids)
    return out


def check_cpu_tier(worker, canon, placements) -> None:
    """Every placed GPU block's moved bytes are in its CPU chunk slot."""
    bpc = worker.blocks_per_chunk
    for g, triples in enumerate(placements):
        for ref in canon.group_data_refs[g]:
            rows = block_rows(canon.tensors[ref.tensor_idx]).cpu()
            cpu = worker.cpu_tensors[ref.tensor_idx].view(worker.num_cpu_chunks, bpc, -1)
            for gpu_id, chunk, slot in triples:
                assert torch.equal(cpu[chunk, slot, : ref.page_size_bytes], rows[gpu_id, : ref.page_size_bytes])


def make_job(rng, num_groups, bpc, num_chunks, num_blocks=NUM_BLOCKS, max_per_group=4):
    """Random disjoint GPU blocks per group, block indices with offsets, distinct CPU chunks."""
    perm = rng.permutation(num_blocks).tolist()
    sizes = [int(rng.integers(1, max_per_group + 1)) for _ in range(num_groups)]
    starts = [int(rng.integers(0, 5)) for _ in range(num_groups)]
    gpu_ids = perm[: sum(sizes)]
    need = sum((s % bpc + n + bpc - 1) // bpc for n, s in zip(sizes, starts))
    cpu_ids = rng.permutation(num_chunks)[:need].tolist()
    return gpu_ids, cpu_ids, sizes, starts


def round_trip(caches: Caches, bpc: int, seed: int, num_chunks: int = 16, relocate: bool = True):
    """Store random blocks, check the CPU tier, scramble the GPU tier, load (elsewhere), compare."""
    rng = np.random.default_rng(seed)
    canon = canonicalize_kv_caches(caches.kv, caches.groups)
    worker = CPUOffloadingWorker(canon, blocks_per_chunk=bpc, num_cpu_chunks=num_chunks)
    G = len(caches.groups)
    gpu_ids, cpu_ids, sizes, starts = make_job(rng, G, bpc, num_chunks)
    before = {(name, b): caches.block(name, b) for g in range(G) for name in caches.groups[g] for b in gpu_ids}

    assert worker.submit_store(7, GPULoadStoreSpec(gpu_ids, sizes, starts), CPULoadStoreSpec(cpu_ids))
    worker.wait({7})
    done = worker.get_finished()
    page_bytes = [sum(r.page_size_bytes for r in refs) for refs in canon.group_data_refs]
    assert [(r.job_id, r.success, r.transfer_size) for r in done] == [
        (7, True, sum(n * p for n, p in zip(sizes, page_bytes)))
    ]
    placements = expected_placements(gpu_ids, cpu_ids, sizes, starts, bpc)
    check_cpu_tier(worker, canon, placements)

    caches.scramble()
    untouched = caches.snapshot()
    # load each group back into other GPU blocks (or the same ones)
    targets = list(rng.permutation(NUM_BLOCKS)[: len(gpu_ids)]) if relocate else list(gpu_ids)
    targets = [int(t) for t in targets]
    assert worker.submit_load(8, CPULoadStoreSpec(cpu_ids), GPULoadStoreSpec(targets, sizes, starts))
    worker.wait({8})
    assert [(r.job_id, r.success) for r in worker.get_finished()] == [(8, True)]
    g_off = 0
    written = set()
    for g, n in enumerate(sizes):
        for j in range(n):
            src, dst = gpu_ids[g_off + j], targets[g_off + j]
            written.add(dst)
            for name in caches.groups[g]:
                assert torch.equal(caches.block(name, dst), before[(name, src)]), (name, src, dst)
        g_off += n
    # blocks no job wrote keep the scrambled bytes
    for name in caches.kv:
        for b in range(NUM_BLOCKS):
            if b not in written:
                assert torch.equal(caches.block(name, b), _block_of(untouched, caches, name, b))
    return worker, canon


def _block_of(raws_snapshot, caches: Caches, name: str, b: int) -> torch.Tensor:
    """The bytes block b of layer `name` had in a snapshot of the raw buffers."""
    view = caches.kv[name]
    for raw, snap in zip(caches.raws, raws_snapshot):
        if view.untyped_storage().data_ptr() == raw.untyped_storage().data_ptr():
            alt = torch.as_strided(
                snap.view(view.dtype), view.shape, view.stride(), view.storage_offset()
            )
            return alt[b].cpu().clone().view(torch.uint8)
    raise AssertionError("view not found")


# ---------------------------------------------------------------------------
# canonicalize_kv_caches
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("layout", LAYOUTS, ids=[lay.name for lay in LAYOUTS])
def test_canonical_views_share_storage_and_cover_each_block(layout):
    caches = Caches(layout, torch.float16, group_layers=(2, 1))
    canon = canonicalize_kv_caches(caches.kv, caches.config)
    assert len(canon.group_data_refs) == 2
    for t in canon.tensors:
        assert t.tensor.dtype == torch.int8 and t.tensor.dim() == 2
        assert t.tensor.shape == (NUM_BLOCKS, t.page_size_bytes) and t.tensor.stride(1) == 1
        assert any(t.tensor.untyped_storage().data_ptr() == r.untyped_storage().data_ptr() for r in caches.raws)
    # a group's refs cover exactly its layers' pages, and every tensor is used once
    page = caches.config.kv_cache_groups[0].kv_cache_spec.page_size_bytes
    assert [sum(r.page_size_bytes for r in refs) for refs in canon.group_data_refs] == [2 * page, page]
    assert sorted(r.tensor_idx for refs in canon.group_data_refs for r in refs) == list(range(len(canon.tensors)))
    # writing through a canonical view changes the original cache: no copy was made
    before = caches.block("g1.l0", 4).clone()
    for ref in canon.group_data_refs[1]:
        block_rows(canon.tensors[ref.tensor_idx])[5].fill_(0x11)
    assert caches.block("g1.l0", 5).eq(0x11).all()
    assert torch.equal(caches.block("g1.l0", 4), before)


def test_canonical_splits_kv_stacked_in_front_of_blocks():
    x = torch.randn(2, NUM_BLOCKS, 4, 2, 8, dtype=torch.bfloat16)  # vLLM FlashAttention style
    canon = canonicalize_kv_caches({"a": x}, [["a"]], block_dim=1)
    assert [t.page_size_bytes for t in canon.tensors] == [128, 128]
    assert [r.tensor_idx for r in canon.group_data_refs[0]] == [0, 1]
    assert torch.equal(canon.tensors[1].tensor[3], x[1, 3].contiguous().view(torch.int8).reshape(-1))


def test_canonical_physical_cache_with_layout():
    cache = ops.empty_cache((3, NUM_BLOCKS, 2, 4, 16), KVCacheLayout.LHBNC, dtype=torch.float16)
    canon = canonicalize_kv_caches({"a": cache}, [["a"]], layout="LHBNC")
    # L and H are outside the blocks: 3 * 2 runs of N * C elements
    assert len(canon.tensors) == 6 and {t.page_size_bytes for t in canon.tensors} == {4 * 16 * 2}


def test_canonical_key_and_value_tensors_and_kernel_blocks():
    k = torch.zeros(2 * NUM_BLOCKS, 2, 4, 8, dtype=torch.float32)
    v = torch.zeros(2 * NUM_BLOCKS, 2, 4, 8, dtype=torch.float32)
    canon = canonicalize_kv_caches({"a": (k, v)}, [["a"]], num_blocks=NUM_BLOCKS)
    # two kernel blocks per KV cache block, keys and values in two tensors
    assert [t.tensor.shape for t in canon.tensors] == [(NUM_BLOCKS, 512), (NUM_BLOCKS, 512)]
    block_rows(canon.tensors[1])[1].fill_(1)
    assert v.view(torch.int8)[2:4].ne(0).all() and v.view(torch.int8)[:2].eq(0).all() and k.eq(0).all()


def test_canonical_aliased_layers_share_one_tensor():
    caches = Caches(KVCacheLayout.LBHNC, torch.float16, group_layers=(2, 2), shared=True)
    canon = canonicalize_kv_caches(caches.kv, caches.groups)
    assert len(canon.tensors) == 2
    assert [[r.tensor_idx for r in g] for g in canon.group_data_refs] == [[0, 1], [0, 1]]


@pytest.mark.parametrize(
    "kv, groups, kwargs, exc, match",
    [
        ({"a": torch.zeros(4, 8)}, [["b"]], {}, ValueError, "layer 'b' of KV cache group 0 has no tensor"),
        ({"a": [1, 2]}, [["a"]], {}, TypeError, r"kv_caches\['a'\]\[0\] must be a torch.Tensor"),
        ({"a": torch.zeros(4, 8), "b": torch.zeros(6, 8)}, [["a", "b"]], {}, ValueError, "not a multiple of num_blocks=4"),
        ({"a": torch.zeros(4, 0)}, [["a"]], {}, ValueError, "empty tensor"),
        ({"a": torch.zeros(4, 8)}, [["a"]], {"block_dim": 2}, ValueError, "block_dim 2 is out of range"),
        ({"a": torch.zeros(4, 8)}, [[]], {}, ValueError, "no KV cache layers"),
        ({"a": torch.zeros(4, 8)}, "a", {}, TypeError, "kv_cache_groups must be"),
        ({"a": torch.zeros(4, 8)}, [["a"]], {"num_blocks": 0}, ValueError, "num_blocks must be >= 1"),
        ({"a": torch.zeros(4, 8, device="meta")}, [["a"]], {}, ValueError, "meta tensor"),
        ({"a": torch.zeros(4, 64, 64)[:, :, ::2]}, [["a"]], {}, ValueError, "not a block-structured KV cache"),
        ({"a": torch.zeros(64).as_strided((4, 8), (4, 1))}, [["a"]], {}, ValueError, "blocks overlap"),
        ({"a": torch.zeros(4, 8)}, [["a"]], {"layout": "LBHNC"}, ValueError, "must be a 5-D tensor"),
    ],
)
def test_canonicalize_rejects_bad_input(kv, groups, kwargs, exc, match):
    with pytest.raises(exc, match=match):
        canonicalize_kv_caches(kv, groups, **kwargs)


def test_canonical_dataclasses_validate():
    with pytest.raises(TypeError, match="must be a torch.Tensor"):
        CanonicalKVCacheTensor(tensor=[0], page_size_bytes=4)
    with pytest.raises(ValueError, match="page_size_bytes must be >= 1"):
        CanonicalKVCacheTensor(tensor=torch.zeros(2, 4, dtype=torch.int8), page_size_bytes=0)
    with pytest.raises(ValueError, match="tensor_idx must be >= 0"):
        CanonicalKVCacheRef(tensor_idx=-1, page_size_bytes=4)
    t = CanonicalKVCacheTensor(tensor=torch.zeros(2, 4, dtype=torch.int8), page_size_bytes=4)
    with pytest.raises(ValueError, match="group 0 refers to tensor 1 but there are 1 tensors"):
        CanonicalKVCaches(tensors=[t], group_data_refs=[[CanonicalKVCacheRef(1, 4)]])
    with pytest.raises(ValueError, match="moves 8 bytes per block of tensor 0, whose rows hold 4"):
        CanonicalKVCaches(tensors=[t], group_data_refs=[[CanonicalKVCacheRef(0, 8)]])
    with pytest.raises(ValueError, match=r"cannot be viewed as int8 \(num_blocks, 3\) rows"):
        block_rows(CanonicalKVCacheTensor(tensor=torch.zeros(2, 4, dtype=torch.int8), page_size_bytes=3))


# ---------------------------------------------------------------------------
# Round trips
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("bpc", [1, 2], ids=["bpc1", "bpc2"])
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
@pytest.mark.parametrize("layout", LAYOUTS, ids=[lay.name for lay in LAYOUTS])
def test_round_trip_is_bit_exact(layout, dtype, bpc):
    round_trip(Caches(layout, dtype, group_layers=(2, 1)), bpc, seed=hash((layout.name, bpc)) % 1000)


@pytest.mark.parametrize("bpc", [1, 2, 3], ids=["bpc1", "bpc2", "bpc3"])
def test_round_trip_one_group_and_shared_slots(bpc):
    round_trip(Caches(KVCacheLayout.BLHNC, torch.bfloat16, group_layers=(3,)), bpc, seed=1, relocate=False)
    round_trip(Caches(KVCacheLayout.LBNHC, FP8, group_layers=(2, 1, 2), shared=True), bpc, seed=2)


def test_padded_rows_move_only_the_ref_page():
    gpu = torch.arange(4 * 16, dtype=torch.int32).to(torch.int8).reshape(4, 16)
    canon = CanonicalKVCaches([CanonicalKVCacheTensor(gpu, 16)], [[CanonicalKVCacheRef(0, 10)]])
    w = CPUOffloadingWorker(canon, blocks_per_chunk=2, num_cpu_chunks=2)
    w.submit_store(1, GPULoadStoreSpec([2, 3], [2], [1]), CPULoadStoreSpec([0, 1]))
    cpu = w.cpu_tensors[0].view(2, 2, 16)
    assert torch.equal(cpu[0, 1, :10], gpu[2, :10]) and torch.equal(cpu[1, 0, :10], gpu[3, :10])
    assert cpu[:, :, 10:].eq(0).all() and cpu[0, 0].eq(0).all() and cpu[1, 1].eq(0).all()
    assert [(r.job_id, r.success, r.transfer_size) for r in w.get_finished()] == [(1, True, 20)]


def test_group_sizes_none_means_one_group_and_empty_groups_use_no_chunks():
    caches = Caches(KVCacheLayout.LBHNC, torch.float32, group_layers=(1,))
    canon = canonicalize_kv_caches(caches.kv, caches.groups)
    w = CPUOffloadingWorker(canon, blocks_per_chunk=1, num_cpu_chunks=4)
    assert w.submit_store(1, GPULoadStoreSpec([4, 5]), CPULoadStoreSpec([3, 0]))
    check_cpu_tier(w, canon, [[(4, 3, 0), (5, 0, 0)]])
    caches2 = Caches(KVCacheLayout.LBHNC, torch.float32, group_layers=(1, 1))
    canon2 = canonicalize_kv_caches(caches2.kv, caches2.groups)
    w2 = CPUOffloadingWorker(canon2, blocks_per_chunk=2, num_cpu_chunks=4)
    assert w2.submit_store(1, GPULoadStoreSpec([6], [0, 1], [3, 5]), CPULoadStoreSpec([2]))
    check_cpu_tier(w2, canon2, [[], [(6, 2, 1)]])
    results = w2.get_finished()
    assert len(results) == 1 and results[0].transfer_time is not None and results[0].transfer_time >= 0


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    layout=st.sampled_from(LAYOUTS),
    dtype=st.sampled_from(DTYPES),
    bpc=st.integers(1, 4),
    groups=st.lists(st.integers(1, 3), min_size=1, max_size=3),
    seed=st.integers(0, 2**16),
)
def test_round_trip_random_configs(layout, dtype, bpc, groups, seed):
    round_trip(Caches(layout, dtype, group_layers=tuple(groups), seed=seed), bpc, seed=seed, num_chunks=20)


# ---------------------------------------------------------------------------
# Bad jobs: clear errors, nothing copied
# ---------------------------------------------------------------------------


@pytest.fixture
def two_groups():
    caches = Caches(KVCacheLayout.LBHNC, torch.float16, group_layers=(2, 1))
    canon = canonicalize_kv_caches(caches.kv, caches.groups)
    worker = CPUOffloadingWorker(canon, blocks_per_chunk=2, num_cpu_chunks=6)
    # fill the CPU tier with a pattern so that a stray load would show
    for c in worker.cpu_tensors:
        c.copy_(torch.randint(-128, 128, c.shape, dtype=torch.int8))
    return caches, worker


def _neg(spec, pos):
    spec.block_ids = spec.block_ids.copy()
    spec.block_ids[pos] = -1
    return spec


def _mutate(spec, **attrs):
    for k, v in attrs.items():
        setattr(spec, k, v)
    return spec


# (kind, spec factory, exception, message); the valid job is
# store GPU [1,2,3 | 4,5] groups (3, 2) from block indices (1, 0) into chunks [0,1 | 2]
BAD_JOBS = [
    ("store", lambda: (GPULoadStoreSpec([1, 2, 3, 4, 12], [3, 2], [1, 0]), CPULoadStoreSpec([0, 1, 2])),
     ValueError, r"GPU block id 12 \(position 4\) is out of range \[0, 12\)"),
    ("store", lambda: (GPULoadStoreSpec([1, 2, 3, 4, 5], [3, 2], [1, 0]), CPULoadStoreSpec([0, 1, 6])),
     ValueError, r"CPU block id 6 \(position 2\) is out of range \[0, 6\)"),
    ("store", lambda: (_neg(GPULoadStoreSpec([1, 2, 3, 4, 5], [3, 2], [1, 0]), 3), CPULoadStoreSpec([0, 1, 2])),
     ValueError, r"GPU block id -1 \(position 3\) is out of range"),
    ("load", lambda: (_neg(CPULoadStoreSpec([0, 1, 2]), 2), GPULoadStoreSpec([1, 2, 3, 4, 5], [3, 2], [1, 0])),
     ValueError, r"CPU block id -1 \(position 2\) is out of range"),
    ("store", lambda: (GPULoadStoreSpec([1, 2, 3, 4, 5], [3, 2], [1, 0]), CPULoadStoreSpec([0, 1])),
     ValueError, "group 1 needs 1 CPU blocks .* but the CPU spec has 0 left"),
    ("store", lambda: (GPULoadStoreSpec([1, 2, 3, 4, 5], [3, 2], [1, 0]), CPULoadStoreSpec([0, 1, 2, 3])),
     ValueError, "the CPU spec has 4 block ids but the groups use 3"),
    ("store", lambda: (GPULoadStoreSpec([1, 2, 3, 4, 5], [3, 2], [0, 0]), CPULoadStoreSpec([0, 1, 2, 4])),
     ValueError, "the CPU spec has 4 block ids but the groups use 3"),
    ("store", lambda: (_mutate(GPULoadStoreSpec([1, 2, 3, 4, 5], [3, 2], [1, 0]), group_sizes=(5,)),
                       CPULoadStoreSpec([0, 1, 2])),
     ValueError, "group_sizes has 1 entries but the KV caches have 2 groups"),
    ("store", lambda: (_mutate(GPULoadStoreSpec([1, 2, 3, 4, 5], [3, 2], [1, 0]), group_sizes=(3, 3)),
                       CPULoadStoreSpec([0, 1, 2])),
     ValueError, "group_sizes add up to 6 but the GPU spec has 5 block ids"),
    ("store", lambda: (GPULoadStoreSpec([1, 2, 3, 4, 5]), CPULoadStoreSpec([0, 1, 2])),
     ValueError, "group_sizes is None .* but the KV caches have 2 groups"),
    ("store", lambda: (_mutate(GPULoadStoreSpec([1, 2, 3, 4, 5], [3, 2], [1, 0]), block_indices=(1, -2)),
                       CPULoadStoreSpec([0, 1, 2])),
     ValueError, r"block_indices\[1\] must be >= 0, got -2"),
    ("store", lambda: (_mutate(GPULoadStoreSpec([1, 2, 3, 4, 5], [3, 2], [1, 0]), block_indices=(1,)),
                       CPULoadStoreSpec([0, 1, 2])),
     ValueError, "block_indices has 1 entries but the KV caches have 2 groups"),
    ("store", lambda: (GPULoadStoreSpec([1, 2, 3, 4, 5], [3, 2], [1, 0]), CPULoadStoreSpec([0, 0, 2])),
     ValueError, r"CPU block 0 \(GPU block 1 in it\) is written more than once by this job \(group 0\)"),
    ("load", lambda: (CPULoadStoreSpec([0, 1, 2]), GPULoadStoreSpec([1, 2, 1, 4, 5], [3, 2], [1, 0])),
     ValueError, r"GPU block 1 is written more than once by this job \(group 0\)"),
    ("store", lambda: (CPULoadStoreSpec([0, 1, 2]), CPULoadStoreSpec([0, 1, 2])),
     ValueError, "no handler is registered for transfers CPULoadStoreSpec -> CPULoadStoreSpec"),
    ("store", lambda: (GPULoadStoreSpec([1], [1, 0], [0, 0]), GPULoadStoreSpec([2], [1, 0], [0, 0])),
     ValueError, "no handler is registered"),
    ("store", lambda: (GPULoadStoreSpec([1, 2, 3, 4, 5], [3, 2], [1, 0]), "chunks"),
     TypeError, "dst spec must be a LoadStoreSpec"),
]


@pytest.mark.parametrize("kind, make, exc, match", BAD_JOBS, ids=[f"{job[0]}{i}" for i, job in enumerate(BAD_JOBS)])
def test_bad_job_raises_and_copies_nothing(two_groups, kind, make, exc, match):
    caches, worker = two_groups
    gpu_before = caches.snapshot()
    cpu_before = [c.clone() for c in worker.cpu_tensors]
    with pytest.raises(exc, match=match):
        worker.transfer_async(3, make())
    assert_bytes_equal(caches.raws, gpu_before)
    assert_bytes_equal(worker.cpu_tensors, cpu_before)
    assert worker.get_finished() == []
    # the valid job goes through afterwards, with the same id
    assert worker.transfer_async(3, (GPULoadStoreSpec([1, 2, 3, 4, 5], [3, 2], [1, 0]), CPULoadStoreSpec([0, 1, 2])))
    assert [r.job_id for r in worker.get_finished()] == [3]


def test_groups_sharing_a_tensor_cannot_write_one_block_twice():
    caches = Caches(KVCacheLayout.BLNHC, torch.float32, group_layers=(1, 1), shared=True)
    canon = canonicalize_kv_caches(caches.kv, caches.groups)
    worker = CPUOffloadingWorker(canon, blocks_per_chunk=1, num_cpu_chunks=4)
    worker.submit_store(1, GPULoadStoreSpec([1, 2], [1, 1], [0, 0]), CPULoadStoreSpec([0, 1]))
    assert [r.job_id for r in worker.get_finished()] == [1]
    before = caches.snapshot()
    with pytest.raises(ValueError, match=r"GPU block 3 is written more than once by this job \(tensor 0, shared"):
        worker.submit_load(2, CPULoadStoreSpec([0, 1]), GPULoadStoreSpec([3, 3], [1, 1], [0, 0]))
    assert_bytes_equal(caches.raws, before)
    # with an allocation per group, block 3 of each group is a different block
    caches = Caches(KVCacheLayout.BLNHC, torch.float32, group_layers=(1, 1))
    worker = CPUOffloadingWorker(canonicalize_kv_caches(caches.kv, caches.groups), 1, 4)
    worker.submit_store(1, GPULoadStoreSpec([1, 2], [1, 1], [0, 0]), CPULoadStoreSpec([0, 1]))
    want = [caches.block("g0.l0", 1), caches.block("g1.l0", 2)]
    assert worker.submit_load(2, CPULoadStoreSpec([0, 1]), GPULoadStoreSpec([3, 3], [1, 1], [0, 0]))
    assert torch.equal(caches.block("g0.l0", 3), want[0]) and torch.equal(caches.block("g1.l0", 3), want[1])


def test_job_ids_are_unique_until_reported(two_groups):
    _, worker = two_groups
    job = (GPULoadStoreSpec([1, 2, 3, 4, 5], [3, 2], [1, 0]), CPULoadStoreSpec([0, 1, 2]))
    assert worker.transfer_async(1, job)
    with pytest.raises(ValueError, match="job 1 is still in flight"):
        worker.transfer_async(1, job)
    with pytest.raises(ValueError, match="job 1 is still in flight"):
        worker.submit_load(1, CPULoadStoreSpec([0, 1, 2]), GPULoadStoreSpec([1, 2, 3, 4, 5], [3, 2], [1, 0]), True)
    assert [r.job_id for r in worker.get_finished()] == [1]
    assert worker.transfer_async(1, job)
    with pytest.raises(TypeError, match="job_id must be an int, got bool"):
        worker.transfer_async(True, job)
    with pytest.raises(TypeError, match="job_id must be an int, got str"):
        worker.submit_store("2", *job)
    with pytest.raises(TypeError, match="a transfer spec must be a"):
        worker.transfer_async(2, list(job))
    with pytest.raises(TypeError, match="submit_store: src_spec must be a GPULoadStoreSpec"):
        worker.submit_store(2, job[1], job[0])
    with pytest.raises(TypeError, match="submit_load: dst_spec must be a GPULoadStoreSpec"):
        worker.submit_load(2, job[0], job[1])


# ---------------------------------------------------------------------------
# Worker API
# ---------------------------------------------------------------------------


def test_worker_routes_and_reports_every_handler(two_groups):
    caches, worker = two_groups
    store = (GPULoadStoreSpec([1, 2, 3, 4, 5], [3, 2], [1, 0]), CPULoadStoreSpec([0, 1, 2]))
    assert worker.transfer_async(10, store)
    before = caches.snapshot()
    caches.scramble()
    assert worker.submit_load(11, store[1], GPULoadStoreSpec([1, 2, 3, 4, 5], [3, 2], [1, 0]), expedited=True)
    assert worker.submit_load(12, store[1], GPULoadStoreSpec([1, 2, 3, 4, 5], [3, 2], [1, 0]))
    worker.wait({10, 11, 12, 99})
    assert sorted(r.job_id for r in worker.get_finished()) == [10, 11, 12]
    assert worker.get_finished() == []
    for name in caches.kv:
        for b in [1, 2, 3, 4, 5]:
            if (name.startswith("g0") and b <= 3) or (name.startswith("g1") and b >= 4):
                assert torch.equal(caches.block(name, b), _block_of(before, caches, name, b))
    handlers = list(worker.get_handlers())
    assert [(s, d) for s, d, _ in handlers] == [(GPULoadStoreSpec, CPULoadStoreSpec), (CPULoadStoreSpec, GPULoadStoreSpec)]
    assert all(isinstance(h, SingleDirectionOffloadingHandler) for _, _, h in handlers)
    assert worker.chunk_size_bytes == sum(c.shape[1] for c in worker.cpu_tensors)
    with pytest.raises(TypeError, match="job_ids must be an iterable of ints"):
        worker.wait(3)
    worker.shutdown()
    with pytest.raises(RuntimeError, match="has been shut down"):
        worker.transfer_async(13, store)


class _Recorder(OffloadingHandler):
    def __init__(self, accept=True):
        self.jobs, self.accept = [], accept

    def transfer_async(self, job_id, spec):
        self.jobs.append(job_id)
        return self.accept

    def get_finished(self):
        out = [TransferResult(j, True) for j in self.jobs if self.accept]
        self.jobs = []
        return out

    def wait(self, job_ids):
        return None


class _SpecA(LoadStoreSpec):
    pass


class _SpecB(_SpecA):
    pass


def test_offloading_worker_registration_and_routing():
    w = OffloadingWorker()
    a, b = _Recorder(), _Recorder(accept=False)
    w.register_handler(_SpecA, CPULoadStoreSpec, a)
    w.register_handler(CPULoadStoreSpec, _SpecA, b)
    with pytest.raises(ValueError, match="already registered"):
        w.register_handler(_SpecA, CPULoadStoreSpec, b)
    with pytest.raises(TypeError, match="src_cls must be a LoadStoreSpec subclass"):
        w.register_handler(int, CPULoadStoreSpec, a)
    with pytest.raises(TypeError, match="handler must be an OffloadingHandler"):
        w.register_handler(_SpecB, CPULoadStoreSpec, object())
    # a subclass routes to its base's handler
    assert w.transfer_async(1, (_SpecB(), CPULoadStoreSpec([0])))
    assert not w.transfer_async(2, (CPULoadStoreSpec([0]), _SpecB()))
    assert a.jobs == [1] and b.jobs == [2]
    assert [r.job_id for r in w.get_finished()] == [1]
    assert w.transfer_async(2, (_SpecA(), CPULoadStoreSpec([0])))  # 2 was refused, so it is free


def test_handler_rejects_inconsistent_tensors():
    gpu = [torch.zeros(4, 16, dtype=torch.int8)]
    refs = [[CanonicalKVCacheRef(0, 16)]]
    with pytest.raises(ValueError, match="rows hold 16 bytes; 2 blocks of 16 bytes need 32"):
        SingleDirectionOffloadingHandler(gpu, [torch.zeros(3, 16, dtype=torch.int8)], 2, refs, True)
    with pytest.raises(TypeError, match="must be a 2-D int8 tensor"):
        SingleDirectionOffloadingHandler(gpu, [torch.zeros(3, 16)], 1, refs, True)
    with pytest.raises(ValueError, match="1 GPU tensors but 0 CPU tensors"):
        SingleDirectionOffloadingHandler(gpu, [], 1, refs, True)
    with pytest.raises(ValueError, match="group 0 refers to tensor 1 of 1"):
        SingleDirectionOffloadingHandler(gpu, [torch.zeros(3, 16, dtype=torch.int8)], 1, [[CanonicalKVCacheRef(1, 8)]], True)
    with pytest.raises(NotImplementedError, match="canonical page mappings"):
        SingleDirectionOffloadingHandler(
            gpu, [torch.zeros(3, 16, dtype=torch.int8)], 1, [[CanonicalKVCacheRef(0, 16, mapping=object())]], True
        )
    canon = CanonicalKVCaches([CanonicalKVCacheTensor(gpu[0], 16)], refs)
    with pytest.raises(ValueError, match="blocks_per_chunk must be >= 1"):
        CPUOffloadingWorker(canon, blocks_per_chunk=0, num_cpu_chunks=2)
    with pytest.raises(TypeError, match="kv_caches must be CanonicalKVCaches"):
        CPUOffloadingWorker({"a": gpu[0]}, blocks_per_chunk=1, num_cpu_chunks=2)


# ---------------------------------------------------------------------------
# CUDA: pinned CPU tier, own stream, events
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("bpc", [1, 2], ids=["bpc1", "bpc2"])
def test_round_trip_on_device(device, bpc):
    caches = Caches(KVCacheLayout.LHBNC, torch.bfloat16, group_layers=(2, 1), device=device)
    worker, _ = round_trip(caches, bpc, seed=5)
    assert all(c.is_pinned() == (device == "cuda") for c in worker.cpu_tensors)


@pytest.mark.gpu
@pytest.mark.skipif(_CUDA_SKIP is not None, reason=_CUDA_SKIP or "")
def test_cuda_transfers_wait_for_the_current_stream_and_report_by_event():
    caches = Caches(KVCacheLayout.LBHNC, torch.float16, group_layers=(1,), num_blocks=64, device="cuda")
    canon = canonicalize_kv_caches(caches.kv, caches.groups)
    worker = CPUOffloadingWorker(canon, blocks_per_chunk=1, num_cpu_chunks=64)
    # queue a long kernel, then a write of block 0, on the current stream; the store must see the write
    big = torch.randn(4096, 4096, device="cuda")
    for _ in range(4):
        big = big @ big / 4096
    caches.kv["g0.l0"][0].fill_(1.5)
    assert worker.submit_store(1, GPULoadStoreSpec(list(range(64))), CPULoadStoreSpec(list(range(64))))
    worker.wait({1})
    results = worker.get_finished()
    assert [(r.job_id, r.success) for r in results] == [(1, True)] and results[0].transfer_time >= 0
    row = block_rows(canon.tensors[0])[0].cpu()
    assert torch.equal(worker.cpu_tensors[0][0], row)
    assert torch.equal(row.view(torch.float16), torch.full((row.numel() // 2,), 1.5, dtype=torch.float16))


def test_package_exposes_worker_and_canonical_names():
    import kvcy.kv_offload as kv_offload

    assert kv_offload.CanonicalKVCaches is CanonicalKVCaches
    assert kv_offload.canonicalize_kv_caches is canonicalize_kv_caches
    assert kv_offload.CPUOffloadingWorker is CPUOffloadingWorker
    with pytest.raises(AttributeError):
        kv_offload.NoSuchName  # noqa: B018
