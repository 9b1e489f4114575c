"""Prefix-cache block hashing, byte-identical to vLLM 0.33.0.

A block hash is ``hash_fn((parent, tuple(block_token_ids), extra_keys))`` where
``parent`` is the previous block's hash or ``NONE_HASH`` for the first block.
``NONE_HASH`` is ``hash_fn(seed)`` with the seed rules of :func:`init_none_hash`.

The chain over a request's full blocks is computed by the selected twin of
``kvcy._fast._hashing`` (a compiled serialiser + digest, or the pure-Python
recipe); :func:`get_request_block_hasher` returns the per-request callable that
``kvcy.Request`` runs whenever tokens are appended.
"""

from __future__ import annotations

import hashlib
import logging
import os
import pickle
import sys
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import cbor2
import xxhash as _xxhash_mod

from kvcy import _fast

if TYPE_CHECKING:
    from kvcy.request import Request

logger = logging.getLogger(__name__)

BlockHash = bytes
"""A block hash: the raw digest bytes (32 for SHA-256, 16 for XXH3-128)."""

BlockHashWithGroupId = bytes
"""A cache key: block hash followed by the KV-cache group id (4 bytes, big-endian)."""

__all__ = [
    "BlockHash",
    "BlockHashWithGroupId",
    "NONE_HASH",
    "generate_block_hash_extra_keys",
    "get_block_hash",
    "get_group_id",
    "get_hash_fn_by_name",
    "get_request_block_hasher",
    "hash_block_tokens",
    "init_none_hash",
    "make_block_hash_with_group_id",
    "need_extra_keys",
    "sha256",
    "sha256_cbor",
    "sha256_cbor_64bit",
    "xxhash",
    "xxhash_cbor",
]

# The tag strings are module constants: pickle memoises a repeated tag inside one
# block's extra keys (it writes the second "mm" as a memo reference), exactly as
# vLLM's code constants do.
_LORA_TAG = sys.intern("lora")
_MM_TAG = sys.intern("mm")
_SALT_TAG = sys.intern("cache_salt")
_EMBEDS_TAG = sys.intern("prompt_embeds")


# --------------------------------------------------------------------------- hash functions
def sha256(obj: Any) -> bytes:
    """SHA-256 of ``pickle.dumps(obj, protocol=HIGHEST_PROTOCOL)``, 32 bytes."""
    return hashlib.sha256(pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)).digest()


def sha256_cbor(obj: Any) -> bytes:
    """SHA-256 of canonical CBOR (``cbor2.dumps(obj, canonical=True)``), 32 bytes."""
    return hashlib.sha256(cbor2.dumps(obj, canonical=True)).digest()


def sha256_cbor_64bit(obj: Any) -> bytes:
    """The low 64 bits of :func:`sha256_cbor`, as 8 big-endian bytes."""
    return sha256_cbor(obj)[-8:]


def xxhash(obj: Any) -> bytes:
    """XXH3-128 of the pickle bytes, 16 bytes."""
    return _xxhash_mod.xxh3_128_digest(pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL))


def xxhash_cbor(obj: Any) -> bytes:
    """XXH3-128 of canonical CBOR, 16 bytes."""
    return _xxhash_mod.xxh3_128_digest(cbor2.dumps(obj, canonical=True))


def builtin(obj: Any) -> bytes:
    """Python's ``hash`` as 8 signed big-endian bytes.

    Not reproducible across processes (string hashing is randomised unless
    ``PYTHONHASHSEED`` is set); offered for compatibility with older vLLM.
    """
    return hash(obj).to_bytes(8, "big", signed=True)


_HASH_FNS: dict[str, Callable[[Any], bytes]] = {
    "sha256": sha256,
    "sha256_cbor": sha256_cbor,
    "sha256_cbor_64bit": sha256_cbor_64bit,
    "xxhash": xxhash,
    "xxhash_cbor": xxhash_cbor,
    "builtin": builtin,
}
_FN_NAMES = {fn: name for name, fn in _HASH_FNS.items()}


def get_hash_fn_by_name(hash_fn_name: str) -> Callable[[Any], bytes]:
    """Return the hash function registered under ``hash_fn_name``.

    Raises:
        ValueError: the name is unknown.
    """
    try:
        return _HASH_FNS[hash_fn_name]
    except (KeyError, TypeError):
        raise ValueError(
            f"Unsupported hash function: {hash_fn_name!r}; "
            f"expected one of {sorted(_HASH_FNS)}"
        ) from None


def hash_fn_name(hash_fn: Callable[[Any], bytes]) -> str | None:
    """The registered name of ``hash_fn``, or ``None`` for a user function."""
    return _FN_NAMES.get(hash_fn)


# --------------------------------------------------------------------------- NONE_HASH
NONE_HASH: bytes = b""
"""The parent hash of every request's first block; set by :func:`init_none_hash`."""

_DEFAULT_SEED_FNS = ("sha256", "sha256_cbor")


def init_none_hash(hash_fn: Callable[[Any], bytes]) -> bytes:
    """Set :data:`NONE_HASH` for ``hash_fn`` and return it.

    The seed is ``PYTHONHASHSEED`` when set; otherwise ``"vllm-none-hash"`` for
    sha256 and sha256_cbor, and 32 random bytes (as hex) for every other
    algorithm, so that those are not reproducible across processes.
    """
    global NONE_HASH
    seed = os.environ.get("PYTHONHASHSEED")
    if seed is None:
        name = hash_fn_name(hash_fn)
        if name in _DEFAULT_SEED_FNS:
            seed = "vllm-none-hash"
        else:
            if name == "sha256_cbor_64bit":
                logger.warning(
                    "PYTHONHASHSEED is not set; sha256_cbor_64bit block hashes "
                    "will not be reproducible across processes"
                )
            seed = os.urandom(32).hex()
    NONE_HASH = hash_fn(seed)
    return NONE_HASH


def get_none_hash() -> bytes:
    """The current :data:`NONE_HASH` (initialised with sha256 on first use)."""
    if not NONE_HASH:
        init_none_hash(sha256)
    return NONE_HASH


# --------------------------------------------------------------------------- cache keys
def make_block_hash_with_group_id(block_hash: bytes, group_id: int) -> bytes:
    """The cache key: ``block_hash`` + ``group_id`` as 4 big-endian bytes."""
    return block_hash + group_id.to_bytes(4, "big", signed=False)


def get_block_hash(key: bytes) -> bytes:
    """The block hash part of a cache key."""
    return key[:-4]


def get_group_id(key: bytes) -> int:
    """The group id part of a cache key."""
    return int.from_bytes(key[-4:], "big", signed=False)


# --------------------------------------------------------------------------- one block
def hash_block_tokens(
    hash_function: Callable[[Any], bytes],
    parent_block_hash: bytes | None,
    curr_block_token_ids: Sequence[int],
    extra_keys: tuple[Any, ...] | None = None,
) -> bytes:
    """Hash one full block, chained to its parent.

    Args:
        hash_function: a function from :func:`get_hash_fn_by_name`.
        parent_block_hash: the previous block's hash; ``None`` for the first
            block (``NONE_HASH`` is used).
        curr_block_token_ids: the block's token ids.
        extra_keys: ``None`` or a tuple of tagged extra keys.
    """
    if not parent_block_hash:
        parent_block_hash = get_none_hash()
    return hash_function((parent_block_hash, tuple(curr_block_token_ids), extra_keys))


# --------------------------------------------------------------------------- extra keys
def need_extra_keys(request: Request) -> bool:
    """Whether the request's blocks need extra hash keys (LoRA, mm, salt, embeds)."""
    return bool(
        request.mm_features
        or request.lora_request is not None
        or request.cache_salt
        or request.prompt_embeds is not None
    )


def _mm_extra_keys(request: Request, start: int, end: int, start_mm_idx: int) -> tuple[list, int]:
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


def _prompt_embeds_key(request: Request, start: int, end: int) -> list:
    embeds = request.prompt_embeds
    if embeds is None or start >= request.num_prompt_tokens:
        return []
    chunk = embeds[start : min(end, request.num_prompt_tokens)]
    try:
        raw = chunk.detach().cpu().contiguous().numpy().tobytes()
    except AttributeError:  # not a tensor: anything with the buffer protocol
        raw = bytes(memoryview(chunk))
    return [(_EMBEDS_TAG, hashlib.sha256(raw).digest())]


def generate_block_hash_extra_keys(
    request: Request, start_token_idx: int, end_token_idx: int, start_mm_idx: int
) -> tuple[tuple[Any, ...] | None, int]:
    """The extra keys of the block ``[start_token_idx, end_token_idx)``.

    In this order: ``("lora", name, path)``; ``("mm", identifier, offset -
    start_token_idx)`` for every multimodal item overlapping the block;
    ``("cache_salt", salt)`` on the block that starts at token 0 (truthy salts
    only); ``("prompt_embeds", sha256 digest)`` for blocks of prompt embeddings.

    Returns:
        ``(extra_keys or None, next_mm_idx)``.
    """
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


# --------------------------------------------------------------------------- the chain
def get_request_block_hasher(
    block_size: int, caching_hash_fn: Callable[[Any], bytes]
) -> Callable[[Request], list[bytes]]:
    """A callable that hashes a request's not-yet-hashed full blocks.

    ``kvcy.Request`` calls it at creation and after every append and extends
    ``request.block_hashes`` with the result.  The registered algorithms run in
    the selected ``_hashing`` twin; any other function runs the generic recipe.

    Raises:
        ValueError: ``block_size`` is not a positive int.
    """
    if isinstance(block_size, bool) or not isinstance(block_size, int) or block_size <= 0:
        raise ValueError(f"block_size must be a positive int, got {block_size!r}")
    algo = hash_fn_name(caching_hash_fn)
    twin = _fast.hashing
    fast = algo in twin.ALGORITHMS

    def request_block_hasher(request: Request) -> list[bytes]:
        hashes = request.block_hashes
        start = len(hashes) * block_size
        num_tokens = request.num_tokens
        num_blocks = (num_tokens - start) // block_size
        if num_blocks <= 0:
            return []
        parent = hashes[-1] if hashes else get_none_hash()
        extra: list[tuple | None] | None = None
        if need_extra_keys(request):
            mm_idx = -1 if start > 0 else 0
            extra = []
            for i in range(num_blocks):
                lo = start + i * block_size
                keys, mm_idx = generate_block_hash_extra_keys(request, lo, lo + block_size, mm_idx)
                extra.append(keys)
        tokens = request.all_token_ids
        if fast:
            return twin.hash_blocks(algo, parent, tokens, start, num_blocks, block_size, extra)
        out = []
        for i in range(num_blocks):
            lo = start + i * block_size
            keys = None if extra is None else extra[i]
            parent = caching_hash_fn((parent, tuple(tokens[lo : lo + block_size]), keys))
            out.append(parent)
        return out

    request_block_hasher.block_size = block_size  # type: ignore[attr-defined]
    request_block_hasher.algo = algo  # type: ignore[attr-defined]
    return request_block_hasher
