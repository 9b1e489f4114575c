"""Recurrent state: :class:`MambaSpec`."""

from __future__ import annotations

from dataclasses import dataclass
from math import prod
from enum import Enum
from typing import Any

from kvcy.kv_cache_interface._checks import _check_bool, _check_int, cdiv
from kvcy.kv_cache_interface.base import KVCacheSpec
from kvcy.kv_cache_interface.dtypes import _DTYPE_SIZES, canonical_dtype


@dataclass(frozen=True, kw_only=True)
class MambaSpec(KVCacheSpec):
    """Recurrent (Mamba) state: a fixed-size state per request, not per token.

    ``shapes[i]`` and ``dtypes[i]`` describe the i-th state tensor (e.g. the
    conv state and the SSM state); one "block" holds one full state.

    ``mamba_type`` names the Mamba backend: a string (``"mamba2"``), or vLLM's
    ``MambaAttentionBackendEnum`` member or its class-path value, stored as the
    member's lower-case name.  The prefill-checkpoint fields size the pool as
    vLLM's do, and drive align mode's checkpoints in ``MambaManager``.
    """

    shapes: tuple[tuple[int, ...], ...]
    dtypes: tuple[Any, ...]
    page_size_padded: int | None = None
    mamba_type: str = "mamba2"
    mamba_cache_mode: str = "none"
    num_speculative_blocks: int = 0
    num_prefill_checkpoint_blocks: int = 0
    """Extra blocks a request holds in align mode for prefill checkpoints."""
    prefill_checkpoint_alignment: int | None = None
    """Token granularity the backend can export a prefill checkpoint at (None: none)."""
    num_heads: int = 1
    tokens_per_state: int = -1
    tp_replicated: bool = False
    """Whether every tensor-parallel rank holds the whole state (else it is sharded)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        owner = type(self).__name__
        # vLLM builds a MambaSpec from any shapes and dtypes and fails only when the page size
        # is computed; its own tests build specs such as ``shapes=(1, 1)`` that never are.
        # So do kvcy's: well-formed values are normalised here, anything else is kept as given
        # and refused, with the reason, by the page-size properties.
        try:
            shapes, dtypes = _state_layout(owner, self.shapes, self.dtypes)
        except (TypeError, ValueError):
            shapes = tuple(self.shapes) if _iterable(self.shapes) else self.shapes
            dtypes = tuple(self.dtypes) if _iterable(self.dtypes) else self.dtypes
        object.__setattr__(self, "shapes", shapes)
        object.__setattr__(self, "dtypes", dtypes)
        _check_int(owner, "num_speculative_blocks", self.num_speculative_blocks, minimum=0)
        _check_int(owner, "num_prefill_checkpoint_blocks", self.num_prefill_checkpoint_blocks, minimum=0)
        _check_int(owner, "prefill_checkpoint_alignment", self.prefill_checkpoint_alignment, optional=True)
        _check_int(owner, "num_heads", self.num_heads)
        if self.tokens_per_state != -1:
            _check_int(owner, "tokens_per_state", self.tokens_per_state)
        _check_bool(owner, "tp_replicated", self.tp_replicated)
        object.__setattr__(self, "mamba_type", _mamba_type_name(owner, self.mamba_type))
        if not isinstance(self.mamba_cache_mode, str):
            raise TypeError(f"{owner}.mamba_cache_mode must be a string, got {self.mamba_cache_mode!r}")
        _check_int(owner, "page_size_padded", self.page_size_padded, optional=True)
        if self.page_size_padded is not None and self.page_size_padded < _padding_floor(owner, self):
            raise ValueError(
                f"{owner}.page_size_padded ({self.page_size_padded}) is smaller than "
                f"the real page size ({self.real_page_size_bytes} bytes)"
            )

    @property
    def block_table_token_alignment(self) -> int | None:
        return None

    @property
    def state_content_size_bytes(self) -> int:
        return self.real_page_size_bytes

    @property
    def real_page_size_bytes(self) -> int:
        """Bytes of one full state, without padding.

        Raises:
            TypeError / ValueError: the shapes or dtypes do not describe state tensors.
        """
        shapes, dtypes = _state_layout(type(self).__name__, self.shapes, self.dtypes)
        return sum(prod(shape) * _DTYPE_SIZES[dtype] for shape, dtype in zip(shapes, dtypes))

    @property
    def page_size_bytes(self) -> int:
        real = self.real_page_size_bytes  # validates the state layout, padded or not
        return real if self.page_size_padded is None else self.page_size_padded

    def max_memory_usage_bytes(self, config: Any) -> int:
        """One state plus the speculative blocks; in align mode one more state and
        the prefill-checkpoint blocks (vLLM 0.33.0 has no other mode).

        The mode is ``config.cache_config.mamba_cache_mode``, or this spec's own
        for a config without one.
        """
        cache_config = getattr(config, "cache_config", None)
        mode = getattr(cache_config, "mamba_cache_mode", None) or self.mamba_cache_mode
        if mode == "align":
            return self.page_size_bytes * (2 + self.num_speculative_blocks + self.num_prefill_checkpoint_blocks)
        return self.page_size_bytes * (1 + self.num_speculative_blocks)

    def max_num_blocks_per_req(self, config: Any, max_len: int) -> int:
        # Mamba state is never sharded across context-parallel ranks.  In align
        # mode the block table is indexed by position over the whole sequence.
        cache_config = getattr(config, "cache_config", None)
        mode = getattr(cache_config, "mamba_cache_mode", None) or self.mamba_cache_mode
        if mode == "align":
            return cdiv(max_len, self.block_size) + self.num_speculative_blocks
        return cdiv(self.max_memory_usage_bytes(config), self.page_size_bytes)

    def is_uniform_with_collection(self, kv_cache_specs: dict[str, KVCacheSpec]) -> bool:
        """Mamba layers with this page size, speculative and checkpoint blocks,
        checkpoint alignment and tensor-parallel replication."""
        return all(
            isinstance(spec, MambaSpec)
            and spec.num_speculative_blocks == self.num_speculative_blocks
            and spec.num_prefill_checkpoint_blocks == self.num_prefill_checkpoint_blocks
            and spec.prefill_checkpoint_alignment == self.prefill_checkpoint_alignment
            and spec.page_size_bytes == self.page_size_bytes
            and spec.tp_replicated == self.tp_replicated
            for spec in kv_cache_specs.values()
        )


def _iterable(value: Any) -> bool:
    return not isinstance(value, str) and hasattr(value, "__iter__")


def _state_layout(owner: str, shapes: Any, dtypes: Any) -> tuple[tuple[tuple[int, ...], ...], tuple[Any, ...]]:
    """``shapes`` and ``dtypes`` normalised (tuples of int tuples, canonical dtypes).

    Raises:
        TypeError / ValueError: they do not describe one or more state tensors.
    """
    try:
        norm_shapes = tuple(tuple(int(d) for d in shape) for shape in shapes)
    except TypeError as exc:
        raise TypeError(f"{owner}.shapes must be a sequence of shapes (sequences of ints)") from exc
    if not _iterable(dtypes):
        raise TypeError(f"{owner}.dtypes must be a sequence of dtypes, got {dtypes!r}")
    norm_dtypes = tuple(canonical_dtype(d) for d in dtypes)
    if not norm_shapes:
        raise ValueError(f"{owner}.shapes must not be empty")
    if len(norm_shapes) != len(norm_dtypes):
        raise ValueError(f"{owner}.shapes has {len(norm_shapes)} entries but dtypes has {len(norm_dtypes)}")
    for shape in norm_shapes:
        if any(d <= 0 for d in shape):
            raise ValueError(f"{owner}.shapes must have positive dimensions, got {shape}")
    return norm_shapes, norm_dtypes


def _padding_floor(owner: str, spec: MambaSpec) -> int:
    """The real page size a padded page must cover; 0 (no check) while the layout is malformed,
    whose error the page-size properties raise when they are read."""
    try:
        return spec.real_page_size_bytes
    except (TypeError, ValueError):
        return 0


# vLLM 0.33.0's MambaAttentionBackendEnum: member name -> value (the backend's class path).
_VLLM_MAMBA_BACKENDS = {
    "MAMBA1": "vllm.v1.attention.backends.mamba1_attn.Mamba1AttentionBackend",
    "MAMBA2": "vllm.v1.attention.backends.mamba2_attn.Mamba2AttentionBackend",
    "SHORT_CONV": "vllm.v1.attention.backends.short_conv_attn.ShortConvAttentionBackend",
    "LINEAR": "vllm.v1.attention.backends.linear_attn.LinearAttentionBackend",
    "GDN_ATTN": "vllm.v1.attention.backends.gdn_attn.GDNAttentionBackend",
}
_MAMBA_BACKEND_BY_PATH = {path: name for name, path in _VLLM_MAMBA_BACKENDS.items()}


def _mamba_type_name(owner: str, value: Any) -> str:
    """The stored form of ``mamba_type``: a backend's lower-case member name."""
    if isinstance(value, Enum):
        return value.name.lower()
    if not isinstance(value, str) or not value:
        raise TypeError(f"{owner}.mamba_type must be a non-empty string or a Mamba backend enum, got {value!r}")
    if value in _MAMBA_BACKEND_BY_PATH:
        return _MAMBA_BACKEND_BY_PATH[value].lower()
    if value.upper() in _VLLM_MAMBA_BACKENDS:
        return value.lower()
    return value
