"""What the CPU tier shares with its workers and its metrics: specs, metric names, info.

Mirrors ``vllm.v1.kv_offload.cpu.common`` of vLLM 0.33.0: ``CPULoadStoreSpec``,
``CPUOffloadingMetrics`` and ``CPUOffloadingInfo``, defined in ``kvcy.kv_offload._cpu_common``
(below the offloading twins, which use them) and named, pickled and documented as this module's.
"""

from kvcy.kv_offload._cpu_common import CPULoadStoreSpec, CPUOffloadingInfo, CPUOffloadingMetrics

__all__ = ["CPULoadStoreSpec", "CPUOffloadingInfo", "CPUOffloadingMetrics"]
