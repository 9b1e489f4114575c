"""Logical shapes and torch views of one layer's cache: :func:`compute_layer_kv_cache_shape_bytes`
and :func:`reshape_kv_cache`."""

from __future__ import annotations

from typing import TYPE_CHECKING

from kvcy.kv_cache_interface._checks import _check_int
from kvcy.kv_cache_interface.attention import AttentionSpec
from kvcy.kv_cache_interface.base import KVCacheSpec, num_states_for
from kvcy.kv_cache_interface.layout import DIM_C, KVCacheLayout

if TYPE_CHECKING:  # pragma: no cover
    import torch


def compute_layer_kv_cache_shape_bytes(
    spec: KVCacheSpec,
    num_blocks: int,
    block_size: int | None = None,
) -> tuple[int, int, int, int]:
    """The logical 4D shape ``(B, H, N, C)`` of one layer, ``C`` in bytes.

    Args:
        spec: the layer's spec.
        num_blocks: number of KV-cache blocks (pages).
        block_size: a kernel block size dividing ``spec.block_size``; each
            page is then split into ``spec.block_size // block_size`` kernel
            blocks.  Defaults to the spec's block size.

    Raises:
        ValueError: non-positive sizes or a block size that does not divide
            the spec's.
    """
    _check_int("compute_layer_kv_cache_shape_bytes", "num_blocks", num_blocks, minimum=0)
    bs = spec.block_size if block_size is None else block_size
    _check_int("compute_layer_kv_cache_shape_bytes", "block_size", bs)
    if spec.block_size % bs:
        raise ValueError(f"kernel block size {bs} must divide the KV cache block size {spec.block_size}")
    per_page = spec.block_size // bs
    return (
        num_blocks * per_page,
        spec.num_heads,
        num_states_for(bs, spec.tokens_per_state),
        spec.state_content_size_bytes,
    )


def _layout_byte_strides(
    shape5: tuple[int, ...], layout: KVCacheLayout, cell_bytes: int, total_bytes: int
) -> list[int]:
    """Byte strides, in logical ``[L, B, H, N, C]`` order, of a cache laid out by ``layout``.

    ``cell_bytes`` is the memory of one (layer slot, block) cell, at least
    ``H * N * C``; the difference is padding (page padding or per-token scales).
    Where a cell is one contiguous run (``L`` and ``B`` outermost, in either
    order) the padding sits at the end of each cell, so a block's stride is
    the page size; otherwise it sits at the end of each slice of the outermost
    axis.  Either way the whole cache spans ``total_bytes``.
    """
    order = layout.stride_order
    strides = [0] * 5
    acc = 1
    for depth, dim in enumerate(reversed(order)):
        strides[dim] = acc
        acc *= shape5[dim]
        if depth == 2 and layout.is_block_compact:
            acc = cell_bytes
    if not layout.is_block_compact:
        outer = order[0]
        if shape5[outer]:
            strides[outer] = total_bytes // shape5[outer]
    return strides


def reshape_kv_cache(
    raw: torch.Tensor,
    spec: KVCacheSpec,
    num_blocks: int,
    num_layer_slots: int,
    layout: KVCacheLayout,
    block_size: int | None = None,
) -> list[torch.Tensor]:
    """View a flat byte buffer as one ``[B, H, N, C]`` tensor per layer slot.

    The buffer holds ``num_layer_slots * num_blocks`` pages in the physical
    order ``layout`` gives; each returned tensor is a view (no copy) with
    logical axes ``[B, H, N, C]`` in the spec's dtype (``C`` in elements).
    Specs without one dtype (Mamba) are viewed as bytes (``torch.int8``).

    Args:
        raw: a 1-D ``torch.int8`` or ``torch.uint8`` tensor of at least
            ``num_layer_slots * num_blocks * spec.page_size_bytes`` bytes.
        spec: the spec shared by the slots.
        num_blocks: number of blocks per slot.
        num_layer_slots: number of layer slots (``L``).
        layout: physical order of ``[L, B, H, N, C]``.
        block_size: optional kernel block size (see
            :func:`compute_layer_kv_cache_shape_bytes`).

    Raises:
        ValueError: a buffer that is not 1-D bytes or too small, non-positive
            sizes, or sizes not aligned to the dtype.
    """
    import torch

    if not isinstance(layout, KVCacheLayout):
        raise TypeError(f"layout must be a KVCacheLayout, got {layout!r}")
    if not isinstance(raw, torch.Tensor):
        raise TypeError(f"raw must be a torch.Tensor, got {type(raw).__name__}")
    if raw.dtype not in (torch.int8, torch.uint8) or raw.dim() != 1:
        raise ValueError(f"raw must be a 1-D int8 or uint8 tensor, got {raw.dtype} with shape {tuple(raw.shape)}")
    if not raw.is_contiguous():
        raise ValueError("raw must be contiguous")
    _check_int("reshape_kv_cache", "num_layer_slots", num_layer_slots)
    _check_int("reshape_kv_cache", "num_blocks", num_blocks)

    b, h, n, c_bytes = compute_layer_kv_cache_shape_bytes(spec, num_blocks, block_size)
    per_page = b // num_blocks
    page = spec.page_size_bytes
    if page % per_page:
        raise ValueError(f"page size {page} does not split into {per_page} kernel blocks")
    cell = page // per_page
    if h * n * c_bytes > cell:
        raise ValueError(f"spec content ({h}x{n}x{c_bytes} bytes) does not fit its page ({cell} bytes)")
    total = num_layer_slots * num_blocks * page
    if raw.numel() < total:
        raise ValueError(
            f"raw has {raw.numel()} bytes but {num_layer_slots} slots x {num_blocks} blocks x "
            f"{page}-byte pages need {total}"
        )

    if isinstance(spec, AttentionSpec):
        dtype = spec.torch_dtype
        item = spec.dtype_size
    else:
        dtype = torch.int8
        item = 1
    shape5 = (num_layer_slots, b, h, n, c_bytes)
    strides = _layout_byte_strides(shape5, layout, cell, total)
    strides[DIM_C] = item  # one element
    if c_bytes % item or any(s % item for s in strides):
        raise ValueError(f"strides {strides} are not multiples of the {item}-byte element size of {dtype}")
    if raw.storage_offset() % item:
        raise ValueError(f"raw starts at byte offset {raw.storage_offset()}, not aligned to {item} bytes")

    typed = raw[:total].view(torch.uint8 if raw.dtype == torch.uint8 else torch.int8).view(dtype)
    size4 = (b, h, n, c_bytes // item)
    stride4 = tuple(s // item for s in strides[1:])
    base = typed.storage_offset()
    return [
        torch.as_strided(typed, size=size4, stride=stride4, storage_offset=base + i * strides[0] // item)
        for i in range(num_layer_slots)
    ]
