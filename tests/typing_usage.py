"""What a type-checked user of kvcy writes: CI runs ``mypy --strict`` on this file.

Every public class is exposed through a twin selector at run time; type
checkers must still see the real classes, not ``Any``.  The ``assert_type``
calls fail under mypy when a name resolves to ``Any``.  The file also runs
(tests/test_packaging.py imports it with each twin), so it stays honest code.
"""

from __future__ import annotations

import sys

import kvcy
from kvcy import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec, KVCacheManager, Request
from kvcy.block_pool import BlockPool
from kvcy.hashing import get_hash_fn_by_name, get_request_block_hasher, init_none_hash
from kvcy.kv_cache_coordinator import KVCacheCoordinator
from kvcy.kv_cache_manager import KVCacheBlocks
from kvcy.kv_cache_utils import FreeKVCacheBlockQueue, KVCacheBlock, get_kv_cache_config
from kvcy.kv_events import BlockStored, EventSubscriber, KVEventBatch, ZmqEventPublisher
from kvcy.kv_index import KVIndex
from kvcy.single_type_kv_cache_manager import SingleTypeKVCacheManager

if sys.version_info >= (3, 11):
    from typing import assert_type
else:  # pragma: no cover - CI runs 3.11
    from typing_extensions import assert_type


def run_manager() -> list[int]:
    """README's example, with the types spelled out."""
    spec = FullAttentionSpec(block_size=16, num_kv_heads=8, head_size=128, dtype="bfloat16")
    config = KVCacheConfig(
        num_blocks=64, kv_cache_tensors=[], kv_cache_groups=[KVCacheGroupSpec(["model.layers.0"], spec)]
    )
    manager = KVCacheManager(config, max_model_len=512, scheduler_block_size=16, hash_block_size=16)
    assert_type(manager, KVCacheManager)
    assert_type(kvcy.KVCacheManager(config, 512, 16, 16), kvcy.KVCacheManager)

    sha256 = get_hash_fn_by_name("sha256")
    none_hash: bytes = init_none_hash(sha256)
    request = Request("req-0", prompt_token_ids=list(range(100)), block_hasher=get_request_block_hasher(16, sha256))
    assert_type(request, Request)
    hashes: list[bytes] = request.block_hashes
    assert len(none_hash) == 32 and len(hashes) == 6

    blocks, num_hit_tokens, _ = manager.get_computed_blocks(request)
    assert_type(blocks, KVCacheBlocks)
    assert_type(num_hit_tokens, int)
    new_blocks = manager.allocate_slots(
        request, request.num_tokens - num_hit_tokens, num_new_computed_tokens=num_hit_tokens,
        new_computed_blocks=blocks,
    )
    assert_type(new_blocks, KVCacheBlocks | None)
    assert new_blocks is not None
    usage: float = manager.usage
    assert usage > 0.0
    coordinator = manager.coordinator
    assert_type(coordinator, KVCacheCoordinator)
    managers: tuple[SingleTypeKVCacheManager, ...] = tuple(coordinator.single_type_managers)
    assert len(managers) == 1
    (block_ids,) = manager.get_block_ids("req-0")
    manager.free(request)
    return block_ids


def run_block_pool() -> int:
    pool = BlockPool(num_gpu_blocks=8, enable_caching=True, hash_block_size=16)
    assert_type(pool, BlockPool)
    got = pool.get_new_blocks(3)
    assert_type(got, list[KVCacheBlock])
    first: KVCacheBlock = got[0]
    assert first.ref_cnt == 1
    pool.free_blocks(got)
    queue = pool.free_block_queue
    assert_type(queue, FreeKVCacheBlockQueue)
    return pool.get_num_free_blocks()


def run_sizing() -> int:
    spec = FullAttentionSpec(block_size=16, num_kv_heads=2, head_size=64, dtype="float16")
    config = get_kv_cache_config(kvcy.KVCacheSettings(), {"layer.0": spec}, 1 << 24)
    assert_type(config, KVCacheConfig)
    return config.num_blocks


def run_kv_index() -> int:
    index = KVIndex(max_blocks=100)
    assert_type(index, KVIndex)
    event = BlockStored(block_hashes=[1, 2], parent_block_hash=None, token_ids=[], block_size=16, lora_id=None,
                        medium="GPU", lora_name=None)
    applied: int = index.apply_batch("a", KVEventBatch(ts=0.0, events=[event]))
    prefix = index.longest_prefix([1, 2, 3])
    assert_type(prefix, dict[str, int])
    best = index.best_instance([1, 2, 3], candidates=["a"])
    assert_type(best, tuple[str | None, int])
    names: tuple[str, ...] = index.instances
    assert applied == 1 and names == ("a",) and best == ("a", 2)
    return prefix["a"]


def run_kv_events_zmq() -> int:
    """A publisher and a subscriber on an in-process endpoint, feeding an index."""
    import zmq

    ctx = zmq.Context()
    index = KVIndex()
    with ZmqEventPublisher(endpoint="inproc://typing-usage", replay_endpoint="inproc://typing-usage-replay",
                           context=ctx) as pub:
        endpoint: str = pub.endpoint
        replay: str | None = pub.replay_endpoint
        with EventSubscriber(index, {"a": (endpoint, replay)}, context=ctx) as sub:
            event = BlockStored(block_hashes=[7], parent_block_hash=None, token_ids=[], block_size=16,
                                lora_id=None, medium="GPU", lora_name=None)
            pub.publish(KVEventBatch(ts=0.0, events=[event]))
            applied: int = sub.run_for(0.2) + sub.sync()
            stats: dict[str, float | int] = sub.stats
            assert applied >= 1 and stats["instances"] == 1
    ctx.term()
    return index.longest_prefix([7])["a"]


if __name__ == "__main__":
    print(run_manager(), run_block_pool(), run_sizing(), run_kv_index(), run_kv_events_zmq())
