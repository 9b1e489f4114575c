"""What the CPU tier shares with its workers and its metrics: specs, metric names, info.

Mirrors ``vllm.v1.kv_offload.cpu.common`` of vLLM 0.33.0, which re-exports these names
(:mod:`kvcy.kv_offload.cpu.common`).  They are defined here, outside the ``cpu`` package,
because the offloading twins use them and ``kvcy.kv_offload.cpu`` imports the twins: this
module imports nothing from kvcy but :mod:`kvcy.kv_offload.base`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kvcy.kv_offload.base import BlockIDsLoadStoreSpec, ConfigInfo

__all__ = ["CPULoadStoreSpec", "CPUOffloadingInfo", "CPUOffloadingMetrics"]


class CPULoadStoreSpec(BlockIDsLoadStoreSpec):
    """Chunks of the CPU cache to load from or store into.

    ``block_ids`` (also readable as ``chunk_ids``) are CPU cache chunk
    numbers, ``0 .. num_chunks - 1``, as a numpy ``int32`` array.
    """

    @property
    def chunk_ids(self):
        """The chunk numbers: the same array as ``block_ids``."""
        return self.block_ids


class CPUOffloadingMetrics:
    """Names of the metrics ``CPUOffloadingManager.get_stats()`` reports."""

    #: Gauge: chunks pinned by loads or being written, over capacity.
    CPU_CACHE_USAGE_PERC = "vllm:kv_offload_cpu_cache_usage_perc"
    #: Histogram: number of chunks each ``prepare_store`` tried to allocate.
    CPU_ALLOCATION_SIZE = "vllm:kv_offload_cpu_allocation_size"
    #: Gauge: chunks being written, over capacity.
    CPU_CACHE_WRITE_USAGE_PERC = "vllm:kv_offload_cpu_cache_write_usage_perc"
    #: Gauge: chunks pinned by loads, over capacity.
    CPU_CACHE_READ_USAGE_PERC = "vllm:kv_offload_cpu_cache_read_usage_perc"
    #: Counter: offered keys not stored because of ``store_threshold``.
    STORES_SKIPPED = "vllm:kv_offload_stores_skipped"


@dataclass(frozen=True)
class CPUOffloadingInfo(ConfigInfo):
    """Static facts about one CPU tier, reported by ``config_info()`` as info-metric labels.

    ``CPUOffloadingManager(info=...)`` reports ``[info.as_config_info()]``.
    """

    #: Chunks in the tier (chunks, not GPU blocks).
    cpu_num_chunks: int
    #: GPU blocks per chunk.
    cpu_blocks_per_chunk: int
    #: Bytes of the tier, chunk padding included.
    cpu_kv_cache_size_bytes: int
    #: KV tokens the tier holds for requests of ``max_model_len`` tokens (``None``: unknown).
    cpu_kv_cache_size_tokens: int | None

    @classmethod
    def from_config(cls, config: Any, num_chunks: int, kv_bytes_per_chunk: int) -> CPUOffloadingInfo:
        """The facts of a tier of ``num_chunks`` chunks under an offloading config.

        ``config`` is read as vLLM's ``OffloadingConfig``: ``config.cache.blocks_per_chunk``,
        ``config.model.max_model_len`` and, per KV cache group of ``config.groups``,
        ``tokens_per_block`` and ``sliding_window_size_in_chunks``.
        """
        return cls(
            cpu_num_chunks=num_chunks,
            cpu_blocks_per_chunk=config.cache.blocks_per_chunk,
            cpu_kv_cache_size_bytes=num_chunks * kv_bytes_per_chunk,
            cpu_kv_cache_size_tokens=_kv_cache_size_tokens(config, num_chunks),
        )


# Named and pickled where vLLM keeps them.
for _cls in (CPULoadStoreSpec, CPUOffloadingMetrics, CPUOffloadingInfo):
    _cls.__module__ = "kvcy.kv_offload.cpu.common"
del _cls


def _kv_cache_size_tokens(config: Any, num_chunks: int) -> int | None:
    """Tokens the tier holds at ``max_model_len``: chunks over chunks per full-length request."""
    max_model_len = config.model.max_model_len
    if max_model_len <= 0 or not config.groups:
        return None
    per_request = 0
    for group in config.groups:
        chunk_tokens = group.tokens_per_block * config.cache.blocks_per_chunk
        chunks = -(-max_model_len // chunk_tokens)
        window = group.sliding_window_size_in_chunks
        per_request += chunks if window is None else min(chunks, window)
    return num_chunks * max_model_len // per_request
