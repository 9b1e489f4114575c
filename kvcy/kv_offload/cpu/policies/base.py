"""The cache-policy interface and per-chunk state (``vllm.v1.kv_offload.cpu.policies.base``).

Exports, under vLLM 0.33.0's names:

* ``ChunkStatus`` (stem ``policies_base_chunk_status``): one chunk's id and reference count.
* ``CachePolicy`` (stem ``policies_base``): what a policy is told and asked.
* ``order_request_keys`` (stem ``policies_base_request_order``): a request's keys head to tail.

A stem ``S`` above is ``kvcy/_fast/offload_c/S.pyx`` (compiled, ``include``-d
into the extension ``kvcy._fast._offload_c``) and ``kvcy/_fast/offload_py/S.py``
(pure Python): the two twins of one concept.

Which twin: :mod:`kvcy._fast` picks one at import, for all of kvcy (the
offloading twin is loaded on first use, as ``kvcy._fast.offload``):
the compiled one when it imports, the pure-Python one with
``KVCY_NO_EXTENSIONS=1`` or when the extension is missing or broken
(``KVCY_REQUIRE_EXTENSIONS=1`` makes that an error); ``kvcy.IMPLEMENTATION``
says which (``"cython"`` / ``"python"``).
"""

from kvcy._fast import offload as _twin

ChunkStatus = _twin.ChunkStatus
CachePolicy = _twin.CachePolicy
order_request_keys = _twin.order_request_keys

__all__ = ["CachePolicy", "ChunkStatus", "order_request_keys"]
