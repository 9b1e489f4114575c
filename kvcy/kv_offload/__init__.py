"""KV-cache offloading: vLLM 0.33.0's offloading API and its CPU tier.

* :mod:`kvcy.kv_offload.base` -- the abstract API (``OffloadKey``,
  ``ReqContext``, ``LookupResult``, load/store specs, ``OffloadingEvent``,
  ``OffloadingManager``, ``OffloadingSpec``);
* :mod:`kvcy.kv_offload.cpu` -- the CPU tier's scheduler-side manager
  (``CPUOffloadingManager``) and its cache policies (``"lru"``, ``"arc"``);
* :mod:`kvcy.kv_offload.metrics` -- ``OffloadingConnectorStats``.
"""

from kvcy.kv_offload.base import (
    BlockIDsLoadStoreSpec,
    CacheHitSource,
    GPULoadStoreSpec,
    LoadStoreSpec,
    Locality,
    LookupResult,
    Medium,
    OffloadingEvent,
    OffloadingManager,
    OffloadingSpec,
    OffloadKey,
    OffloadPolicy,
    PrepareStoreOutput,
    ReqContext,
    RequestOffloadingContext,
    ScheduleEndContext,
    TierFilter,
    TierMatcher,
    get_offload_block_hash,
    get_offload_group_idx,
    make_offload_key,
)
from kvcy.kv_offload.metrics import OffloadingConnectorStats

__all__ = [
    "BlockIDsLoadStoreSpec",
    "CacheHitSource",
    "GPULoadStoreSpec",
    "LoadStoreSpec",
    "Locality",
    "LookupResult",
    "Medium",
    "OffloadKey",
    "OffloadPolicy",
    "OffloadingConnectorStats",
    "OffloadingEvent",
    "OffloadingManager",
    "OffloadingSpec",
    "PrepareStoreOutput",
    "ReqContext",
    "RequestOffloadingContext",
    "ScheduleEndContext",
    "TierFilter",
    "TierMatcher",
    "get_offload_block_hash",
    "get_offload_group_idx",
    "make_offload_key",
]
