"""The block pool: allocation, freeing, caching and lazy eviction (pure-Python twin).

From vLLM 0.33.0's ``vllm/v1/core/block_pool.py`` (``BlockPool``), with
``_check_touchable``: what ``touch`` needs of its blocks, which the managers
check with it too.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from kvcy._fast._hashing_py import generate_block_hash_extra_keys
from kvcy.kv_events import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    KVCacheEvent,
    default_use_int_block_hashes,
    external_block_hash,
    untag_extra_keys,
)
from kvcy._fast.kv_cache_py._common import (
    _READ_ONLY,
    _Checked,
    _as_index,
    _check_count,
    _lookahead_count,
    _request_id,
)
from kvcy._fast.kv_cache_py.block_pool_block_map import BlockHashToBlockMap, _group_key, resolve_block_hashes
from kvcy._fast.kv_cache_py.kv_cache_utils_free_queue import FreeKVCacheBlockQueue
from kvcy._fast.kv_cache_py.kv_cache_utils import KVCacheBlock

if TYPE_CHECKING:
    from kvcy._fast.kv_cache_py.request import Request

logger = logging.getLogger("kvcy")


def _checked_mask(block_mask: Any, n: int) -> list:
    """cache_full_blocks' ``block_mask``: one entry per block to cache (vLLM asserts it),
    as a list of bools."""
    try:
        mask = list(block_mask)
    except TypeError:
        raise TypeError(f"block_mask must be a sequence of bools, got {type(block_mask).__name__}") from None
    if len(mask) != n:
        raise AssertionError(f"block_mask has {len(mask)} entries for {n} blocks to cache")
    return [bool(x) for x in mask]


def _int_arg(name: str, value: Any) -> int:
    """An int argument (bools refused, as in the compiled twin), or TypeError."""
    if value.__class__ is not int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(f"{name} must be an int, got {type(value).__name__}")
        value = int(value)
    return value


def _block_hashes_of(request: Any) -> Any:
    """The request's block hashes, or TypeError for something that is not a request."""
    try:
        return request.block_hashes
    except AttributeError:
        raise TypeError(f"expected a Request, got {type(request).__name__}") from None


def _check_touchable(blocks: list, queue: FreeKVCacheBlockQueue | None, pool_blocks: list | None = None) -> None:
    """What touch() needs of its blocks, checked before it changes anything: each is a
    KVCacheBlock, one of ``pool_blocks`` (a pool's blocks, if given: a hit from another pool
    would take a reference there) and, with no references (and not the null block), sits in
    the free queue (``queue`` None: not checked)."""
    n_pool = -1 if pool_blocks is None else len(pool_blocks)
    for block in blocks:
        if block.__class__ is not KVCacheBlock and not isinstance(block, KVCacheBlock):
            raise TypeError(f"blocks must be KVCacheBlock, got {type(block).__name__}")
        if n_pool >= 0:
            bid = block._block_id
            if not (0 <= bid < n_pool and pool_blocks[bid] is block):
                raise RuntimeError(f"block {bid} is not a block of this pool (a hit from another manager?)")
        if (block._ref_cnt == 0 and queue is not None and not block._is_null
                and (block._queue is not queue or block._prev_free_block is None
                     or block._next_free_block is None)):
            raise RuntimeError(f"remove() called on an invalid block: {block}")


class BlockPool(_Checked):
    """All KV-cache blocks: allocation, freeing, caching and lazy eviction.

    Args:
        num_gpu_blocks: blocks in the pool (block 0 becomes the null block).
        enable_caching: whether prefix caching is on.
        hash_block_size: the block size request hashes are computed at.
        enable_kv_cache_events: queue BlockStored / BlockRemoved /
            AllBlocksCleared events for ``take_events``.
        metrics_collector: a ``KVCacheMetricsCollector`` (or None): its hooks
            are called where vLLM's pool calls them (allocation, touch,
            eviction, reset); with None the pool calls nothing.
        num_hash_lookahead_tokens: tokens after each block that its hash
            covers; ``BlockStored`` events then carry them
            (``lookahead_token_ids``) and the extra keys of that longer span.
        medium: the storage medium ``BlockStored`` events report.
        use_int_block_hashes: publish hashes in events as 64-bit ints
            (default: vLLM's ``VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES``).
    """

    # The pool's structure is fixed when it is made; counters and the
    # collector are free (num_evictions: a property, checked).
    _RULES = dict.fromkeys(
        ("num_gpu_blocks", "enable_caching", "hash_block_size", "blocks", "free_block_queue",
         "cached_block_hash_to_block", "null_block", "enable_kv_cache_events", "use_int_block_hashes",
         "kv_event_queue", "num_hash_lookahead_tokens", "medium", "_partial_keys"),
        _READ_ONLY,
    )

    @property
    def cached_block_hashes_by_block(self) -> Mapping[int, frozenset[bytes]]:
        """Each block's partial prefix-cache entries beside its own key (block id ->
        cache keys), as vLLM's pool keeps them; a read-only view (the pool owns them)."""
        return MappingProxyType(self._partial_keys)

    @property
    def num_evictions(self) -> int:
        """Cached blocks evicted so far (their hash dropped on reuse); a kvcy extension."""
        return self._num_evictions

    @num_evictions.setter
    def num_evictions(self, value: int) -> None:
        self._num_evictions = _as_index("num_evictions", value)

    def __init__(
        self,
        num_gpu_blocks: int,
        enable_caching: bool,
        hash_block_size: int,
        enable_kv_cache_events: bool = False,
        metrics_collector: Any = None,
        num_hash_lookahead_tokens: int = 0,
        medium: str | None = "GPU",
        use_int_block_hashes: bool | None = None,
    ) -> None:
        if isinstance(num_gpu_blocks, bool):
            raise TypeError(f"num_gpu_blocks must be an int, got {type(num_gpu_blocks).__name__}")
        # (vLLM asserts an int above 0)
        if not isinstance(num_gpu_blocks, int):
            raise AssertionError(f"num_gpu_blocks must be an int, got {type(num_gpu_blocks).__name__}")
        if num_gpu_blocks < 1:
            raise AssertionError(f"num_gpu_blocks must be at least 1 (the null block), got {num_gpu_blocks}")
        if num_gpu_blocks > 2**31:
            raise ValueError(
                f"num_gpu_blocks must be at most 2**31 (block ids are int32, as in vLLM's block tables), "
                f"got {num_gpu_blocks}"
            )
        if isinstance(hash_block_size, bool) or not isinstance(hash_block_size, int) or hash_block_size <= 0:
            raise ValueError(f"hash_block_size must be a positive int, got {hash_block_size!r}")
        num_hash_lookahead_tokens = _lookahead_count("num_hash_lookahead_tokens", num_hash_lookahead_tokens)
        if medium is not None and not isinstance(medium, str):
            raise TypeError(f"medium must be a str or None, got {type(medium).__name__}")
        self.num_gpu_blocks = num_gpu_blocks
        self.num_hash_lookahead_tokens = num_hash_lookahead_tokens
        self.medium = medium
        self.enable_caching = bool(enable_caching)
        self.hash_block_size = hash_block_size
        self.blocks: list[KVCacheBlock] = [KVCacheBlock(i) for i in range(num_gpu_blocks)]
        self.free_block_queue = FreeKVCacheBlockQueue(self.blocks)
        self.cached_block_hash_to_block = BlockHashToBlockMap()
        #: block id -> the cache keys the block carries besides its own
        #: (``block_hash``): partial prefix entries (``cache_partial_block``).
        self._partial_keys: dict[int, frozenset[bytes]] = {}
        self.null_block = self.free_block_queue.popleft()
        self.null_block._is_null = True
        self.enable_kv_cache_events = bool(enable_kv_cache_events)
        self.use_int_block_hashes = (
            default_use_int_block_hashes() if use_int_block_hashes is None else bool(use_int_block_hashes)
        )
        self.kv_event_queue: list[KVCacheEvent] = []
        self.metrics_collector = metrics_collector
        #: Cached blocks evicted so far (their hash dropped on reuse); a kvcy extension.
        self._num_evictions = 0

    # ------------------------------------------------------------------ lookups
    def get_cached_block(self, block_hash: bytes, kv_cache_group_ids: list[int]) -> list[KVCacheBlock] | None:
        """One cached block per group for ``block_hash``, or None if any group misses."""
        out = []
        for group_id in kv_cache_group_ids:
            block = self.cached_block_hash_to_block.get_one_block(_group_key(block_hash, group_id))
            if block is None:
                return None
            out.append(block)
        return out

    # ------------------------------------------------------------------ caching
    def _ext(self, block_hash: bytes):
        return external_block_hash(block_hash, self.use_int_block_hashes)

    def cache_full_blocks(
        self,
        request: Request,
        blocks: list[KVCacheBlock],
        num_cached_blocks: int,
        num_full_blocks: int,
        block_size: int,
        kv_cache_group_id: int,
        block_mask: Sequence[bool] | None = None,
    ) -> None:
        """Give blocks ``[num_cached_blocks, num_full_blocks)`` their hashes and cache them.

        Null blocks are skipped, and so are the blocks whose ``block_mask`` entry (one per
        block of that range, if given) is false: blocks no later hit can use.  With events
        on, one ``BlockStored`` is queued.
        """
        if num_cached_blocks >= num_full_blocks:
            return
        if num_cached_blocks < 0:
            raise ValueError(f"num_cached_blocks must be non-negative, got {num_cached_blocks}")
        if blocks is None:
            raise TypeError("blocks must be a list of KVCacheBlock, got None")
        # More full blocks than the request holds (its tokens run past max_model_len, where
        # allocation stops): vLLM caches the blocks there are (its slice of ``blocks``), and
        # with events on its event loop then indexes past them (IndexError, no event).
        past_blocks = num_full_blocks > len(blocks)
        if past_blocks:
            num_full_blocks = max(len(blocks), num_cached_blocks)
        if block_mask is not None:
            block_mask = _checked_mask(block_mask, num_full_blocks - num_cached_blocks)
        block_hashes = resolve_block_hashes(request.block_hashes, self.hash_block_size, block_size)
        if len(block_hashes) < num_full_blocks:
            raise RuntimeError(
                f"request {request.request_id!r} has {len(block_hashes)} block hashes at block size "
                f"{block_size}, fewer than the {num_full_blocks} full blocks to cache"
            )
        if not 0 <= kv_cache_group_id <= 0xFFFFFFFF:
            raise ValueError(f"KV-cache group id {kv_cache_group_id} does not fit in 4 bytes")
        events = self.enable_kv_cache_events
        new_hashes: list = []
        cache = self.cached_block_hash_to_block
        i = num_cached_blocks
        key = None
        stop = num_full_blocks  # (the first block holding a partial entry, if any)
        try:  # (checks as it goes; a failure undoes what it did, below)
            for i in range(num_cached_blocks, num_full_blocks):
                blk = blocks[i]
                if blk._is_null or (block_mask is not None and not block_mask[i - num_cached_blocks]):
                    continue
                if blk._key is not None:
                    stop = i
                    key = None
                    break
                block_hash = block_hashes[i]
                key = _group_key(block_hash, kv_cache_group_id)
                blk._key = key
                blk._block_hash_num_tokens = (i + 1) * block_size
                cache.insert(key, blk)
                if events:
                    new_hashes.append(self._ext(block_hash))
        except BaseException:
            failed = blocks[i]
            if not isinstance(failed, KVCacheBlock):
                self._uncache(blocks, num_cached_blocks, i, block_mask)
                raise TypeError(f"blocks must be KVCacheBlock, got {type(failed).__name__}") from None
            keyed_here = key is not None and failed._key is key  # (block i got its key here)
            self._uncache(blocks, num_cached_blocks, i + 1 if keyed_here else i, block_mask)
            raise
        if stop < num_full_blocks:
            # A block with a partial entry fills up: its entries give way to the
            # full one (vLLM's promotion).  The rest is checked first; nothing
            # fails after that.
            try:
                self._check_promotions(blocks, block_hashes, stop, num_full_blocks, block_size, block_mask,
                                       num_cached_blocks)
            except BaseException:
                self._uncache(blocks, num_cached_blocks, stop, block_mask)
                raise
            for i in range(stop, num_full_blocks):
                blk = blocks[i]
                if blk._is_null or (block_mask is not None and not block_mask[i - num_cached_blocks]):
                    continue
                block_hash = block_hashes[i]
                if blk._key is not None:
                    self._emit_block_removed_events(self._remove_cached_block_hashes(blk))
                self._insert_block_hash(_group_key(block_hash, kv_cache_group_id), blk, (i + 1) * block_size)
                if events:
                    new_hashes.append(self._ext(block_hash))
        if events and past_blocks:
            raise IndexError("list index out of range")
        if events:
            parent = None if num_cached_blocks == 0 else self._ext(block_hashes[num_cached_blocks - 1])
            extra_keys_list = []
            lookahead_ids = [] if self.num_hash_lookahead_tokens else None
            mm_idx = 0
            for i in range(num_cached_blocks, num_full_blocks):
                if blocks[i]._is_null or (block_mask is not None and not block_mask[i - num_cached_blocks]):
                    continue
                start = i * block_size
                keys, mm_idx = self._event_extra_keys(request, start, start + block_size, mm_idx, lookahead_ids)
                extra_keys_list.append(untag_extra_keys(keys))
            self.kv_event_queue.append(
                self._block_stored(
                    request, new_hashes, parent, num_cached_blocks * block_size,
                    num_full_blocks * block_size, block_size, kv_cache_group_id, extra_keys_list, lookahead_ids,
                )
            )

    def _check_promotions(self, blocks: list, block_hashes, start: int, end: int, block_size: int,
                          block_mask: list | None, mask_start: int) -> None:
        # What cache_full_blocks reads of blocks[start:end] (and their hashes),
        # checked before any entry is dropped: KVCacheBlocks, bytes hashes, and
        # a block already keyed holds a partial entry (fewer tokens than the
        # full one), as vLLM asserts.
        for i in range(start, end):
            blk = blocks[i]
            if blk.__class__ is not KVCacheBlock and not isinstance(blk, KVCacheBlock):
                raise TypeError(f"blocks must be KVCacheBlock, got {type(blk).__name__}")
            if blk._is_null or (block_mask is not None and not block_mask[i - mask_start]):
                continue
            h = block_hashes[i]
            if h.__class__ is not bytes:
                raise TypeError(f"block hashes must be bytes, got {type(h).__name__}")
            if blk._key is not None:
                n = blk._block_hash_num_tokens
                assert n is not None and n < (i + 1) * block_size, \
                    "The block already has a hash. This should not happen."

    def _check_hashes_to_cache(self, request: Request, num_cached_blocks: int, num_full_blocks: int,
                               block_size: int) -> None:
        # What cache_full_blocks(request, ..., num_cached_blocks, num_full_blocks,
        # block_size, ...) reads of the request's hashes, checked before the
        # caller changes anything (it caches after allocating): enough of
        # them, and those it reads bytes.  The same errors.
        if num_cached_blocks >= num_full_blocks:
            return
        num_cached_blocks = max(num_cached_blocks, 0)
        hashes = request.block_hashes
        scale = 1
        if block_size != self.hash_block_size:
            resolve_block_hashes((), self.hash_block_size, block_size)  # (its ValueError for a bad size)
            scale = block_size // self.hash_block_size
        n = len(hashes) // scale
        if n < num_full_blocks:
            raise RuntimeError(
                f"request {_request_id(request)!r} has {n} block hashes at block size "
                f"{block_size}, fewer than the {num_full_blocks} full blocks to cache"
            )
        for j in range(num_cached_blocks * scale, num_full_blocks * scale):
            h = hashes[j]
            if h.__class__ is not bytes:
                raise TypeError(f"block hashes must be bytes, got {type(h).__name__}")

    def _uncache(self, blocks: list, start: int, end: int, block_mask: list | None = None) -> None:
        """Undo cache_full_blocks for ``blocks[start:end]`` (all keyed by it, but for null
        blocks and those ``block_mask``, aligned with ``start``, left out)."""
        cache = self.cached_block_hash_to_block
        for j, blk in enumerate(blocks[start:end]):
            if not blk._is_null and (block_mask is None or block_mask[j]):
                cache.pop(blk._key, blk._block_id)
                blk.reset_hash()

    def _event_extra_keys(self, request, start: int, end: int, mm_idx: int, lookahead_ids: list | None):
        # One block's extra keys for its BlockStored event, and the multimodal
        # index to resume at.  With hash lookahead they cover the block and its
        # lookahead tokens (as its hash does), whose ids go to lookahead_ids.
        lookahead = self.num_hash_lookahead_tokens
        if not lookahead:
            return generate_block_hash_extra_keys(request, start, end, mm_idx)
        keys, mm_idx = generate_block_hash_extra_keys(request, start, end + lookahead, mm_idx)
        features = request.mm_features
        while mm_idx > 0:  # (the next block starts inside the lookahead: resume at its first item)
            pos = features[mm_idx - 1].mm_position
            if pos.offset + pos.length <= end:
                break
            mm_idx -= 1
        lookahead_ids.append(request.all_token_ids[end:end + lookahead])
        return keys, mm_idx

    def _block_stored(
        self, request, hashes, parent, start, end, block_size, group_id, extra_keys_list, lookahead_ids
    ) -> BlockStored:
        lora = request.lora_request
        return BlockStored(
            block_hashes=hashes,
            parent_block_hash=parent,
            token_ids=request.all_token_ids[start:end],
            block_size=block_size,
            lora_id=lora.lora_int_id if lora is not None else None,
            medium=self.medium,
            lora_name=lora.lora_name if lora is not None else None,
            extra_keys=extra_keys_list if extra_keys_list else None,
            group_idx=group_id,
            session_id=getattr(request, "session_id", None),  # (vLLM's Request has one; kvcy's none)
            lookahead_token_ids=lookahead_ids,
        )

    def emit_cached_block_events(
        self, request: Request, num_cached_blocks: int, block_size: int, kv_cache_group_id: int
    ) -> None:
        """Queue a ``BlockStored`` for a prefix hit of ``num_cached_blocks`` blocks (no state change)."""
        if not self.enable_kv_cache_events or num_cached_blocks == 0:
            return
        block_hashes = resolve_block_hashes(request.block_hashes, self.hash_block_size, block_size)
        hashes = []
        extra_keys_list = []
        lookahead_ids = [] if self.num_hash_lookahead_tokens else None
        mm_idx = 0
        for i in range(num_cached_blocks):
            hashes.append(self._ext(block_hashes[i]))
            start = i * block_size
            keys, mm_idx = self._event_extra_keys(request, start, start + block_size, mm_idx, lookahead_ids)
            extra_keys_list.append(untag_extra_keys(keys))
        self.kv_event_queue.append(
            self._block_stored(
                request, hashes, None, 0, num_cached_blocks * block_size, block_size,
                kv_cache_group_id, extra_keys_list, lookahead_ids,
            )
        )

    # ------------------------------------------------------------------ allocation
    def get_new_blocks(self, num_blocks: int) -> list[KVCacheBlock]:
        """Pop ``num_blocks`` free blocks, evicting any cached ones, ref_cnt 0 -> 1.

        Raises:
            ValueError: fewer than ``num_blocks`` blocks are free (nothing changes).
        """
        num_blocks = _check_count("num_blocks", num_blocks)
        if num_blocks > self.free_block_queue._num_free_blocks:
            raise ValueError(f"Cannot get {num_blocks} free blocks from the pool")
        ret = self.free_block_queue.popleft_n(num_blocks)
        if self.metrics_collector is not None:
            self._metered_new_blocks(ret)
        elif self.enable_caching:
            partial = bool(self._partial_keys)  # (a block's extra keys outlive its own)
            for block in ret:
                if block._key is not None or partial:
                    self._evict_cached_block(block)
                block._ref_cnt += 1
        else:
            for block in ret:
                block._ref_cnt += 1
        return ret

    def _metered_new_blocks(self, ret: list[KVCacheBlock]) -> None:
        # get_new_blocks with a metrics collector, in vLLM's order: with caching on,
        # each block's eviction (its hook first, even for a block with no key), then
        # its reference and its allocation hook.
        caching = self.enable_caching
        for block in ret:
            if caching:
                self._evict_cached_block(block)
            block._ref_cnt += 1
            if self.metrics_collector:
                self.metrics_collector.on_block_allocated(block)

    def _maybe_evict_cached_block(self, block: KVCacheBlock) -> bool:
        """Drop ``block``'s prefix-cache entries, with their events: False if it had none.

        Raises:
            TypeError / RuntimeError: ``block`` is not a KVCacheBlock of this pool.
        """
        self._check_own_block("block", block)
        return self._evict_cached_block(block)

    def _evict_cached_block(self, block: KVCacheBlock) -> bool:
        if self.metrics_collector:  # (vLLM's order: the hook first, for a block with no key too)
            self.metrics_collector.on_block_evicted(block)
        key = block._key
        if block._block_id in self._partial_keys:  # (partial entries too: every key goes)
            removed = self._remove_cached_block_hashes(block)
            if not removed:
                return False
            self.__dict__["_num_evictions"] += 1
            self._emit_block_removed_events(removed)
            return True
        if key is None:
            return False
        if self.cached_block_hash_to_block.pop(key, block._block_id) is None:
            return False
        block._key = None
        block._block_hash_num_tokens = None
        self.__dict__["_num_evictions"] += 1  # (past _Checked.__setattr__: once an eviction)
        if self.enable_kv_cache_events:
            self.kv_event_queue.append(
                BlockRemoved(
                    block_hashes=[self._ext(key[:-4])],
                    medium=self.medium,
                    group_idx=int.from_bytes(key[-4:], "big"),
                )
            )
        return True

    def _remove_cached_block_hashes(self, block: KVCacheBlock) -> list[bytes]:
        # Drop every cache entry of ``block``: its own key first, then its partial
        # entries (in their set's order).  The keys that were in the map, for
        # events; the block is left with no key (as in vLLM, even if none was).
        keys = [] if block._key is None else [block._key]
        extra = self._partial_keys.pop(block._block_id, None)
        if extra:
            keys.extend(extra)
        if not keys:
            return []
        cache = self.cached_block_hash_to_block
        bid = block._block_id
        removed = [key for key in keys if cache.pop(key, bid) is not None]
        block._key = None
        block._block_hash_num_tokens = None
        return removed

    def _emit_block_removed_events(self, keys: list[bytes]) -> None:
        # One BlockRemoved per dropped cache key, in order.
        if not self.enable_kv_cache_events:
            return
        for key in keys:
            self.kv_event_queue.append(
                BlockRemoved(
                    block_hashes=[self._ext(key[:-4])],
                    medium=self.medium,
                    group_idx=int.from_bytes(key[-4:], "big"),
                )
            )

    def _insert_block_hash(self, key: bytes, block: KVCacheBlock, num_tokens: int | None) -> None:
        # Cache ``block`` under ``key`` (unless it is there already): as its own key
        # if it has none, else as one of its partial entries.
        if block._key == key:
            return
        cache = self.cached_block_hash_to_block
        if cache.contain(key, block._block_id):
            return
        if block._key is None:
            block._key = key
            block._block_hash_num_tokens = num_tokens
        else:
            self._partial_keys[block._block_id] = self._partial_keys.get(block._block_id, frozenset()) | {key}
        cache.insert(key, block)

    def evict_blocks(self, block_ids: set[int]) -> None:
        """Drop the cache keys of the given blocks (they stay where they are)."""
        block_ids = list(block_ids)  # (read twice: checked first)
        for block_id in block_ids:
            if isinstance(block_id, bool) or not isinstance(block_id, int):
                raise TypeError(f"block ids must be ints, got {type(block_id).__name__}")
            if block_id >= self.num_gpu_blocks:  # (vLLM asserts this, naming the connector)
                raise AssertionError(
                    f"Invalid block_id {block_id} >= {self.num_gpu_blocks}. This indicates a bug in the KV "
                    "connector - workers should only report block IDs that were allocated by the scheduler."
                )
            if block_id < 0:
                raise ValueError(f"block id {block_id} is outside the pool of {self.num_gpu_blocks}")
        for block_id in block_ids:
            self._evict_cached_block(self.blocks[block_id])

    def touch(self, blocks: Sequence[KVCacheBlock] | Sequence[Sequence[KVCacheBlock]]) -> None:
        """Take a reference on cache-hit blocks, unlinking free ones from the queue.

        ``blocks`` holds blocks, or one sequence of blocks per KV-cache group.

        Raises:
            TypeError: an element is not a KVCacheBlock.
            RuntimeError: a block with no references is not in the free queue.
            In both cases nothing changes.
        """
        if blocks and not isinstance(blocks[0], KVCacheBlock):
            groups = [list(group) for group in blocks]
        else:
            groups = [list(blocks)]
        for group in groups:  # check everything before any change
            _check_touchable(group, self.free_block_queue, self.blocks)
        for group in groups:
            self._touch(group)

    def _touch(self, blocks: list[KVCacheBlock]) -> None:
        queue = self.free_block_queue
        if self.metrics_collector is not None:
            for block in blocks:
                if block._is_null:
                    continue
                if block._ref_cnt == 0:
                    queue.remove(block)
                block._ref_cnt += 1
                if self.metrics_collector:
                    self.metrics_collector.on_block_accessed(block)
            return
        for block in blocks:
            if block._is_null:
                continue
            if block._ref_cnt == 0:
                queue.remove(block)
            block._ref_cnt += 1

    def is_block_writable(self, block: KVCacheBlock) -> bool:
        """Whether the one request holding ``block`` may write it in place.

        True for a block that is not the null block, has exactly one reference
        and no cache key (a cached block's contents are shared through the prefix
        cache).

        Raises:
            TypeError: ``block`` is not a KVCacheBlock.
        """
        if block.__class__ is not KVCacheBlock and not isinstance(block, KVCacheBlock):
            raise TypeError(f"block must be a KVCacheBlock, got {type(block).__name__}")
        return not block._is_null and block._ref_cnt == 1 and block._key is None

    def move_block_hashes(self, src_block: KVCacheBlock, dst_block: KVCacheBlock) -> None:
        """Move ``src_block``'s prefix-cache entries to ``dst_block``.

        For copy-on-write: the request holding ``src_block`` goes on writing it,
        and a copy in ``dst_block`` serves later hits under the same keys (its
        own key keeps its token count, its partial entries stay partial).
        ``src_block`` is left with no key.  No event is queued and nothing is
        evicted: the entries stay cached.  Nothing happens when ``src_block``
        has no entries.

        Raises:
            TypeError: a block is not a KVCacheBlock.
            RuntimeError: a block is not one of this pool's blocks.
            AssertionError: ``dst_block`` has a cache key or partial entries already
                (as vLLM asserts).
            ValueError: ``dst_block`` is the null block, which is never cached.
            Nothing changes when one is raised.
        """
        self._check_own_block("src_block", src_block)
        self._check_own_block("dst_block", dst_block)
        if dst_block._key is not None:
            raise AssertionError(f"dst_block {dst_block._block_id} already has a cache key")
        if dst_block._block_id in self._partial_keys:
            raise AssertionError(f"dst_block {dst_block._block_id} already has partial cache entries")
        if dst_block._is_null:
            raise ValueError("dst_block is the null block, which is never cached")
        num_tokens = src_block._block_hash_num_tokens
        for key in self._remove_cached_block_hashes(src_block):
            # (the token count goes with the first entry, which becomes dst's own key)
            self._insert_block_hash(key, dst_block, num_tokens)

    def _check_own_block(self, name: str, block: Any) -> None:
        """``block`` is a KVCacheBlock of this pool, or TypeError / RuntimeError."""
        if block.__class__ is not KVCacheBlock and not isinstance(block, KVCacheBlock):
            raise TypeError(f"{name} must be a KVCacheBlock, got {type(block).__name__}")
        bid = block._block_id
        if not (0 <= bid < len(self.blocks) and self.blocks[bid] is block):
            raise RuntimeError(f"{name} (block {bid}) is not a block of this pool")

    def unpin_blocks(self, blocks: Iterable[KVCacheBlock], on_reuse: Callable[[KVCacheBlock], None]) -> None:
        """Not implemented: releasing blocks that stay readable until reused is for HiSparse.

        Raises:
            NotImplementedError: always (HiSparse is out of kvcy's scope).
        """
        raise NotImplementedError(
            "BlockPool.unpin_blocks (blocks read until the pool reuses them) serves HiSparse, "
            "which kvcy does not implement"
        )

    def cache_partial_block(
        self,
        request: Request,
        block: KVCacheBlock,
        num_tokens: int,
        kv_cache_group_id: int,
        block_size: int,
        replace_existing_hashes: bool = False,
    ) -> bytes | None:
        """Make ``block`` reachable from the prefix of ``num_tokens`` tokens that ends inside it.

        The entry's key is the request's hash at that boundary (its
        ``num_tokens // hash_block_size``-th hash) with the group id.  A block
        with no key takes it as its own (with ``num_tokens`` as its token count);
        a block with a key keeps it as a partial entry
        (``cached_block_hashes_by_block``), dropped with the block's own key on
        eviction, on reset, and when a longer entry replaces it.  If the block's
        own key covers fewer tokens, its entries are dropped first (with
        ``BlockRemoved`` events); ``replace_existing_hashes`` drops them in any
        case (the block was rewritten).  A new entry queues a ``BlockStored`` of
        the one hash block ending at the boundary.

        Returns:
            The entry's cache key, or None for the null block (nothing is cached).

        Raises:
            TypeError: ``block`` is not a KVCacheBlock, ``num_tokens``,
                ``kv_cache_group_id`` or ``block_size`` is not an int, or the
                request's hash is not bytes.
            RuntimeError: ``block`` is not a block of this pool.
            ValueError: the group id does not fit in 4 bytes.
            AssertionError: ``block_size`` is not a multiple of the hash block size,
                or ``num_tokens`` not a positive multiple of it within the
                request's hashes (as vLLM asserts).
            Nothing changes when one is raised.
        """
        self._check_own_block("block", block)
        if block._is_null:
            return None
        num_tokens = _int_arg("num_tokens", num_tokens)
        kv_cache_group_id = _int_arg("kv_cache_group_id", kv_cache_group_id)
        block_size = _int_arg("block_size", block_size)
        hbs = self.hash_block_size
        assert block_size % hbs == 0, (
            f"block_size {block_size} is not a multiple of the hash block size {hbs}"
        )
        hashes = _block_hashes_of(request)
        assert num_tokens % hbs == 0, f"num_tokens {num_tokens} is not a multiple of the hash block size {hbs}"
        n_hash = num_tokens // hbs
        assert 0 < n_hash <= len(hashes), (
            f"num_tokens {num_tokens} is not within the request's {len(hashes)} block hashes "
            f"of {hbs} tokens"
        )
        if not 0 <= kv_cache_group_id <= 0xFFFFFFFF:
            raise ValueError(f"KV-cache group id {kv_cache_group_id} does not fit in 4 bytes")
        block_hash = hashes[n_hash - 1]
        if block_hash.__class__ is not bytes:
            raise TypeError(f"block hashes must be bytes, got {type(block_hash).__name__}")
        events = self.enable_kv_cache_events
        parent = hashes[n_hash - 2] if n_hash > 1 else None
        if events and parent is not None and parent.__class__ is not bytes:
            raise TypeError(f"block hashes must be bytes, got {type(parent).__name__}")
        key = _group_key(block_hash, kv_cache_group_id)
        already_cached = block._key == key or self.cached_block_hash_to_block.contain(key, block._block_id)
        if replace_existing_hashes:
            self._emit_block_removed_events(self._remove_cached_block_hashes(block))
            already_cached = False
        elif (not already_cached and block._key is not None and block._block_hash_num_tokens is not None
              and block._block_hash_num_tokens < num_tokens):
            self._emit_block_removed_events(self._remove_cached_block_hashes(block))
        self._insert_block_hash(key, block, num_tokens)
        if events and not already_cached:
            start = num_tokens - hbs
            lookahead_ids = [] if self.num_hash_lookahead_tokens else None
            keys, _ = self._event_extra_keys(request, start, num_tokens, 0, lookahead_ids)
            self.kv_event_queue.append(
                self._block_stored(
                    request, [self._ext(block_hash)], None if parent is None else self._ext(parent),
                    start, num_tokens, hbs, kv_cache_group_id, [untag_extra_keys(keys)], lookahead_ids,
                )
            )
        return key

    def free_blocks(self, ordered_blocks: Iterable[KVCacheBlock]) -> None:
        """Drop one reference on each block, in eviction order.

        A block reaching 0 goes to the tail of the free queue if it is cached
        (LRU) and to the head if not (reused first); each batch keeps the
        given order.

        Raises:
            TypeError: an element is not a KVCacheBlock.
            RuntimeError: a block would be freed more times than it was taken.
            In both cases nothing changes.
        """
        blocks_list = list(ordered_blocks)
        to_tail: list[KVCacheBlock] = []
        to_head: list[KVCacheBlock] = []
        caching = self.enable_caching
        for i, block in enumerate(blocks_list):
            if block.__class__ is not KVCacheBlock and not isinstance(block, KVCacheBlock):
                self._undo_free(blocks_list, i)
                raise TypeError(f"free_blocks takes KVCacheBlock, got {type(block).__name__}")
            if block._is_null:
                continue
            if block._ref_cnt <= 0:
                self._undo_free(blocks_list, i)
                raise RuntimeError(f"block {block._block_id} freed more times than it was taken")
            block._ref_cnt -= 1
            if block._ref_cnt == 0:
                if caching and block._key is not None:
                    to_tail.append(block)
                else:
                    to_head.append(block)
        self.free_block_queue.append_n(to_tail)
        self.free_block_queue.prepend_n(to_head)

    @staticmethod
    def _undo_free(blocks_list: list[KVCacheBlock], upto: int) -> None:
        """Give back the references free_blocks took from ``blocks_list[:upto]``."""
        for done in blocks_list[:upto]:
            if not done._is_null:
                done._ref_cnt += 1

    def reset_prefix_cache(self) -> bool:
        """Drop every cache key; only when no block but the null block is in use."""
        num_used_blocks = self.num_gpu_blocks - self.get_num_free_blocks()
        if num_used_blocks != 1:
            logger.warning(
                "Failed to reset prefix cache because some blocks (%d) are not freed yet",
                num_used_blocks - 1,
            )
            return False
        object.__setattr__(self, "cached_block_hash_to_block", BlockHashToBlockMap())
        self._partial_keys.clear()
        for block in self.blocks:
            block.reset_hash()
        if self.metrics_collector:
            self.metrics_collector.reset()
        logger.info("Successfully reset prefix cache")
        if self.enable_kv_cache_events:
            self.kv_event_queue.append(AllBlocksCleared())
        return True

    def get_num_free_blocks(self) -> int:
        return self.free_block_queue._num_free_blocks

    def get_usage(self) -> float:
        """Fraction of usable blocks in use (the null block does not count)."""
        total = self.num_gpu_blocks - 1
        if total <= 0:
            return 0.0
        return 1.0 - (self.get_num_free_blocks() / total)

    def take_events(self) -> list[KVCacheEvent]:
        """Drain the event queue."""
        if not self.enable_kv_cache_events:
            return []
        events = self.kv_event_queue
        object.__setattr__(self, "kv_event_queue", [])
        return events
