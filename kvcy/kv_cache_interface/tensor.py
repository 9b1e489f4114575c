"""Where layers live in a KV-cache allocation: :class:`KVCacheTensor`."""

from __future__ import annotations

from dataclasses import dataclass, field

from kvcy.kv_cache_interface._checks import _check_bool, _check_int


@dataclass(init=False)
class KVCacheTensor:
    """Where a set of same-shaped layers lives in one KV-cache allocation.

    vLLM's form: layer ``layers[l]``'s page for block ``b`` starts at byte
    ``offset + l * layer_stride + b * block_stride`` of an allocation of
    ``size`` bytes.  Tensors whose byte ranges overlap alias each other (cache
    groups overlay, which is sound because a block id belongs to one group at
    a time).

    kvcy's sizing layer also writes an older form, ``KVCacheTensor(size=...,
    shared_by=[[layer, ...], ...])``: one allocation with ``len(shared_by)``
    layer slots, the layers of one slot aliasing each other and the physical
    order left to :func:`reshape_kv_cache`; its ``layers`` list every layer
    slot by slot and its strides are None.

    Raises:
        TypeError / ValueError: malformed sizes, strides or layer names, or
            both forms (or neither) given.
    """

    size: int
    layers: list[str]
    layer_stride: int | None
    block_stride: int | None
    offset: int = 0
    host_resident: bool = False
    _shared_by: list[list[str]] | None = field(default=None, repr=False, init=False)

    def __init__(
        self,
        size: int,
        layers: list[str] | None = None,
        layer_stride: int | None = None,
        block_stride: int | None = None,
        offset: int = 0,
        host_resident: bool = False,
        *,
        shared_by: list[list[str]] | None = None,
    ) -> None:
        _check_int("KVCacheTensor", "size", size, minimum=0)
        _check_int("KVCacheTensor", "offset", offset, minimum=0)
        _check_bool("KVCacheTensor", "host_resident", host_resident)
        if shared_by is not None:
            if layers is not None or layer_stride is not None or block_stride is not None or offset:
                raise ValueError("KVCacheTensor takes either shared_by or layers/layer_stride/block_stride/offset")
            if not isinstance(shared_by, list) or not all(
                isinstance(slot, list) and all(isinstance(n, str) for n in slot) for slot in shared_by
            ):
                raise TypeError("KVCacheTensor.shared_by must be a list of lists of layer names")
            layers = [name for slot in shared_by for name in slot]
        else:
            if layers is None or layer_stride is None or block_stride is None:
                raise TypeError("KVCacheTensor needs layers, layer_stride and block_stride (or shared_by)")
            if not isinstance(layers, list) or not all(isinstance(n, str) for n in layers):
                raise TypeError(f"KVCacheTensor.layers must be a list of layer names, got {layers!r}")
            _check_int("KVCacheTensor", "layer_stride", layer_stride, minimum=0)
            _check_int("KVCacheTensor", "block_stride", block_stride, minimum=0)
        self.size = size
        self.layers = layers
        self.layer_stride = layer_stride
        self.block_stride = block_stride
        self.offset = offset
        self.host_resident = host_resident
        self._shared_by = shared_by

    @property
    def shared_by(self) -> list[list[str]]:
        """The layer slots (``L``), each listing the layers that alias it."""
        if self._shared_by is not None:
            return self._shared_by
        return [[name] for name in self.layers]

    @property
    def num_layer_slots(self) -> int:
        """Number of layer slots (``L``) in this allocation."""
        return len(self.shared_by)

    @property
    def layer_names(self) -> list[str]:
        """Every layer backed by this allocation, slot by slot."""
        return [name for slot in self.shared_by for name in slot]

    def page_offset(self, layer_index: int, block_id: int) -> int:
        """Byte offset of layer ``layers[layer_index]``'s page of block ``block_id`` (vLLM's form)."""
        if self.layer_stride is None or self.block_stride is None:
            raise ValueError("a shared_by KVCacheTensor has no strides; its layout is reshape_kv_cache's")
        return self.offset + layer_index * self.layer_stride + block_id * self.block_stride
