"""Adaptive replacement cache (``vllm.v1.kv_offload.cpu.policies.arc``), registered as ``"arc"``.

Exports, under vLLM 0.33.0's names:

* ``ARCCachePolicy`` (stem ``policies_arc``): recency and frequency lists with ghosts.

A stem ``S`` above is ``kvcy/_fast/offload_c/S.pyx`` (compiled, ``include``-d
into the extension ``kvcy._fast._offload_c``) and ``kvcy/_fast/offload_py/S.py``
(pure Python): the two twins of one concept.

Which twin: :mod:`kvcy._fast` picks one at import, for all of kvcy (the
offloading twin is loaded on first use, as ``kvcy._fast.offload``):
the compiled one when it imports, the pure-Python one with
``KVCY_NO_EXTENSIONS=1`` or when the extension is missing or broken
(``KVCY_REQUIRE_EXTENSIONS=1`` makes that an error); ``kvcy.IMPLEMENTATION``
says which (``"cython"`` / ``"python"``).
"""

from kvcy._fast import offload as _twin

ARCCachePolicy = _twin.ARCCachePolicy

__all__ = ["ARCCachePolicy"]
