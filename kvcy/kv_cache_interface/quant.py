"""KV-cache quantization modes and the cache-dtype names that select them."""

from __future__ import annotations

from enum import IntEnum


class KVQuantMode(IntEnum):
    """How the KV cache is quantized, so kernels dispatch on a value, not a string."""

    NONE = 0
    FP8_PER_TENSOR = 1
    INT8_PER_TOKEN_HEAD = 2
    FP8_PER_TOKEN_HEAD = 3
    INT4_PER_TOKEN_HEAD = 4
    """Two int4 values per byte with per-(token, head) scales; its page layout is
    the attention backend's, which kvcy does not model (specs refuse it)."""
    NVFP4 = 5

    @property
    def is_per_token_head(self) -> bool:
        """Whether every (token, head) carries its own dynamic scale."""
        return self in (
            KVQuantMode.INT8_PER_TOKEN_HEAD,
            KVQuantMode.FP8_PER_TOKEN_HEAD,
            KVQuantMode.INT4_PER_TOKEN_HEAD,
        )

    @property
    def is_nvfp4(self) -> bool:
        """Whether values are packed fp4 with fp8 block scales."""
        return self is KVQuantMode.NVFP4


def get_kv_quant_mode(kv_cache_dtype: str) -> KVQuantMode:
    """The :class:`KVQuantMode` of a cache-dtype name such as ``"fp8"`` or ``"auto"``."""
    if kv_cache_dtype == "int4_per_token_head":
        return KVQuantMode.INT4_PER_TOKEN_HEAD
    if kv_cache_dtype == "int8_per_token_head":
        return KVQuantMode.INT8_PER_TOKEN_HEAD
    if kv_cache_dtype == "fp8_per_token_head":
        return KVQuantMode.FP8_PER_TOKEN_HEAD
    if isinstance(kv_cache_dtype, str) and kv_cache_dtype.startswith("nvfp4"):
        return KVQuantMode.NVFP4
    if isinstance(kv_cache_dtype, str) and kv_cache_dtype.startswith("fp8"):
        return KVQuantMode.FP8_PER_TENSOR
    return KVQuantMode.NONE


def is_quantized_kv_cache(kv_cache_dtype: str) -> bool:
    """Whether a cache-dtype name means a quantized cache."""
    return get_kv_quant_mode(kv_cache_dtype) is not KVQuantMode.NONE


def kv_cache_uses_per_token_head_scales(kv_cache_dtype: str) -> bool:
    """Whether a cache-dtype name needs a scale per (token, head)."""
    return get_kv_quant_mode(kv_cache_dtype).is_per_token_head


def nvfp4_kv_cache_full_dim(head_size: int) -> int:
    """Bytes per head of an NVFP4 entry: two fp4 values per byte plus one fp8 scale per 16."""
    return head_size // 2 + head_size // 16
