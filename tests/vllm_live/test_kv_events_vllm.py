"""KV events over ZeroMQ against live vLLM 0.33.0.

- The API, name for name: every public name of ``vllm.distributed.kv_events`` and
  ``vllm.config.kv_events`` in ``kvcy.kv_events`` (struct fields, defaults and settings, method
  signatures, class constants), configs and factories across the libraries,
  ``offset_endpoint_port`` and ``KVEventAggregator`` call for call.
- The wire, frame for frame: kvcy's batches decode with vLLM's types; the live PUB frames and
  the replay answers of both publishers are equal byte for byte (old starts, odd starts, wrong
  shapes, no buffer); a KVCacheManager's events from both libraries encode alike.
- vLLM's publisher feeding kvcy's subscriber and index through the faults: late join past its
  buffer, high-water-mark drops, restart, silence; kvcy's publisher behind vLLM's factory.

Runs only where vLLM 0.33.0 imports (``.ci/run``'s vLLM step; ``KVCY_REQUIRE_VLLM=1`` makes a
missing vLLM an error).  Loopback ipc and inproc sockets, bounded waits.
"""

from __future__ import annotations

import inspect
import os
import time
from abc import ABC

import msgspec
import pytest

os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import vllm  # noqa: E402

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


# --------------------------------------------------------------------------- the API, name for name
def _vllm_public(module) -> dict:
    """The names a vLLM user reaches in ``module``: what it defines, and its str constants."""
    return {name: obj for name, obj in vars(module).items()
            if not name.startswith("_") and (getattr(obj, "__module__", None) == module.__name__
                                             or isinstance(obj, str))}


def struct_config(cls) -> dict:
    """A struct class's msgspec settings (array_like, tag, omit_defaults, gc, ...)."""
    config = cls.__struct_config__
    return {a: getattr(config, a) for a in dir(config) if not a.startswith("_")}


def test_every_public_name_of_vllms_kv_events_is_kvcys():
    from vllm.config import kv_events as vc

    wanted = {**_vllm_public(vk), **_vllm_public(vc)}
    assert {"ZmqEventPublisher", "KVEventAggregator", "MEDIUM_STORAGE", "KVEventsConfig"} <= set(wanted)
    missing = sorted(set(wanted) - set(dir(kk)))
    assert missing == []
    for name, theirs in wanted.items():
        ours = getattr(kk, name)
        if isinstance(theirs, str):
            assert ours == theirs, name
            continue
        if issubclass(theirs, msgspec.Struct):
            assert ours.__struct_fields__ == theirs.__struct_fields__, name
            assert ours.__struct_defaults__ == theirs.__struct_defaults__, name
            assert struct_config(ours) == struct_config(theirs), name
            assert [c.__name__ for c in ours.__mro__] == [c.__name__ for c in theirs.__mro__], name
        methods = {m for m in dir(theirs) if not m.startswith("_") and callable(getattr(theirs, m))}
        for m in sorted(methods):
            assert callable(getattr(ours, m, None)), f"{name}.{m}"
            want = inspect.signature(getattr(theirs, m)).parameters
            got = inspect.signature(getattr(ours, m)).parameters
            # kvcy may add keyword-only or defaulted parameters after vLLM's; vLLM's come first,
            # with vLLM's names, kinds and defaults.
            assert list(got)[:len(want)] == list(want), f"{name}.{m}"
            for p in want.values():
                assert (got[p.name].kind, got[p.name].default) == (p.kind, p.default), f"{name}.{m}({p.name})"
        for attr in ("SHUTDOWN_TIMEOUT", "END_SEQ"):
            if hasattr(theirs, attr):
                assert getattr(ours, attr) == getattr(theirs, attr), f"{name}.{attr}"
        if isinstance(theirs, type) and not issubclass(theirs, msgspec.Struct):
            mine, vllms = inspect.signature(ours).parameters, inspect.signature(theirs).parameters
            assert list(mine)[:len(vllms)] == list(vllms), name
            for p in vllms.values():
                if p.default is not inspect.Parameter.empty:
                    assert mine[p.name].default == p.default, f"{name}({p.name})"


def test_configs_and_factories_interchange():
    """The same settings make equal configs; each library's factory takes the other's config;
    the kinds vLLM's config refuses, kvcy's refuses, with a ``ValueError`` both."""
    from dataclasses import asdict

    from vllm.config.kv_events import KVEventsConfig as VConfig

    for kw in ({}, {"enable_kv_cache_events": True}, {"enable_kv_cache_events": True, "publisher": "null"},
               {"publisher": "zmq", "topic": "kv", "buffer_steps": 0, "hwm": 0, "max_queue_size": 0},
               {"endpoint": "", "replay_endpoint": "", "buffer_steps": -1, "hwm": -5, "max_queue_size": -1}):
        assert asdict(kk.KVEventsConfig(**kw)) == asdict(VConfig(**kw)), kw
    for kind in ("kafka", "ZMQ", 3):
        with pytest.raises(ValueError) as theirs:
            VConfig(publisher=kind)
        with pytest.raises(ValueError) as mine:
            kk.KVEventsConfig(publisher=kind)
        # vLLM's own tests match "Input should be": kvcy says what pydantic says, less its link.
        assert str(theirs.value).startswith(str(mine.value)), kind
    assert type(kk.EventPublisherFactory.create(VConfig())) is kk.NullEventPublisher
    assert type(vk.EventPublisherFactory.create(kk.KVEventsConfig())) is vk.NullEventPublisher


@pytest.mark.parametrize("endpoint", ["tcp://*:5557", "tcp://host:6000", "tcp://*:0", "tcp://[::1]:7000",
                                      "inproc://cache", "ipc:///tmp/x", "tcp://localhost", "tcp://*:*", "",
                                      None, "udp://x:5"])
@pytest.mark.parametrize("rank", [0, 1, 3])
def test_offset_endpoint_port_is_vllms(endpoint, rank):
    def outcome(f):
        try:
            return f(endpoint, rank)
        except ValueError:
            return ValueError

    assert outcome(kk.ZmqEventPublisher.offset_endpoint_port) == outcome(vk.ZmqEventPublisher.offset_endpoint_port)


def test_kv_event_aggregator_is_vllms():
    """The same calls on both aggregators, with equal events (kvcy's and vLLM's structs), give
    equal answers, messages of refusals included."""
    import random

    rng = random.Random(20)
    pool = [kvcy_batch(i).events for i in range(3)]
    pool = [e for events in pool for e in events] + [kk.BlockRemoved(block_hashes=[9], medium="GPU", group_idx=1)]
    mine, theirs = kk.KVEventAggregator(2), vk.KVEventAggregator(2)

    def same(call, *args):
        out = []
        for agg, conv in ((mine, lambda e: e), (theirs, vllm_event)):
            try:
                got = getattr(agg, call)(*[[conv(e) for e in a] if isinstance(a, list) else a for a in args])
            except (TypeError, ValueError) as exc:
                got = (type(exc), str(exc))
            if isinstance(got, list):
                got = [msgspec.msgpack.encode(e) for e in got]
            out.append(got)
        assert out[0] == out[1], (call, args)

    for _ in range(300):
        call = rng.choice(["add", "add", "add", "common", "all", "clear", "inc", "reset", "n", "bad"])
        if call == "add":
            same("add_events", rng.sample(pool, rng.randint(0, 4)))
        elif call == "common":
            same("get_common_events")
        elif call == "all":
            same("get_all_events")
        elif call == "clear":
            same("clear_events")
        elif call == "inc":
            same("increment_workers", rng.choice([1, 2, 0, -1]))
        elif call == "reset":
            same("reset_workers")
        elif call == "n":
            same("get_number_of_workers")
        else:
            same("add_events", tuple(pool[:1]))
        assert repr(mine) == repr(theirs)
    for n in (0, -2):
        with pytest.raises(ValueError, match="num_workers must be greater than zero."):
            kk.KVEventAggregator(n)
    assert issubclass(kk.KVConnectorKVEvents, ABC) and kk.KVConnectorKVEvents.__abstractmethods__ == \
        vk.KVConnectorKVEvents.__abstractmethods__


def vllm_event(event):
    cls = getattr(vk, type(event).__name__)
    return cls(**{f: getattr(event, f) for f in event.__struct_fields__})


# --------------------------------------------------------------------------- the wire, frame for frame
def replay_answers(dealer, request: list[bytes], timeout: float = 5.0) -> list[list[bytes]]:
    """Send one replay request from a DEALER; every frame list up to the end marker."""
    dealer.send_multipart(request)
    answers = []
    while True:
        assert dealer.poll(int(timeout * 1000)), f"no end marker for {request}"
        frames = dealer.recv_multipart()
        answers.append(frames)
        if frames[2:3] == [kk.ZmqEventPublisher.END_SEQ]:
            return answers


def wait_replayable(replay_endpoint: str, seq: int) -> None:
    """Wait until a publisher's replay socket holds batch ``seq`` (its thread sent it)."""
    import zmq

    dealer = zmq.Context.instance().socket(zmq.DEALER)
    dealer.setsockopt(zmq.LINGER, 0)
    dealer.connect(replay_endpoint)
    try:
        wait_until(lambda: len(replay_answers(dealer, [b"", seq.to_bytes(8, "big")])) == 2, f"batch {seq}")
    finally:
        dealer.close()


@pytest.mark.parametrize("buffer_steps", [5, 0])
def test_replay_sockets_answer_alike_frame_for_frame(buffer_steps):
    """The same batches published by vLLM's publisher and by kvcy's (each with its own structs),
    then the same replay requests to both: the answers are equal byte for byte (topic, sequence
    numbers, payloads, end marker), a start older than the buffer and starts that are not 8
    bytes included; requests of the wrong shape get no answer from either."""
    import zmq

    stem = f"inproc://kvcy-vs-vllm-{time.monotonic_ns()}"
    pubs = [cls(data_parallel_rank=1, endpoint=f"{stem}-{i}", replay_endpoint=f"{stem}-{i}-replay",
                buffer_steps=buffer_steps, hwm=77, topic="kv-events")
            for i, cls in enumerate((vk.ZmqEventPublisher, kk.ZmqEventPublisher))]
    dealers = []
    try:
        for i in range(8):  # 8 batches, 5 kept: 0..2 have left the buffers
            batch = kvcy_batch(i)
            pubs[0].publish(as_vllm(batch))
            pubs[1].publish(batch)
        for i, pub in enumerate(pubs):  # both offset the endpoints by the rank
            config = pub.get_publisher_config()
            assert (config.endpoint, config.replay_endpoint) == (f"{stem}-{i}_dp1", f"{stem}-{i}-replay_dp1")
            dealer = zmq.Context.instance().socket(zmq.DEALER)
            dealer.setsockopt(zmq.LINGER, 0)
            dealer.connect(pub.get_publisher_config().replay_endpoint)
            dealers.append(dealer)
        # Both publishing threads are done once a request past the end gets only the marker
        # after all 8 batches went through: wait for the 8th to be replayable.
        # The sockets' options, as each publisher set them (high-water marks: the PUB's from hwm,
        # the replay ROUTER's room for a whole replay and its end marker).
        for option in (zmq.SNDHWM, zmq.RCVHWM):
            assert pubs[1]._pub.getsockopt(option) == pubs[0]._pub.getsockopt(option) == 77
            assert pubs[1]._replay.getsockopt(option) == pubs[0]._replay.getsockopt(option)
        for dealer in dealers:  # (with no buffer, every answer is the end marker alone, at any time)
            if buffer_steps:
                wait_until(lambda d=dealer: len(replay_answers(d, [b"", (7).to_bytes(8, "big")])) == 2, "8 batches")
        requests = [[b"", (s).to_bytes(8, "big")] for s in (0, 3, 5, 7, 8, 2**63)]
        requests += [[b"", b"\x04"], [b"", b"bad"], [b"", b""], [b"x", (6).to_bytes(8, "big")]]
        for request in requests:
            theirs, mine = (replay_answers(d, request) for d in dealers)
            assert mine == theirs, request
        seqs = [int.from_bytes(f[2], "big") for f in replay_answers(dealers[1], [b"", bytes(8)])[:-1]]
        assert seqs == ([3, 4, 5, 6, 7] if buffer_steps else [])
        if buffer_steps:
            decoded = msgspec.msgpack.Decoder(vk.KVEventBatch).decode(replay_answers(dealers[1], requests[1])[0][3])
            assert decoded.data_parallel_rank == 1 and decoded.ts == 103.0
        # Wrong shapes: no answer from either; the next good request is answered as ever.
        for dealer in dealers:
            dealer.send_multipart([b"", b"", bytes(8)])
            dealer.send(bytes(8))
        assert not any(d.poll(200) for d in dealers)
        theirs, mine = (replay_answers(d, [b"", (6).to_bytes(8, "big")]) for d in dealers)
        assert mine == theirs and len(mine) == (3 if buffer_steps else 1)
    finally:
        for dealer in dealers:
            dealer.close()
        for pub in pubs:
            pub.shutdown()


def test_live_frames_are_vllms_frame_for_frame(ipc):
    """The live PUB sockets: the same batches in the same order give the same three frames
    (topic, 8-byte big-endian sequence number, payload) from both publishers."""
    pubs = [cls(data_parallel_rank=0, endpoint=ipc(), topic="t") for cls in (vk.ZmqEventPublisher,
                                                                            kk.ZmqEventPublisher)]
    socks = [raw_sub(p.get_publisher_config().endpoint) for p in pubs]
    heard: list[dict[int, list[bytes]]] = [{}, {}]
    try:
        for i in range(400):
            batch = kvcy_batch(i)
            pubs[0].publish(as_vllm(batch))
            pubs[1].publish(batch)
            for sock, got in zip(socks, heard):
                while sock.poll(5 if i < 399 else 500):
                    frames = sock.recv_multipart()
                    got[int.from_bytes(frames[1], "big")] = frames
            if sum(1 for s in heard[0] if s in heard[1]) >= 20:
                break
        common = sorted(set(heard[0]) & set(heard[1]))
        assert len(common) >= 20, "the subscribers never heard both publishers"
        for seq in common:
            assert heard[1][seq] == heard[0][seq]
            assert heard[1][seq][1] == seq.to_bytes(8, "big") and heard[1][seq][0] == b"t"
    finally:
        for sock in socks:
            sock.close()
        for pub in pubs:
            pub.shutdown()


# --------------------------------------------------------------------------- vLLM's publisher, faults
def vllm_stored(i: int) -> vk.KVEventBatch:
    return vk.KVEventBatch(ts=time.time(), events=[
        vk.BlockStored(block_hashes=[i], parent_block_hash=None, token_ids=list(range(BS)), block_size=BS,
                       lora_id=None, medium="GPU", lora_name=None)])


def test_vllm_publisher_late_join_past_its_buffer_and_hwm_drops(cleanup):  # noqa: F811
    """kvcy's subscriber on vLLM's publisher: a late join asking for numbers older than vLLM's
    replay buffer (vLLM answers from its oldest; the rest are counted lost), then batches vLLM's
    PUB socket drops at its high-water mark (replayed from vLLM's buffer).  inproc: ZeroMQ's
    high-water marks bite there, with no kernel buffer in between."""
    stem = f"inproc://kvcy-vllm-faults-{time.monotonic_ns()}"
    endpoint, replay = stem, stem + "-replay"
    pub = vk.ZmqEventPublisher(data_parallel_rank=0, endpoint=endpoint, replay_endpoint=replay, buffer_steps=300,
                               hwm=1)
    index = RecordingIndex(KVIndex())
    try:
        for i in range(305):  # nobody listens yet: 0..4 leave vLLM's buffer of 300
            pub.publish(vllm_stored(i))
        wait_replayable(replay, 304)
        sub = subscriber(cleanup, index, {"vllm": (endpoint, replay)}, rcvhwm=1)
        assert sub.sync() == 300
        state = sub.states["vllm"]
        assert (state.last_seq, state.replayed, state.lost) == (304, 300, 5)
        assert index.blocks["vllm"] == set(range(5, 305))
        # A flood nobody reads: vLLM's PUB (hwm 1) and our SUB (rcvhwm 1) drop most of it.
        for i in range(305, 505):
            pub.publish(vllm_stored(i))
        wait_replayable(replay, 504)
        more = iter(range(10**6, 2 * 10**6))
        wait_until(lambda: (sub.states["vllm"].last_seq or 0) >= 504, "the flood",
                   step=lambda: (sub.poll(0.02), pub.publish(vllm_stored(next(more)))))
        state = sub.states["vllm"]
        assert state.gaps >= 1 and state.replayed >= 450 and state.lost == 5
        assert set(range(5, 505)) <= index.blocks["vllm"]
        index.check()
    finally:
        pub.shutdown()


def test_vllm_publisher_restart_is_forgotten_and_rebuilt(ipc, cleanup):  # noqa: F811
    """vLLM's publisher restarts on the same endpoints (its numbers start at 0 again): kvcy's
    subscriber forgets the instance and rebuilds it from the new stream only."""
    endpoint, replay = ipc(), ipc()
    index = RecordingIndex(KVIndex())
    sub = subscriber(cleanup, index, {"vllm": (endpoint, replay)})
    for generation, base in enumerate((0, 10**6)):
        pub = vk.ZmqEventPublisher(data_parallel_rank=0, endpoint=endpoint, replay_endpoint=replay)
        try:
            hashes = iter(range(base, base + 10**5))
            wait_until(lambda: sub.states["vllm"].restarts == generation and sub.states["vllm"].last_seq is not None,
                       f"publisher {generation}", step=lambda: (pub.publish(vllm_stored(next(hashes))), sub.poll(0.05)))
            sent = next(hashes) - base
            wait_until(lambda: sub.states["vllm"].last_seq == sent - 1, "its stream", step=lambda: sub.poll(0.02))
        finally:
            pub.shutdown()
        assert index.blocks["vllm"] == set(range(base, base + sent))
        assert index.removed == ["vllm"] * generation
    assert sub.states["vllm"].lost == 0
    index.check()


# --------------------------------------------------------------------------- a manager's events, end to end
def test_manager_events_on_the_wire_are_vllms(impl, cleanup):  # noqa: F811
    """vLLM's KVCacheManager publishing through vLLM's publisher, and kvcy's through kvcy's, for
    the same operations (a hybrid model: full attention and a sliding window; cache salt,
    session, the full report mode, evictions, a reset): the two streams are equal frame for
    frame, and kvcy's subscriber builds the same index from both."""
    from _vllm_diff import Config, Op, Pair, apply

    cfg = Config("events", (("FullAttentionSpec", dict(block_size=8)),
                            ("SlidingWindowSpec", dict(block_size=4, sliding_window=12))), num_blocks=24)
    pair = Pair(cfg, impl.kv_cache)
    stem = f"inproc://kvcy-mgr-events-{time.monotonic_ns()}"
    pubs = [vk.ZmqEventPublisher(data_parallel_rank=0, endpoint=stem + "-v", replay_endpoint=stem + "-vr",
                                 topic="kv"),
            kk.ZmqEventPublisher(0, stem + "-k", stem + "-kr", topic="kv")]
    for pub in pubs:
        cleanup(pub)
    index = RecordingIndex(KVIndex())
    sub = subscriber(cleanup, index, {"vllm": (stem + "-v", stem + "-vr"), "kvcy": (stem + "-k", stem + "-kr")})
    prompt = tuple(range(100, 140))
    ops = [
        Op("admit", "a", tokens=prompt, chunk=10_000, session="s1"),
        Op("step", "a", out_tokens=(5,)),
        Op("finish", "a"),
        Op("admit", "b", tokens=prompt[:24] + tuple(range(500, 520)), chunk=16, salt=None, report_full=True),
        Op("step", "b", chunk=16),
        Op("step", "b", chunk=100),
        Op("admit", "c", tokens=tuple(range(900, 980)), chunk=10_000, salt="salty"),
        Op("preempt", "b"),
        Op("evict", ids=(1, 2, 3, 9)),
        Op("finish", "c"),
        Op("admit", "b", chunk=10_000),
        Op("finish", "b"),
        Op("reset"),
        Op("admit", "d", tokens=prompt[:32] + (1, 2, 3), chunk=10_000, session="s2"),
        Op("finish", "d"),
    ]
    published = 0
    hashes: list[list] = []
    kinds: set[type] = set()
    for step, op in enumerate(ops):
        got = [apply(side, op) for side in (pair.vllm, pair.kvcy)]
        assert got[0] == got[1], op
        events_v, events_k = pair.vllm.mgr.take_events(), pair.kvcy.mgr.take_events()
        batch_v = vk.KVEventBatch(ts=float(step), events=events_v)
        batch_k = kk.KVEventBatch(ts=float(step), events=events_k)
        assert msgspec.msgpack.encode(batch_k) == msgspec.msgpack.encode(batch_v), op
        if events_v:  # the scheduler publishes a step's events when there are some
            pubs[0].publish(batch_v)
            pubs[1].publish(batch_k)
            published += 1
            hashes += [e.block_hashes for e in events_k if isinstance(e, kk.BlockStored)]
            kinds.update(map(type, events_k))
    # The scenario makes every kind of event (the eviction and the prefix-cache reset).
    assert kinds == {kk.BlockStored, kk.BlockRemoved, kk.AllBlocksCleared} and published >= 5
    wait_until(lambda: all(s.last_seq == published - 1 for s in sub.states.values()), "both streams",
               step=lambda: (sub.sync(), sub.poll(0.02)))
    assert all(s.lost == 0 and s.malformed == 0 for s in sub.states.values())
    assert index.blocks["vllm"] == index.blocks["kvcy"] and index.blocks["kvcy"]
    index.check()
    for chain in hashes:
        assert index.kv.longest_prefix(chain)["vllm"] == index.kv.longest_prefix(chain)["kvcy"]
    # The whole streams, as the replay sockets hold them: equal frame for frame.
    import zmq

    answers = []
    for replay in (stem + "-vr", stem + "-kr"):
        dealer = zmq.Context.instance().socket(zmq.DEALER)
        dealer.setsockopt(zmq.LINGER, 0)
        dealer.connect(replay)
        try:
            answers.append(replay_answers(dealer, [b"", bytes(8)]))
        finally:
            dealer.close()
    assert len(answers[0]) == published + 1 and answers[1] == answers[0]


def test_kvcy_publisher_stands_in_for_vllms_behind_vllms_factory(ipc):
    """Registered with vLLM's factory, kvcy's publisher takes what vLLM's scheduler hands a
    publisher (vLLM's own ``KVEventBatch``), stamps the rank and sends it as vLLM's would."""
    from vllm.config.kv_events import KVEventsConfig as VConfig

    name = f"kvcy-{time.monotonic_ns()}"
    vk.EventPublisherFactory.register_publisher(name, kk.ZmqEventPublisher)
    try:
        config = VConfig(enable_kv_cache_events=True, endpoint=ipc(), topic="kv")
        config.publisher = name  # (vLLM's config takes only its two kinds at construction)
        pub = vk.EventPublisherFactory.create(config, data_parallel_rank=0)
    finally:
        del vk.EventPublisherFactory._registry[name]
    assert type(pub) is kk.ZmqEventPublisher
    sock = raw_sub(pub.endpoint)
    try:
        _, seq, payload = first_message(pub, sock, lambda i: as_vllm(kvcy_batch(i)))
    finally:
        sock.close()
        pub.shutdown()
    sent = as_vllm(kvcy_batch(int.from_bytes(seq, "big")))
    sent.data_parallel_rank = 0
    assert payload == msgspec.msgpack.encode(sent)
    other = kk.ZmqEventPublisher(0, ipc())
    try:
        with pytest.raises(TypeError, match="events must be an EventBatch, got list"):
            other.publish([])
    finally:
        other.shutdown()


def test_kv_index_applies_batches_decoded_by_vllms_types(impl):
    """A router decoding vLLM's stream with vLLM's own types hands those batches to the index:
    they apply exactly as kvcy's decoding of the same bytes."""
    events = [vk.BlockStored(block_hashes=[1, 2, 3], parent_block_hash=None, token_ids=list(range(3 * BS)),
                             block_size=BS, lora_id=None, medium="GPU", lora_name=None, group_idx=0),
              vk.BlockStored(block_hashes=[b"\x09" * 8], parent_block_hash=3, token_ids=list(range(BS)),
                             block_size=BS, lora_id=None, medium="CPU", lora_name=None),
              vk.BlockRemoved(block_hashes=[2], medium="GPU"), vk.AllBlocksCleared(),
              vk.BlockStored(block_hashes=[4], parent_block_hash=None, token_ids=list(range(BS)), block_size=BS,
                             lora_id=None, medium="GPU", lora_name=None)]
    payloads = [msgspec.msgpack.encode(vk.KVEventBatch(ts=float(i), events=events[:i])) for i in range(6)]
    theirs, mine = impl.kv_index.KVIndex(), impl.kv_index.KVIndex()
    vdecoder, kdecoder = msgspec.msgpack.Decoder(vk.KVEventBatch), msgspec.msgpack.Decoder(kk.KVEventBatch)
    for payload in payloads:
        assert theirs.apply_batch("a", vdecoder.decode(payload)) == mine.apply_batch("a", kdecoder.decode(payload))
        assert theirs.stats == mine.stats and theirs.num_blocks("a") == mine.num_blocks("a")
        for chain in ([1, 2, 3], [4], [b"\x09" * 8]):
            assert theirs.longest_prefix(chain) == mine.longest_prefix(chain)
    assert theirs.longest_prefix([4]) == {"a": 1} and theirs.stats["all_blocks_cleared"] == 2


def test_manager_events_with_lora_images_salt_and_lookahead_are_vllms(impl):
    """The event fields the operation table of tests/_vllm_diff.py does not reach: a LoRA adapter
    (``lora_id``, ``lora_name``, the adapter's name first in ``extra_keys``), image items
    (``(identifier, offset)`` keys on the blocks they overlap), a cache salt and hash lookahead
    (``lookahead_token_ids``): the same requests on both managers give the same bytes."""
    from _vllm_diff import Config, Op, Pair, apply
    from vllm.lora.request import LoRARequest as VLoRA
    from vllm.multimodal.inputs import MultiModalFeatureSpec as VSpec
    from vllm.multimodal.inputs import PlaceholderRange as VRange
    from vllm.sampling_params import SamplingParams
    from vllm.utils.hashing import get_hash_fn_by_name as v_hash_fn
    from vllm.v1.core import kv_cache_utils as vku
    from vllm.v1.request import Request as VRequest

    from kvcy.hashing import get_hash_fn_by_name, get_request_block_hasher, init_none_hash
    from kvcy.request import LoRARequest, MultiModalFeatureSpec, PlaceholderRange

    lookahead = 2
    cfg = Config("lora-mm", (("FullAttentionSpec", dict(block_size=BS)),), num_blocks=40,
                 num_hash_lookahead_tokens=lookahead)
    pair = Pair(cfg, impl.kv_cache)
    v_sha, k_sha = v_hash_fn("sha256"), get_hash_fn_by_name("sha256")
    vku.init_none_hash(v_sha)
    init_none_hash(k_sha)
    v_hasher = vku.get_request_block_hasher(BS, v_sha, lookahead)
    k_hasher = get_request_block_hasher(BS, k_sha, lookahead)
    cases = [  # (request id, tokens, LoRA, images as (identifier, offset, length), salt, session)
        ("plain", list(range(100, 126)), None, [], None, None),
        ("lora", list(range(100, 126)), ("adapter-a", 3, "/a"), [], None, "s"),
        ("image", list(range(200, 230)), None, [("img-1", 2, 7), ("img-2", 12, 3)], "salt", None),
        ("both", list(range(200, 230)), ("adapter-b", 4, "/b"), [("img-1", 2, 7)], None, "t"),
        ("image-again", list(range(200, 230)), None, [("img-1", 2, 7), ("img-2", 12, 3)], "salt", None),
    ]
    kinds = set()
    for rid, tokens, lora, images, salt, session in cases:
        pair.vllm.reqs[rid] = VRequest(
            rid, tokens, SamplingParams(max_tokens=64), None, lora_request=VLoRA(*lora) if lora else None,
            mm_features=[VSpec(data=None, modality="image", identifier=i, mm_position=VRange(o, n))
                         for i, o, n in images] or None,
            cache_salt=salt, session_id=session, block_hasher=v_hasher)
        pair.kvcy.reqs[rid] = impl.kv_cache.Request(
            rid, tokens, lora_request=LoRARequest(*lora) if lora else None,
            mm_features=[MultiModalFeatureSpec(identifier=i, mm_position=PlaceholderRange(o, n))
                         for i, o, n in images] or None,
            cache_salt=salt, session_id=session, block_hasher=k_hasher)
        for op in (Op("admit", rid, chunk=10_000), Op("step", rid, out_tokens=(7,)), Op("finish", rid)):
            assert apply(pair.vllm, op) == apply(pair.kvcy, op), (rid, op)
            events_v, events_k = pair.vllm.mgr.take_events(), pair.kvcy.mgr.take_events()
            wire_v = msgspec.msgpack.encode(vk.KVEventBatch(ts=1.0, events=events_v))
            assert msgspec.msgpack.encode(kk.KVEventBatch(ts=1.0, events=events_k)) == wire_v, (rid, op)
            for event in events_k:
                if isinstance(event, kk.BlockStored):
                    kinds.update(f for f in ("lora_name", "extra_keys", "lookahead_token_ids", "session_id")
                                 if getattr(event, f) is not None)
                    kinds.update("image key" for keys in event.extra_keys or () for key in keys or ()
                                 if isinstance(key, tuple) and str(key[0]).startswith("img-"))
    assert kinds == {"lora_name", "extra_keys", "lookahead_token_ids", "session_id", "image key"}


def test_vllm_publisher_gone_silent_is_forgotten_then_rebuilt(ipc, cleanup):  # noqa: F811
    """vLLM's publisher says nothing for ``silent_after``: kvcy's subscriber forgets the
    instance; when it speaks again, the instance is rebuilt from vLLM's replay buffer."""
    endpoint, replay = ipc(), ipc()
    pub = vk.ZmqEventPublisher(data_parallel_rank=0, endpoint=endpoint, replay_endpoint=replay)
    try:
        index = RecordingIndex(KVIndex())
        sub = subscriber(cleanup, index, {"vllm": (endpoint, replay)}, silent_after=0.2)
        hashes = iter(range(100))
        wait_until(lambda: index.batches > 0, "a batch",
                   step=lambda: (pub.publish(vllm_stored(next(hashes))), sub.poll(0.02)))
        wait_until(lambda: sub.states["vllm"].silences == 1, "the silence", step=lambda: sub.poll(0.05))
        assert "vllm" not in index.blocks and index.removed == ["vllm"]
        pub.publish(vllm_stored(next(hashes)))
        sent = next(hashes)
        wait_until(lambda: sub.states["vllm"].last_seq == sent - 1, "the rebuild", step=lambda: sub.poll(0.02))
        assert index.blocks["vllm"] == set(range(sent)) and sub.states["vllm"].lost == 0
        index.check()
    finally:
        pub.shutdown()
