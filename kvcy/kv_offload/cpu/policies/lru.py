"""Request-ranked LRU (``vllm.v1.kv_offload.cpu.policies.lru``), registered as ``"lru"``."""

from kvcy.kv_offload._twin import twin as _twin

LRUCachePolicy = _twin.LRUCachePolicy

__all__ = ["LRUCachePolicy"]
