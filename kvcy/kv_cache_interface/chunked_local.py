"""Chunked local attention: :class:`ChunkedLocalAttentionSpec`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kvcy.kv_cache_interface._checks import _admission_capped_bytes, _check_int, cdiv
from kvcy.kv_cache_interface.attention import AttentionSpec
from kvcy.kv_cache_interface.base import KVCacheSpec


@dataclass(frozen=True, kw_only=True)
class ChunkedLocalAttentionSpec(AttentionSpec):
    """Attention within fixed chunks of ``attention_chunk_size`` tokens (Llama 4 style)."""

    attention_chunk_size: int

    def _post_init_head_sizes(self) -> None:
        _check_int(type(self).__name__, "attention_chunk_size", self.attention_chunk_size)

    def max_admission_blocks_per_request(self, max_in_flight_tokens: int, max_model_len: int) -> int:
        """Most blocks one request can hold at once.

        Used both to size the pool at start-up and to admit requests at run
        time, so that a request the first accepts the second accepts too:
        one chunk of computed tokens plus one step of new ones, capped at the
        model length.
        """
        num_tokens = min(self.attention_chunk_size + max_in_flight_tokens, max_model_len)
        return cdiv(num_tokens, self.block_size)

    def max_memory_usage_bytes(self, config: Any) -> int:
        return _admission_capped_bytes(self, config)

    def is_uniform_with_collection(self, kv_cache_specs: dict[str, KVCacheSpec]) -> bool:
        """Chunked-local layers with this chunk size."""
        return all(
            isinstance(spec, ChunkedLocalAttentionSpec) and spec.attention_chunk_size == self.attention_chunk_size
            for spec in kv_cache_specs.values()
        )
