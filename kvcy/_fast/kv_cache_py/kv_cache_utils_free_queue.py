"""The LRU queue of free blocks (pure-Python twin).

From vLLM 0.33.0's ``vllm/v1/core/kv_cache_utils.py`` (``FreeKVCacheBlockQueue``):
a doubly linked list threaded through the blocks, O(1) removal from the middle.
"""

from __future__ import annotations

from collections.abc import Iterator

from kvcy._fast.kv_cache_py._common import _as_index
from kvcy._fast.kv_cache_py.kv_cache_utils import KVCacheBlock


class FreeKVCacheBlockQueue:
    """Queue of free blocks (a doubly linked list in vLLM).

    Here too a doubly linked list, threaded through the blocks themselves.  A
    fake head and tail (``block_id == -1``) remove the edge cases.  Removal from
    the middle is O(1), which ``touch`` needs when a cached free block is hit
    again.  Order: head = next to allocate, tail = most recently freed.
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
            AssertionError: fewer than ``n`` blocks are free (vLLM's assertion).
            ValueError: ``n`` is negative.
        """
        if n < 0:
            raise ValueError(f"n must be non-negative, got {n}")
        if n == 0:
            return []
        if n > self._num_free_blocks:
            raise AssertionError(f"Cannot pop {n} blocks: only {self._num_free_blocks} are free")  # (vLLM asserts)
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

    def iter_blocks_after(self, cursor: KVCacheBlock | None) -> Iterator[KVCacheBlock]:
        """The free blocks in eviction order after ``cursor`` (from the head when it is
        None), as vLLM's generator walks them; nothing after a block that is not queued
        here or after the fake tail."""
        curr = self._fake_free_list_head if cursor is None else cursor
        tail = self._fake_free_list_tail
        while True:
            curr = curr.next_free_block
            if curr is None or curr is tail:
                return
            yield curr

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
