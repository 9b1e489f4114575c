"""The single-type managers (full attention, sliding window, chunked local, Mamba, sink): what
each keeps, frees and finds for one KV-cache group, both twins.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from kvcy.kv_cache_interface import (
    ChunkedLocalAttentionSpec,
    FullAttentionSpec,
    KVCacheConfig,
    KVCacheGroupSpec,
    SlidingWindowSpec,
)
from kvcy.hashing import get_hash_fn_by_name, get_request_block_hasher, init_none_hash
from kvcy.kv_cache_interface import MambaSpec, SinkFullAttentionSpec
from kvcy.request import Request

from _kv_cache_helpers import (
    _full, _pool_state, _swa, full_spec_manager, hasher_manager, ids, manager_manager,
)
from _vllm_live import live


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


def test_sliding_window_frees_out_of_window_blocks(impl):
    spec = SlidingWindowSpec(block_size=4, num_kv_heads=1, head_size=8, dtype="float16", sliding_window=6)
    cfg = KVCacheConfig(num_blocks=20, kv_cache_tensors=[], kv_cache_groups=[KVCacheGroupSpec(["l"], spec)])
    mgr = impl.kv_cache.KVCacheManager(cfg, max_model_len=256, scheduler_block_size=4, hash_block_size=4)
    req = Request("s", list(range(24)), block_hasher=hasher())
    mgr.allocate_slots(req, 12)
    req.num_computed_tokens = 12
    mgr.allocate_slots(req, 12)
    # 12 computed: 12 - 6 + 1 = 7 tokens skipped -> block 0 is replaced by the null block
    assert mgr.get_block_ids("s")[0][0] == 0
    assert mgr.get_block_ids("s")[0][1:] == [2, 3, 4, 5, 6]


def test_chunked_local_hit_is_null_before_the_chunk(impl):
    spec = ChunkedLocalAttentionSpec(block_size=4, num_kv_heads=1, head_size=8, dtype="float16",
                                     attention_chunk_size=8)
    cfg = KVCacheConfig(num_blocks=20, kv_cache_tensors=[], kv_cache_groups=[KVCacheGroupSpec(["l"], spec)])
    mgr = impl.kv_cache.KVCacheManager(cfg, max_model_len=256, scheduler_block_size=4, hash_block_size=4)
    a = Request("a", list(range(16)), block_hasher=hasher())
    mgr.allocate_slots(a, 16)
    b = Request("b", list(range(16)), block_hasher=hasher())
    blocks, n, _ = mgr.get_computed_blocks(b)
    # max length 15: chunk start 8 -> blocks 0, 1 are null; block 2 (tokens 8..11) hits
    assert blocks.get_block_ids() == ([0, 0, 3],) and n == 12


def test_chunked_local_beside_another_block_size_asserts_at_lookup(impl):
    """vLLM 0.33.0's chunked-local lookup asserts that the group's block size is the hit
    alignment (the scheduler block): beside full attention of 8-token blocks, 4-token chunked
    blocks build but every lookup raises its AssertionError (a lookup that
    trimmed the hit to the alignment instead would differ; tests/vllm_live/test_vllm_state_machine.py
    drives this against vLLM)."""
    chunked = ChunkedLocalAttentionSpec(block_size=4, num_kv_heads=1, head_size=8, dtype="float16",
                                        attention_chunk_size=16)
    full = FullAttentionSpec(block_size=8, num_kv_heads=1, head_size=8, dtype="float16")
    cfg = KVCacheConfig(num_blocks=20, kv_cache_tensors=[],
                        kv_cache_groups=[KVCacheGroupSpec(["f"], full), KVCacheGroupSpec(["c"], chunked)])
    mgr = impl.kv_cache.KVCacheManager(cfg, max_model_len=256, scheduler_block_size=8, hash_block_size=4)
    req = Request("a", list(range(20)), block_hasher=hasher())
    msg = "KV cache groups with different block sizes are not compatible with chunked local attention now"
    with pytest.raises(AssertionError, match=msg):
        mgr.get_computed_blocks(req)
    manager_cls = type(mgr.coordinator.single_type_managers[1])
    with pytest.raises(AssertionError, match=msg):
        manager_cls.find_longest_cache_hit([], 16, [1], mgr.block_pool, chunked, False, 8)
    (hit,), n = manager_cls.find_longest_cache_hit([], 16, [1], mgr.block_pool, chunked, False, 4)
    assert [b.block_id for b in hit] == [0, 0, 0, 0] and n == 16  # (aligned: the chunk's null blocks)


def test_add_local_computed_blocks_rejects_bad_blocks_unchanged(impl):
    mgr = manager(impl)
    single = mgr.coordinator.single_type_managers[0]
    free_block = mgr.block_pool.free_block_queue.get_all_free_blocks()[0]
    before = _pool_state(mgr.block_pool)
    for bad, exc in (([free_block, None], TypeError), ([free_block, impl.kv_cache.KVCacheBlock(5)], RuntimeError)):
        with pytest.raises(exc):
            single.add_local_computed_blocks("r", bad, 2 * BS, 0)
        assert "r" not in single.req_to_blocks
        assert _pool_state(mgr.block_pool) == before


def test_managers_check_what_goes_into_their_tables(impl):
    """req_to_blocks / num_cached_block take entries from callers (vLLM's tests do), checked
    when they go in: a value that is not a list of this pool's blocks, or not a count, is
    refused and nothing changes."""
    mgr = manager(impl)
    other = manager(impl)
    single = mgr.coordinator.single_type_managers[0]
    req = impl.kv_cache.Request("r", list(range(8)), block_hasher=hasher())
    with pytest.raises(TypeError, match="req_to_blocks values must be lists"):
        single.req_to_blocks["r"] = ("not", "a list")
    with pytest.raises(TypeError, match="req_to_blocks values must be lists"):
        single.req_to_blocks["r"] = [1, 2]
    with pytest.raises(RuntimeError, match="not a block of this pool"):
        single.req_to_blocks["r"] = [other.block_pool.blocks[1]]
    with pytest.raises(TypeError, match="request ids must be str"):
        single.req_to_blocks[3] = []
    with pytest.raises(ValueError, match="num_cached_block values must be non-negative"):
        single.num_cached_block["r"] = -1
    assert "r" not in single.req_to_blocks and not single.num_cached_block
    assert mgr.allocate_slots(req, 8) is not None
    single.req_to_blocks["r"] = list(single.req_to_blocks["r"])  # a list of its own blocks: taken
    single.num_cached_block["r"] = 1
    assert dict(single.num_cached_block) == {"r": 1}


def full_spec(bs: int = BS) -> FullAttentionSpec:
    return FullAttentionSpec(block_size=bs, num_kv_heads=1, head_size=8, dtype="float16")


def request(impl, rid, tokens):
    return impl.kv_cache.Request(rid, tokens, block_hasher=get_request_block_hasher(BS, get_hash_fn_by_name("sha256")))


# ------------------------------------------------------- a spec no manager serves
def test_group_whose_spec_has_no_manager_asserts_as_vllm(impl):
    """A group of encoder-only layers, or of a ``UniformTypeKVCacheSpecs`` (the workers'
    spec, not the scheduler's), has no single-type manager: vLLM's factory asserts
    ("No manager registered for KVCacheSpec <class ...>"), with or without caching.
    kvcy raised ValueError."""
    from kvcy.kv_cache_interface import EncoderOnlyAttentionSpec, UniformTypeKVCacheSpecs

    attn = dict(block_size=BS, num_kv_heads=1, head_size=8, dtype="float16")
    for spec in (EncoderOnlyAttentionSpec(**attn),
                 UniformTypeKVCacheSpecs(block_size=BS, kv_cache_specs={"a": full_spec(), "b": full_spec()})):
        cfg = KVCacheConfig(num_blocks=16, kv_cache_tensors=[],
                            kv_cache_groups=[KVCacheGroupSpec(["l0"], full_spec()), KVCacheGroupSpec(["l1"], spec)])
        for caching in (True, False):
            with pytest.raises(AssertionError) as err:
                impl.kv_cache.KVCacheManager(cfg, max_model_len=64, scheduler_block_size=BS, hash_block_size=BS,
                                             enable_caching=caching)
            assert str(err.value) == f"No manager registered for KVCacheSpec {type(spec)}"


def test_find_longest_cache_hit_takes_vllms_context_parallel_sizes(impl):
    """vLLM's ``find_longest_cache_hit`` classmethods end with ``dcp_world_size=1,
    pcp_world_size=1`` (its coordinators pass them); kvcy takes them, and refuses other
    sizes as vLLM does: full attention reads hashes at the dcp-scaled block, the other
    types assert (vLLM's "DCP not support ..." messages)."""
    from kvcy.kv_cache_interface import SlidingWindowSpec

    kv = impl.kv_cache
    pool = kv.BlockPool(16, True, BS)
    req = request(impl, "a", list(range(12)))
    blocks = pool.get_new_blocks(3)
    pool.cache_full_blocks(req, blocks, 0, 3, BS, 0)
    swa = SlidingWindowSpec(block_size=BS, num_kv_heads=1, head_size=8, dtype="float16", sliding_window=8)
    for cls, spec, expected in ((kv.FullAttentionManager, full_spec(), (12, [1, 2, 3])),
                                (kv.SlidingWindowManager, swa, (12, [0, 2, 3]))):
        got, length = cls.find_longest_cache_hit(
            block_hashes=req.block_hashes, max_length=12, kv_cache_group_ids=[0], block_pool=pool,
            kv_cache_spec=spec, drop_eagle_block=False, alignment_tokens=BS, dcp_world_size=1, pcp_world_size=1)
        assert (length, [b.block_id for b in got[0]]) == expected
    # dcp=3: one block spans 3 hash blocks, keyed by the last one's hash (which chains
    # over the whole prefix): the 12 cached tokens are one block, the third cached one
    got, length = kv.FullAttentionManager.find_longest_cache_hit(
        req.block_hashes, 12, [0], pool, full_spec(), False, 3 * BS, 3, 1)
    assert (length, [b.block_id for b in got[0]]) == (12, [3])
    got, length = kv.FullAttentionManager.find_longest_cache_hit(
        req.block_hashes, 11, [0], pool, full_spec(), False, 3 * BS, 3, 1)
    assert (length, got) == (0, ([],))  # (max_length below one 12-token block)
    with pytest.raises(AssertionError, match="DCP not support sliding window attn now."):
        kv.SlidingWindowManager.find_longest_cache_hit(req.block_hashes, 12, [0], pool, swa, False, BS, 2, 1)
    with pytest.raises(AssertionError, match="PCP not support sliding window attn now."):
        kv.SlidingWindowManager.find_longest_cache_hit(req.block_hashes, 12, [0], pool, swa, False, BS, 1, 2)


def test_pop_blocks_for_free_leaves_out_leading_null_blocks(impl):
    """A sliding window's skipped prefix is null blocks at the head of its table;
    vLLM's pop_blocks_for_free returns the blocks without them (trim_null_head)."""
    mgr = manager_manager(impl, groups=2, num_blocks=32)
    req = impl.kv_cache.Request("a", list(range(24)), block_hasher=hasher_manager())
    assert mgr.allocate_slots(req, 24) is not None
    req.num_computed_tokens = 24
    mgr.remove_skipped_blocks("a", 24)
    full, window = mgr.coordinator.get_blocks("a")
    null = mgr.block_pool.null_block
    # window 8, 24 tokens computed: 24 - 8 + 1 = 17 tokens skipped, so 4 blocks of 4 are null
    assert [b is null for b in window] == [True] * 4 + [False] * 2
    expected = [b.block_id for b in full] + [b.block_id for b in window[4:]]
    popped = mgr.pop_blocks_for_free(req)
    assert [b.block_id for b in popped] == expected
    assert not any(b is null for b in popped)
    assert not mgr.coordinator.holds("a")
    # the caller frees them, last first, as vLLM's scheduler does
    mgr.block_pool.free_blocks(reversed(popped))
    assert mgr.block_pool.get_num_free_blocks() == 31


# -------------------------- names and parameters as vLLM 0.33.0 spells them
def test_single_type_manager_takes_vllms_positional_order(impl):
    """vLLM: (spec, pool, enable_caching, group id, scheduler block size,
    dcp_world_size=1, pcp_world_size=1, needs_kv_cache_zeroing=False,
    max_admission_blocks_per_request=None)."""
    kv = impl.kv_cache
    pool = kv.BlockPool(16, True, BS)
    mgr = kv.FullAttentionManager(full_spec_manager(), pool, True, 0, BS, 1, 1, True, 3)
    assert mgr._max_admission_blocks_per_request == 3
    mgr.allocate_new_blocks("a", 8, 8)
    assert sorted(mgr.take_new_block_ids()) == sorted(b.block_id for b in mgr.req_to_blocks["a"])
    cp = kv.FullAttentionManager(full_spec_manager(), pool, True, 0, BS, 2, 3)
    assert (cp.dcp_world_size, cp.pcp_world_size, cp.block_size) == (2, 3, 2 * BS)
    with pytest.raises(TypeError, match="dcp_world_size must be an int"):
        kv.FullAttentionManager(full_spec_manager(), pool, True, 0, BS, dcp_world_size=1.0)


def test_register_all_kvcache_specs():
    import kvcy.single_type_kv_cache_manager as st
    from kvcy.kv_cache_interface import KVCacheSpecRegistry, SinkFullAttentionSpec

    st.register_all_kvcache_specs(None)
    st.register_all_kvcache_specs()  # again: nothing changes
    sink = SinkFullAttentionSpec(block_size=BS, num_kv_heads=1, head_size=8, dtype="float16", sink_len=BS)
    assert KVCacheSpecRegistry.get_manager_class(sink) is st.SinkFullAttentionManager
    assert KVCacheSpecRegistry.get_manager_class(full_spec_manager()) is st.FullAttentionManager
    assert "register_all_kvcache_specs" in st.__all__


# =================================================================================================
# vLLM 0.33.0's sparse prefix-cache retention, ``extra_retained_tokens``, the sink manager and
# ``reset_prefix_cache`` through the coordinator, both twins.
#
# * ``prefix_cache_retention_interval``: the coordinator validates it as vLLM does
#   (``ValueError``; ``TypeError`` for what is not an int) and hands it, with the prompt's
#   replay boundaries (``replay_boundaries``) and the request's ``shared_prefix_boundary``,
#   to the managers' ``cache_blocks``.  A sliding-window group then caches only the blocks a
#   hit at those boundaries (or once per interval) can use; the rest stay unhashed and go
#   to the front of the free queue when freed.  Mamba's sparse states need Mamba align mode
#   (``NotImplementedError``), as does any ``dcp_world_size`` but 1.
# * ``SlidingWindowSpec.extra_retained_tokens``: the window's trailing edge moves down by
#   that many tokens (``get_num_skipped_tokens``), so their blocks are kept and counted.
# * ``SinkFullAttentionSpec`` gets ``SinkFullAttentionManager``: full attention's decisions,
#   and vLLM's ``AssertionError`` unless the sink fills whole blocks.  (vLLM 0.33.0's own
#   coordinator cannot build that manager: its ``__init__`` lacks ``needs_kv_cache_zeroing``,
#   a ``TypeError``; ``test_live_sink`` pins both facts.)
# * ``reset_prefix_cache`` resets each distinct pool through the coordinator: with no groups
#   there is none, so nothing is cleared and no ``AllBlocksCleared`` is queued.
#
# ``EXPECTED``, ``SPARSE_MASKS`` and ``REPLAY_BOUNDARIES`` were recorded from vLLM 0.33.0:
# ``EXPECTED`` by ``VLLM_TARGET_DEVICE=cpu python tests/_retention_scenarios.py`` (its
# ``summary`` of each case in ``CASES``), the masks by calling vLLM's
# ``SlidingWindowManager.reachable_block_mask(start, end, align, spec, eagle,
# retention_interval=..., reachable_boundaries=..., final_segment_end_block=...)`` on 160
# argument tuples drawn with ``random.Random(14)`` (block size 4 or 8, window 2/6/9/17,
# alignment 1/2/4 blocks), written as 0/1 per block or "-" for None, and
# ``replay_boundaries(p, sbs, use_eagle)`` from ``vllm.v1.core.kv_cache_coordinator``.  The
# ``live`` tests (vLLM importable) compare the two managers directly, over those cases and
# over random operation sequences.
# =================================================================================================

def _load_scenarios():
    path = Path(__file__).with_name("_retention_scenarios.py")
    spec = importlib.util.spec_from_file_location("_retention_scenarios", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


R = _load_scenarios()


SUPPRESS = [HealthCheck.function_scoped_fixture, HealthCheck.too_slow]


ATTN = dict(num_kv_heads=1, head_size=8, dtype="float16")


EXPECTED = {'full8_swa4w6_dense': {'cached': [[1, 0, 8], [2, 0, 16], [3, 0, 24], [4, 1, 4], [5, 1, 8], [6, 1, 12], [7, 1, 16],
                                   [8, 1, 20], [9, 1, 24], [10, 0, 32], [11, 0, 40], [12, 0, 48], [13, 1, 28],
                                   [14, 1, 32], [15, 1, 36], [16, 1, 40], [17, 1, 44], [18, 1, 48], [19, 0, 56],
                                   [20, 0, 64], [22, 1, 52], [23, 1, 56], [24, 1, 60], [25, 1, 64], [26, 0, 64],
                                   [27, 0, 56], [28, 1, 52], [29, 1, 56], [30, 1, 60], [31, 1, 64], [33, 0, 24],
                                   [34, 0, 32], [35, 0, 40], [36, 1, 20], [37, 1, 24], [38, 1, 28], [39, 1, 32],
                                   [40, 1, 36], [41, 1, 40], [42, 0, 48], [43, 0, 56], [44, 0, 64], [45, 1, 44],
                                   [46, 1, 48], [47, 1, 52], [48, 1, 56], [49, 1, 60], [50, 1, 64], [51, 0, 72],
                                   [53, 1, 68], [54, 1, 72]],
                        'digest': '4c532f9815765efe',
                        'hits': [[0, 0], [48, 0], [16, 0], [64, 0]]},
 'full8_swa4w6_eagle_dense': {'cached': [[1, 0, 8], [2, 0, 16], [3, 0, 24], [4, 1, 4], [5, 1, 8], [6, 1, 12],
                                         [7, 1, 16], [8, 1, 20], [9, 1, 24], [10, 0, 32], [11, 0, 40], [12, 0, 48],
                                         [13, 1, 28], [14, 1, 32], [15, 1, 36], [16, 1, 40], [17, 1, 44], [18, 1, 48],
                                         [19, 0, 56], [20, 0, 64], [21, 0, 56], [22, 1, 52], [23, 1, 56], [24, 1, 60],
                                         [25, 1, 64], [26, 1, 68], [27, 0, 48], [28, 0, 64], [29, 1, 60], [30, 1, 44],
                                         [31, 1, 48], [32, 1, 52], [33, 1, 56], [34, 1, 60], [35, 1, 64], [37, 0, 16],
                                         [38, 0, 24], [39, 0, 32], [40, 1, 12], [41, 1, 16], [42, 1, 20], [43, 1, 24],
                                         [44, 1, 28], [45, 1, 32], [46, 0, 40], [47, 0, 48], [48, 0, 56], [49, 1, 36],
                                         [50, 1, 40], [51, 1, 44], [52, 1, 48], [53, 1, 52], [54, 1, 56], [55, 0, 64],
                                         [56, 0, 72], [57, 0, 64], [58, 1, 60], [59, 1, 64], [60, 1, 68], [61, 1, 72],
                                         [62, 1, 76], [63, 1, 64]],
                              'digest': '4b5badeb6a62f602',
                              'hits': [[0, 0], [40, 0], [8, 0], [56, 0]]},
 'full8_swa4w6_eagle_r0': {'cached': [[1, 0, 8], [2, 0, 16], [3, 0, 24], [4, 1, 52], [5, 0, 48], [6, 0, 40],
                                      [7, 0, 32], [8, 1, 60], [9, 1, 56], [10, 0, 24], [11, 0, 64], [12, 0, 56],
                                      [13, 0, 40], [14, 0, 8], [15, 0, 32], [16, 0, 16], [17, 0, 48], [18, 0, 56],
                                      [19, 0, 64], [21, 0, 32], [22, 1, 12], [23, 1, 8], [24, 1, 4], [25, 0, 24],
                                      [26, 0, 16], [27, 1, 28], [28, 1, 32], [29, 1, 36], [30, 1, 40], [31, 1, 44],
                                      [32, 0, 8], [33, 1, 52], [34, 1, 56], [35, 1, 60], [38, 1, 60], [39, 1, 60],
                                      [40, 0, 40], [41, 0, 48], [42, 0, 64], [43, 0, 72], [44, 0, 64], [45, 0, 56],
                                      [48, 1, 64], [49, 1, 68]],
                           'digest': '972ace82694fb03c',
                           'hits': [[0, 0], [0, 40], [0, 8], [56, 0]]},
 'full8_swa4w6_eagle_r32': {'cached': [[1, 0, 8], [2, 0, 16], [3, 0, 24], [4, 1, 28], [5, 0, 48], [6, 0, 40],
                                       [7, 0, 32], [8, 0, 48], [9, 0, 64], [10, 1, 32], [11, 1, 36], [12, 0, 56],
                                       [13, 0, 56], [14, 0, 40], [15, 1, 52], [16, 1, 56], [17, 1, 60], [18, 1, 64],
                                       [19, 1, 68], [20, 0, 64], [22, 1, 36], [23, 1, 40], [24, 1, 44], [25, 0, 8],
                                       [26, 1, 52], [27, 1, 56], [28, 1, 60], [29, 1, 64], [31, 0, 16], [32, 0, 24],
                                       [33, 1, 4], [34, 1, 8], [35, 1, 12], [36, 0, 32], [37, 0, 72], [38, 0, 64],
                                       [39, 0, 40], [40, 0, 48], [41, 1, 28], [42, 1, 32], [43, 1, 36], [44, 0, 56],
                                       [46, 1, 64], [47, 0, 64], [48, 1, 60], [49, 1, 60], [50, 1, 64], [51, 1, 68]],
                            'digest': '60f5dff75a7120cb',
                            'hits': [[0, 0], [32, 40], [0, 8], [56, 0]]},
 'full8_swa4w6_eagle_r64': {'cached': [[1, 0, 8], [2, 0, 16], [3, 0, 24], [4, 1, 52], [5, 0, 48], [6, 0, 40],
                                       [7, 0, 32], [8, 1, 60], [9, 1, 56], [10, 0, 16], [11, 0, 64], [12, 0, 56],
                                       [13, 0, 24], [14, 0, 8], [15, 1, 64], [16, 1, 68], [17, 0, 32], [18, 0, 40],
                                       [19, 0, 48], [20, 0, 56], [21, 0, 64], [23, 0, 32], [24, 1, 12], [25, 1, 8],
                                       [26, 1, 4], [27, 0, 24], [28, 0, 16], [29, 1, 28], [30, 1, 32], [31, 1, 36],
                                       [32, 1, 40], [33, 1, 44], [34, 0, 8], [35, 1, 52], [36, 1, 56], [37, 1, 60],
                                       [38, 1, 64], [40, 1, 60], [41, 1, 60], [42, 0, 40], [43, 0, 48], [44, 0, 64],
                                       [45, 0, 72], [46, 0, 64], [47, 0, 56], [49, 1, 64], [50, 1, 64], [51, 1, 68]],
                            'digest': '7fe68d3bf8589244',
                            'hits': [[0, 0], [0, 40], [0, 8], [56, 0]]},
 'full8_swa4w6_extra3_r32': {'cached': [[1, 0, 8], [2, 0, 16], [3, 0, 24], [4, 1, 28], [5, 0, 48], [6, 0, 40],
                                        [7, 0, 32], [8, 0, 64], [9, 0, 56], [10, 1, 32], [11, 0, 64], [12, 0, 56],
                                        [13, 0, 40], [15, 0, 40], [16, 1, 60], [17, 1, 64], [18, 0, 48], [19, 0, 24],
                                        [20, 1, 44], [21, 1, 48], [22, 0, 16], [23, 0, 8], [24, 1, 60], [25, 1, 64],
                                        [27, 0, 32], [28, 1, 12], [29, 1, 16], [31, 0, 72], [32, 0, 48], [33, 1, 28],
                                        [34, 1, 32], [35, 0, 64], [36, 0, 56], [40, 1, 60], [41, 1, 64], [42, 1, 68],
                                        [43, 1, 72]],
                             'digest': '249dadecd70f7116',
                             'hits': [[0, 0], [32, 48], [0, 16], [64, 0]]},
 'full8_swa4w6_extra9_r32': {'cached': [[1, 0, 8], [2, 0, 16], [3, 0, 24], [4, 0, 40], [5, 0, 32], [6, 0, 40],
                                        [7, 0, 64], [8, 0, 64], [9, 0, 56], [10, 0, 48], [11, 1, 28], [12, 1, 32],
                                        [13, 1, 44], [14, 0, 16], [15, 0, 24], [17, 0, 56], [18, 1, 60], [19, 1, 64],
                                        [20, 0, 48], [21, 1, 48], [22, 0, 8], [24, 1, 60], [25, 1, 64], [27, 0, 40],
                                        [28, 0, 32], [29, 1, 12], [30, 1, 16], [31, 0, 64], [32, 0, 56], [33, 0, 48],
                                        [34, 1, 28], [35, 1, 32], [40, 0, 72], [43, 1, 60], [44, 1, 64], [45, 1, 68],
                                        [46, 1, 72]],
                             'digest': '2cb6e9388866d675',
                             'hits': [[0, 0], [32, 48], [0, 16], [64, 0]]},
 'full8_swa4w6_r0': {'cached': [[1, 0, 8], [2, 0, 16], [3, 0, 24], [4, 0, 32], [5, 0, 48], [6, 0, 40], [7, 0, 32],
                                [8, 1, 60], [9, 0, 8], [10, 0, 24], [11, 0, 64], [12, 0, 56], [13, 0, 48],
                                [14, 0, 40], [15, 1, 64], [16, 0, 16], [17, 0, 56], [18, 0, 64], [20, 0, 72],
                                [22, 0, 48], [25, 1, 16], [26, 1, 12], [27, 0, 32], [28, 0, 40], [29, 0, 24],
                                [30, 1, 44], [31, 1, 48], [32, 0, 16], [33, 0, 8], [34, 1, 60], [35, 1, 64],
                                [37, 0, 64], [38, 0, 56], [42, 1, 68], [43, 1, 72]],
                     'digest': 'fcb69c6ca60d8a32',
                     'hits': [[0, 0], [0, 48], [0, 16], [64, 0]]},
 'full8_swa4w6_r32': {'cached': [[1, 0, 8], [2, 0, 16], [3, 0, 24], [4, 1, 28], [5, 0, 48], [6, 0, 40], [7, 0, 32],
                                 [8, 0, 64], [9, 0, 56], [10, 1, 32], [11, 0, 64], [12, 0, 56], [13, 0, 40],
                                 [15, 0, 40], [16, 1, 60], [17, 1, 64], [18, 0, 48], [19, 0, 24], [20, 1, 44],
                                 [21, 1, 48], [22, 0, 16], [23, 0, 8], [24, 1, 60], [25, 1, 64], [27, 0, 32],
                                 [28, 1, 12], [29, 1, 16], [31, 0, 72], [32, 0, 48], [33, 1, 28], [34, 1, 32],
                                 [35, 0, 64], [36, 0, 56], [40, 1, 60], [41, 1, 64], [42, 1, 68], [43, 1, 72]],
                      'digest': '5d4209fa76c9cc56',
                      'hits': [[0, 0], [32, 48], [0, 16], [64, 0]]},
 'full8_swa4w6_r64': {'cached': [[1, 0, 8], [2, 0, 16], [3, 0, 24], [4, 0, 32], [5, 0, 48], [6, 0, 40], [7, 0, 32],
                                 [8, 1, 60], [9, 0, 8], [10, 0, 24], [11, 0, 64], [12, 0, 56], [13, 0, 48],
                                 [14, 0, 40], [15, 1, 64], [16, 0, 16], [17, 0, 56], [18, 0, 64], [20, 0, 72],
                                 [22, 0, 48], [24, 1, 60], [25, 1, 16], [26, 1, 12], [27, 0, 32], [28, 0, 40],
                                 [29, 0, 24], [30, 1, 44], [31, 1, 48], [32, 0, 16], [33, 0, 8], [34, 1, 60],
                                 [35, 1, 64], [37, 0, 64], [38, 0, 56], [41, 1, 64], [42, 1, 68], [43, 1, 72]],
                      'digest': '459c855e36fc440f',
                      'hits': [[0, 0], [0, 48], [0, 16], [64, 0]]},
 'swa4w6_dense': {'cached': [[1, 0, 4], [2, 0, 8], [3, 0, 12], [4, 0, 16], [5, 0, 20], [6, 0, 24], [7, 0, 28],
                             [8, 0, 32], [9, 0, 36], [10, 0, 40], [11, 0, 44], [12, 0, 48], [13, 0, 52], [14, 0, 56],
                             [15, 0, 60], [16, 0, 64], [17, 0, 68], [18, 0, 52], [19, 0, 56], [20, 0, 60],
                             [21, 0, 64], [23, 0, 24], [24, 0, 28], [25, 0, 32], [26, 0, 36], [27, 0, 40],
                             [28, 0, 44], [29, 0, 48], [30, 0, 52], [31, 0, 56], [32, 0, 60], [33, 0, 64],
                             [34, 0, 68], [35, 0, 72], [36, 0, 76]],
                  'digest': 'c9c089bc39cb0a9d',
                  'hits': [[0, 0], [48, 0], [20, 0], [64, 0]]},
 'swa4w6_eagle_dense': {'cached': [[1, 0, 4], [2, 0, 8], [3, 0, 12], [4, 0, 16], [5, 0, 20], [6, 0, 24], [7, 0, 28],
                                   [8, 0, 32], [9, 0, 36], [10, 0, 40], [11, 0, 44], [12, 0, 48], [13, 0, 52],
                                   [14, 0, 56], [15, 0, 60], [16, 0, 64], [17, 0, 68], [18, 0, 48], [19, 0, 52],
                                   [20, 0, 56], [21, 0, 60], [22, 0, 64], [23, 0, 64], [24, 0, 20], [25, 0, 24],
                                   [26, 0, 28], [27, 0, 32], [28, 0, 36], [29, 0, 40], [30, 0, 44], [31, 0, 48],
                                   [32, 0, 52], [33, 0, 56], [34, 0, 60], [35, 0, 64], [36, 0, 68], [37, 0, 72],
                                   [38, 0, 76]],
                        'digest': '8505a15846480787',
                        'hits': [[0, 0], [44, 0], [16, 0], [60, 0]]},
 'swa4w6_eagle_r0': {'cached': [[2, 0, 56], [3, 0, 60], [4, 0, 64], [11, 0, 68], [12, 0, 72], [13, 0, 64],
                                [14, 0, 64], [17, 0, 56], [18, 0, 60], [19, 0, 64]],
                     'digest': '0ffa484ef95f1304',
                     'hits': [[0, 0], [0, 0], [0, 0], [60, 0]]},
 'swa4w6_eagle_r32': {'cached': [[1, 0, 36], [2, 0, 36], [3, 0, 32], [4, 0, 28], [5, 0, 60], [6, 0, 56], [7, 0, 32],
                                 [8, 0, 28], [9, 0, 64], [10, 0, 68], [11, 0, 36], [13, 0, 56], [14, 0, 60],
                                 [15, 0, 64], [17, 0, 60], [18, 0, 64], [21, 0, 64], [22, 0, 68], [23, 0, 72]],
                      'digest': '9f1e5b5ba7f4660c',
                      'hits': [[0, 0], [32, 0], [0, 0], [60, 0]]},
 'swa4w6_eagle_r64': {'cached': [[2, 0, 56], [3, 0, 60], [4, 0, 64], [6, 0, 68], [12, 0, 68], [13, 0, 72],
                                 [14, 0, 64], [15, 0, 60], [16, 0, 64], [18, 0, 56], [19, 0, 60], [20, 0, 64]],
                      'digest': '86c6c3b95ea9dfc9',
                      'hits': [[0, 0], [0, 0], [0, 0], [60, 0]]},
 'swa4w6_extra3': {'cached': [[1, 0, 4], [2, 0, 8], [3, 0, 12], [4, 0, 16], [5, 0, 20], [6, 0, 24], [7, 0, 28],
                              [8, 0, 32], [9, 0, 36], [10, 0, 40], [11, 0, 44], [12, 0, 48], [13, 0, 52], [14, 0, 56],
                              [15, 0, 60], [16, 0, 64], [17, 0, 68], [18, 0, 52], [19, 0, 56], [20, 0, 60],
                              [21, 0, 64], [23, 0, 24], [24, 0, 28], [25, 0, 32], [26, 0, 36], [27, 0, 40],
                              [28, 0, 44], [29, 0, 48], [30, 0, 52], [31, 0, 56], [32, 0, 60], [33, 0, 64],
                              [34, 0, 68], [35, 0, 72], [36, 0, 76]],
                   'digest': 'a256f5b425d2ff46',
                   'hits': [[0, 0], [48, 0], [20, 0], [64, 0]]},
 'swa4w6_extra5_tight': {'cached': [[1, 0, 72], [2, 0, 68], [3, 0, 52], [5, 0, 64], [6, 0, 60], [7, 0, 64],
                                    [8, 0, 60], [9, 0, 16], [10, 0, 44], [11, 0, 40], [12, 0, 56], [13, 0, 48]],
                         'digest': 'f293d33dd3d2f220',
                         'hits': [[0, 0], [48, 0], [0, 0], [0, 0]]},
 'swa4w6_extra9': {'cached': [[1, 0, 4], [2, 0, 8], [3, 0, 12], [4, 0, 16], [5, 0, 20], [6, 0, 24], [7, 0, 28],
                              [8, 0, 32], [9, 0, 36], [10, 0, 40], [11, 0, 44], [12, 0, 48], [13, 0, 52], [14, 0, 56],
                              [15, 0, 60], [16, 0, 64], [17, 0, 68], [18, 0, 52], [19, 0, 56], [20, 0, 60],
                              [21, 0, 64], [23, 0, 24], [24, 0, 28], [25, 0, 32], [26, 0, 36], [27, 0, 40],
                              [28, 0, 44], [29, 0, 48], [30, 0, 52], [31, 0, 56], [32, 0, 60], [33, 0, 64],
                              [34, 0, 68], [35, 0, 72], [36, 0, 76]],
                   'digest': '1e9cbd57120c77eb',
                   'hits': [[0, 0], [48, 0], [20, 0], [64, 0]]},
 'swa4w6_r0': {'cached': [[3, 0, 60], [4, 0, 64], [11, 0, 68], [12, 0, 72], [17, 0, 60], [18, 0, 64]],
               'digest': 'b8b085dec26b9016',
               'hits': [[0, 0], [0, 0], [0, 0], [64, 0]]},
 'swa4w6_r32': {'cached': [[1, 0, 28], [2, 0, 60], [3, 0, 32], [4, 0, 28], [5, 0, 64], [6, 0, 60], [8, 0, 32],
                           [9, 0, 64], [11, 0, 60], [12, 0, 64], [16, 0, 68], [17, 0, 72]],
                'digest': '12e2e50e232f540a',
                'hits': [[0, 0], [32, 0], [0, 0], [64, 0]]},
 'swa4w6_r64': {'cached': [[3, 0, 60], [4, 0, 64], [11, 0, 68], [12, 0, 72], [13, 0, 64], [14, 0, 60], [17, 0, 60],
                           [18, 0, 64]],
                'digest': '4d9270538eaea655',
                'hits': [[0, 0], [0, 0], [0, 0], [64, 0]]}}


SPARSE_MASKS = [
    ((4, 6, 8, False, 0, (64, 30, 31), None, 3, 17), '01100000000110'),
    ((8, 17, 32, False, 16, (), 7, 5, 19), '-'),
    ((8, 9, 16, True, 48, (64, 30, 31), 16, 5, 19), '11110011000011'),
    ((4, 9, 4, True, None, (), 16, 9, 9), '-'),
    ((4, 2, 8, True, 8, (-3,), 16, 3, 17), '-'),
    ((4, 2, 16, False, 24, (5, 40), None, 0, 13), '0000010100010'),
    ((8, 6, 16, True, 0, (-3,), 7, 9, 9), ''),
    ((4, 2, 4, True, None, (), None, 3, 17), '-'),
    ((4, 2, 8, True, 24, (21,), 16, 3, 17), '11110000110000'),
    ((8, 9, 16, True, 16, (0,), None, 9, 9), '-'),
    ((8, 17, 8, True, 32, (-3,), None, 5, 19), '01110111011101'),
    ((8, 9, 32, True, 24, (64, 30, 31), 13, 3, 17), '10111110110110'),
    ((4, 9, 16, False, 8, (5, 40), 7, 9, 9), '-'),
    ((4, 2, 16, False, 12, (5, 40), None, 3, 17), '00101100100100'),
    ((4, 2, 4, True, None, (0,), 16, 9, 9), '-'),
    ((8, 9, 8, True, 0, (21,), None, 5, 19), '00000000000000'),
    ((8, 9, 8, True, 32, (64, 30, 31), 7, 9, 9), ''),
    ((8, 2, 32, False, 48, (21,), 16, 5, 19), '10000010001010'),
    ((8, 17, 16, True, 16, (0,), 16, 9, 9), '-'),
    ((8, 2, 8, False, 16, (-3,), 7, 0, 13), '0101011101010'),
    ((8, 2, 8, True, 48, (21,), None, 9, 9), ''),
    ((8, 17, 8, False, 16, (), None, 9, 9), '-'),
    ((8, 17, 16, True, 0, (), None, 5, 19), '00000000000000'),
    ((4, 2, 16, False, 24, (64, 30, 31), 7, 0, 13), '0001011000010'),
    ((8, 17, 16, False, 0, (), 7, 0, 13), '0000000000000'),
    ((4, 2, 8, False, None, (), None, 0, 13), '0101010101010'),
    ((4, 9, 4, True, 8, (0,), None, 0, 13), '-'),
    ((8, 17, 16, False, None, (5, 40), None, 9, 9), '-'),
    ((4, 9, 16, False, 16, (), 16, 5, 19), '01100110011001'),
    ((4, 9, 4, False, 8, (-3,), 13, 9, 9), '-'),
    ((8, 9, 8, True, 0, (0,), 7, 5, 19), '00000000000000'),
    ((8, 2, 32, True, 16, (5, 40), 16, 3, 17), '-'),
    ((8, 9, 32, False, 16, (21,), None, 3, 17), '10101010101010'),
    ((8, 6, 16, False, None, (21,), None, 5, 19), '10101010101010'),
    ((8, 2, 8, False, 16, (64, 30, 31), 16, 0, 13), '0111010101010'),
    ((4, 6, 16, False, 16, (64, 30, 31), 7, 3, 17), '10111001100110'),
    ((8, 6, 32, True, None, (64, 30, 31), None, 9, 9), ''),
    ((8, 6, 16, True, 0, (-3,), None, 9, 9), ''),
    ((8, 17, 32, False, 0, (), None, 3, 17), '00000000000000'),
    ((4, 9, 8, False, 16, (), None, 0, 13), '0011001100110'),
    ((4, 9, 8, True, 0, (5, 40), None, 5, 19), '00011100000000'),
    ((4, 6, 16, False, 0, (0,), None, 9, 9), ''),
    ((8, 17, 32, False, 0, (5, 40), None, 9, 9), ''),
    ((8, 17, 8, True, 0, (5, 40), None, 9, 9), ''),
    ((4, 6, 4, False, 24, (21,), 13, 9, 9), ''),
    ((8, 2, 16, False, 16, (0,), None, 5, 19), '10101010101010'),
    ((4, 6, 16, False, 12, (0,), 13, 5, 19), '10110111110110'),
    ((4, 6, 8, False, 24, (-3,), None, 0, 13), '0000110000110'),
    ((4, 6, 4, False, None, (21,), 13, 3, 17), '-'),
    ((8, 17, 32, True, 48, (5, 40), None, 9, 9), ''),
    ((8, 6, 16, True, 48, (), 7, 0, 13), '0000011000011'),
    ((8, 9, 8, False, 32, (-3,), None, 5, 19), '00100010001000'),
    ((4, 9, 16, False, 0, (5, 40), 13, 0, 13), '0000001100000'),
    ((4, 2, 8, False, 8, (21,), 16, 3, 17), '10101010101010'),
    ((4, 17, 8, False, 12, (5, 40), None, 5, 19), '-'),
    ((4, 9, 4, False, None, (21,), None, 5, 19), '-'),
    ((8, 9, 8, True, None, (21,), 7, 0, 13), '-'),
    ((8, 6, 8, True, 0, (21,), None, 9, 9), ''),
    ((4, 2, 16, False, 8, (64, 30, 31), 16, 9, 9), ''),
    ((8, 17, 8, False, 16, (21,), 13, 5, 19), '-'),
    ((8, 6, 32, False, 48, (5, 40), None, 3, 17), '10100000100000'),
    ((8, 2, 16, False, 0, (-3,), 7, 9, 9), ''),
    ((8, 2, 32, True, 0, (), None, 5, 19), '00000000000000'),
    ((4, 17, 8, True, 24, (-3,), 13, 0, 13), '0011111011111'),
    ((8, 6, 32, True, None, (0,), 16, 5, 19), '00110011001100'),
    ((8, 17, 32, False, 0, (5, 40), 13, 3, 17), '10000000000000'),
    ((8, 17, 16, True, None, (21,), 7, 0, 13), '-'),
    ((8, 17, 32, True, 16, (), None, 5, 19), '-'),
    ((8, 6, 32, True, 48, (21,), 13, 0, 13), '1000011000011'),
    ((4, 9, 4, False, None, (5, 40), 7, 0, 13), '-'),
    ((4, 2, 4, False, 16, (), None, 3, 17), '10001000100010'),
    ((4, 2, 8, True, 16, (-3,), 16, 3, 17), '11001100110011'),
    ((4, 17, 4, False, None, (), None, 3, 17), '-'),
    ((4, 2, 16, True, 0, (5, 40), None, 0, 13), '1000000110000'),
    ((4, 17, 16, True, 0, (5, 40), 7, 3, 17), '01111100000000'),
    ((8, 6, 16, False, 24, (21,), 16, 5, 19), '10010010011010'),
    ((8, 6, 16, False, 0, (), None, 3, 17), '00000000000000'),
    ((8, 17, 8, True, 32, (0,), 13, 9, 9), ''),
    ((8, 17, 32, True, None, (5, 40), None, 5, 19), '01110111011101'),
    ((4, 2, 4, True, 16, (21,), 7, 3, 17), '11101100110011'),
    ((8, 17, 32, True, 16, (21,), None, 5, 19), '-'),
    ((8, 17, 8, True, 24, (64, 30, 31), 7, 0, 13), '-'),
    ((4, 17, 4, True, 0, (), 7, 0, 13), '0000000000000'),
    ((8, 6, 16, False, 0, (), 7, 3, 17), '00000000000000'),
    ((8, 2, 16, False, 32, (5, 40), 16, 5, 19), '00100010001000'),
    ((8, 9, 16, False, None, (), 13, 3, 17), '10101010111010'),
    ((8, 2, 16, False, 16, (5, 40), 7, 5, 19), '11101010101010'),
    ((4, 2, 8, False, 16, (21,), None, 3, 17), '10001000100010'),
    ((4, 17, 8, True, 0, (), None, 3, 17), '00000000000000'),
    ((8, 2, 8, True, 0, (-3,), 13, 0, 13), '0000000000000'),
    ((8, 9, 32, False, 16, (-3,), 13, 9, 9), ''),
    ((8, 17, 16, True, 48, (21,), 13, 3, 17), '01110001110001'),
    ((8, 17, 16, True, None, (-3,), 7, 5, 19), '-'),
    ((4, 6, 4, False, None, (64, 30, 31), None, 0, 13), '-'),
    ((4, 2, 16, True, 24, (21,), 16, 5, 19), '11000011000011'),
    ((4, 2, 8, False, 0, (), 16, 3, 17), '00000000000000'),
    ((8, 2, 8, True, 0, (21,), 16, 5, 19), '00000000000000'),
    ((8, 17, 16, True, 0, (5, 40), 13, 9, 9), ''),
    ((4, 17, 8, False, 0, (5, 40), 16, 0, 13), '0000001111000'),
    ((4, 6, 8, True, 16, (5, 40), None, 0, 13), '1011101111111'),
    ((4, 17, 8, False, 8, (64, 30, 31), None, 5, 19), '-'),
    ((4, 9, 8, False, 24, (), None, 9, 9), ''),
    ((8, 9, 32, False, 24, (-3,), None, 0, 13), '0010010010010'),
    ((4, 17, 4, True, 0, (), 16, 5, 19), '00000000000000'),
    ((4, 9, 8, True, None, (21,), 7, 0, 13), '-'),
    ((8, 6, 16, False, None, (21,), 16, 3, 17), '10101010101010'),
    ((8, 17, 8, True, 48, (0,), 13, 0, 13), '1000111000111'),
    ((8, 2, 32, True, 24, (0,), 7, 0, 13), '1011011011011'),
    ((8, 2, 32, True, None, (0,), None, 5, 19), '00110011001100'),
    ((8, 2, 32, False, 32, (64, 30, 31), None, 0, 13), '0001000100010'),
    ((4, 9, 16, True, 0, (64, 30, 31), None, 5, 19), '00000000011100'),
    ((4, 6, 16, True, 0, (0,), 13, 5, 19), '00000000000000'),
    ((4, 2, 4, False, 8, (), 13, 9, 9), ''),
    ((8, 2, 16, True, 0, (), 7, 5, 19), '00000000000000'),
    ((4, 6, 8, False, 0, (), 13, 5, 19), '00000000000000'),
    ((8, 2, 32, False, 0, (21,), None, 0, 13), '0000000000000'),
    ((4, 6, 4, True, 12, (0,), None, 5, 19), '-'),
    ((8, 2, 16, False, 0, (5, 40), 16, 5, 19), '00000000000000'),
    ((8, 2, 16, True, 24, (), None, 9, 9), ''),
    ((4, 2, 4, False, None, (64, 30, 31), None, 0, 13), '-'),
    ((8, 17, 32, True, 48, (0,), None, 3, 17), '01110001110001'),
    ((4, 17, 4, True, 0, (-3,), 13, 9, 9), ''),
    ((8, 2, 16, False, None, (64, 30, 31), 16, 9, 9), ''),
    ((4, 6, 8, False, 16, (5, 40), 16, 9, 9), ''),
    ((8, 6, 32, False, 32, (5, 40), 13, 0, 13), '0001000100011'),
    ((8, 2, 32, True, 0, (-3,), 16, 0, 13), '0000000000000'),
    ((4, 6, 16, False, None, (0,), 13, 0, 13), '0011001100111'),
    ((4, 6, 16, False, 12, (21,), 13, 9, 9), ''),
    ((8, 6, 16, True, 16, (0,), None, 5, 19), '-'),
    ((4, 9, 16, True, 0, (-3,), None, 0, 13), '0000000000000'),
    ((4, 17, 16, False, 24, (-3,), 13, 9, 9), ''),
    ((4, 17, 16, True, 8, (21,), 7, 3, 17), '-'),
    ((4, 6, 4, False, 0, (64, 30, 31), 16, 3, 17), '00110000000110'),
    ((8, 6, 8, True, 0, (), 7, 5, 19), '00000000000000'),
    ((8, 17, 16, False, 48, (0,), None, 5, 19), '10000110000110'),
    ((8, 6, 16, True, 32, (0,), None, 3, 17), '11001100110011'),
    ((8, 17, 8, False, 0, (64, 30, 31), None, 5, 19), '01100000000000'),
    ((8, 6, 8, True, 32, (-3,), None, 5, 19), '00110011001100'),
    ((8, 17, 32, False, 48, (), None, 0, 13), '0000110000110'),
    ((8, 6, 32, True, None, (64, 30, 31), 7, 0, 13), '0001100110011'),
    ((8, 17, 16, True, 32, (21,), None, 5, 19), '01110111011101'),
    ((4, 9, 4, True, 12, (), None, 0, 13), '-'),
    ((8, 17, 32, True, 48, (5, 40), 13, 5, 19), '11000111000111'),
    ((4, 6, 4, False, 16, (5, 40), 7, 5, 19), '11111110011001'),
    ((4, 9, 4, True, 8, (5, 40), 7, 3, 17), '-'),
    ((4, 9, 4, True, 12, (5, 40), 7, 0, 13), '-'),
    ((8, 6, 32, False, 32, (64, 30, 31), 7, 5, 19), '01100010001000'),
    ((8, 6, 32, True, 0, (), 13, 9, 9), ''),
    ((8, 17, 16, True, 0, (0,), 16, 0, 13), '1000000000000'),
    ((4, 2, 16, False, 12, (0,), 7, 3, 17), '00110100100100'),
    ((8, 2, 32, False, 24, (), 7, 5, 19), '11010010010010'),
    ((4, 6, 8, False, 24, (5, 40), None, 3, 17), '01100111100001'),
    ((8, 17, 16, False, 16, (5, 40), 7, 3, 17), '-'),
    ((4, 17, 8, True, 8, (), None, 9, 9), '-'),
    ((8, 17, 32, False, 48, (-3,), 16, 3, 17), '01100001100111'),
    ((4, 6, 8, True, 8, (64, 30, 31), 7, 0, 13), '-'),
    ((8, 17, 16, True, 24, (64, 30, 31), None, 9, 9), '-'),
    ((4, 2, 16, False, 12, (0,), 13, 0, 13), '0010010010011'),
    ((8, 17, 32, False, 16, (21,), None, 3, 17), '-'),
    ((4, 9, 16, False, 0, (-3,), None, 5, 19), '00000000000000'),
]


REPLAY_BOUNDARIES = {
    (1, 4): ((0,), (0,)),
    (1, 16): ((0,), (0,)),
    (2, 4): ((1,), (0,)),
    (2, 16): ((1,), (0,)),
    (15, 4): ((14,), (8,)),
    (15, 16): ((14,), (0,)),
    (16, 4): ((15,), (8, 12)),
    (16, 16): ((15,), (0,)),
    (17, 4): ((16,), (12,)),
    (17, 16): ((16,), (0,)),
    (31, 4): ((30,), (24,)),
    (31, 16): ((30,), (0,)),
    (32, 4): ((31,), (24, 28)),
    (32, 16): ((31,), (0, 16)),
    (33, 4): ((32,), (28,)),
    (33, 16): ((32,), (16,)),
    (64, 4): ((63,), (56, 60)),
    (64, 16): ((63,), (32, 48)),
    (70, 4): ((69,), (64,)),
    (70, 16): ((69,), (48,)),
}


def _manager(impl, specs, retention=None, *, sbs=4, hbs=4, caching=True, events=False, num_blocks=32):
    cfg = KVCacheConfig(num_blocks=num_blocks, kv_cache_tensors=[],
                        kv_cache_groups=[KVCacheGroupSpec([f"l{i}"], s) for i, s in enumerate(specs)],
                        prefix_cache_retention_interval=retention)
    return impl.kv_cache.KVCacheManager(cfg, max_model_len=256, scheduler_block_size=sbs, hash_block_size=hbs,
                                        enable_caching=caching, enable_kv_cache_events=events,
                                        max_in_flight_tokens=64, use_int_block_hashes=False)


def _mamba(bs=4, mode="none"):
    return MambaSpec(block_size=bs, shapes=((4,),), dtypes=("float32",), mamba_cache_mode=mode)


# ------------------------------------------------------------------ validation
# vLLM 0.33.0's KVCacheManager(...) with prefix_cache_retention_interval=r, scheduler block 4:
RETENTION_CONFIGS = [
    (("full",), 16, ValueError, "prefix_cache_retention_interval is set but this model has no sliding-window or "
     "Mamba KV cache group, so retention has no effect. Set it to 0 (it only applies to sliding-window and Mamba "
     "attention)."),
    (("full",), 0, None, None),
    (("full",), -4, ValueError, "has no sliding-window or Mamba KV cache group"),
    (("swa",), 6, ValueError, "prefix_cache_retention_interval (6) must be non-negative and a multiple of "
     "scheduler_block_size (4)."),
    (("swa",), -4, ValueError, "prefix_cache_retention_interval (-4) must be non-negative"),
    (("swa",), 0, None, None),
    (("swa",), 8, None, None),
    (("full", "swa"), 12, None, None),
]


# ------------------------------------------------------------------ live: kvcy beside vLLM
@pytest.fixture(scope="module")
def vllm_api():
    os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
    return R.vllm_api()


@st.composite
def cases(draw):
    layout = draw(st.sampled_from(["swa", "full4_swa4", "full8_swa4"]))
    extra = draw(st.sampled_from([0, 0, 1, 3, 7]))
    window = draw(st.integers(2, 20))
    if layout == "swa":
        bs = draw(st.sampled_from([4, 8]))
        groups, hbs, sbs = [("swa", bs, window, extra)], bs, bs
    elif layout == "full4_swa4":
        groups, hbs, sbs = [("full", 4), ("swa", 4, window, extra)], 4, 4
    else:
        groups, hbs, sbs = [("full", 8), ("swa", 4, window, extra)], 4, 8
    retention = draw(st.sampled_from([None, 0, sbs, 2 * sbs, 3 * sbs, 4 * sbs]))
    ops = []
    shared_base = draw(st.integers(8, 40))
    for i in range(draw(st.integers(4, 18))):
        rid = draw(st.sampled_from("abcd"))
        kind = draw(st.sampled_from(["admit", "admit", "step", "step", "step", "free"]))
        if kind == "admit":
            length = draw(st.integers(8, 72))
            if layout == "full8_swa4":
                # (a prompt of 8k+1..8k+3 tokens: vLLM registers no partial-block prefix
                # entry, a fine-grained partial hit kvcy does not make yet)
                length = length // 8 * 8 + draw(st.integers(1, 3))
            shared = min(draw(st.sampled_from([0, shared_base, length])), length)
            runs = [(0, shared), (10000 * (i + 1), length - shared)]
            ops.append(("admit", rid, runs, draw(st.integers(1, 40))))
        elif kind == "step":
            ops.append(("step", rid, draw(st.integers(1, 24))))
        else:
            ops.append(("free", rid))
    return dict(groups=groups, hash_block_size=hbs, scheduler_block_size=sbs,
                num_blocks=draw(st.integers(12, 64)), use_eagle=draw(st.booleans()), retention=retention, ops=ops)


# ------------------------------------------------------------------ whole scenarios
@pytest.mark.parametrize("name", list(R.CASES))
def test_cases_as_vllm(impl, name):
    """Hits, junctions, cached blocks and (digest) every block id and free-queue order are vLLM's."""
    got = R.summary(R.run(R.kvcy_api(impl), R.CASES[name]))
    want = EXPECTED[name]
    assert got["hits"] == want["hits"]
    assert got["cached"] == want["cached"]
    assert got["digest"] == want["digest"]


def test_cases_tell_the_policies_apart():
    """The recording is no accident of one policy: sparse retention caches fewer blocks and
    finds shorter sibling hits than dense; extra retained tokens change what is freed when."""
    for layout in ("swa4w6", "swa4w6_eagle", "full8_swa4w6", "full8_swa4w6_eagle"):
        dense = EXPECTED[f"{layout}_dense"]
        for r in ("r0", "r32", "r64"):
            sparse = EXPECTED[f"{layout}_{r}"]
            assert len(sparse["cached"]) < len(dense["cached"]), (layout, r)
            assert sparse["hits"][1][0] < dense["hits"][1][0], (layout, r)  # the sibling "b"
            assert sparse["hits"][3] == dense["hits"][3]  # the resend "d" hits its replay boundary
    assert EXPECTED["full8_swa4w6_r32"]["hits"][1][1] == 48  # shared_prefix_boundary reported
    for extra in ("swa4w6_extra3", "swa4w6_extra9"):
        assert EXPECTED[extra]["digest"] != EXPECTED["swa4w6_dense"]["digest"]
    assert EXPECTED["swa4w6_extra5_tight"]["hits"][3] == [0, 0]


# ------------------------------------------------------------------ the mask and boundaries
def test_sparse_mask_as_vllm(impl):
    kv = impl.kv_cache
    for (bs, window, align, eagle, ret, bounds, final, start, end), want in SPARSE_MASKS:
        spec = _swa(bs, window)
        m = kv.SlidingWindowManager.reachable_block_mask(start, end, align, spec, eagle, retention_interval=ret,
                                                         reachable_boundaries=bounds,
                                                         final_segment_end_block=final)
        got = "-" if m is None else "".join("1" if x else "0" for x in m)
        assert got == want, (bs, window, align, eagle, ret, bounds, final, start, end)
    assert sum("1" in w for _, w in SPARSE_MASKS) > 50  # (mostly real masks, not None)


def test_replay_boundaries_as_vllm(impl):
    rb = impl.kv_cache.replay_boundaries
    for (p, sbs), (plain, eagle) in REPLAY_BOUNDARIES.items():
        assert rb(p, sbs, False) == plain and rb(p, sbs, True) == eagle, (p, sbs)


def test_mask_refusals(impl):
    kv = impl.kv_cache
    spec = _swa()
    # (dcp scales the window's block size: the same mask as a block of twice the size)
    dcp_mask = kv.SlidingWindowManager.reachable_block_mask(0, 8, 32, spec, False, dcp_world_size=2)
    assert dcp_mask == kv.SlidingWindowManager.reachable_block_mask(0, 8, 32, _swa(bs=8), False)
    assert dcp_mask != kv.SlidingWindowManager.reachable_block_mask(0, 8, 32, spec, False)
    assert kv.FullAttentionManager.reachable_block_mask(0, 8, 8, _full(), False, dcp_world_size=2) is None
    # (Mamba align mode's sparse states: retention 0 keeps only the boundaries' states)
    assert kv.MambaManager.reachable_block_mask(0, 8, 8, _mamba(), False, retention_interval=0) == [False] * 8
    assert kv.MambaManager.reachable_block_mask(0, 8, 8, _mamba(), False, retention_interval=0,
                                                reachable_boundaries=[23]) == [False] * 3 + [True] + [False] * 4
    assert kv.MambaManager.reachable_block_mask(0, 8, 8, _mamba(), False) is None
    assert kv.MambaManager.reachable_block_mask(0, 8, None, _mamba(), False, retention_interval=8) is None
    for kw, exc, msg in (({"retention_interval": -8}, ValueError, "retention_interval must be non-negative"),
                         ({"retention_interval": 8.0}, TypeError, "retention_interval must be an int"),
                         ({"reachable_boundaries": 5}, TypeError, "reachable_boundaries must be a sequence"),
                         ({"reachable_boundaries": ["5"]}, TypeError, "reachable_boundaries must be an int"),
                         ({"final_segment_end_block": -1}, ValueError, "final_segment_end_block must be"),
                         ({"dcp_world_size": 1.0}, TypeError, "dcp_world_size must be an int")):
        with pytest.raises(exc, match=msg):
            kv.SlidingWindowManager.reachable_block_mask(0, 8, 8, spec, False, **kw)
    with pytest.raises(ValueError, match="alignment_tokens must be positive"):
        kv.SlidingWindowManager.reachable_block_mask(0, 8, 0, spec, False, retention_interval=0)


def test_retention_validated_as_vllm(impl):
    for kinds, r, exc, msg in RETENTION_CONFIGS:
        specs = [_full() if k == "full" else _swa() for k in kinds]
        if exc is None:
            mgr = _manager(impl, specs, r)
            assert mgr.coordinator.retention_interval == r
            # assignable, as on vLLM's coordinator (its tests set it), never deleted
            mgr.coordinator.retention_interval = None
            assert mgr.coordinator.retention_interval is None
            with pytest.raises(AttributeError):
                del mgr.coordinator.retention_interval
        else:
            with pytest.raises(exc) as info:
                _manager(impl, specs, r)
            assert msg in str(info.value)
            # an assignment is refused with the construction's message, and changes nothing
            mgr = _manager(impl, specs, None)
            with pytest.raises(exc) as info:
                mgr.coordinator.retention_interval = r
            assert msg in str(info.value)
            assert mgr.coordinator.retention_interval is None
    # kvcy's own refusals: not an int (vLLM would fail later, or read 16.0 as an interval)
    for bad in (16.0, True, "16"):
        with pytest.raises(TypeError, match="prefix_cache_retention_interval must be an int or None"):
            _manager(impl, [_swa()], bad)
    assert _manager(impl, [_swa()]).coordinator.retention_interval is None


def test_mamba_sparse_retention_needs_align_mode(impl):
    # vLLM 0.33.0 keeps (sparse) Mamba states only in Mamba align mode: with caching, a Mamba
    # group in another mode fails vLLM's assertion when its manager is made, retention or not.
    for specs, retention in (([_full(), _mamba()], 0), ([_mamba()], 8), ([_full(), _mamba()], None)):
        with pytest.raises(AssertionError, match="Mamba prefix caching requires mamba_cache_mode='align'"):
            _manager(impl, specs, retention)
    # In align mode (with caching or without) the interval is kept (Mamba's sparse states:
    # tests/test_mamba_align.py).
    for caching in (True, False):
        assert _manager(impl, [_full(), _mamba(mode="align")], 8, caching=caching).coordinator.retention_interval == 8
    # Without caching nothing is cached, so nothing needs the sparse Mamba mask.
    assert _manager(impl, [_full(), _mamba()], 8, caching=False).coordinator.retention_interval == 8
    assert _manager(impl, [_full(), _mamba()], None, caching=False).coordinator.retention_interval is None


def test_shared_prefix_boundary_checked_before_any_change(impl):
    """Sparse retention reads the request's shared_prefix_boundary when caching: a non-int
    one is refused by allocate_slots before a block is taken."""
    kv = impl.kv_cache
    from kvcy.hashing import get_hash_fn_by_name, get_request_block_hasher, init_none_hash

    sha = get_hash_fn_by_name("sha256")
    init_none_hash(sha)
    # (Only sliding-window masks read it: dense retention, or no sliding-window group --
    # where vLLM's masks are None too -- leaves it unread, in both twins alike.)
    for specs, retention, refused in (([_full(), _swa()], 0, True), ([_full(), _swa()], None, False),
                                      ([_full()], 0, False)):
        mgr = _manager(impl, specs, retention)
        # kvcy's own Request refuses the assignment; a request object of another kind
        # (vLLM's, or this subclass) reaches the manager with whatever it holds.
        with pytest.raises(TypeError, match="shared_prefix_boundary must be an int"):
            kv.Request("r", list(range(24))).shared_prefix_boundary = "12"

        class LooseRequest(kv.Request):
            shared_prefix_boundary = property(lambda self: "12", lambda self, value: None)

        req = LooseRequest("r", list(range(24)), block_hasher=get_request_block_hasher(4, sha))
        assert req.shared_prefix_boundary == "12"
        free = mgr.block_pool.get_num_free_blocks()
        if refused:
            with pytest.raises(TypeError, match="shared_prefix_boundary must be an int"):
                mgr.allocate_slots(req, 24)
            assert mgr.block_pool.get_num_free_blocks() == free
            assert mgr.get_block_ids("r") == ([], [])
        else:
            assert mgr.allocate_slots(req, 24) is not None

    # The prompt length (for the replay boundaries) is read before any change too.
    class OddRequest(kv.Request):
        def __getattribute__(self, name):
            if name == "num_prompt_tokens" and object.__getattribute__(self, "__dict__").get("odd"):
                return "24"
            return super().__getattribute__(name)

    mgr = _manager(impl, [_full(), _swa()], 0)
    req = OddRequest("r", list(range(24)), block_hasher=get_request_block_hasher(4, sha))
    req.odd = True
    free = mgr.block_pool.get_num_free_blocks()
    with pytest.raises(TypeError, match="num_prompt_tokens must be an int"):
        mgr.allocate_slots(req, 24)
    assert mgr.block_pool.get_num_free_blocks() == free and mgr.get_block_ids("r") == ([], [])


def test_sparse_retention_leaves_unreachable_blocks_unhashed(impl):
    """One sliding-window request under retention 0: only the replay boundary's tail is
    cached (prompt 24, resend hit at 23 -> aligned 20 -> blocks 3, 4 for a 6-token window);
    freed, the unhashed blocks go to the front of the free queue."""
    kv = impl.kv_cache
    from kvcy.hashing import get_hash_fn_by_name, get_request_block_hasher, init_none_hash

    sha = get_hash_fn_by_name("sha256")
    init_none_hash(sha)
    for retention, cached in ((0, [3, 4]), (None, [0, 1, 2, 3, 4, 5])):
        mgr = _manager(impl, [_swa()], retention, num_blocks=16)
        req = kv.Request("r", list(range(24)), block_hasher=get_request_block_hasher(4, sha))
        mgr.allocate_slots(req, 24)
        blocks = mgr.get_blocks("r").blocks[0]
        ids = [b.block_id for b in blocks]
        assert [i for i, b in enumerate(blocks) if b.block_hash is not None] == cached
        mgr.free(req)
        order = [b.block_id for b in mgr.block_pool.free_block_queue.get_all_free_blocks()]
        # (freed tail first, the unhashed ones to the front in that order: they lead,
        # last table entry first; free() leaves the table itself in its order)
        assert [b.block_id for b in blocks] == ids
        unhashed = [b.block_id for b in reversed(blocks) if b.block_hash is None]
        assert order[: len(unhashed)] == unhashed


# ------------------------------------------------------------------ extra retained tokens
def test_extra_retained_tokens_move_the_window_edge(impl):
    """vLLM: skipped = max(0, n - sliding_window + 1 - extra_retained_tokens)."""
    kv = impl.kv_cache
    mgr = _manager(impl, [_full(), _swa(window=6, extra=3)])
    swa = mgr.coordinator.single_type_managers[1]
    assert isinstance(swa, kv.SlidingWindowManager) and swa.extra_retained_tokens == 3
    assert [swa.get_num_skipped_tokens(n) for n in (0, 5, 8, 9, 20)] == [0, 0, 0, 1, 12]
    plain = _manager(impl, [_full(), _swa(window=6)]).coordinator.single_type_managers[1]
    assert [plain.get_num_skipped_tokens(n) for n in (0, 5, 8, 9, 20)] == [0, 0, 3, 4, 15]
    with pytest.raises(AttributeError):
        swa.extra_retained_tokens = 0


# ------------------------------------------------------------------ sink full attention
def test_sink_full_attention_manager(impl):
    kv = impl.kv_cache
    mgr = _manager(impl, [SinkFullAttentionSpec(block_size=4, sink_len=8, **ATTN)])
    manager = mgr.coordinator.single_type_managers[0]
    assert type(manager) is kv.SinkFullAttentionManager and isinstance(manager, kv.FullAttentionManager)
    assert kv.spec_manager_map[SinkFullAttentionSpec] is kv.SinkFullAttentionManager
    # vLLM's SinkFullAttentionManager(spec, ...) with block size 4: sink_len None, 0, 2 assert; 4, 8 build.
    for sink in (None, 0, 2):
        with pytest.raises(AssertionError, match="sink_len must be a positive multiple of the block size"):
            _manager(impl, [SinkFullAttentionSpec(block_size=4, sink_len=sink, **ATTN)])
    for sink in (4, 8):
        _manager(impl, [SinkFullAttentionSpec(block_size=4, sink_len=sink, **ATTN)])


def test_sink_decides_as_full_attention(impl):
    """Same scenario, sink spec or full spec: the same hits, block ids and cache keys."""
    case = dict(R.CASES["swa4w6_dense"], groups=[("full", 4)])

    def api_with(spec_fn):
        api = R.kvcy_api(impl)
        api.full = spec_fn
        return api

    full = R.run(api_with(lambda bs: FullAttentionSpec(block_size=bs, **ATTN)), case)
    sink = R.run(api_with(lambda bs: SinkFullAttentionSpec(block_size=bs, sink_len=bs, **ATTN)), case)
    assert sink == full
    assert any(rec[0] > 0 for kind, _, rec in full["trace"] if kind == "admit")


@live
@pytest.mark.parametrize("name", list(R.CASES))
def test_live_cases(impl, vllm_api, name):
    want = R.run(vllm_api, R.CASES[name])
    assert R.summary(want) == EXPECTED[name]  # (the recording still holds)
    assert R.run(R.kvcy_api(impl), R.CASES[name]) == want


@live
@settings(max_examples=60, deadline=None, suppress_health_check=SUPPRESS)
@given(case=cases())
def test_live_random_sequences(impl, vllm_api, case):
    """Random admissions (shared prefixes, chunked prefill), decode steps and frees over
    sliding-window layouts, retention intervals and extra retained tokens: everything
    observable is vLLM's."""
    assert R.run(R.kvcy_api(impl), case) == R.run(vllm_api, case)


@live
@settings(max_examples=150, deadline=None, suppress_health_check=SUPPRESS)
@given(bs=st.sampled_from([4, 8, 16]), window=st.integers(2, 40), align_blocks=st.integers(1, 6),
       eagle=st.booleans(), retention_blocks=st.sampled_from([None, 0, 1, 2, 3, 5, 8]),
       bounds=st.lists(st.integers(-20, 200), max_size=4), final=st.one_of(st.none(), st.integers(0, 30)),
       start=st.integers(0, 20), span=st.integers(0, 20))
def test_live_masks(impl, bs, window, align_blocks, eagle, retention_blocks, bounds, final, start, span):
    import torch
    from vllm.v1.core.single_type_kv_cache_manager import SlidingWindowManager
    from vllm.v1.kv_cache_interface import SlidingWindowSpec as VSpec

    retention = None if retention_blocks is None else retention_blocks * bs
    args = (start, start + span, align_blocks * bs)
    kw = dict(retention_interval=retention, reachable_boundaries=bounds, final_segment_end_block=final)
    want = SlidingWindowManager.reachable_block_mask(
        *args, VSpec(block_size=bs, sliding_window=window, num_kv_heads=1, head_size=8, dtype=torch.float16),
        eagle, **kw)
    got = impl.kv_cache.SlidingWindowManager.reachable_block_mask(*args, _swa(bs, window), eagle, **kw)
    assert got == want


@live
def test_live_validation(vllm_api):
    """RETENTION_CONFIGS is what vLLM's manager does with each config."""
    import torch
    from vllm.v1 import kv_cache_interface as v
    from vllm.v1.core.kv_cache_manager import KVCacheManager

    attn = dict(block_size=4, num_kv_heads=1, head_size=8, dtype=torch.float16)
    for kinds, r, exc, msg in RETENTION_CONFIGS:
        specs = [v.FullAttentionSpec(**attn) if k == "full" else v.SlidingWindowSpec(**attn, sliding_window=6)
                 for k in kinds]
        cfg = v.KVCacheConfig(num_blocks=32, kv_cache_tensors=[], prefix_cache_retention_interval=r,
                              kv_cache_groups=[v.KVCacheGroupSpec([f"l{i}"], s) for i, s in enumerate(specs)])

        def make():
            return KVCacheManager(cfg, max_model_len=256, scheduler_block_size=4, hash_block_size=4,
                                  max_in_flight_tokens=64)

        if exc is None:
            assert make().coordinator.retention_interval == r
        else:
            with pytest.raises(exc) as info:
                make()
            assert msg in str(info.value)
    cfg = v.KVCacheConfig(num_blocks=8, kv_cache_tensors=[], kv_cache_groups=[])
    mgr = KVCacheManager(cfg, max_model_len=64, scheduler_block_size=4, hash_block_size=4, enable_caching=False,
                         enable_kv_cache_events=True, max_in_flight_tokens=64)
    assert mgr.reset_prefix_cache() is True and mgr.take_events() == []


@live
def test_live_sink(vllm_api):
    """vLLM 0.33.0's SinkFullAttentionManager asserts whole sink blocks, and its coordinator
    cannot build it (TypeError: no needs_kv_cache_zeroing), which kvcy does not copy."""
    import torch
    from vllm.v1 import kv_cache_interface as v
    from vllm.v1.core.block_pool import BlockPool
    from vllm.v1.core.kv_cache_manager import KVCacheManager
    from vllm.v1.core.single_type_kv_cache_manager import FullAttentionManager, SinkFullAttentionManager

    attn = dict(block_size=4, num_kv_heads=1, head_size=8, dtype=torch.float16)
    for sink, ok in ((None, False), (0, False), (2, False), (4, True), (8, True)):
        spec = v.SinkFullAttentionSpec(**attn, sink_len=sink)
        make = lambda: SinkFullAttentionManager(spec, block_pool=BlockPool(16, True, 4), enable_caching=True,  # noqa: E731
                                                kv_cache_group_id=0, scheduler_block_size=4)
        if ok:
            assert isinstance(make(), FullAttentionManager)
        else:
            with pytest.raises(AssertionError):
                make()
    # (only __init__ is its own: every decision is full attention's)
    assert {n for n in vars(SinkFullAttentionManager) if not n.startswith("_")} == set()
    cfg = v.KVCacheConfig(num_blocks=16, kv_cache_tensors=[],
                          kv_cache_groups=[v.KVCacheGroupSpec(["l0"], v.SinkFullAttentionSpec(**attn, sink_len=4))])
    with pytest.raises(TypeError, match="needs_kv_cache_zeroing"):
        KVCacheManager(cfg, max_model_len=64, scheduler_block_size=4, hash_block_size=4, max_in_flight_tokens=64)


# =================================================================================================
# Private single-type-manager internals vLLM's own tests reach: both twins expose them.
#
# ``_pending_cow_copies`` is the live queue ``take_kv_cache_block_copies`` drains (a test may
# queue a copy of its own); ``MambaManager._relocate_speculative_block`` and
# ``_cache_partial_tail_block`` are callable, with the index checked before anything moves.
# =================================================================================================

def manager_manager_private_hooks(impl, specs):
    cfg = KVCacheConfig(num_blocks=16, kv_cache_tensors=[],
                        kv_cache_groups=[KVCacheGroupSpec([f"l{i}"], s) for i, s in enumerate(specs)])
    return impl.kv_cache.KVCacheManager(cfg, max_model_len=64, scheduler_block_size=4, hash_block_size=4)


def full():
    return FullAttentionSpec(block_size=4, num_kv_heads=1, head_size=8, dtype="float16")


def mamba_manager(impl):
    spec = MambaSpec(block_size=4, shapes=((2,),), dtypes=("float32",), mamba_cache_mode="align")
    pool = impl.kv_cache.BlockPool(num_gpu_blocks=8, enable_caching=True, hash_block_size=4)
    return impl.kv_cache.MambaManager(spec, block_pool=pool, enable_caching=True, kv_cache_group_id=0,
                                      scheduler_block_size=4), pool


def test_pending_cow_copies_is_the_live_queue(impl):
    mgr = manager_manager_private_hooks(impl, [full()])
    single = mgr.coordinator.single_type_managers[0]
    src, dst = mgr.block_pool.get_new_blocks(2)
    single._pending_cow_copies.append((src, dst))
    copies, retained = mgr.take_kv_cache_block_copies()
    assert [(c.src_block_id, c.dst_block_id) for c in copies] == [(src.block_id, dst.block_id)]
    assert retained == [src, dst] and single._pending_cow_copies == []


def test_pending_cow_copies_cannot_be_rebound(impl):
    single = manager_manager_private_hooks(impl, [full()]).coordinator.single_type_managers[0]
    with pytest.raises(AttributeError):
        single._pending_cow_copies = None


def test_relocate_speculative_block(impl):
    mgr, pool = mamba_manager(impl)
    block = pool.get_new_blocks(1)[0]
    blocks = [block]
    mgr._relocate_speculative_block(blocks, 0)
    assert blocks == [pool.null_block, block] and block.ref_cnt == 1
    shared = pool.get_new_blocks(1)[0]
    pool.touch([shared])  # (a second holder: not writable in place)
    with pytest.raises(AssertionError):
        mgr._relocate_speculative_block([shared], 0)


@pytest.mark.parametrize("idx", [1, 5, -2])
def test_relocate_out_of_range_is_an_index_error_and_moves_nothing(impl, idx):
    mgr, pool = mamba_manager(impl)
    block = pool.get_new_blocks(1)[0]
    blocks = [block]
    with pytest.raises(IndexError):
        mgr._relocate_speculative_block(blocks, idx)
    assert blocks == [block]


def test_cache_partial_tail_block_caches_nothing_off_the_prompt_boundary(impl):
    mgr, pool = mamba_manager(impl)
    req = impl.kv_cache.Request("r", list(range(10)))
    for num_tokens in (3, 4, 0, -4):  # (off a hash boundary, short of the prompt's, none)
        assert mgr._cache_partial_tail_block(req, num_tokens, None) is None
    assert len(pool.cached_block_hash_to_block) == 0
