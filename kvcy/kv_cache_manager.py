"""The KV-cache manager a scheduler embeds (vLLM 0.33.0's ``KVCacheManager``).

Re-exports the selected twin (``kvcy.IMPLEMENTATION``) under vLLM's names.
"""

from typing import TYPE_CHECKING

from kvcy._fast import kv_cache as _impl

if TYPE_CHECKING:
    # Type checkers see the pure-Python twin (the compiled one has the same API:
    # kvcy/_fast/_kv_cache_c.pyi); at run time the selected twin's classes.
    from kvcy._fast._kv_cache_py import KVCacheBlocks, KVCacheManager
else:
    KVCacheBlocks = _impl.KVCacheBlocks
    KVCacheManager = _impl.KVCacheManager

__all__ = ["KVCacheBlocks", "KVCacheManager"]
