"""The KV-cache manager a scheduler drives (pure-Python twin).

From vLLM 0.33.0's ``vllm/v1/core/kv_cache_manager.py`` (``KVCacheManager``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from kvcy.kv_cache_interface import (
    KVCacheConfig,
    get_kv_cache_spec_kind,
    get_kv_cache_spec_sliding_window,
)
from kvcy.kv_events import BlockStored, KVCacheEvent
from kvcy.metrics import PrefixCacheStats
from kvcy._request_types import RequestStatus
from kvcy._fast.kv_cache_py._common import _READ_ONLY, _Checked, _as_index, _check_count, _check_rid, _request_id
from kvcy._fast.kv_cache_py.block_pool import _check_touchable
from kvcy._fast.kv_cache_py.coordinators import UnitaryKVCacheCoordinator, get_kv_cache_coordinator
from kvcy._fast.kv_cache_py.kv_cache_blocks import KVCacheBlocks
from kvcy._fast.kv_cache_py.request import Request

if TYPE_CHECKING:
    from kvcy._fast.kv_cache_py.kv_cache_block import KVCacheBlock

_WAITING = RequestStatus.WAITING
_PREEMPTED = RequestStatus.PREEMPTED
# Compared by value (``in`` falls back to ==), as vLLM does: a status from
# vLLM's own RequestStatus class counts the same as kvcy's.
_WATERMARK_STATUSES = (_WAITING, _PREEMPTED)


class KVCacheManager(_Checked):
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
        log_stats: keep PrefixCacheStats (``make_prefix_cache_stats``).
        enable_kv_cache_events: queue KV events (``take_events``).
        watermark: fraction of all blocks kept free when admitting
            waiting / preempted requests while others are scheduled.
        use_int_block_hashes: publish event hashes as 64-bit ints (default:
            ``VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES``).
    """

    # Fixed when made; the collector, the stats object and the watermark are free.
    _RULES = {
        **dict.fromkeys(
            ("max_model_len", "enable_caching", "enable_kv_cache_events", "use_eagle", "log_stats",
             "coordinator", "num_kv_cache_groups", "block_pool", "kv_cache_config", "kv_cache_event_metadata",
             "empty_kv_cache_blocks", "_group_block_sizes", "_no_blocks"),
            _READ_ONLY,
        ),
        "watermark_blocks": _as_index,
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
        log_stats: bool = False,
        enable_kv_cache_events: bool = False,
        dcp_world_size: int = 1,
        pcp_world_size: int = 1,
        metrics_collector: Any = None,
        watermark: float = 0.0,
        use_int_block_hashes: bool | None = None,
    ) -> None:
        for name, value in (("max_model_len", max_model_len), ("scheduler_block_size", scheduler_block_size),
                            ("hash_block_size", hash_block_size)):
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ValueError(f"{name} must be a positive int, got {value!r}")
        if dcp_world_size != 1 or pcp_world_size != 1:
            raise ValueError("decode/prefill context parallelism is not supported (dcp/pcp world size must be 1)")
        if not 0.0 <= float(watermark) < 1.0:
            raise ValueError(f"watermark must be in [0, 1), got {watermark!r}")
        if max_in_flight_tokens is None:
            max_in_flight_tokens = max_model_len
        if not kv_cache_config.kv_cache_groups and enable_caching:
            enable_caching = False
        self.max_model_len = max_model_len
        self.enable_caching = bool(enable_caching)
        self.enable_kv_cache_events = bool(enable_kv_cache_events)
        self.use_eagle = bool(use_eagle)
        self.log_stats = bool(log_stats)
        self.metrics_collector = metrics_collector
        self.prefix_cache_stats = PrefixCacheStats() if log_stats else None
        self.coordinator = get_kv_cache_coordinator(
            kv_cache_config, max_model_len, max_in_flight_tokens, self.use_eagle,
            self.enable_caching, self.enable_kv_cache_events, scheduler_block_size,
            hash_block_size, use_int_block_hashes,
        )
        self.num_kv_cache_groups = len(kv_cache_config.kv_cache_groups)
        self.block_pool = self.coordinator.block_pool
        self.kv_cache_config = kv_cache_config
        self.watermark_blocks = int(watermark * kv_cache_config.num_blocks)
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

    # ------------------------------------------------------------------ lookups
    def get_computed_blocks(self, request: Request) -> tuple[KVCacheBlocks, int, int]:
        """The longest prefix-cache hit for a request; changes no reference counts.

        Returns:
            ``(blocks, num_computed_tokens, shared_prefix_boundary)``.  The hit
            never covers the request's last token.
        """
        if not self.enable_caching:
            return self.empty_kv_cache_blocks, 0, 0
        try:
            skip = request.skip_reading_prefix_cache
        except AttributeError:
            raise TypeError(f"expected a Request, got {type(request).__name__}") from None
        if skip:
            return self.empty_kv_cache_blocks, 0, 0
        max_cache_hit_length = request.num_tokens - 1
        computed_blocks, num_new_computed_tokens, num_uncached = self.coordinator.find_longest_cache_hit(
            request.block_hashes, max_cache_hit_length
        )
        if self.log_stats:
            self.prefix_cache_stats.record(
                num_tokens=request.num_tokens,
                num_hits=num_new_computed_tokens,
                preempted=request.num_preemptions > 0,
            )
        if (
            num_new_computed_tokens > 0
            and self.enable_kv_cache_events
            and request.kv_cache_report_mode == "full"
        ):
            for group_idx, group_blocks in enumerate(computed_blocks):
                if group_blocks:
                    self.block_pool.emit_cached_block_events(
                        request, len(group_blocks), self._group_block_sizes[group_idx], group_idx
                    )
        boundary = num_new_computed_tokens + num_uncached if num_uncached else 0
        return self.create_kv_cache_blocks(computed_blocks), num_new_computed_tokens, boundary

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
    ) -> KVCacheBlocks | None:
        """Add slots for ``num_new_tokens`` (+ lookahead) tokens of a request.

        Returns the newly allocated blocks per group, or ``None`` -- with
        nothing allocated or touched -- when the pool cannot hold them.

        Raises:
            ValueError: a negative count; no tokens at all; prefix hits handed
                to a running request.  (Tokens past ``max_model_len`` are not an
                error: the counts are clamped to it, as in vLLM.)
            TypeError: a count that is not an int.
        """
        num_new_tokens = _check_count("num_new_tokens", num_new_tokens)
        num_new_computed_tokens = _check_count("num_new_computed_tokens", num_new_computed_tokens)
        num_lookahead_tokens = _check_count("num_lookahead_tokens", num_lookahead_tokens)
        num_external_computed_tokens = _check_count("num_external_computed_tokens", num_external_computed_tokens)
        num_encoder_tokens = _check_count("num_encoder_tokens", num_encoder_tokens)
        reserved_blocks = _check_count("reserved_blocks", reserved_blocks)
        if num_new_tokens == 0 and num_new_computed_tokens == 0 and num_external_computed_tokens == 0:
            raise ValueError(
                "num_new_tokens must be greater than 0 when there are no new computed or external computed tokens"
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
                raise ValueError(
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
        if full_sequence_must_fit:
            full_num_tokens = min(request.num_tokens, self.max_model_len)
            needed = coordinator.get_num_blocks_to_allocate(
                request_id, full_num_tokens, new_blocks_list, num_encoder_tokens,
                total_computed_tokens, num_local_computed_tokens, full_num_tokens, True,
            )
            if needed + watermark_blocks > self.block_pool.get_num_free_blocks():
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
        coordinator.remove_skipped_blocks(request_id, max(0, total_computed_tokens - request.num_in_flight_tokens))
        needed = coordinator.get_num_blocks_to_allocate(
            request_id, num_tokens_need_slot, new_blocks_list, num_encoder_tokens,
            num_local_computed_tokens + num_external_computed_tokens, num_local_computed_tokens,
            num_tokens_main_model,
        )
        if needed + watermark_blocks > self.block_pool.get_num_free_blocks() - reserved_blocks:
            return None
        if has_new_computed or num_external_computed_tokens > 0:
            coordinator._allocate_new_computed_blocks(
                request_id, new_blocks_list, num_local_computed_tokens, num_external_computed_tokens
            )
        new_blocks = coordinator.allocate_new_blocks(
            request_id, num_tokens_need_slot, num_tokens_main_model, num_encoder_tokens
        )
        if caching:
            coordinator.cache_blocks(request, n_cache)
        return self.create_kv_cache_blocks(new_blocks)

    def free(self, request: Request) -> None:
        """Free the request's blocks, tail first, group by group.

        A request that holds no blocks (never allocated, or freed already) is
        left as it is, as in vLLM.

        Raises:
            TypeError: not a request, or its ``request_id`` is not a str.
        """
        request_id = _request_id(request)
        if self.coordinator.holds(request_id):
            self.coordinator.free(request_id)

    def remove_skipped_blocks(self, request_id: str, processed_computed_tokens: int) -> None:
        processed_computed_tokens = _check_count("processed_computed_tokens", processed_computed_tokens)
        self.coordinator.remove_skipped_blocks(request_id, processed_computed_tokens)

    def pop_blocks_for_free(self, request: Request) -> list[KVCacheBlock]:
        return self.coordinator.pop_blocks_for_free(request.request_id)

    def evict_blocks(self, block_ids: set[int]) -> None:
        self.block_pool.evict_blocks(block_ids)

    def reset_prefix_cache(self) -> bool:
        """Drop all cached hashes; False (and nothing changes) while blocks are in use."""
        if not self.block_pool.reset_prefix_cache():
            return False
        if self.log_stats:
            self.prefix_cache_stats.reset = True
        return True

    def get_num_common_prefix_blocks(self, running_request_id: str) -> list[int]:
        return self.coordinator.get_num_common_prefix_blocks(running_request_id)

    def take_events(self) -> list[KVCacheEvent]:
        """Drain the KV events, annotated with each group's spec kind and window."""
        events = self.block_pool.take_events()
        meta = self.kv_cache_event_metadata
        for event in events:
            if event.__class__ is BlockStored and event.group_idx is not None and 0 <= event.group_idx < len(meta):
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
        return self.get_blocks(request_id).get_block_ids()

    def new_step_starts(self) -> None:
        return None
