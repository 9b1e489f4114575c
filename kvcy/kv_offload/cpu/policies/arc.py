"""Adaptive replacement cache (``vllm.v1.kv_offload.cpu.policies.arc``), registered as ``"arc"``."""

from kvcy.kv_offload._twin import twin as _twin

ARCCachePolicy = _twin.ARCCachePolicy

__all__ = ["ARCCachePolicy"]
