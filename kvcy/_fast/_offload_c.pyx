# cython: language_level=3, embedsignature=False
# (docstrings identical to the pure-Python twin's; inspect.signature still works)
# distutils: language = c++
"""Compiled twin of the CPU offloading tier's scheduler-side hot paths (see ``_offload_py.py``).

The same classes, methods, arguments, docstrings and error messages as the
pure-Python twin (``CPUOffloadingManager``, ``LRUCachePolicy``,
``ARCCachePolicy``, ``ChunkStatus``, ``CachePolicy``, ``order_request_keys``),
as typed ``cdef class``es returning the shared API objects of
``kvcy.kv_offload``.  What differs is the bookkeeping:

* each policy keeps one dict key -> ``ChunkStatus``; a status is also the node
  of the intrusive lists (ARC's t1/t2, LRU's fresh ranks); ARC's ghosts are
  plain nodes in b1/b2 and in the same dict, so one lookup tells resident,
  ghost or neither;
* LRU keys ranked with their request live in a C++ ``std::set`` ordered by
  ``(rank, key bytes)``, and eviction merges it with the fresh-rank list;
* a request's record is one insertion-ordered dict key -> flags (for the
  native LRU, which needs no flags: key -> the chunk it had, a hint that
  ``on_request_finished`` checks before using);
* ``count_hits`` is the connector's admission loop (lookups until the first
  key that is not a hit) as one call;
* every public call checks its arguments first (bounds checks are off in the
  build), and the state Python can see is read-only (``chunks``, ``t1``... are
  views or snapshots), so no Python-level call or assignment can corrupt it.

With a policy class from ``CachePolicyFactory`` (a Python subclass of this
module's ``CachePolicy``) the manager calls the policy's Python methods.

One extension module assembled from per-concept sources under
``offload_c/`` with Cython ``include`` (as uvloop does), so the hot paths
still inline across concepts; each ``<stem>.pyx`` has a ``<stem>.pxd``
with its classes' declarations (``_offload_c.pxd`` includes them), and the
pure-Python twin has one module per stem under ``offload_py/``:

* ``_common.pyx``: API constants, argument checks, load/store specs
* ``request_order.pyx``: order_request_keys, _Positions
* ``chunk_status.pyx``: ChunkStatus and the intrusive lists
* ``cache_policy.pyx``: CachePolicy (the interface the manager calls)
* ``lru_policy.pyx``: LRUCachePolicy
* ``arc_policy.pyx``: ARCCachePolicy
* ``access_record.pyx``: a request's access record on its ReqContext
* ``manager.pyx``: CPUOffloadingManager
* ``connector.pyx``: ReplayConnector and ConnectorRequest, the replay's
  offloading connector (``kvcy replay --cpu-offload``)
"""

cimport cython
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_GET_SIZE
from cpython.dict cimport PyDict_GetItemWithError, PyDict_SetDefault, PyDict_Size
from cpython.object cimport PyObject, PyObject_Hash
from cpython.ref cimport Py_REFCNT
from cython.operator cimport dereference as deref, preincrement as inc
from libc.stdint cimport int64_t, uint32_t
from libc.string cimport memcmp
from libcpp.vector cimport vector
from libcpp.utility cimport pair
from libcpp.algorithm cimport sort as cpp_sort

from collections import OrderedDict
from collections.abc import Iterable
from types import MappingProxyType

from kvcy.kv_offload.base import (
    CacheHitSource,
    ConfigInfo,
    LookupResult,
    Medium,
    OffloadingEvent,
    OffloadingManager,
    PrepareStoreOutput,
    ReqContext,
    RequestOffloadingContext,
)
from kvcy.kv_offload.metrics import OffloadingConnectorStats

import numpy as np

__all__ = [
    "ARCCachePolicy",
    "CPUOffloadingManager",
    "CachePolicy",
    "ChunkStatus",
    "ConnectorRequest",
    "IMPLEMENTATION",
    "LRUCachePolicy",
    "ReplayConnector",
    "order_request_keys",
]

IMPLEMENTATION = "cython"

include "offload_c/_common.pyx"
include "offload_c/request_order.pyx"
include "offload_c/chunk_status.pyx"
include "offload_c/cache_policy.pyx"
include "offload_c/lru_policy.pyx"
include "offload_c/arc_policy.pyx"
include "offload_c/access_record.pyx"
include "offload_c/manager.pyx"
include "offload_c/connector.pyx"
