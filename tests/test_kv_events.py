"""``kvcy.kv_events``: the event types and names vLLM 0.33.0's KV events carry (the ZeroMQ
publisher and subscriber: tests/test_kv_events_zmq.py).
"""

from __future__ import annotations

import msgspec

from kvcy.kv_events import BlockRemoved, BlockStored, KVEventBatch


def test_event_media_names_as_vllm():
    """``kv_events`` names the three storage media vLLM 0.33.0's events carry."""
    from kvcy import kv_events

    assert (kv_events.MEDIUM_GPU, kv_events.MEDIUM_CPU, kv_events.MEDIUM_STORAGE) == ("GPU", "CPU", "STORAGE")
    assert {"MEDIUM_GPU", "MEDIUM_CPU", "MEDIUM_STORAGE"} <= set(kv_events.__all__)


# --------------------------------------------------------------------------- events and stats
def test_block_stored_fields_and_encoding():
    """vLLM's field order, ``session_id``, per-block lookahead lists, and its wire form:
    the batch array-like, each event a map tagged by class name."""
    names = list(BlockStored.__struct_fields__)
    assert names[-2:] == ["session_id", "lookahead_token_ids"]
    ev = BlockStored(block_hashes=[1], parent_block_hash=None, token_ids=[1, 2], block_size=2,
                     lora_id=None, medium="GPU", lora_name=None, session_id="s1",
                     lookahead_token_ids=[[3, 4]])
    raw = msgspec.msgpack.encode(KVEventBatch(ts=1.0, events=[ev, BlockRemoved(block_hashes=[1], medium="GPU")]))
    decoded = msgspec.msgpack.decode(raw)
    assert isinstance(decoded, list) and decoded[0] == 1.0
    assert decoded[1][0]["type"] == "BlockStored" and decoded[1][0]["session_id"] == "s1"
    assert decoded[1][0]["lookahead_token_ids"] == [[3, 4]]
    assert decoded[1][1] == {"type": "BlockRemoved", "block_hashes": [1], "medium": "GPU"}
    assert msgspec.msgpack.decode(raw, type=KVEventBatch).events[0] == ev
    assert len({ev, BlockStored(**{f: getattr(ev, f) for f in names})}) == 1
