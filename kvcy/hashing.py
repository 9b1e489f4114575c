"""Prefix-cache block hashing, byte-identical to vLLM 0.33.0.

A block hash is ``hash_fn((parent, tuple(block_token_ids), extra_keys))`` where
``parent`` is the previous block's hash or ``NONE_HASH`` for the first block.
``NONE_HASH`` is ``hash_fn(seed)`` with the seed rules of :func:`init_none_hash`.

The registered hash functions, the chain over a request's full blocks and the
extra keys are computed by the selected twin of ``kvcy._fast._hashing``: the
compiled one serialises straight into a C buffer (the same bytes as pickle /
canonical CBOR) and digests with OpenSSL / libxxhash; the pure-Python one is
vLLM's recipe.  :func:`get_request_block_hasher` returns the per-request
callable that ``kvcy.Request`` runs whenever tokens are appended.

``xxh3_raw`` is kvcy's own algorithm (not in vLLM): XXH3-128 over the parent
digest, the token ids as int64 little-endian and the canonical CBOR of the extra
keys; specified in docs/hashing.md so that other languages can recompute it.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

# The twin is read at call time (``_fast.hashing``), never at import: the
# kv_cache twins import this module while ``kvcy._fast`` is still loading.
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
    "xxh3_raw",
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
    return _fast.hashing.digest("sha256", obj)


def sha256_cbor(obj: Any) -> bytes:
    """SHA-256 of canonical CBOR (``cbor2.dumps(obj, canonical=True)``), 32 bytes."""
    return _fast.hashing.digest("sha256_cbor", obj)


def sha256_cbor_64bit(obj: Any) -> bytes:
    """The low 64 bits of :func:`sha256_cbor`, as 8 big-endian bytes."""
    return sha256_cbor(obj)[-8:]


def xxhash(obj: Any) -> bytes:
    """XXH3-128 of the pickle bytes, 16 bytes."""
    return _fast.hashing.digest("xxhash", obj)


def xxhash_cbor(obj: Any) -> bytes:
    """XXH3-128 of canonical CBOR, 16 bytes."""
    return _fast.hashing.digest("xxhash_cbor", obj)


def xxh3_raw(obj: Any) -> bytes:
    """kvcy's fixed-width block hash: XXH3-128, 16 bytes (docs/hashing.md).

    ``obj`` is a block ``(parent: bytes, token_ids, extra_keys)``: the digest
    of ``parent || int64le(token ids) || canonical CBOR of extra_keys`` (nothing
    when ``None``); a ``str`` (UTF-8) or ``bytes`` is hashed as is (the
    ``NONE_HASH`` seed).

    Raises:
        TypeError: another type, a non-bytes parent, a token that is not an int.
        ValueError: a token id outside the signed 64-bit range.
    """
    return _fast.hashing.digest("xxh3_raw", obj)


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
    "xxh3_raw": xxh3_raw,
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
    return _fast.hashing.generate_block_hash_extra_keys(
        request, start_token_idx, end_token_idx, start_mm_idx
    )


# --------------------------------------------------------------------------- the chain
def get_request_block_hasher(
    block_size: int, caching_hash_fn: Callable[[Any], bytes]
) -> Callable[[Request], list[bytes]]:
    """A callable that hashes a request's not-yet-hashed full blocks.

    ``kvcy.Request`` calls it at creation and after every append and extends
    ``request.block_hashes`` with the result.  The registered algorithms run in
    the selected ``_hashing`` twin's ``RequestBlockHasher`` (the whole chain and
    the extra keys in one call); any other function runs the same chain with
    ``caching_hash_fn`` called once per block.  The callable has ``block_size``
    and ``algo`` (``None`` for an unregistered function) attributes.

    Raises:
        ValueError: ``block_size`` is not a positive int.
    """
    if isinstance(block_size, bool) or not isinstance(block_size, int) or block_size <= 0:
        raise ValueError(f"block_size must be a positive int, got {block_size!r}")
    twin = _fast.hashing
    algo = hash_fn_name(caching_hash_fn)
    if algo in twin.ALGORITHMS:
        return twin.RequestBlockHasher(block_size, algo, get_none_hash)
    return twin.RequestBlockHasher(block_size, None, get_none_hash, caching_hash_fn)
