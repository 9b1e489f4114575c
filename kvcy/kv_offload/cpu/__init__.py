"""The CPU offloading tier (``vllm.v1.kv_offload.cpu``).

* :mod:`~kvcy.kv_offload.cpu.common` -- ``CPULoadStoreSpec``, metric names;
* :mod:`~kvcy.kv_offload.cpu.manager` -- ``CPUOffloadingManager``;
* :mod:`~kvcy.kv_offload.cpu.policies` -- ``ChunkStatus``, ``CachePolicy``,
  ``LRUCachePolicy``, ``ARCCachePolicy``, ``CachePolicyFactory``.

The manager and the policies are the live twin's classes (compiled, or the
pure-Python ``kvcy._fast._offload_py``; see ``kvcy.kv_offload._twin``).
"""

from __future__ import annotations

from typing import Any

from kvcy.kv_offload.cpu.common import CPULoadStoreSpec, CPUOffloadingInfo, CPUOffloadingMetrics

# The twin-backed names are imported on first use: the twins themselves import
# kvcy.kv_offload.cpu.common, which runs this module first.
_LAZY = {
    "CPUOffloadingManager": "kvcy.kv_offload.cpu.manager",
    "ARCCachePolicy": "kvcy.kv_offload.cpu.policies",
    "CachePolicy": "kvcy.kv_offload.cpu.policies",
    "CachePolicyFactory": "kvcy.kv_offload.cpu.policies",
    "ChunkStatus": "kvcy.kv_offload.cpu.policies",
    "LRUCachePolicy": "kvcy.kv_offload.cpu.policies",
    "order_request_keys": "kvcy.kv_offload.cpu.policies",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))


__all__ = [
    "ARCCachePolicy",
    "CPULoadStoreSpec",
    "CPUOffloadingInfo",
    "CPUOffloadingManager",
    "CPUOffloadingMetrics",
    "CachePolicy",
    "CachePolicyFactory",
    "ChunkStatus",
    "LRUCachePolicy",
    "order_request_keys",
]
