"""Windowed and ring managers (pure-Python twin).

From vLLM 0.33.0's ``vllm/v1/core/single_type_kv_cache_manager.py``:
``SlidingWindowManager`` (with its reachable-block masks, dense and sparse),
``ChunkedLocalAttentionManager`` and ``RSWAManager``: the managers whose
attention sees only part of the context, so blocks outside the window, chunk
or decode window can be freed; and ``CircularBufferManager``, one ring block
per request.  A sliding-window group with bounded replay is served by
``SlidingWindowManager`` too: its spec is not prefix-cacheable, so the group
caches nothing and the coordinators give it no hits.
"""

from __future__ import annotations

from collections.abc import Sequence

from kvcy.kv_cache_interface import ChunkedLocalAttentionSpec, KVCacheSpec, RSWASpec, SlidingWindowSpec
from kvcy._fast.kv_cache_py._common import _READ_ONLY, _check_count, cdiv
from kvcy._fast.kv_cache_py.block_pool_block_map import resolve_block_hashes
from kvcy._fast.kv_cache_py.kv_cache_utils import KVCacheBlock
from kvcy._fast.kv_cache_py.single_type_kv_cache_manager import (
    FullAttentionManager,
    SingleTypeKVCacheManager,
    _check_hit_args,
    _check_mask_args,
    _check_world_sizes,
)


def _hit_blocks(sliding_window: int, block_size: int, use_eagle: bool) -> int:
    """Contiguous cached blocks a sliding-window hit needs: the window before the next
    token, plus, with EAGLE, the block it looks past the boundary and drops."""
    return cdiv(sliding_window - 1, block_size) + (1 if use_eagle else 0)


def _window_mask(start_block: int, end_block: int, alignment_tokens: int, block_size: int,
                 sliding_window: int, use_eagle: bool) -> list[bool] | None:
    # SlidingWindowManager.reachable_block_mask.
    if block_size <= 0 or alignment_tokens % block_size != 0:
        return None
    per_segment = alignment_tokens // block_size
    need = _hit_blocks(sliding_window, block_size, use_eagle)
    if need >= per_segment:
        return None
    shift = 1 if use_eagle else 0
    first = per_segment - need
    mask = [False] * max(end_block - start_block, 0)
    for i in range(start_block, end_block):
        if i >= shift and (i - shift) % per_segment >= first:
            mask[i - start_block] = True
    return mask


def _sparse_window_mask(start_block: int, end_block: int, alignment_tokens: int, block_size: int,
                        sliding_window: int, use_eagle: bool, retention_interval: int | None,
                        boundaries: Sequence[int], final_segment_end_block: int | None) -> list[bool] | None:
    # SlidingWindowManager.reachable_block_mask with every policy: a hit needs the
    # window's trailing blocks before an aligned boundary (with EAGLE one more, ending a
    # block past it).  Retention None keeps that tail at every alignment boundary, a
    # positive interval once per interval, 0 at none; sparse retention also keeps the
    # tail ending at each of ``boundaries`` (floored to the alignment).
    # ``final_segment_end_block`` (not with EAGLE) keeps the tail of a last, partial
    # segment ending there.
    if alignment_tokens % block_size != 0:
        return None
    need = _hit_blocks(sliding_window, block_size, use_eagle)
    shift = 1 if use_eagle else 0
    mask = [False] * max(end_block - start_block, 0)
    if retention_interval is None:
        segment_tokens = alignment_tokens
    else:
        segment_tokens = retention_interval
    if segment_tokens:
        per_segment = segment_tokens // block_size
        if need >= per_segment:
            return None
        first = per_segment - need
        for i in range(start_block, end_block):
            if i >= shift and (i - shift) % per_segment >= first:
                mask[i - start_block] = True
        if final_segment_end_block is not None and not use_eagle:
            size = final_segment_end_block % per_segment
            if size:
                tail_start = max(final_segment_end_block - size, final_segment_end_block - need)
                for i in range(max(start_block, tail_start), min(end_block, final_segment_end_block)):
                    mask[i - start_block] = True
    if retention_interval is not None:
        for boundary in boundaries:
            end = boundary // alignment_tokens * alignment_tokens // block_size + shift
            for j in range(max(start_block, end - need), min(end_block, end)):
                mask[j - start_block] = True
    return mask


def _align_hit(computed: tuple, block_size: int, alignment_tokens: int) -> None:
    """Trim every group's hit blocks until the hit is a multiple of ``alignment_tokens``."""
    while len(computed[0]) * block_size % alignment_tokens != 0:
        for blocks in computed:
            blocks.pop()


class SlidingWindowManager(SingleTypeKVCacheManager):
    """Sliding-window attention: only the last ``sliding_window`` tokens are attended."""

    _RULES = {**SingleTypeKVCacheManager._RULES, "sliding_window": _READ_ONLY, "extra_retained_tokens": _READ_ONLY}

    def __init__(self, kv_cache_spec: SlidingWindowSpec, *args, **kwargs) -> None:
        super().__init__(kv_cache_spec, *args, **kwargs)
        self.sliding_window = kv_cache_spec.sliding_window
        # Tokens below the window whose blocks stay (not attended): multi-module MTP
        # re-prefills the last few tokens and needs the window before them.
        self.extra_retained_tokens = kv_cache_spec.extra_retained_tokens

    @classmethod
    def find_longest_cache_hit(
        cls, block_hashes, max_length, kv_cache_group_ids, block_pool, kv_cache_spec,
        drop_eagle_block, alignment_tokens, dcp_world_size=1, pcp_world_size=1,
    ):
        _check_world_sizes(dcp_world_size, pcp_world_size)
        if dcp_world_size != 1:  # (vLLM's assertions, raised even under python -O)
            raise AssertionError("DCP not support sliding window attn now.")
        if pcp_world_size != 1:
            raise AssertionError("PCP not support sliding window attn now.")
        _check_hit_args(kv_cache_group_ids, block_pool, alignment_tokens)
        block_size = kv_cache_spec.block_size
        hashes = resolve_block_hashes(block_hashes, block_pool.hash_block_size, block_size)
        needed = _hit_blocks(kv_cache_spec.sliding_window, block_size, drop_eagle_block)
        max_blocks = min(max_length // block_size, len(hashes))
        n_groups = len(kv_cache_group_ids)
        null = block_pool.null_block
        computed = tuple([null] * max_blocks for _ in range(n_groups))
        contiguous = 0
        found = False
        # (a run must end where the hit, once EAGLE drops its last block, is aligned)
        end_shift = 0 if drop_eagle_block else 1
        for i in range(max_blocks - 1, -1, -1):
            cached = block_pool.get_cached_block(hashes[i], kv_cache_group_ids)
            if cached is not None:
                if contiguous == 0 and ((i + end_shift) * block_size) % alignment_tokens != 0:
                    continue
                for g in range(n_groups):
                    computed[g][i] = cached[g]
                contiguous += 1
                if contiguous >= needed:
                    for blocks in computed:
                        del blocks[i + contiguous :]
                    found = True
                    break
            else:
                contiguous = 0
        if not found:
            for blocks in computed:
                del blocks[contiguous:]
            _align_hit(computed, block_size, alignment_tokens)
        if drop_eagle_block and computed[0]:
            for blocks in computed:
                blocks.pop()
            _align_hit(computed, block_size, alignment_tokens)
        return computed, len(computed[0]) * block_size

    def get_num_skipped_tokens(self, num_computed_tokens: int) -> int:
        """Tokens before the window of the next token, less ``extra_retained_tokens``."""
        return max(0, num_computed_tokens - self.sliding_window + 1 - self.extra_retained_tokens)

    @classmethod
    def reachable_block_mask(
        cls,
        start_block: int,
        end_block: int,
        alignment_tokens: int | None,
        kv_cache_spec: KVCacheSpec,
        use_eagle: bool,
        retention_interval: int | None = None,
        reachable_boundaries: Sequence[int] = (),
        dcp_world_size: int = 1,
        final_segment_end_block: int | None = None,
    ) -> list[bool] | None:
        """A hit ends on a multiple of ``alignment_tokens`` and reads the window's blocks
        before it (with EAGLE, one more, ending one block past the boundary): of each
        aligned segment only those trailing blocks are reachable.  None: all are (the
        window spans a whole segment, or the alignment is not a whole number of blocks).

        Sparse retention: a positive ``retention_interval`` keeps the tail once per
        interval instead of once per alignment, 0 at no segment; either way the tail
        ending at each of ``reachable_boundaries`` (floored to the alignment) is kept.
        Without EAGLE, ``final_segment_end_block`` also keeps the tail of the last,
        partial segment, which ends there.
        """
        if not isinstance(kv_cache_spec, SlidingWindowSpec):
            raise AssertionError("SlidingWindowManager.reachable_block_mask takes a SlidingWindowSpec")
        start_block = _check_count("start_block", start_block)
        end_block = _check_count("end_block", end_block)
        retention_interval, boundaries, final_segment_end_block = _check_mask_args(
            retention_interval, reachable_boundaries, dcp_world_size, final_segment_end_block
        )
        if alignment_tokens is None:
            return None
        alignment_tokens = _check_count("alignment_tokens", alignment_tokens)
        if retention_interval is None and final_segment_end_block is None:
            return _window_mask(start_block, end_block, alignment_tokens, kv_cache_spec.block_size * dcp_world_size,
                                kv_cache_spec.sliding_window, bool(use_eagle))
        if alignment_tokens == 0:
            raise ValueError("alignment_tokens must be positive, got 0")
        return _sparse_window_mask(start_block, end_block, alignment_tokens, kv_cache_spec.block_size * dcp_world_size,
                                   kv_cache_spec.sliding_window, bool(use_eagle), retention_interval,
                                   boundaries, final_segment_end_block)

    def _reachable(self, start_block: int, end_block: int) -> list[bool] | None:
        return _window_mask(start_block, end_block, self.cache_hit_alignment_tokens, self.block_size,
                            self.sliding_window, self.use_eagle)

    def _sparse_reachable(self, start_block: int, end_block: int, retention_interval: int,
                          boundaries: list[int]) -> list[bool] | None:
        return _sparse_window_mask(start_block, end_block, self.cache_hit_alignment_tokens, self.block_size,
                                   self.sliding_window, self.use_eagle, retention_interval, boundaries, None)


_CHUNKED_ALIGNMENT = "KV cache groups with different block sizes are not compatible with chunked local attention now"


class ChunkedLocalAttentionManager(SingleTypeKVCacheManager):
    """Chunked local attention: tokens attend only within their chunk."""

    _RULES = {**SingleTypeKVCacheManager._RULES, "attention_chunk_size": _READ_ONLY}

    def __init__(self, kv_cache_spec: ChunkedLocalAttentionSpec, *args, **kwargs) -> None:
        super().__init__(kv_cache_spec, *args, **kwargs)
        self.attention_chunk_size = kv_cache_spec.attention_chunk_size

    @classmethod
    def find_longest_cache_hit(
        cls, block_hashes, max_length, kv_cache_group_ids, block_pool, kv_cache_spec,
        drop_eagle_block, alignment_tokens, dcp_world_size=1, pcp_world_size=1,
    ):
        _check_world_sizes(dcp_world_size, pcp_world_size)
        if dcp_world_size != 1:  # (vLLM's assertions, raised even under python -O)
            raise AssertionError("DCP not support chunked local attn now.")
        if pcp_world_size != 1:
            raise AssertionError("PCP not support chunked local attn now.")
        _check_hit_args(kv_cache_group_ids, block_pool, alignment_tokens)
        if drop_eagle_block:
            raise AssertionError("Hybrid KV cache is not supported for eagle + chunked local attention.")  # (vLLM asserts, at lookup)
        block_size = kv_cache_spec.block_size
        if block_size != alignment_tokens:  # (vLLM asserts, at lookup)
            raise AssertionError(_CHUNKED_ALIGNMENT)
        hashes = resolve_block_hashes(block_hashes, block_pool.hash_block_size, block_size)
        chunk = kv_cache_spec.attention_chunk_size
        start_block = (max_length // chunk * chunk) // block_size
        max_blocks = max_length // block_size
        n_groups = len(kv_cache_group_ids)
        null = block_pool.null_block
        computed = tuple([null] * start_block for _ in range(n_groups))
        for i in range(start_block, min(max_blocks, len(hashes))):
            cached = block_pool.get_cached_block(hashes[i], kv_cache_group_ids)
            if cached is None:
                break
            for g in range(n_groups):
                computed[g].append(cached[g])
        return computed, len(computed[0]) * block_size

    def get_num_skipped_tokens(self, num_computed_tokens: int) -> int:
        return (num_computed_tokens // self.attention_chunk_size) * self.attention_chunk_size


def _check_prompt_tokens(num_prompt_tokens) -> int | None:
    # remove_skipped_blocks' num_prompt_tokens: None, or a token count.
    if num_prompt_tokens is None:
        return None
    return _check_count("num_prompt_tokens", num_prompt_tokens)


class RSWAManager(FullAttentionManager):
    """Reference sliding-window attention: full attention over the prompt, the last
    ``rswa_window`` tokens of what follows.

    Given the prompt length, ``remove_skipped_blocks`` frees the whole blocks
    between the prompt's last block and the start of the decode window
    (replacing them with the null block); otherwise it is full attention's.
    Hits, allocation and caching are full attention's.
    """

    _RULES = {**FullAttentionManager._RULES, "rswa_window": _READ_ONLY}

    def __init__(self, kv_cache_spec: RSWASpec, *args, **kwargs) -> None:
        super().__init__(kv_cache_spec, *args, **kwargs)
        self.rswa_window = kv_cache_spec.rswa_window

    def remove_skipped_blocks(
        self, request_id: str, processed_computed_tokens: int, num_prompt_tokens: int | None = None
    ) -> None:
        """Free the blocks wholly inside ``[ceil(prompt / block) * block,
        max(prompt, processed_computed_tokens - rswa_window))``: after the prompt's
        last block, before the decode window.  Without ``num_prompt_tokens``, as
        full attention (nothing to free).

        Raises:
            TypeError / ValueError: ``num_prompt_tokens`` is not None or a count.
        """
        num_prompt_tokens = _check_prompt_tokens(num_prompt_tokens)
        if num_prompt_tokens is None:
            super().remove_skipped_blocks(request_id, processed_computed_tokens)
            return
        window_start = max(num_prompt_tokens, processed_computed_tokens - self.rswa_window)
        self._remove_blocks_in_range(request_id, cdiv(num_prompt_tokens, self.block_size),
                                     window_start // self.block_size)


class CircularBufferManager(FullAttentionManager):
    """A ring: one block per request for its whole life, never cached, never hit.

    The first allocation (new tokens or external ones) takes the block; every
    later one takes nothing.  Hits and skipped blocks do not apply.
    """

    def _claim_ring_block(self, request_id: str, record_for_zeroing: bool = True) -> list[KVCacheBlock]:
        req_blocks = self._req_to_blocks.get(request_id)
        if req_blocks:
            return []
        new_blocks = self.block_pool.get_new_blocks(1)
        if req_blocks is None:
            self._req_to_blocks[request_id] = req_blocks = []
        req_blocks.extend(new_blocks)
        if self._record_new_block_ids and record_for_zeroing:  # (never: rings are not zeroed)
            self.new_block_ids.extend([b._block_id for b in new_blocks])
        return new_blocks

    def get_num_blocks_to_allocate(
        self,
        request_id: str,
        num_tokens: int,
        new_computed_blocks: Sequence[KVCacheBlock],
        total_computed_tokens: int,
        num_local_computed_tokens: int,
        num_tokens_main_model: int,
        apply_admission_cap: bool = False,
        prefill_end: int = 0,
    ) -> int:
        """1 until the request holds its ring block, then 0."""
        return 0 if self._req_to_blocks.get(request_id) else 1

    def allocate_new_blocks(self, request_id: str, num_tokens: int, num_tokens_main_model: int) -> list[KVCacheBlock]:
        """The ring block if the request has none yet, else nothing."""
        return self._claim_ring_block(request_id)

    def allocate_external_computed_blocks(
        self,
        request_id: str,
        num_local_computed_tokens: int,
        num_external_computed_tokens: int,
        record_for_zeroing: bool = True,
    ) -> None:
        """The ring block if the request has none yet (whatever the token counts)."""
        self._claim_ring_block(request_id, record_for_zeroing)

    @classmethod
    def find_longest_cache_hit(
        cls, block_hashes, max_length, kv_cache_group_ids, block_pool, kv_cache_spec,
        drop_eagle_block, alignment_tokens, dcp_world_size=1, pcp_world_size=1,
    ):
        """No hit: an empty list per group, 0 tokens."""
        _check_world_sizes(dcp_world_size, pcp_world_size)
        return tuple([] for _ in kv_cache_group_ids), 0

    def cache_blocks(
        self,
        request,
        num_tokens: int,
        retention_interval: int | None = None,
        replay_boundaries: Sequence[int] = (),
    ) -> None:
        return None

    def add_local_computed_blocks(
        self,
        request_id: str,
        new_computed_blocks: Sequence[KVCacheBlock],
        num_local_computed_tokens: int,
        num_external_computed_tokens: int,
    ) -> None:
        """Nothing: a ring takes no hits (any given are ignored, as in vLLM)."""
        return None

    def _check_hits(self, new_computed_blocks, total_computed_tokens: int) -> None:
        return None

    def _add_local_computed_blocks(self, request_id, new_computed_blocks, num_local_computed_tokens,
                                   num_external_computed_tokens) -> None:
        return None

    def remove_skipped_blocks(
        self, request_id: str, processed_computed_tokens: int, num_prompt_tokens: int | None = None
    ) -> None:
        return None

    def get_num_skipped_tokens(self, num_computed_tokens: int) -> int:
        return 0
