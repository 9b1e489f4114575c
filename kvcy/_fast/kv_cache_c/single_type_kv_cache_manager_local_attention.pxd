# kv_cache_c/single_type_kv_cache_manager_local_attention.pxd: the declarations of SlidingWindowManager,
# ChunkedLocalAttentionManager, RSWAManager and CircularBufferManager (implemented in
# single_type_kv_cache_manager_local_attention.pyx).
# Included by kvcy/_fast/_kv_cache_c.pxd, after single_type_kv_cache_manager.pxd.

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


cdef class RSWAManager(FullAttentionManager):
    cdef readonly Py_ssize_t rswa_window

    cpdef remove_skipped_blocks(self, str request_id, Py_ssize_t processed_computed_tokens,
                                object num_prompt_tokens=*)


cdef class CircularBufferManager(FullAttentionManager):
    cdef list _claim_ring_block(self, str request_id, bint record_for_zeroing)
    cpdef Py_ssize_t get_num_blocks_to_allocate(
        self, str request_id, Py_ssize_t num_tokens, object new_computed_blocks,
        Py_ssize_t total_computed_tokens, Py_ssize_t num_local_computed_tokens,
        Py_ssize_t num_tokens_main_model, bint apply_admission_cap=*, Py_ssize_t prefill_end=*,
    ) except -1
    cpdef list allocate_new_blocks(self, str request_id, Py_ssize_t num_tokens, Py_ssize_t num_tokens_main_model)
    cdef list _allocate_new_blocks(self, str request_id, Py_ssize_t num_tokens, Py_ssize_t num_tokens_main_model)
    cpdef allocate_external_computed_blocks(self, str request_id, Py_ssize_t num_local_computed_tokens,
                                            Py_ssize_t num_external_computed_tokens, bint record_for_zeroing=*)
    cdef tuple _find_hit(self, object block_hashes, Py_ssize_t max_length, list group_ids,
                         bint drop_eagle_block, Py_ssize_t alignment_tokens)
    cpdef cache_blocks(self, request, Py_ssize_t num_tokens, object retention_interval=*,
                       object replay_boundaries=*)
    cpdef add_local_computed_blocks(self, str request_id, object new_computed_blocks,
                                    Py_ssize_t num_local_computed_tokens,
                                    Py_ssize_t num_external_computed_tokens)
    cdef list _checked_hits(self, object new_computed_blocks, Py_ssize_t total_computed_tokens)
    cpdef remove_skipped_blocks(self, str request_id, Py_ssize_t processed_computed_tokens,
                                object num_prompt_tokens=*)
    cpdef Py_ssize_t get_num_skipped_tokens(self, Py_ssize_t num_computed_tokens)
