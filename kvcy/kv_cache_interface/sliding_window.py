"""Sliding-window attention: :class:`SlidingWindowSpec`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kvcy.kv_cache_interface._checks import _admission_capped_bytes, _check_int, _kv_shard_count, cdiv
from kvcy.kv_cache_interface.attention import AttentionSpec
from kvcy.kv_cache_interface.base import KVCacheSpec


@dataclass(frozen=True, kw_only=True)
class SlidingWindowSpec(AttentionSpec):
    """Attention over the last ``sliding_window`` tokens."""

    sliding_window: int
    extra_retained_tokens: int = 0
    """Tokens below the window whose blocks are kept (not attended), for
    speculative decoding that re-prefills the last few tokens: the manager
    frees (and skips) that many tokens fewer, and the admission cap counts
    them."""

    def _post_init_head_sizes(self) -> None:
        owner = type(self).__name__
        _check_int(owner, "sliding_window", self.sliding_window)
        _check_int(owner, "extra_retained_tokens", self.extra_retained_tokens, minimum=0)

    @property
    def num_retained_tokens(self) -> int:
        """Tokens below a request's first scheduled position that must stay readable."""
        return self.sliding_window - 1 + self.extra_retained_tokens

    def max_admission_blocks_per_request(self, max_in_flight_tokens: int, max_model_len: int) -> int:
        """Most blocks one request can hold at once.

        The manager frees blocks that fell out of the window before each
        allocation, so a request holds at most ``sliding_window - 1`` computed
        tokens plus one step of new ones (capped at the model length), plus
        one block because the window need not start on a block boundary.
        """
        num_tokens = min(self.num_retained_tokens + max_in_flight_tokens, max_model_len)
        return cdiv(num_tokens, self.block_size) + 1

    def max_memory_usage_bytes(self, config: Any) -> int:
        # vLLM sizes no sliding window under decode context parallelism and asserts.
        assert _kv_shard_count(self, config) == 1, "DCP not support sliding window."
        return _admission_capped_bytes(self, config)

    def is_uniform_with_collection(self, kv_cache_specs: dict[str, KVCacheSpec]) -> bool:
        """Sliding-window layers (MLA ones included) with this window."""
        return all(
            isinstance(spec, SlidingWindowSpec) and spec.sliding_window == self.sliding_window
            for spec in kv_cache_specs.values()
        )
