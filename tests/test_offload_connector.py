"""The replay's offloading connector (``ReplayConnector``): both twins decide and refuse alike."""

from __future__ import annotations

import hashlib
from types import SimpleNamespace

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvcy import _fast
from kvcy.kv_offload import make_offload_key

HAS_COMPILED = not _fast.NO_EXTENSIONS and "cython" in _fast.available()
needs_compiled = pytest.mark.skipif(not HAS_COMPILED, reason="needs the compiled twins")

BS = 4  # tokens per block


def _hash(prefix: int, i: int) -> bytes:
    return hashlib.sha256(b"%d/%d" % (prefix, i)).digest()


class _Entry:
    """A scheduled-list entry as the replay's (``off``: the connector's request)."""

    __slots__ = ("off",)

    def __init__(self, off):
        self.off = off


def _connector(impl, num_chunks=16, policy="lru"):
    mod = _fast.load(impl)["offload"]
    return mod.ReplayConnector(mod.CPUOffloadingManager(num_chunks, cache_policy=policy), BS)


def _request(prefix: int, num_tokens: int, shared: int = 0):
    """A request whose first ``shared`` blocks are common to every prefix, then ``prefix``'s own."""
    n = num_tokens // BS
    hashes = [_hash(-1, i) if i < shared else _hash(prefix, i) for i in range(n)]
    return SimpleNamespace(num_tokens=num_tokens, block_hashes=hashes, num_computed_tokens=0)


class _Driver:
    """One twin's connector (and manager) driven by an operation list; what it observed, as plain data.

    Operations: ``("new", prefix, num_tokens, shared, gpu_blocks, alloc)`` makes
    a request and admits it (``lookup`` after a GPU hit of ``gpu_blocks``, then
    ``allocated`` if ``alloc``); ``("readmit", r, gpu_blocks, alloc)`` admits
    request ``r`` again (as after a preemption); ``("step", n, end)`` schedules
    every admitted, unfinished request for up to ``n`` tokens
    (``build_connector_meta``), then ``step_end`` if ``end``; ``("finish", r)``;
    ``("flush",)``: ``end_previous``.
    """

    def __init__(self, impl, num_chunks, policy):
        self.conn = _connector(impl, num_chunks, policy)
        self.reqs: list = []
        self.states: list = []
        self.entries: list = []
        self.admitted: list[bool] = []
        self.log: list = []

    def _call(self, dec, fn, *args):
        try:
            out = fn(*args)
        except Exception as e:  # noqa: BLE001 - the twins must fail alike
            self.log.append(("raised", fn.__name__, type(e).__name__, str(e), list(dec)))
            return None
        self.log.append(("ok", fn.__name__, out if out is None or type(out) is int else type(out).__name__,
                         list(dec)))
        return out

    def _admit(self, r, gpu_blocks, alloc):
        req = self.reqs[r]
        gpu_hit = min(gpu_blocks * BS, req.num_tokens)
        dec: list[int] = []
        ext = self._call(dec, self.conn.lookup, self.states[r], req, gpu_hit, dec)
        if ext is None or not alloc:
            return
        dec = []
        self._call(dec, self.conn.allocated, self.states[r], gpu_hit + ext, dec)
        req.num_computed_tokens = gpu_hit + ext
        self.admitted[r] = True

    def run(self, op) -> None:
        kind = op[0]
        if kind == "new":
            _, prefix, num_tokens, shared, gpu_blocks, alloc = op
            dec: list[int] = []
            st_ = self._call(dec, self.conn.new_request, f"r{len(self.reqs)}", num_tokens, len(self.reqs))
            self.reqs.append(_request(prefix, num_tokens, shared))
            self.states.append(st_)
            self.entries.append(_Entry(st_))
            self.admitted.append(False)
            self._admit(len(self.reqs) - 1, gpu_blocks, alloc)
        elif not self.reqs:
            return
        elif kind == "readmit":
            _, r, gpu_blocks, alloc = op
            r %= len(self.reqs)
            self.reqs[r].num_computed_tokens = 0
            self._admit(r, gpu_blocks, alloc)
        elif kind == "step":
            _, n, end = op
            scheduled = []
            for i, req in enumerate(self.reqs):
                if self.admitted[i]:
                    scheduled.append((self.entries[i], min(n, req.num_tokens - req.num_computed_tokens)))
            dec = []
            self._call(dec, self.conn.build_connector_meta, scheduled, dec)
            for i, req in enumerate(self.reqs):
                if self.admitted[i]:
                    req.num_computed_tokens += min(n, req.num_tokens - req.num_computed_tokens)
            if end:
                self._call([], self.conn.step_end)
        elif kind == "finish":
            r = op[1] % len(self.reqs)
            self.admitted[r] = False
            self._call([], self.conn.finished, self.states[r])
        else:  # "flush"
            dec = []
            self._call(dec, self.conn.end_previous, dec)

    def snapshot(self):
        c = self.conn
        m = c.manager
        return (
            self.log,
            (c.hit_blocks, c.blocks_loaded, c.blocks_stored, c.evictions, c.stores_refused, c.has_pending),
            [(s.next_stored, s.num_keys, s.prompt_blocks, s.index, dict(s.req_context._offload_key_positions))
             for s in self.states],
            (m._num_allocated_chunks, m._free_list, m._num_evictable_cache_chunks, m._num_write_pending_chunks),
        )


_ops = st.one_of(
    st.tuples(st.just("new"), st.integers(0, 3), st.integers(1, 40), st.integers(0, 8), st.integers(0, 4),
              st.booleans()),
    st.tuples(st.just("readmit"), st.integers(0, 15), st.integers(0, 4), st.booleans()),
    st.tuples(st.just("step"), st.integers(0, 24), st.sampled_from([True, True, False])),
    st.tuples(st.just("step"), st.integers(0, 24), st.sampled_from([True, True, False])),
    st.tuples(st.just("finish"), st.integers(0, 15)),
    st.tuples(st.just("flush")),
)


@needs_compiled
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=st.lists(_ops, min_size=5, max_size=60), num_chunks=st.integers(0, 48),
       policy=st.sampled_from(["lru", "arc"]))
def test_twins_make_identical_decisions(ops, num_chunks, policy):
    drivers = [_Driver(impl, num_chunks, policy) for impl in ("cython", "python")]
    for op in ops:
        for d in drivers:
            d.run(op)
    a, b = (d.snapshot() for d in drivers)
    assert a == b


def _key(h: bytes) -> bytes:
    return make_offload_key(h, 0)


def test_the_decision_codes_are_the_replays():
    from kvcy._fast.offload_py import offloading_connector as connector
    from kvcy.sim import scheduler

    names = ("CPU_LOOKUP", "CPU_LOAD", "CPU_STORE", "CPU_STORE_REFUSED", "CPU_FINISH")
    assert [getattr(connector, n) for n in names] == [getattr(scheduler, n) for n in names] == [11, 12, 13, 14, 15]
    # (the compiled twin's are C constants: the scenarios below read its decision lists as these numbers)


def test_a_stored_prompt_is_found_and_loaded_by_the_next_request(offload_impl):
    conn = offload_impl.ReplayConnector(offload_impl.CPUOffloadingManager(16, cache_policy="lru"), BS)
    a_req = _request(0, 24, shared=4)  # 6 blocks, the first 4 shared
    a = conn.new_request("a", 24, 0)
    dec: list[int] = []
    assert conn.lookup(a, a_req, 0, dec) == 0  # an empty tier
    assert dec == [11, 0, 0]  # CPU_LOOKUP, request 0, no hit (blocks 0..4 looked at, never 5: the last token's)
    assert a.num_keys == 6 == a.prompt_blocks  # every prompt key made, each with its end-token position
    positions = dict(a.req_context._offload_key_positions)
    assert positions == {_key(h): 4 * (i + 1) for i, h in enumerate(a_req.block_hashes)}
    dec = []
    conn.allocated(a, 0, dec)
    assert dec == [] and a.next_stored == 0
    entry = _Entry(a)
    dec = []
    conn.build_connector_meta([(entry, 10)], dec)  # 10 tokens: blocks 0 and 1 complete
    assert dec == [13, 0, 2, 0, 1, 0, 0]  # CPU_STORE, request 0, chunks [0, 1], nothing evicted
    a_req.num_computed_tokens = 10
    conn.step_end()
    dec = []
    conn.build_connector_meta([(entry, 14)], dec)
    assert dec == [13, 0, 4, 2, 3, 4, 5, 0, 0] and a.next_stored == 6
    a_req.num_computed_tokens = 24
    conn.step_end()
    dec = []
    conn.build_connector_meta([(entry, 1)], dec)  # decoding: nothing left to offer
    assert dec == []
    conn.finished(a)
    assert conn.has_pending
    conn.step_end()
    dec = []
    conn.build_connector_meta([], dec)  # the end of a request that finished in the previous step
    assert dec == [15, 0] and not conn.has_pending
    assert (conn.blocks_stored, conn.evictions, conn.stores_refused) == (6, 0, 0)

    b_req = _request(1, 21, shared=4)  # its first 4 blocks are a's
    b = conn.new_request("b", 21, 1)
    dec = []
    assert conn.lookup(b, b_req, 4, dec) == 12  # after 1 GPU-hit block: a's blocks 1..3 hit, b's block 4 misses
    assert dec == [11, 1, 3]
    dec = []
    conn.allocated(b, 16, dec)
    assert dec == [12, 1, 3, 1, 2, 3]  # CPU_LOAD, request 1, chunks [1, 2, 3]
    assert b.next_stored == 4 and conn.hit_blocks == 3 and conn.blocks_loaded == 0
    conn.step_end()
    assert conn.blocks_loaded == 3


def test_a_refused_offer_is_made_again(offload_impl):
    conn = offload_impl.ReplayConnector(offload_impl.CPUOffloadingManager(2, cache_policy="arc"), BS)
    req = _request(0, 16)
    st_ = conn.new_request("a", 16, 7)
    conn.lookup(st_, req, 0, [])
    conn.allocated(st_, 0, [])
    dec: list[int] = []
    conn.build_connector_meta([(_Entry(st_), 16)], dec)
    assert dec == [14, 7, 4] and conn.stores_refused == 1 and st_.next_stored == 0  # 4 blocks, 2 chunks
    req.num_computed_tokens = 16
    dec = []
    conn.build_connector_meta([(_Entry(st_), 0)], dec)  # (computed, nothing scheduled: offered again)
    assert dec == [14, 7, 4] and conn.stores_refused == 2


# --------------------------------------------------------------------------- refusals
class _Bad:
    off = None


_REQ = _request(0, 16)

BAD_CALLS = {
    "block_size 0": lambda m, c, s: m.ReplayConnector(c.manager, 0),
    "block_size str": lambda m, c, s: m.ReplayConnector(c.manager, "4"),
    "group_idx -1": lambda m, c, s: m.ReplayConnector(c.manager, 4, -1),
    "group_idx 2**32": lambda m, c, s: m.ReplayConnector(c.manager, 4, 1 << 32),
    "group_idx bool": lambda m, c, s: m.ReplayConnector(c.manager, 4, True),
    "ConnectorRequest()": lambda m, c, s: m.ConnectorRequest(),
    "new_request id": lambda m, c, s: c.new_request(1, 16, 0),
    "new_request tokens": lambda m, c, s: c.new_request("x", -1, 0),
    "new_request index": lambda m, c, s: c.new_request("x", 16, 1.0),
    "lookup st": lambda m, c, s: c.lookup("st", _REQ, 0, []),
    "lookup gpu_hit": lambda m, c, s: c.lookup(s, _REQ, -4, []),
    "lookup dec": lambda m, c, s: c.lookup(s, _REQ, 0, ()),
    "lookup num_tokens": lambda m, c, s: c.lookup(s, SimpleNamespace(num_tokens="9", block_hashes=[]), 0, []),
    "lookup hash": lambda m, c, s: c.lookup(s, SimpleNamespace(num_tokens=9, block_hashes=[b"x" * 8, "y"]), 0, []),
    "allocated st": lambda m, c, s: c.allocated(None, 0, []),
    "allocated tokens": lambda m, c, s: c.allocated(s, True, []),
    "allocated dec": lambda m, c, s: c.allocated(s, 0, None),
    "meta scheduled": lambda m, c, s: c.build_connector_meta((), []),
    "meta dec": lambda m, c, s: c.build_connector_meta([], ()),
    "meta pair": lambda m, c, s: c.build_connector_meta([(_Entry(s),)], []),
    "meta item": lambda m, c, s: c.build_connector_meta([[_Entry(s), 4]], []),
    "meta off": lambda m, c, s: c.build_connector_meta([(_Bad(), 4)], []),
    "meta entry": lambda m, c, s: c.build_connector_meta([(object(), 4)], []),
    "meta n": lambda m, c, s: c.build_connector_meta([(_Entry(s), -1)], []),
    "meta never looked up": lambda m, c, s: c.build_connector_meta([(_Entry(s), 4)], []),
    "finished": lambda m, c, s: c.finished(object()),
    "connector block_size 0": lambda m, c, s: m.ReplayConnector(c.manager, 0),
    "connector block_size 2**62": lambda m, c, s: m.ReplayConnector(c.manager, 1 << 62),
    "connector block_size bool": lambda m, c, s: m.ReplayConnector(c.manager, True),
    "end_previous dec": lambda m, c, s: c.end_previous({}),
}


@needs_compiled
@pytest.mark.parametrize("name", sorted(BAD_CALLS))
def test_both_twins_refuse_the_same_calls_alike(name):
    seen = []
    for impl in ("cython", "python"):
        mod = _fast.load(impl)["offload"]
        conn = _connector(impl)
        st_ = conn.new_request("a", 16, 0)
        with pytest.raises(Exception) as err:
            BAD_CALLS[name](mod, conn, st_)
        # nothing changed: no key made, nothing offered or stored
        assert (st_.num_keys, st_.next_stored, conn.manager._num_allocated_chunks) == (0, 0, 0)
        seen.append((type(err.value), str(err.value)))
    assert seen[0] == seen[1]


@pytest.mark.parametrize("block_size", [0, 1 << 62])
def test_a_block_size_out_of_range_is_refused_with_its_range(offload_impl, block_size):
    # one message for both ends: 2**62 used to say "from 0 to 2**62 - 1",
    # contradicting the message for 0 (0 is refused)
    with pytest.raises(ValueError, match=r"^block_size must be from 1 to 2\*\*62 - 1, got "):
        offload_impl.ReplayConnector(offload_impl.CPUOffloadingManager(4), block_size)


def test_a_bad_scheduled_item_is_refused_before_anything_is_offered(offload_impl):
    conn = offload_impl.ReplayConnector(offload_impl.CPUOffloadingManager(16), BS)
    req = _request(0, 16)
    st_ = conn.new_request("a", 16, 0)
    conn.lookup(st_, req, 0, [])
    conn.allocated(st_, 0, [])
    dec: list[int] = []
    with pytest.raises(TypeError, match="off must be a ConnectorRequest"):
        conn.build_connector_meta([(_Entry(st_), 16), (_Bad(), 4)], dec)
    assert dec == [] and st_.next_stored == 0 and conn.manager._num_allocated_chunks == 0


def test_the_state_python_can_reach_is_read_only(offload_impl):
    conn = offload_impl.ReplayConnector(offload_impl.CPUOffloadingManager(4), BS)
    st_ = conn.new_request("a", 16, 0)
    for obj, name in ((conn, "hit_blocks"), (conn, "manager"), (conn, "anything"), (st_, "next_stored"),
                      (st_, "req_context"), (st_, "anything")):
        with pytest.raises(AttributeError):
            setattr(obj, name, 1)


@needs_compiled
def test_a_scheduled_list_changed_while_it_is_read_is_no_crash():
    """An entry's ``off`` may run Python code that empties the list being scanned: the scan stops, alike."""
    seen = []
    for impl in ("cython", "python"):
        conn = _connector(impl)
        states = [conn.new_request(f"r{i}", 16, i) for i in range(3)]
        for i, s in enumerate(states):
            conn.lookup(s, _request(i, 16), 0, [])
            conn.allocated(s, 0, [])
        scheduled: list = []

        class Clears:
            @property
            def off(self):
                scheduled.clear()
                return states[0]

        scheduled += [(Clears(), 8), (_Entry(states[1]), 8), (_Entry(states[2]), 8)]
        dec: list[int] = []
        conn.build_connector_meta(scheduled, dec)
        seen.append(dec)
    assert seen[0] == seen[1] == [13, 0, 2, 0, 1, 0, 0]  # only the first request offered
