"""Coordinators over the KV-cache groups: no prefix cache, unitary, hybrid (pure-Python twin).

From vLLM 0.33.0's ``vllm/v1/core/kv_cache_coordinator.py``: ``KVCacheCoordinator``,
its three kinds and ``get_kv_cache_coordinator``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from kvcy.kv_cache_interface import (
    AttentionSpec,
    CrossAttentionSpec,
    FullAttentionSpec,
    KVCacheConfig,
    MambaSpec,
    SlidingWindowSpec,
)
from kvcy.kv_cache_interface.hisparse import check_no_hisparse_groups
from kvcy._request_types import SpecGroup
from kvcy._fast.kv_cache_py._common import _READ_ONLY, _Checked, _NeedsArguments, _check_count, _lookahead_count, cdiv
from kvcy._fast.kv_cache_py.block_pool import BlockPool
from kvcy._fast.kv_cache_py.single_type_kv_cache_manager_local_attention import SlidingWindowManager
from kvcy._fast.kv_cache_py.single_type_kv_cache_manager_factory import get_manager_for_kv_cache_spec
from kvcy._fast.kv_cache_py.single_type_kv_cache_manager_mamba import (
    MambaManager,
    eagle_proof_margin,
    partial_hash_hits_enabled,
)
from kvcy._fast.kv_cache_py.single_type_kv_cache_manager import (
    CrossAttentionManager,
    SingleTypeKVCacheManager,
    _check_world_sizes,
    _shared_prefix_boundary,
)

if TYPE_CHECKING:
    from kvcy._fast.kv_cache_py.kv_cache_utils import KVCacheBlock
    from kvcy._fast.kv_cache_py.request import Request


def _validate_prefix_cache_retention_interval(
    retention_interval: int | None, scheduler_block_size: int, kv_cache_config: KVCacheConfig
) -> None:
    # vLLM's check of KVCacheConfig.prefix_cache_retention_interval (ValueError), with a
    # TypeError first for what is not an int.
    if retention_interval is None:
        return
    if isinstance(retention_interval, bool) or not isinstance(retention_interval, int):
        raise TypeError(
            "prefix_cache_retention_interval must be an int or None, "
            f"got {type(retention_interval).__name__}: {retention_interval!r}"
        )
    if not any(isinstance(g.kv_cache_spec, (SlidingWindowSpec, MambaSpec)) for g in kv_cache_config.kv_cache_groups):
        if retention_interval == 0:
            return
        raise ValueError(
            "prefix_cache_retention_interval is set but this model has no sliding-window or Mamba KV cache "
            "group, so retention has no effect. Set it to 0 (it only applies to sliding-window and Mamba "
            "attention)."
        )
    if retention_interval < 0 or retention_interval % scheduler_block_size != 0:
        raise ValueError(
            f"prefix_cache_retention_interval ({retention_interval}) must be non-negative and a multiple of "
            f"scheduler_block_size ({scheduler_block_size})."
        )
    if retention_interval > 2**62:
        raise ValueError(f"prefix_cache_retention_interval is too large: {retention_interval}")


def replay_boundaries(num_prompt_tokens: int, scheduler_block_size: int, use_eagle: bool) -> tuple[int, ...]:
    """Token positions a later request replaying a prompt of ``num_prompt_tokens`` can resume at.

    Without EAGLE, ``num_prompt_tokens - 1`` (a resend recomputes its last token).  With
    EAGLE, one scheduler block below both the resend's aligned hit and a longer sibling's
    (the last aligned block of the prompt), at least 0; the two differ only for a
    block-aligned prompt.
    """
    if not use_eagle:
        return (num_prompt_tokens - 1,)
    block = scheduler_block_size
    resend = (num_prompt_tokens - 1) // block * block
    extension = num_prompt_tokens // block * block
    return tuple(sorted({max(resend - block, 0), max(extension - block, 0)}))


class KVCacheCoordinator(_NeedsArguments, _Checked):
    """Drives the single-type managers of all KV-cache groups over one block pool.

    ``num_prefill_lookahead`` (multi-module MTP: the drafter re-prefills that
    many tokens less one) keeps the last ``num_reprefillable_tokens`` computed
    tokens out of the prefix cache; ``num_hash_lookahead_tokens`` goes to the
    block pool's events.

    ``retention_interval`` is the config's ``prefix_cache_retention_interval``
    (validated as vLLM does): None caches every reachable block, 0 or a
    multiple of the scheduler block makes sliding-window groups keep sparse
    replay checkpoints (see ``SlidingWindowManager.reachable_block_mask``).

    With ``use_eagle``, Mamba groups put their prefill checkpoints where
    EAGLE's hits land (``drop_eagle_checkpoint_block``).

    Raises:
        AssertionError: prefix caching with a Mamba group not in align mode
            (vLLM's, from ``MambaManager``).
    """

    # All fixed when made (retention_interval: assigned through its check, see __setattr__; never deleted).
    _RULES = dict.fromkeys(
        ("kv_cache_config", "max_model_len", "enable_caching", "scheduler_block_size", "hash_block_size",
         "block_pool", "eagle_group_ids", "single_type_managers", "_cross_attention", "num_reprefillable_tokens",
         "drop_eagle_group_ids", "enable_partial_hash_hits", "retention_interval", "_retention",
         "dcp_world_size", "pcp_world_size"),
        _READ_ONLY,
    )

    def __init__(
        self,
        kv_cache_config: KVCacheConfig,
        max_model_len: int,
        max_in_flight_tokens: int,
        use_eagle: bool,
        enable_caching: bool,
        enable_kv_cache_events: bool,
        dcp_world_size: int,
        pcp_world_size: int,
        scheduler_block_size: int,
        hash_block_size: int,
        metrics_collector: Any = None,
        num_prefill_lookahead: int = 0,
        num_hash_lookahead_tokens: int = 0,
        use_int_block_hashes: bool | None = None,
    ) -> None:
        _check_world_sizes(dcp_world_size, pcp_world_size)
        # (context-parallel world sizes, as the caller gave them; the unitary coordinator's
        # dcp is its group's)
        self.dcp_world_size = dcp_world_size
        self.pcp_world_size = pcp_world_size
        num_prefill_lookahead = _lookahead_count("num_prefill_lookahead", num_prefill_lookahead)
        groups = kv_cache_config.kv_cache_groups
        check_no_hisparse_groups(groups)
        if scheduler_block_size % hash_block_size != 0 or any(
            scheduler_block_size % g.kv_cache_spec.block_size != 0 for g in groups
        ):
            raise AssertionError(
                f"scheduler_block_size ({scheduler_block_size}) must be a multiple of "
                f"hash_block_size ({hash_block_size}) and of every group's block size "
                f"({[g.kv_cache_spec.block_size for g in groups]})"
            )
        self.kv_cache_config = kv_cache_config
        self.max_model_len = max_model_len
        self.enable_caching = enable_caching
        self.scheduler_block_size = scheduler_block_size
        self.hash_block_size = hash_block_size
        eagle_ids = {i for i, g in enumerate(groups) if getattr(g, "is_eagle_group", False)}
        if use_eagle and not eagle_ids:
            eagle_ids = set(range(len(groups)))
        if enable_caching and eagle_ids and scheduler_block_size < num_prefill_lookahead:
            # (the EAGLE drop excludes one scheduler block: the re-prefilled tokens must fit in it)
            raise ValueError(
                f"Multi-module MTP with prefix caching requires scheduler_block_size (={scheduler_block_size}) "
                f">= num_speculative_tokens (={num_prefill_lookahead})."
            )
        self.block_pool = BlockPool(
            kv_cache_config.num_blocks,
            enable_caching,
            hash_block_size,
            enable_kv_cache_events,
            metrics_collector,
            num_hash_lookahead_tokens,
            use_int_block_hashes=use_int_block_hashes,
        )
        self.eagle_group_ids = eagle_ids
        # The groups whose hits drop the EAGLE block: flagged groups drop it only with use_eagle.
        self.drop_eagle_group_ids = eagle_ids if use_eagle else set()
        self.num_reprefillable_tokens = max(0, num_prefill_lookahead - 1)
        # Fine-grained (sub-block) hits: only the hybrid coordinator turns them on.
        self.enable_partial_hash_hits = False
        needs_zeroing = kv_cache_config.needs_kv_cache_zeroing
        self.single_type_managers = tuple(
            get_manager_for_kv_cache_spec(
                g.kv_cache_spec,
                max_in_flight_tokens,
                max_model_len,
                block_pool=self.block_pool,
                enable_caching=enable_caching,
                kv_cache_group_id=i,
                scheduler_block_size=scheduler_block_size,
                needs_kv_cache_zeroing=needs_zeroing,
                dcp_world_size=dcp_world_size,
                pcp_world_size=pcp_world_size,
            )
            for i, g in enumerate(groups)
        )
        self._cross_attention = tuple(isinstance(m, CrossAttentionManager) for m in self.single_type_managers)
        if use_eagle:
            for manager in self.single_type_managers:
                if isinstance(manager, MambaManager):
                    manager.drop_eagle_checkpoint_block = True
        self._set_retention_interval(kv_cache_config.prefix_cache_retention_interval)

    def _set_retention_interval(self, retention_interval: int | None) -> None:
        _validate_prefix_cache_retention_interval(retention_interval, self.scheduler_block_size, self.kv_cache_config)
        # None: dense; 0: only the replay boundaries; > 0: one checkpoint per interval.
        object.__setattr__(self, "retention_interval", retention_interval)
        # What cache_blocks acts on: only sliding-window and Mamba align masks are
        # sparse (the other managers' masks are None whatever the interval), so
        # without such a group the interval changes nothing and the request's
        # shared_prefix_boundary is not read.
        object.__setattr__(self, "_retention", retention_interval if any(
            isinstance(m, SlidingWindowManager) or (isinstance(m, MambaManager) and m._align)
            for m in self.single_type_managers
        ) else None)

    def __setattr__(self, name: str, value: Any) -> None:
        # retention_interval is assignable, as on vLLM's coordinator (its tests set it on a
        # live manager), and checked as the config's value is (nothing changes on an error).
        if name == "retention_interval":
            self._set_retention_interval(value)
        else:
            super().__setattr__(name, value)

    def get_num_blocks_to_allocate(
        self,
        request_id: str,
        num_tokens: int,
        new_computed_blocks: tuple[Sequence[KVCacheBlock], ...],
        num_encoder_tokens: int,
        total_computed_tokens: int,
        num_local_computed_tokens: int,
        num_tokens_main_model: int,
        apply_admission_cap: bool = False,
        prefill_end: int = 0,
    ) -> int:
        """Blocks all groups must take from the free pool.  ``prefill_end`` (where the
        request's prefill ends) matters only when the retention interval is 0: Mamba
        then reserves a prefill checkpoint only for the chunk reaching it."""
        if self.retention_interval != 0:
            prefill_end = 0
        total = 0
        for i, manager in enumerate(self.single_type_managers):
            if self._cross_attention[i]:
                total += manager.get_num_blocks_to_allocate(
                    request_id, num_encoder_tokens, (), 0, 0, num_encoder_tokens, apply_admission_cap
                )
            else:
                total += manager.get_num_blocks_to_allocate(
                    request_id,
                    num_tokens,
                    new_computed_blocks[i],
                    total_computed_tokens,
                    num_local_computed_tokens,
                    num_tokens_main_model,
                    apply_admission_cap,
                    prefill_end,
                )
        return total

    def allocate_new_computed_blocks(
        self,
        request_id: str,
        new_computed_blocks: tuple[Sequence[KVCacheBlock], ...],
        num_local_computed_tokens: int,
        num_external_computed_tokens: int,
        skip_zeroing_group_ids: tuple[int, ...] = (),
    ) -> None:
        """Attach each group's prefix-cache hits (and external-token blocks) to a new request.

        The external-token blocks of the groups in ``skip_zeroing_group_ids``
        (an async load writes them) are not reported for zeroing.

        Raises:
            TypeError / RuntimeError: as SingleTypeKVCacheManager.add_local_computed_blocks
            (nothing changes: every group's hits are checked first).
            AssertionError: the request already holds blocks and a group has
            hits for it, as in vLLM (nothing changes).
        """
        for manager, blocks in zip(self.single_type_managers, new_computed_blocks):
            manager._check_hits(blocks, num_local_computed_tokens + num_external_computed_tokens)
        self._allocate_new_computed_blocks(request_id, new_computed_blocks, num_local_computed_tokens,
                                           num_external_computed_tokens, tuple(skip_zeroing_group_ids))

    def _allocate_new_computed_blocks(self, request_id, new_computed_blocks, num_local_computed_tokens,
                                      num_external_computed_tokens, skip_zeroing_group_ids=()) -> None:
        # Without the checks: KVCacheManager.allocate_slots's hit count has checked every hit.
        managers = self.single_type_managers
        for manager in managers:
            if request_id in manager._num_cached_block:
                if any(len(blocks) for blocks in new_computed_blocks):
                    raise AssertionError(
                        f"request {request_id!r} already holds blocks; it cannot take new prefix-cache hits"
                    )
                return
        for i, manager in enumerate(managers):
            manager._add_local_computed_blocks(
                request_id, new_computed_blocks[i], num_local_computed_tokens, num_external_computed_tokens
            )
        if num_external_computed_tokens > 0:
            for i, manager in enumerate(managers):
                manager.allocate_external_computed_blocks(
                    request_id, num_local_computed_tokens, num_external_computed_tokens,
                    i not in skip_zeroing_group_ids,
                )

    def allocate_new_blocks(
        self, request_id: str, num_tokens: int, num_tokens_main_model: int, num_encoder_tokens: int = 0
    ) -> tuple[list[KVCacheBlock], ...]:
        return tuple(
            manager.allocate_new_blocks(
                request_id,
                num_encoder_tokens if self._cross_attention[i] else num_tokens,
                num_tokens_main_model,
            )
            for i, manager in enumerate(self.single_type_managers)
        )

    def cache_blocks(self, request: Request, num_computed_tokens: int) -> None:
        """Cache every group's full blocks among the first ``num_computed_tokens`` tokens
        (less the re-prefillable ones); under sparse retention only the blocks a replay
        of the prompt, its shared-prefix junction or an interval checkpoint can hit."""
        retention_interval = self._retention
        if retention_interval is None:
            for manager in self.single_type_managers:
                manager.cache_blocks(request, self._tokens_to_cache(manager, num_computed_tokens))
            return
        boundaries = replay_boundaries(request.num_prompt_tokens, self.scheduler_block_size,
                                       bool(self.drop_eagle_group_ids))
        for manager in self.single_type_managers:
            manager.cache_blocks(request, self._tokens_to_cache(manager, num_computed_tokens),
                                 retention_interval, boundaries)

    def get_num_cacheable_tokens(self, num_computed_tokens: int, kv_cache_group_id: int) -> int:
        """How many of the first ``num_computed_tokens`` tokens group ``kv_cache_group_id``
        may cache (vLLM's: less the re-prefillable tokens; a hybrid aligns them)."""
        num_computed_tokens = _check_count("num_computed_tokens", num_computed_tokens)
        return self._tokens_to_cache(self.single_type_managers[kv_cache_group_id], num_computed_tokens)

    def emit_cached_block_events(self, request: Request, computed_blocks: Sequence[Sequence[KVCacheBlock]]) -> None:
        """Queue one ``BlockStored`` per group holding blocks of a prefix hit
        (``computed_blocks``: one block list per group), as vLLM's report mode "full" does;
        nothing changes in the cache."""
        groups = self.kv_cache_config.kv_cache_groups
        for group_idx, group_blocks in enumerate(computed_blocks):
            if group_blocks:
                self.single_type_managers[group_idx].block_pool.emit_cached_block_events(
                    request, len(group_blocks), groups[group_idx].kv_cache_spec.block_size, group_idx
                )

    def _tokens_to_cache(self, manager: SingleTypeKVCacheManager, num_computed_tokens: int) -> int:
        # The num_tokens cache_blocks hands this manager.
        n = num_computed_tokens - self.num_reprefillable_tokens
        return n if n > 0 else 0

    def _check_cache_inputs(self, request: Request, request_id: str, num_computed_tokens: int,
                            new_computed_blocks: tuple, attaching: bool, total_computed_tokens: int) -> None:
        # cache_blocks(request, num_computed_tokens) after this allocation,
        # checked for every group before any change.
        if self._retention is not None:  # (what sparse retention reads of the request, now)
            _shared_prefix_boundary(request)
            _check_count("num_prompt_tokens", request.num_prompt_tokens)
        for manager, hits in zip(self.single_type_managers, new_computed_blocks):
            manager._check_cache_inputs(request, request_id, self._tokens_to_cache(manager, num_computed_tokens),
                                        hits, attaching, total_computed_tokens)

    def reset_prefix_cache(self) -> bool:
        """Reset the prefix cache of each distinct block pool the managers use, once
        (kvcy's managers share one); False if any pool refused (blocks in use).  With
        no groups there is no pool to reset: True, as in vLLM."""
        pools = dict.fromkeys(manager.block_pool for manager in self.single_type_managers)
        return all([pool.reset_prefix_cache() for pool in pools])

    def free(self, request_id: str) -> None:
        for manager in self.single_type_managers:
            manager.free(request_id)

    def pop_blocks_for_free(self, request_id: str) -> list[KVCacheBlock]:
        out: list[KVCacheBlock] = []
        for manager in self.single_type_managers:
            out.extend(manager.pop_blocks_for_free(request_id))
        return out

    def get_num_common_prefix_blocks(self, running_request_id: str) -> list[int]:
        return [m.get_num_common_prefix_blocks(running_request_id) for m in self.single_type_managers]

    def remove_skipped_blocks(
        self, request_id: str, processed_computed_tokens: int, num_prompt_tokens: int | None = None
    ) -> None:
        """Free each group's blocks outside its attention window; ``num_prompt_tokens``
        (None, or the prompt length: checked before any group changes) is for R-SWA
        groups, which free the gap after the prompt."""
        if num_prompt_tokens is not None:
            num_prompt_tokens = _check_count("num_prompt_tokens", num_prompt_tokens)
        for manager in self.single_type_managers:
            manager.remove_skipped_blocks(request_id, processed_computed_tokens, num_prompt_tokens)

    def get_blocks(self, request_id: str) -> tuple[list[KVCacheBlock], ...]:
        return tuple(m._req_to_blocks.get(request_id) or [] for m in self.single_type_managers)

    @property
    def group_block_sizes(self) -> tuple[int, ...]:
        """Each group's block size, in group order."""
        return tuple([m.block_size for m in self.single_type_managers])

    def new_step_starts(self) -> None:
        """Tell every single-type manager that a new scheduler step begins."""
        for manager in self.single_type_managers:
            manager.new_step_starts()

    def holds(self, request_id: str) -> bool:
        """Whether the request holds blocks (had a successful allocation since its last free)."""
        for manager in self.single_type_managers:
            if request_id in manager._req_to_blocks:
                return True
        return False

    def find_longest_cache_hit(
        self, block_hashes: list[bytes], max_cache_hit_length: int
    ) -> tuple[tuple[list[KVCacheBlock], ...], int, int]:
        raise NotImplementedError


class KVCacheCoordinatorNoPrefixCache(KVCacheCoordinator):
    """Coordinator for prefix caching off: any number of groups, never a hit."""

    _RULES = {**KVCacheCoordinator._RULES, "num_single_type_manager": _READ_ONLY}

    def __init__(self, kv_cache_config, max_model_len, max_in_flight_tokens, use_eagle,
                 enable_kv_cache_events, dcp_world_size, pcp_world_size, scheduler_block_size,
                 hash_block_size, metrics_collector=None, num_hash_lookahead_tokens=0,
                 num_prefill_lookahead=0, use_int_block_hashes=None) -> None:
        super().__init__(kv_cache_config, max_model_len, max_in_flight_tokens, use_eagle, False,
                         enable_kv_cache_events, dcp_world_size, pcp_world_size, scheduler_block_size,
                         hash_block_size, metrics_collector, num_prefill_lookahead,
                         num_hash_lookahead_tokens, use_int_block_hashes)
        self.num_single_type_manager = len(self.single_type_managers)

    def get_num_common_prefix_blocks(self, running_request_id: str) -> list[int]:
        return [0] * self.num_single_type_manager

    def find_longest_cache_hit(self, block_hashes, max_cache_hit_length):
        return tuple([] for _ in range(self.num_single_type_manager)), 0, 0


class UnitaryKVCacheCoordinator(KVCacheCoordinator):
    """Coordinator for exactly one KV-cache group with prefix caching on."""

    _RULES = {**KVCacheCoordinator._RULES, **dict.fromkeys(("kv_cache_spec", "block_size", "use_eagle"), _READ_ONLY)}

    def __init__(self, kv_cache_config, max_model_len, max_in_flight_tokens, use_eagle,
                 enable_caching, enable_kv_cache_events, dcp_world_size, pcp_world_size,
                 scheduler_block_size, hash_block_size, metrics_collector=None,
                 num_hash_lookahead_tokens=0, num_prefill_lookahead=0, use_int_block_hashes=None) -> None:
        super().__init__(kv_cache_config, max_model_len, max_in_flight_tokens, use_eagle,
                         enable_caching, enable_kv_cache_events, dcp_world_size, pcp_world_size,
                         scheduler_block_size, hash_block_size, metrics_collector,
                         num_prefill_lookahead, num_hash_lookahead_tokens, use_int_block_hashes)
        if len(kv_cache_config.kv_cache_groups) != 1:
            raise AssertionError("UnitaryKVCacheCoordinator assumes only one kv cache group")
        self.kv_cache_spec = kv_cache_config.kv_cache_groups[0].kv_cache_spec
        object.__setattr__(self, "dcp_world_size", self.single_type_managers[0].dcp_world_size)
        self.block_size = self.single_type_managers[0].block_size
        if enable_caching and hash_block_size != self.block_size:
            raise AssertionError(
                "UnitaryKVCacheCoordinator assumes hash_block_size == block_size "
                f"(got hash_block_size={hash_block_size}, block_size={self.block_size})"
            )
        self.use_eagle = 0 in self.drop_eagle_group_ids
        self.single_type_managers[0].use_eagle = self.use_eagle
        self._manager_cls = type(self.single_type_managers[0])

    def find_longest_cache_hit(self, block_hashes, max_cache_hit_length):
        blocks, length = self._manager_cls.find_longest_cache_hit(
            block_hashes, max_cache_hit_length, [0], self.block_pool, self.kv_cache_spec,
            self.use_eagle, self.block_size, self.dcp_world_size, self.pcp_world_size,
        )
        return blocks, length, 0


def _check_context_parallel_groups(groups, dcp_world_size: int, pcp_world_size: int) -> None:
    # The group types a hybrid layout supports under context parallelism (vLLM's
    # assertions): pcp, full attention or a replicated attention (draft) group; dcp,
    # full attention or any replicated group (Mamba, a draft model's).
    for g in groups:
        spec = g.kv_cache_spec
        replicated = not spec.dcp_sharded
        if pcp_world_size > 1 and not (
                isinstance(spec, FullAttentionSpec) or (isinstance(spec, AttentionSpec) and replicated)):
            raise AssertionError("PCP only supports full attention and replicated draft groups.")
        if dcp_world_size > 1 and not (isinstance(spec, FullAttentionSpec) or replicated):
            raise AssertionError(
                "DCP with hybrid KV cache layouts only supports full-attention, Mamba, and "
                f"replicated draft groups, got: {type(spec).__name__}."
            )


class HybridKVCacheCoordinator(KVCacheCoordinator):
    """Coordinator for several KV-cache groups (e.g. full + sliding window).

    Groups with equal specs are looked up together; full attention goes first
    (its left-to-right scan bounds the others), and the candidate length is
    shrunk until every group accepts it.

    With an align-mode Mamba group whose blocks are coarser than the hash block
    (and every other cacheable group able to look up inside its blocks, or
    with blocks of the hash block's size), hits land on hash-block boundaries
    instead of scheduler-block ones (``enable_partial_hash_hits``; turned off by
    ``allow_partial_hash_hits=False``).
    """

    _RULES = {**KVCacheCoordinator._RULES, "attention_groups": _READ_ONLY}

    def __init__(self, kv_cache_config, max_model_len, max_in_flight_tokens, use_eagle,
                 enable_caching, enable_kv_cache_events, dcp_world_size, pcp_world_size,
                 scheduler_block_size, hash_block_size, metrics_collector=None,
                 num_hash_lookahead_tokens=0, num_prefill_lookahead=0, allow_partial_hash_hits=True,
                 use_int_block_hashes=None) -> None:
        super().__init__(kv_cache_config, max_model_len, max_in_flight_tokens, use_eagle,
                         enable_caching, enable_kv_cache_events, dcp_world_size, pcp_world_size,
                         scheduler_block_size, hash_block_size, metrics_collector,
                         num_prefill_lookahead, num_hash_lookahead_tokens, use_int_block_hashes)
        # (groups out of prefix caching -- a ring, bounded replay -- hash nothing); vLLM asserts
        cacheable_block_sizes = [m.block_size for m in self.single_type_managers if m._prefix_cacheable]
        if any(block_size % hash_block_size for block_size in cacheable_block_sizes):
            raise AssertionError(
                "Each KV cache group's real block_size must be divisible by hash_block_size. "
                f"block_sizes={cacheable_block_sizes}, hash_block_size={hash_block_size}"
            )
        _check_context_parallel_groups(kv_cache_config.kv_cache_groups, dcp_world_size, pcp_world_size)
        object.__setattr__(self, "enable_partial_hash_hits", bool(allow_partial_hash_hits) and partial_hash_hits_enabled(
            kv_cache_config.kv_cache_groups, hash_block_size, dcp_world_size, [type(m) for m in self.single_type_managers]
        ))
        alignment = self._cache_hit_alignment_tokens
        for manager in self.single_type_managers:
            manager.cache_hit_alignment_tokens = alignment
        self.verify_and_split_kv_cache_groups()

    @property
    def _cache_hit_alignment_tokens(self) -> int:
        # Where hits land: hash-block boundaries with partial hits, else scheduler-block ones.
        return self.hash_block_size if self.enable_partial_hash_hits else self.scheduler_block_size

    def _align_cacheable(self, num_tokens: int) -> int:
        # The longest prefix of num_tokens a later hit can match (no rounding with
        # partial hits: a privatized Mamba tail must not be cached again).
        if self.enable_partial_hash_hits:
            return num_tokens
        sbs = self.scheduler_block_size
        return num_tokens // sbs * sbs

    @property
    def full_attention_group_id(self) -> int | None:
        """The first full-attention group of the lookups (full attention goes first), or
        None when no cacheable group is full attention."""
        spec, group_ids, klass, use_eagle = self.attention_groups[0]
        return group_ids[0] if isinstance(spec, FullAttentionSpec) else None

    def verify_and_split_kv_cache_groups(self) -> None:
        """Batch groups with identical specs; full attention first.  Groups out of
        prefix caching (a ring, bounded replay) take no part in lookups: their hits
        stay empty."""
        groups: list[list] = []  # [spec, group_ids, manager_cls, use_eagle]
        for i, g in enumerate(self.kv_cache_config.kv_cache_groups):
            spec = g.kv_cache_spec
            if isinstance(spec, CrossAttentionSpec) or not spec.prefix_cacheable:
                continue
            klass = type(self.single_type_managers[i])
            use_eagle = i in self.drop_eagle_group_ids
            for entry in groups:
                if entry[0] == spec:
                    entry[1].append(i)
                    entry[3] = entry[3] or use_eagle
                    break
            else:
                groups.append([spec, [i], klass, use_eagle])
        if not groups:
            raise AssertionError("HybridKVCacheCoordinator requires at least one cacheable group.")
        groups.sort(key=lambda e: not isinstance(e[0], FullAttentionSpec))
        object.__setattr__(self, "attention_groups", [SpecGroup(*e) for e in groups])
        for spec, ids, klass, use_eagle in self.attention_groups:
            if use_eagle:
                for gid in ids:
                    self.single_type_managers[gid].use_eagle = True
        self._is_simple_hybrid = len(groups) == 2 and isinstance(groups[0][0], FullAttentionSpec)

    def _tokens_to_cache(self, manager: SingleTypeKVCacheManager, num_computed_tokens: int) -> int:
        # Hits are scheduler-block aligned; EAGLE groups keep one block past the
        # boundary (their hit looks one block further, then drops it), within the
        # finalized tokens (the re-prefillable ones are left out).
        aligned = self._align_cacheable(num_computed_tokens)
        if manager.use_eagle and aligned > 0:
            finalized = num_computed_tokens - self.num_reprefillable_tokens
            if finalized < 0:
                finalized = 0
            return min(finalized, self._align_cacheable(finalized) + manager.block_size)
        return aligned

    def find_longest_cache_hit(self, block_hashes, max_cache_hit_length):
        num_groups = len(self.kv_cache_config.kv_cache_groups)
        hit_length = max_cache_hit_length
        longest = 0
        blocks_by_group: list = [None] * num_groups
        length_by_group = [0] * num_groups
        alignment = self._cache_hit_alignment_tokens
        partial = self.enable_partial_hash_hits
        eagle_verified: set[int] = set()
        managers = self.single_type_managers
        while True:
            curr = hit_length
            for idx, (spec, group_ids, klass, use_eagle) in enumerate(self.attention_groups):
                first = group_ids[0]
                if isinstance(spec, FullAttentionSpec) and blocks_by_group[first] is not None:
                    curr = min(curr, length_by_group[first])
                    continue
                drop = use_eagle and idx not in eagle_verified
                max_len = curr
                if drop and not isinstance(spec, MambaSpec):
                    # (EAGLE looks one block -- one hash block when fine-grained -- past
                    # the candidate, up to the request's hashes)
                    margin = eagle_proof_margin(managers[first].block_size, self.hash_block_size,
                                                partial and klass.supports_fine_grained_hash_lookup)
                    max_len = min(curr + margin, len(block_hashes) * self.hash_block_size)
                hit_blocks, new_len = klass.find_longest_cache_hit(
                    block_hashes, max_len, group_ids, self.block_pool, spec, drop, alignment,
                    managers[first].dcp_world_size, managers[first].pcp_world_size,
                )
                if drop:
                    eagle_verified.add(idx)
                elif new_len < curr:
                    eagle_verified.clear()
                curr = new_len
                for gid, blks in zip(group_ids, hit_blocks):
                    blocks_by_group[gid] = blks
                    length_by_group[gid] = new_len
                if curr > longest:
                    longest = curr
            if curr >= hit_length:
                break
            hit_length = curr
            if self._is_simple_hybrid:
                break
        for spec, group_ids, klass, use_eagle in self.attention_groups:
            if not isinstance(spec, FullAttentionSpec):
                continue
            n = cdiv(hit_length, managers[group_ids[0]].block_size)
            for gid in group_ids:
                blks = blocks_by_group[gid]
                if blks is not None:
                    del blks[n:]
                    length_by_group[gid] = hit_length
        blocks = tuple(b if b is not None else [] for b in blocks_by_group)
        return blocks, hit_length, longest - hit_length

    def find_longest_cache_hit_per_group(self, block_hashes, max_cache_hit_length):
        """Each lookup group's own longest hit, not cut to the hit all groups share as in
        ``find_longest_cache_hit``: ``(blocks per group, hit length per group)``, with
        ``[]`` and 0 for groups out of prefix caching.  EAGLE groups look one block past
        ``max_cache_hit_length`` and drop it, as in the shared search."""
        num_groups = len(self.kv_cache_config.kv_cache_groups)
        blocks_by_group: list = [[] for _ in range(num_groups)]
        length_by_group = [0] * num_groups
        managers = self.single_type_managers
        for spec, group_ids, klass, use_eagle in self.attention_groups:
            first = group_ids[0]
            max_len = max_cache_hit_length
            if use_eagle and not isinstance(spec, MambaSpec):
                margin = eagle_proof_margin(managers[first].block_size, self.hash_block_size,
                                            self.enable_partial_hash_hits and klass.supports_fine_grained_hash_lookup)
                max_len = min(max_cache_hit_length + margin, len(block_hashes) * self.hash_block_size)
            hit_blocks, hit_length = klass.find_longest_cache_hit(
                block_hashes, max_len, group_ids, self.block_pool, spec, use_eagle, self._cache_hit_alignment_tokens,
                managers[first].dcp_world_size, managers[first].pcp_world_size,
            )
            for gid, blks in zip(group_ids, hit_blocks):
                blocks_by_group[gid] = blks
                length_by_group[gid] = hit_length
        return tuple(blocks_by_group), tuple(length_by_group)


def get_kv_cache_coordinator(
    kv_cache_config: KVCacheConfig,
    max_model_len: int,
    max_in_flight_tokens: int,
    use_eagle: bool,
    enable_caching: bool,
    enable_kv_cache_events: bool,
    dcp_world_size: int,
    pcp_world_size: int,
    scheduler_block_size: int,
    hash_block_size: int,
    metrics_collector: Any = None,
    num_hash_lookahead_tokens: int = 0,
    num_prefill_lookahead: int = 0,
    allow_partial_hash_hits: bool = True,
    use_int_block_hashes: bool | None = None,
) -> KVCacheCoordinator:
    """The coordinator for a config: none-caching, one group, or a hybrid (vLLM's
    parameters and order; ``use_int_block_hashes`` is kvcy's, last)."""
    common = dict(dcp_world_size=dcp_world_size, pcp_world_size=pcp_world_size,
                  scheduler_block_size=scheduler_block_size, hash_block_size=hash_block_size,
                  metrics_collector=metrics_collector, num_hash_lookahead_tokens=num_hash_lookahead_tokens,
                  num_prefill_lookahead=num_prefill_lookahead, use_int_block_hashes=use_int_block_hashes)
    if not enable_caching:
        return KVCacheCoordinatorNoPrefixCache(
            kv_cache_config, max_model_len, max_in_flight_tokens, use_eagle, enable_kv_cache_events, **common
        )
    if len(kv_cache_config.kv_cache_groups) == 1:
        return UnitaryKVCacheCoordinator(
            kv_cache_config, max_model_len, max_in_flight_tokens, use_eagle, enable_caching,
            enable_kv_cache_events, **common,
        )
    return HybridKVCacheCoordinator(
        kv_cache_config, max_model_len, max_in_flight_tokens, use_eagle, enable_caching,
        enable_kv_cache_events, allow_partial_hash_hits=allow_partial_hash_hits, **common,
    )
