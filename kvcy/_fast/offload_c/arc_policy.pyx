# offload_c/arc_policy.pyx: ARCCachePolicy, adaptive replacement with ghost lists.
# (vLLM: vllm/v1/kv_offload/cpu/policies/arc.py.)
# Included into kvcy/_fast/_offload_c.pyx (one extension module), not compiled on its own.

@cython.final
cdef class ARCCachePolicy(CachePolicy):
    """Adaptive replacement: recency (``t1``) and frequency (``t2``) lists.

    Keys enter ``t1``; a touch or a reuse by a finished request moves them to
    ``t2``.  Evicted keys leave a ghost in ``b1`` / ``b2``; a ghost hit moves
    ``target_t1_size``, the share of the cache ``t1`` may keep, towards the
    list that would have kept the key.
    """

    def __cinit__(self):
        # (valid without __init__: the C paths trust the four lists)
        self._native = True
        self._t1 = _DList()
        self._t2 = _DList()
        self._b1 = _DList()
        self._b2 = _DList()

    def __init__(self, cache_capacity):
        CachePolicy.__init__(self, cache_capacity)
        self._native = True
        self._t1 = _DList()
        self._t2 = _DList()
        self._b1 = _DList()
        self._b2 = _DList()
        self._target = 0.0

    cdef inline _DList _list_of(self, _Node n):
        if n.where == 1:
            return self._t1
        if n.where == 2:
            return self._t2
        if n.where == 3:
            return self._b1
        return self._b2

    cdef int c_insert(self, bytes key, ChunkStatus st, object ctx, _Positions pos,
                      bint absent=False) except -1:
        cdef _Node old
        # (nothing below runs Python code: the key is exact bytes)
        cdef PyObject *p = PyDict_SetDefault(self._chunks, key, st)
        if p != <PyObject *>st:
            # a ghost, or (when not absent) a resident key's old chunk
            old = <_Node>p
            if not _is_ghost(old):
                (<ChunkStatus>old).owned = False
            self._list_of(old).unlink(old)
            old.where = 0
            self._chunks[key] = st
        st.key = key
        st.owned = True
        st.where = 1
        self._t1.append(st)
        return 0

    cdef int c_remove(self, bytes key) except -1:
        cdef ChunkStatus st = self.c_get(key)
        if st is None:
            return 0  # (not resident, a ghost included: nothing to drop, as vLLM)
        self._list_of(st).unlink(st)
        st.where = 0
        st.owned = False
        del self._chunks[key]
        return 0

    cdef int _ghost_hit(self, object key) except -1:
        cdef PyObject *g = _map_get(self._chunks, key)
        if g == NULL or not _is_ghost(<_Node>g):
            return 0
        self._ghost_node_hit(<_Node>g)
        return 0

    cdef void _ghost_node_hit(self, _Node gn) noexcept:
        cdef double d
        if gn.where == 3:
            d = <double>self._b2.size / <double>self._b1.size
            if d < 1.0:
                d = 1.0
            self._target = self._target + d
            if self._target > <double>self.cache_capacity:
                self._target = <double>self.cache_capacity
            self._b1.unlink(gn)
            self._b1.append(gn)
        else:
            d = <double>self._b1.size / <double>self._b2.size
            if d < 1.0:
                d = 1.0
            self._target = self._target - d
            if self._target < 0.0:
                self._target = 0.0
            self._b2.unlink(gn)
            self._b2.append(gn)

    cdef int c_touch(self, list keys, object ctx) except -1:
        cdef Py_ssize_t i
        cdef ChunkStatus st
        for i in range(len(keys) - 1, -1, -1):
            key = keys[i]
            st = self.c_get(key)
            if st is None:
                self._ghost_hit(key)
            elif st.where == 1:
                self._t1.unlink(st)
                if st.ref_cnt < 0:
                    self._t1.append(st)
                else:
                    st.where = 2
                    self._t2.append(st)
            else:
                self._t2.unlink(st)
                self._t2.append(st)
        return 0

    cdef int c_on_store_miss(self, list keys, object ctx) except -1:
        cdef Py_ssize_t i
        for i in range(len(keys) - 1, -1, -1):
            self._ghost_hit(keys[i])
        return 0

    cdef int c_on_request_access(self, list keys, object ctx, _Positions pos) except -1:
        return 0

    cdef int c_ghost_hits(self, list nodes) except -1:
        """``c_on_store_miss`` for keys whose map entries were read just before:
        ``nodes[i]`` is the key's ghost node then, or None (no ghost)."""
        cdef Py_ssize_t i
        cdef _Node g
        for i in range(len(nodes) - 1, -1, -1):
            g = <_Node>nodes[i]
            if g is not None and _is_ghost(g):     # (still a ghost: nothing trimmed it)
                self._ghost_node_hit(g)
        return 0

    cdef int c_insert_new_ghosts(self, list keys, vector[Py_ssize_t]& ids, list ghosts) except -1:
        """``c_insert_new`` where ``ghosts[i]`` is ``keys[i]``'s ghost node as read
        before the eviction (or None): a ghost still in place is replaced by the
        new chunk in one map write, or none when the ghost is an evicted chunk
        that nothing else holds (then it becomes the new chunk itself)."""
        cdef Py_ssize_t i
        cdef _Node g
        cdef ChunkStatus st
        cdef bytes key
        for i in range(len(keys)):
            key = <bytes>keys[i]
            g = <_Node>ghosts[i]
            if g is not None and _is_ghost(g):
                self._list_of(g).unlink(g)
                # held by the map, ``ghosts`` and ``g`` only: no one can tell
                # this object from a new one
                if type(g) is ChunkStatus and Py_REFCNT(g) <= 3:
                    st = <ChunkStatus>g
                    st.chunk_id = ids[i]
                    st.ref_cnt = -1
                else:
                    g.where = 0
                    st = _new_status(ids[i])
                    self._chunks[key] = st
                st.key = key
                st.owned = True
                st.where = 1
                self._t1.append(st)
            else:
                self.c_insert(key, _new_status(ids[i]), None, None, True)
        return 0

    cdef int _finish(self, list order, object insertion_only, object reused) except -1:
        cdef Py_ssize_t i
        cdef ChunkStatus st
        for i in range(len(order) - 1, -1, -1):
            key = order[i]
            if key in insertion_only:
                st = self.c_get(key)
                if st is not None:
                    self._list_of(st).unlink(st)
                    self._list_of(st).append(st)
            elif key in reused:
                st = self.c_get(key)
                if st is None:
                    continue
                if st.where == 1:
                    self._t1.unlink(st)
                    st.where = 2
                    self._t2.append(st)
                else:
                    self._t2.unlink(st)
                    self._t2.append(st)
        return 0

    cdef int c_on_request_finished(self, list groups, set insertion_only, set reused,
                                   object ctx, _Positions pos) except -1:
        return self._finish(_ordered(groups, pos), insertion_only, reused)

    cdef int c_finish_flags(self, list keys, list flags, vector[Py_ssize_t]& order) except -1:
        """``_finish`` for a record's keys and flags (``keys[order[i]]``, head
        first): a key with ``_REUSED`` is reused, else one with ``_INSERTED``
        is insertion-only, as the manager's sets would say."""
        cdef Py_ssize_t i, j, f, n
        cdef ChunkStatus st
        # the keys to look up, in visiting order (held by ``keys``), so that
        # their lookups in the map are pipelined (kvcy_dict_ahead_at)
        cdef vector[PyObject *] todo
        cdef vector[Py_ssize_t] todo_flags
        for j in range(<Py_ssize_t>order.size() - 1, -1, -1):
            i = order[j]
            f = <Py_ssize_t>flags[i]
            if f & (_REUSED | _INSERTED):
                todo.push_back(_list_item(keys, i))
                todo_flags.push_back(f)
        n = <Py_ssize_t>todo.size()
        for j in range(-2 * KVCY_AHEAD_D, 0):
            kvcy_dict_ahead_at(self._chunks, todo.data(), n, j)
        for j in range(n):
            kvcy_dict_ahead_at(self._chunks, todo.data(), n, j)
            f = todo_flags[j]
            st = self.c_get(<object>todo[j])
            if st is None:
                continue
            if f & _REUSED:
                if st.where == 1:
                    self._t1.unlink(st)
                    st.where = 2
                    self._t2.append(st)
                else:
                    self._t2.unlink(st)
                    self._t2.append(st)
            else:
                self._list_of(st).unlink(st)
                self._list_of(st).append(st)
        return 0

    cdef int c_mark_evictable(self, bytes key) except -1:
        return 0

    cdef int c_mark_non_evictable(self, bytes key) except -1:
        return 0

    cdef list c_evict(self, Py_ssize_t n, set protected):
        return self._evict(n, protected, False)

    cdef list c_evict_in_place(self, Py_ssize_t n, set protected):
        """``c_evict`` for the manager, which only reads the evicted chunks'
        ids and keys: an evicted chunk that nothing else holds stays in the
        map as its key's ghost (no ghost node made, no map write)."""
        return self._evict(n, protected, True)

    cdef list _evict(self, Py_ssize_t n, set protected, bint in_place):
        cdef list out = []
        cdef Py_ssize_t v = self._t1.size
        cdef Py_ssize_t target = <Py_ssize_t>self._target
        cdef _Node c1 = self._t1.head
        cdef _Node c2 = self._t2.head
        cdef ChunkStatus st, got
        cdef bint check = protected is not None and len(protected) > 0
        cdef Py_ssize_t i
        cdef _Node g
        cdef bint from_t1
        if n <= 0:
            return out
        for i in range(n):
            got = None
            if v >= target:
                while c1 is not None:
                    st = <ChunkStatus>c1
                    c1 = c1.next
                    if st.ref_cnt == 0 and not (check and st.key in protected):
                        got = st
                        v -= 1
                        break
            if got is None:
                while c2 is not None:
                    st = <ChunkStatus>c2
                    c2 = c2.next
                    if st.ref_cnt == 0 and not (check and st.key in protected):
                        got = st
                        break
            if got is None:
                while c1 is not None:
                    st = <ChunkStatus>c1
                    c1 = c1.next
                    if st.ref_cnt == 0 and not (check and st.key in protected):
                        got = st
                        v -= 1
                        break
                if got is None:
                    return None
            out.append(got)
        got = None      # (holds no chunk: the loop below counts who holds one)
        for st in out:
            from_t1 = st.where == 1
            self._list_of(st).unlink(st)
            if in_place and Py_REFCNT(st) <= 3:
                # (unlinked) held by the map, ``out`` and ``st`` only: the
                # chunk turns into its key's ghost where it is
                g = st
            else:
                g = _Node.__new__(_Node)
                g.key = st.key
            if from_t1:
                g.where = 3
                self._b1.append(g)
            else:
                g.where = 4
                self._b2.append(g)
            st.owned = False
            if g is not st:
                st.where = 0
                self._chunks[st.key] = g       # the key's entry becomes its ghost
        while self._b1.size > self.cache_capacity:
            g = self._b1.head
            self._b1.unlink(g)
            g.where = 0
            del self._chunks[g.key]
        while self._b2.size > self.cache_capacity:
            g = self._b2.head
            self._b2.unlink(g)
            g.where = 0
            del self._chunks[g.key]
        return out

    cdef int c_clear(self) except -1:
        cdef _Node n
        for lst in (self._t1, self._t2):
            n = (<_DList>lst).head
            while n is not None:
                (<ChunkStatus>n).owned = False
                n = n.next
        self._t1.clear()
        self._t2.clear()
        self._b1.clear()
        self._b2.clear()
        self._chunks = {}
        self._target = 0.0
        return 0

    # -- Python interface ----------------------------------------------------------
    cdef object _snapshot(self, _DList lst, bint with_chunks):
        out = OrderedDict()
        cdef _Node n = lst.head
        while n is not None:
            out[n.key] = n if with_chunks else None
            n = n.next
        return out

    @property
    def t1(self):
        """Keys seen once, oldest first: key -> chunk (a snapshot)."""
        return self._snapshot(self._t1, True)

    @property
    def t2(self):
        """Keys seen again, oldest first: key -> chunk (a snapshot)."""
        return self._snapshot(self._t2, True)

    @property
    def b1(self):
        """Ghosts of keys evicted from t1, oldest first (a snapshot)."""
        return self._snapshot(self._b1, False)

    @property
    def b2(self):
        """Ghosts of keys evicted from t2, oldest first (a snapshot)."""
        return self._snapshot(self._b2, False)

    @property
    def target_t1_size(self):
        """How many chunks t1 aims to hold."""
        return self._target

    def get(self, key):
        """The chunk of a resident key, or ``None``."""
        return self.c_get(key)

    def insert(self, key, chunk, req_context):
        """Make ``key`` the newest entry of ``t1``; it stops being a ghost."""
        _check_key(key)
        _check_new_chunk(_as_chunk(chunk))
        self.c_insert(bytes(key), <ChunkStatus>chunk, req_context, None)

    def remove(self, key):
        """Drop a resident key, leaving no ghost (a key not resident: nothing happens)."""
        _check_key(key)
        self.c_remove(bytes(key))

    def touch(self, keys, req_context):
        """Last key first: t1 -> t2 (pending keys stay in t1), t2 -> newest, ghosts adapt."""
        self.c_touch(_key_seq(keys), req_context)

    def on_store_miss(self, keys, req_context):
        """A ghost hit for each key, last key first."""
        self.c_on_store_miss(_key_seq(keys), req_context)

    def on_request_finished(self, key_groups, insertion_only_keys, reused_keys, req_context):
        """Tail first: keys only stored become newest in their list; reused keys newest in t2."""
        self._finish(order_request_keys(key_groups, req_context), insertion_only_keys, reused_keys)

    def evict(self, n, protected):
        """Pick ``n`` evictable, unprotected keys, from t1 while it is over target, else t2."""
        return _evict_native(self, self._t1.size + self._t2.size, n, protected)

    def clear(self):
        """Forget every key and ghost; the target goes back to 0."""
        self.c_clear()
