"""Prefix caching through the manager: which blocks hit, which are cached, and vLLM 0.33.0's
decisions on hybrid KV caches, both twins.
"""

from __future__ import annotations

import pytest

from kvcy.hashing import get_hash_fn_by_name, get_request_block_hasher, init_none_hash
from kvcy.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
from kvcy.kv_events import AllBlocksCleared
from kvcy.request import Request
from kvcy._request_types import MultiModalFeatureSpec, PlaceholderRange
from kvcy.kv_cache_interface import SlidingWindowSpec


BS = 4


@pytest.fixture(autouse=True)
def _none_hash():
    init_none_hash(get_hash_fn_by_name("sha256"))


def hasher(bs=BS):
    return get_request_block_hasher(bs, get_hash_fn_by_name("sha256"))


def full_config(num_blocks=16, bs=BS):
    spec = FullAttentionSpec(block_size=bs, num_kv_heads=1, head_size=8, dtype="float16")
    return KVCacheConfig(num_blocks=num_blocks, kv_cache_tensors=[], kv_cache_groups=[KVCacheGroupSpec(["l0"], spec)])


def manager(impl, num_blocks=16, **kw):
    kw.setdefault("max_model_len", 256)
    return impl.kv_cache.KVCacheManager(full_config(num_blocks), scheduler_block_size=BS, hash_block_size=BS, **kw)


def _sneaky_hits_script(kv):
    """Prefix hits handed over in a sequence type whose reading allocates for
    the very request being admitted; what each call did, and the state."""
    from collections.abc import Sequence

    spec = FullAttentionSpec(block_size=BS, num_kv_heads=1, head_size=8, dtype="float16")
    cfg = KVCacheConfig(num_blocks=16, kv_cache_tensors=[], kv_cache_groups=[KVCacheGroupSpec(["l0"], spec)])
    mgr = kv.KVCacheManager(cfg, max_model_len=256, scheduler_block_size=BS, hash_block_size=BS)
    a = kv.Request("a", list(range(12)), block_hasher=hasher())
    mgr.allocate_slots(a, 12)
    mgr.free(a)
    b = kv.Request("b", list(range(12)) + [5, 6], block_hasher=hasher())
    blocks, hit, _ = mgr.get_computed_blocks(b)
    inner: list[object] = []

    class Sneaky(Sequence):
        def __init__(self, items):
            self.items = list(items)

        def __len__(self):
            return len(self.items)

        def __getitem__(self, i):
            if not inner:
                inner.append(mgr.allocate_slots(b, 1).get_block_ids())
            return self.items[i]

    try:
        outer = mgr.allocate_slots(b, 2, num_new_computed_tokens=hit,
                                   new_computed_blocks=kv.KVCacheBlocks((Sneaky(blocks.blocks[0]),)))
        outcome: object = outer.get_block_ids()
    except Exception as err:  # noqa: BLE001 - the outcome is compared across twins
        outcome = type(err).__name__
    held = sorted(blk.block_id for blk in mgr.block_pool.blocks if blk.ref_cnt > 0 and not blk.is_null)
    return hit, inner, outcome, mgr.get_block_ids("b"), mgr.block_pool.get_num_free_blocks(), held


def test_prefix_hit_touch_and_max_length(impl):
    mgr = manager(impl)
    a = Request("a", list(range(12)), block_hasher=hasher())
    mgr.allocate_slots(a, 12)
    b = Request("b", list(range(12)), block_hasher=hasher())
    blocks, n, boundary = mgr.get_computed_blocks(b)
    # the last token is never a hit: 11 tokens -> 2 full blocks
    assert blocks.get_block_ids() == ([1, 2],) and n == 8 and boundary == 0
    assert all(blk.ref_cnt == 1 for blk in blocks.blocks[0])  # lookup changes nothing
    new = mgr.allocate_slots(b, 4, num_new_computed_tokens=8, new_computed_blocks=blocks)
    assert new.get_block_ids() == ([4],)
    assert [blk.ref_cnt for blk in blocks.blocks[0]] == [2, 2]
    assert mgr.get_block_ids("b") == ([1, 2, 4],)


def test_reset_prefix_cache(impl):
    mgr = manager(impl, enable_kv_cache_events=True)
    a = Request("a", list(range(8)), block_hasher=hasher())
    mgr.allocate_slots(a, 8)
    assert mgr.reset_prefix_cache() is False
    mgr.free(a)
    mgr.take_events()
    assert mgr.reset_prefix_cache() is True
    assert all(b.block_hash is None for b in mgr.block_pool.blocks)
    assert [type(e) for e in mgr.take_events()] == [AllBlocksCleared]


def test_prefix_hits_for_running_request_rejected(impl):
    mgr = manager(impl)
    a = Request("a", list(range(12)), block_hasher=hasher())
    mgr.allocate_slots(a, 12)
    b = Request("b", list(range(12)), block_hasher=hasher())
    blocks, n, _ = mgr.get_computed_blocks(b)
    mgr.allocate_slots(b, 4, num_new_computed_tokens=n, new_computed_blocks=blocks)
    free_before = mgr.block_pool.get_num_free_blocks()
    # vLLM's coordinator asserts; kvcy asserts before anything changes.
    with pytest.raises(AssertionError, match="already holds blocks"):
        mgr.allocate_slots(b, 4, num_new_computed_tokens=n, new_computed_blocks=blocks)
    assert mgr.block_pool.get_num_free_blocks() == free_before


def test_hits_in_a_sequence_that_runs_code():
    """The compiled fast path takes hits in a list or tuple only: reading
    another sequence runs its code, which may change the manager under the
    fast path's record (here: allocate for the same request).  Both twins
    answer and end alike."""
    from kvcy import _fast

    got = {name: _sneaky_hits_script(_fast.load(name)["kv_cache"]) for name in _fast.available()}
    hit, inner, outcome, b_ids, n_free, held = got["python"]
    assert hit == 12 and len(inner) == 1 and b_ids == inner[0]
    assert n_free + len(held) + 1 == 16  # no block lost
    assert all(v == got["python"] for v in got.values()), got


SHA = get_hash_fn_by_name("sha256")


def full_spec():
    return FullAttentionSpec(block_size=BS, num_kv_heads=1, head_size=8, dtype="float16")


def swa_spec():
    return SlidingWindowSpec(block_size=BS, num_kv_heads=1, head_size=8, dtype="float16", sliding_window=8)


def config(specs, num_blocks=16):
    return KVCacheConfig(num_blocks=num_blocks, kv_cache_tensors=[],
                         kv_cache_groups=[KVCacheGroupSpec([f"l{i}"], s) for i, s in enumerate(specs)])


def manager_api(impl, specs=None, num_blocks=16, **kw):
    specs = [full_spec()] if specs is None else specs
    return impl.kv_cache.KVCacheManager(config(specs, num_blocks), max_model_len=64, scheduler_block_size=BS,
                                        hash_block_size=BS, **kw)


def request(impl, rid, tokens, lookahead=0, **kw):
    return impl.kv_cache.Request(rid, list(tokens), block_hasher=get_request_block_hasher(BS, SHA, lookahead), **kw)


def cached_flags(mgr, rid, group=0):
    return [b.block_hash is not None for b in mgr.get_blocks(rid).blocks[group]]


# ------------------------------------------------- num_prefill_lookahead (MTP re-prefill)
@pytest.mark.parametrize("use_eagle", [True, False])
@pytest.mark.parametrize("num_prefill_lookahead, flags", [
    (3, [True, True, False, False]),  # 13 - 2 re-prefillable tokens: 2 full blocks
    (1, [True, True, True, False]),
    (0, [True, True, True, False]),
])
def test_prefill_lookahead_caches_only_finalized_tokens(impl, use_eagle, num_prefill_lookahead, flags):
    mgr = manager_api(impl, use_eagle=use_eagle, num_prefill_lookahead=num_prefill_lookahead)
    req = request(impl, "a", range(13))
    assert mgr.allocate_slots(req, 13) is not None
    assert cached_flags(mgr, "a") == flags
    mgr.cache_blocks(req, 13)
    assert cached_flags(mgr, "a") == flags


def test_prefill_lookahead_in_a_hybrid_with_eagle(impl):
    mgr = manager_api(impl, [full_spec(), swa_spec()], use_eagle=True, num_prefill_lookahead=3)
    req = request(impl, "a", range(13))
    assert mgr.allocate_slots(req, 13) is not None
    assert cached_flags(mgr, "a", 0) == [True, True, False, False]
    assert cached_flags(mgr, "a", 1) == [True, True, False, False]


# ------------------------------------------------- num_hash_lookahead_tokens: events
def test_hash_lookahead_reaches_the_events(impl):
    mgr = manager_api(impl, num_hash_lookahead_tokens=2, enable_kv_cache_events=True)
    assert mgr.block_pool.num_hash_lookahead_tokens == 2
    req = request(impl, "b", range(100, 111), lookahead=2)
    assert len(req.block_hashes) == 2
    mgr.allocate_slots(req, 11)
    (event,) = mgr.take_events()
    assert event.token_ids == list(range(100, 108))
    assert event.lookahead_token_ids == [[104, 105], [108, 109]]
    assert event.extra_keys is None or event.extra_keys == [None, None]


def test_hash_lookahead_event_extra_keys_cover_the_lookahead(impl):
    """A block's event keys are those of the block and its lookahead tokens, as its hash's are."""
    mgr = manager_api(impl, num_hash_lookahead_tokens=2, enable_kv_cache_events=True)
    image = MultiModalFeatureSpec("img", PlaceholderRange(offset=8, length=2))
    req = request(impl, "b", range(100, 111), lookahead=2, mm_features=[image])
    mgr.allocate_slots(req, 11)
    (event,) = mgr.take_events()
    # Block 1 (tokens 4-7) looks ahead at tokens 8-9: the image, 4 tokens into the block.
    assert event.extra_keys == [None, (("img", 4),)]
    assert event.lookahead_token_ids == [[104, 105], [108, 109]]


def test_hash_lookahead_caches_only_the_blocks_that_have_hashes(impl):
    """With lookahead a block's hash waits for the tokens after it; vLLM caches only the
    blocks that have hashes, and the rest once they get them."""
    mgr = manager_api(impl, num_hash_lookahead_tokens=2)
    req = request(impl, "a", range(12), lookahead=2)
    assert len(req.block_hashes) == 2  # block 2 needs tokens 12 and 13
    assert mgr.allocate_slots(req, 12) is not None
    assert cached_flags(mgr, "a") == [True, True, False]
    req.num_computed_tokens = 12
    req.append_output_token_ids([12, 13])
    assert len(req.block_hashes) == 3
    mgr.cache_blocks(req, 12)
    assert cached_flags(mgr, "a") == [True, True, True]


@pytest.mark.parametrize("specs", [[full_spec()], [full_spec(), swa_spec()]])
def test_blocks_without_hashes_are_not_cached(impl, specs):
    """A request with fewer hashes than full blocks (its hasher lags, or none was given):
    vLLM caches the blocks that have hashes and raises nothing."""
    mgr = manager_api(impl, specs, num_blocks=32)
    req = request(impl, "a", range(13))
    del req.block_hashes[1:]
    assert mgr.allocate_slots(req, 13) is not None
    assert cached_flags(mgr, "a") == [True, False, False, False]
    bare = impl.kv_cache.Request("b", list(range(13)))  # no hasher: no hashes at all
    assert mgr.allocate_slots(bare, 13) is not None
    assert cached_flags(mgr, "b") == [False] * 4
