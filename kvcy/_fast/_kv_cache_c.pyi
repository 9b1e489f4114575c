"""Type stub for the compiled twin; the pure twin ``_kv_cache_py`` has the same API.

Attributes that the compiled twin keeps read-only (``cdef readonly`` fields,
properties without a setter) are properties here.  A ``cdef class`` that adds
C fields is a ``@disjoint_base`` (no two of them can be bases of one class);
the ``@final`` ones cannot be subclassed at all.  ``mypy.stubtest`` checks this
file against the built module (.ci/run).
"""

import logging
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any, ClassVar, final

from typing_extensions import disjoint_base

from kvcy._request_types import KVCacheBlockCopy, LoRARequest, MultiModalFeatureSpec, RequestStatus
from kvcy.kv_cache_interface import KVCacheConfig, KVCacheSpec
from kvcy.kv_events import KVCacheEvent
from kvcy.metrics import PrefixCacheStats

logger: logging.Logger
IMPLEMENTATION: str

def cdiv(a: int, b: int) -> int: ...

@disjoint_base
class Request:
    request_id: str
    prompt_token_ids: list[int] | None
    max_tokens: int | None
    lora_request: LoRARequest | None
    mm_features: list[MultiModalFeatureSpec]
    cache_salt: str | None
    prompt_embeds: Any
    kv_cache_report_mode: str
    arrival_time: float
    skip_reading_prefix_cache: bool
    session_id: str | None
    shared_prefix_boundary: int
    #: The serving loop's: RUNNING once admitted, PREEMPTED, a FINISHED_* one
    #: (allocate_slots keeps the watermark for WAITING / PREEMPTED requests).
    status: RequestStatus
    #: Tokens whose KV is in the cache: the hit length on admission, advanced by
    #: the serving loop after each forward pass, 0 again on preemption.
    num_computed_tokens: int
    #: Scheduled tokens whose KV is not written yet (asynchronous scheduling).
    num_in_flight_tokens: int
    #: The serving loop adds 1 at each preemption.
    num_preemptions: int
    num_prompt_tokens: int
    spec_token_ids: list[int]
    block_hashes: list[bytes]
    def __init__(
        self,
        request_id: str,
        prompt_token_ids: Sequence[int] | None,
        max_tokens: int | None = None,
        *,
        lora_request: LoRARequest | None = None,
        mm_features: list[MultiModalFeatureSpec] | None = None,
        cache_salt: str | None = None,
        prompt_embeds: Any = None,
        block_hasher: Callable[[Request], list[bytes]] | None = None,
        kv_cache_report_mode: str = "incremental",
        arrival_time: float = 0.0,
        skip_reading_prefix_cache: bool = False,
        session_id: str | None = None,
    ) -> None: ...
    @property
    def num_tokens(self) -> int: ...
    @property
    def num_output_tokens(self) -> int: ...
    @property
    def output_token_ids(self) -> list[int]: ...
    @property
    def all_token_ids(self) -> list[int]: ...
    @property
    def is_finished(self) -> bool: ...
    def append_output_token_ids(self, token_ids: int | Sequence[int]) -> None: ...

@disjoint_base
class KVCacheBlock:
    block_id: int
    ref_cnt: int
    is_null: bool
    block_hash_num_tokens: int | None
    def __init__(self, block_id: int, *, pool: None = None, is_null: bool = False) -> None: ...
    @property
    def prev_free_block(self) -> KVCacheBlock | None: ...
    @property
    def next_free_block(self) -> KVCacheBlock | None: ...
    @property
    def block_hash(self) -> bytes | None: ...
    @block_hash.setter
    def block_hash(self, block_hash: bytes) -> None: ...
    def set_block_hash(self, block_hash: bytes, num_tokens: int | None = None) -> None: ...
    def reset_hash(self) -> None: ...

@final
class FreeKVCacheBlockQueue:
    num_free_blocks: int
    @property
    def fake_free_list_head(self) -> KVCacheBlock: ...
    @property
    def fake_free_list_tail(self) -> KVCacheBlock: ...
    def __init__(self, blocks: list[KVCacheBlock]) -> None: ...
    def popleft(self) -> KVCacheBlock: ...
    def popleft_n(self, n: int) -> list[KVCacheBlock]: ...
    def remove(self, block: KVCacheBlock) -> None: ...
    def append(self, block: KVCacheBlock) -> None: ...
    def append_n(self, blocks: list[KVCacheBlock]) -> None: ...
    def prepend_n(self, blocks: list[KVCacheBlock]) -> None: ...
    def iter_blocks_after(self, cursor: KVCacheBlock | None) -> Iterator[KVCacheBlock]: ...
    def get_all_free_blocks(self) -> list[KVCacheBlock]: ...
    def __len__(self) -> int: ...

@final
class BlockHashToBlockMap:
    def __init__(self) -> None: ...
    def get_one_block(self, key: bytes) -> KVCacheBlock | None: ...
    def contain(self, key: bytes, block_id: int) -> bool: ...
    def insert(self, key: bytes, block: KVCacheBlock) -> None: ...
    def pop(self, key: bytes, block_id: int) -> KVCacheBlock | None: ...
    def keys(self) -> list[bytes]: ...
    def __len__(self) -> int: ...

def resolve_block_hashes(hashes: list[bytes], hash_block_size: int, block_size: int) -> Sequence[bytes]: ...

@disjoint_base
class BlockPool:
    num_gpu_blocks: int
    enable_caching: bool
    hash_block_size: int
    blocks: list[KVCacheBlock]
    free_block_queue: FreeKVCacheBlockQueue
    cached_block_hash_to_block: BlockHashToBlockMap
    @property
    def cached_block_hashes_by_block(self) -> Mapping[int, frozenset[bytes]]: ...
    null_block: KVCacheBlock
    enable_kv_cache_events: bool
    use_int_block_hashes: bool
    kv_event_queue: list[KVCacheEvent]
    num_hash_lookahead_tokens: int
    medium: str | None
    metrics_collector: Any
    num_evictions: int
    def __init__(
        self,
        num_gpu_blocks: int,
        enable_caching: bool,
        hash_block_size: int,
        enable_kv_cache_events: bool = False,
        metrics_collector: Any = None,
        num_hash_lookahead_tokens: int = 0,
        medium: str | None = "GPU",
        use_int_block_hashes: bool | None = None,
    ) -> None: ...
    def get_cached_block(self, block_hash: bytes, kv_cache_group_ids: list[int]) -> list[KVCacheBlock] | None: ...
    def cache_full_blocks(
        self,
        request: Request,
        blocks: list[KVCacheBlock],
        num_cached_blocks: int,
        num_full_blocks: int,
        block_size: int,
        kv_cache_group_id: int,
        block_mask: Sequence[bool] | None = None,
    ) -> None: ...
    def emit_cached_block_events(
        self, request: Request, num_cached_blocks: int, block_size: int, kv_cache_group_id: int
    ) -> None: ...
    def get_new_blocks(self, num_blocks: int) -> list[KVCacheBlock]: ...
    def evict_blocks(self, block_ids: set[int]) -> None: ...
    def touch(self, blocks: Sequence[KVCacheBlock] | Sequence[Sequence[KVCacheBlock]]) -> None: ...
    def is_block_writable(self, block: KVCacheBlock) -> bool: ...
    def move_block_hashes(self, src_block: KVCacheBlock, dst_block: KVCacheBlock) -> None: ...
    def unpin_blocks(self, blocks: Iterable[KVCacheBlock], on_reuse: Callable[[KVCacheBlock], None]) -> None: ...
    def cache_partial_block(
        self,
        request: Request,
        block: KVCacheBlock,
        num_tokens: int,
        kv_cache_group_id: int,
        block_size: int,
        replace_existing_hashes: bool = False,
    ) -> bytes | None: ...
    def free_blocks(self, ordered_blocks: Iterable[KVCacheBlock]) -> None: ...
    def reset_prefix_cache(self) -> bool: ...
    def get_num_free_blocks(self) -> int: ...
    def get_usage(self) -> float: ...
    def take_events(self) -> list[KVCacheEvent]: ...

@disjoint_base
class SingleTypeKVCacheManager:
    kv_cache_spec: KVCacheSpec
    block_size: int
    block_pool: BlockPool
    enable_caching: bool
    kv_cache_group_id: int
    scheduler_block_size: int
    use_eagle: bool
    req_to_blocks: dict[str, list[KVCacheBlock]]
    num_cached_block: dict[str, int]
    new_block_ids: list[int]
    cache_hit_alignment_tokens: int
    shared_prefix_checkpoint: bool
    retains_longer_hit: ClassVar[bool]
    supports_fine_grained_hash_lookup: ClassVar[bool]
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
    ) -> None: ...
    def get_num_skipped_tokens(self, num_computed_tokens: int) -> int: ...
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
    ) -> int: ...
    def add_local_computed_blocks(
        self,
        request_id: str,
        new_computed_blocks: Sequence[KVCacheBlock],
        num_local_computed_tokens: int,
        num_external_computed_tokens: int,
    ) -> None: ...
    def allocate_external_computed_blocks(
        self,
        request_id: str,
        num_local_computed_tokens: int,
        num_external_computed_tokens: int,
        record_for_zeroing: bool = True,
    ) -> None: ...
    def allocate_new_blocks(self, request_id: str, num_tokens: int, num_tokens_main_model: int) -> list[KVCacheBlock]: ...
    @property
    def records_new_block_ids(self) -> bool: ...
    def take_new_block_ids(self) -> list[int]: ...
    def take_pending_cow_copies(self) -> list[tuple[KVCacheBlock, KVCacheBlock]]: ...
    def take_pending_boundary_state_offloads(self) -> list[tuple[str, int, KVCacheBlock, int]]: ...
    def finalize_partial_tail_offload(
        self, request_id: str, num_computed_tokens: int, num_in_flight_tokens: int
    ) -> tuple[int, KVCacheBlock, int] | None: ...
    @property
    def has_positionally_stable_blocks(self) -> bool: ...
    def cache_blocks(
        self,
        request: Request,
        num_tokens: int,
        retention_interval: int | None = None,
        replay_boundaries: Sequence[int] = (),
    ) -> None: ...
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
    ) -> list[bool] | None: ...
    def pop_blocks_for_free(self, request_id: str) -> list[KVCacheBlock]: ...
    def free(self, request_id: str) -> None: ...
    def remove_skipped_blocks(
        self, request_id: str, processed_computed_tokens: int, num_prompt_tokens: int | None = None
    ) -> None: ...
    def get_num_common_prefix_blocks(self, running_request_id: str) -> int: ...
    @property
    def max_admission_blocks_per_request(self) -> int | None: ...
    @property
    def dcp_world_size(self) -> int: ...
    @property
    def pcp_world_size(self) -> int: ...
    def new_step_starts(self) -> None: ...
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
    ) -> tuple[tuple[list[KVCacheBlock], ...], int]: ...

class FullAttentionManager(SingleTypeKVCacheManager): ...
class SinkFullAttentionManager(FullAttentionManager): ...

@disjoint_base
class SlidingWindowManager(SingleTypeKVCacheManager):
    sliding_window: int
    extra_retained_tokens: int
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
    ) -> list[bool] | None: ...

@disjoint_base
class ChunkedLocalAttentionManager(SingleTypeKVCacheManager):
    attention_chunk_size: int

@disjoint_base
class RSWAManager(FullAttentionManager):
    rswa_window: int

class CircularBufferManager(FullAttentionManager): ...

@disjoint_base
class MambaManager(SingleTypeKVCacheManager):
    mamba_cache_mode: str
    _align: bool
    num_speculative_blocks: int
    has_prefill_checkpoint_blocks: bool
    drop_eagle_checkpoint_block: bool
    cached_blocks_this_step: set[bytes]
    last_state_block_idx: dict[str, int]
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
    ) -> list[bool] | None: ...
class CrossAttentionManager(SingleTypeKVCacheManager): ...

spec_manager_map: dict[type, type[SingleTypeKVCacheManager]]

def get_manager_for_kv_cache_spec(
    kv_cache_spec: KVCacheSpec,
    max_in_flight_tokens: int,
    max_model_len: int,
    role: str | None = None,
    **kwargs: Any,
) -> SingleTypeKVCacheManager: ...

@disjoint_base
class KVCacheCoordinator:
    kv_cache_config: KVCacheConfig
    max_model_len: int
    enable_caching: bool
    scheduler_block_size: int
    hash_block_size: int
    block_pool: BlockPool
    eagle_group_ids: set[int]
    single_type_managers: tuple[SingleTypeKVCacheManager, ...]
    num_reprefillable_tokens: int
    drop_eagle_group_ids: set[int]
    enable_partial_hash_hits: bool
    retention_interval: int | None
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
    ) -> None: ...
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
    ) -> int: ...
    def allocate_new_computed_blocks(
        self,
        request_id: str,
        new_computed_blocks: tuple[Sequence[KVCacheBlock], ...],
        num_local_computed_tokens: int,
        num_external_computed_tokens: int,
        skip_zeroing_group_ids: tuple[int, ...] = (),
    ) -> None: ...
    def allocate_new_blocks(
        self, request_id: str, num_tokens: int, num_tokens_main_model: int, num_encoder_tokens: int = 0
    ) -> tuple[list[KVCacheBlock], ...]: ...
    def cache_blocks(self, request: Request, num_computed_tokens: int) -> None: ...
    def get_num_cacheable_tokens(self, num_computed_tokens: int, kv_cache_group_id: int) -> int: ...
    def emit_cached_block_events(
        self, request: Request, computed_blocks: Sequence[Sequence[KVCacheBlock]]
    ) -> None: ...
    def reset_prefix_cache(self) -> bool: ...
    def free(self, request_id: str) -> None: ...
    def pop_blocks_for_free(self, request_id: str) -> list[KVCacheBlock]: ...
    def get_num_common_prefix_blocks(self, running_request_id: str) -> list[int]: ...
    def remove_skipped_blocks(
        self, request_id: str, processed_computed_tokens: int, num_prompt_tokens: int | None = None
    ) -> None: ...
    def get_blocks(self, request_id: str) -> tuple[list[KVCacheBlock], ...]: ...
    @property
    def group_block_sizes(self) -> tuple[int, ...]: ...
    @property
    def dcp_world_size(self) -> int: ...
    @property
    def pcp_world_size(self) -> int: ...
    def new_step_starts(self) -> None: ...
    def holds(self, request_id: str) -> bool: ...
    def find_longest_cache_hit(
        self, block_hashes: list[bytes], max_cache_hit_length: int
    ) -> tuple[tuple[list[KVCacheBlock], ...], int, int]: ...

@disjoint_base
class KVCacheCoordinatorNoPrefixCache(KVCacheCoordinator):
    num_single_type_manager: int
    def __init__(
        self,
        kv_cache_config: KVCacheConfig,
        max_model_len: int,
        max_in_flight_tokens: int,
        use_eagle: bool,
        enable_kv_cache_events: bool,
        dcp_world_size: int,
        pcp_world_size: int,
        scheduler_block_size: int,
        hash_block_size: int,
        metrics_collector: Any = None,
        num_hash_lookahead_tokens: int = 0,
        num_prefill_lookahead: int = 0,
        use_int_block_hashes: bool | None = None,
    ) -> None: ...

@disjoint_base
class UnitaryKVCacheCoordinator(KVCacheCoordinator):
    kv_cache_spec: KVCacheSpec
    block_size: int
    use_eagle: bool
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
        num_hash_lookahead_tokens: int = 0,
        num_prefill_lookahead: int = 0,
        use_int_block_hashes: bool | None = None,
    ) -> None: ...

@disjoint_base
class HybridKVCacheCoordinator(KVCacheCoordinator):
    attention_groups: list[tuple[Any, ...]]
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
        num_hash_lookahead_tokens: int = 0,
        num_prefill_lookahead: int = 0,
        allow_partial_hash_hits: bool = True,
        use_int_block_hashes: bool | None = None,
    ) -> None: ...
    @property
    def _cache_hit_alignment_tokens(self) -> int: ...
    @property
    def full_attention_group_id(self) -> int | None: ...
    def verify_and_split_kv_cache_groups(self) -> None: ...
    def find_longest_cache_hit_per_group(
        self, block_hashes: Sequence[bytes], max_cache_hit_length: int
    ) -> tuple[tuple[list[KVCacheBlock], ...], tuple[int, ...]]: ...

def replay_boundaries(num_prompt_tokens: int, scheduler_block_size: int, use_eagle: bool) -> tuple[int, ...]: ...

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
) -> KVCacheCoordinator: ...

def get_mamba_prefill_checkpoint_position(
    num_tokens: int, hash_block_size: int, drop_eagle_block: bool, num_hash_lookahead_tokens: int = 0
) -> int: ...
def is_mamba_prefill_checkpoint_valid(
    query_start: int,
    query_end: int,
    checkpoint_position: int,
    hash_block_size: int,
    mamba_block_size: int,
    checkpoint_alignment: int | None,
) -> bool: ...
def partial_hash_hits_enabled(
    kv_cache_groups: Sequence[Any],
    hash_block_size: int,
    dcp_world_size: int = 1,
    manager_classes: Sequence[type] | None = None,
) -> bool: ...
def eagle_proof_margin(block_size: int, hash_block_size: int, fine_grained_lookup: bool) -> int: ...

@disjoint_base
class KVCacheBlocks:
    blocks: tuple[Sequence[KVCacheBlock], ...]
    __hash__: ClassVar[None]  # type: ignore[assignment]
    def __init__(self, blocks: tuple[Sequence[KVCacheBlock], ...] | list[Sequence[KVCacheBlock]]) -> None: ...
    def __add__(self, other: KVCacheBlocks) -> KVCacheBlocks: ...
    def __eq__(self, other: object, /) -> bool: ...
    def get_block_ids(
        self, allow_none: bool = False, *, group_ids: Sequence[int] | None = None
    ) -> tuple[list[int], ...] | None: ...
    def get_unhashed_block_ids(self) -> list[int]: ...
    def get_unhashed_block_ids_all_groups(self) -> list[list[int]]: ...
    def new_empty(self) -> KVCacheBlocks: ...

@disjoint_base
class KVCacheManager:
    max_model_len: int
    enable_caching: bool
    enable_kv_cache_events: bool
    use_eagle: bool
    log_stats: bool
    metrics_collector: Any
    prefix_cache_stats: PrefixCacheStats | None
    coordinator: KVCacheCoordinator
    num_kv_cache_groups: int
    block_pool: BlockPool
    kv_cache_config: KVCacheConfig
    watermark_blocks: int
    kv_cache_event_metadata: tuple[Any, ...]
    empty_kv_cache_blocks: KVCacheBlocks
    mamba_shared_prefix_checkpoint: bool
    retained_hit_group_ids: tuple[int, ...]
    #: allocate_slots raises ValueError (instead of returning None) for an
    #: allocation bigger than the whole pool; the vLLM drop-in turns it off.
    refuse_unservable: bool
    #: allocate_slots raises ValueError for prefix hits no longer cached as
    #: get_computed_blocks found them; the vLLM drop-in turns it off.
    refuse_stale_hits: bool
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
    ) -> None: ...
    @property
    def usage(self) -> float: ...
    def make_prefix_cache_stats(self) -> PrefixCacheStats | None: ...
    def create_kv_cache_blocks(self, blocks: tuple[list[KVCacheBlock], ...]) -> KVCacheBlocks: ...
    def prefix_cache_lookup_enabled(self, request: Request) -> bool: ...
    def record_prefix_cache_stats(self, request: Request, num_hits: int) -> None: ...
    def get_computed_blocks(
        self, request: Request, max_cache_hit_length: int | None = None
    ) -> tuple[KVCacheBlocks, int, int]: ...
    def get_computed_blocks_for_connector(
        self, request: Request, max_cache_hit_length: int | None = None
    ) -> tuple[KVCacheBlocks, int, int, bool]: ...
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
    ) -> KVCacheBlocks | None: ...
    def free(self, request: Request) -> None: ...
    def remove_skipped_blocks(
        self, request_id: str, processed_computed_tokens: int, num_prompt_tokens: int | None = None
    ) -> None: ...
    def pop_blocks_for_free(self, request: Request) -> list[KVCacheBlock]: ...
    def evict_blocks(self, block_ids: set[int]) -> None: ...
    def reset_prefix_cache(self) -> bool: ...
    def get_num_common_prefix_blocks(self, running_request_id: str) -> list[int]: ...
    def take_events(self) -> list[KVCacheEvent]: ...
    def get_blocks(self, request_id: str) -> KVCacheBlocks: ...
    def get_block_ids(self, request_id: str) -> tuple[list[int], ...]: ...
    def get_block_ids_for_computed_tokens(self, request_id: str, num_computed_tokens: int) -> tuple[list[int], ...]: ...
    def estimate_cached_tokens(self, request: Request) -> int: ...
    def cache_blocks(self, request: Request, num_computed_tokens: int) -> None: ...
    def truncate_computed_blocks(self, blocks: KVCacheBlocks, num_computed_tokens: int) -> KVCacheBlocks: ...
    def take_new_block_ids(self) -> list[int]: ...
    def record_blocks_for_zeroing(self, request_id: str, start_token: int) -> None: ...
    def take_kv_cache_block_copies(self) -> tuple[list[KVCacheBlockCopy], list[KVCacheBlock]]: ...
    def take_boundary_state_offloads(self) -> dict[str, list[tuple[int, int, int]]]: ...
    def finalize_partial_tail_offloads(self, request: Request) -> list[tuple[int, int, int]]: ...
    def new_step_starts(self) -> None: ...
