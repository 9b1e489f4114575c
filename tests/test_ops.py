"""kvcy.ops: the kvcy._C kernels against the plain-torch reference, on every layout.

The reference (kvcy._ops_reference) is the oracle; it is itself checked
against naive per-element loops.  Results are compared bit for bit (fp8
included), errors by type and message.  CUDA cases run only where torch
sees a GPU *and* kvcy._C was built with CUDA kernels; they skip with the
reason otherwise.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import warnings

import pytest

torch = pytest.importorskip("torch")

from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from kvcy import _ops_reference as ref  # noqa: E402
from kvcy import ops  # noqa: E402
from kvcy.kv_cache_interface import FullAttentionSpec, KVCacheLayout, reshape_kv_cache  # noqa: E402

LAYOUTS = list(KVCacheLayout)
FP8 = torch.float8_e4m3fn

# (L, B, H, N, C): general, one head + head size 80 + block size 1, a larger block
SHAPES = [(2, 5, 3, 4, 8), (1, 7, 1, 1, 80), (3, 4, 2, 16, 80)]
SHAPE_IDS = ["L2B5H3N4C8", "H1N1C80", "L3H2N16C80"]

# (input dtype, cache dtype)
RESHAPE_DTYPES = [
    (torch.float16, torch.float16),
    (torch.bfloat16, torch.bfloat16),
    (torch.float32, torch.float32),
    (torch.float16, FP8),
    (torch.bfloat16, FP8),
    (torch.float32, FP8),
]
RESHAPE_DTYPE_IDS = ["fp16", "bf16", "fp32", "fp16-fp8", "bf16-fp8", "fp32-fp8"]
COPY_DTYPES = [torch.float16, torch.bfloat16, torch.float32, FP8]
COPY_DTYPE_IDS = ["fp16", "bf16", "fp32", "fp8"]


def _cuda_skip_reason() -> str | None:
    if not torch.cuda.is_available():
        return (
            "no CUDA device visible to torch (torch "
            f"{torch.__version__}, built with CUDA {torch.version.cuda}); CUDA kernels untested here"
        )
    if ops.HAS_EXTENSION and not ops.HAS_CUDA_KERNELS:
        return "kvcy._C was built without CUDA kernels (CPU-only torch or no nvcc at build time)"
    return None


_CUDA_SKIP = _cuda_skip_reason()
DEVICES = [
    pytest.param("cpu", id="cpu"),
    pytest.param(
        "cuda", id="cuda", marks=[pytest.mark.gpu, pytest.mark.skipif(_CUDA_SKIP is not None, reason=_CUDA_SKIP or "")]
    ),
]
needs_ext = pytest.mark.skipif(
    not ops.HAS_EXTENSION, reason=f"kvcy._C not loaded (implementation: {ops.IMPLEMENTATION})"
)


def _ext_op(name: str):
    return getattr(torch.ops.kvcy, name)


def _ref_op(name: str):
    return getattr(ref, name)


def _order(layout: KVCacheLayout) -> list[int]:
    return list(layout.stride_order)


def _random(shape, dtype, device="cpu", gen=None) -> torch.Tensor:
    """Random data of any dtype; fp8 gets arbitrary bit patterns (NaNs included)."""
    if dtype == FP8:
        return torch.randint(0, 256, shape, dtype=torch.uint8, generator=gen).view(FP8).to(device)
    return (torch.randn(shape, generator=gen) * 3).to(dtype).to(device)


def _zeros(shape, dtype, device="cpu") -> torch.Tensor:
    return torch.zeros(list(shape), dtype=torch.uint8, device=device).view(dtype) if dtype == FP8 else torch.zeros(
        list(shape), dtype=dtype, device=device)


def _cache(shape5, layout, dtype, device="cpu", gen=None) -> torch.Tensor:
    phys = [shape5[d] for d in layout.stride_order]
    return _random(phys, dtype, device, gen)


def assert_same(a: torch.Tensor, b: torch.Tensor) -> None:
    """Bitwise equality (NaN payloads and fp8 included)."""
    assert a.shape == b.shape and a.dtype == b.dtype
    torch.testing.assert_close(
        a.cpu().contiguous().view(torch.uint8), b.cpu().contiguous().view(torch.uint8), rtol=0, atol=0
    )


def _both(name: str, args_fn):
    """Run the op on fresh args with the extension and with the reference; return both arg tuples."""
    a, b = args_fn(), args_fn()
    _ext_op(name)(*a)
    _ref_op(name)(*b)
    return a, b


def _slots(num_tokens, num_slots, gen, skip_every=3) -> torch.Tensor:
    """Distinct slots for num_tokens tokens, every skip_every-th one -1."""
    perm = torch.randperm(num_slots, generator=gen)[:num_tokens]
    slots = perm.clone()
    slots[::skip_every] = -1
    return slots


# ---------------------------------------------------------------------------
# The reference against naive loops
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("layout", LAYOUTS, ids=lambda m: m.name)
def test_reference_reshape_and_cache_by_hand(layout):
    gen = torch.Generator().manual_seed(1)
    L, B, H, N, C = 2, 3, 2, 4, 5
    kc = torch.zeros([(L, B, H, N, C)[d] for d in layout.stride_order])
    vc = torch.zeros_like(kc)
    key, value = torch.randn(5, H, C, generator=gen), torch.randn(5, H, C, generator=gen)
    slots = torch.tensor([3, -1, 11, 0, 4])
    ref.reshape_and_cache(key, value, kc, vc, slots, _order(layout), 1)
    kl, vl = ops.logical_view(kc, layout), ops.logical_view(vc, layout)
    expect_k, expect_v = torch.zeros(L, B, H, N, C), torch.zeros(L, B, H, N, C)
    for t, s in enumerate(slots.tolist()):
        if s >= 0:
            expect_k[1, s // N, :, s % N, :] = key[t]
            expect_v[1, s // N, :, s % N, :] = value[t]
    torch.testing.assert_close(kl, expect_k, rtol=0, atol=0)
    torch.testing.assert_close(vl, expect_v, rtol=0, atol=0)


@pytest.mark.parametrize("layout", LAYOUTS, ids=lambda m: m.name)
def test_reference_block_ops_by_hand(layout):
    gen = torch.Generator().manual_seed(2)
    shape = (2, 6, 3, 2, 4)
    order = _order(layout)
    cache = _cache(shape, layout, torch.float32, gen=gen)
    before = ops.logical_view(cache, layout).clone()
    ref.copy_blocks(cache, torch.tensor([[0, 3], [0, 4], [5, 1]]), order)
    expect = before.clone()
    for s, d in ((0, 3), (0, 4), (5, 1)):
        expect[:, d] = before[:, s]
    torch.testing.assert_close(ops.logical_view(cache, layout), expect, rtol=0, atol=0)

    staging = torch.empty(ops.staging_shape(cache, layout, 3))
    ref.gather_blocks(cache, torch.tensor([4, 4, 2]), staging, order)
    sl = ref.staging_view(staging, order, "t", "staging")
    for i, b in enumerate((4, 4, 2)):
        torch.testing.assert_close(sl[:, i], expect[:, b], rtol=0, atol=0)
    # staging holds each block's bytes in the cache's physical order
    phys_block = cache.movedim(order.index(1), 0)[4]
    torch.testing.assert_close(staging[0], phys_block, rtol=0, atol=0)

    other = torch.zeros_like(cache)
    ref.scatter_blocks(staging, other, torch.tensor([0, 5, 1]), order)
    ol = ops.logical_view(other, layout)
    torch.testing.assert_close(ol[:, 5], expect[:, 4], rtol=0, atol=0)
    torch.testing.assert_close(ol[:, 1], expect[:, 2], rtol=0, atol=0)
    assert not ol[:, 2:5].any()


def test_reference_fp8_saturates_scales_and_keeps_nan():
    x = torch.tensor([[[1.0, -1.0, 1000.0, -1000.0, float("nan"), float("inf"), 0.3, -0.0]]])
    out = ref.to_fp8(x, torch.tensor([2.0])).to(torch.float32)
    expect = torch.tensor([0.5, -0.5, 448.0, -448.0, float("nan"), 448.0, 0.15, -0.0]).to(FP8).to(torch.float32)
    torch.testing.assert_close(out.reshape(-1), expect, equal_nan=True, rtol=0, atol=0)


# ---------------------------------------------------------------------------
# Extension against the reference
# ---------------------------------------------------------------------------


@needs_ext
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtypes", RESHAPE_DTYPES, ids=RESHAPE_DTYPE_IDS)
@pytest.mark.parametrize("shape", SHAPES, ids=SHAPE_IDS)
@pytest.mark.parametrize("layout", LAYOUTS, ids=lambda m: m.name)
def test_reshape_and_cache_matches_reference(layout, shape, dtypes, device):
    in_dtype, cache_dtype = dtypes
    L, B, H, N, C = shape
    gen = torch.Generator().manual_seed(100 * LAYOUTS.index(layout) + SHAPES.index(shape))
    T = min(B * N, 9)
    key = _random((T, H, C), in_dtype, device, gen) * 40  # some beyond the fp8 range after scaling
    value = _random((T, H, C), in_dtype, device, gen)
    slots = _slots(T, B * N, gen).to(device)
    kc0, vc0 = _cache(shape, layout, cache_dtype, device, gen), _cache(shape, layout, cache_dtype, device, gen)
    scales = (torch.tensor([0.75], device=device), torch.tensor([1.25], device=device))

    def args():
        return (key, value, kc0.clone(), vc0.clone(), slots, _order(layout), L - 1, *scales)

    a, b = _both("reshape_and_cache", args)
    assert_same(a[2], b[2])
    assert_same(a[3], b[3])


@needs_ext
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("layout", LAYOUTS, ids=lambda m: m.name)
def test_reshape_and_cache_strided_inputs_and_packed_kv(layout, device):
    """Keys sliced out of a fused qkv tensor; K and V as the two halves of one packed cache."""
    gen = torch.Generator().manual_seed(7)
    L, B, H, N, D = 2, 4, 2, 4, 80
    qkv = _random((6, 3 * H, D), torch.bfloat16, device, gen)
    key, value = qkv[:, H : 2 * H], qkv[:, 2 * H :]
    packed0 = _cache((L, B, H, N, 2 * D), layout, torch.bfloat16, device, gen)
    slots = torch.tensor([15, 0, -1, 7, 8, 3], device=device)
    for scale_device in ("cpu", device):
        results = []
        for op in (_ext_op("reshape_and_cache"), _ref_op("reshape_and_cache")):
            packed = packed0.clone()
            kc, vc = ops.split_kv(packed)
            op(key, value, kc, vc, slots, _order(layout), 1, torch.tensor([2.0], device=scale_device), None)
            results.append(packed)
        assert_same(*results)
    pl = ops.logical_view(results[0], layout)
    torch.testing.assert_close(pl[1, 3, :, 3, :D], key[0], rtol=0, atol=0)
    torch.testing.assert_close(pl[1, 3, :, 3, D:], value[0], rtol=0, atol=0)


@needs_ext
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", COPY_DTYPES, ids=COPY_DTYPE_IDS)
@pytest.mark.parametrize("shape", SHAPES, ids=SHAPE_IDS)
@pytest.mark.parametrize("src_layout", LAYOUTS, ids=lambda m: m.name)
def test_convert_layout_matches_reference(src_layout, shape, dtype, device):
    gen = torch.Generator().manual_seed(3)
    src = _cache(shape, src_layout, dtype, device, gen)
    for dst_layout in LAYOUTS:
        dst_shape = [shape[d] for d in dst_layout.stride_order]

        def args(src=src, dst_shape=dst_shape, dst_layout=dst_layout):
            return (src, _zeros(dst_shape, dtype, device),
                    _order(src_layout), _order(dst_layout))

        a, b = _both("convert_layout", args)
        assert_same(a[1], b[1])
        assert_same(ops.logical_view(a[1], dst_layout), ops.logical_view(src, src_layout))


def _mapping(num_blocks, n, gen, disjoint=True) -> torch.Tensor:
    perm = torch.randperm(num_blocks, generator=gen)
    if disjoint:
        n = min(n, num_blocks // 2)
        return torch.stack([perm[:n], perm[n : 2 * n]], dim=1)
    src = torch.randint(0, num_blocks, (n,), generator=gen)
    return torch.stack([src, perm[:n]], dim=1)


@needs_ext
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", COPY_DTYPES, ids=COPY_DTYPE_IDS)
@pytest.mark.parametrize("shape", SHAPES, ids=SHAPE_IDS)
@pytest.mark.parametrize("layout", LAYOUTS, ids=lambda m: m.name)
def test_copy_blocks_matches_reference(layout, shape, dtype, device):
    gen = torch.Generator().manual_seed(4)
    cache = _cache(shape, layout, dtype, device, gen)
    for mapping in (_mapping(shape[1], 3, gen), torch.empty(0, 2, dtype=torch.int64)):
        for map_device in {"cpu", device}:
            a, b = _both("copy_blocks", lambda: (cache.clone(), mapping.to(map_device), _order(layout)))
            assert_same(a[0], b[0])
    # one source to several destinations
    m = torch.tensor([[0, b] for b in range(1, shape[1])])
    a, b = _both("copy_blocks", lambda: (cache.clone(), m, _order(layout)))
    assert_same(a[0], b[0])


@needs_ext
@pytest.mark.parametrize("direction", ["same", "to_cpu", "to_cpu_pinned", "from_cpu", "from_cpu_pinned"])
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", COPY_DTYPES, ids=COPY_DTYPE_IDS)
@pytest.mark.parametrize("layout", LAYOUTS, ids=lambda m: m.name)
def test_swap_blocks_matches_reference(layout, dtype, device, direction):
    if direction != "same" and device == "cpu":
        pytest.skip("host <-> device swaps need a CUDA device")
    gen = torch.Generator().manual_seed(5)
    L, H, N, C = 2, 3, 4, 80
    src_dev = dst_dev = device
    pin = direction.endswith("pinned")
    if direction.startswith("to_cpu"):
        dst_dev = "cpu"
    elif direction.startswith("from_cpu"):
        src_dev = "cpu"
    src = _cache((L, 6, H, N, C), layout, dtype, src_dev, gen)
    dst0 = _cache((L, 9, H, N, C), layout, dtype, dst_dev, gen)
    if pin and src_dev == "cpu":
        src = src.pin_memory()
    mapping = torch.tensor([[0, 8], [5, 0], [5, 3], [2, 7]])

    def args():
        dst = dst0.clone()
        if pin and dst_dev == "cpu":
            dst = dst.pin_memory()
        return (src, dst, mapping, _order(layout))

    a, b = _both("swap_blocks", args)
    if device == "cuda":
        torch.cuda.synchronize()
    assert_same(a[1], b[1])


@needs_ext
@pytest.mark.parametrize("staging_on", ["same", "cpu", "cpu_pinned"])
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", COPY_DTYPES, ids=COPY_DTYPE_IDS)
@pytest.mark.parametrize("shape", SHAPES, ids=SHAPE_IDS)
@pytest.mark.parametrize("layout", LAYOUTS, ids=lambda m: m.name)
def test_gather_scatter_match_reference(layout, shape, dtype, device, staging_on):
    if staging_on != "same" and device == "cpu":
        pytest.skip("a host staging buffer for a device cache needs a CUDA device")
    gen = torch.Generator().manual_seed(6)
    order = _order(layout)
    cache = _cache(shape, layout, dtype, device, gen)
    ids = torch.randint(0, shape[1], (5,), generator=gen)  # repeats allowed
    stage_dev = device if staging_on == "same" else "cpu"

    def staging(n):
        t = _zeros(ops.staging_shape(cache, layout, n), dtype, stage_dev)
        return t.pin_memory() if staging_on == "cpu_pinned" else t

    a, b = _both("gather_blocks", lambda: (cache, ids, staging(5), order))
    if device == "cuda":
        torch.cuda.synchronize()
    assert_same(a[2], b[2])

    uniq = torch.randperm(shape[1], generator=gen)[: min(4, shape[1])]
    packed = _random(ops.staging_shape(cache, layout, uniq.numel()), dtype, stage_dev, gen)
    if staging_on == "cpu_pinned":
        packed = packed.pin_memory()
    a, b = _both("scatter_blocks", lambda: (packed, cache.clone(), uniq, order))
    if device == "cuda":
        torch.cuda.synchronize()
    assert_same(a[1], b[1])
    # empty lists are no-ops
    a, b = _both("gather_blocks", lambda: (cache, torch.empty(0, dtype=torch.int64), staging(0), order))
    assert a[2].numel() == 0
    a, b = _both("scatter_blocks", lambda: (staging(0), cache.clone(), torch.empty(0, dtype=torch.int64), order))
    assert_same(a[1], cache)


@needs_ext
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    layout=st.sampled_from(LAYOUTS),
    shape=st.tuples(*(st.integers(1, 4) for _ in range(4)), st.integers(1, 12)),
    dtype=st.sampled_from(COPY_DTYPES),
    seed=st.integers(0, 2**16),
    offset=st.integers(0, 3),
)
def test_block_ops_property(layout, shape, dtype, seed, offset):
    """Random shapes, odd content sizes and padded (non-contiguous) caches."""
    gen = torch.Generator().manual_seed(seed)
    order = _order(layout)
    L, B, H, N, C = shape
    # a padded cache: C lives inside a wider innermost axis
    wide = _cache((L, B, H, N, C + offset), layout, dtype, gen=gen)
    cache = wide[..., offset:]
    mapping = _mapping(B, 2, gen)
    a, b = _both("copy_blocks", lambda: (cache.clone(), mapping, order))
    assert_same(a[0], b[0])
    ids = torch.randint(0, B, (3,), generator=gen)
    a, b = _both("gather_blocks", lambda: (cache, ids, _zeros(ops.staging_shape(cache, layout, 3), dtype), order))
    assert_same(a[2], b[2])
    other = LAYOUTS[seed % len(LAYOUTS)]
    a, b = _both("convert_layout",
                 lambda: (cache, _zeros([shape[d] for d in other.stride_order], dtype), order, _order(other)))
    assert_same(a[1], b[1])


# ---------------------------------------------------------------------------
# Errors: same type, same message, nothing written
# ---------------------------------------------------------------------------


def _raises_same(name: str, args_fn, exc_type, match: str):
    """Both implementations raise exc_type with one message containing `match`; no tensor changes."""
    messages = []
    impls = [_ref_op(name)] + ([_ext_op(name)] if ops.HAS_EXTENSION else [])
    for op in impls:
        args = args_fn()
        before = [a.clone() for a in args if isinstance(a, torch.Tensor)]
        with pytest.raises(exc_type, match=match) as info:
            op(*args)
        messages.append(str(info.value).splitlines()[0])
        after = [a for a in args if isinstance(a, torch.Tensor)]
        for x, y in zip(before, after):
            assert_same(x, y)
    assert len(set(messages)) == 1, messages


LBHNC = _order(KVCacheLayout.LBHNC)


def _small_cache(dtype=torch.float16, blocks=4):
    return torch.zeros(2, blocks, 2, 4, 8, dtype=dtype)


def test_reshape_and_cache_errors():
    def base(**kw):
        d = dict(key=torch.ones(3, 2, 8, dtype=torch.float16), value=torch.ones(3, 2, 8, dtype=torch.float16),
                 key_cache=_small_cache(), value_cache=_small_cache(), slot_mapping=torch.tensor([0, 5, -1]),
                 stride_order=LBHNC, layer=0, k_scale=None, v_scale=None)
        d.update(kw)
        return lambda: tuple(d.values())

    name = "reshape_and_cache"
    _raises_same(name, base(slot_mapping=torch.tensor([0, 16, -1])), ValueError,
                 r"slot_mapping\[1\] = 16 is out of range for a cache of 4 blocks x 4 tokens per block")
    _raises_same(name, base(slot_mapping=torch.tensor([0, 1])), ValueError, "one entry per token")
    _raises_same(name, base(slot_mapping=torch.tensor([0, 1, 2], dtype=torch.int32)), TypeError, "int64")
    _raises_same(name, base(layer=2), ValueError, "layer 2 is out of range for a cache of 2 layer slots")
    _raises_same(name, base(layer=-1), ValueError, "layer -1 is out of range")
    _raises_same(name, base(stride_order=[0, 1, 2, 3, 3]), ValueError, "permutation")
    _raises_same(name, base(key=torch.ones(3, 3, 8, dtype=torch.float16)), ValueError, "shape of key")
    _raises_same(name, base(key=torch.ones(3, 2, 8, dtype=torch.float16)[:, :, :8],
                            value=torch.ones(3, 2, 8, dtype=torch.float16),
                            key_cache=torch.zeros(2, 4, 3, 4, 8, dtype=torch.float16),
                            value_cache=torch.zeros(2, 4, 3, 4, 8, dtype=torch.float16)),
                 ValueError, "key has 2 heads of size 8 but the cache holds 3 heads of size 8")
    _raises_same(name, base(key_cache=_small_cache(torch.float32), value_cache=_small_cache(torch.float32)),
                 TypeError, "key_cache must have the dtype of key")
    _raises_same(name, base(value_cache=_small_cache(torch.float32)), TypeError, "same dtype")
    _raises_same(name, base(key=torch.ones(3, 2, 8, dtype=torch.float64), value=torch.ones(3, 2, 8,
                            dtype=torch.float64)), TypeError, "float16, bfloat16 or float32")
    _raises_same(name, base(key_cache=torch.zeros(2, 4, 2, 4, dtype=torch.float16)), ValueError, "5-D")
    _raises_same(name, base(key_cache=_small_cache(FP8), value_cache=_small_cache(FP8),
                            k_scale=torch.ones(2)), ValueError, "k_scale must hold one value")
    _raises_same(name, base(key_cache=_small_cache(FP8), value_cache=_small_cache(FP8),
                            v_scale=torch.ones(1, dtype=torch.int64)), TypeError, "floating-point")


def test_reshape_and_cache_negative_slots_skip():
    cache = torch.zeros(1, 2, 1, 2, 4)
    for op in [_ref_op("reshape_and_cache")] + ([_ext_op("reshape_and_cache")] if ops.HAS_EXTENSION else []):
        c = cache.clone()
        op(torch.ones(3, 1, 4), torch.ones(3, 1, 4), c, c.clone(), torch.tensor([-1, -5, -1]), LBHNC, 0, None, None)
        assert not c.any()


def test_block_op_errors():
    cache = _small_cache
    _raises_same("copy_blocks", lambda: (cache(), torch.tensor([[0, 1], [2, 4]]), LBHNC), ValueError,
                 r"block_mapping\[1, 1\] = 4 is out of range for a cache of 4 blocks")
    _raises_same("copy_blocks", lambda: (cache(), torch.tensor([[-1, 1]]), LBHNC), ValueError,
                 r"block_mapping\[0, 0\] = -1 is out of range")
    _raises_same("copy_blocks", lambda: (cache(), torch.tensor([[0, 1], [2, 1]]), LBHNC), ValueError,
                 "destination block 1 appears more than once")
    _raises_same("copy_blocks", lambda: (cache(), torch.tensor([[0, 1], [1, 2]]), LBHNC), ValueError,
                 "block 1 is both a source and a destination")
    _raises_same("copy_blocks", lambda: (cache(), torch.tensor([0, 1]), LBHNC), ValueError, r"shape \[n, 2\]")
    _raises_same("copy_blocks", lambda: (cache(), torch.tensor([[0, 1]], dtype=torch.int32), LBHNC), TypeError,
                 "must be an int64 tensor, got torch.int32")
    _raises_same("copy_blocks", lambda: (cache(), torch.tensor([[0, 1]]), [0, 1, 2, 3]), ValueError,
                 "permutation")

    _raises_same("swap_blocks", lambda: (cache(), cache(blocks=2), torch.tensor([[3, 1], [0, 2]]), LBHNC),
                 ValueError, r"block_mapping\[1, 1\] = 2 is out of range for a cache of 2 blocks")
    _raises_same("swap_blocks", lambda: (cache(), cache(torch.float32), torch.tensor([[0, 1]]), LBHNC), TypeError,
                 "same dtype, got torch.float16 and torch.float32")
    _raises_same("swap_blocks", lambda: (cache(), torch.zeros(2, 4, 3, 4, 8, dtype=torch.float16),
                                         torch.tensor([[0, 1]]), LBHNC), ValueError, "same logical L, H, N, C")
    _raises_same("swap_blocks", lambda: (cache(), cache(), torch.tensor([[0, 1], [1, 1]]), LBHNC), ValueError,
                 "destination block 1 appears more than once")
    shared = cache()
    _raises_same("swap_blocks", lambda: (shared, shared, torch.tensor([[0, 1], [1, 2]]), LBHNC), ValueError,
                 "block 1 is both a source and a destination")

    def staging(n):
        return torch.zeros(n, 2, 2, 4, 8, dtype=torch.float16)

    _raises_same("gather_blocks", lambda: (cache(), torch.tensor([0, 9]), staging(2), LBHNC), ValueError,
                 r"block_ids\[1\] = 9 is out of range for a cache of 4 blocks")
    _raises_same("gather_blocks", lambda: (cache(), torch.tensor([0, 1, 2]), staging(2), LBHNC), ValueError,
                 "staging has room for 2 blocks but block_ids lists 3")
    _raises_same("gather_blocks", lambda: (cache(), torch.tensor([0]), torch.zeros(1, 2, 2, 4, 9,
                                           dtype=torch.float16), LBHNC), ValueError, "same logical L, H, N, C")
    _raises_same("gather_blocks", lambda: (cache(), torch.tensor([0]), torch.zeros(1, 2, 2, 4,
                                           dtype=torch.float16), LBHNC), ValueError, "5-D tensor")
    _raises_same("scatter_blocks", lambda: (staging(2), cache(), torch.tensor([3, 3]), LBHNC), ValueError,
                 "block 3 appears more than once in block_ids")
    _raises_same("scatter_blocks", lambda: (staging(2), cache(), torch.tensor([[3, 2]]), LBHNC), ValueError,
                 "must be 1-D")
    _raises_same("convert_layout", lambda: (cache(), torch.zeros(2, 4, 2, 4, 9, dtype=torch.float16), LBHNC,
                                            LBHNC), ValueError, r"same logical shape \[L, B, H, N, C\]")
    _raises_same("convert_layout", lambda: (cache(), cache(), LBHNC, [5, 1, 2, 3, 4]), ValueError,
                 "dst_stride_order must be a permutation")


def _meta_cases(meta: str):
    """Each op's arguments with the tensor ``meta`` on the meta device (or every tensor, for "all")."""

    def on(name, t):
        return t.to("meta") if meta in (name, "all") else t

    cache, ids2, ids1 = _small_cache(), torch.tensor([[0, 1]]), torch.tensor([1, 0])
    staging = torch.zeros(2, 2, 2, 4, 8, dtype=torch.float16)
    key = torch.ones(2, 2, 8, dtype=torch.float16)
    return {
        "copy_blocks": (on("cache", cache), on("block_mapping", ids2), LBHNC),
        "swap_blocks": (on("src", cache), on("dst", _small_cache()), on("block_mapping", ids2), LBHNC),
        "gather_blocks": (on("cache", cache), on("block_ids", ids1), on("staging", staging), LBHNC),
        "scatter_blocks": (on("staging", staging), on("cache", cache), on("block_ids", ids1), LBHNC),
        "reshape_and_cache": (on("key", key), on("key", key.clone()), on("cache", cache), on("cache", _small_cache()),
                              on("slot_mapping", torch.tensor([0, 5])), LBHNC, 0, None, None),
        "convert_layout": (on("src", cache), on("dst", _small_cache()), LBHNC, LBHNC),
    }


@pytest.mark.parametrize("meta", ["block_mapping", "block_ids", "slot_mapping", "cache", "dst", "staging"])
def test_a_meta_tensor_among_real_ones_is_refused_alike(meta):
    """The C++ path (dispatched to the meta kernel) copied nothing and raised nothing
    for meta ids, and gather_blocks returned its buffer unwritten; the reference
    failed on Tensor.item().  Both now refuse, with one message, changing nothing."""
    impls = [_ref_op] + ([_ext_op] if ops.HAS_EXTENSION else [])
    for name, args in _meta_cases(meta).items():
        if not any(isinstance(a, torch.Tensor) and a.is_meta for a in args):
            continue
        messages = []
        for get_op in impls:
            args = _meta_cases(meta)[name]
            real = [a for a in args if isinstance(a, torch.Tensor) and not a.is_meta]
            before = [a.clone() for a in real]
            with pytest.raises(ValueError, match=r"is on the meta device but \w+ is not: a meta tensor holds no values") as info:
                get_op(name)(*args)
            messages.append(str(info.value).splitlines()[0])
            for x, y in zip(before, real):
                assert_same(x, y)
        assert len(set(messages)) == 1, (name, messages)


def test_an_all_meta_call_checks_shapes_and_does_nothing_alike():
    impls = [_ref_op] + ([_ext_op] if ops.HAS_EXTENSION else [])
    for name in _meta_cases("all"):
        for get_op in impls:
            assert get_op(name)(*_meta_cases("all")[name]) is None, (name, get_op)
        bad = list(_meta_cases("all")[name])
        bad[5 if name == "reshape_and_cache" else -1] = [0, 1, 2, 3, 3]  # (the stride order)
        for get_op in impls:
            with pytest.raises(ValueError, match="must be a permutation"):
                get_op(name)(*bad)


def _writes_through_a_view(name):
    """Arguments whose written tensor overlaps itself or shares memory with an input."""
    cache = _small_cache()
    expanded = torch.zeros(2, 1, 2, 4, 8, dtype=torch.float16).expand(2, 4, 2, 4, 8)  # every block one memory
    key = torch.ones(2, 2, 8, dtype=torch.float16)
    packed = torch.zeros(5, 2, 2, 4, 8, dtype=torch.float16)  # a cache and a staging buffer in one allocation
    return {
        "copy_blocks": (expanded, torch.tensor([[0, 1]]), LBHNC),
        "swap_blocks": (cache, expanded, torch.tensor([[0, 1]]), LBHNC),
        "reshape_and_cache": (key, key.clone(), expanded, _small_cache(), torch.tensor([0, 5]), LBHNC, 0, None, None),
        "convert_layout": (cache, cache, LBHNC, LBHNC),
        "gather_blocks": (packed[:4].transpose(0, 1), torch.tensor([1, 0]), packed[2:4], LBHNC),
        "scatter_blocks": (packed[2:4], packed[:4].transpose(0, 1), torch.tensor([1, 0]), LBHNC),
    }[name]


@pytest.mark.parametrize("name, match", [
    ("copy_blocks", "copy_blocks: cache has elements that share memory"),
    ("swap_blocks", "swap_blocks: dst has elements that share memory"),
    ("reshape_and_cache", "reshape_and_cache: key_cache has elements that share memory"),
    ("convert_layout", "convert_layout: src and dst share memory"),
    ("gather_blocks", "gather_blocks: cache and staging share memory"),
    ("scatter_blocks", "scatter_blocks: cache and staging share memory"),
])
def test_a_written_tensor_that_overlaps_itself_or_an_input_is_refused_alike(name, match):
    """A staging buffer aliasing the cache gave [1, 1] in C++ and [1, 0] in the reference for
    gather_blocks([1, 0]); a destination overlapping itself gave order-dependent bytes."""
    _raises_same(name, lambda: _writes_through_a_view(name), ValueError, match)


def test_views_that_only_look_close_are_accepted():
    """Padding, slices of other blocks and the K / V halves of one packed cache share no element."""
    padded = torch.zeros(2, 4, 2, 4, 10, dtype=torch.float16)[..., :8]
    kv = torch.zeros(2, 4, 2, 4, 16, dtype=torch.float16)
    k_half, v_half = ops.split_kv(kv)
    key = torch.ones(2, 2, 8, dtype=torch.float16)
    big = torch.zeros(6, 2, 2, 4, 8, dtype=torch.float16)
    impls = [_ref_op] + ([_ext_op] if ops.HAS_EXTENSION else [])
    for get_op in impls:
        get_op("copy_blocks")(padded, torch.tensor([[0, 1]]), LBHNC)
        get_op("reshape_and_cache")(key, key.clone(), k_half, v_half, torch.tensor([0, 5]), LBHNC, 0, None, None)
        get_op("gather_blocks")(big[:4].transpose(0, 1), torch.tensor([1, 0]), big[4:], LBHNC)


def _dtypes_to_try():
    out = []
    for name in dir(torch):
        dtype = getattr(torch, name)
        if isinstance(dtype, torch.dtype) and dtype not in out:
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    torch.zeros(2, 4, 2, 4, 8, dtype=dtype).clone().view(torch.uint8)
            except Exception:  # (sub-byte, bit and quantized dtypes have no plain tensors)
                continue
            out.append(dtype)
    return out


@pytest.mark.parametrize("dtype", _dtypes_to_try(), ids=str)
def test_dtype_names_in_messages_are_pythons(dtype):
    """C++ said torch.UInt64 and torch.ComplexFloat where the reference says
    torch.uint64 and torch.complex64."""
    if dtype != torch.float16:
        _raises_same("swap_blocks", lambda: (_small_cache(), torch.zeros(2, 4, 2, 4, 8, dtype=dtype),
                                             torch.tensor([[0, 1]]), LBHNC), TypeError,
                     f"same dtype, got torch.float16 and {dtype}$")
    if dtype != torch.int64:
        _raises_same("copy_blocks", lambda: (_small_cache(), torch.zeros(1, 2, dtype=dtype), LBHNC), TypeError,
                     f"must be an int64 tensor, got {dtype}$")


@pytest.mark.parametrize("device", DEVICES)
def test_empty_and_zero_sized(device):
    """Zero tokens, layers or mapping rows: a no-op that returns None and leaves every
    tensor as it was, in the reference and the extension alike; validation still runs."""

    def full(*shape):  # a sentinel fill, so that a stray write shows
        return torch.full(shape, 7.0, device=device)

    def noops():
        return [
            ("copy_blocks", (full(1, 0, 2, 4, 8), torch.empty(0, 2, dtype=torch.int64), LBHNC)),
            ("copy_blocks", (full(2, 3, 2, 4, 8), torch.empty(0, 2, dtype=torch.int64), LBHNC)),
            ("copy_blocks", (full(0, 3, 2, 4, 8), torch.tensor([[0, 1]]), LBHNC)),
            ("reshape_and_cache", (full(0, 2, 8), full(0, 2, 8), full(1, 2, 2, 4, 8), full(1, 2, 2, 4, 8),
                                   torch.empty(0, dtype=torch.int64, device=device), LBHNC, 0, None, None)),
            ("convert_layout", (full(2, 0, 2, 4, 8), full(0, 2, 2, 4, 8), LBHNC, _order(KVCacheLayout.BLHNC))),
        ]

    def bad():  # empty work, bad arguments: the same errors as with work to do
        return [
            ("copy_blocks", (full(0, 3, 2, 4, 8), torch.tensor([[0, 3]]), LBHNC), "out of range"),
            ("copy_blocks", (full(0, 3, 2, 4, 8), torch.tensor([[1, 1]]), LBHNC), "both a source and"),
            ("reshape_and_cache", (full(0, 2, 8), full(0, 3, 8), full(1, 2, 2, 4, 8), full(1, 2, 2, 4, 8),
                                   torch.empty(0, dtype=torch.int64, device=device), LBHNC, 0, None, None),
             "shape of key"),
            ("reshape_and_cache", (full(0, 2, 8), full(0, 2, 8), full(1, 2, 2, 4, 8), full(1, 2, 2, 4, 8),
                                   torch.empty(0, dtype=torch.int64, device=device), LBHNC, 1, None, None),
             "out of range"),
        ]

    get_ops = [_ref_op] + ([_ext_op] if ops.HAS_EXTENSION else [])
    for i, (op_name, _) in enumerate(noops()):
        for get_op in get_ops:
            args = noops()[i][1]
            before = [a.clone() for a in args if isinstance(a, torch.Tensor)]
            assert get_op(op_name)(*args) is None, (op_name, get_op)
            after = [a for a in args if isinstance(a, torch.Tensor)]
            for b, a in zip(before, after):
                assert a.shape == b.shape and a.dtype == b.dtype
                torch.testing.assert_close(a, b, rtol=0, atol=0)
    for i, (op_name, _, match) in enumerate(bad()):
        messages = []
        for get_op in get_ops:
            with pytest.raises(ValueError, match=match) as info:
                get_op(op_name)(*bad()[i][1])
            messages.append(str(info.value))
        assert len(set(messages)) == 1, messages


# ---------------------------------------------------------------------------
# torch.library integration
# ---------------------------------------------------------------------------


def _opcheck_cases():
    gen = torch.Generator().manual_seed(9)
    lay = KVCacheLayout.LBNHC
    order = _order(lay)
    shape = (2, 5, 2, 4, 16)
    cache = _cache(shape, lay, torch.float16, gen=gen)
    key = torch.randn(3, 2, 16, dtype=torch.float16, generator=gen)
    return {
        "reshape_and_cache": (key, key.clone(), cache.clone(), cache.clone(), torch.tensor([3, -1, 17]), order, 1,
                              None, None),
        "reshape_and_cache_fp8": (key, key.clone(), torch.zeros_like(cache, dtype=torch.uint8).view(FP8),
                                  torch.zeros_like(cache, dtype=torch.uint8).view(FP8), torch.tensor([3, -1, 17]),
                                  order, 0, torch.tensor([0.5]), torch.tensor([2.0])),
        "convert_layout": (cache, torch.empty([shape[d] for d in KVCacheLayout.BHLNC.stride_order],
                                              dtype=torch.float16), order, _order(KVCacheLayout.BHLNC)),
        "copy_blocks": (cache.clone(), torch.tensor([[0, 3], [1, 4]]), order),
        "swap_blocks": (cache, _cache((2, 7, 2, 4, 16), lay, torch.float16, gen=gen), torch.tensor([[0, 6]]),
                        order),
        "gather_blocks": (cache, torch.tensor([4, 0]), torch.empty(ops.staging_shape(cache, lay, 2),
                                                                    dtype=torch.float16), order),
        "scatter_blocks": (torch.randn(ops.staging_shape(cache, lay, 2), generator=gen).half(), cache.clone(),
                           torch.tensor([4, 0]), order),
    }


@needs_ext
@pytest.mark.parametrize("case", list(_opcheck_cases()))
def test_opcheck(case):
    args = _opcheck_cases()[case]
    op = getattr(torch.ops.kvcy, case.removesuffix("_fp8")).default
    utils = ("test_schema", "test_autograd_registration", "test_faketensor", "test_aot_dispatch_dynamic")
    if case.endswith("_fp8"):
        # test_schema compares outputs with float arithmetic that torch lacks for fp8 on the CPU
        utils = utils[1:]
    torch.library.opcheck(op, args, test_utils=utils)


@needs_ext
def test_torch_compile_traces_wrappers():
    lay = KVCacheLayout.BLNHC

    def step(key, value, kc, vc, slots, mapping):
        ops.reshape_and_cache(key, value, kc, vc, slots, lay)
        ops.copy_blocks([kc, vc], mapping, lay)
        return ops.gather_blocks(kc, torch.tensor([1, 2]), lay)

    shape = [(2, 4, 2, 4, 8)[d] for d in lay.stride_order]
    kc, vc = torch.zeros(shape), torch.zeros(shape)
    key, value = torch.randn(3, 2, 8), torch.randn(3, 2, 8)
    slots, mapping = torch.tensor([4, -1, 9]), torch.tensor([[1, 3]])
    compiled = torch.compile(step, backend="aot_eager", fullgraph=True)
    got = compiled(key, value, kc, vc, slots, mapping)
    kc2, vc2 = torch.zeros(shape), torch.zeros(shape)
    expect = step(key, value, kc2, vc2, slots, mapping)
    torch.testing.assert_close(got, expect, rtol=0, atol=0)
    torch.testing.assert_close(kc, kc2, rtol=0, atol=0)


# ---------------------------------------------------------------------------
# Wrappers
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("layout", LAYOUTS, ids=lambda m: m.name)
def test_wrappers_accept_reshape_kv_cache_views(layout):
    """Per-slot [B, H, N, C] views (layout=None) and the physical cache + layout agree."""
    spec = FullAttentionSpec(block_size=4, num_kv_heads=2, head_size=8, dtype=torch.float16)
    num_blocks, slots_n = 3, 2
    raw = torch.zeros(slots_n * num_blocks * spec.page_size_bytes, dtype=torch.int8)
    views = reshape_kv_cache(raw, spec, num_blocks, slots_n, layout)
    key, value = torch.randn(3, 2, 8).half(), torch.randn(3, 2, 8).half()
    slots = [2, 9, -1]
    kc, vc = ops.split_kv(views[1])
    ops.reshape_and_cache(key, value, kc, vc, slots, None)
    phys = ops.empty_cache((slots_n, num_blocks, 2, 4, 16), layout, dtype=torch.float16).zero_()
    pk, pv = ops.split_kv(phys)
    ops.reshape_and_cache(key, value, pk, pv, torch.tensor(slots), layout, layer=1)
    torch.testing.assert_close(views[1], ops.logical_view(phys, layout)[1], rtol=0, atol=0)
    # block ops through the views
    ops.copy_blocks(views[1], [[0, 2]])
    torch.testing.assert_close(views[1][2], views[1][0], rtol=0, atol=0)
    staged = ops.gather_blocks(views[1], [2, 0])
    assert list(staged.shape) == [2, 1, 2, 4, 16]
    ops.scatter_blocks(staged, views[0], [0, 1])
    torch.testing.assert_close(views[0][1], views[1][0], rtol=0, atol=0)
    out = ops.convert_layout(phys, layout, "LBHNC")
    torch.testing.assert_close(out, ops.logical_view(phys, layout), rtol=0, atol=0)


def test_wrapper_conveniences():
    lay = KVCacheLayout.LHBNC
    cache = ops.empty_cache((1, 4, 2, 2, 4), lay, dtype=torch.float32)
    assert list(cache.shape) == [1, 2, 4, 2, 4]
    cache.copy_(torch.arange(cache.numel(), dtype=torch.float32).reshape(cache.shape))
    mapping = torch.tensor([[0, 3]], dtype=torch.int32)  # converted to int64
    ops.copy_blocks(cache, mapping, "LHBNC")
    lv = ops.logical_view(cache, lay)
    torch.testing.assert_close(lv[:, 3], lv[:, 0], rtol=0, atol=0)
    ops.swap_blocks(cache, cache, [], lay)  # empty mapping
    with pytest.raises(ValueError, match="unknown KV cache layout"):
        ops.copy_blocks(cache, mapping, "XYZ")
    with pytest.raises(TypeError, match="layout must be"):
        ops.copy_blocks(cache, mapping, 3.5)
    with pytest.raises(ValueError, match="logical"):
        ops.copy_blocks(torch.zeros(3, 3), mapping)
    with pytest.raises(ValueError, match="odd size"):
        ops.split_kv(torch.zeros(2, 3))
    ops.reshape_and_cache(torch.ones(1, 2, 4), torch.ones(1, 2, 4),
                          *ops.split_kv(ops.empty_cache((1, 4, 2, 2, 8), lay, dtype=FP8)), [0], lay,
                          k_scale=2.0, v_scale=0.5)


def _run(code: str, **env) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          env={**os.environ, **env})


def test_import_kvcy_does_not_import_torch():
    proc = _run("import sys, kvcy, kvcy.kv_cache_interface; print('torch' in sys.modules)")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "False"


@pytest.mark.parametrize("how", ["env", "missing"])
def test_reference_fallback_is_announced_once(how):
    """KVCY_NO_EXTENSIONS=1, or a kvcy._C that does not import: reference ops, one log line."""
    code = (
        "import logging, sys; logging.basicConfig(level=logging.INFO)\n"
        + ("sys.modules['kvcy._C'] = None\n" if how == "missing" else "")
        + "import torch, kvcy.ops as o\n"
        "assert o.IMPLEMENTATION == 'reference' and not o.HAS_EXTENSION\n"
        "c = torch.arange(4.0).reshape(1, 2, 1, 1, 2); o.copy_blocks(c, [[0, 1]]); o.copy_blocks(c, [[1, 0]])\n"
        "assert c.flatten().tolist() == [0.0, 1.0, 0.0, 1.0]\n"
    )
    env = {"KVCY_REQUIRE_EXTENSIONS": ""}
    if how == "env":
        env["KVCY_NO_EXTENSIONS"] = "1"
    proc = _run(code, **env)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.count("using the plain-torch reference ops") == 1, proc.stderr


def test_implementation_flags():
    assert ops.IMPLEMENTATION in ("cpp", "reference")
    assert ops.HAS_EXTENSION == (ops.IMPLEMENTATION == "cpp")
    if os.environ.get("KVCY_REQUIRE_EXTENSIONS", "") not in ("", "0"):
        assert ops.HAS_EXTENSION
    logging.getLogger("kvcy.ops").debug("implementation %s", ops.IMPLEMENTATION)
