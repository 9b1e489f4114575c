"""Canonical KV caches: a backend's KV-cache tensors as ``(num_blocks, page bytes)`` rows.

What the offloading worker moves is bytes per block, whatever the attention
backend's layout.  :func:`canonicalize_kv_caches` turns the per-layer cache
tensors (views from :func:`~kvcy.kv_cache_interface.reshape_kv_cache`,
physical caches in a :class:`~kvcy.kv_cache_interface.KVCacheLayout`, or
vLLM-style ``(2, num_blocks, ...)`` tensors) into the three dataclasses of
``vllm.v1.kv_offload.base`` (vLLM 0.33.0 names and fields):

* :class:`CanonicalKVCacheTensor`: one int8 ``(num_blocks, page_size_bytes)``
  view, sharing storage with the original cache (no copy), whose row ``b`` is
  one contiguous run of block ``b``'s bytes;
* :class:`CanonicalKVCacheRef`: a group's reference to one of those tensors,
  with the number of bytes of each row that hold data;
* :class:`CanonicalKVCaches`: the unique tensors and, per KV cache group, the
  refs of its layers.

A layer whose blocks are not one run (``num_blocks`` not the outermost axis,
e.g. keys and values stacked in front of it, or heads outside blocks) is split
into one canonical tensor per run, as vLLM splits FlashAttention's
``(2, num_blocks, ...)``.  Layers that alias the same bytes (layers of
different groups sharing a layer slot) share one canonical tensor.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from kvcy.kv_cache_interface import KVCacheConfig, KVCacheGroupSpec

if TYPE_CHECKING:
    import torch

    from kvcy import ops
else:

    class _TorchOnFirstUse:
        """Stands for torch until the first attribute is read, then puts torch itself in its
        place: the dataclasses here import without torch (``kvcy.kv_offload.base`` names them,
        as vLLM's does), and only using them needs it."""

        def __getattr__(self, name: str) -> Any:
            import torch

            globals()["torch"] = torch
            return getattr(torch, name)

    torch = _TorchOnFirstUse()

__all__ = [
    "CanonicalKVCacheRef",
    "CanonicalKVCacheTensor",
    "CanonicalKVCaches",
    "block_rows",
    "canonicalize_kv_caches",
]

#: Most canonical tensors one layer tensor may split into before it is refused
#: as "not block-structured" (a layout with scattered bytes per block).
MAX_SPLITS_PER_TENSOR = 1024


def _check_count(owner: str, name: str, value: Any, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{owner}.{name} must be an int, got {type(value).__name__}")
    if value < minimum:
        raise ValueError(f"{owner}.{name} must be >= {minimum}, got {value}")


@dataclass
class CanonicalKVCacheTensor:
    """A KV cache tensor whose first dimension is ``num_blocks``.

    ``tensor`` is normally the int8 ``(num_blocks, page_size_bytes)`` view made
    by :func:`canonicalize_kv_caches`; any tensor whose bytes view as
    ``(-1, page_size_bytes)`` rows is accepted (see :func:`block_rows`).
    ``page_size_bytes`` is the (possibly padded) size of one row.

    Raises:
        TypeError: ``tensor`` is not a tensor, ``page_size_bytes`` not an int.
        ValueError: ``page_size_bytes < 1``.
    """

    tensor: torch.Tensor
    page_size_bytes: int

    def __post_init__(self) -> None:
        if not isinstance(self.tensor, torch.Tensor):
            raise TypeError(f"CanonicalKVCacheTensor.tensor must be a torch.Tensor, got {type(self.tensor).__name__}")
        _check_count("CanonicalKVCacheTensor", "page_size_bytes", self.page_size_bytes, 1)


@dataclass
class CanonicalKVCacheRef:
    """A layer's (or group of layers') reference to one :class:`CanonicalKVCacheTensor`.

    ``page_size_bytes`` is the un-padded page size: only the first
    ``page_size_bytes`` bytes of each row are moved for this layer.
    ``mapping`` is vLLM's tensor-parallel ``CanonicalPageMapping``; kvcy has
    no such remapping, so it is kept for field compatibility and the worker
    accepts only ``None``.

    Raises:
        TypeError: a non-int index or size.
        ValueError: a negative index or a size below 1.
    """

    tensor_idx: int
    page_size_bytes: int
    mapping: Any = None

    def __post_init__(self) -> None:
        _check_count("CanonicalKVCacheRef", "tensor_idx", self.tensor_idx, 0)
        _check_count("CanonicalKVCacheRef", "page_size_bytes", self.page_size_bytes, 1)


@dataclass
class CanonicalKVCaches:
    """Block-level view of all KV caches: unique tensors plus per-group references.

    ``tensors`` are unique (no two alias the same bytes);
    ``group_data_refs[g]`` lists, for KV cache group ``g``, a ref to every
    tensor holding bytes of the group's layers.

    Raises:
        TypeError: members of the wrong type.
        ValueError: a ref naming a tensor that does not exist, or a ref page
            larger than its tensor's rows.
    """

    tensors: list[CanonicalKVCacheTensor]
    group_data_refs: list[list[CanonicalKVCacheRef]]

    def __post_init__(self) -> None:
        for t in self.tensors:
            if not isinstance(t, CanonicalKVCacheTensor):
                raise TypeError(f"CanonicalKVCaches.tensors must hold CanonicalKVCacheTensor, got {type(t).__name__}")
        for g, refs in enumerate(self.group_data_refs):
            for ref in refs:
                if not isinstance(ref, CanonicalKVCacheRef):
                    raise TypeError(
                        f"CanonicalKVCaches.group_data_refs[{g}] must hold CanonicalKVCacheRef, "
                        f"got {type(ref).__name__}"
                    )
                if ref.tensor_idx >= len(self.tensors):
                    raise ValueError(
                        f"group {g} refers to tensor {ref.tensor_idx} but there are {len(self.tensors)} tensors"
                    )
                if ref.page_size_bytes > self.tensors[ref.tensor_idx].page_size_bytes:
                    raise ValueError(
                        f"group {g} moves {ref.page_size_bytes} bytes per block of tensor {ref.tensor_idx}, "
                        f"whose rows hold {self.tensors[ref.tensor_idx].page_size_bytes}"
                    )


def block_rows(t: CanonicalKVCacheTensor) -> torch.Tensor:
    """``t.tensor``'s bytes as an int8 ``(num_blocks, page_size_bytes)`` view, rows contiguous.

    Raises:
        ValueError: the tensor's bytes cannot be viewed that way.
    """
    x = t.tensor
    page = t.page_size_bytes
    if x.dim() == 2 and x.dtype in (torch.int8, torch.uint8) and x.shape[1] == page and (x.stride(1) == 1 or page == 1):
        return x.view(torch.int8)
    try:
        return x.view(torch.int8).view(-1, page)
    except RuntimeError as exc:
        raise ValueError(
            f"a CanonicalKVCacheTensor of shape {list(x.shape)}, dtype {x.dtype} and strides {list(x.stride())} "
            f"cannot be viewed as int8 (num_blocks, {page}) rows: {exc}"
        ) from None


def _group_layer_names(kv_cache_groups: Any) -> tuple[list[list[str]], int | None]:
    if isinstance(kv_cache_groups, KVCacheConfig):
        return [list(g.layer_names) for g in kv_cache_groups.kv_cache_groups], kv_cache_groups.num_blocks
    if isinstance(kv_cache_groups, (str, bytes)) or not isinstance(kv_cache_groups, Sequence):
        raise TypeError(
            "kv_cache_groups must be a KVCacheConfig or a sequence of groups (KVCacheGroupSpec or layer names), "
            f"got {type(kv_cache_groups).__name__}"
        )
    groups = []
    for g, group in enumerate(kv_cache_groups):
        names = group.layer_names if isinstance(group, KVCacheGroupSpec) else group
        if isinstance(names, (str, bytes)) or not isinstance(names, Sequence):
            raise TypeError(f"group {g} must be a KVCacheGroupSpec or a sequence of layer names, got {names!r}")
        for name in names:
            if not isinstance(name, str):
                raise TypeError(f"group {g} has a layer name that is not a str: {name!r}")
        groups.append(list(names))
    return groups, None


def _block_view(x: torch.Tensor, layout: ops.Layout, block_dim: int, what: str) -> tuple[torch.Tensor, int]:
    """``x`` as a tensor with a known block axis: (view, index of that axis)."""
    if layout is None:
        if not -x.dim() <= block_dim < x.dim():
            raise ValueError(f"{what}: block_dim {block_dim} is out of range for a {x.dim()}-D tensor")
        return x, block_dim % x.dim()
    try:
        from kvcy import ops

        return ops.logical_view(x, layout), 1
    except ValueError as exc:
        raise ValueError(f"{what}: {exc}") from None


def _split_rows(
    x: torch.Tensor, bdim: int, num_blocks: int, what: str
) -> tuple[list[int], int, int]:
    """Byte offsets of the runs of one block, the run length and the block stride (bytes)."""
    if x.layout != torch.strided:
        raise TypeError(f"{what}: only strided tensors can be offloaded, got layout {x.layout}")
    if x.device.type == "meta":
        raise ValueError(f"{what}: a meta tensor has no memory to offload")
    if x.numel() == 0:
        raise ValueError(f"{what}: empty tensor of shape {list(x.shape)}")
    nb = x.shape[bdim]
    if nb != num_blocks:
        if nb % num_blocks:
            raise ValueError(
                f"{what}: its block axis (dim {bdim}) has {nb} blocks, which is not a multiple of "
                f"num_blocks={num_blocks}"
            )
        # nb // num_blocks consecutive kernel blocks make one KV cache block
        x = x.unflatten(bdim, (num_blocks, nb // num_blocks))
    esz = x.element_size()
    if any(s < 0 for s in x.stride()):
        raise ValueError(f"{what}: negative strides {list(x.stride())} are not supported")
    block_stride = x.stride(bdim) * esz
    dims = sorted(
        ((x.stride(d) * esz, x.shape[d]) for d in range(x.dim()) if d != bdim and x.shape[d] > 1),
        key=lambda sd: sd[0],
    )
    run = esz
    while dims and dims[0][0] == run:
        run *= dims.pop(0)[1]
    num_splits = math.prod(size for _, size in dims)
    if num_splits > MAX_SPLITS_PER_TENSOR:
        raise ValueError(
            f"{what}: a block is {num_splits} separate runs of {run} bytes (strides {list(x.stride())}); "
            f"more than {MAX_SPLITS_PER_TENSOR} runs per block is not a block-structured KV cache"
        )
    if num_blocks > 1 and block_stride < run:
        raise ValueError(
            f"{what}: blocks overlap (block stride {block_stride} bytes < {run} bytes of data per block)"
        )
    base = x.storage_offset() * esz
    offsets = [base]
    for stride, size in dims:
        offsets = [o + i * stride for o in offsets for i in range(size)]
    return sorted(offsets), run, block_stride


def canonicalize_kv_caches(
    kv_caches: Mapping[str, torch.Tensor | Sequence[torch.Tensor]],
    kv_cache_groups: KVCacheConfig | Sequence[KVCacheGroupSpec | Sequence[str]],
    *,
    num_blocks: int | None = None,
    layout: ops.Layout = None,
    block_dim: int = 0,
) -> CanonicalKVCaches:
    """Canonicalise per-layer KV-cache tensors for the offloading worker.

    Each layer's tensor is cut into int8 ``(num_blocks, run_bytes)`` views of
    its own storage (no copy): one per contiguous run of bytes inside a block.
    Views equal to an earlier one (aliased layers) are not repeated.

    Args:
        kv_caches: layer name -> its cache tensor, or a sequence of tensors
            (e.g. separate key and value caches).
        kv_cache_groups: a :class:`KVCacheConfig` (its groups' layer names and
            its ``num_blocks``), or one entry per KV cache group: a
            :class:`KVCacheGroupSpec` or a sequence of layer names.
        num_blocks: KV cache blocks per layer; defaults to the config's, else
            to the first tensor's block count.  A tensor holding ``k`` times
            as many (kernel) blocks has ``k`` consecutive kernel blocks per
            block.
        layout: None when the tensors have their blocks on axis
            ``block_dim`` (e.g. the ``[B, H, N, C]`` views of
            :func:`~kvcy.kv_cache_interface.reshape_kv_cache`, or ``1`` for a
            ``(2, num_blocks, ...)`` tensor); otherwise the
            :class:`~kvcy.kv_cache_interface.KVCacheLayout` (or its name) of
            5-D physical caches as :mod:`kvcy.ops` takes them.
        block_dim: the block axis when ``layout`` is None.

    Returns:
        The :class:`CanonicalKVCaches`: tensors in first-seen order; group
        ``g``'s refs follow its layers' order.

    Raises:
        TypeError: a non-tensor, a non-strided tensor, bad group entries.
        ValueError: a missing layer, tensors on several devices, block counts
            that disagree, empty, overlapping or scattered blocks.
    """
    groups, config_blocks = _group_layer_names(kv_cache_groups)
    if num_blocks is None:
        num_blocks = config_blocks
    if num_blocks is not None:
        _check_count("canonicalize_kv_caches", "num_blocks", num_blocks, 1)
    if isinstance(block_dim, bool) or not isinstance(block_dim, int):
        raise TypeError(f"block_dim must be an int, got {type(block_dim).__name__}")
    if not isinstance(kv_caches, Mapping):
        raise TypeError(f"kv_caches must map layer names to tensors, got {type(kv_caches).__name__}")
    if not any(groups):
        raise ValueError("no KV cache layers to canonicalise")

    tensors: list[CanonicalKVCacheTensor] = []
    index: dict[tuple, int] = {}
    layer_refs: dict[str, list[CanonicalKVCacheRef]] = {}
    device: torch.device | None = None
    for g, names in enumerate(groups):
        for name in names:
            if name in layer_refs:
                continue
            if name not in kv_caches:
                raise ValueError(f"layer {name!r} of KV cache group {g} has no tensor in kv_caches")
            entry = kv_caches[name]
            parts = [entry] if isinstance(entry, torch.Tensor) else entry
            if isinstance(parts, (str, bytes)) or not isinstance(parts, Sequence) or not parts:
                raise TypeError(f"kv_caches[{name!r}] must be a tensor or a non-empty sequence of tensors")
            refs = []
            for i, part in enumerate(parts):
                what = f"kv_caches[{name!r}]" + ("" if isinstance(entry, torch.Tensor) else f"[{i}]")
                if not isinstance(part, torch.Tensor):
                    raise TypeError(f"{what} must be a torch.Tensor, got {type(part).__name__}")
                if device is None:
                    device = part.device
                elif part.device != device:
                    raise ValueError(f"{what} is on {part.device} but earlier KV caches are on {device}")
                view, bdim = _block_view(part, layout, block_dim, what)
                if num_blocks is None:
                    num_blocks = view.shape[bdim]
                    if num_blocks < 1:
                        raise ValueError(f"{what}: no blocks (shape {list(view.shape)})")
                offsets, run, block_stride = _split_rows(view, bdim, num_blocks, what)
                storage = part.untyped_storage()
                for off in offsets:
                    key = (storage.data_ptr(), off, run, block_stride)
                    idx = index.get(key)
                    if idx is None:
                        rows = torch.empty(0, dtype=torch.int8, device=part.device).set_(
                            storage, off, (num_blocks, run), (block_stride, 1)
                        )
                        idx = index[key] = len(tensors)
                        tensors.append(CanonicalKVCacheTensor(tensor=rows, page_size_bytes=run))
                    refs.append(CanonicalKVCacheRef(tensor_idx=idx, page_size_bytes=run))
            layer_refs[name] = refs
    group_data_refs = []
    for names in groups:
        # a tensor aliased by two layers of one group is moved once
        seen: set[int] = set()
        group_refs = []
        for name in names:
            for ref in layer_refs[name]:
                if ref.tensor_idx not in seen:
                    seen.add(ref.tensor_idx)
                    group_refs.append(ref)
        group_data_refs.append(group_refs)
    return CanonicalKVCaches(tensors=tensors, group_data_refs=group_data_refs)
