"""Pure-Python twin of the block-hash chain (the reference recipe).

``hash_blocks`` hashes ``num_blocks`` consecutive full blocks of a token list,
chaining each block's digest into the next one, exactly as vLLM does:
``hash_fn((parent, tuple(block_tokens), extra_keys))`` with ``hash_fn`` one of
SHA-256 / XXH3-128 over ``pickle.dumps`` / canonical ``cbor2.dumps``, or
``xxh3_raw`` (XXH3-128 over a fixed-width encoding, see docs/hashing.md).
:class:`RequestBlockHasher` is vLLM's request block hasher, block by block.
"""

from __future__ import annotations

import hashlib
import operator
import pickle
import struct
import sys
from collections.abc import Callable, Sequence
from typing import Any

import cbor2
import xxhash

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

#: Where the digests come from in this twin.
BACKEND = {"sha256": "hashlib", "xxh3": "xxhash-package"}

# Tags are the interned constants, as in vLLM: pickle writes a second "mm" tag
# of one block as a memo reference.
_LORA_TAG = sys.intern("lora")
_MM_TAG = sys.intern("mm")
_SALT_TAG = sys.intern("cache_salt")
_EMBEDS_TAG = sys.intern("prompt_embeds")


# --------------------------------------------------------------------------- xxh3_raw
def _raw_tokens(tokens: Sequence[Any]) -> bytes:
    """Token ids as int64 little-endian bytes (``operator.index`` semantics)."""
    try:
        return struct.pack(f"<{len(tokens)}q", *tokens)
    except struct.error:
        pass
    out = bytearray()
    for t in tokens:
        v = operator.index(t)
        if not -(1 << 63) <= v < (1 << 63):
            raise ValueError(f"token id {v} does not fit in a signed 64-bit integer")
        out += v.to_bytes(8, "little", signed=True)
    return bytes(out)


def _check_raw_parent(parent: Any) -> None:
    if not isinstance(parent, bytes):
        raise TypeError(f"xxh3_raw: parent must be bytes, got {type(parent).__name__}")


def _raw_message(parent: bytes, tokens: Sequence[Any], keys: Any) -> bytes:
    """parent || int64le(tokens) || canonical CBOR of keys (nothing when None)."""
    _check_raw_parent(parent)
    if keys is not None and not isinstance(keys, (tuple, list)):
        raise TypeError(
            f"xxh3_raw: extra_keys must be None, a tuple or a list, got {type(keys).__name__}"
        )
    msg = parent + _raw_tokens(tokens)
    if keys is not None:
        msg += cbor2.dumps(keys, canonical=True)
    return msg


def _raw_object(obj: Any) -> bytes:
    if isinstance(obj, str):
        return obj.encode("utf-8")
    if isinstance(obj, bytes):
        return obj
    if isinstance(obj, tuple) and len(obj) == 3:
        parent, tokens, keys = obj
        _check_raw_parent(parent)
        return _raw_message(parent, tokens if isinstance(tokens, (list, tuple)) else list(tokens), keys)
    raise TypeError(
        "xxh3_raw hashes str, bytes or (parent, token_ids, extra_keys) tuples, "
        f"got {type(obj).__name__}"
    )


# --------------------------------------------------------------------------- digests
def _sha256(obj: Any) -> bytes:
    return hashlib.sha256(pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)).digest()


def _sha256_cbor(obj: Any) -> bytes:
    return hashlib.sha256(cbor2.dumps(obj, canonical=True)).digest()


def _xxhash(obj: Any) -> bytes:
    return xxhash.xxh3_128_digest(pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL))


def _xxhash_cbor(obj: Any) -> bytes:
    return xxhash.xxh3_128_digest(cbor2.dumps(obj, canonical=True))


def _xxh3_raw(obj: Any) -> bytes:
    return xxhash.xxh3_128_digest(_raw_object(obj))


_DIGESTS: dict[str, Callable[[Any], bytes]] = {
    "sha256": _sha256,
    "sha256_cbor": _sha256_cbor,
    "xxhash": _xxhash,
    "xxhash_cbor": _xxhash_cbor,
    "xxh3_raw": _xxh3_raw,
}


def _fn_of(algo: Any) -> Callable[[Any], bytes]:
    fn = _DIGESTS.get(algo) if isinstance(algo, str) else None
    if fn is None:
        raise ValueError(f"unknown hash algorithm {algo!r}; expected one of {ALGORITHMS}")
    return fn


def digest(algo: str, obj: Any) -> bytes:
    """Hash one object with ``algo`` (one of :data:`ALGORITHMS`)."""
    return _fn_of(algo)(obj)


def block_message(algo: str, parent: Any, token_ids: Sequence[Any], extra_keys: Any = None) -> bytes:
    """The exact bytes that ``algo`` digests for one block.

    ``pickle.dumps((parent, tuple(token_ids), extra_keys), protocol=5)`` for
    sha256 / xxhash, the canonical CBOR of that triple for the ``_cbor``
    algorithms, and the xxh3_raw message (docs/hashing.md) for ``xxh3_raw``.
    """
    _fn_of(algo)
    if algo == "xxh3_raw":
        _check_raw_parent(parent)
        return _raw_message(parent, list(token_ids), extra_keys)
    obj = (parent, tuple(token_ids), extra_keys)
    if algo in ("sha256", "xxhash"):
        return pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    return cbor2.dumps(obj, canonical=True)


# --------------------------------------------------------------------------- the chain
def hash_blocks(
    algo: str,
    parent: bytes,
    token_ids: Sequence[int],
    start: int,
    num_blocks: int,
    block_size: int,
    extra_keys: Sequence[tuple | None] | None = None,
) -> list[bytes]:
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
    fn = _fn_of(algo)
    if block_size <= 0:
        raise ValueError(f"block_size must be positive, got {block_size}")
    ntok = len(token_ids)
    if start < 0 or num_blocks < 0 or start > ntok or num_blocks > (ntok - start) // block_size:
        end = start + num_blocks * block_size
        raise ValueError(f"blocks [{start}, {end}) are outside the {ntok} tokens given")
    if extra_keys is not None and len(extra_keys) != num_blocks:
        raise ValueError(f"extra_keys has {len(extra_keys)} entries for {num_blocks} blocks")
    if algo == "xxh3_raw":
        _check_raw_parent(parent)
    out: list[bytes] = []
    for i in range(num_blocks):
        lo = start + i * block_size
        block = tuple(token_ids[lo : lo + block_size])
        keys = None if extra_keys is None else extra_keys[i]
        parent = fn((parent, block, keys))
        out.append(parent)
    return out


# --------------------------------------------------------------------------- extra keys
def _prompt_embeds_key(request: Any, start: int, end: int) -> list:
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
    return [(_EMBEDS_TAG, hashlib.sha256(raw).digest())]


def _torch_uint8() -> Any:
    # Imported lazily: torch is optional, and only tensors reach this.
    import torch

    return torch.uint8


def _first_live_mm_idx(features: Any, pos: int) -> int:
    """Index of the first multimodal item that ends after token ``pos``.

    It is where the walk over a request's items stands once every block
    ending at ``pos`` is hashed, so a hasher call that starts there resumes
    the walk exactly where hashing the whole request at once would be.
    """
    idx = 0
    n = len(features) if features else 0
    while idx < n:
        p = features[idx].mm_position
        if p.offset + p.length > pos:
            break
        idx += 1
    return idx


def _rewind_mm_idx(features: Any, mm_idx: int, end: int) -> int:
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


def _resume_mm_idx(features: Any, start: int, lookahead: int) -> int:
    """Where the walk over the items stands when the block at ``start`` is hashed."""
    if start == 0 or not features:
        return 0
    last = features[-1].mm_position
    if last.offset + last.length <= start:
        return len(features)  # every item is over (decode): nothing to scan
    if not lookahead:
        return _first_live_mm_idx(features, start)
    return _rewind_mm_idx(features, _first_live_mm_idx(features, start + lookahead), start)


def _mm_extra_keys(request: Any, start: int, end: int, start_mm_idx: int) -> tuple[list, int]:
    features = request.mm_features
    keys: list = []
    if not features:
        return keys, start_mm_idx
    last = features[-1]
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


def generate_block_hash_extra_keys(
    request: Any, start_token_idx: int, end_token_idx: int, start_mm_idx: int
) -> tuple[tuple[Any, ...] | None, int]:
    """This twin's :func:`kvcy.hashing.generate_block_hash_extra_keys` (documented there)."""
    keys: list[Any] = []
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


class RequestBlockHasher:
    """Hashes a request's not-yet-hashed full blocks (``kvcy.Request`` calls it).

    ``algo`` is one of :data:`ALGORITHMS`, or ``None`` with ``hash_fn`` set for
    any other hash function (then each block is ``hash_fn((parent,
    tuple(tokens), extra_keys))``).  ``none_hash`` is a callable returning the
    current ``NONE_HASH``; it is read when a request's first block is hashed.
    With ``num_hash_lookahead_tokens`` (L) > 0 a block is hashed only once the
    L tokens after it exist, and its extra keys become ``(E, *those tokens)``
    where ``E`` are the keys of the block and those tokens together.
    """

    __slots__ = ("block_size", "algo", "hash_fn", "num_hash_lookahead_tokens", "_none_hash", "_fn")

    def __init__(
        self,
        block_size: int,
        algo: str | None,
        none_hash: Callable[[], bytes],
        hash_fn: Callable[[Any], bytes] | None = None,
        num_hash_lookahead_tokens: int = 0,
    ) -> None:
        if isinstance(block_size, bool) or not isinstance(block_size, int) or block_size <= 0:
            raise ValueError(f"block_size must be a positive int, got {block_size!r}")
        lookahead = num_hash_lookahead_tokens
        if not isinstance(lookahead, int) or lookahead < 0:  # (a bool counts as 0 or 1, as in vLLM)
            raise ValueError(f"num_hash_lookahead_tokens must be a non-negative int, got {lookahead!r}")
        lookahead = int(lookahead)
        if algo is None:
            if not callable(hash_fn):
                raise ValueError("hash_fn must be callable when algo is None")
            fn = hash_fn
        else:
            fn = _fn_of(algo)
        self.block_size = block_size
        self.algo = algo
        self.hash_fn = hash_fn
        self.num_hash_lookahead_tokens = lookahead
        self._none_hash = none_hash
        self._fn = fn

    def __call__(self, request: Any) -> list[bytes]:
        # vLLM's request_block_hasher, block by block.
        block_size = self.block_size
        lookahead = self.num_hash_lookahead_tokens
        hashes = request.block_hashes
        start = len(hashes) * block_size
        num_tokens = request.num_tokens - lookahead
        if start + block_size > num_tokens:
            return []
        features = request.mm_features
        mm_idx = _resume_mm_idx(features, start, lookahead)
        parent = hashes[-1] if hashes else None
        tokens = request.all_token_ids
        if len(tokens) < num_tokens + lookahead:
            raise RuntimeError(
                f"request.all_token_ids has {len(tokens)} tokens, "
                f"num_tokens says {num_tokens + lookahead}"
            )
        fn = self._fn
        out: list[bytes] = []
        while start + block_size <= num_tokens:
            end = start + block_size
            if lookahead:
                keys, mm_idx = generate_block_hash_extra_keys(request, start, end + lookahead, mm_idx)
                if features:
                    mm_idx = _rewind_mm_idx(features, mm_idx, end)
                keys = (keys, *tokens[end : end + lookahead])
            else:
                keys, mm_idx = generate_block_hash_extra_keys(request, start, end, mm_idx)
            if not parent:
                parent = self._none_hash()
            parent = fn((parent, tuple(tokens[start:end]), keys))
            out.append(parent)
            start = end
        return out

    def __reduce__(self) -> tuple:
        # The constructor's arguments (the compiled twin's hasher keeps per-request state it leaves behind).
        return (
            RequestBlockHasher,
            (self.block_size, self.algo, self._none_hash, self.hash_fn, self.num_hash_lookahead_tokens),
        )

    def __repr__(self) -> str:
        return (
            f"RequestBlockHasher(block_size={self.block_size}, algo={self.algo!r}, "
            f"num_hash_lookahead_tokens={self.num_hash_lookahead_tokens})"
        )
