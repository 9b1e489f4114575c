"""``BlockHashToBlockMap._cache``: vLLM's dict of the prefix cache, which vLLM's own tests read,
pop, clear and restore to stage a lookup.

In the pure twin it is the map's dict itself; in the compiled twin a live view of the
open-addressing table, so both twins see the same effects.  The compiled view checks what is
assigned (a block, or a non-empty dict of blocks keyed by their ids) before it changes anything.
"""

from __future__ import annotations

import copy

import pytest

from kvcy.kv_cache_utils import BlockHash, make_block_hash_with_group_id


def filled(impl):
    pool = impl.kv_cache.BlockPool(num_gpu_blocks=5, enable_caching=True, hash_block_size=16)
    keys = [make_block_hash_with_group_id(BlockHash(h), 0) for h in (b"a", b"b", b"c")]
    for block, key in zip(pool.blocks[1:], keys + [keys[0]]):  # (block 4 shares block 1's key)
        block.set_block_hash(key)
        pool.cached_block_hash_to_block.insert(key, block)
    return pool, keys


def test_reads_are_vllms_dict(impl):
    pool, (ka, kb, kc) = filled(impl)
    b = pool.blocks
    cache = pool.cached_block_hash_to_block._cache
    assert cache == {ka: {1: b[1], 4: b[4]}, kb: b[2], kc: b[3]}
    assert len(cache) == 3 and set(cache) == {ka, kb, kc} and kb in cache
    assert cache[kb] is b[2] and cache.get(b"nope\x00\x00\x00\x00") is None


def test_pop_and_restore_stage_a_miss(impl):
    pool, (ka, kb, kc) = filled(impl)
    m = pool.cached_block_hash_to_block
    backup = copy.copy(m._cache)
    assert m._cache.pop(kb) is pool.blocks[2]
    assert m.get_one_block(kb) is None and len(m) == 2
    assert backup[kb] is pool.blocks[2]  # (the copy is a snapshot)
    m._cache[kb] = backup[kb]
    assert m.get_one_block(kb) is pool.blocks[2]
    m._cache.pop(ka)
    m._cache[ka] = backup[ka]  # (a shared key comes back whole, first block first)
    assert m.get_one_block(ka) is pool.blocks[1] and m._cache[ka] == {1: pool.blocks[1], 4: pool.blocks[4]}


def test_clear_empties_the_map_and_inserts_work_after(impl):
    pool, (ka, kb, kc) = filled(impl)
    m = pool.cached_block_hash_to_block
    m._cache.clear()
    assert len(m) == 0 and m._cache == {} and m.get_one_block(ka) is None
    m.insert(kc, pool.blocks[3])
    assert m._cache == {kc: pool.blocks[3]}


def test_missing_key_is_a_key_error(impl):
    pool, _ = filled(impl)
    missing = make_block_hash_with_group_id(BlockHash(b"zz"), 0)
    with pytest.raises(KeyError):
        del pool.cached_block_hash_to_block._cache[missing]
    with pytest.raises(KeyError):
        pool.cached_block_hash_to_block._cache[missing]


@pytest.mark.parametrize("value", [None, 3, "block", {}, {1: None}, {2: "x"}, [1], {"1": None}])
def test_compiled_view_refuses_bad_entries_and_changes_nothing(impl, value):
    if impl.name != "cython":
        pytest.skip("the pure twin's _cache is the map's own dict")
    pool, (ka, kb, kc) = filled(impl)
    m = pool.cached_block_hash_to_block
    before = m._cache.copy()
    with pytest.raises((TypeError, ValueError)):
        m._cache[kb] = value
    with pytest.raises((TypeError, ValueError)):
        m._cache[kb] = {7: pool.blocks[2]} if value is None else value  # (an id that is not the block's)
    assert m._cache == before and m.get_one_block(kb) is pool.blocks[2]


@pytest.mark.parametrize("key", [None, 7, b"", b"ab", "abcdef"])
def test_compiled_view_refuses_bad_keys(impl, key):
    if impl.name != "cython":
        pytest.skip("the pure twin's _cache is the map's own dict")
    pool, (ka, kb, kc) = filled(impl)
    m = pool.cached_block_hash_to_block
    for op in (lambda: m._cache[key], lambda: m._cache.__setitem__(key, pool.blocks[2]),
               lambda: m._cache.__delitem__(key)):
        with pytest.raises((TypeError, ValueError, KeyError)):
            op()
    assert len(m) == 3
