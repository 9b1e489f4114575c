"""The CPU offloading tier (``vllm.v1.kv_offload.cpu``).

* :mod:`~kvcy.kv_offload.cpu.common` -- ``CPULoadStoreSpec``, metric names;
* :mod:`~kvcy.kv_offload.cpu.manager` -- ``CPUOffloadingManager``;
* :mod:`~kvcy.kv_offload.cpu.policies` -- ``ChunkStatus``, ``CachePolicy``,
  ``LRUCachePolicy``, ``ARCCachePolicy``, ``CachePolicyFactory``.

The manager and the policies are the live twin's classes (compiled, or the
pure-Python ``kvcy._fast._offload_py``), as :mod:`kvcy._fast` selects them.
"""

from kvcy.kv_offload.cpu.common import CPULoadStoreSpec, CPUOffloadingInfo, CPUOffloadingMetrics
from kvcy.kv_offload.cpu.manager import CPUOffloadingManager
from kvcy.kv_offload.cpu.policies import (
    ARCCachePolicy,
    CachePolicy,
    CachePolicyFactory,
    ChunkStatus,
    LRUCachePolicy,
    order_request_keys,
)

__all__ = [
    "ARCCachePolicy",
    "CPULoadStoreSpec",
    "CPUOffloadingInfo",
    "CPUOffloadingManager",
    "CPUOffloadingMetrics",
    "CachePolicy",
    "CachePolicyFactory",
    "ChunkStatus",
    "LRUCachePolicy",
    "order_request_keys",
]
