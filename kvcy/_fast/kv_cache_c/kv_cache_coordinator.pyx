# kv_cache_c/kv_cache_coordinator.pyx: KVCacheCoordinator and its three kinds (no prefix cache, one group,
# hybrid), and get_kv_cache_coordinator.  (vLLM: vllm/v1/core/kv_cache_coordinator.py.)
# Included into kvcy/_fast/_kv_cache_c.pyx (one extension module), not compiled on its own.

cdef inline int _check_group_count(tuple per_group, Py_ssize_t n) except -1:
    # A coordinator's per-group argument has one entry per group (it is
    # indexed without bounds checks).
    if per_group is None:
        raise TypeError("expected a tuple with one sequence of blocks per KV-cache group, got None")
    if PyTuple_GET_SIZE(per_group) != n:
        raise ValueError(f"expected one sequence of blocks per KV-cache group ({n}), got {PyTuple_GET_SIZE(per_group)}")
    return 0


def _validate_prefix_cache_retention_interval(retention_interval, scheduler_block_size, kv_cache_config):
    # vLLM's check of KVCacheConfig.prefix_cache_retention_interval (ValueError), with a
    # TypeError first for what is not an int.
    if retention_interval is None:
        return
    if isinstance(retention_interval, bool) or not isinstance(retention_interval, int):
        raise TypeError(
            "prefix_cache_retention_interval must be an int or None, "
            f"got {type(retention_interval).__name__}: {retention_interval!r}"
        )
    if not any(isinstance(g.kv_cache_spec, (SlidingWindowSpec, MambaSpec)) for g in kv_cache_config.kv_cache_groups):
        if retention_interval == 0:
            return
        raise ValueError(
            "prefix_cache_retention_interval is set but this model has no sliding-window or Mamba KV cache "
            "group, so retention has no effect. Set it to 0 (it only applies to sliding-window and Mamba "
            "attention)."
        )
    if retention_interval < 0 or retention_interval % scheduler_block_size != 0:
        raise ValueError(
            f"prefix_cache_retention_interval ({retention_interval}) must be non-negative and a multiple of "
            f"scheduler_block_size ({scheduler_block_size})."
        )
    if retention_interval > 2**62:
        raise ValueError(f"prefix_cache_retention_interval is too large: {retention_interval}")


def replay_boundaries(num_prompt_tokens, scheduler_block_size, use_eagle):
    """Token positions a later request replaying a prompt of ``num_prompt_tokens`` can resume at.

    Without EAGLE, ``num_prompt_tokens - 1`` (a resend recomputes its last token).  With
    EAGLE, one scheduler block below both the resend's aligned hit and a longer sibling's
    (the last aligned block of the prompt), at least 0; the two differ only for a
    block-aligned prompt.
    """
    if not use_eagle:
        return (num_prompt_tokens - 1,)
    block = scheduler_block_size
    resend = (num_prompt_tokens - 1) // block * block
    extension = num_prompt_tokens // block * block
    return tuple(sorted({max(resend - block, 0), max(extension - block, 0)}))


@cython.nonecheck(True)
cdef class KVCacheCoordinator:
    """Drives the single-type managers of all KV-cache groups over one block pool.

    ``num_prefill_lookahead`` (multi-module MTP: the drafter re-prefills that
    many tokens less one) keeps the last ``num_reprefillable_tokens`` computed
    tokens out of the prefix cache; ``num_hash_lookahead_tokens`` goes to the
    block pool's events.

    ``retention_interval`` is the config's ``prefix_cache_retention_interval``
    (validated as vLLM does): None caches every reachable block, 0 or a
    multiple of the scheduler block makes sliding-window groups keep sparse
    replay checkpoints (see ``SlidingWindowManager.reachable_block_mask``).

    With ``use_eagle``, Mamba groups put their prefill checkpoints where
    EAGLE's hits land (``drop_eagle_checkpoint_block``).

    Raises:
        AssertionError: prefix caching with a Mamba group not in align mode
            (vLLM's, from ``MambaManager``).
    """

    def __cinit__(self, *args, **kwargs):
        # (refused by __new__ alone: see _no_arguments)
        if not args and not kwargs:
            raise TypeError(_no_arguments(type(self)))
        # divisors of an object whose __init__ never ran (a subclass may skip it) are 1,
        # never 0: the C code divides unchecked (cdivision); its None fields raise (nonecheck)
        self.scheduler_block_size = 1
        self.hash_block_size = 1

    def __init__(self, kv_cache_config, max_model_len, max_in_flight_tokens, use_eagle, enable_caching,
                 enable_kv_cache_events, dcp_world_size, pcp_world_size, scheduler_block_size, hash_block_size,
                 metrics_collector=None, num_prefill_lookahead=0, num_hash_lookahead_tokens=0,
                 use_int_block_hashes=None):
        _check_world_sizes(dcp_world_size, pcp_world_size)
        self.dcp_world_size = dcp_world_size
        self.pcp_world_size = pcp_world_size
        num_prefill_lookahead = _lookahead_count("num_prefill_lookahead", num_prefill_lookahead)
        groups = kv_cache_config.kv_cache_groups
        check_no_hisparse_groups(groups)
        if scheduler_block_size % hash_block_size != 0 or any(
            scheduler_block_size % g.kv_cache_spec.block_size != 0 for g in groups
        ):
            raise AssertionError(
                f"scheduler_block_size ({scheduler_block_size}) must be a multiple of "
                f"hash_block_size ({hash_block_size}) and of every group's block size "
                f"({[g.kv_cache_spec.block_size for g in groups]})"
            )
        self.kv_cache_config = kv_cache_config
        self.max_model_len = max_model_len
        self.enable_caching = enable_caching
        self.scheduler_block_size = scheduler_block_size
        self.hash_block_size = hash_block_size
        eagle_ids = {i for i, g in enumerate(groups) if getattr(g, "is_eagle_group", False)}
        if use_eagle and not eagle_ids:
            eagle_ids = set(range(len(groups)))
        if enable_caching and eagle_ids and scheduler_block_size < num_prefill_lookahead:
            # (the EAGLE drop excludes one scheduler block: the re-prefilled tokens must fit in it)
            raise ValueError(
                f"Multi-module MTP with prefix caching requires scheduler_block_size (={scheduler_block_size}) "
                f">= num_speculative_tokens (={num_prefill_lookahead})."
            )
        self.block_pool = BlockPool(
            kv_cache_config.num_blocks, enable_caching, hash_block_size, enable_kv_cache_events,
            metrics_collector, num_hash_lookahead_tokens, use_int_block_hashes=use_int_block_hashes,
        )
        self.eagle_group_ids = eagle_ids
        # The groups whose hits drop the EAGLE block: flagged groups drop it only with use_eagle.
        self.drop_eagle_group_ids = eagle_ids if use_eagle else set()
        self.num_reprefillable_tokens = max(0, num_prefill_lookahead - 1)
        # Fine-grained (sub-block) hits: only the hybrid coordinator turns them on.
        self.enable_partial_hash_hits = False
        needs_zeroing = kv_cache_config.needs_kv_cache_zeroing
        self.single_type_managers = tuple(
            get_manager_for_kv_cache_spec(
                g.kv_cache_spec, max_in_flight_tokens, max_model_len, block_pool=self.block_pool,
                enable_caching=enable_caching, kv_cache_group_id=i, scheduler_block_size=scheduler_block_size,
                needs_kv_cache_zeroing=needs_zeroing, dcp_world_size=dcp_world_size,
                pcp_world_size=pcp_world_size,
            )
            for i, g in enumerate(groups)
        )
        self._cross_attention = tuple(isinstance(m, CrossAttentionManager) for m in self.single_type_managers)
        self._n_managers = len(self.single_type_managers)
        self._any_cross = any(self._cross_attention)
        if use_eagle:
            for manager in self.single_type_managers:
                if isinstance(manager, MambaManager):
                    (<MambaManager>manager).drop_eagle_checkpoint_block = True
        self._set_retention_interval(kv_cache_config.prefix_cache_retention_interval)

    def _set_retention_interval(self, retention_interval):
        _validate_prefix_cache_retention_interval(retention_interval, self.scheduler_block_size, self.kv_cache_config)
        # None: dense; 0: only the replay boundaries; > 0: one checkpoint per interval.
        self._retention_interval = retention_interval
        # What cache_blocks acts on: only sliding-window and Mamba align masks are
        # sparse (the other managers' masks are None whatever the interval), so
        # without such a group the interval changes nothing and the request's
        # shared_prefix_boundary is not read.
        self._retention = -1 if retention_interval is None or not any(
            isinstance(m, SlidingWindowManager) or (isinstance(m, MambaManager) and (<MambaManager>m)._align)
            for m in self.single_type_managers
        ) else retention_interval

    @property
    def retention_interval(self):
        """The config's ``prefix_cache_retention_interval``: None (dense), 0 (only the replay
        boundaries) or a positive multiple of the scheduler block.  Assignable, as on vLLM's
        coordinator (its tests set it on a live manager), and checked as the config's value
        is (TypeError / ValueError, nothing changed)."""
        return self._retention_interval

    @retention_interval.setter
    def retention_interval(self, value):
        self._set_retention_interval(value)

    @retention_interval.deleter
    def retention_interval(self):
        raise AttributeError(f"attribute 'retention_interval' of '{type(self).__name__}' objects is not writable")

    cpdef Py_ssize_t get_num_blocks_to_allocate(
        self, str request_id, Py_ssize_t num_tokens, tuple new_computed_blocks, Py_ssize_t num_encoder_tokens,
        Py_ssize_t total_computed_tokens, Py_ssize_t num_local_computed_tokens,
        Py_ssize_t num_tokens_main_model, bint apply_admission_cap=False, Py_ssize_t prefill_end=0,
    ) except? -1:
        """Blocks all groups must take from the free pool.  ``prefill_end`` (where the
        request's prefill ends) matters only when the retention interval is 0: Mamba
        then reserves a prefill checkpoint only for the chunk reaching it."""
        if self._retention_interval is None or self._retention_interval != 0:
            prefill_end = 0
        cdef Py_ssize_t total = 0, i
        cdef SingleTypeKVCacheManager manager
        _check_group_count(new_computed_blocks, self._n_managers)
        for i in range(self._n_managers):
            manager = <SingleTypeKVCacheManager>self.single_type_managers[i]
            if self._any_cross and self._cross_attention[i]:
                total += manager.get_num_blocks_to_allocate(
                    request_id, num_encoder_tokens, (), 0, 0, num_encoder_tokens, apply_admission_cap
                )
            else:
                total += manager.get_num_blocks_to_allocate(
                    request_id, num_tokens, new_computed_blocks[i], total_computed_tokens,
                    num_local_computed_tokens, num_tokens_main_model, apply_admission_cap, prefill_end,
                )
        return total

    cpdef allocate_new_computed_blocks(self, str request_id, tuple new_computed_blocks,
                                       Py_ssize_t num_local_computed_tokens,
                                       Py_ssize_t num_external_computed_tokens,
                                       tuple skip_zeroing_group_ids=()):
        """Attach each group's prefix-cache hits (and external-token blocks) to a new request.

        The external-token blocks of the groups in ``skip_zeroing_group_ids``
        (an async load writes them) are not reported for zeroing.

        Raises:
            TypeError / RuntimeError: as SingleTypeKVCacheManager.add_local_computed_blocks
            (nothing changes: every group's hits are checked first).
            AssertionError: the request already holds blocks and a group has
            hits for it, as in vLLM (nothing changes).
        """
        cdef SingleTypeKVCacheManager manager
        cdef Py_ssize_t i
        _check_group_count(new_computed_blocks, self._n_managers)
        for i in range(self._n_managers):
            (<SingleTypeKVCacheManager>self.single_type_managers[i])._checked_hits(
                new_computed_blocks[i], num_local_computed_tokens + num_external_computed_tokens)
        for manager in self.single_type_managers:
            if request_id in manager._num_cached_block:
                for blocks in new_computed_blocks:
                    if len(blocks):
                        raise AssertionError(
                            f"request {request_id!r} already holds blocks; it cannot take new prefix-cache hits"
                        )
                return
        for i in range(self._n_managers):
            manager = <SingleTypeKVCacheManager>self.single_type_managers[i]
            manager.add_local_computed_blocks(
                request_id, new_computed_blocks[i], num_local_computed_tokens, num_external_computed_tokens
            )
        if num_external_computed_tokens > 0:
            for i in range(self._n_managers):
                manager = <SingleTypeKVCacheManager>self.single_type_managers[i]
                manager.allocate_external_computed_blocks(
                    request_id, num_local_computed_tokens, num_external_computed_tokens,
                    not (skip_zeroing_group_ids and i in skip_zeroing_group_ids),
                )

    cpdef tuple allocate_new_blocks(self, str request_id, Py_ssize_t num_tokens,
                                    Py_ssize_t num_tokens_main_model, Py_ssize_t num_encoder_tokens=0):
        cdef tuple out = self._allocate_new_blocks(request_id, num_tokens, num_tokens_main_model, num_encoder_tokens)
        if out is None:
            return tuple([[] for _ in range(self._n_managers)])
        return out

    cdef tuple _allocate_new_blocks(self, str request_id, Py_ssize_t num_tokens, Py_ssize_t num_tokens_main_model,
                                    Py_ssize_t num_encoder_tokens):
        # New blocks per group, or None when no group got any.
        cdef Py_ssize_t i
        cdef SingleTypeKVCacheManager manager
        cdef list got
        cdef bint any_new = False
        if self._n_managers == 1 and not self._any_cross:
            manager = <SingleTypeKVCacheManager>self.single_type_managers[0]
            got = manager._allocate_new_blocks(request_id, num_tokens, num_tokens_main_model)
            return None if got is None else (got,)
        cdef list out = []
        for i in range(self._n_managers):
            manager = <SingleTypeKVCacheManager>self.single_type_managers[i]
            got = manager._allocate_new_blocks(
                request_id, num_encoder_tokens if self._cross_attention[i] else num_tokens, num_tokens_main_model
            )
            if got is None:
                got = []
            else:
                any_new = True
            out.append(got)
        return tuple(out) if any_new else None

    cpdef cache_blocks(self, request, Py_ssize_t num_computed_tokens):
        """Cache every group's full blocks among the first ``num_computed_tokens`` tokens
        (less the re-prefillable ones); under sparse retention only the blocks a replay
        of the prompt, its shared-prefix junction or an interval checkpoint can hit."""
        cdef SingleTypeKVCacheManager manager
        if self._retention < 0:
            for manager in self.single_type_managers:
                manager.cache_blocks(request, self._tokens_to_cache(manager, num_computed_tokens))
            return
        boundaries = replay_boundaries(request.num_prompt_tokens, self.scheduler_block_size,
                                       bool(self.drop_eagle_group_ids))
        for manager in self.single_type_managers:
            manager.cache_blocks(request, self._tokens_to_cache(manager, num_computed_tokens),
                                 self._retention, boundaries)

    def get_num_cacheable_tokens(self, num_computed_tokens, kv_cache_group_id):
        """How many of the first ``num_computed_tokens`` tokens group ``kv_cache_group_id``
        may cache (vLLM's: less the re-prefillable tokens; a hybrid aligns them)."""
        num_computed_tokens = _check_count("num_computed_tokens", num_computed_tokens)
        return self._tokens_to_cache(<SingleTypeKVCacheManager>self.single_type_managers[kv_cache_group_id],
                                     num_computed_tokens)

    def emit_cached_block_events(self, request, computed_blocks):
        """Queue one ``BlockStored`` per group holding blocks of a prefix hit
        (``computed_blocks``: one block list per group), as vLLM's report mode "full" does;
        nothing changes in the cache."""
        groups = self.kv_cache_config.kv_cache_groups
        for group_idx, group_blocks in enumerate(computed_blocks):
            if group_blocks:
                (<SingleTypeKVCacheManager>self.single_type_managers[group_idx]).block_pool.emit_cached_block_events(
                    request, len(group_blocks), groups[group_idx].kv_cache_spec.block_size, group_idx
                )

    cdef Py_ssize_t _tokens_to_cache(self, SingleTypeKVCacheManager manager, Py_ssize_t num_computed_tokens):
        # The num_tokens cache_blocks hands this manager.
        cdef Py_ssize_t n = num_computed_tokens - self.num_reprefillable_tokens
        return n if n > 0 else 0

    cdef int _check_cache_inputs(self, object request, str request_id, Py_ssize_t num_computed_tokens,
                                 tuple new_computed_blocks, bint attaching,
                                 Py_ssize_t total_computed_tokens) except -1:
        # cache_blocks(request, num_computed_tokens) after this allocation,
        # checked for every group before any change.
        cdef Py_ssize_t i
        cdef SingleTypeKVCacheManager manager
        if self._retention >= 0:  # (what sparse retention reads of the request, now)
            _shared_prefix_boundary(request)
            _check_count("num_prompt_tokens", request.num_prompt_tokens)
        for i in range(self._n_managers):
            manager = <SingleTypeKVCacheManager>self.single_type_managers[i]
            manager._check_cache_inputs(request, request_id, self._tokens_to_cache(manager, num_computed_tokens),
                                        new_computed_blocks[i], attaching, total_computed_tokens)
        return 0

    cpdef bint reset_prefix_cache(self) except -1:
        """Reset the prefix cache of each distinct block pool the managers use, once
        (kvcy's managers share one); False if any pool refused (blocks in use).  With
        no groups there is no pool to reset: True, as in vLLM."""
        pools = dict.fromkeys([(<SingleTypeKVCacheManager>m).block_pool for m in self.single_type_managers])
        return all([pool.reset_prefix_cache() for pool in pools])

    cpdef free(self, str request_id):
        cdef SingleTypeKVCacheManager manager
        for manager in self.single_type_managers:
            manager.free(request_id)

    def pop_blocks_for_free(self, request_id):
        out = []
        for manager in self.single_type_managers:
            out.extend(manager.pop_blocks_for_free(request_id))
        return out

    def get_num_common_prefix_blocks(self, running_request_id):
        return [m.get_num_common_prefix_blocks(running_request_id) for m in self.single_type_managers]

    cpdef remove_skipped_blocks(self, str request_id, Py_ssize_t processed_computed_tokens,
                                object num_prompt_tokens=None):
        """Free each group's blocks outside its attention window; ``num_prompt_tokens``
        (None, or the prompt length: checked before any group changes) is for R-SWA
        groups, which free the gap after the prompt."""
        if num_prompt_tokens is not None:
            num_prompt_tokens = _check_count("num_prompt_tokens", num_prompt_tokens)
        cdef SingleTypeKVCacheManager manager
        for manager in self.single_type_managers:
            manager.remove_skipped_blocks(request_id, processed_computed_tokens, num_prompt_tokens)

    def get_blocks(self, request_id):
        cdef SingleTypeKVCacheManager m
        return tuple([m._req_to_blocks.get(request_id) or [] for m in self.single_type_managers])

    @property
    def group_block_sizes(self):
        """Each group's block size, in group order."""
        return tuple([m.block_size for m in self.single_type_managers])

    def new_step_starts(self):
        """Tell every single-type manager that a new scheduler step begins."""
        cdef SingleTypeKVCacheManager manager
        for manager in self.single_type_managers:
            manager.new_step_starts()

    cpdef bint holds(self, str request_id):
        """Whether the request holds blocks (had a successful allocation since its last free)."""
        cdef SingleTypeKVCacheManager manager
        for manager in self.single_type_managers:
            if request_id in manager._req_to_blocks:
                return True
        return False

    cpdef tuple find_longest_cache_hit(self, object block_hashes, Py_ssize_t max_cache_hit_length):
        raise NotImplementedError


@cython.nonecheck(True)
cdef class KVCacheCoordinatorNoPrefixCache(KVCacheCoordinator):
    """Coordinator for prefix caching off: any number of groups, never a hit."""

    def __init__(self, kv_cache_config, max_model_len, max_in_flight_tokens, use_eagle,
                 enable_kv_cache_events, dcp_world_size, pcp_world_size, scheduler_block_size,
                 hash_block_size, metrics_collector=None, num_hash_lookahead_tokens=0,
                 num_prefill_lookahead=0, use_int_block_hashes=None):
        super().__init__(kv_cache_config, max_model_len, max_in_flight_tokens, use_eagle, False,
                         enable_kv_cache_events, dcp_world_size, pcp_world_size, scheduler_block_size,
                         hash_block_size, metrics_collector, num_prefill_lookahead,
                         num_hash_lookahead_tokens, use_int_block_hashes)
        self.num_single_type_manager = len(self.single_type_managers)

    def get_num_common_prefix_blocks(self, running_request_id):
        return [0] * self.num_single_type_manager

    cpdef tuple find_longest_cache_hit(self, object block_hashes, Py_ssize_t max_cache_hit_length):
        return tuple([[] for _ in range(self.num_single_type_manager)]), 0, 0


@cython.nonecheck(True)
cdef class UnitaryKVCacheCoordinator(KVCacheCoordinator):
    """Coordinator for exactly one KV-cache group with prefix caching on."""

    def __cinit__(self, *args, **kwargs):
        self.block_size = 1   # (see KVCacheCoordinator.__cinit__)

    def __init__(self, kv_cache_config, max_model_len, max_in_flight_tokens, use_eagle,
                 enable_caching, enable_kv_cache_events, dcp_world_size, pcp_world_size,
                 scheduler_block_size, hash_block_size, metrics_collector=None,
                 num_hash_lookahead_tokens=0, num_prefill_lookahead=0, use_int_block_hashes=None):
        super().__init__(kv_cache_config, max_model_len, max_in_flight_tokens, use_eagle,
                         enable_caching, enable_kv_cache_events, dcp_world_size, pcp_world_size,
                         scheduler_block_size, hash_block_size, metrics_collector,
                         num_prefill_lookahead, num_hash_lookahead_tokens, use_int_block_hashes)
        if len(kv_cache_config.kv_cache_groups) != 1:
            raise AssertionError("UnitaryKVCacheCoordinator assumes only one kv cache group")
        self.kv_cache_spec = kv_cache_config.kv_cache_groups[0].kv_cache_spec
        self._manager = <SingleTypeKVCacheManager>self.single_type_managers[0]
        self.dcp_world_size = self._manager.dcp_world_size
        self.block_size = self._manager.block_size
        if enable_caching and hash_block_size != self.block_size:
            raise AssertionError(
                "UnitaryKVCacheCoordinator assumes hash_block_size == block_size "
                f"(got hash_block_size={hash_block_size}, block_size={self.block_size})"
            )
        self.use_eagle = 0 in self.drop_eagle_group_ids
        self._manager.use_eagle = self.use_eagle
        self._group_ids = [0]

    cpdef tuple find_longest_cache_hit(self, object block_hashes, Py_ssize_t max_cache_hit_length):
        cdef tuple res = self._manager._find_hit(block_hashes, max_cache_hit_length, self._group_ids,
                                                 self.use_eagle, self.block_size)
        return res[0], res[1], 0


def _check_context_parallel_groups(groups, dcp_world_size, pcp_world_size):
    # The group types a hybrid layout supports under context parallelism (vLLM's
    # assertions): pcp, full attention or a replicated attention (draft) group; dcp,
    # full attention or any replicated group (Mamba, a draft model's).
    for g in groups:
        spec = g.kv_cache_spec
        replicated = not spec.dcp_sharded
        if pcp_world_size > 1 and not (
                isinstance(spec, FullAttentionSpec) or (isinstance(spec, AttentionSpec) and replicated)):
            raise AssertionError("PCP only supports full attention and replicated draft groups.")
        if dcp_world_size > 1 and not (isinstance(spec, FullAttentionSpec) or replicated):
            raise AssertionError(
                "DCP with hybrid KV cache layouts only supports full-attention, Mamba, and "
                f"replicated draft groups, got: {type(spec).__name__}."
            )


@cython.nonecheck(True)
cdef class HybridKVCacheCoordinator(KVCacheCoordinator):
    """Coordinator for several KV-cache groups (e.g. full + sliding window).

    Groups with equal specs are looked up together; full attention goes first
    (its left-to-right scan bounds the others), and the candidate length is
    shrunk until every group accepts it.
    """

    def __cinit__(self, *args, **kwargs):
        self._alignment = 1   # (see KVCacheCoordinator.__cinit__)

    def __init__(self, kv_cache_config, max_model_len, max_in_flight_tokens, use_eagle,
                 enable_caching, enable_kv_cache_events, dcp_world_size, pcp_world_size,
                 scheduler_block_size, hash_block_size, metrics_collector=None,
                 num_hash_lookahead_tokens=0, num_prefill_lookahead=0, allow_partial_hash_hits=True,
                 use_int_block_hashes=None):
        super().__init__(kv_cache_config, max_model_len, max_in_flight_tokens, use_eagle,
                         enable_caching, enable_kv_cache_events, dcp_world_size, pcp_world_size,
                         scheduler_block_size, hash_block_size, metrics_collector,
                         num_prefill_lookahead, num_hash_lookahead_tokens, use_int_block_hashes)
        # (groups out of prefix caching -- a ring, bounded replay -- hash nothing); vLLM asserts
        cacheable_block_sizes = [m.block_size for m in self.single_type_managers if m._prefix_cacheable]
        if any(block_size % hash_block_size for block_size in cacheable_block_sizes):
            raise AssertionError(
                "Each KV cache group's real block_size must be divisible by hash_block_size. "
                f"block_sizes={cacheable_block_sizes}, hash_block_size={hash_block_size}"
            )
        _check_context_parallel_groups(kv_cache_config.kv_cache_groups, dcp_world_size, pcp_world_size)
        self.enable_partial_hash_hits = bool(allow_partial_hash_hits) and partial_hash_hits_enabled(
            kv_cache_config.kv_cache_groups, hash_block_size, dcp_world_size,
            [type(m) for m in self.single_type_managers]
        )
        self._alignment = self.hash_block_size if self.enable_partial_hash_hits else self.scheduler_block_size
        for manager in self.single_type_managers:
            (<SingleTypeKVCacheManager>manager)._alignment = self._alignment
        self.verify_and_split_kv_cache_groups()

    @property
    def _cache_hit_alignment_tokens(self):
        """Where hits land: hash-block boundaries with partial hits, else scheduler-block ones."""
        return self._alignment

    cdef Py_ssize_t _align_cacheable(self, Py_ssize_t num_tokens) noexcept:
        # The longest prefix of num_tokens a later hit can match (no rounding with
        # partial hits: a privatized Mamba tail must not be cached again).
        if self.enable_partial_hash_hits:
            return num_tokens
        return num_tokens // self.scheduler_block_size * self.scheduler_block_size

    @property
    def full_attention_group_id(self):
        """The first full-attention group of the lookups (full attention goes first), or
        None when no cacheable group is full attention."""
        spec, group_ids, klass, use_eagle = self.attention_groups[0]
        return group_ids[0] if isinstance(spec, FullAttentionSpec) else None

    def verify_and_split_kv_cache_groups(self):
        """Batch groups with identical specs; full attention first.  Groups out of
        prefix caching (a ring, bounded replay) take no part in lookups: their hits
        stay empty."""
        groups = []
        for i, g in enumerate(self.kv_cache_config.kv_cache_groups):
            spec = g.kv_cache_spec
            if isinstance(spec, CrossAttentionSpec) or not spec.prefix_cacheable:
                continue
            klass = type(self.single_type_managers[i])
            use_eagle = i in self.drop_eagle_group_ids
            for entry in groups:
                if entry[0] == spec:
                    entry[1].append(i)
                    entry[3] = entry[3] or use_eagle
                    break
            else:
                groups.append([spec, [i], klass, use_eagle])
        if not groups:
            raise AssertionError("HybridKVCacheCoordinator requires at least one cacheable group.")
        groups.sort(key=lambda e: not isinstance(e[0], FullAttentionSpec))
        self.attention_groups = [SpecGroup(*e) for e in groups]
        for spec, ids, klass, use_eagle in self.attention_groups:
            if use_eagle:
                for gid in ids:
                    self.single_type_managers[gid].use_eagle = True
        self._is_simple_hybrid = len(groups) == 2 and isinstance(groups[0][0], FullAttentionSpec)

    cdef Py_ssize_t _tokens_to_cache(self, SingleTypeKVCacheManager manager, Py_ssize_t num_computed_tokens):
        # Hits are scheduler-block aligned; EAGLE groups keep one block past the
        # boundary (their hit looks one block further, then drops it), within the
        # finalized tokens (the re-prefillable ones are left out).
        cdef Py_ssize_t aligned = self._align_cacheable(num_computed_tokens)
        cdef Py_ssize_t finalized
        if manager.use_eagle and aligned > 0:
            finalized = num_computed_tokens - self.num_reprefillable_tokens
            if finalized < 0:
                finalized = 0
            return min(finalized, self._align_cacheable(finalized) + manager.block_size)
        return aligned

    cpdef tuple find_longest_cache_hit(self, object block_hashes, Py_ssize_t max_cache_hit_length):
        cdef Py_ssize_t num_groups = len(self.kv_cache_config.kv_cache_groups)
        cdef Py_ssize_t hit_length = max_cache_hit_length
        cdef Py_ssize_t longest = 0, curr, max_len, new_len, first, idx, n
        cdef list blocks_by_group = [None] * num_groups
        cdef list length_by_group = [0] * num_groups
        cdef Py_ssize_t alignment = self._alignment
        cdef bint partial = self.enable_partial_hash_hits
        cdef set eagle_verified = set()
        cdef tuple managers = self.single_type_managers
        cdef SingleTypeKVCacheManager first_manager
        cdef bint drop, is_full
        cdef tuple res, entry
        while True:
            curr = hit_length
            for idx in range(len(self.attention_groups)):
                # An entry is a SpecGroup, a tuple subclass: Cython unpacks without an
                # iterator only what is typed as a tuple (and its tuple casts take exact
                # tuples only), hence the check; anything else unpacks as Python would.
                item = self.attention_groups[idx]
                if PyTuple_Check(item):
                    entry = <tuple>item
                    spec, group_ids, klass, use_eagle = entry
                else:
                    spec, group_ids, klass, use_eagle = item
                first = group_ids[0]
                is_full = isinstance(spec, FullAttentionSpec)
                if is_full and blocks_by_group[first] is not None:
                    if <Py_ssize_t>length_by_group[first] < curr:
                        curr = length_by_group[first]
                    continue
                drop = use_eagle and idx not in eagle_verified
                max_len = curr
                first_manager = <SingleTypeKVCacheManager>managers[first]
                if drop and not isinstance(spec, MambaSpec):
                    # (EAGLE looks one block -- one hash block when fine-grained -- past
                    # the candidate, up to the request's hashes)
                    max_len = min(curr + (self.hash_block_size if partial and klass.supports_fine_grained_hash_lookup
                                          and first_manager.block_size > self.hash_block_size
                                          else first_manager.block_size),
                                  len(block_hashes) * self.hash_block_size)
                res = first_manager._find_hit(block_hashes, max_len, group_ids, drop, alignment)
                new_len = res[1]
                if drop:
                    eagle_verified.add(idx)
                elif new_len < curr:
                    eagle_verified.clear()
                curr = new_len
                for gid, blks in zip(group_ids, res[0]):
                    blocks_by_group[gid] = blks
                    length_by_group[gid] = new_len
                if curr > longest:
                    longest = curr
            if curr >= hit_length:
                break
            hit_length = curr
            if self._is_simple_hybrid:
                break
        for item in self.attention_groups:
            if PyTuple_Check(item):  # a SpecGroup (see above)
                entry = <tuple>item
                spec, group_ids, klass, use_eagle = entry
            else:
                spec, group_ids, klass, use_eagle = item
            if not isinstance(spec, FullAttentionSpec):
                continue
            n = _cdiv(hit_length, (<SingleTypeKVCacheManager>managers[group_ids[0]]).block_size)
            for gid in group_ids:
                blks = blocks_by_group[gid]
                if blks is not None:
                    del blks[n:]
                    length_by_group[gid] = hit_length
        blocks = tuple([b if b is not None else [] for b in blocks_by_group])
        return blocks, hit_length, longest - hit_length

    def find_longest_cache_hit_per_group(self, block_hashes, Py_ssize_t max_cache_hit_length):
        """Each lookup group's own longest hit, not cut to the hit all groups share as in
        ``find_longest_cache_hit``: ``(blocks per group, hit length per group)``, with
        ``[]`` and 0 for groups out of prefix caching.  EAGLE groups look one block past
        ``max_cache_hit_length`` and drop it, as in the shared search."""
        cdef Py_ssize_t num_groups = len(self.kv_cache_config.kv_cache_groups)
        cdef list blocks_by_group = [[] for _ in range(num_groups)]
        cdef list length_by_group = [0] * num_groups
        cdef tuple managers = self.single_type_managers
        cdef SingleTypeKVCacheManager first_manager
        cdef Py_ssize_t max_len
        cdef tuple res, entry
        for item in self.attention_groups:
            if PyTuple_Check(item):  # a SpecGroup (see above)
                entry = <tuple>item
                spec, group_ids, klass, use_eagle = entry
            else:
                spec, group_ids, klass, use_eagle = item
            first_manager = <SingleTypeKVCacheManager>managers[group_ids[0]]
            max_len = max_cache_hit_length
            if use_eagle and not isinstance(spec, MambaSpec):
                max_len = min(max_cache_hit_length + (
                    self.hash_block_size if self.enable_partial_hash_hits and klass.supports_fine_grained_hash_lookup
                    and first_manager.block_size > self.hash_block_size else first_manager.block_size
                ), len(block_hashes) * self.hash_block_size)
            res = first_manager._find_hit(block_hashes, max_len, group_ids, use_eagle, self._alignment)
            for gid, blks in zip(group_ids, res[0]):
                blocks_by_group[gid] = blks
                length_by_group[gid] = res[1]
        return tuple(blocks_by_group), tuple(length_by_group)


def get_kv_cache_coordinator(kv_cache_config, max_model_len, max_in_flight_tokens, use_eagle, enable_caching,
                             enable_kv_cache_events, dcp_world_size, pcp_world_size, scheduler_block_size,
                             hash_block_size, metrics_collector=None, num_hash_lookahead_tokens=0,
                             num_prefill_lookahead=0, allow_partial_hash_hits=True, use_int_block_hashes=None):
    """The coordinator for a config: none-caching, one group, or a hybrid (vLLM's
    parameters and order; ``use_int_block_hashes`` is kvcy's, last)."""
    common = dict(dcp_world_size=dcp_world_size, pcp_world_size=pcp_world_size,
                  scheduler_block_size=scheduler_block_size, hash_block_size=hash_block_size,
                  metrics_collector=metrics_collector, num_hash_lookahead_tokens=num_hash_lookahead_tokens,
                  num_prefill_lookahead=num_prefill_lookahead, use_int_block_hashes=use_int_block_hashes)
    if not enable_caching:
        return KVCacheCoordinatorNoPrefixCache(
            kv_cache_config, max_model_len, max_in_flight_tokens, use_eagle, enable_kv_cache_events, **common
        )
    if len(kv_cache_config.kv_cache_groups) == 1:
        return UnitaryKVCacheCoordinator(
            kv_cache_config, max_model_len, max_in_flight_tokens, use_eagle, enable_caching,
            enable_kv_cache_events, **common,
        )
    return HybridKVCacheCoordinator(
        kv_cache_config, max_model_len, max_in_flight_tokens, use_eagle, enable_caching,
        enable_kv_cache_events, allow_partial_hash_hits=allow_partial_hash_hits, **common,
    )
