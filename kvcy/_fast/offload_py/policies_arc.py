"""``ARCCachePolicy``: adaptive replacement with ghost lists
(``vllm.v1.kv_offload.cpu.policies.arc``)."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Collection, Iterator, Sequence

from kvcy._fast.offload_py._common import _check_key
from kvcy._fast.offload_py.policies_base import CachePolicy, _check_chunk, _check_evict_n, _key_seq
from kvcy._fast.offload_py.policies_base_chunk_status import ChunkStatus
from kvcy._fast.offload_py.policies_base_request_order import order_request_keys
from kvcy.kv_offload.base import OffloadKey, ReqContext


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
        """Drop a resident key, leaving no ghost (a key not resident: nothing happens)."""
        _check_key(key)
        if self.t1.pop(key, None) is None:
            self.t2.pop(key, None)

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
        insertion_only_keys: Collection[OffloadKey],
        reused_keys: Collection[OffloadKey],
        req_context: ReqContext,
    ) -> None:
        """Tail first: keys only stored become newest in their list; reused keys newest in t2."""
        t1 = self.t1
        t2 = self.t2
        for key in reversed(order_request_keys(key_groups, req_context)):
            if key in insertion_only_keys:
                if key in t1:
                    t1.move_to_end(key)
                elif key in t2:
                    t2.move_to_end(key)
            elif key in reused_keys:
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
