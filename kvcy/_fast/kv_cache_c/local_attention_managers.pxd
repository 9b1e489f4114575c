# kv_cache_c/local_attention_managers.pxd: the declarations of SlidingWindowManager and
# ChunkedLocalAttentionManager (implemented in local_attention_managers.pyx).
# Included by kvcy/_fast/_kv_cache_c.pxd, after single_type_managers.pxd.

cdef class SlidingWindowManager(SingleTypeKVCacheManager):
    cdef readonly Py_ssize_t sliding_window
    cdef readonly Py_ssize_t extra_retained_tokens

    cdef tuple _find_hit(self, object block_hashes, Py_ssize_t max_length, list group_ids,
                         bint drop_eagle_block, Py_ssize_t alignment_tokens)
    @staticmethod
    cdef tuple _hits(BlockPool pool, Py_ssize_t block_size, Py_ssize_t sliding_window, object block_hashes,
                     Py_ssize_t max_length, list group_ids, bint drop_eagle_block, Py_ssize_t alignment_tokens)
    cpdef Py_ssize_t get_num_skipped_tokens(self, Py_ssize_t num_computed_tokens)
    cdef object _reachable(self, Py_ssize_t start_block, Py_ssize_t end_block)
    cdef object _sparse_reachable(self, Py_ssize_t start_block, Py_ssize_t end_block,
                                  Py_ssize_t retention_interval, list boundaries)


cdef class ChunkedLocalAttentionManager(SingleTypeKVCacheManager):
    cdef readonly Py_ssize_t attention_chunk_size

    cdef tuple _find_hit(self, object block_hashes, Py_ssize_t max_length, list group_ids,
                         bint drop_eagle_block, Py_ssize_t alignment_tokens)
    @staticmethod
    cdef tuple _hits(BlockPool pool, Py_ssize_t block_size, Py_ssize_t chunk, object block_hashes,
                     Py_ssize_t max_length, list group_ids, bint drop_eagle_block, Py_ssize_t alignment_tokens)
    cpdef Py_ssize_t get_num_skipped_tokens(self, Py_ssize_t num_computed_tokens)
