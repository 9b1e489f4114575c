"""KV-cache events, wire-compatible with vLLM 0.33.0's ``vllm.distributed.kv_events``.

One concept per module:

- ``events``: the msgspec structs (``BlockStored``, ``BlockRemoved``, ``AllBlocksCleared``,
  ``KVEventBatch``) and the block-hash helpers the block pool uses to fill them;
- ``publisher``: ``KVEventsConfig`` and the publishers (``ZmqEventPublisher`` sends batches
  over ZeroMQ in vLLM's framing and serves its replay protocol; ``NullEventPublisher``;
  ``EventPublisherFactory``);
- ``subscriber``: ``EventSubscriber``, which reads N publishers, recovers lost batches through
  their replay sockets and applies the batches to a routing index (``kvcy.kv_index.KVIndex``).
"""

from __future__ import annotations

from kvcy.kv_events.events import (
    MEDIUM_CPU,
    MEDIUM_GPU,
    MEDIUM_STORAGE,
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    EventBatch,
    ExternalBlockHash,
    KVCacheEvent,
    KVEventBatch,
    default_use_int_block_hashes,
    external_block_hash,
    untag_extra_keys,
)
from kvcy.kv_events.publisher import (
    EventPublisher,
    EventPublisherFactory,
    KVEventsConfig,
    NullEventPublisher,
    ZmqEventPublisher,
)
from kvcy.kv_events.subscriber import EventSubscriber, InstanceState

__all__ = [
    "MEDIUM_CPU",
    "MEDIUM_GPU",
    "MEDIUM_STORAGE",
    "AllBlocksCleared",
    "BlockRemoved",
    "BlockStored",
    "EventBatch",
    "EventPublisher",
    "EventPublisherFactory",
    "EventSubscriber",
    "ExternalBlockHash",
    "InstanceState",
    "KVCacheEvent",
    "KVEventBatch",
    "KVEventsConfig",
    "NullEventPublisher",
    "ZmqEventPublisher",
    "default_use_int_block_hashes",
    "external_block_hash",
    "untag_extra_keys",
]
