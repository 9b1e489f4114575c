"""Per-attention-type block bookkeeping (vLLM 0.33.0's ``vllm.v1.core.single_type_kv_cache_manager``).

Exports, from stem ``single_type_kv_cache_manager``: ``SingleTypeKVCacheManager``
(the base), ``FullAttentionManager``, ``SinkFullAttentionManager``,
``CrossAttentionManager``; from stem ``single_type_kv_cache_manager_mamba``: ``MambaManager``
(with Mamba align mode); from stem ``single_type_kv_cache_manager_local_attention``:
``SlidingWindowManager``, ``ChunkedLocalAttentionManager``, ``RSWAManager``,
``CircularBufferManager``; from
stem ``single_type_kv_cache_manager_factory``: ``spec_manager_map`` (spec class -> manager class) and
``get_manager_for_kv_cache_spec``; and, defined here,
``register_all_kvcache_specs`` (vLLM's engine-start registration of the
built-in specs in :class:`kvcy.kv_cache_interface.KVCacheSpecRegistry`).

A stem ``S`` below is ``kvcy/_fast/kv_cache_c/S.pyx`` (compiled, ``include``-d
into the extension ``kvcy._fast._kv_cache_c``) and ``kvcy/_fast/kv_cache_py/S.py``
(pure Python): the two twins of one concept.

Which twin: :mod:`kvcy._fast` picks one at import, for all of kvcy: the
compiled one when it imports, the pure-Python one with ``KVCY_NO_EXTENSIONS=1``
or when the extension is missing or broken (``KVCY_REQUIRE_EXTENSIONS=1`` makes
that an error); ``kvcy.IMPLEMENTATION`` says which (``"cython"`` / ``"python"``).
"""

from typing import TYPE_CHECKING

from kvcy._fast import kv_cache as _impl

if TYPE_CHECKING:
    # Type checkers see the pure-Python twin (the compiled one has the same API:
    # kvcy/_fast/_kv_cache_c.pyi); at run time the selected twin's classes.
    from kvcy._fast._kv_cache_py import (
        SingleTypeKVCacheManager,
        FullAttentionManager,
        SinkFullAttentionManager,
        SlidingWindowManager,
        ChunkedLocalAttentionManager,
        RSWAManager,
        CircularBufferManager,
        MambaManager,
        CrossAttentionManager,
        spec_manager_map,
        get_manager_for_kv_cache_spec,
    )
else:
    SingleTypeKVCacheManager = _impl.SingleTypeKVCacheManager
    FullAttentionManager = _impl.FullAttentionManager
    SinkFullAttentionManager = _impl.SinkFullAttentionManager
    SlidingWindowManager = _impl.SlidingWindowManager
    ChunkedLocalAttentionManager = _impl.ChunkedLocalAttentionManager
    RSWAManager = _impl.RSWAManager
    CircularBufferManager = _impl.CircularBufferManager
    MambaManager = _impl.MambaManager
    CrossAttentionManager = _impl.CrossAttentionManager
    spec_manager_map = _impl.spec_manager_map
    get_manager_for_kv_cache_spec = _impl.get_manager_for_kv_cache_spec



def register_all_kvcache_specs(vllm_config: object = None) -> None:
    """Register the built-in spec classes with their managers (the selected
    twin's) in :class:`~kvcy.kv_cache_interface.KVCacheSpecRegistry`, as vLLM's
    engine core does at start-up; a class registered already keeps its entry,
    so calling it again changes nothing.  ``vllm_config`` is vLLM's argument,
    which the registration does not read."""
    from kvcy.kv_cache_interface import KVCacheSpecRegistry

    KVCacheSpecRegistry._ensure_registered()


__all__ = [
    "ChunkedLocalAttentionManager",
    "CircularBufferManager",
    "CrossAttentionManager",
    "FullAttentionManager",
    "MambaManager",
    "RSWAManager",
    "SingleTypeKVCacheManager",
    "SinkFullAttentionManager",
    "SlidingWindowManager",
    "get_manager_for_kv_cache_spec",
    "register_all_kvcache_specs",
    "spec_manager_map",
]
