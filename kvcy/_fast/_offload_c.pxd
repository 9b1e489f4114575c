# Declarations of kvcy._fast._offload_c (Cython reads this file before
# _offload_c.pyx): the cdef classes of every concept, from offload_c/*.pxd,
# so each offload_c/*.pyx holds only its method implementations.

cimport cython
from cpython.object cimport PyObject
from libc.stdint cimport int64_t, uint32_t
from libcpp.vector cimport vector

include "offload_c/_common.pxd"
include "offload_c/policies_base_request_order.pxd"
include "offload_c/policies_base_chunk_status.pxd"
include "offload_c/policies_base.pxd"
include "offload_c/policies_lru.pxd"
include "offload_c/policies_arc.pxd"
include "offload_c/manager_access_record.pxd"
include "offload_c/manager.pxd"
include "offload_c/offloading_connector.pxd"
