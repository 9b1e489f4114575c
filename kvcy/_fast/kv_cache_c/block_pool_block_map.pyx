# kv_cache_c/block_pool_block_map.pyx: BlockHashToBlockMap (cache key -> block(s), an open-addressing table),
# its cycle-collector hooks, and the coarser-block-size view of a request's hashes
# (resolve_block_hashes).  (vLLM: vllm/v1/core/block_pool.py, BlockHashToBlockMap;
# vllm/v1/core/kv_cache_utils.py, BlockHashListWithBlockSize.)
# Included into kvcy/_fast/_kv_cache_c.pyx (one extension module), not compiled on its own.

from collections.abc import MutableMapping as _MutableMapping


cdef inline tuple _split_key(object key):
    if not isinstance(key, bytes) or len(key) < 4:
        raise ValueError(f"a cache key is a block hash followed by a 4-byte group id, got {key!r}")
    return key[:len(key) - 4], int.from_bytes(key[len(key) - 4:], "big")


cdef enum:
    # The table is kept at most 1/_LOAD_INV full: short probe runs, so a
    # deletion's backward shift and an insert's probe rarely leave the home
    # slot's cache line, and their loops rarely take an unpredictable extra
    # turn.  Under a pool's churn (evict 32, insert 32, ~1000 keys) linear
    # probing at load 0.24 reads 1.37 slots per insert and scans 1.69 per
    # deletion; at 0.12, 1.07 and 1.14.  Capacities are powers of two, so
    # the load ends up between 1/(2 * _LOAD_INV) and 1/_LOAD_INV.
    _LOAD_INV = 5


cdef class BlockHashToBlockMap:
    """Cache key -> block(s).  The first block inserted under a key wins lookups.

    Several blocks may carry the same key (no de-duplication, so block tables
    stay append-only); the value is then a dict ``{block_id: block}`` in
    insertion order.  Keys are vLLM's ``BlockHashWithGroupId`` (block hash +
    4-byte group id) at the public methods.  Inside, the map is an
    open-addressing table (linear probing, backward-shift deletion, at most
    a fifth full) keyed by (block hash bytes, group id), so a lookup with a
    request's own hash object builds no key and calls no Python code.
    ``keys()`` comes in table order, not insertion order.
    """

    def __cinit__(self, *args, **kwargs):
        self._slots = <_Slot*>kvcy_calloc_lines(16, sizeof(_Slot))
        if self._slots == NULL:
            raise MemoryError()
        self._mask = 15
        self._len = 0

    def __dealloc__(self):
        self._release_slots()
        free(self._slots)
        self._slots = NULL

    cdef void _release_slots(self) noexcept:
        # Empty every slot, dropping the table's references (for __dealloc__
        # and the cycle collector's tp_clear; each slot is emptied before its
        # references go, so code they run sees a consistent table).
        cdef size_t i
        cdef PyObject *k
        cdef PyObject *v
        if self._slots == NULL:
            return
        for i in range(self._mask + 1):
            k = self._slots[i].key
            if k != NULL:
                v = self._slots[i].value
                self._slots[i].key = NULL
                self._slots[i].value = NULL
                self._len -= 1
                Py_DECREF_RAW(k)
                Py_DECREF_RAW(v)

    # -------------------------------------------------------------- the table
    cdef inline Py_ssize_t _find(self, PyObject *key, uint32_t gid, uint64_t h) noexcept:
        # The slot holding (key, gid), or -1 - (the empty slot where it would go).
        cdef size_t i = <size_t>h & self._mask
        cdef _Slot *s
        while True:
            s = &self._slots[i]
            if s.key == NULL:
                return -1 - <Py_ssize_t>i
            if <uint32_t>s.h == <uint32_t>h and s.gid == gid:  # (blocks keep 32 bits of h)
                if s.key == key or kvcy_bytes_eq(s.key, key):
                    return <Py_ssize_t>i
            i = (i + 1) & self._mask

    cdef int _reserve(self, Py_ssize_t n) except -1:
        # Room for n keys without growing (a pool caches at most one key per
        # block); the new table's pages are faulted in here (it is zeroed
        # when allocated), not in a hot path.
        cdef size_t cap = self._mask + 1
        while <size_t>n * _LOAD_INV > cap:
            cap *= 2
        if cap > self._mask + 1:
            self._rehash(cap)
        return 0

    cdef int _grow(self) except -1:
        return self._rehash((self._mask + 1) * 2)

    cdef int _rehash(self, size_t new_cap) except -1:
        cdef size_t old_cap = self._mask + 1, i, j
        cdef _Slot *old = self._slots
        if new_cap > (<size_t>1 << 32):  # (home slots come from the 32 bits of h a block keeps)
            raise MemoryError(f"a cache map of {new_cap} slots is too large")
        cdef _Slot *new = <_Slot*>kvcy_calloc_lines(new_cap, sizeof(_Slot))
        if new == NULL:
            raise MemoryError()
        for i in range(old_cap):
            if old[i].key != NULL:
                j = <size_t>old[i].h & (new_cap - 1)
                while new[j].key != NULL:
                    j = (j + 1) & (new_cap - 1)
                new[j] = old[i]
        self._slots = new
        self._mask = new_cap - 1
        free(old)
        return 0

    cdef inline void _delete_slot(self, size_t i) noexcept:
        # Empty slot i (its references already taken over) and shift the
        # following run back so every key stays reachable from its home slot.
        cdef size_t j = i, home
        cdef size_t mask = self._mask
        while True:
            j = (j + 1) & mask
            if self._slots[j].key == NULL:
                break
            home = <size_t>self._slots[j].h & mask
            # Move j back to i unless its home lies cyclically in (i, j].
            if ((j - home) & mask) >= ((j - i) & mask):
                self._slots[i] = self._slots[j]
                i = j
        self._slots[i].key = NULL
        self._slots[i].value = NULL
        self._len -= 1

    cdef inline uint64_t _hash_of(self, object block_hash, Py_ssize_t gid) except? 0:
        if type(block_hash) is not bytes:
            raise TypeError(f"block hashes must be bytes, got {type(block_hash).__name__}")
        if not 0 <= gid <= 0xFFFFFFFF:
            raise ValueError(f"KV-cache group id {gid} does not fit in 4 bytes")
        cdef PyObject *k = <PyObject*>block_hash
        return kvcy_key_hash(_PyBytes_AS_STRING_RAW(k), _PyBytes_GET_SIZE_RAW(k), <uint32_t>gid)

    cdef inline PyObject *_get_raw(self, PyObject *key, uint32_t gid) noexcept:
        # First block under (key, gid) -- key is a bytes object -- or NULL; borrowed.
        return self._get_hashed(
            key, gid, kvcy_key_hash(_PyBytes_AS_STRING_RAW(key), _PyBytes_GET_SIZE_RAW(key), gid))

    cdef inline PyObject *_get_hashed(self, PyObject *key, uint32_t gid, uint64_t h) noexcept:
        # _get_raw with the key's table hash h already computed.
        cdef Py_ssize_t i = self._find(key, gid, h)
        if i < 0:
            return NULL
        cdef PyObject *v = self._slots[i].value
        if Py_TYPE_RAW(v) == &PyDict_Type:  # (the map's own dicts; a value is a block otherwise)
            return _first_dict_value(v)
        return v

    cdef inline object _get(self, object block_hash, Py_ssize_t gid):
        cdef uint64_t h = self._hash_of(block_hash, gid)  # (type and range checks too)
        cdef PyObject *v = self._get_hashed(<PyObject*>block_hash, <uint32_t>gid, h)
        return None if v == NULL else <object>v

    cdef int _insert(self, object block_hash, Py_ssize_t gid, KVCacheBlock block) except -1:
        cdef uint64_t h = self._hash_of(block_hash, gid)  # (type and range checks too)
        return self._insert_hashed(<PyObject*>block_hash, <uint32_t>gid, h, block)

    cdef int _insert_hashed(self, PyObject *block_hash, uint32_t gid, uint64_t h, KVCacheBlock block) except -1:
        # Insert under (block_hash, gid) -- a bytes object -- whose table hash is h.
        cdef Py_ssize_t i = self._find(block_hash, gid, h)
        cdef _Slot *s
        cdef PyObject *v
        if i >= 0:
            s = &self._slots[i]
            v = s.value
            if Py_TYPE_RAW(v) != &PyDict_Type:
                both = {(<KVCacheBlock>v).block_id: <object>v, block.block_id: block}
                s = &self._slots[i]  # (building the dict ran no table code, but re-read anyway)
                s.value = <PyObject*>both
                Py_INCREF_RAW(s.value)
                Py_DECREF_RAW(v)
            else:
                (<dict>v)[block.block_id] = block
            return 0
        if <size_t>(self._len + 1) * _LOAD_INV > self._mask + 1:
            self._grow()
            i = self._find(block_hash, gid, h)
        s = &self._slots[-1 - i]
        s.h = h
        s.gid = gid
        s.key = block_hash
        s.value = <PyObject*>block
        Py_INCREF_RAW(s.key)
        Py_INCREF_RAW(s.value)
        self._len += 1
        return 0

    cdef object _pop(self, object block_hash, Py_ssize_t gid, Py_ssize_t block_id):
        cdef uint64_t h = self._hash_of(block_hash, gid)
        cdef Py_ssize_t i = self._find(<PyObject*>block_hash, <uint32_t>gid, h)
        if i < 0:
            return None
        cdef object v = <object>self._slots[i].value
        cdef object block = v.get(block_id) if type(v) is dict else v
        if block is None or (<KVCacheBlock>block).block_id != block_id:
            return None
        self._remove_at(i, block_id)
        return block

    cdef inline void _prefetch(self, uint64_t h) noexcept:
        # The key's home slot's cache line and the next line: a probe or a
        # deletion's backward shift that goes on past the home line (two
        # slots a line) reads there next.
        cdef size_t i = <size_t>h & self._mask
        kvcy_prefetch(&self._slots[i])
        kvcy_prefetch(&self._slots[((i | 1) + 1) & self._mask])

    cdef inline int _drop_block(self, KVCacheBlock block) except -1:
        # _pop(block._hash, block._group, block.block_id) is not None, for a
        # block with a key (its slot found from the hash half it keeps).
        return self._remove_at(self._find(<PyObject*>block._hash, block._group, block._key_h),
                               block.block_id)

    cdef inline int _remove_at(self, Py_ssize_t i, Py_ssize_t block_id) except -1:
        # Remove block_id from slot i (a _find result): 1 if it was there, else 0.
        if i < 0:
            return 0
        cdef PyObject *v = self._slots[i].value
        if Py_TYPE_RAW(v) != &PyDict_Type:
            if (<KVCacheBlock>v).block_id != block_id:
                return 0
            self._release_slot(<size_t>i)
            return 1
        if (<dict>v).pop(block_id, None) is None:
            return 0
        if not <dict>v:
            self._release_slot(<size_t>i)
        return 1

    cdef inline void _release_slot(self, size_t i) noexcept:
        # Empty slot i, dropping the table's references to its key and value.
        cdef PyObject *k = self._slots[i].key
        cdef PyObject *v = self._slots[i].value
        self._delete_slot(i)
        Py_DECREF_RAW(k)
        Py_DECREF_RAW(v)

    # -------------------------------------------------------------- public API
    def get_one_block(self, key):
        """The first block cached under ``key``, or None."""
        h, gid = _split_key(key)
        return self._get(h, gid)

    def contain(self, key, Py_ssize_t block_id):
        h, gid = _split_key(key)
        cdef uint64_t hv = self._hash_of(h, gid)
        cdef Py_ssize_t i = self._find(<PyObject*>h, <uint32_t>gid, hv)
        if i < 0:
            return False
        cdef PyObject *v = self._slots[i].value
        if Py_TYPE_RAW(v) != &PyDict_Type:
            return (<KVCacheBlock>v).block_id == block_id
        return block_id in <dict>v

    def insert(self, key, KVCacheBlock block):
        h, gid = _split_key(key)
        self._insert(h, gid, block)

    def pop(self, key, Py_ssize_t block_id):
        """Remove ``block_id`` from ``key``; the removed block, or None."""
        h, gid = _split_key(key)
        return self._pop(h, gid, block_id)

    def keys(self):
        """The cache keys (``BlockHashWithGroupId``), in table order."""
        cdef size_t i
        out = []
        for i in range(self._mask + 1):
            if self._slots[i].key != NULL:
                out.append(_group_key(<bytes>self._slots[i].key, self._slots[i].gid))
        return out

    @property
    def _cache(self):
        """The whole map keyed by ``BlockHashWithGroupId``, as a live mapping (``_CacheView``)."""
        return _CacheView(self)

    def _cache_get(self, key):
        # _CacheView[key]: the block, or a copy of the {block_id: block} dict; KeyError if absent.
        h, gid = _split_key(key)
        cdef uint64_t hv = self._hash_of(h, gid)
        cdef Py_ssize_t i = self._find(<PyObject*>h, <uint32_t>gid, hv)
        if i < 0:
            raise KeyError(key)
        v = <object>self._slots[i].value
        return dict(v) if type(v) is dict else v

    def _cache_del(self, key):
        # del _CacheView[key]: every block under key leaves the table (their hashes stay,
        # as with vLLM's dict); KeyError if absent.
        h, gid = _split_key(key)
        cdef uint64_t hv = self._hash_of(h, gid)
        cdef Py_ssize_t i = self._find(<PyObject*>h, <uint32_t>gid, hv)
        if i < 0:
            raise KeyError(key)
        self._release_slot(<size_t>i)

    def _cache_set(self, key, value):
        # _CacheView[key] = value: one KVCacheBlock, or a non-empty {block_id: block} dict
        # (first wins lookups), in place of what key held; checked before anything changes.
        h, gid = _split_key(key)
        self._hash_of(h, gid)  # (type and range checks)
        if isinstance(value, KVCacheBlock):
            blocks = [value]
        elif isinstance(value, dict) and value:
            blocks = list(value.values())
            for bid, block in value.items():
                if not isinstance(block, KVCacheBlock) or type(bid) is not int or bid != (<KVCacheBlock>block).block_id:
                    raise ValueError("a cache entry's dict maps each block's block_id to the KVCacheBlock")
        else:
            raise TypeError(f"a cache entry is a KVCacheBlock or a non-empty dict of them, got {type(value).__name__}")
        cdef Py_ssize_t i = self._find(<PyObject*>h, <uint32_t>gid, self._hash_of(h, gid))
        if i >= 0:
            self._release_slot(<size_t>i)
        for block in blocks:
            self._insert(h, gid, <KVCacheBlock>block)

    def __len__(self):
        return self._len


class _CacheView(_MutableMapping):
    """``BlockHashToBlockMap._cache``: the table seen as vLLM's ``{BlockHashWithGroupId: block
    or {block_id: block}}`` dict, live.  Reads see the table as it is (a dict value as a copy);
    ``pop``, ``del`` and ``clear`` drop every block under a key; assigning stores a block or a
    dict of blocks keyed by their ids in place of what the key held.  ``copy()`` (and
    ``copy.copy``) give a plain dict snapshot."""

    __slots__ = ("_map",)

    def __init__(self, BlockHashToBlockMap block_map not None):
        self._map = block_map

    def __getitem__(self, key):
        return self._map._cache_get(key)

    def __setitem__(self, key, value):
        self._map._cache_set(key, value)

    def __delitem__(self, key):
        self._map._cache_del(key)

    def __iter__(self):
        return iter(self._map.keys())

    def __len__(self):
        return len(self._map)

    def copy(self):
        return {key: self._map._cache_get(key) for key in self._map.keys()}

    __copy__ = copy

    def __repr__(self):
        return repr(self.copy())


# The cycle collector sees what the queue's ring and the map's table hold
# (C arrays, which Cython's generated tp_traverse / tp_clear do not know):
# a block subclass whose instance refers back to its queue or map forms a
# cycle that is found and broken like any other.


cdef traverseproc _map_base_traverse = (<PyTypeObject*>BlockHashToBlockMap).tp_traverse
cdef inquiry _map_base_clear = (<PyTypeObject*>BlockHashToBlockMap).tp_clear


cdef int _map_traverse(PyObject *o, visitproc visit, void *arg) except -1:
    cdef int r = _map_base_traverse(o, visit, arg) if _map_base_traverse != NULL else 0
    if r != 0:
        return r
    cdef _Slot *slots = (<BlockHashToBlockMap>o)._slots
    cdef size_t i
    if slots == NULL:
        return 0
    for i in range((<BlockHashToBlockMap>o)._mask + 1):
        if slots[i].key != NULL:
            r = visit(slots[i].key, arg)
            if r != 0:
                return r
            r = visit(slots[i].value, arg)
            if r != 0:
                return r
    return 0


cdef int _map_clear(object o) except -1:
    (<BlockHashToBlockMap>o)._release_slots()
    if _map_base_clear != NULL:
        return _map_base_clear(o)
    return 0


(<PyTypeObject*>BlockHashToBlockMap).tp_traverse = _map_traverse
(<PyTypeObject*>BlockHashToBlockMap).tp_clear = _map_clear


cdef PyObject *_first_dict_value(PyObject *d) noexcept:
    # The first value of a non-empty dict (borrowed).
    cdef Py_ssize_t pos = 0
    cdef PyObject *k
    cdef PyObject *v
    PyDict_Next(<object>d, &pos, &k, &v)
    return v


cdef class _BlockHashView:
    """Request block hashes seen at a coarser block size.

    Each fine hash chains over the whole prefix before it, so a coarse block is keyed by the
    last fine hash inside it (as vLLM 0.33.0's ``BlockHashListWithBlockSize``).
    """

    def __init__(self, list hashes not None, Py_ssize_t scale):
        if scale <= 0:
            raise ValueError(f"scale must be positive, got {scale}")
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
        return self._hashes[(i + 1) * self._scale - 1]


cdef inline Py_ssize_t _num_searchable_blocks(object hashes, Py_ssize_t max_length,
                                              Py_ssize_t block_size) except -1:
    """Blocks a hit search may look at: within max_length and within the known hashes."""
    cdef Py_ssize_t n = max_length // block_size
    cdef Py_ssize_t n_hashes = len(hashes)
    return n_hashes if n_hashes < n else n


cdef inline object _resolve(object hashes, Py_ssize_t hash_block_size, Py_ssize_t block_size):
    if block_size == hash_block_size:
        return hashes
    if hash_block_size <= 0 or block_size <= 0:
        raise ValueError(f"block size {block_size} is not a positive multiple of the hash block size "
                         f"{hash_block_size}")
    if block_size % hash_block_size != 0:  # (vLLM's assertion: e.g. a dcp-sharded group's events)
        raise AssertionError(f"block size {block_size} is not a positive multiple of the hash block size "
                             f"{hash_block_size}")
    return _BlockHashView(list(hashes), block_size // hash_block_size)


def resolve_block_hashes(hashes, Py_ssize_t hash_block_size, Py_ssize_t block_size):
    """The request's hashes at ``block_size`` (a multiple of ``hash_block_size``)."""
    return _resolve(hashes, hash_block_size, block_size)
