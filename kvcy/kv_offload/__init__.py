"""KV-cache offloading: vLLM 0.33.0's offloading API and its CPU tier.

* :mod:`kvcy.kv_offload.base` -- the abstract API (``OffloadKey``,
  ``ReqContext``, ``LookupResult``, load/store specs, ``OffloadingEvent``,
  ``OffloadingManager``, ``OffloadingSpec``);
* :mod:`kvcy.kv_offload.cpu` -- the CPU tier's scheduler-side manager
  (``CPUOffloadingManager``) and its cache policies (``"lru"``, ``"arc"``);
* :mod:`kvcy.kv_offload.config` -- ``OffloadingConfig`` and its parts, what an
  ``OffloadingSpec`` is built from;
* :mod:`kvcy.kv_offload.metrics` -- ``OffloadingConnectorStats``;
* :mod:`kvcy.kv_offload.canonical` -- ``CanonicalKVCacheTensor``,
  ``CanonicalKVCacheRef``, ``CanonicalKVCaches`` and ``canonicalize_kv_caches``
  (vLLM keeps these in ``base``; here they need torch, so they load on first use);
* :mod:`kvcy.kv_offload.worker` -- the transfer side (``OffloadingHandler``,
  ``OffloadingWorker``, ``CPUOffloadingWorker``, ``TransferSpec``,
  ``TransferResult``), also torch-only and loaded on first use.

The scheduler side (everything above but canonical caches and the worker) needs
no torch.
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

# Torch-backed names, imported on first access so the scheduler side stays torch-free.
_LAZY = {
    "CanonicalKVCacheRef": "kvcy.kv_offload.canonical",
    "CanonicalKVCacheTensor": "kvcy.kv_offload.canonical",
    "CanonicalKVCaches": "kvcy.kv_offload.canonical",
    "canonicalize_kv_caches": "kvcy.kv_offload.canonical",
    "CPUOffloadingWorker": "kvcy.kv_offload.worker",
    "OffloadingHandler": "kvcy.kv_offload.worker",
    "OffloadingWorker": "kvcy.kv_offload.worker",
    "TransferResult": "kvcy.kv_offload.worker",
    "TransferSpec": "kvcy.kv_offload.worker",
}


def __getattr__(name: str) -> object:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(module), name)


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
