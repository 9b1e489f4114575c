"""One KV-cache block (pure-Python twin).

From vLLM 0.33.0's ``vllm/v1/core/kv_cache_utils.py`` (``KVCacheBlock``): id,
reference count, cache key and the links of the free queue it sits in.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from kvcy._fast.kv_cache_py._common import _check_count

if TYPE_CHECKING:
    from kvcy._fast.kv_cache_py.kv_cache_utils_free_queue import FreeKVCacheBlockQueue


def _check_ref_cnt(value: Any) -> int:
    """A reference count as assigned from outside: an int in [0, 2**31)."""
    value = _check_count("ref_cnt", value)
    if value >= 2**31:
        raise ValueError(f"ref_cnt must be below 2**31, got {value}")
    return value


def _check_key(key: Any) -> bytes:
    """A cache key as a block may carry it: hash bytes + the 4-byte group id (as the compiled twin checks)."""
    if not isinstance(key, bytes) or len(key) < 4:
        raise ValueError(f"a cache key is a block hash followed by a 4-byte group id, got {key!r}")
    return key


#: Why KVCacheBlock(pool=...) is refused (both twins).
_POOL_REFUSED = (
    "KVCacheBlock(pool=...) names the block pool a block comes from, for HiSparse's "
    "frees across several pools; kvcy does not implement HiSparse (pool must be None)"
)


class KVCacheBlock:
    """One KV-cache block: id, reference count, cache key, free-queue position.

    The position is the pair of links to its neighbours in the free queue.
    ``is_null`` (keyword only, vLLM's) marks the pool's null block.
    ``pool`` (keyword only, vLLM's) must be None: it serves HiSparse's several
    block pools, which kvcy does not implement (and keeping it would cost
    every block a field and a place in the cycle collector).
    """

    # The fields behind the public names: the id, null flag and queue links
    # are read-only from outside (the pool and its queue own them), the
    # reference count and token count are checked when assigned.  The twin's
    # own code reads and writes the slots directly.
    __slots__ = (
        "_block_id",
        "_ref_cnt",
        "_key",
        "_block_hash_num_tokens",
        "_prev_free_block",
        "_next_free_block",
        "_is_null",
        "_queue",
    )

    def __init__(self, block_id: int, *, pool: None = None, is_null: bool = False) -> None:
        if block_id.__class__ is not int:
            if not isinstance(block_id, int):
                raise TypeError("an integer is required")
            block_id = int(block_id)
        if not -(2**31) <= block_id < 2**31:  # (the compiled twin's int32_t argument's messages)
            if not -(2**63) <= block_id < 2**63:
                raise OverflowError("Python int too large to convert to C long")
            raise OverflowError("value too large to convert to int32_t")
        if pool is not None:
            raise NotImplementedError(_POOL_REFUSED)
        if is_null.__class__ is not bool:
            raise TypeError(f"is_null must be a bool, got {type(is_null).__name__}")
        self._block_id = block_id
        self._ref_cnt = 0
        self._queue: FreeKVCacheBlockQueue | None = None  # the queue it was last put in
        self._key: bytes | None = None
        self._block_hash_num_tokens: int | None = None
        self._prev_free_block: KVCacheBlock | None = None
        self._next_free_block: KVCacheBlock | None = None
        self._is_null = is_null

    @property
    def block_id(self) -> int:
        return self._block_id

    @property
    def is_null(self) -> bool:
        return self._is_null

    @property
    def ref_cnt(self) -> int:
        return self._ref_cnt

    @ref_cnt.setter
    def ref_cnt(self, value: int) -> None:
        n = _check_ref_cnt(value)
        if n != 0 and (self._prev_free_block is not None or self._next_free_block is not None):
            # (a free block with references would be queued a second time
            # when they are dropped, and handed out twice)
            raise RuntimeError(f"block {self._block_id} is in a free queue: its ref_cnt stays 0 "
                               "(take it with get_new_blocks() or touch())")
        self._ref_cnt = n

    @property
    def prev_free_block(self) -> KVCacheBlock | None:
        """The previous block in the free queue (a fake head has id -1), or None."""
        return self._prev_free_block

    @property
    def next_free_block(self) -> KVCacheBlock | None:
        """The next block in the free queue (a fake tail has id -1), or None."""
        return self._next_free_block

    @property
    def block_hash_num_tokens(self) -> int | None:
        """Tokens up to the end of this block when it was cached, or None."""
        return self._block_hash_num_tokens

    @block_hash_num_tokens.setter
    def block_hash_num_tokens(self, value: int | None) -> None:
        self._block_hash_num_tokens = None if value is None else _check_count("block_hash_num_tokens", value)

    @property
    def block_hash(self) -> bytes | None:
        """The cache key (block hash + 4-byte group id), or None."""
        return self._key

    @property
    def _block_hash(self) -> bytes | None:
        return self._key

    @block_hash.setter
    def block_hash(self, block_hash: bytes) -> None:
        assert self._key is None, "The block already has a hash. This should not happen."
        self._key = _check_key(block_hash)

    def set_block_hash(self, block_hash: bytes, num_tokens: int | None = None) -> None:
        assert self._key is None, "The block already has a hash. This should not happen."
        n = None if num_tokens is None else _check_count("num_tokens", num_tokens)
        self._key = _check_key(block_hash)
        self._block_hash_num_tokens = n

    def reset_hash(self) -> None:
        """Drop the cache key (the block is evicted from the prefix cache)."""
        self._key = None
        self._block_hash_num_tokens = None

    def __repr__(self) -> str:
        prev_id = self._prev_free_block._block_id if self._prev_free_block is not None else None
        next_id = self._next_free_block._block_id if self._next_free_block is not None else None
        return (
            f"KVCacheBlock(block_id={self._block_id}, ref_cnt={self._ref_cnt}, "
            f"_block_hash={self._key!r}, _block_hash_num_tokens={self._block_hash_num_tokens}, "
            f"prev_free_block={prev_id}, "
            f"next_free_block={next_id})"
        )
