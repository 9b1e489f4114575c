"""Coordinators over the KV-cache groups: no prefix cache, unitary, hybrid.

Re-exports the selected twin under vLLM's names.
"""

from kvcy._fast import kv_cache as _impl

KVCacheCoordinator = _impl.KVCacheCoordinator
KVCacheCoordinatorNoPrefixCache = _impl.KVCacheCoordinatorNoPrefixCache
UnitaryKVCacheCoordinator = _impl.UnitaryKVCacheCoordinator
HybridKVCacheCoordinator = _impl.HybridKVCacheCoordinator
get_kv_cache_coordinator = _impl.get_kv_cache_coordinator

__all__ = [
    "HybridKVCacheCoordinator",
    "KVCacheCoordinator",
    "KVCacheCoordinatorNoPrefixCache",
    "UnitaryKVCacheCoordinator",
    "get_kv_cache_coordinator",
]
