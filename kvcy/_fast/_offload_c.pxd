# Declarations of kvcy._fast._offload_c (Cython reads this file before
# _offload_c.pyx): the cdef classes of every concept, from offload_c/*.pxd,
# so each offload_c/*.pyx holds only its method implementations.

cimport cython
from cpython.object cimport PyObject
from libc.stdint cimport int64_t, uint32_t
from libcpp.vector cimport vector

include "offload_c/_common.pxd"
include "offload_c/request_order.pxd"
include "offload_c/chunk_status.pxd"
include "offload_c/cache_policy.pxd"
include "offload_c/lru_policy.pxd"
include "offload_c/arc_policy.pxd"
include "offload_c/access_record.pxd"
include "offload_c/manager.pxd"
include "offload_c/connector.pxd"
