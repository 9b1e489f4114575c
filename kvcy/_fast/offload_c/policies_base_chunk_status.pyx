# offload_c/policies_base_chunk_status.pyx: ChunkStatus, one chunk's state, and the intrusive lists (_Node,
# _DList) that chain chunks and ARC's ghosts.  (vLLM: vllm/v1/kv_offload/cpu/policies/base.py.)
# Included into kvcy/_fast/_offload_c.pyx (one extension module), not compiled on its own.

# _Node, ChunkStatus and _DList are not tracked by the cycle collector: a
# node refers only to its key (bytes) and its neighbours, and those links are
# broken whenever it leaves a list (unlink, clear, and a list's __dealloc__).
# Untracked, the hundreds of thousands of chunks of a large tier cost nothing
# in each collection, and making one does not count toward the next.
# (no_gc stays on the definitions: Cython does not take it from the .pxd.)
@cython.no_gc
cdef class _Node:
    """A link of an intrusive doubly linked list (ARC's lists and ghosts)."""


cdef inline bint _is_ghost(_Node n) noexcept:
    """An ARC ghost (in b1 or b2): a plain _Node, never a ChunkStatus."""
    return n.where == 3 or n.where == 4


@cython.no_gc
cdef class _DList:
    """An intrusive doubly linked list of _Node, oldest first."""

    def __dealloc__(self):
        # unlink every node (iteratively: no deep chain of deallocations, and
        # no cycle of nodes left behind for a collector that cannot see them)
        self.clear()

    cdef inline void append(self, _Node n) noexcept:
        n.prev = self.tail
        n.next = None
        if self.tail is None:
            self.head = n
        else:
            self.tail.next = n
        self.tail = n
        self.size += 1

    cdef inline void unlink(self, _Node n) noexcept:
        if n.prev is None:
            self.head = n.next
        else:
            n.prev.next = n.next
        if n.next is None:
            self.tail = n.prev
        else:
            n.next.prev = n.prev
        n.prev = None
        n.next = None
        self.size -= 1

    cdef void clear(self) noexcept:
        cdef _Node n = self.head
        cdef _Node nxt
        while n is not None:
            nxt = n.next
            n.prev = None
            n.next = None
            n.where = 0
            n = nxt
        self.head = None
        self.tail = None
        self.size = 0


@cython.no_gc
cdef class ChunkStatus(_Node):
    """One chunk of the CPU cache and how it is used.

    ``ref_cnt`` is ``-1`` while the chunk is being written (after
    ``prepare_store``, before ``complete_store``), ``0`` when it is readable and
    may be evicted, and ``k > 0`` while ``k`` loads are reading it.

    Args:
        chunk_id: the chunk's number, ``0 .. num_chunks - 1``.
    """

    def __init__(self, chunk_id):
        self.chunk_id = _check_int("chunk_id", chunk_id)
        self.ref_cnt = -1

    @property
    def is_ready(self):
        """Whether the chunk's data is written (it can be read)."""
        return self.ref_cnt >= 0

    def __repr__(self):
        return f"ChunkStatus(chunk_id={self.chunk_id}, ref_cnt={self.ref_cnt})"


cdef inline ChunkStatus _new_status(Py_ssize_t chunk_id):
    cdef ChunkStatus st = ChunkStatus.__new__(ChunkStatus)
    st.chunk_id = chunk_id
    st.ref_cnt = -1
    return st
