# offload_c/manager.pxd: the declarations of CPUOffloadingManager: C fields and cdef method
# signatures (implemented in manager.pyx).
# Included by kvcy/_fast/_offload_c.pxd.

cdef extern from *:
    """
    /* Clears a flag when the C function that holds it returns, by any path
       (an exception included): a manager is marked in a call for exactly the
       call's duration. */
    struct KvcyCallMark {
        int *flag = nullptr;
        ~KvcyCallMark() { if (flag) *flag = 0; }
    };
    """
    cppclass KvcyCallMark:
        int *flag


@cython.final
cdef class CPUOffloadingManager:
    cdef Py_ssize_t _n_chunks
    cdef Py_ssize_t _n_allocated
    cdef vector[Py_ssize_t] _free
    cdef list _events               # None: events disabled
    cdef CachePolicy _pol
    cdef Py_ssize_t _n_evictable
    cdef Py_ssize_t _n_pending
    cdef Py_ssize_t _threshold
    cdef Py_ssize_t _max_tracker
    cdef object _counts             # OrderedDict key -> offers, or None
    cdef Py_ssize_t _skipped
    cdef list _alloc_sizes
    cdef object _info_obj
    cdef int64_t _generation_c
    cdef int64_t _owner_c
    cdef int _in_call               # 1 while a public call that changes state runs
    cdef dict __dict__              # OffloadingManager.lock keeps its lock here
    # what results are made of: kvcy.kv_offload's classes, or another API's
    # with the same shapes (vLLM's, when the manager serves vLLM's connector)
    cdef object _r_miss, _r_hit, _r_pending, _r_cpu, _r_host
    cdef object _r_event, _r_store, _r_spec, _r_stats, _r_octx

    cdef _AccessRecord _get_record(self, object ctx, bint create)
    cdef int _record(self, _AccessRecord rec, list keys, list reused, object ctx,
                     _Positions pos, list statuses, bint track_missed=*,
                     list hints=*) except -1
    cdef int _update_tracker(self, list keys, bint repeated=*) except -1
    # prepare_store's phases
    cdef list _drop_repeats(self, list full_offer, list stored_twice,
                            Py_ssize_t *extra_stored, Py_ssize_t *extra_skipped)
    cdef set _classify_offer(self, list offer, list new, list ready, list statuses,
                             list new_ghosts, list stored_twice)
    cdef int _check_offer(self, _AccessRecord rec, list to_record, list new, set kept,
                          list statuses, list stored_twice, Py_ssize_t extra_stored) except -1
    cdef list _track_offer(self, list offer, list full_offer, list new, set kept,
                           Py_ssize_t extra_skipped)
    cdef list _note_store_misses(self, _AccessRecord rec, list new, list new_ghosts,
                                 list full_offer, list stored_twice, object ctx)
    cdef list _evict_for_store(self, Py_ssize_t n, list ready, set offered)
    cdef int _allocate_chunks(self, list new, vector[Py_ssize_t]& ids, list new_ghosts,
                              list pre_new, object ctx, _Positions pos) except -1
