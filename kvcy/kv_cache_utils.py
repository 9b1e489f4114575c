"""Blocks, the free-block queue, block hashing and KV-cache sizing, under vLLM's names.

``KVCacheBlock`` and ``FreeKVCacheBlockQueue`` come from the selected twin;
hashing from :mod:`kvcy.hashing`; sizing from :mod:`kvcy.kv_cache_sizing`.
"""

from kvcy._fast import kv_cache as _impl
from kvcy.hashing import (  # noqa: F401
    BlockHash,
    BlockHashWithGroupId,
    generate_block_hash_extra_keys,
    get_block_hash,
    get_group_id,
    get_hash_fn_by_name,
    get_none_hash,
    get_request_block_hasher,
    hash_block_tokens,
    init_none_hash,
    make_block_hash_with_group_id,
    need_extra_keys,
)
from kvcy.metrics import CachingMetrics, PrefixCacheStats, PrefixCachingMetrics  # noqa: F401

KVCacheBlock = _impl.KVCacheBlock
FreeKVCacheBlockQueue = _impl.FreeKVCacheBlockQueue

from kvcy.kv_cache_sizing import *  # noqa: E402,F401,F403  (the sizing layer, seed 002)
