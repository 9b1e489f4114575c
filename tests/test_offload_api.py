"""The KV-offloading API (kvcy.kv_offload) and the CPU manager's handling of bad input.

Bad input is refused before any state changes: every refused call below is
checked against a snapshot of the manager's state taken before it.
"""

from __future__ import annotations

import inspect
import threading

import numpy as np
import pytest

from kvcy import _fast
from kvcy.kv_offload.base import (
    BlockIDsLoadStoreSpec,
    CacheHitSource,
    GPULoadStoreSpec,
    LoadStoreSpec,
    LookupResult,
    Medium,
    OffloadingEvent,
    OffloadingManager,
    OffloadingSpec,
    OffloadPolicy,
    PrepareStoreOutput,
    ReqContext,
    RequestOffloadingContext,
    ScheduleEndContext,
    TierFilter,
    get_offload_block_hash,
    get_offload_group_idx,
    make_offload_key,
)
from kvcy.kv_offload.cpu import CPULoadStoreSpec, CPUOffloadingInfo, CPUOffloadingMetrics
from kvcy.kv_offload.cpu.policies import CachePolicyFactory
from kvcy.kv_offload.metrics import OffloadingConnectorStats
from kvcy.testing.golden import offload_check_state


def key(name: str, group: int = 0) -> bytes:
    return make_offload_key(name.encode(), group)


def snapshot(manager) -> dict:
    """Everything a refused call must leave alone."""
    state = offload_check_state(manager)
    state["events"] = None if manager.events is None else [
        (list(e.keys), e.removed, e.metadata_only) for e in manager.events
    ]
    state["allocations"] = list(manager.allocation_sizes_in_current_batch)
    state["skipped"] = manager.stores_skipped_in_current_batch
    return state


# =============================================================================
# Keys
# =============================================================================
def test_offload_key_round_trip():
    k = make_offload_key(b"\x01\x02", 258)
    assert k == b"\x01\x02\x00\x00\x01\x02"
    assert get_offload_block_hash(k) == b"\x01\x02"
    assert get_offload_group_idx(k) == 258
    assert make_offload_key(b"", 0) == b"\x00" * 4


@pytest.mark.parametrize(
    ("block_hash", "group", "exc"),
    [("ab", 0, TypeError), (b"ab", "0", TypeError), (b"ab", 1.0, TypeError),
     (b"ab", -1, OverflowError), (b"ab", 1 << 32, OverflowError)],  # (vLLM's int.to_bytes errors)
)
def test_make_offload_key_refuses_bad_input(block_hash, group, exc):
    with pytest.raises(exc):
        make_offload_key(block_hash, group)


@pytest.mark.parametrize(("bad", "exc"), [("abcd", TypeError), (1234, TypeError), (b"abc", ValueError)])
def test_key_accessors_refuse_non_keys(bad, exc):
    with pytest.raises(exc):
        get_offload_group_idx(bad)
    with pytest.raises(exc):
        get_offload_block_hash(bad)


# =============================================================================
# Request context and small value types
# =============================================================================
def test_req_context_defaults_state_and_positions():
    ctx = ReqContext(req_id="r")
    assert ctx.kv_transfer_params is None and ctx.kv_hints is None
    assert ctx.load_tier_filter is TierFilter.ALL
    assert ctx.get_state(dict) is None
    ctx.set_state({"a": 1})
    ctx.set_state([1])
    ctx.set_state({"b": 2})  # replaces the earlier dict: one value per type
    assert ctx.get_state(dict) == {"b": 2}
    assert ctx.get_state(list) == [1]
    k = key("x")
    assert ctx.get_offload_key_position(k) is None
    ctx.set_offload_key_position(k, 32)
    assert ctx.get_offload_key_position(k) == 32
    ctx.set_offload_key_position(k, 16)
    assert ctx.get_offload_key_position(k) == 16


@pytest.mark.parametrize(("k", "pos", "exc"), [("xxxxx", 1, TypeError), (b"xy", 1, ValueError),
                                               (b"x\0\0\0\0", -1, ValueError), (b"x\0\0\0\0", 1.0, TypeError)])
def test_req_context_refuses_bad_positions(k, pos, exc):
    ctx = ReqContext(req_id="r")
    with pytest.raises(exc):
        ctx.set_offload_key_position(k, pos)
    assert ctx._offload_key_positions == {}


def test_tier_filter_all_allows_everything_and_matchers_filter():
    assert TierFilter.ALL.allows(Medium.CPU, None)
    from kvcy.kv_offload.base import Locality, TierMatcher

    only_cpu = TierFilter(matchers=(TierMatcher(medium=Medium.CPU),))
    assert only_cpu.allows(Medium.CPU, Locality.LOCAL)
    assert not only_cpu.allows(Medium.STORAGE, Locality.LOCAL)
    assert not TierFilter().allows(Medium.CPU, None)


def test_enums_and_small_records():
    assert [r.name for r in LookupResult] == ["MISS", "HIT", "HIT_PENDING", "RETRY"]
    assert Medium.CPU.value == "CPU"
    assert OffloadPolicy.CHUNK_LEVEL.value == "chunk_level"
    assert RequestOffloadingContext().policy is OffloadPolicy.CHUNK_LEVEL
    end = ScheduleEndContext(new_req_ids=["a"], preempted_req_ids=[])
    assert end.new_req_ids == ["a"] and end.preempted_req_ids == []
    ev = OffloadingEvent(keys=[b"k\0\0\0\0"], medium=Medium.CPU, removed=True)
    assert (ev.locality, ev.ownership, ev.removal_expected, ev.metadata_only) == (None, None, False, False)
    out = PrepareStoreOutput(keys_to_store=[], store_spec=CPULoadStoreSpec([]), evicted_keys=[])
    assert out.store_spec.block_ids.tolist() == []


# =============================================================================
# Load / store specs
# =============================================================================
def test_block_id_specs_hold_int32_arrays():
    spec = CPULoadStoreSpec([3, 1, 2])
    assert isinstance(spec, BlockIDsLoadStoreSpec) and isinstance(spec, LoadStoreSpec)
    assert spec.block_ids.dtype == np.int32
    assert spec.block_ids.tolist() == [3, 1, 2]
    assert spec.chunk_ids is spec.block_ids
    assert repr(spec) == repr(spec.block_ids)
    assert CPULoadStoreSpec(np.array([5, 6], dtype=np.int64)).block_ids.tolist() == [5, 6]


@pytest.mark.parametrize(
    ("ids", "exc"),
    [([1.5], TypeError), ([True], TypeError), (["1"], TypeError), (5, TypeError), ("12", TypeError),
     ([-1], ValueError), ([1 << 31], ValueError), (np.zeros((2, 2), dtype=np.int32), ValueError),
     (np.array([1.0]), TypeError)],
)
def test_block_id_specs_refuse_bad_ids(ids, exc):
    with pytest.raises(exc):
        CPULoadStoreSpec(ids)


def test_gpu_spec_groups():
    spec = GPULoadStoreSpec([7, 8, 9], group_sizes=[1, 2], block_indices=[4, 0])
    assert spec.block_ids.tolist() == [7, 8, 9]
    assert list(spec.group_sizes) == [1, 2] and list(spec.block_indices) == [4, 0]
    single = GPULoadStoreSpec([1, 2])
    assert single.group_sizes is None and single.block_indices is None
    assert list(GPULoadStoreSpec([1, 2], block_indices=[3]).block_indices) == [3]


@pytest.mark.parametrize(
    ("sizes", "indices", "exc"),
    [([1, 1], None, AssertionError),          # sum(group_sizes) != len(block_ids)
     ([3], [0, 1], AssertionError),           # one block index per group
     (None, [0, 1], AssertionError),          # None means one group
     ([4, -1], None, ValueError),
     ([3], [-2], ValueError),
     ([3.0], None, TypeError),
     ("3", None, TypeError)],
)
def test_gpu_spec_refuses_inconsistent_groups(sizes, indices, exc):
    with pytest.raises(exc):
        GPULoadStoreSpec([1, 2, 3], group_sizes=sizes, block_indices=indices)


# =============================================================================
# Abstract bases and stats
# =============================================================================
def test_abstract_bases_cannot_be_instantiated():
    with pytest.raises(TypeError):
        OffloadingManager()
    with pytest.raises(TypeError):
        OffloadingSpec()


def test_offloading_manager_defaults():
    class Minimal(OffloadingManager):
        def lookup(self, key, req_context):
            return LookupResult.MISS

        def prepare_load(self, keys, req_context):
            return CPULoadStoreSpec([])

        def prepare_store(self, keys, req_context):
            return None

        def on_new_request(self, req_context):
            return RequestOffloadingContext()

    m = Minimal()
    ctx = ReqContext(req_id="r")
    assert list(m.take_events()) == []
    assert m.has_pending_work() is False
    assert m.config_info() == [{}]
    assert m.get_stats() is None
    assert m.get_load_source(key("a"), ctx) is CacheHitSource.EXTERNAL_UNSPECIFIED
    assert m.touch([key("a")], ctx) is None and m.complete_load([], ctx) is None
    assert m.lock is m.lock
    with m.lock:  # re-entrant
        with m.lock:
            pass
    assert isinstance(m.lock, type(threading.RLock()))


def test_connector_stats_kinds():
    stats = OffloadingConnectorStats()
    assert stats.is_empty()
    stats.set_gauge("g", 0.5)
    stats.increase_counter("c", 0)
    stats.increase_counter("c", 2)
    stats.observe_histogram("h", 3)
    stats.observe_histogram("h", 1)
    assert stats.data["data"] == {"g": {(): 0.5}, "c": {(): 2}, "h": {(): [3, 1]}}
    assert stats.data["types"] == {"g": "gauge", "c": "counter", "h": "histogram"}
    stats.increase_counter("g", 1)  # vLLM keeps the first kind and adds (no error)
    assert stats.data["types"]["g"] == "gauge" and stats.data["data"]["g"][()] == 1.5
    stats.set_gauge("g", 0.5)
    other = OffloadingConnectorStats()
    other.increase_counter("c", 5)
    other.observe_histogram("h", 7)
    stats.aggregate(other)
    assert stats.data["data"]["c"][()] == 7 and stats.data["data"]["h"][()] == [3, 1, 7]


def test_cpu_metric_names():
    assert CPUOffloadingMetrics.CPU_CACHE_USAGE_PERC == "vllm:kv_offload_cpu_cache_usage_perc"
    assert CPUOffloadingMetrics.STORES_SKIPPED == "vllm:kv_offload_stores_skipped"


# =============================================================================
# Policy registry
# =============================================================================
def test_policy_factory_knows_lru_and_arc():
    from kvcy.kv_offload.cpu import ARCCachePolicy, LRUCachePolicy

    assert CachePolicyFactory.get_cache_policy_cls("lru") is LRUCachePolicy
    assert CachePolicyFactory.get_cache_policy_cls("arc") is ARCCachePolicy
    with pytest.raises(ValueError, match=r"^Unknown cache policy: 'lfu'\. Supported: \['lru', 'arc'\]\. "
                                         r"For an out-of-tree policy, also set cache_policy_module_path\.$"):
        CachePolicyFactory.get_cache_policy_cls("lfu")
    with pytest.raises(ValueError, match=r"^Cache policy 'lru' is already registered\.$"):
        CachePolicyFactory.register_cache_policy("lru", "x", "y")
    with pytest.raises(TypeError):
        CachePolicyFactory.register_cache_policy("mine", 1, "y")


def test_policy_factory_loads_by_module_path():
    cls = CachePolicyFactory.get_cache_policy_cls("LRUCachePolicy", "kvcy.kv_offload.cpu.policies.lru")
    assert cls.__name__ == "LRUCachePolicy"
    # as vLLM: a registered name wins over the module path; a class that is not a policy
    # fails vLLM's assertion, a missing one is an AttributeError
    from kvcy.kv_offload.cpu import LRUCachePolicy

    assert CachePolicyFactory.get_cache_policy_cls("lru", "kvcy.kv_offload.cpu.common") is LRUCachePolicy
    with pytest.raises(AssertionError):
        CachePolicyFactory.get_cache_policy_cls("CPULoadStoreSpec", "kvcy.kv_offload.cpu.common")
    with pytest.raises(AttributeError, match="Nope"):
        CachePolicyFactory.get_cache_policy_cls("Nope", "kvcy.kv_offload.cpu.common")


def test_registered_policy_is_used_by_the_manager(offload_impl, monkeypatch):
    monkeypatch.setattr(CachePolicyFactory, "_registry", dict(CachePolicyFactory._registry))
    name = "custom_lru"
    CachePolicyFactory.register_cache_policy(name, "kvcy.kv_offload.cpu.policies.lru", "LRUCachePolicy")
    with pytest.raises(ValueError, match=r"Supported: \['lru', 'arc', 'custom_lru'\]"):
        offload_impl.CPUOffloadingManager(2, cache_policy="mru")
    manager = offload_impl.CPUOffloadingManager(2, cache_policy=name)
    assert type(manager._policy).__name__ == "LRUCachePolicy"


def test_live_twin_is_exposed():
    from kvcy.kv_offload.cpu import CPUOffloadingManager

    assert CPUOffloadingManager is _fast.offload.CPUOffloadingManager
    assert _fast.IMPLEMENTATION == _fast.offload.IMPLEMENTATION


def _doc(obj, name: str) -> str | None:
    """A docstring without the signature line Cython's embedsignature puts first."""
    doc = inspect.getdoc(obj)
    if doc and doc.startswith(f"{name}("):
        doc = doc.split("\n", 1)[1].lstrip("\n") if "\n" in doc else ""
    return doc


def test_twins_share_public_names_and_docstrings():
    try:
        compiled = _fast.load("cython")["offload"]
    except ImportError:
        pytest.skip("compiled offloading twin not built")
    python = _fast.load("python")["offload"]
    assert sorted(compiled.__all__) == sorted(python.__all__)
    for name in python.__all__:
        py_obj, c_obj = getattr(python, name), getattr(compiled, name)
        if not isinstance(py_obj, type):
            continue
        assert _doc(py_obj, name) == _doc(c_obj, name), name
        py_public = {n for n in vars(py_obj) if not n.startswith("_")}
        assert py_public <= set(dir(c_obj)), (name, py_public - set(dir(c_obj)))
        for attr in sorted(py_public):
            assert _doc(getattr(py_obj, attr), attr) == _doc(getattr(c_obj, attr), attr), (name, attr)


# =============================================================================
# CPUOffloadingManager: construction
# =============================================================================
def test_manager_defaults(offload_impl):
    m = offload_impl.CPUOffloadingManager(3)
    assert m.events is None and m.counts is None
    assert type(m._policy).__name__ == "LRUCachePolicy"
    assert isinstance(m, OffloadingManager)
    assert m.config_info() == [{}]
    info = CPUOffloadingInfo(cpu_num_chunks=3, cpu_blocks_per_chunk=2, cpu_kv_cache_size_bytes=96,
                             cpu_kv_cache_size_tokens=None)
    assert offload_impl.CPUOffloadingManager(3, info=info).config_info() == [{
        "cpu_num_chunks": 3, "cpu_blocks_per_chunk": 2, "cpu_kv_cache_size_bytes": 96,
        "cpu_kv_cache_size_tokens": "None"}]
    assert offload_impl.CPUOffloadingManager(3, info={"size": "3"}).config_info() == [{"size": "3"}]
    assert m.on_new_request(ReqContext(req_id="r")).policy is OffloadPolicy.CHUNK_LEVEL
    assert m.get_load_source(key("a"), ReqContext(req_id="r")) is CacheHitSource.HOST
    assert m.has_pending_work() is False


@pytest.mark.parametrize(
    ("kwargs", "exc", "match"),
    [({"num_chunks": -1}, ValueError, "num_chunks must be non-negative"),
     ({"num_chunks": "4"}, TypeError, "num_chunks must be an int"),
     ({"num_chunks": 4.0}, TypeError, "num_chunks must be an int"),
     ({"num_chunks": True}, TypeError, "num_chunks must be an int"),
     ({"num_chunks": 4, "cache_policy": "fifo"}, ValueError, r"Supported: \['lru', 'arc'\]"),
     ({"num_chunks": 4, "cache_policy": None}, TypeError, "cache_policy must be a str"),
     ({"num_chunks": 4, "store_threshold": -2}, ValueError, "store_threshold must be non-negative"),
     ({"num_chunks": 4, "max_tracker_size": -1}, ValueError, "max_tracker_size must be non-negative"),
     ({"num_chunks": 4, "max_tracker_size": None}, TypeError, "max_tracker_size must be an int"),
     ({"num_chunks": 4, "cache_policy_module_path": 3}, TypeError, "cache_policy_module_path"),
     ({"num_chunks": 4, "info": ["x"]}, TypeError, "info must be")],
)
def test_manager_refuses_bad_construction(offload_impl, kwargs, exc, match):
    with pytest.raises(exc, match=match):
        offload_impl.CPUOffloadingManager(**kwargs)


def test_policies_refuse_bad_capacity(offload_impl):
    for cls in (offload_impl.LRUCachePolicy, offload_impl.ARCCachePolicy):
        with pytest.raises(ValueError):
            cls(cache_capacity=-1)
        with pytest.raises(TypeError):
            cls(cache_capacity=2.5)
    with pytest.raises(ValueError):
        offload_impl.ChunkStatus(-1)
    status = offload_impl.ChunkStatus(3)
    assert (status.chunk_id, status.ref_cnt, status.is_ready) == (3, -1, False)


# =============================================================================
# CPUOffloadingManager: bad calls change nothing
# =============================================================================
@pytest.fixture
def busy(offload_impl):
    """A manager with a readable key a (pinned once), a readable key b, a pending key c."""
    m = offload_impl.CPUOffloadingManager(4, enable_events=True, store_threshold=2, max_tracker_size=8)
    ctx = ReqContext(req_id="r")
    m.on_new_request(ctx)
    for _ in range(2):
        m.prepare_store([key("a"), key("b")], ctx)
    m.complete_store([key("a"), key("b")], ctx)
    m.prepare_load([key("a")], ctx)
    m.prepare_store([key("c")], ctx)
    m.prepare_store([key("c")], ctx)
    assert m.lookup(key("c"), ctx) is LookupResult.HIT_PENDING
    return m, ctx


BAD_KEYS = [("abcde", TypeError, "must be bytes"), (7, TypeError, "must be bytes"),
            (bytearray(b"abcde"), TypeError, "must be bytes"), (b"abc", ValueError, "4-byte group index")]


@pytest.mark.parametrize(("bad", "exc", "match"), BAD_KEYS)
def test_bad_keys_are_refused_everywhere(busy, bad, exc, match):
    m, ctx = busy
    before = snapshot(m)
    with pytest.raises(exc, match=match):
        m.lookup(bad, ctx)
    for call in (m.prepare_store, m.prepare_load, m.complete_load, m.complete_store, m.touch):
        with pytest.raises(exc, match=match):
            call([key("b"), bad], ctx)
    assert snapshot(m) == before


def test_a_single_key_is_not_a_key_list(busy):
    m, ctx = busy
    before = snapshot(m)
    for call in (m.prepare_store, m.prepare_load, m.complete_load, m.complete_store, m.touch):
        with pytest.raises(TypeError, match="keys must be a collection"):
            call(key("b"), ctx)
    assert snapshot(m) == before


def test_context_must_be_a_req_context_where_it_is_used(busy):
    m, _ = busy
    before = snapshot(m)
    for call in (lambda c: m.prepare_store([key("d")], c), lambda c: m.prepare_load([key("b")], c),
                 m.on_new_request, m.on_request_finished):
        with pytest.raises(TypeError, match="req_context must be a ReqContext"):
            call("r")
    assert snapshot(m) == before


def test_offering_a_key_twice_is_refused(busy):
    """Only where vLLM would store the key twice (two chunks, one lost): here d's count
    reaches the threshold and b's eviction makes room (tests/test_offload_vllm_regressions.py)."""
    m, ctx = busy
    m.prepare_store([key("d")], ctx)
    before = snapshot(m)
    with pytest.raises(ValueError, match="more than once"):
        m.prepare_store([key("d"), key("d")], ctx)
    assert snapshot(m) == before


def test_prepare_load_checks_every_key_before_pinning(busy):
    m, ctx = busy
    before = snapshot(m)
    # vLLM pins b, then fails on the missing key: here b stays unpinned.
    with pytest.raises(AssertionError, match=r"^Chunk b'zz\\x00\\x00\\x00\\x00' not found in cache$"):
        m.prepare_load([key("b"), key("zz")], ctx)
    with pytest.raises(AssertionError, match=r"^Chunk b'c\\x00\\x00\\x00\\x00' is not ready for reading$"):
        m.prepare_load([key("b"), key("c")], ctx)
    assert snapshot(m) == before


def test_complete_load_checks_every_key_before_unpinning(busy):
    m, ctx = busy
    before = snapshot(m)
    with pytest.raises(AssertionError, match=r"^Chunk b'zz\\x00\\x00\\x00\\x00' not found$"):
        m.complete_load([key("a"), key("zz")], ctx)
    # a is pinned once: releasing it twice in one call fails on the second.
    with pytest.raises(AssertionError, match=r"^Chunk b'a\\x00\\x00\\x00\\x00' ref_cnt is already 0$"):
        m.complete_load([key("a"), key("a")], ctx)
    with pytest.raises(AssertionError, match="ref_cnt is already 0"):
        m.complete_load([key("b")], ctx)  # readable, never loaded
    with pytest.raises(AssertionError, match="ref_cnt is already 0"):
        m.complete_load([key("c")], ctx)  # write pending
    assert snapshot(m) == before


def test_completing_stores_never_prepared_is_ignored(busy):
    """vLLM defines this one: complete_store skips keys that are not write-pending."""
    m, ctx = busy
    before = snapshot(m)
    m.complete_store([key("never"), key("a"), key("b")], ctx)
    m.complete_store([key("never"), key("b")], ctx, success=False)
    assert snapshot(m) == before


def test_new_keys_after_finish_are_refused_before_any_change(busy):
    m, ctx = busy
    other = ReqContext(req_id="other")
    m.prepare_store([key("d")], other)  # d is tracked once: ctx's offer would store it
    m.prepare_store([key("e")], other)
    m.prepare_store([key("e")], other)
    m.complete_store([key("e")], other)
    m.on_request_finished(ctx)
    before = snapshot(m)
    with pytest.raises(AssertionError, match="^New cache keys observed after request finalization$"):
        m.prepare_store([key("b"), key("d")], ctx)
    with pytest.raises(AssertionError, match="^New cache keys observed after request finalization$"):
        m.prepare_load([key("e")], ctx)  # readable, but never seen by ctx
    assert snapshot(m) == before
    # A key the threshold drops is not recorded, so the finished request may
    # offer it: the tracker counts it, as in vLLM.
    out = m.prepare_store([key("f")], ctx)
    assert out is not None and out.keys_to_store == []
    assert [k for k, _ in m.counts.items()][-1] == key("f")


def test_keys_seen_before_finish_may_still_be_offered(busy):
    m, ctx = busy
    m.on_request_finished(ctx)
    out = m.prepare_store([key("a"), key("b")], ctx)
    assert out is not None and out.keys_to_store == []


@pytest.mark.parametrize("policy", ["lru", "arc"])
def test_a_foreign_context_whose_state_is_not_ours_is_one_type_error(offload_impl, policy):
    """A duck-typed request context (vLLM's or another) whose ``get_state`` hands back
    something other than the state the manager / LRU policy set on it: both twins
    refuse it with the same TypeError (the compiled twin's cast used to say
    "Cannot convert", the pure one failed on an attribute)."""

    class Foreign:
        def __init__(self, state):
            self.state = state

        def get_state(self, cls):
            return self.state

        def set_state(self, value):
            pass

        def get_offload_key_position(self, key):
            return None

    manager = offload_impl.CPUOffloadingManager(2, cache_policy=policy)
    for state in (5, {}):
        with pytest.raises(TypeError, match=r"^req_context\.get_state\(_AccessRecords\) returned "
                           + type(state).__name__ + r", not the _AccessRecords set on it$"):
            manager.prepare_store([b"aaaa"], Foreign(state))
    policy_obj = offload_impl.LRUCachePolicy(2)
    policy_obj.insert(b"aaaa", offload_impl.ChunkStatus(0), Foreign(None))
    with pytest.raises(TypeError, match=r"^req_context\.get_state\(_LRURequestRanks\) returned int, "
                       r"not the _LRURequestRanks set on it$"):
        policy_obj.on_request_access([b"aaaa"], Foreign(5))
    assert manager.prepare_store([b"aaaa"], Foreign(None)).keys_to_store == [b"aaaa"]
