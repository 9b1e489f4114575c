"""The CUDA code of kvcy._C, run on the CPU: kernels and host code under a thin CUDA shim.

Where no GPU is lent, this is how cuda_ext/kvcy_ops_cuda.cu gets exercised:
its kernels and host functions are cut out of the source, ``<<<grid, block>>>``
launches become loops over every (block, thread), CUDA runtime calls become
stubs (the CPU tensors play device memory; one tensor can be marked
"pageable host memory" to drive the staging path), and the result is
compiled as a CPU torch extension with ``-fsanitize=alignment`` so a vector
load the alignment checks let through would trap.  Each op is compared bit
for bit with the plain-torch reference.

What it cannot see: real device memory, streams, pinned-memory aliases,
races between threads.  Opt-in (a ~30 s compile on 2 cores):
``KVCY_TEST_CUDA_EMULATION=1 python -m pytest tests/test_ops_cuda_emulated.py``.
"""

from __future__ import annotations

import itertools
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from kvcy import _ops_reference as ref  # noqa: E402
from kvcy.kv_cache_interface import KVCacheLayout  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
CU = ROOT / "cuda_ext" / "kvcy_ops_cuda.cu"
FP8 = torch.float8_e4m3fn

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        os.environ.get("KVCY_TEST_CUDA_EMULATION", "") in ("", "0"),
        reason="opt-in: set KVCY_TEST_CUDA_EMULATION=1 to compile and run the CUDA code under a CPU shim",
    ),
]

SHIM = r"""
#include <torch/extension.h>
#include "kvcy_ops.h"
#include <algorithm>
#include <cstdint>
struct dim3 { unsigned x, y, z; dim3(unsigned a = 1, unsigned b = 1, unsigned c = 1) : x(a), y(b), z(c) {} };
struct emu_idx { unsigned x = 0, y = 0, z = 0; };
static emu_idx blockIdx, threadIdx;
static dim3 blockDim, gridDim;
#define __global__
#define __device__
#define __forceinline__ inline
struct alignas(16) uint4 { uint32_t x, y, z, w; };
struct alignas(8) uint2 { uint32_t x, y; };
using cudaStream_t = void*;
template <class F> void emu_launch(dim3 grid, dim3 block, F f) {
  TORCH_CHECK(block.x >= 1 && block.x <= 1024 && grid.x >= 1 && grid.y >= 1 && grid.y <= 65535, "bad launch");
  gridDim = grid;
  blockDim = block;
  for (unsigned by = 0; by < grid.y; ++by)
    for (unsigned bx = 0; bx < grid.x; ++bx)
      for (unsigned tx = 0; tx < block.x; ++tx) {
        blockIdx.x = bx; blockIdx.y = by; threadIdx.x = tx;
        f();
      }
}
namespace c10 { namespace cuda {
struct CUDAGuard { explicit CUDAGuard(at::Device) {} };
struct EmuStream { operator void*() const { return nullptr; } };
inline EmuStream getCurrentCUDAStream() { return {}; }
}}  // namespace c10::cuda
namespace kvcy { namespace {
const void* emu_pageable = nullptr;
const void* device_address(const at::Tensor& t) {
  const void* p = t.const_data_ptr();
  return (p != nullptr && p == emu_pageable) ? nullptr : p;
}
void record_host_use(const at::Tensor&) {}
at::Tensor host_ids_to_device(const at::Tensor& ids, const at::Device&) { return ids.clone(); }
#include "kernels.inc"
}  // namespace
void set_pageable(const at::Tensor& t) { emu_pageable = t.defined() ? t.const_data_ptr() : nullptr; }
}  // namespace kvcy
using V = std::vector<int64_t>;
PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("reshape_and_cache", [](at::Tensor k, at::Tensor v, at::Tensor kc, at::Tensor vc, at::Tensor s, V o,
                                int64_t l, std::optional<at::Tensor> ks, std::optional<at::Tensor> vs) {
    kvcy::reshape_and_cache_cuda(k, v, kc, vc, s, o, l, ks, vs);
  });
  m.def("convert_layout", [](at::Tensor s, at::Tensor d, V a, V b) { kvcy::convert_layout_cuda(s, d, a, b); });
  m.def("copy_blocks", [](at::Tensor c, at::Tensor mp, V o) { kvcy::copy_blocks_cuda(c, mp, o); });
  m.def("swap_blocks", [](at::Tensor s, at::Tensor d, at::Tensor mp, V o) { kvcy::swap_blocks_cuda(s, d, mp, o); });
  m.def("gather_blocks", [](at::Tensor c, at::Tensor i, at::Tensor s, V o) { kvcy::gather_blocks_cuda(c, i, s, o); });
  m.def("scatter_blocks", [](at::Tensor s, at::Tensor c, at::Tensor i, V o) { kvcy::scatter_blocks_cuda(s, c, i, o); });
  m.def("set_pageable", &kvcy::set_pageable);
}
"""


def _kernels_source() -> str:
    """kvcy_ops_cuda.cu's anonymous namespace, launches rewritten, CUDA runtime helpers dropped."""
    src = CU.read_text()
    code = src[src.index("struct DevicePlan") : src.index("}  // namespace\n\nTORCH_LIBRARY_IMPL")]
    for sig in ("const void* device_address(", "void record_host_use(", "at::Tensor host_ids_to_device("):
        i = code.index(sig)
        code = code[:i] + code[code.index("\n}\n", i) + 3 :]

    def launch(m: re.Match) -> str:
        grid, block = m.group(2).split(", 0, stream")[0].split(", ", 1)
        return f"emu_launch(dim3({grid}), dim3({block}), [&] {{ {m.group(1)}({m.group(3)}); }});"

    code = re.sub(r"([A-Za-z_]\w*(?:<[^;{}]*?>)?)\s*<<<(.*?)>>>\((.*?)\);", launch, code, flags=re.S)
    assert "<<<" not in code
    code = code.replace("C10_CUDA_KERNEL_LAUNCH_CHECK();", "")
    # CPU tensors stand in for device memory
    for old, new in [("device.is_cuda()", "true"), ("src.is_cuda() || dst.is_cuda(),", "true,"),
                     ("TORCH_CHECK_VALUE(cache.is_cuda()", "TORCH_CHECK_VALUE(true")]:
        assert old in code, old
        code = code.replace(old, new)
    return code


@pytest.fixture(scope="module")
def emu(tmp_path_factory):
    if shutil.which("ninja") is None:
        pytest.skip("torch.utils.cpp_extension.load needs ninja")
    from torch.utils.cpp_extension import load

    build = tmp_path_factory.mktemp("kvcy_cuda_emu")
    (build / "kernels.inc").write_text(_kernels_source())
    (build / "emu.cpp").write_text(SHIM)
    ubsan = subprocess.run(["gcc", "-print-file-name=libubsan.so"], capture_output=True, text=True).stdout.strip()
    sanitize = ["-fsanitize=alignment", "-fno-sanitize-recover=all"] if os.path.isabs(ubsan) else []
    return load(
        "kvcy_cuda_emu",
        [str(build / "emu.cpp"), str(ROOT / "cuda_ext" / "kvcy_ops.cpp")],
        extra_cflags=["-O1", "-std=c++17", f"-I{ROOT / 'cuda_ext'}", *sanitize],
        extra_ldflags=sanitize[:1],
        build_directory=str(build),
        verbose=False,
    )


def _rnd(shape, dtype, gen):
    if dtype == FP8:
        return torch.randint(0, 256, list(shape), dtype=torch.uint8, generator=gen).view(FP8)
    return (torch.randn(list(shape), generator=gen) * 3).to(dtype)


def _zeros(shape, dtype):
    return torch.zeros(list(shape), dtype=torch.uint8).view(FP8) if dtype == FP8 else torch.zeros(list(shape),
                                                                                                     dtype=dtype)


def _same(a, b):
    assert torch.equal(a.contiguous().view(torch.uint8), b.contiguous().view(torch.uint8))


def _cache(shape, layout, dtype, gen, pad=0):
    """A physical cache; pad > 0 makes it a slice of a wider C axis (odd strides, narrower vectors)."""
    phys = [shape[d] for d in layout.stride_order]
    phys[-1] += pad
    t = _rnd(phys, dtype, gen)
    return t[..., pad:] if pad else t


@pytest.mark.parametrize("layout", list(KVCacheLayout), ids=lambda m: m.name)
def test_block_ops_emulated(emu, layout):
    gen = torch.Generator().manual_seed(0)
    order = list(layout.stride_order)
    cases = itertools.product([torch.float16, torch.float32, FP8], [(2, 5, 3, 4, 8), (1, 7, 1, 1, 80), (2, 4, 2, 3, 5)],
                              [0, 1, 3])
    for dtype, shape, pad in cases:
        c = _cache(shape, layout, dtype, gen, pad)
        B = shape[1]
        perm = torch.randperm(B, generator=gen)
        mapping = torch.stack([perm[: B // 2], perm[B // 2 : 2 * (B // 2)]], 1)
        a, b = c.clone(), c.clone()
        emu.copy_blocks(a, mapping, order)
        ref.copy_blocks(b, mapping, order)
        _same(a, b)
        for other in KVCacheLayout:
            d1 = _zeros([shape[x] for x in other.stride_order], dtype)
            d2 = d1.clone()
            emu.convert_layout(c, d1, order, list(other.stride_order))
            ref.convert_layout(c, d2, order, list(other.stride_order))
            _same(d1, d2)
        ids = torch.randint(0, B, (4,), generator=gen)
        st_shape = [4] + [p for p, d in zip(c.shape, order) if d != 1]
        s1, s2 = _zeros(st_shape, dtype), _zeros(st_shape, dtype)
        for pageable in (False, True):
            emu.set_pageable(s1 if pageable else torch.Tensor())
            emu.gather_blocks(c, ids, s1, order)
            ref.gather_blocks(c, ids, s2, order)
            _same(s1, s2)
        uniq = perm[:4]
        staged = _rnd([uniq.numel()] + st_shape[1:], dtype, gen)
        for pageable in (False, True):
            a, b = c.clone(), c.clone()
            emu.set_pageable(staged if pageable else torch.Tensor())
            emu.scatter_blocks(staged, a, uniq, order)
            ref.scatter_blocks(staged, b, uniq, order)
            _same(a, b)
        dst = _cache((shape[0], B + 3) + shape[2:], layout, dtype, gen, pad)
        m2 = torch.stack([torch.randint(0, B, (3,), generator=gen), torch.randperm(B + 3, generator=gen)[:3]], 1)
        for pageable in ("none", "src", "dst"):
            a, b = dst.clone(), dst.clone()
            emu.set_pageable({"src": c, "dst": a}.get(pageable, torch.Tensor()))
            emu.swap_blocks(c, a, m2, order)
            ref.swap_blocks(c, b, m2, order)
            _same(a, b)
        emu.set_pageable(torch.Tensor())


@pytest.mark.parametrize("layout", list(KVCacheLayout), ids=lambda m: m.name)
def test_reshape_and_cache_emulated(emu, layout):
    gen = torch.Generator().manual_seed(1)
    order = list(layout.stride_order)
    dtypes = [(torch.float16,) * 2, (torch.bfloat16,) * 2, (torch.float32,) * 2, (torch.float16, FP8),
              (torch.bfloat16, FP8), (torch.float32, FP8)]
    for (kd, cd), shape, pad, strided in itertools.product(
        dtypes, [(2, 5, 3, 4, 8), (1, 7, 1, 1, 80), (1, 3, 2, 2, 5)], [0, 1], [False, True]
    ):
        L, B, H, N, C = shape
        T = min(B * N, 9)
        if strided:  # keys and values sliced out of a fused tensor
            big = _rnd((T, 3 * H, C + 1), kd, gen) * 40
            key, value = big[:, H : 2 * H, 1:], big[:, 2 * H :, :C]
        else:
            key, value = _rnd((T, H, C), kd, gen) * 40, _rnd((T, H, C), kd, gen)
        slots = torch.randperm(B * N, generator=gen)[:T]
        slots[::3] = -1
        kc, vc = _cache(shape, layout, cd, gen, pad), _cache(shape, layout, cd, gen, pad)
        a, b = [kc.clone(), vc.clone()], [kc.clone(), vc.clone()]
        scales = (torch.tensor([0.75]), torch.tensor([1.25]))
        emu.reshape_and_cache(key, value, a[0], a[1], slots, order, L - 1, *scales)
        ref.reshape_and_cache(key, value, b[0], b[1], slots, order, L - 1, *scales)
        _same(a[0], b[0])
        _same(a[1], b[1])


def test_emulated_errors_match_reference(emu):
    cache = torch.zeros(1, 4, 1, 1, 8)
    with pytest.raises(ValueError, match=r"block_mapping\[0, 1\] = 4 is out of range for a cache of 4 blocks"):
        emu.copy_blocks(cache, torch.tensor([[0, 4]]), [0, 1, 2, 3, 4])
    with pytest.raises(ValueError, match=r"slot_mapping\[0\] = 4 is out of range"):
        emu.reshape_and_cache(torch.ones(1, 1, 8), torch.ones(1, 1, 8), cache, cache.clone(), torch.tensor([4]),
                              [0, 1, 2, 3, 4], 0, None, None)
