# offload_c/cache_policy.pyx: CachePolicy, the interface the manager calls (C paths for the
# native policies, Python calls for a factory policy), and the policies' argument checks.
# (vLLM: vllm/v1/kv_offload/cpu/policies/base.py.)
# Included into kvcy/_fast/_offload_c.pyx (one extension module), not compiled on its own.

cdef class CachePolicy:
    """Which chunk each resident key has, and which keys to evict.

    The manager owns the chunk pool and the reference counts; a policy owns
    the key -> :class:`ChunkStatus` map and the recency bookkeeping, and is
    told about every access.  The hooks without a body here are optional.

    Args:
        cache_capacity: the cache size in chunks.
    """

    def __cinit__(self):
        # (a policy made by __new__ alone, without __init__, is a valid empty
        # one: the C paths read the map without a None check)
        self._chunks = {}

    def __init__(self, cache_capacity):
        self.cache_capacity = _check_int("cache_capacity", cache_capacity)
        self._chunks = {}

    # -- what the manager calls; a Python subclass is reached through its methods
    cdef inline ChunkStatus c_get(self, object key):
        cdef PyObject *p
        if self._native:
            p = _map_get(self._chunks, key)
            if p == NULL or _is_ghost(<_Node>p):
                return None
            return <ChunkStatus>p
        got = self.get(key)
        if got is not None and type(got) is not ChunkStatus:
            raise TypeError(f"{type(self).__name__}.get returned {type(got).__name__}, not a ChunkStatus")
        return <ChunkStatus>got

    cdef int c_insert(self, bytes key, ChunkStatus chunk, object ctx, _Positions pos,
                      bint absent=False) except -1:
        self.insert(key, chunk, ctx)
        return 0

    cdef int c_insert_new(self, list keys, vector[Py_ssize_t]& ids, object ctx,
                          _Positions pos) except -1:
        """Insert non-resident ``keys[i]`` with a new write-pending chunk ``ids[i]``, in order."""
        cdef Py_ssize_t i
        for i in range(len(keys)):
            self.c_insert(<bytes>keys[i], _new_status(ids[i]), ctx, pos, True)
        return 0

    cdef int c_remove(self, bytes key) except -1:
        self.remove(key)
        return 0

    cdef int c_touch(self, list keys, object ctx) except -1:
        self.touch(keys, ctx)
        return 0

    cdef int c_on_store_miss(self, list keys, object ctx) except -1:
        self.on_store_miss(keys, ctx)
        return 0

    cdef int c_on_request_access(self, list keys, object ctx, _Positions pos) except -1:
        self.on_request_access(keys, ctx)
        return 0

    cdef int c_on_request_finished(self, list groups, set insertion_only, set reused,
                                   object ctx, _Positions pos) except -1:
        self.on_request_finished(groups, insertion_only, reused, ctx)
        return 0

    cdef int c_mark_evictable(self, bytes key) except -1:
        self.mark_evictable(key)
        return 0

    cdef int c_mark_non_evictable(self, bytes key) except -1:
        self.mark_non_evictable(key)
        return 0

    cdef list c_evict(self, Py_ssize_t n, set protected):
        """Evicted keys' ChunkStatus (each with its key), or None."""
        got = self.evict(n, protected)
        if got is None:
            return None
        cdef list out = []
        for item in got:
            key, chunk = item
            _check_key(key)
            if type(chunk) is not ChunkStatus:
                raise TypeError(f"{type(self).__name__}.evict returned {type(chunk).__name__}, not a ChunkStatus")
            (<ChunkStatus>chunk).key = bytes(key)
            out.append(chunk)
        if len(out) != n:
            raise RuntimeError(f"{type(self).__name__}.evict returned {len(out)} keys, not {n}")
        return out

    cdef int c_clear(self) except -1:
        self.clear()
        return 0

    # -- the Python interface -------------------------------------------------
    def get(self, key):
        """The chunk of a resident key, or ``None``."""
        raise NotImplementedError

    def insert(self, key, chunk, req_context):
        """Make ``key`` resident in ``chunk`` (being written), stored for ``req_context``."""
        raise NotImplementedError

    def remove(self, key):
        """Drop a resident key whose store failed."""
        raise NotImplementedError

    def touch(self, keys, req_context):
        """Mark keys as recently used; the first key ends most recent."""
        raise NotImplementedError

    def on_store_miss(self, keys, req_context):
        """Keys a request offered that are not resident (seen once per request).

        By default a ``touch`` of them (as vLLM's ``CachePolicy``).
        """
        self.touch(keys, req_context)

    def on_request_access(self, keys, req_context):
        """Keys a request loaded or offered for the first time."""

    def on_request_finished(self, key_groups, insertion_only_keys, reused_keys, req_context):
        """A request finished: its keys per group, which it only stored and which it reused.

        By default one ``touch`` per group, in group order (as vLLM's ``CachePolicy``).
        """
        for keys in key_groups:
            self.touch(keys, req_context)

    def evict(self, n, protected):
        """Remove ``n`` evictable keys not in ``protected`` and return them with their chunks.

        Returns ``None``, changing nothing, when fewer than ``n`` qualify.
        """
        raise NotImplementedError

    def clear(self):
        """Forget every key."""
        raise NotImplementedError

    def mark_evictable(self, key):
        """A resident key's ``ref_cnt`` became 0."""

    def mark_non_evictable(self, key):
        """A resident key's ``ref_cnt`` left 0 (a load pinned it)."""


cdef ChunkStatus _as_chunk(object chunk):
    # The chunk argument of a policy's public insert (the pure twin's _check_chunk).
    if type(chunk) is not ChunkStatus and not isinstance(chunk, ChunkStatus):
        raise TypeError(f"chunk must be a ChunkStatus, got {type(chunk).__name__}")
    return <ChunkStatus>chunk


cdef int _check_new_chunk(ChunkStatus chunk) except -1:
    # (``where``: an evicted chunk that stands as its key's ARC ghost)
    if chunk.owned or chunk.where != 0:
        raise ValueError(f"{chunk!r} already holds a key of a cache policy")
    return 0


cdef list _key_seq(object keys):
    """The keys of a policy call, as a list (each must be hashable; any type)."""
    if type(keys) is list:
        return <list>keys
    if isinstance(keys, (bytes, str)) or not isinstance(keys, _Iterable):
        raise TypeError(f"keys must be a collection of offload keys, got {type(keys).__name__}")
    return list(keys)


cdef set _bytes_set(object keys):
    """The bytes among ``keys``: what a key of a policy can equal."""
    cdef set out = set()
    if keys is None:
        return out
    for k in keys:
        if type(k) is bytes:
            out.add(k)
        elif isinstance(k, bytes):
            out.add(bytes(k))
    return out


cdef object _evict_native(CachePolicy policy, Py_ssize_t num_resident, object n, object protected):
    """The Python ``evict`` of the native policies: checks ``n``, then their ``c_evict``."""
    if isinstance(n, bool) or not isinstance(n, int):
        raise TypeError(f"n must be an int, got {type(n).__name__}")
    if n <= 0:
        return []
    if n > num_resident:
        return None
    got = policy.c_evict(<Py_ssize_t>n, _bytes_set(protected))
    if got is None:
        return None
    return [((<ChunkStatus>st).key, st) for st in got]


# -- count_hits over a native policy's map (the manager's admission loop) -----

cdef enum:
    _AHEAD = 8      # count_hits looks this many keys ahead (a power of 2)
    _SMALL_MAP = 1 << 15    # below this many keys a map's lookups mostly hit the cache


cdef Py_ssize_t _count_native_hits(dict chunks, list ks, Py_ssize_t i, Py_ssize_t last) except -1:
    """count_hits' loop over a native policy's map, from ``i``: the index of
    the first key that is not a HIT, or of the first key that is not exact
    bytes of 4 bytes or more (the caller's loop takes over there).

    The map is read ``_AHEAD`` keys ahead of the key being decided, each
    found chunk prefetched, so that the memory reads of several keys
    overlap.  Reading ahead is safe: only exact bytes are looked up (nothing
    runs Python code, nothing changes the map or the list), and a key past
    the first miss is read but never decided.
    """
    cdef PyObject *ahead[_AHEAD]
    cdef PyObject *k
    cdef PyObject *p
    cdef Py_ssize_t j = i, end = len(ks)
    if last < end:
        end = last
    if PyDict_Size(chunks) < _SMALL_MAP:
        # a map that stays in cache: the plain loop (the pipeline's
        # bookkeeping would only cost here)
        while i < end:
            k = _list_item(ks, i)
            if type(<object>k) is not bytes or PyBytes_GET_SIZE(<object>k) < 4:
                return i        # decided by the caller's checks
            p = kvcy_offload_bytes_get(chunks, k)
            if p == NULL or _is_ghost(<_Node>p) or (<ChunkStatus>p).ref_cnt < 0:
                return i
            i += 1
        return i
    while i < end:
        while j < end and j < i + _AHEAD:
            k = _list_item(ks, j)
            if j + _AHEAD < end:
                kvcy_offload_prefetch(_list_item(ks, j + _AHEAD))
            if type(<object>k) is not bytes or PyBytes_GET_SIZE(<object>k) < 4:
                end = j         # decided by the caller's checks
                break
            p = kvcy_offload_bytes_get(chunks, k)
            if p != NULL:
                kvcy_offload_prefetch(p)
            ahead[j & (_AHEAD - 1)] = p
            j += 1
        if i >= end:
            break
        p = ahead[i & (_AHEAD - 1)]
        if p == NULL or _is_ghost(<_Node>p) or (<ChunkStatus>p).ref_cnt < 0:
            return i
        i += 1
    return i
