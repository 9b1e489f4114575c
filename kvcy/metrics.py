"""Prefix-cache statistics, the rolling hit-rate metric and block eviction samples."""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from enum import Enum

__all__ = ["CacheHitSource", "CachingMetrics", "KVCacheEvictionEvent", "PrefixCacheStats", "PrefixCachingMetrics"]

logger = logging.getLogger(__name__)


class CacheHitSource(str, Enum):
    """The tier that supplied cached prompt tokens, nearest the accelerator first."""

    DEVICE = "device"
    HOST = "host"
    P2P = "p2p"
    DISK = "disk"
    # An uninstrumented connector or remote store; last, so that mixing it
    # with a known tier reports this one.
    EXTERNAL_UNSPECIFIED = "external_unspecified"

    @classmethod
    def outermost(cls, sources: Iterable[CacheHitSource]) -> CacheHitSource:
        """The tier in ``sources`` farthest from the accelerator."""
        order = list(cls)
        return max(sources, key=order.index)


@dataclass
class PrefixCacheStats:
    """Prefix-cache lookups since the stats were last taken.

    ``requests`` / ``queries`` (tokens looked up) / ``hits`` (tokens found)
    count requests seen for the first time; the ``preempted_*`` fields count
    lookups of requests that were preempted before.  ``reset`` is set when the
    prefix cache was reset in the interval.  ``hits_by_source`` splits the
    hits of new requests by the tier that supplied them, when the caller
    knows it (connector stats); it holds non-zero counts only.
    """

    reset: bool = False
    requests: int = 0
    queries: int = 0
    hits: int = 0
    preempted_requests: int = 0
    preempted_queries: int = 0
    preempted_hits: int = 0
    hits_by_source: dict[CacheHitSource, int] = field(default_factory=dict)

    def record(
        self,
        num_tokens: int,
        num_hits: int,
        preempted: bool,
        hits_by_source: dict[CacheHitSource, int] | None = None,
    ) -> None:
        """Count one lookup of ``num_tokens`` tokens of which ``num_hits`` hit.

        ``hits_by_source`` (new requests only) must add up to ``num_hits``;
        when it does not, all the hits are counted as
        ``EXTERNAL_UNSPECIFIED`` and a warning is logged, as vLLM does.
        """
        if preempted:
            self.preempted_requests += 1
            self.preempted_queries += num_tokens
            self.preempted_hits += num_hits
            return
        self.requests += 1
        self.queries += num_tokens
        self.hits += num_hits
        if hits_by_source is None:
            return
        if sum(hits_by_source.values()) != num_hits:
            logger.warning(
                "hits_by_source %s does not add up to the %d cached tokens; counting them as %s",
                hits_by_source,
                num_hits,
                CacheHitSource.EXTERNAL_UNSPECIFIED.value,
            )
            hits_by_source = {CacheHitSource.EXTERNAL_UNSPECIFIED: num_hits}
        for source, n in hits_by_source.items():
            if n:
                self.hits_by_source[source] = self.hits_by_source.get(source, 0) + n


class CachingMetrics:
    """Hit rate over the most recent ``max_recent_requests`` requests.

    Stats are aggregated per ``observe`` call; whole intervals are dropped from
    the front once more than ``max_recent_requests`` requests are held.  A
    ``reset`` in the observed stats clears the window.
    """

    def __init__(self, max_recent_requests: int = 1000) -> None:
        # (0 or less is vLLM's too: the window then keeps only the latest interval)
        self.max_recent_requests = max_recent_requests
        self.aggregated_requests = 0
        self.aggregated_query_total = 0
        self.aggregated_query_hit = 0
        self.query_queue: deque[tuple[int, int, int]] = deque()

    def observe(self, stats: PrefixCacheStats) -> None:
        if stats.reset:
            self.reset()
        if stats.requests == 0:
            return
        self.query_queue.append((stats.requests, stats.queries, stats.hits))
        self.aggregated_requests += stats.requests
        self.aggregated_query_total += stats.queries
        self.aggregated_query_hit += stats.hits
        while len(self.query_queue) > 1 and self.aggregated_requests > self.max_recent_requests:
            old_requests, old_queries, old_hits = self.query_queue.popleft()
            self.aggregated_requests -= old_requests
            self.aggregated_query_total -= old_queries
            self.aggregated_query_hit -= old_hits

    def reset(self) -> None:
        self.aggregated_requests = 0
        self.aggregated_query_total = 0
        self.aggregated_query_hit = 0
        self.query_queue.clear()

    @property
    def empty(self) -> bool:
        return self.aggregated_requests == 0

    @property
    def hit_rate(self) -> float:
        """Hit tokens / queried tokens over the window (0.0 when empty)."""
        if self.aggregated_query_total == 0:
            return 0.0
        return self.aggregated_query_hit / self.aggregated_query_total


@dataclass
class KVCacheEvictionEvent:
    """The residency of one sampled block, recorded when it was evicted.

    ``lifetime_seconds``: from its allocation to its eviction;
    ``idle_seconds``: from its last allocation or hit to its eviction;
    ``reuse_gaps_seconds``: between its last few consecutive hits, oldest first.
    Made by :class:`kvcy.kv_cache_metrics.KVCacheMetricsCollector` (vLLM 0.33.0's
    ``vllm.v1.metrics.stats.KVCacheEvictionEvent``).
    """

    lifetime_seconds: float
    idle_seconds: float
    reuse_gaps_seconds: tuple[float, ...]


#: An alias kept for callers that import ``CachingMetrics`` by its older vLLM name.
PrefixCachingMetrics = CachingMetrics
