"""Cache policies of the CPU tier: ``"lru"`` (request-ranked LRU) and ``"arc"``.

The classes are the live twin's (``kvcy._fast.offload``).
"""

from kvcy.kv_offload.cpu.policies.arc import ARCCachePolicy
from kvcy.kv_offload.cpu.policies.base import CachePolicy, ChunkStatus, order_request_keys
from kvcy.kv_offload.cpu.policies.factory import CachePolicyFactory
from kvcy.kv_offload.cpu.policies.lru import LRUCachePolicy

__all__ = [
    "ARCCachePolicy",
    "CachePolicy",
    "CachePolicyFactory",
    "ChunkStatus",
    "LRUCachePolicy",
    "order_request_keys",
]
