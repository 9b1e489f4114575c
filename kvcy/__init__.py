"""kvcy: a Cython-accelerated re-implementation of vLLM's v1 KV-cache manager.

Same decisions as vLLM 0.33.0, bit for bit, with the hot paths (free queue,
block pool, cache-hit search, allocation, hashing) compiled.  ``IMPLEMENTATION``
says which twin is live: ``"cython"`` or ``"python"`` (see ``kvcy._fast``).
"""

from kvcy._fast import IMPLEMENTATION
from kvcy.request import LoRARequest, MultiModalFeatureSpec, PlaceholderRange, Request, RequestStatus

__version__ = "0.1.0"

__all__ = [
    "IMPLEMENTATION",
    "LoRARequest",
    "MultiModalFeatureSpec",
    "PlaceholderRange",
    "Request",
    "RequestStatus",
    "__version__",
]
