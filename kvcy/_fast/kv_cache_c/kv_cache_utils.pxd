# kv_cache_c/kv_cache_utils.pxd: the declarations of KVCacheBlock: C fields and cdef/cpdef method
# signatures (implemented in kv_cache_utils.pyx).
# Included by kvcy/_fast/_kv_cache_c.pxd.

cdef class KVCacheBlock:
    # 64 bytes in all, one cache line (a pool of 10^6 blocks is streamed
    # through on every pass of the free queue): no cdef methods (no vtable
    # pointer), a 32-bit id (vLLM's block tables are int32) and reference
    # count beside the null flag, and the 4-byte ids packed together.  The
    # low half of the cache key's table hash is kept, so an eviction finds
    # the key's slot without reading the hash bytes (a slot's 64-bit hash
    # is kept in the table; capacities stay below 2**32 slots).
    cdef readonly int32_t block_id  # (the pool and its queue own the id, the count and the flag)
    cdef int32_t _ref_cnt  # ref_cnt: assigned through its property, checked
    cdef readonly bint is_null
    cdef uint32_t _key_h  # low 32 bits of kvcy_key_hash(_hash, _group), while _hash is set
    cdef object _hash
    cdef Py_ssize_t _num_tokens  # tokens up to the block's end when cached; -1: None
    # Where the block was last queued (see FreeKVCacheBlockQueue).
    cdef int64_t _pos  # its position in that queue
    cdef uint32_t _queue_id  # that queue's id; 0: never queued
    cdef uint32_t _group  # KV-cache group id of the cache key (4 bytes in the key)
