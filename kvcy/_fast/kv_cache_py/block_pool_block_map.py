"""Cache key -> block(s), and request hashes seen at a coarser block size (pure-Python twin).

``BlockHashToBlockMap`` is from vLLM 0.33.0's ``vllm/v1/core/block_pool.py``;
``resolve_block_hashes`` and its view stand for ``BlockHashListWithBlockSize`` of
``vllm/v1/core/kv_cache_utils.py``; ``_group_key`` builds the map's keys (block hash
+ 4-byte group id).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from kvcy._fast.kv_cache_py.kv_cache_utils import KVCacheBlock


class BlockHashToBlockMap:
    """Cache key -> block(s).  The first block inserted under a key wins lookups.

    Several blocks may carry the same key (no de-duplication, so block tables
    stay append-only); the value is then a dict ``{block_id: block}`` in
    insertion order.
    """

    def __init__(self) -> None:
        self._cache: dict[bytes, Any] = {}

    def get_one_block(self, key: bytes) -> KVCacheBlock | None:
        """The first block cached under ``key``, or None."""
        blocks = self._cache.get(key)
        if blocks is None:
            return None
        if blocks.__class__ is dict:
            return next(iter(blocks.values()))
        return blocks

    def contain(self, key: bytes, block_id: int) -> bool:
        blocks = self._cache.get(key)
        if blocks is None:
            return False
        if blocks.__class__ is dict:
            return block_id in blocks
        return blocks._block_id == block_id

    def insert(self, key: bytes, block: KVCacheBlock) -> None:
        blocks = self._cache.get(key)
        if blocks is None:
            self._cache[key] = block
        elif blocks.__class__ is dict:
            blocks[block._block_id] = block
        else:
            self._cache[key] = {blocks._block_id: blocks, block._block_id: block}

    def pop(self, key: bytes, block_id: int) -> KVCacheBlock | None:
        """Remove ``block_id`` from ``key``; the removed block, or None."""
        blocks = self._cache.pop(key, None)
        if blocks is None:
            return None
        if blocks.__class__ is dict:
            block = blocks.pop(block_id, None)
            if blocks:
                self._cache[key] = blocks
            return block
        if blocks._block_id == block_id:
            return blocks
        self._cache[key] = blocks
        return None

    def keys(self) -> list[bytes]:
        """The cache keys (``BlockHashWithGroupId``), in table order."""
        return list(self._cache)

    def __len__(self) -> int:
        return len(self._cache)


def _group_key(block_hash: bytes, group_id: int) -> bytes:
    return block_hash + group_id.to_bytes(4, "big")


class _BlockHashView:
    """Request block hashes seen at a coarser block size.

    Each fine hash chains over the whole prefix before it, so a coarse block is keyed by the
    last fine hash inside it (as vLLM 0.33.0's ``BlockHashListWithBlockSize``).
    """

    __slots__ = ("_hashes", "_scale")

    def __init__(self, hashes: list[bytes], scale: int) -> None:
        if scale <= 0:
            raise ValueError(f"scale must be positive, got {scale}")
        self._hashes = hashes
        self._scale = scale

    def __len__(self) -> int:
        return len(self._hashes) // self._scale

    def __getitem__(self, i: int) -> bytes:
        if i < 0:
            i += len(self)
        if not 0 <= i < len(self):
            raise IndexError(i)
        return self._hashes[(i + 1) * self._scale - 1]


def resolve_block_hashes(hashes: list[bytes], hash_block_size: int, block_size: int):
    """The request's hashes at ``block_size`` (a multiple of ``hash_block_size``)."""
    if block_size == hash_block_size:
        return hashes
    if hash_block_size <= 0 or block_size <= 0:
        raise ValueError(f"block size {block_size} is not a positive multiple of the hash block size "
                         f"{hash_block_size}")
    if block_size % hash_block_size != 0:  # (vLLM's assertion: e.g. a dcp-sharded group's events)
        raise AssertionError(f"block size {block_size} is not a positive multiple of the hash block size "
                             f"{hash_block_size}")
    return _BlockHashView(hashes, block_size // hash_block_size)
