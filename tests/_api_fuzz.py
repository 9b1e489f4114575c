"""Wrong types and counts thrown at the compiled twin's public pool and manager API.

Run as a script (``python tests/_api_fuzz.py SEED ITERATIONS``) so that a crash of the
interpreter shows as the process dying, not as a lost test session.  Prints one line per
kind of exception outside what bad input may raise, and per call that raised but changed
the pool (free queue, reference counts, keys), then ``done``.
"""

from __future__ import annotations

import random
import sys

from kvcy import _fast
from kvcy.hashing import get_hash_fn_by_name, get_request_block_hasher, init_none_hash
from kvcy.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec, SlidingWindowSpec

# What bad input may raise.  OverflowError: ints past a typed argument's C range.
EXPECTED = (ValueError, TypeError, RuntimeError, AssertionError, KeyError, IndexError, OverflowError)


def run(seed: int, iterations: int) -> dict:
    kv = _fast.load("cython")["kv_cache"]
    init_none_hash(get_hash_fn_by_name("sha256"))
    hasher = get_request_block_hasher(4, get_hash_fn_by_name("sha256"))
    full = FullAttentionSpec(block_size=4, num_kv_heads=1, head_size=8, dtype="float16")
    swa = SlidingWindowSpec(block_size=4, num_kv_heads=1, head_size=8, dtype="float16", sliding_window=6)
    rng = random.Random(seed)
    tagged = type("Tagged", (kv.KVCacheBlock,), {})  # subclasses are blocks too

    def garbage(pool):
        blk = rng.choice(pool.blocks)
        return rng.choice([
            None, -1, 0, 1, 2, 3, 5, 2**31, 2**40, -2**63, 1.5, "x", "r0", b"", b"abc", b"\0" * 36, [], [None],
            [1, 2], (), {}, object(), True, [b"\0" * 32], [[]], ["a"], [-1], blk, [blk], [blk, blk], (blk,),
            [pool.null_block], pool.blocks[1:3], [kv.KVCacheBlock(3)], kv.KVCacheBlock(-1), ([blk],),
            [[blk], [blk]], kv.KVCacheBlocks(([blk],)), rng.choice(pool.blocks).block_hash, [2**70],
            tagged(4), [tagged(6)], kv.KVCacheBlocks(([blk, kv.KVCacheBlock(9)],)),
        ])

    def pool_state(pool):
        return ([b.block_id for b in pool.free_block_queue.get_all_free_blocks()],
                [(b.ref_cnt, b.block_hash) for b in pool.blocks])

    unexpected: dict = {}
    for _ in range(iterations):
        groups = [KVCacheGroupSpec(["f"], full)] + ([KVCacheGroupSpec(["s"], swa)] if rng.random() < 0.4 else [])
        cfg = KVCacheConfig(num_blocks=16, kv_cache_tensors=[], kv_cache_groups=groups)
        mgr = kv.KVCacheManager(cfg, max_model_len=64, scheduler_block_size=4, hash_block_size=4,
                                enable_kv_cache_events=rng.random() < 0.5, log_stats=rng.random() < 0.5)
        reqs = [kv.Request(f"r{i}", [rng.randrange(6) for _ in range(rng.randrange(1, 30))], block_hasher=hasher)
                for i in range(3)]
        for req in reqs[:2]:
            blocks, hit, _ = mgr.get_computed_blocks(req)
            if mgr.allocate_slots(req, req.num_tokens - hit, num_new_computed_tokens=hit,
                                  new_computed_blocks=blocks) is not None:
                req.num_computed_tokens = req.num_tokens
        pool, queue = mgr.block_pool, mgr.block_pool.free_block_queue
        table = pool.cached_block_hash_to_block
        single = mgr.coordinator.single_type_managers[0]

        def free_any(a):
            mgr.free(rng.choice(reqs))

        calls = [
            lambda a: queue.popleft_n(a[0]), lambda a: queue.append(a[0]), lambda a: queue.append_n(a[0]),
            lambda a: queue.prepend_n(a[0]), lambda a: queue.remove(a[0]),
            lambda a: table.insert(a[0], a[1]), lambda a: table.pop(a[0], a[1]), lambda a: table.get_one_block(a[0]),
            lambda a: pool.get_cached_block(a[0], a[1]), lambda a: pool.evict_blocks(a[0]),
            lambda a: pool.cache_full_blocks(reqs[0], a[0], a[1], a[2], a[3], 0),
            lambda a: pool.get_new_blocks(a[0]), lambda a: pool.free_blocks(a[0]), lambda a: pool.touch(a[0]),
            lambda a: single.remove_skipped_blocks(a[0], a[1]),
            lambda a: single.add_local_computed_blocks(a[0], a[1], a[2], a[3]),
            lambda a: single.cache_blocks(a[0], a[1]), lambda a: single.free(a[0]),
            # (no external tokens: it takes their blocks without checking the pool has them --
            # allocate_slots counts them first, as vLLM's does)
            lambda a: mgr.coordinator.allocate_new_computed_blocks("r2", a[0], a[1], 0),
            lambda a: mgr.allocate_slots(rng.choice(reqs), a[0], num_new_computed_tokens=a[1],
                                         new_computed_blocks=a[2], num_lookahead_tokens=a[3]),
            lambda a: mgr.allocate_slots(rng.choice(reqs), 1, num_external_computed_tokens=a[0],
                                         num_encoder_tokens=a[1], reserved_blocks=a[2]),
            lambda a: mgr.get_computed_blocks(a[0]), lambda a: mgr.get_block_ids(a[0]), lambda a: mgr.free(a[0]),
            free_any, lambda a: setattr(kv.KVCacheBlock(5), "block_hash", a[0]),
            lambda a: setattr(rng.choice(pool.blocks), "block_hash_num_tokens", a[0]),
            lambda a: reqs[2].append_output_token_ids(a[0]), lambda a: kv.Request(a[0], a[1], block_hasher=hasher),
        ]
        for _ in range(10):
            call = rng.randrange(len(calls))
            args = [garbage(pool) if rng.random() < 0.7 else rng.randrange(-2, 20) for _ in range(4)]
            before = pool_state(pool)
            try:
                calls[call](args)
            except EXPECTED as exc:
                # A call that raised changed nothing -- except KVCacheManager.free after the
                # pool API freed the request's blocks behind its back (see the closing notes).
                if calls[call] is not free_any and pool_state(pool) != before:
                    key = f"call {call}: {type(exc).__name__} changed the pool: {exc}"[:160]
                    unexpected[key] = unexpected.get(key, 0) + 1
            except Exception as exc:  # noqa: BLE001 - collected and reported
                key = f"call {call}: {type(exc).__name__}: {exc}"[:160]
                unexpected[key] = unexpected.get(key, 0) + 1
    return unexpected


if __name__ == "__main__":
    for line, count in sorted(run(int(sys.argv[1]), int(sys.argv[2])).items()):
        print(f"{count} x {line}")
    print("done")
