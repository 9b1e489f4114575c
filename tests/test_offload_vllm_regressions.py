"""Differences between kvcy's offloading API and vLLM 0.33.0's, found by tests/vllm_live/test_offload_vllm.py.

Each test pins one difference, fixed, with the values vLLM 0.33.0 produced for the same
calls written in (recorded with /tmp/kvh-venv's vLLM; no vLLM needed here), under both twins.
"""

from __future__ import annotations

import dataclasses

import pytest

from kvcy.kv_offload.base import CacheHitSource, OffloadingManager, ReqContext
from kvcy.kv_offload.metrics import OffloadingConnectorStats
from kvcy.testing.golden import offload_check_state


def _key(name: str) -> bytes:
    return name.encode() + b"\0\0\0\0"


def _run(offload_impl, num_chunks, threshold, tracker, offers):
    """Offers (keys, complete?) on one request; what each returned and the bookkeeping after."""
    m = offload_impl.CPUOffloadingManager(num_chunks, store_threshold=threshold, max_tracker_size=tracker,
                                          enable_events=True)
    ctx = ReqContext(req_id="r")
    out = []
    for names, complete in offers:
        try:
            got = m.prepare_store([_key(k) for k in names], ctx)
        except Exception as exc:  # noqa: BLE001 - compared below
            out.append((type(exc).__name__, str(exc)))
            continue
        if got is None:
            out.append(None)
            continue
        out.append(([k[:-4].decode() for k in got.keys_to_store], got.store_spec.block_ids.tolist(),
                    [k[:-4].decode() for k in got.evicted_keys]))
        if complete:
            m.complete_store(got.keys_to_store, ctx)
    state = offload_check_state(m)
    return (out, state.get("tracker"), m.stores_skipped_in_current_batch,
            list(m.allocation_sizes_in_current_batch), [c for _, c, _ in state["resident"]])


# =============================================================================
# prepare_store with a key offered twice in one call
# =============================================================================
# kvcy used to refuse every repeat with ValueError.  vLLM 0.33.0 takes a repeated key that
# is resident (ready or pending) or that the store threshold holds back: every occurrence
# counts in the tracker (moved to the newest end at each, each protected key once) and in
# the skip count.  Only a repeated key vLLM would store (two chunks, one lost) is refused,
# and only where vLLM's eviction would not fail first (then vLLM returns None).
@pytest.mark.parametrize(
    ("num_chunks", "threshold", "tracker", "offers", "expected"),
    [
        pytest.param(4, 2, 8, [(["a", "b"], 1), (["a", "b"], 1), (["d", "b", "d"], 0)],
                     ([([], [], []), (["a", "b"], [0, 1], []), ([], [], [])],
                      [["6100000000", 2], ["6200000000", 3], ["6400000000", 1]], 4, [2], [0, 1]),
                     id="untracked-repeat-held-back"),
        pytest.param(1, 1, 8, [(["x", "x"], 0)], ([None], None, 0, [2], []), id="repeat-eviction-fails"),
        pytest.param(8, 4, 3, [(["a", "b", "c"], 0), (["a", "b", "a", "d"], 0), (["b"], 0)],
                     ([([], [], []), ([], [], []), ([], [], [])],
                      [["6100000000", 3], ["6400000000", 1], ["6200000000", 3]], 8, [], []),
                     id="tracker-order-and-protection"),
        pytest.param(4, 1, 8, [(["a", "b"], 1), (["a", "b", "a", "c"], 1)],
                     ([(["a", "b"], [0, 1], []), (["c"], [2], [])], None, 0, [2, 1], [0, 1, 2]),
                     id="ready-repeat"),
        pytest.param(4, 0, 8, [(["a"], 0), (["a", "a", "b"], 0)],
                     ([(["a"], [0], []), (["b"], [1], [])], None, 0, [1, 1], [0, 1]),
                     id="pending-repeat"),
    ],
)
def test_repeated_keys_in_one_offer_as_vllm(offload_impl, num_chunks, threshold, tracker, offers, expected):
    assert _run(offload_impl, num_chunks, threshold, tracker, offers) == expected


@pytest.mark.parametrize(("num_chunks", "threshold", "offers"), [
    (4, 1, [(["x", "y", "x"], 0)]),                            # fresh chunks: vLLM would lose one
    (4, 3, [(["a", "b", "c"], 0), (["a", "b", "a", "d"], 0)]),  # count 1 + 2 offers reaches 3
    (2, 1, [(["a", "b"], 1), (["x", "x"], 0)]),                # eviction succeeds first
])
def test_a_repeated_key_vllm_would_store_twice_is_refused_before_any_change(offload_impl, num_chunks,
                                                                            threshold, offers):
    m = offload_impl.CPUOffloadingManager(num_chunks, store_threshold=threshold, max_tracker_size=8,
                                          enable_events=True)
    ctx = ReqContext(req_id="r")
    for names, complete in offers[:-1]:
        got = m.prepare_store([_key(k) for k in names], ctx)
        if complete:
            m.complete_store(got.keys_to_store, ctx)
    before = offload_check_state(m), list(m.allocation_sizes_in_current_batch), m.stores_skipped_in_current_batch
    repeated = [_key(k) for k in offers[-1][0]]
    with pytest.raises(ValueError, match=r"^prepare_store got key b'[xa]\\x00\\x00\\x00\\x00' more than once$"):
        m.prepare_store(repeated, ctx)
    after = offload_check_state(m), list(m.allocation_sizes_in_current_batch), m.stores_skipped_in_current_batch
    assert after == before


def test_a_finished_request_asserts_before_a_repeat_is_refused(offload_impl):
    """vLLM asserts on a finished request's new key before it reaches the repeat."""
    m = offload_impl.CPUOffloadingManager(4)
    ctx = ReqContext(req_id="r")
    m.on_new_request(ctx)
    m.on_request_finished(ctx)
    with pytest.raises(AssertionError, match="^New cache keys observed after request finalization$"):
        m.prepare_store([_key("a"), _key("b"), _key("a")], ctx)


# =============================================================================
# get_stats(): vLLM's OffloadingConnectorStats payload
# =============================================================================
def test_stats_payload_as_vllm(offload_impl):
    """``info`` is None until set (kvcy had ``{}``); the class is a dataclass over ``data``."""
    m = offload_impl.CPUOffloadingManager(3, store_threshold=2)
    m.prepare_store([_key("a")], ReqContext(req_id="r"))
    stats = m.get_stats()
    assert type(stats) is OffloadingConnectorStats and dataclasses.is_dataclass(stats)
    assert stats.data == {
        "types": {"vllm:kv_offload_cpu_cache_usage_perc": "gauge",
                  "vllm:kv_offload_cpu_cache_write_usage_perc": "gauge",
                  "vllm:kv_offload_cpu_cache_read_usage_perc": "gauge",
                  "vllm:kv_offload_stores_skipped": "counter"},
        "data": {"vllm:kv_offload_cpu_cache_usage_perc": {(): 0.0},
                 "vllm:kv_offload_cpu_cache_write_usage_perc": {(): 0.0},
                 "vllm:kv_offload_cpu_cache_read_usage_perc": {(): 0.0},
                 "vllm:kv_offload_stores_skipped": {(): 1}},
        "info": None,
    }
    assert stats.to_dict() is stats.data
    assert repr(stats) == f"OffloadingConnectorStats(data={stats.data!r})"


def test_stats_methods_as_vllm():
    """Values recorded from vLLM 0.33.0's OffloadingConnectorStats for the same calls."""
    stats = OffloadingConnectorStats()
    assert stats.data == {"types": {}, "data": {}, "info": None} and stats.is_empty()
    stats.increase_counter("c")  # default increase 1
    stats.increase_counter("c", 2, ("x",))
    stats.set_gauge("g", 0.25)
    stats.observe_histogram("h", 3)
    stats.observe_histogram("h", 5)
    assert stats.reduce() == {"c": 1, "c:('x',)": 2, "g": 0.25, "h_count": 2, "h_sum": 8}
    assert stats.metric_sections() == (stats.data["types"], stats.data["data"])
    info_only = OffloadingConnectorStats()
    info_only.set_info([{"cpu_num_chunks": 4}])
    assert not info_only.is_empty()  # an info-only payload is not empty
    stats.aggregate(info_only)
    assert stats.data["info"] == [{"cpu_num_chunks": 4}]
    assert stats.aggregate(OffloadingConnectorStats()) is stats
    other = OffloadingConnectorStats({"types": {}, "data": {"z": {(): 1}}, "info": None})
    with pytest.raises(AssertionError, match="^Unknown offloading stats key: z$"):
        stats.aggregate(other)
    stats.reset()
    assert stats.data == {"types": {}, "data": {}, "info": None}


def test_stats_aggregate_histogram_into_a_counter_asserts_as_vllm():
    """vLLM 0.33.0 asserts that a histogram's observations merge into a list: one
    recorded here as a counter is its AssertionError, not an AttributeError."""
    stats = OffloadingConnectorStats()
    stats.increase_counter("m", 3)
    other = OffloadingConnectorStats()
    other.observe_histogram("m", 1.5)
    with pytest.raises(AssertionError):
        stats.aggregate(other)
    assert stats.data["data"] == {"m": {(): 3}}  # the value this one had is kept


# =============================================================================
# CacheHitSource: vLLM's vllm.v1.metrics.cache_hit_source.CacheHitSource
# =============================================================================
def test_cache_hit_source_as_vllm(offload_impl):
    """kvcy.kv_offload.base had a plain Enum with two members; vLLM's is a str Enum of five."""
    assert [(s.name, s.value) for s in CacheHitSource] == [
        ("DEVICE", "device"), ("HOST", "host"), ("P2P", "p2p"), ("DISK", "disk"),
        ("EXTERNAL_UNSPECIFIED", "external_unspecified")]
    assert isinstance(CacheHitSource.HOST, str) and CacheHitSource.HOST == "host"
    assert CacheHitSource.outermost([CacheHitSource.HOST, CacheHitSource.DEVICE]) is CacheHitSource.HOST
    m = offload_impl.CPUOffloadingManager(1)
    assert m.get_load_source(_key("a"), ReqContext(req_id="r")) is CacheHitSource.HOST
    assert OffloadingManager.get_load_source(m, _key("a"), None) is CacheHitSource.EXTERNAL_UNSPECIFIED


# =============================================================================
# One ReqContext visiting two managers
# =============================================================================
# vLLM keeps ONE access record per context (ReqContext.set_state by type, with the owning
# manager in it) and one LRU request rank per context: a second manager's record replaces
# the first's.  kvcy kept one per manager, so the first manager still finished (and ranked)
# the request's keys, and a load at the second manager of keys it had stored earlier was
# not counted as a reuse.
@pytest.mark.parametrize("policy", ["lru", "arc"])
def test_a_context_keeps_one_record_as_vllm(offload_impl, policy):
    key = _key
    a, b = (offload_impl.CPUOffloadingManager(4, cache_policy=policy) for _ in range(2))
    ctx = ReqContext(req_id="r")
    for i, name in enumerate("abc"):
        ctx.set_offload_key_position(key(name), 16 * (i + 1))
    for m in (a, b):
        m.complete_store(m.prepare_store([key("a"), key("b")], ctx).keys_to_store, ctx)
    other = ReqContext(req_id="s")
    a.prepare_load([key("a")], other)
    a.complete_load([key("a")], other)
    a.prepare_store([key("c")], ctx)   # replaces b's record
    b.prepare_load([key("b")], ctx)    # a fresh record at b: b is a reuse
    b.complete_load([key("b")], ctx)
    a.on_request_finished(ctx)         # b holds the record: nothing for a
    b.on_request_finished(ctx)
    a.prepare_store([key("zz")], ctx)  # a fresh, unfinished record: no assertion
    state_a, state_b = offload_check_state(a), offload_check_state(b)
    # vLLM 0.33.0's values for the same calls:
    assert [r[1:] for r in state_a["resident"]] == [[0, 0], [1, 0], [2, -1], [3, -1]]
    if policy == "lru":
        assert state_a["lru_order"] == [1, 0, 2, 3] and state_b["lru_order"] == [0, 1]
    else:
        assert state_a["arc"]["t1"] == [0, 1, 2, 3] and state_a["arc"]["t2"] == []
        assert state_b["arc"]["t1"] == [0] and state_b["arc"]["t2"] == [1]


# =============================================================================
# CachePolicy's default hooks, for a policy that defines only the abstract methods
# =============================================================================
# vLLM's CachePolicy.on_store_miss touches the missed keys and on_request_finished touches
# each group's keys (group order); kvcy's defaults did nothing, so an out-of-tree policy
# heard no recency at all.
def _logging_policy(base, log):
    class Logging(base):
        def __init__(self, cache_capacity):
            super().__init__(cache_capacity)
            self.d = {}

        def get(self, key):
            return self.d.get(key)

        def insert(self, key, chunk, req_context):
            self.d[key] = chunk

        def remove(self, key):
            del self.d[key]

        def touch(self, keys, req_context):
            log.append([k[:-4].decode() + str(k[-1]) for k in keys])

        def evict(self, n, protected):
            out = [(k, c) for k, c in self.d.items() if c.ref_cnt == 0 and k not in protected][:n]
            if len(out) < n:
                return None
            for k, _ in out:
                del self.d[k]
            return out

        def clear(self):
            self.d.clear()

    return Logging


def test_policy_default_hooks_touch_as_vllm(offload_impl, monkeypatch):
    import sys
    import types

    log = []
    module = types.ModuleType("kvcy_test_logpol")
    module.Logging = _logging_policy(offload_impl.CachePolicy, log)
    monkeypatch.setitem(sys.modules, "kvcy_test_logpol", module)
    m = offload_impl.CPUOffloadingManager(4, cache_policy="Logging", cache_policy_module_path="kvcy_test_logpol")
    ctx = ReqContext(req_id="r")

    def k(name, group=0):
        return name.encode() + group.to_bytes(4, "big")

    out = m.prepare_store([k("a"), k("a", 1), k("b")], ctx)
    log.append("--")
    m.complete_store(out.keys_to_store, ctx)
    m.prepare_load([k("a")], ReqContext(req_id="s"))
    log.append("--")
    m.prepare_store([k("c", 1), k("b")], ctx)
    log.append("--")
    m.on_request_finished(ctx)
    # vLLM 0.33.0's log for the same calls:
    assert log == [["a0", "a1", "b0"], "--", "--", ["c1"], "--", ["a0", "b0"], ["a1", "c1"]]


@pytest.mark.parametrize("cls_name", ["CachePolicy", "LRUCachePolicy", "ARCCachePolicy"])
def test_policy_hook_parameter_names_as_vllm(offload_impl, cls_name):
    import inspect

    cls = getattr(offload_impl, cls_name)
    for method, names in (("on_request_access", ["keys", "req_context"]),
                          ("on_request_finished", ["key_groups", "insertion_only_keys", "reused_keys",
                                                   "req_context"])):
        params = list(inspect.signature(getattr(cls, method)).parameters)
        assert params[1:] == names, (cls_name, method, params)


# =============================================================================
# CPUOffloadingInfo, ConfigInfo, config_info(), the factory, ReqContext equality
# =============================================================================
def test_cpu_offloading_info_as_vllm(offload_impl):
    """kvcy's CPUOffloadingInfo was a dict; vLLM's is a frozen ConfigInfo dataclass."""
    import types

    from kvcy.kv_offload.base import ConfigInfo
    from kvcy.kv_offload.cpu import CPUOffloadingInfo

    groups = [types.SimpleNamespace(tokens_per_block=16, sliding_window_size_in_chunks=None),
              types.SimpleNamespace(tokens_per_block=16, sliding_window_size_in_chunks=2)]
    cfg = types.SimpleNamespace(cache=types.SimpleNamespace(blocks_per_chunk=2),
                                model=types.SimpleNamespace(max_model_len=100), groups=groups)
    info = CPUOffloadingInfo.from_config(cfg, 10, 1000)
    assert isinstance(info, ConfigInfo) and dataclasses.is_dataclass(info)
    assert repr(info) == ("CPUOffloadingInfo(cpu_num_chunks=10, cpu_blocks_per_chunk=2, "
                          "cpu_kv_cache_size_bytes=10000, cpu_kv_cache_size_tokens=166)")
    assert CPUOffloadingInfo.config_info_keys() == (
        "cpu_num_chunks", "cpu_blocks_per_chunk", "cpu_kv_cache_size_bytes", "cpu_kv_cache_size_tokens")
    with pytest.raises(dataclasses.FrozenInstanceError):
        info.cpu_num_chunks = 3
    cfg.model.max_model_len = 0
    assert CPUOffloadingInfo.from_config(cfg, 10, 1000).as_config_info() == {
        "cpu_num_chunks": 10, "cpu_blocks_per_chunk": 2, "cpu_kv_cache_size_bytes": 10000,
        "cpu_kv_cache_size_tokens": "None"}
    m = offload_impl.CPUOffloadingManager(2, info=info)
    assert m.config_info() == [{"cpu_num_chunks": 10, "cpu_blocks_per_chunk": 2,
                                "cpu_kv_cache_size_bytes": 10000, "cpu_kv_cache_size_tokens": 166}]
    assert m.config_info()[0] is m.config_info()[0]  # one mapping, as vLLM
    with pytest.raises(TypeError, match="info must be a CPUOffloadingInfo"):
        offload_impl.CPUOffloadingManager(2, info=[("a", 1)])


def test_factory_as_vllm(offload_impl):
    from kvcy.kv_offload.cpu import CachePolicyFactory

    with pytest.raises(ValueError, match=r"^Unknown cache policy: 'zzz'\. Supported: \['lru', 'arc'\]\. "
                                         r"For an out-of-tree policy, also set cache_policy_module_path\.$"):
        CachePolicyFactory.get_cache_policy_cls("zzz")
    # a registered name wins over a module path (kvcy imported the path, which does not exist)
    assert CachePolicyFactory.get_cache_policy_cls("lru", "nonexistent.module").__name__ == "LRUCachePolicy"
    m = offload_impl.CPUOffloadingManager(2, cache_policy="arc", cache_policy_module_path="nonexistent.module")
    assert type(m._policy) is offload_impl.ARCCachePolicy


def test_req_context_equality_as_vllm():
    """vLLM's ReqContext compares its key positions and state too (kvcy's left them out)."""
    a, b = ReqContext(req_id="a"), ReqContext(req_id="a")
    assert a == b and ReqContext(req_id="a") != ReqContext(req_id="b")
    a.set_offload_key_position(_key("x"), 3)
    assert a != b


def test_base_names_as_vllm():
    """vllm.v1.kv_offload.base's names that kvcy.kv_offload.base lacked."""
    from kvcy.kv_offload import base

    assert base.OffloadingGaugeMetadata("d").multiprocess_mode == "mostrecent"
    assert base.OffloadingHistogramMetadata("d", ("l",)).buckets is None
    assert issubclass(base.OffloadingCounterMetadata, base.OffloadingMetricMetadata)
    assert base.OffloadingKVEventsConfig(True, False).self_describing_kv_events is False
    assert base.OffloadingSpec.build_metric_definitions({}) == {}
    assert base.OffloadingSpec.config_info_keys({}) == ()
    for name in ("CanonicalKVCaches", "CanonicalKVCacheRef", "CanonicalKVCacheTensor"):  # no torch needed
        assert isinstance(getattr(base, name), type), name
    with pytest.raises(AttributeError):
        base.NoSuchName  # noqa: B018


def test_base_worker_names_as_vllm():
    """The transfer worker's names in vllm.v1.kv_offload.base: they load the worker, which needs torch."""
    pytest.importorskip("torch")
    from kvcy.kv_offload import base

    for name in ("TransferResult", "OffloadingWorker"):
        assert isinstance(getattr(base, name), type), name


# =============================================================================
# Key and spec helpers
# =============================================================================
def test_make_offload_key_as_vllm():
    """vLLM packs the group index with ``int.to_bytes``: a bool is an int, and an index
    out of 4 unsigned bytes is an OverflowError (kvcy raised TypeError / ValueError)."""
    from kvcy.kv_offload.base import make_offload_key

    assert make_offload_key(b"ab", True) == b"ab\x00\x00\x00\x01"
    with pytest.raises(OverflowError, match="^int too big to convert$"):
        make_offload_key(b"ab", 2**32)
    with pytest.raises(OverflowError, match="^can't convert negative int to unsigned$"):
        make_offload_key(b"ab", -1)


def test_gpu_spec_keeps_the_callers_sequences_as_vllm():
    """vLLM keeps ``group_sizes`` / ``block_indices`` as given; kvcy made tuples, so a list
    compared unequal (``spec.group_sizes == [1, 2]`` was False)."""
    from kvcy.kv_offload.base import GPULoadStoreSpec

    sizes, indices = [1, 2], [0, 4]
    spec = GPULoadStoreSpec([1, 2, 3], sizes, indices)
    assert spec.group_sizes is sizes and spec.block_indices is indices
    assert spec.group_sizes == [1, 2] and spec.block_indices == [0, 4]
    assert GPULoadStoreSpec((1, 2, 3), (3,), (0,)).group_sizes == (3,)
    assert GPULoadStoreSpec([1], iter([1]), iter([0])).group_sizes == (1,)  # (an iterator: kept as read)


def test_take_events_leaves_the_queued_events_alone_as_vllm(offload_impl):
    """A failed store's event is yielded as a copy with the keys still not resident (vLLM's
    ``dataclasses.replace``); kvcy trimmed the queued event itself."""
    m = offload_impl.CPUOffloadingManager(4, enable_events=True)
    ctx = ReqContext(req_id="r")
    m.prepare_store([_key("x"), _key("y")], ctx)
    m.complete_store([_key("x"), _key("y")], ctx, success=False)
    queued = m.events[0]
    m.prepare_store([_key("x")], ctx)
    out = list(m.take_events())
    assert [e.keys for e in out] == [[_key("y")]] and out[0] is not queued
    assert queued.keys == [_key("x"), _key("y")] and queued.metadata_only


@pytest.mark.parametrize("policy", ["lru", "arc"])
def test_prepare_load_of_an_iterator_records_no_access_as_vllm(offload_impl, policy):
    """vLLM's prepare_load walks ``keys`` to pin them, then again to record the request's
    access: an iterator is spent by then, so the request notes no key (no reuse, no rank).
    kvcy recorded them, and evicted another key next."""
    m = offload_impl.CPUOffloadingManager(3, cache_policy=policy)
    ctx, reader = ReqContext(req_id="r"), ReqContext(req_id="s")
    for i, name in enumerate("abcd"):
        for c in (ctx, reader):
            c.set_offload_key_position(_key(name), 16 * (i + 1))
    m.complete_store(m.prepare_store([_key("a"), _key("b")], ctx).keys_to_store, ctx)
    assert m.prepare_load(iter([_key("a"), _key("b")]), reader).block_ids.tolist() == [0, 1]
    m.complete_load([_key("a"), _key("b")], reader)
    m.touch((k for k in [_key("b"), _key("a")]), reader)
    m.on_request_finished(reader)
    out = m.prepare_store([_key("c"), _key("d")], ctx)
    # vLLM 0.33.0's values for the same calls:
    assert (out.keys_to_store, out.store_spec.block_ids.tolist(), out.evicted_keys) == (
        [_key("c"), _key("d")], [2, 0], [_key("a")])
    m.on_request_finished(ctx)
    state = offload_check_state(m)
    if policy == "lru":
        assert state["lru_order"] == [0, 2, 1]
    else:
        assert state["arc"] == {"t1": [0, 2], "t2": [1], "b1": [], "b2": ["6100000000"], "target_t1_size": 0.0}


def test_arc_remove_of_a_key_not_resident_is_a_no_op_as_vllm(offload_impl):
    """vLLM's ARCCachePolicy.remove pops with a default from t1 then t2; the pure twin
    raised KeyError (the compiled one already did nothing)."""
    policy = offload_impl.ARCCachePolicy(2)
    policy.insert(_key("a"), offload_impl.ChunkStatus(0), ReqContext(req_id="r"))
    policy.remove(_key("a"))
    assert policy.remove(_key("a")) is None and policy.remove(_key("z")) is None
    assert policy.get(_key("a")) is None and not policy.b1 and not policy.b2


@pytest.mark.parametrize("policy", ["lru", "arc"])
def test_a_context_of_another_class_with_the_same_methods_serves(offload_impl, policy):
    """vLLM's manager takes its own ReqContext; kvcy's refused any context that was not
    kvcy's (TypeError), so it could not stand in for vLLM's with vLLM's contexts.  A
    context with get_state / set_state / get_offload_key_position now serves, and the
    manager decides exactly as with kvcy's ReqContext."""

    class ForeignContext:  # vLLM's ReqContext, as far as the manager reads it
        def __init__(self, req_id):
            self.req_id, self._state, self._positions = req_id, {}, {}

        def set_state(self, val):
            self._state[type(val)] = val

        def get_state(self, cls):
            return self._state.get(cls)

        def set_offload_key_position(self, key, end):
            self._positions[key] = end

        def get_offload_key_position(self, key):
            return self._positions.get(key)

    def run(make):
        m = offload_impl.CPUOffloadingManager(3, cache_policy=policy, enable_events=True)
        ctxs = [make("r"), make("s"), make("t")]
        for c in ctxs:
            for i, name in enumerate("abcde"):
                c.set_offload_key_position(_key(name), 16 * (i + 1))
        out = []
        for c, names in ((ctxs[0], "abc"), (ctxs[1], "ab"), (ctxs[2], "de")):
            m.on_new_request(c)
            got = m.prepare_store([_key(n) for n in names], c)
            out.append(None if got is None else (got.keys_to_store, got.evicted_keys))
            if got is not None:
                m.complete_store(got.keys_to_store, c)
            hits = [_key(n) for n in names if m.lookup(_key(n), c).name == "HIT"]
            m.prepare_load(hits, c)
            m.complete_load(hits, c)
            m.on_request_finished(c)
        return out, offload_check_state(m), [(e.keys, e.removed) for e in m.take_events()]

    assert run(ForeignContext) == run(lambda req: ReqContext(req_id=req))
    with pytest.raises(TypeError, match="req_context must be a ReqContext, got str"):
        offload_impl.CPUOffloadingManager(1).on_new_request("r")


def test_any_config_info_with_as_config_info_serves_as_info(offload_impl):
    """vLLM's spec passes vLLM's CPUOffloadingInfo (not kvcy's): any object with
    ``as_config_info()`` is reported, as vLLM's manager does."""

    class ForeignInfo:
        def as_config_info(self):
            return {"cpu_num_chunks": 4, "cpu_kv_cache_size_tokens": "None"}

    m = offload_impl.CPUOffloadingManager(4, info=ForeignInfo())
    assert m.config_info() == [{"cpu_num_chunks": 4, "cpu_kv_cache_size_tokens": "None"}]


def test_offloading_spec_is_vllm_0_33s():
    """vLLM 0.33.0's OffloadingSpec is built from an OffloadingConfig and yields a worker
    (not a (vllm_config, kv_cache_config) factory of handlers).  The
    values are vLLM's for the same config."""
    from kvcy.kv_offload import config as cfg
    from kvcy.kv_offload.base import OffloadingSpec

    class Spec(OffloadingSpec):
        def get_manager(self):
            return None

        def get_worker(self, kv_caches):
            return None

    config = cfg.OffloadingConfig(
        groups=(cfg.OffloadingGroupConfig(16, ("l0",), 0), cfg.OffloadingGroupConfig(32, ("l1",), 1, 2)),
        worker_kv_bytes_per_block=4096, enable_kv_cache_events=True, extra_config={"offload_prompt_only": False},
        engine_id="e", model=cfg.OffloadingModelConfig("m", "float16"), cache=cfg.OffloadingCacheConfig(16, 4),
        parallel=cfg.OffloadingParallelConfig(0, 1, 1, 1, 1, 1, 0, 1, None, True))
    spec = Spec(config)
    assert spec.config is config and spec.replicated_layout is False
    assert (spec.tokens_per_block, spec.tokens_per_hash, spec.blocks_per_chunk) == ((16, 32), 16, 4)
    assert spec.offload_prompt_only is False
    assert (spec.kv_events_config.enable_kv_cache_events, spec.kv_events_config.self_describing_kv_events) == (
        True, False)
    assert config.model.max_model_len == 0 and config.kv_cache_layout is None
    assert sorted(OffloadingSpec.__abstractmethods__) == ["get_manager", "get_worker"]
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.engine_id = "f"


def test_a_repeated_ghost_in_a_failing_offer_is_two_ghost_hits_as_vllm(offload_impl):
    """vLLM tells the policy of every occurrence of a repeated store miss before its eviction
    fails: a repeated ARC ghost adapts the target twice (kvcy: once)."""
    m = offload_impl.CPUOffloadingManager(3, cache_policy="arc")
    ctx = ReqContext(req_id="r")
    for name in "abc":
        m.complete_store(m.prepare_store([_key(name)], ReqContext(req_id=name)).keys_to_store, ctx)
    m.prepare_store([_key("d")], ReqContext(req_id="d"))  # evicts a: a ghost in b1
    m.prepare_load([_key("b"), _key("c")], ReqContext(req_id="x"))
    assert m.prepare_store([_key("a"), _key("a")], ctx) is None
    # vLLM 0.33.0's values for the same calls:
    assert m.allocation_sizes_in_current_batch == [1, 1, 1, 1, 2]
    assert offload_check_state(m)["arc"] == {"t1": [1, 2, 0], "t2": [], "b1": ["6100000000"], "b2": [],
                                             "target_t1_size": 2.0}


def test_lru_mark_evictable_of_a_key_not_resident_is_a_key_error_as_vllm(offload_impl):
    """vLLM 0.33.0's LRUCachePolicy.mark_evictable reads the key's rank: a key that is not
    resident is a KeyError; its mark_non_evictable of one does nothing.  The compiled twin
    ignored both."""
    policy = offload_impl.LRUCachePolicy(cache_capacity=4)
    key = b"abcdefgh"
    with pytest.raises(KeyError):
        policy.mark_evictable(key)
    policy.mark_non_evictable(key)
    policy.insert(key, offload_impl.ChunkStatus(0), ReqContext(req_id="r"))
    policy.mark_evictable(key)          # resident: accepted
