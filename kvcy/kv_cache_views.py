"""Per-layer views of a KV-cache allocation placed by a :class:`KVCacheTensor` (vLLM's names).

vLLM 0.33.0's planner describes where a set of same-shaped layers lives with a
:class:`~kvcy.kv_cache_interface.KVCacheTensor`: layer ``layers[l]``'s page of
block ``b`` starts at byte ``offset + l * layer_stride + b * block_stride`` of
one flat allocation.  This module turns that placement into byte strides of
the logical shape ``[L, B, H, N, C]`` (:func:`compute_layout_strides`) and into
one ``[B, H, N, C]`` tensor view per layer (:func:`create_kv_cache_views`),
with the same names, signatures and results as vLLM's functions of the same
names.  The seed's :func:`~kvcy.kv_cache_interface.reshape_kv_cache` (layer
slots without explicit strides) stays beside them.
"""

from __future__ import annotations

from math import prod
from typing import TYPE_CHECKING

from kvcy.kv_cache_interface.layout import DIM_B, DIM_L
from kvcy.kv_cache_interface import (
    AttentionSpec,
    KVCacheLayout,
    KVCacheSpec,
    KVCacheTensor,
    compute_layer_kv_cache_shape_bytes,
)

if TYPE_CHECKING:
    import torch

__all__ = ["compute_layout_strides", "create_kv_cache_views"]


def _check_count(name: str, value: object, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}: {value!r}")
    if value < minimum:
        raise ValueError(f"{name} must be at least {minimum}, got {value}")


def compute_layout_strides(
    spec: KVCacheSpec,
    num_blocks: int,
    num_layers: int,
    layout: KVCacheLayout,
    kernel_block_size: int | None = None,
    fixed_strides: tuple[int | None, ...] = (None,) * 5,
) -> tuple[int, ...]:
    """Byte strides of ``num_layers`` layers of ``spec``, in logical ``[L, B, H, N, C]`` order.

    The axes are stacked from the innermost (``layout``'s last) outwards, each
    stride being the previous axis's stride times its size; an axis given a
    stride in ``fixed_strides`` (None: computed) keeps it, and the axes
    outside it stack on top of it.  A spec with ``page_size_padded`` has its
    page rounded up where the page grid (the ``L`` and ``B`` axes) begins, so
    the padding sits at the end of every page.

    Raises:
        AssertionError: ``fixed_strides`` without five entries or with a
            non-positive one, page padding with kernel-block splitting, or
            page padding in a layout whose page is not one run (as in vLLM).
        TypeError / ValueError: a layout that is not a :class:`KVCacheLayout`,
            or non-positive counts.
    """
    if not isinstance(layout, KVCacheLayout):
        raise TypeError(f"layout must be a KVCacheLayout, got {layout!r}")
    _check_count("num_layers", num_layers, 0)
    fixed = tuple(fixed_strides)
    if len(fixed) != 5:
        raise AssertionError(f"fixed_strides needs one entry per axis of [L, B, H, N, C], got {len(fixed)}")
    if not all(stride is None or stride > 0 for stride in fixed):
        raise AssertionError(f"fixed strides must be positive or None, got {fixed}")
    shape = (num_layers, *compute_layer_kv_cache_shape_bytes(spec, num_blocks, kernel_block_size))
    order = layout.stride_order
    padded_page = getattr(spec, "page_size_padded", None)
    grid_end = None
    if padded_page is not None:
        if kernel_block_size is not None and kernel_block_size != spec.block_size:
            raise AssertionError("Padded KV pages do not support kernel block splitting.")
        # the page grid is every axis up to the inner one of L and B; only L and B may be
        # larger than 1 there, so that a page is the run of axes inside it
        grid_end = max(order.index(DIM_L), order.index(DIM_B)) + 1
        if prod(shape[dim] for dim in order[:grid_end]) != num_layers * num_blocks:
            raise AssertionError(
                "Page padding requires dimensions outside the page tail to be L, B, "
                f"or singleton; got {layout.name} with shape {shape}."
            )
    strides = [0] * 5
    next_stride = 1
    for position in range(4, -1, -1):
        dim = order[position]
        if padded_page is not None and grid_end is not None and position == grid_end - 1:
            next_stride = max(next_stride, padded_page)
            if next_stride % padded_page:
                raise AssertionError(f"stride {next_stride} is not a whole number of {padded_page}-byte pages")
        strides[dim] = fixed[dim] or next_stride
        next_stride = strides[dim] * shape[dim]
    return tuple(strides)


def create_kv_cache_views(
    raw: torch.Tensor,
    spec: KVCacheSpec,
    num_blocks: int,
    layout: KVCacheLayout,
    kv_cache_tensor: KVCacheTensor,
    kernel_block_size: int | None = None,
) -> list[torch.Tensor]:
    """One ``[B, H, N, C]`` view per layer of ``kv_cache_tensor`` into the flat buffer ``raw``.

    Block ``b`` of layer ``l`` starts ``offset + l * layer_stride + b *
    block_stride`` bytes into ``raw``; the views share ``raw``'s memory (no
    copy) and have the spec's dtype (``C`` in elements; bytes for specs
    without one dtype, such as Mamba).  With a ``kernel_block_size`` smaller
    than the spec's block size each block is split into that many-token
    kernel blocks, which needs every block to be one dense, unpadded page.

    Args:
        raw: the allocation as a 1-D ``torch.int8`` (or ``uint8``) tensor.
        spec: the layers' spec (one per-layer spec, not a group's
            :class:`~kvcy.kv_cache_interface.UniformTypeKVCacheSpecs`).
        num_blocks: blocks of the pool.
        layout: the physical layout the tensor was planned with.
        kv_cache_tensor: a strided (vLLM-form) tensor placement.
        kernel_block_size: optional kernel block size dividing the spec's.

    Raises:
        ValueError: a block stride that is not a dense page when kernel
            blocks are asked for (vLLM's error), a placement without strides
            (the seed's ``shared_by`` form), a buffer that is not 1-D bytes or
            is too small for the views.
        AssertionError: a block stride that does not split into whole
            kernel blocks (as in vLLM).
    """
    import torch

    if not isinstance(raw, torch.Tensor):
        raise TypeError(f"raw must be a torch.Tensor, got {type(raw).__name__}")
    if raw.dtype not in (torch.int8, torch.uint8) or raw.dim() != 1:
        raise ValueError(f"raw must be a 1-D int8 or uint8 tensor, got {raw.dtype} with shape {tuple(raw.shape)}")
    if not isinstance(kv_cache_tensor, KVCacheTensor):
        raise TypeError(f"kv_cache_tensor must be a KVCacheTensor, got {type(kv_cache_tensor).__name__}")
    if kv_cache_tensor.layer_stride is None or kv_cache_tensor.block_stride is None:
        raise ValueError(
            "kv_cache_tensor has no strides (the shared_by form); view it with reshape_kv_cache instead"
        )
    _check_count("num_blocks", num_blocks, 1)
    num_layers = len(kv_cache_tensor.layers)
    layer_stride = kv_cache_tensor.layer_stride
    block_stride = kv_cache_tensor.block_stride
    shape_bytes = compute_layer_kv_cache_shape_bytes(spec, num_blocks, kernel_block_size)
    ratio = shape_bytes[0] // num_blocks
    if ratio > 1:
        # kernel blocks are a constant stride apart only inside a dense page: nothing
        # padded at its end and no other layer's page before the next block
        dense_page = prod(compute_layer_kv_cache_shape_bytes(spec, 1)[1:])
        if block_stride != dense_page:
            raise ValueError(
                f"The resolved KV cache layout ({layout.name}) does not store "
                f"blocks as dense, unpadded pages (block stride {block_stride} != page "
                f"{dense_page}), so a manager block cannot be split into {ratio} kernel "
                f"blocks of {kernel_block_size} tokens. Reduce --block-size to "
                f"{kernel_block_size} or set VLLM_KV_CACHE_LAYOUT to a layer-compact "
                "layout (e.g. LBNHC)."
            )
        if block_stride % ratio:
            raise AssertionError(f"Block stride {block_stride} must divide into {ratio} equal kernel blocks.")
        block_stride //= ratio
    logical_shape = (num_layers, *shape_bytes)
    strides = compute_layout_strides(
        spec,
        num_blocks,
        num_layers,
        layout,
        kernel_block_size,
        fixed_strides=(layer_stride, block_stride, None, None, None),
    )
    if num_layers and all(logical_shape):
        last_byte = kv_cache_tensor.offset + sum((n - 1) * s for n, s in zip(logical_shape, strides))
        if last_byte >= raw.numel():
            raise ValueError(
                f"raw has {raw.numel()} bytes but the views of {kv_cache_tensor.layers} reach byte {last_byte}"
            )
    dtype = spec.torch_dtype if isinstance(spec, AttentionSpec) else None
    view_5d = torch.as_strided(
        raw,
        size=logical_shape,
        stride=strides,
        storage_offset=raw.storage_offset() + kv_cache_tensor.offset,
    )
    views = []
    for layer in range(num_layers):
        cache = view_5d[layer]
        if dtype is not None:
            cache = cache.view(dtype)
        views.append(cache)
    return views
