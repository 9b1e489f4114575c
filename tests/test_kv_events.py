"""``kvcy.kv_events``: the event types and names vLLM 0.33.0's KV events carry (the ZeroMQ
publisher and subscriber: tests/test_kv_events_zmq.py).
"""

from __future__ import annotations


def test_event_media_names_as_vllm():
    """``kv_events`` names the three storage media vLLM 0.33.0's events carry."""
    from kvcy import kv_events

    assert (kv_events.MEDIUM_GPU, kv_events.MEDIUM_CPU, kv_events.MEDIUM_STORAGE) == ("GPU", "CPU", "STORAGE")
    assert {"MEDIUM_GPU", "MEDIUM_CPU", "MEDIUM_STORAGE"} <= set(kv_events.__all__)
