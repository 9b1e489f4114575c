"""Small vLLM 0.33.0 behaviours a drop-in must share (issue 14), run against both twins.

Each test names the section of docs/vllm-dropin-gaps.md it closes.
"""

from __future__ import annotations

import pytest

from kvcy.hashing import get_hash_fn_by_name, get_request_block_hasher, init_none_hash
from kvcy.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec, SlidingWindowSpec

BS = 4


@pytest.fixture(autouse=True)
def _none_hash():
    init_none_hash(get_hash_fn_by_name("sha256"))


def hasher():
    return get_request_block_hasher(BS, get_hash_fn_by_name("sha256"))


def manager(impl, groups=1, num_blocks=16, max_model_len=256, **kw):
    """A manager over ``groups`` groups: full attention, then sliding windows."""
    specs = [FullAttentionSpec(block_size=BS, num_kv_heads=1, head_size=8, dtype="float16")] + [
        SlidingWindowSpec(block_size=BS, num_kv_heads=1, head_size=8, dtype="float16", sliding_window=8)
        for _ in range(groups - 1)
    ]
    cfg = KVCacheConfig(num_blocks=num_blocks, kv_cache_tensors=[],
                        kv_cache_groups=[KVCacheGroupSpec([f"l{i}"], s) for i, s in enumerate(specs)])
    return impl.kv_cache.KVCacheManager(cfg, max_model_len=max_model_len, scheduler_block_size=BS,
                                        hash_block_size=BS, **kw)


# ------------------------------------------------- §5 coordinator.get_blocks
@pytest.mark.parametrize("groups", [1, 2])
@pytest.mark.parametrize("enable_caching", [True, False])
def test_coordinator_get_blocks_of_an_unknown_request_is_empty(impl, groups, enable_caching):
    """vLLM's coordinator answers an empty list per group for an id it does not know."""
    mgr = manager(impl, groups, enable_caching=enable_caching)
    assert mgr.coordinator.get_blocks("nobody") == tuple([] for _ in range(groups))
    req = impl.kv_cache.Request("a", list(range(8)), block_hasher=hasher())
    assert mgr.allocate_slots(req, 8) is not None
    held = mgr.coordinator.get_blocks("a")
    assert len(held) == groups and all(len(g) == 2 for g in held)
    mgr.free(req)
    assert mgr.coordinator.get_blocks("a") == tuple([] for _ in range(groups))


# ------------------------------------------------- §5 new_step_starts
@pytest.mark.parametrize("groups", [1, 2])
@pytest.mark.parametrize("enable_caching", [True, False])
def test_new_step_starts_reaches_every_single_type_manager(impl, groups, enable_caching, monkeypatch):
    """The manager tells the coordinator, which tells each single-type manager, as vLLM does."""
    mgr = manager(impl, groups, enable_caching=enable_caching)
    coordinator = mgr.coordinator
    assert coordinator.new_step_starts() is None
    for single in coordinator.single_type_managers:
        assert single.new_step_starts() is None
    assert mgr.new_step_starts() is None
    if impl.name != "python":
        return  # compiled classes cannot be patched; the calls above show the methods exist
    seen = []
    for cls in {type(m) for m in coordinator.single_type_managers}:
        monkeypatch.setattr(cls, "new_step_starts", lambda self: seen.append(self))
    coordinator_calls = []
    original = type(coordinator).new_step_starts

    def spy(self):
        coordinator_calls.append(self)
        return original(self)

    monkeypatch.setattr(type(coordinator), "new_step_starts", spy)
    mgr.new_step_starts()
    assert coordinator_calls == [coordinator]
    assert seen == list(coordinator.single_type_managers)


# ------------------------------------------------- §3 hits for a request that holds blocks
@pytest.mark.parametrize("groups", [1, 2])
def test_hits_for_a_request_that_holds_blocks_assert(impl, groups):
    """vLLM's coordinator asserts that a tracked request brings no new hits; kvcy asserts first."""
    mgr = manager(impl, groups)
    a = impl.kv_cache.Request("a", list(range(12)), block_hasher=hasher())
    assert mgr.allocate_slots(a, 12) is not None
    b = impl.kv_cache.Request("b", list(range(12)), block_hasher=hasher())
    blocks, n, _ = mgr.get_computed_blocks(b)
    assert n > 0
    assert mgr.allocate_slots(b, 4, num_new_computed_tokens=n, new_computed_blocks=blocks) is not None
    held = mgr.get_block_ids("b")
    free_before = sorted(x.block_id for x in mgr.block_pool.free_block_queue.get_all_free_blocks())
    with pytest.raises(AssertionError, match="already holds blocks"):
        mgr.allocate_slots(b, 4, num_new_computed_tokens=n, new_computed_blocks=blocks)
    with pytest.raises(AssertionError, match="already holds blocks"):
        mgr.coordinator.allocate_new_computed_blocks("b", blocks.blocks, n, 0)
    assert mgr.get_block_ids("b") == held
    assert sorted(x.block_id for x in mgr.block_pool.free_block_queue.get_all_free_blocks()) == free_before
    # Empty hits for a running request are fine (vLLM's coordinator returns at once).
    mgr.coordinator.allocate_new_computed_blocks("b", tuple([] for _ in range(groups)), n, 0)
    assert mgr.get_block_ids("b") == held


# ------------------------------------------------- §1 no KV-cache groups
def test_no_groups_with_caching_asserts_as_vllm(impl):
    """vLLM keeps caching on with no groups, so its hybrid coordinator asserts; kvcy too."""
    cfg = KVCacheConfig(num_blocks=8, kv_cache_tensors=[], kv_cache_groups=[])
    with pytest.raises(AssertionError, match="HybridKVCacheCoordinator requires at least one cacheable group."):
        impl.kv_cache.KVCacheManager(cfg, max_model_len=64, scheduler_block_size=BS, hash_block_size=BS)
    mgr = impl.kv_cache.KVCacheManager(cfg, max_model_len=64, scheduler_block_size=BS, hash_block_size=BS,
                                       enable_caching=False)
    assert mgr.enable_caching is False
    assert type(mgr.coordinator) is impl.kv_cache.KVCacheCoordinatorNoPrefixCache
    assert mgr.num_kv_cache_groups == 0
    assert mgr.get_blocks("x").blocks == ()
    assert mgr.new_step_starts() is None


# ------------------------------------------------- §7 Request.__repr__
def test_request_repr_takes_any_status(impl):
    """A status stored as a plain int (or anything else) must not break repr."""
    from kvcy._request_types import RequestStatus

    req = impl.kv_cache.Request("a", [1, 2, 3], block_hasher=hasher())
    assert repr(req) == "Request(id='a', tokens=3, computed=0, status=WAITING)"
    req.status = RequestStatus.RUNNING
    assert repr(req).endswith("status=RUNNING)")
    req.status = int(RequestStatus.RUNNING)
    assert type(req.status) is int
    assert repr(req).endswith(f"status={int(RequestStatus.RUNNING)})")
    req.status = "odd"
    assert repr(req).endswith("status='odd')")


# ------------------------------------------------- §7 NONE_HASH seed for vLLM's own functions
def test_none_hash_seed_is_random_for_vllms_own_xxhash_functions(monkeypatch):
    """vLLM randomises the seed of its own xxhash and xxhash_cbor (by identity): so does kvcy.

    A stand-in for ``vllm.utils.hashing`` (vLLM itself takes seconds to import);
    test_none_hash_seed_with_vllm checks the real module where it is installed.
    """
    import sys
    import types

    from kvcy import hashing

    monkeypatch.delenv("PYTHONHASHSEED", raising=False)

    def xxhash(obj):  # another function object than kvcy's
        return hashing.xxhash(obj)

    def xxhash_cbor(obj):
        return hashing.xxhash_cbor(obj)

    def sha256(obj):
        return hashing.sha256(obj)

    fake = types.ModuleType("vllm.utils.hashing")
    fake.xxhash, fake.xxhash_cbor, fake.sha256 = xxhash, xxhash_cbor, sha256
    for fn in (xxhash, xxhash_cbor, sha256):
        assert hashing.resolve_none_hash_seed(fn) == "vllm-none-hash"  # vLLM not loaded: unknown functions
    monkeypatch.setitem(sys.modules, "vllm.utils.hashing", fake)
    for fn in (xxhash, xxhash_cbor):
        a, b = hashing.resolve_none_hash_seed(fn), hashing.resolve_none_hash_seed(fn)
        assert a != b and len(a) == 64
    assert hashing.resolve_none_hash_seed(sha256) == "vllm-none-hash"
    assert hashing.resolve_none_hash_seed(lambda obj: b"x") == "vllm-none-hash"
    hashing.init_none_hash(xxhash)
    seed = hashing.get_none_hash_seed()
    assert seed != "vllm-none-hash" and hashing.NONE_HASH == xxhash(seed)
    # kvcy's extra non-collision-resistant functions keep their random seed.
    for name in ("xxhash", "xxhash_cbor", "xxh3_raw", "builtin", "sha256_cbor_64bit"):
        fn = hashing.get_hash_fn_by_name(name)
        assert hashing.resolve_none_hash_seed(fn) != hashing.resolve_none_hash_seed(fn)
    monkeypatch.setenv("PYTHONHASHSEED", "9")
    assert hashing.resolve_none_hash_seed(xxhash) == "9"
    hashing.init_none_hash(hashing.sha256)


def test_none_hash_seed_with_vllm(monkeypatch):
    """The real vLLM 0.33.0 functions, where vLLM is installed."""
    vllm_hashing = pytest.importorskip("vllm.utils.hashing")
    from kvcy import hashing

    monkeypatch.delenv("PYTHONHASHSEED", raising=False)
    for fn in (vllm_hashing.xxhash, vllm_hashing.xxhash_cbor):
        assert hashing.resolve_none_hash_seed(fn) != hashing.resolve_none_hash_seed(fn)
    for fn in (vllm_hashing.sha256, vllm_hashing.sha256_cbor):
        assert hashing.resolve_none_hash_seed(fn) == "vllm-none-hash"


# ------------------------------------------------- §3 take_events
def test_take_events_annotates_and_warns_for_blockstored_subclasses(impl, caplog):
    """vLLM tests events with isinstance: a BlockStored subclass is annotated, or warned about."""
    import logging

    from kvcy.kv_events import BlockStored

    class MyStored(BlockStored):
        pass

    mgr = manager(impl, 2, enable_kv_cache_events=True)

    def stored(group_idx):
        return MyStored(block_hashes=[1], parent_block_hash=None, token_ids=[1, 2, 3, 4], block_size=BS,
                        lora_id=None, medium="GPU", lora_name=None, group_idx=group_idx)

    known, unknown = stored(1), stored(5)
    mgr.block_pool.kv_event_queue.extend([known, unknown])
    with caplog.at_level(logging.WARNING, logger="kvcy"):
        assert mgr.take_events() == [known, unknown]
    assert (known.kv_cache_spec_kind, known.kv_cache_spec_sliding_window) == mgr.kv_cache_event_metadata[1]
    assert known.kv_cache_spec_kind is not None
    assert unknown.kv_cache_spec_kind is None
    assert "Group index `5` not in KV cache metadata" in caplog.text
