/* C helpers of the compiled KV-aware routing index (kvcy/_fast/_kv_index_c.pyx). */
#ifndef KVCY_KV_INDEX_H
#define KVCY_KV_INDEX_H

#include <Python.h>
#include <limits.h>
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
#if defined(_MSC_VER)
#include <intrin.h>
static inline int kvcy_kvi_ctz(unsigned long long x) { unsigned long i; _BitScanForward64(&i, x); return (int)i; }
#else
static inline int kvcy_kvi_ctz(unsigned long long x) { return __builtin_ctzll(x); }
#endif
#define KVI_NIL 0xFFFFFFFFu
#define KVI_BYTES_SALT 0x9E3779B97F4A7C15ull
#define KVI_MIN_SLOTS 16
#define KVI_MIX1 0xFF51AFD7ED558CCDull
#define KVI_MIX2 0xC4CEB9FE1A85EC53ull
#define KVI_MIX3 0x2545F4914F6CDD1Dull

#endif /* KVCY_KV_INDEX_H */
