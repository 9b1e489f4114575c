"""The compiled and pure-Python offloading twins, driven side by side (a hypothesis state machine).

A hypothesis state machine runs the same random sequences of calls on a
``CPUOffloadingManager`` of each twin: several requests (each twin gets its own
``ReqContext`` per request, with the same key positions), lookups, loads and
pin-only reads, touches, load completions, offers (prefixes of a few key chains,
some shuffled, over one or two KV cache groups), successful and failed store
completions, request ends, resets, events and stats, with both policies, store
thresholds 0 to 2, small trackers and capacities small enough that nearly
every store evicts.  Mostly legal calls, with some illegal ones (unknown or
unready keys, extra unpins, offers after a request finished): every result,
event and exception (type and message) must be the same, and after every step
so must the chunk bookkeeping that the golden ``check`` observes (section 5.6
of the golden README) and the stats accumulators.

A second test tampers with every attribute Python can reach on the compiled
classes and then calls every public method with good and bad arguments, in a
subprocess: it may raise, but the interpreter must not crash.
"""

from __future__ import annotations

import random
import subprocess
import sys
import textwrap

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from kvcy import _fast
from kvcy.kv_offload.base import ReqContext, ScheduleEndContext, make_offload_key
from kvcy.testing.golden import encode_offload_event, offload_check_state

pytestmark = pytest.mark.skipif(
    "cython" not in _fast.available(), reason="compiled twins not built (nothing to compare)"
)

CHAINS = 3
CHAIN_LEN = 5
TOKENS_PER_CHUNK = 16
REQS = ("a", "b", "c", "d")


def _key(chain: int, index: int, group: int) -> bytes:
    return make_offload_key(f"c{chain}.{index}".encode(), group)


def _outcome(call):
    """What a call did, comparable across twins: ("ok", normalized value) or ("raise", type, message)."""
    try:
        value = call()
    except Exception as exc:  # noqa: BLE001 - the exception itself is compared
        return ("raise", type(exc).__name__, str(exc))
    return ("ok", _normal(value))


def _normal(value):
    if value is None or isinstance(value, (bool, int, float, str, bytes)):
        return value
    if hasattr(value, "keys_to_store"):  # PrepareStoreOutput
        return (
            "store",
            list(value.keys_to_store),
            value.store_spec.block_ids.tolist(),
            list(value.evicted_keys),
        )
    if hasattr(value, "block_ids"):  # CPULoadStoreSpec
        return ("spec", value.block_ids.tolist(), str(value.block_ids.dtype))
    if hasattr(value, "policy"):  # RequestOffloadingContext
        return ("req", value.policy.value)
    if hasattr(value, "name") and hasattr(value, "value"):  # an enum member
        return (type(value).__name__, value.name)
    if hasattr(value, "data") and isinstance(getattr(value, "data"), dict):  # stats
        return {name: dict(by_label) for name, by_label in value.data["data"].items()}
    if isinstance(value, list):
        return [_normal(v) for v in value]
    raise TypeError(f"cannot compare a {type(value).__name__}")


PICKS = st.lists(st.integers(0, 10**6), min_size=1, max_size=6)


def _pick(pool: list, picks: list[int]) -> list:
    """Keys of ``pool`` chosen by ``picks`` (indices, taken modulo the pool size)."""
    return [pool[i % len(pool)] for i in picks]


def _bookkeeping(manager) -> dict:
    state = offload_check_state(manager)
    state["allocation_sizes"] = list(manager.allocation_sizes_in_current_batch)
    state["stores_skipped"] = manager.stores_skipped_in_current_batch
    state["queued_events"] = None if manager.events is None else len(manager.events)
    return state


class TwinOffloadMachine(RuleBasedStateMachine):
    def __init__(self):
        super().__init__()
        self.cy_mod = _fast.load("cython")["offload"]
        self.py_mod = _fast.load("python")["offload"]
        self.groups = 1
        self.ctx: dict[str, tuple[ReqContext, ReqContext]] = {}

    # -- set-up ----------------------------------------------------------------------
    @initialize(
        policy=st.sampled_from(["lru", "arc"]),
        num_chunks=st.sampled_from([0, 1, 2, 3, 3, 4, 4, 5]),
        events=st.booleans(),
        threshold=st.sampled_from([0, 1, 1, 2, 3]),
        tracker=st.integers(1, 8),
        groups=st.integers(1, 2),
    )
    def setup(self, policy, num_chunks, events, threshold, tracker, groups):
        kwargs = dict(
            num_chunks=num_chunks,
            cache_policy=policy,
            enable_events=events,
            store_threshold=threshold,
            max_tracker_size=tracker,
        )
        self.cy = self.cy_mod.CPUOffloadingManager(**kwargs)
        self.py = self.py_mod.CPUOffloadingManager(**kwargs)
        self.groups = groups
        for req in REQS:
            self._new_context(req)

    # -- helpers ----------------------------------------------------------------------
    def _new_context(self, req: str) -> None:
        self.ctx[req] = (ReqContext(req_id=req), ReqContext(req_id=req))

    def _both(self, method: str, req: str | None, *args, **kwargs):
        out = []
        for i, manager in enumerate((self.cy, self.py)):
            call_args = args if req is None else (*args, self.ctx[req][i])
            out.append(_outcome(lambda: getattr(manager, method)(*call_args, **kwargs)))
        assert out[0] == out[1], (method, req, args, kwargs, out)
        return out[1]

    def _chain_keys(self, chain: int, start: int, stop: int) -> list[bytes]:
        return [_key(chain, i, g) for i in range(start, stop) for g in range(self.groups)]

    def _resident(self) -> dict[bytes, int]:
        policy = self.py._policy
        items = (
            list(policy.t1.items()) + list(policy.t2.items())
            if hasattr(policy, "t1")
            else list(policy.chunks.items())
        )
        return {k: c.ref_cnt for k, c in items}

    # -- rules ---------------------------------------------------------------------------
    @rule(req=st.sampled_from(REQS), fresh=st.booleans(), positions=st.integers(0, 2))
    def arrive(self, req, fresh, positions):
        """A (new) request context, with all, some or none of its key positions, and on_new_request."""
        if fresh:
            self._new_context(req)
            if positions:
                for chain in range(CHAINS):
                    self.set_positions(req, chain, CHAIN_LEN, 0 if positions == 2 else 1)
        self._both("on_new_request", req)

    @rule(req=st.sampled_from(REQS), chain=st.integers(0, CHAINS - 1), upto=st.integers(1, CHAIN_LEN),
          partial=st.integers(0, 3))
    def set_positions(self, req, chain, upto, partial):
        for i in range(upto):
            if partial == 0 and i % 2:
                continue  # some keys without a position
            for g in range(self.groups):
                for c in self.ctx[req]:
                    c.set_offload_key_position(_key(chain, i, g), (i + 1) * TOKENS_PER_CHUNK)

    @rule(req=st.sampled_from(REQS), chain=st.integers(0, CHAINS - 1), start=st.integers(0, CHAIN_LEN - 1),
          length=st.integers(1, CHAIN_LEN), shuffle=st.integers(0, 3), complete=st.integers(0, 5))
    def store(self, req, chain, start, length, shuffle, complete):
        """An offer; then (mostly) its completion, successful or not, whole or in part."""
        keys = self._chain_keys(chain, start, min(start + length, CHAIN_LEN))
        if shuffle == 0:
            random.Random(start * 31 + length).shuffle(keys)
        out = self._both("prepare_store", req, keys)
        if out[0] != "ok" or out[1] is None or complete == 0:
            return
        to_store = out[1][1]
        if complete == 1:
            to_store = to_store[: len(to_store) // 2] + keys[:1]  # part, plus an ignored key
        self._both("complete_store", req, to_store, success=complete != 2)

    @rule(req=st.sampled_from(REQS), chain=st.integers(0, CHAINS - 1), upto=st.integers(1, CHAIN_LEN))
    def store_prefix(self, req, chain, upto):
        """The connector's pattern: the whole prefix offered again, then completed."""
        keys = self._chain_keys(chain, 0, upto)
        out = self._both("prepare_store", req, keys)
        if out[0] == "ok" and out[1] is not None:
            self._both("complete_store", req, out[1][1])

    @rule(req=st.sampled_from(REQS), picks=PICKS, success=st.integers(0, 3))
    def complete_pending(self, req, picks, success):
        pending = sorted(k for k, r in self._resident().items() if r < 0)
        keys = _pick(pending + self._chain_keys(picks[0] % CHAINS, 0, 2), picks)
        self._both("complete_store", req, keys, success=success != 0)

    @rule(req=st.sampled_from(REQS), chain=st.integers(0, CHAINS - 1), upto=st.integers(1, CHAIN_LEN),
          record=st.integers(0, 4), complete=st.integers(0, 5))
    def load(self, req, chain, upto, record, complete):
        """Lookups of a prefix until the first miss, a load of the hits, maybe its completion."""
        hits = []
        for key in self._chain_keys(chain, 0, upto):
            got = self._both("lookup", req, key)
            if got != ("ok", ("LookupResult", "HIT")):
                break
            hits.append(key)
        if not hits:
            return
        if record:
            out = self._both("prepare_load", req, hits)
        else:
            out = self._both("_prepare_load", req, hits, record_access=False)
        if complete and out[0] == "ok":
            self._both("complete_load", req, hits)

    @rule(req=st.sampled_from(REQS), picks=PICKS, record=st.booleans(), complete=st.integers(0, 3))
    def load_any(self, req, picks, record, complete):
        """prepare_load of any resident or unknown keys (not-ready and missing keys raise)."""
        keys = _pick(sorted(self._resident()) + self._chain_keys(picks[0] % CHAINS, 0, 2), picks)
        if record:
            out = self._both("prepare_load", req, keys)
        else:
            out = self._both("_prepare_load", req, keys, record_access=False)
        if complete and out[0] == "ok":
            self._both("complete_load", req, keys)

    @rule(req=st.sampled_from(REQS), picks=PICKS)
    def complete_load(self, req, picks):
        pinned = sorted(k for k, r in self._resident().items() for _ in range(max(r, 0)))
        keys = _pick(pinned + self._chain_keys(0, 0, 1), picks[:4])
        self._both("complete_load", req, keys)

    @rule(req=st.sampled_from(REQS), picks=PICKS)
    def touch(self, req, picks):
        """A touch of resident keys and others (ARC: ghost hits), in any order."""
        universe = [k for c in range(CHAINS) for k in self._chain_keys(c, 0, CHAIN_LEN)]
        keys = _pick(sorted(self._resident()) * 2 + universe, picks)
        self._both("touch", req, list(dict.fromkeys(keys)))

    @rule(req=st.sampled_from(REQS))
    def finish(self, req):
        self._both("on_request_finished", req)

    @rule(which=st.integers(0, 9))
    def reset_cache(self, which):
        if which == 0:  # rare: a reset empties everything
            self._both("reset_cache", None)

    @rule(stats=st.booleans())
    def step_end(self, stats):
        self._both("on_schedule_end", None, ScheduleEndContext(new_req_ids=[], preempted_req_ids=[]))
        got = [[encode_offload_event(e) for e in m.take_events()] for m in (self.cy, self.py)]
        assert got[0] == got[1]
        if stats:
            self._both("get_stats", None)

    # -- after every step ----------------------------------------------------------
    @invariant()
    def same_bookkeeping(self):
        if not hasattr(self, "cy"):
            return
        assert _bookkeeping(self.cy) == _bookkeeping(self.py)


TwinOffloadMachine.TestCase.settings = settings(
    max_examples=50,
    stateful_step_count=60,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
test_twins_agree_on_random_sequences = TwinOffloadMachine.TestCase


def _random_step(machine: TwinOffloadMachine, rng: random.Random) -> None:
    """One step of the machine's rules, with arguments drawn from ``rng``."""
    req = rng.choice(REQS)
    chain = rng.randrange(CHAINS)

    def picks() -> list[int]:
        return [rng.randrange(10**6) for _ in range(rng.randint(1, 6))]

    steps = [
        (4, lambda: machine.store(req, chain, rng.randrange(CHAIN_LEN), rng.randint(1, CHAIN_LEN),
                                  rng.randrange(4), rng.randrange(6))),
        (3, lambda: machine.store_prefix(req, chain, rng.randint(1, CHAIN_LEN))),
        (3, lambda: machine.load(req, chain, rng.randint(1, CHAIN_LEN), rng.randrange(5), rng.randrange(6))),
        (2, lambda: machine.arrive(req, rng.random() < 0.5, rng.randrange(3))),
        (1, lambda: machine.set_positions(req, chain, rng.randint(1, CHAIN_LEN), rng.randrange(4))),
        (2, lambda: machine.complete_pending(req, picks(), rng.randrange(4))),
        (1, lambda: machine.load_any(req, picks(), rng.random() < 0.5, rng.randrange(4))),
        (2, lambda: machine.complete_load(req, picks())),
        (2, lambda: machine.touch(req, picks())),
        (2, lambda: machine.finish(req)),
        (1, lambda: machine.reset_cache(rng.randrange(10))),
        (2, lambda: machine.step_end(rng.random() < 0.5)),
    ]
    rng.choices([f for _, f in steps], weights=[w for w, _ in steps])[0]()


@pytest.mark.parametrize("policy", ["lru", "arc"])
@pytest.mark.parametrize("seed", range(4))
def test_twins_agree_on_long_random_walks(policy, seed):
    """Longer seeded walks through the same rules (deeper states than short examples reach:
    steady eviction, ARC ghosts and target moves, LRU request ranks raised by later requests)."""
    rng = random.Random(seed * 7919 + (policy == "arc"))
    machine = TwinOffloadMachine()
    machine.setup(policy, rng.choice([2, 3, 4, 5]), rng.random() < 0.7, rng.choice([0, 1, 2, 3]),
                  rng.randint(2, 10), rng.randint(1, 2))
    for _ in range(600):
        _random_step(machine, rng)
        machine.same_bookkeeping()


# =============================================================================
# A policy written in Python, on the compiled manager (the factory's path)
# =============================================================================
class FIFOPolicy(_fast.load("cython")["offload"].CachePolicy if "cython" in _fast.available() else object):
    """First in, first out: a Python subclass of the compiled twin's CachePolicy."""

    def __init__(self, cache_capacity):
        super().__init__(cache_capacity)
        self.order = {}

    def get(self, key):
        return self.order.get(key)

    def insert(self, key, chunk, req_context):
        self.order[key] = chunk

    def remove(self, key):
        del self.order[key]

    def touch(self, keys, req_context):
        pass

    def evict(self, n, protected):
        out = [(k, c) for k, c in self.order.items() if c.ref_cnt == 0 and k not in protected][:n]
        if len(out) < n:
            return None
        for k, _ in out:
            del self.order[k]
        return out

    def clear(self):
        self.order.clear()


@pytest.mark.skipif(_fast.IMPLEMENTATION != "cython",
                    reason="the factory takes subclasses of the live twin's CachePolicy: here the Python one")
def test_python_policy_subclass_runs_on_both_managers():
    """A registered-by-module Python policy: the compiled manager calls its methods and
    decides exactly as the pure-Python manager does with the same policy."""
    results = []
    for impl in ("cython", "python"):
        mod = _fast.load(impl)["offload"]
        manager = mod.CPUOffloadingManager(3, cache_policy="FIFOPolicy", cache_policy_module_path=__name__,
                                           enable_events=True)
        assert type(manager._policy) is FIFOPolicy
        ctx = ReqContext(req_id="r")
        keys = [_key(0, i, 0) for i in range(6)]
        out = []
        for i in range(0, 6, 2):
            got = manager.prepare_store(keys[i : i + 2], ctx)
            out.append(_normal(got))
            if got is not None:
                manager.complete_store(got.keys_to_store[:1], ctx)
                manager.complete_store(got.keys_to_store[1:], ctx, success=False)
        out.append(_normal(manager.prepare_load(keys[4:5], ctx)))
        out.append(_outcome(lambda: manager.prepare_load(keys[:1], ctx)))
        out.append(_normal(manager.prepare_store(keys[:2], ctx)))
        manager.complete_load(keys[4:5], ctx)
        manager.on_request_finished(ctx)
        out.append([encode_offload_event(e) for e in manager.take_events()])
        out.append({
            "resident": [(k, c.chunk_id, c.ref_cnt) for k, c in manager._policy.order.items()],
            "free_list": list(manager._free_list),
            "num_allocated_chunks": manager._num_allocated_chunks,
            "num_evictable": manager._num_evictable_cache_chunks,
            "num_write_pending": manager._num_write_pending_chunks,
        })
        results.append(out)
    assert results[0] == results[1]
    assert results[0][-1]["num_allocated_chunks"] == 3
    assert any(step[3] for step in results[0][:3] if step)  # an offer evicted (FIFO order)


# =============================================================================
# Tampering with the compiled classes never crashes the interpreter
# =============================================================================
_TAMPER_SCRIPT = textwrap.dedent(
    r'''
    import itertools
    from kvcy import _fast
    from kvcy.kv_offload.base import ReqContext, make_offload_key

    mod = _fast.load("cython")["offload"]
    BAD = [None, 0, -1, 1, 2**70, -(2**70), 1.5, "x", b"x", b"\x00" * 4, [], [b"k" * 8], {}, object(),
           ReqContext(req_id="t")]
    ctx = ReqContext(req_id="r")
    keys = [make_offload_key(b"h%d" % i, i % 2) for i in range(8)]
    for i, k in enumerate(keys):
        ctx.set_offload_key_position(k, 16 * (i + 1))

    def attempt(fn, *args, **kwargs):
        try:
            out = fn(*args, **kwargs)
            if hasattr(out, "__next__"):
                list(itertools.islice(out, 100))
        except Exception:
            pass

    def tamper(obj):
        for name in dir(obj):
            if name.startswith("__"):
                continue
            for value in BAD:
                attempt(setattr, obj, name, value)
                attempt(delattr, obj, name)

    def call_everything(obj):
        for name in dir(obj):
            if name.startswith("__") or name in ("lock",):
                continue
            fn = getattr(obj, name, None)
            if not callable(fn):
                continue
            arg_sets = [(), (keys[0],), (keys, ctx), (keys[:3], ctx), (keys[0], ctx)]
            arg_sets += [(bad,) for bad in BAD] + [(bad, ctx) for bad in BAD] + [(keys, bad) for bad in BAD]
            arg_sets += [(keys, ctx, bad) for bad in BAD]
            arg_sets += [([keys[:2], keys[2:]], set(keys[:3]), set(keys[3:]), ctx), (3, set(keys)), (2, BAD),
                         (keys[1], mod.ChunkStatus(1), ctx), (keys[2], mod.ChunkStatus(2**40), ctx)]
            for args in arg_sets:
                attempt(fn, *args)
            attempt(fn, keys, ctx, record_access=False)
            attempt(fn, keys, ctx, success=False)

    def legal_round(m, ctx):
        attempt(m.on_new_request, ctx)
        attempt(m.prepare_store, keys[:5], ctx)
        attempt(m.complete_store, keys[:3], ctx)
        attempt(m.complete_store, keys[3:5], ctx, success=False)
        attempt(m.prepare_load, keys[:2], ctx)
        attempt(m.touch, keys, ctx)
        attempt(m.prepare_store, keys[4:], ctx)
        attempt(m.complete_load, keys[:2], ctx)
        attempt(m.on_request_finished, ctx)
        attempt(lambda: list(m.take_events()))
        attempt(m.get_stats)

    for policy in ("lru", "arc"):
        for n in (0, 1, 3):
            m = mod.CPUOffloadingManager(n, policy, enable_events=True, store_threshold=2, max_tracker_size=3)
            legal_round(m, ctx)
            tamper(m)
            call_everything(m)
            pol = m._policy
            tamper(pol)
            call_everything(pol)           # the manager's own policy, behind its back
            for name in ("chunks", "t1", "t2", "b1", "b2"):
                view = getattr(pol, name, None)
                if view is not None:
                    attempt(lambda: view.__setitem__(keys[0], 5))
                    attempt(lambda: view.clear())
            for k in keys:
                chunk = pol.get(k)
                if chunk is not None:
                    tamper(chunk)
                    other = mod.LRUCachePolicy(4)
                    attempt(other.insert, k, chunk, ctx)   # a chunk owned by another policy
            legal_round(m, ctx)
            legal_round(m, ReqContext(req_id="fresh"))
            attempt(m.reset_cache)
            legal_round(m, ReqContext(req_id="after"))
            call_everything(m)
        for cls in (mod.LRUCachePolicy, mod.ARCCachePolicy, mod.CachePolicy):
            for cap in (0, 2):
                p = cls(cap)
                tamper(p)
                call_everything(p)
                shared = mod.ChunkStatus(0)
                attempt(p.insert, keys[0], shared, ctx)
                attempt(p.insert, keys[1], shared, ctx)       # the same chunk twice
                attempt(p.insert, keys[0], mod.ChunkStatus(1), ctx)  # the same key twice
                attempt(p.evict, 1, [keys[0], "x", object()])
                attempt(p.remove, keys[0])
                attempt(p.remove, keys[0])
                attempt(p.clear)
                call_everything(p)
        for name in dir(mod):             # module-level helpers, built from Python
            helper = getattr(mod, name)
            if isinstance(helper, type) and name.startswith("_"):
                obj = None
                attempt(lambda: helper())
                try:
                    obj = helper.__new__(helper)
                except Exception:
                    pass
                if obj is not None:
                    forged = ReqContext(req_id="forged")
                    attempt(forged.set_state, obj)
                    m = mod.CPUOffloadingManager(2, policy)
                    legal_round(m, forged)
                    tamper(obj)
                    call_everything(obj)
        c = mod.ChunkStatus(3)
        tamper(c)
        call_everything(c)
        attempt(mod.order_request_keys, [keys[:2], keys[2:]], ctx)
        attempt(mod.order_request_keys, [[1, 2]], ctx)
        attempt(mod.order_request_keys, None, ctx)
    print("survived")
    '''
)


def test_tampering_with_compiled_classes_never_crashes():
    proc = subprocess.run(
        [sys.executable, "-c", _TAMPER_SCRIPT], capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, (proc.returncode, proc.stderr[-2000:])
    assert "survived" in proc.stdout


# =============================================================================
# Objects made by __new__ alone (no __init__) never crash the interpreter
# =============================================================================
_BARE_SCRIPT = textwrap.dedent(
    r"""
    from kvcy import _fast
    from kvcy.kv_offload.base import ReqContext

    mod = _fast.load("cython")["offload"]
    key = b"abcdefgh" + bytes(4)
    ctx = ReqContext(req_id="bare")

    class Req:
        num_tokens = 64
        num_computed_tokens = 0
        block_hashes = [bytes([i]) * 8 for i in range(8)]

    def calls(fns):
        for fn in fns:
            try:
                fn()
            except Exception:
                pass

    for cls in (mod.LRUCachePolicy, mod.ARCCachePolicy):
        p = cls.__new__(cls)
        calls([lambda: p.insert(key, mod.ChunkStatus(0), ctx), lambda: p.get(key),
               lambda: p.touch([key], ctx), lambda: p.evict(1, set()), lambda: p.remove(key),
               lambda: p.clear()])
    m = mod.CPUOffloadingManager.__new__(mod.CPUOffloadingManager)
    calls([lambda: m.lookup(key, ctx), lambda: m.count_hits([key], ctx, 0, 1),
           lambda: m.prepare_store([key], ctx), lambda: m.get_stats(), lambda: m.reset_cache(),
           lambda: list(m.take_events())])
    live = mod.ReplayConnector(mod.CPUOffloadingManager(8), 8)
    st = live.new_request("a", 64, 0)
    bare = mod.ReplayConnector.__new__(mod.ReplayConnector)
    calls([lambda: bare.new_request("b", 64, 1), lambda: bare.lookup(st, Req(), 0, []),
           lambda: bare.allocated(st, 0, []), lambda: bare.build_connector_meta([], []),
           lambda: bare.step_end(), lambda: bare.end_previous([])])
    bare_req = mod.ConnectorRequest.__new__(mod.ConnectorRequest)
    calls([lambda: live.lookup(bare_req, Req(), 0, []), lambda: live.allocated(bare_req, 0, []),
           lambda: live.finished(bare_req), lambda: live.step_end(),
           lambda: live.end_previous([]), lambda: bare_req.num_keys])
    print("survived")
    """
)


def test_compiled_classes_made_by_new_alone_never_crash():
    # Before their fields were set in __cinit__: the policies and the manager
    # segfaulted (None maps and lists read in C), a bare ReplayConnector raised
    # SIGFPE (a division by its block size of 0, cdivision on).
    proc = subprocess.run(
        [sys.executable, "-c", _BARE_SCRIPT], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, (proc.returncode, proc.stderr[-2000:])
    assert "survived" in proc.stdout


# =============================================================================
# Chunks outside the cycle collector (compiled twin)
# =============================================================================
_DROP_SCRIPT = textwrap.dedent(
    """
    import gc, sys
    from kvcy._fast import _offload_c as m
    from kvcy.kv_offload.base import ReqContext, make_offload_key

    assert not gc.is_tracked(m.ChunkStatus(0))
    for policy in ("lru", "arc"):
        keys = [make_offload_key(i.to_bytes(8, "big"), 0) for i in range(200_000)]
        before = [sys.getrefcount(k) for k in keys[:: 997]]
        manager = m.CPUOffloadingManager(num_chunks=100_000, cache_policy=policy)
        ranked = ReqContext(req_id="ranked")
        for i, k in enumerate(keys[:50_000]):
            ranked.set_offload_key_position(k, 16 * (i + 1))
        for start in range(0, len(keys), 10_000):  # fresh and ranked keys; ARC ghosts
            ctx = ranked if start < 50_000 else ReqContext(req_id=str(start))
            out = manager.prepare_store(keys[start : start + 10_000], ctx)
            manager.complete_store(out.keys_to_store, ctx)
        held = manager._policy.get(keys[-1])   # a chunk that outlives its policy
        del manager, ranked, ctx, out
        gc.collect()
        after = [sys.getrefcount(k) for k in keys[:: 997]]
        assert after == before, (policy, sum(a - b for a, b in zip(after, before)))
        assert held.chunk_id >= 0
    print("released")
    """
)


def test_dropped_policies_release_every_chunk_and_ghost():
    """_Node / ChunkStatus / _DList are untracked by the cycle collector (allocation speed):
    dropping a manager whose lists hold 100,000 linked chunks (and ARC ghosts) must unlink
    them all (no leaked cycle) without a deep chain of deallocations (no stack overflow)."""
    proc = subprocess.run([sys.executable, "-c", _DROP_SCRIPT], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, (proc.returncode, proc.stderr[-2000:])
    assert "released" in proc.stdout


class _MeddlingKey(bytes):
    """A positions-dict key equal to a plain key, whose ``__eq__`` removes resident keys."""

    victims: list = []
    policy = None

    def __eq__(self, other):
        while self.victims:
            key = self.victims.pop()
            if self.policy.get(key) is not None:
                self.policy.remove(key)
        return bytes.__eq__(self, other)

    __hash__ = bytes.__hash__


@pytest.mark.parametrize("twin", ["cython", "python"])
def test_lru_offer_survives_position_lookups_that_remove_keys(twin):
    """prepare_store inserts an offer's keys into the LRU's ordered set with the previous key
    as hint; Python code run by a position lookup (a bytes subclass's __eq__) that takes
    entries out of the set must not leave a stale hint (the compiled twin would crash)."""
    mod = _fast.load(twin)["offload"]
    manager = mod.CPUOffloadingManager(num_chunks=64, cache_policy="lru")
    ctx = ReqContext(req_id="a")
    first = [_key(1, i, 0) for i in range(8)]
    for i, k in enumerate(first):
        ctx.set_offload_key_position(k, 16 * (i + 1))
    out = manager.prepare_store(first, ctx)
    manager.complete_store(out.keys_to_store, ctx)
    offer = [_key(2, i, 0) for i in range(8)]
    _MeddlingKey.policy = manager._policy
    _MeddlingKey.victims = list(first) + [offer[2]]  # offer[2]: the hint when offer[3] is placed
    for i, k in enumerate(offer):
        # the meddling twin of the 4th key is what the positions dict holds
        ctx._offload_key_positions[_MeddlingKey(k) if i == 3 else k] = 16 * (9 + i)
    out = manager.prepare_store(offer, ctx)
    assert out.keys_to_store == offer
    assert not _MeddlingKey.victims
    kept = offer[:2] + offer[3:]
    assert sorted(manager._policy.chunks) == sorted(kept)
    manager.complete_store(offer, ctx)
    # ranked with the request, tail first: the set's order is intact
    assert [k for k, _ in manager._policy.evict(7, set())] == kept[::-1]
