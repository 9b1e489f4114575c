"""KV events over ZeroMQ against live vLLM 0.33.0 (issue 20): kvcy's batches decode with vLLM's
own event types (byte for byte), and vLLM's own ``ZmqEventPublisher`` feeds kvcy's subscriber,
replay protocol included.

Runs only where vLLM 0.33.0 imports (``.ci/run``'s vLLM step; ``KVCY_REQUIRE_VLLM=1`` makes a
missing vLLM an error).  Loopback ipc sockets, bounded waits.
"""

from __future__ import annotations

import os
import time

import msgspec
import pytest

os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

if os.environ.get("KVCY_REQUIRE_VLLM") == "1":
    import vllm

    assert vllm.__version__ == "0.33.0", f"KVCY_REQUIRE_VLLM=1 but vLLM is {vllm.__version__}"
else:
    vllm = pytest.importorskip("vllm", reason="vLLM is not installed (see .ci/run for the vLLM step)")
    if vllm.__version__ != "0.33.0":
        pytest.skip(f"kvcy.kv_events targets vLLM 0.33.0, found {vllm.__version__}", allow_module_level=True)

from test_kv_events_zmq import (  # noqa: E402
    RecordingIndex,
    cleanup,  # noqa: F401  (fixture)
    ipc,  # noqa: F401  (fixture)
    first_message,
    publisher,
    raw_sub,
    subscriber,
    wait_until,
)
from vllm.distributed import kv_events as vk  # noqa: E402

from kvcy import kv_events as kk  # noqa: E402
from kvcy.kv_index import KVIndex  # noqa: E402

BS = 4


def kvcy_batch(i: int) -> kk.KVEventBatch:
    return kk.KVEventBatch(ts=100.0 + i, events=[
        kk.BlockStored(block_hashes=[i, 2**63 + i], parent_block_hash=7, token_ids=list(range(2 * BS)),
                       block_size=BS, lora_id=None, medium="GPU", lora_name="ad", extra_keys=[("s",), None],
                       group_idx=1, kv_cache_spec_kind="full_attention", session_id="sess",
                       lookahead_token_ids=[[1], [2]]),
        kk.BlockRemoved(block_hashes=[b"\x00" * 8], medium="CPU", locality="LOCAL"),
        kk.AllBlocksCleared(),
    ])


def as_vllm(batch: kk.KVEventBatch) -> vk.KVEventBatch:
    """The same batch built from vLLM's own structs."""
    events = []
    for event in batch.events:
        cls = getattr(vk, type(event).__name__)
        events.append(cls(**{f: getattr(event, f) for f in event.__struct_fields__}))
    return vk.KVEventBatch(ts=batch.ts, events=events, data_parallel_rank=batch.data_parallel_rank)


def test_kvcy_batches_decode_with_vllms_event_types(ipc):
    pub = kk.ZmqEventPublisher(0, ipc(), topic="kv")
    sock = raw_sub(pub.endpoint)
    try:
        topic, seq, payload = first_message(pub, sock, kvcy_batch)
    finally:
        sock.close()
        pub.shutdown()
    n = int.from_bytes(seq, "big")
    assert topic == b"kv"
    got = msgspec.msgpack.Decoder(vk.KVEventBatch).decode(payload)
    sent = kvcy_batch(n)
    sent.data_parallel_rank = 0
    assert got == as_vllm(sent)
    assert [type(e) for e in got.events] == [vk.BlockStored, vk.BlockRemoved, vk.AllBlocksCleared]
    # Byte for byte what vLLM's publisher would put on the wire for the same batch.
    assert payload == msgspec.msgpack.Encoder().encode(as_vllm(sent))


def test_vllm_publisher_feeds_kvcy_subscriber(ipc, cleanup):  # noqa: F811
    """vLLM's own publisher: the subscriber joins late (replay from vLLM's ROUTER), then follows
    the live stream; the index ends with everything vLLM published."""
    endpoint, replay = ipc(), ipc()
    pub = vk.ZmqEventPublisher(data_parallel_rank=0, endpoint=endpoint, replay_endpoint=replay, buffer_steps=100)
    try:
        def batch(i):
            return vk.KVEventBatch(ts=time.time(), events=[
                vk.BlockStored(block_hashes=[i], parent_block_hash=None, token_ids=list(range(BS)), block_size=BS,
                               lora_id=None, medium="GPU", lora_name=None),
            ])

        for i in range(3):
            pub.publish(batch(i))
        index = RecordingIndex(KVIndex())
        sub = subscriber(cleanup, index, {"vllm": (endpoint, replay)})
        wait_until(lambda: sub.states["vllm"].last_seq == 2, "vLLM's replay", step=sub.sync)
        assert index.blocks["vllm"] == {0, 1, 2}
        sent = 3
        while sub.states["vllm"].last_seq < sent - 1 or sent < 10:
            assert sent < 200, "the live stream never caught up"
            pub.publish(batch(sent))
            sent += 1
            sub.poll(0.02)
        wait_until(lambda: sub.states["vllm"].last_seq == sent - 1, "the live stream", step=lambda: sub.poll(0.02))
        state = sub.states["vllm"]
        assert state.lost == 0 and state.malformed == 0 and state.replayed >= 3
        assert index.blocks["vllm"] == set(range(sent))
        index.check()  # the real index holds the same
        assert index.kv.longest_prefix([0, 1])["vllm"] == 2
    finally:
        pub.shutdown()


def test_kvcy_publisher_serves_a_vllm_style_replay_client(ipc, cleanup):  # noqa: F811
    """kvcy's replay socket answers the REQ-socket client vLLM's protocol allows: the first
    buffered batch comes back to it (a REQ socket takes one reply per request)."""
    import zmq

    pub = publisher(cleanup, 0, ipc(), ipc())
    pub.publish(kvcy_batch(0))
    wait_until(lambda: pub.sent_batches == 1, "the batch")
    req = zmq.Context.instance().socket(zmq.REQ)
    req.setsockopt(zmq.LINGER, 0)
    req.connect(pub.replay_endpoint)
    try:
        req.send((0).to_bytes(8, "big"))
        assert req.poll(5000)
        topic, seq, payload = req.recv_multipart()
    finally:
        req.close()
    assert (topic, int.from_bytes(seq, "big")) == (b"", 0)
    assert msgspec.msgpack.Decoder(vk.KVEventBatch).decode(payload).ts == 100.0
