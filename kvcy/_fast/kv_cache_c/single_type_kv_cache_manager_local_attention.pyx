# kv_cache_c/single_type_kv_cache_manager_local_attention.pyx: SlidingWindowManager (with its reachable-block masks,
# dense and sparse; bounded replay is its spec's prefix_cacheable=False), ChunkedLocalAttentionManager
# and RSWAManager, whose attention sees only part of the context, and CircularBufferManager, one ring
# block per request.  (vLLM: vllm/v1/core/single_type_kv_cache_manager.py.)
# Included into kvcy/_fast/_kv_cache_c.pyx (one extension module), after single_type_kv_cache_manager.pyx.

cdef inline Py_ssize_t _hit_blocks(Py_ssize_t sliding_window, Py_ssize_t block_size, bint use_eagle) noexcept:
    """Contiguous cached blocks a sliding-window hit needs: the window before the next
    token, plus, with EAGLE, the block it looks past the boundary and drops."""
    return _cdiv(sliding_window - 1, block_size) + (1 if use_eagle else 0)


cdef object _window_mask(Py_ssize_t start_block, Py_ssize_t end_block, Py_ssize_t alignment_tokens,
                         Py_ssize_t block_size, Py_ssize_t sliding_window, bint use_eagle):
    # SlidingWindowManager.reachable_block_mask.
    if block_size <= 0 or alignment_tokens % block_size != 0:
        return None
    cdef Py_ssize_t per_segment = alignment_tokens // block_size
    cdef Py_ssize_t need = _hit_blocks(sliding_window, block_size, use_eagle)
    if need >= per_segment:
        return None
    cdef Py_ssize_t shift = 1 if use_eagle else 0, first = per_segment - need, i
    cdef list mask = [False] * (end_block - start_block if end_block > start_block else 0)
    for i in range(start_block, end_block):
        if i >= shift and (i - shift) % per_segment >= first:
            mask[i - start_block] = True
    return mask


cdef object _sparse_window_mask(Py_ssize_t start_block, Py_ssize_t end_block, Py_ssize_t alignment_tokens,
                                Py_ssize_t block_size, Py_ssize_t sliding_window, bint use_eagle,
                                Py_ssize_t retention_interval, list boundaries,
                                Py_ssize_t final_segment_end_block):
    # SlidingWindowManager.reachable_block_mask with every policy: a hit needs the
    # window's trailing blocks before an aligned boundary (with EAGLE one more, ending a
    # block past it).  Retention None (-1 here) keeps that tail at every alignment
    # boundary, a positive interval once per interval, 0 at none; sparse retention also
    # keeps the tail ending at each of ``boundaries`` (floored to the alignment).
    # ``final_segment_end_block`` (-1: none; not with EAGLE) keeps the tail of a last,
    # partial segment ending there.
    if alignment_tokens % block_size != 0:
        return None
    cdef Py_ssize_t need = _hit_blocks(sliding_window, block_size, use_eagle)
    cdef Py_ssize_t shift = 1 if use_eagle else 0
    cdef list mask = [False] * (end_block - start_block if end_block > start_block else 0)
    cdef Py_ssize_t segment_tokens = alignment_tokens if retention_interval < 0 else retention_interval
    cdef Py_ssize_t per_segment, first, i, size, lo, hi, end
    cdef object boundary
    if segment_tokens:
        per_segment = segment_tokens // block_size
        if need >= per_segment:
            return None
        first = per_segment - need
        for i in range(start_block, end_block):
            if i >= shift and (i - shift) % per_segment >= first:
                mask[i - start_block] = True
        if final_segment_end_block >= 0 and not use_eagle:
            size = final_segment_end_block % per_segment
            if size:
                lo = final_segment_end_block - size
                if final_segment_end_block - need > lo:
                    lo = final_segment_end_block - need
                if start_block > lo:
                    lo = start_block
                hi = end_block if end_block < final_segment_end_block else final_segment_end_block
                for i in range(lo, hi):
                    mask[i - start_block] = True
    if retention_interval >= 0:
        for boundary in boundaries:
            end = _floor_div(<Py_ssize_t>boundary, alignment_tokens) * alignment_tokens // block_size + shift
            lo = end - need if end - need > start_block else start_block
            hi = end_block if end_block < end else end
            for i in range(lo, hi):
                mask[i - start_block] = True
    return mask


cdef inline int _align_hit(tuple computed, Py_ssize_t n_groups, Py_ssize_t block_size,
                           Py_ssize_t alignment_tokens) except -1:
    """Trim every group's hit blocks until the hit is a multiple of ``alignment_tokens``."""
    cdef Py_ssize_t g
    while (PyList_GET_SIZE(<list>computed[0]) * block_size) % alignment_tokens != 0:
        for g in range(n_groups):
            (<list>computed[g]).pop()
    return 0


@cython.nonecheck(True)
cdef class SlidingWindowManager(SingleTypeKVCacheManager):
    """Sliding-window attention: only the last ``sliding_window`` tokens are attended."""

    def __cinit__(self, *args, **kwargs):
        self.sliding_window = 1   # (see SingleTypeKVCacheManager.__cinit__)

    def __init__(self, kv_cache_spec, *args, **kwargs):
        super().__init__(kv_cache_spec, *args, **kwargs)
        self.sliding_window = kv_cache_spec.sliding_window
        # Tokens below the window whose blocks stay (not attended): multi-module MTP
        # re-prefills the last few tokens and needs the window before them.
        self.extra_retained_tokens = kv_cache_spec.extra_retained_tokens

    cdef tuple _find_hit(self, object block_hashes, Py_ssize_t max_length, list group_ids,
                         bint drop_eagle_block, Py_ssize_t alignment_tokens):
        return SlidingWindowManager._hits(self.block_pool, self.block_size, self.sliding_window, block_hashes,
                                          max_length, group_ids, drop_eagle_block, alignment_tokens)

    @classmethod
    def find_longest_cache_hit(cls, block_hashes, max_length, kv_cache_group_ids, block_pool,
                               kv_cache_spec, drop_eagle_block, alignment_tokens,
                               dcp_world_size=1, pcp_world_size=1):
        _check_world_sizes(dcp_world_size, pcp_world_size)
        if dcp_world_size != 1:  # (vLLM's assertions, raised even under python -O)
            raise AssertionError("DCP not support sliding window attn now.")
        if pcp_world_size != 1:
            raise AssertionError("PCP not support sliding window attn now.")
        cdef list group_ids = _check_hit_args(kv_cache_group_ids, block_pool, alignment_tokens)
        cdef Py_ssize_t block_size = kv_cache_spec.block_size
        cdef Py_ssize_t sliding_window = kv_cache_spec.sliding_window
        return SlidingWindowManager._hits(block_pool, block_size, sliding_window, block_hashes, max_length,
                                          group_ids, drop_eagle_block, alignment_tokens)

    @staticmethod
    cdef tuple _hits(BlockPool pool, Py_ssize_t block_size, Py_ssize_t sliding_window, object block_hashes,
                     Py_ssize_t max_length, list group_ids, bint drop_eagle_block, Py_ssize_t alignment_tokens):
        # find_longest_cache_hit: the last run of hits that covers the window, right to left.
        hashes = _resolve(block_hashes, pool.hash_block_size, block_size)
        cdef Py_ssize_t needed = _hit_blocks(sliding_window, block_size, drop_eagle_block)
        cdef Py_ssize_t max_blocks = _num_searchable_blocks(hashes, max_length, block_size)
        # (a run must end where the hit, once EAGLE drops its last block, is aligned)
        cdef Py_ssize_t end_shift = 0 if drop_eagle_block else 1
        cdef Py_ssize_t n_groups = len(group_ids)
        cdef KVCacheBlock null = pool.null_block
        cdef tuple computed = tuple([[null] * max_blocks for _ in range(n_groups)])
        cdef Py_ssize_t contiguous = 0, i, g
        cdef bint found = False
        cdef object cached
        for i in range(max_blocks - 1, -1, -1):
            cached = pool.get_cached_block(hashes[i], group_ids)
            if cached is not None:
                if contiguous == 0 and ((i + end_shift) * block_size) % alignment_tokens != 0:
                    continue
                for g in range(n_groups):
                    (<list>computed[g])[i] = cached[g]
                contiguous += 1
                if contiguous >= needed:
                    for g in range(n_groups):
                        del (<list>computed[g])[i + contiguous:]
                    found = True
                    break
            else:
                contiguous = 0
        if not found:
            for g in range(n_groups):
                del (<list>computed[g])[contiguous:]
            _align_hit(computed, n_groups, block_size, alignment_tokens)
        if drop_eagle_block and len(<list>computed[0]) > 0:
            for g in range(n_groups):
                (<list>computed[g]).pop()
            _align_hit(computed, n_groups, block_size, alignment_tokens)
        return computed, len(<list>computed[0]) * block_size

    cpdef Py_ssize_t get_num_skipped_tokens(self, Py_ssize_t num_computed_tokens):
        """Tokens before the window of the next token, less ``extra_retained_tokens``."""
        cdef Py_ssize_t n = num_computed_tokens - self.sliding_window + 1 - self.extra_retained_tokens
        return n if n > 0 else 0

    cdef object _reachable(self, Py_ssize_t start_block, Py_ssize_t end_block):
        return _window_mask(start_block, end_block, self._alignment, self.block_size,
                            self.sliding_window, self.use_eagle)

    cdef object _sparse_reachable(self, Py_ssize_t start_block, Py_ssize_t end_block,
                                  Py_ssize_t retention_interval, list boundaries):
        return _sparse_window_mask(start_block, end_block, self._alignment, self.block_size,
                                   self.sliding_window, self.use_eagle, retention_interval, boundaries, -1)

    @classmethod
    def reachable_block_mask(cls, start_block, end_block, alignment_tokens, kv_cache_spec, use_eagle,
                             retention_interval=None, reachable_boundaries=(), dcp_world_size=1,
                             final_segment_end_block=None):
        """A hit ends on a multiple of ``alignment_tokens`` and reads the window's blocks
        before it (with EAGLE, one more, ending one block past the boundary): of each
        aligned segment only those trailing blocks are reachable.  None: all are (the
        window spans a whole segment, or the alignment is not a whole number of blocks).

        Sparse retention: a positive ``retention_interval`` keeps the tail once per
        interval instead of once per alignment, 0 at no segment; either way the tail
        ending at each of ``reachable_boundaries`` (floored to the alignment) is kept.
        Without EAGLE, ``final_segment_end_block`` also keeps the tail of the last,
        partial segment, which ends there.
        """
        if not isinstance(kv_cache_spec, SlidingWindowSpec):
            raise AssertionError("SlidingWindowManager.reachable_block_mask takes a SlidingWindowSpec")
        cdef Py_ssize_t start = _check_count("start_block", start_block)
        cdef Py_ssize_t end = _check_count("end_block", end_block)
        retention_interval, boundaries, final_segment_end_block = _check_mask_args(
            retention_interval, reachable_boundaries, dcp_world_size, final_segment_end_block
        )
        if alignment_tokens is None:
            return None
        cdef Py_ssize_t align = _check_count("alignment_tokens", alignment_tokens)
        if retention_interval is None and final_segment_end_block is None:
            return _window_mask(start, end, align, kv_cache_spec.block_size * dcp_world_size, kv_cache_spec.sliding_window,
                                bool(use_eagle))
        if align == 0:
            raise ValueError("alignment_tokens must be positive, got 0")
        return _sparse_window_mask(start, end, align, kv_cache_spec.block_size * dcp_world_size, kv_cache_spec.sliding_window,
                                   bool(use_eagle), -1 if retention_interval is None else retention_interval,
                                   boundaries, -1 if final_segment_end_block is None else final_segment_end_block)


@cython.nonecheck(True)
cdef class ChunkedLocalAttentionManager(SingleTypeKVCacheManager):
    """Chunked local attention: tokens attend only within their chunk."""

    def __cinit__(self, *args, **kwargs):
        self.attention_chunk_size = 1   # (see SingleTypeKVCacheManager.__cinit__)

    def __init__(self, kv_cache_spec, *args, **kwargs):
        super().__init__(kv_cache_spec, *args, **kwargs)
        self.attention_chunk_size = kv_cache_spec.attention_chunk_size

    cdef tuple _find_hit(self, object block_hashes, Py_ssize_t max_length, list group_ids,
                         bint drop_eagle_block, Py_ssize_t alignment_tokens):
        return ChunkedLocalAttentionManager._hits(self.block_pool, self.block_size, self.attention_chunk_size,
                                                  block_hashes, max_length, group_ids, drop_eagle_block,
                                                  alignment_tokens)

    @classmethod
    def find_longest_cache_hit(cls, block_hashes, max_length, kv_cache_group_ids, block_pool,
                               kv_cache_spec, drop_eagle_block, alignment_tokens,
                               dcp_world_size=1, pcp_world_size=1):
        _check_world_sizes(dcp_world_size, pcp_world_size)
        if dcp_world_size != 1:  # (vLLM's assertions, raised even under python -O)
            raise AssertionError("DCP not support chunked local attn now.")
        if pcp_world_size != 1:
            raise AssertionError("PCP not support chunked local attn now.")
        cdef list group_ids = _check_hit_args(kv_cache_group_ids, block_pool, alignment_tokens)
        cdef Py_ssize_t block_size = kv_cache_spec.block_size
        cdef Py_ssize_t chunk = kv_cache_spec.attention_chunk_size
        return ChunkedLocalAttentionManager._hits(block_pool, block_size, chunk, block_hashes, max_length,
                                                  group_ids, drop_eagle_block, alignment_tokens)

    @staticmethod
    cdef tuple _hits(BlockPool pool, Py_ssize_t block_size, Py_ssize_t chunk, object block_hashes,
                     Py_ssize_t max_length, list group_ids, bint drop_eagle_block, Py_ssize_t alignment_tokens):
        # find_longest_cache_hit: null blocks before the current chunk, then hits left to right.
        if drop_eagle_block:
            raise AssertionError("Hybrid KV cache is not supported for eagle + chunked local attention.")  # (vLLM asserts, at lookup)
        if block_size != alignment_tokens:  # (vLLM asserts, at lookup)
            raise AssertionError("KV cache groups with different block sizes are not compatible with chunked local "
                                 "attention now")
        hashes = _resolve(block_hashes, pool.hash_block_size, block_size)
        cdef Py_ssize_t start_block = (max_length // chunk * chunk) // block_size
        cdef Py_ssize_t max_blocks = _num_searchable_blocks(hashes, max_length, block_size)
        cdef Py_ssize_t n_groups = len(group_ids)
        cdef KVCacheBlock null = pool.null_block
        cdef tuple computed = tuple([[null] * start_block for _ in range(n_groups)])
        cdef Py_ssize_t i, g, n
        cdef object cached
        for i in range(start_block, max_blocks):
            cached = pool.get_cached_block(hashes[i], group_ids)
            if cached is None:
                break
            for g in range(n_groups):
                (<list>computed[g]).append(cached[g])
        n = len(<list>computed[0])
        return computed, n * block_size

    cpdef Py_ssize_t get_num_skipped_tokens(self, Py_ssize_t num_computed_tokens):
        return (num_computed_tokens // self.attention_chunk_size) * self.attention_chunk_size


cdef object _check_prompt_tokens(object num_prompt_tokens):
    # remove_skipped_blocks' num_prompt_tokens: None, or a token count.
    if num_prompt_tokens is None:
        return None
    return _check_count("num_prompt_tokens", num_prompt_tokens)


@cython.nonecheck(True)
cdef class RSWAManager(FullAttentionManager):
    """Reference sliding-window attention: full attention over the prompt, the last
    ``rswa_window`` tokens of what follows.

    Given the prompt length, ``remove_skipped_blocks`` frees the whole blocks
    between the prompt's last block and the start of the decode window
    (replacing them with the null block); otherwise it is full attention's.
    Hits, allocation and caching are full attention's.
    """

    def __cinit__(self, *args, **kwargs):
        self.rswa_window = 1   # (see SingleTypeKVCacheManager.__cinit__)

    def __init__(self, kv_cache_spec, *args, **kwargs):
        super().__init__(kv_cache_spec, *args, **kwargs)
        self.rswa_window = kv_cache_spec.rswa_window

    cpdef remove_skipped_blocks(self, str request_id, Py_ssize_t processed_computed_tokens,
                                object num_prompt_tokens=None):
        """Free the blocks wholly inside ``[ceil(prompt / block) * block,
        max(prompt, processed_computed_tokens - rswa_window))``: after the prompt's
        last block, before the decode window.  Without ``num_prompt_tokens``, as
        full attention (nothing to free).

        Raises:
            TypeError / ValueError: ``num_prompt_tokens`` is not None or a count.
        """
        num_prompt_tokens = _check_prompt_tokens(num_prompt_tokens)
        if num_prompt_tokens is None:
            FullAttentionManager.remove_skipped_blocks(self, request_id, processed_computed_tokens)
            return
        cdef Py_ssize_t n_prompt = num_prompt_tokens
        cdef Py_ssize_t window_start = processed_computed_tokens - self.rswa_window
        if window_start < n_prompt:
            window_start = n_prompt
        self._remove_blocks_in_range(request_id, _cdiv(n_prompt, self.block_size), window_start // self.block_size)


@cython.nonecheck(True)
cdef class CircularBufferManager(FullAttentionManager):
    """A ring: one block per request for its whole life, never cached, never hit.

    The first allocation (new tokens or external ones) takes the block; every
    later one takes nothing.  Hits and skipped blocks do not apply.
    """

    cdef list _claim_ring_block(self, str request_id, bint record_for_zeroing):
        cdef PyObject* p = PyDict_GetItem(self._req_to_blocks, request_id)
        cdef list req_blocks = _held_list(p)
        if req_blocks:
            return None
        cdef list new_blocks = self.block_pool.get_new_blocks(1)
        if req_blocks is None:
            self._gen.value = _next_gen()
            req_blocks = []
            self._req_to_blocks[request_id] = req_blocks
        req_blocks.extend(new_blocks)
        if self._record_new_block_ids and record_for_zeroing:  # (never: rings are not zeroed)
            _record_ids(self.new_block_ids, new_blocks)
        return new_blocks

    cpdef Py_ssize_t get_num_blocks_to_allocate(
        self, str request_id, Py_ssize_t num_tokens, object new_computed_blocks,
        Py_ssize_t total_computed_tokens, Py_ssize_t num_local_computed_tokens,
        Py_ssize_t num_tokens_main_model, bint apply_admission_cap=False, Py_ssize_t prefill_end=0,
    ) except -1:
        """1 until the request holds its ring block, then 0."""
        return 0 if self._req_to_blocks.get(request_id) else 1

    cpdef list allocate_new_blocks(self, str request_id, Py_ssize_t num_tokens, Py_ssize_t num_tokens_main_model):
        """The ring block if the request has none yet, else nothing."""
        cdef list out = self._claim_ring_block(request_id, True)
        return [] if out is None else out

    cdef list _allocate_new_blocks(self, str request_id, Py_ssize_t num_tokens, Py_ssize_t num_tokens_main_model):
        return self._claim_ring_block(request_id, True)

    cpdef allocate_external_computed_blocks(self, str request_id, Py_ssize_t num_local_computed_tokens,
                                            Py_ssize_t num_external_computed_tokens, bint record_for_zeroing=True):
        """The ring block if the request has none yet (whatever the token counts)."""
        self._claim_ring_block(request_id, record_for_zeroing)

    cdef tuple _find_hit(self, object block_hashes, Py_ssize_t max_length, list group_ids,
                         bint drop_eagle_block, Py_ssize_t alignment_tokens):
        return tuple([[] for _ in group_ids]), 0

    @classmethod
    def find_longest_cache_hit(cls, block_hashes, max_length, kv_cache_group_ids, block_pool,
                               kv_cache_spec, drop_eagle_block, alignment_tokens,
                               dcp_world_size=1, pcp_world_size=1):
        """No hit: an empty list per group, 0 tokens."""
        _check_world_sizes(dcp_world_size, pcp_world_size)
        return tuple([[] for _ in kv_cache_group_ids]), 0

    cpdef cache_blocks(self, request, Py_ssize_t num_tokens, object retention_interval=None,
                       object replay_boundaries=()):
        return None

    cpdef add_local_computed_blocks(self, str request_id, object new_computed_blocks,
                                    Py_ssize_t num_local_computed_tokens,
                                    Py_ssize_t num_external_computed_tokens):
        """Nothing: a ring takes no hits (any given are ignored, as in vLLM)."""
        return None

    cdef list _checked_hits(self, object new_computed_blocks, Py_ssize_t total_computed_tokens):
        return []

    cpdef remove_skipped_blocks(self, str request_id, Py_ssize_t processed_computed_tokens,
                                object num_prompt_tokens=None):
        return None

    cpdef Py_ssize_t get_num_skipped_tokens(self, Py_ssize_t num_computed_tokens):
        return 0
