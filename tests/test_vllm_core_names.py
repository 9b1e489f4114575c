"""Names vLLM 0.33.0's own tests reach for on the KV-cache layer, in both twins:
``HybridKVCacheCoordinator.find_longest_cache_hit_per_group``,
``kv_cache_utils.resolve_cache_hit_alignment_tokens``, the ``max_in_flight_tokens`` keyword of
``max_admission_blocks_per_request``, and the read-only views ``MambaManager._checkpoints`` /
``_allocated_block_reqs``."""

from __future__ import annotations

from types import MappingProxyType, SimpleNamespace

import pytest

from kvcy.hashing import get_hash_fn_by_name, get_request_block_hasher, init_none_hash
from kvcy.kv_cache_interface import (
    ChunkedLocalAttentionSpec,
    FullAttentionSpec,
    KVCacheConfig,
    KVCacheGroupSpec,
    MambaSpec,
    SlidingWindowSpec,
)
from kvcy.kv_cache_utils import resolve_cache_hit_alignment_tokens

BS = 4
ATTN = {"num_kv_heads": 1, "head_size": 8, "dtype": "float16"}


def _hasher(bs=BS):
    hash_fn = get_hash_fn_by_name("sha256")
    init_none_hash(hash_fn)
    return get_request_block_hasher(bs, hash_fn)


def _hybrid(num_blocks=64, window=8):
    return KVCacheConfig(num_blocks=num_blocks, kv_cache_tensors=[], kv_cache_groups=[
        KVCacheGroupSpec(["f"], FullAttentionSpec(block_size=BS, **ATTN)),
        KVCacheGroupSpec(["s"], SlidingWindowSpec(block_size=BS, sliding_window=window, **ATTN))])


def _run(impl, evict_full_tail: bool):
    mgr = impl.kv_cache.KVCacheManager(_hybrid(), max_model_len=256, scheduler_block_size=BS, hash_block_size=BS)
    tokens = list(range(8 * BS + 1))
    first = impl.kv_cache.Request("a", tokens, block_hasher=_hasher())
    mgr.allocate_slots(first, len(tokens))
    first.num_computed_tokens = len(tokens)
    mgr.free(first)
    probe = impl.kv_cache.Request("b", tokens, block_hasher=_hasher())
    coordinator = mgr.coordinator
    if evict_full_tail:
        # one full-attention block of the prompt is no longer cached: the shared hit stops
        # before it, the window group's own hit does not
        pool = mgr.block_pool
        block = mgr.coordinator.find_longest_cache_hit(probe.block_hashes, len(tokens) - 1)[0][0][5]
        pool.evict_blocks({block.block_id})
    return coordinator, probe, len(tokens) - 1


@pytest.mark.parametrize("evict", [False, True])
def test_find_longest_cache_hit_per_group(impl, evict):
    coordinator, probe, max_len = _run(impl, evict)
    blocks, lengths = coordinator.find_longest_cache_hit_per_group(probe.block_hashes, max_len)
    shared_blocks, shared_len, _ = coordinator.find_longest_cache_hit(probe.block_hashes, max_len)
    assert isinstance(blocks, tuple) and isinstance(lengths, tuple) and len(blocks) == len(lengths) == 2
    # each group's own hit is at least the shared one, and is block-aligned
    assert all(n >= shared_len and n % BS == 0 for n in lengths)
    assert [len(b) for b in blocks] == [n // BS for n in lengths]
    if evict:
        assert lengths[0] == shared_len == 5 * BS
        assert lengths[1] == 8 * BS
    else:
        assert lengths == (8 * BS, 8 * BS) and shared_len == 8 * BS
        assert [b.block_id for b in blocks[0]] == [b.block_id for b in shared_blocks[0]]


def test_find_longest_cache_hit_per_group_is_the_same_in_both_twins():
    from kvcy import _fast

    if "cython" not in _fast.available() or _fast.NO_EXTENSIONS:
        pytest.skip("compiled twin not in use")
    got = []
    for name in ("cython", "python"):
        impl = SimpleNamespace(name=name, **_fast.load(name))
        for evict in (False, True):
            coordinator, probe, max_len = _run(impl, evict)
            blocks, lengths = coordinator.find_longest_cache_hit_per_group(probe.block_hashes, max_len)
            got.append((evict, lengths, [[b.block_id for b in g] for g in blocks]))
    assert got[:2] == got[2:]


def _vllm_config(prefix_caching=True, dcp=1):
    return SimpleNamespace(cache_config=SimpleNamespace(enable_prefix_caching=prefix_caching),
                           parallel_config=SimpleNamespace(decode_context_parallel_size=dcp))


def test_resolve_cache_hit_alignment_tokens():
    full = KVCacheGroupSpec(["f"], FullAttentionSpec(block_size=16, **ATTN))
    mamba = KVCacheGroupSpec(["m"], MambaSpec(block_size=16, shapes=((4,),), dtypes=("float32",),
                                              mamba_cache_mode="align"))
    one = KVCacheConfig(num_blocks=8, kv_cache_tensors=[], kv_cache_groups=[full])
    hybrid = KVCacheConfig(num_blocks=8, kv_cache_tensors=[], kv_cache_groups=[full, mamba])
    # one group, or no prefix caching: the scheduler block
    assert resolve_cache_hit_alignment_tokens(one, _vllm_config(), 16, 4) == 16
    assert resolve_cache_hit_alignment_tokens(hybrid, _vllm_config(prefix_caching=False), 16, 4) == 16
    # full attention (fine-grained lookups) beside align-mode Mamba coarser than the hash block
    assert resolve_cache_hit_alignment_tokens(hybrid, _vllm_config(), 16, 4) == 4
    # no Mamba block coarser than the hash block: no partial hits
    assert resolve_cache_hit_alignment_tokens(hybrid, _vllm_config(), 16, 16) == 16


def test_max_admission_blocks_per_request_takes_vllms_keyword():
    swa = SlidingWindowSpec(block_size=4, sliding_window=8, **ATTN)
    local = ChunkedLocalAttentionSpec(block_size=4, attention_chunk_size=16, **ATTN)
    assert swa.max_admission_blocks_per_request(max_in_flight_tokens=12, max_model_len=256) == \
        swa.max_admission_blocks_per_request(12, 256) == 6  # cdiv(7 + 12, 4) + 1
    assert local.max_admission_blocks_per_request(max_in_flight_tokens=12, max_model_len=20) == 5


def test_mamba_internals_are_read_only_views(impl):
    cfg = KVCacheConfig(num_blocks=32, kv_cache_tensors=[], kv_cache_groups=[
        KVCacheGroupSpec(["a"], FullAttentionSpec(block_size=16, **ATTN)),
        KVCacheGroupSpec(["m"], MambaSpec(block_size=16, shapes=((4,),), dtypes=("float32",),
                                          mamba_cache_mode="align"))])
    mgr = impl.kv_cache.KVCacheManager(cfg, 256, 16, 4)
    mamba = mgr.coordinator.single_type_managers[1]
    req = impl.kv_cache.Request("r", list(range(40)), block_hasher=_hasher(4))
    mgr.allocate_slots(req, 40)
    assert isinstance(mamba._checkpoints, MappingProxyType)
    assert "r" in mamba._allocated_block_reqs and isinstance(mamba._allocated_block_reqs, frozenset)
    with pytest.raises(TypeError):
        mamba._checkpoints["x"] = (0, 0)  # type: ignore[index]
    for name in ("_checkpoints", "_allocated_block_reqs"):
        with pytest.raises(AttributeError):
            setattr(mamba, name, {})
    mgr.free(req)
    assert "r" not in mamba._allocated_block_reqs and "r" not in mamba._checkpoints


def test_a_bool_lookahead_counts_as_zero_or_one_as_in_vllm(impl):
    """vLLM's own tests pass ``num_hash_lookahead_tokens=True`` (one token); a bool is an int."""
    cfg = _hybrid()
    for flag in (False, True):
        mgr = impl.kv_cache.KVCacheManager(cfg, max_model_len=256, scheduler_block_size=BS, hash_block_size=BS,
                                           num_hash_lookahead_tokens=flag)
        same = impl.kv_cache.KVCacheManager(cfg, max_model_len=256, scheduler_block_size=BS, hash_block_size=BS,
                                            num_hash_lookahead_tokens=int(flag))
        assert mgr.block_pool.num_hash_lookahead_tokens == int(flag)
        assert type(mgr.block_pool.num_hash_lookahead_tokens) is int
        hash_fn = get_hash_fn_by_name("sha256")
        init_none_hash(hash_fn)
        tokens = list(range(3 * BS + 1))
        a = impl.kv_cache.Request("a", tokens, block_hasher=get_request_block_hasher(BS, hash_fn, flag))
        b = impl.kv_cache.Request("b", tokens, block_hasher=get_request_block_hasher(BS, hash_fn, int(flag)))
        assert list(a.block_hashes) == list(b.block_hashes)
        mgr.allocate_slots(a, len(tokens))
        same.allocate_slots(b, len(tokens))
        assert mgr.usage == same.usage
    with pytest.raises(ValueError):
        impl.kv_cache.KVCacheManager(cfg, max_model_len=256, scheduler_block_size=BS, hash_block_size=BS,
                                     num_hash_lookahead_tokens=-1)
