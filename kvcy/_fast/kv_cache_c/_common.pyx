# kv_cache_c/_common.pyx: Module-level helpers shared by several concepts: request-status and count
# checks, ceiling division, generations, cache-key suffixes, and the C-API externs and inline C (key
# hashing, prefetch, aligned block slabs) the block, queue, map and pool code uses.  (vLLM:
# vllm/v1/utils.py cdiv and the checks its classes do inline.)
# Included into kvcy/_fast/_kv_cache_c.pyx (one extension module), not compiled on its own.

cdef object _WAITING = RequestStatus.WAITING
cdef object _PREEMPTED = RequestStatus.PREEMPTED
cdef object _STATUS_TYPE = RequestStatus
cdef long long _WAITING_VALUE = RequestStatus.WAITING.value
cdef long long _PREEMPTED_VALUE = RequestStatus.PREEMPTED.value
cdef object _int_status_type = None  # the last other status type whose == is int's


cdef inline bint _watermarked(object status) except -1:
    # Waiting and preempted requests take the watermark.  A status is
    # compared by value, as vLLM does: one from vLLM's own RequestStatus
    # class counts the same.  kvcy's members are singletons, so for them
    # identity decides without a rich comparison.
    cdef int overflow = 0
    cdef long long v
    if status is _WAITING or status is _PREEMPTED:
        return True
    if type(status) is _STATUS_TYPE:
        return False
    if type(status) is _int_status_type or _compares_as_int(type(status)):
        # (vLLM's RequestStatus, an IntEnum: its == is int's, so the values decide,
        # read in C instead of two rich comparisons per call)
        v = PyLong_AsLongLongAndOverflow(status, &overflow)
        return overflow == 0 and (v == _WAITING_VALUE or v == _PREEMPTED_VALUE)
    return status == _WAITING or status == _PREEMPTED


cdef bint _compares_as_int(object status_type) except -1:
    # Whether a status of this type compares with kvcy's by int value, as the
    # int subclasses kvcy's RequestStatus is do; remembered for the next call.
    global _int_status_type
    if issubclass(status_type, int) and status_type.__eq__ is int.__eq__:
        _int_status_type = status_type
        return True
    return False


cdef inline Py_ssize_t _cdiv(Py_ssize_t a, Py_ssize_t b) noexcept:
    # Ceiling division for a >= 0, b > 0 (C division truncates: no negation trick).
    if a <= 0:
        return 0
    return (a + b - 1) // b


def cdiv(a, b):
    return -(-a // b)


cdef str _no_arguments(object cls):
    # The refusal of an object made without its arguments (cls.__new__(cls)
    # alone): it would hold no pool, coordinator or sizes, and the C code
    # reads those unchecked.
    return (f"{cls.__name__} cannot be made without its arguments (by __new__ alone); "
            f"construct it as {cls.__name__}(...)")


cdef Py_ssize_t _check_count_slow(str name, object value) except -1:
    if type(value) is not int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(f"{name} must be an int, got {type(value).__name__}")
        value = int(value)
    if value < 0:
        raise ValueError(f"{name} must be non-negative, got {value}")
    if value > 2**62:
        raise ValueError(f"{name} is too large: {value}")
    return <Py_ssize_t>value


cdef inline Py_ssize_t _check_count(str name, object value) except -1:
    """A non-negative int count (bools refused) as a C integer."""
    cdef Py_ssize_t v
    if type(value) is int:
        v = _PyLong_AsSsize_t_raw(value)
        if v == -1 and PyErr_Occurred() != NULL:
            PyErr_Clear()
        elif 0 <= v <= (<Py_ssize_t>1 << 62):
            return v
    return _check_count_slow(name, value)


def _lookahead_count(str name, object value):
    # A lookahead token count (the constructors' keywords): a non-negative int (a bool is one,
    # as in vLLM, whose own tests pass lookahead=True for one token).
    if not isinstance(value, int) or not 0 <= value <= 2**62:
        raise ValueError(f"{name} must be a non-negative int (at most 2**62), got {value!r}")
    return int(value)


cdef int32_t _check_ref_cnt(object value) except -1:
    """A reference count as assigned from outside: an int in [0, 2**31)."""
    cdef Py_ssize_t v = _check_count("ref_cnt", value)
    if v >= (<Py_ssize_t>1 << 31):
        raise ValueError(f"ref_cnt must be below 2**31, got {value}")
    return <int32_t>v


cdef object _ZERO = 0

cdef Py_ssize_t _GEN = 0


cdef inline Py_ssize_t _next_gen() noexcept:
    global _GEN
    _GEN += 1
    return _GEN

# Group id -> its 4-byte big-endian suffix, cached for the small ids that occur.
cdef list _GROUP_SUFFIX = [i.to_bytes(4, "big") for i in range(64)]


cdef inline bytes _group_key(bytes block_hash, Py_ssize_t group_id):
    if group_id < 64:
        return block_hash + <bytes>_GROUP_SUFFIX[group_id]
    return block_hash + group_id.to_bytes(4, "big")
