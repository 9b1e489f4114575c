# kv_cache_c/block_pool_block_map.pxd: the declarations of BlockHashToBlockMap, _BlockHashView and the _Slot
# table entry: C fields and cdef/cpdef method signatures (implemented in block_pool_block_map.pyx).
# Included by kvcy/_fast/_kv_cache_c.pxd.

cdef struct _Slot:
    uint64_t h         # kvcy_key_hash of (key, gid)
    PyObject *key      # the block hash (bytes), owned; NULL: empty slot
    PyObject *value    # a KVCacheBlock, or a dict {block_id: block} when several share the key; owned
    uint32_t gid       # KV-cache group id


@cython.final
cdef class BlockHashToBlockMap:
    cdef _Slot *_slots
    cdef size_t _mask      # capacity - 1 (a power of two)
    cdef Py_ssize_t _len   # occupied slots
    # (An object field, so that the type takes part in the cycle collector:
    # its tp_traverse / tp_clear, installed below, see the table's references.)
    cdef object _gc_anchor

    cdef void _release_slots(self) noexcept
    cdef inline Py_ssize_t _find(self, PyObject *key, uint32_t gid, uint64_t h) noexcept
    cdef int _reserve(self, Py_ssize_t n) except -1
    cdef int _grow(self) except -1
    cdef int _rehash(self, size_t new_cap) except -1
    cdef inline void _delete_slot(self, size_t i) noexcept
    cdef inline uint64_t _hash_of(self, object block_hash, Py_ssize_t gid) except? 0
    cdef inline PyObject *_get_raw(self, PyObject *key, uint32_t gid) noexcept
    cdef inline PyObject *_get_hashed(self, PyObject *key, uint32_t gid, uint64_t h) noexcept
    cdef inline object _get(self, object block_hash, Py_ssize_t gid)
    cdef int _insert(self, object block_hash, Py_ssize_t gid, KVCacheBlock block) except -1
    cdef int _insert_hashed(self, PyObject *block_hash, uint32_t gid, uint64_t h, KVCacheBlock block) except -1
    cdef object _pop(self, object block_hash, Py_ssize_t gid, Py_ssize_t block_id)
    cdef inline void _prefetch(self, uint64_t h) noexcept
    cdef inline int _drop_block(self, KVCacheBlock block) except -1
    cdef inline int _remove_at(self, Py_ssize_t i, Py_ssize_t block_id) except -1
    cdef inline void _release_slot(self, size_t i) noexcept


cdef class _BlockHashView:
    cdef list _hashes
    cdef Py_ssize_t _scale
