"""Block residency metrics: how long sampled KV-cache blocks live, sit idle and wait between uses.

vLLM 0.33.0's ``vllm.v1.core.kv_cache_metrics``, under its names:

* ``KVCacheMetricsCollector``: picks a random fraction (``sample_rate``) of the
  blocks the pool hands out and follows each until it is evicted, when it
  records a :class:`~kvcy.metrics.KVCacheEvictionEvent`.  ``BlockPool`` (both
  twins) calls its hooks where vLLM's pool does: ``on_block_allocated`` for each
  block ``get_new_blocks`` hands out, ``on_block_accessed`` for each block
  ``touch`` takes a reference on (a prefix-cache hit), ``on_block_evicted``
  before a block is reused while prefix caching is on (``get_new_blocks``) and
  for each block ``evict_blocks`` names, ``reset`` from ``reset_prefix_cache``.
  The pool passes its blocks; only ``block_id`` is read.
* ``BlockMetricsState``: one sampled block's allocation time, last access and
  last few access times.

Pure Python: the pool calls nothing when it has no collector, and vLLM samples
1 % of the blocks by default.  Sampling draws from the :mod:`random` module's
shared generator (``random.random()``) and times come from
``time.monotonic_ns()``, as in vLLM, so seeding :mod:`random` reproduces
vLLM's choices.
"""

from __future__ import annotations

import random
import time
from collections import deque
from typing import TYPE_CHECKING

from kvcy.metrics import KVCacheEvictionEvent

if TYPE_CHECKING:
    from kvcy.kv_cache_utils import KVCacheBlock

__all__ = ["BlockMetricsState", "KVCacheEvictionEvent", "KVCacheMetricsCollector"]

#: Access times a BlockMetricsState keeps (the newest ones), so a hot block's
#: history stays bounded.
ACCESS_HISTORY_LEN = 4

_NS_PER_S = 1e9


class BlockMetricsState:
    """The life so far of one sampled block, in ``time.monotonic_ns()`` readings.

    ``birth_time_ns`` is when it was allocated, ``last_access_ns`` when it was
    last allocated or hit, and ``access_history`` the times of its last
    ``ACCESS_HISTORY_LEN`` hits (the allocation is not one of them).
    """

    __slots__ = ("birth_time_ns", "last_access_ns", "access_history")

    def __init__(self) -> None:
        now_ns = time.monotonic_ns()
        self.birth_time_ns = now_ns
        self.last_access_ns = now_ns
        self.access_history: deque[int] = deque(maxlen=ACCESS_HISTORY_LEN)

    def record_access(self) -> None:
        """Note a hit on the block, now."""
        now_ns = time.monotonic_ns()
        self.last_access_ns = now_ns
        self.access_history.append(now_ns)

    def get_lifetime_seconds(self) -> float:
        """Seconds since the block was allocated."""
        return (time.monotonic_ns() - self.birth_time_ns) / _NS_PER_S

    def get_idle_time_seconds(self) -> float:
        """Seconds since the block was last allocated or hit."""
        return (time.monotonic_ns() - self.last_access_ns) / _NS_PER_S

    def get_reuse_gaps_seconds(self) -> list[float]:
        """Seconds between consecutive recorded hits, oldest first (empty below two hits)."""
        history = list(self.access_history)
        return [(later - earlier) / _NS_PER_S for earlier, later in zip(history, history[1:])]


class KVCacheMetricsCollector:
    """Samples blocks as the pool allocates them and records their residency when evicted.

    Each allocation is sampled with probability ``sample_rate`` (a fresh
    ``random.random()`` draw per block); a sampled block is followed in
    ``block_metrics`` (block id -> :class:`BlockMetricsState`) until its
    eviction appends a :class:`~kvcy.metrics.KVCacheEvictionEvent` (lifetime,
    idle time, reuse gaps) to the events ``drain_events`` hands out.  Sampling
    the same block id again starts its record afresh.

    Args:
        sample_rate: the fraction of allocations followed, in (0, 1].

    Raises:
        AssertionError: ``sample_rate`` is outside (0, 1] (as vLLM asserts).
    """

    def __init__(self, sample_rate: float = 0.01) -> None:
        # (vLLM asserts this; raised outright here so that ``python -O`` keeps the check.
        # Comparing a non-number raises the comparison's TypeError, as there.)
        if not 0 < sample_rate <= 1.0:
            raise AssertionError(f"sample_rate must be in (0, 1.0], got {sample_rate}")
        self.sample_rate = sample_rate
        self.block_metrics: dict[int, BlockMetricsState] = {}
        self._eviction_events: list[KVCacheEvictionEvent] = []

    def should_sample_block(self) -> bool:
        """Whether to follow the block being allocated (one ``random.random()`` draw)."""
        return random.random() < self.sample_rate

    def on_block_allocated(self, block: KVCacheBlock) -> None:
        """The pool handed ``block`` out: start following it if it is sampled."""
        if self.should_sample_block():
            self.block_metrics[block.block_id] = BlockMetricsState()

    def on_block_accessed(self, block: KVCacheBlock) -> None:
        """A request took a reference on ``block`` (a prefix-cache hit): note it if followed."""
        state = self.block_metrics.get(block.block_id)
        if state is not None:
            state.record_access()

    def on_block_evicted(self, block: KVCacheBlock) -> None:
        """``block`` leaves the cache: stop following it and record its residency."""
        state = self.block_metrics.pop(block.block_id, None)
        if state is None:
            return
        lifetime = state.get_lifetime_seconds()
        idle = state.get_idle_time_seconds()
        self._eviction_events.append(
            KVCacheEvictionEvent(
                lifetime_seconds=lifetime,
                idle_seconds=idle,
                reuse_gaps_seconds=tuple(state.get_reuse_gaps_seconds()),
            )
        )

    def reset(self) -> None:
        """Forget every followed block and every undrained event (the prefix cache was reset)."""
        self.block_metrics.clear()
        self._eviction_events.clear()

    def drain_events(self) -> list[KVCacheEvictionEvent]:
        """The eviction events recorded since the last drain, oldest first."""
        events = self._eviction_events
        self._eviction_events = []
        return events
