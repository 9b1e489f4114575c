"""Per-attention-type block bookkeeping (full, sliding window, chunked local, Mamba, cross).

Re-exports the selected twin under vLLM's names.
"""

from typing import TYPE_CHECKING

from kvcy._fast import kv_cache as _impl

if TYPE_CHECKING:
    # Type checkers see the pure-Python twin (the compiled one has the same API:
    # kvcy/_fast/_kv_cache_c.pyi); at run time the selected twin's classes.
    from kvcy._fast._kv_cache_py import (
        SingleTypeKVCacheManager,
        FullAttentionManager,
        SlidingWindowManager,
        ChunkedLocalAttentionManager,
        MambaManager,
        CrossAttentionManager,
        spec_manager_map,
        get_manager_for_kv_cache_spec,
    )
else:
    SingleTypeKVCacheManager = _impl.SingleTypeKVCacheManager
    FullAttentionManager = _impl.FullAttentionManager
    SlidingWindowManager = _impl.SlidingWindowManager
    ChunkedLocalAttentionManager = _impl.ChunkedLocalAttentionManager
    MambaManager = _impl.MambaManager
    CrossAttentionManager = _impl.CrossAttentionManager
    spec_manager_map = _impl.spec_manager_map
    get_manager_for_kv_cache_spec = _impl.get_manager_for_kv_cache_spec

__all__ = [
    "ChunkedLocalAttentionManager",
    "CrossAttentionManager",
    "FullAttentionManager",
    "MambaManager",
    "SingleTypeKVCacheManager",
    "SlidingWindowManager",
    "get_manager_for_kv_cache_spec",
    "spec_manager_map",
]
