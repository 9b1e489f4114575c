# cython: language_level=3
"""Compiled twin of the KV-cache block manager (see ``_kv_cache_py.py``).

The same classes, methods, arguments and error messages as the pure-Python
twin, as typed ``cdef class``es: blocks and the free queue are linked through
C fields, the hot loops (allocation, freeing, touching, cache-hit search,
caching) run without Python attribute lookups, and the manager's public
methods validate their arguments before any state changes (bounds checks are
off in the build).
"""

import importlib
import logging
from weakref import ref as _weakref

cimport cython
from cpython.dict cimport PyDict_GetItem, PyDict_Next
from cpython.long cimport PyLong_AsLongLongAndOverflow
from cpython.list cimport PyList_GET_ITEM, PyList_GET_SIZE, PyList_New
from cpython.tuple cimport PyTuple_GET_SIZE
from cpython.object cimport PyObject, PyTypeObject, inquiry, traverseproc, visitproc
from libc.stdint cimport int32_t, int64_t, uint32_t, uint64_t
from libc.stdlib cimport calloc, free
from libc.string cimport memcpy

from kvcy.hashing import generate_block_hash_extra_keys
from kvcy.kv_cache_interface import (
    ChunkedLocalAttentionSpec,
    CrossAttentionSpec,
    FullAttentionSpec,
    MambaSpec,
    SlidingWindowSpec,
    get_kv_cache_spec_kind,
    get_kv_cache_spec_sliding_window,
)
from kvcy.kv_events import (
    MEDIUM_GPU,
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    default_use_int_block_hashes,
    external_block_hash,
    untag_extra_keys,
)
from kvcy.metrics import PrefixCacheStats
from kvcy._fast._request_tables import _BlockTable, _CountTable
from kvcy._request_types import RequestStatus, check_request_args, validate_token_ids

logger = logging.getLogger("kvcy")

IMPLEMENTATION = "cython"

cdef object _WAITING = RequestStatus.WAITING
cdef object _PREEMPTED = RequestStatus.PREEMPTED
cdef object _STATUS_TYPE = RequestStatus


cdef inline bint _watermarked(object status) except -1:
    # Waiting and preempted requests take the watermark.  A status is
    # compared by value, as vLLM does: one from vLLM's own RequestStatus
    # class counts the same.  kvcy's members are singletons, so for them
    # identity decides without a rich comparison.
    if status is _WAITING or status is _PREEMPTED:
        return True
    if type(status) is _STATUS_TYPE:
        return False
    return status == _WAITING or status == _PREEMPTED


cdef inline Py_ssize_t _cdiv(Py_ssize_t a, Py_ssize_t b) noexcept:
    # Ceiling division for a >= 0, b > 0 (C division truncates: no negation trick).
    if a <= 0:
        return 0
    return (a + b - 1) // b


def cdiv(a, b):
    return -(-a // b)


cdef extern from "Python.h":
    Py_ssize_t _PyLong_AsSsize_t_raw "PyLong_AsSsize_t" (object o)
    PyObject *PyErr_Occurred()
    void PyErr_Clear()


cdef Py_ssize_t _check_count_slow(str name, object value) except -1:
    if type(value) is not int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(f"{name} must be an int, got {type(value).__name__}")
        value = int(value)
    if value < 0:
        raise ValueError(f"{name} must be non-negative, got {value}")
    if value > 2**62:
        raise ValueError(f"{name} is too large: {value}")
    return <Py_ssize_t>value


cdef inline Py_ssize_t _check_count(str name, object value) except -1:
    """A non-negative int count (bools refused) as a C integer."""
    cdef Py_ssize_t v
    if type(value) is int:
        v = _PyLong_AsSsize_t_raw(value)
        if v == -1 and PyErr_Occurred() != NULL:
            PyErr_Clear()
        elif 0 <= v <= (<Py_ssize_t>1 << 62):
            return v
    return _check_count_slow(name, value)


cdef int32_t _check_ref_cnt(object value) except -1:
    """A reference count as assigned from outside: an int in [0, 2**31)."""
    cdef Py_ssize_t v = _check_count("ref_cnt", value)
    if v >= (<Py_ssize_t>1 << 31):
        raise ValueError(f"ref_cnt must be below 2**31, got {value}")
    return <int32_t>v


cdef object _ZERO = 0

cdef Py_ssize_t _GEN = 0


cdef inline Py_ssize_t _next_gen() noexcept:
    global _GEN
    _GEN += 1
    return _GEN

# Group id -> its 4-byte big-endian suffix, cached for the small ids that occur.
cdef list _GROUP_SUFFIX = [i.to_bytes(4, "big") for i in range(64)]


cdef inline bytes _group_key(bytes block_hash, Py_ssize_t group_id):
    if group_id < 64:
        return block_hash + <bytes>_GROUP_SUFFIX[group_id]
    return block_hash + group_id.to_bytes(4, "big")


# =============================================================================
# The request
# =============================================================================
cdef tuple _KNOWN_HASHERS = ()


def _known_hashers():
    out = []
    for name in ("kvcy._fast._hashing_c", "kvcy._fast._hashing_py"):
        try:
            out.append(importlib.import_module(name).RequestBlockHasher)
        except ImportError:
            pass
    return tuple(out)


cdef class Request:
    """A request as the KV-cache manager sees it (compiled twin).

    The same constructor, attributes and errors as the pure-Python twin's
    ``Request``; the fields are C fields that the compiled manager reads
    without attribute lookups.  Other attributes may be set freely.

    Args:
        request_id: unique id of the request.
        prompt_token_ids: the prompt's token ids (ints that fit in 64 bits).
        max_tokens: how many output tokens the request may produce (informative
            for a serving loop; the manager does not read it).
        lora_request: the LoRA adapter, if any (enters every block hash).
        mm_features: multimodal items sorted by placeholder offset.
        cache_salt: isolates this request's prefix cache (enters the hash of
            the block that starts at token 0).
        prompt_embeds: optional prompt embeddings (a tensor ``[num_prompt_tokens,
            hidden]``); their bytes enter the block hashes.
        block_hasher: from :func:`kvcy.hashing.get_request_block_hasher`; without
            one the request has no block hashes and never hits the cache.
        kv_cache_report_mode: ``"full"`` makes ``get_computed_blocks`` re-emit
            ``BlockStored`` events for prefix hits.
        arrival_time: free for the serving loop's use.
    """

    # What the manager reads on every call comes first (80 bytes with the
    # object header, two cache lines at most).
    # What shapes the request's hashes or the manager's bookkeeping is set
    # once, by the constructor (readonly); counts a scheduler moves are
    # checked when assigned (properties over the C fields the manager reads).
    cdef readonly str request_id
    cdef Py_ssize_t _num_computed_tokens  # num_computed_tokens
    cdef public object status
    cdef readonly list _all_token_ids
    # The manager's own per-request bookkeeping, remembered here so a decode
    # step needs no dict lookups (see KVCacheManager._full_slots).
    cdef PyObject *_kv_owner     # the single-type manager it belongs to (identity only)
    cdef Py_ssize_t _kv_gen      # that manager's _gen when it was remembered
    cdef list _kv_blocks         # req_to_blocks[request_id], or None: no entry
    cdef Py_ssize_t _kv_ncached  # num_cached_block[request_id], or -1: no entry
    cdef list _block_hashes  # block_hashes
    cdef Py_ssize_t _num_in_flight_tokens  # num_in_flight_tokens
    cdef readonly list prompt_token_ids
    cdef public object max_tokens
    cdef readonly object lora_request
    cdef readonly object mm_features
    cdef readonly object cache_salt
    cdef readonly object prompt_embeds
    cdef readonly str kv_cache_report_mode
    cdef public object arrival_time
    cdef public bint skip_reading_prefix_cache
    cdef Py_ssize_t _num_preemptions  # num_preemptions
    cdef readonly Py_ssize_t num_prompt_tokens
    cdef list _spec_token_ids  # spec_token_ids
    cdef readonly list _output_token_ids
    cdef readonly object _block_hasher
    cdef Py_ssize_t _hash_block_size  # > 0: a kvcy hasher, skipped while no block completes
    cdef dict __dict__

    def __init__(self, request_id, prompt_token_ids, max_tokens=None, *, lora_request=None,
                 mm_features=None, cache_salt=None, prompt_embeds=None, block_hasher=None,
                 kv_cache_report_mode="incremental", arrival_time=0.0, skip_reading_prefix_cache=False):
        global _KNOWN_HASHERS
        prompt, features = check_request_args(
            request_id, prompt_token_ids, max_tokens, mm_features, cache_salt, prompt_embeds,
            kv_cache_report_mode,
        )

        self.request_id = request_id
        self.prompt_token_ids = prompt
        self.max_tokens = max_tokens
        self.lora_request = lora_request
        self.mm_features = features
        self.cache_salt = cache_salt
        self.prompt_embeds = prompt_embeds
        self.kv_cache_report_mode = kv_cache_report_mode
        self.arrival_time = arrival_time
        self.skip_reading_prefix_cache = skip_reading_prefix_cache

        self.status = _WAITING
        self._num_computed_tokens = 0
        self._num_in_flight_tokens = 0
        self._num_preemptions = 0
        self.num_prompt_tokens = len(prompt)
        self._spec_token_ids = []
        self._output_token_ids = []
        self._all_token_ids = list(prompt)

        self._block_hashes = []
        self._block_hasher = block_hasher
        self._hash_block_size = 0
        if block_hasher is not None:
            if not _KNOWN_HASHERS:
                _KNOWN_HASHERS = _known_hashers()
            if isinstance(block_hasher, _KNOWN_HASHERS):
                self._hash_block_size = block_hasher.block_size
            self._block_hashes.extend(block_hasher(self))

    # ------------------------------------------------------------------ checked fields
    @property
    def num_computed_tokens(self):
        return self._num_computed_tokens

    @num_computed_tokens.setter
    def num_computed_tokens(self, value):
        self._num_computed_tokens = _check_count("num_computed_tokens", value)

    @property
    def num_in_flight_tokens(self):
        return self._num_in_flight_tokens

    @num_in_flight_tokens.setter
    def num_in_flight_tokens(self, value):
        self._num_in_flight_tokens = _check_count("num_in_flight_tokens", value)

    @property
    def num_preemptions(self):
        return self._num_preemptions

    @num_preemptions.setter
    def num_preemptions(self, value):
        self._num_preemptions = _check_count("num_preemptions", value)

    @property
    def spec_token_ids(self):
        return self._spec_token_ids

    @spec_token_ids.setter
    def spec_token_ids(self, value):
        self._spec_token_ids = validate_token_ids(value, "spec_token_ids")

    @property
    def block_hashes(self):
        """The request's block hashes, one per full block (bytes)."""
        return self._block_hashes

    @block_hashes.setter
    def block_hashes(self, value):
        self._block_hashes = _checked_block_hashes(value)

    # ------------------------------------------------------------------ tokens
    @property
    def num_tokens(self):
        """Prompt plus output tokens."""
        return PyList_GET_SIZE(self._all_token_ids)

    @property
    def num_output_tokens(self):
        return PyList_GET_SIZE(self._output_token_ids)

    @property
    def output_token_ids(self):
        """The output tokens so far (do not mutate; use append_output_token_ids)."""
        return self._output_token_ids

    @property
    def all_token_ids(self):
        """Prompt followed by output tokens (do not mutate)."""
        return self._all_token_ids

    @property
    def is_finished(self):
        return RequestStatus.is_finished(self.status)

    def append_output_token_ids(self, token_ids):
        """Append sampled tokens and hash any blocks they complete.

        Raises:
            TypeError / ValueError: a token is not an int or does not fit in 64
                bits; nothing is appended then.
        """
        cdef list tokens
        if type(token_ids) is int and _fits_int64(token_ids):
            self._output_token_ids.append(token_ids)
            self._all_token_ids.append(token_ids)
        else:
            if isinstance(token_ids, int) and not isinstance(token_ids, bool):
                tokens = validate_token_ids([token_ids], "output token ids")
            else:
                tokens = validate_token_ids(token_ids, "output token ids")
            self._output_token_ids.extend(tokens)
            self._all_token_ids.extend(tokens)
        cdef Py_ssize_t bs = self._hash_block_size
        if self._block_hasher is not None:
            if bs <= 0 or (PyList_GET_SIZE(self._all_token_ids)
                           - PyList_GET_SIZE(self._block_hashes) * bs) >= bs:
                self._block_hashes.extend(self._block_hasher(self))

    def __repr__(self):
        return (
            f"Request(id={self.request_id!r}, tokens={self.num_tokens}, "
            f"computed={self.num_computed_tokens}, status={self.status.name})"
        )


cdef list _checked_block_hashes(object value):
    # Block hashes as assigned from outside: a list of bytes.
    if type(value) is not list:
        raise TypeError(f"block_hashes must be a list of bytes, got {type(value).__name__}")
    for h in <list>value:
        if type(h) is not bytes:
            raise TypeError(f"block hashes must be bytes, got {type(h).__name__}")
    return <list>value


cdef inline bint _fits_int64(object value) noexcept:
    cdef int overflow = 0
    PyLong_AsLongLongAndOverflow(value, &overflow)
    return overflow == 0


# Fast field reads: a compiled Request's C fields, anything else by attribute.
cdef inline str _rid(object request):
    if type(request) is Request:
        return (<Request>request).request_id
    return _rid_of_other(request)


cdef str _rid_of_other(object request):
    cdef object request_id
    try:
        request_id = request.request_id
    except AttributeError:
        raise TypeError(f"expected a Request, got {type(request).__name__}") from None
    _check_rid(request_id)
    return request_id


cdef inline int _check_rid(object request_id) except -1:
    if not isinstance(request_id, str):
        raise TypeError(f"request_id must be a str, got {type(request_id).__name__}")
    return 0


cdef inline Py_ssize_t _num_tokens(object request) except -1:
    if type(request) is Request:
        return PyList_GET_SIZE((<Request>request)._all_token_ids)
    return request.num_tokens


cdef inline object _block_hashes_of(object request):
    if type(request) is Request:
        return (<Request>request)._block_hashes
    return request.block_hashes


# =============================================================================
# Blocks and the free queue
# =============================================================================
cdef extern from "Python.h":
    PyObject *_PyList_GET_ITEM_RAW "PyList_GET_ITEM" (object lst, Py_ssize_t i)
    void Py_INCREF_RAW "Py_INCREF" (PyObject *o)
    void Py_DECREF_RAW "Py_DECREF" (PyObject *o)
    PyTypeObject *Py_TYPE_RAW "Py_TYPE" (PyObject *o)
    bint _PyType_IsSubtype_RAW "PyType_IsSubtype" (PyTypeObject *a, PyTypeObject *b)
    ctypedef struct PyListObject:
        PyObject **ob_item


cdef inline bint _is_block(PyObject *p) noexcept:
    # A KVCacheBlock (or subclass) instance, by C type: runs no Python code,
    # unlike isinstance, and an object lying about its __class__ fails it.
    cdef PyTypeObject *t = Py_TYPE_RAW(p)
    return t == <PyTypeObject*>KVCacheBlock or _PyType_IsSubtype_RAW(t, <PyTypeObject*>KVCacheBlock)


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


@cython.no_gc
cdef class KVCacheBlock:
    """One KV-cache block: id, reference count, cache key, free-queue position.

    The cache key is kept split: ``_hash`` (the request's block hash, whose
    ``hash()`` the bytes object caches) and ``_group`` (the KV-cache group id);
    ``block_hash`` joins them into vLLM's ``BlockHashWithGroupId`` on demand.
    The free-queue links live in the queue (an array of pointers in queue
    order); a block records only the id of the queue it was last put in and
    its position there.  The queue holds one reference to each block it
    holds, taken when the block enters and handed over (or dropped) when it
    leaves.  A block refers to nothing but its hash bytes, so it stays out
    of the cycle collector (pools hold up to millions of them).
    """

    # 64 bytes in all, one cache line (a pool of 10^6 blocks is streamed
    # through on every pass of the free queue): no cdef methods (no vtable
    # pointer), a 32-bit id (vLLM's block tables are int32) and reference
    # count beside the null flag, and the 4-byte ids packed together.  The
    # low half of the cache key's table hash is kept, so an eviction finds
    # the key's slot without reading the hash bytes (a slot's 64-bit hash
    # is kept in the table; capacities stay below 2**32 slots).
    cdef readonly int32_t block_id  # (the pool and its queue own the id, the count and the flag)
    cdef int32_t _ref_cnt  # ref_cnt: assigned through its property, checked
    cdef readonly bint is_null
    cdef uint32_t _key_h  # low 32 bits of kvcy_key_hash(_hash, _group), while _hash is set
    cdef object _hash
    cdef Py_ssize_t _num_tokens  # tokens up to the block's end when cached; -1: None
    # Where the block was last queued (see FreeKVCacheBlockQueue).
    cdef int64_t _pos  # its position in that queue
    cdef uint32_t _queue_id  # that queue's id; 0: never queued
    cdef uint32_t _group  # KV-cache group id of the cache key (4 bytes in the key)

    def __init__(self, int32_t block_id):
        self.block_id = block_id
        self._ref_cnt = 0
        self._hash = None
        self._group = 0
        self._num_tokens = -1
        # _queue_id starts at 0 (C fields are zeroed on allocation) and is left
        # alone here: re-running __init__ must not detach a queued block.
        self.is_null = False

    @property
    def ref_cnt(self):
        return self._ref_cnt

    @ref_cnt.setter
    def ref_cnt(self, value):
        cdef int32_t n = _check_ref_cnt(value)
        if n != 0 and _in_a_queue(self):
            # (a free block with references would be queued a second time
            # when they are dropped, and handed out twice)
            raise RuntimeError(f"block {self.block_id} is in a free queue: its ref_cnt stays 0 "
                               "(take it with get_new_blocks() or touch())")
        self._ref_cnt = n

    @property
    def prev_free_block(self):
        """The previous block in the free queue (a fake head has id -1), or None."""
        cdef FreeKVCacheBlockQueue queue = _queue_of(self)
        return None if queue is None else queue._neighbour(self, False)

    @property
    def next_free_block(self):
        """The next block in the free queue (a fake tail has id -1), or None."""
        cdef FreeKVCacheBlockQueue queue = _queue_of(self)
        return None if queue is None else queue._neighbour(self, True)

    @property
    def block_hash_num_tokens(self):
        """Tokens up to the end of this block when it was cached, or None."""
        return None if self._num_tokens < 0 else self._num_tokens

    @block_hash_num_tokens.setter
    def block_hash_num_tokens(self, value):
        self._num_tokens = -1 if value is None else _check_count("block_hash_num_tokens", value)

    @property
    def block_hash(self):
        """The cache key (block hash + 4-byte group id), or None."""
        if self._hash is None:
            return None
        return _group_key(<bytes>self._hash, self._group)

    @block_hash.setter
    def block_hash(self, block_hash):
        assert self._hash is None, "The block already has a hash. This should not happen."
        _set_block_key(self, block_hash)

    @property
    def _block_hash(self):
        return self.block_hash

    def set_block_hash(self, block_hash, num_tokens=None):
        assert self._hash is None, "The block already has a hash. This should not happen."
        cdef Py_ssize_t n = -1 if num_tokens is None else _check_count("num_tokens", num_tokens)
        _set_block_key(self, block_hash)
        self._num_tokens = n

    def reset_hash(self):
        """Drop the cache key (the block is evicted from the prefix cache)."""
        self._hash = None
        self._num_tokens = -1

    def __repr__(self):
        prev = self.prev_free_block
        nxt = self.next_free_block
        prev_id = prev.block_id if prev is not None else None
        next_id = nxt.block_id if nxt is not None else None
        return (
            f"KVCacheBlock(block_id={self.block_id}, ref_cnt={self.ref_cnt}, "
            f"_block_hash={self.block_hash!r}, prev_free_block={prev_id}, "
            f"next_free_block={next_id})"
        )


# Blocks come from cache-line aligned slabs (see kvcy_block_alloc), which
# give their memory back when their blocks are gone; this runs before any
# block is made.  (Against CPython's allocator, interleaved: the queue, pool
# and request rows of bench_kv_cache.py run 3-9 % faster.)
_ALIGNED_BLOCKS = bool(kvcy_install_block_alloc(<PyTypeObject*>KVCacheBlock))


cdef uint32_t _last_queue_id = 0
# The _queue_id of a fake head or tail (no queue has it); its _pos holds its
# queue's id.  Batch loops thus see a fake end as another queue's block.
cdef uint32_t _FAKE_END_ID = 0xFFFFFFFF
cdef dict _QUEUE_REFS = {}  # queue id -> weakref.ref to that FreeKVCacheBlockQueue


cdef FreeKVCacheBlockQueue _queue_of(KVCacheBlock block):
    # The live queue the block was last put in (or is a fake end of), or None.
    cdef uint32_t queue_id = block._queue_id
    if queue_id == _FAKE_END_ID:
        queue_id = <uint32_t>block._pos
    if queue_id == 0:
        return None
    ref = _QUEUE_REFS.get(queue_id)
    if ref is None:
        return None
    return ref()  # (None once the queue is gone: no raw addresses are kept)


cdef bint _in_a_queue(KVCacheBlock block) except -1:
    # In a live free queue, or a fake end of one (off the hot paths).
    cdef FreeKVCacheBlockQueue queue = _queue_of(block)
    return queue is not None and (queue._holds(block) or queue._is_fake_end(block))


cdef int _set_block_key(KVCacheBlock block, object key) except -1:
    # (A module function, not a cdef method: KVCacheBlock has no vtable.)
    h, group = _split_key(key)
    cdef uint32_t gid = group
    block._hash = h
    block._group = gid
    block._key_h = <uint32_t>kvcy_key_hash(_PyBytes_AS_STRING_RAW(<PyObject*>h), len(h), gid)
    return 0


@cython.final
@cython.no_gc_clear
cdef class FreeKVCacheBlockQueue:
    """Queue of free blocks (a doubly linked list in vLLM), kept as a ring of pointers.

    A fake head and tail (``block_id == -1``) stand at the ends, as in vLLM.
    Order: head = next to allocate, tail = most recently freed.

    The blocks sit in one array, in queue order, at consecutive positions
    ``[_head, _tail)`` (a position maps to the array index ``pos & _mask``),
    so ``popleft_n`` copies pointers out of the array and ``append_n`` /
    ``prepend_n`` write them in, without following links through block
    objects scattered over the heap.  Removal from the middle (``touch`` of a
    cached free block) is O(1): it leaves a NULL hole, skipped when the head
    passes it and squeezed out when the array would otherwise grow.

    A block records the id of the queue it was last put in and its position
    there; it is in the queue iff that position is within ``[_head, _tail)``
    and the array holds that very block there, so a popped block needs no
    update, and a stale record (its queue gone, even its 32-bit id reused)
    can never pass.  Ids of live queues map to the queues in a module dict,
    used only off the hot paths (neighbour lookups, blocks that change
    queue).  The queue owns one reference to every block it holds.
    """

    cdef public Py_ssize_t num_free_blocks
    cdef readonly KVCacheBlock fake_free_list_head
    cdef readonly KVCacheBlock fake_free_list_tail
    cdef PyObject **_ring
    cdef int64_t _mask  # array size - 1 (the size is a power of 2)
    cdef int64_t _head  # position of the first entry
    cdef int64_t _tail  # position after the last entry
    cdef int64_t _holes  # NULL entries within [_head, _tail)
    cdef uint32_t _id
    cdef object __weakref__  # (the id -> queue registry holds weak references)

    def __cinit__(self, *args, **kwargs):
        global _last_queue_id
        cdef KVCacheBlock head = KVCacheBlock(-1)
        cdef KVCacheBlock tail = KVCacheBlock(-1)
        self._ring = <PyObject**>calloc(16, sizeof(PyObject*))
        if self._ring == NULL:
            raise MemoryError()
        self._mask = 15
        self._head = 0
        self._tail = 0
        self._holes = 0
        # A 32-bit id, reused once they wrap around (only live queues'
        # ids are taken): a stale id in a block is harmless, since membership
        # is decided by the array holding that very block.
        _last_queue_id += 1
        while _last_queue_id == 0 or _last_queue_id == _FAKE_END_ID or _last_queue_id in _QUEUE_REFS:
            _last_queue_id += 1
        _QUEUE_REFS[_last_queue_id] = _weakref(self)
        self._id = _last_queue_id
        head._queue_id = tail._queue_id = _FAKE_END_ID
        head._pos = tail._pos = self._id
        self.fake_free_list_head = head
        self.fake_free_list_tail = tail
        self.num_free_blocks = 0

    def __init__(self, list blocks not None):
        self._ensure_room(PyList_GET_SIZE(blocks))
        self.append_n(blocks)

    def __dealloc__(self):
        # Unregister first, so that nothing (a block subclass's __del__, say)
        # can find this queue, then drop the references.
        if self._id != 0 and _QUEUE_REFS is not None:  # None late in interpreter shutdown
            _QUEUE_REFS.pop(self._id, None)
        self._release_blocks()
        free(self._ring)
        self._ring = NULL

    cdef void _release_blocks(self) noexcept:
        # Empty the queue, then drop its references to the blocks (their
        # deallocation may run code: the queue is consistent by then).  For
        # __dealloc__ and the cycle collector's tp_clear.
        cdef PyObject **ring = self._ring
        cdef int64_t pos, head = self._head, tail = self._tail, mask = self._mask
        cdef PyObject *p
        if ring == NULL or head == tail:
            return
        for pos in range(head, tail):
            p = ring[pos & mask]
            if p != NULL:
                (<KVCacheBlock>p)._queue_id = 0
        self._head = self._tail = 0
        self._holes = 0
        self.num_free_blocks = 0
        for pos in range(head, tail):
            p = ring[pos & mask]
            ring[pos & mask] = NULL
            if p != NULL:
                Py_DECREF_RAW(p)

    # ------------------------------------------------------------------ the array
    cdef inline bint _holds(self, KVCacheBlock block) noexcept:
        """``block`` is in this queue (the fake ends are not)."""
        cdef int64_t pos = block._pos
        return (block._queue_id == self._id and self._head <= pos < self._tail
                and self._ring[pos & self._mask] == <PyObject*>block)

    cdef inline bint _is_fake_end(self, KVCacheBlock block) noexcept:
        return block is self.fake_free_list_head or block is self.fake_free_list_tail

    cdef int _ensure_room(self, Py_ssize_t extra) except -1:
        # Room for ``extra`` more entries past either end: squeeze out the
        # holes if they are half the span, else grow the array.  Either way
        # nothing observable changes, so callers run it before any change.
        cdef int64_t span = self._tail - self._head
        cdef int64_t cap = self._mask + 1
        cdef int64_t new_cap, pos
        cdef PyObject **ring
        if span + extra <= cap:
            return 0
        if self._holes * 2 >= span:
            self._compact()
            span = self._tail - self._head
            if span + extra <= cap:
                return 0
        if span + extra > (<int64_t>1 << 40):
            raise MemoryError(f"a free queue of {span + extra} entries is too large")
        new_cap = cap
        while new_cap < span + extra:
            new_cap *= 2
        ring = <PyObject**>calloc(new_cap, sizeof(PyObject*))
        if ring == NULL:
            raise MemoryError()
        for pos in range(self._head, self._tail):  # positions (so blocks' records) stay
            ring[pos & (new_cap - 1)] = self._ring[pos & self._mask]
        free(self._ring)
        self._ring = ring
        self._mask = new_cap - 1
        return 0

    cdef void _compact(self) noexcept:
        # Close the holes, moving later entries towards the head.
        cdef PyObject **ring = self._ring
        cdef int64_t mask = self._mask
        cdef int64_t r, w = self._head
        cdef PyObject *p
        for r in range(self._head, self._tail):
            p = ring[r & mask]
            if p != NULL:
                if w != r:
                    ring[w & mask] = p
                    (<KVCacheBlock>p)._pos = w
                w += 1
        self._tail = w
        self._holes = 0

    cdef void _drop_taken(self, int64_t start, Py_ssize_t count) noexcept:
        # Give back the references taken for entries written at
        # [start, start + count) outside [_head, _tail) (an unwound batch;
        # the caller still holds the blocks).
        cdef Py_ssize_t j
        for j in range(count):
            Py_DECREF_RAW(self._ring[(start + j) & self._mask])

    cdef object _neighbour(self, KVCacheBlock block, bint after):
        # The block before/after ``block`` here, a fake end, or None.
        cdef int64_t pos
        cdef PyObject *p
        if block is self.fake_free_list_head:
            if not after:
                return None
            pos = self._head - 1
        elif block is self.fake_free_list_tail:
            if after:
                return None
            pos = self._tail
        elif self._holds(block):
            pos = block._pos
        else:
            return None
        while True:
            pos += 1 if after else -1
            if pos < self._head:
                return self.fake_free_list_head
            if pos >= self._tail:
                return self.fake_free_list_tail
            p = self._ring[pos & self._mask]
            if p != NULL:
                return <object>p

    cdef int _queued_anywhere(self, KVCacheBlock block) except -1:
        # In this queue or another live one, or a fake end of either.
        cdef FreeKVCacheBlockQueue queue
        if block._queue_id == 0:
            return False
        if block._queue_id == self._id:
            return self._holds(block)
        queue = _queue_of(block)
        return queue is not None and (queue._holds(block) or queue._is_fake_end(block))

    # ------------------------------------------------------------------ queue operations
    cpdef KVCacheBlock popleft(self):
        """Pop the head block.

        Raises:
            ValueError: the queue is empty.
        """
        cdef PyObject *p = NULL
        while self._head < self._tail:
            p = self._ring[self._head & self._mask]
            self._head += 1
            if p != NULL:
                break
            self._holes -= 1
        if p == NULL:
            raise ValueError("No free blocks available")
        self.num_free_blocks -= 1
        cdef KVCacheBlock out = <KVCacheBlock>p  # takes a new reference
        Py_DECREF_RAW(p)  # ... so drop the queue's
        return out

    cpdef list popleft_n(self, Py_ssize_t n):
        """Pop ``n`` blocks from the head, in order.

        Raises:
            ValueError: fewer than ``n`` blocks are free, or ``n`` is negative.
        """
        if n < 0:
            raise ValueError(f"n must be non-negative, got {n}")
        if n > self.num_free_blocks:
            raise ValueError(f"Cannot pop {n} blocks: only {self.num_free_blocks} are free")
        return self._popleft_n(n)

    cdef list _popleft_n(self, Py_ssize_t n):
        # The caller checked 0 <= n <= num_free_blocks.  The queue's references
        # move into the returned list; the blocks themselves are not touched.
        if n > self._tail - self._head - self._holes:  # num_free_blocks is public: trust the array
            raise RuntimeError(f"the free queue holds {self._tail - self._head - self._holes} blocks, "
                               f"not num_free_blocks={self.num_free_blocks}")
        cdef list out = PyList_New(n)
        cdef PyObject **items = (<PyListObject*>out).ob_item
        cdef PyObject **ring = self._ring
        cdef int64_t mask = self._mask
        cdef int64_t pos = self._head
        cdef Py_ssize_t j = 0, first
        cdef PyObject *p
        if self._holes == 0:
            first = (mask + 1) - (pos & mask)  # entries before the array wraps
            if first > n:
                first = n
            memcpy(items, ring + (pos & mask), first * sizeof(PyObject*))
            memcpy(items + first, ring, (n - first) * sizeof(PyObject*))
            pos += n
            # The next pop most likely takes as many from here on: start
            # loading that part of the array (it is cold in a large pool).
            for j in range(0, n if n < 512 else 512, 8):
                kvcy_prefetch(ring + ((pos + j) & mask))
        else:
            while j < n:
                p = ring[pos & mask]
                pos += 1
                if p != NULL:
                    items[j] = p
                    j += 1
                else:
                    self._holes -= 1
        self._head = pos
        self.num_free_blocks -= n
        return out

    cdef void _prefetch_head(self, Py_ssize_t n) noexcept:
        # Start loading the first n blocks at the head (the next pop's, most
        # likely), skipping holes.
        cdef int64_t pos = self._head
        cdef int64_t end = self._tail if self._tail - pos < n else pos + n
        cdef PyObject *p
        while pos < end:
            p = self._ring[pos & self._mask]
            if p != NULL:
                kvcy_prefetch(p)
            pos += 1

    cpdef remove(self, KVCacheBlock block):
        """Unlink ``block`` from the middle of the queue.

        Raises:
            RuntimeError: the block is not in the queue.
        """
        if block is None:
            raise TypeError("free queue entries must be KVCacheBlock, got NoneType")
        self._remove(block)

    cdef inline int _remove(self, KVCacheBlock block) except -1:
        # remove() for a block (not None).
        if not self._holds(block):
            raise RuntimeError(f"remove() called on an invalid block: {block}")
        cdef PyObject **ring = self._ring
        cdef int64_t mask = self._mask
        cdef int64_t pos = block._pos
        ring[pos & mask] = NULL
        if pos == self._head:
            self._head += 1
            while self._head < self._tail and ring[self._head & mask] == NULL:
                self._head += 1
                self._holes -= 1
        elif pos == self._tail - 1:
            self._tail -= 1
            while self._tail > self._head and ring[(self._tail - 1) & mask] == NULL:
                self._tail -= 1
                self._holes -= 1
        else:
            self._holes += 1
        self.num_free_blocks -= 1
        Py_DECREF_RAW(<PyObject*>block)  # the queue's (the caller holds one)
        return 0

    cpdef append(self, KVCacheBlock block):
        """Put ``block`` at the tail (freed last, evicted last)."""
        if block is None:
            raise TypeError("free queue entries must be KVCacheBlock, got NoneType")
        if self._queued_anywhere(block):
            raise RuntimeError(f"block {block.block_id} is already in the free queue")
        if block._ref_cnt != 0:
            raise RuntimeError(f"block {block.block_id} has ref_cnt {block._ref_cnt}: only free blocks are queued")
        self._ensure_room(1)
        Py_INCREF_RAW(<PyObject*>block)
        self._ring[self._tail & self._mask] = <PyObject*>block
        block._queue_id = self._id
        block._pos = self._tail
        self._tail += 1
        self.num_free_blocks += 1

    cpdef append_n(self, list blocks):
        """Put ``blocks`` at the tail, in order (the last one ends up last)."""
        self._insert_n(blocks, False)

    cpdef prepend_n(self, list blocks):
        """Put ``blocks`` at the head, in order (``blocks[0]`` becomes the head)."""
        self._insert_n(blocks, True)

    cdef int _insert_n(self, list blocks, bint at_head) except -1:
        # Write the blocks, in order, just past the tail (or just before the
        # head), then move that end over them.  A bad element (not a block,
        # already queued, listed twice) gives back what was taken: nothing
        # changes.  Runs no Python code between the first write and the end.
        if blocks is None:
            raise TypeError("blocks must be a list, not None")
        cdef Py_ssize_t i, n = PyList_GET_SIZE(blocks)
        if n == 0:
            return 0
        self._ensure_room(n)
        cdef PyObject **items = (<PyListObject*>blocks).ob_item
        cdef PyObject **ring = self._ring
        cdef int64_t mask = self._mask
        cdef uint32_t my_id = self._id
        cdef int64_t head = self._head, tail = self._tail
        cdef int64_t base = head - n if at_head else tail
        cdef int64_t pos
        cdef PyObject *p
        cdef uint32_t qid
        cdef bint repeat, queued
        cdef int32_t held = 0
        for i in range(n):
            p = items[i]
            if not _is_block(p):
                self._drop_taken(base, i)
                raise TypeError(f"free queue entries must be KVCacheBlock, got {type(<object>p).__name__}")
            qid = (<KVCacheBlock>p)._queue_id
            if qid != 0:  # it was put in a queue once: is it there still?
                if qid == my_id:
                    # Here iff its position is in [head, tail) or, for an
                    # earlier element of this batch, in [base, base + i), and
                    # the array holds this very block there.
                    pos = (<KVCacheBlock>p)._pos
                    repeat = <uint64_t>(pos - base) < <uint64_t>i and ring[pos & mask] == p
                    queued = repeat or (<uint64_t>(pos - head) < <uint64_t>(tail - head)
                                        and ring[pos & mask] == p)
                else:
                    repeat = False
                    queued = self._queued_anywhere(<KVCacheBlock>p)
                if queued:
                    self._drop_taken(base, i)
                    if repeat:
                        raise RuntimeError(f"block {(<KVCacheBlock>p).block_id} appears twice in one batch")
                    raise RuntimeError(f"block {(<KVCacheBlock>p).block_id} is already in the free queue")
            held |= (<KVCacheBlock>p)._ref_cnt  # (checked once, after the loop)
            Py_INCREF_RAW(p)
            ring[(base + i) & mask] = p
            (<KVCacheBlock>p)._pos = base + i
            (<KVCacheBlock>p)._queue_id = my_id
        if kvcy_unlikely(held != 0):  # a block with references: only free blocks are queued
            return self._refuse_held(base, blocks)
        if at_head:
            self._head = base
        else:
            self._tail = base + n
        self.num_free_blocks += n
        return 0

    cdef int _refuse_held(self, int64_t base, list blocks) except -1:
        # _insert_n wrote all of `blocks` from `base` but one has references:
        # give the entries back (the queue's ends never moved) and say which.
        self._drop_taken(base, PyList_GET_SIZE(blocks))
        cdef KVCacheBlock block
        for block in blocks:
            if block._ref_cnt != 0:
                raise RuntimeError(f"block {block.block_id} has ref_cnt {block._ref_cnt}: only free blocks are queued")
        raise AssertionError("unreachable")

    cpdef list get_all_free_blocks(self):
        """All free blocks from head to tail (for tests and checks)."""
        cdef list out = []
        cdef int64_t pos
        cdef PyObject *p
        for pos in range(self._head, self._tail):
            p = self._ring[pos & self._mask]
            if p != NULL:
                out.append(<object>p)
        return out

    def __len__(self):
        return self.num_free_blocks


# =============================================================================
# Hash -> block map and the block pool
# =============================================================================
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


cdef struct _Slot:
    uint64_t h         # kvcy_key_hash of (key, gid)
    PyObject *key      # the block hash (bytes), owned; NULL: empty slot
    PyObject *value    # a KVCacheBlock, or a dict {block_id: block} when several share the key; owned
    uint32_t gid       # KV-cache group id


@cython.final
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

    cdef _Slot *_slots
    cdef size_t _mask      # capacity - 1 (a power of two)
    cdef Py_ssize_t _len   # occupied slots
    # (An object field, so that the type takes part in the cycle collector:
    # its tp_traverse / tp_clear, installed below, see the table's references.)
    cdef object _gc_anchor

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
        """The whole map keyed by ``BlockHashWithGroupId`` (a copy, for inspection)."""
        cdef size_t i
        out = {}
        for i in range(self._mask + 1):
            if self._slots[i].key != NULL:
                v = <object>self._slots[i].value
                out[_group_key(<bytes>self._slots[i].key, self._slots[i].gid)] = (
                    dict(v) if type(v) is dict else v
                )
        return out

    def __len__(self):
        return self._len


# The cycle collector sees what the queue's ring and the map's table hold
# (C arrays, which Cython's generated tp_traverse / tp_clear do not know):
# a block subclass whose instance refers back to its queue or map forms a
# cycle that is found and broken like any other.
cdef traverseproc _queue_base_traverse = (<PyTypeObject*>FreeKVCacheBlockQueue).tp_traverse
cdef traverseproc _map_base_traverse = (<PyTypeObject*>BlockHashToBlockMap).tp_traverse
cdef inquiry _map_base_clear = (<PyTypeObject*>BlockHashToBlockMap).tp_clear


cdef int _queue_traverse(PyObject *o, visitproc visit, void *arg) except -1:
    cdef int r = _queue_base_traverse(o, visit, arg) if _queue_base_traverse != NULL else 0
    if r != 0:
        return r
    cdef PyObject **ring = (<FreeKVCacheBlockQueue>o)._ring
    cdef int64_t pos, mask = (<FreeKVCacheBlockQueue>o)._mask
    cdef PyObject *p
    if ring == NULL:
        return 0
    for pos in range((<FreeKVCacheBlockQueue>o)._head, (<FreeKVCacheBlockQueue>o)._tail):
        p = ring[pos & mask]
        if p != NULL:
            r = visit(p, arg)
            if r != 0:
                return r
    return 0


cdef int _queue_clear(object o) except -1:
    (<FreeKVCacheBlockQueue>o)._release_blocks()
    return 0


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


(<PyTypeObject*>FreeKVCacheBlockQueue).tp_traverse = _queue_traverse
(<PyTypeObject*>FreeKVCacheBlockQueue).tp_clear = _queue_clear
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
    """Request block hashes seen at a coarser block size (consecutive hashes joined)."""

    cdef list _hashes
    cdef Py_ssize_t _scale

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
        return b"".join(self._hashes[i * self._scale:(i + 1) * self._scale])


cdef inline Py_ssize_t _num_searchable_blocks(object hashes, Py_ssize_t max_length,
                                              Py_ssize_t block_size) except -1:
    """Blocks a hit search may look at: within max_length and within the known hashes."""
    cdef Py_ssize_t n = max_length // block_size
    cdef Py_ssize_t n_hashes = len(hashes)
    return n_hashes if n_hashes < n else n


cdef inline object _resolve(object hashes, Py_ssize_t hash_block_size, Py_ssize_t block_size):
    if block_size == hash_block_size:
        return hashes
    if hash_block_size <= 0 or block_size <= 0 or block_size % hash_block_size != 0:
        raise ValueError(f"block size {block_size} is not a positive multiple of the hash block size "
                         f"{hash_block_size}")
    return _BlockHashView(list(hashes), block_size // hash_block_size)


def resolve_block_hashes(hashes, Py_ssize_t hash_block_size, Py_ssize_t block_size):
    """The request's hashes at ``block_size`` (a multiple of ``hash_block_size``)."""
    return _resolve(hashes, hash_block_size, block_size)


cdef enum:
    # Blocks whose table lookups one batch loop starts before using any (see
    # BlockPool._get_new_blocks and cache_full_blocks).
    _EVICT_BATCH = 32


cdef inline Py_ssize_t _initial_map_keys(Py_ssize_t num_blocks) noexcept:
    # A pool caches at most one key per block: size the map for all of them
    # up front (no rehash pauses in steady state), up to a table of 2**19
    # slots (16 MiB); bigger pools grow it as their cache fills.
    cdef Py_ssize_t most = (1 << 19) // _LOAD_INV
    return num_blocks if num_blocks < most else most


cdef class BlockPool:
    """All KV-cache blocks: allocation, freeing, caching and lazy eviction.

    Args:
        num_gpu_blocks: blocks in the pool (block 0 becomes the null block).
        enable_caching: whether prefix caching is on.
        hash_block_size: the block size request hashes are computed at.
        enable_kv_cache_events: queue BlockStored / BlockRemoved /
            AllBlocksCleared events for ``take_events``.
        use_int_block_hashes: publish hashes in events as 64-bit ints
            (default: vLLM's ``VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES``).
    """

    # The pool's structure is fixed when it is made (readonly: the hot paths
    # read these fields without checks); counters and the collector are free.
    cdef readonly Py_ssize_t num_gpu_blocks
    cdef readonly bint enable_caching
    cdef readonly Py_ssize_t hash_block_size
    cdef readonly list blocks
    cdef readonly FreeKVCacheBlockQueue free_block_queue
    cdef readonly BlockHashToBlockMap cached_block_hash_to_block
    cdef readonly KVCacheBlock null_block
    cdef readonly bint enable_kv_cache_events
    cdef readonly bint use_int_block_hashes
    cdef readonly list kv_event_queue
    cdef public object metrics_collector
    cdef public Py_ssize_t num_evictions

    def __init__(self, num_gpu_blocks, enable_caching, hash_block_size, enable_kv_cache_events=False,
                 metrics_collector=None, use_int_block_hashes=None):
        if isinstance(num_gpu_blocks, bool) or not isinstance(num_gpu_blocks, int):
            raise TypeError(f"num_gpu_blocks must be an int, got {type(num_gpu_blocks).__name__}")
        if num_gpu_blocks < 1:
            raise ValueError(f"num_gpu_blocks must be at least 1 (the null block), got {num_gpu_blocks}")
        if num_gpu_blocks > 2**31:
            raise ValueError(
                f"num_gpu_blocks must be at most 2**31 (block ids are int32, as in vLLM's block tables), "
                f"got {num_gpu_blocks}"
            )
        if isinstance(hash_block_size, bool) or not isinstance(hash_block_size, int) or hash_block_size <= 0:
            raise ValueError(f"hash_block_size must be a positive int, got {hash_block_size!r}")
        self.num_gpu_blocks = num_gpu_blocks
        self.enable_caching = bool(enable_caching)
        self.hash_block_size = hash_block_size
        self.blocks = [KVCacheBlock(i) for i in range(num_gpu_blocks)]
        self.free_block_queue = FreeKVCacheBlockQueue(self.blocks)
        self.cached_block_hash_to_block = BlockHashToBlockMap()
        if self.enable_caching:
            self.cached_block_hash_to_block._reserve(_initial_map_keys(num_gpu_blocks))
        self.null_block = self.free_block_queue.popleft()
        self.null_block.is_null = True
        self.enable_kv_cache_events = bool(enable_kv_cache_events)
        self.use_int_block_hashes = (
            default_use_int_block_hashes() if use_int_block_hashes is None else bool(use_int_block_hashes)
        )
        self.kv_event_queue = []
        self.metrics_collector = metrics_collector
        self.num_evictions = 0

    # ------------------------------------------------------------------ lookups
    cpdef object get_cached_block(self, object block_hash, list kv_cache_group_ids):
        """One cached block per group for ``block_hash``, or None if any group misses."""
        cdef list out = []
        cdef object block
        cdef Py_ssize_t gid
        for gid in kv_cache_group_ids:
            block = self.cached_block_hash_to_block._get(block_hash, gid)
            if block is None:
                return None
            out.append(block)
        return out

    cdef inline object _get_one(self, object block_hash, Py_ssize_t gid):
        return self.cached_block_hash_to_block._get(block_hash, gid)

    # ------------------------------------------------------------------ caching
    cdef object _ext(self, bytes block_hash):
        return external_block_hash(block_hash, self.use_int_block_hashes)

    cpdef cache_full_blocks(self, request, list blocks, Py_ssize_t num_cached_blocks,
                            Py_ssize_t num_full_blocks, Py_ssize_t block_size,
                            Py_ssize_t kv_cache_group_id):
        """Give blocks ``[num_cached_blocks, num_full_blocks)`` their hashes and cache them.

        Null blocks are skipped.  With events on, one ``BlockStored`` is queued.
        """
        if num_cached_blocks >= num_full_blocks:
            return
        if num_cached_blocks < 0:
            raise ValueError(f"num_cached_blocks must be non-negative, got {num_cached_blocks}")
        if blocks is None:
            raise TypeError("blocks must be a list of KVCacheBlock, got None")
        block_hashes = _resolve(_block_hashes_of(request), self.hash_block_size, block_size)
        if len(block_hashes) < num_full_blocks:
            raise RuntimeError(
                f"request {request.request_id!r} has {len(block_hashes)} block hashes at block size "
                f"{block_size}, fewer than the {num_full_blocks} full blocks to cache"
            )
        if num_full_blocks > PyList_GET_SIZE(blocks):
            raise RuntimeError(f"{num_full_blocks} full blocks to cache but the request holds {len(blocks)}")
        cdef Py_ssize_t i
        cdef KVCacheBlock blk
        cdef object block_hash
        if not 0 <= kv_cache_group_id <= 0xFFFFFFFF:
            raise ValueError(f"KV-cache group id {kv_cache_group_id} does not fit in 4 bytes")
        # The new blocks' hashes: the request's own list, or read once from a
        # coarser view; new_block_hashes[i - off] is block i's hash.
        cdef list new_block_hashes
        cdef Py_ssize_t off
        if type(block_hashes) is list:
            new_block_hashes = <list>block_hashes
            off = 0
        else:
            new_block_hashes = [block_hashes[i] for i in range(num_cached_blocks, num_full_blocks)]
            off = num_cached_blocks
        cdef PyObject *hp
        cdef BlockHashToBlockMap cache = self.cached_block_hash_to_block
        cdef Py_ssize_t ahead, start, end
        for i in range(num_cached_blocks, num_full_blocks):  # validate before any change
            ahead = i + 8  # the hash objects are scattered: start loading a few ahead
            if ahead < num_full_blocks:
                hp = _PyList_GET_ITEM_RAW(new_block_hashes, ahead - off)
                kvcy_prefetch(hp)
                kvcy_prefetch(<char*>hp + 63)
                kvcy_prefetch(_PyList_GET_ITEM_RAW(blocks, ahead))
            hp = _PyList_GET_ITEM_RAW(new_block_hashes, i - off)
            if Py_TYPE_RAW(hp) != &PyBytes_Type:
                raise TypeError(f"block hashes must be bytes, got {type(<object>hp).__name__}")
            if not _is_block(PyList_GET_ITEM(blocks, i)):
                raise TypeError(f"blocks must be KVCacheBlock, got {type(blocks[i]).__name__}")
            blk = <KVCacheBlock>PyList_GET_ITEM(blocks, i)
            assert blk.is_null or blk._hash is None, "The block already has a hash. This should not happen."
        cdef bint events = self.enable_kv_cache_events
        cdef list new_hashes = [] if events else None
        cdef uint64_t hs[_EVICT_BATCH]
        cdef uint32_t gid = <uint32_t>kv_cache_group_id
        start = num_cached_blocks
        while start < num_full_blocks:  # (a range() with an enum step would build a Python range)
            end = start + _EVICT_BATCH
            if end > num_full_blocks:
                end = num_full_blocks
            for i in range(start, end):  # start loading the table slots
                hp = _PyList_GET_ITEM_RAW(new_block_hashes, i - off)
                hs[i - start] = kvcy_key_hash(_PyBytes_AS_STRING_RAW(hp), _PyBytes_GET_SIZE_RAW(hp), gid)
                cache._prefetch(hs[i - start])
            for i in range(start, end):
                blk = <KVCacheBlock>PyList_GET_ITEM(blocks, i)
                if blk.is_null:
                    continue
                block_hash = <object>_PyList_GET_ITEM_RAW(new_block_hashes, i - off)
                blk._hash = block_hash
                blk._group = gid
                blk._key_h = <uint32_t>hs[i - start]
                blk._num_tokens = (i + 1) * block_size
                cache._insert_hashed(<PyObject*>block_hash, gid, hs[i - start], blk)
                if events:
                    new_hashes.append(self._ext(block_hash))
            start = end
        if events:
            parent = None if num_cached_blocks == 0 else self._ext(block_hashes[num_cached_blocks - 1])
            extra_keys_list = []
            mm_idx = 0
            for i in range(num_cached_blocks, num_full_blocks):
                if (<KVCacheBlock>blocks[i]).is_null:
                    continue
                start = i * block_size
                keys, mm_idx = generate_block_hash_extra_keys(request, start, start + block_size, mm_idx)
                extra_keys_list.append(untag_extra_keys(keys))
            self.kv_event_queue.append(
                self._block_stored(
                    request, new_hashes, parent, num_cached_blocks * block_size,
                    num_full_blocks * block_size, block_size, kv_cache_group_id, extra_keys_list,
                )
            )

    cdef int _check_hashes_to_cache(self, object request, Py_ssize_t num_cached_blocks,
                                    Py_ssize_t num_full_blocks, Py_ssize_t block_size) except -1:
        # What cache_full_blocks(request, ..., num_cached_blocks, num_full_blocks,
        # block_size, ...) reads of the request's hashes, checked before the
        # caller changes anything (it caches after allocating): enough of
        # them, and those it reads bytes.  The same errors.
        if num_cached_blocks >= num_full_blocks:
            return 0
        if num_cached_blocks < 0:
            num_cached_blocks = 0
        hashes = _block_hashes_of(request)
        cdef Py_ssize_t scale = 1
        if block_size != self.hash_block_size:
            _resolve((), self.hash_block_size, block_size)  # (its ValueError for a bad size)
            scale = block_size // self.hash_block_size
        cdef Py_ssize_t n = len(hashes) // scale
        if n < num_full_blocks:
            raise RuntimeError(
                f"request {_rid(request)!r} has {n} block hashes at block size "
                f"{block_size}, fewer than the {num_full_blocks} full blocks to cache"
            )
        cdef Py_ssize_t j
        cdef object h
        cdef PyObject *hp
        if type(hashes) is list:  # (a request's own list: read in place)
            for j in range(num_cached_blocks * scale, num_full_blocks * scale):
                hp = _PyList_GET_ITEM_RAW(hashes, j)
                if Py_TYPE_RAW(hp) != &PyBytes_Type:
                    raise TypeError(f"block hashes must be bytes, got {type(<object>hp).__name__}")
            return 0
        for j in range(num_cached_blocks * scale, num_full_blocks * scale):
            h = hashes[j]
            if type(h) is not bytes:
                raise TypeError(f"block hashes must be bytes, got {type(h).__name__}")
        return 0

    cdef object _block_stored(self, request, list hashes, parent, Py_ssize_t start, Py_ssize_t end,
                              Py_ssize_t block_size, Py_ssize_t group_id, list extra_keys_list):
        lora = request.lora_request
        return BlockStored(
            block_hashes=hashes,
            parent_block_hash=parent,
            token_ids=request.all_token_ids[start:end],
            block_size=block_size,
            lora_id=lora.lora_int_id if lora is not None else None,
            medium=MEDIUM_GPU,
            lora_name=lora.lora_name if lora is not None else None,
            extra_keys=extra_keys_list if extra_keys_list else None,
            group_idx=group_id,
        )

    def emit_cached_block_events(self, request, Py_ssize_t num_cached_blocks, Py_ssize_t block_size,
                                 Py_ssize_t kv_cache_group_id):
        """Queue a ``BlockStored`` for a prefix hit of ``num_cached_blocks`` blocks (no state change)."""
        if not self.enable_kv_cache_events or num_cached_blocks == 0:
            return
        block_hashes = _resolve(request.block_hashes, self.hash_block_size, block_size)
        hashes = []
        extra_keys_list = []
        mm_idx = 0
        for i in range(num_cached_blocks):
            hashes.append(self._ext(block_hashes[i]))
            start = i * block_size
            keys, mm_idx = generate_block_hash_extra_keys(request, start, start + block_size, mm_idx)
            extra_keys_list.append(untag_extra_keys(keys))
        self.kv_event_queue.append(
            self._block_stored(
                request, hashes, None, 0, num_cached_blocks * block_size, block_size,
                kv_cache_group_id, extra_keys_list,
            )
        )

    # ------------------------------------------------------------------ allocation
    def get_new_blocks(self, num_blocks):
        """Pop ``num_blocks`` free blocks, evicting any cached ones, ref_cnt 0 -> 1.

        Raises:
            ValueError: fewer than ``num_blocks`` blocks are free (nothing changes).
        """
        return self._get_new_blocks(_check_count("num_blocks", num_blocks))

    cdef list _get_new_blocks(self, Py_ssize_t num_blocks):
        if num_blocks > self.free_block_queue.num_free_blocks:
            raise ValueError(f"Cannot get {num_blocks} free blocks from the pool")
        cdef list ret = self.free_block_queue._popleft_n(num_blocks)
        cdef PyObject **items = (<PyListObject*>ret).ob_item
        cdef Py_ssize_t i, start, end
        if not self.enable_caching:
            for i in range(num_blocks):
                (<KVCacheBlock>items[i])._ref_cnt += 1
            return ret
        # Eviction (which may allocate) runs after the queue is consistent
        # again, a batch at a time: first the loads an eviction needs -- the
        # key's table slot (from the hash half the block keeps) and the hash
        # object's header (its references drop) -- are started for the whole
        # batch, so the evictions find them in cache instead of missing one
        # after another.
        cdef PyObject *p
        cdef PyObject *k
        cdef BlockHashToBlockMap cache = self.cached_block_hash_to_block
        start = 0
        while start < num_blocks:  # (a range() with an enum step would build a Python range)
            end = start + _EVICT_BATCH
            if end > num_blocks:
                end = num_blocks
            for i in range(start, end):
                p = items[i]
                k = <PyObject*>(<KVCacheBlock>p)._hash
                if k != <PyObject*>None:
                    cache._prefetch((<KVCacheBlock>p)._key_h)
                    kvcy_prefetch(k)
            for i in range(start, end):
                p = items[i]
                if (<KVCacheBlock>p)._hash is not None:
                    _evict(self, <KVCacheBlock>p)
                (<KVCacheBlock>p)._ref_cnt += 1
            start = end
        # The next allocation most likely takes about as many blocks from the
        # head; in a large pool they are cold (the queue already started
        # loading their array entries).
        self.free_block_queue._prefetch_head(num_blocks if num_blocks < 64 else 64)
        return ret

    cdef int _queue_removed(self, KVCacheBlock block) except -1:
        # The BlockRemoved event of a block about to lose its key.
        self.kv_event_queue.append(
            BlockRemoved(block_hashes=[self._ext(block._hash)], medium=MEDIUM_GPU, group_idx=block._group)
        )
        return 0

    def evict_blocks(self, block_ids):
        """Drop the cache keys of the given blocks (they stay where they are)."""
        block_ids = list(block_ids)  # (read twice: checked first)
        for block_id in block_ids:
            if isinstance(block_id, bool) or not isinstance(block_id, int):
                raise TypeError(f"block ids must be ints, got {type(block_id).__name__}")
            if not 0 <= block_id < self.num_gpu_blocks:
                raise ValueError(f"block id {block_id} is outside the pool of {self.num_gpu_blocks}")
        cdef object block
        for block_id in block_ids:
            block = self.blocks[block_id]
            if not _is_block(<PyObject*>block):  # (blocks is a public list)
                raise TypeError(f"pool blocks must be KVCacheBlock, got {type(block).__name__}")
            _evict(self, <KVCacheBlock>block)

    def touch(self, blocks):
        """Take a reference on cache-hit blocks, unlinking free ones from the queue.

        ``blocks`` holds blocks, or one sequence of blocks per KV-cache group.

        Raises:
            TypeError: an element is not a KVCacheBlock.
            RuntimeError: a block with no references is not in the free queue.
            In both cases nothing changes.
        """
        cdef list groups
        if blocks and not isinstance(blocks[0], KVCacheBlock):
            groups = [list(group) for group in blocks]
        else:
            groups = [list(blocks)]
        cdef list group
        for group in groups:  # check everything before any change
            _check_hit_blocks(group, NULL, self.free_block_queue, self.blocks)
        for group in groups:
            self._touch(group)

    cdef int _touch(self, list blocks) except -1:
        cdef Py_ssize_t i, n = PyList_GET_SIZE(blocks)
        for i in range(n):
            self._touch_one(<KVCacheBlock>PyList_GET_ITEM(blocks, i))
        return 0

    cdef inline int _touch_one(self, KVCacheBlock block) except -1:
        # Take a reference on a hit block, unlinking it from the free queue
        # when it was free (the queue type is final: no remove() override).
        if block.is_null:
            return 0
        if block._ref_cnt == 0:
            self.free_block_queue._remove(block)
        block._ref_cnt += 1
        return 0

    def free_blocks(self, ordered_blocks):
        """Drop one reference on each block, in eviction order.

        A block reaching 0 goes to the tail of the free queue if it is cached
        (LRU) and to the head if not (reused first); each batch keeps the
        given order.

        Raises:
            TypeError: an element is not a KVCacheBlock.
            RuntimeError: a block would be freed more times than it was taken.
            In both cases nothing changes.
        """
        cdef list blocks_list = ordered_blocks if type(ordered_blocks) is list else list(ordered_blocks)
        self._free_blocks(blocks_list)

    cdef int _free_blocks(self, list blocks_list) except -1:
        # One pass: type-check, drop a reference; a block reaching 0 gains the
        # queue's reference and is written just past the queue's tail (cached)
        # or just before its head (not cached, written backwards and put in
        # list order at the end).  The queue's ends move only after the pass,
        # so bad input found midway is rolled back with the queue untouched.
        cdef FreeKVCacheBlockQueue queue = self.free_block_queue
        cdef Py_ssize_t i, n = PyList_GET_SIZE(blocks_list)
        queue._ensure_room(n)
        cdef PyObject **items = (<PyListObject*>blocks_list).ob_item
        cdef bint caching = self.enable_caching
        cdef PyObject **ring = queue._ring
        cdef int64_t mask = queue._mask
        cdef uint32_t queue_id = queue._id
        cdef int64_t head = queue._head
        cdef int64_t tail = queue._tail
        cdef int64_t n_head = 0, n_tail = 0, pos
        cdef PyObject *p
        for i in range(n):
            p = items[i]
            if not _is_block(p):
                self._undo_free(blocks_list, i, n_head, n_tail)
                raise TypeError(f"free_blocks takes KVCacheBlock, got {type(<object>p).__name__}")
            if (<KVCacheBlock>p).is_null:
                continue
            if (<KVCacheBlock>p)._ref_cnt <= 0:
                self._undo_free(blocks_list, i, n_head, n_tail)
                raise RuntimeError(f"block {(<KVCacheBlock>p).block_id} freed more times than it was taken")
            (<KVCacheBlock>p)._ref_cnt = (<KVCacheBlock>p)._ref_cnt - 1
            if (<KVCacheBlock>p)._ref_cnt == 0:
                Py_INCREF_RAW(p)
                if caching and (<KVCacheBlock>p)._hash is not None:
                    pos = tail + n_tail
                    n_tail += 1
                else:
                    n_head += 1
                    pos = head - n_head
                ring[pos & mask] = p
                (<KVCacheBlock>p)._queue_id = queue_id
                (<KVCacheBlock>p)._pos = pos
        if n_head + n_tail == 0:
            return 0
        cdef int64_t lo = head - n_head, hi = head - 1
        while lo < hi:  # the head batch went in backwards: reverse it
            p = ring[lo & mask]
            ring[lo & mask] = ring[hi & mask]
            ring[hi & mask] = p
            (<KVCacheBlock>ring[lo & mask])._pos = lo
            (<KVCacheBlock>p)._pos = hi
            lo += 1
            hi -= 1
        queue._head = head - n_head
        queue._tail = tail + n_tail
        queue.num_free_blocks += n_head + n_tail
        return 0

    cdef void _undo_free(self, list blocks_list, Py_ssize_t upto, int64_t n_head,
                         int64_t n_tail) noexcept:
        # Give back the queue references taken for the n_head entries before
        # the head and the n_tail past the tail (outside the queue's range, so
        # not in it), and the references dropped from blocks_list[:upto].
        cdef Py_ssize_t i
        cdef PyObject *x
        cdef FreeKVCacheBlockQueue queue = self.free_block_queue
        queue._drop_taken(queue._head - n_head, n_head)
        queue._drop_taken(queue._tail, n_tail)
        for i in range(upto):
            x = _PyList_GET_ITEM_RAW(blocks_list, i)
            if not (<KVCacheBlock>x).is_null:
                (<KVCacheBlock>x)._ref_cnt += 1

    def reset_prefix_cache(self):
        """Drop every cache key; only when no block but the null block is in use."""
        cdef Py_ssize_t num_used_blocks = self.num_gpu_blocks - self.free_block_queue.num_free_blocks
        if num_used_blocks != 1:
            logger.warning(
                "Failed to reset prefix cache because some blocks (%d) are not freed yet",
                num_used_blocks - 1,
            )
            return False
        cdef object item
        for item in self.blocks:  # (blocks is a public list)
            if not _is_block(<PyObject*>item):
                raise TypeError(f"pool blocks must be KVCacheBlock, got {type(item).__name__}")
        self.cached_block_hash_to_block = BlockHashToBlockMap()
        if self.enable_caching:
            self.cached_block_hash_to_block._reserve(_initial_map_keys(self.num_gpu_blocks))
        cdef KVCacheBlock block
        for block in self.blocks:
            block._hash = None
            block._num_tokens = -1
        if self.enable_kv_cache_events:
            self.kv_event_queue.append(AllBlocksCleared())
        return True

    cpdef Py_ssize_t get_num_free_blocks(self):
        return self.free_block_queue.num_free_blocks

    def get_usage(self):
        """Fraction of usable blocks in use (the null block does not count)."""
        cdef Py_ssize_t total = self.num_gpu_blocks - 1
        if total <= 0:
            return 0.0
        return 1.0 - (self.free_block_queue.num_free_blocks / <double>total)

    def take_events(self):
        """Drain the event queue."""
        if not self.enable_kv_cache_events:
            return []
        events = self.kv_event_queue
        self.kv_event_queue = []
        return events


# =============================================================================
# Single-type managers
# =============================================================================
cdef inline list _held_list(PyObject *p):
    # An entry of a manager's req_to_blocks (a public dict: check what is
    # there before reading it as a list), or None for no entry.
    if p == NULL:
        return None
    if Py_TYPE_RAW(p) != &PyList_Type:
        raise TypeError(f"req_to_blocks values must be lists of blocks, got {type(<object>p).__name__}")
    return <list>p


cdef inline int _check_group_count(tuple per_group, Py_ssize_t n) except -1:
    # A coordinator's per-group argument has one entry per group (it is
    # indexed without bounds checks).
    if per_group is None:
        raise TypeError("expected a tuple with one sequence of blocks per KV-cache group, got None")
    if PyTuple_GET_SIZE(per_group) != n:
        raise ValueError(f"expected one sequence of blocks per KV-cache group ({n}), got {PyTuple_GET_SIZE(per_group)}")
    return 0


cdef inline bint _evict(BlockPool pool, KVCacheBlock block) except -1:
    # The Python twin's BlockPool._maybe_evict_cached_block (inlined into get_new_blocks' loop):
    # drop the block's key from the cache map (found from the hash half the
    # block keeps), with its event; False if it had no key there.
    if block._hash is None:
        return False
    if not pool.cached_block_hash_to_block._drop_block(block):
        return False
    if pool.enable_kv_cache_events:
        pool._queue_removed(block)
    block._hash = None
    block._num_tokens = -1
    pool.num_evictions += 1
    return True


def _checked_count(name, value):
    """``_check_count`` for Python callers (the shared request tables)."""
    return _check_count(name, value)


@cython.final
cdef class _Generation:
    """A manager's generation (SingleTypeKVCacheManager._gen), shared with its table views."""

    cdef Py_ssize_t value

    def __cinit__(self):
        self.value = _next_gen()

    def bump(self):
        self.value = _next_gen()


cdef class SingleTypeKVCacheManager:
    """Block bookkeeping for one KV-cache group of one attention type."""

    # Fixed when made (readonly: read without checks, divided by); use_eagle
    # is set by the coordinators.  The two dicts are readonly attributes
    # whose entries callers may still change (vLLM's tests do).
    cdef readonly object kv_cache_spec
    cdef readonly Py_ssize_t block_size
    cdef readonly BlockPool block_pool
    cdef readonly bint enable_caching
    cdef readonly Py_ssize_t kv_cache_group_id
    cdef readonly Py_ssize_t scheduler_block_size
    cdef readonly object _max_admission_blocks_per_request
    cdef Py_ssize_t _cap
    cdef public bint use_eagle
    cdef dict _req_to_blocks  # request id -> its blocks (req_to_blocks: a checked view)
    cdef dict _num_cached_block  # request id -> blocks cached (num_cached_block: a checked view)
    cdef readonly object req_to_blocks
    cdef readonly object num_cached_block
    # Changes whenever an entry of the two dicts above is added, replaced or
    # removed other than through KVCacheManager._full_slots (which keeps the
    # request's own record in step and re-reads what another Request object
    # of the same id could have added there); a request's remembered entries
    # are valid only while it matches.  Values come from one process-wide
    # counter, so a new manager never repeats an old one's.  Callers reach
    # the dicts only through the two views, whose every change moves it too:
    # the record cannot go stale behind the manager's back.
    cdef _Generation _gen
    cdef readonly KVCacheBlock _null_block

    def __init__(self, kv_cache_spec, BlockPool block_pool, enable_caching, Py_ssize_t kv_cache_group_id,
                 Py_ssize_t scheduler_block_size, max_admission_blocks_per_request=None):
        self.kv_cache_spec = kv_cache_spec
        self.block_size = kv_cache_spec.block_size
        self.block_pool = block_pool
        self.enable_caching = bool(enable_caching)
        self.kv_cache_group_id = kv_cache_group_id
        self.scheduler_block_size = scheduler_block_size
        self._max_admission_blocks_per_request = max_admission_blocks_per_request
        self._cap = -1 if max_admission_blocks_per_request is None else max_admission_blocks_per_request
        self.use_eagle = False
        self._req_to_blocks = {}
        self._num_cached_block = {}
        self._gen = _Generation()
        self.req_to_blocks = _BlockTable(self._req_to_blocks, self._gen, block_pool.blocks, KVCacheBlock)
        self.num_cached_block = _CountTable(self._num_cached_block, self._gen, _checked_count)
        self._null_block = block_pool.null_block

    # -------------------------------------------------------------- counting
    cpdef Py_ssize_t get_num_skipped_tokens(self, Py_ssize_t num_computed_tokens):
        """Tokens before the attention window (their blocks can be freed)."""
        return 0

    cpdef Py_ssize_t get_num_blocks_to_allocate(
        self, str request_id, Py_ssize_t num_tokens, object new_computed_blocks,
        Py_ssize_t total_computed_tokens, Py_ssize_t num_local_computed_tokens,
        Py_ssize_t num_tokens_main_model, bint apply_admission_cap=False,
    ) except -1:
        """Blocks this group must take from the free pool to hold ``num_tokens``.

        Evictable cache hits (free, ref_cnt 0) count too: touching them takes
        them out of the free pool.
        """
        cdef Py_ssize_t num_required_blocks = _cdiv(num_tokens, self.block_size)
        if apply_admission_cap and self._cap >= 0 and self._cap < num_required_blocks:
            num_required_blocks = self._cap
        cdef PyObject* p = PyDict_GetItem(self._req_to_blocks, request_id)
        cdef Py_ssize_t num_req_blocks = 0 if p == NULL else PyList_GET_SIZE(_held_list(p))
        cdef Py_ssize_t n
        if request_id in self._num_cached_block:
            n = num_required_blocks - num_req_blocks
            return n if n > 0 else 0
        cdef Py_ssize_t num_skipped_blocks = self.get_num_skipped_tokens(total_computed_tokens) // self.block_size
        cdef Py_ssize_t n_new_computed = len(new_computed_blocks)
        cdef Py_ssize_t num_local_computed_blocks = n_new_computed + num_req_blocks
        cdef Py_ssize_t m = num_skipped_blocks if num_skipped_blocks > num_local_computed_blocks else num_local_computed_blocks
        cdef Py_ssize_t num_new_blocks = num_required_blocks - m
        if num_new_blocks < 0:
            num_new_blocks = 0
        cdef Py_ssize_t skip_new = num_skipped_blocks - num_req_blocks
        if skip_new < 0:
            skip_new = 0
        cdef Py_ssize_t i, num_evictable = 0
        cdef KVCacheBlock blk
        cdef object item
        cdef FreeKVCacheBlockQueue queue = self.block_pool.free_block_queue if self.enable_caching else None
        for i in range(skip_new, n_new_computed):
            item = new_computed_blocks[i]
            if not _is_block(<PyObject*>item):
                raise TypeError(f"blocks must be KVCacheBlock, got {type(item).__name__}")
            blk = <KVCacheBlock>item
            if blk._ref_cnt == 0 and not blk.is_null:
                # (a free hit must be in the free queue, or touching it fails half-way)
                if queue is not None and not queue._holds(blk):
                    raise RuntimeError(f"remove() called on an invalid block: {blk}")
                num_evictable += 1
        return num_new_blocks + num_evictable

    # -------------------------------------------------------------- allocation
    cpdef add_local_computed_blocks(self, str request_id, object new_computed_blocks,
                                    Py_ssize_t num_local_computed_tokens,
                                    Py_ssize_t num_external_computed_tokens):
        """Attach prefix-cache hits to a request that holds no blocks yet."""
        self._gen.value = _next_gen()
        cdef Py_ssize_t total = num_local_computed_tokens + num_external_computed_tokens
        cdef Py_ssize_t num_skipped_blocks = self.get_num_skipped_tokens(total) // self.block_size
        cdef list blocks = self._checked_hits(new_computed_blocks, total)
        cdef list req_blocks = self._req_to_blocks.setdefault(request_id, [])
        assert not req_blocks
        if self.enable_caching:
            self.block_pool._touch(blocks)
        if num_skipped_blocks > 0:
            req_blocks.extend([self._null_block] * num_skipped_blocks)
        req_blocks.extend(blocks)
        self._num_cached_block[request_id] = len(req_blocks)

    cdef list _checked_hits(self, object new_computed_blocks, Py_ssize_t total_computed_tokens):
        # The hits add_local_computed_blocks takes (those past the skipped
        # ones), checked before any change.
        cdef list blocks = list(new_computed_blocks)
        cdef Py_ssize_t skipped = self.get_num_skipped_tokens(total_computed_tokens) // self.block_size
        if skipped > 0:
            blocks = blocks[skipped:]
        return _check_hit_blocks(blocks, NULL, self.block_pool.free_block_queue if self.enable_caching else None,
                                 self.block_pool.blocks)

    cpdef allocate_external_computed_blocks(self, str request_id, Py_ssize_t num_local_computed_tokens,
                                            Py_ssize_t num_external_computed_tokens):
        """New blocks for tokens a KV connector computed (after every group touched its hits)."""
        cdef Py_ssize_t total = num_local_computed_tokens + num_external_computed_tokens
        cdef Py_ssize_t num_skipped_tokens = self.get_num_skipped_tokens(total)
        if num_skipped_tokens > 0:
            num_external_computed_tokens = min(total - num_skipped_tokens, num_external_computed_tokens)
        if num_external_computed_tokens <= 0:
            return
        self._gen.value = _next_gen()
        cdef list req_blocks = self._req_to_blocks.setdefault(request_id, [])
        cdef Py_ssize_t num_new_blocks = _cdiv(total, self.block_size) - PyList_GET_SIZE(req_blocks)
        # (holding as many already: nothing to do, as in vLLM -- never a
        # negative count to the unchecked pop)
        if num_new_blocks > 0:
            req_blocks.extend(self.block_pool._get_new_blocks(num_new_blocks))

    cpdef list allocate_new_blocks(self, str request_id, Py_ssize_t num_tokens, Py_ssize_t num_tokens_main_model):
        """Give the request at least ``num_tokens`` slots; return the new blocks."""
        cdef list out = self._allocate_new_blocks(request_id, num_tokens)
        return [] if out is None else out

    cdef list _allocate_new_blocks(self, str request_id, Py_ssize_t num_tokens):
        # As allocate_new_blocks, but None (no list built) when nothing is new.
        cdef PyObject* p = PyDict_GetItem(self._req_to_blocks, request_id)
        cdef list req_blocks
        if p == NULL:
            self._gen.value = _next_gen()
            req_blocks = []
            self._req_to_blocks[request_id] = req_blocks
        else:
            req_blocks = _held_list(p)
        cdef Py_ssize_t num_new_blocks = _cdiv(num_tokens, self.block_size) - PyList_GET_SIZE(req_blocks)
        if num_new_blocks <= 0:
            return None
        cdef list new_blocks = self.block_pool._get_new_blocks(num_new_blocks)
        req_blocks.extend(new_blocks)
        return new_blocks

    cpdef cache_blocks(self, request, Py_ssize_t num_tokens):
        """Cache the request's full blocks among its first ``num_tokens`` tokens."""
        cdef str request_id = _rid(request)
        cdef PyObject* p = PyDict_GetItem(self._num_cached_block, request_id)
        cdef Py_ssize_t num_cached_blocks = 0 if p == NULL else <Py_ssize_t><object>p
        cdef Py_ssize_t num_full_blocks = num_tokens // self.block_size
        if num_cached_blocks >= num_full_blocks:
            return
        self.block_pool.cache_full_blocks(
            request, <list>self._req_to_blocks[request_id], num_cached_blocks, num_full_blocks,
            self.block_size, self.kv_cache_group_id,
        )
        self._gen.value = _next_gen()
        self._num_cached_block[request_id] = num_full_blocks

    cdef int _check_cache_inputs(self, object request, str request_id, Py_ssize_t num_tokens, object hits,
                                 bint attaching, Py_ssize_t total_computed_tokens) except -1:
        # What cache_blocks(request, num_tokens) will read once this
        # allocation is made, checked before it: the cached count is the
        # request's entry, or, for a request taking its hits now (attaching),
        # what add_local_computed_blocks will record.
        cdef PyObject *p = PyDict_GetItem(self._num_cached_block, request_id)
        cdef Py_ssize_t num_cached, skipped
        if p != NULL:
            num_cached = <object>p
        elif attaching:
            skipped = self.get_num_skipped_tokens(total_computed_tokens) // self.block_size
            num_cached = len(hits)
            if skipped > num_cached:
                num_cached = skipped
        else:
            num_cached = 0
        return self.block_pool._check_hashes_to_cache(request, num_cached, num_tokens // self.block_size,
                                                      self.block_size)

    # -------------------------------------------------------------- freeing
    cpdef list pop_blocks_for_free(self, str request_id):
        self._gen.value = _next_gen()
        self._num_cached_block.pop(request_id, None)
        return self._req_to_blocks.pop(request_id, [])

    cpdef free(self, str request_id):
        """Return the request's blocks to the pool, tail first."""
        if not self._free_held(request_id):
            self.pop_blocks_for_free(request_id)  # (holds none: only the bookkeeping)

    cdef bint _free_held(self, str request_id) except -1:
        # free() for a request holding blocks here, with one lookup; False,
        # changing nothing, if it holds none.
        cdef list blocks = self._req_to_blocks.pop(request_id, None)
        if blocks is None:
            return False
        self._gen.value = _next_gen()
        self._num_cached_block.pop(request_id, None)
        blocks.reverse()
        self.block_pool._free_blocks(blocks)
        return True

    cdef int _remove_blocks_in_range(self, str request_id, Py_ssize_t first_block, Py_ssize_t last_block) except -1:
        cdef PyObject* p = PyDict_GetItem(self._req_to_blocks, request_id)
        if p == NULL or first_block >= last_block:
            return 0
        cdef list blocks = _held_list(p)
        if last_block > PyList_GET_SIZE(blocks):
            last_block = PyList_GET_SIZE(blocks)
        cdef KVCacheBlock null = self._null_block
        cdef list freed = []
        cdef Py_ssize_t i
        for i in range(last_block - 1, first_block - 1, -1):
            if blocks[i] is null:
                break
            freed.append(blocks[i])
            blocks[i] = null
        if freed:
            self.block_pool._free_blocks(freed)
        return 0

    cpdef remove_skipped_blocks(self, str request_id, Py_ssize_t processed_computed_tokens):
        """Free the blocks before the attention window, replacing them with the null block."""
        cdef Py_ssize_t num_skipped_tokens = self.get_num_skipped_tokens(processed_computed_tokens)
        if num_skipped_tokens <= 0:
            return
        self._remove_blocks_in_range(request_id, 0, num_skipped_tokens // self.block_size)

    def get_num_common_prefix_blocks(self, running_request_id):
        return 0

    cdef tuple _find_hit(self, object block_hashes, Py_ssize_t max_length, list group_ids,
                         bint drop_eagle_block, Py_ssize_t alignment_tokens):
        raise NotImplementedError

    @classmethod
    def find_longest_cache_hit(cls, block_hashes, max_length, kv_cache_group_ids, block_pool,
                               kv_cache_spec, drop_eagle_block, alignment_tokens):
        """The longest prefix hit common to ``kv_cache_group_ids``: (blocks per group, tokens)."""
        # _find_hit reads the first group's list and the pool unchecked, and divides by the
        # alignment (cdivision: a zero would be SIGFPE).
        if not len(kv_cache_group_ids):
            raise ValueError("kv_cache_group_ids must not be empty")
        if not isinstance(block_pool, BlockPool):
            raise TypeError(f"block_pool must be a BlockPool, got {type(block_pool).__name__}")
        if _check_count("alignment_tokens", alignment_tokens) == 0:
            raise ValueError("alignment_tokens must be positive, got 0")
        group_ids = list(kv_cache_group_ids)
        cdef SingleTypeKVCacheManager probe = cls(kv_cache_spec, block_pool, True, 0,
                                                  alignment_tokens, None)
        return probe._find_hit(block_hashes, max_length, group_ids, drop_eagle_block, alignment_tokens)


cdef int _hits_from_list(BlockHashToBlockMap cache, list hashes, Py_ssize_t max_blocks, uint32_t gid,
                         list out) except -1:
    # Append the blocks cached under hashes[0], hashes[1], ... (group gid)
    # to out, stopping at the first miss or after max_blocks.
    cdef Py_ssize_t i
    cdef PyObject *hp
    cdef PyObject *bp
    for i in range(max_blocks):
        hp = _PyList_GET_ITEM_RAW(hashes, i)
        if Py_TYPE_RAW(hp) != &PyBytes_Type:
            raise TypeError(f"block hashes must be bytes, got {type(<object>hp).__name__}")
        bp = cache._get_raw(hp, gid)
        if bp == NULL:
            break
        out.append(<object>bp)
    return 0


cdef class FullAttentionManager(SingleTypeKVCacheManager):
    """Full attention: every token's KV is kept until the request finishes."""

    cdef tuple _find_hit(self, object block_hashes, Py_ssize_t max_length, list group_ids,
                         bint drop_eagle_block, Py_ssize_t alignment_tokens):
        cdef BlockPool pool = self.block_pool
        cdef Py_ssize_t block_size = self.block_size
        hashes = _resolve(block_hashes, pool.hash_block_size, block_size)
        cdef Py_ssize_t n_groups = len(group_ids)
        cdef Py_ssize_t max_blocks = _num_searchable_blocks(hashes, max_length, block_size)
        cdef Py_ssize_t i, g, n, gid
        cdef list blocks0, cached
        cdef object blk
        cdef tuple computed
        cdef BlockHashToBlockMap cache
        cdef PyObject *hp
        cdef PyObject *bp
        if n_groups == 1:
            blocks0 = []
            gid = group_ids[0]
            if type(hashes) is list and 0 <= gid <= 0xFFFFFFFF:
                _hits_from_list(pool.cached_block_hash_to_block, <list>hashes, max_blocks, <uint32_t>gid, blocks0)
            else:
                for i in range(max_blocks):
                    blk = pool._get_one(hashes[i], gid)
                    if blk is None:
                        break
                    blocks0.append(blk)
            computed = (blocks0,)
        else:
            computed = tuple([[] for _ in range(n_groups)])
            for i in range(max_blocks):
                cached = pool.get_cached_block(hashes[i], group_ids)
                if cached is None:
                    break
                for g in range(n_groups):
                    (<list>computed[g]).append(cached[g])
        n = len(<list>computed[0])
        if drop_eagle_block and n > 0:
            for g in range(n_groups):
                (<list>computed[g]).pop()
            n -= 1
        while block_size != alignment_tokens and (n * block_size) % alignment_tokens != 0:
            for g in range(n_groups):
                (<list>computed[g]).pop()
            n -= 1
        return computed, n * block_size

    def get_num_common_prefix_blocks(self, running_request_id):
        blocks = self._req_to_blocks.get(running_request_id, [])
        num_requests = len(self._req_to_blocks)
        n = 0
        for block in blocks:
            if block.ref_cnt == num_requests:
                n += 1
            else:
                break
        return n


cdef class SlidingWindowManager(SingleTypeKVCacheManager):
    """Sliding-window attention: only the last ``sliding_window`` tokens are attended."""

    cdef readonly Py_ssize_t sliding_window

    def __init__(self, kv_cache_spec, *args, **kwargs):
        super().__init__(kv_cache_spec, *args, **kwargs)
        self.sliding_window = kv_cache_spec.sliding_window

    cdef tuple _find_hit(self, object block_hashes, Py_ssize_t max_length, list group_ids,
                         bint drop_eagle_block, Py_ssize_t alignment_tokens):
        cdef BlockPool pool = self.block_pool
        cdef Py_ssize_t block_size = self.block_size
        hashes = _resolve(block_hashes, pool.hash_block_size, block_size)
        cdef Py_ssize_t needed = _cdiv(self.sliding_window - 1, block_size)
        if drop_eagle_block:
            needed += 1
        cdef Py_ssize_t max_blocks = _num_searchable_blocks(hashes, max_length, block_size)
        cdef Py_ssize_t n_groups = len(group_ids)
        cdef KVCacheBlock null = pool.null_block
        cdef tuple computed = tuple([[null] * max_blocks for _ in range(n_groups)])
        cdef Py_ssize_t contiguous = 0, i, g
        cdef bint found = False
        cdef object cached
        for i in range(max_blocks - 1, -1, -1):
            cached = pool.get_cached_block(hashes[i], group_ids)
            if cached is not None:
                if contiguous == 0 and ((i + 1) * block_size) % alignment_tokens != 0:
                    continue
                for g in range(n_groups):
                    (<list>computed[g])[i] = cached[g]
                contiguous += 1
                if contiguous >= needed:
                    for g in range(n_groups):
                        del (<list>computed[g])[i + contiguous:]
                    found = True
                    break
            else:
                contiguous = 0
        if not found:
            for g in range(n_groups):
                del (<list>computed[g])[contiguous:]
        if drop_eagle_block and len(<list>computed[0]) > 0:
            for g in range(n_groups):
                (<list>computed[g]).pop()
        return computed, len(<list>computed[0]) * block_size

    cpdef Py_ssize_t get_num_skipped_tokens(self, Py_ssize_t num_computed_tokens):
        cdef Py_ssize_t n = num_computed_tokens - self.sliding_window + 1
        return n if n > 0 else 0


cdef class ChunkedLocalAttentionManager(SingleTypeKVCacheManager):
    """Chunked local attention: tokens attend only within their chunk."""

    cdef readonly Py_ssize_t attention_chunk_size

    def __init__(self, kv_cache_spec, *args, **kwargs):
        super().__init__(kv_cache_spec, *args, **kwargs)
        self.attention_chunk_size = kv_cache_spec.attention_chunk_size

    cdef tuple _find_hit(self, object block_hashes, Py_ssize_t max_length, list group_ids,
                         bint drop_eagle_block, Py_ssize_t alignment_tokens):
        if drop_eagle_block:
            raise ValueError("EAGLE is not supported with chunked local attention")
        cdef BlockPool pool = self.block_pool
        cdef Py_ssize_t block_size = self.block_size
        hashes = _resolve(block_hashes, pool.hash_block_size, block_size)
        cdef Py_ssize_t chunk = self.attention_chunk_size
        cdef Py_ssize_t start_block = (max_length // chunk * chunk) // block_size
        cdef Py_ssize_t max_blocks = _num_searchable_blocks(hashes, max_length, block_size)
        cdef Py_ssize_t n_groups = len(group_ids)
        cdef KVCacheBlock null = pool.null_block
        cdef tuple computed = tuple([[null] * start_block for _ in range(n_groups)])
        cdef Py_ssize_t i, g, n
        cdef object cached
        for i in range(start_block, max_blocks):
            cached = pool.get_cached_block(hashes[i], group_ids)
            if cached is None:
                break
            for g in range(n_groups):
                (<list>computed[g]).append(cached[g])
        n = len(<list>computed[0])
        while block_size != alignment_tokens and (n * block_size) % alignment_tokens != 0:
            for g in range(n_groups):
                (<list>computed[g]).pop()
            n -= 1
        return computed, n * block_size

    cpdef Py_ssize_t get_num_skipped_tokens(self, Py_ssize_t num_computed_tokens):
        return (num_computed_tokens // self.attention_chunk_size) * self.attention_chunk_size


cdef class MambaManager(SingleTypeKVCacheManager):
    """Mamba (plain mode): only the state after the last cached block is needed."""

    cdef tuple _find_hit(self, object block_hashes, Py_ssize_t max_length, list group_ids,
                         bint drop_eagle_block, Py_ssize_t alignment_tokens):
        cdef BlockPool pool = self.block_pool
        cdef Py_ssize_t block_size = self.block_size
        hashes = _resolve(block_hashes, pool.hash_block_size, block_size)
        cdef Py_ssize_t max_blocks = _num_searchable_blocks(hashes, max_length, block_size)
        cdef Py_ssize_t n_groups = len(group_ids)
        cdef KVCacheBlock null = pool.null_block
        cdef tuple computed = tuple([[] for _ in range(n_groups)])
        cdef Py_ssize_t i, g
        cdef object cached
        for i in range(max_blocks - 1, -1, -1):
            if ((i + 1) * block_size) % alignment_tokens != 0:
                continue
            cached = pool.get_cached_block(hashes[i], group_ids)
            if cached is not None:
                for g in range(n_groups):
                    (<list>computed[g]).extend([null] * i)
                    (<list>computed[g]).append(cached[g])
                break
        return computed, len(<list>computed[0]) * block_size

    cpdef Py_ssize_t get_num_skipped_tokens(self, Py_ssize_t num_computed_tokens):
        return num_computed_tokens - 1 if num_computed_tokens > 1 else 0


cdef class CrossAttentionManager(SingleTypeKVCacheManager):
    """Cross attention: a static allocation for the encoder tokens; never cached."""

    cdef tuple _find_hit(self, object block_hashes, Py_ssize_t max_length, list group_ids,
                         bint drop_eagle_block, Py_ssize_t alignment_tokens):
        raise ValueError("cross attention does not support prefix caching")

    cpdef cache_blocks(self, request, Py_ssize_t num_tokens):
        return None

    cdef int _check_cache_inputs(self, object request, str request_id, Py_ssize_t num_tokens, object hits,
                                 bint attaching, Py_ssize_t total_computed_tokens) except -1:
        return 0  # (never cached)


spec_manager_map = {
    FullAttentionSpec: FullAttentionManager,
    SlidingWindowSpec: SlidingWindowManager,
    ChunkedLocalAttentionSpec: ChunkedLocalAttentionManager,
    MambaSpec: MambaManager,
    CrossAttentionSpec: CrossAttentionManager,
}


def _manager_class(spec):
    for klass in type(spec).__mro__:
        if klass in spec_manager_map:
            return spec_manager_map[klass]
    raise ValueError(f"no KV-cache manager for spec type {type(spec).__name__}")


def _admission_cap(spec, max_in_flight_tokens, max_model_len):
    if isinstance(spec, (SlidingWindowSpec, ChunkedLocalAttentionSpec)):
        return spec.max_admission_blocks_per_request(max_in_flight_tokens, max_model_len)
    return None


def get_manager_for_kv_cache_spec(kv_cache_spec, block_pool, enable_caching, kv_cache_group_id,
                                  scheduler_block_size, max_in_flight_tokens, max_model_len):
    klass = _manager_class(kv_cache_spec)
    return klass(
        kv_cache_spec,
        block_pool,
        enable_caching,
        kv_cache_group_id,
        scheduler_block_size,
        _admission_cap(kv_cache_spec, max_in_flight_tokens, max_model_len),
    )


# =============================================================================
# Coordinators
# =============================================================================
cdef class KVCacheCoordinator:
    """Drives the single-type managers of all KV-cache groups over one block pool."""

    # All fixed when made (readonly: indexed and divided by without checks).
    cdef readonly object kv_cache_config
    cdef readonly Py_ssize_t max_model_len
    cdef readonly bint enable_caching
    cdef readonly Py_ssize_t scheduler_block_size
    cdef readonly Py_ssize_t hash_block_size
    cdef readonly BlockPool block_pool
    cdef readonly set eagle_group_ids
    cdef readonly tuple single_type_managers
    cdef readonly tuple _cross_attention
    cdef Py_ssize_t _n_managers
    cdef bint _any_cross

    def __init__(self, kv_cache_config, max_model_len, max_in_flight_tokens, use_eagle, enable_caching,
                 enable_kv_cache_events, scheduler_block_size, hash_block_size, use_int_block_hashes=None):
        groups = kv_cache_config.kv_cache_groups
        if scheduler_block_size % hash_block_size != 0 or any(
            scheduler_block_size % g.kv_cache_spec.block_size != 0 for g in groups
        ):
            raise ValueError(
                f"scheduler_block_size ({scheduler_block_size}) must be a multiple of "
                f"hash_block_size ({hash_block_size}) and of every group's block size "
                f"({[g.kv_cache_spec.block_size for g in groups]})"
            )
        self.kv_cache_config = kv_cache_config
        self.max_model_len = max_model_len
        self.enable_caching = enable_caching
        self.scheduler_block_size = scheduler_block_size
        self.hash_block_size = hash_block_size
        self.block_pool = BlockPool(
            kv_cache_config.num_blocks, enable_caching, hash_block_size, enable_kv_cache_events,
            use_int_block_hashes=use_int_block_hashes,
        )
        eagle_ids = {i for i, g in enumerate(groups) if getattr(g, "is_eagle_group", False)}
        if use_eagle and not eagle_ids:
            eagle_ids = set(range(len(groups)))
        self.eagle_group_ids = eagle_ids
        self.single_type_managers = tuple(
            get_manager_for_kv_cache_spec(
                g.kv_cache_spec, self.block_pool, enable_caching, i, scheduler_block_size,
                max_in_flight_tokens, max_model_len,
            )
            for i, g in enumerate(groups)
        )
        self._cross_attention = tuple(isinstance(m, CrossAttentionManager) for m in self.single_type_managers)
        self._n_managers = len(self.single_type_managers)
        self._any_cross = any(self._cross_attention)

    cpdef Py_ssize_t get_num_blocks_to_allocate(
        self, str request_id, Py_ssize_t num_tokens, tuple new_computed_blocks, Py_ssize_t num_encoder_tokens,
        Py_ssize_t total_computed_tokens, Py_ssize_t num_local_computed_tokens,
        Py_ssize_t num_tokens_main_model, bint apply_admission_cap=False,
    ) except -1:
        cdef Py_ssize_t total = 0, i
        cdef SingleTypeKVCacheManager manager
        _check_group_count(new_computed_blocks, self._n_managers)
        for i in range(self._n_managers):
            manager = <SingleTypeKVCacheManager>self.single_type_managers[i]
            if self._any_cross and self._cross_attention[i]:
                total += manager.get_num_blocks_to_allocate(
                    request_id, num_encoder_tokens, (), 0, 0, num_encoder_tokens, apply_admission_cap
                )
            else:
                total += manager.get_num_blocks_to_allocate(
                    request_id, num_tokens, new_computed_blocks[i], total_computed_tokens,
                    num_local_computed_tokens, num_tokens_main_model, apply_admission_cap,
                )
        return total

    cpdef allocate_new_computed_blocks(self, str request_id, tuple new_computed_blocks,
                                       Py_ssize_t num_local_computed_tokens,
                                       Py_ssize_t num_external_computed_tokens):
        """Attach each group's prefix-cache hits (and external-token blocks) to a new request.

        Raises:
            TypeError / RuntimeError: as SingleTypeKVCacheManager.add_local_computed_blocks
            (nothing changes: every group's hits are checked first).
        """
        cdef SingleTypeKVCacheManager manager
        cdef Py_ssize_t i
        _check_group_count(new_computed_blocks, self._n_managers)
        for i in range(self._n_managers):
            (<SingleTypeKVCacheManager>self.single_type_managers[i])._checked_hits(
                new_computed_blocks[i], num_local_computed_tokens + num_external_computed_tokens)
        for manager in self.single_type_managers:
            if request_id in manager._num_cached_block:
                for blocks in new_computed_blocks:
                    if len(blocks):
                        raise RuntimeError(
                            f"request {request_id!r} already holds blocks; it cannot take new prefix-cache hits"
                        )
                return
        for i in range(self._n_managers):
            manager = <SingleTypeKVCacheManager>self.single_type_managers[i]
            manager.add_local_computed_blocks(
                request_id, new_computed_blocks[i], num_local_computed_tokens, num_external_computed_tokens
            )
        if num_external_computed_tokens > 0:
            for manager in self.single_type_managers:
                manager.allocate_external_computed_blocks(
                    request_id, num_local_computed_tokens, num_external_computed_tokens
                )

    cpdef tuple allocate_new_blocks(self, str request_id, Py_ssize_t num_tokens,
                                    Py_ssize_t num_tokens_main_model, Py_ssize_t num_encoder_tokens=0):
        cdef tuple out = self._allocate_new_blocks(request_id, num_tokens, num_encoder_tokens)
        if out is None:
            return tuple([[] for _ in range(self._n_managers)])
        return out

    cdef tuple _allocate_new_blocks(self, str request_id, Py_ssize_t num_tokens, Py_ssize_t num_encoder_tokens):
        # New blocks per group, or None when no group got any.
        cdef Py_ssize_t i
        cdef SingleTypeKVCacheManager manager
        cdef list got
        cdef bint any_new = False
        if self._n_managers == 1 and not self._any_cross:
            manager = <SingleTypeKVCacheManager>self.single_type_managers[0]
            got = manager._allocate_new_blocks(request_id, num_tokens)
            return None if got is None else (got,)
        cdef list out = []
        for i in range(self._n_managers):
            manager = <SingleTypeKVCacheManager>self.single_type_managers[i]
            got = manager._allocate_new_blocks(
                request_id, num_encoder_tokens if self._cross_attention[i] else num_tokens
            )
            if got is None:
                got = []
            else:
                any_new = True
            out.append(got)
        return tuple(out) if any_new else None

    cpdef cache_blocks(self, request, Py_ssize_t num_computed_tokens):
        cdef SingleTypeKVCacheManager manager
        for manager in self.single_type_managers:
            manager.cache_blocks(request, num_computed_tokens)

    cdef Py_ssize_t _tokens_to_cache(self, SingleTypeKVCacheManager manager, Py_ssize_t num_computed_tokens):
        # The num_tokens cache_blocks hands this manager.
        return num_computed_tokens

    cdef int _check_cache_inputs(self, object request, str request_id, Py_ssize_t num_computed_tokens,
                                 tuple new_computed_blocks, bint attaching,
                                 Py_ssize_t total_computed_tokens) except -1:
        # cache_blocks(request, num_computed_tokens) after this allocation,
        # checked for every group before any change.
        cdef Py_ssize_t i
        cdef SingleTypeKVCacheManager manager
        for i in range(self._n_managers):
            manager = <SingleTypeKVCacheManager>self.single_type_managers[i]
            manager._check_cache_inputs(request, request_id, self._tokens_to_cache(manager, num_computed_tokens),
                                        new_computed_blocks[i], attaching, total_computed_tokens)
        return 0

    cpdef free(self, str request_id):
        cdef SingleTypeKVCacheManager manager
        for manager in self.single_type_managers:
            manager.free(request_id)

    def pop_blocks_for_free(self, request_id):
        out = []
        for manager in self.single_type_managers:
            out.extend(manager.pop_blocks_for_free(request_id))
        return out

    def get_num_common_prefix_blocks(self, running_request_id):
        return [m.get_num_common_prefix_blocks(running_request_id) for m in self.single_type_managers]

    cpdef remove_skipped_blocks(self, str request_id, Py_ssize_t processed_computed_tokens):
        cdef SingleTypeKVCacheManager manager
        for manager in self.single_type_managers:
            manager.remove_skipped_blocks(request_id, processed_computed_tokens)

    def get_blocks(self, request_id):
        cdef SingleTypeKVCacheManager m
        return tuple([m._req_to_blocks.get(request_id) or [] for m in self.single_type_managers])

    cpdef bint holds(self, str request_id):
        """Whether the request holds blocks (had a successful allocation since its last free)."""
        cdef SingleTypeKVCacheManager manager
        for manager in self.single_type_managers:
            if request_id in manager._req_to_blocks:
                return True
        return False

    cpdef tuple find_longest_cache_hit(self, object block_hashes, Py_ssize_t max_cache_hit_length):
        raise NotImplementedError


cdef class KVCacheCoordinatorNoPrefixCache(KVCacheCoordinator):
    """Coordinator for prefix caching off: any number of groups, never a hit."""

    cdef readonly Py_ssize_t num_single_type_manager

    def __init__(self, kv_cache_config, max_model_len, max_in_flight_tokens, use_eagle,
                 enable_kv_cache_events, scheduler_block_size, hash_block_size, use_int_block_hashes=None):
        super().__init__(kv_cache_config, max_model_len, max_in_flight_tokens, use_eagle, False,
                         enable_kv_cache_events, scheduler_block_size, hash_block_size, use_int_block_hashes)
        self.num_single_type_manager = len(self.single_type_managers)

    def get_num_common_prefix_blocks(self, running_request_id):
        return [0] * self.num_single_type_manager

    cpdef tuple find_longest_cache_hit(self, object block_hashes, Py_ssize_t max_cache_hit_length):
        return tuple([[] for _ in range(self.num_single_type_manager)]), 0, 0


cdef class UnitaryKVCacheCoordinator(KVCacheCoordinator):
    """Coordinator for exactly one KV-cache group with prefix caching on."""

    cdef readonly object kv_cache_spec
    cdef readonly Py_ssize_t block_size
    cdef readonly bint use_eagle
    cdef SingleTypeKVCacheManager _manager
    cdef list _group_ids

    def __init__(self, kv_cache_config, max_model_len, max_in_flight_tokens, use_eagle, enable_caching,
                 enable_kv_cache_events, scheduler_block_size, hash_block_size, use_int_block_hashes=None):
        super().__init__(kv_cache_config, max_model_len, max_in_flight_tokens, use_eagle, enable_caching,
                         enable_kv_cache_events, scheduler_block_size, hash_block_size, use_int_block_hashes)
        if len(kv_cache_config.kv_cache_groups) != 1:
            raise ValueError("UnitaryKVCacheCoordinator assumes only one kv cache group")
        self.kv_cache_spec = kv_cache_config.kv_cache_groups[0].kv_cache_spec
        self._manager = <SingleTypeKVCacheManager>self.single_type_managers[0]
        self.block_size = self._manager.block_size
        if enable_caching and hash_block_size != self.block_size:
            raise ValueError(
                "UnitaryKVCacheCoordinator assumes hash_block_size == block_size "
                f"(got hash_block_size={hash_block_size}, block_size={self.block_size})"
            )
        self.use_eagle = 0 in self.eagle_group_ids
        self._manager.use_eagle = self.use_eagle
        self._group_ids = [0]
        if self.use_eagle and isinstance(self.kv_cache_spec, ChunkedLocalAttentionSpec):
            raise ValueError("Hybrid KV cache is not supported for eagle + chunked local attention.")

    cpdef tuple find_longest_cache_hit(self, object block_hashes, Py_ssize_t max_cache_hit_length):
        cdef tuple res = self._manager._find_hit(block_hashes, max_cache_hit_length, self._group_ids,
                                                 self.use_eagle, self.block_size)
        return res[0], res[1], 0


cdef class HybridKVCacheCoordinator(KVCacheCoordinator):
    """Coordinator for several KV-cache groups (e.g. full + sliding window).

    Groups with equal specs are looked up together; full attention goes first
    (its left-to-right scan bounds the others), and the candidate length is
    shrunk until every group accepts it.
    """

    cdef readonly list attention_groups
    cdef bint _is_simple_hybrid

    def __init__(self, kv_cache_config, max_model_len, max_in_flight_tokens, use_eagle, enable_caching,
                 enable_kv_cache_events, scheduler_block_size, hash_block_size, use_int_block_hashes=None):
        super().__init__(kv_cache_config, max_model_len, max_in_flight_tokens, use_eagle, enable_caching,
                         enable_kv_cache_events, scheduler_block_size, hash_block_size, use_int_block_hashes)
        for manager in self.single_type_managers:
            if manager.block_size % hash_block_size != 0:
                raise ValueError(
                    f"every group's block size must be a multiple of hash_block_size "
                    f"({hash_block_size}); got {manager.block_size}"
                )
        if self.eagle_group_ids and any(
            isinstance(g.kv_cache_spec, ChunkedLocalAttentionSpec) for g in kv_cache_config.kv_cache_groups
        ):
            raise ValueError("Hybrid KV cache is not supported for eagle + chunked local attention.")
        self.verify_and_split_kv_cache_groups()

    def verify_and_split_kv_cache_groups(self):
        """Batch groups with identical specs; full attention first."""
        groups = []
        for i, g in enumerate(self.kv_cache_config.kv_cache_groups):
            spec = g.kv_cache_spec
            if isinstance(spec, CrossAttentionSpec):
                continue
            klass = type(self.single_type_managers[i])
            use_eagle = i in self.eagle_group_ids
            for entry in groups:
                if entry[0] == spec:
                    entry[1].append(i)
                    entry[3] = entry[3] or use_eagle
                    break
            else:
                groups.append([spec, [i], klass, use_eagle])
        if not groups:
            raise ValueError("HybridKVCacheCoordinator requires at least one cacheable group")
        groups.sort(key=lambda e: not isinstance(e[0], FullAttentionSpec))
        self.attention_groups = [tuple(e) for e in groups]
        for spec, ids, klass, use_eagle in self.attention_groups:
            if use_eagle:
                for gid in ids:
                    self.single_type_managers[gid].use_eagle = True
        self._is_simple_hybrid = len(groups) == 2 and isinstance(groups[0][0], FullAttentionSpec)

    cpdef cache_blocks(self, request, Py_ssize_t num_computed_tokens):
        cdef Py_ssize_t aligned = num_computed_tokens // self.scheduler_block_size * self.scheduler_block_size
        cdef Py_ssize_t n
        cdef SingleTypeKVCacheManager manager
        for manager in self.single_type_managers:
            n = aligned
            if manager.use_eagle and aligned > 0:
                n = min(num_computed_tokens, aligned + manager.block_size)
            manager.cache_blocks(request, n)

    cdef Py_ssize_t _tokens_to_cache(self, SingleTypeKVCacheManager manager, Py_ssize_t num_computed_tokens):
        cdef Py_ssize_t aligned = num_computed_tokens // self.scheduler_block_size * self.scheduler_block_size
        if manager.use_eagle and aligned > 0:
            return min(num_computed_tokens, aligned + manager.block_size)
        return aligned

    cpdef tuple find_longest_cache_hit(self, object block_hashes, Py_ssize_t max_cache_hit_length):
        cdef Py_ssize_t num_groups = len(self.kv_cache_config.kv_cache_groups)
        cdef Py_ssize_t hit_length = max_cache_hit_length
        cdef Py_ssize_t longest = 0, curr, max_len, new_len, first, idx, n
        cdef list blocks_by_group = [None] * num_groups
        cdef list length_by_group = [0] * num_groups
        cdef Py_ssize_t alignment = self.scheduler_block_size
        cdef set eagle_verified = set()
        cdef tuple managers = self.single_type_managers
        cdef SingleTypeKVCacheManager first_manager
        cdef bint drop, is_full
        cdef tuple res
        while True:
            curr = hit_length
            for idx in range(len(self.attention_groups)):
                spec, group_ids, klass, use_eagle = self.attention_groups[idx]
                first = group_ids[0]
                is_full = isinstance(spec, FullAttentionSpec)
                if is_full and blocks_by_group[first] is not None:
                    if <Py_ssize_t>length_by_group[first] < curr:
                        curr = length_by_group[first]
                    continue
                drop = use_eagle and idx not in eagle_verified
                max_len = curr
                first_manager = <SingleTypeKVCacheManager>managers[first]
                if drop and not isinstance(spec, MambaSpec):
                    max_len = min(curr + first_manager.block_size, max_cache_hit_length)
                res = first_manager._find_hit(block_hashes, max_len, group_ids, drop, alignment)
                new_len = res[1]
                if drop:
                    eagle_verified.add(idx)
                elif new_len < curr:
                    eagle_verified.clear()
                curr = new_len
                for gid, blks in zip(group_ids, res[0]):
                    blocks_by_group[gid] = blks
                    length_by_group[gid] = new_len
                if curr > longest:
                    longest = curr
            if curr >= hit_length:
                break
            hit_length = curr
            if self._is_simple_hybrid:
                break
        for spec, group_ids, klass, use_eagle in self.attention_groups:
            if not isinstance(spec, FullAttentionSpec):
                continue
            n = _cdiv(hit_length, (<SingleTypeKVCacheManager>managers[group_ids[0]]).block_size)
            for gid in group_ids:
                blks = blocks_by_group[gid]
                if blks is not None:
                    del blks[n:]
                    length_by_group[gid] = hit_length
        blocks = tuple([b if b is not None else [] for b in blocks_by_group])
        return blocks, hit_length, longest - hit_length


def get_kv_cache_coordinator(kv_cache_config, max_model_len, max_in_flight_tokens, use_eagle, enable_caching,
                             enable_kv_cache_events, scheduler_block_size, hash_block_size,
                             use_int_block_hashes=None):
    if not enable_caching:
        return KVCacheCoordinatorNoPrefixCache(
            kv_cache_config, max_model_len, max_in_flight_tokens, use_eagle,
            enable_kv_cache_events, scheduler_block_size, hash_block_size, use_int_block_hashes,
        )
    if len(kv_cache_config.kv_cache_groups) == 1:
        return UnitaryKVCacheCoordinator(
            kv_cache_config, max_model_len, max_in_flight_tokens, use_eagle, enable_caching,
            enable_kv_cache_events, scheduler_block_size, hash_block_size, use_int_block_hashes,
        )
    return HybridKVCacheCoordinator(
        kv_cache_config, max_model_len, max_in_flight_tokens, use_eagle, enable_caching,
        enable_kv_cache_events, scheduler_block_size, hash_block_size, use_int_block_hashes,
    )


# =============================================================================
# KVCacheBlocks and the manager
# =============================================================================
@cython.freelist(32)
cdef class KVCacheBlocks:
    """Blocks per KV-cache group: what allocate_slots / get_computed_blocks return.

    ``blocks[i][j]`` is the j-th block of group i.
    """

    cdef public tuple blocks

    def __init__(self, tuple blocks):
        self.blocks = blocks

    def __add__(self, KVCacheBlocks other):
        return KVCacheBlocks(tuple([list(a) + list(b) for a, b in zip(self.blocks, other.blocks)]))

    def __eq__(self, other):
        if not isinstance(other, KVCacheBlocks):
            return NotImplemented
        return self.get_block_ids() == other.get_block_ids()

    __hash__ = None

    def get_block_ids(self, allow_none=False):
        """Block ids per group (``None`` with ``allow_none`` when there are none)."""
        cdef object group
        cdef KVCacheBlock blk
        if allow_none and all(len(g) == 0 for g in self.blocks):
            return None
        out = []
        for group in self.blocks:
            out.append([blk.block_id for blk in group])
        return tuple(out)

    def get_unhashed_block_ids(self):
        if len(self.blocks) != 1:
            raise ValueError("get_unhashed_block_ids supports exactly one group")
        return [b.block_id for b in self.blocks[0] if b.block_hash is None]

    def new_empty(self):
        return KVCacheBlocks(tuple([() for _ in range(len(self.blocks))]))

    def __repr__(self):
        return f"KVCacheBlocks({self.get_block_ids()})"


cdef inline KVCacheBlocks _one_group(list blocks):
    # KVCacheBlocks((blocks,)) without a call through the type.
    cdef KVCacheBlocks out = KVCacheBlocks.__new__(KVCacheBlocks)
    out.blocks = (blocks,)
    return out


cdef inline Py_ssize_t _blocks_needed(Py_ssize_t n_tokens, Py_ssize_t block_size, Py_ssize_t have,
                                      bint first, Py_ssize_t n_hits, Py_ssize_t n_evictable) noexcept:
    # Blocks one full-attention group takes from the free pool to hold
    # n_tokens (get_num_blocks_to_allocate): a request that holds `have`
    # blocks needs the rest; on its first allocation (nothing cached yet) its
    # hits count as held, and the free ones among them are taken too.
    cdef Py_ssize_t needed = _cdiv(n_tokens, block_size) - have
    if first:
        needed -= n_hits
        if needed < 0:
            needed = 0
        return needed + n_evictable
    return needed if needed > 0 else 0


cdef list _check_hit_blocks(object blocks, Py_ssize_t *n_evictable=NULL, FreeKVCacheBlockQueue queue=None,
                            list pool_blocks=None):
    # Blocks to touch (prefix-cache hits) as a list, checked before any
    # change: every one a KVCacheBlock (the manager reads their C fields), or
    # TypeError; with pool_blocks (a pool's blocks), every one that pool's, or
    # RuntimeError (a hit from another pool would take a reference there);
    # with a queue, every free one (ref_cnt 0, not null) in it, or
    # RuntimeError (touch() would fail half-way).  n_evictable, if given,
    # receives how many are free: touching them takes them out of the pool.
    cdef list out = blocks if type(blocks) is list else list(blocks)
    cdef Py_ssize_t i, n_free = 0, bid
    cdef PyObject *bp
    for i in range(PyList_GET_SIZE(out)):
        bp = _PyList_GET_ITEM_RAW(out, i)
        if not _is_block(bp):
            raise TypeError(f"blocks must be KVCacheBlock, got {type(<object>bp).__name__}")
        if pool_blocks is not None:
            bid = (<KVCacheBlock>bp).block_id
            if not (0 <= bid < PyList_GET_SIZE(pool_blocks) and _PyList_GET_ITEM_RAW(pool_blocks, bid) == bp):
                raise RuntimeError(f"block {bid} is not a block of this pool (a hit from another manager?)")
        if (<KVCacheBlock>bp)._ref_cnt == 0 and not (<KVCacheBlock>bp).is_null:
            if queue is not None and not queue._holds(<KVCacheBlock>bp):
                raise RuntimeError(f"remove() called on an invalid block: {<object>bp}")
            n_free += 1
    if n_evictable != NULL:
        n_evictable[0] = n_free
    return out


cdef class KVCacheManager:
    """The KV-cache manager a scheduler drives: vLLM 0.33.0's constructor and methods.

    Args:
        kv_cache_config: blocks and KV-cache groups.
        max_model_len: the longest sequence; slot requests are capped at it.
        scheduler_block_size: scheduling granularity (LCM of the groups' block sizes).
        hash_block_size: the block size request hashes are computed at.
        max_in_flight_tokens: tokens scheduled but not yet settled (sizes the
            sliding-window / chunked admission cap); defaults to max_model_len.
        enable_caching: prefix caching on or off.
        use_eagle: drop the last hit block (EAGLE needs its hidden states).
        log_stats: keep PrefixCacheStats (``make_prefix_cache_stats``).
        enable_kv_cache_events: queue KV events (``take_events``).
        watermark: fraction of all blocks kept free when admitting
            waiting / preempted requests while others are scheduled.
        use_int_block_hashes: publish event hashes as 64-bit ints (default:
            ``VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES``).
    """

    # Fixed when made (readonly); the collector, the stats object and the
    # watermark are free (checked where they are read, or harmless).
    cdef readonly Py_ssize_t max_model_len
    cdef readonly bint enable_caching
    cdef readonly bint enable_kv_cache_events
    cdef readonly bint use_eagle
    cdef readonly bint log_stats
    cdef public object metrics_collector
    cdef public object prefix_cache_stats
    cdef readonly KVCacheCoordinator coordinator
    cdef readonly Py_ssize_t num_kv_cache_groups
    cdef readonly BlockPool block_pool
    cdef readonly object kv_cache_config
    cdef public Py_ssize_t watermark_blocks
    cdef readonly tuple kv_cache_event_metadata
    cdef readonly KVCacheBlocks empty_kv_cache_blocks
    cdef readonly tuple _group_block_sizes
    cdef tuple _no_blocks  # no block per group: what allocate_slots works with when there are no hits
    cdef FullAttentionManager _full  # the only manager, when it is plain full attention: the decode fast path
    cdef bint _full_lookup_ok  # ... and get_computed_blocks needs no stats, events, EAGLE or coarser hashes
    cdef dict __dict__

    def __init__(self, kv_cache_config, max_model_len, scheduler_block_size, hash_block_size,
                 max_in_flight_tokens=None, enable_caching=True, use_eagle=False, log_stats=False,
                 enable_kv_cache_events=False, dcp_world_size=1, pcp_world_size=1, metrics_collector=None,
                 watermark=0.0, use_int_block_hashes=None):
        for name, value in (("max_model_len", max_model_len), ("scheduler_block_size", scheduler_block_size),
                            ("hash_block_size", hash_block_size)):
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ValueError(f"{name} must be a positive int, got {value!r}")
        if dcp_world_size != 1 or pcp_world_size != 1:
            raise ValueError("decode/prefill context parallelism is not supported (dcp/pcp world size must be 1)")
        if not 0.0 <= float(watermark) < 1.0:
            raise ValueError(f"watermark must be in [0, 1), got {watermark!r}")
        if max_in_flight_tokens is None:
            max_in_flight_tokens = max_model_len
        if not kv_cache_config.kv_cache_groups and enable_caching:
            enable_caching = False
        self.max_model_len = max_model_len
        self.enable_caching = bool(enable_caching)
        self.enable_kv_cache_events = bool(enable_kv_cache_events)
        self.use_eagle = bool(use_eagle)
        self.log_stats = bool(log_stats)
        self.metrics_collector = metrics_collector
        self.prefix_cache_stats = PrefixCacheStats() if log_stats else None
        self.coordinator = get_kv_cache_coordinator(
            kv_cache_config, max_model_len, max_in_flight_tokens, self.use_eagle,
            self.enable_caching, self.enable_kv_cache_events, scheduler_block_size,
            hash_block_size, use_int_block_hashes,
        )
        self.num_kv_cache_groups = len(kv_cache_config.kv_cache_groups)
        self.block_pool = self.coordinator.block_pool
        self.kv_cache_config = kv_cache_config
        self.watermark_blocks = int(watermark * kv_cache_config.num_blocks)
        self.kv_cache_event_metadata = tuple(
            (get_kv_cache_spec_kind(g.kv_cache_spec).value, get_kv_cache_spec_sliding_window(g.kv_cache_spec))
            for g in kv_cache_config.kv_cache_groups
        )
        self.empty_kv_cache_blocks = KVCacheBlocks(tuple([() for _ in range(self.num_kv_cache_groups)]))
        # (not empty_kv_cache_blocks.blocks: callers get that object from get_computed_blocks
        # and may reassign its blocks; allocate_slots indexes this one per group unchecked)
        self._no_blocks = self.empty_kv_cache_blocks.blocks
        self._group_block_sizes = tuple(g.kv_cache_spec.block_size for g in kv_cache_config.kv_cache_groups)
        managers = self.coordinator.single_type_managers
        self._full = None
        if len(managers) == 1 and type(managers[0]) is FullAttentionManager:
            self._full = <FullAttentionManager>managers[0]
        self._full_lookup_ok = (
            self._full is not None and self.enable_caching and not self.log_stats
            and not self.enable_kv_cache_events and type(self.coordinator) is UnitaryKVCacheCoordinator
            and not (<UnitaryKVCacheCoordinator>self.coordinator).use_eagle
            and self._full.block_size == self.block_pool.hash_block_size
        )

    # ------------------------------------------------------------------ info
    @property
    def usage(self):
        """Fraction of usable blocks in use."""
        return self.block_pool.get_usage()

    def make_prefix_cache_stats(self):
        """Take the stats gathered since the last call (None unless log_stats)."""
        if not self.log_stats:
            return None
        stats = self.prefix_cache_stats
        self.prefix_cache_stats = PrefixCacheStats()
        return stats

    cpdef KVCacheBlocks create_kv_cache_blocks(self, tuple blocks):
        cdef object g
        for g in blocks:
            if g:
                return KVCacheBlocks(blocks)
        return self.empty_kv_cache_blocks

    # ------------------------------------------------------------------ lookups
    def get_computed_blocks(self, request):
        """The longest prefix-cache hit for a request; changes no reference counts.

        Returns:
            ``(blocks, num_computed_tokens, shared_prefix_boundary)``.  The hit
            never covers the request's last token.
        """
        if self._full_lookup_ok and type(request) is Request:
            return self._full_lookup(<Request>request)
        return self._general_lookup(request)

    cdef object _general_lookup(self, request):
        cdef bint skip
        if not self.enable_caching:
            return self.empty_kv_cache_blocks, 0, 0
        if type(request) is Request:
            skip = (<Request>request).skip_reading_prefix_cache
        else:
            try:
                skip = request.skip_reading_prefix_cache
            except AttributeError:
                raise TypeError(f"expected a Request, got {type(request).__name__}") from None
        if skip:
            return self.empty_kv_cache_blocks, 0, 0
        cdef Py_ssize_t max_cache_hit_length = _num_tokens(request) - 1
        cdef tuple res = self.coordinator.find_longest_cache_hit(_block_hashes_of(request), max_cache_hit_length)
        cdef tuple computed_blocks = res[0]
        cdef Py_ssize_t num_new_computed_tokens = res[1]
        cdef Py_ssize_t num_uncached = res[2]
        if self.log_stats:
            self.prefix_cache_stats.record(
                num_tokens=_num_tokens(request),
                num_hits=num_new_computed_tokens,
                preempted=request.num_preemptions > 0,
            )
        if (
            num_new_computed_tokens > 0
            and self.enable_kv_cache_events
            and request.kv_cache_report_mode == "full"
        ):
            for group_idx, group_blocks in enumerate(computed_blocks):
                if group_blocks:
                    self.block_pool.emit_cached_block_events(
                        request, len(group_blocks), self._group_block_sizes[group_idx], group_idx
                    )
        boundary = num_new_computed_tokens + num_uncached if num_uncached else 0
        return self.create_kv_cache_blocks(computed_blocks), num_new_computed_tokens, boundary

    cdef object _full_lookup(self, Request request):
        # get_computed_blocks for one plain full-attention group with no
        # stats, events or EAGLE: the same search without the coordinator's
        # layers and tuples.
        if request.skip_reading_prefix_cache:
            return self.empty_kv_cache_blocks, 0, 0
        cdef FullAttentionManager mgr = self._full
        cdef object hashes = request._block_hashes
        if type(hashes) is not list or mgr.kv_cache_group_id > 0xFFFFFFFF:
            return self._general_lookup(request)
        cdef Py_ssize_t max_blocks = _num_searchable_blocks(
            hashes, PyList_GET_SIZE(request._all_token_ids) - 1, mgr.block_size)
        cdef list hits = []
        _hits_from_list(self.block_pool.cached_block_hash_to_block, <list>hashes, max_blocks,
                        <uint32_t>mgr.kv_cache_group_id, hits)
        if not hits:
            return self.empty_kv_cache_blocks, 0, 0
        return _one_group(hits), PyList_GET_SIZE(hits) * mgr.block_size, 0

    # ------------------------------------------------------------------ allocation
    def allocate_slots(self, request, num_new_tokens, num_new_computed_tokens=0, new_computed_blocks=None,
                       num_lookahead_tokens=0, num_external_computed_tokens=0, delay_cache_blocks=False,
                       num_encoder_tokens=0, full_sequence_must_fit=False, reserved_blocks=0,
                       has_scheduled_reqs=True):
        """Add slots for ``num_new_tokens`` (+ lookahead) tokens of a request.

        Returns the newly allocated blocks per group, or ``None`` -- with
        nothing allocated or touched -- when the pool cannot hold them.

        Raises:
            ValueError: a negative count; no tokens at all; prefix hits handed
                to a running request.  (Tokens past ``max_model_len`` are not an
                error: the counts are clamped to it, as in vLLM.)
            TypeError: a count that is not an int.
        """
        cdef Py_ssize_t n_new = _check_count("num_new_tokens", num_new_tokens)
        # (Defaults left as they are -- the interned 0 -- need no checking.)
        cdef Py_ssize_t n_new_comp = (
            0 if num_new_computed_tokens is _ZERO
            else _check_count("num_new_computed_tokens", num_new_computed_tokens)
        )
        cdef Py_ssize_t n_look = (
            0 if num_lookahead_tokens is _ZERO else _check_count("num_lookahead_tokens", num_lookahead_tokens)
        )
        cdef Py_ssize_t n_ext = (
            0 if num_external_computed_tokens is _ZERO
            else _check_count("num_external_computed_tokens", num_external_computed_tokens)
        )
        cdef Py_ssize_t n_enc = (
            0 if num_encoder_tokens is _ZERO else _check_count("num_encoder_tokens", num_encoder_tokens)
        )
        cdef Py_ssize_t n_reserved = (
            0 if reserved_blocks is _ZERO else _check_count("reserved_blocks", reserved_blocks)
        )
        if n_new == 0 and n_new_comp == 0 and n_ext == 0:
            raise ValueError(
                "num_new_tokens must be greater than 0 when there are no new computed or external computed tokens"
            )
        cdef tuple hit_groups
        if self._full is not None and n_ext == 0 and type(request) is Request:
            if new_computed_blocks is None:
                return self._full_slots(<Request>request, n_new, n_new_comp, None, n_look, n_reserved,
                                        delay_cache_blocks, has_scheduled_reqs, full_sequence_must_fit)
            if type(new_computed_blocks) is KVCacheBlocks:
                hit_groups = (<KVCacheBlocks>new_computed_blocks).blocks
                # (Hits in a list or tuple only: reading any other sequence
                # runs its code, which could change the manager under the
                # fast path's record.)
                if (hit_groups is not None and PyTuple_GET_SIZE(hit_groups) == 1
                        and (type(hit_groups[0]) is list or type(hit_groups[0]) is tuple)):
                    return self._full_slots(<Request>request, n_new, n_new_comp, hit_groups[0], n_look,
                                            n_reserved, delay_cache_blocks, has_scheduled_reqs,
                                            full_sequence_must_fit)
        cdef str request_id
        cdef Py_ssize_t num_computed, num_in_flight
        cdef object status
        if type(request) is Request:
            request_id = (<Request>request).request_id
            num_computed = (<Request>request)._num_computed_tokens
            num_in_flight = (<Request>request)._num_in_flight_tokens
            status = (<Request>request).status
        else:
            request_id = _rid(request)
            num_computed = request.num_computed_tokens
            num_in_flight = request.num_in_flight_tokens
            status = request.status
        cdef Py_ssize_t num_local_computed_tokens = num_computed + n_new_comp
        cdef tuple new_blocks_list
        cdef bint has_new_computed
        cdef KVCacheCoordinator coordinator = self.coordinator
        cdef object g
        if new_computed_blocks is None:
            new_blocks_list = self._no_blocks
            has_new_computed = False
        else:
            new_blocks_list = (<KVCacheBlocks?>new_computed_blocks).blocks
            has_new_computed = False
            for g in new_blocks_list:
                if g:
                    has_new_computed = True
                    break
            if not has_new_computed:
                new_blocks_list = self._no_blocks
            else:
                if len(new_blocks_list) != self.num_kv_cache_groups:
                    raise ValueError(
                        f"new_computed_blocks has {len(new_blocks_list)} groups, the manager has "
                        f"{self.num_kv_cache_groups}"
                    )
                if coordinator.holds(request_id):
                    raise ValueError(
                        f"request {request_id!r} already holds blocks; new_computed_blocks is only for "
                        "a request's first allocation"
                    )
                for g in new_blocks_list:
                    _check_hit_blocks(g, NULL, None, self.block_pool.blocks)

        cdef Py_ssize_t total_computed_tokens = num_local_computed_tokens + n_ext
        if total_computed_tokens > self.max_model_len:
            total_computed_tokens = self.max_model_len
        cdef Py_ssize_t watermark_blocks = 0
        if has_scheduled_reqs and _watermarked(status):
            watermark_blocks = self.watermark_blocks
        cdef Py_ssize_t needed, full_num_tokens
        if full_sequence_must_fit:
            full_num_tokens = _num_tokens(request)
            if full_num_tokens > self.max_model_len:
                full_num_tokens = self.max_model_len
            needed = coordinator.get_num_blocks_to_allocate(
                request_id, full_num_tokens, new_blocks_list, n_enc,
                total_computed_tokens, num_local_computed_tokens, full_num_tokens, True,
            )
            if needed + watermark_blocks > self.block_pool.free_block_queue.num_free_blocks:
                return None

        cdef Py_ssize_t num_tokens_main_model = total_computed_tokens + n_new
        cdef Py_ssize_t num_tokens_need_slot = num_tokens_main_model + n_look
        if num_tokens_need_slot > self.max_model_len:
            num_tokens_need_slot = self.max_model_len
        cdef Py_ssize_t n_cache, req_tokens
        if self.enable_caching and not delay_cache_blocks:  # (what caching reads, before any change)
            n_cache = total_computed_tokens + n_new
            req_tokens = _num_tokens(request)
            coordinator._check_cache_inputs(request, request_id, n_cache if n_cache < req_tokens else req_tokens,
                                            new_blocks_list, has_new_computed or n_ext > 0,
                                            num_local_computed_tokens + n_ext)
        cdef Py_ssize_t processed = total_computed_tokens - num_in_flight
        coordinator.remove_skipped_blocks(request_id, processed if processed > 0 else 0)
        needed = coordinator.get_num_blocks_to_allocate(
            request_id, num_tokens_need_slot, new_blocks_list, n_enc,
            num_local_computed_tokens + n_ext, num_local_computed_tokens, num_tokens_main_model, False,
        )
        if needed + watermark_blocks > self.block_pool.free_block_queue.num_free_blocks - n_reserved:
            return None
        if has_new_computed or n_ext > 0:
            coordinator.allocate_new_computed_blocks(
                request_id, new_blocks_list, num_local_computed_tokens, n_ext
            )
        cdef tuple new_blocks = coordinator._allocate_new_blocks(request_id, num_tokens_need_slot, n_enc)
        if self.enable_caching and not delay_cache_blocks:
            n_cache = total_computed_tokens + n_new
            req_tokens = _num_tokens(request)
            coordinator.cache_blocks(request, n_cache if n_cache < req_tokens else req_tokens)
        if new_blocks is None:
            return self.empty_kv_cache_blocks
        return self.create_kv_cache_blocks(new_blocks)

    cdef object _full_slots(self, Request request, Py_ssize_t n_new, Py_ssize_t n_new_comp, object hits,
                            Py_ssize_t n_look, Py_ssize_t n_reserved, bint delay_cache_blocks,
                            bint has_scheduled_reqs, bint full_sequence_must_fit):
        # allocate_slots for one plain full-attention group and no external
        # tokens -- admissions with their prefix hits, prefill chunks, decode
        # steps: the general path with its no-op layers for this case (skipped
        # blocks, admission cap, per-group loops) left out and each dict read
        # at most once.  Same decisions, same errors, in the same order.
        # hits: the group's new computed blocks (a sequence), or None.
        cdef str request_id = request.request_id
        cdef Py_ssize_t num_computed = request._num_computed_tokens
        cdef Py_ssize_t num_local = num_computed + n_new_comp
        cdef FullAttentionManager mgr = self._full
        cdef BlockPool pool = self.block_pool
        cdef PyObject *p
        cdef bint fresh = False  # the record was read in this call
        if (request._kv_owner != <PyObject*>mgr or request._kv_gen != mgr._gen.value
                or request._kv_blocks is None):
            # Remember the manager's entries for this request.  The record
            # stays valid until the manager's _gen moves on (a removal, or any
            # change outside this path), with two exceptions this path checks
            # itself: "no entry" is always re-read, and so is the cached count
            # before caching (another Request object with the same id may have
            # added or advanced them here).
            p = PyDict_GetItem(mgr._req_to_blocks, request_id)
            request._kv_blocks = _held_list(p)
            p = PyDict_GetItem(mgr._num_cached_block, request_id)
            request._kv_ncached = -1 if p == NULL else <Py_ssize_t><object>p
            request._kv_owner = <PyObject*>mgr
            request._kv_gen = mgr._gen.value
            # (Up to the caching below only this call writes the manager's
            # dicts: touching and allocating run no code that could.)
            fresh = True
        cdef list req_blocks = request._kv_blocks
        cdef Py_ssize_t have = 0 if req_blocks is None else PyList_GET_SIZE(req_blocks)
        # The hits: every one a block (checked before any change), the free
        # ones counted (touching them takes them out of the free pool).
        cdef Py_ssize_t i, n_hits = 0, n_evictable = 0
        cdef list hit_list = None
        cdef PyObject *bp
        if hits is not None:
            n_hits = len(hits)
        if n_hits > 0:
            if req_blocks is not None:
                raise ValueError(
                    f"request {request_id!r} already holds blocks; new_computed_blocks is only for "
                    "a request's first allocation"
                )
            hit_list = _check_hit_blocks(hits, &n_evictable, pool.free_block_queue if mgr.enable_caching else None,
                                         pool.blocks)
            n_hits = PyList_GET_SIZE(hit_list)
        cdef Py_ssize_t total_computed = num_local if num_local < self.max_model_len else self.max_model_len
        cdef Py_ssize_t watermark_blocks = 0
        cdef object status = request.status
        if has_scheduled_reqs and _watermarked(status):
            watermark_blocks = self.watermark_blocks
        cdef Py_ssize_t n_full_tokens, needed
        cdef Py_ssize_t bs = mgr.block_size
        if full_sequence_must_fit:
            n_full_tokens = PyList_GET_SIZE(request._all_token_ids)
            if n_full_tokens > self.max_model_len:
                n_full_tokens = self.max_model_len
            needed = _blocks_needed(n_full_tokens, bs, have, request._kv_ncached < 0, n_hits, n_evictable)
            if needed + watermark_blocks > pool.free_block_queue.num_free_blocks:
                return None
        cdef Py_ssize_t need_slot = total_computed + n_new + n_look
        if need_slot > self.max_model_len:
            need_slot = self.max_model_len
        needed = _blocks_needed(need_slot, bs, have, request._kv_ncached < 0, n_hits, n_evictable)
        if needed + watermark_blocks > pool.free_block_queue.num_free_blocks - n_reserved:
            return None
        cdef Py_ssize_t n_cache, req_tokens, num_full, num_cached
        if self.enable_caching and not delay_cache_blocks:
            # What the caching below reads of the request's hashes, checked now.
            n_cache = total_computed + n_new
            req_tokens = PyList_GET_SIZE(request._all_token_ids)
            if n_cache > req_tokens:
                n_cache = req_tokens
            num_full = n_cache // bs
            if request._kv_ncached < num_full:
                if n_hits > 0:
                    num_cached = n_hits
                else:
                    p = PyDict_GetItem(mgr._num_cached_block, request_id)
                    num_cached = 0 if p == NULL else <Py_ssize_t><object>p
                pool._check_hashes_to_cache(request, num_cached, num_full, bs)
        # From here on nothing can fail but a broken invariant.
        if n_hits > 0:
            if request._kv_ncached >= 0:
                raise RuntimeError(
                    f"request {request_id!r} already holds blocks; it cannot take new prefix-cache hits"
                )
            req_blocks = PyList_New(n_hits)  # hit_list's blocks, touched on the way in
            for i in range(n_hits):
                bp = _PyList_GET_ITEM_RAW(hit_list, i)
                Py_INCREF_RAW(bp)
                (<PyListObject*>req_blocks).ob_item[i] = bp
                if mgr.enable_caching:
                    pool._touch_one(<KVCacheBlock>bp)
            mgr._req_to_blocks[request_id] = req_blocks
            mgr._num_cached_block[request_id] = n_hits
            request._kv_blocks = req_blocks
            request._kv_ncached = n_hits
        elif req_blocks is None:
            req_blocks = []
            mgr._req_to_blocks[request_id] = req_blocks
            request._kv_blocks = req_blocks
        cdef list new_blocks = None
        cdef Py_ssize_t n_more = _cdiv(need_slot, bs) - PyList_GET_SIZE(req_blocks)
        if n_more > 0:
            new_blocks = pool._get_new_blocks(n_more)
            req_blocks.extend(new_blocks)
        if self.enable_caching and not delay_cache_blocks:
            n_cache = total_computed + n_new
            req_tokens = PyList_GET_SIZE(request._all_token_ids)
            if n_cache > req_tokens:
                n_cache = req_tokens
            num_full = n_cache // bs
            if request._kv_ncached < num_full:
                if fresh:
                    num_cached = request._kv_ncached if request._kv_ncached > 0 else 0
                else:  # (see the record above)
                    p = PyDict_GetItem(mgr._num_cached_block, request_id)
                    num_cached = 0 if p == NULL else <Py_ssize_t><object>p
                if num_cached < num_full:
                    pool.cache_full_blocks(request, req_blocks, num_cached, num_full, bs,
                                           mgr.kv_cache_group_id)
                    mgr._num_cached_block[request_id] = num_full
                request._kv_ncached = num_full if num_cached < num_full else num_cached
        if new_blocks is None:
            return self.empty_kv_cache_blocks
        return _one_group(new_blocks)

    def free(self, request):
        """Free the request's blocks, tail first, group by group.

        A request that holds no blocks (never allocated, or freed already) is
        left as it is, as in vLLM.

        Raises:
            TypeError: not a request, or its ``request_id`` is not a str.
        """
        cdef str request_id = _rid(request)
        cdef FullAttentionManager mgr = self._full
        if mgr is not None:  # one group: its manager's free, with one lookup
            mgr._free_held(request_id)
        elif self.coordinator.holds(request_id):
            self.coordinator.free(request_id)
        if type(request) is Request:
            # Drop the fast path's record of the freed list here, so that the
            # list goes now (as the Python twin's does), not with the request.
            (<Request>request)._kv_blocks = None

    def remove_skipped_blocks(self, request_id, processed_computed_tokens):
        cdef Py_ssize_t n = _check_count("processed_computed_tokens", processed_computed_tokens)
        self.coordinator.remove_skipped_blocks(request_id, n)

    def pop_blocks_for_free(self, request):
        return self.coordinator.pop_blocks_for_free(request.request_id)

    def evict_blocks(self, block_ids):
        self.block_pool.evict_blocks(block_ids)

    def reset_prefix_cache(self):
        """Drop all cached hashes; False (and nothing changes) while blocks are in use."""
        if not self.block_pool.reset_prefix_cache():
            return False
        if self.log_stats:
            self.prefix_cache_stats.reset = True
        return True

    def get_num_common_prefix_blocks(self, running_request_id):
        return self.coordinator.get_num_common_prefix_blocks(running_request_id)

    def take_events(self):
        """Drain the KV events, annotated with each group's spec kind and window."""
        events = self.block_pool.take_events()
        meta = self.kv_cache_event_metadata
        for event in events:
            if type(event) is BlockStored and event.group_idx is not None and 0 <= event.group_idx < len(meta):
                event.kv_cache_spec_kind, event.kv_cache_spec_sliding_window = meta[event.group_idx]
        return events

    def get_blocks(self, request_id):
        """The request's whole block table per group (empty groups if it holds none).

        Raises:
            TypeError: ``request_id`` is not a str.
        """
        _check_rid(request_id)
        return KVCacheBlocks(self.coordinator.get_blocks(request_id))

    def get_block_ids(self, request_id):
        return self.get_blocks(request_id).get_block_ids()

    def new_step_starts(self):
        return None
