# cython: language_level=3
"""Compiled twin of the KV-cache block manager (see ``_kv_cache_py.py``).

The same classes, methods, arguments and error messages as the pure-Python
twin, as typed ``cdef class``es: blocks and the free queue are linked through
C fields, the hot loops (allocation, freeing, touching, cache-hit search,
caching) run without Python attribute lookups, and the manager's public
methods validate their arguments before any state changes (bounds checks are
off in the build).

One extension module assembled from per-concept sources under
``kv_cache_c/`` with Cython ``include`` (as uvloop does), so the hot
paths still inline across concepts; each ``<stem>.pyx`` has a
``<stem>.pxd`` with its classes' declarations (``_kv_cache_c.pxd``
includes them):

* ``_common.pyx``: shared helpers, C-API externs and inline C
* ``request.pyx``: Request
* ``kv_cache_utils.pyx``: KVCacheBlock
* ``kv_cache_utils_free_queue.pyx``: FreeKVCacheBlockQueue
* ``block_pool_block_map.pyx``: BlockHashToBlockMap, resolve_block_hashes
* ``block_pool.pyx``: BlockPool
* ``single_type_kv_cache_manager.pyx``: SingleTypeKVCacheManager, the full (and sink)
  and cross-attention managers
* ``single_type_kv_cache_manager_mamba.pyx``: MambaManager (align mode, partial hits) and its helpers
* ``single_type_kv_cache_manager_local_attention.pyx``: the sliding-window and chunked-local managers
* ``single_type_kv_cache_manager_factory.pyx``: spec_manager_map, get_manager_for_kv_cache_spec
* ``kv_cache_coordinator.pyx``: the KV-cache coordinators
* ``kv_cache_manager_blocks.pyx``: KVCacheBlocks
* ``kv_cache_manager.pyx``: KVCacheManager
"""

import enum
import importlib
import logging
from types import MappingProxyType
from weakref import ref as _weakref

cimport cython
from cpython.dict cimport PyDict_GetItem, PyDict_Next
from cpython.long cimport PyLong_AsLongLongAndOverflow
from cpython.list cimport PyList_GET_ITEM, PyList_GET_SIZE, PyList_New
from cpython.tuple cimport PyTuple_Check, PyTuple_GET_SIZE
from cpython.object cimport PyObject, PyTypeObject, inquiry, traverseproc, visitproc
from libc.stdint cimport int32_t, int64_t, uint32_t, uint64_t
from libc.stdlib cimport calloc, free
from libc.string cimport memcpy

from kvcy._fast._hashing_c import generate_block_hash_extra_keys
from kvcy.kv_cache_interface import (
    AttentionSpec,
    ChunkedLocalAttentionSpec,
    CircularBufferSpec,
    CrossAttentionSpec,
    EncoderOnlyAttentionSpec,
    FullAttentionSpec,
    MambaSpec,
    RSWASpec,
    SinkFullAttentionSpec,
    SlidingWindowSpec,
    get_kv_cache_spec_kind,
    get_kv_cache_spec_sliding_window,
)
from kvcy.kv_cache_interface.hisparse import check_no_hisparse_groups, check_no_hisparse_spec
from kvcy.kv_events import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    default_use_int_block_hashes,
    external_block_hash,
    untag_extra_keys,
)
from kvcy.metrics import PrefixCacheStats
from kvcy._fast._request_tables import _BlockTable, _CountTable
from kvcy._request_types import (
    KVCacheBlockCopy,
    RequestStatus,
    SpecGroup,
    check_request_args,
    check_skip_reading_prefix_cache,
    validate_token_ids,
)

logger = logging.getLogger("kvcy")

IMPLEMENTATION = "cython"

include "kv_cache_c/_common.pyx"
include "kv_cache_c/request.pyx"
include "kv_cache_c/kv_cache_utils.pyx"
include "kv_cache_c/kv_cache_utils_free_queue.pyx"
include "kv_cache_c/block_pool_block_map.pyx"
include "kv_cache_c/block_pool.pyx"
include "kv_cache_c/single_type_kv_cache_manager.pyx"
include "kv_cache_c/single_type_kv_cache_manager_mamba.pyx"
include "kv_cache_c/single_type_kv_cache_manager_local_attention.pyx"
include "kv_cache_c/single_type_kv_cache_manager_factory.pyx"
include "kv_cache_c/kv_cache_coordinator.pyx"
include "kv_cache_c/kv_cache_manager_blocks.pyx"
include "kv_cache_c/kv_cache_manager.pyx"
