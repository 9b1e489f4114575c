# kv_cache_c/request.pxd: the declarations of Request: C fields and cdef/cpdef method signatures
# (implemented in request.pyx).
# Included by kvcy/_fast/_kv_cache_c.pxd.

cdef class Request:
    # What the manager reads on every call comes first (80 bytes with the
    # object header, two cache lines at most).
    # What shapes the request's hashes or the manager's bookkeeping is set
    # once, by the constructor (readonly); counts a scheduler moves are
    # checked when assigned (properties over the C fields the manager reads).
    cdef readonly str request_id
    cdef Py_ssize_t _num_computed_tokens  # num_computed_tokens
    cdef public object status
    cdef readonly list _all_token_ids
    # The manager's own per-request bookkeeping, remembered here so a decode
    # step needs no dict lookups (see KVCacheManager._full_slots).
    cdef PyObject *_kv_owner     # the single-type manager it belongs to (identity only)
    cdef Py_ssize_t _kv_gen      # that manager's _gen when it was remembered
    cdef list _kv_blocks         # req_to_blocks[request_id], or None: no entry
    cdef Py_ssize_t _kv_ncached  # num_cached_block[request_id], or -1: no entry
    cdef list _block_hashes  # block_hashes
    cdef Py_ssize_t _num_in_flight_tokens  # num_in_flight_tokens
    cdef readonly list prompt_token_ids
    cdef public object max_tokens
    cdef readonly object lora_request
    cdef readonly object mm_features
    cdef readonly object cache_salt
    cdef readonly object prompt_embeds
    cdef readonly str kv_cache_report_mode
    cdef public object arrival_time
    cdef bint _skip_reading_prefix_cache  # skip_reading_prefix_cache
    cdef readonly object session_id
    cdef Py_ssize_t _shared_prefix_boundary  # shared_prefix_boundary
    cdef Py_ssize_t _num_preemptions  # num_preemptions
    cdef readonly Py_ssize_t num_prompt_tokens
    cdef list _spec_token_ids  # spec_token_ids
    cdef readonly list _output_token_ids
    cdef readonly object _block_hasher
    cdef Py_ssize_t _hash_block_size  # > 0: a kvcy hasher, skipped while no block completes
    cdef dict __dict__
    cdef object __weakref__
