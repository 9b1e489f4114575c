"""Publishing KV-event batches over ZeroMQ, on vLLM 0.33.0's wire and replay protocol.

What goes on the wire (``vllm.distributed.kv_events.ZmqEventPublisher``'s format):

- the PUB socket sends one three-frame message per batch: the topic (UTF-8), the batch's
  sequence number as an 8-byte big-endian integer (0, 1, 2, ... per publisher), and the batch
  encoded with msgspec's msgpack encoder (``KVEventBatch`` is array-like:
  ``[ts, [event, ...], data_parallel_rank]``, each event a map tagged ``"type"``);
- the optional ROUTER replay socket keeps the last ``buffer_steps`` encoded batches. A client
  sends ``[b"", start]`` from a DEALER, ``start`` being an 8-byte big-endian sequence number
  (a REQ socket sending ``start`` gets only the first answer: REQ takes one reply per
  request); the publisher answers every buffered batch whose number is at
  least ``start`` as ``[b"", topic, seq, payload]``, then the end marker
  ``[b"", b"", (-1 as 8 signed big-endian bytes), b""]``.  As vLLM's, it answers any request
  of three frames at the ROUTER (the start read as an unsigned big-endian number of any
  length) and ignores others; a start older than the buffer gets what the buffer holds.

Unlike vLLM's publisher, ``publish`` never blocks the caller (the scheduler loop): a full
queue drops the batch and counts it in ``dropped_batches``.  The batch is numbered when it is
published, so a dropped one leaves a hole in the sequence numbers that subscribers see (and
count as lost: it never reached the replay buffer); batches the PUB socket drops at its
high-water mark are in the replay buffer, and subscribers get them back from it.  pyzmq is
imported when a ZeroMQ publisher is built.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import logging
import os
import queue
import socket
import threading
import time
from abc import ABC, abstractmethod
from collections import deque
from collections.abc import Callable
from typing import Any, Literal

import msgspec

from kvcy.kv_events.events import EventBatch

__all__ = ["EventPublisher", "EventPublisherFactory", "KVEventsConfig", "NullEventPublisher", "ZmqEventPublisher"]

logger = logging.getLogger("kvcy.kv_events")

#: The sequence number of the replay answer's end marker (-1, signed).
END_SEQ = (-1).to_bytes(8, "big", signed=True)


def import_zmq() -> Any:
    """pyzmq, imported on first use so that the event structs work without it."""
    try:
        import zmq
    except ImportError as exc:  # pragma: no cover - pyzmq is a dependency
        raise ImportError("KV events over ZeroMQ need pyzmq (pip install pyzmq)") from exc
    return zmq


def _check_int(name: str, value: object, minimum: int | None) -> None:
    if not isinstance(value, int) or isinstance(value, bool):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    if minimum is not None and value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")


@dataclasses.dataclass
class KVEventsConfig:
    """vLLM's ``KVEventsConfig``: whether and where a scheduler publishes its KV events.

    The fields, names and defaults are vLLM 0.33.0's. ``publisher`` left as None becomes
    ``"zmq"`` when events are enabled and ``"null"`` otherwise; any other kind is refused, as
    vLLM's config refuses it (a kind registered with ``EventPublisherFactory`` is reached by
    assigning it to ``publisher`` afterwards, as in vLLM).  The config checks the types; the
    values (an empty endpoint, a negative ``buffer_steps`` or ``hwm``) are checked by the
    publisher that uses them, so a config with events off holds what vLLM's would.

    Args:
        enable_kv_cache_events: publish block stored / removed / cleared events.
        publisher: ``"null"`` or ``"zmq"``.
        endpoint: the PUB socket's address (bound when it has a wildcard host, ``::``, port 0
            or is ``ipc://`` / ``inproc://``; connected otherwise).
        replay_endpoint: the ROUTER replay socket's address (always bound), or None for none.
        buffer_steps: how many of the latest batches the replay socket can resend.
        hwm: the PUB socket's send high-water mark, in messages; past it ZeroMQ drops.
        max_queue_size: how many batches wait for the publishing thread; past it ``publish``
            drops (0 or less: no bound, as vLLM's queue).
        topic: the topic frame of every message (subscribers filter on its prefix).
    """

    enable_kv_cache_events: bool = False
    publisher: Literal["null", "zmq"] | None = None
    endpoint: str = "tcp://*:5557"
    replay_endpoint: str | None = None
    buffer_steps: int = 10_000
    hwm: int = 100_000
    max_queue_size: int = 100_000
    topic: str = ""

    def __post_init__(self) -> None:
        if self.publisher is None:
            self.publisher = "zmq" if self.enable_kv_cache_events else "null"
        if self.publisher not in ("null", "zmq"):  # in the words of vLLM's (pydantic's) refusal
            raise ValueError(f"1 validation error for KVEventsConfig\npublisher\n  Input should be 'null' or 'zmq' "
                             f"[type=literal_error, input_value={self.publisher!r}, "
                             f"input_type={type(self.publisher).__name__}]")
        if not isinstance(self.endpoint, str):
            raise TypeError(f"endpoint must be a str, got {type(self.endpoint).__name__}")
        if self.replay_endpoint is not None and not isinstance(self.replay_endpoint, str):
            raise TypeError(f"replay_endpoint must be a str or None, got {type(self.replay_endpoint).__name__}")
        for name in ("buffer_steps", "hwm", "max_queue_size"):
            _check_int(name, getattr(self, name), None)
        if not isinstance(self.topic, str):
            raise TypeError(f"topic must be a str, got {type(self.topic).__name__}")


class EventPublisher(ABC):
    """Sends a scheduler's event batches somewhere; one per data-parallel rank.

    The publisher, not the scheduler, stamps each batch with its data-parallel rank, so that a
    consumer of several ranks can tell their events apart.
    """

    def __init__(self, data_parallel_rank: int = 0) -> None:
        _check_int("data_parallel_rank", data_parallel_rank, 0)
        self._data_parallel_rank = data_parallel_rank

    @abstractmethod
    def publish(self, events: EventBatch) -> None:
        """Hand one batch over for sending, in order."""

    @abstractmethod
    def shutdown(self) -> None:
        """Stop publishing and release what the publisher holds."""

    def get_publisher_config(self) -> KVEventsConfig | None:
        """The configuration the publisher runs with (resolved endpoints), if it has one."""
        return None


class NullEventPublisher(EventPublisher):
    """Publishes nothing: what a scheduler gets when events are off."""

    def publish(self, events: EventBatch) -> None:
        return

    def shutdown(self) -> None:
        return


def offset_endpoint_port(endpoint: str | None, data_parallel_rank: int) -> str | None:
    """The endpoint of one data-parallel rank, as vLLM derives it.

    Rank 0 (or no endpoint) keeps it; ``inproc://name`` becomes ``inproc://name_dp<rank>``; a TCP
    endpoint's port grows by the rank, except port 0 (the system picks one anyway).

    Raises:
        ValueError: an endpoint of another transport (neither ``tcp`` nor ``inproc``) for a
            rank above 0, or a TCP port that is not a number.
    """
    if not endpoint or data_parallel_rank == 0:
        return endpoint
    if "inproc" in endpoint:
        return f"{endpoint}_dp{data_parallel_rank}"
    if "tcp" in endpoint:
        host, sep, port = endpoint.rpartition(":")
        if not sep:
            return endpoint
        try:
            number = int(port)
        except ValueError:
            raise ValueError(f"the endpoint {endpoint!r} has no numeric port") from None
        return endpoint if number == 0 else f"{host}:{number + data_parallel_rank}"
    raise ValueError("Invalid endpoint: must contain 'inproc' or 'tcp'")


def _binds(endpoint: str) -> bool:
    """vLLM's rule (wildcard host, ``::``, ipc, inproc), plus port 0, which only binding can use."""
    return (
        "*" in endpoint
        or "::" in endpoint
        or endpoint.startswith(("ipc://", "inproc://"))
        or (endpoint.startswith("tcp://") and endpoint.rpartition(":")[2] == "0")
    )


#: The endpoint vLLM binds on this node's address, with a port the system picks.
_ANY_PORT_ANY_HOST = "tcp://*:0"


def _node_ip() -> str:
    """This node's address as vLLM's ``get_ip`` finds it: ``VLLM_HOST_IP`` when set, else the
    local address of a route to a public IPv4 (then IPv6) address (no packet is sent), else
    ``0.0.0.0``."""
    host_ip = os.environ.get("VLLM_HOST_IP", "")
    if host_ip:
        return host_ip
    for family, peer in ((socket.AF_INET, ("8.8.8.8", 80)), (socket.AF_INET6, ("2001:4860:4860::8888", 80))):
        try:
            with socket.socket(family, socket.SOCK_DGRAM) as probe:
                probe.connect(peer)
                return str(probe.getsockname()[0])
        except OSError:
            continue
    return "0.0.0.0"


def _tcp_uri(ip: str, port: int | str) -> str:
    return f"tcp://[{ip}]:{port}" if _is_ipv6(ip) else f"tcp://{ip}:{port}"


def _is_ipv6(ip: str) -> bool:
    try:
        ipaddress.IPv6Address(ip)
    except ValueError:
        return False
    return True


class ZmqEventPublisher(EventPublisher):
    """Publishes event batches on a ZeroMQ PUB socket, with a ROUTER socket to replay them.

    ``publish`` puts the batch on a bounded queue and returns at once; a background thread
    numbers, encodes and sends the batches, keeps the latest ``buffer_steps`` for replay and
    answers replay requests.  The sockets belong to that thread once it runs.

    Args:
        data_parallel_rank: stamped on batches that carry no rank; offsets the endpoints' ports.
        endpoint: the PUB socket's address (see ``KVEventsConfig``).
        replay_endpoint: the ROUTER socket's address, or None for no replay.
        buffer_steps: batches kept for replay.
        hwm: the PUB socket's send high-water mark.
        max_queue_size: batches that may wait for the thread before ``publish`` drops.
        topic: the first frame of every message.
        context: the ZeroMQ context (``zmq.Context.instance()`` when None; ``inproc://``
            subscribers must share it).

    Attributes:
        dropped_batches: batches ``publish`` dropped because the queue was full.
        sent_batches: batches the thread sent on the PUB socket.
        replay_requests: replay requests answered.

    Raises:
        ValueError, TypeError: a bad setting (nothing is opened then).
    """

    #: Seconds ``shutdown`` waits for the thread to send what is queued.
    SHUTDOWN_TIMEOUT: float = 1.0
    END_SEQ: bytes = END_SEQ

    def __init__(
        self,
        data_parallel_rank: int = 0,
        endpoint: str = "tcp://*:5557",
        replay_endpoint: str | None = None,
        buffer_steps: int = 10_000,
        hwm: int = 100_000,
        max_queue_size: int = 100_000,
        topic: str = "",
        *,
        context: Any = None,
    ) -> None:
        super().__init__(data_parallel_rank)
        # Every setting is checked before a socket exists.
        config = KVEventsConfig(True, "zmq", endpoint, replay_endpoint, buffer_steps, hwm, max_queue_size, topic)
        if not endpoint:
            raise ValueError(f"endpoint must be a non-empty str, got {endpoint!r}")
        if replay_endpoint == "":
            raise ValueError("replay_endpoint must be None or a non-empty str, got ''")
        _check_int("buffer_steps", buffer_steps, 0)
        _check_int("hwm", hwm, 0)
        config.endpoint = self.offset_endpoint_port(endpoint, data_parallel_rank) or endpoint
        config.replay_endpoint = self.offset_endpoint_port(replay_endpoint, data_parallel_rank)
        zmq = import_zmq()
        self._zmq = zmq
        self._ctx = context if context is not None else zmq.Context.instance()
        # A max_queue_size of 0 or less makes the queue unbounded (queue.Queue's rule, vLLM's).
        self._queue: queue.Queue[tuple[int, EventBatch] | None] = queue.Queue(maxsize=max_queue_size)
        self._buffer: deque[tuple[int, bytes]] = deque(maxlen=buffer_steps)
        self._topic = topic.encode("utf-8")
        self._next_seq = 0
        self._running = True
        self._stop = threading.Event()
        self._deadline = float("inf")
        self.dropped_batches = 0
        self.sent_batches = 0
        self.replay_requests = 0
        self._pub: Any = None
        self._replay: Any = None
        try:
            self._pub = self._ctx.socket(zmq.PUB)
            self._pub.set_hwm(hwm)  # both high-water marks, as vLLM sets them
            self._pub.setsockopt(zmq.LINGER, 0)
            if _binds(config.endpoint):
                config.endpoint = self._bind(self._pub, config.endpoint)
            else:
                self._pub.connect(config.endpoint)
            if config.replay_endpoint is not None:
                self._replay = self._ctx.socket(zmq.ROUTER)
                # Room for a whole replay and its end marker, however slow the reader.
                self._replay.setsockopt(zmq.SNDHWM, 2 * (buffer_steps + 1))
                self._replay.setsockopt(zmq.LINGER, 0)
                config.replay_endpoint = self._bind(self._replay, config.replay_endpoint)
        except BaseException:
            self._close_sockets()
            raise
        self._config = config
        self._thread = threading.Thread(target=self._run, name="kvcy-kv-events-publisher", daemon=True)
        self._thread.start()

    # ------------------------------------------------------------------ public
    offset_endpoint_port = staticmethod(offset_endpoint_port)

    @property
    def endpoint(self) -> str:
        """The PUB socket's address (the one bound, with the system's port for port 0)."""
        return self._config.endpoint

    @property
    def replay_endpoint(self) -> str | None:
        """The replay socket's bound address, or None."""
        return self._config.replay_endpoint

    @property
    def running(self) -> bool:
        """False once ``shutdown`` was called."""
        return self._running

    def get_publisher_config(self) -> KVEventsConfig:
        """A copy of the configuration, with the endpoints as bound."""
        return dataclasses.replace(self._config)

    def publish(self, events: EventBatch) -> None:
        """Queue one batch for sending; never waits.

        A batch without ``data_parallel_rank`` gets the publisher's. It takes the next sequence
        number now; when the queue is full the batch is dropped (its number is skipped on the
        wire, so subscribers see the loss) and ``dropped_batches`` counts it.

        vLLM's own batches (``vllm.distributed.kv_events.EventBatch`` and its subclasses) are
        taken as well, so that kvcy's publisher can stand in for vLLM's behind vLLM's scheduler:
        any msgspec struct with a ``data_parallel_rank`` field is sent as it encodes.

        Raises:
            TypeError: ``events`` is not an ``EventBatch`` (nor a struct with that field).
            RuntimeError: the publisher was shut down.
        """
        if not self._running:
            raise RuntimeError("Publisher is closed")
        if not isinstance(events, EventBatch) and not (
                isinstance(events, msgspec.Struct) and "data_parallel_rank" in events.__struct_fields__):
            raise TypeError(f"events must be an EventBatch, got {type(events).__name__}")
        if events.data_parallel_rank is None:
            events.data_parallel_rank = self._data_parallel_rank
        seq = self._next_seq
        self._next_seq = seq + 1
        try:
            self._queue.put_nowait((seq, events))
        except queue.Full:
            self.dropped_batches += 1

    def shutdown(self, timeout: float | None = None) -> None:
        """Send what is queued (for up to ``timeout`` seconds, ``SHUTDOWN_TIMEOUT`` by default),
        stop the thread and close the sockets. Calling it again does nothing."""
        if not self._running:
            return
        self._running = False
        wait = self.SHUTDOWN_TIMEOUT if timeout is None else float(timeout)
        self._deadline = time.monotonic() + wait
        self._stop.set()
        try:
            self._queue.put_nowait(None)
        except queue.Full:
            pass  # the thread stops at the deadline instead
        self._thread.join(wait + 1.0)
        if self._thread.is_alive():  # pragma: no cover - the thread only waits 50 ms at a time
            logger.warning("the KV-event publisher thread did not stop; its sockets are left open")
            return
        if not self._queue.empty():
            logger.warning("KV-event publisher: %d batches were still queued at shutdown", self._queue.qsize())
        self._close_sockets()

    def __enter__(self) -> ZmqEventPublisher:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()

    # ------------------------------------------------------------------ thread
    def _run(self) -> None:
        encoder = msgspec.msgpack.Encoder()
        while True:
            if self._replay is not None and self._replay.poll(0):
                try:
                    self._serve_replay()
                except Exception:  # a bad request must not stop publishing
                    logger.exception("KV-event replay request failed")
            if self._stop.is_set() and time.monotonic() > self._deadline:
                return
            try:
                item = self._queue.get(timeout=0.05)
            except queue.Empty:
                if self._stop.is_set():
                    return
                continue
            if item is None:
                return
            seq, batch = item
            try:
                payload = encoder.encode(batch)
            except Exception:  # skipped; subscribers see its number missing
                logger.exception("KV-event batch %d could not be encoded; skipped", seq)
                continue
            # The replay buffer keeps the batch even if the send fails. PUB never blocks: past
            # the high-water mark ZeroMQ drops the message, and subscribers replay it.
            self._buffer.append((seq, payload))
            try:
                self._pub.send_multipart((self._topic, seq.to_bytes(8, "big"), payload))
            except Exception:
                logger.exception("KV-event batch %d could not be sent", seq)
                continue
            self.sent_batches += 1

    def _serve_replay(self) -> None:
        frames = self._replay.recv_multipart()
        # vLLM's reading of a request: any three frames (client, delimiter, start), the start
        # read as an unsigned big-endian number of any length.
        if len(frames) != 3:
            logger.warning("KV-event replay: ignored a malformed request of %d frames", len(frames))
            return
        client, _, start_bytes = frames
        start = int.from_bytes(start_bytes, "big")
        self.replay_requests += 1
        for seq, payload in self._buffer:
            if seq >= start:
                self._replay.send_multipart((client, b"", self._topic, seq.to_bytes(8, "big"), payload))
        self._replay.send_multipart((client, b"", b"", END_SEQ, b""))

    # ------------------------------------------------------------------ sockets
    def _bind(self, sock: Any, endpoint: str) -> str:
        """Bind ``sock``; the address a peer connects to.

        ``tcp://*:0`` binds this node's address (vLLM's rule: ``VLLM_HOST_IP``, else the
        address of the default route) on a port the system picks, and says which; another
        ``tcp://`` endpoint with port ``0`` or ZeroMQ's ``*`` says the port bound; the rest
        are returned as given.

        Raises:
            ValueError: ``tcp://*:0`` and no node address is known.
        """
        zmq = self._zmq
        if endpoint == _ANY_PORT_ANY_HOST:
            ip = _node_ip()
            if ip in ("0.0.0.0", "::"):
                raise ValueError("tcp://*:0 needs a node IP; set VLLM_HOST_IP")
            if _is_ipv6(ip):
                sock.setsockopt(zmq.IPV6, 1)
            sock.bind(_tcp_uri(ip, 0))
            return _tcp_uri(ip, sock.getsockopt(zmq.LAST_ENDPOINT).decode().rpartition(":")[2])
        sock.bind(endpoint)
        if endpoint.startswith("tcp://") and endpoint.endswith((":0", ":*")):
            return str(sock.getsockopt(zmq.LAST_ENDPOINT).decode())
        return endpoint

    def _close_sockets(self) -> None:
        for sock in (self._pub, self._replay):
            if sock is not None:
                sock.close(linger=0)
        self._pub = self._replay = None


class EventPublisherFactory:
    """Builds the publisher a ``KVEventsConfig`` asks for (vLLM's registry of kinds)."""

    _registry: dict[str, Callable[..., EventPublisher]] = {
        "null": NullEventPublisher,
        "zmq": ZmqEventPublisher,
    }

    @classmethod
    def register_publisher(cls, name: str, ctor: Callable[..., EventPublisher]) -> None:
        """Add a kind of publisher.

        Raises:
            KeyError: ``name`` is registered already.
        """
        if name in cls._registry:
            raise KeyError(f"publisher '{name}' already registered")
        cls._registry[name] = ctor

    @classmethod
    def create(cls, config: KVEventsConfig | None, data_parallel_rank: int = 0) -> EventPublisher:
        """The configured publisher; a ``NullEventPublisher`` when events are off.

        Raises:
            ValueError: an unknown ``publisher`` kind.
        """
        if config is None or not config.enable_kv_cache_events or config.publisher == "null":
            return NullEventPublisher()
        kwargs = dataclasses.asdict(config)
        kind = kwargs.pop("publisher")
        kwargs.pop("enable_kv_cache_events")
        try:
            ctor = cls._registry[kind]
        except KeyError:
            raise ValueError(f"Unknown event publisher '{kind}'") from None
        return ctor(data_parallel_rank=data_parallel_rank, **kwargs)
