"""Recurrent state: :class:`MambaSpec`."""

from __future__ import annotations

from dataclasses import dataclass
from math import prod
from typing import Any

from kvcy.kv_cache_interface._checks import _check_int, _setting, cdiv
from kvcy.kv_cache_interface.base import KVCacheSpec
from kvcy.kv_cache_interface.dtypes import _DTYPE_SIZES, canonical_dtype


@dataclass(frozen=True, kw_only=True)
class MambaSpec(KVCacheSpec):
    """Recurrent (Mamba) state: a fixed-size state per request, not per token.

    ``shapes[i]`` and ``dtypes[i]`` describe the i-th state tensor (e.g. the
    conv state and the SSM state); one "block" holds one full state.
    """

    shapes: tuple[tuple[int, ...], ...]
    dtypes: tuple[Any, ...]
    page_size_padded: int | None = None
    mamba_type: str = "mamba2"
    mamba_cache_mode: str = "none"
    num_speculative_blocks: int = 0

    def __post_init__(self) -> None:
        super().__post_init__()
        owner = type(self).__name__
        try:
            shapes = tuple(tuple(int(d) for d in shape) for shape in self.shapes)
        except TypeError as exc:
            raise TypeError(f"{owner}.shapes must be a sequence of shapes (sequences of ints)") from exc
        if isinstance(self.dtypes, str) or not hasattr(self.dtypes, "__iter__"):
            raise TypeError(f"{owner}.dtypes must be a sequence of dtypes, got {self.dtypes!r}")
        dtypes = tuple(canonical_dtype(d) for d in self.dtypes)
        if not shapes:
            raise ValueError(f"{owner}.shapes must not be empty")
        if len(shapes) != len(dtypes):
            raise ValueError(f"{owner}.shapes has {len(shapes)} entries but dtypes has {len(dtypes)}")
        for shape in shapes:
            if any(d <= 0 for d in shape):
                raise ValueError(f"{owner}.shapes must have positive dimensions, got {shape}")
        object.__setattr__(self, "shapes", shapes)
        object.__setattr__(self, "dtypes", dtypes)
        _check_int(owner, "num_speculative_blocks", self.num_speculative_blocks, minimum=0)
        _check_int(owner, "page_size_padded", self.page_size_padded, optional=True)
        if self.page_size_padded is not None and self.page_size_padded < self.real_page_size_bytes:
            raise ValueError(
                f"{owner}.page_size_padded ({self.page_size_padded}) is smaller than "
                f"the real page size ({self.real_page_size_bytes} bytes)"
            )

    @property
    def num_heads(self) -> int:
        return 1

    @property
    def tokens_per_state(self) -> int:
        return -1

    @property
    def block_table_token_alignment(self) -> int | None:
        return None

    @property
    def state_content_size_bytes(self) -> int:
        return self.real_page_size_bytes

    @property
    def real_page_size_bytes(self) -> int:
        """Bytes of one full state, without padding."""
        return sum(prod(shape) * _DTYPE_SIZES[dtype] for shape, dtype in zip(self.shapes, self.dtypes))

    @property
    def page_size_bytes(self) -> int:
        if self.page_size_padded is not None:
            return self.page_size_padded
        return self.real_page_size_bytes

    def max_memory_usage_bytes(self, config: Any) -> int:
        cache_config = getattr(config, "cache_config", None)
        mode = getattr(cache_config, "mamba_cache_mode", None) or self.mamba_cache_mode
        if mode == "all":
            max_model_len = _setting(config, "max_model_len", "model_config")
            return cdiv(max_model_len, self.block_size) * self.page_size_bytes
        if mode == "align":
            return self.page_size_bytes * (2 + self.num_speculative_blocks)
        return self.page_size_bytes * (1 + self.num_speculative_blocks)

    def max_num_blocks_per_req(self, config: Any, max_len: int) -> int:
        # Mamba state is never sharded across context-parallel ranks.  In align
        # mode the block table is indexed by position over the whole sequence.
        cache_config = getattr(config, "cache_config", None)
        mode = getattr(cache_config, "mamba_cache_mode", None) or self.mamba_cache_mode
        if mode == "align":
            return cdiv(max_len, self.block_size) + self.num_speculative_blocks
        return cdiv(self.max_memory_usage_bytes(config), self.page_size_bytes)
