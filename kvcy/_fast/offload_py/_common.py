"""What the offloading twin's concepts share: the API constants, owner ids, the argument
checks (the same messages as the compiled twin's ``offload_c/_common.pyx``) and load/store specs."""

from __future__ import annotations

import itertools
from collections.abc import Iterable
from typing import Any

import numpy as np

from kvcy.kv_offload.base import LookupResult, Medium, ReqContext
from kvcy.kv_offload._cpu_common import CPULoadStoreSpec


_MISS = LookupResult.MISS
_HIT = LookupResult.HIT
_HIT_PENDING = LookupResult.HIT_PENDING
_CPU = Medium.CPU

# Unique ids for policies and managers: the per-request state they keep on a
# ReqContext is filed under this id, so two of them never share a record.
_owner_ids = itertools.count(1)


def _check_key(key: Any) -> None:
    if type(key) is not bytes and not isinstance(key, bytes):
        raise TypeError(f"an offload key must be bytes, got {type(key).__name__}")
    if len(key) < 4:
        raise ValueError(
            f"an offload key is a block hash plus a 4-byte group index, got {len(key)} bytes: {key!r}"
        )


def _check_keys(keys: Any) -> list:
    """``keys`` as a list of valid offload keys, or a TypeError / ValueError."""
    if isinstance(keys, (bytes, str)) or not isinstance(keys, Iterable):
        raise TypeError(f"keys must be a collection of offload keys, got {type(keys).__name__}")
    out = list(keys)
    for key in out:
        if type(key) is not bytes or len(key) < 4:
            _check_key(key)
    return out


def _check_context(req_context: Any) -> None:
    # (a ReqContext of vLLM's, or another with the same three methods, serves as well)
    if not isinstance(req_context, ReqContext) and not (
        hasattr(req_context, "get_state") and hasattr(req_context, "set_state")
        and hasattr(req_context, "get_offload_key_position")
    ):
        raise TypeError(f"req_context must be a ReqContext, got {type(req_context).__name__}")


def _check_position(position: Any) -> None:
    """Refuse a key position (from a request context) that is not an int."""
    if isinstance(position, bool) or not isinstance(position, int):
        raise TypeError(f"a key position must be an int, got {type(position).__name__}")


def _positions_of(keys: list, req_context: ReqContext) -> list[int] | None:
    """The positions of ``keys``, each checked, or ``None`` at the first key without one."""
    get = req_context.get_offload_key_position
    positions = []
    for key in keys:
        position = get(key)
        if position is None:
            return None
        if type(position) is not int:
            _check_position(position)
        positions.append(position)
    return positions


def _chunk_spec(chunk_ids: list[int]) -> CPULoadStoreSpec:
    """A CPULoadStoreSpec of chunk ids the manager handed out (already valid)."""
    spec = CPULoadStoreSpec.__new__(CPULoadStoreSpec)
    spec.block_ids = np.array(chunk_ids, dtype=np.int32)
    return spec


def _check_int(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    if value < 0:
        raise ValueError(f"{name} must be non-negative, got {value}")
    return int(value)


def _api_types(lookup_result: Any, medium: Any, hit_source: Any, event: Any, store_output: Any,
               spec: Any, stats: Any, octx: Any, req_context: Any) -> tuple:
    """The members and classes a manager's results are made of, checked.

    ``req_context``, if not None, is a context class with kvcy's ReqContext layout
    (``_state`` and ``_offload_key_positions`` dicts), read as directly as kvcy's.

    Raises:
        TypeError: an argument is not a class, or lacks a member results use.
    """
    named = (("LookupResult", lookup_result), ("Medium", medium), ("CacheHitSource", hit_source),
             ("OffloadingEvent", event), ("PrepareStoreOutput", store_output),
             ("CPULoadStoreSpec", spec), ("OffloadingConnectorStats", stats),
             ("RequestOffloadingContext", octx))
    for name, cls in named:
        if not isinstance(cls, type):
            raise TypeError(f"{name} must be a class, got {type(cls).__name__}")
    if req_context is not None and not isinstance(req_context, type):
        raise TypeError(f"ReqContext must be a class or None, got {type(req_context).__name__}")
    for cls, member in ((lookup_result, "MISS"), (lookup_result, "HIT"), (lookup_result, "HIT_PENDING"),
                        (medium, "CPU"), (hit_source, "HOST")):
        if not hasattr(cls, member):
            raise TypeError(f"{cls.__qualname__} has no member {member}")
    return (lookup_result.MISS, lookup_result.HIT, lookup_result.HIT_PENDING, medium.CPU,
            hit_source.HOST, event, store_output, spec, stats, octx)


def _chunk_spec_as(cls: Any, chunk_ids: list[int]) -> Any:
    """``_chunk_spec`` with another API's CPULoadStoreSpec class (``None``: kvcy's)."""
    if cls is None:
        return _chunk_spec(chunk_ids)
    spec = cls.__new__(cls)
    spec.block_ids = np.array(chunk_ids, dtype=np.int32)
    return spec
