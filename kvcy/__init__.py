"""kvcy: a Cython-accelerated re-implementation of vLLM's v1 KV-cache manager.

Same decisions as vLLM 0.33.0, bit for bit, with the hot paths (free queue,
block pool, cache-hit search, allocation, hashing) compiled.  ``IMPLEMENTATION``
says which twin is live: ``"cython"`` or ``"python"`` (see ``kvcy._fast``).
"""

import logging

from kvcy._fast import IMPLEMENTATION
from kvcy.config import CacheConfig, KVCacheSettings
from kvcy.kv_cache_interface import (
    ChunkedLocalAttentionSpec,
    CrossAttentionSpec,
    FullAttentionSpec,
    KVCacheConfig,
    KVCacheGroupSpec,
    KVCacheLayout,
    KVCacheSpec,
    KVCacheTensor,
    MambaSpec,
    MLAAttentionSpec,
    SlidingWindowSpec,
)
from kvcy.kv_cache_manager import KVCacheBlocks, KVCacheManager
from kvcy.kv_events import AllBlocksCleared, BlockRemoved, BlockStored
from kvcy.metrics import CachingMetrics, PrefixCacheStats, PrefixCachingMetrics
from kvcy.request import LoRARequest, MultiModalFeatureSpec, PlaceholderRange, Request, RequestStatus

__version__ = "0.1.0"

# A library logs; the application decides where that goes.
logging.getLogger("kvcy").addHandler(logging.NullHandler())

__all__ = [
    "IMPLEMENTATION",
    "AllBlocksCleared",
    "BlockRemoved",
    "BlockStored",
    "CacheConfig",
    "CachingMetrics",
    "ChunkedLocalAttentionSpec",
    "CrossAttentionSpec",
    "FullAttentionSpec",
    "KVCacheConfig",
    "KVCacheGroupSpec",
    "KVCacheLayout",
    "KVCacheSettings",
    "KVCacheSpec",
    "KVCacheTensor",
    "MLAAttentionSpec",
    "MambaSpec",
    "SlidingWindowSpec",
    "KVCacheBlocks",
    "KVCacheManager",
    "PrefixCacheStats",
    "PrefixCachingMetrics",
    "LoRARequest",
    "MultiModalFeatureSpec",
    "PlaceholderRange",
    "Request",
    "RequestStatus",
    "__version__",
]
