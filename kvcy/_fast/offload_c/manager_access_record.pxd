# offload_c/manager_access_record.pxd: the declarations of _AccessRecord and _AccessRecords (implemented
# in access_record.pyx) and the record's flags.
# Included by kvcy/_fast/_offload_c.pxd.

# What a request did with a key, as flags in its record (one dict op per key
# instead of one per set; ARC's c_finish_flags reads them too).
cdef enum:
    _INSERTED = 1       # the request caused the key to be stored
    _REUSED = 2         # it read or re-offered the key, ready, without having inserted it
    _MISSED = 4         # the policy heard of the key as a store miss for this request


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
