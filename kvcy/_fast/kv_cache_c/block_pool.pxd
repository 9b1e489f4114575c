# kv_cache_c/block_pool.pxd: the declarations of BlockPool: C fields and cdef/cpdef method
# signatures (implemented in block_pool.pyx).
# Included by kvcy/_fast/_kv_cache_c.pxd.

cdef class BlockPool:
    # The pool's structure is fixed when it is made (readonly: the hot paths
    # read these fields without checks); counters and the collector are free.
    cdef readonly Py_ssize_t num_gpu_blocks
    cdef readonly bint enable_caching
    cdef readonly Py_ssize_t hash_block_size
    cdef readonly list blocks
    cdef readonly FreeKVCacheBlockQueue free_block_queue
    cdef readonly BlockHashToBlockMap cached_block_hash_to_block
    cdef readonly KVCacheBlock null_block
    cdef readonly bint enable_kv_cache_events
    cdef readonly bint use_int_block_hashes
    cdef readonly list kv_event_queue
    cdef readonly Py_ssize_t num_hash_lookahead_tokens
    cdef readonly object medium
    cdef public object metrics_collector
    cdef public Py_ssize_t num_evictions
    # Block id -> set of the cache keys (hash + 4-byte group id, vLLM's shape) the
    # block carries besides its own: partial entries (cache_partial_block).
    cdef dict _partial_keys  # cached_block_hashes_by_block (a read-only view of it)

    cpdef object get_cached_block(self, object block_hash, list kv_cache_group_ids)
    cdef inline object _get_one(self, object block_hash, Py_ssize_t gid)
    cdef object _ext(self, bytes block_hash)
    cpdef cache_full_blocks(self, request, list blocks, Py_ssize_t num_cached_blocks,
                            Py_ssize_t num_full_blocks, Py_ssize_t block_size,
                            Py_ssize_t kv_cache_group_id, object block_mask=*)
    cdef int _check_hashes_to_cache(self, object request, Py_ssize_t num_cached_blocks,
                                    Py_ssize_t num_full_blocks, Py_ssize_t block_size) except -1
    cdef tuple _event_extra_keys(self, request, Py_ssize_t start, Py_ssize_t end, Py_ssize_t mm_idx,
                                 list lookahead_ids)
    cdef object _block_stored(self, request, list hashes, parent, Py_ssize_t start, Py_ssize_t end,
                              Py_ssize_t block_size, Py_ssize_t group_id, list extra_keys_list,
                              list lookahead_ids)
    cdef list _get_new_blocks(self, Py_ssize_t num_blocks)
    cdef int _metered_new_blocks(self, list ret) except -1
    cdef int _new_blocks_partial(self, list ret) except -1
    cdef int _accessed(self, KVCacheBlock block) except -1
    cdef int _queue_removed(self, KVCacheBlock block) except -1
    cdef int _touch(self, list blocks) except -1
    cdef inline int _touch_one(self, KVCacheBlock block) except -1
    cdef int _free_blocks(self, list blocks_list) except -1
    cdef void _undo_free(self, list blocks_list, Py_ssize_t upto, int64_t n_head,
                         int64_t n_tail) noexcept
    cpdef Py_ssize_t get_num_free_blocks(self)
    cdef list _remove_cached_block_hashes(self, KVCacheBlock block)
    cdef int _emit_block_removed_events(self, list removed) except -1
    cdef int _insert_block_hash(self, bytes block_hash, uint32_t gid, KVCacheBlock block,
                                Py_ssize_t num_tokens) except -1
    cdef int _cache_partial(self, object request, KVCacheBlock blk, object hashes, Py_ssize_t num_tokens,
                            uint32_t gid, bint replace_existing_hashes) except -1
    cdef int _promote(self, KVCacheBlock blk, bytes block_hash, uint32_t gid, Py_ssize_t num_tokens) except -1
