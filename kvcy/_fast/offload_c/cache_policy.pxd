# offload_c/cache_policy.pxd: the declarations of CachePolicy: C fields and the cdef methods
# the manager calls (implemented in cache_policy.pyx; the native policies override them).
# Included by kvcy/_fast/_offload_c.pxd.

# KvcyKeyIndex: an open-addressing table over a native policy's map (key bytes -> the map's
# value), which the hot lookups read instead of the dict; the dict stays the owner of every
# key and value (helpers at the end of cache_policy.pyx).
cdef extern from *:
    """
    /* One slot: the key's hash (the bytes object's own, cached on it), the
       key and the map's value, both borrowed from the policy's dict, which
       holds them for as long as the slot does.  key NULL: empty; key
       KVCY_KI_TOMB: deleted (probing goes on past it). */
    typedef struct { Py_hash_t h; PyObject *key; PyObject *val; } KvcyKISlot;
    typedef struct {
        KvcyKISlot *slots;
        size_t mask;            /* capacity - 1 (capacity a power of 2), or 0 with slots NULL */
        Py_ssize_t used;        /* live keys */
        Py_ssize_t filled;      /* live keys + tombstones */
        int bypass;             /* the map holds a key that is not exact bytes: the index is
                                   not kept and every lookup goes to the dict */
    } KvcyKeyIndex;
    #define KVCY_KI_TOMB ((PyObject *)1)

    static inline int kvcy_ki_eq(PyObject *a, PyObject *b) {
        Py_ssize_t n;
        if (a == b) return 1;
        n = PyBytes_GET_SIZE(a);
        return n == PyBytes_GET_SIZE(b) &&
               memcmp(PyBytes_AS_STRING(a), PyBytes_AS_STRING(b), (size_t)n) == 0;
    }
    /* The slot holding exact-bytes ``key`` (hash ``h``), or NULL. */
    static inline KvcyKISlot *kvcy_ki_find(const KvcyKeyIndex *ki, PyObject *key, Py_hash_t h) {
        size_t i;
        KvcyKISlot *s;
        if (ki->slots == NULL) return NULL;
        i = (size_t)h & ki->mask;
        for (;;) {
            s = &ki->slots[i];
            if (s->key == NULL) return NULL;
            if (s->h == h && s->key != KVCY_KI_TOMB && kvcy_ki_eq(s->key, key)) return s;
            i = (i + 1) & ki->mask;
        }
    }
    static inline void kvcy_ki_prefetch(const KvcyKeyIndex *ki, PyObject *key) {
    #if defined(__GNUC__)
    #pragma GCC diagnostic push
    #pragma GCC diagnostic ignored "-Wdeprecated-declarations"
    #endif
        Py_hash_t h;
        if (ki->slots == NULL || !PyBytes_CheckExact(key)) return;
        h = ((PyBytesObject *)key)->ob_shash;
        if (h != -1) __builtin_prefetch(&ki->slots[(size_t)h & ki->mask]);
    #if defined(__GNUC__)
    #pragma GCC diagnostic pop
    #endif
    }
    static void kvcy_ki_free(KvcyKeyIndex *ki) {
        PyMem_Free(ki->slots);
        ki->slots = NULL; ki->mask = 0; ki->used = 0; ki->filled = 0;
    }
    /* Make room for one more key: a table that would pass half full is
       rebuilt (tombstones dropped) at 4x its live keys.  -1 with
       MemoryError set, the table unchanged, when that cannot be allocated. */
    static int kvcy_ki_reserve(KvcyKeyIndex *ki) {
        size_t cap, i, j, new_mask;
        KvcyKISlot *fresh;
        if (ki->slots != NULL && (size_t)(ki->filled + 1) * 2 <= ki->mask + 1) return 0;
        cap = 16;
        while (cap < (size_t)(ki->used + 1) * 4) {
            if (cap > ((size_t)PY_SSIZE_T_MAX / sizeof(KvcyKISlot)) / 2) { PyErr_NoMemory(); return -1; }
            cap *= 2;
        }
        fresh = (KvcyKISlot *)PyMem_Calloc(cap, sizeof(KvcyKISlot));
        if (fresh == NULL) { PyErr_NoMemory(); return -1; }
        new_mask = cap - 1;
        if (ki->slots != NULL) {
            for (i = 0; i <= ki->mask; i++) {
                KvcyKISlot *s = &ki->slots[i];
                if (s->key == NULL || s->key == KVCY_KI_TOMB) continue;
                j = (size_t)s->h & new_mask;
                while (fresh[j].key != NULL) j = (j + 1) & new_mask;
                fresh[j] = *s;
            }
            PyMem_Free(ki->slots);
        }
        ki->slots = fresh;
        ki->mask = new_mask;
        ki->filled = ki->used;
        return 0;
    }
    /* Put ``key`` -> ``val`` (room reserved first); an equal key already in
       keeps its key object (as the dict keeps its own) and gets ``val``. */
    static void kvcy_ki_put(KvcyKeyIndex *ki, PyObject *key, Py_hash_t h, PyObject *val) {
        size_t i = (size_t)h & ki->mask;
        KvcyKISlot *s, *tomb = NULL;
        for (;;) {
            s = &ki->slots[i];
            if (s->key == NULL) break;
            if (s->key == KVCY_KI_TOMB) { if (tomb == NULL) tomb = s; }
            else if (s->h == h && kvcy_ki_eq(s->key, key)) { s->val = val; return; }
            i = (i + 1) & ki->mask;
        }
        if (tomb != NULL) s = tomb; else ki->filled++;
        s->h = h; s->key = key; s->val = val;
        ki->used++;
    }
    static inline void kvcy_ki_remove(KvcyKeyIndex *ki, PyObject *key, Py_hash_t h) {
        KvcyKISlot *s = kvcy_ki_find(ki, key, h);
        if (s != NULL) { s->key = KVCY_KI_TOMB; s->val = NULL; ki->used--; }
    }
    """
    ctypedef struct KvcyKISlot:
        Py_hash_t h
        PyObject *key
        PyObject *val
    ctypedef struct KvcyKeyIndex:
        KvcyKISlot *slots
        size_t mask
        Py_ssize_t used
        Py_ssize_t filled
        int bypass
    KvcyKISlot *kvcy_ki_find(const KvcyKeyIndex *ki, PyObject *key, Py_hash_t h) noexcept
    void kvcy_ki_prefetch(const KvcyKeyIndex *ki, PyObject *key) noexcept
    void kvcy_ki_free(KvcyKeyIndex *ki) noexcept
    int kvcy_ki_reserve(KvcyKeyIndex *ki) except -1
    void kvcy_ki_put(KvcyKeyIndex *ki, PyObject *key, Py_hash_t h, PyObject *val) noexcept
    void kvcy_ki_remove(KvcyKeyIndex *ki, PyObject *key, Py_hash_t h) noexcept


cdef class CachePolicy:
    cdef readonly Py_ssize_t cache_capacity
    cdef dict _chunks       # native policies: every resident key -> its ChunkStatus
                            # (ARC: and every ghost key -> its ghost _Node, see _is_ghost)
    cdef KvcyKeyIndex _index  # mirrors _chunks for the lookups (key_index.pyx)
    cdef bint _native       # LRUCachePolicy / ARCCachePolicy (C paths), else Python calls

    cdef inline ChunkStatus c_get(self, object key)
    cdef int c_insert(self, bytes key, ChunkStatus chunk, object ctx, _Positions pos,
                      bint absent=*) except -1
    cdef int c_insert_new(self, list keys, vector[Py_ssize_t]& ids, object ctx,
                          _Positions pos) except -1
    cdef int c_remove(self, bytes key) except -1
    cdef int c_touch(self, list keys, object ctx) except -1
    cdef int c_on_store_miss(self, list keys, object ctx) except -1
    cdef int c_on_request_access(self, list keys, object ctx, _Positions pos) except -1
    cdef int c_on_request_finished(self, list groups, set insertion_only, set reused,
                                   object ctx, _Positions pos) except -1
    cdef int c_mark_evictable(self, bytes key) except -1
    cdef int c_mark_non_evictable(self, bytes key) except -1
    cdef list c_evict(self, Py_ssize_t n, set protected)
    cdef int c_clear(self) except -1
