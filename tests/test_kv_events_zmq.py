"""KV events over ZeroMQ: kvcy's publisher on vLLM 0.33.0's wire and replay protocol,
and the subscriber that applies N publishers to a routing index, through the faults it must
survive (late join, restart, high-water-mark drops, malformed messages, silence).

Everything runs on loopback (ipc sockets in a temporary folder, inproc where the test needs
ZeroMQ's high-water mark to bite), and every wait is a bounded loop: a test that fails, fails
within seconds.  tests/vllm_live/test_kv_events_vllm.py checks the same wire against vLLM's own code.
"""

from __future__ import annotations

import itertools
import threading
import time

import msgspec
import pytest

zmq = pytest.importorskip("zmq")

from kvcy.kv_events import (  # noqa: E402
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    EventPublisherFactory,
    EventSubscriber,
    KVEventBatch,
    KVEventsConfig,
    NullEventPublisher,
    ZmqEventPublisher,
)
from kvcy.kv_events.publisher import END_SEQ, offset_endpoint_port  # noqa: E402

BS = 4
WAIT = 5.0  # seconds any single wait may take before the test fails
_names = itertools.count()


class RecordingIndex:
    """Per instance, the set of block hashes it holds, and what was forgotten: the oracle a real
    ``KVIndex`` (``kv``, fed the same calls) is checked against by ``check``."""

    def __init__(self, kv=None) -> None:
        self.kv = kv
        self.blocks: dict[str, set] = {}
        self.removed: list[str] = []
        self.batches = 0

    def check(self) -> None:
        """The real index holds exactly what the recording says each instance holds."""
        if self.kv is None:
            return
        assert set(self.kv.instances) == set(self.blocks)
        for instance, held in self.blocks.items():
            assert self.kv.num_blocks(instance) == len(held), instance
            assert all(self.kv.longest_prefix([h])[instance] == 1 for h in held), instance

    def apply_batch(self, instance, batch) -> int:
        if self.kv is not None:
            self.kv.apply_batch(instance, batch)
        held = self.blocks.setdefault(instance, set())
        for event in batch.events:
            if isinstance(event, BlockStored):
                held.update(event.block_hashes)
            elif isinstance(event, BlockRemoved):
                held.difference_update(event.block_hashes)
            elif isinstance(event, AllBlocksCleared):
                held.clear()
        self.batches += 1
        return len(batch.events)

    def remove_instance(self, instance) -> None:
        if self.kv is not None:
            self.kv.remove_instance(instance)
        self.blocks.pop(instance, None)
        self.removed.append(instance)


def stored(*hashes: int, ts: float | None = None) -> KVEventBatch:
    event = BlockStored(block_hashes=list(hashes), parent_block_hash=None, token_ids=list(range(BS * len(hashes))),
                        block_size=BS, lora_id=None, medium="GPU", lora_name=None)
    return KVEventBatch(ts=time.time() if ts is None else ts, events=[event])


def wait_until(cond, what: str, step=lambda: time.sleep(0.01), timeout: float = WAIT) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        step()


def start_frame(seq: int) -> bytes:
    """A replay request's start: the sequence number as 8 big-endian bytes."""
    return seq.to_bytes(8, "big")


def wait_sent(pub: ZmqEventPublisher, n: int) -> None:
    wait_until(lambda: pub.sent_batches >= n, f"{n} batches sent")


@pytest.fixture
def ipc(tmp_path):
    """``ipc()`` -> a fresh ipc endpoint in a temporary folder."""
    return lambda: f"ipc://{tmp_path}/{next(_names)}"


@pytest.fixture
def index(impl):
    """A ``RecordingIndex`` over a real ``KVIndex`` of each twin, checked against it at the end."""
    recording = RecordingIndex(impl.kv_index.KVIndex())
    yield recording
    recording.check()


@pytest.fixture
def cleanup():
    """Publishers and subscribers to close at the end, whatever happens; no thread outlives a test."""
    before = set(threading.enumerate())
    things: list = []
    yield things.append
    for thing in reversed(things):
        (thing.close if isinstance(thing, EventSubscriber) else thing.shutdown)()
    left = [t for t in set(threading.enumerate()) - before if t.name.startswith("kvcy-")]
    assert left == [], f"threads left running: {left}"


def publisher(cleanup, *args, **kw) -> ZmqEventPublisher:
    pub = ZmqEventPublisher(*args, **kw)
    cleanup(pub)
    return pub


def subscriber(cleanup, index, publishers, **kw) -> EventSubscriber:
    sub = EventSubscriber(index, publishers, **kw)
    cleanup(sub)
    return sub


def raw_sub(endpoint: str, topic: bytes = b""):
    sock = zmq.Context.instance().socket(zmq.SUB)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.SUBSCRIBE, topic)
    sock.connect(endpoint)
    return sock


def first_message(pub: ZmqEventPublisher, sock, batch_for) -> list[bytes]:
    """Publish ``batch_for(i)`` until ``sock`` hears one (a fresh SUB misses the first ones)."""
    for i in range(100):
        pub.publish(batch_for(i))
        if sock.poll(50):
            return sock.recv_multipart()
    raise AssertionError("the subscriber never heard the publisher")


# --------------------------------------------------------------------------- configuration
def test_config_defaults_and_checks():
    cfg = KVEventsConfig()
    assert (cfg.publisher, cfg.endpoint, cfg.replay_endpoint, cfg.buffer_steps, cfg.hwm, cfg.max_queue_size,
            cfg.topic) == ("null", "tcp://*:5557", None, 10_000, 100_000, 100_000, "")
    assert KVEventsConfig(enable_kv_cache_events=True).publisher == "zmq"
    with pytest.raises(TypeError, match="hwm must be an int"):
        KVEventsConfig(hwm=1.5)
    with pytest.raises(TypeError, match="endpoint must be a str, got NoneType"):
        KVEventsConfig(endpoint=None)
    # vLLM's config takes only its two kinds (a pydantic literal: a ValueError there too).
    for kind in ("kafka", "", 5):
        with pytest.raises(ValueError, match=r"publisher\n  Input should be 'null' or 'zmq' \[type=literal_error, "
                                             f"input_value={kind!r}, input_type={type(kind).__name__}]"):
            KVEventsConfig(enable_kv_cache_events=True, publisher=kind)
    # vLLM's config holds any int and leaves the values to the publisher: a config with events
    # off, or with an unbounded queue (0 or less, as queue.Queue reads it), is accepted as in vLLM.
    cfg = KVEventsConfig(buffer_steps=-1, hwm=-1, max_queue_size=0, endpoint="", replay_endpoint="")
    assert (cfg.buffer_steps, cfg.hwm, cfg.max_queue_size, cfg.endpoint) == (-1, -1, 0, "")
    assert isinstance(EventPublisherFactory.create(cfg), NullEventPublisher)


def test_offset_endpoint_port_per_data_parallel_rank():
    # vLLM has it as a static method of the publisher (consumers derive each rank's endpoint).
    assert ZmqEventPublisher.offset_endpoint_port("tcp://host:6000", 2) == "tcp://host:6002"
    assert offset_endpoint_port("tcp://*:5557", 0) == "tcp://*:5557"
    assert offset_endpoint_port("tcp://*:5557", 3) == "tcp://*:5560"
    assert offset_endpoint_port("tcp://*:0", 3) == "tcp://*:0"
    assert offset_endpoint_port("inproc://cache", 2) == "inproc://cache_dp2"
    assert offset_endpoint_port(None, 2) is None
    with pytest.raises(ValueError, match="must contain 'inproc' or 'tcp'"):
        offset_endpoint_port("ipc:///tmp/x", 1)


def test_factory_builds_the_configured_publisher(ipc, cleanup):
    assert isinstance(EventPublisherFactory.create(None), NullEventPublisher)
    assert isinstance(EventPublisherFactory.create(KVEventsConfig()), NullEventPublisher)
    endpoint, replay = ipc(), ipc()
    pub = EventPublisherFactory.create(KVEventsConfig(enable_kv_cache_events=True, endpoint=endpoint,
                                                      replay_endpoint=replay, buffer_steps=7, topic="t"))
    cleanup(pub)
    assert isinstance(pub, ZmqEventPublisher)
    got = pub.get_publisher_config()
    assert (got.endpoint, got.replay_endpoint, got.buffer_steps, got.topic) == (endpoint, replay, 7, "t")
    unknown = KVEventsConfig(enable_kv_cache_events=True)
    unknown.publisher = "kafka"  # as in vLLM, only an assignment gets past the config's check
    with pytest.raises(ValueError, match="Unknown event publisher 'kafka'"):
        EventPublisherFactory.create(unknown)


def test_publisher_refuses_bad_settings_before_opening_anything():
    with pytest.raises(TypeError, match="endpoint must be a str, got NoneType"):
        ZmqEventPublisher(0, None)
    with pytest.raises(ValueError, match="endpoint must be a non-empty str, got ''"):
        ZmqEventPublisher(0, "")
    with pytest.raises(ValueError, match="replay_endpoint must be None or a non-empty str"):
        ZmqEventPublisher(0, "tcp://127.0.0.1:0", "")
    with pytest.raises(ValueError, match="buffer_steps must be >= 0, got -1"):
        ZmqEventPublisher(0, "tcp://127.0.0.1:0", buffer_steps=-1)
    with pytest.raises(ValueError, match="hwm must be >= 0, got -2"):
        ZmqEventPublisher(0, "tcp://127.0.0.1:0", hwm=-2)
    with pytest.raises(ValueError, match="data_parallel_rank must be >= 0"):
        ZmqEventPublisher(-1, "tcp://127.0.0.1:0")
    with pytest.raises(ValueError, match="must contain 'inproc' or 'tcp'"):
        ZmqEventPublisher(1, "ipc:///tmp/kvcy-never-bound")
    with pytest.raises(TypeError, match="topic must be a str"):
        ZmqEventPublisher(0, "tcp://127.0.0.1:0", topic=b"kv")


def test_data_parallel_rank_offsets_the_endpoints(cleanup):
    name = f"inproc://kvcy-dp-{next(_names)}"
    pub = publisher(cleanup, 3, name, name + "-replay")
    assert (pub.endpoint, pub.replay_endpoint) == (name + "_dp3", name + "-replay_dp3")
    assert pub.get_publisher_config().endpoint == name + "_dp3"


@pytest.mark.parametrize("port", ["0", "*"])  # "*": ZeroMQ's own wildcard port, resolved as port 0 is
def test_tcp_port_zero_binds_an_ephemeral_loopback_port(cleanup, port):
    pub = publisher(cleanup, 0, f"tcp://127.0.0.1:{port}", f"tcp://127.0.0.1:{port}")
    for endpoint in (pub.endpoint, pub.replay_endpoint, pub.get_publisher_config().endpoint):
        assert endpoint.startswith("tcp://127.0.0.1:") and endpoint.rpartition(":")[2].isdigit()
    sock = raw_sub(pub.endpoint)
    try:
        frames = first_message(pub, sock, lambda i: stored(i))
    finally:
        sock.close()
    assert msgspec.msgpack.decode(frames[2], type=KVEventBatch).events[0].block_size == BS


def test_any_host_port_zero_binds_the_node_address(cleanup, monkeypatch):
    """``tcp://*:0`` is vLLM's "this node, any port": it binds the node's address (``VLLM_HOST_IP``
    here) and reports ``tcp://<ip>:<port>``, an address a subscriber elsewhere can connect to;
    with no node address it refuses (vLLM's message) and leaves nothing open."""
    monkeypatch.setenv("VLLM_HOST_IP", "127.0.0.1")
    pub = publisher(cleanup, 0, "tcp://*:0", "tcp://*:0")
    for endpoint in (pub.endpoint, pub.replay_endpoint):
        host, _, port = endpoint.rpartition(":")
        assert host == "tcp://127.0.0.1" and port.isdigit() and port != "0"
    assert pub.endpoint != pub.replay_endpoint
    config = pub.get_publisher_config()
    assert (config.endpoint, config.replay_endpoint) == (pub.endpoint, pub.replay_endpoint)
    sock = raw_sub(pub.endpoint)
    try:
        assert msgspec.msgpack.decode(first_message(pub, sock, lambda i: stored(i))[2], type=KVEventBatch).events
    finally:
        sock.close()
    monkeypatch.setenv("VLLM_HOST_IP", "0.0.0.0")
    before = threading.active_count()
    with pytest.raises(ValueError, match=r"tcp://\*:0 needs a node IP; set VLLM_HOST_IP"):
        ZmqEventPublisher(0, "tcp://*:0")
    assert threading.active_count() == before


def test_max_queue_size_zero_is_unbounded(ipc, cleanup):
    """vLLM's queue takes ``maxsize <= 0`` as no bound (``queue.Queue``'s rule): nothing drops."""
    pub = publisher(cleanup, 0, ipc(), max_queue_size=0)
    for i in range(500):
        pub.publish(stored(i))
    wait_sent(pub, 500)
    assert pub.dropped_batches == 0 and pub.get_publisher_config().max_queue_size == 0


# --------------------------------------------------------------------------- the wire
def test_wire_format_is_vllms(cleanup):
    """Frames: topic, 8-byte big-endian sequence number, msgpack of vLLM's array-like batch whose
    events are maps tagged ``type`` (defaults left out, required Nones kept)."""
    pub = publisher(cleanup, 2, "tcp://127.0.0.1:0", topic="kv@node")
    sock = raw_sub(pub.endpoint)
    try:
        batch_for = lambda i: KVEventBatch(ts=1.5 + i, events=[  # noqa: E731
            BlockStored(block_hashes=[7, 8], parent_block_hash=None, token_ids=[1, 2, 3, 4, 5, 6, 7, 8],
                        block_size=4, lora_id=None, medium="GPU", lora_name=None, group_idx=0),
            BlockRemoved(block_hashes=[b"\x01\x02"], medium="GPU"),
            AllBlocksCleared(),
        ])
        topic, seq, payload = first_message(pub, sock, batch_for)
        assert topic == b"kv@node" and len(seq) == 8
        n = int.from_bytes(seq, "big")
        expected = [
            1.5 + n,
            [
                {"type": "BlockStored", "block_hashes": [7, 8], "parent_block_hash": None,
                 "token_ids": [1, 2, 3, 4, 5, 6, 7, 8], "block_size": 4, "lora_id": None, "medium": "GPU",
                 "lora_name": None, "group_idx": 0},
                {"type": "BlockRemoved", "block_hashes": [b"\x01\x02"], "medium": "GPU"},
                {"type": "AllBlocksCleared"},
            ],
            2,  # the publisher's data-parallel rank, stamped on a batch that had none
        ]
        # Same values, same field order (tests/vllm_live/test_kv_events_vllm.py compares the bytes with
        # vLLM's own encoding of its own structs).
        decoded = msgspec.msgpack.decode(payload)
        assert decoded == expected
        assert [list(event) for event in decoded[1]] == [list(event) for event in expected[1]]
        # The next batch carries the next number.
        pub.publish(batch_for(n + 1))
        assert sock.poll(int(WAIT * 1000))
        assert sock.recv_multipart()[1] == (n + 1).to_bytes(8, "big")
    finally:
        sock.close()


def test_replay_protocol(ipc, cleanup):
    """A DEALER sends ``[b"", start]``; the ROUTER answers every buffered batch from ``start`` on
    as ``[b"", topic, seq, payload]`` and ends with ``[b"", b"", -1, b""]``.  As vLLM's, it reads
    the start as an unsigned big-endian number of any length (``b"bad"`` is past every batch:
    only the end marker comes back) and ignores a request that is not three frames without
    stopping the publisher."""
    pub = publisher(cleanup, 0, ipc(), ipc(), buffer_steps=3, topic="t")
    for i in range(5):
        pub.publish(stored(i, ts=float(i)))
    wait_sent(pub, 5)
    dealer = zmq.Context.instance().socket(zmq.DEALER)
    dealer.setsockopt(zmq.LINGER, 0)
    dealer.connect(pub.replay_endpoint)
    try:
        dealer.send_multipart([b"", b"", start_frame(0)])  # four frames at the ROUTER: ignored
        dealer.send(start_frame(0))  # two frames (no delimiter): ignored
        for frame, seqs in ((start_frame(1), [2, 3, 4]), (start_frame(4), [4]), (start_frame(9), []),
                            (b"\x03", [3, 4]), (b"bad", []), (b"", [2, 3, 4])):
            dealer.send_multipart([b"", frame])
            answers = []
            while True:
                assert dealer.poll(int(WAIT * 1000)), "no replay answer"
                frames = dealer.recv_multipart()
                if frames[2] == END_SEQ:
                    assert frames == [b"", b"", END_SEQ, b""]
                    break
                answers.append(frames)
            assert [int.from_bytes(f[2], "big") for f in answers] == seqs
            assert all(f[:2] == [b"", b"t"] for f in answers)
            assert [msgspec.msgpack.decode(f[3], type=KVEventBatch).ts for f in answers] == [float(s) for s in seqs]
    finally:
        dealer.close()
    assert pub.replay_requests == 6 and pub.running


def test_publish_never_blocks_and_counts_drops(index, ipc, cleanup):
    """With the queue full, ``publish`` drops (counted) instead of waiting; the dropped numbers
    are missing on the wire, so a subscriber counts them lost."""
    pub = publisher(cleanup, 0, ipc(), ipc(), max_queue_size=1)
    sub = subscriber(cleanup, index, {"a": (pub.endpoint, pub.replay_endpoint)})
    first_hash = iter(range(10**6, 10**7))
    wait_until(lambda: index.batches > 0, "the subscriber to hear the publisher",
               step=lambda: (pub.publish(stored(next(first_hash))), sub.poll(0.02)))
    total = 2000
    done = threading.Event()

    def flood():
        for i in range(total):
            pub.publish(stored(i))
        done.set()

    flooder = threading.Thread(target=flood)
    flooder.start()
    flooder.join(WAIT)
    assert done.is_set(), "publish blocked"
    assert pub.dropped_batches > 0
    wait_until(lambda: pub.sent_batches + pub.dropped_batches == pub._next_seq, "the queue to drain")
    pub.publish(stored(2**40))  # the queue is empty: this one gets through, and ends the stream
    wait_until(lambda: sub.states["a"].last_seq == pub._next_seq - 1, "the last batch to arrive",
               step=lambda: sub.poll(0.02))
    state = sub.states["a"]
    assert state.lost == pub.dropped_batches
    assert state.batches_applied == pub.sent_batches
    with pytest.raises(TypeError, match="events must be an EventBatch"):
        pub.publish([])


# --------------------------------------------------------------------------- the faults
def test_late_joiner_replays_what_it_missed(index, ipc, cleanup):
    pub = publisher(cleanup, 0, ipc(), ipc())
    for i in range(5):
        pub.publish(stored(i))
    wait_sent(pub, 5)
    sub = subscriber(cleanup, index, {"a": (pub.endpoint, pub.replay_endpoint)})
    # The publisher's next batch shows the gap 0..; replay fills it.
    more = iter(range(5, 100))
    wait_until(lambda: sub.states["a"].last_seq is not None, "a batch",
               step=lambda: (pub.publish(stored(next(more))), sub.poll(0.05)))
    last = pub._next_seq - 1
    wait_until(lambda: sub.states["a"].last_seq == last, "the last batch", step=lambda: sub.poll(0.02))
    state = sub.states["a"]
    assert state.gaps >= 1 and state.replayed >= 5 and state.lost == 0
    assert index.blocks["a"] == set(range(last + 1))


def test_progress_is_each_states_last_seq_and_lag(index, ipc, cleanup):
    pub = publisher(cleanup, 0, ipc(), ipc())
    sub = subscriber(cleanup, index, {"a": (pub.endpoint, pub.replay_endpoint)})
    assert sub.progress() == {"a": (None, None)}
    more = iter(range(100))
    wait_until(lambda: sub.progress()["a"][0] is not None, "a batch",
               step=lambda: (pub.publish(stored(next(more))), sub.poll(0.05)))
    last = pub._next_seq - 1
    wait_until(lambda: sub.progress()["a"][0] == last, "the last batch", step=lambda: sub.poll(0.02))
    state = sub.states["a"]
    assert sub.progress() == {"a": (state.last_seq, state.lag)} and state.lag is not None


def test_late_joiner_syncs_at_once(index, ipc, cleanup):
    pub = publisher(cleanup, 0, ipc(), ipc(), buffer_steps=4)
    for i in range(6):
        pub.publish(stored(i))
    wait_sent(pub, 6)
    sub = subscriber(cleanup, index, {"a": (pub.endpoint, pub.replay_endpoint)})
    assert sub.sync() == 4
    state = sub.states["a"]
    # Batches 0 and 1 left the replay buffer: lost, and said so.
    assert (state.last_seq, state.replayed, state.lost) == (5, 4, 2)
    assert index.blocks["a"] == {2, 3, 4, 5}


def test_publisher_restart_is_forgotten_and_rebuilt(index, ipc, cleanup):
    endpoint, replay = ipc(), ipc()
    old = ZmqEventPublisher(0, endpoint, replay)
    sub = subscriber(cleanup, index, {"a": (endpoint, replay)})
    hashes = iter(range(100, 200))
    try:
        wait_until(lambda: index.batches > 0, "the first publisher",
                   step=lambda: (old.publish(stored(next(hashes))), sub.poll(0.02)))
        for _ in range(30):
            old.publish(stored(next(hashes)))
        wait_sent(old, old._next_seq)
        wait_until(lambda: sub.states["a"].last_seq == old._next_seq - 1, "the old stream",
                   step=lambda: sub.poll(0.02))
    finally:
        old.shutdown()
    assert index.blocks["a"] and index.removed == []
    new = publisher(cleanup, 0, endpoint, replay)  # numbers from 0 again
    fresh = iter(range(1000, 1100))
    wait_until(lambda: sub.states["a"].restarts == 1, "the restart",
               step=lambda: (new.publish(stored(next(fresh))), sub.poll(0.05)))
    last = new._next_seq - 1
    wait_until(lambda: sub.states["a"].last_seq == last, "the new stream", step=lambda: sub.poll(0.02))
    assert index.removed == ["a"]
    # Only what the new process stored: the old blocks went with the old process.
    assert index.blocks["a"] == set(range(1000, 1000 + last + 1))
    assert sub.states["a"].lost == 0


def test_restart_heard_past_the_old_numbers_is_found_by_replay(index, ipc, cleanup):
    """The restarted publisher has published past the old stream's last number before the
    subscriber hears it again (a ZeroMQ reconnect takes time): the live numbers do not go back,
    but the replay's batch under the last number applied is not the one applied, so the
    instance is forgotten and rebuilt from the new publisher's history alone."""
    endpoint, replay = ipc(), ipc()
    old = ZmqEventPublisher(0, endpoint, replay)
    sub = subscriber(cleanup, index, {"a": (endpoint, replay)})
    try:
        hashes = iter(range(100, 200))
        wait_until(lambda: index.batches > 0, "the first publisher",
                   step=lambda: (old.publish(stored(next(hashes))), sub.poll(0.02)))
        old.publish(stored(next(hashes)))
        wait_until(lambda: sub.states["a"].last_seq == old._next_seq - 1, "the old stream",
                   step=lambda: sub.poll(0.02))
    finally:
        old.shutdown()
    reached = sub.states["a"].last_seq
    new = publisher(cleanup, 0, endpoint, replay)
    for i in range(reached + 10):  # past the old numbers, unheard: the subscriber does not poll
        new.publish(stored(1000 + i))
    wait_sent(new, reached + 10)
    more = iter(range(2000, 2100))
    wait_until(lambda: sub.states["a"].restarts == 1, "the restart",
               step=lambda: (new.publish(stored(next(more))), sub.poll(0.05)))
    last = new._next_seq - 1
    wait_until(lambda: sub.states["a"].last_seq == last, "the new stream", step=lambda: sub.poll(0.02))
    assert index.removed == ["a"]
    assert index.blocks["a"] == set(range(1000, 1000 + reached + 10)) | set(range(2000, 2000 + last - reached - 9))
    assert sub.states["a"].lost == 0


class FakePublisher:
    """vLLM's protocol on bare sockets, for the cases timing cannot arrange: a PUB socket that
    can say hello (a one-frame message a subscriber counts as malformed and otherwise ignores:
    once counted, the subscription is up) and a ROUTER answering replay requests from
    ``history`` in a thread.  ``close`` stops it."""

    def __init__(self, endpoint: str, replay_endpoint: str, history: list[KVEventBatch], answer=None) -> None:
        ctx = zmq.Context.instance()
        self.payloads = [msgspec.msgpack.encode(batch) for batch in history]
        #: ``answer(start)`` -> the frame lists (after the client's identity) a replay request gets.
        self.answer = answer or (lambda start: [[b"", b"", start_frame(seq), self.payloads[seq]]
                                                for seq in range(start, len(self.payloads))]
                                 + [[b"", b"", END_SEQ, b""]])
        self.pub = ctx.socket(zmq.PUB)
        self.pub.setsockopt(zmq.LINGER, 0)
        self.pub.bind(endpoint)
        self.router = ctx.socket(zmq.ROUTER)
        self.router.setsockopt(zmq.LINGER, 0)
        self.router.bind(replay_endpoint)
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._serve, name="fake-replay")
        self.thread.start()

    def _serve(self) -> None:
        while not self.stop.is_set():
            if self.router.poll(20):
                client, _, start = self.router.recv_multipart()
                for frames in self.answer(int.from_bytes(start, "big")):
                    self.router.send_multipart([client, *frames])

    def wait_subscriber(self, sub: EventSubscriber, instance: str) -> None:
        """Say hello until ``sub`` hears it (and counts it malformed)."""
        before = sub.states[instance].malformed
        wait_until(lambda: sub.states[instance].malformed > before, "the subscriber",
                   step=lambda: (self.pub.send(b"hello"), sub.poll(0.02)))

    def send(self, seq: int) -> None:
        self.pub.send_multipart([b"", start_frame(seq), self.payloads[seq]])

    def close(self) -> None:
        self.stop.set()
        self.thread.join(WAIT)
        self.pub.close()
        self.router.close()


def test_restart_heard_at_the_next_number_is_found_after_the_lost_connection(index, ipc, cleanup):
    """The restarted publisher's first batch this subscriber hears carries exactly the next
    number: nothing in the numbers tells.  The connection was lost in between, though, so that
    batch is checked against the replay: the batch under the last number applied is another
    one, and the instance is forgotten and rebuilt from the new publisher's history."""
    endpoint, replay = ipc(), ipc()
    old = FakePublisher(endpoint, replay, [stored(100 + i, ts=float(i)) for i in range(3)])
    try:
        sub = subscriber(cleanup, index, {"a": (endpoint, replay)})
        old.wait_subscriber(sub, "a")
        for seq in range(3):
            old.send(seq)
        wait_until(lambda: sub.states["a"].last_seq == 2, "the old stream", step=lambda: sub.poll(0.02))
    finally:
        old.close()
    new = FakePublisher(endpoint, replay, [stored(1000 + i, ts=10.0 + i) for i in range(4)])
    try:
        new.wait_subscriber(sub, "a")  # reconnected: batches 0..2 went to nobody
        new.send(3)
        wait_until(lambda: sub.states["a"].last_seq == 3, "the next batch", step=lambda: sub.poll(0.02))
    finally:
        new.close()
    state = sub.states["a"]
    assert (state.restarts, state.gaps, state.lost) == (1, 0, 0) and state.malformed >= 2
    assert index.removed == ["a"] and index.blocks["a"] == {1000, 1001, 1002, 1003}


def test_malformed_replay_answers_are_counted_and_skipped(index, ipc, cleanup):
    """A replay answer with a missing delimiter, a short sequence number or a truncated payload
    is counted malformed and skipped; the rest of the answer applies, and the batch that never
    came back whole is counted lost."""
    endpoint, replay = ipc(), ipc()
    history = [stored(100 + i, ts=float(i)) for i in range(5)]

    def answer(start):
        good = [[b"", b"", start_frame(seq), fake.payloads[seq]] for seq in range(start, 5)]
        good[1][3] = good[1][3][:-3]  # batch 1 truncated
        return [[b"junk"], [b"", b"", b"\x00\x02", fake.payloads[2]], *good, [b"", b"", END_SEQ, b""]]

    fake = FakePublisher(endpoint, replay, history, answer)
    try:
        sub = subscriber(cleanup, index, {"a": (endpoint, replay)})
        fake.wait_subscriber(sub, "a")
        hello = sub.states["a"].malformed
        fake.send(4)  # a late joiner's first batch: replay 0..3
        wait_until(lambda: sub.states["a"].last_seq == 4, "the batch", step=lambda: sub.poll(0.02))
    finally:
        fake.close()
    state = sub.states["a"]
    # 0, 2, 3 and 4 replayed (the answer holds 4 too: the live copy is then skipped); 1 lost.
    assert (state.malformed - hello, state.lost, state.replayed, state.gaps) == (3, 1, 4, 1)
    assert index.blocks["a"] == {100, 102, 103, 104}


def test_a_replay_socket_that_never_answers_costs_the_timeout_only(index, ipc, cleanup, caplog):
    """No end marker within ``replay_timeout``: the missing batches are counted lost, the live
    stream goes on, and the next gap asks again on a fresh socket."""
    endpoint, replay = ipc(), ipc()
    fake = FakePublisher(endpoint, replay, [stored(100 + i) for i in range(8)], answer=lambda start: [])
    try:
        sub = subscriber(cleanup, index, {"a": (endpoint, replay)}, replay_timeout=0.1)
        fake.wait_subscriber(sub, "a")
        with caplog.at_level("WARNING", logger="kvcy.kv_events"):
            for seq in (3, 4, 7):
                fake.send(seq)
                wait_until(lambda: sub.states["a"].last_seq == seq, f"batch {seq}", step=lambda: sub.poll(0.02))
    finally:
        fake.close()
    state = sub.states["a"]
    assert (state.gaps, state.lost, state.replayed, state.batches_applied) == (2, 5, 0, 3)
    assert index.blocks["a"] == {103, 104, 107}
    assert caplog.text.count("got no end marker") == 2


def test_drops_at_the_high_water_mark_come_back_by_replay(index, cleanup):
    name = f"inproc://kvcy-hwm-{next(_names)}"
    pub = publisher(cleanup, 0, name, name + "-replay", hwm=1, buffer_steps=1000)
    sub = subscriber(cleanup, index, {"a": (name, name + "-replay")}, rcvhwm=1)
    first = iter(range(10**6, 10**7))
    wait_until(lambda: index.batches > 0, "the subscriber to hear the publisher",
               step=lambda: (pub.publish(stored(next(first))), sub.poll(0.02)))
    start = pub._next_seq
    for i in range(200):  # nobody reads: ZeroMQ keeps ~2 and drops the rest
        pub.publish(stored(i))
    wait_sent(pub, start + 200)
    # The tail of the flood was dropped too: the publisher's next batch that gets through shows
    # the gap (or sync() would ask at once).
    more = iter(range(2 * 10**7, 3 * 10**7))
    wait_until(lambda: (sub.states["a"].last_seq or 0) >= start + 199, "the flood",
               step=lambda: (sub.poll(0.02), pub.publish(stored(next(more)))))
    state = sub.states["a"]
    assert state.gaps >= 1 and state.replayed >= 150 and state.lost == 0
    assert set(range(200)) <= index.blocks["a"]


def test_malformed_messages_are_counted_and_skipped(index, ipc, cleanup):
    """A fake publisher (a bare PUB socket) sends junk among good batches."""
    endpoint = ipc()
    pub = zmq.Context.instance().socket(zmq.PUB)
    pub.setsockopt(zmq.LINGER, 0)
    pub.bind(endpoint)
    try:
        sub = subscriber(cleanup, index, {"a": endpoint})
        seq = itertools.count()

        def send(batch, n=None):
            n = next(seq) if n is None else n
            pub.send_multipart([b"", n.to_bytes(8, "big"), msgspec.msgpack.encode(batch)])
            return n

        wait_until(lambda: index.batches > 0, "the subscriber", step=lambda: (send(stored(0)), sub.poll(0.02)))
        next_seq = next(seq)
        good = msgspec.msgpack.encode(stored(42))
        pub.send_multipart([b""])  # one frame
        pub.send_multipart([b"", b"\x00\x01", good])  # a 2-byte sequence number
        pub.send_multipart([b"", next_seq.to_bytes(8, "big"), b"\xc1"])  # not msgpack
        pub.send_multipart([b"", next_seq.to_bytes(8, "big"), good[:-5]])  # truncated
        pub.send_multipart([b"", next_seq.to_bytes(8, "big"), msgspec.msgpack.encode({"x": 1})])  # not a batch
        # Decodes, but the index refuses it (a negative block hash): counted, skipped, numbered.
        pub.send_multipart([b"", next_seq.to_bytes(8, "big"), msgspec.msgpack.encode(stored(7, -5))])
        pub.send_multipart([b"", (next_seq + 1).to_bytes(8, "big"), good])
        wait_until(lambda: sub.states["a"].last_seq == next_seq + 1, "the good batch", step=lambda: sub.poll(0.02))
        state = sub.states["a"]
        assert state.malformed == 6
        # Every number up to the good batch was applied, refused, or missed before the
        # subscription took.
        assert state.batches_applied + 1 + state.lost == next_seq + 2 and state.batches_applied >= 2
        assert 42 in index.blocks["a"] and 7 not in index.blocks["a"]
    finally:
        pub.close()


def test_a_batch_that_does_not_encode_is_skipped_and_counted_lost(index, ipc, cleanup, caplog):
    pub = publisher(cleanup, 0, ipc(), ipc())
    sub = subscriber(cleanup, index, {"a": (pub.endpoint, pub.replay_endpoint)})
    hashes = iter(range(100))
    wait_until(lambda: index.batches > 0, "a batch", step=lambda: (pub.publish(stored(next(hashes))), sub.poll(0.02)))
    with caplog.at_level("ERROR", logger="kvcy.kv_events"):
        pub.publish(KVEventBatch(ts=1.0, events=[object()]))
        pub.publish(stored(500))
        last = pub._next_seq - 1
        wait_until(lambda: sub.states["a"].last_seq == last, "the batch after", step=lambda: sub.poll(0.02))
    assert "could not be encoded" in caplog.text
    assert pub.running and sub.states["a"].lost == 1 and 500 in index.blocks["a"]


def test_silent_instance_is_forgotten_then_rebuilt(index, ipc, cleanup):
    pub = publisher(cleanup, 0, ipc(), ipc())
    sub = subscriber(cleanup, index, {"a": (pub.endpoint, pub.replay_endpoint)}, silent_after=0.2)
    hashes = iter(range(100))
    wait_until(lambda: index.batches > 0, "a batch", step=lambda: (pub.publish(stored(next(hashes))), sub.poll(0.02)))
    wait_until(lambda: sub.states["a"].silences == 1, "the silence", step=lambda: sub.poll(0.05))
    assert "a" not in index.blocks and index.removed == ["a"]
    assert sub.states["a"].last_seq is None
    # It speaks again: a newcomer, rebuilt from its replay buffer.
    pub.publish(stored(next(hashes)))
    last = pub._next_seq - 1
    wait_until(lambda: sub.states["a"].last_seq == last, "the rebuild", step=lambda: sub.poll(0.02))
    assert index.blocks["a"] == set(range(last + 1))
    assert sub.states["a"].lost == 0


def test_clear_is_applied_in_order(index, ipc, cleanup):
    pub = publisher(cleanup, 0, ipc(), ipc())
    sub = subscriber(cleanup, index, {"a": (pub.endpoint, pub.replay_endpoint)})
    hashes = iter(range(100))
    wait_until(lambda: index.batches > 0, "a batch", step=lambda: (pub.publish(stored(next(hashes))), sub.poll(0.02)))
    pub.publish(KVEventBatch(ts=time.time(), events=[AllBlocksCleared(), stored(500).events[0]]))
    last = pub._next_seq - 1
    wait_until(lambda: sub.states["a"].last_seq == last, "the clear", step=lambda: sub.poll(0.02))
    assert index.blocks["a"] == {500} and sub.states["a"].clears == 1
    # Each AllBlocksCleared of a batch counts, however many there are among its other events.
    events = [stored(600).events[0], AllBlocksCleared(), AllBlocksCleared(), stored(601).events[0],
              AllBlocksCleared(), stored(602).events[0]]
    pub.publish(KVEventBatch(ts=time.time(), events=events))
    pub.publish(stored(603))
    last = pub._next_seq - 1
    wait_until(lambda: sub.states["a"].last_seq == last, "the clears", step=lambda: sub.poll(0.02))
    assert index.blocks["a"] == {602, 603} and sub.states["a"].clears == 4


# --------------------------------------------------------------------------- driving and shutdown
def test_background_thread_two_publishers_and_clean_shutdown(index, ipc, cleanup):
    pubs = {name: publisher(cleanup, 0, ipc(), ipc()) for name in ("a", "b")}
    sub = subscriber(cleanup, index, {n: (p.endpoint, p.replay_endpoint) for n, p in pubs.items()})
    sub.start()
    with pytest.raises(RuntimeError, match="stop\\(\\) the subscriber's thread first"):
        sub.add_publisher("c", ipc())
    with pytest.raises(RuntimeError, match="background thread polls"):
        sub.poll()
    for name, pub in pubs.items():  # a fresh subscription misses the first batches: say hello until heard
        wait_until(lambda: sub.states[name].last_seq is not None, f"{name}'s first batch",
                   step=lambda: (pub.publish(stored(2**40)), time.sleep(0.02)))
    offset = {"a": 0, "b": 1000}
    for i in range(20):
        for name, pub in pubs.items():
            pub.publish(stored(offset[name] + i))

    def caught_up():
        with sub.lock:
            return all(sub.states[n].last_seq == p._next_seq - 1 for n, p in pubs.items())

    wait_until(caught_up, "both streams")
    sub.stop()
    assert not [t for t in threading.enumerate() if t.name == "kvcy-kv-events-subscriber"]
    for name, pub in pubs.items():
        assert set(range(offset[name], offset[name] + 20)) <= index.blocks[name]
        pub.shutdown()
        pub.shutdown()  # again: nothing
        with pytest.raises(RuntimeError, match="Publisher is closed"):
            pub.publish(stored(1))
    assert sub.stats["instances"] == 2 and sub.stats["lost"] == 0
    sub.remove_publisher("a")
    assert "a" not in index.blocks and list(sub.states) == ["b"]
    sub.close()
    assert not [t for t in threading.enumerate() if t.name.startswith("kvcy-kv-events")]


def test_subscriber_refuses_bad_settings(cleanup, ipc):
    with pytest.raises(TypeError, match="index must have a apply_batch"):
        EventSubscriber(object())
    with pytest.raises(ValueError, match="silent_after must be None or > 0"):
        EventSubscriber(RecordingIndex(), silent_after=0)
    sub = subscriber(cleanup, RecordingIndex(), {"a": ipc()})
    with pytest.raises(ValueError, match="instance 'a' is subscribed already"):
        sub.add_publisher("a", ipc())
    with pytest.raises(KeyError):
        sub.remove_publisher("zz")
    assert sub.poll(0) == 0 and sub.run_for(0.05) == 0


def test_lag_is_apply_time_minus_batch_timestamp(index, ipc, cleanup):
    pub = publisher(cleanup, 0, ipc())
    sub = subscriber(cleanup, index, {"a": pub.endpoint}, clock=lambda: 1000.0)
    wait_until(lambda: index.batches > 0, "a batch",
               step=lambda: (pub.publish(stored(1, ts=990.5)), sub.poll(0.02)))
    state = sub.states["a"]
    assert (state.last_ts, state.lag, state.max_lag) == (990.5, 9.5, 9.5)
    assert sub.stats["max_lag"] == 9.5


# --------------------------------------------------------------------------- hostile streams
def nested_bomb(depth: int = 1000) -> bytes:
    """A ~1 KB batch whose one ``BlockStored`` carries ``depth`` nested arrays in ``extra_keys``:
    msgspec's decoder gives up with RecursionError."""
    event = BlockStored(block_hashes=[5], parent_block_hash=None, token_ids=list(range(BS)), block_size=BS,
                        lora_id=None, medium="GPU", lora_name=None, extra_keys=[(7,)])
    payload = msgspec.msgpack.encode(KVEventBatch(ts=time.time(), events=[event]))
    at = payload.index(b"extra_keys") + len(b"extra_keys")
    assert payload[at:at + 3] == b"\x91\x91\x07"
    return payload[:at] + b"\x91" * (depth + 2) + b"\x07" + payload[at + 3:]


def test_a_too_deeply_nested_message_is_malformed_live_and_in_replay(index, ipc, cleanup):
    """A RecursionError from the decoder is one more malformed message, live or replayed:
    it neither escapes ``poll`` nor stops the stream."""
    endpoint, replay = ipc(), ipc()
    fake = FakePublisher(endpoint, replay, [stored(100 + i, ts=float(i)) for i in range(5)])
    fake.payloads[1] = nested_bomb()
    try:
        sub = subscriber(cleanup, index, {"a": (endpoint, replay)})
        fake.wait_subscriber(sub, "a")
        hello = sub.states["a"].malformed
        fake.send(3)  # a late join: 0..4 replayed, 1 does not decode
        wait_until(lambda: sub.states["a"].last_seq == 4, "the replay", step=lambda: sub.poll(0.02))
        fake.pub.send_multipart([b"", start_frame(5), nested_bomb()])  # live
        fake.payloads.append(msgspec.msgpack.encode(stored(106, ts=6.0)))
        fake.send(5)
        wait_until(lambda: sub.states["a"].last_seq == 5, "the next batch", step=lambda: sub.run_for(0.02))
    finally:
        fake.close()
    state = sub.states["a"]
    assert (state.malformed - hello, state.lost, state.replayed) == (2, 1, 4)
    assert index.blocks["a"] == {100, 102, 103, 104, 106}


def test_a_replay_answer_numbered_past_the_live_stream_is_refused(index, ipc, cleanup, caplog):
    """A replay answer the subscriber did not ask for (a batch numbered 10**18, far past the
    live number that caused the request) is refused and counted: the live batches after it
    still apply."""
    endpoint, replay = ipc(), ipc()
    far = 10**18

    def answer(start):
        return [[b"", b"", start_frame(far), msgspec.msgpack.encode(stored(999, ts=1.0))], [b"", b"", END_SEQ, b""]]

    fake = FakePublisher(endpoint, replay, [stored(100 + i, ts=float(i)) for i in range(8)], answer)
    try:
        sub = subscriber(cleanup, index, {"a": (endpoint, replay)})
        fake.wait_subscriber(sub, "a")
        hello = sub.states["a"].malformed
        with caplog.at_level("WARNING", logger="kvcy.kv_events"):
            for seq in range(1, 8):
                fake.send(seq)
            wait_until(lambda: sub.states["a"].last_seq == 7, "the live batches", step=lambda: sub.poll(0.02))
    finally:
        fake.close()
    state = sub.states["a"]
    assert (state.malformed - hello, state.lost, state.batches_applied, state.replayed) == (1, 1, 7, 0)
    assert index.blocks["a"] == {101, 102, 103, 104, 105, 106, 107}
    assert "numbered outside what was asked" in caplog.text


def test_a_live_number_no_publisher_reaches_is_malformed_not_lost(index, ipc, cleanup):
    """One message numbered 2**64 - 2 after batch 2: no gap of 1.8e19 lost batches (and no
    stalled stream): it is malformed, and batch 3 follows on."""
    endpoint, replay = ipc(), ipc()
    fake = FakePublisher(endpoint, replay, [stored(100 + i, ts=float(i)) for i in range(4)])
    try:
        sub = subscriber(cleanup, index, {"a": (endpoint, replay)})
        fake.wait_subscriber(sub, "a")
        hello = sub.states["a"].malformed
        fake.send(0)
        fake.send(1)
        fake.send(2)
        wait_until(lambda: sub.states["a"].last_seq == 2, "batch 2", step=lambda: sub.poll(0.02))
        fake.pub.send_multipart([b"", start_frame(2**64 - 2), fake.payloads[3]])
        fake.send(3)
        wait_until(lambda: sub.states["a"].last_seq == 3, "batch 3", step=lambda: sub.poll(0.02))
    finally:
        fake.close()
    state = sub.states["a"]
    assert (state.malformed - hello, state.lost, state.gaps, state.restarts, state.batches_applied) == (1, 0, 0, 0, 4)


def test_a_timestamp_that_is_not_finite_is_malformed(index, ipc, cleanup):
    """A batch stamped -inf or NaN is no infinite lag: malformed, skipped, its number lost."""
    endpoint = ipc()
    pub = zmq.Context.instance().socket(zmq.PUB)
    pub.setsockopt(zmq.LINGER, 0)
    pub.bind(endpoint)
    try:
        sub = subscriber(cleanup, index, {"a": endpoint}, clock=lambda: 100.0)
        seq = itertools.count()
        wait_until(lambda: index.batches > 0, "the subscriber",
                   step=lambda: (pub.send_multipart([b"", next(seq).to_bytes(8, "big"),
                                                     msgspec.msgpack.encode(stored(0, ts=99.0))]),
                                 sub.poll(0.02)))
        n = next(seq)
        for i, ts in enumerate((float("-inf"), float("nan"), float("inf"))):
            pub.send_multipart([b"", (n + i).to_bytes(8, "big"), msgspec.msgpack.encode(stored(50 + i, ts=ts))])
        pub.send_multipart([b"", (n + 3).to_bytes(8, "big"), msgspec.msgpack.encode(stored(60, ts=98.0))])
        wait_until(lambda: sub.states["a"].last_seq == n + 3, "the good batch", step=lambda: sub.poll(0.02))
    finally:
        pub.close()
    state = sub.states["a"]
    assert state.malformed == 3 and state.max_lag == 2.0 and state.lag == 2.0
    assert {50, 51, 52}.isdisjoint(index.blocks["a"]) and 60 in index.blocks["a"]


def test_a_replay_answer_is_buffered_up_to_max_replay_bytes(index, ipc, cleanup, caplog):
    """An answer larger than ``max_replay_bytes`` is cut there: what came first applies, the
    rest is dropped (its numbers lost, the live stream goes on)."""
    endpoint, replay = ipc(), ipc()
    fake = FakePublisher(endpoint, replay, [stored(100 + i, ts=float(i)) for i in range(10)])
    size = len(fake.payloads[0])
    assert all(len(p) == size for p in fake.payloads)
    try:
        sub = subscriber(cleanup, index, {"a": (endpoint, replay)}, max_replay_bytes=3 * size + 1,
                         replay_timeout=0.5)
        fake.wait_subscriber(sub, "a")
        with caplog.at_level("WARNING", logger="kvcy.kv_events"):
            fake.send(9)
            wait_until(lambda: sub.states["a"].last_seq == 9, "batch 9", step=lambda: sub.poll(0.02))
    finally:
        fake.close()
    state = sub.states["a"]
    assert (state.replayed, state.lost, state.batches_applied) == (3, 6, 4)
    assert index.blocks["a"] == {100, 101, 102, 109}
    assert f"passed {3 * size + 1} bytes" in caplog.text


def test_the_sockets_refuse_messages_over_max_message_size(index, ipc, cleanup):
    """ZeroMQ's MAXMSGSIZE is set on the SUB and replay sockets (64 MiB by default): a larger
    message never reaches the decoder."""
    endpoint, replay = ipc(), ipc()
    sub = subscriber(cleanup, RecordingIndex(), {"d": (ipc(), ipc())})
    assert sub._links["d"].sub.getsockopt(zmq.MAXMSGSIZE) == 64 << 20
    fake = FakePublisher(endpoint, replay, [stored(*range(1000, 1400))] + [stored(i) for i in range(1, 200)])
    try:
        sub = subscriber(cleanup, index, {"a": endpoint}, max_message_size=1024)  # no replay
        assert sub._links["a"].sub.getsockopt(zmq.MAXMSGSIZE) == 1024
        assert len(fake.payloads[0]) > 1024 > len(fake.payloads[1])
        fake.wait_subscriber(sub, "a")
        fake.send(0)  # dropped by ZeroMQ with the connection, which is made again
        more = iter(range(1, 200))
        wait_until(lambda: index.batches > 0, "a batch after the big one",
                   step=lambda: (fake.send(next(more)), sub.poll(0.05)))
    finally:
        fake.close()
    state = sub.states["a"]
    assert state.lost >= 1 and state.batches_applied >= 1 and state.malformed == 1  # the hello only
    assert index.blocks["a"].isdisjoint(range(1000, 1400))
    with pytest.raises(ValueError, match="max_message_size must be None or an int >= 1"):
        EventSubscriber(RecordingIndex(), max_message_size=0)
    with pytest.raises(ValueError, match="max_replay_bytes must be an int >= 1"):
        EventSubscriber(RecordingIndex(), max_replay_bytes=0)


# --------------------------------------------------------------------------- end to end
def test_manager_events_through_zmq_rebuild_its_prefix_cache(impl, ipc, cleanup):
    """A kvcy KVCacheManager publishes each step's events; the subscriber's index then knows,
    for any request, exactly the prefix the manager would hit (evictions included)."""
    from kvcy.hashing import get_hash_fn_by_name, get_request_block_hasher, init_none_hash
    from kvcy.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
    from kvcy.kv_events import external_block_hash

    hash_fn = get_hash_fn_by_name("sha256")
    init_none_hash(hash_fn)
    spec = FullAttentionSpec(block_size=BS, num_kv_heads=1, head_size=8, dtype="float16")
    cfg = KVCacheConfig(num_blocks=12, kv_cache_tensors=[], kv_cache_groups=[KVCacheGroupSpec(["l0"], spec)])
    mgr = impl.kv_cache.KVCacheManager(cfg, max_model_len=256, scheduler_block_size=BS, hash_block_size=BS,
                                       enable_kv_cache_events=True)
    pub = publisher(cleanup, 0, ipc(), ipc())
    index = impl.kv_index.KVIndex()
    sub = subscriber(cleanup, index, {"gpu0": (pub.endpoint, pub.replay_endpoint)})
    ids = itertools.count()
    published: list = []

    def request(tokens):
        return impl.kv_cache.Request(f"r{next(ids)}", tokens, block_hasher=get_request_block_hasher(BS, hash_fn))

    def step(tokens):
        req = request(tokens)
        _, hit, _ = mgr.get_computed_blocks(req)
        assert mgr.allocate_slots(req, len(tokens) - hit) is not None
        mgr.free(req)
        events = mgr.take_events()
        if events:
            published.extend(events)
            pub.publish(KVEventBatch(ts=time.time(), events=events))

    step(list(range(100, 118)))  # a fresh subscription may miss it: replay brings it back
    wait_until(lambda: sub.states["gpu0"].last_seq is not None, "the first batch",  # empty batches: hello
               step=lambda: (pub.publish(KVEventBatch(ts=time.time(), events=[])), sub.poll(0.02)))
    prompts = [list(range(100, 118)), list(range(100, 110)) + [7] * 9, list(range(300, 321)),
               list(range(400, 421)), list(range(100, 114)) + [9] * 3]
    for tokens in prompts:  # 12 blocks: the later prompts evict earlier blocks
        step(tokens)
    last = pub._next_seq - 1
    wait_until(lambda: sub.states["gpu0"].last_seq == last, "every batch", step=lambda: sub.poll(0.02))
    assert sub.states["gpu0"].lost == 0
    assert any(isinstance(e, BlockRemoved) for e in published), "the scenario should evict"
    hits = []
    for tokens in prompts + [list(range(100, 121)), list(range(300, 309)), [1, 2, 3, 4, 5]]:
        probe = request(tokens)
        _, hit, _ = mgr.get_computed_blocks(probe)
        hashes = [external_block_hash(h, True) for h in probe.block_hashes]
        # vLLM's lookup never hits the last token; the index answers for whole blocks held.
        cached = index.longest_prefix(hashes[: (len(tokens) - 1) // BS])["gpu0"]
        assert cached * BS == hit, tokens
        assert index.best_instance(hashes[: (len(tokens) - 1) // BS]) == ("gpu0", cached)
        hits.append(hit)
    assert max(hits) >= 3 * BS and min(hits) == 0
