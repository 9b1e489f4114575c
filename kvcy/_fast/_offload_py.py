"""Pure-Python twin of the CPU offloading tier's scheduler-side hot paths.

The CPU tier's manager (``CPUOffloadingManager``), its two cache policies
(``LRUCachePolicy``: request-ranked LRU, ``ARCCachePolicy``: adaptive
replacement) and the per-chunk state (``ChunkStatus``) live twice: here and in
``_offload_c.pyx``, with the same names, signatures, docstrings and messages.
The public modules under ``kvcy.kv_offload.cpu`` re-export the selected twin
(``kvcy._fast``).

The code lives one concept per module in ``kvcy/_fast/offload_py/`` (the
compiled twin's ``kvcy/_fast/offload_c/`` has the same stems); this module
assembles their public names into the twin the selector loads.

Behaviour follows vLLM 0.33.0's ``vllm.v1.kv_offload.cpu`` decision for
decision, as pinned down by section 5 of ``shared/golden/README.md`` and the
vectors in ``shared/golden/offload.jsonl``.  Where vLLM fails a call half way
(an ``AssertionError`` after some keys were already pinned or recorded), this
twin checks every key first, so the same error is raised with no state
changed.

What both twins refuse, before changing anything, and how:

* a key that is not ``bytes`` (``TypeError``) or shorter than 4 bytes
  (``ValueError``), in every method; a bare ``bytes``/``str`` where a key list
  is expected (``TypeError``);
* a ``req_context`` that is not a ``ReqContext`` where it is used
  (``prepare_store``, a recording ``prepare_load``, ``on_new_request``,
  ``on_request_finished``): ``TypeError``;
* a key offered twice in one ``prepare_store`` (``ValueError``: vLLM would
  give it two chunks);
* vLLM's own ``AssertionError``s, with its messages: ``Chunk {key!r} not found
  in cache`` / ``is not ready for reading`` (``prepare_load``), ``Chunk {key!r}
  not found`` / ``ref_cnt is already 0`` (``complete_load``, counting repeats
  of a key within the call), ``New cache keys observed after request
  finalization`` (``prepare_load`` / ``prepare_store``, for exactly the keys
  vLLM would record);
* bad constructor arguments: ``num_chunks``, ``store_threshold`` and
  ``max_tracker_size`` must be non-negative ints (``TypeError`` /
  ``ValueError``), an unknown policy name is the factory's ``ValueError``.

``complete_store`` of keys that are not write-pending is a no-op, as in vLLM.

The golden replayer's ``check`` reads the same internals vLLM's does:
``manager._policy``, ``_free_list``, ``_num_allocated_chunks``,
``_num_evictable_cache_chunks``, ``_num_write_pending_chunks``, ``counts``;
``LRUCachePolicy.chunks`` and ``._ranks``; ``ARCCachePolicy.t1``, ``.t2``,
``.b1``, ``.b2`` and ``.target_t1_size``.
"""

from __future__ import annotations

from kvcy._fast.offload_py.policies_arc import ARCCachePolicy
from kvcy._fast.offload_py.policies_base import CachePolicy
from kvcy._fast.offload_py.policies_base_chunk_status import ChunkStatus
from kvcy._fast.offload_py.offloading_connector import ConnectorRequest, ReplayConnector
from kvcy._fast.offload_py.policies_lru import LRUCachePolicy
from kvcy._fast.offload_py.manager import CPUOffloadingManager
from kvcy._fast.offload_py.policies_base_request_order import order_request_keys

__all__ = [
    "ARCCachePolicy",
    "CPUOffloadingManager",
    "CachePolicy",
    "ChunkStatus",
    "ConnectorRequest",
    "IMPLEMENTATION",
    "LRUCachePolicy",
    "ReplayConnector",
    "order_request_keys",
]

IMPLEMENTATION = "python"
