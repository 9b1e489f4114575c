"""Prefix-cache statistics and the rolling hit-rate metric."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

__all__ = ["CachingMetrics", "PrefixCacheStats", "PrefixCachingMetrics"]


@dataclass
class PrefixCacheStats:
    """Prefix-cache lookups since the stats were last taken.

    ``requests`` / ``queries`` (tokens looked up) / ``hits`` (tokens found)
    count requests seen for the first time; the ``preempted_*`` fields count
    lookups of requests that were preempted before.  ``reset`` is set when the
    prefix cache was reset in the interval.
    """

    reset: bool = False
    requests: int = 0
    queries: int = 0
    hits: int = 0
    preempted_requests: int = 0
    preempted_queries: int = 0
    preempted_hits: int = 0

    def record(self, num_tokens: int, num_hits: int, preempted: bool) -> None:
        """Count one lookup of ``num_tokens`` tokens of which ``num_hits`` hit."""
        if preempted:
            self.preempted_requests += 1
            self.preempted_queries += num_tokens
            self.preempted_hits += num_hits
        else:
            self.requests += 1
            self.queries += num_tokens
            self.hits += num_hits


class CachingMetrics:
    """Hit rate over the most recent ``max_recent_requests`` requests.

    Stats are aggregated per ``observe`` call; whole intervals are dropped from
    the front once more than ``max_recent_requests`` requests are held.  A
    ``reset`` in the observed stats clears the window.
    """

    def __init__(self, max_recent_requests: int = 1000) -> None:
        if max_recent_requests <= 0:
            raise ValueError(f"max_recent_requests must be positive, got {max_recent_requests}")
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


#: The name seed 002 uses.
PrefixCachingMetrics = CachingMetrics
