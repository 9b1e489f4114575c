# kv_cache_c/kv_cache_utils.pyx: KVCacheBlock: one block's id, reference count, cache key and
# free-queue position, allocated from cache-line aligned slabs.  (vLLM:
# vllm/v1/core/kv_cache_utils.py, KVCacheBlock.)
# Included into kvcy/_fast/_kv_cache_c.pyx (one extension module), not compiled on its own.

cdef inline bint _is_block(PyObject *p) noexcept:
    # A KVCacheBlock (or subclass) instance, by C type: runs no Python code,
    # unlike isinstance, and an object lying about its __class__ fails it.
    cdef PyTypeObject *t = Py_TYPE_RAW(p)
    return t == <PyTypeObject*>KVCacheBlock or _PyType_IsSubtype_RAW(t, <PyTypeObject*>KVCacheBlock)


# Why KVCacheBlock(pool=...) is refused (both twins).
_POOL_REFUSED = (
    "KVCacheBlock(pool=...) names the block pool a block comes from, for HiSparse's "
    "frees across several pools; kvcy does not implement HiSparse (pool must be None)"
)


# (no_gc stays on the definition: Cython does not take it from the .pxd.)
@cython.no_gc
cdef class KVCacheBlock:
    """One KV-cache block: id, reference count, cache key, free-queue position.

    The cache key is kept split: ``_hash`` (the request's block hash, whose
    ``hash()`` the bytes object caches) and ``_group`` (the KV-cache group id);
    ``block_hash`` joins them into vLLM's ``BlockHashWithGroupId`` on demand.
    The free-queue links live in the queue (an array of pointers in queue
    order); a block records only the id of the queue it was last put in and
    its position there.  The queue holds one reference to each block it
    holds, taken when the block enters and handed over (or dropped) when it
    leaves.  A block refers to nothing but its hash bytes, so it stays out
    of the cycle collector (pools hold up to millions of them).
    ``is_null`` (keyword only, vLLM's) marks the pool's null block.
    ``pool`` (keyword only, vLLM's) must be None: it serves HiSparse's several
    block pools, which kvcy does not implement (and keeping it would cost
    every block a field and a place in the cycle collector).
    """

    def __init__(self, object block_id, *, object pool=None, object is_null=False):
        # An int (or an int subclass, as the pure twin takes), never a float: a typed
        # ``int32_t`` argument would truncate 1.5 to 1.
        if type(block_id) is not int:
            if not isinstance(block_id, int):
                raise TypeError("an integer is required")
            block_id = int(block_id)
        cdef int32_t bid = block_id  # (its OverflowError before the pool's refusal, as in the pure twin)
        if pool is not None:
            raise NotImplementedError(_POOL_REFUSED)
        if type(is_null) is not bool:
            raise TypeError(f"is_null must be a bool, got {type(is_null).__name__}")
        self.block_id = bid
        self._ref_cnt = 0
        self._hash = None
        self._group = 0
        self._num_tokens = -1
        # _queue_id starts at 0 (C fields are zeroed on allocation) and is left
        # alone here: re-running __init__ must not detach a queued block.
        self.is_null = is_null

    @property
    def ref_cnt(self):
        return self._ref_cnt

    @ref_cnt.setter
    def ref_cnt(self, value):
        cdef int32_t n = _check_ref_cnt(value)
        if n != 0 and _in_a_queue(self):
            # (a free block with references would be queued a second time
            # when they are dropped, and handed out twice)
            raise RuntimeError(f"block {self.block_id} is in a free queue: its ref_cnt stays 0 "
                               "(take it with get_new_blocks() or touch())")
        self._ref_cnt = n

    @property
    def prev_free_block(self):
        """The previous block in the free queue (a fake head has id -1), or None."""
        cdef FreeKVCacheBlockQueue queue = _queue_of(self)
        return None if queue is None else queue._neighbour(self, False)

    @property
    def next_free_block(self):
        """The next block in the free queue (a fake tail has id -1), or None."""
        cdef FreeKVCacheBlockQueue queue = _queue_of(self)
        return None if queue is None else queue._neighbour(self, True)

    @property
    def block_hash_num_tokens(self):
        """Tokens up to the end of this block when it was cached, or None."""
        return None if self._num_tokens < 0 else self._num_tokens

    @block_hash_num_tokens.setter
    def block_hash_num_tokens(self, value):
        self._num_tokens = -1 if value is None else _check_count("block_hash_num_tokens", value)

    @property
    def block_hash(self):
        """The cache key (block hash + 4-byte group id), or None."""
        if self._hash is None:
            return None
        return _group_key(<bytes>self._hash, self._group)

    @block_hash.setter
    def block_hash(self, block_hash):
        assert self._hash is None, "The block already has a hash. This should not happen."
        _set_block_key(self, block_hash)

    @property
    def _block_hash(self):
        return self.block_hash

    def set_block_hash(self, block_hash, num_tokens=None):
        assert self._hash is None, "The block already has a hash. This should not happen."
        cdef Py_ssize_t n = -1 if num_tokens is None else _check_count("num_tokens", num_tokens)
        _set_block_key(self, block_hash)
        self._num_tokens = n

    def reset_hash(self):
        """Drop the cache key (the block is evicted from the prefix cache)."""
        self._hash = None
        self._num_tokens = -1

    def __repr__(self):
        prev = self.prev_free_block
        nxt = self.next_free_block
        prev_id = prev.block_id if prev is not None else None
        next_id = nxt.block_id if nxt is not None else None
        return (
            f"KVCacheBlock(block_id={self.block_id}, ref_cnt={self.ref_cnt}, "
            f"_block_hash={self.block_hash!r}, _block_hash_num_tokens={self.block_hash_num_tokens}, "
            f"prev_free_block={prev_id}, "
            f"next_free_block={next_id})"
        )


# Blocks come from cache-line aligned slabs (see kvcy_block_alloc), which
# give their memory back when their blocks are gone; this runs before any
# block is made.  (Against CPython's allocator, interleaved: the queue, pool
# and request rows of bench_kv_cache.py run 3-9 % faster.)
_ALIGNED_BLOCKS = bool(kvcy_install_block_alloc(<PyTypeObject*>KVCacheBlock))
