# cython: language_level=3
"""Compiled twin of the KV-cache block manager (see ``_kv_cache_py.py``).

The same classes, methods, arguments and error messages as the pure-Python
twin, as typed ``cdef class``es: blocks and the free queue are linked through
C fields, the hot loops (allocation, freeing, touching, cache-hit search,
caching) run without Python attribute lookups, and the manager's public
methods validate their arguments before any state changes (bounds checks are
off in the build).
"""

import logging

cimport cython
from cpython.dict cimport PyDict_GetItem
from cpython.list cimport PyList_GET_ITEM, PyList_GET_SIZE
from cpython.object cimport PyObject

from kvcy.hashing import generate_block_hash_extra_keys
from kvcy.kv_cache_interface import (
    ChunkedLocalAttentionSpec,
    CrossAttentionSpec,
    FullAttentionSpec,
    MambaSpec,
    SlidingWindowSpec,
    get_kv_cache_spec_kind,
    get_kv_cache_spec_sliding_window,
)
from kvcy.kv_events import (
    MEDIUM_GPU,
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    default_use_int_block_hashes,
    external_block_hash,
    untag_extra_keys,
)
from kvcy.metrics import PrefixCacheStats
from kvcy.request import RequestStatus

logger = logging.getLogger("kvcy")

IMPLEMENTATION = "cython"

cdef object _WAITING = RequestStatus.WAITING
cdef object _PREEMPTED = RequestStatus.PREEMPTED


cdef inline Py_ssize_t _cdiv(Py_ssize_t a, Py_ssize_t b) noexcept:
    # Ceiling division for a >= 0, b > 0 (C division truncates: no negation trick).
    if a <= 0:
        return 0
    return (a + b - 1) // b


def cdiv(a, b):
    return -(-a // b)


cdef Py_ssize_t _check_count(str name, object value) except -1:
    if type(value) is not int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(f"{name} must be an int, got {type(value).__name__}")
        value = int(value)
    if value < 0:
        raise ValueError(f"{name} must be non-negative, got {value}")
    if value > 2**62:
        raise ValueError(f"{name} is too large: {value}")
    return <Py_ssize_t>value


# Group id -> its 4-byte big-endian suffix, cached for the small ids that occur.
cdef list _GROUP_SUFFIX = [i.to_bytes(4, "big") for i in range(64)]


cdef inline bytes _group_key(bytes block_hash, Py_ssize_t group_id):
    if group_id < 64:
        return block_hash + <bytes>_GROUP_SUFFIX[group_id]
    return block_hash + group_id.to_bytes(4, "big")


# =============================================================================
# Blocks and the free queue
# =============================================================================
@cython.freelist(64)
cdef class KVCacheBlock:
    """One KV-cache block: id, reference count, cache key, free-list links."""

    cdef public Py_ssize_t block_id
    cdef public Py_ssize_t ref_cnt
    cdef public object _block_hash
    cdef public object block_hash_num_tokens
    cdef public KVCacheBlock prev_free_block
    cdef public KVCacheBlock next_free_block
    cdef public bint is_null

    def __init__(self, Py_ssize_t block_id):
        self.block_id = block_id
        self.ref_cnt = 0
        self._block_hash = None
        self.block_hash_num_tokens = None
        self.prev_free_block = None
        self.next_free_block = None
        self.is_null = False

    @property
    def block_hash(self):
        """The cache key (block hash + 4-byte group id), or None."""
        return self._block_hash

    @block_hash.setter
    def block_hash(self, block_hash):
        assert self._block_hash is None, "The block already has a hash. This should not happen."
        self._block_hash = block_hash

    def set_block_hash(self, block_hash, num_tokens=None):
        assert self._block_hash is None, "The block already has a hash. This should not happen."
        self._block_hash = block_hash
        self.block_hash_num_tokens = num_tokens

    def reset_hash(self):
        """Drop the cache key (the block is evicted from the prefix cache)."""
        self._block_hash = None
        self.block_hash_num_tokens = None

    def __repr__(self):
        prev_id = self.prev_free_block.block_id if self.prev_free_block is not None else None
        next_id = self.next_free_block.block_id if self.next_free_block is not None else None
        return (
            f"KVCacheBlock(block_id={self.block_id}, ref_cnt={self.ref_cnt}, "
            f"_block_hash={self._block_hash!r}, prev_free_block={prev_id}, "
            f"next_free_block={next_id})"
        )


@cython.final
cdef class FreeKVCacheBlockQueue:
    """Doubly linked list of free blocks, threaded through the blocks themselves.

    A fake head and tail (``block_id == -1``) remove the edge cases.  Removal
    from the middle is O(1), which ``touch`` needs when a cached free block is
    hit again.  Order: head = next to allocate, tail = most recently freed.
    """

    cdef public Py_ssize_t num_free_blocks
    cdef public KVCacheBlock fake_free_list_head
    cdef public KVCacheBlock fake_free_list_tail

    def __init__(self, list blocks):
        cdef Py_ssize_t i, n = len(blocks)
        cdef KVCacheBlock b
        for b in blocks:  # type-check every element before linking any
            pass
        self.num_free_blocks = n
        for i in range(n):
            b = <KVCacheBlock>blocks[i]
            if i > 0:
                b.prev_free_block = <KVCacheBlock>blocks[i - 1]
            if i < n - 1:
                b.next_free_block = <KVCacheBlock>blocks[i + 1]
        self.fake_free_list_head = KVCacheBlock(-1)
        self.fake_free_list_tail = KVCacheBlock(-1)
        if n > 0:
            self.fake_free_list_head.next_free_block = <KVCacheBlock>blocks[0]
            (<KVCacheBlock>blocks[0]).prev_free_block = self.fake_free_list_head
            self.fake_free_list_tail.prev_free_block = <KVCacheBlock>blocks[n - 1]
            (<KVCacheBlock>blocks[n - 1]).next_free_block = self.fake_free_list_tail
        else:
            self.fake_free_list_head.next_free_block = self.fake_free_list_tail
            self.fake_free_list_tail.prev_free_block = self.fake_free_list_head

    cpdef KVCacheBlock popleft(self):
        """Pop the head block.

        Raises:
            ValueError: the queue is empty.
        """
        cdef KVCacheBlock first = self.fake_free_list_head.next_free_block
        if first is None or first is self.fake_free_list_tail:
            raise ValueError("No free blocks available")
        self.fake_free_list_head.next_free_block = first.next_free_block
        first.next_free_block.prev_free_block = self.fake_free_list_head
        first.prev_free_block = None
        first.next_free_block = None
        self.num_free_blocks -= 1
        return first

    cpdef list popleft_n(self, Py_ssize_t n):
        """Pop ``n`` blocks from the head, in order.

        Raises:
            ValueError: fewer than ``n`` blocks are free, or ``n`` is negative.
        """
        if n < 0:
            raise ValueError(f"n must be non-negative, got {n}")
        if n == 0:
            return []
        if n > self.num_free_blocks:
            raise ValueError(f"Cannot pop {n} blocks: only {self.num_free_blocks} are free")
        cdef list out = [None] * n
        cdef KVCacheBlock curr = self.fake_free_list_head.next_free_block
        cdef KVCacheBlock last
        cdef Py_ssize_t i
        for i in range(n):
            out[i] = curr
            last = curr
            curr = curr.next_free_block
            last.prev_free_block = None
            last.next_free_block = None
        self.fake_free_list_head.next_free_block = curr
        curr.prev_free_block = self.fake_free_list_head
        self.num_free_blocks -= n
        return out

    cpdef remove(self, KVCacheBlock block):
        """Unlink ``block`` from the middle of the queue.

        Raises:
            RuntimeError: the block is not in the queue.
        """
        if block.prev_free_block is None or block.next_free_block is None:
            raise RuntimeError(f"remove() called on an invalid block: {block}")
        block.prev_free_block.next_free_block = block.next_free_block
        block.next_free_block.prev_free_block = block.prev_free_block
        block.prev_free_block = None
        block.next_free_block = None
        self.num_free_blocks -= 1

    cdef int _check_not_queued(self, KVCacheBlock block) except -1:
        if block.prev_free_block is not None or block.next_free_block is not None:
            raise RuntimeError(f"block {block.block_id} is already in the free queue")
        return 0

    cpdef append(self, KVCacheBlock block):
        """Put ``block`` at the tail (freed last, evicted last)."""
        self._check_not_queued(block)
        cdef KVCacheBlock last = self.fake_free_list_tail.prev_free_block
        last.next_free_block = block
        block.prev_free_block = last
        block.next_free_block = self.fake_free_list_tail
        self.fake_free_list_tail.prev_free_block = block
        self.num_free_blocks += 1

    cpdef append_n(self, list blocks):
        """Put ``blocks`` at the tail, in order (the last one ends up last)."""
        cdef Py_ssize_t i, n = PyList_GET_SIZE(blocks)
        if n == 0:
            return
        cdef KVCacheBlock block
        for block in blocks:
            self._check_not_queued(block)
        cdef KVCacheBlock last = self.fake_free_list_tail.prev_free_block
        for i in range(n):
            block = <KVCacheBlock>PyList_GET_ITEM(blocks, i)
            block.prev_free_block = last
            last.next_free_block = block
            last = block
        last.next_free_block = self.fake_free_list_tail
        self.fake_free_list_tail.prev_free_block = last
        self.num_free_blocks += n

    cpdef prepend_n(self, list blocks):
        """Put ``blocks`` at the head, in order (``blocks[0]`` becomes the head)."""
        cdef Py_ssize_t i, n = PyList_GET_SIZE(blocks)
        if n == 0:
            return
        cdef KVCacheBlock block
        for block in blocks:
            self._check_not_queued(block)
        cdef KVCacheBlock first = self.fake_free_list_head.next_free_block
        cdef KVCacheBlock prev = self.fake_free_list_head
        for i in range(n):
            block = <KVCacheBlock>PyList_GET_ITEM(blocks, i)
            block.prev_free_block = prev
            prev.next_free_block = block
            prev = block
        prev.next_free_block = first
        first.prev_free_block = prev
        self.num_free_blocks += n

    cpdef list get_all_free_blocks(self):
        """All free blocks from head to tail (for tests and checks)."""
        cdef list out = []
        cdef KVCacheBlock curr = self.fake_free_list_head.next_free_block
        cdef KVCacheBlock tail = self.fake_free_list_tail
        while curr is not tail:
            out.append(curr)
            curr = curr.next_free_block
        return out

    def __len__(self):
        return self.num_free_blocks


# =============================================================================
# Hash -> block map and the block pool
# =============================================================================
@cython.final
cdef class BlockHashToBlockMap:
    """Cache key -> block(s).  The first block inserted under a key wins lookups.

    Several blocks may carry the same key (no de-duplication, so block tables
    stay append-only); the value is then a dict ``{block_id: block}`` in
    insertion order.
    """

    cdef public dict _cache

    def __init__(self):
        self._cache = {}

    cpdef object get_one_block(self, bytes key):
        cdef PyObject* p = PyDict_GetItem(self._cache, key)
        if p == NULL:
            return None
        cdef object blocks = <object>p
        if type(blocks) is dict:
            return next(iter((<dict>blocks).values()))
        return blocks

    cpdef bint contain(self, bytes key, Py_ssize_t block_id):
        cdef PyObject* p = PyDict_GetItem(self._cache, key)
        if p == NULL:
            return False
        cdef object blocks = <object>p
        if type(blocks) is dict:
            return block_id in <dict>blocks
        return (<KVCacheBlock>blocks).block_id == block_id

    cpdef insert(self, bytes key, KVCacheBlock block):
        cdef PyObject* p = PyDict_GetItem(self._cache, key)
        if p == NULL:
            self._cache[key] = block
            return
        cdef object blocks = <object>p
        if type(blocks) is dict:
            (<dict>blocks)[block.block_id] = block
        else:
            self._cache[key] = {(<KVCacheBlock>blocks).block_id: blocks, block.block_id: block}

    cpdef object pop(self, bytes key, Py_ssize_t block_id):
        cdef object blocks = self._cache.pop(key, None)
        if blocks is None:
            return None
        cdef object block
        if type(blocks) is dict:
            block = (<dict>blocks).pop(block_id, None)
            if blocks:
                self._cache[key] = blocks
            return block
        if (<KVCacheBlock>blocks).block_id == block_id:
            return blocks
        self._cache[key] = blocks
        return None

    def keys(self):
        return list(self._cache)

    def __len__(self):
        return len(self._cache)


cdef class _BlockHashView:
    """Request block hashes seen at a coarser block size (consecutive hashes joined)."""

    cdef list _hashes
    cdef Py_ssize_t _scale

    def __init__(self, list hashes, Py_ssize_t scale):
        self._hashes = hashes
        self._scale = scale

    def __len__(self):
        return len(self._hashes) // self._scale

    def __getitem__(self, Py_ssize_t i):
        cdef Py_ssize_t n = len(self._hashes) // self._scale
        if i < 0:
            i += n
        if not 0 <= i < n:
            raise IndexError(i)
        return b"".join(self._hashes[i * self._scale:(i + 1) * self._scale])


cdef inline Py_ssize_t _num_searchable_blocks(object hashes, Py_ssize_t max_length,
                                              Py_ssize_t block_size) except -1:
    """Blocks a hit search may look at: within max_length and within the known hashes."""
    cdef Py_ssize_t n = max_length // block_size
    cdef Py_ssize_t n_hashes = len(hashes)
    return n_hashes if n_hashes < n else n


def resolve_block_hashes(hashes, Py_ssize_t hash_block_size, Py_ssize_t block_size):
    """The request's hashes at ``block_size`` (a multiple of ``hash_block_size``)."""
    if block_size == hash_block_size:
        return hashes
    return _BlockHashView(list(hashes), block_size // hash_block_size)


cdef class BlockPool:
    """All KV-cache blocks: allocation, freeing, caching and lazy eviction.

    Args:
        num_gpu_blocks: blocks in the pool (block 0 becomes the null block).
        enable_caching: whether prefix caching is on.
        hash_block_size: the block size request hashes are computed at.
        enable_kv_cache_events: queue BlockStored / BlockRemoved /
            AllBlocksCleared events for ``take_events``.
        use_int_block_hashes: publish hashes in events as 64-bit ints
            (default: vLLM's ``VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES``).
    """

    cdef public Py_ssize_t num_gpu_blocks
    cdef public bint enable_caching
    cdef public Py_ssize_t hash_block_size
    cdef public list blocks
    cdef public FreeKVCacheBlockQueue free_block_queue
    cdef public BlockHashToBlockMap cached_block_hash_to_block
    cdef public KVCacheBlock null_block
    cdef public bint enable_kv_cache_events
    cdef public bint use_int_block_hashes
    cdef public list kv_event_queue
    cdef public object metrics_collector
    cdef public Py_ssize_t num_evictions

    def __init__(self, num_gpu_blocks, enable_caching, hash_block_size, enable_kv_cache_events=False,
                 metrics_collector=None, use_int_block_hashes=None):
        if isinstance(num_gpu_blocks, bool) or not isinstance(num_gpu_blocks, int):
            raise TypeError(f"num_gpu_blocks must be an int, got {type(num_gpu_blocks).__name__}")
        if num_gpu_blocks < 1:
            raise ValueError(f"num_gpu_blocks must be at least 1 (the null block), got {num_gpu_blocks}")
        if isinstance(hash_block_size, bool) or not isinstance(hash_block_size, int) or hash_block_size <= 0:
            raise ValueError(f"hash_block_size must be a positive int, got {hash_block_size!r}")
        self.num_gpu_blocks = num_gpu_blocks
        self.enable_caching = bool(enable_caching)
        self.hash_block_size = hash_block_size
        self.blocks = [KVCacheBlock(i) for i in range(num_gpu_blocks)]
        self.free_block_queue = FreeKVCacheBlockQueue(self.blocks)
        self.cached_block_hash_to_block = BlockHashToBlockMap()
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
    cpdef object get_cached_block(self, bytes block_hash, list kv_cache_group_ids):
        """One cached block per group for ``block_hash``, or None if any group misses."""
        cdef list out = []
        cdef object gid, block
        for gid in kv_cache_group_ids:
            block = self.cached_block_hash_to_block.get_one_block(_group_key(block_hash, gid))
            if block is None:
                return None
            out.append(block)
        return out

    cdef inline object _get_one(self, bytes block_hash, Py_ssize_t gid):
        return self.cached_block_hash_to_block.get_one_block(_group_key(block_hash, gid))

    # ------------------------------------------------------------------ caching
    cdef object _ext(self, bytes block_hash):
        return external_block_hash(block_hash, self.use_int_block_hashes)

    cpdef cache_full_blocks(self, request, list blocks, Py_ssize_t num_cached_blocks,
                            Py_ssize_t num_full_blocks, Py_ssize_t block_size,
                            Py_ssize_t kv_cache_group_id):
        """Give blocks ``[num_cached_blocks, num_full_blocks)`` their hashes and cache them.

        Null blocks are skipped.  With events on, one ``BlockStored`` is queued.
        """
        if num_cached_blocks >= num_full_blocks:
            return
        block_hashes = resolve_block_hashes(request.block_hashes, self.hash_block_size, block_size)
        if len(block_hashes) < num_full_blocks:
            raise RuntimeError(
                f"request {request.request_id!r} has {len(block_hashes)} block hashes at block size "
                f"{block_size}, fewer than the {num_full_blocks} full blocks to cache"
            )
        if num_full_blocks > len(blocks):
            raise RuntimeError(f"{num_full_blocks} full blocks to cache but the request holds {len(blocks)}")
        cdef bint events = self.enable_kv_cache_events
        cdef list new_hashes = []
        cdef BlockHashToBlockMap cache = self.cached_block_hash_to_block
        cdef Py_ssize_t i
        cdef KVCacheBlock blk
        cdef bytes block_hash, key
        for i in range(num_cached_blocks, num_full_blocks):
            blk = <KVCacheBlock>PyList_GET_ITEM(blocks, i)
            if blk.is_null:
                continue
            assert blk._block_hash is None, "The block already has a hash. This should not happen."
            block_hash = block_hashes[i]
            key = _group_key(block_hash, kv_cache_group_id)
            blk._block_hash = key
            blk.block_hash_num_tokens = (i + 1) * block_size
            cache.insert(key, blk)
            if events:
                new_hashes.append(self._ext(block_hash))
        if events:
            parent = None if num_cached_blocks == 0 else self._ext(block_hashes[num_cached_blocks - 1])
            extra_keys_list = []
            mm_idx = 0
            for i in range(num_cached_blocks, num_full_blocks):
                if (<KVCacheBlock>blocks[i]).is_null:
                    continue
                start = i * block_size
                keys, mm_idx = generate_block_hash_extra_keys(request, start, start + block_size, mm_idx)
                extra_keys_list.append(untag_extra_keys(keys))
            self.kv_event_queue.append(
                self._block_stored(
                    request, new_hashes, parent, num_cached_blocks * block_size,
                    num_full_blocks * block_size, block_size, kv_cache_group_id, extra_keys_list,
                )
            )

    cdef object _block_stored(self, request, list hashes, parent, Py_ssize_t start, Py_ssize_t end,
                              Py_ssize_t block_size, Py_ssize_t group_id, list extra_keys_list):
        lora = request.lora_request
        return BlockStored(
            block_hashes=hashes,
            parent_block_hash=parent,
            token_ids=request.all_token_ids[start:end],
            block_size=block_size,
            lora_id=lora.lora_int_id if lora is not None else None,
            medium=MEDIUM_GPU,
            lora_name=lora.lora_name if lora is not None else None,
            extra_keys=extra_keys_list if extra_keys_list else None,
            group_idx=group_id,
        )

    def emit_cached_block_events(self, request, Py_ssize_t num_cached_blocks, Py_ssize_t block_size,
                                 Py_ssize_t kv_cache_group_id):
        """Queue a ``BlockStored`` for a prefix hit of ``num_cached_blocks`` blocks (no state change)."""
        if not self.enable_kv_cache_events or num_cached_blocks == 0:
            return
        block_hashes = resolve_block_hashes(request.block_hashes, self.hash_block_size, block_size)
        hashes = []
        extra_keys_list = []
        mm_idx = 0
        for i in range(num_cached_blocks):
            hashes.append(self._ext(block_hashes[i]))
            start = i * block_size
            keys, mm_idx = generate_block_hash_extra_keys(request, start, start + block_size, mm_idx)
            extra_keys_list.append(untag_extra_keys(keys))
        self.kv_event_queue.append(
            self._block_stored(
                request, hashes, None, 0, num_cached_blocks * block_size, block_size,
                kv_cache_group_id, extra_keys_list,
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
        cdef list ret = self.free_block_queue.popleft_n(num_blocks)
        cdef Py_ssize_t i
        cdef KVCacheBlock block
        if self.enable_caching:
            for i in range(num_blocks):
                block = <KVCacheBlock>PyList_GET_ITEM(ret, i)
                if block._block_hash is not None:
                    self._maybe_evict_cached_block(block)
                block.ref_cnt += 1
        else:
            for i in range(num_blocks):
                (<KVCacheBlock>PyList_GET_ITEM(ret, i)).ref_cnt += 1
        return ret

    cdef bint _maybe_evict_cached_block(self, KVCacheBlock block) except -1:
        cdef object key = block._block_hash
        if key is None:
            return False
        if self.cached_block_hash_to_block.pop(key, block.block_id) is None:
            return False
        block._block_hash = None
        block.block_hash_num_tokens = None
        self.num_evictions += 1
        if self.enable_kv_cache_events:
            self.kv_event_queue.append(
                BlockRemoved(
                    block_hashes=[self._ext(key[:len(key) - 4])],
                    medium=MEDIUM_GPU,
                    group_idx=int.from_bytes(key[len(key) - 4:], "big"),
                )
            )
        return True

    def evict_blocks(self, block_ids):
        """Drop the cache keys of the given blocks (they stay where they are)."""
        for block_id in block_ids:
            if isinstance(block_id, bool) or not isinstance(block_id, int):
                raise TypeError(f"block ids must be ints, got {type(block_id).__name__}")
            if not 0 <= block_id < self.num_gpu_blocks:
                raise ValueError(f"block id {block_id} is outside the pool of {self.num_gpu_blocks}")
        for block_id in block_ids:
            self._maybe_evict_cached_block(<KVCacheBlock>self.blocks[block_id])

    def touch(self, blocks):
        """Take a reference on cache-hit blocks, unlinking free ones from the queue."""
        if blocks and not isinstance(blocks[0], KVCacheBlock):
            for group in blocks:
                self.touch(group)
            return
        self._touch(list(blocks))

    cdef int _touch(self, list blocks) except -1:
        cdef FreeKVCacheBlockQueue queue = self.free_block_queue
        cdef Py_ssize_t i, n = PyList_GET_SIZE(blocks)
        cdef KVCacheBlock block
        for i in range(n):
            block = <KVCacheBlock>PyList_GET_ITEM(blocks, i)
            if block.is_null:
                continue
            if block.ref_cnt == 0:
                queue.remove(block)
            block.ref_cnt += 1
        return 0

    def free_blocks(self, ordered_blocks):
        """Drop one reference on each block, in eviction order.

        A block reaching 0 goes to the tail of the free queue if it is cached
        (LRU) and to the head if not (reused first); each batch keeps the
        given order.
        """
        cdef list blocks_list = list(ordered_blocks)
        cdef KVCacheBlock block
        for block in blocks_list:
            pass
        self._free_blocks(blocks_list)

    cdef int _free_blocks(self, list blocks_list) except -1:
        cdef Py_ssize_t i, n = PyList_GET_SIZE(blocks_list)
        cdef KVCacheBlock block
        for i in range(n):
            block = <KVCacheBlock>PyList_GET_ITEM(blocks_list, i)
            if not block.is_null and block.ref_cnt <= 0:
                raise RuntimeError(f"block {block.block_id} freed more times than it was taken")
        cdef list to_tail = []
        cdef list to_head = []
        cdef bint caching = self.enable_caching
        for i in range(n):
            block = <KVCacheBlock>PyList_GET_ITEM(blocks_list, i)
            if block.is_null:
                continue
            block.ref_cnt -= 1
            if block.ref_cnt == 0:
                if caching and block._block_hash is not None:
                    to_tail.append(block)
                else:
                    to_head.append(block)
        self.free_block_queue.append_n(to_tail)
        self.free_block_queue.prepend_n(to_head)
        return 0

    def reset_prefix_cache(self):
        """Drop every cache key; only when no block but the null block is in use."""
        cdef Py_ssize_t num_used_blocks = self.num_gpu_blocks - self.free_block_queue.num_free_blocks
        if num_used_blocks != 1:
            logger.warning(
                "Failed to reset prefix cache because some blocks (%d) are not freed yet",
                num_used_blocks - 1,
            )
            return False
        self.cached_block_hash_to_block = BlockHashToBlockMap()
        cdef KVCacheBlock block
        for block in self.blocks:
            block._block_hash = None
            block.block_hash_num_tokens = None
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


# =============================================================================
# Single-type managers
# =============================================================================
cdef class SingleTypeKVCacheManager:
    """Block bookkeeping for one KV-cache group of one attention type."""

    cdef public object kv_cache_spec
    cdef public Py_ssize_t block_size
    cdef public BlockPool block_pool
    cdef public bint enable_caching
    cdef public Py_ssize_t kv_cache_group_id
    cdef public Py_ssize_t scheduler_block_size
    cdef public object _max_admission_blocks_per_request
    cdef Py_ssize_t _cap
    cdef public bint use_eagle
    cdef public dict req_to_blocks
    cdef public dict num_cached_block
    cdef public KVCacheBlock _null_block

    def __init__(self, kv_cache_spec, BlockPool block_pool, enable_caching, Py_ssize_t kv_cache_group_id,
                 Py_ssize_t scheduler_block_size, max_admission_blocks_per_request=None):
        self.kv_cache_spec = kv_cache_spec
        self.block_size = kv_cache_spec.block_size
        self.block_pool = block_pool
        self.enable_caching = bool(enable_caching)
        self.kv_cache_group_id = kv_cache_group_id
        self.scheduler_block_size = scheduler_block_size
        self._max_admission_blocks_per_request = max_admission_blocks_per_request
        self._cap = -1 if max_admission_blocks_per_request is None else max_admission_blocks_per_request
        self.use_eagle = False
        self.req_to_blocks = {}
        self.num_cached_block = {}
        self._null_block = block_pool.null_block

    # -------------------------------------------------------------- counting
    cpdef Py_ssize_t get_num_skipped_tokens(self, Py_ssize_t num_computed_tokens):
        """Tokens before the attention window (their blocks can be freed)."""
        return 0

    cpdef Py_ssize_t get_num_blocks_to_allocate(
        self, str request_id, Py_ssize_t num_tokens, object new_computed_blocks,
        Py_ssize_t total_computed_tokens, Py_ssize_t num_local_computed_tokens,
        Py_ssize_t num_tokens_main_model, bint apply_admission_cap=False,
    ) except -1:
        """Blocks this group must take from the free pool to hold ``num_tokens``.

        Evictable cache hits (free, ref_cnt 0) count too: touching them takes
        them out of the free pool.
        """
        cdef Py_ssize_t num_required_blocks = _cdiv(num_tokens, self.block_size)
        if apply_admission_cap and self._cap >= 0 and self._cap < num_required_blocks:
            num_required_blocks = self._cap
        cdef PyObject* p = PyDict_GetItem(self.req_to_blocks, request_id)
        cdef Py_ssize_t num_req_blocks = 0 if p == NULL else PyList_GET_SIZE(<list>p)
        cdef Py_ssize_t n
        if request_id in self.num_cached_block:
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
        for i in range(skip_new, n_new_computed):
            blk = <KVCacheBlock>new_computed_blocks[i]
            if blk.ref_cnt == 0 and not blk.is_null:
                num_evictable += 1
        return num_new_blocks + num_evictable

    # -------------------------------------------------------------- allocation
    cpdef add_local_computed_blocks(self, str request_id, object new_computed_blocks,
                                    Py_ssize_t num_local_computed_tokens,
                                    Py_ssize_t num_external_computed_tokens):
        """Attach prefix-cache hits to a request that holds no blocks yet."""
        cdef list req_blocks = self.req_to_blocks.setdefault(request_id, [])
        assert not req_blocks
        cdef Py_ssize_t total = num_local_computed_tokens + num_external_computed_tokens
        cdef Py_ssize_t num_skipped_blocks = self.get_num_skipped_tokens(total) // self.block_size
        cdef list blocks = list(new_computed_blocks)
        if num_skipped_blocks > 0:
            blocks = blocks[num_skipped_blocks:]
        if self.enable_caching:
            self.block_pool._touch(blocks)
        if num_skipped_blocks > 0:
            req_blocks.extend([self._null_block] * num_skipped_blocks)
        req_blocks.extend(blocks)
        self.num_cached_block[request_id] = len(req_blocks)

    cpdef allocate_external_computed_blocks(self, str request_id, Py_ssize_t num_local_computed_tokens,
                                            Py_ssize_t num_external_computed_tokens):
        """New blocks for tokens a KV connector computed (after every group touched its hits)."""
        cdef Py_ssize_t total = num_local_computed_tokens + num_external_computed_tokens
        cdef Py_ssize_t num_skipped_tokens = self.get_num_skipped_tokens(total)
        if num_skipped_tokens > 0:
            num_external_computed_tokens = min(total - num_skipped_tokens, num_external_computed_tokens)
        if num_external_computed_tokens <= 0:
            return
        cdef list req_blocks = self.req_to_blocks.setdefault(request_id, [])
        req_blocks.extend(self.block_pool._get_new_blocks(_cdiv(total, self.block_size) - len(req_blocks)))

    cpdef list allocate_new_blocks(self, str request_id, Py_ssize_t num_tokens, Py_ssize_t num_tokens_main_model):
        """Give the request at least ``num_tokens`` slots; return the new blocks."""
        cdef PyObject* p = PyDict_GetItem(self.req_to_blocks, request_id)
        cdef list req_blocks
        if p == NULL:
            req_blocks = []
            self.req_to_blocks[request_id] = req_blocks
        else:
            req_blocks = <list>p
        cdef Py_ssize_t num_new_blocks = _cdiv(num_tokens, self.block_size) - PyList_GET_SIZE(req_blocks)
        if num_new_blocks <= 0:
            return []
        cdef list new_blocks = self.block_pool._get_new_blocks(num_new_blocks)
        req_blocks.extend(new_blocks)
        return new_blocks

    cpdef cache_blocks(self, request, Py_ssize_t num_tokens):
        """Cache the request's full blocks among its first ``num_tokens`` tokens."""
        cdef str request_id = request.request_id
        cdef PyObject* p = PyDict_GetItem(self.num_cached_block, request_id)
        cdef Py_ssize_t num_cached_blocks = 0 if p == NULL else <Py_ssize_t><object>p
        cdef Py_ssize_t num_full_blocks = num_tokens // self.block_size
        if num_cached_blocks >= num_full_blocks:
            return
        self.block_pool.cache_full_blocks(
            request, <list>self.req_to_blocks[request_id], num_cached_blocks, num_full_blocks,
            self.block_size, self.kv_cache_group_id,
        )
        self.num_cached_block[request_id] = num_full_blocks

    # -------------------------------------------------------------- freeing
    cpdef list pop_blocks_for_free(self, str request_id):
        self.num_cached_block.pop(request_id, None)
        return self.req_to_blocks.pop(request_id, [])

    cpdef free(self, str request_id):
        """Return the request's blocks to the pool, tail first."""
        cdef list blocks = self.pop_blocks_for_free(request_id)
        blocks.reverse()
        self.block_pool._free_blocks(blocks)

    cdef int _remove_blocks_in_range(self, str request_id, Py_ssize_t first_block, Py_ssize_t last_block) except -1:
        cdef PyObject* p = PyDict_GetItem(self.req_to_blocks, request_id)
        if p == NULL or first_block >= last_block:
            return 0
        cdef list blocks = <list>p
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

    cpdef remove_skipped_blocks(self, str request_id, Py_ssize_t processed_computed_tokens):
        """Free the blocks before the attention window, replacing them with the null block."""
        cdef Py_ssize_t num_skipped_tokens = self.get_num_skipped_tokens(processed_computed_tokens)
        if num_skipped_tokens <= 0:
            return
        self._remove_blocks_in_range(request_id, 0, num_skipped_tokens // self.block_size)

    def get_num_common_prefix_blocks(self, running_request_id):
        return 0

    cdef tuple _find_hit(self, object block_hashes, Py_ssize_t max_length, list group_ids,
                         bint drop_eagle_block, Py_ssize_t alignment_tokens):
        raise NotImplementedError

    @classmethod
    def find_longest_cache_hit(cls, block_hashes, max_length, kv_cache_group_ids, BlockPool block_pool,
                               kv_cache_spec, drop_eagle_block, alignment_tokens):
        """The longest prefix hit common to ``kv_cache_group_ids``: (blocks per group, tokens)."""
        cdef SingleTypeKVCacheManager probe = cls(kv_cache_spec, block_pool, True, 0,
                                                  alignment_tokens, None)
        return probe._find_hit(block_hashes, max_length, list(kv_cache_group_ids), drop_eagle_block,
                               alignment_tokens)


cdef class FullAttentionManager(SingleTypeKVCacheManager):
    """Full attention: every token's KV is kept until the request finishes."""

    cdef tuple _find_hit(self, object block_hashes, Py_ssize_t max_length, list group_ids,
                         bint drop_eagle_block, Py_ssize_t alignment_tokens):
        cdef BlockPool pool = self.block_pool
        cdef Py_ssize_t block_size = self.block_size
        hashes = resolve_block_hashes(block_hashes, pool.hash_block_size, block_size)
        cdef Py_ssize_t n_groups = len(group_ids)
        cdef Py_ssize_t max_blocks = _num_searchable_blocks(hashes, max_length, block_size)
        cdef Py_ssize_t i, g, n
        cdef list blocks0, cached
        cdef object blk
        cdef tuple computed
        if n_groups == 1:
            blocks0 = []
            gid = group_ids[0]
            for i in range(max_blocks):
                blk = pool._get_one(<bytes>hashes[i], gid)
                if blk is None:
                    break
                blocks0.append(blk)
            computed = (blocks0,)
        else:
            computed = tuple([[] for _ in range(n_groups)])
            for i in range(max_blocks):
                cached = pool.get_cached_block(<bytes>hashes[i], group_ids)
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
        blocks = self.req_to_blocks.get(running_request_id, [])
        num_requests = len(self.req_to_blocks)
        n = 0
        for block in blocks:
            if block.ref_cnt == num_requests:
                n += 1
            else:
                break
        return n


cdef class SlidingWindowManager(SingleTypeKVCacheManager):
    """Sliding-window attention: only the last ``sliding_window`` tokens are attended."""

    cdef public Py_ssize_t sliding_window

    def __init__(self, kv_cache_spec, *args, **kwargs):
        super().__init__(kv_cache_spec, *args, **kwargs)
        self.sliding_window = kv_cache_spec.sliding_window

    cdef tuple _find_hit(self, object block_hashes, Py_ssize_t max_length, list group_ids,
                         bint drop_eagle_block, Py_ssize_t alignment_tokens):
        cdef BlockPool pool = self.block_pool
        cdef Py_ssize_t block_size = self.block_size
        hashes = resolve_block_hashes(block_hashes, pool.hash_block_size, block_size)
        cdef Py_ssize_t needed = _cdiv(self.sliding_window - 1, block_size)
        if drop_eagle_block:
            needed += 1
        cdef Py_ssize_t max_blocks = _num_searchable_blocks(hashes, max_length, block_size)
        cdef Py_ssize_t n_groups = len(group_ids)
        cdef KVCacheBlock null = pool.null_block
        cdef tuple computed = tuple([[null] * max_blocks for _ in range(n_groups)])
        cdef Py_ssize_t contiguous = 0, i, g
        cdef bint found = False
        cdef object cached
        for i in range(max_blocks - 1, -1, -1):
            cached = pool.get_cached_block(<bytes>hashes[i], group_ids)
            if cached is not None:
                if contiguous == 0 and ((i + 1) * block_size) % alignment_tokens != 0:
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
        if drop_eagle_block and len(<list>computed[0]) > 0:
            for g in range(n_groups):
                (<list>computed[g]).pop()
        return computed, len(<list>computed[0]) * block_size

    cpdef Py_ssize_t get_num_skipped_tokens(self, Py_ssize_t num_computed_tokens):
        cdef Py_ssize_t n = num_computed_tokens - self.sliding_window + 1
        return n if n > 0 else 0


cdef class ChunkedLocalAttentionManager(SingleTypeKVCacheManager):
    """Chunked local attention: tokens attend only within their chunk."""

    cdef public Py_ssize_t attention_chunk_size

    def __init__(self, kv_cache_spec, *args, **kwargs):
        super().__init__(kv_cache_spec, *args, **kwargs)
        self.attention_chunk_size = kv_cache_spec.attention_chunk_size

    cdef tuple _find_hit(self, object block_hashes, Py_ssize_t max_length, list group_ids,
                         bint drop_eagle_block, Py_ssize_t alignment_tokens):
        if drop_eagle_block:
            raise ValueError("EAGLE is not supported with chunked local attention")
        cdef BlockPool pool = self.block_pool
        cdef Py_ssize_t block_size = self.block_size
        hashes = resolve_block_hashes(block_hashes, pool.hash_block_size, block_size)
        cdef Py_ssize_t chunk = self.attention_chunk_size
        cdef Py_ssize_t start_block = (max_length // chunk * chunk) // block_size
        cdef Py_ssize_t max_blocks = _num_searchable_blocks(hashes, max_length, block_size)
        cdef Py_ssize_t n_groups = len(group_ids)
        cdef KVCacheBlock null = pool.null_block
        cdef tuple computed = tuple([[null] * start_block for _ in range(n_groups)])
        cdef Py_ssize_t i, g, n
        cdef object cached
        for i in range(start_block, max_blocks):
            cached = pool.get_cached_block(<bytes>hashes[i], group_ids)
            if cached is None:
                break
            for g in range(n_groups):
                (<list>computed[g]).append(cached[g])
        n = len(<list>computed[0])
        while block_size != alignment_tokens and (n * block_size) % alignment_tokens != 0:
            for g in range(n_groups):
                (<list>computed[g]).pop()
            n -= 1
        return computed, n * block_size

    cpdef Py_ssize_t get_num_skipped_tokens(self, Py_ssize_t num_computed_tokens):
        return (num_computed_tokens // self.attention_chunk_size) * self.attention_chunk_size


cdef class MambaManager(SingleTypeKVCacheManager):
    """Mamba (plain mode): only the state after the last cached block is needed."""

    cdef tuple _find_hit(self, object block_hashes, Py_ssize_t max_length, list group_ids,
                         bint drop_eagle_block, Py_ssize_t alignment_tokens):
        cdef BlockPool pool = self.block_pool
        cdef Py_ssize_t block_size = self.block_size
        hashes = resolve_block_hashes(block_hashes, pool.hash_block_size, block_size)
        cdef Py_ssize_t max_blocks = _num_searchable_blocks(hashes, max_length, block_size)
        cdef Py_ssize_t n_groups = len(group_ids)
        cdef KVCacheBlock null = pool.null_block
        cdef tuple computed = tuple([[] for _ in range(n_groups)])
        cdef Py_ssize_t i, g
        cdef object cached
        for i in range(max_blocks - 1, -1, -1):
            if ((i + 1) * block_size) % alignment_tokens != 0:
                continue
            cached = pool.get_cached_block(<bytes>hashes[i], group_ids)
            if cached is not None:
                for g in range(n_groups):
                    (<list>computed[g]).extend([null] * i)
                    (<list>computed[g]).append(cached[g])
                break
        return computed, len(<list>computed[0]) * block_size

    cpdef Py_ssize_t get_num_skipped_tokens(self, Py_ssize_t num_computed_tokens):
        return num_computed_tokens - 1 if num_computed_tokens > 1 else 0


cdef class CrossAttentionManager(SingleTypeKVCacheManager):
    """Cross attention: a static allocation for the encoder tokens; never cached."""

    cdef tuple _find_hit(self, object block_hashes, Py_ssize_t max_length, list group_ids,
                         bint drop_eagle_block, Py_ssize_t alignment_tokens):
        raise ValueError("cross attention does not support prefix caching")

    cpdef cache_blocks(self, request, Py_ssize_t num_tokens):
        return None


spec_manager_map = {
    FullAttentionSpec: FullAttentionManager,
    SlidingWindowSpec: SlidingWindowManager,
    ChunkedLocalAttentionSpec: ChunkedLocalAttentionManager,
    MambaSpec: MambaManager,
    CrossAttentionSpec: CrossAttentionManager,
}


def _manager_class(spec):
    for klass in type(spec).__mro__:
        if klass in spec_manager_map:
            return spec_manager_map[klass]
    raise ValueError(f"no KV-cache manager for spec type {type(spec).__name__}")


def _admission_cap(spec, max_in_flight_tokens, max_model_len):
    if isinstance(spec, (SlidingWindowSpec, ChunkedLocalAttentionSpec)):
        return spec.max_admission_blocks_per_request(max_in_flight_tokens, max_model_len)
    return None


def get_manager_for_kv_cache_spec(kv_cache_spec, block_pool, enable_caching, kv_cache_group_id,
                                  scheduler_block_size, max_in_flight_tokens, max_model_len):
    klass = _manager_class(kv_cache_spec)
    return klass(
        kv_cache_spec,
        block_pool,
        enable_caching,
        kv_cache_group_id,
        scheduler_block_size,
        _admission_cap(kv_cache_spec, max_in_flight_tokens, max_model_len),
    )


# =============================================================================
# Coordinators
# =============================================================================
cdef class KVCacheCoordinator:
    """Drives the single-type managers of all KV-cache groups over one block pool."""

    cdef public object kv_cache_config
    cdef public Py_ssize_t max_model_len
    cdef public bint enable_caching
    cdef public Py_ssize_t scheduler_block_size
    cdef public Py_ssize_t hash_block_size
    cdef public BlockPool block_pool
    cdef public set eagle_group_ids
    cdef public tuple single_type_managers
    cdef public tuple _cross_attention
    cdef Py_ssize_t _n_managers
    cdef bint _any_cross

    def __init__(self, kv_cache_config, max_model_len, max_in_flight_tokens, use_eagle, enable_caching,
                 enable_kv_cache_events, scheduler_block_size, hash_block_size, use_int_block_hashes=None):
        groups = kv_cache_config.kv_cache_groups
        if scheduler_block_size % hash_block_size != 0 or any(
            scheduler_block_size % g.kv_cache_spec.block_size != 0 for g in groups
        ):
            raise ValueError(
                f"scheduler_block_size ({scheduler_block_size}) must be a multiple of "
                f"hash_block_size ({hash_block_size}) and of every group's block size "
                f"({[g.kv_cache_spec.block_size for g in groups]})"
            )
        self.kv_cache_config = kv_cache_config
        self.max_model_len = max_model_len
        self.enable_caching = enable_caching
        self.scheduler_block_size = scheduler_block_size
        self.hash_block_size = hash_block_size
        self.block_pool = BlockPool(
            kv_cache_config.num_blocks, enable_caching, hash_block_size, enable_kv_cache_events,
            use_int_block_hashes=use_int_block_hashes,
        )
        eagle_ids = {i for i, g in enumerate(groups) if getattr(g, "is_eagle_group", False)}
        if use_eagle and not eagle_ids:
            eagle_ids = set(range(len(groups)))
        self.eagle_group_ids = eagle_ids
        self.single_type_managers = tuple(
            get_manager_for_kv_cache_spec(
                g.kv_cache_spec, self.block_pool, enable_caching, i, scheduler_block_size,
                max_in_flight_tokens, max_model_len,
            )
            for i, g in enumerate(groups)
        )
        self._cross_attention = tuple(isinstance(m, CrossAttentionManager) for m in self.single_type_managers)
        self._n_managers = len(self.single_type_managers)
        self._any_cross = any(self._cross_attention)

    cpdef Py_ssize_t get_num_blocks_to_allocate(
        self, str request_id, Py_ssize_t num_tokens, tuple new_computed_blocks, Py_ssize_t num_encoder_tokens,
        Py_ssize_t total_computed_tokens, Py_ssize_t num_local_computed_tokens,
        Py_ssize_t num_tokens_main_model, bint apply_admission_cap=False,
    ) except -1:
        cdef Py_ssize_t total = 0, i
        cdef SingleTypeKVCacheManager manager
        for i in range(self._n_managers):
            manager = <SingleTypeKVCacheManager>self.single_type_managers[i]
            if self._any_cross and self._cross_attention[i]:
                total += manager.get_num_blocks_to_allocate(
                    request_id, num_encoder_tokens, (), 0, 0, num_encoder_tokens, apply_admission_cap
                )
            else:
                total += manager.get_num_blocks_to_allocate(
                    request_id, num_tokens, new_computed_blocks[i], total_computed_tokens,
                    num_local_computed_tokens, num_tokens_main_model, apply_admission_cap,
                )
        return total

    cpdef allocate_new_computed_blocks(self, str request_id, tuple new_computed_blocks,
                                       Py_ssize_t num_local_computed_tokens,
                                       Py_ssize_t num_external_computed_tokens):
        cdef SingleTypeKVCacheManager manager
        cdef Py_ssize_t i
        for manager in self.single_type_managers:
            if request_id in manager.num_cached_block:
                for blocks in new_computed_blocks:
                    if len(blocks):
                        raise RuntimeError(
                            f"request {request_id!r} already holds blocks; it cannot take new prefix-cache hits"
                        )
                return
        for i in range(self._n_managers):
            manager = <SingleTypeKVCacheManager>self.single_type_managers[i]
            manager.add_local_computed_blocks(
                request_id, new_computed_blocks[i], num_local_computed_tokens, num_external_computed_tokens
            )
        if num_external_computed_tokens > 0:
            for manager in self.single_type_managers:
                manager.allocate_external_computed_blocks(
                    request_id, num_local_computed_tokens, num_external_computed_tokens
                )

    cpdef tuple allocate_new_blocks(self, str request_id, Py_ssize_t num_tokens,
                                    Py_ssize_t num_tokens_main_model, Py_ssize_t num_encoder_tokens=0):
        cdef Py_ssize_t i
        cdef SingleTypeKVCacheManager manager
        if self._n_managers == 1 and not self._any_cross:
            manager = <SingleTypeKVCacheManager>self.single_type_managers[0]
            return (manager.allocate_new_blocks(request_id, num_tokens, num_tokens_main_model),)
        cdef list out = []
        for i in range(self._n_managers):
            manager = <SingleTypeKVCacheManager>self.single_type_managers[i]
            out.append(manager.allocate_new_blocks(
                request_id, num_encoder_tokens if self._cross_attention[i] else num_tokens,
                num_tokens_main_model,
            ))
        return tuple(out)

    cpdef cache_blocks(self, request, Py_ssize_t num_computed_tokens):
        cdef SingleTypeKVCacheManager manager
        for manager in self.single_type_managers:
            manager.cache_blocks(request, num_computed_tokens)

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

    cpdef remove_skipped_blocks(self, str request_id, Py_ssize_t processed_computed_tokens):
        cdef SingleTypeKVCacheManager manager
        for manager in self.single_type_managers:
            manager.remove_skipped_blocks(request_id, processed_computed_tokens)

    def get_blocks(self, request_id):
        return tuple(m.req_to_blocks.get(request_id) or [] for m in self.single_type_managers)

    cpdef bint holds(self, str request_id):
        """Whether the request holds blocks (had a successful allocation since its last free)."""
        cdef SingleTypeKVCacheManager manager
        for manager in self.single_type_managers:
            if request_id in manager.req_to_blocks:
                return True
        return False

    cpdef tuple find_longest_cache_hit(self, object block_hashes, Py_ssize_t max_cache_hit_length):
        raise NotImplementedError


cdef class KVCacheCoordinatorNoPrefixCache(KVCacheCoordinator):
    """Coordinator for prefix caching off: any number of groups, never a hit."""

    cdef public Py_ssize_t num_single_type_manager

    def __init__(self, kv_cache_config, max_model_len, max_in_flight_tokens, use_eagle,
                 enable_kv_cache_events, scheduler_block_size, hash_block_size, use_int_block_hashes=None):
        super().__init__(kv_cache_config, max_model_len, max_in_flight_tokens, use_eagle, False,
                         enable_kv_cache_events, scheduler_block_size, hash_block_size, use_int_block_hashes)
        self.num_single_type_manager = len(self.single_type_managers)

    def get_num_common_prefix_blocks(self, running_request_id):
        return [0] * self.num_single_type_manager

    cpdef tuple find_longest_cache_hit(self, object block_hashes, Py_ssize_t max_cache_hit_length):
        return tuple([[] for _ in range(self.num_single_type_manager)]), 0, 0


cdef class UnitaryKVCacheCoordinator(KVCacheCoordinator):
    """Coordinator for exactly one KV-cache group with prefix caching on."""

    cdef public object kv_cache_spec
    cdef public Py_ssize_t block_size
    cdef public bint use_eagle
    cdef SingleTypeKVCacheManager _manager
    cdef list _group_ids

    def __init__(self, kv_cache_config, max_model_len, max_in_flight_tokens, use_eagle, enable_caching,
                 enable_kv_cache_events, scheduler_block_size, hash_block_size, use_int_block_hashes=None):
        super().__init__(kv_cache_config, max_model_len, max_in_flight_tokens, use_eagle, enable_caching,
                         enable_kv_cache_events, scheduler_block_size, hash_block_size, use_int_block_hashes)
        if len(kv_cache_config.kv_cache_groups) != 1:
            raise ValueError("UnitaryKVCacheCoordinator assumes only one kv cache group")
        self.kv_cache_spec = kv_cache_config.kv_cache_groups[0].kv_cache_spec
        self._manager = <SingleTypeKVCacheManager>self.single_type_managers[0]
        self.block_size = self._manager.block_size
        if enable_caching and hash_block_size != self.block_size:
            raise ValueError(
                "UnitaryKVCacheCoordinator assumes hash_block_size == block_size "
                f"(got hash_block_size={hash_block_size}, block_size={self.block_size})"
            )
        self.use_eagle = 0 in self.eagle_group_ids
        self._manager.use_eagle = self.use_eagle
        self._group_ids = [0]
        if self.use_eagle and isinstance(self.kv_cache_spec, ChunkedLocalAttentionSpec):
            raise ValueError("Hybrid KV cache is not supported for eagle + chunked local attention.")

    cpdef tuple find_longest_cache_hit(self, object block_hashes, Py_ssize_t max_cache_hit_length):
        cdef tuple res = self._manager._find_hit(block_hashes, max_cache_hit_length, self._group_ids,
                                                 self.use_eagle, self.block_size)
        return res[0], res[1], 0


cdef class HybridKVCacheCoordinator(KVCacheCoordinator):
    """Coordinator for several KV-cache groups (e.g. full + sliding window).

    Groups with equal specs are looked up together; full attention goes first
    (its left-to-right scan bounds the others), and the candidate length is
    shrunk until every group accepts it.
    """

    cdef public list attention_groups
    cdef bint _is_simple_hybrid

    def __init__(self, kv_cache_config, max_model_len, max_in_flight_tokens, use_eagle, enable_caching,
                 enable_kv_cache_events, scheduler_block_size, hash_block_size, use_int_block_hashes=None):
        super().__init__(kv_cache_config, max_model_len, max_in_flight_tokens, use_eagle, enable_caching,
                         enable_kv_cache_events, scheduler_block_size, hash_block_size, use_int_block_hashes)
        for manager in self.single_type_managers:
            if manager.block_size % hash_block_size != 0:
                raise ValueError(
                    f"every group's block size must be a multiple of hash_block_size "
                    f"({hash_block_size}); got {manager.block_size}"
                )
        if self.eagle_group_ids and any(
            isinstance(g.kv_cache_spec, ChunkedLocalAttentionSpec) for g in kv_cache_config.kv_cache_groups
        ):
            raise ValueError("Hybrid KV cache is not supported for eagle + chunked local attention.")
        self.verify_and_split_kv_cache_groups()

    def verify_and_split_kv_cache_groups(self):
        """Batch groups with identical specs; full attention first."""
        groups = []
        for i, g in enumerate(self.kv_cache_config.kv_cache_groups):
            spec = g.kv_cache_spec
            if isinstance(spec, CrossAttentionSpec):
                continue
            klass = type(self.single_type_managers[i])
            use_eagle = i in self.eagle_group_ids
            for entry in groups:
                if entry[0] == spec:
                    entry[1].append(i)
                    entry[3] = entry[3] or use_eagle
                    break
            else:
                groups.append([spec, [i], klass, use_eagle])
        if not groups:
            raise ValueError("HybridKVCacheCoordinator requires at least one cacheable group")
        groups.sort(key=lambda e: not isinstance(e[0], FullAttentionSpec))
        self.attention_groups = [tuple(e) for e in groups]
        for spec, ids, klass, use_eagle in self.attention_groups:
            if use_eagle:
                for gid in ids:
                    self.single_type_managers[gid].use_eagle = True
        self._is_simple_hybrid = len(groups) == 2 and isinstance(groups[0][0], FullAttentionSpec)

    cpdef cache_blocks(self, request, Py_ssize_t num_computed_tokens):
        cdef Py_ssize_t aligned = num_computed_tokens // self.scheduler_block_size * self.scheduler_block_size
        cdef Py_ssize_t n
        cdef SingleTypeKVCacheManager manager
        for manager in self.single_type_managers:
            n = aligned
            if manager.use_eagle and aligned > 0:
                n = min(num_computed_tokens, aligned + manager.block_size)
            manager.cache_blocks(request, n)

    cpdef tuple find_longest_cache_hit(self, object block_hashes, Py_ssize_t max_cache_hit_length):
        cdef Py_ssize_t num_groups = len(self.kv_cache_config.kv_cache_groups)
        cdef Py_ssize_t hit_length = max_cache_hit_length
        cdef Py_ssize_t longest = 0, curr, max_len, new_len, first, idx, n
        cdef list blocks_by_group = [None] * num_groups
        cdef list length_by_group = [0] * num_groups
        cdef Py_ssize_t alignment = self.scheduler_block_size
        cdef set eagle_verified = set()
        cdef tuple managers = self.single_type_managers
        cdef SingleTypeKVCacheManager first_manager
        cdef bint drop, is_full
        cdef tuple res
        while True:
            curr = hit_length
            for idx in range(len(self.attention_groups)):
                spec, group_ids, klass, use_eagle = self.attention_groups[idx]
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
                    max_len = min(curr + first_manager.block_size, max_cache_hit_length)
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
        for spec, group_ids, klass, use_eagle in self.attention_groups:
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


def get_kv_cache_coordinator(kv_cache_config, max_model_len, max_in_flight_tokens, use_eagle, enable_caching,
                             enable_kv_cache_events, scheduler_block_size, hash_block_size,
                             use_int_block_hashes=None):
    if not enable_caching:
        return KVCacheCoordinatorNoPrefixCache(
            kv_cache_config, max_model_len, max_in_flight_tokens, use_eagle,
            enable_kv_cache_events, scheduler_block_size, hash_block_size, use_int_block_hashes,
        )
    if len(kv_cache_config.kv_cache_groups) == 1:
        return UnitaryKVCacheCoordinator(
            kv_cache_config, max_model_len, max_in_flight_tokens, use_eagle, enable_caching,
            enable_kv_cache_events, scheduler_block_size, hash_block_size, use_int_block_hashes,
        )
    return HybridKVCacheCoordinator(
        kv_cache_config, max_model_len, max_in_flight_tokens, use_eagle, enable_caching,
        enable_kv_cache_events, scheduler_block_size, hash_block_size, use_int_block_hashes,
    )


# =============================================================================
# KVCacheBlocks and the manager
# =============================================================================
@cython.freelist(32)
cdef class KVCacheBlocks:
    """Blocks per KV-cache group: what allocate_slots / get_computed_blocks return.

    ``blocks[i][j]`` is the j-th block of group i.
    """

    cdef public tuple blocks

    def __init__(self, tuple blocks):
        self.blocks = blocks

    def __add__(self, KVCacheBlocks other):
        return KVCacheBlocks(tuple([list(a) + list(b) for a, b in zip(self.blocks, other.blocks)]))

    def __eq__(self, other):
        if not isinstance(other, KVCacheBlocks):
            return NotImplemented
        return self.get_block_ids() == other.get_block_ids()

    __hash__ = None

    def get_block_ids(self, allow_none=False):
        """Block ids per group (``None`` with ``allow_none`` when there are none)."""
        cdef object group
        cdef KVCacheBlock blk
        if allow_none and all(len(g) == 0 for g in self.blocks):
            return None
        out = []
        for group in self.blocks:
            out.append([blk.block_id for blk in group])
        return tuple(out)

    def get_unhashed_block_ids(self):
        if len(self.blocks) != 1:
            raise ValueError("get_unhashed_block_ids supports exactly one group")
        return [b.block_id for b in self.blocks[0] if b.block_hash is None]

    def new_empty(self):
        return KVCacheBlocks(tuple([() for _ in range(len(self.blocks))]))

    def __repr__(self):
        return f"KVCacheBlocks({self.get_block_ids()})"


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
        log_stats: keep PrefixCacheStats (``make_prefix_cache_stats``).
        enable_kv_cache_events: queue KV events (``take_events``).
        watermark: fraction of all blocks kept free when admitting
            waiting / preempted requests while others are scheduled.
        use_int_block_hashes: publish event hashes as 64-bit ints (default:
            ``VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES``).
    """

    cdef public Py_ssize_t max_model_len
    cdef public bint enable_caching
    cdef public bint enable_kv_cache_events
    cdef public bint use_eagle
    cdef public bint log_stats
    cdef public object metrics_collector
    cdef public object prefix_cache_stats
    cdef public KVCacheCoordinator coordinator
    cdef public Py_ssize_t num_kv_cache_groups
    cdef public BlockPool block_pool
    cdef public object kv_cache_config
    cdef public Py_ssize_t watermark_blocks
    cdef public tuple kv_cache_event_metadata
    cdef public KVCacheBlocks empty_kv_cache_blocks
    cdef public tuple _group_block_sizes
    cdef dict __dict__

    def __init__(self, kv_cache_config, max_model_len, scheduler_block_size, hash_block_size,
                 max_in_flight_tokens=None, enable_caching=True, use_eagle=False, log_stats=False,
                 enable_kv_cache_events=False, dcp_world_size=1, pcp_world_size=1, metrics_collector=None,
                 watermark=0.0, use_int_block_hashes=None):
        for name, value in (("max_model_len", max_model_len), ("scheduler_block_size", scheduler_block_size),
                            ("hash_block_size", hash_block_size)):
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ValueError(f"{name} must be a positive int, got {value!r}")
        if dcp_world_size != 1 or pcp_world_size != 1:
            raise ValueError("decode/prefill context parallelism is not supported (dcp/pcp world size must be 1)")
        if not 0.0 <= float(watermark) < 1.0:
            raise ValueError(f"watermark must be in [0, 1), got {watermark!r}")
        if max_in_flight_tokens is None:
            max_in_flight_tokens = max_model_len
        if not kv_cache_config.kv_cache_groups and enable_caching:
            enable_caching = False
        self.max_model_len = max_model_len
        self.enable_caching = bool(enable_caching)
        self.enable_kv_cache_events = bool(enable_kv_cache_events)
        self.use_eagle = bool(use_eagle)
        self.log_stats = bool(log_stats)
        self.metrics_collector = metrics_collector
        self.prefix_cache_stats = PrefixCacheStats() if log_stats else None
        self.coordinator = get_kv_cache_coordinator(
            kv_cache_config, max_model_len, max_in_flight_tokens, self.use_eagle,
            self.enable_caching, self.enable_kv_cache_events, scheduler_block_size,
            hash_block_size, use_int_block_hashes,
        )
        self.num_kv_cache_groups = len(kv_cache_config.kv_cache_groups)
        self.block_pool = self.coordinator.block_pool
        self.kv_cache_config = kv_cache_config
        self.watermark_blocks = int(watermark * kv_cache_config.num_blocks)
        self.kv_cache_event_metadata = tuple(
            (get_kv_cache_spec_kind(g.kv_cache_spec).value, get_kv_cache_spec_sliding_window(g.kv_cache_spec))
            for g in kv_cache_config.kv_cache_groups
        )
        self.empty_kv_cache_blocks = KVCacheBlocks(tuple([() for _ in range(self.num_kv_cache_groups)]))
        self._group_block_sizes = tuple(g.kv_cache_spec.block_size for g in kv_cache_config.kv_cache_groups)

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

    # ------------------------------------------------------------------ lookups
    def get_computed_blocks(self, request):
        """The longest prefix-cache hit for a request; changes no reference counts.

        Returns:
            ``(blocks, num_computed_tokens, shared_prefix_boundary)``.  The hit
            never covers the request's last token.
        """
        if not self.enable_caching or request.skip_reading_prefix_cache:
            return self.empty_kv_cache_blocks, 0, 0
        cdef Py_ssize_t max_cache_hit_length = request.num_tokens - 1
        cdef tuple res = self.coordinator.find_longest_cache_hit(request.block_hashes, max_cache_hit_length)
        cdef tuple computed_blocks = res[0]
        cdef Py_ssize_t num_new_computed_tokens = res[1]
        cdef Py_ssize_t num_uncached = res[2]
        if self.log_stats:
            self.prefix_cache_stats.record(
                num_tokens=request.num_tokens,
                num_hits=num_new_computed_tokens,
                preempted=request.num_preemptions > 0,
            )
        if (
            num_new_computed_tokens > 0
            and self.enable_kv_cache_events
            and request.kv_cache_report_mode == "full"
        ):
            for group_idx, group_blocks in enumerate(computed_blocks):
                if group_blocks:
                    self.block_pool.emit_cached_block_events(
                        request, len(group_blocks), self._group_block_sizes[group_idx], group_idx
                    )
        boundary = num_new_computed_tokens + num_uncached if num_uncached else 0
        return self.create_kv_cache_blocks(computed_blocks), num_new_computed_tokens, boundary

    # ------------------------------------------------------------------ allocation
    def allocate_slots(self, request, num_new_tokens, num_new_computed_tokens=0, new_computed_blocks=None,
                       num_lookahead_tokens=0, num_external_computed_tokens=0, delay_cache_blocks=False,
                       num_encoder_tokens=0, full_sequence_must_fit=False, reserved_blocks=0,
                       has_scheduled_reqs=True):
        """Add slots for ``num_new_tokens`` (+ lookahead) tokens of a request.

        Returns the newly allocated blocks per group, or ``None`` -- with
        nothing allocated or touched -- when the pool cannot hold them.

        Raises:
            ValueError: a negative count; no tokens at all; more tokens than
                ``max_model_len``; prefix hits handed to a running request.
            TypeError: a count that is not an int.
        """
        cdef Py_ssize_t n_new = _check_count("num_new_tokens", num_new_tokens)
        cdef Py_ssize_t n_new_comp = _check_count("num_new_computed_tokens", num_new_computed_tokens)
        cdef Py_ssize_t n_look = _check_count("num_lookahead_tokens", num_lookahead_tokens)
        cdef Py_ssize_t n_ext = _check_count("num_external_computed_tokens", num_external_computed_tokens)
        cdef Py_ssize_t n_enc = _check_count("num_encoder_tokens", num_encoder_tokens)
        cdef Py_ssize_t n_reserved = _check_count("reserved_blocks", reserved_blocks)
        if n_new == 0 and n_new_comp == 0 and n_ext == 0:
            raise ValueError(
                "num_new_tokens must be greater than 0 when there are no new computed or external computed tokens"
            )
        cdef str request_id = request.request_id
        cdef Py_ssize_t num_computed = request.num_computed_tokens
        cdef Py_ssize_t num_local_computed_tokens = num_computed + n_new_comp
        if num_local_computed_tokens + n_ext + n_new > self.max_model_len:
            raise ValueError(
                f"request {request_id!r}: {num_computed} computed + {n_new_comp} new computed + "
                f"{n_ext} external + {n_new} new tokens exceed "
                f"max_model_len={self.max_model_len}"
            )
        cdef tuple new_blocks_list
        cdef bint has_new_computed
        cdef KVCacheCoordinator coordinator = self.coordinator
        cdef object g
        if new_computed_blocks is None:
            new_blocks_list = self.empty_kv_cache_blocks.blocks
            has_new_computed = False
        else:
            new_blocks_list = (<KVCacheBlocks?>new_computed_blocks).blocks
            has_new_computed = False
            for g in new_blocks_list:
                if g:
                    has_new_computed = True
                    break
            if not has_new_computed:
                new_blocks_list = self.empty_kv_cache_blocks.blocks
            else:
                if len(new_blocks_list) != self.num_kv_cache_groups:
                    raise ValueError(
                        f"new_computed_blocks has {len(new_blocks_list)} groups, the manager has "
                        f"{self.num_kv_cache_groups}"
                    )
                if coordinator.holds(request_id):
                    raise ValueError(
                        f"request {request_id!r} already holds blocks; new_computed_blocks is only for "
                        "a request's first allocation"
                    )

        cdef Py_ssize_t total_computed_tokens = num_local_computed_tokens + n_ext
        if total_computed_tokens > self.max_model_len:
            total_computed_tokens = self.max_model_len
        cdef Py_ssize_t watermark_blocks = 0
        status = request.status
        if has_scheduled_reqs and (status is _WAITING or status is _PREEMPTED):
            watermark_blocks = self.watermark_blocks
        cdef Py_ssize_t needed, full_num_tokens
        if full_sequence_must_fit:
            full_num_tokens = request.num_tokens
            if full_num_tokens > self.max_model_len:
                full_num_tokens = self.max_model_len
            needed = coordinator.get_num_blocks_to_allocate(
                request_id, full_num_tokens, new_blocks_list, n_enc,
                total_computed_tokens, num_local_computed_tokens, full_num_tokens, True,
            )
            if needed + watermark_blocks > self.block_pool.free_block_queue.num_free_blocks:
                return None

        cdef Py_ssize_t num_tokens_main_model = total_computed_tokens + n_new
        cdef Py_ssize_t num_tokens_need_slot = num_tokens_main_model + n_look
        if num_tokens_need_slot > self.max_model_len:
            num_tokens_need_slot = self.max_model_len
        cdef Py_ssize_t processed = total_computed_tokens - <Py_ssize_t>request.num_in_flight_tokens
        coordinator.remove_skipped_blocks(request_id, processed if processed > 0 else 0)
        needed = coordinator.get_num_blocks_to_allocate(
            request_id, num_tokens_need_slot, new_blocks_list, n_enc,
            num_local_computed_tokens + n_ext, num_local_computed_tokens, num_tokens_main_model, False,
        )
        if needed + watermark_blocks > self.block_pool.free_block_queue.num_free_blocks - n_reserved:
            return None
        if has_new_computed or n_ext > 0:
            coordinator.allocate_new_computed_blocks(
                request_id, new_blocks_list, num_local_computed_tokens, n_ext
            )
        cdef tuple new_blocks = coordinator.allocate_new_blocks(
            request_id, num_tokens_need_slot, num_tokens_main_model, n_enc
        )
        cdef Py_ssize_t n_cache, req_tokens
        if self.enable_caching and not delay_cache_blocks:
            n_cache = total_computed_tokens + n_new
            req_tokens = request.num_tokens
            coordinator.cache_blocks(request, n_cache if n_cache < req_tokens else req_tokens)
        return self.create_kv_cache_blocks(new_blocks)

    def free(self, request):
        """Free the request's blocks, tail first, group by group.

        Raises:
            ValueError: the request holds no blocks (unknown id, or freed already).
        """
        cdef str request_id = request.request_id
        if not self.coordinator.holds(request_id):
            raise ValueError(f"request {request_id!r} holds no blocks (unknown request id, or already freed)")
        self.coordinator.free(request_id)

    def remove_skipped_blocks(self, request_id, processed_computed_tokens):
        cdef Py_ssize_t n = _check_count("processed_computed_tokens", processed_computed_tokens)
        self.coordinator.remove_skipped_blocks(request_id, n)

    def pop_blocks_for_free(self, request):
        return self.coordinator.pop_blocks_for_free(request.request_id)

    def evict_blocks(self, block_ids):
        self.block_pool.evict_blocks(block_ids)

    def reset_prefix_cache(self):
        """Drop all cached hashes; False (and nothing changes) while blocks are in use."""
        if not self.block_pool.reset_prefix_cache():
            return False
        if self.log_stats:
            self.prefix_cache_stats.reset = True
        return True

    def get_num_common_prefix_blocks(self, running_request_id):
        return self.coordinator.get_num_common_prefix_blocks(running_request_id)

    def take_events(self):
        """Drain the KV events, annotated with each group's spec kind and window."""
        events = self.block_pool.take_events()
        meta = self.kv_cache_event_metadata
        for event in events:
            if type(event) is BlockStored and event.group_idx is not None and 0 <= event.group_idx < len(meta):
                event.kv_cache_spec_kind, event.kv_cache_spec_sliding_window = meta[event.group_idx]
        return events

    def get_blocks(self, request_id):
        """The request's whole block table per group.

        Raises:
            ValueError: the request holds no blocks.
        """
        if not self.coordinator.holds(request_id):
            raise ValueError(f"request {request_id!r} holds no blocks (unknown request id, or already freed)")
        return KVCacheBlocks(self.coordinator.get_blocks(request_id))

    def get_block_ids(self, request_id):
        return self.get_blocks(request_id).get_block_ids()

    def new_step_starts(self):
        return None
