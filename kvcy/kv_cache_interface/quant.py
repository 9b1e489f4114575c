"""KV-cache quantization modes and the cache-dtype names that select them."""

from __future__ import annotations

from enum import IntEnum


class KVQuantMode(IntEnum):
    """How the KV cache is quantized, so kernels dispatch on a value, not a string.

    Members and values are vLLM 0.33.0's.  The mode never changes a spec's page
    size by itself: a packed layout is published in the spec's
    ``num_head_slots`` / ``state_content_bytes`` (see
    :class:`~kvcy.kv_cache_interface.AttentionSpec`).  As in vLLM, ``CUSTOM``
    has the value 12 and so is an alias of ``OCTAVE_K3V4``.
    """

    NONE = 0
    FP8_PER_TENSOR = 1
    INT8_PER_TOKEN_HEAD = 2
    FP8_PER_TOKEN_HEAD = 3
    INT4_PER_TOKEN_HEAD = 4
    """Two int4 values per byte with a scale per (token, head)."""
    NVFP4 = 5
    """Packed fp4 values with fp8 block scales."""
    TURBOQUANT_K8V4 = 6
    TURBOQUANT_4BIT_NC = 7
    TURBOQUANT_K3V4_NC = 8
    TURBOQUANT_3BIT_NC = 9
    NVFP4_DS_MLA = 10
    """NVFP4 in DeepSeek sparse MLA's opaque per-token layout."""
    ULTRAQUANT_4BIT = 11
    OCTAVE_K3V4 = 12
    OCTAVE_K3V3 = 13
    OCTAVE_K3V3_COMPACT = 14
    CUSTOM = 12
    """A backend that chooses its own kernels (vLLM gives it OCTAVE_K3V4's value)."""

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
        """Whether values are packed fp4 with fp8 block scales (not the DS-MLA layout)."""
        return self is KVQuantMode.NVFP4

    @property
    def is_octave(self) -> bool:
        """Whether this is one of the Octave (ROCm Hadamard + Lloyd-Max) modes."""
        return self in (KVQuantMode.OCTAVE_K3V4, KVQuantMode.OCTAVE_K3V3, KVQuantMode.OCTAVE_K3V3_COMPACT)

    @property
    def is_turboquant(self) -> bool:
        """Whether this is one of the TurboQuant modes."""
        return self in (
            KVQuantMode.TURBOQUANT_K8V4,
            KVQuantMode.TURBOQUANT_4BIT_NC,
            KVQuantMode.TURBOQUANT_K3V4_NC,
            KVQuantMode.TURBOQUANT_3BIT_NC,
        )

    @property
    def is_ultraquant(self) -> bool:
        """Whether this is the UltraQuant 4-bit mode."""
        return self is KVQuantMode.ULTRAQUANT_4BIT

    @property
    def is_custom_mode(self) -> bool:
        """Whether the backend manages kernel dispatch itself (``CUSTOM``, value 12)."""
        return self is KVQuantMode.CUSTOM


def get_kv_quant_mode(kv_cache_dtype: str) -> KVQuantMode:
    """The :class:`KVQuantMode` of a cache-dtype name such as ``"fp8"`` or ``"auto"``.

    vLLM's registered cache-dtype handlers are not modelled; every built-in
    name maps as in vLLM 0.33.0.

    Raises:
        KeyError: a ``turboquant_*`` or ``octave_*`` name that is no mode (as in vLLM).
    """
    if kv_cache_dtype == "int4_per_token_head":
        return KVQuantMode.INT4_PER_TOKEN_HEAD
    if kv_cache_dtype == "int8_per_token_head":
        return KVQuantMode.INT8_PER_TOKEN_HEAD
    if kv_cache_dtype == "fp8_per_token_head":
        return KVQuantMode.FP8_PER_TOKEN_HEAD
    if kv_cache_dtype == "nvfp4_ds_mla":  # before the "nvfp4" prefix, which it also has
        return KVQuantMode.NVFP4_DS_MLA
    if isinstance(kv_cache_dtype, str) and kv_cache_dtype.startswith("nvfp4"):
        return KVQuantMode.NVFP4
    if isinstance(kv_cache_dtype, str) and kv_cache_dtype.startswith(("turboquant_", "octave_")):
        return KVQuantMode[kv_cache_dtype.upper()]
    if kv_cache_dtype == "ultraquant_4bit":
        return KVQuantMode.ULTRAQUANT_4BIT
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
