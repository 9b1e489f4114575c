# Declarations of kvcy._fast._kv_cache_c (Cython reads this file before
# _kv_cache_c.pyx): the cdef classes of every concept, from kv_cache_c/*.pxd,
# so each kv_cache_c/*.pyx holds only its method implementations.

cimport cython
from cpython.object cimport PyObject, PyTypeObject
from libc.stdint cimport int32_t, int64_t, uint32_t, uint64_t

include "kv_cache_c/_common.pxd"
include "kv_cache_c/request.pxd"
include "kv_cache_c/kv_cache_utils.pxd"
include "kv_cache_c/kv_cache_utils_free_queue.pxd"
include "kv_cache_c/block_pool_block_map.pxd"
include "kv_cache_c/block_pool.pxd"
include "kv_cache_c/single_type_kv_cache_manager.pxd"
include "kv_cache_c/single_type_kv_cache_manager_mamba.pxd"
include "kv_cache_c/single_type_kv_cache_manager_local_attention.pxd"
include "kv_cache_c/single_type_kv_cache_manager_factory.pxd"
include "kv_cache_c/kv_cache_coordinator.pxd"
include "kv_cache_c/kv_cache_manager_blocks.pxd"
include "kv_cache_c/kv_cache_manager.pxd"
