"""Random call sequences against CPUOffloadingManager: invariants, and both twins in lockstep.

A seeded driver mixes legal and illegal calls (unknown keys, unready loads,
extra completions, finished requests, resets).  After every call the chunk
accounting must add up; when the compiled twin is built, both twins get the
same calls and must return, raise and hold exactly the same.
"""

from __future__ import annotations

import random

import pytest

from kvcy import _fast
from kvcy.kv_offload.base import ReqContext, make_offload_key
from kvcy.testing.golden import encode_offload_event, offload_check_state

CONFIGS = [
    {"num_chunks": 3, "enable_events": True, "store_threshold": 0, "max_tracker_size": 64},
    {"num_chunks": 6, "enable_events": True, "store_threshold": 2, "max_tracker_size": 5},
    {"num_chunks": 0, "enable_events": True, "store_threshold": 0, "max_tracker_size": 64},
    {"num_chunks": 10, "enable_events": False, "store_threshold": 3, "max_tracker_size": 64},
]


def check_invariants(manager) -> dict:
    """The chunk accounting of 5.4.1 holds; return the check observation."""
    state = offload_check_state(manager)
    resident = state["resident"]
    ids = [chunk for _, chunk, _ in resident]
    allocated = state["num_allocated_chunks"]
    assert allocated <= manager._num_chunks
    assert sorted(ids + state["free_list"]) == list(range(allocated)), state
    assert state["num_evictable"] == sum(1 for _, _, ref in resident if ref == 0)
    assert state["num_write_pending"] == sum(1 for _, _, ref in resident if ref == -1)
    if "arc" in state:
        arc = state["arc"]
        assert 0.0 <= arc["target_t1_size"] <= manager._num_chunks
        assert len(arc["b1"]) <= manager._num_chunks and len(arc["b2"]) <= manager._num_chunks
        assert not {k for k, _, _ in resident} & set(arc["b1"] + arc["b2"])
    else:
        assert sorted(state["lru_order"]) == sorted(ids)
    if manager.counts is not None:
        assert len(state["tracker"]) <= manager.max_tracker_size
    return state


def _outcome(call):
    try:
        result = call()
    except (AssertionError, ValueError, TypeError) as exc:
        return ("raised", type(exc).__name__, str(exc))
    return ("ok", result)


def _encode(result):
    if result is None or isinstance(result, (bool, str, int, list)):
        return result
    if hasattr(result, "keys_to_store"):
        return (list(result.keys_to_store), result.store_spec.block_ids.tolist(), list(result.evicted_keys))
    if hasattr(result, "block_ids"):
        return result.block_ids.tolist()
    if hasattr(result, "name"):
        return result.name
    if hasattr(result, "policy"):
        return result.policy.value
    if hasattr(result, "data"):
        return {name: by_label[()] for name, by_label in result.data["data"].items()}
    raise TypeError(type(result))


def drive(modules, policy: str, config: dict, seed: int, steps: int = 250) -> None:
    rnd = random.Random(seed)
    managers = [m.CPUOffloadingManager(cache_policy=policy, **config) for m in modules]
    chains = [[make_offload_key(f"c{c}b{i}".encode(), g) for i in range(6) for g in range(2)] for c in range(3)]
    every_key = [k for chain in chains for k in chain]
    contexts: list[list[ReqContext]] = []  # one context per twin, per request

    def new_request() -> None:
        chain = rnd.choice(chains)
        name = f"r{len(contexts)}"
        ctxs = [ReqContext(req_id=name) for _ in managers]
        if rnd.random() < 0.7:
            for i, key in enumerate(chain):
                for ctx in ctxs:
                    ctx.set_offload_key_position(key, 16 * (i // 2 + 1))
        contexts.append(ctxs)
        for manager, ctx in zip(managers, ctxs):
            manager.on_new_request(ctx)

    loads: list[list[bytes]] = []  # keys of loads that may still be pinned
    new_request()
    for step in range(steps):
        ctxs = rnd.choice(contexts)
        what = rnd.random()
        keys = rnd.sample(every_key, rnd.randint(1, 4))
        if what < 0.1:
            new_request()
            continue
        if what < 0.3:
            chain = rnd.choice(chains)
            start = rnd.randrange(len(chain))
            keys = chain[start:start + rnd.randint(1, 5)]
            calls = [lambda m, c, ks=keys: m.prepare_store(ks, c)]
        elif what < 0.45:
            success = rnd.random() < 0.85
            calls = [lambda m, c, ks=keys, s=success: m.complete_store(ks, c, success=s)]
        elif what < 0.6:
            ready = [k for k in every_key if managers[0].lookup(k, ctxs[0]).name == "HIT"]
            if ready and rnd.random() < 0.8:
                keys = rnd.sample(ready, min(len(ready), rnd.randint(1, 4)))
                loads.append(keys)
            if rnd.random() < 0.8:
                calls = [lambda m, c, ks=keys: m.prepare_load(ks, c)]
            else:
                calls = [lambda m, c, ks=keys: m._prepare_load(ks, c, record_access=False)]
        elif what < 0.7:
            if loads and rnd.random() < 0.8:
                keys = loads.pop(rnd.randrange(len(loads)))
            calls = [lambda m, c, ks=keys: m.complete_load(ks, c)]
        elif what < 0.75:
            calls = [lambda m, c, ks=keys: m.touch(ks, c)]
        elif what < 0.8:
            calls = [lambda m, c, k=keys[0]: m.lookup(k, c)]
        elif what < 0.86:
            calls = [lambda m, c: m.on_request_finished(c)]
        elif what < 0.88:
            calls = [lambda m, c: m.reset_cache()]
        elif what < 0.94:
            calls = [lambda m, c: [encode_offload_event(e) for e in m.take_events()]]
        else:
            calls = [lambda m, c: m.get_stats()]
        outcomes = []
        for manager, ctx in zip(managers, ctxs):
            outcome = _outcome(lambda: calls[0](manager, ctx))
            if outcome[0] == "ok":
                outcome = ("ok", _encode(outcome[1]))
            outcomes.append((outcome, check_invariants(manager)))
        for other in outcomes[1:]:
            assert other == outcomes[0], f"seed {seed} step {step}: twins differ"


@pytest.mark.parametrize("policy", ["lru", "arc"])
@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: f"cap{c['num_chunks']}_thr{c['store_threshold']}")
def test_random_sequences_keep_the_chunk_accounting(offload_impl, policy, config):
    for seed in range(6):
        drive([offload_impl], policy, config, seed)


@pytest.mark.parametrize("policy", ["lru", "arc"])
@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: f"cap{c['num_chunks']}_thr{c['store_threshold']}")
def test_both_twins_agree_on_random_sequences(policy, config):
    try:
        compiled = _fast.load("cython")["offload"]
    except ImportError:
        pytest.skip("compiled offloading twin not built")
    for seed in range(6):
        drive([_fast.load("python")["offload"], compiled], policy, config, seed)
