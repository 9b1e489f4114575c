"""Attention layers: :class:`AttentionSpec`, K and V of ``head_size`` per kv head and token."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from fractions import Fraction
from typing import TYPE_CHECKING, Any

from kvcy.kv_cache_interface._checks import _check_int, _check_tokens_per_state, _kv_shard_count, cdiv
from kvcy.kv_cache_interface.base import KVCacheSpec, num_states_for
from kvcy.kv_cache_interface.dtypes import _DTYPE_SIZES, _is_torch_dtype, _torch_dtype, canonical_dtype
from kvcy.kv_cache_interface.quant import KVQuantMode

if TYPE_CHECKING:  # pragma: no cover
    import torch


@dataclass(frozen=True, kw_only=True)
class AttentionSpec(KVCacheSpec):
    """An attention layer: per block, ``H`` head slots of ``N`` states of ``C`` bytes.

    By default there is one slot per kv head and a state holds K (``head_size``)
    and V (``head_size_v``) elements of :attr:`dtype`.  Attention backends that
    pack their cache differently (inline per-token-head scales, NVFP4 K and V
    slots, opaque MLA blobs) publish the packed shape in :attr:`num_head_slots`
    and :attr:`state_content_bytes`, as vLLM's ``customize_spec`` does; the page
    size is then ``H * N * C`` with no term for the quantization mode, exactly
    as vLLM 0.33.0 computes it.
    """

    dcp_sharded: bool = True
    max_tp_shards: int | None = None
    """Distinct shards of this cache across tensor-parallel ranks (ranks
    beyond it hold replicas); None: unknown, taken as not replicated."""
    num_kv_heads: int
    head_size: int
    dtype: Any = field(compare=False)
    """Element type: a ``torch.dtype`` (kept) or a name (stored canonical)."""
    head_size_v: int | None = None
    """Value head size; None means ``head_size`` (0 for formats with no V)."""
    kv_quant_mode: KVQuantMode = KVQuantMode.NONE
    page_size_padded: int | None = None
    """Page size rounded up by the caller (bytes), or None for the real size."""
    num_head_slots: int | None = None
    """``H`` of the page when the backend packs it other than one slot per kv
    head (None: ``num_kv_heads``)."""
    state_content_bytes: int | None = None
    """``C`` in bytes of a packed layout (None: dense K and V of :attr:`dtype`)."""
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
        if self.head_size_v is None:
            object.__setattr__(self, "head_size_v", self.head_size)
        _check_int(owner, "head_size_v", self.head_size_v, minimum=0)
        _check_int(owner, "max_tp_shards", self.max_tp_shards, optional=True)
        _check_int(owner, "num_head_slots", self.num_head_slots, optional=True)
        _check_int(owner, "state_content_bytes", self.state_content_bytes, optional=True)
        _check_tokens_per_state(owner, self.tokens_per_state)
        num_states_for(self.block_size, self.tokens_per_state)  # whole states per block
        name = canonical_dtype(self.dtype)
        object.__setattr__(self, "_dtype_name", name)
        if not _is_torch_dtype(self.dtype):
            object.__setattr__(self, "dtype", name)
        if not isinstance(self.kv_quant_mode, KVQuantMode):
            object.__setattr__(self, "kv_quant_mode", KVQuantMode(self.kv_quant_mode))
        self._post_init_head_sizes()
        _check_int(owner, "page_size_padded", self.page_size_padded, optional=True)
        if self.page_size_padded is not None:
            unpadded = self.unpadded_page_size_bytes
            if self.page_size_padded < unpadded:
                raise ValueError(
                    f"{owner}.page_size_padded ({self.page_size_padded}) is smaller than "
                    f"the real page size ({unpadded} bytes)"
                )

    def _post_init_head_sizes(self) -> None:
        """Hook for subclasses that check fields of their own."""

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
        """Head slots (``H``) of the page: :attr:`num_head_slots`, else ``num_kv_heads``."""
        if self.num_head_slots is not None:
            return self.num_head_slots
        return self.num_kv_heads

    @property
    def state_content_size_bytes(self) -> int:
        """Bytes (``C``) of one state of one head slot."""
        if self.state_content_bytes is not None:
            return self.state_content_bytes
        return (self.head_size + self.head_size_v) * self.dtype_size

    @property
    def unpadded_page_size_bytes(self) -> int:
        """``H * N * C``: the page without ``page_size_padded``."""
        return self.num_heads * self.num_states * self.state_content_size_bytes

    @property
    def real_page_size_bytes(self) -> int:
        """The page without padding (vLLM's alias of :attr:`unpadded_page_size_bytes`)."""
        return self.unpadded_page_size_bytes

    @property
    def page_size_bytes(self) -> int:
        if self.page_size_padded is not None:
            return self.page_size_padded
        return self.unpadded_page_size_bytes

    def max_num_blocks_per_req(self, config: Any, max_len: int) -> int:
        # Under decode context parallelism a block on this rank holds every
        # dcp-th token, so one logical block spans block_size * dcp tokens.
        return cdiv(max_len, self.block_size * _kv_shard_count(self, config))

    def copy_with_new_block_size(self, block_size: int):
        if self.page_size_padded is not None:
            ratio = block_size // self.block_size
            return replace(self, block_size=block_size, page_size_padded=self.page_size_padded * ratio)
        return replace(self, block_size=block_size)

