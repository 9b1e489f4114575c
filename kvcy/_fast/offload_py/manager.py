"""``CPUOffloadingManager``: the CPU tier's scheduler-side manager
(``vllm.v1.kv_offload.cpu.manager``); its per-request records are in ``manager_access_record``."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Collection, Iterator
from dataclasses import replace
from typing import Any

from kvcy._fast.offload_py._common import (
    _CPU,
    _HIT,
    _HIT_PENDING,
    _MISS,
    _api_types,
    _check_context,
    _check_int,
    _check_key,
    _check_keys,
    _check_position,
    _chunk_spec_as,
    _owner_ids,
    _positions_of,
)
from kvcy._fast.offload_py.manager_access_record import _AccessRecord, _AccessRecords
from kvcy._fast.offload_py.policies_arc import ARCCachePolicy
from kvcy._fast.offload_py.policies_base import CachePolicy
from kvcy._fast.offload_py.policies_base_chunk_status import ChunkStatus
from kvcy._fast.offload_py.policies_lru import LRUCachePolicy
from kvcy.kv_offload.base import (
    CacheHitSource,
    ConfigInfo,
    LookupResult,
    Medium,
    OffloadingEvent,
    OffloadingManager,
    OffloadKey,
    PrepareStoreOutput,
    ReqContext,
    RequestOffloadingContext,
)
from kvcy.kv_offload._cpu_common import CPULoadStoreSpec, CPUOffloadingInfo, CPUOffloadingMetrics
from kvcy.kv_offload.metrics import OffloadingConnectorStats


#: The policies every manager knows without the factory.
_BUILTIN_POLICIES: dict[str, type[CachePolicy]] = {"lru": LRUCachePolicy, "arc": ARCCachePolicy}


_FINALIZED = "New cache keys observed after request finalization"

# A manager's state is consistent only between its calls, so a call that
# enters while another is running is refused before it changes anything.
_BUSY = (
    "CPUOffloadingManager.{}() was called while another call into the same manager is running: "
    "from one of that call's callbacks (a ReqContext's or a cache policy's method), or from another "
    "thread (threads sharing a manager hold manager.lock around each call)"
)


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
        info: a ``CPUOffloadingInfo`` (any ``ConfigInfo``), whose labels
            ``config_info()`` reports; kvcy also takes a plain dict of labels.

    Raises:
        TypeError: an argument has the wrong type.
        ValueError: a negative size or threshold, or an unknown policy name.
    """

    # What results are made of: kvcy.kv_offload's classes, or another API's with
    # the same shapes (vLLM's, when the manager serves vLLM's connector).
    _r_miss: Any = _MISS
    _r_hit: Any = _HIT
    _r_pending: Any = _HIT_PENDING
    _r_cpu: Any = _CPU
    _r_host: Any = CacheHitSource.HOST
    _r_event: Any = OffloadingEvent
    _r_store: Any = PrepareStoreOutput
    _r_spec: Any = None
    _r_stats: Any = OffloadingConnectorStats
    _r_octx: Any = RequestOffloadingContext

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
        if info is None:
            labels = {}
        elif isinstance(info, ConfigInfo) or hasattr(info, "as_config_info"):  # (vLLM's CPUOffloadingInfo too)
            labels = info.as_config_info()
        elif isinstance(info, dict):
            labels = dict(info)
        else:
            raise TypeError(
                f"info must be a CPUOffloadingInfo (a ConfigInfo), a dict of labels or None, got {type(info).__name__}"
            )
        policy_cls = _BUILTIN_POLICIES.get(cache_policy)  # (registered names first, as vLLM)
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
        self._info = labels
        self._generation = 0
        self._owner = next(_owner_ids)
        # The entry token: each guarded call pops it (atomically) and puts it
        # back, so an entry during a call finds the list empty.
        self._entry: list[None] = [None]

    # ------------------------------------------------------------------ records
    def _get_record(self, req_context: ReqContext, create: bool) -> _AccessRecord | None:
        records = req_context.get_state(_AccessRecords)
        if records is None:
            if not create:
                return None
            records = _AccessRecords()
            req_context.set_state(records)
        elif type(records) is not _AccessRecords:  # (a ReqContext of another kind: the C twin's check)
            raise TypeError(f"req_context.get_state(_AccessRecords) returned {type(records).__name__}, not the _AccessRecords set on it")
        record = records.get(self._owner)
        if record is None or record.generation != self._generation:
            if not create:
                return None
            record = _AccessRecord(self._generation)
            records.clear()  # one record per context, as vLLM: another manager's is replaced
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

    @staticmethod
    def _check_positions(keys: list, req_context: ReqContext) -> None:
        """Read the positions the LRU policy will read while it changes its state,
        so that a bad one (or a context method that fails, or that calls back
        into this manager) is refused before anything changes.  (kvcy's own
        ReqContext checks positions when they are set.)"""
        get_position = req_context.get_offload_key_position
        for key in keys:
            position = get_position(key)
            if position is not None and type(position) is not int:
                _check_position(position)

    # ------------------------------------------------------------------ chunk pool
    def _get_num_free_chunks(self) -> int:
        return len(self._free_list) + self._num_chunks - self._num_allocated_chunks

    def _use_api_types(self, *, LookupResult: Any, Medium: Any, CacheHitSource: Any, OffloadingEvent: Any,
                       PrepareStoreOutput: Any, CPULoadStoreSpec: Any, OffloadingConnectorStats: Any,
                       RequestOffloadingContext: Any, ReqContext: Any = None) -> None:
        """Make results of another API's classes of the same shapes (vLLM's: its connector
        compares and asserts its own); decisions do not change.  See ``_api_types``."""
        (self._r_miss, self._r_hit, self._r_pending, self._r_cpu, self._r_host, self._r_event,
         self._r_store, self._r_spec, self._r_stats, self._r_octx) = _api_types(
            LookupResult, Medium, CacheHitSource, OffloadingEvent, PrepareStoreOutput,
            CPULoadStoreSpec, OffloadingConnectorStats, RequestOffloadingContext, ReqContext)
        self.medium = self._r_cpu

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
            return self._r_miss
        return self._r_hit if chunk.ref_cnt >= 0 else self._r_pending

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
        return self._r_host

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
        entry = self._entry
        try:
            entry.pop()
        except IndexError:
            raise RuntimeError(_BUSY.format("prepare_load")) from None
        try:
            return self._prepare_load(keys, req_context, record_access=True)
        finally:
            entry.append(None)

    def _prepare_load(
        self, keys: Collection[OffloadKey], req_context: ReqContext, *, record_access: bool
    ) -> CPULoadStoreSpec:
        """``prepare_load``; with ``record_access=False`` only the pins (a pin-only read)."""
        # (vLLM reads ``keys`` again to record them: an iterator is spent by then, so
        # the request's record notes none of them)
        one_pass = type(keys) is not list and isinstance(keys, Iterator)
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
            if record.finished and not one_pass:
                seen = record.seen
                for key in keys:
                    if key not in seen:
                        raise AssertionError(_FINALIZED)
            if type(self._policy) is LRUCachePolicy and type(req_context) is not ReqContext and not one_pass:
                self._check_positions(keys, req_context)
        policy = self._policy
        for key, chunk in zip(keys, chunks):
            if chunk.ref_cnt == 0:
                policy.mark_non_evictable(key)
                self._num_evictable_cache_chunks -= 1
            chunk.ref_cnt += 1
        if record is not None and not one_pass:
            self._record(record, keys, keys, req_context)
        return _chunk_spec_as(self._r_spec, [chunk.chunk_id for chunk in chunks])

    def touch(self, keys: Collection[OffloadKey], req_context: ReqContext) -> None:
        """Tell the policy the keys were used (the first key ends most recent)."""
        entry = self._entry
        try:
            entry.pop()
        except IndexError:
            raise RuntimeError(_BUSY.format("touch")) from None
        try:
            self._policy.touch(_check_keys(keys), req_context)
        finally:
            entry.append(None)

    def complete_load(self, keys: Collection[OffloadKey], req_context: ReqContext) -> None:
        """Unpin keys pinned by ``prepare_load``; a key unpinned to 0 is evictable again.

        Raises:
            AssertionError: a key is not resident, or has no pin left to
                release (vLLM's messages); nothing is changed.
        """
        entry = self._entry
        try:
            entry.pop()
        except IndexError:
            raise RuntimeError(_BUSY.format("complete_load")) from None
        try:
            return self._complete_load(keys, req_context)
        finally:
            entry.append(None)

    def _complete_load(self, keys: Collection[OffloadKey], req_context: ReqContext) -> None:
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
            keys: the offer, in prefix order.  A key offered twice counts
                twice in the tracker, and is otherwise taken once.
            req_context: the offering request.

        Returns:
            The keys to write, their chunks and the keys evicted for them
            (an empty output when nothing needs writing), or ``None`` when
            not enough chunks can be evicted.

        Raises:
            ValueError: a key offered twice would be stored (vLLM would store
                it in two chunks and lose one).
            AssertionError: the request already finished and a key is new to
                it (vLLM's message); nothing is changed.
        """
        entry = self._entry
        try:
            entry.pop()
        except IndexError:
            raise RuntimeError(_BUSY.format("prepare_store")) from None
        try:
            return self._prepare_store(keys, req_context)
        finally:
            entry.append(None)

    def _prepare_store(self, keys: Collection[OffloadKey], req_context: ReqContext) -> PrepareStoreOutput | None:
        keys = _check_keys(keys)
        _check_context(req_context)
        policy = self._policy
        offer = keys
        stored_twice: list[OffloadKey] = []
        extra_skipped = extra_stored = 0
        if len(set(keys)) != len(keys):
            keys, stored_twice, extra_stored, extra_skipped = self._drop_repeats(offer)
        new, ready, kept = self._classify_offer(keys, stored_twice)
        record = self._get_record(req_context, create=True)
        ready_set = set(ready)
        to_record = [key for key in keys if key in kept or key in ready_set]
        self._check_offer(record, to_record, ready, kept, stored_twice, extra_stored)
        if type(policy) is LRUCachePolicy and type(req_context) is not ReqContext:
            self._check_positions(to_record, req_context)

        # 1. the offer tracker (every occurrence counts)
        if self.counts is not None:
            new = self._track_offer(offer, offer is not keys, new, kept, extra_skipped)
        # 2. the policy hears of each miss once per request
        self._note_store_misses(record, offer, new, kept, stored_twice, req_context)
        # 3. the access record
        self._record(record, to_record, ready, req_context)
        if stored_twice:  # (vLLM's eviction fails)
            self.allocation_sizes_in_current_batch.append(len(new) + extra_stored)
            return None
        if not new:
            return self._r_store(keys_to_store=[], store_spec=_chunk_spec_as(self._r_spec, []), evicted_keys=[])
        # 4. room: evict what the free chunks do not cover
        self.allocation_sizes_in_current_batch.append(len(new))
        evicted_keys = self._evict_for_store(len(new), keys)
        if evicted_keys is None:
            return None
        # 5. allocate: fresh chunks first, then freed ones, last freed first
        chunk_ids = self._allocate_chunks(new, req_context)
        record.inserted.update(new)
        return self._r_store(keys_to_store=new, store_spec=_chunk_spec_as(self._r_spec, chunk_ids), evicted_keys=evicted_keys)

    # -- prepare_store's phases ------------------------------------------------
    def _drop_repeats(self, full_offer: list) -> tuple[list, list, int, int]:
        """The offer without its repeats, first occurrence first.

        A repeat changes only the tracker counts and the skip count, unless
        vLLM would store the key twice (two chunks, one of them lost): such
        keys are returned as ``stored_twice`` (the offer is refused later),
        their extra occurrences counted in ``extra_stored``; the other
        repeats of keys to store count in ``extra_skipped``.

        Returns:
            ``(offer, stored_twice, extra_stored, extra_skipped)``.
        """
        counts = self.counts
        get = self._policy.get
        stored_twice: list[OffloadKey] = []
        extra_skipped = extra_stored = 0
        occurrences: dict[OffloadKey, int] = {}
        for key in full_offer:
            occurrences[key] = occurrences.get(key, 0) + 1
        offer = list(occurrences)
        for key, occ in occurrences.items():
            if occ > 1 and get(key) is None:
                if counts is None or (key in counts and counts[key] + occ >= self.store_threshold):
                    stored_twice.append(key)
                    extra_stored += occ - 1
                else:
                    extra_skipped += occ - 1
        return offer, stored_twice, extra_stored, extra_skipped

    def _classify_offer(self, offer: list, stored_twice: list) -> tuple[list, list, set]:
        """Look each offered key up once.

        Returns:
            ``(new, ready, kept)``: the keys not resident, the readable ones,
            and the new keys the store tracker will let through (all of them
            without a tracker).
        """
        get = self._policy.get
        counts = self.counts
        threshold = self.store_threshold
        new: list[OffloadKey] = []
        ready: list[OffloadKey] = []
        kept: set[OffloadKey] = set()
        for key in offer:
            chunk = get(key)
            if chunk is None:
                new.append(key)
                # After the tracker update a tracked key counts one more and an
                # untracked one at most 1, which is below any threshold >= 2.
                if counts is None or counts.get(key, 0) + 1 >= threshold or key in stored_twice:
                    kept.add(key)
            elif chunk.ref_cnt >= 0:
                ready.append(key)
        return new, ready, kept

    def _check_offer(self, record: _AccessRecord, to_record: list, ready: list, kept: set,
                     stored_twice: list, extra_stored: int) -> None:
        """Refuse, before anything changes, an offer vLLM refuses (a finished
        request's new key) or would get wrong (a key stored twice)."""
        if record.finished:
            seen = record.seen
            for key in to_record:
                if key not in seen:
                    raise AssertionError(_FINALIZED)
        if stored_twice:
            # vLLM allocates (and loses a chunk) unless its eviction fails first
            get = self._policy.get
            need = len(kept) + extra_stored - self._get_num_free_chunks()
            evictable = self._num_evictable_cache_chunks
            offered_evictable = sum(1 for key in ready if get(key).ref_cnt == 0)
            if need <= 0 or (need <= evictable and evictable - offered_evictable >= need):
                raise ValueError(f"prepare_store got key {stored_twice[0]!r} more than once")

    def _track_offer(self, full_offer: list, repeated: bool, new: list, kept: set, extra_skipped: int) -> list:
        """Phase 1: count the offer in the tracker (every occurrence counts).

        Returns:
            The new keys it lets through: ``new`` itself when that is all of
            them, else a new list (the others count as skipped stores).
        """
        self._update_tracker(full_offer, repeated)
        if len(kept) == len(new):
            return new
        self.stores_skipped_in_current_batch += len(new) - len(kept) + extra_skipped
        return [key for key in new if key in kept]

    def _note_store_misses(self, record: _AccessRecord, full_offer: list, new: list, kept: set,
                           stored_twice: list, req_context: ReqContext) -> None:
        """Phase 2: the policy hears of each store miss once per request."""
        store_missed = record.store_missed
        if stored_twice:
            # (vLLM's eviction will fail: before that it tells the policy of every
            # occurrence of a repeated miss, e.g. two ARC ghost hits)
            misses = [key for key in full_offer if key in kept and key not in store_missed]
        else:
            misses = [key for key in new if key not in store_missed]
        if misses:
            self._policy.on_store_miss(misses, req_context)
            store_missed.update(misses)

    def _evict_for_store(self, num_new: int, offer: list) -> list[OffloadKey] | None:
        """Phase 4: evict what the free chunks do not cover for ``num_new`` new
        keys, never a key of the offer.

        Returns:
            The evicted keys (empty when the free chunks suffice), or
            ``None`` when not enough chunks can be evicted.
        """
        need = num_new - self._get_num_free_chunks()
        evicted_keys: list[OffloadKey] = []
        if need <= 0:
            return evicted_keys
        if need > self._num_evictable_cache_chunks:
            return None
        evicted = self._policy.evict(need, set(offer))
        if evicted is None:
            return None
        self._num_evictable_cache_chunks -= need
        free_list = self._free_list
        for key, chunk in evicted:
            free_list.append(chunk.chunk_id)
            evicted_keys.append(key)
        if self.events is not None:
            self.events.append(self._r_event(keys=list(evicted_keys), medium=self._r_cpu, removed=True))
        return evicted_keys

    def _allocate_chunks(self, new: list, req_context: ReqContext) -> list[int]:
        """Phase 5: give the new keys chunks (fresh ones first, then freed
        ones, last freed first) and insert them write-pending.

        Returns:
            The chunk ids, in key order.
        """
        num_new = len(new)
        first = self._num_allocated_chunks
        num_fresh = min(num_new, self._num_chunks - first)
        chunk_ids = list(range(first, first + num_fresh))
        self._num_allocated_chunks = first + num_fresh
        free_list = self._free_list
        for _ in range(num_new - num_fresh):
            chunk_ids.append(free_list.pop())
        insert = self._policy.insert
        for key, chunk_id in zip(new, chunk_ids):
            insert(key, ChunkStatus(chunk_id), req_context)
        self._num_write_pending_chunks += num_new
        return chunk_ids

    def _update_tracker(self, keys: list, repeated: bool = False) -> None:
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
        if repeated and protected > 1:
            protected = len({key for key in keys if key in counts})  # each protected key once
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
        entry = self._entry
        try:
            entry.pop()
        except IndexError:
            raise RuntimeError(_BUSY.format("complete_store")) from None
        try:
            return self._complete_store(keys, req_context, success)
        finally:
            entry.append(None)

    def _complete_store(self, keys: Collection[OffloadKey], req_context: ReqContext, success: bool) -> None:
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
                self.events.append(self._r_event(keys=done, medium=self._r_cpu, removed=False))
            else:
                self.events.append(self._r_event(keys=done, medium=self._r_cpu, removed=True, metadata_only=True))

    def on_new_request(self, req_context: ReqContext) -> RequestOffloadingContext:
        """Start the request's access record; every chunk is offloaded as computed."""
        entry = self._entry
        try:
            entry.pop()
        except IndexError:
            raise RuntimeError(_BUSY.format("on_new_request")) from None
        try:
            _check_context(req_context)
            self._get_record(req_context, create=True)
        finally:
            entry.append(None)
        return self._r_octx()

    def on_request_finished(self, req_context: ReqContext) -> None:
        """Close the request's record and let the policy rank its keys.

        Nothing happens for a request with no record since the last reset,
        or one already finished.
        """
        entry = self._entry
        try:
            entry.pop()
        except IndexError:
            raise RuntimeError(_BUSY.format("on_request_finished")) from None
        try:
            return self._on_request_finished(req_context)
        finally:
            entry.append(None)

    def _on_request_finished(self, req_context: ReqContext) -> None:
        _check_context(req_context)
        record = self._get_record(req_context, create=False)
        if record is None or record.finished:
            return
        groups = []
        for group in sorted(record.key_groups):
            members = record.key_groups[group]
            positions = _positions_of(members, req_context)
            if positions is not None:
                order = sorted(range(len(members)), key=positions.__getitem__)
                members = [members[i] for i in order]
            else:
                members = list(members)
            groups.append(members)
        # (only once every position read is valid: a refused call leaves the
        # request open, so that it can be finished again)
        record.finished = True
        self._policy.on_request_finished(groups, record.inserted - record.reused, set(record.reused), req_context)

    def take_events(self) -> Iterator[OffloadingEvent]:
        """Yield the queued events, oldest first (a generator).

        The queue is taken when iteration starts.  A failed store's event
        keeps only the keys still not resident, and is dropped if none are.
        """
        if self.events is None:
            return
        entry = self._entry
        try:
            entry.pop()
        except IndexError:
            raise RuntimeError(_BUSY.format("take_events")) from None
        events, self.events = self.events, []
        entry.append(None)
        get = self._policy.get
        for event in events:
            if event.metadata_only:
                keys = [key for key in event.keys if get(key) is None]
                if not keys:
                    continue
                event = replace(event, keys=keys)  # (a copy, as vLLM: the queued one is left alone)
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
        entry = self._entry
        try:
            entry.pop()
        except IndexError:
            raise RuntimeError(_BUSY.format("reset_cache")) from None
        try:
            self._policy.clear()
            self._generation += 1
            self._num_evictable_cache_chunks = 0
            self._num_write_pending_chunks = 0
            self._free_list.clear()
            self._num_allocated_chunks = 0
        finally:
            entry.append(None)

    def on_reset_flushed(self) -> None:
        """Nothing to do."""
        return None

    def get_stats(self) -> OffloadingConnectorStats:
        """Usage gauges, allocation sizes and skipped stores since the previous call."""
        entry = self._entry
        try:
            entry.pop()
        except IndexError:
            raise RuntimeError(_BUSY.format("get_stats")) from None
        try:
            return self._get_stats()
        finally:
            entry.append(None)

    def _get_stats(self) -> OffloadingConnectorStats:
        stats = self._r_stats()
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
        """``[info.as_config_info()]`` (the same mapping every call), or ``[{}]`` without info."""
        return [self._info]

    def shutdown(self) -> None:
        """Nothing to release."""
        return None
