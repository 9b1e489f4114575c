"""Memory planning for the KV cache (the sizing half of vLLM ``v1/core/kv_cache_utils``).

Given each layer's :class:`~kvcy.kv_cache_interface.KVCacheSpec` and the bytes
available, decide how layers are grouped (one block table per group), how many
blocks fit, and where each layer's pages live, as vLLM 0.33.0's planner
(``v1/core/kv_cache_planning``) does.  The settings come from a
:class:`kvcy.config.KVCacheSettings` instead of a vLLM ``VllmConfig``; the
physical layout is ``config.cache_config.kv_cache_layout``.

Hybrid models (several attention types) are grouped so that every group has
the same number of layers and every layer the same page size: e.g. 10 full and
20 sliding-window layers become 3 groups of 10 layers.  A type whose layer
count is not a multiple of the group size is padded.  All groups share one
allocation of ``bytes_per_block * num_blocks`` bytes: each (group, layer spec)
gets a :class:`~kvcy.kv_cache_interface.KVCacheTensor` whose ``layer_stride``,
``block_stride`` and ``offset`` say where its pages are, and the groups alias
each other from byte 0 (a block id belongs to one group at a time).
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import fields, is_dataclass, replace
from functools import partial
from math import gcd, lcm
from typing import Any

from kvcy.config import GiB_bytes, KVCacheSettings
from kvcy.kv_cache_interface import (
    replace_as,
    AttentionSpec,
    ChunkedLocalAttentionSpec,
    CircularBufferSpec,
    FullAttentionSpec,
    HiddenStateCacheSpec,
    KVCacheConfig,
    KVCacheGroupSpec,
    KVCacheLayout,
    KVCacheSpec,
    KVCacheTensor,
    MambaSpec,
    MLAAttentionSpec,
    SlidingWindowMLASpec,
    SlidingWindowSpec,
    UniformTypeKVCacheSpecs,
    cdiv,
    get_dtype_size,
)
from kvcy.kv_cache_views import compute_layout_strides

logger = logging.getLogger(__name__)

__all__ = [
    "NotEnoughKVCacheMemory",
    "check_enough_kv_cache_memory",
    "create_kv_cache_group_specs",
    "estimate_max_model_len",
    "generate_scheduler_kv_cache_config",
    "get_kv_cache_config",
    "get_kv_cache_capacity",
    "get_kv_cache_config_from_groups",
    "get_kv_cache_configs",
    "get_global_kv_cache_groups",
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
    "validate_kv_cache_layout",
]


def _check_memory(available_memory: Any) -> None:
    if isinstance(available_memory, bool) or not isinstance(available_memory, int):
        raise TypeError(f"available_memory must be an int number of bytes, got {available_memory!r}")


def round_up(x: int, multiple: int) -> int:
    """``x`` rounded up to a multiple of ``multiple``."""
    return cdiv(x, multiple) * multiple


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

    As in vLLM 0.33.0, one block of the pool (the null block, never handed
    out) is held back first: the layers are grouped on a copy of
    ``kv_cache_spec`` to know what one block costs.

    Raises:
        ValueError: no memory at all, or not enough; the message gives the
            memory needed and the longest model length that would fit.
    """
    _check_memory(available_memory)
    if not kv_cache_spec:
        return
    groups = get_kv_cache_groups(config, dict(kv_cache_spec))
    layout = config.cache_config.get_resolved_kv_cache_layout()
    check_memory = available_memory - _bytes_per_block(groups, layout) if groups else available_memory
    _raise_not_enough_memory(
        check_memory,
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

    Raises:
        ValueError: full-attention layers recording different window (or
            chunk) sizes; the merge says so and, as in vLLM, only a merge's
            ``AssertionError`` means "not uniform".
    """
    if not kv_cache_spec:
        return True
    specs = list(kv_cache_spec.values())
    try:
        specs[0].merge(specs)
    except AssertionError:
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
    """Give every layer the largest page size.

    A layer whose page divides the largest grows its block size; a Mamba
    layer (whose page does not depend on its block size) and a non-MLA
    attention layer whose page does not divide the largest are padded to it
    (``page_size_padded``).  Returns the input dict unchanged when the page
    sizes already agree, else a new dict.

    Raises:
        NotImplementedError: a layer that can neither grow nor be padded
            (MLA, whose rows are read whole); :func:`get_kv_cache_groups`
            then tries the full-allocation fallback, as vLLM does.
        AssertionError: a layer that still misses the largest page afterwards.
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
        new_spec: KVCacheSpec
        if isinstance(spec, MambaSpec):
            new_spec = replace(spec, page_size_padded=max_page_size)
        elif max_page_size % page == 0:
            new_spec = replace(spec, block_size=spec.block_size * (max_page_size // page))
        elif isinstance(spec, AttentionSpec) and not isinstance(spec, MLAAttentionSpec):
            new_spec = replace(spec, page_size_padded=max_page_size)
        else:
            raise NotImplementedError(
                f"Layer {name}: its {page}-byte page does not divide the largest page ({max_page_size} bytes) "
                "and cannot be padded; only non-MLA attention and Mamba layers can be."
            )
        if new_spec.page_size_bytes != max_page_size:
            raise AssertionError(
                f"Layer {name}: the unified page is {new_spec.page_size_bytes} bytes, not {max_page_size}"
            )
        unified[name] = new_spec
    return unified


def _promote_local_kv_cache_specs(kv_cache_spec: dict[str, KVCacheSpec]) -> dict[str, KVCacheSpec]:
    """A copy of the specs with local-attention layers allocated as full attention.

    When full-attention layers are present, sliding-window (and sliding-window
    MLA) and chunked-local layers become full-attention (MLA) specs that
    record their window or chunk, with the full-attention block size when
    there is one and their padding scaled to it.  Only the allocation
    changes; the layers still compute with their window.

    Raises:
        ValueError: the result is still not one type.
    """
    promoted = dict(kv_cache_spec)
    if is_kv_cache_spec_uniform(promoted) or UniformTypeKVCacheSpecs.is_uniform_type(promoted):
        return promoted
    specs = promoted.values()
    has_full = any(isinstance(s, FullAttentionSpec) for s in specs)
    has_local = any(isinstance(s, (SlidingWindowSpec, ChunkedLocalAttentionSpec)) for s in specs)
    full_block_sizes = {s.block_size for s in specs if isinstance(s, FullAttentionSpec)}
    full_block_size = next(iter(full_block_sizes)) if len(full_block_sizes) == 1 else None

    def padded_for(spec: AttentionSpec, block_size: int) -> int | None:
        if spec.page_size_padded is None:
            return None
        return max(spec.page_size_padded, spec.unpadded_page_size_bytes * block_size // spec.block_size)

    if has_full and has_local:
        for name, spec in kv_cache_spec.items():
            if isinstance(spec, SlidingWindowMLASpec):
                target: type | None = MLAAttentionSpec
            elif isinstance(spec, (SlidingWindowSpec, ChunkedLocalAttentionSpec)):
                target = FullAttentionSpec
            else:
                target = None
            if target is None:
                continue
            assert isinstance(spec, AttentionSpec)
            block_size = full_block_size or spec.block_size
            # promoted layers keep blocks for every token, so blocks retained below the
            # window mean nothing any more
            promoted[name] = replace_as(
                spec,
                target,
                drop=("extra_retained_tokens",),
                block_size=block_size,
                page_size_padded=padded_for(spec, block_size),
            )
    if not (is_kv_cache_spec_uniform(promoted) or UniformTypeKVCacheSpecs.is_uniform_type(promoted)):
        raise ValueError(
            "Hybrid KV cache manager is disabled but failed to promote the local-attention KV cache "
            "specs to one unified type."
        )
    return promoted


def unify_hybrid_kv_cache_specs(kv_cache_spec: dict[str, KVCacheSpec]) -> None:
    """Allocate sliding-window and chunked-local layers as full attention, in place.

    Used when the hybrid manager is disabled.  Layers are promoted in two
    sets, replicated attention layers (``dcp_sharded=False``) and the rest,
    each of which must then form one type (see
    :func:`_promote_local_kv_cache_specs`); blocks are kept for every token.

    Raises:
        ValueError: a set that still does not form one type.
    """
    by_replication: dict[bool, dict[str, KVCacheSpec]] = defaultdict(dict)
    for name, spec in kv_cache_spec.items():
        by_replication[isinstance(spec, AttentionSpec) and not spec.dcp_sharded][name] = spec
    for specs in by_replication.values():
        promoted = _promote_local_kv_cache_specs(specs)
        if promoted == specs:
            continue
        logger.warning(
            "Hybrid KV cache manager is disabled for this hybrid model: KV cache outside sliding windows "
            "and local-attention chunks is kept, only their compute is saved."
        )
        kv_cache_spec.update(promoted)


def _try_full_allocation_fallback_groups(kv_cache_spec: dict[str, KVCacheSpec]) -> list[KVCacheGroupSpec] | None:
    """One group allocating sliding-window layers as full attention, for MLA next to them.

    Taken only when page sizes cannot be unified, the model mixes MLA with
    plain sliding-window layers, and has no hidden-state, sliding-window MLA
    or chunked-local layers; None when it does not apply.
    """
    specs = kv_cache_spec.values()
    if any(isinstance(s, (HiddenStateCacheSpec, SlidingWindowMLASpec, ChunkedLocalAttentionSpec)) for s in specs):
        return None
    if not (any(isinstance(s, MLAAttentionSpec) for s in specs) and any(isinstance(s, SlidingWindowSpec) for s in specs)):
        return None
    try:
        promoted = _promote_local_kv_cache_specs(kv_cache_spec)
    except ValueError:
        return None
    uniform = UniformTypeKVCacheSpecs.from_specs(promoted)
    if uniform is None:
        return None
    logger.warning(
        "KV cache page sizes cannot be unified; sliding-window layers are allocated as full attention "
        "(their attention compute is unchanged)."
    )
    return [KVCacheGroupSpec(list(uniform.kv_cache_specs), uniform)]


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
    """Split a hybrid model's layers (one page size) into equal-sized groups.

    Layers with equal specs form a type; a type joins an earlier bucket when
    its spec merges with that bucket's (e.g. full-attention layers differing
    only in a recorded window), so that there are as few buckets as possible.
    The group size is the smallest bucket's layer count, or the largest's
    when that is under 1.5x the smallest (a drafter adding a few layers to
    one type should cost padding, not a doubling of groups).  A bucket of
    ``n`` layers gives ``cdiv(n, group_size)`` groups; group ``i`` takes every
    ``num_groups``-th layer starting at ``i``, so pipeline stages holding
    consecutive layers stay balanced.
    """
    same_type: dict[KVCacheSpec, list[str]] = defaultdict(list)
    for name, spec in kv_cache_spec.items():
        same_type[spec].append(name)
    layer_buckets: list[list[str]] = []
    spec_buckets: list[list[KVCacheSpec]] = []
    for spec, names in same_type.items():
        for bucket_names, bucket_specs in zip(layer_buckets, spec_buckets):
            try:
                type(bucket_specs[0]).merge([*bucket_specs, spec])
            except (AssertionError, ValueError):
                continue
            bucket_names.extend(names)
            bucket_specs.append(spec)
            break
        else:
            layer_buckets.append(list(names))
            spec_buckets.append([spec])
    counts = [len(layers) for layers in layer_buckets]
    min_layers, max_layers = min(counts), max(counts)
    group_size = max_layers if max_layers < min_layers * 1.5 else min_layers
    grouped: list[list[str]] = []
    for layers in layer_buckets:
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


def _approximate_gcd(values: list[int], *, lower_bound: int | None = None) -> int:
    """The divisor ``d >= lower_bound`` that pads ``values`` up to multiples of ``d`` the least.

    Ties go to the larger ``d``; a brute force over ``[lower_bound, max(values)]``.
    """
    if not values:
        raise ValueError("values must be non-empty")
    if any(x <= 0 for x in values):
        raise ValueError(f"values must be positive, got: {list(values)!r}")
    low = max(1, lower_bound if lower_bound is not None else 1)
    high = max(values)
    if low > high:
        return low
    best, best_pad = low, None
    for d in range(low, high + 1):
        pad = sum(-x % d for x in values)
        if best_pad is None or pad <= best_pad:
            best, best_pad = d, pad
    return best


def _get_packed_kv_cache_groups(layout: KVCacheLayout, kv_cache_spec: dict[str, KVCacheSpec]) -> list[KVCacheGroupSpec] | None:
    """Groups of mixed page sizes packed side by side in each block (block-outermost layouts).

    Layers are bucketed greedily into one-type buckets.  A bucket with as
    many layers of each of its page sizes is a repeating pattern; such
    buckets are split into groups of the same number of pattern repeats
    (:func:`_approximate_gcd` of their sizes, at least the largest
    mixed-size bucket's), so every group packs the same way.  Mamba buckets
    (and unsplit sliding-window buckets) are split further so that a group
    fits in the block the other buckets already need.  None when the layout
    is not block-outermost or every layer has one page size.
    """
    if not layout.is_block_outermost or len({s.page_size_bytes for s in kv_cache_spec.values()}) <= 1:
        return None
    buckets: list[dict[str, KVCacheSpec]] = []
    for name, spec in kv_cache_spec.items():
        for bucket in buckets:
            if UniformTypeKVCacheSpecs.is_uniform_type({**bucket, name: spec}):
                bucket[name] = spec
                break
        else:
            buckets.append({name: spec})

    bucketed = []
    for bucket in buckets:
        uniform = UniformTypeKVCacheSpecs.from_specs(bucket)
        assert uniform is not None
        by_page: dict[int, list[str]] = defaultdict(list)
        for name, spec in bucket.items():
            by_page[spec.page_size_bytes].append(name)
        balanced = len({len(names) for names in by_page.values()}) == 1
        bucketed.append((uniform, by_page, balanced))

    min_repeats = max(
        (u.get_max_layers_per_page_size() for u, by_page, balanced in bucketed if balanced and len(by_page) > 1),
        default=0,
    )
    repeats = (
        _approximate_gcd([u.get_max_layers_per_page_size() for u, _, balanced in bucketed if balanced],
                         lower_bound=min_repeats)
        if min_repeats
        else None
    )

    def num_groups_for(uniform: UniformTypeKVCacheSpecs, balanced: bool) -> int:
        if balanced and repeats is not None:
            return cdiv(uniform.get_max_layers_per_page_size(), repeats)
        return 1

    def widest_group_bytes(by_page: dict[int, list[str]], n: int) -> int:
        return sum(cdiv(len(names), n) * page for page, names in by_page.items())

    def is_state_bucket(uniform: UniformTypeKVCacheSpecs) -> bool:
        if isinstance(uniform.first_spec, (MambaSpec, CircularBufferSpec)):  # (state-like: one block per request)
            return True
        return repeats is None and isinstance(uniform.first_spec, SlidingWindowSpec)

    anchor_bytes = max(
        (
            widest_group_bytes(
                by_page, len(u.kv_cache_specs) if is_state_bucket(u) else num_groups_for(u, balanced)
            )
            for u, by_page, balanced in bucketed
        ),
        default=0,
    )
    groups = []
    for uniform, by_page, balanced in bucketed:
        num_groups = num_groups_for(uniform, balanced)
        if anchor_bytes and is_state_bucket(uniform):
            # as many states per group as a block already holds, not a wider block
            states_per_block = max(anchor_bytes // uniform.first_spec.page_size_bytes, 1)
            num_groups = max(num_groups, cdiv(len(uniform.kv_cache_specs), states_per_block))
        if num_groups == 1:
            groups.append(KVCacheGroupSpec(list(uniform.kv_cache_specs), uniform))
            continue
        pattern_repeats = list(zip(*by_page.values()))
        for i in range(num_groups):
            names = [name for repeat in pattern_repeats[i::num_groups] for name in repeat]
            group_spec = UniformTypeKVCacheSpecs.from_specs({n: uniform.kv_cache_specs[n] for n in names})
            assert group_spec is not None
            groups.append(KVCacheGroupSpec(names, group_spec))
    return groups


def _largest_divisor_at_most(value: int, limit: int) -> int:
    for candidate in range(min(value, limit), 0, -1):
        if value % candidate == 0:
            return candidate
    return 1


def _hidden_state_token_bytes(spec: HiddenStateCacheSpec) -> int:
    return spec.num_kv_heads * spec.head_size * get_dtype_size(spec.dtype)


def _add_hidden_state_groups(
    groups: list[KVCacheGroupSpec], hidden_specs: dict[str, HiddenStateCacheSpec]
) -> list[KVCacheGroupSpec]:
    """Append one group per hidden-state layer, its page padded to the common page.

    The common page is first scaled up (with every group's block size) until
    it holds one token of the widest hidden state.
    """
    common_page = get_uniform_page_size([g.kv_cache_spec for g in groups])
    widest = max(_hidden_state_token_bytes(spec) for spec in hidden_specs.values())
    if widest > common_page:
        scale = cdiv(widest, common_page)
        common_page *= scale
        scaled = []
        for group in groups:
            spec = group.kv_cache_spec
            changes: dict[str, Any] = {"block_size": spec.block_size * scale}
            if isinstance(spec, (AttentionSpec, MambaSpec)) and spec.page_size_padded is not None:
                changes["page_size_padded"] = spec.page_size_padded * scale
            scaled.append(KVCacheGroupSpec(group.layer_names, replace(spec, **changes)))
        groups = scaled
    group_block_size = gcd(*(g.kv_cache_spec.block_size for g in groups))
    for name, spec in hidden_specs.items():
        per_token = _hidden_state_token_bytes(spec)
        block_size = _largest_divisor_at_most(group_block_size, max(common_page // per_token, 1))
        wasted = common_page - block_size * per_token
        logger.info(
            "Using block size %d for hidden-state cache layer %s; page alignment wastes %d bytes (%.2f%%) per block",
            block_size,
            name,
            wasted,
            wasted / common_page * 100,
        )
        groups.append(KVCacheGroupSpec([name], replace(spec, block_size=block_size, page_size_padded=common_page)))
    return groups


def get_kv_cache_groups(config: KVCacheSettings, kv_cache_spec: dict[str, KVCacheSpec]) -> list[KVCacheGroupSpec]:
    """Split the layers into KV-cache groups (one block table each), as vLLM 0.33.0 does.

    * no layers: no groups (attention-free model);
    * one spec for all layers: one group;
    * one attention type with different shapes: one group whose spec is a
      :class:`UniformTypeKVCacheSpecs`;
    * a block-outermost layout with mixed page sizes: pages packed side by
      side in each block (see :func:`_get_packed_kv_cache_groups`);
    * otherwise page sizes are unified (by growing block sizes, or padding)
      and the layers split into equal-sized groups, padded where needed; MLA
      next to sliding-window layers whose pages cannot be unified becomes one
      group allocating every layer as full attention.

    Hidden-state layers get a group each.  With
    ``config.disable_hybrid_kv_cache_manager`` the specs are first unified in
    place (see :func:`unify_hybrid_kv_cache_specs`).

    Raises:
        NotImplementedError: page sizes that cannot be unified.
        ValueError: specs that cannot be promoted to one type with the hybrid
            manager disabled, or a bad layout setting.
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
    # hidden-state layers keep a block table of their own
    hidden = {n: s for n, s in kv_cache_spec.items() if isinstance(s, HiddenStateCacheSpec)}
    others = {n: s for n, s in kv_cache_spec.items() if not isinstance(s, HiddenStateCacheSpec)}
    packed = _get_packed_kv_cache_groups(config.cache_config.get_resolved_kv_cache_layout(), others)
    if packed:
        # blocks are strided by the widest group, so hidden-state pages need no alignment
        return packed + [KVCacheGroupSpec([name], spec) for name, spec in hidden.items()]
    try:
        others = unify_kv_cache_spec_page_size(others)
    except NotImplementedError:
        fallback = _try_full_allocation_fallback_groups(kv_cache_spec)
        if fallback is None:
            raise
        return fallback
    groups = create_kv_cache_group_specs(others, _group_layers_uniform_page_size(others))
    if hidden:
        groups = _add_hidden_state_groups(groups, hidden)
    return groups


def get_global_kv_cache_groups(
    config: KVCacheSettings, kv_cache_specs: list[dict[str, KVCacheSpec]]
) -> list[KVCacheGroupSpec]:
    """Group the layers of the whole model, all workers' specs merged (vLLM's name).

    Raises:
        AssertionError: one layer with different specs on two workers (as in vLLM).
    """
    merged: dict[str, KVCacheSpec] = {}
    for worker_spec in kv_cache_specs:
        for name, spec in worker_spec.items():
            if name not in merged:
                merged[name] = spec
            elif merged[name] != spec:
                raise AssertionError(
                    "The KV cache specs for the same layer are different across workers. This is not supported yet."
                )
    return get_kv_cache_groups(config, merged)


# ---------------------------------------------------------------------------
# Placement: block count and strided tensors
# ---------------------------------------------------------------------------


def may_override_num_blocks(config: KVCacheSettings, num_blocks: int) -> int:
    """``cache_config.num_gpu_blocks_override`` when set, else ``num_blocks``."""
    override = config.cache_config.num_gpu_blocks_override
    return num_blocks if override is None else override


def get_num_blocks(config: KVCacheSettings, num_layers: int, available_memory: int, page_size: int) -> int:
    """Blocks that fit when each block costs ``page_size`` bytes in each of ``num_layers`` pools.

    Seed entry point; the planner divides by the bytes of one block of the
    widest group instead (the same number for one page size).

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


def _layer_spec(group: KVCacheGroupSpec, layer_name: str) -> KVCacheSpec:
    spec = group.kv_cache_spec
    if isinstance(spec, UniformTypeKVCacheSpecs):
        return spec.kv_cache_specs[layer_name]
    return spec


def _padded_block_stride(spec: KVCacheSpec) -> int:
    """A layer-outer block stride: the page rounded up to the spec's block-stride alignment."""
    return round_up(spec.page_size_bytes, spec.get_block_stride_alignment())


def _bytes_per_block(kv_cache_groups: list[KVCacheGroupSpec], layout: KVCacheLayout) -> int:
    """Bytes one block id costs in the shared pool: the widest group's pages.

    Layer-outer layouts sum each layer's aligned page; block-outermost
    layouts sum the pages and round the packed block up to every alignment.
    """
    if not layout.is_block_outermost:
        return max(sum(_padded_block_stride(_layer_spec(g, n)) for n in g.layer_names) for g in kv_cache_groups)
    packed = max(sum(_layer_spec(g, n).page_size_bytes for n in g.layer_names) for g in kv_cache_groups)
    assert packed > 0
    alignments = [_layer_spec(g, n).get_block_stride_alignment() for g in kv_cache_groups for n in g.layer_names]
    return round_up(packed, lcm(*alignments))


def validate_kv_cache_layout(layout: KVCacheLayout, kv_cache_groups: list[KVCacheGroupSpec]) -> None:
    """Check that ``layout`` can place these groups (vLLM's check).

    One page size fits every layout.  Mixed page sizes are packed side by
    side in a block, which needs each page to be one run (a block-compact
    layout) and, with several groups, blocks outside layers.

    Raises:
        ValueError: a layout that cannot express the groups' page sizes.
    """
    page_sizes = {_layer_spec(g, n).page_size_bytes for g in kv_cache_groups for n in g.layer_names}
    if len(page_sizes) == 1:
        return
    if not layout.is_block_compact or (len(kv_cache_groups) > 1 and layout.is_layer_compact):
        raise ValueError(
            f"KV cache layout {layout.name} cannot express this model's mixed page sizes "
            f"({sorted(page_sizes)}); use a block-outermost layout (e.g. BLHNC)."
        )


def _pool_bytes_per_block(config: KVCacheSettings, kv_cache_groups: list[KVCacheGroupSpec]) -> int:
    """Bytes one block costs in the pool (0 without groups).

    Like vLLM's builder probe, the groups are placed for one block first, so
    a layout that cannot place them fails here, before any memory check.
    """
    if not kv_cache_groups:
        return 0
    layout = config.cache_config.get_resolved_kv_cache_layout()
    validate_kv_cache_layout(layout, kv_cache_groups)
    bytes_per_block = _bytes_per_block(kv_cache_groups, layout)
    _place_tensors(kv_cache_groups, layout, bytes_per_block, 1)
    return bytes_per_block


def _place_tensors(
    kv_cache_groups: list[KVCacheGroupSpec], layout: KVCacheLayout, bytes_per_block: int, num_blocks: int
) -> list[KVCacheTensor]:
    """One strided :class:`KVCacheTensor` per (group, distinct layer spec), every group from byte 0.

    Block-outermost: a block holds every layer's page of the group side by
    side (``block_stride`` = the packed block, ``layer_stride`` = a page).
    Layer-outer: each layer owns a region of ``num_blocks`` pages, padded to
    the spec's alignment.  Groups alias the same bytes, which is sound
    because a block id belongs to one group at a time.
    """
    size = bytes_per_block * num_blocks
    packed_stride = bytes_per_block if layout.is_block_outermost else None
    tensors = []
    for group in kv_cache_groups:
        group_spec = group.kv_cache_spec
        layers_by_spec: dict[KVCacheSpec, list[str]] = defaultdict(list)
        if isinstance(group_spec, UniformTypeKVCacheSpecs):
            for name, spec in group_spec.kv_cache_specs.items():
                layers_by_spec[spec].append(name)
        elif group.layer_names:
            layers_by_spec[group_spec].extend(group.layer_names)
        offset = 0
        for spec, names in layers_by_spec.items():
            block_stride = packed_stride
            padded_page = _padded_block_stride(spec)
            if block_stride is None and padded_page != spec.page_size_bytes:
                assert layout.is_block_compact, f"{layout.name} cannot pad pages"
                block_stride = padded_page
            layer_stride, block_stride, _, _, _ = compute_layout_strides(
                spec, num_blocks, len(names), layout, fixed_strides=(None, block_stride, None, None, None)
            )
            tensors.append(
                KVCacheTensor(
                    size=size, layers=names, layer_stride=layer_stride, block_stride=block_stride, offset=offset
                )
            )
            # block-outer layers share each block; layer-outer layers own whole regions
            offset += len(names) * (spec.page_size_bytes if layout.is_block_outermost else layer_stride)
    return tensors


def _retention_interval(config: KVCacheSettings) -> int | None:
    return getattr(config.cache_config, "prefix_cache_retention_interval", None)


def get_kv_cache_config_from_groups(
    config: KVCacheSettings, kv_cache_groups: list[KVCacheGroupSpec], available_memory: int
) -> KVCacheConfig:
    """The block count and strided tensor placements for given groups (vLLM 0.33.0's planner).

    * no groups: 1 block (the pool's null block), no tensors;
    * otherwise ``available_memory // bytes_per_block`` blocks (or
      ``num_gpu_blocks_override``), where ``bytes_per_block`` is the widest
      group's pages in ``config.cache_config``'s layout, and one
      :class:`KVCacheTensor` per (group, layer spec) over one allocation of
      ``bytes_per_block * num_blocks`` bytes that every group aliases.

    Raises:
        ValueError: negative memory, or a layout that cannot express the
            groups' page sizes.
    """
    _check_memory(available_memory)
    if not kv_cache_groups:
        return KVCacheConfig(
            num_blocks=1,
            kv_cache_tensors=[],
            kv_cache_groups=kv_cache_groups,
            prefix_cache_retention_interval=_retention_interval(config),
        )
    if available_memory < 0:
        raise ValueError(f"available_memory must be non-negative, got {available_memory}")
    layout = config.cache_config.get_resolved_kv_cache_layout()
    validate_kv_cache_layout(layout, kv_cache_groups)
    bytes_per_block = _bytes_per_block(kv_cache_groups, layout)
    num_blocks = may_override_num_blocks(config, available_memory // bytes_per_block)
    return KVCacheConfig(
        num_blocks=num_blocks,
        kv_cache_tensors=_place_tensors(kv_cache_groups, layout, bytes_per_block, num_blocks),
        kv_cache_groups=kv_cache_groups,
        prefix_cache_retention_interval=_retention_interval(config),
    )


def _get_kv_cache_config_for_num_blocks(
    config: KVCacheSettings, kv_cache_groups: list[KVCacheGroupSpec], num_blocks: int
) -> KVCacheConfig:
    """vLLM's default builder: place the groups for ``num_blocks`` blocks."""
    if not kv_cache_groups:
        return get_kv_cache_config_from_groups(config, kv_cache_groups, 0)
    return get_kv_cache_config_from_groups(
        config, kv_cache_groups, num_blocks * _pool_bytes_per_block(config, kv_cache_groups)
    )


def max_memory_usage_bytes_from_groups(config: KVCacheSettings, kv_cache_groups: list[KVCacheGroupSpec]) -> int:
    """Bytes one request of ``config.max_model_len`` tokens holds, padding included.

    Every group draws its blocks from the shared pool and a block costs the
    widest group's pages, so this is ``bytes_per_block`` times the blocks of
    all groups.
    """
    if not kv_cache_groups:
        return 0
    bytes_per_block = _pool_bytes_per_block(config, kv_cache_groups)
    total_blocks = 0
    for group in kv_cache_groups:
        spec = group.kv_cache_spec
        if isinstance(spec, UniformTypeKVCacheSpecs):
            total_blocks += spec.max_memory_usage_pages(config)
        else:
            total_blocks += cdiv(spec.max_memory_usage_bytes(config), spec.page_size_bytes)
    return bytes_per_block * total_blocks


def _estimate_max_model_len_from_groups(
    config: KVCacheSettings, kv_cache_groups: list[KVCacheGroupSpec], available_memory: int
) -> int:
    def fits(model_len: int) -> bool:
        trial = replace(config, max_model_len=model_len)
        return max_memory_usage_bytes_from_groups(trial, kv_cache_groups) <= available_memory

    return _binary_search_max_len(config.max_model_len, fits)


def _project_kv_cache_groups_to_worker(
    global_groups: list[KVCacheGroupSpec], worker_spec: dict[str, KVCacheSpec]
) -> list[KVCacheGroupSpec]:
    """The global groups restricted to the layers one (pipeline-parallel) worker holds."""
    projected = []
    for group in global_groups:
        names = [n for n in group.layer_names if n in worker_spec]
        if len(names) == len(group.layer_names):
            projected.append(group)
            continue
        spec = group.kv_cache_spec
        if names and isinstance(spec, UniformTypeKVCacheSpecs):
            spec = UniformTypeKVCacheSpecs(
                block_size=spec.block_size, kv_cache_specs={n: spec.kv_cache_specs[n] for n in names}
            )
        projected.append(
            KVCacheGroupSpec(
                names,
                spec,
                is_eagle_group=group.is_eagle_group,
                host_resident=group.host_resident,
                enable_kv_transfer=group.enable_kv_transfer,
                role=group.role,
            )
        )
    return projected


def get_kv_cache_configs(
    config: KVCacheSettings,
    kv_cache_specs: list[dict[str, KVCacheSpec]],
    available_memory: list[int],
    global_kv_cache_groups: list[KVCacheGroupSpec],
) -> list[KVCacheConfig]:
    """Every worker's KV-cache config, as vLLM 0.33.0's ``get_kv_cache_configs``.

    The global groups are projected onto each worker's layers;
    ``num_gpu_blocks_override`` replaces each worker's memory by that many
    blocks; one block (the null block) is held back when checking that a
    request of ``config.max_model_len`` tokens fits; each worker gets
    ``memory // bytes_per_block`` blocks, then every worker is re-planned
    with the smallest count.

    Raises:
        NotEnoughKVCacheMemory (a ``ValueError``): a worker without room for
            one request of ``config.max_model_len`` tokens.
        AssertionError: groups that miss a worker's layers (as in vLLM).
        ValueError: different numbers of spec dicts and memory sizes.
    """
    if len(kv_cache_specs) != len(available_memory):
        raise ValueError(
            f"got {len(kv_cache_specs)} workers' KV cache specs but {len(available_memory)} memory sizes"
        )
    for memory in available_memory:
        _check_memory(memory)
    projected = [_project_kv_cache_groups_to_worker(global_kv_cache_groups, spec) for spec in kv_cache_specs]
    override = config.cache_config.num_gpu_blocks_override
    if override is not None:
        adjusted = []
        for groups, memory in zip(projected, available_memory):
            if not groups:
                adjusted.append(memory)
                continue
            bytes_per_block = _pool_bytes_per_block(config, groups)
            logger.info(
                "Overriding num_gpu_blocks=%d with num_gpu_blocks_override=%d", memory // bytes_per_block, override
            )
            adjusted.append(override * bytes_per_block)
        available_memory = adjusted
    for groups, memory in zip(projected, available_memory):
        if not groups:
            continue
        # the null block is never handed out: plan against the usable blocks
        check_memory = memory - _pool_bytes_per_block(config, groups)
        _raise_not_enough_memory(
            check_memory,
            partial(max_memory_usage_bytes_from_groups, config, groups),
            config.max_model_len,
            partial(_estimate_max_model_len_from_groups, config, groups),
        )
    configs = []
    for groups, worker_spec, memory in zip(projected, kv_cache_specs, available_memory):
        if sum(len(g.layer_names) for g in groups) != len(worker_spec):
            raise AssertionError("Some layers are not assigned to any group.")
        num_blocks = memory // _pool_bytes_per_block(config, groups) if groups else 1
        configs.append(_get_kv_cache_config_for_num_blocks(config, groups, num_blocks))
    min_num_blocks = min(cfg.num_blocks for cfg in configs)
    for i, cfg in enumerate(configs):
        if cfg.num_blocks != min_num_blocks:
            configs[i] = _get_kv_cache_config_for_num_blocks(config, cfg.kv_cache_groups, min_num_blocks)
    return configs


def get_kv_cache_config(
    config: KVCacheSettings, kv_cache_spec: dict[str, KVCacheSpec], available_memory: int
) -> KVCacheConfig:
    """Plan one worker's KV cache: groups, block count and strided tensor placements.

    What vLLM 0.33.0's engine core does for a single worker: group the layers
    (:func:`get_kv_cache_groups`), plan with :func:`get_kv_cache_configs` and
    record the layout's name in ``kv_cache_layout``.

    Args:
        config: the settings (cache config and its layout, model length,
            hybrid switch).
        kv_cache_spec: each layer's spec by layer name (may be changed in
            place when the hybrid manager is disabled).
        available_memory: bytes available for the KV cache.

    Raises:
        ValueError: not enough memory for one request of
            ``config.max_model_len`` tokens besides the null block (the
            message gives the longest length that fits), or specs that
            cannot be grouped.
    """
    _check_memory(available_memory)
    groups = get_kv_cache_groups(config, kv_cache_spec)
    (kv_cache_config,) = get_kv_cache_configs(config, [kv_cache_spec], [available_memory], groups)
    kv_cache_config.kv_cache_layout = config.cache_config.get_resolved_kv_cache_layout().name
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
    """Seed name: plan a model whose layers all share one spec (one group)."""
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
    """Tokens the cache holds as the seed reports it: blocks per group times the smallest block size."""
    groups = kv_cache_config.kv_cache_groups
    if not groups:
        return 0
    min_block_size = min(group.kv_cache_spec.block_size for group in groups)
    return kv_cache_config.num_blocks // len(groups) * min_block_size


def get_max_concurrency_for_kv_cache_config(config: KVCacheSettings, kv_cache_config: KVCacheConfig) -> float:
    """How many requests of ``config.max_model_len`` tokens fit at once (a ratio).

    A request takes ``cdiv(max_memory_usage_bytes, page_size_bytes)`` blocks
    from every group: the device groups' from the one shared pool, the
    host-resident (HiSparse) groups' from the host pool of
    ``hisparse_host_num_blocks``; the tighter of the two pools bounds it.

    Raises:
        ValueError: the config has no KV cache groups, or no device group.
        AssertionError: host-resident groups but no host pool size (as in vLLM).
    """
    groups = kv_cache_config.kv_cache_groups
    if not groups:
        raise ValueError("the KV cache config has no KV cache groups (attention-free model)")
    device_blocks = host_blocks = 0
    for g in groups:
        blocks = cdiv(g.kv_cache_spec.max_memory_usage_bytes(config), g.kv_cache_spec.page_size_bytes)
        if g.host_resident:
            host_blocks += blocks
        else:
            device_blocks += blocks
    if not device_blocks:
        raise ValueError("the KV cache config has no device-resident KV cache group")
    limit = kv_cache_config.num_blocks / device_blocks
    if host_blocks:
        # (vLLM asserts it)
        assert kv_cache_config.hisparse_host_num_blocks is not None, "host-resident groups need hisparse_host_num_blocks"
        limit = min(limit, kv_cache_config.hisparse_host_num_blocks / host_blocks)
    return limit


def get_kv_cache_capacity(config: KVCacheSettings, kv_cache_config: KVCacheConfig) -> tuple[int, float]:
    """Tokens the cache holds and the max concurrency, as vLLM 0.33.0 logs them.

    The tokens are ``int(max_concurrency * max_model_len)``: whole max-length
    requests' worth, every group counted (the seed's
    :func:`get_num_tokens_for_kv_cache_config` divides blocks by groups).

    Raises:
        ValueError: the config has no KV cache groups.
    """
    max_concurrency = get_max_concurrency_for_kv_cache_config(config, kv_cache_config)
    return int(max_concurrency * config.max_model_len), max_concurrency


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


def _is_strided(kv_cache_config: KVCacheConfig) -> bool:
    return any(t.layer_stride is not None for t in kv_cache_config.kv_cache_tensors)


def unify_kv_cache_configs(kv_cache_configs: list[KVCacheConfig]) -> list[KVCacheConfig]:
    """Make several workers' configs agree so one manager can drive them all (in place).

    Seed entry point (vLLM 0.33.0 re-plans inside :func:`get_kv_cache_configs`).
    Groups are sorted by spec type and fields, every worker must then have
    the same group specs, and every worker gets the smallest block count:
    strided tensors are placed again for it and the sorted groups (in the
    config's ``kv_cache_layout``, ``LBNHC`` when unset), ``shared_by``
    tensors shrink proportionally.

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
        if _is_strided(cfg) and cfg.kv_cache_groups:
            # one tensor per (group, spec) in group order: place them again for the sorted
            # groups and the new count
            layout = KVCacheLayout.from_name(cfg.kv_cache_layout or KVCacheLayout.LBNHC.name)
            bytes_per_block = _bytes_per_block(cfg.kv_cache_groups, layout)
            cfg.kv_cache_tensors = _place_tensors(cfg.kv_cache_groups, layout, bytes_per_block, min_blocks)
        elif old and old != min_blocks:
            for tensor in cfg.kv_cache_tensors:
                tensor.size = tensor.size // old * min_blocks
    return kv_cache_configs


def generate_scheduler_kv_cache_config(kv_cache_configs: list[KVCacheConfig]) -> KVCacheConfig:
    """The config the scheduler's manager uses: worker 0's, with per-layer specs collapsed.

    Raises:
        ValueError: no configs, or workers with different block counts (device
            or HiSparse host pool).
    """
    import copy

    if not kv_cache_configs:
        raise ValueError("no KV cache configs")
    if any(cfg.num_blocks != kv_cache_configs[0].num_blocks for cfg in kv_cache_configs):
        raise ValueError("workers have different num_blocks; call unify_kv_cache_configs first")
    if any(cfg.hisparse_host_num_blocks != kv_cache_configs[0].hisparse_host_num_blocks for cfg in kv_cache_configs):
        raise ValueError("workers have different hisparse_host_num_blocks")
    cfg = copy.deepcopy(kv_cache_configs[0])
    for group in cfg.kv_cache_groups:
        if isinstance(group.kv_cache_spec, UniformTypeKVCacheSpecs):
            group.kv_cache_spec = next(iter(group.kv_cache_spec.kv_cache_specs.values()))
    return cfg
