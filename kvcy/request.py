"""The request object a serving loop hands to :class:`kvcy.KVCacheManager`.

It mirrors the parts of vLLM's ``vllm.v1.request.Request`` that the KV-cache
manager reads: the token lists, ``num_computed_tokens``, ``status`` and the
block hashes, which are kept up to date incrementally as output tokens are
appended (only newly completed blocks are hashed).

Exports ``Request`` (stem ``request``): the compiled one is a ``cdef class``
whose fields the compiled manager reads directly; each twin's manager accepts
either twin's ``Request`` and any object with the same attributes.  The plain
types around it (``RequestStatus``, ``FinishReason``, ``LoRARequest``,
``MultiModalFeatureSpec``, ``PlaceholderRange``, ``validate_token_ids``) are
one pure-Python module for both twins, :mod:`kvcy._request_types`.

A stem ``S`` below is ``kvcy/_fast/kv_cache_c/S.pyx`` (compiled, ``include``-d
into the extension ``kvcy._fast._kv_cache_c``) and ``kvcy/_fast/kv_cache_py/S.py``
(pure Python): the two twins of one concept.

Which twin: :mod:`kvcy._fast` picks one at import, for all of kvcy: the
compiled one when it imports, the pure-Python one with ``KVCY_NO_EXTENSIONS=1``
or when the extension is missing or broken (``KVCY_REQUIRE_EXTENSIONS=1`` makes
that an error); ``kvcy.IMPLEMENTATION`` says which (``"cython"`` / ``"python"``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from kvcy._fast import kv_cache as _impl
from kvcy._request_types import (
    FinishReason,
    LoRARequest,
    MultiModalFeatureSpec,
    PlaceholderRange,
    RequestStatus,
    validate_token_ids,
)

if TYPE_CHECKING:
    # Type checkers see the pure-Python twin (the compiled one has the same API:
    # kvcy/_fast/_kv_cache_c.pyi); at run time the selected twin's classes.
    from kvcy._fast._kv_cache_py import Request
else:
    Request = _impl.Request

__all__ = [
    "FinishReason",
    "LoRARequest",
    "MultiModalFeatureSpec",
    "PlaceholderRange",
    "Request",
    "RequestStatus",
    "validate_token_ids",
]
