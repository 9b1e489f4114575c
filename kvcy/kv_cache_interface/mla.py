"""Multi-head latent attention: :class:`MLAAttentionSpec`, :class:`HiddenStateCacheSpec`,
:class:`SlidingWindowMLASpec` and the sparse-MLA :class:`SparseCacheRole`."""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Any

from kvcy.kv_cache_interface._checks import _check_bool, _check_int, cdiv
from kvcy.kv_cache_interface.base import KVCacheSpec
from kvcy.kv_cache_interface.full_attention import FullAttentionSpec, _assert_same_attention
from kvcy.kv_cache_interface.sliding_window import SlidingWindowSpec


class SparseCacheRole(str, Enum):
    """Which cache of a sparse-MLA layer a spec describes: the attended latents
    or the indexer's keys (DeepSeek V3.2 style)."""

    SPARSE = "sparse"
    INDEXER = "indexer"


def _apply_alignment(spec: Any) -> None:
    """Pad the page of ``spec`` up to a multiple of its ``alignment`` (vLLM's rule:
    the padded size replaces ``page_size_padded`` whenever it differs from the real size)."""
    _check_int(type(spec).__name__, "alignment", spec.alignment, optional=True)
    if spec.alignment is None:
        return
    real = spec.real_page_size_bytes
    padded = cdiv(real, spec.alignment) * spec.alignment
    if padded != real:
        object.__setattr__(spec, "page_size_padded", padded)


@dataclass(frozen=True, kw_only=True)
class MLAAttentionSpec(FullAttentionSpec):
    """Multi-head latent attention: one latent vector per state, no separate V
    (``head_size_v`` is 0), ``num_kv_heads`` head slots (1 for DeepSeek models).

    Packed latent formats (``fp8_ds_mla``: 656 bytes per token,
    ``nvfp4_ds_mla``: 352) are given as ``state_content_bytes``, as vLLM's MLA
    layer publishes them; ``cache_dtype_str`` only names the format.
    """

    head_size_v: int | None = 0
    cache_dtype_str: str | None = None
    topk_buffer_width: int | None = None
    """Width of the model's sparse top-k index buffer, padding included."""
    alignment: int | None = None
    """Bytes the page is padded up to a multiple of (None: no padding)."""
    model_version: str | None = None
    cache_role: SparseCacheRole = SparseCacheRole.SPARSE
    is_index_group_leader: bool = False
    non_causal_multi_token_decode: bool = False
    """Whether some layer of the group decodes a non-causal block of queries."""

    def _post_init_head_sizes(self) -> None:
        super()._post_init_head_sizes()
        owner = type(self).__name__
        _check_int(owner, "topk_buffer_width", self.topk_buffer_width, optional=True)
        _check_optional_str(owner, "cache_dtype_str", self.cache_dtype_str)
        _check_optional_str(owner, "model_version", self.model_version)
        _check_bool(owner, "is_index_group_leader", self.is_index_group_leader)
        _check_bool(owner, "non_causal_multi_token_decode", self.non_causal_multi_token_decode)
        if not isinstance(self.cache_role, SparseCacheRole):
            try:
                object.__setattr__(self, "cache_role", SparseCacheRole(self.cache_role))
            except ValueError:
                raise ValueError(
                    f"{owner}.cache_role must be one of {[r.value for r in SparseCacheRole]}, got {self.cache_role!r}"
                ) from None

    def __post_init__(self) -> None:
        super().__post_init__()
        _apply_alignment(self)

    @classmethod
    def merge(cls, specs: list):
        """Merge MLA specs, which must agree on their format, top-k width, tokens
        per state, model version, cache role, index-group leadership and block
        stride alignment, and on every attention field.  The merged spec decodes
        non-causal blocks if any layer does; it keeps the first layer's padded
        page but not its ``alignment`` (as vLLM's merge does).

        Raises:
            ValueError: an empty list.
            AssertionError: a spec that is not MLA, or specs that differ (as in vLLM).
        """
        if not specs:
            raise ValueError("cannot merge an empty list of KV cache specs")
        if not all(isinstance(spec, MLAAttentionSpec) for spec in specs):
            raise AssertionError("All attention layers in the same KV cache group must be MLAAttentionSpec.")
        agreed = ("cache_dtype_str", "topk_buffer_width", "tokens_per_state", "model_version", "cache_role",
                  "is_index_group_leader", "block_stride_alignment")
        if any(len({getattr(spec, name) for spec in specs}) != 1 for name in agreed):
            raise AssertionError(
                "All attention layers in the same KV cache group must use the same quantization method, "
                "top-k buffer width, tokens per state, model version, cache role, index-sharing role, "
                "and block stride alignment."
            )
        first = specs[0]
        merged = cls(
            block_size=first.block_size,
            num_kv_heads=first.num_kv_heads,
            head_size=first.head_size,
            dtype=first.dtype,
            kv_quant_mode=first.kv_quant_mode,
            dcp_sharded=first.dcp_sharded,
            max_tp_shards=first.max_tp_shards,
            page_size_padded=first.page_size_padded,
            num_head_slots=first.num_head_slots,
            state_content_bytes=first.state_content_bytes,
            **{name: getattr(first, name) for name in agreed},
            non_causal_multi_token_decode=any(spec.non_causal_multi_token_decode for spec in specs),
        )
        _assert_same_attention(specs, merged)
        return merged


@dataclass(frozen=True, kw_only=True)
class HiddenStateCacheSpec(MLAAttentionSpec):
    """Marks layers that cache hidden states (for hidden-state extraction)."""


@dataclass(frozen=True, kw_only=True)
class SlidingWindowMLASpec(SlidingWindowSpec):
    """Sliding-window attention stored in the MLA (one latent per state, no V) format.

    ``bounded_replay`` (DeepSeek V4.1) takes the group out of prefix caching
    (:attr:`prefix_cacheable` False: it gets no hits and caches nothing) and
    makes a prefix hit of the other groups replay its last window of tokens
    (:attr:`prefix_replay_tokens`, read by vLLM's scheduler), for which the
    sliding-window manager allocates fresh blocks.
    """

    head_size_v: int | None = 0
    cache_dtype_str: str | None = None
    alignment: int | None = None
    """Bytes the page is padded up to a multiple of (None: no padding)."""
    model_version: str | None = None
    """None, or ``"deepseek_v4"``."""
    bounded_replay: bool = False

    def __post_init__(self) -> None:
        assert self.model_version in (None, "deepseek_v4"), f"Unsupported model version: {self.model_version}"
        super().__post_init__()
        owner = type(self).__name__
        _check_optional_str(owner, "cache_dtype_str", self.cache_dtype_str)
        _check_bool(owner, "bounded_replay", self.bounded_replay)
        _apply_alignment(self)

    @property
    def prefix_cacheable(self) -> bool:
        return not self.bounded_replay

    @property
    def prefix_replay_tokens(self) -> int:
        return self.sliding_window if self.bounded_replay else 0

    @classmethod
    def merge(cls, specs: list):
        """Merge sliding-window MLA specs that agree on format, tokens per state,
        model version, window, retained tokens, replay policy, block stride
        alignment, dcp sharding and tensor-parallel shards.  As in vLLM, the
        merged spec keeps the first layer's shape and padded page and takes
        its other fields (``kv_quant_mode``, ``alignment``) at their defaults.

        Raises:
            ValueError: an empty list.
            AssertionError: a spec that is not sliding-window MLA, or specs that differ (as in vLLM).
        """
        if not specs:
            raise ValueError("cannot merge an empty list of KV cache specs")
        if not all(isinstance(spec, SlidingWindowMLASpec) for spec in specs):
            raise AssertionError("All attention layers in the same KV cache group must be SlidingWindowMLASpec.")
        if len({spec.dcp_sharded for spec in specs}) != 1 or len({spec.max_tp_shards for spec in specs}) != 1:
            raise AssertionError(
                "All attention layers in the same KV cache group must have the same dcp sharding "
                "and tensor-parallel shards."
            )
        agreed = ("cache_dtype_str", "tokens_per_state", "model_version", "sliding_window", "extra_retained_tokens",
                  "bounded_replay", "block_stride_alignment")
        if any(len({getattr(spec, name) for spec in specs}) != 1 for name in agreed):
            raise AssertionError(
                "All attention layers in the same KV cache group must use the same quantization method, "
                "tokens per state, model version, sliding window size, retained token count, and replay policy."
            )
        first = specs[0]
        return cls(
            block_size=first.block_size,
            num_kv_heads=first.num_kv_heads,
            head_size=first.head_size,
            dtype=first.dtype,
            dcp_sharded=first.dcp_sharded,
            max_tp_shards=first.max_tp_shards,
            page_size_padded=first.page_size_padded,
            num_head_slots=first.num_head_slots,
            state_content_bytes=first.state_content_bytes,
            **{name: getattr(first, name) for name in agreed},
        )

    def is_uniform_with_collection(self, kv_cache_specs: dict[str, KVCacheSpec]) -> bool:
        """Sliding-window MLA layers with this window and replay policy."""
        return all(
            isinstance(spec, SlidingWindowMLASpec)
            and spec.sliding_window == self.sliding_window
            and spec.bounded_replay == self.bounded_replay
            for spec in kv_cache_specs.values()
        )


def _check_optional_str(owner: str, name: str, value: Any) -> None:
    if value is not None and not isinstance(value, str):
        raise TypeError(f"{owner}.{name} must be a string or None, got {type(value).__name__}: {value!r}")
