# kv_cache_c/kv_cache_manager.pyx: KVCacheManager: the manager a scheduler drives (allocate_slots,
# get_computed_blocks, free, ...).  (vLLM: vllm/v1/core/kv_cache_manager.py, KVCacheManager.)
# Included into kvcy/_fast/_kv_cache_c.pyx (one extension module), not compiled on its own.

cdef extern from "Python.h":
    const Py_ssize_t PY_SSIZE_T_MAX

# A token count not read yet, as an upper bound: larger than any count.
cdef Py_ssize_t _UNREAD = PY_SSIZE_T_MAX


cdef inline Py_ssize_t _blocks_needed(Py_ssize_t n_tokens, Py_ssize_t block_size, Py_ssize_t have,
                                      bint first, Py_ssize_t n_hits, Py_ssize_t n_evictable) noexcept:
    # Blocks one full-attention group takes from the free pool to hold
    # n_tokens (get_num_blocks_to_allocate): a request that holds `have`
    # blocks needs the rest; on its first allocation (nothing cached yet) its
    # hits count as held, and the free ones among them are taken too.
    cdef Py_ssize_t needed = _cdiv(n_tokens, block_size) - have
    if first:
        needed -= n_hits
        if needed < 0:
            needed = 0
        return needed + n_evictable
    return needed if needed > 0 else 0


# The steps allocate_slots and get_computed_blocks take on both of their
# paths -- the general one (any groups, any request object) and the fast one
# (one plain full-attention group, a compiled Request) -- written once here,
# so that a change to a step is made in one place.  The fast paths differ
# only where the general one goes through layers that are no-ops for them.
cdef inline Py_ssize_t _within_model_len(KVCacheManager mgr, Py_ssize_t num_tokens) noexcept:
    # Token counts past max_model_len are clamped to it, as vLLM does.
    return num_tokens if num_tokens < mgr.max_model_len else mgr.max_model_len


cdef inline Py_ssize_t _watermark_for(KVCacheManager mgr, object status, bint has_scheduled_reqs) except? -1:
    # Free blocks an allocation must leave: the watermark, when a waiting or
    # preempted request is admitted while others are scheduled.
    return mgr.watermark_blocks if has_scheduled_reqs and _watermarked(status) else 0


cdef inline bint _fits(BlockPool pool, Py_ssize_t needed, Py_ssize_t watermark, Py_ssize_t reserved) noexcept:
    # The pool can give `needed` blocks and still keep the watermark and the reserved blocks.
    return needed + watermark <= pool.free_block_queue.num_free_blocks - reserved


cdef inline Py_ssize_t _tokens_to_cache(Py_ssize_t total_computed, Py_ssize_t n_new, Py_ssize_t num_tokens) noexcept:
    # Tokens whose full blocks are cached after the allocation: the computed
    # and new ones, within the request's tokens.
    cdef Py_ssize_t n = total_computed + n_new
    return n if n < num_tokens else num_tokens


cdef inline Py_ssize_t _full_blocks_to_cache(Py_ssize_t total_computed, Py_ssize_t n_new, Py_ssize_t num_tokens,
                                             Py_ssize_t num_hashes, Py_ssize_t block_size) noexcept:
    # The full blocks cached after the allocation (one group at the hash block
    # size): those of _tokens_to_cache, but only blocks with a hash (with hash
    # lookahead the hashes lag behind the tokens).
    cdef Py_ssize_t n = _tokens_to_cache(total_computed, n_new, num_tokens)
    if n > num_hashes * block_size:
        n = num_hashes * block_size
    return n // block_size


cdef int _refuse_hits_when_held(str request_id) except -1:
    # (Not inline: off the hot paths.)  vLLM's coordinator asserts here.
    raise AssertionError(
        f"request {request_id!r} already holds blocks; new_computed_blocks is only for "
        "a request's first allocation"
    )


cdef inline bint _no_lookup(KVCacheManager mgr, object request) except -1:
    # get_computed_blocks finds nothing: caching is off, or the request skips
    # reading the prefix cache.
    if not mgr.enable_caching:
        return True
    if type(request) is Request:
        return (<Request>request)._skip_reading_prefix_cache
    return _skips_reading(request)


cdef bint _skips_reading(object request) except -1:
    # (_no_lookup for a request object of another type: off the hot paths.)
    try:
        return request.skip_reading_prefix_cache
    except AttributeError:
        raise TypeError(f"expected a Request, got {type(request).__name__}") from None


cdef int _refuse_if_never_fits(str request_id, Py_ssize_t total, Py_ssize_t num_gpu_blocks,
                               Py_ssize_t max_model_len, object kv_cache_config) except -1:
    # (allocate_slots found too few free blocks.)  total: the blocks the
    # allocation needs in all -- those it takes from the free pool, those the
    # request holds, and its hits that other requests hold; every other block
    # but the null one could come free.
    cdef Py_ssize_t usable = num_gpu_blocks - 1  # (block 0 is the null block)
    if total <= usable:
        return 0
    hint = ""
    for group in kv_cache_config.kv_cache_groups:
        spec = group.kv_cache_spec
        if (isinstance(spec, FullAttentionSpec) and not isinstance(spec, (CrossAttentionSpec, EncoderOnlyAttentionSpec))
                and usable * spec.block_size < max_model_len):
            hint = (f"; the pool holds {usable * spec.block_size} tokens, fewer than max_model_len "
                    f"{max_model_len} (vLLM's engine refuses to start with such a pool)")
            break
    raise ValueError(
        f"request {request_id!r} needs {total} blocks, more than the {usable} usable blocks of the whole "
        f"pool: it can never be scheduled{hint}"
    )


@cython.nonecheck(True)
cdef class KVCacheManager:
    """The KV-cache manager a scheduler drives: vLLM 0.33.0's constructor and methods.

    Args:
        kv_cache_config: blocks and KV-cache groups.
        max_model_len: the longest sequence; slot requests are capped at it.
        scheduler_block_size: scheduling granularity (LCM of the groups' block sizes).
        hash_block_size: the block size request hashes are computed at.
        max_in_flight_tokens: tokens scheduled but not yet settled (sizes the
            sliding-window / chunked admission cap); defaults to max_model_len.
        enable_caching: prefix caching on or off.
        use_eagle: drop the last hit block (EAGLE needs its hidden states).
        num_hash_lookahead_tokens: tokens after each block that its hash
            covers (as the request hasher was built); events carry them.
        num_prefill_lookahead: multi-module MTP's speculative tokens: the last
            ``num_prefill_lookahead - 1`` computed tokens may be re-prefilled,
            so they are not cached.
        log_stats: keep PrefixCacheStats (``record_prefix_cache_stats``,
            ``make_prefix_cache_stats``).
        enable_kv_cache_events: queue KV events (``take_events``).
        dcp_world_size, pcp_world_size: decode / prefill context-parallel world
            sizes (a dcp-sharded group's blocks span ``block_size * dcp_world_size``
            tokens).
        metrics_collector: a ``KVCacheMetricsCollector`` (or None), handed to the block pool.
        watermark: fraction of all blocks kept free when admitting
            waiting / preempted requests while others are scheduled.
        enable_mamba_shared_prefix_checkpoint: vLLM's opt-in: Mamba align groups
            also cache the state at a request's shared-prefix junction.  It takes
            effect (``mamba_shared_prefix_checkpoint``) only with EAGLE groups,
            fine-grained partial hits and no multi-module MTP re-prefill.
        use_int_block_hashes: publish event hashes as 64-bit ints (default:
            ``VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES``).
    """

    def __cinit__(self, *args, **kwargs):
        # (refused by __new__ alone: see _no_arguments)
        if not args and not kwargs:
            raise TypeError(_no_arguments(type(self)))

    def __init__(self, kv_cache_config, max_model_len, scheduler_block_size, hash_block_size,
                 max_in_flight_tokens=None, enable_caching=True, use_eagle=False, num_hash_lookahead_tokens=0,
                 num_prefill_lookahead=0, log_stats=False, enable_kv_cache_events=False, dcp_world_size=1,
                 pcp_world_size=1, metrics_collector=None, watermark=0.0,
                 enable_mamba_shared_prefix_checkpoint=False, use_int_block_hashes=None):
        for name, value in (("max_model_len", max_model_len), ("scheduler_block_size", scheduler_block_size),
                            ("hash_block_size", hash_block_size)):
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ValueError(f"{name} must be a positive int, got {value!r}")
        _check_world_sizes(dcp_world_size, pcp_world_size)
        num_hash_lookahead_tokens = _lookahead_count("num_hash_lookahead_tokens", num_hash_lookahead_tokens)
        num_prefill_lookahead = _lookahead_count("num_prefill_lookahead", num_prefill_lookahead)
        assert watermark >= 0.0, "watermark must be non-negative"
        watermark_blocks = watermark * kv_cache_config.num_blocks
        if not watermark_blocks < 2**62:  # (inf, or more blocks than a count holds)
            raise ValueError(f"watermark {watermark!r} is too large")
        if max_in_flight_tokens is None:
            max_in_flight_tokens = max_model_len
        self.max_model_len = max_model_len
        self.enable_caching = bool(enable_caching)
        self.enable_kv_cache_events = bool(enable_kv_cache_events)
        self.use_eagle = bool(use_eagle)
        self.log_stats = bool(log_stats)
        self.metrics_collector = metrics_collector
        self.prefix_cache_stats = PrefixCacheStats() if log_stats else None
        self.coordinator = get_kv_cache_coordinator(
            kv_cache_config, max_model_len, max_in_flight_tokens, self.use_eagle,
            self.enable_caching, self.enable_kv_cache_events, dcp_world_size, pcp_world_size,
            scheduler_block_size, hash_block_size, metrics_collector, num_hash_lookahead_tokens, num_prefill_lookahead,
            use_int_block_hashes=use_int_block_hashes,
        )
        coordinator = self.coordinator
        self.mamba_shared_prefix_checkpoint = bool(
            enable_mamba_shared_prefix_checkpoint and coordinator.eagle_group_ids
            and coordinator.enable_partial_hash_hits and coordinator.num_reprefillable_tokens == 0
        )
        if self.mamba_shared_prefix_checkpoint:
            for manager in coordinator.single_type_managers:
                if isinstance(manager, MambaManager):
                    (<MambaManager>manager).shared_prefix_checkpoint = True
        self.retained_hit_group_ids = tuple(
            m.kv_cache_group_id for m in coordinator.single_type_managers if m.retains_longer_hit
        )
        self.num_kv_cache_groups = len(kv_cache_config.kv_cache_groups)
        self.block_pool = self.coordinator.block_pool
        self.kv_cache_config = kv_cache_config
        self.watermark_blocks = int(watermark_blocks)
        self.kv_cache_event_metadata = tuple(
            (get_kv_cache_spec_kind(g.kv_cache_spec).value, get_kv_cache_spec_sliding_window(g.kv_cache_spec))
            for g in kv_cache_config.kv_cache_groups
        )
        self.empty_kv_cache_blocks = KVCacheBlocks(tuple([() for _ in range(self.num_kv_cache_groups)]))
        # (not empty_kv_cache_blocks.blocks: callers get that object from get_computed_blocks
        # and may reassign its blocks; allocate_slots indexes this one per group unchecked)
        self._no_blocks = self.empty_kv_cache_blocks.blocks
        self._group_block_sizes = tuple(g.kv_cache_spec.block_size for g in kv_cache_config.kv_cache_groups)
        managers = self.coordinator.single_type_managers
        self._full = None
        if (len(managers) == 1 and type(managers[0]) is FullAttentionManager
                and coordinator.num_reprefillable_tokens == 0
                and not (<FullAttentionManager>managers[0])._record_new_block_ids):
            self._full = <FullAttentionManager>managers[0]
        self._full_lookup_ok = (
            self._full is not None and self.enable_caching
            and not self.enable_kv_cache_events and type(self.coordinator) is UnitaryKVCacheCoordinator
            and not (<UnitaryKVCacheCoordinator>self.coordinator).use_eagle
            and self._full.block_size == self.block_pool.hash_block_size
        )
        # allocate_slots raises ValueError for a request that needs more
        # blocks than the whole pool holds, where vLLM returns None (and a loop
        # would wait for it forever).  A kvcy extension: the vLLM drop-in
        # (kvcy.vllm) turns it off, so that vLLM's Scheduler sees None.
        self.refuse_unservable = True
        # allocate_slots raises ValueError for prefix hits whose blocks are no
        # longer cached as get_computed_blocks found them, where vLLM takes any
        # block it is handed (its own tests hand it free, uncached blocks as
        # hits).  The vLLM drop-in turns it off too.
        self.refuse_stale_hits = True

    # ------------------------------------------------------------------ info
    @property
    def usage(self):
        """Fraction of usable blocks in use."""
        return self.block_pool.get_usage()

    def make_prefix_cache_stats(self):
        """Take the stats gathered since the last call (None unless log_stats)."""
        if not self.log_stats:
            return None
        stats = self.prefix_cache_stats
        self.prefix_cache_stats = PrefixCacheStats()
        return stats

    cpdef KVCacheBlocks create_kv_cache_blocks(self, tuple blocks):
        cdef object g
        for g in blocks:
            if g:
                return KVCacheBlocks(blocks)
        return self.empty_kv_cache_blocks

    # ------------------------------------------------------------------ stats
    def prefix_cache_lookup_enabled(self, request):
        """Whether a prefix-cache lookup may run for this request (caching on, and
        the request does not skip reading the cache)."""
        return self.enable_caching and not request.skip_reading_prefix_cache

    def record_prefix_cache_stats(self, request, num_hits):
        """Count one lookup of ``request`` that hit ``num_hits`` tokens.

        The scheduler calls this when it admits the request (``get_computed_blocks``
        records nothing); a request that skipped the lookup is not counted.
        """
        if not self.log_stats or not self.prefix_cache_lookup_enabled(request):
            return
        assert self.prefix_cache_stats is not None  # (as vLLM asserts: a public attribute)
        self.prefix_cache_stats.record(
            num_tokens=request.num_tokens,
            num_hits=num_hits,
            preempted=request.num_preemptions > 0,
        )

    # ------------------------------------------------------------------ lookups
    def get_computed_blocks(self, request, max_cache_hit_length=None):
        """The longest prefix-cache hit for a request; changes no reference counts.

        Args:
            request: the request.
            max_cache_hit_length: the longest hit to look for; by default
                ``request.num_tokens - 1`` (the last token is always computed).

        Returns:
            ``(blocks, num_computed_tokens, shared_prefix_boundary)``.  The hit
            is good until the pool changes: hand it to ``allocate_slots`` (as
            ``new_computed_blocks``, with ``num_new_computed_tokens``) for this
            request before any other allocation, free or eviction, or look it up
            again.  A hit that went stale meanwhile is refused there.

        Raises:
            ValueError / TypeError: ``max_cache_hit_length`` is not a non-negative int.
        """
        if max_cache_hit_length is not None:
            return self._general_lookup(request, _check_count("max_cache_hit_length", max_cache_hit_length))
        if self._full_lookup_ok and type(request) is Request:
            return self._full_lookup(<Request>request)
        return self._general_lookup(request, -1)

    cdef object _general_lookup(self, request, Py_ssize_t max_cache_hit_length):
        # max_cache_hit_length: -1 for the default (all tokens but the last).
        if _no_lookup(self, request):
            return self.empty_kv_cache_blocks, 0, 0
        if max_cache_hit_length < 0:
            max_cache_hit_length = _num_tokens(request) - 1
        cdef tuple res = self.coordinator.find_longest_cache_hit(_block_hashes_of(request), max_cache_hit_length)
        cdef tuple computed_blocks = res[0]
        cdef Py_ssize_t num_new_computed_tokens = res[1]
        cdef Py_ssize_t num_uncached = res[2]
        if (
            num_new_computed_tokens > 0
            and self.enable_kv_cache_events
            and getattr(request, "kv_cache_report_mode", "incremental") == "full"  # (as vLLM reads it)
        ):
            for group_idx, group_blocks in enumerate(computed_blocks):
                if group_blocks:
                    self.block_pool.emit_cached_block_events(
                        request, len(group_blocks), self._group_block_sizes[group_idx], group_idx
                    )
        boundary = num_new_computed_tokens + num_uncached if num_uncached else 0
        return self.create_kv_cache_blocks(computed_blocks), num_new_computed_tokens, boundary

    def get_computed_blocks_for_connector(self, request, max_cache_hit_length=None):
        """The local prefix hit of a request scheduled with a KV connector.

        Returns ``get_computed_blocks``' triple and ``hit_diverged``.  Only a
        hybrid of Mamba and full attention differs from ``get_computed_blocks``:
        its groups are searched one by one and the full-attention hit is the
        local prefix (the connector brings the rest, Mamba state included), with
        ``hit_diverged`` True when another group hit less, and a boundary of 0.
        When some group hit deeper than full attention, the full-attention tail
        was evicted, and the hit all groups share is returned instead.

        Raises:
            ValueError / TypeError: ``max_cache_hit_length`` is not a non-negative int.
        """
        coordinator = self.coordinator
        if not (
            self.kv_cache_config.has_mamba_layers
            and isinstance(coordinator, HybridKVCacheCoordinator)
            and coordinator.full_attention_group_id is not None
        ):
            return (*self.get_computed_blocks(request, max_cache_hit_length), False)
        cdef Py_ssize_t max_len = -1
        if max_cache_hit_length is not None:
            max_len = _check_count("max_cache_hit_length", max_cache_hit_length)
        if _no_lookup(self, request):
            return self.empty_kv_cache_blocks, 0, 0, False
        if max_len < 0:
            max_len = _num_tokens(request) - 1
        fa_group_id = coordinator.full_attention_group_id
        computed, hits = coordinator.find_longest_cache_hit_per_group(_block_hashes_of(request), max_len)
        num_local = hits[fa_group_id]
        if any(hit > num_local for hit in hits):
            return (*self.get_computed_blocks(request, max_len), False)
        return self.create_kv_cache_blocks(computed), num_local, 0, min(hits) < num_local

    cdef object _full_lookup(self, Request request):
        # get_computed_blocks for one plain full-attention group with no
        # stats, events, EAGLE or coarser hashes: _general_lookup's steps with
        # the search of FullAttentionManager._hits for one group at the hash
        # block size (no resolving, no EAGLE block to drop, the alignment its
        # block size: nothing to trim), without the coordinator's layers and
        # tuples.
        if _no_lookup(self, request):
            return self.empty_kv_cache_blocks, 0, 0
        cdef FullAttentionManager mgr = self._full
        cdef object hashes = request._block_hashes
        if type(hashes) is not list or mgr.kv_cache_group_id > 0xFFFFFFFF:
            return self._general_lookup(request, -1)
        cdef Py_ssize_t max_blocks = _num_searchable_blocks(
            hashes, PyList_GET_SIZE(request._all_token_ids) - 1, mgr.block_size)
        cdef list hits = []
        _hits_from_list(self.block_pool.cached_block_hash_to_block, <list>hashes, max_blocks,
                        <uint32_t>mgr.kv_cache_group_id, hits)
        if not hits:
            return self.empty_kv_cache_blocks, 0, 0
        return _one_group(hits), PyList_GET_SIZE(hits) * mgr.block_size, 0

    # ------------------------------------------------------------------ allocation
    def allocate_slots(self, request, num_new_tokens, num_new_computed_tokens=0, new_computed_blocks=None,
                       num_lookahead_tokens=0, num_external_computed_tokens=0, delay_cache_blocks=False,
                       num_encoder_tokens=0, full_sequence_must_fit=False, reserved_blocks=0,
                       has_scheduled_reqs=True, skip_zeroing_group_ids=()):
        """Add slots for ``num_new_tokens`` (+ lookahead) tokens of a request.

        Returns the newly allocated blocks per group, or ``None`` -- with
        nothing allocated or touched -- when the pool cannot hold them.  The
        external-token blocks of the groups in ``skip_zeroing_group_ids`` (an
        async load writes them) are not reported for zeroing.

        Raises:
            ValueError: a negative count; no tokens at all.  (Tokens past
                ``max_model_len`` are not an error: the counts are clamped to
                it, as in vLLM.)  A prefix-cache hit that went stale since
                ``get_computed_blocks`` (a block evicted, reused or re-keyed).
                With ``refuse_unservable`` (the default): an allocation that
                needs more blocks than the whole pool holds, which ``None``
                would leave waiting forever.
            TypeError: a count that is not an int.
            AssertionError: prefix hits handed to a request that already holds
                blocks (vLLM's coordinator asserts this too; here nothing changes).
        """
        cdef Py_ssize_t n_new = _check_count("num_new_tokens", num_new_tokens)
        # (Defaults left as they are -- the interned 0 -- need no checking.)
        cdef Py_ssize_t n_new_comp = (
            0 if num_new_computed_tokens is _ZERO
            else _check_count("num_new_computed_tokens", num_new_computed_tokens)
        )
        cdef Py_ssize_t n_look = (
            0 if num_lookahead_tokens is _ZERO else _check_count("num_lookahead_tokens", num_lookahead_tokens)
        )
        cdef Py_ssize_t n_ext = (
            0 if num_external_computed_tokens is _ZERO
            else _check_count("num_external_computed_tokens", num_external_computed_tokens)
        )
        cdef Py_ssize_t n_enc = (
            0 if num_encoder_tokens is _ZERO else _check_count("num_encoder_tokens", num_encoder_tokens)
        )
        cdef Py_ssize_t n_reserved = (
            0 if reserved_blocks is _ZERO else _check_count("reserved_blocks", reserved_blocks)
        )
        if type(skip_zeroing_group_ids) is not tuple:
            skip_zeroing_group_ids = tuple(skip_zeroing_group_ids)
        if n_new == 0 and n_new_comp == 0 and n_ext == 0:
            raise ValueError(
                "num_new_tokens must be greater than 0 when there are no computed tokens to adopt"
            )
        cdef tuple hit_groups
        cdef Request own
        cdef object fhashes
        cdef str request_id
        cdef Py_ssize_t num_computed, num_in_flight
        cdef object status
        if self._full is not None and n_ext == 0:
            hit_groups = None
            if new_computed_blocks is not None:
                if type(new_computed_blocks) is KVCacheBlocks:
                    hit_groups = (<KVCacheBlocks>new_computed_blocks).blocks
                # (Hits in a list or tuple only: reading any other sequence
                # runs its code, which could change the manager under the
                # fast path's record.)
                if not (hit_groups is not None and PyTuple_GET_SIZE(hit_groups) == 1
                        and (type(hit_groups[0]) is list or type(hit_groups[0]) is tuple)):
                    hit_groups = ()
            if hit_groups is None or PyTuple_GET_SIZE(hit_groups) == 1:
                if type(request) is Request:
                    own = <Request>request
                    return self._full_slots(
                        request, own, own.request_id, own._num_computed_tokens, PyList_GET_SIZE(own._all_token_ids),
                        own._block_hashes, own.status, n_new, n_new_comp,
                        None if hit_groups is None else hit_groups[0], n_look, n_reserved, delay_cache_blocks,
                        has_scheduled_reqs, full_sequence_must_fit)
                if self.enable_caching and not delay_cache_blocks:
                    # Another request object (vLLM's), when the blocks are cached: then
                    # the general path reads each of these fields too (the in-flight
                    # count only to drop skipped blocks, which one full-attention group
                    # never has); here each is read once, its hashes must be a list.
                    request_id = _rid(request)
                    num_computed = request.num_computed_tokens
                    num_in_flight = request.num_in_flight_tokens
                    status = request.status
                    fhashes = _block_hashes_of(request)
                    if type(fhashes) is list:
                        return self._full_slots(
                            request, None, request_id, num_computed, -1, <list>fhashes, status,
                            n_new, n_new_comp, None if hit_groups is None else hit_groups[0], n_look, n_reserved,
                            False, has_scheduled_reqs, full_sequence_must_fit)
        if type(request) is Request:
            request_id = (<Request>request).request_id
            num_computed = (<Request>request)._num_computed_tokens
            num_in_flight = (<Request>request)._num_in_flight_tokens
            status = (<Request>request).status
        else:
            request_id = _rid(request)
            num_computed = request.num_computed_tokens
            num_in_flight = request.num_in_flight_tokens
            status = request.status
        cdef Py_ssize_t num_local_computed_tokens = num_computed + n_new_comp
        cdef tuple new_blocks_list
        cdef bint has_new_computed
        cdef KVCacheCoordinator coordinator = self.coordinator
        cdef object g
        if new_computed_blocks is None:
            new_blocks_list = self._no_blocks
            has_new_computed = False
        else:
            new_blocks_list = (<KVCacheBlocks?>new_computed_blocks).blocks
            has_new_computed = False
            for g in new_blocks_list:
                if g:
                    has_new_computed = True
                    break
            if not has_new_computed:
                new_blocks_list = self._no_blocks
            else:
                if len(new_blocks_list) != self.num_kv_cache_groups:
                    raise ValueError(
                        f"new_computed_blocks has {len(new_blocks_list)} groups, the manager has "
                        f"{self.num_kv_cache_groups}"
                    )
                if coordinator.holds(request_id):
                    _refuse_hits_when_held(request_id)
                for g in new_blocks_list:
                    _check_hit_blocks(g, NULL, None, self.block_pool.blocks)

        cdef Py_ssize_t total_computed_tokens = _within_model_len(self, num_local_computed_tokens + n_ext)
        cdef Py_ssize_t watermark_blocks = _watermark_for(self, status, has_scheduled_reqs)
        cdef Py_ssize_t needed, full_num_tokens, prefill_end = 0
        if coordinator._retention_interval is not None and coordinator._retention_interval == 0:
            # (where the scheduler ends the prefill; a resumed request replays its output)
            prefill_end = max(_check_count("num_prompt_tokens", request.num_prompt_tokens), _num_tokens(request) - 1)
        if full_sequence_must_fit:
            full_num_tokens = _within_model_len(self, _num_tokens(request))
            needed = coordinator.get_num_blocks_to_allocate(
                request_id, full_num_tokens, new_blocks_list, n_enc,
                total_computed_tokens, num_local_computed_tokens, full_num_tokens, True, prefill_end,
            )
            if not _fits(self.block_pool, needed, watermark_blocks, 0):
                if self.refuse_unservable:
                    self._check_can_ever_fit(request_id, needed, new_blocks_list)
                return None

        cdef Py_ssize_t num_tokens_main_model = total_computed_tokens + n_new
        cdef Py_ssize_t num_tokens_need_slot = _within_model_len(self, num_tokens_main_model + n_look)
        cdef bint caching = self.enable_caching and not delay_cache_blocks
        if caching:  # (what caching reads, before any change)
            coordinator._check_cache_inputs(request, request_id,
                                            _tokens_to_cache(total_computed_tokens, n_new, _num_tokens(request)),
                                            new_blocks_list, has_new_computed or n_ext > 0,
                                            num_local_computed_tokens + n_ext)
        cdef Py_ssize_t processed = total_computed_tokens - num_in_flight
        coordinator.remove_skipped_blocks(
            request_id, processed if processed > 0 else 0,
            (<Request>request).num_prompt_tokens if type(request) is Request
            else getattr(request, "num_prompt_tokens", None),
        )
        needed = coordinator.get_num_blocks_to_allocate(
            request_id, num_tokens_need_slot, new_blocks_list, n_enc,
            num_local_computed_tokens + n_ext, num_local_computed_tokens, num_tokens_main_model, False, prefill_end,
        )
        if not _fits(self.block_pool, needed, watermark_blocks, n_reserved):
            if self.refuse_unservable:
                self._check_can_ever_fit(request_id, needed, new_blocks_list)
            return None
        if has_new_computed and self.enable_caching and self.refuse_stale_hits:  # (only an allocation that goes ahead takes its hits)
            _check_hits_fresh(coordinator, request, request_id, new_blocks_list)
        if has_new_computed or n_ext > 0:
            coordinator.allocate_new_computed_blocks(
                request_id, new_blocks_list, num_local_computed_tokens, n_ext, skip_zeroing_group_ids
            )
        cdef tuple new_blocks = coordinator._allocate_new_blocks(request_id, num_tokens_need_slot,
                                                                 num_tokens_main_model, n_enc)
        if caching:
            coordinator.cache_blocks(request, _tokens_to_cache(total_computed_tokens, n_new, _num_tokens(request)))
        if new_blocks is None:
            return self.empty_kv_cache_blocks
        return self.create_kv_cache_blocks(new_blocks)

    cdef object _full_slots(self, object request, Request own, str request_id, Py_ssize_t num_computed,
                            Py_ssize_t num_tokens, list hashes, object status, Py_ssize_t n_new,
                            Py_ssize_t n_new_comp, object hits, Py_ssize_t n_look, Py_ssize_t n_reserved,
                            bint delay_cache_blocks, bint has_scheduled_reqs, bint full_sequence_must_fit):
        # allocate_slots for one plain full-attention group and no external
        # tokens -- admissions with their prefix hits, prefill chunks, decode
        # steps: the general path's steps (_within_model_len, _watermark_for,
        # _fits, _tokens_to_cache, _refuse_hits_when_held) with its no-op
        # layers for this case (skipped blocks, admission cap, per-group loops)
        # left out, the coordinator's block count specialised (_blocks_needed)
        # and each dict read at most once.  Same decisions, same errors, in
        # the same order.
        # request: kvcy's compiled Request (then `own` is the same object) or
        # another request object (vLLM's; `own` is None), whose request_id,
        # num_computed_tokens, block_hashes (a list) and status the caller read
        # once, and num_tokens too, or -1: read here once, only if needed
        # (vLLM's is a property, a Python call per read).  Nothing here reads
        # them again; the block pool's hash check and caching read the
        # request's hashes, as on the general path.
        # hits: the group's new computed blocks (a sequence), or None.
        cdef Py_ssize_t num_local = num_computed + n_new_comp
        cdef FullAttentionManager mgr = self._full
        cdef BlockPool pool = self.block_pool
        cdef PyObject *p
        cdef bint fresh = False  # the record was read in this call
        cdef list req_blocks
        cdef Py_ssize_t ncached  # num_cached_block[request_id], or -1: no entry
        if (own is not None and own._kv_owner == <PyObject*>mgr and own._kv_gen == mgr._gen.value
                and own._kv_blocks is not None):
            req_blocks = own._kv_blocks
            ncached = own._kv_ncached
        else:
            # A compiled Request remembers the manager's entries for itself.
            # The record stays valid until the manager's _gen moves on (a
            # removal, or any change outside this path), with two exceptions
            # this path checks itself: "no entry" is always re-read, and so is
            # the cached count before caching (another Request object with the
            # same id may have added or advanced them here).  Any other request
            # object has its entries read on every call.
            p = PyDict_GetItem(mgr._req_to_blocks, request_id)
            req_blocks = _held_list(p)
            p = PyDict_GetItem(mgr._num_cached_block, request_id)
            ncached = -1 if p == NULL else <Py_ssize_t><object>p
            if own is not None:
                own._kv_blocks = req_blocks
                own._kv_ncached = ncached
                own._kv_owner = <PyObject*>mgr
                own._kv_gen = mgr._gen.value
            # (Up to the caching below only this call writes the manager's
            # dicts: touching and allocating run no code that could.)
            fresh = True
        cdef Py_ssize_t have = 0 if req_blocks is None else PyList_GET_SIZE(req_blocks)
        # The hits: every one a block (checked before any change), the free
        # ones counted (touching them takes them out of the free pool).
        cdef Py_ssize_t i, n_hits = 0, n_evictable = 0
        cdef list hit_list = None
        cdef PyObject *bp
        if hits is not None:
            n_hits = len(hits)
        if n_hits > 0:
            if req_blocks is not None:
                _refuse_hits_when_held(request_id)
            hit_list = _check_hit_blocks(hits, &n_evictable, pool.free_block_queue if mgr.enable_caching else None,
                                         pool.blocks)
            n_hits = PyList_GET_SIZE(hit_list)
        cdef Py_ssize_t total_computed = _within_model_len(self, num_local)
        cdef Py_ssize_t watermark_blocks = _watermark_for(self, status, has_scheduled_reqs)
        cdef Py_ssize_t needed
        cdef Py_ssize_t bs = mgr.block_size
        if full_sequence_must_fit:
            if num_tokens < 0:
                num_tokens = _num_tokens(request)
            needed = _blocks_needed(_within_model_len(self, num_tokens), bs, have, ncached < 0, n_hits, n_evictable)
            if not _fits(pool, needed, watermark_blocks, 0):
                if self.refuse_unservable:
                    _refuse_if_never_fits(request_id, needed + have + n_hits - n_evictable, pool.num_gpu_blocks,
                                          self.max_model_len, self.kv_cache_config)
                return None
        cdef Py_ssize_t need_slot = _within_model_len(self, total_computed + n_new + n_look)
        needed = _blocks_needed(need_slot, bs, have, ncached < 0, n_hits, n_evictable)
        if not _fits(pool, needed, watermark_blocks, n_reserved):
            if self.refuse_unservable:
                _refuse_if_never_fits(request_id, needed + have + n_hits - n_evictable, pool.num_gpu_blocks,
                                      self.max_model_len, self.kv_cache_config)
            return None
        if n_hits > 0 and mgr.enable_caching and self.refuse_stale_hits:  # (only an allocation that goes ahead takes its hits)
            _fresh_full_hits(self, request, request_id, hashes, hit_list)
        cdef Py_ssize_t num_full, num_cached
        cdef bint caching = self.enable_caching and not delay_cache_blocks
        if caching:
            # What the caching below reads of the request's hashes, checked now.
            # (An unread token count is read only when blocks may be cached:
            # not when the hashes alone cap them at what is cached already.)
            num_full = _full_blocks_to_cache(total_computed, n_new, _UNREAD if num_tokens < 0 else num_tokens,
                                             PyList_GET_SIZE(hashes), bs)
            if ncached < num_full and num_tokens < 0:
                num_tokens = _num_tokens(request)
                num_full = _full_blocks_to_cache(total_computed, n_new, num_tokens, PyList_GET_SIZE(hashes), bs)
            if ncached < num_full:
                if n_hits > 0:
                    num_cached = n_hits
                else:
                    p = PyDict_GetItem(mgr._num_cached_block, request_id)
                    num_cached = 0 if p == NULL else <Py_ssize_t><object>p
                pool._check_hashes_to_cache(request, num_cached, num_full, bs)
        # From here on nothing can fail but a broken invariant.
        if n_hits > 0:
            if ncached >= 0:
                raise RuntimeError(
                    f"request {request_id!r} already holds blocks; it cannot take new prefix-cache hits"
                )
            req_blocks = PyList_New(n_hits)  # hit_list's blocks, touched on the way in
            for i in range(n_hits):
                bp = _PyList_GET_ITEM_RAW(hit_list, i)
                Py_INCREF_RAW(bp)
                (<PyListObject*>req_blocks).ob_item[i] = bp
                if mgr.enable_caching:
                    pool._touch_one(<KVCacheBlock>bp)
            mgr._req_to_blocks[request_id] = req_blocks
            mgr._num_cached_block[request_id] = n_hits
            ncached = n_hits
            if own is not None:
                own._kv_blocks = req_blocks
                own._kv_ncached = n_hits
        elif req_blocks is None:
            req_blocks = []
            mgr._req_to_blocks[request_id] = req_blocks
            if own is not None:
                own._kv_blocks = req_blocks
        cdef list new_blocks = None
        cdef Py_ssize_t n_more = _cdiv(need_slot, bs) - PyList_GET_SIZE(req_blocks)
        if n_more > 0:
            new_blocks = pool._get_new_blocks(n_more)
            req_blocks.extend(new_blocks)
        if caching:
            num_full = _full_blocks_to_cache(total_computed, n_new, _UNREAD if num_tokens < 0 else num_tokens,
                                             PyList_GET_SIZE(hashes), bs)
            if ncached < num_full:
                if fresh:
                    num_cached = ncached if ncached > 0 else 0
                else:  # (see the record above)
                    p = PyDict_GetItem(mgr._num_cached_block, request_id)
                    num_cached = 0 if p == NULL else <Py_ssize_t><object>p
                if num_cached < num_full:
                    pool.cache_full_blocks(request, req_blocks, num_cached, num_full, bs,
                                           mgr.kv_cache_group_id)
                    mgr._num_cached_block[request_id] = num_full
                if own is not None:
                    own._kv_ncached = num_full if num_cached < num_full else num_cached
        if new_blocks is None:
            return self.empty_kv_cache_blocks
        return _one_group(new_blocks)

    cdef int _check_can_ever_fit(self, str request_id, Py_ssize_t needed, tuple hit_groups) except -1:
        # (allocate_slots found too few free blocks: _refuse_if_never_fits
        # with the blocks the request holds and its hits other requests hold.)
        cdef set held = set()
        cdef object group
        cdef KVCacheBlock b
        for group in self.coordinator.get_blocks(request_id):
            for b in group:
                if not b.is_null:
                    held.add(b.block_id)
        for group in hit_groups:
            for b in group:
                if not b.is_null and b._ref_cnt > 0:
                    held.add(b.block_id)
        return _refuse_if_never_fits(request_id, needed + len(held), self.block_pool.num_gpu_blocks,
                                     self.max_model_len, self.kv_cache_config)

    def free(self, request):
        """Free the request's blocks, tail first, group by group.

        A serving loop calls it when the request finishes and when it preempts
        it.  The freed full blocks stay cached (evictable, least recently used
        first) for later hits, a re-admitted request's own among them.

        A request that holds no blocks (never allocated, or freed already) is
        left as it is, as in vLLM.

        Raises:
            TypeError: not a request, or its ``request_id`` is not a str.
        """
        cdef str request_id = _rid(request)
        cdef FullAttentionManager mgr = self._full
        if mgr is not None:  # one group: its manager's free, with one lookup
            mgr._free_held(request_id)
        elif self.coordinator.holds(request_id):
            self.coordinator.free(request_id)
        if type(request) is Request:
            # Drop the fast path's record of the freed list here, so that the
            # list goes now (as the Python twin's does), not with the request.
            (<Request>request)._kv_blocks = None

    def remove_skipped_blocks(self, request_id, processed_computed_tokens, num_prompt_tokens=None):
        """Free the blocks before each group's attention window (replaced by the null block).

        ``num_prompt_tokens`` (the request's prompt length, or None) is for R-SWA
        groups, which also free the blocks between the prompt and the decode
        window; the other groups ignore it.
        """
        _check_rid(request_id)
        cdef Py_ssize_t n = _check_count("processed_computed_tokens", processed_computed_tokens)
        self.coordinator.remove_skipped_blocks(request_id, n, num_prompt_tokens)

    def pop_blocks_for_free(self, request):
        """Forget the request and return its blocks unfreed (every group's, in
        allocation order, leading null blocks left out), for a caller that frees
        them itself later, last block first as ``free`` does.  TypeError: not a request."""
        return self.coordinator.pop_blocks_for_free(_rid(request))

    def evict_blocks(self, block_ids):
        """Drop these blocks from the prefix cache, their KV not to be trusted (a failed
        load, a lost worker): only the cache keys go, a block in use stays with its request;
        uncached ids are ignored.  TypeError / ValueError: a bad id; AssertionError: an id
        past the pool (as vLLM asserts)."""
        self.block_pool.evict_blocks(block_ids)

    def reset_prefix_cache(self):
        """Drop all cached hashes; False (and nothing changes) while blocks are in use."""
        if self.log_stats:  # (vLLM asserts it after the reset; here nothing changes first)
            assert self.prefix_cache_stats is not None
        if not self.coordinator.reset_prefix_cache():
            return False
        if self.log_stats:
            self.prefix_cache_stats.reset = True
        return True

    def get_num_common_prefix_blocks(self, running_request_id):
        """0 per group: deprecated in vLLM 0.33.0 (cascade attention is gone), kept for old schedulers."""
        return [0] * self.num_kv_cache_groups

    def take_events(self):
        """Drain the KV events, annotated with each group's spec kind and window.

        A ``BlockStored`` of a group the manager does not have is logged and
        left as it is.
        """
        events = self.block_pool.take_events()
        meta = self.kv_cache_event_metadata
        for event in events:
            if not isinstance(event, BlockStored) or event.group_idx is None:
                continue
            if not 0 <= event.group_idx < len(meta):
                logger.warning("Group index `%s` not in KV cache metadata", event.group_idx)
                continue
            event.kv_cache_spec_kind, event.kv_cache_spec_sliding_window = meta[event.group_idx]
        return events

    def get_blocks(self, request_id):
        """The request's whole block table per group (empty groups if it holds none).

        Raises:
            TypeError: ``request_id`` is not a str.
        """
        _check_rid(request_id)
        return KVCacheBlocks(self.coordinator.get_blocks(request_id))

    def get_block_ids(self, request_id):
        """The request's block ids per group, as the worker's block-table row holds them
        (hits included; a sliding window's dropped blocks read as the null block, 0; empty
        groups for a request that holds none).  TypeError: ``request_id`` is not a str."""
        return self.get_blocks(request_id).get_block_ids()

    def get_block_ids_for_computed_tokens(self, request_id, num_computed_tokens):
        """The request's block ids that hold its first ``num_computed_tokens`` tokens.

        Attention groups are cut at ``cdiv(num_computed_tokens, block_size)``
        blocks; cross-attention, encoder-only and Mamba groups are given whole.
        """
        num_computed_tokens = _check_count("num_computed_tokens", num_computed_tokens)
        out = []
        for group, ids in zip(self.kv_cache_config.kv_cache_groups, self.get_block_ids(request_id)):
            spec = group.kv_cache_spec
            if isinstance(spec, AttentionSpec) and not isinstance(spec, (CrossAttentionSpec, EncoderOnlyAttentionSpec)):
                ids = ids[: cdiv(num_computed_tokens, spec.block_size)]
            out.append(ids)
        return tuple(out)

    def estimate_cached_tokens(self, request):
        """How many leading tokens of the request its blocks hold in the prefix cache.

        The least, over the prefix-cacheable groups (not cross-attention or
        encoder-only), of the most tokens any of the group's blocks was cached
        for; 0 if none.
        """
        cached = None
        for group, blocks in zip(self.kv_cache_config.kv_cache_groups, self.get_blocks(_rid(request)).blocks):
            spec = group.kv_cache_spec
            if not spec.prefix_cacheable or isinstance(spec, (CrossAttentionSpec, EncoderOnlyAttentionSpec)):
                continue
            most = 0
            for block in blocks:
                n = block.block_hash_num_tokens
                if n is not None and n > most:
                    most = n
            cached = most if cached is None or most < cached else cached
        return cached or 0

    def cache_blocks(self, request, num_computed_tokens):
        """Cache the request's full blocks among its first ``num_computed_tokens``
        tokens (cached ones included), when caching is on.  A request that
        holds no blocks has none to cache.

        Raises:
            ValueError: a negative count.
        """
        cdef Py_ssize_t n = _check_count("num_computed_tokens", num_computed_tokens)
        cdef str request_id
        if self.enable_caching:
            request_id = _rid(request)
            if not self.coordinator.holds(request_id):
                return
            self.coordinator._check_cache_inputs(request, request_id, n, self._no_blocks, False, 0)
            self.coordinator.cache_blocks(request, n)

    def truncate_computed_blocks(self, blocks, num_computed_tokens):
        """A lookup result cut at ``num_computed_tokens`` (a multiple of every block size).

        Only a view: no reference count changes and ``blocks`` is left as it
        is.  A Mamba group keeps what it has up to the cut.

        Raises:
            AssertionError: the cut is not block-aligned, or past a group's hit
                (as in vLLM).
            TypeError: ``blocks`` is not a KVCacheBlocks.
        """
        if not isinstance(blocks, KVCacheBlocks):
            raise TypeError(f"blocks must be KVCacheBlocks, got {type(blocks).__name__}")
        num_computed_tokens = _check_count("num_computed_tokens", num_computed_tokens)
        out = []
        for group_blocks, manager, group in zip(
            blocks.blocks, self.coordinator.single_type_managers, self.kv_cache_config.kv_cache_groups, strict=True
        ):
            spec = group.kv_cache_spec
            if not spec.prefix_cacheable:
                assert not group_blocks
                out.append([])
                continue
            assert num_computed_tokens % manager.block_size == 0
            num_blocks = num_computed_tokens // manager.block_size
            if isinstance(spec, MambaSpec):
                num_blocks = min(num_blocks, len(group_blocks))
            else:
                assert num_blocks <= len(group_blocks)
            out.append(list(group_blocks[:num_blocks]))
        return self.create_kv_cache_blocks(tuple(out))

    # ------------------------------------------------------------------ KV-cache zeroing, copies
    def take_new_block_ids(self):
        """The attention blocks taken since the last call, for the worker to zero.

        Empty unless the config needs zeroing (``needs_kv_cache_zeroing``).
        """
        ids = []
        for manager in self.coordinator.single_type_managers:
            ids.extend(manager.take_new_block_ids())
        return ids

    def record_blocks_for_zeroing(self, request_id, start_token):
        """Report the request's blocks from ``start_token`` on for zeroing again
        (e.g. the blocks a failed async load left unwritten).

        Raises:
            AssertionError: ``start_token`` is not block-aligned (zeroing a
                partly valid block would wipe its valid part), as in vLLM.
        """
        _check_rid(request_id)
        start_token = _check_count("start_token", start_token)
        cdef list todo = []  # (manager, blocks): all checked before any is recorded
        cdef object b
        for manager in self.coordinator.single_type_managers:
            if manager.records_new_block_ids:
                assert start_token % manager.block_size == 0
                blocks = ((<SingleTypeKVCacheManager>manager)._req_to_blocks.get(request_id)
                          or [])[start_token // manager.block_size:]
                for b in blocks:  # (the table's lists are the caller's to change)
                    if not _is_block(<PyObject*>b):
                        raise TypeError(f"req_to_blocks values must be lists of blocks, got a list holding "
                                        f"{type(b).__name__}")
                todo.append((manager, blocks))
        for manager, blocks in todo:
            _record_ids((<SingleTypeKVCacheManager>manager).new_block_ids, blocks)

    def take_kv_cache_block_copies(self):
        """The block copies (copy-on-write of partial hits) queued since the last call,
        and the blocks they keep referenced (source and copy of each, in order): the
        caller frees those once the worker has run the copies."""
        copies = []
        retained = []
        for manager in self.coordinator.single_type_managers:
            for source, copy in manager.take_pending_cow_copies():
                copies.append(KVCacheBlockCopy(source.block_id, copy.block_id))
                retained.extend((source, copy))
        return copies, retained

    def take_boundary_state_offloads(self):
        """Mamba "align" boundary states queued for a KV connector since the last call:
        ``{request id: [(group id, block id, boundary tokens), ...]}``."""
        offloads = {}
        for manager in self.coordinator.single_type_managers:
            for request_id, group_id, block, boundary in manager.take_pending_boundary_state_offloads():
                offloads.setdefault(request_id, []).append((group_id, block.block_id, boundary))
        return offloads

    def finalize_partial_tail_offloads(self, request):
        """A finishing request's own Mamba "align" partial tails that no later token
        overwrote: ``[(group id, block id, boundary tokens), ...]``."""
        request_id = _rid(request)
        num_computed = _check_count("num_computed_tokens", request.num_computed_tokens)
        num_in_flight = _check_count("num_in_flight_tokens", request.num_in_flight_tokens)
        out = []
        for manager in self.coordinator.single_type_managers:
            done = manager.finalize_partial_tail_offload(request_id, num_computed, num_in_flight)
            if done is not None:
                out.append((done[0], done[1].block_id, done[2]))
        return out

    def new_step_starts(self):
        """A new scheduler step begins: the coordinator tells every single-type manager."""
        self.coordinator.new_step_starts()
