"""The normalized configuration an offloading spec is built from (``vllm.v1.kv_offload.config``).

Frozen dataclasses with vLLM 0.33.0's names, fields and defaults: the KV cache groups the
tier serves, the model, the hash / chunk geometry, the parallel layout, and
:class:`OffloadingConfig`, which holds them all and is what ``OffloadingSpec(config)`` takes.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

__all__ = [
    "OffloadingCacheConfig",
    "OffloadingConfig",
    "OffloadingGroupConfig",
    "OffloadingModelConfig",
    "OffloadingParallelConfig",
]


@dataclass(frozen=True)
class OffloadingGroupConfig:
    """One KV cache group the tier serves."""

    #: Tokens one block spans across all workers (context parallelism included).
    tokens_per_block: int
    #: The group's layer names.
    layer_names: tuple[str, ...]
    #: The group's index in the KV cache config.
    group_id: int
    #: Chunks of the group kept per request; ``None`` for a full-attention group.
    sliding_window_size_in_chunks: int | None = None


@dataclass(frozen=True)
class OffloadingModelConfig:
    """The model whose KV data is offloaded."""

    #: The model's identifier (e.g. a Hugging Face path).
    name: str
    #: The KV cache dtype, e.g. ``"float16"``.
    dtype: str
    #: The longest request accepted, in tokens (0: not known).
    max_model_len: int = 0


@dataclass(frozen=True)
class OffloadingCacheConfig:
    """The hash and chunk geometry."""

    #: Tokens per block hash.
    tokens_per_hash: int
    #: GPU blocks per offloaded chunk.
    blocks_per_chunk: int


@dataclass(frozen=True)
class OffloadingParallelConfig:
    """Where this worker sits in the parallel layout."""

    #: This worker's index, ``0 .. world_size - 1`` (0 on the scheduler side).
    rank: int
    #: Number of workers.
    world_size: int
    tp_size: int
    pp_size: int
    pcp_size: int
    dcp_size: int
    #: This engine's data-parallel replica index, and the number of replicas.
    data_parallel_index: int
    data_parallel_size: int
    #: The data-parallel group's local rank (SPMD mode only).
    data_parallel_rank_local: int | None
    #: Whether a block's persisted bytes are the same under any parallel layout.
    is_parallelism_agnostic: bool


@dataclass(frozen=True)
class OffloadingConfig:
    """Everything an offloading spec is built from."""

    groups: tuple[OffloadingGroupConfig, ...]
    #: KV bytes one worker stores per block.
    worker_kv_bytes_per_block: int
    #: Whether the scheduler publishes KV cache events (the tier should too).
    enable_kv_cache_events: bool
    #: The connector's ``kv_connector_extra_config``.
    extra_config: Mapping[str, Any]
    #: This engine's identifier (one per data-parallel rank).
    engine_id: str
    model: OffloadingModelConfig
    cache: OffloadingCacheConfig
    parallel: OffloadingParallelConfig
    #: Whether every worker's offloaded bytes per block are identical (one host copy).
    replicated_layout: bool = False
    #: Whether the canonical per-layer host layout was asked for.
    canonical_layout: bool = False
    #: The worker KV cache's layout name.
    kv_cache_layout: str | None = None
