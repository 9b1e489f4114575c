# kv_cache_c/kv_cache_utils_free_queue.pxd: the declarations of FreeKVCacheBlockQueue: C fields and cdef/cpdef
# method signatures (implemented in kv_cache_utils_free_queue.pyx).
# Included by kvcy/_fast/_kv_cache_c.pxd.

@cython.final
cdef class FreeKVCacheBlockQueue:
    cdef public Py_ssize_t num_free_blocks
    cdef readonly KVCacheBlock fake_free_list_head
    cdef readonly KVCacheBlock fake_free_list_tail
    cdef PyObject **_ring
    cdef int64_t _mask  # array size - 1 (the size is a power of 2)
    cdef int64_t _head  # position of the first entry
    cdef int64_t _tail  # position after the last entry
    cdef int64_t _holes  # NULL entries within [_head, _tail)
    cdef uint32_t _id
    cdef object __weakref__  # (the id -> queue registry holds weak references)

    cdef void _release_blocks(self) noexcept
    cdef inline bint _holds(self, KVCacheBlock block) noexcept
    cdef inline bint _is_fake_end(self, KVCacheBlock block) noexcept
    cdef int _ensure_room(self, Py_ssize_t extra) except -1
    cdef void _compact(self) noexcept
    cdef void _drop_taken(self, int64_t start, Py_ssize_t count) noexcept
    cdef object _neighbour(self, KVCacheBlock block, bint after)
    cdef int _queued_anywhere(self, KVCacheBlock block) except -1
    cpdef KVCacheBlock popleft(self)
    cpdef list popleft_n(self, Py_ssize_t n)
    cdef list _popleft_n(self, Py_ssize_t n)
    cdef void _prefetch_head(self, Py_ssize_t n) noexcept
    cpdef remove(self, KVCacheBlock block)
    cdef inline int _remove(self, KVCacheBlock block) except -1
    cpdef append(self, KVCacheBlock block)
    cpdef append_n(self, list blocks)
    cpdef prepend_n(self, list blocks)
    cdef int _insert_n(self, list blocks, bint at_head) except -1
    cdef int _refuse_held(self, int64_t base, list blocks) except -1
    cpdef list get_all_free_blocks(self)
