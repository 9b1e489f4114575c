"""Capacity of a HiSparse cache once requests read from the host (vLLM 0.33.0's
``vllm.v1.hisparse.layout``, its sizing part).

With HiSparse the source group's KV lives in a host pool and each request
keeps only a window of it on the device (:class:`HiSparseResidentSpec`
groups) plus a fixed hot buffer (:class:`HiSparseHotSpec`).  The worst-case
bound of :func:`kvcy.kv_cache_sizing.get_max_concurrency_for_kv_cache_config`
charges every request its whole in-flight window; once requests decode from
the host, they pin only the last few resident pages.  Building the layout
itself (groups, host pool, tensors) is not implemented.
"""

from __future__ import annotations

from typing import Any

from kvcy.kv_cache_interface import HiSparseResidentSpec, KVCacheConfig
from kvcy.kv_cache_interface._checks import cdiv

__all__ = ["ACTIVE_TAIL_PAGES", "get_hisparse_steady_state_concurrency"]

#: Resident pages behind a request's tail that stay pinned: a page an in-flight
#: step still writes must not be handed to another request.
ACTIVE_TAIL_PAGES = 2


def get_hisparse_steady_state_concurrency(config: Any, kv_cache_config: KVCacheConfig) -> float:
    """Requests of ``max_model_len`` tokens that fit once running ones read from the host.

    All but one request hold their steady-state blocks (each resident group
    capped at :data:`ACTIVE_TAIL_PAGES`); the one being admitted holds its full
    window.  The host pool bounds the count too.

    Args:
        config: a :class:`kvcy.config.KVCacheSettings` or a vLLM-style config.
        kv_cache_config: a config with host-resident groups and
            ``hisparse_host_num_blocks``.

    Raises:
        ValueError: no host-resident group, or no device group.
        AssertionError: ``hisparse_host_num_blocks`` is None (as in vLLM).
    """
    admission = steady = host = 0
    for group in kv_cache_config.kv_cache_groups:
        spec = group.kv_cache_spec
        blocks = cdiv(spec.max_memory_usage_bytes(config), spec.page_size_bytes)
        if group.host_resident:
            host += blocks
            continue
        admission += blocks
        steady += min(blocks, ACTIVE_TAIL_PAGES) if isinstance(spec, HiSparseResidentSpec) else blocks
    assert kv_cache_config.hisparse_host_num_blocks is not None, "HiSparse needs hisparse_host_num_blocks"
    if not host:
        raise ValueError("the KV cache config has no host-resident (HiSparse) group")
    if not admission:
        raise ValueError("the KV cache config has no device-resident KV cache group")
    num_blocks = kv_cache_config.num_blocks
    if num_blocks < admission:
        device = num_blocks / admission
    else:
        device = 1 + (num_blocks - admission) / steady
    return min(device, kv_cache_config.hisparse_host_num_blocks / host)
