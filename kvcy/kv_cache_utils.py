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

# --- vLLM 0.33.0 names added for the drop-in (issue 14); kept apart from the
# --- names above so that merging the explicit-import rewrite stays simple.
from kvcy.hashing import (  # noqa: E402,F401
    DEFAULT_NONE_HASH_SEED,
    BlockHashList,
    BlockHashListWithBlockSize,
    ExternalBlockHash,
    get_none_hash_seed,
    maybe_convert_block_hash,
    resolve_block_hashes,
    resolve_none_hash_seed,
    to_event_extra_keys,
)


def __getattr__(name: str):
    # NONE_HASH is read live from kvcy.hashing: init_none_hash rebinds it there.
    if name == "NONE_HASH":
        from kvcy import hashing

        return hashing.NONE_HASH
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
