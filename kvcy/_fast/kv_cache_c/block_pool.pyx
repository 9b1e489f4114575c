# kv_cache_c/block_pool.pyx: BlockPool: allocation, freeing, caching, touching and lazy eviction of
# blocks, with KV events; and the check of prefix-cache hit blocks. (vLLM:
# vllm/v1/core/block_pool.py, BlockPool.)
# Included into kvcy/_fast/_kv_cache_c.pyx (one extension module), not compiled on its own.

cdef enum:
    # Blocks whose table lookups one batch loop starts before using any (see
    # BlockPool._get_new_blocks and cache_full_blocks).
    _EVICT_BATCH = 32


cdef inline Py_ssize_t _initial_map_keys(Py_ssize_t num_blocks) noexcept:
    # A pool caches at most one key per block: size the map for all of them
    # up front (no rehash pauses in steady state), up to a table of 2**19
    # slots (16 MiB); bigger pools grow it as their cache fills.
    cdef Py_ssize_t most = (1 << 19) // _LOAD_INV
    return num_blocks if num_blocks < most else most


cdef list _checked_mask(object block_mask, Py_ssize_t n):
    """cache_full_blocks' ``block_mask``: one entry per block to cache (vLLM asserts it),
    as a list of bint."""
    cdef list mask
    try:
        mask = list(block_mask)
    except TypeError:
        raise TypeError(f"block_mask must be a sequence of bools, got {type(block_mask).__name__}") from None
    if len(mask) != n:
        raise AssertionError(f"block_mask has {len(mask)} entries for {n} blocks to cache")
    return [bool(x) for x in mask]


cdef inline bint _no_extra_keys(object request) except -1:
    # Whether generate_block_hash_extra_keys gives None for every block of
    # ``request``: no LoRA, no multimodal item, no cache salt, no prompt
    # embeddings (the events then skip the per-block call).
    return (request.lora_request is None and not request.mm_features and not request.cache_salt
            and request.prompt_embeds is None)


cdef class BlockPool:
    """All KV-cache blocks: allocation, freeing, caching and lazy eviction.

    Args:
        num_gpu_blocks: blocks in the pool (block 0 becomes the null block).
        enable_caching: whether prefix caching is on.
        hash_block_size: the block size request hashes are computed at.
        enable_kv_cache_events: queue BlockStored / BlockRemoved /
            AllBlocksCleared events for ``take_events``.
        metrics_collector: a ``KVCacheMetricsCollector`` (or None): its hooks
            are called where vLLM's pool calls them (allocation, touch,
            eviction, reset); with None the pool calls nothing.
        num_hash_lookahead_tokens: tokens after each block that its hash
            covers; ``BlockStored`` events then carry them
            (``lookahead_token_ids``) and the extra keys of that longer span.
        medium: the storage medium ``BlockStored`` events report.
        use_int_block_hashes: publish hashes in events as 64-bit ints
            (default: vLLM's ``VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES``).
    """

    def __init__(self, num_gpu_blocks, enable_caching, hash_block_size, enable_kv_cache_events=False,
                 metrics_collector=None, num_hash_lookahead_tokens=0, medium="GPU",
                 use_int_block_hashes=None):
        if isinstance(num_gpu_blocks, bool):
            raise TypeError(f"num_gpu_blocks must be an int, got {type(num_gpu_blocks).__name__}")
        # (vLLM asserts an int above 0)
        if not isinstance(num_gpu_blocks, int):
            raise AssertionError(f"num_gpu_blocks must be an int, got {type(num_gpu_blocks).__name__}")
        if num_gpu_blocks < 1:
            raise AssertionError(f"num_gpu_blocks must be at least 1 (the null block), got {num_gpu_blocks}")
        if num_gpu_blocks > 2**31:
            raise ValueError(
                f"num_gpu_blocks must be at most 2**31 (block ids are int32, as in vLLM's block tables), "
                f"got {num_gpu_blocks}"
            )
        if isinstance(hash_block_size, bool) or not isinstance(hash_block_size, int) or hash_block_size <= 0:
            raise ValueError(f"hash_block_size must be a positive int, got {hash_block_size!r}")
        num_hash_lookahead_tokens = _lookahead_count("num_hash_lookahead_tokens", num_hash_lookahead_tokens)
        if medium is not None and not isinstance(medium, str):
            raise TypeError(f"medium must be a str or None, got {type(medium).__name__}")
        self.num_gpu_blocks = num_gpu_blocks
        self.num_hash_lookahead_tokens = num_hash_lookahead_tokens
        self.medium = medium
        self.enable_caching = bool(enable_caching)
        self.hash_block_size = hash_block_size
        self.blocks = [KVCacheBlock(i) for i in range(num_gpu_blocks)]
        self.free_block_queue = FreeKVCacheBlockQueue(self.blocks)
        self.cached_block_hash_to_block = BlockHashToBlockMap()
        if self.enable_caching:
            self.cached_block_hash_to_block._reserve(_initial_map_keys(num_gpu_blocks))
        self._partial_keys = {}
        self.null_block = self.free_block_queue.popleft()
        self.null_block.is_null = True
        self.enable_kv_cache_events = bool(enable_kv_cache_events)
        self.use_int_block_hashes = (
            default_use_int_block_hashes() if use_int_block_hashes is None else bool(use_int_block_hashes)
        )
        self.kv_event_queue = []
        self.metrics_collector = metrics_collector
        self.num_evictions = 0

    # ------------------------------------------------------------------ lookups
    @property
    def cached_block_hashes_by_block(self):
        """Each block's partial prefix-cache entries beside its own key (block id ->
        cache keys), as vLLM's pool keeps them; a read-only view (the pool owns them)."""
        return MappingProxyType(self._partial_keys)

    cpdef object get_cached_block(self, object block_hash, list kv_cache_group_ids):
        """One cached block per group for ``block_hash``, or None if any group misses."""
        cdef list out = []
        cdef object block
        cdef Py_ssize_t gid
        for gid in kv_cache_group_ids:
            block = self.cached_block_hash_to_block._get(block_hash, gid)
            if block is None:
                return None
            out.append(block)
        return out

    cdef inline object _get_one(self, object block_hash, Py_ssize_t gid):
        return self.cached_block_hash_to_block._get(block_hash, gid)

    # ------------------------------------------------------------------ caching
    cdef object _ext(self, bytes block_hash):
        # external_block_hash, in C for the int form (one per evicted block
        # with events on): the hash's low 64 bits are its last 8 bytes, read
        # big-endian (a shorter hash: all of it).
        if not self.use_int_block_hashes:
            return block_hash
        cdef const unsigned char *p = <const unsigned char *>_PyBytes_AS_STRING_RAW(<PyObject *>block_hash)
        cdef Py_ssize_t n = _PyBytes_GET_SIZE_RAW(<PyObject *>block_hash)
        cdef Py_ssize_t i = n - 8 if n > 8 else 0
        cdef unsigned long long v = 0
        while i < n:
            v = (v << 8) | p[i]
            i += 1
        return v

    cpdef cache_full_blocks(self, request, list blocks, Py_ssize_t num_cached_blocks,
                            Py_ssize_t num_full_blocks, Py_ssize_t block_size,
                            Py_ssize_t kv_cache_group_id, object block_mask=None):
        """Give blocks ``[num_cached_blocks, num_full_blocks)`` their hashes and cache them.

        Null blocks are skipped, and so are the blocks whose ``block_mask`` entry (one per
        block of that range, if given) is false: blocks no later hit can use.  With events
        on, one ``BlockStored`` is queued.
        """
        if num_cached_blocks >= num_full_blocks:
            return
        if num_cached_blocks < 0:
            raise ValueError(f"num_cached_blocks must be non-negative, got {num_cached_blocks}")
        if blocks is None:
            raise TypeError("blocks must be a list of KVCacheBlock, got None")
        # More full blocks than the request holds (its tokens run past max_model_len, where
        # allocation stops): vLLM caches the blocks there are (its slice of ``blocks``), and
        # with events on its event loop then indexes past them (IndexError, no event).
        cdef bint past_blocks = num_full_blocks > PyList_GET_SIZE(blocks)
        if past_blocks:
            num_full_blocks = max(PyList_GET_SIZE(blocks), num_cached_blocks)
        cdef list mask = None  # (block i is left out when mask[i - num_cached_blocks] is false)
        if block_mask is not None:
            mask = _checked_mask(block_mask, num_full_blocks - num_cached_blocks)
        block_hashes = _resolve(_block_hashes_of(request), self.hash_block_size, block_size)
        if len(block_hashes) < num_full_blocks:
            raise RuntimeError(
                f"request {request.request_id!r} has {len(block_hashes)} block hashes at block size "
                f"{block_size}, fewer than the {num_full_blocks} full blocks to cache"
            )
        cdef Py_ssize_t i
        cdef KVCacheBlock blk
        cdef object block_hash
        if not 0 <= kv_cache_group_id <= 0xFFFFFFFF:
            raise ValueError(f"KV-cache group id {kv_cache_group_id} does not fit in 4 bytes")
        # The new blocks' hashes: the request's own list, or read once from a
        # coarser view; new_block_hashes[i - off] is block i's hash.
        cdef list new_block_hashes
        cdef Py_ssize_t off
        if type(block_hashes) is list:
            new_block_hashes = <list>block_hashes
            off = 0
        else:
            new_block_hashes = [block_hashes[i] for i in range(num_cached_blocks, num_full_blocks)]
            off = num_cached_blocks
        cdef PyObject *hp
        cdef BlockHashToBlockMap cache = self.cached_block_hash_to_block
        cdef Py_ssize_t ahead, start, end
        for i in range(num_cached_blocks, num_full_blocks):  # validate before any change
            ahead = i + 8  # the hash objects are scattered: start loading a few ahead
            if ahead < num_full_blocks:
                hp = _PyList_GET_ITEM_RAW(new_block_hashes, ahead - off)
                kvcy_prefetch(hp)
                kvcy_prefetch(<char*>hp + 63)
                kvcy_prefetch(_PyList_GET_ITEM_RAW(blocks, ahead))
            hp = _PyList_GET_ITEM_RAW(new_block_hashes, i - off)
            if Py_TYPE_RAW(hp) != &PyBytes_Type:
                raise TypeError(f"block hashes must be bytes, got {type(<object>hp).__name__}")
            if not _is_block(PyList_GET_ITEM(blocks, i)):
                raise TypeError(f"blocks must be KVCacheBlock, got {type(blocks[i]).__name__}")
            blk = <KVCacheBlock>PyList_GET_ITEM(blocks, i)
            # (a block already keyed holds a partial entry, promoted below)
            assert (blk.is_null or (mask is not None and not mask[i - num_cached_blocks]) or blk._hash is None
                    or 0 <= blk._num_tokens < (i + 1) * block_size), \
                "The block already has a hash. This should not happen."
        cdef bint events = self.enable_kv_cache_events
        cdef list new_hashes = [] if events else None
        cdef uint64_t hs[_EVICT_BATCH]
        cdef uint32_t gid = <uint32_t>kv_cache_group_id
        start = num_cached_blocks
        while start < num_full_blocks:  # (a range() with an enum step would build a Python range)
            end = start + _EVICT_BATCH
            if end > num_full_blocks:
                end = num_full_blocks
            for i in range(start, end):  # start loading the table slots
                hp = _PyList_GET_ITEM_RAW(new_block_hashes, i - off)
                hs[i - start] = kvcy_key_hash(_PyBytes_AS_STRING_RAW(hp), _PyBytes_GET_SIZE_RAW(hp), gid)
                cache._prefetch(hs[i - start])
            for i in range(start, end):
                blk = <KVCacheBlock>PyList_GET_ITEM(blocks, i)
                if blk.is_null or (mask is not None and not mask[i - num_cached_blocks]):
                    continue
                block_hash = <object>_PyList_GET_ITEM_RAW(new_block_hashes, i - off)
                if blk._hash is not None:  # a partial entry's block filled up
                    self._promote(blk, <bytes>block_hash, gid, (i + 1) * block_size)
                    if events:
                        new_hashes.append(self._ext(block_hash))
                    continue
                blk._hash = block_hash
                blk._group = gid
                blk._key_h = <uint32_t>hs[i - start]
                blk._num_tokens = (i + 1) * block_size
                cache._insert_hashed(<PyObject*>block_hash, gid, hs[i - start], blk)
                if events:
                    new_hashes.append(self._ext(block_hash))
            start = end
        if events and past_blocks:
            raise IndexError("list index out of range")
        if events:
            parent = None if num_cached_blocks == 0 else self._ext(block_hashes[num_cached_blocks - 1])
            lookahead_ids = [] if self.num_hash_lookahead_tokens else None
            if lookahead_ids is None and _no_extra_keys(request):
                extra_keys_list = [None] * len(new_hashes)  # (one per block stored, as below)
            else:
                extra_keys_list = []
                mm_idx = 0
                for i in range(num_cached_blocks, num_full_blocks):
                    if (<KVCacheBlock>blocks[i]).is_null or (mask is not None and not mask[i - num_cached_blocks]):
                        continue
                    start = i * block_size
                    keys, mm_idx = self._event_extra_keys(request, start, start + block_size, mm_idx,
                                                          lookahead_ids)
                    extra_keys_list.append(untag_extra_keys(keys))
            self.kv_event_queue.append(
                self._block_stored(
                    request, new_hashes, parent, num_cached_blocks * block_size,
                    num_full_blocks * block_size, block_size, kv_cache_group_id, extra_keys_list, lookahead_ids,
                )
            )

    cdef int _check_hashes_to_cache(self, object request, Py_ssize_t num_cached_blocks,
                                    Py_ssize_t num_full_blocks, Py_ssize_t block_size) except -1:
        # What cache_full_blocks(request, ..., num_cached_blocks, num_full_blocks,
        # block_size, ...) reads of the request's hashes, checked before the
        # caller changes anything (it caches after allocating): enough of
        # them, and those it reads bytes.  The same errors.
        if num_cached_blocks >= num_full_blocks:
            return 0
        if num_cached_blocks < 0:
            num_cached_blocks = 0
        hashes = _block_hashes_of(request)
        cdef Py_ssize_t scale = 1
        if block_size != self.hash_block_size:
            _resolve((), self.hash_block_size, block_size)  # (its ValueError for a bad size)
            scale = block_size // self.hash_block_size
        cdef Py_ssize_t n = len(hashes) // scale
        if n < num_full_blocks:
            raise RuntimeError(
                f"request {_rid(request)!r} has {n} block hashes at block size "
                f"{block_size}, fewer than the {num_full_blocks} full blocks to cache"
            )
        cdef Py_ssize_t j
        cdef object h
        cdef PyObject *hp
        if type(hashes) is list:  # (a request's own list: read in place)
            for j in range(num_cached_blocks * scale, num_full_blocks * scale):
                hp = _PyList_GET_ITEM_RAW(hashes, j)
                if Py_TYPE_RAW(hp) != &PyBytes_Type:
                    raise TypeError(f"block hashes must be bytes, got {type(<object>hp).__name__}")
            return 0
        for j in range(num_cached_blocks * scale, num_full_blocks * scale):
            h = hashes[j]
            if type(h) is not bytes:
                raise TypeError(f"block hashes must be bytes, got {type(h).__name__}")
        return 0

    cdef tuple _event_extra_keys(self, request, Py_ssize_t start, Py_ssize_t end, Py_ssize_t mm_idx,
                                 list lookahead_ids):
        # One block's extra keys for its BlockStored event, and the multimodal
        # index to resume at.  With hash lookahead they cover the block and its
        # lookahead tokens (as its hash does), whose ids go to lookahead_ids.
        cdef Py_ssize_t lookahead = self.num_hash_lookahead_tokens
        if not lookahead:
            return generate_block_hash_extra_keys(request, start, end, mm_idx)
        keys, mm_idx = generate_block_hash_extra_keys(request, start, end + lookahead, mm_idx)
        features = request.mm_features
        while mm_idx > 0:  # (the next block starts inside the lookahead: resume at its first item)
            pos = features[mm_idx - 1].mm_position
            if pos.offset + pos.length <= end:
                break
            mm_idx -= 1
        lookahead_ids.append(request.all_token_ids[end:end + lookahead])
        return keys, mm_idx

    cdef object _block_stored(self, request, list hashes, parent, Py_ssize_t start, Py_ssize_t end,
                              Py_ssize_t block_size, Py_ssize_t group_id, list extra_keys_list,
                              list lookahead_ids):
        lora = request.lora_request
        return BlockStored(
            block_hashes=hashes,
            parent_block_hash=parent,
            token_ids=request.all_token_ids[start:end],
            block_size=block_size,
            lora_id=lora.lora_int_id if lora is not None else None,
            medium=self.medium,
            lora_name=lora.lora_name if lora is not None else None,
            extra_keys=extra_keys_list if extra_keys_list else None,
            group_idx=group_id,
            session_id=getattr(request, "session_id", None),  # (vLLM's Request has one; kvcy's none)
            lookahead_token_ids=lookahead_ids,
        )

    def emit_cached_block_events(self, request, Py_ssize_t num_cached_blocks, Py_ssize_t block_size,
                                 Py_ssize_t kv_cache_group_id):
        """Queue a ``BlockStored`` for a prefix hit of ``num_cached_blocks`` blocks (no state change)."""
        if not self.enable_kv_cache_events or num_cached_blocks == 0:
            return
        block_hashes = _resolve(request.block_hashes, self.hash_block_size, block_size)
        hashes = []
        extra_keys_list = []
        lookahead_ids = [] if self.num_hash_lookahead_tokens else None
        cdef bint plain = lookahead_ids is None and _no_extra_keys(request)
        mm_idx = 0
        for i in range(num_cached_blocks):
            hashes.append(self._ext(block_hashes[i]))
            if plain:
                extra_keys_list.append(None)
                continue
            start = i * block_size
            keys, mm_idx = self._event_extra_keys(request, start, start + block_size, mm_idx, lookahead_ids)
            extra_keys_list.append(untag_extra_keys(keys))
        self.kv_event_queue.append(
            self._block_stored(
                request, hashes, None, 0, num_cached_blocks * block_size, block_size,
                kv_cache_group_id, extra_keys_list, lookahead_ids,
            )
        )

    # ------------------------------------------------------------------ allocation
    def get_new_blocks(self, num_blocks):
        """Pop ``num_blocks`` free blocks, evicting any cached ones, ref_cnt 0 -> 1.

        Raises:
            ValueError: fewer than ``num_blocks`` blocks are free (nothing changes).
        """
        return self._get_new_blocks(_check_count("num_blocks", num_blocks))

    cdef list _get_new_blocks(self, Py_ssize_t num_blocks):
        if num_blocks > self.free_block_queue.num_free_blocks:
            raise ValueError(f"Cannot get {num_blocks} free blocks from the pool")
        cdef list ret = self.free_block_queue._popleft_n(num_blocks)
        cdef PyObject **items = (<PyListObject*>ret).ob_item
        cdef Py_ssize_t i, start, end
        if self.metrics_collector is not None:
            self._metered_new_blocks(ret)
            return ret
        if not self.enable_caching:
            for i in range(num_blocks):
                (<KVCacheBlock>items[i])._ref_cnt += 1
            return ret
        # Eviction (which may allocate) runs after the queue is consistent
        # again, a batch at a time: first the loads an eviction needs -- the
        # key's table slot (from the hash half the block keeps) and the hash
        # object's header (its references drop) -- are started for the whole
        # batch, so the evictions find them in cache instead of missing one
        # after another.
        cdef PyObject *p
        cdef PyObject *k
        cdef BlockHashToBlockMap cache = self.cached_block_hash_to_block
        if self._partial_keys:
            self._new_blocks_partial(ret)
            return ret
        start = 0
        while start < num_blocks:  # (a range() with an enum step would build a Python range)
            end = start + _EVICT_BATCH
            if end > num_blocks:
                end = num_blocks
            for i in range(start, end):
                p = items[i]
                k = <PyObject*>(<KVCacheBlock>p)._hash
                if k != <PyObject*>None:
                    cache._prefetch((<KVCacheBlock>p)._key_h)
                    kvcy_prefetch(k)
            for i in range(start, end):
                p = items[i]
                if (<KVCacheBlock>p)._hash is not None:
                    _evict_own_key(self, <KVCacheBlock>p)  # (no partial entries: checked above)
                (<KVCacheBlock>p)._ref_cnt += 1
            start = end
        # The next allocation most likely takes about as many blocks from the
        # head; in a large pool they are cold (the queue already started
        # loading their array entries).
        self.free_block_queue._prefetch_head(num_blocks if num_blocks < 64 else 64)
        return ret

    cdef int _new_blocks_partial(self, list ret) except -1:
        # _get_new_blocks with partial entries about (kept off its plain loop): a
        # block's extra keys go with its own, even without it.
        cdef Py_ssize_t i
        cdef KVCacheBlock block
        for i in range(PyList_GET_SIZE(ret)):
            block = <KVCacheBlock>PyList_GET_ITEM(ret, i)
            _evict(self, block)
            block._ref_cnt += 1
        return 0

    cdef int _metered_new_blocks(self, list ret) except -1:
        # _get_new_blocks with a metrics collector, in vLLM's order: with caching
        # on, each block's eviction (its hook first, even for a block with no
        # key), then its reference and its allocation hook.
        cdef Py_ssize_t i
        cdef KVCacheBlock block
        cdef bint caching = self.enable_caching
        for i in range(PyList_GET_SIZE(ret)):
            block = <KVCacheBlock>PyList_GET_ITEM(ret, i)
            if caching:
                if self.metrics_collector:
                    self.metrics_collector.on_block_evicted(block)
                _evict(self, block)
            block._ref_cnt += 1
            if self.metrics_collector:
                self.metrics_collector.on_block_allocated(block)
        return 0

    cdef int _accessed(self, KVCacheBlock block) except -1:
        # The metrics collector's touch hook (vLLM tests the collector's truth).
        if self.metrics_collector:
            self.metrics_collector.on_block_accessed(block)
        return 0

    cdef int _queue_removed(self, KVCacheBlock block) except -1:
        # The BlockRemoved event of a block about to lose its key.
        self.kv_event_queue.append(
            BlockRemoved(block_hashes=[self._ext(block._hash)], medium=self.medium, group_idx=block._group)
        )
        return 0

    def evict_blocks(self, block_ids):
        """Drop the cache keys of the given blocks (they stay where they are)."""
        block_ids = list(block_ids)  # (read twice: checked first)
        for block_id in block_ids:
            if isinstance(block_id, bool) or not isinstance(block_id, int):
                raise TypeError(f"block ids must be ints, got {type(block_id).__name__}")
            if block_id >= self.num_gpu_blocks:  # (vLLM asserts this, naming the connector)
                raise AssertionError(
                    f"Invalid block_id {block_id} >= {self.num_gpu_blocks}. This indicates a bug in the KV "
                    "connector - workers should only report block IDs that were allocated by the scheduler."
                )
            if block_id < 0:
                raise ValueError(f"block id {block_id} is outside the pool of {self.num_gpu_blocks}")
        cdef object block
        for block_id in block_ids:
            block = self.blocks[block_id]
            if not _is_block(<PyObject*>block):  # (blocks is a public list)
                raise TypeError(f"pool blocks must be KVCacheBlock, got {type(block).__name__}")
            if self.metrics_collector:  # (vLLM's order: the hook first, for a block with no key too)
                self.metrics_collector.on_block_evicted(block)
            _evict(self, <KVCacheBlock>block)

    def touch(self, blocks):
        """Take a reference on cache-hit blocks, unlinking free ones from the queue.

        ``blocks`` holds blocks, or one sequence of blocks per KV-cache group.

        Raises:
            TypeError: an element is not a KVCacheBlock.
            RuntimeError: a block with no references is not in the free queue.
            In both cases nothing changes.
        """
        cdef list groups
        if blocks and not isinstance(blocks[0], KVCacheBlock):
            groups = [list(group) for group in blocks]
        else:
            groups = [list(blocks)]
        cdef list group
        for group in groups:  # check everything before any change
            _check_hit_blocks(group, NULL, self.free_block_queue, self.blocks)
        for group in groups:
            self._touch(group)

    cdef int _touch(self, list blocks) except -1:
        cdef Py_ssize_t i, n = PyList_GET_SIZE(blocks)
        for i in range(n):
            self._touch_one(<KVCacheBlock>PyList_GET_ITEM(blocks, i))
        return 0

    cdef inline int _touch_one(self, KVCacheBlock block) except -1:
        # Take a reference on a hit block, unlinking it from the free queue
        # when it was free (the queue type is final: no remove() override).
        if block.is_null:
            return 0
        if block._ref_cnt == 0:
            self.free_block_queue._remove(block)
        block._ref_cnt += 1
        if self.metrics_collector is not None:
            self._accessed(block)
        return 0

    def is_block_writable(self, block):
        """Whether the one request holding ``block`` may write it in place.

        True for a block that is not the null block, has exactly one reference
        and no cache key (a cached block's contents are shared through the prefix
        cache).

        Raises:
            TypeError: ``block`` is not a KVCacheBlock.
        """
        if not _is_block(<PyObject*>block):
            raise TypeError(f"block must be a KVCacheBlock, got {type(block).__name__}")
        cdef KVCacheBlock b = <KVCacheBlock>block
        return not b.is_null and b._ref_cnt == 1 and b._hash is None

    def move_block_hashes(self, src_block, dst_block):
        """Move ``src_block``'s prefix-cache entries to ``dst_block``.

        For copy-on-write: the request holding ``src_block`` goes on writing it,
        and a copy in ``dst_block`` serves later hits under the same keys (its
        own key keeps its token count, its partial entries stay partial).
        ``src_block`` is left with no key.  No event is queued and nothing is
        evicted: the entries stay cached.  Nothing happens when ``src_block``
        has no entries.

        Raises:
            TypeError: a block is not a KVCacheBlock.
            RuntimeError: a block is not one of this pool's blocks.
            AssertionError: ``dst_block`` has a cache key or partial entries already
                (as vLLM asserts).
            ValueError: ``dst_block`` is the null block, which is never cached.
            Nothing changes when one is raised.
        """
        _check_own_block(self.blocks, "src_block", src_block)
        _check_own_block(self.blocks, "dst_block", dst_block)
        cdef KVCacheBlock src = <KVCacheBlock>src_block
        cdef KVCacheBlock dst = <KVCacheBlock>dst_block
        if dst._hash is not None:
            raise AssertionError(f"dst_block {dst.block_id} already has a cache key")
        if dst.block_id in self._partial_keys:
            raise AssertionError(f"dst_block {dst.block_id} already has partial cache entries")
        if dst.is_null:
            raise ValueError("dst_block is the null block, which is never cached")
        cdef Py_ssize_t num_tokens = src._num_tokens
        cdef tuple key
        for key in self._remove_cached_block_hashes(src):
            # (the token count goes with the first entry, which becomes dst's own key)
            self._insert_block_hash(<bytes>key[0], <uint32_t>key[1], dst, num_tokens)

    def _maybe_evict_cached_block(self, block):
        """Drop ``block``'s prefix-cache entries, with their events: False if it had none.

        Raises:
            TypeError / RuntimeError: ``block`` is not a KVCacheBlock of this pool.
        """
        _check_own_block(self.blocks, "block", block)
        if self.metrics_collector:
            self.metrics_collector.on_block_evicted(block)
        return _evict(self, <KVCacheBlock>block)

    def unpin_blocks(self, blocks, on_reuse):
        """Not implemented: releasing blocks that stay readable until reused is for HiSparse.

        Raises:
            NotImplementedError: always (HiSparse is out of kvcy's scope).
        """
        raise NotImplementedError(
            "BlockPool.unpin_blocks (blocks read until the pool reuses them) serves HiSparse, "
            "which kvcy does not implement"
        )

    def cache_partial_block(self, request, block, num_tokens, kv_cache_group_id, block_size,
                            replace_existing_hashes=False):
        """Make ``block`` reachable from the prefix of ``num_tokens`` tokens that ends inside it.

        The entry's key is the request's hash at that boundary (its
        ``num_tokens // hash_block_size``-th hash) with the group id.  A block
        with no key takes it as its own (with ``num_tokens`` as its token count);
        a block with a key keeps it as a partial entry
        (``cached_block_hashes_by_block``), dropped with the block's own key on
        eviction, on reset, and when a longer entry replaces it.  If the block's
        own key covers fewer tokens, its entries are dropped first (with
        ``BlockRemoved`` events); ``replace_existing_hashes`` drops them in any
        case (the block was rewritten).  A new entry queues a ``BlockStored`` of
        the one hash block ending at the boundary.

        Returns:
            The entry's cache key, or None for the null block (nothing is cached).

        Raises:
            TypeError: ``block`` is not a KVCacheBlock, ``num_tokens``,
                ``kv_cache_group_id`` or ``block_size`` is not an int, or the
                request's hash is not bytes.
            RuntimeError: ``block`` is not a block of this pool.
            ValueError: the group id does not fit in 4 bytes.
            AssertionError: ``block_size`` is not a multiple of the hash block size,
                or ``num_tokens`` not a positive multiple of it within the
                request's hashes (as vLLM asserts).
            Nothing changes when one is raised.
        """
        _check_own_block(self.blocks, "block", block)
        cdef KVCacheBlock blk = <KVCacheBlock>block
        if blk.is_null:
            return None
        num_tokens = _int_arg("num_tokens", num_tokens)
        kv_cache_group_id = _int_arg("kv_cache_group_id", kv_cache_group_id)
        block_size = _int_arg("block_size", block_size)
        cdef Py_ssize_t hbs = self.hash_block_size
        assert block_size % hbs == 0, (
            f"block_size {block_size} is not a multiple of the hash block size {hbs}"
        )
        hashes = _block_hashes_of_req(request)
        assert num_tokens % hbs == 0, f"num_tokens {num_tokens} is not a multiple of the hash block size {hbs}"
        n_hash = num_tokens // hbs
        assert 0 < n_hash <= len(hashes), (
            f"num_tokens {num_tokens} is not within the request's {len(hashes)} block hashes "
            f"of {hbs} tokens"
        )
        if not 0 <= kv_cache_group_id <= 0xFFFFFFFF:
            raise ValueError(f"KV-cache group id {kv_cache_group_id} does not fit in 4 bytes")
        block_hash = hashes[n_hash - 1]
        if type(block_hash) is not bytes:
            raise TypeError(f"block hashes must be bytes, got {type(block_hash).__name__}")
        cdef bint events = self.enable_kv_cache_events
        parent = hashes[n_hash - 2] if n_hash > 1 else None
        if events and parent is not None and type(parent) is not bytes:
            raise TypeError(f"block hashes must be bytes, got {type(parent).__name__}")
        cdef uint32_t gid = <uint32_t>kv_cache_group_id
        self._cache_partial(request, blk, hashes, num_tokens, gid, bool(replace_existing_hashes))
        return <bytes>block_hash + (<object>gid).to_bytes(4, "big")

    cdef int _cache_partial(self, object request, KVCacheBlock blk, object hashes, Py_ssize_t num_tokens,
                            uint32_t gid, bint replace_existing_hashes) except -1:
        # cache_partial_block once its input is checked: blk is one of this pool's
        # blocks and not the null block, num_tokens a positive multiple of the hash
        # block size within the request's hashes, the hash there bytes (and the one
        # before it, with events on).
        cdef Py_ssize_t hbs = self.hash_block_size
        cdef Py_ssize_t n_hash = num_tokens // hbs
        cdef bytes block_hash = <bytes>hashes[n_hash - 1]
        cdef BlockHashToBlockMap cache = self.cached_block_hash_to_block
        cdef uint64_t h = kvcy_key_hash(_PyBytes_AS_STRING_RAW(<PyObject*>block_hash),
                                        _PyBytes_GET_SIZE_RAW(<PyObject*>block_hash), gid)
        cdef bint already_cached = blk._hash is not None and blk._group == gid and blk._hash == block_hash
        cdef Py_ssize_t i
        cdef PyObject *v
        if not already_cached:
            i = cache._find(<PyObject*>block_hash, gid, h)
            if i >= 0:
                v = cache._slots[i].value
                already_cached = ((<KVCacheBlock>v).block_id == blk.block_id if Py_TYPE_RAW(v) != &PyDict_Type
                                  else blk.block_id in <dict>v)
        if replace_existing_hashes:
            self._emit_block_removed_events(self._remove_cached_block_hashes(blk))
            already_cached = False
        elif not already_cached and blk._hash is not None and 0 <= blk._num_tokens < num_tokens:
            self._emit_block_removed_events(self._remove_cached_block_hashes(blk))
        if not already_cached:
            self._insert_block_hash(block_hash, gid, blk, num_tokens)
        if self.enable_kv_cache_events and not already_cached:
            parent = hashes[n_hash - 2] if n_hash > 1 else None
            start = num_tokens - hbs
            lookahead_ids = [] if self.num_hash_lookahead_tokens else None
            keys, _ = self._event_extra_keys(request, start, num_tokens, 0, lookahead_ids)
            self.kv_event_queue.append(
                self._block_stored(
                    request, [self._ext(block_hash)], None if parent is None else self._ext(parent),
                    start, num_tokens, hbs, gid, [untag_extra_keys(keys)], lookahead_ids,
                )
            )
        return 0

    cdef list _remove_cached_block_hashes(self, KVCacheBlock block):
        # Drop every cache entry of ``block``: its own key first, then its partial
        # entries (in their set's order).  The (hash, group id) pairs that were in
        # the map, for events; the block is left with no key (as in vLLM, even if
        # none was there).
        cdef list removed = []
        cdef object extra = self._partial_keys.pop(block.block_id, None)
        if block._hash is None and not extra:
            return removed
        cdef BlockHashToBlockMap cache = self.cached_block_hash_to_block
        if block._hash is not None and cache._drop_block(block):
            removed.append((block._hash, block._group))
        cdef bytes k
        cdef object h
        cdef Py_ssize_t g
        if extra:
            for k in extra:
                h = k[:len(k) - 4]
                g = int.from_bytes(k[len(k) - 4:], "big")
                if cache._pop(h, g, block.block_id) is not None:
                    removed.append((h, g))
        block._hash = None
        block._num_tokens = -1
        return removed

    cdef int _emit_block_removed_events(self, list removed) except -1:
        # One BlockRemoved per dropped (hash, group id), in order.
        if not self.enable_kv_cache_events:
            return 0
        cdef tuple key
        for key in removed:
            self.kv_event_queue.append(
                BlockRemoved(block_hashes=[self._ext(<bytes>key[0])], medium=self.medium, group_idx=key[1])
            )
        return 0

    cdef int _insert_block_hash(self, bytes block_hash, uint32_t gid, KVCacheBlock block,
                                Py_ssize_t num_tokens) except -1:
        # Cache ``block`` under (block_hash, gid) unless it is there already: as its
        # own key if it has none (num_tokens -1: None), else as a partial entry.
        if block._hash is not None and block._group == gid and block._hash == block_hash:
            return 0
        cdef BlockHashToBlockMap cache = self.cached_block_hash_to_block
        cdef uint64_t h = kvcy_key_hash(_PyBytes_AS_STRING_RAW(<PyObject*>block_hash),
                                        _PyBytes_GET_SIZE_RAW(<PyObject*>block_hash), gid)
        cdef Py_ssize_t i = cache._find(<PyObject*>block_hash, gid, h)
        cdef PyObject *v
        if i >= 0:
            v = cache._slots[i].value
            if (Py_TYPE_RAW(v) != &PyDict_Type and (<KVCacheBlock>v).block_id == block.block_id) or (
                    Py_TYPE_RAW(v) == &PyDict_Type and block.block_id in <dict>v):
                return 0
        if block._hash is None:
            block._hash = block_hash
            block._group = gid
            block._key_h = <uint32_t>h
            block._num_tokens = num_tokens
        else:
            self._partial_keys[block.block_id] = (
                self._partial_keys.get(block.block_id, frozenset()) | {block_hash + (<object>gid).to_bytes(4, "big")}
            )
        cache._insert_hashed(<PyObject*>block_hash, gid, h, block)
        return 0

    cdef int _promote(self, KVCacheBlock blk, bytes block_hash, uint32_t gid, Py_ssize_t num_tokens) except -1:
        # cache_full_blocks on a block holding a partial entry: its entries give
        # way to the full one (BlockRemoved events first, as vLLM queues them).
        self._emit_block_removed_events(self._remove_cached_block_hashes(blk))
        return self._insert_block_hash(block_hash, gid, blk, num_tokens)

    def free_blocks(self, ordered_blocks):
        """Drop one reference on each block, in eviction order.

        A block reaching 0 goes to the tail of the free queue if it is cached
        (LRU) and to the head if not (reused first); each batch keeps the
        given order.

        Raises:
            TypeError: an element is not a KVCacheBlock.
            RuntimeError: a block would be freed more times than it was taken.
            In both cases nothing changes.
        """
        cdef list blocks_list = ordered_blocks if type(ordered_blocks) is list else list(ordered_blocks)
        self._free_blocks(blocks_list)

    cdef int _free_blocks(self, list blocks_list) except -1:
        # One pass: type-check, drop a reference; a block reaching 0 gains the
        # queue's reference and is written just past the queue's tail (cached)
        # or just before its head (not cached, written backwards and put in
        # list order at the end).  The queue's ends move only after the pass,
        # so bad input found midway is rolled back with the queue untouched.
        cdef FreeKVCacheBlockQueue queue = self.free_block_queue
        cdef Py_ssize_t i, n = PyList_GET_SIZE(blocks_list)
        queue._ensure_room(n)
        cdef PyObject **items = (<PyListObject*>blocks_list).ob_item
        cdef bint caching = self.enable_caching
        cdef PyObject **ring = queue._ring
        cdef int64_t mask = queue._mask
        cdef uint32_t queue_id = queue._id
        cdef int64_t head = queue._head
        cdef int64_t tail = queue._tail
        cdef int64_t n_head = 0, n_tail = 0, pos
        cdef PyObject *p
        for i in range(n):
            p = items[i]
            if not _is_block(p):
                self._undo_free(blocks_list, i, n_head, n_tail)
                raise TypeError(f"free_blocks takes KVCacheBlock, got {type(<object>p).__name__}")
            if (<KVCacheBlock>p).is_null:
                continue
            if (<KVCacheBlock>p)._ref_cnt <= 0:
                self._undo_free(blocks_list, i, n_head, n_tail)
                raise RuntimeError(f"block {(<KVCacheBlock>p).block_id} freed more times than it was taken")
            (<KVCacheBlock>p)._ref_cnt = (<KVCacheBlock>p)._ref_cnt - 1
            if (<KVCacheBlock>p)._ref_cnt == 0:
                Py_INCREF_RAW(p)
                if caching and (<KVCacheBlock>p)._hash is not None:
                    pos = tail + n_tail
                    n_tail += 1
                else:
                    n_head += 1
                    pos = head - n_head
                ring[pos & mask] = p
                (<KVCacheBlock>p)._queue_id = queue_id
                (<KVCacheBlock>p)._pos = pos
        if n_head + n_tail == 0:
            return 0
        cdef int64_t lo = head - n_head, hi = head - 1
        while lo < hi:  # the head batch went in backwards: reverse it
            p = ring[lo & mask]
            ring[lo & mask] = ring[hi & mask]
            ring[hi & mask] = p
            (<KVCacheBlock>ring[lo & mask])._pos = lo
            (<KVCacheBlock>p)._pos = hi
            lo += 1
            hi -= 1
        queue._head = head - n_head
        queue._tail = tail + n_tail
        queue.num_free_blocks += n_head + n_tail
        return 0

    cdef void _undo_free(self, list blocks_list, Py_ssize_t upto, int64_t n_head,
                         int64_t n_tail) noexcept:
        # Give back the queue references taken for the n_head entries before
        # the head and the n_tail past the tail (outside the queue's range, so
        # not in it), and the references dropped from blocks_list[:upto].
        cdef Py_ssize_t i
        cdef PyObject *x
        cdef FreeKVCacheBlockQueue queue = self.free_block_queue
        queue._drop_taken(queue._head - n_head, n_head)
        queue._drop_taken(queue._tail, n_tail)
        for i in range(upto):
            x = _PyList_GET_ITEM_RAW(blocks_list, i)
            if not (<KVCacheBlock>x).is_null:
                (<KVCacheBlock>x)._ref_cnt += 1

    def reset_prefix_cache(self):
        """Drop every cache key; only when no block but the null block is in use."""
        cdef Py_ssize_t num_used_blocks = self.num_gpu_blocks - self.free_block_queue.num_free_blocks
        if num_used_blocks != 1:
            logger.warning(
                "Failed to reset prefix cache because some blocks (%d) are not freed yet",
                num_used_blocks - 1,
            )
            return False
        cdef object item
        for item in self.blocks:  # (blocks is a public list)
            if not _is_block(<PyObject*>item):
                raise TypeError(f"pool blocks must be KVCacheBlock, got {type(item).__name__}")
        self.cached_block_hash_to_block = BlockHashToBlockMap()
        if self.enable_caching:
            self.cached_block_hash_to_block._reserve(_initial_map_keys(self.num_gpu_blocks))
        self._partial_keys.clear()
        cdef KVCacheBlock block
        for block in self.blocks:
            block._hash = None
            block._num_tokens = -1
        if self.metrics_collector:
            self.metrics_collector.reset()
        logger.info("Successfully reset prefix cache")
        if self.enable_kv_cache_events:
            self.kv_event_queue.append(AllBlocksCleared())
        return True

    cpdef Py_ssize_t get_num_free_blocks(self):
        return self.free_block_queue.num_free_blocks

    def get_usage(self):
        """Fraction of usable blocks in use (the null block does not count)."""
        cdef Py_ssize_t total = self.num_gpu_blocks - 1
        if total <= 0:
            return 0.0
        return 1.0 - (self.free_block_queue.num_free_blocks / <double>total)

    def take_events(self):
        """Drain the event queue."""
        if not self.enable_kv_cache_events:
            return []
        events = self.kv_event_queue
        self.kv_event_queue = []
        return events


cdef inline bint _evict(BlockPool pool, KVCacheBlock block) except -1:
    # The Python twin's BlockPool._evict_cached_block (inlined into get_new_blocks' loop):
    # drop the block's key from the cache map (found from the hash half the
    # block keeps), with its event; False if it had no key there.  With partial
    # entries about, every key of the block, with an event each (vLLM's order).
    cdef list removed
    if len(pool._partial_keys) != 0 and block.block_id in pool._partial_keys:
        removed = pool._remove_cached_block_hashes(block)
        if not removed:
            return False
        pool.num_evictions += 1
        pool._emit_block_removed_events(removed)
        return True
    return _evict_own_key(pool, block)


cdef inline bint _evict_own_key(BlockPool pool, KVCacheBlock block) except -1:
    # _evict for a block with no partial entries: its own key only.
    if block._hash is None:
        return False
    if not pool.cached_block_hash_to_block._drop_block(block):
        return False
    if pool.enable_kv_cache_events:
        pool._queue_removed(block)
    block._hash = None
    block._num_tokens = -1
    pool.num_evictions += 1
    return True


cdef object _int_arg(str name, object value):
    # An int argument (bools refused), or TypeError (the pure twin's _int_arg).
    if type(value) is not int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(f"{name} must be an int, got {type(value).__name__}")
        value = int(value)
    return value


cdef object _block_hashes_of_req(object request):
    # The request's block hashes, or TypeError for something that is not a request.
    try:
        return request.block_hashes
    except AttributeError:
        raise TypeError(f"expected a Request, got {type(request).__name__}") from None


cdef int _check_own_block(list pool_blocks, str name, object block) except -1:
    # block is a KVCacheBlock of the pool whose blocks are pool_blocks, or
    # TypeError / RuntimeError (the pure twin's BlockPool._check_own_block).
    if not _is_block(<PyObject*>block):
        raise TypeError(f"{name} must be a KVCacheBlock, got {type(block).__name__}")
    cdef Py_ssize_t bid = (<KVCacheBlock>block).block_id
    if not (0 <= bid < PyList_GET_SIZE(pool_blocks) and _PyList_GET_ITEM_RAW(pool_blocks, bid) == <PyObject*>block):
        raise RuntimeError(f"{name} (block {bid}) is not a block of this pool")
    return 0


cdef list _check_hit_blocks(object blocks, Py_ssize_t *n_evictable=NULL, FreeKVCacheBlockQueue queue=None,
                            list pool_blocks=None):
    # Blocks to touch (prefix-cache hits) as a list, checked before any
    # change: every one a KVCacheBlock (the manager reads their C fields), or
    # TypeError; with pool_blocks (a pool's blocks), every one that pool's, or
    # RuntimeError (a hit from another pool would take a reference there);
    # with a queue, every free one (ref_cnt 0, not null) in it, or
    # RuntimeError (touch() would fail half-way).  n_evictable, if given,
    # receives how many are free: touching them takes them out of the pool.
    cdef list out = blocks if type(blocks) is list else list(blocks)
    cdef Py_ssize_t i, n_free = 0, bid
    cdef PyObject *bp
    for i in range(PyList_GET_SIZE(out)):
        bp = _PyList_GET_ITEM_RAW(out, i)
        if not _is_block(bp):
            raise TypeError(f"blocks must be KVCacheBlock, got {type(<object>bp).__name__}")
        if pool_blocks is not None:
            bid = (<KVCacheBlock>bp).block_id
            if not (0 <= bid < PyList_GET_SIZE(pool_blocks) and _PyList_GET_ITEM_RAW(pool_blocks, bid) == bp):
                raise RuntimeError(f"block {bid} is not a block of this pool (a hit from another manager?)")
        if (<KVCacheBlock>bp)._ref_cnt == 0 and not (<KVCacheBlock>bp).is_null:
            if queue is not None and not queue._holds(<KVCacheBlock>bp):
                raise RuntimeError(f"remove() called on an invalid block: {<object>bp}")
            n_free += 1
    if n_evictable != NULL:
        n_evictable[0] = n_free
    return out
