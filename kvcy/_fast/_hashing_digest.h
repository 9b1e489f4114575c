/* Digest back-ends for kvcy._fast._hashing_c.
 *
 * SHA-256 comes from OpenSSL's libcrypto when the build found its headers
 * (setup.py defines KVCY_HAVE_OPENSSL and links -lcrypto); XXH3-128 from the
 * system's libxxhash when the build found xxhash.h (KVCY_HAVE_XXHASH,
 * -lxxhash).  Without them the module still compiles: KVCY_NATIVE_SHA256 /
 * KVCY_NATIVE_XXH3 are 0 and the Cython code digests through hashlib and the
 * xxhash package instead (same bytes, slower).
 */
#ifndef KVCY_HASHING_DIGEST_H
#define KVCY_HASHING_DIGEST_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

/* ------------------------------------------------------------------ SHA-256 */
#if defined(KVCY_HAVE_OPENSSL)
/* SHA256_Init/Update/Final are "deprecated" in OpenSSL 3 but are the fast
 * path: the one-shot SHA256() and EVP_Digest() go through a provider fetch on
 * every call (~0.3 us).  A libcrypto built without the deprecated API gets
 * EVP_Digest instead. */
#  ifndef OPENSSL_SUPPRESS_DEPRECATED
#    define OPENSSL_SUPPRESS_DEPRECATED 1
#  endif
#  include <openssl/opensslv.h>
#  include <openssl/sha.h>
#  if defined(OPENSSL_NO_DEPRECATED_3_0)
#    include <openssl/evp.h>
#    define KVCY_SHA256_VIA_EVP 1
#  endif
#  define KVCY_NATIVE_SHA256 1
#else
#  define KVCY_NATIVE_SHA256 0
#endif

/* Returns 0 on success, -1 when no native SHA-256 is compiled in (or EVP failed). */
static inline int kvcy_sha256(const void *data, size_t len, unsigned char *out32)
{
#if defined(KVCY_HAVE_OPENSSL) && !defined(KVCY_SHA256_VIA_EVP)
    SHA256_CTX ctx;
    SHA256_Init(&ctx);
    SHA256_Update(&ctx, data, len);
    SHA256_Final(out32, &ctx);
    return 0;
#elif defined(KVCY_HAVE_OPENSSL)
    unsigned int n = 0;
    return EVP_Digest(data, len, out32, &n, EVP_sha256(), NULL) == 1 ? 0 : -1;
#else
    (void)data; (void)len; (void)out32;
    return -1;
#endif
}

/* ------------------------------------------------------------------ XXH3-128 */
#if defined(KVCY_HAVE_XXHASH)
/* libxxhash's header-only mode: the XXH3 code is inlined into this module
 * (short inputs are a handful of multiplies; a call into the shared library
 * costs about as much).  The module is still linked with -lxxhash. */
#  ifndef KVCY_XXH_NO_INLINE
#    define XXH_INLINE_ALL 1
#  endif
#  include <xxhash.h>
#  if defined(XXH_VERSION_NUMBER) && XXH_VERSION_NUMBER >= 800
#    define KVCY_NATIVE_XXH3 1
#  else
#    define KVCY_NATIVE_XXH3 0   /* XXH3 was experimental before 0.8.0 */
#  endif
#else
#  define KVCY_NATIVE_XXH3 0
#endif

/* The 16-byte canonical (big-endian) form, the same bytes as
 * xxhash.xxh3_128_digest().  Returns 0 on success, -1 when not compiled in. */
static inline int kvcy_xxh3_128(const void *data, size_t len, unsigned char *out16)
{
#if KVCY_NATIVE_XXH3
    XXH128_hash_t h = XXH3_128bits(data, len);
    XXH128_canonical_t c;
    XXH128_canonicalFromHash(&c, h);
    memcpy(out16, c.digest, 16);
    return 0;
#else
    (void)data; (void)len; (void)out16;
    return -1;
#endif
}

#endif /* KVCY_HASHING_DIGEST_H */
