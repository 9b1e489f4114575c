"""R-SWA, the circular buffer and bounded sliding-window replay, in both twins.

vLLM 0.33.0 has three kinds of group whose blocks do not simply follow the tokens:

* ``RSWASpec`` (``RSWAManager``): full attention over the prompt, a window of ``rswa_window``
  tokens over what follows; ``remove_skipped_blocks(..., num_prompt_tokens)`` frees the whole
  blocks between the prompt's last block and the decode window.
* ``CircularBufferSpec`` (``CircularBufferManager``): one ring block per request for its whole
  life; never cached, never hit, not prefix-cacheable.
* ``SlidingWindowMLASpec(bounded_replay=True)``: not prefix-cacheable (no hits, nothing cached);
  the scheduler rewinds a hit of the other groups by the window (``prefix_replay_tokens``) and
  the sliding-window manager gives the replayed tokens fresh blocks.

The recorded cases (tests/data/rswa_ring_replay.json) are what vLLM 0.33.0 returned for the same
operations (``/tmp/kvh-venv/bin/python tests/test_rswa_ring_replay.py`` writes them again):
returns, block ids per group, free-queue order, the cache's keys (hashes as labels) and events
after every operation.  The live tests at the end run random operation sequences on vLLM's own
``KVCacheManager`` beside kvcy's and compare the same after every operation (where vLLM imports:
CI's vLLM step, ``.ci/run``).
"""

from __future__ import annotations

import json
import math
import os
import pathlib

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from _vllm_live import live

HERE = pathlib.Path(__file__).parent
DATA = HERE / "data" / "rswa_ring_replay.json"


# ------------------------------------------------------------------ the two back ends
class _Api:
    """Builds one library's specs, manager and requests from plain descriptions.

    A group is ``["full", bs]``, ``["rswa", bs, window]``, ``["ring", bs]``, ``["swa", bs, window]``
    or ``["replay", bs, window]`` (sliding-window MLA with bounded replay)."""

    def __init__(self, which: str, impl=None) -> None:
        self.which = which
        if which == "vllm":
            os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
            import torch
            from vllm.sampling_params import SamplingParams
            from vllm.utils.hashing import get_hash_fn_by_name
            from vllm.v1 import kv_cache_interface as ki
            from vllm.v1.core.kv_cache_manager import KVCacheManager
            from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
            from vllm.v1.request import Request

            self._dtype = torch.float16
            self._manager_cls = KVCacheManager
            self._request = lambda rid, toks, hbs, sha: Request(
                rid, toks, SamplingParams(max_tokens=4096), None, block_hasher=get_request_block_hasher(hbs, sha))
        else:
            from kvcy import kv_cache_interface as ki
            from kvcy.hashing import get_hash_fn_by_name, get_request_block_hasher, init_none_hash

            kv = impl.kv_cache
            self._dtype = "float16"
            self._manager_cls = kv.KVCacheManager
            self._request = lambda rid, toks, hbs, sha: kv.Request(
                rid, toks, block_hasher=get_request_block_hasher(hbs, sha))
        self.ki = ki
        self._sha = get_hash_fn_by_name("sha256")
        init_none_hash(self._sha)

    def spec(self, group: list):
        ki, kind, bs = self.ki, group[0], group[1]
        attn = {"block_size": bs, "num_kv_heads": 1, "head_size": 8, "dtype": self._dtype}
        if kind == "full":
            return ki.FullAttentionSpec(**attn)
        if kind == "rswa":
            return ki.RSWASpec(**attn, rswa_window=group[2])
        if kind == "ring":
            return ki.CircularBufferSpec(**attn)
        if kind == "swa":
            return ki.SlidingWindowSpec(**attn, sliding_window=group[2])
        if kind == "replay":
            return ki.SlidingWindowMLASpec(**{**attn, "head_size": 16}, sliding_window=group[2], bounded_replay=True)
        raise ValueError(kind)

    def manager(self, case: dict):
        ki = self.ki
        groups = [ki.KVCacheGroupSpec([f"l{i}"], self.spec(g)) for i, g in enumerate(case["groups"])]
        cfg = ki.KVCacheConfig(num_blocks=case["num_blocks"], kv_cache_tensors=[], kv_cache_groups=groups)
        mgr = self._manager_cls(
            cfg, max_model_len=4096, scheduler_block_size=_scheduler_block_size(case),
            hash_block_size=case["hbs"], enable_caching=case["caching"], enable_kv_cache_events=True,
            use_eagle=case.get("eagle", False))
        if hasattr(mgr, "refuse_unservable"):  # (kvcy's: None where vLLM's gives None, as the recording)
            mgr.refuse_unservable = False
        return mgr

    def request(self, case: dict, rid: str, tokens: list):
        return self._request(rid, tokens, case["hbs"], self._sha)


def _scheduler_block_size(case: dict) -> int:
    return math.lcm(*(g[1] for g in case["groups"]))


def _replay_tokens(case: dict) -> int:
    """The scheduler's ``prefix_replay_tokens``: the window of a bounded-replay group, else 0."""
    return max([g[2] for g in case["groups"] if g[0] == "replay"], default=0)


def _h(h):
    return h if h is None or isinstance(h, int) else bytes(h).hex()


def _ev(e) -> list:
    name = type(e).__name__
    if name == "BlockStored":
        return ["stored", [_h(h) for h in e.block_hashes], _h(e.parent_block_hash), len(e.token_ids),
                e.block_size, e.group_idx]
    if name == "BlockRemoved":
        return ["removed", [_h(h) for h in e.block_hashes], e.group_idx]
    return [name]


def _state(mgr, reqs: dict) -> dict:
    pool = mgr.block_pool
    return {
        "free": [b.block_id for b in pool.free_block_queue.get_all_free_blocks()],
        "keys": sorted([b.block_id, bytes(b.block_hash).hex()] for b in pool.blocks if b.block_hash is not None),
        "held": {rid: [[b.block_id for b in g] for g in mgr.coordinator.get_blocks(rid)] for rid in sorted(reqs)},
        "cached": [dict(sorted(m.num_cached_block.items())) for m in mgr.coordinator.single_type_managers],
    }


def _admit(mgr, case: dict, req, chunk: int, n_ext: int) -> list:
    """A waiting request's admission as vLLM's scheduler makes it (local hit, bounded replay's
    rewind), then its first chunk."""
    blocks, n_hit = mgr.get_computed_blocks(req)[:2]
    n_found = n_hit
    replay = _replay_tokens(case)
    if replay and 0 < n_hit <= replay:  # (a hit no longer than the replayed window saves nothing)
        blocks, n_hit = mgr.empty_kv_cache_blocks, 0
    n_ext = max(0, min(n_ext, req.num_tokens - n_hit - 1)) if not replay else 0
    n_replay = min(replay, n_hit)
    computed = n_hit + n_ext - n_replay
    n_new = min(chunk, req.num_tokens - computed)
    got = mgr.allocate_slots(req, max(n_new - n_replay, 0), n_hit, blocks, num_external_computed_tokens=n_ext)
    if got is not None:
        req.num_computed_tokens = computed + n_new
    return [n_found, n_hit, n_ext, [list(g) for g in blocks.get_block_ids()],
            None if got is None else [list(g) for g in got.get_block_ids()]]


def _replay(api: _Api, case: dict) -> list:
    """Run a case's operations; what each returned, its events and the state after it."""
    mgr = api.manager(case)
    reqs: dict = {}
    out = []
    for op in case["ops"]:
        kind, rid = op[0], op[1]
        rec = None
        if kind == "new":
            reqs[rid] = api.request(case, rid, list(op[2]))
        elif kind == "admit":
            rec = _admit(mgr, case, reqs[rid], op[2], op[3])
        elif kind == "step":
            req = reqs[rid]
            if req.num_computed_tokens >= req.num_tokens:
                req.append_output_token_ids(list(op[3]))
            n_new = min(op[2], req.num_tokens - req.num_computed_tokens)
            got = mgr.allocate_slots(req, n_new)
            rec = None if got is None else [list(g) for g in got.get_block_ids()]
            if got is None:  # preempted, as the scheduler does
                mgr.free(req)
                req.num_computed_tokens = 0
            else:
                req.num_computed_tokens += n_new
        elif kind == "finish":  # the scheduler's last remove_skipped_blocks before a connector reads the table
            req = reqs[rid]
            mgr.remove_skipped_blocks(rid, req.num_computed_tokens, num_prompt_tokens=req.num_prompt_tokens)
        elif kind == "free":
            mgr.free(reqs[rid])
            reqs[rid].num_computed_tokens = 0
        elif kind == "reset":
            rec = mgr.reset_prefix_cache()
        else:
            raise ValueError(kind)
        out.append([kind, rid, rec, [_ev(e) for e in mgr.take_events()], _state(mgr, reqs)])
    return out


def _labelled(trace: list) -> list:
    """The trace with every hash replaced by its order of first appearance (h0, h1, ...)."""
    labels: dict = {}

    def lab(h):
        return None if h is None else labels.setdefault(h, f"h{len(labels)}")

    out = []
    for kind, rid, rec, events, st_ in trace:
        evs = [e if len(e) == 1 else [e[0], [lab(h) for h in e[1]], *([lab(e[2])] + e[3:] if e[0] == "stored"
                                                                      else e[2:])]
               for e in events]
        # (cache keys end in the 4-byte group id; events carry the hash alone)
        keys = [[bid, lab(key[:-8]), int(key[-8:], 16)] for bid, key in st_["keys"]]
        out.append([kind, rid, rec, evs, st_["free"], keys, st_["held"], st_["cached"]])
    return out


def _guarded(api, case):
    """The replay, or the exception it ended with (same type on both sides)."""
    try:
        return _replay(api, case)
    except Exception as exc:  # (a refused operation: both must refuse it alike)
        return ["raised", type(exc).__name__, str(exc)]


# ------------------------------------------------------------------ fixed cases
_P = list(range(100, 122))  # a 22-token prompt


def _decode(rid: str, n: int, start: int = 0) -> list:
    return [("step", rid, 1, [70000 + start + i]) for i in range(n)]


CASES = {
    # R-SWA alone: the gap after the prompt is freed as the decode window moves on; a resend
    # hits the prompt's cached blocks (the freed gap blocks stay cached until evicted).
    "rswa_unitary": {"groups": [["rswa", 4, 8]], "hbs": 4, "num_blocks": 24, "caching": True, "ops": [
        ("new", "a", _P), ("admit", "a", 64, 0), *_decode("a", 18), ("finish", "a"),
        ("new", "b", _P), ("admit", "b", 64, 0), *_decode("b", 6), ("free", "a"), ("free", "b"),
        ("new", "c", _P + [5, 6, 7, 8, 9]), ("admit", "c", 64, 0), ("reset", None)]},
    # R-SWA beside full attention, chunked prefill, a small pool (preemption, evictions).
    "rswa_hybrid": {"groups": [["full", 4], ["rswa", 4, 6]], "hbs": 4, "num_blocks": 20, "caching": True, "ops": [
        ("new", "a", _P), ("admit", "a", 8, 0), ("step", "a", 8, [1]), ("step", "a", 8, [1]),
        *_decode("a", 14), ("new", "b", _P[:12] + [9] * 10), ("admit", "b", 64, 0), *_decode("b", 8, 50),
        ("free", "a"), ("new", "c", _P), ("admit", "c", 64, 0), *_decode("c", 4, 90)]},
    # The ring alone (its block size is the hash block: vLLM's unitary coordinator asserts it):
    # one block for the request's whole life, nothing cached, no hit.
    "ring_unitary": {"groups": [["ring", 8]], "hbs": 8, "num_blocks": 6, "caching": True, "ops": [
        ("new", "a", _P), ("admit", "a", 8, 0), ("step", "a", 8, [1]), *_decode("a", 10),
        ("new", "b", _P), ("admit", "b", 64, 0), ("free", "a"), ("new", "c", _P), ("admit", "c", 64, 4),
        ("free", "b"), ("free", "c"), ("reset", None)]},
    # A ring of 6 tokens beside full attention of 4 (scheduler block 12): only the cacheable
    # group's block size must be a multiple of the hash block; external tokens claim the ring.
    "ring_hybrid": {"groups": [["full", 4], ["ring", 6]], "hbs": 4, "num_blocks": 16, "caching": True, "ops": [
        ("new", "a", _P), ("admit", "a", 64, 0), *_decode("a", 6), ("new", "b", _P), ("admit", "b", 64, 0),
        ("new", "c", _P[:16] + [3] * 8), ("admit", "c", 64, 4), *_decode("c", 4, 30), ("free", "a"),
        ("new", "d", list(range(500, 540))), ("admit", "d", 64, 0), ("step", "d", 1, [1]), ("free", "b")]},
    # Bounded replay beside full attention: the full group's hit is rewound by the window, the
    # replay group gets nulls below the window and fresh blocks for the replayed tokens, and
    # caches nothing; a hit no longer than the window is dropped.
    "replay_hybrid": {"groups": [["full", 4], ["replay", 4, 8]], "hbs": 4, "num_blocks": 30, "caching": True,
                      "ops": [
        ("new", "a", _P), ("admit", "a", 64, 0), *_decode("a", 5), ("new", "b", _P), ("admit", "b", 64, 0),
        ("new", "c", _P[:8] + [1] * 6), ("admit", "c", 64, 0), ("free", "a"),
        ("new", "d", _P + [9] * 9), ("admit", "d", 6, 0), ("step", "d", 6, [1]), ("step", "d", 64, [1]),
        *_decode("d", 8, 10), ("free", "d"), ("free", "b")]},
    # Bounded replay alone: the group never caches, so nothing ever hits.
    "replay_unitary": {"groups": [["replay", 4, 8]], "hbs": 4, "num_blocks": 20, "caching": True, "ops": [
        ("new", "a", _P), ("admit", "a", 64, 0), *_decode("a", 6), ("new", "b", _P), ("admit", "b", 64, 0),
        ("free", "a"), ("free", "b")]},
    # Everything at once, then without prefix caching.
    "mixed": {"groups": [["full", 4], ["rswa", 4, 8], ["ring", 8], ["replay", 4, 8], ["swa", 4, 8]],
              "hbs": 4, "num_blocks": 48, "caching": True, "ops": [
        ("new", "a", _P), ("admit", "a", 16, 0), ("step", "a", 64, [1]), *_decode("a", 12), ("finish", "a"),
        ("new", "b", _P + [4] * 5), ("admit", "b", 64, 0), *_decode("b", 6, 40), ("free", "a"),
        ("new", "c", _P), ("admit", "c", 64, 0), ("free", "b"), ("free", "c"), ("reset", None)]},
    "mixed_no_caching": {"groups": [["full", 4], ["rswa", 4, 8], ["ring", 8], ["replay", 4, 8]],
                         "hbs": 4, "num_blocks": 20, "caching": False, "ops": [
        ("new", "a", _P), ("admit", "a", 64, 4), *_decode("a", 12), ("new", "b", _P), ("admit", "b", 64, 0),
        *_decode("b", 12, 20), ("free", "a"), ("free", "b")]},
}


def _record() -> dict:
    """Replay every fixed case on vLLM 0.33.0 (run with /tmp/kvh-venv)."""
    api = _Api("vllm")
    return {name: _labelled(_replay(api, case)) for name, case in CASES.items()}


def _jsonable(x):
    return json.loads(json.dumps(x))


@pytest.mark.parametrize("name", sorted(CASES))
def test_recorded_cases(impl, name):
    """kvcy's manager returns, holds, frees, queues, caches and publishes what vLLM 0.33.0 did."""
    recorded = json.loads(DATA.read_text())
    assert _jsonable(_labelled(_replay(_Api("kvcy", impl), CASES[name]))) == recorded[name]


def test_recorded_cases_show_what_they_are_for():
    """The recorded cases exercise what they claim: gaps freed, one ring block, nothing of the
    ring or replay groups cached, replayed hits, preemption."""
    rec = json.loads(DATA.read_text())
    null = 0
    # R-SWA: blocks after the prompt's last one (22 tokens: blocks 0..5) become null while decoding.
    held = rec["rswa_unitary"][19][6]["a"][0]
    assert held[:6] == [b for b in held[:6] if b != null] and null in held[6:]
    # The ring: one block per request, however long it runs; never cached.
    for step in rec["ring_unitary"]:
        assert all(len(g[0]) <= 1 for g in step[6].values()) and step[5] == []
    ring_keys = {k[2] for step in rec["ring_hybrid"] for k in step[5]}
    assert ring_keys == {0}
    # Bounded replay: the full group hit, the replay group caches nothing and got no hit blocks.
    admit_b = rec["replay_hybrid"][8]
    assert admit_b[0] == "admit" and admit_b[2][:2] == [20, 20] and admit_b[2][3][1] == []
    assert {k[2] for step in rec["replay_hybrid"] for k in step[5]} == {0}
    assert rec["replay_hybrid"][10][2][:2] == [8, 0]  # (a hit no longer than the window: dropped)
    # External tokens claim the ring (ring_unitary's request c: 4 external tokens; allocate_slots
    # then has no new block to return).
    admit_c = rec["ring_unitary"][17]
    assert admit_c[2][2] == 4 and admit_c[2][4] == [[]] and admit_c[6]["c"] == [[1]]
    # A preemption (allocate_slots returned None) happens in the small R-SWA hybrid pool.
    assert any(step[0] == "step" and step[2] is None for step in rec["rswa_hybrid"])


# ------------------------------------------------------------------ specs
def test_spec_fields_merge_and_page_sizes(impl):
    from kvcy import kv_cache_interface as ki

    attn = {"block_size": 16, "num_kv_heads": 2, "head_size": 64, "dtype": "float16"}
    r = ki.RSWASpec(**attn, rswa_window=128)
    assert r.page_size_bytes == ki.FullAttentionSpec(**attn).page_size_bytes == 16 * 2 * 128 * 2
    assert r.prefix_cacheable and r.prefix_replay_tokens == 0 and r.block_table_token_alignment == 128
    assert isinstance(r, ki.FullAttentionSpec) and ki.get_kv_cache_spec_kind(r) == ki.KVCacheSpecKind.FULL_ATTENTION
    merged = ki.RSWASpec.merge([r, ki.RSWASpec(**attn, rswa_window=128, sliding_window=None, non_causal=True)])
    assert type(merged) is ki.RSWASpec and merged.rswa_window == 128 and merged.non_causal
    with pytest.raises(AssertionError, match="same rswa_window"):
        ki.RSWASpec.merge([r, ki.RSWASpec(**attn, rswa_window=64)])
    with pytest.raises(AssertionError, match="must be RSWASpec"):
        ki.RSWASpec.merge([r, ki.FullAttentionSpec(**attn)])
    with pytest.raises(AssertionError, match="same attention spec"):
        ki.RSWASpec.merge([r, ki.RSWASpec(**{**attn, "head_size": 32}, rswa_window=128)])
    for bad, exc in ((0, ValueError), (1.5, TypeError), (True, TypeError)):
        with pytest.raises(exc, match="rswa_window"):
            ki.RSWASpec(**attn, rswa_window=bad)
    assert r != ki.RSWASpec(**attn, rswa_window=64) and hash(r) == hash(ki.RSWASpec(**attn, rswa_window=128))
    assert r.is_uniform_with_collection({"a": ki.FullAttentionSpec(**attn)})

    c = ki.CircularBufferSpec(**attn)
    assert c.page_size_bytes == 16 * 2 * 128 * 2 and c.max_memory_usage_bytes(None) == c.page_size_bytes
    assert c.max_num_blocks_per_req(None, 100000) == 1
    assert (c.prefix_cacheable, c.uses_slot_mapping, c.block_table_token_alignment, c.prefix_replay_tokens) == (
        False, False, None, 0)
    assert ki.get_kv_cache_spec_kind(c) == ki.KVCacheSpecKind.UNKNOWN
    assert c.is_uniform_with_collection({"a": c}) and not c.is_uniform_with_collection({"a": r})
    assert ki.CircularBufferSpec.merge([c, ki.CircularBufferSpec(**attn)]) == c
    with pytest.raises(AssertionError):
        ki.CircularBufferSpec.merge([c, ki.CircularBufferSpec(**{**attn, "block_size": 32})])

    s = ki.SlidingWindowMLASpec(block_size=16, num_kv_heads=1, head_size=576, dtype="bfloat16",
                                sliding_window=128, bounded_replay=True)
    assert (s.prefix_cacheable, s.prefix_replay_tokens) == (False, 128)
    plain = ki.SlidingWindowMLASpec(block_size=16, num_kv_heads=1, head_size=576, dtype="bfloat16", sliding_window=128)
    assert not s.is_uniform_with_collection({"a": plain}) and s.is_uniform_with_collection({"a": s})
    with pytest.raises(AssertionError, match="replay policy"):
        ki.SlidingWindowMLASpec.merge([s, plain])
    uni = ki.UniformTypeKVCacheSpecs(block_size=16, kv_cache_specs={"a": s, "b": s})
    assert (uni.prefix_cacheable, uni.prefix_replay_tokens) == (False, 128)

    reg = ki.KVCacheSpecRegistry
    kv = impl.kv_cache
    assert kv._manager_class(r) is kv.RSWAManager and kv._manager_class(c) is kv.CircularBufferManager
    assert kv._manager_class(s) is kv.SlidingWindowManager
    assert reg.get_uniform_type_base_spec(r) is ki.FullAttentionSpec
    assert reg.get_uniform_type_base_spec(c) is ki.CircularBufferSpec
    cfg = ki.KVCacheConfig(num_blocks=4, kv_cache_tensors=[], kv_cache_groups=[
        ki.KVCacheGroupSpec(["a"], r), ki.KVCacheGroupSpec(["b"], c), ki.KVCacheGroupSpec(["c"], s)])
    assert cfg.prefix_cacheable_group_ids == (0,)


def test_manager_details(impl):
    """Direct calls: R-SWA's gap bounds, the ring's counts and no-ops, zeroing left out for the
    ring, bad prompt lengths refused before any group changes."""
    kv = impl.kv_cache
    api = _Api("kvcy", impl)
    case = {"groups": [["full", 4], ["rswa", 4, 8], ["ring", 8]], "hbs": 4, "num_blocks": 40, "caching": True}
    mgr = api.manager(case)
    req = api.request(case, "a", list(range(10)))
    mgr.allocate_slots(req, 10)
    req.num_computed_tokens = 10
    for i in range(30):
        req.append_output_token_ids([i])
        mgr.allocate_slots(req, 1)
        req.num_computed_tokens += 1
    full, rswa, ring = mgr.coordinator.single_type_managers
    # (allocate_slots freed up to the window before its step: 39 tokens, blocks 3..6)
    assert [b.block_id for b in rswa.req_to_blocks["a"]][3:8].count(0) == 4
    mgr.remove_skipped_blocks("a", 40, num_prompt_tokens=10)
    assert type(rswa) is kv.RSWAManager and rswa.rswa_window == 8 and type(ring) is kv.CircularBufferManager
    held = [b.block_id for b in rswa.req_to_blocks["a"]]
    # 40 tokens: prompt blocks 0..2 (ceil(10/4)), window start max(10, 40 - 8) = 32 -> blocks 3..7 freed
    assert held[:3] != [0, 0, 0] and held[3:8] == [0] * 5 and 0 not in held[8:]
    assert len(ring.req_to_blocks["a"]) == 1
    assert ring.get_num_blocks_to_allocate("a", 999, [], 0, 0, 999) == 0
    assert ring.get_num_blocks_to_allocate("zz", 1, [], 0, 0, 1) == 1
    assert ring.allocate_new_blocks("a", 999, 999) == [] and ring.get_num_skipped_tokens(999) == 0
    assert type(ring).find_longest_cache_hit([b"x" * 32], 8, [2, 3], mgr.block_pool, ring.kv_cache_spec,
                                             False, 8) == (([], []), 0)
    # (nothing without the prompt length, and as full attention's)
    before = [b.block_id for b in rswa.req_to_blocks["a"]]
    rswa.remove_skipped_blocks("a", 40)
    assert [b.block_id for b in rswa.req_to_blocks["a"]] == before
    for bad, exc in (("10", TypeError), (-1, ValueError), (1.0, TypeError)):
        free_before = mgr.block_pool.get_num_free_blocks()
        with pytest.raises(exc, match="num_prompt_tokens"):
            mgr.remove_skipped_blocks("a", 40, num_prompt_tokens=bad)
        with pytest.raises(exc, match="num_prompt_tokens"):
            rswa.remove_skipped_blocks("a", 40, bad)
        assert mgr.block_pool.get_num_free_blocks() == free_before
    # The ring's blocks are never reported for zeroing; the attention groups' are.
    zcase = dict(case)
    ki = api.ki
    groups = [ki.KVCacheGroupSpec([f"l{i}"], api.spec(g)) for i, g in enumerate(zcase["groups"])]
    groups.append(ki.KVCacheGroupSpec(["m"], ki.MambaSpec(block_size=8, shapes=((4,),), dtypes=("float32",))))
    cfg = ki.KVCacheConfig(num_blocks=40, kv_cache_tensors=[], kv_cache_groups=groups)
    zm = kv.KVCacheManager(cfg, max_model_len=4096, scheduler_block_size=8, hash_block_size=4, enable_caching=False)
    zm.allocate_slots(api.request(case, "z", list(range(10))), 10)
    recorded = [m.records_new_block_ids for m in zm.coordinator.single_type_managers]
    assert recorded == [True, True, False, False]
    assert zm.coordinator.single_type_managers[2].take_new_block_ids() == []


def test_caching_is_off_for_groups_out_of_prefix_caching(impl):
    """A bounded-replay group caches nothing even when asked directly; its hit slot stays empty."""
    api = _Api("kvcy", impl)
    case = {"groups": [["full", 4], ["replay", 4, 8]], "hbs": 4, "num_blocks": 30, "caching": True}
    mgr = api.manager(case)
    req = api.request(case, "a", list(range(24)))
    mgr.allocate_slots(req, 24)
    replay = mgr.coordinator.single_type_managers[1]
    replay.cache_blocks(req, 24)
    assert "a" not in replay.num_cached_block
    assert all(b.block_hash is None for b in replay.req_to_blocks["a"])
    req.num_computed_tokens = 24
    other = api.request(case, "b", list(range(24)) + [7])
    blocks, n_hit = mgr.get_computed_blocks(other)[:2]
    assert n_hit == 24 and blocks.get_block_ids()[1] == []


# ------------------------------------------------------------------ random cases (live)
_CONFIGS = [
    ([["rswa", 4, 8]], 4), ([["rswa", 4, 2]], 4), ([["full", 4], ["rswa", 4, 8]], 4),
    ([["full", 8], ["rswa", 4, 12]], 4), ([["ring", 8]], 8), ([["ring", 4]], 4),
    ([["full", 4], ["ring", 8]], 4), ([["full", 4], ["ring", 6]], 4), ([["replay", 4, 8]], 4),
    ([["full", 4], ["replay", 4, 8]], 4), ([["full", 8], ["replay", 4, 6]], 4),
    ([["full", 4], ["rswa", 4, 8], ["ring", 8], ["replay", 4, 8]], 4),
]
_PREFIXES = [list(range(1000 * k, 1000 * k + 48)) for k in range(2)]


@st.composite
def _cases(draw):
    groups, hbs = draw(st.sampled_from(_CONFIGS))
    caching = draw(st.sampled_from([True, True, True, False]))
    eagle = draw(st.sampled_from([False, False, True]))
    num_blocks = draw(st.sampled_from([14, 20, 40]))
    n_req = draw(st.integers(2, 4))
    ops, states, prompts = [], {}, []
    for r in range(n_req):
        if prompts and draw(st.booleans()):
            prompt = draw(st.sampled_from(prompts))
        else:
            prefix = draw(st.sampled_from(_PREFIXES))
            shared = draw(st.sampled_from([0, 8, 12, 16, 24, 40]))
            tail = draw(st.integers(1, 12))
            prompt = prefix[:shared] + list(range(50000 + 100 * r, 50000 + 100 * r + tail))
        prompts.append(prompt)
        ops.append(("new", f"r{r}", prompt))
        states[f"r{r}"] = "new"
    for _ in range(draw(st.integers(4, 40))):
        rid = f"r{draw(st.integers(0, n_req - 1))}"
        kind = draw(st.sampled_from(["admit", "step", "step", "step", "step", "finish", "free", "reset"]))
        if kind == "admit" or (kind == "step" and states[rid] != "running"):
            if states[rid] == "running":
                continue
            ops.append(("admit", rid, draw(st.sampled_from([3, 8, 12, 200])), draw(st.sampled_from([0, 0, 4, 9]))))
            states[rid] = "running"
        elif kind == "step":
            # (a decode step appends 1 to 8 tokens: the R-SWA window moves on in a few steps)
            n = draw(st.sampled_from([1, 3, 8]))
            ops.append(("step", rid, n, [draw(st.integers(60000, 60003))] * draw(st.sampled_from([1, n]))))
        elif kind == "finish":
            if states[rid] == "running":
                ops.append(("finish", rid))
        elif kind == "free":
            ops.append(("free", rid))
            states[rid] = "done"
        else:
            ops.append(("reset", None))
    return {"groups": groups, "hbs": hbs, "num_blocks": num_blocks, "caching": caching, "eagle": eagle, "ops": ops}


@pytest.fixture(scope="module")
def vllm_api():
    return _Api("vllm")


@live
@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture],
          derandomize=True)
@given(case=_cases())
def test_random_sequences_as_vllm(impl, vllm_api, case):
    """Random admissions (chunked, prefix hits, bounded replay's rewind, external tokens), decode
    steps with preemption, gap frees, frees and resets on R-SWA, ring and bounded-replay groups,
    alone and beside full attention, with and without EAGLE and prefix caching: kvcy's manager returns, holds, queues, caches and publishes
    what vLLM's does after every operation."""
    expected = _guarded(vllm_api, case)
    assert expected[0] != "raised", expected  # (the cases are valid operation sequences)
    assert _guarded(_Api("kvcy", impl), case) == expected


@live
def test_recorded_cases_are_what_vllm_does_now(vllm_api):
    """The recorded table is still what live vLLM 0.33.0 returns."""
    assert _jsonable(_record()) == json.loads(DATA.read_text())


@live
def test_specs_map_through_kvcy_vllm():
    """vLLM's RSWASpec, CircularBufferSpec and bounded-replay SlidingWindowMLASpec become kvcy's
    (same fields, page size, cacheability), and a config with them builds kvcy's managers."""
    import torch
    from vllm.v1 import kv_cache_interface as v

    import kvcy.vllm
    from kvcy import kv_cache_interface as ki

    attn = {"block_size": 16, "num_kv_heads": 4, "head_size": 64, "dtype": torch.float16}
    pairs = [
        (v.RSWASpec(**attn, rswa_window=64), ki.RSWASpec(**attn, rswa_window=64)),
        (v.CircularBufferSpec(**attn), ki.CircularBufferSpec(**attn)),
        (v.SlidingWindowMLASpec(block_size=16, num_kv_heads=1, head_size=576, dtype=torch.bfloat16,
                                sliding_window=64, bounded_replay=True),
         ki.SlidingWindowMLASpec(block_size=16, num_kv_heads=1, head_size=576, dtype=torch.bfloat16,
                                 sliding_window=64, bounded_replay=True)),
    ]
    for theirs, ours in pairs:
        converted = kvcy.vllm.convert_kv_cache_spec(theirs)
        assert converted == ours and type(converted) is type(ours)
        assert converted.page_size_bytes == theirs.page_size_bytes
        assert (converted.prefix_cacheable, converted.prefix_replay_tokens, converted.uses_slot_mapping,
                converted.block_table_token_alignment) == (
            theirs.prefix_cacheable, theirs.prefix_replay_tokens, theirs.uses_slot_mapping,
            theirs.block_table_token_alignment)
    config = v.KVCacheConfig(num_blocks=16, kv_cache_tensors=[], kv_cache_groups=[
        v.KVCacheGroupSpec([f"l{i}"], s) for i, (s, _) in enumerate(pairs)])
    mgr = kvcy.vllm.make_kv_cache_manager(config, max_model_len=256, scheduler_block_size=16, hash_block_size=16,
                                          enable_caching=True)
    names = [type(m).__name__ for m in mgr.coordinator.single_type_managers]
    assert names == ["RSWAManager", "CircularBufferManager", "SlidingWindowManager"]
    assert mgr.kv_cache_config.prefix_cacheable_group_ids == config.prefix_cacheable_group_ids == (0,)


def _merge_cases(ki, dtype):
    attn = {"block_size": 16, "num_kv_heads": 2, "head_size": 64, "dtype": dtype}
    r = lambda **kw: ki.RSWASpec(**{**attn, "rswa_window": 128, **kw})  # noqa: E731
    c = lambda **kw: ki.CircularBufferSpec(**{**attn, **kw})  # noqa: E731
    mla = {"block_size": 16, "num_kv_heads": 1, "head_size": 576, "dtype": dtype, "sliding_window": 128}
    m = lambda **kw: ki.SlidingWindowMLASpec(**{**mla, **kw})  # noqa: E731
    return {
        "rswa same": (ki.RSWASpec, [r(), r()]),
        "rswa non-causal one": (ki.RSWASpec, [r(), r(non_causal=True)]),
        "rswa recorded window": (ki.RSWASpec, [r(sliding_window=64), r()]),
        "rswa two recorded windows": (ki.RSWASpec, [r(sliding_window=64), r(sliding_window=32)]),
        "rswa windows differ": (ki.RSWASpec, [r(), r(rswa_window=64)]),
        "rswa heads differ": (ki.RSWASpec, [r(), r(num_kv_heads=4)]),
        "rswa with full": (ki.RSWASpec, [r(), ki.FullAttentionSpec(**attn)]),
        "rswa padded": (ki.RSWASpec, [r(page_size_padded=9000), r(page_size_padded=9000)]),
        "ring same": (ki.CircularBufferSpec, [c(), c()]),
        "ring block sizes differ": (ki.CircularBufferSpec, [c(), c(block_size=32)]),
        "replay same": (ki.SlidingWindowMLASpec, [m(bounded_replay=True), m(bounded_replay=True)]),
        "replay policy differs": (ki.SlidingWindowMLASpec, [m(bounded_replay=True), m()]),
    }


@live
def test_merges_as_vllm(vllm_api):
    """RSWASpec, CircularBufferSpec and bounded-replay merges: the same merged spec, or the same
    exception type, as vLLM 0.33.0."""
    import torch
    from vllm.v1 import kv_cache_interface as v

    import kvcy.vllm
    from kvcy import kv_cache_interface as ki

    ours, theirs = _merge_cases(ki, torch.float16), _merge_cases(v, torch.float16)
    for name in ours:
        outcome = {}
        for side, (cls, specs) in (("kvcy", ours[name]), ("vllm", theirs[name])):
            try:
                merged = cls.merge(specs)
            except Exception as exc:  # noqa: BLE001 - compared between the two
                outcome[side] = type(exc).__name__
            else:
                outcome[side] = merged if side == "kvcy" else kvcy.vllm.convert_kv_cache_spec(merged)
        assert outcome["kvcy"] == outcome["vllm"], name
        if not isinstance(outcome["kvcy"], str):
            assert type(outcome["kvcy"]) is ours[name][0], name


# (layout -> (groups' specs as in _Api.spec, blocks in the pool); the window of 48 tokens is the
# scenario's sliding window: bounded replay rewinds every hit by it)
_SCHEDULER_LAYOUTS = {
    "full+rswa": ([["full", 16], ["rswa", 16, 48]], 96),
    "full+ring": ([["full", 16], ["ring", 16]], 80),
    "full+bounded-replay": ([["full", 16], ["replay", 16, 48]], 96),
}


@pytest.fixture(scope="module")
def scheduler_module(tmp_path_factory):
    """tests/vllm_live/test_vllm_scheduler.py's scenario (vLLM's own Scheduler, a config-only model), with
    the KV-cache layouts above."""
    tvs = pytest.importorskip("tests.vllm_live.test_vllm_scheduler")
    from transformers import OPTConfig

    path = tmp_path_factory.mktemp("opt-config-only-swa")
    OPTConfig(vocab_size=tvs.VOCAB, hidden_size=64, num_hidden_layers=2, ffn_dim=128, num_attention_heads=4,
              max_position_embeddings=2048, architectures=["OPTForCausalLM"]).save_pretrained(path)
    return tvs, str(path)


@live
@pytest.mark.parametrize("layout", sorted(_SCHEDULER_LAYOUTS))
def test_vllm_scheduler_runs_alike_on_kvcy(scheduler_module, vllm_api, layout, monkeypatch):
    """vLLM 0.33.0's Scheduler (its prefix-replay rewind included) through 300 requests with
    hits, preemptions and aborts: every step's SchedulerOutput and what it returned are the
    same on kvcy's manager as on vLLM's."""
    import kvcy
    import kvcy.vllm

    tvs, model_dir = scheduler_module
    groups, num_blocks = _SCHEDULER_LAYOUTS[layout]

    def kv_cache_config(_layout):
        ki = vllm_api.ki
        names = [f"model.decoder.layers.{i}.self_attn.attn" for i in range(2)]
        specs = [vllm_api.spec(g) for g in groups]
        return ki.KVCacheConfig(num_blocks=num_blocks, kv_cache_tensors=[],
                                kv_cache_groups=[ki.KVCacheGroupSpec([n], s) for n, s in zip(names, specs)])

    monkeypatch.setitem(tvs.LAYOUTS, layout, num_blocks)
    monkeypatch.setattr(tvs, "make_kv_cache_config", kv_cache_config)
    expected, manager_class = tvs.run_scenario(model_dir, layout)
    assert manager_class.__module__ == "vllm.v1.core.kv_cache_manager"
    steps = expected[:-1]
    assert sum(len(r["scheduler_output"]["preempted"] or ()) for r in steps) >= 1
    assert sum(s["prefix_cache_stats"]["hits"] for r in steps for s in r["engine_outputs"]["stats"]) > 0
    with kvcy.vllm.installed():
        got, manager_class = tvs.run_scenario(model_dir, layout)
    assert manager_class.__module__.startswith("kvcy._fast."), manager_class
    assert got == expected, tvs._first_difference(expected, got)


if __name__ == "__main__":  # re-record: /tmp/kvh-venv/bin/python tests/test_rswa_ring_replay.py
    DATA.parent.mkdir(exist_ok=True)
    DATA.write_text(json.dumps(_record(), separators=(",", ":")) + "\n")
    print(f"wrote {DATA}")
