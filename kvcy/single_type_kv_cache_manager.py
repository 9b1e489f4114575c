"""Per-attention-type block bookkeeping (full, sliding window, chunked local, Mamba, cross).

Re-exports the selected twin under vLLM's names.
"""

from kvcy._fast import kv_cache as _impl

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
