# kv_cache_c/single_type_kv_cache_manager_mamba.pxd: the declarations of MambaManager: C fields and cdef/cpdef
# method signatures (implemented in single_type_kv_cache_manager_mamba.pyx).
# Included by kvcy/_fast/_kv_cache_c.pxd.

cdef class MambaManager(SingleTypeKVCacheManager):
    # Fixed when made; drop_eagle_checkpoint_block is set by the coordinator.  The
    # align-mode records are readonly dicts / sets whose entries are read checked.
    cdef readonly str mamba_cache_mode
    cdef readonly bint _align
    cdef readonly Py_ssize_t num_speculative_blocks
    cdef readonly bint has_prefill_checkpoint_blocks
    cdef public bint drop_eagle_checkpoint_block
    cdef readonly set cached_blocks_this_step
    cdef readonly dict last_state_block_idx
    cdef dict _num_retired_blocks
    cdef set _allocated_reqs  # (Python: the _allocated_block_reqs view)
    cdef dict _checkpoint_at  # (Python: the _checkpoints view)
    cdef dict _producer_partial_tail_reqs

    cdef tuple _find_hit(self, object block_hashes, Py_ssize_t max_length, list group_ids,
                         bint drop_eagle_block, Py_ssize_t alignment_tokens)
    cpdef Py_ssize_t get_num_skipped_tokens(self, Py_ssize_t num_computed_tokens)
    cpdef Py_ssize_t get_num_blocks_to_allocate(
        self, str request_id, Py_ssize_t num_tokens, object new_computed_blocks,
        Py_ssize_t total_computed_tokens, Py_ssize_t num_local_computed_tokens,
        Py_ssize_t num_tokens_main_model, bint apply_admission_cap=*, Py_ssize_t prefill_end=*,
    ) except? -1
    cdef bint _needs_internal_checkpoint(self, str request_id, Py_ssize_t query_start, Py_ssize_t query_end,
                                         Py_ssize_t checkpoint_position, Py_ssize_t prefill_end) except -1
    cpdef list allocate_new_blocks(self, str request_id, Py_ssize_t num_tokens, Py_ssize_t num_tokens_main_model)
    cdef list _allocate_new_blocks(self, str request_id, Py_ssize_t num_tokens, Py_ssize_t num_tokens_main_model)
    cdef int _relocate_speculative_block_impl(self, list req_blocks, Py_ssize_t block_idx) except -1
    cdef int _remove_blocks_in_range(self, str request_id, Py_ssize_t first_block, Py_ssize_t last_block) except -1
    cpdef remove_skipped_blocks(self, str request_id, Py_ssize_t processed_computed_tokens,
                                object num_prompt_tokens=*)
    cdef int _forget(self, str request_id) except -1
    cpdef list pop_blocks_for_free(self, str request_id)
    cdef bint _free_held(self, str request_id) except -1
    cpdef cache_blocks(self, request, Py_ssize_t num_tokens, object retention_interval=*,
                       object replay_boundaries=*)
    cdef object _cache_partial_tail_block_impl(self, object request, Py_ssize_t num_tokens, object retention_interval)
    cdef object _sparse_reachable(self, Py_ssize_t start_block, Py_ssize_t end_block,
                                  Py_ssize_t retention_interval, list boundaries)
