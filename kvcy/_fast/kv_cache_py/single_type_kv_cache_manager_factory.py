"""Which manager serves a spec (pure-Python twin): ``spec_manager_map`` and
``get_manager_for_kv_cache_spec`` (vLLM 0.33.0's ``single_type_kv_cache_manager``),
which the coordinators call for each KV-cache group.
"""

from __future__ import annotations

from typing import Any

from kvcy.kv_cache_interface import (
    ChunkedLocalAttentionSpec,
    CircularBufferSpec,
    CrossAttentionSpec,
    FullAttentionSpec,
    KVCacheSpec,
    MambaSpec,
    RSWASpec,
    SinkFullAttentionSpec,
    SlidingWindowSpec,
)
from kvcy.kv_cache_interface.hisparse import check_no_hisparse_spec
from kvcy._fast.kv_cache_py.single_type_kv_cache_manager_local_attention import (
    ChunkedLocalAttentionManager,
    CircularBufferManager,
    RSWAManager,
    SlidingWindowManager,
)
from kvcy._fast.kv_cache_py.single_type_kv_cache_manager_mamba import MambaManager
from kvcy._fast.kv_cache_py.single_type_kv_cache_manager import (
    CrossAttentionManager,
    FullAttentionManager,
    SingleTypeKVCacheManager,
    SinkFullAttentionManager,
)


spec_manager_map: dict[type, type[SingleTypeKVCacheManager]] = {
    FullAttentionSpec: FullAttentionManager,
    SinkFullAttentionSpec: SinkFullAttentionManager,
    RSWASpec: RSWAManager,
    SlidingWindowSpec: SlidingWindowManager,
    CircularBufferSpec: CircularBufferManager,
    ChunkedLocalAttentionSpec: ChunkedLocalAttentionManager,
    MambaSpec: MambaManager,
    CrossAttentionSpec: CrossAttentionManager,
}


def _manager_class(spec: KVCacheSpec) -> type[SingleTypeKVCacheManager]:
    for klass in type(spec).__mro__:
        if klass in spec_manager_map:
            return spec_manager_map[klass]
    raise AssertionError(f"No manager registered for KVCacheSpec {type(spec)}")  # (vLLM's assertion)


def _admission_cap(spec: KVCacheSpec, max_in_flight_tokens: int, max_model_len: int) -> int | None:
    if isinstance(spec, (SlidingWindowSpec, ChunkedLocalAttentionSpec)):
        return spec.max_admission_blocks_per_request(max_in_flight_tokens, max_model_len)
    return None


def get_manager_for_kv_cache_spec(
    kv_cache_spec: KVCacheSpec,
    max_in_flight_tokens: int,
    max_model_len: int,
    role: str | None = None,
    **kwargs: Any,
) -> SingleTypeKVCacheManager:
    """The single-type manager for ``kv_cache_spec`` (vLLM's parameters).

    ``kwargs`` go to the manager's class (``block_pool``, ``enable_caching``,
    ``kv_cache_group_id``, ``scheduler_block_size``, ``dcp_world_size``,
    ``pcp_world_size``, ``needs_kv_cache_zeroing``); sliding-window and chunked-local
    managers also get their admission cap from ``max_in_flight_tokens`` and
    ``max_model_len``.  ``role``: a group role other than the default one is
    HiSparse's, as are HiSparse's specs (``NotImplementedError``).
    """
    if role is not None and role != "default":
        raise NotImplementedError(f"KV-cache group role {role!r} (HiSparse) is not implemented in kvcy")
    check_no_hisparse_spec(kv_cache_spec)
    klass = _manager_class(kv_cache_spec)
    cap = _admission_cap(kv_cache_spec, max_in_flight_tokens, max_model_len)
    if cap is not None:
        kwargs["max_admission_blocks_per_request"] = cap
    return klass(kv_cache_spec, **kwargs)
