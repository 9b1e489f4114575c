# offload_c/policies_base_request_order.pxd: the declarations of _Positions (implemented in
# policies_base_request_order.pyx).
# Included by kvcy/_fast/_offload_c.pxd.

@cython.final
cdef class _Positions:
    cdef dict d
    cdef object getter

    cdef int get(self, object key, int64_t *out) except -1
