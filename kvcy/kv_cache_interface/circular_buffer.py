"""A per-request ring of raw keys: :class:`CircularBufferSpec`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kvcy.kv_cache_interface.attention import AttentionSpec
from kvcy.kv_cache_interface.base import KVCacheSpec


@dataclass(frozen=True, kw_only=True)
class CircularBufferSpec(AttentionSpec):
    """One block per request, used as a ring: the raw keys of the token group a
    compressing layer has not compressed yet (the GLM / DeepSeek indexer tail).

    ``block_size`` is the ring's capacity in tokens.  The block covers no fixed
    token range, so the group takes no part in prefix caching
    (:attr:`prefix_cacheable` is False), has no per-token slot mapping and no
    block-table padding, and a request needs exactly one block for its whole
    life, however long it runs.
    """

    @property
    def block_table_token_alignment(self) -> int | None:
        return None

    def max_memory_usage_bytes(self, config: Any) -> int:
        """One page: the ring's single block."""
        return self.page_size_bytes

    def max_num_blocks_per_req(self, config: Any, max_len: int) -> int:
        """1: the ring is one block whatever the length."""
        return 1

    def is_uniform_with_collection(self, kv_cache_specs: dict[str, KVCacheSpec]) -> bool:
        """Circular-buffer layers only."""
        return all(isinstance(spec, CircularBufferSpec) for spec in kv_cache_specs.values())

    @property
    def prefix_cacheable(self) -> bool:
        return False

    @property
    def uses_slot_mapping(self) -> bool:
        return False
