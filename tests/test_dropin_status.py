"""vLLM 0.33.0 drop-in, request status (issue 14): kvcy's RequestStatus is vLLM's, and the
manager recognises a status by value whichever enum class carries it."""

from __future__ import annotations

import enum

import pytest

from kvcy.hashing import get_hash_fn_by_name, get_request_block_hasher, init_none_hash
from kvcy.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
from kvcy.request import FinishReason, RequestStatus

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


def _manager(impl):
    init_none_hash(get_hash_fn_by_name("sha256"))
    spec = FullAttentionSpec(block_size=4, num_kv_heads=1, head_size=8, dtype="float16")
    cfg = KVCacheConfig(num_blocks=11, kv_cache_tensors=[], kv_cache_groups=[KVCacheGroupSpec(["l0"], spec)])
    # watermark 0.5 of 11 blocks: 5 blocks kept back from waiting / preempted requests
    return impl.kv_cache.KVCacheManager(cfg, max_model_len=256, scheduler_block_size=4, hash_block_size=4,
                                        watermark=0.5)


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
