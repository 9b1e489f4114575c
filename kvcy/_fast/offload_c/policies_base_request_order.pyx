# offload_c/policies_base_request_order.pyx: a request's keys head to tail (order_request_keys) and the
# positions that order them (_Positions).  (vLLM: vllm/v1/kv_offload/cpu/policies/base.py.)
# Included into kvcy/_fast/_offload_c.pyx (one extension module), not compiled on its own.

cdef class _Positions:
    """A request's key positions: a direct dict read for a plain ReqContext."""

    cdef int get(self, object key, int64_t *out) except -1:
        """1 and ``*out`` = the position if ``key`` has one, else 0."""
        cdef PyObject *p
        cdef object v
        if self.d is not None:
            p = _map_get(self.d, key)
            if p == NULL:
                return 0
            v = <object>p
        else:
            v = self.getter(key)
            if v is None:
                return 0
        if type(v) is int:
            try:
                out[0] = <int64_t>v
                return 1
            except OverflowError:
                pass
        return _as_position(v, out)


cdef int _as_position(object v, int64_t *out) except -1:
    if isinstance(v, bool) or not isinstance(v, int):
        raise TypeError(f"a key position must be an int, got {type(v).__name__}")
    # Positions are token indices: one past 2**62 only ever orders a request's
    # keys, and is clamped there.
    if v > _INT_MAX:
        out[0] = _INT_MAX
    elif v < -_INT_MAX:
        out[0] = -_INT_MAX
    else:
        out[0] = <int64_t>v
    return 1


cdef int _check_positions(list keys, _Positions pos) except -1:
    """Read the positions the LRU policy will read while it changes its state,
    so that a bad one (or a context method that fails, or that calls back into
    the manager) is refused before anything changes."""
    cdef int64_t position
    if pos.d is not None:
        return 0        # (kvcy's own ReqContext checks positions when they are set)
    for key in keys:
        pos.get(key, &position)
    return 0


cdef _Positions _positions(object req_context):
    cdef _Positions pos = _Positions.__new__(_Positions)
    if _is_plain_ctx(req_context):
        d = req_context._offload_key_positions
        if type(d) is dict:
            pos.d = <dict>d
            return pos
    pos.getter = req_context.get_offload_key_position
    return pos


def order_request_keys(key_groups, req_context):
    """A request's keys head to tail: its groups concatenated in group order,
    then stably sorted by end-token position when every key has one.

    Args:
        key_groups: the request's keys, one list per KV cache group.
        req_context: the request, whose recorded positions order the keys.

    Raises:
        TypeError: a position read is not an int.
    """
    cdef list keys = [key for group in key_groups for key in group]
    cdef list positions = []
    cdef int64_t checked
    get = req_context.get_offload_key_position
    for key in keys:
        p = get(key)
        if p is None:
            return keys
        if type(p) is not int:
            _as_position(p, &checked)
        positions.append(p)
    order = sorted(range(len(keys)), key=positions.__getitem__)
    return [keys[i] for i in order]


cdef list _by_position(list keys, _Positions pos):
    """``keys`` stably sorted by position, or None when a key has none."""
    cdef vector[pair[int64_t, Py_ssize_t]] order
    cdef int64_t p
    cdef Py_ssize_t i, n = len(keys)
    cdef bint is_sorted = True
    order.reserve(n)
    for i in range(n):
        if not pos.get(keys[i], &p):
            return None
        if i and p < order.back().first:
            is_sorted = False
        order.push_back(pair[int64_t, Py_ssize_t](p, i))
    if is_sorted:
        return list(keys)
    cpp_sort(order.begin(), order.end())   # (position, index): a stable order
    return [keys[order[i].second] for i in range(n)]


cdef list _ordered(list groups, _Positions pos):
    """order_request_keys for groups of valid keys, positions read through ``pos``."""
    cdef list keys
    cdef list out
    if len(groups) == 1:
        keys = <list>groups[0]
    else:
        keys = []
        for group in groups:
            keys.extend(<list>group)
    out = _by_position(keys, pos)
    return keys if out is None else out


cdef int _one_group_order(list keys, _Positions pos, vector[Py_ssize_t]& order) except -1:
    """The request order of ``keys`` (first seen first) when they all belong to
    one group: 1, with ``order`` = indices into ``keys``, head first; 0 (and
    ``order`` untouched) for keys of several groups.

    For one group, order_request_keys is a stable sort by position when every
    key has one, else the keys as they are.
    """
    cdef Py_ssize_t i, n = len(keys)
    cdef uint32_t g0
    cdef int64_t p
    cdef bint all_positioned = True, is_sorted = True
    cdef vector[pair[int64_t, Py_ssize_t]] by_pos
    if n:
        g0 = _group_of(<bytes>keys[0])
        for i in range(1, n):
            if _group_of(<bytes>keys[i]) != g0:
                return 0
    by_pos.reserve(n)
    for i in range(n):
        if not pos.get(keys[i], &p):
            all_positioned = False
            break
        if i and p < by_pos.back().first:
            is_sorted = False
        by_pos.push_back(pair[int64_t, Py_ssize_t](p, i))
    order.clear()
    order.reserve(n)
    if all_positioned and not is_sorted:
        cpp_sort(by_pos.begin(), by_pos.end())   # (position, index): a stable order
        for i in range(n):
            order.push_back(by_pos[i].second)
    else:
        for i in range(n):
            order.push_back(i)
    return 1
