"""``LRUCachePolicy``: least recently used, ranked per request
(``vllm.v1.kv_offload.cpu.policies.lru``)."""

from __future__ import annotations

import heapq
from collections.abc import Collection, Sequence

from kvcy._fast.offload_py._common import _check_key, _check_position, _owner_ids
from kvcy._fast.offload_py.policies_base import CachePolicy, _check_chunk, _check_evict_n, _key_seq
from kvcy._fast.offload_py.policies_base_chunk_status import ChunkStatus
from kvcy._fast.offload_py.policies_base_request_order import order_request_keys
from kvcy.kv_offload.base import OffloadKey, ReqContext


class _LRURequestRanks(dict):
    """Kept on a ReqContext: LRU policy id -> (policy epoch, request rank)."""

    __slots__ = ()


class LRUCachePolicy(CachePolicy):
    """Least recently used, where recency is ranked per request.

    Every resident key has a rank ``(counter, -position)``; the lowest
    ``(rank, key bytes)`` among evictable keys is evicted first.  The keys a
    request stores or first reads with known positions share the request's
    rank (taken at its first access), so within one request the tail goes
    before the head.  ``touch`` and a request's end give keys fresh ranks.
    """

    def __init__(self, cache_capacity: int):
        super().__init__(cache_capacity)
        #: key -> chunk of every resident key.
        self.chunks: dict[OffloadKey, ChunkStatus] = {}
        #: key -> rank of every resident key.
        self._ranks: dict[OffloadKey, tuple[int, int]] = {}
        self._counter = 0
        self._epoch = 0
        self._owner = next(_owner_ids)
        # A heap of (rank, key) over the evictable keys.  An entry is live
        # only while it is the one in _live for its key; others are skipped.
        self._heap: list[tuple[tuple[int, int], OffloadKey]] = []
        self._live: dict[OffloadKey, tuple[tuple[int, int], OffloadKey]] = {}

    def _fresh_rank(self) -> tuple[int, int]:
        self._counter += 1
        return (self._counter, 0)

    def _request_rank(self, req_context: ReqContext) -> int:
        ranks = req_context.get_state(_LRURequestRanks)
        if ranks is None:
            ranks = _LRURequestRanks()
            req_context.set_state(ranks)
        elif type(ranks) is not _LRURequestRanks:  # (a ReqContext of another kind: the C twin's check)
            raise TypeError(f"req_context.get_state(_LRURequestRanks) returned {type(ranks).__name__}, not the _LRURequestRanks set on it")
        got = ranks.get(self._owner)
        if got is not None and got[0] == self._epoch:
            return got[1]
        self._counter += 1
        ranks.clear()  # one rank per context, as vLLM: another policy's is replaced
        ranks[self._owner] = (self._epoch, self._counter)
        return self._counter

    def _set_rank(self, key: OffloadKey, rank: tuple[int, int]) -> None:
        self._ranks[key] = rank
        if key in self._live:
            self._push(key, rank)

    def _push(self, key: OffloadKey, rank: tuple[int, int]) -> None:
        entry = (rank, key)
        self._live[key] = entry
        heapq.heappush(self._heap, entry)
        if len(self._heap) > 2 * len(self._live) + 64:
            self._heap = list(self._live.values())
            heapq.heapify(self._heap)

    def get(self, key: OffloadKey) -> ChunkStatus | None:
        """The chunk of a resident key, or ``None``."""
        return self.chunks.get(key)

    def insert(self, key: OffloadKey, chunk: ChunkStatus, req_context: ReqContext) -> None:
        """Make ``key`` resident; ranked with its request if its position is known."""
        _check_key(key)
        _check_chunk(chunk)
        position = req_context.get_offload_key_position(key)
        if position is None:
            rank = self._fresh_rank()
        else:
            if type(position) is not int:
                _check_position(position)
            rank = (self._request_rank(req_context), -position)
        self.chunks[key] = chunk
        self._ranks[key] = rank
        if chunk.ref_cnt == 0:
            self._push(key, rank)

    def remove(self, key: OffloadKey) -> None:
        """Drop a resident key."""
        _check_key(key)
        del self.chunks[key]
        del self._ranks[key]
        self._live.pop(key, None)

    def touch(self, keys: Sequence[OffloadKey], req_context: ReqContext) -> None:
        """Fresh ranks for the resident keys, last key first (the first ends most recent)."""
        chunks = self.chunks
        for key in reversed(_key_seq(keys)):
            if key in chunks:
                self._set_rank(key, self._fresh_rank())

    def on_request_access(self, keys: Sequence[OffloadKey], req_context: ReqContext) -> None:
        """Raise resident keys with positions to the request's rank (never lowers one)."""
        new_keys = _key_seq(keys)
        request_rank = self._request_rank(req_context)
        chunks = self.chunks
        ranks = self._ranks
        get_position = req_context.get_offload_key_position
        for key in new_keys:
            if key in chunks:
                position = get_position(key)
                if position is not None:
                    if type(position) is not int:
                        _check_position(position)
                    rank = (request_rank, -position)
                    if rank > ranks[key]:
                        self._set_rank(key, rank)

    def on_request_finished(
        self,
        key_groups: Sequence[Sequence[OffloadKey]],
        insertion_only_keys: Collection[OffloadKey],
        reused_keys: Collection[OffloadKey],
        req_context: ReqContext,
    ) -> None:
        """Fresh ranks for the request's resident keys, tail first (the head ends most recent)."""
        chunks = self.chunks
        for key in reversed(order_request_keys(key_groups, req_context)):
            if key in chunks:
                self._set_rank(key, self._fresh_rank())

    def mark_evictable(self, key: OffloadKey) -> None:
        """``key`` may be evicted again."""
        self._push(key, self._ranks[key])

    def mark_non_evictable(self, key: OffloadKey) -> None:
        """``key`` is pinned."""
        self._live.pop(key, None)

    def evict(self, n: int, protected: Collection[OffloadKey]) -> list[tuple[OffloadKey, ChunkStatus]] | None:
        """Evict the ``n`` evictable, unprotected keys lowest in ``(rank, key)`` order."""
        _check_evict_n(n)
        if n <= 0:
            return []
        heap = self._heap
        live = self._live
        chunks = self.chunks
        picked: list[tuple[tuple[int, int], OffloadKey]] = []
        skipped: list[tuple[tuple[int, int], OffloadKey]] = []
        while heap and len(picked) < n:
            entry = heapq.heappop(heap)
            key = entry[1]
            if live.get(key) is not entry:
                continue  # superseded by a newer rank, or no longer evictable
            if key in protected or chunks[key].ref_cnt != 0:
                skipped.append(entry)
            else:
                picked.append(entry)
        if len(picked) < n:
            for entry in picked:
                heapq.heappush(heap, entry)
            for entry in skipped:
                heapq.heappush(heap, entry)
            return None
        for entry in skipped:
            heapq.heappush(heap, entry)
        evicted = []
        for _, key in picked:
            evicted.append((key, chunks.pop(key)))
            del self._ranks[key]
            del live[key]
        return evicted

    def clear(self) -> None:
        """Forget every key and every request's rank."""
        self.chunks.clear()
        self._ranks.clear()
        self._heap.clear()
        self._live.clear()
        self._counter = 0
        self._epoch += 1
