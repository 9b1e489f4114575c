# cython: language_level=3, embedsignature=False
# (docstrings identical to the pure-Python twin's; inspect.signature still works)
# distutils: language = c++
"""Compiled twin of the CPU offloading tier's scheduler-side hot paths (see ``_offload_py.py``).

The same classes, methods, arguments, docstrings and error messages as the
pure-Python twin (``CPUOffloadingManager``, ``LRUCachePolicy``,
``ARCCachePolicy``, ``ChunkStatus``, ``CachePolicy``, ``order_request_keys``),
as typed ``cdef class``es returning the shared API objects of
``kvcy.kv_offload``.  What differs is the bookkeeping:

* each policy keeps one dict key -> ``ChunkStatus``; a status is also the node
  of the intrusive lists (ARC's t1/t2, LRU's fresh ranks); ARC's ghosts are
  plain nodes in b1/b2 and in the same dict, so one lookup tells resident,
  ghost or neither;
* LRU keys ranked with their request live in a C++ ``std::set`` ordered by
  ``(rank, key bytes)``, and eviction merges it with the fresh-rank list;
* a request's record is one insertion-ordered dict key -> flags (for the
  native LRU, which needs no flags: key -> the chunk it had, a hint that
  ``on_request_finished`` checks before using);
* ``count_hits`` is the connector's admission loop (lookups until the first
  key that is not a hit) as one call;
* every public call checks its arguments first (bounds checks are off in the
  build), and the state Python can see is read-only (``chunks``, ``t1``... are
  views or snapshots), so no Python-level call or assignment can corrupt it.

With a policy class from ``CachePolicyFactory`` (a Python subclass of this
module's ``CachePolicy``) the manager calls the policy's Python methods.
"""

cimport cython
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_GET_SIZE
from cpython.dict cimport PyDict_GetItemWithError, PyDict_SetDefault, PyDict_Size
from cpython.object cimport PyObject
from cython.operator cimport dereference as deref, preincrement as inc
from libc.stdint cimport int64_t, uint32_t
from libcpp.vector cimport vector
from libcpp.utility cimport pair
from libcpp.algorithm cimport sort as cpp_sort

cdef extern from "Python.h":
    object _PyDict_NewPresized(Py_ssize_t minused)

cdef extern from *:
    """
    #include <set>
    #include <cstring>
    #include <cstdint>
    /* One resident key of the LRU policy, ordered by (rank_a, rank_b, key bytes).
       `key` and `status` are borrowed: the policy's dict holds the status, which
       holds the key, for as long as the entry is in the set. */
    struct KvcyRankEntry {
        int64_t a;
        int64_t b;
        PyObject *key;
        PyObject *status;
        bool operator<(const KvcyRankEntry &o) const {
            if (a != o.a) return a < o.a;
            if (b != o.b) return b < o.b;
            Py_ssize_t la = PyBytes_GET_SIZE(key), lb = PyBytes_GET_SIZE(o.key);
            int c = std::memcmp(PyBytes_AS_STRING(key), PyBytes_AS_STRING(o.key),
                                (size_t)(la < lb ? la : lb));
            if (c != 0) return c < 0;
            return la < lb;
        }
    };
    typedef std::set<KvcyRankEntry> KvcyRankSet;
    static inline KvcyRankEntry kvcy_rank_entry(int64_t a, int64_t b, PyObject *key, PyObject *status) {
        KvcyRankEntry e; e.a = a; e.b = b; e.key = key; e.status = status; return e;
    }
    """
    cdef cppclass KvcyRankEntry:
        int64_t a
        int64_t b
        PyObject *key
        PyObject *status

    cdef cppclass KvcyRankSet:
        cppclass iterator:
            KvcyRankEntry& operator*()
            iterator operator++()
            bint operator==(iterator)
            bint operator!=(iterator)
        KvcyRankSet() except +
        iterator begin()
        iterator end()
        iterator insert(iterator, KvcyRankEntry&) except +
        void erase(iterator)
        void clear()
        size_t size()

    KvcyRankEntry kvcy_rank_entry(int64_t a, int64_t b, PyObject *key, PyObject *status)

from collections import OrderedDict
from collections.abc import Iterable
from types import MappingProxyType

from kvcy.kv_offload.base import (
    CacheHitSource,
    LookupResult,
    Medium,
    OffloadingEvent,
    OffloadingManager,
    PrepareStoreOutput,
    ReqContext,
    RequestOffloadingContext,
)
from kvcy.kv_offload.metrics import OffloadingConnectorStats

import numpy as np

__all__ = [
    "ARCCachePolicy",
    "CPUOffloadingManager",
    "CachePolicy",
    "ChunkStatus",
    "IMPLEMENTATION",
    "LRUCachePolicy",
    "order_request_keys",
]

IMPLEMENTATION = "cython"

cdef object _MISS = LookupResult.MISS
cdef object _HIT = LookupResult.HIT
cdef object _HIT_PENDING = LookupResult.HIT_PENDING
cdef object _CPU = Medium.CPU
cdef object _HOST = CacheHitSource.HOST
cdef object _np_frombuffer = np.frombuffer
cdef object _np_int32 = np.int32
cdef object _Iterable = Iterable
cdef object _ReqContext = ReqContext
cdef str _FINALIZED = "New cache keys observed after request finalization"
cdef Py_ssize_t _INT_MAX = (<Py_ssize_t>1) << 62

# kvcy.kv_offload.cpu imports the live twin (this module, maybe), so what this
# module needs from it is imported on first use, not at import time.
cdef object _CPULoadStoreSpec = None
cdef object _Metrics = None


cdef int _load_cpu_common() except -1:
    global _CPULoadStoreSpec, _Metrics
    from kvcy.kv_offload.cpu.common import CPULoadStoreSpec, CPUOffloadingMetrics
    _CPULoadStoreSpec = CPULoadStoreSpec
    _Metrics = CPUOffloadingMetrics
    return 0


cdef int64_t _OWNER = 0


cdef inline int64_t _next_owner() noexcept:
    global _OWNER
    _OWNER += 1
    return _OWNER


# =============================================================================
# Argument checks (the same messages in both twins)
# =============================================================================
cdef int _check_key_slow(object key) except -1:
    if type(key) is not bytes and not isinstance(key, bytes):
        raise TypeError(f"an offload key must be bytes, got {type(key).__name__}")
    if len(key) < 4:
        raise ValueError(
            f"an offload key is a block hash plus a 4-byte group index, got {len(key)} bytes: {key!r}"
        )
    return 0


cdef inline int _check_key(object key) except -1:
    if type(key) is bytes and PyBytes_GET_SIZE(key) >= 4:
        return 0
    return _check_key_slow(key)


cdef list _check_keys(object keys):
    """``keys`` as a list of valid offload keys (exact ``bytes``), or a TypeError / ValueError."""
    cdef list out
    cdef Py_ssize_t i
    if type(keys) is list:
        out = <list>keys
    else:
        if isinstance(keys, (bytes, str)) or not isinstance(keys, _Iterable):
            raise TypeError(f"keys must be a collection of offload keys, got {type(keys).__name__}")
        out = list(keys)
    for i in range(len(out)):
        key = out[i]
        if type(key) is not bytes or PyBytes_GET_SIZE(key) < 4:
            _check_key_slow(key)
            # a bytes subclass: keep its plain bytes value (C code compares bytes)
            if out is keys:
                out = list(out)
            out[i] = bytes(key)
    return out


cdef inline int _check_context(object req_context) except -1:
    if type(req_context) is not _ReqContext and not isinstance(req_context, _ReqContext):
        raise TypeError(f"req_context must be a ReqContext, got {type(req_context).__name__}")
    return 0


cdef Py_ssize_t _check_int(str name, object value) except -1:
    """A non-negative int as a C integer (values past 2**62 are clamped: no
    cache, tracker or threshold comes near that)."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    if value < 0:
        raise ValueError(f"{name} must be non-negative, got {value}")
    if value > _INT_MAX:
        return _INT_MAX
    return <Py_ssize_t>value


cdef inline uint32_t _group_of(bytes key) noexcept:
    """The group index: the key's last 4 bytes, big-endian (keys are >= 4 bytes)."""
    cdef const unsigned char *p = <const unsigned char *>PyBytes_AS_STRING(key)
    p += PyBytes_GET_SIZE(key) - 4
    return (<uint32_t>p[0] << 24) | (<uint32_t>p[1] << 16) | (<uint32_t>p[2] << 8) | <uint32_t>p[3]


cdef object _chunk_spec(vector[Py_ssize_t]& ids):
    """A CPULoadStoreSpec over ``ids``: a writable int32 array, filled in C."""
    cdef Py_ssize_t n = <Py_ssize_t>ids.size()
    cdef Py_ssize_t i
    cdef bytearray buf
    cdef int *out
    if _CPULoadStoreSpec is None:
        _load_cpu_common()
    for i in range(n):
        if ids[i] > 0x7FFFFFFF:
            # out of int32 range: let the spec's own check say so
            return _CPULoadStoreSpec([ids[j] for j in range(n)])
    buf = bytearray(n * 4)
    out = <int *>(<char *>buf)
    for i in range(n):
        out[i] = <int>ids[i]
    spec = _CPULoadStoreSpec.__new__(_CPULoadStoreSpec)
    spec.block_ids = _np_frombuffer(buf, dtype=_np_int32)
    return spec


@cython.final
cdef class _Positions:
    """A request's key positions: a direct dict read for a plain ReqContext."""
    cdef dict d
    cdef object getter

    cdef int get(self, object key, int64_t *out) except -1:
        """1 and ``*out`` = the position if ``key`` has one, else 0."""
        cdef PyObject *p
        cdef object v
        if self.d is not None:
            p = PyDict_GetItemWithError(self.d, key)
            if p == NULL:
                return 0
            v = <object>p
        else:
            v = self.getter(key)
            if v is None:
                return 0
        if type(v) is int:
            try:
                out[0] = <int64_t>v
                return 1
            except OverflowError:
                pass
        return _as_position(v, out)


cdef int _as_position(object v, int64_t *out) except -1:
    if isinstance(v, bool) or not isinstance(v, int):
        raise TypeError(f"a key position must be an int, got {type(v).__name__}")
    # Positions are token indices: one past 2**62 only ever orders a request's
    # keys, and is clamped there.
    if v > _INT_MAX:
        out[0] = _INT_MAX
    elif v < -_INT_MAX:
        out[0] = -_INT_MAX
    else:
        out[0] = <int64_t>v
    return 1


cdef _Positions _positions(object req_context):
    cdef _Positions pos = _Positions.__new__(_Positions)
    if type(req_context) is _ReqContext:
        d = req_context._offload_key_positions
        if type(d) is dict:
            pos.d = <dict>d
            return pos
    pos.getter = req_context.get_offload_key_position
    return pos


# =============================================================================
# Chunk state and intrusive lists
# =============================================================================
# _Node, ChunkStatus and _DList are not tracked by the cycle collector: a
# node refers only to its key (bytes) and its neighbours, and those links are
# broken whenever it leaves a list (unlink, clear, and a list's __dealloc__).
# Untracked, the hundreds of thousands of chunks of a large tier cost nothing
# in each collection, and making one does not count toward the next.
@cython.no_gc
cdef class _Node:
    """A link of an intrusive doubly linked list (ARC's lists and ghosts)."""
    cdef _Node prev
    cdef _Node next
    cdef bytes key          # the key this node stands for (set while in a policy)
    cdef int where          # 0: in no list; 1: t1; 2: t2; 3: b1; 4: b2


cdef inline bint _is_ghost(_Node n) noexcept:
    """An ARC ghost (in b1 or b2): a plain _Node, never a ChunkStatus."""
    return n.where == 3 or n.where == 4


@cython.final
@cython.no_gc
cdef class _DList:
    """An intrusive doubly linked list of _Node, oldest first."""
    cdef _Node head
    cdef _Node tail
    cdef Py_ssize_t size

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


@cython.final
@cython.no_gc
cdef class ChunkStatus(_Node):
    """One chunk of the CPU cache and how it is used.

    ``ref_cnt`` is ``-1`` while the chunk is being written (after
    ``prepare_store``, before ``complete_store``), ``0`` when it is readable and
    may be evicted, and ``k > 0`` while ``k`` loads are reading it.

    Args:
        chunk_id: the chunk's number, ``0 .. num_chunks - 1``.
    """
    cdef readonly Py_ssize_t chunk_id
    cdef readonly Py_ssize_t ref_cnt
    cdef int64_t rank_a             # LRU rank, while in_order
    cdef int64_t rank_b
    cdef KvcyRankSet.iterator order_it  # its entry in that set, while in_order
    cdef bint in_order              # in an LRU policy's order set
    cdef bint owned                 # resident in some policy
    cdef void *lru_owner            # the LRU policy that made it resident last (with owned: holds it)

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


# =============================================================================
# Request order
# =============================================================================
def order_request_keys(key_groups, req_context):
    """A request's keys head to tail: its groups concatenated in group order,
    then stably sorted by end-token position when every key has one.

    Args:
        key_groups: the request's keys, one list per KV cache group.
        req_context: the request, whose recorded positions order the keys.
    """
    cdef list keys = [key for group in key_groups for key in group]
    cdef list positions = []
    get = req_context.get_offload_key_position
    for key in keys:
        p = get(key)
        if p is None:
            return keys
        positions.append(p)
    order = sorted(range(len(keys)), key=positions.__getitem__)
    return [keys[i] for i in order]


cdef list _by_position(list keys, _Positions pos):
    """``keys`` stably sorted by position, or None when a key has none."""
    cdef vector[pair[int64_t, Py_ssize_t]] order
    cdef int64_t p
    cdef Py_ssize_t i, n = len(keys)
    cdef bint is_sorted = True
    order.reserve(n)
    for i in range(n):
        if not pos.get(keys[i], &p):
            return None
        if i and p < order.back().first:
            is_sorted = False
        order.push_back(pair[int64_t, Py_ssize_t](p, i))
    if is_sorted:
        return list(keys)
    cpp_sort(order.begin(), order.end())   # (position, index): a stable order
    return [keys[order[i].second] for i in range(n)]


cdef list _ordered(list groups, _Positions pos):
    """order_request_keys for groups of valid keys, positions read through ``pos``."""
    cdef list keys
    cdef list out
    if len(groups) == 1:
        keys = <list>groups[0]
    else:
        keys = []
        for group in groups:
            keys.extend(<list>group)
    out = _by_position(keys, pos)
    return keys if out is None else out


cdef int _one_group_order(list keys, _Positions pos, vector[Py_ssize_t]& order) except -1:
    """The request order of ``keys`` (first seen first) when they all belong to
    one group: 1, with ``order`` = indices into ``keys``, head first; 0 (and
    ``order`` untouched) for keys of several groups.

    For one group, order_request_keys is a stable sort by position when every
    key has one, else the keys as they are.
    """
    cdef Py_ssize_t i, n = len(keys)
    cdef uint32_t g0
    cdef int64_t p
    cdef bint all_positioned = True, is_sorted = True
    cdef vector[pair[int64_t, Py_ssize_t]] by_pos
    if n:
        g0 = _group_of(<bytes>keys[0])
        for i in range(1, n):
            if _group_of(<bytes>keys[i]) != g0:
                return 0
    by_pos.reserve(n)
    for i in range(n):
        if not pos.get(keys[i], &p):
            all_positioned = False
            break
        if i and p < by_pos.back().first:
            is_sorted = False
        by_pos.push_back(pair[int64_t, Py_ssize_t](p, i))
    order.clear()
    order.reserve(n)
    if all_positioned and not is_sorted:
        cpp_sort(by_pos.begin(), by_pos.end())   # (position, index): a stable order
        for i in range(n):
            order.push_back(by_pos[i].second)
    else:
        for i in range(n):
            order.push_back(i)
    return 1


# =============================================================================
# The policy interface
# =============================================================================
cdef class CachePolicy:
    """Which chunk each resident key has, and which keys to evict.

    The manager owns the chunk pool and the reference counts; a policy owns
    the key -> :class:`ChunkStatus` map and the recency bookkeeping, and is
    told about every access.  The hooks without a body here are optional.

    Args:
        cache_capacity: the cache size in chunks.
    """
    cdef readonly Py_ssize_t cache_capacity
    cdef dict _chunks       # native policies: every resident key -> its ChunkStatus
                            # (ARC: and every ghost key -> its ghost _Node, see _is_ghost)
    cdef bint _native       # LRUCachePolicy / ARCCachePolicy (C paths), else Python calls

    def __init__(self, cache_capacity):
        self.cache_capacity = _check_int("cache_capacity", cache_capacity)
        self._chunks = {}

    # -- what the manager calls; a Python subclass is reached through its methods
    cdef inline ChunkStatus c_get(self, object key):
        cdef PyObject *p
        if self._native:
            p = PyDict_GetItemWithError(self._chunks, key)
            if p == NULL or _is_ghost(<_Node>p):
                return None
            return <ChunkStatus>p
        got = self.get(key)
        if got is not None and type(got) is not ChunkStatus:
            raise TypeError(f"{type(self).__name__}.get returned {type(got).__name__}, not a ChunkStatus")
        return <ChunkStatus>got

    cdef int c_insert(self, bytes key, ChunkStatus chunk, object ctx, _Positions pos,
                      bint absent=False) except -1:
        self.insert(key, chunk, ctx)
        return 0

    cdef int c_insert_new(self, list keys, vector[Py_ssize_t]& ids, object ctx,
                          _Positions pos) except -1:
        """Insert non-resident ``keys[i]`` with a new write-pending chunk ``ids[i]``, in order."""
        cdef Py_ssize_t i
        for i in range(len(keys)):
            self.c_insert(<bytes>keys[i], _new_status(ids[i]), ctx, pos, True)
        return 0

    cdef int c_remove(self, bytes key) except -1:
        self.remove(key)
        return 0

    cdef int c_touch(self, list keys, object ctx) except -1:
        self.touch(keys, ctx)
        return 0

    cdef int c_on_store_miss(self, list keys, object ctx) except -1:
        self.on_store_miss(keys, ctx)
        return 0

    cdef int c_on_request_access(self, list keys, object ctx, _Positions pos) except -1:
        self.on_request_access(keys, ctx)
        return 0

    cdef int c_on_request_finished(self, list groups, set insertion_only, set reused,
                                   object ctx, _Positions pos) except -1:
        self.on_request_finished(groups, insertion_only, reused, ctx)
        return 0

    cdef int c_mark_evictable(self, bytes key) except -1:
        self.mark_evictable(key)
        return 0

    cdef int c_mark_non_evictable(self, bytes key) except -1:
        self.mark_non_evictable(key)
        return 0

    cdef list c_evict(self, Py_ssize_t n, set protected):
        """Evicted keys' ChunkStatus (each with its key), or None."""
        got = self.evict(n, protected)
        if got is None:
            return None
        cdef list out = []
        for item in got:
            key, chunk = item
            _check_key(key)
            if type(chunk) is not ChunkStatus:
                raise TypeError(f"{type(self).__name__}.evict returned {type(chunk).__name__}, not a ChunkStatus")
            (<ChunkStatus>chunk).key = bytes(key)
            out.append(chunk)
        if len(out) != n:
            raise RuntimeError(f"{type(self).__name__}.evict returned {len(out)} keys, not {n}")
        return out

    cdef int c_clear(self) except -1:
        self.clear()
        return 0

    # -- the Python interface -------------------------------------------------
    def get(self, key):
        """The chunk of a resident key, or ``None``."""
        raise NotImplementedError

    def insert(self, key, chunk, req_context):
        """Make ``key`` resident in ``chunk`` (being written), stored for ``req_context``."""
        raise NotImplementedError

    def remove(self, key):
        """Drop a resident key whose store failed."""
        raise NotImplementedError

    def touch(self, keys, req_context):
        """Mark keys as recently used; the first key ends most recent."""
        raise NotImplementedError

    def on_store_miss(self, keys, req_context):
        """Keys a request offered that are not resident (seen once per request)."""

    def on_request_access(self, new_keys, req_context):
        """Keys a request loaded or offered for the first time."""

    def on_request_finished(self, key_groups, insertion_only, reused, req_context):
        """A request finished: its keys per group, which it only stored and which it reused."""

    def evict(self, n, protected):
        """Remove ``n`` evictable keys not in ``protected`` and return them with their chunks.

        Returns ``None``, changing nothing, when fewer than ``n`` qualify.
        """
        raise NotImplementedError

    def clear(self):
        """Forget every key."""
        raise NotImplementedError

    def mark_evictable(self, key):
        """A resident key's ``ref_cnt`` became 0."""

    def mark_non_evictable(self, key):
        """A resident key's ``ref_cnt`` left 0 (a load pinned it)."""


cdef ChunkStatus _as_chunk(object chunk):
    # The chunk argument of a policy's public insert (the pure twin's _check_chunk).
    if type(chunk) is not ChunkStatus and not isinstance(chunk, ChunkStatus):
        raise TypeError(f"chunk must be a ChunkStatus, got {type(chunk).__name__}")
    return <ChunkStatus>chunk


cdef int _check_new_chunk(ChunkStatus chunk) except -1:
    if chunk.owned:
        raise ValueError(f"{chunk!r} already holds a key of a cache policy")
    return 0


cdef list _key_seq(object keys):
    """The keys of a policy call, as a list (each must be hashable; any type)."""
    if type(keys) is list:
        return <list>keys
    if isinstance(keys, (bytes, str)) or not isinstance(keys, _Iterable):
        raise TypeError(f"keys must be a collection of offload keys, got {type(keys).__name__}")
    return list(keys)


cdef set _bytes_set(object keys):
    """The bytes among ``keys``: what a key of a policy can equal."""
    cdef set out = set()
    if keys is None:
        return out
    for k in keys:
        if type(k) is bytes:
            out.add(k)
        elif isinstance(k, bytes):
            out.add(bytes(k))
    return out


cdef object _evict_native(CachePolicy policy, Py_ssize_t num_resident, object n, object protected):
    """The Python ``evict`` of the native policies: checks ``n``, then their ``c_evict``."""
    if isinstance(n, bool) or not isinstance(n, int):
        raise TypeError(f"n must be an int, got {type(n).__name__}")
    if n <= 0:
        return []
    if n > num_resident:
        return None
    got = policy.c_evict(<Py_ssize_t>n, _bytes_set(protected))
    if got is None:
        return None
    return [((<ChunkStatus>st).key, st) for st in got]


# =============================================================================
# LRU, ranked by request
# =============================================================================
@cython.final
cdef class _LRURequestRanks:
    """Kept on a ReqContext: LRU policy owner id -> (policy epoch, request rank)."""
    cdef dict ranks

    def __cinit__(self):
        self.ranks = {}


@cython.final
cdef class LRUCachePolicy(CachePolicy):
    """Least recently used, where recency is ranked per request.

    Every resident key has a rank ``(counter, -position)``; the lowest
    ``(rank, key bytes)`` among evictable keys is evicted first.  The keys a
    request stores or first reads with known positions share the request's
    rank (taken at its first access), so within one request the tail goes
    before the head.  ``touch`` and a request's end give keys fresh ranks.
    """
    # Ranks are (counter, 0) ("fresh": touch, a finished request, a key stored
    # without position) or (request rank, -position).  A fresh rank is newer
    # than every rank given before it, so fresh-ranked keys sit in a list in
    # rank order, appended in O(1); only request-ranked keys need the ordered
    # set.  Eviction merges the two (no rank is in both: each counter value is
    # either one fresh rank or one request's rank).
    cdef _DList _fresh          # fresh-ranked resident keys (where == 5), oldest first
    cdef KvcyRankSet _order     # request-ranked resident keys by (rank, key bytes)
    cdef int64_t _counter
    cdef int64_t _epoch
    cdef int64_t _owner
    cdef int64_t _erased        # entries ever taken out of _order (hints older than a change are dropped)

    def __init__(self, cache_capacity):
        CachePolicy.__init__(self, cache_capacity)
        self._native = True
        self._fresh = _DList()
        self._counter = 0
        self._epoch = 0
        self._owner = _next_owner()

    def __dealloc__(self):
        self._order.clear()

    # -- rank bookkeeping (the set holds borrowed pointers: a status is in it
    #    only while _chunks holds it, and it holds its key)
    cdef inline void _link_ranked(self, ChunkStatus st, int64_t a, int64_t b) except *:
        self._link_ranked_at(st, a, b, self._order.end())

    cdef inline void _link_ranked_at(self, ChunkStatus st, int64_t a, int64_t b,
                                     KvcyRankSet.iterator hint) except *:
        # ``hint``: an entry of the set the new one is expected just before
        # (amortized O(1) then; a wrong hint costs an ordinary O(log n) insert)
        st.rank_a = a
        st.rank_b = b
        st.order_it = self._order.insert(hint, kvcy_rank_entry(a, b, <PyObject *>st.key, <PyObject *>st))
        st.in_order = True

    cdef inline void _link_fresh(self, ChunkStatus st) noexcept:
        self._counter += 1
        st.rank_a = self._counter
        st.rank_b = 0
        st.where = 5
        self._fresh.append(st)

    cdef inline void _unlink(self, ChunkStatus st) noexcept:
        if st.in_order:
            # (a status is in_order only in the set of the policy whose _chunks holds it)
            self._order.erase(st.order_it)
            st.in_order = False
            self._erased += 1
        elif st.where == 5:
            self._fresh.unlink(st)
            st.where = 0

    cdef inline void _refresh(self, ChunkStatus st) except *:
        if st.where == 5 and st is self._fresh.tail:
            self._counter += 1
            st.rank_a = self._counter
            return
        self._unlink(st)
        self._link_fresh(st)

    cdef int64_t _request_rank(self, object ctx) except -1:
        cdef _LRURequestRanks holder
        state = ctx.get_state(_LRURequestRanks)
        if state is None:
            holder = _LRURequestRanks.__new__(_LRURequestRanks)
            holder.ranks = {}
            ctx.set_state(holder)
        else:
            holder = <_LRURequestRanks?>state
        got = holder.ranks.get(self._owner)
        if type(got) is tuple and (<tuple>got)[0] == self._epoch:
            return <int64_t>(<tuple>got)[1]
        self._counter += 1
        holder.ranks[self._owner] = (self._epoch, self._counter)
        return self._counter

    cdef int c_insert(self, bytes key, ChunkStatus st, object ctx, _Positions pos,
                      bint absent=False) except -1:
        cdef int64_t p, a = 0
        cdef ChunkStatus old
        cdef bint ranked = pos is not None and pos.get(key, &p)
        if ranked:
            a = self._request_rank(ctx)
        # (nothing below calls back into Python; ``old`` is typed so that
        # clearing its C field is not a Python attribute lookup that fails
        # after the unlink)
        old = None if absent else self.c_get(key)
        if old is not None:
            self._unlink(old)
            old.owned = False
        st.key = key
        st.owned = True
        st.lru_owner = <void *>self
        self._chunks[key] = st
        if ranked:
            self._link_ranked(st, a, -p)
        else:
            self._link_fresh(st)
        return 0

    cdef int c_insert_new(self, list keys, vector[Py_ssize_t]& ids, object ctx,
                          _Positions pos) except -1:
        return self.c_insert_new_noted(keys, ids, ctx, pos, None)

    cdef int c_insert_new_noted(self, list keys, vector[Py_ssize_t]& ids, object ctx,
                                _Positions pos, list made) except -1:
        # (``made``: the statuses to use, one per key, made by the manager
        # before it knew their chunk ids; the request's record holds them)
        # c_insert per key, with the request's rank taken once (at the first
        # key with a position, as c_insert would) and each ranked key inserted
        # with the previous one as hint: an offer's keys come head first, so
        # each sorts just before the one inserted before it.  Only for a plain
        # ReqContext with its positions dict: then nothing in the loop runs
        # Python code after the rank is taken, so the hint stays valid.
        cdef Py_ssize_t i, n = len(keys)
        cdef int64_t p, a = 0
        cdef bint have_rank = False
        cdef ChunkStatus st
        cdef bytes key
        cdef KvcyRankSet.iterator hint
        cdef int64_t erased = self._erased
        if type(ctx) is not _ReqContext or pos is None or pos.d is None:
            return CachePolicy.c_insert_new(self, keys, ids, ctx, pos)
        for i in range(n):
            key = <bytes>keys[i]
            if made is not None:
                st = <ChunkStatus>made[i]
                st.chunk_id = ids[i]
                st.ref_cnt = -1
            else:
                st = _new_status(ids[i])
            if pos.get(key, &p):
                if not have_rank:
                    a = self._request_rank(ctx)
                    have_rank = True
                    hint = self._order.end()
                    erased = self._erased
                elif erased != self._erased:
                    # (a key equal to a position's key ran Python code that
                    # took an entry out: the hint may be gone)
                    hint = self._order.end()
                    erased = self._erased
                st.key = key
                st.owned = True
                st.lru_owner = <void *>self
                self._chunks[key] = st
                self._link_ranked_at(st, a, -p, hint)
                hint = st.order_it
            else:
                st.key = key
                st.owned = True
                st.lru_owner = <void *>self
                self._chunks[key] = st
                self._link_fresh(st)
        return 0

    cdef int c_remove(self, bytes key) except -1:
        cdef ChunkStatus st = self.c_get(key)
        if st is None:
            raise KeyError(key)
        self._unlink(st)
        st.owned = False
        del self._chunks[key]
        return 0

    cdef int c_touch(self, list keys, object ctx) except -1:
        cdef Py_ssize_t i
        cdef ChunkStatus st
        for i in range(len(keys) - 1, -1, -1):
            st = self.c_get(keys[i])
            if st is not None:
                self._refresh(st)
        return 0

    cdef int c_on_store_miss(self, list keys, object ctx) except -1:
        return 0

    cdef int c_on_request_access(self, list keys, object ctx, _Positions pos) except -1:
        cdef int64_t r = self._request_rank(ctx)
        cdef int64_t p
        cdef ChunkStatus st
        for key in keys:
            if self.c_get(key) is None or not pos.get(key, &p):
                continue
            st = self.c_get(key)       # again: reading the position may run Python code
            if st is not None and (r > st.rank_a or (r == st.rank_a and -p > st.rank_b)):
                self._unlink(st)
                self._link_ranked(st, r, -p)
        return 0

    cdef int c_on_request_finished(self, list groups, set insertion_only, set reused,
                                   object ctx, _Positions pos) except -1:
        cdef list order = _ordered(groups, pos)
        cdef Py_ssize_t i
        cdef ChunkStatus st
        for i in range(len(order) - 1, -1, -1):
            st = self.c_get(order[i])
            if st is not None:
                self._refresh(st)
        return 0

    cdef int c_finish_keys(self, list keys, _Positions pos, list hints=None) except -1:
        """c_on_request_finished for a request's keys, first seen first (the
        manager's record): grouped by group index in index order, keeping
        that order within a group, as the manager would pass them."""
        cdef Py_ssize_t i, n = len(keys)
        cdef vector[Py_ssize_t] order
        cdef ChunkStatus st
        if n == 0:
            return 0
        if _one_group_order(keys, pos, order):
            # fresh ranks, tail first (reading the positions above was the
            # only step that could run Python code).  ``hints[j]``: the chunk
            # keys[j] had when recorded, or None; still this key's chunk if
            # still resident under the same key object.
            for i in range(n - 1, -1, -1):
                j = order[i]
                h = hints[j] if hints is not None else None
                if (h is not None and type(h) is ChunkStatus and (<ChunkStatus>h).owned
                        and (<ChunkStatus>h).lru_owner == <void *>self
                        and (<ChunkStatus>h).key is keys[j]):
                    st = <ChunkStatus>h
                else:
                    st = self.c_get(keys[j])
                if st is not None:
                    self._refresh(st)
            return 0
        by_group = {}
        for key in keys:
            by_group.setdefault(_group_of(<bytes>key), []).append(key)
        groups = []
        for gi in sorted(by_group):
            members = <list>by_group[gi]
            ordered = _by_position(members, pos)
            groups.append(members if ordered is None else ordered)
        return self.c_on_request_finished(groups, None, None, None, pos)

    cdef int c_mark_evictable(self, bytes key) except -1:
        return 0

    cdef int c_mark_non_evictable(self, bytes key) except -1:
        return 0

    cdef list c_evict(self, Py_ssize_t n, set protected):
        cdef list out = []
        cdef ChunkStatus st, f, r
        cdef _Node fresh = self._fresh.head
        cdef KvcyRankSet.iterator it = self._order.begin()
        cdef KvcyRankSet.iterator end = self._order.end()
        cdef bint check = protected is not None and len(protected) > 0
        if n <= 0:
            return out
        # Merge the fresh list and the ranked set in rank order.  The scan only
        # reads C fields and tests bytes in a set of bytes: no Python code runs
        # while the iterator is live.
        while True:
            f = <ChunkStatus>fresh
            r = <ChunkStatus>deref(it).status if it != end else None
            if f is None and r is None:
                break
            if r is None or (f is not None and (f.rank_a < r.rank_a or (f.rank_a == r.rank_a and f.rank_b < r.rank_b))):
                st = f
                fresh = f.next
            else:
                st = r
                inc(it)
            if st.ref_cnt == 0 and not (check and st.key in protected):
                out.append(st)
                if len(out) == n:
                    break
        if len(out) < n:
            return None
        for st in out:
            self._unlink(st)
            st.owned = False
            del self._chunks[st.key]
        return out

    cdef int c_clear(self) except -1:
        self._order.clear()
        self._erased += 1
        self._fresh.clear()
        for st in self._chunks.values():
            (<ChunkStatus>st).in_order = False
            (<ChunkStatus>st).owned = False
        self._chunks = {}
        self._counter = 0
        self._epoch += 1
        return 0

    # -- Python interface ----------------------------------------------------------
    @property
    def chunks(self):
        """key -> chunk of every resident key (a read-only view)."""
        return MappingProxyType(self._chunks)

    @property
    def _ranks(self):
        """key -> rank of every resident key (a snapshot)."""
        return {k: ((<ChunkStatus>st).rank_a, (<ChunkStatus>st).rank_b) for k, st in self._chunks.items()}

    def get(self, key):
        """The chunk of a resident key, or ``None``."""
        return self.c_get(key)

    def insert(self, key, chunk, req_context):
        """Make ``key`` resident; ranked with its request if its position is known."""
        _check_key(key)
        _check_new_chunk(_as_chunk(chunk))
        self.c_insert(bytes(key), <ChunkStatus>chunk, req_context, _positions(req_context))

    def remove(self, key):
        """Drop a resident key."""
        _check_key(key)
        self.c_remove(bytes(key))

    def touch(self, keys, req_context):
        """Fresh ranks for the resident keys, last key first (the first ends most recent)."""
        self.c_touch(_key_seq(keys), req_context)

    def on_request_access(self, new_keys, req_context):
        """Raise resident keys with positions to the request's rank (never lowers one)."""
        self.c_on_request_access(_key_seq(new_keys), req_context, _positions(req_context))

    def on_request_finished(self, key_groups, insertion_only, reused, req_context):
        """Fresh ranks for the request's resident keys, tail first (the head ends most recent)."""
        cdef list order = order_request_keys(key_groups, req_context)
        cdef Py_ssize_t i
        cdef ChunkStatus st
        for i in range(len(order) - 1, -1, -1):
            st = self.c_get(order[i])
            if st is not None:
                self._refresh(st)

    def mark_evictable(self, key):
        """``key`` may be evicted again."""

    def mark_non_evictable(self, key):
        """``key`` is pinned."""

    def evict(self, n, protected):
        """Evict the ``n`` evictable, unprotected keys lowest in ``(rank, key)`` order."""
        return _evict_native(self, len(self._chunks), n, protected)

    def clear(self):
        """Forget every key and every request's rank."""
        self.c_clear()


# =============================================================================
# ARC
# =============================================================================
@cython.final
cdef class ARCCachePolicy(CachePolicy):
    """Adaptive replacement: recency (``t1``) and frequency (``t2``) lists.

    Keys enter ``t1``; a touch or a reuse by a finished request moves them to
    ``t2``.  Evicted keys leave a ghost in ``b1`` / ``b2``; a ghost hit moves
    ``target_t1_size``, the share of the cache ``t1`` may keep, towards the
    list that would have kept the key.
    """
    cdef _DList _t1
    cdef _DList _t2
    cdef _DList _b1
    cdef _DList _b2
    # One map for resident and ghost keys (CachePolicy._chunks): a key's one
    # lookup says resident, ghost or neither, and an eviction turns its entry
    # into a ghost in place.
    cdef double _target

    def __init__(self, cache_capacity):
        CachePolicy.__init__(self, cache_capacity)
        self._native = True
        self._t1 = _DList()
        self._t2 = _DList()
        self._b1 = _DList()
        self._b2 = _DList()
        self._target = 0.0

    cdef inline _DList _list_of(self, _Node n):
        if n.where == 1:
            return self._t1
        if n.where == 2:
            return self._t2
        if n.where == 3:
            return self._b1
        return self._b2

    cdef int c_insert(self, bytes key, ChunkStatus st, object ctx, _Positions pos,
                      bint absent=False) except -1:
        cdef _Node old
        # (nothing below runs Python code: the key is exact bytes)
        cdef PyObject *p = PyDict_SetDefault(self._chunks, key, st)
        if p != <PyObject *>st:
            # a ghost, or (when not absent) a resident key's old chunk
            old = <_Node>p
            if not _is_ghost(old):
                (<ChunkStatus>old).owned = False
            self._list_of(old).unlink(old)
            old.where = 0
            self._chunks[key] = st
        st.key = key
        st.owned = True
        st.where = 1
        self._t1.append(st)
        return 0

    cdef int c_remove(self, bytes key) except -1:
        cdef ChunkStatus st = self.c_get(key)
        if st is None:
            raise KeyError(key)
        self._list_of(st).unlink(st)
        st.where = 0
        st.owned = False
        del self._chunks[key]
        return 0

    cdef int _ghost_hit(self, object key) except -1:
        cdef PyObject *g = PyDict_GetItemWithError(self._chunks, key)
        if g == NULL or not _is_ghost(<_Node>g):
            return 0
        self._ghost_node_hit(<_Node>g)
        return 0

    cdef void _ghost_node_hit(self, _Node gn) noexcept:
        cdef double d
        if gn.where == 3:
            d = <double>self._b2.size / <double>self._b1.size
            if d < 1.0:
                d = 1.0
            self._target = self._target + d
            if self._target > <double>self.cache_capacity:
                self._target = <double>self.cache_capacity
            self._b1.unlink(gn)
            self._b1.append(gn)
        else:
            d = <double>self._b1.size / <double>self._b2.size
            if d < 1.0:
                d = 1.0
            self._target = self._target - d
            if self._target < 0.0:
                self._target = 0.0
            self._b2.unlink(gn)
            self._b2.append(gn)

    cdef int c_touch(self, list keys, object ctx) except -1:
        cdef Py_ssize_t i
        cdef ChunkStatus st
        for i in range(len(keys) - 1, -1, -1):
            key = keys[i]
            st = self.c_get(key)
            if st is None:
                self._ghost_hit(key)
            elif st.where == 1:
                self._t1.unlink(st)
                if st.ref_cnt < 0:
                    self._t1.append(st)
                else:
                    st.where = 2
                    self._t2.append(st)
            else:
                self._t2.unlink(st)
                self._t2.append(st)
        return 0

    cdef int c_on_store_miss(self, list keys, object ctx) except -1:
        cdef Py_ssize_t i
        for i in range(len(keys) - 1, -1, -1):
            self._ghost_hit(keys[i])
        return 0

    cdef int c_on_request_access(self, list keys, object ctx, _Positions pos) except -1:
        return 0

    cdef int c_ghost_hits(self, list nodes) except -1:
        """``c_on_store_miss`` for keys whose map entries were read just before:
        ``nodes[i]`` is the key's ghost node then, or None (no ghost)."""
        cdef Py_ssize_t i
        cdef _Node g
        for i in range(len(nodes) - 1, -1, -1):
            g = <_Node>nodes[i]
            if g is not None and _is_ghost(g):     # (still a ghost: nothing trimmed it)
                self._ghost_node_hit(g)
        return 0

    cdef int c_insert_new_ghosts(self, list keys, vector[Py_ssize_t]& ids, list ghosts) except -1:
        """``c_insert_new`` where ``ghosts[i]`` is ``keys[i]``'s ghost node as read
        before the eviction (or None): a ghost still in place is replaced by the
        new chunk in one map write."""
        cdef Py_ssize_t i
        cdef _Node g
        cdef ChunkStatus st
        cdef bytes key
        for i in range(len(keys)):
            key = <bytes>keys[i]
            st = _new_status(ids[i])
            g = <_Node>ghosts[i]
            if g is not None and _is_ghost(g):
                self._list_of(g).unlink(g)
                g.where = 0
                self._chunks[key] = st
                st.key = key
                st.owned = True
                st.where = 1
                self._t1.append(st)
            else:
                self.c_insert(key, st, None, None, True)
        return 0

    cdef int _finish(self, list order, object insertion_only, object reused) except -1:
        cdef Py_ssize_t i
        cdef ChunkStatus st
        for i in range(len(order) - 1, -1, -1):
            key = order[i]
            if key in insertion_only:
                st = self.c_get(key)
                if st is not None:
                    self._list_of(st).unlink(st)
                    self._list_of(st).append(st)
            elif key in reused:
                st = self.c_get(key)
                if st is None:
                    continue
                if st.where == 1:
                    self._t1.unlink(st)
                    st.where = 2
                    self._t2.append(st)
                else:
                    self._t2.unlink(st)
                    self._t2.append(st)
        return 0

    cdef int c_on_request_finished(self, list groups, set insertion_only, set reused,
                                   object ctx, _Positions pos) except -1:
        return self._finish(_ordered(groups, pos), insertion_only, reused)

    cdef int c_finish_flags(self, list keys, list flags, vector[Py_ssize_t]& order) except -1:
        """``_finish`` for a record's keys and flags (``keys[order[i]]``, head
        first): a key with ``_REUSED`` is reused, else one with ``_INSERTED``
        is insertion-only, as the manager's sets would say."""
        cdef Py_ssize_t i, j, f
        cdef ChunkStatus st
        for j in range(<Py_ssize_t>order.size() - 1, -1, -1):
            i = order[j]
            f = <Py_ssize_t>flags[i]
            if not (f & (_REUSED | _INSERTED)):
                continue
            st = self.c_get(keys[i])
            if st is None:
                continue
            if f & _REUSED:
                if st.where == 1:
                    self._t1.unlink(st)
                    st.where = 2
                    self._t2.append(st)
                else:
                    self._t2.unlink(st)
                    self._t2.append(st)
            else:
                self._list_of(st).unlink(st)
                self._list_of(st).append(st)
        return 0

    cdef int c_mark_evictable(self, bytes key) except -1:
        return 0

    cdef int c_mark_non_evictable(self, bytes key) except -1:
        return 0

    cdef list c_evict(self, Py_ssize_t n, set protected):
        cdef list out = []
        cdef Py_ssize_t v = self._t1.size
        cdef Py_ssize_t target = <Py_ssize_t>self._target
        cdef _Node c1 = self._t1.head
        cdef _Node c2 = self._t2.head
        cdef ChunkStatus st, got
        cdef bint check = protected is not None and len(protected) > 0
        cdef Py_ssize_t i
        cdef _Node g
        if n <= 0:
            return out
        for i in range(n):
            got = None
            if v >= target:
                while c1 is not None:
                    st = <ChunkStatus>c1
                    c1 = c1.next
                    if st.ref_cnt == 0 and not (check and st.key in protected):
                        got = st
                        v -= 1
                        break
            if got is None:
                while c2 is not None:
                    st = <ChunkStatus>c2
                    c2 = c2.next
                    if st.ref_cnt == 0 and not (check and st.key in protected):
                        got = st
                        break
            if got is None:
                while c1 is not None:
                    st = <ChunkStatus>c1
                    c1 = c1.next
                    if st.ref_cnt == 0 and not (check and st.key in protected):
                        got = st
                        v -= 1
                        break
                if got is None:
                    return None
            out.append(got)
        for st in out:
            g = _Node.__new__(_Node)
            g.key = st.key
            if st.where == 1:
                self._t1.unlink(st)
                g.where = 3
                self._b1.append(g)
            else:
                self._t2.unlink(st)
                g.where = 4
                self._b2.append(g)
            st.where = 0
            st.owned = False
            self._chunks[st.key] = g       # the key's entry becomes its ghost
        while self._b1.size > self.cache_capacity:
            g = self._b1.head
            self._b1.unlink(g)
            g.where = 0
            del self._chunks[g.key]
        while self._b2.size > self.cache_capacity:
            g = self._b2.head
            self._b2.unlink(g)
            g.where = 0
            del self._chunks[g.key]
        return out

    cdef int c_clear(self) except -1:
        cdef _Node n
        for lst in (self._t1, self._t2):
            n = (<_DList>lst).head
            while n is not None:
                (<ChunkStatus>n).owned = False
                n = n.next
        self._t1.clear()
        self._t2.clear()
        self._b1.clear()
        self._b2.clear()
        self._chunks = {}
        self._target = 0.0
        return 0

    # -- Python interface ----------------------------------------------------------
    cdef object _snapshot(self, _DList lst, bint with_chunks):
        out = OrderedDict()
        cdef _Node n = lst.head
        while n is not None:
            out[n.key] = n if with_chunks else None
            n = n.next
        return out

    @property
    def t1(self):
        """Keys seen once, oldest first: key -> chunk (a snapshot)."""
        return self._snapshot(self._t1, True)

    @property
    def t2(self):
        """Keys seen again, oldest first: key -> chunk (a snapshot)."""
        return self._snapshot(self._t2, True)

    @property
    def b1(self):
        """Ghosts of keys evicted from t1, oldest first (a snapshot)."""
        return self._snapshot(self._b1, False)

    @property
    def b2(self):
        """Ghosts of keys evicted from t2, oldest first (a snapshot)."""
        return self._snapshot(self._b2, False)

    @property
    def target_t1_size(self):
        """How many chunks t1 aims to hold."""
        return self._target

    def get(self, key):
        """The chunk of a resident key, or ``None``."""
        return self.c_get(key)

    def insert(self, key, chunk, req_context):
        """Make ``key`` the newest entry of ``t1``; it stops being a ghost."""
        _check_key(key)
        _check_new_chunk(_as_chunk(chunk))
        self.c_insert(bytes(key), <ChunkStatus>chunk, req_context, None)

    def remove(self, key):
        """Drop a resident key, leaving no ghost."""
        _check_key(key)
        self.c_remove(bytes(key))

    def touch(self, keys, req_context):
        """Last key first: t1 -> t2 (pending keys stay in t1), t2 -> newest, ghosts adapt."""
        self.c_touch(_key_seq(keys), req_context)

    def on_store_miss(self, keys, req_context):
        """A ghost hit for each key, last key first."""
        self.c_on_store_miss(_key_seq(keys), req_context)

    def on_request_finished(self, key_groups, insertion_only, reused, req_context):
        """Tail first: keys only stored become newest in their list; reused keys newest in t2."""
        self._finish(order_request_keys(key_groups, req_context), insertion_only, reused)

    def evict(self, n, protected):
        """Pick ``n`` evictable, unprotected keys, from t1 while it is over target, else t2."""
        return _evict_native(self, self._t1.size + self._t2.size, n, protected)

    def clear(self):
        """Forget every key and ghost; the target goes back to 0."""
        self.c_clear()


#: The policies every manager knows without the factory.
_BUILTIN_POLICIES = {"lru": LRUCachePolicy, "arc": ARCCachePolicy}


# =============================================================================
# The manager
# =============================================================================
# What a request did with a key, as flags in its record (one dict op per key
# instead of one per set).
cdef enum:
    _INSERTED = 1       # the request caused the key to be stored
    _REUSED = 2         # it read or re-offered the key, ready, without having inserted it
    _MISSED = 4         # the policy heard of the key as a store miss for this request

cdef object _FLAG_NONE = 0
cdef object _FLAG_MISSED = <Py_ssize_t>_MISSED


@cython.final
cdef class _AccessRecord:
    """What one request did with one manager, since the manager's last reset."""
    cdef int64_t generation
    cdef dict keys              # every key seen, first seen first -> flags (_INSERTED...)
    cdef list inserted_log      # keys inserted for the request, not yet in the flags
    cdef bint finished

    def __cinit__(self):
        self.keys = {}
        self.inserted_log = []

    cdef int fold(self) except -1:
        """Move the logged insertions into the flags (each key is in ``keys``)."""
        cdef PyObject *f
        if self.inserted_log:
            for key in self.inserted_log:
                f = PyDict_GetItemWithError(self.keys, key)
                self.keys[key] = (0 if f == NULL else <Py_ssize_t><object>f) | _INSERTED
            self.inserted_log = []
        return 0


@cython.final
cdef class _AccessRecords:
    """Kept on a ReqContext: manager owner id -> its _AccessRecord for the request."""
    cdef dict records

    def __cinit__(self):
        self.records = {}


@cython.final
cdef class CPUOffloadingManager:
    """The scheduler-side manager of a CPU cache of ``num_chunks`` chunks.

    It hands out chunks for stores (fresh ones first, then freed ones, last
    freed first), counts readers per chunk, asks its cache policy what to
    evict when the cache is full, and queues ``OffloadingEvent``s.  A chunk is
    write-pending from ``prepare_store`` to ``complete_store``, then readable;
    ``prepare_load`` pins it until ``complete_load``.  Only readable, unpinned
    chunks are evicted, and never one the current offer contains.

    Args:
        num_chunks: the cache size in chunks (may be 0).
        cache_policy: ``"lru"``, ``"arc"`` or a name registered with
            ``CachePolicyFactory``.
        cache_policy_module_path: a module to import the policy class named
            ``cache_policy`` from, instead of the registry.
        enable_events: queue events for ``take_events``.
        store_threshold: with 2 or more, a new key is stored only once it has
            been offered that many times (counted in a tracker of at most
            ``max_tracker_size`` keys); 0 and 1 store every offer.
        max_tracker_size: capacity of that tracker.
        info: labels reported by ``config_info()``.

    Raises:
        TypeError: an argument has the wrong type.
        ValueError: a negative size or threshold, or an unknown policy name.
    """
    cdef Py_ssize_t _n_chunks
    cdef Py_ssize_t _n_allocated
    cdef vector[Py_ssize_t] _free
    cdef list _events               # None: events disabled
    cdef CachePolicy _pol
    cdef Py_ssize_t _n_evictable
    cdef Py_ssize_t _n_pending
    cdef Py_ssize_t _threshold
    cdef Py_ssize_t _max_tracker
    cdef object _counts             # OrderedDict key -> offers, or None
    cdef Py_ssize_t _skipped
    cdef list _alloc_sizes
    cdef object _info_obj
    cdef int64_t _generation_c
    cdef int64_t _owner_c
    cdef dict __dict__              # OffloadingManager.lock keeps its lock here

    def __init__(self, num_chunks, cache_policy="lru", cache_policy_module_path=None,
                 enable_events=False, store_threshold=1, max_tracker_size=64_000, info=None):
        cdef Py_ssize_t n = _check_int("num_chunks", num_chunks)
        if not isinstance(cache_policy, str):
            raise TypeError(f"cache_policy must be a str, got {type(cache_policy).__name__}")
        if cache_policy_module_path is not None and not isinstance(cache_policy_module_path, str):
            raise TypeError(
                f"cache_policy_module_path must be a str or None, got {type(cache_policy_module_path).__name__}"
            )
        cdef Py_ssize_t threshold = _check_int("store_threshold", store_threshold)
        cdef Py_ssize_t tracker = _check_int("max_tracker_size", max_tracker_size)
        if info is not None and not isinstance(info, dict):
            raise TypeError(f"info must be a CPUOffloadingInfo (a dict) or None, got {type(info).__name__}")
        policy_cls = None
        if cache_policy_module_path is None:
            policy_cls = _BUILTIN_POLICIES.get(cache_policy)
        if policy_cls is None:
            from kvcy.kv_offload.cpu.policies.factory import CachePolicyFactory

            policy_cls = CachePolicyFactory.get_cache_policy_cls(cache_policy, cache_policy_module_path)
        policy = policy_cls(cache_capacity=num_chunks)
        if not isinstance(policy, CachePolicy):
            raise TypeError(
                f"the compiled CPUOffloadingManager needs a policy derived from its own CachePolicy "
                f"(kvcy._fast._offload_c.CachePolicy), got {type(policy).__name__}"
            )
        self._pol = <CachePolicy>policy
        self._n_chunks = n
        self._n_allocated = 0
        self._events = [] if enable_events else None
        self._n_evictable = 0
        self._n_pending = 0
        self._threshold = threshold
        self._max_tracker = tracker
        self._counts = OrderedDict() if threshold >= 2 else None
        self._skipped = 0
        self._alloc_sizes = []
        self._info_obj = info
        self._generation_c = 0
        self._owner_c = _next_owner()

    # -- read-only views of the state (what vLLM's replayer reads) ----------------
    @property
    def medium(self):
        return _CPU

    @property
    def events(self):
        return self._events

    @property
    def _policy(self):
        return self._pol

    @property
    def _num_chunks(self):
        return self._n_chunks

    @property
    def _num_allocated_chunks(self):
        return self._n_allocated

    @property
    def _free_list(self):
        return [c for c in self._free]

    @property
    def _num_evictable_cache_chunks(self):
        return self._n_evictable

    @property
    def _num_write_pending_chunks(self):
        return self._n_pending

    @property
    def store_threshold(self):
        return self._threshold

    @property
    def max_tracker_size(self):
        return self._max_tracker

    @property
    def counts(self):
        return self._counts

    @property
    def stores_skipped_in_current_batch(self):
        return self._skipped

    @property
    def allocation_sizes_in_current_batch(self):
        return list(self._alloc_sizes)

    @property
    def _info(self):
        return self._info_obj

    @property
    def _generation(self):
        return self._generation_c

    @property
    def _owner(self):
        return self._owner_c

    lock = OffloadingManager.lock

    # -- records ---------------------------------------------------------------
    cdef _AccessRecord _get_record(self, object ctx, bint create):
        cdef _AccessRecords holder
        cdef _AccessRecord rec
        state = ctx.get_state(_AccessRecords)
        if state is None:
            if not create:
                return None
            holder = _AccessRecords.__new__(_AccessRecords)
            holder.records = {}
            ctx.set_state(holder)
        else:
            holder = <_AccessRecords?>state
        got = holder.records.get(self._owner_c)
        if type(got) is _AccessRecord and (<_AccessRecord>got).generation == self._generation_c:
            return <_AccessRecord>got
        if not create:
            return None
        rec = _AccessRecord.__new__(_AccessRecord)
        rec.generation = self._generation_c
        rec.keys = {}
        rec.inserted_log = []
        holder.records[self._owner_c] = rec
        return rec

    cdef int _record(self, _AccessRecord rec, list keys, list reused, object ctx,
                     _Positions pos, list statuses, bint track_missed=False,
                     list hints=None) except -1:
        """Note keys a request loaded or offered; the policy hears of the new ones.

        ``statuses`` (optional, parallel to ``keys``) are the keys' chunks as the
        caller found them, ``None`` for a key that is not resident: the native
        LRU policy then only looks at the resident ones (it ignores the others).
        With ``track_missed`` the non-resident ones are this offer's store
        misses, noted in their flags here.  ``hints`` (native LRU, optional,
        parallel to ``keys``): the record's value for each new key instead of
        its status (the chunk a new key is about to get).
        """
        cdef dict flags = rec.keys
        cdef list new_keys = None
        cdef PyObject *f
        cdef Py_ssize_t i, n = len(keys)
        cdef bint filter_resident = statuses is not None and self._pol._native
        cdef bint lru = type(self._pol) is LRUCachePolicy
        cdef bint missed
        cdef Py_ssize_t size = PyDict_Size(flags)
        if size == 0 and n > 8:
            # a request's first batch of keys: one table of the right size
            # instead of growing it key by key
            flags = <dict>_PyDict_NewPresized(n)
            rec.keys = flags
        for i in range(n):
            key = keys[i]
            missed = track_missed and statuses[i] is None
            if lru:
                # the native LRU keeps no flags: the value is the key's chunk
                # when known (a hint for on_request_finished), else None
                PyDict_SetDefault(flags, key, hints[i] if hints is not None
                                  else (None if statuses is None else statuses[i]))
            else:
                PyDict_SetDefault(flags, key, _FLAG_MISSED if missed else _FLAG_NONE)
            if PyDict_Size(flags) == size:
                # seen before
                if missed:
                    f = PyDict_GetItemWithError(flags, key)
                    if f != NULL and not ((<Py_ssize_t><object>f) & _MISSED):
                        flags[key] = (<Py_ssize_t><object>f) | _MISSED
                continue
            size += 1
            if filter_resident and statuses[i] is None:
                if new_keys is None:
                    new_keys = []
                continue
            if new_keys is None:
                new_keys = []
            new_keys.append(key)
        if new_keys is not None:
            self._pol.c_on_request_access(new_keys, ctx, pos)
        if not reused or type(self._pol) is LRUCachePolicy:
            return 0        # (the native LRU reads no flags)
        rec.fold()
        for key in reused:
            f = PyDict_GetItemWithError(flags, key)
            if f != NULL and not ((<Py_ssize_t><object>f) & (_INSERTED | _REUSED)):
                flags[key] = (<Py_ssize_t><object>f) | _REUSED
        return 0

    cdef int _update_tracker(self, list keys) except -1:
        """Count one offer: offered keys move to the newest end, new ones enter
        with count 1, evicting the oldest keys not in this offer while full."""
        counts = self._counts
        cdef Py_ssize_t protected = 0
        for key in keys:
            count = counts.get(key)
            if count is not None:
                counts.move_to_end(key)
                counts[key] = count + 1
                protected += 1
        cdef Py_ssize_t unprotected = len(counts) - protected
        for key in keys:
            if key in counts:
                continue
            if len(counts) >= self._max_tracker:
                if unprotected == 0:
                    continue
                counts.popitem(last=False)
                unprotected -= 1
            counts[key] = 1
        return 0

    # -- the OffloadingManager API ---------------------------------------------
    @cython.binding(False)
    @cython.embedsignature(True)
    @cython.embedsignature.format("clinic")
    def lookup(self, key, req_context):
        """``HIT`` if ``key`` is readable, ``HIT_PENDING`` if being written, else ``MISS``.

        No side effects: recency and the store tracker are untouched.

        Raises:
            TypeError: ``key`` is not bytes.
            ValueError: ``key`` is shorter than 4 bytes.
        """
        cdef PyObject *p
        cdef ChunkStatus st
        if type(key) is not bytes or PyBytes_GET_SIZE(key) < 4:
            _check_key_slow(key)
        if self._pol._native:
            p = PyDict_GetItemWithError(self._pol._chunks, key)
            if p == NULL or _is_ghost(<_Node>p):
                return _MISS
            st = <ChunkStatus>p
        else:
            st = self._pol.c_get(key)
            if st is None:
                return _MISS
        return _HIT if st.ref_cnt >= 0 else _HIT_PENDING

    def count_hits(self, keys, req_context, start=0, stop=None):
        """How many of ``keys[start:stop]``, from the first, ``lookup`` as ``HIT``.

        The connector's admission loop (one ``lookup`` per key until the first
        one that is not a ``HIT``) as one call; like ``lookup``, no side
        effects.  Only the keys looked at are checked.

        Args:
            keys: a list of offload keys.
            req_context: the request looking.
            start: the first index looked at (clamped to ``len(keys)``).
            stop: one past the last (``None``: the end; clamped likewise).

        Raises:
            TypeError: ``keys`` is not a list, ``start`` / ``stop`` are not
                ints, or a key looked at is not bytes.
            ValueError: a negative ``start`` / ``stop``, or a key looked at is
                shorter than 4 bytes.
        """
        cdef list ks
        cdef Py_ssize_t n, i, first, last
        cdef PyObject *p
        cdef ChunkStatus st
        cdef CachePolicy policy = self._pol
        if type(keys) is not list:
            raise TypeError(f"keys must be a list of offload keys, got {type(keys).__name__}")
        ks = <list>keys
        n = len(ks)
        first = _check_int("start", start)
        last = n if stop is None else _check_int("stop", stop)
        if first > n:
            first = n
        if last > n:
            last = n
        i = first
        while i < last and i < len(ks):
            key = ks[i]
            if type(key) is not bytes or PyBytes_GET_SIZE(key) < 4:
                _check_key_slow(key)
            if policy._native:
                p = PyDict_GetItemWithError(policy._chunks, key)
                if p == NULL or _is_ghost(<_Node>p) or (<ChunkStatus>p).ref_cnt < 0:
                    break
            else:
                # a Python policy: its get may run any code (the list may change)
                st = policy.c_get(key)
                if st is None or st.ref_cnt < 0:
                    break
            i += 1
        return i - first if i > first else 0

    def get_load_source(self, key, req_context):
        """Always ``CacheHitSource.HOST``: hits come from host memory."""
        _check_key(key)
        return _HOST

    def prepare_load(self, keys, req_context):
        """Pin readable keys for a load and note the access for the request.

        A key listed twice is pinned twice.

        Returns:
            The keys' chunks, in key order.

        Raises:
            AssertionError: a key is not resident or not readable yet, or the
                request already finished and a key is new to it (vLLM's
                messages); nothing is changed.
        """
        return self._prepare_load(keys, req_context, record_access=True)

    def _prepare_load(self, keys, req_context, *, record_access):
        """``prepare_load``; with ``record_access=False`` only the pins (a pin-only read)."""
        cdef list ks = _check_keys(keys)
        cdef bint record = bool(record_access)
        cdef CachePolicy policy = self._pol
        cdef list chunks = []
        cdef ChunkStatus st
        cdef _AccessRecord rec = None
        cdef vector[Py_ssize_t] ids
        cdef Py_ssize_t i
        if record:
            _check_context(req_context)
        for key in ks:
            st = policy.c_get(key)
            if st is None:
                raise AssertionError(f"Chunk {key!r} not found in cache")
            if st.ref_cnt < 0:
                raise AssertionError(f"Chunk {key!r} is not ready for reading")
            chunks.append(st)
        if record:
            rec = self._get_record(req_context, True)
            if rec.finished:
                for key in ks:
                    if key not in rec.keys:
                        raise AssertionError(_FINALIZED)
        ids.reserve(len(ks))
        for i in range(len(ks)):
            st = <ChunkStatus>chunks[i]
            if st.ref_cnt == 0:
                if not policy._native:
                    policy.c_mark_non_evictable(<bytes>ks[i])
                self._n_evictable -= 1
            st.ref_cnt += 1
            ids.push_back(st.chunk_id)
        if rec is not None:
            self._record(rec, ks, ks, req_context, _positions(req_context), chunks)
        return _chunk_spec(ids)

    def touch(self, keys, req_context):
        """Tell the policy the keys were used (the first key ends most recent)."""
        self._pol.c_touch(_check_keys(keys), req_context)

    def complete_load(self, keys, req_context):
        """Unpin keys pinned by ``prepare_load``; a key unpinned to 0 is evictable again.

        Raises:
            AssertionError: a key is not resident, or has no pin left to
                release (vLLM's messages); nothing is changed.
        """
        cdef list ks = _check_keys(keys)
        cdef CachePolicy policy = self._pol
        cdef list chunks = []
        cdef ChunkStatus st
        cdef Py_ssize_t i, j
        cdef vector[Py_ssize_t] zeroed
        # Check by releasing tentatively (a key listed twice needs two pins),
        # and put every pin back before raising.
        for i in range(len(ks)):
            key = ks[i]
            st = policy.c_get(key)
            if st is None or st.ref_cnt <= 0:
                for j in range(i - 1, -1, -1):
                    (<ChunkStatus>chunks[j]).ref_cnt += 1
                if st is None:
                    raise AssertionError(f"Chunk {key!r} not found")
                raise AssertionError(f"Chunk {key!r} ref_cnt is already 0")
            st.ref_cnt -= 1
            chunks.append(st)
            if st.ref_cnt == 0:
                zeroed.push_back(i)
        for i in range(<Py_ssize_t>zeroed.size()):
            self._n_evictable += 1
            if not policy._native:
                policy.c_mark_evictable(<bytes>ks[zeroed[i]])

    def prepare_store(self, keys, req_context):
        """Reserve chunks for the offered keys that are not resident yet.

        Keys already readable are kept (and never evicted for this offer);
        keys being written are skipped.  With ``store_threshold >= 2`` a new
        key is stored only once offered that often.

        Args:
            keys: the offer, in prefix order, each key once.
            req_context: the offering request.

        Returns:
            The keys to write, their chunks and the keys evicted for them
            (an empty output when nothing needs writing), or ``None`` when
            not enough chunks can be evicted.

        Raises:
            ValueError: a key is offered twice.
            AssertionError: the request already finished and a key is new to
                it (vLLM's message); nothing is changed.
        """
        cdef list offer = _check_keys(keys)
        cdef CachePolicy policy = self._pol
        cdef Py_ssize_t n_offer = len(offer)
        cdef list new = []
        cdef list ready = []
        cdef list statuses = []         # per offered key: its chunk, or None
        cdef list new_ghosts = None     # native ARC, per new key: its ghost node, or None
        cdef list pre_new = None        # native LRU, per new key: the status it will get
        cdef list record_hints = None
        cdef list miss_ghosts = None
        cdef bint is_arc = type(policy) is ARCCachePolicy
        cdef PyObject *p
        cdef list to_record, misses, evicted_keys, evicted, record_statuses
        cdef set offered, kept = None
        cdef dict flags
        cdef ChunkStatus st
        cdef Py_ssize_t n, need, i, num_fresh, threshold = self._threshold
        cdef _AccessRecord rec
        cdef _Positions pos
        cdef PyObject *f
        cdef vector[Py_ssize_t] ids
        counts = self._counts
        _check_context(req_context)
        offered = set(offer)
        if len(offered) != n_offer:
            offered = set()
            for key in offer:
                if key in offered:
                    raise ValueError(f"prepare_store got key {key!r} more than once")
                offered.add(key)
        if is_arc:
            new_ghosts = []
        for key in offer:
            if is_arc:
                # one lookup says resident, ghost (kept for the store miss
                # and the insert below) or neither
                p = PyDict_GetItemWithError(policy._chunks, key)
                if p == NULL:
                    st = None
                    new_ghosts.append(None)
                elif _is_ghost(<_Node>p):
                    st = None
                    new_ghosts.append(<_Node>p)
                else:
                    st = <ChunkStatus>p
            else:
                st = policy.c_get(key)
            statuses.append(st)
            if st is None:
                new.append(key)
                if counts is not None:
                    # after the tracker update a tracked key counts one more and
                    # an untracked one at most 1, below any threshold >= 2
                    c = counts.get(key)
                    if c is not None and c + 1 >= threshold:
                        if kept is None:
                            kept = set()
                        kept.add(key)
            elif st.ref_cnt >= 0:
                ready.append(key)
        rec = self._get_record(req_context, True)
        flags = rec.keys
        if counts is None and len(new) + len(ready) == n_offer:
            to_record = offer
            record_statuses = statuses
            if type(policy) is LRUCachePolicy and new:
                # the chunks the new keys will get, made now, so that the
                # record notes them (on_request_finished reads them) as it
                # notes the resident keys' chunks
                pre_new = []
                record_hints = []
                for i in range(n_offer):
                    st = <ChunkStatus>statuses[i]
                    if st is None:
                        st = _new_status(-1)
                        pre_new.append(st)
                    record_hints.append(st)
        else:
            # offered keys that are kept (new, past the threshold) or ready
            if kept is None:
                kept = set() if counts is not None else set(new)
            to_record = []
            record_statuses = []
            for i in range(n_offer):
                st = <ChunkStatus>statuses[i]
                if (st is None and offer[i] in kept) or (st is not None and st.ref_cnt >= 0):
                    to_record.append(offer[i])
                    record_statuses.append(st)
        if rec.finished:
            for key in to_record:
                if key not in flags:
                    raise AssertionError(_FINALIZED)
        pos = _positions(req_context)

        # 1. the offer tracker
        if counts is not None:
            self._update_tracker(offer)
            if len(kept) != len(new):
                self._skipped += len(new) - len(kept)
                new = [k for k in new if k in kept]
                new_ghosts = None       # (no longer parallel to new)
        # 2. the policy hears of each miss once per request
        misses = None
        if new and type(policy) is not LRUCachePolicy:
            # (the native LRU policy ignores store misses: nothing to track)
            misses = []
            if new_ghosts is not None:
                miss_ghosts = []
            for i in range(len(new)):
                key = new[i]
                f = PyDict_GetItemWithError(flags, key)
                if f == NULL or not ((<Py_ssize_t><object>f) & _MISSED):
                    misses.append(key)
                    if miss_ghosts is not None:
                        miss_ghosts.append(new_ghosts[i])
            if miss_ghosts is not None:
                # the ghost hits of these misses, from the nodes found above
                (<ARCCachePolicy>policy).c_ghost_hits(miss_ghosts)
            elif misses:
                policy.c_on_store_miss(misses, req_context)
        # 3. the access record (and the misses, in it)
        self._record(rec, to_record, ready, req_context, pos, record_statuses, misses is not None,
                     record_hints)
        n = len(new)
        if n == 0:
            return PrepareStoreOutput(keys_to_store=[], store_spec=_chunk_spec(ids), evicted_keys=[])

        # 4. room: evict what the free chunks do not cover
        self._alloc_sizes.append(n)
        need = n - (<Py_ssize_t>self._free.size() + self._n_chunks - self._n_allocated)
        evicted_keys = []
        if need > 0:
            if need > self._n_evictable:
                return None
            # only resident, ready keys of the offer could be evicted: they are
            # the ones to protect (new keys are not resident, pending ones not evictable)
            if policy._native:
                evicted = policy.c_evict(need, set(ready) if ready else None)
            else:
                evicted = policy.c_evict(need, offered)
            if evicted is None:
                return None
            self._n_evictable -= need
            for s in evicted:
                self._free.push_back((<ChunkStatus>s).chunk_id)
                evicted_keys.append((<ChunkStatus>s).key)
            if self._events is not None:
                self._events.append(OffloadingEvent(keys=list(evicted_keys), medium=_CPU, removed=True))

        # 5. allocate: fresh chunks first, then freed ones, last freed first
        ids.reserve(n)
        num_fresh = self._n_chunks - self._n_allocated
        if num_fresh > n:
            num_fresh = n
        for i in range(num_fresh):
            ids.push_back(self._n_allocated + i)
        self._n_allocated += num_fresh
        for i in range(n - num_fresh):
            ids.push_back(self._free.back())
            self._free.pop_back()
        if new_ghosts is not None:
            (<ARCCachePolicy>policy).c_insert_new_ghosts(new, ids, new_ghosts)
        elif pre_new is not None:
            (<LRUCachePolicy>policy).c_insert_new_noted(new, ids, req_context, pos, pre_new)
        else:
            policy.c_insert_new(new, ids, req_context, pos)
        self._n_pending += n
        if type(policy) is not LRUCachePolicy:
            rec.inserted_log.extend(new)     # (the native LRU reads no flags)
        return PrepareStoreOutput(keys_to_store=new, store_spec=_chunk_spec(ids), evicted_keys=evicted_keys)

    def complete_store(self, keys, req_context, success=True):
        """Finish the writes of keys being written: readable on success, dropped on failure.

        Keys not being written (unknown, already readable, repeated) are ignored.
        """
        cdef list ks = _check_keys(keys)
        cdef CachePolicy policy = self._pol
        cdef list done = []
        cdef ChunkStatus st
        if success:
            for key in ks:
                st = policy.c_get(key)
                if st is not None and st.ref_cnt < 0:
                    st.ref_cnt = 0
                    self._n_pending -= 1
                    self._n_evictable += 1
                    if not policy._native:
                        policy.c_mark_evictable(<bytes>key)
                    done.append(key)
        else:
            for key in ks:
                st = policy.c_get(key)
                if st is not None and st.ref_cnt < 0:
                    self._n_pending -= 1
                    policy.c_remove(<bytes>key)
                    self._free.push_back(st.chunk_id)
                    done.append(key)
        if done and self._events is not None:
            if success:
                self._events.append(OffloadingEvent(keys=done, medium=_CPU, removed=False))
            else:
                self._events.append(OffloadingEvent(keys=done, medium=_CPU, removed=True, metadata_only=True))

    def on_new_request(self, req_context):
        """Start the request's access record; every chunk is offloaded as computed."""
        _check_context(req_context)
        self._get_record(req_context, True)
        return RequestOffloadingContext()

    def on_request_finished(self, req_context):
        """Close the request's record and let the policy rank its keys.

        Nothing happens for a request with no record since the last reset,
        or one already finished.
        """
        cdef _AccessRecord rec
        cdef list groups, members, ordered, keys
        cdef _Positions pos
        cdef vector[Py_ssize_t] order
        _check_context(req_context)
        rec = self._get_record(req_context, False)
        if rec is None or rec.finished:
            return
        rec.finished = True
        pos = _positions(req_context)
        if type(self._pol) is LRUCachePolicy:
            # the native LRU ranks the keys by position only: no flags (it
            # keeps none), and one group in the common case
            (<LRUCachePolicy>self._pol).c_finish_keys(list(rec.keys), pos, list(rec.keys.values()))
            return
        rec.fold()
        if type(self._pol) is ARCCachePolicy:
            # one group (the common case): the flags as they are, no sets
            keys = list(rec.keys)
            if _one_group_order(keys, pos, order):
                (<ARCCachePolicy>self._pol).c_finish_flags(keys, list(rec.keys.values()), order)
                return
        by_group = {}
        insertion_only = set()
        reused = set()
        for key, fl in rec.keys.items():
            gi = _group_of(<bytes>key)
            members = by_group.get(gi)
            if members is None:
                by_group[gi] = [key]
            else:
                (<list>members).append(key)
            if (<Py_ssize_t>fl) & _REUSED:
                reused.add(key)
            elif (<Py_ssize_t>fl) & _INSERTED:
                insertion_only.add(key)
        groups = []
        for gi in sorted(by_group):
            members = <list>by_group[gi]
            ordered = _by_position(members, pos)
            groups.append(members if ordered is None else ordered)
        self._pol.c_on_request_finished(groups, insertion_only, reused, req_context, pos)

    def take_events(self):
        """Yield the queued events, oldest first (a generator).

        The queue is taken when iteration starts.  A failed store's event
        keeps only the keys still not resident, and is dropped if none are.
        """
        if self._events is None:
            return
        events = self._events
        self._events = []
        for event in events:
            if event.metadata_only:
                keys = [key for key in event.keys if self._pol.c_get(key) is None]
                if not keys:
                    continue
                if len(keys) != len(event.keys):
                    event.keys = keys
            yield event

    def on_schedule_end(self, context):
        """Nothing to do at the end of a step."""
        return None

    def has_pending_work(self):
        """Always ``False``: the CPU tier does no work of its own between steps."""
        return False

    def reset_cache(self):
        """Forget every chunk; chunk ids restart at 0.

        Queued events, the store tracker and the stats accumulators are kept.
        Requests' records from before the reset are abandoned.
        """
        self._pol.c_clear()
        self._generation_c += 1
        self._n_evictable = 0
        self._n_pending = 0
        self._free.clear()
        self._n_allocated = 0

    def on_reset_flushed(self):
        """Nothing to do."""
        return None

    def get_stats(self):
        """Usage gauges, allocation sizes and skipped stores since the previous call."""
        if _Metrics is None:
            _load_cpu_common()
        stats = OffloadingConnectorStats()
        cdef double usage = 0.0, write_usage = 0.0, read_usage
        cdef Py_ssize_t used = self._n_allocated - <Py_ssize_t>self._free.size() - self._n_evictable
        if self._n_chunks > 0:
            usage = <double>used / <double>self._n_chunks
            write_usage = <double>self._n_pending / <double>self._n_chunks
        stats.set_gauge(_Metrics.CPU_CACHE_USAGE_PERC, usage)
        for size in self._alloc_sizes:
            stats.observe_histogram(_Metrics.CPU_ALLOCATION_SIZE, size)
        self._alloc_sizes = []
        stats.set_gauge(_Metrics.CPU_CACHE_WRITE_USAGE_PERC, write_usage)
        read_usage = usage - write_usage
        stats.set_gauge(_Metrics.CPU_CACHE_READ_USAGE_PERC, 0.0 if read_usage < 0.0 else read_usage)
        if self._threshold >= 2:
            stats.increase_counter(_Metrics.STORES_SKIPPED, self._skipped)
            self._skipped = 0
        return stats

    def config_info(self):
        """``[dict(info)]``, or ``[{}]`` without info."""
        return [dict(self._info_obj)] if self._info_obj is not None else [{}]

    def shutdown(self):
        """Nothing to release."""
        return None


OffloadingManager.register(CPUOffloadingManager)
