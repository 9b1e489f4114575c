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
#define KVI_BYTES_SALT 0x9E3779B97F4A7C15ull
#define KVI_MIX1 0xFF51AFD7ED558CCDull
#define KVI_MIX2 0xC4CEB9FE1A85EC53ull
#define KVI_MIX3 0x2545F4914F6CDD1Dull
#define KVI_GOLDEN 0x9E3779B97F4A7C15ull

#endif /* KVCY_KV_INDEX_H */
