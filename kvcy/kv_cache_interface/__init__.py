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

Parameters of features kvcy leaves out (connector paths) are accepted at their
"off" values and raise ``NotImplementedError`` naming the feature otherwise.
HiSparse groups and specs are built and sized as vLLM does; only the
managers refuse them (``NotImplementedError``).  Page
sizes follow vLLM 0.33.0's formula from the spec's fields alone; packed
quantized layouts are published in ``num_head_slots`` / ``state_content_bytes``
(:func:`customize_spec` gives the default backends' ones).

The package holds one module per concept: ``dtypes`` and ``quant`` (element
types and quantization modes), ``base`` (:class:`KVCacheSpec`,
:class:`MultipleOf`), ``attention``, ``full_attention``, ``rswa``, ``sliding_window``,
``chunked_local``, ``circular_buffer``, ``mla``, ``mamba``, ``encoder_attention`` and
``hisparse`` (the spec families), ``registry`` (:class:`KVCacheSpecRegistry`: managers and
grouping bases of spec classes), ``uniform`` (:class:`UniformTypeKVCacheSpecs`), ``kinds`` (spec
kinds of KV events), ``tensor`` and ``config`` (:class:`KVCacheTensor`, the
groups and :class:`KVCacheConfig`), ``layout`` and ``views`` (physical layouts
and :func:`reshape_kv_cache`), ``packed_layouts`` (what backends publish for
quantized pages: :func:`customize_spec`).  Every public name is importable from here.
"""

from __future__ import annotations

from kvcy.kv_cache_interface._checks import cdiv
from kvcy.kv_cache_interface.attention import AttentionSpec
from kvcy.kv_cache_interface.base import KVCacheSpec, MultipleOf, num_states_for, replace_as
from kvcy.kv_cache_interface.chunked_local import ChunkedLocalAttentionSpec
from kvcy.kv_cache_interface.circular_buffer import CircularBufferSpec
from kvcy.kv_cache_interface.config import KVCacheConfig, KVCacheGroupRole, KVCacheGroupSpec
from kvcy.kv_cache_interface.dtypes import canonical_dtype, get_dtype_size
from kvcy.kv_cache_interface.encoder_attention import CrossAttentionSpec, EncoderOnlyAttentionSpec
from kvcy.kv_cache_interface.full_attention import FullAttentionSpec, SinkFullAttentionSpec, TQFullAttentionSpec
from kvcy.kv_cache_interface.hisparse import HiSparseHotSpec, HiSparseResidentSpec
from kvcy.kv_cache_interface.kinds import KVCacheSpecKind, get_kv_cache_spec_kind, get_kv_cache_spec_sliding_window
from kvcy.kv_cache_interface.layout import DIM_B, DIM_C, DIM_H, DIM_L, DIM_N, KVCacheLayout
from kvcy.kv_cache_interface.mamba import MambaSpec
from kvcy.kv_cache_interface.mla import HiddenStateCacheSpec, MLAAttentionSpec, SlidingWindowMLASpec, SparseCacheRole
from kvcy.kv_cache_interface.packed_layouts import MLA_PACKED_STATE_BYTES, customize_spec
from kvcy.kv_cache_interface.quant import (
    KVQuantMode,
    get_kv_quant_mode,
    is_quantized_kv_cache,
    kv_cache_uses_per_token_head_scales,
    nvfp4_kv_cache_full_dim,
)
from kvcy.kv_cache_interface.rswa import RSWASpec
from kvcy.kv_cache_interface.registry import KVCacheSpecMetadata, KVCacheSpecRegistry, register_kv_cache_spec
from kvcy.kv_cache_interface.sliding_window import SlidingWindowSpec
from kvcy.kv_cache_interface.tensor import KVCacheTensor
from kvcy.kv_cache_interface.uniform import UniformTypeKVCacheSpecs, is_full_attention_spec, iter_layer_specs
from kvcy.kv_cache_interface.views import compute_layer_kv_cache_shape_bytes, reshape_kv_cache

__all__ = [
    "AttentionSpec",
    "ChunkedLocalAttentionSpec",
    "CircularBufferSpec",
    "CrossAttentionSpec",
    "EncoderOnlyAttentionSpec",
    "FullAttentionSpec",
    "HiddenStateCacheSpec",
    "HiSparseHotSpec",
    "HiSparseResidentSpec",
    "KVCacheConfig",
    "KVCacheGroupRole",
    "KVCacheGroupSpec",
    "KVCacheLayout",
    "KVCacheSpec",
    "KVCacheSpecKind",
    "KVCacheSpecMetadata",
    "KVCacheSpecRegistry",
    "KVCacheTensor",
    "KVQuantMode",
    "MLAAttentionSpec",
    "MLA_PACKED_STATE_BYTES",
    "MambaSpec",
    "MultipleOf",
    "RSWASpec",
    "SinkFullAttentionSpec",
    "SlidingWindowMLASpec",
    "SlidingWindowSpec",
    "SparseCacheRole",
    "TQFullAttentionSpec",
    "UniformTypeKVCacheSpecs",
    "canonical_dtype",
    "cdiv",
    "compute_layer_kv_cache_shape_bytes",
    "customize_spec",
    "get_dtype_size",
    "get_kv_cache_spec_kind",
    "get_kv_cache_spec_sliding_window",
    "get_kv_quant_mode",
    "is_full_attention_spec",
    "is_quantized_kv_cache",
    "iter_layer_specs",
    "kv_cache_uses_per_token_head_scales",
    "num_states_for",
    "register_kv_cache_spec",
    "replace_as",
    "reshape_kv_cache",
]


def __getattr__(name: str):
    # vLLM defines its Mamba prefill-checkpoint helpers in kv_cache_interface; kvcy's
    # live with the Mamba manager in the selected twin (read lazily: the twins import
    # this package).
    if name in ("get_mamba_prefill_checkpoint_position", "is_mamba_prefill_checkpoint_valid"):
        from kvcy._fast import kv_cache

        return getattr(kv_cache, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
