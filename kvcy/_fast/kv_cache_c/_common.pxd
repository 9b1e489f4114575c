# kv_cache_c/_common.pxd: the C-API externs and inline C (key hashing, prefetch, aligned block
# slabs) the concepts share; the helpers are in _common.pyx.
# Included by kvcy/_fast/_kv_cache_c.pxd.

cdef extern from "Python.h":
    Py_ssize_t _PyLong_AsSsize_t_raw "PyLong_AsSsize_t" (object o)
    PyObject *PyErr_Occurred()
    void PyErr_Clear()


cdef extern from "Python.h":
    PyObject *_PyList_GET_ITEM_RAW "PyList_GET_ITEM" (object lst, Py_ssize_t i)
    void Py_INCREF_RAW "Py_INCREF" (PyObject *o)
    void Py_DECREF_RAW "Py_DECREF" (PyObject *o)
    PyTypeObject *Py_TYPE_RAW "Py_TYPE" (PyObject *o)
    bint _PyType_IsSubtype_RAW "PyType_IsSubtype" (PyTypeObject *a, PyTypeObject *b)
    ctypedef struct PyListObject:
        PyObject **ob_item


cdef extern from *:
    """
    #include <dlfcn.h>
    #include <stdint.h>
    #include <stdlib.h>
    #include <string.h>
    /* A 64-bit mix of a cache key's bytes and its group id.  Block hashes
       are digests already -- uniform bits, and chained, so a key's last
       8 bytes decide the rest -- so this only has to spread them over the
       table: keys of 8 bytes or more mix their first and last 8 bytes (two
       multiplies, no loop).  Other keys still work (equal table hashes get
       their bytes compared), they only probe further. */
    static inline uint64_t kvcy_key_hash(const char *p, Py_ssize_t n, uint32_t gid) {
        uint64_t h = ((uint64_t)n * 0x9E3779B97F4A7C15ULL) ^ ((uint64_t)gid * 0xC2B2AE3D27D4EB4FULL);
        uint64_t a = 0, b = 0;
        if (n >= 8) {
            memcpy(&a, p, 8);
            memcpy(&b, p + n - 8, 8);
        } else if (n > 0) {
            memcpy(&a, p, (size_t)n);
        }
        h ^= a * 0xBF58476D1CE4E5B9ULL;
        h ^= (b ^ (h >> 29)) * 0x94D049BB133111EBULL;
        h ^= h >> 32;
        return h;
    }
    static inline void kvcy_prefetch(const void *p) { __builtin_prefetch(p); }
    #define kvcy_unlikely(x) __builtin_expect(!!(x), 0)
    /* Equal contents of two bytes objects; digests of 32 bytes (sha256)
       are compared as four words, without a call into libc. */
    static inline int kvcy_bytes_eq(PyObject *a, PyObject *b) {
        Py_ssize_t n = PyBytes_GET_SIZE(a);
        const char *p = PyBytes_AS_STRING(a), *q = PyBytes_AS_STRING(b);
        if (PyBytes_GET_SIZE(b) != n) return 0;
        if (n == 32) {  /* (word by word into registers: no copy through the stack) */
            uint64_t a, b, d;
            memcpy(&a, p, 8); memcpy(&b, q, 8); d = a ^ b;
            memcpy(&a, p + 8, 8); memcpy(&b, q + 8, 8); d |= a ^ b;
            memcpy(&a, p + 16, 8); memcpy(&b, q + 16, 8); d |= a ^ b;
            memcpy(&a, p + 24, 8); memcpy(&b, q + 24, 8); d |= a ^ b;
            return d == 0;
        }
        return memcmp(p, q, (size_t)n) == 0;
    }

    /* KVCacheBlock memory: 64-byte objects on 64-byte boundaries, so that a
       block's header and fields share one cache line (pymalloc puts each
       across two), carved in order from 2 MiB slabs aligned to 2 MiB, so
       that a pool's blocks lie in address order.  A slab's first 64 bytes
       are its header: a free list of its released objects, how many are
       live, and links in the list of slabs with room.  A slab whose objects
       are all released goes back to the C allocator at once, so a dead pool
       gives its memory back; every object is reported to tracemalloc.  Only
       the exact KVCacheBlock type uses this: heap subclasses get CPython's
       own tp_alloc / tp_free. */
    #define KVCY_BLOCK_BYTES 64
    #define KVCY_SLAB_BYTES ((size_t)1 << 21)
    #define KVCY_SLAB_OBJECTS (KVCY_SLAB_BYTES / KVCY_BLOCK_BYTES)  /* index 0: the header */
    typedef struct kvcy_free_obj { struct kvcy_free_obj *next; } kvcy_free_obj;
    typedef struct kvcy_slab {
        struct kvcy_slab *prev, *next;  /* in kvcy_slabs_with_room while it has room */
        kvcy_free_obj *free;            /* released objects */
        Py_ssize_t live;                /* objects handed out and not released */
        Py_ssize_t bump;                /* next never-used object index */
    } kvcy_slab;
    static kvcy_slab *kvcy_slabs_with_room = NULL;
    /* tracemalloc's C API, looked up at install (its 3.11 header lacks
       extern "C", and this module is compiled as C++). */
    typedef int (*kvcy_track_fn)(unsigned int, uintptr_t, size_t);
    typedef int (*kvcy_untrack_fn)(unsigned int, uintptr_t);
    static kvcy_track_fn kvcy_track = NULL;
    static kvcy_untrack_fn kvcy_untrack = NULL;
    static inline int kvcy_slab_full(kvcy_slab *s) {
        return s->free == NULL && s->bump >= (Py_ssize_t)KVCY_SLAB_OBJECTS;
    }
    static inline void kvcy_slab_link(kvcy_slab *s) {
        s->prev = NULL;
        s->next = kvcy_slabs_with_room;
        if (s->next != NULL) s->next->prev = s;
        kvcy_slabs_with_room = s;
    }
    static inline void kvcy_slab_unlink(kvcy_slab *s) {
        if (s->prev != NULL) s->prev->next = s->next; else kvcy_slabs_with_room = s->next;
        if (s->next != NULL) s->next->prev = s->prev;
        s->prev = s->next = NULL;
    }
    static PyObject *kvcy_block_alloc(PyTypeObject *type, Py_ssize_t nitems) {
        kvcy_slab *s = kvcy_slabs_with_room;
        char *mem;
        (void)nitems;
        if (s == NULL) {
            void *p = NULL;
            if (posix_memalign(&p, KVCY_SLAB_BYTES, KVCY_SLAB_BYTES) != 0) return PyErr_NoMemory();
            s = (kvcy_slab *)p;
            s->free = NULL;
            s->live = 0;
            s->bump = 1;
            kvcy_slab_link(s);
        }
        if (s->free != NULL) {
            mem = (char *)s->free;
            s->free = s->free->next;
        } else {
            mem = (char *)s + KVCY_BLOCK_BYTES * s->bump++;
        }
        s->live++;
        if (kvcy_slab_full(s)) kvcy_slab_unlink(s);
        memset(mem, 0, KVCY_BLOCK_BYTES);
        if (kvcy_track != NULL) (void)kvcy_track(0, (uintptr_t)mem, KVCY_BLOCK_BYTES);
        return PyObject_Init((PyObject *)mem, type);
    }
    static void kvcy_block_release(void *p) {
        kvcy_slab *s = (kvcy_slab *)((uintptr_t)p & ~(uintptr_t)(KVCY_SLAB_BYTES - 1));
        kvcy_free_obj *f = (kvcy_free_obj *)p;
        int was_full = kvcy_slab_full(s);
        if (kvcy_untrack != NULL) (void)kvcy_untrack(0, (uintptr_t)p);
        f->next = s->free;
        s->free = f;
        if (--s->live == 0) {
            if (!was_full) kvcy_slab_unlink(s);
            free(s);
        } else if (was_full) {
            kvcy_slab_link(s);
        }
    }
    /* Point the type at the allocator above when its objects fit (they do
       on 64-bit CPython); before any instance exists.  1 if installed. */
    static int kvcy_install_block_alloc(PyTypeObject *type) {
        if (type->tp_basicsize > KVCY_BLOCK_BYTES || type->tp_itemsize != 0
                || (type->tp_flags & Py_TPFLAGS_HAVE_GC)) return 0;
        kvcy_track = (kvcy_track_fn)dlsym(RTLD_DEFAULT, "PyTraceMalloc_Track");
        kvcy_untrack = (kvcy_untrack_fn)dlsym(RTLD_DEFAULT, "PyTraceMalloc_Untrack");
        type->tp_alloc = kvcy_block_alloc;
        type->tp_free = kvcy_block_release;
        return 1;
    }
    /* A zeroed array of n items of size sz starting on a cache line, so
       that no 32-byte table slot straddles two lines (malloc's own
       alignment is 16 bytes).  Release with free(). */
    static void *kvcy_calloc_lines(size_t n, size_t sz) {
        void *p = NULL;
        size_t bytes;
        if (n != 0 && sz > ((size_t)-1) / n) return NULL;
        bytes = n * sz;
        if (posix_memalign(&p, 64, bytes != 0 ? bytes : 64) != 0) return NULL;
        memset(p, 0, bytes);
        return p;
    }
    """
    uint64_t kvcy_key_hash(const char *p, Py_ssize_t n, uint32_t gid) noexcept nogil
    bint kvcy_bytes_eq(PyObject *a, PyObject *b) noexcept
    char *_PyBytes_AS_STRING_RAW "PyBytes_AS_STRING" (PyObject *o) noexcept nogil
    Py_ssize_t _PyBytes_GET_SIZE_RAW "PyBytes_GET_SIZE" (PyObject *o) noexcept nogil
    PyTypeObject PyBytes_Type
    PyTypeObject PyDict_Type
    PyTypeObject PyList_Type
    void kvcy_prefetch(const void *p) noexcept nogil
    bint kvcy_unlikely(bint x) noexcept nogil
    void *kvcy_calloc_lines(size_t n, size_t sz) noexcept nogil
    int kvcy_install_block_alloc(PyTypeObject *t) noexcept
