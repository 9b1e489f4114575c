"""What one request did with one offloading manager (the keys it loaded or offered, and how),
kept on its ReqContext.  (vLLM: ``_RequestCacheAccess`` in vllm/v1/kv_offload/cpu/manager.py.)"""

from __future__ import annotations

from kvcy.kv_offload.base import OffloadKey


class _AccessRecord:
    """What one request did with one manager, since the manager's last reset."""

    __slots__ = ("generation", "key_groups", "seen", "inserted", "reused", "store_missed", "finished")

    def __init__(self, generation: int):
        self.generation = generation
        # group suffix (4 bytes, big-endian: sorts like the index) -> keys, first seen first
        self.key_groups: dict[bytes, list[OffloadKey]] = {}
        self.seen: set[OffloadKey] = set()
        self.inserted: set[OffloadKey] = set()
        self.reused: set[OffloadKey] = set()
        self.store_missed: set[OffloadKey] = set()
        self.finished = False


class _AccessRecords(dict):
    """Kept on a ReqContext: manager id -> its _AccessRecord for the request."""

    __slots__ = ()
