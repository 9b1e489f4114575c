# offload_c/manager.pxd: the declarations of CPUOffloadingManager and its per-request records:
# C fields and cdef method signatures (implemented in manager.pyx), and the record's flags.
# Included by kvcy/_fast/_offload_c.pxd.

# What a request did with a key, as flags in its record (one dict op per key
# instead of one per set; ARC's c_finish_flags reads them too).
cdef enum:
    _INSERTED = 1       # the request caused the key to be stored
    _REUSED = 2         # it read or re-offered the key, ready, without having inserted it
    _MISSED = 4         # the policy heard of the key as a store miss for this request

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
cdef class _AccessRecord:
    cdef int64_t generation
    cdef dict keys              # every key seen, first seen first -> flags (_INSERTED...)
    cdef list inserted_log      # keys inserted for the request, not yet in the flags
    cdef bint finished

    cdef int fold(self) except -1


@cython.final
cdef class _AccessRecords:
    cdef dict records


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
