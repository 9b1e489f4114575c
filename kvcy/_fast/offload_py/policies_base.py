"""``CachePolicy``: the interface between the manager and a cache policy, and the checks of
the policies' arguments (``vllm.v1.kv_offload.cpu.policies.base``)."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Collection, Iterable, Sequence
from typing import Any

from kvcy._fast.offload_py._common import _check_int
from kvcy._fast.offload_py.policies_base_chunk_status import ChunkStatus
from kvcy.kv_offload.base import OffloadKey, ReqContext


def _check_chunk(chunk: Any) -> None:
    """The chunk argument of a policy's insert (the compiled twin types it)."""
    if not isinstance(chunk, ChunkStatus):
        raise TypeError(f"chunk must be a ChunkStatus, got {type(chunk).__name__}")


def _key_seq(keys: Any) -> list:
    """The keys of a policy call, as a list (each must be hashable; any type)."""
    if type(keys) is list:
        return keys
    if isinstance(keys, (bytes, str)) or not isinstance(keys, Iterable):
        raise TypeError(f"keys must be a collection of offload keys, got {type(keys).__name__}")
    return list(keys)


def _check_evict_n(n: Any) -> None:
    """The ``n`` of a policy's evict (the compiled twin checks it the same way)."""
    if isinstance(n, bool) or not isinstance(n, int):
        raise TypeError(f"n must be an int, got {type(n).__name__}")


class CachePolicy(ABC):
    """Which chunk each resident key has, and which keys to evict.

    The manager owns the chunk pool and the reference counts; a policy owns
    the key -> :class:`ChunkStatus` map and the recency bookkeeping, and is
    told about every access.  The hooks without a body here are optional.

    Args:
        cache_capacity: the cache size in chunks.
    """

    def __init__(self, cache_capacity: int):
        self.cache_capacity: int = _check_int("cache_capacity", cache_capacity)

    @abstractmethod
    def get(self, key: OffloadKey) -> ChunkStatus | None:
        """The chunk of a resident key, or ``None``."""

    @abstractmethod
    def insert(self, key: OffloadKey, chunk: ChunkStatus, req_context: ReqContext) -> None:
        """Make ``key`` resident in ``chunk`` (being written), stored for ``req_context``."""

    @abstractmethod
    def remove(self, key: OffloadKey) -> None:
        """Drop a resident key whose store failed."""

    @abstractmethod
    def touch(self, keys: Sequence[OffloadKey], req_context: ReqContext) -> None:
        """Mark keys as recently used; the first key ends most recent."""

    def on_store_miss(self, keys: Sequence[OffloadKey], req_context: ReqContext) -> None:
        """Keys a request offered that are not resident (seen once per request).

        By default a ``touch`` of them (as vLLM's ``CachePolicy``).
        """
        self.touch(keys, req_context)

    def on_request_access(self, keys: Sequence[OffloadKey], req_context: ReqContext) -> None:
        """Keys a request loaded or offered for the first time."""

    def on_request_finished(
        self,
        key_groups: Sequence[Sequence[OffloadKey]],
        insertion_only_keys: Collection[OffloadKey],
        reused_keys: Collection[OffloadKey],
        req_context: ReqContext,
    ) -> None:
        """A request finished: its keys per group, which it only stored and which it reused.

        By default one ``touch`` per group, in group order (as vLLM's ``CachePolicy``).
        """
        for keys in key_groups:
            self.touch(keys, req_context)

    @abstractmethod
    def evict(self, n: int, protected: Collection[OffloadKey]) -> list[tuple[OffloadKey, ChunkStatus]] | None:
        """Remove ``n`` evictable keys not in ``protected`` and return them with their chunks.

        Returns ``None``, changing nothing, when fewer than ``n`` qualify.
        """

    @abstractmethod
    def clear(self) -> None:
        """Forget every key."""

    def mark_evictable(self, key: OffloadKey) -> None:
        """A resident key's ``ref_cnt`` became 0."""

    def mark_non_evictable(self, key: OffloadKey) -> None:
        """A resident key's ``ref_cnt`` left 0 (a load pinned it)."""
