"""Attention layers: :class:`AttentionSpec`, K and V of ``head_size`` per kv head and token."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from fractions import Fraction
from typing import TYPE_CHECKING, Any

from kvcy.kv_cache_interface._checks import _check_int, _check_tokens_per_state, _no_dcp, cdiv
from kvcy.kv_cache_interface.base import KVCacheSpec, num_states_for
from kvcy.kv_cache_interface.dtypes import _DTYPE_SIZES, _is_torch_dtype, _torch_dtype, canonical_dtype
from kvcy.kv_cache_interface.quant import KVQuantMode, nvfp4_kv_cache_full_dim

if TYPE_CHECKING:  # pragma: no cover
    import torch


@dataclass(frozen=True, kw_only=True)
class AttentionSpec(KVCacheSpec):
    """An attention layer storing K and V of ``head_size`` per kv head and token."""

    dcp_sharded: bool = True
    max_tp_shards: int | None = None
    """Distinct shards of this cache across tensor-parallel ranks (ranks
    beyond it hold replicas); None: unknown, taken as not replicated."""
    num_kv_heads: int
    head_size: int
    dtype: Any = field(compare=False)
    """Element type: a ``torch.dtype`` (kept) or a name (stored canonical)."""
    kv_quant_mode: KVQuantMode = KVQuantMode.NONE
    page_size_padded: int | None = None
    """Page size rounded up by the caller (bytes), or None for the real size."""
    tokens_per_state: int | Fraction = 1
    """Tokens one stored state covers: 1 for standard attention, more for
    compressed formats, a Fraction below 1 for several states per token."""
    _dtype_name: str = field(init=False, repr=False, default="")
    # The canonical name of dtype: what equality and hashing see.

    def __post_init__(self) -> None:
        super().__post_init__()
        owner = type(self).__name__
        _check_int(owner, "num_kv_heads", self.num_kv_heads)
        _check_int(owner, "head_size", self.head_size)
        _check_int(owner, "max_tp_shards", self.max_tp_shards, optional=True)
        _check_tokens_per_state(owner, self.tokens_per_state)
        num_states_for(self.block_size, self.tokens_per_state)  # whole states per block
        name = canonical_dtype(self.dtype)
        object.__setattr__(self, "_dtype_name", name)
        if not _is_torch_dtype(self.dtype):
            object.__setattr__(self, "dtype", name)
        if not isinstance(self.kv_quant_mode, KVQuantMode):
            object.__setattr__(self, "kv_quant_mode", KVQuantMode(self.kv_quant_mode))
        if self.kv_quant_mode is KVQuantMode.INT4_PER_TOKEN_HEAD:
            raise NotImplementedError(
                f"{owner}: the INT4_PER_TOKEN_HEAD page layout is the attention backend's "
                "and is not modelled by kvcy"
            )
        self._post_init_head_sizes()
        _check_int(owner, "page_size_padded", self.page_size_padded, optional=True)
        if self.page_size_padded is not None:
            unpadded = self._unpadded_page_size_bytes()
            if self.page_size_padded < unpadded:
                raise ValueError(
                    f"{owner}.page_size_padded ({self.page_size_padded}) is smaller than "
                    f"the real page size ({unpadded} bytes)"
                )

    def _post_init_head_sizes(self) -> None:
        """Hook for subclasses that carry a value head size."""

    @property
    def dtype_size(self) -> int:
        """Bytes per element of :attr:`dtype`."""
        return _DTYPE_SIZES[self._dtype_name]

    @property
    def torch_dtype(self) -> torch.dtype:
        """:attr:`dtype` as a ``torch.dtype`` (imports torch)."""
        if _is_torch_dtype(self.dtype):
            return self.dtype
        return _torch_dtype(self._dtype_name)

    @property
    def num_heads(self) -> int:
        return self.num_kv_heads

    def max_num_blocks_per_req(self, config: Any, max_len: int) -> int:
        _no_dcp(config)
        return cdiv(max_len, self.block_size)

    @property
    def state_content_size_bytes(self) -> int:
        hs = self.head_size
        if self.kv_quant_mode.is_nvfp4:
            hs = nvfp4_kv_cache_full_dim(hs)
        return 2 * hs * self.dtype_size

    @property
    def real_page_size_bytes(self) -> int:
        """Bytes of K and V of one block, without scales or padding."""
        return num_states_for(self.block_size, self.tokens_per_state) * self.num_heads * self.state_content_size_bytes

    def _unpadded_page_size_bytes(self) -> int:
        size = self.real_page_size_bytes
        if self.kv_quant_mode.is_per_token_head:
            # one float32 scale for K and one for V per (token, head), carved
            # from the same allocation
            size += 2 * self.block_size * self.num_kv_heads * 4
        return size

    @property
    def page_size_bytes(self) -> int:
        if self.page_size_padded is not None:
            return self.page_size_padded
        return self._unpadded_page_size_bytes()

    def copy_with_new_block_size(self, block_size: int):
        if self.page_size_padded is not None:
            ratio = block_size // self.block_size
            return replace(self, block_size=block_size, page_size_padded=self.page_size_padded * ratio)
        return replace(self, block_size=block_size)
