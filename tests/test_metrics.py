"""``kvcy.metrics``: the prefix-cache hit-rate window and the stats it observes.
"""

from __future__ import annotations

import logging

from kvcy.metrics import CacheHitSource, PrefixCacheStats


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


def test_prefix_cache_stats_hits_by_source(caplog):
    stats = PrefixCacheStats()
    stats.record(100, 48, False, hits_by_source={CacheHitSource.DEVICE: 32, CacheHitSource.HOST: 16})
    stats.record(10, 0, False, hits_by_source={CacheHitSource.DISK: 0})
    stats.record(50, 50, True, hits_by_source={CacheHitSource.DEVICE: 50})
    assert stats.hits_by_source == {CacheHitSource.DEVICE: 32, CacheHitSource.HOST: 16}
    assert (stats.requests, stats.queries, stats.hits, stats.preempted_hits) == (2, 110, 48, 50)
    with caplog.at_level(logging.WARNING):
        stats.record(20, 8, False, hits_by_source={CacheHitSource.P2P: 3})
    assert stats.hits_by_source[CacheHitSource.EXTERNAL_UNSPECIFIED] == 8
    assert CacheHitSource.P2P not in stats.hits_by_source
    assert "EXTERNAL_UNSPECIFIED" in caplog.text.upper()
    assert CacheHitSource.outermost([CacheHitSource.HOST, CacheHitSource.DEVICE]) is CacheHitSource.HOST
