# offload_c/policies_arc.pxd: the declarations of ARCCachePolicy: C fields and cdef method
# signatures (implemented in policies_arc.pyx).
# Included by kvcy/_fast/_offload_c.pxd.

cdef class ARCCachePolicy(CachePolicy):
    cdef _DList _t1
    cdef _DList _t2
    cdef _DList _b1
    cdef _DList _b2
    # One map for resident and ghost keys (CachePolicy._chunks): a key's one
    # lookup says resident, ghost or neither, and an eviction turns its entry
    # into a ghost in place.
    cdef double _target

    cdef inline _DList _list_of(self, _Node n)
    cdef int c_insert(self, bytes key, ChunkStatus st, object ctx, _Positions pos,
                      bint absent=*) except -1
    cdef int c_remove(self, bytes key) except -1
    cdef int _ghost_hit(self, object key) except -1
    cdef void _ghost_node_hit(self, _Node gn) noexcept
    cdef int c_touch(self, list keys, object ctx) except -1
    cdef int c_on_store_miss(self, list keys, object ctx) except -1
    cdef int c_on_request_access(self, list keys, object ctx, _Positions pos) except -1
    cdef int c_ghost_hits(self, list nodes) except -1
    cdef int c_insert_new_ghosts(self, list keys, vector[Py_ssize_t]& ids, list ghosts) except -1
    cdef int _finish(self, list order, object insertion_only, object reused) except -1
    cdef int c_on_request_finished(self, list groups, set insertion_only, set reused,
                                   object ctx, _Positions pos) except -1
    cdef int c_finish_flags(self, list keys, list flags, vector[Py_ssize_t]& order) except -1
    cdef int c_mark_evictable(self, bytes key) except -1
    cdef int c_mark_non_evictable(self, bytes key) except -1
    cdef list c_evict(self, Py_ssize_t n, set protected)
    cdef list c_evict_in_place(self, Py_ssize_t n, set protected)
    cdef list _evict(self, Py_ssize_t n, set protected, bint in_place)
    cdef int c_clear(self) except -1
    cdef object _snapshot(self, _DList lst, bint with_chunks)
