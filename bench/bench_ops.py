"""KV-cache layout and block-copy ops: kvcy._C kernels vs the plain-torch reference.

Run: ``python -m pytest bench/bench_ops.py --benchmark-only``.

One group per (op, layout, device) with a ``cpp`` row (torch.ops.kvcy) and a
``reference`` row (kvcy._ops_reference: index_select / index_copy_ / copy_);
on CUDA also a ``copy`` row, a plain copy of the same number of bytes
(device-to-device, or one large contiguous host<->device copy for the swap
groups) - the bandwidth yardstick.  At the end of the module a summary
prints each row's bandwidth (bytes read + written per second), the
reference/cpp time ratio and, on CUDA, cpp bandwidth as a percentage of the
copy row's.  Each row's ``extra_info`` (``--benchmark-json``) carries bytes
and GB/s.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

torch = pytest.importorskip("torch")

from kvcy import _ops_reference as ref  # noqa: E402
from kvcy import ops  # noqa: E402
from kvcy.kv_cache_interface import KVCacheLayout  # noqa: E402

HAS_CUDA = torch.cuda.is_available() and ops.HAS_CUDA_KERNELS
CUDA_SKIP = (
    "no CUDA device visible to torch" if not torch.cuda.is_available() else "kvcy._C built without CUDA kernels"
)


@dataclass
class Size:
    L: int
    B: int
    H: int
    N: int
    C: int
    tokens: int  # reshape_and_cache
    pairs: int  # block ops

    @property
    def shape(self) -> tuple[int, int, int, int, int]:
        return (self.L, self.B, self.H, self.N, self.C)


# CPU: a small model on a 2-core box; CUDA: large enough to saturate HBM / PCIe.
SIZES = {
    "cpu": Size(L=2, B=256, H=8, N=16, C=128, tokens=512, pairs=64),
    "cuda": Size(L=4, B=2048, H=8, N=16, C=128, tokens=8192, pairs=512),
}
DTYPE = torch.float16
LAYOUTS = [KVCacheLayout.LBNHC, KVCacheLayout.BLNHC]  # vLLM's NHD (layer-compact) and a block-compact one


@dataclass
class _Row:
    mean_s: float
    nbytes: int


@dataclass
class _Results:
    rows: dict[str, dict[str, _Row]] = field(default_factory=dict)


RESULTS = _Results()


def _params(names):
    return [
        pytest.param(
            n,
            id=n,
            marks=[pytest.mark.skipif(not ops.HAS_EXTENSION, reason="kvcy._C not loaded")] if n == "cpp" else [],
        )
        for n in names
    ]


DEVICES = [
    pytest.param("cpu", id="cpu"),
    pytest.param("cuda", id="cuda", marks=pytest.mark.skipif(not HAS_CUDA, reason=CUDA_SKIP)),
]


@pytest.fixture(params=_params(["cpp", "reference", "copy"]))
def backend(request) -> str:
    return request.param


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def _cache(size: Size, layout: KVCacheLayout, device: str, blocks: int | None = None, pin=False) -> torch.Tensor:
    shape = list(size.shape)
    if blocks is not None:
        shape[1] = blocks
    t = torch.randn([shape[d] for d in layout.stride_order], dtype=torch.float32).to(DTYPE)
    t = t.to(device)
    return t.pin_memory() if pin else t


def _block_bytes(size: Size) -> int:
    return size.L * size.H * size.N * size.C * torch.finfo(DTYPE).bits // 8


def _run(benchmark, group: str, backend: str, device: str, nbytes: int, fn, copy_src=None, copy_dst=None):
    """Benchmark ``fn`` (or, for the ``copy`` row, ``copy_dst.copy_(copy_src)``) and record GB/s."""
    if backend == "copy":
        if device != "cuda":
            pytest.skip("the copy yardstick row is for CUDA")
        if copy_src is None:
            src = torch.empty(nbytes // 2, dtype=torch.uint8, device=device)
            copy_src, copy_dst = src, torch.empty_like(src)

        def fn():
            copy_dst.copy_(copy_src, non_blocking=True)

    benchmark.group = group

    def timed():
        fn()
        _sync(device)

    timed()  # warm up (and let the reference allocate)
    benchmark(timed)
    if benchmark.stats is None:  # --benchmark-disable: ran once, nothing timed
        return
    mean = benchmark.stats.stats.mean
    benchmark.extra_info["bytes"] = nbytes
    benchmark.extra_info["GB/s"] = round(nbytes / mean / 1e9, 3)
    RESULTS.rows.setdefault(group, {})[backend] = _Row(mean, nbytes)


@pytest.fixture(scope="module", autouse=True)
def _summary(write_summary):
    yield
    if not RESULTS.rows:
        return
    lines = ["", "kvcy ops: bandwidth (bytes read + written / s), reference/cpp time, cpp % of copy"]
    for group, rows in RESULTS.rows.items():
        parts = [f"{name} {row.nbytes / row.mean_s / 1e9:8.2f} GB/s" for name, row in sorted(rows.items())]
        if "cpp" in rows and "reference" in rows:
            parts.append(f"ref/cpp {rows['reference'].mean_s / rows['cpp'].mean_s:6.2f}x")
        if "cpp" in rows and "copy" in rows:
            parts.append(f"cpp {100 * rows['copy'].mean_s / rows['cpp'].mean_s:5.1f}% of copy")
        lines.append(f"  {group:<44} " + " | ".join(parts))
    write_summary(lines)


def _op(backend: str, name: str):
    return getattr(torch.ops.kvcy, name) if backend == "cpp" else getattr(ref, name)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("layout", LAYOUTS, ids=lambda m: m.name)
def test_reshape_and_cache(benchmark, backend, layout, device):
    size = SIZES[device]
    gen = torch.Generator().manual_seed(0)
    kc, vc = _cache(size, layout, device), _cache(size, layout, device)
    key = torch.randn(size.tokens, size.H, size.C, generator=gen).to(DTYPE).to(device)
    value = torch.randn(size.tokens, size.H, size.C, generator=gen).to(DTYPE).to(device)
    slots = torch.randperm(size.B * size.N, generator=gen)[: size.tokens].to(device)
    nbytes = 2 * 2 * key.numel() * key.element_size()
    op = None if backend == "copy" else _op(backend, "reshape_and_cache")
    order = list(layout.stride_order)
    _run(benchmark, f"reshape_and_cache {layout.name} {device} T={size.tokens}", backend, device, nbytes,
         lambda: op(key, value, kc, vc, slots, order, 0, None, None))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("layout", LAYOUTS, ids=lambda m: m.name)
def test_convert_layout(benchmark, backend, layout, device):
    size = SIZES[device]
    src = _cache(size, layout, device)
    target = KVCacheLayout.LBHNC
    dst = torch.empty([size.shape[d] for d in target.stride_order], dtype=DTYPE, device=device)
    nbytes = 2 * src.numel() * src.element_size()
    op = None if backend == "copy" else _op(backend, "convert_layout")
    so, do = list(layout.stride_order), list(target.stride_order)
    _run(benchmark, f"convert_layout {layout.name}->LBHNC {device}", backend, device, nbytes,
         lambda: op(src, dst, so, do))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("layout", LAYOUTS, ids=lambda m: m.name)
def test_copy_blocks(benchmark, backend, layout, device):
    size = SIZES[device]
    cache = _cache(size, layout, device)
    perm = torch.randperm(size.B, generator=torch.Generator().manual_seed(1))
    mapping = torch.stack([perm[: size.pairs], perm[size.pairs : 2 * size.pairs]], dim=1).to(device)
    nbytes = 2 * size.pairs * _block_bytes(size)
    op = None if backend == "copy" else _op(backend, "copy_blocks")
    order = list(layout.stride_order)
    _run(benchmark, f"copy_blocks {layout.name} {device} n={size.pairs}", backend, device, nbytes,
         lambda: op(cache, mapping, order))


@pytest.mark.parametrize("direction", ["d2h", "h2d"])
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("layout", LAYOUTS, ids=lambda m: m.name)
def test_swap_blocks(benchmark, backend, layout, device, direction):
    """Scattered blocks between the device cache and a pinned host cache (CPU: host to host)."""
    size = SIZES[device]
    if device == "cpu" and direction == "h2d":
        pytest.skip("on the CPU both directions are the same copy")
    host_dev = "cpu"
    pin = device == "cuda"
    dev_cache = _cache(size, layout, device)
    host_cache = _cache(size, layout, host_dev, pin=pin)
    src, dst = (dev_cache, host_cache) if direction == "d2h" else (host_cache, dev_cache)
    gen = torch.Generator().manual_seed(2)
    mapping = torch.stack([torch.randperm(size.B, generator=gen)[: size.pairs],
                           torch.randperm(size.B, generator=gen)[: size.pairs]], dim=1)
    nbytes = 2 * size.pairs * _block_bytes(size)
    copy_src = copy_dst = None
    if backend == "copy" and device == "cuda":
        # the yardstick: one large contiguous copy of the same bytes across the bus
        half = nbytes // 2
        d = torch.empty(half, dtype=torch.uint8, device=device)
        h = torch.empty(half, dtype=torch.uint8).pin_memory()
        copy_src, copy_dst = (d, h) if direction == "d2h" else (h, d)
    op = None if backend == "copy" else _op(backend, "swap_blocks")
    order = list(layout.stride_order)
    _run(benchmark, f"swap_blocks {layout.name} {device} {direction} n={size.pairs}", backend, device, nbytes,
         lambda: op(src, dst, mapping, order), copy_src, copy_dst)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("layout", LAYOUTS, ids=lambda m: m.name)
def test_gather_blocks(benchmark, backend, layout, device):
    size = SIZES[device]
    cache = _cache(size, layout, device)
    ids = torch.randperm(size.B, generator=torch.Generator().manual_seed(3))[: size.pairs].to(device)
    staging = torch.empty(ops.staging_shape(cache, layout, size.pairs), dtype=DTYPE, device=device)
    nbytes = 2 * size.pairs * _block_bytes(size)
    op = None if backend == "copy" else _op(backend, "gather_blocks")
    order = list(layout.stride_order)
    _run(benchmark, f"gather_blocks {layout.name} {device} n={size.pairs}", backend, device, nbytes,
         lambda: op(cache, ids, staging, order))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("layout", LAYOUTS, ids=lambda m: m.name)
def test_scatter_blocks(benchmark, backend, layout, device):
    size = SIZES[device]
    cache = _cache(size, layout, device)
    ids = torch.randperm(size.B, generator=torch.Generator().manual_seed(4))[: size.pairs].to(device)
    staging = torch.randn(ops.staging_shape(cache, layout, size.pairs)).to(DTYPE).to(device)
    nbytes = 2 * size.pairs * _block_bytes(size)
    op = None if backend == "copy" else _op(backend, "scatter_blocks")
    order = list(layout.stride_order)
    _run(benchmark, f"scatter_blocks {layout.name} {device} n={size.pairs}", backend, device, nbytes,
         lambda: op(staging, cache, ids, order))
