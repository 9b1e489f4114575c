"""The KV-cache manager a scheduler embeds (vLLM 0.33.0's ``vllm.v1.core.kv_cache_manager``).

Exports:

* ``KVCacheManager`` (stem ``kv_cache_manager``): prefix-cache lookup,
  ``allocate_slots``, ``free`` and the stats a scheduler reads.
* ``KVCacheBlocks`` (stem ``kv_cache_manager_blocks``): the blocks ``allocate_slots``
  and ``get_computed_blocks`` return, one tuple per KV-cache group.

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
    from kvcy._fast._kv_cache_py import KVCacheBlocks, KVCacheManager
else:
    KVCacheBlocks = _impl.KVCacheBlocks
    KVCacheManager = _impl.KVCacheManager

__all__ = ["KVCacheBlocks", "KVCacheManager"]
