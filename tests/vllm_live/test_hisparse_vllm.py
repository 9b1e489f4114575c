"""HiSparse's specs and sizing against live vLLM 0.33.0, over random configs.

vLLM's HiSparse specs and configs convert to kvcy's field for field, and every
figure the sizing layer reads from them (page sizes, per-request memory and
block counts, the worst-case and the steady-state concurrency) is vLLM's.
kvcy's managers do not run HiSparse's host pool: where vLLM's scheduler would
build a HiSparse manager, kvcy's factory refuses, naming the group (pinned
below, so that the gap cannot widen or close unnoticed).

Skipped without vLLM (tests/vllm_live/conftest.py); the vLLM-free half is tests/test_hisparse.py.
"""

from __future__ import annotations

import random
from types import SimpleNamespace

import pytest


torch = pytest.importorskip("torch")

from vllm.v1 import kv_cache_interface as V  # noqa: E402
from vllm.v1.core import kv_cache_utils as VU  # noqa: E402
from vllm.v1.hisparse import layout as VL  # noqa: E402

import kvcy.vllm  # noqa: E402
from kvcy import hisparse_layout as KL  # noqa: E402
from kvcy import kv_cache_utils as KU  # noqa: E402

DTYPES = (torch.float16, torch.bfloat16, torch.float32)
CASES = 150


def vllm_settings(rng: random.Random, block_size: int) -> SimpleNamespace:
    """The parts of a VllmConfig that HiSparse's sizing reads."""
    in_flight = rng.choice((block_size - 1, block_size, 3 * block_size + 1, 2048, 8192))
    return SimpleNamespace(
        model_config=SimpleNamespace(max_model_len=rng.randint(1, 64) * block_size + rng.randint(0, block_size)),
        parallel_config=SimpleNamespace(decode_context_parallel_size=1),
        scheduler_config=SimpleNamespace(max_num_batched_tokens=in_flight),
        max_in_flight_tokens=in_flight,
    )


def random_config(rng: random.Random) -> tuple[object, SimpleNamespace]:
    """A vLLM HiSparse KVCacheConfig (host source, indexer, resident and hot groups, maybe a
    regular group) and the settings to size it with."""
    block_size = rng.choice((16, 32, 64))
    attn = V.FullAttentionSpec(block_size=block_size, num_kv_heads=rng.randint(1, 4),
                               head_size=rng.choice((64, 128, 576)), dtype=rng.choice(DTYPES))
    groups = [
        V.KVCacheGroupSpec(["source"], attn, host_resident=True, role=V.KVCacheGroupRole.HISPARSE_SOURCE),
        V.KVCacheGroupSpec(["indexer"], attn, role=V.KVCacheGroupRole.HISPARSE_INDEXER),
    ]
    for i in range(rng.randint(1, 3)):
        page = rng.choice((attn.page_size_bytes, 512, 4096 + 64 * i))
        groups.append(V.KVCacheGroupSpec([f"resident{i}"], V.HiSparseResidentSpec(block_size=block_size, page_size=page),
                                         enable_kv_transfer=False))
        groups.append(V.KVCacheGroupSpec(
            [f"hot{i}"], V.HiSparseHotSpec(block_size=block_size, page_size=page, blocks_per_request=rng.randint(1, 9)),
            enable_kv_transfer=False))
    if rng.random() < 0.3:
        groups.append(V.KVCacheGroupSpec(["regular"], attn))
    config = V.KVCacheConfig(num_blocks=rng.randint(1, 4000), kv_cache_tensors=[], kv_cache_groups=groups,
                             hisparse_host_num_blocks=rng.randint(1, 5000),
                             hisparse_host_block_stride=attn.page_size_bytes,
                             hisparse_shared_host_pool=rng.random() < 0.5)
    return config, vllm_settings(rng, block_size)


SPEC_FIGURES = ("page_size_bytes", "prefix_cacheable", "has_layer_views", "uses_slot_mapping",
                "block_table_token_alignment", "block_size")


@pytest.mark.parametrize("seed", range(3))
def test_specs_convert_and_size_as_vllms(seed):
    rng = random.Random(seed)
    for _ in range(CASES):
        block_size = rng.choice((1, 16, 64, 256))
        page = rng.randint(1, 1 << 20)
        settings = vllm_settings(rng, block_size)
        for spec in (V.HiSparseHotSpec(block_size=block_size, page_size=page, blocks_per_request=rng.randint(1, 64)),
                     V.HiSparseResidentSpec(block_size=block_size, page_size=page)):
            ours = kvcy.vllm.convert_kv_cache_spec(spec)
            assert type(ours).__name__ == type(spec).__name__
            for name in SPEC_FIGURES:
                assert getattr(ours, name) == getattr(spec, name), name
            assert ours.max_memory_usage_bytes(settings) == spec.max_memory_usage_bytes(settings)
            max_len = settings.model_config.max_model_len
            assert ours.max_num_blocks_per_req(settings, max_len) == spec.max_num_blocks_per_req(settings, max_len)
            if isinstance(spec, V.HiSparseResidentSpec):
                args = (settings.max_in_flight_tokens, max_len)
                assert ours.max_admission_blocks_per_request(*args) == spec.max_admission_blocks_per_request(*args)


@pytest.mark.parametrize("seed", range(3))
def test_configs_convert_and_give_vllms_concurrency(seed):
    rng = random.Random(1000 + seed)
    for _ in range(CASES):
        config, settings = random_config(rng)
        ours = kvcy.vllm.convert_kv_cache_config(config)
        assert ours.host_group_ids == config.host_group_ids
        assert ours.transfer_group_ids == config.transfer_group_ids
        assert ours.prefix_cacheable_group_ids == config.prefix_cacheable_group_ids
        assert [g.role.value for g in ours.kv_cache_groups] == [g.role.value for g in config.kv_cache_groups]
        for name in ("hisparse_host_num_blocks", "hisparse_host_block_stride", "hisparse_shared_host_pool"):
            assert getattr(ours, name) == getattr(config, name), name
        assert KU.get_max_concurrency_for_kv_cache_config(settings, ours) == \
            VU.get_max_concurrency_for_kv_cache_config(settings, config)
        assert KL.get_hisparse_steady_state_concurrency(settings, ours) == \
            VL.get_hisparse_steady_state_concurrency(settings, config)


def test_active_tail_matches_vllms():
    from vllm.v1.hisparse.types import ACTIVE_TAIL_PAGES

    assert KL.ACTIVE_TAIL_PAGES == ACTIVE_TAIL_PAGES


def test_scheduler_config_checks_the_host_pool_as_vllm_does():
    config, _ = random_config(random.Random(7))
    other = V.KVCacheConfig(num_blocks=config.num_blocks, kv_cache_tensors=[], kv_cache_groups=config.kv_cache_groups,
                            hisparse_host_num_blocks=config.hisparse_host_num_blocks + 1)
    assert VU.generate_scheduler_kv_cache_config([config, config]).hisparse_host_num_blocks == \
        KU.generate_scheduler_kv_cache_config([kvcy.vllm.convert_kv_cache_config(c) for c in (config, config)]
                                              ).hisparse_host_num_blocks
    with pytest.raises(AssertionError):
        VU.generate_scheduler_kv_cache_config([config, other])
    # (kvcy says which field differs, as it does for num_blocks)
    with pytest.raises(ValueError, match="hisparse_host_num_blocks"):
        KU.generate_scheduler_kv_cache_config([kvcy.vllm.convert_kv_cache_config(c) for c in (config, other)])


@pytest.mark.parametrize("caching", [True, False])
def test_the_manager_vllms_scheduler_builds_refuses_hisparse(caching):
    """vLLM's scheduler would build its HiSparse coordinator here; kvcy refuses, naming the group."""
    config, _ = random_config(random.Random(11))
    with pytest.raises(NotImplementedError, match="KV-cache group 0 is host-resident: HiSparse"):
        kvcy.vllm.make_kv_cache_manager(config, max_model_len=1024, scheduler_block_size=64, hash_block_size=16,
                                        enable_caching=caching)
