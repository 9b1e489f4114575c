"""Groups and the whole cache: :class:`KVCacheGroupSpec`, :class:`KVCacheGroupRole`
and :class:`KVCacheConfig`."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum
from functools import cached_property

from kvcy.kv_cache_interface._checks import _check_bool, _check_int
from kvcy.kv_cache_interface.attention import AttentionSpec
from kvcy.kv_cache_interface.base import KVCacheSpec
from kvcy.kv_cache_interface.mamba import MambaSpec
from kvcy.kv_cache_interface.tensor import KVCacheTensor
from kvcy.kv_cache_interface.uniform import iter_layer_specs


class KVCacheGroupRole(str, Enum):
    """What a cache group is for: an ordinary group, or one of HiSparse's two
    (its host-backed source and its indexer; kvcy's managers refuse them)."""

    DEFAULT = "default"
    HISPARSE_SOURCE = "hisparse_source"
    HISPARSE_INDEXER = "hisparse_indexer"


@dataclass
class KVCacheGroupSpec:
    """Layers sharing one block table; the manager treats them as one layer."""

    layer_names: list[str]
    kv_cache_spec: KVCacheSpec
    is_eagle_group: bool = False
    """Whether the group holds EAGLE/MTP draft layers."""
    host_resident: bool = False
    """Whether the group lives in the HiSparse host pool (sized, not managed, by kvcy)."""
    enable_kv_transfer: bool = True
    """Whether the group is part of the KV state a connector transfers."""
    role: KVCacheGroupRole = KVCacheGroupRole.DEFAULT
    """The group's role; kvcy's managers serve only ``DEFAULT`` (the others are HiSparse's)."""

    def __post_init__(self) -> None:
        for name in ("is_eagle_group", "host_resident", "enable_kv_transfer"):
            _check_bool("KVCacheGroupSpec", name, getattr(self, name))
        if not isinstance(self.role, KVCacheGroupRole):
            try:
                self.role = KVCacheGroupRole(self.role)
            except ValueError:
                raise ValueError(
                    f"KVCacheGroupSpec.role must be one of {[r.value for r in KVCacheGroupRole]}, got {self.role!r}"
                ) from None


@dataclass
class KVCacheConfig:
    """How many blocks, which allocations and which layer groups a model's KV cache has."""

    num_blocks: int
    kv_cache_tensors: list[KVCacheTensor]
    kv_cache_groups: list[KVCacheGroupSpec]
    prefix_cache_retention_interval: int | None = None
    """Token interval of retained sliding-window / Mamba prefix-cache
    checkpoints: None retains them densely; 0 only where a replay of the
    prompt or a shared prefix resumes; a multiple of the scheduler block also
    once per interval (the coordinator validates it as vLLM does; a Mamba
    group keeps sparse states in align mode)."""
    kv_cache_layout: str | None = None
    """Name of the physical KV-cache layout the engine core chose for all
    workers (None: not resolved).  The manager does not read it."""
    hash_block_size: int | None = None
    """Tokens per prefix-cache block hash, as the engine core resolved it
    (None: not resolved).  kvcy's manager takes its hash block size as an
    argument, as vLLM's does."""
    cache_hit_alignment_tokens: int | None = None
    """Token granularity of prefix-cache hits, as the engine core resolved it
    (None: not resolved)."""
    hisparse_host_num_blocks: int | None = None
    """Blocks of the HiSparse host pool (None: HiSparse off)."""
    hisparse_host_block_stride: int | None = None
    """Bytes between HiSparse host blocks (None: HiSparse off)."""
    hisparse_shared_host_pool: bool = False
    """Whether TP ranks share one HiSparse host pool."""
    kv_tp_replicas: int = 1
    """Consecutive tensor-parallel ranks that hold identical KV for every
    layer (1: no replicas)."""

    def __post_init__(self) -> None:
        if self.kv_cache_layout is not None and not isinstance(self.kv_cache_layout, str):
            raise TypeError(
                "KVCacheConfig.kv_cache_layout must be a string or None, "
                f"got {type(self.kv_cache_layout).__name__}: {self.kv_cache_layout!r}"
            )
        _check_int("KVCacheConfig", "hash_block_size", self.hash_block_size, optional=True)
        _check_int("KVCacheConfig", "cache_hit_alignment_tokens", self.cache_hit_alignment_tokens, optional=True)
        _check_int("KVCacheConfig", "kv_tp_replicas", self.kv_tp_replicas)
        _check_bool("KVCacheConfig", "hisparse_shared_host_pool", self.hisparse_shared_host_pool)
        _check_int("KVCacheConfig", "hisparse_host_num_blocks", self.hisparse_host_num_blocks, minimum=0, optional=True)
        _check_int("KVCacheConfig", "hisparse_host_block_stride", self.hisparse_host_block_stride, optional=True)

    @cached_property
    def transfer_group_ids(self) -> tuple[int, ...]:
        """Ids of the groups that take part in external KV transfer."""
        return tuple(i for i, g in enumerate(self.kv_cache_groups) if g.enable_kv_transfer)

    @cached_property
    def prefix_cacheable_group_ids(self) -> tuple[int, ...]:
        """Ids of the transferable groups whose spec takes part in prefix caching."""
        return tuple(
            i for i in self.transfer_group_ids if self.kv_cache_groups[i].kv_cache_spec.prefix_cacheable
        )

    @cached_property
    def prefix_cacheable_groups(self) -> tuple[KVCacheGroupSpec, ...]:
        """The groups of :attr:`prefix_cacheable_group_ids`."""
        return tuple(self.kv_cache_groups[i] for i in self.prefix_cacheable_group_ids)

    @cached_property
    def transfer_groups(self) -> tuple[KVCacheGroupSpec, ...]:
        """The groups of :attr:`transfer_group_ids`."""
        return tuple(self.kv_cache_groups[i] for i in self.transfer_group_ids)

    @cached_property
    def transfer_group_index_by_layer(self) -> dict[str, int]:
        """For each layer of a transferable group, that group's index in :attr:`transfer_groups`."""
        return {name: index for index, group in enumerate(self.transfer_groups) for name in group.layer_names}

    def select_transfer_block_ids(self, block_ids: Sequence[list[int]]) -> tuple[list[int], ...]:
        """The entries of a per-group ``block_ids`` that belong to transferable groups.

        Raises:
            ValueError: ``block_ids`` does not have one entry per group.
        """
        if len(block_ids) != len(self.kv_cache_groups):
            raise ValueError(f"Expected {len(self.kv_cache_groups)} KV cache groups, got {len(block_ids)}.")
        return tuple(block_ids[i] for i in self.transfer_group_ids)

    @property
    def host_group_ids(self) -> tuple[int, ...]:
        """Ids of host-resident (HiSparse) groups."""
        return tuple(i for i, g in enumerate(self.kv_cache_groups) if g.host_resident)

    def num_blocks_of(self, tensor: KVCacheTensor) -> int:
        """Blocks the pool behind ``tensor`` can address: the HiSparse host pool's for a
        host-resident tensor, else the device pool's."""
        if not tensor.host_resident:
            return self.num_blocks
        assert self.hisparse_host_num_blocks is not None
        return self.hisparse_host_num_blocks

    @property
    def has_mamba_layers(self) -> bool:
        return any(
            isinstance(spec, MambaSpec) for g in self.kv_cache_groups for spec in iter_layer_specs(g.kv_cache_spec)
        )

    @property
    def has_mixed_precision_kv_cache(self) -> bool:
        """Whether the attention layers use more than one (dtype, quant mode)."""
        precisions = {
            (spec._dtype_name, spec.kv_quant_mode)
            for g in self.kv_cache_groups
            for spec in iter_layer_specs(g.kv_cache_spec)
            if isinstance(spec, AttentionSpec)
        }
        return len(precisions) > 1

    @property
    def needs_kv_cache_zeroing(self) -> bool:
        """Whether new blocks must be zeroed before use.

        Mamba state is read before it is fully written, and with mixed
        precisions a block reused by another group would decode stale bytes
        under another dtype.
        """
        return self.has_mamba_layers or self.has_mixed_precision_kv_cache
