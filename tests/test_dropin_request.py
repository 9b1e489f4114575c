"""vLLM 0.33.0 drop-in, request side (issue 14, docs/vllm-dropin-gaps.md section 7): the
``Request`` fields vLLM's block managers read, with vLLM's names, defaults and meaning, both
for kvcy's ``Request`` and for other request objects (vLLM's own) on the managers' generic path.

What vLLM 0.33.0's ``v1/core`` reads from a request: ``request_id``, ``status``,
``num_tokens``, ``num_prompt_tokens``, ``num_computed_tokens``, ``num_in_flight_tokens``,
``num_preemptions``, ``all_token_ids``, ``block_hashes``, ``mm_features``, ``lora_request``,
``cache_salt``, ``prompt_embeds``, ``skip_reading_prefix_cache``, ``session_id`` (events),
``shared_prefix_boundary`` (sparse retention), ``kv_cache_report_mode`` (read with
``getattr``, default ``"incremental"``: vLLM's pooling requests have none) and
``_prompt_embeds_per_block_hashes`` (a digest cache kvcy does without: it rehashes).
"""

from __future__ import annotations

import pytest

from kvcy import hashing
from kvcy.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
from kvcy.kv_events import BlockStored

BS = 4


def _manager(impl, **kw):
    spec = FullAttentionSpec(block_size=BS, num_kv_heads=1, head_size=8, dtype="float16")
    cfg = KVCacheConfig(num_blocks=16, kv_cache_tensors=[], kv_cache_groups=[KVCacheGroupSpec(["l"], spec)])
    return impl.kv_cache.KVCacheManager(cfg, max_model_len=64, scheduler_block_size=BS, hash_block_size=BS,
                                        enable_caching=True, **kw)


def _hasher():
    hashing.init_none_hash(hashing.sha256)
    return hashing.get_request_block_hasher(BS, hashing.sha256)


def _stored(events):
    return [e for e in events if isinstance(e, BlockStored)]


# ----------------------------------------------------------------- defaults and checks
def test_new_fields_have_vllms_defaults(impl):
    req = impl.kv_cache.Request("r", [1, 2, 3])
    assert req.session_id is None
    assert req.shared_prefix_boundary == 0
    assert req.skip_reading_prefix_cache is False
    assert req.kv_cache_report_mode == "incremental"
    assert req.num_in_flight_tokens == 0 and req.num_preemptions == 0
    assert req.mm_features == []  # vLLM keeps ``mm_features or []``


def test_session_id_is_a_read_only_str(impl):
    req = impl.kv_cache.Request("r", [1], session_id="chat-7")
    assert req.session_id == "chat-7"
    with pytest.raises(AttributeError):
        req.session_id = "other"
    with pytest.raises(TypeError, match="session_id must be a str or None, got int"):
        impl.kv_cache.Request("r", [1], session_id=7)


def test_shared_prefix_boundary_is_a_checked_count(impl):
    req = impl.kv_cache.Request("r", [1])
    req.shared_prefix_boundary = 32
    assert req.shared_prefix_boundary == 32
    with pytest.raises(ValueError, match="shared_prefix_boundary must be non-negative"):
        req.shared_prefix_boundary = -1
    with pytest.raises(TypeError, match="shared_prefix_boundary must be an int, got bool"):
        req.shared_prefix_boundary = True
    assert req.shared_prefix_boundary == 32


@pytest.mark.parametrize("bad", [1, 0, None, "yes"])
def test_skip_reading_prefix_cache_is_a_bool(impl, bad):
    """Both twins take a bool only (the compiled one used to coerce any truth value, the
    Python one to keep the object): vLLM's value comes from a bool parameter."""
    with pytest.raises(TypeError, match="skip_reading_prefix_cache must be a bool"):
        impl.kv_cache.Request("r", [1], skip_reading_prefix_cache=bad)
    req = impl.kv_cache.Request("r", [1])
    with pytest.raises(TypeError, match="skip_reading_prefix_cache must be a bool"):
        req.skip_reading_prefix_cache = bad
    assert req.skip_reading_prefix_cache is False
    req.skip_reading_prefix_cache = True
    assert req.skip_reading_prefix_cache is True


# ----------------------------------------------------------------- what the managers decide
def test_skip_reading_prefix_cache_hides_hits_but_caches(impl):
    mgr = _manager(impl)
    first = impl.kv_cache.Request("a", range(12), block_hasher=_hasher())
    mgr.allocate_slots(first, 12)
    again = impl.kv_cache.Request("b", range(12), block_hasher=_hasher())
    assert mgr.get_computed_blocks(again)[1] == 8
    again.skip_reading_prefix_cache = True
    assert mgr.get_computed_blocks(again)[1] == 0
    assert not mgr.prefix_cache_lookup_enabled(again)


def test_session_id_reaches_block_stored_events(impl):
    mgr = _manager(impl, enable_kv_cache_events=True)
    req = impl.kv_cache.Request("a", range(8), block_hasher=_hasher(), session_id="chat-7")
    mgr.allocate_slots(req, 8)
    (ev,) = _stored(mgr.take_events())
    assert ev.session_id == "chat-7"


class _PoolingLikeRequest:
    """The fields of a request that lacks ``kv_cache_report_mode`` (vLLM's pooling requests)."""

    def __init__(self, rid, tokens, hasher):
        self.request_id = rid
        self.all_token_ids = list(tokens)
        self.num_prompt_tokens = len(self.all_token_ids)
        self.num_computed_tokens = 0
        self.num_in_flight_tokens = 0
        self.num_preemptions = 0
        self.skip_reading_prefix_cache = False
        self.shared_prefix_boundary = 0
        self.spec_token_ids = []
        self.session_id = None
        self.lora_request = None
        self.mm_features = []
        self.cache_salt = None
        self.prompt_embeds = None
        self.status = 1
        self.block_hashes = []
        self.block_hashes = hasher(self)

    @property
    def num_tokens(self):
        return len(self.all_token_ids)


def test_report_mode_missing_reads_as_incremental(impl):
    """vLLM reads ``kv_cache_report_mode`` with a default: a request without one finds its
    hit and re-emits nothing (kvcy raised AttributeError)."""
    mgr = _manager(impl, enable_kv_cache_events=True)
    mgr.allocate_slots(_PoolingLikeRequest("a", range(12), _hasher()), 12)
    mgr.take_events()
    other = _PoolingLikeRequest("b", range(12), _hasher())
    assert mgr.get_computed_blocks(other)[1] == 8
    assert mgr.take_events() == []
    other.kv_cache_report_mode = "full"
    assert mgr.get_computed_blocks(other)[1] == 8
    assert len(_stored(mgr.take_events())) == 1


def test_report_mode_full_reemits_hits_of_kvcy_requests(impl):
    mgr = _manager(impl, enable_kv_cache_events=True)
    mgr.allocate_slots(impl.kv_cache.Request("a", range(12), block_hasher=_hasher(), session_id="s"), 12)
    mgr.take_events()
    full = impl.kv_cache.Request("b", range(12), block_hasher=_hasher(), kv_cache_report_mode="full",
                                 session_id="s2")
    assert mgr.get_computed_blocks(full)[1] == 8
    (ev,) = _stored(mgr.take_events())
    assert ev.session_id == "s2" and len(ev.block_hashes) == 2


def test_preempted_requests_count_in_prefix_cache_stats(impl):
    mgr = _manager(impl, log_stats=True)
    req = impl.kv_cache.Request("a", range(12), block_hasher=_hasher())
    mgr.record_prefix_cache_stats(req, 0)
    req.num_preemptions = 1
    mgr.record_prefix_cache_stats(req, 4)
    stats = mgr.make_prefix_cache_stats()
    assert (stats.requests, stats.queries, stats.hits) == (1, 12, 0)
    assert (stats.preempted_requests, stats.preempted_queries, stats.preempted_hits) == (1, 12, 4)


# ----------------------------------------------------------------- vLLM's own requests, live
def _vllm_run(make_manager, make_hasher):
    """One scenario on vLLM 0.33.0's Request objects: what each lookup finds and the events."""
    from vllm.pooling_params import PoolingParams
    from vllm.sampling_params import SamplingParams
    from vllm.v1.request import Request as VRequest

    mgr = make_manager()
    out = []

    def request(rid, tokens, sampling=None, pooling=None, **kw):
        return VRequest(rid, list(tokens), sampling, pooling, block_hasher=make_hasher(), **kw)

    first = request("a", range(12), SamplingParams(max_tokens=4), session_id="chat-7")
    mgr.allocate_slots(first, 12)
    pooled = request("p", range(12), None, PoolingParams())  # no kv_cache_report_mode at all
    full = request("f", range(12), SamplingParams(max_tokens=4, extra_args={"kv_cache_report_mode": "full"}),
                   session_id="chat-8")
    skip = request("s", range(12), SamplingParams(max_tokens=4, skip_reading_prefix_cache=True))
    for req in (pooled, full, skip):
        out.append(mgr.get_computed_blocks(req)[1])
    for ev in mgr.take_events():
        out.append((type(ev).__name__, getattr(ev, "session_id", None), len(getattr(ev, "block_hashes", ()))))
    return out


def test_live_vllm_requests_through_the_managers(impl, monkeypatch):
    """vLLM's own requests (a pooling one without ``kv_cache_report_mode``, one asking for
    ``"full"`` reports, one skipping the cache, sessions) give kvcy's managers vLLM's hits and
    events."""
    pytest.importorskip("vllm.v1.request")
    from vllm.utils.hashing import get_hash_fn_by_name
    from vllm.v1.core import kv_cache_utils as vku
    from vllm.v1.core.kv_cache_manager import KVCacheManager as VManager
    from vllm.v1 import kv_cache_interface as vkv

    monkeypatch.setenv("VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES", "0")
    sha = get_hash_fn_by_name("sha256")
    vku.init_none_hash(sha)

    def vllm_manager():
        import torch

        spec = vkv.FullAttentionSpec(block_size=BS, num_kv_heads=1, head_size=8, dtype=torch.float16)
        cfg = vkv.KVCacheConfig(num_blocks=16, kv_cache_tensors=[], kv_cache_groups=[vkv.KVCacheGroupSpec(["l"], spec)])
        return VManager(cfg, max_model_len=64, scheduler_block_size=BS, hash_block_size=BS,
                        enable_caching=True, enable_kv_cache_events=True)

    want = _vllm_run(vllm_manager, lambda: vku.get_request_block_hasher(BS, sha))
    got = _vllm_run(lambda: _manager(impl, enable_kv_cache_events=True), _hasher)
    assert want == [8, 8, 0, ("BlockStored", "chat-7", 3), ("BlockStored", "chat-8", 2)]
    assert got == want
