"""The KV-cache event structs, wire-compatible with vLLM's ``vllm.distributed.kv_events``.

The structs are msgspec ``Struct``s with vLLM's class names, field names and
field order, encoded as vLLM encodes them (a batch is array-like; each event is
a map tagged with its class name under ``"type"``), so a consumer of vLLM's
event stream decodes kvcy's events unchanged.  A block hash appears as the low
64 bits of the hash as an int, or with ``use_int_block_hashes=False`` as its
raw bytes (vLLM's ``VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES``, on by default).
"""

from __future__ import annotations

import os
from typing import Any

import msgspec

__all__ = [
    "MEDIUM_CPU",
    "MEDIUM_GPU",
    "MEDIUM_STORAGE",
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
MEDIUM_CPU = "CPU"
MEDIUM_STORAGE = "STORAGE"

ExternalBlockHash = bytes | int


class EventBatch(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    """A batch of events with a timestamp, as a publisher sends them."""

    ts: float
    events: list[Any]
    data_parallel_rank: int | None = None


class KVCacheEvent(msgspec.Struct, omit_defaults=True, gc=False, tag=True):
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
    """The session of the request that stored (or re-reported) the blocks."""
    lookahead_token_ids: list[list[int]] | None = None
    """Per block, the tokens after it that its hash covers (hash lookahead);
    None when lookahead hashing is off."""

    def __hash__(self) -> int:
        return hash(
            (
                tuple(self.block_hashes),
                self.parent_block_hash,
                tuple(self.token_ids),
                self.block_size,
                self.lora_id,
                self.medium,
                tuple(self.extra_keys) if self.extra_keys else None,
                self.group_idx,
                self.kv_cache_spec_kind,
                self.kv_cache_spec_sliding_window,
                self.locality,
                self.ownership,
                self.session_id,
                None if self.lookahead_token_ids is None else tuple(map(tuple, self.lookahead_token_ids)),
            )
        )


class BlockRemoved(KVCacheEvent):
    """A cached block was evicted (its hash dropped when the block was reused)."""

    block_hashes: list[ExternalBlockHash]
    medium: str | None
    group_idx: int | None = None
    locality: str | None = None
    ownership: str | None = None

    def __hash__(self) -> int:
        return hash((tuple(self.block_hashes), self.medium, self.group_idx, self.locality, self.ownership))


class AllBlocksCleared(KVCacheEvent):
    """The whole prefix cache was reset."""


class KVEventBatch(EventBatch):
    events: list[BlockStored | BlockRemoved | AllBlocksCleared]


def default_use_int_block_hashes() -> bool:
    """vLLM's switch, read from ``VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES`` (an int; on when unset).

    Raises:
        ValueError: the variable is set to something that is not an int.
    """
    raw = os.environ.get("VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES", "1")
    try:
        return bool(int(raw))
    except ValueError:
        raise ValueError(
            f"VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES must be an int (0 or 1), got {raw!r}"
        ) from None


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
