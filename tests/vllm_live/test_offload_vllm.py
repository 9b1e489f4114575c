"""kvcy's CPU offloading manager against vLLM 0.33.0's own, side by side (a hypothesis state machine).

The same random calls go to ``vllm.v1.kv_offload.cpu.manager.CPUOffloadingManager`` and to
kvcy's (``kvcy.kv_offload.cpu.manager``: the active twin, ``kvcy.IMPLEMENTATION``), each with
its own ``ReqContext`` per request carrying the same key positions: lookups, loads (of ready,
pending and unknown keys), touches, extra unpins, offers (with duplicates, pending and stored
keys, more keys than the cache holds), store completions (successful or not, unknown keys),
request arrivals and ends (twice, unknown requests), resets, events (drained whole or in
part), stats, step ends.  After every call the results must be equal (return values, spec
chunk ids, ``PrepareStoreOutput`` fields, exception types and messages), and after every step
so must the events and the bookkeeping both expose (resident keys with chunk ids and ref
counts, free list, evictable and pending counts, ARC's lists and target, LRU's ranks and order,
the store tracker, the stats accumulators).  A second manager pair sees the same contexts
(vLLM keeps one access record per context), two configs give kvcy's manager vLLM's own
ReqContext objects, and key collections come as lists, tuples, generators and dict views.
The tests at the bottom compare the API surface (names, parameters, defaults, dataclass
fields, NamedTuple fields, enum members, abstract methods; ``API_ALLOWED``), ~50 small
behaviours of the key/spec helpers, ReqContext, TierFilter, ChunkStatus and
order_request_keys (``HELPER_ALLOWED``), the constructor's arguments (``CTOR_ALLOWED``) and
the canonical KV-cache dataclasses.

Where kvcy deliberately differs (it refuses, before any state change, input on which vLLM
raises half-way or corrupts its state) the machine checks the outcome and then repairs vLLM's
state or stops comparing; each such case is one entry of :data:`ALLOWED` and is counted.

It runs where vLLM 0.33.0 imports (``.ci/run``'s vLLM step, once per twin) and skips elsewhere;
``KVCY_REQUIRE_VLLM=1`` makes a missing vLLM an error.  Examples are derandomized (same
sequences every run, not shrunk).  To explore: ``KVCY_SM_EXAMPLES=40 KVCY_SM_STEPS=80
KVCY_SM_RANDOM=1`` (fresh seeds, failures shrunk; ``KVCY_SM_SHRINK=1`` shrinks derandomized ones).
Regression tests for the differences found here run without vLLM in
tests/test_offload_vllm_regressions.py.
"""

from __future__ import annotations

import dataclasses
import enum
import inspect
import os

import pytest

import vllm  # noqa: E402

import numpy as np  # noqa: E402
from hypothesis import HealthCheck, Phase, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from hypothesis.stateful import (  # noqa: E402
    RuleBasedStateMachine,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)
from vllm.v1.kv_offload import base as vbase  # noqa: E402
from vllm.v1.kv_offload.cpu import common as vcommon  # noqa: E402
from vllm.v1.kv_offload.cpu import manager as vmanager  # noqa: E402

import kvcy  # noqa: E402
from kvcy import _fast  # noqa: E402
from kvcy.kv_offload import base as kbase  # noqa: E402
from kvcy.kv_offload.cpu import common as kcommon  # noqa: E402
from kvcy.testing.golden import encode_offload_event, offload_check_state  # noqa: E402

EXAMPLES = int(os.environ.get("KVCY_SM_EXAMPLES", "5"))
STEPS = int(os.environ.get("KVCY_SM_STEPS", "40"))
EXPLORE = os.environ.get("KVCY_SM_RANDOM") == "1"
PHASES = [Phase.explicit, Phase.reuse, Phase.generate, Phase.target]
if EXPLORE or os.environ.get("KVCY_SM_SHRINK") == "1":
    PHASES.append(Phase.shrink)
SETTINGS = settings(max_examples=EXAMPLES, stateful_step_count=STEPS, deadline=None, derandomize=not EXPLORE,
                    database=None, phases=PHASES, print_blob=True,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])

#: kvcy's deliberate differences from vLLM 0.33.0: on these inputs vLLM raises after changing
#: its state (or silently corrupts it) and kvcy raises the same exception (or a ValueError)
#: before changing anything.  name -> what vLLM does.
ALLOWED = {
    "prepare_load_partial": "a key that is missing or not ready: vLLM asserts after pinning the keys before it "
                            "(the machine unpins them on vLLM's side and compares on)",
    "prepare_load_finished": "a key new to a finished request: vLLM asserts after pinning every key "
                             "(the machine unpins them on vLLM's side and compares on)",
    "complete_load_partial": "a key not found or with no pin left: vLLM asserts after unpinning the keys before it "
                             "(the machine re-pins them on vLLM's side and compares on)",
    "prepare_store_finished": "a key new to a finished request: vLLM asserts after counting the offer in its "
                              "tracker and telling the policy of the misses (the machine stops comparing state)",
    "prepare_store_duplicate": "a key offered twice and stored: vLLM allocates two chunks for it and loses one "
                               "(kvcy raises ValueError; the machine stops comparing state)",
}

CHAINS = 3
CHAIN_LEN = 5
TOKENS = 16
REQS = ("a", "b", "c")


@dataclasses.dataclass(frozen=True)
class Config:
    name: str
    policy: str
    num_chunks: int
    events: bool = True
    threshold: int = 1
    tracker: int = 64_000
    groups: tuple[int, ...] = (0,)
    vllm_contexts: bool = False  # kvcy's manager gets vLLM's ReqContext objects too


CONFIGS = [
    Config("lru-0", "lru", 0),
    Config("lru-1", "lru", 1),
    Config("lru-3-groups", "lru", 3, groups=(0, 1)),
    Config("lru-5-noevents", "lru", 5, events=False, groups=(0, 2)),
    Config("lru-4-threshold0", "lru", 4, threshold=0),
    Config("lru-3-threshold2", "lru", 3, threshold=2, tracker=3),
    Config("lru-4-threshold3", "lru", 4, threshold=3, tracker=4, groups=(0, 1)),
    Config("lru-32", "lru", 32, groups=(0, 1, 5)),
    Config("lru-4-vllm-contexts", "lru", 4, groups=(0, 1), vllm_contexts=True),
    Config("arc-1", "arc", 1),
    Config("arc-2-groups", "arc", 2, groups=(1, 0)),
    Config("arc-4", "arc", 4, groups=(0, 3)),
    Config("arc-5-noevents", "arc", 5, events=False),
    Config("arc-4-threshold0", "arc", 4, threshold=0, groups=(0, 1)),
    Config("arc-3-threshold2", "arc", 3, threshold=2, tracker=2),
    Config("arc-4-threshold3", "arc", 4, threshold=3, tracker=5),
    Config("arc-32", "arc", 32, groups=(0, 1, 5)),
    Config("arc-3-vllm-contexts", "arc", 3, threshold=2, tracker=4, vllm_contexts=True),
]


# ------------------------------------------------------------------ normalising outcomes
def _normal(value):
    if isinstance(value, enum.Enum):
        return (type(value).__name__, value.name, value.value, isinstance(value, str))
    if value is None or isinstance(value, (bool, int, float, str, bytes)):
        return value
    if isinstance(value, (vbase.PrepareStoreOutput, kbase.PrepareStoreOutput)):
        return ("store", type(value).__name__, list(value.keys_to_store), _normal(value.store_spec),
                list(value.evicted_keys))
    if isinstance(value, (vbase.BlockIDsLoadStoreSpec, kbase.BlockIDsLoadStoreSpec)):
        ids = value.block_ids
        return (type(value).__name__, type(ids).__name__, str(ids.dtype), ids.tolist(), repr(value),
                value.chunk_ids.tolist())
    if isinstance(value, (vbase.RequestOffloadingContext, kbase.RequestOffloadingContext)):
        return ("req", value.policy.name, value.policy.value)
    if hasattr(value, "data") and isinstance(value.data, dict):  # OffloadingConnectorStats
        return ("stats", type(value).__name__, value.data)
    if isinstance(value, list):
        return [_normal(v) for v in value]
    if isinstance(value, dict):
        return ("dict", type(value).__name__, sorted((k, _normal(v)) for k, v in value.items()))
    raise TypeError(f"cannot compare a {type(value).__name__}")


def _outcome(call):
    try:
        value = call()
    except Exception as exc:  # noqa: BLE001 - the exception itself is compared
        return ("raise", type(exc).__name__, str(exc))
    return ("ok", _normal(value))


def _state(manager) -> dict:
    state = offload_check_state(manager)
    policy = manager._policy
    if hasattr(policy, "_ranks"):
        state["ranks"] = sorted((k.hex(), list(r)) for k, r in policy._ranks.items())
    state["allocation_sizes"] = list(manager.allocation_sizes_in_current_batch)
    state["stores_skipped"] = manager.stores_skipped_in_current_batch
    state["queued_events"] = None if manager.events is None else [encode_offload_event(e) for e in manager.events]
    state["store_threshold"] = manager.store_threshold
    state["max_tracker_size"] = manager.max_tracker_size
    state["medium"] = manager.medium.value
    return state


def _resident(manager) -> dict[bytes, int]:
    policy = manager._policy
    items = list(policy.t1.items()) + list(policy.t2.items()) if hasattr(policy, "t1") else list(policy.chunks.items())
    return {k: c.ref_cnt for k, c in items}


def _pick(pool: list, picks: list[int]) -> list:
    return [pool[i % len(pool)] for i in picks]


PICKS = st.lists(st.integers(0, 10**6), min_size=1, max_size=7)


class OffloadMachine(RuleBasedStateMachine):
    """One config's managers; a subclass names it (``cfg``)."""

    cfg: Config

    def __init__(self):
        super().__init__()
        cfg = self.cfg
        kwargs = dict(num_chunks=cfg.num_chunks, cache_policy=cfg.policy, enable_events=cfg.events,
                      store_threshold=cfg.threshold, max_tracker_size=cfg.tracker)
        self.v = vmanager.CPUOffloadingManager(**kwargs)
        self.k = _fast.offload.CPUOffloadingManager(**kwargs)
        # a second manager pair the same contexts visit (vLLM keeps one record per context)
        self.v2 = vmanager.CPUOffloadingManager(**kwargs)
        self.k2 = _fast.offload.CPUOffloadingManager(**kwargs)
        self.ctx: dict[str, tuple] = {}
        self.finished: set[str] = set()
        self.diverged: str | None = None
        self.allowed_seen: dict[str, int] = {}
        for req in REQS:
            self._new_context(req, 0)

    # -- helpers ----------------------------------------------------------------------
    def _new_context(self, req: str, positions: int) -> None:
        pair = (vbase.ReqContext(req_id=req), (vbase if self.cfg.vllm_contexts else kbase).ReqContext(req_id=req))
        self.ctx[req] = pair
        self.finished.discard(req)
        if positions:
            for chain in range(CHAINS):
                for i in range(CHAIN_LEN):
                    if positions == 2 and i % 2:
                        continue  # some keys without a position
                    end = (i + 1) * TOKENS if positions != 3 else (CHAIN_LEN - i) * TOKENS  # 3: reversed
                    for g in self.cfg.groups:
                        for c in pair:
                            c.set_offload_key_position(self._key(chain, i, g), end)

    @staticmethod
    def _key(chain: int, index: int, group: int) -> bytes:
        return vbase.make_offload_key(f"h{chain}.{index}".encode(), group)

    def _chain(self, chain: int, start: int, stop: int) -> list[bytes]:
        return [self._key(chain, i, g) for i in range(start, stop) for g in self.cfg.groups]

    def _universe(self) -> list[bytes]:
        return [k for c in range(CHAINS) for k in self._chain(c, 0, CHAIN_LEN)]

    def _wrap(self, args: tuple) -> list:
        """A list argument of keys as a list, a tuple, a generator or dict keys (in turn, so both
        managers get the same kind, each a fresh one); the other arguments as they are."""
        self.calls = getattr(self, "calls", 0) + 1
        kind = self.calls % 5
        if not args or type(args[0]) is not list or kind < 2:
            return [lambda: args] * 2
        if kind == 4 and len(set(args[0])) != len(args[0]):
            kind = 2  # (dict keys would drop the repeats the caller meant)
        make = {2: tuple, 3: lambda keys: (k for k in keys), 4: lambda keys: dict.fromkeys(keys).keys()}[kind]
        return [lambda: (make(args[0]), *args[1:])] * 2

    def _call(self, method: str, req: str | None, *args, **kwargs):
        """The same call on both managers; returns (vLLM's outcome, kvcy's outcome)."""
        out = []
        wraps = self._wrap(args)
        for i, manager in enumerate((self.v, self.k)):
            args = wraps[i]()
            call_args = args if req is None else (*args, self.ctx[req][i])
            out.append(_outcome(lambda: getattr(manager, method)(*call_args, **kwargs)))
        return out

    def _both(self, method: str, req: str | None, *args, **kwargs):
        got_v, got_k = self._call(method, req, *args, **kwargs)
        assert got_v == got_k, (method, req, args, kwargs, got_v, got_k)
        return got_v

    def _allowed(self, name: str) -> None:
        assert name in ALLOWED
        self.allowed_seen[name] = self.allowed_seen.get(name, 0) + 1

    def _vllm_would_fail_at(self, keys: list[bytes], ready_needed: bool) -> int | None:
        """The index of the first key vLLM's prepare_load rejects, or None."""
        resident = _resident(self.v)
        for i, key in enumerate(keys):
            if key not in resident or (ready_needed and resident[key] < 0):
                return i
        return None

    def _load(self, req: str, keys: list[bytes], record: bool):
        ctx_v, ctx_k = self.ctx[req]
        if record and len(keys) % 3 == 1:  # (sometimes a generator: vLLM then records no access)
            got_v = _outcome(lambda: self.v.prepare_load((k for k in keys), ctx_v))
            got_k = _outcome(lambda: self.k.prepare_load((k for k in keys), ctx_k))
        elif record:
            got_v = _outcome(lambda: self.v.prepare_load(keys, ctx_v))
            got_k = _outcome(lambda: self.k.prepare_load(keys, ctx_k))
        else:
            got_v = _outcome(lambda: self.v._prepare_load(keys, ctx_v, record_access=False))
            got_k = _outcome(lambda: self.k._prepare_load(keys, ctx_k, record_access=False))
        assert got_v[:2] == got_k[:2] and got_v == got_k, (keys, record, got_v, got_k)
        if got_v[0] == "raise":
            bad = self._vllm_would_fail_at(keys, True)
            pinned = keys if bad is None else keys[:bad]  # vLLM pinned these before asserting
            if pinned:
                self._allowed("prepare_load_partial" if bad is not None else "prepare_load_finished")
                self.v.complete_load(pinned, ctx_v)
        return got_v

    # -- rules ---------------------------------------------------------------------------
    @precondition(lambda self: self.diverged is None)
    @rule(req=st.sampled_from(REQS), fresh=st.booleans(), positions=st.integers(0, 3))
    def arrive(self, req, fresh, positions):
        """A request (maybe a fresh context, with all, some, reversed or no key positions) arrives."""
        if fresh:
            self._new_context(req, positions)
        self._both("on_new_request", req)

    @precondition(lambda self: self.diverged is None)
    @rule(req=st.sampled_from(REQS), chain=st.integers(0, CHAINS - 1), start=st.integers(0, CHAIN_LEN - 1),
          length=st.integers(1, CHAIN_LEN), shape=st.integers(0, 7), complete=st.integers(0, 5))
    def store(self, req, chain, start, length, shape, complete):
        """An offer (a chain slice; reversed, with a duplicate, or over two chains), then maybe its completion."""
        keys = self._chain(chain, start, min(start + length, CHAIN_LEN))
        if shape == 1:
            keys.reverse()
        elif shape == 2:
            keys = keys + keys[:1]  # a duplicate
        elif shape == 3:
            keys = keys + self._chain((chain + 1) % CHAINS, 0, 2)
        got_v, got_k = self._call("prepare_store", req, keys)
        if got_v != got_k:
            stored = got_v[1][2] if got_v[0] == "ok" and got_v[1] is not None else []
            if got_k[:2] == ("raise", "ValueError") and len(set(stored)) < len(stored):
                # vLLM stored a repeated key twice (two chunks, one lost)
                self._allowed("prepare_store_duplicate")
                self.diverged = "prepare_store_duplicate"
                return
            raise AssertionError(("prepare_store", req, keys, got_v, got_k))
        if got_v[0] == "raise":
            assert req in self.finished and got_v[1] == "AssertionError", got_v
            self._allowed("prepare_store_finished")
            self.diverged = "prepare_store_finished"
            return
        if got_v[1] is None or complete == 0:
            return
        to_store = got_v[1][2]
        if complete == 1:
            to_store = to_store[: len(to_store) // 2] + keys[:1]  # part, plus a key not pending
        self._both("complete_store", req, to_store, success=complete != 2)

    @precondition(lambda self: self.diverged is None)
    @rule(req=st.sampled_from(REQS), chain=st.integers(0, CHAINS - 1), upto=st.integers(1, CHAIN_LEN),
          more=st.booleans())
    def store_prefix(self, req, chain, upto, more):
        """The connector's pattern: the request's prefix offered again, then completed."""
        keys = self._chain(chain, 0, upto)
        if more:
            keys += self._chain((chain + 1) % CHAINS, 0, CHAIN_LEN)  # likely more than the cache holds
        got = self._both("prepare_store", req, keys)
        if got[0] == "ok" and got[1] is not None:
            self._both("complete_store", req, got[1][2])
        elif got[0] == "raise":
            assert req in self.finished
            self._allowed("prepare_store_finished")
            self.diverged = "prepare_store_finished"

    @precondition(lambda self: self.diverged is None)
    @rule(req=st.sampled_from(REQS), picks=PICKS, success=st.integers(0, 3))
    def complete_pending(self, req, picks, success):
        """complete_store of pending keys and others (stored, unknown), maybe repeated."""
        pending = sorted(k for k, r in _resident(self.v).items() if r < 0)
        keys = _pick(pending * 2 + self._chain(picks[0] % CHAINS, 0, 2), picks)
        self._both("complete_store", req, keys, success=success != 0)

    @precondition(lambda self: self.diverged is None)
    @rule(req=st.sampled_from(REQS), chain=st.integers(0, CHAINS - 1), upto=st.integers(1, CHAIN_LEN),
          record=st.integers(0, 4), complete=st.integers(0, 4))
    def load(self, req, chain, upto, record, complete):
        """Lookups along a prefix until the first non-hit, a load of the hits, maybe its completion."""
        hits = []
        for key in self._chain(chain, 0, upto):
            got = self._both("lookup", req, key)
            if got[0] == "ok" and got[1][1] == "HIT":
                self._both("get_load_source", req, key)
                hits.append(key)
            else:
                break
        if not hits:
            return
        got = self._load(req, hits, record != 0)
        if complete and got[0] == "ok":
            self._both("complete_load", req, hits)

    @precondition(lambda self: self.diverged is None)
    @rule(req=st.sampled_from(REQS), picks=PICKS, record=st.booleans(), complete=st.booleans())
    def load_any(self, req, picks, record, complete):
        """prepare_load of any keys: resident (ready or pending), unknown, repeated."""
        keys = _pick(sorted(_resident(self.v)) * 3 + self._chain(picks[0] % CHAINS, 0, 2), picks)
        got = self._load(req, keys, record)
        if complete and got[0] == "ok":
            self._both("complete_load", req, keys)

    @precondition(lambda self: self.diverged is None)
    @rule(req=st.sampled_from(REQS), picks=PICKS)
    def complete_load(self, req, picks):
        """complete_load of pinned keys, and extra ones (unpinned, unknown, repeated)."""
        pinned = sorted(k for k, r in _resident(self.v).items() for _ in range(max(r, 0)))
        keys = _pick(pinned * 2 + self._chain(0, 0, 1), picks[:4])
        before = _resident(self.v)
        got_v, got_k = self._call("complete_load", req, keys)
        assert got_v == got_k, (keys, got_v, got_k)
        if got_v[0] == "raise":
            # vLLM unpinned the keys before the one it rejected: pin them again on its side
            left = dict(before)
            done = []
            for key in keys:
                if left.get(key, 0) <= 0:
                    break
                left[key] -= 1
                done.append(key)
            if done:
                self._allowed("complete_load_partial")
                self.v._prepare_load(done, self.ctx[req][0], record_access=False)

    @precondition(lambda self: self.diverged is None)
    @rule(req=st.sampled_from(REQS), picks=PICKS)
    def touch(self, req, picks):
        """A touch of resident keys and others (ARC: ghost hits), in any order, maybe repeated."""
        keys = _pick(sorted(_resident(self.v)) * 2 + sorted(self.v._policy.__dict__.get("b1", {}))
                     + self._universe(), picks)
        self._both("touch", req, keys)

    @precondition(lambda self: self.diverged is None)
    @rule(req=st.sampled_from(REQS), fresh=st.booleans())
    def finish(self, req, fresh):
        """on_request_finished (again, or for a context the managers never saw)."""
        if fresh:
            self._new_context(req, 1)
        self._both("on_request_finished", req)
        self.finished.add(req)

    @precondition(lambda self: self.diverged is None)
    @rule(which=st.integers(0, 7))
    def reset_cache(self, which):
        if which == 0:
            self._both("reset_cache", None)
            self._both("on_reset_flushed", None)

    @precondition(lambda self: self.diverged is None)
    @rule(stats=st.booleans(), partial=st.booleans())
    def step_end(self, stats, partial):
        """The end of a step: on_schedule_end, has_pending_work, events (maybe drained in part), stats."""
        self._both("on_schedule_end", None, vbase.ScheduleEndContext(new_req_ids=["a"], preempted_req_ids=[]))
        self._both("has_pending_work", None)
        got = []
        for manager in (self.v, self.k):
            held = list(manager.events or [])  # the queued event objects, as a caller may hold them
            it = iter(manager.take_events())
            if partial:
                first = next(it, None)
                got.append(None if first is None else encode_offload_event(first))
            else:
                got.append([encode_offload_event(e) for e in it])
            got.append([encode_offload_event(e) for e in held])
        assert got[0] == got[2] and got[1] == got[3], got
        if stats:
            self._both("get_stats", None)
        self._both("config_info", None)

    @precondition(lambda self: self.diverged is None)
    @rule(req=st.sampled_from(REQS), picks=PICKS)
    def lookup_any(self, req, picks):
        for key in _pick(self._universe(), picks):
            self._both("lookup", req, key)

    @precondition(lambda self: self.diverged is None)
    @rule(req=st.sampled_from(REQS), chain=st.integers(0, CHAINS - 1), upto=st.integers(1, CHAIN_LEN),
          what=st.integers(0, 3))
    def other_manager(self, req, chain, upto, what):
        """The same context at a second manager: an offer (completed), a load of its hits, or the end."""
        ctx_v, ctx_k = self.ctx[req]
        keys = self._chain(chain, 0, upto)
        if what == 3:
            calls = [("on_request_finished", ())]
        elif what == 2:
            hits = [k for k in keys if self.v2.lookup(k, ctx_v) is vbase.LookupResult.HIT]
            calls = [("prepare_load", (hits,)), ("complete_load", (hits,))] if hits else []
        else:
            calls = [("prepare_store", (keys,))]
        for method, args in calls:
            got = [_outcome(lambda: getattr(m, method)(*args, c)) for m, c in ((self.v2, ctx_v), (self.k2, ctx_k))]
            assert got[0] == got[1], (method, args, got)
            if got[0][0] == "raise":
                self.diverged = "prepare_store_finished"  # (a finished record at the second manager)
                self._allowed("prepare_store_finished")
                return
            if method == "prepare_store" and got[0][1] is not None:
                for m, c in ((self.v2, ctx_v), (self.k2, ctx_k)):
                    m.complete_store([k for k in keys if k in got[0][1][2]], c)

    @precondition(lambda self: self.diverged is not None)
    @rule()
    def stopped(self):
        """Nothing more to compare once vLLM's state is corrupt or half-changed (see ALLOWED)."""

    # -- after every step ----------------------------------------------------------
    @invariant()
    def same_state(self):
        if self.diverged is None:
            assert _state(self.v) == _state(self.k)
            assert _state(self.v2) == _state(self.k2)


def _machine(cfg: Config):
    return type(f"Machine_{cfg.name}", (OffloadMachine,), {"cfg": cfg})


@pytest.mark.parametrize("cfg", CONFIGS, ids=[c.name for c in CONFIGS])
def test_kvcy_offloading_manager_follows_vllm(cfg):
    run_state_machine_as_test(_machine(cfg), settings=SETTINGS)


def test_configs_cover_the_brief():
    """The table has both policies, tiny and larger caches, events on and off, every threshold
    0 to 3 with small trackers, and several (non-contiguous) group indices."""
    assert {c.policy for c in CONFIGS} == {"lru", "arc"}
    assert {0, 1} <= {c.num_chunks for c in CONFIGS} and max(c.num_chunks for c in CONFIGS) >= 32
    assert {c.events for c in CONFIGS} == {True, False}
    assert {c.threshold for c in CONFIGS} == {0, 1, 2, 3}
    assert all(c.tracker < 10 for c in CONFIGS if c.threshold >= 2)
    assert any(len(c.groups) >= 3 for c in CONFIGS) and any(max(c.groups) > len(c.groups) for c in CONFIGS)


# =============================================================================
# The API surface: vLLM 0.33.0's public names, signatures, fields and members
# =============================================================================
MODULES = [
    ("vllm.v1.kv_offload.base", "kvcy.kv_offload.base"),
    ("vllm.v1.kv_offload.config", "kvcy.kv_offload.config"),
    ("vllm.v1.kv_offload.cpu.common", "kvcy.kv_offload.cpu.common"),
    ("vllm.v1.kv_offload.cpu.manager", "kvcy.kv_offload.cpu.manager"),
    ("vllm.v1.kv_offload.cpu.policies.base", "kvcy.kv_offload.cpu.policies.base"),
    ("vllm.v1.kv_offload.cpu.policies.lru", "kvcy.kv_offload.cpu.policies.lru"),
    ("vllm.v1.kv_offload.cpu.policies.arc", "kvcy.kv_offload.cpu.policies.arc"),
    ("vllm.v1.kv_offload.cpu.policies.factory", "kvcy.kv_offload.cpu.policies.factory"),
    ("vllm.distributed.kv_transfer.kv_connector.v1.offloading.metrics", "kvcy.kv_offload.metrics"),
]
#: Of a module, only these names (the rest is vLLM's Prometheus plumbing).
ONLY = {"vllm.distributed.kv_transfer.kv_connector.v1.offloading.metrics": ["OffloadingConnectorStats"]}

#: Where kvcy's API deliberately differs from vLLM 0.33.0's: "<module>:<name>[.<attr>]" -> why.
API_ALLOWED = {
    "vllm.v1.kv_offload.base:GPULoadStoreSpec.__init__":
        "group_sizes and block_indices may be left out in kvcy (None: one group), a superset of vLLM's",
    "vllm.v1.kv_offload.base:OffloadingWorker.__abstractmethods__":
        "kvcy's OffloadingWorker is the concrete handler router (kvcy.kv_offload.worker)",
    "vllm.v1.kv_offload.base:CanonicalPageMapping": "tensor-parallel page mappings: not in kvcy (single rank)",
    "vllm.v1.kv_offload.base:CopyRun": "tensor-parallel page mappings: not in kvcy (single rank)",
}

_SKIP_NAMES = {"annotations", "logger", "init_logger", "override", "TYPE_CHECKING"}


def _public_names(module) -> list[str]:
    """The public names a module defines (not the ones it imports), plus its constants."""
    if module.__name__ in ONLY:
        return ONLY[module.__name__]
    out = []
    for name, value in vars(module).items():
        if name.startswith("_") or name in _SKIP_NAMES or inspect.ismodule(value):
            continue
        home = getattr(value, "__module__", None)
        if (inspect.isclass(value) or callable(value)) and home != module.__name__:
            continue  # imported from elsewhere
        out.append(name)
    return sorted(out)


def _params(obj):
    try:
        sig = inspect.signature(obj)
    except (TypeError, ValueError):
        return None
    params = [(p.name, p.kind.name.replace("POSITIONAL_ONLY", "POSITIONAL_OR_KEYWORD"),
               None if p.default is inspect.Parameter.empty else repr(p.default))
              for p in sig.parameters.values()]
    if [p[0] for p in params] in (["self", "args", "kwargs"], ["args", "kwargs"]):
        return None  # a compiled method without an embedded signature
    return params


def _pure_twin_attr(cls_name: str, attr: str):
    pure = _fast.load("python")["offload"]
    cls = getattr(pure, cls_name, None)
    return None if cls is None else getattr(cls, attr, None)


def _api_differences() -> list[str]:
    import importlib

    diffs = []
    for vname, kname in MODULES:
        vmod, kmod = importlib.import_module(vname), importlib.import_module(kname)
        for name in _public_names(vmod):
            tag = f"{vname}:{name}"
            if tag in API_ALLOWED:
                continue
            try:
                kval = getattr(kmod, name)
            except AttributeError:
                diffs.append(f"{tag}: missing")
                continue
            vval = getattr(vmod, name)
            if inspect.isclass(vval):
                diffs += _class_differences(tag, vval, kval)
            elif callable(vval) and not isinstance(vval, type(vbase.OffloadKey)):
                vp, kp = _params(vval), _params(kval)
                if vp != kp:
                    diffs.append(f"{tag}: parameters {vp} != {kp}")
            elif not callable(vval) and vval != kval:
                diffs.append(f"{tag}: value {vval!r} != {kval!r}")
    return diffs


def _class_differences(tag: str, vcls: type, kcls) -> list[str]:
    diffs = []
    if not inspect.isclass(kcls):
        return [f"{tag}: not a class in kvcy ({type(kcls).__name__})"]
    if issubclass(vcls, enum.Enum):
        vm = [(m.name, m.value) for m in vcls]
        km = [(m.name, m.value) for m in kcls] if issubclass(kcls, enum.Enum) else None
        if vm != km:
            diffs.append(f"{tag}: members {vm} != {km}")
        for base in (str, int):
            if issubclass(vcls, base) != issubclass(kcls, base):
                diffs.append(f"{tag}: {base.__name__} mixin differs")
        return diffs
    if dataclasses.is_dataclass(vcls):
        if not dataclasses.is_dataclass(kcls):
            return diffs + [f"{tag}: not a dataclass in kvcy"]

        def fields(c):
            return [(f.name, f.init, f.repr, f.compare, repr(f.default), f.default_factory is not dataclasses.MISSING)
                    for f in dataclasses.fields(c)]
        if fields(vcls) != fields(kcls):
            diffs.append(f"{tag}: fields {fields(vcls)} != {fields(kcls)}")
        if vcls.__dataclass_params__.frozen != kcls.__dataclass_params__.frozen:
            diffs.append(f"{tag}: frozen differs")
    abstract_v = sorted(getattr(vcls, "__abstractmethods__", ()))
    if abstract_v and f"{tag}.__abstractmethods__" not in API_ALLOWED:
        # (a compiled cdef class cannot be abstract: its pure twin's class is compared)
        kabstract = getattr(kcls, "__abstractmethods__", None)
        if kabstract is None:
            kabstract = getattr(getattr(_fast.load("python")["offload"], kcls.__name__, None), "__abstractmethods__", ())
        if abstract_v != sorted(kabstract):
            diffs.append(f"{tag}.__abstractmethods__: {abstract_v} != {sorted(kabstract)}")
    if issubclass(vcls, tuple) and hasattr(vcls, "_fields"):
        if (vcls._fields, vcls._field_defaults) != (getattr(kcls, "_fields", None),
                                                    getattr(kcls, "_field_defaults", None)):
            diffs.append(f"{tag}: NamedTuple fields differ")
    for attr in sorted(set(dir(vcls))):
        if attr.startswith("_") and attr != "__init__":
            continue
        if f"{tag}.{attr}" in API_ALLOWED:
            continue
        vval = inspect.getattr_static(vcls, attr)
        if not hasattr(kcls, attr):
            diffs.append(f"{tag}.{attr}: missing")
            continue
        if attr == "__init__" and vval is object.__init__:
            continue
        kval = getattr(kcls, attr)
        if isinstance(vval, property) or not callable(getattr(vcls, attr)):
            if isinstance(vval, property) != isinstance(inspect.getattr_static(kcls, attr), property) and \
                    not callable(getattr(vcls, attr)) and attr not in ("medium",):
                pass  # (an attribute vs a read-only property: same reads)
            continue
        vp, kp = _params(getattr(vcls, attr)), _params(kval)
        if kp is None:
            kp = _params(_pure_twin_attr(kcls.__name__, attr))
        if kp is not None and vp is not None and vp != kp:
            diffs.append(f"{tag}.{attr}: parameters {vp} != {kp}")
        if isinstance(vval, (classmethod, staticmethod)) != isinstance(
                inspect.getattr_static(kcls, attr, None), (classmethod, staticmethod)):
            diffs.append(f"{tag}.{attr}: classmethod/staticmethod differs")
    return diffs


def test_api_surface_matches_vllm():
    """Every public name of vLLM's offloading modules exists in kvcy's counterpart with the
    same parameters (names, kinds, defaults), dataclass fields, NamedTuple fields and enum
    members, except the differences listed (and explained) in ``API_ALLOWED``."""
    assert _api_differences() == []


def test_api_allowed_lists_only_real_differences():
    """Each ``API_ALLOWED`` entry is a difference the comparison finds (the list stays honest)."""
    found = {d.split(": ", 1)[0] for d in _api_differences_without_allowances()}
    assert set(API_ALLOWED) == found


def _api_differences_without_allowances() -> list[str]:
    saved = dict(API_ALLOWED)
    API_ALLOWED.clear()
    try:
        return _api_differences()
    finally:
        API_ALLOWED.update(saved)


def test_lock_is_a_context_manager_as_vllm():
    """vLLM's default ``lock`` is a no-op context; kvcy's is a re-entrant lock (deliberately
    real: the API lets a manager supply one).  Both are entered the same way, re-entrantly."""
    for manager in (vmanager.CPUOffloadingManager(1), _fast.offload.CPUOffloadingManager(1)):
        with manager.lock:
            with manager.lock:
                assert manager.lookup(b"abcd" + bytes(4), None) is not None


# =============================================================================
# Small behaviours of the key and spec helpers, ReqContext, ChunkStatus, order_request_keys
# =============================================================================
def _helper_cases(B, common, policies):
    spec, chunk = common.CPULoadStoreSpec, policies.ChunkStatus

    def ctx_with(*positions):
        ctx = B.ReqContext("r")
        for key, end in positions:
            ctx.set_offload_key_position(key, end)
        return ctx

    def chunk_state(c):
        return (c.ref_cnt, c.chunk_id, c.is_ready)

    k0, k1 = b"a\0\0\0\0", b"b\0\0\0\0"
    return {
        "make_key": lambda: B.make_offload_key(b"ab", 5),
        "make_key_empty_hash": lambda: B.make_offload_key(b"", 0),
        "make_key_bool": lambda: B.make_offload_key(b"ab", True),
        "make_key_too_big": lambda: B.make_offload_key(b"ab", 2**32),
        "make_key_negative": lambda: B.make_offload_key(b"ab", -1),
        "make_key_str_hash": lambda: B.make_offload_key("ab", 1),
        "make_key_bytearray": lambda: B.make_offload_key(bytearray(b"ab"), 1),
        "make_key_float_group": lambda: B.make_offload_key(b"ab", 1.0),
        "block_hash": lambda: B.get_offload_block_hash(b"abcd\0\0\0\x07"),
        "group_idx": lambda: B.get_offload_group_idx(b"abcd\0\0\1\x07"),
        "hash_of_suffix_only": lambda: B.get_offload_block_hash(b"\0\0\0\2"),
        "group_of_suffix_only": lambda: B.get_offload_group_idx(b"\0\0\0\2"),
        "block_hash_short": lambda: B.get_offload_block_hash(b"ab"),
        "group_idx_short": lambda: B.get_offload_group_idx(b"ab"),
        "gpu_spec": lambda: B.GPULoadStoreSpec([1, 2, 3], [1, 2], [0, 4]),
        "gpu_spec_tuples": lambda: B.GPULoadStoreSpec((1, 2, 3), (3,), (0,)),
        "gpu_spec_numpy": lambda: B.GPULoadStoreSpec(np.array([5, 6]), [2], [0]),
        "gpu_spec_empty": lambda: B.GPULoadStoreSpec([], [], []),
        "gpu_spec_empty_group": lambda: B.GPULoadStoreSpec([1], [0, 1], [0, 0]),
        "gpu_spec_bad_sum": lambda: B.GPULoadStoreSpec([1, 2, 3], [1, 1], [0, 4]),
        "gpu_spec_bad_indices": lambda: B.GPULoadStoreSpec([1, 2, 3], [1, 2], [0]),
        "gpu_spec_negative_id": lambda: B.GPULoadStoreSpec([-1], [1], [0]),
        "cpu_spec": lambda: spec([3, 1]),
        "cpu_spec_chunk_ids": lambda: spec([3, 1]).chunk_ids,
        "cpu_spec_empty": lambda: spec([]),
        "cpu_spec_int64": lambda: spec(np.array([1, 2], dtype=np.int64)),
        "cpu_spec_range": lambda: spec(range(3)),
        "cpu_spec_too_big": lambda: spec([2**31]),
        "cpu_spec_float": lambda: spec([1.5]),
        "event_repr": lambda: repr(B.OffloadingEvent(keys=[k0], medium=B.Medium.CPU, removed=True)),
        "event_eq": lambda: B.OffloadingEvent([k0], B.Medium.CPU, True) == B.OffloadingEvent([k0], B.Medium.CPU, True),
        "store_output_repr": lambda: repr(B.PrepareStoreOutput([k0], spec([1]), [])),
        "ctx_repr": lambda: repr(B.ReqContext("r")),
        "ctx_eq": lambda: (B.ReqContext("r") == B.ReqContext("r"), ctx_with((k0, 1)) == B.ReqContext("r")),
        "ctx_positions": lambda: (ctx_with((k0, 5)).get_offload_key_position(k0),
                                  ctx_with((k0, 5)).get_offload_key_position(k1)),
        "ctx_negative_position": lambda: ctx_with((k0, -5)).get_offload_key_position(k0),
        "ctx_state": lambda: (lambda c: (c.set_state(3), c.get_state(int), c.get_state(str)))(B.ReqContext("r")),
        "tier_all": lambda: B.TierFilter.ALL.allows(B.Medium.CPU, None),
        "tier_empty": lambda: B.TierFilter().allows(B.Medium.CPU, None),
        "tier_medium": lambda: B.TierFilter((B.TierMatcher(B.Medium.STORAGE),)).allows(B.Medium.CPU, B.Locality.LOCAL),
        "tier_unknown_medium": lambda: B.TierFilter((B.TierMatcher(B.Medium.STORAGE),)).allows(None, B.Locality.LOCAL),
        "schedule_end": lambda: B.ScheduleEndContext(["a"], []),
        "request_context": lambda: repr(B.RequestOffloadingContext()),
        "lookup_members": lambda: [(m.name, m.value) for m in B.LookupResult],
        "chunk": lambda: chunk_state(chunk(7)),
        "chunk_big_id": lambda: chunk_state(chunk(2**40)),
        "chunk_negative_id": lambda: chunk_state(chunk(-7)),
        "chunk_set_ref_cnt": lambda: (lambda c: (setattr(c, "ref_cnt", 5), chunk_state(c)))(chunk(1)),
        "order_by_positions": lambda: policies.order_request_keys(
            [[k1, k0], [b"c\0\0\0\1"]], ctx_with((k0, 1), (k1, 2), (b"c\0\0\0\1", 1))),
        "order_without_some_positions": lambda: policies.order_request_keys([[k1, k0]], ctx_with((k0, 1))),
        "order_tuples": lambda: policies.order_request_keys(((k1,),), B.ReqContext("r")),
    }


#: Helper inputs kvcy refuses (ValueError / TypeError, or a read-only attribute) where vLLM
#: goes on with a value that is not a key, id or position.  case -> why.
HELPER_ALLOWED = {
    "make_key_str_hash": "both raise TypeError (the messages differ: vLLM's is str + bytes)",
    "make_key_bytearray": "vLLM returns a bytearray 'key' that no dict of keys finds; kvcy: TypeError",
    "make_key_float_group": "vLLM: AttributeError (float.to_bytes); kvcy: TypeError",
    "block_hash_short": "a key shorter than its 4-byte suffix: vLLM slices garbage; kvcy: ValueError",
    "group_idx_short": "a key shorter than its 4-byte suffix: vLLM reads garbage; kvcy: ValueError",
    "gpu_spec_bad_sum": "both AssertionError; kvcy's says what is wrong (vLLM's is empty)",
    "gpu_spec_bad_indices": "both AssertionError; kvcy's says what is wrong (vLLM's is empty)",
    "gpu_spec_negative_id": "a negative GPU block id: vLLM keeps it; kvcy: ValueError",
    "cpu_spec_too_big": "an id past int32: vLLM's numpy OverflowError; kvcy: ValueError",
    "cpu_spec_float": "vLLM truncates 1.5 to chunk 1; kvcy: TypeError",
    "ctx_negative_position": "a negative end-token position: vLLM keeps it; kvcy: ValueError",
    "chunk_negative_id": "a negative chunk id: vLLM keeps it; kvcy: ValueError",
    "chunk_set_ref_cnt": "the compiled twin's ChunkStatus fields are read-only (interpreter safety); "
                         "the pure twin's are writable like vLLM's",
}


def _helper_outcome(call):
    try:
        value = call()
    except Exception as exc:  # noqa: BLE001 - compared
        return ("raise", type(exc).__name__, str(exc))

    def norm(v):
        if isinstance(v, np.ndarray):
            return ("array", str(v.dtype), v.tolist())
        if isinstance(v, (vbase.BlockIDsLoadStoreSpec, kbase.BlockIDsLoadStoreSpec)):
            return (type(v).__name__, norm(v.block_ids), repr(v), getattr(v, "group_sizes", "-"),
                    getattr(v, "block_indices", "-"))
        if isinstance(v, tuple):
            return (type(v).__name__, tuple(norm(x) for x in v))
        if isinstance(v, list):
            return [norm(x) for x in v]
        return (type(v).__name__, v)
    return ("ok", norm(value))


def test_helpers_behave_as_vllm():
    from vllm.v1.kv_offload.cpu.policies import base as vpolicies

    from kvcy.kv_offload.cpu.policies import base as kpolicies

    vcases = _helper_cases(vbase, vcommon, vpolicies)
    kcases = _helper_cases(kbase, kcommon, kpolicies)
    assert set(HELPER_ALLOWED) <= set(vcases)
    for name in vcases:
        got_v, got_k = _helper_outcome(vcases[name]), _helper_outcome(kcases[name])
        if name in HELPER_ALLOWED:
            assert got_k[0] == "raise" or got_k == got_v, (name, got_v, got_k)
            if name.startswith("gpu_spec_bad"):
                assert got_k[:2] == got_v[:2] == ("raise", "AssertionError")
        else:
            assert got_v == got_k, (name, got_v, got_k)


def test_canonical_kv_caches_as_vllm():
    """CanonicalKVCacheTensor / Ref / Caches: same fields and construction from tensors."""
    import torch

    from kvcy.kv_offload import canonical

    tensor = torch.zeros((4, 32), dtype=torch.int8)
    for mod in (vbase, canonical):
        caches = mod.CanonicalKVCaches(tensors=[mod.CanonicalKVCacheTensor(tensor=tensor, page_size_bytes=32)],
                                       group_data_refs=[[mod.CanonicalKVCacheRef(tensor_idx=0, page_size_bytes=16)]])
        assert caches.tensors[0].tensor is tensor and caches.group_data_refs[0][0].mapping is None
    assert [f.name for f in dataclasses.fields(canonical.CanonicalKVCacheRef)] == \
        [f.name for f in dataclasses.fields(vbase.CanonicalKVCacheRef)]


#: Constructor arguments kvcy refuses (TypeError / ValueError) where vLLM stores them as given.
CTOR_ALLOWED = {
    "threshold_bool": "a bool store_threshold (vLLM: True, i.e. 1); kvcy: TypeError",
    "chunks_bool": "a bool num_chunks; kvcy: TypeError",
    "threshold_negative": "a negative store_threshold (vLLM: stores every offer); kvcy: ValueError",
    "chunks_negative": "a negative num_chunks; kvcy: ValueError",
    "chunks_float": "a float num_chunks; kvcy: TypeError",
}


def test_constructor_arguments_as_vllm():
    cases = {
        "events_int": dict(num_chunks=2, enable_events=1),
        "events_str": dict(num_chunks=2, enable_events="x"),
        "events_zero": dict(num_chunks=2, enable_events=0),
        "tracker_zero": dict(num_chunks=2, max_tracker_size=0, store_threshold=2),
        "threshold_bool": dict(num_chunks=2, store_threshold=True),
        "chunks_bool": dict(num_chunks=True),
        "threshold_negative": dict(num_chunks=2, store_threshold=-1),
        "chunks_negative": dict(num_chunks=-1),
        "chunks_float": dict(num_chunks=2.0),
        "policy_case": dict(num_chunks=2, cache_policy="ARC"),
        "policy_none": dict(num_chunks=2, cache_policy="lru", cache_policy_module_path=None),
    }

    def build(cls, kwargs):
        try:
            m = cls(**kwargs)
        except Exception as exc:  # noqa: BLE001 - compared
            return ("raise", type(exc).__name__, str(exc))
        return ("ok", m.events, m.store_threshold, m.max_tracker_size, m.counts is not None,
                m._policy.cache_capacity, type(m._policy).__name__)

    for name, kwargs in cases.items():
        got_v = build(vmanager.CPUOffloadingManager, kwargs)
        got_k = build(_fast.offload.CPUOffloadingManager, kwargs)
        if name in CTOR_ALLOWED:
            assert got_v[0] == "ok" and got_k[0] == "raise" and got_k[1] in ("TypeError", "ValueError"), name
        else:
            assert got_v == got_k, (name, got_v, got_k)


def test_vllm_cpu_offloading_info_serves_as_info():
    """vLLM's spec builds the manager with vLLM's CPUOffloadingInfo: kvcy's manager reports it."""
    info = vcommon.CPUOffloadingInfo(cpu_num_chunks=4, cpu_blocks_per_chunk=2, cpu_kv_cache_size_bytes=64,
                                     cpu_kv_cache_size_tokens=None)
    got = _fast.offload.CPUOffloadingManager(4, info=info).config_info()
    assert got == vmanager.CPUOffloadingManager(4, info=info).config_info()


def _offloading_config(cfg_mod, extra):
    return cfg_mod.OffloadingConfig(
        groups=(cfg_mod.OffloadingGroupConfig(16, ("l0",), 0), cfg_mod.OffloadingGroupConfig(32, ("l1",), 1, 2)),
        worker_kv_bytes_per_block=4096, enable_kv_cache_events=True, extra_config=extra, engine_id="e",
        model=cfg_mod.OffloadingModelConfig("m", "float16", 1024), cache=cfg_mod.OffloadingCacheConfig(16, 4),
        parallel=cfg_mod.OffloadingParallelConfig(0, 1, 1, 1, 1, 1, 0, 1, None, True))


@pytest.mark.parametrize("extra", [{}, {"offload_prompt_only": False, "self_describing_kv_events": 1}])
def test_offloading_spec_reads_its_config_as_vllm(extra):
    from vllm.v1.kv_offload import config as vconfig

    from kvcy.kv_offload import config as kconfig

    def attrs(base, cfg_mod):
        class Spec(base.OffloadingSpec):
            def get_manager(self):
                return None

            def get_worker(self, kv_caches):
                return None

        spec = Spec(_offloading_config(cfg_mod, extra))
        return (spec.extra_config, spec.replicated_layout, spec.kv_events_config.enable_kv_cache_events,
                spec.kv_events_config.self_describing_kv_events, spec.offload_prompt_only, spec.tokens_per_block,
                spec.tokens_per_hash, spec.blocks_per_chunk, Spec.build_metric_definitions(extra),
                Spec.config_info_keys(extra))

    assert attrs(kbase, kconfig) == attrs(vbase, vconfig)
