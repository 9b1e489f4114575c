"""KV-cache events, wire-compatible with vLLM's ``vllm.distributed.kv_events``.

The structs are msgspec ``Struct``s with vLLM's class names, field names and
field order (array-like, tagged by class name), so a consumer of vLLM's event
stream decodes kvcy's events unchanged.  A block hash appears as its raw bytes,
or, with ``use_int_block_hashes``, as the low 64 bits of the hash as an int
(vLLM's ``VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES``).
"""

from __future__ import annotations

import os
from typing import Any

import msgspec

__all__ = [
    "MEDIUM_GPU",
    "AllBlocksCleared",
    "BlockRemoved",
    "BlockStored",
    "EventBatch",
    "ExternalBlockHash",
    "KVCacheEvent",
    "KVEventBatch",
    "default_use_int_block_hashes",
    "external_block_hash",
    "untag_extra_keys",
]

MEDIUM_GPU = "GPU"

ExternalBlockHash = bytes | int


class EventBatch(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    """A batch of events with a timestamp, as a publisher sends them."""

    ts: float
    events: list[Any]
    data_parallel_rank: int | None = None


class KVCacheEvent(msgspec.Struct, array_like=True, omit_defaults=True, gc=False, tag=True):
    """Base class of all KV-cache events."""


class BlockStored(KVCacheEvent):
    """Blocks entered the prefix cache (or were re-reported on a prefix hit)."""

    block_hashes: list[ExternalBlockHash]
    parent_block_hash: ExternalBlockHash | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None
    medium: str | None
    lora_name: str | None
    extra_keys: list[tuple[Any, ...] | None] | None = None
    group_idx: int | None = None
    kv_cache_spec_kind: str | None = None
    kv_cache_spec_sliding_window: int | None = None
    locality: str | None = None
    ownership: str | None = None
    session_id: str | None = None
    lookahead_token_ids: list[int] | None = None


class BlockRemoved(KVCacheEvent):
    """A cached block was evicted (its hash dropped when the block was reused)."""

    block_hashes: list[ExternalBlockHash]
    medium: str | None
    group_idx: int | None = None
    locality: str | None = None
    ownership: str | None = None


class AllBlocksCleared(KVCacheEvent):
    """The whole prefix cache was reset."""


class KVEventBatch(EventBatch):
    events: list[BlockStored | BlockRemoved | AllBlocksCleared]


def default_use_int_block_hashes() -> bool:
    """vLLM's switch, read from ``VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES``."""
    return os.environ.get("VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES", "0") not in ("", "0", "false", "False")


def external_block_hash(block_hash: bytes, use_int: bool) -> ExternalBlockHash:
    """The form a block hash takes in an event."""
    if use_int:
        return int.from_bytes(block_hash, "big") & 0xFFFF_FFFF_FFFF_FFFF
    return block_hash


def untag_extra_keys(extra_keys: tuple | None) -> tuple | None:
    """Extra keys as events publish them: mm -> (identifier, offset), others bare."""
    if extra_keys is None:
        return None
    out = []
    for key in extra_keys:
        tag = key[0]
        if tag == "mm":
            out.append((key[1], key[2]))
        else:
            out.append(key[1])
    return tuple(out)
