# cython: annotation_typing=False
"""Compiled twin of the KV-aware routing index (``kvcy.kv_index.KVIndex``).

Same names, signatures, docstrings, messages and decisions as ``_kv_index_py``
(the reference; its class docstring defines the semantics).  The data live in C
arrays:

* every distinct block hash held is interned to a small id (``hid``) through an
  open-addressing table (linear probing, backward-shift deletion) keyed by the
  64-bit hash itself, or for ``bytes`` hashes by a 64-bit digest of the bytes
  plus a full compare against the ``bytes`` object the index keeps;
* per ``hid``, one bitset of instances per medium and one for "any medium",
  ``W`` 64-bit words each (``W`` grows with the number of instances);
* entries ``(instance, medium, hid)`` live in a second table, with their count,
  in a least-recently-stored list (for ``max_blocks``) and in a list per
  instance (so ``AllBlocksCleared`` and ``remove_instance`` cost what the
  instance holds).

A query walks the hashes once, narrowing the running set of instances and
recording where each one drops out.  ``apply_events`` checks and copies every
hash, reserves all the memory the events may take, then applies them with no
Python code or allocation in between: bad input or a ``MemoryError`` leaves
the index as it was.  C helpers (tables, hashing) are in ``_kv_index.h``.
"""

cimport cython
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_GET_SIZE
from cpython.buffer cimport PyBUF_FORMAT, PyBUF_STRIDES, PyBuffer_IsContiguous, PyBuffer_Release, PyObject_CheckBuffer, PyObject_GetBuffer
from cpython.dict cimport PyDict_SetItem
from cpython.mem cimport PyMem_Free, PyMem_Malloc, PyMem_Realloc
from cpython.ref cimport PyObject, Py_DECREF, Py_INCREF
from libc.stdint cimport uint32_t, uint64_t
from libc.string cimport memcmp, memcpy, memset

import sys as _sys

from kvcy.kv_events import AllBlocksCleared, BlockRemoved, BlockStored, KVEventBatch, as_kv_event_batch

__all__ = ["IMPLEMENTATION", "MAX_INSTANCES", "MAX_INSTANCE_MEDIUMS", "MAX_MEDIUMS", "KVIndex"]

IMPLEMENTATION = "cython"
#: At most this many instances are known at once (``remove_instance`` frees a place).
MAX_INSTANCES = 65536
#: At most this many distinct mediums (``None`` is one) in use at once; ``None``, ``"GPU"``,
#: ``"CPU"`` and ``"STORAGE"`` always find a place.
MAX_MEDIUMS = 256
#: At most this many mediums besides those four may one instance use (until it is removed).
MAX_INSTANCE_MEDIUMS = 8

#: The mediums vLLM's events name (and None): never refused, counted in no instance's bound.
_COMMON_MEDIUMS = frozenset((None, "GPU", "CPU", "STORAGE"))
#: A medium id free for reuse, in ``_mnames`` (``None`` is a medium's name).
_FREE = object()

cdef extern from "Python.h":
    PyObject **PySequence_Fast_ITEMS(object o)
    Py_ssize_t PySequence_Fast_GET_SIZE(object o)

cdef extern from "_kv_index.h":
    int kvcy_kvi_u64(PyObject *o, unsigned long long *out) noexcept
    int kvcy_kvi_read(PyObject *o, unsigned long long *out) noexcept
    int kvcy_kvi_ctz(unsigned long long x) noexcept nogil
    void kvcy_kvi_prefetch(const void *p) noexcept nogil
    uint32_t NIL "KVI_NIL"
    uint64_t _digest "kvcy_kvi_digest"(const char *p, Py_ssize_t n) noexcept nogil
    Py_ssize_t _home "kvcy_kvi_home"(uint64_t key, uint32_t tag, int shift) noexcept nogil
    uint64_t _pack "kvcy_kvi_pack"(uint32_t hid, uint32_t mid, uint32_t iid) noexcept nogil
    ctypedef struct Slot "kvi_slot":
        uint64_t key
        uint32_t val    # the index (hid or entry) + 1; 0: empty
        uint32_t tag    # hash table: 1 for a bytes hash; entry table: 0
    void _slot_put "kvcy_kvi_slot_put"(Slot *slots, Py_ssize_t mask, int shift, uint64_t key, uint32_t tag,
                                       uint32_t val) noexcept nogil
    void _slot_del "kvcy_kvi_slot_del"(Slot *slots, Py_ssize_t mask, int shift, uint64_t key, uint32_t tag,
                                       uint32_t val) noexcept nogil

cdef inline int _read_hash(PyObject *h, uint64_t *key, PyObject **obj) noexcept:
    """0: ``*key``/``*obj`` describe the hash; 1: not an int or bytes; 2: an int out of range."""
    cdef unsigned long long v
    cdef int kind = kvcy_kvi_read(h, &v)
    if kind == 0:
        key[0] = v
        obj[0] = NULL
        return 0
    if kind == 1:
        key[0] = _digest(PyBytes_AS_STRING(<object>h), PyBytes_GET_SIZE(<object>h))
        obj[0] = h
        return 0
    return 2 if kind == 2 else 1


cdef object _hash_error(int code, object h, str where):
    if code == 1:
        return TypeError(f"{where}: a block hash is an int or bytes, got {type(h).__name__}")
    return ValueError(f"{where}: block hash {h} is not an unsigned 64-bit int")


cdef inline str _instance_name(object instance, str what):
    """``instance`` as a plain ``str`` (a subclass's value, without its methods)."""
    if type(instance) is str:
        return <str>instance
    if not isinstance(instance, str):
        raise TypeError(f"{what} must be a str, got {type(instance).__name__}")
    return str.__str__(instance)


cdef inline int _check_medium(object medium, str where) except -1:
    if medium is not None and type(medium) is not str:
        raise TypeError(f"{where} must be a str or None, got {type(medium).__name__}")
    return 0


cdef void *_grow(void *p, Py_ssize_t old_n, Py_ssize_t new_n, Py_ssize_t size) except NULL:
    """``p`` reallocated from ``old_n`` to ``new_n`` items of ``size`` bytes, the new ones zeroed."""
    cdef void *q = PyMem_Realloc(p, <size_t>(new_n * size) if new_n > 0 else 1)
    if q == NULL:
        raise MemoryError()
    if new_n > old_n:
        memset(<char *>q + old_n * size, 0, <size_t>((new_n - old_n) * size))
    return q


cdef inline Py_ssize_t _capacity(Py_ssize_t cap, Py_ssize_t want, Py_ssize_t least) noexcept:
    """A new capacity for ``want`` items: doubled (at least ``least``), below ``NIL``."""
    cap = max(least, 2 * cap)
    while cap < want:
        cap *= 2
    return min(cap, <Py_ssize_t>NIL - 1)


cdef object _buffer_error(Py_buffer *view):
    """None for a 1-D C-contiguous buffer of unsigned 64-bit ints, else the TypeError to raise."""
    fmt = "B" if view.format == NULL else (<bytes>view.format).decode("ascii", "replace")
    if view.ndim == 1 and view.itemsize == 8 and fmt in ("Q", "L", "@Q", "@L", "=Q", "<Q") \
            and PyBuffer_IsContiguous(view, b"C"):
        return None
    return TypeError("block_hashes as a buffer must be a 1-D C-contiguous array of unsigned 64-bit ints "
                     f"(format 'Q' or 'L'), got format {fmt!r} with {view.ndim} dimension(s)")


cdef struct _Staged:
    # The events of one apply_events call, checked and copied aside before any is applied.
    Py_ssize_t n                 # events
    Py_ssize_t total, cap        # hashes copied, room for
    Py_ssize_t nstore            # of them in BlockStored events
    uint64_t *keys               # per hash: the int, or the digest of the bytes
    PyObject **objs              # per hash: the bytes object (borrowed from the staged tuples), or NULL
    Py_ssize_t *info             # per event: kind (0 stored, 1 removed, 2 cleared), medium id, count


@cython.final
cdef class KVIndex:
    """Which instance of a fleet holds which KV-cache block, from their KV events.

    Each instance (any ``str``, kept as a plain ``str``: ``"host:port"``, ``"host:port/dp0"``)
    publishes ``KVEventBatch``es; :meth:`apply_batch` / :meth:`apply_events` fold them into
    entries, one per ``(instance, medium, block hash)``; :meth:`longest_prefix` tells, for a
    request's chained block hashes (hash ``i`` stands for the prefix up to block ``i``), how
    many leading blocks each instance holds, and :meth:`best_instance` picks the longest.

    Semantics, the same in both twins:

    * An entry is reference-counted: each ``BlockStored`` hash adds one, each ``BlockRemoved``
      hash takes one away, and the entry is gone at zero.  A hash stored twice in one medium
      (by two KV-cache groups of a hybrid model, or by two blocks of one group, as vLLM's
      prefix cache allows) and removed once is still held: vLLM evicts, and reports, each
      copy apart.  (With vLLM's ``kv_cache_report_mode="full"``, prefix hits are re-reported
      as ``BlockStored`` with no removal to match, so an entry can outlive its blocks until
      ``AllBlocksCleared`` or :meth:`remove_instance`.)  ``group_idx`` is not kept otherwise.
    * Mediums are apart: a hash in ``"GPU"`` and ``"CPU"`` is two entries; removing one leaves
      the other.  ``None`` is a medium of its own; ``medium=None`` in a query means any.  A
      medium is in use from the first event of an instance that names it until every instance
      that named one is removed; one instance may name at most ``MAX_INSTANCE_MEDIUMS``
      mediums besides ``None``, ``"GPU"``, ``"CPU"`` and ``"STORAGE"`` (so that no instance
      can fill the index's ``MAX_MEDIUMS`` and refuse the others' stores), and those four
      always find a place.
    * A ``BlockRemoved`` hash not held in that medium is a no-op, counted
      (``stats["removals_unknown"]``).  ``AllBlocksCleared`` forgets all the instance holds,
      in every medium (vLLM sends it when its prefix cache is reset).
    * Hashes are kept as received: ``int`` (vLLM's default, the low 64 bits) or ``bytes``
      (``use_int_block_hashes=False``); ``5`` and ``b"\\x05"`` differ, so do not mix the forms
      in one fleet.  ``bool`` and ``bytes`` subclasses are no hashes.  LoRA fields are ignored
      (vLLM's hashes cover the adapter's name), and so is ``data_parallel_rank`` (name the
      instances per rank to tell the ranks apart).
    * With ``max_blocks``, a store that would make one entry too many first drops the least
      recently stored entry (storing one again makes it the most recent), whatever its count,
      counted in ``stats["entries_dropped"]``; a later removal of it counts as unknown.

    Bad input raises before the call changes anything: ``TypeError`` for a name that is not a
    ``str``, an event not of the three classes, ``block_hashes`` not a list or tuple, a hash
    neither ``int`` nor ``bytes``, a medium neither ``str`` nor ``None``; ``ValueError`` for an
    ``int`` hash outside ``[0, 2**64)`` or more than ``MAX_INSTANCES`` instances,
    ``MAX_MEDIUMS`` mediums or ``MAX_INSTANCE_MEDIUMS`` other mediums of one instance.
    """

    cdef object _max_blocks_obj
    cdef Py_ssize_t _max_blocks          # -1: unbounded
    # hash table: block hash -> hid
    cdef Slot *_hslots
    cdef Py_ssize_t _hmask               # number of slots - 1 (-1: no table yet)
    cdef int _hshift                     # 64 - log2(number of slots)
    # per hid
    cdef uint64_t *_hkey                 # the int, or the digest of the bytes; free: the next free hid
    cdef PyObject **_hobj                # the bytes object (a reference held), NULL for an int
    cdef uint32_t *_hrefs                # entries referring to the hid; 0: free
    cdef uint64_t *_bits                 # per hid, stride words: any medium, then medium 0, 1, ...
    cdef Py_ssize_t _hcap, _hlive
    cdef uint32_t _hfree
    cdef Py_ssize_t _W, _mcap, _stride   # words per bitset, mediums with room, words per hid
    # entry table: (hid, mid, iid) -> entry
    cdef Slot *_eslots
    cdef Py_ssize_t _emask
    cdef int _eshift
    cdef uint64_t *_ekey
    cdef uint32_t *_ecount               # 0: free
    cdef uint32_t *_eprev
    cdef uint32_t *_enext                # least recently stored first; free: the next free entry
    cdef uint32_t *_iprev
    cdef uint32_t *_inext                # the instance's entries
    cdef Py_ssize_t _ecap, _elive
    cdef uint32_t _efree, _lru_head, _lru_tail
    # instances
    cdef dict _iids                      # name -> iid
    cdef dict _template                  # {name: 0} in _order's order (None: to rebuild)
    cdef list _ints                      # 0, 1, 2, ...: the counts a query returns
    cdef dict _result                    # the next query's result, made by _prepare
    cdef list _order, _free_iids         # names, first seen first; iids to reuse
    cdef Py_ssize_t _icap, _inext_new
    cdef uint32_t *_ihead
    cdef Py_ssize_t *_icount
    cdef uint32_t *_oiid                 # iids in _order's order
    cdef uint64_t *_alive                # W words: the known instances
    cdef Py_ssize_t *_qpos               # query scratch, per iid
    cdef uint64_t *_qcur                 # query scratch, W words
    # mediums: name -> mid (those in use, first seen first); mid -> name (_FREE: reusable);
    # mid -> instances that named it; instance -> the mediums it named; mediums in use besides
    # the common four
    cdef dict _mids
    cdef list _mnames
    cdef list _musers
    cdef dict _imeds
    cdef Py_ssize_t _mothers
    # counters
    cdef long long _events_applied, _batches_applied, _blocks_stored, _blocks_removed, _removals_unknown
    cdef long long _all_blocks_cleared, _entries_cleared, _entries_dropped, _instances_removed
    cdef Py_ssize_t _bytes_held

    def __cinit__(self):
        self._reset()

    def __init__(self, max_blocks: int | None = 1048576) -> None:
        """Make an empty index, holding at most ``max_blocks`` entries (``None``: no bound).

        Over the bound the least recently stored entry goes first: it is the likeliest to have
        left its instance's cache already, as vLLM evicts its least recently used blocks first.
        The default bound, 2**20 entries (``memory_bytes`` about 130 MiB in the compiled twin,
        410 MiB in the pure one), keeps one flood of events from taking gigabytes; a fleet
        holding more blocks passes its own (``max_blocks`` and ``stats["entries_dropped"]``
        report it).

        Raises:
            TypeError: ``max_blocks`` is not an int or None.
            ValueError: ``max_blocks`` is below 1.
        """
        if max_blocks is not None:
            if not isinstance(max_blocks, int) or isinstance(max_blocks, bool):
                raise TypeError(f"max_blocks must be an int or None, got {type(max_blocks).__name__}")
            if max_blocks < 1:
                raise ValueError(f"max_blocks must be at least 1 (or None), got {max_blocks}")
        self._reset()  # called again, __init__ starts afresh, as the pure twin's does
        self._max_blocks_obj = max_blocks
        self._max_blocks = -1 if max_blocks is None else min(max_blocks, <Py_ssize_t>NIL - 1)
        self._events_applied = self._batches_applied = self._blocks_stored = self._blocks_removed = 0
        self._removals_unknown = self._all_blocks_cleared = self._entries_cleared = 0
        self._entries_dropped = self._instances_removed = 0

    def __dealloc__(self):
        self._free_all()

    cdef int _reset(self) except -1:
        """Forget everything but the counters: the C arrays first, then the Python containers."""
        self._free_all()
        self._iids, self._order, self._free_iids, self._mids, self._mnames, self._ints = {}, [], [], {}, [], []
        self._musers, self._imeds, self._mothers = [], {}, 0
        self._template = None
        return 0

    cdef void _free_all(self) noexcept:
        cdef Py_ssize_t h
        if self._hobj != NULL:
            for h in range(self._hcap):
                if self._hrefs[h] and self._hobj[h] != NULL:
                    Py_DECREF(<object>self._hobj[h])
        PyMem_Free(self._hslots); PyMem_Free(self._hkey); PyMem_Free(self._hobj); PyMem_Free(self._hrefs)
        PyMem_Free(self._bits); PyMem_Free(self._eslots); PyMem_Free(self._ekey); PyMem_Free(self._ecount)
        PyMem_Free(self._eprev); PyMem_Free(self._enext); PyMem_Free(self._iprev); PyMem_Free(self._inext)
        PyMem_Free(self._ihead); PyMem_Free(self._icount); PyMem_Free(self._oiid); PyMem_Free(self._alive)
        PyMem_Free(self._qpos); PyMem_Free(self._qcur)
        self._hslots = self._eslots = NULL
        self._hkey = self._bits = self._ekey = self._alive = self._qcur = NULL
        self._hobj = NULL
        self._hrefs = self._ecount = self._eprev = self._enext = self._iprev = self._inext = NULL
        self._ihead = self._oiid = NULL
        self._icount = self._qpos = NULL
        self._hmask = self._emask = -1
        self._hcap = self._hlive = self._ecap = self._elive = self._icap = self._inext_new = self._bytes_held = 0
        self._W = self._mcap = 1
        self._stride = 2
        self._hfree = self._efree = self._lru_head = self._lru_tail = NIL

    cdef inline uint32_t _hfind(self, uint64_t key, PyObject *obj) noexcept:
        return NIL if self._hmask < 0 else self._hprobe(key, obj, _home(key, obj != NULL, self._hshift))

    cdef inline uint32_t _hprobe(self, uint64_t key, PyObject *obj, Py_ssize_t i) noexcept:
        """The hid of ``key`` / ``obj`` (NULL for an int), probing from slot ``i``; NIL when absent."""
        cdef uint32_t tag = obj != NULL
        cdef Slot *s
        cdef PyObject *o
        while True:
            s = &self._hslots[i]
            if s.val == 0:
                return NIL
            if s.key == key and s.tag == tag:
                if not tag:
                    return s.val - 1
                o = self._hobj[s.val - 1]
                if PyBytes_GET_SIZE(<object>o) == PyBytes_GET_SIZE(<object>obj) and memcmp(
                        PyBytes_AS_STRING(<object>o), PyBytes_AS_STRING(<object>obj),
                        <size_t>PyBytes_GET_SIZE(<object>obj)) == 0:
                    return s.val - 1
            i = (i + 1) & self._hmask

    cdef int _rehash(self, bint hashes, Py_ssize_t want) except -1:
        """Rebuild a table with room for ``want`` items at a load of at most one half."""
        cdef Py_ssize_t n = 16, i
        cdef int shift = 64 - 4  # 16 slots at least
        cdef Slot *slots
        while n < 2 * want:
            n *= 2
            shift -= 1
        if (self._hmask if hashes else self._emask) + 1 >= n:
            return 0
        slots = <Slot *>PyMem_Malloc(<size_t>n * sizeof(Slot))
        if slots == NULL:
            raise MemoryError()
        memset(slots, 0, <size_t>n * sizeof(Slot))
        if hashes:
            for i in range(self._hcap):
                if self._hrefs[i]:
                    _slot_put(slots, n - 1, shift, self._hkey[i], self._hobj[i] != NULL, <uint32_t>i + 1)
            PyMem_Free(self._hslots)
            self._hslots = slots
            self._hmask = n - 1
            self._hshift = shift
        else:
            for i in range(self._ecap):
                if self._ecount[i]:
                    _slot_put(slots, n - 1, shift, self._ekey[i], 0, <uint32_t>i + 1)
            PyMem_Free(self._eslots)
            self._eslots = slots
            self._emask = n - 1
            self._eshift = shift
        return 0

    cdef int _relayout(self, Py_ssize_t W, Py_ssize_t mcap) except -1:
        """Widen the bitsets to ``W`` words and room for ``mcap`` mediums."""
        cdef Py_ssize_t stride = (mcap + 1) * W, h, m
        cdef uint64_t *bits = NULL
        cdef uint64_t *alive = NULL
        cdef uint64_t *qcur = NULL
        if self._hcap:
            bits = <uint64_t *>PyMem_Malloc(<size_t>(self._hcap * stride) * sizeof(uint64_t))
        alive = <uint64_t *>PyMem_Malloc(<size_t>W * sizeof(uint64_t))
        qcur = <uint64_t *>PyMem_Malloc(<size_t>W * sizeof(uint64_t))
        if (self._hcap and bits == NULL) or alive == NULL or qcur == NULL:
            PyMem_Free(bits); PyMem_Free(alive); PyMem_Free(qcur)
            raise MemoryError()
        if self._hcap:
            memset(bits, 0, <size_t>(self._hcap * stride) * sizeof(uint64_t))
            for h in range(self._hcap):
                for m in range(min(self._mcap, mcap) + 1):
                    memcpy(&bits[h * stride + m * W], &self._bits[h * self._stride + m * self._W],
                           <size_t>self._W * sizeof(uint64_t))
        memset(alive, 0, <size_t>W * sizeof(uint64_t))
        if self._alive != NULL:
            memcpy(alive, self._alive, <size_t>self._W * sizeof(uint64_t))
        PyMem_Free(self._bits); PyMem_Free(self._alive); PyMem_Free(self._qcur)
        self._bits = bits
        self._alive = alive
        self._qcur = qcur
        self._W = W
        self._mcap = mcap
        self._stride = stride
        return 0

    cdef int _reserve(self, Py_ssize_t new_entries, Py_ssize_t iid, Py_ssize_t nmediums) except -1:
        """Room for ``new_entries`` more entries and hashes, instance ``iid`` and ``nmediums`` mediums."""
        cdef Py_ssize_t W = self._W, mcap = self._mcap, cap, want, i
        while iid >= 64 * W:
            W *= 2
        while nmediums > mcap:
            mcap *= 2
        if W != self._W or mcap != self._mcap or self._alive == NULL:
            self._relayout(W, mcap)
        if iid >= self._icap:
            cap = _capacity(self._icap, iid + 1, 8)
            self._ihead = <uint32_t *>_grow(self._ihead, self._icap, cap, sizeof(uint32_t))
            self._icount = <Py_ssize_t *>_grow(self._icount, self._icap, cap, sizeof(Py_ssize_t))
            self._oiid = <uint32_t *>_grow(self._oiid, self._icap, cap, sizeof(uint32_t))
            self._qpos = <Py_ssize_t *>_grow(self._qpos, self._icap, cap, sizeof(Py_ssize_t))
            for i in range(self._icap, cap):
                self._ihead[i] = NIL
            self._icap = cap
        if self._max_blocks >= 0:
            new_entries = min(new_entries, self._max_blocks)
        want = self._elive + new_entries
        if want > <Py_ssize_t>NIL - 1:
            raise MemoryError("too many entries for one index")
        if want > self._ecap:
            cap = _capacity(self._ecap, want, 64)
            self._ekey = <uint64_t *>_grow(self._ekey, self._ecap, cap, sizeof(uint64_t))
            self._ecount = <uint32_t *>_grow(self._ecount, self._ecap, cap, sizeof(uint32_t))
            self._eprev = <uint32_t *>_grow(self._eprev, self._ecap, cap, sizeof(uint32_t))
            self._enext = <uint32_t *>_grow(self._enext, self._ecap, cap, sizeof(uint32_t))
            self._iprev = <uint32_t *>_grow(self._iprev, self._ecap, cap, sizeof(uint32_t))
            self._inext = <uint32_t *>_grow(self._inext, self._ecap, cap, sizeof(uint32_t))
            for i in range(cap - 1, self._ecap - 1, -1):
                self._enext[i] = self._efree
                self._efree = <uint32_t>i
            self._ecap = cap
        self._rehash(False, want)
        want = self._hlive + new_entries
        if want > self._hcap:
            cap = _capacity(self._hcap, want, 64)
            self._hkey = <uint64_t *>_grow(self._hkey, self._hcap, cap, sizeof(uint64_t))
            self._hobj = <PyObject **>_grow(self._hobj, self._hcap, cap, sizeof(PyObject *))
            self._hrefs = <uint32_t *>_grow(self._hrefs, self._hcap, cap, sizeof(uint32_t))
            self._bits = <uint64_t *>_grow(self._bits, self._hcap * self._stride, cap * self._stride,
                                           sizeof(uint64_t))
            for i in range(cap - 1, self._hcap - 1, -1):
                self._hkey[i] = self._hfree
                self._hfree = <uint32_t>i
            self._hcap = cap
        self._rehash(True, want)
        return 0

    # ------------------------------------------------------------------ entries (no Python code, no allocation)
    cdef inline uint32_t _efind(self, uint64_t ekey) noexcept:
        cdef Py_ssize_t i
        if self._emask < 0:
            return NIL
        i = _home(ekey, 0, self._eshift)
        while self._eslots[i].val:
            if self._eslots[i].key == ekey:
                return self._eslots[i].val - 1
            i = (i + 1) & self._emask
        return NIL

    cdef void _drop(self, uint32_t e) noexcept:
        """Forget entry ``e``, whatever its count."""
        cdef uint64_t ekey = self._ekey[e]
        cdef uint32_t hid = <uint32_t>(ekey >> 24), mid = (ekey >> 16) & 0xFF, iid = ekey & 0xFFFF
        cdef uint64_t *row = &self._bits[<Py_ssize_t>hid * self._stride]
        cdef uint64_t bit = (<uint64_t>1) << (iid & 63), anywhere = 0
        cdef Py_ssize_t w = iid >> 6, m, nmed = len(self._mnames)
        cdef PyObject *obj
        _slot_del(self._eslots, self._emask, self._eshift, ekey, 0, e + 1)
        # Out of the least-recently-stored list and the instance's list, onto the free list.
        if self._eprev[e] != NIL:
            self._enext[self._eprev[e]] = self._enext[e]
        else:
            self._lru_head = self._enext[e]
        if self._enext[e] != NIL:
            self._eprev[self._enext[e]] = self._eprev[e]
        else:
            self._lru_tail = self._eprev[e]
        if self._iprev[e] != NIL:
            self._inext[self._iprev[e]] = self._inext[e]
        else:
            self._ihead[iid] = self._inext[e]
        if self._inext[e] != NIL:
            self._iprev[self._inext[e]] = self._iprev[e]
        self._ecount[e] = 0
        self._enext[e] = self._efree
        self._efree = e
        self._elive -= 1
        self._icount[iid] -= 1
        # The instance's bits: out of this medium, and out of "any" unless another medium holds it.
        row[(mid + 1) * self._W + w] &= ~bit
        for m in range(nmed):
            anywhere |= row[(m + 1) * self._W + w] & bit
        if not anywhere:
            row[w] &= ~bit
        self._hrefs[hid] -= 1
        if self._hrefs[hid] == 0:
            obj = self._hobj[hid]
            _slot_del(self._hslots, self._hmask, self._hshift, self._hkey[hid], obj != NULL, hid + 1)
            if obj != NULL:
                self._bytes_held -= PyBytes_GET_SIZE(<object>obj) + 33
                self._hobj[hid] = NULL
                Py_DECREF(<object>obj)
            self._hkey[hid] = self._hfree
            self._hfree = hid
            self._hlive -= 1

    cdef void _store(self, uint32_t iid, uint32_t mid, uint64_t key, PyObject *obj) noexcept:
        cdef uint32_t hid = self._hfind(key, obj), e = NIL
        cdef uint64_t ekey
        cdef uint64_t *row
        if hid != NIL:
            e = self._efind(_pack(hid, mid, iid))
            if e != NIL:
                if self._ecount[e] != 0xFFFFFFFF:  # (saturates: a wrap to 0 would read as a free slot)
                    self._ecount[e] += 1
                if self._lru_tail != e:  # make it the most recently stored
                    if self._eprev[e] != NIL:
                        self._enext[self._eprev[e]] = self._enext[e]
                    else:
                        self._lru_head = self._enext[e]
                    self._eprev[self._enext[e]] = self._eprev[e]
                    self._eprev[e] = self._lru_tail
                    self._enext[e] = NIL
                    self._enext[self._lru_tail] = e
                    self._lru_tail = e
                return
        if self._max_blocks >= 0 and self._elive >= self._max_blocks:
            self._drop(self._lru_head)
            self._entries_dropped += 1
            if hid != NIL and self._hrefs[hid] == 0:
                hid = NIL
        if hid == NIL:
            hid = self._hfree
            self._hfree = <uint32_t>self._hkey[hid]
            self._hkey[hid] = key
            self._hobj[hid] = obj
            if obj != NULL:
                Py_INCREF(<object>obj)
                self._bytes_held += PyBytes_GET_SIZE(<object>obj) + 33
            self._hrefs[hid] = 0
            memset(&self._bits[<Py_ssize_t>hid * self._stride], 0, <size_t>self._stride * sizeof(uint64_t))
            _slot_put(self._hslots, self._hmask, self._hshift, key, obj != NULL, hid + 1)
            self._hlive += 1
        e = self._efree
        self._efree = self._enext[e]
        ekey = _pack(hid, mid, iid)
        self._ekey[e] = ekey
        self._ecount[e] = 1
        _slot_put(self._eslots, self._emask, self._eshift, ekey, 0, e + 1)
        self._eprev[e] = self._lru_tail
        self._enext[e] = NIL
        if self._lru_tail != NIL:
            self._enext[self._lru_tail] = e
        else:
            self._lru_head = e
        self._lru_tail = e
        self._iprev[e] = NIL
        self._inext[e] = self._ihead[iid]
        if self._ihead[iid] != NIL:
            self._iprev[self._ihead[iid]] = e
        self._ihead[iid] = e
        self._icount[iid] += 1
        self._elive += 1
        self._hrefs[hid] += 1
        row = &self._bits[<Py_ssize_t>hid * self._stride]
        row[iid >> 6] |= (<uint64_t>1) << (iid & 63)  # held anywhere
        row[(mid + 1) * self._W + (iid >> 6)] |= (<uint64_t>1) << (iid & 63)  # held in this medium

    cdef void _remove(self, uint32_t iid, uint32_t mid, uint64_t key, PyObject *obj) noexcept:
        cdef uint32_t hid = self._hfind(key, obj), e = NIL
        if hid != NIL:
            e = self._efind(_pack(hid, mid, iid))
        if e == NIL:
            self._removals_unknown += 1
            return
        self._blocks_removed += 1
        if self._ecount[e] > 1:
            self._ecount[e] -= 1
        else:
            self._drop(e)

    cdef Py_ssize_t _forget(self, uint32_t iid) noexcept:
        cdef Py_ssize_t n = 0
        while self._ihead[iid] != NIL:
            self._drop(self._ihead[iid])
            n += 1
        return n

    def __reduce__(self):  # an index is rebuilt from KV events, never copied
        raise TypeError("a KVIndex cannot be pickled or copied: build a new one from the instances' KV events")

    # ------------------------------------------------------------------ properties
    @property
    def max_blocks(self):
        """The bound on entries held (``None``: unbounded)."""
        return self._max_blocks_obj

    @property
    def instances(self):
        """The known instances, first seen first (``remove_instance`` forgets one)."""
        return tuple(self._order)

    @property
    def mediums(self):
        """The mediums in use (named by a known instance's events), first seen first."""
        return tuple(self._mids)

    @property
    def memory_bytes(self):
        """An estimate of the memory the index holds, in bytes.

        The C arrays at their allocated sizes (hash and entry tables, per-hash
        bitsets, per-entry counts and links, per-instance arrays), the ``bytes``
        hashes it keeps (``sys.getsizeof``), and its Python containers of
        instance and medium names.  Constant time.
        """
        cdef Py_ssize_t size = _sys.getsizeof(self)
        size += (self._hmask + 1 + self._emask + 1) * <Py_ssize_t>sizeof(Slot)
        size += self._hcap * <Py_ssize_t>(sizeof(uint64_t) + sizeof(PyObject *) + sizeof(uint32_t))
        size += self._hcap * self._stride * <Py_ssize_t>sizeof(uint64_t)
        size += self._ecap * <Py_ssize_t>(sizeof(uint64_t) + 5 * sizeof(uint32_t))
        size += self._icap * <Py_ssize_t>(2 * sizeof(uint32_t) + 2 * sizeof(Py_ssize_t))
        size += 2 * self._W * <Py_ssize_t>sizeof(uint64_t)
        size += self._bytes_held
        size += _sys.getsizeof(self._iids) + _sys.getsizeof(self._order) + _sys.getsizeof(self._free_iids)
        size += _sys.getsizeof(self._mids) + _sys.getsizeof(self._mnames) + _sys.getsizeof(self._musers)
        size += _sys.getsizeof(self._imeds)
        for used in self._imeds.values():
            size += _sys.getsizeof(used)
        for name in self._order:
            size += _sys.getsizeof(name)
        return size

    @property
    def stats(self):
        """Counters since the index was made (``clear()`` keeps them) and its size now.

        ``events_applied``: events applied; ``batches_applied``: ``apply_batch``
        calls; ``blocks_stored``: hashes in ``BlockStored`` events;
        ``blocks_removed``: ``BlockRemoved`` hashes that were held;
        ``removals_unknown``: those that were not (no-ops); ``all_blocks_cleared``:
        ``AllBlocksCleared`` events; ``entries_cleared``: entries they forgot;
        ``entries_dropped``: entries dropped by ``max_blocks``;
        ``instances_removed``: instances ``remove_instance`` forgot; then the size
        now: ``instances``, ``entries`` and ``hashes`` (distinct hash values held).
        """
        return {
            "events_applied": self._events_applied,
            "batches_applied": self._batches_applied,
            "blocks_stored": self._blocks_stored,
            "blocks_removed": self._blocks_removed,
            "removals_unknown": self._removals_unknown,
            "all_blocks_cleared": self._all_blocks_cleared,
            "entries_cleared": self._entries_cleared,
            "entries_dropped": self._entries_dropped,
            "instances_removed": self._instances_removed,
            "instances": len(self._order),
            "entries": self._elive,
            "hashes": self._hlive,
        }

    def num_blocks(self, instance: str | None = None) -> int:
        """Entries held by ``instance`` (a hash in two mediums counts twice), or by all with None.

        An unknown instance holds none.

        Raises:
            TypeError: ``instance`` is not a str or None.
        """
        if instance is None:
            return self._elive
        instance = _instance_name(instance, "instance")
        iid = self._iids.get(instance)
        return 0 if iid is None else self._icount[<Py_ssize_t>iid]

    # ------------------------------------------------------------------ events
    def apply_batch(self, instance: str, batch: KVEventBatch) -> int:
        """Apply one ``KVEventBatch`` published by ``instance`` (of any data-parallel rank; vLLM's
        own ``KVEventBatch`` is read as its msgpack form decodes: ``as_kv_event_batch``).

        Returns:
            The number of events applied (all of the batch's).

        Raises:
            TypeError, ValueError: as :meth:`apply_events`, or ``batch`` is not a ``KVEventBatch``.
        """
        instance = _instance_name(instance, "instance")
        batch = batch if isinstance(batch, KVEventBatch) else as_kv_event_batch(batch)  # (no call when it is one)
        applied = self.apply_events(instance, batch.events)
        self._batches_applied += 1
        return applied

    def apply_events(self, instance: str, events: Sequence[BlockStored | BlockRemoved | AllBlocksCleared]) -> int:
        """Apply ``instance``'s events, in order; the instance becomes known (even with no events).

        Returns:
            The number of events applied.

        Raises:
            TypeError, ValueError: bad input (see the class docstring); nothing is applied then.
        """
        cdef _Staged st
        cdef Py_ssize_t n, iid
        instance = _instance_name(instance, "instance")
        # A tuple: Python code run while checking (a hash list's ``__iter__``) cannot shrink it
        # under the unchecked ``events[i]`` reads of ``_stage_events``.
        if type(events) is not tuple:
            events = tuple(events)
        n = len(<tuple>events)
        memset(&st, 0, sizeof(_Staged))
        staged = []          # the events' hashes, as tuples: they keep the bytes alive
        ev_mediums = []
        try:
            self._stage_events(<tuple>events, &st, staged, ev_mediums)
            # From here on no Python code runs (a finalizer run by the garbage collector while
            # the hashes were copied may have changed the index): what can fail is checked and
            # all the memory the events may take is reserved before anything changes.
            new_mediums = self._mediums_new_to(instance, &st, ev_mediums)
            iid = self._make_room(instance, new_mediums, st.nstore)
            self._commit_names(instance, iid, new_mediums)
            self._apply_staged(<uint32_t>iid, &st, ev_mediums)
            self._events_applied += n
            return n
        finally:
            PyMem_Free(st.keys)
            PyMem_Free(st.objs)
            PyMem_Free(st.info)

    # The phases of apply_events, with the pure twin's names: everything that can fail runs
    # before anything changes.
    cdef int _stage_events(self, tuple events, _Staged *st, list staged, list ev_mediums) except -1:
        """Check every event and copy its hashes (keys, and the bytes objects) aside, with each
        event's kind and count in ``st.info`` and its medium in ``ev_mediums``."""
        cdef Py_ssize_t n = len(events), i, j, m, k
        cdef PyObject **items
        cdef int code
        st.n = n
        st.info = <Py_ssize_t *>PyMem_Malloc(<size_t>(3 * n + 1) * sizeof(Py_ssize_t))
        if st.info == NULL:
            raise MemoryError()
        for i in range(n):
            ev = events[i]
            if isinstance(ev, AllBlocksCleared):
                st.info[3 * i] = 2
                st.info[3 * i + 2] = 0
                ev_mediums.append(None)
                continue
            if isinstance(ev, BlockStored):
                st.info[3 * i] = 0
            elif isinstance(ev, BlockRemoved):
                st.info[3 * i] = 1
            else:
                raise TypeError(f"events[{i}] is not a BlockStored, BlockRemoved or AllBlocksCleared: "
                                f"{type(ev).__name__}")
            hashes = ev.block_hashes
            if not isinstance(hashes, (list, tuple)):
                raise TypeError(f"events[{i}].block_hashes must be a list of block hashes, "
                                f"got {type(hashes).__name__}")
            hashes = tuple(hashes)
            staged.append(hashes)
            m = len(<tuple>hashes)
            if st.total + m > st.cap:
                k = max(2 * st.cap, st.total + m, 64)
                st.keys = <uint64_t *>_grow(st.keys, st.cap, k, sizeof(uint64_t))
                st.objs = <PyObject **>_grow(st.objs, st.cap, k, sizeof(PyObject *))
                st.cap = k
            items = PySequence_Fast_ITEMS(hashes)
            for j in range(m):
                code = _read_hash(items[j], &st.keys[st.total + j], &st.objs[st.total + j])
                if code:
                    raise _hash_error(code, <object>items[j], f"events[{i}].block_hashes[{j}]")
            st.total += m
            if st.info[3 * i] == 0:
                st.nstore += m
            st.info[3 * i + 2] = m
            medium = ev.medium
            _check_medium(medium, f"events[{i}].medium")
            ev_mediums.append(medium)
        return 0

    cdef list _mediums_new_to(self, str instance, _Staged *st, list ev_mediums):
        """The mediums the events name that ``instance`` has not named yet, in order of first
        appearance; refused if they take the instance or the index past its bound."""
        cdef Py_ssize_t i
        new_mediums = []
        used = self._imeds.get(instance, ())
        for i in range(st.n):
            medium = ev_mediums[i]
            if st.info[3 * i] != 2 and medium not in used and medium not in new_mediums:
                new_mediums.append(medium)
        if new_mediums:
            self._check_mediums(instance, used, new_mediums)
        return new_mediums

    cdef Py_ssize_t _make_room(self, str instance, list new_mediums, Py_ssize_t nstore) except -1:
        """Refuse a new instance past ``MAX_INSTANCES``, and reserve the memory the events may
        take (``nstore`` new entries, the new mediums); returns the instance's id (to be)."""
        cdef Py_ssize_t nslots, nfree, fresh = 0, iid
        for medium in new_mediums:
            fresh += medium not in self._mids
        nfree = len(self._mnames) - len(self._mids)
        nslots = len(self._mnames) + (fresh - nfree if fresh > nfree else 0)
        iid_obj = self._iids.get(instance)
        if iid_obj is None:
            if len(self._order) >= MAX_INSTANCES:
                raise ValueError(f"the index holds at most {MAX_INSTANCES} instances")
            iid = self._free_iids[len(self._free_iids) - 1] if self._free_iids else self._inext_new
        else:
            iid = iid_obj
        self._reserve(nstore, iid, nslots)
        return iid

    cdef int _commit_names(self, str instance, Py_ssize_t iid, list new_mediums) except -1:
        """Register ``instance`` (id ``iid``) if it is new, and its new mediums."""
        if new_mediums:
            mine = self._imeds.get(instance)
            if mine is None:
                mine = self._imeds[instance] = set()
            for medium in new_mediums:
                mine.add(medium)
                mid_obj = self._mids.get(medium)
                if mid_obj is None:
                    mid_obj = self._new_mid()
                    self._mids[medium] = mid_obj
                    self._mnames[mid_obj] = medium
                    self._musers[mid_obj] = 0
                    self._mothers += medium not in _COMMON_MEDIUMS
                self._musers[mid_obj] += 1
        if instance not in self._iids:
            if self._free_iids:
                self._free_iids.pop()
            else:
                self._inext_new += 1
            self._iids[instance] = iid
            self._order.append(instance)
            self._template = None
            self._oiid[len(self._order) - 1] = <uint32_t>iid
            self._alive[iid >> 6] |= (<uint64_t>1) << (iid & 63)
            self._ihead[iid] = NIL
            self._icount[iid] = 0
        return 0

    cdef int _apply_staged(self, uint32_t iid, _Staged *st, list ev_mediums) except -1:
        """Apply the checked events, in order: C work that cannot fail."""
        cdef Py_ssize_t i, j, m, k = 0
        cdef Py_ssize_t *info = st.info
        for i in range(st.n):
            if info[3 * i] != 2:
                info[3 * i + 1] = self._mids[ev_mediums[i]]
        for i in range(st.n):
            m = info[3 * i + 2]
            if info[3 * i] == 0:
                for j in range(k, k + m):
                    self._store(iid, <uint32_t>info[3 * i + 1], st.keys[j], st.objs[j])
                self._blocks_stored += m
            elif info[3 * i] == 1:
                for j in range(k, k + m):
                    self._remove(iid, <uint32_t>info[3 * i + 1], st.keys[j], st.objs[j])
            else:
                self._all_blocks_cleared += 1
                self._entries_cleared += self._forget(iid)
            k += m
        return 0

    def remove_instance(self, instance: str) -> None:
        """Forget ``instance`` and all it holds (it restarted, or fell silent); unknown: a no-op.

        Raises:
            TypeError: ``instance`` is not a str.
        """
        cdef Py_ssize_t iid, k, n, pos
        instance = _instance_name(instance, "instance")
        iid_obj = self._iids.get(instance)
        if iid_obj is None:
            return
        iid = iid_obj
        self._forget(<uint32_t>iid)
        self._alive[iid >> 6] &= ~((<uint64_t>1) << (iid & 63))
        n = len(self._order)
        pos = 0
        while self._oiid[pos] != <uint32_t>iid:
            pos += 1
        for k in range(pos, n - 1):
            self._oiid[k] = self._oiid[k + 1]
        self._instances_removed += 1
        del self._order[pos]
        self._template = None
        self._free_iids.append(iid)
        del self._iids[instance]
        self._release_mediums(self._imeds.pop(instance, ()))

    cdef int _check_mediums(self, str instance, object used, list new) except -1:
        """Refuse ``new`` (mediums new to ``instance``) past the instance's or the index's bound."""
        cdef Py_ssize_t mine = 0, others = 0
        for medium in used:
            mine += medium not in _COMMON_MEDIUMS
        for medium in new:
            mine += medium not in _COMMON_MEDIUMS
            others += medium not in _COMMON_MEDIUMS and medium not in self._mids
        if mine > MAX_INSTANCE_MEDIUMS:
            raise ValueError(f"instance {instance!r} names more than {MAX_INSTANCE_MEDIUMS} mediums "
                             "besides GPU, CPU, STORAGE and None")
        if self._mothers + others > MAX_MEDIUMS - len(_COMMON_MEDIUMS):
            raise ValueError(f"the index holds at most {MAX_MEDIUMS} mediums")
        return 0

    cdef Py_ssize_t _new_mid(self) except -1:
        """A medium id: the lowest free one, else a new one (``_reserve`` made room for it)."""
        cdef Py_ssize_t mid
        for mid in range(len(self._mnames)):
            if self._mnames[mid] is _FREE:
                return mid
        self._mnames.append(_FREE)
        self._musers.append(0)
        return len(self._mnames) - 1

    cdef int _release_mediums(self, object mediums) except -1:
        """Those of ``mediums`` no instance names any more go, and the bitsets shrink to the
        mediums left when they can (no entry refers to a medium no instance names)."""
        cdef Py_ssize_t mid, mcap = 1
        for medium in mediums:
            mid = self._mids[medium]
            self._musers[mid] -= 1
            if self._musers[mid] == 0:
                del self._mids[medium]
                self._mnames[mid] = _FREE
                self._mothers -= medium not in _COMMON_MEDIUMS
        while self._mnames and self._mnames[len(self._mnames) - 1] is _FREE:
            self._mnames.pop()
            self._musers.pop()
        while mcap < len(self._mnames):
            mcap *= 2
        if mcap < self._mcap:
            try:
                self._relayout(self._W, mcap)
            except MemoryError:  # keep the wider bitsets: nothing is lost
                pass
        return 0

    def clear(self) -> None:
        """Forget every instance, entry and medium (the counters of ``stats`` are kept)."""
        self._reset()

    # ------------------------------------------------------------------ queries
    cdef inline bint _narrow(self, const uint64_t *row, Py_ssize_t depth) noexcept:
        """Keep the instances of the running that are in ``row``; the others stop at ``depth``."""
        cdef uint64_t *cur = self._qcur
        cdef uint64_t c, nw, d, left = 0
        cdef Py_ssize_t w
        for w in range(self._W):
            c = cur[w]
            nw = c & row[w]
            d = c ^ nw
            while d:
                self._qpos[w * 64 + kvcy_kvi_ctz(d)] = depth
                d &= d - 1
            cur[w] = nw
            left |= nw
        return left != 0

    cdef void _settle(self, Py_ssize_t depth) noexcept:
        """The instances still in the running stop at ``depth``."""
        cdef uint64_t d
        cdef Py_ssize_t w
        for w in range(self._W):
            d = self._qcur[w]
            while d:
                self._qpos[w * 64 + kvcy_kvi_ctz(d)] = depth
                d &= d - 1
            self._qcur[w] = 0

    def longest_prefix(self, block_hashes: Sequence[int | bytes], medium: str | None = None) -> dict[str, int]:
        """For each known instance (first seen first), how many leading ``block_hashes`` it holds.

        Hash ``i`` of a chained sequence stands for the whole prefix up to block
        ``i``, so an instance's count is the index of the first hash it does not
        hold.  ``medium=None`` counts blocks held in any medium.  Time is
        proportional to the number of hashes, not to the index's size.

        Args:
            block_hashes: the request's block hashes, ints or bytes as the events
                carry them; also an ``array('Q')`` (or another 1-D C-contiguous
                buffer of unsigned 64-bit ints, format ``'Q'`` or ``'L'``).
            medium: count only blocks held in this medium (``None``: any).

        Returns:
            ``{instance: number of leading blocks it holds}``, 0 included.

        Raises:
            TypeError, ValueError: a hash (every one is checked) or ``medium`` is bad.
        """
        cdef Py_ssize_t off = 0
        cdef Py_buffer view
        _check_medium(medium, "medium")
        if medium is not None:
            mid = self._mids.get(medium)
            off = -1 if mid is None else (<Py_ssize_t>mid + 1) * self._W
        seq = block_hashes
        if not isinstance(seq, (list, tuple)):
            if isinstance(seq, (str, bytes, bytearray)):
                raise TypeError(f"block_hashes must be a sequence of block hashes, got {type(seq).__name__}")
            if PyObject_CheckBuffer(seq):
                PyObject_GetBuffer(seq, &view, PyBUF_FORMAT | PyBUF_STRIDES)
                try:
                    error = _buffer_error(&view)
                    if error is not None:
                        raise error
                    self._prepare(view.shape[0])
                    return self._walk(NULL, <const uint64_t *>view.buf, view.shape[0], off)
                finally:
                    PyBuffer_Release(&view)
            seq = list(seq)
        self._prepare(len(seq))
        if PySequence_Fast_GET_SIZE(seq) > len(self._ints) - 1:  # grown by a finalizer meanwhile
            seq = tuple(seq)
            self._prepare(len(seq))
        return self._walk(PySequence_Fast_ITEMS(seq), NULL, PySequence_Fast_GET_SIZE(seq), off)

    cdef int _prepare(self, Py_ssize_t n) except -1:
        """Make every object a query's result needs (``_result``, the counts up to ``n``) first:
        the walk then allocates nothing, so no garbage collection can run a finalizer (Python
        code that might change the index or the hashes) in the middle of it."""
        if self._template is None:
            self._template = dict.fromkeys(self._order, 0)
        self._result = self._template.copy()
        if len(self._ints) <= n:
            self._ints.extend(range(len(self._ints), n + 1))
        return 0

    cdef dict _walk(self, PyObject **items, const uint64_t *data, Py_ssize_t n, Py_ssize_t off):
        """``longest_prefix``'s walk, right after ``_prepare(n)``, over ``items`` (to check) or ``data``:
        in chunks of 32 hashes, read them, prefetch their slots, find their ids and prefetch their
        bitsets, then narrow the running set."""
        cdef Py_ssize_t k, t, m, base, norder = len(self._order)
        cdef uint64_t keys[32]
        cdef PyObject *objs[32]
        cdef Py_ssize_t homes[32]
        cdef uint64_t *rows[32]
        cdef uint64_t cur, nw, d
        cdef uint32_t hid
        cdef bint walking = norder > 0
        cdef int code
        cdef dict result = self._result
        cdef list ints = self._ints
        self._result = None
        if walking:
            memcpy(self._qcur, self._alive, <size_t>self._W * sizeof(uint64_t))
            if off < 0:
                self._settle(0)
                walking = False
        for base in range(0, n, 32):
            m = min(32, n - base)
            if items != NULL:
                for t in range(m):
                    code = _read_hash(items[base + t], &keys[t], &objs[t])
                    if code:
                        raise _hash_error(code, <object>items[base + t], f"block_hashes[{base + t}]")
            elif walking:
                memcpy(keys, &data[base], <size_t>m * sizeof(uint64_t))
                memset(objs, 0, <size_t>m * sizeof(PyObject *))
            else:
                break
            if not walking:
                continue
            for t in range(m):
                homes[t] = _home(keys[t], objs[t] != NULL, self._hshift)
                kvcy_kvi_prefetch(&self._hslots[homes[t]])
            for t in range(m):
                hid = self._hprobe(keys[t], objs[t], homes[t])
                if hid == NIL:
                    m = t  # the walk stops at this hash: no need to look further
                    break
                rows[t] = &self._bits[<Py_ssize_t>hid * self._stride + off]
                kvcy_kvi_prefetch(rows[t])
            if self._W == 1:  # up to 64 instances: the running set in a register
                cur = self._qcur[0]
                for t in range(m):
                    nw = cur & rows[t][0]
                    d = cur ^ nw
                    while d:
                        self._qpos[kvcy_kvi_ctz(d)] = base + t
                        d &= d - 1
                    cur = nw
                    if not cur:
                        break
                self._qcur[0] = cur
                walking = cur != 0
            else:
                for t in range(m):
                    if not self._narrow(rows[t], base + t):
                        walking = False
                        break
            if walking and m < min(32, n - base):  # stopped at a hash no instance holds
                self._settle(base + m)
                walking = False
        if walking:
            self._settle(n)
        for k in range(norder):
            PyDict_SetItem(result, self._order[k], ints[self._qpos[self._oiid[k]]])
        return result

    def best_instance(
        self,
        block_hashes: Sequence[int | bytes],
        medium: str | None = None,
        candidates: Sequence[str] | None = None,
    ) -> tuple[str | None, int]:
        """The instance holding the longest prefix of ``block_hashes``, and its length.

        Among ``candidates`` (all known instances when None; an unknown one holds
        nothing), the first with the longest prefix wins a tie, in the
        candidates' order (first seen first without them).

        Returns:
            ``(instance, number of leading blocks)``; ``(None, 0)`` with no candidates.

        Raises:
            TypeError, ValueError: as :meth:`longest_prefix`, or a candidate is not a str.
        """
        cdef Py_ssize_t best_len = -1, n, k, best_k = -1
        if candidates is not None:
            if isinstance(candidates, (str, bytes)):
                raise TypeError(f"candidates must be a sequence of instance names, got {type(candidates).__name__}")
            candidates = [_instance_name(c, "a candidate") for c in candidates]
        prefix = self.longest_prefix(block_hashes, medium)
        if candidates is None:  # every known instance: read the walk's positions, first seen first
            for k in range(len(self._order)):
                if self._qpos[self._oiid[k]] > best_len:
                    best_k, best_len = k, self._qpos[self._oiid[k]]
            return (None, 0) if best_k < 0 else (self._order[best_k], best_len)
        best = None
        for name in candidates:
            n = prefix.get(name, 0)
            if n > best_len:
                best, best_len = name, n
        return (best, best_len) if best is not None else (None, 0)
