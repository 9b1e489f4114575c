# offload_c/_common.pxd: the C-API externs and the C++ rank set (LRU's ordered keys; a
# ChunkStatus holds its position in it) the concepts share; the helpers are in _common.pyx.
# Included by kvcy/_fast/_offload_c.pxd.

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
