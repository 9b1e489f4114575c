"""The KV-offloading API: keys, request contexts, load/store specs, events, managers.

Mirrors ``vllm.v1.kv_offload.base`` of vLLM 0.33.0 (names, signatures, defaults),
so code written against vLLM's offloading connector reads the same here.  The
scheduler side talks to an :class:`OffloadingManager` (which blocks are
offloaded, where, and what to evict); the worker side moves the bytes described
by :class:`LoadStoreSpec` objects.  The CPU tier's manager lives in
:mod:`kvcy.kv_offload.cpu`.

An :data:`OffloadKey` is plain ``bytes``: a block hash followed by the KV cache
group index as 4 big-endian unsigned bytes.  Managers treat keys as opaque
except for that suffix and byte-wise order.
"""

from __future__ import annotations

import threading
from abc import ABC, abstractmethod
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, fields
from enum import Enum, auto
from typing import TYPE_CHECKING, Any, ClassVar, NamedTuple, NewType, TypeVar

import numpy as np

from kvcy.metrics import CacheHitSource  # vLLM's vllm.v1.metrics.cache_hit_source, re-exported

if TYPE_CHECKING:
    from kvcy.kv_offload.metrics import OffloadingConnectorStats

__all__ = [
    "BlockIDsLoadStoreSpec",
    "CacheHitSource",
    "ConfigInfo",
    "ConfigInfoMapping",
    "GPULoadStoreSpec",
    "LoadStoreSpec",
    "Locality",
    "LookupResult",
    "Medium",
    "OFFLOAD_KEY_SUFFIX_LEN",
    "OffloadKey",
    "OffloadPolicy",
    "OffloadingCounterMetadata",
    "OffloadingEvent",
    "OffloadingGaugeMetadata",
    "OffloadingHistogramMetadata",
    "OffloadingKVEventsConfig",
    "OffloadingManager",
    "OffloadingMetricMetadata",
    "OffloadingSpec",
    "PrepareStoreOutput",
    "ReqContext",
    "RequestOffloadingContext",
    "ScheduleEndContext",
    "TierFilter",
    "TierMatcher",
    "check_offload_key",
    "get_offload_block_hash",
    "get_offload_group_idx",
    "make_offload_key",
]

# ---------------------------------------------------------------------------
# Keys
# ---------------------------------------------------------------------------

#: A block hash followed by its KV cache group index (4 bytes, big-endian).
OffloadKey = NewType("OffloadKey", bytes)

#: Length of the group-index suffix of an :data:`OffloadKey`.
OFFLOAD_KEY_SUFFIX_LEN = 4


def check_offload_key(key: Any) -> bytes:
    """Return ``key`` if it can be an :data:`OffloadKey`, else raise.

    Raises:
        TypeError: ``key`` is not ``bytes``.
        ValueError: ``key`` is shorter than the 4-byte group suffix.
    """
    if type(key) is not bytes:
        if not isinstance(key, bytes):
            raise TypeError(f"an offload key must be bytes, got {type(key).__name__}")
    if len(key) < OFFLOAD_KEY_SUFFIX_LEN:
        raise ValueError(
            f"an offload key is a block hash plus a 4-byte group index, got {len(key)} bytes: {key!r}"
        )
    return key


def make_offload_key(block_hash: bytes, group_idx: int) -> OffloadKey:
    """Pack a block hash and a KV cache group index into an :data:`OffloadKey`.

    Raises:
        TypeError: ``block_hash`` is not bytes or ``group_idx`` not an int.
        OverflowError: ``group_idx`` does not fit 4 unsigned bytes (as vLLM's
            ``int.to_bytes`` raises).
    """
    if not isinstance(block_hash, bytes):
        raise TypeError(f"block_hash must be bytes, got {type(block_hash).__name__}")
    if not isinstance(group_idx, int):
        raise TypeError(f"group_idx must be an int, got {type(group_idx).__name__}")
    return OffloadKey(bytes(block_hash) + group_idx.to_bytes(OFFLOAD_KEY_SUFFIX_LEN, "big", signed=False))


def get_offload_block_hash(key: OffloadKey) -> bytes:
    """The block hash part of an :data:`OffloadKey` (all but the last 4 bytes)."""
    return check_offload_key(key)[:-OFFLOAD_KEY_SUFFIX_LEN]


def get_offload_group_idx(key: OffloadKey) -> int:
    """The KV cache group index of an :data:`OffloadKey` (its last 4 bytes)."""
    return int.from_bytes(check_offload_key(key)[-OFFLOAD_KEY_SUFFIX_LEN:], "big")


# ---------------------------------------------------------------------------
# Tiers and request contexts
# ---------------------------------------------------------------------------


class Medium(Enum):
    """Where an offloading tier keeps its data."""

    CPU = "CPU"
    STORAGE = "STORAGE"


class Locality(Enum):
    """Whether a tier's storage is local to the publishing instance."""

    LOCAL = "LOCAL"
    REMOTE = "REMOTE"


class TierMatcher(NamedTuple):
    """Matches tiers by medium and locality; ``None`` matches anything."""

    medium: Medium | None = None
    locality: Locality | None = None

    def matches(self, medium: Medium | None, locality: Locality | None) -> bool:
        """Whether a tier with this medium and locality is matched."""
        return (self.medium is None or medium is None or self.medium == medium) and (
            self.locality is None or locality is None or self.locality == locality
        )


@dataclass(frozen=True)
class TierFilter:
    """Which tiers a request may load from (``TierFilter.ALL``: every tier)."""

    matchers: tuple[TierMatcher, ...] = ()

    ALL: ClassVar[TierFilter]

    def allows(self, medium: Medium | None, locality: Locality | None) -> bool:
        """Whether a tier with this medium and locality takes part."""
        if self is TierFilter.ALL:
            return True
        return any(m.matches(medium, locality) for m in self.matchers)


TierFilter.ALL = TierFilter(matchers=(TierMatcher(),))

_T = TypeVar("_T")


@dataclass
class ReqContext:
    """What a manager may know about one request across its calls.

    Besides the request's id and transfer parameters it carries two scratch
    areas: per-key end-token positions (set by the scheduler, so a manager can
    order a request's keys head to tail even when stores arrive out of order)
    and per-type state a manager keeps for the request (one value per type).
    """

    req_id: str
    kv_transfer_params: dict[str, Any] | None = None
    kv_hints: Any = None
    load_tier_filter: TierFilter = TierFilter.ALL
    _state: dict[type, Any] = field(default_factory=dict, repr=False, init=False)
    _offload_key_positions: dict[OffloadKey, int] = field(default_factory=dict, repr=False, init=False)

    def set_state(self, val: Any) -> None:
        """Keep ``val`` on the context, replacing the earlier value of its type."""
        self._state[type(val)] = val

    def get_state(self, cls: type[_T]) -> _T | None:
        """The value of type ``cls`` kept by :meth:`set_state`, or ``None``."""
        return self._state.get(cls)

    def set_offload_key_position(self, key: OffloadKey, end_token: int) -> None:
        """Record that ``key``'s chunk ends at token index ``end_token``.

        Raises:
            TypeError: ``key`` is not bytes or ``end_token`` not an int.
            ValueError: ``key`` is too short or ``end_token`` negative.
        """
        check_offload_key(key)
        if isinstance(end_token, bool) or not isinstance(end_token, int):
            raise TypeError(f"end_token must be an int, got {type(end_token).__name__}")
        if end_token < 0:
            raise ValueError(f"end_token must be non-negative, got {end_token}")
        self._offload_key_positions[key] = int(end_token)

    def get_offload_key_position(self, key: OffloadKey) -> int | None:
        """The end-token position recorded for ``key``, or ``None``."""
        return self._offload_key_positions.get(key)


class LookupResult(Enum):
    """What :meth:`OffloadingManager.lookup` found for one key."""

    MISS = auto()
    HIT = auto()
    HIT_PENDING = auto()
    RETRY = auto()


class OffloadPolicy(Enum):
    """How much of a request a tier wants offered for storing."""

    #: Only chunks the request computes itself; prefix hits are not re-offered.
    CHUNK_LEVEL = "chunk_level"
    #: Every chunk of the request, prefix hits included.
    REQUEST_LEVEL = "request_level"


@dataclass
class RequestOffloadingContext:
    """A manager's answer to :meth:`OffloadingManager.on_new_request`."""

    policy: OffloadPolicy = OffloadPolicy.CHUNK_LEVEL


class ScheduleEndContext(NamedTuple):
    """What one scheduler step did, given to :meth:`OffloadingManager.on_schedule_end`."""

    new_req_ids: Collection[str]
    preempted_req_ids: Collection[str]


# ---------------------------------------------------------------------------
# Load / store specs
# ---------------------------------------------------------------------------


class LoadStoreSpec:
    """Where a worker finds (or puts) blocks of KV data: one side of a transfer."""


def _as_block_ids(block_ids: Any) -> np.ndarray:
    """``block_ids`` as a 1-D int32 array of non-negative ids, or a clear error."""
    if isinstance(block_ids, np.ndarray):
        arr = block_ids
        if arr.dtype.kind not in "iu":
            raise TypeError(f"block_ids must hold integers, got dtype {arr.dtype}")
    else:
        if isinstance(block_ids, (str, bytes)) or not isinstance(block_ids, Iterable):
            raise TypeError(f"block_ids must be a sequence of ints, got {type(block_ids).__name__}")
        ids = list(block_ids)
        for b in ids:
            if isinstance(b, bool) or not isinstance(b, (int, np.integer)):
                raise TypeError(f"block_ids must hold ints, got {type(b).__name__}")
        arr = np.array(ids, dtype=np.int64)
    if arr.ndim != 1:
        raise ValueError(f"block_ids must be one-dimensional, got shape {arr.shape}")
    if arr.size and (int(arr.min()) < 0 or int(arr.max()) > np.iinfo(np.int32).max):
        raise ValueError("block_ids must be in [0, 2**31)")
    return arr.astype(np.int32, copy=True)


class BlockIDsLoadStoreSpec(LoadStoreSpec, ABC):
    """Blocks named by their numbers in some block-addressed store.

    ``block_ids`` is kept as a numpy ``int32`` array, as in vLLM.  What a
    number means depends on the subclass: a GPU block for
    :class:`GPULoadStoreSpec`, a CPU cache chunk for ``CPULoadStoreSpec``.

    Raises:
        TypeError: ``block_ids`` is not a sequence of ints.
        ValueError: an id is negative or does not fit int32.
    """

    def __init__(self, block_ids: list[int]):
        self.block_ids = _as_block_ids(block_ids)

    def __repr__(self) -> str:
        return repr(self.block_ids)


def _as_int_tuple(name: str, values: Any) -> tuple[int, ...]:
    if isinstance(values, (str, bytes)) or not isinstance(values, Iterable):
        raise TypeError(f"{name} must be a sequence of ints, got {type(values).__name__}")
    out = []
    for v in values:
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)):
            raise TypeError(f"{name} must hold ints, got {type(v).__name__}")
        if v < 0:
            raise ValueError(f"{name} must be non-negative, got {int(v)}")
        out.append(int(v))
    return tuple(out)


class GPULoadStoreSpec(BlockIDsLoadStoreSpec):
    """GPU blocks to load into or store from.

    With several KV cache groups the blocks come grouped in group order, and
    ``group_sizes[i]`` blocks belong to group ``i`` (so ``sum(group_sizes) ==
    len(block_ids)``); ``group_sizes=None`` means one group.  ``block_indices[i]``,
    when given, is the index within the request of group ``i``'s first block
    (one entry per group); a worker needs it when an offloaded chunk spans
    several GPU blocks and a group's first GPU block starts mid-chunk.

    Raises:
        TypeError: an argument is not a sequence of ints.
        ValueError: a size or index is negative.
        AssertionError: ``sum(group_sizes) != len(block_ids)``, or
            ``block_indices`` does not have one entry per group (vLLM asserts).
    """

    def __init__(
        self,
        block_ids: list[int],
        group_sizes: Sequence[int] | None = None,
        block_indices: Sequence[int] | None = None,
    ):
        super().__init__(block_ids)
        sizes = None if group_sizes is None else _as_int_tuple("group_sizes", group_sizes)
        indices = None if block_indices is None else _as_int_tuple("block_indices", block_indices)
        num_blocks = len(self.block_ids)
        if sizes is not None and sum(sizes) != num_blocks:
            raise AssertionError(
                f"sum(group_sizes) must equal len(block_ids): {sum(sizes)} != {num_blocks}"
            )
        num_groups = 1 if sizes is None else len(sizes)
        if indices is not None and len(indices) != num_groups:
            raise AssertionError(
                f"block_indices needs one entry per KV cache group: {len(indices)} != {num_groups}"
            )
        # kept as given (vLLM keeps the caller's sequences); other iterables as tuples
        self.group_sizes: Sequence[int] | None = (
            group_sizes if isinstance(group_sizes, (Sequence, np.ndarray)) else sizes
        )
        self.block_indices: Sequence[int] | None = (
            block_indices if isinstance(block_indices, (Sequence, np.ndarray)) else indices
        )


@dataclass
class PrepareStoreOutput:
    """What :meth:`OffloadingManager.prepare_store` decided.

    ``keys_to_store`` are the offered keys that need writing (the rest were
    stored already or are in flight), ``store_spec`` says where to write them,
    in the same order, and ``evicted_keys`` were dropped to make room.
    """

    keys_to_store: list[OffloadKey]
    store_spec: LoadStoreSpec
    evicted_keys: list[OffloadKey]


@dataclass
class OffloadingEvent:
    """Keys stored into (``removed=False``) or removed from (``True``) a tier.

    ``metadata_only`` marks a removal that never became visible (a failed
    store): consumers that never saw the key stored may ignore it.
    """

    keys: list[OffloadKey]
    medium: Medium
    removed: bool
    locality: Locality | None = None
    ownership: str | None = None
    removal_expected: bool = False
    metadata_only: bool = False


# ---------------------------------------------------------------------------
# Metrics metadata and configuration facts
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class OffloadingMetricMetadata:
    """How one Prometheus metric of an offloading spec is described."""

    documentation: str
    labelnames: tuple[str, ...] = ()


@dataclass(frozen=True)
class OffloadingCounterMetadata(OffloadingMetricMetadata):
    """A counter metric."""


@dataclass(frozen=True)
class OffloadingGaugeMetadata(OffloadingMetricMetadata):
    """A gauge metric; ``multiprocess_mode`` says how samples of several processes merge."""

    multiprocess_mode: str = "mostrecent"


@dataclass(frozen=True)
class OffloadingHistogramMetadata(OffloadingMetricMetadata):
    """A histogram metric (``buckets=None``: the client's default buckets)."""

    buckets: tuple[float, ...] | None = None


@dataclass(frozen=True)
class OffloadingKVEventsConfig:
    """Whether KV events are published, and whether stored-block events describe themselves."""

    enable_kv_cache_events: bool
    self_describing_kv_events: bool


#: One info-metric series: label name -> label value.
ConfigInfoMapping = Mapping[str, str | int | float | bool]


@dataclass(frozen=True)
class ConfigInfo:
    """Static facts a component reports as the labels of one info-metric series.

    Each dataclass field is one label, in field order (see ``CPUOffloadingInfo``).
    """

    @classmethod
    def config_info_keys(cls) -> tuple[str, ...]:
        """The label names: the field names, in order."""
        return tuple(f.name for f in fields(cls))

    def as_config_info(self) -> ConfigInfoMapping:
        """The label values by name (``None`` becomes ``"None"``)."""
        return {f.name: "None" if getattr(self, f.name) is None else getattr(self, f.name) for f in fields(self)}


# ---------------------------------------------------------------------------
# Managers and specs
# ---------------------------------------------------------------------------


class OffloadingManager(ABC):
    """The scheduler-side bookkeeping of one offloading tier.

    It knows which blocks (by :data:`OffloadKey`) the tier holds, where, and
    in what state, and decides what to evict.  A block goes through
    ``prepare_store`` (space reserved, write pending), ``complete_store``
    (readable), then any number of ``prepare_load`` / ``complete_load`` pairs
    (pinned while read), until it is evicted.  ``lookup`` says whether a key
    can be read.  Methods with a default body are optional for a tier.

    ``lock`` is a re-entrant lock for callers that share one manager between
    threads; the manager's own methods do not take it.
    """

    @property
    def lock(self) -> threading.RLock:
        """A re-entrant lock callers hold around calls made from several threads."""
        lock = self.__dict__.get("_lock")
        if lock is None:
            lock = self.__dict__.setdefault("_lock", threading.RLock())
        return lock

    @abstractmethod
    def lookup(self, key: OffloadKey, req_context: ReqContext) -> LookupResult:
        """Check whether one block is offloaded and ready to be read.

        Args:
            key: the key identifying the block.
            req_context: per-request context.

        Returns:
            ``HIT`` if it is readable, ``HIT_PENDING`` if it is being written,
            ``MISS`` if the tier does not have it, ``RETRY`` to ask again later.
        """

    def get_load_source(self, key: OffloadKey, req_context: ReqContext) -> CacheHitSource:
        """The tier that supplied a hit, asked after ``lookup`` returned ``HIT``."""
        return CacheHitSource.EXTERNAL_UNSPECIFIED

    @abstractmethod
    def prepare_load(self, keys: Collection[OffloadKey], req_context: ReqContext) -> LoadStoreSpec:
        """Prepare blocks to be read; they cannot be evicted until ``complete_load``.

        Every key must be offloaded and ready.

        Args:
            keys: the keys identifying the blocks.
            req_context: per-request context.

        Returns:
            Where a worker finds the blocks' data, in key order.
        """

    def touch(self, keys: Collection[OffloadKey], req_context: ReqContext) -> None:
        """Mark blocks as recently used (e.g. move them to the end of an LRU list).

        Args:
            keys: the keys identifying the blocks.
            req_context: per-request context.
        """
        return None

    def complete_load(self, keys: Collection[OffloadKey], req_context: ReqContext) -> None:
        """Mark blocks prepared by ``prepare_load`` as read, so they may be evicted again.

        Args:
            keys: the keys identifying the blocks.
            req_context: per-request context.
        """
        return None

    @abstractmethod
    def prepare_store(
        self, keys: Collection[OffloadKey], req_context: ReqContext
    ) -> PrepareStoreOutput | None:
        """Prepare blocks to be offloaded; they cannot be evicted until ``complete_store``.

        Args:
            keys: the keys identifying the blocks, in prefix order.
            req_context: per-request context.

        Returns:
            Which keys need storing, where to store them and which keys were
            evicted to make room; ``None`` if the blocks cannot be stored now.
        """

    def complete_store(
        self, keys: Collection[OffloadKey], req_context: ReqContext, success: bool = True
    ) -> None:
        """Mark blocks prepared by ``prepare_store`` as stored; they become loadable.

        Args:
            keys: the keys identifying the blocks.
            req_context: per-request context.
            success: whether the blocks were written; on ``False`` the blocks
                not stored yet are dropped.
        """
        return None

    @abstractmethod
    def on_new_request(self, req_context: ReqContext) -> RequestOffloadingContext:
        """A request was seen for the first time; say how to offload it.

        Args:
            req_context: per-request context.
        """

    def on_request_finished(self, req_context: ReqContext) -> None:
        """A request finished: no more prepare_* calls will come for it.

        Completions of transfers already submitted for it may still arrive.

        Args:
            req_context: per-request context.
        """
        return None

    def take_events(self) -> Iterable[OffloadingEvent]:
        """Yield the events collected since the previous call."""
        return ()

    def on_schedule_end(self, context: ScheduleEndContext) -> None:
        """Called once at the end of every scheduler step."""
        return None

    def has_pending_work(self) -> bool:
        """Whether the engine should keep stepping for this manager's sake."""
        return False

    def reset_cache(self) -> None:
        """Drop every tracked block and start over."""
        return None

    def on_reset_flushed(self) -> None:
        """Called once the transfers in flight at a reset have been flushed."""
        return None

    def get_stats(self) -> OffloadingConnectorStats | None:
        """Metrics collected since the previous call, or ``None`` if there are none."""
        return None

    def config_info(self) -> list[dict[str, Any]]:
        """Per-tier configuration labels for the metrics (one dict per tier)."""
        return [{}]

    def shutdown(self) -> None:
        """Release the manager's resources."""
        return None


class OffloadingSpec(ABC):
    """One offloading tier's factory: its scheduler-side manager and its worker.

    Built from a :class:`~kvcy.kv_offload.config.OffloadingConfig` (any object with
    its ``extra_config``, ``enable_kv_cache_events``, ``groups`` and ``cache`` serves),
    whose values it keeps: ``config``, ``extra_config``, ``kv_events_config``,
    ``offload_prompt_only`` (``extra_config["offload_prompt_only"]``, default on),
    ``tokens_per_block`` (one per group), ``tokens_per_hash``, ``blocks_per_chunk`` and
    ``replicated_layout`` (``False``).
    """

    @classmethod
    def build_metric_definitions(cls, extra_config: dict[str, Any]) -> dict[str, OffloadingMetricMetadata]:
        """The Prometheus metrics this spec's tier reports, by name (none by default)."""
        return {}

    @classmethod
    def config_info_keys(cls, extra_config: dict[str, Any]) -> tuple[str, ...]:
        """The info-metric label names this spec's managers fill (none by default)."""
        return ()

    def __init__(self, config: Any):
        self.config = config
        self.extra_config = config.extra_config
        self.replicated_layout: bool = False
        self.kv_events_config = OffloadingKVEventsConfig(
            enable_kv_cache_events=config.enable_kv_cache_events,
            self_describing_kv_events=bool(self.extra_config.get("self_describing_kv_events", False)),
        )
        self.offload_prompt_only: bool = bool(self.extra_config.get("offload_prompt_only", True))
        self.tokens_per_block = tuple(group.tokens_per_block for group in config.groups)
        self.tokens_per_hash = config.cache.tokens_per_hash
        self.blocks_per_chunk = config.cache.blocks_per_chunk

    @abstractmethod
    def get_manager(self) -> OffloadingManager:
        """The manager the scheduler-side connector uses to track blocks and evictions."""

    @abstractmethod
    def get_worker(self, kv_caches: Any) -> Any:
        """The ``OffloadingWorker`` that moves this tier's blocks.

        Args:
            kv_caches: the canonicalized KV caches (``CanonicalKVCaches``).
        """


# vLLM defines these here too; kvcy keeps them with torch, loaded on first use.
_LAZY = {
    "CanonicalKVCacheRef": "kvcy.kv_offload.canonical",
    "CanonicalKVCacheTensor": "kvcy.kv_offload.canonical",
    "CanonicalKVCaches": "kvcy.kv_offload.canonical",
    "OffloadingWorker": "kvcy.kv_offload.worker",
    "TransferResult": "kvcy.kv_offload.worker",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(module), name)
