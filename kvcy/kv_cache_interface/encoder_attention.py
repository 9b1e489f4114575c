"""Encoder-side attention: :class:`EncoderOnlyAttentionSpec` and :class:`CrossAttentionSpec`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kvcy.kv_cache_interface._checks import _setting, cdiv
from kvcy.kv_cache_interface.attention import AttentionSpec


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
