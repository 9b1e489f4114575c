"""The KV-cache manager a scheduler embeds (vLLM 0.33.0's ``KVCacheManager``).

Re-exports the selected twin (``kvcy.IMPLEMENTATION``) under vLLM's names.
"""

from kvcy._fast import kv_cache as _impl

KVCacheBlocks = _impl.KVCacheBlocks
KVCacheManager = _impl.KVCacheManager

__all__ = ["KVCacheBlocks", "KVCacheManager"]
