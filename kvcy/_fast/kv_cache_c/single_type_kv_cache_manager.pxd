# kv_cache_c/single_type_kv_cache_manager.pxd: the declarations of _Generation, SingleTypeKVCacheManager,
# FullAttentionManager, SinkFullAttentionManager, CrossAttentionManager: C fields and
# cdef/cpdef method signatures (implemented in single_type_kv_cache_manager.pyx; Mamba's manager is
# in single_type_kv_cache_manager_mamba.pxd).
# Included by kvcy/_fast/_kv_cache_c.pxd.

@cython.final
cdef class _Generation:
    cdef Py_ssize_t value


cdef class SingleTypeKVCacheManager:
    # Fixed when made (readonly: read without checks, divided by); use_eagle
    # is set by the coordinators.  The two dicts are readonly attributes
    # whose entries callers may still change (vLLM's tests do).
    cdef readonly object kv_cache_spec
    cdef readonly Py_ssize_t block_size
    cdef readonly BlockPool block_pool
    cdef readonly bint enable_caching
    cdef readonly Py_ssize_t kv_cache_group_id
    cdef readonly Py_ssize_t scheduler_block_size
    # Context-parallel world sizes: the caller's for a dcp-sharded spec, else 1
    # (a replicated group's blocks are whole on every rank).
    cdef readonly Py_ssize_t dcp_world_size
    cdef readonly Py_ssize_t pcp_world_size
    cdef readonly object _max_admission_blocks_per_request
    cdef Py_ssize_t _cap
    cdef public bint use_eagle
    cdef dict _req_to_blocks  # request id -> its blocks (req_to_blocks: a checked view)
    cdef dict _num_cached_block  # request id -> blocks cached (num_cached_block: a checked view)
    cdef readonly object req_to_blocks
    cdef readonly object num_cached_block
    # Changes whenever an entry of the two dicts above is added, replaced or
    # removed other than through KVCacheManager._full_slots (which keeps the
    # request's own record in step and re-reads what another Request object
    # of the same id could have added there); a request's remembered entries
    # are valid only while it matches.  Values come from one process-wide
    # counter, so a new manager never repeats an old one's.  Callers reach
    # the dicts only through the two views, whose every change moves it too:
    # the record cannot go stale behind the manager's back.
    cdef _Generation _gen
    cdef readonly KVCacheBlock _null_block
    cdef readonly bint _record_new_block_ids  # (KV-cache zeroing: new_block_ids records what is taken)
    cdef readonly bint _prefix_cacheable  # (the spec's: False caches nothing -- a ring, bounded replay)
    cdef readonly list new_block_ids
    # The token granularity hits land on (cache_hit_alignment_tokens: a checked
    # property; it divides), set by the hybrid coordinator; Mamba align's
    # shared-prefix checkpoints (set by the manager).
    cdef Py_ssize_t _alignment
    cdef public bint shared_prefix_checkpoint
    # Partial hits: request id -> (index, shared tail block) to copy on the next
    # allocation; the (source, copy) pairs queued; Mamba align's boundary states
    # (request id, group id, block, tokens) queued for a connector.
    cdef dict _partial_hit_reqs
    cdef readonly list _pending_cow_copies
    cdef list _pending_boundary_state_offloads

    cpdef Py_ssize_t get_num_skipped_tokens(self, Py_ssize_t num_computed_tokens)
    cpdef Py_ssize_t get_num_blocks_to_allocate(
        self, str request_id, Py_ssize_t num_tokens, object new_computed_blocks,
        Py_ssize_t total_computed_tokens, Py_ssize_t num_local_computed_tokens,
        Py_ssize_t num_tokens_main_model, bint apply_admission_cap=*, Py_ssize_t prefill_end=*,
    ) except? -1
    cpdef add_local_computed_blocks(self, str request_id, object new_computed_blocks,
                                    Py_ssize_t num_local_computed_tokens,
                                    Py_ssize_t num_external_computed_tokens)
    cdef list _checked_hits(self, object new_computed_blocks, Py_ssize_t total_computed_tokens)
    cpdef allocate_external_computed_blocks(self, str request_id, Py_ssize_t num_local_computed_tokens,
                                            Py_ssize_t num_external_computed_tokens, bint record_for_zeroing=*)
    cpdef list allocate_new_blocks(self, str request_id, Py_ssize_t num_tokens, Py_ssize_t num_tokens_main_model)
    cdef list _allocate_new_blocks(self, str request_id, Py_ssize_t num_tokens, Py_ssize_t num_tokens_main_model)
    cdef int _check_cow(self, str request_id, Py_ssize_t block_idx, KVCacheBlock source_block) except -1
    cdef int _apply_cow(self, str request_id, Py_ssize_t block_idx, KVCacheBlock source_block,
                        KVCacheBlock cow_block) except -1
    cpdef cache_blocks(self, request, Py_ssize_t num_tokens, object retention_interval=*,
                       object replay_boundaries=*)
    cdef list _reachable_boundaries(self, object request, object replay_boundaries)
    cdef object _reachable(self, Py_ssize_t start_block, Py_ssize_t end_block)
    cdef object _sparse_reachable(self, Py_ssize_t start_block, Py_ssize_t end_block,
                                  Py_ssize_t retention_interval, list boundaries)
    cdef int _check_cache_inputs(self, object request, str request_id, Py_ssize_t num_tokens, object hits,
                                 bint attaching, Py_ssize_t total_computed_tokens) except -1
    cpdef list pop_blocks_for_free(self, str request_id)
    cpdef free(self, str request_id)
    cdef bint _free_held(self, str request_id) except -1
    cdef int _remove_blocks_in_range(self, str request_id, Py_ssize_t first_block, Py_ssize_t last_block) except -1
    cpdef remove_skipped_blocks(self, str request_id, Py_ssize_t processed_computed_tokens,
                                object num_prompt_tokens=*)
    cdef tuple _find_hit(self, object block_hashes, Py_ssize_t max_length, list group_ids,
                         bint drop_eagle_block, Py_ssize_t alignment_tokens)


cdef class FullAttentionManager(SingleTypeKVCacheManager):
    cpdef cache_blocks(self, request, Py_ssize_t num_tokens, object retention_interval=*,
                       object replay_boundaries=*)
    cdef int _cache_partial_tail_block(self, object request, Py_ssize_t num_tokens) except -1
    cdef tuple _find_hit(self, object block_hashes, Py_ssize_t max_length, list group_ids,
                         bint drop_eagle_block, Py_ssize_t alignment_tokens)
    @staticmethod
    cdef tuple _hits(BlockPool pool, Py_ssize_t block_size, object block_hashes, Py_ssize_t max_length,
                     list group_ids, bint drop_eagle_block, Py_ssize_t alignment_tokens)


cdef class SinkFullAttentionManager(FullAttentionManager):
    pass


cdef class CrossAttentionManager(SingleTypeKVCacheManager):
    cdef tuple _find_hit(self, object block_hashes, Py_ssize_t max_length, list group_ids,
                         bint drop_eagle_block, Py_ssize_t alignment_tokens)
    cpdef cache_blocks(self, request, Py_ssize_t num_tokens, object retention_interval=*,
                       object replay_boundaries=*)
    cdef int _check_cache_inputs(self, object request, str request_id, Py_ssize_t num_tokens, object hits,
                                 bint attaching, Py_ssize_t total_computed_tokens) except -1
