"""``order_request_keys``: a request's keys head to tail, as the policies rank them
(``vllm.v1.kv_offload.cpu.policies.base``)."""

from __future__ import annotations

from collections.abc import Sequence

from kvcy._fast.offload_py._common import _positions_of
from kvcy.kv_offload.base import OffloadKey, ReqContext


def order_request_keys(key_groups: Sequence[Sequence[OffloadKey]], req_context: ReqContext) -> list[OffloadKey]:
    """A request's keys head to tail: its groups concatenated in group order,
    then stably sorted by end-token position when every key has one.

    Args:
        key_groups: the request's keys, one list per KV cache group.
        req_context: the request, whose recorded positions order the keys.

    Raises:
        TypeError: a position read is not an int.
    """
    keys = [key for group in key_groups for key in group]
    positions = _positions_of(keys, req_context)
    if positions is None:
        return keys
    order = sorted(range(len(keys)), key=positions.__getitem__)
    return [keys[i] for i in order]
