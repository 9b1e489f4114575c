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
    PyObject *kvcy_offload_bytes_get(object d, PyObject *k) except? NULL
