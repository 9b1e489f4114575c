"""Physical orders of the logical ``[L, B, H, N, C]`` cache shape: :class:`KVCacheLayout`."""

from __future__ import annotations

from enum import Enum


# logical axes of the 5D cache shape
DIM_L, DIM_B, DIM_H, DIM_N, DIM_C = 0, 1, 2, 3, 4

_LAYOUT_ALIASES = {"NHD": "LBNHC", "HND": "LBHNC"}


class KVCacheLayout(Enum):
    """Physical order of the logical cache shape ``[L, B, H, N, C]``.

    ``L`` = layer slots sharing one allocation, ``B`` = blocks, ``H`` = kv
    heads, ``N`` = states (tokens) per block, ``C`` = content of one state of
    one head.  A member's value (:attr:`stride_order`) lists the logical axes
    from the outermost to the innermost in memory; ``C`` is always innermost.
    """

    LBHNC = (0, 1, 2, 3, 4)
    LBNHC = (0, 1, 3, 2, 4)
    LHBNC = (0, 2, 1, 3, 4)
    BLHNC = (1, 0, 2, 3, 4)
    BLNHC = (1, 0, 3, 2, 4)
    BHLNC = (1, 2, 0, 3, 4)

    @property
    def stride_order(self) -> tuple[int, ...]:
        """Logical axes (0..4 = L, B, H, N, C) from outermost to innermost in memory."""
        return self.value

    @property
    def layer_view_order(self) -> tuple[int, ...]:
        """Physical order of the axes of one layer's 4D ``[B, H, N, C]`` view (0..3)."""
        return tuple(d - 1 for d in self.value if d != DIM_L)

    @property
    def is_layer_compact(self) -> bool:
        """Whether ``L`` is outermost (each layer slot is one contiguous run)."""
        return self.value[0] == DIM_L

    @property
    def is_block_contiguous(self) -> bool:
        """Whether ``[H, N, C]`` of one block of one layer is contiguous."""
        return self.value[-3:] == (DIM_H, DIM_N, DIM_C)

    @property
    def is_block_compact(self) -> bool:
        """Whether ``L`` and ``B`` are the two outermost axes (one page = one run)."""
        return set(self.value[:2]) == {DIM_L, DIM_B}

    @property
    def is_block_outermost(self) -> bool:
        """Whether ``B`` is the outermost axis."""
        return self.value[0] == DIM_B

    @classmethod
    def from_name(cls, name: str) -> KVCacheLayout:
        """A layout by name; ``"NHD"`` and ``"HND"`` are accepted as aliases.

        Raises:
            ValueError: unknown name.
        """
        key = name.strip().upper()
        key = _LAYOUT_ALIASES.get(key, key)
        try:
            return cls[key]
        except KeyError:
            raise ValueError(
                f"unknown KV cache layout {name!r}; choose from {[m.name for m in cls] + list(_LAYOUT_ALIASES)}"
            ) from None
