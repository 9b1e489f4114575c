# offload_c/policies_lru.pyx: LRUCachePolicy, least recently used ranked per request.
# (vLLM: vllm/v1/kv_offload/cpu/policies/lru.py.)
# Included into kvcy/_fast/_offload_c.pyx (one extension module), not compiled on its own.

cdef class _LRURequestRanks:
    """Kept on a ReqContext: LRU policy owner id -> (policy epoch, request rank)."""

    def __cinit__(self):
        self.ranks = {}


@cython.final
cdef class LRUCachePolicy(CachePolicy):
    """Least recently used, where recency is ranked per request.

    Every resident key has a rank ``(counter, -position)``; the lowest
    ``(rank, key bytes)`` among evictable keys is evicted first.  The keys a
    request stores or first reads with known positions share the request's
    rank (taken at its first access), so within one request the tail goes
    before the head.  ``touch`` and a request's end give keys fresh ranks.
    """

    def __cinit__(self):
        # (valid without __init__: the C paths trust _fresh)
        self._native = True
        self._fresh = _DList()
        self._owner = _next_owner()

    def __init__(self, cache_capacity):
        _check_int("cache_capacity", cache_capacity)
        # (run again on a used policy: the rank set's entries are borrowed from
        # the map, so they go before the map does)
        self.c_clear()
        CachePolicy.__init__(self, cache_capacity)
        self._native = True
        self._fresh = _DList()
        self._counter = 0
        self._epoch = 0
        self._owner = _next_owner()

    def __dealloc__(self):
        self._order.clear()

    # -- rank bookkeeping (the set holds borrowed pointers: a status is in it
    #    only while _chunks holds it, and it holds its key)
    cdef inline void _link_ranked(self, ChunkStatus st, int64_t a, int64_t b) except *:
        self._link_ranked_at(st, a, b, self._order.end())

    cdef inline void _link_ranked_at(self, ChunkStatus st, int64_t a, int64_t b,
                                     KvcyRankSet.iterator hint) except *:
        # ``hint``: an entry of the set the new one is expected just before
        # (amortized O(1) then; a wrong hint costs an ordinary O(log n) insert)
        st.rank_a = a
        st.rank_b = b
        st.order_it = self._order.insert(hint, kvcy_rank_entry(a, b, <PyObject *>st.key, <PyObject *>st))
        st.in_order = True

    cdef inline void _link_fresh(self, ChunkStatus st) noexcept:
        self._counter += 1
        st.rank_a = self._counter
        st.rank_b = 0
        st.where = 5
        self._fresh.append(st)

    cdef inline void _unlink(self, ChunkStatus st) noexcept:
        if st.in_order:
            # (a status is in_order only in the set of the policy whose _chunks holds it)
            self._order.erase(st.order_it)
            st.in_order = False
            self._erased += 1
        elif st.where == 5:
            self._fresh.unlink(st)
            st.where = 0

    cdef inline void _refresh(self, ChunkStatus st) except *:
        if st.where == 5 and st is self._fresh.tail:
            self._counter += 1
            st.rank_a = self._counter
            return
        self._unlink(st)
        self._link_fresh(st)

    cdef int64_t _request_rank(self, object ctx) except -1:
        cdef _LRURequestRanks holder
        state = _get_state(ctx, _LRURequestRanks)
        if state is None:
            holder = _LRURequestRanks.__new__(_LRURequestRanks)
            holder.ranks = {}
            _set_state(ctx, holder)
        elif type(state) is not _LRURequestRanks:  # (a ReqContext of another kind)
            raise TypeError(f"req_context.get_state(_LRURequestRanks) returned {type(state).__name__}, not the _LRURequestRanks set on it")
        else:
            holder = <_LRURequestRanks>state
        got = holder.ranks.get(self._owner)
        if type(got) is tuple and (<tuple>got)[0] == self._epoch:
            return <int64_t>(<tuple>got)[1]
        self._counter += 1
        holder.ranks.clear()  # one rank per context, as vLLM: another policy's is replaced
        holder.ranks[self._owner] = (self._epoch, self._counter)
        return self._counter

    cdef int c_insert(self, bytes key, ChunkStatus st, object ctx, _Positions pos,
                      bint absent=False) except -1:
        cdef int64_t p, a = 0
        cdef ChunkStatus old
        cdef bint ranked = pos is not None and pos.get(key, &p)
        if ranked:
            a = self._request_rank(ctx)
        # (nothing below calls back into Python; ``old`` is typed so that
        # clearing its C field is not a Python attribute lookup that fails
        # after the unlink)
        old = None if absent else self.c_get(key)
        if old is not None:
            self._unlink(old)
            old.owned = False
        st.key = key
        st.owned = True
        st.lru_owner = <void *>self
        self._chunks[key] = st
        if ranked:
            self._link_ranked(st, a, -p)
        else:
            self._link_fresh(st)
        return 0

    cdef int c_insert_new(self, list keys, vector[Py_ssize_t]& ids, object ctx,
                          _Positions pos) except -1:
        return self.c_insert_new_noted(keys, ids, ctx, pos, None)

    cdef int c_insert_new_noted(self, list keys, vector[Py_ssize_t]& ids, object ctx,
                                _Positions pos, list made) except -1:
        # (``made``: the statuses to use, one per key, made by the manager
        # before it knew their chunk ids; the request's record holds them)
        # c_insert per key, with the request's rank taken once (at the first
        # key with a position, as c_insert would) and each ranked key inserted
        # with the previous one as hint: an offer's keys come head first, so
        # each sorts just before the one inserted before it.  Only for a plain
        # ReqContext with its positions dict: then nothing in the loop runs
        # Python code after the rank is taken, so the hint stays valid.
        cdef Py_ssize_t i, n = len(keys)
        cdef int64_t p, a = 0
        cdef bint have_rank = False
        cdef ChunkStatus st
        cdef bytes key
        cdef KvcyRankSet.iterator hint
        cdef int64_t erased = self._erased
        if not _is_plain_ctx(ctx) or pos is None or pos.d is None:
            return CachePolicy.c_insert_new(self, keys, ids, ctx, pos)
        for i in range(n):
            key = <bytes>keys[i]
            if made is not None:
                st = <ChunkStatus>made[i]
                st.chunk_id = ids[i]
                st.ref_cnt = -1
            else:
                st = _new_status(ids[i])
            if pos.get(key, &p):
                if not have_rank:
                    a = self._request_rank(ctx)
                    have_rank = True
                    hint = self._order.end()
                    erased = self._erased
                elif erased != self._erased:
                    # (a key equal to a position's key ran Python code that
                    # took an entry out: the hint may be gone)
                    hint = self._order.end()
                    erased = self._erased
                st.key = key
                st.owned = True
                st.lru_owner = <void *>self
                self._chunks[key] = st
                self._link_ranked_at(st, a, -p, hint)
                hint = st.order_it
            else:
                st.key = key
                st.owned = True
                st.lru_owner = <void *>self
                self._chunks[key] = st
                self._link_fresh(st)
        return 0

    cdef int c_remove(self, bytes key) except -1:
        cdef ChunkStatus st = self.c_get(key)
        if st is None:
            raise KeyError(key)
        self._unlink(st)
        st.owned = False
        del self._chunks[key]
        return 0

    cdef int c_touch(self, list keys, object ctx) except -1:
        cdef Py_ssize_t i
        cdef ChunkStatus st
        for i in range(len(keys) - 1, -1, -1):
            st = self.c_get(keys[i])
            if st is not None:
                self._refresh(st)
        return 0

    cdef int c_on_store_miss(self, list keys, object ctx) except -1:
        return 0

    cdef int c_on_request_access(self, list keys, object ctx, _Positions pos) except -1:
        cdef int64_t r = self._request_rank(ctx)
        cdef int64_t p
        cdef ChunkStatus st
        for key in keys:
            if self.c_get(key) is None or not pos.get(key, &p):
                continue
            st = self.c_get(key)       # again: reading the position may run Python code
            if st is not None and (r > st.rank_a or (r == st.rank_a and -p > st.rank_b)):
                self._unlink(st)
                self._link_ranked(st, r, -p)
        return 0

    cdef int c_on_request_finished(self, list groups, set insertion_only, set reused,
                                   object ctx, _Positions pos) except -1:
        cdef list order = _ordered(groups, pos)
        cdef Py_ssize_t i
        cdef ChunkStatus st
        for i in range(len(order) - 1, -1, -1):
            st = self.c_get(order[i])
            if st is not None:
                self._refresh(st)
        return 0

    cdef int c_finish_keys(self, list keys, _Positions pos, list hints=None) except -1:
        """c_on_request_finished for a request's keys, first seen first (the
        manager's record): grouped by group index in index order, keeping
        that order within a group, as the manager would pass them."""
        cdef Py_ssize_t i, n = len(keys)
        cdef vector[Py_ssize_t] order
        cdef ChunkStatus st
        if n == 0:
            return 0
        if _one_group_order(keys, pos, order):
            # fresh ranks, tail first (reading the positions above was the
            # only step that could run Python code).  ``hints[j]``: the chunk
            # keys[j] had when recorded, or None; still this key's chunk if
            # still resident under the same key object.
            for i in range(n - 1, -1, -1):
                j = order[i]
                h = hints[j] if hints is not None else None
                if (h is not None and type(h) is ChunkStatus and (<ChunkStatus>h).owned
                        and (<ChunkStatus>h).lru_owner == <void *>self
                        and (<ChunkStatus>h).key is keys[j]):
                    st = <ChunkStatus>h
                else:
                    st = self.c_get(keys[j])
                if st is not None:
                    self._refresh(st)
            return 0
        by_group = {}
        for key in keys:
            by_group.setdefault(_group_of(<bytes>key), []).append(key)
        groups = []
        for gi in sorted(by_group):
            members = <list>by_group[gi]
            ordered = _by_position(members, pos)
            groups.append(members if ordered is None else ordered)
        return self.c_on_request_finished(groups, None, None, None, pos)

    cdef int c_mark_evictable(self, bytes key) except -1:
        return 0

    cdef int c_mark_non_evictable(self, bytes key) except -1:
        return 0

    cdef list c_evict(self, Py_ssize_t n, set protected):
        cdef list out = []
        cdef ChunkStatus st, f, r
        cdef _Node fresh = self._fresh.head
        cdef KvcyRankSet.iterator it = self._order.begin()
        cdef KvcyRankSet.iterator end = self._order.end()
        cdef bint check = protected is not None and len(protected) > 0
        if n <= 0:
            return out
        # Merge the fresh list and the ranked set in rank order.  The scan only
        # reads C fields and tests bytes in a set of bytes: no Python code runs
        # while the iterator is live.
        while True:
            f = <ChunkStatus>fresh
            r = <ChunkStatus>deref(it).status if it != end else None
            if f is None and r is None:
                break
            if r is None or (f is not None and (f.rank_a < r.rank_a or (f.rank_a == r.rank_a and f.rank_b < r.rank_b))):
                st = f
                fresh = f.next
            else:
                st = r
                inc(it)
            if st.ref_cnt == 0 and not (check and st.key in protected):
                out.append(st)
                if len(out) == n:
                    break
        if len(out) < n:
            return None
        # the map's entries of the evicted keys are cold: their lookups are
        # pipelined (kvcy_dict_ahead_at), over the keys held by ``out``
        cdef vector[PyObject *] keys
        cdef Py_ssize_t i
        keys.reserve(n)
        for st in out:
            keys.push_back(<PyObject *>st.key)
        for i in range(-2 * KVCY_AHEAD_D, 0):
            kvcy_dict_ahead_at(self._chunks, keys.data(), n, i)
        for i in range(n):
            kvcy_dict_ahead_at(self._chunks, keys.data(), n, i)
            st = <ChunkStatus>_list_item(out, i)
            self._unlink(st)
            st.owned = False
            del self._chunks[st.key]
        return out

    cdef int c_clear(self) except -1:
        self._order.clear()
        self._erased += 1
        self._fresh.clear()
        for st in self._chunks.values():
            (<ChunkStatus>st).in_order = False
            (<ChunkStatus>st).owned = False
        self._chunks = {}
        self._counter = 0
        self._epoch += 1
        return 0

    # -- Python interface ----------------------------------------------------------
    @property
    def chunks(self):
        """key -> chunk of every resident key (a read-only view)."""
        return MappingProxyType(self._chunks)

    @property
    def _ranks(self):
        """key -> rank of every resident key (a snapshot)."""
        return {k: ((<ChunkStatus>st).rank_a, (<ChunkStatus>st).rank_b) for k, st in self._chunks.items()}

    def get(self, key):
        """The chunk of a resident key, or ``None``."""
        return self.c_get(key)

    def insert(self, key, chunk, req_context):
        """Make ``key`` resident; ranked with its request if its position is known."""
        _check_key(key)
        _check_new_chunk(_as_chunk(chunk))
        self.c_insert(bytes(key), <ChunkStatus>chunk, req_context, _positions(req_context))

    def remove(self, key):
        """Drop a resident key."""
        _check_key(key)
        self.c_remove(bytes(key))

    def touch(self, keys, req_context):
        """Fresh ranks for the resident keys, last key first (the first ends most recent)."""
        self.c_touch(_key_seq(keys), req_context)

    def on_request_access(self, keys, req_context):
        """Raise resident keys with positions to the request's rank (never lowers one)."""
        self.c_on_request_access(_key_seq(keys), req_context, _positions(req_context))

    def on_request_finished(self, key_groups, insertion_only_keys, reused_keys, req_context):
        """Fresh ranks for the request's resident keys, tail first (the head ends most recent)."""
        cdef list order = order_request_keys(key_groups, req_context)
        cdef Py_ssize_t i
        cdef ChunkStatus st
        for i in range(len(order) - 1, -1, -1):
            st = self.c_get(order[i])
            if st is not None:
                self._refresh(st)

    def mark_evictable(self, key):
        """``key`` may be evicted again."""
        # (evictability is the chunk's ref_cnt here; a key that is not
        # resident is vLLM's KeyError, as in the pure twin)
        if self.c_get(key) is None:
            raise KeyError(key)

    def mark_non_evictable(self, key):
        """``key`` is pinned."""

    def evict(self, n, protected):
        """Evict the ``n`` evictable, unprotected keys lowest in ``(rank, key)`` order."""
        return _evict_native(self, len(self._chunks), n, protected)

    def clear(self):
        """Forget every key and every request's rank."""
        self.c_clear()
