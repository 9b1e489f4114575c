# offload_c/policies_lru.pxd: the declarations of _LRURequestRanks and LRUCachePolicy: C fields
# and cdef method signatures (implemented in policies_lru.pyx).
# Included by kvcy/_fast/_offload_c.pxd.

@cython.final
cdef class _LRURequestRanks:
    cdef dict ranks


cdef class LRUCachePolicy(CachePolicy):
    # Ranks are (counter, 0) ("fresh": touch, a finished request, a key stored
    # without position) or (request rank, -position).  A fresh rank is newer
    # than every rank given before it, so fresh-ranked keys sit in a list in
    # rank order, appended in O(1); only request-ranked keys need the ordered
    # set.  Eviction merges the two (no rank is in both: each counter value is
    # either one fresh rank or one request's rank).
    cdef _DList _fresh          # fresh-ranked resident keys (where == 5), oldest first
    cdef KvcyRankSet _order     # request-ranked resident keys by (rank, key bytes)
    cdef int64_t _counter
    cdef int64_t _epoch
    cdef int64_t _owner
    cdef int64_t _erased        # entries ever taken out of _order (hints older than a change are dropped)

    cdef inline void _link_ranked(self, ChunkStatus st, int64_t a, int64_t b) except *
    cdef inline void _link_ranked_at(self, ChunkStatus st, int64_t a, int64_t b,
                                     KvcyRankSet.iterator hint) except *
    cdef inline void _link_fresh(self, ChunkStatus st) noexcept
    cdef inline void _unlink(self, ChunkStatus st) noexcept
    cdef inline void _refresh(self, ChunkStatus st) except *
    cdef int64_t _request_rank(self, object ctx) except -1
    cdef int c_insert(self, bytes key, ChunkStatus st, object ctx, _Positions pos,
                      bint absent=*) except -1
    cdef int c_insert_new(self, list keys, vector[Py_ssize_t]& ids, object ctx,
                          _Positions pos) except -1
    cdef int c_insert_new_noted(self, list keys, vector[Py_ssize_t]& ids, object ctx,
                                _Positions pos, list made) except -1
    cdef int c_remove(self, bytes key) except -1
    cdef int c_touch(self, list keys, object ctx) except -1
    cdef int c_on_store_miss(self, list keys, object ctx) except -1
    cdef int c_on_request_access(self, list keys, object ctx, _Positions pos) except -1
    cdef int c_on_request_finished(self, list groups, set insertion_only, set reused,
                                   object ctx, _Positions pos) except -1
    cdef int c_finish_keys(self, list keys, _Positions pos, list hints=*) except -1
    cdef int c_mark_evictable(self, bytes key) except -1
    cdef int c_mark_non_evictable(self, bytes key) except -1
    cdef list c_evict(self, Py_ssize_t n, set protected)
    cdef int c_clear(self) except -1
