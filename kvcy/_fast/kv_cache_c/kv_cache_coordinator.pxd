# kv_cache_c/kv_cache_coordinator.pxd: the declarations of KVCacheCoordinator,
# KVCacheCoordinatorNoPrefixCache, UnitaryKVCacheCoordinator, HybridKVCacheCoordinator: C fields and
# cdef/cpdef method signatures (implemented in kv_cache_coordinator.pyx).
# Included by kvcy/_fast/_kv_cache_c.pxd.

cdef class KVCacheCoordinator:
    # All fixed when made (readonly: indexed and divided by without checks).
    cdef readonly object kv_cache_config
    cdef readonly Py_ssize_t max_model_len
    cdef readonly bint enable_caching
    cdef readonly Py_ssize_t scheduler_block_size
    cdef readonly Py_ssize_t hash_block_size
    cdef readonly BlockPool block_pool
    cdef readonly set eagle_group_ids
    cdef readonly tuple single_type_managers
    cdef readonly tuple _cross_attention
    cdef readonly Py_ssize_t num_reprefillable_tokens
    cdef readonly set drop_eagle_group_ids
    cdef readonly bint enable_partial_hash_hits
    cdef readonly Py_ssize_t dcp_world_size  # (context-parallel world sizes, as the caller gave them;
    cdef readonly Py_ssize_t pcp_world_size  #  the unitary coordinator's dcp is its group's)
    cdef object _retention_interval  # None (dense), or an int >= 0; Python's retention_interval (checked setter)
    cdef Py_ssize_t _retention  # the interval cache_blocks acts on: -1 for None or no sparse (window, Mamba align) group
    cdef Py_ssize_t _n_managers
    cdef bint _any_cross

    cpdef Py_ssize_t get_num_blocks_to_allocate(
        self, str request_id, Py_ssize_t num_tokens, tuple new_computed_blocks, Py_ssize_t num_encoder_tokens,
        Py_ssize_t total_computed_tokens, Py_ssize_t num_local_computed_tokens,
        Py_ssize_t num_tokens_main_model, bint apply_admission_cap=*, Py_ssize_t prefill_end=*,
    ) except? -1
    cpdef allocate_new_computed_blocks(self, str request_id, tuple new_computed_blocks,
                                       Py_ssize_t num_local_computed_tokens,
                                       Py_ssize_t num_external_computed_tokens,
                                       tuple skip_zeroing_group_ids=*)
    cpdef tuple allocate_new_blocks(self, str request_id, Py_ssize_t num_tokens,
                                    Py_ssize_t num_tokens_main_model, Py_ssize_t num_encoder_tokens=*)
    cdef tuple _allocate_new_blocks(self, str request_id, Py_ssize_t num_tokens, Py_ssize_t num_tokens_main_model,
                                    Py_ssize_t num_encoder_tokens)
    cpdef cache_blocks(self, request, Py_ssize_t num_computed_tokens)
    cdef Py_ssize_t _tokens_to_cache(self, SingleTypeKVCacheManager manager, Py_ssize_t num_computed_tokens)
    cdef int _check_cache_inputs(self, object request, str request_id, Py_ssize_t num_computed_tokens,
                                 tuple new_computed_blocks, bint attaching,
                                 Py_ssize_t total_computed_tokens) except -1
    cpdef bint reset_prefix_cache(self) except -1
    cpdef free(self, str request_id)
    cpdef remove_skipped_blocks(self, str request_id, Py_ssize_t processed_computed_tokens,
                                object num_prompt_tokens=*)
    cpdef bint holds(self, str request_id)
    cpdef tuple find_longest_cache_hit(self, object block_hashes, Py_ssize_t max_cache_hit_length)


cdef class KVCacheCoordinatorNoPrefixCache(KVCacheCoordinator):
    cdef readonly Py_ssize_t num_single_type_manager

    cpdef tuple find_longest_cache_hit(self, object block_hashes, Py_ssize_t max_cache_hit_length)


cdef class UnitaryKVCacheCoordinator(KVCacheCoordinator):
    cdef readonly object kv_cache_spec
    cdef readonly Py_ssize_t block_size
    cdef readonly bint use_eagle
    cdef SingleTypeKVCacheManager _manager
    cdef list _group_ids

    cpdef tuple find_longest_cache_hit(self, object block_hashes, Py_ssize_t max_cache_hit_length)


cdef class HybridKVCacheCoordinator(KVCacheCoordinator):
    cdef readonly list attention_groups
    cdef bint _is_simple_hybrid
    cdef Py_ssize_t _alignment  # where hits land: the hash block with partial hits, else the scheduler block

    cdef Py_ssize_t _align_cacheable(self, Py_ssize_t num_tokens) noexcept

    cdef Py_ssize_t _tokens_to_cache(self, SingleTypeKVCacheManager manager, Py_ssize_t num_computed_tokens)
    cpdef tuple find_longest_cache_hit(self, object block_hashes, Py_ssize_t max_cache_hit_length)
