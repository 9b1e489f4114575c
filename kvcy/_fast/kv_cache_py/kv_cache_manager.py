"""The KV-cache manager a scheduler drives (pure-Python twin).

From vLLM 0.33.0's ``vllm/v1/core/kv_cache_manager.py`` (``KVCacheManager``).
"""

from __future__ import annotations

import logging
from typing import Any

from kvcy.kv_cache_interface import (
    AttentionSpec,
    CrossAttentionSpec,
    EncoderOnlyAttentionSpec,
    FullAttentionSpec,
    KVCacheConfig,
    MambaSpec,
    get_kv_cache_spec_kind,
    get_kv_cache_spec_sliding_window,
)
from kvcy.kv_events import BlockStored, KVCacheEvent
from kvcy.metrics import PrefixCacheStats
from kvcy._request_types import KVCacheBlockCopy, RequestStatus
from kvcy._fast.kv_cache_py._common import (
    _READ_ONLY,
    _Checked,
    _NeedsArguments,
    _as_index,
    _check_count,
    _check_rid,
    _lookahead_count,
    _request_id,
    cdiv,
)
from kvcy._fast.kv_cache_py.block_pool import _check_touchable
from kvcy._fast.kv_cache_py.kv_cache_coordinator import (
    HybridKVCacheCoordinator,
    UnitaryKVCacheCoordinator,
    get_kv_cache_coordinator,
)
from kvcy._fast.kv_cache_py.kv_cache_utils import KVCacheBlock
from kvcy._fast.kv_cache_py.kv_cache_manager_blocks import KVCacheBlocks, _check_hits_fresh
from kvcy._fast.kv_cache_py.single_type_kv_cache_manager_mamba import MambaManager
from kvcy._fast.kv_cache_py.request import Request
from kvcy._fast.kv_cache_py.single_type_kv_cache_manager import _as_flag, _check_world_sizes

_WAITING = RequestStatus.WAITING
_PREEMPTED = RequestStatus.PREEMPTED
# Compared by value (``in`` falls back to ==), as vLLM does: a status from
# vLLM's own RequestStatus class counts the same as kvcy's.
_WATERMARK_STATUSES = (_WAITING, _PREEMPTED)

logger = logging.getLogger("kvcy")


class KVCacheManager(_NeedsArguments, _Checked):
    """The KV-cache manager a scheduler drives: vLLM 0.33.0's constructor and methods.

    Args:
        kv_cache_config: blocks and KV-cache groups.
        max_model_len: the longest sequence; slot requests are capped at it.
        scheduler_block_size: scheduling granularity (LCM of the groups' block sizes).
        hash_block_size: the block size request hashes are computed at.
        max_in_flight_tokens: tokens scheduled but not yet settled (sizes the
            sliding-window / chunked admission cap); defaults to max_model_len.
        enable_caching: prefix caching on or off.
        use_eagle: drop the last hit block (EAGLE needs its hidden states).
        num_hash_lookahead_tokens: tokens after each block that its hash
            covers (as the request hasher was built); events carry them.
        num_prefill_lookahead: multi-module MTP's speculative tokens: the last
            ``num_prefill_lookahead - 1`` computed tokens may be re-prefilled,
            so they are not cached.
        log_stats: keep PrefixCacheStats (``record_prefix_cache_stats``,
            ``make_prefix_cache_stats``).
        enable_kv_cache_events: queue KV events (``take_events``).
        dcp_world_size, pcp_world_size: decode / prefill context-parallel world
            sizes (a dcp-sharded group's blocks span ``block_size * dcp_world_size``
            tokens).
        metrics_collector: a ``KVCacheMetricsCollector`` (or None), handed to the block pool.
        watermark: fraction of all blocks kept free when admitting
            waiting / preempted requests while others are scheduled.
        enable_mamba_shared_prefix_checkpoint: vLLM's opt-in: Mamba align groups
            also cache the state at a request's shared-prefix junction.  It takes
            effect (``mamba_shared_prefix_checkpoint``) only with EAGLE groups,
            fine-grained partial hits and no multi-module MTP re-prefill.
        use_int_block_hashes: publish event hashes as 64-bit ints (default:
            ``VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES``).
    """

    # Fixed when made; the collector, the stats object and the watermark are free.
    _RULES = {
        **dict.fromkeys(
            ("max_model_len", "enable_caching", "enable_kv_cache_events", "use_eagle", "log_stats",
             "coordinator", "num_kv_cache_groups", "block_pool", "kv_cache_config", "kv_cache_event_metadata",
             "empty_kv_cache_blocks", "_group_block_sizes", "_no_blocks", "mamba_shared_prefix_checkpoint",
             "retained_hit_group_ids"),
            _READ_ONLY,
        ),
        "watermark_blocks": _as_index,
        "refuse_unservable": _as_flag,
        "refuse_stale_hits": _as_flag,
    }

    def __init__(
        self,
        kv_cache_config: KVCacheConfig,
        max_model_len: int,
        scheduler_block_size: int,
        hash_block_size: int,
        max_in_flight_tokens: int | None = None,
        enable_caching: bool = True,
        use_eagle: bool = False,
        num_hash_lookahead_tokens: int = 0,
        num_prefill_lookahead: int = 0,
        log_stats: bool = False,
        enable_kv_cache_events: bool = False,
        dcp_world_size: int = 1,
        pcp_world_size: int = 1,
        metrics_collector: Any = None,
        watermark: float = 0.0,
        enable_mamba_shared_prefix_checkpoint: bool = False,
        use_int_block_hashes: bool | None = None,
    ) -> None:
        for name, value in (("max_model_len", max_model_len), ("scheduler_block_size", scheduler_block_size),
                            ("hash_block_size", hash_block_size)):
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ValueError(f"{name} must be a positive int, got {value!r}")
        _check_world_sizes(dcp_world_size, pcp_world_size)
        num_hash_lookahead_tokens = _lookahead_count("num_hash_lookahead_tokens", num_hash_lookahead_tokens)
        num_prefill_lookahead = _lookahead_count("num_prefill_lookahead", num_prefill_lookahead)
        assert watermark >= 0.0, "watermark must be non-negative"
        watermark_blocks = watermark * kv_cache_config.num_blocks
        if not watermark_blocks < 2**62:  # (inf, or more blocks than a count holds)
            raise ValueError(f"watermark {watermark!r} is too large")
        if max_in_flight_tokens is None:
            max_in_flight_tokens = max_model_len
        self.max_model_len = max_model_len
        self.enable_caching = bool(enable_caching)
        self.enable_kv_cache_events = bool(enable_kv_cache_events)
        self.use_eagle = bool(use_eagle)
        self.log_stats = bool(log_stats)
        self.metrics_collector = metrics_collector
        self.prefix_cache_stats = PrefixCacheStats() if log_stats else None
        self.coordinator = get_kv_cache_coordinator(
            kv_cache_config, max_model_len, max_in_flight_tokens, self.use_eagle,
            self.enable_caching, self.enable_kv_cache_events, dcp_world_size, pcp_world_size,
            scheduler_block_size, hash_block_size, metrics_collector, num_hash_lookahead_tokens, num_prefill_lookahead,
            use_int_block_hashes=use_int_block_hashes,
        )
        coordinator = self.coordinator
        self.mamba_shared_prefix_checkpoint = bool(
            enable_mamba_shared_prefix_checkpoint and coordinator.eagle_group_ids
            and coordinator.enable_partial_hash_hits and coordinator.num_reprefillable_tokens == 0
        )
        if self.mamba_shared_prefix_checkpoint:
            for manager in coordinator.single_type_managers:
                if isinstance(manager, MambaManager):
                    manager.shared_prefix_checkpoint = True
        self.retained_hit_group_ids = tuple(
            m.kv_cache_group_id for m in coordinator.single_type_managers if m.retains_longer_hit
        )
        self.num_kv_cache_groups = len(kv_cache_config.kv_cache_groups)
        self.block_pool = self.coordinator.block_pool
        self.kv_cache_config = kv_cache_config
        self.watermark_blocks = int(watermark_blocks)
        self.kv_cache_event_metadata = tuple(
            (get_kv_cache_spec_kind(g.kv_cache_spec).value, get_kv_cache_spec_sliding_window(g.kv_cache_spec))
            for g in kv_cache_config.kv_cache_groups
        )
        self.empty_kv_cache_blocks = KVCacheBlocks(tuple(() for _ in range(self.num_kv_cache_groups)))
        # (not empty_kv_cache_blocks.blocks: callers get that object from get_computed_blocks
        # and may reassign its blocks; allocate_slots works with one list per group)
        self._no_blocks = self.empty_kv_cache_blocks.blocks
        self._group_block_sizes = tuple(g.kv_cache_spec.block_size for g in kv_cache_config.kv_cache_groups)
        managers = self.coordinator.single_type_managers
        # The only manager, when the coordinator hands it the tokens to cache unchanged.
        self._single = managers[0] if len(managers) == 1 and type(self.coordinator) is UnitaryKVCacheCoordinator else None
        #: allocate_slots raises ValueError for a request that needs more blocks
        #: than the whole pool holds, where vLLM returns None (and a loop would
        #: wait for it forever).  A kvcy extension: the vLLM drop-in
        #: (``kvcy.vllm``) turns it off, so that vLLM's Scheduler sees None.
        self.refuse_unservable = True
        #: allocate_slots raises ValueError for prefix hits whose blocks are no
        #: longer cached as get_computed_blocks found them, where vLLM takes any
        #: block it is handed (its own tests hand it free, uncached blocks as
        #: hits).  The vLLM drop-in turns it off too.
        self.refuse_stale_hits = True

    # ------------------------------------------------------------------ info
    @property
    def usage(self) -> float:
        """Fraction of usable blocks in use."""
        return self.block_pool.get_usage()

    def make_prefix_cache_stats(self) -> PrefixCacheStats | None:
        """Take the stats gathered since the last call (None unless log_stats)."""
        if not self.log_stats:
            return None
        stats = self.prefix_cache_stats
        self.prefix_cache_stats = PrefixCacheStats()
        return stats

    def create_kv_cache_blocks(self, blocks: tuple[list[KVCacheBlock], ...]) -> KVCacheBlocks:
        return KVCacheBlocks(blocks) if any(blocks) else self.empty_kv_cache_blocks

    # ------------------------------------------------------------------ stats
    def prefix_cache_lookup_enabled(self, request: Request) -> bool:
        """Whether a prefix-cache lookup may run for this request (caching on, and
        the request does not skip reading the cache)."""
        return self.enable_caching and not request.skip_reading_prefix_cache

    def record_prefix_cache_stats(self, request: Request, num_hits: int) -> None:
        """Count one lookup of ``request`` that hit ``num_hits`` tokens.

        The scheduler calls this when it admits the request (``get_computed_blocks``
        records nothing); a request that skipped the lookup is not counted.
        """
        if not self.log_stats or not self.prefix_cache_lookup_enabled(request):
            return
        assert self.prefix_cache_stats is not None  # (as vLLM asserts: a public attribute)
        self.prefix_cache_stats.record(
            num_tokens=request.num_tokens,
            num_hits=num_hits,
            preempted=request.num_preemptions > 0,
        )

    # ------------------------------------------------------------------ lookups
    def get_computed_blocks(
        self, request: Request, max_cache_hit_length: int | None = None
    ) -> tuple[KVCacheBlocks, int, int]:
        """The longest prefix-cache hit for a request; changes no reference counts.

        Args:
            request: the request.
            max_cache_hit_length: the longest hit to look for; by default
                ``request.num_tokens - 1`` (the last token is always computed).

        Returns:
            ``(blocks, num_computed_tokens, shared_prefix_boundary)``.  The hit
            is good until the pool changes: hand it to ``allocate_slots`` (as
            ``new_computed_blocks``, with ``num_new_computed_tokens``) for this
            request before any other allocation, free or eviction, or look it up
            again.  A hit that went stale meanwhile is refused there.

        Raises:
            ValueError / TypeError: ``max_cache_hit_length`` is not a non-negative int.
        """
        if max_cache_hit_length is not None:
            max_cache_hit_length = _check_count("max_cache_hit_length", max_cache_hit_length)
        if not self.enable_caching:
            return self.empty_kv_cache_blocks, 0, 0
        try:
            skip = request.skip_reading_prefix_cache
        except AttributeError:
            raise TypeError(f"expected a Request, got {type(request).__name__}") from None
        if skip:
            return self.empty_kv_cache_blocks, 0, 0
        if max_cache_hit_length is None:
            max_cache_hit_length = request.num_tokens - 1
        computed_blocks, num_new_computed_tokens, num_uncached = self.coordinator.find_longest_cache_hit(
            request.block_hashes, max_cache_hit_length
        )
        if (
            num_new_computed_tokens > 0
            and self.enable_kv_cache_events
            and getattr(request, "kv_cache_report_mode", "incremental") == "full"  # (as vLLM reads it)
        ):
            for group_idx, group_blocks in enumerate(computed_blocks):
                if group_blocks:
                    self.block_pool.emit_cached_block_events(
                        request, len(group_blocks), self._group_block_sizes[group_idx], group_idx
                    )
        boundary = num_new_computed_tokens + num_uncached if num_uncached else 0
        return self.create_kv_cache_blocks(computed_blocks), num_new_computed_tokens, boundary

    def get_computed_blocks_for_connector(
        self, request: Request, max_cache_hit_length: int | None = None
    ) -> tuple[KVCacheBlocks, int, int, bool]:
        """The local prefix hit of a request scheduled with a KV connector.

        Returns ``get_computed_blocks``' triple and ``hit_diverged``.  Only a
        hybrid of Mamba and full attention differs from ``get_computed_blocks``:
        its groups are searched one by one and the full-attention hit is the
        local prefix (the connector brings the rest, Mamba state included), with
        ``hit_diverged`` True when another group hit less, and a boundary of 0.
        When some group hit deeper than full attention, the full-attention tail
        was evicted, and the hit all groups share is returned instead.

        Raises:
            ValueError / TypeError: ``max_cache_hit_length`` is not a non-negative int.
        """
        coordinator = self.coordinator
        if not (
            self.kv_cache_config.has_mamba_layers
            and isinstance(coordinator, HybridKVCacheCoordinator)
            and coordinator.full_attention_group_id is not None
        ):
            return (*self.get_computed_blocks(request, max_cache_hit_length), False)
        if max_cache_hit_length is not None:
            max_cache_hit_length = _check_count("max_cache_hit_length", max_cache_hit_length)
        if not self.enable_caching:
            return self.empty_kv_cache_blocks, 0, 0, False
        try:
            skip = request.skip_reading_prefix_cache
        except AttributeError:
            raise TypeError(f"expected a Request, got {type(request).__name__}") from None
        if skip:
            return self.empty_kv_cache_blocks, 0, 0, False
        if max_cache_hit_length is None:
            max_cache_hit_length = request.num_tokens - 1
        fa_group_id = coordinator.full_attention_group_id
        computed, hits = coordinator.find_longest_cache_hit_per_group(request.block_hashes, max_cache_hit_length)
        num_local = hits[fa_group_id]
        if any(hit > num_local for hit in hits):
            return (*self.get_computed_blocks(request, max_cache_hit_length), False)
        return self.create_kv_cache_blocks(computed), num_local, 0, min(hits) < num_local

    # ------------------------------------------------------------------ allocation
    def allocate_slots(
        self,
        request: Request,
        num_new_tokens: int,
        num_new_computed_tokens: int = 0,
        new_computed_blocks: KVCacheBlocks | None = None,
        num_lookahead_tokens: int = 0,
        num_external_computed_tokens: int = 0,
        delay_cache_blocks: bool = False,
        num_encoder_tokens: int = 0,
        full_sequence_must_fit: bool = False,
        reserved_blocks: int = 0,
        has_scheduled_reqs: bool = True,
        skip_zeroing_group_ids: tuple[int, ...] = (),
    ) -> KVCacheBlocks | None:
        """Add slots for ``num_new_tokens`` (+ lookahead) tokens of a request.

        Returns the newly allocated blocks per group, or ``None`` -- with
        nothing allocated or touched -- when the pool cannot hold them.  The
        external-token blocks of the groups in ``skip_zeroing_group_ids`` (an
        async load writes them) are not reported for zeroing.

        Raises:
            ValueError: a negative count; no tokens at all.  (Tokens past
                ``max_model_len`` are not an error: the counts are clamped to
                it, as in vLLM.)  A prefix-cache hit that went stale since
                ``get_computed_blocks`` (a block evicted, reused or re-keyed).
                With ``refuse_unservable`` (the default): an allocation that
                needs more blocks than the whole pool holds, which ``None``
                would leave waiting forever.
            TypeError: a count that is not an int.
            AssertionError: prefix hits handed to a request that already holds
                blocks (vLLM's coordinator asserts this too; here nothing changes).
        """
        num_new_tokens = _check_count("num_new_tokens", num_new_tokens)
        num_new_computed_tokens = _check_count("num_new_computed_tokens", num_new_computed_tokens)
        num_lookahead_tokens = _check_count("num_lookahead_tokens", num_lookahead_tokens)
        num_external_computed_tokens = _check_count("num_external_computed_tokens", num_external_computed_tokens)
        num_encoder_tokens = _check_count("num_encoder_tokens", num_encoder_tokens)
        reserved_blocks = _check_count("reserved_blocks", reserved_blocks)
        if skip_zeroing_group_ids.__class__ is not tuple:
            skip_zeroing_group_ids = tuple(skip_zeroing_group_ids)
        if num_new_tokens == 0 and num_new_computed_tokens == 0 and num_external_computed_tokens == 0:
            raise ValueError(
                "num_new_tokens must be greater than 0 when there are no computed tokens to adopt"
            )
        request_id = _request_id(request)
        num_computed = request.num_computed_tokens
        num_local_computed_tokens = num_computed + num_new_computed_tokens
        if new_computed_blocks is None or not any(new_computed_blocks.blocks):
            new_blocks_list = self._no_blocks
            has_new_computed = False
        else:
            new_blocks_list = new_computed_blocks.blocks
            if len(new_blocks_list) != self.num_kv_cache_groups:
                raise ValueError(
                    f"new_computed_blocks has {len(new_blocks_list)} groups, the manager has "
                    f"{self.num_kv_cache_groups}"
                )
            has_new_computed = True
            if self.coordinator.holds(request_id):
                raise AssertionError(
                    f"request {request_id!r} already holds blocks; new_computed_blocks is only for "
                    "a request's first allocation"
                )
            for g in new_blocks_list:
                _check_touchable(g, None, self.block_pool.blocks)

        total_computed_tokens = min(num_local_computed_tokens + num_external_computed_tokens, self.max_model_len)
        watermark_blocks = 0
        status = request.status
        if has_scheduled_reqs and status in _WATERMARK_STATUSES:
            watermark_blocks = self.watermark_blocks
        coordinator = self.coordinator
        # (where the scheduler ends the prefill; a resumed request replays its output)
        prefill_end = 0
        if coordinator.retention_interval == 0:
            prefill_end = max(_check_count("num_prompt_tokens", request.num_prompt_tokens), request.num_tokens - 1)
        if full_sequence_must_fit:
            full_num_tokens = min(request.num_tokens, self.max_model_len)
            needed = coordinator.get_num_blocks_to_allocate(
                request_id, full_num_tokens, new_blocks_list, num_encoder_tokens,
                total_computed_tokens, num_local_computed_tokens, full_num_tokens, True, prefill_end,
            )
            if needed + watermark_blocks > self.block_pool.get_num_free_blocks():
                if self.refuse_unservable:
                    self._check_can_ever_fit(request_id, needed, new_blocks_list)
                return None

        num_tokens_main_model = total_computed_tokens + num_new_tokens
        num_tokens_need_slot = min(num_tokens_main_model + num_lookahead_tokens, self.max_model_len)
        caching = self.enable_caching and not delay_cache_blocks
        if caching:  # (what caching reads, before any change)
            n_cache = total_computed_tokens + num_new_tokens
            num_tokens = len(request._all_token_ids) if request.__class__ is Request else request.num_tokens
            if num_tokens < n_cache:
                n_cache = num_tokens
            single = self._single
            if single is None or single._num_cached_block.get(request_id, -1) < n_cache // single.block_size:
                # (one plain group whose request has its full blocks cached already -- a
                # decode step between block boundaries -- reads nothing: skipped)
                coordinator._check_cache_inputs(
                    request, request_id, n_cache, new_blocks_list,
                    has_new_computed or num_external_computed_tokens > 0,
                    num_local_computed_tokens + num_external_computed_tokens,
                )
        coordinator.remove_skipped_blocks(request_id, max(0, total_computed_tokens - request.num_in_flight_tokens),
                                          getattr(request, "num_prompt_tokens", None))
        needed = coordinator.get_num_blocks_to_allocate(
            request_id, num_tokens_need_slot, new_blocks_list, num_encoder_tokens,
            num_local_computed_tokens + num_external_computed_tokens, num_local_computed_tokens,
            num_tokens_main_model, False, prefill_end,
        )
        if needed + watermark_blocks > self.block_pool.get_num_free_blocks() - reserved_blocks:
            if self.refuse_unservable:
                self._check_can_ever_fit(request_id, needed, new_blocks_list)
            return None
        if has_new_computed and self.enable_caching and self.refuse_stale_hits:  # (only an allocation that goes ahead takes its hits)
            _check_hits_fresh(self.coordinator, request, request_id, new_blocks_list)
        if has_new_computed or num_external_computed_tokens > 0:
            coordinator._allocate_new_computed_blocks(
                request_id, new_blocks_list, num_local_computed_tokens, num_external_computed_tokens,
                skip_zeroing_group_ids,
            )
        new_blocks = coordinator.allocate_new_blocks(
            request_id, num_tokens_need_slot, num_tokens_main_model, num_encoder_tokens
        )
        if caching:
            coordinator.cache_blocks(request, n_cache)
        return self.create_kv_cache_blocks(new_blocks)

    def _check_can_ever_fit(self, request_id: str, needed: int, hit_groups: tuple) -> None:
        # (allocate_slots found too few free blocks.)  Whether it ever can:
        # every block but the null one, the request's own and the hits other
        # requests hold could come free, so the allocation needs, in all, the
        # blocks it takes from the free pool, those it holds and those hits.
        held: set[int] = set()
        for group in self.coordinator.get_blocks(request_id):
            held.update(b._block_id for b in group if not b._is_null)
        for group in hit_groups:
            held.update(b._block_id for b in group if not b._is_null and b._ref_cnt > 0)
        _refuse_if_never_fits(request_id, needed + len(held), self.block_pool.num_gpu_blocks,
                              self.max_model_len, self.kv_cache_config)

    def free(self, request: Request) -> None:
        """Free the request's blocks, tail first, group by group.

        A serving loop calls it when the request finishes and when it preempts
        it.  The freed full blocks stay cached (evictable, least recently used
        first) for later hits, a re-admitted request's own among them.

        A request that holds no blocks (never allocated, or freed already) is
        left as it is, as in vLLM.

        Raises:
            TypeError: not a request, or its ``request_id`` is not a str.
        """
        request_id = _request_id(request)
        if self.coordinator.holds(request_id):
            self.coordinator.free(request_id)

    def remove_skipped_blocks(
        self, request_id: str, processed_computed_tokens: int, num_prompt_tokens: int | None = None
    ) -> None:
        """Free the blocks before each group's attention window (replaced by the null block).

        ``num_prompt_tokens`` (the request's prompt length, or None) is for R-SWA
        groups, which also free the blocks between the prompt and the decode
        window; the other groups ignore it.
        """
        _check_rid(request_id)
        processed_computed_tokens = _check_count("processed_computed_tokens", processed_computed_tokens)
        self.coordinator.remove_skipped_blocks(request_id, processed_computed_tokens, num_prompt_tokens)

    def pop_blocks_for_free(self, request: Request) -> list[KVCacheBlock]:
        """Forget the request and return its blocks unfreed (every group's, in
        allocation order, leading null blocks left out), for a caller that frees
        them itself later, last block first as ``free`` does.  TypeError: not a request."""
        return self.coordinator.pop_blocks_for_free(_request_id(request))

    def evict_blocks(self, block_ids: set[int]) -> None:
        """Drop these blocks from the prefix cache, their KV not to be trusted (a failed
        load, a lost worker): only the cache keys go, a block in use stays with its request;
        uncached ids are ignored.  TypeError / ValueError: a bad id; AssertionError: an id
        past the pool (as vLLM asserts)."""
        self.block_pool.evict_blocks(block_ids)

    def reset_prefix_cache(self) -> bool:
        """Drop all cached hashes; False (and nothing changes) while blocks are in use."""
        if self.log_stats:  # (vLLM asserts it after the reset; here nothing changes first)
            assert self.prefix_cache_stats is not None
        if not self.coordinator.reset_prefix_cache():
            return False
        if self.log_stats:
            self.prefix_cache_stats.reset = True
        return True

    def get_num_common_prefix_blocks(self, running_request_id: str) -> list[int]:
        """0 per group: deprecated in vLLM 0.33.0 (cascade attention is gone), kept for old schedulers."""
        return [0] * self.num_kv_cache_groups

    def take_events(self) -> list[KVCacheEvent]:
        """Drain the KV events, annotated with each group's spec kind and window.

        A ``BlockStored`` of a group the manager does not have is logged and
        left as it is.
        """
        events = self.block_pool.take_events()
        meta = self.kv_cache_event_metadata
        for event in events:
            if not isinstance(event, BlockStored) or event.group_idx is None:
                continue
            if not 0 <= event.group_idx < len(meta):
                logger.warning("Group index `%s` not in KV cache metadata", event.group_idx)
                continue
            event.kv_cache_spec_kind, event.kv_cache_spec_sliding_window = meta[event.group_idx]
        return events

    def get_blocks(self, request_id: str) -> KVCacheBlocks:
        """The request's whole block table per group (empty groups if it holds none).

        Raises:
            TypeError: ``request_id`` is not a str.
        """
        _check_rid(request_id)
        return KVCacheBlocks(self.coordinator.get_blocks(request_id))

    def get_block_ids(self, request_id: str) -> tuple[list[int], ...]:
        """The request's block ids per group, as the worker's block-table row holds them
        (hits included; a sliding window's dropped blocks read as the null block, 0; empty
        groups for a request that holds none).  TypeError: ``request_id`` is not a str."""
        return self.get_blocks(request_id).get_block_ids()

    def get_block_ids_for_computed_tokens(self, request_id: str, num_computed_tokens: int) -> tuple[list[int], ...]:
        """The request's block ids that hold its first ``num_computed_tokens`` tokens.

        Attention groups are cut at ``cdiv(num_computed_tokens, block_size)``
        blocks; cross-attention, encoder-only and Mamba groups are given whole.
        """
        num_computed_tokens = _check_count("num_computed_tokens", num_computed_tokens)
        out = []
        for group, ids in zip(self.kv_cache_config.kv_cache_groups, self.get_block_ids(request_id)):
            spec = group.kv_cache_spec
            if isinstance(spec, AttentionSpec) and not isinstance(spec, (CrossAttentionSpec, EncoderOnlyAttentionSpec)):
                ids = ids[: cdiv(num_computed_tokens, spec.block_size)]
            out.append(ids)
        return tuple(out)

    def estimate_cached_tokens(self, request: Request) -> int:
        """How many leading tokens of the request its blocks hold in the prefix cache.

        The least, over the prefix-cacheable groups (not cross-attention or
        encoder-only), of the most tokens any of the group's blocks was cached
        for; 0 if none.
        """
        cached = None
        for group, blocks in zip(self.kv_cache_config.kv_cache_groups, self.get_blocks(_request_id(request)).blocks):
            spec = group.kv_cache_spec
            if not spec.prefix_cacheable or isinstance(spec, (CrossAttentionSpec, EncoderOnlyAttentionSpec)):
                continue
            most = 0
            for block in blocks:
                n = block.block_hash_num_tokens
                if n is not None and n > most:
                    most = n
            cached = most if cached is None or most < cached else cached
        return cached or 0

    def cache_blocks(self, request: Request, num_computed_tokens: int) -> None:
        """Cache the request's full blocks among its first ``num_computed_tokens``
        tokens (cached ones included), when caching is on.  A request that
        holds no blocks has none to cache.

        Raises:
            ValueError: a negative count.
        """
        num_computed_tokens = _check_count("num_computed_tokens", num_computed_tokens)
        if self.enable_caching:
            request_id = _request_id(request)
            coordinator = self.coordinator
            if not coordinator.holds(request_id):
                return
            coordinator._check_cache_inputs(request, request_id, num_computed_tokens, self._no_blocks, False, 0)
            coordinator.cache_blocks(request, num_computed_tokens)

    def truncate_computed_blocks(self, blocks: KVCacheBlocks, num_computed_tokens: int) -> KVCacheBlocks:
        """A lookup result cut at ``num_computed_tokens`` (a multiple of every block size).

        Only a view: no reference count changes and ``blocks`` is left as it
        is.  A Mamba group keeps what it has up to the cut.

        Raises:
            AssertionError: the cut is not block-aligned, or past a group's hit
                (as in vLLM).
            TypeError: ``blocks`` is not a KVCacheBlocks.
        """
        if not isinstance(blocks, KVCacheBlocks):
            raise TypeError(f"blocks must be KVCacheBlocks, got {type(blocks).__name__}")
        num_computed_tokens = _check_count("num_computed_tokens", num_computed_tokens)
        out = []
        for group_blocks, manager, group in zip(
            blocks.blocks, self.coordinator.single_type_managers, self.kv_cache_config.kv_cache_groups, strict=True
        ):
            spec = group.kv_cache_spec
            if not spec.prefix_cacheable:
                assert not group_blocks
                out.append([])
                continue
            assert num_computed_tokens % manager.block_size == 0
            num_blocks = num_computed_tokens // manager.block_size
            if isinstance(spec, MambaSpec):
                num_blocks = min(num_blocks, len(group_blocks))
            else:
                assert num_blocks <= len(group_blocks)
            out.append(list(group_blocks[:num_blocks]))
        return self.create_kv_cache_blocks(tuple(out))

    # ------------------------------------------------------------------ KV-cache zeroing, copies
    def take_new_block_ids(self) -> list[int]:
        """The attention blocks taken since the last call, for the worker to zero.

        Empty unless the config needs zeroing (``needs_kv_cache_zeroing``).
        """
        ids: list[int] = []
        for manager in self.coordinator.single_type_managers:
            ids.extend(manager.take_new_block_ids())
        return ids

    def record_blocks_for_zeroing(self, request_id: str, start_token: int) -> None:
        """Report the request's blocks from ``start_token`` on for zeroing again
        (e.g. the blocks a failed async load left unwritten).

        Raises:
            AssertionError: ``start_token`` is not block-aligned (zeroing a
                partly valid block would wipe its valid part), as in vLLM.
        """
        _check_rid(request_id)
        start_token = _check_count("start_token", start_token)
        todo = []  # (manager, blocks): all checked before any is recorded
        for manager in self.coordinator.single_type_managers:
            if manager.records_new_block_ids:
                assert start_token % manager.block_size == 0
                blocks = (manager._req_to_blocks.get(request_id) or [])[start_token // manager.block_size:]
                for b in blocks:  # (the table's lists are the caller's to change)
                    if not isinstance(b, KVCacheBlock):
                        raise TypeError(f"req_to_blocks values must be lists of blocks, got a list holding "
                                        f"{type(b).__name__}")
                todo.append((manager, blocks))
        for manager, blocks in todo:
            manager.new_block_ids.extend([b._block_id for b in blocks])

    def take_kv_cache_block_copies(self) -> tuple[list, list[KVCacheBlock]]:
        """The block copies (copy-on-write of partial hits) queued since the last call,
        and the blocks they keep referenced (source and copy of each, in order): the
        caller frees those once the worker has run the copies."""
        copies: list = []
        retained: list[KVCacheBlock] = []
        for manager in self.coordinator.single_type_managers:
            for source, copy in manager.take_pending_cow_copies():
                copies.append(KVCacheBlockCopy(source.block_id, copy.block_id))
                retained.extend((source, copy))
        return copies, retained

    def take_boundary_state_offloads(self) -> dict[str, list[tuple[int, int, int]]]:
        """Mamba "align" boundary states queued for a KV connector since the last call:
        ``{request id: [(group id, block id, boundary tokens), ...]}``."""
        offloads: dict[str, list[tuple[int, int, int]]] = {}
        for manager in self.coordinator.single_type_managers:
            for request_id, group_id, block, boundary in manager.take_pending_boundary_state_offloads():
                offloads.setdefault(request_id, []).append((group_id, block.block_id, boundary))
        return offloads

    def finalize_partial_tail_offloads(self, request: Request) -> list[tuple[int, int, int]]:
        """A finishing request's own Mamba "align" partial tails that no later token
        overwrote: ``[(group id, block id, boundary tokens), ...]``."""
        request_id = _request_id(request)
        num_computed = _check_count("num_computed_tokens", request.num_computed_tokens)
        num_in_flight = _check_count("num_in_flight_tokens", request.num_in_flight_tokens)
        out: list[tuple[int, int, int]] = []
        for manager in self.coordinator.single_type_managers:
            done = manager.finalize_partial_tail_offload(request_id, num_computed, num_in_flight)
            if done is not None:
                out.append((done[0], done[1].block_id, done[2]))
        return out

    def new_step_starts(self) -> None:
        """A new scheduler step begins: the coordinator tells every single-type manager."""
        self.coordinator.new_step_starts()


def _refuse_if_never_fits(request_id: str, total: int, num_gpu_blocks: int, max_model_len: int,
                          kv_cache_config: Any) -> None:
    usable = num_gpu_blocks - 1  # (block 0 is the null block)
    if total <= usable:
        return
    hint = ""
    for group in kv_cache_config.kv_cache_groups:
        spec = group.kv_cache_spec
        if (isinstance(spec, FullAttentionSpec) and not isinstance(spec, (CrossAttentionSpec, EncoderOnlyAttentionSpec))
                and usable * spec.block_size < max_model_len):
            hint = (f"; the pool holds {usable * spec.block_size} tokens, fewer than max_model_len "
                    f"{max_model_len} (vLLM's engine refuses to start with such a pool)")
            break
    raise ValueError(
        f"request {request_id!r} needs {total} blocks, more than the {usable} usable blocks of the whole "
        f"pool: it can never be scheduled{hint}"
    )
