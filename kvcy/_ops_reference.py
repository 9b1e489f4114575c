"""Plain-torch reference of the ``torch.ops.kvcy`` ops.

Two jobs: the fallback :mod:`kvcy.ops` uses when the ``kvcy._C`` extension is
absent (or has no kernels for a tensor's device), and the oracle the tests
hold the C++/CUDA kernels to.  Each function has the op's schema signature
(caches are physical 5-D tensors plus their ``stride_order``), runs the same
checks in the same order and raises the same exception with the same message
as ``cuda_ext/kvcy_ops.cpp``; the data movement is ``index_select`` /
``index_copy_`` / ``copy_`` on logical views.

Nothing here is fast, and nothing needs to be: it is written to be obviously
right.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

__all__ = [
    "FP8_MAX",
    "convert_layout",
    "copy_blocks",
    "gather_blocks",
    "logical_view",
    "reshape_and_cache",
    "scatter_blocks",
    "staging_view",
    "swap_blocks",
    "to_fp8",
]

DIM_L, DIM_B, DIM_H, DIM_N, DIM_C = 0, 1, 2, 3, 4

#: Largest finite float8 e4m3 (fn) value; fp8 writes saturate to +-FP8_MAX.
FP8_MAX = 448.0

_KEY_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


# ---------------------------------------------------------------------------
# Checks (same order and messages as the C++ side)
# ---------------------------------------------------------------------------


def check_stride_order(order: Sequence[int], op: str, name: str = "stride_order") -> list[int]:
    order = list(order)
    if sorted(order) != [0, 1, 2, 3, 4]:
        raise ValueError(f"{op}: {name} must be a permutation of (0, 1, 2, 3, 4), got {order}")
    return order


def logical_view(physical: torch.Tensor, order: Sequence[int], op: str, name: str) -> torch.Tensor:
    """The ``[L, B, H, N, C]`` view of a 5-D tensor laid out in ``order``."""
    if physical.dim() != 5:
        raise ValueError(
            f"{op}: {name} must be a 5-D tensor in the layout's physical order, got shape {list(physical.shape)}"
        )
    order = list(order)
    return physical.permute([order.index(d) for d in range(5)])


def staging_view(staging: torch.Tensor, order: Sequence[int], op: str, name: str) -> torch.Tensor:
    """The ``[L, n, H, N, C]`` view of a ``[n] + physical-dims-without-B`` staging buffer."""
    if staging.dim() != 5:
        raise ValueError(
            f"{op}: {name} must be a 5-D tensor [n] + the cache's physical dims without B, "
            f"got shape {list(staging.shape)}"
        )
    sorder = [DIM_B] + [d for d in order if d != DIM_B]
    return staging.permute([sorder.index(d) for d in range(5)])


def _check_same_dtype(a: torch.Tensor, b: torch.Tensor, op: str, an: str, bn: str) -> None:
    if a.dtype != b.dtype:
        raise TypeError(f"{op}: {an} and {bn} must have the same dtype, got {a.dtype} and {b.dtype}")


def _check_index_tensor(t: torch.Tensor, dim: int, op: str, name: str) -> None:
    if t.dtype != torch.int64:
        raise TypeError(f"{op}: {name} must be an int64 tensor, got {t.dtype}")
    if dim == 2:
        if t.dim() != 2 or t.shape[1] != 2:
            raise ValueError(f"{op}: {name} must have shape [n, 2], got shape {list(t.shape)}")
    elif t.dim() != dim:
        raise ValueError(f"{op}: {name} must be {dim}-D, got shape {list(t.shape)}")


def _check_same_logical_shape(
    a: torch.Tensor, b: torch.Tensor, except_b: bool, op: str, an: str, bn: str
) -> None:
    sa, sb = list(a.shape), list(b.shape)
    if except_b:
        if [s for d, s in enumerate(sa) if d != DIM_B] != [s for d, s in enumerate(sb) if d != DIM_B]:
            raise ValueError(f"{op}: {an} and {bn} must have the same logical L, H, N, C, got {sa} and {sb}")
    elif sa != sb:
        raise ValueError(f"{op}: {an} and {bn} must have the same logical shape [L, B, H, N, C], got {sa} and {sb}")


def _first_true(mask: torch.Tensor) -> int:
    return int(mask.reshape(-1).nonzero()[0, 0])


def _first_repeat(values: list[int]) -> int:
    seen: set[int] = set()
    for v in values:
        if v in seen:
            return v
        seen.add(v)
    raise AssertionError("no repeated value")


def _check_block_ids(ids: torch.Tensor, num_blocks: int, unique: bool, op: str, name: str) -> None:
    if ids.numel() == 0:
        return
    bad = (ids < 0) | (ids >= num_blocks)
    if bool(bad.any()):
        i = _first_true(bad)
        raise ValueError(f"{op}: {name}[{i}] = {int(ids[i])} is out of range for a cache of {num_blocks} blocks")
    if unique and torch.unique(ids).numel() != ids.numel():
        raise ValueError(f"{op}: block {_first_repeat(ids.tolist())} appears more than once in {name}")


def _check_block_mapping(
    mapping: torch.Tensor, src_blocks: int, dst_blocks: int, same_cache: bool, op: str
) -> None:
    n = mapping.shape[0]
    if n == 0:
        return
    limits = torch.tensor([src_blocks, dst_blocks], dtype=torch.int64, device=mapping.device)
    bad = (mapping < 0) | (mapping >= limits)
    if bool(bad.any()):
        i, j = divmod(_first_true(bad), 2)
        raise ValueError(
            f"{op}: block_mapping[{i}, {j}] = {int(mapping[i, j])} is out of range for a cache of "
            f"{src_blocks if j == 0 else dst_blocks} blocks"
        )
    dst = mapping[:, 1]
    if torch.unique(dst).numel() != n:
        raise ValueError(f"{op}: destination block {_first_repeat(dst.tolist())} appears more than once in block_mapping")
    if same_cache:
        hit = torch.isin(dst, mapping[:, 0])
        if bool(hit.any()):
            d = int(dst[_first_true(hit)])
            raise ValueError(f"{op}: block {d} is both a source and a destination in block_mapping")


def _check_slots(slots: torch.Tensor, num_blocks: int, block_size: int, op: str) -> None:
    if slots.numel() == 0:
        return
    bad = slots >= num_blocks * block_size
    if bool(bad.any()):
        i = _first_true(bad)
        raise ValueError(
            f"{op}: slot_mapping[{i}] = {int(slots[i])} is out of range for a cache of "
            f"{num_blocks} blocks x {block_size} tokens per block"
        )


def check_reshape_and_cache(
    key: torch.Tensor,
    value: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    stride_order: Sequence[int],
    layer: int,
    k_scale: torch.Tensor | None,
    v_scale: torch.Tensor | None,
) -> tuple[torch.Tensor, torch.Tensor, bool]:
    """Metadata checks of :func:`reshape_and_cache`; returns the logical cache views and fp8-ness."""
    op = "reshape_and_cache"
    order = check_stride_order(stride_order, op)
    if key.dim() != 3:
        raise ValueError(f"{op}: key must be 3-D [num_tokens, num_heads, head_size], got shape {list(key.shape)}")
    if value.shape != key.shape:
        raise ValueError(f"{op}: value must have the shape of key {list(key.shape)}, got {list(value.shape)}")
    _check_same_dtype(key, value, op, "key", "value")
    if key.dtype not in _KEY_DTYPES:
        raise TypeError(f"{op}: key must be float16, bfloat16 or float32, got {key.dtype}")
    kl = logical_view(key_cache, order, op, "key_cache")
    vl = logical_view(value_cache, order, op, "value_cache")
    _check_same_logical_shape(kl, vl, False, op, "key_cache", "value_cache")
    _check_same_dtype(key_cache, value_cache, op, "key_cache", "value_cache")
    if key_cache.dtype not in (key.dtype, torch.float8_e4m3fn):
        raise TypeError(
            f"{op}: key_cache must have the dtype of key ({key.dtype}) or torch.float8_e4m3fn, got {key_cache.dtype}"
        )
    fp8 = key_cache.dtype == torch.float8_e4m3fn
    _, heads, size = key.shape
    if kl.shape[DIM_H] != heads or kl.shape[DIM_C] != size:
        raise ValueError(
            f"{op}: key has {heads} heads of size {size} but the cache holds "
            f"{kl.shape[DIM_H]} heads of size {kl.shape[DIM_C]}"
        )
    if not 0 <= layer < kl.shape[DIM_L]:
        raise ValueError(f"{op}: layer {layer} is out of range for a cache of {kl.shape[DIM_L]} layer slots")
    _check_index_tensor(slot_mapping, 1, op, "slot_mapping")
    if slot_mapping.numel() != key.shape[0]:
        raise ValueError(
            f"{op}: slot_mapping must have one entry per token ({key.shape[0]}), got shape {list(slot_mapping.shape)}"
        )
    for name, scale in (("k_scale", k_scale), ("v_scale", v_scale)):
        if scale is None:
            continue
        if not scale.dtype.is_floating_point:
            raise TypeError(f"{op}: {name} must be a floating-point tensor, got {scale.dtype}")
        if scale.numel() != 1:
            raise ValueError(f"{op}: {name} must hold one value, got shape {list(scale.shape)}")
    return kl, vl, fp8


def check_staging_args(
    cache: torch.Tensor, block_ids: torch.Tensor, staging: torch.Tensor, stride_order: Sequence[int], op: str
) -> tuple[torch.Tensor, torch.Tensor]:
    """Metadata checks of gather/scatter; returns the (cache, staging) logical views."""
    order = check_stride_order(stride_order, op)
    cl = logical_view(cache, order, op, "cache")
    sl = staging_view(staging, order, op, "staging")
    _check_same_logical_shape(cl, sl, True, op, "cache", "staging")
    _check_same_dtype(cache, staging, op, "cache", "staging")
    _check_index_tensor(block_ids, 1, op, "block_ids")
    if sl.shape[DIM_B] != block_ids.numel():
        raise ValueError(
            f"{op}: staging has room for {sl.shape[DIM_B]} blocks but block_ids lists {block_ids.numel()}"
        )
    return cl, sl


def check_convert_layout(
    src: torch.Tensor, dst: torch.Tensor, src_stride_order: Sequence[int], dst_stride_order: Sequence[int]
) -> tuple[torch.Tensor, torch.Tensor]:
    op = "convert_layout"
    so = check_stride_order(src_stride_order, op, "src_stride_order")
    do = check_stride_order(dst_stride_order, op, "dst_stride_order")
    ls = logical_view(src, so, op, "src")
    ld = logical_view(dst, do, op, "dst")
    _check_same_logical_shape(ls, ld, False, op, "src", "dst")
    _check_same_dtype(src, dst, op, "src", "dst")
    return ls, ld


def check_copy_blocks(cache: torch.Tensor, block_mapping: torch.Tensor, stride_order: Sequence[int]) -> torch.Tensor:
    op = "copy_blocks"
    order = check_stride_order(stride_order, op)
    cl = logical_view(cache, order, op, "cache")
    _check_index_tensor(block_mapping, 2, op, "block_mapping")
    return cl


def check_swap_blocks(
    src: torch.Tensor, dst: torch.Tensor, block_mapping: torch.Tensor, stride_order: Sequence[int]
) -> tuple[torch.Tensor, torch.Tensor]:
    op = "swap_blocks"
    order = check_stride_order(stride_order, op)
    ls = logical_view(src, order, op, "src")
    ld = logical_view(dst, order, op, "dst")
    _check_same_logical_shape(ls, ld, True, op, "src", "dst")
    _check_same_dtype(src, dst, op, "src", "dst")
    _check_index_tensor(block_mapping, 2, op, "block_mapping")
    return ls, ld


# ---------------------------------------------------------------------------
# Ops
# ---------------------------------------------------------------------------


def to_fp8(x: torch.Tensor, scale: torch.Tensor | None) -> torch.Tensor:
    """``x / scale`` in float32, saturated to +-448, rounded to float8 e4m3 (nearest even)."""
    x = x.to(torch.float32)
    if scale is not None:
        x = x / scale.to(device=x.device, dtype=torch.float32).reshape(())
    return x.clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)


def reshape_and_cache(
    key: torch.Tensor,
    value: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    stride_order: Sequence[int],
    layer: int = 0,
    k_scale: torch.Tensor | None = None,
    v_scale: torch.Tensor | None = None,
) -> None:
    """Write token ``t``'s key/value ``[H, C]`` to slot ``slot_mapping[t]`` of layer slot ``layer``.

    A slot is ``block_id * N + offset``; negative slots are skipped.  With an
    fp8 cache each value is written as :func:`to_fp8` ``(x, scale)``.
    """
    kl, vl, fp8 = check_reshape_and_cache(
        key, value, key_cache, value_cache, slot_mapping, stride_order, layer, k_scale, v_scale
    )
    num_blocks, block_size = kl.shape[DIM_B], kl.shape[DIM_N]
    _check_slots(slot_mapping, num_blocks, block_size, "reshape_and_cache")
    valid = slot_mapping >= 0
    slots = slot_mapping[valid].to(kl.device)
    blocks, offsets = slots // block_size, slots % block_size
    for src, cache, scale in ((key, kl, k_scale), (value, vl, v_scale)):
        rows = src[valid.to(src.device)].to(cache.device)
        if fp8:
            rows = to_fp8(rows, scale)
        cache[layer][blocks, :, offsets, :] = rows


def convert_layout(
    src: torch.Tensor, dst: torch.Tensor, src_stride_order: Sequence[int], dst_stride_order: Sequence[int]
) -> None:
    """Copy ``src`` (laid out by ``src_stride_order``) into ``dst`` (laid out by ``dst_stride_order``)."""
    ls, ld = check_convert_layout(src, dst, src_stride_order, dst_stride_order)
    ld.copy_(ls)


def copy_blocks(cache: torch.Tensor, block_mapping: torch.Tensor, stride_order: Sequence[int]) -> None:
    """Copy block ``src`` to block ``dst`` for each ``(src, dst)`` row of ``block_mapping``.

    Destinations must be distinct and must not be sources.
    """
    cl = check_copy_blocks(cache, block_mapping, stride_order)
    num_blocks = cl.shape[DIM_B]
    _check_block_mapping(block_mapping, num_blocks, num_blocks, True, "copy_blocks")
    if block_mapping.shape[0] == 0:
        return
    m = block_mapping.to(cache.device)
    cl = _bytes(cl)
    cl.index_copy_(DIM_B, m[:, 1], cl.index_select(DIM_B, m[:, 0]))


def _bytes(t: torch.Tensor) -> torch.Tensor:
    """One-byte dtypes (fp8) as uint8, so index_select / index_copy_ accept them; bits unchanged."""
    return t.view(torch.uint8) if t.element_size() == 1 and t.dtype != torch.uint8 else t


def _same_storage(a: torch.Tensor, b: torch.Tensor) -> bool:
    return bool(torch._C._is_alias_of(a, b))


def swap_blocks(
    src: torch.Tensor, dst: torch.Tensor, block_mapping: torch.Tensor, stride_order: Sequence[int]
) -> None:
    """Copy block ``s`` of ``src`` to block ``d`` of ``dst`` for each row ``(s, d)``; any devices.

    Destinations must be distinct (and must not be sources when ``src`` and
    ``dst`` share storage).
    """
    ls, ld = check_swap_blocks(src, dst, block_mapping, stride_order)
    _check_block_mapping(block_mapping, ls.shape[DIM_B], ld.shape[DIM_B], _same_storage(src, dst), "swap_blocks")
    if block_mapping.shape[0] == 0:
        return
    ls, ld = _bytes(ls), _bytes(ld)
    rows = ls.index_select(DIM_B, block_mapping[:, 0].to(src.device))
    ld.index_copy_(DIM_B, block_mapping[:, 1].to(dst.device), rows.to(dst.device))


def gather_blocks(
    cache: torch.Tensor, block_ids: torch.Tensor, staging: torch.Tensor, stride_order: Sequence[int]
) -> None:
    """Pack blocks ``block_ids`` of ``cache`` into ``staging`` (``[n]`` + physical dims without B)."""
    cl, sl = check_staging_args(cache, block_ids, staging, stride_order, "gather_blocks")
    _check_block_ids(block_ids, cl.shape[DIM_B], False, "gather_blocks", "block_ids")
    if block_ids.numel() == 0:
        return
    _bytes(sl).copy_(_bytes(cl).index_select(DIM_B, block_ids.to(cache.device)))


def scatter_blocks(
    staging: torch.Tensor, cache: torch.Tensor, block_ids: torch.Tensor, stride_order: Sequence[int]
) -> None:
    """Unpack ``staging`` into blocks ``block_ids`` of ``cache`` (ids must be distinct)."""
    cl, sl = check_staging_args(cache, block_ids, staging, stride_order, "scatter_blocks")
    _check_block_ids(block_ids, cl.shape[DIM_B], True, "scatter_blocks", "block_ids")
    if block_ids.numel() == 0:
        return
    _bytes(cl).index_copy_(DIM_B, block_ids.to(cache.device), _bytes(sl).to(cache.device))


# ---------------------------------------------------------------------------
# Slot mapping (the worker's block table -> one cache slot per scheduled token)
# ---------------------------------------------------------------------------

#: The slot of a token whose K/V is not written here (vLLM's ``PAD_SLOT_ID``):
#: padding past the scheduled tokens, and tokens another context-parallel
#: rank stores.  ``reshape_and_cache`` skips negative slots.
PAD_SLOT_ID = -1

__all__ += ["PAD_SLOT_ID", "check_compute_slot_mapping", "compute_slot_mapping"]


def check_compute_slot_mapping(
    query_start_loc: torch.Tensor,
    positions: torch.Tensor,
    block_table: torch.Tensor,
    slot_mapping: torch.Tensor,
    num_reqs: int,
    block_size: int,
    cp_world_size: int,
    cp_rank: int,
    cp_kv_cache_interleave_size: int,
) -> None:
    """The op's checks of arguments, shapes, dtypes and devices (never of tensor values)."""
    op = "compute_slot_mapping"
    if block_size < 1:
        raise ValueError(f"{op}: block_size must be positive, got {block_size}")
    if cp_world_size < 1:
        raise ValueError(f"{op}: cp_world_size must be positive, got {cp_world_size}")
    if not 0 <= cp_rank < cp_world_size:
        raise ValueError(f"{op}: cp_rank {cp_rank} is out of range for a context-parallel world of {cp_world_size}")
    if cp_kv_cache_interleave_size < 1:
        raise ValueError(f"{op}: cp_kv_cache_interleave_size must be positive, got {cp_kv_cache_interleave_size}")
    if query_start_loc.dtype not in (torch.int32, torch.int64):
        raise TypeError(f"{op}: query_start_loc must be an int32 or int64 tensor, got {query_start_loc.dtype}")
    for t, name, dtype in ((positions, "positions", torch.int64), (block_table, "block_table", torch.int32),
                           (slot_mapping, "slot_mapping", torch.int64)):
        if t.dtype != dtype:
            raise TypeError(f"{op}: {name} must be an {str(dtype)[6:]} tensor, got {t.dtype}")
    for t, name, dim in ((query_start_loc, "query_start_loc", 1), (positions, "positions", 1),
                         (block_table, "block_table", 2), (slot_mapping, "slot_mapping", 1)):
        if t.dim() != dim:
            raise ValueError(f"{op}: {name} must be {dim}-D, got shape {list(t.shape)}")
    for t, name in ((query_start_loc, "query_start_loc"), (positions, "positions"), (block_table, "block_table")):
        if t.device != slot_mapping.device:
            raise ValueError(f"{op}: {name} is on {t.device} but slot_mapping is on {slot_mapping.device}")
    if not 0 <= num_reqs <= block_table.shape[0]:
        raise ValueError(f"{op}: num_reqs {num_reqs} is out of range for a block table of {block_table.shape[0]} rows")
    if num_reqs > 0 and query_start_loc.numel() < num_reqs + 1:
        raise ValueError(
            f"{op}: query_start_loc has {query_start_loc.numel()} entries; num_reqs {num_reqs} needs {num_reqs + 1}"
        )
    if positions.numel() > slot_mapping.numel():
        raise ValueError(f"{op}: {positions.numel()} positions do not fit in a slot_mapping of {slot_mapping.numel()}")


def _check_slot_mapping_values(
    qsl: torch.Tensor, positions: torch.Tensor, num_tokens: int, width: int, virtual_block_size: int
) -> tuple[int, int]:
    """Value checks (host tensors); returns the covered token range ``[first, last)``."""
    op = "compute_slot_mapping"
    n = qsl.numel() - 1
    if n < 0:
        return 0, 0
    if int(qsl[0]) < 0:
        raise ValueError(f"{op}: query_start_loc[0] = {int(qsl[0])} is negative")
    if n > 0:
        down = qsl[1:] < qsl[:-1]
        if bool(down.any()):
            r = _first_true(down)
            raise ValueError(
                f"{op}: query_start_loc[{r + 1}] = {int(qsl[r + 1])} is less than query_start_loc[{r}] = {int(qsl[r])}"
            )
    first, last = int(qsl[0]), int(qsl[n])
    if last > num_tokens:
        raise ValueError(f"{op}: query_start_loc[{n}] = {last} is beyond the {num_tokens} positions")
    pos = positions[first:last]
    bad = (pos < 0) | (pos >= width * virtual_block_size)
    if bool(bad.any()):
        t = _first_true(bad)
        raise ValueError(
            f"{op}: positions[{first + t}] = {int(pos[t])} is out of range for a block table row of "
            f"{width} blocks x {virtual_block_size} tokens"
        )
    return first, last


def compute_slot_mapping(
    query_start_loc: torch.Tensor,
    positions: torch.Tensor,
    block_table: torch.Tensor,
    slot_mapping: torch.Tensor,
    num_reqs: int,
    block_size: int,
    cp_world_size: int = 1,
    cp_rank: int = 0,
    cp_kv_cache_interleave_size: int = 1,
) -> None:
    """Fill ``slot_mapping`` with each scheduled token's cache slot.

    Request ``r`` (row ``r`` of ``block_table``) owns tokens
    ``query_start_loc[r] <= t < query_start_loc[r + 1]``; token ``t`` sits at
    position ``p = positions[t]`` of its request.  Without context
    parallelism its slot is ``block_table[r, p // block_size] * block_size +
    p % block_size``.  With a context-parallel world of ``W`` ranks, a row's
    blocks are virtual blocks of ``W * block_size`` positions dealt out to the
    ranks in runs of ``cp_kv_cache_interleave_size``: a position another rank
    stores gets :data:`PAD_SLOT_ID`, one this rank stores gets its offset
    within the rank's share of the block.  Entries from ``positions.numel()``
    to the end of ``slot_mapping`` become :data:`PAD_SLOT_ID`; tokens outside
    every request's range are left as they are.
    """
    check_compute_slot_mapping(query_start_loc, positions, block_table, slot_mapping, num_reqs, block_size,
                               cp_world_size, cp_rank, cp_kv_cache_interleave_size)
    num_tokens = positions.numel()
    vbs = block_size * cp_world_size
    qsl = query_start_loc[: num_reqs + 1].to("cpu", torch.int64) if num_reqs > 0 else query_start_loc[:0].cpu()
    first, last = _check_slot_mapping_values(qsl, positions.cpu(), num_tokens, block_table.shape[1], vbs)
    slot_mapping[num_tokens:] = PAD_SLOT_ID
    if last == first:
        return
    dev = slot_mapping.device
    rows = torch.repeat_interleave(torch.arange(num_reqs), qsl[1:] - qsl[:-1]).to(dev)
    pos = positions[first:last]
    vblock, voffset = pos // vbs, pos % vbs
    interleave = cp_kv_cache_interleave_size
    local = (voffset // interleave) % cp_world_size == cp_rank
    offset = (voffset // (cp_world_size * interleave)) * interleave + voffset % interleave
    blocks = block_table[rows, vblock].to(torch.int64)
    slot_mapping[first:last] = torch.where(local, blocks * block_size + offset, PAD_SLOT_ID)
