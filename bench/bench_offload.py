"""CPU offloading manager hot paths: Cython vs pure-Python twin, side by side per group.

Run: ``python -m pytest bench/bench_offload.py --benchmark-only``.
One group per (hot path, policy) with a ``cython`` and a ``python`` row; the
ratio of their means is the speedup, printed in a summary at the end with the
cost per key.  The tier is always full (every chunk holds a readable key), as
in a server that has been running for a while:

* ``lookup``: 256 lookups of resident keys (the scheduler's per-key probe);
* ``count_hits``: the same 256 lookups as one call, as the replay's admission
  makes them (lookups until the first key that is not a hit);
* ``store+evict``: ``prepare_store`` of 256 new keys, which evicts 256, then
  their ``complete_store``;
* ``connector step``: what vLLM's offloading connector asks of the manager in
  one scheduler step for 4 requests of 32 chunks that share a 16-chunk prefix:
  lookups until the first miss, ``prepare_load`` / ``complete_load`` of the
  hits, ``prepare_store`` / ``complete_store`` of the other 16 chunks (which
  evict), ``on_request_finished``.

(Worker-side copy throughput is in ``bench_offload_worker.py``.)
"""

from __future__ import annotations

import itertools

import pytest

from kvcy.kv_offload.base import LookupResult, ReqContext, make_offload_key

N_KEYS = 256
CAPACITY = 4096
TOKENS_PER_CHUNK = 16
POLICIES = ("lru", "arc")

RESULTS: dict[str, dict[str, tuple[float, int]]] = {}  # group -> impl -> (mean s, keys per round)


def _keys(tag: str, n: int) -> list[bytes]:
    return [make_offload_key(f"{tag}:{i}".encode().rjust(32, b"#"), 0) for i in range(n)]


def _full_manager(mod, policy: str):
    """A manager whose CAPACITY chunks all hold readable keys; returns (manager, keys)."""
    manager = mod.CPUOffloadingManager(num_chunks=CAPACITY, cache_policy=policy, enable_events=True)
    keys = _keys("fill", CAPACITY)
    ctx = ReqContext(req_id="fill")
    for i in range(0, CAPACITY, N_KEYS):
        out = manager.prepare_store(keys[i : i + N_KEYS], ctx)
        manager.complete_store(out.keys_to_store, ctx)
    list(manager.take_events())
    assert manager._num_evictable_cache_chunks == CAPACITY
    return manager, keys


def _run(benchmark, impl, group: str, fn, keys: int) -> None:
    benchmark.group = group
    fn()  # warm up
    benchmark(fn)
    if benchmark.stats is None:  # --benchmark-disable: ran once, nothing timed
        return
    mean = benchmark.stats.stats.mean
    benchmark.extra_info["ns_per_key"] = round(mean / keys * 1e9, 1)
    RESULTS.setdefault(group, {})[impl.name] = (mean, keys)


@pytest.mark.parametrize("policy", POLICIES)
def test_lookup_full_tier(benchmark, impl, policy, freeze_startup_heap):
    """256 lookups of resident keys in a full tier of 4096 chunks."""
    manager, keys = _full_manager(impl.offload, policy)
    batch = keys[1000 : 1000 + N_KEYS]
    ctx = ReqContext(req_id="probe")
    lookup = manager.lookup
    freeze_startup_heap()

    def run():
        for key in batch:
            lookup(key, ctx)

    _run(benchmark, impl, f"offload lookup x{N_KEYS}, full tier ({policy})", run, N_KEYS)
    assert manager.lookup(batch[0], ctx).name == "HIT"


@pytest.mark.parametrize("policy", POLICIES)
def test_count_hits_full_tier(benchmark, impl, policy, freeze_startup_heap):
    """The same 256 lookups as one ``count_hits`` call (the replay's admission; the row above stays vLLM's pattern)."""
    manager, keys = _full_manager(impl.offload, policy)
    batch = keys[1000 : 1000 + N_KEYS]
    ctx = ReqContext(req_id="probe")
    count_hits = manager.count_hits
    freeze_startup_heap()

    def run():
        count_hits(batch, ctx)

    _run(benchmark, impl, f"offload count_hits x{N_KEYS}, full tier ({policy})", run, N_KEYS)
    assert manager.count_hits(batch, ctx) == N_KEYS


@pytest.mark.parametrize("policy", POLICIES)
def test_store_with_eviction_full_tier(benchmark, impl, policy, freeze_startup_heap):
    """prepare_store of 256 new keys (evicting 256) + complete_store, full tier of 4096 chunks."""
    manager, _ = _full_manager(impl.offload, policy)
    # A ring of batches 2 larger than the tier: the batch offered next was
    # evicted since it was last stored, so every round stores and evicts 256.
    ring = [_keys(f"ring{b}", N_KEYS) for b in range(CAPACITY // N_KEYS + 2)]
    turn = itertools.count()
    freeze_startup_heap()

    def run():
        batch = ring[next(turn) % len(ring)]
        ctx = ReqContext(req_id="store")
        out = manager.prepare_store(batch, ctx)
        manager.complete_store(out.keys_to_store, ctx)
        if manager.events:
            manager.events.clear()

    _run(benchmark, impl, f"offload prepare_store+complete_store x{N_KEYS}, evicting ({policy})", run, N_KEYS)
    out = manager.prepare_store(ring[next(turn) % len(ring)], ReqContext(req_id="check"))
    assert len(out.keys_to_store) == N_KEYS and len(out.evicted_keys) == N_KEYS


@pytest.mark.parametrize("policy", POLICIES)
def test_connector_step(benchmark, impl, policy, freeze_startup_heap):
    """One connector step for 4 requests of 32 chunks (16 shared with a system prompt)."""
    manager, _ = _full_manager(impl.offload, policy)
    prefix = _keys("system", 16)
    ctx = ReqContext(req_id="warm")
    out = manager.prepare_store(prefix, ctx)
    manager.complete_store(out.keys_to_store, ctx)
    # Each request's keys and positions, built once: a ring long enough that a
    # request's own 16 chunks were evicted before the ring comes back to it.
    requests = []
    for n in range(CAPACITY // 16 + 8):
        keys = prefix + _keys(f"req{n}", 16)
        requests.append((f"req{n}", keys, {k: (i + 1) * TOKENS_PER_CHUNK for i, k in enumerate(keys)}))
    serial = itertools.count()
    hit = LookupResult.HIT
    freeze_startup_heap()

    def run():
        for _ in range(4):
            req_id, keys, positions = requests[next(serial) % len(requests)]
            ctx = ReqContext(req_id=req_id)
            ctx._offload_key_positions.update(positions)  # (set_offload_key_position, per key)
            manager.on_new_request(ctx)
            hits = []
            for key in keys:
                if manager.lookup(key, ctx) is not hit:
                    break
                hits.append(key)
            if hits:
                manager.prepare_load(hits, ctx)
                manager.complete_load(hits, ctx)
            out = manager.prepare_store(keys[len(hits) :], ctx)
            if out is not None:
                manager.complete_store(out.keys_to_store, ctx)
            manager.on_request_finished(ctx)
        list(manager.take_events())

    _run(benchmark, impl, f"offload connector step, 4 requests x 32 chunks ({policy})", run, 4 * 32)
    assert manager.lookup(prefix[0], ReqContext(req_id="x")) is hit


@pytest.fixture(scope="module", autouse=True)
def _summary(write_summary):
    yield
    if not RESULTS:
        return
    lines = ["", "kvcy offloading: ns per key, python/cython time (means of this run)"]
    for group, rows in RESULTS.items():
        parts = []
        for name in ("cython", "python"):
            if name in rows:
                mean, keys = rows[name]
                parts.append(f"{name} {mean / keys * 1e9:8.1f} ns/key")
        if "cython" in rows and "python" in rows:
            parts.append(f"ratio {rows['python'][0] / rows['cython'][0]:6.1f}x")
        lines.append(f"  {group:<62} " + " | ".join(parts))
    write_summary(lines)
