"""Mamba's block bookkeeping, with align mode (pure-Python twin).

From vLLM 0.33.0's ``vllm/v1/core/single_type_kv_cache_manager.py``
(``MambaManager``), with the helpers it and the hybrid coordinator use:
``get_mamba_prefill_checkpoint_position`` and ``is_mamba_prefill_checkpoint_valid``
(``vllm/v1/kv_cache_interface.py``), ``partial_hash_hits_enabled`` and
``eagle_proof_margin`` (``vllm/v1/core/kv_cache_utils.py``).

In align mode a request keeps the state block of its last computed token and,
while it prefills, the states at block (or hash-block) boundaries a later
request can resume from; the states in between are null blocks.  A hit may end
inside a block (fine-grained partial hits): the request then copies the shared
state block before writing it (copy-on-write, ``take_pending_cow_copies``).
"""

from __future__ import annotations

from collections.abc import Sequence
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from kvcy.kv_cache_interface import KVCacheSpec, MambaSpec, iter_layer_specs
from kvcy._fast.kv_cache_py._common import _READ_ONLY, _request_id, cdiv
from kvcy._fast.kv_cache_py.block_pool_block_map import resolve_block_hashes
from kvcy._fast.kv_cache_py.kv_cache_utils import KVCacheBlock
from kvcy._fast.kv_cache_py.single_type_kv_cache_manager import (
    SingleTypeKVCacheManager,
    _as_flag,
    _check_hit_args,
    _check_mask_args,
    _check_world_sizes,
    _shared_prefix_boundary,
)

if TYPE_CHECKING:
    from kvcy._fast.kv_cache_py.request import Request


_MAMBA_CACHING = "Mamba prefix caching requires mamba_cache_mode='align'"
_RELOCATE = "Speculative Mamba blocks must be exclusively owned and unhashed before relocation"
# A count of speculative blocks per request; block ids are 32-bit, so more than 2**31 can
# never be held, and the compiled twin multiplies it by the block size in C.
_MAX_SPECULATIVE_BLOCKS = 2**31
_TOO_MANY_SPECULATIVE = "num_speculative_blocks must be below 2**31, got {}"


def get_mamba_prefill_checkpoint_position(
    num_tokens: int, hash_block_size: int, drop_eagle_block: bool, num_hash_lookahead_tokens: int = 0
) -> int:
    """The last hash boundary of a ``num_tokens`` prefill whose Mamba state a later
    request can reuse: it leaves the tokens a hit must recompute (the last one, or
    the hash lookahead) or, with EAGLE, one hash block below the last boundary."""
    limit = num_tokens if drop_eagle_block else num_tokens - max(1, num_hash_lookahead_tokens)
    position = limit // hash_block_size * hash_block_size
    if drop_eagle_block:
        position -= hash_block_size
    return position if position > 0 else 0


def is_mamba_prefill_checkpoint_valid(
    query_start: int,
    query_end: int,
    checkpoint_position: int,
    hash_block_size: int,
    mamba_block_size: int,
    checkpoint_alignment: int | None,
) -> bool:
    """Whether a backend can write the state at ``checkpoint_position`` while it
    computes tokens ``[query_start, query_end)`` (None alignment: it never can)."""
    if checkpoint_alignment is None:
        return False
    assert checkpoint_alignment > 0
    initial_state_col = (query_start - 1) // mamba_block_size
    checkpoint_col = cdiv(query_end, mamba_block_size) - 2
    return (
        query_start % hash_block_size == 0
        and checkpoint_col > initial_state_col
        and query_start + hash_block_size <= checkpoint_position
        and query_start < checkpoint_position < query_end
        and (checkpoint_position - query_start) % checkpoint_alignment == 0
    )


def _dcp_block_span(spec: Any, dcp_world_size: int) -> int:
    # Tokens one block of ``spec`` covers: dcp ranks each hold every dcp-th token.
    return spec.block_size * dcp_world_size if spec.dcp_sharded else spec.block_size


def partial_hash_hits_enabled(
    kv_cache_groups: Sequence,
    hash_block_size: int,
    dcp_world_size: int = 1,
    manager_classes: Sequence[type] | None = None,
) -> bool:
    """Whether prefix hits may end inside a block: some Mamba layer is in align mode
    with blocks coarser than the hash block, and (given ``manager_classes``, one per
    group) every other prefix-cacheable group either looks up fine-grained or has
    blocks of the hash block's size.  Under decode context parallelism
    (``dcp_world_size > 1``) a sharded group's block spans ``block_size * dcp``
    tokens, and a Mamba block as large as the hash block already qualifies.
    """
    if not any(
        isinstance(spec, MambaSpec) and spec.mamba_cache_mode == "align"
        and (spec.block_size > hash_block_size if dcp_world_size == 1 else spec.block_size >= hash_block_size)
        for group in kv_cache_groups
        for spec in iter_layer_specs(group.kv_cache_spec)
    ):
        return False
    if manager_classes is None:
        return True
    return not any(
        group.kv_cache_spec.prefix_cacheable
        and not klass.supports_fine_grained_hash_lookup
        and _dcp_block_span(group.kv_cache_spec, dcp_world_size) != hash_block_size
        for group, klass in zip(kv_cache_groups, manager_classes)
    )


def eagle_proof_margin(block_size: int, hash_block_size: int, fine_grained_lookup: bool) -> int:
    """How far past a candidate hit an EAGLE group looks before dropping: one hash
    block for a fine-grained lookup over coarser blocks, else one block."""
    if fine_grained_lookup and block_size > hash_block_size:
        return hash_block_size
    return block_size


def _mamba_mask(start_block: int, end_block: int, alignment_tokens: int, block_size: int,
                retention_interval: int, boundaries: Sequence[int]) -> list[bool] | None:
    # MambaManager.reachable_block_mask under sparse retention: one state per
    # interval (none when 0), and the state ending at each boundary floored to
    # the alignment.
    mask = [False] * (end_block - start_block)
    if retention_interval:
        per_segment = retention_interval // block_size
        if per_segment <= 1:
            return None
        first = (start_block + per_segment) // per_segment * per_segment - 1
        for i in range(first - start_block, len(mask), per_segment):
            mask[i] = True
    for boundary in boundaries:
        block = boundary // alignment_tokens * alignment_tokens // block_size - 1
        if start_block <= block < end_block:
            mask[block - start_block] = True
    return mask


class MambaManager(SingleTypeKVCacheManager):
    """Mamba: one recurrent state per request; in align mode, prefix caching of
    its states at block and hash-block boundaries.

    ``drop_eagle_checkpoint_block`` (set by the coordinator with EAGLE) puts the
    prefill checkpoints one hash block lower, where EAGLE's hits land.

    Raises:
        AssertionError: ``enable_caching`` with a mode other than "align"
            (vLLM's assertion, raised even under ``python -O``).
    """

    _RULES = {
        **SingleTypeKVCacheManager._RULES,
        **dict.fromkeys(
            ("mamba_cache_mode", "num_speculative_blocks", "has_prefill_checkpoint_blocks",
             "cached_blocks_this_step", "last_state_block_idx", "_num_retired_blocks", "_allocated_reqs",
             "_allocated_block_reqs", "_checkpoints", "_checkpoint_at", "_producer_partial_tail_reqs", "_align"),
            _READ_ONLY,
        ),
        "drop_eagle_checkpoint_block": _as_flag,
    }

    supports_fine_grained_hash_lookup = True

    def __init__(self, kv_cache_spec: MambaSpec, *args, **kwargs) -> None:
        super().__init__(kv_cache_spec, *args, **kwargs)
        mode = getattr(kv_cache_spec, "mamba_cache_mode", "none")
        if mode != "align" and self.enable_caching:
            raise AssertionError(_MAMBA_CACHING)
        self.mamba_cache_mode = mode
        self._align = mode == "align"
        num_speculative_blocks = int(getattr(kv_cache_spec, "num_speculative_blocks", 0))
        if num_speculative_blocks >= _MAX_SPECULATIVE_BLOCKS:
            raise ValueError(_TOO_MANY_SPECULATIVE.format(num_speculative_blocks))
        self.num_speculative_blocks = num_speculative_blocks
        self.has_prefill_checkpoint_blocks = self._align and kv_cache_spec.num_prefill_checkpoint_blocks > 0
        self.drop_eagle_checkpoint_block = False
        self.cached_blocks_this_step: set[bytes] = set()
        # Align mode: request id -> index of the state block allocated the step
        # before (freed a step later), -> blocks up to which states were retired,
        # -> (position, block index) of this allocation's prefill checkpoint,
        # -> (block, tokens) of its own prompt-boundary partial tail; the requests
        # that were allocated blocks.
        self.last_state_block_idx: dict[str, int] = {}
        self._num_retired_blocks: dict[str, int] = {}
        self._allocated_reqs: set[str] = set()
        self._checkpoint_at: dict[str, tuple[int, int]] = {}
        self._producer_partial_tail_reqs: dict[str, tuple[KVCacheBlock, int]] = {}

    @property
    def _checkpoints(self) -> MappingProxyType:
        """Read-only view of the prefill checkpoint each request reserved, by request id:
        ``(position, block index)`` (vLLM's tests read it)."""
        return MappingProxyType(self._checkpoint_at)

    @property
    def _allocated_block_reqs(self) -> frozenset[str]:
        """The requests that have allocated their running blocks (a frozen copy: vLLM's tests read it)."""
        return frozenset(self._allocated_reqs)

    @property
    def has_positionally_stable_blocks(self) -> bool:
        """False in align mode (states in between are nulled, speculative blocks move)."""
        return not self._align

    # -------------------------------------------------------------- lookup
    @classmethod
    def find_longest_cache_hit(
        cls, block_hashes, max_length, kv_cache_group_ids, block_pool, kv_cache_spec,
        drop_eagle_block, alignment_tokens, dcp_world_size=1, pcp_world_size=1,
    ):
        """The last cached state whose end is a multiple of ``alignment_tokens``, null
        blocks before it.  With ``alignment_tokens`` below the block size (partial
        hits), the state at the last cached hash boundary, which may end inside its
        block.  Mamba hits are never shortened for EAGLE (draft models have no
        Mamba layers)."""
        _check_world_sizes(dcp_world_size, pcp_world_size)
        if dcp_world_size != 1:  # (vLLM's assertions, raised even under python -O)
            raise AssertionError("DCP not support mamba now.")
        if pcp_world_size != 1:
            raise AssertionError("PCP not support mamba now.")
        _check_hit_args(kv_cache_group_ids, block_pool, alignment_tokens)
        block_size = kv_cache_spec.block_size
        n_groups = len(kv_cache_group_ids)
        null = block_pool.null_block
        computed: tuple[list[KVCacheBlock], ...] = tuple([] for _ in range(n_groups))
        if alignment_tokens < block_size and block_size % alignment_tokens == 0:
            scale = block_size // alignment_tokens
            for fine_idx in range(min(max_length // alignment_tokens, len(block_hashes)) - 1, -1, -1):
                cached = block_pool.get_cached_block(block_hashes[fine_idx], kv_cache_group_ids)
                if cached is not None:
                    block_idx = fine_idx // scale
                    for g in range(n_groups):
                        computed[g].extend([null] * block_idx)
                        computed[g].append(cached[g])
                    return computed, (fine_idx + 1) * alignment_tokens
            return computed, 0
        hashes = resolve_block_hashes(block_hashes, block_pool.hash_block_size, block_size)
        for i in range(min(max_length // block_size, len(hashes)) - 1, -1, -1):
            if ((i + 1) * block_size) % alignment_tokens != 0:
                continue
            cached = block_pool.get_cached_block(hashes[i], kv_cache_group_ids)
            if cached is not None:
                for g in range(n_groups):
                    computed[g].extend([null] * i)
                    computed[g].append(cached[g])
                return computed, (i + 1) * block_size
        return computed, 0

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
        """Which state blocks of ``[start_block, end_block)`` to cache: all (None) under
        dense retention; under sparse retention one per ``retention_interval`` (none for
        0) and the state ending at each of ``reachable_boundaries`` (floored to
        ``alignment_tokens``)."""
        retention_interval, boundaries, _ = _check_mask_args(
            retention_interval, reachable_boundaries, dcp_world_size, final_segment_end_block
        )
        if retention_interval is None or alignment_tokens is None:
            return None
        assert isinstance(kv_cache_spec, MambaSpec)
        if alignment_tokens == 0:
            raise ValueError("alignment_tokens must be positive, got 0")
        return _mamba_mask(start_block, end_block, alignment_tokens, kv_cache_spec.block_size,
                           retention_interval, boundaries)

    def _sparse_reachable(self, start_block: int, end_block: int, retention_interval: int,
                          boundaries: list[int]) -> list[bool] | None:
        return _mamba_mask(start_block, end_block, self.cache_hit_alignment_tokens, self.block_size,
                           retention_interval, boundaries)

    # -------------------------------------------------------------- counting
    def get_num_skipped_tokens(self, num_computed_tokens: int) -> int:
        return max(0, num_computed_tokens - 1)

    def _needs_internal_checkpoint(self, request_id: str, query_start: int, query_end: int,
                                   checkpoint_position: int, prefill_end: int) -> bool:
        # Whether this chunk reserves a block for the prefill checkpoint the backend writes.
        checkpoint_idx = cdiv(query_end, self.block_size) - 2
        blocks = self._req_to_blocks.get(request_id, ())
        return (
            self.has_prefill_checkpoint_blocks
            and query_end >= prefill_end
            and is_mamba_prefill_checkpoint_valid(
                query_start, query_end, checkpoint_position, self.block_pool.hash_block_size,
                self.block_size, self.kv_cache_spec.prefill_checkpoint_alignment,
            )
            and checkpoint_idx >= 0
            and (
                checkpoint_idx >= len(blocks)
                or blocks[checkpoint_idx]._is_null
                or (request_id in self._allocated_reqs
                    and checkpoint_idx >= len(blocks) - self.num_speculative_blocks)
            )
        )

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
        """Blocks to take from the free pool; more than the pool has when the hit's
        state was cached this step (so the request waits for the next one).

        In align mode the state blocks this step needs (the running state, the
        speculative ones, a partial hit's copy and a prefill checkpoint), which
        may be negative when earlier steps allocated more.  Records the
        allocation's checkpoint (unless ``apply_admission_cap``).
        """
        n_hits = len(new_computed_blocks)  # (a TypeError for None, as the compiled twin's)
        if n_hits:
            last = new_computed_blocks[n_hits - 1]
            if not isinstance(last, KVCacheBlock):
                raise TypeError(f"blocks must be KVCacheBlock, got {type(last).__name__}")
            if last._key is not None and last._key in self.cached_blocks_this_step:
                return self.block_pool.num_gpu_blocks + 1
        if not self._align:
            if self.num_speculative_blocks > 0:
                num_tokens += self.block_size * self.num_speculative_blocks
            return super().get_num_blocks_to_allocate(
                request_id, num_tokens, new_computed_blocks, total_computed_tokens, num_local_computed_tokens,
                num_tokens_main_model, apply_admission_cap, prefill_end,
            )
        # (draft models have no Mamba layers: the lookahead tokens get no state)
        num_tokens = num_tokens_main_model
        nspec = self.num_speculative_blocks
        held = self._req_to_blocks.get(request_id, ())
        num_evictable = self._count_evictable(new_computed_blocks)
        num_new_blocks = cdiv(num_tokens, self.block_size) + nspec - n_hits - len(held)
        has_partial_hit = (self._has_partial_local_hit(new_computed_blocks, num_local_computed_tokens)
                           or request_id in self._partial_hit_reqs)
        if has_partial_hit:
            num_new_blocks = max(num_new_blocks, 0) + 1
        position = get_mamba_prefill_checkpoint_position(
            num_tokens, self.cache_hit_alignment_tokens, self.drop_eagle_checkpoint_block,
            self.block_pool.num_hash_lookahead_tokens,
        )
        if not self._needs_internal_checkpoint(request_id, total_computed_tokens, num_tokens, position,
                                               prefill_end):
            position = 0
        if not apply_admission_cap:
            if position > 0:
                self._checkpoint_at[request_id] = (position, cdiv(num_tokens, self.block_size) - 2)
            else:
                self._checkpoint_at.pop(request_id, None)
        if num_new_blocks > 0:
            cap = 1 + int(has_partial_hit) + int(position > 0)
            if request_id not in self._allocated_reqs:
                cap += nspec
            num_new_blocks = min(num_new_blocks, cap)
        return num_new_blocks + num_evictable

    def _count_evictable(self, blocks: Sequence[KVCacheBlock]) -> int:
        # Hits with no reference (in the free queue: touching them takes them out).
        queue = self.block_pool.free_block_queue if self.enable_caching else None
        n = 0
        for blk in blocks:
            if not isinstance(blk, KVCacheBlock):
                raise TypeError(f"blocks must be KVCacheBlock, got {type(blk).__name__}")
            if blk._ref_cnt == 0 and not blk._is_null:
                if queue is not None and (blk._queue is not queue or blk._prev_free_block is None
                                          or blk._next_free_block is None):
                    raise RuntimeError(f"remove() called on an invalid block: {blk}")
                n += 1
        return n

    # -------------------------------------------------------------- allocation
    def allocate_new_blocks(self, request_id: str, num_tokens: int, num_tokens_main_model: int) -> list[KVCacheBlock]:
        """The state blocks this step needs; in align mode the returned list also holds
        the null blocks and moved speculative blocks appended to the table, a
        partial hit's copy first when the request takes it now."""
        if not self._align:
            if self.num_speculative_blocks > 0:
                num_tokens += self.block_size * self.num_speculative_blocks
            return super().allocate_new_blocks(request_id, num_tokens, num_tokens_main_model)
        nspec = self.num_speculative_blocks
        req_blocks = self._req_to_blocks.setdefault(request_id, [])
        num_required = cdiv(num_tokens_main_model, self.block_size) + nspec
        checkpoint_block = int(request_id in self._checkpoint_at)
        partial = self._partial_hit_reqs.get(request_id)
        if num_required <= len(req_blocks) and partial is None and not checkpoint_block:
            self._allocated_reqs.add(request_id)
            return []
        prev_len = len(req_blocks)
        allocated = request_id in self._allocated_reqs
        if allocated:  # (the running state sits before the speculative blocks)
            self.last_state_block_idx[request_id] = prev_len - 1 - nspec
        elif prev_len > 0:  # (a hit: its last block holds the state)
            self.last_state_block_idx[request_id] = prev_len - 1
        num_skipped = num_required - nspec - 1
        null = self._null_block
        if prev_len < num_skipped:  # (states in between are nulls; not the checkpoint's slot)
            req_blocks.extend([null] * (num_skipped - checkpoint_block - prev_len))
        if allocated:
            for block_idx in range(prev_len - nspec, prev_len):
                if block_idx >= num_skipped - checkpoint_block:
                    break
                self._relocate_speculative_block(req_blocks, block_idx)
        num_new = max(num_required - len(req_blocks), 0)
        if partial is not None:
            num_new += 1
        max_new = 1 + int(partial is not None) + checkpoint_block + (0 if allocated else nspec)
        if num_new > max_new:
            raise AssertionError(f"Mamba align mode allocates at most {max_new} blocks a step, asked for {num_new}")
        new_blocks = self.block_pool.get_new_blocks(num_new)
        returned = req_blocks[prev_len:]
        if partial is not None:
            block_idx, source = partial
            cow, new_blocks = new_blocks[0], new_blocks[1:]
            if allocated:
                # A running request's table only grows: it stays on the source, whose
                # entries move to the copy (filled by this step's copy before the source
                # is written), so hits on them wait for the next step.
                assert req_blocks[block_idx] is source
                self.block_pool.move_block_hashes(source, cow)
                self._pending_cow_copies.append((source, cow))
                source._ref_cnt += 1
                tail = self._producer_partial_tail_reqs.pop(request_id, None)
                if tail is not None:
                    assert tail[0] is source
                    self._pending_boundary_state_offloads.append((request_id, self.kv_cache_group_id, cow, tail[1]))
                if cow._key is not None:
                    self.cached_blocks_this_step.add(cow._key)
            else:
                self._apply_cow(request_id, block_idx, source, cow)
                returned = [cow] + returned
        req_blocks.extend(new_blocks)
        self._allocated_reqs.add(request_id)
        self._partial_hit_reqs.pop(request_id, None)
        returned.extend(new_blocks)
        return returned

    def _relocate_speculative_block(self, req_blocks: list[KVCacheBlock], block_idx: int) -> None:
        # A speculative block this step leaves behind moves to the table's end.
        block = req_blocks[block_idx]
        if not self.block_pool.is_block_writable(block):
            raise AssertionError(_RELOCATE)
        req_blocks.append(block)
        req_blocks[block_idx] = self._null_block

    # -------------------------------------------------------------- freeing
    def _remove_blocks_in_range(self, request_id: str, first_block: int, last_block: int) -> None:
        if not self._align:
            return super()._remove_blocks_in_range(request_id, first_block, last_block)
        blocks = self._req_to_blocks.get(request_id)
        if blocks is None:
            return
        first_block = max(first_block, self._num_retired_blocks.get(request_id, 0))
        last_block = min(last_block, len(blocks))
        if first_block >= last_block:
            return
        null = self._null_block
        freed = []
        for i in range(last_block - 1, first_block - 1, -1):  # (prefill leaves null gaps: skip them)
            if blocks[i] is not null:
                freed.append(blocks[i])
                blocks[i] = null
        if freed:
            self.block_pool.free_blocks(freed)
        self._num_retired_blocks[request_id] = last_block

    def remove_skipped_blocks(
        self, request_id: str, processed_computed_tokens: int, num_prompt_tokens: int | None = None
    ) -> None:
        """Free the states before the last computed token; in align mode also the
        state block of two steps ago (the previous step's was copied from it)."""
        super().remove_skipped_blocks(request_id, processed_computed_tokens, num_prompt_tokens)
        if not self._align:
            return
        idx = self.last_state_block_idx.get(request_id)
        if idx is not None and idx < cdiv(processed_computed_tokens, self.block_size) - 1:
            blocks = self._req_to_blocks[request_id]
            if blocks[idx] is not self._null_block:
                self.block_pool.free_blocks([blocks[idx]])
                blocks[idx] = self._null_block

    def pop_blocks_for_free(self, request_id: str) -> list[KVCacheBlock]:
        if self._align:
            self._allocated_reqs.discard(request_id)
            self.last_state_block_idx.pop(request_id, None)
            self._num_retired_blocks.pop(request_id, None)
            self._checkpoint_at.pop(request_id, None)
            self._producer_partial_tail_reqs.pop(request_id, None)
            # (its blocks go back now: its boundary states not yet handed off go too)
            if self._pending_boundary_state_offloads:
                object.__setattr__(self, "_pending_boundary_state_offloads", [
                    e for e in self._pending_boundary_state_offloads if e[0] != request_id
                ])
        return super().pop_blocks_for_free(request_id)

    def finalize_partial_tail_offload(self, request_id: str, num_computed_tokens: int,
                                      num_in_flight_tokens: int) -> tuple[int, KVCacheBlock, int] | None:
        """A finishing request's own prompt-boundary partial tail, (group id, block,
        boundary tokens), if no later token was computed into its block; else None."""
        if not self._align:
            return None
        tail = self._producer_partial_tail_reqs.pop(request_id, None)
        if tail is None:
            return None
        block, boundary = tail
        if num_in_flight_tokens != 0 or num_computed_tokens != boundary:
            return None
        return self.kv_cache_group_id, block, boundary

    # -------------------------------------------------------------- caching
    def cache_blocks(
        self,
        request: Request,
        num_tokens: int,
        retention_interval: int | None = None,
        replay_boundaries: Sequence[int] = (),
    ) -> None:
        """Cache the request's state blocks (see ``SingleTypeKVCacheManager.cache_blocks``);
        in align mode also the state at this step's prefill checkpoint or at the
        prompt's last reusable hash boundary (a partial entry when it ends inside its
        block).  What is cached is remembered for this step (hits on it wait), and in
        align mode queued for a connector (``take_pending_boundary_state_offloads``)."""
        request_id = _request_id(request)  # (a TypeError for a non-request, as the compiled twin)
        before = self._num_cached_block.get(request_id, 0)
        super().cache_blocks(request, num_tokens, retention_interval, replay_boundaries)
        after = self._num_cached_block.get(request_id, 0)
        if self._align:
            key = self._cache_partial_tail_block(request, num_tokens, retention_interval)
            if key is not None:
                self.cached_blocks_this_step.add(key)
        if after > before:
            blocks = self._req_to_blocks[request_id]
            for idx in range(before, after):
                block = blocks[idx]
                if block._is_null or block._key is None:
                    continue
                self.cached_blocks_this_step.add(block._key)
                if self._align:
                    assert block._block_hash_num_tokens is not None
                    self._pending_boundary_state_offloads.append(
                        (request_id, self.kv_cache_group_id, block, block._block_hash_num_tokens)
                    )

    def _cache_partial_tail_block(self, request: Request, num_tokens: int,
                                  retention_interval: int | None) -> bytes | None:
        # The state this step leaves at a hash boundary, as a cache entry: this
        # allocation's checkpoint (re-keyed at its position, or dropped when no
        # hit can reach it), else the prompt's last reusable hash boundary (or,
        # with shared-prefix checkpoints, its junction).  The entry's key, or None.
        pool = self.block_pool
        request_id = request.request_id
        checkpoint = self._checkpoint_at.get(request_id)
        if checkpoint is not None:
            position, idx = checkpoint
            blocks = self._req_to_blocks[request_id]
            assert 0 <= idx < len(blocks)
            block = blocks[idx]
            is_prompt_checkpoint = position == get_mamba_prefill_checkpoint_position(
                request.num_prompt_tokens, self.cache_hit_alignment_tokens, self.drop_eagle_checkpoint_block,
                pool.num_hash_lookahead_tokens,
            )
            retained = False
            if position % self.block_size == 0:
                block_idx = position // self.block_size - 1
                mask = self.reachable_block_mask(block_idx, block_idx + 1, self.cache_hit_alignment_tokens,
                                                 self.kv_cache_spec, self.drop_eagle_checkpoint_block,
                                                 retention_interval=retention_interval)
                retained = mask is None or mask[0]
            if not is_prompt_checkpoint and not retained and position != _shared_prefix_boundary(request):
                pool._evict_cached_block(block)  # (a transient state: its slot is overwritten)
                return None
            if block._block_hash_num_tokens == position:
                return None
            return pool.cache_partial_block(request, block, position, self.kv_cache_group_id, self.block_size,
                                            replace_existing_hashes=True)
        if num_tokens <= 0 or num_tokens % pool.hash_block_size != 0:
            return None
        boundary = get_mamba_prefill_checkpoint_position(
            request.num_prompt_tokens, pool.hash_block_size, self.drop_eagle_checkpoint_block,
            pool.num_hash_lookahead_tokens,
        )
        if num_tokens != boundary and not (
            self.shared_prefix_checkpoint
            and num_tokens == _shared_prefix_boundary(request)
            and request.num_computed_tokens < num_tokens <= request.num_prompt_tokens
        ):
            return None
        block_idx = cdiv(num_tokens, self.block_size) - 1
        blocks = self._req_to_blocks[request_id]
        if block_idx >= len(blocks):
            return None
        source = blocks[block_idx]
        if source._is_null or source._block_hash_num_tokens == num_tokens:
            return None
        key = pool.cache_partial_block(request, source, num_tokens, self.kv_cache_group_id, self.block_size)
        if key is not None and num_tokens % self.block_size:
            # This request made the entry; its next step overwrites the state, so
            # it copies it first (allocate_new_blocks) and hands the copy off.
            self._partial_hit_reqs[request_id] = (block_idx, source)
            self._num_cached_block[request_id] = block_idx
            self._producer_partial_tail_reqs[request_id] = (source, num_tokens)
        return key

    def new_step_starts(self) -> None:
        """A new scheduler step: states cached in earlier steps may now be hit."""
        self.cached_blocks_this_step.clear()
