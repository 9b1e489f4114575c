# kv_cache_c/manager_factory.pyx: which manager serves a spec, spec_manager_map and
# get_manager_for_kv_cache_spec (vLLM: vllm/v1/core/single_type_kv_cache_manager.py), which the
# coordinators call for each KV-cache group.
# Included into kvcy/_fast/_kv_cache_c.pyx (one extension module), after every manager.

spec_manager_map = {
    FullAttentionSpec: FullAttentionManager,
    SinkFullAttentionSpec: SinkFullAttentionManager,
    RSWASpec: RSWAManager,
    SlidingWindowSpec: SlidingWindowManager,
    CircularBufferSpec: CircularBufferManager,
    ChunkedLocalAttentionSpec: ChunkedLocalAttentionManager,
    MambaSpec: MambaManager,
    CrossAttentionSpec: CrossAttentionManager,
}


def _manager_class(spec):
    for klass in type(spec).__mro__:
        if klass in spec_manager_map:
            return spec_manager_map[klass]
    raise ValueError(f"no KV-cache manager for spec type {type(spec).__name__}")


def _admission_cap(spec, max_in_flight_tokens, max_model_len):
    if isinstance(spec, (SlidingWindowSpec, ChunkedLocalAttentionSpec)):
        return spec.max_admission_blocks_per_request(max_in_flight_tokens, max_model_len)
    return None


def get_manager_for_kv_cache_spec(kv_cache_spec, block_pool, enable_caching, kv_cache_group_id,
                                  scheduler_block_size, max_in_flight_tokens, max_model_len,
                                  needs_kv_cache_zeroing=False):
    klass = _manager_class(kv_cache_spec)
    return klass(
        kv_cache_spec,
        block_pool,
        enable_caching,
        kv_cache_group_id,
        scheduler_block_size,
        needs_kv_cache_zeroing=needs_kv_cache_zeroing,
        max_admission_blocks_per_request=_admission_cap(kv_cache_spec, max_in_flight_tokens, max_model_len),
    )
