"""HiSparse in kvcy without vLLM: its specs and configs are built, validated and
sized as vLLM 0.33.0 sizes them, and both twins' managers refuse a config with
HiSparse groups (they have no host pool) before anything is allocated.

The same figures against live vLLM: tests/vllm_live/test_hisparse_vllm.py.
"""

from __future__ import annotations

import dataclasses
import pickle
from types import SimpleNamespace

import pytest

from kvcy.hisparse_layout import ACTIVE_TAIL_PAGES, get_hisparse_steady_state_concurrency
from kvcy.kv_cache_interface import (
    FullAttentionSpec,
    HiSparseHotSpec,
    HiSparseResidentSpec,
    KVCacheConfig,
    KVCacheGroupRole,
    KVCacheGroupSpec,
    KVCacheTensor,
)
from kvcy.kv_cache_utils import generate_scheduler_kv_cache_config, get_max_concurrency_for_kv_cache_config

BS = 16


def attn() -> FullAttentionSpec:
    return FullAttentionSpec(block_size=BS, num_kv_heads=1, head_size=64, dtype="float16")


def settings(max_model_len: int = 10 * BS, in_flight: int = 10 * BS) -> SimpleNamespace:
    return SimpleNamespace(
        model_config=SimpleNamespace(max_model_len=max_model_len),
        parallel_config=SimpleNamespace(decode_context_parallel_size=1),
        max_in_flight_tokens=in_flight,
    )


def hisparse_config(num_blocks: int = 64, host_blocks: int | None = 100, hot: int = 4) -> KVCacheConfig:
    page = attn().page_size_bytes
    return KVCacheConfig(
        num_blocks=num_blocks,
        kv_cache_tensors=[],
        kv_cache_groups=[
            KVCacheGroupSpec(["source"], attn(), host_resident=True, role=KVCacheGroupRole.HISPARSE_SOURCE),
            KVCacheGroupSpec(["indexer"], attn(), role="hisparse_indexer"),
            KVCacheGroupSpec(["resident"], HiSparseResidentSpec(block_size=BS, page_size=page),
                             enable_kv_transfer=False),
            KVCacheGroupSpec(["hot"], HiSparseHotSpec(block_size=BS, page_size=page, blocks_per_request=hot),
                             enable_kv_transfer=False),
        ],
        hisparse_host_num_blocks=host_blocks,
    )


# --------------------------------------------------------------------------- specs
def test_hot_spec_holds_a_fixed_buffer_per_request():
    spec = HiSparseHotSpec(block_size=BS, page_size=4096, blocks_per_request=3)
    assert spec.page_size_bytes == 4096
    assert spec.max_memory_usage_bytes(settings(max_model_len=1 << 20)) == 3 * 4096
    assert spec.max_num_blocks_per_req(settings(), 1 << 20) == 3
    assert spec.block_table_token_alignment is None
    assert not (spec.prefix_cacheable or spec.has_layer_views or spec.uses_slot_mapping)


@pytest.mark.parametrize("max_model_len,in_flight,blocks", [(160, 160, 10), (160, 48, 3), (40, 160, 3), (17, 17, 2)])
def test_resident_spec_pins_its_in_flight_window(max_model_len, in_flight, blocks):
    spec = HiSparseResidentSpec(block_size=BS, page_size=512)
    assert spec.max_admission_blocks_per_request(in_flight, max_model_len) == blocks
    assert spec.max_memory_usage_bytes(settings(max_model_len, in_flight)) == blocks * 512
    assert not (spec.prefix_cacheable or spec.has_layer_views)
    assert spec.uses_slot_mapping  # (only the hot buffer has no slot mapping)


def test_resident_spec_reads_kvcy_settings_too():
    from kvcy.config import CacheConfig, KVCacheSettings

    kvcy_settings = KVCacheSettings(cache_config=CacheConfig(block_size=BS), max_model_len=1000,
                                    max_num_batched_tokens=64)
    assert HiSparseResidentSpec(block_size=BS, page_size=8).max_memory_usage_bytes(kvcy_settings) == 4 * 8


@pytest.mark.parametrize("cls,kwargs", [
    (HiSparseHotSpec, {"page_size": 0, "blocks_per_request": 1}),
    (HiSparseHotSpec, {"page_size": 64, "blocks_per_request": 0}),
    (HiSparseResidentSpec, {"page_size": -1}),
    (HiSparseResidentSpec, {"page_size": 64, "block_size": 0}),
])
def test_spec_sizes_must_be_positive(cls, kwargs):
    with pytest.raises(ValueError, match=f"{cls.__name__}\\.(page_size|blocks_per_request|block_size) must be positive"):
        cls(**{"block_size": BS, **kwargs})


@pytest.mark.parametrize("bad", [64.0, "64", True, None])
def test_spec_sizes_must_be_ints(bad):
    with pytest.raises(TypeError, match="HiSparseHotSpec.page_size must be an int"):
        HiSparseHotSpec(block_size=BS, page_size=bad, blocks_per_request=1)
    with pytest.raises(TypeError, match="HiSparseResidentSpec.page_size must be an int"):
        HiSparseResidentSpec(block_size=BS, page_size=bad)


def test_specs_are_frozen_hashable_values():
    hot = HiSparseHotSpec(block_size=BS, page_size=64, blocks_per_request=2)
    assert hot == HiSparseHotSpec(block_size=BS, page_size=64, blocks_per_request=2)
    assert hot != HiSparseHotSpec(block_size=BS, page_size=64, blocks_per_request=3)
    assert len({hot, HiSparseHotSpec(block_size=BS, page_size=64, blocks_per_request=2)}) == 1
    assert pickle.loads(pickle.dumps(hot)) == hot
    with pytest.raises(dataclasses.FrozenInstanceError):
        hot.page_size = 0  # type: ignore[misc]
    resident = HiSparseResidentSpec(block_size=BS, page_size=64)
    assert resident.copy_with_new_block_size(32) == HiSparseResidentSpec(block_size=32, page_size=64)


# --------------------------------------------------------------------------- configs
def test_config_keeps_host_groups_and_pool_fields():
    cfg = hisparse_config()
    assert cfg.host_group_ids == (0,)
    assert [g.role.value for g in cfg.kv_cache_groups[:2]] == ["hisparse_source", "hisparse_indexer"]
    assert cfg.transfer_group_ids == (0, 1)
    host = KVCacheTensor(size=100, layers=["source"], layer_stride=100, block_stride=1, host_resident=True)
    device = KVCacheTensor(size=100, layers=["indexer"], layer_stride=100, block_stride=1)
    assert (cfg.num_blocks_of(host), cfg.num_blocks_of(device)) == (100, 64)
    assert cfg.has_mixed_precision_kv_cache is False


@pytest.mark.parametrize("field,value,exc", [
    ("hisparse_host_num_blocks", -1, ValueError),
    ("hisparse_host_num_blocks", 2.0, TypeError),
    ("hisparse_host_block_stride", 0, ValueError),
    ("hisparse_host_block_stride", "64", TypeError),
    ("hisparse_shared_host_pool", 1, TypeError),
])
def test_config_pool_fields_are_validated(field, value, exc):
    with pytest.raises(exc, match=f"KVCacheConfig.{field}"):
        KVCacheConfig(8, [], [KVCacheGroupSpec(["f"], attn())], **{field: value})


def test_group_host_resident_must_be_a_bool():
    with pytest.raises(TypeError, match="KVCacheGroupSpec.host_resident must be a bool"):
        KVCacheGroupSpec(["f"], attn(), host_resident=1)


# --------------------------------------------------------------------------- sizing
def test_concurrency_is_bounded_by_the_tighter_pool():
    # device: indexer 10 + resident 10 + hot 4 = 24 blocks a request; host: source 10
    assert get_max_concurrency_for_kv_cache_config(settings(), hisparse_config()) == pytest.approx(64 / 24)
    assert get_max_concurrency_for_kv_cache_config(settings(), hisparse_config(host_blocks=20)) == 2.0
    with pytest.raises(AssertionError, match="hisparse_host_num_blocks"):
        get_max_concurrency_for_kv_cache_config(settings(), hisparse_config(host_blocks=None))


def test_steady_state_concurrency_charges_only_the_active_tail():
    assert ACTIVE_TAIL_PAGES == 2
    # admission 24 blocks, steady state 10 + 2 + 4 = 16: 1 + (64 - 24) / 16
    assert get_hisparse_steady_state_concurrency(settings(), hisparse_config()) == 3.5
    # fewer blocks than one admission: the fraction of one
    assert get_hisparse_steady_state_concurrency(settings(), hisparse_config(num_blocks=12)) == 0.5
    # the host pool binds first
    assert get_hisparse_steady_state_concurrency(settings(), hisparse_config(host_blocks=25)) == 2.5
    with pytest.raises(ValueError, match="no host-resident"):
        get_hisparse_steady_state_concurrency(settings(), KVCacheConfig(
            8, [], [KVCacheGroupSpec(["f"], attn())], hisparse_host_num_blocks=4))


def test_scheduler_config_needs_one_host_pool_size():
    a, b = hisparse_config(), hisparse_config(host_blocks=99)
    assert generate_scheduler_kv_cache_config([a, hisparse_config()]).hisparse_host_num_blocks == 100
    with pytest.raises(ValueError, match="hisparse_host_num_blocks"):
        generate_scheduler_kv_cache_config([a, b])


# --------------------------------------------------------------------------- the managers refuse
REFUSED = [
    (KVCacheGroupSpec(["h"], attn(), host_resident=True), "group 1 is host-resident"),
    (KVCacheGroupSpec(["h"], attn(), role="hisparse_source"), "group 1 has role 'hisparse_source'"),
    (KVCacheGroupSpec(["h"], attn(), role=KVCacheGroupRole.HISPARSE_INDEXER), "group 1 has role 'hisparse_indexer'"),
    (KVCacheGroupSpec(["h"], HiSparseResidentSpec(block_size=BS, page_size=64)), "group 1 has a HiSparseResidentSpec"),
    (KVCacheGroupSpec(["h"], HiSparseHotSpec(block_size=BS, page_size=64, blocks_per_request=2)),
     "group 1 has a HiSparseHotSpec"),
]


@pytest.mark.parametrize("group,message", REFUSED)
@pytest.mark.parametrize("caching", [True, False])
def test_managers_refuse_hisparse_groups(impl, group, message, caching):
    cfg = KVCacheConfig(num_blocks=16, kv_cache_tensors=[], hisparse_host_num_blocks=8,
                        kv_cache_groups=[KVCacheGroupSpec(["f"], attn()), group])
    with pytest.raises(NotImplementedError, match=f"KV-cache group {message[6:]}.*HiSparse"):
        impl.kv_cache.KVCacheManager(cfg, max_model_len=160, scheduler_block_size=BS, hash_block_size=BS,
                                     enable_caching=caching)
    with pytest.raises(NotImplementedError, match=message):
        impl.kv_cache.get_kv_cache_coordinator(cfg, 160, 160, False, caching, False, 1, 1, BS, BS)


@pytest.mark.parametrize("spec", [HiSparseResidentSpec(block_size=BS, page_size=64),
                                  HiSparseHotSpec(block_size=BS, page_size=64, blocks_per_request=2)])
def test_manager_factory_refuses_hisparse_specs(impl, spec):
    pool = impl.kv_cache.BlockPool(8, True, BS)
    free_before = pool.get_num_free_blocks()
    with pytest.raises(NotImplementedError, match=f"{type(spec).__name__} \\(HiSparse\\)"):
        impl.kv_cache.get_manager_for_kv_cache_spec(spec, 64, 64, block_pool=pool, enable_caching=True,
                                                    kv_cache_group_id=0, scheduler_block_size=BS)
    assert pool.get_num_free_blocks() == free_before


def test_twins_refuse_with_one_message(impl):
    cfg = hisparse_config()
    with pytest.raises(NotImplementedError) as refused:
        impl.kv_cache.KVCacheManager(cfg, max_model_len=160, scheduler_block_size=BS, hash_block_size=BS)
    assert str(refused.value) == "KV-cache group 0 is host-resident: HiSparse is not implemented in kvcy's managers"
