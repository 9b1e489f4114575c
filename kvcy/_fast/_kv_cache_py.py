"""Pure-Python twin of the KV-cache block manager.

Everything that runs per block or per request lives here, twice (see
``_kv_cache_c.pyx``): blocks and the LRU free queue, the hash-to-block map,
the block pool, the single-type managers, the coordinators and the
``KVCacheManager`` engine.  The public modules (``kvcy.block_pool``,
``kvcy.kv_cache_manager``, ...) re-export the selected twin.

Behaviour follows vLLM 0.33.0 decision for decision; the golden vectors in
``shared/golden`` are the oracle.
"""

from __future__ import annotations

import logging
import operator
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from kvcy.hashing import generate_block_hash_extra_keys
from kvcy.kv_cache_interface import (
    ChunkedLocalAttentionSpec,
    CrossAttentionSpec,
    FullAttentionSpec,
    KVCacheConfig,
    KVCacheSpec,
    MambaSpec,
    SlidingWindowSpec,
    get_kv_cache_spec_kind,
    get_kv_cache_spec_sliding_window,
)
from kvcy.kv_events import (
    MEDIUM_GPU,
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    KVCacheEvent,
    default_use_int_block_hashes,
    external_block_hash,
    untag_extra_keys,
)
from kvcy.metrics import PrefixCacheStats
from kvcy._fast._request_tables import _BlockTable, _CountTable
from kvcy._request_types import (
    LoRARequest,
    MultiModalFeatureSpec,
    RequestStatus,
    check_request_args,
    validate_token_ids,
)

logger = logging.getLogger("kvcy")

IMPLEMENTATION = "python"

_WAITING = RequestStatus.WAITING
_PREEMPTED = RequestStatus.PREEMPTED
# Compared by value (``in`` falls back to ==), as vLLM does: a status from
# vLLM's own RequestStatus class counts the same as kvcy's.
_WATERMARK_STATUSES = (_WAITING, _PREEMPTED)


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _check_count(name: str, value: Any) -> int:
    """A non-negative int argument, or a clear TypeError / ValueError."""
    if value.__class__ is not int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(f"{name} must be an int, got {type(value).__name__}")
        value = int(value)
    if value < 0:
        raise ValueError(f"{name} must be non-negative, got {value}")
    if value > 2**62:
        raise ValueError(f"{name} is too large: {value}")
    return value



def _as_index(name: str, value: Any) -> int:
    """An integer field as the compiled twin's C integer fields take it (any int, bools
    included, within 64 bits), or TypeError / OverflowError."""
    value = operator.index(value)
    if not -(2**63) <= value < 2**63:
        raise OverflowError(f"{name}: Python int too large to convert to C ssize_t")
    return value


def _list_or_none(name: str, value: Any) -> Any:
    if value is not None and value.__class__ is not list:
        raise TypeError(f"Expected list, got {type(value).__name__}")
    return value


def _tuple_or_none(name: str, value: Any) -> Any:
    if value is not None and value.__class__ is not tuple:
        raise TypeError(f"Expected tuple, got {type(value).__name__}")
    return value


def _count_rule(name: str, value: Any) -> int:
    return _check_count(name, value)


def _checked_block_hashes(name: str, value: Any) -> list:
    # Block hashes as assigned from outside: a list of bytes.
    if value.__class__ is not list:
        raise TypeError(f"block_hashes must be a list of bytes, got {type(value).__name__}")
    for h in value:
        if h.__class__ is not bytes:
            raise TypeError(f"block hashes must be bytes, got {type(h).__name__}")
    return value


_READ_ONLY = None  # a rule: set once (by the constructor), never again


class _Checked:
    """Attribute assignment as the compiled twin's typed fields allow it.

    ``_RULES`` maps a public name to ``_READ_ONLY`` (the constructor sets it
    once; later assignments and deletions raise AttributeError, as for a
    ``readonly`` C field) or to a function ``(name, value) -> value`` that
    checks (and may convert) what is assigned.  Other names are free.  Reads
    are plain attribute reads, so hot paths pay nothing; the twin's own code
    re-sets a read-only field with ``object.__setattr__``.
    """

    __slots__ = ()
    _RULES: dict[str, Any] = {}

    def __setattr__(self, name: str, value: Any) -> None:
        rules = self._RULES
        if name in rules:
            rule = rules[name]
            if rule is _READ_ONLY:
                if _has_attr(self, name):
                    raise AttributeError(f"attribute '{name}' of '{type(self).__name__}' objects is not writable")
            else:
                value = rule(name, value)
        object.__setattr__(self, name, value)

    def __delattr__(self, name: str) -> None:
        if name in self._RULES:
            raise AttributeError(f"attribute '{name}' of '{type(self).__name__}' objects is not writable")
        object.__delattr__(self, name)


def _has_attr(obj: Any, name: str) -> bool:
    try:
        object.__getattribute__(obj, name)
    except AttributeError:
        return False
    return True


def _check_ref_cnt(value: Any) -> int:
    """A reference count as assigned from outside: an int in [0, 2**31)."""
    value = _check_count("ref_cnt", value)
    if value >= 2**31:
        raise ValueError(f"ref_cnt must be below 2**31, got {value}")
    return value


# =============================================================================
# The request
# =============================================================================
def _spec_token_ids_rule(name: str, value: Any) -> list:
    return validate_token_ids(value, "spec_token_ids")


class Request(_Checked):
    """A request as the KV-cache manager sees it.

    Args:
        request_id: unique id of the request.
        prompt_token_ids: the prompt's token ids (ints that fit in 64 bits).
        max_tokens: how many output tokens the request may produce (informative
            for a serving loop; the manager does not read it).
        lora_request: the LoRA adapter, if any (enters every block hash).
        mm_features: multimodal items sorted by placeholder offset.
        cache_salt: isolates this request's prefix cache (enters the hash of
            the block that starts at token 0).
        prompt_embeds: optional prompt embeddings (a tensor ``[num_prompt_tokens,
            hidden]``); their bytes enter the block hashes.
        block_hasher: from :func:`kvcy.hashing.get_request_block_hasher`; without
            one the request has no block hashes and never hits the cache.
        kv_cache_report_mode: ``"full"`` makes ``get_computed_blocks`` re-emit
            ``BlockStored`` events for prefix hits.
        arrival_time: free for the serving loop's use.
    """

    # What shapes the request's hashes or the manager's bookkeeping is set
    # once, by the constructor; counts a scheduler moves are checked when
    # assigned (the compiled twin's C fields behind properties).
    _RULES = {
        **dict.fromkeys(
            ("request_id", "prompt_token_ids", "lora_request", "mm_features", "cache_salt", "prompt_embeds",
             "kv_cache_report_mode", "num_prompt_tokens", "_all_token_ids", "_output_token_ids",
             "_block_hasher"),
            _READ_ONLY,
        ),
        "num_computed_tokens": _count_rule,
        "num_in_flight_tokens": _count_rule,
        "num_preemptions": _count_rule,
        "spec_token_ids": _spec_token_ids_rule,
        "block_hashes": _checked_block_hashes,
    }

    def __init__(
        self,
        request_id: str,
        prompt_token_ids: Sequence[int],
        max_tokens: int | None = None,
        *,
        lora_request: LoRARequest | None = None,
        mm_features: list[MultiModalFeatureSpec] | None = None,
        cache_salt: str | None = None,
        prompt_embeds: Any = None,
        block_hasher: Callable[[Request], list[bytes]] | None = None,
        kv_cache_report_mode: str = "incremental",
        arrival_time: float = 0.0,
        skip_reading_prefix_cache: bool = False,
    ) -> None:
        prompt, features = check_request_args(
            request_id, prompt_token_ids, max_tokens, mm_features, cache_salt, prompt_embeds,
            kv_cache_report_mode,
        )

        self.request_id = request_id
        self.prompt_token_ids = prompt
        self.max_tokens = max_tokens
        self.lora_request = lora_request
        self.mm_features = features
        self.cache_salt = cache_salt
        self.prompt_embeds = prompt_embeds
        self.kv_cache_report_mode = kv_cache_report_mode
        self.arrival_time = arrival_time
        self.skip_reading_prefix_cache = skip_reading_prefix_cache

        self.status = RequestStatus.WAITING
        self.num_computed_tokens = 0
        self.num_in_flight_tokens = 0
        self.num_preemptions = 0
        self.num_prompt_tokens = len(prompt)
        self.spec_token_ids: list[int] = []
        self._output_token_ids: list[int] = []
        self._all_token_ids: list[int] = list(prompt)

        self.block_hashes: list[bytes] = []
        self._block_hasher = block_hasher
        if block_hasher is not None:
            self.block_hashes.extend(block_hasher(self))

    # ------------------------------------------------------------------ tokens
    @property
    def num_tokens(self) -> int:
        """Prompt plus output tokens."""
        return len(self._all_token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self._output_token_ids)

    @property
    def output_token_ids(self) -> list[int]:
        """The output tokens so far (do not mutate; use append_output_token_ids)."""
        return self._output_token_ids

    @property
    def all_token_ids(self) -> list[int]:
        """Prompt followed by output tokens (do not mutate)."""
        return self._all_token_ids

    @property
    def is_finished(self) -> bool:
        return RequestStatus.is_finished(self.status)

    def append_output_token_ids(self, token_ids: int | Sequence[int]) -> None:
        """Append sampled tokens and hash any blocks they complete.

        Raises:
            TypeError / ValueError: a token is not an int or does not fit in 64
                bits; nothing is appended then.
        """
        if isinstance(token_ids, int) and not isinstance(token_ids, bool):
            tokens = validate_token_ids([token_ids], "output token ids")
        else:
            tokens = validate_token_ids(token_ids, "output token ids")
        self._output_token_ids.extend(tokens)
        self._all_token_ids.extend(tokens)
        if self._block_hasher is not None:
            self.block_hashes.extend(self._block_hasher(self))

    def __repr__(self) -> str:
        return (
            f"Request(id={self.request_id!r}, tokens={self.num_tokens}, "
            f"computed={self.num_computed_tokens}, status={self.status.name})"
        )


# =============================================================================
# Blocks and the free queue
# =============================================================================
def _check_key(key: Any) -> bytes:
    """A cache key as a block may carry it: hash bytes + the 4-byte group id (as the compiled twin checks)."""
    if not isinstance(key, bytes) or len(key) < 4:
        raise ValueError(f"a cache key is a block hash followed by a 4-byte group id, got {key!r}")
    return key


class KVCacheBlock:
    """One KV-cache block: id, reference count, cache key, free-list links."""

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

    def __init__(self, block_id: int) -> None:
        if block_id.__class__ is not int:
            if not isinstance(block_id, int):
                raise TypeError(f"an integer is required, got {type(block_id).__name__}")
            block_id = int(block_id)
        if not -(2**31) <= block_id < 2**31:
            raise OverflowError(f"block_id {block_id} does not fit in 32 bits")
        self._block_id = block_id
        self._ref_cnt = 0
        self._queue: FreeKVCacheBlockQueue | None = None  # the queue it was last put in
        self._key: bytes | None = None
        self._block_hash_num_tokens: int | None = None
        self._prev_free_block: KVCacheBlock | None = None
        self._next_free_block: KVCacheBlock | None = None
        self._is_null = False

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
            f"_block_hash={self._key!r}, prev_free_block={prev_id}, "
            f"next_free_block={next_id})"
        )


class FreeKVCacheBlockQueue:
    """Doubly linked list of free blocks, threaded through the blocks themselves.

    A fake head and tail (``block_id == -1``) remove the edge cases.  Removal
    from the middle is O(1), which ``touch`` needs when a cached free block is
    hit again.  Order: head = next to allocate, tail = most recently freed.
    """

    def __init__(self, blocks: list[KVCacheBlock]) -> None:
        self._num_free_blocks = len(blocks)
        for i in range(self._num_free_blocks):
            blocks[i]._queue = self
            if i > 0:
                blocks[i]._prev_free_block = blocks[i - 1]
            if i < self._num_free_blocks - 1:
                blocks[i]._next_free_block = blocks[i + 1]
        self._fake_free_list_head = KVCacheBlock(block_id=-1)
        self._fake_free_list_tail = KVCacheBlock(block_id=-1)
        if self._num_free_blocks > 0:
            self._fake_free_list_head._next_free_block = blocks[0]
            blocks[0]._prev_free_block = self._fake_free_list_head
            self._fake_free_list_tail._prev_free_block = blocks[-1]
            blocks[-1]._next_free_block = self._fake_free_list_tail
        else:
            self._fake_free_list_head._next_free_block = self._fake_free_list_tail
            self._fake_free_list_tail._prev_free_block = self._fake_free_list_head

    @property
    def num_free_blocks(self) -> int:
        return self._num_free_blocks

    @num_free_blocks.setter
    def num_free_blocks(self, value: int) -> None:
        self._num_free_blocks = _as_index("num_free_blocks", value)

    @property
    def fake_free_list_head(self) -> KVCacheBlock:
        return self._fake_free_list_head

    @property
    def fake_free_list_tail(self) -> KVCacheBlock:
        return self._fake_free_list_tail

    def popleft(self) -> KVCacheBlock:
        """Pop the head block.

        Raises:
            ValueError: the queue is empty.
        """
        first = self._fake_free_list_head._next_free_block
        if first is None or first is self._fake_free_list_tail:
            raise ValueError("No free blocks available")
        self._fake_free_list_head._next_free_block = first._next_free_block
        first._next_free_block._prev_free_block = self._fake_free_list_head
        first._prev_free_block = first._next_free_block = None
        self._num_free_blocks -= 1
        return first

    def popleft_n(self, n: int) -> list[KVCacheBlock]:
        """Pop ``n`` blocks from the head, in order.

        Raises:
            ValueError: fewer than ``n`` blocks are free, or ``n`` is negative.
        """
        if n < 0:
            raise ValueError(f"n must be non-negative, got {n}")
        if n == 0:
            return []
        if n > self._num_free_blocks:
            raise ValueError(f"Cannot pop {n} blocks: only {self._num_free_blocks} are free")
        out = []
        curr = self._fake_free_list_head._next_free_block
        for _ in range(n):
            out.append(curr)
            last = curr
            curr = curr._next_free_block
            last._prev_free_block = last._next_free_block = None
        self._fake_free_list_head._next_free_block = curr
        curr._prev_free_block = self._fake_free_list_head
        self._num_free_blocks -= n
        return out

    def remove(self, block: KVCacheBlock) -> None:
        """Unlink ``block`` from the middle of the queue.

        Raises:
            RuntimeError: the block is not in the queue.
        """
        if block._queue is not self or block._prev_free_block is None or block._next_free_block is None:
            raise RuntimeError(f"remove() called on an invalid block: {block}")
        block._prev_free_block._next_free_block = block._next_free_block
        block._next_free_block._prev_free_block = block._prev_free_block
        block._prev_free_block = block._next_free_block = None
        self._num_free_blocks -= 1

    def _check_not_queued(self, block: KVCacheBlock) -> None:
        if block.__class__ is not KVCacheBlock and not isinstance(block, KVCacheBlock):
            raise TypeError(f"free queue entries must be KVCacheBlock, got {type(block).__name__}")
        if block._prev_free_block is not None or block._next_free_block is not None:
            raise RuntimeError(f"block {block._block_id} is already in the free queue")
        if block._ref_cnt != 0:
            raise RuntimeError(f"block {block._block_id} has ref_cnt {block._ref_cnt}: only free blocks are queued")

    def _check_insertable(self, blocks: list[KVCacheBlock]) -> None:
        """Every block unqueued and listed once; nothing changes on error.

        Each checked block is marked (``prev_free_block`` = the fake head) so
        that a repeat shows; the caller's linking overwrites the marks.
        """
        head = self._fake_free_list_head
        held = 0
        for i, block in enumerate(blocks):
            if block.__class__ is not KVCacheBlock and not isinstance(block, KVCacheBlock):
                for done in blocks[:i]:
                    done._prev_free_block = None
                raise TypeError(f"free queue entries must be KVCacheBlock, got {type(block).__name__}")
            if block._prev_free_block is not None or block._next_free_block is not None:
                repeat = block._prev_free_block is head and block._next_free_block is None
                for done in blocks[:i]:
                    done._prev_free_block = None
                if repeat:
                    raise RuntimeError(f"block {block._block_id} appears twice in one batch")
                raise RuntimeError(f"block {block._block_id} is already in the free queue")
            block._prev_free_block = head
            block._queue = self
            held = held or block._ref_cnt
        if held:  # (after the membership checks, as the compiled twin does)
            for done in blocks:
                done._prev_free_block = None
            bad = next(b for b in blocks if b._ref_cnt != 0)
            raise RuntimeError(f"block {bad._block_id} has ref_cnt {bad._ref_cnt}: only free blocks are queued")

    def append(self, block: KVCacheBlock) -> None:
        """Put ``block`` at the tail (freed last, evicted last)."""
        self._check_not_queued(block)
        block._queue = self
        last = self._fake_free_list_tail._prev_free_block
        last._next_free_block = block
        block._prev_free_block = last
        block._next_free_block = self._fake_free_list_tail
        self._fake_free_list_tail._prev_free_block = block
        self._num_free_blocks += 1

    def append_n(self, blocks: list[KVCacheBlock]) -> None:
        """Put ``blocks`` at the tail, in order (the last one ends up last)."""
        if not blocks:
            return
        self._check_insertable(blocks)
        last = self._fake_free_list_tail._prev_free_block
        for block in blocks:
            block._prev_free_block = last
            last._next_free_block = block
            last = block
        last._next_free_block = self._fake_free_list_tail
        self._fake_free_list_tail._prev_free_block = last
        self._num_free_blocks += len(blocks)

    def prepend_n(self, blocks: list[KVCacheBlock]) -> None:
        """Put ``blocks`` at the head, in order (``blocks[0]`` becomes the head)."""
        if not blocks:
            return
        self._check_insertable(blocks)
        first = self._fake_free_list_head._next_free_block
        prev = self._fake_free_list_head
        for block in blocks:
            block._prev_free_block = prev
            prev._next_free_block = block
            prev = block
        prev._next_free_block = first
        first._prev_free_block = prev
        self._num_free_blocks += len(blocks)

    def get_all_free_blocks(self) -> list[KVCacheBlock]:
        """All free blocks from head to tail (for tests and checks)."""
        out = []
        curr = self._fake_free_list_head._next_free_block
        tail = self._fake_free_list_tail
        while curr is not tail:
            out.append(curr)
            curr = curr._next_free_block
        return out

    def __len__(self) -> int:
        return self._num_free_blocks


# =============================================================================
# Hash -> block map and the block pool
# =============================================================================
class BlockHashToBlockMap:
    """Cache key -> block(s).  The first block inserted under a key wins lookups.

    Several blocks may carry the same key (no de-duplication, so block tables
    stay append-only); the value is then a dict ``{block_id: block}`` in
    insertion order.
    """

    def __init__(self) -> None:
        self._cache: dict[bytes, Any] = {}

    def get_one_block(self, key: bytes) -> KVCacheBlock | None:
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
        return list(self._cache)

    def __len__(self) -> int:
        return len(self._cache)


def _group_key(block_hash: bytes, group_id: int) -> bytes:
    return block_hash + group_id.to_bytes(4, "big")


class _BlockHashView:
    """Request block hashes seen at a coarser block size (consecutive hashes joined)."""

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
        s = self._scale
        return b"".join(self._hashes[i * s : (i + 1) * s])


def resolve_block_hashes(hashes: list[bytes], hash_block_size: int, block_size: int):
    """The request's hashes at ``block_size`` (a multiple of ``hash_block_size``)."""
    if block_size == hash_block_size:
        return hashes
    if hash_block_size <= 0 or block_size <= 0 or block_size % hash_block_size != 0:
        raise ValueError(f"block size {block_size} is not a positive multiple of the hash block size "
                         f"{hash_block_size}")
    return _BlockHashView(hashes, block_size // hash_block_size)


def _request_id(request: Any) -> str:
    try:
        request_id = request.request_id
    except AttributeError:
        raise TypeError(f"expected a Request, got {type(request).__name__}") from None
    if request_id.__class__ is not str:
        _check_rid(request_id)
    return request_id


def _check_rid(request_id: Any) -> None:
    if not isinstance(request_id, str):
        raise TypeError(f"request_id must be a str, got {type(request_id).__name__}")


def _check_hit_args(kv_cache_group_ids, block_pool, alignment_tokens) -> None:
    # find_longest_cache_hit's arguments, before any use: one block list per group (so at
    # least one group), a pool to look in, a hit length rounded down to a positive alignment.
    if not len(kv_cache_group_ids):
        raise ValueError("kv_cache_group_ids must not be empty")
    if not isinstance(block_pool, BlockPool):
        raise TypeError(f"block_pool must be a BlockPool, got {type(block_pool).__name__}")
    if _check_count("alignment_tokens", alignment_tokens) == 0:
        raise ValueError("alignment_tokens must be positive, got 0")


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
        use_int_block_hashes: publish hashes in events as 64-bit ints
            (default: vLLM's ``VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES``).
    """

    # The pool's structure is fixed when it is made; counters and the
    # collector are free (num_evictions: a property, checked).
    _RULES = dict.fromkeys(
        ("num_gpu_blocks", "enable_caching", "hash_block_size", "blocks", "free_block_queue",
         "cached_block_hash_to_block", "null_block", "enable_kv_cache_events", "use_int_block_hashes",
         "kv_event_queue"),
        _READ_ONLY,
    )

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
        use_int_block_hashes: bool | None = None,
    ) -> None:
        if isinstance(num_gpu_blocks, bool) or not isinstance(num_gpu_blocks, int):
            raise TypeError(f"num_gpu_blocks must be an int, got {type(num_gpu_blocks).__name__}")
        if num_gpu_blocks < 1:
            raise ValueError(f"num_gpu_blocks must be at least 1 (the null block), got {num_gpu_blocks}")
        if num_gpu_blocks > 2**31:
            raise ValueError(
                f"num_gpu_blocks must be at most 2**31 (block ids are int32, as in vLLM's block tables), "
                f"got {num_gpu_blocks}"
            )
        if isinstance(hash_block_size, bool) or not isinstance(hash_block_size, int) or hash_block_size <= 0:
            raise ValueError(f"hash_block_size must be a positive int, got {hash_block_size!r}")
        self.num_gpu_blocks = num_gpu_blocks
        self.enable_caching = bool(enable_caching)
        self.hash_block_size = hash_block_size
        self.blocks: list[KVCacheBlock] = [KVCacheBlock(i) for i in range(num_gpu_blocks)]
        self.free_block_queue = FreeKVCacheBlockQueue(self.blocks)
        self.cached_block_hash_to_block = BlockHashToBlockMap()
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
    ) -> None:
        """Give blocks ``[num_cached_blocks, num_full_blocks)`` their hashes and cache them.

        Null blocks are skipped.  With events on, one ``BlockStored`` is queued.
        """
        if num_cached_blocks >= num_full_blocks:
            return
        if num_cached_blocks < 0:
            raise ValueError(f"num_cached_blocks must be non-negative, got {num_cached_blocks}")
        if blocks is None:
            raise TypeError("blocks must be a list of KVCacheBlock, got None")
        block_hashes = resolve_block_hashes(request.block_hashes, self.hash_block_size, block_size)
        if len(block_hashes) < num_full_blocks:
            raise RuntimeError(
                f"request {request.request_id!r} has {len(block_hashes)} block hashes at block size "
                f"{block_size}, fewer than the {num_full_blocks} full blocks to cache"
            )
        if num_full_blocks > len(blocks):
            raise RuntimeError(f"{num_full_blocks} full blocks to cache but the request holds {len(blocks)}")
        if not 0 <= kv_cache_group_id <= 0xFFFFFFFF:
            raise ValueError(f"KV-cache group id {kv_cache_group_id} does not fit in 4 bytes")
        events = self.enable_kv_cache_events
        new_hashes: list = []
        cache = self.cached_block_hash_to_block
        i = num_cached_blocks
        key = None
        try:  # (checks as it goes; a failure undoes what it did, below)
            for i in range(num_cached_blocks, num_full_blocks):
                blk = blocks[i]
                if blk._is_null:
                    continue
                assert blk._key is None, "The block already has a hash. This should not happen."
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
                self._uncache(blocks, num_cached_blocks, i)
                raise TypeError(f"blocks must be KVCacheBlock, got {type(failed).__name__}") from None
            keyed_here = key is not None and failed._key is key  # (block i got its key here)
            self._uncache(blocks, num_cached_blocks, i + 1 if keyed_here else i)
            raise
        if events:
            parent = None if num_cached_blocks == 0 else self._ext(block_hashes[num_cached_blocks - 1])
            extra_keys_list = []
            mm_idx = 0
            for i in range(num_cached_blocks, num_full_blocks):
                if blocks[i]._is_null:
                    continue
                start = i * block_size
                keys, mm_idx = generate_block_hash_extra_keys(request, start, start + block_size, mm_idx)
                extra_keys_list.append(untag_extra_keys(keys))
            self.kv_event_queue.append(
                self._block_stored(
                    request, new_hashes, parent, num_cached_blocks * block_size,
                    num_full_blocks * block_size, block_size, kv_cache_group_id, extra_keys_list,
                )
            )

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

    def _uncache(self, blocks: list, start: int, end: int) -> None:
        """Undo cache_full_blocks for ``blocks[start:end]`` (all keyed by it)."""
        cache = self.cached_block_hash_to_block
        for blk in blocks[start:end]:
            if not blk._is_null:
                cache.pop(blk._key, blk._block_id)
                blk.reset_hash()

    def _block_stored(
        self, request, hashes, parent, start, end, block_size, group_id, extra_keys_list
    ) -> BlockStored:
        lora = request.lora_request
        return BlockStored(
            block_hashes=hashes,
            parent_block_hash=parent,
            token_ids=request.all_token_ids[start:end],
            block_size=block_size,
            lora_id=lora.lora_int_id if lora is not None else None,
            medium=MEDIUM_GPU,
            lora_name=lora.lora_name if lora is not None else None,
            extra_keys=extra_keys_list if extra_keys_list else None,
            group_idx=group_id,
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
        mm_idx = 0
        for i in range(num_cached_blocks):
            hashes.append(self._ext(block_hashes[i]))
            start = i * block_size
            keys, mm_idx = generate_block_hash_extra_keys(request, start, start + block_size, mm_idx)
            extra_keys_list.append(untag_extra_keys(keys))
        self.kv_event_queue.append(
            self._block_stored(
                request, hashes, None, 0, num_cached_blocks * block_size, block_size,
                kv_cache_group_id, extra_keys_list,
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
        if self.enable_caching:
            for block in ret:
                if block._key is not None:
                    self._maybe_evict_cached_block(block)
                block._ref_cnt += 1
        else:
            for block in ret:
                block._ref_cnt += 1
        return ret

    def _maybe_evict_cached_block(self, block: KVCacheBlock) -> bool:
        key = block._key
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
                    medium=MEDIUM_GPU,
                    group_idx=int.from_bytes(key[-4:], "big"),
                )
            )
        return True

    def evict_blocks(self, block_ids: set[int]) -> None:
        """Drop the cache keys of the given blocks (they stay where they are)."""
        block_ids = list(block_ids)  # (read twice: checked first)
        for block_id in block_ids:
            if isinstance(block_id, bool) or not isinstance(block_id, int):
                raise TypeError(f"block ids must be ints, got {type(block_id).__name__}")
            if not 0 <= block_id < self.num_gpu_blocks:
                raise ValueError(f"block id {block_id} is outside the pool of {self.num_gpu_blocks}")
        for block_id in block_ids:
            self._maybe_evict_cached_block(self.blocks[block_id])

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
        for block in blocks:
            if block._is_null:
                continue
            if block._ref_cnt == 0:
                queue.remove(block)
            block._ref_cnt += 1

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
        for block in self.blocks:
            block.reset_hash()
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


# =============================================================================
# Single-type managers
# =============================================================================
class SingleTypeKVCacheManager(_Checked):
    """Block bookkeeping for one KV-cache group of one attention type."""

    # Fixed when made; use_eagle is set by the coordinators.  The two dicts
    # cannot be replaced; their entries may still be changed (vLLM's tests do).
    _RULES = dict.fromkeys(
        ("kv_cache_spec", "block_size", "block_pool", "enable_caching", "kv_cache_group_id",
         "scheduler_block_size", "_max_admission_blocks_per_request", "req_to_blocks", "num_cached_block",
         "_req_to_blocks", "_num_cached_block", "_null_block"),
        _READ_ONLY,
    )

    def __init__(
        self,
        kv_cache_spec: KVCacheSpec,
        block_pool: BlockPool,
        enable_caching: bool,
        kv_cache_group_id: int,
        scheduler_block_size: int,
        max_admission_blocks_per_request: int | None = None,
    ) -> None:
        self.kv_cache_spec = kv_cache_spec
        self.block_size = kv_cache_spec.block_size
        self.block_pool = block_pool
        self.enable_caching = enable_caching
        self.kv_cache_group_id = kv_cache_group_id
        self.scheduler_block_size = scheduler_block_size
        self._max_admission_blocks_per_request = max_admission_blocks_per_request
        self.use_eagle = False
        self._req_to_blocks: dict[str, list[KVCacheBlock]] = {}
        self._num_cached_block: dict[str, int] = {}
        self.req_to_blocks = _BlockTable(self._req_to_blocks, None, block_pool.blocks, KVCacheBlock)
        self.num_cached_block = _CountTable(self._num_cached_block, None, _check_count)
        self._null_block = block_pool.null_block

    # -------------------------------------------------------------- counting
    def get_num_skipped_tokens(self, num_computed_tokens: int) -> int:
        """Tokens before the attention window (their blocks can be freed)."""
        return 0

    def get_num_blocks_to_allocate(
        self,
        request_id: str,
        num_tokens: int,
        new_computed_blocks: Sequence[KVCacheBlock],
        total_computed_tokens: int,
        num_local_computed_tokens: int,
        num_tokens_main_model: int,
        apply_admission_cap: bool = False,
    ) -> int:
        """Blocks this group must take from the free pool to hold ``num_tokens``.

        Evictable cache hits (free, ref_cnt 0) count too: touching them takes
        them out of the free pool.
        """
        num_required_blocks = cdiv(num_tokens, self.block_size)
        cap = self._max_admission_blocks_per_request
        if apply_admission_cap and cap is not None and cap < num_required_blocks:
            num_required_blocks = cap
        req_blocks = self._req_to_blocks.get(request_id)
        num_req_blocks = 0 if req_blocks is None else len(req_blocks)
        if request_id in self._num_cached_block:
            return max(num_required_blocks - num_req_blocks, 0)
        num_skipped_blocks = self.get_num_skipped_tokens(total_computed_tokens) // self.block_size
        num_local_computed_blocks = len(new_computed_blocks) + num_req_blocks
        num_new_blocks = max(num_required_blocks - max(num_skipped_blocks, num_local_computed_blocks), 0)
        skip_new = max(0, num_skipped_blocks - num_req_blocks)
        num_evictable = 0
        queue = self.block_pool.free_block_queue if self.enable_caching else None
        try:
            for i in range(skip_new, len(new_computed_blocks)):
                blk = new_computed_blocks[i]
                if blk._ref_cnt == 0 and not blk._is_null:
                    # (a free hit must be in the free queue, or touching it fails half-way)
                    if queue is not None and (blk._queue is not queue or blk._prev_free_block is None
                                              or blk._next_free_block is None):
                        raise RuntimeError(f"remove() called on an invalid block: {blk}")
                    num_evictable += 1
        except AttributeError:
            raise TypeError(f"blocks must be KVCacheBlock, got {type(blk).__name__}") from None
        return num_new_blocks + num_evictable

    # -------------------------------------------------------------- allocation
    def add_local_computed_blocks(
        self,
        request_id: str,
        new_computed_blocks: Sequence[KVCacheBlock],
        num_local_computed_tokens: int,
        num_external_computed_tokens: int,
    ) -> None:
        """Attach prefix-cache hits to a request that holds no blocks yet.

        Raises:
            TypeError: a hit is not a KVCacheBlock.
            RuntimeError: a hit with no references is not in the free queue.
            In both cases nothing changes.
        """
        self._check_hits(new_computed_blocks, num_local_computed_tokens + num_external_computed_tokens)
        self._add_local_computed_blocks(request_id, new_computed_blocks, num_local_computed_tokens,
                                        num_external_computed_tokens)

    def _check_hits(self, new_computed_blocks, total_computed_tokens: int) -> None:
        # add_local_computed_blocks' checks of the hits it will take (those past the skipped ones).
        skipped = self.get_num_skipped_tokens(total_computed_tokens) // self.block_size
        _check_touchable(new_computed_blocks[skipped:] if skipped > 0 else new_computed_blocks,
                         self.block_pool.free_block_queue if self.enable_caching else None,
                         self.block_pool.blocks)

    def _add_local_computed_blocks(self, request_id, new_computed_blocks, num_local_computed_tokens,
                                   num_external_computed_tokens) -> None:
        # add_local_computed_blocks without its checks, for KVCacheManager.allocate_slots,
        # whose hit count (get_num_blocks_to_allocate) has checked every hit before any change.
        total = num_local_computed_tokens + num_external_computed_tokens
        num_skipped_blocks = self.get_num_skipped_tokens(total) // self.block_size
        blocks = new_computed_blocks[num_skipped_blocks:] if num_skipped_blocks > 0 else new_computed_blocks
        req_blocks = self._req_to_blocks.setdefault(request_id, [])
        assert not req_blocks
        if self.enable_caching:
            self.block_pool._touch(blocks)
        req_blocks.extend([self._null_block] * num_skipped_blocks)
        req_blocks.extend(blocks)
        self._num_cached_block[request_id] = len(req_blocks)

    def allocate_external_computed_blocks(
        self, request_id: str, num_local_computed_tokens: int, num_external_computed_tokens: int
    ) -> None:
        """New blocks for tokens a KV connector computed (after every group touched its hits)."""
        total = num_local_computed_tokens + num_external_computed_tokens
        num_skipped_tokens = self.get_num_skipped_tokens(total)
        if num_skipped_tokens > 0:
            num_external_computed_tokens = min(total - num_skipped_tokens, num_external_computed_tokens)
        if num_external_computed_tokens <= 0:
            return
        req_blocks = self._req_to_blocks.setdefault(request_id, [])
        num_new_blocks = cdiv(total, self.block_size) - len(req_blocks)
        if num_new_blocks > 0:  # (holding as many already: nothing to do, as in vLLM)
            req_blocks.extend(self.block_pool.get_new_blocks(num_new_blocks))

    def allocate_new_blocks(self, request_id: str, num_tokens: int, num_tokens_main_model: int) -> list[KVCacheBlock]:
        """Give the request at least ``num_tokens`` slots; return the new blocks."""
        req_blocks = self._req_to_blocks.setdefault(request_id, [])
        num_new_blocks = cdiv(num_tokens, self.block_size) - len(req_blocks)
        if num_new_blocks <= 0:
            return []
        new_blocks = self.block_pool.get_new_blocks(num_new_blocks)
        req_blocks.extend(new_blocks)
        return new_blocks

    def cache_blocks(self, request: Request, num_tokens: int) -> None:
        """Cache the request's full blocks among its first ``num_tokens`` tokens."""
        request_id = request.request_id
        num_cached_blocks = self._num_cached_block.get(request_id, 0)
        num_full_blocks = num_tokens // self.block_size
        if num_cached_blocks >= num_full_blocks:
            return
        self.block_pool.cache_full_blocks(
            request,
            self._req_to_blocks[request_id],
            num_cached_blocks,
            num_full_blocks,
            self.block_size,
            self.kv_cache_group_id,
        )
        self._num_cached_block[request_id] = num_full_blocks

    def _check_cache_inputs(self, request: Request, request_id: str, num_tokens: int, hits: Sequence,
                            attaching: bool, total_computed_tokens: int) -> None:
        # What cache_blocks(request, num_tokens) will read once this
        # allocation is made, checked before it: the cached count is the
        # request's entry, or, for a request taking its hits now (attaching),
        # what add_local_computed_blocks will record.
        num_cached = self._num_cached_block.get(request_id)
        if num_cached is None:
            if attaching:
                skipped = self.get_num_skipped_tokens(total_computed_tokens) // self.block_size
                num_cached = max(skipped, len(hits))
            else:
                num_cached = 0
        self.block_pool._check_hashes_to_cache(request, num_cached, num_tokens // self.block_size,
                                               self.block_size)

    # -------------------------------------------------------------- freeing
    def pop_blocks_for_free(self, request_id: str) -> list[KVCacheBlock]:
        self._num_cached_block.pop(request_id, None)
        return self._req_to_blocks.pop(request_id, [])

    def free(self, request_id: str) -> None:
        """Return the request's blocks to the pool, tail first."""
        blocks = self.pop_blocks_for_free(request_id)
        blocks.reverse()
        self.block_pool.free_blocks(blocks)

    def _remove_blocks_in_range(self, request_id: str, first_block: int, last_block: int) -> None:
        blocks = self._req_to_blocks.get(request_id)
        if blocks is None or first_block >= last_block:
            return
        last_block = min(last_block, len(blocks))
        null = self._null_block
        freed = []
        for i in range(last_block - 1, first_block - 1, -1):
            if blocks[i] is null:
                break
            freed.append(blocks[i])
            blocks[i] = null
        if freed:
            self.block_pool.free_blocks(freed)

    def remove_skipped_blocks(self, request_id: str, processed_computed_tokens: int) -> None:
        """Free the blocks before the attention window, replacing them with the null block."""
        num_skipped_tokens = self.get_num_skipped_tokens(processed_computed_tokens)
        if num_skipped_tokens <= 0:
            return
        self._remove_blocks_in_range(request_id, 0, num_skipped_tokens // self.block_size)

    def get_num_common_prefix_blocks(self, running_request_id: str) -> int:
        return 0

    @classmethod
    def find_longest_cache_hit(
        cls,
        block_hashes: Sequence[bytes],
        max_length: int,
        kv_cache_group_ids: list[int],
        block_pool: BlockPool,
        kv_cache_spec: KVCacheSpec,
        drop_eagle_block: bool,
        alignment_tokens: int,
    ) -> tuple[tuple[list[KVCacheBlock], ...], int]:
        raise NotImplementedError


class FullAttentionManager(SingleTypeKVCacheManager):
    """Full attention: every token's KV is kept until the request finishes."""

    @classmethod
    def find_longest_cache_hit(
        cls, block_hashes, max_length, kv_cache_group_ids, block_pool, kv_cache_spec,
        drop_eagle_block, alignment_tokens,
    ):
        _check_hit_args(kv_cache_group_ids, block_pool, alignment_tokens)
        block_size = kv_cache_spec.block_size
        hashes = resolve_block_hashes(block_hashes, block_pool.hash_block_size, block_size)
        n_groups = len(kv_cache_group_ids)
        computed: tuple[list[KVCacheBlock], ...] = tuple([] for _ in range(n_groups))
        max_blocks = min(max_length // block_size, len(hashes))
        for i in range(max_blocks):
            cached = block_pool.get_cached_block(hashes[i], kv_cache_group_ids)
            if cached is None:
                break
            for g in range(n_groups):
                computed[g].append(cached[g])
        if drop_eagle_block and computed[0]:
            for blocks in computed:
                blocks.pop()
        while block_size != alignment_tokens and (len(computed[0]) * block_size) % alignment_tokens != 0:
            for blocks in computed:
                blocks.pop()
        return computed, len(computed[0]) * block_size

    def get_num_common_prefix_blocks(self, running_request_id: str) -> int:
        blocks = self._req_to_blocks.get(running_request_id, [])
        num_requests = len(self._req_to_blocks)
        n = 0
        for block in blocks:
            if block._ref_cnt == num_requests:
                n += 1
            else:
                break
        return n


class SlidingWindowManager(SingleTypeKVCacheManager):
    """Sliding-window attention: only the last ``sliding_window`` tokens are attended."""

    _RULES = {**SingleTypeKVCacheManager._RULES, "sliding_window": _READ_ONLY}

    def __init__(self, kv_cache_spec: SlidingWindowSpec, *args, **kwargs) -> None:
        super().__init__(kv_cache_spec, *args, **kwargs)
        self.sliding_window = kv_cache_spec.sliding_window

    @classmethod
    def find_longest_cache_hit(
        cls, block_hashes, max_length, kv_cache_group_ids, block_pool, kv_cache_spec,
        drop_eagle_block, alignment_tokens,
    ):
        _check_hit_args(kv_cache_group_ids, block_pool, alignment_tokens)
        block_size = kv_cache_spec.block_size
        hashes = resolve_block_hashes(block_hashes, block_pool.hash_block_size, block_size)
        needed = cdiv(kv_cache_spec.sliding_window - 1, block_size)
        if drop_eagle_block:
            needed += 1
        max_blocks = min(max_length // block_size, len(hashes))
        n_groups = len(kv_cache_group_ids)
        null = block_pool.null_block
        computed = tuple([null] * max_blocks for _ in range(n_groups))
        contiguous = 0
        found = False
        for i in range(max_blocks - 1, -1, -1):
            cached = block_pool.get_cached_block(hashes[i], kv_cache_group_ids)
            if cached is not None:
                if contiguous == 0 and ((i + 1) * block_size) % alignment_tokens != 0:
                    continue
                for g in range(n_groups):
                    computed[g][i] = cached[g]
                contiguous += 1
                if contiguous >= needed:
                    for blocks in computed:
                        del blocks[i + contiguous :]
                    found = True
                    break
            else:
                contiguous = 0
        if not found:
            for blocks in computed:
                del blocks[contiguous:]
        if drop_eagle_block and computed[0]:
            for blocks in computed:
                blocks.pop()
        return computed, len(computed[0]) * block_size

    def get_num_skipped_tokens(self, num_computed_tokens: int) -> int:
        return max(0, num_computed_tokens - self.sliding_window + 1)


class ChunkedLocalAttentionManager(SingleTypeKVCacheManager):
    """Chunked local attention: tokens attend only within their chunk."""

    _RULES = {**SingleTypeKVCacheManager._RULES, "attention_chunk_size": _READ_ONLY}

    def __init__(self, kv_cache_spec: ChunkedLocalAttentionSpec, *args, **kwargs) -> None:
        super().__init__(kv_cache_spec, *args, **kwargs)
        self.attention_chunk_size = kv_cache_spec.attention_chunk_size

    @classmethod
    def find_longest_cache_hit(
        cls, block_hashes, max_length, kv_cache_group_ids, block_pool, kv_cache_spec,
        drop_eagle_block, alignment_tokens,
    ):
        _check_hit_args(kv_cache_group_ids, block_pool, alignment_tokens)
        if drop_eagle_block:
            raise ValueError("EAGLE is not supported with chunked local attention")
        block_size = kv_cache_spec.block_size
        hashes = resolve_block_hashes(block_hashes, block_pool.hash_block_size, block_size)
        chunk = kv_cache_spec.attention_chunk_size
        start_block = (max_length // chunk * chunk) // block_size
        max_blocks = max_length // block_size
        n_groups = len(kv_cache_group_ids)
        null = block_pool.null_block
        computed = tuple([null] * start_block for _ in range(n_groups))
        for i in range(start_block, min(max_blocks, len(hashes))):
            cached = block_pool.get_cached_block(hashes[i], kv_cache_group_ids)
            if cached is None:
                break
            for g in range(n_groups):
                computed[g].append(cached[g])
        while block_size != alignment_tokens and (len(computed[0]) * block_size) % alignment_tokens != 0:
            for blocks in computed:
                blocks.pop()
        return computed, len(computed[0]) * block_size

    def get_num_skipped_tokens(self, num_computed_tokens: int) -> int:
        return (num_computed_tokens // self.attention_chunk_size) * self.attention_chunk_size


class MambaManager(SingleTypeKVCacheManager):
    """Mamba (plain mode): only the state after the last cached block is needed."""

    @classmethod
    def find_longest_cache_hit(
        cls, block_hashes, max_length, kv_cache_group_ids, block_pool, kv_cache_spec,
        drop_eagle_block, alignment_tokens,
    ):
        _check_hit_args(kv_cache_group_ids, block_pool, alignment_tokens)
        block_size = kv_cache_spec.block_size
        hashes = resolve_block_hashes(block_hashes, block_pool.hash_block_size, block_size)
        max_blocks = min(max_length // block_size, len(hashes))
        n_groups = len(kv_cache_group_ids)
        null = block_pool.null_block
        computed: tuple[list[KVCacheBlock], ...] = tuple([] for _ in range(n_groups))
        for i in range(max_blocks - 1, -1, -1):
            if ((i + 1) * block_size) % alignment_tokens != 0:
                continue
            cached = block_pool.get_cached_block(hashes[i], kv_cache_group_ids)
            if cached is not None:
                for g in range(n_groups):
                    computed[g].extend([null] * i)
                    computed[g].append(cached[g])
                break
        return computed, len(computed[0]) * block_size

    def get_num_skipped_tokens(self, num_computed_tokens: int) -> int:
        return max(0, num_computed_tokens - 1)


class CrossAttentionManager(SingleTypeKVCacheManager):
    """Cross attention: a static allocation for the encoder tokens; never cached."""

    @classmethod
    def find_longest_cache_hit(
        cls, block_hashes, max_length, kv_cache_group_ids, block_pool, kv_cache_spec,
        drop_eagle_block, alignment_tokens,
    ):
        _check_hit_args(kv_cache_group_ids, block_pool, alignment_tokens)
        raise ValueError("cross attention does not support prefix caching")

    def cache_blocks(self, request: Request, num_tokens: int) -> None:
        return None

    def _check_cache_inputs(self, request, request_id, num_tokens, hits, attaching, total_computed_tokens) -> None:
        return None  # (never cached)


spec_manager_map: dict[type, type[SingleTypeKVCacheManager]] = {
    FullAttentionSpec: FullAttentionManager,
    SlidingWindowSpec: SlidingWindowManager,
    ChunkedLocalAttentionSpec: ChunkedLocalAttentionManager,
    MambaSpec: MambaManager,
    CrossAttentionSpec: CrossAttentionManager,
}


def _manager_class(spec: KVCacheSpec) -> type[SingleTypeKVCacheManager]:
    for klass in type(spec).__mro__:
        if klass in spec_manager_map:
            return spec_manager_map[klass]
    raise ValueError(f"no KV-cache manager for spec type {type(spec).__name__}")


def _admission_cap(spec: KVCacheSpec, max_in_flight_tokens: int, max_model_len: int) -> int | None:
    if isinstance(spec, (SlidingWindowSpec, ChunkedLocalAttentionSpec)):
        return spec.max_admission_blocks_per_request(max_in_flight_tokens, max_model_len)
    return None


def get_manager_for_kv_cache_spec(
    kv_cache_spec: KVCacheSpec,
    block_pool: BlockPool,
    enable_caching: bool,
    kv_cache_group_id: int,
    scheduler_block_size: int,
    max_in_flight_tokens: int,
    max_model_len: int,
) -> SingleTypeKVCacheManager:
    klass = _manager_class(kv_cache_spec)
    return klass(
        kv_cache_spec,
        block_pool,
        enable_caching,
        kv_cache_group_id,
        scheduler_block_size,
        _admission_cap(kv_cache_spec, max_in_flight_tokens, max_model_len),
    )


# =============================================================================
# Coordinators
# =============================================================================
class KVCacheCoordinator(_Checked):
    """Drives the single-type managers of all KV-cache groups over one block pool."""

    # All fixed when made.
    _RULES = dict.fromkeys(
        ("kv_cache_config", "max_model_len", "enable_caching", "scheduler_block_size", "hash_block_size",
         "block_pool", "eagle_group_ids", "single_type_managers", "_cross_attention"),
        _READ_ONLY,
    )

    def __init__(
        self,
        kv_cache_config: KVCacheConfig,
        max_model_len: int,
        max_in_flight_tokens: int,
        use_eagle: bool,
        enable_caching: bool,
        enable_kv_cache_events: bool,
        scheduler_block_size: int,
        hash_block_size: int,
        use_int_block_hashes: bool | None = None,
    ) -> None:
        groups = kv_cache_config.kv_cache_groups
        if scheduler_block_size % hash_block_size != 0 or any(
            scheduler_block_size % g.kv_cache_spec.block_size != 0 for g in groups
        ):
            raise ValueError(
                f"scheduler_block_size ({scheduler_block_size}) must be a multiple of "
                f"hash_block_size ({hash_block_size}) and of every group's block size "
                f"({[g.kv_cache_spec.block_size for g in groups]})"
            )
        self.kv_cache_config = kv_cache_config
        self.max_model_len = max_model_len
        self.enable_caching = enable_caching
        self.scheduler_block_size = scheduler_block_size
        self.hash_block_size = hash_block_size
        self.block_pool = BlockPool(
            kv_cache_config.num_blocks,
            enable_caching,
            hash_block_size,
            enable_kv_cache_events,
            use_int_block_hashes=use_int_block_hashes,
        )
        eagle_ids = {i for i, g in enumerate(groups) if getattr(g, "is_eagle_group", False)}
        if use_eagle and not eagle_ids:
            eagle_ids = set(range(len(groups)))
        self.eagle_group_ids = eagle_ids
        self.single_type_managers = tuple(
            get_manager_for_kv_cache_spec(
                g.kv_cache_spec,
                self.block_pool,
                enable_caching,
                i,
                scheduler_block_size,
                max_in_flight_tokens,
                max_model_len,
            )
            for i, g in enumerate(groups)
        )
        self._cross_attention = tuple(isinstance(m, CrossAttentionManager) for m in self.single_type_managers)

    def get_num_blocks_to_allocate(
        self,
        request_id: str,
        num_tokens: int,
        new_computed_blocks: tuple[Sequence[KVCacheBlock], ...],
        num_encoder_tokens: int,
        total_computed_tokens: int,
        num_local_computed_tokens: int,
        num_tokens_main_model: int,
        apply_admission_cap: bool = False,
    ) -> int:
        total = 0
        for i, manager in enumerate(self.single_type_managers):
            if self._cross_attention[i]:
                total += manager.get_num_blocks_to_allocate(
                    request_id, num_encoder_tokens, (), 0, 0, num_encoder_tokens, apply_admission_cap
                )
            else:
                total += manager.get_num_blocks_to_allocate(
                    request_id,
                    num_tokens,
                    new_computed_blocks[i],
                    total_computed_tokens,
                    num_local_computed_tokens,
                    num_tokens_main_model,
                    apply_admission_cap,
                )
        return total

    def allocate_new_computed_blocks(
        self,
        request_id: str,
        new_computed_blocks: tuple[Sequence[KVCacheBlock], ...],
        num_local_computed_tokens: int,
        num_external_computed_tokens: int,
    ) -> None:
        """Attach each group's prefix-cache hits (and external-token blocks) to a new request.

        Raises:
            TypeError / RuntimeError: as SingleTypeKVCacheManager.add_local_computed_blocks
            (nothing changes).
        """
        for manager, blocks in zip(self.single_type_managers, new_computed_blocks):
            manager._check_hits(blocks, num_local_computed_tokens + num_external_computed_tokens)
        self._allocate_new_computed_blocks(request_id, new_computed_blocks, num_local_computed_tokens,
                                           num_external_computed_tokens)

    def _allocate_new_computed_blocks(self, request_id, new_computed_blocks, num_local_computed_tokens,
                                      num_external_computed_tokens) -> None:
        # Without the checks: KVCacheManager.allocate_slots's hit count has checked every hit.
        managers = self.single_type_managers
        for manager in managers:
            if request_id in manager._num_cached_block:
                if any(len(blocks) for blocks in new_computed_blocks):
                    raise RuntimeError(
                        f"request {request_id!r} already holds blocks; it cannot take new prefix-cache hits"
                    )
                return
        for i, manager in enumerate(managers):
            manager._add_local_computed_blocks(
                request_id, new_computed_blocks[i], num_local_computed_tokens, num_external_computed_tokens
            )
        if num_external_computed_tokens > 0:
            for manager in managers:
                manager.allocate_external_computed_blocks(
                    request_id, num_local_computed_tokens, num_external_computed_tokens
                )

    def allocate_new_blocks(
        self, request_id: str, num_tokens: int, num_tokens_main_model: int, num_encoder_tokens: int = 0
    ) -> tuple[list[KVCacheBlock], ...]:
        return tuple(
            manager.allocate_new_blocks(
                request_id,
                num_encoder_tokens if self._cross_attention[i] else num_tokens,
                num_tokens_main_model,
            )
            for i, manager in enumerate(self.single_type_managers)
        )

    def cache_blocks(self, request: Request, num_computed_tokens: int) -> None:
        for manager in self.single_type_managers:
            manager.cache_blocks(request, num_computed_tokens)

    def _tokens_to_cache(self, manager: SingleTypeKVCacheManager, num_computed_tokens: int) -> int:
        # The num_tokens cache_blocks hands this manager.
        return num_computed_tokens

    def _check_cache_inputs(self, request: Request, request_id: str, num_computed_tokens: int,
                            new_computed_blocks: tuple, attaching: bool, total_computed_tokens: int) -> None:
        # cache_blocks(request, num_computed_tokens) after this allocation,
        # checked for every group before any change.
        for manager, hits in zip(self.single_type_managers, new_computed_blocks):
            manager._check_cache_inputs(request, request_id, self._tokens_to_cache(manager, num_computed_tokens),
                                        hits, attaching, total_computed_tokens)

    def free(self, request_id: str) -> None:
        for manager in self.single_type_managers:
            manager.free(request_id)

    def pop_blocks_for_free(self, request_id: str) -> list[KVCacheBlock]:
        out: list[KVCacheBlock] = []
        for manager in self.single_type_managers:
            out.extend(manager.pop_blocks_for_free(request_id))
        return out

    def get_num_common_prefix_blocks(self, running_request_id: str) -> list[int]:
        return [m.get_num_common_prefix_blocks(running_request_id) for m in self.single_type_managers]

    def remove_skipped_blocks(self, request_id: str, processed_computed_tokens: int) -> None:
        for manager in self.single_type_managers:
            manager.remove_skipped_blocks(request_id, processed_computed_tokens)

    def get_blocks(self, request_id: str) -> tuple[list[KVCacheBlock], ...]:
        return tuple(m._req_to_blocks.get(request_id) or [] for m in self.single_type_managers)

    def holds(self, request_id: str) -> bool:
        """Whether the request holds blocks (had a successful allocation since its last free)."""
        for manager in self.single_type_managers:
            if request_id in manager._req_to_blocks:
                return True
        return False

    def find_longest_cache_hit(
        self, block_hashes: list[bytes], max_cache_hit_length: int
    ) -> tuple[tuple[list[KVCacheBlock], ...], int, int]:
        raise NotImplementedError


class KVCacheCoordinatorNoPrefixCache(KVCacheCoordinator):
    _RULES = {**KVCacheCoordinator._RULES, "num_single_type_manager": _READ_ONLY}

    """Coordinator for prefix caching off: any number of groups, never a hit."""

    def __init__(self, kv_cache_config, max_model_len, max_in_flight_tokens, use_eagle,
                 enable_kv_cache_events, scheduler_block_size, hash_block_size,
                 use_int_block_hashes=None) -> None:
        super().__init__(kv_cache_config, max_model_len, max_in_flight_tokens, use_eagle, False,
                         enable_kv_cache_events, scheduler_block_size, hash_block_size,
                         use_int_block_hashes)
        self.num_single_type_manager = len(self.single_type_managers)

    def get_num_common_prefix_blocks(self, running_request_id: str) -> list[int]:
        return [0] * self.num_single_type_manager

    def find_longest_cache_hit(self, block_hashes, max_cache_hit_length):
        return tuple([] for _ in range(self.num_single_type_manager)), 0, 0


class UnitaryKVCacheCoordinator(KVCacheCoordinator):
    _RULES = {**KVCacheCoordinator._RULES, **dict.fromkeys(("kv_cache_spec", "block_size", "use_eagle"), _READ_ONLY)}

    """Coordinator for exactly one KV-cache group with prefix caching on."""

    def __init__(self, kv_cache_config, max_model_len, max_in_flight_tokens, use_eagle,
                 enable_caching, enable_kv_cache_events, scheduler_block_size, hash_block_size,
                 use_int_block_hashes=None) -> None:
        super().__init__(kv_cache_config, max_model_len, max_in_flight_tokens, use_eagle,
                         enable_caching, enable_kv_cache_events, scheduler_block_size,
                         hash_block_size, use_int_block_hashes)
        if len(kv_cache_config.kv_cache_groups) != 1:
            raise ValueError("UnitaryKVCacheCoordinator assumes only one kv cache group")
        self.kv_cache_spec = kv_cache_config.kv_cache_groups[0].kv_cache_spec
        self.block_size = self.single_type_managers[0].block_size
        if enable_caching and hash_block_size != self.block_size:
            raise ValueError(
                "UnitaryKVCacheCoordinator assumes hash_block_size == block_size "
                f"(got hash_block_size={hash_block_size}, block_size={self.block_size})"
            )
        self.use_eagle = 0 in self.eagle_group_ids
        self.single_type_managers[0].use_eagle = self.use_eagle
        self._manager_cls = type(self.single_type_managers[0])
        if self.use_eagle and isinstance(self.kv_cache_spec, ChunkedLocalAttentionSpec):
            raise ValueError("Hybrid KV cache is not supported for eagle + chunked local attention.")

    def find_longest_cache_hit(self, block_hashes, max_cache_hit_length):
        blocks, length = self._manager_cls.find_longest_cache_hit(
            block_hashes, max_cache_hit_length, [0], self.block_pool, self.kv_cache_spec,
            self.use_eagle, self.block_size,
        )
        return blocks, length, 0


class HybridKVCacheCoordinator(KVCacheCoordinator):
    _RULES = {**KVCacheCoordinator._RULES, "attention_groups": _READ_ONLY}

    """Coordinator for several KV-cache groups (e.g. full + sliding window).

    Groups with equal specs are looked up together; full attention goes first
    (its left-to-right scan bounds the others), and the candidate length is
    shrunk until every group accepts it.
    """

    def __init__(self, kv_cache_config, max_model_len, max_in_flight_tokens, use_eagle,
                 enable_caching, enable_kv_cache_events, scheduler_block_size, hash_block_size,
                 use_int_block_hashes=None) -> None:
        super().__init__(kv_cache_config, max_model_len, max_in_flight_tokens, use_eagle,
                         enable_caching, enable_kv_cache_events, scheduler_block_size,
                         hash_block_size, use_int_block_hashes)
        for manager in self.single_type_managers:
            if manager.block_size % hash_block_size != 0:
                raise ValueError(
                    f"every group's block size must be a multiple of hash_block_size "
                    f"({hash_block_size}); got {manager.block_size}"
                )
        if self.eagle_group_ids and any(
            isinstance(g.kv_cache_spec, ChunkedLocalAttentionSpec) for g in kv_cache_config.kv_cache_groups
        ):
            raise ValueError("Hybrid KV cache is not supported for eagle + chunked local attention.")
        self.verify_and_split_kv_cache_groups()

    def verify_and_split_kv_cache_groups(self) -> None:
        """Batch groups with identical specs; full attention first."""
        groups: list[list] = []  # [spec, group_ids, manager_cls, use_eagle]
        for i, g in enumerate(self.kv_cache_config.kv_cache_groups):
            spec = g.kv_cache_spec
            if isinstance(spec, CrossAttentionSpec):
                continue
            klass = type(self.single_type_managers[i])
            use_eagle = i in self.eagle_group_ids
            for entry in groups:
                if entry[0] == spec:
                    entry[1].append(i)
                    entry[3] = entry[3] or use_eagle
                    break
            else:
                groups.append([spec, [i], klass, use_eagle])
        if not groups:
            raise ValueError("HybridKVCacheCoordinator requires at least one cacheable group")
        groups.sort(key=lambda e: not isinstance(e[0], FullAttentionSpec))
        object.__setattr__(self, "attention_groups", [tuple(e) for e in groups])
        for spec, ids, klass, use_eagle in self.attention_groups:
            if use_eagle:
                for gid in ids:
                    self.single_type_managers[gid].use_eagle = True
        self._is_simple_hybrid = len(groups) == 2 and isinstance(groups[0][0], FullAttentionSpec)

    def cache_blocks(self, request: Request, num_computed_tokens: int) -> None:
        aligned = num_computed_tokens // self.scheduler_block_size * self.scheduler_block_size
        for manager in self.single_type_managers:
            n = aligned
            if manager.use_eagle and aligned > 0:
                n = min(num_computed_tokens, aligned + manager.block_size)
            manager.cache_blocks(request, n)

    def _tokens_to_cache(self, manager: SingleTypeKVCacheManager, num_computed_tokens: int) -> int:
        aligned = num_computed_tokens // self.scheduler_block_size * self.scheduler_block_size
        if manager.use_eagle and aligned > 0:
            return min(num_computed_tokens, aligned + manager.block_size)
        return aligned

    def find_longest_cache_hit(self, block_hashes, max_cache_hit_length):
        num_groups = len(self.kv_cache_config.kv_cache_groups)
        hit_length = max_cache_hit_length
        longest = 0
        blocks_by_group: list = [None] * num_groups
        length_by_group = [0] * num_groups
        alignment = self.scheduler_block_size
        eagle_verified: set[int] = set()
        managers = self.single_type_managers
        while True:
            curr = hit_length
            for idx, (spec, group_ids, klass, use_eagle) in enumerate(self.attention_groups):
                first = group_ids[0]
                if isinstance(spec, FullAttentionSpec) and blocks_by_group[first] is not None:
                    curr = min(curr, length_by_group[first])
                    continue
                drop = use_eagle and idx not in eagle_verified
                max_len = curr
                if drop and not isinstance(spec, MambaSpec):
                    max_len = min(curr + managers[first].block_size, max_cache_hit_length)
                hit_blocks, new_len = klass.find_longest_cache_hit(
                    block_hashes, max_len, group_ids, self.block_pool, spec, drop, alignment
                )
                if drop:
                    eagle_verified.add(idx)
                elif new_len < curr:
                    eagle_verified.clear()
                curr = new_len
                for gid, blks in zip(group_ids, hit_blocks):
                    blocks_by_group[gid] = blks
                    length_by_group[gid] = new_len
                if curr > longest:
                    longest = curr
            if curr >= hit_length:
                break
            hit_length = curr
            if self._is_simple_hybrid:
                break
        for spec, group_ids, klass, use_eagle in self.attention_groups:
            if not isinstance(spec, FullAttentionSpec):
                continue
            n = cdiv(hit_length, managers[group_ids[0]].block_size)
            for gid in group_ids:
                blks = blocks_by_group[gid]
                if blks is not None:
                    del blks[n:]
                    length_by_group[gid] = hit_length
        blocks = tuple(b if b is not None else [] for b in blocks_by_group)
        return blocks, hit_length, longest - hit_length


def get_kv_cache_coordinator(
    kv_cache_config: KVCacheConfig,
    max_model_len: int,
    max_in_flight_tokens: int,
    use_eagle: bool,
    enable_caching: bool,
    enable_kv_cache_events: bool,
    scheduler_block_size: int,
    hash_block_size: int,
    use_int_block_hashes: bool | None = None,
) -> KVCacheCoordinator:
    if not enable_caching:
        return KVCacheCoordinatorNoPrefixCache(
            kv_cache_config, max_model_len, max_in_flight_tokens, use_eagle,
            enable_kv_cache_events, scheduler_block_size, hash_block_size, use_int_block_hashes,
        )
    if len(kv_cache_config.kv_cache_groups) == 1:
        return UnitaryKVCacheCoordinator(
            kv_cache_config, max_model_len, max_in_flight_tokens, use_eagle, enable_caching,
            enable_kv_cache_events, scheduler_block_size, hash_block_size, use_int_block_hashes,
        )
    return HybridKVCacheCoordinator(
        kv_cache_config, max_model_len, max_in_flight_tokens, use_eagle, enable_caching,
        enable_kv_cache_events, scheduler_block_size, hash_block_size, use_int_block_hashes,
    )


# =============================================================================
# KVCacheBlocks and the manager
# =============================================================================
class KVCacheBlocks(_Checked):
    """Blocks per KV-cache group: what allocate_slots / get_computed_blocks return.

    ``blocks[i][j]`` is the j-th block of group i.
    """

    __slots__ = ("blocks",)
    _RULES = {"blocks": _tuple_or_none}

    def __init__(self, blocks: tuple[Sequence[KVCacheBlock], ...]) -> None:
        if blocks.__class__ is not tuple:  # (_RULES' check, inlined: one made per allocation)
            _tuple_or_none("blocks", blocks)
        object.__setattr__(self, "blocks", blocks)

    def __add__(self, other: KVCacheBlocks) -> KVCacheBlocks:
        return KVCacheBlocks(tuple(list(a) + list(b) for a, b in zip(self.blocks, other.blocks)))

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, KVCacheBlocks):
            return NotImplemented
        return self.get_block_ids() == other.get_block_ids()

    __hash__ = None  # type: ignore[assignment]

    def get_block_ids(self, allow_none: bool = False) -> tuple[list[int], ...] | None:
        """Block ids per group (``None`` with ``allow_none`` when there are none)."""
        if allow_none and all(len(g) == 0 for g in self.blocks):
            return None
        return tuple([blk._block_id for blk in group] for group in self.blocks)

    def get_unhashed_block_ids(self) -> list[int]:
        if len(self.blocks) != 1:
            raise ValueError("get_unhashed_block_ids supports exactly one group")
        return [b._block_id for b in self.blocks[0] if b.block_hash is None]

    def new_empty(self) -> KVCacheBlocks:
        return KVCacheBlocks(tuple(() for _ in range(len(self.blocks))))

    def __repr__(self) -> str:
        return f"KVCacheBlocks({self.get_block_ids()})"


class KVCacheManager(_Checked):
    """The KV-cache manager a scheduler drives: vLLM 0.33.0's constructor and methods.

    Args:
        kv_cache_config: blocks and KV-cache groups.
        max_model_len: the longest sequence; slot requests are capped at it.
        scheduler_block_size: scheduling granularity (LCM of the groups' block sizes).
        hash_block_size: the block size request hashes are computed at.
        max_in_flight_tokens: tokens scheduled but not yet settled (sizes the
            sliding-window / chunked admission cap); defaults to max_model_len.
        enable_caching: prefix caching on or off.
        use_eagle: drop the last hit block (EAGLE needs its hidden states).
        log_stats: keep PrefixCacheStats (``make_prefix_cache_stats``).
        enable_kv_cache_events: queue KV events (``take_events``).
        watermark: fraction of all blocks kept free when admitting
            waiting / preempted requests while others are scheduled.
        use_int_block_hashes: publish event hashes as 64-bit ints (default:
            ``VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES``).
    """

    # Fixed when made; the collector, the stats object and the watermark are free.
    _RULES = {
        **dict.fromkeys(
            ("max_model_len", "enable_caching", "enable_kv_cache_events", "use_eagle", "log_stats",
             "coordinator", "num_kv_cache_groups", "block_pool", "kv_cache_config", "kv_cache_event_metadata",
             "empty_kv_cache_blocks", "_group_block_sizes", "_no_blocks"),
            _READ_ONLY,
        ),
        "watermark_blocks": _as_index,
    }

    def __init__(
        self,
        kv_cache_config: KVCacheConfig,
        max_model_len: int,
        scheduler_block_size: int,
        hash_block_size: int,
        max_in_flight_tokens: int | None = None,
        enable_caching: bool = True,
        use_eagle: bool = False,
        log_stats: bool = False,
        enable_kv_cache_events: bool = False,
        dcp_world_size: int = 1,
        pcp_world_size: int = 1,
        metrics_collector: Any = None,
        watermark: float = 0.0,
        use_int_block_hashes: bool | None = None,
    ) -> None:
        for name, value in (("max_model_len", max_model_len), ("scheduler_block_size", scheduler_block_size),
                            ("hash_block_size", hash_block_size)):
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ValueError(f"{name} must be a positive int, got {value!r}")
        if dcp_world_size != 1 or pcp_world_size != 1:
            raise ValueError("decode/prefill context parallelism is not supported (dcp/pcp world size must be 1)")
        if not 0.0 <= float(watermark) < 1.0:
            raise ValueError(f"watermark must be in [0, 1), got {watermark!r}")
        if max_in_flight_tokens is None:
            max_in_flight_tokens = max_model_len
        if not kv_cache_config.kv_cache_groups and enable_caching:
            enable_caching = False
        self.max_model_len = max_model_len
        self.enable_caching = bool(enable_caching)
        self.enable_kv_cache_events = bool(enable_kv_cache_events)
        self.use_eagle = bool(use_eagle)
        self.log_stats = bool(log_stats)
        self.metrics_collector = metrics_collector
        self.prefix_cache_stats = PrefixCacheStats() if log_stats else None
        self.coordinator = get_kv_cache_coordinator(
            kv_cache_config, max_model_len, max_in_flight_tokens, self.use_eagle,
            self.enable_caching, self.enable_kv_cache_events, scheduler_block_size,
            hash_block_size, use_int_block_hashes,
        )
        self.num_kv_cache_groups = len(kv_cache_config.kv_cache_groups)
        self.block_pool = self.coordinator.block_pool
        self.kv_cache_config = kv_cache_config
        self.watermark_blocks = int(watermark * kv_cache_config.num_blocks)
        self.kv_cache_event_metadata = tuple(
            (get_kv_cache_spec_kind(g.kv_cache_spec).value, get_kv_cache_spec_sliding_window(g.kv_cache_spec))
            for g in kv_cache_config.kv_cache_groups
        )
        self.empty_kv_cache_blocks = KVCacheBlocks(tuple(() for _ in range(self.num_kv_cache_groups)))
        # (not empty_kv_cache_blocks.blocks: callers get that object from get_computed_blocks
        # and may reassign its blocks; allocate_slots works with one list per group)
        self._no_blocks = self.empty_kv_cache_blocks.blocks
        self._group_block_sizes = tuple(g.kv_cache_spec.block_size for g in kv_cache_config.kv_cache_groups)
        managers = self.coordinator.single_type_managers
        # The only manager, when the coordinator hands it the tokens to cache unchanged.
        self._single = managers[0] if len(managers) == 1 and type(self.coordinator) is UnitaryKVCacheCoordinator else None

    # ------------------------------------------------------------------ info
    @property
    def usage(self) -> float:
        """Fraction of usable blocks in use."""
        return self.block_pool.get_usage()

    def make_prefix_cache_stats(self) -> PrefixCacheStats | None:
        """Take the stats gathered since the last call (None unless log_stats)."""
        if not self.log_stats:
            return None
        stats = self.prefix_cache_stats
        self.prefix_cache_stats = PrefixCacheStats()
        return stats

    def create_kv_cache_blocks(self, blocks: tuple[list[KVCacheBlock], ...]) -> KVCacheBlocks:
        return KVCacheBlocks(blocks) if any(blocks) else self.empty_kv_cache_blocks

    # ------------------------------------------------------------------ lookups
    def get_computed_blocks(self, request: Request) -> tuple[KVCacheBlocks, int, int]:
        """The longest prefix-cache hit for a request; changes no reference counts.

        Returns:
            ``(blocks, num_computed_tokens, shared_prefix_boundary)``.  The hit
            never covers the request's last token.
        """
        if not self.enable_caching:
            return self.empty_kv_cache_blocks, 0, 0
        try:
            skip = request.skip_reading_prefix_cache
        except AttributeError:
            raise TypeError(f"expected a Request, got {type(request).__name__}") from None
        if skip:
            return self.empty_kv_cache_blocks, 0, 0
        max_cache_hit_length = request.num_tokens - 1
        computed_blocks, num_new_computed_tokens, num_uncached = self.coordinator.find_longest_cache_hit(
            request.block_hashes, max_cache_hit_length
        )
        if self.log_stats:
            self.prefix_cache_stats.record(
                num_tokens=request.num_tokens,
                num_hits=num_new_computed_tokens,
                preempted=request.num_preemptions > 0,
            )
        if (
            num_new_computed_tokens > 0
            and self.enable_kv_cache_events
            and request.kv_cache_report_mode == "full"
        ):
            for group_idx, group_blocks in enumerate(computed_blocks):
                if group_blocks:
                    self.block_pool.emit_cached_block_events(
                        request, len(group_blocks), self._group_block_sizes[group_idx], group_idx
                    )
        boundary = num_new_computed_tokens + num_uncached if num_uncached else 0
        return self.create_kv_cache_blocks(computed_blocks), num_new_computed_tokens, boundary

    # ------------------------------------------------------------------ allocation
    def allocate_slots(
        self,
        request: Request,
        num_new_tokens: int,
        num_new_computed_tokens: int = 0,
        new_computed_blocks: KVCacheBlocks | None = None,
        num_lookahead_tokens: int = 0,
        num_external_computed_tokens: int = 0,
        delay_cache_blocks: bool = False,
        num_encoder_tokens: int = 0,
        full_sequence_must_fit: bool = False,
        reserved_blocks: int = 0,
        has_scheduled_reqs: bool = True,
    ) -> KVCacheBlocks | None:
        """Add slots for ``num_new_tokens`` (+ lookahead) tokens of a request.

        Returns the newly allocated blocks per group, or ``None`` -- with
        nothing allocated or touched -- when the pool cannot hold them.

        Raises:
            ValueError: a negative count; no tokens at all; prefix hits handed
                to a running request.  (Tokens past ``max_model_len`` are not an
                error: the counts are clamped to it, as in vLLM.)
            TypeError: a count that is not an int.
        """
        num_new_tokens = _check_count("num_new_tokens", num_new_tokens)
        num_new_computed_tokens = _check_count("num_new_computed_tokens", num_new_computed_tokens)
        num_lookahead_tokens = _check_count("num_lookahead_tokens", num_lookahead_tokens)
        num_external_computed_tokens = _check_count("num_external_computed_tokens", num_external_computed_tokens)
        num_encoder_tokens = _check_count("num_encoder_tokens", num_encoder_tokens)
        reserved_blocks = _check_count("reserved_blocks", reserved_blocks)
        if num_new_tokens == 0 and num_new_computed_tokens == 0 and num_external_computed_tokens == 0:
            raise ValueError(
                "num_new_tokens must be greater than 0 when there are no new computed or external computed tokens"
            )
        request_id = _request_id(request)
        num_computed = request.num_computed_tokens
        num_local_computed_tokens = num_computed + num_new_computed_tokens
        if new_computed_blocks is None or not any(new_computed_blocks.blocks):
            new_blocks_list = self._no_blocks
            has_new_computed = False
        else:
            new_blocks_list = new_computed_blocks.blocks
            if len(new_blocks_list) != self.num_kv_cache_groups:
                raise ValueError(
                    f"new_computed_blocks has {len(new_blocks_list)} groups, the manager has "
                    f"{self.num_kv_cache_groups}"
                )
            has_new_computed = True
            if self.coordinator.holds(request_id):
                raise ValueError(
                    f"request {request_id!r} already holds blocks; new_computed_blocks is only for "
                    "a request's first allocation"
                )
            for g in new_blocks_list:
                _check_touchable(g, None, self.block_pool.blocks)

        total_computed_tokens = min(num_local_computed_tokens + num_external_computed_tokens, self.max_model_len)
        watermark_blocks = 0
        status = request.status
        if has_scheduled_reqs and status in _WATERMARK_STATUSES:
            watermark_blocks = self.watermark_blocks
        coordinator = self.coordinator
        if full_sequence_must_fit:
            full_num_tokens = min(request.num_tokens, self.max_model_len)
            needed = coordinator.get_num_blocks_to_allocate(
                request_id, full_num_tokens, new_blocks_list, num_encoder_tokens,
                total_computed_tokens, num_local_computed_tokens, full_num_tokens, True,
            )
            if needed + watermark_blocks > self.block_pool.get_num_free_blocks():
                return None

        num_tokens_main_model = total_computed_tokens + num_new_tokens
        num_tokens_need_slot = min(num_tokens_main_model + num_lookahead_tokens, self.max_model_len)
        caching = self.enable_caching and not delay_cache_blocks
        if caching:  # (what caching reads, before any change)
            n_cache = total_computed_tokens + num_new_tokens
            num_tokens = len(request._all_token_ids) if request.__class__ is Request else request.num_tokens
            if num_tokens < n_cache:
                n_cache = num_tokens
            single = self._single
            if single is None or single._num_cached_block.get(request_id, -1) < n_cache // single.block_size:
                # (one plain group whose request has its full blocks cached already -- a
                # decode step between block boundaries -- reads nothing: skipped)
                coordinator._check_cache_inputs(
                    request, request_id, n_cache, new_blocks_list,
                    has_new_computed or num_external_computed_tokens > 0,
                    num_local_computed_tokens + num_external_computed_tokens,
                )
        coordinator.remove_skipped_blocks(request_id, max(0, total_computed_tokens - request.num_in_flight_tokens))
        needed = coordinator.get_num_blocks_to_allocate(
            request_id, num_tokens_need_slot, new_blocks_list, num_encoder_tokens,
            num_local_computed_tokens + num_external_computed_tokens, num_local_computed_tokens,
            num_tokens_main_model,
        )
        if needed + watermark_blocks > self.block_pool.get_num_free_blocks() - reserved_blocks:
            return None
        if has_new_computed or num_external_computed_tokens > 0:
            coordinator._allocate_new_computed_blocks(
                request_id, new_blocks_list, num_local_computed_tokens, num_external_computed_tokens
            )
        new_blocks = coordinator.allocate_new_blocks(
            request_id, num_tokens_need_slot, num_tokens_main_model, num_encoder_tokens
        )
        if caching:
            coordinator.cache_blocks(request, n_cache)
        return self.create_kv_cache_blocks(new_blocks)

    def free(self, request: Request) -> None:
        """Free the request's blocks, tail first, group by group.

        A request that holds no blocks (never allocated, or freed already) is
        left as it is, as in vLLM.

        Raises:
            TypeError: not a request, or its ``request_id`` is not a str.
        """
        request_id = _request_id(request)
        if self.coordinator.holds(request_id):
            self.coordinator.free(request_id)

    def remove_skipped_blocks(self, request_id: str, processed_computed_tokens: int) -> None:
        processed_computed_tokens = _check_count("processed_computed_tokens", processed_computed_tokens)
        self.coordinator.remove_skipped_blocks(request_id, processed_computed_tokens)

    def pop_blocks_for_free(self, request: Request) -> list[KVCacheBlock]:
        return self.coordinator.pop_blocks_for_free(request.request_id)

    def evict_blocks(self, block_ids: set[int]) -> None:
        self.block_pool.evict_blocks(block_ids)

    def reset_prefix_cache(self) -> bool:
        """Drop all cached hashes; False (and nothing changes) while blocks are in use."""
        if not self.block_pool.reset_prefix_cache():
            return False
        if self.log_stats:
            self.prefix_cache_stats.reset = True
        return True

    def get_num_common_prefix_blocks(self, running_request_id: str) -> list[int]:
        return self.coordinator.get_num_common_prefix_blocks(running_request_id)

    def take_events(self) -> list[KVCacheEvent]:
        """Drain the KV events, annotated with each group's spec kind and window."""
        events = self.block_pool.take_events()
        meta = self.kv_cache_event_metadata
        for event in events:
            if event.__class__ is BlockStored and event.group_idx is not None and 0 <= event.group_idx < len(meta):
                event.kv_cache_spec_kind, event.kv_cache_spec_sliding_window = meta[event.group_idx]
        return events

    def get_blocks(self, request_id: str) -> KVCacheBlocks:
        """The request's whole block table per group (empty groups if it holds none).

        Raises:
            TypeError: ``request_id`` is not a str.
        """
        _check_rid(request_id)
        return KVCacheBlocks(self.coordinator.get_blocks(request_id))

    def get_block_ids(self, request_id: str) -> tuple[list[int], ...]:
        return self.get_blocks(request_id).get_block_ids()

    def new_step_starts(self) -> None:
        return None
