# kv_cache_c/single_type_kv_cache_manager_mamba.pyx: MambaManager, with align mode and fine-grained partial hits, and
# the helpers it and the hybrid coordinator use (get_mamba_prefill_checkpoint_position,
# is_mamba_prefill_checkpoint_valid, partial_hash_hits_enabled, eagle_proof_margin).
# (vLLM: vllm/v1/core/single_type_kv_cache_manager.py, kv_cache_utils.py, kv_cache_interface.py.)
# Included into kvcy/_fast/_kv_cache_c.pyx (one extension module), not compiled on its own.
#
# The align-mode paths index the request's block list with bounds checks on (the build turns
# them off): its records (last_state_block_idx, ...) are readable dicts a caller may change.

from kvcy.kv_cache_interface import iter_layer_specs

_MAMBA_CACHING = "Mamba prefix caching requires mamba_cache_mode='align'"
_RELOCATE = "Speculative Mamba blocks must be exclusively owned and unhashed before relocation"
# A count of speculative blocks per request; block ids are 32-bit, so more than 2**31 can
# never be held, and block_size * num_speculative_blocks must not wrap in C.
_MAX_SPECULATIVE_BLOCKS = 2**31
_TOO_MANY_SPECULATIVE = "num_speculative_blocks must be below 2**31, got {}"


def get_mamba_prefill_checkpoint_position(num_tokens, hash_block_size, drop_eagle_block,
                                          num_hash_lookahead_tokens=0):
    """The last hash boundary of a ``num_tokens`` prefill whose Mamba state a later
    request can reuse: it leaves the tokens a hit must recompute (the last one, or
    the hash lookahead) or, with EAGLE, one hash block below the last boundary."""
    limit = num_tokens if drop_eagle_block else num_tokens - max(1, num_hash_lookahead_tokens)
    position = limit // hash_block_size * hash_block_size
    if drop_eagle_block:
        position -= hash_block_size
    return position if position > 0 else 0


cdef inline Py_ssize_t _checkpoint_position(Py_ssize_t num_tokens, Py_ssize_t hash_block_size,
                                            bint drop_eagle_block, Py_ssize_t lookahead) noexcept:
    # get_mamba_prefill_checkpoint_position for C counts (hash_block_size > 0).
    cdef Py_ssize_t limit = num_tokens if drop_eagle_block else num_tokens - (lookahead if lookahead > 1 else 1)
    cdef Py_ssize_t position = _floor_div(limit, hash_block_size) * hash_block_size
    if drop_eagle_block:
        position -= hash_block_size
    return position if position > 0 else 0


def is_mamba_prefill_checkpoint_valid(query_start, query_end, checkpoint_position, hash_block_size,
                                      mamba_block_size, checkpoint_alignment):
    """Whether a backend can write the state at ``checkpoint_position`` while it
    computes tokens ``[query_start, query_end)`` (None alignment: it never can)."""
    if checkpoint_alignment is None:
        return False
    assert checkpoint_alignment > 0
    initial_state_col = (query_start - 1) // mamba_block_size
    checkpoint_col = -(-query_end // mamba_block_size) - 2
    return (
        query_start % hash_block_size == 0
        and checkpoint_col > initial_state_col
        and query_start + hash_block_size <= checkpoint_position
        and query_start < checkpoint_position < query_end
        and (checkpoint_position - query_start) % checkpoint_alignment == 0
    )


def _dcp_block_span(spec, dcp_world_size):
    # Tokens one block of ``spec`` covers: dcp ranks each hold every dcp-th token.
    return spec.block_size * dcp_world_size if spec.dcp_sharded else spec.block_size


def partial_hash_hits_enabled(kv_cache_groups, hash_block_size, dcp_world_size=1, manager_classes=None):
    """Whether prefix hits may end inside a block: some Mamba layer is in align mode
    with blocks coarser than the hash block, and (given ``manager_classes``, one per
    group) every other prefix-cacheable group either looks up fine-grained or has
    blocks of the hash block's size.  Under decode context parallelism
    (``dcp_world_size > 1``) a sharded group's block spans ``block_size * dcp``
    tokens, and a Mamba block as large as the hash block already qualifies.
    """
    if not any(
        isinstance(spec, MambaSpec) and spec.mamba_cache_mode == "align"
        and (spec.block_size > hash_block_size if dcp_world_size == 1 else spec.block_size >= hash_block_size)
        for group in kv_cache_groups
        for spec in iter_layer_specs(group.kv_cache_spec)
    ):
        return False
    if manager_classes is None:
        return True
    return not any(
        group.kv_cache_spec.prefix_cacheable
        and not klass.supports_fine_grained_hash_lookup
        and _dcp_block_span(group.kv_cache_spec, dcp_world_size) != hash_block_size
        for group, klass in zip(kv_cache_groups, manager_classes)
    )


def eagle_proof_margin(block_size, hash_block_size, fine_grained_lookup):
    """How far past a candidate hit an EAGLE group looks before dropping: one hash
    block for a fine-grained lookup over coarser blocks, else one block."""
    if fine_grained_lookup and block_size > hash_block_size:
        return hash_block_size
    return block_size


cdef object _mamba_mask(Py_ssize_t start_block, Py_ssize_t end_block, Py_ssize_t alignment_tokens,
                        Py_ssize_t block_size, Py_ssize_t retention_interval, list boundaries):
    # MambaManager.reachable_block_mask under sparse retention: one state per
    # interval (none when 0), and the state ending at each boundary floored to
    # the alignment.
    cdef Py_ssize_t n = end_block - start_block if end_block > start_block else 0
    cdef list mask = [False] * n
    cdef Py_ssize_t per_segment, i, block
    if retention_interval:
        per_segment = retention_interval // block_size
        if per_segment <= 1:
            return None
        i = _floor_div(start_block + per_segment, per_segment) * per_segment - 1 - start_block
        while i < n:
            if i >= 0:
                mask[i] = True
            i += per_segment
    for boundary in boundaries:
        block = _floor_div(_floor_div(<Py_ssize_t>boundary, alignment_tokens) * alignment_tokens, block_size) - 1
        if start_block <= block < end_block:
            mask[block - start_block] = True
    return mask


@cython.nonecheck(True)
cdef class MambaManager(SingleTypeKVCacheManager):
    """Mamba: one recurrent state per request; in align mode, prefix caching of
    its states at block and hash-block boundaries.

    ``drop_eagle_checkpoint_block`` (set by the coordinator with EAGLE) puts the
    prefill checkpoints one hash block lower, where EAGLE's hits land.

    Raises:
        AssertionError: ``enable_caching`` with a mode other than "align"
            (vLLM's assertion, raised even under ``python -O``).
    """

    supports_fine_grained_hash_lookup = True

    def __init__(self, kv_cache_spec, *args, **kwargs):
        super().__init__(kv_cache_spec, *args, **kwargs)
        mode = getattr(kv_cache_spec, "mamba_cache_mode", "none")
        if mode != "align" and self.enable_caching:
            raise AssertionError(_MAMBA_CACHING)
        self.mamba_cache_mode = mode
        self._align = mode == "align"
        num_speculative_blocks = int(getattr(kv_cache_spec, "num_speculative_blocks", 0))
        if num_speculative_blocks >= _MAX_SPECULATIVE_BLOCKS:  # (before C arithmetic wraps on it)
            raise ValueError(_TOO_MANY_SPECULATIVE.format(num_speculative_blocks))
        self.num_speculative_blocks = num_speculative_blocks
        self.has_prefill_checkpoint_blocks = self._align and kv_cache_spec.num_prefill_checkpoint_blocks > 0
        self.drop_eagle_checkpoint_block = False
        self.cached_blocks_this_step = set()
        self.last_state_block_idx = {}
        self._num_retired_blocks = {}
        self._allocated_reqs = set()
        self._checkpoint_at = {}
        self._producer_partial_tail_reqs = {}

    @property
    def _checkpoints(self):
        """Read-only view of the prefill checkpoint each request reserved, by request id:
        ``(position, block index)`` (vLLM's tests read it)."""
        return MappingProxyType(self._checkpoint_at)

    @property
    def _allocated_block_reqs(self):
        """The requests that have allocated their running blocks (a frozen copy: vLLM's tests read it)."""
        return frozenset(self._allocated_reqs)

    @property
    def has_positionally_stable_blocks(self):
        """False in align mode (states in between are nulled, speculative blocks move)."""
        return not self._align

    # -------------------------------------------------------------- lookup
    cdef tuple _find_hit(self, object block_hashes, Py_ssize_t max_length, list group_ids,
                         bint drop_eagle_block, Py_ssize_t alignment_tokens):
        return _mamba_hits(self.block_pool, self.block_size, block_hashes, max_length, group_ids,
                           alignment_tokens)

    @classmethod
    def find_longest_cache_hit(cls, block_hashes, max_length, kv_cache_group_ids, block_pool,
                               kv_cache_spec, drop_eagle_block, alignment_tokens,
                               dcp_world_size=1, pcp_world_size=1):
        """The last cached state whose end is a multiple of ``alignment_tokens``, null
        blocks before it.  With ``alignment_tokens`` below the block size (partial
        hits), the state at the last cached hash boundary, which may end inside its
        block.  Mamba hits are never shortened for EAGLE (draft models have no
        Mamba layers)."""
        _check_world_sizes(dcp_world_size, pcp_world_size)
        if dcp_world_size != 1:  # (vLLM's assertions, raised even under python -O)
            raise AssertionError("DCP not support mamba now.")
        if pcp_world_size != 1:
            raise AssertionError("PCP not support mamba now.")
        cdef list group_ids = _check_hit_args(kv_cache_group_ids, block_pool, alignment_tokens)
        return _mamba_hits(block_pool, kv_cache_spec.block_size, block_hashes, max_length, group_ids,
                           alignment_tokens)

    @classmethod
    def reachable_block_mask(cls, start_block, end_block, alignment_tokens, kv_cache_spec, use_eagle,
                             retention_interval=None, reachable_boundaries=(), dcp_world_size=1,
                             final_segment_end_block=None):
        """Which state blocks of ``[start_block, end_block)`` to cache: all (None) under
        dense retention; under sparse retention one per ``retention_interval`` (none for
        0) and the state ending at each of ``reachable_boundaries`` (floored to
        ``alignment_tokens``)."""
        retention_interval, boundaries, _ = _check_mask_args(
            retention_interval, reachable_boundaries, dcp_world_size, final_segment_end_block
        )
        if retention_interval is None or alignment_tokens is None:
            return None
        assert isinstance(kv_cache_spec, MambaSpec)
        if _check_count("alignment_tokens", alignment_tokens) == 0:
            raise ValueError("alignment_tokens must be positive, got 0")
        return _mamba_mask(_check_int_arg("start_block", start_block), _check_int_arg("end_block", end_block),
                           alignment_tokens, kv_cache_spec.block_size, retention_interval, boundaries)

    cdef object _sparse_reachable(self, Py_ssize_t start_block, Py_ssize_t end_block,
                                  Py_ssize_t retention_interval, list boundaries):
        return _mamba_mask(start_block, end_block, self._alignment, self.block_size, retention_interval, boundaries)

    # -------------------------------------------------------------- counting
    cpdef Py_ssize_t get_num_skipped_tokens(self, Py_ssize_t num_computed_tokens):
        return num_computed_tokens - 1 if num_computed_tokens > 1 else 0

    @cython.boundscheck(True)
    @cython.wraparound(True)
    cdef bint _needs_internal_checkpoint(self, str request_id, Py_ssize_t query_start, Py_ssize_t query_end,
                                         Py_ssize_t checkpoint_position, Py_ssize_t prefill_end) except -1:
        # Whether this chunk reserves a block for the prefill checkpoint the backend writes.
        if not self.has_prefill_checkpoint_blocks or query_end < prefill_end:
            return False
        if not is_mamba_prefill_checkpoint_valid(
                query_start, query_end, checkpoint_position, self.block_pool.hash_block_size, self.block_size,
                self.kv_cache_spec.prefill_checkpoint_alignment):
            return False
        cdef Py_ssize_t checkpoint_idx = _cdiv(query_end, self.block_size) - 2
        if checkpoint_idx < 0:
            return False
        blocks = self._req_to_blocks.get(request_id, ())
        return (checkpoint_idx >= len(blocks) or blocks[checkpoint_idx].is_null
                or (request_id in self._allocated_reqs
                    and checkpoint_idx >= len(blocks) - self.num_speculative_blocks))

    cpdef Py_ssize_t get_num_blocks_to_allocate(
        self, str request_id, Py_ssize_t num_tokens, object new_computed_blocks,
        Py_ssize_t total_computed_tokens, Py_ssize_t num_local_computed_tokens,
        Py_ssize_t num_tokens_main_model, bint apply_admission_cap=False, Py_ssize_t prefill_end=0,
    ) except? -1:
        """Blocks to take from the free pool; more than the pool has when the hit's
        state was cached this step (so the request waits for the next one).

        In align mode the state blocks this step needs (the running state, the
        speculative ones, a partial hit's copy and a prefill checkpoint), which
        may be negative when earlier steps allocated more.  Records the
        allocation's checkpoint (unless ``apply_admission_cap``).
        """
        cdef Py_ssize_t n_hits = len(new_computed_blocks)
        cdef object last
        if n_hits:
            last = new_computed_blocks[n_hits - 1]
            if not isinstance(last, KVCacheBlock):
                raise TypeError(f"blocks must be KVCacheBlock, got {type(last).__name__}")
            if (<KVCacheBlock>last)._hash is not None and last.block_hash in self.cached_blocks_this_step:
                return self.block_pool.num_gpu_blocks + 1
        if not self._align:
            if self.num_speculative_blocks > 0:
                num_tokens += self.block_size * self.num_speculative_blocks
            return SingleTypeKVCacheManager.get_num_blocks_to_allocate(
                self, request_id, num_tokens, new_computed_blocks, total_computed_tokens, num_local_computed_tokens,
                num_tokens_main_model, apply_admission_cap, prefill_end,
            )
        # (draft models have no Mamba layers: the lookahead tokens get no state)
        num_tokens = num_tokens_main_model
        cdef Py_ssize_t nspec = self.num_speculative_blocks
        cdef Py_ssize_t n_evictable = 0
        _check_hit_blocks(new_computed_blocks, &n_evictable,
                          self.block_pool.free_block_queue if self.enable_caching else None, None)
        held = self._req_to_blocks.get(request_id, ())
        cdef Py_ssize_t num_new = _cdiv(num_tokens, self.block_size) + nspec - n_hits - len(held)
        cdef bint has_partial_hit = ((n_hits > 0 and num_local_computed_tokens % self.block_size != 0)
                                     or request_id in self._partial_hit_reqs)
        if has_partial_hit:
            num_new = (num_new if num_new > 0 else 0) + 1
        cdef Py_ssize_t position = _checkpoint_position(
            num_tokens, self._alignment, self.drop_eagle_checkpoint_block, self.block_pool.num_hash_lookahead_tokens)
        if not self._needs_internal_checkpoint(request_id, total_computed_tokens, num_tokens, position, prefill_end):
            position = 0
        if not apply_admission_cap:
            if position > 0:
                self._checkpoint_at[request_id] = (position, _cdiv(num_tokens, self.block_size) - 2)
            else:
                self._checkpoint_at.pop(request_id, None)
        cdef Py_ssize_t cap
        if num_new > 0:
            cap = 1 + has_partial_hit + (position > 0)
            if request_id not in self._allocated_reqs:
                cap += nspec
            if cap < num_new:
                num_new = cap
        return num_new + n_evictable

    # -------------------------------------------------------------- allocation
    cpdef list allocate_new_blocks(self, str request_id, Py_ssize_t num_tokens, Py_ssize_t num_tokens_main_model):
        """The state blocks this step needs; in align mode the returned list also holds
        the null blocks and moved speculative blocks appended to the table, a
        partial hit's copy first when the request takes it now."""
        cdef list out = self._allocate_new_blocks(request_id, num_tokens, num_tokens_main_model)
        return [] if out is None else out

    @cython.boundscheck(True)
    @cython.wraparound(True)
    cdef list _allocate_new_blocks(self, str request_id, Py_ssize_t num_tokens, Py_ssize_t num_tokens_main_model):
        # allocate_new_blocks (None: nothing new).  In align mode the list also holds
        # the null blocks and moved speculative blocks appended to the table, a
        # partial hit's copy first when the request takes it now.
        if not self._align:
            if self.num_speculative_blocks > 0:
                num_tokens += self.block_size * self.num_speculative_blocks
            return SingleTypeKVCacheManager._allocate_new_blocks(self, request_id, num_tokens, num_tokens_main_model)
        cdef Py_ssize_t nspec = self.num_speculative_blocks
        cdef list req_blocks = self._req_to_blocks.get(request_id)
        if req_blocks is None:
            self._gen.value = _next_gen()
            req_blocks = []
            self._req_to_blocks[request_id] = req_blocks
        cdef Py_ssize_t num_required = _cdiv(num_tokens_main_model, self.block_size) + nspec
        cdef bint checkpoint_block = request_id in self._checkpoint_at
        partial = self._partial_hit_reqs.get(request_id)
        if num_required <= len(req_blocks) and partial is None and not checkpoint_block:
            self._allocated_reqs.add(request_id)
            return None
        self._gen.value = _next_gen()
        cdef Py_ssize_t prev_len = len(req_blocks)
        cdef bint allocated = request_id in self._allocated_reqs
        if allocated:  # (the running state sits before the speculative blocks)
            self.last_state_block_idx[request_id] = prev_len - 1 - nspec
        elif prev_len > 0:  # (a hit: its last block holds the state)
            self.last_state_block_idx[request_id] = prev_len - 1
        cdef Py_ssize_t num_skipped = num_required - nspec - 1
        cdef KVCacheBlock null = self._null_block
        if prev_len < num_skipped - checkpoint_block:  # (states in between are nulls; not the checkpoint's slot)
            req_blocks.extend([null] * (num_skipped - checkpoint_block - prev_len))
        cdef Py_ssize_t block_idx
        if allocated:
            for block_idx in range(prev_len - nspec, prev_len):
                if block_idx >= num_skipped - checkpoint_block:
                    break
                self._relocate_speculative_block_impl(req_blocks, block_idx)
        cdef Py_ssize_t num_new = num_required - len(req_blocks)
        if num_new < 0:
            num_new = 0
        if partial is not None:
            num_new += 1
        cdef Py_ssize_t max_new = 1 + (partial is not None) + checkpoint_block + (0 if allocated else nspec)
        if num_new > max_new:
            raise AssertionError(f"Mamba align mode allocates at most {max_new} blocks a step, asked for {num_new}")
        cdef list new_blocks = self.block_pool._get_new_blocks(num_new)
        cdef list returned = req_blocks[prev_len:]
        cdef KVCacheBlock cow, source
        if partial is not None:
            block_idx = partial[0]
            source = partial[1]
            cow = new_blocks[0]
            new_blocks = new_blocks[1:]
            if allocated:
                # A running request's table only grows: it stays on the source, whose
                # entries move to the copy (filled by this step's copy before the source
                # is written), so hits on them wait for the next step.
                assert req_blocks[block_idx] is source
                self.block_pool.move_block_hashes(source, cow)
                self._pending_cow_copies.append((source, cow))
                source._ref_cnt += 1
                tail = self._producer_partial_tail_reqs.pop(request_id, None)
                if tail is not None:
                    assert tail[0] is source
                    self._pending_boundary_state_offloads.append((request_id, self.kv_cache_group_id, cow, tail[1]))
                if cow._hash is not None:
                    self.cached_blocks_this_step.add(cow.block_hash)
            else:
                self._apply_cow(request_id, block_idx, source, cow)
                returned.insert(0, cow)
        req_blocks.extend(new_blocks)
        self._allocated_reqs.add(request_id)
        self._partial_hit_reqs.pop(request_id, None)
        returned.extend(new_blocks)
        return returned

    @cython.boundscheck(True)
    @cython.wraparound(True)
    def _relocate_speculative_block(self, list req_blocks not None, Py_ssize_t block_idx):
        """Move the speculative block at ``block_idx`` of ``req_blocks`` to the end, leaving
        the null block in its place (AssertionError when another request shares it)."""
        if block_idx < 0:
            block_idx += len(req_blocks)
        if not 0 <= block_idx < len(req_blocks):
            raise IndexError("list index out of range")
        self._relocate_speculative_block_impl(req_blocks, block_idx)

    cdef int _relocate_speculative_block_impl(self, list req_blocks, Py_ssize_t block_idx) except -1:
        # A speculative block this step leaves behind moves to the table's end.
        block = req_blocks[block_idx]
        if not self.block_pool.is_block_writable(block):
            raise AssertionError(_RELOCATE)
        req_blocks.append(block)
        req_blocks[block_idx] = self._null_block
        return 0

    # -------------------------------------------------------------- freeing
    @cython.boundscheck(True)
    @cython.wraparound(True)
    cdef int _remove_blocks_in_range(self, str request_id, Py_ssize_t first_block, Py_ssize_t last_block) except -1:
        if not self._align:
            return SingleTypeKVCacheManager._remove_blocks_in_range(self, request_id, first_block, last_block)
        cdef PyObject* p = PyDict_GetItem(self._req_to_blocks, request_id)
        if p == NULL:
            return 0
        cdef list blocks = _held_list(p)
        cdef Py_ssize_t retired = self._num_retired_blocks.get(request_id, 0)
        if first_block < retired:
            first_block = retired
        if last_block > len(blocks):
            last_block = len(blocks)
        if first_block >= last_block:
            return 0
        cdef KVCacheBlock null = self._null_block
        cdef list freed = []
        cdef Py_ssize_t i
        for i in range(last_block - 1, first_block - 1, -1):  # (prefill leaves null gaps: skip them)
            if blocks[i] is not null:
                freed.append(blocks[i])
                blocks[i] = null
        if freed:
            self.block_pool._free_blocks(freed)
        self._num_retired_blocks[request_id] = last_block
        return 0

    @cython.boundscheck(True)
    @cython.wraparound(True)
    cpdef remove_skipped_blocks(self, str request_id, Py_ssize_t processed_computed_tokens,
                                object num_prompt_tokens=None):
        """Free the states before the last computed token; in align mode also the
        state block of two steps ago (the previous step's was copied from it)."""
        SingleTypeKVCacheManager.remove_skipped_blocks(self, request_id, processed_computed_tokens, num_prompt_tokens)
        if not self._align:
            return
        idx = self.last_state_block_idx.get(request_id)
        if idx is not None and idx < _cdiv(processed_computed_tokens, self.block_size) - 1:
            blocks = self._req_to_blocks[request_id]
            block = blocks[idx]
            if block is not self._null_block:
                self.block_pool._free_blocks([block])
                blocks[idx] = self._null_block

    cdef int _forget(self, str request_id) except -1:
        # The align-mode records of a request whose blocks go back now (its boundary
        # states not yet handed off go too).
        self._allocated_reqs.discard(request_id)
        self.last_state_block_idx.pop(request_id, None)
        self._num_retired_blocks.pop(request_id, None)
        self._checkpoint_at.pop(request_id, None)
        self._producer_partial_tail_reqs.pop(request_id, None)
        if self._pending_boundary_state_offloads:
            self._pending_boundary_state_offloads = [
                e for e in self._pending_boundary_state_offloads if e[0] != request_id
            ]
        return 0

    cpdef list pop_blocks_for_free(self, str request_id):
        if self._align:
            self._forget(request_id)
        return SingleTypeKVCacheManager.pop_blocks_for_free(self, request_id)

    cdef bint _free_held(self, str request_id) except -1:
        if self._align:
            self._forget(request_id)
        return SingleTypeKVCacheManager._free_held(self, request_id)

    def finalize_partial_tail_offload(self, request_id, num_computed_tokens, num_in_flight_tokens):
        """A finishing request's own prompt-boundary partial tail, (group id, block,
        boundary tokens), if no later token was computed into its block; else None."""
        if not self._align:
            return None
        tail = self._producer_partial_tail_reqs.pop(request_id, None)
        if tail is None:
            return None
        block, boundary = tail
        if num_in_flight_tokens != 0 or num_computed_tokens != boundary:
            return None
        return self.kv_cache_group_id, block, boundary

    # -------------------------------------------------------------- caching
    @cython.boundscheck(True)
    @cython.wraparound(True)
    cpdef cache_blocks(self, request, Py_ssize_t num_tokens, object retention_interval=None,
                       object replay_boundaries=()):
        """Cache the request's state blocks (see ``SingleTypeKVCacheManager.cache_blocks``);
        in align mode also the state at this step's prefill checkpoint or at the
        prompt's last reusable hash boundary (a partial entry when it ends inside its
        block).  What is cached is remembered for this step (hits on it wait), and in
        align mode queued for a connector (``take_pending_boundary_state_offloads``)."""
        cdef str request_id = _rid(request)
        cdef Py_ssize_t before = self._num_cached_block.get(request_id, 0)
        SingleTypeKVCacheManager.cache_blocks(self, request, num_tokens, retention_interval, replay_boundaries)
        cdef Py_ssize_t after = self._num_cached_block.get(request_id, 0)
        if self._align:
            key = self._cache_partial_tail_block_impl(request, num_tokens, retention_interval)
            if key is not None:
                self.cached_blocks_this_step.add(key)
        cdef Py_ssize_t idx
        cdef KVCacheBlock block
        if after > before:
            blocks = self._req_to_blocks[request_id]
            for idx in range(before, after):
                block = blocks[idx]
                if block.is_null or block._hash is None:
                    continue
                self.cached_blocks_this_step.add(block.block_hash)
                if self._align:
                    assert block._num_tokens >= 0
                    self._pending_boundary_state_offloads.append(
                        (request_id, self.kv_cache_group_id, block, block._num_tokens)
                    )

    def _cache_partial_tail_block(self, request, Py_ssize_t num_tokens, retention_interval):
        """Cache the state this step leaves at a hash boundary (align mode); its key, or None."""
        return self._cache_partial_tail_block_impl(request, num_tokens, retention_interval)

    @cython.boundscheck(True)
    @cython.wraparound(True)
    cdef object _cache_partial_tail_block_impl(self, object request, Py_ssize_t num_tokens, object retention_interval):
        # The state this step leaves at a hash boundary, as a cache entry: this
        # allocation's checkpoint (re-keyed at its position, or dropped when no
        # hit can reach it), else the prompt's last reusable hash boundary (or,
        # with shared-prefix checkpoints, its junction).  The entry's key, or None.
        cdef BlockPool pool = self.block_pool
        cdef str request_id = _rid(request)
        cdef Py_ssize_t position, idx, block_idx, boundary
        cdef KVCacheBlock block
        checkpoint = self._checkpoint_at.get(request_id)
        if checkpoint is not None:
            position, idx = checkpoint
            blocks = self._req_to_blocks[request_id]
            assert 0 <= idx < len(blocks)
            block = blocks[idx]
            is_prompt_checkpoint = position == _checkpoint_position(
                request.num_prompt_tokens, self._alignment, self.drop_eagle_checkpoint_block,
                pool.num_hash_lookahead_tokens,
            )
            retained = False
            if position % self.block_size == 0:
                block_idx = position // self.block_size - 1
                mask = (None if retention_interval is None else
                        _mamba_mask(block_idx, block_idx + 1, self._alignment, self.block_size,
                                    _check_count("retention_interval", retention_interval), []))
                retained = mask is None or mask[0]
            if not is_prompt_checkpoint and not retained and position != _shared_prefix_boundary(request):
                if pool.metrics_collector:  # (a transient state: its slot is overwritten)
                    pool.metrics_collector.on_block_evicted(block)
                _evict(pool, block)
                return None
            if block._num_tokens == position:
                return None
            return pool.cache_partial_block(request, block, position, self.kv_cache_group_id, self.block_size,
                                            True)
        if num_tokens <= 0 or num_tokens % pool.hash_block_size != 0:
            return None
        boundary = _checkpoint_position(request.num_prompt_tokens, pool.hash_block_size,
                                        self.drop_eagle_checkpoint_block, pool.num_hash_lookahead_tokens)
        if num_tokens != boundary and not (
            self.shared_prefix_checkpoint
            and num_tokens == _shared_prefix_boundary(request)
            and request.num_computed_tokens < num_tokens <= request.num_prompt_tokens
        ):
            return None
        block_idx = _cdiv(num_tokens, self.block_size) - 1
        blocks = self._req_to_blocks[request_id]
        if block_idx >= len(blocks):
            return None
        block = blocks[block_idx]
        if block.is_null or block._num_tokens == num_tokens:
            return None
        key = pool.cache_partial_block(request, block, num_tokens, self.kv_cache_group_id, self.block_size)
        if key is not None and num_tokens % self.block_size:
            # This request made the entry; its next step overwrites the state, so
            # it copies it first (allocate_new_blocks) and hands the copy off.
            self._gen.value = _next_gen()
            self._partial_hit_reqs[request_id] = (block_idx, block)
            self._num_cached_block[request_id] = block_idx
            self._producer_partial_tail_reqs[request_id] = (block, num_tokens)
        return key

    def new_step_starts(self):
        """A new scheduler step: states cached in earlier steps may now be hit."""
        self.cached_blocks_this_step.clear()


@cython.boundscheck(True)
@cython.wraparound(True)
cdef tuple _mamba_hits(BlockPool pool, Py_ssize_t block_size, object block_hashes, Py_ssize_t max_length,
                       list group_ids, Py_ssize_t alignment_tokens):
    # MambaManager.find_longest_cache_hit: the last aligned hit only (null blocks before it).
    cdef Py_ssize_t n_groups = len(group_ids), i, g, scale, block_idx, n
    cdef KVCacheBlock null = pool.null_block
    cdef tuple computed = tuple([[] for _ in range(n_groups)])
    cdef object cached
    if alignment_tokens < block_size and block_size % alignment_tokens == 0:
        scale = block_size // alignment_tokens
        n = min(max_length // alignment_tokens, len(block_hashes))
        for i in range(n - 1, -1, -1):
            cached = pool.get_cached_block(block_hashes[i], group_ids)
            if cached is not None:
                block_idx = i // scale
                for g in range(n_groups):
                    (<list>computed[g]).extend([null] * block_idx)
                    (<list>computed[g]).append(cached[g])
                return computed, (i + 1) * alignment_tokens
        return computed, 0
    hashes = _resolve(block_hashes, pool.hash_block_size, block_size)
    cdef Py_ssize_t max_blocks = _num_searchable_blocks(hashes, max_length, block_size)
    for i in range(max_blocks - 1, -1, -1):
        if ((i + 1) * block_size) % alignment_tokens != 0:
            continue
        cached = pool.get_cached_block(hashes[i], group_ids)
        if cached is not None:
            for g in range(n_groups):
                (<list>computed[g]).extend([null] * i)
                (<list>computed[g]).append(cached[g])
            return computed, (i + 1) * block_size
    return computed, 0
