"""A KV-aware routing index across a fleet of vLLM / kvcy instances: ``KVIndex``.

Each instance publishes KV-cache events (``kvcy.kv_events``: ``BlockStored``,
``BlockRemoved``, ``AllBlocksCleared`` in ``KVEventBatch``es, vLLM 0.33.0's
wire format); ``KVIndex`` folds them into "which instance holds which block
hash, in which medium" and answers, for a request's chained block hashes, how
many leading blocks each instance holds (``longest_prefix``) and which holds
the most (``best_instance``).  ``KVIndex``'s docstring defines the semantics.

Which twin: ``KVIndex`` is the compiled ``kvcy._fast._kv_index_c``
(``kvcy/_fast/_kv_index_c.pyx``: C hash tables and per-hash instance bitsets)
or the pure-Python ``kvcy/_fast/_kv_index_py.py``, as :mod:`kvcy._fast` chose
for all of kvcy (``kvcy.IMPLEMENTATION``): ``KVCY_NO_EXTENSIONS=1`` forces the
pure one, ``KVCY_REQUIRE_EXTENSIONS=1`` makes a missing compiled one an error.
``IMPLEMENTATION`` here names the twin in use.

Calls are not synchronised: an index shared by threads (a subscriber applying
events, a router querying) wants a lock around its calls, with either twin:
checking events can run Python code (an event's own sequences, finalizers),
where another thread may get in.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from kvcy import _fast

if TYPE_CHECKING or _fast.NO_EXTENSIONS:
    from kvcy._fast._kv_index_py import IMPLEMENTATION, MAX_INSTANCE_MEDIUMS, MAX_INSTANCES, MAX_MEDIUMS, KVIndex
else:
    IMPLEMENTATION = _fast.kv_index.IMPLEMENTATION
    MAX_INSTANCES = _fast.kv_index.MAX_INSTANCES
    MAX_INSTANCE_MEDIUMS = _fast.kv_index.MAX_INSTANCE_MEDIUMS
    MAX_MEDIUMS = _fast.kv_index.MAX_MEDIUMS
    KVIndex = _fast.kv_index.KVIndex

__all__ = ["IMPLEMENTATION", "MAX_INSTANCES", "MAX_INSTANCE_MEDIUMS", "MAX_MEDIUMS", "KVIndex"]
