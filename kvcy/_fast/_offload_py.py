"""Pure-Python twin of the CPU offloading tier's scheduler-side hot paths.

The CPU tier's manager (``CPUOffloadingManager``), its two cache policies
(``LRUCachePolicy``: request-ranked LRU, ``ARCCachePolicy``: adaptive
replacement) and the per-chunk state (``ChunkStatus``) live twice: here and in
``_offload_c.pyx``, with the same names, signatures, docstrings and messages.
The public modules under ``kvcy.kv_offload.cpu`` re-export the selected twin
(``kvcy.kv_offload._twin``).

Behaviour follows vLLM 0.33.0's ``vllm.v1.kv_offload.cpu`` decision for
decision, as pinned down by section 5 of ``shared/golden/README.md`` and the
vectors in ``shared/golden/offload.jsonl``.  Where vLLM fails a call half way
(an ``AssertionError`` after some keys were already pinned or recorded), this
twin checks every key first, so the same error is raised with no state
changed.

What both twins refuse, before changing anything, and how:

* a key that is not ``bytes`` (``TypeError``) or shorter than 4 bytes
  (``ValueError``), in every method; a bare ``bytes``/``str`` where a key list
  is expected (``TypeError``);
* a ``req_context`` that is not a ``ReqContext`` where it is used
  (``prepare_store``, a recording ``prepare_load``, ``on_new_request``,
  ``on_request_finished``): ``TypeError``;
* a key offered twice in one ``prepare_store`` (``ValueError``: vLLM would
  give it two chunks);
* vLLM's own ``AssertionError``s, with its messages: ``Chunk {key!r} not found
  in cache`` / ``is not ready for reading`` (``prepare_load``), ``Chunk {key!r}
  not found`` / ``ref_cnt is already 0`` (``complete_load``, counting repeats
  of a key within the call), ``New cache keys observed after request
  finalization`` (``prepare_load`` / ``prepare_store``, for exactly the keys
  vLLM would record);
* bad constructor arguments: ``num_chunks``, ``store_threshold`` and
  ``max_tracker_size`` must be non-negative ints (``TypeError`` /
  ``ValueError``), an unknown policy name is the factory's ``ValueError``.

``complete_store`` of keys that are not write-pending is a no-op, as in vLLM.

The golden replayer's ``check`` reads the same internals vLLM's does:
``manager._policy``, ``_free_list``, ``_num_allocated_chunks``,
``_num_evictable_cache_chunks``, ``_num_write_pending_chunks``, ``counts``;
``LRUCachePolicy.chunks`` and ``._ranks``; ``ARCCachePolicy.t1``, ``.t2``,
``.b1``, ``.b2`` and ``.target_t1_size``.
"""

from __future__ import annotations

import heapq
import itertools
from abc import ABC, abstractmethod
from collections import OrderedDict
from collections.abc import Collection, Iterable, Iterator, Sequence
from typing import Any

import numpy as np

from kvcy.kv_offload.base import (
    CacheHitSource,
    LookupResult,
    Medium,
    OffloadingEvent,
    OffloadingManager,
    OffloadKey,
    PrepareStoreOutput,
    ReqContext,
    RequestOffloadingContext,
)
from kvcy.kv_offload.cpu.common import CPULoadStoreSpec, CPUOffloadingInfo, CPUOffloadingMetrics
from kvcy.kv_offload.metrics import OffloadingConnectorStats

__all__ = [
    "ARCCachePolicy",
    "CPUOffloadingManager",
    "CachePolicy",
    "ChunkStatus",
    "IMPLEMENTATION",
    "LRUCachePolicy",
    "order_request_keys",
]

IMPLEMENTATION = "python"

_MISS = LookupResult.MISS
_HIT = LookupResult.HIT
_HIT_PENDING = LookupResult.HIT_PENDING
_CPU = Medium.CPU

# Unique ids for policies and managers: the per-request state they keep on a
# ReqContext is filed under this id, so two of them never share a record.
_owner_ids = itertools.count(1)


# =============================================================================
# Argument checks (the same messages in both twins)
# =============================================================================
def _check_key(key: Any) -> None:
    if type(key) is not bytes and not isinstance(key, bytes):
        raise TypeError(f"an offload key must be bytes, got {type(key).__name__}")
    if len(key) < 4:
        raise ValueError(
            f"an offload key is a block hash plus a 4-byte group index, got {len(key)} bytes: {key!r}"
        )


def _check_chunk(chunk: Any) -> None:
    """The chunk argument of a policy's insert (the compiled twin types it)."""
    if not isinstance(chunk, ChunkStatus):
        raise TypeError(f"chunk must be a ChunkStatus, got {type(chunk).__name__}")


def _check_keys(keys: Any) -> list:
    """``keys`` as a list of valid offload keys, or a TypeError / ValueError."""
    if isinstance(keys, (bytes, str)) or not isinstance(keys, Iterable):
        raise TypeError(f"keys must be a collection of offload keys, got {type(keys).__name__}")
    out = list(keys)
    for key in out:
        if type(key) is not bytes or len(key) < 4:
            _check_key(key)
    return out


def _key_seq(keys: Any) -> list:
    """The keys of a policy call, as a list (each must be hashable; any type)."""
    if type(keys) is list:
        return keys
    if isinstance(keys, (bytes, str)) or not isinstance(keys, Iterable):
        raise TypeError(f"keys must be a collection of offload keys, got {type(keys).__name__}")
    return list(keys)


def _check_evict_n(n: Any) -> None:
    """The ``n`` of a policy's evict (the compiled twin checks it the same way)."""
    if isinstance(n, bool) or not isinstance(n, int):
        raise TypeError(f"n must be an int, got {type(n).__name__}")


def _check_context(req_context: Any) -> None:
    if not isinstance(req_context, ReqContext):
        raise TypeError(f"req_context must be a ReqContext, got {type(req_context).__name__}")


def _chunk_spec(chunk_ids: list[int]) -> CPULoadStoreSpec:
    """A CPULoadStoreSpec of chunk ids the manager handed out (already valid)."""
    spec = CPULoadStoreSpec.__new__(CPULoadStoreSpec)
    spec.block_ids = np.array(chunk_ids, dtype=np.int32)
    return spec


def _check_int(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    if value < 0:
        raise ValueError(f"{name} must be non-negative, got {value}")
    return int(value)


# =============================================================================
# Chunk state and the policy interface
# =============================================================================
class ChunkStatus:
    """One chunk of the CPU cache and how it is used.

    ``ref_cnt`` is ``-1`` while the chunk is being written (after
    ``prepare_store``, before ``complete_store``), ``0`` when it is readable and
    may be evicted, and ``k > 0`` while ``k`` loads are reading it.

    Args:
        chunk_id: the chunk's number, ``0 .. num_chunks - 1``.
    """

    __slots__ = ("chunk_id", "ref_cnt")

    def __init__(self, chunk_id: int):
        self.chunk_id: int = _check_int("chunk_id", chunk_id)
        self.ref_cnt: int = -1

    @property
    def is_ready(self) -> bool:
        """Whether the chunk's data is written (it can be read)."""
        return self.ref_cnt >= 0

    def __repr__(self) -> str:
        return f"ChunkStatus(chunk_id={self.chunk_id}, ref_cnt={self.ref_cnt})"


def order_request_keys(key_groups: Sequence[Sequence[OffloadKey]], req_context: ReqContext) -> list[OffloadKey]:
    """A request's keys head to tail: its groups concatenated in group order,
    then stably sorted by end-token position when every key has one.

    Args:
        key_groups: the request's keys, one list per KV cache group.
        req_context: the request, whose recorded positions order the keys.
    """
    keys = [key for group in key_groups for key in group]
    get = req_context.get_offload_key_position
    positions = [get(key) for key in keys]
    if None in positions:
        return keys
    order = sorted(range(len(keys)), key=positions.__getitem__)
    return [keys[i] for i in order]


class CachePolicy(ABC):
    """Which chunk each resident key has, and which keys to evict.

    The manager owns the chunk pool and the reference counts; a policy owns
    the key -> :class:`ChunkStatus` map and the recency bookkeeping, and is
    told about every access.  The hooks without a body here are optional.

    Args:
        cache_capacity: the cache size in chunks.
    """

    def __init__(self, cache_capacity: int):
        self.cache_capacity: int = _check_int("cache_capacity", cache_capacity)

    @abstractmethod
    def get(self, key: OffloadKey) -> ChunkStatus | None:
        """The chunk of a resident key, or ``None``."""

    @abstractmethod
    def insert(self, key: OffloadKey, chunk: ChunkStatus, req_context: ReqContext) -> None:
        """Make ``key`` resident in ``chunk`` (being written), stored for ``req_context``."""

    @abstractmethod
    def remove(self, key: OffloadKey) -> None:
        """Drop a resident key whose store failed."""

    @abstractmethod
    def touch(self, keys: Sequence[OffloadKey], req_context: ReqContext) -> None:
        """Mark keys as recently used; the first key ends most recent."""

    def on_store_miss(self, keys: Sequence[OffloadKey], req_context: ReqContext) -> None:
        """Keys a request offered that are not resident (seen once per request)."""

    def on_request_access(self, new_keys: Sequence[OffloadKey], req_context: ReqContext) -> None:
        """Keys a request loaded or offered for the first time."""

    def on_request_finished(
        self,
        key_groups: Sequence[Sequence[OffloadKey]],
        insertion_only: Collection[OffloadKey],
        reused: Collection[OffloadKey],
        req_context: ReqContext,
    ) -> None:
        """A request finished: its keys per group, which it only stored and which it reused."""

    @abstractmethod
    def evict(self, n: int, protected: Collection[OffloadKey]) -> list[tuple[OffloadKey, ChunkStatus]] | None:
        """Remove ``n`` evictable keys not in ``protected`` and return them with their chunks.

        Returns ``None``, changing nothing, when fewer than ``n`` qualify.
        """

    @abstractmethod
    def clear(self) -> None:
        """Forget every key."""

    def mark_evictable(self, key: OffloadKey) -> None:
        """A resident key's ``ref_cnt`` became 0."""

    def mark_non_evictable(self, key: OffloadKey) -> None:
        """A resident key's ``ref_cnt`` left 0 (a load pinned it)."""


# =============================================================================
# LRU, ranked by request
# =============================================================================
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
        got = ranks.get(self._owner)
        if got is not None and got[0] == self._epoch:
            return got[1]
        self._counter += 1
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

    def on_request_access(self, new_keys: Sequence[OffloadKey], req_context: ReqContext) -> None:
        """Raise resident keys with positions to the request's rank (never lowers one)."""
        new_keys = _key_seq(new_keys)
        request_rank = self._request_rank(req_context)
        chunks = self.chunks
        ranks = self._ranks
        get_position = req_context.get_offload_key_position
        for key in new_keys:
            if key in chunks:
                position = get_position(key)
                if position is not None:
                    rank = (request_rank, -position)
                    if rank > ranks[key]:
                        self._set_rank(key, rank)

    def on_request_finished(
        self,
        key_groups: Sequence[Sequence[OffloadKey]],
        insertion_only: Collection[OffloadKey],
        reused: Collection[OffloadKey],
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


# =============================================================================
# ARC
# =============================================================================
class ARCCachePolicy(CachePolicy):
    """Adaptive replacement: recency (``t1``) and frequency (``t2``) lists.

    Keys enter ``t1``; a touch or a reuse by a finished request moves them to
    ``t2``.  Evicted keys leave a ghost in ``b1`` / ``b2``; a ghost hit moves
    ``target_t1_size``, the share of the cache ``t1`` may keep, towards the
    list that would have kept the key.
    """

    def __init__(self, cache_capacity: int):
        super().__init__(cache_capacity)
        #: Keys seen once, oldest first: key -> chunk.
        self.t1: OrderedDict[OffloadKey, ChunkStatus] = OrderedDict()
        #: Keys seen again, oldest first: key -> chunk.
        self.t2: OrderedDict[OffloadKey, ChunkStatus] = OrderedDict()
        #: Ghosts of keys evicted from t1, oldest first.
        self.b1: OrderedDict[OffloadKey, None] = OrderedDict()
        #: Ghosts of keys evicted from t2, oldest first.
        self.b2: OrderedDict[OffloadKey, None] = OrderedDict()
        #: How many chunks t1 aims to hold.
        self.target_t1_size: float = 0.0

    def get(self, key: OffloadKey) -> ChunkStatus | None:
        """The chunk of a resident key, or ``None``."""
        chunk = self.t1.get(key)
        if chunk is None:
            chunk = self.t2.get(key)
        return chunk

    def insert(self, key: OffloadKey, chunk: ChunkStatus, req_context: ReqContext) -> None:
        """Make ``key`` the newest entry of ``t1``; it stops being a ghost."""
        _check_key(key)
        _check_chunk(chunk)
        self.t1[key] = chunk
        self.b1.pop(key, None)
        self.b2.pop(key, None)

    def remove(self, key: OffloadKey) -> None:
        """Drop a resident key, leaving no ghost."""
        _check_key(key)
        if self.t1.pop(key, None) is None:
            del self.t2[key]

    def _ghost_hit(self, key: OffloadKey) -> None:
        b1 = self.b1
        b2 = self.b2
        if key in b1:
            delta = max(1.0, len(b2) / len(b1))
            self.target_t1_size = min(self.target_t1_size + delta, float(self.cache_capacity))
            b1.move_to_end(key)
        elif key in b2:
            delta = max(1.0, len(b1) / len(b2))
            self.target_t1_size = max(self.target_t1_size - delta, 0.0)
            b2.move_to_end(key)

    def touch(self, keys: Sequence[OffloadKey], req_context: ReqContext) -> None:
        """Last key first: t1 -> t2 (pending keys stay in t1), t2 -> newest, ghosts adapt."""
        t1 = self.t1
        t2 = self.t2
        for key in reversed(_key_seq(keys)):
            chunk = t1.pop(key, None)
            if chunk is not None:
                if chunk.ref_cnt < 0:
                    t1[key] = chunk
                else:
                    t2[key] = chunk
            elif key in t2:
                t2.move_to_end(key)
            else:
                self._ghost_hit(key)

    def on_store_miss(self, keys: Sequence[OffloadKey], req_context: ReqContext) -> None:
        """A ghost hit for each key, last key first."""
        for key in reversed(_key_seq(keys)):
            self._ghost_hit(key)

    def on_request_finished(
        self,
        key_groups: Sequence[Sequence[OffloadKey]],
        insertion_only: Collection[OffloadKey],
        reused: Collection[OffloadKey],
        req_context: ReqContext,
    ) -> None:
        """Tail first: keys only stored become newest in their list; reused keys newest in t2."""
        t1 = self.t1
        t2 = self.t2
        for key in reversed(order_request_keys(key_groups, req_context)):
            if key in insertion_only:
                if key in t1:
                    t1.move_to_end(key)
                elif key in t2:
                    t2.move_to_end(key)
            elif key in reused:
                chunk = t1.pop(key, None)
                if chunk is not None:
                    t2[key] = chunk
                elif key in t2:
                    t2.move_to_end(key)

    def evict(self, n: int, protected: Collection[OffloadKey]) -> list[tuple[OffloadKey, ChunkStatus]] | None:
        """Pick ``n`` evictable, unprotected keys, from t1 while it is over target, else t2."""
        _check_evict_n(n)
        if n <= 0:
            return []
        t1 = self.t1
        t2 = self.t2
        scan1 = iter(t1.items())
        scan2 = iter(t2.items())

        def next_eligible(scan: Iterator[tuple[OffloadKey, ChunkStatus]]) -> OffloadKey | None:
            for key, chunk in scan:
                if chunk.ref_cnt == 0 and key not in protected:
                    return key
            return None

        t1_size = len(t1)
        target = int(self.target_t1_size)
        picks: list[tuple[OffloadKey, bool]] = []
        for _ in range(n):
            key = None
            if t1_size >= target:
                key = next_eligible(scan1)
                if key is not None:
                    t1_size -= 1
                    picks.append((key, True))
                    continue
            key = next_eligible(scan2)
            if key is not None:
                picks.append((key, False))
                continue
            key = next_eligible(scan1)
            if key is None:
                return None
            t1_size -= 1
            picks.append((key, True))
        evicted = []
        b1 = self.b1
        b2 = self.b2
        for key, from_t1 in picks:
            if from_t1:
                evicted.append((key, t1.pop(key)))
                b1[key] = None
            else:
                evicted.append((key, t2.pop(key)))
                b2[key] = None
        capacity = self.cache_capacity
        while len(b1) > capacity:
            b1.popitem(last=False)
        while len(b2) > capacity:
            b2.popitem(last=False)
        return evicted

    def clear(self) -> None:
        """Forget every key and ghost; the target goes back to 0."""
        self.t1.clear()
        self.t2.clear()
        self.b1.clear()
        self.b2.clear()
        self.target_t1_size = 0.0


#: The policies every manager knows without the factory.
_BUILTIN_POLICIES: dict[str, type[CachePolicy]] = {"lru": LRUCachePolicy, "arc": ARCCachePolicy}


# =============================================================================
# The manager
# =============================================================================
class _AccessRecord:
    """What one request did with one manager, since the manager's last reset."""

    __slots__ = ("generation", "key_groups", "seen", "inserted", "reused", "store_missed", "finished")

    def __init__(self, generation: int):
        self.generation = generation
        # group suffix (4 bytes, big-endian: sorts like the index) -> keys, first seen first
        self.key_groups: dict[bytes, list[OffloadKey]] = {}
        self.seen: set[OffloadKey] = set()
        self.inserted: set[OffloadKey] = set()
        self.reused: set[OffloadKey] = set()
        self.store_missed: set[OffloadKey] = set()
        self.finished = False


class _AccessRecords(dict):
    """Kept on a ReqContext: manager id -> its _AccessRecord for the request."""

    __slots__ = ()


_FINALIZED = "New cache keys observed after request finalization"


class CPUOffloadingManager(OffloadingManager):
    """The scheduler-side manager of a CPU cache of ``num_chunks`` chunks.

    It hands out chunks for stores (fresh ones first, then freed ones, last
    freed first), counts readers per chunk, asks its cache policy what to
    evict when the cache is full, and queues ``OffloadingEvent``s.  A chunk is
    write-pending from ``prepare_store`` to ``complete_store``, then readable;
    ``prepare_load`` pins it until ``complete_load``.  Only readable, unpinned
    chunks are evicted, and never one the current offer contains.

    Args:
        num_chunks: the cache size in chunks (may be 0).
        cache_policy: ``"lru"``, ``"arc"`` or a name registered with
            ``CachePolicyFactory``.
        cache_policy_module_path: a module to import the policy class named
            ``cache_policy`` from, instead of the registry.
        enable_events: queue events for ``take_events``.
        store_threshold: with 2 or more, a new key is stored only once it has
            been offered that many times (counted in a tracker of at most
            ``max_tracker_size`` keys); 0 and 1 store every offer.
        max_tracker_size: capacity of that tracker.
        info: labels reported by ``config_info()``.

    Raises:
        TypeError: an argument has the wrong type.
        ValueError: a negative size or threshold, or an unknown policy name.
    """

    def __init__(
        self,
        num_chunks: int,
        cache_policy: str = "lru",
        cache_policy_module_path: str | None = None,
        enable_events: bool = False,
        store_threshold: int = 1,
        max_tracker_size: int = 64_000,
        info: CPUOffloadingInfo | None = None,
    ):
        num_chunks = _check_int("num_chunks", num_chunks)
        if not isinstance(cache_policy, str):
            raise TypeError(f"cache_policy must be a str, got {type(cache_policy).__name__}")
        if cache_policy_module_path is not None and not isinstance(cache_policy_module_path, str):
            raise TypeError(
                f"cache_policy_module_path must be a str or None, got {type(cache_policy_module_path).__name__}"
            )
        store_threshold = _check_int("store_threshold", store_threshold)
        max_tracker_size = _check_int("max_tracker_size", max_tracker_size)
        if info is not None and not isinstance(info, dict):
            raise TypeError(f"info must be a CPUOffloadingInfo (a dict) or None, got {type(info).__name__}")
        policy_cls = None
        if cache_policy_module_path is None:
            policy_cls = _BUILTIN_POLICIES.get(cache_policy)
        if policy_cls is None:
            from kvcy.kv_offload.cpu.policies.factory import CachePolicyFactory

            policy_cls = CachePolicyFactory.get_cache_policy_cls(cache_policy, cache_policy_module_path)

        self.medium: Medium = _CPU
        self._num_chunks: int = num_chunks
        self._num_allocated_chunks: int = 0
        self._free_list: list[int] = []
        self.events: list[OffloadingEvent] | None = [] if enable_events else None
        self._policy: CachePolicy = policy_cls(cache_capacity=num_chunks)
        self._num_evictable_cache_chunks: int = 0
        self._num_write_pending_chunks: int = 0
        self.store_threshold: int = store_threshold
        self.max_tracker_size: int = max_tracker_size
        #: key -> times offered, oldest first (only with store_threshold >= 2).
        self.counts: OrderedDict[OffloadKey, int] | None = OrderedDict() if store_threshold >= 2 else None
        self.stores_skipped_in_current_batch: int = 0
        self.allocation_sizes_in_current_batch: list[int] = []
        self._info = info
        self._generation = 0
        self._owner = next(_owner_ids)

    # ------------------------------------------------------------------ records
    def _get_record(self, req_context: ReqContext, create: bool) -> _AccessRecord | None:
        records = req_context.get_state(_AccessRecords)
        if records is None:
            if not create:
                return None
            records = _AccessRecords()
            req_context.set_state(records)
        record = records.get(self._owner)
        if record is None or record.generation != self._generation:
            if not create:
                return None
            record = _AccessRecord(self._generation)
            records[self._owner] = record
        return record

    def _record(self, record: _AccessRecord, keys: list, reused: list, req_context: ReqContext) -> None:
        """Note keys a request loaded or offered; the policy hears of the new ones."""
        seen = record.seen
        key_groups = record.key_groups
        new_keys = []
        for key in keys:
            if key not in seen:
                seen.add(key)
                group = key[-4:]
                members = key_groups.get(group)
                if members is None:
                    key_groups[group] = [key]
                else:
                    members.append(key)
                new_keys.append(key)
        if new_keys:
            self._policy.on_request_access(new_keys, req_context)
        inserted = record.inserted
        record.reused.update([key for key in reused if key not in inserted])

    # ------------------------------------------------------------------ chunk pool
    def _get_num_free_chunks(self) -> int:
        return len(self._free_list) + self._num_chunks - self._num_allocated_chunks

    # ------------------------------------------------------------------ API
    def lookup(self, key: OffloadKey, req_context: ReqContext) -> LookupResult:
        """``HIT`` if ``key`` is readable, ``HIT_PENDING`` if being written, else ``MISS``.

        No side effects: recency and the store tracker are untouched.

        Raises:
            TypeError: ``key`` is not bytes.
            ValueError: ``key`` is shorter than 4 bytes.
        """
        if type(key) is not bytes or len(key) < 4:
            _check_key(key)
        chunk = self._policy.get(key)
        if chunk is None:
            return _MISS
        return _HIT if chunk.ref_cnt >= 0 else _HIT_PENDING

    def count_hits(self, keys: list[OffloadKey], req_context: ReqContext, start: int = 0,
                   stop: int | None = None) -> int:
        """How many of ``keys[start:stop]``, from the first, ``lookup`` as ``HIT``.

        The connector's admission loop (one ``lookup`` per key until the first
        one that is not a ``HIT``) as one call; like ``lookup``, no side
        effects.  Only the keys looked at are checked.

        Args:
            keys: a list of offload keys.
            req_context: the request looking.
            start: the first index looked at (clamped to ``len(keys)``).
            stop: one past the last (``None``: the end; clamped likewise).

        Raises:
            TypeError: ``keys`` is not a list, ``start`` / ``stop`` are not
                ints, or a key looked at is not bytes.
            ValueError: a negative ``start`` / ``stop``, or a key looked at is
                shorter than 4 bytes.
        """
        if type(keys) is not list:
            raise TypeError(f"keys must be a list of offload keys, got {type(keys).__name__}")
        n = len(keys)
        start = min(_check_int("start", start), n)
        stop = n if stop is None else min(_check_int("stop", stop), n)
        get = self._policy.get
        for i in range(start, stop):
            key = keys[i]
            if type(key) is not bytes or len(key) < 4:
                _check_key(key)
            chunk = get(key)
            if chunk is None or chunk.ref_cnt < 0:
                return i - start
        return max(stop - start, 0)

    def get_load_source(self, key: OffloadKey, req_context: ReqContext) -> CacheHitSource:
        """Always ``CacheHitSource.HOST``: hits come from host memory."""
        _check_key(key)
        return CacheHitSource.HOST

    def prepare_load(self, keys: Collection[OffloadKey], req_context: ReqContext) -> CPULoadStoreSpec:
        """Pin readable keys for a load and note the access for the request.

        A key listed twice is pinned twice.

        Returns:
            The keys' chunks, in key order.

        Raises:
            AssertionError: a key is not resident or not readable yet, or the
                request already finished and a key is new to it (vLLM's
                messages); nothing is changed.
        """
        return self._prepare_load(keys, req_context, record_access=True)

    def _prepare_load(
        self, keys: Collection[OffloadKey], req_context: ReqContext, *, record_access: bool
    ) -> CPULoadStoreSpec:
        """``prepare_load``; with ``record_access=False`` only the pins (a pin-only read)."""
        keys = _check_keys(keys)
        if record_access:
            _check_context(req_context)
        get = self._policy.get
        chunks = []
        for key in keys:
            chunk = get(key)
            if chunk is None:
                raise AssertionError(f"Chunk {key!r} not found in cache")
            if chunk.ref_cnt < 0:
                raise AssertionError(f"Chunk {key!r} is not ready for reading")
            chunks.append(chunk)
        record = None
        if record_access:
            record = self._get_record(req_context, create=True)
            if record.finished:
                seen = record.seen
                for key in keys:
                    if key not in seen:
                        raise AssertionError(_FINALIZED)
        policy = self._policy
        for key, chunk in zip(keys, chunks):
            if chunk.ref_cnt == 0:
                policy.mark_non_evictable(key)
                self._num_evictable_cache_chunks -= 1
            chunk.ref_cnt += 1
        if record is not None:
            self._record(record, keys, keys, req_context)
        return _chunk_spec([chunk.chunk_id for chunk in chunks])

    def touch(self, keys: Collection[OffloadKey], req_context: ReqContext) -> None:
        """Tell the policy the keys were used (the first key ends most recent)."""
        keys = _check_keys(keys)
        self._policy.touch(keys, req_context)

    def complete_load(self, keys: Collection[OffloadKey], req_context: ReqContext) -> None:
        """Unpin keys pinned by ``prepare_load``; a key unpinned to 0 is evictable again.

        Raises:
            AssertionError: a key is not resident, or has no pin left to
                release (vLLM's messages); nothing is changed.
        """
        keys = _check_keys(keys)
        get = self._policy.get
        chunks = []
        released: dict[OffloadKey, int] = {}
        for key in keys:
            chunk = get(key)
            if chunk is None:
                raise AssertionError(f"Chunk {key!r} not found")
            done = released.get(key, 0)
            if chunk.ref_cnt - done <= 0:
                raise AssertionError(f"Chunk {key!r} ref_cnt is already 0")
            released[key] = done + 1
            chunks.append(chunk)
        policy = self._policy
        for key, chunk in zip(keys, chunks):
            chunk.ref_cnt -= 1
            if chunk.ref_cnt == 0:
                self._num_evictable_cache_chunks += 1
                policy.mark_evictable(key)

    def prepare_store(self, keys: Collection[OffloadKey], req_context: ReqContext) -> PrepareStoreOutput | None:
        """Reserve chunks for the offered keys that are not resident yet.

        Keys already readable are kept (and never evicted for this offer);
        keys being written are skipped.  With ``store_threshold >= 2`` a new
        key is stored only once offered that often.

        Args:
            keys: the offer, in prefix order, each key once.
            req_context: the offering request.

        Returns:
            The keys to write, their chunks and the keys evicted for them
            (an empty output when nothing needs writing), or ``None`` when
            not enough chunks can be evicted.

        Raises:
            ValueError: a key is offered twice.
            AssertionError: the request already finished and a key is new to
                it (vLLM's message); nothing is changed.
        """
        keys = _check_keys(keys)
        _check_context(req_context)
        if len(set(keys)) != len(keys):
            seen_once: set[OffloadKey] = set()
            for key in keys:
                if key in seen_once:
                    raise ValueError(f"prepare_store got key {key!r} more than once")
                seen_once.add(key)
        policy = self._policy
        get = policy.get
        counts = self.counts
        threshold = self.store_threshold
        new: list[OffloadKey] = []
        ready: list[OffloadKey] = []
        kept: set[OffloadKey] = set()
        for key in keys:
            chunk = get(key)
            if chunk is None:
                new.append(key)
                # After the tracker update a tracked key counts one more and an
                # untracked one at most 1, which is below any threshold >= 2.
                if counts is None or counts.get(key, 0) + 1 >= threshold:
                    kept.add(key)
            elif chunk.ref_cnt >= 0:
                ready.append(key)
        record = self._get_record(req_context, create=True)
        ready_set = set(ready)
        to_record = [key for key in keys if key in kept or key in ready_set]
        if record.finished:
            seen = record.seen
            for key in to_record:
                if key not in seen:
                    raise AssertionError(_FINALIZED)

        # 1. the offer tracker
        if counts is not None:
            self._update_tracker(keys)
            if len(kept) != len(new):
                self.stores_skipped_in_current_batch += len(new) - len(kept)
                new = [key for key in new if key in kept]
        # 2. the policy hears of each miss once per request
        store_missed = record.store_missed
        misses = [key for key in new if key not in store_missed]
        if misses:
            policy.on_store_miss(misses, req_context)
            store_missed.update(misses)
        # 3. the access record
        self._record(record, to_record, ready, req_context)
        if not new:
            return PrepareStoreOutput(keys_to_store=[], store_spec=_chunk_spec([]), evicted_keys=[])

        # 4. room: evict what the free chunks do not cover
        self.allocation_sizes_in_current_batch.append(len(new))
        need = len(new) - self._get_num_free_chunks()
        evicted_keys: list[OffloadKey] = []
        if need > 0:
            if need > self._num_evictable_cache_chunks:
                return None
            evicted = policy.evict(need, set(keys))
            if evicted is None:
                return None
            self._num_evictable_cache_chunks -= need
            free_list = self._free_list
            for key, chunk in evicted:
                free_list.append(chunk.chunk_id)
                evicted_keys.append(key)
            if self.events is not None:
                self.events.append(OffloadingEvent(keys=list(evicted_keys), medium=_CPU, removed=True))

        # 5. allocate: fresh chunks first, then freed ones, last freed first
        num_new = len(new)
        first = self._num_allocated_chunks
        num_fresh = min(num_new, self._num_chunks - first)
        chunk_ids = list(range(first, first + num_fresh))
        self._num_allocated_chunks = first + num_fresh
        free_list = self._free_list
        for _ in range(num_new - num_fresh):
            chunk_ids.append(free_list.pop())
        for key, chunk_id in zip(new, chunk_ids):
            policy.insert(key, ChunkStatus(chunk_id), req_context)
        self._num_write_pending_chunks += num_new
        record.inserted.update(new)
        return PrepareStoreOutput(keys_to_store=new, store_spec=_chunk_spec(chunk_ids), evicted_keys=evicted_keys)

    def _update_tracker(self, keys: list) -> None:
        """Count one offer: offered keys move to the newest end, new ones enter
        with count 1, evicting the oldest keys not in this offer while full."""
        counts = self.counts
        protected = 0
        for key in keys:
            count = counts.get(key)
            if count is not None:
                counts.move_to_end(key)
                counts[key] = count + 1
                protected += 1
        unprotected = len(counts) - protected
        limit = self.max_tracker_size
        for key in keys:
            if key in counts:
                continue
            if len(counts) >= limit:
                if unprotected == 0:
                    continue
                counts.popitem(last=False)
                unprotected -= 1
            counts[key] = 1

    def complete_store(self, keys: Collection[OffloadKey], req_context: ReqContext, success: bool = True) -> None:
        """Finish the writes of keys being written: readable on success, dropped on failure.

        Keys not being written (unknown, already readable, repeated) are ignored.
        """
        keys = _check_keys(keys)
        policy = self._policy
        get = policy.get
        done: list[OffloadKey] = []
        if success:
            for key in keys:
                chunk = get(key)
                if chunk is not None and chunk.ref_cnt < 0:
                    chunk.ref_cnt = 0
                    self._num_write_pending_chunks -= 1
                    self._num_evictable_cache_chunks += 1
                    policy.mark_evictable(key)
                    done.append(key)
        else:
            free_list = self._free_list
            for key in keys:
                chunk = get(key)
                if chunk is not None and chunk.ref_cnt < 0:
                    self._num_write_pending_chunks -= 1
                    policy.remove(key)
                    free_list.append(chunk.chunk_id)
                    done.append(key)
        if done and self.events is not None:
            if success:
                self.events.append(OffloadingEvent(keys=done, medium=_CPU, removed=False))
            else:
                self.events.append(OffloadingEvent(keys=done, medium=_CPU, removed=True, metadata_only=True))

    def on_new_request(self, req_context: ReqContext) -> RequestOffloadingContext:
        """Start the request's access record; every chunk is offloaded as computed."""
        _check_context(req_context)
        self._get_record(req_context, create=True)
        return RequestOffloadingContext()

    def on_request_finished(self, req_context: ReqContext) -> None:
        """Close the request's record and let the policy rank its keys.

        Nothing happens for a request with no record since the last reset,
        or one already finished.
        """
        _check_context(req_context)
        record = self._get_record(req_context, create=False)
        if record is None or record.finished:
            return
        record.finished = True
        get_position = req_context.get_offload_key_position
        groups = []
        for group in sorted(record.key_groups):
            members = record.key_groups[group]
            positions = [get_position(key) for key in members]
            if None not in positions:
                order = sorted(range(len(members)), key=positions.__getitem__)
                members = [members[i] for i in order]
            else:
                members = list(members)
            groups.append(members)
        self._policy.on_request_finished(groups, record.inserted - record.reused, set(record.reused), req_context)

    def take_events(self) -> Iterator[OffloadingEvent]:
        """Yield the queued events, oldest first (a generator).

        The queue is taken when iteration starts.  A failed store's event
        keeps only the keys still not resident, and is dropped if none are.
        """
        if self.events is None:
            return
        events, self.events = self.events, []
        get = self._policy.get
        for event in events:
            if event.metadata_only:
                keys = [key for key in event.keys if get(key) is None]
                if not keys:
                    continue
                if len(keys) != len(event.keys):
                    event.keys = keys
            yield event

    def on_schedule_end(self, context: Any) -> None:
        """Nothing to do at the end of a step."""
        return None

    def has_pending_work(self) -> bool:
        """Always ``False``: the CPU tier does no work of its own between steps."""
        return False

    def reset_cache(self) -> None:
        """Forget every chunk; chunk ids restart at 0.

        Queued events, the store tracker and the stats accumulators are kept.
        Requests' records from before the reset are abandoned.
        """
        self._policy.clear()
        self._generation += 1
        self._num_evictable_cache_chunks = 0
        self._num_write_pending_chunks = 0
        self._free_list.clear()
        self._num_allocated_chunks = 0

    def on_reset_flushed(self) -> None:
        """Nothing to do."""
        return None

    def get_stats(self) -> OffloadingConnectorStats:
        """Usage gauges, allocation sizes and skipped stores since the previous call."""
        stats = OffloadingConnectorStats()
        num_chunks = self._num_chunks
        used = self._num_allocated_chunks - len(self._free_list) - self._num_evictable_cache_chunks
        usage = used / num_chunks if num_chunks > 0 else 0.0
        stats.set_gauge(CPUOffloadingMetrics.CPU_CACHE_USAGE_PERC, usage)
        for size in self.allocation_sizes_in_current_batch:
            stats.observe_histogram(CPUOffloadingMetrics.CPU_ALLOCATION_SIZE, size)
        self.allocation_sizes_in_current_batch = []
        write_usage = self._num_write_pending_chunks / num_chunks if num_chunks > 0 else 0.0
        stats.set_gauge(CPUOffloadingMetrics.CPU_CACHE_WRITE_USAGE_PERC, write_usage)
        stats.set_gauge(CPUOffloadingMetrics.CPU_CACHE_READ_USAGE_PERC, max(usage - write_usage, 0.0))
        if self.store_threshold >= 2:
            stats.increase_counter(CPUOffloadingMetrics.STORES_SKIPPED, self.stores_skipped_in_current_batch)
            self.stores_skipped_in_current_batch = 0
        return stats

    def config_info(self) -> list[dict[str, Any]]:
        """``[dict(info)]``, or ``[{}]`` without info."""
        return [dict(self._info)] if self._info is not None else [{}]

    def shutdown(self) -> None:
        """Nothing to release."""
        return None
