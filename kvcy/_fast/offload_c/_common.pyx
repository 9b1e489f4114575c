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
# Another API's context class with ReqContext's layout (vLLM's), read as directly
# as kvcy's once a manager was told of it (CPUOffloadingManager._use_api_types).
cdef object _OtherReqContext = None
cdef str _FINALIZED = "New cache keys observed after request finalization"
# A manager's state is consistent only between its calls, so a call that
# enters while another is running is refused before it changes anything.
cdef str _BUSY = (
    "CPUOffloadingManager.{}() was called while another call into the same manager is running: "
    "from one of that call's callbacks (a ReqContext's or a cache policy's method), or from another "
    "thread (threads sharing a manager hold manager.lock around each call)"
)
cdef Py_ssize_t _INT_MAX = (<Py_ssize_t>1) << 62

cdef object _CPULoadStoreSpec = CPULoadStoreSpec
cdef object _Metrics = CPUOffloadingMetrics


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


cdef inline bint _is_plain_ctx(object ctx) noexcept:
    """Whether ``ctx`` is exactly kvcy's ReqContext, or the other API's of the same layout."""
    return type(ctx) is _ReqContext or type(ctx) is _OtherReqContext


cdef int _add_plain_context(object cls) except -1:
    global _OtherReqContext
    if cls is _ReqContext:
        return 0
    if not isinstance(cls, type):
        raise TypeError(f"ReqContext must be a class, got {type(cls).__name__}")
    _OtherReqContext = cls
    return 0


cdef tuple _api_types(object lookup_result, object medium, object hit_source, object event,
                      object store_output, object spec, object stats, object octx, object req_context):
    """The members and classes a manager's results are made of, checked.

    ``req_context``, if not None, is a context class with kvcy's ReqContext layout
    (``_state`` and ``_offload_key_positions`` dicts), read as directly as kvcy's.

    Raises:
        TypeError: an argument is not a class, or lacks a member results use.
    """
    named = (("LookupResult", lookup_result), ("Medium", medium), ("CacheHitSource", hit_source),
             ("OffloadingEvent", event), ("PrepareStoreOutput", store_output),
             ("CPULoadStoreSpec", spec), ("OffloadingConnectorStats", stats),
             ("RequestOffloadingContext", octx))
    for name, cls in named:
        if not isinstance(cls, type):
            raise TypeError(f"{name} must be a class, got {type(cls).__name__}")
    if req_context is not None and not isinstance(req_context, type):
        raise TypeError(f"ReqContext must be a class or None, got {type(req_context).__name__}")
    for cls, member in ((lookup_result, "MISS"), (lookup_result, "HIT"), (lookup_result, "HIT_PENDING"),
                        (medium, "CPU"), (hit_source, "HOST")):
        if not hasattr(cls, member):
            raise TypeError(f"{cls.__qualname__} has no member {member}")
    if req_context is not None:
        _add_plain_context(req_context)
    return (lookup_result.MISS, lookup_result.HIT, lookup_result.HIT_PENDING, medium.CPU,
            hit_source.HOST, event, store_output, spec, stats, octx)


# kvcy's own: what a manager answers in until told otherwise (its CPULoadStoreSpec,
# None here, is imported on first use)
cdef tuple _KVCY_API = (_MISS, _HIT, _HIT_PENDING, _CPU, _HOST, OffloadingEvent, PrepareStoreOutput,
                        None, OffloadingConnectorStats, RequestOffloadingContext)


cdef int _set_api_types(CPUOffloadingManager m, tuple api) except -1:
    (m._r_miss, m._r_hit, m._r_pending, m._r_cpu, m._r_host, m._r_event,
     m._r_store, m._r_spec, m._r_stats, m._r_octx) = api
    return 0


cdef object _get_state(object ctx, type cls):
    """``ctx.get_state(cls)``; for a plain ReqContext, a direct read of its state dict."""
    if _is_plain_ctx(ctx):
        d = ctx._state
        if type(d) is dict:
            return (<dict>d).get(cls)
    return ctx.get_state(cls)


cdef int _set_state(object ctx, object value) except -1:
    """``ctx.set_state(value)``; for a plain ReqContext, a direct write of its state dict."""
    if _is_plain_ctx(ctx):
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
    if not _is_plain_ctx(req_context) and not isinstance(req_context, _ReqContext):
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


cdef object _chunk_spec(vector[Py_ssize_t]& ids, object cls=None):
    """A CPULoadStoreSpec (``cls``, or kvcy's) over ``ids``: a writable int32 array, filled in C."""
    cdef Py_ssize_t n = <Py_ssize_t>ids.size()
    cdef Py_ssize_t i
    cdef bytearray buf
    cdef int *out
    if cls is None:
        cls = _CPULoadStoreSpec
    for i in range(n):
        if ids[i] > 0x7FFFFFFF:
            # out of int32 range: let the spec's own check say so
            return cls([ids[j] for j in range(n)])
    buf = bytearray(n * 4)
    out = <int *>(<char *>buf)
    for i in range(n):
        out[i] = <int>ids[i]
    spec = cls.__new__(cls)
    spec.block_ids = _np_frombuffer(buf, dtype=_np_int32)
    return spec


cdef dict _stats_payload(double usage, double write_usage, list sizes, object skipped):
    """``get_stats``'s payload, in the layout kvcy's and vLLM's ``OffloadingConnectorStats``
    share (``{"types": {name: kind}, "data": {name: {labels: value}}, "info": None}``) and
    in the order their ``set_gauge`` / ``observe_histogram`` / ``increase_counter`` calls
    would fill it: built at once, since the connector asks for it every step."""
    cdef double read_usage = usage - write_usage
    types = {_Metrics.CPU_CACHE_USAGE_PERC: "gauge"}
    values = {_Metrics.CPU_CACHE_USAGE_PERC: {(): usage}}
    if sizes:
        types[_Metrics.CPU_ALLOCATION_SIZE] = "histogram"
        values[_Metrics.CPU_ALLOCATION_SIZE] = {(): sizes}
    types[_Metrics.CPU_CACHE_WRITE_USAGE_PERC] = "gauge"
    values[_Metrics.CPU_CACHE_WRITE_USAGE_PERC] = {(): write_usage}
    types[_Metrics.CPU_CACHE_READ_USAGE_PERC] = "gauge"
    values[_Metrics.CPU_CACHE_READ_USAGE_PERC] = {(): 0.0 if read_usage < 0.0 else read_usage}
    if skipped is not None:
        types[_Metrics.STORES_SKIPPED] = "counter"
        values[_Metrics.STORES_SKIPPED] = {(): 0 + skipped}
    return {"types": types, "data": values, "info": None}
