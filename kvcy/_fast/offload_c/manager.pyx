# offload_c/manager.pyx: CPUOffloadingManager, the CPU tier's scheduler-side manager (its
# per-request access records are in access_record.pyx).  (vLLM: vllm/v1/kv_offload/cpu/manager.py.)
# Included into kvcy/_fast/_offload_c.pyx (one extension module), not compiled on its own.

from collections.abc import Iterator as _Iterator
from dataclasses import replace as _dc_replace

#: The policies every manager knows without the factory.
_BUILTIN_POLICIES = {"lru": LRUCachePolicy, "arc": ARCCachePolicy}

# The record flags (access_record.pxd) as Python ints, for the records' dicts.
cdef object _FLAG_NONE = 0
cdef object _FLAG_MISSED = <Py_ssize_t>_MISSED


cdef class CPUOffloadingManager:
    """The scheduler-side manager of a CPU cache of ``num_chunks`` chunks.

    It hands out chunks for stores (fresh ones first, then freed ones, last
    freed first), counts readers per chunk, asks its cache policy what to
    evict when the cache is full, and queues ``OffloadingEvent``s.  A chunk is
    write-pending from ``prepare_store`` to ``complete_store``, then readable;
    ``prepare_load`` pins it until ``complete_load``.  Only readable, unpinned
    chunks are evicted, and never one the current offer contains.

    Args:
        num_chunks: the cache size in chunks (may be 0).
        cache_policy: ``"lru"``, ``"arc"`` or a name registered with
            ``CachePolicyFactory``.
        cache_policy_module_path: a module to import the policy class named
            ``cache_policy`` from, instead of the registry.
        enable_events: queue events for ``take_events``.
        store_threshold: with 2 or more, a new key is stored only once it has
            been offered that many times (counted in a tracker of at most
            ``max_tracker_size`` keys); 0 and 1 store every offer.
        max_tracker_size: capacity of that tracker.
        info: a ``CPUOffloadingInfo`` (any ``ConfigInfo``), whose labels
            ``config_info()`` reports; kvcy also takes a plain dict of labels.

    Raises:
        TypeError: an argument has the wrong type.
        ValueError: a negative size or threshold, or an unknown policy name.
    """

    def __cinit__(self):
        # a manager made by __new__ alone, without __init__, is a valid one of
        # 0 chunks (its C paths trust the policy and the lists)
        self._pol = LRUCachePolicy.__new__(LRUCachePolicy)
        self._alloc_sizes = []
        self._owner_c = _next_owner()
        _set_api_types(self, _KVCY_API)   # (kvcy's result types until told of others)

    def __init__(self, num_chunks, cache_policy="lru", cache_policy_module_path=None,
                 enable_events=False, store_threshold=1, max_tracker_size=64_000, info=None):
        cdef Py_ssize_t n = _check_int("num_chunks", num_chunks)
        if not isinstance(cache_policy, str):
            raise TypeError(f"cache_policy must be a str, got {type(cache_policy).__name__}")
        if cache_policy_module_path is not None and not isinstance(cache_policy_module_path, str):
            raise TypeError(
                f"cache_policy_module_path must be a str or None, got {type(cache_policy_module_path).__name__}"
            )
        cdef Py_ssize_t threshold = _check_int("store_threshold", store_threshold)
        cdef Py_ssize_t tracker = _check_int("max_tracker_size", max_tracker_size)
        if info is None:
            labels = {}
        elif isinstance(info, ConfigInfo) or hasattr(info, "as_config_info"):  # (vLLM's CPUOffloadingInfo too)
            labels = info.as_config_info()
        elif isinstance(info, dict):
            labels = dict(info)
        else:
            raise TypeError(
                f"info must be a CPUOffloadingInfo (a ConfigInfo), a dict of labels or None, got {type(info).__name__}"
            )
        policy_cls = _BUILTIN_POLICIES.get(cache_policy)  # (registered names first, as vLLM)
        if policy_cls is None:
            from kvcy.kv_offload.cpu.policies.factory import CachePolicyFactory

            policy_cls = CachePolicyFactory.get_cache_policy_cls(cache_policy, cache_policy_module_path)
        policy = policy_cls(cache_capacity=num_chunks)
        if not isinstance(policy, CachePolicy):
            raise TypeError(
                f"the compiled CPUOffloadingManager needs a policy derived from its own CachePolicy "
                f"(kvcy._fast._offload_c.CachePolicy), got {type(policy).__name__}"
            )
        self._pol = <CachePolicy>policy
        self._n_chunks = n
        self._n_allocated = 0
        self._events = [] if enable_events else None
        self._n_evictable = 0
        self._n_pending = 0
        self._threshold = threshold
        self._max_tracker = tracker
        self._counts = OrderedDict() if threshold >= 2 else None
        self._skipped = 0
        self._alloc_sizes = []
        self._info_obj = labels
        self._generation_c = 0
        self._owner_c = _next_owner()

    # -- read-only views of the state (what vLLM's replayer reads) ----------------
    @property
    def medium(self):
        return self._r_cpu

    @property
    def events(self):
        return self._events

    @property
    def _policy(self):
        return self._pol

    @property
    def _num_chunks(self):
        return self._n_chunks

    @property
    def _num_allocated_chunks(self):
        return self._n_allocated

    @property
    def _free_list(self):
        return [c for c in self._free]

    @property
    def _num_evictable_cache_chunks(self):
        return self._n_evictable

    @property
    def _num_write_pending_chunks(self):
        return self._n_pending

    @property
    def store_threshold(self):
        return self._threshold

    @property
    def max_tracker_size(self):
        return self._max_tracker

    @property
    def counts(self):
        return self._counts

    @property
    def stores_skipped_in_current_batch(self):
        return self._skipped

    @property
    def allocation_sizes_in_current_batch(self):
        return list(self._alloc_sizes)

    @property
    def _info(self):
        return self._info_obj

    @property
    def _generation(self):
        return self._generation_c

    @property
    def _owner(self):
        return self._owner_c

    lock = OffloadingManager.lock

    def _use_api_types(self, *, LookupResult, Medium, CacheHitSource, OffloadingEvent,
                       PrepareStoreOutput, CPULoadStoreSpec, OffloadingConnectorStats,
                       RequestOffloadingContext, ReqContext=None):
        """Make results of another API's classes of the same shapes (vLLM's: its connector
        compares and asserts its own); decisions do not change.  See ``_api_types``."""
        _set_api_types(self, _api_types(LookupResult, Medium, CacheHitSource, OffloadingEvent,
                                         PrepareStoreOutput, CPULoadStoreSpec, OffloadingConnectorStats,
                                         RequestOffloadingContext, ReqContext))

    # -- records ---------------------------------------------------------------
    cdef _AccessRecord _get_record(self, object ctx, bint create):
        cdef _AccessRecords holder
        cdef _AccessRecord rec
        state = _get_state(ctx, _AccessRecords)
        if state is None:
            if not create:
                return None
            holder = _AccessRecords.__new__(_AccessRecords)
            holder.records = {}
            _set_state(ctx, holder)
        elif type(state) is not _AccessRecords:  # (a ReqContext of another kind)
            raise TypeError(f"req_context.get_state(_AccessRecords) returned {type(state).__name__}, not the _AccessRecords set on it")
        else:
            holder = <_AccessRecords>state
        got = holder.records.get(self._owner_c)
        if type(got) is _AccessRecord and (<_AccessRecord>got).generation == self._generation_c:
            return <_AccessRecord>got
        if not create:
            return None
        rec = _AccessRecord.__new__(_AccessRecord)
        rec.generation = self._generation_c
        rec.keys = {}
        rec.inserted_log = []
        holder.records.clear()  # one record per context, as vLLM: another manager's is replaced
        holder.records[self._owner_c] = rec
        return rec

    cdef int _record(self, _AccessRecord rec, list keys, list reused, object ctx,
                     _Positions pos, list statuses, bint track_missed=False,
                     list hints=None) except -1:
        """Note keys a request loaded or offered; the policy hears of the new ones.

        ``statuses`` (optional, parallel to ``keys``) are the keys' chunks as the
        caller found them, ``None`` for a key that is not resident: the native
        LRU policy then only looks at the resident ones (it ignores the others).
        With ``track_missed`` the non-resident ones are this offer's store
        misses, noted in their flags here.  ``hints`` (native LRU, optional,
        parallel to ``keys``): the record's value for each new key instead of
        its status (the chunk a new key is about to get).
        """
        cdef dict flags = rec.keys
        cdef list new_keys = None
        cdef PyObject *f
        cdef Py_ssize_t i, n = len(keys)
        cdef bint filter_resident = statuses is not None and self._pol._native
        cdef bint lru = type(self._pol) is LRUCachePolicy
        cdef bint tell = type(self._pol) is not ARCCachePolicy     # (ARC ignores on_request_access)
        cdef bint missed
        cdef Py_ssize_t size = PyDict_Size(flags)
        if size == 0 and n > 8:
            # a request's first batch of keys: one table of the right size
            # instead of growing it key by key
            flags = <dict>_PyDict_NewPresized(n)
            rec.keys = flags
        for i in range(n):
            key = keys[i]
            missed = track_missed and statuses[i] is None
            if lru:
                # the native LRU keeps no flags: the value is the key's chunk
                # when known (a hint for on_request_finished), else None
                PyDict_SetDefault(flags, key, hints[i] if hints is not None
                                  else (None if statuses is None else statuses[i]))
            else:
                PyDict_SetDefault(flags, key, _FLAG_MISSED if missed else _FLAG_NONE)
            if PyDict_Size(flags) == size:
                # seen before
                if missed:
                    f = _map_get(flags, key)
                    if f != NULL and not ((<Py_ssize_t><object>f) & _MISSED):
                        flags[key] = (<Py_ssize_t><object>f) | _MISSED
                continue
            size += 1
            if not tell:
                continue
            if filter_resident and statuses[i] is None:
                if new_keys is None:
                    new_keys = []
                continue
            if new_keys is None:
                new_keys = []
            new_keys.append(key)
        if new_keys is not None:
            self._pol.c_on_request_access(new_keys, ctx, pos)
        if not reused or type(self._pol) is LRUCachePolicy:
            return 0        # (the native LRU reads no flags)
        rec.fold()
        for key in reused:
            f = _map_get(flags, key)
            if f != NULL and not ((<Py_ssize_t><object>f) & (_INSERTED | _REUSED)):
                flags[key] = (<Py_ssize_t><object>f) | _REUSED
        return 0

    cdef int _update_tracker(self, list keys, bint repeated=False) except -1:
        """Count one offer: offered keys move to the newest end, new ones enter
        with count 1, evicting the oldest keys not in this offer while full."""
        counts = self._counts
        cdef Py_ssize_t protected = 0
        for key in keys:
            count = counts.get(key)
            if count is not None:
                counts.move_to_end(key)
                counts[key] = count + 1
                protected += 1
        if repeated and protected > 1:
            protected = len({key for key in keys if key in counts})  # each protected key once
        cdef Py_ssize_t unprotected = len(counts) - protected
        for key in keys:
            if key in counts:
                continue
            if len(counts) >= self._max_tracker:
                if unprotected == 0:
                    continue
                counts.popitem(last=False)
                unprotected -= 1
            counts[key] = 1
        return 0

    # -- the OffloadingManager API ---------------------------------------------
    @cython.binding(False)
    @cython.embedsignature(True)
    @cython.embedsignature.format("clinic")
    def lookup(self, key, req_context):
        """``HIT`` if ``key`` is readable, ``HIT_PENDING`` if being written, else ``MISS``.

        No side effects: recency and the store tracker are untouched.

        Raises:
            TypeError: ``key`` is not bytes.
            ValueError: ``key`` is shorter than 4 bytes.
        """
        cdef PyObject *p
        cdef ChunkStatus st
        if type(key) is not bytes or PyBytes_GET_SIZE(key) < 4:
            _check_key_slow(key)
        if self._pol._native:
            p = _map_get(self._pol._chunks, key)
            if p == NULL or _is_ghost(<_Node>p):
                return self._r_miss
            st = <ChunkStatus>p
        else:
            st = self._pol.c_get(key)
            if st is None:
                return self._r_miss
        return self._r_hit if st.ref_cnt >= 0 else self._r_pending

    def count_hits(self, keys, req_context, start=0, stop=None):
        """How many of ``keys[start:stop]``, from the first, ``lookup`` as ``HIT``.

        The connector's admission loop (one ``lookup`` per key until the first
        one that is not a ``HIT``) as one call; like ``lookup``, no side
        effects.  Only the keys looked at are checked.

        Args:
            keys: a list of offload keys.
            req_context: the request looking.
            start: the first index looked at (clamped to ``len(keys)``).
            stop: one past the last (``None``: the end; clamped likewise).

        Raises:
            TypeError: ``keys`` is not a list, ``start`` / ``stop`` are not
                ints, or a key looked at is not bytes.
            ValueError: a negative ``start`` / ``stop``, or a key looked at is
                shorter than 4 bytes.
        """
        cdef list ks
        cdef Py_ssize_t n, i, first, last
        cdef PyObject *p
        cdef ChunkStatus st
        cdef CachePolicy policy = self._pol
        if type(keys) is not list:
            raise TypeError(f"keys must be a list of offload keys, got {type(keys).__name__}")
        ks = <list>keys
        n = len(ks)
        first = _check_int("start", start)
        last = n if stop is None else _check_int("stop", stop)
        if first > n:
            first = n
        if last > n:
            last = n
        i = first
        if policy._native:
            i = _count_native_hits(policy._chunks, ks, i, last)
        while i < last and i < len(ks):
            key = ks[i]
            if type(key) is not bytes or PyBytes_GET_SIZE(key) < 4:
                _check_key_slow(key)
            if policy._native:
                p = _map_get(policy._chunks, key)
                if p == NULL or _is_ghost(<_Node>p) or (<ChunkStatus>p).ref_cnt < 0:
                    break
            else:
                # a Python policy: its get may run any code (the list may change)
                st = policy.c_get(key)
                if st is None or st.ref_cnt < 0:
                    break
            i += 1
        return i - first if i > first else 0

    def get_load_source(self, key, req_context):
        """Always ``CacheHitSource.HOST``: hits come from host memory."""
        _check_key(key)
        return self._r_host

    def prepare_load(self, keys, req_context):
        """Pin readable keys for a load and note the access for the request.

        A key listed twice is pinned twice.

        Returns:
            The keys' chunks, in key order.

        Raises:
            AssertionError: a key is not resident or not readable yet, or the
                request already finished and a key is new to it (vLLM's
                messages); nothing is changed.
        """
        cdef KvcyCallMark mark
        _enter(self, &mark, "prepare_load")
        return self._prepare_load(keys, req_context, record_access=True)

    def _prepare_load(self, keys, req_context, *, record_access):
        """``prepare_load``; with ``record_access=False`` only the pins (a pin-only read)."""
        # (vLLM reads ``keys`` again to record them: an iterator is spent by then, so
        # the request's record notes none of them)
        cdef bint one_pass = type(keys) is not list and isinstance(keys, _Iterator)
        cdef list ks = _check_keys(keys)
        cdef bint record = bool(record_access)
        cdef CachePolicy policy = self._pol
        cdef list chunks = []
        cdef ChunkStatus st
        cdef _AccessRecord rec = None
        cdef vector[Py_ssize_t] ids
        cdef Py_ssize_t i
        if record:
            _check_context(req_context)
        for key in ks:
            st = policy.c_get(key)
            if st is None:
                raise AssertionError(f"Chunk {key!r} not found in cache")
            if st.ref_cnt < 0:
                raise AssertionError(f"Chunk {key!r} is not ready for reading")
            chunks.append(st)
        if record:
            rec = self._get_record(req_context, True)
            if rec.finished and not one_pass:
                for key in ks:
                    if key not in rec.keys:
                        raise AssertionError(_FINALIZED)
            if type(policy) is LRUCachePolicy and not one_pass:
                _check_positions(ks, _positions(req_context))
        ids.reserve(len(ks))
        for i in range(len(ks)):
            st = <ChunkStatus>chunks[i]
            if st.ref_cnt == 0:
                if not policy._native:
                    policy.c_mark_non_evictable(<bytes>ks[i])
                self._n_evictable -= 1
            st.ref_cnt += 1
            ids.push_back(st.chunk_id)
        if rec is not None and not one_pass:
            self._record(rec, ks, ks, req_context, _positions(req_context), chunks)
        return _chunk_spec(ids, self._r_spec)

    def touch(self, keys, req_context):
        """Tell the policy the keys were used (the first key ends most recent)."""
        cdef KvcyCallMark mark
        _enter(self, &mark, "touch")
        self._pol.c_touch(_check_keys(keys), req_context)

    def complete_load(self, keys, req_context):
        """Unpin keys pinned by ``prepare_load``; a key unpinned to 0 is evictable again.

        Raises:
            AssertionError: a key is not resident, or has no pin left to
                release (vLLM's messages); nothing is changed.
        """
        cdef KvcyCallMark mark
        _enter(self, &mark, "complete_load")
        cdef list ks = _check_keys(keys)
        cdef CachePolicy policy = self._pol
        cdef list chunks = []
        cdef ChunkStatus st
        cdef Py_ssize_t i, j
        cdef vector[Py_ssize_t] zeroed
        # Check by releasing tentatively (a key listed twice needs two pins),
        # and put every pin back before raising.
        for i in range(len(ks)):
            key = ks[i]
            st = policy.c_get(key)
            if st is None or st.ref_cnt <= 0:
                for j in range(i - 1, -1, -1):
                    (<ChunkStatus>chunks[j]).ref_cnt += 1
                if st is None:
                    raise AssertionError(f"Chunk {key!r} not found")
                raise AssertionError(f"Chunk {key!r} ref_cnt is already 0")
            st.ref_cnt -= 1
            chunks.append(st)
            if st.ref_cnt == 0:
                zeroed.push_back(i)
        for i in range(<Py_ssize_t>zeroed.size()):
            self._n_evictable += 1
            if not policy._native:
                policy.c_mark_evictable(<bytes>ks[zeroed[i]])

    def prepare_store(self, keys, req_context):
        """Reserve chunks for the offered keys that are not resident yet.

        Keys already readable are kept (and never evicted for this offer);
        keys being written are skipped.  With ``store_threshold >= 2`` a new
        key is stored only once offered that often.

        Args:
            keys: the offer, in prefix order.  A key offered twice counts
                twice in the tracker, and is otherwise taken once.
            req_context: the offering request.

        Returns:
            The keys to write, their chunks and the keys evicted for them
            (an empty output when nothing needs writing), or ``None`` when
            not enough chunks can be evicted.

        Raises:
            ValueError: a key offered twice would be stored (vLLM would store
                it in two chunks and lose one).
            AssertionError: the request already finished and a key is new to
                it (vLLM's message); nothing is changed.
        """
        cdef KvcyCallMark mark
        _enter(self, &mark, "prepare_store")
        cdef list offer = _check_keys(keys)
        cdef CachePolicy policy = self._pol
        cdef list new = []
        cdef list ready = []
        cdef list statuses = []         # per offered key: its chunk, or None
        cdef list new_ghosts = None     # native ARC, per new key: its ghost node, or None
        cdef list pre_new = None        # native LRU, per new key: the status it will get
        cdef list record_hints = None
        cdef list to_record, record_statuses, misses, evicted_keys, filtered
        cdef list full_offer = None, stored_twice = None
        cdef set offered, kept
        cdef ChunkStatus st
        cdef Py_ssize_t n, i, n_offer, extra_skipped = 0, extra_stored = 0
        cdef _AccessRecord rec
        cdef _Positions pos
        cdef vector[Py_ssize_t] ids
        cdef bint repeated
        _check_context(req_context)
        if policy._native:
            offered = None      # (the native policies are told what to protect)
            repeated = _check_no_repeats(offer)
        else:
            offered = set(offer)
            repeated = len(offered) != len(offer)
        if repeated:
            full_offer = offer
            stored_twice = []
            offer = self._drop_repeats(full_offer, stored_twice, &extra_stored, &extra_skipped)
        n_offer = len(offer)
        if type(policy) is ARCCachePolicy:
            new_ghosts = []
        kept = self._classify_offer(offer, new, ready, statuses, new_ghosts, stored_twice)
        rec = self._get_record(req_context, True)
        if self._counts is None and len(new) + len(ready) == n_offer:
            to_record = offer
            record_statuses = statuses
            if type(policy) is LRUCachePolicy and new:
                # the chunks the new keys will get, made now, so that the
                # record notes them (on_request_finished reads them) as it
                # notes the resident keys' chunks
                pre_new = []
                record_hints = []
                for i in range(n_offer):
                    st = <ChunkStatus>statuses[i]
                    if st is None:
                        st = _new_status(-1)
                        pre_new.append(st)
                    record_hints.append(st)
        else:
            # offered keys that are kept (new, past the threshold) or ready
            if kept is None:
                kept = set() if self._counts is not None else set(new)
            to_record = []
            record_statuses = []
            for i in range(n_offer):
                st = <ChunkStatus>statuses[i]
                if (st is None and offer[i] in kept) or (st is not None and st.ref_cnt >= 0):
                    to_record.append(offer[i])
                    record_statuses.append(st)
        self._check_offer(rec, to_record, new, kept, statuses, stored_twice, extra_stored)
        pos = _positions(req_context)
        if type(policy) is LRUCachePolicy:
            _check_positions(to_record, pos)

        # 1. the offer tracker (every occurrence counts)
        if self._counts is not None:
            filtered = self._track_offer(offer, full_offer, new, kept, extra_skipped)
            if filtered is not new:
                new = filtered
                new_ghosts = None       # (no longer parallel to new)
        # 2. the policy hears of each miss once per request
        misses = self._note_store_misses(rec, new, new_ghosts, full_offer, stored_twice, req_context)
        # 3. the access record (and the misses, in it)
        self._record(rec, to_record, ready, req_context, pos, record_statuses, misses is not None,
                     record_hints)
        if stored_twice:  # (vLLM's eviction fails)
            self._alloc_sizes.append(len(new) + extra_stored)
            return None
        n = len(new)
        if n == 0:
            return self._r_store(keys_to_store=[], store_spec=_chunk_spec(ids, self._r_spec), evicted_keys=[])
        # 4. room: evict what the free chunks do not cover
        self._alloc_sizes.append(n)
        evicted_keys = self._evict_for_store(n, ready, offered)
        if evicted_keys is None:
            return None
        # 5. allocate: fresh chunks first, then freed ones, last freed first
        self._allocate_chunks(new, ids, new_ghosts, pre_new, req_context, pos)
        if type(policy) is not LRUCachePolicy:
            rec.inserted_log.extend(new)     # (the native LRU reads no flags)
        return self._r_store(keys_to_store=new, store_spec=_chunk_spec(ids, self._r_spec), evicted_keys=evicted_keys)

    # -- prepare_store's phases ------------------------------------------------
    cdef list _drop_repeats(self, list full_offer, list stored_twice,
                            Py_ssize_t *extra_stored, Py_ssize_t *extra_skipped):
        """The offer without its repeats, first occurrence first.

        A repeat changes only the tracker counts and the skip count, unless
        vLLM would store the key twice (two chunks, one of them lost): such
        keys go to ``stored_twice`` (the offer is refused later), and their
        extra occurrences count in ``extra_stored``; the other repeats of
        keys to store count in ``extra_skipped``.
        """
        counts = self._counts
        occurrences = {}
        for key in full_offer:
            occurrences[key] = occurrences.get(key, 0) + 1
        offer = list(occurrences)
        for key, occ in occurrences.items():
            if occ > 1 and self._pol.c_get(key) is None:
                if counts is None or (key in counts and counts[key] + occ >= self._threshold):
                    stored_twice.append(key)
                    extra_stored[0] += occ - 1
                else:
                    extra_skipped[0] += occ - 1
        return offer

    cdef set _classify_offer(self, list offer, list new, list ready, list statuses,
                             list new_ghosts, list stored_twice):
        """Look each offered key up once.

        ``statuses`` gets each key's chunk (``None``: not resident), ``new``
        the keys not resident, ``ready`` the readable ones; for the native ARC
        policy ``new_ghosts`` gets each new key's ghost node (or ``None``).

        Returns:
            With a store tracker, the new keys it will let through (``None``
            when none); without one, ``None``.
        """
        cdef CachePolicy policy = self._pol
        cdef bint is_arc = type(policy) is ARCCachePolicy
        cdef PyObject *p
        cdef ChunkStatus st
        cdef set kept = None
        cdef Py_ssize_t i, n_offer = len(offer), threshold = self._threshold
        counts = self._counts
        if policy._native:
            _ahead_prime(policy._chunks, offer)
        for i in range(n_offer):
            key = offer[i]
            if policy._native:
                kvcy_dict_ahead(policy._chunks, offer, i)
            if is_arc:
                # one lookup says resident, ghost (kept for the store miss
                # and the insert) or neither
                p = _map_get(policy._chunks, key)
                if p == NULL:
                    st = None
                    new_ghosts.append(None)
                elif _is_ghost(<_Node>p):
                    st = None
                    new_ghosts.append(<_Node>p)
                else:
                    st = <ChunkStatus>p
            else:
                st = policy.c_get(key)
            statuses.append(st)
            if st is None:
                new.append(key)
                if counts is not None:
                    # after the tracker update a tracked key counts one more and
                    # an untracked one at most 1, below any threshold >= 2
                    c = counts.get(key)
                    if (c is not None and c + 1 >= threshold) or (stored_twice and key in stored_twice):
                        if kept is None:
                            kept = set()
                        kept.add(key)
            elif st.ref_cnt >= 0:
                ready.append(key)
        return kept

    cdef int _check_offer(self, _AccessRecord rec, list to_record, list new, set kept,
                          list statuses, list stored_twice, Py_ssize_t extra_stored) except -1:
        """Refuse, before anything changes, an offer vLLM refuses (a finished
        request's new key) or would get wrong (a key stored twice)."""
        cdef dict flags = rec.keys
        cdef ChunkStatus st
        cdef Py_ssize_t need, offered_evictable
        if rec.finished:
            for key in to_record:
                if key not in flags:
                    raise AssertionError(_FINALIZED)
        if stored_twice:
            # vLLM allocates (and loses a chunk) unless its eviction fails first
            need = (len(new) if kept is None else len(kept)) + extra_stored - (
                <Py_ssize_t>self._free.size() + self._n_chunks - self._n_allocated)
            offered_evictable = 0
            for st in statuses:
                if st is not None and st.ref_cnt == 0:
                    offered_evictable += 1
            if need <= 0 or (need <= self._n_evictable and self._n_evictable - offered_evictable >= need):
                raise ValueError(f"prepare_store got key {stored_twice[0]!r} more than once")
        return 0

    cdef list _track_offer(self, list offer, list full_offer, list new, set kept,
                           Py_ssize_t extra_skipped):
        """Phase 1: count the offer in the tracker (every occurrence counts).

        Returns:
            The new keys it lets through: ``new`` itself when that is all of
            them, else a new list (the others count as skipped stores).
        """
        self._update_tracker(offer if full_offer is None else full_offer, full_offer is not None)
        if len(kept) == len(new):
            return new
        self._skipped += len(new) - len(kept) + extra_skipped
        return [k for k in new if k in kept]

    cdef list _note_store_misses(self, _AccessRecord rec, list new, list new_ghosts,
                                 list full_offer, list stored_twice, object ctx):
        """Phase 2: the policy hears of each store miss once per request.

        Returns:
            The misses it heard of (for the record's flags), or ``None`` for
            the native LRU policy, which ignores store misses.
        """
        cdef CachePolicy policy = self._pol
        cdef dict flags = rec.keys
        cdef list misses, miss_ghosts = None
        cdef set kept
        cdef PyObject *f
        cdef Py_ssize_t i
        if type(policy) is LRUCachePolicy:
            return None
        if stored_twice:
            # (vLLM's eviction will fail: before that it tells the policy of every
            # occurrence of a repeated miss, e.g. two ARC ghost hits)
            kept = set(new)
            misses = []
            for key in full_offer:
                f = _map_get(flags, key)
                if key in kept and (f == NULL or not ((<Py_ssize_t><object>f) & _MISSED)):
                    misses.append(key)
            if misses:
                policy.c_on_store_miss(misses, ctx)
            return misses
        if not new:
            return None
        if PyDict_Size(flags) == 0:
            # the request's first keys: each new key is a miss
            if new_ghosts is not None:
                (<ARCCachePolicy>policy).c_ghost_hits(new_ghosts)
            else:
                policy.c_on_store_miss(list(new), ctx)
            return new
        misses = []
        if new_ghosts is not None:
            miss_ghosts = []
        for i in range(len(new)):
            key = new[i]
            f = _map_get(flags, key)
            if f == NULL or not ((<Py_ssize_t><object>f) & _MISSED):
                misses.append(key)
                if miss_ghosts is not None:
                    miss_ghosts.append(new_ghosts[i])
        if miss_ghosts is not None:
            # the ghost hits of these misses, from the nodes found by _classify_offer
            (<ARCCachePolicy>policy).c_ghost_hits(miss_ghosts)
        elif misses:
            policy.c_on_store_miss(misses, ctx)
        return misses

    cdef list _evict_for_store(self, Py_ssize_t n, list ready, set offered):
        """Phase 4: evict what the free chunks do not cover for ``n`` new keys.

        Only resident, ready keys of the offer could be evicted: they are the
        ones protected (new keys are not resident, pending ones not
        evictable); a Python policy is given the whole offer (``offered``).

        Returns:
            The evicted keys (empty when the free chunks suffice), or
            ``None`` when not enough chunks can be evicted.
        """
        cdef CachePolicy policy = self._pol
        cdef Py_ssize_t need = n - (<Py_ssize_t>self._free.size() + self._n_chunks - self._n_allocated)
        cdef list evicted_keys = []
        cdef list evicted
        if need <= 0:
            return evicted_keys
        if need > self._n_evictable:
            return None
        if type(policy) is ARCCachePolicy:
            evicted = (<ARCCachePolicy>policy).c_evict_in_place(need, set(ready) if ready else None)
        elif policy._native:
            evicted = policy.c_evict(need, set(ready) if ready else None)
        else:
            evicted = policy.c_evict(need, offered)
        if evicted is None:
            return None
        self._n_evictable -= need
        for s in evicted:
            self._free.push_back((<ChunkStatus>s).chunk_id)
            evicted_keys.append((<ChunkStatus>s).key)
        if self._events is not None:
            self._events.append(self._r_event(keys=list(evicted_keys), medium=self._r_cpu, removed=True))
        return evicted_keys

    cdef int _allocate_chunks(self, list new, vector[Py_ssize_t]& ids, list new_ghosts,
                              list pre_new, object ctx, _Positions pos) except -1:
        """Phase 5: give the new keys chunks (fresh ones first, then freed
        ones, last freed first, into ``ids``) and insert them write-pending."""
        cdef CachePolicy policy = self._pol
        cdef Py_ssize_t i, n = len(new)
        cdef Py_ssize_t num_fresh = self._n_chunks - self._n_allocated
        ids.reserve(n)
        if num_fresh > n:
            num_fresh = n
        for i in range(num_fresh):
            ids.push_back(self._n_allocated + i)
        self._n_allocated += num_fresh
        for i in range(n - num_fresh):
            ids.push_back(self._free.back())
            self._free.pop_back()
        if new_ghosts is not None:
            (<ARCCachePolicy>policy).c_insert_new_ghosts(new, ids, new_ghosts)
        elif pre_new is not None:
            (<LRUCachePolicy>policy).c_insert_new_noted(new, ids, ctx, pos, pre_new)
        else:
            policy.c_insert_new(new, ids, ctx, pos)
        self._n_pending += n
        return 0

    def complete_store(self, keys, req_context, success=True):
        """Finish the writes of keys being written: readable on success, dropped on failure.

        Keys not being written (unknown, already readable, repeated) are ignored.
        """
        cdef KvcyCallMark mark
        _enter(self, &mark, "complete_store")
        cdef list ks = _check_keys(keys)
        cdef CachePolicy policy = self._pol
        cdef list done = []
        cdef ChunkStatus st
        if success:
            for key in ks:
                st = policy.c_get(key)
                if st is not None and st.ref_cnt < 0:
                    st.ref_cnt = 0
                    self._n_pending -= 1
                    self._n_evictable += 1
                    if not policy._native:
                        policy.c_mark_evictable(<bytes>key)
                    done.append(key)
        else:
            for key in ks:
                st = policy.c_get(key)
                if st is not None and st.ref_cnt < 0:
                    self._n_pending -= 1
                    policy.c_remove(<bytes>key)
                    self._free.push_back(st.chunk_id)
                    done.append(key)
        if done and self._events is not None:
            if success:
                self._events.append(self._r_event(keys=done, medium=self._r_cpu, removed=False))
            else:
                self._events.append(self._r_event(keys=done, medium=self._r_cpu, removed=True, metadata_only=True))

    def on_new_request(self, req_context):
        """Start the request's access record; every chunk is offloaded as computed."""
        cdef KvcyCallMark mark
        _enter(self, &mark, "on_new_request")
        _check_context(req_context)
        self._get_record(req_context, True)
        return self._r_octx()

    def on_request_finished(self, req_context):
        """Close the request's record and let the policy rank its keys.

        Nothing happens for a request with no record since the last reset,
        or one already finished.
        """
        cdef KvcyCallMark mark
        _enter(self, &mark, "on_request_finished")
        cdef _AccessRecord rec
        cdef list groups, members, ordered, keys
        cdef _Positions pos
        cdef vector[Py_ssize_t] order
        _check_context(req_context)
        rec = self._get_record(req_context, False)
        if rec is None or rec.finished:
            return
        # (the record is closed once the positions are read: the policies read
        # them all before changing anything, so a refused one leaves it open)
        pos = _positions(req_context)
        if type(self._pol) is LRUCachePolicy:
            # the native LRU ranks the keys by position only: no flags (it
            # keeps none), and one group in the common case
            (<LRUCachePolicy>self._pol).c_finish_keys(list(rec.keys), pos, list(rec.keys.values()))
            rec.finished = True
            return
        rec.fold()
        if type(self._pol) is ARCCachePolicy:
            # one group (the common case): the flags as they are, no sets
            keys = list(rec.keys)
            if _one_group_order(keys, pos, order):
                rec.finished = True
                (<ARCCachePolicy>self._pol).c_finish_flags(keys, list(rec.keys.values()), order)
                return
        by_group = {}
        insertion_only = set()
        reused = set()
        for key, fl in rec.keys.items():
            gi = _group_of(<bytes>key)
            members = by_group.get(gi)
            if members is None:
                by_group[gi] = [key]
            else:
                (<list>members).append(key)
            if (<Py_ssize_t>fl) & _REUSED:
                reused.add(key)
            elif (<Py_ssize_t>fl) & _INSERTED:
                insertion_only.add(key)
        groups = []
        for gi in sorted(by_group):
            members = <list>by_group[gi]
            ordered = _by_position(members, pos)
            groups.append(members if ordered is None else ordered)
        rec.finished = True
        self._pol.c_on_request_finished(groups, insertion_only, reused, req_context, pos)

    def take_events(self):
        """Yield the queued events, oldest first (a generator).

        The queue is taken when iteration starts.  A failed store's event
        keeps only the keys still not resident, and is dropped if none are.
        """
        if self._events is None:
            return
        if self._in_call:
            raise RuntimeError(_BUSY.format("take_events"))
        events = self._events
        self._events = []
        for event in events:
            if event.metadata_only:
                keys = [key for key in event.keys if self._pol.c_get(key) is None]
                if not keys:
                    continue
                event = _dc_replace(event, keys=keys)  # (a copy, as vLLM: the queued one is left alone)
            yield event

    def on_schedule_end(self, context):
        """Nothing to do at the end of a step."""
        return None

    def has_pending_work(self):
        """Always ``False``: the CPU tier does no work of its own between steps."""
        return False

    def reset_cache(self):
        """Forget every chunk; chunk ids restart at 0.

        Queued events, the store tracker and the stats accumulators are kept.
        Requests' records from before the reset are abandoned.
        """
        cdef KvcyCallMark mark
        _enter(self, &mark, "reset_cache")
        self._pol.c_clear()
        self._generation_c += 1
        self._n_evictable = 0
        self._n_pending = 0
        self._free.clear()
        self._n_allocated = 0

    def on_reset_flushed(self):
        """Nothing to do."""
        return None

    def get_stats(self):
        """Usage gauges, allocation sizes and skipped stores since the previous call."""
        cdef KvcyCallMark mark
        _enter(self, &mark, "get_stats")
        if _Metrics is None:
            _load_cpu_common()
        cdef double usage = 0.0, write_usage = 0.0
        cdef Py_ssize_t used = self._n_allocated - <Py_ssize_t>self._free.size() - self._n_evictable
        if self._n_chunks > 0:
            usage = <double>used / <double>self._n_chunks
            write_usage = <double>self._n_pending / <double>self._n_chunks
        sizes, self._alloc_sizes = self._alloc_sizes, []
        skipped = self._skipped if self._threshold >= 2 else None
        if skipped is not None:
            self._skipped = 0
        return self._r_stats(data=_stats_payload(usage, write_usage, sizes, skipped))

    def config_info(self):
        """``[info.as_config_info()]`` (the same mapping every call), or ``[{}]`` without info."""
        return [self._info_obj]

    def shutdown(self):
        """Nothing to release."""
        return None


OffloadingManager.register(CPUOffloadingManager)
