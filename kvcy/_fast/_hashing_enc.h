/* Serialisers for kvcy._fast._hashing_c: the exact bytes of
 *
 *   pickle.dumps(obj, protocol=5)          (CPython's _pickle.c, protocol 5)
 *   cbor2.dumps(obj, canonical=True)       (cbor2 >= 5)
 *   the xxh3_raw block message             (docs/hashing.md)
 *
 * for the shapes that block hashing produces: None, True/False, ints that fit
 * in int64, bytes, str, and tuples of those (nested), plus the block triple
 * (parent, tuple(tokens), extra_keys) with the tokens given as an array of
 * PyObject* or of int64.  Anything else makes a writer return KV_FALLBACK and
 * the caller serialises with pickle / cbor2 itself, so every input still
 * hashes to the reference bytes.
 *
 * Return convention of every writer: KV_OK (0), KV_FALLBACK (1), or KV_ERR
 * (-1, a Python exception is set: MemoryError only).
 *
 * No writer calls back into Python code, so the objects it reads cannot
 * change under it (the GIL is held throughout).
 */
#ifndef KVCY_HASHING_ENC_H
#define KVCY_HASHING_ENC_H

#include <Python.h>
#include <stdint.h>
#include <string.h>

#define KV_OK 0
#define KV_FALLBACK 1
#define KV_ERR (-1)

/* Nesting depth the writers follow before falling back. */
#define KV_MAX_DEPTH 32
/* Memo entries (pickle) tracked before falling back. */
#define KV_MEMO_MAX 256
/* A pickle frame is split by CPython once it reaches 64 KiB (FRAME_SIZE_TARGET)
 * and bytes/str payloads of 64 KiB or more are written outside frames; the
 * fast path only produces single-frame pickles well below that. */
#define KV_PICKLE_MAX_PAYLOAD 60000
#define KV_STACK_BYTES 2048

#if defined(_MSC_VER)
#  define KV_RESTRICT __restrict
#else
#  define KV_RESTRICT __restrict__
#endif

/* pickle opcodes (protocol 5 subset) */
#define OP_MARK 0x28         /* ( */
#define OP_STOP 0x2e         /* . */
#define OP_BININT 0x4a       /* J */
#define OP_BININT1 0x4b      /* K */
#define OP_BININT2 0x4d      /* M */
#define OP_NONE 0x4e         /* N */
#define OP_BINUNICODE 0x58   /* X */
#define OP_BINBYTES 0x42     /* B */
#define OP_SHORT_BINBYTES 0x43 /* C */
#define OP_BINGET 0x68       /* h */
#define OP_LONG_BINGET 0x6a  /* j */
#define OP_TUPLE 0x74        /* t */
#define OP_EMPTY_TUPLE 0x29  /* ) */
#define OP_PROTO 0x80
#define OP_TUPLE1 0x85
#define OP_TUPLE3 0x87
#define OP_NEWTRUE 0x88
#define OP_NEWFALSE 0x89
#define OP_LONG1 0x8a
#define OP_SHORT_BINUNICODE 0x8c
#define OP_MEMOIZE 0x94
#define OP_FRAME 0x95

typedef struct {
    unsigned char *data;   /* stack or heap */
    Py_ssize_t len;
    Py_ssize_t cap;
    int on_heap;
    Py_ssize_t nmemo;
    PyObject *memo[KV_MEMO_MAX];   /* identities, in memo-index order (NULL: unnamed) */
    unsigned char stack[KV_STACK_BYTES];
} kv_enc;

static inline void kv_enc_init(kv_enc *e)
{
    e->data = e->stack;
    e->len = 0;
    e->cap = KV_STACK_BYTES;
    e->on_heap = 0;
    e->nmemo = 0;
}

static inline void kv_enc_free(kv_enc *e)
{
    if (e->on_heap) {
        PyMem_Free(e->data);
    }
    e->data = e->stack;
    e->cap = KV_STACK_BYTES;
    e->on_heap = 0;
    e->len = 0;
}

static int kv_grow(kv_enc *e, Py_ssize_t need)
{
    Py_ssize_t cap = e->cap;
    unsigned char *p;
    if (need < 0 || need > PY_SSIZE_T_MAX / 2) {
        PyErr_NoMemory();
        return KV_ERR;
    }
    while (cap < need) {
        cap *= 2;
    }
    if (e->on_heap) {
        p = (unsigned char *)PyMem_Realloc(e->data, (size_t)cap);
    } else {
        p = (unsigned char *)PyMem_Malloc((size_t)cap);
        if (p != NULL && e->len) {
            memcpy(p, e->data, (size_t)e->len);
        }
    }
    if (p == NULL) {
        PyErr_NoMemory();
        return KV_ERR;
    }
    e->data = p;
    e->cap = cap;
    e->on_heap = 1;
    return KV_OK;
}

/* Make room for n more bytes. */
static inline int kv_reserve(kv_enc *e, Py_ssize_t n)
{
    if (n <= e->cap - e->len) {
        return KV_OK;
    }
    if (n > PY_SSIZE_T_MAX - e->len) {
        PyErr_NoMemory();
        return KV_ERR;
    }
    return kv_grow(e, e->len + n);
}

/* ------------------------------------------------------------------ ints */

/* An exact int that fits in int64 -> 1 and *out; anything else -> 0.  Never
 * sets an exception. */
static inline int kv_exact_int64(PyObject *o, int64_t *out)
{
    int overflow = 0;
    long long v;
    if (!PyLong_CheckExact(o)) {
        return 0;
    }
#if PY_VERSION_HEX >= 0x030C0000 && !defined(PYPY_VERSION)
    if (PyUnstable_Long_IsCompact((PyLongObject *)o)) {
        *out = (int64_t)PyUnstable_Long_CompactValue((PyLongObject *)o);
        return 1;
    }
#elif !defined(PYPY_VERSION)
    {
        Py_ssize_t size = Py_SIZE(o);
        if (size == 0) {
            *out = 0;
            return 1;
        }
        if (size == 1) {
            *out = (int64_t)((PyLongObject *)o)->ob_digit[0];
            return 1;
        }
        if (size == -1) {
            *out = -(int64_t)((PyLongObject *)o)->ob_digit[0];
            return 1;
        }
#if PYLONG_BITS_IN_DIGIT == 30
        if (size == 2 || size == -2) {
            const digit *d = ((PyLongObject *)o)->ob_digit;
            int64_t a = (int64_t)d[0] | ((int64_t)d[1] << 30);
            *out = size > 0 ? a : -a;
            return 1;
        }
#endif
    }
#endif
    v = PyLong_AsLongLongAndOverflow(o, &overflow);
    if (overflow) {
        return 0;
    }
    if (v == -1 && PyErr_Occurred()) {   /* cannot happen for an exact int */
        PyErr_Clear();
        return 0;
    }
    *out = (int64_t)v;
    return 1;
}

static inline void kv_le32(unsigned char *p, uint32_t v)
{
    p[0] = (unsigned char)v;
    p[1] = (unsigned char)(v >> 8);
    p[2] = (unsigned char)(v >> 16);
    p[3] = (unsigned char)(v >> 24);
}

static inline void kv_le64(unsigned char *p, uint64_t v)
{
    int i;
    for (i = 0; i < 8; i++) {
        p[i] = (unsigned char)(v >> (8 * i));
    }
}

/* ------------------------------------------------------------------ pickle */

#if defined(__GNUC__) || defined(__clang__)
#  define KV_LIKELY(x) __builtin_expect(!!(x), 1)
#else
#  define KV_LIKELY(x) (x)
#endif

static inline void kv_store64(unsigned char *p, uint64_t w)
{
#if PY_LITTLE_ENDIAN
    memcpy(p, &w, 8);
#else
    kv_le64(p, w);
#endif
}

#if defined(__GNUC__) || defined(__clang__)
#  define KV_NOINLINE __attribute__((noinline))
#elif defined(_MSC_VER)
#  define KV_NOINLINE __declspec(noinline)
#else
#  define KV_NOINLINE
#endif

/* save_long() of _pickle.c picks BININT1 (0..0xff), BININT2 (..0xffff) or
 * BININT (the rest of int32) by value.  For v in [0, 2**31) both the opcode
 * and the length follow from the index of the highest set bit, so a token id
 * costs a bit scan and two table reads instead of compares that a random id
 * would mispredict (or a longer branch-free sum). */
static const unsigned char kv_pk_small_op[32] = {
    OP_BININT1, OP_BININT1, OP_BININT1, OP_BININT1, OP_BININT1, OP_BININT1, OP_BININT1, OP_BININT1,
    OP_BININT2, OP_BININT2, OP_BININT2, OP_BININT2, OP_BININT2, OP_BININT2, OP_BININT2, OP_BININT2,
    OP_BININT, OP_BININT, OP_BININT, OP_BININT, OP_BININT, OP_BININT, OP_BININT, OP_BININT,
    OP_BININT, OP_BININT, OP_BININT, OP_BININT, OP_BININT, OP_BININT, OP_BININT, OP_BININT,
};
static const unsigned char kv_pk_small_len[32] = {
    2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3,
    5, 5, 5, 5, 5, 5, 5, 5, 5, 5, 5, 5, 5, 5, 5, 5,
};

/* The row of the tables above for u in [0, 2**31). */
static inline unsigned kv_pk_small_row(uint64_t u)
{
#if defined(__GNUC__) || defined(__clang__)
    return 31u ^ (unsigned)__builtin_clz((unsigned)u | 1u);   /* highest set bit */
#else
    return 8u * (unsigned)(u > 0xffu) + 8u * (unsigned)(u > 0xffffu);   /* 0, 8 or 16: same rows */
#endif
}

/* A pickled int in [0, 2**31) at p (8 bytes free; 2, 3 or 5 are kept): one
 * 8-byte store of opcode + little-endian value.  Returns the end. */
static inline unsigned char *kv_pk_small_at(unsigned char *KV_RESTRICT p, uint64_t u)
{
    unsigned row = kv_pk_small_row(u);
    kv_store64(p, (u << 8) | kv_pk_small_op[row]);
    return p + kv_pk_small_len[row];
}

/* save_long() for the ints kv_pk_small_at does not take: negative int32
 * (BININT, 5 bytes) and LONG1 (the shortest little-endian two's complement,
 * 5..8 bytes, for everything outside int32).  Out of line: it would crowd the
 * token loop's registers. */
static KV_NOINLINE unsigned char *kv_pk_int_big_at(unsigned char *KV_RESTRICT p, int64_t v)
{
    int n = 5, i;
    if (v >= INT32_MIN && v < 0) {
        p[0] = OP_BININT;
        kv_le32(p + 1, (uint32_t)v);
        return p + 5;
    }
    while (n < 8) {
        int64_t lim = (int64_t)1 << (8 * n - 1);
        if (v >= -lim && v < lim) {
            break;
        }
        n++;
    }
    p[0] = OP_LONG1;
    p[1] = (unsigned char)n;
    for (i = 0; i < n; i++) {
        p[2 + i] = (unsigned char)((uint64_t)v >> (8 * i));
    }
    return p + 2 + n;
}

/* save_long() of _pickle.c for an int64 at p (10 bytes free); returns the end. */
static inline unsigned char *kv_pk_int_at(unsigned char *KV_RESTRICT p, int64_t v)
{
    if (KV_LIKELY((uint64_t)v <= 0x7fffffffu)) {
        return kv_pk_small_at(p, (uint64_t)v);
    }
    return kv_pk_int_big_at(p, v);
}

/* An exact int in [1, 2**30) -> 1 and *out: what almost every token id is,
 * read straight from CPython's int layout.  0 for anything else (including
 * ids that are fine but take kv_exact_int64). */
static inline int kv_small_token(PyObject *o, uint64_t *out)
{
#if PY_VERSION_HEX >= 0x030C0000 && !defined(PYPY_VERSION)
    if (PyLong_CheckExact(o) && PyUnstable_Long_IsCompact((PyLongObject *)o)) {
        Py_ssize_t v = PyUnstable_Long_CompactValue((PyLongObject *)o);
        *out = (uint64_t)v;
        return v > 0;
    }
    return 0;
#elif !defined(PYPY_VERSION)
    if (PyLong_CheckExact(o) && Py_SIZE(o) == 1) {
        *out = (uint64_t)((PyLongObject *)o)->ob_digit[0];
        return 1;
    }
    return 0;
#else
    (void)o; (void)out;
    return 0;
#endif
}

/* Needs 10 bytes reserved. */
static inline void kv_pk_int(kv_enc *e, int64_t v)
{
    unsigned char *end = kv_pk_int_at(e->data + e->len, v);
    e->len = end - e->data;
}

/* KV_DEFINE_TOKEN_RUN(NAME, INT_AT, SMALL_AT) defines
 *     Py_ssize_t NAME(out, items, vals, n)
 * which writes n tokens at out, each with INT_AT (SMALL_AT for the common
 * small non-negative ints; vals, when given, holds them already as int64),
 * and returns the byte count, or -1 when an item is not an exact int in
 * int64 range.  One body for the pickle and the CBOR token runs. */
#define KV_DEFINE_TOKEN_RUN(NAME, INT_AT, SMALL_AT)                                              \
static Py_ssize_t NAME(unsigned char *KV_RESTRICT out, PyObject *const *KV_RESTRICT items,      \
                       const int64_t *KV_RESTRICT vals, Py_ssize_t n)                           \
{                                                                                               \
    unsigned char *p = out;                                                                     \
    Py_ssize_t i;                                                                               \
    int64_t v;                                                                                  \
    if (vals != NULL) {                                                                         \
        for (i = 0; i < n; i++) {                                                               \
            p = INT_AT(p, vals[i]);                                                             \
        }                                                                                       \
    } else {                                                                                    \
        for (i = 0; i < n; i++) {                                                               \
            uint64_t u;                                                                         \
            if (KV_LIKELY(kv_small_token(items[i], &u))) {                                      \
                p = SMALL_AT(p, u);                                                             \
                continue;                                                                       \
            }                                                                                   \
            if (!kv_exact_int64(items[i], &v)) {                                                \
                return -1;                                                                      \
            }                                                                                   \
            p = INT_AT(p, v);                                                                   \
        }                                                                                       \
    }                                                                                           \
    return p - out;                                                                             \
}

/* n tokens as pickle ints at out (10 * n bytes free). */
KV_DEFINE_TOKEN_RUN(kv_pk_tokens, kv_pk_int_at, kv_pk_small_at)

static inline Py_ssize_t kv_memo_find(const kv_enc *e, PyObject *o)
{
    Py_ssize_t i;
    for (i = 0; i < e->nmemo; i++) {
        if (e->memo[i] == o) {
            return i;
        }
    }
    return -1;
}

/* MEMOIZE: the object gets the next memo index.  Needs 1 byte reserved. */
static inline int kv_memoize(kv_enc *e, PyObject *o)
{
    if (e->nmemo >= KV_MEMO_MAX) {
        return KV_FALLBACK;
    }
    e->memo[e->nmemo++] = o;
    e->data[e->len++] = OP_MEMOIZE;
    return KV_OK;
}

static int kv_pk_obj(kv_enc *e, PyObject *o, int depth);

static int kv_pk_tuple_items(kv_enc *e, PyObject *o, Py_ssize_t n, int depth)
{
    Py_ssize_t i;
    int r;
    for (i = 0; i < n; i++) {
        r = kv_pk_obj(e, PyTuple_GET_ITEM(o, i), depth + 1);
        if (r != KV_OK) {
            return r;
        }
    }
    return KV_OK;
}

/* save() of _pickle.c for the supported types. */
static int kv_pk_obj(kv_enc *e, PyObject *o, int depth)
{
    PyTypeObject *t;
    Py_ssize_t idx, n;
    int64_t v;
    int r;

    if (kv_reserve(e, 16) < 0) {
        return KV_ERR;
    }
    /* Atoms: never memoised. */
    if (o == Py_None) {
        e->data[e->len++] = OP_NONE;
        return KV_OK;
    }
    if (o == Py_True || o == Py_False) {
        e->data[e->len++] = (o == Py_True) ? OP_NEWTRUE : OP_NEWFALSE;
        return KV_OK;
    }
    t = Py_TYPE(o);
    if (t == &PyLong_Type) {
        if (!kv_exact_int64(o, &v)) {
            return KV_FALLBACK;
        }
        kv_pk_int(e, v);
        return KV_OK;
    }
    if (t != &PyBytes_Type && t != &PyUnicode_Type && t != &PyTuple_Type) {
        return KV_FALLBACK;
    }
    /* The memo, by identity. */
    idx = kv_memo_find(e, o);
    if (idx >= 0) {
        unsigned char *p = e->data + e->len;
        if (idx < 256) {
            p[0] = OP_BINGET;
            p[1] = (unsigned char)idx;
            e->len += 2;
        } else {
            p[0] = OP_LONG_BINGET;
            kv_le32(p + 1, (uint32_t)idx);
            e->len += 5;
        }
        return KV_OK;
    }
    if (t == &PyBytes_Type) {
        n = PyBytes_GET_SIZE(o);
        if (n > KV_PICKLE_MAX_PAYLOAD) {
            return KV_FALLBACK;
        }
        if (kv_reserve(e, n + 6) < 0) {
            return KV_ERR;
        }
        if (n <= 0xff) {
            e->data[e->len++] = OP_SHORT_BINBYTES;
            e->data[e->len++] = (unsigned char)n;
        } else {
            e->data[e->len++] = OP_BINBYTES;
            kv_le32(e->data + e->len, (uint32_t)n);
            e->len += 4;
        }
        memcpy(e->data + e->len, PyBytes_AS_STRING(o), (size_t)n);
        e->len += n;
        return kv_memoize(e, o);
    }
    if (t == &PyUnicode_Type) {
        const char *s;
        if (PyUnicode_GET_LENGTH(o) > KV_PICKLE_MAX_PAYLOAD) {
            return KV_FALLBACK;
        }
        s = PyUnicode_AsUTF8AndSize(o, &n);
        if (s == NULL) {
            /* lone surrogates: pickle writes them with "surrogatepass" */
            PyErr_Clear();
            return KV_FALLBACK;
        }
        if (n > KV_PICKLE_MAX_PAYLOAD) {
            return KV_FALLBACK;
        }
        if (kv_reserve(e, n + 6) < 0) {
            return KV_ERR;
        }
        if (n <= 0xff) {
            e->data[e->len++] = OP_SHORT_BINUNICODE;
            e->data[e->len++] = (unsigned char)n;
        } else {
            e->data[e->len++] = OP_BINUNICODE;
            kv_le32(e->data + e->len, (uint32_t)n);
            e->len += 4;
        }
        memcpy(e->data + e->len, s, (size_t)n);
        e->len += n;
        return kv_memoize(e, o);
    }
    /* tuple */
    n = PyTuple_GET_SIZE(o);
    if (n == 0) {
        e->data[e->len++] = OP_EMPTY_TUPLE;   /* the empty tuple is not memoised */
        return KV_OK;
    }
    if (depth >= KV_MAX_DEPTH) {
        return KV_FALLBACK;
    }
    if (n <= 3) {
        r = kv_pk_tuple_items(e, o, n, depth);
        if (r != KV_OK) {
            return r;
        }
        if (kv_reserve(e, 2) < 0) {
            return KV_ERR;
        }
        e->data[e->len++] = (unsigned char)(OP_TUPLE1 + n - 1);
    } else {
        e->data[e->len++] = OP_MARK;
        r = kv_pk_tuple_items(e, o, n, depth);
        if (r != KV_OK) {
            return r;
        }
        if (kv_reserve(e, 2) < 0) {
            return KV_ERR;
        }
        e->data[e->len++] = OP_TUPLE;
    }
    return kv_memoize(e, o);
}

/* PROTO 5 and room for the FRAME header. */
static inline int kv_pk_begin(kv_enc *e)
{
    e->len = 0;
    e->nmemo = 0;
    if (kv_reserve(e, 11) < 0) {
        return KV_ERR;
    }
    e->data[0] = OP_PROTO;
    e->data[1] = 5;
    e->len = 11;
    return KV_OK;
}

/* STOP, then the frame header (or none: CPython frames only >= 4 bytes). */
static inline int kv_pk_end(kv_enc *e)
{
    Py_ssize_t payload;
    if (kv_reserve(e, 1) < 0) {
        return KV_ERR;
    }
    e->data[e->len++] = OP_STOP;
    payload = e->len - 11;
    if (payload > KV_PICKLE_MAX_PAYLOAD) {
        return KV_FALLBACK;
    }
    if (payload >= 4) {
        e->data[2] = OP_FRAME;
        kv_le64(e->data + 3, (uint64_t)payload);
    } else {
        memmove(e->data + 2, e->data + 11, (size_t)payload);
        e->len -= 9;
    }
    return KV_OK;
}

/* The block that a chain without extra keys hashes: parent a digest (bytes of
 * at most 255), more than 3 tokens, extra keys None.  Every byte but the
 * tokens' is known in advance:
 *
 *   PROTO 5, FRAME <payload>, SHORT_BINBYTES <plen> <parent> MEMOIZE,
 *   MARK <tokens> TUPLE MEMOIZE, NONE, TUPLE3 MEMOIZE, STOP
 *
 * (the same bytes kv_pickle_block_ex's general path writes, in fewer steps). */
static inline int kv_pickle_block_plain(kv_enc *e, PyObject *parent, PyObject *const *items,
                                        const int64_t *vals, Py_ssize_t n,
                                        PyObject *tokens_id, PyObject *block_id)
{
    /* TUPLE MEMOIZE NONE TUPLE3 MEMOIZE STOP, little-endian (two spare bytes) */
    const uint64_t tail = (uint64_t)OP_TUPLE | ((uint64_t)OP_MEMOIZE << 8) | ((uint64_t)OP_NONE << 16)
                          | ((uint64_t)OP_TUPLE3 << 24) | ((uint64_t)OP_MEMOIZE << 32)
                          | ((uint64_t)OP_STOP << 40);
    Py_ssize_t plen = PyBytes_GET_SIZE(parent), w;
    const char *src = PyBytes_AS_STRING(parent);
    unsigned char *d, *p;

    if (kv_reserve(e, 13 + plen + 2 + n * 10 + 8) < 0) {
        return KV_ERR;
    }
    d = e->data;
    d[0] = OP_PROTO;
    d[1] = 5;
    d[2] = OP_FRAME;
    d[11] = OP_SHORT_BINBYTES;
    d[12] = (unsigned char)plen;
    /* constant sizes: one or two vector moves instead of a memcpy call */
    if (plen == 16) {
        memcpy(d + 13, src, 16);
    } else if (plen == 32) {
        memcpy(d + 13, src, 32);
    } else {
        memcpy(d + 13, src, (size_t)plen);
    }
    p = d + 13 + plen;
    p[0] = OP_MEMOIZE;
    p[1] = OP_MARK;
    p += 2;
    w = kv_pk_tokens(p, items, vals, n);
    if (w < 0) {
        return KV_FALLBACK;
    }
    p += w;
    kv_store64(p, tail);
    e->len = (p + 6) - d;
    if (e->len - 11 > KV_PICKLE_MAX_PAYLOAD) {
        return KV_FALLBACK;
    }
    kv_store64(d + 3, (uint64_t)(e->len - 11));
    e->memo[0] = parent;
    e->memo[1] = tokens_id;
    e->memo[2] = block_id;
    e->nmemo = 3;
    return KV_OK;
}

/* pickle.dumps((parent, tuple(tokens), extra), protocol=5); the tokens are
 * items[0:n] (PyObject*) or vals[0:n] (int64) -- exactly one is non-NULL.
 * tokens_id / block_id: the tokens tuple and the triple when they are real
 * objects (for the memo), else NULL. */
static int kv_pickle_block_ex(kv_enc *e, PyObject *parent, PyObject *const *items,
                              const int64_t *vals, Py_ssize_t n, PyObject *extra,
                              PyObject *tokens_id, PyObject *block_id)
{
    Py_ssize_t w;
    int r;

    if (n > KV_PICKLE_MAX_PAYLOAD / 2) {
        return KV_FALLBACK;
    }
    if (extra == Py_None && n > 3 && PyBytes_CheckExact(parent) && PyBytes_GET_SIZE(parent) <= 0xff) {
        return kv_pickle_block_plain(e, parent, items, vals, n, tokens_id, block_id);
    }
    if (PyBytes_CheckExact(parent) && PyBytes_GET_SIZE(parent) <= 0xff) {
        /* The usual parent: a digest.  PROTO 5, frame header, SHORT_BINBYTES, MEMOIZE. */
        Py_ssize_t plen = PyBytes_GET_SIZE(parent);
        if (kv_reserve(e, 11 + 3 + plen + n * 10 + 4 + 16) < 0) {
            return KV_ERR;
        }
        e->data[0] = OP_PROTO;
        e->data[1] = 5;
        e->data[11] = OP_SHORT_BINBYTES;
        e->data[12] = (unsigned char)plen;
        memcpy(e->data + 13, PyBytes_AS_STRING(parent), (size_t)plen);
        e->data[13 + plen] = OP_MEMOIZE;
        e->len = 14 + plen;
        e->memo[0] = parent;
        e->nmemo = 1;
    } else {
        r = kv_pk_begin(e);
        if (r != KV_OK) {
            return r;
        }
        r = kv_pk_obj(e, parent, 1);
        if (r != KV_OK) {
            return r;
        }
        if (kv_reserve(e, n * 10 + 4 + 16) < 0) {
            return KV_ERR;
        }
    }
    if (n == 0) {
        e->data[e->len++] = OP_EMPTY_TUPLE;
    } else if (tokens_id != NULL && kv_memo_find(e, tokens_id) >= 0) {
        /* the tokens tuple already went out inside the parent: a memo reference */
        return KV_FALLBACK;
    } else {
        if (n > 3) {
            e->data[e->len++] = OP_MARK;
        }
        w = kv_pk_tokens(e->data + e->len, items, vals, n);
        if (w < 0) {
            return KV_FALLBACK;
        }
        e->len += w;
        e->data[e->len++] = (n > 3) ? OP_TUPLE : (unsigned char)(OP_TUPLE1 + n - 1);
        r = kv_memoize(e, tokens_id);
        if (r != KV_OK) {
            return r;
        }
    }
    if (extra == Py_None) {
        e->data[e->len++] = OP_NONE;   /* room: the 16 spare bytes reserved above */
    } else {
        r = kv_pk_obj(e, extra, 1);
        if (r != KV_OK) {
            return r;
        }
        if (kv_reserve(e, 2) < 0) {
            return KV_ERR;
        }
    }
    e->data[e->len++] = OP_TUPLE3;
    r = kv_memoize(e, block_id);
    if (r != KV_OK) {
        return r;
    }
    return kv_pk_end(e);
}

static int kv_pickle_block(kv_enc *e, PyObject *parent, PyObject *const *items,
                           const int64_t *vals, Py_ssize_t n, PyObject *extra)
{
    /* fresh tuples: nothing else can refer to them */
    return kv_pickle_block_ex(e, parent, items, vals, n, extra, NULL, NULL);
}

/* A (parent, non-empty tuple, extra) triple whose parent is not the tuple
 * itself: what hash_block_tokens hashes.  *tokens is set to the tuple. */
static inline int kv_is_block(PyObject *o, PyObject **tokens)
{
    PyObject *t;
    if (!PyTuple_CheckExact(o) || PyTuple_GET_SIZE(o) != 3) {
        return 0;
    }
    t = PyTuple_GET_ITEM(o, 1);
    if (!PyTuple_CheckExact(t) || PyTuple_GET_SIZE(t) == 0 || PyTuple_GET_ITEM(o, 0) == t) {
        return 0;
    }
    *tokens = t;
    return 1;
}

/* pickle.dumps(o, protocol=5) */
static int kv_pickle(kv_enc *e, PyObject *o)
{
    PyObject *t;
    int r;
    if (kv_is_block(o, &t)) {
        r = kv_pickle_block_ex(e, PyTuple_GET_ITEM(o, 0), ((PyTupleObject *)t)->ob_item, NULL,
                               PyTuple_GET_SIZE(t), PyTuple_GET_ITEM(o, 2), t, o);
        if (r != KV_FALLBACK) {
            return r;
        }
    }
    r = kv_pk_begin(e);
    if (r != KV_OK) {
        return r;
    }
    r = kv_pk_obj(e, o, 0);
    if (r != KV_OK) {
        return r;
    }
    return kv_pk_end(e);
}

/* ------------------------------------------------------------------ CBOR */

/* A head at p (9 bytes free): major type + argument in the shortest form;
 * returns the end. */
static inline unsigned char *kv_cb_head_at(unsigned char *KV_RESTRICT p, unsigned major, uint64_t arg)
{
    unsigned char m = (unsigned char)(major << 5);
    if (arg < 24) {
        p[0] = (unsigned char)(m | arg);
        return p + 1;
    }
    if (arg <= 0xffu) {
        p[0] = (unsigned char)(m | 24);
        p[1] = (unsigned char)arg;
        return p + 2;
    }
    if (arg <= 0xffffu) {
        p[0] = (unsigned char)(m | 25);
        p[1] = (unsigned char)(arg >> 8);
        p[2] = (unsigned char)arg;
        return p + 3;
    }
    if (arg <= 0xffffffffu) {
        p[0] = (unsigned char)(m | 26);
        p[1] = (unsigned char)(arg >> 24);
        p[2] = (unsigned char)(arg >> 16);
        p[3] = (unsigned char)(arg >> 8);
        p[4] = (unsigned char)arg;
        return p + 5;
    } else {
        int i;
        p[0] = (unsigned char)(m | 27);
        for (i = 0; i < 8; i++) {
            p[1 + i] = (unsigned char)(arg >> (56 - 8 * i));
        }
        return p + 9;
    }
}

static inline uint64_t kv_bswap32(uint64_t x)
{
    return ((x & 0xffu) << 24) | ((x & 0xff00u) << 8) | ((x >> 8) & 0xff00u) | ((x >> 24) & 0xffu);
}

/* An int as CBOR at p (9 bytes free); returns the end.  Arguments below 2**32
 * are written without branches: one 8-byte store of head + big-endian
 * argument, of which 1, 2, 3 or 5 bytes are kept. */
static inline unsigned char *kv_cb_int_at(unsigned char *KV_RESTRICT p, int64_t v)
{
    uint64_t neg = (uint64_t)v >> 63;
    uint64_t arg = (uint64_t)v ^ (0 - neg);          /* v, or -1 - v when negative */
    if (KV_LIKELY(arg <= 0xffffffffu)) {
        uint64_t m = neg << 5;
        uint64_t c1 = arg >= 24, c2 = arg > 0xffu, c3 = arg > 0xffffu;
        /* 1 byte: m|arg; 2: m|24, arg; 3: m|25, BE16; 5: m|26, BE32 */
        uint64_t be = kv_bswap32(arg) >> (8 * (4 - 1 - c2 - 2 * c3));   /* arg big-endian in 1, 2 or 4 bytes */
        uint64_t head = c1 ? (m | (23 + c1 + c2 + c3)) : (m | arg);
        uint64_t word = head | ((be << 8) & (0 - c1));
        Py_ssize_t len = 1 + (Py_ssize_t)c1 + (Py_ssize_t)c2 + 2 * (Py_ssize_t)c3;
        kv_store64(p, word);
        return p + len;
    }
    return kv_cb_head_at(p, (unsigned)neg, arg);
}

/* Needs 9 bytes reserved. */
static inline void kv_cb_head(kv_enc *e, unsigned major, uint64_t arg)
{
    unsigned char *end = kv_cb_head_at(e->data + e->len, major, arg);
    e->len = end - e->data;
}

/* Needs 9 bytes reserved. */
static inline void kv_cb_int(kv_enc *e, int64_t v)
{
    unsigned char *end = kv_cb_int_at(e->data + e->len, v);
    e->len = end - e->data;
}

static inline unsigned char *kv_cb_small_at(unsigned char *KV_RESTRICT p, uint64_t u)
{
    return kv_cb_int_at(p, (int64_t)u);
}

/* n tokens as CBOR ints at out (9 * n bytes free). */
KV_DEFINE_TOKEN_RUN(kv_cb_tokens, kv_cb_int_at, kv_cb_small_at)

static int kv_cb_obj(kv_enc *e, PyObject *o, int depth)
{
    PyTypeObject *t;
    Py_ssize_t n, i;
    int64_t v;
    int r;

    if (kv_reserve(e, 9) < 0) {
        return KV_ERR;
    }
    if (o == Py_None) {
        e->data[e->len++] = 0xf6;
        return KV_OK;
    }
    if (o == Py_True || o == Py_False) {
        e->data[e->len++] = (o == Py_True) ? 0xf5 : 0xf4;
        return KV_OK;
    }
    t = Py_TYPE(o);
    if (t == &PyLong_Type) {
        if (!kv_exact_int64(o, &v)) {
            return KV_FALLBACK;
        }
        kv_cb_int(e, v);
        return KV_OK;
    }
    if (t == &PyBytes_Type) {
        n = PyBytes_GET_SIZE(o);
        kv_cb_head(e, 2, (uint64_t)n);
        if (kv_reserve(e, n) < 0) {
            return KV_ERR;
        }
        memcpy(e->data + e->len, PyBytes_AS_STRING(o), (size_t)n);
        e->len += n;
        return KV_OK;
    }
    if (t == &PyUnicode_Type) {
        const char *s = PyUnicode_AsUTF8AndSize(o, &n);
        if (s == NULL) {
            PyErr_Clear();   /* lone surrogates: cbor2 raises; let it */
            return KV_FALLBACK;
        }
        kv_cb_head(e, 3, (uint64_t)n);
        if (kv_reserve(e, n) < 0) {
            return KV_ERR;
        }
        memcpy(e->data + e->len, s, (size_t)n);
        e->len += n;
        return KV_OK;
    }
    if (t == &PyTuple_Type) {
        if (depth >= KV_MAX_DEPTH) {
            return KV_FALLBACK;
        }
        n = PyTuple_GET_SIZE(o);
        kv_cb_head(e, 4, (uint64_t)n);
        for (i = 0; i < n; i++) {
            r = kv_cb_obj(e, PyTuple_GET_ITEM(o, i), depth + 1);
            if (r != KV_OK) {
                return r;
            }
        }
        return KV_OK;
    }
    if (t == &PyList_Type) {
        /* No Python code runs while writing, so the list cannot change. */
        if (depth >= KV_MAX_DEPTH) {
            return KV_FALLBACK;
        }
        n = PyList_GET_SIZE(o);
        kv_cb_head(e, 4, (uint64_t)n);
        for (i = 0; i < n; i++) {
            r = kv_cb_obj(e, PyList_GET_ITEM(o, i), depth + 1);
            if (r != KV_OK) {
                return r;
            }
        }
        return KV_OK;
    }
    return KV_FALLBACK;
}

/* cbor2.dumps((parent, tuple(tokens), extra), canonical=True) */
static int kv_cbor_block(kv_enc *e, PyObject *parent, PyObject *const *items,
                         const int64_t *vals, Py_ssize_t n, PyObject *extra)
{
    Py_ssize_t w;
    int r;

    e->len = 0;
    if (n > (PY_SSIZE_T_MAX - 1024) / 9) {
        PyErr_NoMemory();
        return KV_ERR;
    }
    if (PyBytes_CheckExact(parent) && PyBytes_GET_SIZE(parent) < 24) {
        /* The usual parent: a 16-byte digest (32-byte ones take the general path). */
        Py_ssize_t plen = PyBytes_GET_SIZE(parent);
        if (kv_reserve(e, 2 + plen + n * 9 + 9 + 16) < 0) {
            return KV_ERR;
        }
        e->data[0] = 0x83;
        e->data[1] = (unsigned char)(0x40 | plen);
        memcpy(e->data + 2, PyBytes_AS_STRING(parent), (size_t)plen);
        e->len = 2 + plen;
    } else {
        if (kv_reserve(e, 1) < 0) {
            return KV_ERR;
        }
        e->data[e->len++] = 0x83;
        r = kv_cb_obj(e, parent, 1);
        if (r != KV_OK) {
            return r;
        }
        if (kv_reserve(e, n * 9 + 9 + 16) < 0) {
            return KV_ERR;
        }
    }
    kv_cb_head(e, 4, (uint64_t)n);
    w = kv_cb_tokens(e->data + e->len, items, vals, n);
    if (w < 0) {
        return KV_FALLBACK;
    }
    e->len += w;
    if (extra == Py_None) {
        e->data[e->len++] = 0xf6;   /* room: the 16 spare bytes reserved above */
        return KV_OK;
    }
    return kv_cb_obj(e, extra, 1);
}

/* cbor2.dumps(o, canonical=True) */
static int kv_cbor(kv_enc *e, PyObject *o)
{
    PyObject *t;
    int r;
    if (kv_is_block(o, &t)) {
        r = kv_cbor_block(e, PyTuple_GET_ITEM(o, 0), ((PyTupleObject *)t)->ob_item, NULL,
                          PyTuple_GET_SIZE(t), PyTuple_GET_ITEM(o, 2));
        if (r != KV_FALLBACK) {
            return r;
        }
    }
    e->len = 0;
    return kv_cb_obj(e, o, 0);
}

/* ------------------------------------------------------------------ xxh3_raw */

/* parent bytes || int64 little-endian tokens; the caller appends the extra
 * keys.  KV_FALLBACK when a token is not an exact int in int64 range (the
 * caller then converts with operator.index and raises the right error). */
/* n tokens as int64 little-endian at out (8 * n bytes free): 0, or -1 when an
 * item is not an exact int in int64 range. */
static int kv_raw_tokens(unsigned char *KV_RESTRICT out, PyObject *const *KV_RESTRICT items,
                         Py_ssize_t n)
{
    Py_ssize_t i;
    int64_t v;
    for (i = 0; i < n; i++) {
        uint64_t u;
        if (KV_LIKELY(kv_small_token(items[i], &u))) {
            v = (int64_t)u;
        } else if (!kv_exact_int64(items[i], &v)) {
            return -1;
        }
#if PY_LITTLE_ENDIAN
        memcpy(out + 8 * i, &v, 8);
#else
        kv_le64(out + 8 * i, (uint64_t)v);
#endif
    }
    return 0;
}

static int kv_raw_block(kv_enc *e, const char *parent, Py_ssize_t plen,
                        PyObject *const *items, const int64_t *vals, Py_ssize_t n)
{
    unsigned char *p;

    e->len = 0;
    if (n > (PY_SSIZE_T_MAX - plen - 64) / 8 || kv_reserve(e, plen + n * 8 + 16) < 0) {
        if (!PyErr_Occurred()) {
            PyErr_NoMemory();
        }
        return KV_ERR;
    }
    memcpy(e->data, parent, (size_t)plen);
    p = e->data + plen;
    if (vals != NULL) {
#if PY_LITTLE_ENDIAN
        memcpy(p, vals, (size_t)n * 8);
#else
        Py_ssize_t i;
        for (i = 0; i < n; i++) {
            kv_le64(p + 8 * i, (uint64_t)vals[i]);
        }
#endif
    } else if (kv_raw_tokens(p, items, n) < 0) {
        return KV_FALLBACK;
    }
    e->len = plen + n * 8;
    return KV_OK;
}

/* Append the canonical CBOR of o at the end of the buffer. */
static int kv_cbor_append(kv_enc *e, PyObject *o)
{
    Py_ssize_t mark = e->len;
    int r = kv_cb_obj(e, o, 0);
    if (r != KV_OK) {
        e->len = mark;
    }
    return r;
}

/* Append raw bytes. */
static int kv_append(kv_enc *e, const char *s, Py_ssize_t n)
{
    if (kv_reserve(e, n) < 0) {
        return KV_ERR;
    }
    memcpy(e->data + e->len, s, (size_t)n);
    e->len += n;
    return KV_OK;
}

#endif /* KVCY_HASHING_ENC_H */
