"""Full attention: :class:`FullAttentionSpec` and its sink and TurboQuant-slot variants."""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

from kvcy.kv_cache_interface._checks import _check_bool, _check_int, _kv_shard_count, _setting, cdiv
from kvcy.kv_cache_interface.attention import AttentionSpec


@dataclass(frozen=True, kw_only=True)
class FullAttentionSpec(AttentionSpec):
    """Attention over every previous token: a request holds blocks for all of them.

    With the hybrid KV-cache manager disabled, sliding-window and chunked-local
    layers are managed as full attention (blocks for every token) while still
    computed with their window; such a spec records ``sliding_window`` or
    ``attention_chunk_size`` (never both).
    """

    sliding_window: int | None = None
    attention_chunk_size: int | None = None
    non_causal: bool = False
    """Whether the layer attends non-causally (e.g. a prefix LM).  The layout is
    unchanged; the engine core reads it to turn off scheduling features that
    assume causal attention (chunked prefill, prefix caching)."""

    def _post_init_head_sizes(self) -> None:
        owner = type(self).__name__
        _check_bool(owner, "non_causal", self.non_causal)
        _check_int(owner, "sliding_window", self.sliding_window, optional=True)
        _check_int(owner, "attention_chunk_size", self.attention_chunk_size, optional=True)
        if self.sliding_window is not None and self.attention_chunk_size is not None:
            raise ValueError(
                f"{owner} cannot have both sliding_window and attention_chunk_size "
                "(models mixing sliding-window and chunked-local layers are not supported)"
            )

    def max_memory_usage_bytes(self, config: Any) -> int:
        # A dcp-sharded cache keeps only its share of the tokens on each rank.
        max_model_len = cdiv(_setting(config, "max_model_len", "model_config"), _kv_shard_count(self, config))
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
        from kvcy.kv_cache_interface.mla import MLAAttentionSpec  # a subclass: imported late

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
            num_head_slots=first.num_head_slots,
            state_content_bytes=first.state_content_bytes,
            tokens_per_state=first.tokens_per_state,
            sliding_window=sliding_window,
            attention_chunk_size=attention_chunk_size,
            # one non-causal layer makes the whole group non-causal
            non_causal=any(spec.non_causal for spec in specs),
            **first._merge_extra(),
        )
        _assert_same_attention(specs, merged)
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
