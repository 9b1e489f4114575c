# kv_cache_c/kv_cache_utils_free_queue.pyx: FreeKVCacheBlockQueue: the free blocks in eviction order, kept as a
# ring of pointers, and its cycle-collector hooks.  (vLLM: vllm/v1/core/kv_cache_utils.py,
# FreeKVCacheBlockQueue.)
# Included into kvcy/_fast/_kv_cache_c.pyx (one extension module), not compiled on its own.

cdef uint32_t _last_queue_id = 0
# The _queue_id of a fake head or tail (no queue has it); its _pos holds its
# queue's id.  Batch loops thus see a fake end as another queue's block.
cdef uint32_t _FAKE_END_ID = 0xFFFFFFFF
cdef dict _QUEUE_REFS = {}  # queue id -> weakref.ref to that FreeKVCacheBlockQueue


cdef FreeKVCacheBlockQueue _queue_of(KVCacheBlock block):
    # The live queue the block was last put in (or is a fake end of), or None.
    cdef uint32_t queue_id = block._queue_id
    if queue_id == _FAKE_END_ID:
        queue_id = <uint32_t>block._pos
    if queue_id == 0:
        return None
    ref = _QUEUE_REFS.get(queue_id)
    if ref is None:
        return None
    return ref()  # (None once the queue is gone: no raw addresses are kept)


cdef bint _in_a_queue(KVCacheBlock block) except -1:
    # In a live free queue, or a fake end of one (off the hot paths).
    cdef FreeKVCacheBlockQueue queue = _queue_of(block)
    return queue is not None and (queue._holds(block) or queue._is_fake_end(block))


cdef int _set_block_key(KVCacheBlock block, object key) except -1:
    # (A module function, not a cdef method: KVCacheBlock has no vtable.)
    h, group = _split_key(key)
    cdef uint32_t gid = group
    block._hash = h
    block._group = gid
    block._key_h = <uint32_t>kvcy_key_hash(_PyBytes_AS_STRING_RAW(<PyObject*>h), len(h), gid)
    return 0


# (no_gc_clear stays on the definition: Cython does not take it from the .pxd.)
@cython.no_gc_clear
cdef class FreeKVCacheBlockQueue:
    """Queue of free blocks (a doubly linked list in vLLM).

    This twin keeps it as a ring of pointers.  A fake head and tail (``block_id == -1``) stand at the ends, as in vLLM.
    Order: head = next to allocate, tail = most recently freed.

    The blocks sit in one array, in queue order, at consecutive positions
    ``[_head, _tail)`` (a position maps to the array index ``pos & _mask``),
    so ``popleft_n`` copies pointers out of the array and ``append_n`` /
    ``prepend_n`` write them in, without following links through block
    objects scattered over the heap.  Removal from the middle (``touch`` of a
    cached free block) is O(1): it leaves a NULL hole, skipped when the head
    passes it and squeezed out when the array would otherwise grow.

    A block records the id of the queue it was last put in and its position
    there; it is in the queue iff that position is within ``[_head, _tail)``
    and the array holds that very block there, so a popped block needs no
    update, and a stale record (its queue gone, even its 32-bit id reused)
    can never pass.  Ids of live queues map to the queues in a module dict,
    used only off the hot paths (neighbour lookups, blocks that change
    queue).  The queue owns one reference to every block it holds.
    """

    def __cinit__(self, *args, **kwargs):
        global _last_queue_id
        cdef KVCacheBlock head = KVCacheBlock(-1)
        cdef KVCacheBlock tail = KVCacheBlock(-1)
        self._ring = <PyObject**>calloc(16, sizeof(PyObject*))
        if self._ring == NULL:
            raise MemoryError()
        self._mask = 15
        self._head = 0
        self._tail = 0
        self._holes = 0
        # A 32-bit id, reused once they wrap around (only live queues'
        # ids are taken): a stale id in a block is harmless, since membership
        # is decided by the array holding that very block.
        _last_queue_id += 1
        while _last_queue_id == 0 or _last_queue_id == _FAKE_END_ID or _last_queue_id in _QUEUE_REFS:
            _last_queue_id += 1
        _QUEUE_REFS[_last_queue_id] = _weakref(self)
        self._id = _last_queue_id
        head._queue_id = tail._queue_id = _FAKE_END_ID
        head._pos = tail._pos = self._id
        self.fake_free_list_head = head
        self.fake_free_list_tail = tail
        self.num_free_blocks = 0

    def __init__(self, list blocks not None):
        self._ensure_room(PyList_GET_SIZE(blocks))
        self.append_n(blocks)

    def __dealloc__(self):
        # Unregister first, so that nothing (a block subclass's __del__, say)
        # can find this queue, then drop the references.
        if self._id != 0 and _QUEUE_REFS is not None:  # None late in interpreter shutdown
            _QUEUE_REFS.pop(self._id, None)
        self._release_blocks()
        free(self._ring)
        self._ring = NULL

    cdef void _release_blocks(self) noexcept:
        # Empty the queue, then drop its references to the blocks (their
        # deallocation may run code: the queue is consistent by then).  For
        # __dealloc__ and the cycle collector's tp_clear.
        cdef PyObject **ring = self._ring
        cdef int64_t pos, head = self._head, tail = self._tail, mask = self._mask
        cdef PyObject *p
        if ring == NULL or head == tail:
            return
        for pos in range(head, tail):
            p = ring[pos & mask]
            if p != NULL:
                (<KVCacheBlock>p)._queue_id = 0
        self._head = self._tail = 0
        self._holes = 0
        self.num_free_blocks = 0
        for pos in range(head, tail):
            p = ring[pos & mask]
            ring[pos & mask] = NULL
            if p != NULL:
                Py_DECREF_RAW(p)

    # ------------------------------------------------------------------ the array
    cdef inline bint _holds(self, KVCacheBlock block) noexcept:
        """``block`` is in this queue (the fake ends are not)."""
        cdef int64_t pos = block._pos
        return (block._queue_id == self._id and self._head <= pos < self._tail
                and self._ring[pos & self._mask] == <PyObject*>block)

    cdef inline bint _is_fake_end(self, KVCacheBlock block) noexcept:
        return block is self.fake_free_list_head or block is self.fake_free_list_tail

    cdef int _ensure_room(self, Py_ssize_t extra) except -1:
        # Room for ``extra`` more entries past either end: squeeze out the
        # holes if they are half the span, else grow the array.  Either way
        # nothing observable changes, so callers run it before any change.
        cdef int64_t span = self._tail - self._head
        cdef int64_t cap = self._mask + 1
        cdef int64_t new_cap, pos
        cdef PyObject **ring
        if span + extra <= cap:
            return 0
        if self._holes * 2 >= span:
            self._compact()
            span = self._tail - self._head
            if span + extra <= cap:
                return 0
        if span + extra > (<int64_t>1 << 40):
            raise MemoryError(f"a free queue of {span + extra} entries is too large")
        new_cap = cap
        while new_cap < span + extra:
            new_cap *= 2
        ring = <PyObject**>calloc(new_cap, sizeof(PyObject*))
        if ring == NULL:
            raise MemoryError()
        for pos in range(self._head, self._tail):  # positions (so blocks' records) stay
            ring[pos & (new_cap - 1)] = self._ring[pos & self._mask]
        free(self._ring)
        self._ring = ring
        self._mask = new_cap - 1
        return 0

    cdef void _compact(self) noexcept:
        # Close the holes, moving later entries towards the head.
        cdef PyObject **ring = self._ring
        cdef int64_t mask = self._mask
        cdef int64_t r, w = self._head
        cdef PyObject *p
        for r in range(self._head, self._tail):
            p = ring[r & mask]
            if p != NULL:
                if w != r:
                    ring[w & mask] = p
                    (<KVCacheBlock>p)._pos = w
                w += 1
        self._tail = w
        self._holes = 0

    cdef void _drop_taken(self, int64_t start, Py_ssize_t count) noexcept:
        # Give back the references taken for entries written at
        # [start, start + count) outside [_head, _tail) (an unwound batch;
        # the caller still holds the blocks).
        cdef Py_ssize_t j
        for j in range(count):
            Py_DECREF_RAW(self._ring[(start + j) & self._mask])

    cdef object _neighbour(self, KVCacheBlock block, bint after):
        # The block before/after ``block`` here, a fake end, or None.
        cdef int64_t pos
        cdef PyObject *p
        if block is self.fake_free_list_head:
            if not after:
                return None
            pos = self._head - 1
        elif block is self.fake_free_list_tail:
            if after:
                return None
            pos = self._tail
        elif self._holds(block):
            pos = block._pos
        else:
            return None
        while True:
            pos += 1 if after else -1
            if pos < self._head:
                return self.fake_free_list_head
            if pos >= self._tail:
                return self.fake_free_list_tail
            p = self._ring[pos & self._mask]
            if p != NULL:
                return <object>p

    cdef int _queued_anywhere(self, KVCacheBlock block) except -1:
        # In this queue or another live one, or a fake end of either.
        cdef FreeKVCacheBlockQueue queue
        if block._queue_id == 0:
            return False
        if block._queue_id == self._id:
            return self._holds(block)
        queue = _queue_of(block)
        return queue is not None and (queue._holds(block) or queue._is_fake_end(block))

    # ------------------------------------------------------------------ queue operations
    cpdef KVCacheBlock popleft(self):
        """Pop the head block.

        Raises:
            ValueError: the queue is empty.
        """
        cdef PyObject *p = NULL
        while self._head < self._tail:
            p = self._ring[self._head & self._mask]
            self._head += 1
            if p != NULL:
                break
            self._holes -= 1
        if p == NULL:
            raise ValueError("No free blocks available")
        self.num_free_blocks -= 1
        cdef KVCacheBlock out = <KVCacheBlock>p  # takes a new reference
        Py_DECREF_RAW(p)  # ... so drop the queue's
        return out

    cpdef list popleft_n(self, Py_ssize_t n):
        """Pop ``n`` blocks from the head, in order.

        Raises:
            AssertionError: fewer than ``n`` blocks are free (vLLM's assertion).
            ValueError: ``n`` is negative.
        """
        if n < 0:
            raise ValueError(f"n must be non-negative, got {n}")
        if n > self.num_free_blocks:
            raise AssertionError(f"Cannot pop {n} blocks: only {self.num_free_blocks} are free")  # (vLLM asserts)
        return self._popleft_n(n)

    cdef list _popleft_n(self, Py_ssize_t n):
        # The caller checked 0 <= n <= num_free_blocks.  The queue's references
        # move into the returned list; the blocks themselves are not touched.
        if n > self._tail - self._head - self._holes:  # num_free_blocks is public: trust the array
            raise RuntimeError(f"the free queue holds {self._tail - self._head - self._holes} blocks, "
                               f"not num_free_blocks={self.num_free_blocks}")
        cdef list out = PyList_New(n)
        cdef PyObject **items = (<PyListObject*>out).ob_item
        cdef PyObject **ring = self._ring
        cdef int64_t mask = self._mask
        cdef int64_t pos = self._head
        cdef Py_ssize_t j = 0, first
        cdef PyObject *p
        if self._holes == 0:
            first = (mask + 1) - (pos & mask)  # entries before the array wraps
            if first > n:
                first = n
            memcpy(items, ring + (pos & mask), first * sizeof(PyObject*))
            memcpy(items + first, ring, (n - first) * sizeof(PyObject*))
            pos += n
            # The next pop most likely takes as many from here on: start
            # loading that part of the array (it is cold in a large pool).
            for j in range(0, n if n < 512 else 512, 8):
                kvcy_prefetch(ring + ((pos + j) & mask))
        else:
            while j < n:
                p = ring[pos & mask]
                pos += 1
                if p != NULL:
                    items[j] = p
                    j += 1
                else:
                    self._holes -= 1
        self._head = pos
        self.num_free_blocks -= n
        return out

    cdef void _prefetch_head(self, Py_ssize_t n) noexcept:
        # Start loading the first n blocks at the head (the next pop's, most
        # likely), skipping holes.
        cdef int64_t pos = self._head
        cdef int64_t end = self._tail if self._tail - pos < n else pos + n
        cdef PyObject *p
        while pos < end:
            p = self._ring[pos & self._mask]
            if p != NULL:
                kvcy_prefetch(p)
            pos += 1

    cpdef remove(self, KVCacheBlock block):
        """Unlink ``block`` from the middle of the queue.

        Raises:
            RuntimeError: the block is not in the queue.
        """
        if block is None:
            raise TypeError("free queue entries must be KVCacheBlock, got NoneType")
        self._remove(block)

    cdef inline int _remove(self, KVCacheBlock block) except -1:
        # remove() for a block (not None).
        if not self._holds(block):
            raise RuntimeError(f"remove() called on an invalid block: {block}")
        cdef PyObject **ring = self._ring
        cdef int64_t mask = self._mask
        cdef int64_t pos = block._pos
        ring[pos & mask] = NULL
        if pos == self._head:
            self._head += 1
            while self._head < self._tail and ring[self._head & mask] == NULL:
                self._head += 1
                self._holes -= 1
        elif pos == self._tail - 1:
            self._tail -= 1
            while self._tail > self._head and ring[(self._tail - 1) & mask] == NULL:
                self._tail -= 1
                self._holes -= 1
        else:
            self._holes += 1
        self.num_free_blocks -= 1
        Py_DECREF_RAW(<PyObject*>block)  # the queue's (the caller holds one)
        return 0

    cpdef append(self, KVCacheBlock block):
        """Put ``block`` at the tail (freed last, evicted last)."""
        if block is None:
            raise TypeError("free queue entries must be KVCacheBlock, got NoneType")
        if self._queued_anywhere(block):
            raise RuntimeError(f"block {block.block_id} is already in the free queue")
        if block._ref_cnt != 0:
            raise RuntimeError(f"block {block.block_id} has ref_cnt {block._ref_cnt}: only free blocks are queued")
        self._ensure_room(1)
        Py_INCREF_RAW(<PyObject*>block)
        self._ring[self._tail & self._mask] = <PyObject*>block
        block._queue_id = self._id
        block._pos = self._tail
        self._tail += 1
        self.num_free_blocks += 1

    cpdef append_n(self, list blocks):
        """Put ``blocks`` at the tail, in order (the last one ends up last)."""
        self._insert_n(blocks, False)

    cpdef prepend_n(self, list blocks):
        """Put ``blocks`` at the head, in order (``blocks[0]`` becomes the head)."""
        self._insert_n(blocks, True)

    cdef int _insert_n(self, list blocks, bint at_head) except -1:
        # Write the blocks, in order, just past the tail (or just before the
        # head), then move that end over them.  A bad element (not a block,
        # already queued, listed twice) gives back what was taken: nothing
        # changes.  Runs no Python code between the first write and the end.
        if blocks is None:
            raise TypeError("blocks must be a list, not None")
        cdef Py_ssize_t i, n = PyList_GET_SIZE(blocks)
        if n == 0:
            return 0
        self._ensure_room(n)
        cdef PyObject **items = (<PyListObject*>blocks).ob_item
        cdef PyObject **ring = self._ring
        cdef int64_t mask = self._mask
        cdef uint32_t my_id = self._id
        cdef int64_t head = self._head, tail = self._tail
        cdef int64_t base = head - n if at_head else tail
        cdef int64_t pos
        cdef PyObject *p
        cdef uint32_t qid
        cdef bint repeat, queued
        cdef int32_t held = 0
        for i in range(n):
            p = items[i]
            if not _is_block(p):
                self._drop_taken(base, i)
                raise TypeError(f"free queue entries must be KVCacheBlock, got {type(<object>p).__name__}")
            qid = (<KVCacheBlock>p)._queue_id
            if qid != 0:  # it was put in a queue once: is it there still?
                if qid == my_id:
                    # Here iff its position is in [head, tail) or, for an
                    # earlier element of this batch, in [base, base + i), and
                    # the array holds this very block there.
                    pos = (<KVCacheBlock>p)._pos
                    repeat = <uint64_t>(pos - base) < <uint64_t>i and ring[pos & mask] == p
                    queued = repeat or (<uint64_t>(pos - head) < <uint64_t>(tail - head)
                                        and ring[pos & mask] == p)
                else:
                    repeat = False
                    queued = self._queued_anywhere(<KVCacheBlock>p)
                if queued:
                    self._drop_taken(base, i)
                    if repeat:
                        raise RuntimeError(f"block {(<KVCacheBlock>p).block_id} appears twice in one batch")
                    raise RuntimeError(f"block {(<KVCacheBlock>p).block_id} is already in the free queue")
            held |= (<KVCacheBlock>p)._ref_cnt  # (checked once, after the loop)
            Py_INCREF_RAW(p)
            ring[(base + i) & mask] = p
            (<KVCacheBlock>p)._pos = base + i
            (<KVCacheBlock>p)._queue_id = my_id
        if kvcy_unlikely(held != 0):  # a block with references: only free blocks are queued
            return self._refuse_held(base, blocks)
        if at_head:
            self._head = base
        else:
            self._tail = base + n
        self.num_free_blocks += n
        return 0

    cdef int _refuse_held(self, int64_t base, list blocks) except -1:
        # _insert_n wrote all of `blocks` from `base` but one has references:
        # give the entries back (the queue's ends never moved) and say which.
        self._drop_taken(base, PyList_GET_SIZE(blocks))
        cdef KVCacheBlock block
        for block in blocks:
            if block._ref_cnt != 0:
                raise RuntimeError(f"block {block.block_id} has ref_cnt {block._ref_cnt}: only free blocks are queued")
        raise AssertionError("unreachable")

    def iter_blocks_after(self, cursor):
        """The free blocks in eviction order after ``cursor`` (from the head when it is
        None), as vLLM's generator walks them; nothing after a block that is not queued
        here or after the fake tail."""
        curr = self.fake_free_list_head if cursor is None else cursor
        tail = self.fake_free_list_tail
        while True:
            curr = curr.next_free_block
            if curr is None or curr is tail:
                return
            yield curr

    cpdef list get_all_free_blocks(self):
        """All free blocks from head to tail (for tests and checks)."""
        cdef list out = []
        cdef int64_t pos
        cdef PyObject *p
        for pos in range(self._head, self._tail):
            p = self._ring[pos & self._mask]
            if p != NULL:
                out.append(<object>p)
        return out

    def __len__(self):
        return self.num_free_blocks


# The cycle collector sees what the queue's ring and the map's table hold
# (C arrays, which Cython's generated tp_traverse / tp_clear do not know):
# a block subclass whose instance refers back to its queue or map forms a
# cycle that is found and broken like any other.


cdef traverseproc _queue_base_traverse = (<PyTypeObject*>FreeKVCacheBlockQueue).tp_traverse


cdef int _queue_traverse(PyObject *o, visitproc visit, void *arg) except -1:
    cdef int r = _queue_base_traverse(o, visit, arg) if _queue_base_traverse != NULL else 0
    if r != 0:
        return r
    cdef PyObject **ring = (<FreeKVCacheBlockQueue>o)._ring
    cdef int64_t pos, mask = (<FreeKVCacheBlockQueue>o)._mask
    cdef PyObject *p
    if ring == NULL:
        return 0
    for pos in range((<FreeKVCacheBlockQueue>o)._head, (<FreeKVCacheBlockQueue>o)._tail):
        p = ring[pos & mask]
        if p != NULL:
            r = visit(p, arg)
            if r != 0:
                return r
    return 0


cdef int _queue_clear(object o) except -1:
    (<FreeKVCacheBlockQueue>o)._release_blocks()
    return 0


(<PyTypeObject*>FreeKVCacheBlockQueue).tp_traverse = _queue_traverse
(<PyTypeObject*>FreeKVCacheBlockQueue).tp_clear = _queue_clear
