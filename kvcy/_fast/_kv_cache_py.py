"""Pure-Python twin of the KV-cache block manager.

Everything that runs per block or per request lives here, twice (see
``_kv_cache_c.pyx``): blocks and the LRU free queue, the hash-to-block map,
the block pool, the single-type managers, the coordinators and the
``KVCacheManager`` engine.  The public modules (``kvcy.block_pool``,
``kvcy.kv_cache_manager``, ...) re-export the selected twin.

The code lives one concept per module in ``kvcy/_fast/kv_cache_py/``; this
module assembles their public names (and ``_manager_class``, which the tests
call on both twins) into the twin the selector loads.

Behaviour follows vLLM 0.33.0 decision for decision; the golden vectors in
``shared/golden`` are the oracle.
"""

from __future__ import annotations

from kvcy._fast.kv_cache_py._common import cdiv
from kvcy._fast.kv_cache_py.block_pool_block_map import BlockHashToBlockMap, resolve_block_hashes
from kvcy._fast.kv_cache_py.block_pool import BlockPool, logger
from kvcy._fast.kv_cache_py.kv_cache_coordinator import (
    HybridKVCacheCoordinator,
    KVCacheCoordinator,
    KVCacheCoordinatorNoPrefixCache,
    UnitaryKVCacheCoordinator,
    get_kv_cache_coordinator,
    replay_boundaries,
)
from kvcy._fast.kv_cache_py.kv_cache_utils_free_queue import FreeKVCacheBlockQueue
from kvcy._fast.kv_cache_py.kv_cache_utils import KVCacheBlock
from kvcy._fast.kv_cache_py.kv_cache_manager_blocks import KVCacheBlocks
from kvcy._fast.kv_cache_py.kv_cache_manager import KVCacheManager
from kvcy._fast.kv_cache_py.request import Request
from kvcy._fast.kv_cache_py.single_type_kv_cache_manager_local_attention import (
    ChunkedLocalAttentionManager,
    CircularBufferManager,
    RSWAManager,
    SlidingWindowManager,
)
from kvcy._fast.kv_cache_py.single_type_kv_cache_manager_factory import (
    _manager_class,
    get_manager_for_kv_cache_spec,
    spec_manager_map,
)
from kvcy._fast.kv_cache_py.single_type_kv_cache_manager_mamba import (
    MambaManager,
    eagle_proof_margin,
    get_mamba_prefill_checkpoint_position,
    is_mamba_prefill_checkpoint_valid,
    partial_hash_hits_enabled,
)
from kvcy._fast.kv_cache_py.single_type_kv_cache_manager import (
    CrossAttentionManager,
    FullAttentionManager,
    SingleTypeKVCacheManager,
    SinkFullAttentionManager,
)

IMPLEMENTATION = "python"

__all__ = [
    "IMPLEMENTATION",
    "BlockHashToBlockMap",
    "BlockPool",
    "ChunkedLocalAttentionManager",
    "CircularBufferManager",
    "CrossAttentionManager",
    "FreeKVCacheBlockQueue",
    "FullAttentionManager",
    "HybridKVCacheCoordinator",
    "KVCacheBlock",
    "KVCacheBlocks",
    "KVCacheCoordinator",
    "KVCacheCoordinatorNoPrefixCache",
    "KVCacheManager",
    "MambaManager",
    "RSWAManager",
    "Request",
    "SingleTypeKVCacheManager",
    "SinkFullAttentionManager",
    "SlidingWindowManager",
    "UnitaryKVCacheCoordinator",
    "cdiv",
    "eagle_proof_margin",
    "get_kv_cache_coordinator",
    "get_manager_for_kv_cache_spec",
    "get_mamba_prefill_checkpoint_position",
    "is_mamba_prefill_checkpoint_valid",
    "logger",
    "partial_hash_hits_enabled",
    "replay_boundaries",
    "resolve_block_hashes",
    "spec_manager_map",
]
