# offload_c/policies_base_chunk_status.pxd: the declarations of _Node, _DList and ChunkStatus: C fields and
# cdef method signatures (implemented in policies_base_chunk_status.pyx).
# Included by kvcy/_fast/_offload_c.pxd.

cdef class _Node:
    cdef _Node prev
    cdef _Node next
    cdef bytes key          # the key this node stands for (set while in a policy)
    cdef int where          # 0: in no list; 1: t1; 2: t2; 3: b1; 4: b2


@cython.final
cdef class _DList:
    cdef _Node head
    cdef _Node tail
    cdef Py_ssize_t size

    cdef inline void append(self, _Node n) noexcept
    cdef inline void unlink(self, _Node n) noexcept
    cdef void clear(self) noexcept


@cython.final
cdef class ChunkStatus(_Node):
    cdef readonly Py_ssize_t chunk_id
    cdef readonly Py_ssize_t ref_cnt
    cdef int64_t rank_a             # LRU rank, while in_order
    cdef int64_t rank_b
    cdef KvcyRankSet.iterator order_it  # its entry in that set, while in_order
    cdef bint in_order              # in an LRU policy's order set
    cdef bint owned                 # resident in some policy
    cdef void *lru_owner            # the LRU policy that made it resident last (with owned: holds it)
