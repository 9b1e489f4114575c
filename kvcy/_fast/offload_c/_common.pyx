# offload_c/_common.pyx: what every concept shares: the API constants, owner ids, argument
# checks (the same messages in both twins), a key's group index, load/store specs.
# Included into kvcy/_fast/_offload_c.pyx (one extension module), not compiled on its own.

cdef object _MISS = LookupResult.MISS
cdef object _HIT = LookupResult.HIT
cdef object _HIT_PENDING = LookupResult.HIT_PENDING
cdef object _CPU = Medium.CPU
cdef object _HOST = CacheHitSource.HOST
cdef object _np_frombuffer = np.frombuffer
cdef object _np_int32 = np.int32
cdef object _Iterable = Iterable
cdef object _ReqContext = ReqContext
cdef str _FINALIZED = "New cache keys observed after request finalization"
# A manager's state is consistent only between its calls, so a call that
# enters while another is running is refused before it changes anything.
cdef str _BUSY = (
    "CPUOffloadingManager.{}() was called while another call into the same manager is running: "
    "from one of that call's callbacks (a ReqContext's or a cache policy's method), or from another "
    "thread (threads sharing a manager hold manager.lock around each call)"
)
cdef Py_ssize_t _INT_MAX = (<Py_ssize_t>1) << 62

# kvcy.kv_offload.cpu imports the live twin (this module, maybe), so what this
# module needs from it is imported on first use, not at import time.
cdef object _CPULoadStoreSpec = None
cdef object _Metrics = None


cdef int _load_cpu_common() except -1:
    global _CPULoadStoreSpec, _Metrics
    from kvcy.kv_offload.cpu.common import CPULoadStoreSpec, CPUOffloadingMetrics
    _CPULoadStoreSpec = CPULoadStoreSpec
    _Metrics = CPUOffloadingMetrics
    return 0


cdef int64_t _OWNER = 0


cdef inline int64_t _next_owner() noexcept:
    global _OWNER
    _OWNER += 1
    return _OWNER


cdef inline PyObject *_map_get(dict d, object key) except? NULL:
    """``d[key]`` (borrowed) or NULL: PyDict_GetItemWithError, without the
    hash call for an exact bytes key whose hash is known (every offload key
    of a map, once stored)."""
    if type(key) is bytes:
        return kvcy_offload_bytes_get(d, <PyObject *>key)
    return PyDict_GetItemWithError(d, key)


cdef inline void _ahead_prime(dict d, list keys) noexcept:
    """Start kvcy_dict_ahead's pipeline for a loop over ``keys`` looking them up
    in ``d`` (the loop then calls ``kvcy_dict_ahead(d, keys, i)`` before each key)."""
    cdef Py_ssize_t j
    for j in range(-2 * KVCY_AHEAD_D, 0):
        kvcy_dict_ahead(d, keys, j)


cdef object _get_state(object ctx, type cls):
    """``ctx.get_state(cls)``; for a plain ReqContext, a direct read of its state dict."""
    if type(ctx) is _ReqContext:
        d = ctx._state
        if type(d) is dict:
            return (<dict>d).get(cls)
    return ctx.get_state(cls)


cdef int _set_state(object ctx, object value) except -1:
    """``ctx.set_state(value)``; for a plain ReqContext, a direct write of its state dict."""
    if type(ctx) is _ReqContext:
        d = ctx._state
        if type(d) is dict:
            (<dict>d)[type(value)] = value
            return 0
    ctx.set_state(value)
    return 0


# =============================================================================
# Argument checks (the same messages in both twins)
# =============================================================================
cdef int _check_key_slow(object key) except -1:
    if type(key) is not bytes and not isinstance(key, bytes):
        raise TypeError(f"an offload key must be bytes, got {type(key).__name__}")
    if len(key) < 4:
        raise ValueError(
            f"an offload key is a block hash plus a 4-byte group index, got {len(key)} bytes: {key!r}"
        )
    return 0


cdef inline int _check_key(object key) except -1:
    if type(key) is bytes and PyBytes_GET_SIZE(key) >= 4:
        return 0
    return _check_key_slow(key)


cdef list _check_keys(object keys):
    """``keys`` as a list of valid offload keys (exact ``bytes``), or a TypeError / ValueError."""
    cdef list out
    cdef Py_ssize_t i
    if type(keys) is list:
        out = <list>keys
    else:
        if isinstance(keys, (bytes, str)) or not isinstance(keys, _Iterable):
            raise TypeError(f"keys must be a collection of offload keys, got {type(keys).__name__}")
        out = list(keys)
    for i in range(len(out)):
        key = out[i]
        if type(key) is not bytes or PyBytes_GET_SIZE(key) < 4:
            _check_key_slow(key)
            # a bytes subclass: keep its plain bytes value (C code compares bytes)
            if out is keys:
                out = list(out)
            out[i] = bytes(key)
    return out


cdef int _check_no_repeats(list keys) except -1:
    """1 if a key of ``keys`` (exact bytes) equals an earlier one, else 0: a C
    table of the keys' (cached) hashes, no set built."""
    cdef Py_ssize_t n = len(keys), size = 8, i, j
    cdef Py_hash_t h
    cdef PyObject *k
    cdef PyObject *o
    while size < 2 * n:
        size *= 2
    cdef vector[PyObject *] slots
    cdef vector[Py_hash_t] hashes
    slots.resize(size, NULL)
    hashes.resize(size, 0)
    for i in range(n):
        k = <PyObject *>keys[i]
        h = PyObject_Hash(<object>k)
        j = <Py_ssize_t>(<size_t>h & <size_t>(size - 1))
        while slots[j] != NULL:
            o = slots[j]
            if hashes[j] == h and (o == k or (
                    PyBytes_GET_SIZE(<object>o) == PyBytes_GET_SIZE(<object>k)
                    and memcmp(PyBytes_AS_STRING(<object>o), PyBytes_AS_STRING(<object>k),
                               <size_t>PyBytes_GET_SIZE(<object>k)) == 0)):
                return 1
            j = (j + 1) & (size - 1)
        slots[j] = k
        hashes[j] = h
    return 0


cdef inline int _check_context(object req_context) except -1:
    if type(req_context) is not _ReqContext and not isinstance(req_context, _ReqContext):
        # (a ReqContext of vLLM's, or another with the same three methods, serves as well)
        if not (hasattr(req_context, "get_state") and hasattr(req_context, "set_state")
                and hasattr(req_context, "get_offload_key_position")):
            raise TypeError(f"req_context must be a ReqContext, got {type(req_context).__name__}")
    return 0


cdef Py_ssize_t _check_int(str name, object value) except -1:
    """A non-negative int as a C integer (values past 2**62 are clamped: no
    cache, tracker or threshold comes near that)."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    if value < 0:
        raise ValueError(f"{name} must be non-negative, got {value}")
    if value > _INT_MAX:
        return _INT_MAX
    return <Py_ssize_t>value


cdef inline int _enter(CPUOffloadingManager manager, KvcyCallMark *mark, str name) except -1:
    """Mark ``manager`` as in a call until the caller's ``mark`` goes (when the
    caller returns, by any path), or refuse a second entry: from a callback, or
    from another thread (the check and the mark run under the GIL, with no
    Python code between them)."""
    if manager._in_call:
        raise RuntimeError(_BUSY.format(name))
    manager._in_call = 1
    mark.flag = &manager._in_call
    return 0


cdef inline uint32_t _group_of(bytes key) noexcept:
    """The group index: the key's last 4 bytes, big-endian (keys are >= 4 bytes)."""
    cdef const unsigned char *p = <const unsigned char *>PyBytes_AS_STRING(key)
    p += PyBytes_GET_SIZE(key) - 4
    return (<uint32_t>p[0] << 24) | (<uint32_t>p[1] << 16) | (<uint32_t>p[2] << 8) | <uint32_t>p[3]


cdef object _chunk_spec(vector[Py_ssize_t]& ids):
    """A CPULoadStoreSpec over ``ids``: a writable int32 array, filled in C."""
    cdef Py_ssize_t n = <Py_ssize_t>ids.size()
    cdef Py_ssize_t i
    cdef bytearray buf
    cdef int *out
    if _CPULoadStoreSpec is None:
        _load_cpu_common()
    for i in range(n):
        if ids[i] > 0x7FFFFFFF:
            # out of int32 range: let the spec's own check say so
            return _CPULoadStoreSpec([ids[j] for j in range(n)])
    buf = bytearray(n * 4)
    out = <int *>(<char *>buf)
    for i in range(n):
        out[i] = <int>ids[i]
    spec = _CPULoadStoreSpec.__new__(_CPULoadStoreSpec)
    spec.block_ids = _np_frombuffer(buf, dtype=_np_int32)
    return spec
