"""Memory planning for the KV cache (the sizing half of vLLM ``v1/core/kv_cache_utils``).

Given each layer's :class:`~kvcy.kv_cache_interface.KVCacheSpec` and the bytes
available, decide how layers are grouped (one block table per group), how many
blocks fit, and which allocations back which layers.  The settings come from a
:class:`kvcy.config.KVCacheSettings` instead of a vLLM ``VllmConfig``.

Hybrid models (several attention types) are grouped so that every group has
the same number of layers and every layer the same page size: e.g. 10 full and
20 sliding-window layers become 3 groups of 10 layers, and the ``i``-th layer of
every group shares memory pool ``i`` (their block tables are independent, so
their block ids never collide).  A type whose layer count is not a multiple of
the group size is padded with empty slots.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import fields, is_dataclass, replace
from typing import Any

from kvcy.config import GiB_bytes, KVCacheSettings
from kvcy.kv_cache_interface import (
    ChunkedLocalAttentionSpec,
    FullAttentionSpec,
    KVCacheConfig,
    KVCacheGroupSpec,
    KVCacheSpec,
    KVCacheTensor,
    SlidingWindowSpec,
    UniformTypeKVCacheSpecs,
    cdiv,
)

logger = logging.getLogger(__name__)

__all__ = [
    "NotEnoughKVCacheMemory",
    "check_enough_kv_cache_memory",
    "create_kv_cache_group_specs",
    "estimate_max_model_len",
    "generate_scheduler_kv_cache_config",
    "get_kv_cache_config",
    "get_kv_cache_config_from_groups",
    "get_kv_cache_groups",
    "get_max_concurrency_for_kv_cache_config",
    "get_num_blocks",
    "get_num_tokens_for_kv_cache_config",
    "get_uniform_page_size",
    "is_kv_cache_page_size_uniform",
    "is_kv_cache_spec_uniform",
    "is_kv_cache_type_attention_free",
    "is_kv_cache_type_uniform",
    "max_memory_usage_bytes",
    "max_memory_usage_bytes_from_groups",
    "may_override_num_blocks",
    "unify_hybrid_kv_cache_specs",
    "unify_kv_cache_configs",
    "unify_kv_cache_spec_page_size",
]


def _check_memory(available_memory: Any) -> None:
    if isinstance(available_memory, bool) or not isinstance(available_memory, int):
        raise TypeError(f"available_memory must be an int number of bytes, got {available_memory!r}")


def _format_gib(num_bytes: int) -> str:
    return f"{num_bytes / GiB_bytes:.2f}"


# ---------------------------------------------------------------------------
# Memory needed per request
# ---------------------------------------------------------------------------


def max_memory_usage_bytes(config: KVCacheSettings, kv_cache_specs: Iterable[KVCacheSpec]) -> int:
    """Bytes one request of ``config.max_model_len`` tokens can hold across these layers."""
    return sum(spec.max_memory_usage_bytes(config) for spec in kv_cache_specs)


def _binary_search_max_len(max_model_len: int, fits: Callable[[int], bool]) -> int:
    """Largest length in ``[1, max_model_len]`` for which ``fits`` holds; 0 if none."""
    if not fits(1):
        return 0
    left, right, best = 1, max_model_len, 1
    while left <= right:
        mid = (left + right) // 2
        if fits(mid):
            best = mid
            left = mid + 1
        else:
            right = mid - 1
    return best


def estimate_max_model_len(
    config: KVCacheSettings, kv_cache_spec: dict[str, KVCacheSpec], available_memory: int
) -> int:
    """Longest request (at most ``config.max_model_len``) whose KV cache fits in memory.

    Binary search over the model length; 0 when not even one token fits.
    ``config`` is not modified.
    """
    _check_memory(available_memory)

    def fits(model_len: int) -> bool:
        trial = replace(config, max_model_len=model_len)
        return max_memory_usage_bytes(trial, kv_cache_spec.values()) <= available_memory

    return _binary_search_max_len(config.max_model_len, fits)


class NotEnoughKVCacheMemory(ValueError):
    """The KV-cache memory does not hold one request of ``max_model_len`` tokens.

    A ``ValueError`` (what vLLM raises) that also carries the numbers:

    Attributes:
        available_memory: the bytes that were available.
        needed_memory: the bytes one max-length request needs (``None`` when
            no memory was available at all).
        max_model_len: the length asked for.
        estimated_max_model_len: the longest request that fits (0: not one
            token's blocks fit).
    """

    def __init__(
        self,
        message: str,
        *,
        available_memory: int,
        needed_memory: int | None,
        max_model_len: int,
        estimated_max_model_len: int,
    ) -> None:
        super().__init__(message)
        self.available_memory = available_memory
        self.needed_memory = needed_memory
        self.max_model_len = max_model_len
        self.estimated_max_model_len = estimated_max_model_len


def _raise_not_enough_memory(
    available_memory: int,
    get_needed_memory: Callable[[], int],
    max_model_len: int,
    estimate: Callable[[int], int],
) -> None:
    if available_memory <= 0:
        raise NotEnoughKVCacheMemory(
            f"No available memory for the KV cache: {available_memory} bytes.",
            available_memory=available_memory,
            needed_memory=None,
            max_model_len=max_model_len,
            estimated_max_model_len=0,
        )
    needed_memory = get_needed_memory()
    if needed_memory > available_memory:
        estimated_max_len = estimate(available_memory)
        if estimated_max_len > 0:
            advice = (
                f"the estimated maximum model length is {estimated_max_len}. "
                "Lower max_model_len or give the KV cache more memory."
            )
        else:
            advice = "not even one token's blocks fit. Give the KV cache more memory."
        raise NotEnoughKVCacheMemory(
            f"One request of max_model_len ({max_model_len}) does not fit: "
            f"{_format_gib(needed_memory)} GiB KV cache is needed, larger than the available "
            f"{_format_gib(available_memory)} GiB; {advice}",
            available_memory=available_memory,
            needed_memory=needed_memory,
            max_model_len=max_model_len,
            estimated_max_model_len=estimated_max_len,
        )


def check_enough_kv_cache_memory(
    config: KVCacheSettings, kv_cache_spec: dict[str, KVCacheSpec], available_memory: int
) -> None:
    """Check that one request of ``config.max_model_len`` tokens fits in ``available_memory``.

    Raises:
        ValueError: no memory at all, or not enough; the message gives the
            memory needed and the longest model length that would fit.
    """
    _check_memory(available_memory)
    if not kv_cache_spec:
        return
    _raise_not_enough_memory(
        available_memory,
        lambda: max_memory_usage_bytes(config, kv_cache_spec.values()),
        config.max_model_len,
        lambda mem: estimate_max_model_len(config, kv_cache_spec, mem),
    )


# ---------------------------------------------------------------------------
# Uniformity checks
# ---------------------------------------------------------------------------


def is_kv_cache_type_attention_free(kv_cache_spec: dict[str, KVCacheSpec]) -> bool:
    """Whether the model has no layer with a KV cache."""
    return not kv_cache_spec


def is_kv_cache_spec_uniform(kv_cache_spec: dict[str, KVCacheSpec]) -> bool:
    """Whether all layers can share one spec (one group, one block table).

    Full-attention layers that merely record a sliding window or chunk size
    count as full attention.  An empty dict is uniform.
    """
    if not kv_cache_spec:
        return True
    specs = list(kv_cache_spec.values())
    try:
        specs[0].merge(specs)
    except (AssertionError, ValueError):  # vLLM's merges assert; an empty merge is a ValueError
        return False
    return True


def is_kv_cache_type_uniform(kv_cache_spec: dict[str, KVCacheSpec]) -> bool:
    """Seed name of :func:`is_kv_cache_spec_uniform`."""
    return is_kv_cache_spec_uniform(kv_cache_spec)


def is_kv_cache_page_size_uniform(kv_cache_spec: dict[str, KVCacheSpec]) -> bool:
    """Whether all layers have the same page size."""
    return len({spec.page_size_bytes for spec in kv_cache_spec.values()}) == 1


def get_uniform_page_size(kv_cache_specs: dict[str, KVCacheSpec] | Iterable[KVCacheSpec]) -> int:
    """The one page size shared by these specs (a dict of layer specs or any iterable).

    Raises:
        ValueError: no specs, or more than one page size.
    """
    specs = kv_cache_specs.values() if isinstance(kv_cache_specs, dict) else kv_cache_specs
    page_sizes = sorted({spec.page_size_bytes for spec in specs})
    if not page_sizes:
        raise ValueError("cannot take the page size of no KV cache specs")
    if len(page_sizes) != 1:
        raise ValueError(f"KV cache page sizes are not uniform: {page_sizes} bytes")
    return page_sizes[0]


def unify_kv_cache_spec_page_size(kv_cache_spec: dict[str, KVCacheSpec]) -> dict[str, KVCacheSpec]:
    """Give every layer the largest page size by growing the block size of the others.

    Returns the input dict unchanged when the page sizes already agree, else a
    new dict.

    Raises:
        ValueError: a page size that does not divide the largest one.
    """
    page_sizes = {spec.page_size_bytes for spec in kv_cache_spec.values()}
    if len(page_sizes) <= 1:
        return kv_cache_spec
    max_page_size = max(page_sizes)
    unified: dict[str, KVCacheSpec] = {}
    for name, spec in kv_cache_spec.items():
        page = spec.page_size_bytes
        if page == max_page_size:
            unified[name] = spec
            continue
        if max_page_size % page:
            raise ValueError(
                f"Cannot unify KV cache page sizes by growing block sizes: layer {name!r} has a "
                f"{page}-byte page, which does not divide the largest page ({max_page_size} bytes)."
            )
        new_spec = spec.copy_with_new_block_size(spec.block_size * (max_page_size // page))
        if new_spec.page_size_bytes != max_page_size:
            raise ValueError(
                f"Cannot unify KV cache page sizes: layer {name!r} reaches {new_spec.page_size_bytes} "
                f"bytes instead of {max_page_size} after growing its block size."
            )
        unified[name] = new_spec
    return unified


def unify_hybrid_kv_cache_specs(kv_cache_spec: dict[str, KVCacheSpec]) -> None:
    """Turn sliding-window and chunked-local layers into full attention, in place.

    Used when the hybrid manager is disabled: with full-attention layers
    present, every sliding-window (chunked-local) layer becomes a
    :class:`FullAttentionSpec` recording its window (chunk), so that all
    layers form one group; blocks are then kept for every token.

    Raises:
        ValueError: the specs still do not form one type afterwards.
    """
    if is_kv_cache_spec_uniform(kv_cache_spec) or UniformTypeKVCacheSpecs.is_uniform_type(kv_cache_spec):
        return
    logger.warning(
        "Hybrid KV cache manager is disabled for this hybrid model: KV cache outside sliding windows "
        "and local-attention chunks is kept, only their compute is saved."
    )
    specs = kv_cache_spec.values()
    has_full = any(isinstance(s, FullAttentionSpec) for s in specs)
    has_sw = any(isinstance(s, SlidingWindowSpec) for s in specs)
    has_chunked = any(isinstance(s, ChunkedLocalAttentionSpec) for s in specs)
    if has_full and (has_sw or has_chunked):
        for name, spec in kv_cache_spec.items():
            if isinstance(spec, SlidingWindowSpec):
                extra = dict(head_size_v=spec.head_size_v, sliding_window=spec.sliding_window)
            elif isinstance(spec, ChunkedLocalAttentionSpec):
                extra = dict(attention_chunk_size=spec.attention_chunk_size)
            else:
                continue
            kv_cache_spec[name] = FullAttentionSpec(
                block_size=spec.block_size,
                num_kv_heads=spec.num_kv_heads,
                head_size=spec.head_size,
                dtype=spec.dtype,
                kv_quant_mode=spec.kv_quant_mode,
                page_size_padded=spec.page_size_padded,
                **extra,
            )
    if not (is_kv_cache_spec_uniform(kv_cache_spec) or UniformTypeKVCacheSpecs.is_uniform_type(kv_cache_spec)):
        raise ValueError(
            "Hybrid KV cache manager is disabled but failed to convert the KV cache specs to one unified type."
        )


# ---------------------------------------------------------------------------
# Grouping
# ---------------------------------------------------------------------------


def create_kv_cache_group_specs(
    kv_cache_spec: dict[str, KVCacheSpec], grouped_layer_names: list[list[str]]
) -> list[KVCacheGroupSpec]:
    """One :class:`KVCacheGroupSpec` per list of layer names, with the layers' merged spec.

    Raises:
        ValueError: an empty group or an unknown layer name.
        AssertionError: layers whose specs cannot be merged (as in vLLM).
    """
    groups = []
    for names in grouped_layer_names:
        if not names:
            raise ValueError("a KV cache group must have at least one layer")
        missing = [n for n in names if n not in kv_cache_spec]
        if missing:
            raise ValueError(f"layers {missing} have no KV cache spec")
        specs = [kv_cache_spec[n] for n in names]
        groups.append(KVCacheGroupSpec(list(names), specs[0].merge(specs)))
    return groups


def _group_layers_uniform_page_size(kv_cache_spec: dict[str, KVCacheSpec]) -> list[list[str]]:
    """Split a hybrid model's layers into equal-sized groups of one spec each.

    Layers with equal specs form a type.  The group size is the smallest
    type's layer count, or the largest's when the largest is under 1.5x the
    smallest (a drafter adding a few layers to one type should cost padding,
    not a doubling of groups).  A type with ``n`` layers gives
    ``cdiv(n, group_size)`` groups; group ``i`` takes every
    ``num_groups``-th layer starting at ``i``, so pipeline stages holding
    consecutive layers stay balanced.
    """
    same_type: dict[KVCacheSpec, list[str]] = defaultdict(list)
    for name, spec in kv_cache_spec.items():
        same_type[spec].append(name)
    counts = [len(layers) for layers in same_type.values()]
    min_layers, max_layers = min(counts), max(counts)
    group_size = max_layers if max_layers < min_layers * 1.5 else min_layers
    grouped: list[list[str]] = []
    for layers in same_type.values():
        padding = group_size - len(layers) % group_size
        if padding != group_size:
            logger.warning(
                "Add %d padding layers, may waste at most %.2f%% KV cache memory",
                padding,
                padding / len(layers) * 100,
            )
        num_groups = cdiv(len(layers), group_size)
        for i in range(num_groups):
            grouped.append(layers[i::num_groups])
    return grouped


def get_kv_cache_groups(config: KVCacheSettings, kv_cache_spec: dict[str, KVCacheSpec]) -> list[KVCacheGroupSpec]:
    """Split the layers into KV-cache groups (one block table each).

    * no layers: no groups (attention-free model);
    * one spec for all layers: one group;
    * one attention type with different shapes: one group whose spec is a
      :class:`UniformTypeKVCacheSpecs`;
    * otherwise page sizes are unified (by growing block sizes) and the
      layers split into equal-sized groups, padded where needed.

    With ``config.disable_hybrid_kv_cache_manager`` the specs are first
    unified in place (see :func:`unify_hybrid_kv_cache_specs`).
    """
    if config.disable_hybrid_kv_cache_manager:
        unify_hybrid_kv_cache_specs(kv_cache_spec)
    if is_kv_cache_type_attention_free(kv_cache_spec):
        return []
    if is_kv_cache_spec_uniform(kv_cache_spec):
        return create_kv_cache_group_specs(kv_cache_spec, [list(kv_cache_spec)])
    uniform = UniformTypeKVCacheSpecs.from_specs(kv_cache_spec)
    if uniform is not None:
        return [KVCacheGroupSpec(list(uniform.kv_cache_specs), uniform)]
    unified = unify_kv_cache_spec_page_size(kv_cache_spec)
    return create_kv_cache_group_specs(unified, _group_layers_uniform_page_size(unified))


# ---------------------------------------------------------------------------
# Blocks and tensors
# ---------------------------------------------------------------------------


def may_override_num_blocks(config: KVCacheSettings, num_blocks: int) -> int:
    """``cache_config.num_gpu_blocks_override`` when set, else ``num_blocks``."""
    override = config.cache_config.num_gpu_blocks_override
    if override is not None:
        logger.info("Overriding num_gpu_blocks=%d with num_gpu_blocks_override=%d", num_blocks, override)
        return override
    return num_blocks


def get_num_blocks(config: KVCacheSettings, num_layers: int, available_memory: int, page_size: int) -> int:
    """Blocks that fit when each block costs ``page_size`` bytes in each of ``num_layers`` pools.

    Raises:
        ValueError: non-positive ``num_layers`` or ``page_size``, or negative memory.
    """
    _check_memory(available_memory)
    for name, value in (("num_layers", num_layers), ("page_size", page_size)):
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(f"{name} must be an int, got {value!r}")
        if value <= 0:
            raise ValueError(f"{name} must be positive, got {value}")
    if available_memory < 0:
        raise ValueError(f"available_memory must be non-negative, got {available_memory}")
    num_blocks = available_memory // page_size // num_layers
    return may_override_num_blocks(config, num_blocks)


def get_kv_cache_config_from_groups(
    config: KVCacheSettings, kv_cache_groups: list[KVCacheGroupSpec], available_memory: int
) -> KVCacheConfig:
    """The block count and backing allocations for given groups.

    * no groups: 1 block (the pool's null block), no tensors;
    * one :class:`UniformTypeKVCacheSpecs` group: one allocation per layer,
      sized by that layer's own page size;
    * otherwise ``group_size`` pools of ``page_size * num_blocks`` bytes; pool
      ``i`` backs the ``i``-th layer of every group (one layer slot whose
      ``shared_by`` lists them).
    """
    _check_memory(available_memory)
    if not kv_cache_groups:
        return KVCacheConfig(num_blocks=1, kv_cache_tensors=[], kv_cache_groups=kv_cache_groups)
    if len(kv_cache_groups) == 1 and isinstance(kv_cache_groups[0].kv_cache_spec, UniformTypeKVCacheSpecs):
        spec = kv_cache_groups[0].kv_cache_spec
        if available_memory < 0:
            raise ValueError(f"available_memory must be non-negative, got {available_memory}")
        num_blocks = may_override_num_blocks(config, available_memory // spec.page_size_bytes)
        tensors = [
            KVCacheTensor(size=spec.kv_cache_specs[name].page_size_bytes * num_blocks, shared_by=[[name]])
            for name in kv_cache_groups[0].layer_names
        ]
    else:
        group_size = max(len(group.layer_names) for group in kv_cache_groups)
        page_size = get_uniform_page_size(group.kv_cache_spec for group in kv_cache_groups)
        num_blocks = get_num_blocks(config, group_size, available_memory, page_size)
        tensors = []
        for i in range(group_size):
            slot = [group.layer_names[i] for group in kv_cache_groups if i < len(group.layer_names)]
            tensors.append(KVCacheTensor(size=page_size * num_blocks, shared_by=[slot]))
    return KVCacheConfig(num_blocks=num_blocks, kv_cache_tensors=tensors, kv_cache_groups=kv_cache_groups)


def max_memory_usage_bytes_from_groups(config: KVCacheSettings, kv_cache_groups: list[KVCacheGroupSpec]) -> int:
    """Bytes one request of ``config.max_model_len`` tokens holds, padding included.

    With equal-sized groups sharing pools, a block of any group costs one
    page in every pool, so padding layers cost memory too.
    """
    if not kv_cache_groups:
        return 0
    if len(kv_cache_groups) == 1 and isinstance(kv_cache_groups[0].kv_cache_spec, UniformTypeKVCacheSpecs):
        specs = kv_cache_groups[0].kv_cache_spec.kv_cache_specs
        return sum(spec.max_memory_usage_bytes(config) for spec in specs.values())
    group_size = max(len(group.layer_names) for group in kv_cache_groups)
    page_size = get_uniform_page_size(group.kv_cache_spec for group in kv_cache_groups)
    blocks = sum(cdiv(group.kv_cache_spec.max_memory_usage_bytes(config), page_size) for group in kv_cache_groups)
    return group_size * page_size * blocks


def _estimate_max_model_len_from_groups(
    config: KVCacheSettings, kv_cache_groups: list[KVCacheGroupSpec], available_memory: int
) -> int:
    def fits(model_len: int) -> bool:
        trial = replace(config, max_model_len=model_len)
        return max_memory_usage_bytes_from_groups(trial, kv_cache_groups) <= available_memory

    return _binary_search_max_len(config.max_model_len, fits)


def get_kv_cache_config(
    config: KVCacheSettings, kv_cache_spec: dict[str, KVCacheSpec], available_memory: int
) -> KVCacheConfig:
    """Plan a model's KV cache: groups, block count and backing allocations.

    Args:
        config: the settings (cache config, model length, hybrid switch).
        kv_cache_spec: each layer's spec by layer name (may be changed in
            place when the hybrid manager is disabled).
        available_memory: bytes available for the KV cache.

    Raises:
        ValueError: not enough memory for one request of
            ``config.max_model_len`` tokens (the message gives the longest
            length that fits), or specs that cannot be grouped.
    """
    _check_memory(available_memory)
    groups = get_kv_cache_groups(config, kv_cache_spec)
    if groups:
        _raise_not_enough_memory(
            available_memory,
            lambda: max_memory_usage_bytes_from_groups(config, groups),
            config.max_model_len,
            lambda mem: _estimate_max_model_len_from_groups(config, groups, mem),
        )
    kv_cache_config = get_kv_cache_config_from_groups(config, groups, available_memory)
    if groups:
        logger.info("KV cache size: %s tokens", f"{get_num_tokens_for_kv_cache_config(kv_cache_config):,}")
        logger.info(
            "Maximum concurrency for %s tokens per request: %.2fx",
            f"{config.max_model_len:,}",
            get_max_concurrency_for_kv_cache_config(config, kv_cache_config),
        )
    return kv_cache_config


def _get_kv_cache_config_attention_free() -> KVCacheConfig:
    """Seed name: the config of a model without KV cache (1 block, the null block)."""
    return KVCacheConfig(num_blocks=1, kv_cache_tensors=[], kv_cache_groups=[])


def _get_kv_cache_config_uniform_type(
    config: KVCacheSettings, kv_cache_spec: dict[str, KVCacheSpec], available_memory: int
) -> KVCacheConfig:
    """Seed name: plan a model whose layers all share one spec (one group, a pool per layer)."""
    groups = create_kv_cache_group_specs(kv_cache_spec, [list(kv_cache_spec)])
    return get_kv_cache_config_from_groups(config, groups, available_memory)


def _get_kv_cache_config_uniform_page_size(
    config: KVCacheSettings, kv_cache_spec: dict[str, KVCacheSpec], available_memory: int
) -> KVCacheConfig:
    """Seed name: plan a hybrid model whose layers share one page size (equal groups, padded)."""
    get_uniform_page_size(kv_cache_spec)
    groups = create_kv_cache_group_specs(kv_cache_spec, _group_layers_uniform_page_size(kv_cache_spec))
    return get_kv_cache_config_from_groups(config, groups, available_memory)


# ---------------------------------------------------------------------------
# Reports
# ---------------------------------------------------------------------------


def get_num_tokens_for_kv_cache_config(kv_cache_config: KVCacheConfig) -> int:
    """Tokens the cache holds as vLLM reports it: blocks per group times the smallest block size."""
    groups = kv_cache_config.kv_cache_groups
    if not groups:
        return 0
    min_block_size = min(group.kv_cache_spec.block_size for group in groups)
    return kv_cache_config.num_blocks // len(groups) * min_block_size


def get_max_concurrency_for_kv_cache_config(config: KVCacheSettings, kv_cache_config: KVCacheConfig) -> float:
    """How many requests of ``config.max_model_len`` tokens fit at once (a ratio).

    Raises:
        ValueError: the config has no KV cache groups.
    """
    groups = kv_cache_config.kv_cache_groups
    if not groups:
        raise ValueError("the KV cache config has no KV cache groups (attention-free model)")
    num_layer_per_group = max(len(group.layer_names) for group in groups)
    per_request = num_layer_per_group * max_memory_usage_bytes(config, (g.kv_cache_spec for g in groups))
    memory_per_block = groups[0].kv_cache_spec.page_size_bytes * num_layer_per_group
    blocks_per_request = cdiv(per_request, memory_per_block)
    return kv_cache_config.num_blocks / blocks_per_request


# ---------------------------------------------------------------------------
# Several workers
# ---------------------------------------------------------------------------


def _none_safe(value: Any) -> Any:
    """A sort key that orders None first and never compares None with a value."""
    if value is None:
        return (0,)
    if isinstance(value, (tuple, list)):
        return (1, tuple(_none_safe(v) for v in value))
    if isinstance(value, dict):
        return (1, tuple((k, _none_safe(v)) for k, v in sorted(value.items())))
    if is_dataclass(value):
        return (1, type(value).__name__, tuple(_none_safe(getattr(value, f.name)) for f in fields(value)))
    return (1, value)


def unify_kv_cache_configs(kv_cache_configs: list[KVCacheConfig]) -> list[KVCacheConfig]:
    """Make several workers' configs agree so one manager can drive them all (in place).

    Groups are sorted by spec type and fields, every worker must then have
    the same group specs, and every worker gets the smallest block count
    (tensors shrink proportionally).

    Raises:
        ValueError: no configs, or workers whose groups differ.
    """
    if not kv_cache_configs:
        raise ValueError("no KV cache configs to unify")
    for cfg in kv_cache_configs:
        cfg.kv_cache_groups.sort(key=lambda g: (type(g.kv_cache_spec).__name__, _none_safe(g.kv_cache_spec)))
    first = kv_cache_configs[0]
    for rank, cfg in enumerate(kv_cache_configs[1:], start=1):
        if len(cfg.kv_cache_groups) != len(first.kv_cache_groups):
            raise ValueError(
                f"worker {rank} has {len(cfg.kv_cache_groups)} KV cache groups but worker 0 has "
                f"{len(first.kv_cache_groups)}"
            )
        for gid, (g0, gi) in enumerate(zip(first.kv_cache_groups, cfg.kv_cache_groups)):
            if g0.kv_cache_spec != gi.kv_cache_spec:
                raise ValueError(f"KV cache group {gid} of worker {rank} has a different spec than worker 0's")
    min_blocks = min(cfg.num_blocks for cfg in kv_cache_configs)
    for cfg in kv_cache_configs:
        old = cfg.num_blocks
        cfg.num_blocks = min_blocks
        if old and old != min_blocks:
            for tensor in cfg.kv_cache_tensors:
                tensor.size = tensor.size // old * min_blocks
    return kv_cache_configs


def generate_scheduler_kv_cache_config(kv_cache_configs: list[KVCacheConfig]) -> KVCacheConfig:
    """The config the scheduler's manager uses: worker 0's, with per-layer specs collapsed.

    Raises:
        ValueError: no configs, or workers with different block counts.
    """
    import copy

    if not kv_cache_configs:
        raise ValueError("no KV cache configs")
    if any(cfg.num_blocks != kv_cache_configs[0].num_blocks for cfg in kv_cache_configs):
        raise ValueError("workers have different num_blocks; call unify_kv_cache_configs first")
    cfg = copy.deepcopy(kv_cache_configs[0])
    for group in cfg.kv_cache_groups:
        if isinstance(group.kv_cache_spec, UniformTypeKVCacheSpecs):
            group.kv_cache_spec = next(iter(group.kv_cache_spec.kv_cache_specs.values()))
    return cfg
