"""CPUOffloadingManager edge cases, from section 5.4-5.5 of shared/golden/README.md.

Pinning during loads, write-pending chunks, the store threshold, failed stores,
reset_cache, events and stats, and the two policies' orders; each case is
run against every available offloading twin.
"""

from __future__ import annotations

import pytest

from kvcy.kv_offload.base import LookupResult, ReqContext, make_offload_key
from kvcy.testing.golden import offload_check_state

USAGE = "vllm:kv_offload_cpu_cache_usage_perc"
ALLOC = "vllm:kv_offload_cpu_allocation_size"
WRITE = "vllm:kv_offload_cpu_cache_write_usage_perc"
READ = "vllm:kv_offload_cpu_cache_read_usage_perc"
SKIPPED = "vllm:kv_offload_stores_skipped"


def k(name: str, group: int = 0) -> bytes:
    return make_offload_key(name.encode(), group)


def ks(names: str) -> list[bytes]:
    return [k(n) for n in names.split()]


def stats(manager) -> dict:
    return {name: by_label[()] for name, by_label in manager.get_stats().data["data"].items()}


def stored(manager, names: str, ctx: ReqContext) -> list[int]:
    """Offer, then complete, a store of every key; return the chunk ids."""
    out = manager.prepare_store(ks(names), ctx)
    assert out is not None
    manager.complete_store(out.keys_to_store, ctx)
    return out.store_spec.block_ids.tolist()


def evict_one(manager, ctx: ReqContext, name: str) -> list[bytes] | None:
    out = manager.prepare_store([k(name)], ctx)
    return None if out is None else out.evicted_keys


@pytest.fixture(params=["lru", "arc"])
def policy(request) -> str:
    return request.param


@pytest.fixture
def ctx() -> ReqContext:
    return ReqContext(req_id="r")


# =============================================================================
# Pinning during loads
# =============================================================================
def test_a_pinned_chunk_is_not_evicted_until_its_last_load_completes(offload_impl, policy, ctx):
    m = offload_impl.CPUOffloadingManager(2, cache_policy=policy)
    stored(m, "a b", ctx)
    assert m.prepare_load(ks("a a"), ctx).block_ids.tolist() == [0, 0]  # pinned twice
    assert evict_one(m, ctx, "c") == ks("b")
    m.complete_store(ks("c"), ctx)
    m.prepare_load(ks("c"), ctx)
    assert m.prepare_store(ks("d"), ctx) is None  # a and c pinned
    m.complete_load(ks("a"), ctx)
    assert m.prepare_store(ks("d"), ctx) is None  # a still pinned once
    m.complete_load(ks("a"), ctx)
    assert evict_one(m, ctx, "d") == ks("a")
    assert m.lookup(k("c"), ctx) is LookupResult.HIT


def test_a_refused_store_still_counts_its_allocation_size(offload_impl, policy, ctx):
    m = offload_impl.CPUOffloadingManager(1, cache_policy=policy)
    stored(m, "a", ctx)
    m.prepare_load(ks("a"), ctx)
    stats(m)
    assert m.prepare_store(ks("b c"), ctx) is None
    got = stats(m)
    assert got[ALLOC] == [2]
    assert got[USAGE] == pytest.approx(1.0) and got[READ] == pytest.approx(1.0) and got[WRITE] == 0.0


def test_the_offer_itself_is_never_evicted(offload_impl, policy, ctx):
    """Readable keys of the offer are kept even when they are the only candidates."""
    m = offload_impl.CPUOffloadingManager(2, cache_policy=policy)
    stored(m, "a b", ctx)
    assert m.prepare_store(ks("a b c"), ctx) is None
    out = m.prepare_store(ks("b c"), ctx)
    assert out.keys_to_store == ks("c") and out.evicted_keys == ks("a")
    state = offload_check_state(m)
    assert (state["num_evictable"], state["num_write_pending"]) == (1, 1)  # b; c


# =============================================================================
# Write-pending chunks
# =============================================================================
def test_write_pending_chunks_are_not_read_stored_again_or_evicted(offload_impl, policy, ctx):
    m = offload_impl.CPUOffloadingManager(2, cache_policy=policy)
    out = m.prepare_store(ks("a"), ctx)
    assert out.keys_to_store == ks("a") and out.store_spec.block_ids.tolist() == [0]
    assert m.lookup(k("a"), ctx) is LookupResult.HIT_PENDING
    with pytest.raises(AssertionError, match="is not ready for reading"):
        m.prepare_load(ks("a"), ctx)
    again = m.prepare_store(ks("a"), ctx)  # in flight: neither stored again nor allocated
    assert again.keys_to_store == [] and again.evicted_keys == []
    stored(m, "b", ctx)
    assert m.prepare_store(ks("c d"), ctx) is None  # only b is evictable
    state = offload_check_state(m)
    assert state["num_write_pending"] == 1 and state["num_evictable"] == 1
    m.complete_store(ks("a"), ctx)
    assert m.lookup(k("a"), ctx) is LookupResult.HIT
    assert m.prepare_store(ks("c d"), ctx).evicted_keys != []


# =============================================================================
# Store threshold and the offer tracker
# =============================================================================
def test_a_new_key_is_stored_on_its_threshold_th_offer(offload_impl, policy, ctx):
    m = offload_impl.CPUOffloadingManager(4, cache_policy=policy, store_threshold=3)
    assert stats(m)[SKIPPED] == 0
    for _ in range(2):
        out = m.prepare_store(ks("a b"), ctx)
        assert out.keys_to_store == []
    assert stats(m)[SKIPPED] == 4
    out = m.prepare_store(ks("a b"), ctx)
    assert out.keys_to_store == ks("a b")
    assert stats(m)[SKIPPED] == 0
    assert offload_check_state(m)["tracker"] == [[k("a").hex(), 3], [k("b").hex(), 3]]


def test_stored_keys_bypass_the_threshold_but_are_counted(offload_impl, ctx):
    m = offload_impl.CPUOffloadingManager(4, store_threshold=2)
    m.prepare_store(ks("a"), ctx)
    stored(m, "a", ctx)
    out = m.prepare_store(ks("a"), ctx)
    assert out.keys_to_store == [] and m.lookup(k("a"), ctx) is LookupResult.HIT
    assert m.counts[k("a")] == 3


def test_a_full_tracker_drops_its_oldest_key_outside_the_offer(offload_impl, ctx):
    m = offload_impl.CPUOffloadingManager(4, store_threshold=2, max_tracker_size=2)
    m.prepare_store(ks("a"), ctx)
    m.prepare_store(ks("b"), ctx)
    m.prepare_store(ks("c"), ctx)  # a is dropped
    assert list(m.counts) == ks("b c")
    # b and c are offered again (protected); d finds the tracker full of them.
    m.prepare_store(ks("b c d"), ctx)
    assert dict(m.counts) == {k("b"): 2, k("c"): 2}
    m.prepare_store(ks("d"), ctx)  # b is the oldest outside this offer
    assert list(m.counts) == ks("c d")


def test_readable_keys_of_an_offer_stay_protected_under_the_threshold(offload_impl, ctx):
    m = offload_impl.CPUOffloadingManager(1, store_threshold=2)
    m.prepare_store(ks("x"), ctx)
    m.prepare_store(ks("x"), ctx)
    m.complete_store(ks("x"), ctx)
    m.prepare_store(ks("y"), ctx)
    # y reaches the threshold and needs x's chunk; x is in the offer, so no room.
    assert m.prepare_store(ks("x y"), ctx) is None
    assert m.prepare_store(ks("y"), ctx).evicted_keys == ks("x")


# =============================================================================
# Failed stores
# =============================================================================
def test_a_failed_store_frees_its_chunk_for_reuse(offload_impl, policy, ctx):
    m = offload_impl.CPUOffloadingManager(3, cache_policy=policy, enable_events=True)
    m.prepare_store(ks("a b c"), ctx)
    m.complete_store(ks("b a"), ctx, success=False)  # freed in call order: 1, then 0
    m.complete_store(ks("c"), ctx)
    state = offload_check_state(m)
    assert state["free_list"] == [1, 0] and state["num_write_pending"] == 0
    assert m.lookup(k("a"), ctx) is LookupResult.MISS
    out = m.prepare_store(ks("d e"), ctx)
    assert out.store_spec.block_ids.tolist() == [0, 1]  # last freed first
    events = list(m.take_events())
    assert [(e.keys, e.removed, e.metadata_only) for e in events] == [
        (ks("b a"), True, True),
        (ks("c"), False, False),
    ]


def test_a_failed_store_event_keeps_only_keys_still_missing_at_drain(offload_impl, policy, ctx):
    m = offload_impl.CPUOffloadingManager(4, cache_policy=policy, enable_events=True)
    m.prepare_store(ks("a b"), ctx)
    m.complete_store(ks("a b"), ctx, success=False)
    stored(m, "a", ctx)  # a is stored after all, before the drain
    events = list(m.take_events())
    assert [(e.keys, e.removed, e.metadata_only) for e in events] == [
        (ks("b"), True, True),
        (ks("a"), False, False),
    ]
    m.prepare_store(ks("c"), ctx)
    m.complete_store(ks("c"), ctx, success=False)
    stored(m, "c", ctx)
    assert [(e.keys, e.removed) for e in m.take_events()] == [(ks("c"), False)]


def test_arc_keeps_no_ghost_of_a_failed_store(offload_impl, ctx):
    m = offload_impl.CPUOffloadingManager(2, cache_policy="arc")
    m.prepare_store(ks("a"), ctx)
    m.complete_store(ks("a"), ctx, success=False)
    assert offload_check_state(m)["arc"] == {"t1": [], "t2": [], "b1": [], "b2": [], "target_t1_size": 0.0}


# =============================================================================
# reset_cache
# =============================================================================
def test_reset_cache_restarts_chunk_ids_and_keeps_events_tracker_and_stats(offload_impl, policy, ctx):
    m = offload_impl.CPUOffloadingManager(4, cache_policy=policy, enable_events=True, store_threshold=2)
    m.prepare_store(ks("a b"), ctx)
    m.prepare_store(ks("a b"), ctx)
    m.complete_store(ks("a"), ctx)
    m.prepare_load(ks("a"), ctx)
    m.reset_cache()
    state = offload_check_state(m)
    assert state["resident"] == [] and state["free_list"] == [] and state["num_allocated_chunks"] == 0
    assert state["num_evictable"] == 0 and state["num_write_pending"] == 0
    assert state["tracker"] == [[k("a").hex(), 2], [k("b").hex(), 2]]
    assert m.lookup(k("a"), ctx) is LookupResult.MISS
    # In-flight work from before the reset is forgotten: completing it is ignored.
    m.complete_store(ks("b"), ctx)
    with pytest.raises(AssertionError, match="not found"):
        m.complete_load(ks("a"), ctx)
    assert [(e.keys, e.removed) for e in m.take_events()] == [(ks("a"), False)]
    assert stats(m)[ALLOC] == [2]
    out = m.prepare_store(ks("c d"), ReqContext(req_id="s"))
    assert out.keys_to_store == [] and m.counts[k("c")] == 1  # new keys: counted once
    out = m.prepare_store(ks("a"), ReqContext(req_id="s"))
    assert out.store_spec.block_ids.tolist() == [0]


def test_reset_cache_abandons_finished_requests_records(offload_impl, policy, ctx):
    m = offload_impl.CPUOffloadingManager(4, cache_policy=policy)
    stored(m, "a", ctx)
    m.on_request_finished(ctx)
    with pytest.raises(AssertionError, match="finalization"):
        m.prepare_store(ks("b"), ctx)
    m.reset_cache()
    assert m.prepare_store(ks("b"), ctx).keys_to_store == ks("b")


# =============================================================================
# Events and stats
# =============================================================================
def test_take_events_is_a_generator_that_detaches_the_queue_when_started(offload_impl, ctx):
    m = offload_impl.CPUOffloadingManager(4, enable_events=True)
    m.prepare_store(ks("a"), ctx)
    pending = m.take_events()
    m.complete_store(ks("a"), ctx)  # queued before iteration starts: included
    first = next(pending)
    assert first.keys == ks("a") and not first.removed
    stored(m, "b", ctx)  # queued after the queue was taken: for the next call
    assert list(pending) == []
    assert [e.keys for e in m.take_events()] == [ks("b")]
    assert list(m.take_events()) == []


def test_events_disabled_yield_nothing(offload_impl, ctx):
    m = offload_impl.CPUOffloadingManager(1)
    stored(m, "a", ctx)
    evict_one(m, ctx, "b")
    assert list(m.take_events()) == []


def test_stats_report_and_clear(offload_impl, ctx):
    m = offload_impl.CPUOffloadingManager(4)
    assert stats(m) == {USAGE: 0.0, WRITE: 0.0, READ: 0.0}  # no histogram, no skipped counter
    stored(m, "a b", ctx)
    m.prepare_store(ks("c"), ctx)
    m.prepare_load(ks("a"), ctx)
    got = stats(m)
    assert got[ALLOC] == [2, 1]
    assert got[USAGE] == pytest.approx(0.5) and got[WRITE] == pytest.approx(0.25)
    assert got[READ] == pytest.approx(0.25)
    assert ALLOC not in stats(m)


def test_capacity_zero_stores_nothing(offload_impl, policy, ctx):
    m = offload_impl.CPUOffloadingManager(0, cache_policy=policy, enable_events=True)
    assert m.prepare_store(ks("a"), ctx) is None
    assert m.lookup(k("a"), ctx) is LookupResult.MISS
    assert stats(m) == {USAGE: 0.0, ALLOC: [1], WRITE: 0.0, READ: 0.0}
    assert list(m.take_events()) == []


# =============================================================================
# Policy order
# =============================================================================
def test_lru_evicts_a_requests_tail_before_its_head(offload_impl, ctx):
    m = offload_impl.CPUOffloadingManager(3)
    for i, name in enumerate("abc"):
        ctx.set_offload_key_position(k(name), 16 * (i + 1))
    stored(m, "a b c", ctx)
    other = ReqContext(req_id="o")
    assert evict_one(m, other, "x") == ks("c")
    m.complete_store(ks("x"), other)
    assert evict_one(m, other, "y") == ks("b")


def test_lru_touch_makes_the_first_key_most_recent(offload_impl, ctx):
    m = offload_impl.CPUOffloadingManager(3)
    stored(m, "a b c", ctx)  # no positions: fresh ranks in order
    m.touch(ks("a c"), ctx)
    assert offload_check_state(m)["lru_order"] == [1, 2, 0]  # b, then c, then a


def test_lru_finish_ranks_the_head_most_recent(offload_impl, ctx):
    m = offload_impl.CPUOffloadingManager(3)
    for i, name in enumerate("abc"):
        ctx.set_offload_key_position(k(name), 16 * (i + 1))
    stored(m, "a b c", ctx)
    m.touch(ks("c b a"), ctx)  # a oldest of the three now
    assert offload_check_state(m)["lru_order"] == [0, 1, 2]
    m.on_request_finished(ctx)
    assert offload_check_state(m)["lru_order"] == [2, 1, 0]
    m.on_request_finished(ctx)  # a second finish is a no-op
    assert offload_check_state(m)["lru_order"] == [2, 1, 0]


def test_pin_only_reads_do_not_record_the_request(offload_impl, ctx):
    m = offload_impl.CPUOffloadingManager(2)
    writer = ReqContext(req_id="w")
    stored(m, "a b", writer)
    m._prepare_load(ks("b"), ctx, record_access=False)
    m.complete_load(ks("b"), ctx)
    before = offload_check_state(m)["lru_order"]
    m.on_request_finished(ctx)  # ctx has no record: nothing happens
    assert offload_check_state(m)["lru_order"] == before
    assert m.prepare_load(ks("a"), ctx).block_ids.tolist() == [0]  # not finalized


def test_arc_touch_promotes_ready_keys_and_keeps_pending_ones_in_t1(offload_impl, ctx):
    m = offload_impl.CPUOffloadingManager(4, cache_policy="arc")
    stored(m, "a b", ctx)
    m.prepare_store(ks("c"), ctx)
    m.touch(ks("c a"), ctx)
    arc = offload_check_state(m)["arc"]
    assert arc["t1"] == [1, 2] and arc["t2"] == [0]


def test_arc_ghost_hits_move_the_target(offload_impl, ctx):
    m = offload_impl.CPUOffloadingManager(2, cache_policy="arc")
    stored(m, "a b", ctx)
    other = ReqContext(req_id="o")
    assert evict_one(m, other, "c") == ks("a")
    assert offload_check_state(m)["arc"]["b1"] == [k("a").hex()]
    m.prepare_store(ks("a"), ReqContext(req_id="p"))  # a store miss on a ghost of t1
    assert offload_check_state(m)["arc"]["target_t1_size"] == 1.0


def test_arc_ghosts_are_not_resident(offload_impl, ctx):
    # (the compiled twin keeps ghosts and resident keys in one map)
    m = offload_impl.CPUOffloadingManager(2, cache_policy="arc", enable_events=True)
    stored(m, "a b", ctx)
    assert evict_one(m, ReqContext(req_id="o"), "c") == ks("a")
    m.complete_store(ks("c"), ctx)
    policy = m._policy
    assert offload_check_state(m)["arc"]["b1"] == [k("a").hex()]
    assert m.lookup(k("a"), ctx) is LookupResult.MISS and m.count_hits(ks("a b"), ctx) == 0
    assert policy.get(k("a")) is None and list(policy.t1) == ks("b c")
    with pytest.raises(AssertionError, match="not found in cache"):
        m.prepare_load(ks("a"), ctx)
    m.complete_store(ks("a"), ctx)  # a ghost is not write-pending: ignored
    assert policy.remove(k("a")) is None  # a ghost is not resident: nothing to drop (as vLLM)
    assert offload_check_state(m)["arc"]["b1"] == [k("a").hex()]
    assert policy.evict(3, set()) is None  # 2 resident keys (and a ghost)
    list(m.take_events())
    m.prepare_store(ks("a"), ReqContext(req_id="p"))  # a ghost comes back: resident again, no ghost left
    state = offload_check_state(m)["arc"]
    assert state["b1"] == [ks("b")[0].hex()] and m.lookup(k("a"), ctx) is LookupResult.HIT_PENDING
    m.reset_cache()
    assert m.lookup(k("b"), ctx) is LookupResult.MISS and offload_check_state(m)["arc"]["b1"] == []


def test_arc_a_held_chunk_keeps_its_state_when_its_key_is_evicted_and_stored_again(offload_impl, ctx):
    # (the compiled twin turns an evicted chunk nothing else holds into its key's
    # ghost, and that ghost into the key's next chunk: never one Python holds)
    m = offload_impl.CPUOffloadingManager(2, cache_policy="arc")
    stored(m, "a b", ctx)
    held = m._policy.get(k("a"))
    assert evict_one(m, ReqContext(req_id="o"), "c") == ks("a")
    m.complete_store(ks("c"), ctx)
    assert evict_one(m, ReqContext(req_id="p"), "a") == ks("b")  # a ghost hit: "a" comes back
    again = m._policy.get(k("a"))
    assert again is not held and again.ref_cnt == -1 and again.chunk_id == 1
    assert (held.chunk_id, held.ref_cnt, held.is_ready) == (0, 0, True)
    m.complete_store(ks("a"), ctx)
    assert (held.chunk_id, held.ref_cnt) == (0, 0) and m.lookup(k("a"), ctx) is LookupResult.HIT


def test_arc_a_chunk_standing_as_a_ghost_cannot_be_given_to_a_policy(offload_impl, ctx):
    import gc

    m = offload_impl.CPUOffloadingManager(2, cache_policy="arc")
    stored(m, "a b", ctx)
    assert evict_one(m, ReqContext(req_id="o"), "c") == ks("a")
    # Only the compiled twin keeps an evicted chunk as its key's ghost; reach it
    # the only way Python can, through the cycle collector's view of the policy.
    maps = [r for r in gc.get_referents(m._policy) if isinstance(r, dict) and k("a") in r]
    ghosts = [r[k("a")] for r in maps if isinstance(r[k("a")], offload_impl.ChunkStatus)]
    if not ghosts:
        pytest.skip("this twin keeps no chunk as a ghost")
    other = offload_impl.LRUCachePolicy(4)
    with pytest.raises(ValueError, match="already holds a key of a cache policy"):
        other.insert(k("x"), ghosts[0], ctx)
    with pytest.raises(ValueError, match="already holds a key of a cache policy"):
        m._policy.insert(k("x"), ghosts[0], ctx)
    assert offload_check_state(m)["arc"]["b1"] == [k("a").hex()] and other.get(k("x")) is None


def test_lru_finish_ranks_the_keys_resident_now_whatever_happened_to_their_chunks(offload_impl, ctx):
    # (the compiled twin's record remembers each key's chunk for on_request_finished)
    m = offload_impl.CPUOffloadingManager(4, cache_policy="lru")
    keys = ks("a b c")
    ctx._offload_key_positions.update({key: 16 * (i + 1) for i, key in enumerate(keys)})
    m.on_new_request(ctx)
    m.complete_store(m.prepare_store(keys, ctx).keys_to_store, ctx)
    policy = m._policy
    [(key_a, chunk_a)] = policy.evict(1, set())  # the tail goes first: c
    assert key_a == k("c")
    other = type(policy)(cache_capacity=4)
    other.insert(key_a, chunk_a, ReqContext(req_id="o"))  # its chunk now lives in another policy
    stored(m, "c", ReqContext(req_id="x"))  # and c is stored again, in a new chunk
    m.on_request_finished(ctx)  # fresh ranks, tail first: c, b, a (the head ends most recent)
    assert [key for key, _ in policy.evict(3, set())] == ks("c b a")
    assert [key for key, _ in other.evict(1, set())] == [k("c")]  # the other policy is untouched


# =============================================================================
# count_hits: the connector's admission lookups as one call
# =============================================================================
def test_count_hits_counts_hits_up_to_the_first_miss_or_pending_key(offload_impl, policy, ctx):
    manager = offload_impl.CPUOffloadingManager(num_chunks=8, cache_policy=policy)
    stored(manager, "a b c", ctx)
    assert manager.prepare_store(ks("d"), ctx) is not None  # d: write-pending
    keys = ks("a b c d e")
    expected = []
    for start in range(len(keys) + 2):
        for stop in [None, *range(len(keys) + 2)]:
            n = 0
            for key in keys[start:stop]:
                if manager.lookup(key, ctx) is not LookupResult.HIT:
                    break
                n += 1
            expected.append(n)
    got = [manager.count_hits(keys, ctx, start, stop)
           for start in range(len(keys) + 2) for stop in [None, *range(len(keys) + 2)]]
    assert got == expected
    assert manager.count_hits(keys, ctx) == 3 and manager.count_hits(ks("e a"), ctx) == 0
    assert manager.count_hits(keys[:2], ctx, 0, 2) == 2 and manager.count_hits([], ctx) == 0
    manager.complete_store(ks("d"), ctx)
    assert manager.count_hits(keys, ctx) == 4


def test_a_req_context_subclass_keeps_the_request_state_through_its_own_methods(offload_impl, policy):
    # (the compiled twin reads a plain ReqContext's state dict directly; a
    # subclass may keep its state elsewhere)
    class Elsewhere(ReqContext):
        def set_state(self, val):
            self.__dict__.setdefault("kept", {})[type(val)] = val

        def get_state(self, cls):
            return self.__dict__.get("kept", {}).get(cls)

    manager = offload_impl.CPUOffloadingManager(num_chunks=4, cache_policy=policy)
    ctx = Elsewhere(req_id="r")
    ctx.set_offload_key_position(k("a"), 16)
    stored(manager, "a b", ctx)
    assert ctx._state == {} and len(ctx.kept) >= 1
    manager.on_request_finished(ctx)
    with pytest.raises(AssertionError, match="New cache keys observed after request finalization"):
        manager.prepare_store(ks("c"), ctx)  # the record, found through get_state, is finished


class _Key(bytes):
    """A bytes subclass whose hash is Python code (a key count_hits must still take)."""

    def __hash__(self):
        return bytes.__hash__(self)


def test_count_hits_over_long_lists_stops_where_per_key_lookups_stop(offload_impl, policy, ctx):
    # (the compiled twin reads keys ahead of the one it decides: what it reads
    # past the first miss must not count, and a key there is never checked)
    manager = offload_impl.CPUOffloadingManager(num_chunks=21, cache_policy=policy)
    names = [f"h{i}" for i in range(22)]
    stored(manager, " ".join(names[:20]), ctx)
    manager.prepare_store(ks("h20"), ctx)  # write-pending
    assert evict_one(manager, ReqContext(req_id="o"), "e1") is not None
    evicted = [name for name in names[:20] if manager.lookup(k(name), ctx) is LookupResult.MISS]
    hits = [name for name in names[:20] if manager.lookup(k(name), ctx) is LookupResult.HIT]
    assert len(evicted) == 1 and len(hits) == 19  # (ARC: a ghost now)
    odd = _Key(k(hits[3]))
    for cut in (0, 1, 7, 8, 9, 15, 16, 17, 19):
        for stopper in (k("missing"), k("h20"), k(evicted[0])):
            keys = [k(n) for n in hits[:cut]] + [stopper] + [k(n) for n in hits[cut:]] + ["not a key", b"ab"]
            assert manager.count_hits(keys, ctx) == cut
            if cut:
                assert manager.count_hits(keys, ctx, 1) == cut - 1
        with_odd = [k(n) for n in hits[:cut]] + [odd] + [k(n) for n in hits[cut:]]
        assert manager.count_hits(with_odd, ctx) == len(with_odd)
        with pytest.raises(TypeError, match="an offload key must be bytes, got str"):
            manager.count_hits([k(n) for n in hits[:cut]] + ["not a key"] + [k("missing")], ctx)
    assert manager.count_hits([k(n) for n in hits] * 3, ctx, 5, 50) == 45


def test_count_hits_checks_only_the_keys_it_looks_at(offload_impl, ctx):
    manager = offload_impl.CPUOffloadingManager(num_chunks=8)
    stored(manager, "a", ctx)
    assert manager.count_hits([k("x"), "not a key"], ctx) == 0  # stops at the miss first
    with pytest.raises(TypeError, match="an offload key must be bytes, got str"):
        manager.count_hits([k("a"), "not a key"], ctx)
    with pytest.raises(ValueError, match="a block hash plus a 4-byte group index"):
        manager.count_hits([k("a"), b"ab"], ctx)
    with pytest.raises(TypeError, match="keys must be a list of offload keys, got tuple"):
        manager.count_hits((k("a"),), ctx)
    with pytest.raises(TypeError, match="start must be an int, got float"):
        manager.count_hits([k("a")], ctx, 0.0)
    with pytest.raises(ValueError, match="stop must be non-negative, got -1"):
        manager.count_hits([k("a")], ctx, 0, -1)


def test_a_policy_insert_of_a_resident_key_replaces_its_chunk(offload_impl, policy, ctx):
    # (the compiled LRU cleared the old chunk's C field as a Python attribute: an
    # AttributeError after the old chunk was already unlinked, leaving it in the map)
    m = offload_impl.CPUOffloadingManager(4, cache_policy=policy)
    stored(m, "a b", ctx)
    pol = m._policy
    old, new = pol.get(k("a")), pol.get(k("b"))
    pol.remove(k("b"))
    pol.insert(k("a"), new, ctx)
    assert pol.get(k("a")) is new
    assert pol.evict(1, set()) == [(k("a"), new)]
    assert pol.evict(1, set()) is None
    other = type(pol)(cache_capacity=4)
    other.insert(k("b"), old, ctx)  # the replaced chunk is held by no policy now
    assert other.get(k("b")) is old


# =============================================================================
# Calls from callbacks and from threads; key positions a context gives
# =============================================================================
_BUSY = r"CPUOffloadingManager\.{}\(\) was called while another call into the same manager is running"


def _chunk_owners(manager) -> dict[int, list[str]]:
    """chunk id -> the keys resident (readable or being written) on it."""
    owners: dict[int, list[str]] = {}
    for key, chunk_id, _ in offload_check_state(manager)["resident"]:
        owners.setdefault(chunk_id, []).append(key)
    return owners


class _CallingBack(ReqContext):
    """A context whose first position read runs ``hook`` (a call back into a manager)."""

    hook = None

    def get_offload_key_position(self, key):
        hook, self.hook = self.hook, None
        if hook is not None:
            hook()
        return super().get_offload_key_position(key)


def test_a_callback_that_resets_the_manager_mid_store_is_refused(offload_impl, policy):
    # (a reset from inside prepare_store left its keys pending with no chunk
    # counted as allocated: the next store handed out the same chunks again)
    m = offload_impl.CPUOffloadingManager(8, cache_policy=policy)
    refused = []

    def reset():
        try:
            m.reset_cache()
        except RuntimeError as exc:
            refused.append(str(exc))

    hostile = _CallingBack(req_id="r")
    hostile.hook = reset
    first = m.prepare_store(ks("a b c d"), hostile)
    assert first is not None and first.store_spec.block_ids.tolist() == [0, 1, 2, 3]
    if policy == "lru":  # (the ARC policy reads no position while storing)
        assert len(refused) == 1
        assert refused[0].startswith("CPUOffloadingManager.reset_cache() was called while another call")
    second = m.prepare_store(ks("e f g h"), ReqContext(req_id="s"))
    assert second.store_spec.block_ids.tolist() == [4, 5, 6, 7]
    assert all(len(keys) == 1 for keys in _chunk_owners(m).values())  # never two keys on one chunk
    assert offload_check_state(m)["num_write_pending"] == 8


def test_a_refused_call_back_that_propagates_leaves_the_manager_as_it_was(offload_impl, ctx):
    m = offload_impl.CPUOffloadingManager(4, cache_policy="lru")
    stored(m, "a", ctx)
    before = offload_check_state(m)
    hostile = _CallingBack(req_id="r")
    hostile.hook = m.reset_cache
    with pytest.raises(RuntimeError, match=_BUSY.format("reset_cache")):
        m.prepare_store(ks("b c"), hostile)
    assert offload_check_state(m) == before
    assert m.prepare_store(ks("b c"), ctx).store_spec.block_ids.tolist() == [1, 2]


@pytest.mark.parametrize("call", [
    "prepare_store", "complete_store", "prepare_load", "complete_load", "touch",
    "on_new_request", "on_request_finished", "reset_cache", "get_stats", "take_events",
])
def test_every_state_changing_call_is_refused_from_a_callback(offload_impl, call, ctx):
    m = offload_impl.CPUOffloadingManager(4, cache_policy="lru", enable_events=True)
    stored(m, "a", ctx)
    other = ReqContext(req_id="o")
    calls = {
        "prepare_store": lambda: m.prepare_store(ks("z"), other),
        "complete_store": lambda: m.complete_store(ks("a"), other),
        "prepare_load": lambda: m.prepare_load(ks("a"), other),
        "complete_load": lambda: m.complete_load(ks("a"), other),
        "touch": lambda: m.touch(ks("a"), other),
        "on_new_request": lambda: m.on_new_request(other),
        "on_request_finished": lambda: m.on_request_finished(other),
        "reset_cache": m.reset_cache,
        "get_stats": m.get_stats,
        "take_events": lambda: list(m.take_events()),
    }
    seen = []

    def hook():
        # reading calls are not refused (they change nothing)
        seen.append((m.lookup(k("a"), other), m.count_hits(ks("a"), other)))
        with pytest.raises(RuntimeError, match=_BUSY.format(call)):
            calls[call]()

    hostile = _CallingBack(req_id="r")
    hostile.hook = hook
    before = offload_check_state(m)
    assert m.prepare_store(ks("b"), hostile).keys_to_store == ks("b")
    assert seen == [(LookupResult.HIT, 1)]
    after = offload_check_state(m)
    assert after["resident"] == before["resident"] + [[k("b").hex(), 1, -1]]
    if call == "complete_load":
        m.prepare_load(ks("a"), other)
    calls[call]()  # and outside a call it runs


@pytest.mark.parametrize("bad", ["7", 1.5, True])
def test_a_key_position_that_is_not_an_int_is_refused_before_anything_changes(offload_impl, policy, bad):
    # (the pure twin stored the key and failed later on '<' or unary -; both twins
    # had allocated chunks by then, and a refused on_request_finished had already
    # closed the request)
    class Positions(ReqContext):
        answer = bad

        def get_offload_key_position(self, key):
            return self.answer if key == k("b") else 16

    m = offload_impl.CPUOffloadingManager(4, cache_policy=policy)
    ctx = Positions(req_id="r")
    message = f"a key position must be an int, got {type(bad).__name__}"
    before = offload_check_state(m)
    if policy == "lru":  # (the ARC policy reads no position while storing)
        with pytest.raises(TypeError, match=message):
            m.prepare_store(ks("a b c"), ctx)
        assert offload_check_state(m) == before
        ctx.answer = 32
    stored(m, "a b c", ctx)
    ctx.answer = bad
    with pytest.raises(TypeError, match=message):
        m.on_request_finished(ctx)
    ctx.answer = 32
    stored(m, "d", ctx)  # the refused call left the request open
    m.on_request_finished(ctx)
    with pytest.raises(AssertionError, match="New cache keys observed after request finalization"):
        m.prepare_store(ks("e"), ctx)
    assert offload_check_state(m)["num_allocated_chunks"] == 4


def test_order_request_keys_refuses_a_position_that_is_not_an_int(offload_impl):
    class Positions(ReqContext):
        def get_offload_key_position(self, key):
            return 2.5

    with pytest.raises(TypeError, match="a key position must be an int, got float"):
        offload_impl.order_request_keys([ks("a b")], Positions(req_id="r"))


class _Subclassed(ReqContext):
    """A context whose positions come through Python code (a thread may switch there)."""

    def get_offload_key_position(self, key):
        return super().get_offload_key_position(key)


@pytest.mark.parametrize("context", [ReqContext, _Subclassed], ids=["plain", "subclassed"])
def test_a_manager_shared_by_threads_refuses_concurrent_calls_and_loses_no_chunk(offload_impl, policy, context):
    # (threads sharing the pure twin's manager, unlocked, lost about a third of
    # its chunks: each call now enters alone or is refused with nothing changed)
    import random
    import sys
    import threading

    m = offload_impl.CPUOffloadingManager(32, cache_policy=policy)
    names = [f"k{i}" for i in range(120)]
    refused = [0]

    def call(fn, *args):
        while True:
            try:
                return fn(*args)
            except RuntimeError as exc:
                assert "was called while another call into the same manager is running" in str(exc)
                refused[0] += 1

    errors = []

    def worker(seed):
        try:
            work(seed)
        except BaseException as exc:  # (a thread's exception would pass unseen)
            errors.append(exc)

    def work(seed):
        rng = random.Random(seed)
        for i in range(250):
            ctx = context(req_id=f"{seed}-{i}")
            call(m.on_new_request, ctx)
            offer = [k(n) for n in rng.sample(names, 6)]
            for position, key in enumerate(offer):
                ctx.set_offload_key_position(key, 16 * (position + 1))
            out = call(m.prepare_store, offer, ctx)
            if out is not None:
                call(m.complete_store, out.keys_to_store, ctx)
            hits = [key for key in offer if m.lookup(key, ctx) is LookupResult.HIT]
            try:
                call(m.prepare_load, hits, ctx)
            except AssertionError:
                hits = []  # evicted or reset meanwhile: nothing pinned
            call(m.complete_load, hits, ctx)
            call(m.on_request_finished, ctx)

    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        threads = [threading.Thread(target=worker, args=(seed,)) for seed in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        sys.setswitchinterval(interval)
    assert errors == []
    state = offload_check_state(m)
    resident = state["resident"]
    assert state["num_write_pending"] == 0 and all(ref == 0 for _, _, ref in resident)
    assert len({chunk for _, chunk, _ in resident}) == len(resident)
    assert len(resident) + len(state["free_list"]) == state["num_allocated_chunks"]  # no chunk lost
    assert state["num_evictable"] == len(resident)
