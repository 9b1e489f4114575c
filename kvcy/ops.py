"""KV-cache layout and block-copy ops: ``torch.ops.kvcy.*`` behind thin wrappers.

The GPU side of the cache: writing new tokens' keys and values into the paged
cache, rearranging a cache between :class:`~kvcy.kv_cache_interface.KVCacheLayout`
s, and moving whole blocks within a device, between GPU and pinned CPU memory,
and in and out of a packed staging buffer (the offloading data path).

**Caches.**  A cache is logically ``[L, B, H, N, C]`` (layer slots, blocks, kv
heads, tokens per block, content).  Every op takes the cache as its *physical*
tensor: 5-D, dims in the layout's ``stride_order`` (outermost first), any
strides (padding, slices and views welcome) - plus the ``layout``.  Pass
``layout=None`` to hand in a logical view instead: a 5-D ``[L, B, H, N, C]``
view, or the 4-D per-slot ``[B, H, N, C]`` views of
:func:`~kvcy.kv_cache_interface.reshape_kv_cache` (taken as ``L = 1``).

**Keys and values** are two tensors of one shape, ``key_cache`` and
``value_cache``: two allocations, or the two halves of the ``C`` axis of one
packed allocation whose content is ``[K | V]`` (the attention specs' ``C`` is
``2 * head_size``; :func:`split_kv` gives the halves as views).  Block ops move
whatever tensor they are given, so a packed cache moves K and V in one call.

**Implementations.**  ``IMPLEMENTATION`` is ``"cpp"`` when the ``kvcy._C``
extension imports (CPU kernels always, CUDA kernels when it was built with
CUDA: ``HAS_CUDA_KERNELS``) and ``"reference"`` otherwise; the reference is
plain torch (:mod:`kvcy._ops_reference`).  A missing extension is said once,
at import: a ``RuntimeWarning`` (``KVCY_ALLOW_REFERENCE_OPS=1`` turns it into
a log line).  ``KVCY_NO_EXTENSIONS=1`` forces the reference (logged),
``KVCY_REQUIRE_EXTENSIONS=1`` makes a missing extension an ImportError.
Tensors on a device the extension has no kernels for (CUDA with a CPU-only
build, MPS, ...) use the reference.

**Errors.**  Every op checks its arguments before touching memory: ValueError
for shapes, out-of-range block ids or slots, repeated destinations, a tensor
it writes that overlaps itself (an expanded view) or, for gather / scatter /
convert_layout, shares memory with the other cache argument, and a meta tensor
among real ones (a call on meta tensors only checks shapes and does nothing);
TypeError for dtypes.  Both implementations raise the same messages.  On CUDA, ids and
slots that live on the device are checked on the host, which synchronises.

Needs torch; ``import kvcy`` itself never imports it.
"""

from __future__ import annotations

import logging
import os
import warnings
from collections.abc import Sequence

try:
    import torch
except ImportError as exc:  # pragma: no cover - exercised without torch
    raise ImportError(
        "kvcy.ops needs torch (pip install torch, then rebuild kvcy with "
        "pip install --no-build-isolation -e . for its kernels); the rest of kvcy works without it"
    ) from exc

from kvcy import _ops_reference as _ref
from kvcy.kv_cache_interface import KVCacheLayout

__all__ = [
    "HAS_CUDA_KERNELS",
    "HAS_EXTENSION",
    "IMPLEMENTATION",
    "Layout",
    "convert_layout",
    "copy_blocks",
    "empty_cache",
    "gather_blocks",
    "logical_view",
    "reshape_and_cache",
    "scatter_blocks",
    "split_kv",
    "staging_shape",
    "swap_blocks",
]

logger = logging.getLogger(__name__)

#: A layout argument: a member, its name (``"LBHNC"``, ``"NHD"``), a raw stride
#: order, or None for "the tensor is already a logical view".
Layout = KVCacheLayout | str | Sequence[int] | None

_IDENTITY = [0, 1, 2, 3, 4]
_OPS = ("reshape_and_cache", "convert_layout", "copy_blocks", "swap_blocks", "gather_blocks", "scatter_blocks")


def _flag(name: str) -> bool:
    return os.environ.get(name, "") not in ("", "0")


def _load_extension() -> tuple[bool, str]:
    if _flag("KVCY_NO_EXTENSIONS"):
        return False, "KVCY_NO_EXTENSIONS=1"
    try:
        import kvcy._C  # noqa: F401  (registers torch.ops.kvcy.*)
    except ImportError as exc:
        if _flag("KVCY_REQUIRE_EXTENSIONS"):
            raise ImportError(f"KVCY_REQUIRE_EXTENSIONS=1 but kvcy._C does not import: {exc}") from exc
        return False, f"kvcy._C does not import: {exc}"
    return True, ""


HAS_EXTENSION, _why_not = _load_extension()
#: ``"cpp"`` (the kvcy._C kernels) or ``"reference"`` (plain torch).
IMPLEMENTATION = "cpp" if HAS_EXTENSION else "reference"
#: Whether kvcy._C has CUDA kernels (built against a CUDA torch with nvcc).
HAS_CUDA_KERNELS = HAS_EXTENSION and all(
    torch._C._dispatch_has_kernel_for_dispatch_key(f"kvcy::{name}", "CUDA") for name in _OPS
)
if not HAS_EXTENSION:
    if _flag("KVCY_NO_EXTENSIONS") or _flag("KVCY_ALLOW_REFERENCE_OPS"):
        logger.info("kvcy.ops: using the plain-torch reference ops (%s)", _why_not)
    else:
        # Most often a build without torch in the build environment (pip's build
        # isolation): say so once, where the user sees it, with the two ways out.
        warnings.warn(
            f"kvcy.ops: using the plain-torch reference ops ({_why_not}). kvcy was installed without "
            "its torch extension; to build it, install torch first, then "
            "KVCY_BUILD_TORCH=1 pip install --no-build-isolation kvcy. "
            "Set KVCY_ALLOW_REFERENCE_OPS=1 to silence this warning.",
            RuntimeWarning,
            stacklevel=2,
        )

_warned_devices: set[str] = set()


def _native(*tensors: torch.Tensor) -> bool:
    """True when torch.ops.kvcy has kernels for every tensor's device."""
    if not HAS_EXTENSION:
        return False
    for t in tensors:
        kind = t.device.type
        if kind in ("cpu", "meta") or (kind == "cuda" and HAS_CUDA_KERNELS):
            continue
        if kind not in _warned_devices:
            _warned_devices.add(kind)
            logger.warning("kvcy.ops: kvcy._C has no %s kernels; using the plain-torch reference there", kind)
        return False
    return True


# ---------------------------------------------------------------------------
# Layout helpers
# ---------------------------------------------------------------------------


def _stride_order(layout: Layout) -> list[int]:
    if isinstance(layout, KVCacheLayout):
        return list(layout.stride_order)
    if isinstance(layout, str):
        return list(KVCacheLayout.from_name(layout).stride_order)
    if isinstance(layout, Sequence):
        return [int(d) for d in layout]
    raise TypeError(f"layout must be a KVCacheLayout, a layout name or a stride order, got {layout!r}")


def _resolve(cache: torch.Tensor, layout: Layout, name: str = "cache") -> tuple[torch.Tensor, list[int]]:
    """The (physical 5-D tensor, stride order) pair the ops take."""
    if not isinstance(cache, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(cache).__name__}")
    if layout is None:
        if cache.dim() == 4:
            return cache.unsqueeze(0), list(_IDENTITY)
        if cache.dim() == 5:
            return cache, list(_IDENTITY)
        raise ValueError(
            f"{name} must be a logical [L, B, H, N, C] or [B, H, N, C] view when layout is None, "
            f"got shape {list(cache.shape)}"
        )
    return cache, _stride_order(layout)


def _index(ids: object, name: str, pairs: bool) -> torch.Tensor:
    """``ids`` as an int64 tensor (lists accepted; device kept)."""
    if isinstance(ids, torch.Tensor):
        if ids.dtype != torch.int64 and not ids.dtype.is_floating_point and ids.dtype != torch.bool:
            ids = ids.to(torch.int64)
        return ids
    t = torch.as_tensor(ids, dtype=torch.int64)
    if pairs and t.numel() == 0:
        t = t.reshape(0, 2)
    return t


def logical_view(cache: torch.Tensor, layout: Layout) -> torch.Tensor:
    """The ``[L, B, H, N, C]`` view (no copy) of a physical cache laid out by ``layout``."""
    phys, order = _resolve(cache, layout)
    _ref.check_stride_order(order, "logical_view")
    return _ref.logical_view(phys, order, "logical_view", "cache")


def empty_cache(
    shape: Sequence[int],
    layout: Layout,
    *,
    dtype: torch.dtype,
    device: torch.device | str | None = None,
    pin_memory: bool = False,
) -> torch.Tensor:
    """A contiguous physical cache of logical ``shape = (L, B, H, N, C)`` in ``layout``."""
    shape = [int(s) for s in shape]
    if len(shape) != 5:
        raise ValueError(f"shape must be the logical (L, B, H, N, C), got {shape}")
    order = _ref.check_stride_order(_stride_order(_IDENTITY if layout is None else layout), "empty_cache")
    return torch.empty([shape[d] for d in order], dtype=dtype, device=device, pin_memory=pin_memory)


def staging_shape(cache: torch.Tensor, layout: Layout, num_blocks: int) -> list[int]:
    """Shape of a staging buffer for ``num_blocks`` blocks: ``[n]`` + the physical dims without B."""
    phys, order = _resolve(cache, layout)
    _ref.check_stride_order(order, "staging_shape")
    if phys.dim() != 5:
        raise ValueError(f"staging_shape: cache must be 5-D, got shape {list(phys.shape)}")
    return [int(num_blocks)] + [phys.shape[p] for p, d in enumerate(order) if d != _ref.DIM_B]


def split_kv(cache: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Views of the K and V halves of a packed ``[K | V]`` cache (halves of the last, ``C``, axis)."""
    size = cache.shape[-1]
    if size % 2:
        raise ValueError(f"split_kv: the content axis has odd size {size}")
    return cache[..., : size // 2], cache[..., size // 2 :]


# ---------------------------------------------------------------------------
# Ops
# ---------------------------------------------------------------------------


def reshape_and_cache(
    key: torch.Tensor,
    value: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    slot_mapping: torch.Tensor | Sequence[int],
    layout: Layout = None,
    *,
    layer: int = 0,
    k_scale: torch.Tensor | float | None = None,
    v_scale: torch.Tensor | float | None = None,
) -> None:
    """Write new tokens' keys and values into the paged cache.

    Token ``t`` goes to slot ``slot_mapping[t] = block_id * N + offset`` of
    layer slot ``layer``; negative slots are skipped.  The cache dtype is the
    keys' dtype (float16, bfloat16, float32), or ``torch.float8_e4m3fn``, in
    which case each value is stored as ``x / scale`` saturated to +-448.

    Args:
        key: ``[num_tokens, H, C]``.
        value: same shape and dtype as ``key``.
        key_cache: physical cache (see the module docstring).
        value_cache: same shape and dtype as ``key_cache``.
        slot_mapping: ``[num_tokens]`` int64 slots.
        layout: the caches' layout, or None for logical views.
        layer: which layer slot (``L`` index) to write.
        k_scale: fp8 per-tensor scale of the keys (1 element); default 1.
        v_scale: fp8 per-tensor scale of the values; default 1.

    Raises:
        ValueError: shapes that do not match, a slot or layer out of range.
        TypeError: unsupported or mismatched dtypes.
    """
    kc, order = _resolve(key_cache, layout, "key_cache")
    vc, _ = _resolve(value_cache, layout, "value_cache")
    slots = _index(slot_mapping, "slot_mapping", pairs=False)
    if k_scale is not None and not isinstance(k_scale, torch.Tensor):
        k_scale = torch.tensor([float(k_scale)], dtype=torch.float32)
    if v_scale is not None and not isinstance(v_scale, torch.Tensor):
        v_scale = torch.tensor([float(v_scale)], dtype=torch.float32)
    args = (key, value, kc, vc, slots, order, int(layer), k_scale, v_scale)
    if _native(key, kc, slots):
        torch.ops.kvcy.reshape_and_cache(*args)
    else:
        _ref.reshape_and_cache(*args)


def convert_layout(
    src: torch.Tensor,
    src_layout: Layout,
    dst_layout: Layout,
    *,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """Physically rearrange a cache from ``src_layout`` to ``dst_layout``.

    Args:
        src: the physical cache in ``src_layout``.
        src_layout: its layout (None: ``src`` is a logical view).
        dst_layout: the layout wanted (None: logical order, i.e. ``LBHNC``).
        out: where to write (physical, in ``dst_layout``); a new contiguous
            tensor on ``src``'s device when None.

    Returns:
        ``out``: the same logical cache laid out by ``dst_layout``.
    """
    phys, src_order = _resolve(src, src_layout, "src")
    dst_order = list(_IDENTITY) if dst_layout is None else _stride_order(dst_layout)
    if out is None:
        _ref.check_stride_order(src_order, "convert_layout", "src_stride_order")
        _ref.check_stride_order(dst_order, "convert_layout", "dst_stride_order")
        logical = _ref.logical_view(phys, src_order, "convert_layout", "src")
        out = torch.empty([logical.shape[d] for d in dst_order], dtype=src.dtype, device=src.device)
    if _native(phys, out):
        torch.ops.kvcy.convert_layout(phys, out, src_order, dst_order)
    else:
        _ref.convert_layout(phys, out, src_order, dst_order)
    return out


def copy_blocks(
    caches: torch.Tensor | Sequence[torch.Tensor],
    block_mapping: torch.Tensor | Sequence[Sequence[int]],
    layout: Layout = None,
) -> None:
    """Copy blocks within each cache: block ``src`` to block ``dst`` for each ``(src, dst)`` row.

    Args:
        caches: one physical cache, or several of one layout (e.g. key and
            value caches); each is updated in place.
        block_mapping: ``[n, 2]`` int64 (src, dst) block ids.  Destinations
            must be distinct and must not also be sources.
        layout: the caches' layout, or None for logical views.
    """
    mapping = _index(block_mapping, "block_mapping", pairs=True)
    for cache in [caches] if isinstance(caches, torch.Tensor) else list(caches):
        phys, order = _resolve(cache, layout)
        if _native(phys, mapping):
            torch.ops.kvcy.copy_blocks(phys, mapping, order)
        else:
            _ref.copy_blocks(phys, mapping, order)


def swap_blocks(
    src: torch.Tensor,
    dst: torch.Tensor,
    block_mapping: torch.Tensor | Sequence[Sequence[int]],
    layout: Layout = None,
) -> None:
    """Copy block ``s`` of ``src`` to block ``d`` of ``dst`` for each ``(s, d)`` row.

    ``src`` and ``dst`` share a layout and every logical dim but ``B``; they may
    sit on one device or on a CUDA device and the CPU.  GPU <-> pinned CPU
    copies run on the current stream without synchronising the host;
    pageable CPU memory is staged (and synchronises).

    Args:
        src: physical source cache.
        dst: physical destination cache, updated in place.
        block_mapping: ``[n, 2]`` int64 (src, dst) ids; destinations distinct.
        layout: the caches' layout, or None for logical views.
    """
    s, order = _resolve(src, layout, "src")
    d, _ = _resolve(dst, layout, "dst")
    mapping = _index(block_mapping, "block_mapping", pairs=True)
    if _native(s, d, mapping):
        torch.ops.kvcy.swap_blocks(s, d, mapping, order)
    else:
        _ref.swap_blocks(s, d, mapping, order)


def gather_blocks(
    cache: torch.Tensor,
    block_ids: torch.Tensor | Sequence[int],
    layout: Layout = None,
    *,
    out: torch.Tensor | None = None,
    device: torch.device | str | None = None,
    pin_memory: bool = False,
) -> torch.Tensor:
    """Pack blocks ``block_ids`` of ``cache`` into one contiguous staging buffer.

    The buffer is ``[n]`` + the cache's physical dims without ``B``
    (:func:`staging_shape`): block ``block_ids[i]``'s bytes, in the cache's
    physical order, at ``out[i]``.  Only a cache of the same layout and dims
    can take it back (:func:`scatter_blocks`).

    Args:
        cache: physical cache.
        block_ids: ``[n]`` int64 block ids (repeats allowed).
        layout: the cache's layout, or None for a logical view.
        out: staging buffer to fill; allocated when None.
        device: where to allocate ``out`` (default: the cache's device).
        pin_memory: allocate ``out`` in pinned CPU memory.

    Returns:
        The staging buffer.
    """
    phys, order = _resolve(cache, layout)
    ids = _index(block_ids, "block_ids", pairs=False)
    if out is None:
        dev = torch.device("cpu") if pin_memory and device is None else (device or phys.device)
        out = torch.empty(
            staging_shape(phys, order, ids.numel()), dtype=phys.dtype, device=dev, pin_memory=pin_memory
        )
    if _native(phys, out, ids):
        torch.ops.kvcy.gather_blocks(phys, ids, out, order)
    else:
        _ref.gather_blocks(phys, ids, out, order)
    return out


def scatter_blocks(
    staging: torch.Tensor,
    cache: torch.Tensor,
    block_ids: torch.Tensor | Sequence[int],
    layout: Layout = None,
) -> None:
    """Unpack a staging buffer (from :func:`gather_blocks`) into blocks ``block_ids``.

    Args:
        staging: ``[n]`` + the cache's physical dims without ``B``.
        cache: physical cache, updated in place.
        block_ids: ``[n]`` distinct int64 block ids.
        layout: the cache's layout, or None for a logical view.
    """
    phys, order = _resolve(cache, layout)
    ids = _index(block_ids, "block_ids", pairs=False)
    if _native(phys, staging, ids):
        torch.ops.kvcy.scatter_blocks(staging, phys, ids, order)
    else:
        _ref.scatter_blocks(staging, phys, ids, order)


# ---------------------------------------------------------------------------
# Fake (meta) kernels: shapes and dtypes only, so torch.compile can trace.
# ---------------------------------------------------------------------------

if HAS_EXTENSION:

    @torch.library.register_fake("kvcy::reshape_and_cache")
    def _reshape_and_cache_fake(key, value, key_cache, value_cache, slot_mapping, stride_order, layer=0,
                                k_scale=None, v_scale=None):
        _ref.check_reshape_and_cache(key, value, key_cache, value_cache, slot_mapping, stride_order, layer,
                                     k_scale, v_scale)

    @torch.library.register_fake("kvcy::convert_layout")
    def _convert_layout_fake(src, dst, src_stride_order, dst_stride_order):
        _ref.check_convert_layout(src, dst, src_stride_order, dst_stride_order)

    @torch.library.register_fake("kvcy::copy_blocks")
    def _copy_blocks_fake(cache, block_mapping, stride_order):
        _ref.check_copy_blocks(cache, block_mapping, stride_order)

    @torch.library.register_fake("kvcy::swap_blocks")
    def _swap_blocks_fake(src, dst, block_mapping, stride_order):
        _ref.check_swap_blocks(src, dst, block_mapping, stride_order)

    @torch.library.register_fake("kvcy::gather_blocks")
    def _gather_blocks_fake(cache, block_ids, staging, stride_order):
        _ref.check_staging_args(cache, block_ids, staging, stride_order, "gather_blocks")

    @torch.library.register_fake("kvcy::scatter_blocks")
    def _scatter_blocks_fake(staging, cache, block_ids, stride_order):
        _ref.check_staging_args(cache, block_ids, staging, stride_order, "scatter_blocks")


# ---------------------------------------------------------------------------
# Slot mapping: the worker's block table -> one cache slot per scheduled token
# ---------------------------------------------------------------------------

import operator  # noqa: E402

#: The slot of a token whose K/V is not written (vLLM's ``PAD_SLOT_ID``).
PAD_SLOT_ID = _ref.PAD_SLOT_ID

__all__ += ["PAD_SLOT_ID", "compute_slot_mapping"]


def _has_op_kernel(name: str, key: str) -> bool:
    try:
        return bool(torch._C._dispatch_has_kernel_for_dispatch_key(f"kvcy::{name}", key))
    except RuntimeError:  # an older kvcy._C without the op
        return False


#: Whether kvcy._C has the slot-mapping op (CPU kernel; CUDA kernel too when built with CUDA).
HAS_SLOT_MAPPING_KERNEL = HAS_EXTENSION and _has_op_kernel("compute_slot_mapping", "CPU")
_SLOT_MAPPING_CUDA = HAS_SLOT_MAPPING_KERNEL and _has_op_kernel("compute_slot_mapping", "CUDA")


def _slot_mapping_native(*tensors: torch.Tensor) -> bool:
    if not HAS_SLOT_MAPPING_KERNEL:
        return False
    for t in tensors:
        kind = t.device.type
        if not (kind in ("cpu", "meta") or (kind == "cuda" and _SLOT_MAPPING_CUDA)):
            return False
    return True


def compute_slot_mapping(
    query_start_loc: torch.Tensor,
    positions: torch.Tensor,
    block_table: torch.Tensor,
    slot_mapping: torch.Tensor,
    num_reqs: int,
    block_size: int,
    *,
    cp_world_size: int = 1,
    cp_rank: int = 0,
    cp_kv_cache_interleave_size: int = 1,
) -> None:
    """Fill ``slot_mapping`` with the cache slot of every scheduled token.

    Request ``r`` is row ``r`` of ``block_table`` and owns tokens
    ``query_start_loc[r] <= t < query_start_loc[r + 1]``; token ``t`` is at
    position ``positions[t]`` of its request and goes to slot
    ``block_table[r, p // block_size] * block_size + p % block_size``.  With
    decode context parallelism (``cp_world_size`` ranks), each block-table
    entry covers ``cp_world_size * block_size`` positions dealt out to the
    ranks in runs of ``cp_kv_cache_interleave_size``; positions this rank
    (``cp_rank``) does not store get :data:`PAD_SLOT_ID`.  So do the entries
    of ``slot_mapping`` past ``positions.numel()`` (padding for a captured
    graph); tokens outside every request's range are left as they are.

    Args:
        query_start_loc: ``[>= num_reqs + 1]`` int32 or int64 token offsets.
        positions: ``[num_tokens]`` int64 positions.
        block_table: ``[rows, columns]`` int32 block ids.
        slot_mapping: ``[>= num_tokens]`` int64 output, same device.
        num_reqs: requests (rows) in the batch.
        block_size: tokens per cache block.
        cp_world_size: decode context-parallel world size.
        cp_rank: this rank in it.
        cp_kv_cache_interleave_size: positions a rank stores in a row.

    Raises:
        ValueError: shapes, devices or values out of range (a position past
            its row's blocks, ``query_start_loc`` decreasing...); nothing is
            written.  On CUDA the value checks read the offsets and positions
            back to the host, which synchronises.
        TypeError: wrong dtypes.
    """
    for t, name in ((query_start_loc, "query_start_loc"), (positions, "positions"),
                    (block_table, "block_table"), (slot_mapping, "slot_mapping")):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"compute_slot_mapping: {name} must be a torch.Tensor, got {type(t).__name__}")
    ints = []
    for value, name in ((num_reqs, "num_reqs"), (block_size, "block_size"), (cp_world_size, "cp_world_size"),
                        (cp_rank, "cp_rank"), (cp_kv_cache_interleave_size, "cp_kv_cache_interleave_size")):
        try:
            ints.append(operator.index(value))
        except TypeError:
            raise TypeError(f"compute_slot_mapping: {name} must be an int, got {type(value).__name__}") from None
    args = (query_start_loc, positions, block_table, slot_mapping, *ints)
    if _slot_mapping_native(query_start_loc, positions, block_table, slot_mapping):
        torch.ops.kvcy.compute_slot_mapping(*args)
    else:
        _ref.compute_slot_mapping(*args)


if HAS_SLOT_MAPPING_KERNEL:

    @torch.library.register_fake("kvcy::compute_slot_mapping")
    def _compute_slot_mapping_fake(query_start_loc, positions, block_table, slot_mapping, num_reqs, block_size,
                                   cp_world_size=1, cp_rank=0, cp_kv_cache_interleave_size=1):
        _ref.check_compute_slot_mapping(query_start_loc, positions, block_table, slot_mapping, num_reqs, block_size,
                                        cp_world_size, cp_rank, cp_kv_cache_interleave_size)
