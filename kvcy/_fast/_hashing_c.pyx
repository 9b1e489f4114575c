"""Compiled twin of the block-hash chain.

Each block is serialised straight into a C buffer, in exactly the bytes that
``pickle.dumps(obj, protocol=5)`` / ``cbor2.dumps(obj, canonical=True)`` write
for ``(parent, tuple(block_tokens), extra_keys)`` (see ``_hashing_enc.h``), and
digested with OpenSSL's SHA-256 / libxxhash's XXH3-128 when the build linked
them (hashlib / the xxhash package otherwise).  Inputs outside the shapes the
C writers know (ints beyond 64 bits, floats, lists, int subclasses, ...) are
serialised by pickle / cbor2 themselves, so every input hashes to the
reference bytes and raises what the reference raises.

Same names, signatures and messages as ``_hashing_py``.
"""

cimport cython
from cpython.buffer cimport PyBUF_C_CONTIGUOUS, PyBUF_FORMAT, PyBuffer_Release, PyObject_CheckBuffer, PyObject_GetBuffer
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize, PyBytes_GET_SIZE
from cpython.list cimport PyList_GET_SIZE
from cpython.tuple cimport PyTuple_GET_SIZE
from cpython.mem cimport PyMem_Free, PyMem_Malloc
from cpython.ref cimport PyObject
from libc.stdint cimport int64_t

import hashlib as _hashlib
import operator as _operator
import pickle as _pickle
import struct as _struct
import sys as _sys

import functools as _functools
import weakref as _weakref

import cbor2 as _cbor2
import xxhash as _xxhash

cdef extern from "Python.h":
    PyObject **PySequence_Fast_ITEMS(object o)

cdef extern from "_hashing_digest.h":
    int KVCY_NATIVE_SHA256
    int KVCY_NATIVE_XXH3
    int kvcy_sha256(const void *data, size_t n, unsigned char *out) noexcept
    int kvcy_xxh3_128(const void *data, size_t n, unsigned char *out) noexcept

cdef extern from "_hashing_enc.h":
    ctypedef struct kv_enc:
        unsigned char *data
        Py_ssize_t len
    int KV_OK
    int KV_FALLBACK
    void kv_enc_init(kv_enc *e) noexcept
    void kv_enc_free(kv_enc *e) noexcept
    int kv_pickle(kv_enc *e, PyObject *o) except -1
    int kv_pickle_block(kv_enc *e, PyObject *parent, PyObject **items, const int64_t *vals,
                        Py_ssize_t n, PyObject *extra) except -1
    int kv_cbor(kv_enc *e, PyObject *o) except -1
    int kv_cbor_block(kv_enc *e, PyObject *parent, PyObject **items, const int64_t *vals,
                      Py_ssize_t n, PyObject *extra) except -1
    int kv_raw_block(kv_enc *e, const char *parent, Py_ssize_t plen, PyObject **items,
                     const int64_t *vals, Py_ssize_t n) except -1
    int kv_cbor_append(kv_enc *e, PyObject *o) except -1
    int kv_append(kv_enc *e, const char *s, Py_ssize_t n) except -1

__all__ = [
    "ALGORITHMS",
    "BACKEND",
    "RequestBlockHasher",
    "block_message",
    "digest",
    "generate_block_hash_extra_keys",
    "hash_blocks",
]

#: Algorithms with a serialise-then-digest recipe that both twins implement.
ALGORITHMS = ("sha256", "sha256_cbor", "xxhash", "xxhash_cbor", "xxh3_raw")

#: Where the digests come from in this build.
BACKEND = {
    "sha256": "openssl" if KVCY_NATIVE_SHA256 else "hashlib",
    "xxh3": "libxxhash" if KVCY_NATIVE_XXH3 else "xxhash-package",
}

cdef enum:
    A_SHA256 = 0
    A_SHA256_CBOR = 1
    A_XXHASH = 2
    A_XXHASH_CBOR = 3
    A_XXH3_RAW = 4

cdef dict _CODES = {name: i for i, name in enumerate(ALGORITHMS)}

# Tags are the interned constants, as in vLLM: pickle writes a second "mm" tag
# of one block as a memo reference.
cdef object _LORA_TAG = _sys.intern("lora")
cdef object _MM_TAG = _sys.intern("mm")
cdef object _SALT_TAG = _sys.intern("cache_salt")
cdef object _EMBEDS_TAG = _sys.intern("prompt_embeds")

cdef object _PICKLE_DUMPS = _pickle.dumps
cdef object _CBOR_DUMPS = _cbor2.dumps
cdef object _SHA256 = _hashlib.sha256
cdef object _XXH3_128 = _xxhash.xxh3_128_digest
cdef int _HIGHEST = _pickle.HIGHEST_PROTOCOL
cdef object _INT64_FORMATS = frozenset(
    ["q", "@q", "=q", "<q"] + (["l", "@l"] if _struct.calcsize("l") == 8 else [])
)
cdef bint _LITTLE = _sys.byteorder == "little"


cdef int _code_of(object algo) except -1:
    code = _CODES.get(algo) if isinstance(algo, str) else None
    if code is None:
        raise ValueError(f"unknown hash algorithm {algo!r}; expected one of {ALGORITHMS}")
    return code


# --------------------------------------------------------------------------- digests
cdef inline bint _is_sha(int code) noexcept:
    return code == A_SHA256 or code == A_SHA256_CBOR


cdef inline object _digest_raw(int code, const unsigned char *data, Py_ssize_t n):
    cdef unsigned char out[32]
    if _is_sha(code):
        if KVCY_NATIVE_SHA256 and kvcy_sha256(data, <size_t>n, out) == 0:
            return PyBytes_FromStringAndSize(<char *>out, 32)
        return _SHA256(PyBytes_FromStringAndSize(<char *>data, n)).digest()
    if KVCY_NATIVE_XXH3 and kvcy_xxh3_128(data, <size_t>n, out) == 0:
        return PyBytes_FromStringAndSize(<char *>out, 16)
    return _XXH3_128(PyBytes_FromStringAndSize(<char *>data, n))


cdef object _digest_bytes(int code, bytes msg):
    return _digest_raw(code, <const unsigned char *>PyBytes_AS_STRING(msg), PyBytes_GET_SIZE(msg))


cdef bytes _reference_message(int code, object obj):
    """The generic serialisation: what the reference recipe hashes."""
    if code == A_SHA256 or code == A_XXHASH:
        return _PICKLE_DUMPS(obj, protocol=_HIGHEST)
    return _CBOR_DUMPS(obj, canonical=True)


# --------------------------------------------------------------------------- xxh3_raw
def _raw_tokens(tokens):
    """Token ids as int64 little-endian bytes (``operator.index`` semantics)."""
    try:
        return _struct.pack(f"<{len(tokens)}q", *tokens)
    except _struct.error:
        pass
    out = bytearray()
    for t in tokens:
        v = _operator.index(t)
        if not -(1 << 63) <= v < (1 << 63):
            raise ValueError(f"token id {v} does not fit in a signed 64-bit integer")
        out += v.to_bytes(8, "little", signed=True)
    return bytes(out)


cdef int _check_raw_parent(object parent) except -1:
    if not isinstance(parent, bytes):
        raise TypeError(f"xxh3_raw: parent must be bytes, got {type(parent).__name__}")
    return 0


cdef int _check_raw_keys(object keys) except -1:
    if keys is not None and not isinstance(keys, (tuple, list)):
        raise TypeError(
            f"xxh3_raw: extra_keys must be None, a tuple or a list, got {type(keys).__name__}"
        )
    return 0


cdef int _raw_message(kv_enc *e, object parent, object seq, Py_ssize_t lo, Py_ssize_t n,
                      const int64_t *vals, object keys) except -1:
    """parent || int64le(tokens) || canonical CBOR of keys (nothing when None), into e.

    ``parent`` is bytes (checked by the caller); the tokens are ``vals[lo:lo+n]``
    when ``vals`` is set, else ``seq[lo:lo+n]`` (a list or tuple).
    """
    cdef int r
    cdef PyObject **items = NULL
    cdef bytes tb, cb
    _check_raw_keys(keys)
    if vals != NULL:
        r = kv_raw_block(e, PyBytes_AS_STRING(parent), PyBytes_GET_SIZE(parent), NULL, vals + lo, n)
    else:
        items = PySequence_Fast_ITEMS(seq) + lo
        r = kv_raw_block(e, PyBytes_AS_STRING(parent), PyBytes_GET_SIZE(parent), items, NULL, n)
    if r != KV_OK:
        tb = _raw_tokens(seq[lo:lo + n])
        e.len = 0
        kv_append(e, PyBytes_AS_STRING(parent), PyBytes_GET_SIZE(parent))
        kv_append(e, PyBytes_AS_STRING(tb), PyBytes_GET_SIZE(tb))
    if keys is not None:
        r = kv_cbor_append(e, <PyObject *>keys)
        if r != KV_OK:
            cb = _CBOR_DUMPS(keys, canonical=True)
            kv_append(e, PyBytes_AS_STRING(cb), PyBytes_GET_SIZE(cb))
    return 0


# --------------------------------------------------------------------------- one object
cdef int _encode_obj(kv_enc *e, int code, object obj) except -1:
    """Serialise obj for code into e; returns KV_OK or KV_FALLBACK."""
    cdef object seq
    if code == A_SHA256 or code == A_XXHASH:
        return kv_pickle(e, <PyObject *>obj)
    if code == A_SHA256_CBOR or code == A_XXHASH_CBOR:
        return kv_cbor(e, <PyObject *>obj)
    # xxh3_raw
    if isinstance(obj, str):
        b = (<str>obj).encode("utf-8")
        e.len = 0
        kv_append(e, PyBytes_AS_STRING(b), PyBytes_GET_SIZE(b))
        return KV_OK
    if isinstance(obj, bytes):
        e.len = 0
        kv_append(e, PyBytes_AS_STRING(obj), PyBytes_GET_SIZE(obj))
        return KV_OK
    if isinstance(obj, tuple) and len(<tuple>obj) == 3:
        parent, tokens, keys = <tuple>obj
        _check_raw_parent(parent)
        seq = tokens if type(tokens) is list or type(tokens) is tuple else list(tokens)
        _raw_message(e, parent, seq, 0, len(seq), NULL, keys)
        return KV_OK
    raise TypeError(
        "xxh3_raw hashes str, bytes or (parent, token_ids, extra_keys) tuples, "
        f"got {type(obj).__name__}"
    )


def digest(algo, obj):
    """Hash one object with ``algo`` (one of :data:`ALGORITHMS`)."""
    cdef int code = _code_of(algo)
    cdef kv_enc enc
    cdef int r
    kv_enc_init(&enc)
    try:
        r = _encode_obj(&enc, code, obj)
        if r == KV_OK:
            return _digest_raw(code, enc.data, enc.len)
    finally:
        kv_enc_free(&enc)
    return _digest_bytes(code, _reference_message(code, obj))


def block_message(algo, parent, token_ids, extra_keys=None):
    """The exact bytes that ``algo`` digests for one block.

    ``pickle.dumps((parent, tuple(token_ids), extra_keys), protocol=5)`` for
    sha256 / xxhash, the canonical CBOR of that triple for the ``_cbor``
    algorithms, and the xxh3_raw message (docs/hashing.md) for ``xxh3_raw``.
    """
    cdef int code = _code_of(algo)
    cdef kv_enc enc
    cdef int r
    if code == A_XXH3_RAW:
        _check_raw_parent(parent)
    seq = token_ids if type(token_ids) is list or type(token_ids) is tuple else list(token_ids)
    kv_enc_init(&enc)
    try:
        r = _encode_block(&enc, code, parent, seq, 0, len(seq), NULL, extra_keys)
        if r == KV_OK:
            return PyBytes_FromStringAndSize(<char *>enc.data, enc.len)
    finally:
        kv_enc_free(&enc)
    return _reference_message(code, (parent, tuple(seq), extra_keys))


# --------------------------------------------------------------------------- the chain
cdef inline int _encode_block(kv_enc *e, int code, object parent, object seq, Py_ssize_t lo,
                              Py_ssize_t n, const int64_t *vals, object keys) except -1:
    cdef PyObject **items = NULL
    cdef const int64_t *v = NULL
    if vals != NULL:
        v = vals + lo
    else:
        items = PySequence_Fast_ITEMS(seq) + lo
    if code == A_SHA256 or code == A_XXHASH:
        return kv_pickle_block(e, <PyObject *>parent, items, v, n, <PyObject *>keys)
    if code == A_SHA256_CBOR or code == A_XXHASH_CBOR:
        return kv_cbor_block(e, <PyObject *>parent, items, v, n, <PyObject *>keys)
    _raw_message(e, parent, seq, lo, n, vals, keys)
    return KV_OK


cdef list _chain(int code, object parent, object seq, const int64_t *vals, Py_ssize_t start,
                 Py_ssize_t num_blocks, Py_ssize_t block_size, tuple extras):
    """Hash num_blocks blocks of seq (a list or tuple; or vals, an int64 array).

    The caller has checked the bounds.  A list is re-checked before each block:
    the generic fallback runs Python code that could shrink it.
    """
    cdef kv_enc enc
    cdef list out = [None] * num_blocks
    cdef Py_ssize_t i, lo
    cdef int r
    cdef bint is_list = vals == NULL and type(seq) is list
    cdef object keys = None
    cdef object h
    if code == A_XXH3_RAW:
        _check_raw_parent(parent)
    kv_enc_init(&enc)
    try:
        for i in range(num_blocks):
            lo = start + i * block_size
            if extras is not None:
                keys = extras[i]
            if is_list and PyList_GET_SIZE(seq) < lo + block_size:
                raise RuntimeError("token_ids changed size while its blocks were hashed")
            r = _encode_block(&enc, code, parent, seq, lo, block_size, vals, keys)
            if r == KV_OK:
                h = _digest_raw(code, enc.data, enc.len)
            else:
                h = _digest_bytes(
                    code, _reference_message(code, (parent, tuple(seq[lo:lo + block_size]), keys))
                )
            out[i] = h
            parent = h
    finally:
        kv_enc_free(&enc)
    return out


cdef inline bint _int64_view(object obj, Py_buffer *view, Py_ssize_t need) except -1:
    """A C-contiguous native int64 buffer of obj with >= need items; False (none held) otherwise."""
    if not _LITTLE or not PyObject_CheckBuffer(obj):
        return False
    try:
        PyObject_GetBuffer(obj, view, PyBUF_FORMAT | PyBUF_C_CONTIGUOUS)
    except (BufferError, TypeError, ValueError):
        return False
    if view.ndim != 1 or view.itemsize != 8 or view.format == NULL or view.len < need * 8 or (
        (<bytes>view.format).decode("ascii", "replace") not in _INT64_FORMATS
    ):
        PyBuffer_Release(view)
        return False
    return True


def hash_blocks(
    algo,
    parent,
    token_ids,
    Py_ssize_t start,
    Py_ssize_t num_blocks,
    Py_ssize_t block_size,
    extra_keys=None,
):
    """Hash ``num_blocks`` full blocks of ``token_ids`` starting at ``start``.

    Args:
        algo: one of :data:`ALGORITHMS`.
        parent: the hash of the block before ``start`` (``NONE_HASH`` for the first).
        token_ids: the request's tokens; ``start + num_blocks * block_size``
            must not exceed its length.
        start: index of the first token of the first block to hash.
        num_blocks: how many blocks to hash.
        block_size: tokens per block (> 0).
        extra_keys: ``None`` (no extra keys for any block) or one entry per
            block, each ``None`` or a tuple of tagged keys.

    Returns:
        The new block hashes, in order.
    """
    cdef int code = _code_of(algo)
    cdef Py_buffer view
    cdef tuple extras = None
    if block_size <= 0:
        raise ValueError(f"block_size must be positive, got {block_size}")
    cdef Py_ssize_t ntok = len(token_ids)
    if start < 0 or num_blocks < 0 or start > ntok or num_blocks > (ntok - start) // block_size:
        end = <object>start + <object>num_blocks * <object>block_size
        raise ValueError(f"blocks [{start}, {end}) are outside the {ntok} tokens given")
    if extra_keys is not None:
        if len(extra_keys) != num_blocks:
            raise ValueError(f"extra_keys has {len(extra_keys)} entries for {num_blocks} blocks")
        extras = tuple(extra_keys)
    if num_blocks == 0:
        return []
    if type(token_ids) is list or type(token_ids) is tuple:
        return _chain(code, parent, token_ids, NULL, start, num_blocks, block_size, extras)
    if code == A_XXH3_RAW and _int64_view(token_ids, &view, start + num_blocks * block_size):
        try:
            return _chain(code, parent, None, <const int64_t *>view.buf, start, num_blocks,
                          block_size, extras)
        finally:
            PyBuffer_Release(&view)
    # Any other sequence: its items, exactly as the reference's tuple(token_ids[lo:hi]).
    seq = list(token_ids[start:start + num_blocks * block_size])
    return _chain(code, parent, seq, NULL, 0, num_blocks, block_size, extras)


# --------------------------------------------------------------------------- extra keys
cdef list _prompt_embeds_key(object request, Py_ssize_t start, Py_ssize_t end):
    # vLLM slices the embeddings without clamping: a block past the prompt
    # hashes the empty slice (and still carries the key).
    embeds = request.prompt_embeds
    if embeds is None:
        return []
    chunk = embeds[start:end]
    try:
        raw = chunk.detach().flatten().cpu().contiguous().view(_torch_uint8()).numpy().tobytes()
    except AttributeError:  # not a tensor: anything with the buffer protocol
        raw = bytes(memoryview(chunk))
    return [(_EMBEDS_TAG, _SHA256(raw).digest())]


cdef object _torch_uint8():
    # Imported lazily: torch is optional, and only tensors reach this.
    import torch

    return torch.uint8


cdef Py_ssize_t _first_live_mm_idx(object features, Py_ssize_t pos) except -1:
    """Index of the first multimodal item that ends after token ``pos``.

    It is where the walk over a request's items stands once every block
    ending at ``pos`` is hashed, so a hasher call that starts there resumes
    the walk exactly where hashing the whole request at once would be.
    """
    cdef Py_ssize_t idx = 0
    cdef Py_ssize_t n = len(features) if features else 0
    while idx < n:
        p = features[idx].mm_position
        if p.offset + p.length > pos:
            break
        idx += 1
    return idx


cdef Py_ssize_t _rewind_mm_idx(object features, Py_ssize_t mm_idx, Py_ssize_t end) except -1:
    """Step back over the items before ``mm_idx`` that reach past ``end``.

    With lookahead a block's keys cover ``[start, end + lookahead)``, which
    walks past items that the next block (starting at ``end``) still overlaps.
    """
    while mm_idx > 0:
        p = features[mm_idx - 1].mm_position
        if p.offset + p.length <= end:
            break
        mm_idx -= 1
    return mm_idx


cdef Py_ssize_t _resume_mm_idx(object features, Py_ssize_t start, Py_ssize_t lookahead) except -1:
    """Where the walk over the items stands when the block at ``start`` is hashed."""
    if start == 0 or not features:
        return 0
    last = features[len(features) - 1].mm_position
    if last.offset + last.length <= start:
        return len(features)  # every item is over (decode): nothing to scan
    if not lookahead:
        return _first_live_mm_idx(features, start)
    return _rewind_mm_idx(features, _first_live_mm_idx(features, start + lookahead), start)


cdef tuple _mm_extra_keys(object request, Py_ssize_t start, Py_ssize_t end, object start_mm_idx):
    features = request.mm_features
    cdef list keys = []
    if not features:
        return keys, start_mm_idx
    last = features[len(features) - 1]
    if last.mm_position.offset + last.mm_position.length <= start:
        return keys, start_mm_idx
    if start_mm_idx < 0:
        start_mm_idx = max(0, len(features) + start_mm_idx)
    idx = start_mm_idx
    n = len(features)
    while idx < n:
        pos = features[idx].mm_position
        offset, length = pos.offset, pos.length
        if end > offset:
            if start >= offset + length:
                # This item ended before the block: move on.
                idx += 1
                continue
            keys.append((_MM_TAG, features[idx].identifier, offset - start))
            if end >= offset + length:
                # The item ends inside this block; the next may start here too.
                idx += 1
            else:
                # The item spills into the next block.
                break
        else:
            break
    return keys, idx


def generate_block_hash_extra_keys(request, start_token_idx, end_token_idx, start_mm_idx):
    """This twin's :func:`kvcy.hashing.generate_block_hash_extra_keys` (documented there)."""
    cdef list keys = []
    lora = request.lora_request
    if lora is not None:
        keys.append((_LORA_TAG, lora.lora_name, lora.lora_path))
    mm_keys, next_mm_idx = _mm_extra_keys(request, start_token_idx, end_token_idx, start_mm_idx)
    keys.extend(mm_keys)
    if start_token_idx == 0 and request.cache_salt:
        keys.append((_SALT_TAG, request.cache_salt))
    if request.prompt_embeds is not None:
        keys.extend(_prompt_embeds_key(request, start_token_idx, end_token_idx))
    return (tuple(keys) if keys else None), next_mm_idx


cdef inline bint _small_int(object x):
    return type(x) is int and -(1 << 60) < x < (1 << 60)


cdef dict _FROZEN = {}  # type -> whether it is itself a frozen dataclass


cdef bint _is_frozen(object t) except -1:
    """Whether instances of ``t`` keep their fields: ``t`` is itself a frozen dataclass."""
    r = _FROZEN.get(t)
    if r is None:
        params = t.__dict__.get("__dataclass_params__")
        r = params is not None and getattr(params, "frozen", False) is True
        _FROZEN[t] = r
    return r


@cython.final
cdef class _MMPositions:
    """A request's multimodal placeholder positions as C arrays, parsed once.

    The hasher keeps one per living request whose items are still open where
    a call resumes (a prompt whose blocks complete one call at a time), and
    uses it again only while ``request.mm_features`` is the same list or tuple
    holding the same items, each item's ``mm_position`` a frozen dataclass of
    ints.  Items of a type that is not itself a frozen dataclass (vLLM's
    ``MultiModalFeatureSpec``) are also checked to hold the same
    ``mm_position`` and ``identifier`` objects.  Anything else changed: parsed
    again.
    """

    cdef object features     # the list or tuple parsed
    cdef tuple items         # its items then
    cdef tuple positions     # their mm_position objects
    cdef tuple ids           # their identifiers
    cdef bint check_attrs    # an item type whose fields can be reassigned
    cdef bint cacheable      # every position a frozen dataclass, features a list or tuple
    cdef Py_ssize_t n
    cdef Py_ssize_t *offs
    cdef Py_ssize_t *lens
    cdef Py_ssize_t *reach   # reach[i]: the furthest end among items 0..i (non-decreasing)
    cdef object ref          # weakref to the request, once kept

    def __dealloc__(self):
        PyMem_Free(self.offs)
        PyMem_Free(self.lens)
        PyMem_Free(self.reach)

    cdef bint matches(self, object features) except -1:
        cdef Py_ssize_t i
        cdef PyObject **now
        cdef PyObject **then
        if features is not self.features or len(features) != self.n:
            return False
        now = PySequence_Fast_ITEMS(features)
        then = PySequence_Fast_ITEMS(self.items)
        for i in range(self.n):
            if now[i] != then[i]:
                return False
        if self.check_attrs:
            for i in range(self.n):
                f = <object>then[i]  # (the kept tuple: reading attributes cannot free it)
                if f.mm_position is not self.positions[i] or f.identifier is not self.ids[i]:
                    return False
        return True

    cdef Py_ssize_t first_open(self, Py_ssize_t pos) noexcept:
        """Index of the first item that ends after ``pos`` (``n``: none)."""
        cdef Py_ssize_t lo = 0, hi = self.n, mid
        while lo < hi:
            mid = (lo + hi) >> 1
            if self.reach[mid] > pos:
                hi = mid
            else:
                lo = mid + 1
        return lo


cdef _MMPositions _parse_positions(object features):
    """The positions of a list or tuple of items; None for anything the C walk does not
    read (another sequence type, a position that is not a small int)."""
    if type(features) is not list and type(features) is not tuple:
        return None
    cdef tuple items = tuple(features)
    cdef Py_ssize_t n = PyTuple_GET_SIZE(items), i, end, top = 0
    cdef _MMPositions p = _MMPositions.__new__(_MMPositions)
    p.offs = <Py_ssize_t *>PyMem_Malloc(n * sizeof(Py_ssize_t) + 1)
    p.lens = <Py_ssize_t *>PyMem_Malloc(n * sizeof(Py_ssize_t) + 1)
    p.reach = <Py_ssize_t *>PyMem_Malloc(n * sizeof(Py_ssize_t) + 1)
    if p.offs == NULL or p.lens == NULL or p.reach == NULL:
        raise MemoryError()
    cdef list positions = [None] * n
    cdef list ids = [None] * n
    cdef bint check = False, cacheable = True
    for i in range(n):
        f = items[i]
        pos = f.mm_position
        offset = pos.offset
        length = pos.length
        if not (_small_int(offset) and _small_int(length)):
            return None
        ident = f.identifier
        p.offs[i] = offset
        p.lens[i] = length
        end = p.offs[i] + p.lens[i]
        if i == 0 or end > top:
            top = end
        p.reach[i] = top
        positions[i] = pos
        ids[i] = ident
        if not _is_frozen(type(pos)):
            cacheable = False
        if not _is_frozen(type(f)):
            check = True
    p.features = features
    p.items = items
    p.positions = tuple(positions)
    p.ids = tuple(ids)
    p.check_attrs = check
    p.cacheable = cacheable
    p.n = n
    return p


def _forget(dict kept, object key, object ref):
    # A request's weakref callback: drop its positions (unless replaced since).
    entry = kept.get(key)
    if entry is not None and (<_MMPositions>entry).ref is ref:
        del kept[key]


cdef _MMPositions _positions_of(dict kept, object request, object features, bint keep):
    """``features``' positions: the kept ones while they still match, else parsed (and
    kept when ``keep``, the request takes a weakref and they can be); None when the C
    walk cannot read them.  ``kept`` is the hasher's: id(request) -> _MMPositions."""
    cdef _MMPositions p
    key = id(request)
    entry = kept.get(key)
    if entry is not None:
        p = <_MMPositions>entry
        if p.ref() is request and p.matches(features):
            return p
        del kept[key]
    p = _parse_positions(features)
    if p is None or not keep or not p.cacheable:
        return p
    try:
        p.ref = _weakref.ref(request, _functools.partial(_forget, kept, key))
    except TypeError:  # no weak references to it: parsed on every call
        return p
    kept[key] = p
    return p


cdef tuple _request_extra_keys(dict kept, object request, object tokens, Py_ssize_t start,
                               Py_ssize_t num_blocks, Py_ssize_t block_size, Py_ssize_t lookahead):
    """Per-block extra keys of num_blocks blocks from start; None when no block has any.

    The same keys as generate_block_hash_extra_keys block by block, built
    without re-reading the request per block: the LoRA key tuple is shared by
    every block (one block's pickle never sees it twice), the mm positions are
    read once (and kept for the next call while the items stay open).
    """
    lora = request.lora_request
    features = request.mm_features
    salt = request.cache_salt
    embeds = request.prompt_embeds
    if lora is None and not features and not salt and embeds is None and not lookahead:
        return None
    cdef Py_ssize_t nmm = len(features) if features else 0
    cdef Py_ssize_t i, lo, hi, idx, mm_idx = 0
    cdef _MMPositions p = None
    if nmm:
        last = features[nmm - 1].mm_position
        if last.offset + last.length <= start:
            # Every item ended before the first block, so none enters any
            # block's keys (vLLM's early exit): skip reading them (decode).
            nmm = 0
            if lora is None and embeds is None and not lookahead:
                return None
        elif not lookahead and embeds is None:
            p = _positions_of(kept, request, features, start > 0)
    cdef list out = []
    cdef list keys
    cdef object lora_key = None
    cdef tuple base = None
    cdef bint salted = bool(salt)
    if lookahead or embeds is not None or nmm and p is None:
        # Lookahead or unusual inputs: the block-by-block recipe.
        mm_obj = _resume_mm_idx(features, start, lookahead)
        for i in range(num_blocks):
            lo = start + i * block_size
            hi = lo + block_size
            if lookahead:
                k, mm_obj = generate_block_hash_extra_keys(request, lo, hi + lookahead, mm_obj)
                if nmm:
                    mm_obj = _rewind_mm_idx(features, mm_obj, hi)
                k = (k, *tokens[hi:hi + lookahead])
            else:
                k, mm_obj = generate_block_hash_extra_keys(request, lo, hi, mm_obj)
            out.append(k)
        return tuple(out)
    if lora is not None:
        lora_key = (_LORA_TAG, lora.lora_name, lora.lora_path)
        base = (lora_key,)
    cdef Py_ssize_t *offs = NULL
    cdef Py_ssize_t *lens = NULL
    cdef tuple ids = None
    if p is not None:
        nmm = p.n
        offs = p.offs
        lens = p.lens
        ids = p.ids
        # Resume the walk at the first item still open at start: the item
        # the previous call stopped at may be a later one.
        mm_idx = p.first_open(start)
    for i in range(num_blocks):
        lo = start + i * block_size
        hi = lo + block_size
        keys = None
        if nmm and not (offs[nmm - 1] + lens[nmm - 1] <= lo):
            idx = mm_idx
            while idx < nmm:
                if hi > offs[idx]:
                    if lo >= offs[idx] + lens[idx]:
                        idx += 1
                        continue
                    if keys is None:
                        keys = [lora_key] if lora_key is not None else []
                    keys.append((_MM_TAG, ids[idx], offs[idx] - lo))
                    if hi >= offs[idx] + lens[idx]:
                        idx += 1
                    else:
                        break
                else:
                    break
            mm_idx = idx
        if lo == 0 and salted:
            if keys is None:
                keys = [lora_key] if lora_key is not None else []
            keys.append((_SALT_TAG, salt))
        out.append(base if keys is None else tuple(keys))
    return tuple(out)


@cython.final
cdef class RequestBlockHasher:
    """Hashes a request's not-yet-hashed full blocks (``kvcy.Request`` calls it).

    ``algo`` is one of :data:`ALGORITHMS`, or ``None`` with ``hash_fn`` set for
    any other hash function (then each block is ``hash_fn((parent,
    tuple(tokens), extra_keys))``).  ``none_hash`` is a callable returning the
    current ``NONE_HASH``; it is read when a request's first block is hashed.
    With ``num_hash_lookahead_tokens`` (L) > 0 a block is hashed only once the
    L tokens after it exist, and its extra keys become ``(E, *those tokens)``
    where ``E`` are the keys of the block and those tokens together.
    """

    cdef readonly Py_ssize_t block_size
    cdef readonly object algo
    cdef readonly object hash_fn
    cdef readonly Py_ssize_t num_hash_lookahead_tokens
    cdef object _none_hash
    cdef int _code
    cdef dict _positions  # id(request) -> _MMPositions, while the request lives


    def __init__(self, block_size, algo, none_hash, hash_fn=None, num_hash_lookahead_tokens=0):
        if isinstance(block_size, bool) or not isinstance(block_size, int) or block_size <= 0:
            raise ValueError(f"block_size must be a positive int, got {block_size!r}")
        lookahead = num_hash_lookahead_tokens
        if not isinstance(lookahead, int) or lookahead < 0:  # (a bool counts as 0 or 1, as in vLLM)
            raise ValueError(f"num_hash_lookahead_tokens must be a non-negative int, got {lookahead!r}")
        lookahead = int(lookahead)
        if algo is None:
            if not callable(hash_fn):
                raise ValueError("hash_fn must be callable when algo is None")
            self._code = -1
        else:
            self._code = _code_of(algo)
        self.block_size = block_size
        self.algo = algo
        self.hash_fn = hash_fn
        self.num_hash_lookahead_tokens = lookahead
        self._none_hash = none_hash
        self._positions = {}

    def __call__(self, request):
        cdef Py_ssize_t bs = self.block_size
        cdef Py_ssize_t lookahead = self.num_hash_lookahead_tokens
        hashes = request.block_hashes
        cdef Py_ssize_t nh = len(hashes)
        cdef Py_ssize_t start = nh * bs
        cdef Py_ssize_t num_tokens = request.num_tokens
        if num_tokens - lookahead - start < bs:
            return []
        cdef Py_ssize_t num_blocks = (num_tokens - lookahead - start) // bs
        parent = hashes[nh - 1] if nh else None
        if not parent:
            parent = self._none_hash()
        tokens = request.all_token_ids
        if len(tokens) < num_tokens:
            raise RuntimeError(
                f"request.all_token_ids has {len(tokens)} tokens, num_tokens says {num_tokens}"
            )
        extras = _request_extra_keys(self._positions, request, tokens, start, num_blocks, bs, lookahead)
        if self._code >= 0:
            if type(tokens) is list or type(tokens) is tuple:
                return _chain(self._code, parent, tokens, NULL, start, num_blocks, bs, extras)
            return hash_blocks(self.algo, parent, tokens, start, num_blocks, bs, extras)
        cdef list out = []
        cdef Py_ssize_t i, lo
        fn = self.hash_fn
        for i in range(num_blocks):
            lo = start + i * bs
            if not parent:
                parent = self._none_hash()
            parent = fn((parent, tuple(tokens[lo:lo + bs]), None if extras is None else extras[i]))
            out.append(parent)
        return out

    def __reduce__(self):
        # The constructor's arguments: the positions kept for live requests stay behind.
        return (
            RequestBlockHasher,
            (self.block_size, self.algo, self._none_hash, self.hash_fn, self.num_hash_lookahead_tokens),
        )

    def __repr__(self):
        return (
            f"RequestBlockHasher(block_size={self.block_size}, algo={self.algo!r}, "
            f"num_hash_lookahead_tokens={self.num_hash_lookahead_tokens})"
        )
