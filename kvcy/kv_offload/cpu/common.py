"""What the CPU tier shares with its workers and its metrics: specs, metric names, info.

Mirrors ``vllm.v1.kv_offload.cpu.common`` of vLLM 0.33.0.
"""

from __future__ import annotations

from kvcy.kv_offload.base import BlockIDsLoadStoreSpec

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


class CPUOffloadingInfo(dict):
    """Labels describing one CPU tier (e.g. its size), reported by ``config_info()``.

    A plain ``dict`` of ``str`` to ``str``; ``config_info()`` returns
    ``[dict(info)]``, or ``[{}]`` when the manager was built without one.
    """
