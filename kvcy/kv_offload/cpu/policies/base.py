"""The cache-policy interface and per-chunk state (``vllm.v1.kv_offload.cpu.policies.base``)."""

from kvcy.kv_offload._twin import twin as _twin

ChunkStatus = _twin.ChunkStatus
CachePolicy = _twin.CachePolicy
order_request_keys = _twin.order_request_keys

__all__ = ["CachePolicy", "ChunkStatus", "order_request_keys"]
