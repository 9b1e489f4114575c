"""The block pool: allocation, freeing, caching and lazy eviction of KV-cache blocks.

Exports, under vLLM 0.33.0's names (``vllm.v1.core.block_pool``):

* ``BlockPool`` (stem ``block_pool``): the blocks, their free queue and the
  prefix-cache index.
* ``BlockHashToBlockMap`` (stem ``block_pool_block_map``): block hash -> cached block(s),
  the prefix-cache index.

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
    from kvcy._fast._kv_cache_py import BlockHashToBlockMap, BlockPool
else:
    BlockHashToBlockMap = _impl.BlockHashToBlockMap
    BlockPool = _impl.BlockPool

__all__ = ["BlockHashToBlockMap", "BlockPool"]
