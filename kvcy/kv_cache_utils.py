"""Blocks, the free-block queue, block hashing and KV-cache sizing, under vLLM's names.

The names of vLLM 0.33.0's ``vllm.v1.core.kv_cache_utils``, gathered from where
kvcy keeps them:

* ``KVCacheBlock`` (stem ``kv_cache_utils``) and ``FreeKVCacheBlockQueue``
  (stem ``kv_cache_utils_free_queue``): the selected twin's classes; ``partial_hash_hits_enabled``
  and ``eagle_proof_margin`` (stem ``single_type_kv_cache_manager_mamba``): when hits may end inside a
  block (Mamba align mode) and how far an EAGLE lookup looks past a candidate.
* Block hashing (``BlockHash``, ``hash_block_tokens``, ``init_none_hash``,
  ``get_request_block_hasher``, ...): :mod:`kvcy.hashing`, whose hot part has
  its own twins, ``kvcy/_fast/_hashing_c.pyx`` and ``kvcy/_fast/_hashing_py.py``.
  ``NONE_HASH`` is read live from :mod:`kvcy.hashing` (``init_none_hash``
  rebinds it there).
* Sizing (``get_kv_cache_config``, ``get_num_blocks``, ...):
  :mod:`kvcy.kv_cache_sizing`, pure Python.
* Prefix-cache metrics (``PrefixCacheStats``, ``CachingMetrics``,
  ``PrefixCachingMetrics``): :mod:`kvcy.metrics`.

A stem ``S`` below is ``kvcy/_fast/kv_cache_c/S.pyx`` (compiled, ``include``-d
into the extension ``kvcy._fast._kv_cache_c``) and ``kvcy/_fast/kv_cache_py/S.py``
(pure Python): the two twins of one concept.

Which twin: :mod:`kvcy._fast` picks one at import, for all of kvcy: the
compiled one when it imports, the pure-Python one with ``KVCY_NO_EXTENSIONS=1``
or when the extension is missing or broken (``KVCY_REQUIRE_EXTENSIONS=1`` makes
that an error); ``kvcy.IMPLEMENTATION`` says which (``"cython"`` / ``"python"``).
"""

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from kvcy._fast import kv_cache as _impl
from kvcy.hashing import (
    DEFAULT_NONE_HASH_SEED,
    BlockHash,
    BlockHashList,
    BlockHashListWithBlockSize,
    BlockHashWithGroupId,
    ExternalBlockHash,
    generate_block_hash_extra_keys,
    generate_lookahead_block_hash_extra_keys,
    get_block_hash,
    get_group_id,
    get_hash_fn_by_name,
    get_none_hash,
    get_none_hash_seed,
    get_request_block_hasher,
    hash_block_tokens,
    init_none_hash,
    make_block_hash_with_group_id,
    maybe_convert_block_hash,
    need_extra_keys,
    resolve_block_hashes,
    resolve_none_hash_seed,
    to_event_extra_keys,
)
from kvcy.kv_cache_sizing import (  # the memory-planning layer
    check_enough_kv_cache_memory,
    create_kv_cache_group_specs,
    estimate_max_model_len,
    generate_scheduler_kv_cache_config,
    get_kv_cache_config,
    get_kv_cache_config_from_groups,
    get_kv_cache_groups,
    get_max_concurrency_for_kv_cache_config,
    get_num_blocks,
    get_num_tokens_for_kv_cache_config,
    get_uniform_page_size,
    is_kv_cache_page_size_uniform,
    is_kv_cache_spec_uniform,
    is_kv_cache_type_attention_free,
    is_kv_cache_type_uniform,
    max_memory_usage_bytes,
    max_memory_usage_bytes_from_groups,
    may_override_num_blocks,
    unify_hybrid_kv_cache_specs,
    unify_kv_cache_configs,
    unify_kv_cache_spec_page_size,
)
from kvcy.metrics import CachingMetrics, PrefixCacheStats, PrefixCachingMetrics
from kvcy._request_types import KVCacheBlockCopy

if TYPE_CHECKING:
    # Type checkers see the pure-Python twin (the compiled one has the same API:
    # kvcy/_fast/_kv_cache_c.pyi); at run time the selected twin's classes.
    from kvcy._fast._kv_cache_py import KVCacheBlock, FreeKVCacheBlockQueue, eagle_proof_margin, partial_hash_hits_enabled
else:
    KVCacheBlock = _impl.KVCacheBlock
    FreeKVCacheBlockQueue = _impl.FreeKVCacheBlockQueue
    eagle_proof_margin = _impl.eagle_proof_margin
    partial_hash_hits_enabled = _impl.partial_hash_hits_enabled


_BlockSeq = TypeVar("_BlockSeq", bound=Sequence["KVCacheBlock"])


def null_head_len(blocks: Sequence[KVCacheBlock]) -> int:
    """How many null blocks ``blocks`` starts with (a sliding window's skipped prefix)."""
    n = 0
    for block in blocks:
        if not block.is_null:
            break
        n += 1
    return n


def trim_null_head(blocks: _BlockSeq) -> _BlockSeq:
    """``blocks`` without its leading null blocks (``blocks`` itself when it has none)."""
    n = null_head_len(blocks)
    return blocks[n:] if n else blocks


def resolve_cache_hit_alignment_tokens(
    kv_cache_config: Any, vllm_config: Any, scheduler_block_size: int, hash_block_size: int
) -> int:
    """The token granularity prefix-cache hits land on, as the coordinator will align them:
    ``hash_block_size`` when hits may end inside a block (:func:`partial_hash_hits_enabled`
    for the groups' managers), else ``scheduler_block_size``; always the latter without
    prefix caching or with one group.  ``vllm_config`` is read for
    ``cache_config.enable_prefix_caching`` and ``parallel_config.decode_context_parallel_size``.

    Raises:
        AssertionError: a group's spec (and role) has no registered manager, as in vLLM.
    """
    from kvcy.kv_cache_interface import KVCacheSpecRegistry

    groups = kv_cache_config.kv_cache_groups
    if not vllm_config.cache_config.enable_prefix_caching or len(groups) <= 1:
        return scheduler_block_size
    manager_classes = []
    for group in groups:
        manager_class = KVCacheSpecRegistry.get_manager_class(group.kv_cache_spec, getattr(group, "role", None))
        assert manager_class is not None, f"no manager registered for {type(group.kv_cache_spec).__name__}"
        manager_classes.append(manager_class)
    dcp_world_size = vllm_config.parallel_config.decode_context_parallel_size
    if partial_hash_hits_enabled(groups, hash_block_size, dcp_world_size, manager_classes):
        return hash_block_size
    return scheduler_block_size


def resolve_dcp_kv_block_size(spec: Any, dcp_world_size: int) -> int:
    """Tokens one block of ``spec`` spans under decode context parallelism: each of the
    ``dcp_world_size`` ranks holds every dcp-th token of a sharded cache, so a block
    covers ``block_size * dcp_world_size`` tokens; a replicated one (``dcp_sharded=False``)
    keeps its ``block_size``."""
    return spec.block_size * (dcp_world_size if spec.dcp_sharded else 1)


def resolve_dcp_kv_cache_spec(spec: Any, dcp_world_size: int) -> Any:
    """``spec`` with its block size set to :func:`resolve_dcp_kv_block_size` (and each
    layer's, for a :class:`~kvcy.kv_cache_interface.UniformTypeKVCacheSpecs`); ``spec``
    itself when the span is unchanged."""
    from dataclasses import replace

    from kvcy.kv_cache_interface import UniformTypeKVCacheSpecs

    block_size = resolve_dcp_kv_block_size(spec, dcp_world_size)
    if block_size == spec.block_size:
        return spec
    if isinstance(spec, UniformTypeKVCacheSpecs):
        layers = {name: resolve_dcp_kv_cache_spec(layer, dcp_world_size) for name, layer in spec.kv_cache_specs.items()}
        return replace(spec, block_size=block_size, kv_cache_specs=layers)
    return replace(spec, block_size=block_size)


def __getattr__(name: str):
    # NONE_HASH is read live from kvcy.hashing: init_none_hash rebinds it there.
    if name == "NONE_HASH":
        from kvcy import hashing

        return hashing.NONE_HASH
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "BlockHash",
    "BlockHashList",
    "BlockHashListWithBlockSize",
    "BlockHashWithGroupId",
    "CachingMetrics",
    "DEFAULT_NONE_HASH_SEED",
    "ExternalBlockHash",
    "FreeKVCacheBlockQueue",
    "KVCacheBlock",
    "KVCacheBlockCopy",
    "PrefixCacheStats",
    "PrefixCachingMetrics",
    "check_enough_kv_cache_memory",
    "create_kv_cache_group_specs",
    "eagle_proof_margin",
    "estimate_max_model_len",
    "generate_block_hash_extra_keys",
    "generate_lookahead_block_hash_extra_keys",
    "generate_scheduler_kv_cache_config",
    "get_block_hash",
    "get_group_id",
    "get_hash_fn_by_name",
    "get_kv_cache_config",
    "get_kv_cache_config_from_groups",
    "get_kv_cache_groups",
    "get_max_concurrency_for_kv_cache_config",
    "get_none_hash",
    "get_none_hash_seed",
    "get_num_blocks",
    "get_num_tokens_for_kv_cache_config",
    "get_request_block_hasher",
    "get_uniform_page_size",
    "hash_block_tokens",
    "init_none_hash",
    "is_kv_cache_page_size_uniform",
    "is_kv_cache_spec_uniform",
    "is_kv_cache_type_attention_free",
    "is_kv_cache_type_uniform",
    "make_block_hash_with_group_id",
    "null_head_len",
    "max_memory_usage_bytes",
    "max_memory_usage_bytes_from_groups",
    "may_override_num_blocks",
    "maybe_convert_block_hash",
    "need_extra_keys",
    "partial_hash_hits_enabled",
    "resolve_block_hashes",
    "resolve_cache_hit_alignment_tokens",
    "resolve_dcp_kv_block_size",
    "resolve_dcp_kv_cache_spec",
    "resolve_none_hash_seed",
    "to_event_extra_keys",
    "trim_null_head",
    "unify_hybrid_kv_cache_specs",
    "unify_kv_cache_configs",
    "unify_kv_cache_spec_page_size",
]
