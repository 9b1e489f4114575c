"""The fleet replay (``kvcy replay --instances N``): routing, conservation, the index it routes by, the CLI."""

from __future__ import annotations

import json

import pytest

from kvcy.sim.cli import main
from kvcy.sim.fleet import FleetConfig, replay_fleet
from kvcy.sim.scheduler import ReplayConfig, replay
from kvcy.sim.synthetic import SyntheticConfig, synthetic_trace
from kvcy.sim.traces import Trace

CONVERSATIONS = SyntheticConfig(
    conversations=24, max_turns=4, system_prompts=3, system_len=256,
    user_min=64, user_max=256, output_min=4, output_max=32, rate=40.0, think_ms=400.0,
)


@pytest.fixture(scope="module")
def trace() -> Trace:
    return synthetic_trace(3, CONVERSATIONS)


def _fleet(trace, impl, router, n=4, num_blocks=2048, transport="direct"):
    return replay_fleet(trace, ReplayConfig(num_blocks=num_blocks), FleetConfig(instances=n, router=router,
                        transport=transport), impl, timer_overhead=0)


@pytest.mark.parametrize("router", ["kv", "round-robin", "least-loaded"])
def test_every_request_is_routed_once_and_finishes(impl, trace, router):
    res = _fleet(trace, impl.name, router)
    assert sum(res.routed) == len(trace) and res.finished == len(trace)
    assert sum(res.routed_tokens) == trace.num_prompt_tokens
    assert sum(r.prompt_tokens for r in res.instances) == trace.num_prompt_tokens
    for r in res.instances:
        assert r.finished == r.requests
        assert r.free_blocks_at_end == r.config.num_blocks - 1  # every block came back on every instance
    if router == "round-robin":
        assert max(res.routed) - min(res.routed) <= 1
    assert res.events["batches_published"] > 0 and res.events["events_published"] > 0
    assert res.index["instances"] == 4


def test_one_instance_makes_the_single_replays_decisions(impl, trace):
    """A fleet of one is the single replay, step for step (routing and events change nothing)."""
    cfg = ReplayConfig(num_blocks=160, max_num_batched_tokens=256)
    single = replay(trace, cfg, impl.name, timer_overhead=0)
    fleet = replay_fleet(trace, cfg, FleetConfig(instances=1, router="kv", transport="direct"), impl.name,
                         timer_overhead=0)
    assert single.preemptions > 0  # a loaded pool: the comparison covers preemption too
    assert fleet.instances[0].step_digests == single.step_digests
    assert fleet.hit_tokens == single.hit_tokens


def test_kv_routing_follows_the_conversations(impl, trace):
    """Follow-up turns go where their conversation's blocks are: more hits than round-robin or least-loaded."""
    kv = _fleet(trace, impl.name, "kv")
    rr = _fleet(trace, impl.name, "round-robin")
    ll = _fleet(trace, impl.name, "least-loaded")
    assert kv.hit_rate > rr.hit_rate and kv.hit_rate > ll.hit_rate
    # ample pools, no eviction: what the index promised at routing time, the instance had at admission
    assert all(r.evictions in (None, 0) for r in kv.instances)
    assert 0 < kv.predicted_hit_tokens <= kv.hit_tokens


def test_the_index_reflects_what_each_instance_holds(impl, trace):
    """At the end, the index holds exactly the cached blocks of each instance's pool."""
    res = _fleet(trace, impl.name, "kv", num_blocks=96)
    assert any(r.evictions for r in res.instances)  # small pools: blocks were removed as well as stored
    assert res.index["per_instance_blocks"] == res.index["per_instance_cached"]
    assert all(n > 0 for n in res.index["per_instance_cached"])


def test_fleet_config_refuses_bad_values():
    with pytest.raises(ValueError, match="instances"):
        FleetConfig(instances=0)
    with pytest.raises(TypeError, match="instances"):
        FleetConfig(instances=2.0)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="router"):
        FleetConfig(instances=2, router="random")
    with pytest.raises(ValueError, match="transport"):
        FleetConfig(instances=2, transport="udp")


def test_cli_fleet_table_says_the_index_caught_up(capsys):
    rc = main(["synthetic:conversations=6,max_turns=2", "--instances", "2", "--router", "kv",
               "--fleet-transport", "direct", "--num-blocks", "256", "--no-progress"])
    assert rc == 0
    out = capsys.readouterr().out
    assert "dropped / lost / replayed" in out
    assert [line.split()[-1] for line in out.splitlines() if "index caught up" in line] == ["yes"]


def test_cli_fleet_json(capsys):
    rc = main(["synthetic:conversations=10,max_turns=3", "--instances", "2", "--router", "kv,round-robin",
               "--fleet-transport", "direct", "--num-blocks", "512", "--json", "--no-progress"])
    assert rc == 0
    rep = json.loads(capsys.readouterr().out)
    assert set(rep["routers"]) == {"kv", "round-robin"}
    assert rep["fleet"]["instances"] == 2
    for d in rep["routers"].values():
        assert sum(d["requests"]["per_instance"]) == rep["trace"]["requests_replayed"]
        assert 0.0 <= d["hit_rate"] <= 1.0


@pytest.mark.parametrize("argv, message", [
    (["--router", "kv"], "--router needs --instances"),
    (["--instances", "2", "--impl", "both"], "one implementation"),
    (["--instances", "2", "--cpu-offload", "2x"], "no CPU tier"),
    (["--instances", "2", "--no-prefix-caching"], "drop --no-prefix-caching"),
])
def test_cli_fleet_refusals(capsys, argv, message):
    assert main(["synthetic:conversations=2", "--num-blocks", "64", "--no-progress", *argv]) == 2
    assert message in capsys.readouterr().err


def test_cli_bad_router_name(capsys):
    assert main(["--instances", "2", "--router", "kv,random"]) == 2
    assert "expected routers" in capsys.readouterr().err


def test_zmq_transport_ends_with_the_index_consistent(impl, trace):
    """Events over real sockets on the loopback interface: every batch arrives, the index matches the pools."""
    pytest.importorskip("zmq")
    res = _fleet(trace, impl.name, "kv", n=3, num_blocks=96, transport="zmq")
    ev = res.events
    assert ev["transport"] == "zmq" and ev["complete"] is True
    assert ev["batches_dropped"] == 0 and ev.get("batches_lost", 0) == 0
    assert ev["batches_applied"] == ev["batches_published"]
    assert res.index["per_instance_blocks"] == res.index["per_instance_cached"]
    assert res.finished == len(trace)


def test_zmq_transport_reads_progress_without_copying_states(impl, trace, monkeypatch):
    """A routing decision samples each instance's last sequence number and lag: it must not copy
    every InstanceState (``EventSubscriber.states``) to do so."""
    pytest.importorskip("zmq")
    from kvcy.kv_events import EventSubscriber

    def no_copies(self):
        raise AssertionError("the fleet copied every InstanceState")

    monkeypatch.setattr(EventSubscriber, "states", property(no_copies))
    res = _fleet(trace, impl.name, "kv", n=2, num_blocks=96, transport="zmq")
    assert res.events["batches_applied"] == res.events["batches_published"]
    assert res.finished == len(trace)


def test_zmq_transport_says_when_the_index_did_not_catch_up(monkeypatch, caplog):
    """``finish`` waits a bounded time; an index still behind then is reported (``complete``:
    False, a warning), never passed off as the instances' state."""
    pytest.importorskip("zmq")
    from kvcy.kv_events import KVEventBatch
    from kvcy.kv_index import KVIndex
    from kvcy.sim.fleet_zmq import ZmqTransport

    transport = ZmqTransport(KVIndex(), ["a"], finish_timeout=0.2)
    try:
        transport.publish(0, KVEventBatch(ts=0.0, events=[]))
        assert transport.finish() is True and transport.stats()["complete"] is True
        monkeypatch.setattr(transport.subscriber, "poll", lambda timeout=0.0: 0)  # deaf from now on
        transport.publish(0, KVEventBatch(ts=0.0, events=[]))
        with caplog.at_level("WARNING", logger="kvcy.sim"):
            assert transport.finish() is False
        assert "did not catch up" in caplog.text and "'a': 1" in caplog.text
    finally:
        transport.close()
    assert transport.stats()["complete"] is False


def test_zmq_transport_takes_hundreds_of_instances():
    """Five or six sockets per instance (PUB and ROUTER; SUB, its connection monitor's pair and
    a DEALER for replays) pass ZeroMQ's default of 1023 per context past ~200 instances
    (``--instances`` goes to 256): the transport raises its context's limit."""
    pytest.importorskip("zmq")
    from kvcy.kv_events import KVEventBatch
    from kvcy.kv_index import KVIndex
    from kvcy.sim.fleet_zmq import ZmqTransport

    names = [f"i{k}" for k in range(210)]
    transport = ZmqTransport(KVIndex(), names)
    try:
        for k in range(len(names)):
            transport.publish(k, KVEventBatch(ts=0.0, events=[]))
        assert transport.finish() is True
    finally:
        transport.close()
    assert transport.stats()["batches_applied"] == transport.stats()["batches_published"]


def test_the_reports_percentiles_are_one_nearest_rank():
    """Per-step times, the offload report and the fleet's event lag share one percentile
    (nearest rank): with two values the median is the smaller, as for the per-step times."""
    from kvcy.sim.scheduler import nearest_rank

    assert nearest_rank([], 50) == 0.0
    assert nearest_rank([1.0, 2.0], 50) == 1.0 and nearest_rank([1.0, 2.0], 99) == 2.0
    assert nearest_rank(list(range(1, 101)), 99) == 99.0
