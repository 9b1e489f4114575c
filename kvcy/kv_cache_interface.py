"""KV-cache specs, groups, configs and physical layouts (vLLM ``v1/kv_cache_interface``).

A *spec* says what one attention layer needs per KV-cache block (its page size
in bytes) and at most how much memory one request can make it hold.  Layers
with the same spec are put in one *group* that shares a block table; a
:class:`KVCacheConfig` lists the groups, the backing tensors and the number of
blocks.  :class:`KVCacheLayout` names the six physical orders of the logical
``[L, B, H, N, C]`` cache shape, and :func:`reshape_kv_cache` turns one flat
byte buffer into per-layer ``[B, H, N, C]`` views for any of them.

Nothing here needs torch except :func:`reshape_kv_cache` (and
:attr:`AttentionSpec.torch_dtype`), which import it lazily.  A spec's ``dtype``
may be given as a ``torch.dtype`` (kept as is, as vLLM keeps it) or as a name
(``"float16"``, ``"bf16"``, ``"fp8"`` ...; stored as the canonical torch
attribute name such as ``"bfloat16"`` or ``"float8_e4m3fn"``).  Specs compare
and hash by that canonical name, so equal specs are equal however their dtype
was given.

Parameters of features kvcy leaves out (decode context parallelism, HiSparse,
connector paths) are accepted at their "off" values and raise
``NotImplementedError`` naming the feature otherwise.
"""

from __future__ import annotations

import copy
from collections import Counter
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field, fields, replace
from enum import Enum, IntEnum
from fractions import Fraction
from functools import cached_property
from math import gcd, prod
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover
    import torch

__all__ = [
    "AttentionSpec",
    "ChunkedLocalAttentionSpec",
    "CrossAttentionSpec",
    "EncoderOnlyAttentionSpec",
    "FullAttentionSpec",
    "HiddenStateCacheSpec",
    "KVCacheConfig",
    "KVCacheGroupRole",
    "KVCacheGroupSpec",
    "KVCacheLayout",
    "KVCacheSpec",
    "KVCacheSpecKind",
    "KVCacheTensor",
    "KVQuantMode",
    "MLAAttentionSpec",
    "MambaSpec",
    "MultipleOf",
    "SinkFullAttentionSpec",
    "SlidingWindowMLASpec",
    "SlidingWindowSpec",
    "TQFullAttentionSpec",
    "UniformTypeKVCacheSpecs",
    "canonical_dtype",
    "cdiv",
    "compute_layer_kv_cache_shape_bytes",
    "get_dtype_size",
    "get_kv_cache_spec_kind",
    "get_kv_cache_spec_sliding_window",
    "get_kv_quant_mode",
    "is_full_attention_spec",
    "is_quantized_kv_cache",
    "iter_layer_specs",
    "kv_cache_uses_per_token_head_scales",
    "num_states_for",
    "reshape_kv_cache",
]


def cdiv(a: int, b: int) -> int:
    """Ceiling division of non-negative integers."""
    return -(a // -b)


# ---------------------------------------------------------------------------
# dtypes without torch
# ---------------------------------------------------------------------------

# canonical name (the torch attribute) -> size in bytes
_DTYPE_SIZES: dict[str, int] = {
    "float16": 2,
    "bfloat16": 2,
    "float32": 4,
    "float64": 8,
    "int8": 1,
    "uint8": 1,
    "int16": 2,
    "int32": 4,
    "int64": 8,
    "bool": 1,
    "float8_e4m3fn": 1,
    "float8_e4m3fnuz": 1,
    "float8_e5m2": 1,
    "float8_e5m2fnuz": 1,
}

# other spellings -> canonical name.  The ``fp8*`` entries are vLLM cache-dtype
# names; a KV cache in fp8 stores one byte per element.
_DTYPE_ALIASES: dict[str, str] = {
    "half": "float16",
    "fp16": "float16",
    "bf16": "bfloat16",
    "float": "float32",
    "fp32": "float32",
    "double": "float64",
    "fp8": "float8_e4m3fn",
    "fp8_e4m3": "float8_e4m3fn",
    "fp8_e5m2": "float8_e5m2",
    "fp8_inc": "float8_e4m3fn",
    "fp8_ds_mla": "uint8",
    "nvfp4": "uint8",
    "int8_per_token_head": "int8",
    "fp8_per_token_head": "float8_e4m3fn",
}


def canonical_dtype(dtype: Any) -> str:
    """Canonical name of a dtype given as a ``torch.dtype`` or a string.

    Raises:
        ValueError: the name is not a known dtype.
        TypeError: ``dtype`` is neither a string nor a ``torch.dtype``.
    """
    if isinstance(dtype, str):
        name = dtype.strip().lower()
        name = name.removeprefix("torch.")
        name = _DTYPE_ALIASES.get(name, name)
        if name not in _DTYPE_SIZES:
            raise ValueError(
                f"unknown dtype {dtype!r}; expected a torch.dtype or one of "
                f"{sorted(set(_DTYPE_SIZES) | set(_DTYPE_ALIASES))}"
            )
        return name
    if _is_torch_dtype(dtype):
        name = str(dtype).removeprefix("torch.")
        if name not in _DTYPE_SIZES:
            itemsize = getattr(dtype, "itemsize", None)
            if not isinstance(itemsize, int) or itemsize <= 0:
                raise ValueError(f"dtype {dtype} has no whole-byte element size")
            _DTYPE_SIZES[name] = itemsize
        return name
    raise TypeError(f"dtype must be a torch.dtype or a string, got {type(dtype).__name__}: {dtype!r}")


def _is_torch_dtype(dtype: Any) -> bool:
    return type(dtype).__name__ == "dtype" and type(dtype).__module__ == "torch"


def get_dtype_size(dtype: Any) -> int:
    """Size in bytes of one element of ``dtype`` (a ``torch.dtype`` or a name)."""
    return _DTYPE_SIZES[canonical_dtype(dtype)]


def _torch_dtype(name: str) -> torch.dtype:
    import torch

    return getattr(torch, name)


# ---------------------------------------------------------------------------
# Quantization modes
# ---------------------------------------------------------------------------


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


# ---------------------------------------------------------------------------
# Validation helpers
# ---------------------------------------------------------------------------


def _check_int(owner: str, name: str, value: Any, *, minimum: int = 1, optional: bool = False) -> None:
    if value is None and optional:
        return
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{owner}.{name} must be an int, got {type(value).__name__}: {value!r}")
    if value < minimum:
        what = "positive" if minimum == 1 else f">= {minimum}"
        raise ValueError(f"{owner}.{name} must be {what}, got {value}")


def _check_bool(owner: str, name: str, value: Any) -> None:
    if not isinstance(value, bool):
        raise TypeError(f"{owner}.{name} must be a bool, got {type(value).__name__}: {value!r}")


def _check_tokens_per_state(owner: str, value: Any) -> None:
    if isinstance(value, Fraction):
        if value <= 0:
            raise ValueError(f"{owner}.tokens_per_state must be positive, got {value}")
        return
    _check_int(owner, "tokens_per_state", value)


def _dcp_world_size(config: Any) -> int:
    """``parallel_config.decode_context_parallel_size`` of a vLLM-style config (1 if absent)."""
    parallel = getattr(config, "parallel_config", None)
    return getattr(parallel, "decode_context_parallel_size", 1) or 1


def _no_dcp(config: Any) -> None:
    if _dcp_world_size(config) > 1:
        raise NotImplementedError(
            "decode context parallelism (dcp) is not supported: "
            "parallel_config.decode_context_parallel_size must be 1"
        )


def _setting(config: Any, name: str, nested: str) -> Any:
    """Read ``name`` from a kvcy settings object or from a vLLM-style nested config."""
    if hasattr(config, name):
        return getattr(config, name)
    return getattr(getattr(config, nested), name)


# ---------------------------------------------------------------------------
# Specs
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class MultipleOf:
    """A block-stride alignment of whole kernel blocks of up to ``base`` tokens.

    Given as a spec's ``block_stride_alignment`` when the attention backend
    splits each KV-cache block into kernel blocks: the stride between physical
    blocks must then be a whole number of kernel-block pages (see
    :meth:`KVCacheSpec.get_block_stride_alignment`).
    """

    base: int

    def __post_init__(self) -> None:
        _check_int("MultipleOf", "base", self.base)

    def __repr__(self) -> str:
        return f"MultipleOf({self.base})"


def _admission_capped_bytes(spec: Any, config: Any) -> int:
    """Memory one request can hold for a spec whose blocks are capped per
    request (``max_admission_blocks_per_request``): sliding window, chunked local."""
    blocks = spec.max_admission_blocks_per_request(
        max_num_batched_tokens=_setting(config, "max_num_batched_tokens", "scheduler_config"),
        max_model_len=_setting(config, "max_model_len", "model_config"),
    )
    return blocks * spec.page_size_bytes


@dataclass(frozen=True, kw_only=True)
class KVCacheSpec:
    """What one layer stores per KV-cache block.

    Subclasses give the page size (bytes per block) and the worst-case memory
    one request can hold.  The standard vocabulary of the logical cache shape
    ``[B, H, N, C]`` is exposed as properties: :attr:`num_heads` (``H``; 1 for
    head-less formats such as MLA), :attr:`tokens_per_state` (-1 for recurrent
    state, 1 for standard attention, more for compressed formats) and
    :attr:`state_content_size_bytes` (``C`` in bytes, per state and head).
    """

    block_size: int
    """Number of tokens in a block."""
    dcp_sharded: bool = False
    """Whether decode context parallelism would shard this cache's tokens
    across ranks (only meaningful with dcp, which kvcy does not support)."""
    block_stride_alignment: int | MultipleOf | None = None
    """Byte alignment the stride between physical blocks needs (packed layers
    included): an int of bytes, :class:`MultipleOf` for whole kernel blocks,
    or None for none.  See :meth:`get_block_stride_alignment`."""
    is_draft: bool = field(default=False, compare=False)
    """Whether a draft model owns the layer; never part of equality."""

    def __post_init__(self) -> None:
        owner = type(self).__name__
        _check_int(owner, "block_size", self.block_size)
        _check_bool(owner, "dcp_sharded", self.dcp_sharded)
        _check_bool(owner, "is_draft", self.is_draft)
        alignment = self.block_stride_alignment
        if not isinstance(alignment, MultipleOf):
            if alignment is not None and (isinstance(alignment, bool) or not isinstance(alignment, int)):
                raise TypeError(
                    f"{owner}.block_stride_alignment must be an int, a MultipleOf or None, "
                    f"got {type(alignment).__name__}: {alignment!r}"
                )
            _check_int(owner, "block_stride_alignment", alignment, optional=True)

    def get_block_stride_alignment(self) -> int:
        """Bytes the stride between physical blocks must be a multiple of.

        An int alignment is returned as is (1 for None).  For ``MultipleOf(n)``
        the kernel block is ``gcd(n, block_size)`` tokens: 1 when that is the
        whole block, else the page size of a copy of this spec with the kernel
        block size (the spec's own fields, ``page_size_padded`` included, kept).
        """
        alignment = self.block_stride_alignment
        if not isinstance(alignment, MultipleOf):
            return alignment or 1
        kernel_block_size = gcd(alignment.base, self.block_size)
        if kernel_block_size == self.block_size:
            return 1
        return replace(self, block_size=kernel_block_size).page_size_bytes

    @property
    def block_table_token_alignment(self) -> int | None:
        """Token granularity a block table row is padded to (None: not padded)."""
        return 128

    def get_num_kernel_states(self, kernel_block_size: int) -> int:
        """States in one kernel block of ``kernel_block_size`` tokens (1 for recurrent state)."""
        _check_int(type(self).__name__, "kernel_block_size", kernel_block_size)
        if self.tokens_per_state > 0:
            return int(kernel_block_size // self.tokens_per_state)
        return 1

    @property
    def prefix_cacheable(self) -> bool:
        """Whether this spec's group takes part in prefix caching."""
        return True

    @property
    def prefix_replay_tokens(self) -> int:
        """Tokens a prefix hit must replay (bounded replay); 0 for every kvcy spec."""
        return 0

    @property
    def has_layer_views(self) -> bool:
        """Whether generic allocation makes per-layer ``[B, H, N, C]`` views of this spec."""
        return True

    @property
    def uses_slot_mapping(self) -> bool:
        """Whether the worker computes a per-token slot mapping for this spec."""
        return True

    @property
    def num_states(self) -> int:
        """States (``N``) in one block."""
        return num_states_for(self.block_size, self.tokens_per_state)

    def max_num_blocks_per_req(self, config: Any, max_len: int) -> int:
        """Block-table entries one request needs for ``max_len`` tokens.

        Args:
            config: a :class:`kvcy.config.KVCacheSettings` or a vLLM-style config.
            max_len: the longest sequence to size for (encoder length included
                for encoder-decoder models).
        """
        return cdiv(max_len, self.block_size)

    @property
    def num_heads(self) -> int:
        raise NotImplementedError(f"{type(self).__name__} has no num_heads")

    @property
    def tokens_per_state(self) -> int:
        raise NotImplementedError(f"{type(self).__name__} has no tokens_per_state")

    @property
    def state_content_size_bytes(self) -> int:
        raise NotImplementedError(f"{type(self).__name__} has no state_content_size_bytes")

    @property
    def page_size_bytes(self) -> int:
        """Bytes of one block (``block_size`` tokens) of this layer."""
        raise NotImplementedError(f"{type(self).__name__} has no page size")

    def max_memory_usage_bytes(self, config: Any) -> int:
        """Most bytes one request can make this layer hold.

        Args:
            config: a :class:`kvcy.config.KVCacheSettings` (or anything with
                ``max_model_len``, ``max_num_batched_tokens``,
                ``max_num_encoder_input_tokens`` and ``cache_config``).
        """
        raise NotImplementedError(f"{type(self).__name__} has no max_memory_usage_bytes")

    def copy_with_new_block_size(self, block_size: int):
        """This spec with another block size."""
        return replace(self, block_size=block_size)

    @classmethod
    def merge(cls, specs: list):
        """One spec standing for several layers that must all be equal.

        Raises:
            ValueError: ``specs`` is empty.
            AssertionError: its members differ (as in vLLM).
        """
        if not specs:
            raise ValueError("cannot merge an empty list of KV cache specs")
        if any(spec != specs[0] for spec in specs[1:]):
            raise AssertionError("All layers in the same KV cache group must have the same KV cache spec.")
        return copy.deepcopy(specs[0])


@dataclass(frozen=True, kw_only=True)
class AttentionSpec(KVCacheSpec):
    """An attention layer storing K and V of ``head_size`` per kv head and token."""

    dcp_sharded: bool = True
    max_tp_shards: int | None = None
    """Distinct shards of this cache across tensor-parallel ranks (ranks
    beyond it hold replicas); None: unknown, taken as not replicated."""
    num_kv_heads: int
    head_size: int
    dtype: Any = field(compare=False)
    """Element type: a ``torch.dtype`` (kept) or a name (stored canonical)."""
    kv_quant_mode: KVQuantMode = KVQuantMode.NONE
    page_size_padded: int | None = None
    """Page size rounded up by the caller (bytes), or None for the real size."""
    tokens_per_state: int | Fraction = 1
    """Tokens one stored state covers: 1 for standard attention, more for
    compressed formats, a Fraction below 1 for several states per token."""
    _dtype_name: str = field(init=False, repr=False, default="")
    # The canonical name of dtype: what equality and hashing see.

    def __post_init__(self) -> None:
        super().__post_init__()
        owner = type(self).__name__
        _check_int(owner, "num_kv_heads", self.num_kv_heads)
        _check_int(owner, "head_size", self.head_size)
        _check_int(owner, "max_tp_shards", self.max_tp_shards, optional=True)
        _check_tokens_per_state(owner, self.tokens_per_state)
        num_states_for(self.block_size, self.tokens_per_state)  # whole states per block
        name = canonical_dtype(self.dtype)
        object.__setattr__(self, "_dtype_name", name)
        if not _is_torch_dtype(self.dtype):
            object.__setattr__(self, "dtype", name)
        if not isinstance(self.kv_quant_mode, KVQuantMode):
            object.__setattr__(self, "kv_quant_mode", KVQuantMode(self.kv_quant_mode))
        if self.kv_quant_mode is KVQuantMode.INT4_PER_TOKEN_HEAD:
            raise NotImplementedError(
                f"{owner}: the INT4_PER_TOKEN_HEAD page layout is the attention backend's "
                "and is not modelled by kvcy"
            )
        self._post_init_head_sizes()
        _check_int(owner, "page_size_padded", self.page_size_padded, optional=True)
        if self.page_size_padded is not None:
            unpadded = self._unpadded_page_size_bytes()
            if self.page_size_padded < unpadded:
                raise ValueError(
                    f"{owner}.page_size_padded ({self.page_size_padded}) is smaller than "
                    f"the real page size ({unpadded} bytes)"
                )

    def _post_init_head_sizes(self) -> None:
        """Hook for subclasses that carry a value head size."""

    @property
    def dtype_size(self) -> int:
        """Bytes per element of :attr:`dtype`."""
        return _DTYPE_SIZES[self._dtype_name]

    @property
    def torch_dtype(self) -> torch.dtype:
        """:attr:`dtype` as a ``torch.dtype`` (imports torch)."""
        if _is_torch_dtype(self.dtype):
            return self.dtype
        return _torch_dtype(self._dtype_name)

    @property
    def num_heads(self) -> int:
        return self.num_kv_heads

    def max_num_blocks_per_req(self, config: Any, max_len: int) -> int:
        _no_dcp(config)
        return cdiv(max_len, self.block_size)

    @property
    def state_content_size_bytes(self) -> int:
        hs = self.head_size
        if self.kv_quant_mode.is_nvfp4:
            hs = nvfp4_kv_cache_full_dim(hs)
        return 2 * hs * self.dtype_size

    @property
    def real_page_size_bytes(self) -> int:
        """Bytes of K and V of one block, without scales or padding."""
        return num_states_for(self.block_size, self.tokens_per_state) * self.num_heads * self.state_content_size_bytes

    def _unpadded_page_size_bytes(self) -> int:
        size = self.real_page_size_bytes
        if self.kv_quant_mode.is_per_token_head:
            # one float32 scale for K and one for V per (token, head), carved
            # from the same allocation
            size += 2 * self.block_size * self.num_kv_heads * 4
        return size

    @property
    def page_size_bytes(self) -> int:
        if self.page_size_padded is not None:
            return self.page_size_padded
        return self._unpadded_page_size_bytes()

    def copy_with_new_block_size(self, block_size: int):
        if self.page_size_padded is not None:
            ratio = block_size // self.block_size
            return replace(self, block_size=block_size, page_size_padded=self.page_size_padded * ratio)
        return replace(self, block_size=block_size)


@dataclass(frozen=True, kw_only=True)
class FullAttentionSpec(AttentionSpec):
    """Attention over every previous token: a request holds blocks for all of them.

    With the hybrid KV-cache manager disabled, sliding-window and chunked-local
    layers are managed as full attention (blocks for every token) while still
    computed with their window; such a spec records ``sliding_window`` or
    ``attention_chunk_size`` (never both).
    """

    head_size_v: int | None = None
    """Value head size; defaults to ``head_size``."""
    sliding_window: int | None = None
    attention_chunk_size: int | None = None
    non_causal: bool = False
    """Whether the layer attends non-causally (e.g. a prefix LM).  The layout is
    unchanged; the engine core reads it to turn off scheduling features that
    assume causal attention (chunked prefill, prefix caching)."""

    def _post_init_head_sizes(self) -> None:
        owner = type(self).__name__
        if self.head_size_v is None:
            object.__setattr__(self, "head_size_v", self.head_size)
        _check_int(owner, "head_size_v", self.head_size_v)
        _check_bool(owner, "non_causal", self.non_causal)
        _check_int(owner, "sliding_window", self.sliding_window, optional=True)
        _check_int(owner, "attention_chunk_size", self.attention_chunk_size, optional=True)
        if self.sliding_window is not None and self.attention_chunk_size is not None:
            raise ValueError(
                f"{owner} cannot have both sliding_window and attention_chunk_size "
                "(models mixing sliding-window and chunked-local layers are not supported)"
            )

    @property
    def state_content_size_bytes(self) -> int:
        hk, hv = self.head_size, self.head_size_v
        if self.kv_quant_mode.is_nvfp4:
            hk, hv = nvfp4_kv_cache_full_dim(hk), nvfp4_kv_cache_full_dim(hv)
        return (hk + hv) * self.dtype_size

    def max_memory_usage_bytes(self, config: Any) -> int:
        max_model_len = _setting(config, "max_model_len", "model_config")
        return cdiv(max_model_len, self.block_size) * self.page_size_bytes

    @classmethod
    def merge_window_sizes(cls, window_sizes: set[int]) -> int | None:
        """The one window size of a group (None if there is none).

        Raises:
            ValueError: the layers have different window sizes.
        """
        if not window_sizes:
            return None
        if len(window_sizes) == 1:
            return next(iter(window_sizes))
        raise ValueError(
            "All attention layers in the same KV cache group must have the same window size, "
            f"got {sorted(window_sizes)}."
        )

    def _merge_extra(self) -> dict[str, Any]:
        return {}

    @classmethod
    def merge(cls, specs: list):
        """Merge full-attention specs that differ at most in their recorded windows
        and causality (the merged spec is non-causal if any layer is).

        Raises:
            ValueError: an empty list, or differing window sizes (as in vLLM).
            AssertionError: a spec that is not full attention (or is MLA),
                differing attention parameters, or both sliding-window and
                chunked-local layers (as in vLLM).
        """
        if not specs:
            raise ValueError("cannot merge an empty list of KV cache specs")
        if not all(isinstance(spec, FullAttentionSpec) for spec in specs):
            raise AssertionError("All attention layers in the same KV cache group must be FullAttentionSpec.")
        if any(isinstance(spec, MLAAttentionSpec) for spec in specs):
            raise AssertionError("MLAAttentionSpec layers must be merged with MLAAttentionSpec.merge")
        windows = {s.sliding_window for s in specs if s.sliding_window is not None}
        chunks = {s.attention_chunk_size for s in specs if s.attention_chunk_size is not None}
        first = specs[0]
        sliding_window = cls.merge_window_sizes(windows)
        attention_chunk_size = cls.merge_window_sizes(chunks)
        if sliding_window is not None and attention_chunk_size is not None:
            raise AssertionError(
                "Model with both sliding window layers and chunked local attention layers is not supported."
            )
        merged = cls(
            block_size=first.block_size,
            block_stride_alignment=first.block_stride_alignment,
            dcp_sharded=first.dcp_sharded,
            max_tp_shards=first.max_tp_shards,
            num_kv_heads=first.num_kv_heads,
            head_size=first.head_size,
            head_size_v=first.head_size_v,
            dtype=first.dtype,
            kv_quant_mode=first.kv_quant_mode,
            page_size_padded=first.page_size_padded,
            tokens_per_state=first.tokens_per_state,
            sliding_window=sliding_window,
            attention_chunk_size=attention_chunk_size,
            # one non-causal layer makes the whole group non-causal
            non_causal=any(spec.non_causal for spec in specs),
            **first._merge_extra(),
        )
        _assert_same_attention(specs, merged, ["head_size_v"])
        for spec in specs:
            for name, value in first._merge_extra().items():
                if getattr(spec, name) != value:
                    raise AssertionError(
                        f"All layers in the same KV cache group must have the same {name} "
                        f"({getattr(spec, name)!r} != {value!r})."
                    )
        return merged


def _assert_same_attention(specs: list, merged: Any, extra: list[str] = ()) -> None:
    """Every compared attention field (and ``extra``) of every spec equals ``merged``'s."""
    names = [f.name for f in fields(AttentionSpec) if f.compare] + list(extra)
    for spec in specs:
        for name in names:
            if getattr(spec, name) != getattr(merged, name):
                raise AssertionError(
                    "All attention layers in the same KV cache group must have the same "
                    f"attention spec; {name} differs ({getattr(spec, name)!r} != {getattr(merged, name)!r})."
                )


@dataclass(frozen=True, kw_only=True)
class SinkFullAttentionSpec(FullAttentionSpec):
    """Full attention with ``sink_len`` learned sink tokens."""

    sink_len: int | None = None

    def _post_init_head_sizes(self) -> None:
        super()._post_init_head_sizes()
        _check_int(type(self).__name__, "sink_len", self.sink_len, minimum=0, optional=True)

    def _merge_extra(self) -> dict[str, Any]:
        return {"sink_len": self.sink_len}


@dataclass(frozen=True, kw_only=True)
class TQFullAttentionSpec(FullAttentionSpec):
    """Full attention whose (token, head) slot is ``tq_slot_size`` packed bytes when set."""

    tq_slot_size: int = 0

    def _post_init_head_sizes(self) -> None:
        super()._post_init_head_sizes()
        _check_int(type(self).__name__, "tq_slot_size", self.tq_slot_size, minimum=0)

    @property
    def state_content_size_bytes(self) -> int:
        if self.tq_slot_size > 0:
            return self.tq_slot_size
        return super().state_content_size_bytes

    def _merge_extra(self) -> dict[str, Any]:
        return {"tq_slot_size": self.tq_slot_size}


@dataclass(frozen=True, kw_only=True)
class MLAAttentionSpec(FullAttentionSpec):
    """Multi-head latent attention: one latent vector per token, no separate V.

    ``cache_dtype_str == "fp8_ds_mla"`` selects the 656-byte-per-token layout
    of DeepSeek V3.2's sparse MLA.
    """

    cache_dtype_str: str | None = None

    @property
    def num_heads(self) -> int:
        return 1

    @property
    def state_content_size_bytes(self) -> int:
        if self.cache_dtype_str == "fp8_ds_mla":
            return 656
        return self.num_kv_heads * self.head_size * self.dtype_size

    @classmethod
    def merge(cls, specs: list):
        """Merge MLA specs, which must agree on everything (including cache dtype).

        Raises:
            ValueError: an empty list.
            AssertionError: a spec that is not MLA, or specs that differ (as in vLLM).
        """
        if not specs:
            raise ValueError("cannot merge an empty list of KV cache specs")
        if not all(isinstance(spec, MLAAttentionSpec) for spec in specs):
            raise AssertionError("All attention layers in the same KV cache group must be MLAAttentionSpec.")
        if len({spec.cache_dtype_str for spec in specs}) != 1 or len({spec.tokens_per_state for spec in specs}) != 1:
            raise AssertionError(
                "All attention layers in the same KV cache group must use the same "
                "quantization method and tokens per state."
            )
        first = specs[0]
        merged = cls(
            block_size=first.block_size,
            block_stride_alignment=first.block_stride_alignment,
            dcp_sharded=first.dcp_sharded,
            max_tp_shards=first.max_tp_shards,
            num_kv_heads=first.num_kv_heads,
            head_size=first.head_size,
            dtype=first.dtype,
            kv_quant_mode=first.kv_quant_mode,
            page_size_padded=first.page_size_padded,
            tokens_per_state=first.tokens_per_state,
            cache_dtype_str=first.cache_dtype_str,
        )
        _assert_same_attention(specs, merged)
        return merged


@dataclass(frozen=True, kw_only=True)
class HiddenStateCacheSpec(MLAAttentionSpec):
    """Marks layers that cache hidden states (for hidden-state extraction)."""


@dataclass(frozen=True, kw_only=True)
class ChunkedLocalAttentionSpec(AttentionSpec):
    """Attention within fixed chunks of ``attention_chunk_size`` tokens (Llama 4 style)."""

    attention_chunk_size: int

    def _post_init_head_sizes(self) -> None:
        _check_int(type(self).__name__, "attention_chunk_size", self.attention_chunk_size)

    def max_admission_blocks_per_request(self, max_num_batched_tokens: int, max_model_len: int) -> int:
        """Most blocks one request can hold at once.

        Used both to size the pool at start-up and to admit requests at run
        time, so that a request the first accepts the second accepts too:
        one chunk of computed tokens plus one step of new ones, capped at the
        model length.
        """
        num_tokens = min(self.attention_chunk_size + max_num_batched_tokens, max_model_len)
        return cdiv(num_tokens, self.block_size)

    def max_memory_usage_bytes(self, config: Any) -> int:
        return _admission_capped_bytes(self, config)


@dataclass(frozen=True, kw_only=True)
class SlidingWindowSpec(AttentionSpec):
    """Attention over the last ``sliding_window`` tokens."""

    sliding_window: int
    head_size_v: int | None = None
    extra_retained_tokens: int = 0
    """Tokens below the window whose blocks are kept (not attended), for
    speculative decoding that re-prefills the last few tokens.  Only 0 is
    supported: kvcy's managers do not retain the extra blocks."""

    def _post_init_head_sizes(self) -> None:
        owner = type(self).__name__
        _check_int(owner, "sliding_window", self.sliding_window)
        if self.head_size_v is None:
            object.__setattr__(self, "head_size_v", self.head_size)
        _check_int(owner, "head_size_v", self.head_size_v)
        _check_int(owner, "extra_retained_tokens", self.extra_retained_tokens, minimum=0)
        if self.extra_retained_tokens:
            raise NotImplementedError(
                f"{owner}.extra_retained_tokens={self.extra_retained_tokens}: retaining blocks below the "
                "sliding window is not supported by kvcy's managers (only 0 is)"
            )

    @property
    def num_retained_tokens(self) -> int:
        """Tokens below a request's first scheduled position that must stay readable."""
        return self.sliding_window - 1 + self.extra_retained_tokens

    @property
    def state_content_size_bytes(self) -> int:
        hk, hv = self.head_size, self.head_size_v
        if self.kv_quant_mode.is_nvfp4:
            hk, hv = nvfp4_kv_cache_full_dim(hk), nvfp4_kv_cache_full_dim(hv)
        return (hk + hv) * self.dtype_size

    def max_admission_blocks_per_request(self, max_num_batched_tokens: int, max_model_len: int) -> int:
        """Most blocks one request can hold at once.

        The manager frees blocks that fell out of the window before each
        allocation, so a request holds at most ``sliding_window - 1`` computed
        tokens plus one step of new ones (capped at the model length), plus
        one block because the window need not start on a block boundary.
        """
        num_tokens = min(self.num_retained_tokens + max_num_batched_tokens, max_model_len)
        return cdiv(num_tokens, self.block_size) + 1

    def max_memory_usage_bytes(self, config: Any) -> int:
        return _admission_capped_bytes(self, config)


@dataclass(frozen=True, kw_only=True)
class SlidingWindowMLASpec(SlidingWindowSpec):
    """Sliding-window attention stored in the MLA (one latent per token) format."""

    cache_dtype_str: str | None = None

    @property
    def num_heads(self) -> int:
        return 1

    @property
    def state_content_size_bytes(self) -> int:
        return self.num_kv_heads * self.head_size * self.dtype_size

    @classmethod
    def merge(cls, specs: list):
        """Merge sliding-window MLA specs, which must be equal."""
        if not specs:
            raise ValueError("cannot merge an empty list of KV cache specs")
        if not all(isinstance(spec, SlidingWindowMLASpec) for spec in specs):
            raise AssertionError("All attention layers in the same KV cache group must be SlidingWindowMLASpec.")
        return KVCacheSpec.merge.__func__(cls, specs)


@dataclass(frozen=True, kw_only=True)
class MambaSpec(KVCacheSpec):
    """Recurrent (Mamba) state: a fixed-size state per request, not per token.

    ``shapes[i]`` and ``dtypes[i]`` describe the i-th state tensor (e.g. the
    conv state and the SSM state); one "block" holds one full state.
    """

    shapes: tuple[tuple[int, ...], ...]
    dtypes: tuple[Any, ...]
    page_size_padded: int | None = None
    mamba_type: str = "mamba2"
    mamba_cache_mode: str = "none"
    num_speculative_blocks: int = 0

    def __post_init__(self) -> None:
        super().__post_init__()
        owner = type(self).__name__
        try:
            shapes = tuple(tuple(int(d) for d in shape) for shape in self.shapes)
        except TypeError as exc:
            raise TypeError(f"{owner}.shapes must be a sequence of shapes (sequences of ints)") from exc
        if isinstance(self.dtypes, str) or not hasattr(self.dtypes, "__iter__"):
            raise TypeError(f"{owner}.dtypes must be a sequence of dtypes, got {self.dtypes!r}")
        dtypes = tuple(canonical_dtype(d) for d in self.dtypes)
        if not shapes:
            raise ValueError(f"{owner}.shapes must not be empty")
        if len(shapes) != len(dtypes):
            raise ValueError(f"{owner}.shapes has {len(shapes)} entries but dtypes has {len(dtypes)}")
        for shape in shapes:
            if any(d <= 0 for d in shape):
                raise ValueError(f"{owner}.shapes must have positive dimensions, got {shape}")
        object.__setattr__(self, "shapes", shapes)
        object.__setattr__(self, "dtypes", dtypes)
        _check_int(owner, "num_speculative_blocks", self.num_speculative_blocks, minimum=0)
        _check_int(owner, "page_size_padded", self.page_size_padded, optional=True)
        if self.page_size_padded is not None and self.page_size_padded < self.real_page_size_bytes:
            raise ValueError(
                f"{owner}.page_size_padded ({self.page_size_padded}) is smaller than "
                f"the real page size ({self.real_page_size_bytes} bytes)"
            )

    @property
    def num_heads(self) -> int:
        return 1

    @property
    def tokens_per_state(self) -> int:
        return -1

    @property
    def block_table_token_alignment(self) -> int | None:
        return None

    @property
    def state_content_size_bytes(self) -> int:
        return self.real_page_size_bytes

    @property
    def real_page_size_bytes(self) -> int:
        """Bytes of one full state, without padding."""
        return sum(prod(shape) * _DTYPE_SIZES[dtype] for shape, dtype in zip(self.shapes, self.dtypes))

    @property
    def page_size_bytes(self) -> int:
        if self.page_size_padded is not None:
            return self.page_size_padded
        return self.real_page_size_bytes

    def max_memory_usage_bytes(self, config: Any) -> int:
        cache_config = getattr(config, "cache_config", None)
        mode = getattr(cache_config, "mamba_cache_mode", None) or self.mamba_cache_mode
        if mode == "all":
            max_model_len = _setting(config, "max_model_len", "model_config")
            return cdiv(max_model_len, self.block_size) * self.page_size_bytes
        if mode == "align":
            return self.page_size_bytes * (2 + self.num_speculative_blocks)
        return self.page_size_bytes * (1 + self.num_speculative_blocks)

    def max_num_blocks_per_req(self, config: Any, max_len: int) -> int:
        # Mamba state is never sharded across context-parallel ranks.  In align
        # mode the block table is indexed by position over the whole sequence.
        cache_config = getattr(config, "cache_config", None)
        mode = getattr(cache_config, "mamba_cache_mode", None) or self.mamba_cache_mode
        if mode == "align":
            return cdiv(max_len, self.block_size) + self.num_speculative_blocks
        return cdiv(self.max_memory_usage_bytes(config), self.page_size_bytes)


@dataclass(frozen=True, kw_only=True)
class EncoderOnlyAttentionSpec(AttentionSpec):
    """Encoder-only attention: no KV cache is kept."""

    def max_memory_usage_bytes(self, config: Any) -> int:
        return 0


@dataclass(frozen=True, kw_only=True)
class CrossAttentionSpec(AttentionSpec):
    """Cross-attention of an encoder-decoder model: caches the encoder's K and V."""

    def max_memory_usage_bytes(self, config: Any) -> int:
        max_encoder_len = _setting(config, "max_num_encoder_input_tokens", "scheduler_config")
        return cdiv(max_encoder_len, self.block_size) * self.page_size_bytes


@dataclass(frozen=True, kw_only=True)
class UniformTypeKVCacheSpecs(KVCacheSpec):
    """Several layers of one attention type (maybe different shapes) as one spec.

    "One type" means the layers always need the same number of token slots:
    full attention with full attention, sliding window with the same window,
    chunked local with the same chunk, and so on.  One block of this spec is
    one page of every layer, so its page size is their sum.
    """

    kv_cache_specs: dict[str, KVCacheSpec]

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.kv_cache_specs:
            object.__setattr__(self, "dcp_sharded", self.first_spec.dcp_sharded)

    @property
    def first_spec(self) -> KVCacheSpec:
        """The spec of the first layer.

        Raises:
            ValueError: there are no layers.
        """
        if not self.kv_cache_specs:
            raise ValueError("UniformTypeKVCacheSpecs has no layer specs")
        return next(iter(self.kv_cache_specs.values()))

    @property
    def block_table_token_alignment(self) -> int | None:
        return self.first_spec.block_table_token_alignment

    @property
    def uses_slot_mapping(self) -> bool:
        return self.first_spec.uses_slot_mapping

    def get_max_layers_per_page_size(self) -> int:
        """How many layers share the most common page size (for a balanced
        group, the number of repetitions of the layer pattern)."""
        return Counter(spec.page_size_bytes for spec in self.kv_cache_specs.values()).most_common(1)[0][1]

    def max_memory_usage_pages(self, config: Any) -> int:
        """Most blocks (pages) one request can make this group hold."""
        return max(
            cdiv(spec.max_memory_usage_bytes(config), spec.page_size_bytes) for spec in self.kv_cache_specs.values()
        )

    def __hash__(self) -> int:
        return hash((self.block_size, tuple(sorted(self.kv_cache_specs.items(), key=lambda kv: kv[0]))))

    @property
    def prefix_cacheable(self) -> bool:
        return all(spec.prefix_cacheable for spec in self.kv_cache_specs.values())

    @property
    def prefix_replay_tokens(self) -> int:
        return max(spec.prefix_replay_tokens for spec in self.kv_cache_specs.values())

    @property
    def page_size_bytes(self) -> int:
        return sum(spec.page_size_bytes for spec in self.kv_cache_specs.values())

    def max_num_blocks_per_req(self, config: Any, max_len: int) -> int:
        """The layers' common block-table width.

        Raises:
            AssertionError: the layers need different widths (as in vLLM).
        """
        widths = {spec.max_num_blocks_per_req(config, max_len) for spec in self.kv_cache_specs.values()}
        assert len(widths) == 1, (
            "All layers in the same KV cache group must need the same number "
            f"of block table entries, got {sorted(widths)}."
        )
        return next(iter(widths))

    def max_memory_usage_bytes(self, config: Any) -> int:
        return self.max_memory_usage_pages(config) * self.page_size_bytes

    @classmethod
    def is_uniform_type(cls, kv_cache_specs: dict[str, KVCacheSpec]) -> bool:
        """Whether all layers have one block size and one attention type.

        Raises:
            ValueError: ``kv_cache_specs`` is empty.
            TypeError: a spec type this function does not know.
        """
        if not kv_cache_specs:
            raise ValueError("kv_cache_specs must not be empty")
        specs = list(kv_cache_specs.values())
        if len({spec.block_size for spec in specs}) > 1:
            return False
        if len({spec.dcp_sharded for spec in specs}) > 1:
            return False
        one = specs[0]
        # subclasses before their bases
        if isinstance(one, SlidingWindowMLASpec):
            return all(isinstance(s, SlidingWindowMLASpec) and s.sliding_window == one.sliding_window for s in specs)
        if isinstance(one, FullAttentionSpec):
            return all(isinstance(s, FullAttentionSpec) for s in specs)
        if isinstance(one, CrossAttentionSpec):
            return all(isinstance(s, CrossAttentionSpec) for s in specs)
        if isinstance(one, SlidingWindowSpec):
            return all(
                isinstance(s, SlidingWindowSpec)
                and not isinstance(s, SlidingWindowMLASpec)
                and s.sliding_window == one.sliding_window
                for s in specs
            )
        if isinstance(one, ChunkedLocalAttentionSpec):
            return all(
                isinstance(s, ChunkedLocalAttentionSpec) and s.attention_chunk_size == one.attention_chunk_size
                for s in specs
            )
        if isinstance(one, MambaSpec):
            return all(
                isinstance(s, MambaSpec) and s.num_speculative_blocks == one.num_speculative_blocks for s in specs
            )
        raise TypeError(f"Unsupported KV cache spec type: {type(one).__name__}")

    @classmethod
    def from_specs(cls, kv_cache_specs: dict[str, KVCacheSpec]) -> UniformTypeKVCacheSpecs | None:
        """The combined spec if all layers are of one type, else None."""
        if cls.is_uniform_type(kv_cache_specs):
            block_size = next(iter(kv_cache_specs.values())).block_size
            return cls(block_size=block_size, kv_cache_specs=dict(kv_cache_specs))
        return None


def iter_layer_specs(kv_cache_spec: KVCacheSpec) -> Collection[KVCacheSpec]:
    """The per-layer specs a group spec stands for.

    A :class:`UniformTypeKVCacheSpecs` holds one spec per layer; any other
    spec describes its whole group by itself.
    """
    if isinstance(kv_cache_spec, UniformTypeKVCacheSpecs):
        return kv_cache_spec.kv_cache_specs.values()
    return (kv_cache_spec,)


def is_full_attention_spec(kv_cache_spec: KVCacheSpec) -> bool:
    """Whether a group spec is, or wraps only, full attention.

    A :class:`UniformTypeKVCacheSpecs` is not a :class:`FullAttentionSpec`
    itself; it counts when every layer it holds is one (and it holds one).
    """
    layer_specs = iter_layer_specs(kv_cache_spec)
    return len(layer_specs) > 0 and all(isinstance(spec, FullAttentionSpec) for spec in layer_specs)


# ---------------------------------------------------------------------------
# Spec kinds (as published in KV events)
# ---------------------------------------------------------------------------


class KVCacheSpecKind(str, Enum):
    """The kind of a group's spec, as KV events publish it (``kv_cache_spec_kind``)."""

    FULL_ATTENTION = "full_attention"
    MLA_ATTENTION = "mla_attention"
    SLIDING_WINDOW = "sliding_window"
    SLIDING_WINDOW_MLA = "sliding_window_mla"
    MAMBA = "mamba"
    CHUNKED_LOCAL_ATTENTION = "chunked_local_attention"
    SINK_FULL_ATTENTION = "sink_full_attention"
    ENCODER_ONLY_ATTENTION = "encoder_only_attention"
    CROSS_ATTENTION = "cross_attention"
    UNKNOWN = "unknown"


# Spec class -> kind, most specific first (subclasses before their bases).
_SPEC_KINDS: tuple[tuple[type, KVCacheSpecKind], ...] = (
    (SlidingWindowMLASpec, KVCacheSpecKind.SLIDING_WINDOW_MLA),
    (MLAAttentionSpec, KVCacheSpecKind.MLA_ATTENTION),
    (SinkFullAttentionSpec, KVCacheSpecKind.SINK_FULL_ATTENTION),
    (FullAttentionSpec, KVCacheSpecKind.FULL_ATTENTION),
    (ChunkedLocalAttentionSpec, KVCacheSpecKind.CHUNKED_LOCAL_ATTENTION),
    (SlidingWindowSpec, KVCacheSpecKind.SLIDING_WINDOW),
    (MambaSpec, KVCacheSpecKind.MAMBA),
    (EncoderOnlyAttentionSpec, KVCacheSpecKind.ENCODER_ONLY_ATTENTION),
    (CrossAttentionSpec, KVCacheSpecKind.CROSS_ATTENTION),
)


def get_kv_cache_spec_kind(kv_cache_spec: KVCacheSpec) -> KVCacheSpecKind:
    """The :class:`KVCacheSpecKind` of a spec (most specific class wins).

    A :class:`UniformTypeKVCacheSpecs` has its layers' kind when they all
    share one, else ``UNKNOWN``.
    """
    if isinstance(kv_cache_spec, UniformTypeKVCacheSpecs):
        kinds = {get_kv_cache_spec_kind(s) for s in kv_cache_spec.kv_cache_specs.values()}
        return next(iter(kinds)) if len(kinds) == 1 else KVCacheSpecKind.UNKNOWN
    for spec_class, kind in _SPEC_KINDS:
        if isinstance(kv_cache_spec, spec_class):
            return kind
    return KVCacheSpecKind.UNKNOWN


def get_kv_cache_spec_sliding_window(kv_cache_spec: KVCacheSpec) -> int | None:
    """The window of a sliding-window spec, else None.

    A full-attention spec that merely records a window (hybrid manager off)
    gives None: its blocks are managed as full attention.
    """
    if isinstance(kv_cache_spec, UniformTypeKVCacheSpecs):
        windows = {get_kv_cache_spec_sliding_window(s) for s in kv_cache_spec.kv_cache_specs.values()}
        return next(iter(windows)) if len(windows) == 1 else None
    if isinstance(kv_cache_spec, SlidingWindowSpec):
        return kv_cache_spec.sliding_window
    return None


# ---------------------------------------------------------------------------
# Tensors, groups, configs
# ---------------------------------------------------------------------------


@dataclass(init=False)
class KVCacheTensor:
    """Where a set of same-shaped layers lives in one KV-cache allocation.

    vLLM's form: layer ``layers[l]``'s page for block ``b`` starts at byte
    ``offset + l * layer_stride + b * block_stride`` of an allocation of
    ``size`` bytes.  Tensors whose byte ranges overlap alias each other (cache
    groups overlay, which is sound because a block id belongs to one group at
    a time).

    kvcy's sizing layer also writes an older form, ``KVCacheTensor(size=...,
    shared_by=[[layer, ...], ...])``: one allocation with ``len(shared_by)``
    layer slots, the layers of one slot aliasing each other and the physical
    order left to :func:`reshape_kv_cache`; its ``layers`` list every layer
    slot by slot and its strides are None.

    Raises:
        TypeError / ValueError: malformed sizes, strides or layer names, or
            both forms (or neither) given.
        NotImplementedError: ``host_resident=True`` (HiSparse host pool).
    """

    size: int
    layers: list[str]
    layer_stride: int | None
    block_stride: int | None
    offset: int = 0
    host_resident: bool = False
    _shared_by: list[list[str]] | None = field(default=None, repr=False, init=False)

    def __init__(
        self,
        size: int,
        layers: list[str] | None = None,
        layer_stride: int | None = None,
        block_stride: int | None = None,
        offset: int = 0,
        host_resident: bool = False,
        *,
        shared_by: list[list[str]] | None = None,
    ) -> None:
        _check_int("KVCacheTensor", "size", size, minimum=0)
        _check_int("KVCacheTensor", "offset", offset, minimum=0)
        _check_bool("KVCacheTensor", "host_resident", host_resident)
        if host_resident:
            raise NotImplementedError("KVCacheTensor.host_resident: HiSparse host-resident KV is not supported")
        if shared_by is not None:
            if layers is not None or layer_stride is not None or block_stride is not None or offset:
                raise ValueError("KVCacheTensor takes either shared_by or layers/layer_stride/block_stride/offset")
            if not isinstance(shared_by, list) or not all(
                isinstance(slot, list) and all(isinstance(n, str) for n in slot) for slot in shared_by
            ):
                raise TypeError("KVCacheTensor.shared_by must be a list of lists of layer names")
            layers = [name for slot in shared_by for name in slot]
        else:
            if layers is None or layer_stride is None or block_stride is None:
                raise TypeError("KVCacheTensor needs layers, layer_stride and block_stride (or shared_by)")
            if not isinstance(layers, list) or not all(isinstance(n, str) for n in layers):
                raise TypeError(f"KVCacheTensor.layers must be a list of layer names, got {layers!r}")
            _check_int("KVCacheTensor", "layer_stride", layer_stride, minimum=0)
            _check_int("KVCacheTensor", "block_stride", block_stride, minimum=0)
        self.size = size
        self.layers = layers
        self.layer_stride = layer_stride
        self.block_stride = block_stride
        self.offset = offset
        self.host_resident = host_resident
        self._shared_by = shared_by

    @property
    def shared_by(self) -> list[list[str]]:
        """The layer slots (``L``), each listing the layers that alias it."""
        if self._shared_by is not None:
            return self._shared_by
        return [[name] for name in self.layers]

    @property
    def num_layer_slots(self) -> int:
        """Number of layer slots (``L``) in this allocation."""
        return len(self.shared_by)

    @property
    def layer_names(self) -> list[str]:
        """Every layer backed by this allocation, slot by slot."""
        return [name for slot in self.shared_by for name in slot]

    def page_offset(self, layer_index: int, block_id: int) -> int:
        """Byte offset of layer ``layers[layer_index]``'s page of block ``block_id`` (vLLM's form)."""
        if self.layer_stride is None or self.block_stride is None:
            raise ValueError("a shared_by KVCacheTensor has no strides; its layout is reshape_kv_cache's")
        return self.offset + layer_index * self.layer_stride + block_id * self.block_stride


class KVCacheGroupRole(str, Enum):
    """What a cache group is for: an ordinary group, or one of HiSparse's two
    (its device-side source and its indexer), which kvcy does not support."""

    DEFAULT = "default"
    HISPARSE_SOURCE = "hisparse_source"
    HISPARSE_INDEXER = "hisparse_indexer"


@dataclass
class KVCacheGroupSpec:
    """Layers sharing one block table; the manager treats them as one layer."""

    layer_names: list[str]
    kv_cache_spec: KVCacheSpec
    is_eagle_group: bool = False
    """Whether the group holds EAGLE/MTP draft layers."""
    host_resident: bool = False
    """Whether the group lives in the HiSparse host pool (not supported)."""
    enable_kv_transfer: bool = True
    """Whether the group is part of the KV state a connector transfers."""
    role: KVCacheGroupRole = KVCacheGroupRole.DEFAULT
    """The group's role; only ``DEFAULT`` is supported (the others are HiSparse's)."""

    def __post_init__(self) -> None:
        for name in ("is_eagle_group", "host_resident", "enable_kv_transfer"):
            _check_bool("KVCacheGroupSpec", name, getattr(self, name))
        if not isinstance(self.role, KVCacheGroupRole):
            try:
                self.role = KVCacheGroupRole(self.role)
            except ValueError:
                raise ValueError(
                    f"KVCacheGroupSpec.role must be one of {[r.value for r in KVCacheGroupRole]}, got {self.role!r}"
                ) from None
        if self.role is not KVCacheGroupRole.DEFAULT:
            raise NotImplementedError(
                f"KVCacheGroupSpec.role={self.role.value!r}: HiSparse cache groups are not supported"
            )
        if self.host_resident:
            raise NotImplementedError("KVCacheGroupSpec.host_resident: HiSparse host-resident KV is not supported")


@dataclass
class KVCacheConfig:
    """How many blocks, which allocations and which layer groups a model's KV cache has."""

    num_blocks: int
    kv_cache_tensors: list[KVCacheTensor]
    kv_cache_groups: list[KVCacheGroupSpec]
    prefix_cache_retention_interval: int | None = None
    """Token interval of retained sliding-window / Mamba prefix-cache
    checkpoints; None retains them densely (the only mode kvcy implements)."""
    kv_cache_layout: str | None = None
    """Name of the physical KV-cache layout the engine core chose for all
    workers (None: not resolved).  The manager does not read it."""
    hash_block_size: int | None = None
    """Tokens per prefix-cache block hash, as the engine core resolved it
    (None: not resolved).  kvcy's manager takes its hash block size as an
    argument, as vLLM's does."""
    cache_hit_alignment_tokens: int | None = None
    """Token granularity of prefix-cache hits, as the engine core resolved it
    (None: not resolved)."""
    hisparse_host_num_blocks: int | None = None
    """Blocks of the HiSparse host pool; only None (HiSparse off) is supported."""
    hisparse_host_block_stride: int | None = None
    """Bytes between HiSparse host blocks; only None (HiSparse off) is supported."""
    hisparse_shared_host_pool: bool = False
    """Whether TP ranks share one HiSparse host pool; only False is supported."""
    kv_tp_replicas: int = 1
    """Consecutive tensor-parallel ranks that hold identical KV for every
    layer (1: no replicas)."""

    def __post_init__(self) -> None:
        if self.kv_cache_layout is not None and not isinstance(self.kv_cache_layout, str):
            raise TypeError(
                "KVCacheConfig.kv_cache_layout must be a string or None, "
                f"got {type(self.kv_cache_layout).__name__}: {self.kv_cache_layout!r}"
            )
        _check_int("KVCacheConfig", "hash_block_size", self.hash_block_size, optional=True)
        _check_int("KVCacheConfig", "cache_hit_alignment_tokens", self.cache_hit_alignment_tokens, optional=True)
        _check_int("KVCacheConfig", "kv_tp_replicas", self.kv_tp_replicas)
        _check_bool("KVCacheConfig", "hisparse_shared_host_pool", self.hisparse_shared_host_pool)
        for name, off in (
            ("hisparse_host_num_blocks", None),
            ("hisparse_host_block_stride", None),
            ("hisparse_shared_host_pool", False),
        ):
            if getattr(self, name) is not off:
                raise NotImplementedError(f"KVCacheConfig.{name}: HiSparse host-resident KV is not supported")

    @cached_property
    def transfer_group_ids(self) -> tuple[int, ...]:
        """Ids of the groups that take part in external KV transfer."""
        return tuple(i for i, g in enumerate(self.kv_cache_groups) if g.enable_kv_transfer)

    @cached_property
    def prefix_cacheable_group_ids(self) -> tuple[int, ...]:
        """Ids of the transferable groups whose spec takes part in prefix caching."""
        return tuple(
            i for i in self.transfer_group_ids if self.kv_cache_groups[i].kv_cache_spec.prefix_cacheable
        )

    @cached_property
    def prefix_cacheable_groups(self) -> tuple[KVCacheGroupSpec, ...]:
        """The groups of :attr:`prefix_cacheable_group_ids`."""
        return tuple(self.kv_cache_groups[i] for i in self.prefix_cacheable_group_ids)

    @cached_property
    def transfer_groups(self) -> tuple[KVCacheGroupSpec, ...]:
        """The groups of :attr:`transfer_group_ids`."""
        return tuple(self.kv_cache_groups[i] for i in self.transfer_group_ids)

    @cached_property
    def transfer_group_index_by_layer(self) -> dict[str, int]:
        """For each layer of a transferable group, that group's index in :attr:`transfer_groups`."""
        return {name: index for index, group in enumerate(self.transfer_groups) for name in group.layer_names}

    def select_transfer_block_ids(self, block_ids: Sequence[list[int]]) -> tuple[list[int], ...]:
        """The entries of a per-group ``block_ids`` that belong to transferable groups.

        Raises:
            ValueError: ``block_ids`` does not have one entry per group.
        """
        if len(block_ids) != len(self.kv_cache_groups):
            raise ValueError(f"Expected {len(self.kv_cache_groups)} KV cache groups, got {len(block_ids)}.")
        return tuple(block_ids[i] for i in self.transfer_group_ids)

    @property
    def host_group_ids(self) -> tuple[int, ...]:
        """Ids of host-resident (HiSparse) groups: always empty in kvcy."""
        return tuple(i for i, g in enumerate(self.kv_cache_groups) if g.host_resident)

    def num_blocks_of(self, tensor: KVCacheTensor) -> int:
        """Blocks the pool behind ``tensor`` can address (the device pool's, in kvcy)."""
        if not tensor.host_resident:
            return self.num_blocks
        assert self.hisparse_host_num_blocks is not None
        return self.hisparse_host_num_blocks

    @property
    def has_mamba_layers(self) -> bool:
        return any(
            isinstance(spec, MambaSpec) for g in self.kv_cache_groups for spec in iter_layer_specs(g.kv_cache_spec)
        )

    @property
    def has_mixed_precision_kv_cache(self) -> bool:
        """Whether the attention layers use more than one (dtype, quant mode)."""
        precisions = {
            (spec._dtype_name, spec.kv_quant_mode)
            for g in self.kv_cache_groups
            for spec in iter_layer_specs(g.kv_cache_spec)
            if isinstance(spec, AttentionSpec)
        }
        return len(precisions) > 1

    @property
    def needs_kv_cache_zeroing(self) -> bool:
        """Whether new blocks must be zeroed before use.

        Mamba state is read before it is fully written, and with mixed
        precisions a block reused by another group would decode stale bytes
        under another dtype.
        """
        return self.has_mamba_layers or self.has_mixed_precision_kv_cache


# ---------------------------------------------------------------------------
# Physical layouts
# ---------------------------------------------------------------------------

# logical axes of the 5D cache shape
DIM_L, DIM_B, DIM_H, DIM_N, DIM_C = 0, 1, 2, 3, 4

_LAYOUT_ALIASES = {"NHD": "LBNHC", "HND": "LBHNC"}


class KVCacheLayout(Enum):
    """Physical order of the logical cache shape ``[L, B, H, N, C]``.

    ``L`` = layer slots sharing one allocation, ``B`` = blocks, ``H`` = kv
    heads, ``N`` = states (tokens) per block, ``C`` = content of one state of
    one head.  A member's value (:attr:`stride_order`) lists the logical axes
    from the outermost to the innermost in memory; ``C`` is always innermost.
    """

    LBHNC = (0, 1, 2, 3, 4)
    LBNHC = (0, 1, 3, 2, 4)
    LHBNC = (0, 2, 1, 3, 4)
    BLHNC = (1, 0, 2, 3, 4)
    BLNHC = (1, 0, 3, 2, 4)
    BHLNC = (1, 2, 0, 3, 4)

    @property
    def stride_order(self) -> tuple[int, ...]:
        """Logical axes (0..4 = L, B, H, N, C) from outermost to innermost in memory."""
        return self.value

    @property
    def layer_view_order(self) -> tuple[int, ...]:
        """Physical order of the axes of one layer's 4D ``[B, H, N, C]`` view (0..3)."""
        return tuple(d - 1 for d in self.value if d != DIM_L)

    @property
    def is_layer_compact(self) -> bool:
        """Whether ``L`` is outermost (each layer slot is one contiguous run)."""
        return self.value[0] == DIM_L

    @property
    def is_block_contiguous(self) -> bool:
        """Whether ``[H, N, C]`` of one block of one layer is contiguous."""
        return self.value[-3:] == (DIM_H, DIM_N, DIM_C)

    @property
    def is_block_compact(self) -> bool:
        """Whether ``L`` and ``B`` are the two outermost axes (one page = one run)."""
        return set(self.value[:2]) == {DIM_L, DIM_B}

    @property
    def is_block_outermost(self) -> bool:
        """Whether ``B`` is the outermost axis."""
        return self.value[0] == DIM_B

    @classmethod
    def from_name(cls, name: str) -> KVCacheLayout:
        """A layout by name; ``"NHD"`` and ``"HND"`` are accepted as aliases.

        Raises:
            ValueError: unknown name.
        """
        key = name.strip().upper()
        key = _LAYOUT_ALIASES.get(key, key)
        try:
            return cls[key]
        except KeyError:
            raise ValueError(
                f"unknown KV cache layout {name!r}; choose from {[m.name for m in cls] + list(_LAYOUT_ALIASES)}"
            ) from None


# ---------------------------------------------------------------------------
# Shapes and views
# ---------------------------------------------------------------------------


def num_states_for(block_size: int, tokens_per_state: int) -> int:
    """States (``N``) in a block of ``block_size`` tokens; 1 for recurrent state (-1).

    Raises:
        ValueError: non-positive block size, or tokens_per_state that is
            neither -1 nor a positive divisor of block_size.
    """
    _check_int("num_states_for", "block_size", block_size)
    if tokens_per_state == -1:
        return 1
    _check_tokens_per_state("num_states_for", tokens_per_state)
    if block_size % tokens_per_state:
        raise ValueError(f"block_size {block_size} is not a multiple of tokens_per_state {tokens_per_state}")
    return int(block_size // tokens_per_state)


def compute_layer_kv_cache_shape_bytes(
    spec: KVCacheSpec,
    num_blocks: int,
    block_size: int | None = None,
) -> tuple[int, int, int, int]:
    """The logical 4D shape ``(B, H, N, C)`` of one layer, ``C`` in bytes.

    Args:
        spec: the layer's spec.
        num_blocks: number of KV-cache blocks (pages).
        block_size: a kernel block size dividing ``spec.block_size``; each
            page is then split into ``spec.block_size // block_size`` kernel
            blocks.  Defaults to the spec's block size.

    Raises:
        ValueError: non-positive sizes or a block size that does not divide
            the spec's.
    """
    _check_int("compute_layer_kv_cache_shape_bytes", "num_blocks", num_blocks, minimum=0)
    bs = spec.block_size if block_size is None else block_size
    _check_int("compute_layer_kv_cache_shape_bytes", "block_size", bs)
    if spec.block_size % bs:
        raise ValueError(f"kernel block size {bs} must divide the KV cache block size {spec.block_size}")
    per_page = spec.block_size // bs
    return (
        num_blocks * per_page,
        spec.num_heads,
        num_states_for(bs, spec.tokens_per_state),
        spec.state_content_size_bytes,
    )


def _layout_byte_strides(
    shape5: tuple[int, ...], layout: KVCacheLayout, cell_bytes: int, total_bytes: int
) -> list[int]:
    """Byte strides, in logical ``[L, B, H, N, C]`` order, of a cache laid out by ``layout``.

    ``cell_bytes`` is the memory of one (layer slot, block) cell, at least
    ``H * N * C``; the difference is padding (page padding or per-token scales).
    Where a cell is one contiguous run (``L`` and ``B`` outermost, in either
    order) the padding sits at the end of each cell, so a block's stride is
    the page size; otherwise it sits at the end of each slice of the outermost
    axis.  Either way the whole cache spans ``total_bytes``.
    """
    order = layout.stride_order
    strides = [0] * 5
    acc = 1
    for depth, dim in enumerate(reversed(order)):
        strides[dim] = acc
        acc *= shape5[dim]
        if depth == 2 and layout.is_block_compact:
            acc = cell_bytes
    if not layout.is_block_compact:
        outer = order[0]
        if shape5[outer]:
            strides[outer] = total_bytes // shape5[outer]
    return strides


def reshape_kv_cache(
    raw: torch.Tensor,
    spec: KVCacheSpec,
    num_blocks: int,
    num_layer_slots: int,
    layout: KVCacheLayout,
    block_size: int | None = None,
) -> list[torch.Tensor]:
    """View a flat byte buffer as one ``[B, H, N, C]`` tensor per layer slot.

    The buffer holds ``num_layer_slots * num_blocks`` pages in the physical
    order ``layout`` gives; each returned tensor is a view (no copy) with
    logical axes ``[B, H, N, C]`` in the spec's dtype (``C`` in elements).
    Specs without one dtype (Mamba) are viewed as bytes (``torch.int8``).

    Args:
        raw: a 1-D ``torch.int8`` or ``torch.uint8`` tensor of at least
            ``num_layer_slots * num_blocks * spec.page_size_bytes`` bytes.
        spec: the spec shared by the slots.
        num_blocks: number of blocks per slot.
        num_layer_slots: number of layer slots (``L``).
        layout: physical order of ``[L, B, H, N, C]``.
        block_size: optional kernel block size (see
            :func:`compute_layer_kv_cache_shape_bytes`).

    Raises:
        ValueError: a buffer that is not 1-D bytes or too small, non-positive
            sizes, or sizes not aligned to the dtype.
    """
    import torch

    if not isinstance(layout, KVCacheLayout):
        raise TypeError(f"layout must be a KVCacheLayout, got {layout!r}")
    if not isinstance(raw, torch.Tensor):
        raise TypeError(f"raw must be a torch.Tensor, got {type(raw).__name__}")
    if raw.dtype not in (torch.int8, torch.uint8) or raw.dim() != 1:
        raise ValueError(f"raw must be a 1-D int8 or uint8 tensor, got {raw.dtype} with shape {tuple(raw.shape)}")
    if not raw.is_contiguous():
        raise ValueError("raw must be contiguous")
    _check_int("reshape_kv_cache", "num_layer_slots", num_layer_slots)
    _check_int("reshape_kv_cache", "num_blocks", num_blocks)

    b, h, n, c_bytes = compute_layer_kv_cache_shape_bytes(spec, num_blocks, block_size)
    per_page = b // num_blocks
    page = spec.page_size_bytes
    if page % per_page:
        raise ValueError(f"page size {page} does not split into {per_page} kernel blocks")
    cell = page // per_page
    if h * n * c_bytes > cell:
        raise ValueError(f"spec content ({h}x{n}x{c_bytes} bytes) does not fit its page ({cell} bytes)")
    total = num_layer_slots * num_blocks * page
    if raw.numel() < total:
        raise ValueError(
            f"raw has {raw.numel()} bytes but {num_layer_slots} slots x {num_blocks} blocks x "
            f"{page}-byte pages need {total}"
        )

    if isinstance(spec, AttentionSpec):
        dtype = spec.torch_dtype
        item = spec.dtype_size
    else:
        dtype = torch.int8
        item = 1
    shape5 = (num_layer_slots, b, h, n, c_bytes)
    strides = _layout_byte_strides(shape5, layout, cell, total)
    strides[DIM_C] = item  # one element
    if c_bytes % item or any(s % item for s in strides):
        raise ValueError(f"strides {strides} are not multiples of the {item}-byte element size of {dtype}")
    if raw.storage_offset() % item:
        raise ValueError(f"raw starts at byte offset {raw.storage_offset()}, not aligned to {item} bytes")

    typed = raw[:total].view(torch.uint8 if raw.dtype == torch.uint8 else torch.int8).view(dtype)
    size4 = (b, h, n, c_bytes // item)
    stride4 = tuple(s // item for s in strides[1:])
    base = typed.storage_offset()
    return [
        torch.as_strided(typed, size=size4, stride=stride4, storage_offset=base + i * strides[0] // item)
        for i in range(num_layer_slots)
    ]
