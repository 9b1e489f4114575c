"""The block pool: allocation, freeing, caching and lazy eviction of KV-cache blocks.

Implemented twice (``kvcy._fast._kv_cache_c`` / ``_kv_cache_py``); this module
re-exports the selected twin under vLLM's names.
"""

from kvcy._fast import kv_cache as _impl

BlockHashToBlockMap = _impl.BlockHashToBlockMap
BlockPool = _impl.BlockPool

__all__ = ["BlockHashToBlockMap", "BlockPool"]
