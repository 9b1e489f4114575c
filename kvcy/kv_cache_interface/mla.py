"""Multi-head latent attention: :class:`MLAAttentionSpec`, :class:`HiddenStateCacheSpec`
and :class:`SlidingWindowMLASpec`."""

from __future__ import annotations

from dataclasses import dataclass

from kvcy.kv_cache_interface.base import KVCacheSpec
from kvcy.kv_cache_interface.full_attention import FullAttentionSpec, _assert_same_attention
from kvcy.kv_cache_interface.sliding_window import SlidingWindowSpec


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
