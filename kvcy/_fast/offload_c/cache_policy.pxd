# offload_c/cache_policy.pxd: the declarations of CachePolicy: C fields and the cdef methods
# the manager calls (implemented in cache_policy.pyx; the native policies override them).
# Included by kvcy/_fast/_offload_c.pxd.

cdef class CachePolicy:
    cdef readonly Py_ssize_t cache_capacity
    cdef dict _chunks       # native policies: every resident key -> its ChunkStatus
                            # (ARC: and every ghost key -> its ghost _Node, see _is_ghost)
    cdef bint _native       # LRUCachePolicy / ARCCachePolicy (C paths), else Python calls

    cdef inline ChunkStatus c_get(self, object key)
    cdef int c_insert(self, bytes key, ChunkStatus chunk, object ctx, _Positions pos,
                      bint absent=*) except -1
    cdef int c_insert_new(self, list keys, vector[Py_ssize_t]& ids, object ctx,
                          _Positions pos) except -1
    cdef int c_remove(self, bytes key) except -1
    cdef int c_touch(self, list keys, object ctx) except -1
    cdef int c_on_store_miss(self, list keys, object ctx) except -1
    cdef int c_on_request_access(self, list keys, object ctx, _Positions pos) except -1
    cdef int c_on_request_finished(self, list groups, set insertion_only, set reused,
                                   object ctx, _Positions pos) except -1
    cdef int c_mark_evictable(self, bytes key) except -1
    cdef int c_mark_non_evictable(self, bytes key) except -1
    cdef list c_evict(self, Py_ssize_t n, set protected)
    cdef int c_clear(self) except -1
