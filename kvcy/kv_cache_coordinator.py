"""Coordinators over the KV-cache groups: no prefix cache, unitary, hybrid.

Re-exports the selected twin under vLLM's names.
"""

from typing import TYPE_CHECKING

from kvcy._fast import kv_cache as _impl

if TYPE_CHECKING:
    # Type checkers see the pure-Python twin (the compiled one has the same API:
    # kvcy/_fast/_kv_cache_c.pyi); at run time the selected twin's classes.
    from kvcy._fast._kv_cache_py import (
        KVCacheCoordinator,
        KVCacheCoordinatorNoPrefixCache,
        UnitaryKVCacheCoordinator,
        HybridKVCacheCoordinator,
        get_kv_cache_coordinator,
    )
else:
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
