"""``Request`` and ``RequestStatus``: vLLM 0.33.0's fields, defaults, checks and statuses, both twins.
"""

from __future__ import annotations

import enum

import pytest

from kvcy import hashing
from kvcy.hashing import get_hash_fn_by_name, get_request_block_hasher, init_none_hash
from kvcy.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
from kvcy.kv_events import BlockStored
from kvcy.request import Request, RequestStatus, FinishReason


BS = 4


@pytest.fixture(autouse=True)
def _none_hash():
    init_none_hash(get_hash_fn_by_name("sha256"))


def hasher(bs=BS):
    return get_request_block_hasher(bs, get_hash_fn_by_name("sha256"))


def test_bad_tokens_rejected_without_change():
    with pytest.raises(TypeError):
        Request("a", [1, 2, "x"])
    with pytest.raises(ValueError):
        Request("a", [1, 2**64])
    req = Request("a", [1, 2, 3], block_hasher=hasher())
    with pytest.raises(TypeError):
        req.append_output_token_ids([4, None])
    with pytest.raises(ValueError):
        req.append_output_token_ids([-(2**70)])
    assert req.all_token_ids == [1, 2, 3] and req.num_tokens == 3


# --------------------------------------------------------------------------- Request twins
def test_request_twins_match():
    from kvcy import _fast

    impls = _fast.available()
    reqs = []
    for name in impls:
        R = _fast.load(name)["kv_cache"].Request
        r = R("r", list(range(10)), max_tokens=4, block_hasher=hasher(), cache_salt="s")
        r.append_output_token_ids(7)
        r.append_output_token_ids([8, 9])
        r.num_computed_tokens = 5
        r.status = RequestStatus.RUNNING
        r.extra = "free attribute"
        reqs.append(r)
        for bad, exc in ((True, TypeError), (2**63, ValueError), ([1, "x"], TypeError), ([1.0], TypeError)):
            with pytest.raises(exc):
                r.append_output_token_ids(bad)
        assert r.num_tokens == 13 and r.output_token_ids == [7, 8, 9]  # nothing appended by the failures
    fields = ("request_id", "num_tokens", "num_output_tokens", "all_token_ids", "block_hashes",
              "num_computed_tokens", "status", "num_prompt_tokens", "cache_salt", "max_tokens", "extra")
    for r in reqs[1:]:
        assert {f: getattr(r, f) for f in fields} == {f: getattr(reqs[0], f) for f in fields}
    assert len(reqs[0].block_hashes) == 3


def test_embeddings_only_prompt_as_vllm(impl):
    """vLLM's ``Request`` takes ``prompt_token_ids=None`` with ``prompt_embeds``: the prompt
    is as long as the embeddings, its token ids are zeros, and its blocks are keyed by the
    embeddings' digests; with neither, vLLM's ValueError.  kvcy raised TypeError."""
    import hashlib

    torch = pytest.importorskip("torch")
    embeds = torch.arange(40, dtype=torch.float32).reshape(10, 4)
    hasher = get_request_block_hasher(BS, get_hash_fn_by_name("sha256"))
    req = impl.kv_cache.Request("r", None, prompt_embeds=embeds, block_hasher=hasher)
    assert req.prompt_token_ids is None
    assert (req.num_prompt_tokens, req.num_tokens, list(req.all_token_ids)) == (10, 10, [0] * 10)
    same = impl.kv_cache.Request("s", [0] * 10, prompt_embeds=embeds, block_hasher=hasher)
    assert req.block_hashes == same.block_hashes and len(req.block_hashes) == 2
    digest = hashlib.sha256(embeds[:4].numpy().tobytes()).digest()
    from kvcy.hashing import generate_block_hash_extra_keys
    assert generate_block_hash_extra_keys(req, 0, 4, 0) == ((("prompt_embeds", digest),), 0)
    with pytest.raises(ValueError, match="Neither prompt_token_ids nor prompt_embeds were defined."):
        impl.kv_cache.Request("r", None)


def hasher_small():
    return get_request_block_hasher(BS, get_hash_fn_by_name("sha256"))


# ------------------------------------------------- §7 Request.__repr__
def test_request_repr_takes_any_status(impl):
    """A status stored as a plain int (or anything else) must not break repr."""
    from kvcy._request_types import RequestStatus

    req = impl.kv_cache.Request("a", [1, 2, 3], block_hasher=hasher_small())
    assert repr(req) == "Request(id='a', tokens=3, computed=0, status=WAITING)"
    req.status = RequestStatus.RUNNING
    assert repr(req).endswith("status=RUNNING)")
    req.status = int(RequestStatus.RUNNING)
    assert type(req.status) is int
    assert repr(req).endswith(f"status={int(RequestStatus.RUNNING)})")
    req.status = "odd"
    assert repr(req).endswith("status='odd')")


# =================================================================================================
# vLLM 0.33.0 drop-in, request status: kvcy's RequestStatus is vLLM's, and the
# manager recognises a status by value whichever enum class carries it.
# =================================================================================================

# vLLM 0.33.0's members, in order, with their values (vllm/v1/request.py).
VLLM_STATUSES = [
    ("WAITING", 1),
    ("WAITING_FOR_STRUCTURED_OUTPUT_GRAMMAR", 2),
    ("WAITING_FOR_REMOTE_KVS", 3),
    ("WAITING_FOR_STREAMING_REQ", 4),
    ("RUNNING", 5),
    ("PREEMPTED", 6),
    ("FINISHED_STOPPED", 7),
    ("FINISHED_LENGTH_CAPPED", 8),
    ("FINISHED_ABORTED", 9),
    ("FINISHED_IGNORED", 10),
    ("FINISHED_ERROR", 11),
    ("FINISHED_REPETITION", 12),
]


# A stand-in for vLLM's own class: same names and values, another class.
ForeignStatus = enum.IntEnum("ForeignStatus", VLLM_STATUSES)


def _manager(impl):
    init_none_hash(get_hash_fn_by_name("sha256"))
    spec = FullAttentionSpec(block_size=4, num_kv_heads=1, head_size=8, dtype="float16")
    cfg = KVCacheConfig(num_blocks=11, kv_cache_tensors=[], kv_cache_groups=[KVCacheGroupSpec(["l0"], spec)])
    # watermark 0.5 of 11 blocks: 5 blocks kept back from waiting / preempted requests
    return impl.kv_cache.KVCacheManager(cfg, max_model_len=256, scheduler_block_size=4, hash_block_size=4,
                                        watermark=0.5)


def test_members_and_values():
    assert [(m.name, m.value) for m in RequestStatus] == VLLM_STATUSES
    assert list(RequestStatus.__members__) == [n for n, _ in VLLM_STATUSES]
    assert str(RequestStatus.RUNNING) == "RUNNING"


def test_is_finished_and_reasons():
    finished = {m for m in RequestStatus if RequestStatus.is_finished(m)}
    assert finished == {m for m in RequestStatus if m.value > 6}
    reasons = {m.name: RequestStatus.get_finished_reason(m) for m in RequestStatus}
    assert reasons == {
        "WAITING": None, "WAITING_FOR_STRUCTURED_OUTPUT_GRAMMAR": None, "WAITING_FOR_REMOTE_KVS": None,
        "WAITING_FOR_STREAMING_REQ": FinishReason.STOP, "RUNNING": None, "PREEMPTED": None,
        "FINISHED_STOPPED": FinishReason.STOP, "FINISHED_LENGTH_CAPPED": FinishReason.LENGTH,
        "FINISHED_ABORTED": FinishReason.ABORT, "FINISHED_IGNORED": FinishReason.LENGTH,
        "FINISHED_ERROR": FinishReason.ERROR, "FINISHED_REPETITION": FinishReason.REPETITION,
    }
    assert [(r.name, r.value, str(r)) for r in FinishReason] == [
        ("STOP", 0, "stop"), ("LENGTH", 1, "length"), ("ABORT", 2, "abort"),
        ("ERROR", 3, "error"), ("REPETITION", 4, "repetition"),
    ]


@pytest.mark.parametrize("subclass", [False, True], ids=["request", "request-subclass"])
@pytest.mark.parametrize("status_name, refused", [("WAITING", True), ("PREEMPTED", True), ("RUNNING", False)])
def test_watermark_by_value_for_a_foreign_status_class(impl, subclass, status_name, refused):
    """A 6-block request with 10 free blocks and watermark 0.5 is refused while waiting
    or preempted, whichever enum class its status comes from."""
    cls = impl.kv_cache.Request
    if subclass:  # the manager's generic path (not the compiled Request fast path)
        cls = type("SubRequest", (cls,), {})
    for status in (RequestStatus[status_name], ForeignStatus[status_name]):
        mgr = _manager(impl)
        req = cls("r", list(range(24)), block_hasher=get_request_block_hasher(4, get_hash_fn_by_name("sha256")))
        req.status = status
        got = mgr.allocate_slots(req, 24, has_scheduled_reqs=True)
        assert (got is None) == refused, status
        if refused:
            assert mgr.block_pool.get_num_free_blocks() == 10
        assert mgr.allocate_slots(req, 24, has_scheduled_reqs=False) is not None


@pytest.mark.parametrize("status, refused", [
    (1, True), (6, True), (2, False), (True, True), (False, False), (1 << 70, False), (-(1 << 70), False),
    (ForeignStatus.WAITING, True), (ForeignStatus.RUNNING, False),
], ids=repr)
def test_watermark_for_other_int_statuses(impl, status, refused):
    """Statuses of other int types (a plain int, a bool, ints past 64 bits, vLLM-like IntEnums):
    waiting / preempted as ``==`` with kvcy's members says, in both twins, for kvcy's Request and
    for a request object of another type."""
    class Other:  # a vLLM-shaped request object (attributes only)
        def __init__(self, tokens):
            self.request_id, self.num_computed_tokens, self.num_in_flight_tokens = "r", 0, 0
            self.block_hashes, self._tokens, self.num_prompt_tokens = [], tokens, len(tokens)
            self.skip_reading_prefix_cache = False

        @property
        def num_tokens(self):
            return len(self._tokens)

    assert (status == RequestStatus.WAITING or status == RequestStatus.PREEMPTED) == refused
    for make in (lambda t: impl.kv_cache.Request("r", t), Other):
        mgr = _manager(impl)
        req = make(list(range(24)))
        req.status = status
        assert (mgr.allocate_slots(req, 24, has_scheduled_reqs=True) is None) == refused, status
        assert (mgr.allocate_slots(req, 24, has_scheduled_reqs=False) is None) is False


# =================================================================================================
# vLLM 0.33.0 drop-in, request side: the
# ``Request`` fields vLLM's block managers read, with vLLM's names, defaults and meaning, both
# for kvcy's ``Request`` and for other request objects (vLLM's own) on the managers' generic path.
#
# What vLLM 0.33.0's ``v1/core`` reads from a request: ``request_id``, ``status``,
# ``num_tokens``, ``num_prompt_tokens``, ``num_computed_tokens``, ``num_in_flight_tokens``,
# ``num_preemptions``, ``all_token_ids``, ``block_hashes``, ``mm_features``, ``lora_request``,
# ``cache_salt``, ``prompt_embeds``, ``skip_reading_prefix_cache``, ``session_id`` (events),
# ``shared_prefix_boundary`` (sparse retention), ``kv_cache_report_mode`` (read with
# ``getattr``, default ``"incremental"``: vLLM's pooling requests have none) and
# ``_prompt_embeds_per_block_hashes`` (a digest cache kvcy does without: it rehashes).
# =================================================================================================

def _manager_request(impl, **kw):
    spec = FullAttentionSpec(block_size=BS, num_kv_heads=1, head_size=8, dtype="float16")
    cfg = KVCacheConfig(num_blocks=16, kv_cache_tensors=[], kv_cache_groups=[KVCacheGroupSpec(["l"], spec)])
    return impl.kv_cache.KVCacheManager(cfg, max_model_len=64, scheduler_block_size=BS, hash_block_size=BS,
                                        enable_caching=True, **kw)


def _hasher():
    hashing.init_none_hash(hashing.sha256)
    return hashing.get_request_block_hasher(BS, hashing.sha256)


def _stored(events):
    return [e for e in events if isinstance(e, BlockStored)]


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
    mgr = _manager_request(impl)
    first = impl.kv_cache.Request("a", range(12), block_hasher=_hasher())
    mgr.allocate_slots(first, 12)
    again = impl.kv_cache.Request("b", range(12), block_hasher=_hasher())
    assert mgr.get_computed_blocks(again)[1] == 8
    again.skip_reading_prefix_cache = True
    assert mgr.get_computed_blocks(again)[1] == 0
    assert not mgr.prefix_cache_lookup_enabled(again)


def test_session_id_reaches_block_stored_events(impl):
    mgr = _manager_request(impl, enable_kv_cache_events=True)
    req = impl.kv_cache.Request("a", range(8), block_hasher=_hasher(), session_id="chat-7")
    mgr.allocate_slots(req, 8)
    (ev,) = _stored(mgr.take_events())
    assert ev.session_id == "chat-7"


def test_report_mode_missing_reads_as_incremental(impl):
    """vLLM reads ``kv_cache_report_mode`` with a default: a request without one finds its
    hit and re-emits nothing (kvcy raised AttributeError)."""
    mgr = _manager_request(impl, enable_kv_cache_events=True)
    mgr.allocate_slots(_PoolingLikeRequest("a", range(12), _hasher()), 12)
    mgr.take_events()
    other = _PoolingLikeRequest("b", range(12), _hasher())
    assert mgr.get_computed_blocks(other)[1] == 8
    assert mgr.take_events() == []
    other.kv_cache_report_mode = "full"
    assert mgr.get_computed_blocks(other)[1] == 8
    assert len(_stored(mgr.take_events())) == 1


def test_report_mode_full_reemits_hits_of_kvcy_requests(impl):
    mgr = _manager_request(impl, enable_kv_cache_events=True)
    mgr.allocate_slots(impl.kv_cache.Request("a", range(12), block_hasher=_hasher(), session_id="s"), 12)
    mgr.take_events()
    full = impl.kv_cache.Request("b", range(12), block_hasher=_hasher(), kv_cache_report_mode="full",
                                 session_id="s2")
    assert mgr.get_computed_blocks(full)[1] == 8
    (ev,) = _stored(mgr.take_events())
    assert ev.session_id == "s2" and len(ev.block_hashes) == 2


def test_preempted_requests_count_in_prefix_cache_stats(impl):
    mgr = _manager_request(impl, log_stats=True)
    req = impl.kv_cache.Request("a", range(12), block_hasher=_hasher())
    mgr.record_prefix_cache_stats(req, 0)
    req.num_preemptions = 1
    mgr.record_prefix_cache_stats(req, 4)
    stats = mgr.make_prefix_cache_stats()
    assert (stats.requests, stats.queries, stats.hits) == (1, 12, 0)
    assert (stats.preempted_requests, stats.preempted_queries, stats.preempted_hits) == (1, 12, 4)


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
    got = _vllm_run(lambda: _manager_request(impl, enable_kv_cache_events=True), _hasher)
    assert want == [8, 8, 0, ("BlockStored", "chat-7", 3), ("BlockStored", "chat-8", 2)]
    assert got == want
