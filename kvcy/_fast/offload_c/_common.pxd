# offload_c/_common.pxd: the C-API externs and the C++ rank set (LRU's ordered keys; a
# ChunkStatus holds its position in it) the concepts share; the helpers are in _common.pyx.
# Included by kvcy/_fast/_offload_c.pxd.

cdef extern from "Python.h":
    object _PyDict_NewPresized(Py_ssize_t minused)
    PyObject *_list_item "PyList_GET_ITEM" (object lst, Py_ssize_t i)   # (borrowed)

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
    static inline void kvcy_offload_prefetch(const void *p) { __builtin_prefetch(p); }
    /* dict[key] for an exact bytes key, borrowed, NULL if absent (or on an
       error, then set): where the bytes object's hash is readable and
       already computed, the lookup goes straight to the table. */
    static inline PyObject *kvcy_offload_bytes_get(PyObject *d, PyObject *k) {
    #if PY_VERSION_HEX < 0x030C0000 && !defined(Py_LIMITED_API) && !defined(PYPY_VERSION)
    #if defined(__GNUC__)
    #pragma GCC diagnostic push
    #pragma GCC diagnostic ignored "-Wdeprecated-declarations"
    #endif
        Py_hash_t h = ((PyBytesObject *)k)->ob_shash;   /* (the field exists up to 3.13) */
    #if defined(__GNUC__)
    #pragma GCC diagnostic pop
    #endif
        if (h != -1) return _PyDict_GetItem_KnownHash(d, k, h);
    #endif
        return PyDict_GetItemWithError(d, k);
    }
    /* Software pipelining of lookups in a big dict (the CPU tier's map, 262k
       keys in the replay: its index and entry tables are far larger than the
       caches, and a lookup of a cold key is two dependent misses, index slot
       then entry).  A loop over keys calls kvcy_dict_ahead(d, keys, j) before
       handling keys[j]: it prefetches keys[j + 2*D]'s index slot, and reads
       keys[j + D]'s (fetched by then) to prefetch its entry, so that the
       lookup of keys[j] itself mostly hits the cache.  Only reads and
       prefetches (a prefetch never faults) of the dict's current table, and
       only for exact bytes keys whose hash is already cached: a stale guess
       costs a wasted prefetch, never a wrong answer; nothing for a table
       small enough to stay in cache.  The layout is CPython
       3.11's (Include/internal/pycore_dict.h), mirrored here; on other
       versions, and for a dict that is not a general-keys table, nothing. */
    /* always inlined: a function made only of reads and prefetches counts
       as pure to GCC, which then drops the calls whose result is unused */
    #if defined(__GNUC__)
    #define KVCY_ALWAYS_INLINE static inline __attribute__((always_inline))
    #else
    #define KVCY_ALWAYS_INLINE static inline
    #endif
    #if PY_VERSION_HEX >= 0x030B0000 && PY_VERSION_HEX < 0x030C0000 && !defined(Py_LIMITED_API) && !defined(PYPY_VERSION)
    #define KVCY_DICT_AHEAD 1
    typedef struct {
        Py_ssize_t dk_refcnt;
        uint8_t dk_log2_size;
        uint8_t dk_log2_index_bytes;
        uint8_t dk_kind;
        uint32_t dk_version;
        Py_ssize_t dk_usable;
        Py_ssize_t dk_nentries;
        char dk_indices[];
    } KvcyDictKeys;
    typedef struct { Py_hash_t me_hash; PyObject *me_key; PyObject *me_value; } KvcyDictEntry;
    #define KVCY_AHEAD_D 4
    KVCY_ALWAYS_INLINE Py_hash_t kvcy_bytes_hash_known(PyObject *k) {
    #if defined(__GNUC__)
    #pragma GCC diagnostic push
    #pragma GCC diagnostic ignored "-Wdeprecated-declarations"
    #endif
        return PyBytes_CheckExact(k) ? ((PyBytesObject *)k)->ob_shash : -1;
    #if defined(__GNUC__)
    #pragma GCC diagnostic pop
    #endif
    }
    KVCY_ALWAYS_INLINE Py_ssize_t kvcy_dict_slot(const KvcyDictKeys *dk, Py_hash_t h) {
        size_t i = (size_t)h & (((size_t)1 << dk->dk_log2_size) - 1);
        switch (dk->dk_log2_index_bytes - dk->dk_log2_size) {
            case 0: return ((const int8_t *)dk->dk_indices)[i];
            case 1: return ((const int16_t *)dk->dk_indices)[i];
            case 2: return ((const int32_t *)dk->dk_indices)[i];
            default: return ((const int64_t *)dk->dk_indices)[i];
        }
    }
    KVCY_ALWAYS_INLINE void kvcy_dict_ahead_at(PyObject *d, PyObject *const *keys, Py_ssize_t n, Py_ssize_t j) {
        const KvcyDictKeys *dk = (const KvcyDictKeys *)((PyDictObject *)d)->ma_keys;
        const KvcyDictEntry *ent;
        Py_ssize_t a, ix;
        Py_hash_t h;
        /* a table of under 2**16 slots (~1 MiB of entries at most) stays
           in cache: no pipeline, whose bookkeeping would only cost there */
        if (dk->dk_log2_size < 16 || dk->dk_kind != 0 || ((PyDictObject *)d)->ma_values != NULL) return;
        ent = (const KvcyDictEntry *)(dk->dk_indices + ((size_t)1 << dk->dk_log2_index_bytes));
        a = j + 2 * KVCY_AHEAD_D;
        if (a >= 0 && a < n && (h = kvcy_bytes_hash_known(keys[a])) != -1) {
            size_t i = (size_t)h & (((size_t)1 << dk->dk_log2_size) - 1);
            __builtin_prefetch(dk->dk_indices + (i << (dk->dk_log2_index_bytes - dk->dk_log2_size)));
        }
        a = j + KVCY_AHEAD_D;
        if (a >= 0 && a < n && (h = kvcy_bytes_hash_known(keys[a])) != -1) {
            ix = kvcy_dict_slot(dk, h);
            if (ix >= 0 && ix < dk->dk_nentries) __builtin_prefetch(&ent[ix]);
        }
    }
    #else
    #define KVCY_DICT_AHEAD 0
    #define KVCY_AHEAD_D 4
    KVCY_ALWAYS_INLINE void kvcy_dict_ahead_at(PyObject *d, PyObject *const *keys, Py_ssize_t n, Py_ssize_t j) {
        (void)d; (void)keys; (void)n; (void)j;
    }
    #endif
    /* kvcy_dict_ahead_at for the items of a list (read afresh at each call,
       so that a list changed in between is never read past its end). */
    KVCY_ALWAYS_INLINE void kvcy_dict_ahead(PyObject *d, PyObject *lst, Py_ssize_t j) {
        kvcy_dict_ahead_at(d, ((PyListObject *)lst)->ob_item, PyList_GET_SIZE(lst), j);
    }
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
    void kvcy_offload_prefetch(const void *p) noexcept
    enum: KVCY_AHEAD_D
    void kvcy_dict_ahead(object d, object lst, Py_ssize_t j) noexcept
    void kvcy_dict_ahead_at(object d, PyObject **keys, Py_ssize_t n, Py_ssize_t j) noexcept
    PyObject *kvcy_offload_bytes_get(object d, PyObject *k) except? NULL
