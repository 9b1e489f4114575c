"""Reference sliding-window attention (R-SWA): :class:`RSWASpec`."""

from __future__ import annotations

from dataclasses import dataclass

from kvcy.kv_cache_interface._checks import _check_int
from kvcy.kv_cache_interface.full_attention import FullAttentionSpec


@dataclass(frozen=True, kw_only=True)
class RSWASpec(FullAttentionSpec):
    """Full attention over the prompt, a window over the generated tokens.

    Every prompt token stays visible; of the tokens generated after it only
    the last ``rswa_window`` are attended.  The manager (``RSWAManager``)
    frees the whole blocks between the end of the prompt and the start of
    that window as decoding moves on, so a request holds about
    ``prompt + rswa_window`` tokens of blocks however long it decodes.  Its
    layout, page size and memory bound are full attention's, and it groups
    with full-attention layers.
    """

    rswa_window: int

    def _post_init_head_sizes(self) -> None:
        super()._post_init_head_sizes()
        _check_int(type(self).__name__, "rswa_window", self.rswa_window)

    @classmethod
    def merge(cls, specs: list):
        """Merge R-SWA specs: one window for all, the rest as :meth:`FullAttentionSpec.merge`.

        Raises:
            ValueError: an empty list, or differing recorded window sizes (as in vLLM).
            AssertionError: a spec that is not R-SWA, differing ``rswa_window``,
                or differing attention fields (as in vLLM).
        """
        if not specs:
            raise ValueError("cannot merge an empty list of KV cache specs")
        if not all(isinstance(spec, RSWASpec) for spec in specs):
            raise AssertionError("All attention layers in the same KV cache group must be RSWASpec.")
        windows = {spec.rswa_window for spec in specs}
        if len(windows) != 1:
            raise AssertionError(f"All R-SWA layers must share the same rswa_window, got {windows}")
        base = FullAttentionSpec.merge(specs)
        return cls(
            block_size=base.block_size,
            block_stride_alignment=base.block_stride_alignment,
            num_kv_heads=base.num_kv_heads,
            head_size=base.head_size,
            head_size_v=base.head_size_v,
            dtype=base.dtype,
            kv_quant_mode=base.kv_quant_mode,
            dcp_sharded=base.dcp_sharded,
            max_tp_shards=base.max_tp_shards,
            page_size_padded=base.page_size_padded,
            num_head_slots=base.num_head_slots,
            state_content_bytes=base.state_content_bytes,
            tokens_per_state=base.tokens_per_state,
            sliding_window=base.sliding_window,
            attention_chunk_size=base.attention_chunk_size,
            non_causal=base.non_causal,
            rswa_window=windows.pop(),
        )
