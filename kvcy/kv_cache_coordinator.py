"""Coordinators over the KV-cache groups (vLLM 0.33.0's ``vllm.v1.core.kv_cache_coordinator``).

Exports, all from stem ``kv_cache_coordinator``: ``KVCacheCoordinator`` (the base),
``KVCacheCoordinatorNoPrefixCache``, ``UnitaryKVCacheCoordinator`` (one
group), ``HybridKVCacheCoordinator`` (several attention types, one prefix hit
agreed across them), ``get_kv_cache_coordinator`` (picks one for a config) and
``replay_boundaries`` (where a replay of a prompt can resume: sparse retention).
``SpecGroup`` (an entry of the hybrid coordinator's ``attention_groups``: groups of one
spec, looked up together) is one class for both twins.

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
from kvcy._request_types import SpecGroup

if TYPE_CHECKING:
    # Type checkers see the pure-Python twin (the compiled one has the same API:
    # kvcy/_fast/_kv_cache_c.pyi); at run time the selected twin's classes.
    from kvcy._fast._kv_cache_py import (
        KVCacheCoordinator,
        KVCacheCoordinatorNoPrefixCache,
        UnitaryKVCacheCoordinator,
        HybridKVCacheCoordinator,
        get_kv_cache_coordinator,
        replay_boundaries,
    )
else:
    KVCacheCoordinator = _impl.KVCacheCoordinator
    KVCacheCoordinatorNoPrefixCache = _impl.KVCacheCoordinatorNoPrefixCache
    UnitaryKVCacheCoordinator = _impl.UnitaryKVCacheCoordinator
    HybridKVCacheCoordinator = _impl.HybridKVCacheCoordinator
    get_kv_cache_coordinator = _impl.get_kv_cache_coordinator
    replay_boundaries = _impl.replay_boundaries

__all__ = [
    "HybridKVCacheCoordinator",
    "KVCacheCoordinator",
    "KVCacheCoordinatorNoPrefixCache",
    "SpecGroup",
    "UnitaryKVCacheCoordinator",
    "get_kv_cache_coordinator",
    "replay_boundaries",
]
