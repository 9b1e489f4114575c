# kv_cache_c/kv_cache_manager.pxd: the declarations of KVCacheManager: C fields and cdef/cpdef
# method signatures (implemented in kv_cache_manager.pyx).
# Included by kvcy/_fast/_kv_cache_c.pxd.

cdef class KVCacheManager:
    # Fixed when made (readonly); the collector, the stats object and the
    # watermark are free (checked where they are read, or harmless).
    cdef readonly Py_ssize_t max_model_len
    cdef readonly bint enable_caching
    cdef readonly bint enable_kv_cache_events
    cdef readonly bint use_eagle
    cdef readonly bint log_stats
    cdef public object metrics_collector
    cdef public object prefix_cache_stats
    cdef readonly KVCacheCoordinator coordinator
    cdef readonly Py_ssize_t num_kv_cache_groups
    cdef readonly BlockPool block_pool
    cdef readonly object kv_cache_config
    cdef public Py_ssize_t watermark_blocks
    cdef readonly tuple kv_cache_event_metadata
    cdef readonly KVCacheBlocks empty_kv_cache_blocks
    cdef readonly tuple _group_block_sizes
    cdef readonly bint mamba_shared_prefix_checkpoint
    cdef readonly tuple retained_hit_group_ids
    cdef public bint refuse_unservable  # allocate_slots raises for a request that can never fit
    cdef public bint refuse_stale_hits  # allocate_slots raises for hits no longer cached as found
    cdef tuple _no_blocks  # no block per group: what allocate_slots works with when there are no hits
    # The only manager, when it is plain full attention caching every computed
    # token and recording no block ids: the decode fast path.
    cdef FullAttentionManager _full
    cdef bint _full_lookup_ok  # ... and get_computed_blocks needs no events, EAGLE or coarser hashes
    cdef dict __dict__

    cpdef KVCacheBlocks create_kv_cache_blocks(self, tuple blocks)
    cdef object _general_lookup(self, request, Py_ssize_t max_cache_hit_length)
    cdef object _full_lookup(self, Request request)
    cdef int _check_can_ever_fit(self, str request_id, Py_ssize_t needed, tuple hit_groups) except -1
    cdef object _full_slots(self, object request, Request own, str request_id, Py_ssize_t num_computed,
                            Py_ssize_t num_tokens, list hashes, object status, Py_ssize_t n_new,
                            Py_ssize_t n_new_comp, object hits, Py_ssize_t n_look, Py_ssize_t n_reserved,
                            bint delay_cache_blocks, bint has_scheduled_reqs, bint full_sequence_must_fit)
