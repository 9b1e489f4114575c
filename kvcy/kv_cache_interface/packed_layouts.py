"""Packed page layouts that vLLM 0.33.0's attention backends publish on a spec.

A spec's page size never depends on its quantization mode by itself: the
backend that will read the cache says how it packs a page, through
``num_head_slots`` and ``state_content_bytes`` (vLLM's
``AttentionBackend.customize_spec``).  :func:`customize_spec` applies the
layouts of the backends vLLM picks by default for each mode, so that code
building specs without vLLM (``kvcy.plan``) sizes pages as vLLM would.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TypeVar

from kvcy.kv_cache_interface.attention import AttentionSpec
from kvcy.kv_cache_interface.mla import MLAAttentionSpec, SlidingWindowMLASpec
from kvcy.kv_cache_interface.quant import KVQuantMode, nvfp4_kv_cache_full_dim

__all__ = ["MLA_PACKED_STATE_BYTES", "customize_spec"]

#: Bytes per token of the opaque sparse-MLA cache formats (NoPE, RoPE and
#: scales in one blob), which vLLM's MLA layer publishes as ``state_content_bytes``.
MLA_PACKED_STATE_BYTES: dict[str, int] = {"fp8_ds_mla": 656, "nvfp4_ds_mla": 352}

# one float32 scale for K and one for V per (token, head slot)
_PER_TOKEN_HEAD_SCALE_BYTES = 2 * 4

_SpecT = TypeVar("_SpecT", bound=AttentionSpec)


def customize_spec(spec: _SpecT) -> _SpecT:
    """``spec`` with the packed layout its quantization mode's default backend publishes.

    - per-token-head modes (int8, fp8, int4): each state carries its K and V
      data (int4: two values per byte) followed by one float32 scale for K and
      one for V (vLLM's Triton backend; for MLA, the latent and the scale pair,
      as vLLM's MLA backends lay it out);
    - NVFP4 (not MLA): K and V in separate head slots (``2 * num_kv_heads``),
      each of packed fp4 values plus fp8 block scales (vLLM's FlashInfer backend).

    A spec that already has ``state_content_bytes``, or another mode, is returned as is.

    Raises:
        AssertionError: NVFP4 with different K and V head sizes (as in vLLM).
    """
    if spec.state_content_bytes is not None:
        return spec
    mode = spec.kv_quant_mode
    int4 = mode is KVQuantMode.INT4_PER_TOKEN_HEAD
    if isinstance(spec, (MLAAttentionSpec, SlidingWindowMLASpec)):
        if not mode.is_per_token_head:
            return spec
        latent = spec.head_size // 2 if int4 else spec.head_size
        return replace(spec, state_content_bytes=latent * spec.dtype_size + _PER_TOKEN_HEAD_SCALE_BYTES)
    if mode.is_per_token_head:
        hk, hv = spec.head_size, spec.head_size_v
        if int4:
            hk, hv = hk // 2, hv // 2
        return replace(spec, state_content_bytes=(hk + hv) * spec.dtype_size + _PER_TOKEN_HEAD_SCALE_BYTES)
    if mode.is_nvfp4:
        hk, hv = nvfp4_kv_cache_full_dim(spec.head_size), nvfp4_kv_cache_full_dim(spec.head_size_v)
        assert hk == hv, "nvfp4 with asymmetric K/V head sizes not yet supported"
        return replace(spec, num_head_slots=2 * spec.num_kv_heads, state_content_bytes=hk * spec.dtype_size)
    return spec
