# kv_cache_c/single_type_kv_cache_manager.pyx: SingleTypeKVCacheManager and the full (and sink) and
# cross-attention managers; Mamba's is in single_type_kv_cache_manager_mamba.pyx, the windowed ones in
# single_type_kv_cache_manager_local_attention.pyx, the spec -> manager map in single_type_kv_cache_manager_factory.pyx.  (vLLM: vllm/v1/core/single_type_kv_cache_manager.py.)
# Included into kvcy/_fast/_kv_cache_c.pyx (one extension module), not compiled on its own.

cdef inline list _held_list(PyObject *p):
    # An entry of a manager's req_to_blocks (a public dict: check what is
    # there before reading it as a list), or None for no entry.
    if p == NULL:
        return None
    if Py_TYPE_RAW(p) != &PyList_Type:
        raise TypeError(f"req_to_blocks values must be lists of blocks, got {type(<object>p).__name__}")
    return <list>p


def _checked_count(name, value):
    """``_check_count`` for Python callers (the shared request tables)."""
    return _check_count(name, value)


cdef int _record_ids(list ids, list blocks) except -1:
    # Append the blocks' ids (blocks taken, for the worker to zero).
    cdef object b
    for b in blocks:
        ids.append((<KVCacheBlock>b).block_id)
    return 0


def _check_int_arg(name, value):
    # An int argument that may be negative (a token position), within what a C count holds.
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    if not -(2**62) <= value <= 2**62:
        raise ValueError(f"{name} is too large: {value}")
    return int(value)


def _shared_prefix_boundary(request):
    """The request's ``shared_prefix_boundary`` (vLLM's scheduler sets it from
    ``get_computed_blocks``); 0 for a request without one."""
    value = getattr(request, "shared_prefix_boundary", 0)
    if type(value) is int and -(2**62) <= value <= 2**62:
        return value
    return _check_int_arg("shared_prefix_boundary", value)


def _check_retention_interval(retention_interval):
    if retention_interval is None:
        return None
    return _check_count("retention_interval", retention_interval)


def _check_mask_args(retention_interval, reachable_boundaries, dcp_world_size, final_segment_end_block):
    # reachable_block_mask's sparse-retention arguments, checked alike by every manager.
    retention_interval = _check_retention_interval(retention_interval)
    _check_world_size("dcp_world_size", dcp_world_size)
    try:
        boundaries = [_check_int_arg("reachable_boundaries", b) for b in reachable_boundaries]
    except TypeError:
        if not hasattr(reachable_boundaries, "__iter__"):
            raise TypeError(
                f"reachable_boundaries must be a sequence of ints, got {type(reachable_boundaries).__name__}"
            ) from None
        raise
    if final_segment_end_block is not None:
        final_segment_end_block = _check_count("final_segment_end_block", final_segment_end_block)
    return retention_interval, boundaries, final_segment_end_block


cdef inline Py_ssize_t _floor_div(Py_ssize_t a, Py_ssize_t b) noexcept:
    # a // b rounded toward minus infinity, as Python's (the build truncates: cdivision); b > 0.
    cdef Py_ssize_t q = a // b
    if a < 0 and q * b != a:
        q -= 1
    return q


cdef class _Generation:
    """A manager's generation (SingleTypeKVCacheManager._gen), shared with its table views."""

    def __cinit__(self):
        self.value = _next_gen()

    def bump(self):
        self.value = _next_gen()


def _check_world_size(name, value):
    # A context-parallel world size: a positive int (blocks span block_size * dcp tokens,
    # a divisor the C code uses unchecked).
    if type(value) is not int:
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    if value <= 0 or value > 2**31:
        raise ValueError(f"{name} must be a positive int, got {value}")
    return value


def _check_world_sizes(dcp_world_size, pcp_world_size):
    """The decode / prefill context-parallel world sizes: positive ints."""
    _check_world_size("dcp_world_size", dcp_world_size)
    _check_world_size("pcp_world_size", pcp_world_size)


@cython.nonecheck(True)
cdef class SingleTypeKVCacheManager:
    """Block bookkeeping for one KV-cache group of one attention type.

    With ``needs_kv_cache_zeroing`` (the config's: Mamba layers or mixed
    precision), an attention group records the ids of the blocks it takes for
    the worker to zero (``take_new_block_ids``); a circular buffer's ring never
    is.  A group whose spec is not ``prefix_cacheable`` (bounded replay, the
    ring) caches nothing.
    """

    #: Whether the group keeps a longer prefix hit until an external lookup ends (HiSparse: never here).
    retains_longer_hit = False
    #: Whether a lookup can end inside one of this type's blocks (fine-grained partial hits).
    supports_fine_grained_hash_lookup = False

    def __cinit__(self, *args, **kwargs):
        # (refused by __new__ alone: see _no_arguments)
        if not args and not kwargs:
            raise TypeError(_no_arguments(type(self)))
        # divisors of an object whose __init__ never ran (a subclass may skip it) are 1,
        # never 0: the C code divides unchecked (cdivision); its None fields raise (nonecheck)
        self.block_size = 1
        self.scheduler_block_size = 1
        self._alignment = 1

    def __init__(self, kv_cache_spec, BlockPool block_pool, enable_caching, Py_ssize_t kv_cache_group_id,
                 Py_ssize_t scheduler_block_size, dcp_world_size=1, pcp_world_size=1,
                 needs_kv_cache_zeroing=False, max_admission_blocks_per_request=None):
        _check_world_sizes(dcp_world_size, pcp_world_size)
        # A dcp-sharded group's block holds block_size tokens on each of dcp ranks
        # (interleaved), so in token terms it spans block_size * dcp; a replicated one
        # (a draft model's, Mamba's) is whole everywhere.
        sharded = bool(kv_cache_spec.dcp_sharded)
        self.dcp_world_size = dcp_world_size if sharded else 1
        self.pcp_world_size = pcp_world_size if sharded else 1
        self._record_new_block_ids = (
            bool(needs_kv_cache_zeroing)
            and isinstance(kv_cache_spec, AttentionSpec)
            and not isinstance(kv_cache_spec, CircularBufferSpec)
        )
        self._prefix_cacheable = bool(kv_cache_spec.prefix_cacheable)
        self.new_block_ids = []
        self.kv_cache_spec = kv_cache_spec
        self.block_size = kv_cache_spec.block_size * self.dcp_world_size
        self.block_pool = block_pool
        self.enable_caching = bool(enable_caching)
        self.kv_cache_group_id = kv_cache_group_id
        self.scheduler_block_size = scheduler_block_size
        self._max_admission_blocks_per_request = max_admission_blocks_per_request
        self._cap = -1 if max_admission_blocks_per_request is None else max_admission_blocks_per_request
        self.use_eagle = False
        self._req_to_blocks = {}
        self._num_cached_block = {}
        self._gen = _Generation()
        self.req_to_blocks = _BlockTable(self._req_to_blocks, self._gen, block_pool.blocks, KVCacheBlock)
        self.num_cached_block = _CountTable(self._num_cached_block, self._gen, _checked_count)
        self._null_block = block_pool.null_block
        self._alignment = scheduler_block_size
        self.shared_prefix_checkpoint = False
        self._partial_hit_reqs = {}
        self._pending_cow_copies = []
        self._pending_boundary_state_offloads = []

    @property
    def cache_hit_alignment_tokens(self):
        """The token granularity hits land on: the scheduler block, or the hash
        block when the hybrid coordinator turns fine-grained partial hits on."""
        return self._alignment

    @cache_hit_alignment_tokens.setter
    def cache_hit_alignment_tokens(self, value):
        cdef Py_ssize_t n = _check_count("cache_hit_alignment_tokens", value)
        if n == 0:
            raise ValueError("cache_hit_alignment_tokens must be positive, got 0")
        self._alignment = n

    @property
    def has_positionally_stable_blocks(self):
        """Whether a block index keeps naming the same token range (False only for Mamba align)."""
        return True

    # -------------------------------------------------------------- counting
    cpdef Py_ssize_t get_num_skipped_tokens(self, Py_ssize_t num_computed_tokens):
        """Tokens before the attention window (their blocks can be freed)."""
        return 0

    cpdef Py_ssize_t get_num_blocks_to_allocate(
        self, str request_id, Py_ssize_t num_tokens, object new_computed_blocks,
        Py_ssize_t total_computed_tokens, Py_ssize_t num_local_computed_tokens,
        Py_ssize_t num_tokens_main_model, bint apply_admission_cap=False, Py_ssize_t prefill_end=0,
    ) except? -1:
        """Blocks this group must take from the free pool to hold ``num_tokens``.

        Evictable cache hits (free, ref_cnt 0) count too: touching them takes
        them out of the free pool; so does the private copy of a partial hit's
        tail block.  ``prefill_end`` matters only to Mamba align mode's prefill
        checkpoints (``MambaManager``).
        """
        cdef Py_ssize_t num_required_blocks = _cdiv(num_tokens, self.block_size)
        if apply_admission_cap and self._cap >= 0 and self._cap < num_required_blocks:
            num_required_blocks = self._cap
        cdef PyObject* p = PyDict_GetItem(self._req_to_blocks, request_id)
        cdef Py_ssize_t num_req_blocks = 0 if p == NULL else PyList_GET_SIZE(_held_list(p))
        cdef Py_ssize_t n
        if request_id in self._num_cached_block:
            n = num_required_blocks - num_req_blocks
            return n if n > 0 else 0
        cdef Py_ssize_t num_skipped_blocks = self.get_num_skipped_tokens(total_computed_tokens) // self.block_size
        cdef Py_ssize_t n_new_computed = len(new_computed_blocks)
        cdef Py_ssize_t num_local_computed_blocks = n_new_computed + num_req_blocks
        cdef Py_ssize_t m = num_skipped_blocks if num_skipped_blocks > num_local_computed_blocks else num_local_computed_blocks
        cdef Py_ssize_t num_new_blocks = num_required_blocks - m
        if num_new_blocks < 0:
            num_new_blocks = 0
        cdef Py_ssize_t skip_new = num_skipped_blocks - num_req_blocks
        if skip_new < 0:
            skip_new = 0
        cdef Py_ssize_t i, num_evictable = 0
        cdef KVCacheBlock blk
        cdef object item
        cdef FreeKVCacheBlockQueue queue = self.block_pool.free_block_queue if self.enable_caching else None
        for i in range(skip_new, n_new_computed):
            item = new_computed_blocks[i]
            if not _is_block(<PyObject*>item):
                raise TypeError(f"blocks must be KVCacheBlock, got {type(item).__name__}")
            blk = <KVCacheBlock>item
            if blk._ref_cnt == 0 and not blk.is_null:
                # (a free hit must be in the free queue, or touching it fails half-way)
                if queue is not None and not queue._holds(blk):
                    raise RuntimeError(f"remove() called on an invalid block: {blk}")
                num_evictable += 1
        if n_new_computed > 0 and num_local_computed_tokens % self.block_size != 0:
            num_new_blocks += 1  # (the private copy of a partial hit's shared tail)
        return num_new_blocks + num_evictable

    # -------------------------------------------------------------- allocation
    cpdef add_local_computed_blocks(self, str request_id, object new_computed_blocks,
                                    Py_ssize_t num_local_computed_tokens,
                                    Py_ssize_t num_external_computed_tokens):
        """Attach prefix-cache hits to a request that holds no blocks yet."""
        self._gen.value = _next_gen()
        cdef Py_ssize_t total = num_local_computed_tokens + num_external_computed_tokens
        cdef Py_ssize_t num_skipped_blocks = self.get_num_skipped_tokens(total) // self.block_size
        cdef list blocks = self._checked_hits(new_computed_blocks, total)
        cdef list req_blocks = self._req_to_blocks.setdefault(request_id, [])
        assert not req_blocks
        if self.enable_caching:
            self.block_pool._touch(blocks)
        if num_skipped_blocks > 0:
            req_blocks.extend([self._null_block] * num_skipped_blocks)
        req_blocks.extend(blocks)
        self._num_cached_block[request_id] = len(req_blocks)
        cdef Py_ssize_t block_idx
        if blocks and num_local_computed_tokens % self.block_size != 0:
            # A partial hit: its tail block is copied before the request writes
            # it (allocate_new_blocks), and cached again once full.
            block_idx = num_local_computed_tokens // self.block_size
            self._partial_hit_reqs[request_id] = (block_idx, blocks[len(blocks) - 1])
            self._num_cached_block[request_id] = block_idx

    cdef list _checked_hits(self, object new_computed_blocks, Py_ssize_t total_computed_tokens):
        # The hits add_local_computed_blocks takes (those past the skipped
        # ones), checked before any change.
        cdef list blocks = list(new_computed_blocks)
        cdef Py_ssize_t skipped = self.get_num_skipped_tokens(total_computed_tokens) // self.block_size
        if skipped > 0:
            blocks = blocks[skipped:]
        return _check_hit_blocks(blocks, NULL, self.block_pool.free_block_queue if self.enable_caching else None,
                                 self.block_pool.blocks)

    cpdef allocate_external_computed_blocks(self, str request_id, Py_ssize_t num_local_computed_tokens,
                                            Py_ssize_t num_external_computed_tokens, bint record_for_zeroing=True):
        """New blocks for tokens a KV connector computed (after every group touched its hits).

        ``record_for_zeroing=False``: an async load writes them, so they are not
        reported for zeroing.
        """
        cdef Py_ssize_t total = num_local_computed_tokens + num_external_computed_tokens
        cdef Py_ssize_t num_skipped_tokens = self.get_num_skipped_tokens(total)
        if num_skipped_tokens > 0:
            num_external_computed_tokens = min(total - num_skipped_tokens, num_external_computed_tokens)
        if num_external_computed_tokens <= 0:
            return
        self._gen.value = _next_gen()
        cdef list req_blocks = self._req_to_blocks.setdefault(request_id, [])
        cdef Py_ssize_t num_new_blocks = _cdiv(total, self.block_size) - PyList_GET_SIZE(req_blocks)
        # (holding as many already: nothing to do, as in vLLM -- never a
        # negative count to the unchecked pop)
        cdef list new_blocks
        if num_new_blocks > 0:
            new_blocks = self.block_pool._get_new_blocks(num_new_blocks)
            req_blocks.extend(new_blocks)
            if self._record_new_block_ids and record_for_zeroing:
                _record_ids(self.new_block_ids, new_blocks)

    cpdef list allocate_new_blocks(self, str request_id, Py_ssize_t num_tokens, Py_ssize_t num_tokens_main_model):
        """Give the request at least ``num_tokens`` slots; return the new blocks
        (first the private copy of a partial hit's tail block, if there is one)."""
        cdef list out = self._allocate_new_blocks(request_id, num_tokens, num_tokens_main_model)
        return [] if out is None else out

    cdef list _allocate_new_blocks(self, str request_id, Py_ssize_t num_tokens, Py_ssize_t num_tokens_main_model):
        # As allocate_new_blocks, but None (no list built) when nothing is new.
        if self._partial_hit_reqs and request_id in self._partial_hit_reqs:
            return self._allocate_with_cow(request_id, num_tokens)
        cdef PyObject* p = PyDict_GetItem(self._req_to_blocks, request_id)
        cdef list req_blocks
        if p == NULL:
            self._gen.value = _next_gen()
            req_blocks = []
            self._req_to_blocks[request_id] = req_blocks
        else:
            req_blocks = _held_list(p)
        cdef Py_ssize_t num_new_blocks = _cdiv(num_tokens, self.block_size) - PyList_GET_SIZE(req_blocks)
        if num_new_blocks <= 0:
            return None
        cdef list new_blocks = self.block_pool._get_new_blocks(num_new_blocks)
        req_blocks.extend(new_blocks)
        if self._record_new_block_ids:
            _record_ids(self.new_block_ids, new_blocks)
        return new_blocks

    def _allocate_with_cow(self, str request_id, Py_ssize_t num_tokens):
        # _allocate_new_blocks for a request with a partial hit: its copy first.
        block_idx, source = self._partial_hit_reqs[request_id]
        self._check_cow(request_id, block_idx, source)  # (before a block is taken)
        del self._partial_hit_reqs[request_id]
        cdef KVCacheBlock cow = self.block_pool._get_new_blocks(1)[0]
        self._apply_cow(request_id, block_idx, source, cow)
        self.new_block_ids.append(cow.block_id)  # (recorded whatever the group, as vLLM)
        cdef list rest = self._allocate_new_blocks(request_id, num_tokens, num_tokens)
        return [cow] if rest is None else [cow] + rest

    @cython.boundscheck(True)
    @cython.wraparound(False)
    cdef int _check_cow(self, str request_id, Py_ssize_t block_idx, KVCacheBlock source_block) except -1:
        # vLLM's assertions on a copy-on-write, raised even under python -O, alike in both twins.
        req_blocks = self._req_to_blocks.get(request_id, ())
        if not (0 <= block_idx < len(req_blocks) and req_blocks[block_idx] is source_block):
            raise AssertionError(f"block {block_idx} of request {request_id!r} is not the partial hit's block")
        if source_block.is_null or source_block._ref_cnt <= 0:
            raise AssertionError("the partial hit's block is the null block or holds no reference")
        return 0

    cdef int _apply_cow(self, str request_id, Py_ssize_t block_idx, KVCacheBlock source_block,
                        KVCacheBlock cow_block) except -1:
        # The request's copy replaces the shared block at block_idx; both stay
        # referenced (the copy once more) until the worker has run the copy.
        self._check_cow(request_id, block_idx, source_block)  # (the index is written unchecked)
        cdef list req_blocks = self._req_to_blocks[request_id]
        self._gen.value = _next_gen()
        req_blocks[block_idx] = cow_block
        self._pending_cow_copies.append((source_block, cow_block))
        cow_block._ref_cnt += 1
        return 0

    @property
    def records_new_block_ids(self):
        """Whether the worker zeroes this group's new blocks (their ids are recorded)."""
        return self._record_new_block_ids

    def take_new_block_ids(self):
        """The ids of the blocks taken since the last call (for zeroing), and forget them."""
        ids = self.new_block_ids
        self.new_block_ids = []
        return ids

    def take_pending_cow_copies(self):
        """The copy-on-write (source, copy) pairs queued since the last call, and forget them.

        Each pair holds one extra reference on both blocks until the caller
        frees them (once the worker has run the copy)."""
        pending = self._pending_cow_copies
        self._pending_cow_copies = []
        return pending

    def take_pending_boundary_state_offloads(self):
        """The (request id, group id, block, boundary tokens) boundary states queued
        for a KV connector since the last call, and forget them (Mamba align only)."""
        pending = self._pending_boundary_state_offloads
        self._pending_boundary_state_offloads = []
        return pending

    def finalize_partial_tail_offload(self, request_id, num_computed_tokens, num_in_flight_tokens):
        """A finishing request's own partial-tail state for a connector; None but for Mamba align."""
        return None

    cpdef cache_blocks(self, request, Py_ssize_t num_tokens, object retention_interval=None,
                       object replay_boundaries=()):
        """Cache the request's full blocks among its first ``num_tokens`` tokens
        (those it has hashes for: with hash lookahead the hashes lag behind).

        ``retention_interval`` (the config's ``prefix_cache_retention_interval``):
        None caches densely; 0 or a multiple of the scheduler block makes a
        sliding-window group keep only the blocks a hit at a replay boundary,
        at the request's ``shared_prefix_boundary`` or once per interval can
        use.  ``replay_boundaries``: where a later request replaying this
        prompt can resume (``replay_boundaries()``); read only when sparse.
        Nothing for a group that is not prefix-cacheable.
        """
        if not self._prefix_cacheable:
            return
        cdef str request_id = _rid(request)
        cdef PyObject* p = PyDict_GetItem(self._num_cached_block, request_id)
        cdef Py_ssize_t num_cached_blocks = 0 if p == NULL else <Py_ssize_t><object>p
        cdef Py_ssize_t num_full_blocks = _hashed(request, num_tokens, self.block_pool.hash_block_size) // self.block_size
        if num_cached_blocks >= num_full_blocks:
            return
        cdef object mask
        if retention_interval is None:
            mask = self._reachable(num_cached_blocks, num_full_blocks)
        else:
            mask = self._sparse_reachable(num_cached_blocks, num_full_blocks,
                                          _check_count("retention_interval", retention_interval),
                                          self._reachable_boundaries(request, replay_boundaries))
        self.block_pool.cache_full_blocks(
            request, <list>self._req_to_blocks[request_id], num_cached_blocks, num_full_blocks,
            self.block_size, self.kv_cache_group_id, mask,
        )
        self._gen.value = _next_gen()
        self._num_cached_block[request_id] = num_full_blocks

    cdef list _reachable_boundaries(self, object request, object replay_boundaries):
        # The token positions whose reachable tail sparse retention keeps: the replay
        # boundaries and the request's shared-prefix junction (with EAGLE also one block
        # below it: a sibling diverging right after it has no block to peek at).
        cdef list boundaries = [_check_int_arg("replay_boundaries", b) for b in replay_boundaries]
        junction = _shared_prefix_boundary(request)
        if junction:
            boundaries.append(junction)
            if self.use_eagle:
                boundaries.append(junction - self.block_size)
        return boundaries

    cdef object _reachable(self, Py_ssize_t start_block, Py_ssize_t end_block):
        # reachable_block_mask for this manager's blocks [start_block, end_block), dense retention.
        return None

    cdef object _sparse_reachable(self, Py_ssize_t start_block, Py_ssize_t end_block,
                                  Py_ssize_t retention_interval, list boundaries):
        # reachable_block_mask under sparse retention (every type but sliding window: dense).
        return None

    @classmethod
    def reachable_block_mask(cls, start_block, end_block, alignment_tokens, kv_cache_spec, use_eagle,
                             retention_interval=None, reachable_boundaries=(), dcp_world_size=1,
                             final_segment_end_block=None):
        """Which of blocks ``[start_block, end_block)`` a later hit can use, as the mask
        ``cache_full_blocks`` takes; None: all of them (full attention, and every type
        whose hits can end anywhere).

        ``retention_interval``, ``reachable_boundaries`` and ``final_segment_end_block``
        are for sparse retention (the sliding-window manager's); ``dcp_world_size``
        scales the spec's block size (a sharded block spans ``block_size * dcp`` tokens).
        """
        _check_mask_args(retention_interval, reachable_boundaries, dcp_world_size, final_segment_end_block)
        return None

    cdef int _check_cache_inputs(self, object request, str request_id, Py_ssize_t num_tokens, object hits,
                                 bint attaching, Py_ssize_t total_computed_tokens) except -1:
        # What cache_blocks(request, num_tokens) will read once this
        # allocation is made, checked before it: the cached count is the
        # request's entry, or, for a request taking its hits now (attaching),
        # what add_local_computed_blocks will record.
        if not self._prefix_cacheable:
            return 0
        cdef PyObject *p = PyDict_GetItem(self._num_cached_block, request_id)
        cdef Py_ssize_t num_cached, skipped
        if p != NULL:
            num_cached = <object>p
        elif attaching:
            skipped = self.get_num_skipped_tokens(total_computed_tokens) // self.block_size
            num_cached = len(hits)
            if skipped > num_cached:
                num_cached = skipped
        else:
            num_cached = 0
        num_tokens = _hashed(request, num_tokens, self.block_pool.hash_block_size)
        return self.block_pool._check_hashes_to_cache(request, num_cached, num_tokens // self.block_size,
                                                      self.block_size)

    # -------------------------------------------------------------- freeing
    cpdef list pop_blocks_for_free(self, str request_id):
        """Forget the request and return its blocks, in allocation order, without
        freeing them; leading null blocks (a window's skipped prefix) are left out.
        The caller frees them, last block first."""
        self._gen.value = _next_gen()
        self._num_cached_block.pop(request_id, None)
        if self._partial_hit_reqs:
            self._partial_hit_reqs.pop(request_id, None)
        cdef list blocks = self._req_to_blocks.pop(request_id, [])
        cdef Py_ssize_t lead = 0, n = len(blocks)
        cdef object null = self._null_block
        while lead < n and blocks[lead] is null:
            lead += 1
        return blocks[lead:] if lead else blocks

    cpdef free(self, str request_id):
        """Return the request's blocks to the pool, tail first (the request's
        block list itself is left in its order: a caller may still hold it)."""
        if not self._free_held(request_id):
            self.pop_blocks_for_free(request_id)  # (holds none: only the bookkeeping)

    cdef bint _free_held(self, str request_id) except -1:
        # free() for a request holding blocks here, with one lookup; False,
        # changing nothing, if it holds none.
        cdef list blocks = self._req_to_blocks.pop(request_id, None)
        if blocks is None:
            return False
        self._gen.value = _next_gen()
        self._num_cached_block.pop(request_id, None)
        if self._partial_hit_reqs:
            self._partial_hit_reqs.pop(request_id, None)
        # Free tail first, then put the list back in its order: a caller may
        # still hold it (get_blocks hands out these lists), as vLLM leaves it.
        blocks.reverse()
        try:
            self.block_pool._free_blocks(blocks)
        finally:
            blocks.reverse()
        return True

    cdef int _remove_blocks_in_range(self, str request_id, Py_ssize_t first_block, Py_ssize_t last_block) except -1:
        cdef PyObject* p = PyDict_GetItem(self._req_to_blocks, request_id)
        if p == NULL or first_block >= last_block:
            return 0
        cdef list blocks = _held_list(p)
        if last_block > PyList_GET_SIZE(blocks):
            last_block = PyList_GET_SIZE(blocks)
        cdef KVCacheBlock null = self._null_block
        cdef list freed = []
        cdef Py_ssize_t i
        for i in range(last_block - 1, first_block - 1, -1):
            if blocks[i] is null:
                break
            freed.append(blocks[i])
            blocks[i] = null
        if freed:
            self.block_pool._free_blocks(freed)
        return 0

    cpdef remove_skipped_blocks(self, str request_id, Py_ssize_t processed_computed_tokens,
                                object num_prompt_tokens=None):
        """Free the blocks before the attention window, replacing them with the null block.

        ``num_prompt_tokens`` is for managers that free a gap after the prompt
        (vLLM's R-SWA); these ones ignore it.
        """
        cdef Py_ssize_t num_skipped_tokens = self.get_num_skipped_tokens(processed_computed_tokens)
        if num_skipped_tokens <= 0:
            return
        self._remove_blocks_in_range(request_id, 0, num_skipped_tokens // self.block_size)

    @property
    def max_admission_blocks_per_request(self):
        """The admission cap (blocks one request may need), or None: sliding-window and
        chunked-local groups get it from the factory."""
        return self._max_admission_blocks_per_request

    def get_num_common_prefix_blocks(self, running_request_id):
        return 0

    def new_step_starts(self):
        """A new scheduler step begins; nothing to do for this manager (vLLM's Mamba manager clears its per-step record here)."""
        return None

    cdef tuple _find_hit(self, object block_hashes, Py_ssize_t max_length, list group_ids,
                         bint drop_eagle_block, Py_ssize_t alignment_tokens):
        raise NotImplementedError

    @classmethod
    def find_longest_cache_hit(cls, block_hashes, max_length, kv_cache_group_ids, block_pool,
                               kv_cache_spec, drop_eagle_block, alignment_tokens,
                               dcp_world_size=1, pcp_world_size=1):
        """The longest prefix hit common to ``kv_cache_group_ids``: (blocks per group, tokens)."""
        _check_world_sizes(dcp_world_size, pcp_world_size)
        _check_hit_args(kv_cache_group_ids, block_pool, alignment_tokens)
        raise NotImplementedError


cdef int _check_group_ids(list ids) except -1:
    # Each group id an int of 4 bytes (the cache keys hold it), refused alike in both twins.
    cdef object g
    for g in ids:
        if not isinstance(g, int):
            raise TypeError(f"kv_cache_group_ids must be ints, got {type(g).__name__}")
        if not 0 <= g <= 0xFFFFFFFF:
            raise ValueError(f"KV-cache group id {g} does not fit in 4 bytes")
    return 0


cdef list _check_hit_args(object kv_cache_group_ids, object block_pool, object alignment_tokens):
    # find_longest_cache_hit's arguments, before any use (a subclass's _hits reads the first
    # group's list and the pool unchecked, and divides by the alignment: cdivision, a zero
    # would be SIGFPE).  The group ids as a list.
    if not len(kv_cache_group_ids):
        raise ValueError("kv_cache_group_ids must not be empty")
    if not isinstance(block_pool, BlockPool):
        raise TypeError(f"block_pool must be a BlockPool, got {type(block_pool).__name__}")
    if _check_count("alignment_tokens", alignment_tokens) == 0:
        raise ValueError("alignment_tokens must be positive, got 0")
    cdef list ids = list(kv_cache_group_ids)
    _check_group_ids(ids)
    return ids


cdef int _hits_from_list(BlockHashToBlockMap cache, list hashes, Py_ssize_t max_blocks, uint32_t gid,
                         list out) except -1:
    # Append the blocks cached under hashes[0], hashes[1], ... (group gid)
    # to out, stopping at the first miss or after max_blocks.
    cdef Py_ssize_t i
    cdef PyObject *hp
    cdef PyObject *bp
    for i in range(max_blocks):
        hp = _PyList_GET_ITEM_RAW(hashes, i)
        if Py_TYPE_RAW(hp) != &PyBytes_Type:
            raise TypeError(f"block hashes must be bytes, got {type(<object>hp).__name__}")
        bp = cache._get_raw(hp, gid)
        if bp == NULL:
            break
        out.append(<object>bp)
    return 0


def _fine_full_hits(BlockPool pool, Py_ssize_t block_size, object block_hashes, Py_ssize_t max_length,
                    list group_ids, bint drop_eagle_block, Py_ssize_t alignment_tokens):
    # FullAttentionManager's lookup with alignment_tokens below (and dividing) the block
    # size: whole blocks up to the first miss, then the longest cached hash boundary
    # inside the next block; EAGLE drops one alignment unit.
    cdef Py_ssize_t n_groups = len(group_ids), scale = block_size // alignment_tokens
    cdef Py_ssize_t i, g, first, last, fine_idx, hit_length, num_blocks
    if type(block_hashes) is not list:
        block_hashes = list(block_hashes)
    hashes = _BlockHashView(block_hashes, scale)
    cdef tuple computed = tuple([[] for _ in range(n_groups)])
    cdef Py_ssize_t max_blocks = min(max_length // block_size, len(hashes))
    for i in range(max_blocks):
        cached = pool.get_cached_block(hashes[i], group_ids)
        if cached is None:
            break
        for g in range(n_groups):
            (<list>computed[g]).append(cached[g])
    hit_length = len(<list>computed[0]) * block_size
    first = len(<list>computed[0]) * scale
    last = min(first + scale - 1, max_length // alignment_tokens, len(block_hashes))
    for fine_idx in range(last - 1, first - 1, -1):
        cached = pool.get_cached_block(block_hashes[fine_idx], group_ids)
        if cached is None:
            continue
        for g in range(n_groups):
            (<list>computed[g]).append(cached[g])
        hit_length = (fine_idx + 1) * alignment_tokens
        break
    if drop_eagle_block and hit_length > 0:
        hit_length -= alignment_tokens
    hit_length -= hit_length % alignment_tokens
    num_blocks = _cdiv(hit_length, block_size)
    for g in range(n_groups):
        del (<list>computed[g])[num_blocks:]
    return computed, hit_length


@cython.nonecheck(True)
cdef class FullAttentionManager(SingleTypeKVCacheManager):
    """Full attention: every token's KV is kept until the request finishes."""

    supports_fine_grained_hash_lookup = True

    cpdef cache_blocks(self, request, Py_ssize_t num_tokens, object retention_interval=None,
                       object replay_boundaries=()):
        """Cache the request's full blocks among its first ``num_tokens`` tokens (see
        ``SingleTypeKVCacheManager.cache_blocks``); with blocks coarser than the hash
        block, also the partial entry of the prompt's last hash boundary when it
        falls inside a block (``BlockPool.cache_partial_block``), as vLLM does."""
        SingleTypeKVCacheManager.cache_blocks(self, request, num_tokens, retention_interval, replay_boundaries)
        if self.block_size != self.block_pool.hash_block_size:
            self._cache_partial_tail_block(request, num_tokens)

    cdef int _cache_partial_tail_block(self, object request, Py_ssize_t num_tokens) except -1:
        # The prompt's last hash boundary a later request can hit (all of the
        # prompt with EAGLE, which drops a hash unit after looking up; one token
        # less otherwise), cached as a partial entry of the block it falls in
        # once computed.  Boundaries at a block's end are full blocks' keys.
        cdef Py_ssize_t hbs = self.block_pool.hash_block_size
        cdef Py_ssize_t n_prompt = request.num_prompt_tokens
        cdef Py_ssize_t limit = n_prompt if self.use_eagle else n_prompt - 1
        cdef Py_ssize_t n_hashes = len(_block_hashes_of(request))
        # (Python ints: an empty prompt's -1 floors as in vLLM, whatever cdivision says)
        cdef object boundary = min((<object>limit) // hbs, n_hashes) * hbs
        if boundary == 0 or boundary > num_tokens or boundary % self.block_size == 0:
            return 0
        blocks = self._req_to_blocks.get(_rid(request), ())
        cdef object block_idx = boundary // self.block_size
        if block_idx >= len(blocks):
            return 0
        blk = blocks[block_idx]
        cdef BlockPool pool = self.block_pool
        cdef Py_ssize_t n_hash
        if boundary > 0 and _is_block(<PyObject*>blk) and not (<KVCacheBlock>blk).is_null:
            # (what cache_partial_block checks, known here but for the hashes' type)
            hashes = _block_hashes_of(request)
            n_hash = boundary // hbs
            if type(hashes[n_hash - 1]) is bytes and (
                    n_hash == 1 or not pool.enable_kv_cache_events or type(hashes[n_hash - 2]) is bytes):
                pool._cache_partial(request, <KVCacheBlock>blk, hashes, boundary,
                                    <uint32_t>self.kv_cache_group_id, False)
                return 0
        pool.cache_partial_block(request, blk, boundary, self.kv_cache_group_id, self.block_size)
        return 0

    cdef tuple _find_hit(self, object block_hashes, Py_ssize_t max_length, list group_ids,
                         bint drop_eagle_block, Py_ssize_t alignment_tokens):
        return FullAttentionManager._hits(self.block_pool, self.block_size, block_hashes, max_length, group_ids,
                                          drop_eagle_block, alignment_tokens)

    @classmethod
    def find_longest_cache_hit(cls, block_hashes, max_length, kv_cache_group_ids, block_pool,
                               kv_cache_spec, drop_eagle_block, alignment_tokens,
                               dcp_world_size=1, pcp_world_size=1):
        """Whole blocks left to right up to the first miss; with ``alignment_tokens``
        below the block size (fine-grained partial hits), then the longest hash
        boundary cached inside the next block.  EAGLE drops one block (one hash
        unit when fine-grained); the length is rounded down to the alignment.  Under
        decode context parallelism (``dcp_world_size > 1``) hashes are read at the
        sharded block's span, ``block_size * dcp_world_size``."""
        _check_world_sizes(dcp_world_size, pcp_world_size)
        cdef list group_ids = _check_hit_args(kv_cache_group_ids, block_pool, alignment_tokens)
        cdef Py_ssize_t block_size = kv_cache_spec.block_size
        if dcp_world_size > 1:
            block_size *= dcp_world_size
        return FullAttentionManager._hits(block_pool, block_size, block_hashes, max_length, group_ids,
                                          drop_eagle_block, alignment_tokens)

    @staticmethod
    cdef tuple _hits(BlockPool pool, Py_ssize_t block_size, object block_hashes, Py_ssize_t max_length,
                     list group_ids, bint drop_eagle_block, Py_ssize_t alignment_tokens):
        # find_longest_cache_hit: hits left to right up to the first miss.
        if alignment_tokens < block_size and block_size % alignment_tokens == 0:
            return _fine_full_hits(pool, block_size, block_hashes, max_length, group_ids, drop_eagle_block,
                                   alignment_tokens)
        hashes = _resolve(block_hashes, pool.hash_block_size, block_size)
        cdef Py_ssize_t n_groups = len(group_ids)
        cdef Py_ssize_t max_blocks = _num_searchable_blocks(hashes, max_length, block_size)
        cdef Py_ssize_t i, g, n, gid
        cdef list blocks0, cached
        cdef object blk
        cdef tuple computed
        cdef BlockHashToBlockMap cache
        cdef PyObject *hp
        cdef PyObject *bp
        if n_groups == 1:
            blocks0 = []
            gid = group_ids[0]
            if type(hashes) is list and 0 <= gid <= 0xFFFFFFFF:
                _hits_from_list(pool.cached_block_hash_to_block, <list>hashes, max_blocks, <uint32_t>gid, blocks0)
            else:
                for i in range(max_blocks):
                    blk = pool._get_one(hashes[i], gid)
                    if blk is None:
                        break
                    blocks0.append(blk)
            computed = (blocks0,)
        else:
            computed = tuple([[] for _ in range(n_groups)])
            for i in range(max_blocks):
                cached = pool.get_cached_block(hashes[i], group_ids)
                if cached is None:
                    break
                for g in range(n_groups):
                    (<list>computed[g]).append(cached[g])
        n = len(<list>computed[0])
        if drop_eagle_block and n > 0:
            for g in range(n_groups):
                (<list>computed[g]).pop()
            n -= 1
        while block_size != alignment_tokens and (n * block_size) % alignment_tokens != 0:
            for g in range(n_groups):
                (<list>computed[g]).pop()
            n -= 1
        return computed, n * block_size

    def get_num_common_prefix_blocks(self, running_request_id):
        blocks = self._req_to_blocks.get(running_request_id, [])
        num_requests = len(self._req_to_blocks)
        n = 0
        for block in blocks:
            if block.ref_cnt == num_requests:
                n += 1
            else:
                break
        return n


@cython.nonecheck(True)
cdef class SinkFullAttentionManager(FullAttentionManager):
    """Full attention with learned sink tokens (``SinkFullAttentionSpec``).

    Its decisions are full attention's: the sink tokens live outside the block
    table, so hits, skipped blocks and caching do not move.  As in vLLM, the
    sink must fill whole blocks (``AssertionError`` otherwise).
    """

    def __init__(self, kv_cache_spec, *args, **kwargs):
        super().__init__(kv_cache_spec, *args, **kwargs)
        sink_len = kv_cache_spec.sink_len
        assert sink_len is not None and sink_len > 0 and sink_len % self.block_size == 0, (
            f"SinkFullAttentionSpec.sink_len must be a positive multiple of the block size "
            f"({self.block_size}), got {sink_len!r}"
        )


@cython.nonecheck(True)
cdef class CrossAttentionManager(SingleTypeKVCacheManager):
    """Cross attention: a static allocation for the encoder tokens; never cached."""

    cdef tuple _find_hit(self, object block_hashes, Py_ssize_t max_length, list group_ids,
                         bint drop_eagle_block, Py_ssize_t alignment_tokens):
        raise ValueError("cross attention does not support prefix caching")

    @classmethod
    def find_longest_cache_hit(cls, block_hashes, max_length, kv_cache_group_ids, block_pool,
                               kv_cache_spec, drop_eagle_block, alignment_tokens,
                               dcp_world_size=1, pcp_world_size=1):
        _check_world_sizes(dcp_world_size, pcp_world_size)
        _check_hit_args(kv_cache_group_ids, block_pool, alignment_tokens)
        raise ValueError("cross attention does not support prefix caching")

    cpdef cache_blocks(self, request, Py_ssize_t num_tokens, object retention_interval=None,
                       object replay_boundaries=()):
        return None

    cdef int _check_cache_inputs(self, object request, str request_id, Py_ssize_t num_tokens, object hits,
                                 bint attaching, Py_ssize_t total_computed_tokens) except -1:
        return 0  # (never cached)
