"""Several same-type layers as one spec: :class:`UniformTypeKVCacheSpecs`, and the
helpers that see through it."""

from __future__ import annotations

from collections import Counter
from collections.abc import Collection
from dataclasses import dataclass
from typing import Any

from kvcy.kv_cache_interface._checks import cdiv
from kvcy.kv_cache_interface.base import KVCacheSpec
from kvcy.kv_cache_interface.chunked_local import ChunkedLocalAttentionSpec
from kvcy.kv_cache_interface.encoder_attention import CrossAttentionSpec
from kvcy.kv_cache_interface.full_attention import FullAttentionSpec
from kvcy.kv_cache_interface.mamba import MambaSpec
from kvcy.kv_cache_interface.mla import SlidingWindowMLASpec
from kvcy.kv_cache_interface.sliding_window import SlidingWindowSpec


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
