"""``kvcy.metrics``: the prefix-cache hit-rate window and the stats it observes.
"""

from __future__ import annotations


# ------------------------------------------------------------------ CachingMetrics
def test_caching_metrics_with_an_empty_window_keeps_the_latest_interval():
    """vLLM takes ``max_recent_requests=0``: the window keeps only the latest observed
    interval (it never drops the last one).  kvcy refused it with ValueError."""
    from kvcy.metrics import CachingMetrics, PrefixCacheStats

    metrics = CachingMetrics(max_recent_requests=0)
    seen = []
    for requests, queries, hits in ((1, 10, 5), (2, 20, 0), (1, 8, 8)):
        metrics.observe(PrefixCacheStats(requests=requests, queries=queries, hits=hits))
        seen.append((metrics.hit_rate, metrics.aggregated_requests, len(metrics.query_queue)))
    assert seen == [(0.5, 1, 1), (0.0, 2, 1), (1.0, 1, 1)]  # (recorded from vLLM 0.33.0)
