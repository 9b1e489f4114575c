"""The block pool: allocation, freeing, caching and lazy eviction of KV-cache blocks.

Implemented twice (``kvcy._fast._kv_cache_c`` / ``_kv_cache_py``); this module
re-exports the selected twin under vLLM's names.
"""

from typing import TYPE_CHECKING

from kvcy._fast import kv_cache as _impl

if TYPE_CHECKING:
    # Type checkers see the pure-Python twin (the compiled one has the same API:
    # kvcy/_fast/_kv_cache_c.pyi); at run time the selected twin's classes.
    from kvcy._fast._kv_cache_py import BlockHashToBlockMap, BlockPool
else:
    BlockHashToBlockMap = _impl.BlockHashToBlockMap
    BlockPool = _impl.BlockPool

__all__ = ["BlockHashToBlockMap", "BlockPool"]
