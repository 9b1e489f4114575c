"""Per-attention-type block bookkeeping (pure-Python twin).

From vLLM 0.33.0's ``vllm/v1/core/single_type_kv_cache_manager.py``:
``SingleTypeKVCacheManager`` and the full-attention (and sink) and
cross-attention managers; Mamba's is in ``single_type_kv_cache_manager_mamba``, the
windowed ones in ``single_type_kv_cache_manager_local_attention``, the spec -> manager
map in ``single_type_kv_cache_manager_factory``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from kvcy.kv_cache_interface import AttentionSpec, CircularBufferSpec, KVCacheSpec, MambaSpec, SinkFullAttentionSpec
from kvcy._fast._request_tables import _BlockTable, _CountTable
from kvcy._fast.kv_cache_py._common import (_READ_ONLY, _Checked, _NeedsArguments, _check_count, _hashed, _request_id,
                                            cdiv)
from kvcy._fast.kv_cache_py.block_pool_block_map import _BlockHashView, resolve_block_hashes
from kvcy._fast.kv_cache_py.block_pool import BlockPool, _check_touchable
from kvcy._fast.kv_cache_py.kv_cache_utils import KVCacheBlock

if TYPE_CHECKING:
    from kvcy._fast.kv_cache_py.request import Request


def _check_hit_args(kv_cache_group_ids, block_pool, alignment_tokens) -> None:
    # find_longest_cache_hit's arguments, before any use: one block list per group (so at
    # least one group), a pool to look in, a hit length rounded down to a positive alignment.
    if not len(kv_cache_group_ids):
        raise ValueError("kv_cache_group_ids must not be empty")
    if not isinstance(block_pool, BlockPool):
        raise TypeError(f"block_pool must be a BlockPool, got {type(block_pool).__name__}")
    if _check_count("alignment_tokens", alignment_tokens) == 0:
        raise ValueError("alignment_tokens must be positive, got 0")
    for g in kv_cache_group_ids:  # (ints of 4 bytes: the cache keys hold them)
        if not isinstance(g, int):
            raise TypeError(f"kv_cache_group_ids must be ints, got {type(g).__name__}")
        if not 0 <= g <= 0xFFFFFFFF:
            raise ValueError(f"KV-cache group id {g} does not fit in 4 bytes")


def _check_int_arg(name: str, value) -> int:
    # An int argument that may be negative (a token position), within what a C count holds.
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    if not -(2**62) <= value <= 2**62:
        raise ValueError(f"{name} is too large: {value}")
    return int(value)


def _shared_prefix_boundary(request) -> int:
    """The request's ``shared_prefix_boundary`` (vLLM's scheduler sets it from
    ``get_computed_blocks``); 0 for a request without one."""
    value = getattr(request, "shared_prefix_boundary", 0)
    if value.__class__ is int and -(2**62) <= value <= 2**62:
        return value
    return _check_int_arg("shared_prefix_boundary", value)


def _check_retention_interval(retention_interval) -> int | None:
    if retention_interval is None:
        return None
    return _check_count("retention_interval", retention_interval)


def _check_mask_args(retention_interval, reachable_boundaries, dcp_world_size, final_segment_end_block):
    # reachable_block_mask's sparse-retention arguments, checked alike by every manager.
    retention_interval = _check_retention_interval(retention_interval)
    _check_world_size("dcp_world_size", dcp_world_size)
    try:
        boundaries = [_check_int_arg("reachable_boundaries", b) for b in reachable_boundaries]
    except TypeError:
        if not hasattr(reachable_boundaries, "__iter__"):
            raise TypeError(
                f"reachable_boundaries must be a sequence of ints, got {type(reachable_boundaries).__name__}"
            ) from None
        raise
    if final_segment_end_block is not None:
        final_segment_end_block = _check_count("final_segment_end_block", final_segment_end_block)
    return retention_interval, boundaries, final_segment_end_block


def _positive_alignment(name: str, value) -> int:
    # cache_hit_alignment_tokens: the coordinator sets it; a positive token count.
    value = _check_count(name, value)
    if value == 0:
        raise ValueError(f"{name} must be positive, got 0")
    return value


def _as_flag(name: str, value) -> bool:
    # A bool field (what the compiled twin's bint fields take).
    return bool(value)


def _check_world_size(name: str, value: int) -> int:
    # A context-parallel world size: a positive int (blocks span block_size * dcp tokens,
    # a divisor the compiled twin uses unchecked).
    if type(value) is not int:
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    if value <= 0 or value > 2**31:
        raise ValueError(f"{name} must be a positive int, got {value}")
    return value


def _check_world_sizes(dcp_world_size: int, pcp_world_size: int) -> None:
    """The decode / prefill context-parallel world sizes: positive ints."""
    _check_world_size("dcp_world_size", dcp_world_size)
    _check_world_size("pcp_world_size", pcp_world_size)


class SingleTypeKVCacheManager(_NeedsArguments, _Checked):
    """Block bookkeeping for one KV-cache group of one attention type.

    With ``needs_kv_cache_zeroing`` (the config's: Mamba layers or mixed
    precision), an attention group records the ids of the blocks it takes for
    the worker to zero (``take_new_block_ids``); a circular buffer's ring never
    is.  A group whose spec is not ``prefix_cacheable`` (bounded replay, the
    ring) caches nothing.
    """

    # Fixed when made; use_eagle, cache_hit_alignment_tokens and
    # shared_prefix_checkpoint are set by the coordinator / manager.  The two
    # dicts cannot be replaced; their entries may still be changed (vLLM's tests do).
    _RULES = {
        **dict.fromkeys(
            ("kv_cache_spec", "block_size", "block_pool", "enable_caching", "kv_cache_group_id",
             "scheduler_block_size", "dcp_world_size", "pcp_world_size", "_max_admission_blocks_per_request", "req_to_blocks", "num_cached_block",
             "_req_to_blocks", "_num_cached_block", "_null_block", "new_block_ids", "_record_new_block_ids",
             "_prefix_cacheable", "_partial_hit_reqs", "_pending_cow_copies", "_pending_boundary_state_offloads",
             # (class constants: the compiled twin's instances cannot shadow them either)
             "retains_longer_hit", "supports_fine_grained_hash_lookup"),
            _READ_ONLY,
        ),
        "cache_hit_alignment_tokens": _positive_alignment,
        "shared_prefix_checkpoint": _as_flag,
        "use_eagle": _as_flag,
    }

    #: Whether the group keeps a longer prefix hit until an external lookup ends (HiSparse: never here).
    retains_longer_hit = False
    #: Whether a lookup can end inside one of this type's blocks (fine-grained partial hits).
    supports_fine_grained_hash_lookup = False

    def __init__(
        self,
        kv_cache_spec: KVCacheSpec,
        block_pool: BlockPool,
        enable_caching: bool,
        kv_cache_group_id: int,
        scheduler_block_size: int,
        dcp_world_size: int = 1,
        pcp_world_size: int = 1,
        needs_kv_cache_zeroing: bool = False,
        max_admission_blocks_per_request: int | None = None,
    ) -> None:
        _check_world_sizes(dcp_world_size, pcp_world_size)
        # A dcp-sharded group's block holds block_size tokens on each of dcp ranks
        # (interleaved), so in token terms it spans block_size * dcp; a replicated one
        # (a draft model's, Mamba's) is whole everywhere.
        sharded = bool(kv_cache_spec.dcp_sharded)
        self.dcp_world_size = dcp_world_size if sharded else 1
        self.pcp_world_size = pcp_world_size if sharded else 1
        self._record_new_block_ids = (
            bool(needs_kv_cache_zeroing)
            and isinstance(kv_cache_spec, AttentionSpec)
            and not isinstance(kv_cache_spec, CircularBufferSpec)
        )
        self._prefix_cacheable = bool(kv_cache_spec.prefix_cacheable)
        self.new_block_ids: list[int] = []
        self.kv_cache_spec = kv_cache_spec
        self.block_size = kv_cache_spec.block_size * self.dcp_world_size
        self.block_pool = block_pool
        self.enable_caching = enable_caching
        self.kv_cache_group_id = kv_cache_group_id
        self.scheduler_block_size = scheduler_block_size
        self._max_admission_blocks_per_request = max_admission_blocks_per_request
        self.use_eagle = False
        self._req_to_blocks: dict[str, list[KVCacheBlock]] = {}
        self._num_cached_block: dict[str, int] = {}
        self.req_to_blocks = _BlockTable(self._req_to_blocks, None, block_pool.blocks, KVCacheBlock)
        self.num_cached_block = _CountTable(self._num_cached_block, None, _check_count)
        self._null_block = block_pool.null_block
        # The token granularity hits land on: the scheduler block, or the hash
        # block when the hybrid coordinator turns fine-grained partial hits on.
        self.cache_hit_alignment_tokens = scheduler_block_size
        self.shared_prefix_checkpoint = False  # (only an EAGLE Mamba align group gets it)
        # Partial hits: request id -> (index, shared block) of a hit ending inside
        # that block, redirected to a private copy when the request allocates;
        # the (source, copy) pairs the worker must copy; Mamba align's
        # (request id, group, block, boundary tokens) boundary states for a connector.
        self._partial_hit_reqs: dict[str, tuple[int, KVCacheBlock]] = {}
        self._pending_cow_copies: list[tuple[KVCacheBlock, KVCacheBlock]] = []
        self._pending_boundary_state_offloads: list[tuple[str, int, KVCacheBlock, int]] = []

    @property
    def has_positionally_stable_blocks(self) -> bool:
        """Whether a block index keeps naming the same token range (False only for Mamba align)."""
        return True

    def _has_partial_local_hit(self, new_computed_blocks: Sequence[KVCacheBlock],
                               num_local_computed_tokens: int) -> bool:
        # The local hit ends inside a block of this group: its shared tail needs a copy.
        return len(new_computed_blocks) > 0 and num_local_computed_tokens % self.block_size != 0

    # -------------------------------------------------------------- counting
    def get_num_skipped_tokens(self, num_computed_tokens: int) -> int:
        """Tokens before the attention window (their blocks can be freed)."""
        return 0

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
        """Blocks this group must take from the free pool to hold ``num_tokens``.

        Evictable cache hits (free, ref_cnt 0) count too: touching them takes
        them out of the free pool; so does the private copy of a partial hit's
        tail block.  ``prefill_end`` matters only to Mamba align mode's prefill
        checkpoints (``MambaManager``).
        """
        num_required_blocks = cdiv(num_tokens, self.block_size)
        cap = self._max_admission_blocks_per_request
        if apply_admission_cap and cap is not None and cap < num_required_blocks:
            num_required_blocks = cap
        req_blocks = self._req_to_blocks.get(request_id)
        num_req_blocks = 0 if req_blocks is None else len(req_blocks)
        if request_id in self._num_cached_block:
            return max(num_required_blocks - num_req_blocks, 0)
        num_skipped_blocks = self.get_num_skipped_tokens(total_computed_tokens) // self.block_size
        num_local_computed_blocks = len(new_computed_blocks) + num_req_blocks
        num_new_blocks = max(num_required_blocks - max(num_skipped_blocks, num_local_computed_blocks), 0)
        skip_new = max(0, num_skipped_blocks - num_req_blocks)
        num_evictable = 0
        queue = self.block_pool.free_block_queue if self.enable_caching else None
        try:
            for i in range(skip_new, len(new_computed_blocks)):
                blk = new_computed_blocks[i]
                if blk._ref_cnt == 0 and not blk._is_null:
                    # (a free hit must be in the free queue, or touching it fails half-way)
                    if queue is not None and (blk._queue is not queue or blk._prev_free_block is None
                                              or blk._next_free_block is None):
                        raise RuntimeError(f"remove() called on an invalid block: {blk}")
                    num_evictable += 1
        except AttributeError:
            raise TypeError(f"blocks must be KVCacheBlock, got {type(blk).__name__}") from None
        if new_computed_blocks and num_local_computed_tokens % self.block_size:
            num_new_blocks += 1  # (the private copy of a partial hit's shared tail)
        return num_new_blocks + num_evictable

    # -------------------------------------------------------------- allocation
    def add_local_computed_blocks(
        self,
        request_id: str,
        new_computed_blocks: Sequence[KVCacheBlock],
        num_local_computed_tokens: int,
        num_external_computed_tokens: int,
    ) -> None:
        """Attach prefix-cache hits to a request that holds no blocks yet.

        Raises:
            TypeError: a hit is not a KVCacheBlock.
            RuntimeError: a hit with no references is not in the free queue.
            In both cases nothing changes.
        """
        self._check_hits(new_computed_blocks, num_local_computed_tokens + num_external_computed_tokens)
        self._add_local_computed_blocks(request_id, new_computed_blocks, num_local_computed_tokens,
                                        num_external_computed_tokens)

    def _check_hits(self, new_computed_blocks, total_computed_tokens: int) -> None:
        # add_local_computed_blocks' checks of the hits it will take (those past the skipped ones).
        skipped = self.get_num_skipped_tokens(total_computed_tokens) // self.block_size
        _check_touchable(new_computed_blocks[skipped:] if skipped > 0 else new_computed_blocks,
                         self.block_pool.free_block_queue if self.enable_caching else None,
                         self.block_pool.blocks)

    def _add_local_computed_blocks(self, request_id, new_computed_blocks, num_local_computed_tokens,
                                   num_external_computed_tokens) -> None:
        # add_local_computed_blocks without its checks, for KVCacheManager.allocate_slots,
        # whose hit count (get_num_blocks_to_allocate) has checked every hit before any change.
        total = num_local_computed_tokens + num_external_computed_tokens
        num_skipped_blocks = self.get_num_skipped_tokens(total) // self.block_size
        blocks = new_computed_blocks[num_skipped_blocks:] if num_skipped_blocks > 0 else new_computed_blocks
        req_blocks = self._req_to_blocks.setdefault(request_id, [])
        assert not req_blocks
        if self.enable_caching:
            self.block_pool._touch(blocks)
        req_blocks.extend([self._null_block] * num_skipped_blocks)
        req_blocks.extend(blocks)
        self._num_cached_block[request_id] = len(req_blocks)
        if blocks and num_local_computed_tokens % self.block_size:
            # A partial hit: its tail block is copied before the request writes
            # it (allocate_new_blocks), and cached again once full.
            block_idx = num_local_computed_tokens // self.block_size
            self._partial_hit_reqs[request_id] = (block_idx, blocks[-1])
            self._num_cached_block[request_id] = block_idx

    def allocate_external_computed_blocks(
        self,
        request_id: str,
        num_local_computed_tokens: int,
        num_external_computed_tokens: int,
        record_for_zeroing: bool = True,
    ) -> None:
        """New blocks for tokens a KV connector computed (after every group touched its hits).

        ``record_for_zeroing=False``: an async load writes them, so they are not
        reported for zeroing.
        """
        total = num_local_computed_tokens + num_external_computed_tokens
        num_skipped_tokens = self.get_num_skipped_tokens(total)
        if num_skipped_tokens > 0:
            num_external_computed_tokens = min(total - num_skipped_tokens, num_external_computed_tokens)
        if num_external_computed_tokens <= 0:
            return
        req_blocks = self._req_to_blocks.setdefault(request_id, [])
        num_new_blocks = cdiv(total, self.block_size) - len(req_blocks)
        if num_new_blocks > 0:  # (holding as many already: nothing to do, as in vLLM)
            new_blocks = self.block_pool.get_new_blocks(num_new_blocks)
            req_blocks.extend(new_blocks)
            if self._record_new_block_ids and record_for_zeroing:
                self.new_block_ids.extend([b._block_id for b in new_blocks])

    def allocate_new_blocks(self, request_id: str, num_tokens: int, num_tokens_main_model: int) -> list[KVCacheBlock]:
        """Give the request at least ``num_tokens`` slots; return the new blocks
        (first the private copy of a partial hit's tail block, if there is one)."""
        cow_blocks: list[KVCacheBlock] = []
        partial = self._partial_hit_reqs.get(request_id)
        if partial is not None:
            self._check_cow(request_id, partial[0], partial[1])  # (before a block is taken)
            del self._partial_hit_reqs[request_id]
            cow_block = self.block_pool.get_new_blocks(1)[0]
            self._apply_cow(request_id, partial[0], partial[1], cow_block)
            self.new_block_ids.append(cow_block._block_id)  # (recorded whatever the group, as vLLM)
            cow_blocks.append(cow_block)
        req_blocks = self._req_to_blocks.setdefault(request_id, [])
        num_new_blocks = cdiv(num_tokens, self.block_size) - len(req_blocks)
        if num_new_blocks <= 0:
            return cow_blocks
        new_blocks = self.block_pool.get_new_blocks(num_new_blocks)
        req_blocks.extend(new_blocks)
        if self._record_new_block_ids:
            self.new_block_ids.extend([b._block_id for b in new_blocks])
        return cow_blocks + new_blocks if cow_blocks else new_blocks

    def _check_cow(self, request_id: str, block_idx: int, source_block: KVCacheBlock) -> None:
        # vLLM's assertions on a copy-on-write, raised even under python -O, alike in both twins.
        req_blocks = self._req_to_blocks.get(request_id, ())
        if not (0 <= block_idx < len(req_blocks) and req_blocks[block_idx] is source_block):
            raise AssertionError(f"block {block_idx} of request {request_id!r} is not the partial hit's block")
        if source_block._is_null or source_block._ref_cnt <= 0:
            raise AssertionError("the partial hit's block is the null block or holds no reference")

    def _apply_cow(self, request_id: str, block_idx: int, source_block: KVCacheBlock,
                   cow_block: KVCacheBlock) -> None:
        # The request's copy replaces the shared block at block_idx; both stay
        # referenced (the copy once more) until the worker has run the copy.
        self._check_cow(request_id, block_idx, source_block)
        self._req_to_blocks[request_id][block_idx] = cow_block
        self._pending_cow_copies.append((source_block, cow_block))
        cow_block._ref_cnt += 1

    @property
    def records_new_block_ids(self) -> bool:
        """Whether the worker zeroes this group's new blocks (their ids are recorded)."""
        return self._record_new_block_ids

    def take_new_block_ids(self) -> list[int]:
        """The ids of the blocks taken since the last call (for zeroing), and forget them."""
        ids = self.new_block_ids
        object.__setattr__(self, "new_block_ids", [])
        return ids

    def take_pending_cow_copies(self) -> list[tuple[KVCacheBlock, KVCacheBlock]]:
        """The copy-on-write (source, copy) pairs queued since the last call, and forget them.

        Each pair holds one extra reference on both blocks until the caller
        frees them (once the worker has run the copy)."""
        pending = self._pending_cow_copies
        object.__setattr__(self, "_pending_cow_copies", [])
        return pending

    def take_pending_boundary_state_offloads(self) -> list[tuple[str, int, KVCacheBlock, int]]:
        """The (request id, group id, block, boundary tokens) boundary states queued
        for a KV connector since the last call, and forget them (Mamba align only)."""
        pending = self._pending_boundary_state_offloads
        object.__setattr__(self, "_pending_boundary_state_offloads", [])
        return pending

    def finalize_partial_tail_offload(self, request_id: str, num_computed_tokens: int,
                                      num_in_flight_tokens: int) -> tuple[int, KVCacheBlock, int] | None:
        """A finishing request's own partial-tail state for a connector; None but for Mamba align."""
        return None

    def cache_blocks(
        self,
        request: Request,
        num_tokens: int,
        retention_interval: int | None = None,
        replay_boundaries: Sequence[int] = (),
    ) -> None:
        """Cache the request's full blocks among its first ``num_tokens`` tokens
        (those it has hashes for: with hash lookahead the hashes lag behind).

        ``retention_interval`` (the config's ``prefix_cache_retention_interval``):
        None caches densely; 0 or a multiple of the scheduler block makes a
        sliding-window group keep only the blocks a hit at a replay boundary,
        at the request's ``shared_prefix_boundary`` or once per interval can
        use.  ``replay_boundaries``: where a later request replaying this
        prompt can resume (``replay_boundaries()``); read only when sparse.
        Nothing for a group that is not prefix-cacheable.
        """
        if not self._prefix_cacheable:
            return
        request_id = _request_id(request)  # (a TypeError for a non-request, as the compiled twin)
        num_cached_blocks = self._num_cached_block.get(request_id, 0)
        num_full_blocks = _hashed(request, num_tokens, self.block_pool.hash_block_size) // self.block_size
        if num_cached_blocks >= num_full_blocks:
            return
        if retention_interval is None:
            mask = self._reachable(num_cached_blocks, num_full_blocks)
        else:
            mask = self._sparse_reachable(num_cached_blocks, num_full_blocks,
                                          _check_count("retention_interval", retention_interval),
                                          self._reachable_boundaries(request, replay_boundaries))
        self.block_pool.cache_full_blocks(
            request,
            self._req_to_blocks[request_id],
            num_cached_blocks,
            num_full_blocks,
            self.block_size,
            self.kv_cache_group_id,
            mask,
        )
        self._num_cached_block[request_id] = num_full_blocks

    def _reachable_boundaries(self, request: Request, replay_boundaries: Sequence[int]) -> list[int]:
        # The token positions whose reachable tail sparse retention keeps: the replay
        # boundaries and the request's shared-prefix junction (with EAGLE also one block
        # below it: a sibling diverging right after it has no block to peek at).
        boundaries = [_check_int_arg("replay_boundaries", b) for b in replay_boundaries]
        junction = _shared_prefix_boundary(request)
        if junction:
            boundaries.append(junction)
            if self.use_eagle:
                boundaries.append(junction - self.block_size)
        return boundaries

    def _reachable(self, start_block: int, end_block: int) -> list[bool] | None:
        # reachable_block_mask for this manager's blocks [start_block, end_block), dense retention.
        return None

    def _sparse_reachable(self, start_block: int, end_block: int, retention_interval: int,
                          boundaries: list[int]) -> list[bool] | None:
        # reachable_block_mask under sparse retention (every type but sliding window: dense).
        return None

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
        """Which of blocks ``[start_block, end_block)`` a later hit can use, as the mask
        ``cache_full_blocks`` takes; None: all of them (full attention, and every type
        whose hits can end anywhere).

        ``retention_interval``, ``reachable_boundaries`` and ``final_segment_end_block``
        are for sparse retention (the sliding-window manager's); ``dcp_world_size``
        scales the spec's block size (a sharded block spans ``block_size * dcp`` tokens).
        """
        _check_mask_args(retention_interval, reachable_boundaries, dcp_world_size, final_segment_end_block)
        return None

    def _check_cache_inputs(self, request: Request, request_id: str, num_tokens: int, hits: Sequence,
                            attaching: bool, total_computed_tokens: int) -> None:
        # What cache_blocks(request, num_tokens) will read once this
        # allocation is made, checked before it: the cached count is the
        # request's entry, or, for a request taking its hits now (attaching),
        # what add_local_computed_blocks will record.
        if not self._prefix_cacheable:
            return
        num_cached = self._num_cached_block.get(request_id)
        if num_cached is None:
            if attaching:
                skipped = self.get_num_skipped_tokens(total_computed_tokens) // self.block_size
                num_cached = max(skipped, len(hits))
            else:
                num_cached = 0
        num_tokens = _hashed(request, num_tokens, self.block_pool.hash_block_size)
        self.block_pool._check_hashes_to_cache(request, num_cached, num_tokens // self.block_size,
                                               self.block_size)

    # -------------------------------------------------------------- freeing
    def pop_blocks_for_free(self, request_id: str) -> list[KVCacheBlock]:
        """Forget the request and return its blocks, in allocation order, without
        freeing them; leading null blocks (a window's skipped prefix) are left out.
        The caller frees them, last block first."""
        self._num_cached_block.pop(request_id, None)
        self._partial_hit_reqs.pop(request_id, None)
        blocks = self._req_to_blocks.pop(request_id, [])
        null = self._null_block
        lead = 0
        while lead < len(blocks) and blocks[lead] is null:
            lead += 1
        return blocks[lead:] if lead else blocks

    def free(self, request_id: str) -> None:
        """Return the request's blocks to the pool, tail first (the request's
        block list itself is left in its order: a caller may still hold it)."""
        self.block_pool.free_blocks(reversed(self.pop_blocks_for_free(request_id)))

    def _remove_blocks_in_range(self, request_id: str, first_block: int, last_block: int) -> None:
        blocks = self._req_to_blocks.get(request_id)
        if blocks is None or first_block >= last_block:
            return
        last_block = min(last_block, len(blocks))
        null = self._null_block
        freed = []
        for i in range(last_block - 1, first_block - 1, -1):
            if blocks[i] is null:
                break
            freed.append(blocks[i])
            blocks[i] = null
        if freed:
            self.block_pool.free_blocks(freed)

    def remove_skipped_blocks(
        self, request_id: str, processed_computed_tokens: int, num_prompt_tokens: int | None = None
    ) -> None:
        """Free the blocks before the attention window, replacing them with the null block.

        ``num_prompt_tokens`` is for managers that free a gap after the prompt
        (vLLM's R-SWA); these ones ignore it.
        """
        num_skipped_tokens = self.get_num_skipped_tokens(processed_computed_tokens)
        if num_skipped_tokens <= 0:
            return
        self._remove_blocks_in_range(request_id, 0, num_skipped_tokens // self.block_size)

    @property
    def max_admission_blocks_per_request(self) -> int | None:
        """The admission cap (blocks one request may need), or None: sliding-window and
        chunked-local groups get it from the factory."""
        return self._max_admission_blocks_per_request

    def get_num_common_prefix_blocks(self, running_request_id: str) -> int:
        return 0

    def new_step_starts(self) -> None:
        """A new scheduler step begins; nothing to do for this manager (vLLM's Mamba manager clears its per-step record here)."""
        return None

    @classmethod
    def find_longest_cache_hit(
        cls,
        block_hashes: Sequence[bytes],
        max_length: int,
        kv_cache_group_ids: list[int],
        block_pool: BlockPool,
        kv_cache_spec: KVCacheSpec,
        drop_eagle_block: bool,
        alignment_tokens: int,
        dcp_world_size: int = 1,
        pcp_world_size: int = 1,
    ) -> tuple[tuple[list[KVCacheBlock], ...], int]:
        """The longest prefix hit common to ``kv_cache_group_ids``: (blocks per group, tokens)."""
        _check_world_sizes(dcp_world_size, pcp_world_size)
        raise NotImplementedError


class FullAttentionManager(SingleTypeKVCacheManager):
    """Full attention: every token's KV is kept until the request finishes."""

    supports_fine_grained_hash_lookup = True

    @classmethod
    def find_longest_cache_hit(
        cls, block_hashes, max_length, kv_cache_group_ids, block_pool, kv_cache_spec,
        drop_eagle_block, alignment_tokens, dcp_world_size=1, pcp_world_size=1,
    ):
        """Whole blocks left to right up to the first miss; with ``alignment_tokens``
        below the block size (fine-grained partial hits), then the longest hash
        boundary cached inside the next block.  EAGLE drops one block (one hash
        unit when fine-grained); the length is rounded down to the alignment.  Under
        decode context parallelism (``dcp_world_size > 1``) hashes are read at the
        sharded block's span, ``block_size * dcp_world_size``."""
        _check_world_sizes(dcp_world_size, pcp_world_size)
        _check_hit_args(kv_cache_group_ids, block_pool, alignment_tokens)
        block_size = kv_cache_spec.block_size
        if dcp_world_size > 1:
            block_size *= dcp_world_size
        fine = alignment_tokens < block_size and block_size % alignment_tokens == 0
        if fine:  # (the request's own hashes, one per alignment unit)
            raw = block_hashes
            hashes = _BlockHashView(raw, block_size // alignment_tokens)
        else:
            hashes = resolve_block_hashes(block_hashes, block_pool.hash_block_size, block_size)
        n_groups = len(kv_cache_group_ids)
        computed: tuple[list[KVCacheBlock], ...] = tuple([] for _ in range(n_groups))
        max_blocks = min(max_length // block_size, len(hashes))
        for i in range(max_blocks):
            cached = block_pool.get_cached_block(hashes[i], kv_cache_group_ids)
            if cached is None:
                break
            for g in range(n_groups):
                computed[g].append(cached[g])
        hit_length = len(computed[0]) * block_size
        if fine:
            # The longest cached hash boundary inside the first block not hit whole.
            scale = block_size // alignment_tokens
            first = len(computed[0]) * scale
            last = min(first + scale - 1, max_length // alignment_tokens, len(raw))
            for fine_idx in range(last - 1, first - 1, -1):
                cached = block_pool.get_cached_block(raw[fine_idx], kv_cache_group_ids)
                if cached is None:
                    continue
                for g in range(n_groups):
                    computed[g].append(cached[g])
                hit_length = (fine_idx + 1) * alignment_tokens
                break
        if drop_eagle_block and hit_length > 0:
            hit_length -= alignment_tokens if alignment_tokens < block_size else block_size
        hit_length -= hit_length % alignment_tokens
        num_blocks = cdiv(hit_length, block_size)
        for blocks in computed:
            del blocks[num_blocks:]
        return computed, hit_length

    def cache_blocks(
        self,
        request: Request,
        num_tokens: int,
        retention_interval: int | None = None,
        replay_boundaries: Sequence[int] = (),
    ) -> None:
        """Cache the request's full blocks among its first ``num_tokens`` tokens (see
        ``SingleTypeKVCacheManager.cache_blocks``); with blocks coarser than the hash
        block, also the partial entry of the prompt's last hash boundary when it
        falls inside a block (``BlockPool.cache_partial_block``), as vLLM does."""
        super().cache_blocks(request, num_tokens, retention_interval, replay_boundaries)
        if self.block_size != self.block_pool.hash_block_size:
            self._cache_partial_tail_block(request, num_tokens)

    def _cache_partial_tail_block(self, request: Request, num_tokens: int) -> None:
        # The prompt's last hash boundary a later request can hit (all of the
        # prompt with EAGLE, which drops a hash unit after looking up; one token
        # less otherwise), cached as a partial entry of the block it falls in
        # once computed.  Boundaries at a block's end are full blocks' keys.
        hbs = self.block_pool.hash_block_size
        limit = request.num_prompt_tokens if self.use_eagle else request.num_prompt_tokens - 1
        boundary = min(limit // hbs, len(request.block_hashes)) * hbs
        if boundary == 0 or boundary > num_tokens or boundary % self.block_size == 0:
            return
        blocks = self._req_to_blocks.get(request.request_id, ())
        block_idx = boundary // self.block_size
        if block_idx >= len(blocks):
            return
        self.block_pool.cache_partial_block(
            request, blocks[block_idx], boundary, self.kv_cache_group_id, self.block_size
        )

    def get_num_common_prefix_blocks(self, running_request_id: str) -> int:
        blocks = self._req_to_blocks.get(running_request_id, [])
        num_requests = len(self._req_to_blocks)
        n = 0
        for block in blocks:
            if block._ref_cnt == num_requests:
                n += 1
            else:
                break
        return n


class SinkFullAttentionManager(FullAttentionManager):
    """Full attention with learned sink tokens (``SinkFullAttentionSpec``).

    Its decisions are full attention's: the sink tokens live outside the block
    table, so hits, skipped blocks and caching do not move.  As in vLLM, the
    sink must fill whole blocks (``AssertionError`` otherwise).
    """

    def __init__(self, kv_cache_spec: SinkFullAttentionSpec, *args, **kwargs) -> None:
        super().__init__(kv_cache_spec, *args, **kwargs)
        sink_len = kv_cache_spec.sink_len
        assert sink_len is not None and sink_len > 0 and sink_len % self.block_size == 0, (
            f"SinkFullAttentionSpec.sink_len must be a positive multiple of the block size "
            f"({self.block_size}), got {sink_len!r}"
        )


class CrossAttentionManager(SingleTypeKVCacheManager):
    """Cross attention: a static allocation for the encoder tokens; never cached."""

    @classmethod
    def find_longest_cache_hit(
        cls, block_hashes, max_length, kv_cache_group_ids, block_pool, kv_cache_spec,
        drop_eagle_block, alignment_tokens, dcp_world_size=1, pcp_world_size=1,
    ):
        _check_world_sizes(dcp_world_size, pcp_world_size)
        _check_hit_args(kv_cache_group_ids, block_pool, alignment_tokens)
        raise ValueError("cross attention does not support prefix caching")

    def cache_blocks(
        self,
        request: Request,
        num_tokens: int,
        retention_interval: int | None = None,
        replay_boundaries: Sequence[int] = (),
    ) -> None:
        return None

    def _check_cache_inputs(self, request, request_id, num_tokens, hits, attaching, total_computed_tokens) -> None:
        return None  # (never cached)
