"""Compiled twin of the block-hash chain (first cut: the reference recipe, compiled).
"""

from __future__ import annotations

import hashlib
import pickle
from collections.abc import Sequence
from typing import Any

import cbor2
import xxhash

__all__ = ["ALGORITHMS", "digest", "hash_blocks"]

#: Algorithms with a serialise-then-digest recipe that both twins implement.
ALGORITHMS = ("sha256", "sha256_cbor", "xxhash", "xxhash_cbor")


def _sha256(obj: Any) -> bytes:
    return hashlib.sha256(pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)).digest()


def _sha256_cbor(obj: Any) -> bytes:
    return hashlib.sha256(cbor2.dumps(obj, canonical=True)).digest()


def _xxhash(obj: Any) -> bytes:
    return xxhash.xxh3_128_digest(pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL))


def _xxhash_cbor(obj: Any) -> bytes:
    return xxhash.xxh3_128_digest(cbor2.dumps(obj, canonical=True))


_DIGESTS = {
    "sha256": _sha256,
    "sha256_cbor": _sha256_cbor,
    "xxhash": _xxhash,
    "xxhash_cbor": _xxhash_cbor,
}


def digest(algo: str, obj: Any) -> bytes:
    """Hash one object with ``algo`` (one of :data:`ALGORITHMS`)."""
    try:
        fn = _DIGESTS[algo]
    except KeyError:
        raise ValueError(f"unknown hash algorithm {algo!r}; expected one of {ALGORITHMS}") from None
    return fn(obj)


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
    fn = _DIGESTS.get(algo)
    if fn is None:
        raise ValueError(f"unknown hash algorithm {algo!r}; expected one of {ALGORITHMS}")
    if block_size <= 0:
        raise ValueError(f"block_size must be positive, got {block_size}")
    if start < 0 or num_blocks < 0 or start + num_blocks * block_size > len(token_ids):
        raise ValueError(
            f"blocks [{start}, {start + num_blocks * block_size}) are outside "
            f"the {len(token_ids)} tokens given"
        )
    if extra_keys is not None and len(extra_keys) != num_blocks:
        raise ValueError(f"extra_keys has {len(extra_keys)} entries for {num_blocks} blocks")
    out: list[bytes] = []
    for i in range(num_blocks):
        lo = start + i * block_size
        block = tuple(token_ids[lo : lo + block_size])
        keys = None if extra_keys is None else extra_keys[i]
        parent = fn((parent, block, keys))
        out.append(parent)
    return out
