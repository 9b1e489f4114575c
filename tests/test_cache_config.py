"""CacheConfig and KVCacheSettings (kvcy.config)."""

from __future__ import annotations

import dataclasses
import hashlib

import pytest

from kvcy.config import CacheConfig, KVCacheSettings


def test_defaults():
    c = CacheConfig()
    assert c.block_size is None
    assert c.resolved_block_size == 16
    assert c.gpu_memory_utilization == 0.9
    assert c.swap_space == 4
    assert c.swap_space_bytes == 4 * 1024**3
    assert c.cache_dtype == "auto"
    assert c.is_attention_free is False
    assert c.num_gpu_blocks_override is None
    assert c.sliding_window is None
    assert c.enable_prefix_caching is None
    assert c.prefix_caching_hash_algo == "builtin"
    assert c.cpu_offload_gb == 0
    assert c.calculate_kv_scales is False
    assert c.cpu_kvcache_space_bytes is None
    assert c.mamba_page_size_padded is None
    assert c.mamba_cache_dtype == "auto" and c.mamba_ssm_cache_dtype == "auto"
    assert c.mamba_cache_mode == "none"
    assert c.kv_sharing_fast_prefill is False
    assert c.num_gpu_blocks is None and c.num_cpu_blocks is None


def test_profiled_counts_are_not_init_arguments():
    with pytest.raises(TypeError):
        CacheConfig(num_gpu_blocks=10)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"gpu_memory_utilization": 1.1}, "GPU memory utilization must be less than 1.0. Got 1.1."),
        ({"gpu_memory_utilization": 0}, "GPU memory utilization must be positive"),
        ({"cpu_offload_gb": -1}, "CPU offload space must be non-negative, but got -1"),
        ({"cache_dtype": "fp16"}, "Unknown kv cache dtype: fp16"),
        ({"prefix_caching_hash_algo": "md5"}, "Unknown prefix caching hash algorithm: md5"),
        ({"prefix_caching_hash_algo": "md5", "enable_prefix_caching": True}, "Must be one of"),
        ({"block_size": 0}, "block_size must be positive"),
        ({"block_size": -16}, "block_size must be positive"),
        ({"num_gpu_blocks_override": 0}, "num_gpu_blocks_override must be positive"),
        ({"swap_space": -1}, "Swap space must be non-negative"),
        ({"mamba_cache_mode": "some"}, "Unknown mamba_cache_mode: some"),
        # vLLM 0.33.0's CacheConfig takes only "align" and "none" (no "all" mode)
        ({"mamba_cache_mode": "all"}, "Unknown mamba_cache_mode: all"),
        ({"mamba_cache_dtype": "int8"}, "Unknown mamba_cache_dtype: int8"),
        ({"kv_offloading_backend": "disk"}, "Unknown KV offloading backend: disk"),
    ],
)
def test_validation_errors(kwargs, message):
    with pytest.raises(ValueError, match=message.replace(".", r"\.").replace("(", r"\(")):
        CacheConfig(**kwargs)


def test_accepted_values():
    for dtype in ("auto", "fp8", "fp8_e4m3", "fp8_e5m2", "fp8_inc", "bfloat16", "int8_per_token_head"):
        assert CacheConfig(cache_dtype=dtype).cache_dtype == dtype
    for algo in ("builtin", "sha256", "sha256_cbor", "sha256_cbor_64bit", "xxhash", "xxhash_cbor"):
        assert CacheConfig(prefix_caching_hash_algo=algo, enable_prefix_caching=True).prefix_caching_hash_algo == algo
    assert CacheConfig(gpu_memory_utilization=1.0).gpu_memory_utilization == 1.0


def test_wrong_types():
    with pytest.raises(TypeError, match="block_size"):
        CacheConfig(block_size="16")
    with pytest.raises(TypeError, match="gpu_memory_utilization"):
        CacheConfig(gpu_memory_utilization="0.5")


def test_compute_hash_covers_only_the_cache_dtypes():
    expected = hashlib.md5(str(["auto", "auto", "auto"]).encode(), usedforsecurity=False).hexdigest()
    assert CacheConfig().compute_hash() == expected
    fp8 = hashlib.md5(str(["fp8", "auto", "float32"]).encode(), usedforsecurity=False).hexdigest()
    assert CacheConfig(cache_dtype="fp8", mamba_ssm_cache_dtype="float32").compute_hash() == fp8
    # memory and block knobs do not change the compute graph
    assert CacheConfig(gpu_memory_utilization=0.5, block_size=32).compute_hash() == expected


def test_metrics_info():
    info = CacheConfig(block_size=32).metrics_info()
    assert all(isinstance(v, str) for v in info.values())
    assert info["block_size"] == "32"
    assert info["gpu_memory_utilization"] == "0.9"
    assert info["enable_prefix_caching"] == "None"
    assert info["swap_space_bytes"] == "4294967296"
    assert info["num_gpu_blocks"] == "None"


def test_settings_defaults_and_validation():
    s = KVCacheSettings(max_model_len=4096)
    assert s.cache_config == CacheConfig()
    assert s.max_num_batched_tokens == 2048
    assert s.max_num_encoder_input_tokens == 2048
    assert s.disable_hybrid_kv_cache_manager is False
    s = KVCacheSettings(max_model_len=4096, max_num_batched_tokens=512)
    assert s.max_num_encoder_input_tokens == 512
    with pytest.raises(dataclasses.FrozenInstanceError):
        s.max_model_len = 1
    with pytest.raises(ValueError, match="max_model_len must be positive"):
        KVCacheSettings(max_model_len=0)
    with pytest.raises(ValueError, match="max_num_batched_tokens must be positive"):
        KVCacheSettings(max_model_len=10, max_num_batched_tokens=-1)
    with pytest.raises(TypeError, match="cache_config"):
        KVCacheSettings(cache_config={"block_size": 16})
