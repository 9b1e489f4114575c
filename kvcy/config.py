"""KV-cache configuration (vLLM ``config/cache.py``) and the settings memory planning needs.

:class:`CacheConfig` carries the user-facing KV-cache knobs with vLLM's names,
defaults and validation errors.  :class:`KVCacheSettings` is the small part of
a vLLM ``VllmConfig`` that sizing reads (see :mod:`kvcy.kv_cache_sizing`): the
cache config, the model length and the scheduler's per-step token budget.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "BLOCK_SIZES",
    "CACHE_DTYPES",
    "DEFAULT_BLOCK_SIZE",
    "DEFAULT_MAX_NUM_BATCHED_TOKENS",
    "GiB_bytes",
    "MAMBA_CACHE_MODES",
    "MAMBA_DTYPES",
    "PREFIX_CACHING_HASH_ALGOS",
    "CacheConfig",
    "KVCacheSettings",
]

GiB_bytes = 1 << 30

#: Block sizes vLLM documents (not enforced: any positive size is accepted).
BLOCK_SIZES = (1, 8, 16, 32, 64, 128)
#: Block size used when a :class:`CacheConfig` leaves ``block_size`` unset.
DEFAULT_BLOCK_SIZE = 16
#: Scheduler token budget per step used when a :class:`KVCacheSettings` leaves it unset.
DEFAULT_MAX_NUM_BATCHED_TOKENS = 2048

#: Accepted ``cache_dtype`` values ("auto" = the model's dtype).
CACHE_DTYPES = (
    "auto",
    "float16",
    "bfloat16",
    "fp8",
    "fp8_e4m3",
    "fp8_e5m2",
    "fp8_inc",
    "fp8_ds_mla",
    "int8_per_token_head",
    "fp8_per_token_head",
    "nvfp4",
)
MAMBA_DTYPES = ("auto", "float32", "float16", "bfloat16")
MAMBA_CACHE_MODES = ("align", "none")
#: Accepted ``prefix_caching_hash_algo`` values (vLLM 0.33.0's four plus the
#: seed's ``builtin`` and ``sha256_cbor_64bit``).
PREFIX_CACHING_HASH_ALGOS = ("builtin", "sha256", "sha256_cbor", "sha256_cbor_64bit", "xxhash", "xxhash_cbor")


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _check_optional_positive_int(name: str, value: Any) -> None:
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int or None, got {type(value).__name__}: {value!r}")
    if value <= 0:
        raise ValueError(f"{name} must be positive, got {value}")


@dataclass
class CacheConfig:
    """Configuration for the KV cache.

    Field names and defaults follow vLLM's ``CacheConfig``; the validation in
    ``__post_init__`` raises the same errors (``ValueError`` for values out of
    range or not among the accepted names).
    """

    block_size: int | None = None
    """Tokens per KV-cache block.  None means "the platform default"
    (:data:`DEFAULT_BLOCK_SIZE` when kvcy plans memory)."""
    gpu_memory_utilization: float = 0.9
    """Fraction of GPU memory this instance may use, in (0, 1]."""
    swap_space: float = 4
    """CPU swap space per GPU, in GiB."""
    cache_dtype: str = "auto"
    """KV-cache storage dtype (:data:`CACHE_DTYPES`); "auto" = the model's dtype."""
    is_attention_free: bool = False
    """Whether the model has no attention (duplicated from the model config)."""
    num_gpu_blocks_override: int | None = None
    """Use this many GPU blocks instead of the number the memory allows."""
    sliding_window: int | None = None
    """Sliding-window size (duplicated from the model config)."""
    enable_prefix_caching: bool | None = None
    """Whether to cache and reuse full blocks by their hash."""
    prefix_caching_hash_algo: str = "builtin"
    """Block hash algorithm (:data:`PREFIX_CACHING_HASH_ALGOS`)."""
    cpu_offload_gb: float = 0
    """Model weights offloaded to CPU per GPU, in GiB."""
    calculate_kv_scales: bool = False
    """Compute fp8 k/v scales at run time instead of loading them."""
    cpu_kvcache_space_bytes: int | None = None
    """KV-cache space of the CPU backend, in bytes."""
    mamba_page_size_padded: int | None = None
    """Page size Mamba layers are padded to (to match the attention page)."""
    mamba_block_size: int | None = None
    """Tokens per block of Mamba layers (prefix caching only)."""
    mamba_cache_dtype: str = "auto"
    """Dtype of the whole Mamba state (:data:`MAMBA_DTYPES`)."""
    mamba_ssm_cache_dtype: str = "auto"
    """Dtype of the Mamba SSM state only (:data:`MAMBA_DTYPES`)."""
    mamba_cache_mode: str = "none"
    """Mamba prefix-cache strategy: "none" (no caching) or "align" (:data:`MAMBA_CACHE_MODES`)."""
    kv_cache_memory_bytes: int | None = None
    """KV-cache memory per GPU in bytes; when set, ``gpu_memory_utilization`` is ignored."""
    kv_offloading_size: float | None = None
    """Size of the CPU offloading buffer in GiB (None = no offloading)."""
    kv_offloading_backend: str = "native"
    """Offloading backend: "native" or "lmcache"."""
    kv_sharing_fast_prefill: bool = False
    """Let layers sharing KV skip prefill tokens (work in progress upstream)."""
    kv_cache_layout: str | None = None
    """Physical KV-cache layout by name (``"LBNHC"``, ``"BLHNC"``, ...; ``"NHD"``
    and ``"HND"`` are aliases of ``"LBNHC"`` and ``"LBHNC"``).  vLLM's engine
    core resolves it from the attention backends; None lets kvcy's sizing use
    what vLLM resolves when no backend declares layouts (``"LBNHC"``)."""

    # Set after profiling.
    num_gpu_blocks: int | None = field(default=None, init=False)
    num_cpu_blocks: int | None = field(default=None, init=False)

    def __post_init__(self) -> None:
        self._verify_args()
        # instance attributes (not just class defaults) so metrics_info lists them
        self.num_gpu_blocks = None
        self.num_cpu_blocks = None
        self.swap_space_bytes = self.swap_space * GiB_bytes
        self._verify_cache_dtype()
        self._verify_prefix_caching()

    def _verify_args(self) -> None:
        _check_optional_positive_int("block_size", self.block_size)
        if not _is_number(self.gpu_memory_utilization):
            raise TypeError(f"gpu_memory_utilization must be a number, got {self.gpu_memory_utilization!r}")
        if self.gpu_memory_utilization > 1.0:
            raise ValueError(f"GPU memory utilization must be less than 1.0. Got {self.gpu_memory_utilization}.")
        if self.gpu_memory_utilization <= 0:
            raise ValueError(f"GPU memory utilization must be positive. Got {self.gpu_memory_utilization}.")
        if not _is_number(self.cpu_offload_gb):
            raise TypeError(f"cpu_offload_gb must be a number, got {self.cpu_offload_gb!r}")
        if self.cpu_offload_gb < 0:
            raise ValueError(f"CPU offload space must be non-negative, but got {self.cpu_offload_gb}")
        if not _is_number(self.swap_space):
            raise TypeError(f"swap_space must be a number, got {self.swap_space!r}")
        if self.swap_space < 0:
            raise ValueError(f"Swap space must be non-negative, but got {self.swap_space}")
        _check_optional_positive_int("num_gpu_blocks_override", self.num_gpu_blocks_override)
        _check_optional_positive_int("sliding_window", self.sliding_window)
        _check_optional_positive_int("mamba_page_size_padded", self.mamba_page_size_padded)
        _check_optional_positive_int("mamba_block_size", self.mamba_block_size)
        _check_optional_positive_int("kv_cache_memory_bytes", self.kv_cache_memory_bytes)
        if self.cpu_kvcache_space_bytes is not None and self.cpu_kvcache_space_bytes < 0:
            raise ValueError(f"cpu_kvcache_space_bytes must be non-negative, got {self.cpu_kvcache_space_bytes}")
        if self.kv_offloading_size is not None and self.kv_offloading_size <= 0:
            raise ValueError(f"kv_offloading_size must be positive, got {self.kv_offloading_size}")
        if self.kv_offloading_backend not in ("native", "lmcache"):
            raise ValueError(
                f"Unknown KV offloading backend: {self.kv_offloading_backend}. Must be one of ('native', 'lmcache')."
            )
        for name in ("mamba_cache_dtype", "mamba_ssm_cache_dtype"):
            value = getattr(self, name)
            if value not in MAMBA_DTYPES:
                raise ValueError(f"Unknown {name}: {value}. Must be one of {MAMBA_DTYPES}.")
        if self.mamba_cache_mode not in MAMBA_CACHE_MODES:
            raise ValueError(f"Unknown mamba_cache_mode: {self.mamba_cache_mode}. Must be one of {MAMBA_CACHE_MODES}.")
        if self.kv_cache_layout is not None:
            from kvcy.kv_cache_interface import KVCacheLayout

            if not isinstance(self.kv_cache_layout, str):
                raise TypeError(f"kv_cache_layout must be a layout name or None, got {self.kv_cache_layout!r}")
            KVCacheLayout.from_name(self.kv_cache_layout)  # ValueError naming the choices

    def _verify_cache_dtype(self) -> None:
        if self.cache_dtype not in CACHE_DTYPES:
            raise ValueError(f"Unknown kv cache dtype: {self.cache_dtype}")

    def _verify_prefix_caching(self) -> None:
        if self.prefix_caching_hash_algo not in PREFIX_CACHING_HASH_ALGOS:
            raise ValueError(
                f"Unknown prefix caching hash algorithm: {self.prefix_caching_hash_algo}. "
                f"Must be one of {PREFIX_CACHING_HASH_ALGOS}."
            )

    def compute_hash(self) -> str:
        """Hex digest of the fields that change the model's compute graph.

        Only the cache dtypes do (the KV-cache layout a kernel sees); memory
        sizes, block counts and prefix-caching choices do not.
        """
        factors: list[Any] = [self.cache_dtype, self.mamba_cache_dtype, self.mamba_ssm_cache_dtype]
        return hashlib.md5(str(factors).encode(), usedforsecurity=False).hexdigest()

    def metrics_info(self) -> dict[str, str]:
        """Every attribute as strings, for a Prometheus info metric."""
        return {key: str(value) for key, value in self.__dict__.items()}

    def get_resolved_kv_cache_layout(self) -> Any:
        """:attr:`kv_cache_layout` as a :class:`~kvcy.kv_cache_interface.KVCacheLayout`.

        When unset this is ``LBNHC``, the first of vLLM's default layout
        preferences, which its engine core picks when no attention backend
        declares the layouts it supports (vLLM itself raises before the
        engine core has resolved one).
        """
        from kvcy.kv_cache_interface import KVCacheLayout

        if self.kv_cache_layout is None:
            return KVCacheLayout.LBNHC
        return KVCacheLayout.from_name(self.kv_cache_layout)

    @property
    def resolved_block_size(self) -> int:
        """``block_size``, or :data:`DEFAULT_BLOCK_SIZE` when unset."""
        return DEFAULT_BLOCK_SIZE if self.block_size is None else self.block_size


@dataclass(frozen=True)
class KVCacheSettings:
    """What memory planning reads from a serving configuration.

    Stands in for vLLM's ``VllmConfig`` in :mod:`kvcy.kv_cache_sizing` and in
    the specs' ``max_memory_usage_bytes``.

    Args:
        cache_config: the KV-cache configuration.
        max_model_len: longest request (prompt + output) in tokens.
        disable_hybrid_kv_cache_manager: manage sliding-window and
            chunked-local layers as full attention (one group).
        max_num_batched_tokens: scheduler token budget per step (bounds
            how much a sliding-window or chunked-local layer holds);
            defaults to :data:`DEFAULT_MAX_NUM_BATCHED_TOKENS`.
        max_num_encoder_input_tokens: longest encoder input (cross
            attention); defaults to ``max_num_batched_tokens``.
    """

    cache_config: CacheConfig = field(default_factory=CacheConfig)
    max_model_len: int = 8192
    disable_hybrid_kv_cache_manager: bool = False
    max_num_batched_tokens: int | None = None
    max_num_encoder_input_tokens: int | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.cache_config, CacheConfig):
            raise TypeError(f"cache_config must be a CacheConfig, got {type(self.cache_config).__name__}")
        if isinstance(self.max_model_len, bool) or not isinstance(self.max_model_len, int):
            raise TypeError(f"max_model_len must be an int, got {self.max_model_len!r}")
        if self.max_model_len <= 0:
            raise ValueError(f"max_model_len must be positive, got {self.max_model_len}")
        _check_optional_positive_int("max_num_batched_tokens", self.max_num_batched_tokens)
        _check_optional_positive_int("max_num_encoder_input_tokens", self.max_num_encoder_input_tokens)
        if self.max_num_batched_tokens is None:
            object.__setattr__(self, "max_num_batched_tokens", DEFAULT_MAX_NUM_BATCHED_TOKENS)
        if self.max_num_encoder_input_tokens is None:
            object.__setattr__(self, "max_num_encoder_input_tokens", self.max_num_batched_tokens)
