/* C helpers of the compiled KV-aware routing index (kvcy/_fast/_kv_index_c.pyx). */
#ifndef KVCY_KV_INDEX_H
#define KVCY_KV_INDEX_H

#include <Python.h>
#include <limits.h>
#include <stdint.h>
#include <string.h>

/* 0: *out holds the int's value; -1: not an unsigned 64-bit value (no error left set). */
static inline int kvcy_kvi_u64(PyObject *o, unsigned long long *out) {
#if ULONG_MAX >= 0xFFFFFFFFFFFFFFFFULL
    unsigned long v = PyLong_AsUnsignedLong(o);
    if (v == (unsigned long)-1 && PyErr_Occurred()) { PyErr_Clear(); return -1; }
#else
    unsigned long long v = PyLong_AsUnsignedLongLong(o);
    if (v == (unsigned long long)-1 && PyErr_Occurred()) { PyErr_Clear(); return -1; }
#endif
    *out = (unsigned long long)v;
    return 0;
}
/* A block hash as a key: 0 for an int in [0, 2**64) (*out holds it), 1 for an exact bytes
 * object (to digest), 2 for an int out of range, 3 for anything else (bool included). */
static inline int kvcy_kvi_read(PyObject *o, unsigned long long *out) {
#if !defined(Py_LIMITED_API) && !defined(PYPY_VERSION) && PY_VERSION_HEX >= 0x030B0000 \
    && PY_VERSION_HEX < 0x030C0000 && PYLONG_BITS_IN_DIGIT == 30
    if (Py_IS_TYPE(o, &PyLong_Type)) {
        const digit *d = ((PyLongObject *)o)->ob_digit;
        switch (Py_SIZE(o)) {
        case 3:
            if (d[2] >> 4) return 2;
            *out = (unsigned long long)d[0] | ((unsigned long long)d[1] << 30) | ((unsigned long long)d[2] << 60);
            return 0;
        case 2: *out = (unsigned long long)d[0] | ((unsigned long long)d[1] << 30); return 0;
        case 1: *out = d[0]; return 0;
        case 0: *out = 0; return 0;
        default: return 2;
        }
    }
#endif
    if (PyBytes_CheckExact(o)) return 1;
    if (!PyLong_Check(o) || PyBool_Check(o)) return 3;
    return kvcy_kvi_u64(o, out) < 0 ? 2 : 0;
}

#if defined(_MSC_VER)
#include <intrin.h>
static inline int kvcy_kvi_ctz(unsigned long long x) { unsigned long i; _BitScanForward64(&i, x); return (int)i; }
#else
static inline int kvcy_kvi_ctz(unsigned long long x) { return __builtin_ctzll(x); }
#endif
#if defined(__GNUC__) || defined(__clang__)
#define kvcy_kvi_prefetch(p) __builtin_prefetch((const void *)(p))
#else
#define kvcy_kvi_prefetch(p) ((void)(p))
#endif
#define KVI_NIL 0xFFFFFFFFu
#define KVI_GOLDEN 0x9E3779B97F4A7C15ull  /* 2**64 / phi */

static inline uint64_t kvcy_kvi_mix(uint64_t x) {  /* MurmurHash3's 64-bit finaliser */
    x ^= x >> 33;
    x *= 0xFF51AFD7ED558CCDull;
    x ^= x >> 33;
    x *= 0xC4CEB9FE1A85EC53ull;
    x ^= x >> 33;
    return x;
}

/* A 64-bit digest of n bytes: the key of a bytes hash (equal keys are then compared in full). */
static inline uint64_t kvcy_kvi_digest(const char *p, Py_ssize_t n) {
    uint64_t h = KVI_GOLDEN ^ (uint64_t)n, w;
    for (; n >= 8; p += 8, n -= 8) {
        memcpy(&w, p, 8);
        h = kvcy_kvi_mix(h ^ w) + 0x2545F4914F6CDD1Dull;
    }
    if (n > 0) {
        w = 0;
        memcpy(&w, p, (size_t)n);
        h = kvcy_kvi_mix(h ^ w ^ ((uint64_t)n << 56));
    }
    return kvcy_kvi_mix(h);
}

/* The first slot to probe in a table of 2**(64 - shift) slots: Fibonacci hashing (the top bits
 * of the key times 2**64 / phi); a bytes hash's digest is salted apart from the ints first. */
static inline Py_ssize_t kvcy_kvi_home(uint64_t key, uint32_t tag, int shift) {
    if (tag) key ^= 0x5851F42D4C957F2Dull;
    return (Py_ssize_t)((key * KVI_GOLDEN) >> shift);
}

/* A slot of the open-addressing tables (linear probing): the hash table (hash -> hid) and the
 * entry table ((hid, medium, instance) -> entry). */
typedef struct {
    uint64_t key;
    uint32_t val;  /* the index (hid or entry) + 1; 0: empty */
    uint32_t tag;  /* hash table: 1 for a bytes hash; entry table: 0 */
} kvi_slot;

/* Put val under key (not in the table) in the first free slot from key's home. */
static inline void kvcy_kvi_slot_put(kvi_slot *slots, Py_ssize_t mask, int shift, uint64_t key, uint32_t tag,
                                     uint32_t val) {
    Py_ssize_t i = kvcy_kvi_home(key, tag, shift);
    while (slots[i].val) i = (i + 1) & mask;
    slots[i].key = key;
    slots[i].tag = tag;
    slots[i].val = val;
}

/* Delete the slot holding val (found from key's home), shifting its followers back so that no
 * probe sequence has a hole (no tombstones). */
static inline void kvcy_kvi_slot_del(kvi_slot *slots, Py_ssize_t mask, int shift, uint64_t key, uint32_t tag,
                                     uint32_t val) {
    Py_ssize_t i = kvcy_kvi_home(key, tag, shift), j, k;
    while (slots[i].val != val) i = (i + 1) & mask;
    for (j = (i + 1) & mask; slots[j].val; j = (j + 1) & mask) {
        k = kvcy_kvi_home(slots[j].key, slots[j].tag, shift);
        /* Slot j stays where it is when its home lies cyclically in (i, j]. */
        if (i <= j ? (i < k && k <= j) : (i < k || k <= j)) continue;
        slots[i] = slots[j];
        i = j;
    }
    slots[i].val = 0;
}

/* An entry's key: (hash id, medium id, instance id). */
static inline uint64_t kvcy_kvi_pack(uint32_t hid, uint32_t mid, uint32_t iid) {
    return ((uint64_t)hid << 24) | ((uint64_t)mid << 16) | (uint64_t)iid;
}

#endif /* KVCY_KV_INDEX_H */
