"""``order_request_keys``: a request's keys head to tail, as the policies rank them
(``vllm.v1.kv_offload.cpu.policies.base``)."""

from __future__ import annotations

from collections.abc import Sequence

from kvcy.kv_offload.base import OffloadKey, ReqContext


def order_request_keys(key_groups: Sequence[Sequence[OffloadKey]], req_context: ReqContext) -> list[OffloadKey]:
    """A request's keys head to tail: its groups concatenated in group order,
    then stably sorted by end-token position when every key has one.

    Args:
        key_groups: the request's keys, one list per KV cache group.
        req_context: the request, whose recorded positions order the keys.
    """
    keys = [key for group in key_groups for key in group]
    get = req_context.get_offload_key_position
    positions = [get(key) for key in keys]
    if None in positions:
        return keys
    order = sorted(range(len(keys)), key=positions.__getitem__)
    return [keys[i] for i in order]
