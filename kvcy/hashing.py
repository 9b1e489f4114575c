"""Prefix-cache block hashing, byte-identical to vLLM 0.33.0.

A block hash is ``hash_fn((parent, tuple(block_token_ids), extra_keys))`` where
``parent`` is the previous block's hash or ``NONE_HASH`` for the first block.
``NONE_HASH`` is ``hash_fn(seed)`` with the seed rules of :func:`init_none_hash`.

The registered hash functions, the chain over a request's full blocks and the
extra keys are computed by the selected twin, read at call time through
``kvcy._fast.hashing``: the compiled ``kvcy/_fast/_hashing_c.pyx`` serialises
straight into a C buffer (the same bytes as pickle / canonical CBOR) and digests
with OpenSSL / libxxhash; the pure-Python ``kvcy/_fast/_hashing_py.py`` is
vLLM's recipe.  :func:`get_request_block_hasher` returns the per-request
callable that ``kvcy.Request`` runs whenever tokens are appended.

``xxh3_raw`` is kvcy's own algorithm (not in vLLM): XXH3-128 over the parent
digest, the token ids as int64 little-endian and the canonical CBOR of the extra
keys; specified in docs/hashing.md so that other languages can recompute it.

Which twin: :mod:`kvcy._fast` picks one at import, for all of kvcy: the
compiled one when it imports, the pure-Python one with ``KVCY_NO_EXTENSIONS=1``
or when the extension is missing or broken (``KVCY_REQUIRE_EXTENSIONS=1`` makes
that an error); ``kvcy.IMPLEMENTATION`` says which (``"cython"`` / ``"python"``).
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, Any, overload

# The live hashing twin, through the selector; the twins never import this module
# (the KV-cache twins take their hash helpers from the hashing twins).
from kvcy import _fast
from kvcy.kv_events import default_use_int_block_hashes, external_block_hash

if TYPE_CHECKING:
    from kvcy.request import Request

logger = logging.getLogger(__name__)

BlockHash = bytes
"""A block hash: the raw digest bytes (32 for SHA-256, 16 for XXH3-128)."""

BlockHashWithGroupId = bytes
"""A cache key: block hash followed by the KV-cache group id (4 bytes, big-endian)."""

ExternalBlockHash = bytes | int
"""A block hash as KV events publish it: the raw bytes, or their low 64 bits as an int."""

__all__ = [
    "BlockHash",
    "BlockHashList",
    "BlockHashListWithBlockSize",
    "BlockHashWithGroupId",
    "DEFAULT_NONE_HASH_SEED",
    "ExternalBlockHash",
    "NONE_HASH",
    "get_none_hash_seed",
    "maybe_convert_block_hash",
    "resolve_block_hashes",
    "resolve_none_hash_seed",
    "to_event_extra_keys",
    "generate_block_hash_extra_keys",
    "generate_lookahead_block_hash_extra_keys",
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

DEFAULT_NONE_HASH_SEED = "vllm-none-hash"
"""The seed of ``NONE_HASH`` for collision-resistant algorithms when
``PYTHONHASHSEED`` is unset: fixed, so that separate processes agree."""

# Algorithms whose collisions can be searched for offline when the seed is
# known get a random seed.  vLLM 0.33.0 names two, xxhash and xxhash_cbor
# (kvcy's registered ones, or vLLM's own functions: see _gets_random_seed).
# kvcy's own xxh3_raw, builtin (Python's hash) and the truncated
# sha256_cbor_64bit, which vLLM does not have, get one too: kvcy's choice.
_NON_CRYPTO_FN_NAMES = frozenset({"xxhash", "xxhash_cbor", "xxh3_raw", "builtin", "sha256_cbor_64bit"})
_VLLM_NON_CRYPTO_FNS = ("xxhash", "xxhash_cbor")  # attributes of vllm.utils.hashing


def _gets_random_seed(hash_fn: Callable[[Any], bytes]) -> bool:
    # One of kvcy's non-collision-resistant functions, or vLLM's own xxhash /
    # xxhash_cbor passed in directly (vLLM tests by identity).  vLLM's module
    # is looked up only if already imported: its functions cannot exist else.
    if hash_fn_name(hash_fn) in _NON_CRYPTO_FN_NAMES:
        return True
    vllm_hashing = sys.modules.get("vllm.utils.hashing")
    if vllm_hashing is None:
        return False
    return any(hash_fn is getattr(vllm_hashing, name, None) for name in _VLLM_NON_CRYPTO_FNS)

_NONE_HASH_SEED: str | None = None


def resolve_none_hash_seed(hash_fn: Callable[[Any], bytes]) -> str:
    """The seed to derive ``NONE_HASH`` from for ``hash_fn``.

    ``PYTHONHASHSEED`` when set; otherwise 32 fresh random bytes (as hex) for
    the non-collision-resistant algorithms, so that their seed stays
    unpredictable, and :data:`DEFAULT_NONE_HASH_SEED` for every other function
    (sha256, sha256_cbor and functions kvcy does not register).  As in vLLM
    0.33.0, xxhash and xxhash_cbor are non-collision-resistant, whether kvcy's
    or vLLM's own (``vllm.utils.hashing``) functions.  kvcy's xxh3_raw,
    builtin and sha256_cbor_64bit, which vLLM lacks, count as
    non-collision-resistant too (vLLM would give a function it does not know
    the default seed).
    """
    seed = os.environ.get("PYTHONHASHSEED")
    if seed is not None:
        return seed
    if _gets_random_seed(hash_fn):
        return os.urandom(32).hex()
    return DEFAULT_NONE_HASH_SEED


def get_none_hash_seed() -> str:
    """The seed the current ``NONE_HASH`` was derived from.

    :data:`DEFAULT_NONE_HASH_SEED` before :func:`init_none_hash` has run.
    """
    return DEFAULT_NONE_HASH_SEED if _NONE_HASH_SEED is None else _NONE_HASH_SEED


def init_none_hash(hash_fn: Callable[[Any], bytes]) -> bytes:
    """Set :data:`NONE_HASH` for ``hash_fn`` and return it.

    The seed comes from :func:`resolve_none_hash_seed` and is remembered for
    :func:`get_none_hash_seed`.
    """
    global NONE_HASH, _NONE_HASH_SEED
    seed = resolve_none_hash_seed(hash_fn)
    if os.environ.get("PYTHONHASHSEED") is None and _gets_random_seed(hash_fn):
        logger.warning(
            "PYTHONHASHSEED is not set and %s is not collision resistant: NONE_HASH "
            "uses a random per-process seed, so block hashes differ between processes",
            hash_fn_name(hash_fn) or getattr(hash_fn, "__name__", repr(hash_fn)),
        )
    _NONE_HASH_SEED = seed
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


def maybe_convert_block_hash(hash_bytes: bytes) -> ExternalBlockHash:
    """A block hash as KV events publish it.

    The low 64 bits as an int (big-endian) when ``VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES``
    says so (vLLM's default), else the bytes unchanged.
    """
    return external_block_hash(hash_bytes, default_use_int_block_hashes())


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


def generate_lookahead_block_hash_extra_keys(
    request: Request,
    start_token_idx: int,
    end_token_idx: int,
    hash_end_token_idx: int,
    start_mm_idx: int,
) -> tuple[tuple[Any, ...] | None, int]:
    """The extra keys of a block hashed with lookahead, as vLLM 0.33.0 makes them.

    The keys cover ``[start_token_idx, hash_end_token_idx)`` (the block and its
    lookahead tokens); the returned multimodal index steps back over the items
    that still reach past ``end_token_idx``, so the next block (which starts there)
    finds them again.

    Returns:
        ``(extra_keys or None, next_mm_idx)``.
    """
    extra_keys, mm_idx = generate_block_hash_extra_keys(request, start_token_idx, hash_end_token_idx, start_mm_idx)
    features = request.mm_features
    while mm_idx > 0:
        position = features[mm_idx - 1].mm_position
        if position.offset + position.length <= end_token_idx:
            break
        mm_idx -= 1
    return extra_keys, mm_idx


def to_event_extra_keys(
    extra_keys: Iterable[tuple[Any, ...] | None] | None,
) -> list[tuple[Any, ...] | None] | None:
    """Per-block extra keys as KV events publish them (untagged).

    Each entry of ``extra_keys`` is one block's keys as
    :func:`generate_block_hash_extra_keys` returns them (or ``None``); an
    ``("mm", identifier, offset)`` key becomes ``(identifier, offset)`` and
    every other tagged key its bare value.

    Returns:
        One entry per block, or ``None`` when ``extra_keys`` is empty or None.
    """
    if not extra_keys:
        return None
    out = [
        None if keys is None else tuple(key[1:] if key[0] == "mm" else key[1] for key in keys)
        for keys in extra_keys
    ]
    return out or None


# --------------------------------------------------------------------------- coarser views
class BlockHashListWithBlockSize:
    """A request's block hashes seen at a coarser block size.

    Hashes are computed every ``hash_block_size`` tokens and each one chains
    over the whole prefix before it, so the hash of a ``target_block_size``
    block is simply the last fine hash inside it: entry ``i`` of this view is
    ``block_hashes[(i + 1) * scale_factor - 1]``.  The view is lazy and reads
    the live list, so it grows as the request's hashes do.

    Raises:
        AssertionError: ``target_block_size`` is not a multiple of
            ``hash_block_size`` (as in vLLM).
    """

    __slots__ = ("block_hashes", "scale_factor")

    def __init__(self, block_hashes: list[bytes], hash_block_size: int, target_block_size: int) -> None:
        self.block_hashes = block_hashes
        assert target_block_size % hash_block_size == 0
        self.scale_factor = target_block_size // hash_block_size

    def __len__(self) -> int:
        return len(self.block_hashes) // self.scale_factor

    @overload
    def __getitem__(self, idx: int) -> bytes: ...

    @overload
    def __getitem__(self, idx: slice) -> list[bytes]: ...

    def __getitem__(self, idx):
        if isinstance(idx, int):
            return self._get_value_at(idx)
        if isinstance(idx, slice):
            start, stop, step = idx.indices(len(self))
            return [self._get_value_at(i) for i in range(start, stop, step)]
        raise TypeError(f"Invalid index type: {type(idx)!r}")

    def __iter__(self) -> Iterator[bytes]:
        for i in range(len(self)):
            yield self._get_value_at(i)

    def _get_value_at(self, idx: int) -> bytes:
        return self.block_hashes[(idx + 1) * self.scale_factor - 1]

    def __repr__(self) -> str:
        return f"BlockHashListWithBlockSize(scale_factor={self.scale_factor}, len={len(self)})"


BlockHashList = list[bytes] | BlockHashListWithBlockSize
"""Block hashes at some block size: the list itself or a coarser view of it."""


def resolve_block_hashes(
    block_hashes: BlockHashList,
    hash_block_size: int,
    block_size: int,
    *,
    supports_fine_grained_hash_lookup: bool = False,
    alignment_tokens: int | None = None,
) -> BlockHashList:
    """``block_hashes`` (computed every ``hash_block_size`` tokens) at ``block_size``.

    The list itself when the sizes are equal, or when a fine-grained lookup
    (``supports_fine_grained_hash_lookup`` with ``alignment_tokens`` below
    ``block_size`` and dividing it) wants the raw hashes for partial hits; a
    view that is already coarse is returned as is; otherwise a
    :class:`BlockHashListWithBlockSize`.

    Raises:
        AssertionError: ``block_size`` is not a multiple of
            ``hash_block_size``, or a view of another scale is passed (as in vLLM).
    """
    if block_size == hash_block_size:
        return block_hashes
    if isinstance(block_hashes, BlockHashListWithBlockSize):
        assert block_hashes.scale_factor == block_size // hash_block_size
        return block_hashes
    if (
        supports_fine_grained_hash_lookup
        and alignment_tokens is not None
        and alignment_tokens < block_size
        and block_size % alignment_tokens == 0
    ):
        return block_hashes
    assert block_size % hash_block_size == 0
    return BlockHashListWithBlockSize(block_hashes, hash_block_size, block_size)


# --------------------------------------------------------------------------- the chain
def get_request_block_hasher(
    hash_block_size: int,
    caching_hash_fn: Callable[[Any], bytes],
    num_hash_lookahead_tokens: int = 0,
) -> Callable[[Request], list[bytes]]:
    """A callable that hashes a request's not-yet-hashed full blocks.

    ``kvcy.Request`` calls it at creation and after every append and extends
    ``request.block_hashes`` with the result.  The registered algorithms run in
    the selected ``_hashing`` twin's ``RequestBlockHasher`` (the whole chain and
    the extra keys in one call); any other function runs the same chain with
    ``caching_hash_fn`` called once per block.  The callable has ``block_size``,
    ``algo`` (``None`` for an unregistered function) and
    ``num_hash_lookahead_tokens`` attributes.

    With ``num_hash_lookahead_tokens`` (L) > 0, as for an EAGLE drafter whose
    KV at a block's last position depends on the next L tokens, a block is
    hashed only once those L tokens exist, and its extra keys become ``(E,
    *those tokens)``, ``E`` being the extra keys of the block and those tokens.

    Raises:
        ValueError: ``hash_block_size`` is not a positive int, or
            ``num_hash_lookahead_tokens`` not a non-negative int.
    """
    if isinstance(hash_block_size, bool) or not isinstance(hash_block_size, int) or hash_block_size <= 0:
        raise ValueError(f"block_size must be a positive int, got {hash_block_size!r}")
    twin = _fast.hashing
    algo = hash_fn_name(caching_hash_fn)
    if algo in twin.ALGORITHMS:
        return twin.RequestBlockHasher(
            hash_block_size, algo, get_none_hash, num_hash_lookahead_tokens=num_hash_lookahead_tokens
        )
    return twin.RequestBlockHasher(
        hash_block_size, None, get_none_hash, caching_hash_fn, num_hash_lookahead_tokens
    )
