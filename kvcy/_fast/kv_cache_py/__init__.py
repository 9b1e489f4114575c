"""The pure-Python twin of the KV-cache block manager, one concept per module.

The compiled twin (``kvcy/_fast/kv_cache_c/``) has one ``.pyx`` per concept with
the same stems.  Nothing imports these modules but ``kvcy._fast._kv_cache_py``,
which assembles them into the twin module the selector (``kvcy._fast``) loads.

* ``_common``: argument checks, ``cdiv``, the attribute rules (``_Checked``);
* ``request``: ``Request``;
* ``kv_cache_utils``: ``KVCacheBlock``;
* ``kv_cache_utils_free_queue``: ``FreeKVCacheBlockQueue``;
* ``block_pool_block_map``: ``BlockHashToBlockMap``, ``resolve_block_hashes``;
* ``block_pool``: ``BlockPool``;
* ``single_type_kv_cache_manager``: ``SingleTypeKVCacheManager``, the full (and sink)
  and cross-attention managers;
* ``single_type_kv_cache_manager_mamba``: ``MambaManager`` (align mode, partial hits) and its helpers;
* ``single_type_kv_cache_manager_local_attention``: ``SlidingWindowManager``, ``ChunkedLocalAttentionManager``,
  ``RSWAManager``, ``CircularBufferManager``;
* ``single_type_kv_cache_manager_factory``: ``spec_manager_map``, ``get_manager_for_kv_cache_spec``;
* ``kv_cache_coordinator``: ``KVCacheCoordinator``, its three kinds,
  ``get_kv_cache_coordinator``;
* ``kv_cache_manager_blocks``: ``KVCacheBlocks``;
* ``kv_cache_manager``: ``KVCacheManager``.
"""
