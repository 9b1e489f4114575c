"""The CUDA slot-mapping kernel of kvcy._C, run on the CPU under a thin CUDA shim.

Where no GPU is lent, this is how ``compute_slot_mapping_cuda`` in
cuda_ext/kvcy_ops_cuda.cu gets exercised: its kernel and host function are
cut out of the source, the ``<<<grid, block>>>`` launch becomes a loop over
every (block, thread), the CUDA runtime calls become stubs (CPU tensors play
device memory), and the result is compiled as a plain CPU extension, with the
op's shared checks cut from cuda_ext/kvcy_ops.cpp (no ``TORCH_LIBRARY``
block, so it loads beside kvcy._C).  Each batch is compared with the
plain-torch reference, refusals included.

What it cannot see: device memory, streams, races.  Opt-in, as
tests/test_ops_cuda_emulated.py: ``KVCY_TEST_CUDA_EMULATION=1 python -m pytest
tests/test_block_table_cuda_emulated.py`` (a ~30 s compile on 2 cores).
"""

from __future__ import annotations

import os
import random
import re
import shutil
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from kvcy import _ops_reference as ref  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]

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
#include "kvcy_slot_mapping.h"
#include <algorithm>
#include <cstdint>
struct dim3 { unsigned x, y, z; dim3(unsigned a = 1, unsigned b = 1, unsigned c = 1) : x(a), y(b), z(c) {} };
struct emu_idx { unsigned x = 0, y = 0, z = 0; };
static emu_idx blockIdx, threadIdx;
static dim3 blockDim, gridDim;
#define __global__
template <class F> void emu_launch(dim3 grid, dim3 block, F f) {
  TORCH_CHECK(block.x >= 1 && block.x <= 1024 && grid.x >= 1, "bad launch");
  gridDim = grid;
  blockDim = block;
  for (unsigned bx = 0; bx < grid.x; ++bx)
    for (unsigned tx = 0; tx < block.x; ++tx) {
      blockIdx.x = bx; threadIdx.x = tx;
      f();
    }
}
namespace c10 { namespace cuda {
struct CUDAGuard { explicit CUDAGuard(at::Device) {} };
struct EmuStream { operator void*() const { return nullptr; } };
inline EmuStream getCurrentCUDAStream() { return {}; }
}}  // namespace c10::cuda
namespace kvcy {
#include "checks.inc"
namespace {
#include "kernel.inc"
}  // namespace
}  // namespace kvcy
PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("compute_slot_mapping", [](at::Tensor q, at::Tensor p, at::Tensor b, at::Tensor s, int64_t n, int64_t bs,
                                   int64_t w, int64_t r, int64_t i) {
    kvcy::compute_slot_mapping_cuda(q, p, b, s, n, bs, w, r, i);
  });
}
"""


def _cut(text: str, start: str, end: str) -> str:
    i = text.index(start)
    return text[i : text.index(end, i)]


def _sources() -> tuple[str, str]:
    cpp = (ROOT / "cuda_ext" / "kvcy_ops.cpp").read_text()
    checks = _cut(cpp, "std::string dtype_name(c10::ScalarType t) {", "\nvoid check_stride_order(")
    checks += _cut(cpp, "void check_compute_slot_mapping(", "namespace {\n\nvoid compute_slot_mapping_cpu(")
    cu = (ROOT / "cuda_ext" / "kvcy_ops_cuda.cu").read_text()
    kernel = _cut(cu, "__global__ void compute_slot_mapping_kernel(", "}  // namespace\n\nTORCH_LIBRARY_IMPL(kvcy, CUDA, m) "
                  "{ m.impl(\"compute_slot_mapping\"")

    def launch(m: re.Match) -> str:
        grid, block = m.group(2).split(", 0, stream")[0].split(", ", 1)
        return f"emu_launch(dim3({grid}), dim3({block}), [&] {{ {m.group(1)}({m.group(3)}); }});"

    kernel = re.sub(r"([A-Za-z_]\w*)\s*<<<(.*?)>>>\((.*?)\);", launch, kernel, flags=re.S)
    assert "<<<" not in kernel
    kernel = kernel.replace("C10_CUDA_KERNEL_LAUNCH_CHECK();", "")
    return checks, kernel


@pytest.fixture(scope="module")
def emu(tmp_path_factory):
    if shutil.which("ninja") is None:
        pytest.skip("torch.utils.cpp_extension.load needs ninja")
    from torch.utils.cpp_extension import load

    build = tmp_path_factory.mktemp("kvcy_slot_mapping_emu")
    checks, kernel = _sources()
    (build / "checks.inc").write_text(checks)
    (build / "kernel.inc").write_text(kernel)
    (build / "emu.cpp").write_text(SHIM)
    return load("kvcy_slot_mapping_emu", [str(build / "emu.cpp")],
                extra_cflags=["-O1", "-std=c++17", f"-I{ROOT / 'cuda_ext'}"], build_directory=str(build),
                verbose=False)


def test_emulated_cuda_kernel_equals_the_reference(emu):
    rng = random.Random(11)
    for _ in range(200):
        w = rng.randint(1, 4)
        rank, inter, bs = rng.randrange(w), rng.choice([1, 2, 16]), rng.choice([1, 3, 16, 32])
        rows, width = rng.randint(1, 5), rng.randint(1, 6)
        num_reqs = rng.randint(0, rows)
        qsl = [0]
        for _ in range(num_reqs):
            qsl.append(qsl[-1] + rng.randint(0, 300))  # more tokens than a CTA's threads
        pos = torch.tensor([rng.randrange(width * bs * w) for _ in range(qsl[-1] + rng.randint(0, 2))], dtype=torch.int64)
        table = torch.randint(0, 9999, (rows, width), dtype=torch.int32)
        n_slots = pos.numel() + rng.randint(0, 600)
        outs = []
        for fn in (emu.compute_slot_mapping, ref.compute_slot_mapping):
            out = torch.full((n_slots,), 5, dtype=torch.int64)
            fn(torch.tensor(qsl, dtype=torch.int32), pos, table, out, num_reqs, bs, w, rank, inter)
            outs.append(out)
        assert torch.equal(outs[0], outs[1])


@pytest.mark.parametrize("positions,msg", [
    ([0, 1, 99], "compute_slot_mapping: positions[2] = 99 is out of range for a block table row of 2 blocks x 4 tokens"),
    ([0, 1], "compute_slot_mapping: query_start_loc[2] = 3 is beyond the 2 positions"),
])
def test_emulated_cuda_refusals_are_the_references(emu, positions, msg):
    for fn in (emu.compute_slot_mapping, ref.compute_slot_mapping):
        out = torch.zeros(4, dtype=torch.int64)
        with pytest.raises(ValueError) as info:
            fn(torch.tensor([0, 2, 3], dtype=torch.int32), torch.tensor(positions), torch.ones(2, 2, dtype=torch.int32),
               out, 2, 4, 1, 0, 1)
        assert str(info.value).splitlines()[0] == msg
        assert not out.any()
