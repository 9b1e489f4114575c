"""A policy's key map under churn: growth, deletions, keys that are not exact bytes.

The compiled twin keeps each native policy's map twice: the dict that owns
the keys and an open-addressing index that the hot lookups probe.  These
cases drive both twins through what stresses such a table (many keys, many
evictions leaving deleted slots, key objects dropped by their callers, keys
that are bytes subclasses, str or int) and require the same answers from
both, and the answers a dict of the resident keys gives.
"""

from __future__ import annotations

import gc
import random

import pytest

from kvcy.kv_offload.base import LookupResult, ReqContext, make_offload_key


def k(i: int, tag: str = "k") -> bytes:
    # (a fresh bytes object on every call: the map must compare contents)
    return make_offload_key(f"{tag}{i}".encode().rjust(32, b"#"), 0)


class _SubKey(bytes):
    """A bytes subclass with bytes' own hash and equality."""


@pytest.fixture(params=["lru", "arc"])
def policy(request) -> str:
    return request.param


def _store(manager, keys: list[bytes], ctx: ReqContext) -> list[bytes] | None:
    out = manager.prepare_store(keys, ctx)
    if out is None:
        return None
    manager.complete_store(out.keys_to_store, ctx)
    return list(out.evicted_keys)


def _churn(offload_impl, policy: str, seed: int) -> list:
    """Stores, hits and evictions over a small cache; every observable answer."""
    rng = random.Random(seed)
    manager = offload_impl.CPUOffloadingManager(num_chunks=64, cache_policy=policy)
    resident: set[bytes] = set()
    seen = []
    for step in range(150):
        ctx = ReqContext(req_id=f"r{step}")
        manager.on_new_request(ctx)
        keys = list(dict.fromkeys(k(rng.randrange(400)) for _ in range(rng.randrange(1, 12))))
        for i, key in enumerate(keys):
            ctx.set_offload_key_position(key, (i + 1) * 16)
        hits = manager.count_hits(keys, ctx)
        assert all(key in resident for key in keys[:hits])
        evicted = _store(manager, keys[hits:], ctx)
        if evicted is not None:
            assert all(key in resident for key in evicted)
            resident.difference_update(evicted)
            resident.update(keys[hits:])
        manager.on_request_finished(ctx)
        probe = [k(rng.randrange(400)) for _ in range(8)]
        answers = [manager.lookup(key, ctx) for key in probe]
        assert answers == [LookupResult.HIT if key in resident else LookupResult.MISS for key in probe]
        seen.append((hits, evicted, answers))
    return seen


def test_churn_with_evictions_answers_as_the_resident_set(offload_impl, policy):
    # (~3,000 offers into 64 chunks: every slot of the index is reused many
    # times over deleted entries, and the table is rebuilt along the way)
    _churn(offload_impl, policy, seed=7)


def test_both_twins_churn_alike(policy):
    from kvcy import _fast

    try:
        compiled = _fast.load("cython")["offload"]
    except ImportError:
        pytest.skip("compiled offloading twin not built")
    assert _churn(compiled, policy, seed=11) == _churn(_fast.load("python")["offload"], policy, seed=11)


def test_a_map_grows_through_many_sizes_and_keeps_every_key(offload_impl, policy):
    n = 5000
    manager = offload_impl.CPUOffloadingManager(num_chunks=n, cache_policy=policy)
    ctx = ReqContext(req_id="fill")
    for start in range(0, n, 250):
        assert _store(manager, [k(i) for i in range(start, start + 250)], ctx) == []
    gc.collect()    # (the stored key objects are held by the manager alone)
    assert manager.count_hits([k(i) for i in range(n)], ctx) == n
    assert all(manager.lookup(k(i), ctx) is LookupResult.HIT for i in range(0, n, 7))
    assert all(manager.lookup(k(i, "other"), ctx) is LookupResult.MISS for i in range(0, n, 7))
    # every key evicted, one offer at a time, then the map filled again
    evicted = []
    for start in range(0, n, 500):
        got = _store(manager, [k(i, "new") for i in range(start, start + 500)], ReqContext(req_id=f"n{start}"))
        assert got is not None and len(got) == 500
        evicted += got
    assert sorted(evicted) == sorted(k(i) for i in range(n))
    assert manager.count_hits([k(i) for i in range(10)], ctx) == 0
    assert manager.count_hits([k(i, "new") for i in range(n)], ctx) == n


def test_keys_that_are_not_exact_bytes(offload_impl, policy):
    manager = offload_impl.CPUOffloadingManager(num_chunks=8, cache_policy=policy)
    ctx = ReqContext(req_id="r")
    # a bytes subclass offered is stored as plain bytes; equal bytes find it
    assert _store(manager, [_SubKey(k(1)), k(2)], ctx) == []
    assert manager.lookup(k(1), ctx) is LookupResult.HIT
    assert manager.lookup(_SubKey(k(2)), ctx) is LookupResult.HIT
    assert manager.count_hits([_SubKey(k(1)), k(2), _SubKey(k(3))], ctx) == 2
    pol = manager._policy
    assert pol.get(_SubKey(k(1))) is pol.get(k(1)) is not None
    # str and int keys are never resident (a policy's get answers None)
    assert pol.get("a key") is None
    assert pol.get(12345678) is None
    with pytest.raises(TypeError, match="an offload key must be bytes, got str"):
        manager.lookup("a key", ctx)
    # a subclass key inserted and removed through the policy itself
    chunk = pol.get(k(2))
    pol.remove(_SubKey(k(2)))
    assert pol.get(k(2)) is None
    pol.insert(_SubKey(k(2)), chunk, ctx)
    assert pol.get(k(2)) is chunk
    assert sorted(key for key, _ in pol.evict(2, set())) == sorted([k(1), k(2)])


def test_a_cleared_map_is_empty_and_usable_again(offload_impl, policy):
    manager = offload_impl.CPUOffloadingManager(num_chunks=300, cache_policy=policy)
    ctx = ReqContext(req_id="r")
    assert _store(manager, [k(i) for i in range(300)], ctx) == []
    manager.reset_cache()
    assert manager.count_hits([k(i) for i in range(300)], ctx) == 0
    assert _store(manager, [k(i) for i in range(0, 600, 2)], ReqContext(req_id="s")) == []
    assert manager.count_hits([k(i) for i in range(0, 600, 2)], ctx) == 300
    assert manager.lookup(k(1), ctx) is LookupResult.MISS


def test_a_policy_initialised_again_forgets_its_keys(offload_impl, policy):
    # (the compiled LRU's rank set borrows its entries from the map: a second
    # __init__ that dropped the map but kept the set left it pointing at freed
    # statuses, which the next eviction walked)
    pol = offload_impl.CPUOffloadingManager(num_chunks=8, cache_policy=policy)._policy
    ctx = ReqContext(req_id="r")
    for i in range(6):
        ctx.set_offload_key_position(k(i), (i + 1) * 16)
        pol.insert(k(i), offload_impl.ChunkStatus(i), ctx)
    pol.__init__(8)
    gc.collect()
    assert all(pol.get(k(i)) is None for i in range(6))
    for i in range(6):
        pol.insert(k(i, "new"), offload_impl.ChunkStatus(i), ReqContext(req_id="s"))
        [bytes(64) for _ in range(100)]     # (reuses freed memory, if any was left referenced)
    assert pol.evict(6, set()) is None       # (new chunks are write-pending)
    assert pol.get(k(0, "new")) is not None
